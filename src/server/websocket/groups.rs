//! A `/ws` connection's consumer-group ops. `group.next` and `group.ack` are the
//! native API's `$CANOPY.group.next` and `$CANOPY.group.ack.…` calls, made through the
//! client core (so they are authorised, bounded and answered as there), with replies
//! to an inbox of the connection's own: a random owner token, claimed like any inbox,
//! so no other connection can take its deliveries. What comes back is turned into
//! `group.msg` texts and an `ok` with the count, or an `error`.
//!
//! Never decides deliveries (the group task does), and never answers a call before
//! the group has.

use super::*;

use canopy_protocols::native::HeaderMap;
use canopy_protocols::ws::AckKind;

use crate::broker::groups::ACK_PREFIX;

/// The subscription id of the connection's group inbox: a client's own start at 1.
pub(super) const GROUP_SID: u32 = 0;
/// `group.next` and `group.ack` requests one connection may have unanswered.
const MAX_OPEN: usize = 1_024;

/// The headers a group adds to each delivery, shown as fields of `group.msg`.
const DELIVERY_HEADERS: [&str; 6] = [
    "Canopy-Subject",
    "Canopy-Version",
    "Canopy-Offset",
    "Canopy-Time",
    "Canopy-Group",
    "Canopy-Attempt",
];

/// The connection's group calls waiting for their answers.
#[derive(Default)]
pub(super) struct GroupCalls {
    /// The inbox prefix (`_INBOX.<token>.`) and its subscription, once made.
    inbox: Option<(String, Arc<Subscription>)>,
    open: HashMap<u64, OpenCall>,
    next: u64,
}

impl GroupCalls {
    /// The inbox's subscription, for the connection to give back when it ends.
    pub(super) fn subscription(&self) -> Option<Arc<Subscription>> {
        self.inbox.as_ref().map(|(_, sub)| Arc::clone(sub))
    }
}

enum OpenCall {
    Next {
        id: Option<String>,
        group: String,
        count: u64,
    },
    Ack {
        id: Option<String>,
    },
}

/// The `/ws` code for a status the API answered with.
fn code_of(status: u16) -> ErrorCode {
    match status {
        400 => ErrorCode::BadRequest,
        403 => ErrorCode::Forbidden,
        404 => ErrorCode::NotFound,
        409 => ErrorCode::Conflict,
        413 => ErrorCode::TooLarge,
        429 => ErrorCode::QuotaExceeded,
        503 => ErrorCode::Unavailable,
        _ => ErrorCode::Internal,
    }
}

/// What a nack, in-progress or term says, in JetStream's words (the API's).
fn reply_body(kind: AckKind, delay_ms: Option<u64>) -> Result<String, Refusal> {
    Ok(match (kind, delay_ms) {
        (AckKind::Nack, Some(ms)) => format!("-NAK {{\"delay\":{}}}", ms.saturating_mul(1_000_000)),
        (AckKind::Nack, None) => "-NAK".to_owned(),
        (_, Some(_)) => {
            return Err(refusal(
                ErrorCode::BadRequest,
                "delay_ms is for a nack: how long until the message goes again",
            ));
        }
        (AckKind::Ack, None) => "+ACK".to_owned(),
        (AckKind::InProgress, None) => "+WPI".to_owned(),
        (AckKind::Term, None) => "+TERM".to_owned(),
    })
}

impl Connection {
    /// `group.next`: asks the group for up to `max` messages; they come as
    /// `group.msg` texts, then `ok` with the count.
    pub(super) fn group_next(
        &mut self,
        id: Option<String>,
        next: &ws::GroupNext<'_>,
    ) -> Result<(), Refusal> {
        let mut body = serde_json::json!({ "group": &*next.group });
        if let Some(max) = next.max {
            body["max"] = max.into();
        }
        if let Some(wait_ms) = next.wait_ms {
            body["wait_ms"] = wait_ms.into();
        }
        let call = OpenCall::Next {
            id,
            group: next.group.to_string(),
            count: 0,
        };
        self.call(
            &format!("{}group.next", crate::api::PREFIX),
            body.to_string(),
            call,
        )
    }

    /// `group.ack`: answers a delivery by its `ack` token; `ok` once the group has it.
    pub(super) fn group_ack(
        &mut self,
        id: Option<String>,
        ack: &ws::GroupAck<'_>,
    ) -> Result<(), Refusal> {
        if !ack.ack.starts_with(ACK_PREFIX) || ack.ack.len() == ACK_PREFIX.len() {
            return Err(refusal(
                ErrorCode::BadRequest,
                "ack must be the `ack` of a group.msg",
            ));
        }
        let body = reply_body(ack.kind, ack.delay_ms)?;
        self.call(&ack.ack, body, OpenCall::Ack { id })
    }

    /// Makes one API call whose answer comes to the connection's group inbox.
    fn call(&mut self, subject: &str, body: String, call: OpenCall) -> Result<(), Refusal> {
        if self.groups.open.len() >= MAX_OPEN {
            return Err(refusal(
                ErrorCode::Busy,
                format!("{MAX_OPEN} group requests are unanswered on this connection"),
            ));
        }
        let inbox = self.group_inbox()?;
        let number = self.groups.next;
        self.groups.next += 1;
        let publish = Publish {
            reply: Some(Bytes::from(format!("{inbox}{number}"))),
            api_calls: true,
            ..Publish::new(subject, Bytes::from(body))
        };
        let published = self
            .session
            .publish(publish)
            .map_err(|refused| publish_refusal(&refused.refusal))?;
        self.session.end_batch();
        if !matches!(published, session::Published::Call) {
            return Err(refusal(ErrorCode::Internal, "the call was not made"));
        }
        self.groups.open.insert(number, call);
        Ok(())
    }

    /// The inbox prefix answers come to, subscribed the first time.
    fn group_inbox(&mut self) -> Result<String, Refusal> {
        if let Some((prefix, _)) = &self.groups.inbox {
            return Ok(prefix.clone());
        }
        let options = MqttOptions {
            qos: 0,
            subscription_id: GROUP_SID,
            ..MqttOptions::default()
        };
        let (prefix, sub) = self
            .session
            .subscribe_private_inbox("ws", Bytes::new(), options)
            .map_err(|refused| {
                let code = match &refused {
                    session::InboxRefusal::Refused(refused) => subscribe_code(refused),
                    session::InboxRefusal::NotMade(_) => ErrorCode::Internal,
                };
                refusal(code, format!("no inbox for the group's answers: {refused}"))
            })?;
        self.groups.inbox = Some((prefix.clone(), sub));
        Ok(prefix)
    }

    /// Turns one message to the group inbox into the text it answers with.
    pub(super) fn group_answer(&mut self, delivery: &envelope::Envelope) {
        let Some(prefix) = self.groups.inbox.as_ref().map(|(p, _)| p.as_bytes()) else {
            return;
        };
        let number = delivery
            .subject
            .strip_prefix(prefix)
            .and_then(|n| std::str::from_utf8(n).ok())
            .and_then(|n| n.parse::<u64>().ok());
        let Some(number) = number else {
            return;
        };
        let Some(call) = self.groups.open.get_mut(&number) else {
            return;
        };
        let mut headers = HeaderMap::parse(&delivery.headers).unwrap_or_default();
        // A delivery has a reply (its ack subject); the call's own answers have none.
        let control = delivery.reply.is_empty();
        if control && let Some(status) = headers.get("Canopy-Status") {
            let status = status.trim().parse().unwrap_or(500);
            let description = serde_json::from_slice::<serde_json::Value>(&delivery.payload)
                .ok()
                .and_then(|body| {
                    body.pointer("/error/description")
                        .and_then(serde_json::Value::as_str)
                        .map(str::to_owned)
                })
                .unwrap_or_else(|| format!("the group answered {status}"));
            let id = match self.groups.open.remove(&number) {
                Some(OpenCall::Next { id, .. } | OpenCall::Ack { id }) => id,
                None => None,
            };
            self.reply_error(id.as_deref(), refusal(code_of(status), description));
            return;
        }
        match call {
            OpenCall::Ack { .. } => {
                if let Some(OpenCall::Ack { id }) = self.groups.open.remove(&number) {
                    self.push(|out| ws::encode_ok(out, id.as_deref()));
                }
            }
            OpenCall::Next { .. } if control => {
                if let Some(OpenCall::Next { id, group, count }) = self.groups.open.remove(&number)
                {
                    self.push(|out| ws::encode_group_done(out, id.as_deref(), &group, count));
                }
            }
            OpenCall::Next { id, group, count } => {
                *count += 1;
                let number = |name: &str| {
                    headers
                        .get(name)
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .unwrap_or(0)
                };
                let (version, offset, time_ms) = (
                    number("Canopy-Version"),
                    number("Canopy-Offset"),
                    number("Canopy-Time"),
                );
                let attempt = u32::try_from(number("Canopy-Attempt")).unwrap_or(u32::MAX);
                let subject = headers.get("Canopy-Subject").unwrap_or_default().to_owned();
                let group = headers
                    .get("Canopy-Group")
                    .map_or_else(|| group.clone(), str::to_owned);
                for name in DELIVERY_HEADERS {
                    headers.remove(name);
                }
                let mut own = BytesMut::new();
                if !headers.is_empty() {
                    headers.encode(&mut own);
                }
                let id = id.clone();
                let ack = std::str::from_utf8(&delivery.reply).unwrap_or_default();
                let message = ws::GroupDelivery {
                    group: &group,
                    attempt,
                    ack,
                    message: ws::StoredMessage {
                        subject: &subject,
                        version,
                        offset,
                        time_ms,
                        headers: &own,
                        payload: &delivery.payload,
                    },
                };
                let mut out = String::new();
                ws::encode_group_msg(&mut out, id.as_deref(), &message);
                // Counted out by the group's task, which sent it.
                self.out.push(out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_say_what_the_api_reads() {
        let body = |kind, delay| reply_body(kind, delay).ok();
        assert_eq!(body(AckKind::Ack, None).as_deref(), Some("+ACK"));
        assert_eq!(body(AckKind::Nack, None).as_deref(), Some("-NAK"));
        assert_eq!(
            body(AckKind::Nack, Some(250)).as_deref(),
            Some("-NAK {\"delay\":250000000}")
        );
        assert_eq!(body(AckKind::InProgress, None).as_deref(), Some("+WPI"));
        assert_eq!(body(AckKind::Term, None).as_deref(), Some("+TERM"));
        assert!(body(AckKind::Ack, Some(1)).is_none());
        for (kind, delay) in [
            (AckKind::Ack, None),
            (AckKind::Nack, None),
            (AckKind::Nack, Some(250)),
            (AckKind::InProgress, None),
            (AckKind::Term, None),
        ] {
            let text = reply_body(kind, delay).unwrap_or_default();
            assert!(
                crate::broker::groups::ReplyKind::parse(text.as_bytes()).is_some(),
                "{text}"
            );
        }
    }
}

//! Ending a connection: telling the client why, saving its session, publishing its
//! will (in its tenant, under its rules, through the client core) and letting its
//! client id go.

use super::*;

impl Connection {
    /// Ends the connection: tells the client why where it can, saves the session,
    /// publishes the will when due and lets the client id go.
    pub(super) async fn finish(mut self, close: Close, writer: &mut (impl AsyncWrite + Unpin)) {
        let subs: Vec<Arc<Subscription>> = self
            .subs
            .values()
            .map(|s| Arc::clone(&s.sub))
            .chain(self.reply_inbox.as_ref().map(|(_, sub)| Arc::clone(sub)))
            .collect();
        self.session.close(&subs);
        let deadline = Duration::from_secs(self.context.config.mqtt.write_deadline_secs.max(1));
        // Publishes already decoded still go to the store; their acks may not
        // reach this client any more, and it will send them again. Retained
        // messages nobody will read are not fetched.
        self.retained_jobs.clear();
        let _ = Box::pin(self.catch_up()).await;
        let told = match &close {
            Close::Server { code, reason } => Some((*code, Some(reason.clone()))),
            Close::TakenOver => Some((reason::SESSION_TAKEN_OVER, None)),
            Close::Shutdown => Some((reason::SERVER_SHUTTING_DOWN, None)),
            Close::Gone | Close::Disconnected { .. } => None,
        };
        if let Some((code, why)) = told {
            if self.level == Level::V5 {
                let packet = Packet::Disconnect(Disconnect {
                    reason: code,
                    properties: self.ack_properties(why.clone()),
                });
                self.put_control(&packet);
            }
            let mut out = std::mem::take(&mut self.control);
            let _ = tokio::time::timeout(deadline, writer.write_all(&out)).await;
            out.clear();
        }
        let _ = writer.shutdown().await;
        match &close {
            Close::Server { code, reason } => {
                tracing::debug!(conn = self.id, peer = %self.peer, code, reason, "mqtt connection closed by the server");
            }
            other => {
                tracing::debug!(conn = self.id, peer = %self.peer, ?other, "mqtt disconnected")
            }
        }
        self.broker.mqtt_acks().remove(self.id);
        self.session.outbox.close();
        if self.persistent() || self.saved_record {
            self.save_session(true).await;
        }
        let will = match close {
            Close::Disconnected { with_will: false } => None,
            // A restart is not the client's failure; its session resumes after it.
            Close::Shutdown => None,
            _ => self.will.take(),
        };
        let delay = will.as_ref().map_or(0, |w| {
            w.properties
                .will_delay_interval
                .unwrap_or(0)
                .min(self.session_expiry)
        });
        let will_pending = will.is_some() && delay > 0;
        self.context
            .sessions
            .release(&self.key, self.id, will_pending);
        self.claim.handoff.release();
        if let Some(will) = will {
            let context = Arc::clone(&self.context);
            let key = self.key.clone();
            let generation = self.claim.generation;
            let level = self.level;
            let publisher = (*self.session.publisher).clone();
            let limits = context.subject_limits;
            if delay == 0 {
                publish_will(&publisher, &will, level, &limits).await;
            } else {
                let tracker = context.tracker.clone();
                tracker.spawn(async move {
                    tokio::time::sleep(Duration::from_secs(u64::from(delay))).await;
                    if context.sessions.will_due(&key, generation) {
                        publish_will(&publisher, &will, level, &limits).await;
                    }
                });
            }
        }
    }
}

/// Publishes a will as its client would have: under its principal, in its tenant,
/// through the same decision as its own publishes.
pub(super) async fn publish_will(
    publisher: &Publisher,
    will: &Will,
    level: Level,
    limits: &canopy_subjects::Limits,
) {
    let Ok(subject) = Subject::parse_mqtt_with(&will.topic, limits) else {
        return;
    };
    let parts = if level == Level::V5 {
        translate::inbound(&will.properties, &will.payload, limits).unwrap_or_default()
    } else {
        translate::NativeParts::default()
    };
    let message = session::Publish {
        reply: parts.reply,
        headers: parts.headers,
        flags: mqtt_flags(will.qos as u8, will.retain),
        retain: will.retain,
        admission: Admission::Throttled,
        ..session::Publish::new(subject.as_str(), will.payload.clone())
    };
    if let Err(refused) = publisher.publish_detached(message).await {
        tracing::debug!(topic = %will.topic, %refused, "a will was not published");
    }
}

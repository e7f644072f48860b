//! How a group speaks JetStream to a pull consumer: the `$JS.ACK.` reply subject
//! each delivery carries, the consumer sequence behind it, and the status messages
//! (`100 Idle Heartbeat`, `404 No Messages`, `408 Request Timeout`, `409 …`) that
//! frame a pull. async-nats and nats.py read these exactly, so their shapes follow
//! nats-server's.
//!
//! Must never: decide a delivery (the dispatcher does) or keep more than the
//! deliveries still outstanding.

use std::collections::HashMap;
use std::time::Duration;

use bytes::BytesMut;
use canopy_protocols::native::HeaderMap;

use crate::groups::dispatch::{Delivery, Dispatcher};

/// The prefix of a JetStream delivery's reply subject.
pub const JS_ACK_PREFIX: &str = "$JS.ACK.";

/// A JetStream pull's terms, from its `CONSUMER.MSG.NEXT` request.
#[derive(Debug, Clone, Default)]
pub struct JetStreamPull {
    /// End once what is ready is sent, with `404 No Messages` when the batch is not
    /// full: at once without `expires` (the pull's wait is then zero), else as soon as
    /// something could be sent, or `408` when nothing could within the wait.
    pub no_wait: bool,
    /// Send `100 Idle Heartbeat` this often while the pull waits.
    pub heartbeat: Option<Duration>,
    /// Payload bytes the pull takes at most (0: no limit); the pull ends once a
    /// message has reached it.
    pub max_bytes: usize,
    /// The pull of a push consumer's pump (`broker::push`): its messages go to the
    /// deliver subject, and it ends without a status message (nobody asked).
    pub push: bool,
}

/// Where a JetStream ack goes: the group, and the consumer sequence of the delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JetStreamAck<'a> {
    pub stream: &'a str,
    pub consumer: &'a str,
    pub consumer_seq: u64,
}

/// Reads an ack subject: `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.
/// <consumer seq>.<time>.<pending>`, or the newer form with a domain and an account
/// hash before the stream and a token after the pending count.
pub fn parse_ack(subject: &str) -> Option<JetStreamAck<'_>> {
    let rest = subject.strip_prefix(JS_ACK_PREFIX)?;
    let tokens: Vec<&str> = rest.split('.').collect();
    let (stream, consumer, consumer_seq) = match tokens.len() {
        7 => (tokens[0], tokens[1], tokens[4]),
        9 | 10 => (tokens[2], tokens[3], tokens[6]),
        _ => return None,
    };
    Some(JetStreamAck {
        stream,
        consumer,
        consumer_seq: consumer_seq.parse().ok()?,
    })
}

/// The reply subject of one delivery.
pub fn ack_subject(
    stream: &str,
    consumer: &str,
    delivered: u32,
    stream_seq: u64,
    consumer_seq: u64,
    time_ms: u64,
    pending: u64,
) -> String {
    let nanos = u128::from(time_ms) * 1_000_000;
    format!(
        "{JS_ACK_PREFIX}{stream}.{consumer}.{delivered}.{stream_seq}.{consumer_seq}.{nanos}.{pending}"
    )
}

/// A status message's header block: `NATS/1.0 <code> <description>` and, for the
/// end of a pull that was not filled, what it still wanted.
pub fn status_block(code: u16, description: &str, unfilled: Option<(usize, usize)>) -> BytesMut {
    let mut headers = HeaderMap::new();
    headers.status = Some(code);
    headers.description = Some(description.to_owned());
    if let Some((messages, bytes)) = unfilled {
        headers.insert("Nats-Pending-Messages", messages.to_string());
        headers.insert("Nats-Pending-Bytes", bytes.to_string());
    }
    let mut block = BytesMut::new();
    headers.encode(&mut block);
    block
}

/// The deliveries handed out with `$JS.ACK.` subjects, by consumer sequence, so an
/// ack (which names only the sequence) finds its delivery.
#[derive(Default)]
pub struct Sequences {
    last: u64,
    /// The highest stream sequence (offset) delivered (deliveries of several subjects
    /// interleave, so not always the last one's).
    last_offset: u64,
    /// Each outstanding delivery, with its message's offset.
    outstanding: HashMap<u64, (Delivery, u64), foldhash::fast::RandomState>,
}

impl Sequences {
    /// Numbers a new delivery of the message at `offset`.
    pub fn issue(&mut self, delivery: &Delivery, offset: u64) -> u64 {
        self.last += 1;
        self.last_offset = self.last_offset.max(offset);
        self.outstanding
            .insert(self.last, (delivery.clone(), offset));
        self.last
    }

    /// The delivery a sequence was issued for, if it may still be outstanding.
    pub fn get(&self, consumer_seq: u64) -> Option<&Delivery> {
        self.outstanding
            .get(&consumer_seq)
            .map(|(delivery, _)| delivery)
    }

    /// JetStream's ack floor, as (consumer sequence, stream sequence): below the
    /// oldest delivery still outstanding, or the last one issued (and the highest
    /// offset delivered) when none is.
    pub fn ack_floor(&self) -> (u64, u64) {
        match self.outstanding.iter().min_by_key(|(seq, _)| **seq) {
            None => (self.last, self.last_offset),
            Some((seq, (_, offset))) => (seq - 1, offset.saturating_sub(1)),
        }
    }

    /// Forgets a sequence whose delivery was acked, termed or nacked.
    pub fn settle(&mut self, consumer_seq: u64) {
        self.outstanding.remove(&consumer_seq);
    }

    /// Forgets sequences whose delivery is no longer outstanding (its ack wait ran out
    /// and it went again under a new sequence, or its subject was purged).
    pub fn prune(&mut self, dispatcher: &Dispatcher) {
        self.outstanding
            .retain(|_, (delivery, _)| dispatcher.outstanding(delivery));
    }

    /// Whether no delivery is outstanding.
    pub fn is_empty(&self) -> bool {
        self.outstanding.is_empty()
    }

    /// The last sequence issued.
    pub fn last(&self) -> u64 {
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ack_floor_is_below_the_oldest_outstanding_delivery() {
        let delivery = |version| Delivery {
            subject: std::sync::Arc::from("a"),
            version,
            attempt: 1,
        };
        let mut sequences = Sequences::default();
        assert_eq!(sequences.ack_floor(), (0, 0));
        let first = sequences.issue(&delivery(1), 10);
        let second = sequences.issue(&delivery(2), 5);
        let third = sequences.issue(&delivery(3), 12);
        assert_eq!(sequences.ack_floor(), (0, 9));
        sequences.settle(first);
        assert_eq!(sequences.ack_floor(), (1, 4), "the second is still out");
        sequences.settle(third);
        sequences.settle(second);
        assert_eq!(
            sequences.ack_floor(),
            (3, 12),
            "all acked: the last and the highest"
        );
    }

    #[test]
    fn ack_subjects_read_back_in_both_forms() {
        let subject = ack_subject("default", "billing", 2, 41, 7, 1_700_000_000_000, 3);
        assert_eq!(
            subject,
            "$JS.ACK.default.billing.2.41.7.1700000000000000000.3"
        );
        let ack = parse_ack(&subject).expect("parses");
        assert_eq!(
            ack,
            JetStreamAck {
                stream: "default",
                consumer: "billing",
                consumer_seq: 7
            }
        );
        let long = "$JS.ACK.hub.ACCHASH.default.billing.2.41.9.1700000000000000000.3.rnd";
        assert_eq!(parse_ack(long).map(|a| a.consumer_seq), Some(9));
        for bad in [
            "$JS.ACK.default.billing",
            "$JS.ACK.default.billing.2.41.x.1.3",
            "$JS.API.default.billing.2.41.7.1.3",
        ] {
            assert_eq!(parse_ack(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_timeout_says_what_the_pull_still_wanted() {
        let block = status_block(408, "Request Timeout", Some((5, 0)));
        assert_eq!(
            &block[..],
            b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 5\r\nNats-Pending-Bytes: 0\r\n\r\n"
        );
    }
}

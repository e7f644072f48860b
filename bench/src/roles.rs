//! What each benchmark connection does once a run starts: publish, subscribe, request,
//! respond, and what the roles hand back ([`Received`], [`Acked`]). Each role is one
//! async loop over one connection, run as its own task.
//!
//! The publisher and the subscriber serve both protocols: they are generic over
//! [`Connection`], which NATS's `Conn` and MQTT's `MqttConn` implement, so each hot loop
//! compiles to direct calls on one connection type.
//!
//! Owns: flow control of publishers (a ping every `flush_every` messages, at most one
//! unanswered), counting deliveries, recording latencies from payload stamps, how
//! messages are shared among publishers, and the request window.
//!
//! Must never: count a message it did not receive, wait without a deadline, or let a
//! slow-consumer `-ERR`, a DISCONNECT or a closed connection pass as the end of a run.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use canopy_protocols::native::{ServerOp, encode_pub};

use super::clock::{now_ns, read_stamp, stamp};
use super::conn::{Conn, WRITE_BATCH};
use super::flow::Flow;
use super::histogram::Histogram;
use super::{BenchError, Options};

/// What the shared roles need of a connection, whatever its protocol.
pub trait Connection: Send + Sized + 'static {
    /// Buffers one message of `payload` on `subject` (NATS: PUB; MQTT: a QoS 0 PUBLISH).
    fn queue(&mut self, subject: &[u8], payload: &[u8]) -> Result<(), BenchError>;

    /// Bytes buffered and not yet sent.
    fn buffered(&self) -> usize;

    /// Sends everything buffered.
    fn send(&mut self) -> impl Future<Output = Result<(), BenchError>> + Send;

    /// Reads once more; the end of the stream is an error.
    fn read_more(&mut self) -> impl Future<Output = Result<(), BenchError>> + Send;

    /// Buffers a ping (PING, PINGREQ) and sends everything buffered.
    fn send_ping(&mut self) -> impl Future<Output = Result<(), BenchError>> + Send;

    /// Waits up to `timeout` for the answer to a ping (PONG, PINGRESP). Only for
    /// connections without subscriptions: a message meanwhile is an error.
    fn wait_pong(
        &mut self,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), BenchError>> + Send;

    /// The payload of the next message already read, or `None` when the read buffer
    /// holds no complete one. Answers what the protocol asks for on the way (PONG to a
    /// PING, PUBACK to a QoS 1 delivery) and fails on what a subscriber must not get.
    fn next_message(&mut self) -> Result<Option<Bytes>, BenchError>;

    /// Ends the connection once its role is done (MQTT: DISCONNECT).
    fn finish(self) -> impl Future<Output = ()> + Send;

    /// [`Connection::read_more`], failing as a stall when nothing arrives within `idle`;
    /// `done` of `expected` say how far the role got.
    fn stalled_read(
        &mut self,
        idle: Duration,
        done: u64,
        expected: u64,
    ) -> impl Future<Output = Result<(), BenchError>> + Send {
        async move {
            tokio::time::timeout(idle, self.read_more())
                .await
                .map_err(|_| BenchError::Stalled {
                    received: done,
                    expected,
                    idle,
                })?
        }
    }
}

/// What a receiving role hands back.
pub struct Received {
    pub count: u64,
    /// `now_ns()` when the last message arrived.
    pub last_ns: u64,
    pub latency: Histogram,
}

impl Default for Received {
    fn default() -> Self {
        Self::new()
    }
}

impl Received {
    pub fn new() -> Received {
        Received {
            count: 0,
            last_ns: 0,
            latency: Histogram::new(),
        }
    }

    /// Counts one message that arrived at `now`, its latency from the stamp in `payload`.
    #[inline]
    pub fn arrived(&mut self, now: u64, payload: &[u8]) {
        self.count += 1;
        self.last_ns = now;
        if let Some(sent) = read_stamp(payload) {
            self.latency.record(now.saturating_sub(sent));
        }
    }
}

/// What an acked publisher hands back.
pub struct Acked {
    /// Publishes acknowledged (refused ones are not counted), when the last answer came,
    /// and the send-to-answer time of every answer.
    pub acks: Received,
    /// Publishes refused.
    pub errors: u64,
    /// What the first refusal said.
    pub first_error: Option<String>,
    /// The longest wait between two answers in a row (the first counted from the
    /// start): a server that stalls shows here whatever its average.
    pub max_gap_ns: u64,
}

impl Acked {
    /// Nothing answered yet; `since` stands for the last answer until one comes.
    pub fn new(since: u64) -> Acked {
        Acked {
            acks: Received {
                last_ns: since,
                ..Received::new()
            },
            errors: 0,
            first_error: None,
            max_gap_ns: 0,
        }
    }

    /// An answer came at `now`.
    pub fn answered_at(&mut self, now: u64) {
        self.max_gap_ns = self.max_gap_ns.max(now.saturating_sub(self.acks.last_ns));
        self.acks.last_ns = now;
    }

    /// Counts one refused publish, keeping what the first refusal said.
    pub fn refused(&mut self, why: impl FnOnce() -> String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(why());
        }
    }

    /// Fails when any publisher had a publish refused: a run with refusals is no result.
    pub fn check(acked: &[Acked]) -> Result<(), BenchError> {
        let errors: u64 = acked.iter().map(|a| a.errors).sum();
        match acked.iter().find_map(|a| a.first_error.clone()) {
            Some(first) if errors > 0 => Err(BenchError::AckErrors {
                errors,
                answered: acked.iter().map(|a| a.acks.count).sum::<u64>() + errors,
                first,
            }),
            _ => Ok(()),
        }
    }
}

/// Messages publisher `p` of `publishers` sends when `total` go round robin (it sends
/// messages `p`, `p + publishers`, …).
pub fn share(total: u64, publishers: usize, p: usize) -> u64 {
    let n = publishers.max(1) as u64;
    total / n + u64::from((p as u64) < total % n)
}

/// What one publisher sends.
pub struct PublishPlan {
    /// Subjects (MQTT: topics) the messages cycle through.
    pub subjects: Arc<[Bytes]>,
    /// Index into `subjects` of this publisher's first message.
    pub first: usize,
    /// How far the subject index moves per message.
    pub stride: usize,
    pub count: u64,
    pub size: usize,
    pub flush_every: u64,
    /// How long to wait for a ping's answer, and for subscribers to catch up.
    pub timeout: Duration,
    pub flow: Arc<Flow>,
    /// Messages per second on a fixed schedule from the first send (0: as fast as the
    /// socket and the flow bound let it). A publisher behind schedule does not sleep.
    pub rate: u64,
    /// Messages per write at most, so the flow bound is checked at least that often (0:
    /// as many as fit in [`WRITE_BATCH`] bytes).
    pub batch: u64,
}

impl PublishPlan {
    /// Publisher `p` of `publishers`: its share of `options.msgs` round robin over
    /// `subjects` (and of `--rate`, when the run is paced), waiting up to `timeout` for
    /// pongs and for the subscribers.
    pub fn share_of(
        options: &Options,
        subjects: Arc<[Bytes]>,
        (p, publishers): (usize, usize),
        flow: &Arc<Flow>,
        timeout: Duration,
    ) -> PublishPlan {
        PublishPlan {
            subjects,
            first: p,
            stride: publishers.max(1),
            count: share(options.msgs, publishers, p),
            size: options.size,
            flush_every: options.flush_every,
            timeout,
            flow: flow.clone(),
            rate: share(options.ws.rate, publishers, p),
            batch: 0,
        }
    }
}

/// When message `n` (from 0) of a run paced at `rate` per second is due, in nanoseconds
/// after the first.
fn due_after(n: u64, rate: u64) -> u64 {
    let due = u128::from(n) * 1_000_000_000 / u128::from(rate.max(1));
    u64::try_from(due).unwrap_or(u64::MAX)
}

/// Publishes `plan.count` stamped messages as fast as the socket takes them (or paced at
/// `plan.rate`, each sent when due), with a ping after every `flush_every` and at most
/// one ping unanswered, and the end-to-end bound of [`Flow`] checked after every batch
/// written, then waits until the server has processed everything (the last ping's
/// answer).
pub async fn publish<C: Connection>(mut conn: C, plan: PublishPlan) -> Result<(), BenchError> {
    let mut payload = vec![b'x'; plan.size];
    let len = plan.subjects.len().max(1);
    let mut subject_index = plan.first % len;
    let flush_every = plan.flush_every.max(1);
    let mut unanswered = 0u32;
    // Messages written but not yet counted in `plan.flow`.
    let mut unreported = 0u64;
    let start = now_ns();
    for sent in 1..=plan.count {
        if plan.rate > 0 {
            let due = start.saturating_add(due_after(sent - 1, plan.rate));
            let now = now_ns();
            if now < due {
                // Everything queued goes out before the wait, so each message leaves
                // when it is due, stamped then.
                conn.send().await?;
                plan.flow.published(unreported, plan.timeout).await?;
                unreported = 0;
                tokio::time::sleep(Duration::from_nanos(due - now)).await;
            }
        }
        stamp(&mut payload);
        let subject = plan.subjects.get(subject_index).map_or(&[][..], |s| &s[..]);
        conn.queue(subject, &payload)?;
        subject_index = (subject_index + plan.stride) % len;
        unreported += 1;
        if conn.buffered() >= WRITE_BATCH || (plan.batch > 0 && unreported >= plan.batch) {
            conn.send().await?;
            plan.flow.published(unreported, plan.timeout).await?;
            unreported = 0;
        }
        if sent % flush_every == 0 {
            conn.send_ping().await?;
            plan.flow.published(unreported, plan.timeout).await?;
            unreported = 0;
            unanswered += 1;
            if unanswered > 1 {
                conn.wait_pong(plan.timeout).await?;
                unanswered -= 1;
            }
        }
    }
    conn.send_ping().await?;
    plan.flow.published(unreported, plan.timeout).await?;
    for _ in 0..=unanswered {
        conn.wait_pong(plan.timeout).await?;
    }
    conn.finish().await;
    Ok(())
}

/// Receives until `expected` messages arrived, reporting progress to `flow` as
/// subscriber number `index`; fails if nothing arrives for `idle`, or on anything the
/// connection refuses ([`Connection::next_message`]).
pub async fn subscribe<C: Connection>(
    mut conn: C,
    expected: u64,
    idle: Duration,
    flow: Arc<Flow>,
    index: usize,
) -> Result<Received, BenchError> {
    let mut received = Received::new();
    while received.count < expected {
        conn.stalled_read(idle, received.count, expected).await?;
        // Everything this read brought arrived now.
        let now = now_ns();
        while let Some(payload) = conn.next_message()? {
            received.arrived(now, &payload);
        }
        flow.received(index, received.count);
        conn.send().await?;
    }
    conn.finish().await;
    Ok(received)
}

/// Answers every request on its reply subject with the same payload, until aborted.
pub async fn respond(mut conn: Conn) -> Result<(), BenchError> {
    loop {
        conn.read_more().await?;
        while let Some(op) = conn.next_op()? {
            if let ServerOp::Msg {
                reply: Some(reply),
                payload,
                ..
            } = op
            {
                encode_pub(conn.wbuf(), &reply, None, &payload);
            }
        }
        conn.send().await?;
    }
}

/// What one requester does.
pub struct RequestPlan {
    pub service: Bytes,
    /// Reply subjects are `<inbox>.<n>`; the connection is subscribed to `<inbox>.*`.
    pub inbox: String,
    pub count: u64,
    pub window: u64,
    pub size: usize,
    pub idle: Duration,
}

/// Sends `plan.count` requests keeping `plan.window` outstanding; the latency recorded is
/// the round trip of each.
pub async fn request(mut conn: Conn, plan: RequestPlan) -> Result<Received, BenchError> {
    let mut payload = vec![b'x'; plan.size];
    let mut reply = String::with_capacity(plan.inbox.len() + 21);
    let mut sent = 0u64;
    let mut received = Received::new();
    let mut queue_request = |conn: &mut Conn, sent: &mut u64| {
        reply.clear();
        let _ = write!(reply, "{}.{}", plan.inbox, sent);
        stamp(&mut payload);
        encode_pub(conn.wbuf(), &plan.service, Some(reply.as_bytes()), &payload);
        *sent += 1;
    };
    while sent < plan.count.min(plan.window.max(1)) {
        queue_request(&mut conn, &mut sent);
    }
    conn.send().await?;
    while received.count < plan.count {
        conn.stalled_read(plan.idle, received.count, plan.count)
            .await?;
        let now = now_ns();
        while let Some(answer) = conn.next_message()? {
            received.arrived(now, &answer);
            if sent < plan.count {
                queue_request(&mut conn, &mut sent);
            }
        }
        conn.send().await?;
    }
    Ok(received)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paced_messages_fall_due_on_schedule() {
        assert_eq!(due_after(0, 100), 0);
        assert_eq!(due_after(1, 100), 10_000_000);
        assert_eq!(due_after(250, 1000), 250_000_000);
        assert_eq!(due_after(u64::MAX, 1), u64::MAX);
    }

    #[test]
    fn shares_cover_every_message() {
        for total in [0u64, 1, 7, 8, 1001] {
            for n in [1usize, 3, 8] {
                let sum: u64 = (0..n).map(|p| share(total, n, p)).sum();
                assert_eq!(sum, total);
            }
        }
    }
}

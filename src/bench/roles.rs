//! What each benchmark connection does once a run starts: publish, subscribe, request,
//! respond. Each is one async loop over one [`Conn`], run as its own task.
//!
//! Owns: flow control of publishers (a PING every `flush_every` messages, at most one
//! unanswered), counting deliveries, recording latencies from payload stamps, and the
//! request window.
//!
//! Must never: count a message it did not receive, wait without a deadline, or let a
//! slow-consumer `-ERR` or a closed connection pass as the end of a run.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use canopy_protocols::native::{ServerOp, encode_pub};

use super::BenchError;
use super::clock::{now_ns, read_stamp, stamp};
use super::conn::{Conn, WRITE_BATCH};
use super::flow::Flow;
use super::histogram::Histogram;

/// What a receiving role hands back.
pub struct Received {
    pub count: u64,
    /// `now_ns()` when the last message arrived.
    pub last_ns: u64,
    pub latency: Histogram,
}

/// What one publisher sends.
pub struct PublishPlan {
    pub subjects: std::sync::Arc<[Bytes]>,
    /// Index into `subjects` of this publisher's first message.
    pub first: usize,
    /// How far the subject index moves per message.
    pub stride: usize,
    pub count: u64,
    pub size: usize,
    pub flush_every: u64,
    pub timeout: Duration,
    pub flow: std::sync::Arc<Flow>,
}

/// Publishes `plan.count` stamped messages as fast as the socket takes them, with a PING
/// after every `flush_every` and at most one PING unanswered, and the end-to-end bound of
/// [`Flow`] checked after every batch written, then waits until the server has processed
/// everything.
pub async fn publish(mut conn: Conn, plan: PublishPlan) -> Result<(), BenchError> {
    let mut payload = vec![b'x'; plan.size];
    let len = plan.subjects.len().max(1);
    let mut subject_index = plan.first % len;
    let flush_every = plan.flush_every.max(1);
    let mut unanswered = 0u32;
    // Messages written but not yet counted in `plan.flow`.
    let mut unreported = 0u64;
    for sent in 1..=plan.count {
        stamp(&mut payload);
        let subject = plan.subjects.get(subject_index).map_or(&[][..], |s| &s[..]);
        encode_pub(conn.wbuf(), subject, None, &payload);
        subject_index = (subject_index + plan.stride) % len;
        unreported += 1;
        if conn.wbuf().len() >= WRITE_BATCH {
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
    Ok(())
}

/// Receives until `expected` messages arrived, reporting progress to `flow` as
/// subscriber number `index`; fails if nothing arrives for `idle`.
pub async fn subscribe(
    mut conn: Conn,
    expected: u64,
    idle: Duration,
    flow: std::sync::Arc<Flow>,
    index: usize,
) -> Result<Received, BenchError> {
    let mut received = Received {
        count: 0,
        last_ns: 0,
        latency: Histogram::new(),
    };
    while received.count < expected {
        stalled_read(&mut conn, idle, received.count, expected).await?;
        // Everything this read brought arrived now.
        let now = now_ns();
        while let Some(op) = conn.next_op()? {
            if let ServerOp::Msg { payload, .. } | ServerOp::HMsg { payload, .. } = op {
                received.count += 1;
                received.last_ns = now;
                if let Some(sent) = read_stamp(&payload) {
                    received.latency.record(now.saturating_sub(sent));
                }
            }
        }
        flow.received(index, received.count);
        conn.send().await?;
    }
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
    let mut received = Received {
        count: 0,
        last_ns: 0,
        latency: Histogram::new(),
    };
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
        stalled_read(&mut conn, plan.idle, received.count, plan.count).await?;
        let now = now_ns();
        while let Some(op) = conn.next_op()? {
            if let ServerOp::Msg { payload, .. } | ServerOp::HMsg { payload, .. } = op {
                received.count += 1;
                received.last_ns = now;
                if let Some(sent_at) = read_stamp(&payload) {
                    received.latency.record(now.saturating_sub(sent_at));
                }
                if sent < plan.count {
                    queue_request(&mut conn, &mut sent);
                }
            }
        }
        conn.send().await?;
    }
    Ok(received)
}

/// One read, failing as a stall when nothing arrives within `idle`.
pub(super) async fn stalled_read(
    conn: &mut Conn,
    idle: Duration,
    received: u64,
    expected: u64,
) -> Result<(), BenchError> {
    tokio::time::timeout(idle, conn.read_more())
        .await
        .map_err(|_| BenchError::Stalled {
            received,
            expected,
            idle,
        })?
}

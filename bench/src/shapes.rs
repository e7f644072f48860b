//! The four live NATS shapes: which connections each opens, what they subscribe to, and
//! how their results become one [`Report`]. The publisher shapes run through
//! [`timed::publish_run`], shared with the MQTT shapes.
//!
//! Owns: subjects and patterns per shape, connection setup before the clock starts
//! (every subscription confirmed by a PONG), and the measured span of reqrep.
//!
//! Must never: start the clock before every subscriber is ready, or leave a task running
//! after it returns (failed runs abort the rest).

use std::sync::Arc;

use bytes::Bytes;
use canopy_protocols::native::{ServerInfo, encode_sub};

use super::clock::now_ns;
use super::conn::Conn;
use super::flow::Flow;
use super::measured::Measured;
use super::roles::{self, PublishPlan, RequestPlan};
use super::timed::{self, Tasks};
use super::{
    BenchError, FANIN_PUBLISHERS, FANIN_SUBJECTS, FANOUT_KEYS, FANOUT_SUBSCRIBERS, Options, Report,
};

/// Connects and subscribes to `patterns` (sids 1, 2, …), confirmed by a PONG.
async fn subscriber(
    addr: &str,
    role: &'static str,
    patterns: &[String],
    options: &Options,
) -> Result<Conn, BenchError> {
    let mut conn = Conn::connect(addr, role, options.timeout).await?;
    for (i, pattern) in patterns.iter().enumerate() {
        let sid = (i + 1).to_string();
        encode_sub(conn.wbuf(), pattern.as_bytes(), None, sid.as_bytes());
    }
    conn.ping_pong(options.timeout).await?;
    Ok(conn)
}

/// Subscribers each expecting every message of the publishers: a live publisher run.
async fn publish_run(
    options: &Options,
    info: ServerInfo,
    subscribers: Vec<Conn>,
    publishers: Vec<(Conn, PublishPlan)>,
    flow: Arc<Flow>,
) -> Result<Report, BenchError> {
    let measured =
        timed::publish_run(options, subscribers, publishers, flow, options.timeout).await?;
    Ok(Report::new(options, info, measured))
}

pub async fn pubsub(addr: &str, options: &Options) -> Result<Report, BenchError> {
    let sub = subscriber(addr, "subscriber", &["bench.one".into()], options).await?;
    let info = sub.info().clone();
    let publisher = Conn::connect(addr, "publisher", options.timeout).await?;
    let subjects: Arc<[Bytes]> = Arc::new([Bytes::from_static(b"bench.one")]);
    let flow = Arc::new(Flow::new(1, options.max_in_flight));
    let plan = PublishPlan::share_of(options, subjects, (0, 1), &flow, options.timeout);
    publish_run(options, info, vec![sub], vec![(publisher, plan)], flow).await
}

pub async fn fanin(addr: &str, options: &Options) -> Result<Report, BenchError> {
    let sub = subscriber(addr, "subscriber", &["bench.>".into()], options).await?;
    let info = sub.info().clone();
    let subjects: Arc<[Bytes]> = (0..FANIN_SUBJECTS)
        .map(|i| Bytes::from(format!("bench.s{i}")))
        .collect();
    let flow = Arc::new(Flow::new(1, options.max_in_flight));
    let mut publishers = Vec::with_capacity(FANIN_PUBLISHERS);
    for p in 0..FANIN_PUBLISHERS {
        let conn = Conn::connect(addr, "publisher", options.timeout).await?;
        // Publisher p sends messages p, p + 4, p + 8, … of the round robin.
        let plan = PublishPlan::share_of(
            options,
            subjects.clone(),
            (p, FANIN_PUBLISHERS),
            &flow,
            options.timeout,
        );
        publishers.push((conn, plan));
    }
    publish_run(options, info, vec![sub], publishers, flow).await
}

pub async fn fanout(addr: &str, options: &Options) -> Result<Report, BenchError> {
    let patterns: Vec<String> = (0..FANOUT_KEYS).map(|k| format!("bench.*.{k}")).collect();
    let mut subs = Vec::with_capacity(FANOUT_SUBSCRIBERS);
    for _ in 0..FANOUT_SUBSCRIBERS {
        subs.push(subscriber(addr, "subscriber", &patterns, options).await?);
    }
    let info = subs.first().map(|s| s.info().clone()).unwrap_or_default();
    let subjects: Arc<[Bytes]> = (0..FANOUT_KEYS)
        .map(|k| Bytes::from(format!("bench.x.{k}")))
        .collect();
    let publisher = Conn::connect(addr, "publisher", options.timeout).await?;
    let flow = Arc::new(Flow::new(subs.len(), options.max_in_flight));
    let plan = PublishPlan::share_of(options, subjects, (0, 1), &flow, options.timeout);
    publish_run(options, info, subs, vec![(publisher, plan)], flow).await
}

pub async fn reqrep(addr: &str, options: &Options) -> Result<Report, BenchError> {
    let responder = subscriber(addr, "responder", &["bench.svc".into()], options).await?;
    let info = responder.info().clone();
    let inbox = format!("_INBOX.{:016x}", fastrand::u64(..));
    let requester = subscriber(addr, "requester", &[format!("{inbox}.*")], options).await?;
    let plan = RequestPlan {
        service: Bytes::from_static(b"bench.svc"),
        inbox,
        count: options.msgs,
        window: options.window.max(1),
        size: options.size,
        idle: options.timeout,
    };
    let mut responding = Tasks(vec![tokio::spawn(roles::respond(responder))]);
    let start = now_ns();
    let mut requesting = tokio::spawn(roles::request(requester, plan));
    let Some(responder) = responding.0.first_mut() else {
        return Err(BenchError::ResponderStopped);
    };
    let received = tokio::select! {
        done = &mut requesting => done??,
        stopped = responder => {
            requesting.abort();
            stopped??;
            return Err(BenchError::ResponderStopped);
        }
    };
    drop(responding);
    let measured = Measured::new(options.msgs, options.size, 1, 1)
        .received(start, [&received])
        .windowed(options.window.max(1));
    Ok(Report::new(options, info, measured))
}

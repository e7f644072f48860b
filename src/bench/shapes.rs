//! The four shapes: which connections each opens, what they subscribe to, and how their
//! results become one [`Report`].
//!
//! Owns: subjects and patterns per shape, connection setup before the clock starts
//! (every subscription confirmed by a PONG), and the start and end of the measured span.
//!
//! Must never: start the clock before every subscriber is ready, or leave a task running
//! after it returns (failed runs abort the rest).

use std::sync::Arc;

use bytes::Bytes;
use canopy_protocols::native::{ServerInfo, encode_sub};
use tokio::task::JoinHandle;

use super::clock::now_ns;
use super::conn::Conn;
use super::flow::Flow;
use super::histogram::Histogram;
use super::roles::{self, PublishPlan, Received, RequestPlan};
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

/// Aborts every task when dropped, so an early error leaves nothing running.
pub(super) struct Tasks<T>(pub(super) Vec<JoinHandle<T>>);

impl<T> Drop for Tasks<T> {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

impl<R> Tasks<Result<R, BenchError>> {
    /// Awaits every task in order; the first error ends the wait (the rest are aborted).
    pub(super) async fn join(mut self) -> Result<Vec<R>, BenchError> {
        let mut out = Vec::with_capacity(self.0.len());
        for task in &mut self.0 {
            out.push(task.await??);
        }
        Ok(out)
    }
}

/// Publishers send to subscribers that each expect `expected_each` messages.
async fn publish_run(
    options: &Options,
    info: ServerInfo,
    subscribers: Vec<Conn>,
    expected_each: u64,
    publishers: Vec<(Conn, PublishPlan)>,
    flow: Arc<Flow>,
) -> Result<Report, BenchError> {
    let n_subs = subscribers.len();
    let n_pubs = publishers.len();
    let mut receiving = Tasks(
        subscribers
            .into_iter()
            .enumerate()
            .map(|(index, conn)| {
                let flow = flow.clone();
                let idle = options.timeout;
                tokio::spawn(async move {
                    let result =
                        roles::subscribe(conn, expected_each, idle, flow.clone(), index).await;
                    if result.is_err() {
                        flow.fail();
                    }
                    result
                })
            })
            .collect(),
    );
    let start = now_ns();
    let sending = Tasks(
        publishers
            .into_iter()
            .map(|(conn, plan)| tokio::spawn(roles::publish(conn, plan)))
            .collect(),
    );
    if let Err(error) = sending.join().await {
        // A subscriber that failed (a slow-consumer disconnect) explains a publisher's
        // failure better than the publisher can.
        for task in &mut receiving.0 {
            if let Ok(Ok(Err(cause))) = tokio::time::timeout(options.timeout, task).await {
                return Err(cause);
            }
        }
        return Err(error);
    }
    let received = receiving.join().await?;
    Ok(report(options, info, start, n_pubs, n_subs, None, received))
}

fn report(
    options: &Options,
    info: ServerInfo,
    start: u64,
    publishers: usize,
    subscribers: usize,
    window: Option<u64>,
    received: Vec<Received>,
) -> Report {
    let mut latency = Histogram::new();
    let mut delivered = 0;
    let mut last = start;
    for r in &received {
        latency.merge(&r.latency);
        delivered += r.count;
        last = last.max(r.last_ns);
    }
    let elapsed_secs = (last.saturating_sub(start) as f64 / 1e9).max(1e-9);
    Report {
        shape: options.shape.name(),
        server: options.server.clone(),
        server_version: info.version,
        server_go: info.go,
        msgs: options.msgs,
        size: options.size,
        publishers,
        subscribers,
        max_in_flight: window.is_none().then_some(options.max_in_flight),
        window,
        delivered,
        elapsed_secs,
        msgs_per_sec: delivered as f64 / elapsed_secs,
        published_per_sec: options.msgs as f64 / elapsed_secs,
        latency: latency.summary(),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        durable: None,
        replay: None,
    }
}

fn plan(
    options: &Options,
    flow: &Arc<Flow>,
    subjects: Arc<[Bytes]>,
    first: usize,
    stride: usize,
    count: u64,
) -> PublishPlan {
    PublishPlan {
        subjects,
        first,
        stride,
        count,
        size: options.size,
        flush_every: options.flush_every,
        timeout: options.timeout,
        flow: flow.clone(),
    }
}

pub async fn pubsub(addr: &str, options: &Options) -> Result<Report, BenchError> {
    let sub = subscriber(addr, "subscriber", &["bench.one".into()], options).await?;
    let info = sub.info().clone();
    let publisher = Conn::connect(addr, "publisher", options.timeout).await?;
    let subjects: Arc<[Bytes]> = Arc::new([Bytes::from_static(b"bench.one")]);
    let flow = Arc::new(Flow::new(1, options.max_in_flight));
    let plan = plan(options, &flow, subjects, 0, 1, options.msgs);
    publish_run(
        options,
        info,
        vec![sub],
        options.msgs,
        vec![(publisher, plan)],
        flow,
    )
    .await
}

pub async fn fanin(addr: &str, options: &Options) -> Result<Report, BenchError> {
    let sub = subscriber(addr, "subscriber", &["bench.>".into()], options).await?;
    let info = sub.info().clone();
    let subjects: Arc<[Bytes]> = (0..FANIN_SUBJECTS)
        .map(|i| Bytes::from(format!("bench.s{i}")))
        .collect();
    let n = FANIN_PUBLISHERS as u64;
    let flow = Arc::new(Flow::new(1, options.max_in_flight));
    let mut publishers = Vec::with_capacity(FANIN_PUBLISHERS);
    for p in 0..FANIN_PUBLISHERS {
        let conn = Conn::connect(addr, "publisher", options.timeout).await?;
        // Publisher p sends messages p, p + 4, p + 8, … of the round robin.
        let count = options.msgs / n + u64::from((p as u64) < options.msgs % n);
        publishers.push((
            conn,
            plan(options, &flow, subjects.clone(), p, FANIN_PUBLISHERS, count),
        ));
    }
    publish_run(options, info, vec![sub], options.msgs, publishers, flow).await
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
    let plan = plan(options, &flow, subjects, 0, 1, options.msgs);
    publish_run(
        options,
        info,
        subs,
        options.msgs,
        vec![(publisher, plan)],
        flow,
    )
    .await
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
    Ok(report(
        options,
        info,
        start,
        1,
        1,
        Some(options.window.max(1)),
        vec![received],
    ))
}

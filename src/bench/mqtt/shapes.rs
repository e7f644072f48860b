//! The MQTT traffic shapes (fan-in, QoS 1, fan-out, retained) and the roles their
//! connections play: QoS 0 publisher, subscriber, acked (QoS 1) publisher.
//!
//! Owns: topics and filters per shape, connection setup before the clock starts (every
//! subscription confirmed by its SUBACK), the ack window of QoS 1 publishers (a packet
//! identifier per window slot, so a PUBACK finds its send time whatever order it comes
//! in), and the start and end of the measured span.
//!
//! Must never: start the clock before every subscriber is ready, count a message it did
//! not receive or an ack it cannot match, pass a refused publish (a v5 PUBACK reason of
//! 0x80 or more) as a success, or leave a task running after it returns.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use canopy_protocols::mqtt::{Ack, Packet, QoS};

use super::super::BenchError;
use super::super::clock::{now_ns, read_stamp, stamp};
use super::super::flow::Flow;
use super::super::histogram::Histogram;
use super::super::roles::Received;
use super::super::shapes::Tasks;
use super::conn::{Dial, MqttConn, WRITE_BATCH};
use super::report::{MqttReport, RetainedStats};
use super::{FANIN_PUBLISHERS, FANIN_TOPICS, FANOUT_KEYS, FANOUT_SUBSCRIBERS, MqttOptions};

/// What one QoS 0 publisher sends.
struct PublishPlan {
    topics: Arc<[Bytes]>,
    /// Index into `topics` of this publisher's first message.
    first: usize,
    /// How far the topic index moves per message.
    stride: usize,
    count: u64,
    size: usize,
    flush_every: u64,
    flow: Arc<Flow>,
    /// How long to wait for subscribers to catch up.
    stall: std::time::Duration,
}

/// Publishes `plan.count` stamped QoS 0 messages as fast as the socket takes them, with a
/// PINGREQ after every `flush_every` and at most one unanswered, and the end-to-end bound
/// of [`Flow`] checked after every batch written; then waits for the last PINGRESP (the
/// server has read everything).
async fn publish_qos0(mut conn: MqttConn, plan: PublishPlan) -> Result<(), BenchError> {
    let stall = plan.stall;
    let mut payload = vec![b'x'; plan.size];
    let len = plan.topics.len().max(1);
    let mut index = plan.first % len;
    let flush_every = plan.flush_every.max(1);
    let mut unanswered = 0u32;
    let mut unreported = 0u64;
    for sent in 1..=plan.count {
        stamp(&mut payload);
        let topic = plan.topics.get(index).map_or(&[][..], |t| &t[..]);
        conn.publish(QoS::AtMostOnce, false, topic, None, &payload)?;
        index = (index + plan.stride) % len;
        unreported += 1;
        if conn.wbuf_len() >= WRITE_BATCH {
            conn.send().await?;
            plan.flow.published(unreported, stall).await?;
            unreported = 0;
        }
        if sent % flush_every == 0 {
            conn.send_ping().await?;
            plan.flow.published(unreported, stall).await?;
            unreported = 0;
            unanswered += 1;
            if unanswered > 1 {
                conn.wait_pingresp().await?;
                unanswered -= 1;
            }
        }
    }
    conn.send_ping().await?;
    plan.flow.published(unreported, stall).await?;
    for _ in 0..=unanswered {
        conn.wait_pingresp().await?;
    }
    conn.close().await;
    Ok(())
}

/// Receives until `expected` messages arrived, reporting progress to `flow` as
/// subscriber number `index`; fails on a stall, a closed connection or a packet a
/// subscriber should not get.
async fn subscribe(
    mut conn: MqttConn,
    expected: u64,
    flow: Arc<Flow>,
    index: usize,
) -> Result<Received, BenchError> {
    let mut received = Received {
        count: 0,
        last_ns: 0,
        latency: Histogram::new(),
    };
    while received.count < expected {
        conn.read_or_stall(received.count, expected).await?;
        // Everything this read brought arrived now.
        let now = now_ns();
        while let Some(packet) = conn.next_packet()? {
            match packet {
                Packet::Publish(publish) => {
                    received.count += 1;
                    received.last_ns = now;
                    if let Some(sent) = read_stamp(&publish.payload) {
                        received.latency.record(now.saturating_sub(sent));
                    }
                    match (publish.qos, publish.packet_id) {
                        (QoS::AtMostOnce, _) => {}
                        (QoS::AtLeastOnce, Some(id)) => {
                            conn.packet(&Packet::PubAck(Ack::new(id)))?
                        }
                        (qos, _) => {
                            return Err(BenchError::Unexpected {
                                role: "subscriber",
                                what: format!("a {qos:?} delivery on a QoS 0 subscription"),
                            });
                        }
                    }
                }
                Packet::PingResp => {}
                other => {
                    return Err(BenchError::Unexpected {
                        role: "subscriber",
                        what: other.name().into(),
                    });
                }
            }
        }
        flow.received(index, received.count);
        conn.send().await?;
    }
    conn.close().await;
    Ok(received)
}

/// What one acked (QoS 1) publisher sends.
struct AckedPlan {
    topics: Arc<[Bytes]>,
    first: usize,
    stride: usize,
    count: u64,
    size: usize,
    window: u64,
    retain: bool,
}

/// What an acked publisher hands back.
struct Acked {
    count: u64,
    errors: u64,
    first_error: Option<String>,
    last_ns: u64,
    latency: Histogram,
}

/// Publishes `plan.count` QoS 1 messages keeping `plan.window` unacknowledged (packet
/// identifiers 1..=window, one per slot); latency is send to PUBACK.
async fn publish_acked(mut conn: MqttConn, plan: AckedPlan) -> Result<Acked, BenchError> {
    let role = "publisher";
    let mut window = plan.window.clamp(1, u64::from(u16::MAX)) as u16;
    if let Some(maximum) = conn.receive_maximum {
        window = window.min(maximum.max(1));
    }
    let slots = usize::from(window) + 1;
    let mut sent_at = vec![0u64; slots];
    let mut in_flight = vec![false; slots];
    let mut free: Vec<u16> = (1..=window).rev().collect();
    let mut payload = vec![b'x'; plan.size];
    let len = plan.topics.len().max(1);
    let mut index = plan.first % len;
    let mut sent = 0u64;
    let mut acked = Acked {
        count: 0,
        errors: 0,
        first_error: None,
        last_ns: 0,
        latency: Histogram::new(),
    };
    while acked.count < plan.count {
        while sent < plan.count {
            let Some(id) = free.pop() else { break };
            stamp(&mut payload);
            let topic = plan.topics.get(index).map_or(&[][..], |t| &t[..]);
            conn.publish(QoS::AtLeastOnce, plan.retain, topic, Some(id), &payload)?;
            index = (index + plan.stride) % len;
            let slot = usize::from(id);
            sent_at[slot] = now_ns();
            in_flight[slot] = true;
            sent += 1;
        }
        conn.send().await?;
        conn.read_or_stall(acked.count, plan.count).await?;
        let now = now_ns();
        while let Some(packet) = conn.next_packet()? {
            match packet {
                Packet::PubAck(ack) => {
                    let slot = usize::from(ack.packet_id);
                    if !in_flight.get(slot).copied().unwrap_or(false) {
                        return Err(BenchError::Unexpected {
                            role,
                            what: format!(
                                "a PUBACK for packet identifier {} that is not in flight",
                                ack.packet_id
                            ),
                        });
                    }
                    in_flight[slot] = false;
                    free.push(ack.packet_id);
                    if ack.reason >= 0x80 {
                        acked.errors += 1;
                        if acked.first_error.is_none() {
                            acked.first_error = Some(format!(
                                "PUBACK reason 0x{:02x}{}",
                                ack.reason,
                                ack.properties
                                    .reason_string
                                    .as_deref()
                                    .map(|t| format!(": {t}"))
                                    .unwrap_or_default()
                            ));
                        }
                    }
                    acked
                        .latency
                        .record(now.saturating_sub(sent_at.get(slot).copied().unwrap_or(now)));
                    acked.count += 1;
                    acked.last_ns = now;
                }
                Packet::PingResp => {}
                other => {
                    return Err(BenchError::Unexpected {
                        role,
                        what: other.name().into(),
                    });
                }
            }
        }
    }
    conn.close().await;
    Ok(acked)
}

/// Message `k` of `n` round robin over `publishers`: publisher `p` sends `k ≡ p`.
fn share(total: u64, publishers: usize, p: usize) -> u64 {
    let n = publishers.max(1) as u64;
    total / n + u64::from((p as u64) < total % n)
}

/// Starts receivers, then the clock, then publishers; returns the start and what the
/// receivers got.
async fn publish_run(
    subscribers: Vec<MqttConn>,
    expected_each: u64,
    publishers: Vec<(MqttConn, PublishPlan)>,
    flow: Arc<Flow>,
    stall: std::time::Duration,
) -> Result<(u64, Vec<Received>), BenchError> {
    let mut receiving = Tasks(
        subscribers
            .into_iter()
            .enumerate()
            .map(|(index, conn)| {
                let flow = flow.clone();
                tokio::spawn(async move {
                    let result = subscribe(conn, expected_each, flow.clone(), index).await;
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
            .map(|(conn, plan)| tokio::spawn(publish_qos0(conn, plan)))
            .collect(),
    );
    if let Err(error) = sending.join().await {
        // A subscriber that failed (closed by the server) explains a publisher's failure
        // better than the publisher can.
        for task in &mut receiving.0 {
            if let Ok(Ok(Err(cause))) = tokio::time::timeout(stall, task).await {
                return Err(cause);
            }
        }
        return Err(error);
    }
    let received = receiving.join().await?;
    Ok((start, received))
}

pub async fn fanin(addr: SocketAddr, options: &MqttOptions) -> Result<MqttReport, BenchError> {
    let dial = Dial::new(addr, options);
    let mut sub = MqttConn::connect(&dial, "subscriber", None).await?;
    sub.subscribe("bench/#", options.timeout).await?;
    let topics: Arc<[Bytes]> = (0..FANIN_TOPICS)
        .map(|i| Bytes::from(format!("bench/s{i}")))
        .collect();
    let flow = Arc::new(Flow::new(1, options.max_in_flight));
    let mut publishers = Vec::with_capacity(FANIN_PUBLISHERS);
    for p in 0..FANIN_PUBLISHERS {
        let conn = MqttConn::connect(&dial, "publisher", None).await?;
        let plan = PublishPlan {
            topics: topics.clone(),
            first: p,
            stride: FANIN_PUBLISHERS,
            count: share(options.msgs, FANIN_PUBLISHERS, p),
            size: options.size,
            flush_every: options.flush_every,
            flow: flow.clone(),
            stall: options.stall(),
        };
        publishers.push((conn, plan));
    }
    let (start, received) =
        publish_run(vec![sub], options.msgs, publishers, flow, options.stall()).await?;
    Ok(MqttReport::received(
        options,
        FANIN_PUBLISHERS,
        start,
        &received,
    ))
}

pub async fn fanout(addr: SocketAddr, options: &MqttOptions) -> Result<MqttReport, BenchError> {
    let dial = Dial::new(addr, options);
    let mut subs = Vec::with_capacity(FANOUT_SUBSCRIBERS);
    for _ in 0..FANOUT_SUBSCRIBERS {
        let mut sub = MqttConn::connect(&dial, "subscriber", None).await?;
        sub.subscribe("bench/x/+", options.timeout).await?;
        subs.push(sub);
    }
    let topics: Arc<[Bytes]> = (0..FANOUT_KEYS)
        .map(|k| Bytes::from(format!("bench/x/{k}")))
        .collect();
    let flow = Arc::new(Flow::new(subs.len(), options.max_in_flight));
    let publisher = MqttConn::connect(&dial, "publisher", None).await?;
    let plan = PublishPlan {
        topics,
        first: 0,
        stride: 1,
        count: options.msgs,
        size: options.size,
        flush_every: options.flush_every,
        flow: flow.clone(),
        stall: options.stall(),
    };
    let (start, received) = publish_run(
        subs,
        options.msgs,
        vec![(publisher, plan)],
        flow,
        options.stall(),
    )
    .await?;
    Ok(MqttReport::received(options, 1, start, &received))
}

/// Acked publishes from `options.publishers` connections over `topics`, each topic
/// belonging to one connection; every topic gets `count / topics` messages or one more.
async fn acked_run(
    dial: &Dial,
    options: &MqttOptions,
    topics: Arc<[Bytes]>,
    count: u64,
    retain: bool,
) -> Result<(u64, Vec<Acked>), BenchError> {
    let n = options.publishers.max(1);
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(MqttConn::connect(dial, "publisher", None).await?);
    }
    let start = now_ns();
    let tasks = Tasks(
        conns
            .into_iter()
            .enumerate()
            .map(|(p, conn)| {
                let plan = AckedPlan {
                    topics: topics.clone(),
                    first: p,
                    stride: n,
                    count: share(count, n, p),
                    size: options.size,
                    window: options.window,
                    retain,
                };
                tokio::spawn(publish_acked(conn, plan))
            })
            .collect(),
    );
    let acked = tasks.join().await?;
    let errors: u64 = acked.iter().map(|a| a.errors).sum();
    if errors > 0 {
        return Err(BenchError::AckErrors {
            errors,
            answered: acked.iter().map(|a| a.count).sum(),
            first: acked
                .iter()
                .find_map(|a| a.first_error.clone())
                .unwrap_or_default(),
        });
    }
    Ok((start, acked))
}

/// The effective window: `--window`, lowered to a v5 server's Receive Maximum (read from
/// a probe connection's CONNACK).
async fn effective_window(dial: &Dial, options: &MqttOptions) -> Result<u64, BenchError> {
    let probe = MqttConn::connect(dial, "probe", None).await?;
    let window = probe
        .receive_maximum
        .map_or(options.window, |m| options.window.min(u64::from(m)));
    probe.close().await;
    Ok(window.max(1))
}

pub async fn qos1(addr: SocketAddr, options: &MqttOptions) -> Result<MqttReport, BenchError> {
    let dial = Dial::new(addr, options);
    let topics: Arc<[Bytes]> = (0..options.mqtt.topics.max(1))
        .map(|i| Bytes::from(format!("bench/q/{i}")))
        .collect();
    let window = effective_window(&dial, options).await?;
    let (start, acked) = acked_run(&dial, options, topics, options.msgs, false).await?;
    Ok(MqttReport::acked(
        options,
        start,
        acked.iter().map(|a| (a.count, a.last_ns, &a.latency)),
        window,
    ))
}

pub async fn retained(addr: SocketAddr, options: &MqttOptions) -> Result<MqttReport, BenchError> {
    let role = "retained subscriber";
    let dial = Dial::new(addr, options);
    let n = options.mqtt.retained;
    if n == 0 {
        return Err(BenchError::Config("--retained must be at least 1".into()));
    }
    let topics: Arc<[Bytes]> = (0..n).map(|i| Bytes::from(format!("ret/{i}"))).collect();
    let window = effective_window(&dial, options).await?;
    let (load_start, acked) = acked_run(&dial, options, topics, n as u64, true).await?;
    let load_end = acked.iter().map(|a| a.last_ns).max().unwrap_or(load_start);
    let mut load_latency = Histogram::new();
    for a in &acked {
        load_latency.merge(&a.latency);
    }

    let mut sub = MqttConn::connect(&dial, role, None).await?;
    sub.send_subscribe("ret/#", 1)?;
    let start = now_ns();
    sub.send().await?;
    let mut seen = vec![false; n];
    let mut count = 0usize;
    let mut suback_ns = None;
    let mut last_ns = start;
    while count < n || suback_ns.is_none() {
        sub.read_or_stall(count as u64, n as u64).await?;
        let now = now_ns();
        while let Some(packet) = sub.next_packet()? {
            match packet {
                Packet::SubAck(suback) => {
                    super::conn::check_suback(role, "ret/#", &suback)?;
                    suback_ns = Some(now.saturating_sub(start));
                }
                Packet::Publish(publish) => {
                    let topic = publish.topic.as_str();
                    let index = topic
                        .strip_prefix("ret/")
                        .and_then(|i| i.parse::<usize>().ok())
                        .filter(|&i| i < n);
                    let Some(index) = index else {
                        return Err(BenchError::Unexpected {
                            role,
                            what: format!(
                                "a message on `{topic}`, not one of the {n} loaded: the \
                                 server holds other retained messages under ret/ (an \
                                 earlier run with a larger --retained?); use a fresh server"
                            ),
                        });
                    };
                    if !publish.retain {
                        return Err(BenchError::Unexpected {
                            role,
                            what: format!("a message on `{topic}` without RETAIN"),
                        });
                    }
                    if std::mem::replace(&mut seen[index], true) {
                        return Err(BenchError::Unexpected {
                            role,
                            what: format!("the retained message of `{topic}` twice"),
                        });
                    }
                    if publish.qos != QoS::AtMostOnce {
                        return Err(BenchError::Unexpected {
                            role,
                            what: format!("a {:?} delivery on a QoS 0 subscription", publish.qos),
                        });
                    }
                    count += 1;
                    last_ns = now;
                }
                other => {
                    return Err(BenchError::Unexpected {
                        role,
                        what: other.name().into(),
                    });
                }
            }
        }
    }
    sub.close().await;
    let all_ns = last_ns.saturating_sub(start);
    let load_secs = (load_end.saturating_sub(load_start) as f64 / 1e9).max(1e-9);
    let stats = RetainedStats {
        retained: n,
        load_secs,
        load_acks_per_sec: n as f64 / load_secs,
        suback_ns: suback_ns.unwrap_or_default(),
        all_delivered_ns: all_ns,
    };
    Ok(MqttReport::retained(options, &load_latency, window, stats))
}

#[cfg(test)]
mod tests {
    use super::*;

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

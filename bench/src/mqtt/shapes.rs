//! The MQTT traffic shapes (fan-in, QoS 1, fan-out, retained) and the one role only MQTT
//! has, the acked (QoS 1) publisher; the QoS 0 publisher and the subscriber are the
//! shared roles ([`super::super::roles::publish`], [`super::super::roles::subscribe`])
//! over [`MqttConn`].
//!
//! Owns: topics and filters per shape, connection setup before the clock starts (every
//! subscription confirmed by its SUBACK), the ack window of QoS 1 publishers (a packet
//! identifier per window slot, so a PUBACK finds its send time whatever order it comes
//! in), and the start and end of the measured span of the acked shapes.
//!
//! Must never: start the clock before every subscriber is ready, count a message it did
//! not receive or an ack it cannot match, pass a refused publish (a v5 PUBACK reason of
//! 0x80 or more) as a success, or leave a task running after it returns.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use canopy_protocols::mqtt::{Packet, QoS};

use super::super::clock::{now_ns, stamp};
use super::super::flow::Flow;
use super::super::measured::Measured;
use super::super::roles::{Acked, Connection as _, PublishPlan, share};
use super::super::timed::{self, Tasks};
use super::super::{BenchError, Options};
use super::conn::{Dial, MqttConn};
use super::report::{MqttReport, RetainedStats};
use super::{FANIN_PUBLISHERS, FANIN_TOPICS, FANOUT_KEYS, FANOUT_SUBSCRIBERS};

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
    let (mut sent, mut answered) = (0u64, 0u64);
    let mut acked = Acked::new(0);
    while answered < plan.count {
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
        conn.read_or_stall(answered, plan.count).await?;
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
                        acked.refused(|| {
                            format!(
                                "PUBACK reason 0x{:02x}{}",
                                ack.reason,
                                ack.properties
                                    .reason_string
                                    .as_deref()
                                    .map(|t| format!(": {t}"))
                                    .unwrap_or_default()
                            )
                        });
                    } else {
                        acked.acks.count += 1;
                    }
                    acked
                        .acks
                        .latency
                        .record(now.saturating_sub(sent_at.get(slot).copied().unwrap_or(now)));
                    answered += 1;
                    acked.acks.last_ns = now;
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

pub async fn fanin(addr: SocketAddr, options: &Options) -> Result<MqttReport, BenchError> {
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
        let plan = PublishPlan::share_of(
            options,
            topics.clone(),
            (p, FANIN_PUBLISHERS),
            &flow,
            options.mqtt.stall(),
        );
        publishers.push((conn, plan));
    }
    let measured =
        timed::publish_run(options, vec![sub], publishers, flow, options.mqtt.stall()).await?;
    Ok(MqttReport::new(options, measured))
}

pub async fn fanout(addr: SocketAddr, options: &Options) -> Result<MqttReport, BenchError> {
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
    let plan = PublishPlan::share_of(options, topics, (0, 1), &flow, options.mqtt.stall());
    let measured = timed::publish_run(
        options,
        subs,
        vec![(publisher, plan)],
        flow,
        options.mqtt.stall(),
    )
    .await?;
    Ok(MqttReport::new(options, measured))
}

/// Acked publishes from `--publishers` connections over `topics`, each topic
/// belonging to one connection; every topic gets `count / topics` messages or one more.
async fn acked_run(
    dial: &Dial,
    options: &Options,
    topics: Arc<[Bytes]>,
    count: u64,
    retain: bool,
) -> Result<(u64, Vec<Acked>), BenchError> {
    let n = options.durable.publishers.max(1);
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
    Acked::check(&acked)?;
    Ok((start, acked))
}

/// The effective window: `--window`, lowered to a v5 server's Receive Maximum (read from
/// a probe connection's CONNACK).
async fn effective_window(dial: &Dial, options: &Options) -> Result<u64, BenchError> {
    let probe = MqttConn::connect(dial, "probe", None).await?;
    let window = probe
        .receive_maximum
        .map_or(options.window, |m| options.window.min(u64::from(m)));
    probe.close().await;
    Ok(window.max(1))
}

pub async fn qos1(addr: SocketAddr, options: &Options) -> Result<MqttReport, BenchError> {
    let dial = Dial::new(addr, options);
    let topics: Arc<[Bytes]> = (0..options.mqtt.topics.max(1))
        .map(|i| Bytes::from(format!("bench/q/{i}")))
        .collect();
    let window = effective_window(&dial, options).await?;
    let (start, acked) = acked_run(&dial, options, topics, options.msgs, false).await?;
    Ok(MqttReport::acked(options, start, &acked, window))
}

pub async fn retained(addr: SocketAddr, options: &Options) -> Result<MqttReport, BenchError> {
    let role = "retained subscriber";
    let dial = Dial::new(addr, options);
    let n = options.mqtt.retained;
    if n == 0 {
        return Err(BenchError::Config("--retained must be at least 1".into()));
    }
    let topics: Arc<[Bytes]> = (0..n).map(|i| Bytes::from(format!("ret/{i}"))).collect();
    let window = effective_window(&dial, options).await?;
    let (load_start, acked) = acked_run(&dial, options, topics, n as u64, true).await?;
    let load = Measured::new(n as u64, options.size, acked.len(), 0)
        .received(load_start, acked.iter().map(|a| &a.acks));

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
    let stats = RetainedStats {
        retained: n,
        load_secs: load.elapsed_secs,
        load_acks_per_sec: n as f64 / load.elapsed_secs,
        suback_ns: suback_ns.unwrap_or_default(),
        all_delivered_ns: all_ns,
    };
    Ok(MqttReport::retained(options, load.latency, window, stats))
}

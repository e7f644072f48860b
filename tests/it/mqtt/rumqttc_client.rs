//! rumqttc (v4 = MQTT 3.1.1 and v5) against Canopy, and the bridge between MQTT
//! topics and native subjects (`devices/7/temp` is `devices.7.temp`) both ways.
//!
//! Each client's event loop runs in a task that forwards its events to the test; the
//! test waits for the CONNACK, SUBACK, PUBACK or PUBCOMP it needs (never a sleep), and
//! the loop stops at the first connection error instead of reconnecting.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;

use super::mqtt_addr;
use crate::common::{WAIT, start_default};

/// A payload that is not UTF-8 and has a NUL and a newline: bytes must pass unchanged.
const BINARY: &[u8] = &[0x00, 0x9f, 0x92, 0x96, 0xff, b'\n', b'x'];

/// What rumqttc v4 and v5 have in common, for the shared checks.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Received {
    topic: String,
    payload: Bytes,
    qos: u8,
    retain: bool,
}

// ---------------------------------------------------------------------------------
// v4 (MQTT 3.1.1)

mod v4 {
    use super::*;
    use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing, Packet, QoS, SubscribeReasonCode};

    fn qos(level: u8) -> QoS {
        rumqttc::qos(level).expect("QoS 0, 1 or 2")
    }

    pub struct Client {
        client: AsyncClient,
        events: mpsc::UnboundedReceiver<Result<Event, String>>,
        publishes: VecDeque<rumqttc::Publish>,
    }

    impl Client {
        pub async fn connect(addr: SocketAddr, id: &str) -> Client {
            let mut options = MqttOptions::new(id, addr.ip().to_string(), addr.port());
            options.set_keep_alive(Duration::from_secs(30));
            let (client, mut eventloop) = AsyncClient::new(options, 64);
            let (tx, events) = mpsc::unbounded_channel();
            tokio::spawn(async move {
                loop {
                    let event = eventloop.poll().await.map_err(|e| e.to_string());
                    let failed = event.is_err();
                    if tx.send(event).is_err() || failed {
                        return;
                    }
                }
            });
            let mut client = Client {
                client,
                events,
                publishes: VecDeque::new(),
            };
            let event = client
                .wait_for("CONNACK", |e| {
                    matches!(e, Event::Incoming(Packet::ConnAck(_)))
                })
                .await;
            if let Event::Incoming(Packet::ConnAck(ack)) = event {
                assert_eq!(ack.code, rumqttc::ConnectReturnCode::Success, "{ack:?}");
            }
            client
        }

        /// The first event `matches` accepts; PUBLISHes seen before it are kept for
        /// [`Client::next_publish`].
        async fn wait_for(&mut self, what: &str, matches: impl Fn(&Event) -> bool) -> Event {
            loop {
                let event = tokio::time::timeout(WAIT, self.events.recv())
                    .await
                    .unwrap_or_else(|_| panic!("no {what} within the wait"))
                    .unwrap_or_else(|| panic!("event loop ended while waiting for {what}"))
                    .unwrap_or_else(|e| panic!("connection error while waiting for {what}: {e}"));
                if matches(&event) {
                    return event;
                }
                if let Event::Incoming(Packet::Publish(publish)) = event {
                    self.publishes.push_back(publish);
                }
            }
        }

        pub async fn subscribe(&mut self, filter: &str, level: u8) {
            self.client
                .subscribe(filter, qos(level))
                .await
                .expect("subscribe");
            let event = self
                .wait_for("SUBACK", |e| {
                    matches!(e, Event::Incoming(Packet::SubAck(_)))
                })
                .await;
            if let Event::Incoming(Packet::SubAck(ack)) = event {
                assert_eq!(
                    ack.return_codes,
                    [SubscribeReasonCode::Success(qos(level))],
                    "SUBACK for {filter}"
                );
            }
        }

        /// Publishes and waits until its QoS flow is complete (QoS 0: written out).
        pub async fn publish(&mut self, topic: &str, level: u8, retain: bool, payload: &[u8]) {
            self.client
                .publish(topic, qos(level), retain, payload.to_vec())
                .await
                .expect("publish");
            self.wait_for("the end of the publish flow", |e| {
                matches!(
                    (level, e),
                    (0, Event::Outgoing(Outgoing::Publish(_)))
                        | (1, Event::Incoming(Packet::PubAck(_)))
                        | (2, Event::Incoming(Packet::PubComp(_)))
                )
            })
            .await;
        }

        pub async fn next_publish(&mut self) -> Received {
            let publish = match self.publishes.pop_front() {
                Some(publish) => publish,
                None => match self
                    .wait_for("PUBLISH", |e| {
                        matches!(e, Event::Incoming(Packet::Publish(_)))
                    })
                    .await
                {
                    Event::Incoming(Packet::Publish(publish)) => publish,
                    other => unreachable!("{other:?}"),
                },
            };
            Received {
                topic: publish.topic,
                payload: publish.payload,
                qos: publish.qos as u8,
                retain: publish.retain,
            }
        }

        pub async fn disconnect(self) {
            self.client.disconnect().await.expect("disconnect");
        }
    }
}

// ---------------------------------------------------------------------------------
// v5

mod v5 {
    use super::*;
    use rumqttc::Outgoing;
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::{ConnectReturnCode, Packet, Publish, SubscribeReasonCode};
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};

    fn qos(level: u8) -> QoS {
        rumqttc::v5::mqttbytes::qos(level).expect("QoS 0, 1 or 2")
    }

    pub struct Client {
        client: AsyncClient,
        events: mpsc::UnboundedReceiver<Result<Event, String>>,
        publishes: VecDeque<Publish>,
    }

    impl Client {
        pub async fn connect(addr: SocketAddr, id: &str) -> Client {
            let mut options = MqttOptions::new(id, addr.ip().to_string(), addr.port());
            options.set_keep_alive(Duration::from_secs(30));
            let (client, mut eventloop) = AsyncClient::new(options, 64);
            let (tx, events) = mpsc::unbounded_channel();
            tokio::spawn(async move {
                loop {
                    let event = eventloop.poll().await.map_err(|e| e.to_string());
                    let failed = event.is_err();
                    if tx.send(event).is_err() || failed {
                        return;
                    }
                }
            });
            let mut client = Client {
                client,
                events,
                publishes: VecDeque::new(),
            };
            let event = client
                .wait_for("CONNACK", |e| {
                    matches!(e, Event::Incoming(Packet::ConnAck(_)))
                })
                .await;
            if let Event::Incoming(Packet::ConnAck(ack)) = event {
                assert_eq!(ack.code, ConnectReturnCode::Success, "{ack:?}");
            }
            client
        }

        /// The first event `matches` accepts; PUBLISHes seen before it are kept for
        /// [`Client::next_publish`].
        async fn wait_for(&mut self, what: &str, matches: impl Fn(&Event) -> bool) -> Event {
            loop {
                let event = tokio::time::timeout(WAIT, self.events.recv())
                    .await
                    .unwrap_or_else(|_| panic!("no {what} within the wait"))
                    .unwrap_or_else(|| panic!("event loop ended while waiting for {what}"))
                    .unwrap_or_else(|e| panic!("connection error while waiting for {what}: {e}"));
                if matches(&event) {
                    return event;
                }
                if let Event::Incoming(Packet::Publish(publish)) = event {
                    self.publishes.push_back(publish);
                }
            }
        }

        pub async fn subscribe(&mut self, filter: &str, level: u8) {
            self.client
                .subscribe(filter, qos(level))
                .await
                .expect("subscribe");
            let event = self
                .wait_for("SUBACK", |e| {
                    matches!(e, Event::Incoming(Packet::SubAck(_)))
                })
                .await;
            if let Event::Incoming(Packet::SubAck(ack)) = event {
                assert_eq!(
                    ack.return_codes,
                    [SubscribeReasonCode::Success(qos(level))],
                    "SUBACK for {filter}"
                );
            }
        }

        /// Publishes and waits until its QoS flow is complete (QoS 0: written out).
        pub async fn publish(&mut self, topic: &str, level: u8, retain: bool, payload: &[u8]) {
            self.client
                .publish(topic, qos(level), retain, payload.to_vec())
                .await
                .expect("publish");
            let event = self
                .wait_for("the end of the publish flow", |e| {
                    matches!(
                        (level, e),
                        (0, Event::Outgoing(Outgoing::Publish(_)))
                            | (1, Event::Incoming(Packet::PubAck(_)))
                            | (2, Event::Incoming(Packet::PubComp(_)))
                    )
                })
                .await;
            if let Event::Incoming(Packet::PubAck(ack)) = &event {
                assert!(
                    matches!(
                        ack.reason,
                        rumqttc::v5::mqttbytes::v5::PubAckReason::Success
                            | rumqttc::v5::mqttbytes::v5::PubAckReason::NoMatchingSubscribers
                    ),
                    "PUBACK for {topic}: {ack:?}"
                );
            }
            if let Event::Incoming(Packet::PubComp(comp)) = &event {
                assert_eq!(
                    comp.reason,
                    rumqttc::v5::mqttbytes::v5::PubCompReason::Success,
                    "PUBCOMP for {topic}"
                );
            }
        }

        pub async fn next_publish(&mut self) -> Received {
            let publish = match self.publishes.pop_front() {
                Some(publish) => publish,
                None => match self
                    .wait_for("PUBLISH", |e| {
                        matches!(e, Event::Incoming(Packet::Publish(_)))
                    })
                    .await
                {
                    Event::Incoming(Packet::Publish(publish)) => publish,
                    other => unreachable!("{other:?}"),
                },
            };
            Received {
                topic: String::from_utf8(publish.topic.to_vec()).expect("UTF-8 topic"),
                payload: publish.payload,
                qos: publish.qos as u8,
                retain: publish.retain,
            }
        }

        pub async fn disconnect(self) {
            self.client.disconnect().await.expect("disconnect");
        }
    }
}

// ---------------------------------------------------------------------------------
// The tests, once per protocol level

/// The same tests for both clients.
macro_rules! mqtt_tests {
    ($level:ident, $client:path, $suffix:literal) => {
        mod $level {
            use super::*;
            use $client as Client;

            /// QoS 0, 1 and 2 from a rumqttc publisher through Canopy to a rumqttc
            /// subscriber at QoS 2: each arrives once, at the QoS it was published
            /// with, byte for byte, not retained.
            #[tokio::test]
            async fn publish_and_subscribe_qos_0_1_2() {
                let server = start_default().await;
                let addr = mqtt_addr(&server);
                let mut sub = Client::connect(addr, concat!("rq-sub-", $suffix)).await;
                sub.subscribe("rq/#", 2).await;
                let mut publisher = Client::connect(addr, concat!("rq-pub-", $suffix)).await;
                for level in 0..=2u8 {
                    let topic = format!("rq/{level}");
                    let mut payload = BINARY.to_vec();
                    payload.push(b'0' + level);
                    publisher.publish(&topic, level, false, &payload).await;
                    assert_eq!(
                        sub.next_publish().await,
                        Received {
                            topic,
                            payload: payload.into(),
                            qos: level,
                            retain: false,
                        }
                    );
                }
                publisher.disconnect().await;
                sub.disconnect().await;
                server.stop().await;
            }

            /// A retained publish reaches a client that subscribes later, retain set.
            #[tokio::test]
            async fn retained_reaches_later_subscriber() {
                let server = start_default().await;
                let addr = mqtt_addr(&server);
                let mut publisher = Client::connect(addr, concat!("rr-pub-", $suffix)).await;
                publisher.publish("rr/x", 1, true, b"kept").await;
                let mut sub = Client::connect(addr, concat!("rr-sub-", $suffix)).await;
                sub.subscribe("rr/#", 1).await;
                assert_eq!(
                    sub.next_publish().await,
                    Received {
                        topic: "rr/x".into(),
                        payload: Bytes::from_static(b"kept"),
                        qos: 1,
                        retain: true,
                    }
                );
                publisher.disconnect().await;
                sub.disconnect().await;
                server.stop().await;
            }

            /// An MQTT publish to devices/7/temp reaches a native subscriber of
            /// devices.*.temp as devices.7.temp with the same payload bytes.
            #[tokio::test]
            async fn mqtt_publish_reaches_native_subscriber() {
                let server = start_default().await;
                let native = async_nats::connect(server.native_url())
                    .await
                    .expect("native client connects");
                let mut native_sub = native.subscribe("devices.*.temp").await.expect("subscribe");
                native.flush().await.expect("flush");
                let mut publisher =
                    Client::connect(mqtt_addr(&server), concat!("bridge-pub-", $suffix)).await;
                publisher.publish("devices/7/temp", 1, false, BINARY).await;
                let message = tokio::time::timeout(WAIT, native_sub.next())
                    .await
                    .expect("the MQTT publish within the wait")
                    .expect("subscription open");
                assert_eq!(message.subject.as_str(), "devices.7.temp");
                assert_eq!(&message.payload[..], BINARY);
                publisher.disconnect().await;
                server.stop().await;
            }

            /// A native publish to devices.7.temp reaches an MQTT subscriber of
            /// devices/+/temp as devices/7/temp with the same payload bytes.
            #[tokio::test]
            async fn native_publish_reaches_mqtt_subscriber() {
                let server = start_default().await;
                let mut sub =
                    Client::connect(mqtt_addr(&server), concat!("bridge-sub-", $suffix)).await;
                sub.subscribe("devices/+/temp", 1).await;
                let native = async_nats::connect(server.native_url())
                    .await
                    .expect("native client connects");
                native
                    .publish("devices.7.temp", Bytes::from_static(BINARY))
                    .await
                    .expect("publish");
                native.flush().await.expect("flush");
                let received = sub.next_publish().await;
                assert_eq!(
                    (
                        received.topic.as_str(),
                        &received.payload[..],
                        received.retain
                    ),
                    ("devices/7/temp", BINARY, false)
                );
                sub.disconnect().await;
                server.stop().await;
            }
        }
    };
}

mqtt_tests!(rumqttc_v4, v4::Client, "v4");
mqtt_tests!(rumqttc_v5, v5::Client, "v5");

//! MQTT clients of a cluster: served by the owner of their tenant's shard, relayed
//! there by whichever node they reach, so a persistent session, its backlog, the
//! retained messages and the takeover of a client id work through every node and
//! follow the tenant when its shard moves.

use std::time::Duration;

use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, QoS};

use super::data::until_acked;
use super::processes::{Cluster3, mqtt_address, node_address, others_than, owner_of_default};

const WAIT: Duration = Duration::from_secs(15);
/// The cluster's shared secret: every link and relay proves it.
const SECRET: &str = "a secret the three nodes share";

/// A client of node `node`'s MQTT listener, its session kept (`clean` false).
fn device(
    status: &serde_json::Value,
    node: &str,
    id: &str,
    clean: bool,
) -> (AsyncClient, EventLoop) {
    let (host, port) = mqtt_address(status, node);
    let mut options = MqttOptions::new(id, host, port);
    options.set_clean_session(clean);
    options.set_keep_alive(Duration::from_secs(30));
    AsyncClient::new(options, 64)
}

/// The next incoming packet `pick` takes, within the wait; panics on a
/// connection error.
async fn next<T>(events: &mut EventLoop, mut pick: impl FnMut(&Packet) -> Option<T>) -> T {
    tokio::time::timeout(WAIT, async {
        loop {
            match events.poll().await {
                Ok(Event::Incoming(packet)) => {
                    if let Some(found) = pick(&packet) {
                        return found;
                    }
                }
                Ok(Event::Outgoing(_)) => {}
                Err(error) => panic!("the mqtt connection failed: {error}"),
            }
        }
    })
    .await
    .expect("the packet came in time")
}

/// Whether the connection ends (an error from the event loop) within the wait.
async fn ends(events: &mut EventLoop) -> bool {
    tokio::time::timeout(WAIT, async {
        loop {
            if events.poll().await.is_err() {
                return;
            }
        }
    })
    .await
    .is_ok()
}

async fn connected(events: &mut EventLoop) -> bool {
    next(events, |p| match p {
        Packet::ConnAck(ack) => Some(ack.session_present),
        _ => None,
    })
    .await
}

async fn publishes(events: &mut EventLoop, count: usize) -> Vec<(String, String, bool)> {
    let mut got = Vec::new();
    while got.len() < count {
        let publish = next(events, |p| match p {
            Packet::Publish(publish) => Some(publish.clone()),
            _ => None,
        })
        .await;
        got.push((
            publish.topic.clone(),
            String::from_utf8_lossy(&publish.payload).into_owned(),
            publish.retain,
        ));
    }
    got
}

#[tokio::test]
async fn an_mqtt_session_follows_its_device_to_any_node_and_across_an_owner_restart() {
    let mut cluster = Cluster3::start_with(&[("CANOPY_CLUSTER__SECRET", SECRET)]).await;
    let status = cluster.status().await;
    let owner = owner_of_default(&status);
    let others = others_than(&owner);
    let (x, y) = (others[0], others[1]);

    // A device on x (which relays it to the owner) subscribes, keeps a retained
    // state, and goes away.
    let (meter, mut events) = device(&status, x, "meter-7", false);
    assert!(!connected(&mut events).await, "a new session");
    meter
        .subscribe("plant/+/alarm", QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    next(&mut events, |p| {
        matches!(p, Packet::SubAck(_)).then_some(())
    })
    .await;
    meter
        .publish("plant/1/state", QoS::AtLeastOnce, true, "on")
        .await
        .expect("publish");
    next(&mut events, |p| {
        matches!(p, Packet::PubAck(_)).then_some(())
    })
    .await;
    meter.disconnect().await.expect("disconnect");
    let _ = ends(&mut events).await;

    // While it is away, a service on y raises alarms.
    let service = async_nats::connect(&cluster.node(y).url)
        .await
        .expect("service");
    for i in 1..=3 {
        until_acked(&service, &format!("plant.{i}.alarm"), &format!("alarm {i}")).await;
    }
    // It comes back through y: its session, and what it missed, in order.
    let (_meter, mut events) = device(&status, y, "meter-7", false);
    assert!(
        connected(&mut events).await,
        "the session is there through y"
    );
    let got = publishes(&mut events, 3).await;
    let texts: Vec<&str> = got.iter().map(|(_, text, _)| text.as_str()).collect();
    assert_eq!(texts, ["alarm 1", "alarm 2", "alarm 3"], "{got:?}");

    // Another client, on x, is sent the retained state.
    let (viewer, mut seen) = device(&status, x, "viewer", true);
    connected(&mut seen).await;
    viewer
        .subscribe("plant/+/state", QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    let retained = publishes(&mut seen, 1).await;
    assert_eq!(
        retained,
        [("plant/1/state".to_owned(), "on".to_owned(), true)]
    );

    // The same client id connecting through x takes the session over from y.
    let (_again, mut again) = device(&status, x, "meter-7", false);
    assert!(connected(&mut again).await, "taken over with its session");
    assert!(
        ends(&mut events).await,
        "the connection through y was taken over"
    );

    // The owner restarts (handing its shards over): the device's connection ends,
    // and through x it finds its session at the next owner.
    let log = cluster.restart(&owner).await;
    assert!(
        ends(&mut again).await,
        "the relayed connection ends when its owner stops: {log:?}"
    );
    cluster.settled().await;
    until_acked(&service, "plant.4.alarm", "alarm 4").await;
    let (_meter, mut events) = device(&status, x, "meter-7", false);
    assert!(
        connected(&mut events).await,
        "the session is at the next owner"
    );
    let got = publishes(&mut events, 1).await;
    assert_eq!(got[0].1, "alarm 4", "{got:?}");
}

#[tokio::test]
async fn a_relay_that_does_not_prove_the_cluster_secret_is_closed_unserved() {
    use canopy_protocols::link::{self, Frame, Proof, Relay};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let cluster = Cluster3::start_with(&[("CANOPY_CLUSTER__SECRET", SECRET)]).await;
    let status = cluster.status().await;
    let owner = owner_of_default(&status);
    let address = node_address(&status, &owner, "link").to_owned();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_millis() as u64;
    // Claims to relay the default tenant's admin, with a proof made without the
    // secret, then an MQTT 3.1.1 CONNECT.
    let relay = Relay {
        kind: link::RELAY_MQTT,
        cluster: &cluster.name,
        tenant: "default",
        user: Some("admin"),
        guest: false,
        client: "intruder",
        peer: "",
        proof: Proof {
            time_ms: now,
            nonce: [1; 16],
            mac: [0; 32],
        },
    };
    let mut first = Vec::new();
    link::encode(&Frame::Relay(relay), &mut first);
    first.extend_from_slice(b"\x10\x14\x00\x04MQTT\x04\x02\x00\x3c\x00\x08intruder");
    let mut stream = tokio::net::TcpStream::connect(&address)
        .await
        .expect("the cluster port");
    stream.write_all(&first).await.expect("sent");
    let mut answer = [0u8; 64];
    let read = tokio::time::timeout(WAIT, stream.read(&mut answer))
        .await
        .expect("the node answers or closes in time");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "closed without a CONNACK, got {:?}",
        read.map(|n| answer[..n].to_vec())
    );
}

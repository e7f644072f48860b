//! What a client sees of the data through any node of a cluster: stored publishes,
//! versions, expectations, dedupe, replay and get through a node that does not own
//! the tenant's shard are what the owner gives, and request/reply crosses nodes.

use std::time::Duration;

use futures::StreamExt;

use super::processes::{Cluster3, owner_of_default, signal};
use crate::common::{WAIT, header, publish_acked, replay_subject, store_request};

#[tokio::test]
async fn a_non_owner_stores_and_reads_exactly_as_the_owner_does() {
    let cluster = Cluster3::start().await;
    let owner_id = owner_of_default(&cluster.status().await);
    let owner = cluster.node(&owner_id);
    let other = cluster.not(&owner_id);
    let via_owner = async_nats::connect(&owner.url).await.expect("owner");
    let via_other = async_nats::connect(&other.url).await.expect("other");

    // Versions continue whichever node takes the publish.
    let first = publish_acked(&via_other, "accounts.7", "opened").await;
    let second = publish_acked(&via_owner, "accounts.7", "deposit").await;
    let third = publish_acked(&via_other, "accounts.7", "withdrawal").await;
    let versions: Vec<u64> = [&first, &second, &third]
        .iter()
        .map(|ack| ack["version"].as_u64().expect("version"))
        .collect();
    assert_eq!(versions, [1, 2, 3]);

    // An expected version that no longer holds is a conflict through either node.
    let mut stale = header("Canopy-Ack", "durable");
    stale.insert("Canopy-Expected-Version", "2");
    let conflict = store_request(&via_other, "accounts.7", stale, "late").await;
    assert!(conflict.get("error").is_some(), "{conflict}");
    let mut current = header("Canopy-Ack", "durable");
    current.insert("Canopy-Expected-Version", "3");
    let fourth = store_request(&via_other, "accounts.7", current, "interest").await;
    assert_eq!(fourth["version"].as_u64(), Some(4), "{fourth}");

    // A msg id seen through one node is a duplicate through the other.
    let mut once = header("Canopy-Ack", "durable");
    once.insert("Canopy-Msg-Id", "transfer-1");
    let stored = store_request(&via_other, "accounts.7", once.clone(), "transfer").await;
    let again = store_request(&via_owner, "accounts.7", once, "transfer").await;
    assert_eq!(stored["version"], again["version"], "{stored} {again}");
    assert_eq!(again["duplicate"].as_bool(), Some(true), "{again}");

    // Replay and get answer the same through both nodes.
    let from_owner = replay_subject(&via_owner, "accounts.7").await;
    let from_other = replay_subject(&via_other, "accounts.7").await;
    let texts = |all: &[crate::common::Stored]| -> Vec<(u64, String)> {
        all.iter().map(|m| (m.version, m.text())).collect()
    };
    assert_eq!(texts(&from_owner), texts(&from_other));
    assert_eq!(
        texts(&from_other),
        [
            (1, "opened".to_owned()),
            (2, "deposit".to_owned()),
            (3, "withdrawal".to_owned()),
            (4, "interest".to_owned()),
            (5, "transfer".to_owned()),
        ]
    );
    let got = tokio::time::timeout(
        WAIT,
        via_other.request(
            "$CANOPY.get",
            r#"{"subject":"accounts.7","version":2}"#.into(),
        ),
    )
    .await
    .expect("answered")
    .expect("answer");
    assert_eq!(&got.payload[..], b"deposit");
}

#[tokio::test]
async fn a_request_reaches_a_service_on_another_node_and_its_answer_comes_back() {
    let cluster = Cluster3::start().await;
    let (a, b) = (cluster.node("a"), cluster.node("b"));
    let service = async_nats::connect(&a.url).await.expect("service on a");
    let mut requests = service
        .queue_subscribe("prices.quote", "pricers".into())
        .await
        .expect("subscribe");
    service.flush().await.expect("flush");
    tokio::spawn(async move {
        while let Some(request) = requests.next().await {
            if let Some(reply) = request.reply {
                let _ = service.publish(reply, "42.10".into()).await;
            }
        }
    });
    let client = async_nats::connect(&b.url).await.expect("client on b");
    // The service's interest reaches b in the background.
    let mut answer = None;
    for _ in 0..50 {
        match tokio::time::timeout(
            Duration::from_millis(500),
            client.request("prices.quote", "EURUSD".into()),
        )
        .await
        {
            Ok(Ok(message)) => {
                answer = Some(message);
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let answer = answer.expect("the service on a answered a request made on b");
    assert_eq!(&answer.payload[..], b"42.10");
}

/// Publishes `payload` to `subject` with msg id `id`, trying again until it is
/// acknowledged, the way a client rides out a node's failure: the ack, and how many
/// tries failed.
async fn acked_with_retries(
    client: &async_nats::Client,
    subject: &str,
    id: &str,
    payload: &str,
) -> (serde_json::Value, usize) {
    for failures in 0..300 {
        let mut headers = header("Canopy-Ack", "durable");
        headers.insert("Canopy-Msg-Id", id);
        let answer = tokio::time::timeout(
            Duration::from_secs(3),
            client.request_with_headers(subject.to_owned(), headers, payload.to_owned().into()),
        )
        .await;
        if let Ok(Ok(message)) = answer
            && let Ok(ack) = serde_json::from_slice::<serde_json::Value>(&message.payload)
            && ack.get("version").is_some()
        {
            return (ack, failures);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{subject} {id} was never acknowledged");
}

/// Publishes `text` to `subject`, with `text` as its msg id, until it is acknowledged.
pub async fn until_acked(
    client: &async_nats::Client,
    subject: &str,
    text: &str,
) -> serde_json::Value {
    acked_with_retries(client, subject, text, text).await.0
}

/// Publishes `0` to `count - 1` to `subject`, each with its own msg id and until it
/// is acknowledged. Returns how many tries failed.
async fn publish_until_acked(client: async_nats::Client, subject: String, count: usize) -> usize {
    let mut failures = 0;
    for i in 0..count {
        let id = format!("{subject}-{i}");
        failures += acked_with_retries(&client, &subject, &id, &i.to_string())
            .await
            .1;
    }
    failures
}

#[tokio::test]
async fn killing_the_owner_under_load_loses_no_acknowledged_message() {
    let mut cluster = Cluster3::start().await;
    let owner_id = owner_of_default(&cluster.status().await);
    let survivors: Vec<String> = ["a", "b", "c"]
        .iter()
        .filter(|id| **id != owner_id)
        .map(|id| id.to_string())
        .collect();
    let mut publishers = Vec::new();
    for (n, id) in survivors.iter().enumerate() {
        let client = async_nats::connect(&cluster.node(id).url)
            .await
            .expect("connect");
        publishers.push(tokio::spawn(publish_until_acked(
            client,
            format!("load.p{n}"),
            300,
        )));
    }
    // Let them run, then kill the owner mid-stream.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let killed = std::time::Instant::now();
    cluster.kill(&owner_id).await;
    let mut failures = 0;
    for publisher in publishers {
        failures += tokio::time::timeout(Duration::from_secs(60), publisher)
            .await
            .expect("the publishers finish once the shard has a new owner")
            .expect("publisher");
    }
    eprintln!(
        "all acknowledged {:?} after kill -9 of the owner; {failures} tries failed meanwhile",
        killed.elapsed()
    );
    let reader = async_nats::connect(&cluster.node(&survivors[0]).url)
        .await
        .expect("connect");
    for n in 0..survivors.len() {
        let stored = replay_subject(&reader, &format!("load.p{n}")).await;
        let payloads: Vec<String> = stored.iter().map(crate::common::Stored::text).collect();
        let expected: Vec<String> = (0..300).map(|i| i.to_string()).collect();
        assert_eq!(
            payloads, expected,
            "load.p{n}: every acked message once, in order"
        );
        let versions: Vec<u64> = stored.iter().map(|m| m.version).collect();
        assert_eq!(
            versions,
            (1..=300).collect::<Vec<u64>>(),
            "load.p{n}: versions contiguous"
        );
    }
}

/// Sends one durable publish with a long timeout of its own (the client's default
/// request timeout is shorter than a takeover): its answer, once.
async fn publish_once(client: &async_nats::Client, subject: &str, text: &str) -> serde_json::Value {
    let request = async_nats::Request::new()
        .headers(header("Canopy-Ack", "durable"))
        .payload(text.to_owned().into())
        .timeout(Some(Duration::from_secs(40)));
    let answer = client
        .send_request(subject.to_owned(), request)
        .await
        .unwrap_or_else(|e| panic!("{subject} {text}: no answer: {e}"));
    serde_json::from_slice(&answer.payload).expect("an ack is JSON")
}

#[tokio::test]
async fn publishes_and_calls_made_while_the_owner_is_dead_wait_for_the_next_owner() {
    let mut cluster = Cluster3::start().await;
    let owner_id = owner_of_default(&cluster.status().await);
    let survivor = cluster.not(&owner_id).url.clone();
    let client = async_nats::connect(&survivor).await.expect("connect");
    until_acked(&client, "gap.1", "before").await;
    cluster.kill(&owner_id).await;
    // Sent at once, each tried one time only: until the dead owner's lease runs out
    // and the next owner opens the shard they wait, then the next owner answers.
    let killed = std::time::Instant::now();
    let (first, second, listed) = tokio::join!(
        publish_once(&client, "gap.1", "during1"),
        publish_once(&client, "gap.1", "during2"),
        async {
            let request = async_nats::Request::new()
                .payload(r#"{"subject":"gap.1","version":1}"#.into())
                .timeout(Some(Duration::from_secs(40)));
            client
                .send_request("$CANOPY.get", request)
                .await
                .expect("the get call is answered")
        },
    );
    eprintln!("answered {:?} after kill -9 of the owner", killed.elapsed());
    assert_eq!(first["version"], 2, "the first publish waited: {first}");
    assert_eq!(second["version"], 3, "and the second behind it: {second}");
    let status = listed
        .headers
        .as_ref()
        .and_then(|h| h.get("Canopy-Status"))
        .map(|v| v.as_str().to_owned());
    assert_eq!(status, None, "the call waited and was answered: {listed:?}");
    assert_eq!(&listed.payload[..], b"before");
    let stored = replay_subject(&client, "gap.1").await;
    let texts: Vec<String> = stored.iter().map(crate::common::Stored::text).collect();
    assert_eq!(texts, ["before", "during1", "during2"]);
}

#[tokio::test]
async fn a_stalled_owner_that_wakes_after_its_shard_moved_stores_nothing() {
    let cluster = Cluster3::start().await;
    let owner_id = owner_of_default(&cluster.status().await);
    let owner = cluster.node(&owner_id);
    let other = cluster.not(&owner_id);
    let on_owner = async_nats::connect(&owner.url).await.expect("owner");
    let on_other = async_nats::connect(&other.url).await.expect("other");
    let mut acked = Vec::new();
    for i in 0..3 {
        let text = format!("before{i}");
        acked.push((until_acked(&on_other, "ledger.1", &text).await, text));
    }

    signal(owner, "-STOP");
    crate::common::eventually(
        "another node owns the shard",
        Duration::from_secs(30),
        || async {
            let status = cluster.status().await;
            let owners = status["owners"].as_array()?;
            let shard = canopy::cluster::share::shard_of("default", owners.len() as u32);
            let now = owners[shard as usize]["owner"].as_str()?;
            (now != owner_id).then_some(())
        },
    )
    .await;
    for i in 0..3 {
        let text = format!("after{i}");
        acked.push((until_acked(&on_other, "ledger.1", &text).await, text));
    }
    signal(owner, "-CONT");
    // The stale owner's own client publishes the moment it wakes: either its node
    // already knows it lost the shard and forwards it, or it tries its old store,
    // which the new owner's opening has fenced. Acked or refused, never both.
    let mut stale = Vec::new();
    for i in 0..5 {
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            on_owner.request_with_headers(
                "ledger.1",
                header("Canopy-Ack", "durable"),
                format!("stale{i}").into(),
            ),
        )
        .await;
        let ack = match answer {
            Ok(Ok(message)) => serde_json::from_slice::<serde_json::Value>(&message.payload).ok(),
            _ => None,
        };
        stale.push((ack, format!("stale{i}")));
    }
    eprintln!("the woken owner's client got: {stale:?}");
    let stored = replay_subject(&on_other, "ledger.1").await;
    let versions: Vec<u64> = stored.iter().map(|m| m.version).collect();
    assert_eq!(
        versions,
        (1..=stored.len() as u64).collect::<Vec<_>>(),
        "contiguous"
    );
    let texts: Vec<String> = stored.iter().map(crate::common::Stored::text).collect();
    for (ack, text) in &acked {
        assert!(texts.contains(text), "acked {text} ({ack}) lost: {texts:?}");
    }
    for (ack, text) in &stale {
        let was_acked = ack.as_ref().is_some_and(|a| a.get("version").is_some());
        assert_eq!(
            texts.contains(text),
            was_acked,
            "{text}: stored must mean acked ({ack:?}); stored: {texts:?}"
        );
    }
}

#[tokio::test]
async fn a_rolling_restart_of_every_node_under_load_loses_nothing_acknowledged() {
    let mut cluster = Cluster3::start().await;
    let mut publishers = Vec::new();
    for (n, id) in ["a", "b", "c"].iter().enumerate() {
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect(&cluster.node(id).url)
            .await
            .expect("connect");
        publishers.push(tokio::spawn(publish_until_acked(
            client,
            format!("rolling.p{n}"),
            400,
        )));
    }
    for id in ["a", "b", "c"] {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let log = cluster.restart(id).await;
        let handed = log
            .iter()
            .filter(|l| l.contains("handed the shard over"))
            .count();
        assert!(
            handed > 0,
            "{id} handed nothing over when told to stop: {log:#?}"
        );
    }
    let mut failures = 0;
    for publisher in publishers {
        failures += tokio::time::timeout(Duration::from_secs(120), publisher)
            .await
            .expect("the publishers finish")
            .expect("publisher");
    }
    eprintln!("rolling restart: {failures} tries failed and were retried");
    let reader = async_nats::connect(&cluster.node("a").url)
        .await
        .expect("connect");
    for n in 0..3 {
        let stored = replay_subject(&reader, &format!("rolling.p{n}")).await;
        let payloads: Vec<String> = stored.iter().map(crate::common::Stored::text).collect();
        let expected: Vec<String> = (0..400).map(|i| i.to_string()).collect();
        assert_eq!(
            payloads, expected,
            "rolling.p{n}: every acked message once, in order"
        );
    }
}

#[tokio::test]
async fn a_consumer_group_works_from_any_node_and_goes_on_after_its_owner_dies() {
    use crate::groups::{await_cursors_stored, delivered, next, reply};
    let mut cluster = Cluster3::start().await;
    let owner_id = owner_of_default(&cluster.status().await);
    let others: Vec<String> = ["a", "b", "c"]
        .iter()
        .filter(|id| **id != owner_id)
        .map(|id| id.to_string())
        .collect();
    let member = async_nats::connect(&cluster.node(&others[0]).url)
        .await
        .expect("member");
    let publisher = async_nats::connect(&cluster.node(&others[1]).url)
        .await
        .expect("publisher");
    let (status, created) = crate::common::api(
        &member,
        "group.create",
        serde_json::json!({"name": "billing", "pattern": "invoices.>", "start": "all"}),
    )
    .await;
    assert_eq!(
        status, 200,
        "created through a node that does not own it: {created}"
    );
    for n in 1..=3 {
        publish_acked(&publisher, &format!("invoices.{n}"), "v1").await;
    }
    let body = serde_json::json!({"group": "billing", "max": 10});
    let first = next(&member, body.clone()).await;
    assert_eq!(
        delivered(&first),
        [
            ("invoices.1".into(), 1, 1),
            ("invoices.2".into(), 1, 1),
            ("invoices.3".into(), 1, 1)
        ]
    );
    for message in &first {
        reply(&member, message, "+ACK").await;
    }
    await_cursors_stored(&member, "billing", 3).await;

    cluster.kill(&owner_id).await;
    let acked = until_acked(&publisher, "invoices.1", "v2").await;
    assert_eq!(acked["version"].as_u64(), Some(2), "{acked}");
    // The new owner runs the group from its stored cursors: only what is new comes.
    let again = pull_once_moved(&member, "billing", &body).await;
    assert_eq!(
        delivered(&again),
        [("invoices.1".into(), 2, 1)],
        "no acknowledged message comes again"
    );
}

#[tokio::test]
async fn a_publish_through_a_non_owner_that_breaks_its_schema_is_not_stored() {
    let cluster = Cluster3::start().await;
    let owner_id = owner_of_default(&cluster.status().await);
    let via_owner = async_nats::connect(&cluster.node(&owner_id).url)
        .await
        .expect("owner");
    let via_other = async_nats::connect(&cluster.not(&owner_id).url)
        .await
        .expect("other");
    // Bound through the owner, which keeps the tenant's bindings.
    crate::schemas::bind(
        &via_owner,
        "meters.*",
        serde_json::json!({
            "type": "object",
            "properties": {"kwh": {"type": "number"}},
            "required": ["kwh"]
        }),
    )
    .await;
    let refused = store_request(
        &via_other,
        "meters.1",
        header("Canopy-Ack", "durable"),
        r#"{"kwh": "lots"}"#,
    )
    .await;
    assert!(
        refused["error"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("schema")),
        "{refused}"
    );
    let stored = publish_acked(&via_other, "meters.1", r#"{"kwh": 1.5}"#).await;
    assert_eq!(stored["version"].as_u64(), Some(1), "{stored}");
    let texts: Vec<String> = replay_subject(&via_other, "meters.1")
        .await
        .iter()
        .map(crate::common::Stored::text)
        .collect();
    assert_eq!(texts, [r#"{"kwh": 1.5}"#]);
}

#[tokio::test]
async fn a_group_handed_over_by_a_stopping_owner_hands_out_nothing_acknowledged_again() {
    use crate::groups::{delivered, next, reply};
    let mut cluster = Cluster3::start().await;
    let owner_id = owner_of_default(&cluster.status().await);
    let other = ["a", "b", "c"]
        .into_iter()
        .find(|id| *id != owner_id)
        .expect("another node");
    let member = async_nats::connect(&cluster.node(other).url)
        .await
        .expect("member");
    let (status, created) = crate::common::api(
        &member,
        "group.create",
        serde_json::json!({"name": "shipping", "pattern": "parcels.>", "start": "all"}),
    )
    .await;
    assert_eq!(status, 200, "{created}");
    for n in 1..=3 {
        publish_acked(&member, &format!("parcels.{n}"), "v1").await;
    }
    let body = serde_json::json!({"group": "shipping", "max": 10});
    let first = next(&member, body.clone()).await;
    assert_eq!(first.len(), 3);
    // Acked, and the owner told to stop at once, before its periodic cursor write:
    // the handover writes them.
    for message in &first {
        reply(&member, message, "+ACK").await;
    }
    cluster.restart(&owner_id).await;
    until_acked(&member, "parcels.1", "v2").await;
    let again = pull_once_moved(&member, "shipping", &body).await;
    assert_eq!(
        delivered(&again),
        [("parcels.1".into(), 2, 1)],
        "no acknowledged message comes again"
    );
}

/// Pulls from `group` until something comes, once the group runs again on its
/// shard's new owner (its info answers).
async fn pull_once_moved(
    member: &async_nats::Client,
    group: &str,
    body: &serde_json::Value,
) -> Vec<async_nats::Message> {
    for _ in 0..100 {
        let info = tokio::time::timeout(
            Duration::from_secs(3),
            crate::common::api(member, "group.info", serde_json::json!({"name": group})),
        )
        .await;
        if matches!(info, Ok((200, _))) {
            let got = crate::groups::next(member, body.clone()).await;
            if !got.is_empty() {
                return got;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("group {group} never handed anything out again");
}

/// Sends `text` on a raw NATS connection and reads until a line is `until`: the
/// payloads of the messages that came first.
async fn exchange(
    stream: &mut tokio::io::BufReader<tokio::net::TcpStream>,
    text: &str,
    until: &str,
) -> Vec<String> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    stream
        .get_mut()
        .write_all(text.as_bytes())
        .await
        .expect("sent");
    let mut payloads = Vec::new();
    let mut line = String::new();
    tokio::time::timeout(WAIT, async {
        let mut in_message = false;
        loop {
            line.clear();
            let read = stream.read_line(&mut line).await.expect("read");
            assert!(read > 0, "the server closed the connection");
            let line = line.trim_end();
            if in_message {
                payloads.push(line.to_owned());
                in_message = false;
            } else if line.starts_with("MSG ") {
                in_message = true;
            } else if line == until {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {until} within the wait"));
    payloads
}

#[tokio::test]
async fn a_ping_through_a_non_owner_is_answered_after_its_publishes_are_delivered() {
    let cluster = Cluster3::start().await;
    let status = cluster.status().await;
    let owner = owner_of_default(&status);
    let others = super::processes::others_than(&owner);
    // The client speaks the protocol itself: a PING after publishes is NATS's flush
    // (nats.go's Flush, nats-py's flush), whose PONG comes after the deliveries of
    // every earlier publish, its own subscriptions' included.
    let address = super::processes::node_address(&status, others[0], "native");
    let mut client = tokio::io::BufReader::new(
        tokio::net::TcpStream::connect(address)
            .await
            .expect("connect"),
    );
    exchange(
        &mut client,
        "CONNECT {\"verbose\":false,\"protocol\":1}\r\nSUB flushed.1 1\r\nPING\r\n",
        "PONG",
    )
    .await;
    // The owner learns of the subscription a moment later.
    let mut probes = 0;
    while !exchange(&mut client, "PUB flushed.1 5\r\nprobe\r\nPING\r\n", "PONG")
        .await
        .contains(&"probe".to_owned())
    {
        probes += 1;
        assert!(probes < 100, "the owner never routed to this node");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for round in 0..3 {
        let mut batch = String::new();
        for i in 0..200 {
            let payload = format!("{round}-{i}");
            batch.push_str(&format!("PUB flushed.1 {}\r\n{payload}\r\n", payload.len()));
        }
        batch.push_str("PING\r\n");
        let got: Vec<String> = exchange(&mut client, &batch, "PONG")
            .await
            .into_iter()
            .filter(|p| p.starts_with(&format!("{round}-")))
            .collect();
        let sent: Vec<String> = (0..200).map(|i| format!("{round}-{i}")).collect();
        assert_eq!(
            got, sent,
            "round {round}: every publish delivered, in order, before the PONG"
        );
    }
}

#[tokio::test]
async fn a_publish_through_a_non_owner_awaits_a_group_on_another_node() {
    use crate::groups::{delivered, next, reply};
    let cluster = Cluster3::start().await;
    let owner = owner_of_default(&cluster.status().await);
    let others = super::processes::others_than(&owner);
    let member = async_nats::connect(&cluster.node(others[0]).url)
        .await
        .expect("member");
    let publisher = async_nats::connect(&cluster.node(others[1]).url)
        .await
        .expect("publisher");
    let (status, created) = crate::common::api(
        &member,
        "group.create",
        serde_json::json!({"name": "billing", "pattern": "orders.>"}),
    )
    .await;
    assert_eq!(status, 200, "{created}");
    // The member joins by pulling once.
    assert!(
        next(&member, serde_json::json!({"group": "billing"}))
            .await
            .is_empty()
    );

    // Through a node that owns neither the tenant nor the member: the owner runs
    // the group and answers once it passed the message.
    let mut headers = header("Canopy-Await", "billing");
    headers.insert("Canopy-Await-Timeout", "10s");
    let waiting = {
        let publisher = publisher.clone();
        tokio::spawn(async move { store_request(&publisher, "orders.7", headers, "order").await })
    };
    let got = next(
        &member,
        serde_json::json!({"group": "billing", "wait_ms": 5000}),
    )
    .await;
    assert_eq!(delivered(&got), [("orders.7".into(), 1, 1)]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "answered before the group acked");
    reply(&member, &got[0], "+ACK").await;
    let ack = tokio::time::timeout(WAIT, waiting)
        .await
        .expect("answered after the ack")
        .expect("publisher");
    assert_eq!(ack["version"], 1, "{ack}");
    assert_eq!(
        ack["await"]["passed"],
        serde_json::json!(["billing"]),
        "{ack}"
    );

    // A group that does not exist is answered at once, with why, through the link.
    let ack = store_request(
        &publisher,
        "orders.8",
        header("Canopy-Await", "nobody"),
        "order",
    )
    .await;
    assert_eq!(ack["await"]["pending"][0]["group"], "nobody", "{ack}");
    assert_eq!(
        ack["await"]["pending"][0]["reason"], "no such group",
        "{ack}"
    );
}

#[tokio::test]
async fn a_request_no_node_answers_gets_no_responders_and_one_a_remote_node_answers_does_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("live.toml");
    // Only stored.> is stored: a request elsewhere is live, as NATS's are.
    std::fs::write(&file, "[[store.policies]]\npattern = \"stored.>\"\n").expect("config");
    let file = file.to_str().expect("a path").to_owned();
    let cluster = Cluster3::start_with(&[("CANOPY_CONFIG", &file)]).await;
    let asker = async_nats::connect(&cluster.node("b").url)
        .await
        .expect("connect");
    let error = tokio::time::timeout(WAIT, asker.request("live.nobody", "?".into()))
        .await
        .expect("answered at once")
        .expect_err("nobody answers");
    assert_eq!(
        error.kind(),
        async_nats::RequestErrorKind::NoResponders,
        "{error}"
    );

    let service = async_nats::connect(&cluster.node("c").url)
        .await
        .expect("connect");
    let mut requests = service.subscribe("live.price").await.expect("subscribe");
    service.flush().await.expect("flush");
    tokio::spawn(async move {
        while let Some(request) = requests.next().await {
            if let Some(reply) = request.reply {
                let _ = service.publish(reply, "42".into()).await;
            }
        }
    });
    // b learns of c's interest a moment later; until then it says no responders.
    let answer = crate::common::eventually("c's service answers b's client", WAIT, || async {
        asker.request("live.price", "?".into()).await.ok()
    })
    .await;
    assert_eq!(&answer.payload[..], b"42");
}

//! Issue 26: a schema check and a compatibility check cost bounded time whatever the
//! schema, and no tenant's schemas slow another tenant.
//!
//! Regular expressions run on a linear-time engine: one it cannot run is refused
//! when put, and a pattern that would backtrack catastrophically elsewhere costs a
//! publish time linear in its payload. Compatibility checks run off the runtime's
//! threads, compare enums as sets, and stop past their budget with 422. "Another
//! tenant goes on" is shown by its request/reply round trips each answering within
//! [`ROUND_TRIP`] while the costly work runs, where before they timed out.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};

use crate::common::{api, start_default, status_of};
use crate::logins::Logins;

/// The generous bound on one round trip of a tenant beside the costly work: far
/// above what one takes on an idle server, far below what the attacks cost it.
const ROUND_TRIP: Duration = Duration::from_secs(5);

/// A put answered within a minute (a put is bounded by the checks' budget, 5 s, and
/// a debug build's parse of what it sends).
async fn put(client: &async_nats::Client, body: Value) -> (u16, Value) {
    let answer = tokio::time::timeout(
        Duration::from_secs(60),
        client.request("$CANOPY.schema.put", body.to_string().into()),
    )
    .await
    .expect("the put is answered within a minute")
    .expect("answered");
    let status = status_of(&answer);
    let value = serde_json::from_slice(&answer.payload).expect("JSON answer");
    (status, value)
}

fn description(answer: &Value) -> &str {
    answer["error"]["description"].as_str().unwrap_or_default()
}

/// Answers every request on `svc.echo` with its own payload, until dropped.
async fn echo_service(client: &async_nats::Client) -> tokio::task::JoinHandle<()> {
    let mut requests = client.subscribe("svc.echo").await.expect("subscribe");
    client.flush().await.expect("flush");
    let responder = client.clone();
    tokio::spawn(async move {
        while let Some(request) = requests.next().await {
            if let Some(reply) = request.reply {
                let _ = responder.publish(reply, request.payload).await;
            }
        }
    })
}

/// Round trips on `svc.echo` until `done`, each held to [`ROUND_TRIP`]; how many.
async fn round_trips_until(client: async_nats::Client, done: Arc<AtomicBool>) -> usize {
    let mut count = 0;
    loop {
        let finished = done.load(Ordering::Relaxed);
        let payload = format!("ping {count}");
        let answer = tokio::time::timeout(
            ROUND_TRIP,
            client.request("svc.echo", payload.clone().into()),
        )
        .await
        .unwrap_or_else(|_| {
            panic!("round trip {count} of the other tenant took more than {ROUND_TRIP:?}")
        })
        .expect("answered");
        assert_eq!(answer.payload, payload.as_bytes());
        count += 1;
        if finished {
            return count;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A backreference, a look-around and a pattern past the size limit are refused
/// when put, each naming the pattern, where it is and why. `^(a+)+$`, which the
/// linear engine runs as it is, is bound; publishes of `aaaa…ab` from two
/// connections are refused while another tenant's round trips go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patterns_run_on_a_linear_time_engine() {
    let logins = Logins::start(
        &["regex-a", "regex-b"],
        &[("regex-a", "ann", None), ("regex-b", "bob", None)],
    )
    .await;
    let ann = logins.native("ann@regex-a").await;
    for (schema, at, pattern, why) in [
        (
            json!({"type": "string", "pattern": r"^(a*)*\1$"}),
            "#/pattern",
            r"^(a*)*\1$",
            "backreferences are not supported",
        ),
        (
            json!({"type": "object", "properties": {"id": {"type": "string"}},
                   "patternProperties": {"^(?!id$).*": {"type": "number"}}}),
            "#/patternProperties/^(?!id$).*",
            "^(?!id$).*",
            "look-around",
        ),
        (
            json!({"type": "string", "pattern": "^.{0,5000}$"}),
            "#/pattern",
            "^.{0,5000}$",
            "more than 1048576 bytes",
        ),
    ] {
        let (status, answer) = put(&ann, json!({"pattern": "redos.*", "schema": schema})).await;
        assert_eq!(status, 400, "{schema}: {answer}");
        let text = description(&answer);
        for part in [at, pattern, why] {
            assert!(text.contains(part), "{schema}: no `{part}` in {text}");
        }
    }
    let (_, list) = api(&ann, "schema.list", json!({})).await;
    assert_eq!(list["schemas"], json!([]), "{list}");

    let (status, answer) = put(
        &ann,
        json!({"pattern": "redos.*", "schema": {"type": "string", "pattern": "^(a+)+$"}}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let bob = logins.native("bob@regex-b").await;
    let service = echo_service(&bob).await;
    let done = Arc::new(AtomicBool::new(false));
    let trips = tokio::spawn(round_trips_until(
        logins.native("bob@regex-b").await,
        Arc::clone(&done),
    ));
    let payload = serde_json::to_string(&format!("{}b", "a".repeat(4_000))).expect("JSON");
    let mut publishers = Vec::new();
    for _ in 0..2 {
        let client = logins.native("ann@regex-a").await;
        let payload = payload.clone();
        publishers.push(tokio::spawn(async move {
            for _ in 0..400 {
                client
                    .publish("redos.x", payload.clone().into())
                    .await
                    .expect("publish");
            }
            // A call on the same connection is answered once the publishes before
            // it were taken (a flush only writes them).
            let (status, _) = api(&client, "schema.list", json!({})).await;
            assert_eq!(status, 200);
        }));
    }
    for publisher in publishers {
        publisher.await.expect("publisher");
    }
    done.store(true, Ordering::Relaxed);
    let trips = trips.await.expect("round trips");
    assert!(trips >= 1, "{trips}");
    // Refused, every one.
    let (_, seen) = api(&ann, "schema.errors", json!({})).await;
    assert_eq!(seen["refused"], 800);
    service.abort();
    logins.server.stop().await;
}

/// An enum of `n` values (each `"v000123"`, 10 bytes of JSON with its comma:
/// 23,000 make a 230 KiB schema).
fn enum_schema(n: usize) -> Value {
    let values: Vec<Value> = (0..n).map(|i| json!(format!("v{i:06}"))).collect();
    json!({"enum": values})
}

/// The issue's attack scaled down: two tenants grow a 230 KiB enum under
/// `backward_transitive`, version after version, at once. Each put is taken; a third
/// tenant's round trips each answer within [`ROUND_TRIP`] meanwhile (the checks
/// ran on the runtime's two threads, quadratic in the enum: minutes in a debug build).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn growing_enums_are_checked_off_the_runtime() {
    let logins = Logins::start(
        &["grow-a", "grow-b", "steady"],
        &[
            ("grow-a", "ann", None),
            ("grow-b", "bob", None),
            ("steady", "sue", None),
        ],
    )
    .await;
    let sue = logins.native("sue@steady").await;
    let service = echo_service(&sue).await;
    let done = Arc::new(AtomicBool::new(false));
    let trips = tokio::spawn(round_trips_until(
        logins.native("sue@steady").await,
        Arc::clone(&done),
    ));
    let mut growers = Vec::new();
    for who in ["ann@grow-a", "bob@grow-b"] {
        let client = logins.native(who).await;
        growers.push(tokio::spawn(async move {
            for version in 1..=5_usize {
                let schema = enum_schema(23_000 + 100 * version);
                let (status, answer) = put(
                    &client,
                    json!({"pattern": "codes.*", "schema": schema,
                           "mode": "backward_transitive"}),
                )
                .await;
                assert_eq!(status, 200, "version {version}: {answer}");
                assert_eq!(answer["version"], version, "{answer}");
            }
        }));
    }
    for grower in growers {
        grower.await.expect("grower");
    }
    done.store(true, Ordering::Relaxed);
    let trips = trips.await.expect("round trips");
    assert!(trips >= 1, "{trips}");
    service.abort();
    logins.server.stop().await;
}

/// Under `full_transitive`, each version of a 250 KiB schema is compared both ways
/// with every earlier one: past the bytes one put may compare, the put is refused
/// with 422 saying why and what to do, and nothing is bound. A mode that compares
/// only the last version takes it.
#[tokio::test]
async fn a_check_past_its_budget_is_refused_with_422() {
    let server = start_default().await;
    let client = async_nats::connect(server.native_addr.to_string())
        .await
        .expect("connect");
    // 2,500 values of 100 bytes: cheap to hash, 250 KiB to parse and compare.
    let values: Vec<Value> = (0..2_500)
        .map(|i| json!(format!("{i:06}{}", "x".repeat(92))))
        .collect();
    let mut refused_at = None;
    for version in 1..=40_u64 {
        let schema = json!({"title": format!("version {version}"), "enum": values});
        let (status, answer) = put(
            &client,
            json!({"pattern": "big.*", "schema": schema, "mode": "full_transitive"}),
        )
        .await;
        if status == 200 {
            assert_eq!(answer["version"], version, "{answer}");
            continue;
        }
        assert_eq!(status, 422, "version {version}: {answer}");
        let text = description(&answer);
        for part in [
            "was not checked against its earlier versions",
            "full_transitive",
            "more than 16777216 bytes",
            "not transitive",
        ] {
            assert!(text.contains(part), "no `{part}` in {text}");
        }
        refused_at = Some(version);
        break;
    }
    // Each earlier version costs about 1 MiB compared (250 KiB, and the new one's,
    // both ways): the sixteenth or so is the last.
    let refused_at = refused_at.expect("refused before version 40");
    assert!((10..=20).contains(&refused_at), "{refused_at}");
    let (_, current) = api(&client, "schema.get", json!({"pattern": "big.*"})).await;
    assert_eq!(current["version"], refused_at - 1, "{current}");
    let schema = json!({"title": "only against the last", "enum": values});
    let (status, answer) = put(
        &client,
        json!({"pattern": "big.*", "schema": schema, "mode": "full"}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["version"], refused_at, "{answer}");
    server.stop().await;
}

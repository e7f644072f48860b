//! Canopy on S3 (moto's server, started by scripts/test-all.sh): two processes on one
//! bucket, where the newer one takes the store over by fencing the older.

use bytes::Bytes;

use crate::cli::ServeProcess;
use crate::common::{WAIT, header, publish_acked, replay_subject, s3_env};

#[tokio::test]
async fn a_second_server_takes_over_an_s3_store_by_fencing_the_first() {
    let env = s3_env(&format!("fence-{:016x}", fastrand::u64(..)));
    let first = ServeProcess::start_with_env(&[], &env).await;
    let old = async_nats::connect(&first.url).await.expect("connect");
    let mut acked = Vec::new();
    for i in 0..20 {
        acked.push(publish_acked(&old, "fence.a", format!("m{i}")).await);
    }

    let second = ServeProcess::start_with_env(&[], &env).await;
    let new = async_nats::connect(&second.url).await.expect("connect");

    // The first server can no longer make anything durable: its acks turn into errors.
    let mut refused = None;
    for i in 0..200 {
        let mut headers = header("Canopy-Ack", "durable");
        headers.insert("Canopy-Msg-Id", format!("late-{i}").as_str());
        let answer = tokio::time::timeout(
            WAIT,
            old.request_with_headers("fence.a", headers, Bytes::from(format!("late{i}"))),
        )
        .await
        .expect("answered")
        .expect("answered");
        let value: serde_json::Value = serde_json::from_slice(&answer.payload).expect("JSON");
        if value.get("error").is_some() {
            refused = Some(value);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let refused = refused.expect("the fenced server refuses to ack");
    assert!(
        refused["error"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("fenced")),
        "{refused}"
    );

    // Everything the first server acked is on the second, and versions go on.
    let stored = replay_subject(&new, "fence.a").await;
    for ack in &acked {
        let version = ack["version"].as_u64().expect("version");
        assert!(
            stored.iter().any(|m| m.version == version),
            "acked version {version} lost"
        );
    }
    let next = publish_acked(&new, "fence.a", "on the new server").await;
    assert!(next["version"].as_u64().expect("version") > acked.len() as u64);

    // The first server said so, loudly.
    drop(old);
    let ServeProcess { mut child, log, .. } = first;
    let _ = child.kill().await;
    let log = log.await.expect("log");
    assert!(
        log.iter()
            .any(|l| l.contains("ERROR") && l.contains("canopy") && l.contains("FENCED")),
        "the fenced server logs it: {log:?}"
    );
    drop(second);
}

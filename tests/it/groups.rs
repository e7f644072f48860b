//! Consumer group definitions through `$CANOPY.group.*` and `canopy group`: created,
//! listed, shown, refused when wrong, kept across a restart, deleted.

use serde_json::json;

use crate::common::{WAIT, api, file_config, start, start_default};

#[tokio::test]
async fn groups_are_created_listed_shown_and_deleted() {
    let server = start_default().await;
    let client = async_nats::connect(server.native_url()).await.unwrap();

    let (status, created) = api(
        &client,
        "group.create",
        json!({"name": "billing", "pattern": "orders.>"}),
    )
    .await;
    assert_eq!(status, 200, "{created}");
    assert_eq!(created["pattern"], "orders.>");
    assert_eq!(
        created["per_subject"], 1,
        "strict order per subject by default"
    );
    assert_eq!(created["ack_wait_ms"], 30_000);
    assert_eq!(created["start"], "new");
    assert_eq!(created["dead_letter_subject"], "$DLQ.billing.<subject>");

    let (status, again) = api(
        &client,
        "group.create",
        json!({"name": "billing", "pattern": "other.>"}),
    )
    .await;
    assert_eq!(status, 409, "{again}");

    let (status, _) = api(
        &client,
        "group.create",
        json!({"name": "search", "pattern": "orders.*.placed", "per_subject": 8,
               "start": "all", "dead_letter": "dead.search"}),
    )
    .await;
    assert_eq!(status, 200);

    let (_, listed) = api(&client, "group.list", json!({})).await;
    let names: Vec<&str> = listed["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["billing", "search"]);

    let (status, info) = api(&client, "group.info", json!({"name": "search"})).await;
    assert_eq!(status, 200);
    assert_eq!(info["per_subject"], 8);
    assert_eq!(info["start"], "all");
    assert_eq!(info["dead_letter_subject"], "dead.search.<subject>");
    assert_eq!(info["subjects"], 0);

    let (status, deleted) = api(&client, "group.delete", json!({"name": "billing"})).await;
    assert_eq!((status, &deleted["deleted"]), (200, &json!(true)));
    let (status, gone) = api(&client, "group.info", json!({"name": "billing"})).await;
    assert_eq!(status, 404, "{gone}");
    let (status, _) = api(&client, "group.delete", json!({"name": "billing"})).await;
    assert_eq!(status, 404);
    server.stop().await;
}

#[tokio::test]
async fn a_wrong_definition_is_refused_with_the_reason() {
    let server = start_default().await;
    let client = async_nats::connect(server.native_url()).await.unwrap();
    let cases = [
        (json!({"name": "a b", "pattern": "x"}), "group name"),
        (json!({"name": "g", "pattern": "x.>.y"}), "pattern"),
        (
            json!({"name": "g", "pattern": "x", "per_subject": 0}),
            "per_subject",
        ),
        (
            json!({"name": "g", "pattern": "x", "ack_wait_ms": 0}),
            "ack_wait_ms",
        ),
        (
            json!({"name": "g", "pattern": "x", "dead_letter": "a..b"}),
            "dead-letter",
        ),
        (
            json!({"name": "g", "pattern": "x", "ack_wiat_ms": 5}),
            "unknown field",
        ),
        (json!({"name": "g"}), "pattern"),
    ];
    for (body, says) in cases {
        let (status, answer) = api(&client, "group.create", body.clone()).await;
        assert_eq!(status, 400, "{body} -> {answer}");
        let description = answer["error"]["description"].as_str().unwrap();
        assert!(description.contains(says), "{body}: {description}");
    }
    let (_, listed) = api(&client, "group.list", json!({})).await;
    assert_eq!(listed["groups"], json!([]), "nothing refused was stored");
    let (status, _) = api(&client, "group.frobnicate", json!({})).await;
    assert_eq!(status, 404);
    server.stop().await;
}

#[tokio::test]
async fn a_group_outlives_a_restart() {
    let folder = tempfile::tempdir().unwrap();
    let server = start(file_config(folder.path())).await;
    let client = async_nats::connect(server.native_url()).await.unwrap();
    let (status, _) = api(
        &client,
        "group.create",
        json!({"name": "billing", "pattern": "orders.>", "max_deliveries": 9}),
    )
    .await;
    assert_eq!(status, 200);
    drop(client);
    server.stop().await;

    let server = start(file_config(folder.path())).await;
    let client = async_nats::connect(server.native_url()).await.unwrap();
    let (status, info) = api(&client, "group.info", json!({"name": "billing"})).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["max_deliveries"], 9);
    server.stop().await;
}

#[tokio::test]
async fn canopy_group_manages_groups_from_the_command_line() {
    const BIN: &str = env!("CARGO_BIN_EXE_canopy");
    let data = tempfile::tempdir().unwrap();
    let server = start(file_config(data.path())).await;
    let url = server.native_url();
    let run = |args: Vec<&str>| {
        let url = url.clone();
        let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        async move {
            let out = tokio::time::timeout(
                WAIT,
                tokio::process::Command::new(BIN)
                    .args(&args)
                    .args(["--server", &url])
                    .output(),
            )
            .await
            .expect("finishes")
            .expect("runs");
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
    };
    let (ok, out, err) = run(vec![
        "group",
        "create",
        "billing",
        "orders.>",
        "--ack-wait",
        "500ms",
        "--per-subject",
        "2",
        "--start",
        "1h",
    ])
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("billing  orders.>  ack wait 500 ms"), "{out}");
    let (ok, out, _) = run(vec!["group", "info", "billing", "--json"]).await;
    assert!(ok);
    let info: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(info["per_subject"], 2);
    let since = info["start"]["time"].as_u64().expect("a start time");
    let hour_ago = canopy::store::now_ms() - 3_600_000;
    assert!(since.abs_diff(hour_ago) < 60_000, "{since} vs {hour_ago}");
    let (ok, _, err) = run(vec!["group", "create", "x", "y", "--ack-wait", "soon"]).await;
    assert!(!ok);
    assert!(err.contains("--ack-wait"), "{err}");
    let (ok, _, err) = run(vec!["group", "create", "billing", "z.>"]).await;
    assert!(!ok);
    assert!(err.contains("exists already"), "{err}");
    let (ok, _, _) = run(vec!["group", "delete", "billing"]).await;
    assert!(ok);
    let (ok, out, _) = run(vec!["group", "list"]).await;
    assert!(ok);
    assert!(out.trim().is_empty(), "{out}");
    server.stop().await;
}

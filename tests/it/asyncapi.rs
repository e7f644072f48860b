//! `GET /api/asyncapi` and `canopy asyncapi`: the tenant's bindings as an AsyncAPI 3.0
//! document, validated against the official AsyncAPI 3.0 JSON Schema (npm's
//! `@asyncapi/specs`, installed in tests/js by scripts/test-all.sh).

use serde_json::{Value, json};

use crate::common::{api, http_request, start_default};

const BIN: &str = env!("CARGO_BIN_EXE_canopy");

fn official_schema() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/js/node_modules/@asyncapi/specs/schemas/3.0.0.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{} is missing ({e}): run scripts/test-all.sh, which installs tests/js",
            path.display()
        )
    });
    serde_json::from_str(&text).expect("the AsyncAPI schema is JSON")
}

fn assert_valid_asyncapi(document: &Value) {
    let validator =
        jsonschema::validator_for(&official_schema()).expect("the AsyncAPI schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(document)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "not valid AsyncAPI 3.0: {errors:#?}\n{document:#}"
    );
}

#[tokio::test]
async fn bound_patterns_are_channels_of_a_valid_asyncapi_document() {
    let server = start_default().await;
    let client = async_nats::connect(server.native_addr.to_string())
        .await
        .expect("connect");
    let temp = json!({
        "type": "object",
        "properties": {"temp": {"type": "number"}, "unit": {"enum": ["C", "F"]}},
        "required": ["temp"]
    });
    let events = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "dependentRequired": {"kind": ["at"]},
        "properties": {"kind": {"type": "string"}}
    });
    for (pattern, schema) in [("devices.*.temp", temp.clone()), ("events.>", events)] {
        let (status, answer) = api(
            &client,
            "schema.put",
            json!({"pattern": pattern, "schema": schema}),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
    }

    let http = server.http_addr.expect("http");
    let (status, body) = http_request(http, "GET", "/api/asyncapi", &[], "").await;
    assert_eq!(status, 200, "{body}");
    let document: Value = serde_json::from_str(&body).expect("JSON");
    assert_valid_asyncapi(&document);
    assert_eq!(document["asyncapi"], "3.0.0");
    let channel = &document["channels"]["devices_any_temp"];
    assert_eq!(channel["address"], "devices.{token2}.temp");
    assert_eq!(channel["x-canopy-mqtt-topic"], "devices/{token2}/temp");
    assert!(channel["parameters"]["token2"].is_object(), "{channel}");
    assert_eq!(channel["messages"]["devices_any_temp"]["payload"], temp);
    assert_eq!(
        document["channels"]["events_rest"]["address"],
        "events.{rest}"
    );
    for op in [
        "send_devices_any_temp",
        "receive_devices_any_temp",
        "send_events_rest",
    ] {
        assert!(
            document["operations"][op].is_object(),
            "no {op}: {document}"
        );
    }
    assert_eq!(
        document["servers"]["nats"]["host"],
        server.native_addr.to_string()
    );
    assert_eq!(document["servers"]["ws"]["pathname"], "/ws");
    // The official schema does see into operations and channels: AsyncAPI 2's verbs
    // and a channel without its messages' shape are refused.
    let validator =
        jsonschema::validator_for(&official_schema()).expect("the AsyncAPI schema compiles");
    let mut broken = document.clone();
    broken["operations"]["send_devices_any_temp"]["action"] = json!("publish");
    assert!(!validator.is_valid(&broken));
    let mut broken = document.clone();
    broken["channels"]["devices_any_temp"]["messages"] = json!(["not", "a", "map"]);
    assert!(!validator.is_valid(&broken));

    // The CLI prints the same document.
    let output = tokio::process::Command::new(BIN)
        .args(["asyncapi", "--server", &server.native_addr.to_string()])
        .output()
        .await
        .expect("canopy runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(printed, document);

    // Unbinding removes the channel; the document stays valid.
    let (status, _) = api(&client, "schema.delete", json!({"pattern": "events.>"})).await;
    assert_eq!(status, 200);
    let (_, body) = http_request(http, "GET", "/api/asyncapi", &[], "").await;
    let document: Value = serde_json::from_str(&body).expect("JSON");
    assert_valid_asyncapi(&document);
    assert!(
        document["channels"].get("events_rest").is_none(),
        "{document}"
    );
    assert!(document["operations"].get("send_events_rest").is_none());
}

#[tokio::test]
async fn a_document_without_bindings_is_valid_and_another_tenant_is_an_admins() {
    let server = start_default().await;
    let http = server.http_addr.expect("http");
    let (status, body) = http_request(http, "GET", "/api/asyncapi", &[], "").await;
    assert_eq!(status, 200, "{body}");
    let document: Value = serde_json::from_str(&body).expect("JSON");
    assert_valid_asyncapi(&document);
    assert_eq!(document["channels"], json!({}));
    let (status, body) = http_request(http, "GET", "/api/asyncapi?tenant=nobody", &[], "").await;
    assert_eq!(status, 404, "{body}");
}

/// A user with narrow rules sees in the document exactly the bindings `schema list`
/// shows it: its own team's, never another team's channels, schemas or regular
/// expressions, whether read over `$CANOPY.asyncapi` or `GET /api/asyncapi`.
#[tokio::test]
async fn a_user_sees_only_the_channels_schema_list_shows_it() {
    let team_a = json!({
        "publish": {"allow": ["team-a.>", "$CANOPY.schema.>", "$CANOPY.asyncapi"]},
        "subscribe": {"allow": ["team-a.>", "_INBOX.>"]}
    });
    let logins = crate::logins::Logins::start(
        &["teams"],
        &[("teams", "ops", None), ("teams", "ann", Some(team_a))],
    )
    .await;
    let ops = logins.native("ops@teams").await;
    let ann = logins.native("ann@teams").await;
    for (pattern, schema) in [
        (
            "team-a.*",
            json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
        ),
        (
            "team-b.*",
            json!({"type": "object", "properties": {"key": {"pattern": "^secret-[0-9]+$"}}}),
        ),
        ("team-b-audit.>", json!({"type": "object"})),
    ] {
        let (status, answer) = api(
            &ops,
            "schema.put",
            json!({"pattern": pattern, "schema": schema}),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
    }

    let (status, list) = api(&ann, "schema.list", json!({})).await;
    assert_eq!(status, 200, "{list}");
    let listed: Vec<&str> = list["schemas"]
        .as_array()
        .expect("schemas")
        .iter()
        .filter_map(|b| b["pattern"].as_str())
        .collect();
    assert_eq!(listed, ["team-a.*"], "{list}");

    let (status, over_nats) = api(&ann, "asyncapi", json!({})).await;
    assert_eq!(status, 200, "{over_nats}");
    let bearer = format!("Bearer {}", logins.token("ann@teams"));
    let (status, body) = http_request(
        logins.http_addr(),
        "GET",
        "/api/asyncapi",
        &[("Authorization", bearer.as_str())],
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let over_http: Value = serde_json::from_str(&body).expect("JSON");
    for document in [&over_nats, &over_http] {
        assert_valid_asyncapi(document);
        let channels: Vec<&str> = document["channels"]
            .as_object()
            .expect("channels")
            .values()
            .filter_map(|c| c["x-canopy-pattern"].as_str())
            .collect();
        assert_eq!(channels, listed, "{document}");
        let text = document.to_string();
        for hidden in ["team-b", "secret-"] {
            assert!(!text.contains(hidden), "`{hidden}` shown: {document}");
        }
    }
    // The tenant's other users see every binding, as their list does.
    let (_, all) = api(&ops, "asyncapi", json!({})).await;
    assert_eq!(
        all["channels"].as_object().map(|c| c.len()),
        Some(3),
        "{all}"
    );
    logins.server.stop().await;
}

//! Issue 30: declared JetStream streams keep tenants and rights sealed. A stream is
//! its tenant's alone (another tenant neither sees it nor collides with it), and a
//! user's rights on subjects hold for the same subjects reached through a stream:
//! declaring, changing, deleting or purging one needs a purge's rights on each of its
//! filters (and, to change one, on the filters it has), and a stream whose filters the
//! caller may not read is not there for it, whatever the call.

use serde_json::{Value, json};

use crate::common::test_config;
use crate::group_rights::js;
use crate::logins::Logins;

/// A server where Dave and Erin (tenant `default`) own `dave.>` and `erin.>`, and
/// Olga, of tenant `other`, owns `dave.>` there; with each one's native client.
pub(crate) async fn dave_erin_and_olga() -> (Logins, [async_nats::Client; 3]) {
    let users = [
        ("default", "dave", Some(own("dave"))),
        ("default", "erin", Some(own("erin"))),
        ("other", "olga", Some(own("dave"))),
    ];
    let logins = Logins::start_with(test_config(), &["other"], &users).await;
    let dave = logins.native("dave@default").await;
    let erin = logins.native("erin@default").await;
    let olga = logins.native("olga@other").await;
    (logins, [dave, erin, olga])
}

/// The rules of a user who owns `<name>.>` and may call JetStream's API and bind
/// plugins.
fn own(name: &str) -> Value {
    json!({
        "publish": {"allow": [format!("{name}.>"), "$JS.API.>", "$JS.ACK.>", "$CANOPY.plugin.>"]},
        "subscribe": {"allow": [format!("{name}.>")]}
    })
}

fn error_code(answer: &Value) -> (u64, u64) {
    (
        answer["error"]["code"].as_u64().unwrap_or_default(),
        answer["error"]["err_code"].as_u64().unwrap_or_default(),
    )
}

#[tokio::test]
async fn a_stream_is_its_tenants_and_its_subjects_rights_hold_through_it() {
    let (logins, [dave, erin, olga]) = dave_erin_and_olga().await;

    let created = js(&dave, "STREAM.CREATE.DAVE", json!({"subjects": ["dave.>"]})).await;
    assert_eq!(
        created["config"]["subjects"],
        json!(["dave.>"]),
        "{created}"
    );

    // Erin may not publish under dave.>: she cannot declare a stream over it, nor see,
    // purge or delete Dave's.
    let stolen = js(
        &erin,
        "STREAM.CREATE.MINE",
        json!({"subjects": ["dave.x.>"]}),
    )
    .await;
    assert_eq!(error_code(&stolen).0, 403, "{stolen}");
    let names = js(&erin, "STREAM.NAMES", json!({})).await;
    assert_eq!(names["streams"], json!(["default"]), "{names}");
    for call in [
        "STREAM.INFO.DAVE",
        "STREAM.PURGE.DAVE",
        "STREAM.DELETE.DAVE",
    ] {
        let hidden = js(&erin, call, json!({})).await;
        assert_eq!(error_code(&hidden), (404, 10059), "{call}: {hidden}");
    }
    let consumer = js(
        &erin,
        "CONSUMER.DURABLE.CREATE.DAVE.peek",
        json!({"stream_name": "DAVE", "config": {"durable_name": "peek", "ack_policy": "explicit"}}),
    )
    .await;
    assert_eq!(error_code(&consumer), (404, 10059), "{consumer}");
    // Nor can she change it into one she owns.
    let taken = js(
        &erin,
        "STREAM.UPDATE.DAVE",
        json!({"subjects": ["erin.x.>"]}),
    )
    .await;
    assert_eq!(error_code(&taken), (404, 10059), "{taken}");
    let still = js(&dave, "STREAM.INFO.DAVE", json!({})).await;
    assert_eq!(still["config"]["subjects"], json!(["dave.>"]), "{still}");
    let her_own = js(&erin, "STREAM.CREATE.ERIN", json!({"subjects": ["erin.>"]})).await;
    assert!(her_own.get("error").is_none(), "{her_own}");

    // Another tenant has streams of its own: Dave's is not there, and the same name
    // and subjects do not collide with it.
    let elsewhere = js(&olga, "STREAM.INFO.DAVE", json!({})).await;
    assert_eq!(error_code(&elsewhere), (404, 10059), "{elsewhere}");
    let same = js(&olga, "STREAM.CREATE.DAVE", json!({"subjects": ["dave.>"]})).await;
    assert!(same.get("error").is_none(), "{same}");
    let ack = olga.request("dave.a", "x".into()).await.expect("a PubAck");
    let ack: Value = serde_json::from_slice(&ack.payload).expect("JSON");
    assert_eq!(ack["stream"], "DAVE", "{ack}");
    let names = js(&dave, "STREAM.NAMES", json!({})).await;
    assert_eq!(names["streams"], json!(["DAVE", "default"]), "{names}");

    // Dave deletes his; Olga's stays.
    let deleted = js(&dave, "STREAM.DELETE.DAVE", json!({})).await;
    assert_eq!(deleted["success"], true, "{deleted}");
    let kept = js(&olga, "STREAM.INFO.DAVE", json!({})).await;
    assert_eq!(kept["state"]["messages"], 1, "{kept}");
    logins.stop().await;
}

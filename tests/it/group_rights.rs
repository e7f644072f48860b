//! Issue 26: a consumer group's management, acks and waits need the rights its
//! reading needs; its member names, metadata and timers are bounded; JetStream's
//! dead-letter prefix passes the same checks as `group.create`'s; lists page; a
//! tenant keeps a bounded number of groups.
//!
//! Every test runs a server that requires logins, with `admin@default` (no rules) and
//! users who may publish and subscribe under their own `<name>.>` only (and call the
//! group and JetStream APIs). The tenant's bound on API calls at once is lifted where
//! a test floods a bound of the groups', so that bound is the one answering.

use futures::StreamExt;
use serde_json::{Value, json};

use crate::common::{WAIT, api, publish_acked, status_of, store_request, test_config};
use crate::groups::{delivered, next};
use crate::logins::Logins;

/// The rules of a user who owns `<name>.>`.
fn own(name: &str) -> Value {
    json!({
        "publish": {"allow": [format!("{name}.>"), "$CANOPY.group.>", "$JS.API.>", "$JS.ACK.>"]},
        "subscribe": {"allow": [format!("{name}.>")]}
    })
}

/// A server with `dave` and `erin`, after `change` to its config.
async fn start(change: impl FnOnce(&mut canopy::config::Config)) -> Logins {
    let mut config = test_config();
    config.limits.tenant_api_calls = 100_000;
    change(&mut config);
    let users = [
        ("default", "dave", Some(own("dave"))),
        ("default", "erin", Some(own("erin"))),
    ];
    Logins::start_with(config, &[], &users).await
}

/// `$JS.API.<call>` with `body`; the JSON answer.
pub(crate) async fn js(client: &async_nats::Client, call: &str, body: Value) -> Value {
    let answer = tokio::time::timeout(
        WAIT,
        client.request(format!("$JS.API.{call}"), body.to_string().into()),
    )
    .await
    .unwrap_or_else(|_| panic!("{call} answered in time"))
    .unwrap_or_else(|e| panic!("{call}: {e}"));
    serde_json::from_slice(&answer.payload).unwrap_or_else(|e| panic!("{call}: not JSON: {e}"))
}

/// A JetStream consumer's create request.
fn consumer(name: &str, filter: &str, extra: Value) -> Value {
    let mut config = json!({"durable_name": name, "filter_subject": filter,
        "ack_policy": "explicit", "deliver_policy": "all"});
    if let (Some(config), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
        config.extend(extra.clone());
    }
    json!({"stream_name": "default", "config": config})
}

/// `group.create` of `name` over `pattern`: the status and the answer.
async fn create_group(client: &async_nats::Client, name: &str, pattern: &str) -> (u16, Value) {
    api(
        client,
        "group.create",
        json!({"name": name, "pattern": pattern}),
    )
    .await
}

/// `CONSUMER.DURABLE.CREATE` of `name` filtering `filter`, in the default stream.
async fn durable(client: &async_nats::Client, name: &str, filter: &str) -> Value {
    let call = format!("CONSUMER.DURABLE.CREATE.default.{name}");
    js(client, &call, consumer(name, filter, json!({}))).await
}

/// A request to `subject` with `body`; the answer.
async fn request(client: &async_nats::Client, subject: &str, body: &str) -> async_nats::Message {
    tokio::time::timeout(
        WAIT,
        client.request(subject.to_owned(), body.to_owned().into()),
    )
    .await
    .unwrap_or_else(|_| panic!("{subject} answered in time"))
    .unwrap_or_else(|e| panic!("{subject}: {e}"))
}

/// The first message of a JetStream pull of `consumer` with `body`.
async fn pull_first(
    client: &async_nats::Client,
    consumer: &str,
    body: Value,
) -> async_nats::Message {
    let inbox = client.new_inbox();
    let mut sub = client.subscribe(inbox.clone()).await.expect("subscribe");
    client
        .publish_with_reply(
            format!("$JS.API.CONSUMER.MSG.NEXT.default.{consumer}"),
            inbox,
            body.to_string().into(),
        )
        .await
        .expect("publish");
    tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("the pull is answered in time")
        .expect("subscription open")
}

fn names(list: &Value, key: &str) -> Vec<String> {
    list[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key} in {list}"))
        .iter()
        .map(|g| {
            g.get("name")
                .unwrap_or(g)
                .as_str()
                .expect("a name")
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn a_jetstream_dead_letter_prefix_passes_the_checks_group_create_makes() {
    let f = start(|_| {}).await;
    let dave = f.native("dave@default").await;
    // dave may not publish under orders.>; the rest are the server's namespaces and
    // reply inboxes.
    for (prefix, code) in [
        ("orders.injected", 403),
        ("$SYS.evil", 400),
        ("$CANOPY.evil", 400),
        ("$DLQ.schema", 400),
        ("_INBOX.victim", 400),
        ("$JS.API.evil", 400),
    ] {
        let (status, said) = api(
            &dave,
            "group.create",
            json!({"name": "dc", "pattern": "dave.>", "dead_letter": prefix}),
        )
        .await;
        assert_eq!(status, code, "group.create with {prefix}: {said}");
        let metadata = json!({"metadata": {"canopy.dead_letter": prefix}});
        let answer = js(
            &dave,
            "CONSUMER.DURABLE.CREATE.default.dc",
            consumer("dc", "dave.>", metadata),
        )
        .await;
        assert_eq!(
            answer["error"]["code"], code,
            "CONSUMER.CREATE with {prefix}: {answer}"
        );
    }
    let listed = js(&dave, "CONSUMER.NAMES.default", json!({})).await;
    assert_eq!(listed["consumers"], json!([]), "nothing refused was made");
    // Reading needs the filter's right, as group.create's pattern does.
    let theirs = durable(&dave, "dc", "orders.>").await;
    assert_eq!(theirs["error"]["code"], 403, "{theirs}");
    let mine = json!({"metadata": {"canopy.dead_letter": "dave.dead"}});
    let made = js(
        &dave,
        "CONSUMER.DURABLE.CREATE.default.dc",
        consumer("dc", "dave.>", mine),
    )
    .await;
    assert_eq!(
        made["config"]["metadata"]["canopy.dead_letter"], "dave.dead",
        "{made}"
    );
    f.server.stop().await;
}

/// The admin's group `billing` and JetStream consumer `jsbill` over `orders.>`, with
/// `orders.1` stored, and dave's own group `dg` over `dave.>`; the admin and dave.
async fn theirs_and_daves() -> (Logins, async_nats::Client, async_nats::Client) {
    let f = start(|_| {}).await;
    let admin = f.native("admin@default").await;
    let dave = f.native("dave@default").await;
    let (status, made) = api(
        &admin,
        "group.create",
        json!({"name": "billing", "pattern": "orders.>", "start": "all"}),
    )
    .await;
    assert_eq!(status, 200, "{made}");
    let made = durable(&admin, "jsbill", "orders.>").await;
    assert!(made.get("error").is_none(), "{made}");
    let (status, _) = create_group(&dave, "dg", "dave.>").await;
    assert_eq!(status, 200);
    publish_acked(&admin, "orders.1", "secret order").await;
    (f, admin, dave)
}

#[tokio::test]
async fn showing_and_deleting_a_group_need_the_right_to_read_it() {
    let (f, admin, dave) = theirs_and_daves().await;
    // Refused without telling the pattern, hidden from the list.
    for (op, body) in [
        ("group.info", json!({"name": "billing"})),
        ("group.delete", json!({"name": "billing"})),
        ("group.next", json!({"group": "billing"})),
    ] {
        let (status, said) = api(&dave, op, body).await;
        assert_eq!(status, 403, "{op}: {said}");
        assert!(!said.to_string().contains("orders"), "{op}: {said}");
    }
    let (_, listed) = api(&dave, "group.list", json!({})).await;
    assert_eq!(names(&listed, "groups"), ["dg"]);
    let (_, listed) = api(&admin, "group.list", json!({})).await;
    assert_eq!(names(&listed, "groups"), ["billing", "dg", "jsbill"]);
    f.server.stop().await;
}

#[tokio::test]
async fn showing_and_deleting_a_jetstream_consumer_need_the_right_to_read_it() {
    let (f, admin, dave) = theirs_and_daves().await;
    for call in [
        "CONSUMER.INFO.default.jsbill",
        "CONSUMER.DELETE.default.jsbill",
    ] {
        let said = js(&dave, call, json!({})).await;
        assert_eq!(said["error"]["code"], 403, "{call}: {said}");
        assert!(!said.to_string().contains("orders"), "{call}: {said}");
    }
    let info = js(&admin, "CONSUMER.INFO.default.jsbill", json!({})).await;
    assert_eq!(info["name"], "jsbill", "still there: {info}");
    let listed = js(&dave, "CONSUMER.NAMES.default", json!({})).await;
    assert_eq!(
        (&listed["consumers"], &listed["total"]),
        (&json!(["dg"]), &json!(1))
    );
    let listed = js(&dave, "CONSUMER.LIST.default", json!({})).await;
    assert_eq!(listed["total"], 1, "{listed}");
    f.server.stop().await;
}

#[tokio::test]
async fn acking_another_users_delivery_needs_the_right_to_read_its_group() {
    let (f, admin, dave) = theirs_and_daves().await;
    // Canopy's acks: a nak without a reply never reaches the group, a term with one
    // is refused, and the admin's own ack then goes through.
    let got = next(&admin, json!({"group": "billing", "member": "a"})).await;
    assert_eq!(delivered(&got), [("orders.1".into(), 1, 1)]);
    let ack = got[0].reply.clone().expect("an ack subject");
    dave.publish(ack.to_string(), "-NAK {\"delay\": 3600000000000}".into())
        .await
        .expect("publish");
    let term = request(&dave, &ack, "+TERM").await;
    assert_eq!(status_of(&term), 403, "{:?}", term.payload);
    let acked = request(&admin, &ack, "+ACK").await;
    assert_eq!(status_of(&acked), 200, "{:?}", acked.payload);
    // JetStream's the same.
    let body = json!({"batch": 1, "expires": 5_000_000_000u64});
    let delivery = pull_first(&admin, "jsbill", body).await;
    let ack = delivery.reply.clone().expect("a $JS.ACK reply");
    dave.publish(ack.to_string(), "-NAK".into())
        .await
        .expect("publish");
    let term = request(&dave, &ack, "+TERM").await;
    assert_eq!(status_of(&term), 403, "{:?}", term.payload);
    let acked = request(&admin, &ack, "+ACK").await;
    assert_eq!(status_of(&acked), 200, "{:?}", acked.payload);
    f.server.stop().await;
}

#[tokio::test]
async fn a_wait_for_a_group_the_caller_may_not_read_is_one_for_no_group() {
    let (f, _admin, dave) = theirs_and_daves().await;
    let wait =
        |group: &str| json!({"group": group, "subject": "dave.x", "version": 1, "timeout_ms": 100});
    let (hidden, said) = api(&dave, "group.wait", wait("billing")).await;
    let (missing, _) = api(&dave, "group.wait", wait("nosuch")).await;
    assert_eq!((hidden, missing), (404, 404), "{said}");
    assert!(said.to_string().contains("no such group"), "{said}");
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Canopy-Await", "billing,nosuch");
    let awaited = store_request(&dave, "dave.x", headers, "x").await;
    assert_eq!(
        awaited["await"]["pending"],
        json!([{"group": "billing", "reason": "no such group"},
               {"group": "nosuch", "reason": "no such group"}]),
        "{awaited}"
    );
    f.server.stop().await;
}

#[tokio::test]
async fn a_member_name_past_its_bound_is_refused() {
    let f = start(|_| {}).await;
    let dave = f.native("dave@default").await;
    let (status, _) = create_group(&dave, "dg", "dave.>").await;
    assert_eq!(status, 200);
    let pull = |member: String| json!({"group": "dg", "member": member}).to_string();
    for member in ["m".repeat(257), "a\u{7}b".into()] {
        let answer = request(&dave, "$CANOPY.group.next", &pull(member)).await;
        let said = String::from_utf8_lossy(&answer.payload);
        assert_eq!(status_of(&answer), 400, "{said}");
        assert!(said.contains("256 bytes"), "{said}");
    }
    // At the bound, a pull is answered (with nothing: it did not wait).
    let at_bound = json!({"group": "dg", "member": "m".repeat(256)});
    assert!(next(&dave, at_bound).await.is_empty());
    f.server.stop().await;
}

/// Sends `count` Canopy pulls of group `dg` that wait a minute, from `client`, with
/// answers to one inbox; returns its subscription.
async fn waiting_pulls(client: &async_nats::Client, count: usize) -> async_nats::Subscriber {
    let inbox = client.new_inbox();
    let sub = client
        .subscribe(format!("{inbox}.*"))
        .await
        .expect("subscribe");
    for n in 0..count {
        let body = json!({"group": "dg", "member": "w", "wait_ms": 60_000});
        client
            .publish_with_reply(
                "$CANOPY.group.next",
                format!("{inbox}.{n}"),
                body.to_string().into(),
            )
            .await
            .expect("publish");
    }
    client.flush().await.expect("flush");
    sub
}

/// The first answer on `sub`, which must be a refusal with `code` saying `says`.
async fn refused(sub: &mut async_nats::Subscriber, code: u16, says: &str) {
    let answer = tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("a pull past the bound is answered at once")
        .expect("subscription open");
    let text = String::from_utf8_lossy(&answer.payload);
    assert_eq!(status_of(&answer), code, "{text}");
    assert!(text.contains(says), "{text}");
}

#[tokio::test]
async fn waiting_pulls_are_bounded_per_connection_and_per_group() {
    let f = start(|_| {}).await;
    let dave = f.native("dave@default").await;
    let (status, _) = create_group(&dave, "dg", "dave.>").await;
    assert_eq!(status, 200);
    // One connection: 512 pulls wait, one more is refused (whichever the server
    // counted last).
    let mut first = waiting_pulls(&dave, 513).await;
    refused(&mut first, 429, "this connection has 512 pulls waiting").await;
    // Another connection fills the group's list; once the group holds 1,024, a third
    // connection's pull is refused by the group.
    let other = f.native("dave@default").await;
    let _second = waiting_pulls(&other, 512).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (_, info) = api(&dave, "group.info", json!({"name": "dg"})).await;
        if info["live"]["waiting_pulls"] == 1_024 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pulls never all waited: {info}"
        );
        tokio::task::yield_now().await;
    }
    let third = f.native("dave@default").await;
    let mut last = waiting_pulls(&third, 1).await;
    refused(&mut last, 429, "1024 pulls waiting").await;
    f.server.stop().await;
}

#[tokio::test]
async fn jetstream_pull_terms_and_consumer_configs_have_floors_and_bounds() {
    let f = start(|_| {}).await;
    let dave = f.native("dave@default").await;
    let made = durable(&dave, "dc", "dave.>").await;
    assert!(made.get("error").is_none(), "{made}");
    // A 1 ns heartbeat (the issue's) and one without expires are refused at once, as
    // nats-server words it, instead of a stream of heartbeats.
    for (body, says) in [
        (
            json!({"batch": 1, "expires": 1_000_000_000u64, "idle_heartbeat": 1}),
            "at least 100ms",
        ),
        (
            json!({"batch": 1, "idle_heartbeat": 200_000_000u64}),
            "heartbeat value too large",
        ),
    ] {
        let answer = pull_first(&dave, "dc", body.clone()).await;
        assert_eq!(
            answer.status.map(|s| s.as_u16()),
            Some(400),
            "{body}: {answer:?}"
        );
        let description = answer.description.clone().unwrap_or_default();
        assert!(description.contains(says), "{body}: {description}");
    }
    // Configs: an ack wait under 100 ms, a backoff, an oversized description.
    for (extra, says) in [
        (json!({"ack_wait": 1_000_000}), "ack_wait"),
        (json!({"backoff": [1_000_000]}), "backoff"),
        (
            json!({"description": "d".repeat(4_097)}),
            "description is too long",
        ),
    ] {
        let answer = js(
            &dave,
            "CONSUMER.DURABLE.CREATE.default.dd",
            consumer("dd", "dave.>", extra.clone()),
        )
        .await;
        let description = answer["error"]["description"].as_str().unwrap_or_default();
        assert!(description.contains(says), "{extra}: {answer}");
    }
    let (status, said) = api(
        &dave,
        "group.create",
        json!({"name": "dd", "pattern": "dave.>", "ack_wait_ms": 1}),
    )
    .await;
    assert_eq!(status, 400, "{said}");
    f.server.stop().await;
}

#[tokio::test]
async fn consumer_and_group_lists_page_within_the_payload_limit() {
    const GROUPS: usize = 300;
    const MAX_PAYLOAD: usize = 64 * 1_024;
    let f = start(|config| config.native.max_payload = MAX_PAYLOAD).await;
    let admin = f.native("admin@default").await;
    for n in 0..GROUPS {
        let (status, said) = api(
            &admin,
            "group.create",
            json!({"name": format!("g{n:03}"), "pattern": format!("orders.{n}.>")}),
        )
        .await;
        assert_eq!(status, 200, "{said}");
    }
    // JetStream's own paging: `offset` in, `total`, `offset` and `limit` out; a page
    // never larger than the payload limit.
    for (call, limit) in [
        ("CONSUMER.NAMES.default", 1_024),
        ("CONSUMER.LIST.default", 256),
    ] {
        let mut seen = Vec::new();
        while seen.len() < GROUPS {
            let answer = request(
                &admin,
                &format!("$JS.API.{call}"),
                &json!({"offset": seen.len()}).to_string(),
            )
            .await;
            assert!(
                answer.payload.len() <= MAX_PAYLOAD,
                "{call}: {} bytes",
                answer.payload.len()
            );
            let page: Value = serde_json::from_slice(&answer.payload).expect("JSON");
            assert_eq!(
                (&page["total"], &page["offset"], &page["limit"]),
                (&json!(GROUPS), &json!(seen.len()), &json!(limit)),
                "{call}"
            );
            let got = names(&page, "consumers");
            assert!(
                !got.is_empty() && got.len() <= limit,
                "{call}: {}",
                got.len()
            );
            seen.extend(got);
        }
        let expected: Vec<String> = (0..GROUPS).map(|n| format!("g{n:03}")).collect();
        assert_eq!(seen, expected, "{call}");
    }
    let first = js(&admin, "CONSUMER.LIST.default", json!({})).await;
    assert!(
        names(&first, "consumers").len() < GROUPS,
        "a page, not everything"
    );
    // async-nats follows the pages.
    let stream = async_nats::jetstream::new(admin.clone())
        .get_stream("default")
        .await
        .expect("the tenant's stream");
    let listed: Vec<_> = stream.consumer_names().collect().await;
    assert_eq!(listed.len(), GROUPS);
    // group.list pages the same way.
    let (_, page) = api(&admin, "group.list", json!({})).await;
    assert_eq!(
        (&page["total"], &page["limit"]),
        (&json!(GROUPS), &json!(256))
    );
    let first = names(&page, "groups").len();
    let (_, rest) = api(&admin, "group.list", json!({"offset": first})).await;
    assert_eq!(first + names(&rest, "groups").len(), GROUPS);
    f.server.stop().await;
}

#[tokio::test]
async fn a_tenant_keeps_at_most_its_number_of_groups() {
    let f = start(|config| config.limits.tenant_groups = 3).await;
    let dave = f.native("dave@default").await;
    for name in ["a", "b"] {
        let (status, said) = create_group(&dave, name, "dave.>").await;
        assert_eq!(status, 200, "{said}");
    }
    let made = durable(&dave, "c", "dave.>").await;
    assert!(made.get("error").is_none(), "{made}");
    let (status, said) = create_group(&dave, "d", "dave.>").await;
    assert_eq!(status, 429, "{said}");
    let refused = durable(&dave, "d", "dave.>").await;
    assert_eq!(refused["error"]["err_code"], 10026, "{refused}");
    // A create of one there already is still answered; a delete makes room.
    let again = durable(&dave, "c", "dave.>").await;
    assert!(again.get("error").is_none(), "{again}");
    let (status, _) = api(&dave, "group.delete", json!({"name": "a"})).await;
    assert_eq!(status, 200);
    let (status, said) = create_group(&dave, "d", "dave.>").await;
    assert_eq!(status, 200, "{said}");
    f.server.stop().await;
}

#[tokio::test]
async fn one_user_cannot_take_every_wait_place_of_its_tenant() {
    let f = start(|_| {}).await;
    let dave = f.native("dave@default").await;
    let (status, _) = create_group(&dave, "dg", "dave.>").await;
    assert_eq!(status, 200);
    // A member, so waits wait rather than being told the group has none.
    assert!(
        next(&dave, json!({"group": "dg", "member": "w"}))
            .await
            .is_empty()
    );
    // 1,000 waits for a version that never comes hold dave's places; one more is
    // refused (whichever the server counted last).
    let inbox = dave.new_inbox();
    let mut answers = dave
        .subscribe(format!("{inbox}.*"))
        .await
        .expect("subscribe");
    for n in 0..=1_000 {
        let body = json!({"group": "dg", "subject": "dave.x", "version": 1_000_000_000_000_000u64,
                          "timeout_ms": 60_000});
        dave.publish_with_reply(
            "$CANOPY.group.wait",
            format!("{inbox}.{n}"),
            body.to_string().into(),
        )
        .await
        .expect("publish");
    }
    dave.flush().await.expect("flush");
    let answer = tokio::time::timeout(WAIT, answers.next())
        .await
        .expect("the wait past dave's places is answered at once")
        .expect("subscription open");
    assert_eq!(status_of(&answer), 429, "{:?}", answer.payload);
    // Erin's publish waiting for her group is still served.
    let erin = f.native("erin@default").await;
    let (status, _) = api(
        &erin,
        "group.create",
        json!({"name": "eg", "pattern": "erin.>", "start": "all"}),
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        next(&erin, json!({"group": "eg", "member": "w"}))
            .await
            .is_empty()
    );
    let waiting = tokio::spawn({
        let erin = erin.clone();
        async move {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Canopy-Await", "eg");
            store_request(&erin, "erin.1", headers, "x").await
        }
    });
    let got = next(
        &erin,
        json!({"group": "eg", "member": "w", "wait_ms": 5_000}),
    )
    .await;
    assert_eq!(delivered(&got), [("erin.1".into(), 1, 1)]);
    crate::groups::reply(&erin, &got[0], "+ACK").await;
    let ack = tokio::time::timeout(WAIT, waiting)
        .await
        .expect("acked")
        .expect("task");
    assert_eq!(ack["await"]["passed"], json!(["eg"]), "{ack}");
    f.server.stop().await;
}

//! One table of publish refusals (SPEC.md, issue 13): each row is a publish the
//! server refuses (or, for the control row, takes), each column a front end (native,
//! MQTT 5, MQTT 3.1.1, `/ws`), each cell the answer that protocol gives per SPEC.md's
//! table. One loop runs every cell; a cell also checks that the refused message
//! reached no subscriber and, when the answer keeps the connection, that an ordinary
//! publish on the same connection is still delivered. Failing cells are collected and
//! reported together, so one run shows all the drift between front ends.
//!
//! Every cell runs in a tenant of its own (quotas and rules are per tenant), all cells
//! at once, on one server.

use futures::future::join_all;
use serde_json::{Value, json};

use crate::common::{start, test_config};
use crate::frontends::{
    Addrs, Answer, FrontEnd, Message, Native, NativeEvent, Publisher, Want, pub_frame,
    tenant_with_users,
};

const MAX_PAYLOAD: usize = 4096;
const MAX_PACKET: usize = 8192;
const MAX_SUBJECT_LEN: usize = 64;
const MAX_TOKENS: usize = 8;

/// The subject every cell's ordinary publish after the refusal goes to.
const AFTER: &str = "ok.after";

/// What a row publishes first, on the same connection.
#[derive(Clone, Copy)]
enum Prepare {
    Nothing,
    /// One ordinary message, which uses up the second's burst of a 1 msg/s quota.
    WarmUp,
    /// The row's subject at version 1, so that expecting version 0 is stale.
    FirstVersion,
    /// A JSON Schema bound to `ok.typed.*` (a number `t`, required) in the cell's tenant.
    Schema,
}

struct Row {
    name: &'static str,
    limits: Value,
    /// The publishing user's permissions (`None`: no rules).
    rules: Option<Value>,
    prepare: Prepare,
    message: Message,
    /// A subscriber can watch the row's subject (it is a valid, non-API subject).
    observable: bool,
    /// The answer per front end, in [`FrontEnd::ALL`] order.
    want: [Want; 4],
}

fn message(subject: &str, topic: &str) -> Message {
    Message {
        subject: subject.to_owned(),
        topic: topic.to_owned(),
        payload: b"the row's message".to_vec(),
        ..Message::default()
    }
}

fn sized(subject: &str, len: usize) -> Message {
    Message {
        payload: vec![b'x'; len],
        ..message(subject, &subject.replace('.', "/"))
    }
}

fn rows() -> Vec<Row> {
    let too_long = format!("long.{}", "x".repeat(MAX_SUBJECT_LEN + 1 - "long.".len()));
    let too_deep = (0..=MAX_TOKENS)
        .map(|i| format!("d{i}"))
        .collect::<Vec<_>>()
        .join(".");
    let invalid = || {
        [
            Want::err("Invalid Publish Subject"),
            Want::puback(0x90),
            Want::Closed,
            Want::WsError("invalid_subject"),
        ]
    };
    let reserved = |subject: &str| {
        [
            Want::denied(subject),
            Want::puback(0x87),
            Want::Closed,
            Want::WsError("forbidden"),
        ]
    };
    let row = |name, message, observable, want| Row {
        name,
        limits: json!({}),
        rules: None,
        prepare: Prepare::Nothing,
        message,
        observable,
        want,
    };
    vec![
        row(
            "invalid subject (syntax)",
            message("bad..subject", "bad/%2E/subject"),
            false,
            invalid(),
        ),
        row(
            "invalid subject (over limits.max_subject_len)",
            message(&too_long, &too_long.replace('.', "/")),
            false,
            invalid(),
        ),
        row(
            "invalid subject (over limits.max_subject_tokens)",
            message(&too_deep, &too_deep.replace('.', "/")),
            false,
            invalid(),
        ),
        row(
            "reserved subject $SYS.x",
            message("$SYS.x", "$SYS/x"),
            true,
            reserved("$SYS.x"),
        ),
        row(
            "reserved subject $CANOPY.x as a message",
            message("$CANOPY.x", "$CANOPY/x"),
            false,
            [
                Want::Skip("on the native protocol $CANOPY.<op> is an API call"),
                Want::puback(0x87),
                Want::Closed,
                Want::WsError("forbidden"),
            ],
        ),
        row(
            "reserved subject $JS.x",
            message("$JS.x", "$JS/x"),
            true,
            reserved("$JS.x"),
        ),
        row(
            "reserved subject $DLQ.x",
            message("$DLQ.x", "$DLQ/x"),
            true,
            reserved("$DLQ.x"),
        ),
        row(
            "an ordinary $-subject ($foo.bar) is taken",
            message("$foo.bar", "$foo/bar"),
            true,
            [Want::Taken, Want::Taken, Want::Taken, Want::Taken],
        ),
        Row {
            rules: Some(json!({"publish": {"allow": ["ok.>"]}})),
            ..row(
                "denied by the user's rules (publish allow ok.>)",
                message("no.x", "no/x"),
                true,
                reserved("no.x"),
            )
        },
        Row {
            limits: json!({"max_publish_msgs_per_sec": 1}),
            prepare: Prepare::WarmUp,
            ..row(
                "over the tenant's msgs/s quota",
                message("ok.rate", "ok/rate"),
                true,
                [
                    Want::err_prefix("Quota Exceeded: "),
                    Want::puback(0x97),
                    // MQTT 3.1.1 cannot refuse: taken, the connection held back.
                    Want::Taken,
                    Want::WsError("quota_exceeded"),
                ],
            )
        },
        Row {
            limits: json!({"max_stored_bytes": 1000}),
            ..row(
                "over the tenant's stored bytes (an acked publish)",
                Message {
                    ack: true,
                    ..sized("ok.big", 1500)
                },
                true,
                [
                    Want::NatsErrorAck(10047),
                    Want::puback(0x97),
                    Want::Closed,
                    Want::WsError("quota_exceeded"),
                ],
            )
        },
        row(
            "too large (max_payload + 1)",
            sized("ok.large", MAX_PAYLOAD + 1),
            true,
            [
                Want::err_closes("Maximum Payload Violation"),
                Want::PubAck {
                    code: 0x83,
                    why: true,
                    property: None,
                },
                Want::Closed,
                Want::WsError("too_large"),
            ],
        ),
        row(
            "too large (over MQTT's Maximum Packet Size too)",
            sized("ok.huge", MAX_PACKET + 100),
            true,
            [
                Want::err_closes("Maximum Payload Violation"),
                Want::Disconnect(0x95),
                Want::Closed,
                Want::WsError("too_large"),
            ],
        ),
        Row {
            prepare: Prepare::Schema,
            ..row(
                "invalid under the schema bound to its subject",
                Message {
                    payload: br#"{"t": "warm"}"#.to_vec(),
                    ..message("ok.typed.x", "ok/typed/x")
                },
                true,
                [
                    Want::err_prefix(
                        "Permissions Violation for Publish to \"ok.typed.x\": the message does \
                         not match schema ok.typed.*@1 at /t: ",
                    ),
                    Want::PubAck {
                        code: 0x99,
                        why: true,
                        property: None,
                    },
                    // MQTT 3.1.1 cannot refuse, and closing brings the message back.
                    Want::Dropped,
                    Want::WsError("invalid_message"),
                ],
            )
        },
        Row {
            prepare: Prepare::FirstVersion,
            ..row(
                "conflict (expected version 0, the subject is at 1)",
                Message {
                    expect_version: Some(0),
                    ..message("ok.cf", "ok/cf")
                },
                true,
                [
                    Want::NatsErrorAck(10071),
                    Want::PubAck {
                        code: 0x83,
                        why: false,
                        property: Some(("Canopy-Current-Version", "1")),
                    },
                    Want::Skip("MQTT 3.1.1 has no way to expect a version"),
                    Want::WsError("conflict"),
                ],
            )
        },
    ]
}

/// Runs one cell; returns what differs from SPEC.md (empty: the cell passes).
async fn run_cell(
    addrs: Addrs,
    admin: &async_nats::Client,
    index: usize,
    row: &Row,
    front_end: FrontEnd,
    want: &Want,
) -> Vec<String> {
    let tenant = format!("r{index:02}-{}", front_end.key());
    let tokens = tenant_with_users(
        admin,
        &tenant,
        row.limits.clone(),
        &[("pub", row.rules.clone()), ("obs", None)],
    )
    .await;
    let mut problems = Vec::new();
    let mut observer = match Native::connect(addrs.native, Some(&tokens[1])).await {
        Ok(observer) => observer,
        Err(e) => return vec![format!("the observer cannot connect: {e}")],
    };
    if row.observable
        && let Err(e) = observer.subscribe(&row.message.subject, "row").await
    {
        problems.push(format!("the observer cannot watch the row's subject: {e}"));
    }
    if let Err(e) = observer.subscribe(AFTER, "after").await {
        return vec![format!("the observer cannot watch {AFTER}: {e}")];
    }
    let client_id = format!("{tenant}-pub");
    let mut publisher =
        match Publisher::open(front_end, addrs, Some(&tokens[0]), &client_id, 1 << 20).await {
            Ok(publisher) => publisher,
            Err(e) => return vec![format!("the publisher cannot connect: {e}")],
        };
    if let Prepare::Schema = row.prepare {
        let owner = match async_nats::ConnectOptions::with_token(tokens[1].clone())
            .connect(addrs.native.to_string())
            .await
        {
            Ok(owner) => owner,
            Err(e) => return vec![format!("the schema's owner cannot connect: {e}")],
        };
        let schema =
            json!({"type": "object", "properties": {"t": {"type": "number"}}, "required": ["t"]});
        let (status, body) = crate::common::api(
            &owner,
            "schema.put",
            json!({"pattern": "ok.typed.*", "schema": schema}),
        )
        .await;
        if status != 200 {
            return vec![format!("the schema was not bound: {body}")];
        }
    }
    let first = match row.prepare {
        Prepare::Nothing | Prepare::Schema => None,
        Prepare::WarmUp => Some(Message::plain("ok.warm", b"warm-up")),
        Prepare::FirstVersion => Some(Message {
            expect_version: Some(0),
            payload: b"version 1".to_vec(),
            ..row.message.clone()
        }),
    };
    if let Some(first) = first {
        let answer = publisher.publish(&first).await;
        if !matches!(answer, Answer::Taken { .. }) {
            return vec![format!(
                "the row's first, ordinary publish was not taken: {answer}"
            )];
        }
    }

    let answer = publisher.publish(&row.message).await;
    problems.extend(want.check(&answer));

    if answer.left_open() {
        let after = publisher.publish(&Message::plain(AFTER, b"after")).await;
        if !matches!(after, Answer::Taken { .. }) {
            problems.push(format!(
                "after `{answer}`, an ordinary publish on the same connection: {after}"
            ));
        }
    }
    // Closed or not, something reaches the observer on AFTER: the publisher's
    // ordinary publish, or else the observer's own marker.
    let marker_needed = !answer.left_open();
    if marker_needed {
        observer
            .send(&pub_frame(AFTER, None, None, b"marker"))
            .await;
    }
    let mut delivered = false;
    loop {
        match observer.next().await {
            Some(NativeEvent::Msg(m)) if m.sid == "row" && m.payload == row.message.payload => {
                delivered = true;
            }
            Some(NativeEvent::Msg(m)) if m.sid == "after" => break,
            Some(NativeEvent::Closed(why)) => {
                problems.push(format!("the observer was closed ({why:?})"));
                break;
            }
            Some(_) => {}
            None => {
                problems.push(format!(
                    "the observer never received {AFTER} (the ordinary publish after the \
                     answer was not delivered)"
                ));
                break;
            }
        }
    }
    if want.is_refusal() && delivered {
        problems.push("the refused message was delivered to a subscriber".into());
    }
    if matches!(want, Want::Taken) && row.observable && !delivered {
        problems.push("the message was taken but not delivered to its subscriber".into());
    }
    problems
}

#[tokio::test]
async fn every_front_end_refuses_a_publish_as_its_protocol_says() {
    let mut config = test_config();
    config.authz.require_login = true;
    config.authz.bootstrap_admin_password = Some("admin-pw".into());
    config.native.max_payload = MAX_PAYLOAD;
    config.mqtt.max_packet_size = MAX_PACKET;
    config.limits.max_subject_len = MAX_SUBJECT_LEN;
    config.limits.max_subject_tokens = MAX_TOKENS;
    let server = start(config).await;
    let addrs = Addrs::of(&server);
    let admin =
        async_nats::ConnectOptions::with_user_and_password("admin".into(), "admin-pw".into())
            .connect(server.native_url())
            .await
            .expect("the bootstrap admin logs in");

    let rows = rows();
    let cells = rows.iter().enumerate().flat_map(|(index, row)| {
        FrontEnd::ALL
            .iter()
            .zip(&row.want)
            .filter(|(_, want)| !matches!(want, Want::Skip(_)))
            .map(move |(front_end, want)| (index, row, *front_end, want))
    });
    let runs = cells.map(|(index, row, front_end, want)| {
        let admin = admin.clone();
        async move {
            let problems = run_cell(addrs, &admin, index, row, front_end, want).await;
            (row.name, front_end, want, problems)
        }
    });
    let results = join_all(runs).await;

    let total = results.len();
    let mut failing = Vec::new();
    for (row, front_end, want, problems) in &results {
        if !problems.is_empty() {
            failing.push(format!(
                "[{row}] × [{}] (SPEC: {want}):\n    - {}",
                front_end.name(),
                problems.join("\n    - ")
            ));
        }
    }
    server.stop().await;
    assert!(
        failing.is_empty(),
        "{} of {total} refusal cells differ from SPEC.md:\n{}",
        failing.len(),
        failing.join("\n")
    );
}

//! Tests of the `/ws` codec: every op and its required fields, the errors, the limits, and
//! two oracles kept from the server as it was before this codec: the `Request` struct it
//! parsed requests with, and the `json!` calls and serde structs it rendered frames with.
//! Frames must equal the old ones byte for byte; requests the old parser took must decode to
//! the same fields.

use std::borrow::Cow;

use proptest::prelude::*;
use serde_json::value::RawValue;

use super::*;
use crate::native::HeaderMap;

const LIMITS: WsLimits = WsLimits {
    max_text: 4096,
    max_payload: 1024,
};

fn ok(text: &str) -> ClientOp<'_> {
    decode_client(text, &LIMITS).unwrap_or_else(|e| panic!("{text}: {e:?}"))
}

fn err(text: &str) -> WsDecodeError {
    match decode_client(text, &LIMITS) {
        Ok(op) => panic!("{text} decoded: {op:?}"),
        Err(e) => e,
    }
}

fn publish(text: &str) -> Publish<'_> {
    match ok(text) {
        ClientOp::Publish(p) => p,
        other => panic!("not a publish: {other:?}"),
    }
}

fn raw(text: &'static str) -> &'static RawValue {
    serde_json::from_str(text).unwrap()
}

fn cow(text: &str) -> Cow<'_, str> {
    Cow::Borrowed(text)
}

// ---- every op --------------------------------------------------------------------------

#[test]
fn sub_in_every_form() {
    assert_eq!(
        ok(r#"{"op":"sub","id":"s1","pattern":"devices.*.temp"}"#),
        ClientOp::Subscribe(Subscribe {
            id: Some(cow("s1")),
            pattern: cow("devices.*.temp"),
            from: None,
            from_snapshot: false,
        })
    );
    let ClientOp::Subscribe(s) = ok(r#"{"pattern":"a/+/b","op":"sub","from_offset":7}"#) else {
        panic!()
    };
    assert_eq!((s.id, s.from), (None, Some(Start::Offset(7))));
    let ClientOp::Subscribe(s) = ok(r#"{"op":"sub","pattern":"a","from_snapshot":true}"#) else {
        panic!()
    };
    assert_eq!((s.from, s.from_snapshot), (None, true));
    // Several starts: time, then offset, then version, as the server always chose.
    let ClientOp::Subscribe(s) =
        ok(r#"{"op":"sub","pattern":"a","from_version":1,"from_offset":2,"from_time_ms":3}"#)
    else {
        panic!()
    };
    assert_eq!(s.from, Some(Start::TimeMs(3)));
    let ClientOp::Subscribe(s) =
        ok(r#"{"op":"sub","pattern":"a","from_version":1,"from_offset":2}"#)
    else {
        panic!()
    };
    assert_eq!(s.from, Some(Start::Offset(2)));
}

#[test]
fn unsub_get_snapshot_get_subjects() {
    assert_eq!(
        ok(r#"{"op":"unsub","id":"u","sid":4294967295}"#),
        ClientOp::Unsubscribe(Unsubscribe {
            id: Some(cow("u")),
            sid: u32::MAX
        })
    );
    assert_eq!(
        ok(r#"{"op":"get","subject":"a.b","version":3}"#),
        ClientOp::Get(Get {
            id: None,
            subject: cow("a.b"),
            version: Some(3)
        })
    );
    assert_eq!(
        ok(r#"{"op":"snapshot.get","id":"g","subject":"a.b"}"#),
        ClientOp::SnapshotGet(SnapshotGet {
            id: Some(cow("g")),
            subject: cow("a.b"),
            version: None
        })
    );
    let ClientOp::Subjects(s) = ok(r#"{"op":"subjects"}"#) else {
        panic!()
    };
    assert_eq!(
        (&*s.pattern, s.after.as_deref(), s.page_size()),
        (">", None, DEFAULT_PAGE)
    );
    let ClientOp::Subjects(s) = ok(r#"{"op":"subjects","pattern":"a.>","after":"a.c","max":0}"#)
    else {
        panic!()
    };
    assert_eq!(
        (&*s.pattern, s.after.as_deref(), s.page_size()),
        ("a.>", Some("a.c"), 1)
    );
}

#[test]
fn replay_reads_a_subject_or_a_pattern() {
    let ClientOp::Replay(r) = ok(r#"{"op":"replay","subject":"a","from_version":2,"max":5000}"#)
    else {
        panic!()
    };
    assert_eq!(r.target, Target::Subject(cow("a")));
    assert_eq!((r.from, r.page_size()), (Some(Start::Version(2)), MAX_PAGE));
    let ClientOp::Replay(r) = ok(r#"{"op":"replay","pattern":"a.*"}"#) else {
        panic!()
    };
    assert_eq!(r.page_size(), 100);
    assert_eq!((r.target, r.from), (Target::Pattern(cow("a.*")), None));
    let e = err(r#"{"op":"replay","id":"r"}"#);
    assert_eq!(
        (e.kind, e.id.as_deref(), e.message.as_str()),
        (
            WsErrorKind::MissingOneOf {
                fields: ["subject", "pattern"]
            },
            Some("r"),
            "replay needs `subject` or `pattern`"
        )
    );
    let e = err(r#"{"op":"replay","subject":"a","pattern":"a"}"#);
    assert!(matches!(e.kind, WsErrorKind::Exclusive { .. }), "{e:?}");
}

#[test]
fn pub_with_inline_data_keeps_its_bytes_and_says_json() {
    let odd = r#"{"n": 123456789012345678901234567890,"k" :1, "s":"\u00e9\n"}"#;
    let text = format!(r#"{{"op":"pub","id":"p1","subject":"devices.7.temp","data":  {odd}  }}"#);
    let p = publish(&text);
    assert_eq!(p.data.as_bytes(), odd.as_bytes());
    assert!(p.data.is_json());
    assert_eq!(
        &p.header_block()[..],
        b"NATS/1.0\r\nContent-Type: application/json\r\n\r\n"
    );
    assert_eq!(p.size(), odd.len() + p.header_block().len());
    assert_eq!(p.clone().data.into_bytes(), odd.as_bytes());
}

#[test]
fn pub_with_base64_headers_version_and_msg_id() {
    let p = publish(
        r#"{"op":"pub","subject":"a","data_b64":" aGk= ","headers":{"B":"2","A":"1","Canopy-Msg-Id":"old"},
            "expect_version":0,"msg_id":"m1"}"#,
    );
    assert_eq!(p.data, Data::Bytes(b"hi".to_vec()));
    assert_eq!(p.expect_version, Some(0));
    assert_eq!(p.msg_id.as_deref(), Some("m1"));
    assert_eq!(
        p.headers,
        [
            (cow("B"), cow("2")),
            (cow("A"), cow("1")),
            (cow("Canopy-Msg-Id"), cow("old"))
        ]
    );
    // The request's order; expected version and msg id replace what the headers said.
    assert_eq!(
        &p.header_block()[..],
        &b"NATS/1.0\r\nB: 2\r\nA: 1\r\nCanopy-Expected-Version: 0\r\nCanopy-Msg-Id: m1\r\n\r\n"[..]
    );
    let parsed = HeaderMap::parse(p.header_block()).unwrap();
    assert!(!parsed.says_json());
}

#[test]
fn pub_headers_keep_a_given_content_type_and_the_last_of_a_repeated_name() {
    let p = publish(
        r#"{"op":"pub","subject":"a","data":1,"headers":{"A":"1","Content-Type":"text/plain","A":"2"}}"#,
    );
    assert_eq!(
        p.headers,
        [
            (cow("Content-Type"), cow("text/plain")),
            (cow("A"), cow("2"))
        ]
    );
    assert_eq!(
        &p.header_block()[..],
        b"NATS/1.0\r\nContent-Type: text/plain\r\nA: 2\r\n\r\n"
    );
    // Many headers (a set, not a scan, finds the repeat).
    let many: Vec<String> = (0..12).map(|i| format!(r#""H{}":"{i}""#, i % 10)).collect();
    let text = format!(
        r#"{{"op":"pub","subject":"a","headers":{{{}}}}}"#,
        many.join(",")
    );
    let p = publish(&text);
    let names: Vec<(&str, &str)> = p.headers.iter().map(|(n, v)| (&**n, &**v)).collect();
    assert_eq!(
        names,
        [
            ("H2", "2"),
            ("H3", "3"),
            ("H4", "4"),
            ("H5", "5"),
            ("H6", "6"),
            ("H7", "7"),
            ("H8", "8"),
            ("H9", "9"),
            ("H0", "10"),
            ("H1", "11")
        ]
    );
    let plain = publish(r#"{"op":"pub","subject":"a"}"#);
    assert_eq!(
        (plain.data.clone(), plain.header_block().len()),
        (Data::None, 0)
    );
    assert!(plain.data.is_empty());
    let null = publish(r#"{"op":"pub","subject":"a","data":null,"headers":null}"#);
    assert_eq!(null, plain);
}

#[test]
fn header_names_a_block_cannot_carry_are_refused() {
    for name in ["", "a b", "a:b", "a\\r", "a\\u007f", "\\t"] {
        let text = format!(r#"{{"op":"pub","id":"h","subject":"a","headers":{{"{name}":"v"}}}}"#);
        let e = err(&text);
        assert_eq!(
            (e.kind, e.id.as_deref()),
            (WsErrorKind::BadHeaderName, Some("h")),
            "{text}"
        );
    }
    // Values may hold anything: the block writes line breaks as spaces.
    let p = publish(r#"{"op":"pub","subject":"a","headers":{"A":"x\r\nEvil: 1"}}"#);
    assert_eq!(
        HeaderMap::parse(p.header_block()).unwrap().entries,
        [("A".to_owned(), "x  Evil: 1".to_owned())]
    );
}

#[test]
fn snapshot_put_needs_subject_and_version() {
    assert_eq!(
        ok(r#"{"op":"snapshot.put","id":"s","subject":"a","version":2,"data":{"x":1}}"#),
        ClientOp::SnapshotPut(SnapshotPut {
            id: Some(cow("s")),
            subject: cow("a"),
            version: 2,
            data: Data::Json(raw(r#"{"x":1}"#)),
        })
    );
    let e = err(r#"{"op":"snapshot.put","id":"s","subject":"a"}"#);
    assert_eq!(
        (e.kind, e.message.as_str()),
        (
            WsErrorKind::MissingField { field: "version" },
            "snapshot.put needs `version`"
        )
    );
    let e = err(r#"{"op":"snapshot.put","version":1}"#);
    assert_eq!(e.kind, WsErrorKind::MissingField { field: "subject" });
}

#[test]
fn group_ops_read_their_fields_and_refuse_an_unknown_kind() {
    assert_eq!(
        ok(r#"{"op":"group.next","id":"n","group":"billing","max":10,"wait_ms":5000}"#),
        ClientOp::GroupNext(GroupNext {
            id: Some(cow("n")),
            group: cow("billing"),
            max: Some(10),
            wait_ms: Some(5000),
        })
    );
    let e = err(r#"{"op":"group.next","id":"n","max":1}"#);
    assert_eq!(
        (e.kind, e.message.as_str(), e.id.as_deref()),
        (
            WsErrorKind::MissingField { field: "group" },
            "group.next needs `group`",
            Some("n")
        )
    );
    assert_eq!(
        ok(r#"{"op":"group.ack","ack":"t"}"#),
        ClientOp::GroupAck(GroupAck {
            id: None,
            ack: cow("t"),
            kind: AckKind::Ack,
            delay_ms: None,
        })
    );
    for kind in [
        AckKind::Ack,
        AckKind::Nack,
        AckKind::InProgress,
        AckKind::Term,
    ] {
        let text = format!(
            r#"{{"op":"group.ack","ack":"t","kind":"{}","delay_ms":250}}"#,
            kind.as_str()
        );
        match ok(&text) {
            ClientOp::GroupAck(ack) => assert_eq!((ack.kind, ack.delay_ms), (kind, Some(250))),
            other => panic!("{other:?}"),
        }
    }
    let e = err(r#"{"op":"group.ack","id":"a","ack":"t","kind":"maybe"}"#);
    assert_eq!(
        (e.kind, e.code(), e.id.as_deref()),
        (
            WsErrorKind::WrongType { field: "kind" },
            ErrorCode::BadRequest,
            Some("a")
        )
    );
    assert!(e.message.contains("maybe"), "{}", e.message);
    let e = err(r#"{"op":"group.ack","kind":"ack"}"#);
    assert_eq!(e.kind, WsErrorKind::MissingField { field: "ack" });
    let e = err(r#"{"op":"group.next","group":"g","wait_ms":-1}"#);
    assert_eq!(e.kind, WsErrorKind::WrongType { field: "wait_ms" });
}

#[test]
fn every_required_field_is_named_when_missing() {
    for (text, field) in [
        (r#"{"id":"x","op":"sub"}"#, "pattern"),
        (r#"{"id":"x","op":"unsub"}"#, "sid"),
        (r#"{"id":"x","op":"pub","data":1}"#, "subject"),
        (r#"{"id":"x","op":"get","version":1}"#, "subject"),
        (r#"{"id":"x","op":"snapshot.get"}"#, "subject"),
        (r#"{"id":"x","op":"snapshot.put","version":1}"#, "subject"),
        (r#"{"id":"x","op":"snapshot.put","subject":"a"}"#, "version"),
        (r#"{"id":"x","op":"sub","pattern":null}"#, "pattern"),
        (r#"{"id":"x"}"#, "op"),
        (r#"{"id":"x","op":null}"#, "op"),
    ] {
        let e = err(text);
        assert_eq!(e.kind, WsErrorKind::MissingField { field }, "{text}");
        assert_eq!(e.code(), ErrorCode::BadRequest);
        assert_eq!(e.id.as_deref(), Some("x"), "{text}");
        assert!(e.message.contains(&format!("`{field}`")), "{}", e.message);
    }
    assert_eq!(err(r#"{"op":"pub"}"#).message, "pub needs `subject`");
}

// ---- errors ----------------------------------------------------------------------------

#[test]
fn not_json_and_not_an_object() {
    for text in [
        "",
        "{",
        "{\"op\":\"get\",}",
        "nul",
        "{\"op\":\"get\" \"x\":1}",
        "\u{feff}{}",
    ] {
        assert_eq!(err(text).kind, WsErrorKind::NotJson, "{text:?}");
    }
    for text in ["[]", "\"sub\"", "5", "null", "true"] {
        let e = err(text);
        assert_eq!((e.kind, e.id), (WsErrorKind::NotAnObject, None), "{text:?}");
    }
    // Trailing text after a request, with the id read before it.
    let e = err(r#"{"op":"get","id":"t","subject":"a"} x"#);
    assert_eq!((e.kind, e.id.as_deref()), (WsErrorKind::NotJson, Some("t")));
    // A syntax error after the id still answers it.
    let e = err(r#"{"id":"early","op":"get","subject":"a",,}"#);
    assert_eq!(
        (e.kind, e.id.as_deref()),
        (WsErrorKind::NotJson, Some("early"))
    );
    assert!(e.message.starts_with("not a request: "), "{}", e.message);
}

#[test]
fn wrong_types_name_the_field() {
    for (text, field) in [
        (r#"{"op":"unsub","sid":"1","id":"x"}"#, "sid"),
        (r#"{"op":"unsub","sid":-1,"id":"x"}"#, "sid"),
        (r#"{"op":"unsub","sid":4294967296,"id":"x"}"#, "sid"),
        (
            r#"{"op":"get","subject":"a","version":1.5,"id":"x"}"#,
            "version",
        ),
        (r#"{"op":"get","subject":5,"id":"x"}"#, "subject"),
        (
            r#"{"op":"pub","subject":"a","data_b64":[],"id":"x"}"#,
            "data_b64",
        ),
        (
            r#"{"op":"pub","subject":"a","headers":{"a":1},"id":"x"}"#,
            "headers",
        ),
        (
            r#"{"op":"pub","subject":"a","headers":["a"],"id":"x"}"#,
            "headers",
        ),
        (
            r#"{"op":"sub","pattern":"a","from_snapshot":"yes","id":"x"}"#,
            "from_snapshot",
        ),
        (r#"{"op":"replay","pattern":"a","max":-3,"id":"x"}"#, "max"),
        (r#"{"op":["get"],"id":"x"}"#, "op"),
        (
            r#"{"op":"pub","subject":"a","expect_version":18446744073709551616,"id":"x"}"#,
            "expect_version",
        ),
    ] {
        let e = err(text);
        assert_eq!(e.kind, WsErrorKind::WrongType { field }, "{text}");
        assert_eq!(e.id.as_deref(), Some("x"), "{text}");
        assert!(
            e.message.contains(&format!("`{field}` must be")),
            "{}",
            e.message
        );
    }
    // A mistyped id cannot be answered with.
    let e = err(r#"{"op":"get","id":5}"#);
    assert_eq!(
        (e.kind, e.id),
        (WsErrorKind::WrongType { field: "id" }, None)
    );
}

#[test]
fn unknown_ops_and_fields_and_repeats() {
    let e = err(r#"{"op":"fly","id":"x"}"#);
    assert_eq!(
        (e.kind, e.code(), e.id.as_deref()),
        (WsErrorKind::UnknownOp, ErrorCode::BadRequest, Some("x"))
    );
    assert_eq!(
        e.message,
        "unknown op `fly`: use sub, unsub, pub, get, replay, subjects, snapshot.get, snapshot.put, group.next or group.ack"
    );
    let long = "x".repeat(10_000);
    let e = err(&format!(r#"{{"op":"{long}"}}"#));
    assert!(e.message.len() < 200, "{}", e.message.len());
    // Ops are case-sensitive, as they always were.
    assert_eq!(
        err(r#"{"op":"PUB","subject":"a"}"#).kind,
        WsErrorKind::UnknownOp
    );

    // The id comes after the unknown field: found by a second look.
    let e = err(r#"{"op":"get","subject":"a","bogus":1,"id":"late"}"#);
    assert_eq!(
        (e.kind, e.id.as_deref()),
        (WsErrorKind::UnknownField, Some("late"))
    );
    assert!(e.message.contains("`bogus`"), "{}", e.message);
    let e = err(r#"{"op":"get","op":"pub","id":"d"}"#);
    assert_eq!(
        (e.kind, e.id.as_deref()),
        (WsErrorKind::DuplicateField { field: "op" }, Some("d"))
    );
    assert!(matches!(
        err(r#"{"op":"pub","subject":"a","data":1,"data_b64":"AA=="}"#).kind,
        WsErrorKind::Exclusive {
            fields: ["data", "data_b64"]
        }
    ));
    let e = err(r#"{"op":"pub","id":"b","subject":"a","data_b64":"not base64!"}"#);
    assert_eq!(
        (e.kind, e.id.as_deref()),
        (WsErrorKind::BadBase64, Some("b"))
    );
    assert!(
        e.message.starts_with("data_b64 is not base64"),
        "{}",
        e.message
    );
    assert_eq!(WsDecodeError::not_text().kind, WsErrorKind::NotText);
}

#[test]
fn fields_of_other_ops_are_ignored() {
    // As before: one flat set of fields, each op reading what it needs.
    let ClientOp::Get(g) = ok(r#"{"op":"get","subject":"a","sid":1,"pattern":"x","data":[1]}"#)
    else {
        panic!()
    };
    assert_eq!(g.subject, "a");
}

// ---- limits ----------------------------------------------------------------------------

#[test]
fn a_text_over_the_limit_is_refused_unread() {
    let text = format!(
        r#"{{"op":"pub","id":"big","subject":"a","data":"{}"}}"#,
        "x".repeat(4096)
    );
    let e = err(&text);
    assert_eq!(
        (e.kind, e.code(), e.id),
        (
            WsErrorKind::TooLarge {
                size: text.len(),
                max: 4096
            },
            ErrorCode::TooLarge,
            None
        )
    );
    assert_eq!(e.message, "a request may hold at most 4096 bytes");
}

#[test]
fn a_message_with_its_headers_must_fit_max_payload() {
    use base64::Engine;
    let b64 = |n: usize| base64::engine::general_purpose::STANDARD.encode(vec![7u8; n]);
    let at = format!(r#"{{"op":"pub","subject":"a","data_b64":"{}"}}"#, b64(1024));
    assert_eq!(publish(&at).size(), 1024);
    let over = format!(
        r#"{{"op":"pub","id":"o","subject":"a","data_b64":"{}"}}"#,
        b64(1025)
    );
    let e = err(&over);
    assert_eq!(
        (e.kind, e.code(), e.id.as_deref()),
        (
            WsErrorKind::PayloadTooLarge {
                size: 1025,
                max: 1024
            },
            ErrorCode::TooLarge,
            Some("o")
        )
    );
    // `NATS/1.0\r\n` + `A: b\r\n` + `\r\n` = 18 bytes of block.
    let block = 18;
    let fits = format!(
        r#"{{"op":"pub","subject":"a","headers":{{"A":"b"}},"data_b64":"{}"}}"#,
        b64(1024 - block)
    );
    assert_eq!(publish(&fits).size(), 1024);
    let over = format!(
        r#"{{"op":"pub","subject":"a","headers":{{"A":"b"}},"data_b64":"{}"}}"#,
        b64(1024 - block + 1)
    );
    assert_eq!(
        err(&over).kind,
        WsErrorKind::PayloadTooLarge {
            size: 1025,
            max: 1024
        }
    );
    // The added Content-Type and version headers count too.
    let data = "1".repeat(1024 - 10 - 2 - "Content-Type: application/json\r\n".len());
    let fits = format!(r#"{{"op":"pub","subject":"a","data":{data}}}"#);
    assert_eq!(publish(&fits).size(), 1024);
    let over = format!(r#"{{"op":"pub","subject":"a","data":{data},"expect_version":1}}"#);
    assert!(matches!(
        err(&over).kind,
        WsErrorKind::PayloadTooLarge { .. }
    ));
    // Headers alone past the limit are refused while being read.
    let many: Vec<String> = (0..200).map(|i| format!(r#""H{i}":"vvvv""#)).collect();
    let text = format!(
        r#"{{"op":"pub","id":"h","subject":"a","headers":{{{}}}}}"#,
        many.join(",")
    );
    let e = err(&text);
    assert!(
        matches!(e.kind, WsErrorKind::PayloadTooLarge { .. }),
        "{e:?}"
    );
    assert_eq!(e.id.as_deref(), Some("h"));
}

#[test]
fn a_snapshot_must_fit_max_payload() {
    let data = format!("\"{}\"", "s".repeat(1022));
    let fits = format!(r#"{{"op":"snapshot.put","subject":"a","version":1,"data":{data}}}"#);
    assert!(matches!(ok(&fits), ClientOp::SnapshotPut(_)));
    let data = format!("\"{}\"", "s".repeat(1023));
    let over = format!(r#"{{"op":"snapshot.put","subject":"a","version":1,"data":{data}}}"#);
    assert_eq!(
        err(&over).kind,
        WsErrorKind::PayloadTooLarge {
            size: 1025,
            max: 1024
        }
    );
}

// ---- unicode ---------------------------------------------------------------------------

#[test]
fn unicode_strings_borrow_unless_escaped() {
    let ClientOp::Get(g) = ok(r#"{"op":"get","id":"🌲","subject":"капля.é"}"#) else {
        panic!()
    };
    assert!(matches!(g.subject, Cow::Borrowed("капля.é")));
    assert_eq!(g.id.as_deref(), Some("🌲"));
    let ClientOp::Get(g) = ok(r#"{"op":"get","subject":"caf\u00e9.\ud83c\udf32"}"#) else {
        panic!()
    };
    assert!(matches!(&g.subject, Cow::Owned(s) if s == "café.🌲"));
    // A lone surrogate is not a string JSON can hold.
    assert_eq!(
        err(r#"{"op":"get","subject":"\ud800"}"#).kind,
        WsErrorKind::NotJson
    );
    // Inline data keeps its escapes as written.
    let p = publish(r#"{"op":"pub","subject":"a","data":"caf\u00e9 \ud83c\udf32 é"}"#);
    assert_eq!(
        p.data.as_bytes(),
        r#""caf\u00e9 \ud83c\udf32 é""#.as_bytes()
    );
    // Escaped keys are still the fields they spell.
    assert!(matches!(
        ok(r#"{"\u006fp":"get","subject":"a"}"#),
        ClientOp::Get(_)
    ));
}

// ---- round trips -----------------------------------------------------------------------

/// Inline data a request can carry (`null` is no data).
const JSON_DATA: &[&str] = &[
    "1",
    "\"caf\\u00e9\"",
    "{\"a\": [1, 2.50, {\"b\":null}] }",
    "[ ]",
    "123456789012345678901234567890",
    "\"\u{1f332}\"",
];

fn text() -> impl Strategy<Value = String> {
    prop_oneof![any::<String>(), "[a-z0-9.*>/+#]{1,12}"]
}

fn data() -> impl Strategy<Value = Data<'static>> {
    prop_oneof![
        Just(Data::None),
        proptest::sample::select(JSON_DATA).prop_map(|t| Data::Json(raw(t))),
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(Data::Bytes),
    ]
}

fn start() -> impl Strategy<Value = Option<Start>> {
    prop_oneof![
        Just(None),
        any::<u64>().prop_map(|n| Some(Start::Offset(n))),
        any::<u64>().prop_map(|n| Some(Start::Version(n))),
        any::<u64>().prop_map(|n| Some(Start::TimeMs(n))),
    ]
}

fn owned(text: String) -> Cow<'static, str> {
    Cow::Owned(text)
}

fn headers() -> impl Strategy<Value = Vec<(Cow<'static, str>, Cow<'static, str>)>> {
    proptest::collection::btree_map("[A-Za-z0-9!#-]{1,12}", any::<String>(), 0..4).prop_map(|m| {
        m.into_iter()
            .map(|(n, v)| (owned(n), owned(v)))
            .collect::<Vec<_>>()
    })
}

fn id() -> impl Strategy<Value = Option<Cow<'static, str>>> {
    proptest::option::of(text().prop_map(owned))
}

fn client_op() -> impl Strategy<Value = ClientOp<'static>> {
    prop_oneof![
        (id(), text(), start(), any::<bool>()).prop_map(|(id, p, from, from_snapshot)| {
            ClientOp::Subscribe(Subscribe {
                id,
                pattern: owned(p),
                from,
                from_snapshot,
            })
        }),
        (id(), any::<u32>()).prop_map(|(id, sid)| ClientOp::Unsubscribe(Unsubscribe { id, sid })),
        (
            id(),
            text(),
            data(),
            headers(),
            proptest::option::of(any::<u64>()),
            proptest::option::of(text())
        )
            .prop_map(|(id, s, data, headers, v, m)| {
                ClientOp::Publish(Publish::new(id, owned(s), data, headers, v, m.map(owned)))
            }),
        (id(), text(), proptest::option::of(any::<u64>())).prop_map(|(id, s, version)| {
            ClientOp::Get(Get {
                id,
                subject: owned(s),
                version,
            })
        }),
        (
            id(),
            text(),
            any::<bool>(),
            start(),
            proptest::option::of(any::<u64>())
        )
            .prop_map(|(id, t, subject, from, max)| {
                let target = if subject {
                    Target::Subject(owned(t))
                } else {
                    Target::Pattern(owned(t))
                };
                ClientOp::Replay(Replay {
                    id,
                    target,
                    from,
                    max,
                })
            }),
        (
            id(),
            text(),
            proptest::option::of(text()),
            proptest::option::of(any::<u64>())
        )
            .prop_map(|(id, p, after, max)| {
                ClientOp::Subjects(Subjects {
                    id,
                    pattern: owned(p),
                    after: after.map(owned),
                    max,
                })
            }),
        (id(), text(), proptest::option::of(any::<u64>())).prop_map(|(id, s, version)| {
            ClientOp::SnapshotGet(SnapshotGet {
                id,
                subject: owned(s),
                version,
            })
        }),
        (id(), text(), any::<u64>(), data()).prop_map(|(id, s, version, data)| {
            ClientOp::SnapshotPut(SnapshotPut {
                id,
                subject: owned(s),
                version,
                data,
            })
        }),
        (
            id(),
            text(),
            proptest::option::of(any::<u64>()),
            proptest::option::of(any::<u64>())
        )
            .prop_map(|(id, g, max, wait_ms)| {
                ClientOp::GroupNext(GroupNext {
                    id,
                    group: owned(g),
                    max,
                    wait_ms,
                })
            }),
        (
            id(),
            text(),
            proptest::sample::select(vec![
                AckKind::Ack,
                AckKind::Nack,
                AckKind::InProgress,
                AckKind::Term
            ]),
            proptest::option::of(any::<u64>())
        )
            .prop_map(|(id, a, kind, delay_ms)| {
                ClientOp::GroupAck(GroupAck {
                    id,
                    ack: owned(a),
                    kind,
                    delay_ms,
                })
            }),
    ]
}

const ROOMY: WsLimits = WsLimits {
    max_text: 1 << 20,
    max_payload: 1 << 20,
};

proptest! {
    #[test]
    fn every_op_round_trips(op in client_op()) {
        let mut text = String::new();
        encode_client(&mut text, &op);
        let back = decode_client(&text, &ROOMY);
        prop_assert_eq!(back.as_ref(), Ok(&op), "{}", text);
        if let Ok(back) = back {
            prop_assert_eq!(back.id(), op.id());
            prop_assert_eq!(back.name(), op.name());
        }
    }
}

// ---- the old request parser as an oracle -----------------------------------------------

/// The server's request struct before this codec (src/server/websocket.rs), verbatim.
mod old_request {
    use std::collections::HashMap;

    use serde::Deserialize;
    use serde_json::value::RawValue;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    pub struct Request<'a> {
        pub op: String,
        pub id: Option<String>,
        pub pattern: Option<String>,
        pub sid: Option<u32>,
        pub subject: Option<String>,
        #[serde(borrow)]
        pub data: Option<&'a RawValue>,
        pub data_b64: Option<String>,
        #[serde(default)]
        pub headers: HashMap<String, String>,
        pub expect_version: Option<u64>,
        pub msg_id: Option<String>,
        pub version: Option<u64>,
        pub from_offset: Option<u64>,
        pub from_version: Option<u64>,
        pub from_time_ms: Option<u64>,
        pub max: Option<usize>,
        pub after: Option<String>,
        #[serde(default)]
        pub from_snapshot: bool,
    }
}

/// A request object with fields drawn from every op's, of right and wrong types.
fn request_text() -> impl Strategy<Value = String> {
    let value = prop_oneof![
        Just("null".to_owned()),
        Just("true".to_owned()),
        Just("\"\"".to_owned()),
        Just("\"a.b\"".to_owned()),
        Just("\"aGk=\"".to_owned()),
        Just("\"caf\\u00e9\"".to_owned()),
        Just("0".to_owned()),
        Just("7".to_owned()),
        Just("-1".to_owned()),
        Just("1.5".to_owned()),
        Just("4294967296".to_owned()),
        Just("{}".to_owned()),
        Just("{\"A\":\"1\",\"B\":\"x\"}".to_owned()),
        Just("{\"A\":1}".to_owned()),
        Just("[1, {\"x\": 2}]".to_owned()),
    ];
    let field = prop_oneof![
        Just("id"),
        Just("pattern"),
        Just("sid"),
        Just("subject"),
        Just("data"),
        Just("data_b64"),
        Just("headers"),
        Just("expect_version"),
        Just("msg_id"),
        Just("version"),
        Just("from_offset"),
        Just("from_version"),
        Just("from_time_ms"),
        Just("max"),
        Just("after"),
        Just("from_snapshot"),
        Just("bogus"),
    ];
    let op = prop_oneof![
        Just(None),
        proptest::sample::select(OPS).prop_map(Some),
        Just(Some("fly")),
    ];
    (op, proptest::collection::vec((field, value), 0..6)).prop_map(|(op, fields)| {
        let mut parts: Vec<String> = fields
            .into_iter()
            .map(|(f, v)| format!("\"{f}\":{v}"))
            .collect();
        if let Some(op) = op {
            parts.insert(parts.len() / 2, format!("\"op\":\"{op}\""));
        }
        format!("{{{}}}", parts.join(","))
    })
}

/// Whether the old server would have acted on the request (its checks before the store).
fn old_accepts(text: &str) -> bool {
    use base64::Engine;
    let Ok(r) = serde_json::from_str::<old_request::Request<'_>>(text) else {
        return false;
    };
    let payload_ok = match (&r.data, &r.data_b64) {
        (Some(_), Some(_)) => false,
        (None, Some(b)) => base64::engine::general_purpose::STANDARD
            .decode(b.trim())
            .is_ok(),
        _ => true,
    };
    match r.op.as_str() {
        "sub" => r.pattern.is_some(),
        "unsub" => r.sid.is_some(),
        "pub" => r.subject.is_some() && payload_ok,
        "get" | "snapshot.get" => r.subject.is_some(),
        "replay" => r.subject.is_some() != r.pattern.is_some(),
        "subjects" => true,
        "snapshot.put" => r.subject.is_some() && r.version.is_some() && payload_ok,
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// What the old parser took decodes, to the same fields; what it refused is refused,
    /// except `null` for `headers` and `from_snapshot` (now the same as absent).
    #[test]
    fn requests_decode_as_the_old_parser_read_them(text in request_text()) {
        let old = old_accepts(&text);
        let new = decode_client(&text, &ROOMY);
        let nulls = text.contains("\"headers\":null") || text.contains("\"from_snapshot\":null");
        if old || !nulls {
            prop_assert_eq!(old, new.is_ok(), "{} -> {:?}", text, new);
        }
        if let (Ok(r), Ok(op)) = (serde_json::from_str::<old_request::Request<'_>>(&text), &new) {
            prop_assert_eq!(r.id.as_deref(), op.id());
            prop_assert_eq!(r.op.as_str(), op.name());
            match op {
                ClientOp::Publish(p) => {
                    prop_assert_eq!(Some(&*p.subject), r.subject.as_deref());
                    prop_assert_eq!(p.expect_version, r.expect_version);
                    let mut old_headers: Vec<_> = r.headers.into_iter().collect();
                    old_headers.sort();
                    let mut new_headers: Vec<(String, String)> = p.headers.iter()
                        .map(|(n, v)| (n.to_string(), v.to_string())).collect();
                    new_headers.sort();
                    prop_assert_eq!(old_headers, new_headers);
                    if let Some(raw) = r.data {
                        prop_assert_eq!(p.data.as_bytes(), raw.get().as_bytes());
                    }
                }
                ClientOp::Get(g) => prop_assert_eq!(g.version, r.version),
                ClientOp::Subscribe(s) => {
                    prop_assert_eq!(s.from_snapshot, r.from_snapshot);
                    let old_from = r.from_time_ms.map(Start::TimeMs)
                        .or(r.from_offset.map(Start::Offset))
                        .or(r.from_version.map(Start::Version));
                    prop_assert_eq!(s.from, old_from);
                }
                _ => {}
            }
        }
        if let Err(e) = &new {
            prop_assert!(!e.message.is_empty());
        }
    }
}

// ---- frames, against the old renderer --------------------------------------------------

/// The server's rendering before this codec (src/server/websocket.rs), verbatim but for
/// taking its inputs as arguments.
mod old_frames {
    use base64::Engine;
    use serde::Serialize;
    use serde_json::value::RawValue;
    use serde_json::{Value, json};

    use crate::native::HeaderMap;

    pub fn reply(id: Option<&str>, mut body: Value) -> String {
        if let Some(id) = id {
            body["id"] = json!(id);
        }
        body.to_string()
    }

    #[derive(Serialize)]
    pub struct Delivery<'a> {
        pub op: &'static str,
        pub sid: u32,
        pub subject: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub version: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub offset: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub reply: Option<&'a str>,
        #[serde(flatten)]
        pub payload: Payload,
    }

    #[derive(Serialize)]
    pub struct ReplayOut<'a> {
        pub op: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub id: Option<&'a str>,
        pub messages: Vec<StoredOut<'a>>,
        pub next: u64,
        pub caught_up: bool,
    }

    #[derive(Serialize)]
    pub struct StoredOut<'a> {
        pub subject: &'a str,
        pub version: u64,
        pub offset: u64,
        pub time_ms: u64,
        #[serde(flatten)]
        pub payload: Payload,
    }

    #[derive(Serialize)]
    pub struct Stored<'a> {
        pub op: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub id: Option<&'a str>,
        #[serde(flatten)]
        pub message: StoredOut<'a>,
    }

    #[derive(Serialize)]
    pub struct Payload {
        #[serde(skip_serializing_if = "Option::is_none")]
        headers: Option<serde_json::Map<String, Value>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<Box<RawValue>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        data_b64: Option<String>,
    }

    impl Payload {
        pub fn of(headers: &[u8], payload: &[u8]) -> Payload {
            let mut json_content = false;
            let mut object = None;
            if !headers.is_empty()
                && let Ok(map) = HeaderMap::parse(headers)
            {
                json_content = map.says_json();
                let mut fields = serde_json::Map::new();
                for (name, value) in map.entries {
                    match fields.get_mut(&name) {
                        Some(Value::Array(values)) => values.push(json!(value)),
                        Some(first) => *first = json!([first.take(), value]),
                        None => {
                            fields.insert(name, json!(value));
                        }
                    }
                }
                object = Some(fields);
            }
            Payload {
                headers: object,
                ..Payload::bytes(json_content, payload)
            }
        }

        pub fn bytes(json: bool, payload: &[u8]) -> Payload {
            let data = json
                .then(|| std::str::from_utf8(payload).ok())
                .flatten()
                .and_then(|text| RawValue::from_string(text.to_owned()).ok());
            let data_b64 = data
                .is_none()
                .then(|| base64::engine::general_purpose::STANDARD.encode(payload));
            Payload {
                headers: None,
                data,
                data_b64,
            }
        }
    }

    #[derive(Serialize)]
    pub struct SnapshotOut<'a> {
        pub op: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub id: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub sid: Option<u32>,
        pub subject: &'a str,
        pub version: u64,
        pub time_ms: u64,
        #[serde(flatten)]
        pub payload: Payload,
    }
}

fn frame(write: impl FnOnce(&mut String)) -> String {
    let mut out = String::new();
    write(&mut out);
    out
}

fn stored_out<'a>(m: &StoredMessage<'a>) -> old_frames::StoredOut<'a> {
    old_frames::StoredOut {
        subject: m.subject,
        version: m.version,
        offset: m.offset,
        time_ms: m.time_ms,
        payload: old_frames::Payload::of(m.headers, m.payload),
    }
}

fn header_block() -> impl Strategy<Value = Vec<u8>> {
    let entry = (
        prop_oneof![
            Just("Content-Type".to_owned()),
            Just("A".to_owned()),
            Just("a".to_owned()),
            Just("Ü".to_owned()),
            "[A-Za-z-]{1,8}",
        ],
        prop_oneof![
            Just("application/json".to_owned()),
            Just("application/json; charset=utf-8".to_owned()),
            Just("text/plain".to_owned()),
            any::<String>(),
        ],
    );
    prop_oneof![
        Just(Vec::new()),
        Just(crate::native::no_responders_block().to_vec()),
        proptest::collection::vec(entry, 0..6).prop_map(|entries| {
            let mut map = HeaderMap::new();
            for (n, v) in entries {
                map.append(n, v);
            }
            let mut block = bytes::BytesMut::new();
            map.encode(&mut block);
            block.to_vec()
        }),
        proptest::collection::vec(any::<u8>(), 0..40),
    ]
}

fn payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..48),
        proptest::sample::select(
            &[
                "{\"n\": 123456789012345678901234567890,\"k\" :1}",
                "  [1, 2]\n",
                "\"caf\\u00e9 \u{1f332}\"",
                "1e400",
                "nul",
                "",
                "{\"a\":",
                "\"\\ud800\"",
                "true false",
            ][..]
        )
        .prop_map(|t| t.as_bytes().to_vec()),
        any::<String>().prop_map(String::into_bytes),
    ]
}

fn opt_text() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(any::<String>())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn deliveries_are_the_old_text(
        sid in any::<u32>(),
        subject in any::<String>(),
        stored in proptest::option::of((any::<u64>(), any::<u64>())),
        reply in opt_text(),
        headers in header_block(),
        payload in payload(),
    ) {
        let delivery = Delivery {
            subject: &subject,
            version: stored.map(|s| s.0),
            offset: stored.map(|s| s.1),
            reply: reply.as_deref(),
            headers: &headers,
            payload: &payload,
        };
        let old = serde_json::to_string(&old_frames::Delivery {
            op: "msg",
            sid,
            subject: &subject,
            version: delivery.version,
            offset: delivery.offset,
            reply: delivery.reply,
            payload: old_frames::Payload::of(&headers, &payload),
        }).unwrap();
        prop_assert_eq!(&frame(|o| encode_msg(o, sid, &delivery)), &old);
        let tail = frame(|o| encode_msg_tail(o, &delivery));
        prop_assert_eq!(&frame(|o| encode_msg_with_tail(o, sid, &tail)), &old);
        prop_assert_eq!(format!("{MSG_HEAD}{sid}{tail}"), old.clone());
        prop_assert_eq!(frame(|o| encode_server(o, &ServerFrame::Msg { sid, delivery })), old);
    }

    #[test]
    fn stored_messages_and_pages_are_the_old_text(
        id in opt_text(),
        subject in any::<String>(),
        numbers in any::<(u64, u64, u64)>(),
        headers in header_block(),
        payload in payload(),
        more in 0usize..3,
        next in any::<u64>(),
        caught_up in any::<bool>(),
    ) {
        let message = StoredMessage {
            subject: &subject,
            version: numbers.0,
            offset: numbers.1,
            time_ms: numbers.2,
            headers: &headers,
            payload: &payload,
        };
        let old = serde_json::to_string(&old_frames::Stored {
            op: "ok",
            id: id.as_deref(),
            message: stored_out(&message),
        }).unwrap();
        prop_assert_eq!(&frame(|o| encode_message(o, id.as_deref(), &message)), &old);
        let framed = ServerFrame::Message { id: id.as_deref(), message };
        prop_assert_eq!(frame(|o| encode_server(o, &framed)), old);

        let messages = vec![message; more];
        let old = serde_json::to_string(&old_frames::ReplayOut {
            op: "ok",
            id: id.as_deref(),
            messages: messages.iter().map(stored_out).collect(),
            next,
            caught_up,
        }).unwrap();
        prop_assert_eq!(
            frame(|o| encode_page(o, id.as_deref(), &messages, next, caught_up)),
            old
        );
    }

    #[test]
    fn snapshots_are_the_old_text(
        id in opt_text(),
        sid in any::<u32>(),
        subject in any::<String>(),
        version in any::<u64>(),
        time_ms in any::<u64>(),
        json in any::<bool>(),
        payload in payload(),
    ) {
        let snapshot = SnapshotBody { subject: &subject, version, time_ms, json, payload: &payload };
        let old = |op, id, sid| serde_json::to_string(&old_frames::SnapshotOut {
            op,
            id,
            sid,
            subject: &subject,
            version,
            time_ms,
            payload: old_frames::Payload::bytes(json, &payload),
        }).unwrap();
        prop_assert_eq!(
            frame(|o| encode_snapshot(o, id.as_deref(), &snapshot)),
            old("ok", id.as_deref(), None)
        );
        prop_assert_eq!(
            frame(|o| encode_snapshot_first(o, sid, &snapshot)),
            old("snapshot", None, Some(sid))
        );
        let stored = serde_json::json!({"op": "ok", "id": id, "subject": subject, "version": version})
            .to_string();
        prop_assert_eq!(
            frame(|o| encode_snapshot_stored(o, id.as_deref(), &subject, version)),
            stored
        );
    }

    #[test]
    fn answers_and_errors_are_the_old_text(
        id in opt_text(),
        text in any::<String>(),
        sid in any::<u32>(),
        numbers in any::<(u64, u64)>(),
        code in proptest::sample::select(ErrorCode::ALL),
    ) {
        use serde_json::json;
        let id = id.as_deref();
        let (version, offset) = numbers;
        prop_assert_eq!(
            frame(|o| encode_error(o, id, code, &text)),
            old_frames::reply(id, json!({"op": "error", "code": code.as_str(), "message": text}))
        );
        prop_assert_eq!(
            frame(|o| encode_conflict(o, id, &text, version)),
            old_frames::reply(id, json!({
                "op": "error",
                "code": "conflict",
                "message": format!("{text} is at version {version}"),
                "subject": &*text,
                "current_version": version,
            }))
        );
        prop_assert_eq!(frame(|o| encode_ok(o, id)), old_frames::reply(id, json!({"op": "ok"})));
        prop_assert_eq!(
            frame(|o| encode_subscribed(o, id, sid, &text)),
            old_frames::reply(id, json!({"op": "ok", "sid": sid, "pattern": text}))
        );
        prop_assert_eq!(
            frame(|o| encode_published(o, id)),
            old_frames::reply(id, json!({"op": "ok", "stored": false}))
        );
        prop_assert_eq!(
            frame(|o| encode_stored(o, id, &text, version, offset, false)),
            old_frames::reply(id, json!({"op": "ok", "stored": true, "subject": &*text, "version": version, "offset": offset}))
        );
        prop_assert_eq!(
            frame(|o| encode_stored(o, id, &text, version, offset, true)),
            old_frames::reply(id, json!({"op": "ok", "stored": true, "duplicate": true, "subject": &*text, "version": version, "offset": offset}))
        );
        let frames = [
            ServerFrame::Error { id, code, message: &text },
            ServerFrame::Conflict { id, subject: &text, current_version: version },
            ServerFrame::Ok { id },
            ServerFrame::Subscribed { id, sid, pattern: &text },
            ServerFrame::Published { id },
            ServerFrame::Stored { id, subject: &text, version, offset, duplicate: true },
            ServerFrame::SnapshotStored { id, subject: &text, version },
        ];
        for f in &frames {
            let written = frame(|o| encode_server(o, f));
            let value: serde_json::Value = serde_json::from_str(&written).unwrap();
            prop_assert_eq!(value.get("id").and_then(|v| v.as_str()), id);
        }
    }

    #[test]
    fn subject_pages_are_the_old_text(
        id in opt_text(),
        heads in proptest::collection::vec((any::<String>(), any::<(u64, u64, u64)>()), 0..4),
        next in opt_text(),
    ) {
        let subjects: Vec<SubjectHead<'_>> = heads
            .iter()
            .map(|(s, (v, o, t))| SubjectHead { subject: s, version: *v, offset: *o, time_ms: *t })
            .collect();
        let old_subjects: Vec<serde_json::Value> = subjects
            .iter()
            .map(|h| serde_json::json!({"subject": h.subject, "version": h.version, "offset": h.offset, "time_ms": h.time_ms}))
            .collect();
        let old = serde_json::json!({"op": "ok", "id": id, "subjects": old_subjects, "next": next})
            .to_string();
        prop_assert_eq!(
            frame(|o| encode_subjects(o, id.as_deref(), &subjects, next.as_deref())),
            old.clone()
        );
        let framed = ServerFrame::Subjects { id: id.as_deref(), subjects: &subjects, next: next.as_deref() };
        prop_assert_eq!(frame(|o| encode_server(o, &framed)), old);
    }
}

#[test]
fn a_delivery_reads_as_documented() {
    let headers = b"NATS/1.0\r\nContent-Type: application/json\r\nX: 1\r\nX: 2\r\n\r\n";
    let delivery = Delivery {
        subject: "devices.42.temp",
        version: Some(7),
        offset: Some(1093),
        reply: None,
        headers,
        payload: br#" {"t": 21.5} "#,
    };
    assert_eq!(
        frame(|o| encode_msg(o, 1, &delivery)),
        r#"{"op":"msg","sid":1,"subject":"devices.42.temp","version":7,"offset":1093,"headers":{"Content-Type":"application/json","X":["1","2"]},"data":{"t": 21.5}}"#
    );
    let bytes = Delivery {
        headers: b"",
        version: None,
        offset: None,
        reply: Some("_INBOX.1"),
        ..delivery
    };
    assert_eq!(
        frame(|o| encode_msg(o, 2, &bytes)),
        r#"{"op":"msg","sid":2,"subject":"devices.42.temp","reply":"_INBOX.1","data_b64":"IHsidCI6IDIxLjV9IA=="}"#
    );
    assert_eq!(
        frame(|o| encode_conflict(o, Some("p2"), "devices.7.temp", 1)),
        r#"{"code":"conflict","current_version":1,"id":"p2","message":"devices.7.temp is at version 1","op":"error","subject":"devices.7.temp"}"#
    );
}

#[test]
fn every_kind_of_body_is_the_old_text() {
    let blocks: &[&[u8]] = &[
        b"",
        b"NATS/1.0\r\n\r\n",
        b"NATS/1.0 503\r\n\r\n",
        b"NATS/1.0\r\nContent-Type: application/json\r\n\r\n",
        b"NATS/1.0\r\nContent-Type:  application/json; charset=utf-8 \r\nB: 1\r\nA: 2\r\nB: 3\r\nB: 4\r\n\r\n",
        b"NATS/1.0\r\ncontent-type: application/json\r\n\r\n",
        b"NATS/1.0\r\nContent-Type: text/plain\r\n\xc3\x9c: \"\\\r\n\r\n",
        b"NATS/1.0\r\nContent-Type: application/json\r\n",
        b"garbage",
    ];
    let payloads: &[&[u8]] = &[
        b"",
        b"  {\"n\": 123456789012345678901234567890,\"k\" :1}\n",
        b"\"caf\\u00e9\"",
        b"1e400",
        b"nul",
        b"{\"a\":",
        b"[1] [2]",
        b"\xff\xfe",
        "\"\u{1f332}\"".as_bytes(),
    ];
    for headers in blocks {
        for payload in payloads {
            let delivery = Delivery {
                subject: "a.b",
                version: Some(1),
                offset: Some(2),
                reply: Some("r"),
                headers,
                payload,
            };
            let old = serde_json::to_string(&old_frames::Delivery {
                op: "msg",
                sid: 9,
                subject: "a.b",
                version: Some(1),
                offset: Some(2),
                reply: Some("r"),
                payload: old_frames::Payload::of(headers, payload),
            })
            .unwrap();
            assert_eq!(frame(|o| encode_msg(o, 9, &delivery)), old);
            for json in [false, true] {
                let snapshot = SnapshotBody {
                    subject: "a.b",
                    version: 1,
                    time_ms: 2,
                    json,
                    payload,
                };
                let old = serde_json::to_string(&old_frames::SnapshotOut {
                    op: "ok",
                    id: Some("i"),
                    sid: None,
                    subject: "a.b",
                    version: 1,
                    time_ms: 2,
                    payload: old_frames::Payload::bytes(json, payload),
                })
                .unwrap();
                assert_eq!(frame(|o| encode_snapshot(o, Some("i"), &snapshot)), old);
            }
        }
    }
}

#[test]
fn a_group_delivery_shows_the_message_and_how_to_ack_it() {
    let mut headers = HeaderMap::new();
    headers.insert("Content-Type", "application/json");
    headers.insert("X-Trace", "t\"1");
    let mut block = bytes::BytesMut::new();
    headers.encode(&mut block);
    let delivery = GroupDelivery {
        group: "billing",
        attempt: 2,
        ack: "$CANOPY.group.ack.billing.3.2.orders.42",
        message: StoredMessage {
            subject: "orders.42",
            version: 3,
            offset: 118,
            time_ms: 7,
            headers: &block,
            payload: br#"{"paid": true}"#,
        },
    };
    let mut out = String::new();
    encode_group_msg(&mut out, Some("n1"), &delivery);
    assert_eq!(
        out,
        r#"{"op":"group.msg","id":"n1","group":"billing","attempt":2,"ack":"$CANOPY.group.ack.billing.3.2.orders.42","subject":"orders.42","version":3,"offset":118,"time_ms":7,"headers":{"Content-Type":"application/json","X-Trace":"t\"1"},"data":{"paid": true}}"#
    );
    let bytes = GroupDelivery {
        message: StoredMessage {
            headers: b"",
            payload: &[0, 255],
            ..delivery.message
        },
        ..delivery
    };
    out.clear();
    encode_group_msg(&mut out, None, &bytes);
    let value: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(value["data_b64"], "AP8=");
    assert!(
        value.get("headers").is_none() && value.get("id").is_none(),
        "{out}"
    );
    out.clear();
    encode_group_done(&mut out, Some("n1"), "billing", 2);
    assert_eq!(out, r#"{"count":2,"group":"billing","id":"n1","op":"ok"}"#);
}

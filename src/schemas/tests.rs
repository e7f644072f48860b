use std::sync::Arc;

use bytes::Bytes;
use serde_json::json;

use super::*;

fn version(schema: Value) -> StoredVersion {
    StoredVersion {
        schema: Some(schema),
        mode: Mode::default(),
        on_invalid: OnInvalid::Reject,
        dead_letter: None,
        time_ms: 0,
    }
}

fn binding(pattern: &str, schema: Value) -> Arc<Binding> {
    Arc::new(Binding::new(pattern, 1, version(schema)).expect("compiles"))
}

fn temp_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"temp": {"type": "number"}, "unit": {"enum": ["C", "F"]}},
        "required": ["temp"]
    })
}

#[test]
fn the_most_specific_pattern_wins_whatever_the_order() {
    let patterns = [
        "devices.>",
        "devices.*.temp",
        "devices.d1.>",
        "devices.d1.temp",
    ];
    let mut all: Vec<_> = patterns.iter().map(|p| binding(p, json!({}))).collect();
    for _ in 0..patterns.len() {
        all.rotate_left(1);
        let bindings = Bindings::new(all.clone());
        let of = |s: &str| bindings.for_subject(s).map(|b| b.pattern.clone());
        assert_eq!(of("devices.d1.temp").as_deref(), Some("devices.d1.temp"));
        assert_eq!(of("devices.d1.hum").as_deref(), Some("devices.d1.>"));
        assert_eq!(of("devices.d2.temp").as_deref(), Some("devices.*.temp"));
        assert_eq!(of("devices.d2.hum").as_deref(), Some("devices.>"));
        assert_eq!(of("devices"), None, "`>` needs a token after it");
        assert_eq!(of("other.d1.temp"), None);
    }
}

#[test]
fn specificity_ranks_literal_then_one_then_more() {
    let p = |s: &str| Pattern::parse_native(s).expect("pattern");
    assert_eq!(specificity(&p("a.b"), &p("a.*")), Ordering::Greater);
    assert_eq!(specificity(&p("a.*"), &p("a.>")), Ordering::Greater);
    let mqtt = |s: &str| Pattern::parse_mqtt(s).expect("filter");
    assert_eq!(specificity(&p("a.>"), &mqtt("a/#")), Ordering::Greater);
    assert_eq!(specificity(&p("a.b.>"), &p("a.*.c")), Ordering::Greater);
    assert_eq!(specificity(&p("a.b"), &mqtt("a/b/#")), Ordering::Greater);
    assert_eq!(specificity(&p("a.*.c"), &p("a.*.c")), Ordering::Equal);
    assert_eq!(specificity(&p("*.b"), &p("a.*")), Ordering::Less);
}

#[test]
fn a_payload_is_checked_with_the_first_violation_path_and_message() {
    let b = binding("devices.*.temp", temp_schema());
    assert_eq!(b.check(br#"{"temp": 21.5, "unit": "C"}"#), Ok(()));
    let bad = b.check(br#"{"temp": "hot"}"#).expect_err("a string temp");
    assert_eq!(bad.path, "/temp");
    assert!(bad.message.contains("number"), "{bad}");
    let missing = b.check(br#"{"unit": "C"}"#).expect_err("no temp");
    assert_eq!(missing.path, "");
    assert!(missing.message.contains("temp"), "{missing}");
    let not_json = b.check(b"21.5 degrees").expect_err("not JSON");
    assert!(
        not_json.message.starts_with("the payload is not JSON"),
        "{not_json}"
    );
    assert!(b.check(b"").is_err(), "an empty payload is not JSON");
}

#[test]
fn a_violation_quoting_a_huge_value_is_shortened() {
    let b = binding("s", json!({"type": "number"}));
    let huge = serde_json::to_vec(&"x".repeat(100_000)).expect("json");
    let bad = b.check(&huge).expect_err("a string");
    assert!(bad.message.chars().count() <= MAX_VIOLATION_CHARS + 1);
}

#[test]
fn drafts_seven_and_2020_12_are_both_understood() {
    // Draft 7's tuple `items` against 2020-12's `prefixItems`.
    let seven = binding(
        "a",
        json!({"$schema": "http://json-schema.org/draft-07/schema#",
               "type": "array", "items": [{"type": "string"}], "additionalItems": false}),
    );
    assert!(seven.check(br#"["x"]"#).is_ok());
    assert!(seven.check(br#"["x", 1]"#).is_err());
    let twenty = binding(
        "b",
        json!({"$schema": "https://json-schema.org/draft/2020-12/schema",
               "type": "array", "prefixItems": [{"type": "string"}], "items": false}),
    );
    assert!(twenty.check(br#"["x"]"#).is_ok());
    assert!(twenty.check(br#"["x", 1]"#).is_err());
}

#[test]
fn formats_are_checked_and_references_must_stay_inside() {
    let b = binding("a", json!({"type": "string", "format": "date-time"}));
    assert!(b.check(br#""2026-12-02T10:00:00Z""#).is_ok());
    assert!(b.check(br#""yesterday""#).is_err());
    let inside = json!({"$defs": {"t": {"type": "number"}}, "$ref": "#/$defs/t"});
    assert!(compile(&inside).is_ok());
    let outside = json!({"properties": {"x": {"$ref": "https://example.com/x.json"}}});
    assert!(matches!(compile(&outside), Err(SchemaError::External(_))));
    assert!(matches!(compile(&json!(3)), Err(SchemaError::Invalid(_))));
    assert!(matches!(
        compile(&json!({"type": "no such type"})),
        Err(SchemaError::Invalid(_))
    ));
}

#[test]
fn stamping_puts_the_servers_header_in_place_of_the_clients() {
    let b = binding("devices.*.temp", json!({}));
    let none = b.stamp(&Bytes::new());
    assert_eq!(
        &none[..],
        b"NATS/1.0\r\nCanopy-Schema: devices.*.temp@1\r\n\r\n"
    );
    let own = Bytes::from_static(b"NATS/1.0\r\nA: 1\r\ncanopy-schema: forged@9\r\nB: 2\r\n\r\n");
    let stamped = b.stamp(&own);
    assert_eq!(
        &stamped[..],
        b"NATS/1.0\r\nA: 1\r\nB: 2\r\nCanopy-Schema: devices.*.temp@1\r\n\r\n"
    );
    let plain = Bytes::from_static(b"NATS/1.0\r\nA: 1\r\n\r\n");
    assert_eq!(strip_schema_header(&plain), plain);
    assert_eq!(
        &strip_schema_header(&own)[..],
        b"NATS/1.0\r\nA: 1\r\nB: 2\r\n\r\n"
    );
}

#[test]
fn the_bindings_in_force_are_each_patterns_newest_unless_deleted() {
    let record = |schema: Option<Value>| {
        serde_json::to_vec(&StoredVersion {
            schema,
            ..version(json!({}))
        })
        .expect("json")
    };
    let v1 = record(Some(json!({"type": "number"})));
    let v2 = record(Some(json!({"type": "integer"})));
    let gone = record(None);
    let mut skipped = Vec::new();
    let bindings = current_bindings(
        [
            ("a", 1, &v1[..]),
            ("a", 2, &v2[..]),
            ("b", 1, &v1[..]),
            ("b", 2, &gone[..]),
            ("c", 1, &b"not json"[..]),
            ("d.*", 1, &v1[..]),
        ],
        |pattern, _| skipped.push(pattern.to_owned()),
    );
    let found: Vec<_> = bindings
        .all()
        .iter()
        .map(|b| (b.pattern.as_str(), b.version))
        .collect();
    assert_eq!(found, [("a", 2), ("d.*", 1)]);
    assert_eq!(skipped, ["c"]);
    assert!(
        bindings
            .for_subject("a")
            .is_some_and(|b| b.check(b"1.5").is_err())
    );
}

#[test]
fn with_and_without_replace_and_remove_one_pattern() {
    let bindings = Bindings::new(vec![binding("a.*", json!({})), binding("b", json!({}))]);
    let replaced = bindings.with(Arc::new(
        Binding::new("a.*", 2, version(json!({"type": "number"}))).expect("compiles"),
    ));
    assert_eq!(replaced.len(), 2);
    assert_eq!(replaced.for_subject("a.x").map(|b| b.version), Some(2));
    let removed = replaced.without("a.*");
    assert!(removed.for_subject("a.x").is_none());
    assert!(removed.for_subject("b").is_some());
}

#[test]
fn a_stored_version_reads_back_as_written() {
    let stored = StoredVersion {
        schema: Some(temp_schema()),
        mode: Mode::FullTransitive,
        on_invalid: OnInvalid::DeadLetter,
        dead_letter: Some("bad".into()),
        time_ms: 7,
    };
    let text = serde_json::to_string(&stored).expect("json");
    assert!(text.contains(r#""mode":"full_transitive""#), "{text}");
    assert!(text.contains(r#""on_invalid":"dead_letter""#), "{text}");
    assert_eq!(
        serde_json::from_str::<StoredVersion>(&text).expect("reads"),
        stored
    );
    assert!(
        serde_json::from_str::<StoredVersion>(r#"{"schema":null,"mode":"sideways","time_ms":1}"#)
            .is_err()
    );
}

#[test]
fn a_stored_schema_that_no_longer_compiles_refuses_every_payload() {
    // Bound before look-around was refused at put: its subjects fail closed.
    let record = serde_json::to_vec(&StoredVersion {
        schema: Some(json!({"type": "string", "pattern": "^(?=.*[A-Z]).{8,}$"})),
        ..version(json!({}))
    })
    .expect("json");
    let mut skipped = Vec::new();
    let bindings = current_bindings([("pw.*", 3, &record[..])], |pattern, _| {
        skipped.push(pattern.to_owned())
    });
    assert_eq!(skipped, ["pw.*"], "it is still reported");
    let binding = bindings.for_subject("pw.x").expect("still bound");
    assert_eq!(binding.version, 3);
    let refused = binding
        .check(b"\"Abcdefgh1\"")
        .expect_err("refused, not unchecked");
    assert!(refused.message.contains("put it again"), "{refused:?}");
}

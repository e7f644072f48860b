//! Replays the committed fuzz corpus (`fuzz/corpus/ws_client`) plus deterministic mutations
//! of it through the `/ws` request decoder on stable Rust, so every `cargo test` does a little
//! of what the fuzzer does.
//!
//! Half the mutants are byte mutations (`common::corpus`), half change a seed field by field.
//! Checks, for each input (`common::ws::check`): no panic; a decoded op encodes back to a
//! text that decodes to the same op and keeps within the limits; an error has a kind, the
//! code that kind maps to, and a bounded sentence. Counts the outcomes so that a mutator that
//! stopped reaching an error (or success) fails the test.
//!
//! Must never: depend on time or an unseeded RNG (a failure must replay).

mod common;

use std::collections::BTreeMap;

use canopy_protocols::ws::WsErrorKind;
use common::corpus::{MUTANTS, Mutation, Mutator, Rng, load};
use common::ws::check;

const MUTATOR: Mutator = Mutator {
    bytes: b" \t\r\n{}[]\":,\\0123456789-.eEtfnu\x00\x7f\xc3\xa9\xff",
    chunks: &[
        b"\"op\":\"pub\",",
        b"\"op\":\"sub\",",
        b"\"op\":\"snapshot.put\",",
        b"\"subject\":\"a.b\",",
        b"\"pattern\":\"a/+\",",
        b"\"data\":",
        b"\"data_b64\":\"",
        b"\"headers\":{\"A\":\"1\"},",
        b"\"headers\":{\"A\":1}",
        b"\"id\":\"x\",",
        b"\"sid\":",
        b"\"version\":",
        b"\"bogus\":0,",
        b"null",
        b"true",
        b"4294967296",
        b"18446744073709551616",
        b"-1",
        b"1.5",
        b"\\u00e9",
        b"\\ud800",
        b"\\\"",
        b"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    ],
    // No bit flips: they mostly turn a key into an unknown field, which the other mutations
    // reach often enough.
    mutations: &[
        Mutation::ReplaceByte,
        Mutation::InsertByte,
        Mutation::Remove,
        Mutation::Duplicate,
        Mutation::Crossover,
        Mutation::InsertChunk,
        Mutation::Append,
    ],
};

/// Field names and values a structured mutant draws from: every field, right and wrong types.
const KEYS: &[&str] = &[
    "id",
    "pattern",
    "sid",
    "subject",
    "data",
    "data_b64",
    "headers",
    "expect_version",
    "msg_id",
    "version",
    "from_offset",
    "from_version",
    "from_time_ms",
    "max",
    "after",
    "from_snapshot",
    "bogus",
];
const VALUES: &[&str] = &[
    "null",
    "true",
    "0",
    "7",
    "-1",
    "1.5",
    "4294967296",
    "\"\"",
    "\"a.b\"",
    "\"aGk=\"",
    "\"caf\\u00e9 \\ud83c\\udf32\"",
    "{}",
    "{\"A\":\"1\",\"Content-Type\":\"application/json\"}",
    "{\"A\":1}",
    "{\"a b\":\"1\"}",
    "[1,{\"x\":2}]",
];
const OPS: &[&str] = &[
    "sub",
    "unsub",
    "pub",
    "get",
    "replay",
    "subjects",
    "snapshot.get",
    "snapshot.put",
    "fly",
];

/// A seed changed field by field (a key removed, a field set, the op changed), so that
/// most mutants are requests and the ops' rules are what gets exercised.
fn structured(rng: &mut Rng, corpus: &[Vec<u8>]) -> Option<String> {
    let serde_json::Value::Object(mut map) =
        serde_json::from_slice::<serde_json::Value>(rng.pick(corpus).as_slice()).ok()?
    else {
        return None;
    };
    for _ in 0..1 + rng.below(3) {
        match rng.below(3) {
            0 => {
                let keys: Vec<String> = map.keys().cloned().collect();
                if !keys.is_empty() {
                    map.remove(&keys[rng.below(keys.len())]);
                }
            }
            1 => {
                let text = rng.pick::<&str>(VALUES);
                let value: serde_json::Value = serde_json::from_str(text).expect("a JSON value");
                map.insert((*rng.pick(KEYS)).to_owned(), value);
            }
            _ => {
                map.insert("op".to_owned(), (*rng.pick(OPS)).into());
            }
        }
    }
    Some(serde_json::Value::Object(map).to_string())
}

/// The name of an outcome, for counting.
fn outcome_name(kind: Option<WsErrorKind>) -> &'static str {
    match kind {
        None => "ok",
        Some(WsErrorKind::NotText) => "not_text",
        Some(WsErrorKind::TooLarge { .. }) => "too_large",
        Some(WsErrorKind::NotJson) => "not_json",
        Some(WsErrorKind::NotAnObject) => "not_an_object",
        Some(WsErrorKind::UnknownField) => "unknown_field",
        Some(WsErrorKind::DuplicateField { .. }) => "duplicate_field",
        Some(WsErrorKind::WrongType { .. }) => "wrong_type",
        Some(WsErrorKind::MissingField { .. }) => "missing_field",
        Some(WsErrorKind::MissingOneOf { .. }) => "missing_one_of",
        Some(WsErrorKind::Exclusive { .. }) => "exclusive",
        Some(WsErrorKind::UnknownOp) => "unknown_op",
        Some(WsErrorKind::BadBase64) => "bad_base64",
        Some(WsErrorKind::BadHeaderName) => "bad_header_name",
        Some(WsErrorKind::PayloadTooLarge { .. }) => "payload_too_large",
    }
}

fn run(text: &str, counts: &mut BTreeMap<&'static str, usize>) {
    let kind = check(text).err().map(|e| e.kind);
    *counts.entry(outcome_name(kind)).or_default() += 1;
}

#[test]
fn client_corpus_and_mutations() {
    let corpus = load("ws_client");
    let mut seeds = BTreeMap::new();
    for file in &corpus {
        let text = std::str::from_utf8(file).expect("seeds are UTF-8");
        run(text, &mut seeds);
    }
    // Every outcome a text can have is seeded.
    for name in [
        "ok",
        "too_large",
        "not_json",
        "not_an_object",
        "unknown_field",
        "duplicate_field",
        "wrong_type",
        "missing_field",
        "missing_one_of",
        "exclusive",
        "unknown_op",
        "bad_base64",
        "bad_header_name",
        "payload_too_large",
    ] {
        assert!(seeds.contains_key(name), "no seed gives {name}: {seeds:?}");
    }

    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut mutants = BTreeMap::new();
    for i in 0..MUTANTS {
        if i % 2 == 1
            && let Some(text) = structured(&mut rng, &corpus)
        {
            run(&text, &mut mutants);
            continue;
        }
        let input = MUTATOR.mutate(&mut rng, &corpus);
        // Bytes that are not UTF-8 never reach the decoder (a WebSocket text message is
        // UTF-8): read them as the replacement character instead of wasting the mutant.
        run(&String::from_utf8_lossy(&input), &mut mutants);
    }
    println!("seeds: {seeds:?}\nmutants: {mutants:?}");
    assert!(mutants["ok"] > MUTANTS / 20, "{mutants:?}");
    for (name, at_least) in [
        ("too_large", 50),
        ("not_json", 1000),
        ("unknown_field", 100),
        ("duplicate_field", 100),
        ("wrong_type", 100),
        ("missing_field", 100),
        ("unknown_op", 100),
        ("bad_base64", 50),
        ("payload_too_large", 50),
        ("exclusive", 50),
        ("missing_one_of", 50),
        ("bad_header_name", 20),
        ("not_an_object", 100),
    ] {
        let n = mutants.get(name).copied().unwrap_or(0);
        assert!(n >= at_least, "{name}: {n} < {at_least} in {mutants:?}");
    }
}

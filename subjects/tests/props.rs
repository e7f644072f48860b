//! Property tests of canopy-subjects against small, separate models.
//!
//! Owns the executable statement of the escaping rule (a second, byte-level implementation),
//! a naive string-level MQTT matcher, and the naive model of the trie. Must never reuse the
//! crate's private code to check the crate: each model is written here from the spec.

use canopy_subjects::{Pattern, SharedTrie, Subject, Trie};
use proptest::prelude::*;

// ---------------------------------------------------------------- the rule, byte by byte

fn is_uhex(b: u8) -> bool {
    b.is_ascii_digit() || (b'A'..=b'F').contains(&b)
}

fn hex_pair(raw: &[u8], i: usize) -> bool {
    raw.len() >= i + 2 && is_uhex(raw[i]) && is_uhex(raw[i + 1])
}

fn push_esc(out: &mut Vec<u8>, b: u8) {
    out.extend_from_slice(format!("%{b:02X}").as_bytes());
}

fn enc_native(raw: &[u8]) -> Vec<u8> {
    match raw {
        b"" => return b"%".to_vec(),
        b"*" => return b"%2A".to_vec(),
        b">" => return b"%3E".to_vec(),
        b"%" => return b"%25".to_vec(),
        _ => {}
    }
    let mut out = Vec::new();
    for (i, &c) in raw.iter().enumerate() {
        if c == b'.' || c <= 0x20 || c == 0x7F || (c == b'%' && hex_pair(raw, i + 1)) {
            push_esc(&mut out, c);
        } else {
            out.push(c);
        }
    }
    out
}

fn enc_mqtt(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, &c) in raw.iter().enumerate() {
        if matches!(c, b'/' | b'+' | b'#' | 0) || (c == b'%' && hex_pair(raw, i + 1)) {
            push_esc(&mut out, c);
        } else {
            out.push(c);
        }
    }
    out
}

fn dec(t: &[u8], native: bool) -> Vec<u8> {
    if native && t == b"%" {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < t.len() {
        if t[i] == b'%' && hex_pair(t, i + 1) {
            let v = u8::from_str_radix(std::str::from_utf8(&t[i + 1..i + 3]).unwrap_or("00"), 16);
            out.push(v.unwrap_or(0));
            i += 3;
        } else {
            out.push(t[i]);
            i += 1;
        }
    }
    out
}

/// The spec's definition of a valid native subject: decode, re-encode, compare, plus the
/// subject rules.
fn native_valid_spec(s: &str) -> bool {
    !s.is_empty()
        && s != "%"
        && s.split('.').all(|t| {
            let raw = dec(t.as_bytes(), true);
            !t.is_empty()
                && t != "*"
                && t != ">"
                && !t.bytes().any(|b| b <= 0x20 || b == 0x7F)
                && !raw.contains(&0)
                && enc_native(&raw) == t.as_bytes()
        })
}

fn mqtt_valid_spec(s: &str) -> bool {
    !s.is_empty()
        && !s.contains(['+', '#', '\0'])
        && s.split('/').all(|t| {
            let raw = dec(t.as_bytes(), false);
            !raw.contains(&0) && enc_mqtt(&raw) == t.as_bytes()
        })
}

fn join(tokens: &[Vec<u8>], sep: u8) -> String {
    let joined = tokens.join(&sep);
    String::from_utf8(joined).unwrap_or_default()
}

// ---------------------------------------------------------------- naive MQTT matcher

fn mqtt_match(filter: &str, topic: &str) -> bool {
    let f: Vec<&str> = filter.split('/').collect();
    let t: Vec<&str> = topic.split('/').collect();
    if topic.starts_with('$') && matches!(f.first(), Some(&"+") | Some(&"#")) {
        return false;
    }
    fn rec(f: &[&str], t: &[&str]) -> bool {
        match (f.first(), t.first()) {
            (None, None) => true,
            (Some(&"#"), _) => true,
            (Some(x), Some(y)) if *x == "+" || x == y => rec(&f[1..], &t[1..]),
            _ => false,
        }
    }
    rec(&f, &t)
}

// ---------------------------------------------------------------- generators

/// Raw tokens rich in the characters the rule cares about.
fn raw_token() -> impl Strategy<Value = Vec<u8>> {
    let chars = prop::sample::select(vec![
        b'.', b'/', b'+', b'#', b'*', b'>', b'%', b' ', b'A', b'0', b'$', b'2', b'5', b'F', b'a',
        b'\t',
    ]);
    prop::collection::vec(chars, 0..5)
}

fn raw_subject() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(raw_token(), 1..6)
        .prop_filter("MQTT has no empty topic", |t| t != &[Vec::<u8>::new()])
}

/// Arbitrary text in either syntax, to check validity against the spec's definition.
fn rendered_text() -> impl Strategy<Value = String> {
    let chars = prop::sample::select(vec![
        '.', '/', '+', '#', '*', '>', '%', ' ', 'A', 'E', 'F', '0', '2', '5', '3', 'a', '$', 'é',
    ]);
    prop::collection::vec(chars, 0..12).prop_map(|v| v.into_iter().collect())
}

/// Small raw tokens so that literal tokens often collide.
fn small_token() -> impl Strategy<Value = Vec<u8>> {
    prop::sample::select(vec![
        b"a".to_vec(),
        b"b".to_vec(),
        b"".to_vec(),
        b"$".to_vec(),
        b"*".to_vec(),
        b">".to_vec(),
        b"#".to_vec(),
        b"a.b".to_vec(),
        b"%".to_vec(),
    ])
}

#[derive(Clone, Debug)]
enum PTok {
    Lit(Vec<u8>),
    One,
}

#[derive(Clone, Debug)]
enum Tail {
    None,
    OneOrMore,
    ZeroOrMore,
}

fn pattern_parts() -> impl Strategy<Value = (Vec<PTok>, Tail)> {
    let tok = prop_oneof![3 => small_token().prop_map(PTok::Lit), 1 => Just(PTok::One)];
    let tail =
        prop_oneof![2 => Just(Tail::None), 1 => Just(Tail::OneOrMore), 1 => Just(Tail::ZeroOrMore)];
    (prop::collection::vec(tok, 0..4), tail).prop_filter("non-empty", |(t, tail)| {
        matches!(tail, Tail::OneOrMore | Tail::ZeroOrMore)
            || !(t.is_empty() || matches!(&t[..], [PTok::Lit(raw)] if raw.is_empty()))
    })
}

/// The pattern in MQTT syntax (always expressible).
fn filter_of((toks, tail): &(Vec<PTok>, Tail)) -> String {
    let mut levels: Vec<Vec<u8>> = toks
        .iter()
        .map(|t| match t {
            PTok::Lit(raw) => enc_mqtt(raw),
            PTok::One => b"+".to_vec(),
        })
        .collect();
    match tail {
        Tail::None => {}
        Tail::OneOrMore => levels.extend([b"+".to_vec(), b"#".to_vec()]),
        Tail::ZeroOrMore => levels.push(b"#".to_vec()),
    }
    join(&levels, b'/')
}

/// The pattern in native syntax, when it has one.
fn native_of((toks, tail): &(Vec<PTok>, Tail)) -> Option<String> {
    let mut tokens: Vec<Vec<u8>> = toks
        .iter()
        .map(|t| match t {
            PTok::Lit(raw) => enc_native(raw),
            PTok::One => b"*".to_vec(),
        })
        .collect();
    match tail {
        Tail::None => {}
        Tail::OneOrMore => tokens.push(b">".to_vec()),
        Tail::ZeroOrMore => return None,
    }
    Some(join(&tokens, b'.'))
}

fn small_subject() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(small_token(), 1..6)
        .prop_filter("MQTT has no empty topic", |t| t != &[Vec::<u8>::new()])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn raw_subjects_round_trip(raw in raw_subject()) {
        let native = join(&raw.iter().map(|t| enc_native(t)).collect::<Vec<_>>(), b'.');
        let mqtt = join(&raw.iter().map(|t| enc_mqtt(t)).collect::<Vec<_>>(), b'/');
        let from_native = Subject::parse_native(&native);
        prop_assert!(from_native.is_ok(), "{native:?}: {from_native:?}");
        let from_mqtt = Subject::parse_mqtt(&mqtt);
        prop_assert!(from_mqtt.is_ok(), "{mqtt:?}: {from_mqtt:?}");
        if let (Ok(n), Ok(m)) = (from_native, from_mqtt) {
            prop_assert_eq!(n.as_str(), native.as_str());
            prop_assert_eq!(n.to_mqtt(), mqtt.clone());
            prop_assert_eq!(m.as_str(), native.as_str());
            prop_assert_eq!(m.to_mqtt(), mqtt);
            prop_assert_eq!(n.tokens().count(), raw.len());
        }
    }

    #[test]
    fn validity_is_decode_encode_compare(s in rendered_text()) {
        let native = Subject::parse_native(&s);
        prop_assert_eq!(native.is_ok(), native_valid_spec(&s), "native {:?}: {:?}", s, native);
        if let Ok(n) = native {
            let back = Subject::parse_mqtt(&n.to_mqtt());
            prop_assert_eq!(back.map(|b| b.as_str().to_owned()), Ok(s.clone()));
        }
        let mqtt = Subject::parse_mqtt(&s);
        prop_assert_eq!(mqtt.is_ok(), mqtt_valid_spec(&s), "mqtt {:?}: {:?}", s, mqtt);
        if let Ok(m) = mqtt {
            prop_assert_eq!(m.to_mqtt(), s.clone());
            let back = Subject::parse_native(m.as_str());
            prop_assert_eq!(back.map(|b| b.to_mqtt()), Ok(s));
        }
    }

    #[test]
    fn matching_agrees_across_renderings(parts in pattern_parts(), raw in small_subject()) {
        let topic = join(&raw.iter().map(|t| enc_mqtt(t)).collect::<Vec<_>>(), b'/');
        let subject = Subject::parse_mqtt(&topic);
        prop_assert!(subject.is_ok(), "{topic:?}");
        let Ok(subject) = subject else { return Ok(()) };
        let filter = filter_of(&parts);
        let expected = mqtt_match(&filter, &topic);
        let from_mqtt = Pattern::parse_mqtt(&filter);
        prop_assert!(from_mqtt.is_ok(), "{filter:?}: {from_mqtt:?}");
        let Ok(from_mqtt) = from_mqtt else { return Ok(()) };
        prop_assert_eq!(from_mqtt.matches(&subject), expected, "filter {:?} topic {:?}", filter, topic);
        prop_assert_eq!(from_mqtt.to_mqtt(), filter.clone());
        if let Some(native) = native_of(&parts) {
            let from_native = Pattern::parse_native(&native);
            prop_assert!(from_native.is_ok(), "{native:?}: {from_native:?}");
            let Ok(from_native) = from_native else { return Ok(()) };
            prop_assert_eq!(&from_native, &from_mqtt);
            prop_assert_eq!(from_native.to_native(), Some(native.clone()));
            prop_assert_eq!(from_native.matches(&subject), expected, "pattern {:?} subject {}", native, subject);
            prop_assert_eq!(mqtt_match(&from_native.to_mqtt(), &subject.to_mqtt()), expected);
        } else if let Some(native) = from_mqtt.to_native() {
            // A filter ending in `+/#` means "one or more": the native `>`.
            prop_assert!(native.ends_with('>'), "{native}");
            let back = Pattern::parse_native(&native);
            prop_assert_eq!(back.map(|b| b.matches(&subject)), Ok(expected));
        } else {
            prop_assert!(from_mqtt.tokens().contains(&canopy_subjects::PatternToken::ZeroOrMore));
        }
    }
}

// ---------------------------------------------------------------- trie against a model

#[derive(Clone, Debug)]
enum Op {
    Insert(usize, Option<u8>, u8),
    Remove(usize, Option<u8>, u8),
    Match(Vec<Vec<u8>>),
}

fn ops() -> impl Strategy<Value = (Vec<(Vec<PTok>, Tail)>, Vec<Op>)> {
    let op = prop_oneof![
        3 => (0..12usize, prop::option::of(0..2u8), 0..4u8).prop_map(|(p, q, v)| Op::Insert(p, q, v)),
        2 => (0..12usize, prop::option::of(0..2u8), 0..4u8).prop_map(|(p, q, v)| Op::Remove(p, q, v)),
        3 => small_subject().prop_map(Op::Match),
    ];
    (
        prop::collection::vec(pattern_parts(), 12),
        prop::collection::vec(op, 1..80),
    )
}

type Hit = (Option<String>, u8);

fn collect(
    visit_with: impl FnOnce(&mut dyn FnMut(&[u8], &[canopy_subjects::QueueGroup<u8>])),
) -> Vec<Hit> {
    let mut out = Vec::new();
    visit_with(&mut |plain, queues| {
        out.extend(plain.iter().map(|&v| (None, v)));
        for q in queues {
            out.extend(q.members.iter().map(|&v| (Some(q.name.to_string()), v)));
        }
    });
    out.sort();
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn trie_agrees_with_naive_model((parts, ops) in ops()) {
        let patterns: Vec<Pattern> = parts
            .iter()
            .filter_map(|p| Pattern::parse_mqtt(&filter_of(p)).ok())
            .collect();
        prop_assert_eq!(patterns.len(), parts.len());
        let mut trie = Trie::new();
        let shared = SharedTrie::new();
        let mut model: Vec<(Pattern, Option<String>, u8)> = Vec::new();
        let name = |q: Option<u8>| q.map(|q| format!("q{q}"));
        for op in ops {
            match op {
                Op::Insert(p, q, v) => {
                    let q = name(q);
                    trie.insert(&patterns[p], q.as_deref(), v);
                    shared.insert(&patterns[p], q.as_deref(), v);
                    model.push((patterns[p].clone(), q, v));
                }
                Op::Remove(p, q, v) => {
                    let q = name(q);
                    let at = model.iter().position(|(mp, mq, mv)| *mp == patterns[p] && *mq == q && *mv == v);
                    if let Some(at) = at {
                        model.remove(at);
                    }
                    prop_assert_eq!(trie.remove(&patterns[p], q.as_deref(), &v), at.is_some());
                    prop_assert_eq!(shared.remove(&patterns[p], q.as_deref(), &v), at.is_some());
                }
                Op::Match(raw) => {
                    let topic = join(&raw.iter().map(|t| enc_mqtt(t)).collect::<Vec<_>>(), b'/');
                    let Ok(subject) = Subject::parse_mqtt(&topic) else {
                        return Err(TestCaseError::fail(format!("bad topic {topic:?}")));
                    };
                    let mut expected: Vec<Hit> = model
                        .iter()
                        .filter(|(p, _, _)| p.matches(&subject))
                        .map(|(_, q, v)| (q.clone(), *v))
                        .collect();
                    expected.sort();
                    let got = collect(|f| trie.for_each_match(subject.as_str(), &mut |a, b| f(a, b)));
                    prop_assert_eq!(&got, &expected, "subject {}", subject);
                    let got = collect(|f| shared.for_each_match(subject.as_str(), &mut |a, b| f(a, b)));
                    prop_assert_eq!(&got, &expected, "shared, subject {}", subject);
                }
            }
            prop_assert_eq!(trie.len(), model.len());
            prop_assert_eq!(shared.len(), model.len());
        }
        for (p, q, v) in model.drain(..) {
            prop_assert!(trie.remove(&p, q.as_deref(), &v));
            prop_assert!(shared.remove(&p, q.as_deref(), &v));
        }
        prop_assert!(trie.is_empty());
        prop_assert_eq!(trie.node_count(), 1);
        prop_assert_eq!(shared.node_count(), 1);
    }
}

//! A stream's config as JetStream clients send it (`STREAM.CREATE`'s body), checked
//! against what Canopy can honour and normalised to the full config its info
//! reports, so the same request twice compares equal (creates are idempotent).
//!
//! Honoured: the name, the subject filters, `max_msgs_per_subject` (versions kept per
//! subject), `max_age` (a KV bucket's TTL: retention removes older messages of the
//! stream's subjects, and gets no longer find them), `max_msg_size` (a KV bucket's
//! `max_value_size`: a larger publish to its subjects is refused). Kept and reported as given: `discard`, `duplicate_window`, the
//! `deny_*`/`allow_*` flags, `description`, `metadata`, `compression` (Canopy's store
//! compresses anyway). Refused, each with the setting named: retention other than
//! `limits`, memory storage, stream-wide message and byte limits,
//! mirrors, sources, transforms, republishing, sealing, per-message TTLs, more than one
//! replica (as a nats-server outside a cluster refuses it).
//! Must never accept a setting that would change what is kept and then drop it.

use serde_json::{Map, Value, json};

/// Subjects a stream may not hold: the server's own APIs and namespaces.
const RESERVED: [&str; 6] = [
    "$JS.API.>",
    "$JS.ACK.>",
    "$JSC.>",
    "$SYS.>",
    "$CANOPY.>",
    "$DLQ.>",
];
/// Filters one stream may have.
pub const MAX_SUBJECTS: usize = 256;
/// JetStream's default duplicate window: two minutes, in nanoseconds.
const DEFAULT_DUPLICATE_WINDOW_NS: i64 = 120_000_000_000;
/// The shortest `max_age` taken (nats-server's floor).
const MIN_MAX_AGE_NS: i64 = 100_000_000;
/// As nats-server bounds them.
const MAX_DESCRIPTION: usize = 4_096;
const MAX_METADATA: usize = 128 * 1_024;
const MAX_NAME: usize = 255;

/// A refused stream call, as nats-server words it: an HTTP-style code, the JetStream
/// error code clients match on, and a sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRefusal {
    pub code: u16,
    pub err_code: u32,
    pub description: String,
}

impl StreamRefusal {
    /// nats-server's "invalid stream config" (`JSStreamInvalidConfigF`: 500, with the
    /// reason as the description).
    pub fn invalid(description: impl Into<String>) -> Self {
        Self {
            code: 500,
            err_code: 10052,
            description: description.into(),
        }
    }

    /// A setting Canopy does not offer.
    fn unoffered(setting: &str, why: &str) -> Self {
        Self::invalid(format!("{setting} is not offered by Canopy: {why}"))
    }
}

/// Checks `body` (the config a `STREAM.CREATE.<name>` or `UPDATE` carries) and returns
/// it normalised: every field JetStream reports, defaults filled in.
pub fn normalise(name: &str, body: &Value) -> Result<Value, StreamRefusal> {
    let given = body.get("name").and_then(Value::as_str).unwrap_or_default();
    if !given.is_empty() && given != name {
        return Err(StreamRefusal {
            code: 400,
            err_code: 10056,
            description: "stream name in subject does not match request".into(),
        });
    }
    check_name(name)?;
    let int = |key: &str| body.get(key).and_then(Value::as_i64);
    let text = |key: &str| body.get(key).and_then(Value::as_str).unwrap_or_default();
    let flag = |key: &str| body.get(key).and_then(Value::as_bool).unwrap_or(false);
    refuse_unoffered(body)?;
    let subjects = subjects_of(name, body)?;
    let max_per_subject = int("max_msgs_per_subject").filter(|n| *n > 0).unwrap_or(-1);
    let max_msg_size = int("max_msg_size").filter(|n| *n > 0).unwrap_or(-1);
    let discard = match text("discard") {
        "" | "old" => "old",
        "new" => "new",
        other => {
            return Err(StreamRefusal::invalid(format!(
                "discard must be old or new, not {other}"
            )));
        }
    };
    if int("num_replicas").unwrap_or(1) > 1 {
        // What a nats-server outside a cluster answers: Canopy keeps one copy, in a
        // store that is itself durable (a synced disk, or object storage).
        return Err(StreamRefusal {
            code: 500,
            err_code: 10074,
            description: "replicas > 1 not supported in non-clustered mode".into(),
        });
    }
    let max_age = match int("max_age") {
        Some(ns) if ns < 0 => {
            return Err(StreamRefusal::invalid("max age can not be negative"));
        }
        Some(ns) if ns > 0 && ns < MIN_MAX_AGE_NS => {
            return Err(StreamRefusal::invalid("max age needs to be >= 100ms"));
        }
        Some(ns) => ns,
        None => 0,
    };
    // nats-server's default: two minutes, or the age when that is shorter.
    let duplicate_window = match int("duplicate_window") {
        Some(ns) if ns > 0 => ns,
        _ if max_age > 0 => DEFAULT_DUPLICATE_WINDOW_NS.min(max_age),
        _ => DEFAULT_DUPLICATE_WINDOW_NS,
    };
    let compression = match text("compression") {
        "" | "none" => "none",
        "s2" => "s2",
        other => {
            return Err(StreamRefusal::invalid(format!(
                "compression must be none or s2, not {other}"
            )));
        }
    };
    let description = text("description");
    if description.len() > MAX_DESCRIPTION {
        return Err(StreamRefusal::invalid(format!(
            "stream description is too long, maximum allowed is {MAX_DESCRIPTION}"
        )));
    }
    let mut config = json!({
        "name": name,
        "subjects": subjects,
        "retention": "limits",
        "max_consumers": -1,
        "max_msgs": -1,
        "max_bytes": -1,
        "max_age": max_age,
        "max_msgs_per_subject": max_per_subject,
        "max_msg_size": max_msg_size,
        "discard": discard,
        "storage": "file",
        "num_replicas": 1,
        "duplicate_window": duplicate_window,
        "compression": compression,
        "sealed": false,
        "deny_delete": flag("deny_delete"),
        "deny_purge": flag("deny_purge"),
        "allow_rollup_hdrs": flag("allow_rollup_hdrs"),
        "allow_direct": flag("allow_direct"),
        "mirror_direct": false,
        "discard_new_per_subject": false,
        "allow_msg_ttl": flag("allow_msg_ttl"),
        "consumer_limits": {},
    });
    if !description.is_empty() {
        config["description"] = json!(description);
    }
    if let Some(metadata) = metadata_of(body)? {
        config["metadata"] = Value::Object(metadata);
    }
    Ok(config)
}

/// nats-server's name rules: not empty, no whitespace, no `.`, `*`, `>`, no path
/// separators.
fn check_name(name: &str) -> Result<(), StreamRefusal> {
    if name.is_empty() {
        return Err(StreamRefusal::invalid("stream name is required"));
    }
    let bad = |c: char| c.is_whitespace() || matches!(c, '.' | '*' | '>' | '/' | '\\');
    if name.len() > MAX_NAME || name.chars().any(bad) {
        return Err(StreamRefusal::invalid(
            "stream name is invalid: no spaces, dots, wildcards or path separators",
        ));
    }
    Ok(())
}

/// The settings Canopy cannot honour, refused by name.
fn refuse_unoffered(body: &Value) -> Result<(), StreamRefusal> {
    let int = |key: &str| body.get(key).and_then(Value::as_i64).unwrap_or(0);
    let text = |key: &str| body.get(key).and_then(Value::as_str).unwrap_or_default();
    let set = |key: &str| body.get(key).is_some_and(|v| !v.is_null());
    match text("retention") {
        "" | "limits" => {}
        other => {
            return Err(StreamRefusal::unoffered(
                &format!("retention {other}"),
                "a stream keeps every subject's versions until its limits drop them; \
                 consumer groups track what was processed",
            ));
        }
    }
    if text("storage") == "memory" {
        return Err(StreamRefusal::unoffered(
            "memory storage",
            "a stream's subjects are stored; a store policy with store = false keeps \
             subjects live only",
        ));
    }
    for (key, why) in [
        (
            "max_msgs",
            "limit the versions per subject (max_msgs_per_subject)",
        ),
        (
            "max_bytes",
            "the tenant's stored bytes limit bounds a tenant",
        ),
        ("first_seq", "offsets are the tenant's"),
    ] {
        if int(key) > 0 {
            return Err(StreamRefusal::unoffered(key, why));
        }
    }
    for key in [
        "mirror",
        "sources",
        "subject_transform",
        "republish",
        "placement",
        "consumer_limits",
    ] {
        let empty = match body.get(key) {
            Some(Value::Array(list)) => list.is_empty(),
            Some(Value::Object(map)) => map.is_empty(),
            _ => !set(key),
        };
        if !empty {
            return Err(StreamRefusal::unoffered(
                key,
                "each subject is its own stream",
            ));
        }
    }
    // `allow_msg_ttl` is taken (nats-py's KV buckets ask for it): a publish that
    // carries a `Nats-TTL` is refused instead.
    for key in [
        "sealed",
        "mirror_direct",
        "discard_new_per_subject",
        "allow_msg_counter",
        "allow_atomic",
        "allow_msg_schedules",
        "no_ack",
    ] {
        if body.get(key).and_then(Value::as_bool) == Some(true) {
            return Err(StreamRefusal::unoffered(key, "not built yet"));
        }
    }
    if int("max_consumers") > 0 {
        return Err(StreamRefusal::unoffered(
            "max_consumers",
            "the tenant's limit on consumer groups applies",
        ));
    }
    Ok(())
}

/// The stream's filters: valid native patterns, none twice, none in a reserved
/// namespace; the stream's name when none is given (as nats-server does).
fn subjects_of(name: &str, body: &Value) -> Result<Vec<String>, StreamRefusal> {
    let mut subjects: Vec<String> = match body.get("subjects") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .map(|s| {
                s.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| StreamRefusal::invalid("subjects must be strings"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(StreamRefusal::invalid("subjects must be a list")),
    };
    if subjects.is_empty() {
        subjects.push(name.to_owned());
    }
    if subjects.len() > MAX_SUBJECTS {
        return Err(StreamRefusal::invalid(format!(
            "a stream has at most {MAX_SUBJECTS} subjects"
        )));
    }
    for (i, subject) in subjects.iter().enumerate() {
        canopy_subjects::Pattern::parse_native(subject).map_err(|error| {
            StreamRefusal::invalid(format!("invalid subject {subject:?}: {error}"))
        })?;
        if subjects[..i].contains(subject) {
            return Err(StreamRefusal::invalid("duplicate subjects detected"));
        }
        if let Some(reserved) = RESERVED
            .iter()
            .find(|r| super::filters::overlap(subject, r))
        {
            return Err(StreamRefusal::invalid(format!(
                "subjects that overlap with {reserved} are the server's own"
            )));
        }
    }
    Ok(subjects)
}

fn metadata_of(body: &Value) -> Result<Option<Map<String, Value>>, StreamRefusal> {
    let Some(metadata) = body.get("metadata").and_then(Value::as_object) else {
        return Ok(None);
    };
    // The server's own keys (`_nats.*`), which nats-server adds and ignores when it
    // compares configs.
    let metadata: Map<String, Value> = metadata
        .iter()
        .filter(|(key, _)| !key.starts_with("_nats."))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut bytes = 0;
    for (key, value) in &metadata {
        let Some(value) = value.as_str() else {
            return Err(StreamRefusal::invalid("metadata values must be strings"));
        };
        bytes += key.len() + value.len();
    }
    if bytes > MAX_METADATA {
        return Err(StreamRefusal::invalid(format!(
            "stream metadata exceeds maximum size of {MAX_METADATA} bytes"
        )));
    }
    Ok((!metadata.is_empty()).then_some(metadata))
}

/// The strings of a config's list field (`subjects`, `filter_subjects`); none when it
/// is missing or not a list, and its entries that are not strings are passed over.
pub fn strings_of(config: &Value, key: &str) -> Vec<String> {
    config
        .get(key)
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_request_twice_normalises_equal_and_defaults_are_filled_in() {
        let a = normalise(
            "ORDERS",
            &json!({"name": "ORDERS", "subjects": ["orders.>"]}),
        )
        .expect("valid");
        let b = normalise(
            "ORDERS",
            &json!({"name": "ORDERS", "subjects": ["orders.>"], "retention": "limits",
                    "storage": "file", "num_replicas": 1, "max_msgs": -1}),
        )
        .expect("valid");
        assert_eq!(a, b);
        assert_eq!(a["duplicate_window"], DEFAULT_DUPLICATE_WINDOW_NS);
        assert_eq!(a["max_msgs_per_subject"], -1);
        let named = normalise("cfg", &json!({})).expect("valid");
        assert_eq!(named["subjects"], json!(["cfg"]));
    }

    #[test]
    fn settings_canopy_cannot_honour_are_refused_by_name() {
        for (body, names) in [
            (json!({"retention": "workqueue"}), "retention workqueue"),
            (json!({"storage": "memory"}), "memory storage"),
            (json!({"max_msgs": 10}), "max_msgs"),
            (json!({"mirror": {"name": "X"}}), "mirror"),
            (json!({"sources": [{"name": "X"}]}), "sources"),
            (json!({"sealed": true}), "sealed"),
        ] {
            let refusal = normalise("S", &body).expect_err("refused");
            assert_eq!((refusal.code, refusal.err_code), (500, 10052));
            assert!(
                refusal.description.contains(names),
                "{names}: {}",
                refusal.description
            );
        }
    }

    #[test]
    fn names_and_subjects_are_held_to_nats_servers_rules() {
        assert!(normalise("a.b", &json!({})).is_err());
        assert!(normalise("a b", &json!({})).is_err());
        assert_eq!(
            normalise("A", &json!({"name": "B"}))
                .expect_err("mismatch")
                .err_code,
            10056
        );
        assert!(normalise("A", &json!({"subjects": ["a.>", "a.>"]})).is_err());
        assert!(normalise("A", &json!({"subjects": ["a..b"]})).is_err());
        assert!(normalise("A", &json!({"subjects": ["$JS.API.>"]})).is_err());
        assert!(normalise("A", &json!({"subjects": ["$JS.>"]})).is_err());
        assert!(normalise("A", &json!({"subjects": [">"]})).is_ok());
        assert!(normalise("A", &json!({"subjects": ["$KV.cfg.>"]})).is_ok());
        assert_eq!(
            normalise("A", &json!({"num_replicas": 3}))
                .expect_err("one copy")
                .err_code,
            10074
        );
        assert!(normalise("A", &json!({"num_replicas": 0, "consumer_limits": null})).is_ok());
        let many: Vec<String> = (0..=MAX_SUBJECTS).map(|i| format!("s.{i}")).collect();
        assert!(normalise("A", &json!({"subjects": many})).is_err());
        assert!(normalise("A", &json!({"subjects": ["$DLQ.>"]})).is_err());
        assert!(normalise("A", &json!({"no_ack": true})).is_err());
        // nats-py's KV buckets ask for it; a publish with Nats-TTL is refused instead.
        let ttl = normalise("A", &json!({"allow_msg_ttl": true})).expect("taken");
        assert_eq!(ttl["allow_msg_ttl"], true);
    }
}

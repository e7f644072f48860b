//! A tenant's bindings as an AsyncAPI 3.0 document: each bound pattern a channel
//! (each `*` and `>` a channel parameter), each schema its message's payload, and a
//! send and a receive operation per channel where the rules given allow them.
//!
//! Pure: it describes what it is handed (bindings, the server's addresses, a rule
//! check) and must never read the store or the network.

use std::collections::HashSet;

use canopy_subjects::PatternToken;
use serde_json::{Map, Value, json};

use super::Binding;

/// One listener the document names under `servers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    /// Its key under `servers` (`nats`, `mqtt`, `ws`).
    pub name: &'static str,
    /// AsyncAPI's protocol name (`nats`, `mqtt`, `ws`, `wss`, `mqtts`).
    pub protocol: &'static str,
    /// `host:port`.
    pub host: String,
    pub pathname: Option<&'static str>,
}

/// What a reader may do with a channel's subjects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Send,
    Receive,
}

/// The parameter a wildcard at (0-based) position `at` becomes.
fn parameter_name(token: &PatternToken, at: usize) -> String {
    match token {
        PatternToken::OneOrMore | PatternToken::ZeroOrMore => "rest".to_owned(),
        _ => format!("token{}", at + 1),
    }
}

/// A channel key AsyncAPI accepts (`[A-Za-z0-9_-]`), unique within `taken`.
fn channel_id(binding: &Binding, taken: &mut HashSet<String>) -> String {
    let mut id = String::new();
    for (i, token) in binding.parsed.tokens().iter().enumerate() {
        if i > 0 {
            id.push('_');
        }
        match token {
            PatternToken::Literal(text) => id.extend(text.chars().map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })),
            PatternToken::One => id.push_str("any"),
            PatternToken::OneOrMore | PatternToken::ZeroOrMore => id.push_str("rest"),
        }
    }
    let mut unique = id.clone();
    let mut n = 2;
    while !taken.insert(unique.clone()) {
        unique = format!("{id}_{n}");
        n += 1;
    }
    unique
}

/// The payload as AsyncAPI takes it: AsyncAPI's own schema object is a superset of
/// draft 7, so a draft 7 schema (or one naming no draft) goes in as it is; any other
/// draft goes in a multi-format schema naming it.
fn payload(schema: &Value) -> Value {
    match schema.get("$schema").and_then(Value::as_str) {
        None => schema.clone(),
        Some(draft) if draft.contains("draft-07") => schema.clone(),
        Some(draft) => {
            let version = draft
                .trim_end_matches('#')
                .trim_end_matches("/schema")
                .rsplit('/')
                .next()
                .unwrap_or("2020-12");
            json!({
                "schemaFormat": format!("application/schema+json;version={version}"),
                "schema": schema,
            })
        }
    }
}

/// The document for `tenant`'s `bindings`. `may` answers whether the reader may
/// send to, or receive from, a pattern's subjects.
pub fn document(
    tenant: &str,
    bindings: &[std::sync::Arc<Binding>],
    listeners: &[Listener],
    may: impl Fn(Action, &str) -> bool,
) -> Value {
    let mut servers = Map::new();
    for listener in listeners {
        let mut server = json!({
            "host": listener.host,
            "protocol": listener.protocol,
        });
        if let Some(path) = listener.pathname {
            server["pathname"] = json!(path);
        }
        servers.insert(listener.name.to_owned(), server);
    }
    let mut channels = Map::new();
    let mut operations = Map::new();
    let mut taken = HashSet::new();
    for binding in bindings {
        let id = channel_id(binding, &mut taken);
        let mut address = Vec::new();
        let mut mqtt = Vec::new();
        let mut parameters = Map::new();
        for (at, token) in binding.parsed.tokens().iter().enumerate() {
            match token {
                PatternToken::Literal(text) => {
                    address.push(text.to_string());
                    mqtt.push(
                        canopy_subjects::Pattern::parse_native(text)
                            .map_or_else(|_| text.to_string(), |literal| literal.to_mqtt()),
                    );
                }
                wildcard => {
                    let name = parameter_name(wildcard, at);
                    let description = match wildcard {
                        PatternToken::One => format!("token {} of the subject", at + 1),
                        _ => format!(
                            "the rest of the subject from token {}, one token or more",
                            at + 1
                        ),
                    };
                    parameters.insert(name.clone(), json!({ "description": description }));
                    address.push(format!("{{{name}}}"));
                    mqtt.push(format!("{{{name}}}"));
                }
            }
        }
        let schema = binding.stored.schema.clone().unwrap_or(Value::Bool(true));
        let message = json!({
            "name": id,
            "title": format!("{} version {}", binding.pattern, binding.version),
            "contentType": "application/json",
            "payload": payload(&schema),
            "x-canopy-schema": binding.reference(),
        });
        let mut channel = json!({
            "address": address.join("."),
            "title": binding.pattern,
            "description": format!(
                "Subjects matching `{}`; each message is checked against version {} of \
                 its schema ({} compatibility; invalid messages are {}).",
                binding.pattern,
                binding.version,
                binding.stored.mode.as_str(),
                match binding.stored.on_invalid {
                    super::OnInvalid::Reject => "refused".to_owned(),
                    super::OnInvalid::DeadLetter =>
                        format!("kept under {}", binding.dead_letter_subject("<subject>")),
                }
            ),
            "messages": { id.clone(): message },
            "x-canopy-pattern": binding.pattern,
            "x-canopy-mqtt-topic": mqtt.join("/"),
        });
        if !parameters.is_empty() {
            channel["parameters"] = Value::Object(parameters);
        }
        for (action, verb) in [(Action::Send, "send"), (Action::Receive, "receive")] {
            if may(action, &binding.pattern) {
                operations.insert(
                    format!("{verb}_{id}"),
                    json!({
                        "action": verb,
                        "channel": { "$ref": format!("#/channels/{id}") },
                        "messages": [{ "$ref": format!("#/channels/{id}/messages/{id}") }],
                    }),
                );
            }
        }
        channels.insert(id, channel);
    }
    let revision: u64 = bindings.iter().map(|b| u64::from(b.version)).sum();
    json!({
        "asyncapi": "3.0.0",
        "info": {
            "title": format!("Canopy tenant {tenant}"),
            "version": format!("{}.{revision}", bindings.len()),
            "description": "The subjects of this tenant that have a JSON Schema bound, \
                            generated by Canopy from its schema bindings. Each `*` of a \
                            pattern is one token of a subject, `>` the rest of it; MQTT \
                            clients use the `x-canopy-mqtt-topic` form.",
        },
        "defaultContentType": "application/json",
        "servers": servers,
        "channels": channels,
        "operations": operations,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::schemas::{Mode, OnInvalid, StoredVersion};

    fn binding(pattern: &str, schema: Value) -> Arc<Binding> {
        let stored = StoredVersion {
            schema: Some(schema),
            mode: Mode::Backward,
            on_invalid: OnInvalid::Reject,
            dead_letter: None,
            time_ms: 0,
        };
        Arc::new(Binding::new(pattern, 3, stored).expect("compiles"))
    }

    #[test]
    fn wildcards_become_parameters_and_rules_choose_operations() {
        let bindings = [
            binding("devices.*.temp", json!({"type": "object"})),
            binding(
                "devices.>",
                json!({"$schema": "https://json-schema.org/draft/2020-12/schema"}),
            ),
        ];
        let listeners = [Listener {
            name: "nats",
            protocol: "nats",
            host: "127.0.0.1:4222".into(),
            pathname: None,
        }];
        let doc = document("default", &bindings, &listeners, |action, pattern| {
            action == Action::Receive || pattern == "devices.*.temp"
        });
        let temp = &doc["channels"]["devices_any_temp"];
        assert_eq!(temp["address"], "devices.{token2}.temp");
        assert_eq!(temp["x-canopy-mqtt-topic"], "devices/{token2}/temp");
        assert!(temp["parameters"]["token2"].is_object());
        assert_eq!(
            temp["messages"]["devices_any_temp"]["payload"],
            json!({"type": "object"})
        );
        let rest = &doc["channels"]["devices_rest"];
        assert_eq!(rest["address"], "devices.{rest}");
        assert_eq!(
            rest["messages"]["devices_rest"]["payload"]["schemaFormat"],
            "application/schema+json;version=2020-12"
        );
        let ops = doc["operations"].as_object().expect("operations");
        let mut names: Vec<_> = ops.keys().cloned().collect();
        names.sort();
        assert_eq!(
            names,
            [
                "receive_devices_any_temp",
                "receive_devices_rest",
                "send_devices_any_temp"
            ]
        );
        assert_eq!(doc["servers"]["nats"]["host"], "127.0.0.1:4222");
    }

    #[test]
    fn channel_ids_stay_unique() {
        let bindings = [
            binding("a.b-c", json!({})),
            binding("a.b_c", json!({})),
            binding("a.b%c", json!({})),
        ];
        let doc = document("t", &bindings, &[], |_, _| true);
        let channels = doc["channels"].as_object().expect("channels");
        assert_eq!(channels.len(), 3);
    }
}

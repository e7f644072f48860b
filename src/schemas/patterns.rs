//! The regular expressions of a JSON Schema (each `pattern`, each key of
//! `patternProperties`): found, checked and measured before the schema is compiled,
//! and the engine options the compiled validator runs them with.
//!
//! Every regex runs on the linear-time engine (the `regex` crate's), never a
//! backtracking one: a publish's cost is linear in its payload whatever the pattern
//! (issue 26: `^(a*)*\1$` on the backtracking engine cost 39 ms per 43-byte publish).
//! So a pattern that needs backtracking (backreferences, look-around) is refused
//! when the schema is put, naming the pattern, where it is and why, and so is one
//! that compiles past [`PATTERN_SIZE_LIMIT`]. What the compiled patterns of a schema
//! hold is measured, so a tenant's together can be bounded
//! ([`MAX_TENANT_REGEX_BYTES`]). Must never compile a pattern with an engine or
//! limits other than those [`options`] gives the validator.

use std::collections::HashSet;

use regex_automata::meta;
use serde_json::Value;

use super::SchemaError;

/// The most one pattern's compiled program (its Thompson NFA) may hold, in bytes:
/// the `regex` crate's `size_limit` (10 MiB by default). 1 MiB takes `^.{0,255}$`,
/// a 2,000-character base64 class or a domain name of ten 63-letter labels.
pub const PATTERN_SIZE_LIMIT: usize = 1 << 20;
/// The most one pattern's lazy DFA may cache, per thread that runs it: the `regex`
/// crate's `dfa_size_limit` (2 MiB by default). A pattern whose DFA would not fit
/// still runs, on the engine's slower linear-time fallback.
pub const PATTERN_DFA_LIMIT: usize = 256 << 10;
/// The most the compiled patterns of all of one tenant's bound schemas may hold
/// together, as the engine reports it (caches apart); a single schema's too.
pub const MAX_TENANT_REGEX_BYTES: usize = 32 << 20;

/// The options every schema is compiled with: the linear-time engine, with the
/// limits above.
pub fn options() -> jsonschema::PatternOptions<jsonschema::Regex> {
    jsonschema::PatternOptions::regex()
        .size_limit(PATTERN_SIZE_LIMIT)
        .dfa_size_limit(PATTERN_DFA_LIMIT)
}

/// What a schema's regular expressions cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cost {
    /// Distinct patterns.
    pub count: usize,
    /// Bytes their compiled forms hold.
    pub bytes: usize,
}

/// Checks every pattern of `schema` on the linear-time engine within
/// [`PATTERN_SIZE_LIMIT`], and measures them (each distinct pattern once, as the
/// validator compiles it once).
pub fn measure(schema: &Value) -> Result<Cost, SchemaError> {
    let mut found = Vec::new();
    collect(schema, &mut String::from("#"), &mut found);
    // A `$ref` may point anywhere in the document, a value's place included, and the
    // validator compiles what it points at: patterns there are measured too (counting
    // too much is safe), though one the engine cannot run is no error there (a data
    // value; were it referenced, the validator's own compile would refuse it).
    let mut elsewhere = Vec::new();
    collect_elsewhere(schema, &mut String::from("#"), &mut elsewhere);
    let mut seen = HashSet::new();
    let mut cost = Cost::default();
    for (at, pattern, in_schema) in found
        .into_iter()
        .map(|(at, p)| (at, p, true))
        .chain(elsewhere.into_iter().map(|(at, p)| (at, p, false)))
    {
        if !seen.insert(pattern) {
            continue;
        }
        let bytes = match compiled_size(pattern) {
            Ok(bytes) => bytes,
            Err(_) if !in_schema => continue,
            Err(why) => {
                return Err(SchemaError::Regex {
                    at: at.clone(),
                    pattern: shortened(pattern),
                    why,
                });
            }
        };
        cost.count += 1;
        cost.bytes += bytes;
        if cost.bytes > MAX_TENANT_REGEX_BYTES {
            return Err(SchemaError::Regex {
                at,
                pattern: shortened(pattern),
                why: format!(
                    "with it the schema's patterns compile to more than {MAX_TENANT_REGEX_BYTES} \
                     bytes, the most a tenant's schemas may hold together"
                ),
            });
        }
    }
    Ok(cost)
}

/// The bytes `pattern` compiles to, or why it cannot run on the linear-time engine.
fn compiled_size(pattern: &str) -> Result<usize, String> {
    // The validator's own translation from ECMA-262 (ASCII `\d`, `\w`, ...), so the
    // engine sees here what it sees there.
    let translated = jsonschema_regex::to_rust_regex(pattern)
        .map_err(|()| "it is not a valid ECMA-262 regular expression".to_owned())?;
    let config = meta::Config::new()
        .nfa_size_limit(Some(PATTERN_SIZE_LIMIT))
        .hybrid_cache_capacity(PATTERN_DFA_LIMIT);
    match meta::Regex::builder().configure(config).build(&translated) {
        Ok(regex) => Ok(regex.memory_usage()),
        Err(error) => Err(match (error.syntax_error(), error.size_limit()) {
            (Some(syntax), _) => {
                // The engine's message spans lines (the pattern, a caret); its
                // last line says what is wrong.
                let text = syntax.to_string();
                let what = text
                    .lines()
                    .last()
                    .unwrap_or_default()
                    .trim_start_matches("error: ");
                format!(
                    "{what}: patterns run on a linear-time engine, which has no \
                     backreferences or look-around"
                )
            }
            (None, Some(limit)) => format!(
                "it compiles to more than {limit} bytes, the most one pattern may \
                 (a bounded repetition such as `{{0,1000}}` is unrolled: `maxLength` \
                 bounds a length more cheaply)"
            ),
            (None, None) => format!("the linear-time engine refuses it: {error}"),
        }),
    }
}

/// A pattern as an error quotes it: a schema may hold one as long as itself.
fn shortened(pattern: &str) -> String {
    const MAX: usize = 200;
    match pattern.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &pattern[..cut]),
        None => pattern.to_owned(),
    }
}

/// Keywords whose value is one subschema.
const ONE: &[&str] = &[
    "additionalItems",
    "additionalProperties",
    "contains",
    "contentSchema",
    "else",
    "if",
    "items",
    "not",
    "propertyNames",
    "then",
    "unevaluatedItems",
    "unevaluatedProperties",
];
/// Keywords whose value is an array of subschemas.
const MANY: &[&str] = &["allOf", "anyOf", "items", "oneOf", "prefixItems"];
/// Keywords whose value maps names to subschemas.
const NAMED: &[&str] = &[
    "$defs",
    "definitions",
    "dependencies",
    "dependentSchemas",
    "patternProperties",
    "properties",
];

/// Every `(where, pattern)` of the (sub)schema `schema` at `at` (a JSON Pointer):
/// its `pattern`, its `patternProperties` keys, and those of the subschemas the
/// keywords above hold. Values (`enum`, `const`, `default`, `examples`) and keywords
/// the validator does not compile are not schemas, so are not looked into.
fn collect<'s>(schema: &'s Value, at: &mut String, found: &mut Vec<(String, &'s str)>) {
    let Value::Object(map) = schema else {
        return;
    };
    if let Some(Value::String(pattern)) = map.get("pattern") {
        found.push((format!("{at}/pattern"), pattern));
    }
    for (key, value) in map {
        let len = at.len();
        at.push('/');
        push_token(at, key);
        if NAMED.contains(&key.as_str())
            && let Value::Object(named) = value
        {
            for (name, sub) in named {
                let inner = at.len();
                at.push('/');
                push_token(at, name);
                if key == "patternProperties" {
                    found.push((at.clone(), name));
                }
                collect(sub, at, found);
                at.truncate(inner);
            }
        } else if MANY.contains(&key.as_str())
            && let Value::Array(items) = value
        {
            for (i, sub) in items.iter().enumerate() {
                let inner = at.len();
                at.push('/');
                at.push_str(&i.to_string());
                collect(sub, at, found);
                at.truncate(inner);
            }
        } else if ONE.contains(&key.as_str()) {
            collect(value, at, found);
        }
        at.truncate(len);
    }
}

/// Every `(where, text)` that could be compiled as a pattern were a `$ref` to point at
/// it: each string under a `pattern` key and each key of a `patternProperties`
/// object, anywhere in the document.
fn collect_elsewhere<'s>(value: &'s Value, at: &mut String, found: &mut Vec<(String, &'s str)>) {
    match value {
        Value::Object(map) => {
            for (key, sub) in map {
                let len = at.len();
                at.push('/');
                push_token(at, key);
                match (key.as_str(), sub) {
                    ("pattern", Value::String(pattern)) => found.push((at.clone(), pattern)),
                    ("patternProperties", Value::Object(named)) => {
                        found.extend(named.keys().map(|name| (at.clone(), name.as_str())));
                    }
                    _ => {}
                }
                collect_elsewhere(sub, at, found);
                at.truncate(len);
            }
        }
        Value::Array(items) => {
            for (i, sub) in items.iter().enumerate() {
                let len = at.len();
                at.push('/');
                at.push_str(&i.to_string());
                collect_elsewhere(sub, at, found);
                at.truncate(len);
            }
        }
        _ => {}
    }
}

/// `token` as one JSON Pointer token (`~` and `/` escaped).
fn push_token(at: &mut String, token: &str) {
    for c in token.chars() {
        match c {
            '~' => at.push_str("~0"),
            '/' => at.push_str("~1"),
            c => at.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn patterns_a_ref_can_reach_are_measured_wherever_they_are() {
        // The validator compiles what `$ref` points at, a value's place included.
        let hidden = json!({
            "default": {"pattern": "^.{0,255}a$"},
            "x-more": [{"patternProperties": {"^b+$": {}}}],
            "examples": [{"pattern": "(?=not-a-schema)"}],
            "$ref": "#/default"
        });
        let cost = measure(&hidden).expect("data patterns are measured, not refused");
        assert_eq!(cost.count, 2, "{cost:?}");
        assert!(cost.bytes > 0);
    }

    fn refusal(schema: Value) -> (String, String, String) {
        match measure(&schema) {
            Err(SchemaError::Regex { at, pattern, why }) => (at, pattern, why),
            other => panic!("{schema}: expected a refused pattern, got {other:?}"),
        }
    }

    #[test]
    fn backreferences_and_look_around_are_refused_where_they_are() {
        let (at, pattern, why) = refusal(json!({"properties": {"a": {"pattern": r"^(a*)*\1$"}}}));
        assert_eq!(at, "#/properties/a/pattern");
        assert_eq!(pattern, r"^(a*)*\1$");
        assert!(why.starts_with("backreferences are not supported"), "{why}");
        let (at, _, why) = refusal(json!({"items": {"patternProperties": {"^(?=x)a/b$": {}}}}));
        assert_eq!(at, "#/items/patternProperties/^(?=x)a~1b$");
        assert!(why.contains("look-around"), "{why}");
        let (at, _, _) = refusal(json!({"$defs": {"d": {"anyOf": [{}, {"pattern": "(?<!x)y"}]}}}));
        assert_eq!(at, "#/$defs/d/anyOf/1/pattern");
        let (_, _, why) = refusal(json!({"pattern": "["}));
        assert!(why.contains("not a valid ECMA-262"), "{why}");
    }

    #[test]
    fn a_pattern_past_the_size_limit_is_refused() {
        let (_, _, why) = refusal(json!({"pattern": "^.{0,5000}$"}));
        assert!(
            why.contains(&format!("more than {PATTERN_SIZE_LIMIT} bytes")),
            "{why}"
        );
    }

    #[test]
    fn patterns_are_measured_once_each_and_values_are_not_patterns() {
        let schema = json!({
            "properties": {
                "a": {"pattern": "^[a-z]+$"},
                "b": {"pattern": "^[a-z]+$"},
                "c": {"patternProperties": {"^x-[0-9]{1,3}$": {"pattern": "^\\w{1,100}$"}}},
                "pattern": {"type": "string"}
            },
            "enum": [{"pattern": "(?=no)"}],
            "default": {"pattern": r"\1"},
            "x-extension": {"pattern": "(?=ignored)"}
        });
        let cost = measure(&schema).expect("linear patterns");
        assert_eq!(cost.count, 3);
        assert!(cost.bytes > 0);
        assert_eq!(measure(&json!({"type": "string"})), Ok(Cost::default()));
    }

    #[test]
    fn the_validator_runs_patterns_on_the_linear_engine() {
        // `(a+)+` against a long run and a mismatch at its end: catastrophic for a
        // backtracking engine, linear here.
        let validator = jsonschema::options()
            .with_pattern_options(options())
            .build(&json!({"pattern": "^(a+)+$"}))
            .expect("compiles");
        let subject = Value::String(format!("{}b", "a".repeat(100_000)));
        assert!(!validator.is_valid(&subject));
        // Without the pre-check, the validator refuses what the engine cannot run.
        assert!(
            jsonschema::options()
                .with_pattern_options(options())
                .build(&json!({"pattern": r"^(a*)*\1$"}))
                .is_err()
        );
    }
}

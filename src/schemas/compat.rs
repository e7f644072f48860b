//! Whether a new version of a JSON Schema keeps what a binding's compatibility mode
//! promises: backward (what the old version accepted, the new one accepts, so readers
//! on the new version read old data), forward (the other way round), full (both), and
//! their transitive forms (against every earlier version, not only the last).
//!
//! The check is conservative: it says compatible only when it can show that every
//! document the looser schema must take is taken, by comparing the keywords it knows
//! (types, enums and consts, numeric, length, size and count bounds, patterns and
//! formats, required names, properties, additional properties, items). A keyword it
//! does not reason about (`allOf`, `$ref`, `if`, `patternProperties`, ...) must be the
//! same in both versions, or the change is refused with the keyword's path. Must never
//! call a change compatible that lets a document through one side and not the other.

use serde_json::{Map, Value};

/// What each new version of a binding's schema must keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    None,
    #[default]
    Backward,
    BackwardTransitive,
    Forward,
    ForwardTransitive,
    Full,
    FullTransitive,
}

impl Mode {
    /// The mode's name in configuration and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Backward => "backward",
            Mode::BackwardTransitive => "backward_transitive",
            Mode::Forward => "forward",
            Mode::ForwardTransitive => "forward_transitive",
            Mode::Full => "full",
            Mode::FullTransitive => "full_transitive",
        }
    }

    /// The mode named `name`.
    pub fn named(name: &str) -> Option<Mode> {
        [
            Mode::None,
            Mode::Backward,
            Mode::BackwardTransitive,
            Mode::Forward,
            Mode::ForwardTransitive,
            Mode::Full,
            Mode::FullTransitive,
        ]
        .into_iter()
        .find(|mode| mode.as_str() == name)
    }
}

/// Why a new version breaks its mode: where in the schema, and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{direction}: at {path}: {what}")]
pub struct Breakage {
    /// Which promise broke, as a sentence's start ("version 3 cannot read version 2's data").
    pub direction: String,
    /// A JSON Pointer into the schema (`#` for its root).
    pub path: String,
    pub what: String,
}

/// Checks `new` (about to become version `earlier.len() + 1`) against the earlier
/// versions of its binding, oldest first, under `mode`.
pub fn check(mode: Mode, earlier: &[Value], new: &Value) -> Result<(), Breakage> {
    let numbered: Vec<(u64, &Value)> = earlier.iter().zip(1..).map(|(v, n)| (n, v)).collect();
    check_numbered(mode, &numbered, earlier.len() as u64 + 1, new)
}

/// [`check`] with the versions' own numbers: `earlier` oldest first, `new` to become
/// version `next` (a binding's numbers go on across a deletion).
pub fn check_numbered(
    mode: Mode,
    earlier: &[(u64, &Value)],
    next: u64,
    new: &Value,
) -> Result<(), Breakage> {
    let against: &[(u64, &Value)] = match mode {
        Mode::None => &[],
        Mode::Backward | Mode::Forward | Mode::Full => &earlier[earlier.len().saturating_sub(1)..],
        _ => earlier,
    };
    let backward = matches!(
        mode,
        Mode::Backward | Mode::BackwardTransitive | Mode::Full | Mode::FullTransitive
    );
    let forward = matches!(
        mode,
        Mode::Forward | Mode::ForwardTransitive | Mode::Full | Mode::FullTransitive
    );
    for &(version, old) in against {
        let fail = |direction: String| {
            move |(path, what): (String, String)| Breakage {
                direction,
                path,
                what,
            }
        };
        if backward {
            takes_all(old, new, "#").map_err(fail(format!(
                "version {next} would refuse what version {version} accepts"
            )))?;
        }
        if forward {
            takes_all(new, old, "#").map_err(fail(format!(
                "version {version} would refuse what version {next} accepts"
            )))?;
        }
    }
    Ok(())
}

type Refused = (String, String);

/// Keywords this check reasons about; any other that constrains must be equal.
const KNOWN: &[&str] = &[
    "type",
    "enum",
    "const",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "pattern",
    "format",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "uniqueItems",
];

/// Keywords that say nothing about which documents are valid.
const ANNOTATIONS: &[&str] = &[
    "$schema",
    "$id",
    "$comment",
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$defs",
    "definitions",
];

/// Whether `looser` takes every document `tighter` takes; the first place it may not.
fn takes_all(tighter: &Value, looser: &Value, path: &str) -> Result<(), Refused> {
    let refuse = |at: &str, what: String| Err((at.to_owned(), what));
    match (tighter, looser) {
        (_, Value::Bool(true)) | (Value::Bool(false), _) => return Ok(()),
        (Value::Bool(true), Value::Object(o)) if constrains(o) => {
            return refuse(
                path,
                "a schema that took anything now has constraints".into(),
            );
        }
        (_, Value::Bool(false)) => return refuse(path, "the schema now takes nothing".into()),
        _ => {}
    }
    let empty = Map::new();
    let t = tighter.as_object().unwrap_or(&empty);
    let l = looser.as_object().unwrap_or(&empty);
    for (key, value) in l {
        let known = KNOWN.contains(&key.as_str()) || ANNOTATIONS.contains(&key.as_str());
        if !known && t.get(key) != Some(value) {
            return refuse(
                &format!("{path}/{key}"),
                format!("`{key}` changed, and this check cannot show it takes as much as before"),
            );
        }
    }
    types(t, l, path)?;
    values(t, l, path)?;
    bounds(t, l, path)?;
    for key in ["pattern", "format"] {
        if let Some(value) = l.get(key)
            && t.get(key) != Some(value)
        {
            return refuse(
                &format!("{path}/{key}"),
                format!("`{key}` is new or changed"),
            );
        }
    }
    if l.get("uniqueItems") == Some(&Value::Bool(true))
        && t.get("uniqueItems") != Some(&Value::Bool(true))
    {
        return refuse(
            &format!("{path}/uniqueItems"),
            "items must now be unique".into(),
        );
    }
    required(t, l, path)?;
    properties(t, l, path)?;
    let at = format!("{path}/items");
    match (t.get("items"), l.get("items")) {
        (_, None) => {}
        (Some(ti), Some(li)) if ti == li => {}
        (Some(ti), Some(li)) if ti.is_object() || ti.is_boolean() => takes_all(ti, li, &at)?,
        (None, Some(li)) => takes_all(&Value::Bool(true), li, &at)?,
        (Some(_), Some(_)) => return refuse(&at, "`items` changed form".into()),
    }
    Ok(())
}

/// Whether an object schema constrains anything.
fn constrains(schema: &Map<String, Value>) -> bool {
    schema
        .keys()
        .any(|key| !ANNOTATIONS.contains(&key.as_str()))
}

/// The types a schema names, `None` for any.
fn type_set(schema: &Map<String, Value>) -> Option<Vec<&str>> {
    match schema.get("type")? {
        Value::String(one) => Some(vec![one.as_str()]),
        Value::Array(many) => Some(many.iter().filter_map(Value::as_str).collect()),
        _ => Some(Vec::new()),
    }
}

fn types(t: &Map<String, Value>, l: &Map<String, Value>, path: &str) -> Result<(), Refused> {
    let Some(allowed) = type_set(l) else {
        return Ok(());
    };
    let Some(had) = type_set(t) else {
        return Err((
            format!("{path}/type"),
            format!("any type was taken; now only {}", allowed.join(", ")),
        ));
    };
    for kind in had {
        let taken = allowed.contains(&kind) || (kind == "integer" && allowed.contains(&"number"));
        if !taken {
            return Err((
                format!("{path}/type"),
                format!("type {kind} is no longer taken"),
            ));
        }
    }
    Ok(())
}

fn values(t: &Map<String, Value>, l: &Map<String, Value>, path: &str) -> Result<(), Refused> {
    let allowed: Option<Vec<&Value>> = match (l.get("enum"), l.get("const")) {
        (Some(Value::Array(values)), _) => Some(values.iter().collect()),
        (_, Some(value)) => Some(vec![value]),
        _ => None,
    };
    let Some(allowed) = allowed else {
        return Ok(());
    };
    let had: Option<Vec<&Value>> = match (t.get("enum"), t.get("const")) {
        (_, Some(value)) => Some(vec![value]),
        (Some(Value::Array(values)), _) => Some(values.iter().collect()),
        _ => None,
    };
    let Some(had) = had else {
        return Err((format!("{path}/enum"), "a set of values is new".into()));
    };
    match had.iter().find(|value| !allowed.contains(value)) {
        Some(value) => Err((
            format!("{path}/enum"),
            format!("{value} is no longer one of the values"),
        )),
        None => Ok(()),
    }
}

fn bounds(t: &Map<String, Value>, l: &Map<String, Value>, path: &str) -> Result<(), Refused> {
    // (keyword, whether a larger value is looser)
    const BOUNDS: &[(&str, bool)] = &[
        ("minimum", false),
        ("exclusiveMinimum", false),
        ("minLength", false),
        ("minItems", false),
        ("minProperties", false),
        ("maximum", true),
        ("exclusiveMaximum", true),
        ("maxLength", true),
        ("maxItems", true),
        ("maxProperties", true),
    ];
    for &(key, larger_is_looser) in BOUNDS {
        let Some(new) = l.get(key).and_then(Value::as_f64) else {
            continue;
        };
        let old = t.get(key).and_then(Value::as_f64);
        let holds = old.is_some_and(|old| {
            if larger_is_looser {
                new >= old
            } else {
                new <= old
            }
        });
        if !holds {
            return Err((
                format!("{path}/{key}"),
                format!("`{key}` is new or tighter"),
            ));
        }
    }
    if let Some(new) = l.get("multipleOf").and_then(Value::as_f64) {
        let old = t.get("multipleOf").and_then(Value::as_f64);
        let holds = old.is_some_and(|old| {
            let ratio = old / new;
            (ratio - ratio.round()).abs() < 1e-9 && ratio >= 1.0
        });
        if !holds {
            return Err((
                format!("{path}/multipleOf"),
                "`multipleOf` is new or tighter".into(),
            ));
        }
    }
    Ok(())
}

fn names(schema: &Map<String, Value>, key: &str) -> Vec<String> {
    schema
        .get(key)
        .and_then(Value::as_array)
        .map(|names| {
            names
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

fn required(t: &Map<String, Value>, l: &Map<String, Value>, path: &str) -> Result<(), Refused> {
    let had = names(t, "required");
    match names(l, "required")
        .into_iter()
        .find(|name| !had.contains(name))
    {
        Some(name) => Err((
            format!("{path}/required"),
            format!("`{name}` is now required (a default does not make old data valid)"),
        )),
        None => Ok(()),
    }
}

/// What a schema says of a property it does not list: `additionalProperties`, or any.
fn additional(schema: &Map<String, Value>) -> Value {
    schema
        .get("additionalProperties")
        .cloned()
        .unwrap_or(Value::Bool(true))
}

fn property<'a>(schema: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    schema.get("properties")?.as_object()?.get(name)
}

fn properties(t: &Map<String, Value>, l: &Map<String, Value>, path: &str) -> Result<(), Refused> {
    let (t_extra, l_extra) = (additional(t), additional(l));
    let mut listed: Vec<&String> = Vec::new();
    for schema in [t, l] {
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            listed.extend(props.keys());
        }
    }
    listed.sort();
    listed.dedup();
    for name in listed {
        let had = property(t, name)
            .cloned()
            .unwrap_or_else(|| t_extra.clone());
        let takes = property(l, name)
            .cloned()
            .unwrap_or_else(|| l_extra.clone());
        takes_all(&had, &takes, &format!("{path}/properties/{name}"))?;
    }
    takes_all(&t_extra, &l_extra, &format!("{path}/additionalProperties"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn backward(old: Value, new: Value) -> Result<(), Breakage> {
        check(Mode::Backward, &[old], &new)
    }

    #[test]
    fn loosening_is_backward_compatible_and_tightening_is_not() {
        let v1 = json!({"type": "object", "properties": {
            "t": {"type": "number", "maximum": 100},
            "unit": {"enum": ["C", "F"]},
            "id": {"type": "integer"}
        }, "required": ["t", "unit"]});
        let looser = json!({"type": "object", "title": "temp", "properties": {
            "t": {"type": ["number", "null"], "maximum": 200},
            "unit": {"enum": ["C", "F", "K"]},
            "id": {"type": "number"},
            "note": {}
        }, "required": ["t"]});
        assert_eq!(backward(v1.clone(), looser.clone()), Ok(()));
        // The other way round, each loosening is a tightening.
        let error = backward(looser.clone(), v1.clone()).unwrap_err();
        assert_eq!(error.path, "#/required", "{error}");
        let mut looser_required = looser;
        looser_required["required"] = json!(["t", "unit"]);
        let error = backward(looser_required, v1).unwrap_err();
        assert_eq!(error.path, "#/properties/id/type", "{error}");
        for (new, at) in [
            (
                json!({"type": "object", "required": ["t", "unit", "id"]}),
                "#/required",
            ),
            (
                json!({"type": "object", "properties": {"t": {"type": "string"}}}),
                "#/properties/t/type",
            ),
            (
                json!({"type": "object", "properties": {"t": {"maximum": 50}}}),
                "#/properties/t/maximum",
            ),
            (
                json!({"type": "object", "properties": {"unit": {"enum": ["C"]}}}),
                "#/properties/unit/enum",
            ),
            (
                json!({"type": "object", "additionalProperties": false, "properties": {"t": {}, "unit": {}}}),
                "#/properties/id",
            ),
            (
                json!({"type": "object", "properties": {"x": {"type": "string"}}}),
                "#/properties/x",
            ),
            (
                json!({"type": "object", "allOf": [{"required": ["t"]}]}),
                "#/allOf",
            ),
            (json!(false), "#"),
        ] {
            let v1 = json!({"type": "object", "properties": {
                "t": {"type": "number", "maximum": 100},
                "unit": {"enum": ["C", "F"]},
                "id": {"type": "integer"}
            }, "required": ["t", "unit"]});
            let error = backward(v1, new.clone()).expect_err(&new.to_string());
            assert_eq!(error.path, at, "{new}: {error}");
            assert!(
                error
                    .to_string()
                    .contains("version 2 would refuse what version 1 accepts")
            );
        }
    }

    #[test]
    fn closed_schemas_may_gain_optional_properties_and_open_ones_may_lose_them() {
        let closed = json!({"type": "object", "additionalProperties": false,
                            "properties": {"a": {"type": "string"}}});
        let gained = json!({"type": "object", "additionalProperties": false,
                            "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}});
        assert_eq!(backward(closed.clone(), gained.clone()), Ok(()));
        // Forward: old readers refuse `b`, which the new version lets in.
        let error = check(Mode::Forward, &[closed], &gained).unwrap_err();
        assert_eq!(error.path, "#/properties/b");
        let open = json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {}}});
        let lost = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        assert_eq!(check(Mode::Full, &[open], &lost), Ok(()));
    }

    #[test]
    fn transitive_modes_check_every_earlier_version() {
        let v1 = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        let v2 = json!({"type": "object", "properties": {"n": {"type": "number"}}});
        let v3 = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        // v3 can read v2's data? No: v2 allowed 1.5.
        assert!(check(Mode::Backward, &[v1.clone(), v2.clone()], &v3).is_err());
        // Forward only against v2: v2 reads what v3 writes.
        assert_eq!(check(Mode::Forward, &[v1.clone(), v2.clone()], &v3), Ok(()));
        let v3b = json!({"type": "object", "properties": {"n": {"type": "number", "minimum": 0}}});
        assert!(check(Mode::Backward, &[v1.clone(), v2.clone()], &v3b).is_err());
        let v2b = json!({"type": "object", "properties": {"n": {"type": "number"}}});
        let v3c = json!({"type": "object", "properties": {"n": {"type": "number"}},
                         "description": "same"});
        assert_eq!(check(Mode::BackwardTransitive, &[v1, v2b], &v3c), Ok(()));
        assert_eq!(check(Mode::None, &[json!(true)], &json!(false)), Ok(()));
    }

    #[test]
    fn modes_are_named() {
        for name in [
            "none",
            "backward",
            "backward_transitive",
            "forward",
            "forward_transitive",
            "full",
            "full_transitive",
        ] {
            assert_eq!(Mode::named(name).map(Mode::as_str), Some(name));
        }
        assert_eq!(Mode::named("sideways"), None);
        assert_eq!(Mode::default(), Mode::Backward);
    }
}

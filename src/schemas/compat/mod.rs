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
//!
//! Its cost is linear in the schemas compared (enums and required names are compared
//! as hashed sets), and bounded: the caller holds the bytes compared to
//! [`MAX_COMPARED_BYTES`], and the check itself stops past a [`Budget`] of steps and
//! time, refusing the change as too costly to check rather than guessing (issue 26:
//! quadratic enum scans made a put take 19 s and stalled other tenants).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

/// The bytes of JSON one put's check may compare: for each earlier version compared,
/// its size and the new version's, once per direction (full modes compare both
/// ways). 16 MiB: about 36 versions of a 230 KiB schema under `backward_transitive`,
/// 18 under `full_transitive`.
pub const MAX_COMPARED_BYTES: usize = 16 << 20;
/// Steps (schema nodes, enum values, names and values compared) one put's check may
/// take. Far more than [`MAX_COMPARED_BYTES`] of schemas need, as a check is linear
/// in them: a bound in case some shape is not.
pub const MAX_STEPS: u64 = 20_000_000;
/// How long one put's check (parse, compilation and comparison) may take.
pub const TIME_BUDGET: Duration = Duration::from_secs(5);

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

    /// Whether a new version is checked against every earlier one, not only the last.
    pub fn transitive(self) -> bool {
        matches!(
            self,
            Mode::BackwardTransitive | Mode::ForwardTransitive | Mode::FullTransitive
        )
    }

    /// How many ways each earlier version is compared: 0, 1, or 2 for full modes.
    pub fn directions(self) -> usize {
        match self {
            Mode::None => 0,
            Mode::Full | Mode::FullTransitive => 2,
            _ => 1,
        }
    }

    fn backward(self) -> bool {
        matches!(
            self,
            Mode::Backward | Mode::BackwardTransitive | Mode::Full | Mode::FullTransitive
        )
    }

    fn forward(self) -> bool {
        matches!(
            self,
            Mode::Forward | Mode::ForwardTransitive | Mode::Full | Mode::FullTransitive
        )
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

/// Which bound a check ran past.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OverBudget {
    #[error("the check needed more than {0} steps")]
    Steps(u64),
    #[error("the check took more than {} ms", .0.as_millis())]
    Time(Duration),
}

/// Why a new version was not taken: it breaks its mode, or showing that it does not
/// costs more than a put may spend.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompatError {
    #[error(transparent)]
    Breaks(Breakage),
    #[error(transparent)]
    OverBudget(OverBudget),
}

/// What one put's check may still spend: steps, and time until a deadline.
#[derive(Debug, Clone)]
pub struct Budget {
    left: u64,
    limit: u64,
    started: Instant,
    time: Duration,
}

impl Budget {
    pub fn new(steps: u64, time: Duration) -> Self {
        Self {
            left: steps,
            limit: steps,
            started: Instant::now(),
            time,
        }
    }

    /// [`MAX_STEPS`] and [`TIME_BUDGET`], from now.
    pub fn standard() -> Self {
        Self::new(MAX_STEPS, TIME_BUDGET)
    }

    /// Past the deadline?
    pub fn check_time(&self) -> Result<(), OverBudget> {
        if self.started.elapsed() > self.time {
            return Err(OverBudget::Time(self.time));
        }
        Ok(())
    }

    fn spend(&mut self, steps: usize) -> Result<(), Stop> {
        let steps = steps as u64;
        let before = self.left;
        let Some(left) = before.checked_sub(steps) else {
            self.left = 0;
            return Err(Stop::Budget(OverBudget::Steps(self.limit)));
        };
        self.left = left;
        // The clock is read once every 4,096 steps, not at each.
        if before >> 12 != left >> 12 {
            self.check_time().map_err(Stop::Budget)?;
        }
        Ok(())
    }
}

/// Checks `new` (about to become version `earlier.len() + 1`) against the earlier
/// versions of its binding, oldest first, under `mode`, with [`Budget::standard`].
pub fn check(mode: Mode, earlier: &[Value], new: &Value) -> Result<(), CompatError> {
    let numbered: Vec<(u64, &Value)> = earlier.iter().zip(1..).map(|(v, n)| (n, v)).collect();
    check_numbered(
        mode,
        &numbered,
        earlier.len() as u64 + 1,
        new,
        &mut Budget::standard(),
    )
}

/// The earlier versions `mode` compares a new version with, of `earlier` (oldest
/// first): none, the last, or all.
pub fn compared<T>(mode: Mode, earlier: &[T]) -> &[T] {
    match mode {
        Mode::None => &[],
        _ if mode.transitive() => earlier,
        _ => &earlier[earlier.len().saturating_sub(1)..],
    }
}

/// [`check`] with the versions' own numbers: `earlier` oldest first, `new` to become
/// version `next` (a binding's numbers go on across a deletion), within `budget`.
pub fn check_numbered(
    mode: Mode,
    earlier: &[(u64, &Value)],
    next: u64,
    new: &Value,
    budget: &mut Budget,
) -> Result<(), CompatError> {
    for &(version, old) in compared(mode, earlier) {
        budget.check_time().map_err(CompatError::OverBudget)?;
        let fail = |direction: String| {
            move |stop: Stop| match stop {
                Stop::Refused(path, what) => CompatError::Breaks(Breakage {
                    direction,
                    path,
                    what,
                }),
                Stop::Budget(over) => CompatError::OverBudget(over),
            }
        };
        if mode.backward() {
            takes_all(old, new, "#", budget).map_err(fail(format!(
                "version {next} would refuse what version {version} accepts"
            )))?;
        }
        if mode.forward() {
            takes_all(new, old, "#", budget).map_err(fail(format!(
                "version {version} would refuse what version {next} accepts"
            )))?;
        }
    }
    Ok(())
}

/// Why a comparison stopped: a place where the looser schema may refuse something,
/// or the budget.
enum Stop {
    Refused(String, String),
    Budget(OverBudget),
}

fn refuse(path: String, what: impl Into<String>) -> Result<(), Stop> {
    Err(Stop::Refused(path, what.into()))
}

/// The schema that takes anything, for a property or items a schema does not name.
static ANY: Value = Value::Bool(true);

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
fn takes_all(tighter: &Value, looser: &Value, path: &str, budget: &mut Budget) -> Result<(), Stop> {
    budget.spend(1)?;
    match (tighter, looser) {
        (_, Value::Bool(true)) | (Value::Bool(false), _) => return Ok(()),
        (Value::Bool(true), Value::Object(o)) if constrains(o) => {
            return refuse(
                path.to_owned(),
                "a schema that took anything now has constraints",
            );
        }
        (_, Value::Bool(false)) => return refuse(path.to_owned(), "the schema now takes nothing"),
        _ => {}
    }
    let empty = Map::new();
    let t = tighter.as_object().unwrap_or(&empty);
    let l = looser.as_object().unwrap_or(&empty);
    for (key, value) in l {
        let known = KNOWN.contains(&key.as_str()) || ANNOTATIONS.contains(&key.as_str());
        if !known && !same_at(t.get(key), value, budget)? {
            return refuse(
                format!("{path}/{key}"),
                format!("`{key}` changed, and this check cannot show it takes as much as before"),
            );
        }
    }
    types(t, l, path)?;
    values(t, l, path, budget)?;
    bounds(t, l, path)?;
    for key in ["pattern", "format"] {
        if let Some(value) = l.get(key)
            && !same_at(t.get(key), value, budget)?
        {
            return refuse(
                format!("{path}/{key}"),
                format!("`{key}` is new or changed"),
            );
        }
    }
    if l.get("uniqueItems") == Some(&Value::Bool(true))
        && t.get("uniqueItems") != Some(&Value::Bool(true))
    {
        return refuse(format!("{path}/uniqueItems"), "items must now be unique");
    }
    required(t, l, path, budget)?;
    properties(t, l, path, budget)?;
    let at = format!("{path}/items");
    let is_schema = |v: &Value| v.is_object() || v.is_boolean();
    match (t.get("items"), l.get("items")) {
        (_, None) => {}
        (Some(ti), Some(li)) if is_schema(ti) && is_schema(li) => takes_all(ti, li, &at, budget)?,
        (None, Some(li)) if is_schema(li) => takes_all(&ANY, li, &at, budget)?,
        // The array (tuple) form: held to be the same, like keywords not reasoned about.
        (Some(ti), Some(li)) if same(ti, li, budget)? => {}
        _ => return refuse(at, "`items` changed form"),
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

fn types(t: &Map<String, Value>, l: &Map<String, Value>, path: &str) -> Result<(), Stop> {
    let Some(allowed) = type_set(l) else {
        return Ok(());
    };
    let Some(had) = type_set(t) else {
        return refuse(
            format!("{path}/type"),
            format!("any type was taken; now only {}", allowed.join(", ")),
        );
    };
    // At most the seven JSON Schema type names each (a schema naming more is
    // refused when compiled), so a scan is as cheap as a set.
    for kind in had {
        let taken = allowed.contains(&kind) || (kind == "integer" && allowed.contains(&"number"));
        if !taken {
            return refuse(
                format!("{path}/type"),
                format!("type {kind} is no longer taken"),
            );
        }
    }
    Ok(())
}

fn values(
    t: &Map<String, Value>,
    l: &Map<String, Value>,
    path: &str,
    budget: &mut Budget,
) -> Result<(), Stop> {
    let allowed: &[Value] = match (l.get("enum"), l.get("const")) {
        (Some(Value::Array(values)), _) => values,
        (_, Some(value)) => std::slice::from_ref(value),
        _ => return Ok(()),
    };
    let had: &[Value] = match (t.get("enum"), t.get("const")) {
        (_, Some(value)) => std::slice::from_ref(value),
        (Some(Value::Array(values)), _) => values,
        _ => return refuse(format!("{path}/enum"), "a set of values is new"),
    };
    let allowed = ValueSet::new(allowed, budget)?;
    for value in had {
        if !allowed.contains(value, budget)? {
            return refuse(
                format!("{path}/enum"),
                format!("{value} is no longer one of the values"),
            );
        }
    }
    Ok(())
}

/// A set of JSON values, looked up in time linear in the value sought (an enum of
/// thousands compared with another of thousands was a quadratic scan). Values are
/// equal as `serde_json::Value`s are, so `1` and `1.0` differ: a conservative answer.
struct ValueSet<'v> {
    hasher: RandomState,
    buckets: HashMap<u64, Vec<&'v Value>>,
}

impl<'v> ValueSet<'v> {
    fn new(values: &'v [Value], budget: &mut Budget) -> Result<Self, Stop> {
        let hasher = RandomState::new();
        let mut buckets: HashMap<u64, Vec<&Value>> = HashMap::with_capacity(values.len());
        for value in values {
            let key = hash_of(&hasher, value, budget)?;
            buckets.entry(key).or_default().push(value);
        }
        Ok(Self { hasher, buckets })
    }

    fn contains(&self, value: &Value, budget: &mut Budget) -> Result<bool, Stop> {
        let key = hash_of(&self.hasher, value, budget)?;
        for candidate in self.buckets.get(&key).into_iter().flatten() {
            if same(candidate, value, budget)? {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// A hash of `value` consistent with `Value`'s equality (object keys taken in sorted
/// order, whatever order the map keeps; `0.0` and `-0.0` alike), a step per node.
fn hash_of(hasher: &RandomState, value: &Value, budget: &mut Budget) -> Result<u64, Stop> {
    fn feed(value: &Value, state: &mut impl Hasher, nodes: &mut usize) {
        *nodes += 1;
        match value {
            Value::Null => state.write_u8(0),
            Value::Bool(b) => {
                state.write_u8(1);
                b.hash(state);
            }
            Value::Number(n) => {
                state.write_u8(2);
                if let Some(u) = n.as_u64() {
                    state.write_u8(0);
                    state.write_u64(u);
                } else if let Some(i) = n.as_i64() {
                    state.write_u8(1);
                    state.write_i64(i);
                } else {
                    let f = n.as_f64().unwrap_or_default();
                    state.write_u8(2);
                    state.write_u64(if f == 0.0 { 0 } else { f.to_bits() });
                }
            }
            Value::String(s) => {
                state.write_u8(3);
                s.hash(state);
            }
            Value::Array(items) => {
                state.write_u8(4);
                state.write_usize(items.len());
                for item in items {
                    feed(item, state, nodes);
                }
            }
            Value::Object(map) => {
                state.write_u8(5);
                state.write_usize(map.len());
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
                for (key, item) in entries {
                    key.hash(state);
                    feed(item, state, nodes);
                }
            }
        }
    }
    let mut state = hasher.build_hasher();
    let mut nodes = 0;
    feed(value, &mut state, &mut nodes);
    budget.spend(nodes)?;
    Ok(state.finish())
}

/// `a == b`, a step per node compared.
fn same(a: &Value, b: &Value, budget: &mut Budget) -> Result<bool, Stop> {
    budget.spend(1)?;
    Ok(match (a, b) {
        (Value::Array(x), Value::Array(y)) => {
            if x.len() != y.len() {
                return Ok(false);
            }
            for (x, y) in x.iter().zip(y) {
                if !same(x, y, budget)? {
                    return Ok(false);
                }
            }
            true
        }
        (Value::Object(x), Value::Object(y)) => {
            if x.len() != y.len() {
                return Ok(false);
            }
            for (key, x) in x {
                match y.get(key) {
                    Some(y) if same(x, y, budget)? => {}
                    _ => return Ok(false),
                }
            }
            true
        }
        (a, b) => a == b,
    })
}

fn same_at(a: Option<&Value>, b: &Value, budget: &mut Budget) -> Result<bool, Stop> {
    match a {
        Some(a) => same(a, b, budget),
        None => Ok(false),
    }
}

fn bounds(t: &Map<String, Value>, l: &Map<String, Value>, path: &str) -> Result<(), Stop> {
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
            return refuse(
                format!("{path}/{key}"),
                format!("`{key}` is new or tighter"),
            );
        }
    }
    if let Some(new) = l.get("multipleOf").and_then(Value::as_f64) {
        let old = t.get("multipleOf").and_then(Value::as_f64);
        let holds = old.is_some_and(|old| {
            let ratio = old / new;
            (ratio - ratio.round()).abs() < 1e-9 && ratio >= 1.0
        });
        if !holds {
            return refuse(
                format!("{path}/multipleOf"),
                "`multipleOf` is new or tighter",
            );
        }
    }
    Ok(())
}

fn names<'s>(schema: &'s Map<String, Value>, key: &str) -> impl Iterator<Item = &'s str> {
    schema
        .get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

fn required(
    t: &Map<String, Value>,
    l: &Map<String, Value>,
    path: &str,
    budget: &mut Budget,
) -> Result<(), Stop> {
    let had: HashSet<&str> = names(t, "required").collect();
    budget.spend(had.len())?;
    for name in names(l, "required") {
        budget.spend(1)?;
        if !had.contains(name) {
            return refuse(
                format!("{path}/required"),
                format!("`{name}` is now required (a default does not make old data valid)"),
            );
        }
    }
    Ok(())
}

/// What a schema says of a property it does not list: `additionalProperties`, or any.
fn additional(schema: &Map<String, Value>) -> &Value {
    schema.get("additionalProperties").unwrap_or(&ANY)
}

fn property<'a>(schema: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    schema.get("properties")?.as_object()?.get(name)
}

fn properties(
    t: &Map<String, Value>,
    l: &Map<String, Value>,
    path: &str,
    budget: &mut Budget,
) -> Result<(), Stop> {
    let (t_extra, l_extra) = (additional(t), additional(l));
    let mut listed: Vec<&String> = Vec::new();
    for schema in [t, l] {
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            listed.extend(props.keys());
        }
    }
    budget.spend(listed.len())?;
    listed.sort_unstable();
    listed.dedup();
    for name in listed {
        let had = property(t, name).unwrap_or(t_extra);
        let takes = property(l, name).unwrap_or(l_extra);
        takes_all(had, takes, &format!("{path}/properties/{name}"), budget)?;
    }
    takes_all(
        t_extra,
        l_extra,
        &format!("{path}/additionalProperties"),
        budget,
    )
}

#[cfg(test)]
mod tests;

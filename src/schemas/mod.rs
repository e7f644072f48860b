//! JSON Schemas bound to subject patterns (issue 16): what a binding is, which one a
//! subject falls under, and checking a payload against it.
//!
//! A binding ties a pattern (`devices.*.temp`) of one tenant to the current version of
//! a JSON Schema (drafts 7 and 2020-12), compiled once when it is put or loaded and
//! kept here, so a publish pays a JSON parse and a walk of the compiled validator,
//! never a compilation. When several bindings match a subject, the most specific wins
//! ([`specificity`]). New versions are held to the binding's compatibility mode
//! ([`compat`]). A schema's regular expressions run on a linear-time engine, checked
//! and measured before it is compiled ([`patterns`]). The registry ([`registry`])
//! holds each tenant's bindings; the store keeps their versions (`store/schemas.rs`).
//!
//! Must never parse a payload no binding covers, never compile a schema on the
//! publish path, and never compile a regex on a backtracking engine.

pub mod asyncapi;
pub mod compat;
pub mod patterns;
pub mod registry;

use std::cmp::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use canopy_subjects::{Pattern, PatternToken, Trie};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use compat::Mode;
pub use registry::TenantSchemas;

/// The header every stored message checked against a schema carries:
/// `<pattern>@<version>`. A client's own header of this name is dropped.
pub const SCHEMA_HEADER: &str = "Canopy-Schema";
/// The first tokens of dead-letter subjects, unless a binding names its own.
pub const DEFAULT_DEAD_LETTER: &str = "$DLQ.schema";
/// Bindings one tenant may have.
pub const MAX_BINDINGS: usize = 10_000;
/// Versions (deletions included) one pattern may have: numbers are never reused, so
/// past it the pattern takes no new binding.
pub const MAX_VERSIONS: u32 = 1_000;
/// The largest schema accepted, in bytes of JSON.
pub const MAX_SCHEMA_BYTES: usize = 256 * 1024;
/// The bytes of JSON all of one tenant's bound schemas may hold together: what the
/// registry, a start and an AsyncAPI document hold of a tenant at most.
pub const MAX_TENANT_SCHEMA_BYTES: usize = 16 << 20;

/// What happens to a message its schema refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnInvalid {
    /// Refused in the client's protocol; nothing is stored or routed.
    #[default]
    Reject,
    /// Stored under the binding's dead-letter subject instead, and acknowledged.
    DeadLetter,
}

impl OnInvalid {
    pub fn as_str(self) -> &'static str {
        match self {
            OnInvalid::Reject => "reject",
            OnInvalid::DeadLetter => "dead_letter",
        }
    }
}

/// One version of a binding as stored (the JSON of a `'y'` key). A deletion is a
/// version too, without a schema, so version numbers are never given twice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredVersion {
    /// `None` for a deletion.
    pub schema: Option<Value>,
    #[serde(with = "mode_name")]
    pub mode: Mode,
    #[serde(default)]
    pub on_invalid: OnInvalid,
    /// The dead-letter prefix, when not [`DEFAULT_DEAD_LETTER`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<String>,
    pub time_ms: u64,
}

mod mode_name {
    use super::Mode;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(mode: &Mode, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(mode.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Mode, D::Error> {
        let name = String::deserialize(d)?;
        Mode::named(&name).ok_or_else(|| serde::de::Error::custom(format!("no mode `{name}`")))
    }
}

/// Why a schema cannot be bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error("invalid pattern: {0}")]
    Pattern(String),
    #[error("the schema is not a valid JSON Schema: {0}")]
    Invalid(String),
    #[error("the schema refers to `{0}`, which cannot be fetched: a schema must be self-contained")]
    External(String),
    #[error("dead-letter prefix `{0}` is not a valid subject")]
    DeadLetter(String),
    /// A regular expression the linear-time engine cannot run, or too large.
    #[error("the regular expression `{pattern}` at {at} cannot be used: {why}")]
    Regex {
        /// A JSON Pointer into the schema.
        at: String,
        pattern: String,
        why: String,
    },
}

/// The first thing a payload got wrong: where (a JSON Pointer into the document, empty
/// for the whole of it) and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", if path.is_empty() { "/" } else { path.as_str() })]
pub struct Violation {
    pub path: String,
    pub message: String,
}

/// A pattern bound to one version of a schema, compiled.
pub struct Binding {
    pub pattern: String,
    parsed: Pattern,
    pub version: u32,
    pub stored: StoredVersion,
    validator: jsonschema::Validator,
    /// `Canopy-Schema: <pattern>@<version>\r\n`, ready to splice into a header block.
    header_line: Bytes,
    /// A whole header block holding only that header, for messages that had none.
    header_block: Bytes,
    /// The schema's size in bytes of JSON.
    pub schema_bytes: usize,
    /// What its regular expressions compile to.
    pub regex: patterns::Cost,
    /// Why a stored version no longer compiles (a pattern the linear-time engine
    /// cannot run, bound before it was refused at put): every payload is then refused
    /// with this, rather than the subjects going unchecked.
    unusable: Option<String>,
}

impl std::fmt::Debug for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Binding")
            .field("pattern", &self.pattern)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// Compiles `schema` as a JSON Schema (its `$schema` names the draft; 2020-12 when
/// it names none), its regular expressions on the linear-time engine. References
/// must stay inside the document.
pub fn compile(schema: &Value) -> Result<(jsonschema::Validator, patterns::Cost), SchemaError> {
    if !schema.is_object() && !schema.is_boolean() {
        return Err(SchemaError::Invalid(
            "a schema is a JSON object (or true or false)".into(),
        ));
    }
    if let Some(reference) = external_reference(schema) {
        return Err(SchemaError::External(reference));
    }
    // First, so a pattern the engine cannot run is refused with its place and why,
    // rather than as the validator's bare "is not a regex".
    let cost = patterns::measure(schema)?;
    let validator = jsonschema::options()
        .should_validate_formats(true)
        .with_pattern_options(patterns::options())
        .build(schema)
        .map_err(|e| SchemaError::Invalid(e.to_string()))?;
    Ok((validator, cost))
}

/// The first `$ref` that leaves the document, if any.
fn external_reference(schema: &Value) -> Option<String> {
    match schema {
        Value::Object(map) => {
            for (key, value) in map {
                if key == "$ref" || key == "$dynamicRef" {
                    if let Value::String(reference) = value
                        && !reference.starts_with('#')
                    {
                        return Some(reference.clone());
                    }
                } else if let Some(found) = external_reference(value) {
                    return Some(found);
                }
            }
            None
        }
        Value::Array(items) => items.iter().find_map(external_reference),
        _ => None,
    }
}

impl Binding {
    /// Compiles one stored version (which must have a schema).
    pub fn new(pattern: &str, version: u32, stored: StoredVersion) -> Result<Self, SchemaError> {
        let parsed =
            Pattern::parse_native(pattern).map_err(|e| SchemaError::Pattern(e.to_string()))?;
        let schema = stored
            .schema
            .as_ref()
            .ok_or_else(|| SchemaError::Invalid("a deleted binding has no schema".into()))?;
        let (validator, regex) = compile(schema)?;
        let schema_bytes = serde_json::to_vec(schema).map_or(0, |v| v.len());
        let line = format!("{SCHEMA_HEADER}: {pattern}@{version}\r\n");
        let header_block = Bytes::from(format!("NATS/1.0\r\n{line}\r\n"));
        Ok(Self {
            pattern: pattern.to_owned(),
            parsed,
            version,
            stored,
            validator,
            header_line: Bytes::from(line),
            header_block,
            schema_bytes,
            regex,
            unusable: None,
        })
    }

    /// A stored version that no longer compiles, kept bound so that its subjects fail
    /// closed: every payload is refused with `why` until the schema is put again.
    pub fn unusable(
        pattern: &str,
        version: u32,
        stored: StoredVersion,
        why: String,
    ) -> Result<Self, SchemaError> {
        let mut stand_in = stored.clone();
        stand_in.schema = Some(Value::Bool(false));
        let mut binding = Self::new(pattern, version, stand_in)?;
        binding.stored = stored;
        binding.unusable = Some(why);
        Ok(binding)
    }

    /// The value of the [`SCHEMA_HEADER`] it gives messages.
    pub fn reference(&self) -> String {
        format!("{}@{}", self.pattern, self.version)
    }

    /// Checks a payload: JSON, and valid under the schema.
    pub fn check(&self, payload: &[u8]) -> Result<(), Violation> {
        if let Some(why) = &self.unusable {
            return Err(Violation {
                path: String::new(),
                message: format!(
                    "schema {}@{} can no longer be checked ({why}): put it again",
                    self.pattern, self.version
                ),
            });
        }
        let document: Value = serde_json::from_slice(payload).map_err(|e| Violation {
            path: String::new(),
            message: format!("the payload is not JSON: {e}"),
        })?;
        self.validator
            .validate(&document)
            .map_err(|error| Violation {
                path: shortened(error.instance_path().to_string()),
                message: shortened(error.to_string()),
            })
    }

    /// The dead-letter subject of a message published to `subject`.
    pub fn dead_letter_subject(&self, subject: &str) -> String {
        let prefix = self
            .stored
            .dead_letter
            .as_deref()
            .unwrap_or(DEFAULT_DEAD_LETTER);
        format!("{prefix}.{subject}")
    }

    /// `headers` (a NATS header block, empty for none) with this binding's
    /// [`SCHEMA_HEADER`] in place of any the client sent.
    pub fn stamp(&self, headers: &Bytes) -> Bytes {
        if headers.is_empty() {
            return self.header_block.clone();
        }
        let without = strip_schema_header(headers);
        // A block ends with an empty line; the header goes before it.
        match without.len().checked_sub(2) {
            Some(end) if without.ends_with(b"\r\n\r\n") => {
                let mut block = Vec::with_capacity(without.len() + self.header_line.len());
                block.extend_from_slice(&without[..end]);
                block.extend_from_slice(&self.header_line);
                block.extend_from_slice(b"\r\n");
                Bytes::from(block)
            }
            _ => self.header_block.clone(),
        }
    }
}

/// The most of a violation's path or message kept: a message quotes the value it
/// refused, which may be as large as the payload.
pub const MAX_VIOLATION_CHARS: usize = 300;

fn shortened(mut text: String) -> String {
    if let Some((cut, _)) = text.char_indices().nth(MAX_VIOLATION_CHARS) {
        text.truncate(cut);
        text.push('…');
    }
    text
}

/// `headers` without any [`SCHEMA_HEADER`] (names compared without case, as HTTP
/// does); the same bytes when it has none.
pub fn strip_schema_header(headers: &Bytes) -> Bytes {
    let name = SCHEMA_HEADER.as_bytes();
    let has = |line: &[u8]| {
        line.len() > name.len()
            && line[..name.len()].eq_ignore_ascii_case(name)
            && line[name.len()] == b':'
    };
    if !headers.split(|&b| b == b'\n').any(&has) {
        return headers.clone();
    }
    let mut kept = Vec::with_capacity(headers.len());
    for line in headers.split_inclusive(|&b| b == b'\n') {
        if !has(line) {
            kept.extend_from_slice(line);
        }
    }
    Bytes::from(kept)
}

/// How specific `a` is against `b`, two patterns that match one subject: compared
/// token by token from the left, the first place they differ decides, a literal
/// being more specific than `*`, `*` than `>`, and `>` than MQTT's `#`; a pattern that
/// has ended (an exact match) is more specific than any wildcard. `Greater`: `a` wins.
pub fn specificity(a: &Pattern, b: &Pattern) -> Ordering {
    fn rank(token: Option<&PatternToken>) -> u8 {
        match token {
            None => 0,
            Some(PatternToken::Literal(_)) => 1,
            Some(PatternToken::One) => 2,
            Some(PatternToken::OneOrMore) => 3,
            Some(PatternToken::ZeroOrMore) => 4,
        }
    }
    let (a, b) = (a.tokens(), b.tokens());
    for i in 0..a.len().max(b.len()) {
        let order = rank(b.get(i)).cmp(&rank(a.get(i)));
        if order != Ordering::Equal {
            return order;
        }
    }
    Ordering::Equal
}

/// One tenant's bindings as they are now: immutable, swapped whole on a change.
#[derive(Default)]
pub struct Bindings {
    all: Vec<Arc<Binding>>,
    trie: Trie<usize>,
}

impl Bindings {
    pub fn new(all: Vec<Arc<Binding>>) -> Self {
        let mut trie = Trie::new();
        for (i, binding) in all.iter().enumerate() {
            trie.insert(&binding.parsed, None, i);
        }
        Self { all, trie }
    }

    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    pub fn len(&self) -> usize {
        self.all.len()
    }

    /// Every binding, in pattern order.
    pub fn all(&self) -> &[Arc<Binding>] {
        &self.all
    }

    pub fn get(&self, pattern: &str) -> Option<&Arc<Binding>> {
        self.all.iter().find(|b| b.pattern == pattern)
    }

    /// The binding `subject` (native rendering) falls under: the most specific of
    /// those whose pattern matches it.
    pub fn for_subject(&self, subject: &str) -> Option<&Arc<Binding>> {
        let mut best: Option<usize> = None;
        self.trie.for_each_match(subject, &mut |found, _| {
            for &i in found {
                best = Some(match best {
                    Some(current)
                        if specificity(&self.all[i].parsed, &self.all[current].parsed)
                            != Ordering::Greater =>
                    {
                        current
                    }
                    _ => i,
                });
            }
        });
        best.map(|i| &self.all[i])
    }

    /// These bindings with `binding` in place of any of its pattern.
    pub fn with(&self, binding: Arc<Binding>) -> Self {
        let mut all: Vec<_> = self
            .all
            .iter()
            .filter(|b| b.pattern != binding.pattern)
            .cloned()
            .collect();
        all.push(binding);
        all.sort_by(|a, b| a.pattern.cmp(&b.pattern));
        Self::new(all)
    }

    /// These bindings without the one of `pattern`.
    pub fn without(&self, pattern: &str) -> Self {
        Self::new(
            self.all
                .iter()
                .filter(|b| b.pattern != pattern)
                .cloned()
                .collect(),
        )
    }
}

/// The bindings in force from stored versions `(pattern, version, record)` given by
/// pattern, then version: each pattern's newest version, unless it is a deletion.
/// `skipped` hears of versions that cannot be read or compiled.
pub fn current_bindings<'r>(
    versions: impl IntoIterator<Item = (&'r str, u64, &'r [u8])>,
    mut skipped: impl FnMut(&str, &str),
) -> Bindings {
    let mut newest: Vec<(&str, u64, &[u8])> = Vec::new();
    for (pattern, version, record) in versions {
        match newest.last_mut() {
            Some(last) if last.0 == pattern => *last = (pattern, version, record),
            _ => newest.push((pattern, version, record)),
        }
    }
    let mut all = Vec::new();
    for (pattern, version, record) in newest {
        let stored = match serde_json::from_slice::<StoredVersion>(record) {
            Ok(stored) => stored,
            Err(error) => {
                skipped(pattern, &error.to_string());
                continue;
            }
        };
        if stored.schema.is_none() {
            continue;
        }
        let Ok(version) = u32::try_from(version) else {
            skipped(pattern, "a version past u32");
            continue;
        };
        match Binding::new(pattern, version, stored.clone()) {
            Ok(binding) => all.push(Arc::new(binding)),
            Err(error) => {
                skipped(pattern, &error.to_string());
                if let Ok(binding) = Binding::unusable(pattern, version, stored, error.to_string())
                {
                    all.push(Arc::new(binding));
                }
            }
        }
    }
    Bindings::new(all)
}

#[cfg(test)]
mod tests;

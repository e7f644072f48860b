//! Reducers: how a key stream's events fold into a snapshot.
//!
//! A reducer is a pure function of the previous state and one event. Built in:
//! `last` (the newest message is the state) and `json-merge` (each event is an
//! RFC 7396 JSON merge patch applied to the state). More plug in by implementing
//! [`Reducer`] and naming it in [`ReducerKind`]. A reducer must never do I/O.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Folds events into state.
pub trait Reducer: Send + Sync {
    /// The state after `event`, given the state before it (`None` before the first).
    fn fold(&self, state: Option<&[u8]>, event: &[u8]) -> Result<Vec<u8>, String>;
}

/// The reducers a policy can name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReducerKind {
    /// The newest message is the state.
    #[default]
    Last,
    /// Every message is an RFC 7396 merge patch on the previous state.
    JsonMerge,
}

impl ReducerKind {
    pub fn reducer(self) -> &'static dyn Reducer {
        match self {
            ReducerKind::Last => &Last,
            ReducerKind::JsonMerge => &JsonMerge,
        }
    }
}

pub struct Last;

impl Reducer for Last {
    fn fold(&self, _state: Option<&[u8]>, event: &[u8]) -> Result<Vec<u8>, String> {
        Ok(event.to_vec())
    }
}

pub struct JsonMerge;

impl Reducer for JsonMerge {
    fn fold(&self, state: Option<&[u8]>, event: &[u8]) -> Result<Vec<u8>, String> {
        let patch: Value = serde_json::from_slice(event)
            .map_err(|e| format!("the event is not JSON, so it cannot be merged: {e}"))?;
        let mut target = match state {
            Some(bytes) => serde_json::from_slice(bytes)
                .map_err(|e| format!("the previous state is not JSON: {e}"))?,
            None => Value::Null,
        };
        merge_patch(&mut target, &patch);
        serde_json::to_vec(&target).map_err(|e| e.to_string())
    }
}

/// RFC 7396, section 2: `MergePatch(Target, Patch)`.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(object) = target {
        for (name, value) in patch {
            if value.is_null() {
                object.remove(name);
            } else {
                merge_patch(object.entry(name.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn merged(target: Value, patch: Value) -> Value {
        let mut target = target;
        merge_patch(&mut target, &patch);
        target
    }

    #[test]
    fn rfc_7396_examples() {
        // The test cases of RFC 7396, appendix A.
        let cases = [
            (json!({"a":"b"}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"b"}), json!({"b":"c"}), json!({"a":"b","b":"c"})),
            (json!({"a":"b"}), json!({"a":null}), json!({})),
            (
                json!({"a":"b","b":"c"}),
                json!({"a":null}),
                json!({"b":"c"}),
            ),
            (json!({"a":["b"]}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"c"}), json!({"a":["b"]}), json!({"a":["b"]})),
            (
                json!({"a":{"b":"c"}}),
                json!({"a":{"b":"d","c":null}}),
                json!({"a":{"b":"d"}}),
            ),
            (json!({"a":[{"b":"c"}]}), json!({"a":[1]}), json!({"a":[1]})),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a":"b"}), json!(["c"]), json!(["c"])),
            (json!({"a":"foo"}), json!(null), json!(null)),
            (json!({"a":"foo"}), json!("bar"), json!("bar")),
            (json!({"e":null}), json!({"a":1}), json!({"e":null,"a":1})),
            (json!([1, 2]), json!({"a":"b","c":null}), json!({"a":"b"})),
            (
                json!({}),
                json!({"a":{"bb":{"ccc":null}}}),
                json!({"a":{"bb":{}}}),
            ),
        ];
        for (target, patch, expected) in cases {
            assert_eq!(
                merged(target.clone(), patch.clone()),
                expected,
                "{target} + {patch}"
            );
        }
    }

    #[test]
    fn reducers_fold_events() {
        let merge = ReducerKind::JsonMerge.reducer();
        let state = merge.fold(None, br#"{"qty":1,"sku":"a"}"#).expect("json");
        let state = merge.fold(Some(&state), br#"{"qty":2}"#).expect("json");
        assert_eq!(
            serde_json::from_slice::<Value>(&state).expect("json"),
            json!({"qty":2,"sku":"a"})
        );
        assert!(merge.fold(Some(&state), b"not json").is_err());
        let last = ReducerKind::Last.reducer();
        assert_eq!(last.fold(Some(b"x"), b"y").expect("last"), b"y");
    }
}

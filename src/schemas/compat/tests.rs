//! The compatibility check's unit tests: each rule, each mode, the budget.

use serde_json::json;

use super::*;

/// [`check`], whose only failure with a standard budget and small schemas is a
/// breakage.
fn checked(mode: Mode, earlier: &[Value], new: &Value) -> Result<(), Breakage> {
    check(mode, earlier, new).map_err(|error| match error {
        CompatError::Breaks(breakage) => breakage,
        CompatError::OverBudget(over) => panic!("over budget: {over}"),
    })
}

fn backward(old: Value, new: Value) -> Result<(), Breakage> {
    checked(Mode::Backward, &[old], &new)
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
    let error = checked(Mode::Forward, &[closed], &gained).unwrap_err();
    assert_eq!(error.path, "#/properties/b");
    let open = json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {}}});
    let lost = json!({"type": "object", "properties": {"a": {"type": "string"}}});
    assert_eq!(checked(Mode::Full, &[open], &lost), Ok(()));
}

#[test]
fn transitive_modes_check_every_earlier_version() {
    let v1 = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
    let v2 = json!({"type": "object", "properties": {"n": {"type": "number"}}});
    let v3 = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
    // v3 can read v2's data? No: v2 allowed 1.5.
    assert!(checked(Mode::Backward, &[v1.clone(), v2.clone()], &v3).is_err());
    // Forward only against v2: v2 reads what v3 writes.
    assert_eq!(
        checked(Mode::Forward, &[v1.clone(), v2.clone()], &v3),
        Ok(())
    );
    let v3b = json!({"type": "object", "properties": {"n": {"type": "number", "minimum": 0}}});
    assert!(checked(Mode::Backward, &[v1.clone(), v2.clone()], &v3b).is_err());
    let v2b = json!({"type": "object", "properties": {"n": {"type": "number"}}});
    let v3c = json!({"type": "object", "properties": {"n": {"type": "number"}},
                     "description": "same"});
    assert_eq!(checked(Mode::BackwardTransitive, &[v1, v2b], &v3c), Ok(()));
    assert_eq!(checked(Mode::None, &[json!(true)], &json!(false)), Ok(()));
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

#[test]
fn large_enums_compare_as_sets() {
    let values =
        |n: usize| -> Value { Value::Array((0..n).map(|i| json!(format!("v{i:06}"))).collect()) };
    let old = json!({"enum": values(50_000)});
    let mut grown = values(50_001);
    if let Value::Array(items) = &mut grown {
        items.reverse();
    }
    let new = json!({"enum": grown});
    // 50,000 lookups in a set, where a scan made 1.25 billion comparisons.
    let mut budget = Budget::new(1_000_000, Duration::from_secs(60));
    let numbered = [(1, &old)];
    assert_eq!(
        check_numbered(Mode::BackwardTransitive, &numbered, 2, &new, &mut budget),
        Ok(())
    );
    let error = backward(new, old).unwrap_err();
    assert_eq!(error.path, "#/enum");
    assert!(error.what.contains("v050000"), "{error}");
    // Equal values only: `1` and `1.0` differ, which refuses, never accepts wrongly.
    assert!(backward(json!({"enum": [1.0]}), json!({"enum": [1]})).is_err());
    assert_eq!(
        backward(
            json!({"enum": [{"a": 1, "b": [2]}, -0.0]}),
            json!({"enum": [0.0, {"b": [2], "a": 1}]})
        ),
        Ok(())
    );
}

#[test]
fn a_check_past_its_budget_is_refused_as_such() {
    let values: Value = (0..1_000).map(|i| json!(i)).collect();
    let schema = json!({"enum": values});
    let earlier = [(1, &schema), (2, &schema), (3, &schema)];
    // About 3,000 steps a comparison: a set of 1,000 values, 1,000 looked up.
    let mut budget = Budget::new(4_000, Duration::from_secs(60));
    assert_eq!(
        check_numbered(Mode::FullTransitive, &earlier, 4, &schema, &mut budget),
        Err(CompatError::OverBudget(OverBudget::Steps(4_000)))
    );
    let mut budget = Budget::new(u64::MAX, Duration::ZERO);
    std::thread::sleep(Duration::from_millis(2));
    assert_eq!(
        check_numbered(Mode::FullTransitive, &earlier, 4, &schema, &mut budget),
        Err(CompatError::OverBudget(OverBudget::Time(Duration::ZERO)))
    );
    // Modes that compare fewer versions spend less.
    let mut budget = Budget::new(4_000, Duration::from_secs(60));
    assert_eq!(
        check_numbered(Mode::Backward, &earlier, 4, &schema, &mut budget),
        Ok(())
    );
    assert_eq!(compared(Mode::Backward, &earlier).len(), 1);
    assert_eq!(compared(Mode::FullTransitive, &earlier).len(), 3);
    assert!(compared(Mode::None, &earlier).is_empty());
}

#[test]
fn a_tuple_of_items_is_held_to_be_the_same() {
    let tuple = json!({"items": [{"type": "string"}]});
    assert_eq!(backward(tuple.clone(), tuple.clone()), Ok(()));
    let error = backward(json!({"items": {"type": "string"}}), tuple.clone()).unwrap_err();
    assert_eq!(error.path, "#/items");
    let error = backward(json!({}), tuple).unwrap_err();
    assert_eq!(error.path, "#/items");
}

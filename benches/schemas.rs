//! What checking one payload against a compiled schema costs (criterion): the
//! 10-field document of `schema_publish`, valid and invalid, against parsing it alone.
//!
//!     cargo bench --bench schemas

use canopy::schemas::{Binding, Mode, OnInvalid, StoredVersion};
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;

fn binding() -> Binding {
    let schema = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "device": {"type": "string", "maxLength": 64},
            "seq": {"type": "integer", "minimum": 0},
            "temp": {"type": "number", "minimum": -100, "maximum": 200},
            "humidity": {"type": "number", "minimum": 0, "maximum": 100},
            "unit": {"enum": ["C", "F"]},
            "ok": {"type": "boolean"},
            "battery": {"type": "integer", "minimum": 0, "maximum": 100},
            "firmware": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$"},
            "site": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8}
        },
        "required": ["device", "seq", "temp", "unit"],
        "additionalProperties": false
    });
    let stored = StoredVersion {
        schema: Some(schema),
        mode: Mode::Backward,
        on_invalid: OnInvalid::Reject,
        dead_letter: None,
        time_ms: 0,
    };
    Binding::new("bench.typed.*", 1, stored).expect("compiles")
}

fn bench(c: &mut Criterion) {
    let binding = binding();
    let valid = json!({
        "device": "sensor-17", "seq": 123456, "temp": 21.7, "humidity": 40.5, "unit": "C",
        "ok": true, "battery": 56, "firmware": "1.12.3", "site": "north-hall-2",
        "tags": ["roof", "east"]
    })
    .to_string()
    .into_bytes();
    let invalid = String::from_utf8(valid.clone())
        .expect("utf-8")
        .replace("\"C\"", "\"K\"")
        .into_bytes();
    assert!(binding.check(&valid).is_ok());
    assert!(binding.check(&invalid).is_err());
    let mut group = c.benchmark_group("schema_check");
    group.bench_function("parse only (serde_json::Value)", |b| {
        b.iter(|| serde_json::from_slice::<serde_json::Value>(&valid).expect("JSON"))
    });
    group.bench_function("check valid 10-field document", |b| {
        b.iter(|| binding.check(&valid))
    });
    group.bench_function("check invalid 10-field document", |b| {
        b.iter(|| binding.check(&invalid))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

use bytes::Bytes;
use serde_json::json;

use super::*;

fn message(subject: &str, offset: u64, payload: &str, headers: &str) -> StoredMessage {
    StoredMessage {
        subject: subject.to_owned(),
        version: offset * 10,
        offset,
        time_ms: 86_400_000 * 3 + offset,
        flags: 0,
        headers: Bytes::from(headers.to_owned()),
        payload: Bytes::from(payload.to_owned()),
    }
}

#[test]
fn columns_follow_the_pattern_and_the_schema() {
    let pattern = Pattern::parse_native("devices.*.temp.>").expect("pattern");
    let schema = json!({"type": "object", "properties": {
        "temp": {"type": "number"}, "n": {"type": "integer"}, "ok": {"type": "boolean"},
        "unit": {"type": "string"}, "where": {"type": "object"}, "offset": {"type": "string"}
    }});
    let names: Vec<_> = columns(&pattern, &["device".into()], Some(&schema))
        .iter()
        .map(|c| c.name().to_owned())
        .collect();
    // `offset` is a fixed column already, so the property of that name is left out.
    assert_eq!(
        names,
        [
            "subject",
            "device",
            "rest",
            "version",
            "offset",
            "time",
            "schema_version",
            "n",
            "ok",
            "temp",
            "unit",
            "where"
        ]
    );
    let plain: Vec<_> = columns(&pattern, &[], None)
        .iter()
        .map(|c| c.name().to_owned())
        .collect();
    assert_eq!(plain[1], "token2");
    assert_eq!(plain.last().map(String::as_str), Some("payload"));
    let schema = iceberg_schema(&columns(&pattern, &[], None)).expect("schema");
    assert!(schema.field_by_name("time").is_some_and(|f| f.required));
    assert!(partition_spec(&columns(&pattern, &[], None)).is_ok());
}

#[test]
fn a_batch_holds_each_messages_row() {
    let pattern = Pattern::parse_native("devices.*.temp").expect("pattern");
    let schema = json!({"properties": {"temp": {"type": "number"}, "tags": {"type": "array"}}});
    let cols = columns(&pattern, &["device".into()], Some(&schema));
    let arrow = Arc::new(
        iceberg::arrow::schema_to_arrow_schema(&iceberg_schema(&cols).expect("schema"))
            .expect("arrow"),
    );
    let a = message(
        "devices.d1.temp",
        7,
        r#"{"temp": 21.5, "tags": ["x"]}"#,
        "NATS/1.0\r\nCanopy-Schema: devices.*.temp@3\r\n\r\n",
    );
    let b = message("devices.d2.temp", 8, "not json", "");
    let batch = batch(&cols, &arrow, &[&a, &b]).expect("batch");
    assert_eq!(batch.num_rows(), 2);
    let text = arrow_cast_display(&batch);
    for want in ["devices.d1.temp", "d1", "d2", "21.5", "3"] {
        assert!(text.contains(want), "{want} in {text}");
    }
    let column = |name: &str| batch.column_by_name(name).expect(name);
    let tags = column("tags")
        .as_any()
        .downcast_ref::<arrow_array::StringArray>()
        .expect("text");
    assert_eq!(tags.value(0), r#"["x"]"#, "JSON kept as its text");
    assert_eq!(day_of(&a), 3);
    // The row without JSON keeps its place, with empty fields.
    assert_eq!(column("schema_version").null_count(), 1);
    assert_eq!(column("temp").null_count(), 1);
    assert_eq!(column("tags").null_count(), 1);
}

fn arrow_cast_display(batch: &RecordBatch) -> String {
    format!("{batch:?}")
}

#[test]
fn a_tables_columns_are_read_back_from_its_schema() {
    let pattern = Pattern::parse_native("devices.*.temp").expect("pattern");
    let schema = json!({"properties": {
        "temp": {"type": "number"}, "n": {"type": "integer"}, "ok": {"type": "boolean"},
        "unit": {"type": "string"}, "where": {"type": "object"}
    }});
    let made = columns(&pattern, &["device".into()], Some(&schema));
    let table = iceberg_schema(&made).expect("schema");
    assert_eq!(columns_of_table(&pattern, &["device".into()], &table), made);
    // Without the names it was made with, a wildcard's column is read as a field.
    let renamed = columns_of_table(&pattern, &[], &table);
    assert_eq!(
        renamed[1],
        Column::Field {
            name: "device".into(),
            kind: FieldKind::Text
        }
    );
}

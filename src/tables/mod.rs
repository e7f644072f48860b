//! Key streams as Apache Iceberg tables (`[[tables]]`): a pattern's stored messages,
//! in offset order, as rows of Parquet files under Iceberg metadata that engines
//! open: with a SQL catalog (SQLite) in a local folder, or in the store's S3 bucket
//! with the bucket as the catalog (`object_catalog.rs`).
//!
//! This file decides what a table looks like and what one message's row is, without
//! I/O: the columns (subject, one per wildcard, version, offset, time, schema
//! version, then the bound JSON Schema's top-level fields, or the payload when no
//! schema is bound), the Iceberg schema and day partitioning, and Arrow batches of
//! rows. `writer.rs` runs one task per table; `object_io.rs` and `object_catalog.rs`
//! put a table in a bucket. Must never change what is stored: a
//! table is a reader of the store like any other.

pub mod object_catalog;
pub mod object_io;
pub mod writer;

use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Float64Builder, Int32Builder, Int64Builder, StringBuilder,
    TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use canopy_subjects::{Pattern, PatternToken};
use iceberg::spec::{NestedField, PrimitiveType, Schema, Transform, Type, UnboundPartitionSpec};
use serde_json::Value;

use crate::store::StoredMessage;

/// The snapshot summary property that holds the last offset a commit holds.
pub const COMMITTED_OFFSET: &str = "canopy.committed-offset";

/// How a schema field is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    Long,
    Double,
    Boolean,
    /// A string as it is; anything else (objects, arrays, unions) as its JSON text.
    Text,
}

/// One column of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Column {
    Subject,
    /// The subject's token at this place (`rest`: it and all after it).
    Token {
        name: String,
        at: usize,
        rest: bool,
    },
    Version,
    Offset,
    Time,
    SchemaVersion,
    /// A top-level field of the bound schema.
    Field {
        name: String,
        kind: FieldKind,
    },
    /// The payload as text (no schema bound when the table was made).
    Payload,
}

impl Column {
    pub fn name(&self) -> &str {
        match self {
            Column::Subject => "subject",
            Column::Token { name, .. } | Column::Field { name, .. } => name,
            Column::Version => "version",
            Column::Offset => "offset",
            Column::Time => "time",
            Column::SchemaVersion => "schema_version",
            Column::Payload => "payload",
        }
    }
}

/// The kind a JSON Schema property's type maps to.
fn kind_of(property: &Value) -> FieldKind {
    match property.get("type").and_then(Value::as_str) {
        Some("integer") => FieldKind::Long,
        Some("number") => FieldKind::Double,
        Some("boolean") => FieldKind::Boolean,
        _ => FieldKind::Text,
    }
}

/// The columns of a table over `pattern`, with `names` for its wildcards and the
/// top-level properties of `schema` (the binding's, when there is one). Property
/// names that would clash with the fixed columns are left out.
pub fn columns(pattern: &Pattern, names: &[String], schema: Option<&Value>) -> Vec<Column> {
    let mut all = vec![Column::Subject];
    let mut wildcard = 0;
    for (at, token) in pattern.tokens().iter().enumerate() {
        if token.is_wildcard() {
            let rest = matches!(token, PatternToken::OneOrMore | PatternToken::ZeroOrMore);
            let name = names.get(wildcard).cloned().unwrap_or_else(|| {
                if rest {
                    "rest".to_owned()
                } else {
                    format!("token{}", at + 1)
                }
            });
            all.push(Column::Token { name, at, rest });
            wildcard += 1;
        }
    }
    all.extend([
        Column::Version,
        Column::Offset,
        Column::Time,
        Column::SchemaVersion,
    ]);
    let properties = schema
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object);
    match properties {
        Some(properties) => {
            for (name, property) in properties {
                if all.iter().any(|c| c.name() == name) {
                    continue;
                }
                all.push(Column::Field {
                    name: name.clone(),
                    kind: kind_of(property),
                });
            }
        }
        None => all.push(Column::Payload),
    }
    all
}

/// The columns of a table as its schema has them (`schema`, in its order): the fixed ones by
/// name, the wildcards by `names` (or their default names), the rest fields of the
/// payload by their type.
pub fn columns_of_table(pattern: &Pattern, names: &[String], schema: &Schema) -> Vec<Column> {
    let fixed = columns(pattern, names, None);
    schema
        .as_struct()
        .fields()
        .iter()
        .map(|field| {
            if let Some(column) = fixed.iter().find(|c| c.name() == field.name) {
                return column.clone();
            }
            let kind = match *field.field_type {
                Type::Primitive(PrimitiveType::Long | PrimitiveType::Int) => FieldKind::Long,
                Type::Primitive(PrimitiveType::Double | PrimitiveType::Float) => FieldKind::Double,
                Type::Primitive(PrimitiveType::Boolean) => FieldKind::Boolean,
                _ => FieldKind::Text,
            };
            Column::Field {
                name: field.name.clone(),
                kind,
            }
        })
        .collect()
}

/// The Iceberg type of a payload field's column.
pub fn field_type(kind: FieldKind) -> PrimitiveType {
    match kind {
        FieldKind::Long => PrimitiveType::Long,
        FieldKind::Double => PrimitiveType::Double,
        FieldKind::Boolean => PrimitiveType::Boolean,
        FieldKind::Text => PrimitiveType::String,
    }
}

/// The Iceberg schema of `columns` (field ids from 1, in order).
pub fn iceberg_schema(columns: &[Column]) -> iceberg::Result<Schema> {
    let fields = columns.iter().zip(1..).map(|(column, id)| {
        let (kind, required) = match column {
            Column::Subject | Column::Token { .. } => (PrimitiveType::String, true),
            Column::Version | Column::Offset => (PrimitiveType::Long, true),
            Column::Time => (PrimitiveType::Timestamptz, true),
            Column::SchemaVersion => (PrimitiveType::Int, false),
            Column::Field { kind, .. } => (field_type(*kind), false),
            Column::Payload => (PrimitiveType::String, false),
        };
        let field = if required {
            NestedField::required(id, column.name(), Type::Primitive(kind))
        } else {
            NestedField::optional(id, column.name(), Type::Primitive(kind))
        };
        Arc::new(field)
    });
    Schema::builder().with_fields(fields).build()
}

/// Partitioned by the day of `time`.
pub fn partition_spec(columns: &[Column]) -> iceberg::Result<UnboundPartitionSpec> {
    let time = columns
        .iter()
        .zip(1..)
        .find(|(c, _)| **c == Column::Time)
        .map_or(0, |(_, id)| id);
    UnboundPartitionSpec::builder()
        .with_spec_id(0)
        .add_partition_field(time, "time_day", Transform::Day)
        .map(|b| b.build())
}

/// The day (since the epoch) a message's row is partitioned under.
pub fn day_of(message: &StoredMessage) -> i32 {
    i32::try_from(message.time_ms / 86_400_000).unwrap_or(i32::MAX)
}

/// The schema version a stored message was checked against, from its header.
fn schema_version(message: &StoredMessage) -> Option<i32> {
    if message.headers.is_empty() {
        return None;
    }
    let headers = canopy_protocols::native::HeaderMap::parse(&message.headers).ok()?;
    headers
        .entries
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(crate::schemas::SCHEMA_HEADER))
        .and_then(|(_, value)| value.rsplit_once('@'))
        .and_then(|(_, version)| version.trim().parse().ok())
}

/// Builds the rows of `messages` as one batch of `arrow_schema` (which must be the
/// table schema's, with its field ids).
pub fn batch(
    columns: &[Column],
    arrow_schema: &Arc<arrow_schema::Schema>,
    messages: &[&StoredMessage],
) -> Result<RecordBatch, arrow_schema::ArrowError> {
    let documents: Vec<Option<serde_json::Map<String, Value>>> =
        if columns.iter().any(|c| matches!(c, Column::Field { .. })) {
            messages
                .iter()
                .map(|m| match serde_json::from_slice(&m.payload) {
                    Ok(Value::Object(fields)) => Some(fields),
                    _ => None,
                })
                .collect()
        } else {
            Vec::new()
        };
    let n = messages.len();
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(columns.len());
    for column in columns {
        let array: ArrayRef = match column {
            Column::Subject => {
                let mut b = StringBuilder::with_capacity(n, n * 16);
                for m in messages {
                    b.append_value(&m.subject);
                }
                Arc::new(b.finish())
            }
            Column::Token { at, rest, .. } => {
                let mut b = StringBuilder::with_capacity(n, n * 8);
                for m in messages {
                    let mut tokens = m.subject.splitn(at + 1 + usize::from(!rest), '.');
                    let value = tokens.nth(*at).unwrap_or_default();
                    b.append_value(value);
                }
                Arc::new(b.finish())
            }
            Column::Version | Column::Offset => {
                let mut b = Int64Builder::with_capacity(n);
                for m in messages {
                    let v = if *column == Column::Version {
                        m.version
                    } else {
                        m.offset
                    };
                    b.append_value(i64::try_from(v).unwrap_or(i64::MAX));
                }
                Arc::new(b.finish())
            }
            Column::Time => {
                let mut b = TimestampMicrosecondBuilder::with_capacity(n).with_timezone("+00:00");
                for m in messages {
                    b.append_value(
                        i64::try_from(m.time_ms.saturating_mul(1000)).unwrap_or(i64::MAX),
                    );
                }
                Arc::new(b.finish())
            }
            Column::SchemaVersion => {
                let mut b = Int32Builder::with_capacity(n);
                for m in messages {
                    b.append_option(schema_version(m));
                }
                Arc::new(b.finish())
            }
            Column::Payload => {
                let mut b = StringBuilder::with_capacity(n, n * 64);
                for m in messages {
                    b.append_value(String::from_utf8_lossy(&m.payload));
                }
                Arc::new(b.finish())
            }
            Column::Field { name, kind } => {
                let value = |i: usize| documents[i].as_ref().and_then(|d| d.get(name));
                match kind {
                    FieldKind::Long => {
                        let mut b = Int64Builder::with_capacity(n);
                        for i in 0..n {
                            b.append_option(value(i).and_then(Value::as_i64));
                        }
                        Arc::new(b.finish())
                    }
                    FieldKind::Double => {
                        let mut b = Float64Builder::with_capacity(n);
                        for i in 0..n {
                            b.append_option(value(i).and_then(Value::as_f64));
                        }
                        Arc::new(b.finish())
                    }
                    FieldKind::Boolean => {
                        let mut b = BooleanBuilder::with_capacity(n);
                        for i in 0..n {
                            b.append_option(value(i).and_then(Value::as_bool));
                        }
                        Arc::new(b.finish())
                    }
                    FieldKind::Text => {
                        let mut b = StringBuilder::with_capacity(n, n * 16);
                        for i in 0..n {
                            match value(i) {
                                Some(Value::String(text)) => b.append_value(text),
                                Some(Value::Null) | None => b.append_null(),
                                Some(other) => b.append_value(other.to_string()),
                            }
                        }
                        Arc::new(b.finish())
                    }
                }
            }
        };
        arrays.push(array);
    }
    RecordBatch::try_new(Arc::clone(arrow_schema), arrays)
}

#[cfg(test)]
mod tests;

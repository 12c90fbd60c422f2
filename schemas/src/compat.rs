//! Schema compatibility checks without a registry, as the registry decides them.
//!
//! BACKWARD (the subject default in Caudal): consumers on the new schema can read data
//! written with the old one. Adding a field with a default and removing a field are
//! BACKWARD compatible; adding a field without a default or changing a field's type
//! incompatibly is not. FORWARD is the mirror image (old consumers read new data), so it
//! is removing a field that has no default which FORWARD rejects. FULL is both.
//!
//! Decided by apache-avro's [`SchemaCompatibility::can_read`]. A `Partial` answer (some
//! enum symbols or union branches of the writer have no match in the reader) counts as
//! incompatible, as in the Java implementation the registries use.

use std::fmt;

use apache_avro::error::CompatibilityError;
use apache_avro::schema_compatibility::{Compatibility, SchemaCompatibility};
use apache_avro::Schema;

/// A schema-registry compatibility level (the ones Caudal checks locally; the registry
/// also knows `NONE` and the `_TRANSITIVE` variants, which [`CompatibilityLevel::parse`]
/// accepts but [`check`] treats as their non-transitive form or as always compatible).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompatibilityLevel {
    /// New readers read old data.
    Backward,
    /// Old readers read new data.
    Forward,
    /// Both.
    Full,
    /// Anything goes.
    None,
}

impl CompatibilityLevel {
    /// The registry's spelling (`BACKWARD`, `FORWARD`, `FULL`, `NONE`).
    pub fn as_str(self) -> &'static str {
        match self {
            CompatibilityLevel::Backward => "BACKWARD",
            CompatibilityLevel::Forward => "FORWARD",
            CompatibilityLevel::Full => "FULL",
            CompatibilityLevel::None => "NONE",
        }
    }

    /// Parses the registry's spelling; `_TRANSITIVE` suffixes map to the base level.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim_end_matches("_TRANSITIVE") {
            "BACKWARD" => Some(CompatibilityLevel::Backward),
            "FORWARD" => Some(CompatibilityLevel::Forward),
            "FULL" => Some(CompatibilityLevel::Full),
            "NONE" => Some(CompatibilityLevel::None),
            _ => None,
        }
    }
}

impl fmt::Display for CompatibilityLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a new schema is not compatible with an old one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{level} incompatible: {reason}")]
pub struct Incompatibility {
    /// The level that was checked.
    pub level: CompatibilityLevel,
    /// A human-readable reason naming the field when one is at fault.
    pub reason: String,
}

/// BACKWARD: can a consumer on `new_reader` read data written with `old_writer`?
pub fn check_backward(new_reader: &Schema, old_writer: &Schema) -> Result<(), Incompatibility> {
    can_read(old_writer, new_reader, "old", "new")
        .map_err(|reason| Incompatibility { level: CompatibilityLevel::Backward, reason })
}

/// FORWARD: can a consumer still on `old_reader` read data written with `new_writer`?
pub fn check_forward(new_writer: &Schema, old_reader: &Schema) -> Result<(), Incompatibility> {
    can_read(new_writer, old_reader, "new", "old")
        .map_err(|reason| Incompatibility { level: CompatibilityLevel::Forward, reason })
}

/// Checks `new` against `old` at `level`.
pub fn check(level: CompatibilityLevel, new: &Schema, old: &Schema) -> Result<(), Incompatibility> {
    match level {
        CompatibilityLevel::Backward => check_backward(new, old),
        CompatibilityLevel::Forward => check_forward(new, old),
        CompatibilityLevel::Full => check_backward(new, old)
            .and_then(|()| check_forward(new, old))
            .map_err(|e| Incompatibility { level: CompatibilityLevel::Full, reason: e.reason }),
        CompatibilityLevel::None => Ok(()),
    }
}

fn can_read(writer: &Schema, reader: &Schema, writer_name: &str, reader_name: &str) -> Result<(), String> {
    match SchemaCompatibility::can_read(writer, reader) {
        Ok(Compatibility::Full) => Ok(()),
        Ok(Compatibility::Partial) => Err(format!(
            "some values written with the {writer_name} schema cannot be read with the \
             {reader_name} schema (enum symbols or union branches missing from the \
             {reader_name} schema)"
        )),
        Err(e) => Err(explain(&e, writer_name, reader_name)),
    }
}

fn explain(e: &CompatibilityError, writer_name: &str, reader_name: &str) -> String {
    match e {
        CompatibilityError::MissingDefaultValue(field) => format!(
            "field `{field}` of the {reader_name} schema has no default and is missing \
             from the {writer_name} schema (add a default, or keep the field)"
        ),
        CompatibilityError::FieldTypeMismatch(field, inner) => format!(
            "field `{field}` changed type between the {writer_name} and {reader_name} \
             schema: {}",
            explain(inner, writer_name, reader_name)
        ),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::AvroRecord;
    use crate::records::SensorReading;

    fn schema(fields: &str) -> Schema {
        Schema::parse_str(&format!(
            r#"{{"type":"record","name":"SensorReading","namespace":"io.caudal","fields":[{fields}]}}"#
        ))
        .unwrap()
    }

    const BASE: &str = r#"{"name":"sensor_id","type":"long"},
        {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
        {"name":"lat","type":"double"},{"name":"lon","type":"double"},
        {"name":"temp_f","type":"double"}"#;

    #[test]
    fn checked_in_schema_matches_the_test_base() {
        assert_eq!(&schema(BASE), SensorReading::schema());
    }

    #[test]
    fn added_field_with_default_is_backward_compatible() {
        let new = schema(&format!(r#"{BASE},{{"name":"unit","type":"string","default":"F"}}"#));
        assert_eq!(check_backward(&new, SensorReading::schema()), Ok(()));
        assert_eq!(check_forward(&new, SensorReading::schema()), Ok(()));
        assert_eq!(check(CompatibilityLevel::Full, &new, SensorReading::schema()), Ok(()));
    }

    #[test]
    fn added_field_without_default_is_rejected_with_its_name() {
        let new = schema(&format!(r#"{BASE},{{"name":"unit","type":"string"}}"#));
        let err = check_backward(&new, SensorReading::schema()).unwrap_err();
        assert_eq!(err.level, CompatibilityLevel::Backward);
        assert!(err.reason.contains("`unit`"), "{err}");
        assert!(err.reason.contains("no default"), "{err}");
        // Old readers simply skip it.
        assert_eq!(check_forward(&new, SensorReading::schema()), Ok(()));
    }

    #[test]
    fn removed_required_field_is_backward_compatible_but_not_forward() {
        // Registry semantics: BACKWARD allows deleting fields (new readers ignore them);
        // it is FORWARD (and FULL) that rejects deleting a field without a default.
        let new = schema(
            r#"{"name":"sensor_id","type":"long"},
            {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
            {"name":"lat","type":"double"},{"name":"lon","type":"double"}"#,
        );
        assert_eq!(check_backward(&new, SensorReading::schema()), Ok(()));
        let err = check_forward(&new, SensorReading::schema()).unwrap_err();
        assert!(err.reason.contains("`temp_f`"), "{err}");
        let err = check(CompatibilityLevel::Full, &new, SensorReading::schema()).unwrap_err();
        assert_eq!(err.level, CompatibilityLevel::Full);
        assert!(err.reason.contains("`temp_f`"), "{err}");
    }

    #[test]
    fn changed_field_type_is_rejected() {
        let new = schema(
            r#"{"name":"sensor_id","type":"string"},
            {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
            {"name":"lat","type":"double"},{"name":"lon","type":"double"},
            {"name":"temp_f","type":"double"}"#,
        );
        let err = check_backward(&new, SensorReading::schema()).unwrap_err();
        assert!(err.reason.contains("`sensor_id`"), "{err}");
    }

    #[test]
    fn widening_a_type_is_backward_compatible() {
        let old = schema(r#"{"name":"n","type":"int"}"#);
        let new = schema(r#"{"name":"n","type":"long"}"#);
        assert_eq!(check_backward(&new, &old), Ok(()));
        assert!(check_forward(&new, &old).is_err());
    }

    #[test]
    fn enum_losing_a_symbol_is_rejected() {
        let old = schema(r#"{"name":"e","type":{"type":"enum","name":"E","symbols":["A","B"]}}"#);
        let new = schema(r#"{"name":"e","type":{"type":"enum","name":"E","symbols":["A"]}}"#);
        let err = check_backward(&new, &old).unwrap_err();
        assert!(err.reason.contains("enum symbols"), "{err}");
    }

    #[test]
    fn levels_parse_from_registry_spelling() {
        assert_eq!(CompatibilityLevel::parse("BACKWARD_TRANSITIVE"), Some(CompatibilityLevel::Backward));
        assert_eq!(CompatibilityLevel::parse("FULL"), Some(CompatibilityLevel::Full));
        assert_eq!(CompatibilityLevel::parse("bogus"), None);
        assert_eq!(CompatibilityLevel::Backward.to_string(), "BACKWARD");
    }
}

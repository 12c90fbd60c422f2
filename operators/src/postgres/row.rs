//! Table columns derived from a record: its serde fields, in order, as typed SQL values.
//!
//! A record is a struct of scalar fields (integers, floats, booleans, strings); each field
//! becomes a column: integers `BIGINT`, floats `DOUBLE PRECISION`, booleans `BOOLEAN`,
//! strings and chars `TEXT`. Anything else (nested structs, sequences, `None`) is an error
//! that names the field — the sink fails loudly instead of writing a wrong row.

use serde::ser::{self, Impossible, Serialize, SerializeStruct};
use std::fmt;

/// The SQL type of a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlType {
    /// `BIGINT` (`int8`).
    BigInt,
    /// `DOUBLE PRECISION` (`float8`).
    Double,
    /// `BOOLEAN`.
    Bool,
    /// `TEXT`.
    Text,
}

impl SqlType {
    /// The type in `CREATE TABLE`.
    pub fn ddl(self) -> &'static str {
        match self {
            SqlType::BigInt => "BIGINT",
            SqlType::Double => "DOUBLE PRECISION",
            SqlType::Bool => "BOOLEAN",
            SqlType::Text => "TEXT",
        }
    }

    /// The array type of an `unnest($n::…)` parameter.
    pub fn array_cast(self) -> &'static str {
        match self {
            SqlType::BigInt => "int8[]",
            SqlType::Double => "float8[]",
            SqlType::Bool => "bool[]",
            SqlType::Text => "text[]",
        }
    }
}

/// One field's value.
#[derive(Debug, Clone, PartialEq)]
pub enum SqlValue {
    /// An integer.
    BigInt(i64),
    /// A float.
    Double(f64),
    /// A boolean.
    Bool(bool),
    /// A string.
    Text(String),
}

impl SqlValue {
    /// The column type of this value.
    pub fn sql_type(&self) -> SqlType {
        match self {
            SqlValue::BigInt(_) => SqlType::BigInt,
            SqlValue::Double(_) => SqlType::Double,
            SqlValue::Bool(_) => SqlType::Bool,
            SqlValue::Text(_) => SqlType::Text,
        }
    }
}

/// Why a record cannot become a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowError(pub String);

impl fmt::Display for RowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RowError {}

impl ser::Error for RowError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        RowError(msg.to_string())
    }
}

/// Appends the fields of `record` as `(name, value)` to `out`.
pub fn to_row<T: Serialize>(record: &T, out: &mut Vec<(&'static str, SqlValue)>) -> Result<(), RowError> {
    record.serialize(RowSerializer { out })
}

struct RowSerializer<'a> {
    out: &'a mut Vec<(&'static str, SqlValue)>,
}

/// Serializes one field's value.
struct ValueSerializer {
    field: &'static str,
}

fn not_a_struct(what: &str) -> RowError {
    RowError(format!("a PostgreSQL row must be a struct of scalar fields, got {what}"))
}

macro_rules! reject {
    ($($name:ident: $ty:ty => $what:expr),* $(,)?) => {
        $(fn $name(self, _v: $ty) -> Result<Self::Ok, Self::Error> { Err(self.fail($what)) })*
    };
}

impl RowSerializer<'_> {
    fn fail(&self, what: &str) -> RowError {
        not_a_struct(what)
    }
}

impl<'a> ser::Serializer for RowSerializer<'a> {
    type Ok = ();
    type Error = RowError;
    type SerializeSeq = Impossible<(), RowError>;
    type SerializeTuple = Impossible<(), RowError>;
    type SerializeTupleStruct = Impossible<(), RowError>;
    type SerializeTupleVariant = Impossible<(), RowError>;
    type SerializeMap = Impossible<(), RowError>;
    type SerializeStruct = Self;
    type SerializeStructVariant = Impossible<(), RowError>;

    reject! {
        serialize_bool: bool => "a bool", serialize_i8: i8 => "an integer", serialize_i16: i16 => "an integer",
        serialize_i32: i32 => "an integer", serialize_i64: i64 => "an integer", serialize_u8: u8 => "an integer",
        serialize_u16: u16 => "an integer", serialize_u32: u32 => "an integer", serialize_u64: u64 => "an integer",
        serialize_f32: f32 => "a float", serialize_f64: f64 => "a float", serialize_char: char => "a char",
        serialize_str: &str => "a string", serialize_bytes: &[u8] => "bytes",
    }

    fn serialize_none(self) -> Result<(), RowError> {
        Err(not_a_struct("None"))
    }
    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result<(), RowError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), RowError> {
        Err(not_a_struct("()"))
    }
    fn serialize_unit_struct(self, name: &'static str) -> Result<(), RowError> {
        Err(not_a_struct(name))
    }
    fn serialize_unit_variant(self, name: &'static str, _: u32, _: &'static str) -> Result<(), RowError> {
        Err(not_a_struct(name))
    }
    fn serialize_newtype_struct<T: ?Sized + Serialize>(self, _: &'static str, v: &T) -> Result<(), RowError> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        name: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), RowError> {
        Err(not_a_struct(name))
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, RowError> {
        Err(not_a_struct("a sequence"))
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, RowError> {
        Err(not_a_struct("a tuple"))
    }
    fn serialize_tuple_struct(
        self,
        name: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, RowError> {
        Err(not_a_struct(name))
    }
    fn serialize_tuple_variant(
        self,
        name: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, RowError> {
        Err(not_a_struct(name))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, RowError> {
        Err(not_a_struct("a map"))
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, RowError> {
        Ok(self)
    }
    fn serialize_struct_variant(
        self,
        name: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, RowError> {
        Err(not_a_struct(name))
    }
}

impl SerializeStruct for RowSerializer<'_> {
    type Ok = ();
    type Error = RowError;

    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), RowError> {
        let v = value.serialize(ValueSerializer { field: key })?;
        self.out.push((key, v));
        Ok(())
    }

    fn end(self) -> Result<(), RowError> {
        Ok(())
    }
}

impl ValueSerializer {
    fn fail(&self, what: &str) -> RowError {
        RowError(format!(
            "field `{}` is {what}; PostgreSQL sink columns are integers, floats, booleans or strings",
            self.field
        ))
    }
}

impl ser::Serializer for ValueSerializer {
    type Ok = SqlValue;
    type Error = RowError;
    type SerializeSeq = Impossible<SqlValue, RowError>;
    type SerializeTuple = Impossible<SqlValue, RowError>;
    type SerializeTupleStruct = Impossible<SqlValue, RowError>;
    type SerializeTupleVariant = Impossible<SqlValue, RowError>;
    type SerializeMap = Impossible<SqlValue, RowError>;
    type SerializeStruct = Impossible<SqlValue, RowError>;
    type SerializeStructVariant = Impossible<SqlValue, RowError>;

    fn serialize_bool(self, v: bool) -> Result<SqlValue, RowError> {
        Ok(SqlValue::Bool(v))
    }
    fn serialize_i8(self, v: i8) -> Result<SqlValue, RowError> {
        Ok(SqlValue::BigInt(v.into()))
    }
    fn serialize_i16(self, v: i16) -> Result<SqlValue, RowError> {
        Ok(SqlValue::BigInt(v.into()))
    }
    fn serialize_i32(self, v: i32) -> Result<SqlValue, RowError> {
        Ok(SqlValue::BigInt(v.into()))
    }
    fn serialize_i64(self, v: i64) -> Result<SqlValue, RowError> {
        Ok(SqlValue::BigInt(v))
    }
    fn serialize_u8(self, v: u8) -> Result<SqlValue, RowError> {
        Ok(SqlValue::BigInt(v.into()))
    }
    fn serialize_u16(self, v: u16) -> Result<SqlValue, RowError> {
        Ok(SqlValue::BigInt(v.into()))
    }
    fn serialize_u32(self, v: u32) -> Result<SqlValue, RowError> {
        Ok(SqlValue::BigInt(v.into()))
    }
    fn serialize_u64(self, v: u64) -> Result<SqlValue, RowError> {
        i64::try_from(v)
            .map(SqlValue::BigInt)
            .map_err(|_| RowError(format!("field `{}` = {v} does not fit a BIGINT", self.field)))
    }
    fn serialize_f32(self, v: f32) -> Result<SqlValue, RowError> {
        Ok(SqlValue::Double(v.into()))
    }
    fn serialize_f64(self, v: f64) -> Result<SqlValue, RowError> {
        Ok(SqlValue::Double(v))
    }
    fn serialize_char(self, v: char) -> Result<SqlValue, RowError> {
        Ok(SqlValue::Text(v.to_string()))
    }
    fn serialize_str(self, v: &str) -> Result<SqlValue, RowError> {
        Ok(SqlValue::Text(v.to_string()))
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<SqlValue, RowError> {
        Err(self.fail("bytes"))
    }
    fn serialize_none(self) -> Result<SqlValue, RowError> {
        Err(self.fail("None (NULL columns are not supported)"))
    }
    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result<SqlValue, RowError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<SqlValue, RowError> {
        Err(self.fail("()"))
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<SqlValue, RowError> {
        Err(self.fail("a unit struct"))
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<SqlValue, RowError> {
        Ok(SqlValue::Text(variant.to_string()))
    }
    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        v: &T,
    ) -> Result<SqlValue, RowError> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<SqlValue, RowError> {
        Err(self.fail("an enum with data"))
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, RowError> {
        Err(self.fail("a sequence"))
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, RowError> {
        Err(self.fail("a tuple"))
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, RowError> {
        Err(self.fail("a tuple struct"))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, RowError> {
        Err(self.fail("an enum with data"))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, RowError> {
        Err(self.fail("a map"))
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, RowError> {
        Err(self.fail("a nested struct"))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, RowError> {
        Err(self.fail("an enum with data"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;

    #[derive(Serialize)]
    struct Reading {
        sensor_id: u64,
        ts: i64,
        temp_c: f64,
        ok: bool,
        site: String,
    }

    #[derive(Serialize)]
    struct Nested {
        inner: Reading,
    }

    #[test]
    fn fields_become_typed_columns_in_order() {
        let mut row = Vec::new();
        let r = Reading { sensor_id: 7, ts: 1_000, temp_c: 21.5, ok: true, site: "a'b".into() };
        to_row(&r, &mut row).unwrap();
        assert_eq!(
            row,
            vec![
                ("sensor_id", SqlValue::BigInt(7)),
                ("ts", SqlValue::BigInt(1_000)),
                ("temp_c", SqlValue::Double(21.5)),
                ("ok", SqlValue::Bool(true)),
                ("site", SqlValue::Text("a'b".into())),
            ]
        );
    }

    #[test]
    fn unsupported_shapes_name_the_field() {
        let mut row = Vec::new();
        let r = Reading { sensor_id: 7, ts: 1, temp_c: 0.0, ok: false, site: String::new() };
        let e = to_row(&Nested { inner: r }, &mut row).unwrap_err();
        assert!(e.0.contains("`inner`") && e.0.contains("nested struct"), "{e}");
        let e = to_row(&42_u32, &mut row).unwrap_err();
        assert!(e.0.contains("struct of scalar fields"), "{e}");
        #[derive(Serialize)]
        struct Big {
            n: u64,
        }
        let e = to_row(&Big { n: u64::MAX }, &mut row).unwrap_err();
        assert!(e.0.contains("BIGINT"), "{e}");
    }
}

//! A record type's Avro schema as an Iceberg table schema, and its records as Arrow batches.
//!
//! **In:** the Avro schema of [`caudal_schemas::AvroRecord`] (the checked-in `.avsc`) and the
//! table's current schema. **Out:** the schema a new table gets, the columns an existing
//! table must gain (schema evolution: a field the record type gained becomes an optional
//! column; old files read it as null), and [`RecordBatch`]es in the table's column order.
//!
//! Types: `long`, `int`, `double`, `float`, `boolean`, `string`, `bytes` map to the Iceberg
//! primitives of the same name, `timestamp-millis`/`-micros` to `timestamptz`, a union
//! `[null, T]` to an optional `T`. A field of any other type, a column whose type differs
//! from the field's, or a required column the record type lacks fails at start, naming the
//! column.

use arrow_array::builder::{
    ArrayBuilder, BinaryBuilder, BooleanBuilder, Float32Builder, Float64Builder, Int32Builder, Int64Builder,
    LargeBinaryBuilder, LargeStringBuilder, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, SchemaRef as ArrowSchemaRef, TimeUnit};
use caudal_schemas::codec::{get_boolean, get_bytes, get_double, get_index, get_long};
use caudal_schemas::{AvroRecord, Schema as AvroSchema};
use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use iceberg::transaction::AddColumn;
use std::sync::Arc;

/// The Avro type of one field, as far as a column needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Long,
    Int,
    Double,
    Float,
    Boolean,
    String,
    Bytes,
    TimestampMillis,
    TimestampMicros,
}

impl Kind {
    fn of(schema: &AvroSchema) -> Option<Kind> {
        Some(match schema {
            AvroSchema::Long => Kind::Long,
            AvroSchema::Int => Kind::Int,
            AvroSchema::Double => Kind::Double,
            AvroSchema::Float => Kind::Float,
            AvroSchema::Boolean => Kind::Boolean,
            AvroSchema::String => Kind::String,
            AvroSchema::Bytes => Kind::Bytes,
            AvroSchema::TimestampMillis => Kind::TimestampMillis,
            AvroSchema::TimestampMicros => Kind::TimestampMicros,
            _ => return None,
        })
    }

    fn iceberg(self) -> PrimitiveType {
        match self {
            Kind::Long => PrimitiveType::Long,
            Kind::Int => PrimitiveType::Int,
            Kind::Double => PrimitiveType::Double,
            Kind::Float => PrimitiveType::Float,
            Kind::Boolean => PrimitiveType::Boolean,
            Kind::String => PrimitiveType::String,
            Kind::Bytes => PrimitiveType::Binary,
            Kind::TimestampMillis | Kind::TimestampMicros => PrimitiveType::Timestamptz,
        }
    }
}

/// One field of the record, in Avro order.
#[derive(Debug, Clone)]
struct Field {
    name: String,
    kind: Kind,
    /// `Some(i)`: a union whose branch `i` is `null` (the other branch is `kind`).
    null_branch: Option<usize>,
}

/// The fields of a record type.
#[derive(Debug, Clone)]
pub(crate) struct RecordLayout {
    fields: Vec<Field>,
}

impl RecordLayout {
    /// The layout of `R`, or which field has a type a column cannot hold.
    pub(crate) fn of<R: AvroRecord>() -> Result<Self, String> {
        let AvroSchema::Record(record) = R::schema() else {
            return Err("the record type's Avro schema is not a record".to_string());
        };
        let mut fields = Vec::new();
        for f in &record.fields {
            let unsupported = || {
                format!("field `{}` has Avro type {:?}, which no Iceberg column here holds", f.name, f.schema)
            };
            let (kind, null_branch) = match &f.schema {
                AvroSchema::Union(u) => {
                    let v = u.variants();
                    match (v.len(), v.iter().position(|s| matches!(s, AvroSchema::Null))) {
                        (2, Some(null)) => (Kind::of(&v[1 - null]).ok_or_else(unsupported)?, Some(null)),
                        _ => return Err(unsupported()),
                    }
                }
                other => (Kind::of(other).ok_or_else(unsupported)?, None),
            };
            fields.push(Field { name: f.name.clone(), kind, null_branch });
        }
        Ok(RecordLayout { fields })
    }

    /// The schema of a new table: one column per field, ids from 1, optional where the
    /// field is nullable.
    pub(crate) fn table_schema(&self) -> iceberg::Result<Schema> {
        let columns = self.fields.iter().enumerate().map(|(i, f)| {
            let t = Type::Primitive(f.kind.iceberg());
            let id = i as i32 + 1;
            Arc::new(match f.null_branch {
                Some(_) => NestedField::optional(id, &f.name, t),
                None => NestedField::required(id, &f.name, t),
            })
        });
        Schema::builder().with_fields(columns).build()
    }

    /// The names of the fields `table` has no column for.
    pub(crate) fn missing_from(&self, table: &Schema) -> Vec<String> {
        self.fields
            .iter()
            .filter(|f| table.field_by_name(&f.name).is_none())
            .map(|f| f.name.clone())
            .collect()
    }

    /// The columns `table` must gain to hold every field, or why it cannot hold them.
    pub(crate) fn evolution(&self, table: &Schema) -> Result<Vec<AddColumn>, String> {
        let mut added = Vec::new();
        for f in &self.fields {
            match table.field_by_name(&f.name) {
                None => added.push(AddColumn::optional(&f.name, Type::Primitive(f.kind.iceberg()))),
                Some(column) => {
                    let want = f.kind.iceberg();
                    let ok = match &*column.field_type {
                        Type::Primitive(have) => {
                            *have == want
                                || (*have == PrimitiveType::Long && want == PrimitiveType::Int)
                                || (*have == PrimitiveType::Double && want == PrimitiveType::Float)
                                || (*have == PrimitiveType::Timestamp && want == PrimitiveType::Timestamptz)
                        }
                        _ => false,
                    };
                    if !ok {
                        return Err(format!(
                            "column `{}` is {} in the table, but the record's field is {want}",
                            f.name, column.field_type
                        ));
                    }
                    if column.required && f.null_branch.is_some() {
                        return Err(format!(
                            "column `{}` is required in the table, but the record's field may be null",
                            f.name
                        ));
                    }
                }
            }
        }
        for column in table.as_struct().fields() {
            if column.required && !self.fields.iter().any(|f| f.name == column.name) {
                return Err(format!(
                    "column `{}` is required in the table, but the record type has no such field",
                    column.name
                ));
            }
        }
        Ok(added)
    }
}

/// One column being built.
enum Column {
    I64(Int64Builder),
    I32(Int32Builder),
    F64(Float64Builder),
    F32(Float32Builder),
    Bool(BooleanBuilder),
    Str(StringBuilder),
    LargeStr(LargeStringBuilder),
    Bin(BinaryBuilder),
    LargeBin(LargeBinaryBuilder),
    Ts(TimestampMicrosecondBuilder, DataType),
}

/// A decoded value on its way into a column.
enum Value<'a> {
    Null,
    Long(i64),
    Double(f64),
    Boolean(bool),
    Bytes(&'a [u8]),
    /// Microseconds since the epoch.
    Micros(i64),
}

impl Column {
    fn new(data_type: &DataType) -> Result<Column, String> {
        Ok(match data_type {
            DataType::Int64 => Column::I64(Int64Builder::new()),
            DataType::Int32 => Column::I32(Int32Builder::new()),
            DataType::Float64 => Column::F64(Float64Builder::new()),
            DataType::Float32 => Column::F32(Float32Builder::new()),
            DataType::Boolean => Column::Bool(BooleanBuilder::new()),
            DataType::Utf8 => Column::Str(StringBuilder::new()),
            DataType::LargeUtf8 => Column::LargeStr(LargeStringBuilder::new()),
            DataType::Binary => Column::Bin(BinaryBuilder::new()),
            DataType::LargeBinary => Column::LargeBin(LargeBinaryBuilder::new()),
            DataType::Timestamp(TimeUnit::Microsecond, _) => {
                Column::Ts(TimestampMicrosecondBuilder::new(), data_type.clone())
            }
            other => return Err(format!("no column builder for Arrow type {other}")),
        })
    }

    fn push(&mut self, v: Value<'_>) {
        match (self, v) {
            (Column::I64(b), Value::Long(x)) => b.append_value(x),
            (Column::I32(b), Value::Long(x)) => b.append_value(x as i32),
            (Column::F64(b), Value::Double(x)) => b.append_value(x),
            (Column::F32(b), Value::Double(x)) => b.append_value(x as f32),
            (Column::Bool(b), Value::Boolean(x)) => b.append_value(x),
            (Column::Str(b), Value::Bytes(x)) => b.append_value(String::from_utf8_lossy(x)),
            (Column::LargeStr(b), Value::Bytes(x)) => b.append_value(String::from_utf8_lossy(x)),
            (Column::Bin(b), Value::Bytes(x)) => b.append_value(x),
            (Column::LargeBin(b), Value::Bytes(x)) => b.append_value(x),
            (Column::Ts(b, _), Value::Micros(x)) => b.append_value(x),
            (c, _) => c.push_null(),
        }
    }

    fn push_null(&mut self) {
        match self {
            Column::I64(b) => b.append_null(),
            Column::I32(b) => b.append_null(),
            Column::F64(b) => b.append_null(),
            Column::F32(b) => b.append_null(),
            Column::Bool(b) => b.append_null(),
            Column::Str(b) => b.append_null(),
            Column::LargeStr(b) => b.append_null(),
            Column::Bin(b) => b.append_null(),
            Column::LargeBin(b) => b.append_null(),
            Column::Ts(b, _) => b.append_null(),
        }
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            Column::I64(b) => Arc::new(b.finish()),
            Column::I32(b) => Arc::new(b.finish()),
            Column::F64(b) => Arc::new(b.finish()),
            Column::F32(b) => Arc::new(b.finish()),
            Column::Bool(b) => Arc::new(b.finish()),
            Column::Str(b) => Arc::new(b.finish()),
            Column::LargeStr(b) => Arc::new(b.finish()),
            Column::Bin(b) => Arc::new(b.finish()),
            Column::LargeBin(b) => Arc::new(b.finish()),
            Column::Ts(b, t) => {
                let a = b.finish();
                match t {
                    DataType::Timestamp(_, tz) => Arc::new(a.with_timezone_opt(tz.clone())),
                    _ => Arc::new(a),
                }
            }
        }
    }

    fn len(&self) -> usize {
        match self {
            Column::I64(b) => b.len(),
            Column::I32(b) => b.len(),
            Column::F64(b) => b.len(),
            Column::F32(b) => b.len(),
            Column::Bool(b) => b.len(),
            Column::Str(b) => b.len(),
            Column::LargeStr(b) => b.len(),
            Column::Bin(b) => b.len(),
            Column::LargeBin(b) => b.len(),
            Column::Ts(b, _) => b.len(),
        }
    }
}

/// Turns records into Arrow batches of a table's columns (Arrow schema with Iceberg field
/// ids): each record is encoded with its Avro codec and its fields are read back in order
/// straight into the column builders.
pub(crate) struct BatchEncoder {
    layout: RecordLayout,
    arrow: ArrowSchemaRef,
    /// For each record field, the table column it fills.
    target: Vec<Option<usize>>,
    /// The table columns no field fills (kept from an older record type): null in every row.
    unfilled: Vec<usize>,
    columns: Vec<Column>,
    buf: Vec<u8>,
}

impl BatchEncoder {
    /// An encoder of `layout` records into the columns of `table` (which holds every field:
    /// see [`RecordLayout::evolution`]).
    pub(crate) fn new(layout: RecordLayout, table: &Schema) -> Result<Self, String> {
        let arrow = Arc::new(iceberg::arrow::schema_to_arrow_schema(table).map_err(|e| e.to_string())?);
        let target: Vec<Option<usize>> =
            layout.fields.iter().map(|f| arrow.fields().iter().position(|c| c.name() == &f.name)).collect();
        let unfilled = (0..arrow.fields().len()).filter(|i| !target.contains(&Some(*i))).collect();
        let columns = arrow.fields().iter().map(|f| Column::new(f.data_type())).collect::<Result<_, _>>()?;
        Ok(BatchEncoder { layout, arrow, target, unfilled, columns, buf: Vec::new() })
    }

    /// Adds `record` to the batch being built.
    pub(crate) fn push<R: AvroRecord>(&mut self, record: &R) -> Result<(), String> {
        self.buf.clear();
        record.encode(&mut self.buf);
        let mut rest: &[u8] = &self.buf;
        for (f, target) in self.layout.fields.iter().zip(&self.target) {
            let v = read(&mut rest, f).map_err(|e| format!("field `{}`: {e}", f.name))?;
            if let Some(t) = target {
                self.columns[*t].push(v);
            }
        }
        for &c in &self.unfilled {
            self.columns[c].push_null();
        }
        Ok(())
    }

    /// Rows added since the last [`BatchEncoder::finish`].
    pub(crate) fn rows(&self) -> usize {
        self.columns.first().map_or(0, Column::len)
    }

    /// The batch built so far; the encoder starts a new one.
    pub(crate) fn finish(&mut self) -> Result<RecordBatch, String> {
        let arrays: Vec<ArrayRef> = self.columns.iter_mut().map(Column::finish).collect();
        RecordBatch::try_new(self.arrow.clone(), arrays).map_err(|e| e.to_string())
    }
}

fn read<'a>(buf: &mut &'a [u8], f: &Field) -> Result<Value<'a>, String> {
    if let Some(null) = f.null_branch {
        if get_index(buf, 2, "union").map_err(|e| e.to_string())? == null {
            return Ok(Value::Null);
        }
    }
    let e = |e: caudal_schemas::DecodeError| e.to_string();
    Ok(match f.kind {
        Kind::Long | Kind::Int => Value::Long(get_long(buf).map_err(e)?),
        Kind::Double => Value::Double(get_double(buf).map_err(e)?),
        Kind::Float => {
            let (b, rest) = buf.split_first_chunk::<4>().ok_or("truncated float")?;
            *buf = rest;
            Value::Double(f64::from(f32::from_le_bytes(*b)))
        }
        Kind::Boolean => Value::Boolean(get_boolean(buf).map_err(e)?),
        Kind::String | Kind::Bytes => Value::Bytes(get_bytes(buf).map_err(e)?),
        Kind::TimestampMillis => Value::Micros(get_long(buf).map_err(e)?.saturating_mul(1000)),
        Kind::TimestampMicros => Value::Micros(get_long(buf).map_err(e)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use caudal_schemas::ProcessedReading;

    #[test]
    fn processed_readings_become_a_table_and_arrow_rows() {
        let layout = RecordLayout::of::<ProcessedReading>().unwrap();
        let schema = layout.table_schema().unwrap();
        let names: Vec<String> = schema.as_struct().fields().iter().map(|f| f.name.clone()).collect();
        assert_eq!(names, ["sensor_id", "ts", "lat", "lon", "temp_c", "temp_f", "site", "name"]);
        assert_eq!(
            *schema.field_by_name("ts").unwrap().field_type,
            Type::Primitive(PrimitiveType::Timestamptz)
        );
        assert!(layout.evolution(&schema).unwrap().is_empty());

        let mut enc = BatchEncoder::new(layout, &schema).unwrap();
        let r = ProcessedReading {
            sensor_id: 7,
            ts: 1_700_000_000_123,
            lat: 1.5,
            lon: -2.5,
            temp_c: 20.0,
            temp_f: 68.0,
            site: "north".into(),
            name: "s7".into(),
        };
        enc.push(&r).unwrap();
        enc.push(&r).unwrap();
        let batch = enc.finish().unwrap();
        assert_eq!(batch.num_rows(), 2);
        let ts = batch.column(1).as_any().downcast_ref::<arrow_array::TimestampMicrosecondArray>().unwrap();
        assert_eq!(ts.value(0), 1_700_000_000_123_000);
        let site = batch.column(6).as_any().downcast_ref::<arrow_array::StringArray>();
        let site = site.map(|a| a.value(1).to_string()).unwrap_or_else(|| {
            let a = batch.column(6).as_any().downcast_ref::<arrow_array::LargeStringArray>().unwrap();
            a.value(1).to_string()
        });
        assert_eq!(site, "north");
    }

    #[test]
    fn a_table_with_fewer_columns_gains_optional_ones_and_a_clash_names_the_column() {
        let layout = RecordLayout::of::<ProcessedReading>().unwrap();
        let full = layout.table_schema().unwrap();
        // An older table: without `site` and `name`.
        let older = Schema::builder()
            .with_fields(
                full.as_struct().fields().iter().filter(|f| f.name != "site" && f.name != "name").cloned(),
            )
            .build()
            .unwrap();
        assert_eq!(layout.evolution(&older).unwrap().len(), 2);
        // `ts` as a string column: refused, by name.
        let clash = Schema::builder()
            .with_fields([Arc::new(NestedField::required(1, "ts", Type::Primitive(PrimitiveType::String)))])
            .build()
            .unwrap();
        let err = layout.evolution(&clash).err().unwrap();
        assert!(err.contains("column `ts`"), "{err}");
        // A required column the record lacks: refused.
        let extra =
            Schema::builder()
                .with_fields(full.as_struct().fields().iter().cloned().chain([Arc::new(
                    NestedField::required(99, "owner", Type::Primitive(PrimitiveType::String)),
                )]))
                .build()
                .unwrap();
        let err = layout.evolution(&extra).err().unwrap();
        assert!(err.contains("column `owner`"), "{err}");
    }
}

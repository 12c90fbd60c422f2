//! Fast schema resolution for flat records: bytes written with another version of a
//! record are rewritten into the reader's layout, then decoded by the fast path.
//!
//! A [`Transcoder`] is compiled once per (writer, reader) pair. It exists only when
//! both are records of the same name whose writer fields are primitives, enums, fixed or
//! unions of those, and every reader field either has a writer field of the same name
//! and type (or `int` read as `long`, whose bytes are the same) or a default. Anything
//! else (renamed fields, a writer field the reader knows by an alias, other promotions,
//! nested records, arrays, maps) is left
//! to apache-avro's resolution ([`crate::codec::decode_resolved`]).

use std::ops::Range;

use apache_avro::schema::RecordSchema;
use apache_avro::types::Value;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::Schema;

use crate::codec::{get_bytes, get_index, get_long, AvroRecord};
use crate::error::{DecodeError, Result};

/// How to step over one writer value.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Skip {
    Nothing,
    Byte,
    Varint,
    Fixed(usize),
    LengthPrefixed,
    Union(Vec<Skip>),
}

impl Skip {
    fn of(schema: &Schema) -> Option<Skip> {
        Some(match schema {
            Schema::Null => Skip::Nothing,
            Schema::Boolean => Skip::Byte,
            Schema::Int
            | Schema::Long
            | Schema::Enum(_)
            | Schema::Date
            | Schema::TimeMillis
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => Skip::Varint,
            Schema::Float => Skip::Fixed(4),
            Schema::Double => Skip::Fixed(8),
            Schema::Bytes | Schema::String => Skip::LengthPrefixed,
            Schema::Fixed(f) => Skip::Fixed(f.size),
            Schema::Union(u) => Skip::Union(u.variants().iter().map(Skip::of).collect::<Option<Vec<_>>>()?),
            _ => return None,
        })
    }

    fn skip(&self, buf: &mut &[u8]) -> Result<(), DecodeError> {
        match self {
            Skip::Nothing => Ok(()),
            Skip::Byte => skip_n(buf, 1, "boolean"),
            Skip::Varint => get_long(buf).map(drop),
            Skip::Fixed(n) => skip_n(buf, *n, "fixed-size value"),
            Skip::LengthPrefixed => get_bytes(buf).map(drop),
            Skip::Union(branches) => {
                let i = get_index(buf, branches.len(), "union")?;
                match branches.get(i) {
                    Some(branch) => branch.skip(buf),
                    None => Err(DecodeError::BadIndex { what: "union", index: i as i64 }),
                }
            }
        }
    }
}

fn skip_n(buf: &mut &[u8], n: usize, what: &'static str) -> Result<(), DecodeError> {
    match buf.get(n..) {
        Some(rest) => {
            *buf = rest;
            Ok(())
        }
        None => Err(DecodeError::Truncated { what }),
    }
}

/// One reader field: copied from a writer field, or the reader's default.
#[derive(Debug, Clone)]
enum Step {
    Copy(usize),
    Default(Vec<u8>),
}

/// A compiled writer → reader rewrite of a flat record.
#[derive(Debug, Clone)]
pub struct Transcoder {
    writer_fields: Vec<Skip>,
    steps: Vec<Step>,
    ranges: Vec<Range<usize>>,
    /// `Some(n)` when the reader's fields are the writer's first `n`, in order (fields
    /// only appended): the record decodes in place and the rest is skipped.
    prefix: Option<usize>,
}

impl Transcoder {
    /// Compiles the rewrite, or `None` when the pair needs apache-avro's resolution.
    pub fn compile(writer: &Schema, reader: &Schema) -> Option<Self> {
        let (Schema::Record(w), Schema::Record(r)) = (writer, reader) else {
            return None;
        };
        if w.name != r.name {
            return None;
        }
        let writer_fields = w.fields.iter().map(|f| Skip::of(&f.schema)).collect::<Option<Vec<_>>>()?;
        let steps = r.fields.iter().map(|rf| step_for(w, rf)).collect::<Option<Vec<_>>>()?;
        let ranges = vec![0..0; writer_fields.len()];
        let in_place = steps.iter().enumerate().all(|(k, s)| matches!(s, Step::Copy(i) if *i == k));
        let prefix = in_place.then_some(steps.len());
        Some(Self { writer_fields, steps, ranges, prefix })
    }

    /// Decodes one writer datum (which must fill `payload`) as `T`, whose schema must be
    /// the reader schema of [`Transcoder::compile`]; `scratch` holds the rewrite.
    pub fn decode<T: AvroRecord>(&mut self, payload: &[u8], scratch: &mut Vec<u8>) -> Result<T> {
        if let Some(n) = self.prefix {
            let mut buf = payload;
            let record = T::decode(&mut buf)?;
            for skip in self.writer_fields.get(n..).unwrap_or_default() {
                skip.skip(&mut buf)?;
            }
            return if buf.is_empty() {
                Ok(record)
            } else {
                Err(DecodeError::TrailingBytes(buf.len()).into())
            };
        }
        scratch.clear();
        self.transcode(payload, scratch)?;
        T::from_slice(scratch)
    }

    /// Rewrites one writer datum (which must fill `payload`) into the reader's layout,
    /// appended to `out`.
    pub fn transcode(&mut self, payload: &[u8], out: &mut Vec<u8>) -> Result<()> {
        let mut buf = payload;
        for (skip, range) in self.writer_fields.iter().zip(self.ranges.iter_mut()) {
            let start = payload.len() - buf.len();
            skip.skip(&mut buf)?;
            *range = start..payload.len() - buf.len();
        }
        if !buf.is_empty() {
            return Err(DecodeError::TrailingBytes(buf.len()).into());
        }
        for step in &self.steps {
            match step {
                Step::Copy(i) => {
                    if let Some(bytes) = self.ranges.get(*i).and_then(|r| payload.get(r.clone())) {
                        out.extend_from_slice(bytes);
                    }
                }
                Step::Default(bytes) => out.extend_from_slice(bytes),
            }
        }
        Ok(())
    }
}

fn step_for(writer: &RecordSchema, reader_field: &apache_avro::schema::RecordField) -> Option<Step> {
    let by_name = writer.fields.iter().position(|wf| wf.name == reader_field.name);
    // A writer field the reader knows by an alias: renamed by the generic path.
    if by_name.is_none() && writer.fields.iter().any(|wf| reader_field.aliases.contains(&wf.name)) {
        return None;
    }
    match by_name {
        Some(i) => {
            let ws = &writer.fields.get(i)?.schema;
            let rs = &reader_field.schema;
            // An int's zig-zag varint is also the long's, and a plain long is the
            // timestamp's (both checked against apache-avro by tests/evolution.rs).
            let same_bytes = ws == rs
                || matches!((ws, rs), (Schema::Int, Schema::Long) | (Schema::Long, Schema::TimestampMillis));
            same_bytes.then_some(Step::Copy(i))
        }
        None => {
            let default = reader_field.default.as_ref()?;
            // Keep to what `Skip` knows, so defaults are as flat as the fields.
            Skip::of(&reader_field.schema)?;
            let json = Value::try_from(default.clone()).ok()?;
            // As apache-avro does: a union's default belongs to its first branch.
            let value = match &reader_field.schema {
                Schema::Union(u) => Value::Union(0, Box::new(json.resolve(u.variants().first()?).ok()?)),
                other => json.resolve(other).ok()?,
            };
            let writer = GenericDatumWriter::builder(&reader_field.schema).build().ok()?;
            writer.write_value_to_vec(value).ok().map(Step::Default)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::AvroRecord;
    use crate::records::{EventType, SensorReading, UserInteraction};

    fn parse(s: &str) -> Schema {
        Schema::parse_str(s).unwrap()
    }

    #[test]
    fn same_schema_compiles_to_copies() {
        let t = Transcoder::compile(SensorReading::schema(), SensorReading::schema()).unwrap();
        assert_eq!(t.steps.len(), 5);
        assert!(t.steps.iter().all(|s| matches!(s, Step::Copy(_))));
    }

    #[test]
    fn missing_optional_field_takes_the_encoded_null_default() {
        let writer = parse(
            r#"{"type":"record","name":"UserInteraction","namespace":"io.caudal","fields":[
                {"name":"ts","type":"long"},
                {"name":"user_id","type":"string"},
                {"name":"event_type","type":{"type":"enum","name":"EventType",
                    "symbols":["CLICK","VIEW","PURCHASE"]}}]}"#,
        );
        let mut t = Transcoder::compile(&writer, UserInteraction::schema()).unwrap();
        let mut payload = Vec::new();
        crate::codec::put_long(&mut payload, 42);
        crate::codec::put_string(&mut payload, "u9");
        crate::codec::put_long(&mut payload, 1);
        let mut out = Vec::new();
        t.transcode(&payload, &mut out).unwrap();
        let got = UserInteraction::from_slice(&out).unwrap();
        assert_eq!(
            got,
            UserInteraction { user_id: "u9".into(), event_type: EventType::View, ts: 42, page_url: None }
        );
        assert!(t.transcode(&payload[..payload.len() - 1], &mut out).is_err());
    }

    /// A writer that names the event time `timestamp_ms` (the reference design's producers):
    /// the reader's alias renames it, through the generic path.
    #[test]
    fn a_field_the_reader_knows_by_an_alias_is_read_by_the_generic_path() {
        let writer = parse(
            r#"{"type":"record","name":"UserInteraction","namespace":"com.mycompany.events","fields":[
                {"name":"user_id","type":"string"},
                {"name":"event_type","type":{"type":"enum","name":"EventType",
                    "symbols":["CLICK","VIEW","PURCHASE"]}},
                {"name":"timestamp_ms","type":"long"}]}"#,
        );
        assert!(Transcoder::compile(&writer, UserInteraction::schema()).is_none());
        let mut payload = Vec::new();
        crate::codec::put_string(&mut payload, "u9");
        crate::codec::put_long(&mut payload, 2);
        crate::codec::put_long(&mut payload, 42);
        let got: UserInteraction =
            crate::codec::decode_resolved(&writer, Some(UserInteraction::schema()), &payload).unwrap();
        assert_eq!(
            got,
            UserInteraction { user_id: "u9".into(), event_type: EventType::Purchase, ts: 42, page_url: None }
        );
    }

    #[test]
    fn appended_fields_decode_in_place() {
        let writer = parse(
            r#"{"type":"record","name":"SensorReading","namespace":"io.caudal","fields":[
                {"name":"sensor_id","type":"int"},
                {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
                {"name":"lat","type":"double"},{"name":"lon","type":"double"},
                {"name":"temp_f","type":"double"},
                {"name":"unit","type":"string","default":"F"}]}"#,
        );
        let mut t = Transcoder::compile(&writer, SensorReading::schema()).unwrap();
        assert_eq!(t.prefix, Some(5));
        let r = SensorReading { sensor_id: -3, ts: 9, lat: 1.0, lon: 2.0, temp_f: 3.0 };
        let mut payload = r.to_vec();
        crate::codec::put_string(&mut payload, "C");
        let mut scratch = Vec::new();
        assert_eq!(t.decode::<SensorReading>(&payload, &mut scratch).unwrap(), r);
        assert!(t.decode::<SensorReading>(&payload[..payload.len() - 1], &mut scratch).is_err());
        payload.push(0);
        assert!(t.decode::<SensorReading>(&payload, &mut scratch).is_err());
    }

    #[test]
    fn unsupported_pairs_fall_back() {
        // Different record name, a nested array, a missing field without default, a
        // promotion other than int -> long.
        let other = parse(r#"{"type":"record","name":"Other","fields":[]}"#);
        assert!(Transcoder::compile(&other, SensorReading::schema()).is_none());
        let nested = parse(
            r#"{"type":"record","name":"SensorReading","namespace":"io.caudal","fields":[
                {"name":"xs","type":{"type":"array","items":"long"}}]}"#,
        );
        assert!(Transcoder::compile(&nested, SensorReading::schema()).is_none());
        let missing = parse(
            r#"{"type":"record","name":"SensorReading","namespace":"io.caudal","fields":[
                {"name":"sensor_id","type":"long"}]}"#,
        );
        assert!(Transcoder::compile(&missing, SensorReading::schema()).is_none());
        let float = parse(
            r#"{"type":"record","name":"SensorReading","namespace":"io.caudal","fields":[
                {"name":"sensor_id","type":"long"},{"name":"ts","type":"long"},
                {"name":"lat","type":"float"},{"name":"lon","type":"double"},
                {"name":"temp_f","type":"double"}]}"#,
        );
        assert!(Transcoder::compile(&float, SensorReading::schema()).is_none());
    }
}

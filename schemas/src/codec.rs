//! Avro binary encoding: the [`AvroRecord`] trait, the hand-written fast-path
//! primitives it is built from, and apache-avro's generic path for everything else.
//!
//! The fast path reads and writes the Avro binary encoding directly: longs and ints as
//! zig-zag varints, doubles as 8 little-endian bytes, strings as a long length then
//! UTF-8 bytes, enums and union branches as an int index. It is valid only for bytes
//! written with exactly the record's own schema; bytes written with another schema go
//! through [`decode_resolved`].

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::Schema;
use serde::{de::DeserializeOwned, Serialize};

use crate::error::{DecodeError, Error, Result};

/// A record with a checked-in Avro schema and a hand-written binary codec.
///
/// `encode` and `decode` must produce and accept exactly the bytes apache-avro produces
/// and accepts for [`AvroRecord::schema`]; the crate's property tests check this for
/// every record.
pub trait AvroRecord: Sized + Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The schema's JSON text as checked in under `schemas/avro/`.
    fn schema_json() -> &'static str;

    /// The parsed schema (parsed once).
    fn schema() -> &'static Schema;

    /// Appends the Avro binary encoding of `self` to `out`.
    fn encode(&self, out: &mut Vec<u8>);

    /// Decodes one record from the front of `buf` and advances `buf` past it.
    fn decode(buf: &mut &[u8]) -> Result<Self>;

    /// Decodes a record that must fill `bytes` exactly.
    fn from_slice(bytes: &[u8]) -> Result<Self> {
        let mut buf = bytes;
        let record = Self::decode(&mut buf)?;
        if buf.is_empty() {
            Ok(record)
        } else {
            Err(DecodeError::TrailingBytes(buf.len()).into())
        }
    }

    /// The Avro binary encoding of `self` in a new vector.
    fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        self.encode(&mut out);
        out
    }
}

/// Parses Avro schema JSON (an `.avsc` file's text) into a [`Schema`].
pub fn parse_schema(json: &str) -> Result<Schema> {
    Schema::parse_str(json).map_err(Error::invalid_schema)
}

/// Parses an embedded schema; used by the records' `schema()` once.
pub(crate) fn parse_embedded(json: &str) -> Schema {
    match Schema::parse_str(json) {
        Ok(schema) => schema,
        // The texts are compile-time constants checked by the crate's tests.
        Err(e) => panic!("embedded Avro schema does not parse: {e}"),
    }
}

// ---------------------------------------------------------------------------------
// Fast-path primitives.

#[inline(always)]
fn zigzag_decode(n: u64) -> i64 {
    ((n >> 1) as i64) ^ -((n & 1) as i64)
}

#[inline(always)]
fn zigzag_encode(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// Reads a zig-zag varint `long`.
#[inline]
pub fn get_long(buf: &mut &[u8]) -> Result<i64, DecodeError> {
    let bytes = *buf;
    let mut value: u64 = 0;
    for (i, &byte) in bytes.iter().take(10).enumerate() {
        if i == 9 && byte > 1 {
            return Err(DecodeError::VarintOverflow);
        }
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            *buf = &bytes[i + 1..];
            return Ok(zigzag_decode(value));
        }
    }
    if bytes.len() >= 10 {
        Err(DecodeError::VarintOverflow)
    } else {
        Err(DecodeError::Truncated { what: "long" })
    }
}

/// Reads a zig-zag varint `int` (32-bit range).
#[inline]
pub fn get_int(buf: &mut &[u8]) -> Result<i32, DecodeError> {
    let v = get_long(buf)?;
    i32::try_from(v).map_err(|_| DecodeError::VarintOverflow)
}

/// Reads an 8-byte little-endian `double`.
#[inline]
pub fn get_double(buf: &mut &[u8]) -> Result<f64, DecodeError> {
    match buf.split_first_chunk::<8>() {
        Some((head, rest)) => {
            *buf = rest;
            Ok(f64::from_le_bytes(*head))
        }
        None => Err(DecodeError::Truncated { what: "double" }),
    }
}

/// Reads a `boolean` (one byte, 0 or 1).
#[inline]
pub fn get_boolean(buf: &mut &[u8]) -> Result<bool, DecodeError> {
    match buf.split_first() {
        Some((&b, rest)) if b <= 1 => {
            *buf = rest;
            Ok(b == 1)
        }
        Some((&b, _)) => Err(DecodeError::BadIndex { what: "boolean", index: i64::from(b) }),
        None => Err(DecodeError::Truncated { what: "boolean" }),
    }
}

/// Reads length-prefixed `bytes`, borrowed from the input.
#[inline]
pub fn get_bytes<'a>(buf: &mut &'a [u8]) -> Result<&'a [u8], DecodeError> {
    let len = get_long(buf)?;
    let len = usize::try_from(len).map_err(|_| DecodeError::NegativeLength(len))?;
    let bytes: &'a [u8] = buf;
    if len > bytes.len() {
        return Err(DecodeError::Truncated { what: "bytes" });
    }
    let (head, rest) = bytes.split_at(len);
    *buf = rest;
    Ok(head)
}

/// Reads a length-prefixed UTF-8 `string`.
#[inline]
pub fn get_string(buf: &mut &[u8]) -> Result<String, DecodeError> {
    let bytes = get_bytes(buf)?;
    match std::str::from_utf8(bytes) {
        Ok(s) => Ok(s.to_owned()),
        Err(_) => Err(DecodeError::InvalidUtf8),
    }
}

/// Reads an enum symbol or union branch index and checks it is below `count`.
#[inline]
pub fn get_index(buf: &mut &[u8], count: usize, what: &'static str) -> Result<usize, DecodeError> {
    let index = get_long(buf)?;
    match usize::try_from(index) {
        Ok(i) if i < count => Ok(i),
        _ => Err(DecodeError::BadIndex { what, index }),
    }
}

/// Writes a zig-zag varint `long`.
#[inline]
pub fn put_long(out: &mut Vec<u8>, v: i64) {
    let mut n = zigzag_encode(v);
    let mut tmp = [0u8; 10];
    let mut len = 0;
    while n >= 0x80 {
        tmp[len] = (n as u8) | 0x80;
        n >>= 7;
        len += 1;
    }
    tmp[len] = n as u8;
    out.extend_from_slice(&tmp[..=len]);
}

/// Writes an 8-byte little-endian `double`.
#[inline]
pub fn put_double(out: &mut Vec<u8>, v: f64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Writes a `boolean`.
#[inline]
pub fn put_boolean(out: &mut Vec<u8>, v: bool) {
    out.push(u8::from(v));
}

/// Writes length-prefixed `bytes`.
#[inline]
pub fn put_bytes(out: &mut Vec<u8>, v: &[u8]) {
    // A slice never exceeds isize::MAX bytes, so the length fits an i64.
    put_long(out, v.len() as i64);
    out.extend_from_slice(v);
}

/// Writes a length-prefixed UTF-8 `string`.
#[inline]
pub fn put_string(out: &mut Vec<u8>, v: &str) {
    put_bytes(out, v.as_bytes());
}

// ---------------------------------------------------------------------------------
// apache-avro's generic path.

/// Encodes any serde value with apache-avro's schema-aware serializer (the generic,
/// slower path; the fast path is [`AvroRecord::encode`]).
pub fn encode_generic<T: Serialize>(schema: &Schema, value: &T) -> Result<Vec<u8>> {
    let writer = GenericDatumWriter::builder(schema).build().map_err(Error::invalid_schema)?;
    writer.write_ser_to_vec(value).map_err(|e| Error::Resolution { writer_id: None, reason: e.to_string() })
}

/// Decodes bytes written with `writer` into `T`, resolving them into the `reader`
/// schema first when one is given (Avro schema resolution: defaults for fields the
/// writer lacks, writer fields the reader lacks skipped, promotions applied).
///
/// This is apache-avro's generic path: a `Value` tree is built and then converted with
/// `apache_avro::from_value`. Bytes left after the datum are an error.
pub fn decode_resolved<T: DeserializeOwned>(
    writer: &Schema,
    reader: Option<&Schema>,
    bytes: &[u8],
) -> Result<T> {
    let resolution = |e: apache_avro::Error| Error::Resolution { writer_id: None, reason: e.to_string() };
    let mut input = bytes;
    let value = match reader.filter(|r| has_field_aliases(r)) {
        // apache-avro's resolution matches fields by name only: the writer's fields are
        // renamed to the reader's where the reader names them as aliases, then resolved.
        Some(reader) => {
            let raw = GenericDatumReader::builder(writer).build().map_err(resolution)?.read_value(&mut input);
            rename_aliased(raw.map_err(resolution)?, reader).resolve(reader).map_err(resolution)?
        }
        None => GenericDatumReader::builder(writer)
            .maybe_reader_schema(reader)
            .build()
            .map_err(resolution)?
            .read_value(&mut input)
            .map_err(resolution)?,
    };
    if !input.is_empty() {
        return Err(DecodeError::TrailingBytes(input.len()).into());
    }
    apache_avro::from_value(&value).map_err(resolution)
}

/// A record schema with a field that has aliases (the Avro specification's way for a reader
/// to accept a writer's other name for a field).
fn has_field_aliases(schema: &Schema) -> bool {
    matches!(schema, Schema::Record(r) if r.fields.iter().any(|f| !f.aliases.is_empty()))
}

/// A writer's record with each field the reader knows by an alias renamed to the reader's
/// name (when the writer has no field of that name itself).
fn rename_aliased(value: apache_avro::types::Value, reader: &Schema) -> apache_avro::types::Value {
    use apache_avro::types::Value;
    let Schema::Record(r) = reader else { return value };
    let mut fields = match value {
        Value::Record(fields) => fields,
        other => return other,
    };
    for f in r.fields.iter().filter(|f| !f.aliases.is_empty()) {
        if fields.iter().any(|(name, _)| *name == f.name) {
            continue;
        }
        if let Some(field) = fields.iter_mut().find(|(name, _)| f.aliases.contains(name)) {
            field.0.clone_from(&f.name);
        }
    }
    Value::Record(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn long_bytes(v: i64) -> Vec<u8> {
        let mut out = Vec::new();
        put_long(&mut out, v);
        out
    }

    #[test]
    fn zigzag_matches_the_avro_spec_table() {
        // From the Avro specification, "Binary Encoding".
        for (v, bytes) in [
            (0i64, vec![0x00u8]),
            (-1, vec![0x01]),
            (1, vec![0x02]),
            (-2, vec![0x03]),
            (2, vec![0x04]),
            (-64, vec![0x7f]),
            (64, vec![0x80, 0x01]),
        ] {
            assert_eq!(long_bytes(v), bytes, "encode {v}");
            let mut buf = bytes.as_slice();
            assert_eq!(get_long(&mut buf), Ok(v), "decode {v}");
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn extreme_longs_round_trip_in_ten_bytes() {
        for v in [i64::MIN, i64::MAX, i64::MIN + 1, i64::MAX - 1] {
            let bytes = long_bytes(v);
            assert_eq!(bytes.len(), 10);
            let mut buf = bytes.as_slice();
            assert_eq!(get_long(&mut buf), Ok(v));
        }
    }

    #[test]
    fn bad_varints_are_errors() {
        let mut buf: &[u8] = &[];
        assert_eq!(get_long(&mut buf), Err(DecodeError::Truncated { what: "long" }));
        let mut buf: &[u8] = &[0x80, 0x80];
        assert_eq!(get_long(&mut buf), Err(DecodeError::Truncated { what: "long" }));
        let mut buf: &[u8] = &[0xff; 11];
        assert_eq!(get_long(&mut buf), Err(DecodeError::VarintOverflow));
        // Ten bytes whose last carries more than the 64th bit.
        let mut buf: &[u8] = &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert_eq!(get_long(&mut buf), Err(DecodeError::VarintOverflow));
    }

    #[test]
    fn strings_check_length_and_utf8() {
        let mut out = Vec::new();
        put_string(&mut out, "héllo");
        let mut buf = out.as_slice();
        assert_eq!(get_string(&mut buf).as_deref(), Ok("héllo"));

        let mut buf: &[u8] = &[0x01]; // length -1
        assert_eq!(get_string(&mut buf), Err(DecodeError::NegativeLength(-1)));
        let mut buf: &[u8] = &[0x08, b'a']; // length 4, one byte
        assert_eq!(get_string(&mut buf), Err(DecodeError::Truncated { what: "bytes" }));
        let mut buf: &[u8] = &[0x02, 0xff];
        assert_eq!(get_string(&mut buf), Err(DecodeError::InvalidUtf8));
    }

    #[test]
    fn indexes_are_range_checked() {
        let mut buf: &[u8] = &[0x04];
        assert_eq!(get_index(&mut buf, 3, "enum"), Ok(2));
        let mut buf: &[u8] = &[0x06];
        assert_eq!(get_index(&mut buf, 3, "enum"), Err(DecodeError::BadIndex { what: "enum", index: 3 }));
        let mut buf: &[u8] = &[0x01];
        assert_eq!(get_index(&mut buf, 2, "union"), Err(DecodeError::BadIndex { what: "union", index: -1 }));
    }

    #[test]
    fn doubles_are_little_endian() {
        let mut out = Vec::new();
        put_double(&mut out, 1.0);
        assert_eq!(out, [0, 0, 0, 0, 0, 0, 0xf0, 0x3f]);
        let mut buf = &out[..7];
        assert_eq!(get_double(&mut buf), Err(DecodeError::Truncated { what: "double" }));
    }
}

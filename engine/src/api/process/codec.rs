//! How keys, state values, timers' keys and side outputs become bytes and back: bincode's
//! standard encoding (varint integers, little endian), with a plain integer — the usual
//! key, counter or timestamp — encoded and decoded here directly, to the same bytes.
//!
//! **In:** a serde value, or bytes stored by an earlier run. **Out:** its bytes, or the value.
//!
//! Through bincode, a `u64` counter's decode was 12 % of the count pipeline's keyed thread:
//! a slice shorter than 9 bytes takes bincode's cold path, which reads the marker and the
//! bytes after it piece by piece. An integer is recognised through serde itself — a
//! serializer that accepts only integers, and a deserializer that answers only the
//! integer requests — so a value of any other type costs one refused call and goes to
//! bincode as before; the bytes are the same either way, and anything the direct path does
//! not recognise (another width's marker, too few bytes) is left to bincode, so its
//! errors are bincode's.

use std::fmt;

use serde::de::{self, DeserializeOwned, Deserializer, Visitor};
use serde::ser::{self, Impossible, Serialize, Serializer};

pub(crate) type EncodeError = bincode::error::EncodeError;
pub(crate) type DecodeError = bincode::error::DecodeError;

/// bincode's varint: a value up to 250 is its own byte; a larger one is a marker and the
/// value in 2, 4 or 8 little-endian bytes.
const SINGLE_BYTE_MAX: u64 = 250;
const U16_MARKER: u8 = 251;
const U32_MARKER: u8 = 252;
const U64_MARKER: u8 = 253;

/// `v`'s bytes.
pub(crate) fn encode_to_vec<T: Serialize + ?Sized>(v: &T) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::new();
    append_encoded(v, &mut out)?;
    Ok(out)
}

/// Appends `v`'s bytes to `out`. Anything but an integer of up to 16 bytes (a small key or
/// value) is encoded into a buffer on the stack and appended at once: through
/// `std::io::Write` every piece of it (a varint's marker and its bytes) is an append call
/// of its own.
///
/// The integer path is inlined into the caller (a key's encoding per record); the rest is
/// a call.
#[inline(always)]
pub(crate) fn append_encoded<T: Serialize + ?Sized>(v: &T, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    if let Ok(int) = v.serialize(IntegerProbe) {
        append_varint(int, out);
        return Ok(());
    }
    append_bincode(v, out)
}

/// [`append_encoded`] for anything but a plain integer.
#[inline(never)]
fn append_bincode<T: Serialize + ?Sized>(v: &T, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    let mut small = [0u8; 16];
    match bincode::serde::encode_into_slice(v, &mut small, bincode::config::standard()) {
        Ok(n) => {
            out.extend_from_slice(&small[..n]);
            Ok(())
        }
        Err(EncodeError::UnexpectedEnd) => {
            bincode::serde::encode_into_std_write(v, out, bincode::config::standard()).map(|_| ())
        }
        Err(e) => Err(e),
    }
}

/// The value at the start of `bytes` (bytes after it are ignored, as bincode does).
#[inline]
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    match T::deserialize(IntegerReader(bytes)) {
        Ok(v) => Ok(v),
        Err(NotAnInteger) => {
            bincode::serde::decode_from_slice(bytes, bincode::config::standard()).map(|(v, _)| v)
        }
    }
}

/// A varint's bytes (of an unsigned value, or of a signed one zigzagged).
#[inline(always)]
fn append_varint(v: u64, out: &mut Vec<u8>) {
    if v <= SINGLE_BYTE_MAX {
        out.push(v as u8);
    } else if v <= u64::from(u16::MAX) {
        out.push(U16_MARKER);
        out.extend_from_slice(&(v as u16).to_le_bytes());
    } else if v <= u64::from(u32::MAX) {
        out.push(U32_MARKER);
        out.extend_from_slice(&(v as u32).to_le_bytes());
    } else {
        out.push(U64_MARKER);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// bincode's zigzag: 0, -1, 1, -2, … as 0, 1, 2, 3, …
#[inline]
fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

#[inline]
fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// The varint at the start of `bytes` if its marker is one a value of `widest` (the
/// largest marker the type takes) may have, as bincode reads it.
#[inline(always)]
fn read_varint(bytes: &[u8], widest: u8) -> Option<u64> {
    let (&first, rest) = bytes.split_first()?;
    match first {
        0..=250 => Some(u64::from(first)),
        U16_MARKER if widest >= U16_MARKER => Some(u64::from(u16::from_le_bytes(*rest.first_chunk()?))),
        U32_MARKER if widest >= U32_MARKER => Some(u64::from(u32::from_le_bytes(*rest.first_chunk()?))),
        U64_MARKER if widest >= U64_MARKER => Some(u64::from_le_bytes(*rest.first_chunk()?)),
        _ => None,
    }
}

/// What the direct path does not handle: bincode's turn.
#[derive(Debug)]
struct NotAnInteger;

impl fmt::Display for NotAnInteger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a plain integer")
    }
}

impl std::error::Error for NotAnInteger {}

impl ser::Error for NotAnInteger {
    fn custom<T: fmt::Display>(_: T) -> Self {
        NotAnInteger
    }
}

impl de::Error for NotAnInteger {
    fn custom<T: fmt::Display>(_: T) -> Self {
        NotAnInteger
    }
}

/// An integer to encode: unsigned, or signed and zigzagged.
type Varint = u64;

/// A serializer that takes a 16-, 32- or 64-bit integer (alone or in a newtype) and refuses
/// everything else. (bincode writes 8-bit integers as a plain byte, not as a varint: they
/// are refused too.)
struct IntegerProbe;

macro_rules! refuse {
    ($($method:ident($($arg:ty),*)),* $(,)?) => {
        $(fn $method(self, $(_: $arg),*) -> Result<Varint, NotAnInteger> { Err(NotAnInteger) })*
    };
}

impl Serializer for IntegerProbe {
    type Ok = Varint;
    type Error = NotAnInteger;
    type SerializeSeq = Impossible<Varint, NotAnInteger>;
    type SerializeTuple = Impossible<Varint, NotAnInteger>;
    type SerializeTupleStruct = Impossible<Varint, NotAnInteger>;
    type SerializeTupleVariant = Impossible<Varint, NotAnInteger>;
    type SerializeMap = Impossible<Varint, NotAnInteger>;
    type SerializeStruct = Impossible<Varint, NotAnInteger>;
    type SerializeStructVariant = Impossible<Varint, NotAnInteger>;

    fn serialize_u16(self, v: u16) -> Result<Varint, NotAnInteger> {
        Ok(u64::from(v))
    }
    fn serialize_u32(self, v: u32) -> Result<Varint, NotAnInteger> {
        Ok(u64::from(v))
    }
    fn serialize_u64(self, v: u64) -> Result<Varint, NotAnInteger> {
        Ok(v)
    }
    // A 16- or 32-bit value zigzagged as 64 bits is the number bincode zigzags at its width.
    fn serialize_i16(self, v: i16) -> Result<Varint, NotAnInteger> {
        Ok(zigzag(i64::from(v)))
    }
    fn serialize_i32(self, v: i32) -> Result<Varint, NotAnInteger> {
        Ok(zigzag(i64::from(v)))
    }
    fn serialize_i64(self, v: i64) -> Result<Varint, NotAnInteger> {
        Ok(zigzag(v))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<Varint, NotAnInteger> {
        value.serialize(self)
    }

    refuse! {
        serialize_bool(bool), serialize_i8(i8), serialize_u8(u8), serialize_i128(i128),
        serialize_u128(u128), serialize_f32(f32), serialize_f64(f64), serialize_char(char),
        serialize_str(&str), serialize_bytes(&[u8]), serialize_none(), serialize_unit(),
        serialize_unit_struct(&'static str),
        serialize_unit_variant(&'static str, u32, &'static str),
    }

    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<Varint, NotAnInteger> {
        Err(NotAnInteger)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<Varint, NotAnInteger> {
        Err(NotAnInteger)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, NotAnInteger> {
        Err(NotAnInteger)
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, NotAnInteger> {
        Err(NotAnInteger)
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, NotAnInteger> {
        Err(NotAnInteger)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, NotAnInteger> {
        Err(NotAnInteger)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, NotAnInteger> {
        Err(NotAnInteger)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, NotAnInteger> {
        Err(NotAnInteger)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, NotAnInteger> {
        Err(NotAnInteger)
    }
    fn is_human_readable(&self) -> bool {
        false
    }
}

/// A deserializer over stored bytes that answers a request for a 16-, 32- or 64-bit
/// integer (alone or in a newtype) and refuses every other.
struct IntegerReader<'b>(&'b [u8]);

impl IntegerReader<'_> {
    #[inline(always)]
    fn unsigned(&self, widest: u8) -> Result<u64, NotAnInteger> {
        read_varint(self.0, widest).ok_or(NotAnInteger)
    }
}

impl<'de> Deserializer<'de> for IntegerReader<'_> {
    type Error = NotAnInteger;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, NotAnInteger> {
        Err(NotAnInteger)
    }
    fn deserialize_u16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, NotAnInteger> {
        visitor.visit_u16(self.unsigned(U16_MARKER)? as u16)
    }
    fn deserialize_u32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, NotAnInteger> {
        visitor.visit_u32(self.unsigned(U32_MARKER)? as u32)
    }
    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, NotAnInteger> {
        visitor.visit_u64(self.unsigned(U64_MARKER)?)
    }
    fn deserialize_i16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, NotAnInteger> {
        visitor.visit_i16(unzigzag(self.unsigned(U16_MARKER)?) as i16)
    }
    fn deserialize_i32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, NotAnInteger> {
        visitor.visit_i32(unzigzag(self.unsigned(U32_MARKER)?) as i32)
    }
    fn deserialize_i64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, NotAnInteger> {
        visitor.visit_i64(unzigzag(self.unsigned(U64_MARKER)?))
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, NotAnInteger> {
        visitor.visit_newtype_struct(self)
    }
    fn is_human_readable(&self) -> bool {
        false
    }

    serde::forward_to_deserialize_any! {
        bool i8 i128 u8 u128 f32 f64 char str string bytes byte_buf option unit unit_struct
        seq tuple tuple_struct map struct enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};

    fn bincode_bytes<T: Serialize>(v: &T) -> Vec<u8> {
        bincode::serde::encode_to_vec(v, bincode::config::standard()).expect("bincode encodes it")
    }

    fn bincode_value<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
        bincode::serde::decode_from_slice(bytes, bincode::config::standard())
            .map(|(v, _)| v)
            .map_err(|e| e.to_string())
    }

    /// Encoded as bincode encodes it, and decoded back.
    fn round_trip<T: Serialize + DeserializeOwned + PartialEq + fmt::Debug>(v: T) {
        let bytes = encode_to_vec(&v).expect("encodes");
        assert_eq!(bytes, bincode_bytes(&v), "{v:?}");
        assert_eq!(decode::<T>(&bytes).expect("decodes"), v);
    }

    /// [`round_trip`] of an integer, which must take the direct path both ways.
    fn direct<T: Serialize + DeserializeOwned + PartialEq + fmt::Debug>(v: T) {
        let varint = v.serialize(IntegerProbe).expect("an integer is encoded directly");
        let mut bytes = Vec::new();
        append_varint(varint, &mut bytes);
        assert_eq!(T::deserialize(IntegerReader(&bytes)).expect("and decoded directly"), v);
        round_trip(v);
    }

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Count(u64);

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Reading {
        sensor: i64,
        name: String,
    }

    #[test]
    fn integers_at_every_width_boundary_are_bincodes_bytes() {
        let edges =
            [0u64, 1, 250, 251, 252, 255, 256, 65_535, 65_536, u64::from(u32::MAX), 1 << 32, u64::MAX];
        for u in edges {
            direct(u);
            direct(u as u32);
            direct(u as u16);
            direct(u as i64);
            direct(-(u as i64));
            direct(u as i32);
            direct((u as i32).wrapping_neg());
            direct(u as i16);
            direct(Count(u));
        }
        direct(i64::MIN);
        direct(i32::MIN);
        direct(i16::MIN);
    }

    #[test]
    fn other_types_are_bincodes_bytes() {
        round_trip(7u8);
        round_trip(-7i8);
        round_trip(true);
        round_trip(u128::MAX);
        round_trip(1.5f64);
        round_trip(Some(300u64));
        round_trip(None::<u64>);
        round_trip((5i64, 300u64));
        round_trip("a sensor".to_string());
        round_trip(vec![1u64, 1_000, 1_000_000]);
        round_trip(Reading { sensor: -3, name: "x".repeat(40) });
    }

    /// What the direct path leaves alone decodes (or fails) exactly as bincode has it: a
    /// marker too wide for the type, too few bytes, a non-shortest encoding, nothing at all.
    #[test]
    fn bytes_the_direct_path_refuses_are_bincodes_to_judge() {
        let cases: [&[u8]; 8] = [
            &[],
            &[251],
            &[251, 1],
            &[253, 1, 2, 3],
            &[254],
            &[251, 5, 0],
            &[252, 1, 0, 0, 0, 9, 9],
            &[253, 1, 0, 0, 0, 0, 0, 0, 0],
        ];
        for bytes in cases {
            assert_eq!(
                decode::<u64>(bytes).map_err(|e| e.to_string()),
                bincode_value::<u64>(bytes),
                "{bytes:?}"
            );
            assert_eq!(
                decode::<u32>(bytes).map_err(|e| e.to_string()),
                bincode_value::<u32>(bytes),
                "{bytes:?}"
            );
            assert_eq!(
                decode::<u16>(bytes).map_err(|e| e.to_string()),
                bincode_value::<u16>(bytes),
                "{bytes:?}"
            );
            assert_eq!(
                decode::<i64>(bytes).map_err(|e| e.to_string()),
                bincode_value::<i64>(bytes),
                "{bytes:?}"
            );
            assert_eq!(
                decode::<i32>(bytes).map_err(|e| e.to_string()),
                bincode_value::<i32>(bytes),
                "{bytes:?}"
            );
        }
    }

    #[test]
    fn random_integers_match_bincode() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = x >> (x % 64);
            direct(v);
            direct(v as i64);
            direct(v as u32);
            direct(v as i32);
        }
    }
}

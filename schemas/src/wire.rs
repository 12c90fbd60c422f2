//! The Confluent wire format: magic byte `0`, the writer schema id as 4 big-endian
//! bytes, then the Avro binary datum.

use crate::codec::AvroRecord;
use crate::error::{Error, Result};

/// The first byte of every framed message.
pub const MAGIC_BYTE: u8 = 0;

/// Magic byte plus schema id.
pub const HEADER_LEN: usize = 5;

/// A parsed frame: the writer schema id and the Avro payload, borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Registry id of the schema the payload was written with.
    pub schema_id: u32,
    /// The Avro binary datum.
    pub payload: &'a [u8],
}

/// Appends the 5-byte header for `schema_id` to `out`.
#[inline]
pub fn write_header(out: &mut Vec<u8>, schema_id: u32) {
    out.push(MAGIC_BYTE);
    out.extend_from_slice(&schema_id.to_be_bytes());
}

/// Appends `record` framed with `schema_id` to `out`.
#[inline]
pub fn encode_framed<T: AvroRecord>(schema_id: u32, record: &T, out: &mut Vec<u8>) {
    write_header(out, schema_id);
    record.encode(out);
}

/// Splits a framed message into schema id and payload.
///
/// Errors: [`Error::TruncatedHeader`] when shorter than 5 bytes (checked first, so an
/// empty message is truncated, not bad), [`Error::BadMagic`] when the first byte is not 0.
#[inline]
pub fn parse_frame(bytes: &[u8]) -> Result<Frame<'_>> {
    match bytes.split_first_chunk::<HEADER_LEN>() {
        Some(([MAGIC_BYTE, id @ ..], payload)) => Ok(Frame { schema_id: u32::from_be_bytes(*id), payload }),
        Some(([found, ..], _)) => Err(Error::BadMagic { found: *found }),
        None => Err(Error::TruncatedHeader { len: bytes.len() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::SensorReading;

    #[test]
    fn header_is_magic_then_big_endian_id() {
        let mut out = Vec::new();
        write_header(&mut out, 0x0102_0304);
        assert_eq!(out, [0, 1, 2, 3, 4]);
    }

    #[test]
    fn framed_record_round_trips() {
        let r = SensorReading { sensor_id: 7, ts: 1_700_000_000_000, lat: 48.85, lon: 2.35, temp_f: 212.0 };
        let mut out = Vec::new();
        encode_framed(42, &r, &mut out);
        let frame = parse_frame(&out).unwrap();
        assert_eq!(frame.schema_id, 42);
        assert_eq!(frame.payload, r.to_vec().as_slice());
        assert_eq!(SensorReading::from_slice(frame.payload).unwrap(), r);
    }

    #[test]
    fn empty_payload_is_a_valid_frame() {
        let frame = parse_frame(&[0, 0, 0, 0, 9]).unwrap();
        assert_eq!(frame.schema_id, 9);
        assert!(frame.payload.is_empty());
    }

    #[test]
    fn bad_magic_and_truncated_headers_are_named() {
        assert!(matches!(parse_frame(&[1, 0, 0, 0, 1, 2]), Err(Error::BadMagic { found: 1 })));
        for len in 0..HEADER_LEN {
            let bytes = vec![0u8; len];
            assert!(matches!(
                parse_frame(&bytes),
                Err(Error::TruncatedHeader { len: l }) if l == len
            ));
        }
        let msg = parse_frame(b"{\"json\":1}").unwrap_err().to_string();
        assert!(msg.contains("bad magic byte 0x7b"), "{msg}");
    }
}

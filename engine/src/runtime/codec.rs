//! Batches on the wire: each edge knows how to turn its type-erased batches
//! (`Box<dyn Any>` holding a `Vec<Record<T>>`) into bytes and back, so a channel can
//! cross processes. `bincode` (serde), one encode per batch.

use crate::runtime::chain::AnyBatch;
use crate::types::{Batch, Data};
use crate::{Error, Result};

/// Encoder and decoder of one edge's batches.
#[derive(Clone, Copy)]
pub(crate) struct BatchCodec {
    pub(crate) encode: fn(AnyBatch) -> Result<Vec<u8>>,
    pub(crate) decode: fn(&[u8]) -> Result<AnyBatch>,
}

impl std::fmt::Debug for BatchCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BatchCodec")
    }
}

impl BatchCodec {
    /// The codec of batches of `T`.
    pub(crate) fn of<T: Data>() -> Self {
        BatchCodec { encode: encode::<T>, decode: decode::<T> }
    }
}

fn encode<T: Data>(batch: AnyBatch) -> Result<Vec<u8>> {
    let batch = batch.downcast::<Batch<T>>().map_err(|_| {
        Error::Cluster(format!(
            "internal: a network channel got a batch that is not {}",
            std::any::type_name::<T>()
        ))
    })?;
    bincode::serde::encode_to_vec(&*batch, bincode::config::standard())
        .map_err(|e| Error::Cluster(format!("encoding a batch of {}: {e}", std::any::type_name::<T>())))
}

fn decode<T: Data>(bytes: &[u8]) -> Result<AnyBatch> {
    let batch: Batch<T> = decode_bounded(bytes)
        .map_err(|e| Error::Cluster(format!("decoding a batch of {}: {e}", std::any::type_name::<T>())))?;
    Ok(Box::new(batch))
}

/// Decodes bytes that came from another process. bincode allocates what a length prefix
/// inside the message claims; without a limit, 10 hostile bytes claiming a string of
/// 2^59 bytes abort the process. The limit grows with the input (claims count memory, which
/// can be many times the encoded size: 256x, at least 1 MiB), so a peer can only make this
/// process allocate in proportion to what it really sent.
pub(crate) fn decode_bounded<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
) -> Result<T, bincode::error::DecodeError> {
    use bincode::config::standard;
    const KB: usize = 1024;
    let n = bytes.len();
    let decoded = if n <= 4 * KB {
        bincode::serde::decode_from_slice(bytes, standard().with_limit::<{ 1024 * KB }>())
    } else if n <= 64 * KB {
        bincode::serde::decode_from_slice(bytes, standard().with_limit::<{ 16 * 1024 * KB }>())
    } else if n <= 1024 * KB {
        bincode::serde::decode_from_slice(bytes, standard().with_limit::<{ 256 * 1024 * KB }>())
    } else if n <= 16 * 1024 * KB {
        bincode::serde::decode_from_slice(bytes, standard().with_limit::<{ 4096 * 1024 * KB }>())
    } else {
        bincode::serde::decode_from_slice(bytes, standard().with_limit::<{ 64 * 1024 * 1024 * KB }>())
    };
    decoded.map(|(v, _)| v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Record;

    proptest::proptest! {
        /// What arrives from another process is decoded or refused, never a panic: random
        /// bytes, and every cut of a valid batch.
        #[test]
        fn any_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let _ = (BatchCodec::of::<(u64, String)>().decode)(&bytes);
            let _ = (BatchCodec::of::<Vec<f64>>().decode)(&bytes);
        }

        /// A batch that claims a huge string in a few bytes is refused, not allocated.
        #[test]
        fn a_huge_claimed_length_is_refused(claim in (1u64 << 24)..u64::MAX) {
            let mut bytes = vec![1u8, 0, 0]; // one record: ts 0, value.0 = 0
            bytes.push(0xfd); // bincode varint: a u64 follows
            bytes.extend_from_slice(&claim.to_le_bytes()); // the string's length
            bytes.extend_from_slice(b"abc");
            proptest::prop_assert!((BatchCodec::of::<(u64, String)>().decode)(&bytes).is_err());
        }

        /// A valid batch with some bytes changed (#43: random bytes rarely got past the
        /// first field): decoded or refused, never a panic.
        #[test]
        fn a_valid_batch_with_bytes_changed_decodes_or_fails_cleanly(
            changes in proptest::collection::vec((proptest::prelude::any::<usize>(), 1u8..), 1..8)
        ) {
            let codec = BatchCodec::of::<(u64, String)>();
            let batch: Batch<(u64, String)> = vec![Record::new(5, (1, "abcdef".into())), Record::new(-6, (2, "g".into()))];
            let mut bytes = (codec.encode)(Box::new(batch)).unwrap();
            let len = bytes.len();
            for (at, flip) in &changes {
                bytes[at % len] ^= flip;
            }
            let _ = (codec.decode)(&bytes);
        }

        #[test]
        fn a_cut_batch_is_an_error(cut in 0usize..40) {
            let codec = BatchCodec::of::<(u64, String)>();
            let batch: Batch<(u64, String)> = vec![Record::new(5, (1, "abcdef".into())), Record::new(6, (2, "g".into()))];
            let bytes = (codec.encode)(Box::new(batch)).unwrap();
            let cut = cut.min(bytes.len() - 1);
            proptest::prop_assert!((codec.decode)(&bytes[..cut]).is_err());
        }
    }

    #[test]
    fn batches_round_trip() {
        let codec = BatchCodec::of::<(u64, String)>();
        let batch: Batch<(u64, String)> =
            vec![Record::new(5, (1, "a".into())), Record::new(-3, (2, "b".into()))];
        let bytes = (codec.encode)(Box::new(batch.clone())).unwrap();
        let back = (codec.decode)(&bytes).unwrap().downcast::<Batch<(u64, String)>>().unwrap();
        assert_eq!(*back, batch);
        assert!((codec.encode)(Box::new(vec![1u8])).is_err());
    }
}

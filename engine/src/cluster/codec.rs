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
    let (batch, _): (Batch<T>, usize) = bincode::serde::decode_from_slice(bytes, bincode::config::standard())
        .map_err(|e| Error::Cluster(format!("decoding a batch of {}: {e}", std::any::type_name::<T>())))?;
    Ok(Box::new(batch))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Record;

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

//! Turning Kafka record bytes into typed records, without ever panicking on data.

use caudal_schemas::{AvroRecord, Deserializer, RegistryAccess, RegistryClient};
use std::sync::Arc;

/// Why a record could not be decoded.
#[derive(Debug)]
pub enum DecodeError {
    /// The record is bad (not the format, unknown schema, truncated): the source counts
    /// it, sends it on as a dead letter if its decoder takes them, and goes on.
    BadData(String),
    /// Decoding cannot work right now (the registry is unreachable): the source fails and
    /// the job restarts from its checkpoint, losing nothing.
    Unavailable(String),
}

/// Decodes the value (and key) of a Kafka record into a `T`.
pub trait KafkaDecoder<T>: Send {
    /// Decode one record.
    fn decode(&mut self, key: Option<&[u8]>, value: &[u8]) -> Result<T, DecodeError>;

    /// A record that did not decode, as an element of the stream (see
    /// [`crate::kafka::with_dead_letters`]); `None` (the default): it is counted and dropped.
    fn dead_letter(&mut self, _letter: crate::kafka::DeadLetter) -> Option<T> {
        None
    }
}

/// Creates one decoder per source subtask.
pub type DecoderFactory<T> = Arc<dyn Fn() -> caudal::Result<Box<dyn KafkaDecoder<T>>> + Send + Sync>;

/// Confluent-framed Avro: the writer schema is resolved by id through the registry and
/// read into `T`'s schema (added fields take their defaults, removed ones are skipped).
pub struct AvroDecoder<T> {
    deserializer: Deserializer<T>,
}

impl<T> std::fmt::Debug for AvroDecoder<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AvroDecoder")
    }
}

impl<T: AvroRecord> AvroDecoder<T> {
    /// A decoder resolving schema ids with the registry `registry` describes (a URL, or a
    /// [`RegistryAccess`] with credentials and TLS trust). The registry is asked once
    /// whether it lets the client in: a refused password or certificate fails here, not
    /// at the first record; a registry out of reach is only warned about.
    pub fn new(registry: impl Into<RegistryAccess>) -> caudal::Result<Self> {
        let access = registry.into();
        let client = RegistryClient::connect(&access, caudal_schemas::registry::DEFAULT_TIMEOUT)
            .map_err(|e| caudal::Error::config("schema-registry", e.to_string()))?;
        match client.check_access() {
            Err(e) if !e.is_retryable() => {
                return Err(caudal::Error::external_refused("schema registry", e.to_string()))
            }
            Err(e) => tracing::warn!("caudal: the schema registry does not answer yet: {e}"),
            Ok(()) => {}
        }
        Ok(AvroDecoder { deserializer: Deserializer::new(Arc::new(client)) })
    }

    /// A factory for [`super::KafkaSource`].
    pub fn factory(registry: impl Into<RegistryAccess>) -> DecoderFactory<T> {
        let access = registry.into();
        Arc::new(move || Ok(Box::new(AvroDecoder::<T>::new(access.clone())?) as Box<dyn KafkaDecoder<T>>))
    }
}

impl<T: AvroRecord> KafkaDecoder<T> for AvroDecoder<T> {
    fn decode(&mut self, _key: Option<&[u8]>, value: &[u8]) -> Result<T, DecodeError> {
        self.deserializer.deserialize(value).map_err(|e| {
            if e.is_bad_data() {
                DecodeError::BadData(e.to_string())
            } else {
                DecodeError::Unavailable(e.to_string())
            }
        })
    }
}

/// JSON values.
#[derive(Debug, Default, Clone, Copy)]
pub struct JsonDecoder;

impl JsonDecoder {
    /// A factory for [`super::KafkaSource`] of JSON values of type `T`.
    pub fn factory<T: serde::de::DeserializeOwned + 'static>() -> DecoderFactory<T> {
        Arc::new(|| Ok(Box::new(JsonDecoder) as Box<dyn KafkaDecoder<T>>))
    }
}

impl<T: serde::de::DeserializeOwned> KafkaDecoder<T> for JsonDecoder {
    fn decode(&mut self, _key: Option<&[u8]>, value: &[u8]) -> Result<T, DecodeError> {
        serde_json::from_slice(value).map_err(|e| DecodeError::BadData(format!("not the expected JSON: {e}")))
    }
}

//! Turning a record into a Kafka key and value.

use caudal::{Error, Result};
use caudal_schemas::{AvroRecord, RegistryAccess, RegistryClient, Serializer};
use std::sync::Arc;

/// Encodes records of type `T` for a Kafka topic.
pub trait KafkaSerializer<T>: Send + 'static {
    /// Called once when the sink starts, before the first record (register schemas here).
    fn open(&mut self, _topic: &str) -> Result<()> {
        Ok(())
    }

    /// Writes the key (if the record has one: returns `true`) and the value.
    fn serialize(&mut self, record: &T, key: &mut Vec<u8>, value: &mut Vec<u8>) -> Result<bool>;

    /// The record's headers, if it has any (none by default).
    fn headers(&mut self, _record: &T) -> Option<rdkafka::message::OwnedHeaders> {
        None
    }
}

/// Writes the key of a record as UTF-8 text (e.g. the sensor id), readable in any console
/// tool, into the sink's key buffer: no allocation per record.
pub type KeyFn<T> = Arc<dyn Fn(&T, &mut Vec<u8>) + Send + Sync>;

/// Avro in the Confluent wire format, the schema registered under `<topic>-value`.
pub struct AvroSerializer<T> {
    registry: RegistryAccess,
    key: Option<KeyFn<T>>,
    serializer: Option<Serializer<T>>,
}

impl<T> std::fmt::Debug for AvroSerializer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AvroSerializer({})", self.registry.url)
    }
}

impl<T: AvroRecord> AvroSerializer<T> {
    /// Registers `T`'s schema with the registry `registry` describes (a URL, or a
    /// [`RegistryAccess`] with credentials and TLS trust) when the sink starts.
    pub fn new(registry: impl Into<RegistryAccess>) -> Self {
        AvroSerializer { registry: registry.into(), key: None, serializer: None }
    }

    /// Keys every record with `key(record)`, written as UTF-8 text.
    pub fn keyed<K: std::fmt::Display>(mut self, key: impl Fn(&T) -> K + Send + Sync + 'static) -> Self {
        self.key = Some(Arc::new(move |record: &T, out: &mut Vec<u8>| {
            use std::io::Write;
            // Writing into a Vec cannot fail.
            let _ = write!(out, "{}", key(record));
        }));
        self
    }
}

impl<T: AvroRecord> KafkaSerializer<T> for AvroSerializer<T> {
    fn open(&mut self, topic: &str) -> Result<()> {
        let client = RegistryClient::connect(&self.registry, caudal_schemas::registry::DEFAULT_TIMEOUT)
            .map_err(|e| Error::Config { setting: "schema-registry".into(), message: e.to_string() })?;
        let serializer = Serializer::<T>::for_topic(&client, topic).map_err(|e| {
            let message = format!("registering the schema of `{topic}` with {}: {e}", self.registry.url);
            match e.is_retryable() {
                true => Error::external("schema registry", message),
                false => Error::external_refused("schema registry", message),
            }
        })?;
        self.serializer = Some(serializer);
        Ok(())
    }

    fn serialize(&mut self, record: &T, key: &mut Vec<u8>, value: &mut Vec<u8>) -> Result<bool> {
        let serializer = self
            .serializer
            .as_ref()
            .ok_or_else(|| Error::Operator("Avro serializer used before open()".into()))?;
        serializer.serialize(record, value);
        Ok(match &self.key {
            Some(f) => {
                f(record, key);
                true
            }
            None => false,
        })
    }
}

/// JSON values (no key): for topics read by people and scripts.
#[derive(Debug, Default, Clone, Copy)]
pub struct JsonSerializer;

impl<T: serde::Serialize> KafkaSerializer<T> for JsonSerializer {
    fn serialize(&mut self, record: &T, _key: &mut Vec<u8>, value: &mut Vec<u8>) -> Result<bool> {
        serde_json::to_writer(value, record)
            .map_err(|e| Error::BadRecord(format!("serializing a record to JSON: {e}")))?;
        Ok(false)
    }
}

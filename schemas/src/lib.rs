//! Caudal schemas: the checked-in Avro records, their codecs, the Confluent wire format,
//! a schema-registry client and the BACKWARD compatibility check.
//!
//! In: Confluent-framed Avro bytes from Kafka (magic byte 0, 4-byte schema id, datum).
//! Out: typed records ([`SensorReading`], [`ProcessedReading`], [`WindowStats`],
//! [`UserInteraction`], [`SensorAlert`]), and back.
//!
//! Invariant: bytes are decoded with the schema they were written with, resolved into
//! the reader's: the hand-written fast path takes them as is only when the writer schema
//! (looked up by the frame's id) is the record's own schema; any other writer schema is
//! resolved first (a compiled rewrite for flat records, apache-avro's resolution
//! otherwise). Bad bytes are an [`Error`] for which [`Error::is_bad_data`] holds, never
//! a panic.
//!
//! ```
//! use std::sync::Arc;
//! use caudal_schemas::{Deserializer, InMemorySchemaStore, SensorReading, Serializer};
//!
//! // A `RegistryClient::new("http://127.0.0.1:18081")?` in production.
//! let store = Arc::new(InMemorySchemaStore::new());
//! let serializer = Serializer::<SensorReading>::for_topic(store.as_ref(), "earth-temp")?;
//! let reading = SensorReading {
//!     sensor_id: 7,
//!     ts: 1_700_000_000_000,
//!     lat: 48.85,
//!     lon: 2.35,
//!     temp_f: 212.0,
//! };
//! let message = serializer.to_vec(&reading);
//! assert_eq!(message[0], 0); // magic byte
//!
//! let mut deserializer = Deserializer::<SensorReading>::new(store);
//! assert_eq!(deserializer.deserialize(&message)?, reading);
//! assert!(deserializer.deserialize(b"garbage").unwrap_err().is_bad_data());
//! # Ok::<(), caudal_schemas::Error>(())
//! ```

pub mod client_properties;
pub mod codec;
pub mod compat;
mod error;
pub mod records;
pub mod registry;
pub mod registry_access;
pub mod serdes;
mod transcode;
pub mod wire;

pub use apache_avro;
pub use apache_avro::Schema;
pub use client_properties::ClientProperties;
pub use codec::{parse_schema, AvroRecord};
pub use compat::{check, check_backward, check_forward, CompatibilityLevel, Incompatibility};
pub use error::{DecodeError, Error, RegistryError, Result};
pub use records::{
    AlertKind, EventType, ProcessedReading, SensorAlert, SensorReading, UserInteraction,
    UserInteractionCount, WindowStats,
};
pub use registry::{subject_for_topic, InMemorySchemaStore, RegistryClient, SchemaStore};
pub use registry_access::{RegistryAccess, RegistryCredentials};
pub use serdes::{Deserializer, Serializer};
pub use wire::{encode_framed, parse_frame, Frame};

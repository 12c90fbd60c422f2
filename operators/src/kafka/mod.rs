//! Kafka in and out (DESIGN.md §5–6).
//!
//! * [`KafkaSource`]: topic partitions → records, offsets in the checkpoint,
//!   `read_committed`, a watermark split per partition, bad records dead-lettered.
//! * [`KafkaSink`]: records → a topic, exactly-once through a Kafka transaction per
//!   checkpoint epoch committed when the checkpoint completes — including after a crash
//!   between "checkpoint complete" and "committed", through [`txn_coordinator`].
//! * Broker health seen from the client: leader, replicas and in-sync replicas of every
//!   partition a source reads or a sink writes (`health`).
//! * Avro in the Confluent wire format through `caudal-schemas` ([`AvroDecoder`],
//!   [`AvroSerializer`]), or JSON.

mod health;
pub mod sink;
pub mod source;
pub mod txn_coordinator;

pub use sink::{
    AvroSerializer, DeliveryGuarantee, JsonSerializer, KafkaSerializer, KafkaSink, KafkaSinkConfig,
};
pub use source::{
    AvroDecoder, DecodeError, JsonDecoder, KafkaDecoder, KafkaSource, KafkaSourceConfig, StartFrom,
};

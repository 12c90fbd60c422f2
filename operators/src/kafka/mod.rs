//! Kafka in and out (DESIGN.md §5–6).
//!
//! * [`KafkaSource`]: topic partitions → records, offsets in the checkpoint,
//!   `read_committed`, a watermark split per partition, bad records counted against a
//!   budget and, through `dead_letter`, sent down the stream to a dead-letter sink.
//! * [`KafkaSink`]: records → a topic, exactly-once through a Kafka transaction per
//!   checkpoint epoch committed when the checkpoint completes — including after a crash
//!   between "checkpoint complete" and "committed", through [`txn_coordinator`].
//! * Broker health seen from the client: leader, replicas and in-sync replicas of every
//!   partition a source reads or a sink writes (`health`).
//! * Avro in the Confluent wire format through `caudal-schemas` ([`AvroDecoder`],
//!   [`AvroSerializer`]), or JSON.

mod dead_letter;
mod health;
pub mod properties;
mod serde_forms;
pub mod sink;
pub mod source;
pub mod txn_coordinator;
mod wire;

pub use caudal_schemas::client_properties::{self, ClientProperties};
pub use dead_letter::{
    split_dead_letters, with_dead_letters, DeadLetter, DeadLetterSerializer, Decoded, SplitDeadLetters,
    DEAD_LETTERS,
};
pub use sink::{
    AvroSerializer, DeliveryGuarantee, JsonSerializer, KafkaSerializer, KafkaSink, KafkaSinkConfig,
};
pub use source::{
    AvroDecoder, DecodeError, JsonDecoder, KafkaDecoder, KafkaSource, KafkaSourceConfig, StartFrom,
};
pub use wire::KafkaSecurity;

/// A client configuration that only reaches the brokers: `brokers` plus the connection and
/// security settings among a connector's `properties` (the others are producer- or
/// consumer-specific). For the side clients: the health probe, the sink's startup check.
pub(crate) fn connection_config(brokers: &str, properties: &[(String, String)]) -> rdkafka::ClientConfig {
    let mut client = rdkafka::ClientConfig::new();
    client.set("bootstrap.servers", brokers);
    for (k, v) in connection_properties(properties) {
        client.set(k, v);
    }
    client
}

/// The connection and security settings among a client's `properties` (those any other
/// client of the same cluster needs too: e.g. a consumer's, for the dead-letter producer).
pub fn connection_properties(properties: &[(String, String)]) -> Vec<(String, String)> {
    let reach = |k: &str| ["security.", "sasl.", "ssl.", "client.dns"].iter().any(|p| k.starts_with(p));
    properties.iter().filter(|(k, _)| reach(k)).cloned().collect()
}

/// Fails at once when the brokers refuse these settings — a wrong password, a CA that did not
/// sign them — where librdkafka would log the refusal and try again for ever: one connection
/// of Caudal's own client, with the TLS and SASL settings among `properties`. Settings only
/// librdkafka speaks (another SASL mechanism) and brokers out of reach are left to it.
pub(crate) fn check_access(brokers: &str, properties: &[(String, String)], what: &str) -> caudal::Result<()> {
    let Ok(security) = KafkaSecurity::from_properties(&connection_properties(properties)) else {
        return Ok(());
    };
    let client = txn_coordinator::TxnCoordinatorClient::new(brokers, std::time::Duration::from_secs(30))
        .with_security(security);
    match client.check_access() {
        Err(e) if e.is_refused_access() => {
            Err(caudal::Error::external_refused("kafka", format!("{what}: {e}")))
        }
        _ => Ok(()),
    }
}

//! Flags the job binaries share.

use caudal_operators::kafka::properties::parse_property;
use clap::Args;

/// Kafka and its schema registry.
#[derive(Debug, Args)]
pub struct KafkaArgs {
    /// Kafka bootstrap brokers, host:port[,host:port…].
    #[arg(long, default_value = "127.0.0.1:9092", env = "CAUDAL_KAFKA_BROKERS")]
    pub brokers: String,
    /// Confluent-compatible schema registry URL.
    #[arg(long, default_value = "http://127.0.0.1:8085", env = "CAUDAL_SCHEMA_REGISTRY")]
    pub schema_registry: String,
    /// A librdkafka property of the Kafka producers (sinks, dead letters), KEY=VALUE;
    /// repeatable (e.g. compression.type=snappy, linger.ms=10, batch.size=32768,
    /// client.id=…). Properties Caudal's guarantees rest on are refused, with the reason.
    #[arg(long = "producer-property", value_name = "KEY=VALUE", value_parser = parse_property)]
    pub producer_properties: Vec<(String, String)>,
    /// A librdkafka property of the Kafka consumers (sources), KEY=VALUE; repeatable
    /// (e.g. fetch.min.bytes=100000). isolation.level=read_uncommitted and the like are refused.
    #[arg(long = "consumer-property", value_name = "KEY=VALUE", value_parser = parse_property)]
    pub consumer_properties: Vec<(String, String)>,
}

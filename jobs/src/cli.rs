//! Flags the job binaries share.

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
}

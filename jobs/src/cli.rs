//! Flags the job binaries share.

use caudal_operators::kafka::properties::parse_property;
use caudal_operators::kafka::ClientProperties;
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
    /// A Kafka client configuration file (`client.properties`: security.protocol, sasl.*,
    /// ssl.*, …) for every Kafka connection of the job — sources, sinks, dead letters, the
    /// exactly-once recommit, health probes. `${env:NAME}` in a value reads a variable.
    #[arg(long = "kafka-config", value_name = "FILE", env = "CAUDAL_KAFKA_CONFIG")]
    pub kafka_config: Option<std::path::PathBuf>,
    /// A Kafka client property for every connection, KEY=VALUE; repeatable; after the
    /// file's (e.g. security.protocol=SASL_SSL).
    #[arg(long = "kafka-property", value_name = "KEY=VALUE", value_parser = parse_property)]
    pub kafka_properties: Vec<(String, String)>,
}

impl KafkaArgs {
    /// What every Kafka client takes: `--kafka-config`'s Kafka keys, then `--kafka-property`.
    pub fn common(&self) -> caudal::Result<Vec<(String, String)>> {
        let mut common = match &self.kafka_config {
            Some(path) => ClientProperties::load(path)?.kafka,
            None => Vec::new(),
        };
        common.extend(self.kafka_properties.iter().cloned());
        Ok(common)
    }

    /// Every producer's properties: [`Self::common`], then `--producer-property`.
    pub fn for_producers(&self) -> caudal::Result<Vec<(String, String)>> {
        let mut properties = self.common()?;
        properties.extend(self.producer_properties.iter().cloned());
        Ok(properties)
    }

    /// Every consumer's properties: [`Self::common`], then `--consumer-property`.
    pub fn for_consumers(&self) -> caudal::Result<Vec<(String, String)>> {
        let mut properties = self.common()?;
        properties.extend(self.consumer_properties.iter().cloned());
        Ok(properties)
    }
}

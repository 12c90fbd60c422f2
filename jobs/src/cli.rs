//! Flags the job binaries share.

use caudal_operators::kafka::properties::parse_property;
use caudal_operators::kafka::ClientProperties;
use caudal_schemas::RegistryAccess;
use clap::Args;

/// Kafka and its schema registry.
#[derive(Debug, Args)]
pub struct KafkaArgs {
    /// Kafka bootstrap brokers, host:port[,host:port…].
    #[arg(long, default_value = "127.0.0.1:9092", env = "CAUDAL_KAFKA_BROKERS")]
    pub brokers: String,
    /// Confluent-compatible schema registry URL [default: `--kafka-config`'s
    /// schema.registry.url, else $CAUDAL_SCHEMA_REGISTRY, else http://127.0.0.1:8085].
    #[arg(long)]
    pub schema_registry: Option<String>,
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
    /// exactly-once recommit, health probes — and the schema registry's (schema.registry.url,
    /// basic.auth.*, bearer.auth.token, schema.registry.ssl.*). `${env:NAME}` in a value
    /// reads a variable.
    #[arg(long = "kafka-config", value_name = "FILE", env = "CAUDAL_KAFKA_CONFIG")]
    pub kafka_config: Option<std::path::PathBuf>,
    /// A Kafka client property for every connection, KEY=VALUE; repeatable; after the
    /// file's (e.g. security.protocol=SASL_SSL).
    #[arg(long = "kafka-property", value_name = "KEY=VALUE", value_parser = parse_property)]
    pub kafka_properties: Vec<(String, String)>,
}

/// The registry a job reaches when nothing names one.
pub const DEFAULT_SCHEMA_REGISTRY: &str = "http://127.0.0.1:8085";

impl KafkaArgs {
    /// The `--kafka-config` file's settings (none without the flag).
    fn client_properties(&self) -> caudal::Result<ClientProperties> {
        match &self.kafka_config {
            Some(path) => {
                ClientProperties::load(path).map_err(|e| caudal::Error::config("--kafka-config", e))
            }
            None => Ok(ClientProperties::default()),
        }
    }

    /// What every Kafka client takes: `--kafka-config`'s Kafka keys, then `--kafka-property`.
    pub fn common(&self) -> caudal::Result<Vec<(String, String)>> {
        let mut common = self.client_properties()?.kafka;
        common.extend(self.kafka_properties.iter().cloned());
        Ok(common)
    }

    /// How to reach the schema registry: `--kafka-config`'s registry keys (URL,
    /// credentials, CA). The URL: `--schema-registry`, else the file's, else
    /// `CAUDAL_SCHEMA_REGISTRY`, else [`DEFAULT_SCHEMA_REGISTRY`].
    pub fn registry(&self) -> caudal::Result<RegistryAccess> {
        let mut properties = self.client_properties()?;
        properties.kafka.extend(self.kafka_properties.iter().cloned());
        let access =
            RegistryAccess::resolve(self.schema_registry.as_deref(), &properties, DEFAULT_SCHEMA_REGISTRY)
                .map_err(|e| caudal::Error::config("--kafka-config", e))?;
        Ok(access)
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

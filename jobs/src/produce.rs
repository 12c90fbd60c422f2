//! `temperature produce`: simulated sensor readings into a Kafka topic, as Avro registered
//! with the schema registry, keyed by sensor id — the stand-in for the reference
//! architecture's Kafka Connect source.
//!
//! It is itself a small Caudal job (generator → Kafka sink with the idempotent producer,
//! acks=all, lz4), so the readings are exactly the generator's for the same seed.

use crate::temperature::names;
use caudal::{JobConfig, JobResult, Result, StreamEnv, WatermarkStrategy};
use caudal_operators::generator::{GeneratorConfig, SensorReading};
use caudal_operators::kafka::{AvroSerializer, DeliveryGuarantee, KafkaSinkConfig};
use caudal_schemas::RegistryAccess;

/// What to produce where.
#[derive(Debug, Clone)]
pub struct Producer {
    /// The readings.
    pub generator: GeneratorConfig,
    /// `host:port[,…]`.
    pub brokers: String,
    /// How to reach the schema registry.
    pub schema_registry: RegistryAccess,
    /// The topic (`earth-temp`).
    pub topic: String,
    /// librdkafka producer properties passed through (checked at start).
    pub properties: Vec<(String, String)>,
}

impl Producer {
    /// Produces the readings; returns when a bounded generator is exhausted (or never).
    ///
    /// The readings go out in event-time order (one generator shard): a partition then
    /// holds each of its sensors in order, and a reader's watermark never runs ahead of
    /// records still to come.
    pub fn run(&self, config: JobConfig) -> Result<JobResult> {
        let env = StreamEnv::with_config(JobConfig { parallelism: 1, ..config });
        let generator = GeneratorConfig { splits: 1, ..self.generator.clone() };
        let mut sink =
            KafkaSinkConfig::new(&self.brokers, &self.topic).delivery(DeliveryGuarantee::AtLeastOnce);
        sink.properties = self.properties.clone();
        let registry = self.schema_registry.clone();
        env.source(names::SOURCE, generator.build()?, WatermarkStrategy::none()).sink(
            "kafka-producer",
            move |_| {
                let serializer =
                    AvroSerializer::<SensorReading>::new(registry.clone()).keyed(|r| r.sensor_id);
                sink.build(serializer)
            },
        );
        env.execute(&format!("produce-{}", self.topic))
    }
}

//! The Kafka source: partitions assigned to subtasks explicitly (partition `p` to subtask
//! `p % parallelism`, no group rebalancing), offsets kept in the checkpoint, records read
//! `read_committed`, one watermark split per partition.
//!
//! Flow: `topic partitions ─librdkafka consumer─► decoder ─► records (+ timestamps)`;
//! undecodable records are counted, against a budget, and sent on as dead letters by a
//! decoder that takes them (`kafka::dead_letter`). Offsets are committed to the consumer
//! group when a checkpoint completes, so external lag tools see progress; the truth is the
//! offsets in the checkpoint.
//!
//! Lag: each partition publishes the gauges of `caudal::metrics::kafka_gauges` (end offset
//! from librdkafka's statistics every `lag_interval`, checkpointed offset, lag), which the
//! engine serves at `/api/v1/jobs/{job}/kafka`, on the job page and at `/metrics`.

mod bad_records;
mod decode;
mod reader;

pub use decode::{AvroDecoder, DecodeError, DecoderFactory, JsonDecoder, KafkaDecoder};
pub use reader::KafkaSourceReader;

use caudal::{Data, Result, Source, SourceContext, SourceReader};
use std::time::Duration;

/// Where a partition starts when the job does not restore a checkpoint (a restored job
/// always resumes from the checkpointed offsets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StartFrom {
    /// The earliest retained offset (default).
    #[default]
    Earliest,
    /// The end: only records produced after the start.
    Latest,
    /// The consumer group's committed offsets (committed when checkpoints complete),
    /// the earliest offset where the group has none.
    Committed,
}

/// The configuration of a [`KafkaSource`]; in JSON (or any serde format) durations are
/// milliseconds (`lag_interval_ms`, `partition_discovery_ms`), properties a map, and an
/// unknown field is an error. [`KafkaSourceConfig::build`] checks it and makes the source.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSourceConfig {
    /// `host:port[,host:port…]`.
    pub brokers: String,
    /// The topic read.
    pub topic: String,
    /// Consumer group offsets are committed to; `None`: `caudal-<job>-<operator>`.
    #[serde(default)]
    pub group_id: Option<String>,
    /// Read up to the end offsets present at start, then finish.
    #[serde(default)]
    pub bounded: bool,
    /// Where partitions start when no checkpoint is restored.
    #[serde(default)]
    pub start_from: StartFrom,
    /// More records that cannot be decoded than this in any minute fail the job (`None`: no
    /// such limit). Whatever it is, an input of which every record is bad fails the job: at
    /// the end of a bounded one, after 1,000 of an unbounded one.
    #[serde(default)]
    pub max_bad_records_per_minute: Option<u64>,
    /// How often end offsets (for lag) are refreshed (librdkafka statistics interval).
    #[serde(rename = "lag_interval_ms", with = "crate::kafka::serde_forms::millis")]
    #[serde(default = "default_lag_interval")]
    pub lag_interval: Duration,
    /// Extra librdkafka consumer properties (checked at start: see `kafka::properties`).
    #[serde(default, with = "crate::kafka::serde_forms::pairs")]
    pub properties: Vec<(String, String)>,
    /// How often an unbounded source looks for partitions added to its topic (`None`:
    /// never); a new partition is read from its beginning, and checkpointed like the
    /// others. A bounded source reads the partitions present at start.
    #[serde(rename = "partition_discovery_ms", with = "crate::kafka::serde_forms::millis::optional")]
    #[serde(default = "default_partition_discovery")]
    pub partition_discovery: Option<Duration>,
}

fn default_lag_interval() -> Duration {
    Duration::from_secs(1)
}

fn default_partition_discovery() -> Option<Duration> {
    Some(DEFAULT_PARTITION_DISCOVERY)
}

/// How often partitions added to a topic are looked for, by default (as Flink's
/// `partition.discovery.interval.ms`).
pub const DEFAULT_PARTITION_DISCOVERY: Duration = Duration::from_secs(30);

impl KafkaSourceConfig {
    /// Unbounded, from the earliest offset.
    pub fn new(brokers: impl Into<String>, topic: impl Into<String>) -> Self {
        KafkaSourceConfig {
            brokers: brokers.into(),
            topic: topic.into(),
            group_id: None,
            bounded: false,
            start_from: StartFrom::Earliest,
            max_bad_records_per_minute: None,
            lag_interval: default_lag_interval(),
            properties: Vec::new(),
            partition_discovery: Some(DEFAULT_PARTITION_DISCOVERY),
        }
    }

    /// Reads up to the end offsets present at start, then finishes.
    pub fn bounded(mut self, bounded: bool) -> Self {
        self.bounded = bounded;
        self
    }

    /// Checks what can be checked without a broker: a topic and brokers named, intervals of
    /// at least 100 ms, and the properties (`kafka::properties`).
    pub fn validate(&self) -> Result<()> {
        if self.brokers.trim().is_empty() {
            return Err(caudal::Error::config("kafka.brokers", "no broker given"));
        }
        if self.topic.trim().is_empty() {
            return Err(caudal::Error::config("kafka.topic", "no topic given"));
        }
        let short = |d: Duration| d < Duration::from_millis(100);
        if short(self.lag_interval) || self.partition_discovery.is_some_and(short) {
            return Err(caudal::Error::config(
                "kafka.lag_interval_ms / partition_discovery_ms",
                "intervals below 100 ms would flood the brokers with metadata requests",
            ));
        }
        super::properties::check_consumer_properties(&self.properties)
    }

    /// Validates and builds the source, decoding records with `decoder`.
    pub fn build<T: caudal::Data>(&self, decoder: DecoderFactory<T>) -> Result<KafkaSource<T>> {
        self.validate()?;
        Ok(KafkaSource::new(self.clone(), decoder))
    }

    /// Sets the consumer group.
    pub fn group_id(mut self, group: impl Into<String>) -> Self {
        self.group_id = Some(group.into());
        self
    }
}

/// Reads a Kafka topic as a stream of `T`.
pub struct KafkaSource<T> {
    config: KafkaSourceConfig,
    decoder: DecoderFactory<T>,
}

impl<T> std::fmt::Debug for KafkaSource<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KafkaSource({})", self.config.topic)
    }
}

impl<T: Data> KafkaSource<T> {
    /// A source for `config` decoding with decoders made by `decoder`.
    pub fn new(config: KafkaSourceConfig, decoder: DecoderFactory<T>) -> Self {
        KafkaSource { config, decoder }
    }

    /// A source of JSON values.
    pub fn json(config: KafkaSourceConfig) -> Self
    where
        T: serde::de::DeserializeOwned,
    {
        KafkaSource::new(config, JsonDecoder::factory())
    }
}

impl<T: Data> Source for KafkaSource<T> {
    type Out = T;

    fn create_reader(&self, ctx: &SourceContext, restored: &[Vec<u8>]) -> Result<Box<dyn SourceReader<T>>> {
        Ok(Box::new(KafkaSourceReader::open(&self.config, (self.decoder)()?, ctx, restored)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_reads_from_json_refuses_unknown_fields_and_validates() {
        let json = r#"{"brokers":"b:9092","topic":"in","bounded":true,"start_from":"latest",
            "partition_discovery_ms":null,"properties":{"fetch.min.bytes":"1000"}}"#;
        let config: KafkaSourceConfig = serde_json::from_str(json).unwrap();
        assert!(config.bounded);
        assert_eq!(config.start_from, StartFrom::Latest);
        assert_eq!(config.partition_discovery, None, "discovery off");
        assert_eq!(config.lag_interval, Duration::from_secs(1), "the default");
        let again: KafkaSourceConfig =
            serde_json::from_str(&serde_json::to_string(&config).unwrap()).unwrap();
        assert_eq!(again, config);
        let defaults: KafkaSourceConfig = serde_json::from_str(r#"{"brokers":"b","topic":"t"}"#).unwrap();
        assert_eq!(defaults, KafkaSourceConfig::new("b", "t"));
        let e = serde_json::from_str::<KafkaSourceConfig>(r#"{"brokers":"b","topic":"t","group":"g"}"#)
            .unwrap_err();
        assert!(e.to_string().contains("group"), "{e}");
        config.validate().unwrap();
        let mut fast = KafkaSourceConfig::new("b", "t");
        fast.partition_discovery = Some(Duration::from_millis(10));
        assert!(fast.validate().unwrap_err().to_string().contains("100 ms"));
        let mut uncommitted = KafkaSourceConfig::new("b", "t");
        uncommitted.properties.push(("isolation.level".into(), "read_uncommitted".into()));
        assert!(uncommitted.validate().unwrap_err().to_string().contains("refused"));
    }
}

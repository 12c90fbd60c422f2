//! The Kafka source: partitions assigned to subtasks explicitly (partition `p` to subtask
//! `p % parallelism`, no group rebalancing), offsets kept in the checkpoint, records read
//! `read_committed`, one watermark split per partition.
//!
//! Flow: `topic partitions ─librdkafka consumer─► decoder ─► records (+ timestamps)`;
//! undecodable records `─► dead-letter topic`. Offsets are committed to the consumer
//! group when a checkpoint completes, so external lag tools see progress; the truth is the
//! offsets in the checkpoint.
//!
//! Lag: each partition publishes the gauges of `caudal::metrics::kafka_gauges` (end offset
//! from librdkafka's statistics every `lag_interval`, checkpointed offset, lag), which the
//! engine serves at `/api/v1/jobs/{job}/kafka`, on the job page and at `/metrics`.

mod dead_letter;
mod decode;
mod reader;

pub use decode::{AvroDecoder, DecodeError, DecoderFactory, JsonDecoder, KafkaDecoder};
pub use reader::KafkaSourceReader;

use caudal::{Data, Result, Source, SourceContext, SourceReader};
use std::sync::Arc;
use std::time::Duration;

/// Where a partition starts when the job does not restore a checkpoint (a restored job
/// always resumes from the checkpointed offsets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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

/// The configuration of a [`KafkaSource`].
#[derive(Debug, Clone)]
pub struct KafkaSourceConfig {
    /// `host:port[,host:port…]`.
    pub brokers: String,
    /// The topic read.
    pub topic: String,
    /// Consumer group offsets are committed to; `None`: `caudal-<job>-<operator>`.
    pub group_id: Option<String>,
    /// Read up to the end offsets present at start, then finish.
    pub bounded: bool,
    /// Where partitions start when no checkpoint is restored.
    pub start_from: StartFrom,
    /// Topic for records that cannot be decoded; `None`: count and log them only.
    pub dead_letter_topic: Option<String>,
    /// How often end offsets (for lag) are refreshed (librdkafka statistics interval).
    pub lag_interval: Duration,
    /// Extra librdkafka consumer properties (checked at start: see `kafka::properties`).
    pub properties: Vec<(String, String)>,
    /// How often an unbounded source looks for partitions added to its topic (`None`:
    /// never); a new partition is read from its beginning, and checkpointed like the
    /// others. A bounded source reads the partitions present at start.
    pub partition_discovery: Option<Duration>,
}

/// How often partitions added to a topic are looked for, by default (as Flink's
/// `partition.discovery.interval.ms`).
pub const DEFAULT_PARTITION_DISCOVERY: Duration = Duration::from_secs(30);

impl KafkaSourceConfig {
    /// Unbounded, from the earliest offset, without dead-letter topic.
    pub fn new(brokers: impl Into<String>, topic: impl Into<String>) -> Self {
        KafkaSourceConfig {
            brokers: brokers.into(),
            topic: topic.into(),
            group_id: None,
            bounded: false,
            start_from: StartFrom::Earliest,
            dead_letter_topic: None,
            lag_interval: Duration::from_secs(1),
            properties: Vec::new(),
            partition_discovery: Some(DEFAULT_PARTITION_DISCOVERY),
        }
    }

    /// Reads up to the end offsets present at start, then finishes.
    pub fn bounded(mut self, bounded: bool) -> Self {
        self.bounded = bounded;
        self
    }

    /// Sends undecodable records to `topic`.
    pub fn dead_letter_topic(mut self, topic: impl Into<String>) -> Self {
        self.dead_letter_topic = Some(topic.into());
        self
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
        KafkaSource::new(config, Arc::new(|| Ok(Box::new(JsonDecoder) as Box<dyn KafkaDecoder<T>>)))
    }
}

impl<T: Data> Source for KafkaSource<T> {
    type Out = T;

    fn create_reader(&self, ctx: &SourceContext, restored: &[Vec<u8>]) -> Result<Box<dyn SourceReader<T>>> {
        Ok(Box::new(KafkaSourceReader::open(&self.config, (self.decoder)()?, ctx, restored)?))
    }
}

//! Where records that cannot be decoded go: a dead-letter topic, with where they came from.
//!
//! Each bad record is produced as is (key and value bytes untouched) with headers
//! `caudal.source.topic`, `caudal.source.partition`, `caudal.source.offset` and
//! `caudal.error`, by an idempotent producer flushed at every checkpoint barrier
//! (at-least-once: a restore may dead-letter a record twice, never lose one).

use crate::kafka::sink::send_waiting;
use caudal::{Error, Result};
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::time::Duration;

/// The dead-letter producer of one source subtask.
pub(crate) struct DeadLetters {
    producer: BaseProducer,
    topic: String,
}

/// Where a bad record was read.
pub(crate) struct Origin<'a> {
    pub(crate) topic: &'a str,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
}

impl DeadLetters {
    pub(crate) fn new(brokers: &str, topic: &str) -> Result<Self> {
        let producer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .create()
            .map_err(|e| Error::Config { setting: "dead-letter-topic".into(), message: e.to_string() })?;
        Ok(DeadLetters { producer, topic: topic.to_owned() })
    }

    pub(crate) fn send(
        &self,
        origin: &Origin<'_>,
        key: Option<&[u8]>,
        value: &[u8],
        error: &str,
    ) -> Result<()> {
        let partition = origin.partition.to_string();
        let offset = origin.offset.to_string();
        let headers = OwnedHeaders::new()
            .insert(Header { key: "caudal.source.topic", value: Some(origin.topic) })
            .insert(Header { key: "caudal.source.partition", value: Some(partition.as_str()) })
            .insert(Header { key: "caudal.source.offset", value: Some(offset.as_str()) })
            .insert(Header { key: "caudal.error", value: Some(error) });
        let mut record = BaseRecord::<[u8], [u8]>::to(&self.topic).payload(value).headers(headers);
        if let Some(key) = key {
            record = record.key(key);
        }
        send_waiting(&self.producer, record)
            .map_err(|e| Error::external("kafka", format!("dead-letter topic `{}`: {e}", self.topic)))
    }

    /// Waits until every dead letter is acknowledged (at each barrier).
    pub(crate) fn flush(&self) -> Result<()> {
        self.producer
            .flush(Duration::from_secs(60))
            .map_err(|e| Error::external("kafka", format!("dead-letter topic `{}`: {e}", self.topic)))
    }
}

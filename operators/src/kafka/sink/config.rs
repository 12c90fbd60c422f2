//! What a Kafka sink is configured with, and the startup checks of that configuration.

use caudal::{Error, Result};
use std::time::Duration;

/// How a sink delivers records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeliveryGuarantee {
    /// A Kafka transaction per checkpoint epoch, committed when the checkpoint completes
    /// (the default): `read_committed` readers see every record exactly once.
    #[default]
    ExactlyOnce,
    /// The idempotent producer, flushed at every barrier: nothing lost, duplicates after
    /// a restore.
    AtLeastOnce,
    /// Fire and forget: no flush at barriers.
    None,
}

impl std::str::FromStr for DeliveryGuarantee {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "exactly-once" => Ok(DeliveryGuarantee::ExactlyOnce),
            "at-least-once" => Ok(DeliveryGuarantee::AtLeastOnce),
            "none" => Ok(DeliveryGuarantee::None),
            other => Err(Error::Config {
                setting: "delivery".into(),
                message: format!("`{other}` is not one of exactly-once, at-least-once, none"),
            }),
        }
    }
}

/// Time a restarted job may take to restore before its pending transactions must still be
/// alive at the broker.
pub const RESTART_ALLOWANCE: Duration = Duration::from_secs(2 * 60);

/// The configuration of a [`super::KafkaSink`].
#[derive(Debug, Clone)]
pub struct KafkaSinkConfig {
    /// `host:port[,host:port…]`.
    pub brokers: String,
    /// The topic written.
    pub topic: String,
    /// Exactly-once (default), at-least-once or none.
    pub delivery: DeliveryGuarantee,
    /// Prefix of the transactional ids; `None`: `<job>-<operator uid>`. Two jobs writing
    /// at the same time must not share it: they would fence each other.
    pub transactional_id_prefix: Option<String>,
    /// The producer's `transaction.timeout.ms`: must exceed checkpoint interval +
    /// checkpoint timeout + a restart, and stay within the broker's
    /// `transaction.max.timeout.ms`.
    pub transaction_timeout: Duration,
    /// Time allowed for one flush, commit or coordinator call.
    pub request_timeout: Duration,
    /// Stamp Kafka records with the record's event time instead of the time they are
    /// produced. Off by default: a broker deletes records stamped older than the topic's
    /// `retention.ms` right away (replays of old data would vanish).
    pub event_time_timestamps: bool,
    /// Extra librdkafka producer properties (e.g. `compression.type`, `linger.ms`).
    pub properties: Vec<(String, String)>,
}

impl KafkaSinkConfig {
    /// Exactly-once into `topic` on `brokers`, with a 15-minute transaction timeout (the
    /// broker's default maximum).
    pub fn new(brokers: impl Into<String>, topic: impl Into<String>) -> Self {
        KafkaSinkConfig {
            brokers: brokers.into(),
            topic: topic.into(),
            delivery: DeliveryGuarantee::ExactlyOnce,
            transactional_id_prefix: None,
            transaction_timeout: Duration::from_secs(15 * 60),
            request_timeout: Duration::from_secs(60),
            event_time_timestamps: false,
            properties: Vec::new(),
        }
    }

    /// Sets the delivery guarantee.
    pub fn delivery(mut self, delivery: DeliveryGuarantee) -> Self {
        self.delivery = delivery;
        self
    }

    /// Sets `transaction.timeout.ms`.
    pub fn transaction_timeout(mut self, timeout: Duration) -> Self {
        self.transaction_timeout = timeout;
        self
    }

    /// Adds a librdkafka producer property.
    pub fn property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.push((key.into(), value.into()));
        self
    }

    /// Exactly-once needs the transaction to outlive the longest time between its
    /// pre-commit and its commit: a checkpoint interval, a checkpoint timeout and a restart.
    pub(crate) fn check_timeout(&self, checkpoint_timing: Option<(Duration, Duration)>) -> Result<()> {
        if self.delivery != DeliveryGuarantee::ExactlyOnce {
            return Ok(());
        }
        let Some((interval, timeout)) = checkpoint_timing else { return Ok(()) };
        let needed = interval + timeout + RESTART_ALLOWANCE;
        if self.transaction_timeout < needed {
            return Err(Error::Config {
                setting: "transaction.timeout.ms".into(),
                message: format!(
                    "the Kafka sink into `{}` has transaction.timeout.ms = {} ms, but a transaction \
                     must survive checkpoint interval ({} ms) + checkpoint timeout ({} ms) + a restart \
                     ({} ms) = {} ms; raise transaction.timeout.ms (and the broker's \
                     transaction.max.timeout.ms if needed) or lower --checkpoint-interval",
                    self.topic,
                    self.transaction_timeout.as_millis(),
                    interval.as_millis(),
                    timeout.as_millis(),
                    RESTART_ALLOWANCE.as_millis(),
                    needed.as_millis()
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transaction_timeout_shorter_than_a_checkpoint_cycle_is_refused_naming_both_settings() {
        let config = KafkaSinkConfig::new("b:9092", "out").transaction_timeout(Duration::from_secs(60));
        let err = config
            .check_timeout(Some((Duration::from_secs(60), Duration::from_secs(600))))
            .unwrap_err()
            .to_string();
        assert!(err.contains("transaction.timeout.ms"), "{err}");
        assert!(err.contains("--checkpoint-interval"), "{err}");
        let fine = KafkaSinkConfig::new("b:9092", "out");
        fine.check_timeout(Some((Duration::from_secs(60), Duration::from_secs(600)))).unwrap();
        let at_least_once = config.delivery(DeliveryGuarantee::AtLeastOnce);
        at_least_once.check_timeout(Some((Duration::from_secs(60), Duration::from_secs(600)))).unwrap();
    }

    #[test]
    fn delivery_guarantees_parse_by_name() {
        assert_eq!("at-least-once".parse::<DeliveryGuarantee>().unwrap(), DeliveryGuarantee::AtLeastOnce);
        assert!("twice".parse::<DeliveryGuarantee>().unwrap_err().to_string().contains("exactly-once"));
    }
}

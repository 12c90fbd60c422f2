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

/// The configuration of a [`super::KafkaSink`]; in JSON (or any serde format) durations are
/// milliseconds (`transaction_timeout_ms`, `request_timeout_ms`), properties a map, and an
/// unknown field is an error. [`KafkaSinkConfig::build`] checks it and makes the sink.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkConfig {
    /// `host:port[,host:port…]`.
    pub brokers: String,
    /// The topic written.
    pub topic: String,
    /// Exactly-once (default), at-least-once or none.
    #[serde(default)]
    pub delivery: DeliveryGuarantee,
    /// Prefix of the transactional ids; `None`: `<job>-<operator uid>`. Two jobs writing
    /// at the same time must not share it: they would fence each other.
    #[serde(default)]
    pub transactional_id_prefix: Option<String>,
    /// The producer's `transaction.timeout.ms`: must exceed checkpoint interval +
    /// checkpoint timeout + a restart, and stay within the broker's
    /// `transaction.max.timeout.ms`.
    #[serde(rename = "transaction_timeout_ms", with = "crate::kafka::serde_forms::millis")]
    #[serde(default = "default_transaction_timeout")]
    pub transaction_timeout: Duration,
    /// Time allowed for one flush, commit or coordinator call.
    #[serde(rename = "request_timeout_ms", with = "crate::kafka::serde_forms::millis")]
    #[serde(default = "default_request_timeout")]
    pub request_timeout: Duration,
    /// Stamp Kafka records with the record's event time instead of the time they are
    /// produced. Off by default: a broker deletes records stamped older than the topic's
    /// `retention.ms` right away (replays of old data would vanish).
    #[serde(default)]
    pub event_time_timestamps: bool,
    /// Extra librdkafka producer properties (e.g. `compression.type`, `linger.ms`; checked
    /// at start: see `kafka::properties`).
    #[serde(default, with = "crate::kafka::serde_forms::pairs")]
    pub properties: Vec<(String, String)>,
}

fn default_transaction_timeout() -> Duration {
    Duration::from_secs(15 * 60)
}

fn default_request_timeout() -> Duration {
    Duration::from_secs(60)
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
            transaction_timeout: default_transaction_timeout(),
            request_timeout: default_request_timeout(),
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

    /// Checks what can be checked without a broker: a topic and brokers named, timeouts of
    /// at least a second, and the properties (`kafka::properties`).
    pub fn validate(&self) -> Result<()> {
        if self.brokers.trim().is_empty() {
            return Err(Error::config("kafka.brokers", "no broker given"));
        }
        if self.topic.trim().is_empty() {
            return Err(Error::config("kafka.topic", "no topic given"));
        }
        for (setting, d) in [
            ("kafka.transaction_timeout_ms", self.transaction_timeout),
            ("kafka.request_timeout_ms", self.request_timeout),
        ] {
            if d < Duration::from_secs(1) {
                return Err(Error::config(setting, format!("{} ms is below a second", d.as_millis())));
            }
        }
        crate::kafka::properties::check_producer_properties(&self.properties, self.delivery)?;
        if self.delivery == DeliveryGuarantee::ExactlyOnce {
            self.security()?;
        }
        Ok(())
    }

    /// How Caudal's own transaction client reaches the brokers: the TLS and SASL settings
    /// among the properties, as librdkafka reads them. Settings it cannot honour (another
    /// SASL mechanism, an encrypted key) fail here, when the job is built.
    pub(crate) fn security(&self) -> Result<crate::kafka::KafkaSecurity> {
        crate::kafka::KafkaSecurity::from_properties(&crate::kafka::connection_properties(&self.properties))
            .map_err(|e| {
                Error::config("kafka sink properties", format!("kafka sink into `{}`: {e}", self.topic))
            })
    }

    /// Validates and builds the sink for records of type `T`, encoded by `serializer`.
    pub fn build<T: caudal::Data>(
        &self,
        serializer: impl super::KafkaSerializer<T>,
    ) -> Result<super::KafkaSink<T>> {
        self.validate()?;
        Ok(super::KafkaSink::new(self.clone(), serializer))
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
    fn the_config_reads_from_json_refuses_unknown_fields_and_validates() {
        let json = r#"{"brokers":"b:9092","topic":"out","delivery":"at-least-once",
            "transaction_timeout_ms":600000,"properties":{"compression.type":"snappy"}}"#;
        let config: KafkaSinkConfig = serde_json::from_str(json).unwrap();
        assert_eq!(config.delivery, DeliveryGuarantee::AtLeastOnce);
        assert_eq!(config.transaction_timeout, Duration::from_secs(600));
        assert_eq!(config.request_timeout, Duration::from_secs(60), "the default");
        assert_eq!(config.properties, vec![("compression.type".to_string(), "snappy".to_string())]);
        let again: KafkaSinkConfig = serde_json::from_str(&serde_json::to_string(&config).unwrap()).unwrap();
        assert_eq!(again, config);
        let e =
            serde_json::from_str::<KafkaSinkConfig>(r#"{"brokers":"b","topic":"t","linger":5}"#).unwrap_err();
        assert!(e.to_string().contains("linger"), "{e}");
        config.validate().unwrap();
        let e = KafkaSinkConfig::new("b:9092", "").validate().unwrap_err();
        assert!(e.to_string().contains("kafka.topic"), "{e}");
        let e = KafkaSinkConfig::new("b:9092", "t")
            .property("enable.idempotence", "false")
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("refused"), "{e}");
    }

    #[test]
    fn delivery_guarantees_parse_by_name() {
        assert_eq!("at-least-once".parse::<DeliveryGuarantee>().unwrap(), DeliveryGuarantee::AtLeastOnce);
        assert!("twice".parse::<DeliveryGuarantee>().unwrap_err().to_string().contains("exactly-once"));
    }
}

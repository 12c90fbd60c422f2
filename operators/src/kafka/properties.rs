//! librdkafka properties a user passes through (`--producer-property K=V`,
//! `--consumer-property K=V`, `KafkaSinkConfig::properties`, `KafkaSourceConfig::properties`):
//! every librdkafka key goes through (librdkafka itself rejects unknown keys and bad values,
//! and the error names the key), except those Caudal owns because its guarantees rest on
//! them. Those are refused at start with the reason and what to use instead.

use super::DeliveryGuarantee;
use caudal::metrics::{kafka_client_settings, SubtaskMetrics};
use caudal::{Error, Result};
use rdkafka::ClientConfig;

/// A producer's settings shown with their effective value even when nobody set them:
/// librdkafka's defaults of what decides throughput, latency and durability.
const PRODUCER_DEFAULTS: [&str; 9] = [
    "acks",
    "batch.num.messages",
    "batch.size",
    "enable.idempotence",
    "max.in.flight.requests.per.connection",
    "message.max.bytes",
    "queue.buffering.max.kbytes",
    "queue.buffering.max.messages",
    "retries",
];

/// The same for a consumer.
const CONSUMER_DEFAULTS: [&str; 6] = [
    "fetch.max.bytes",
    "fetch.min.bytes",
    "fetch.wait.max.ms",
    "max.partition.fetch.bytes",
    "queued.max.messages.kbytes",
    "queued.min.messages",
];

/// Publishes the effective settings of a client built from `client` as info entries of
/// the subtask ([`kafka_client_settings`]): what Caudal and the user set (secrets masked,
/// the per-producer `transactional.id` left out), and librdkafka's defaults of
/// [`PRODUCER_DEFAULTS`] or [`CONSUMER_DEFAULTS`] (`kind`: `producer` or `consumer`).
pub(crate) fn publish_effective(client: &ClientConfig, kind: &str, metrics: &SubtaskMetrics) {
    let native = client.create_native_config().ok();
    let set = client.config_map();
    let defaults: &[&str] =
        if kind == kafka_client_settings::PRODUCER { &PRODUCER_DEFAULTS } else { &CONSUMER_DEFAULTS };
    for key in defaults {
        if !set.contains_key(key) {
            if let Some(value) = native.as_ref().and_then(|n| n.get(key).ok()) {
                metrics.set_info(kafka_client_settings::name(kind, key), value);
            }
        }
    }
    for (key, value) in set {
        if key == "transactional.id" {
            continue;
        }
        let shown = if caudal_schemas::client_properties::is_secret(key) { "******" } else { value };
        metrics.set_info(kafka_client_settings::name(kind, key), shown);
    }
}

/// Parses `K=V` (the CLI form).
pub fn parse_property(kv: &str) -> std::result::Result<(String, String), String> {
    match kv.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(format!("`{kv}` is not KEY=VALUE (e.g. compression.type=snappy)")),
    }
}

fn refused(side: &str, key: &str, value: &str, why: &str) -> Error {
    Error::config(format!("kafka {side} property {key}"), format!("{key}={value} is refused: {why}"))
}

/// Checks the producer properties of a sink with `delivery`.
pub fn check_producer_properties(properties: &[(String, String)], delivery: DeliveryGuarantee) -> Result<()> {
    let guaranteed = delivery != DeliveryGuarantee::None;
    for (key, value) in properties {
        let v = value.to_ascii_lowercase();
        let why = match key.as_str() {
            "transactional.id" => Some(
                "Caudal names the transactions of each sink subtask itself (set the prefix with \
                 --transactional-id-prefix / KafkaSinkConfig::transactional_id_prefix)",
            ),
            "transaction.timeout.ms" => {
                Some("set it with --transaction-timeout / KafkaSinkConfig::transaction_timeout (it is checked against the checkpoint cycle)")
            }
            "bootstrap.servers" | "metadata.broker.list" => Some("set the brokers with --brokers / the config's brokers"),
            "enable.idempotence" if guaranteed && v == "false" => Some(
                "exactly-once and at-least-once need the idempotent producer (a retried batch would be \
                 written twice); use delivery none to write without it",
            ),
            "acks" | "request.required.acks" if guaranteed && !matches!(v.as_str(), "all" | "-1") => Some(
                "exactly-once and at-least-once need acks=all (a record acknowledged by the leader alone is \
                 lost when the leader fails); use delivery none to write with fewer acks",
            ),
            _ => None,
        };
        if let Some(why) = why {
            return Err(refused("producer", key, value, why));
        }
    }
    Ok(())
}

/// Checks the consumer properties of a source (its offsets live in Caudal's checkpoints).
pub fn check_consumer_properties(properties: &[(String, String)]) -> Result<()> {
    for (key, value) in properties {
        let v = value.to_ascii_lowercase();
        let why = match key.as_str() {
            "isolation.level" if v != "read_committed" => Some(
                "the source reads committed records only: with read_uncommitted, records of transactions \
                 that were aborted (a producer that failed) would be processed",
            ),
            "enable.auto.commit" if v == "true" => Some(
                "the source's positions are its checkpoints' (committed to the group only for monitoring, \
                 after a checkpoint completes); an auto-commit would move the group ahead of them",
            ),
            "enable.partition.eof" => Some("a bounded source finds the end of each partition with it"),
            "group.id" => Some("set the group with --group-id / KafkaSourceConfig::group_id"),
            "bootstrap.servers" | "metadata.broker.list" => {
                Some("set the brokers with --brokers / the config's brokers")
            }
            _ => None,
        };
        if let Some(why) = why {
            return Err(refused("consumer", key, value, why));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_client_settings_shown_mask_every_secret() {
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("sasl.username", "alice")
            .set("sasl.password", "s3cret-pw")
            .set("ssl.key.password", "k3y-pw");
        let metrics = SubtaskMetrics::default();
        publish_effective(&client, kafka_client_settings::PRODUCER, &metrics);
        let shown = format!("{:?}", metrics.snapshot().info);
        assert!(shown.contains("alice") && shown.contains("******"), "{shown}");
        assert!(!shown.contains("s3cret-pw") && !shown.contains("k3y-pw"), "{shown}");
    }

    #[test]
    fn what_breaks_a_guarantee_is_refused_naming_the_key_and_the_rest_passes() {
        let fine = props(&[("compression.type", "snappy"), ("linger.ms", "10"), ("batch.size", "32768")]);
        check_producer_properties(&fine, DeliveryGuarantee::ExactlyOnce).unwrap();
        for (k, v) in [("enable.idempotence", "false"), ("acks", "1"), ("transactional.id", "x")] {
            let e = check_producer_properties(&props(&[(k, v)]), DeliveryGuarantee::ExactlyOnce)
                .unwrap_err()
                .to_string();
            assert!(e.contains(k) && e.contains("refused"), "{e}");
        }
        // Without a guarantee, fewer acks and no idempotence are the user's choice.
        check_producer_properties(
            &props(&[("acks", "1"), ("enable.idempotence", "false")]),
            DeliveryGuarantee::None,
        )
        .unwrap();
        check_consumer_properties(&props(&[
            ("fetch.min.bytes", "100000"),
            ("isolation.level", "read_committed"),
        ]))
        .unwrap();
        let e = check_consumer_properties(&props(&[("isolation.level", "read_uncommitted")])).unwrap_err();
        assert!(e.to_string().contains("aborted"), "{e}");
        assert!(check_consumer_properties(&props(&[("enable.auto.commit", "true")])).is_err());
    }

    #[test]
    fn cli_properties_are_key_equals_value() {
        assert_eq!(parse_property("linger.ms=10").unwrap(), ("linger.ms".into(), "10".into()));
        assert_eq!(parse_property("client.id=a=b").unwrap(), ("client.id".into(), "a=b".into()));
        assert!(parse_property("linger.ms").is_err());
        assert!(parse_property("=10").is_err());
    }
}

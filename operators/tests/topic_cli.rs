//! `caudal topic` (#14) against the real broker: create (by count, and by the sizing rule),
//! describe (partitions, leaders, in-sync replicas, non-default configs, end offsets, a
//! consumer group's lag), and clear errors.
//!
//! Needs the test stack (`scripts/services.sh start`); skipped without it unless
//! `CAUDAL_REQUIRE_STACK` is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use std::process::{Command, Output};
use std::time::Duration;

fn brokers() -> Option<String> {
    caudal_test_stack::service("CAUDAL_KAFKA_BROKERS")
}

fn topic_cli(brokers: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_caudal-topic")).args(args).args(["--brokers", brokers]).output().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn topics_are_created_sized_and_described_with_their_groups_lag() {
    let Some(brokers) = brokers() else { return };
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let name = format!("t-topic-cli-{}-{}", std::process::id(), nanos % 1_000_000_000);

    let o = topic_cli(&brokers, &["create", &name, "--partitions", "3", "--config", "retention.ms=3600000"]);
    assert!(o.status.success(), "{}", text(&o));
    // Ten records into partition 1, and a group that committed 4 of them.
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", &brokers).create().unwrap();
    for i in 0..10u8 {
        producer.send(BaseRecord::<[u8], [u8]>::to(&name).partition(1).payload(&[i][..])).unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    let group = format!("{name}-readers");
    let consumer: BaseConsumer =
        ClientConfig::new().set("bootstrap.servers", &brokers).set("group.id", &group).create().unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&name, 1, Offset::Offset(4)).unwrap();
    consumer.commit(&tpl, CommitMode::Sync).unwrap();

    let o = topic_cli(&brokers, &["describe", &name]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains(&format!("topic {name}: 3 partitions")), "{out}");
    assert!(out.contains("retention.ms=3600000"), "the non-default config is not shown: {out}");
    let p1 = out.lines().find(|l| l.trim_start().starts_with("1 ")).unwrap();
    assert!(p1.trim_end().ends_with("10"), "partition 1's end offset is not 10: {p1}");
    assert!(out.contains(&format!("{group}  lag 6  committed 1:4")), "the group's lag is not shown: {out}");

    let sized = format!("{name}-sized");
    let o = topic_cli(
        &brokers,
        &["create", &sized, "--target-rate", "50000", "--per-partition-rate", "10000", "--parallelism", "8"],
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("sizing:") && out.contains(": 8"), "the rule is not printed: {out}");
    assert!(text(&topic_cli(&brokers, &["describe", &sized])).contains("8 partitions"));

    let o = topic_cli(&brokers, &["create", &name, "--partitions", "3"]);
    assert_eq!(o.status.code(), Some(1), "creating it again: {}", text(&o));
    assert!(text(&o).contains("already exists"), "{}", text(&o));
    let o = topic_cli(&brokers, &["describe", &format!("{name}-none")]);
    assert!(text(&o).contains("does not exist"), "{}", text(&o));
    assert_eq!(topic_cli(&brokers, &["create", &name]).status.code(), Some(2));
}

/// A secured cluster (#44): `--kafka-config` (the stack's SASL_SSL client.properties) takes
/// `caudal topic` through the SASL_SSL listener; without it the same listener refuses it.
#[test]
fn topics_are_created_and_described_over_sasl_ssl_with_a_client_config_file() {
    let Some([secure, config]) =
        caudal_test_stack::services(["CAUDAL_KAFKA_SECURE_BROKERS", "CAUDAL_KAFKA_SECURE_CONFIG"])
    else {
        return;
    };
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let name = format!("t-topic-cli-secure-{}-{}", std::process::id(), nanos % 1_000_000_000);
    let o = topic_cli(&secure, &["create", &name, "--partitions", "2", "--kafka-config", &config]);
    assert!(o.status.success(), "{}", text(&o));
    let o = topic_cli(&secure, &["describe", &name, "--kafka-config", &config]);
    assert!(o.status.success() && text(&o).contains(&format!("topic {name}: 2 partitions")), "{}", text(&o));
    let o = Command::new(env!("CARGO_BIN_EXE_caudal-topic"))
        .args(["describe", &name, "--brokers", &secure])
        .env_remove("CAUDAL_KAFKA_CONFIG")
        .output()
        .unwrap();
    assert!(!o.status.success(), "the SASL_SSL listener answered a plaintext client: {}", text(&o));
}

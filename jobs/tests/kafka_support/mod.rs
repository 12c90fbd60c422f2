//! Shared by the Kafka tests: the stack's addresses, topics, and a `read_committed` reader.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod oracle;

use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Headers;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};
use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The broker and registry of the test stack.
#[derive(Debug, Clone)]
pub struct Stack {
    pub brokers: String,
    pub registry: String,
}

/// The stack, or `None` (test skipped) when it is not running and not required.
pub fn stack() -> Option<Stack> {
    let [brokers, registry] =
        caudal_test_stack::services(["CAUDAL_KAFKA_BROKERS", "CAUDAL_SCHEMA_REGISTRY"])?;
    Some(Stack { brokers, registry })
}

/// The stack broker's SASL_SSL listener (SCRAM-SHA-512, the stack's CA) and the
/// `client.properties` a client of it needs.
pub struct SecureKafka {
    pub brokers: String,
    pub config: std::path::PathBuf,
}

/// The secured listener, or `None` (test skipped) when the stack does not run it.
pub fn secure_kafka() -> Option<SecureKafka> {
    let [brokers, config] =
        caudal_test_stack::services(["CAUDAL_KAFKA_SECURE_BROKERS", "CAUDAL_KAFKA_SECURE_CONFIG"])?;
    Some(SecureKafka { brokers, config: config.into() })
}

/// The text of the client.properties `config` with each line that starts with `key`
/// replaced by `line` (a wrong setting for a test).
pub fn client_properties_with(config: &std::path::Path, key: &str, line: &str) -> String {
    let text = std::fs::read_to_string(config).unwrap();
    text.lines().map(|l| if l.starts_with(key) { line } else { l }).collect::<Vec<_>>().join("\n")
}

/// A topic name no other run used.
pub fn unique(what: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("t-{what}-{}-{}", std::process::id(), nanos % 1_000_000_000_000)
}

pub fn create_topic(stack: &Stack, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", &stack.brokers).create().unwrap();
    let results = futures::executor::block_on(admin.create_topics(
        &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
        &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
    ))
    .expect("create topics");
    for r in results {
        r.map_err(|(t, e)| format!("creating {t}: {e}")).unwrap();
    }
}

fn consumer(stack: &Stack, topic: &str) -> (BaseConsumer, usize) {
    consumer_at(stack, topic, "read_committed")
}

fn consumer_at(stack: &Stack, topic: &str, isolation: &str) -> (BaseConsumer, usize) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &stack.brokers)
        .set("group.id", format!("test-reader-{}", std::process::id()))
        .set("isolation.level", isolation)
        .set("enable.partition.eof", "true")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).unwrap();
    let partitions: Vec<i32> = metadata.topics()[0].partitions().iter().map(|p| p.id()).collect();
    let mut tpl = TopicPartitionList::new();
    for p in &partitions {
        tpl.add_partition_offset(topic, *p, Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    (consumer, partitions.len())
}

/// Every committed record of `topic` as (key, value), as a `read_committed` consumer sees
/// them, once no transaction is open on it ([`wait_until_stable`]).
pub fn read_committed(stack: &Stack, topic: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    read_committed_with_headers(stack, topic).into_iter().map(|(k, v, _)| (k, v)).collect()
}

/// A record as read: key, value and headers.
pub type ReadRecord = (Vec<u8>, Vec<u8>, Vec<(String, String)>);

/// Waits until no transaction is open on any partition of `topic`: its last stable offset
/// (as far as a `read_committed` reader gets) equals its high watermark. A transaction a run
/// left open would otherwise hide what follows it from a check, and let it appear later.
pub fn wait_until_stable(stack: &Stack, topic: &str) {
    let (committed, partitions) = consumer_at(stack, topic, "read_committed");
    let (uncommitted, _) = consumer_at(stack, topic, "read_uncommitted");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let open: Vec<(i32, i64, i64)> = (0..partitions as i32)
            .map(|p| {
                let lso = committed.fetch_watermarks(topic, p, Duration::from_secs(10)).unwrap().1;
                let hw = uncommitted.fetch_watermarks(topic, p, Duration::from_secs(10)).unwrap().1;
                (p, lso, hw)
            })
            .filter(|(_, lso, hw)| lso != hw)
            .collect();
        if open.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{topic}: transactions still open after 60 s (partition, last stable offset, high watermark): {open:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// As [`read_committed`], with each record's headers.
pub fn read_committed_with_headers(stack: &Stack, topic: &str) -> Vec<ReadRecord> {
    wait_until_stable(stack, topic);
    let (consumer, partitions) = consumer(stack, topic);
    let mut eof = HashSet::new();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while eof.len() < partitions {
        assert!(Instant::now() < deadline, "reading {topic}: no end after 60 s");
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                eof.insert(p);
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            Some(Ok(m)) => {
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| {
                                (
                                    h.key.to_owned(),
                                    String::from_utf8_lossy(h.value.unwrap_or_default()).to_string(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                out.push((
                    m.key().unwrap_or_default().to_vec(),
                    m.payload().unwrap_or_default().to_vec(),
                    headers,
                ));
            }
        }
    }
    out
}

/// Each partition's end offset (high watermark) of `topic`, by partition: 0 everywhere means
/// nothing was ever written, not even an aborted transaction or its marker.
pub fn end_offsets(stack: &Stack, topic: &str) -> Vec<i64> {
    let (consumer, partitions) = consumer_at(stack, topic, "read_uncommitted");
    (0..partitions as i32)
        .map(|p| consumer.fetch_watermarks(topic, p, Duration::from_secs(10)).unwrap().1)
        .collect()
}

/// The offsets `group` committed for each partition of `topic`, by partition (`None`: no
/// commit), as a lag tool reads them.
pub fn committed_offsets(stack: &Stack, group: &str, topic: &str) -> Vec<Option<i64>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &stack.brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let partitions = end_offsets(stack, topic).len() as i32;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let committed = consumer.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
    (0..partitions)
        .map(|p| match committed.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        })
        .collect()
}

/// Grows `topic` to `total` partitions.
pub fn add_partitions(stack: &Stack, topic: &str, total: usize) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", &stack.brokers).create().unwrap();
    let results = futures::executor::block_on(
        admin.create_partitions(&[NewPartitions::new(topic, total)], &AdminOptions::new()),
    )
    .unwrap();
    for r in results {
        r.map_err(|(t, e)| format!("adding partitions to {t}: {e}")).unwrap();
    }
}

/// Writes raw (key, value) records into partition `partition` of `topic`.
pub fn produce_raw(stack: &Stack, topic: &str, partition: i32, records: &[(Vec<u8>, Vec<u8>)]) {
    let producer: BaseProducer =
        ClientConfig::new().set("bootstrap.servers", &stack.brokers).create().unwrap();
    for (k, v) in records {
        producer.send(BaseRecord::to(topic).partition(partition).key(k).payload(v)).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

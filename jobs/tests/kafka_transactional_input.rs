//! A job behind another exactly-once job (#43): its input is written by a transactional
//! producer, as Caudal's own exactly-once sink, Flink or Kafka Streams write it, so every
//! partition ends in a transaction marker. A partition that goes quiet must go idle after the
//! idleness timeout like any other, or the watermark stops and with it every window, timer
//! and alert — silently. Before #43 the marker's offset counted as records still to read.
//!
//! The input: `temperature produce`'s readings copied by a transactional producer into two
//! partitions, partition 1 quiet after its first 200 readings. The windows the job publishes
//! are checked against the oracle (the input alone, no engine code): every window the
//! watermark of partition 0 must have closed is there, with the oracle's values, once.
//!
//! Needs the test stack (`scripts/services.sh start`); skipped without it unless
//! `CAUDAL_REQUIRE_STACK` is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kafka_support;

use kafka_support::oracle::{self, WindowKey};
use kafka_support::{create_topic, read_committed, stack, unique, Stack};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const WINDOW_MS: i64 = 5_000;
/// The job's bounded out-of-orderness.
const OUT_OF_ORDERNESS_MS: i64 = 1_000;

/// Copies `records` into `topic` with a transactional producer: the first `quiet` into
/// partition 1, the rest into partition 0, in transactions of 500.
fn copy_transactionally(stack: &Stack, topic: &str, records: &[(Vec<u8>, Vec<u8>)], quiet: usize) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &stack.brokers)
        .set("transactional.id", unique("upstream-job"))
        .create()
        .unwrap();
    producer.init_transactions(Duration::from_secs(30)).unwrap();
    let (first, rest) = records.split_at(quiet);
    for (partition, part) in [(1, first), (0, rest)] {
        for chunk in part.chunks(500) {
            producer.begin_transaction().unwrap();
            for (k, v) in chunk {
                producer.send(BaseRecord::to(topic).partition(partition).key(k).payload(v)).unwrap();
            }
            producer.flush(Duration::from_secs(30)).unwrap();
            producer.commit_transaction(Duration::from_secs(30)).unwrap();
        }
    }
}

fn event_time(record: &(Vec<u8>, Vec<u8>)) -> i64 {
    oracle::decode_all::<caudal_schemas::SensorReading>(std::iter::once(record.1[5..].to_vec()))[0].ts
}

#[test]
fn a_quiet_partition_written_in_transactions_goes_idle_and_windows_keep_firing() {
    let Some(stack) = stack() else { return };
    let (staging, input, output) = (unique("txn-staging"), unique("txn-in"), unique("txn-out"));
    let windows = format!("{output}-windows");
    create_topic(&stack, &staging, 1);
    create_topic(&stack, &input, 2);
    create_topic(&stack, &output, 2);
    create_topic(&stack, &windows, 2);
    let produced = Command::new(env!("CARGO_BIN_EXE_temperature"))
        .args(["produce", "--topic", &staging, "--sensors", "20", "--rate", "0", "--records", "4000"])
        .args(["--seed", "43", "--event-interval-ms", "500"])
        .args(["--brokers", &stack.brokers, "--schema-registry", &stack.registry])
        .output()
        .unwrap();
    assert!(produced.status.success(), "produce failed: {}", String::from_utf8_lossy(&produced.stderr));
    let records = read_committed(&stack, &staging);
    assert_eq!(records.len(), 4000);
    copy_transactionally(&stack, &input, &records, 200);

    // What must fire: every window that partition 0's watermark closed (with a margin of one
    // second for where exactly a watermark stands), the quiet partition idle by then.
    let max_ts = records.iter().map(event_time).max().unwrap();
    let (_, all) = oracle::expected(&stack, &input, WINDOW_MS);
    let must_fire: BTreeSet<WindowKey> =
        all.iter().filter(|w| w.2 <= max_ts - OUT_OF_ORDERNESS_MS - 1_000).cloned().collect();
    let quiet_max = records[..200].iter().map(event_time).max().unwrap();
    let held_back = all.iter().filter(|w| w.2 <= quiet_max).count();
    assert!(
        must_fire.len() > 4 * held_back.max(1),
        "the input does not tell idle from held back: {} windows must fire, {held_back} would held back",
        must_fire.len()
    );

    let ckpt = tempfile::tempdir().unwrap();
    let mut job = Command::new(env!("CARGO_BIN_EXE_temperature"))
        .args(["--source", "kafka", "--input-topic", &input, "--sink", "kafka", "--parallelism", "2"])
        .args(["--output-topic", &output, "--windows-topic", &windows, "--window-secs", "5"])
        .args(["--idleness-secs", "2", "--partition-discovery-secs", "0"])
        .args(["--brokers", &stack.brokers, "--schema-registry", &stack.registry])
        .args(["--checkpoint-interval", "0.5", "--progress-secs", "0", "--no-ui"])
        .arg("--checkpoint-dir")
        .arg(ckpt.path())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    let published = loop {
        let published = oracle::windows_of(
            &read_committed(&stack, &windows)
                .into_iter()
                .map(|(k, v)| (k, v.get(5..).unwrap_or_default().to_vec()))
                .collect::<Vec<_>>(),
        );
        let fired = published.iter().filter(|w| must_fire.contains(w)).count();
        if fired == must_fire.len() {
            break published;
        }
        if Instant::now() > deadline {
            let _ = job.kill();
            panic!(
                "{fired} of {} windows fired in 90 s ({} would have with the quiet partition holding \
                 the watermark back): the watermark stopped",
                must_fire.len(),
                held_back
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let _ = job.kill();
    let _ = job.wait();
    let distinct: BTreeSet<(i64, i64)> = published.iter().map(|w| (w.0, w.1)).collect();
    assert_eq!(distinct.len(), published.len(), "a window was published twice");
    let all: BTreeSet<WindowKey> = all.into_iter().collect();
    let wrong: Vec<&WindowKey> = published.iter().filter(|w| !all.contains(w)).collect();
    assert!(wrong.is_empty(), "windows that differ from what the input implies: {wrong:?}");
}

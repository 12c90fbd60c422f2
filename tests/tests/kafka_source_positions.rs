//! The Kafka source's checkpointed positions against the real broker: a partition from
//! which nothing was read before a checkpoint is still in it (at the offset where the
//! source started), so a restore neither applies the start policy again (`Latest` would
//! skip everything produced since the first start) nor rereads from the group's offsets;
//! and a restored bounded source reads up to the end offsets of its first start, not to
//! those of a topic that grew meanwhile. A partition added after the last checkpoint is
//! read from its beginning by the restored job, as the running one reads it; a bounded
//! source's end includes the records of a transaction open at its start.
//!
//! Needs the test stack (`scripts/services.sh start`); skipped without it unless
//! `CAUDAL_REQUIRE_STACK` is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../jobs/tests/kafka_support/mod.rs"]
mod kafka_support;

use caudal::{
    Batch, CheckpointConfig, JobConfig, OperatorContext, RestoreFrom, StreamEnv, WatermarkStrategy,
};
use caudal_operators::kafka::{KafkaSource, KafkaSourceConfig, StartFrom};
use kafka_support::{add_partitions, create_topic, produce_raw, stack, unique};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    n: u64,
}

/// Collects what reaches it, in this process.
#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Vec<u64>>>);

impl caudal::Sink for Collect {
    type In = Record;
    fn write_batch(&mut self, batch: Batch<Record>, _: &mut OperatorContext) -> caudal::Result<()> {
        self.0.lock().unwrap().extend(batch.iter().map(|r| r.value.n));
        Ok(())
    }
}

fn records(range: std::ops::Range<u64>) -> Vec<(Vec<u8>, Vec<u8>)> {
    range.map(|i| (i.to_string().into_bytes(), format!("{{\"n\":{i}}}").into_bytes())).collect()
}

fn config(dir: &Path, restore: bool) -> JobConfig {
    JobConfig {
        parallelism: 1,
        handle_signals: false,
        state_dir: Some(dir.join("state")),
        checkpoints: CheckpointConfig {
            interval: Some(Duration::from_millis(200)),
            storage: caudal_checkpoints::CheckpointStorageConfig {
                url: dir.join("checkpoints").display().to_string(),
                ..Default::default()
            },
            restore: restore.then_some(RestoreFrom::Latest),
            ..CheckpointConfig::default()
        },
        ..JobConfig::default()
    }
}

fn has_checkpoint(dir: &Path, job: &str) -> bool {
    std::fs::read_dir(dir.join("checkpoints").join(job))
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| e.path().join("_metadata").exists())
}

/// The job: the Kafka source into a sink that collects what reaches it.
fn job_env(dir: &Path, source: KafkaSourceConfig, restore: bool, sink: Collect) -> StreamEnv {
    let env = StreamEnv::with_config(config(dir, restore));
    env.source("numbers", KafkaSource::<Record>::json(source), WatermarkStrategy::none())
        .uid("numbers")
        .sink("collect", move |_| Ok(sink.clone()))
        .uid("collect");
    env
}

/// What `got` collected, sorted.
fn collected(got: &Collect) -> Vec<u64> {
    let mut v = got.0.lock().unwrap().clone();
    v.sort_unstable();
    v
}

/// Runs the job until a checkpoint completed, then stops it (final checkpoint).
fn run_until_checkpointed(dir: &Path, job: &str, source: KafkaSourceConfig, restore: bool) -> Vec<u64> {
    let got = Collect::default();
    let (name, dir_owned, sink) = (job.to_string(), dir.to_path_buf(), got.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    let runner = std::thread::spawn(move || {
        let env = job_env(&dir_owned, source, restore, sink);
        let _ = tx.send(env.stop_handle());
        env.execute(&name).map(|_| ())
    });
    let stop = rx.recv_timeout(Duration::from_secs(30)).expect("the job was built");
    let started = Instant::now();
    while !has_checkpoint(dir, job) {
        assert!(started.elapsed() < Duration::from_secs(60), "no checkpoint completed");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    stop.stop();
    runner.join().unwrap().expect("the job stops cleanly");
    collected(&got)
}

/// Runs a bounded job to its end.
fn run_bounded(dir: &Path, job: &str, source: KafkaSourceConfig, restore: bool) -> Vec<u64> {
    let got = Collect::default();
    job_env(dir, source, restore, got.clone()).execute(job).expect("the bounded job finishes");
    collected(&got)
}

#[test]
fn a_partition_not_read_before_a_checkpoint_restores_where_it_started() {
    let Some(stack) = stack() else { return };
    let topic = unique("positions");
    create_topic(&stack, &topic, 2);
    // Before the first start: skipped by `Latest`.
    produce_raw(&stack, &topic, 0, &records(0..10));
    let dir = tempfile::tempdir().unwrap();
    let job = "positions-latest";
    let mut source = KafkaSourceConfig::new(&stack.brokers, &topic);
    source.start_from = StartFrom::Latest;
    let first = run_until_checkpointed(dir.path(), job, source.clone(), false);
    assert!(first.is_empty(), "Latest skips what was there before the start: {first:?}");
    // Produced while the job is down: a restore must read all of it, from both partitions.
    produce_raw(&stack, &topic, 0, &records(100..130));
    produce_raw(&stack, &topic, 1, &records(200..250));
    let restored = run_bounded(dir.path(), job, source.bounded(true), true);
    let want: Vec<u64> = (100..130).chain(200..250).collect();
    assert_eq!(restored, want, "the restore reads every record produced since the first start, once");
}

#[test]
fn a_restored_bounded_source_ends_where_the_first_start_ended() {
    let Some(stack) = stack() else { return };
    let topic = unique("bounded-ends");
    create_topic(&stack, &topic, 2);
    produce_raw(&stack, &topic, 0, &records(0..40));
    produce_raw(&stack, &topic, 1, &records(1000..1040));
    let dir = tempfile::tempdir().unwrap();
    let job = "positions-bounded";
    let source = KafkaSourceConfig::new(&stack.brokers, &topic).bounded(true);
    let first = run_bounded(dir.path(), job, source.clone(), false);
    assert_eq!(first.len(), 80);
    // The topic grows; restoring the bounded run's last checkpoint reads nothing new.
    produce_raw(&stack, &topic, 0, &records(40..60));
    produce_raw(&stack, &topic, 1, &records(1040..1060));
    let restored = run_bounded(dir.path(), job, source, true);
    assert!(restored.is_empty(), "the restored bounded run read past the first start's end: {restored:?}");
}

/// A partition the checkpoint does not know was added after it: the restored job reads it
/// from its beginning, as the running job reads a partition it discovers. Before #43 the
/// start policy applied to it, and `Latest` skipped what it held.
#[test]
fn a_partition_added_after_the_last_checkpoint_is_read_from_its_beginning_on_restore() {
    let Some(stack) = stack() else { return };
    let topic = unique("added-after");
    create_topic(&stack, &topic, 1);
    produce_raw(&stack, &topic, 0, &records(0..10));
    let dir = tempfile::tempdir().unwrap();
    let job = "positions-added";
    let mut source = KafkaSourceConfig::new(&stack.brokers, &topic);
    source.start_from = StartFrom::Latest;
    let first = run_until_checkpointed(dir.path(), job, source.clone(), false);
    assert!(first.is_empty(), "Latest skips what was there before the start: {first:?}");
    // While the job is down the topic gets a partition, and both get records.
    add_partitions(&stack, &topic, 2);
    produce_raw(&stack, &topic, 1, &records(300..320));
    produce_raw(&stack, &topic, 0, &records(100..110));
    let restored = run_bounded(dir.path(), job, source.bounded(true), true);
    let want: Vec<u64> = (100..110).chain(300..320).collect();
    assert_eq!(restored, want, "the added partition is read from its beginning, once");
}

/// A bounded source started while a transaction is open on its input (another exactly-once
/// job writing it) reads to the end offset of its start: the transaction's records once it
/// commits, and the records committed after the transaction began. Before #43 it ended at
/// the last stable offset (where the open transaction began) and missed both.
#[test]
fn a_bounded_source_reads_what_a_transaction_open_at_its_start_commits() {
    let Some(stack) = stack() else { return };
    let topic = unique("bounded-open-txn");
    create_topic(&stack, &topic, 1);
    produce_raw(&stack, &topic, 0, &records(0..100));
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &stack.brokers)
        .set("transactional.id", unique("upstream"))
        .create()
        .unwrap();
    producer.init_transactions(Duration::from_secs(30)).unwrap();
    producer.begin_transaction().unwrap();
    for (k, v) in records(100..150) {
        producer.send(BaseRecord::to(&topic).partition(0).key(&k).payload(&v)).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    // Committed after the open transaction began: past the last stable offset too.
    produce_raw(&stack, &topic, 0, &records(150..180));

    let dir = tempfile::tempdir().unwrap();
    let got = Collect::default();
    let (dir_owned, sink) = (dir.path().to_path_buf(), got.clone());
    let source = KafkaSourceConfig::new(&stack.brokers, &topic).bounded(true);
    let runner = std::thread::spawn(move || {
        job_env(&dir_owned, source, false, sink).execute("positions-open-txn").map(|_| ())
    });
    // The job read what it could see; the transaction commits only then.
    let started = Instant::now();
    while got.0.lock().unwrap().len() < 100 && !runner.is_finished() {
        assert!(started.elapsed() < Duration::from_secs(60), "the job read nothing in 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    producer.commit_transaction(Duration::from_secs(30)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !runner.is_finished() {
        assert!(Instant::now() < deadline, "the bounded job did not finish after the commit");
        std::thread::sleep(Duration::from_millis(50));
    }
    runner.join().unwrap().expect("the bounded job finishes");
    let want: Vec<u64> = (0..180).collect();
    assert_eq!(collected(&got), want, "every record below the end offset at start, once");
}

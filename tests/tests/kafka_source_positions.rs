//! The Kafka source's checkpointed positions against the real broker: a partition from
//! which nothing was read before a checkpoint is still in it (at the offset where the
//! source started), so a restore neither applies the start policy again (`Latest` would
//! skip everything produced since the first start) nor rereads from the group's offsets;
//! and a restored bounded source reads up to the end offsets of its first start, not to
//! those of a topic that grew meanwhile.
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
use kafka_support::{create_topic, produce_raw, stack, unique};
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

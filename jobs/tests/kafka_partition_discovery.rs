//! Partitions added to the input topic while the job runs (#14): the unbounded Kafka source
//! finds them (`--partition-discovery-secs`), reads them from their beginning, and the
//! output is what the whole input implies — nothing of the new partitions missing, nothing
//! of the old ones read twice. Parallelism 2 over a topic of one partition: subtask 1 reads
//! nothing until the partitions are added (and must not hold the watermark back meanwhile).
//!
//! Needs the test stack (`scripts/services.sh start`); skipped without it unless
//! `CAUDAL_REQUIRE_STACK` is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kafka_support;

use kafka_support::{add_partitions, create_topic, oracle, read_committed, stack, unique, Stack};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn produce(stack: &Stack, topic: &str, seed: u64) {
    let out = Command::new(env!("CARGO_BIN_EXE_temperature"))
        .args(["produce", "--topic", topic, "--sensors", "30", "--rate", "0"])
        .args(["--records", "3000", "--seed", &seed.to_string(), "--event-interval-ms", "100"])
        .args(["--brokers", &stack.brokers, "--schema-registry", &stack.registry])
        .output()
        .unwrap();
    assert!(out.status.success(), "produce failed: {}", String::from_utf8_lossy(&out.stderr));
}

fn strip(records: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<(Vec<u8>, Vec<u8>)> {
    records.into_iter().map(|(k, v)| (k, v.get(5..).unwrap_or_default().to_vec())).collect()
}

#[test]
fn partitions_added_while_the_job_runs_are_read_from_their_beginning_exactly_once() {
    let Some(stack) = stack() else { return };
    let (input, output) = (unique("discover-in"), unique("discover-out"));
    create_topic(&stack, &input, 1);
    create_topic(&stack, &output, 2);
    create_topic(&stack, &format!("{output}-windows"), 2);
    produce(&stack, &input, 1);
    let ckpt = tempfile::tempdir().unwrap();
    let job = Command::new(env!("CARGO_BIN_EXE_temperature"))
        .args(["--source", "kafka", "--input-topic", &input, "--sink", "kafka", "--parallelism", "2"])
        .args(["--output-topic", &output, "--windows-topic", &format!("{output}-windows")])
        .args(["--delivery", "at-least-once", "--partition-discovery-secs", "1"])
        .args(["--brokers", &stack.brokers, "--schema-registry", &stack.registry])
        .args(["--checkpoint-interval", "0.5", "--progress-secs", "0", "--no-ui"])
        .arg("--checkpoint-dir")
        .arg(ckpt.path())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let wait_for = |want: usize, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let got = read_committed(&stack, &output).len();
            if got >= want {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: {got} of {want} readings after 60 s");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let (first, _) = oracle::expected(&stack, &input, 10_000);
    wait_for(first.len(), "before the partitions were added");

    add_partitions(&stack, &input, 3);
    produce(&stack, &input, 2); // keyed by sensor: spread over the three partitions
    let (all, _) = oracle::expected(&stack, &input, 10_000);
    assert!(all.len() > first.len() + 1000, "the second batch did not land");
    wait_for(all.len(), "after the partitions were added");

    // A clean stop (final checkpoint), then the output against the whole input.
    let pid = job.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let out = job.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the job did not stop cleanly: {err}");
    assert!(err.contains("were added to the topic"), "no discovery was logged: {err}");
    let got = oracle::readings_of(&strip(read_committed(&stack, &output)));
    assert_eq!(got.len(), all.len(), "readings (duplicates or losses)");
    assert!(got == all, "the readings differ from what the whole input implies");
}

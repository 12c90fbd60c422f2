//! librdkafka properties passed through on the job CLI (#14): `--producer-property` and
//! `--consumer-property` reach the real clients (the producer's compression is seen in the
//! broker's own log segment), the output stays what the input implies, and a property that
//! would break a guarantee, or that librdkafka does not know, stops the job at start naming
//! it.
//!
//! Needs the test stack (`scripts/services.sh start`); skipped without it unless
//! `CAUDAL_REQUIRE_STACK` is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kafka_support;

use kafka_support::{create_topic, oracle, read_committed, stack, unique, Stack};
use std::process::{Command, Output};

fn produce(stack: &Stack, topic: &str, extra: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_temperature"))
        .args(["produce", "--topic", topic, "--sensors", "20", "--rate", "0"])
        .args(["--records", "4000", "--seed", "9", "--event-interval-ms", "100"])
        .args(["--brokers", &stack.brokers, "--schema-registry", &stack.registry])
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "produce failed: {}", String::from_utf8_lossy(&out.stderr));
}

fn job(stack: &Stack, input: &str, output: &str, extra: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    Command::new(env!("CARGO_BIN_EXE_temperature"))
        .args(["--source", "kafka", "--input-topic", input, "--bounded", "--sink", "kafka"])
        .args(["--output-topic", output, "--windows-topic", &format!("{output}-windows")])
        .args(["--transactional-id-prefix", output, "--window-secs", "10"])
        .args(["--brokers", &stack.brokers, "--schema-registry", &stack.registry])
        .args(["--checkpoint-interval", "0.5", "--progress-secs", "0", "--no-ui"])
        .arg("--checkpoint-dir")
        .arg(dir.path())
        .args(extra)
        .output()
        .unwrap()
}

/// The compression codec of the first data batch in partition 0 of `topic`, read from the
/// broker's log segment in the test stack (record batch v2: attributes at byte 21).
fn codec_on_disk(topic: &str) -> &'static str {
    let stack_dir = std::env::var("CAUDAL_STACK_DIR").expect("CAUDAL_STACK_DIR (scripts/services.sh env)");
    let segment =
        std::path::Path::new(&stack_dir).join(format!("kafka/data/{topic}-0/00000000000000000000.log"));
    let log = std::fs::read(&segment).unwrap_or_else(|e| panic!("{}: {e}", segment.display()));
    let mut at = 0;
    while at + 23 <= log.len() {
        let length = i32::from_be_bytes(log[at + 8..at + 12].try_into().unwrap()) as usize;
        let attributes = i16::from_be_bytes(log[at + 21..at + 23].try_into().unwrap());
        if attributes & 0x20 == 0 {
            return match attributes & 0x07 {
                0 => "none",
                1 => "gzip",
                2 => "snappy",
                3 => "lz4",
                4 => "zstd",
                _ => "unknown",
            };
        }
        at += 12 + length; // a transaction marker: the next batch
    }
    panic!("no data batch in {}", segment.display())
}

#[test]
fn producer_and_consumer_properties_reach_the_clients_and_the_output_stays_exact() {
    let Some(stack) = stack() else { return };
    let input = unique("props-in");
    create_topic(&stack, &input, 2);
    produce(&stack, &input, &["--producer-property", "compression.type=gzip"]);
    assert_eq!(codec_on_disk(&input), "gzip", "`produce --producer-property` did not reach the producer");

    let output = unique("props-out");
    create_topic(&stack, &output, 2);
    create_topic(&stack, &format!("{output}-windows"), 2);
    let o = job(
        &stack,
        &input,
        &output,
        &[
            "--producer-property",
            "compression.type=snappy",
            "--producer-property",
            "linger.ms=20",
            "--consumer-property",
            "fetch.min.bytes=1000",
            "--consumer-property",
            "client.id=caudal-props-test",
        ],
    );
    assert!(o.status.success(), "job failed: {}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(codec_on_disk(&output), "snappy", "--producer-property did not reach the sink's producer");
    let (want, _) = oracle::expected(&stack, &input, 10_000);
    let strip = |records: Vec<(Vec<u8>, Vec<u8>)>| -> Vec<(Vec<u8>, Vec<u8>)> {
        records.into_iter().map(|(k, v)| (k, v.get(5..).unwrap_or_default().to_vec())).collect()
    };
    let got = oracle::readings_of(&strip(read_committed(&stack, &output)));
    assert_eq!(got.len(), want.len(), "readings");
    assert!(got == want, "the readings differ from what the input implies");
}

#[test]
fn properties_that_break_a_guarantee_or_that_librdkafka_does_not_know_stop_the_job_naming_them() {
    let Some(stack) = stack() else { return };
    let input = unique("props-bad-in");
    create_topic(&stack, &input, 1);
    produce(&stack, &input, &[]);
    for (flag, property, says) in [
        ("--producer-property", "enable.idempotence=false", "written twice"),
        ("--producer-property", "acks=1", "acks=all"),
        ("--producer-property", "transactional.id=mine", "--transactional-id-prefix"),
        ("--consumer-property", "isolation.level=read_uncommitted", "aborted"),
        ("--consumer-property", "enable.auto.commit=true", "checkpoints"),
        ("--producer-property", "no.such.property=1", "no.such.property"),
        ("--consumer-property", "no.such.property=1", "no.such.property"),
    ] {
        let output = unique("props-bad-out");
        let o = job(&stack, &input, &output, &[flag, property]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{flag} {property} was accepted: {err}");
        assert!(err.contains(says), "{flag} {property}: the error does not say `{says}`: {err}");
    }
    // Not KEY=VALUE: the command line is refused before anything runs.
    let o = job(&stack, &input, &unique("props-bad-out"), &["--producer-property", "linger.ms"]);
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
}

//! Dead letters exactly once (#43): the temperature job reads a topic in which undecodable
//! records sit between the readings, writes its readings into Kafka through transactions
//! and its dead letters into a dead-letter topic in the same checkpoint epochs. It is killed
//! at a crash point of checkpoint 3, then once it has dead-lettered records past its last
//! checkpoint, and restored each time;
//! afterwards a `read_committed` consumer sees each bad record in the dead-letter topic
//! exactly once, as it was written, with where it came from in its headers, and the
//! readings exactly as the oracle computes them from the same readings without the bad
//! records (written to a topic of their own).
//!
//! Before #43 dead letters went through a producer of their own, flushed at each barrier:
//! a restore read the records after its checkpoint again and dead-lettered them twice.
//!
//! Needs the test stack (`scripts/services.sh start`); skipped without it unless
//! `CAUDAL_REQUIRE_STACK` is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kafka_support;

use kafka_support::{
    create_topic, oracle, produce_raw, read_committed, read_committed_with_headers, stack, unique, Stack,
};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const PARTITIONS: i32 = 2;
/// Rounds of readings, each followed by bad records on every partition.
const ROUNDS: u64 = 4;
const READINGS_PER_ROUND: u64 = 5_000;
const BAD_PER_PARTITION_AND_ROUND: usize = 5;

fn produce_readings(stack: &Stack, topic: &str, records: u64, seed: u64) {
    let out = Command::new(env!("CARGO_BIN_EXE_temperature"))
        .args(["produce", "--topic", topic, "--sensors", "20", "--rate", "0"])
        .args(["--records", &records.to_string(), "--seed", &seed.to_string()])
        .args(["--brokers", &stack.brokers, "--schema-registry", &stack.registry])
        .output()
        .unwrap();
    assert!(out.status.success(), "produce failed: {}", String::from_utf8_lossy(&out.stderr));
}

struct Topics {
    input: String,
    /// The same readings without the bad records: the oracle's input.
    clean: String,
    readings: String,
    windows: String,
    dead_letters: String,
    /// Every bad record written, by value: (partition, key).
    bad: BTreeMap<Vec<u8>, (i32, Vec<u8>)>,
}

fn topics(stack: &Stack) -> Topics {
    let mut t = Topics {
        input: unique("dl-in"),
        clean: unique("dl-clean"),
        readings: unique("dl-readings"),
        windows: unique("dl-windows"),
        dead_letters: unique("dl-dead"),
        bad: BTreeMap::new(),
    };
    for topic in [&t.input, &t.clean, &t.readings, &t.windows, &t.dead_letters] {
        create_topic(stack, topic, PARTITIONS);
    }
    for round in 0..ROUNDS {
        produce_readings(stack, &t.input, READINGS_PER_ROUND, 10 + round);
        produce_readings(stack, &t.clean, READINGS_PER_ROUND, 10 + round);
        for p in 0..PARTITIONS {
            let bad: Vec<(Vec<u8>, Vec<u8>)> = (0..BAD_PER_PARTITION_AND_ROUND)
                .map(|j| {
                    let key = format!("k{round}{p}{j}").into_bytes();
                    (key, format!("garbage {round}/{p}/{j}, not Avro").into_bytes())
                })
                .collect();
            produce_raw(stack, &t.input, p, &bad);
            t.bad.extend(bad.into_iter().map(|(k, v)| (v, (p, k))));
        }
    }
    t
}

fn spawn(
    stack: &Stack,
    t: &Topics,
    ckpt: &Path,
    restore: bool,
    crash_at: Option<&str>,
    interval: &str,
) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_temperature"));
    cmd.args(["--source", "kafka", "--input-topic", &t.input, "--bounded"])
        .args(["--sink", "kafka", "--output-topic", &t.readings, "--windows-topic", &t.windows])
        .args(["--dead-letter-topic", &t.dead_letters, "--transactional-id-prefix", &t.readings])
        .args(["--brokers", &stack.brokers, "--schema-registry", &stack.registry])
        .args(["--parallelism", "2", "--checkpoint-interval", interval, "--max-records-per-second", "4000"])
        .args(["--progress-secs", "1", "--no-ui"])
        .arg("--checkpoint-dir")
        .arg(ckpt)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if restore {
        cmd.args(["--restore", "latest"]);
    }
    if let Some(point) = crash_at {
        cmd.env("CAUDAL__TEST_CRASH_AT", point);
    }
    cmd.spawn().expect("start temperature")
}

fn stderr_of(child: Child) -> (std::process::ExitStatus, String) {
    let out = child.wait_with_output().unwrap();
    (out.status, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn dead_letters_land_once_across_kills_and_restores() {
    let Some(stack) = stack() else { return };
    let t = topics(&stack);
    let ckpt = tempfile::tempdir().unwrap();

    // Killed where checkpoint 3 is complete and its transactions (readings and dead
    // letters alike) are not yet committed.
    let point = "after-metadata-before-notify";
    let (status, err) = stderr_of(spawn(&stack, &t, ckpt.path(), false, Some(&format!("{point}:3")), "0.1"));
    assert_eq!(status.signal(), Some(9), "not killed at {point}: {status} {err}");
    assert!(err.contains(&format!("crash point {point}")), "{err}");

    // Then restored with checkpoints 30 s apart and killed once it has read bad records
    // past its checkpoint: whatever it dead-lettered is in a transaction no checkpoint
    // completed, and the restore reads those records again.
    let mut child = spawn(&stack, &t, ckpt.path(), true, None, "30");
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    // Drained to the end: a closed pipe would end the job before the kill.
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut log = String::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(60)) {
        log.push_str(&line);
        log.push('\n');
        if line.contains("bad record at partition") {
            break;
        }
    }
    assert!(log.contains("bad record at partition"), "the restored run read no bad record: {log}");
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.try_wait().unwrap().is_none(), "the restored run ended before its kill: {log}");
    child.kill().unwrap();
    assert_eq!(child.wait().unwrap().signal(), Some(9), "the kill did not land");

    let (status, err) = stderr_of(spawn(&stack, &t, ckpt.path(), true, None, "0.1"));
    assert!(status.success(), "the last restore failed: {err}");
    assert!(err.contains("restoring job"), "the last run did not restore a checkpoint: {err}");

    // Each bad record once, as written, with where it was read.
    let dead = read_committed_with_headers(&stack, &t.dead_letters);
    let mut seen: BTreeMap<Vec<u8>, usize> = BTreeMap::new();
    for (_, value, _) in &dead {
        *seen.entry(value.clone()).or_default() += 1;
    }
    let twice: Vec<_> =
        seen.iter().filter(|(_, n)| **n > 1).map(|(v, n)| (String::from_utf8_lossy(v), n)).collect();
    assert!(twice.is_empty(), "dead-lettered more than once: {twice:?}");
    assert_eq!(seen.len(), t.bad.len(), "every bad record dead-lettered ({} of {})", seen.len(), t.bad.len());
    let mut offsets = std::collections::BTreeSet::new();
    for (key, value, headers) in &dead {
        let header = |k: &str| headers.iter().find(|(h, _)| h == k).map(|(_, v)| v.as_str());
        let Some((partition, want_key)) = t.bad.get(value) else {
            panic!("a dead letter that is no bad record: {:?}", String::from_utf8_lossy(value))
        };
        assert_eq!(key, want_key, "the key as written");
        assert_eq!(header("caudal.source.topic"), Some(t.input.as_str()));
        assert_eq!(header("caudal.source.partition"), Some(partition.to_string().as_str()));
        assert_eq!(header("caudal.operator"), Some("kafka-readings"));
        assert!(header("caudal.error").is_some_and(|e| !e.is_empty()), "{headers:?}");
        offsets.insert((*partition, header("caudal.source.offset").unwrap().to_owned()));
    }
    assert_eq!(offsets.len(), t.bad.len(), "each dead letter names its own offset");

    // The readings: exactly those of the clean twin, none twice.
    let (want, _) = oracle::expected(&stack, &t.clean, 60_000);
    let published: Vec<(Vec<u8>, Vec<u8>)> = read_committed(&stack, &t.readings)
        .into_iter()
        .map(|(k, v)| (k, v.get(5..).unwrap_or_default().to_vec()))
        .collect();
    assert_eq!(oracle::readings_of(&published), want, "the readings differ from the oracle's");
}

//! What the Kafka source does with what producers really send: garbage and unknown schema
//! ids are counted and dead-lettered while the job keeps running; a producer moving to a
//! new, BACKWARD-compatible schema version (an added field with a default) while the job
//! runs keeps being read by that same running job. A registry unreachable at a restore
//! fails the run naming it, and loses, skips and dead-letters nothing.
//!
//! Needs the test stack (`scripts/services.sh start`); skipped without it unless
//! `CAUDAL_REQUIRE_STACK` is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kafka_support;

use caudal_schemas::wire::write_header;
use caudal_schemas::{
    codec::encode_generic, subject_for_topic, AvroRecord, RegistryClient, Schema, SchemaStore, SensorReading,
};
use kafka_support::{create_topic, produce_raw, read_committed_with_headers, stack, unique, Stack};
use serde::Serialize;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn produce_readings(stack: &Stack, topic: &str, records: u64, seed: u64) {
    produce_readings_with(stack, topic, records, seed, &[]);
}

fn produce_readings_with(stack: &Stack, topic: &str, records: u64, seed: u64, extra: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_temperature"))
        .args(["produce", "--topic", topic, "--sensors", "10", "--rate", "0"])
        .args(["--records", &records.to_string(), "--seed", &seed.to_string()])
        .args(["--brokers", &stack.brokers, "--schema-registry", &stack.registry])
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "produce failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// The job reading `topic` (schemas from `registry`) into files under `out/results`,
/// checkpointing every 200 ms into `out/ckpt`; callers add their flags and stdio.
fn job_command(stack: &Stack, registry: &str, topic: &str, out: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_temperature"));
    cmd.args(["--source", "kafka", "--input-topic", topic])
        .args(["--brokers", &stack.brokers, "--schema-registry", registry])
        .args(["--checkpoint-interval", "0.2", "--progress-secs", "0", "--no-ui"])
        .arg("--output")
        .arg(out.join("results"))
        .arg("--checkpoint-dir")
        .arg(out.join("ckpt"));
    cmd
}

/// Runs the job over `topic` (bounded) into files under `out`; returns its stderr after
/// checking it succeeded.
fn run_job(stack: &Stack, topic: &str, out: &Path, extra: &[&str]) -> String {
    let (ok, err) = try_job(stack, topic, out, extra);
    assert!(ok, "job failed: {err}");
    err
}

/// Lines of every published file under `dir` (none while it does not exist).
fn lines(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().extension().is_some_and(|x| x == "jsonl") {
            out.extend(std::fs::read_to_string(e.path()).unwrap().lines().map(str::to_owned));
        }
    }
    out
}

/// (sensor, ts) of every published reading under `dir`, sorted (twice if published twice).
fn reading_keys(dir: &Path) -> Vec<(i64, i64)> {
    let mut keys: Vec<(i64, i64)> = lines(dir)
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["sensor_id"].as_i64().unwrap(), v["ts"].as_i64().unwrap())
        })
        .collect();
    keys.sort_unstable();
    keys
}

/// "read N" of the job's last progress line.
fn read_count(stderr: &str) -> u64 {
    let line = stderr.lines().rev().find(|l| l.contains(" read ")).expect("a progress line");
    line.split(" read ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap().parse().unwrap()
}

#[test]
fn bad_records_are_counted_and_dead_lettered_while_the_job_keeps_running() {
    let Some(stack) = stack() else { return };
    let topic = unique("bad-in");
    let dlq = unique("bad-dlq");
    create_topic(&stack, &topic, 1);
    create_topic(&stack, &dlq, 1);
    produce_readings(&stack, &topic, 500, 1);

    // A registered id with a truncated body, an unknown id, and no Confluent frame at all.
    let client = RegistryClient::new(&stack.registry).unwrap();
    let id = client.register(&subject_for_topic(&topic), SensorReading::schema()).unwrap();
    let mut truncated = Vec::new();
    write_header(&mut truncated, id);
    truncated.extend_from_slice(&[0x02, 0x04]);
    let mut unknown = Vec::new();
    write_header(&mut unknown, 1_999_999_999);
    unknown.extend_from_slice(&[0u8; 40]);
    let bad = vec![
        (b"x".to_vec(), b"not avro at all".to_vec()),
        (b"y".to_vec(), unknown),
        (b"z".to_vec(), truncated),
    ];
    produce_raw(&stack, &topic, 0, &bad);
    produce_readings(&stack, &topic, 500, 2);

    let dir = tempfile::tempdir().unwrap();
    let err = run_job(&stack, &topic, dir.path(), &["--dead-letter-topic", &dlq]);
    assert_eq!(read_count(&err), 1003, "every good reading is read, and the 3 dead letters: {err}");
    assert!(err.contains("bad record at partition 0 offset 500"), "{err}");
    // Exactly the good records' plausible readings (#43: the check allowed 5 % loss): the
    // oracle of the same readings written to a topic of their own, without the bad ones.
    let clean = unique("bad-in-clean");
    create_topic(&stack, &clean, 1);
    produce_readings(&stack, &clean, 500, 1);
    produce_readings(&stack, &clean, 500, 2);
    let (want, _) = kafka_support::oracle::expected(&stack, &clean, 60_000);
    let got = reading_keys(&dir.path().join("results/readings"));
    let want: Vec<(i64, i64)> = want.iter().map(|r| (r.0, r.1)).collect();
    assert_eq!(got, want, "the readings are the good records' plausible ones, each once");

    let dead = read_committed_with_headers(&stack, &dlq);
    assert_eq!(dead.len(), 3, "three dead letters");
    for ((key, value, headers), (want_key, want_value)) in dead.iter().zip(&bad) {
        assert_eq!((key, value), (want_key, want_value), "dead letters keep the bytes as they were");
        let header = |k: &str| headers.iter().find(|(h, _)| h == k).map(|(_, v)| v.clone());
        assert_eq!(header("caudal.source.topic").as_deref(), Some(topic.as_str()));
        assert_eq!(header("caudal.source.partition").as_deref(), Some("0"));
        assert!(header("caudal.error").is_some_and(|e| !e.is_empty()), "{headers:?}");
    }
    let offsets: Vec<_> = dead
        .iter()
        .map(|(_, _, h)| h.iter().find(|(k, _)| k == "caudal.source.offset").unwrap().1.clone())
        .collect();
    assert_eq!(offsets, ["500", "501", "502"]);
}

/// The reading as a producer on schema version 2 writes it: an added `unit` field.
#[derive(Serialize)]
struct ReadingV2 {
    sensor_id: i64,
    ts: i64,
    lat: f64,
    lon: f64,
    temp_f: f64,
    unit: String,
}

const READING_V2: &str = r#"{"type":"record","name":"SensorReading","namespace":"io.caudal","fields":[
    {"name":"sensor_id","type":"long"},
    {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
    {"name":"lat","type":"double"},{"name":"lon","type":"double"},
    {"name":"temp_f","type":"double"},
    {"name":"unit","type":"string","default":"F"}]}"#;

/// `records` readings of sensors 1000–1004 as a producer on version 2 writes them.
fn v2_records(v2_id: u32, records: i64) -> Vec<(Vec<u8>, Vec<u8>)> {
    let v2 = Schema::parse_str(READING_V2).unwrap();
    (0..records)
        .map(|i| {
            let r = ReadingV2 {
                sensor_id: 1000 + i % 5,
                ts: 1_767_225_600_000 + i * 1000,
                lat: 10.0,
                lon: 20.0,
                temp_f: 50.0 + (i % 10) as f64,
                unit: "F".into(),
            };
            let mut bytes = Vec::new();
            write_header(&mut bytes, v2_id);
            bytes.extend(encode_generic(&v2, &r).unwrap());
            (r.sensor_id.to_string().into_bytes(), bytes)
        })
        .collect()
}

/// Waits (at most a minute) until the job published `want` readings matching `pick`.
fn wait_for_readings(dir: &Path, want: usize, what: &str, pick: impl Fn(&str) -> bool) {
    let start = Instant::now();
    loop {
        let got = lines(dir).iter().filter(|l| pick(l)).count();
        if got == want {
            return;
        }
        assert!(got < want, "{got} {what} published, more than the {want} produced");
        assert!(start.elapsed() < Duration::from_secs(60), "{got} of {want} {what} published after a minute");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_running_job_keeps_reading_a_producer_that_moves_to_a_compatible_schema_version() {
    let Some(stack) = stack() else { return };
    let topic = unique("evolve-in");
    create_topic(&stack, &topic, 2);
    // Version 1 (no faulty readings: every one reaches the output).
    produce_readings_with(&stack, &topic, 400, 3, &["--faulty-fraction", "0"]);

    // The job runs unbounded: it is the same process before and after the change.
    let dir = tempfile::tempdir().unwrap();
    let stderr_path = dir.path().join("stderr");
    let mut job = job_command(&stack, &stack.registry, &topic, dir.path())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let readings = dir.path().join("results/readings");
    let is_v2 = |l: &str| l.contains("\"sensor_id\":100");
    wait_for_readings(&readings, 400, "version-1 readings", |l| !is_v2(l));

    // Version 2 is registered while the job runs, accepted under BACKWARD, with its own id.
    let client = RegistryClient::new(&stack.registry).unwrap();
    let subject = subject_for_topic(&topic);
    let v1 = client.latest(&subject).unwrap();
    let v2_id = client.register_json(&subject, READING_V2).unwrap();
    assert_ne!(v2_id, v1.id);
    assert_eq!(client.latest(&subject).unwrap().version, 2);
    produce_raw(&stack, &topic, 1, &v2_records(v2_id, 200));
    wait_for_readings(&readings, 200, "version-2 readings", is_v2);
    assert!(job.try_wait().unwrap().is_none(), "the job stopped by itself");

    // A clean stop (SIGTERM: final checkpoint, exit 0).
    let pid = job.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = job.wait().unwrap();
    let err = std::fs::read_to_string(&stderr_path).unwrap();
    assert!(status.success(), "the stopped job failed: {status} {err}");
    assert_eq!(read_count(&err), 600, "v1 and v2 records are all read: {err}");
    assert_eq!(lines(&readings).len(), 600, "each reading published once");
}

/// A reading as another design's producer writes it: `timestamp_ms` where Caudal's
/// `SensorReading` has `ts`, no default — a schema this job cannot resolve.
const READING_ELSEWHERE: &str = r#"{"type":"record","name":"SensorReading","namespace":"io.caudal","fields":[
    {"name":"sensor_id","type":"long"},
    {"name":"timestamp_ms","type":"long"},
    {"name":"lat","type":"double"},{"name":"lon","type":"double"},
    {"name":"temp_f","type":"double"}]}"#;

#[derive(Serialize)]
struct ReadingElsewhere {
    sensor_id: i64,
    timestamp_ms: i64,
    lat: f64,
    lon: f64,
    temp_f: f64,
}

/// Runs the bounded job over `topic` and returns (success, stderr) without judging them.
fn try_job(stack: &Stack, topic: &str, out: &Path, extra: &[&str]) -> (bool, String) {
    let run = Command::new(env!("CARGO_BIN_EXE_temperature"))
        .args(["--source", "kafka", "--input-topic", topic, "--bounded"])
        .args(["--brokers", &stack.brokers, "--schema-registry", &stack.registry])
        .args(["--checkpoint-interval", "0.5", "--progress-secs", "0", "--no-ui"])
        .arg("--output")
        .arg(out.join("results"))
        .arg("--checkpoint-dir")
        .arg(out.join("ckpt"))
        .args(extra)
        .output()
        .unwrap();
    (run.status.success(), String::from_utf8_lossy(&run.stderr).to_string())
}

/// A bounded input of which not one record decodes (written with a schema the job cannot
/// resolve) fails the run, naming the cause — before #43 it "finished" with exit 0 and no
/// output. Its dead letters were written in the epoch that failed: aborted with it, as its
/// output is (the input stays where the last checkpoint is; a run that can read it sends
/// them again).
#[test]
fn an_input_of_only_unreadable_records_fails_the_bounded_run_naming_the_cause() {
    let Some(stack) = stack() else { return };
    let (topic, dlq) = (unique("unreadable-in"), unique("unreadable-dlq"));
    create_topic(&stack, &topic, 1);
    create_topic(&stack, &dlq, 1);
    let client = RegistryClient::new(&stack.registry).unwrap();
    let schema = Schema::parse_str(READING_ELSEWHERE).unwrap();
    let subject = format!("{}-elsewhere", subject_for_topic(&topic));
    let id = client.register(&subject, &schema).unwrap();
    let records: Vec<(Vec<u8>, Vec<u8>)> = (0..40)
        .map(|i| {
            let r = ReadingElsewhere {
                sensor_id: i % 4,
                timestamp_ms: 1_767_225_600_000 + i * 1000,
                lat: 1.0,
                lon: 2.0,
                temp_f: 60.0,
            };
            let mut bytes = Vec::new();
            write_header(&mut bytes, id);
            bytes.extend(encode_generic(&schema, &r).unwrap());
            (r.sensor_id.to_string().into_bytes(), bytes)
        })
        .collect();
    produce_raw(&stack, &topic, 0, &records);
    let dir = tempfile::tempdir().unwrap();
    let (ok, err) = try_job(&stack, &topic, dir.path(), &["--dead-letter-topic", &dlq]);
    assert!(!ok, "a run that could read nothing must not succeed: {err}");
    assert!(err.contains("all 40 records read failed to decode") && err.contains("ts"), "{err}");
    assert!(!err.contains("restart"), "an unreadable input is not retried: {err}");
    let dead = read_committed_with_headers(&stack, &dlq);
    assert!(dead.is_empty(), "the failed epoch's dead letters were committed: {}", dead.len());
}

/// With `--max-bad-records-per-minute`, an input with more bad records in a minute fails the
/// job at once, naming the budget; within it the job finishes.
#[test]
fn more_bad_records_than_the_budget_fail_the_job() {
    let Some(stack) = stack() else { return };
    let topic = unique("budget-in");
    create_topic(&stack, &topic, 1);
    produce_readings(&stack, &topic, 100, 3);
    let garbage: Vec<(Vec<u8>, Vec<u8>)> = (0..3).map(|i| (vec![i], b"not avro".to_vec())).collect();
    produce_raw(&stack, &topic, 0, &garbage);
    let dir = tempfile::tempdir().unwrap();
    let (ok, err) = try_job(&stack, &topic, dir.path(), &["--max-bad-records-per-minute", "2"]);
    assert!(!ok, "3 bad records in a minute exceed a budget of 2: {err}");
    assert!(err.contains("max_bad_records_per_minute (2)"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let (ok, err) = try_job(&stack, &topic, dir.path(), &["--max-bad-records-per-minute", "3"]);
    assert!(ok, "3 bad records are within a budget of 3: {err}");
}

/// A TCP forwarder to the schema registry that the test can cut: while it is down, every
/// connection it accepts is closed at once.
struct RegistryProxy {
    url: String,
    up: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl RegistryProxy {
    fn start(registry_url: &str) -> RegistryProxy {
        use std::io::copy;
        use std::net::{TcpListener, TcpStream};
        use std::sync::atomic::{AtomicBool, Ordering};
        let rest = registry_url.strip_prefix("http://").expect("an http registry");
        let (target, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
        let target = target.to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/{path}", listener.local_addr().unwrap());
        let up = std::sync::Arc::new(AtomicBool::new(true));
        let flag = up.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                if !flag.load(Ordering::SeqCst) {
                    continue; // dropped: closed
                }
                let Ok(server) = TcpStream::connect(&target) else { continue };
                let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (mut c, mut s) = (client, server);
                std::thread::spawn(move || {
                    let _ = copy(&mut c, &mut s);
                    let _ = s.shutdown(std::net::Shutdown::Write);
                });
                std::thread::spawn(move || {
                    let _ = copy(&mut s2, &mut c2);
                    let _ = c2.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        RegistryProxy { url, up }
    }

    fn set_up(&self, up: bool) {
        self.up.store(up, std::sync::atomic::Ordering::SeqCst);
    }
}

/// #43: the schema registry unreachable while a restored job starts. Its readings cannot
/// be decoded, and that is no bad data: the run fails naming the registry, dead-letters and
/// skips nothing; restored again once the registry is back, the job's readings are exactly
/// the oracle's.
#[test]
fn a_registry_outage_fails_the_run_and_loses_nothing() {
    let Some(stack) = stack() else { return };
    let (topic, dlq) = (unique("outage-in"), unique("outage-dlq"));
    create_topic(&stack, &topic, 2);
    create_topic(&stack, &dlq, 1);
    produce_readings(&stack, &topic, 8_000, 7);
    let proxy = RegistryProxy::start(&stack.registry);
    let dir = tempfile::tempdir().unwrap();
    let job = |restore: bool| {
        let mut cmd = job_command(&stack, &proxy.url, &topic, dir.path());
        cmd.args(["--bounded", "--dead-letter-topic", &dlq, "--max-records-per-second", "2000"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        if restore {
            cmd.args(["--restore", "latest"]);
        }
        cmd.spawn().unwrap()
    };
    // A first run, killed once it has checkpoints (its decoder had the schema then).
    let mut first = job(false);
    let deadline = Instant::now() + Duration::from_secs(60);
    let has_checkpoint = || {
        std::fs::read_dir(dir.path().join("ckpt/temperature"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().join("_metadata").exists())
            .count()
            >= 2
    };
    while !has_checkpoint() {
        assert!(Instant::now() < deadline, "no checkpoint after 60 s");
        assert!(first.try_wait().unwrap().is_none(), "the first run ended before its kill");
        std::thread::sleep(Duration::from_millis(50));
    }
    first.kill().unwrap();
    first.wait().unwrap();

    proxy.set_up(false);
    let out = job(true).wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a run that cannot reach the registry must not succeed: {err}");
    assert!(err.contains("schema registry") || err.contains("registry"), "the cause is named: {err}");
    assert!(!err.contains("bad record"), "an unreachable registry is no bad data: {err}");

    proxy.set_up(true);
    let out = job(true).wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the run after the outage failed: {err}");
    assert!(!err.contains("bad record"), "{err}");
    let (want, _) = kafka_support::oracle::expected(&stack, &topic, 60_000);
    let got = reading_keys(&dir.path().join("results/readings"));
    let want: Vec<(i64, i64)> = want.iter().map(|r| (r.0, r.1)).collect();
    assert_eq!(got, want, "the readings are the input's plausible ones, each once");
    assert!(read_committed_with_headers(&stack, &dlq).is_empty(), "nothing was dead-lettered");
}

/// A schema change across a restore (#43): the job (unbounded: a bounded run keeps the end
/// offsets of its first start across restores) is killed mid-input; while it is down the
/// producer moves to version 2 (an added field with a default) and writes more; the restored
/// run reads the rest of version 1 and all of version 2 — each reading published once.
#[test]
fn a_restore_reads_what_a_producer_wrote_with_a_new_schema_version_while_the_job_was_down() {
    let Some(stack) = stack() else { return };
    let topic = unique("evolve-restore-in");
    create_topic(&stack, &topic, 2);
    produce_readings_with(&stack, &topic, 600, 4, &["--faulty-fraction", "0"]);
    let dir = tempfile::tempdir().unwrap();
    let job = |extra: &[&str]| {
        job_command(&stack, &stack.registry, &topic, dir.path())
            .args(extra)
            .stderr(std::fs::File::create(dir.path().join(format!("stderr{}", extra.join("_")))).unwrap())
            .spawn()
            .unwrap()
    };
    let readings = dir.path().join("results/readings");
    let mut first = job(&["--max-records-per-second", "200"]);
    let start = Instant::now();
    while lines(&readings).len() < 150 {
        assert!(start.elapsed() < Duration::from_secs(60), "nothing published after a minute");
        assert!(first.try_wait().unwrap().is_none(), "the first run ended before its kill");
        std::thread::sleep(Duration::from_millis(50));
    }
    first.kill().unwrap();
    first.wait().unwrap();
    let before = lines(&readings).len();
    assert!(before < 600, "the first run read everything before its kill ({before})");

    let client = RegistryClient::new(&stack.registry).unwrap();
    let v2_id = client.register_json(&subject_for_topic(&topic), READING_V2).unwrap();
    produce_raw(&stack, &topic, 1, &v2_records(v2_id, 200));

    let mut restored = job(&["--restore", "latest"]);
    let is_v2 = |l: &str| l.contains("\"sensor_id\":100");
    wait_for_readings(&readings, 200, "version-2 readings", is_v2);
    wait_for_readings(&readings, 600, "version-1 readings", |l| !is_v2(l));
    let pid = restored.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = restored.wait().unwrap();
    let err = std::fs::read_to_string(dir.path().join("stderr--restore_latest")).unwrap();
    assert!(status.success(), "the restored run failed: {err}");
    assert!(err.contains("restoring job"), "{err}");
    assert!(!err.contains("bad record"), "version 2 was read as bad data: {err}");
    let mut keys = reading_keys(&readings);
    let published = keys.len();
    keys.dedup();
    assert_eq!(keys.len(), published, "a reading published twice");
    assert_eq!(published, 800, "600 of version 1 and 200 of version 2, each once");
    assert_eq!(keys.iter().filter(|k| k.0 >= 1000).count(), 200, "the version-2 readings");
}

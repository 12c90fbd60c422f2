//! Exactly-once into Kafka, against the real broker and schema registry: the temperature
//! job reads Avro readings from a topic and writes readings and window statistics into
//! two topics through Kafka transactions. It is killed at every step of the checkpoint and
//! commit protocol (and at random moments), restored with `--restore latest`, and a
//! `read_committed` consumer must then see exactly what an uninterrupted run wrote: no
//! record lost, none twice.
//!
//! Needs `CAUDAL_KAFKA_BROKERS` and `CAUDAL_SCHEMA_REGISTRY` (`scripts/services.sh start`);
//! without them the tests say so and pass, unless `CAUDAL_REQUIRE_STACK` is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/frozen.rs"]
mod frozen;
mod kafka_support;

use caudal_operators::kafka::txn_coordinator::TxnCoordinatorClient;
use kafka_support::{
    client_properties_with, committed_offsets, create_topic, end_offsets, oracle, read_committed,
    secure_kafka, stack, unique, SecureKafka, Stack,
};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, Producer};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const READINGS: u64 = 200_000;
const PARTITIONS: i32 = 4;
/// `--silence-secs` of every run.
const SILENCE_SECS: i64 = 5;

/// A new input topic with `records` readings.
fn produce(stack: &Stack, name: &str, records: u64) -> String {
    let topic = unique(name);
    create_topic(stack, &topic, PARTITIONS);
    let out = Command::new(env!("CARGO_BIN_EXE_temperature"))
        .args(["produce", "--topic", &topic, "--sensors", "100", "--rate", "0", "--seed", "5"])
        .args(["--records", &records.to_string(), "--event-interval-ms", "100"])
        // Silent sensors (alerts after SILENCE_SECS; sensor 42's outage is too short).
        .args(["--outage", "5:30:60", "--outage", "42:100:101", "--outage", "77:150:190"])
        .args(["--brokers", &stack.brokers, "--schema-registry", &stack.registry])
        .output()
        .unwrap();
    assert!(out.status.success(), "produce failed: {}", String::from_utf8_lossy(&out.stderr));
    topic
}

/// The input topic of the crash-point tests, produced once per test binary.
fn input(stack: &Stack) -> &'static str {
    static INPUT: OnceLock<String> = OnceLock::new();
    INPUT.get_or_init(|| produce(stack, "eo-in", READINGS))
}

/// One run's input, output topics and checkpoint directory.
struct Run {
    input: String,
    checkpoint_interval: &'static str,
    /// `--parallelism` (2).
    parallelism: &'static str,
    /// `--max-records-per-second`: bounds how far one run gets before it is killed.
    max_rate: Option<&'static str>,
    /// More arguments (e.g. `--delivery at-least-once`).
    extra: Vec<&'static str>,
    /// Environment of the job (`CAUDAL__*` settings).
    env: Vec<(&'static str, &'static str)>,
    readings: String,
    windows: String,
    alerts: String,
    ckpt: tempfile::TempDir,
    /// Over the broker's SASL_SSL listener, with this client configuration (`--kafka-config`).
    secure: Option<(String, std::path::PathBuf)>,
}

fn new_run(stack: &Stack, name: &str) -> Run {
    let run = Run {
        input: input(stack).to_owned(),
        checkpoint_interval: "0.1",
        parallelism: "2",
        max_rate: None,
        extra: Vec::new(),
        env: Vec::new(),
        readings: unique(&format!("{name}-readings")),
        windows: unique(&format!("{name}-windows")),
        alerts: unique(&format!("{name}-alerts")),
        ckpt: tempfile::tempdir().unwrap(),
        secure: None,
    };
    create_topic(stack, &run.readings, 2);
    create_topic(stack, &run.windows, 2);
    create_topic(stack, &run.alerts, 2);
    run
}

fn spawn(stack: &Stack, run: &Run, restore: bool, crash_at: Option<&str>) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_temperature"));
    match &run.secure {
        // The brokers on the command line; the registry, its credentials and CA only in
        // the file (whose URL wins over CAUDAL_SCHEMA_REGISTRY, the plaintext registry).
        Some((brokers, config)) => cmd.args(["--brokers", brokers, "--kafka-config"]).arg(config),
        None => cmd.args(["--brokers", &stack.brokers, "--schema-registry", &stack.registry]),
    };
    cmd.args(["--source", "kafka", "--input-topic", &run.input, "--bounded"])
        .args(["--sink", "kafka", "--output-topic", &run.readings, "--windows-topic", &run.windows])
        .args([
            "--window-secs",
            "10",
            "--parallelism",
            run.parallelism,
            "--checkpoint-interval",
            run.checkpoint_interval,
        ])
        .args(["--progress-secs", "1", "--no-ui", "--transactional-id-prefix", &run.readings])
        .args(["--alerts-topic", &run.alerts, "--silence-secs", &SILENCE_SECS.to_string()])
        .arg("--checkpoint-dir")
        .arg(run.ckpt.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if restore {
        cmd.args(["--restore", "latest"]);
    }
    if let Some(rate) = run.max_rate {
        cmd.args(["--max-records-per-second", rate]);
    }
    cmd.args(&run.extra);
    cmd.envs(run.env.iter().copied());
    if let Some(point) = crash_at {
        cmd.env("CAUDAL__TEST_CRASH_AT", point);
    }
    cmd.spawn().expect("start temperature")
}

fn wait(child: Child) -> (ExitStatus, String) {
    let out = child.wait_with_output().expect("wait");
    (out.status, String::from_utf8_lossy(&out.stderr).to_string())
}

/// Readings, windows and alerts, each as sorted (key, payload) pairs.
type Output = (Vec<(Vec<u8>, Vec<u8>)>, Vec<(Vec<u8>, Vec<u8>)>, Vec<(Vec<u8>, Vec<u8>)>);

/// What a run published, as (key, Avro payload) pairs, sorted. The 5-byte Confluent
/// header is dropped: each run's topics are distinct subjects.
fn published(stack: &Stack, run: &Run) -> Output {
    let strip = |records: Vec<(Vec<u8>, Vec<u8>)>| {
        let mut v: Vec<_> =
            records.into_iter().map(|(k, v)| (k, v.get(5..).unwrap_or_default().to_vec())).collect();
        v.sort();
        v
    };
    (
        strip(read_committed(stack, &run.readings)),
        strip(read_committed(stack, &run.windows)),
        strip(read_committed(stack, &run.alerts)),
    )
}

/// An uninterrupted run over `run`'s input, its readings checked against the input.
fn clean_run(stack: &Stack, like: &Run, records: u64) -> Output {
    let run = Run { input: like.input.clone(), ..new_run(stack, "clean") };
    let (status, err) = wait(spawn(stack, &run, false, None));
    assert!(status.success(), "clean run failed: {err}");
    let out = published(stack, &run);
    // The reference the kill tests compare with is itself checked against what the input
    // implies: its readings and windows are exactly the oracle's.
    let (readings, windows) = oracle::expected(stack, &run.input, 10_000);
    assert_eq!(oracle::readings_of(&out.0), readings, "the clean run's readings differ from the input's");
    assert_eq!(oracle::windows_of(&out.1), windows, "the clean run's windows differ from the input's");
    let alerts = oracle::expected_alerts(stack, &run.input, SILENCE_SECS * 1000);
    assert_eq!(alerts.len(), 4, "two outages alert (a SILENT and a RECOVERED each), one is too short");
    assert_eq!(
        oracle::alerts_of(&out.2),
        alerts,
        "the clean run's alerts differ from what the input implies"
    );
    assert!(out.0.len() as u64 > records * 9 / 10, "clean run wrote {} readings", out.0.len());
    assert!(out.1.len() > 1000, "clean run wrote {} windows", out.1.len());
    out
}

fn clean(stack: &Stack) -> &'static Output {
    static CLEAN: OnceLock<Output> = OnceLock::new();
    CLEAN.get_or_init(|| clean_run(stack, &new_run(stack, "clean"), READINGS))
}

fn assert_equals_clean(stack: &Stack, run: &Run, what: &str) {
    assert_equals(clean(stack), stack, run, what);
}

fn assert_equals(clean: &Output, stack: &Stack, run: &Run, what: &str) {
    let got = published(stack, run);
    let outputs =
        [("readings", &got.0, &clean.0), ("windows", &got.1, &clean.1), ("alerts", &got.2, &clean.2)];
    for (name, got, want) in outputs {
        if got != want {
            let dups = got.windows(2).filter(|w| w[0] == w[1]).count();
            panic!(
                "{what}: {name} differ from the clean run: {} records vs {} ({dups} duplicated)",
                got.len(),
                want.len()
            );
        }
    }
}

/// Restores until the job finishes; returns the restored run's stderr.
fn finish(stack: &Stack, run: &Run) -> String {
    let (status, err) = wait(spawn(stack, run, has_checkpoint(run), None));
    assert!(status.success(), "restored run failed: {err}");
    eprintln!("restored run: {err}");
    err
}

fn has_checkpoint(run: &Run) -> bool {
    let job = run.ckpt.path().join("temperature");
    std::fs::read_dir(job).into_iter().flatten().flatten().any(|e| e.path().join("_metadata").exists())
}

/// Kills the job at `point` of checkpoint 3, restores it until it finishes and compares
/// with the clean run; returns the restored run's stderr.
fn crash_at(point: &str) -> Option<String> {
    let stack = stack()?;
    clean(&stack);
    let run = new_run(&stack, point);
    let (status, err) = wait(spawn(&stack, &run, false, Some(&format!("{point}:3"))));
    assert_eq!(status.signal(), Some(9), "the job was not SIGKILLed at {point}: {status} {err}");
    assert!(err.contains(&format!("crash point {point}")), "{point}: {err}");
    let restored = finish(&stack, &run);
    assert_equals_clean(&stack, &run, point);
    Some(restored)
}

#[test]
fn crash_before_the_barrier_with_records_in_the_open_transaction() {
    let Some(restored) = crash_at("before-sink-barrier") else { return };
    // The killed run's open transaction of epoch 3 was at the broker: the restore aborted
    // it (its records are written again by the restored run, not seen twice).
    assert!(restored.contains("left open by an earlier run"), "no open transaction was aborted: {restored}");
}

#[test]
fn crash_after_snapshot_before_ack() {
    crash_at("after-snapshot-before-ack");
}

#[test]
fn crash_after_the_sink_pre_committed_before_the_checkpoint_is_complete() {
    crash_at("after-sink-pre-commit");
}

#[test]
fn crash_after_all_acks_before_the_metadata_is_durable() {
    crash_at("before-metadata");
}

#[test]
fn crash_after_the_checkpoint_is_complete_before_the_commit() {
    crash_at("after-metadata-before-notify");
}

#[test]
fn crash_during_the_commit() {
    crash_at("during-sink-commit");
}

/// The checkpoint is complete and its transactions are pending when the job dies; the
/// restore runs at another parallelism (#43): the new subtasks take over the old ones'
/// pending transactions (committed) and the open ones of their ids (aborted).
#[test]
fn restored_at_another_parallelism_while_transactions_are_pending() {
    let Some(stack) = stack() else { return };
    clean(&stack);
    for (to, name) in [("3", "pending-2-to-3"), ("1", "pending-2-to-1")] {
        let mut run = new_run(&stack, name);
        let (status, err) = wait(spawn(&stack, &run, false, Some("after-metadata-before-notify:3")));
        assert_eq!(status.signal(), Some(9), "{name}: not killed after checkpoint 3 completed: {err}");
        run.parallelism = to;
        let restored = finish(&stack, &run);
        assert!(
            restored.contains("of checkpoint 3"),
            "{name}: nothing of checkpoint 3 was committed: {restored}"
        );
        assert_equals_clean(&stack, &run, name);
    }
}

/// The final checkpoint of the bounded input is complete, its transactions not committed,
/// when the job dies (#43: crash points were armed at checkpoints 2–4 only).
#[test]
fn crash_after_the_final_checkpoint_is_complete_before_its_commit() {
    let Some(stack) = stack() else { return };
    clean(&stack);
    let run = new_run(&stack, "final-pending");
    let (status, err) = wait(spawn(&stack, &run, false, Some("after-metadata-before-notify:final")));
    assert_eq!(status.signal(), Some(9), "not killed at the final checkpoint: {err}");
    let restored = finish(&stack, &run);
    assert!(restored.contains("committed `"), "the final epoch was not committed by the restore: {restored}");
    assert_equals_clean(&stack, &run, "killed before the final checkpoint's commit");
}

#[test]
fn crash_during_restore_before_the_pending_commit() {
    let Some(stack) = stack() else { return };
    clean(&stack);
    let run = new_run(&stack, "during-restore");
    let (status, err) = wait(spawn(&stack, &run, false, Some("after-metadata-before-notify:3")));
    assert!(!status.success(), "first crash did not happen: {err}");
    let (status, err) = wait(spawn(&stack, &run, true, Some("during-restore:3")));
    assert!(!status.success() && err.contains("crash point"), "the restore did not crash: {err}");
    finish(&stack, &run);
    assert_equals_clean(&stack, &run, "during-restore");
}

/// A real zombie (#43): the run freezes itself (SIGSTOP) with records of epoch 3 in its open
/// transactions; a second run claims the job's checkpoint storage, restores checkpoint 2 —
/// fencing every transactional id the frozen run used, which aborts its transactions — and
/// finishes. Resumed, the frozen run stops: its producers are fenced, and a producer it
/// makes for an id nobody used yet finds the newer claim before any transaction begins on
/// it, so nothing it does stays open for read_committed readers to wait on. The output
/// equals the clean run's.
#[test]
fn a_frozen_run_resumed_after_its_successor_restored_stops_and_leaves_nothing_open() {
    let Some(stack) = stack() else { return };
    clean(&stack);
    let mut run = new_run(&stack, "zombie");
    run.max_rate = Some("20000");
    run.env = vec![("CAUDAL__TEST_FREEZE_AT", "before-sink-barrier:3")];
    let zombie = spawn(&stack, &run, false, None);
    let frozen = frozen::Frozen::wait_for(zombie.id(), 60, "before-sink-barrier:3");
    run.env.clear();
    run.max_rate = None;
    let restored = finish(&stack, &run);
    assert!(
        restored.contains("left open by an earlier run"),
        "the frozen run's transactions were not aborted: {restored}"
    );
    frozen.resume();
    let (status, err) = wait(zombie);
    assert!(err.contains("freeze point before-sink-barrier at checkpoint 3"), "frozen elsewhere:\n{err}");
    assert!(!status.success(), "the resumed zombie must stop:\n{err}");
    let err_lower = err.to_lowercase();
    assert!(
        err_lower.contains("fenced") || err_lower.contains("is superseded"),
        "the zombie stopped for another reason:\n{err}"
    );
    assert!(
        fence_open_transactions(&stack, &run.readings).is_empty(),
        "the zombie left transactions open:\n{err}"
    );
    assert_equals_clean(&stack, &run, "a frozen run resumed after its successor restored");
}

/// A secured platform (#44): every connection of the job over the broker's SASL_SSL
/// listener (SCRAM-SHA-512, the stack's CA), and the registry over HTTPS with basic auth,
/// from one `--kafka-config` file. Killed after
/// checkpoint 3 completed, before its commit: the restore commits the pending transactions
/// through Caudal's own coordinator client — over TLS, authenticated — and the output
/// equals the clean run's.
#[test]
fn over_sasl_ssl_the_restore_recommits_what_a_crash_in_the_commit_window_left() {
    let Some(stack) = stack() else { return };
    let Some(secure) = secure_kafka() else { return };
    clean(&stack);
    let mut run = new_run(&stack, "secure-window");
    run.secure = Some((secure.brokers, secure.config));
    let (status, err) = wait(spawn(&stack, &run, false, Some("after-metadata-before-notify:3")));
    assert_eq!(status.signal(), Some(9), "not killed after checkpoint 3's metadata: {err}");
    let restored = finish(&stack, &run);
    assert!(restored.contains("of checkpoint 3 (producer"), "nothing recommitted: {restored}");
    assert_equals_clean(&stack, &run, "over SASL_SSL, crashed in the commit window");
}

/// A wrong SASL password fails the job at start, naming the cause, with nothing written
/// and no restart (#44).
#[test]
fn a_wrong_sasl_password_fails_the_job_at_start_naming_the_cause() {
    let Some(stack) = stack() else { return };
    let Some(secure) = secure_kafka() else { return };
    let err =
        fails_at_start(&stack, "secure-wrong", &secure, "sasl.password=", "sasl.password=not-the-password");
    assert!(err.contains("authentication failed") || err.contains("Authentication failed"), "{err}");
}

/// A wrong registry password fails the job at start, naming the registry's refusal, with
/// nothing written and no restart (#44).
#[test]
fn a_wrong_registry_password_fails_the_job_at_start_naming_the_cause() {
    let Some(stack) = stack() else { return };
    let Some(secure) = secure_kafka() else { return };
    let err = fails_at_start(
        &stack,
        "registry-wrong",
        &secure,
        "basic.auth.user.info=",
        "basic.auth.user.info=caudal:not-the-password",
    );
    assert!(err.contains("HTTP 401") && err.contains("basic.auth.user.info"), "{err}");
}

/// Runs the job over the secured stack with the line of the client.properties that starts
/// with `key` replaced by `line`; it must fail within 90 s (killed at 120 s: a job that
/// retries a refusal for ever fails the test), write nothing and never show the password.
/// Returns its standard error.
fn fails_at_start(stack: &Stack, name: &str, secure: &SecureKafka, key: &str, line: &str) -> String {
    let run = new_run(stack, name);
    let wrong = client_properties_with(&secure.config, key, line);
    let config = run.ckpt.path().join("wrong.properties");
    std::fs::write(&config, wrong).unwrap();
    let run = Run { secure: Some((secure.brokers.clone(), config)), ..run };
    let started = Instant::now();
    let child = spawn(stack, &run, false, None);
    let pid = child.id();
    let (done, watch) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if watch.recv_timeout(Duration::from_secs(120)).is_err() {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
    });
    let (status, err) = wait(child);
    let _ = done.send(());
    assert!(!status.success(), "the job ran with `{line}`:\n{err}");
    assert!(started.elapsed() < Duration::from_secs(90), "it took {:?} to fail", started.elapsed());
    assert!(!err.contains("not-the-password"), "the password was shown:\n{err}");
    assert_eq!(end_offsets(stack, &run.readings), [0, 0], "readings were written");
    err
}

/// Crashed inside the restore's own commit (#12): killed after checkpoint 3's metadata is
/// durable, the restore is killed again after its first recommitted transaction (the other
/// sink subtasks' not yet); a second restore recommits the rest (the first again, which is
/// harmless) and ends exact.
#[test]
fn crash_half_way_through_the_recommit_of_a_restore() {
    let Some(stack) = stack() else { return };
    clean(&stack);
    let run = new_run(&stack, "recommit");
    let (status, err) = wait(spawn(&stack, &run, false, Some("after-metadata-before-notify:3")));
    assert_eq!(status.signal(), Some(9), "not killed after checkpoint 3's metadata: {err}");
    let (status, err) = wait(spawn(&stack, &run, true, Some("during-kafka-recommit:3")));
    assert_eq!(status.signal(), Some(9), "the restore was not killed: {err}");
    assert!(err.contains("crash point during-kafka-recommit at checkpoint 3"), "died elsewhere: {err}");
    finish(&stack, &run);
    assert_equals_clean(&stack, &run, "killed half-way through the recommit");
}

/// The restore of a changed graph, on Kafka: an archive sink added after the crash (in
/// front of the Kafka sinks in the graph) leaves their uids and so their pending
/// transactions found, and the output equals the clean run's; the archive removed again
/// fails the restore before anything is processed, naming its uid, and
/// --allow-non-restored-state drops it with the Kafka output still exact.
#[test]
fn a_restore_with_a_sink_added_or_removed_keeps_the_kafka_output_exact() {
    let Some(stack) = stack() else { return };
    clean(&stack);
    let point = "after-metadata-before-notify";
    let archive = tempfile::tempdir().unwrap();
    let archive_dir = archive.path().display().to_string();
    let archive_flag: &'static str = Box::leak(archive_dir.into_boxed_str());
    // Added.
    let mut run = new_run(&stack, "graph-added");
    let (status, err) = wait(spawn(&stack, &run, false, Some(&format!("{point}:3"))));
    assert_eq!(status.signal(), Some(9), "not killed at {point}: {err}");
    run.extra = vec!["--archive", archive_flag];
    finish(&stack, &run);
    assert_equals_clean(&stack, &run, "restored with an archive sink added");
    // Removed.
    let mut run = new_run(&stack, "graph-removed");
    run.extra = vec!["--archive", archive_flag];
    let (status, err) = wait(spawn(&stack, &run, false, Some(&format!("{point}:3"))));
    assert_eq!(status.signal(), Some(9), "not killed at {point}: {err}");
    run.extra = Vec::new();
    let (status, err) = wait(spawn(&stack, &run, true, None));
    assert!(!status.success(), "a restore dropping the archive's pending epoch must fail: {err}");
    assert!(err.contains("holds state of operators this job does not have: readings-archive"), "{err}");
    run.extra = vec!["--allow-non-restored-state"];
    finish(&stack, &run);
    assert_equals_clean(&stack, &run, "restored without the archive, non-restored state allowed");
}

#[test]
fn restored_twice_from_the_same_checkpoint() {
    // The first restore commits checkpoint 3's transactions and crashes before checkpoint
    // 4 completes; the second restores from 3 again and must find them committed, not lost.
    let Some(stack) = stack() else { return };
    clean(&stack);
    let run = new_run(&stack, "twice");
    let (status, err) = wait(spawn(&stack, &run, false, Some("after-metadata-before-notify:3")));
    assert!(!status.success(), "first crash did not happen: {err}");
    let (status, err) = wait(spawn(&stack, &run, true, Some("after-sink-pre-commit:4")));
    assert!(!status.success() && err.contains("crash point"), "the first restore did not crash: {err}");
    finish(&stack, &run);
    assert_equals_clean(&stack, &run, "restored twice");
}

/// Issue #17, item 6: a savepoint restored a second time, after a run restored from it
/// went on (it committed the savepoint's pending transactions, then initialised their
/// transactional ids again): the coordinator refuses to commit them once more, and the
/// restore finds in that run's checkpoints that it committed them, instead of failing with
/// "records are LOST". Nothing of the clean run's output is missing after either restore;
/// the second writes the savepoint's suffix again (what restoring one savepoint twice into
/// one topic means), nothing else.
#[test]
fn a_savepoint_restored_again_after_a_later_run_went_on_finds_its_transactions_committed() {
    let Some(stack) = stack() else { return };
    let clean = clean(&stack);
    let mut run = new_run(&stack, "savepoint-twice");
    let (status, err) = wait(spawn(&stack, &run, false, Some("after-metadata-before-notify:3")));
    assert_eq!(status.signal(), Some(9), "not killed after checkpoint 3: {err}");
    let out = Command::new(env!("CARGO_BIN_EXE_temperature"))
        .args(["savepoint", "--name", "at-3", "--checkpoint-dir"])
        .arg(run.ckpt.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "savepoint: {}", String::from_utf8_lossy(&out.stderr));
    let savepoint = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let first = finish(&stack, &run);
    assert!(first.contains("committed `"), "the first restore committed nothing: {first}");
    assert_equals(clean, &stack, &run, "restored from checkpoint 3");

    run.extra = vec!["--restore", Box::leak(savepoint.into_boxed_str())];
    let (status, second) = wait(spawn(&stack, &run, false, None));
    assert!(status.success(), "the second restore from the savepoint failed: {second}");
    assert!(
        second.contains("was committed by a later run that went on from this checkpoint"),
        "the second restore met no refused commit (the test did not test anything): {second}"
    );
    let got = published(&stack, &run);
    for (name, got, want) in [("readings", &got.0, &clean.0), ("windows", &got.1, &clean.1)] {
        let mut count = std::collections::BTreeMap::<&(Vec<u8>, Vec<u8>), usize>::new();
        for r in got {
            *count.entry(r).or_default() += 1;
        }
        let missing = want.iter().filter(|r| !count.contains_key(r)).count();
        let foreign = count.keys().filter(|r| want.binary_search(r).is_err()).count();
        let thrice = count.values().filter(|n| **n > 2).count();
        assert_eq!((missing, foreign, thrice), (0, 0, 0), "{name}: missing, foreign, written 3+ times");
        assert!(got.len() > want.len(), "{name}: the savepoint's suffix was not written again");
    }
}

/// Issue #17, item 2 (the sink side), against the broker: checkpoints fail (storage gone,
/// tolerated by `tolerable_failed_checkpoints`) while the Kafka sink's pre-committed
/// transactions wait for one to complete. Before the oldest could outlive
/// `transaction.timeout.ms` (and be aborted by the broker, its records lost) the sink fails
/// the job at a barrier; the restore, with the storage back, writes exactly the clean run's
/// output. The timeout is set just above what a checkpoint cycle needs (interval 0.1 s +
/// checkpoint timeout 2 s + 120 s restart allowance = 122.1 s): 126 s leaves a pending
/// transaction 3.9 s.
#[test]
fn a_kafka_transaction_that_could_outlive_its_timeout_fails_the_job_before_the_broker_aborts_it() {
    let Some(stack) = stack() else { return };
    clean(&stack);
    let mut run = new_run(&stack, "txn-timeout");
    run.max_rate = Some("15000");
    run.extra = vec!["--transaction-timeout-secs", "126"];
    run.env =
        vec![("CAUDAL__CHECKPOINT_TIMEOUT_MS", "2000"), ("CAUDAL__TOLERABLE_FAILED_CHECKPOINTS", "100000")];
    let child = spawn(&stack, &run, false, None);
    let start = Instant::now();
    while !has_checkpoint(&run) {
        assert!(start.elapsed() < Duration::from_secs(30), "no checkpoint completed");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Storage gone: the job's checkpoint folder is moved away and a file takes its place.
    let job = run.ckpt.path().join("temperature");
    let saved = run.ckpt.path().join("temperature.saved");
    std::fs::rename(&job, &saved).unwrap();
    std::fs::write(&job, b"not a directory").unwrap();
    let broken = Instant::now();
    let (status, err) = wait(child);
    let failed_after = broken.elapsed();
    assert!(!status.success(), "the job went on: {err}");
    assert!(err.contains("is still not committed after"), "the sink did not fail the job: {err}");
    assert!(!err.contains("temperature: finished"), "{err}");
    assert!(
        failed_after > Duration::from_secs(3) && failed_after < Duration::from_secs(60),
        "failed {failed_after:?} after the storage broke (its transaction had 3.9 s)"
    );
    std::fs::remove_file(&job).unwrap();
    std::fs::rename(&saved, &job).unwrap();
    run.max_rate = None;
    finish(&stack, &run);
    assert_equals_clean(&stack, &run, "failed before a transaction timed out, restored");
}

/// Kills the job at random moments (at most `max_kills` times, each after `min_ms` plus
/// up to `spread_ms`), restoring each time; returns the number of kills.
fn kill_at_random(stack: &Stack, run: &Run, max_kills: usize, min_ms: u64, spread_ms: u64) -> usize {
    let mut seed = 0x5eed_u64;
    let mut kills = 0;
    for _ in 0..max_kills {
        let mut child = spawn(stack, run, has_checkpoint(run), None);
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let delay = Duration::from_millis(min_ms + (seed >> 33) % spread_ms);
        let start = Instant::now();
        while start.elapsed() < delay {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if child.try_wait().unwrap().is_some() {
            break; // finished before the kill
        }
        child.kill().unwrap(); // SIGKILL: mid-epoch, transactions open
        child.wait().unwrap();
        kills += 1;
    }
    kills
}

#[test]
fn killed_at_random_moments_mid_epoch() {
    let Some(stack) = stack() else { return };
    clean(&stack);
    // At most 100k readings/s: each run gets at most 90k of the 200k readings before its
    // kill, so the job cannot finish before the second kill on any machine.
    let run = Run { max_rate: Some("100000"), ..new_run(&stack, "random") };
    let kills = kill_at_random(&stack, &run, 5, 400, 500);
    assert!(kills >= 2, "the job finished too early to be killed ({kills} kills)");
    finish(&stack, &run);
    assert_equals_clean(&stack, &run, &format!("after {kills} kills"));
}

/// The chaos run of the issue: a million readings, 1-second checkpoints, five kills.
#[test]
fn chaos_a_million_readings_killed_five_times_equals_the_clean_run() {
    const MILLION: u64 = 1_000_000;
    let Some(stack) = stack() else { return };
    let input = produce(&stack, "chaos-in", MILLION);
    let clean = clean_run(&stack, &Run { input: input.clone(), ..new_run(&stack, "chaos-clean") }, MILLION);
    // At most 100k readings/s: a run killed within 1.6 s gets at most 160k readings further,
    // so five kills come before the end of the input however fast the machine is.
    let run = Run { input, checkpoint_interval: "1", max_rate: Some("100000"), ..new_run(&stack, "chaos") };
    let kills = kill_at_random(&stack, &run, 5, 1000, 600);
    assert_eq!(kills, 5, "the job finished before five kills");
    finish(&stack, &run);
    assert_equals(&clean, &stack, &run, &format!("chaos after {kills} kills"));
}

#[test]
fn a_transaction_timeout_shorter_than_a_checkpoint_cycle_fails_at_start_naming_both_settings() {
    let Some(stack) = stack() else { return };
    let run = new_run(&stack, "timeout");
    let out = Command::new(env!("CARGO_BIN_EXE_temperature"))
        .args(["--source", "kafka", "--input-topic", input(&stack), "--bounded"])
        .args(["--sink", "kafka", "--output-topic", &run.readings, "--windows-topic", &run.windows])
        .args(["--brokers", &stack.brokers, "--schema-registry", &stack.registry])
        .args(["--checkpoint-interval", "60", "--transaction-timeout-secs", "30", "--no-ui"])
        .arg("--checkpoint-dir")
        .arg(run.ckpt.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("transaction.timeout.ms") && err.contains("--checkpoint-interval"), "{err}");
    assert!(read_committed(&stack, &run.readings).is_empty());
}

#[test]
fn a_transaction_timeout_above_the_brokers_maximum_is_refused_naming_it() {
    let Some(stack) = stack() else { return };
    let run = new_run(&stack, "maxtimeout");
    // The test broker allows 1 hour.
    let out = Command::new(env!("CARGO_BIN_EXE_temperature"))
        .args(["--source", "kafka", "--input-topic", input(&stack), "--bounded"])
        .args(["--sink", "kafka", "--output-topic", &run.readings, "--windows-topic", &run.windows])
        .args(["--brokers", &stack.brokers, "--schema-registry", &stack.registry])
        .args(["--transaction-timeout-secs", "7200", "--no-ui"])
        .arg("--checkpoint-dir")
        .arg(run.ckpt.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    // The startup check read the broker's maximum: the error names both settings with
    // their values (the refusal at init_transactions could not say the broker's).
    assert!(err.contains("transaction.timeout.ms = 7200000 ms"), "{err}");
    assert!(err.contains("transaction.max.timeout.ms = 3600000 ms"), "{err}");
    assert!(err.contains("checked at start"), "{err}");
    // It failed before processing: nothing reached the output topics, not even a
    // transaction that was aborted.
    assert_eq!(end_offsets(&stack, &run.readings), [0, 0], "readings were written");
    assert_eq!(end_offsets(&stack, &run.windows), [0, 0], "windows were written");
}

/// The consumer group the temperature job's Kafka source commits its offsets to.
const SOURCE_GROUP: &str = "caudal-temperature-kafka-readings";

#[test]
fn the_source_commits_its_offsets_to_the_consumer_group_when_checkpoints_complete() {
    let Some(stack) = stack() else { return };
    let input = produce(&stack, "group-in", 20_000);
    let none = vec![None; PARTITIONS as usize];
    assert_eq!(committed_offsets(&stack, SOURCE_GROUP, &input), none, "a new topic has no offsets");
    // At most 20k readings/s: the job cannot finish before its first checkpoint.
    let run = Run { input, max_rate: Some("20000"), ..new_run(&stack, "group") };

    // Killed before its first checkpoint completed: nothing committed to the group.
    let (status, err) = wait(spawn(&stack, &run, false, Some("after-snapshot-before-ack:1")));
    assert_eq!(status.signal(), Some(9), "the job was not killed: {status} {err}");
    assert!(!has_checkpoint(&run), "checkpoint 1 completed");
    assert_eq!(committed_offsets(&stack, SOURCE_GROUP, &run.input), none, "committed before a checkpoint");

    // Run to the end: the last checkpoint's offsets are each partition's end offset.
    finish(&stack, &run);
    let ends: Vec<_> = end_offsets(&stack, &run.input).into_iter().map(Some).collect();
    assert!(ends.iter().all(|e| e.unwrap_or(0) > 0), "{ends:?}");
    assert_eq!(committed_offsets(&stack, SOURCE_GROUP, &run.input), ends, "committed offsets of the group");
}

/// Fences every open transaction of the sinks' transactional ids (`<prefix>-{readings,
/// windows}-<subtask>-<index>`), as another producer calling `init_transactions` with the
/// same id would; returns the ids fenced.
fn fence_open_transactions(stack: &Stack, prefix: &str) -> Vec<String> {
    let coordinator = TxnCoordinatorClient::new(&stack.brokers, Duration::from_secs(10));
    let mut fenced = Vec::new();
    for folder in ["readings", "windows"] {
        for subtask in 0..2 {
            for index in 0.. {
                let id = format!("{prefix}-{folder}-{subtask}-{index}");
                let Some(state) = coordinator.describe(&id).unwrap() else { break };
                if state.is_open() {
                    let producer: BaseProducer = ClientConfig::new()
                        .set("bootstrap.servers", &stack.brokers)
                        .set("transactional.id", &id)
                        .create()
                        .unwrap();
                    producer.init_transactions(Duration::from_secs(30)).unwrap();
                    fenced.push(id);
                }
            }
        }
    }
    fenced
}

/// A run at parallelism 3 is killed with transactions open in every subtask; a fresh
/// start at parallelism 1 (same transactional ids, no restore) aborts them all — also
/// those of subtasks 1 and 2, which it no longer has — so read_committed readers do not
/// wait for the broker's transaction timeout.
#[test]
fn a_smaller_fresh_start_aborts_what_a_larger_killed_run_left_open() {
    let Some(stack) = stack() else { return };
    let mut run = new_run(&stack, "shrink");
    run.parallelism = "3";
    run.max_rate = Some("20000");
    let coordinator = TxnCoordinatorClient::new(&stack.brokers, Duration::from_secs(10));
    let open = |subtask: u32| -> Vec<String> {
        let mut ids = Vec::new();
        for folder in ["readings", "windows"] {
            for index in 0.. {
                let id = format!("{}-{folder}-{subtask}-{index}", run.readings);
                let Some(state) = coordinator.describe(&id).unwrap() else { break };
                if state.is_open() {
                    ids.push(id);
                }
            }
        }
        ids
    };
    let mut child = spawn(&stack, &run, false, None);
    let started = std::time::Instant::now();
    while open(2).is_empty() {
        assert!(started.elapsed() < Duration::from_secs(60), "subtask 2 never had an open transaction");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    let (status, _) = wait(child);
    assert_eq!(status.signal(), Some(9));
    assert!(!open(1).is_empty() || !open(2).is_empty(), "the kill left nothing open");
    run.parallelism = "1";
    run.max_rate = None;
    let (status, err) = wait(spawn(&stack, &run, false, None));
    assert!(status.success(), "the fresh start failed: {err}");
    for subtask in 1..3 {
        assert_eq!(open(subtask), Vec::<String>::new(), "left open by subtask {subtask} of the killed run");
    }
}

#[test]
fn a_fenced_pending_transaction_fails_the_restore_saying_its_records_are_lost() {
    let Some(stack) = stack() else { return };
    let run = new_run(&stack, "fenced");
    // Checkpoint 3 is complete and lists its transactions as pending; none is committed.
    let (status, err) = wait(spawn(&stack, &run, false, Some("after-metadata-before-notify:3")));
    assert_eq!(status.signal(), Some(9), "the job was not killed: {status} {err}");
    let fenced = fence_open_transactions(&stack, &run.readings);
    assert!(!fenced.is_empty(), "no open transaction to fence");

    let (status, err) = wait(spawn(&stack, &run, true, None));
    assert!(!status.success(), "the restore went on with fenced transactions: {err}");
    assert!(err.contains("can no longer be committed") && err.contains("LOST"), "{err}");
    assert!(err.contains("of checkpoint 3"), "{err}");
    assert!(
        fenced.iter().any(|id| err.contains(&format!("`{id}`"))),
        "no fenced id named ({fenced:?}): {err}"
    );
    eprintln!("fenced {fenced:?}; the restore said: {err}");
}

/// Each distinct record with how many times it appears.
fn counts(records: &[(Vec<u8>, Vec<u8>)]) -> std::collections::HashMap<&(Vec<u8>, Vec<u8>), usize> {
    let mut counts = std::collections::HashMap::new();
    for r in records {
        *counts.entry(r).or_insert(0) += 1;
    }
    counts
}

#[test]
fn at_least_once_killed_and_restored_writes_every_record_at_least_once() {
    let Some(stack) = stack() else { return };
    let clean = clean(&stack);
    // Killed mid-epoch (records of the epoch already at the broker, replayed after the restore).
    let run = Run {
        extra: vec!["--delivery", "at-least-once"],
        max_rate: Some("100000"),
        ..new_run(&stack, "alo")
    };
    // Killed 300 ms after its first checkpoint completed (the start takes longer on a busy
    // machine than any fixed delay allows): records after it are at the broker, uncommitted.
    let mut child = spawn(&stack, &run, false, None);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !has_checkpoint(&run) && Instant::now() < deadline && child.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(has_checkpoint(&run), "no checkpoint within 60 s");
    std::thread::sleep(Duration::from_millis(300));
    assert!(child.try_wait().unwrap().is_none(), "the job finished before the kill");
    child.kill().unwrap();
    child.wait().unwrap();
    finish(&stack, &run);
    let got = published(&stack, &run);
    let outputs =
        [("readings", &got.0, &clean.0), ("windows", &got.1, &clean.1), ("alerts", &got.2, &clean.2)];
    for (name, got, want) in outputs {
        eprintln!("at-least-once {name}: {} records, the clean run {}", got.len(), want.len());
        let (got, want) = (counts(got), counts(want));
        let missing = want.iter().filter(|(r, n)| got.get(*r).copied().unwrap_or(0) < **n).count();
        assert_eq!(missing, 0, "at-least-once lost {missing} distinct {name} of the clean run");
        assert_eq!(got.len(), want.len(), "{name}: records the clean run does not have");
    }
}

#[test]
fn delivery_none_writes_the_records_of_a_clean_run() {
    let Some(stack) = stack() else { return };
    clean(&stack);
    let run = Run { extra: vec!["--delivery", "none"], ..new_run(&stack, "none") };
    let (status, err) = wait(spawn(&stack, &run, false, None));
    assert!(status.success(), "{err}");
    assert_equals_clean(&stack, &run, "delivery none");
}

//! Cluster mode end to end, with real processes on loopback and real SIGKILLs: a job
//! manager (`caudal jobmanager`), task managers (`caudal taskmanager`) and the temperature
//! job binary submitted to them (`caudal submit`). The committed output of a run that
//! loses a task manager, or its job manager, equals what the input implies (the generator's
//! model, `jobs/tests/common/oracle.rs`).
//!
//! The temperature binary is the one cargo builds next to `caudal` (`cargo test
//! --workspace` builds it; alone: `cargo build -p caudal-jobs --bin temperature`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cluster_support;
#[path = "../../jobs/tests/common/faulty_link.rs"]
mod faulty_link;
#[path = "../../jobs/tests/common/oracle.rs"]
mod oracle;
#[path = "../../jobs/tests/common/s3.rs"]
mod s3;

use cluster_support::*;
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// A bounded, throttled run (as in jobs/tests/recovery.rs): 20 sensors, 6,000 readings at
/// 1,500/s (~4 s), 1-second windows, checkpoints every 300 ms.
fn job_args(out: &Path) -> Vec<String> {
    let mut args: Vec<String> = oracle::RUN_ARGS
        .iter()
        .chain(&["--no-ui", "--silence-secs", "2", "--outage", "3:5:9", "--outage", "11:20:25.5"])
        .map(|s| s.to_string())
        .collect();
    args.extend(["--output".into(), out.display().to_string()]);
    args
}

/// The generator's model behind [`job_args`] (`jobs/tests/common/oracle.rs`).
const MODEL: oracle::Model = oracle::Model {
    outages: &[(3, 5_000, 9_000), (11, 20_000, 25_500)],
    silence_ms: Some(2_000),
    ..oracle::Model::RUN
};

/// [`job_args`] at 500 readings/s (~12 s): room for kills, pauses and outages mid-run.
fn slow_job_args(out: &Path) -> Vec<String> {
    let mut args = job_args(out);
    let rate = args.iter().position(|a| a == "--rate").unwrap() + 1;
    args[rate] = "25".into();
    args
}

/// What the job publishes, computed from the generator's model (`jobs/tests/common/oracle.rs`,
/// no engine code): (windows, readings), each sorted. The flags of [`job_args`].
fn expected() -> &'static (Vec<String>, Vec<String>) {
    static EXPECTED: std::sync::OnceLock<(Vec<String>, Vec<String>)> = std::sync::OnceLock::new();
    EXPECTED.get_or_init(|| oracle::expected(&MODEL))
}

/// The files a sink pre-committed and never published (`<dir>/<folder>/.inprogress/*.pending`).
fn unpublished(dir: &Path, folder: &str) -> Vec<String> {
    std::fs::read_dir(dir.join(folder).join(".inprogress"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".pending"))
        .collect()
}

fn assert_equals_expected(out: &Path, what: &str) {
    let (windows, readings) = expected();
    let got_w = published(out, "windows");
    let got_r = published(out, "readings");
    let dupes = |v: &[String]| v.windows(2).filter(|w| w[0] == w[1]).count();
    assert_eq!(got_r.len(), readings.len(), "{what}: readings: {} duplicates", dupes(&got_r));
    assert!(got_r == *readings, "{what}: readings differ from what the input implies");
    assert_eq!(got_w.len(), windows.len(), "{what}: windows: {} duplicates", dupes(&got_w));
    assert!(got_w == *windows, "{what}: windows differ from what the input implies");
    let (got_a, alerts) = (published(out, "alerts"), oracle::expected_alerts(&MODEL));
    assert_eq!(alerts.len(), 4, "two outages, a SILENT and a RECOVERED each");
    assert!(got_a == alerts, "{what}: alerts {got_a:?}, the outages imply {alerts:?}");
}

/// The issue's scenario: parallelism 4 over 3 task managers (the key_by shuffle crosses
/// processes), one task manager SIGKILLed mid-run; the job recovers on the remaining slots.
#[test]
fn a_killed_task_manager_is_recovered_from_and_the_output_equals_the_clean_run() {
    let mut c = Cluster::start(&[]);
    for tm in ["tm-1", "tm-2", "tm-3"] {
        c.start_taskmanager(tm, 2);
    }
    c.wait_for_task_managers(3);
    let out = c.dir.path().join("out");
    let o = c.submit(4, &job_args(&out));
    assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());
    let running = c.wait_job("temperature", 30, "running with a checkpoint", |j| {
        status(j) == "RUNNING" && j["last_checkpoint"].as_u64().is_some()
    });
    let placed = running["task_managers"].as_array().unwrap();
    assert_eq!(placed.len(), 3, "4 slots spread over the 3 task managers: {running:#}");
    let victim = placed[1].as_str().unwrap().to_string();
    let killed = Instant::now();
    c.kill_taskmanager(&victim);
    let attempt = running["attempt"].as_u64().unwrap();
    c.wait_job("temperature", 60, "running again", |j| {
        j["attempt"].as_u64() > Some(attempt) && (status(j) == "RUNNING" || status(j) == "FINISHED")
    });
    // A figure, not an assertion: detection, cancel, backoff, binary fetch, restore.
    eprintln!("task manager {victim} killed: running again after {:?}", killed.elapsed());
    let done = c.wait_job("temperature", 60, "FINISHED", |j| status(j) == "FINISHED");
    assert!(done["restarts"].as_u64().unwrap() >= 1, "{done:#}");
    let failures = done["failures"].as_array().unwrap();
    let cause = failures[0]["cause"].as_str().unwrap();
    assert!(cause.contains(&victim), "the failure names the lost task manager: {cause}");
    assert_ne!(done["task_managers"], running["task_managers"], "{done:#}");
    assert_equals_expected(&out, &format!("task manager {victim} killed"));
    // The executors' counters reach the job manager's REST API (and UI): every published
    // reading went through the readings sink of the last attempt.
    let metrics = c.get("/api/v1/jobs/temperature/metrics").unwrap();
    let sink =
        metrics["operators"].as_array().unwrap().iter().find(|o| o["name"] == "readings-sink").unwrap();
    assert!(sink["records_in"].as_u64().unwrap() > 0, "{sink:#} {done:#}{}", c.logs());
    // Bytes over the network: the key_by shuffle crosses processes, so the operator before
    // it sent serialized batches and the one after it received them; the file sinks' input
    // stays within a process (no bytes).
    let detail = c.get("/api/v1/jobs/temperature").unwrap();
    let ops = metrics["operators"].as_array().unwrap();
    let by_id = |id: &Value| ops.iter().find(|o| o["id"] == *id).unwrap();
    let hash = detail["edges"].as_array().unwrap().iter().find(|e| e["partitioning"] == "hash").unwrap();
    let (before, after) = (by_id(&hash["from"]), by_id(&hash["to"]));
    assert!(before["bytes_out"].as_u64().unwrap() > 0, "{before:#}");
    assert!(after["bytes_in"].as_u64().unwrap() > 0, "{after:#}");
    assert_eq!(sink["bytes_in"], 0, "{sink:#}");
    // Latency markers too: the executors' latency summaries are mirrored.
    let max = sink["latency"]["max_us"].as_u64();
    assert!(max.is_some_and(|m| m > 0), "no latency mirrored: {sink:#}");
    // The CLI shows the same.
    let list = c.cli(&["list", "--jobmanager", &c.url()]);
    let text = String::from_utf8_lossy(&list.stdout).to_string();
    assert!(list.status.success() && text.contains("FINISHED") && text.contains(&victim), "{text}");
}

/// Three task managers killed one after another (each replaced by a fresh one): the job
/// recovers each time and the output equals the clean run.
#[test]
fn task_managers_killed_one_after_another() {
    let mut c = Cluster::start(&[]);
    for tm in ["tm-1", "tm-2", "tm-3"] {
        c.start_taskmanager(tm, 1);
    }
    c.wait_for_task_managers(3);
    let out = c.dir.path().join("out");
    // Slower than the clean run (same records, same event times): room for three kills.
    let args = slow_job_args(&out);
    let o = c.submit(2, &args);
    assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());
    let mut last = 0;
    for kill in 1..=3 {
        let running = c.wait_job("temperature", 30, "running with a new checkpoint", |j| {
            status(j) == "RUNNING" && j["last_checkpoint"].as_u64().is_some_and(|n| n > last)
        });
        last = running["last_checkpoint"].as_u64().unwrap();
        let victim = running["task_managers"][0].as_str().unwrap().to_string();
        c.kill_taskmanager(&victim);
        c.start_taskmanager(&format!("tm-{}", 3 + kill), 1);
    }
    let done = c.wait_job("temperature", 60, "FINISHED", |j| status(j) == "FINISHED");
    assert!(done["restarts"].as_u64().unwrap() >= 3, "{done:#}");
    assert_equals_expected(&out, "three task managers killed");
}

/// Broadcast state across processes (#16): the temperature job with dynamic limits from a
/// file, at parallelism 4 over three task managers — the broadcast edge carries every
/// change to every subtask whichever executor runs it, and one task manager is killed
/// mid-run, so the broadcast state is restored too. The readings equal what the input and
/// the changes imply (each judged by its band's change in force at its time).
#[test]
fn limits_broadcast_to_every_executor_judge_the_readings_as_the_input_implies() {
    const LIMITS: [oracle::Limit; 3] = [
        oracle::Limit { band: "south", lat: (-90.0, 0.0), celsius: (-5.0, 30.0), from_ms: None },
        oracle::Limit { band: "north", lat: (0.0, 90.0), celsius: (0.0, 25.0), from_ms: Some(10_000) },
        oracle::Limit { band: "north", lat: (0.0, 90.0), celsius: (-10.0, 35.0), from_ms: Some(20_000) },
    ];
    let mut c = Cluster::start(&[]);
    for tm in ["tm-1", "tm-2", "tm-3"] {
        c.start_taskmanager(tm, 2);
    }
    c.wait_for_task_managers(3);
    let out = c.dir.path().join("out");
    let limits = c.dir.path().join("limits.jsonl");
    let lines: Vec<String> = LIMITS.iter().map(oracle::Limit::json).collect();
    std::fs::write(&limits, lines.join("\n") + "\nnot a change\n").unwrap();
    let mut args = slow_job_args(&out);
    args.extend(["--limits-file".to_string(), limits.display().to_string()]);
    let o = c.submit(4, &args);
    assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());
    let running = c.wait_job("temperature", 30, "running with a checkpoint", |j| {
        status(j) == "RUNNING" && j["last_checkpoint"].as_u64().is_some()
    });
    assert!(running["task_managers"].as_array().unwrap().len() > 1, "one process only: {running:#}");
    let victim = running["task_managers"][0].as_str().unwrap().to_string();
    c.kill_taskmanager(&victim);
    let done = c.wait_job("temperature", 90, "FINISHED", |j| status(j) == "FINISHED");
    assert!(done["restarts"].as_u64().unwrap() >= 1, "{done:#}");
    let model = oracle::Model { limits: &LIMITS, ..MODEL };
    let (windows, readings) = oracle::expected(&model);
    assert_ne!(readings.len(), expected().1.len(), "the limits change the outcome");
    let (got_r, got_w) = (published(&out, "readings"), published(&out, "windows"));
    assert_eq!(got_r.len(), readings.len(), "readings{}", c.logs());
    assert!(got_r == readings, "readings differ from what the input and the limits imply");
    assert!(got_w == windows, "windows differ from what the input and the limits imply");
    assert_eq!(published(&out, "rejected-limits").len(), 1, "the bad line, dead-lettered once");
}

/// An executor aborts after a snapshot, before its ack (checkpoint 3 is being aligned
/// across processes): the job restarts and the output equals the clean run.
#[test]
fn an_executor_crashing_inside_a_checkpoint() {
    let mut c = Cluster::start(&[]);
    c.start_taskmanager("tm-1", 1);
    c.start_taskmanager_with_env("tm-2", 1, &[("CAUDAL__TEST_CRASH_AT", "after-snapshot-before-ack:3")]);
    c.wait_for_task_managers(2);
    let out = c.dir.path().join("out");
    let o = c.submit(2, &job_args(&out));
    assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());
    let failed =
        c.wait_job("temperature", 30, "failed once", |j| !j["failures"].as_array().unwrap().is_empty());
    let cause = failed["failures"][0]["cause"].as_str().unwrap().to_string();
    assert!(cause.contains("tm-2"), "the crash point was not reached: {failed:#}{}", c.logs());
    assert!(c.logs().contains("crash point after-snapshot-before-ack at checkpoint 3"), "{}", c.logs());
    // Checkpoint 3 never completed, so a restarted attempt takes a checkpoint 3 again (and
    // its executors on tm-2 would crash again): replace tm-2 by a task manager without it.
    c.kill_taskmanager("tm-2");
    c.start_taskmanager("tm-3", 1);
    c.wait_job("temperature", 60, "FINISHED", |j| status(j) == "FINISHED");
    assert_equals_expected(&out, "executor crashed inside checkpoint 3");
}

/// An executor killed while its sink commits the final checkpoint, at the end of the bounded
/// input (#43): the job manager tells the executors which checkpoint is the final one, so
/// the crash point `during-sink-commit:final` fires there; the job restarts from that
/// complete checkpoint, its restore commits what the dead executor had not, and the output
/// equals the clean run.
#[test]
fn an_executor_killed_while_committing_the_final_checkpoint() {
    let mut c = Cluster::start(&[]);
    c.start_taskmanager("tm-1", 1);
    c.start_taskmanager_with_env("tm-2", 1, &[("CAUDAL__TEST_CRASH_AT", "during-sink-commit:final")]);
    c.wait_for_task_managers(2);
    let out = c.dir.path().join("out");
    let o = c.submit(2, &job_args(&out));
    assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());
    let failed = c.wait_job("temperature", 60, "failed once or finished", |j| {
        !j["failures"].as_array().unwrap().is_empty() || status(j) == "FINISHED"
    });
    let cause = failed["failures"][0]["cause"].as_str().unwrap().to_string();
    assert!(cause.contains("tm-2"), "the crash point was not reached: {failed:#}{}", c.logs());
    assert!(c.logs().contains("crash point during-sink-commit at checkpoint"), "{}", c.logs());
    // A restarted attempt takes a final checkpoint again: without the crash point this time.
    c.kill_taskmanager("tm-2");
    c.start_taskmanager("tm-3", 1);
    c.wait_job("temperature", 60, "FINISHED", |j| status(j) == "FINISHED");
    assert_equals_expected(&out, "executor killed while committing the final checkpoint");
}

/// The file sink's directory seen by two task managers as two different directories (a
/// relative path, each task manager working in its own: hosts that share no storage), which
/// would lose output at the first failover (#43): the job fails at once, at its first
/// completed checkpoint, naming the directory and the cause, without restarts.
#[test]
fn a_file_sink_directory_the_hosts_do_not_share_fails_the_job_naming_it() {
    let mut c = Cluster::start(&[]);
    c.start_taskmanager_in_own_directory("tm-1", 1);
    c.start_taskmanager_in_own_directory("tm-2", 1);
    c.wait_for_task_managers(2);
    let o = c.submit(2, &job_args(Path::new("own-disk-out")));
    assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());
    let failed = c.wait_job("temperature", 60, "FAILED", |j| status(j) == "FAILED");
    let detail = failed["detail"].as_str().unwrap();
    assert!(detail.contains("own-disk-out") && detail.contains("is not shared by the hosts"), "{failed:#}");
    assert_eq!(failed["restarts"].as_u64(), Some(0), "{failed:#}");
}

/// `caudal savepoint` while the job runs; `caudal stop --savepoint` takes a final checkpoint,
/// copies it to a savepoint and ends the job; `submit --restore savepoints/final` continues
/// from it (here at another parallelism) to the clean run's output.
#[test]
fn savepoints_of_a_cluster_job_and_a_stopped_job_resumed_from_its_final_savepoint() {
    let mut c = Cluster::start(&[]);
    c.start_taskmanager("tm-1", 2);
    c.start_taskmanager("tm-2", 1);
    c.wait_for_task_managers(2);
    let out = c.dir.path().join("out");
    let args = slow_job_args(&out);
    let o = c.submit(2, &args);
    assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());
    c.wait_job("temperature", 30, "running with a checkpoint", |j| {
        status(j) == "RUNNING" && j["last_checkpoint"].as_u64().is_some()
    });
    // A savepoint while it runs: `caudal savepoint` waits and prints the restore path.
    let o = c.cli(&["savepoint", "temperature", "--name", "mid-run", "--jobmanager", &c.url()]);
    assert!(o.status.success(), "{}{}", stderr(&o), c.logs());
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "savepoints/mid-run");
    let savepoints = c.dir.path().join("ckpt/temperature/savepoints");
    assert!(savepoints.join("mid-run/_metadata").exists());
    let o = c.cli(&["savepoint", "temperature", "--name", "mid-run", "--jobmanager", &c.url()]);
    assert!(!o.status.success() && stderr(&o).contains("already requested"), "{}", stderr(&o));
    let o = c.cli(&["stop", "temperature", "--savepoint", "../bad", "--jobmanager", &c.url()]);
    assert!(!o.status.success() && stderr(&o).contains("savepoint name"), "{}", stderr(&o));
    let o = c.cli(&["stop", "temperature", "--savepoint", "final", "--wait", "--jobmanager", &c.url()]);
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success() && text.contains("resume with --restore latest"), "{text}{}", stderr(&o));
    assert!(text.contains("--restore savepoints/final"), "{text}");
    assert!(savepoints.join("final/_metadata").exists());
    // The stop committed its final checkpoint before the tasks closed (#17 item 4: `Stop`
    // went out before `CheckpointComplete(final)`, and the last epoch stayed pre-committed).
    for folder in ["readings", "windows"] {
        let left = unpublished(&out, folder);
        assert!(left.is_empty(), "{folder}: the final checkpoint's epoch was not published: {left:?}");
    }
    let partial = published(&out, "readings");
    assert!(
        !partial.is_empty() && partial.len() < expected().1.len(),
        "stopped mid-run: {} readings",
        partial.len()
    );
    let foreign = partial.iter().filter(|r| expected().1.binary_search(r).is_err()).count();
    let dups = partial.windows(2).filter(|w| w[0] == w[1]).count();
    assert_eq!((foreign, dups), (0, 0), "stopped: readings the input does not imply, duplicates");
    let o = Command::new(caudal())
        .arg("submit")
        .arg(temperature())
        .args(["--jobmanager", &c.url(), "--parallelism", "3", "--restore", "savepoints/final", "--wait"])
        .arg("--")
        .args(job_args(&out))
        .output()
        .unwrap();
    assert!(o.status.success(), "resume failed: {}{}", stderr(&o), c.logs());
    assert_equals_expected(&out, "stopped, then resumed at parallelism 3");
}

/// `(subtask, count)` of the open window of `sensor`, looked up through the job manager;
/// `None` while it has no state (or the job is restarting).
fn window_count(c: &Cluster, op: &str, sensor: u32) -> Option<(u64, u64)> {
    let (code, v) = c.get_any(&format!("{op}?key={sensor}"));
    if code != 200 {
        return None;
    }
    let w = &v["entries"][0]["value"]["windows"][0];
    assert_eq!(v["entries"][0]["state"], "window", "{v}");
    assert!(w["accumulator"]["min"].as_f64() <= w["accumulator"]["max"].as_f64(), "{v}");
    Some((v["subtask"].as_u64().unwrap(), w["accumulator"]["count"].as_u64().unwrap()))
}

/// [`window_count`] of sensors 0 to 19, once every one has a reading.
fn every_window(c: &Cluster, op: &str, what: &str) -> Vec<(u64, u64)> {
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let all: Option<Vec<_>> = (0..20).map(|s| window_count(c, op, s)).collect();
        if let Some(all) = all.filter(|a| a.iter().all(|(_, n)| *n > 0)) {
            return all;
        }
        let last = c.get_any(&format!("{op}?key=0"));
        assert!(
            Instant::now() < deadline,
            "{what}: not every sensor has state (sensor 0: {last:?}){}",
            c.logs()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// The state browser of a cluster job: the job manager forwards lookups, listings and sizes
/// to the executors that own the key groups (two task managers, the window operator's two
/// subtasks in two processes), live while the job runs and again after a task manager is
/// killed and the job restarted elsewhere.
#[test]
fn the_state_of_a_cluster_job_is_browsed_through_the_job_manager() {
    let mut c = Cluster::start(&[]);
    c.start_taskmanager("tm-1", 1);
    c.start_taskmanager("tm-2", 1);
    c.start_taskmanager("tm-3", 1);
    c.wait_for_task_managers(3);
    let out = c.dir.path().join("out");
    // 20 sensors, 40 readings/s each, hour-long windows: nothing fires while the test looks.
    let mut args = job_args(&out);
    for (flag, value) in [("--records", "10000000"), ("--rate", "40"), ("--window-secs", "3600")] {
        let i = args.iter().position(|a| a == flag).unwrap() + 1;
        args[i] = value.into();
    }
    let o = c.submit(2, &args);
    assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());
    let running = c.wait_job("temperature", 30, "running", |j| status(j) == "RUNNING");
    let op = "/api/v1/jobs/temperature/operators/window-stats/state";

    // The overview: the window operator and the silence detector (a keyed process
    // function), two subtasks each over every key group.
    let overview = c.get("/api/v1/jobs/temperature/state").unwrap();
    let keyed = overview["operators"].as_array().unwrap();
    let names: Vec<&str> = keyed.iter().filter_map(|o| o["operator"].as_str()).collect();
    assert_eq!(names.len(), 2, "{overview:#}");
    assert!(names.contains(&"window-stats") && names.contains(&"silence-alerts"), "{overview:#}");
    let window = keyed.iter().find(|o| o["operator"] == "window-stats").unwrap();
    let subtasks = window["subtasks"].as_array().unwrap().clone();
    assert_eq!(subtasks.len(), 2, "{overview:#}");
    assert_eq!(
        (subtasks[0]["key_group_start"].as_u64(), subtasks[1]["key_group_end"].as_u64()),
        (Some(0), Some(128))
    );
    // Every sensor's open window, from both processes; counts grow (live state).
    let first = every_window(&c, op, "first look");
    let owners: std::collections::BTreeSet<u64> = first.iter().map(|(s, _)| *s).collect();
    assert_eq!(owners, [0, 1].into(), "the sensors' key groups are owned by both subtasks: {first:?}");
    std::thread::sleep(std::time::Duration::from_millis(600));
    let later = every_window(&c, op, "second look");
    assert!(later.iter().zip(&first).any(|(b, a)| b.1 > a.1), "no window grew: {first:?} {later:?}");
    // Sizes gather both executors' key groups; a key group's page comes from its owner.
    let sizes = c.get(&format!("{op}/sizes")).unwrap();
    assert_eq!(sizes["entries"], 20, "{sizes:#}");
    let groups = sizes["key_groups"].as_array().unwrap();
    let on_1 = groups.iter().find(|g| g["subtask"] == 1 && g["entries"].as_u64() > Some(0)).unwrap();
    let page = c.get(&format!("{op}/keys?key_group={}", on_1["key_group"])).unwrap();
    assert_eq!(page["subtask"], 1, "{page:#}");
    assert_eq!(page["entries"].as_array().unwrap().len() as u64, on_1["entries"].as_u64().unwrap());
    // The silence detector's state of a sensor: its last reading's time, decoded, and the
    // event-time timer due a silence after it.
    let silence = c.get("/api/v1/jobs/temperature/operators/silence-alerts/state?key=4").unwrap();
    let entries = silence["entries"].as_array().unwrap();
    let last_seen = entries.iter().find(|e| e["state"] == "last-seen").expect("last-seen");
    assert_eq!(last_seen["key"], 4, "{silence:#}");
    assert!(last_seen["value"].as_i64().is_some_and(|t| t > 1_700_000_000_000), "{silence:#}");
    let timer = entries.iter().find(|e| e["state"] == "_timer.event").expect("the timer");
    assert_eq!(timer["value"]["timer"], "event time", "{silence:#}");
    // Bad input: a key without state, a key group out of range.
    let (code, v) = c.get_any(&format!("{op}?key=999"));
    assert_eq!(code, 404, "{v}");
    let (code, v) = c.get_any(&format!("{op}/keys?key_group=500"));
    assert_eq!(code, 400, "{v}");

    // A task manager dies: the job restarts on the others and is browsable again.
    let victim = running["task_managers"][0].as_str().unwrap().to_string();
    c.kill_taskmanager(&victim);
    let attempt = running["attempt"].as_u64().unwrap();
    c.wait_job("temperature", 60, "running again", |j| {
        j["attempt"].as_u64() > Some(attempt) && status(j) == "RUNNING"
    });
    every_window(&c, op, "after the restart");

    let o = c.cli(&["cancel", "temperature", "--jobmanager", &c.url()]);
    assert!(o.status.success(), "{}{}", stderr(&o), c.logs());
    c.wait_job("temperature", 30, "CANCELED", |j| status(j) == "CANCELED");
    let (code, v) = c.get_any(&format!("{op}?key=1"));
    assert_eq!(code, 409, "a cancelled job's state is not browsable: {v}");
}

#[test]
fn a_killed_job_manager_is_restarted_and_resumes_the_job() {
    let mut c = Cluster::start(&[]);
    c.start_taskmanager("tm-1", 1);
    c.start_taskmanager("tm-2", 1);
    c.wait_for_task_managers(2);
    let out = c.dir.path().join("out");
    let o = c.submit(2, &job_args(&out));
    assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());
    c.wait_job("temperature", 30, "running with a checkpoint", |j| {
        status(j) == "RUNNING" && j["last_checkpoint"].as_u64().is_some()
    });
    c.kill_jobmanager();
    c.start_jobmanager();
    let done = c.wait_job("temperature", 60, "FINISHED", |j| status(j) == "FINISHED");
    assert!(done["detail"].is_string(), "{done:#}");
    assert_equals_expected(&out, "job manager killed and restarted");

    // Killed again after the job ended: the next job manager lists it as it ended and does
    // not run it again (the soak once killed it in that moment and found no job at all).
    c.kill_jobmanager();
    c.start_jobmanager();
    let listed = c.wait_job("temperature", 30, "listed", |_| true);
    assert_eq!(status(&listed), "FINISHED", "{listed:#}");
    assert_eq!(listed["last_checkpoint"], done["last_checkpoint"], "{listed:#}");
    let o = c.cli(&["cancel", "temperature", "--jobmanager", &c.url()]);
    assert!(
        !o.status.success() && stderr(&o).contains("already ended"),
        "cancel of an ended job: {}",
        stderr(&o)
    );
    std::thread::sleep(std::time::Duration::from_secs(2));
    let still = c.job("temperature").unwrap();
    assert_eq!((status(&still), &still["attempt"]), ("FINISHED", &done["attempt"]), "{}", c.logs());
    let logs = c.logs();
    assert_eq!(logs.matches("resuming job `temperature`").count(), 1, "resumed once only:\n{logs}");
    assert_equals_expected(&out, "job manager restarted after the job ended");
}

/// The coordinator's crash points armed in the job manager of a cluster job (#12): it
/// SIGKILLs itself after every task acked checkpoint 3 (before the metadata) or after the
/// metadata is durable (before any task was told); restarted with the same data directory,
/// it resumes the job from the latest checkpoint — 2, or 3 with its pending epoch published
/// now — and the output is what the input implies.
#[test]
fn the_job_manager_killed_at_its_coordinators_crash_points_resumes_the_job_exactly() {
    for point in ["before-metadata", "after-metadata-before-notify"] {
        let mut c = Cluster::start(&[]);
        c.kill_jobmanager();
        c.jm_env = vec![("CAUDAL__TEST_CRASH_AT".into(), format!("{point}:3"))];
        c.start_jobmanager();
        c.start_taskmanager("tm-1", 1);
        c.start_taskmanager("tm-2", 1);
        c.wait_for_task_managers(2);
        let out = c.dir.path().join("out");
        let o = c.submit(2, &job_args(&out));
        assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());
        let exit = c.wait_jobmanager_exit(30);
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&exit), Some(9), "{point}: {exit}");
        assert!(
            c.logs().contains(&format!("crash point {point} at checkpoint 3")),
            "{point}: the job manager died elsewhere:{}",
            c.logs()
        );
        c.jm_env.clear();
        c.start_jobmanager();
        let done = c.wait_job("temperature", 60, "FINISHED", |j| status(j) == "FINISHED");
        assert!(done["detail"].is_string(), "{done:#}");
        assert_equals_expected(&out, &format!("job manager killed at {point} of checkpoint 3"));
    }
}

/// A task manager paused with its executor (SIGSTOP: a long GC pause, a frozen VM), declared
/// dead by the job manager, the job recovered on other slots — then resumed (SIGCONT) while
/// the job runs on (#12): the old attempt's executor must write nothing that counts. It
/// finds its control connection gone and exits; what it could still do (publish an epoch
/// whose completion it had queued) names the same files the new attempt publishes from its
/// checkpoint, and publishing never overwrites. The output is what the input implies.
#[test]
fn a_paused_task_manager_resumed_after_the_job_moved_on_writes_nothing_that_counts() {
    let mut c = Cluster::start(&[]);
    for tm in ["tm-1", "tm-2", "tm-3"] {
        c.start_taskmanager(tm, 1);
    }
    c.wait_for_task_managers(3);
    let out = c.dir.path().join("out");
    let args = slow_job_args(&out);
    let o = c.submit(2, &args);
    assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());
    let running = c.wait_job("temperature", 30, "running with a checkpoint", |j| {
        status(j) == "RUNNING" && j["last_checkpoint"].as_u64().is_some()
    });
    let victim = running["task_managers"][0].as_str().unwrap().to_string();
    c.pause_until_the_job_moved_on("temperature", &victim, &running);
    let done = c.wait_job("temperature", 60, "FINISHED", |j| status(j) == "FINISHED");
    assert!(done["restarts"].as_u64().unwrap() >= 1, "{done:#}");
    assert_equals_expected(&out, &format!("task manager {victim} paused and resumed"));
}

#[test]
fn a_job_that_always_fails_ends_failed_with_its_cause_after_the_restart_cap() {
    let c = {
        let mut c = Cluster::start(&["--max-restarts", "2"]);
        c.start_taskmanager("tm-1", 1);
        c.wait_for_task_managers(1);
        c
    };
    // The file sink cannot create its directory under a regular file: every attempt fails.
    let blocker = c.dir.path().join("not-a-dir");
    std::fs::write(&blocker, b"x").unwrap();
    let o = c.submit(1, &job_args(&blocker.join("out")));
    assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());
    let failed = c.wait_job("temperature", 30, "FAILED", |j| status(j) == "FAILED");
    let detail = failed["detail"].as_str().unwrap();
    assert!(detail.contains("failed after 2 restarts") && detail.contains("not-a-dir"), "{detail}");
    let failures = failed["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 3, "{failed:#}");
    assert!(failures.iter().all(|f| f["cause"].as_str().unwrap().contains("output directory")), "{failed:#}");
    // The task manager's slot is free again.
    let info = c.get("/api/v1/cluster").unwrap();
    assert_eq!(info["slots_free"], 1, "{info:#}");
}

/// An error no restart can mend fails the job at once, with its cause: a database role the
/// server does not know is refused at every attempt (before #43 a task rewrapped every
/// operator's error as retryable, and the job went through the whole restart cap).
#[test]
fn a_refused_database_role_fails_the_job_at_once_without_restarts() {
    let Some(pg) = caudal_test_stack::service("CAUDAL_POSTGRES_URL") else { return };
    let (scheme, rest) = pg.split_once("://").unwrap();
    let host = rest.split_once('@').map_or(rest, |(_, host)| host);
    let refused = format!("{scheme}://caudal_no_such_role@{host}");
    let c = {
        let mut c = Cluster::start(&["--max-restarts", "5"]);
        c.start_taskmanager("tm-1", 1);
        c.wait_for_task_managers(1);
        c
    };
    let out = c.dir.path().join("out");
    let mut args = job_args(&out);
    args.extend(["--postgres".into(), refused]);
    let o = c.submit(1, &args);
    assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());
    let failed = c.wait_job("temperature", 60, "FAILED", |j| status(j) == "FAILED");
    let detail = failed["detail"].as_str().unwrap();
    assert!(detail.contains("not retryable") && detail.contains("caudal_no_such_role"), "{detail}");
    assert_eq!(failed["restarts"].as_u64(), Some(0), "{failed:#}");
    assert_eq!(failed["failures"].as_array().unwrap().len(), 1, "{failed:#}");
}

#[test]
fn bad_submissions_are_clear_errors_and_the_cluster_keeps_running() {
    let mut c = Cluster::start(&[]);
    // No task manager yet.
    let out = c.dir.path().join("out");
    let o = c.submit(1, &job_args(&out));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no task manager is registered"), "{}", stderr(&o));
    c.start_taskmanager("tm-1", 2);
    c.wait_for_task_managers(1);
    // Not a Caudal job.
    let o = c.cli(&["submit", "/bin/true", "--jobmanager", &c.url()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("not a Caudal job binary"), "{}", stderr(&o));
    // Not even an executable: refused before anything is uploaded.
    let script = c.dir.path().join("job.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    let o = c.cli(&["submit", script.to_str().unwrap(), "--jobmanager", &c.url()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("is not an executable"), "{}", stderr(&o));
    // A raw upload of 64 MiB that is no executable: refused with the reason, nothing stored.
    let junk = vec![0u8; 64 << 20];
    let sha = {
        use sha2::Digest;
        sha2::Sha256::digest(&junk).iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    let mut r = c
        .agent
        .put(format!("{}/api/v1/cluster/blobs/{sha}", c.url()))
        .content_type("application/octet-stream")
        .send(&junk[..])
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let body: Value = r.body_mut().read_json().unwrap();
    assert!(body["error"].as_str().unwrap().contains("not an executable"), "{body}");
    let stored: Vec<_> = std::fs::read_dir(c.dir.path().join("jm").join("blobs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(&sha))
        .collect();
    assert!(stored.is_empty(), "{stored:?}");
    // More parallelism than slots.
    let o = c.submit(3, &job_args(&out));
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("needs 3 slots") && e.contains("the cluster has 2 slots"), "{e}");
    // Nothing to restore.
    let temp = temperature();
    let o = c.cli(&["submit", temp.to_str().unwrap(), "--jobmanager", &c.url(), "--restore", "latest"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no completed checkpoint"), "{}", stderr(&o));
    // An unreachable job manager.
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let o = c.cli(&["list", "--jobmanager", &nowhere]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains(&format!("cannot reach the job manager at {nowhere}")), "{}", stderr(&o));
    // The cluster still runs: the task manager is there, no job was created.
    let info = c.get("/api/v1/cluster").unwrap();
    assert_eq!(info["task_managers"].as_array().unwrap().len(), 1);
    let list = c.cli(&["list", "--jobmanager", &c.url()]);
    assert!(list.status.success());
    assert_eq!(String::from_utf8_lossy(&list.stdout), "no jobs\n");
}

#[test]
fn a_job_binary_prints_its_plan() {
    let o = Command::new(temperature())
        .args(["--caudal-plan", "--parallelism", "3", "--no-ui"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["caudal_plan"], 1);
    assert_eq!(doc["plan"]["job"], "temperature");
    let ops = doc["plan"]["operators"].as_array().unwrap();
    assert!(ops.iter().any(|o| o["name"] == "window-stats" && o["parallelism"] == 3), "{doc:#}");
    assert_eq!(doc["checkpoints"]["interval_ms"], 60_000);
}

/// Checkpoint storage (S3) unreachable while a cluster job runs: the attempt fails at
/// its first failed checkpoint (tolerable 0); while the storage is away the job manager's
/// listing of the checkpoints and the executors' restores fail too — retryable, so the job
/// manager restarts with backoff rather than failing the job for good — and once it is back
/// the job restores and finishes with what the input implies.
#[test]
fn a_checkpoint_storage_outage_is_retried_by_the_job_manager_until_the_storage_is_back() {
    let Some(s3) = s3::env() else { return };
    let endpoint = &s3.iter().find(|(k, _)| *k == "CAUDAL__S3__ENDPOINT").unwrap().1;
    let link = faulty_link::FaultyLink::to(endpoint.trim_start_matches("http://").trim_end_matches('/'));
    let mut env: Vec<(&str, String)> =
        s3.iter().filter(|(k, _)| *k != "CAUDAL__S3__ENDPOINT").cloned().collect();
    env.push(("CAUDAL__S3__ENDPOINT", link.url()));
    let url = s3::unique_url("cluster-outage");
    let mut c = Cluster::start_with(&[], Some(&url), &env);
    c.start_taskmanager("tm-1", 2);
    c.start_taskmanager("tm-2", 2);
    c.wait_for_task_managers(2);
    let out = c.dir.path().join("out");
    let args = slow_job_args(&out);
    let o = c.submit(2, &args);
    assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());
    c.wait_job("temperature", 30, "running with a checkpoint", |j| {
        status(j) == "RUNNING" && j["last_checkpoint"].as_u64().is_some()
    });
    // Away until an attempt after the first failure met the outage too (the S3 client's own
    // retries absorb a short one): the job manager must retry that, not fail the job.
    link.cut();
    c.wait_job("temperature", 60, "a second attempt failing on the outage", |j| {
        j["failures"].as_array().is_some_and(|f| f.len() >= 2)
    });
    link.restore();
    let done = c.wait_job("temperature", 90, "FINISHED", |j| status(j) == "FINISHED");
    let causes: Vec<&str> =
        done["failures"].as_array().unwrap().iter().filter_map(|f| f["cause"].as_str()).collect();
    // The checkpoint that failed, then at least one attempt that met the outage (the job
    // manager's listing or an executor's restore): retried, not the end of the job.
    assert!(causes.len() >= 2, "{done:#}");
    assert!(causes.iter().skip(1).all(|c| c.contains("checkpoint storage")), "{causes:#?}");
    assert_equals_expected(&out, "a checkpoint storage outage in a cluster job");
    eprintln!("restarts {}; causes: {causes:#?}", done["restarts"]);
    caudal_checkpoints::store::delete_dir(&s3::store(&url, &s3), "").unwrap();
}

/// The job manager's REST API under random requests (#43): paths made of its own words
/// and of junk, query strings, methods, content types and bodies (JSON-like or bytes), with
/// a job running. Every answer is below 500, and afterwards the job manager still answers
/// and the job still runs. The seed is printed; `CAUDAL_FUZZ_SEED` replays a run.
#[test]
fn random_requests_to_the_job_manager_never_get_a_server_error() {
    let mut c = Cluster::start(&[]);
    c.start_taskmanager("tm-1", 2);
    c.wait_for_task_managers(1);
    let out = c.dir.path().join("out");
    let o = c.submit(1, &slow_job_args(&out));
    assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());
    c.wait_job("temperature", 30, "RUNNING", |j| status(j) == "RUNNING");
    let seed: u64 =
        std::env::var("CAUDAL_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
        });
    eprintln!("fuzzing the job manager with CAUDAL_FUZZ_SEED={seed}");
    let mut x = seed;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    const WORDS: [&str; 14] = [
        "api",
        "v1",
        "cluster",
        "jobs",
        "blobs",
        "temperature",
        "state",
        "operators",
        "savepoints",
        "metrics",
        "kafka",
        "transactions",
        "checkpoints",
        "login",
    ];
    let junk = |n: u64| -> String {
        match n % 4 {
            0 => "%00%ff..%2f".into(),
            1 => format!("{:064x}", n),
            2 => "a".repeat((n % 300) as usize),
            _ => "..".into(),
        }
    };
    for i in 0..300 {
        let depth = 1 + next() % 6;
        let mut segments: Vec<String> = vec!["api".into(), "v1".into()];
        for _ in 0..depth {
            let n = next();
            segments.push(if n % 3 == 0 {
                junk(next())
            } else {
                WORDS[(n % WORDS.len() as u64) as usize].into()
            });
        }
        if segments.iter().any(|s| s == "cancel" || s == "stop") {
            continue; // would end the job by design
        }
        let method = ["GET", "POST", "PUT", "DELETE", "PATCH"][(next() % 5) as usize];
        let content_type =
            ["application/json", "text/plain", "application/octet-stream", ""][(next() % 4) as usize];
        let body: Vec<u8> = match next() % 4 {
            0 => Vec::new(),
            1 => br#"{"binary_sha256":"00","args":["--x"],"parallelism":0,"restore":"../../etc"}"#.to_vec(),
            2 => (0..next() % 512).map(|_| next() as u8).collect(),
            _ => b"{\"name\": [1, {\"a\": null}], \"parallelism\": -1}".to_vec(),
        };
        let query = if next() % 2 == 0 {
            format!("?offset={}&limit=-1&key=%zz", next() % 1000)
        } else {
            String::new()
        };
        let url = format!("{}/{}{query}", c.url(), segments.join("/"));
        let mut b = ureq::http::Request::builder().method(method).uri(&url);
        if !content_type.is_empty() {
            b = b.header("Content-Type", content_type);
        }
        let Ok(req) = b.body(body) else { continue };
        let status = match c.agent.run(req) {
            Ok(r) => r.status().as_u16(),
            Err(e) => panic!("request {i} {method} {url}: {e} (CAUDAL_FUZZ_SEED={seed})"),
        };
        assert!(
            status < 500,
            "request {i} {method} {url} ({content_type}): {status} (CAUDAL_FUZZ_SEED={seed})"
        );
    }
    let info = c.get("/api/v1/cluster").expect("the job manager answers after the random requests");
    assert_eq!(info["task_managers"].as_array().unwrap().len(), 1, "{info:#}");
    let job = c.wait_job("temperature", 5, "still running", |j| status(j) == "RUNNING");
    assert_eq!(job["restarts"].as_u64(), Some(0), "{job:#}");
}

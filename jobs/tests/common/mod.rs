//! Helpers of the temperature job's process-level tests: run the binary on a bounded,
//! throttled input with checkpoints, kill it, restore it, compare its published output
//! with what the input implies (`oracle.rs`, computed without the engine).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod faulty_link;
pub mod frozen;
pub mod oracle;
pub mod s3;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

/// The silence and outages of [`BASE_MODEL`]: three outages alert, sensor 7's is too short.
pub const ALERT_ARGS: [&str; 10] = [
    "--silence-secs",
    "2",
    "--outage",
    "3:5:9",
    "--outage",
    "7:12:13",
    "--outage",
    "9:20:25.5",
    "--outage",
    "3:15:18",
];

/// A bounded, throttled run: 20 sensors, 6,000 readings at 1,500/s (~4 s), 1-second
/// windows of event time, checkpoints every 300 ms; four outages (sensor 7's too short to
/// alert) and silent-sensor alerts after 2 s of event time.
pub fn base_args(out: &Path, ckpt: &Path, parallelism: u32) -> Vec<String> {
    ALERT_ARGS
        .iter()
        .chain(&oracle::RUN_ARGS)
        .chain(&["--no-ui"])
        .map(|s| s.to_string())
        .chain([
            "--output".into(),
            out.display().to_string(),
            "--checkpoint-dir".into(),
            ckpt.display().to_string(),
            "--parallelism".into(),
            parallelism.to_string(),
            // In the test's temp dir: a SIGKILLed job's RocksDB files go with it.
            "--state-dir".into(),
            out.with_file_name("state").display().to_string(),
        ])
        .collect()
}

pub fn spawn(args: &[String], restore: bool, env: &[(&str, String)]) -> Child {
    spawn_with(args, restore.then_some("latest"), env)
}

/// Starts the job, restoring from `restore` (`latest`, `chk-N`, `savepoints/NAME`) if given.
pub fn spawn_with(args: &[String], restore: Option<&str>, env: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_temperature"));
    cmd.args(args).stdout(Stdio::null()).stderr(Stdio::piped());
    if let Some(from) = restore {
        cmd.args(["--restore", from]);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("start temperature")
}

pub fn wait(child: Child) -> (ExitStatus, String) {
    let out = child.wait_with_output().expect("wait");
    (out.status, String::from_utf8_lossy(&out.stderr).to_string())
}

/// Published output: every `*.jsonl` line of `dir/<folder>`, sorted.
pub fn published(dir: &Path, folder: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir.join(folder)) else { return lines };
    for e in entries.flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "jsonl") {
            lines.extend(std::fs::read_to_string(&p).unwrap().lines().map(str::to_string));
        }
    }
    lines.sort();
    lines
}

pub fn has_completed_checkpoint(ckpt: &Path) -> bool {
    let job = ckpt.join("temperature");
    std::fs::read_dir(job).into_iter().flatten().flatten().any(|e| e.path().join("_metadata").exists())
}

pub fn latest_checkpoint(ckpt: &Path) -> Option<u64> {
    let job = ckpt.join("temperature");
    std::fs::read_dir(job)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("_metadata").exists())
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("chk-")?.parse().ok())
        .max()
}

pub struct Dirs {
    pub tmp: tempfile::TempDir,
    pub out: PathBuf,
    pub ckpt: PathBuf,
}

pub fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let (out, ckpt) = (tmp.path().join("out"), tmp.path().join("ckpt"));
    Dirs { tmp, out, ckpt }
}

/// The generator's model behind [`base_args`] (see `oracle.rs`).
pub const BASE_MODEL: oracle::Model = oracle::Model {
    outages: &[(3, 5_000, 9_000), (7, 12_000, 13_000), (9, 20_000, 25_500), (3, 15_000, 18_000)],
    silence_ms: Some(2_000),
    ..oracle::Model::RUN
};

/// The alerts the outages of [`base_args`] imply, computed without the engine.
pub fn expected_alerts() -> &'static Vec<String> {
    static EXPECTED: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    EXPECTED.get_or_init(|| {
        let a = oracle::expected_alerts(&BASE_MODEL);
        assert_eq!(a.len(), 6, "three outages alert, one is too short: {a:?}");
        a
    })
}

/// What the input of [`base_args`] implies the job publishes (windows, readings), computed
/// without the engine.
pub fn expected() -> &'static (Vec<String>, Vec<String>) {
    static EXPECTED: std::sync::OnceLock<(Vec<String>, Vec<String>)> = std::sync::OnceLock::new();
    EXPECTED.get_or_init(|| {
        let e = oracle::expected(&BASE_MODEL);
        assert!(e.0.len() > 100 && e.1.len() > 5000, "the model is too small: {} {}", e.0.len(), e.1.len());
        e
    })
}

/// An uninterrupted run of [`base_args`] at parallelism 1 (windows, readings).
pub fn clean_run() -> (Vec<String>, Vec<String>) {
    let d = dirs();
    let (status, err) = wait(spawn(&base_args(&d.out, &d.ckpt, 1), false, &[]));
    assert!(status.success(), "clean run failed: {err}");
    (published(&d.out, "windows"), published(&d.out, "readings"))
}

/// The published output is exactly what the input implies: every plausible reading,
/// every window and every alert once, nothing else.
pub fn assert_equals_expected(d: &Dirs, what: &str) {
    let (windows, readings) = expected();
    let got_w = published(&d.out, "windows");
    let got_r = published(&d.out, "readings");
    assert_same_lines(&got_r, readings, &format!("{what}: readings"));
    assert_same_lines(&got_w, windows, &format!("{what}: windows"));
    assert_same_lines(&published(&d.out, "alerts"), expected_alerts(), &format!("{what}: alerts"));
}

/// `got` equals `want` (both sorted); otherwise says how many are missing, duplicated or
/// unexpected, with an example of each.
pub fn assert_same_lines(got: &[String], want: &[String], what: &str) {
    if let Some(diff) = lines_differ(got, want) {
        panic!("{what}: {diff}");
    }
}

/// How `got` differs from `want` (both sorted): how many lines are missing, duplicated or
/// unexpected, with an example of each; `None` when they are equal.
pub fn lines_differ(got: &[String], want: &[String]) -> Option<String> {
    if got == want {
        return None;
    }
    let dupes: Vec<&String> = got.windows(2).filter(|w| w[0] == w[1]).map(|w| &w[0]).collect();
    let missing: Vec<&String> = want.iter().filter(|l| got.binary_search(l).is_err()).collect();
    let unexpected: Vec<&String> = got.iter().filter(|l| want.binary_search(l).is_err()).collect();
    Some(format!(
        "{} lines, {} expected; {} missing (e.g. {:?}), {} duplicated (e.g. {:?}), {} unexpected (e.g. {:?})",
        got.len(),
        want.len(),
        missing.len(),
        missing.first(),
        dupes.len(),
        dupes.first(),
        unexpected.len(),
        unexpected.first()
    ))
}

/// Restores (from the latest checkpoint, when one completed) and runs to the end. The
/// restore must succeed at once: a failed restore is a test failure, never retried.
pub fn finish(d: &Dirs, parallelism: u32) {
    let restore = has_completed_checkpoint(&d.ckpt);
    let (status, err) = wait(spawn(&base_args(&d.out, &d.ckpt, parallelism), restore, &[]));
    assert!(status.success(), "the restored run failed ({status}):\n{err}");
}

/// Every object name referenced by the completed checkpoints of `job_dir` (their `_metadata`).
pub fn referenced_objects(job_dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(job_dir).into_iter().flatten().flatten() {
        let meta = e.path().join("_metadata");
        if let Ok(text) = std::fs::read_to_string(&meta) {
            let json: serde_json::Value = serde_json::from_str(&text).unwrap();
            collect_objects(&json, &mut out);
        }
    }
    out.sort();
    out.dedup();
    out
}

fn collect_objects(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("object", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => collect_objects(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| collect_objects(v, out)),
        _ => {}
    }
}

/// Files under `dir`, as `/`-separated paths relative to `root`.
pub fn files_under(root: &Path, dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(root, &p));
        } else {
            out.push(p.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/"));
        }
    }
    out
}

/// Retention left no shared file that no retained checkpoint references (after a run
/// that ended with a completed checkpoint), and the state was in RocksDB SST files.
pub fn assert_shared_files_all_referenced(ckpt: &Path) {
    let job = ckpt.join("temperature");
    let referenced = referenced_objects(&job);
    let shared = files_under(ckpt, &job.join("shared"));
    let latest = latest_checkpoint(ckpt).expect("a completed checkpoint");
    let meta = std::fs::read_to_string(job.join(format!("chk-{latest}/_metadata"))).unwrap();
    assert!(meta.contains(r#""backend": "rocks_db""#), "window state is in RocksDB: {meta}");
    for f in &shared {
        assert!(referenced.contains(f), "`{f}` is referenced by no retained checkpoint");
    }
}

/// The published output is what model `m` implies: readings, windows and alerts.
pub fn assert_equals_model(d: &Dirs, m: &oracle::Model, what: &str) {
    let (windows, readings) = oracle::expected(m);
    assert_same_lines(&published(&d.out, "readings"), &readings, &format!("{what}: readings"));
    assert_same_lines(&published(&d.out, "windows"), &windows, &format!("{what}: windows"));
    let alerts = oracle::expected_alerts(m);
    assert_same_lines(&published(&d.out, "alerts"), &alerts, &format!("{what}: alerts"));
}

/// Runs `args` until its first checkpoint completed, then `delay` more, and SIGKILLs it
/// (which must still be running then).
pub fn kill_after_first_checkpoint(d: &Dirs, args: &[String], delay: std::time::Duration) {
    let mut child = spawn(args, false, &[]);
    let start = std::time::Instant::now();
    while !has_completed_checkpoint(&d.ckpt) {
        assert!(start.elapsed() < std::time::Duration::from_secs(30), "no checkpoint completed");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(delay);
    assert!(child.try_wait().unwrap().is_none(), "the run ended before the kill");
    child.kill().unwrap();
    let _ = child.wait();
}

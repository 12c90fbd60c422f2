#![allow(clippy::unwrap_used)]
//! The temperature job: same results at any parallelism, the anomaly filter drops exactly
//! the faulty readings, and bad flags fail at start naming the flag.

use caudal::{JobConfig, StreamEnv};
use caudal_jobs::temperature::{names, SinkKind, SourceKind, TemperatureJob, WindowStats};
use caudal_operators::generator::GeneratorConfig;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn job(records: u64, output: &Path) -> TemperatureJob {
    TemperatureJob {
        source: SourceKind::Generator(GeneratorConfig {
            sensors: 50,
            rate: 0.0,
            records: Some(records),
            seed: 7,
            faulty_fraction: 0.02,
            splits: 8,
            start_ms: None,
            event_interval_ms: None,
            outages: Vec::new(),
        }),
        window: Duration::from_secs(60),
        out_of_orderness: Duration::from_secs(1),
        sink: SinkKind::File(output.to_path_buf()),
        serve: Default::default(),
        silence: None,
        limits: None,
        metadata: None,
    }
}

fn run(parallelism: u32, records: u64, output: &Path) -> caudal::JobResult {
    let env =
        StreamEnv::with_config(JobConfig { parallelism, handle_signals: false, ..JobConfig::default() });
    job(records, output).build(&env).unwrap();
    env.execute("temperature").unwrap()
}

fn sorted_lines(dir: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "jsonl") {
            continue; // .inprogress/
        }
        let text = std::fs::read_to_string(path).unwrap();
        lines.extend(text.lines().map(str::to_string));
    }
    lines.sort();
    lines
}

#[test]
fn parallelism_1_and_4_give_identical_windows_and_readings() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("p1"), tmp.path().join("p4"));
    let r1 = run(1, 60_000, &a);
    let r4 = run(4, 60_000, &b);
    let (w1, w4) = (sorted_lines(&a.join("windows")), sorted_lines(&b.join("windows")));
    assert!(!w1.is_empty());
    assert_eq!(w1, w4, "window results differ between parallelism 1 and 4");
    assert_eq!(sorted_lines(&a.join("readings")), sorted_lines(&b.join("readings")));
    // p4 really ran 4 window subtasks that each saw records.
    let windows = r4.operator(names::WINDOWS).unwrap();
    assert_eq!(windows.subtasks.len(), 4);
    assert!(windows.subtasks.iter().all(|s| s.records_in > 0));
    assert_eq!(r1.operator(names::SOURCE).unwrap().records_out, 60_000);
}

#[test]
fn windows_account_for_every_plausible_reading() {
    let tmp = tempfile::tempdir().unwrap();
    let result = run(2, 30_000, tmp.path());
    let filter = result.operator(names::ANOMALY_FILTER).unwrap();
    let dropped = filter.records_in - filter.records_out;
    // 2 % faulty readings, all of them impossible values.
    assert!((400..=800).contains(&dropped), "dropped {dropped}");
    let windows: Vec<WindowStats> =
        sorted_lines(&tmp.path().join("windows")).iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    let counted: u64 = windows.iter().map(|w| w.count as u64).sum();
    assert_eq!(counted, filter.records_out, "every reading that passed the filter is in exactly one window");
    for w in &windows {
        assert_eq!(w.window_end - w.window_start, 60_000);
        assert!(w.min_c <= w.mean_c && w.mean_c <= w.max_c, "{w:?}");
        assert!(w.min_c > -50.0 && w.max_c < 60.0, "anomaly leaked into {w:?}");
    }
    // 50 sensors × 600 readings at 1 s event time = 10 minutes: 10 windows per sensor.
    assert_eq!(windows.len(), 50 * 10);
}

fn temperature(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_temperature")).args(args).output().unwrap()
}

#[test]
fn bad_flags_fail_at_start_naming_the_flag() {
    for (args, flag) in [
        (vec!["--sensors", "0"], "--sensors"),
        (vec!["--rate", "-1"], "--rate"),
        (vec!["--parallelism", "0"], "--parallelism"),
        (vec!["--no-such-flag"], "--no-such-flag"),
        (vec!["--faulty-fraction", "2"], "--faulty-fraction"),
    ] {
        let out = temperature(&args);
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flag), "{args:?}: error does not name {flag}: {err}");
    }
}

#[test]
fn a_bounded_run_from_the_command_line_writes_both_outputs() {
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().to_str().unwrap();
    let out = temperature(&[
        "--records",
        "5000",
        "--rate",
        "0",
        "--output",
        out_dir,
        "--progress-secs",
        "0",
        "--no-ui",
        "--checkpoint-interval",
        "0",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("read 5000"), "{err}");
    assert!(!sorted_lines(&tmp.path().join("windows")).is_empty());
    assert!(sorted_lines(&tmp.path().join("readings")).len() > 4800);
}

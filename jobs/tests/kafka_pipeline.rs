//! A pipeline behind a pipeline (#43): the temperature job's exactly-once output is the input
//! of a second temperature job, as the reference platform chains its stages. Both are
//! SIGKILLed while they run and restored from their checkpoints; the second job's output
//! must be exactly what the *first* job's input implies (`kafka_support::oracle`, computed
//! from the input topic without the engine) — nothing lost or doubled by either job, nor by
//! the transactions between them (the second reads `read_committed`, its input partitions
//! end in commit markers, and records of aborted transactions sit among the committed ones).
//!
//! The first job writes `ProcessedReading`s; the second reads them as `SensorReading`s (the
//! fields it needs, resolved by name from the writer's schema in the registry).
//!
//! Needs the test stack (`scripts/services.sh start`); skipped without it unless
//! `CAUDAL_REQUIRE_STACK` is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kafka_support;

use kafka_support::oracle;
use kafka_support::{create_topic, read_committed, stack, unique, wait_until_stable, Stack};
use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One of the two jobs: its topics, checkpoints and process.
struct Stage {
    args: Vec<String>,
    ckpt: tempfile::TempDir,
    child: Option<Child>,
    kills: usize,
}

impl Stage {
    fn new(stack: &Stack, input: &str, output: &str, bounded: bool) -> Stage {
        let mut args: Vec<String> = [
            "--source",
            "kafka",
            "--input-topic",
            input,
            "--sink",
            "kafka",
            "--output-topic",
            output,
            "--windows-topic",
            &format!("{output}-windows"),
            "--alerts-topic",
            &format!("{output}-alerts"),
            "--transactional-id-prefix",
            output,
            "--window-secs",
            "10",
            "--parallelism",
            "2",
            "--checkpoint-interval",
            "0.3",
            "--partition-discovery-secs",
            "0",
            "--progress-secs",
            "0",
            "--no-ui",
            "--brokers",
            &stack.brokers,
            "--schema-registry",
            &stack.registry,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if bounded {
            args.extend(["--bounded".into(), "--max-records-per-second".into(), "2000".into()]);
        }
        for topic in [output.to_string(), format!("{output}-windows"), format!("{output}-alerts")] {
            create_topic(stack, &topic, 2);
        }
        Stage { args, ckpt: tempfile::tempdir().unwrap(), child: None, kills: 0 }
    }

    /// Starts the job, from its latest checkpoint when one completed.
    fn start(&mut self) {
        let restore = has_checkpoint(self.ckpt.path());
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_temperature"));
        cmd.args(&self.args).arg("--checkpoint-dir").arg(self.ckpt.path());
        cmd.arg("--state-dir").arg(self.ckpt.path().join("state"));
        if restore {
            cmd.args(["--restore", "latest"]);
        }
        self.child = Some(cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap());
    }

    /// SIGKILLs the job if it still runs, and starts it again; false when it had finished.
    fn kill_and_restart(&mut self) -> bool {
        let child = self.child.as_mut().unwrap();
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(9));
        self.kills += 1;
        self.start();
        true
    }

    /// Waits for the job to end by itself (bounded) and checks it succeeded.
    fn wait_success(&mut self, what: &str) {
        let out = self.child.take().unwrap().wait_with_output().unwrap();
        assert!(out.status.success(), "{what} failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Stops the job with SIGTERM (final checkpoint) and checks it stopped cleanly.
    fn stop(&mut self, what: &str) {
        let child = self.child.take().unwrap();
        assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{what} did not stop cleanly: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn has_checkpoint(ckpt: &Path) -> bool {
    std::fs::read_dir(ckpt.join("temperature"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| e.path().join("_metadata").exists())
}

fn strip(records: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<(Vec<u8>, Vec<u8>)> {
    records.into_iter().map(|(k, v)| (k, v.get(5..).unwrap_or_default().to_vec())).collect()
}

#[test]
fn a_job_behind_an_exactly_once_job_both_killed_publishes_what_the_first_input_implies() {
    let Some(stack) = stack() else { return };
    let (input, middle, last) = (unique("chain-in"), unique("chain-mid"), unique("chain-out"));
    create_topic(&stack, &input, 2);
    let produced = Command::new(env!("CARGO_BIN_EXE_temperature"))
        .args(["produce", "--topic", &input, "--sensors", "20", "--rate", "0", "--records", "12000"])
        .args(["--seed", "4343", "--event-interval-ms", "100"])
        .args(["--brokers", &stack.brokers, "--schema-registry", &stack.registry])
        .output()
        .unwrap();
    assert!(produced.status.success(), "produce failed: {}", String::from_utf8_lossy(&produced.stderr));
    let (want_readings, want_windows) = oracle::expected(&stack, &input, 10_000);

    let mut first = Stage::new(&stack, &input, &middle, true);
    let mut second = Stage::new(&stack, &middle, &last, false);
    second.start();
    first.start();
    // Kills at fixed moments, alternating between the jobs, while the first runs (~6 s).
    let mut previous = 0;
    for (at_ms, stage) in [(1_500, 0), (2_500, 1), (3_800, 0), (4_600, 1)] {
        std::thread::sleep(Duration::from_millis(at_ms - previous));
        previous = at_ms;
        let stage = if stage == 0 { &mut first } else { &mut second };
        stage.kill_and_restart();
    }
    first.wait_success("the first job");
    assert!(
        first.kills >= 1 && second.kills >= 1,
        "both jobs must be killed ({} and {})",
        first.kills,
        second.kills
    );

    // The second job reads everything the first committed; then it stops.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let got = read_committed(&stack, &last).len();
        if got >= want_readings.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{got} of {} readings through both jobs after 120 s",
            want_readings.len()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    second.stop("the second job");
    for topic in [&middle, &last] {
        wait_until_stable(&stack, topic);
    }
    let got = oracle::readings_of(&strip(read_committed(&stack, &last)));
    assert_eq!(got.len(), want_readings.len(), "readings through both jobs (lost or doubled)");
    assert!(got == want_readings, "the readings through both jobs differ from what the input implies");
    // The first job's windows are the input's, exactly. The second job's windows are not
    // compared: its input partitions interleave the first job's subtasks, so its readings
    // arrive out of order by more than its one second of bounded out-of-orderness (late, and
    // counted so); each is published once.
    let first_windows = oracle::windows_of(&strip(read_committed(&stack, &format!("{middle}-windows"))));
    assert!(first_windows == want_windows, "the first job's windows differ from what the input implies");
    let windows = oracle::windows_of(&strip(read_committed(&stack, &format!("{last}-windows"))));
    let distinct: BTreeSet<(i64, i64)> = windows.iter().map(|w| (w.0, w.1)).collect();
    assert_eq!(distinct.len(), windows.len(), "a window published twice behind the second job");
}

//! Checkpoint storage that breaks while the job runs (the job's checkpoint directory turns
//! into a file, so every write below it fails, root or not): failed checkpoints fail the
//! job once more of them failed in a row than `tolerable_failed_checkpoints` allows (0 by
//! default, as in Flink), and a bounded job whose final checkpoint fails does not end
//! FINISHED with exit 0 — its sinks publish nothing that no completed checkpoint covers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::path::Path;
use std::time::{Duration, Instant};

/// Every later write under `ckpt/temperature/` fails.
fn break_storage(ckpt: &Path) {
    let job = ckpt.join("temperature");
    if job.exists() {
        std::fs::remove_dir_all(&job).unwrap();
    }
    std::fs::write(&job, b"not a directory").unwrap();
}

fn wait_for(what: &str, limit: Duration, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn with(mut args: Vec<String>, flag: &str, value: &str) -> Vec<String> {
    let i = args.iter().position(|a| a == flag).unwrap();
    args[i + 1] = value.into();
    args
}

#[test]
fn failed_checkpoints_fail_the_job_past_the_tolerated_number() {
    for (tolerable, failed) in [(None, 1), (Some(3), 4)] {
        let d = dirs();
        let env: Vec<(&str, String)> =
            tolerable.map(|n| ("CAUDAL__TOLERABLE_FAILED_CHECKPOINTS", n.to_string())).into_iter().collect();
        let child = spawn(&base_args(&d.out, &d.ckpt, 1), false, &env);
        wait_for("a completed checkpoint", Duration::from_secs(20), || has_completed_checkpoint(&d.ckpt));
        break_storage(&d.ckpt);
        let broken = Instant::now();
        let (status, err) = wait(child);
        assert!(
            !status.success(),
            "tolerable {tolerable:?}: the job went on with failing checkpoints: {err}"
        );
        assert!(
            err.contains(&format!(
                "{failed} checkpoint(s) failed in a row, more than tolerable_failed_checkpoints = {}",
                tolerable.unwrap_or(0)
            )),
            "tolerable {tolerable:?}: {err}"
        );
        assert!(!err.contains("temperature: finished"), "{err}");
        // 0.3 s between checkpoints: it gave up after the failures, not at the end of input.
        assert!(broken.elapsed() < Duration::from_secs(3), "failed after {:?}", broken.elapsed());
    }
}

#[test]
fn a_bounded_job_whose_final_checkpoint_fails_does_not_finish_nor_publish_uncommitted_output() {
    let d = dirs();
    // No periodic checkpoint in the ~4 s run: the final one, at the end of input, is the first.
    let args = with(base_args(&d.out, &d.ckpt, 2), "--checkpoint-interval", "600");
    let child = spawn(&args, false, &[]);
    // Running: the file sinks opened their in-progress files (the checkpoint directory
    // appears only with the first checkpoint, the final one).
    wait_for("the job to run", Duration::from_secs(20), || d.out.join("readings/.inprogress").is_dir());
    std::thread::sleep(Duration::from_millis(800));
    assert!(!has_completed_checkpoint(&d.ckpt), "a checkpoint completed before the storage broke");
    break_storage(&d.ckpt);
    let (status, err) = wait(child);
    assert!(!status.success(), "the job ended as if its output were committed: {err}");
    assert!(err.contains("checkpoint 1 failed"), "{err}");
    assert!(err.contains("Nothing after checkpoint none (start again) is committed"), "{err}");
    assert!(!err.contains("temperature: finished"), "{err}");
    assert_eq!(published(&d.out, "readings").len(), 0, "readings published without a completed checkpoint");
    assert_eq!(published(&d.out, "windows").len(), 0, "windows published without a completed checkpoint");
}

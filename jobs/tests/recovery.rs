//! Exactly-once under kills: the temperature job, killed (SIGKILL) at random moments and at
//! every crash point of the checkpoint protocol, restored with `--restore latest`, publishes
//! exactly what its input implies (`common/oracle.rs`, computed from the generator's model
//! without the engine) — line for line after sorting. Plus the golden test three ways and
//! rescaling.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A tiny deterministic RNG for kill times.
fn next(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    *seed >> 33
}

#[test]
fn killed_five_times_at_random_the_output_is_what_the_input_implies() {
    let d = dirs();
    let mut seed = 0x5eed;
    let mut kills = 0;
    while kills < 5 {
        let restore = has_completed_checkpoint(&d.ckpt);
        let mut child = spawn(&base_args(&d.out, &d.ckpt, 2), restore, &[]);
        let delay = Duration::from_millis(400 + next(&mut seed) % 1200);
        let start = Instant::now();
        while start.elapsed() < delay && child.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(10));
        }
        if child.try_wait().unwrap().is_some() {
            break; // finished before the kill
        }
        child.kill().unwrap(); // SIGKILL
        let (status, _) = wait(child);
        assert_eq!(status.signal(), Some(9));
        kills += 1;
    }
    assert!(kills >= 3, "the job finished too early to be killed ({kills} kills)");
    finish(&d, 2);
    assert_equals_expected(&d, &format!("after {kills} kills"));
    // Nothing the killed runs uploaded is left behind: neither files of checkpoints that never
    // completed (retention) nor uploads cut off mid-write (swept when a run starts).
    assert_shared_files_all_referenced(&d.ckpt);
}

/// Crashes the job at `point` of checkpoint 2, then restores until it finishes.
/// The window state is in RocksDB (the job's default backend).
fn crash_at(point: &str) {
    let d = dirs();
    let (status, err) = wait(spawn(
        &base_args(&d.out, &d.ckpt, 2),
        false,
        &[("CAUDAL__TEST_CRASH_AT", format!("{point}:2"))],
    ));
    assert_eq!(status.signal(), Some(9), "the crash point {point} was not reached: {status} {err}");
    assert!(err.contains(point), "{err}");
    finish(&d, 2);
    assert_equals_expected(&d, point);
}

#[test]
fn crash_after_snapshot_before_ack() {
    crash_at("after-snapshot-before-ack");
}

#[test]
fn crash_after_sink_pre_commit() {
    crash_at("after-sink-pre-commit");
}

/// Half of a window subtask's new files are in storage, the rest not, no ack: the checkpoint
/// never completes; the restore uses the previous one and retention later deletes the
/// half-uploaded files.
#[test]
fn crash_during_the_async_upload() {
    let d = dirs();
    let (status, err) = wait(spawn(
        &base_args(&d.out, &d.ckpt, 2),
        false,
        &[("CAUDAL__TEST_CRASH_AT", "during-async-upload:3".into())],
    ));
    assert_eq!(status.signal(), Some(9), "the crash point was not reached: {status} {err}");
    // It died half-way through: the files it says it stored are in storage, the rest not
    // (#43: the point could fire after a whole upload), and the checkpoint is not complete.
    let line = err
        .lines()
        .find(|l| l.contains("during-async-upload: in storage: "))
        .unwrap_or_else(|| panic!("{err}"));
    let (stored, missing) = line.split_once("in storage: ").unwrap().1.split_once("; not yet: ").unwrap();
    let (stored, missing): (Vec<&str>, Vec<&str>) =
        (stored.split(',').collect(), missing.split(',').collect());
    assert!(!stored.is_empty() && !missing.is_empty(), "{line}");
    for name in &stored {
        assert!(d.ckpt.join(name).exists(), "{name} is said to be stored but is not: {line}");
    }
    for name in &missing {
        assert!(!d.ckpt.join(name).exists(), "{name} is in storage though the upload died before it: {line}");
    }
    assert!(latest_checkpoint(&d.ckpt) < Some(3), "checkpoint 3 must not be complete");
    finish(&d, 2);
    assert_equals_expected(&d, "crash during the async upload");
    assert_shared_files_all_referenced(&d.ckpt);
}

#[test]
fn crash_after_all_acks_before_metadata_is_durable() {
    crash_at("before-metadata");
}

#[test]
fn crash_after_metadata_before_checkpoint_complete_reaches_the_sink() {
    crash_at("after-metadata-before-notify");
}

#[test]
fn crash_during_sink_commit() {
    crash_at("during-sink-commit");
}

/// Crashes the job at `point` of its final checkpoint — the one the end of the bounded input
/// takes, whatever its number (#43: the kills were armed at checkpoints 2–4 only, and this
/// path had lost output before) — proves it died there from what is on disk, then restores
/// until it finishes: the output is what the input implies.
fn crash_at_the_final_checkpoint(point: &str, completed: bool, none_published: bool) {
    let d = dirs();
    let (status, err) = wait(spawn(
        &base_args(&d.out, &d.ckpt, 2),
        false,
        &[("CAUDAL__TEST_CRASH_AT", format!("{point}:final"))],
    ));
    assert_eq!(status.signal(), Some(9), "the crash point {point} was not reached: {status} {err}");
    let at = format!("crash point {point} at checkpoint ");
    let final_id: u64 = err
        .split(&at)
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `{at}N` in the log: {err}"));
    let latest = latest_checkpoint(&d.ckpt);
    if completed {
        assert_eq!(latest, Some(final_id), "{point}: the final checkpoint's metadata is durable");
    } else {
        assert!(latest < Some(final_id), "{point}: checkpoint {final_id} must not be complete ({latest:?})");
    }
    if none_published {
        // The final epoch holds at least the windows the end of the input fired.
        let (windows, _) = expected();
        assert!(published(&d.out, "windows").len() < windows.len(), "{point}: the final epoch was published");
    }
    finish(&d, 2);
    assert_equals_expected(&d, &format!("{point} of the final checkpoint"));
}

#[test]
fn crash_after_sink_pre_commit_of_the_final_checkpoint() {
    crash_at_the_final_checkpoint("after-sink-pre-commit", false, true);
}

#[test]
fn crash_before_the_final_checkpoints_metadata() {
    crash_at_the_final_checkpoint("before-metadata", false, true);
}

#[test]
fn crash_after_the_final_checkpoints_metadata_before_the_sinks_hear_of_it() {
    crash_at_the_final_checkpoint("after-metadata-before-notify", true, true);
}

#[test]
fn crash_during_the_sink_commit_of_the_final_checkpoint() {
    crash_at_the_final_checkpoint("during-sink-commit", true, false);
}

/// A stop (SIGTERM) takes a final checkpoint and commits it; killed during that commit, the
/// restored run publishes what was left, once.
#[test]
fn crash_during_the_sink_commit_of_a_stops_final_checkpoint() {
    let d = dirs();
    let child = spawn(
        &base_args(&d.out, &d.ckpt, 2),
        false,
        &[("CAUDAL__TEST_CRASH_AT", "during-sink-commit:final".into())],
    );
    std::thread::sleep(Duration::from_millis(1500));
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let (status, err) = wait(child);
    assert_eq!(status.signal(), Some(9), "the stop's final commit was not reached: {status} {err}");
    assert!(err.contains("crash point during-sink-commit"), "{err}");
    finish(&d, 2);
    assert_equals_expected(&d, "crash during the commit of a stop's final checkpoint");
}

#[test]
fn crash_during_restore() {
    let d = dirs();
    let mut child = spawn(&base_args(&d.out, &d.ckpt, 2), false, &[]);
    std::thread::sleep(Duration::from_millis(1500));
    child.kill().unwrap();
    wait(child);
    let latest = latest_checkpoint(&d.ckpt).expect("a checkpoint completed before the kill");
    let before = files_under(&d.out);
    assert!(
        before.iter().any(|f| f.contains(".inprogress/")),
        "the killed run left nothing in progress, which a sink's restore would clean: {before:?}"
    );
    let (status, err) = wait(spawn(
        &base_args(&d.out, &d.ckpt, 2),
        true,
        &[("CAUDAL__TEST_CRASH_AT", format!("during-restore:{latest}"))],
    ));
    assert_eq!(status.signal(), Some(9), "restore crash point not reached: {err}");
    // Where the point's name says (#43): the checkpoint was read, no operator restored yet —
    // no sink published a pending file or removed an in-progress one, no checkpoint was added.
    assert!(err.contains(&format!("restoring job `temperature` from checkpoint chk-{latest}")), "{err}");
    assert_eq!(files_under(&d.out), before, "an operator restored before the crash point");
    assert_eq!(latest_checkpoint(&d.ckpt), Some(latest));
    finish(&d, 2);
    assert_equals_expected(&d, "crash during restore");
}

/// The files under `dir`, as paths relative to it, sorted.
fn files_under(dir: &Path) -> Vec<String> {
    let mut files = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = e.path();
            if path.is_dir() {
                todo.push(path);
            } else if let Ok(rel) = path.strip_prefix(dir) {
                files.push(rel.display().to_string());
            }
        }
    }
    files.sort();
    files
}

/// Stops with SIGTERM (final checkpoint), then restores at `to` parallelism and finishes.
fn rescale(from: u32, to: u32) {
    let d = dirs();
    let child = spawn(&base_args(&d.out, &d.ckpt, from), false, &[]);
    std::thread::sleep(Duration::from_millis(1500));
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let (status, err) = wait(child);
    assert!(status.success(), "a stopped job exits cleanly: {status} {err}");
    assert!(has_completed_checkpoint(&d.ckpt), "the stop took a final checkpoint");
    let (status, err) = wait(spawn(&base_args(&d.out, &d.ckpt, to), true, &[]));
    assert!(status.success(), "restored at parallelism {to}: {err}");
    assert!(err.contains("restoring job `temperature`"), "{err}");
    assert_equals_expected(&d, &format!("rescale {from}→{to}"));
}

#[test]
fn rescale_2_to_3() {
    rescale(2, 3);
}

#[test]
fn rescale_3_to_1() {
    rescale(3, 1);
}

#[test]
fn rescale_2_to_3_on_heap_state() {
    let d = dirs();
    let mut args = base_args(&d.out, &d.ckpt, 2);
    args.extend(["--state-backend".into(), "heap".into()]);
    let child = spawn(&args, false, &[]);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let (status, err) = wait(child);
    assert!(status.success(), "{err}");
    let latest = latest_checkpoint(&d.ckpt).unwrap();
    let meta = std::fs::read_to_string(d.ckpt.join(format!("temperature/chk-{latest}/_metadata"))).unwrap();
    assert!(meta.contains(r#""backend": "heap""#), "{meta}");
    // Heap snapshots restore into RocksDB too.
    let (status, err) = wait(spawn(&base_args(&d.out, &d.ckpt, 3), true, &[]));
    assert!(status.success(), "{err}");
    assert_equals_expected(&d, "heap 2 → rocksdb 3");
}

/// STYLE #12: clean at parallelism 1; at 2 with checkpoints and a stop; restored at 3 and
/// finished — all three equal one golden file.
#[test]
fn golden_three_ways() {
    let golden_path = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")), std::path::PathBuf::from)
        .join("tests/golden/temperature-windows.jsonl");
    let (windows, _) = clean_run();
    if std::env::var_os("CAUDAL_BLESS").is_some() {
        std::fs::create_dir_all(golden_path.parent().unwrap()).unwrap();
        std::fs::write(&golden_path, windows.join("\n") + "\n").unwrap();
    }
    assert_same_lines(&windows, &expected().0, "the clean run's windows against the model");
    let golden: Vec<String> = std::fs::read_to_string(&golden_path)
        .expect("golden file (CAUDAL_BLESS=1 writes it)")
        .lines()
        .map(str::to_string)
        .collect();
    assert!(*windows == golden, "the clean run differs from {}", golden_path.display());
    // Stop at parallelism 2, restore at 3: rescale() asserts equality with the model.
    rescale(2, 3);
}

#[test]
fn restore_without_a_checkpoint_is_an_error_not_a_fresh_start() {
    let d = dirs();
    let (status, err) = wait(spawn(&base_args(&d.out, &d.ckpt, 1), true, &[]));
    assert!(!status.success());
    assert!(err.contains("no completed checkpoint"), "{err}");
}

#[test]
fn a_corrupt_latest_checkpoint_names_the_file_and_fallback_uses_the_previous() {
    let d = dirs();
    let mut child = spawn(&base_args(&d.out, &d.ckpt, 1), false, &[]);
    std::thread::sleep(Duration::from_millis(1800));
    child.kill().unwrap();
    wait(child);
    let latest = latest_checkpoint(&d.ckpt).expect("checkpoints completed");
    assert!(latest >= 2, "need two checkpoints, got {latest}");
    let meta = d.ckpt.join(format!("temperature/chk-{latest}/_metadata"));
    std::fs::write(&meta, b"{ not json").unwrap();
    let (status, err) = wait(spawn(&base_args(&d.out, &d.ckpt, 1), true, &[]));
    assert!(!status.success(), "a corrupt checkpoint must not be used");
    assert!(err.contains(&format!("chk-{latest}")) && err.contains("_metadata"), "{err}");
    let mut args = base_args(&d.out, &d.ckpt, 1);
    args.push("--fallback".into());
    let (status, err) = wait({
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_temperature"));
        cmd.args(&args).args(["--restore", "latest"]).stdout(Stdio::null()).stderr(Stdio::piped());
        cmd.spawn().unwrap()
    });
    assert!(status.success(), "{err}");
    assert!(err.contains(&format!("skipping corrupt checkpoint chk-{latest}")), "{err}");
    // Falling back replays the epoch of the skipped checkpoint, whose files may already be
    // published: nothing is lost, duplicates of that one epoch are possible (documented).
    let got = published(&d.out, "readings");
    let missing = expected().1.iter().filter(|l| got.binary_search(l).is_err()).count();
    assert_eq!(missing, 0, "fallback restore lost {missing} readings");
}

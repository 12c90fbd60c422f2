//! What a restore does when the job is not the one that took the checkpoint: a sink added
//! since then is a new operator (nothing lost), a stateful operator removed since then
//! fails the restore before any record is processed (unless --allow-non-restored-state),
//! and so does another max_parallelism.
//!
//! Each test crashes the temperature job after checkpoint 2's metadata is durable and
//! before any sink heard of it (`after-metadata-before-notify:2`): the sinks' pending epoch
//! is only in the checkpoint, so an operator whose state is not found loses it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::os::unix::process::ExitStatusExt;

const CRASH: &str = "after-metadata-before-notify";

/// Runs `args` until it dies at the crash point of checkpoint 2.
fn crash(d: &Dirs, args: &[String]) {
    let (status, err) = wait(spawn(args, false, &[("CAUDAL__TEST_CRASH_AT", format!("{CRASH}:2"))]));
    assert_eq!(status.signal(), Some(9), "the crash point was not reached: {status} {err}");
    assert!(err.contains(CRASH), "died elsewhere: {err}");
    assert!(has_completed_checkpoint(&d.ckpt));
}

fn with(mut args: Vec<String>, extra: &[&str]) -> Vec<String> {
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn archive_args(d: &Dirs) -> Vec<String> {
    with(base_args(&d.out, &d.ckpt, 2), &["--archive", &d.tmp.path().join("archive").display().to_string()])
}

#[test]
fn a_sink_added_before_the_restore_loses_nothing() {
    let d = dirs();
    crash(&d, &base_args(&d.out, &d.ckpt, 2));
    // The archive sink is added in front of the file sinks: their state is found by uid.
    let (status, err) = wait(spawn(&archive_args(&d), true, &[]));
    assert!(status.success(), "restore with an added sink: {err}");
    assert_equals_expected(&d, "restored with --archive added");
}

#[test]
fn a_sink_removed_before_the_restore_fails_it_naming_the_uid_unless_allowed() {
    let d = dirs();
    crash(&d, &archive_args(&d));
    let before = (published(&d.out, "readings"), published(&d.out, "windows"));
    let (status, err) = wait(spawn(&base_args(&d.out, &d.ckpt, 2), true, &[]));
    assert!(!status.success(), "a restore that drops a sink's pending epoch must fail: {err}");
    assert!(
        err.contains("holds state of operators this job does not have: readings-archive")
            && err.contains("--allow-non-restored-state"),
        "{err}"
    );
    // Failed before processing: nothing was published or committed meanwhile.
    assert_eq!(before, (published(&d.out, "readings"), published(&d.out, "windows")));
    let (status, err) =
        wait(spawn(&with(base_args(&d.out, &d.ckpt, 2), &["--allow-non-restored-state"]), true, &[]));
    assert!(status.success(), "restore with --allow-non-restored-state: {err}");
    assert!(err.contains("WARN caudal: dropping the state of operator `readings-archive`"), "{err}");
    // The operators that kept their uid restored exactly.
    assert_equals_expected(&d, "restored without the archive, non-restored state allowed");
}

#[test]
fn another_max_parallelism_fails_the_restore_naming_both() {
    let d = dirs();
    crash(&d, &base_args(&d.out, &d.ckpt, 2));
    let before = published(&d.out, "windows");
    for other in ["64", "256"] {
        let (status, err) =
            wait(spawn(&base_args(&d.out, &d.ckpt, 2), true, &[("CAUDAL__MAX_PARALLELISM", other.into())]));
        assert!(!status.success(), "max_parallelism {other}: {err}");
        assert!(
            err.contains("was taken with max_parallelism 128, this job has") && err.contains(other),
            "max_parallelism {other}: {err}"
        );
        assert_eq!(before, published(&d.out, "windows"), "nothing published by the refused restore");
    }
    // With the checkpoint's own value the restore is exact.
    let (status, err) = wait(spawn(&base_args(&d.out, &d.ckpt, 2), true, &[]));
    assert!(status.success(), "{err}");
    assert_equals_expected(&d, "restored with the checkpoint's max_parallelism");
}

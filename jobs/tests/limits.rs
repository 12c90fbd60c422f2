//! Dynamic anomaly limits (#16): the temperature job with `--limits-file`, changes per
//! latitude band taking effect at event times, checked against what the input and the
//! changes imply (the oracle judges every reading by the change in force at its time,
//! without the engine). A line that is not a change is dead-lettered and never applied; a
//! change appended just before a SIGKILL is applied exactly once after the restore, also
//! rescaled.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::oracle::{self, Limit, Model};
use common::*;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

/// From the start, the south is judged by −5 < °C < 30; from 10 s of event time the north
/// by 0 < °C < 25.
const FIRST: [Limit; 2] = [
    Limit { band: "south", lat: (-90.0, 0.0), celsius: (-5.0, 30.0), from_ms: None },
    Limit { band: "north", lat: (0.0, 90.0), celsius: (0.0, 25.0), from_ms: Some(10_000) },
];

/// From 20 s, the north by −10 < °C < 35.
const LATER: Limit = Limit { band: "north", lat: (0.0, 90.0), celsius: (-10.0, 35.0), from_ms: Some(20_000) };

const ALL: [Limit; 3] = [FIRST[0], FIRST[1], LATER];

const MODEL: Model = Model { limits: &ALL, ..BASE_MODEL };

fn write_lines(path: &Path, lines: &[String]) {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
    for l in lines {
        writeln!(f, "{l}").unwrap();
    }
    f.sync_all().unwrap();
}

fn args(d: &Dirs, limits: &Path, parallelism: u32) -> Vec<String> {
    let mut a = base_args(&d.out, &d.ckpt, parallelism);
    a.extend(["--limits-file".to_string(), limits.display().to_string()]);
    a
}

#[test]
fn readings_are_judged_by_the_limits_in_force_at_their_event_time_and_bad_lines_are_dead_lettered() {
    // The limits decide: with them fewer readings pass than with the fixed bounds, and the
    // change at 20 s lets through readings the one at 10 s stopped.
    let fixed = oracle::expected(&BASE_MODEL).1.len();
    let first_only = oracle::expected(&Model { limits: &FIRST, ..BASE_MODEL }).1.len();
    let all = oracle::expected(&MODEL).1.len();
    assert!(all < fixed && first_only < all, "fixed {fixed}, first changes {first_only}, all {all}");

    let d = dirs();
    let limits = d.tmp.path().join("limits.jsonl");
    let mut lines: Vec<String> = FIRST.iter().map(Limit::json).collect();
    lines.extend([
        "not a change".to_string(),
        r#"{"band":"north","lat_min":0,"lat_max":90,"min_c":40,"max_c":-40,"from_ts":1767225600000}"#.into(),
        "# a comment, and an empty line, are skipped".into(),
        String::new(),
        LATER.json(),
    ]);
    write_lines(&limits, &lines);
    let (status, err) = wait(spawn(&args(&d, &limits, 2), false, &[]));
    assert!(status.success(), "the run failed: {err}");
    assert_equals_model(&d, &MODEL, "a clean run");
    let rejected = published(&d.out, "rejected-limits");
    assert_eq!(rejected.len(), 2, "{rejected:#?}");
    let says = |needle: &str| rejected.iter().any(|r| r.contains(needle));
    assert!(says("not a change") && says("min_c < max_c"), "{rejected:#?}");
    assert!(err.contains("not a limit change"), "the log names the rejected lines: {err}");
}

#[test]
fn a_limit_change_appended_just_before_a_kill_is_applied_exactly_once_after_a_rescaled_restore() {
    for (i, (before, after)) in [(1u32, 2u32), (2, 1)].into_iter().enumerate() {
        let d = dirs();
        let limits = d.tmp.path().join("limits.jsonl");
        write_lines(&limits, &FIRST.iter().map(Limit::json).collect::<Vec<_>>());
        // The change is appended once the first checkpoint completed, and the run is killed
        // before or after the next checkpoint takes it in: both must end exact.
        let appended = std::thread::spawn({
            let (limits, ckpt) = (limits.clone(), d.ckpt.clone());
            move || {
                while !has_completed_checkpoint(&ckpt) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                write_lines(&limits, &[LATER.json()]);
            }
        });
        kill_after_first_checkpoint(
            &d,
            &args(&d, &limits, before),
            Duration::from_millis(100 + 250 * i as u64),
        );
        appended.join().unwrap();
        let (status, err) = wait(spawn(&args(&d, &limits, after), true, &[]));
        assert!(status.success(), "the restored run failed: {err}");
        assert_equals_model(&d, &MODEL, &format!("killed at p={before}, restored at p={after}"));
    }
}

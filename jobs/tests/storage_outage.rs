//! Checkpoint storage that goes away while the job runs and comes back (the S3 server of
//! the test stack behind a link the test cuts, `common::faulty_link`; the server keeps its
//! objects): checkpoints fail meanwhile — tolerated, or failing the job by the failure
//! policy — and the output equals what the input implies (`common::oracle`) either way.
//! Kafka transactions that could outlive their timeout during such an outage are
//! `kafka_exactly_once::a_kafka_transaction_that_could_outlive_its_timeout_fails_the_job_before_the_broker_aborts_it`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use caudal_checkpoints::metadata::completed_checkpoints;
use caudal_checkpoints::CheckpointPaths;
use common::faulty_link::FaultyLink;
use common::*;
use std::time::{Duration, Instant};

/// The job's flags with checkpoints in S3 at `url`, 500 readings/s (a ~12 s run).
fn args(d: &Dirs, url: &str) -> Vec<String> {
    let mut a = base_args(&d.out, &d.ckpt, 2);
    let i = a.iter().position(|x| x == "--checkpoint-dir").unwrap();
    a[i + 1] = url.to_string();
    let i = a.iter().position(|x| x == "--rate").unwrap();
    a[i + 1] = "25".into();
    a
}

/// The S3 settings with the endpoint behind `link`, a 1.5 s checkpoint timeout (a checkpoint
/// stuck in the outage fails instead of waiting in the S3 client's retries), and more.
fn env_through(
    link: &FaultyLink,
    s3: &[(&'static str, String)],
    more: &[(&'static str, &str)],
) -> Vec<(&'static str, String)> {
    let mut env: Vec<(&'static str, String)> =
        s3.iter().filter(|(k, _)| *k != "CAUDAL__S3__ENDPOINT").cloned().collect();
    env.push(("CAUDAL__S3__ENDPOINT", link.url()));
    env.push(("CAUDAL__CHECKPOINT_TIMEOUT_MS", "1500".into()));
    env.extend(more.iter().map(|(k, v)| (*k, v.to_string())));
    env
}

/// Waits until `n` checkpoints completed in S3.
fn wait_for_checkpoints(url: &str, s3: &[(&'static str, String)], n: usize) {
    let store = s3::store(url, s3);
    let paths = CheckpointPaths::under("temperature");
    let start = Instant::now();
    while completed_checkpoints(&store, &paths).map_or(0, |c| c.len()) < n {
        assert!(start.elapsed() < Duration::from_secs(30), "{n} checkpoints did not complete");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn endpoint(s3: &[(&'static str, String)]) -> String {
    let url = &s3.iter().find(|(k, _)| *k == "CAUDAL__S3__ENDPOINT").unwrap().1;
    url.trim_start_matches("http://").trim_end_matches('/').to_string()
}

#[test]
fn checkpoints_fail_while_the_storage_is_away_and_complete_again_when_it_is_back() {
    let Some(s3) = s3::env() else { return };
    let link = FaultyLink::to(&endpoint(&s3));
    let d = dirs();
    let url = s3::unique_url("outage-tolerated");
    let env = env_through(&link, &s3, &[("CAUDAL__TOLERABLE_FAILED_CHECKPOINTS", "1000")]);
    let child = spawn(&args(&d, &url), false, &env);
    wait_for_checkpoints(&url, &s3, 2);
    link.cut();
    std::thread::sleep(Duration::from_secs(3)); // ten checkpoint intervals
    link.restore();
    let (status, err) = wait(child);
    assert!(status.success(), "the job did not survive the outage: {err}");
    let failed = err.lines().filter(|l| l.contains("caudal: checkpoint ") && l.contains(" failed: ")).count();
    assert!(failed > 0, "no checkpoint failed during a 3 s outage: {err}");
    let store = s3::store(&url, &s3);
    let completed = completed_checkpoints(&store, &CheckpointPaths::under("temperature")).unwrap();
    assert!(!completed.is_empty(), "no checkpoint completed after the outage");
    eprintln!("{failed} checkpoints failed; completed at the end: {completed:?}");
    assert_equals_expected(&d, "a 3 s storage outage, failures tolerated");
    caudal_checkpoints::store::delete_dir(&store, "").unwrap();
}

#[test]
fn a_storage_outage_fails_the_job_by_the_failure_policy_and_the_restore_after_it_is_exact() {
    let Some(s3) = s3::env() else { return };
    let link = FaultyLink::to(&endpoint(&s3));
    let d = dirs();
    let url = s3::unique_url("outage-fails");
    let env = env_through(&link, &s3, &[]);
    let child = spawn(&args(&d, &url), false, &env);
    wait_for_checkpoints(&url, &s3, 2);
    link.cut();
    let (status, err) = wait(child);
    assert!(!status.success(), "the job went on with failing checkpoints: {err}");
    assert!(err.contains("more than tolerable_failed_checkpoints = 0"), "{err}");
    link.restore();
    let (status, err) = wait(spawn(&args(&d, &url), true, &env));
    assert!(status.success() && err.contains("restoring job `temperature`"), "the restore failed: {err}");
    assert_equals_expected(&d, "failed by a storage outage, restored after it");
    caudal_checkpoints::store::delete_dir(&s3::store(&url, &s3), "").unwrap();
}

//! The archive sink on a local directory and on S3 (`CAUDAL_S3_ENDPOINT`): files appear
//! on completion, partitioned by hour; a restore publishes what the checkpoint recorded
//! and discards newer epochs; big epochs are cut into several files.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::{ArchiveConfig, ArchiveSink, IN_PROGRESS};
use crate::test_stack::{context, run_in_process, service, unique};
use caudal::{CheckpointId, Record, Sink};
use caudal_checkpoints::{CheckpointStorageConfig, CheckpointStore, S3Config};
use caudal_schemas::ProcessedReading;

const HOUR: i64 = 3_600_000;
const START: i64 = 1_767_225_600_000; // 2026-01-01T00:00Z

fn reading(sensor_id: i64, ts: i64) -> Record<ProcessedReading> {
    Record::new(
        ts,
        ProcessedReading {
            sensor_id,
            ts,
            lat: 1.0,
            lon: 2.0,
            temp_c: 20.0,
            temp_f: 68.0,
            site: "roof".into(),
            name: format!("sensor {sensor_id}"),
        },
    )
}

/// Published files (path → records), read back with apache-avro's reader.
fn published(config: &ArchiveConfig) -> Vec<(String, Vec<ProcessedReading>)> {
    let store = CheckpointStorageConfig { url: config.url.clone(), s3: config.s3.clone() }.build().unwrap();
    let mut files: Vec<_> = store
        .list("")
        .unwrap()
        .into_iter()
        .filter(|e| !e.path.starts_with(IN_PROGRESS) && e.path.ends_with(".avro"))
        .map(|e| {
            let bytes = store.get(&e.path).unwrap();
            let reader = apache_avro::Reader::new(&bytes[..]).unwrap();
            let records =
                reader.map(|v| apache_avro::from_value::<ProcessedReading>(&v.unwrap()).unwrap()).collect();
            (e.path, records)
        })
        .collect();
    files.sort_by(|a, b| a.0.cmp(&b.0));
    files
}

/// Deletes everything under the archive's root (S3 tests share a bucket).
fn delete_all(config: &ArchiveConfig) {
    let store = CheckpointStorageConfig { url: config.url.clone(), s3: config.s3.clone() }.build().unwrap();
    for e in store.list("").unwrap() {
        store.delete(&e.path).unwrap();
    }
}

fn in_progress(config: &ArchiveConfig) -> usize {
    let store = CheckpointStorageConfig { url: config.url.clone(), s3: config.s3.clone() }.build().unwrap();
    store.list(IN_PROGRESS).unwrap().len()
}

/// A sink; the run it belongs to is the context's `attempt`.
fn sink(config: &ArchiveConfig) -> ArchiveSink<ProcessedReading> {
    config.build::<ProcessedReading>().unwrap()
}

fn lifecycle(config: &ArchiveConfig) {
    let mut ctx = context("archive-test", 0, None);
    ctx.attempt = "a1".into();
    let mut s = sink(config);
    s.on_start(&mut ctx).unwrap();
    s.write_batch((0..10).map(|i| reading(i % 3, START + i * HOUR / 4)).collect(), &mut ctx).unwrap();
    s.pre_commit(CheckpointId(1), &mut ctx).unwrap();
    assert!(published(config).is_empty(), "nothing is published before the checkpoint completes");
    s.on_checkpoint_complete(CheckpointId(1), &mut ctx).unwrap();
    let files = published(config);
    let names: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names[0].starts_with("date=2026-01-01/hour=00/part-sink-0-1-"), "{names:?}");
    assert!(names[2].starts_with("date=2026-01-01/hour=02/"), "{names:?}");
    assert_eq!(files.iter().map(|(_, r)| r.len()).sum::<usize>(), 10);
    assert_eq!(files[0].1[1], reading(1, START + HOUR / 4).value);
    assert_eq!(in_progress(config), 0);
}

#[test]
fn local_files_appear_when_their_checkpoint_completes() {
    let dir = tempfile::tempdir().unwrap();
    lifecycle(&ArchiveConfig::new(dir.path().display().to_string()));
}

fn s3_config() -> Option<ArchiveConfig> {
    let endpoint = service("CAUDAL_S3_ENDPOINT")?;
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
    let mut c =
        ArchiveConfig::new(format!("s3://{}/{}", env("CAUDAL_S3_BUCKET", "caudal"), unique("archive")));
    c.s3 = S3Config {
        endpoint: Some(endpoint),
        region: env("CAUDAL_S3_REGION", "us-east-1"),
        access_key_id: Some(env("CAUDAL_S3_ACCESS_KEY_ID", "test")),
        secret_access_key: Some(env("CAUDAL_S3_SECRET_ACCESS_KEY", "test")),
        allow_http: true,
        ..S3Config::default()
    };
    Some(c)
}

#[test]
fn s3_objects_appear_when_their_checkpoint_completes() {
    let Some(config) = s3_config() else { return };
    lifecycle(&config);
    delete_all(&config);
}

#[test]
fn restore_publishes_the_recorded_epoch_and_discards_newer_ones() {
    let dir = tempfile::tempdir().unwrap();
    restore_case(&ArchiveConfig::new(dir.path().display().to_string()));
}

#[test]
fn on_s3_restore_publishes_the_recorded_epoch_and_discards_newer_ones() {
    let Some(config) = s3_config() else { return };
    restore_case(&config);
    delete_all(&config);
}

fn restore_case(config: &ArchiveConfig) {
    let config = config.clone();
    let mut ctx = context("archive-test", 0, None);
    ctx.attempt = "a1".into();
    let mut a = sink(&config);
    a.on_start(&mut ctx).unwrap();
    a.write_batch(vec![reading(1, START), reading(2, START + 1)], &mut ctx).unwrap();
    let chk1 = a.pre_commit(CheckpointId(1), &mut ctx).unwrap().unwrap();
    a.write_batch(vec![reading(3, START + 2)], &mut ctx).unwrap();
    a.pre_commit(CheckpointId(2), &mut ctx).unwrap();
    a.write_batch(vec![reading(4, START + 3)], &mut ctx).unwrap();
    drop(a); // killed: epoch 1 pre-committed in checkpoint 1, epoch 2 in a checkpoint that never completed
    assert_eq!(in_progress(&config), 2);
    let mut ctx = context("archive-test", 0, Some(1));
    for attempt in ["b1", "c1"] {
        // The second restore stands for a crash during the first one.
        ctx.attempt = attempt.into();
        let mut b = sink(&config);
        b.restore(vec![chk1.clone()], &mut ctx).unwrap();
        let files = published(&config);
        let ids: Vec<i64> = files.iter().flat_map(|(_, r)| r.iter().map(|r| r.sensor_id)).collect();
        assert_eq!(ids, vec![1, 2], "{attempt}");
        assert_eq!(in_progress(&config), 0, "{attempt}");
    }
}

#[test]
fn a_restart_in_the_same_process_removes_what_the_failed_run_left_in_progress() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = tempfile::tempdir().unwrap();
    let config = ArchiveConfig::new(dir.path().join("archive").display().to_string());
    // An hour (a partition, a file) per record: the failed run leaves more in-progress
    // names than the restart writes again (a name written again would hide a leftover).
    let items: Vec<ProcessedReading> = (0..40).map(|i| reading(i % 3, START + i * HOUR).value).collect();
    let make = {
        let config = config.clone();
        move || config.build::<ProcessedReading>()
    };
    let failed = run_in_process("archive-rerun", items.clone(), checkpoints.path(), Some(5), make.clone());
    let e = failed.expect_err("the first run fails").to_string();
    assert!(e.contains("injected failure"), "{e}");
    assert!(in_progress(&config) > 0, "the failed run left checkpoint 5's files in progress");
    // The restart runs in the same process, as a job restarted by its own code would.
    run_in_process("archive-rerun", items.clone(), checkpoints.path(), None, make).unwrap();
    let mut records: Vec<ProcessedReading> = published(&config).into_iter().flat_map(|(_, r)| r).collect();
    records.sort_by_key(|r| r.ts);
    assert_eq!(records, items, "the output of a clean run");
    assert_eq!(in_progress(&config), 0, "nothing left in progress");
}

#[test]
fn a_missing_pre_committed_file_fails_the_restore_loudly() {
    let dir = tempfile::tempdir().unwrap();
    let config = ArchiveConfig::new(dir.path().display().to_string());
    let mut ctx = context("archive-test", 0, None);
    ctx.attempt = "a1".into();
    let mut a = sink(&config);
    a.on_start(&mut ctx).unwrap();
    a.write_batch(vec![reading(1, START)], &mut ctx).unwrap();
    let chk1 = a.pre_commit(CheckpointId(1), &mut ctx).unwrap().unwrap();
    std::fs::remove_dir_all(dir.path().join(IN_PROGRESS)).unwrap();
    let mut ctx = context("archive-test", 0, Some(1));
    ctx.attempt = "b1".into();
    let e = sink(&config).restore(vec![chk1], &mut ctx).unwrap_err();
    assert!(e.to_string().contains("lost"), "{e}");
}

#[test]
fn a_big_epoch_is_cut_into_several_files_and_bounded_runs_publish_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ArchiveConfig::new(dir.path().display().to_string());
    config.target_file_bytes = 1024;
    let mut ctx = context("archive-test", 0, None);
    ctx.checkpointing = false;
    ctx.attempt = "a1".into();
    let mut s = sink(&config);
    s.on_start(&mut ctx).unwrap();
    for b in 0..20 {
        s.write_batch((0..100).map(|i| reading(i, START + b * 100 + i)).collect(), &mut ctx).unwrap();
    }
    assert!(published(&config).is_empty());
    s.on_close(&mut ctx).unwrap();
    let files = published(&config);
    assert!(files.len() > 1, "{} files", files.len());
    assert_eq!(files.iter().map(|(_, r)| r.len()).sum::<usize>(), 2000);
    assert_eq!(in_progress(&config), 0);
}

#[test]
fn a_restore_leaves_the_in_progress_files_of_other_sinks_and_jobs_on_the_same_url() {
    let dir = tempfile::tempdir().unwrap();
    let config = ArchiveConfig::new(dir.path().display().to_string());
    // Two other writers on the same URL with an epoch each uploaded, not yet committed.
    let mut others = Vec::new();
    for (job, uid) in [("other-job", "sink"), ("archive-test", "second-archive")] {
        let mut ctx = context(job, 0, None);
        ctx.operator_uid = uid.into();
        ctx.attempt = "o1".into();
        let mut s = sink(&config);
        s.on_start(&mut ctx).unwrap();
        s.write_batch(vec![reading(7, START)], &mut ctx).unwrap();
        let chk = s.pre_commit(CheckpointId(1), &mut ctx).unwrap().unwrap();
        others.push((s, ctx, chk));
    }
    assert_eq!(in_progress(&config), 2);
    // This sink starts fresh (no checkpoint): it discards its own leftovers only.
    let mut ctx = context("archive-test", 0, None);
    ctx.attempt = "a1".into();
    sink(&config).restore(Vec::new(), &mut ctx).unwrap();
    assert_eq!(in_progress(&config), 2, "another writer's uploaded epoch was deleted");
    for (mut s, mut ctx, _) in others {
        s.on_checkpoint_complete(CheckpointId(1), &mut ctx).unwrap();
    }
    assert_eq!(published(&config).len(), 2, "both epochs published by their own sinks");
}

//! Missing or corrupt checkpoint files give errors that name the file and the
//! checkpoint; falling back to an older checkpoint happens only when asked.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use bytes::Bytes;
use caudal_checkpoints::*;
use common::{checkpoint, open, restore, Kind};

const JOB: &str = "temperature";

/// Two completed RocksDB checkpoints; returns the store and the object name of an SST
/// first uploaded by checkpoint 2.
fn two_checkpoints() -> (InMemoryCheckpointStore, CheckpointPaths, String) {
    let store = InMemoryCheckpointStore::new();
    let paths = CheckpointPaths::new();
    let mut t = open(Kind::RocksDb, KeyGroupRange::all(128));
    let id = StateId::new("s").unwrap();
    for i in 0..500u32 {
        t.backend.put(&StateKey::new((i % 128) as u16, &id, &i.to_be_bytes()), &[7u8; 100]).unwrap();
    }
    checkpoint(&store, &paths, JOB, 1, &mut [&mut t]);
    t.backend.put(&StateKey::new(5, &id, b"new"), b"x").unwrap();
    let (meta2, _) = checkpoint(&store, &paths, JOB, 2, &mut [&mut t]);
    let sst = meta2
        .referenced_objects()
        .into_iter()
        .find(|o| o.starts_with("shared/") && o.contains("/2-"))
        .expect("checkpoint 2 uploaded a new SST");
    (store, paths, sst)
}

fn assert_names(err: &Error, checkpoint: &str, file: &str) {
    let msg = err.to_string();
    assert!(msg.contains(checkpoint), "`{msg}` does not name {checkpoint}");
    assert!(msg.contains(file), "`{msg}` does not name {file}");
    assert_eq!(err.class(), ErrorClass::User);
}

#[test]
fn truncated_sst_is_reported_and_fallback_skips_to_the_previous_checkpoint() {
    let (store, paths, sst) = two_checkpoints();
    let data = store.get(&sst).unwrap();
    store.overwrite(&sst, data.slice(..data.len() / 2));

    let err = latest_completed(&store, &paths, JOB).unwrap_err();
    assert!(matches!(err, Error::CorruptFile { .. }), "{err}");
    assert_names(&err, "chk-2", &sst);
    assert!(err.to_string().contains("truncated"));

    // Restoring from the handles directly fails the same way.
    let meta2: CheckpointMetadata =
        serde_json::from_slice(&store.get(&paths.metadata(CheckpointId(2))).unwrap()).unwrap();
    let handles = meta2.operators[&common::op()].keyed_handles();
    let err = restore(Kind::RocksDb, KeyGroupRange::all(128), &handles, &store).err().unwrap();
    assert_names(&err, "chk-2", &sst);

    let fallback = latest_completed_with_fallback(&store, &paths, JOB).unwrap().unwrap();
    assert_eq!(fallback.metadata.checkpoint_id, CheckpointId(1));
    assert_eq!(fallback.skipped.len(), 1);
    assert_eq!(fallback.skipped[0].checkpoint_id, CheckpointId(2));
    assert_names(&fallback.skipped[0].error, "chk-2", &sst);
    let handles = fallback.metadata.operators[&common::op()].keyed_handles();
    restore(Kind::RocksDb, KeyGroupRange::all(128), &handles, &store).unwrap();
}

#[test]
fn same_size_corruption_is_caught_by_the_checksum() {
    let (store, paths, sst) = two_checkpoints();
    let mut data = store.get(&sst).unwrap().to_vec();
    data[10] ^= 0xff;
    store.overwrite(&sst, Bytes::from(data));
    let meta = latest_completed(&store, &paths, JOB).unwrap().unwrap();
    let handles = meta.operators[&common::op()].keyed_handles();
    let err = restore(Kind::RocksDb, KeyGroupRange::all(128), &handles, &store).err().unwrap();
    assert_names(&err, "chk-2", &sst);
    assert!(err.to_string().contains("sha256"));
}

#[test]
fn garbage_metadata_is_reported() {
    let (store, paths, _) = two_checkpoints();
    let file = paths.metadata(CheckpointId(2));
    store.overwrite(&file, Bytes::from_static(b"{\"format_version\": 1, garbage"));
    let err = latest_completed(&store, &paths, JOB).unwrap_err();
    assert!(matches!(err, Error::BadMetadata { .. }), "{err}");
    assert_names(&err, "chk-2", "chk-2/_metadata");
    let fallback = latest_completed_with_fallback(&store, &paths, JOB).unwrap().unwrap();
    assert_eq!(fallback.metadata.checkpoint_id, CheckpointId(1));
}

#[test]
fn missing_file_is_reported() {
    let (store, paths, _) = two_checkpoints();
    let manifest =
        store.list("chk-2").unwrap().into_iter().find(|e| e.path.contains("MANIFEST")).unwrap().path;
    store.delete(&manifest).unwrap();
    let err = latest_completed(&store, &paths, JOB).unwrap_err();
    assert!(matches!(err, Error::MissingFile { .. }), "{err}");
    assert_names(&err, "chk-2", &manifest);
}

#[test]
fn wrong_job_is_reported_and_not_skipped_silently() {
    let (store, paths, _) = two_checkpoints();
    let err = latest_completed(&store, &paths, "user-interactions").unwrap_err();
    assert!(matches!(err, Error::WrongJob { .. }), "{err}");
    assert_names(&err, "chk-2", "chk-2/_metadata");
    assert!(err.to_string().contains("temperature"));
    // Every checkpoint is of another job: the fallback fails rather than starting
    // from scratch.
    let err = latest_completed_with_fallback(&store, &paths, "user-interactions").unwrap_err();
    assert!(matches!(err, Error::WrongJob { .. }));
}

#[test]
fn no_checkpoint_at_all_is_none() {
    let store = InMemoryCheckpointStore::new();
    let paths = CheckpointPaths::new();
    assert!(latest_completed(&store, &paths, JOB).unwrap().is_none());
    assert!(latest_completed_with_fallback(&store, &paths, JOB).unwrap().is_none());
    // A checkpoint without metadata (crashed before completion) does not count.
    store.put("chk-1/window-avg/0/MANIFEST-000001", Bytes::from_static(b"x")).unwrap();
    assert!(latest_completed(&store, &paths, JOB).unwrap().is_none());
}

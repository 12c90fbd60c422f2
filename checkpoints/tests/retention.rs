//! Retention deletes what no retained checkpoint references, and nothing else.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::collections::HashSet;

use caudal_checkpoints::*;
use common::{checkpoint, dump, open, restore, Kind};

const JOB: &str = "temperature";

#[test]
fn retention_deletes_unreferenced_shared_files_only() {
    let store = InMemoryCheckpointStore::new();
    let paths = CheckpointPaths::new();
    let range = KeyGroupRange::all(128);
    let mut t = open(Kind::RocksDb, range);
    let id = StateId::new("s").unwrap();
    let config = RetentionConfig { retained_checkpoints: 2 };
    let mut metas = Vec::new();
    for n in 1..=6u64 {
        // Overwrite the same keys so that compaction drops old SSTs over time.
        for i in 0..3_000u64 {
            let k = i % 1_000;
            let key = k.to_be_bytes();
            t.backend.put(&StateKey::new((k % 128) as u16, &id, &key), &vec![n as u8; 300]).unwrap();
        }
        let (meta, _) = checkpoint(&store, &paths, JOB, n, &mut [&mut t]);
        metas.push(meta);
        let report = apply_retention(&store, &paths, JOB, &config).unwrap();
        let first_kept = n.saturating_sub(1).max(1);
        assert_eq!(report.retained.first(), Some(&CheckpointId(first_kept)));

        // Everything a retained checkpoint references is still there ...
        let retained: Vec<&CheckpointMetadata> =
            metas.iter().filter(|m| m.checkpoint_id.0 >= first_kept).collect();
        let referenced: HashSet<String> = retained.iter().flat_map(|m| m.referenced_objects()).collect();
        for object in &referenced {
            assert!(store.head(object).unwrap().is_some(), "{object} deleted");
        }
        // ... and no shared file is left that none references.
        for e in store.list("shared").unwrap() {
            assert!(referenced.contains(&e.path), "{} left behind", e.path);
        }
        for deleted in &report.deleted_shared_files {
            assert!(!referenced.contains(deleted));
        }
        // Old checkpoint folders are gone.
        for old in 1..first_kept {
            assert!(store.list(&format!("chk-{old}")).unwrap().is_empty(), "chk-{old} kept");
        }
    }
    // The oldest retained checkpoint still restores.
    let oldest = read_metadata(&store, &paths, CheckpointId(5), JOB).unwrap();
    let r = restore(Kind::RocksDb, range, &oldest.operators[&common::op()].keyed_handles(), &store).unwrap();
    assert_eq!(dump(r.backend.as_ref()).len(), 1_000);
}

#[test]
fn retention_keeps_files_of_a_checkpoint_in_flight_and_deletes_aborted_ones() {
    let store = InMemoryCheckpointStore::new();
    let paths = CheckpointPaths::new();
    let mut t = open(Kind::RocksDb, KeyGroupRange::all(128));
    let id = StateId::new("s").unwrap();
    t.backend.put(&StateKey::new(0, &id, b"a"), b"1").unwrap();
    checkpoint(&store, &paths, JOB, 1, &mut [&mut t]);
    // Checkpoint 2 uploads but is aborted (never completes).
    t.backend.put(&StateKey::new(0, &id, b"b"), b"2").unwrap();
    t.backend.snapshot(&common::location(&paths, 2, 0)).unwrap().upload(&store).unwrap();
    checkpoint(&store, &paths, JOB, 3, &mut [&mut t]);
    // Checkpoint 4 is in flight: uploaded, metadata not written yet.
    t.backend.put(&StateKey::new(0, &id, b"c"), b"3").unwrap();
    let in_flight = t.backend.snapshot(&common::location(&paths, 4, 0)).unwrap().upload(&store).unwrap();

    let report = apply_retention(&store, &paths, JOB, &RetentionConfig { retained_checkpoints: 1 }).unwrap();
    assert_eq!(report.retained, vec![CheckpointId(3)]);
    assert_eq!(report.deleted_checkpoints, vec![CheckpointId(1), CheckpointId(2)]);
    for f in in_flight.handle.files() {
        assert!(store.head(&f.object).unwrap().is_some(), "in-flight {} deleted", f.object);
    }
    assert!(store.list("chk-4").unwrap().len() >= 3);
}

#[test]
fn savepoints_are_self_contained_and_survive_retention() {
    let store = InMemoryCheckpointStore::new();
    let paths = CheckpointPaths::new();
    let range = KeyGroupRange::all(128);
    let mut t = open(Kind::RocksDb, range);
    let id = StateId::new("s").unwrap();
    t.backend.put(&StateKey::new(3, &id, b"k"), b"v1").unwrap();
    checkpoint(&store, &paths, JOB, 1, &mut [&mut t]);
    let sp = create_savepoint(&store, &paths, CheckpointId(1), "before-upgrade", JOB).unwrap();
    assert_eq!(sp.kind, CheckpointKind::Savepoint);
    assert!(sp.referenced_objects().iter().all(|o| o.starts_with("savepoints/before-upgrade/")));
    assert!(create_savepoint(&store, &paths, CheckpointId(1), "before-upgrade", JOB).is_err());

    for n in 2..=5 {
        t.backend.put(&StateKey::new(3, &id, b"k"), format!("v{n}").as_bytes()).unwrap();
        checkpoint(&store, &paths, JOB, n, &mut [&mut t]);
        apply_retention(&store, &paths, JOB, &RetentionConfig { retained_checkpoints: 1 }).unwrap();
    }
    let sp = retention::read_savepoint(&store, &paths, "before-upgrade", JOB).unwrap();
    let r = restore(Kind::RocksDb, range, &sp.operators[&common::op()].keyed_handles(), &store).unwrap();
    assert_eq!(r.backend.get(&StateKey::new(3, &id, b"k")).unwrap(), Some(b"v1".to_vec()));
    assert_eq!(retention::list_savepoints(&store, &paths).unwrap(), ["before-upgrade"]);
    retention::delete_savepoint(&store, &paths, "before-upgrade").unwrap();
    assert!(store.list("savepoints").unwrap().is_empty());
}

/// Issue #17, item 12: with one retained checkpoint, a completion notification that
/// arrives late made the next incremental snapshot reuse a file of that checkpoint which
/// retention had already deleted (a later checkpoint had uploaded its own copy): the
/// checkpoint completed and could not be restored. The barrier names the latest completed
/// checkpoint, and only its files are reused.
#[test]
fn a_late_completion_notification_never_makes_a_snapshot_reference_a_deleted_file() {
    let store = InMemoryCheckpointStore::new();
    let paths = CheckpointPaths::new();
    let range = KeyGroupRange::all(128);
    let mut t = open(Kind::RocksDb, range);
    let id = StateId::new("s").unwrap();
    let config = RetentionConfig { retained_checkpoints: 1 };
    let put = |t: &mut common::TestBackend, round: u8| {
        for k in 0..500u64 {
            t.backend.put(&StateKey::new((k % 128) as u16, &id, &k.to_be_bytes()), &[round; 200]).unwrap();
        }
    };
    put(&mut t, 1);
    checkpoint(&store, &paths, JOB, 1, &mut [&mut t]);
    // A new SST after checkpoint 1; checkpoints 2 and 3 each upload it (their
    // notifications have not arrived, and their barriers name no completion, as all
    // barriers did before), so retention after 3 keeps only 3's copy.
    put(&mut t, 2);
    common::take_checkpoint(&store, &paths, JOB, 2, None, &mut [t.backend.as_mut()]);
    common::take_checkpoint(&store, &paths, JOB, 3, None, &mut [t.backend.as_mut()]);
    let report = apply_retention(&store, &paths, JOB, &config).unwrap();
    assert!(!report.deleted_shared_files.is_empty(), "checkpoint 2's copy must be deleted: {report:?}");
    // Checkpoint 2's notification arrives now, after retention.
    t.backend.notify_checkpoint_complete(CheckpointId(2));
    t.backend.put(&StateKey::new(0, &id, b"after"), b"x").unwrap();
    let (meta4, stats4) = common::take_checkpoint(&store, &paths, JOB, 4, Some(3), &mut [t.backend.as_mut()]);
    assert!(stats4[0].reused_files > 0, "checkpoint 3's files are reused: {stats4:?}");
    for object in meta4.referenced_objects() {
        assert!(store.head(&object).unwrap().is_some(), "checkpoint 4 references the deleted {object}");
    }
    let handles = meta4.operators[&common::op()].keyed_handles();
    let r = restore(Kind::RocksDb, range, &handles, &store).unwrap();
    assert_eq!(dump(r.backend.as_ref()), dump(t.backend.as_ref()));
}

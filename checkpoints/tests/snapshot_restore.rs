//! Snapshot → restore round trips, incremental uploads and rescaling.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::collections::BTreeMap;

use caudal_checkpoints::*;
use common::{checkpoint, dump, kg_of, open, restore, Kind, TestBackend, KINDS};

const JOB: &str = "temperature";

/// Writes `n` sensors into value, map and list state of the backend's range; returns
/// the expected value-state content.
fn fill(t: &mut TestBackend, n: u32, round: u32) -> BTreeMap<String, (u16, u64)> {
    let range = t.backend.key_groups();
    let value: ValueState<String, u64> = ValueState::new("v").unwrap();
    let map: MapState<String, u32, String> = MapState::new("m").unwrap();
    let list: ListState<String, u32> = ListState::new("l").unwrap();
    let mut expected = BTreeMap::new();
    for i in 0..n {
        let key = format!("sensor-{i}");
        let kg = kg_of(&key);
        if !range.contains(kg) {
            continue;
        }
        let b = t.backend.as_mut();
        value.put(b, kg, &key, &(), &u64::from(i * 10 + round)).unwrap();
        map.insert(b, kg, &key, &(), &round, &format!("r{round}")).unwrap();
        list.add(b, kg, &key, &(), &round).unwrap();
        expected.insert(key, (kg, u64::from(i * 10 + round)));
    }
    expected
}

fn check(t: &TestBackend, expected: &BTreeMap<String, (u16, u64)>) {
    let value: ValueState<String, u64> = ValueState::new("v").unwrap();
    for (key, (kg, v)) in expected {
        assert_eq!(value.get(t.backend.as_ref(), *kg, key, &()).unwrap(), Some(*v), "{key}");
    }
}

fn round_trip(kind: Kind, store: &dyn CheckpointStore) {
    let paths = CheckpointPaths::under("job-a");
    let range = KeyGroupRange::all(128);
    let mut t = open(kind, range);
    let expected = fill(&mut t, 500, 1);
    let before = dump(t.backend.as_ref());
    let (meta, _) = checkpoint(store, &paths, JOB, 1, &mut [&mut t]);
    // Writes after the barrier are not in the checkpoint.
    fill(&mut t, 500, 2);

    let latest = latest_completed(store, &paths, JOB).unwrap().unwrap();
    assert_eq!(latest, meta);
    assert_eq!(
        latest.operators[&common::op()].subtasks[&SubtaskIndex(0)].operator_state,
        Some(Blob(vec![0]))
    );
    let handles = latest.operators[&common::op()].keyed_handles();
    let r = restore(kind, range, &handles, store).unwrap();
    assert_eq!(dump(r.backend.as_ref()), before, "{kind:?}");
    check(&r, &expected);
}

#[test]
fn round_trip_in_memory_store() {
    let store = InMemoryCheckpointStore::new();
    for kind in KINDS {
        round_trip(kind, &store);
        store_clear(&store);
    }
}

fn store_clear(store: &dyn CheckpointStore) {
    for e in store.list("").unwrap() {
        store.delete(&e.path).unwrap();
    }
}

#[test]
fn round_trip_local_directory_store() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let store = CheckpointStorageConfig { url, ..Default::default() }.build().unwrap();
    for kind in KINDS {
        round_trip(kind, &store);
        store_clear(&store);
    }
}

/// Deterministic, poorly compressible bytes.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn second_checkpoint_uploads_only_new_sst_files() {
    let store = InMemoryCheckpointStore::new();
    let paths = CheckpointPaths::new();
    let range = KeyGroupRange::all(128);
    let dir = tempfile::tempdir().unwrap();
    let mut db =
        RocksDbStateBackend::open(dir.path(), &common::op(), range, &common::small_rocksdb()).unwrap();
    let id = StateId::new("blob").unwrap();
    // ~6 MB in 1 MB memtables: several SST files.
    for i in 0..12_000u64 {
        let key = i.to_be_bytes();
        let kg = (i % 128) as u16;
        db.put(&StateKey::new(kg, &id, &key), &noise(i, 500)).unwrap();
    }
    // Let compaction settle so that it does not rewrite files between the checkpoints.
    db.wait_for_background_work().unwrap();
    let (_, s1) = common::checkpoint_backends(&store, &paths, JOB, 1, &mut [&mut db]);
    let s1 = s1[0];
    assert_eq!(s1.reused_files, 0);
    assert!(s1.uploaded_files >= 4, "{s1:?}");
    db.wait_for_background_work().unwrap();

    // A small change: 20 keys.
    for i in 0..20u64 {
        db.put(&StateKey::new((i % 128) as u16, &id, b"changed"), &noise(i + 1_000_000, 500)).unwrap();
    }
    let bytes_before = store.put_bytes();
    let (meta2, s2) = common::checkpoint_backends(&store, &paths, JOB, 2, &mut [&mut db]);
    let s2 = s2[0];
    let t = TestBackend { backend: Box::new(db), dir };
    let written = store.put_bytes() - bytes_before;
    let total = meta2.state_size();
    eprintln!("checkpoint 1: {s1:?}\ncheckpoint 2: {s2:?}, {written} of {total} bytes written");
    assert!(s2.reused_files >= 3, "{s2:?}");
    // One new SST (the flushed memtable) plus MANIFEST, CURRENT, OPTIONS.
    assert!(s2.uploaded_files <= 5, "{s2:?}");
    assert!(written * 5 < total, "wrote {written} of {total} bytes");
    assert_eq!(s2.uploaded_bytes + metadata_size(&store, &paths, 2), written);

    // The incremental checkpoint restores everything.
    let before = dump(t.backend.as_ref());
    let handles = meta2.operators[&common::op()].keyed_handles();
    let r = restore(Kind::RocksDb, range, &handles, &store).unwrap();
    assert_eq!(dump(r.backend.as_ref()), before);

    // A checkpoint of the restored backend reuses the files of checkpoint 2.
    let mut r = r;
    r.backend.put(&StateKey::new(1, &id, b"after-restore"), b"x").unwrap();
    let (meta3, s3) = checkpoint(&store, &paths, JOB, 3, &mut [&mut r]);
    eprintln!("checkpoint 3 after restore: {:?}", s3[0]);
    // Every SST the restored database still has (same name) is referenced, not
    // uploaded again (compaction after the restore may have replaced some).
    let shared = |m: &CheckpointMetadata| -> BTreeMap<String, String> {
        match &m.operators[&common::op()].subtasks[&SubtaskIndex(0)].keyed_state {
            Some(StateHandle::RocksDb(h)) => {
                h.shared.iter().map(|f| (f.local_name.clone(), f.object.clone())).collect()
            }
            other => panic!("{other:?}"),
        }
    };
    let (in2, in3) = (shared(&meta2), shared(&meta3));
    let kept: Vec<_> = in3.iter().filter(|(name, _)| in2.contains_key(*name)).collect();
    assert_eq!(kept.len() as u64, s3[0].reused_files, "{:?}", s3[0]);
    for (name, object) in kept {
        assert_eq!(&in2[name], object, "{name} uploaded again");
    }
}

fn metadata_size(store: &dyn CheckpointStore, paths: &CheckpointPaths, id: u64) -> u64 {
    store.head(&paths.metadata(CheckpointId(id))).unwrap().unwrap()
}

#[test]
fn unconfirmed_uploads_are_not_reused() {
    // Checkpoint 1 is uploaded but never completes: checkpoint 2 must not reference
    // its files, which retention may delete.
    let store = InMemoryCheckpointStore::new();
    let paths = CheckpointPaths::new();
    let mut t = open(Kind::RocksDb, KeyGroupRange::all(128));
    let id = StateId::new("s").unwrap();
    t.backend.put(&StateKey::new(0, &id, b"k"), b"v").unwrap();
    let snap = t.backend.snapshot(&common::location(&paths, 1, 0)).unwrap();
    snap.upload(&store).unwrap();
    let (_, s2) = checkpoint(&store, &paths, JOB, 2, &mut [&mut t]);
    assert_eq!(s2[0].reused_files, 0);
}

/// State of 2 subtasks restored at parallelism 3 and 1: each new subtask holds
/// exactly the original keys of its key groups.
fn rescale(from: Kind, to: Kind) {
    let store = InMemoryCheckpointStore::new();
    let paths = CheckpointPaths::new();
    let mut old: Vec<TestBackend> =
        (0..2).map(|i| open(from, KeyGroupRange::of_subtask(128, 2, i))).collect();
    let mut expected = BTreeMap::new();
    for t in old.iter_mut() {
        expected.extend(fill(t, 800, 1));
    }
    let mut all_before: Vec<_> = old.iter().flat_map(|t| dump(t.backend.as_ref())).collect();
    all_before.sort();
    let mut refs: Vec<&mut TestBackend> = old.iter_mut().collect();
    let (meta, _) = checkpoint(&store, &paths, JOB, 1, &mut refs);
    let handles = meta.operators[&common::op()].keyed_handles();
    assert_eq!(handles.len(), 2);

    for parallelism in [3u32, 1] {
        let mut all_after = Vec::new();
        for i in 0..parallelism {
            let range = KeyGroupRange::of_subtask(128, parallelism, i);
            let mine = handles_for_range(&handles, range);
            let r = restore(to, range, &mine, &store).unwrap();
            let entries = dump(r.backend.as_ref());
            assert!(entries.iter().all(|(kg, _, _)| range.contains(*kg)));
            let want: BTreeMap<_, _> = expected
                .iter()
                .filter(|(_, (kg, _))| range.contains(*kg))
                .map(|(k, v)| (k.clone(), *v))
                .collect();
            check(&r, &want);
            // Nothing else: value entries = keys of the range.
            let values = entries.iter().filter(|(_, k, _)| keys::decode_key(k).unwrap().state == "v").count();
            assert_eq!(values, want.len(), "{from:?}->{to:?} p={parallelism} i={i}");
            all_after.extend(entries);
        }
        all_after.sort();
        assert_eq!(all_after, all_before, "{from:?}->{to:?} p={parallelism}");
    }
}

#[test]
fn rescale_2_to_3_and_1_heap() {
    rescale(Kind::Heap, Kind::Heap);
}

#[test]
fn rescale_2_to_3_and_1_rocksdb() {
    rescale(Kind::RocksDb, Kind::RocksDb);
}

#[test]
fn restore_across_backends() {
    rescale(Kind::RocksDb, Kind::Heap);
    rescale(Kind::Heap, Kind::RocksDb);
}

#[test]
fn scale_out_from_one_rocksdb_handle_keeps_only_the_new_range() {
    let store = InMemoryCheckpointStore::new();
    let paths = CheckpointPaths::new();
    let mut t = open(Kind::RocksDb, KeyGroupRange::all(128));
    let expected = fill(&mut t, 600, 1);
    let (meta, _) = checkpoint(&store, &paths, JOB, 1, &mut [&mut t]);
    let handles = meta.operators[&common::op()].keyed_handles();
    let mut total = 0;
    for i in 0..2 {
        let range = KeyGroupRange::of_subtask(128, 2, i);
        let r = restore(Kind::RocksDb, range, &handles_for_range(&handles, range), &store).unwrap();
        let entries = dump(r.backend.as_ref());
        assert!(entries.iter().all(|(kg, _, _)| range.contains(*kg)));
        let stats: u64 = r.backend.key_group_stats().unwrap().iter().map(|s| s.entries).sum();
        assert_eq!(stats as usize, entries.len());
        total += entries.len();
        let want: BTreeMap<_, _> = expected
            .iter()
            .filter(|(_, (kg, _))| range.contains(*kg))
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        check(&r, &want);
    }
    assert_eq!(total, dump(t.backend.as_ref()).len());
}

/// The upload runs off the task thread while the task goes on writing: writes (and deletes)
/// between the barrier's snapshot and its upload must not reach it (the heap backend shares
/// its maps with the snapshot and copies a key group on its first write).
#[test]
fn writes_between_the_snapshot_and_its_upload_stay_out_of_it() {
    let store = InMemoryCheckpointStore::new();
    let paths = CheckpointPaths::under("job-b");
    let range = KeyGroupRange::all(128);
    let value: ValueState<String, u64> = ValueState::new("v").unwrap();
    for kind in KINDS {
        let mut t = open(kind, range);
        let expected = fill(&mut t, 300, 1);
        let before = dump(t.backend.as_ref());
        let snap = t.backend.snapshot(&common::location(&paths, 1, 0)).unwrap();
        fill(&mut t, 300, 2);
        let (kg, _) = expected["sensor-7"];
        value.clear(t.backend.as_mut(), kg, &"sensor-7".to_string(), &()).unwrap();
        let result = snap.upload(&store).unwrap();
        let r = restore(kind, range, &[result.handle], &store).unwrap();
        assert_eq!(dump(r.backend.as_ref()), before, "{kind:?}");
        check(&r, &expected);
        // The live backend has the later writes.
        assert_eq!(value.get(t.backend.as_ref(), kg, &"sensor-7".to_string(), &()).unwrap(), None);
        let (kg8, _) = expected["sensor-8"];
        assert_eq!(value.get(t.backend.as_ref(), kg8, &"sensor-8".to_string(), &()).unwrap(), Some(82));
        store_clear(&store);
    }
}

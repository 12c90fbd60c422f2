//! The heap backend: one sorted map per key group, snapshotted to one file.
//!
//! The synchronous snapshot part shares the maps with the snapshot (each key group's map is
//! behind an `Arc`, copied on write: a key group written to while its snapshot is still
//! being uploaded is copied then, the others never); the upload serializes them (bincode) to
//! `chk-<n>/<operator>/<subtask>/keyed-state.bin` off the task thread.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{
    check_key_group, fetch_verified, frame_list_element, sha256_hex, BatchOp, EntryPage, EntrySink,
    HeapStateHandle, KeyGroupStats, KeyedStateBackend, RawEntry, SnapshotResult, StateHandle, StateSnapshot,
    StateWriteBatch, StoredFile, UploadStats,
};
use crate::ids::CheckpointId;
use crate::keygroup::KeyGroupRange;
use crate::keys::{key_group_of_encoded, prefix_successor, StateKey};
use crate::store::{CheckpointStore, StateLocation};
use crate::{Error, Result};

/// Name of the snapshot file inside the subtask's checkpoint folder.
pub const HEAP_SNAPSHOT_FILE: &str = "keyed-state.bin";
const HEAP_FORMAT_VERSION: u32 = 1;

type Group = BTreeMap<Vec<u8>, Vec<u8>>;
/// A key group's sorted entries as stored in a snapshot file.
type GroupEntries = (u16, Vec<(Vec<u8>, Vec<u8>)>);

/// Keyed state in memory.
#[derive(Debug, Clone)]
pub struct HeapStateBackend {
    range: KeyGroupRange,
    /// Per key group of `range`, shared with snapshots being uploaded (copy on write).
    groups: Vec<Arc<Group>>,
    /// Where a looked-up key is encoded (no allocation per lookup).
    scratch: std::cell::RefCell<Vec<u8>>,
}

#[derive(Serialize, Deserialize)]
struct HeapSnapshotFile {
    format_version: u32,
    key_groups: KeyGroupRange,
    /// (key group, sorted entries with full encoded keys)
    groups: Vec<GroupEntries>,
}

impl HeapStateBackend {
    /// An empty backend for `range`.
    pub fn new(range: KeyGroupRange) -> Self {
        HeapStateBackend {
            range,
            groups: (0..range.len()).map(|_| Arc::default()).collect(),
            scratch: Default::default(),
        }
    }

    /// A backend for `range` holding the entries of `range` found in `handles` (heap or
    /// RocksDB handles of any ranges: rescaling keeps only the key groups of `range`).
    pub fn restore(
        range: KeyGroupRange,
        handles: &[StateHandle],
        store: &dyn CheckpointStore,
    ) -> Result<Self> {
        let mut backend = HeapStateBackend::new(range);
        for handle in handles {
            let wanted = handle.key_groups().intersect(&range);
            if wanted.is_empty() {
                continue;
            }
            match handle {
                StateHandle::Heap(h) => {
                    for_each_heap_entry(store, h, wanted, &mut |k, v| {
                        backend.insert_raw(k.to_vec(), v.to_vec());
                        Ok(())
                    })?;
                }
                StateHandle::RocksDb(h) => {
                    let scratch =
                        tempfile::tempdir().map_err(Error::io("creating a restore directory", "tmp"))?;
                    super::rocksdb::for_each_rocksdb_entry(store, h, wanted, scratch.path(), &mut |k, v| {
                        backend.insert_raw(k.to_vec(), v.to_vec());
                        Ok(())
                    })?;
                }
            }
        }
        Ok(backend)
    }

    fn insert_raw(&mut self, key: Vec<u8>, value: Vec<u8>) {
        if let Some(kg) = key_group_of_encoded(&key) {
            if self.range.contains(kg) {
                let i = usize::from(kg - self.range.start);
                Arc::make_mut(&mut self.groups[i]).insert(key, value);
            }
        }
    }

    fn group(&self, kg: u16) -> Result<&Group> {
        check_key_group(self.range, kg)?;
        Ok(&self.groups[usize::from(kg - self.range.start)])
    }

    fn group_mut(&mut self, kg: u16) -> Result<&mut Group> {
        check_key_group(self.range, kg)?;
        Ok(Arc::make_mut(&mut self.groups[usize::from(kg - self.range.start)]))
    }

    fn apply(&mut self, op: BatchOp) -> Result<()> {
        let kg = match &op {
            BatchOp::Put(k, _) | BatchOp::Delete(k) | BatchOp::Append(k, _) => key_group_of_encoded(k)
                .ok_or_else(|| Error::Codec {
                    state: "batch".into(),
                    reason: "key shorter than a key group".into(),
                })?,
        };
        let g = self.group_mut(kg)?;
        match op {
            BatchOp::Put(k, v) => {
                g.insert(k, v);
            }
            BatchOp::Delete(k) => {
                g.remove(&k);
            }
            BatchOp::Append(k, framed) => g.entry(k).or_default().extend_from_slice(&framed),
        }
        Ok(())
    }
}

/// Calls `f` for every entry of `wanted` key groups in a heap snapshot.
pub(crate) fn for_each_heap_entry(
    store: &dyn CheckpointStore,
    handle: &HeapStateHandle,
    wanted: KeyGroupRange,
    f: EntrySink<'_>,
) -> Result<()> {
    let data = fetch_verified(store, &handle.file, handle.checkpoint_id)?;
    let corrupt = |reason: String| Error::CorruptFile {
        checkpoint: handle.checkpoint_id.label(),
        file: handle.file.object.clone(),
        reason,
    };
    let (snap, _): (HeapSnapshotFile, usize) =
        bincode::serde::decode_from_slice(&data, bincode::config::standard())
            .map_err(|e| corrupt(e.to_string()))?;
    if snap.format_version != HEAP_FORMAT_VERSION {
        return Err(corrupt(format!("unknown heap snapshot format {}", snap.format_version)));
    }
    for (kg, entries) in snap.groups {
        if wanted.contains(kg) {
            for (k, v) in entries {
                f(&k, &v)?;
            }
        }
    }
    Ok(())
}

impl KeyedStateBackend for HeapStateBackend {
    fn key_groups(&self) -> KeyGroupRange {
        self.range
    }

    fn get(&self, key: &StateKey<'_>) -> Result<Option<Vec<u8>>> {
        let g = self.group(key.key_group)?;
        let mut k = self.scratch.borrow_mut();
        k.clear();
        key.encode_into(&mut k)?;
        Ok(g.get(k.as_slice()).cloned())
    }

    /// An existing entry's value is overwritten in place (no allocation for the key).
    fn put(&mut self, key: &StateKey<'_>, value: &[u8]) -> Result<()> {
        let mut k = std::mem::take(self.scratch.get_mut());
        k.clear();
        key.encode_into(&mut k)?;
        let g = self.group_mut(key.key_group)?;
        match g.get_mut(k.as_slice()) {
            Some(v) => {
                v.clear();
                v.extend_from_slice(value);
            }
            None => {
                g.insert(k.clone(), value.to_vec());
            }
        }
        *self.scratch.get_mut() = k;
        Ok(())
    }

    fn delete(&mut self, key: &StateKey<'_>) -> Result<()> {
        let mut k = std::mem::take(self.scratch.get_mut());
        k.clear();
        key.encode_into(&mut k)?;
        self.group_mut(key.key_group)?.remove(k.as_slice());
        *self.scratch.get_mut() = k;
        Ok(())
    }

    fn append(&mut self, key: &StateKey<'_>, element: &[u8]) -> Result<()> {
        let k = key.encode()?;
        let framed = frame_list_element(element);
        self.group_mut(key.key_group)?.entry(k).or_default().extend_from_slice(&framed);
        Ok(())
    }

    fn write_batch(&mut self, batch: StateWriteBatch) -> Result<()> {
        // Check every key group first so that a bad batch changes nothing.
        for op in &batch.ops {
            let (BatchOp::Put(k, _) | BatchOp::Delete(k) | BatchOp::Append(k, _)) = op;
            let kg = key_group_of_encoded(k).unwrap_or(u16::MAX);
            check_key_group(self.range, kg)?;
        }
        for op in batch.ops {
            self.apply(op)?;
        }
        Ok(())
    }

    fn scan_map(&self, key: &StateKey<'_>) -> Result<Vec<RawEntry>> {
        let g = self.group(key.key_group)?;
        let mut prefix = Vec::new();
        key.encode_prefix_into(&mut prefix)?;
        let upper = match prefix_successor(&prefix) {
            Some(u) => Bound::Excluded(u),
            None => Bound::Unbounded,
        };
        Ok(g.range::<Vec<u8>, _>((Bound::Included(prefix), upper))
            .map(|(k, v)| RawEntry { key: k.clone(), value: v.clone() })
            .collect())
    }

    fn delete_map(&mut self, key: &StateKey<'_>) -> Result<()> {
        let keys: Vec<Vec<u8>> = self.scan_map(key)?.into_iter().map(|e| e.key).collect();
        let g = self.group_mut(key.key_group)?;
        for k in keys {
            g.remove(&k);
        }
        Ok(())
    }

    fn list_entries(&self, key_group: u16, after: Option<&[u8]>, limit: usize) -> Result<EntryPage> {
        let g = self.group(key_group)?;
        let lower = match after {
            Some(a) => Bound::Excluded(a.to_vec()),
            None => Bound::Unbounded,
        };
        let mut entries: Vec<RawEntry> = g
            .range::<Vec<u8>, _>((lower, Bound::Unbounded))
            .take(limit.saturating_add(1))
            .map(|(k, v)| RawEntry { key: k.clone(), value: v.clone() })
            .collect();
        let next = if entries.len() > limit {
            entries.truncate(limit);
            entries.last().map(|e| e.key.clone())
        } else {
            None
        };
        Ok(EntryPage { entries, next })
    }

    fn key_group_stats(&self) -> Result<Vec<KeyGroupStats>> {
        Ok(self
            .range
            .iter()
            .zip(&self.groups)
            .map(|(kg, g)| KeyGroupStats {
                key_group: kg,
                entries: g.len() as u64,
                bytes: g.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum(),
            })
            .collect())
    }

    fn snapshot(&mut self, location: &StateLocation) -> Result<Box<dyn StateSnapshot>> {
        Ok(Box::new(HeapSnapshot {
            range: self.range,
            groups: self.groups.clone(),
            checkpoint: location.checkpoint,
            object: location.private_file(HEAP_SNAPSHOT_FILE),
        }))
    }

    fn notify_checkpoint_complete(&mut self, _checkpoint: CheckpointId) {}

    fn kind(&self) -> &'static str {
        "heap"
    }
}

/// [`HeapSnapshotFile`] as written: the same fields, entries borrowed from the shared maps
/// (`&Vec<u8>` encodes exactly as `Vec<u8>`).
#[derive(Serialize)]
struct HeapSnapshotFileRef<'a> {
    format_version: u32,
    key_groups: KeyGroupRange,
    groups: Vec<GroupEntriesRef<'a>>,
}

/// [`GroupEntries`] borrowed.
type GroupEntriesRef<'a> = (u16, Vec<(&'a Vec<u8>, &'a Vec<u8>)>);

struct HeapSnapshot {
    range: KeyGroupRange,
    groups: Vec<Arc<Group>>,
    checkpoint: CheckpointId,
    object: String,
}

impl StateSnapshot for HeapSnapshot {
    fn upload(self: Box<Self>, store: &dyn CheckpointStore) -> Result<SnapshotResult> {
        let file = HeapSnapshotFileRef {
            format_version: HEAP_FORMAT_VERSION,
            key_groups: self.range,
            groups: self
                .range
                .iter()
                .zip(&self.groups)
                .filter(|(_, g)| !g.is_empty())
                .map(|(kg, g)| (kg, g.iter().collect()))
                .collect(),
        };
        let data = bincode::serde::encode_to_vec(&file, bincode::config::standard())
            .map_err(|e| Error::Codec { state: "heap snapshot".into(), reason: e.to_string() })?;
        let stored = StoredFile {
            local_name: HEAP_SNAPSHOT_FILE.to_string(),
            object: self.object.clone(),
            size: data.len() as u64,
            sha256: sha256_hex(&data),
        };
        store.put(&self.object, Bytes::from(data))?;
        Ok(SnapshotResult {
            stats: UploadStats { uploaded_files: 1, uploaded_bytes: stored.size, ..Default::default() },
            handle: StateHandle::Heap(HeapStateHandle {
                checkpoint_id: self.checkpoint,
                key_groups: self.range,
                file: stored,
            }),
        })
    }
}

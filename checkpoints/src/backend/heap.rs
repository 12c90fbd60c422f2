//! The heap backend: one hash table per key group, snapshotted to one file.
//!
//! A key group's table is keyed by the entry's prefix (key group, state, key, namespace), so
//! a per-record lookup hashes once, as Flink's heap state table does, instead of walking a
//! sorted tree of byte strings (a cache miss per comparison once the keys outgrow the
//! cache). A slot holds a small prefix and value itself, and a bigger one in one
//! allocation, so a lookup reads both from one place (`slot.rs`). Map state keeps the
//! entries of one (key, namespace) in a sorted map under their shared prefix, so scans stay
//! in key order.
//!
//! The synchronous snapshot part shares the tables with the snapshot (a key group's table
//! goes behind an `Arc` then, copied on write: a key group written to while its snapshot is
//! still being uploaded is copied then, the others never; between snapshots it is owned, so
//! a write costs no atomic operation); the upload sorts and serializes them (bincode) to
//! `chk-<n>/<operator>/<subtask>/keyed-state.bin` off the task thread.

mod slot;

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::lookahead::{Lookahead, Lookup, Probed};
use super::prefix_hash::PrefixHasher;
use super::probe_table::{prefetch_line, Hashed, ProbeTable};
use super::{
    check_key_group, fetch_verified, frame_list_element, sha256_hex, BatchOp, EntryHint, EntryPage,
    EntrySink, HeapStateHandle, KeyGroupStats, KeyedStateBackend, RawEntry, SnapshotResult, StateHandle,
    StateSnapshot, StateWriteBatch, StoredFile, UploadStats,
};
use crate::ids::CheckpointId;
use crate::keygroup::KeyGroupRange;
use crate::keys::{bytes_eq, key_group_of_encoded, prefix_len, StateKey};
use crate::store::{CheckpointStore, StateLocation};
use crate::{Error, Result};
use slot::{tagged, Change, Slot, Spill};

/// Name of the snapshot file inside the subtask's checkpoint folder.
pub const HEAP_SNAPSHOT_FILE: &str = "keyed-state.bin";
const HEAP_FORMAT_VERSION: u32 = 1;

/// The entries (about 100 bytes each with a small key and value) from which the state no
/// longer fits in a core's cache (1-2 MB) and lookups are announced ahead.
const LOOKAHEAD_MIN_ENTRIES: usize = 16 * 1024;

/// A key group's sorted entries as stored in a snapshot file.
type GroupEntries = (u16, Vec<(Vec<u8>, Vec<u8>)>);

/// The entries of one key group by prefix. The hash has a random seed: keys come from the
/// data, so it must not be one an input can be crafted to collide.
#[derive(Debug, Clone, Default)]
struct Group {
    table: ProbeTable<Slot>,
    /// The bytes of slots too big to hold their own.
    spill: Spill,
    hasher: PrefixHasher,
}

impl Group {
    /// The hash of `key`'s prefix, as the table takes it.
    #[inline]
    fn hash_key(&self, key: &StateKey<'_>) -> u64 {
        tagged(self.hasher.hash_key(key))
    }

    /// The hash of an encoded prefix, as the table takes it.
    fn hash_encoded(&self, prefix: &[u8]) -> u64 {
        tagged(self.hasher.hash_encoded(prefix))
    }

    /// The bucket of the slot under `prefix`.
    fn find_bucket(&self, prefix: &[u8]) -> Option<usize> {
        self.find_hashed(self.hash_encoded(prefix), prefix)
    }

    /// The bucket of the slot under `key`'s prefix: a short prefix hashed and compared as
    /// its image, a longer one part by part (nothing encoded either way).
    #[inline(always)]
    fn find_key(&self, key: &StateKey<'_>) -> Option<usize> {
        let Some((image, len)) = key.prefix_image() else {
            let hash = tagged(self.hasher.hash_parts_of(key));
            return self.table.find(hash, |s| key.prefix_matches(s.prefix(&self.spill)));
        };
        let hash = tagged(self.hasher.hash_image(image, len));
        self.table.find(hash, |s| {
            s.prefix_is(image, len).unwrap_or_else(|| key.prefix_matches(s.prefix(&self.spill)))
        })
    }

    fn find_hashed(&self, hash: u64, prefix: &[u8]) -> Option<usize> {
        self.table.find(hash, |s| bytes_eq(s.prefix(&self.spill), prefix))
    }

    /// The prefix of the slot in `bucket`.
    #[inline]
    fn prefix_at(&self, bucket: usize) -> Option<&[u8]> {
        Some(self.table.get(bucket)?.prefix(&self.spill))
    }

    /// The value at `map_key` of the slot in `bucket`.
    #[inline]
    fn value_at(&self, bucket: usize, map_key: &[u8]) -> Option<&[u8]> {
        self.table.get(bucket)?.get(map_key, &self.spill)
    }

    /// Changes the value at `map_key` of the slot in `bucket`; false when the bucket is empty.
    #[inline]
    fn change_at(&mut self, bucket: usize, map_key: &[u8], change: Change<'_>) -> bool {
        let Group { table, spill, .. } = self;
        table.get_mut(bucket).map(|slot| slot.change(map_key, change, spill)).is_some()
    }

    /// Changes the value at `prefix + map_key`, creating it empty if absent; the prefix is
    /// copied only for a new entry. Returns the slot's bucket.
    fn upsert(&mut self, prefix: &[u8], map_key: &[u8], change: Change<'_>) -> usize {
        self.upsert_hashed(self.hash_encoded(prefix), prefix, map_key, change)
    }

    /// [`Self::upsert`] with the prefix's hash (as the table takes it) known.
    fn upsert_hashed(&mut self, hash: u64, prefix: &[u8], map_key: &[u8], change: Change<'_>) -> usize {
        match self.find_hashed(hash, prefix) {
            Some(bucket) => {
                self.change_at(bucket, map_key, change);
                bucket
            }
            None => {
                let slot = Slot::new(hash, prefix, map_key, change, &mut self.spill);
                self.table.insert_unique(slot)
            }
        }
    }

    /// Removes the entry at `map_key` in `bucket`'s slot, and the slot once it is empty.
    fn remove_at(&mut self, bucket: Option<usize>, map_key: &[u8]) {
        let Some(bucket) = bucket else { return };
        let Group { table, spill, .. } = self;
        if table.get_mut(bucket).is_some_and(|slot| slot.remove(map_key, spill)) {
            self.remove_slot(bucket);
        }
    }

    /// Removes the slot in `bucket` whatever it holds.
    fn remove_slot(&mut self, bucket: usize) {
        if let Some(slot) = self.table.remove(bucket) {
            slot.release(&mut self.spill);
        }
    }

    /// The slots with their prefixes, sorted by prefix.
    fn sorted(&self) -> Vec<(&[u8], &Slot)> {
        let mut slots: Vec<(&[u8], &Slot)> = self.table.iter().map(|s| (s.prefix(&self.spill), s)).collect();
        slots.sort_unstable_by(|a, b| a.0.cmp(b.0));
        slots
    }

    /// The entries with their full keys, in key order.
    fn sorted_entries(&self) -> Vec<(Vec<u8>, &[u8])> {
        self.sorted()
            .into_iter()
            .flat_map(|(prefix, slot)| {
                slot.entries(&self.spill).map(move |(mk, v)| (full_key(prefix, mk), v))
            })
            .collect()
    }
}

impl Probed for Group {
    fn hash(&self, key: &StateKey<'_>) -> u64 {
        self.hash_key(key)
    }

    fn prefetch_start(&self, hash: u64) {
        self.table.prefetch(hash);
    }

    fn find_by_hash(&self, hash: u64) -> Option<usize> {
        let bucket = self.table.find(hash, |_| true)?;
        if let Some(bytes) = self.table.get(bucket).and_then(|s| s.spilled_bytes(&self.spill)) {
            prefetch_line(bytes.as_ptr());
        }
        Some(bucket)
    }

    fn holds(&self, bucket: usize, prefix: &[u8]) -> bool {
        self.prefix_at(bucket).is_some_and(|p| bytes_eq(p, prefix))
    }

    fn find(&self, hash: u64, prefix: &[u8]) -> Option<usize> {
        self.find_hashed(hash, prefix)
    }
}

fn full_key(prefix: &[u8], map_key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + map_key.len());
    k.extend_from_slice(prefix);
    k.extend_from_slice(map_key);
    k
}

/// An encoded key split into its prefix and map key (a key that does not follow the
/// layout is all prefix).
fn split_encoded(key: &[u8]) -> (&[u8], &[u8]) {
    key.split_at(prefix_len(key).unwrap_or(key.len()))
}

/// A key group's table: owned, or shared with a snapshot since the last one was taken
/// (copy on write). Owned, a write reaches it without the compare-and-swap of
/// `Arc::make_mut` (a full memory barrier, 7 % of a read-modify-write pipeline's time).
#[derive(Debug, Clone)]
enum GroupCell {
    Owned(Group),
    Shared(Arc<Group>),
}

impl GroupCell {
    fn get(&self) -> &Group {
        match self {
            GroupCell::Owned(g) => g,
            GroupCell::Shared(g) => g,
        }
    }

    /// The table to write to: owned again, taken back from the snapshot when its upload has
    /// let go of it, else copied.
    #[inline]
    fn get_mut(&mut self) -> &mut Group {
        if matches!(self, GroupCell::Shared(_)) {
            self.unshare();
        }
        match self {
            GroupCell::Owned(g) => g,
            // Made owned just above.
            GroupCell::Shared(g) => Arc::make_mut(g),
        }
    }

    #[cold]
    #[inline(never)]
    fn unshare(&mut self) {
        if let GroupCell::Shared(shared) = self {
            let shared = std::mem::take(shared);
            *self = GroupCell::Owned(Arc::try_unwrap(shared).unwrap_or_else(|held| Group::clone(&held)));
        }
    }

    /// The table shared with a snapshot.
    fn share(&mut self) -> Arc<Group> {
        let shared = match std::mem::replace(self, GroupCell::Owned(Group::default())) {
            GroupCell::Owned(g) => Arc::new(g),
            GroupCell::Shared(g) => g,
        };
        *self = GroupCell::Shared(shared.clone());
        shared
    }
}

/// Keyed state in memory.
#[derive(Debug, Clone)]
pub struct HeapStateBackend {
    range: KeyGroupRange,
    /// Per key group of `range`.
    groups: Vec<GroupCell>,
    /// Where a changed key's prefix is encoded (no allocation per change).
    scratch: Vec<u8>,
    /// The key group and bucket of the slot read or changed last: a hint, used only when that
    /// bucket holds the key's prefix, so that a set after a get of the same key (a
    /// read-modify-write) neither encodes the prefix nor hashes and probes again.
    last: Cell<Option<(u16, usize)>>,
    /// Lookups announced ahead ([`KeyedStateBackend::prefetch`]), from this many entries.
    ahead: RefCell<Lookahead>,
    announce_from: usize,
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
            groups: (0..range.len()).map(|_| GroupCell::Owned(Group::default())).collect(),
            scratch: Default::default(),
            last: Cell::new(None),
            ahead: Default::default(),
            announce_from: LOOKAHEAD_MIN_ENTRIES,
        }
    }

    /// Takes announced lookups ([`KeyedStateBackend::prefetch`]) from `entries` entries on
    /// (by default from 16,384, where the state outgrows a core's cache of 1-2 MB).
    pub fn announce_from(mut self, entries: usize) -> Self {
        self.announce_from = entries;
        self
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
                let (prefix, map_key) = split_encoded(&key);
                self.groups[i].get_mut().upsert(prefix, map_key, Change::Set(&value));
            }
        }
    }

    /// Calls `f` with `key`'s value: in the slot used last when it is the key's, else where
    /// its announcement found it, else looked up by its parts (nothing encoded).
    fn read<R>(&self, key: &StateKey<'_>, f: impl FnOnce(Option<&[u8]>) -> R) -> Result<R> {
        let g = self.group(key.key_group)?;
        Ok(f(self.locate(g, key).and_then(|b| g.value_at(b, key.map_key))))
    }

    /// The bucket of `key`'s slot in `g`, its key group's table: the one used last when it
    /// is the key's, else where its announcement found it, else looked up by its parts.
    #[inline(always)]
    fn locate(&self, g: &Group, key: &StateKey<'_>) -> Option<usize> {
        if let Some(bucket) = last_bucket(self.last.get(), g, key) {
            return Some(bucket);
        }
        let found = match self.ahead.borrow_mut().take(key, g) {
            Some(lookup) => lookup.bucket,
            None => g.find_key(key),
        };
        if let Some(bucket) = found {
            self.last.set(Some((key.key_group, bucket)));
        }
        found
    }

    /// The group whose bucket `hint` names `key`'s slot in, when nothing has moved in its
    /// table since the hint was taken (checked by the slot's hash, and by its whole prefix in
    /// debug builds).
    #[inline]
    fn hinted_group(&mut self, key: &StateKey<'_>, hint: &EntryHint) -> Option<&mut Group> {
        if hint.key_group != key.key_group {
            return None;
        }
        let group = self.group_mut(key.key_group).ok()?;
        if group.table.moves() != hint.moves || group.table.get(hint.bucket)?.hash() != hint.hash {
            return None;
        }
        debug_assert!(
            group.prefix_at(hint.bucket).is_some_and(|p| key.prefix_matches(p)),
            "a hint from another key's read"
        );
        Some(group)
    }

    /// Changes `key`'s value, creating it empty if absent: in the slot used last when it is
    /// the key's, else where its announcement found it, else found or made under the key's
    /// prefix (then the one used last).
    fn change(&mut self, key: &StateKey<'_>, change: Change<'_>) -> Result<()> {
        check_key_group(self.range, key.key_group)?;
        let i = usize::from(key.key_group - self.range.start);
        // Checked after the copy on write: the hint is tested against the group written to.
        let group = self.groups[i].get_mut();
        let known = match last_bucket(self.last.get(), group, key) {
            Some(bucket) => Some(Lookup { hash: 0, bucket: Some(bucket) }),
            None => self.ahead.get_mut().take(key, group),
        };
        if let Some(bucket) = known.and_then(|k| k.bucket) {
            if group.change_at(bucket, key.map_key, change) {
                self.last.set(Some((key.key_group, bucket)));
                return Ok(());
            }
        }
        let bucket = self.with_prefix_mut(key, |g, prefix, map_key| {
            let hash = match known {
                Some(Lookup { hash, bucket: None }) => hash,
                _ => g.hash_key(key),
            };
            g.upsert_hashed(hash, prefix, map_key, change)
        })?;
        self.last.set(Some((key.key_group, bucket)));
        Ok(())
    }

    #[inline]
    fn group(&self, kg: u16) -> Result<&Group> {
        check_key_group(self.range, kg)?;
        Ok(self.groups[usize::from(kg - self.range.start)].get())
    }

    #[inline]
    fn group_mut(&mut self, kg: u16) -> Result<&mut Group> {
        check_key_group(self.range, kg)?;
        Ok(self.groups[usize::from(kg - self.range.start)].get_mut())
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
                let (prefix, map_key) = split_encoded(&k);
                g.upsert(prefix, map_key, Change::Set(&v));
            }
            BatchOp::Delete(k) => {
                let (prefix, map_key) = split_encoded(&k);
                g.remove_at(g.find_bucket(prefix), map_key);
            }
            BatchOp::Append(k, framed) => {
                let (prefix, map_key) = split_encoded(&k);
                g.upsert(prefix, map_key, Change::Append(&framed));
            }
        }
        Ok(())
    }

    /// Encodes `key`'s prefix into the scratch buffer and calls `f` with the key group's
    /// map, the prefix and the map key.
    fn with_prefix_mut<T>(
        &mut self,
        key: &StateKey<'_>,
        f: impl FnOnce(&mut Group, &[u8], &[u8]) -> T,
    ) -> Result<T> {
        let mut prefix = std::mem::take(&mut self.scratch);
        prefix.clear();
        let encoded = key.encode_prefix_into(&mut prefix);
        let out = encoded.and_then(|()| self.group_mut(key.key_group)).map(|g| f(g, &prefix, key.map_key));
        self.scratch = prefix;
        out
    }
}

/// The bucket of `key`'s slot in `group` when it is the one `last` names (the key group and
/// bucket used last).
#[inline(always)]
fn last_bucket(last: Option<(u16, usize)>, group: &Group, key: &StateKey<'_>) -> Option<usize> {
    let (_, bucket) = last.filter(|(kg, _)| *kg == key.key_group)?;
    key.prefix_matches(group.prefix_at(bucket)?).then_some(bucket)
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
        self.read(key, |v| v.map(<[u8]>::to_vec))
    }

    fn get_into(&self, key: &StateKey<'_>, out: &mut Vec<u8>) -> Result<bool> {
        out.clear();
        self.read(key, |v| v.map(|v| out.extend_from_slice(v)).is_some())
    }

    /// An existing entry's value is overwritten in place (no allocation for the key).
    fn put(&mut self, key: &StateKey<'_>, value: &[u8]) -> Result<()> {
        self.change(key, Change::Set(value))
    }

    /// The value borrowed from its slot (nothing copied), and the slot's bucket.
    fn read_hinted<'a>(
        &'a self,
        key: &StateKey<'_>,
        _buffer: &'a mut Vec<u8>,
        hint: &mut Option<EntryHint>,
    ) -> Result<Option<&'a [u8]>> {
        let g = self.group(key.key_group)?;
        let Some((bucket, slot)) = self.locate(g, key).and_then(|b| Some((b, g.table.get(b)?))) else {
            *hint = None;
            return Ok(None);
        };
        *hint =
            Some(EntryHint { key_group: key.key_group, hash: slot.hash(), bucket, moves: g.table.moves() });
        Ok(slot.get(key.map_key, &g.spill))
    }

    fn put_hinted(&mut self, key: &StateKey<'_>, value: &[u8], hint: Option<&EntryHint>) -> Result<()> {
        if let Some(hint) = hint {
            if let Some(group) = self.hinted_group(key, hint) {
                group.change_at(hint.bucket, key.map_key, Change::Set(value));
                return Ok(());
            }
        }
        self.put(key, value)
    }

    fn prefetch(&mut self, key: &StateKey<'_>) {
        let (range, groups) = (self.range, &self.groups);
        let group_of = |kg: u16| range.contains(kg).then(|| groups[usize::from(kg - range.start)].get());
        self.ahead.get_mut().announce(key, group_of);
    }

    /// Once the state outgrows the CPU's cache ([`Self::announce_from`]); below that a
    /// lookup waits on no memory, and announcing it costs more than it saves. The entries
    /// are estimated from up to 8 key groups (keys spread evenly over key groups).
    fn prefetch_useful(&self) -> bool {
        let step = (self.groups.len() / 8).max(1);
        let (sampled, entries) =
            self.groups.iter().step_by(step).fold((0, 0), |(n, e), g| (n + 1, e + g.get().table.len()));
        sampled > 0 && entries * self.groups.len() >= self.announce_from * sampled
    }

    fn delete(&mut self, key: &StateKey<'_>) -> Result<()> {
        let g = self.group_mut(key.key_group)?;
        g.remove_at(g.find_key(key), key.map_key);
        Ok(())
    }

    fn append(&mut self, key: &StateKey<'_>, element: &[u8]) -> Result<()> {
        self.change(key, Change::Append(&frame_list_element(element)))
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
        Ok(match g.find_key(key).and_then(|b| g.table.get(b)) {
            Some(slot) => slot
                .entries(&g.spill)
                .map(|(mk, v)| RawEntry { key: full_key(&prefix, mk), value: v.to_vec() })
                .collect(),
            None => Vec::new(),
        })
    }

    fn delete_map(&mut self, key: &StateKey<'_>) -> Result<()> {
        let g = self.group_mut(key.key_group)?;
        if let Some(bucket) = g.find_key(key) {
            g.remove_slot(bucket);
        }
        Ok(())
    }

    /// A page costs a pass over the key group's prefixes (the state browser's and a
    /// restore's path, not the hot one).
    fn list_entries(&self, key_group: u16, after: Option<&[u8]>, limit: usize) -> Result<EntryPage> {
        let g = self.group(key_group)?;
        let after_prefix = after.map(|a| split_encoded(a).0);
        let mut slots: Vec<(&[u8], &Slot)> = g
            .table
            .iter()
            .map(|s| (s.prefix(&g.spill), s))
            .filter(|(p, _)| after_prefix.is_none_or(|a| *p >= a))
            .collect();
        // Every prefix holds an entry, and only `after`'s own may hold none past it: the
        // `limit + 2` smallest prefixes hold the page and tell whether more follow.
        if slots.len() > limit.saturating_add(2) {
            slots.select_nth_unstable_by(limit + 2, |a, b| a.0.cmp(b.0));
            slots.truncate(limit + 2);
        }
        slots.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut entries: Vec<RawEntry> = slots
            .into_iter()
            .flat_map(|(prefix, slot)| slot.entries(&g.spill).map(move |(mk, v)| (prefix, mk, v)))
            .map(|(p, mk, v)| RawEntry { key: full_key(p, mk), value: v.to_vec() })
            .filter(|e| after.is_none_or(|a| e.key.as_slice() > a))
            .take(limit.saturating_add(1))
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
            .zip(self.groups.iter().map(GroupCell::get))
            .map(|(kg, g)| KeyGroupStats {
                key_group: kg,
                entries: g.table.iter().map(|slot| slot.entries(&g.spill).count() as u64).sum(),
                bytes: g.table.iter().map(|slot| slot.bytes(&g.spill)).sum(),
            })
            .collect())
    }

    fn snapshot(&mut self, location: &StateLocation) -> Result<Box<dyn StateSnapshot>> {
        Ok(Box::new(HeapSnapshot {
            range: self.range,
            groups: self.groups.iter_mut().map(GroupCell::share).collect(),
            checkpoint: location.checkpoint,
            object: location.private_file(HEAP_SNAPSHOT_FILE),
        }))
    }

    fn notify_checkpoint_complete(&mut self, _checkpoint: CheckpointId) {}

    fn kind(&self) -> &'static str {
        "heap"
    }
}

/// [`HeapSnapshotFile`] as written: the same fields, values borrowed from the shared tables
/// (`&[u8]` encodes exactly as `Vec<u8>`).
#[derive(Serialize)]
struct HeapSnapshotFileRef<'a> {
    format_version: u32,
    key_groups: KeyGroupRange,
    groups: Vec<GroupEntriesRef<'a>>,
}

/// [`GroupEntries`] borrowed.
type GroupEntriesRef<'a> = (u16, Vec<(Vec<u8>, &'a [u8])>);

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
                .filter(|(_, g)| !g.table.is_empty())
                .map(|(kg, g)| (kg, g.sorted_entries()))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::StateId;

    /// A hint taken before entries moved (the table grew, an entry before it was removed)
    /// writes to its key, not to the bucket it named.
    #[test]
    fn a_stale_hint_writes_to_its_key() {
        let id = StateId::new("count").unwrap();
        let keys: Vec<[u8; 4]> = (0..1 << 16).map(u32::to_be_bytes).collect();
        let key = |k: usize| StateKey::new(0, &id, &keys[k]);
        for removed in [false, true] {
            let mut b = HeapStateBackend::new(KeyGroupRange::new(0, 1));
            b.put(&key(0), b"zero").unwrap();
            let (mut hint, mut buffer) = (None, Vec::new());
            assert_eq!(b.read_hinted(&key(0), &mut buffer, &mut hint).unwrap(), Some(&b"zero"[..]));
            let bucket = hint.unwrap().bucket;
            // Grow the table until key 0 has moved and another key is in its old bucket.
            let mut next = 1;
            while b.groups[0].get().prefix_at(bucket).is_none_or(|p| key(0).prefix_matches(p)) {
                b.put(&key(next), b"other").unwrap();
                next += 1;
            }
            if removed {
                b.delete(&key(next - 1)).unwrap();
                next -= 1;
            }
            b.put_hinted(&key(0), b"new", hint.as_ref()).unwrap();
            assert_eq!(b.get(&key(0)).unwrap().as_deref(), Some(&b"new"[..]));
            for k in 1..next {
                assert_eq!(b.get(&key(k)).unwrap().as_deref(), Some(&b"other"[..]), "key {k}");
            }
        }
    }

    /// A bucket found ahead is checked when the access comes: here its key was removed and
    /// the bucket given to another key in between.
    #[test]
    fn an_announced_lookup_is_checked_at_the_access() {
        let id = StateId::new("count").unwrap();
        // As many keys as it may take to fill the bucket again (the hash is seeded at random:
        // with 64 keys a run could run out of keys first and panic on the index).
        let keys: Vec<[u8; 4]> = (0..1 << 16).map(u32::to_be_bytes).collect();
        let key = |k: usize| StateKey::new(0, &id, &keys[k]);
        let mut b = HeapStateBackend::new(KeyGroupRange::new(0, 1)).announce_from(0);
        b.put(&key(0), b"zero").unwrap();
        let mut prefix = Vec::new();
        key(0).encode_prefix_into(&mut prefix).unwrap();
        let bucket = b.groups[0].get().find_bucket(&prefix).unwrap();
        // Announced, then found by the announcements after it.
        for k in 0..5 {
            b.prefetch(&key(k));
        }
        b.delete(&key(0)).unwrap();
        let mut next = 5;
        while b.groups[0].get().table.get(bucket).is_none() {
            b.put(&key(next), b"other").unwrap();
            next += 1;
        }
        assert_eq!(b.get(&key(0)).unwrap(), None);
        b.put(&key(0), b"again").unwrap();
        assert_eq!(b.get(&key(0)).unwrap().as_deref(), Some(&b"again"[..]));
        for k in 5..next {
            assert_eq!(b.get(&key(k)).unwrap().as_deref(), Some(&b"other"[..]));
        }
    }
}

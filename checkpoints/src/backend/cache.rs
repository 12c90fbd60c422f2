//! A write-back cache in front of any backend, for the hot path.
//!
//! A record must not cost a RocksDB get plus put: [`CachingBackend`] keeps the values
//! of recently used keys in memory, absorbs puts and deletes, and writes the dirty ones
//! through as one batch when its byte budget is spent, before a snapshot, and before any
//! scan. With it, a per-(key, window) aggregate updated by every record touches RocksDB once
//! per checkpoint (or eviction) instead of twice per record.
//!
//! The budget is in bytes, as Kafka Streams' record cache is (`statestore.cache.max.bytes`):
//! a count of entries says nothing of the memory once values are lists or accumulators.
//! An entry is one allocation, its key followed by its value, in a hash table of 24-byte
//! slots, so a small entry costs about [`ENTRY_OVERHEAD`] bytes beyond its key and value:
//! the default 128 MiB hold about 1.4 million small counters.

use std::cell::RefCell;

use hashbrown::HashTable;

use super::{
    check_key_group, frame_list_element, BatchOp, EntryPage, KeyGroupStats, KeyedStateBackend, RawEntry,
    StateSnapshot, StateWriteBatch,
};
use crate::ids::CheckpointId;
use crate::keygroup::KeyGroupRange;
use crate::keys::StateKey;
use crate::store::StateLocation;
use crate::Result;

/// The default budget of a cache, per operator subtask: 128 MiB.
pub const DEFAULT_CACHE_BYTES: usize = 128 << 20;

/// What an entry costs beyond its key and value bytes: its slot in the table (24 bytes at a
/// load of 0.44-0.875, plus a control byte) and the allocator's header and rounding.
pub const ENTRY_OVERHEAD: usize = 64;

/// How a cached entry relates to the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    /// Same as in the backend.
    Clean,
    /// Known absent in the backend.
    Absent,
    /// Newer than the backend.
    Dirty,
    /// Deleted, not yet in the backend.
    Deleted,
}

impl Status {
    fn is_dirty(self) -> bool {
        matches!(self, Status::Dirty | Status::Deleted)
    }

    fn has_value(self) -> bool {
        matches!(self, Status::Clean | Status::Dirty)
    }
}

/// One cached key: the encoded key followed by its value, in one allocation.
#[derive(Debug)]
struct Entry {
    bytes: Box<[u8]>,
    key_len: u32,
    status: Status,
}

impl Entry {
    fn new(key: &[u8], value: &[u8], status: Status) -> Entry {
        let mut bytes = Vec::with_capacity(key.len() + value.len());
        bytes.extend_from_slice(key);
        bytes.extend_from_slice(value);
        // Encoded keys are a few hundred bytes at most (a state name is ≤ 255 bytes).
        let key_len = u32::try_from(key.len()).unwrap_or(u32::MAX);
        Entry { bytes: bytes.into_boxed_slice(), key_len, status }
    }

    fn key(&self) -> &[u8] {
        &self.bytes[..self.key_len as usize]
    }

    fn value(&self) -> &[u8] {
        &self.bytes[self.key_len as usize..]
    }

    fn cost(&self) -> usize {
        self.bytes.len() + ENTRY_OVERHEAD
    }

    /// Replaces the value (in place when its length is unchanged); returns the cost change.
    fn set(&mut self, value: &[u8], status: Status) -> isize {
        let before = self.cost();
        if self.value().len() == value.len() {
            self.bytes[self.key_len as usize..].copy_from_slice(value);
        } else {
            let resized = Entry::new(self.key(), value, status);
            *self = resized;
        }
        self.status = status;
        self.cost() as isize - before as isize
    }

    /// The key and value as the batch owns them (the value split off the allocation).
    fn into_parts(self) -> (Vec<u8>, Vec<u8>) {
        let mut key = self.bytes.into_vec();
        let value = key.split_off(self.key_len as usize);
        (key, value)
    }
}

#[derive(Debug)]
struct Inner<B> {
    backend: B,
    table: HashTable<Entry>,
    /// ahash with a random seed: keys come from the data.
    hasher: ahash::RandomState,
    /// What the entries cost (see [`ENTRY_OVERHEAD`]).
    bytes: usize,
    dirty: usize,
    /// Where a looked-up key is encoded (no allocation for a cached key).
    scratch: Vec<u8>,
}

fn op_key(op: &BatchOp) -> &[u8] {
    let (BatchOp::Put(k, _) | BatchOp::Delete(k) | BatchOp::Append(k, _)) = op;
    k
}

fn op_bytes(op: &BatchOp) -> usize {
    match op {
        BatchOp::Put(k, v) | BatchOp::Append(k, v) => k.len() + v.len(),
        BatchOp::Delete(k) => k.len(),
    }
}

impl<B: KeyedStateBackend> Inner<B> {
    fn find(&self, key: &[u8]) -> Option<&Entry> {
        self.table.find(self.hasher.hash_one(key), |e| e.key() == key)
    }

    /// Writes the dirty entries through and, if `clear`, empties the cache. Emptying, the
    /// entries move into the batch; a failed write then fails the task, whose state is
    /// restored from its checkpoint, so the cache need not keep them.
    fn flush(&mut self, clear: bool) -> Result<()> {
        if self.dirty == 0 {
            if clear {
                self.table.clear();
                self.bytes = 0;
            }
            return Ok(());
        }
        let mut batch = StateWriteBatch::new();
        if clear {
            for entry in self.table.drain() {
                match entry.status {
                    Status::Dirty => {
                        let (k, v) = entry.into_parts();
                        batch.ops.push(BatchOp::Put(k, v));
                    }
                    Status::Deleted => batch.ops.push(BatchOp::Delete(entry.into_parts().0)),
                    Status::Clean | Status::Absent => {}
                }
            }
            self.bytes = 0;
        } else {
            for entry in self.table.iter_mut() {
                match entry.status {
                    Status::Dirty => {
                        batch.ops.push(BatchOp::Put(entry.key().to_vec(), entry.value().to_vec()));
                        entry.status = Status::Clean;
                    }
                    Status::Deleted => {
                        batch.ops.push(BatchOp::Delete(entry.key().to_vec()));
                        entry.status = Status::Absent;
                    }
                    Status::Clean | Status::Absent => {}
                }
            }
        }
        batch.bytes = batch.ops.iter().map(op_bytes).sum();
        // In key order: RocksDB's memtable inserts a run of ascending keys from where the
        // last one went (a random order pays a full skip-list descent per key).
        batch.ops.sort_unstable_by(|a, b| op_key(a).cmp(op_key(b)));
        self.dirty = 0;
        self.backend.write_batch(batch)
    }

    /// Sets `key` to `value` with `status` (a new key is copied in; when the budget would be
    /// spent, the cache is written through and emptied first).
    fn set(&mut self, key: &[u8], value: &[u8], status: Status, budget: usize) -> Result<()> {
        let hash = self.hasher.hash_one(key);
        if let Some(entry) = self.table.find_mut(hash, |e| e.key() == key) {
            match (entry.status.is_dirty(), status.is_dirty()) {
                (false, true) => self.dirty += 1,
                (true, false) => self.dirty -= 1,
                _ => {}
            }
            let change = entry.set(value, status);
            self.bytes = self.bytes.saturating_add_signed(change);
            return Ok(());
        }
        let entry = Entry::new(key, value, status);
        if self.bytes + entry.cost() > budget && !self.table.is_empty() {
            self.flush(true)?;
        }
        self.dirty += usize::from(status.is_dirty());
        self.bytes += entry.cost();
        let hasher = &self.hasher;
        self.table.insert_unique(hash, entry, |e| hasher.hash_one(e.key()));
        Ok(())
    }

    /// Encodes `key` into the scratch buffer and takes it (give it back afterwards).
    fn encoded(&mut self, key: &StateKey<'_>) -> Result<Vec<u8>> {
        let mut k = std::mem::take(&mut self.scratch);
        k.clear();
        key.encode_into(&mut k)?;
        Ok(k)
    }
}

/// A write-back cache of at most `budget` bytes (see [`ENTRY_OVERHEAD`]) in front of `B`.
#[derive(Debug)]
pub struct CachingBackend<B> {
    inner: RefCell<Inner<B>>,
    range: KeyGroupRange,
    budget: usize,
}

impl<B: KeyedStateBackend> CachingBackend<B> {
    /// Wraps `backend` with a cache of at most `budget` bytes (one entry at least).
    pub fn new(backend: B, budget: usize) -> Self {
        CachingBackend {
            range: backend.key_groups(),
            inner: RefCell::new(Inner {
                backend,
                table: HashTable::new(),
                hasher: ahash::RandomState::new(),
                bytes: 0,
                dirty: 0,
                scratch: Vec::new(),
            }),
            budget,
        }
    }

    /// Writes every dirty entry through to the backend.
    pub fn flush(&mut self) -> Result<()> {
        self.inner.get_mut().flush(false)
    }

    /// Flushes and returns the wrapped backend.
    pub fn into_inner(self) -> Result<B> {
        let mut inner = self.inner.into_inner();
        inner.flush(true)?;
        Ok(inner.backend)
    }

    /// Entries in the cache, how many of them are dirty, and what they cost in bytes.
    pub fn cached(&self) -> (usize, usize, usize) {
        let inner = self.inner.borrow();
        (inner.table.len(), inner.dirty, inner.bytes)
    }

    /// Calls `f` with `key`'s value, from the cache or else from the backend (then cached).
    fn read<R>(&self, key: &StateKey<'_>, f: impl FnOnce(Option<&[u8]>) -> R) -> Result<R> {
        check_key_group(self.range, key.key_group)?;
        let inner = &mut *self.inner.borrow_mut();
        let k = inner.encoded(key)?;
        let out = match inner.find(&k) {
            Some(e) => Ok(f(e.status.has_value().then(|| e.value()))),
            None => inner.backend.get(key).and_then(|v| {
                let status = if v.is_some() { Status::Clean } else { Status::Absent };
                inner.set(&k, v.as_deref().unwrap_or_default(), status, self.budget)?;
                Ok(f(v.as_deref()))
            }),
        };
        inner.scratch = k;
        out
    }

    fn flushed(&self) -> Result<std::cell::Ref<'_, Inner<B>>> {
        self.inner.borrow_mut().flush(false)?;
        Ok(self.inner.borrow())
    }
}

impl<B: KeyedStateBackend> KeyedStateBackend for CachingBackend<B> {
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

    /// A cached value of the same length is overwritten in place.
    fn put(&mut self, key: &StateKey<'_>, value: &[u8]) -> Result<()> {
        check_key_group(self.range, key.key_group)?;
        let budget = self.budget;
        let inner = self.inner.get_mut();
        let k = inner.encoded(key)?;
        let out = inner.set(&k, value, Status::Dirty, budget);
        inner.scratch = k;
        out
    }

    fn delete(&mut self, key: &StateKey<'_>) -> Result<()> {
        check_key_group(self.range, key.key_group)?;
        let budget = self.budget;
        let inner = self.inner.get_mut();
        let k = inner.encoded(key)?;
        let out = inner.set(&k, &[], Status::Deleted, budget);
        inner.scratch = k;
        out
    }

    fn append(&mut self, key: &StateKey<'_>, element: &[u8]) -> Result<()> {
        check_key_group(self.range, key.key_group)?;
        let budget = self.budget;
        let inner = self.inner.get_mut();
        let k = inner.encoded(key)?;
        let framed = frame_list_element(element);
        let out = match inner.find(&k).map(|e| (e.status, e.value())) {
            // Not cached: append in the backend without reading.
            None => inner.backend.append(key, element),
            Some((status, current)) => {
                let mut v = if status.has_value() { current.to_vec() } else { Vec::new() };
                v.extend_from_slice(&framed);
                inner.set(&k, &v, Status::Dirty, budget)
            }
        };
        inner.scratch = k;
        out
    }

    fn write_batch(&mut self, batch: StateWriteBatch) -> Result<()> {
        let inner = self.inner.get_mut();
        inner.flush(true)?;
        inner.backend.write_batch(batch)
    }

    fn scan_map(&self, key: &StateKey<'_>) -> Result<Vec<RawEntry>> {
        self.flushed()?.backend.scan_map(key)
    }

    fn delete_map(&mut self, key: &StateKey<'_>) -> Result<()> {
        let inner = self.inner.get_mut();
        inner.flush(true)?;
        inner.backend.delete_map(key)
    }

    fn list_entries(&self, key_group: u16, after: Option<&[u8]>, limit: usize) -> Result<EntryPage> {
        self.flushed()?.backend.list_entries(key_group, after, limit)
    }

    fn key_group_stats(&self) -> Result<Vec<KeyGroupStats>> {
        self.flushed()?.backend.key_group_stats()
    }

    fn snapshot(&mut self, location: &StateLocation) -> Result<Box<dyn StateSnapshot>> {
        let inner = self.inner.get_mut();
        inner.flush(false)?;
        inner.backend.snapshot(location)
    }

    fn notify_checkpoint_complete(&mut self, checkpoint: CheckpointId) {
        self.inner.get_mut().backend.notify_checkpoint_complete(checkpoint);
    }

    fn upload_all_files_next(&mut self) {
        self.inner.get_mut().backend.upload_all_files_next();
    }

    fn kind(&self) -> &'static str {
        self.inner.borrow().backend.kind()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::HeapStateBackend;
    use crate::keys::StateId;

    fn key<'a>(state: &'a StateId, k: &'a [u8]) -> StateKey<'a> {
        StateKey::new(0, state, k)
    }

    #[test]
    fn the_budget_bounds_the_bytes_and_a_full_cache_writes_through() -> Result<()> {
        let state = StateId::new("s")?;
        let range = KeyGroupRange::new(0, 1);
        // Room for about ten entries of a few bytes.
        let mut cache = CachingBackend::new(HeapStateBackend::new(range), 10 * (ENTRY_OVERHEAD + 16));
        for i in 0u32..10 {
            cache.put(&key(&state, &i.to_be_bytes()), b"v")?;
        }
        let (entries, dirty, bytes) = cache.cached();
        assert_eq!((entries, dirty), (10, 10));
        assert!(bytes <= 10 * (ENTRY_OVERHEAD + 16), "{bytes}");
        // The eleventh key spends the budget: the ten go through, the cache starts again.
        cache.put(&key(&state, &10u32.to_be_bytes()), b"v")?;
        assert_eq!(cache.cached().0, 1);
        for i in 0u32..11 {
            assert_eq!(cache.get(&key(&state, &i.to_be_bytes()))?, Some(b"v".to_vec()), "key {i}");
        }
        // An overwrite of another length costs what the new value costs.
        assert_eq!(cache.get(&key(&state, &3u32.to_be_bytes()))?, Some(b"v".to_vec()));
        let before = cache.cached().2;
        cache.put(&key(&state, &3u32.to_be_bytes()), b"longer")?;
        assert_eq!(cache.cached().2, before + 5);
        assert_eq!(cache.get(&key(&state, &3u32.to_be_bytes()))?, Some(b"longer".to_vec()));
        let backend = cache.into_inner()?;
        assert_eq!(backend.get(&key(&state, &3u32.to_be_bytes()))?, Some(b"longer".to_vec()));
        Ok(())
    }
}

//! A write-back cache in front of any backend, for the hot path.
//!
//! A record must not cost a RocksDB get plus put: [`CachingBackend`] keeps the values
//! of recently used keys in memory, absorbs puts and deletes, and writes the dirty ones
//! through as one batch when it is full, before a snapshot, and before any scan. With it,
//! a per-(key, window) aggregate updated by every record touches RocksDB once per
//! checkpoint (or eviction) instead of twice per record.

use std::cell::RefCell;
use std::collections::HashMap;

use super::{
    check_key_group, frame_list_element, EntryPage, KeyGroupStats, KeyedStateBackend, RawEntry,
    StateSnapshot, StateWriteBatch,
};
use crate::ids::CheckpointId;
use crate::keygroup::KeyGroupRange;
use crate::keys::StateKey;
use crate::store::StateLocation;
use crate::Result;

/// The default number of cached entries.
pub const DEFAULT_CACHE_ENTRIES: usize = 100_000;

#[derive(Debug, Clone)]
enum Slot {
    /// Same as in the backend.
    Clean(Vec<u8>),
    /// Known absent in the backend.
    Absent,
    /// Newer than the backend.
    Dirty(Vec<u8>),
    /// Deleted, not yet in the backend.
    Deleted,
}

#[derive(Debug)]
struct Inner<B> {
    backend: B,
    /// ahash with a random seed: keys come from the data.
    cache: HashMap<Vec<u8>, Slot, ahash::RandomState>,
    dirty: usize,
    /// Where a looked-up key is encoded (no allocation for a cached key).
    scratch: Vec<u8>,
}

fn op_key(op: &super::BatchOp) -> &[u8] {
    let (super::BatchOp::Put(k, _) | super::BatchOp::Delete(k) | super::BatchOp::Append(k, _)) = op;
    k
}

fn op_bytes(op: &super::BatchOp) -> usize {
    match op {
        super::BatchOp::Put(k, v) | super::BatchOp::Append(k, v) => k.len() + v.len(),
        super::BatchOp::Delete(k) => k.len(),
    }
}

fn is_dirty(slot: &Slot) -> bool {
    matches!(slot, Slot::Dirty(_) | Slot::Deleted)
}

impl<B: KeyedStateBackend> Inner<B> {
    /// Writes the dirty entries through and, if `clear`, empties the cache. Emptying, the
    /// entries move into the batch (no copies); a failed write then fails the task, whose
    /// state is restored from its checkpoint, so the cache need not keep them.
    fn flush(&mut self, clear: bool) -> Result<()> {
        if self.dirty == 0 {
            if clear {
                self.cache.clear();
            }
            return Ok(());
        }
        let mut batch = StateWriteBatch::new();
        let mut add = |op: super::BatchOp| batch.ops.push(op);
        if clear {
            for (k, slot) in self.cache.drain() {
                match slot {
                    Slot::Dirty(v) => add(super::BatchOp::Put(k, v)),
                    Slot::Deleted => add(super::BatchOp::Delete(k)),
                    Slot::Clean(_) | Slot::Absent => {}
                }
            }
        } else {
            for (k, slot) in self.cache.iter_mut() {
                match slot {
                    Slot::Dirty(v) => {
                        add(super::BatchOp::Put(k.clone(), v.clone()));
                        *slot = Slot::Clean(std::mem::take(v));
                    }
                    Slot::Deleted => {
                        add(super::BatchOp::Delete(k.clone()));
                        *slot = Slot::Absent;
                    }
                    Slot::Clean(_) | Slot::Absent => {}
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

    /// Sets the slot of `key` (the key copied only when it is new to the cache; a full
    /// cache is written through and emptied first).
    fn set(&mut self, key: &[u8], slot: Slot, capacity: usize) -> Result<()> {
        if let Some(old) = self.cache.get_mut(key) {
            match (is_dirty(old), is_dirty(&slot)) {
                (false, true) => self.dirty += 1,
                (true, false) => self.dirty -= 1,
                _ => {}
            }
            *old = slot;
            return Ok(());
        }
        if self.cache.len() >= capacity {
            self.flush(true)?;
        }
        self.dirty += usize::from(is_dirty(&slot));
        self.cache.insert(key.to_vec(), slot);
        Ok(())
    }

    /// Encodes `key` into the scratch buffer and takes it (give it back with `put_back`).
    fn encoded(&mut self, key: &StateKey<'_>) -> Result<Vec<u8>> {
        let mut k = std::mem::take(&mut self.scratch);
        k.clear();
        key.encode_into(&mut k)?;
        Ok(k)
    }
}

/// A write-back cache of at most `capacity` entries in front of `B`.
#[derive(Debug)]
pub struct CachingBackend<B> {
    inner: RefCell<Inner<B>>,
    range: KeyGroupRange,
    capacity: usize,
}

impl<B: KeyedStateBackend> CachingBackend<B> {
    /// Wraps `backend` with a cache of at most `capacity` entries (at least 1).
    pub fn new(backend: B, capacity: usize) -> Self {
        CachingBackend {
            range: backend.key_groups(),
            inner: RefCell::new(Inner { backend, cache: HashMap::default(), dirty: 0, scratch: Vec::new() }),
            capacity: capacity.max(1),
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

    /// Entries in the cache and how many of them are dirty.
    pub fn cached(&self) -> (usize, usize) {
        let inner = self.inner.borrow();
        (inner.cache.len(), inner.dirty)
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
        check_key_group(self.range, key.key_group)?;
        let inner = &mut *self.inner.borrow_mut();
        let k = inner.encoded(key)?;
        let found = match inner.cache.get(&k) {
            Some(Slot::Clean(v) | Slot::Dirty(v)) => Some(Some(v.clone())),
            Some(Slot::Absent | Slot::Deleted) => Some(None),
            None => None,
        };
        let out = match found {
            Some(v) => Ok(v),
            None => inner.backend.get(key).and_then(|v| {
                let slot = v.clone().map_or(Slot::Absent, Slot::Clean);
                inner.set(&k, slot, self.capacity).map(|()| v)
            }),
        };
        inner.scratch = k;
        out
    }

    /// A cached value's buffer is overwritten in place.
    fn put(&mut self, key: &StateKey<'_>, value: &[u8]) -> Result<()> {
        check_key_group(self.range, key.key_group)?;
        let capacity = self.capacity;
        let inner = self.inner.get_mut();
        let k = inner.encoded(key)?;
        let in_place = match inner.cache.get_mut(&k) {
            Some(Slot::Dirty(v)) => {
                v.clear();
                v.extend_from_slice(value);
                true
            }
            Some(slot @ Slot::Clean(_)) => {
                let mut v = match std::mem::replace(slot, Slot::Deleted) {
                    Slot::Clean(v) => v,
                    _ => Vec::new(),
                };
                v.clear();
                v.extend_from_slice(value);
                *slot = Slot::Dirty(v);
                inner.dirty += 1;
                true
            }
            _ => false,
        };
        let out = if in_place { Ok(()) } else { inner.set(&k, Slot::Dirty(value.to_vec()), capacity) };
        inner.scratch = k;
        out
    }

    fn delete(&mut self, key: &StateKey<'_>) -> Result<()> {
        check_key_group(self.range, key.key_group)?;
        let capacity = self.capacity;
        let inner = self.inner.get_mut();
        let k = inner.encoded(key)?;
        let out = inner.set(&k, Slot::Deleted, capacity);
        inner.scratch = k;
        out
    }

    fn append(&mut self, key: &StateKey<'_>, element: &[u8]) -> Result<()> {
        check_key_group(self.range, key.key_group)?;
        let k = key.encode()?;
        let k = k.as_slice();
        let capacity = self.capacity;
        let inner = self.inner.get_mut();
        let framed = frame_list_element(element);
        match inner.cache.get(k).cloned() {
            // Not cached: append in the backend without reading.
            None => inner.backend.append(key, element),
            Some(Slot::Clean(mut v) | Slot::Dirty(mut v)) => {
                v.extend_from_slice(&framed);
                inner.set(k, Slot::Dirty(v), capacity)
            }
            Some(Slot::Absent | Slot::Deleted) => inner.set(k, Slot::Dirty(framed), capacity),
        }
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

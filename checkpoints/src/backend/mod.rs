//! Keyed state backends: one trait, a heap and a RocksDB implementation.
//!
//! A backend holds the keyed state of one stateful operator subtask for its
//! [`KeyGroupRange`]. Keys follow the layout of [`crate::keys`]; the typed states of
//! [`crate::state`] sit on top of the raw byte interface here.
//!
//! Checkpoint sequence, per subtask:
//! 1. [`KeyedStateBackend::snapshot`] on the task thread, at the barrier (short,
//!    synchronous: a copy of the heap, or a RocksDB flush + hard-link checkpoint);
//! 2. [`StateSnapshot::upload`] on any thread (asynchronous part) gives a
//!    [`SnapshotResult`] whose [`StateHandle`] goes into the ack;
//! 3. [`KeyedStateBackend::notify_checkpoint_complete`] once the checkpoint's metadata
//!    is durable, so the next checkpoint reuses the files of this one (incremental).

pub mod cache;
mod config;
pub mod heap;
mod lookahead;
mod prefix_hash;
mod probe_table;
pub mod rocksdb;

use serde::{Deserialize, Serialize};

use crate::ids::CheckpointId;
use crate::keygroup::KeyGroupRange;
use crate::keys::{decode_key, StateKey};
use crate::store::{CheckpointStore, StateLocation};
use crate::{Error, Result};

pub use cache::CachingBackend;
pub use config::{BackendKind, StateBackendConfig, DEFAULT_OPERATOR_CACHE_ENTRIES};
pub use heap::HeapStateBackend;
pub use rocksdb::{RocksDbConfig, RocksDbStateBackend};

/// A callback receiving raw `(key, value)` entries during a restore scan.
pub(crate) type EntrySink<'a> = &'a mut dyn FnMut(&[u8], &[u8]) -> Result<()>;

/// A set of writes applied together (atomically on RocksDB).
#[derive(Debug, Default, Clone)]
pub struct StateWriteBatch {
    pub(crate) ops: Vec<BatchOp>,
    pub(crate) bytes: usize,
}

#[derive(Debug, Clone)]
pub(crate) enum BatchOp {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
    Append(Vec<u8>, Vec<u8>),
}

impl StateWriteBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a put.
    pub fn put(&mut self, key: &StateKey<'_>, value: &[u8]) -> Result<()> {
        let k = key.encode()?;
        self.bytes += k.len() + value.len();
        self.ops.push(BatchOp::Put(k, value.to_vec()));
        Ok(())
    }

    /// Adds a put of an already encoded key (an entry copied from a scan).
    pub fn put_raw(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.bytes += key.len() + value.len();
        self.ops.push(BatchOp::Put(key, value));
    }

    /// Adds a delete.
    pub fn delete(&mut self, key: &StateKey<'_>) -> Result<()> {
        let k = key.encode()?;
        self.bytes += k.len();
        self.ops.push(BatchOp::Delete(k));
        Ok(())
    }

    /// Adds a list append (see [`KeyedStateBackend::append`]).
    pub fn append(&mut self, key: &StateKey<'_>, element: &[u8]) -> Result<()> {
        let k = key.encode()?;
        self.bytes += k.len() + element.len();
        self.ops.push(BatchOp::Append(k, frame_list_element(element)));
        Ok(())
    }

    /// Number of operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Approximate payload size in bytes.
    pub fn size_bytes(&self) -> usize {
        self.bytes
    }
}

/// One entry seen by a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawEntry {
    /// The encoded key (layout of [`crate::keys`]).
    pub key: Vec<u8>,
    /// The stored value.
    pub value: Vec<u8>,
}

impl RawEntry {
    /// The decoded key parts, `None` if the key does not follow the layout.
    pub fn decoded(&self) -> Option<crate::keys::DecodedKey<'_>> {
        decode_key(&self.key)
    }
}

/// A page of entries of one key group, for the state browser.
#[derive(Debug, Clone, Default)]
pub struct EntryPage {
    /// Entries in key order.
    pub entries: Vec<RawEntry>,
    /// Pass as `after` to get the next page; `None` on the last page.
    pub next: Option<Vec<u8>>,
}

/// Entry count and bytes of one key group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct KeyGroupStats {
    /// The key group.
    pub key_group: u16,
    /// Number of entries.
    pub entries: u64,
    /// Key plus value bytes.
    pub bytes: u64,
}

/// Where [`KeyedStateBackend::read_hinted`] found a key's entry: the heap backend's key
/// group, bucket and the table's count of moves then (an insert or removal since makes it
/// stale), with the entry's hash as a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryHint {
    pub(crate) key_group: u16,
    pub(crate) hash: u32,
    pub(crate) bucket: usize,
    pub(crate) moves: u64,
}

/// The keyed state of one operator subtask over its key-group range.
///
/// Object safe: the engine holds a `Box<dyn KeyedStateBackend>`. Every method that
/// takes a key checks that its key group belongs to [`Self::key_groups`].
pub trait KeyedStateBackend: Send {
    /// The key groups this backend owns.
    fn key_groups(&self) -> KeyGroupRange;

    /// The value at `key`.
    fn get(&self, key: &StateKey<'_>) -> Result<Option<Vec<u8>>>;

    /// [`Self::get`] into `out` (cleared first): whether there is a value. The hot path's
    /// read: the caller's buffer is reused, so a found value allocates nothing.
    fn get_into(&self, key: &StateKey<'_>, out: &mut Vec<u8>) -> Result<bool> {
        out.clear();
        Ok(match self.get(key)? {
            Some(v) => {
                out.extend_from_slice(&v);
                true
            }
            None => false,
        })
    }

    /// The value at `key`, borrowed from the backend where it keeps values in memory (the
    /// heap) or read into `buffer` (cleared first); `hint` is set to where the backend found
    /// it: give that [`EntryHint`] to [`Self::put_hinted`] to overwrite the same key's value
    /// without looking it up again (a read-modify-write). The default reads into `buffer`
    /// and gives no hint.
    ///
    /// (The hint is an out-parameter, not part of the result, on purpose: a result this
    /// large is returned through memory, and the caller's wide load of fields the callee
    /// has just stored one by one waits for the stores to reach the cache.)
    fn read_hinted<'a>(
        &'a self,
        key: &StateKey<'_>,
        buffer: &'a mut Vec<u8>,
        hint: &mut Option<EntryHint>,
    ) -> Result<Option<&'a [u8]>> {
        *hint = None;
        let found = self.get_into(key, buffer)?;
        Ok(found.then_some(buffer.as_slice()))
    }

    /// [`Self::put`], where `hint` (from [`Self::read_hinted`] of the same `key`) names the
    /// entry when nothing has moved since; a stale hint, or none, costs a lookup. A hint
    /// from another key's read is a bug of the caller (the heap backend checks the entry's
    /// hash, and its whole key in debug builds). The default ignores the hint.
    fn put_hinted(&mut self, key: &StateKey<'_>, value: &[u8], hint: Option<&EntryHint>) -> Result<()> {
        let _ = hint;
        self.put(key, value)
    }

    /// Says that `key` will be read or written soon. A backend that can starts finding it
    /// now, so that the access finds it in the CPU's cache: the heap backend probes its
    /// table a few announcements later and asks the CPU for the entry's memory meanwhile.
    /// Announce in the order of the accesses; an announced key need not be accessed.
    /// Changes nothing; the default does nothing.
    fn prefetch(&mut self, _key: &StateKey<'_>) {}

    /// Whether [`Self::prefetch`] does anything now (the heap backend's state has outgrown
    /// the CPU's cache): a caller asks once per batch of records, and announces nothing when
    /// it does not.
    fn prefetch_useful(&self) -> bool {
        false
    }

    /// Sets the value at `key`.
    fn put(&mut self, key: &StateKey<'_>, value: &[u8]) -> Result<()>;

    /// Removes the value at `key`.
    fn delete(&mut self, key: &StateKey<'_>) -> Result<()>;

    /// Appends one list element to the value at `key` without reading it (a RocksDB
    /// merge). Read the list back with [`decode_list`].
    fn append(&mut self, key: &StateKey<'_>, element: &[u8]) -> Result<()>;

    /// Applies a batch.
    fn write_batch(&mut self, batch: StateWriteBatch) -> Result<()>;

    /// All entries whose key starts with the encoding of `key` up to its namespace
    /// (the entries of one map state), with their full keys.
    fn scan_map(&self, key: &StateKey<'_>) -> Result<Vec<RawEntry>>;

    /// Deletes all entries of `key` up to its namespace (clears a map).
    fn delete_map(&mut self, key: &StateKey<'_>) -> Result<()>;

    /// Up to `limit` entries of key group `key_group` after the encoded key `after`.
    fn list_entries(&self, key_group: u16, after: Option<&[u8]>, limit: usize) -> Result<EntryPage>;

    /// Entry count and bytes of every key group of the range (a full scan).
    fn key_group_stats(&self) -> Result<Vec<KeyGroupStats>>;

    /// Synchronous part of a snapshot for the checkpoint in `location`: captures the
    /// current state; the returned value uploads it.
    fn snapshot(&mut self, location: &StateLocation) -> Result<Box<dyn StateSnapshot>>;

    /// The checkpoint is complete (its metadata is durable): files it uploaded may be
    /// referenced by the next checkpoint instead of uploaded again.
    fn notify_checkpoint_complete(&mut self, checkpoint: CheckpointId);

    /// The next snapshot uploads every file instead of referencing the restored ones: after
    /// a restore from a savepoint, whose files belong to the user and may be deleted.
    fn upload_all_files_next(&mut self) {}

    /// Which implementation (`"heap"`, `"rocksdb"`).
    fn kind(&self) -> &'static str;
}

/// The asynchronous part of a snapshot; may run on another thread.
pub trait StateSnapshot: Send {
    /// Uploads what is not in storage yet and returns the handle for the ack.
    fn upload(self: Box<Self>, store: &dyn CheckpointStore) -> Result<SnapshotResult>;
}

/// What an upload produced.
#[derive(Debug, Clone)]
pub struct SnapshotResult {
    /// Goes into the ack and the checkpoint metadata.
    pub handle: StateHandle,
    /// What was written.
    pub stats: UploadStats,
}

/// Upload counters of one snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadStats {
    /// Files written to storage.
    pub uploaded_files: u64,
    /// Bytes written to storage.
    pub uploaded_bytes: u64,
    /// Files referenced from earlier checkpoints instead of uploaded.
    pub reused_files: u64,
    /// Bytes of the reused files.
    pub reused_bytes: u64,
}

/// A file of checkpoint storage referenced by a state handle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredFile {
    /// Name of the file in the local state directory (`000012.sst`, `MANIFEST-000005`).
    pub local_name: String,
    /// Object name in checkpoint storage.
    pub object: String,
    /// Size in bytes.
    pub size: u64,
    /// Hex SHA-256 of the content.
    pub sha256: String,
}

/// Serializable reference to one subtask's keyed state in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "backend", rename_all = "snake_case")]
pub enum StateHandle {
    /// One file with the serialized key-group range.
    Heap(HeapStateHandle),
    /// A RocksDB checkpoint: shared SST files plus private MANIFEST/CURRENT/OPTIONS.
    RocksDb(RocksDbStateHandle),
}

/// Handle of a heap snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeapStateHandle {
    /// The checkpoint it was taken for.
    pub checkpoint_id: CheckpointId,
    /// The key groups it holds.
    pub key_groups: KeyGroupRange,
    /// The snapshot file.
    pub file: StoredFile,
}

/// Handle of a RocksDB snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RocksDbStateHandle {
    /// The checkpoint it was taken for.
    pub checkpoint_id: CheckpointId,
    /// The key groups it holds.
    pub key_groups: KeyGroupRange,
    /// The backend instance that took it.
    pub instance: String,
    /// The column family holding the state.
    pub column_family: String,
    /// SST files (immutable, possibly uploaded by an earlier checkpoint).
    pub shared: Vec<StoredFile>,
    /// MANIFEST, CURRENT, OPTIONS: private to this checkpoint.
    pub private: Vec<StoredFile>,
}

impl StateHandle {
    /// The key groups the handle holds.
    pub fn key_groups(&self) -> KeyGroupRange {
        match self {
            StateHandle::Heap(h) => h.key_groups,
            StateHandle::RocksDb(h) => h.key_groups,
        }
    }

    /// The checkpoint it was taken for.
    pub fn checkpoint_id(&self) -> CheckpointId {
        match self {
            StateHandle::Heap(h) => h.checkpoint_id,
            StateHandle::RocksDb(h) => h.checkpoint_id,
        }
    }

    /// Every file the handle references.
    pub fn files(&self) -> Vec<&StoredFile> {
        match self {
            StateHandle::Heap(h) => vec![&h.file],
            StateHandle::RocksDb(h) => h.shared.iter().chain(h.private.iter()).collect(),
        }
    }

    /// Mutable access to every file (to rewrite object names, e.g. for savepoints).
    pub fn files_mut(&mut self) -> Vec<&mut StoredFile> {
        match self {
            StateHandle::Heap(h) => vec![&mut h.file],
            StateHandle::RocksDb(h) => h.shared.iter_mut().chain(h.private.iter_mut()).collect(),
        }
    }

    /// Total bytes of the referenced files.
    pub fn state_size(&self) -> u64 {
        self.files().iter().map(|f| f.size).sum()
    }
}

/// The handles among `handles` whose key groups intersect `range` (rescaling: a new
/// subtask restores from every old subtask it shares key groups with).
pub fn handles_for_range(handles: &[StateHandle], range: KeyGroupRange) -> Vec<StateHandle> {
    handles.iter().filter(|h| h.key_groups().intersects(&range)).cloned().collect()
}

/// Downloads a referenced file and checks its size and checksum; errors name the file
/// and the checkpoint.
pub(crate) fn fetch_verified(
    store: &dyn CheckpointStore,
    file: &StoredFile,
    checkpoint: CheckpointId,
) -> Result<bytes::Bytes> {
    let data = match store.get(&file.object) {
        Ok(d) => d,
        Err(Error::NotFound { .. }) => {
            return Err(Error::MissingFile { checkpoint: checkpoint.label(), file: file.object.clone() })
        }
        Err(e) => return Err(e),
    };
    if data.len() as u64 != file.size {
        return Err(Error::CorruptFile {
            checkpoint: checkpoint.label(),
            file: file.object.clone(),
            reason: format!("{} bytes, expected {} (truncated or overwritten)", data.len(), file.size),
        });
    }
    let sum = sha256_hex(&data);
    if sum != file.sha256 {
        return Err(Error::CorruptFile {
            checkpoint: checkpoint.label(),
            file: file.object.clone(),
            reason: format!("sha256 {sum}, expected {}", file.sha256),
        });
    }
    Ok(data)
}

/// Hex SHA-256.
pub(crate) fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(data);
    let mut s = String::with_capacity(64);
    for b in digest {
        s.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
        s.push(char::from_digit(u32::from(b & 0xf), 16).unwrap_or('0'));
    }
    s
}

/// List values are a sequence of `u32 BE length | element` frames.
pub fn frame_list_element(element: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + element.len());
    out.extend_from_slice(&(element.len() as u32).to_be_bytes());
    out.extend_from_slice(element);
    out
}

/// Splits a list value written by [`KeyedStateBackend::append`] into its elements.
pub fn decode_list(value: &[u8]) -> Result<Vec<&[u8]>> {
    let mut out = Vec::new();
    let mut rest = value;
    while !rest.is_empty() {
        let (len, tail) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| Error::Codec { state: "list".into(), reason: "truncated list frame".into() })?;
        let len = u32::from_be_bytes(*len) as usize;
        if tail.len() < len {
            return Err(Error::Codec { state: "list".into(), reason: "truncated list element".into() });
        }
        let (el, tail) = tail.split_at(len);
        out.push(el);
        rest = tail;
    }
    Ok(out)
}

/// Inlined on every keyed access; the error's construction is kept out of the way.
#[inline]
pub(crate) fn check_key_group(range: KeyGroupRange, key_group: u16) -> Result<()> {
    if range.contains(key_group) {
        Ok(())
    } else {
        Err(key_group_out_of_range(range, key_group))
    }
}

#[cold]
#[inline(never)]
fn key_group_out_of_range(range: KeyGroupRange, key_group: u16) -> Error {
    Error::KeyGroupOutOfRange { key_group, range: range.to_string() }
}

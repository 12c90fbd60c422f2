//! Helpers shared by the integration tests.
#![allow(dead_code, clippy::unwrap_used)]

use caudal_checkpoints::*;

/// Which backend a test body runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Heap,
    /// The heap backend taking announced lookups at any size (by default only once large).
    HeapAnnouncing,
    RocksDb,
    /// RocksDB behind a small write-back cache (64 entries, so it evicts often).
    CachedRocksDb,
}

pub const KINDS: [Kind; 3] = [Kind::Heap, Kind::RocksDb, Kind::CachedRocksDb];

pub fn op() -> OperatorId {
    OperatorId::new("window-avg").unwrap()
}

/// A small RocksDB config so that tests create several SST files quickly.
pub fn small_rocksdb() -> RocksDbConfig {
    RocksDbConfig {
        block_cache_mb: 8,
        write_buffer_mb: 1,
        target_file_size_mb: 1,
        ..RocksDbConfig::default()
    }
}

/// A backend and the temp dir it lives in (kept alive with it).
pub struct TestBackend {
    pub backend: Box<dyn KeyedStateBackend>,
    pub dir: tempfile::TempDir,
}

pub fn open(kind: Kind, range: KeyGroupRange) -> TestBackend {
    let dir = tempfile::tempdir().unwrap();
    let backend: Box<dyn KeyedStateBackend> = match kind {
        Kind::Heap => Box::new(HeapStateBackend::new(range)),
        Kind::HeapAnnouncing => Box::new(HeapStateBackend::new(range).announce_from(0)),
        Kind::RocksDb => {
            Box::new(RocksDbStateBackend::open(dir.path(), &op(), range, &small_rocksdb()).unwrap())
        }
        Kind::CachedRocksDb => Box::new(CachingBackend::new(
            RocksDbStateBackend::open(dir.path(), &op(), range, &small_rocksdb()).unwrap(),
            64 * (caudal_checkpoints::backend::cache::ENTRY_OVERHEAD + 24),
        )),
    };
    TestBackend { backend, dir }
}

pub fn restore(
    kind: Kind,
    range: KeyGroupRange,
    handles: &[StateHandle],
    store: &dyn CheckpointStore,
) -> Result<TestBackend> {
    let dir = tempfile::tempdir().unwrap();
    let backend: Box<dyn KeyedStateBackend> = match kind {
        Kind::Heap => Box::new(HeapStateBackend::restore(range, handles, store)?),
        Kind::HeapAnnouncing => Box::new(HeapStateBackend::restore(range, handles, store)?.announce_from(0)),
        Kind::RocksDb => Box::new(RocksDbStateBackend::restore(
            dir.path(),
            &op(),
            range,
            &small_rocksdb(),
            handles,
            store,
        )?),
        Kind::CachedRocksDb => Box::new(CachingBackend::new(
            RocksDbStateBackend::restore(dir.path(), &op(), range, &small_rocksdb(), handles, store)?,
            64 * (caudal_checkpoints::backend::cache::ENTRY_OVERHEAD + 24),
        )),
    };
    Ok(TestBackend { backend, dir })
}

pub fn location(paths: &CheckpointPaths, id: u64, subtask: u32) -> StateLocation {
    StateLocation {
        paths: paths.clone(),
        checkpoint: CheckpointId(id),
        operator: op(),
        subtask: SubtaskIndex(subtask),
        latest_completed: None,
    }
}

/// The key group of a string key (the state format's hash).
pub fn kg_of(key: &str) -> u16 {
    keygroup::key_group_of(key, 128)
}

/// Takes a checkpoint of several subtasks' backends and completes it in `store`.
pub fn checkpoint(
    store: &dyn CheckpointStore,
    paths: &CheckpointPaths,
    job: &str,
    id: u64,
    backends: &mut [&mut TestBackend],
) -> (CheckpointMetadata, Vec<UploadStats>) {
    let mut raw: Vec<&mut (dyn KeyedStateBackend + 'static)> =
        backends.iter_mut().map(|b| b.backend.as_mut()).collect();
    checkpoint_backends(store, paths, job, id, &mut raw)
}

/// [`checkpoint`] over plain backends.
pub fn checkpoint_backends(
    store: &dyn CheckpointStore,
    paths: &CheckpointPaths,
    job: &str,
    id: u64,
    backends: &mut [&mut (dyn KeyedStateBackend + 'static)],
) -> (CheckpointMetadata, Vec<UploadStats>) {
    let taken = take_checkpoint(store, paths, job, id, None, backends);
    for b in backends.iter_mut() {
        b.notify_checkpoint_complete(CheckpointId(id));
    }
    taken
}

/// Takes and completes checkpoint `id`, its barrier naming `latest_completed`, without
/// notifying the backends (their notification is late).
pub fn take_checkpoint(
    store: &dyn CheckpointStore,
    paths: &CheckpointPaths,
    job: &str,
    id: u64,
    latest_completed: Option<u64>,
    backends: &mut [&mut (dyn KeyedStateBackend + 'static)],
) -> (CheckpointMetadata, Vec<UploadStats>) {
    let mut pending = PendingCheckpoint::new(
        CheckpointId(id),
        CheckpointKind::Checkpoint,
        id * 1000,
        60_000,
        [(op(), backends.len() as u32)],
    );
    let mut stats = Vec::new();
    for (i, b) in backends.iter_mut().enumerate() {
        let at = StateLocation {
            latest_completed: latest_completed.map(CheckpointId),
            ..location(paths, id, i as u32)
        };
        let snap = b.snapshot(&at).unwrap();
        let result = snap.upload(store).unwrap();
        stats.push(result.stats);
        pending
            .acknowledge(
                &op(),
                SubtaskIndex(i as u32),
                SubtaskSnapshot {
                    keyed_state: Some(result.handle),
                    operator_state: Some(Blob(vec![i as u8])),
                },
                id * 1000 + 5,
            )
            .unwrap();
    }
    let meta = complete_checkpoint(store, paths, &mut pending, job, 128).unwrap();
    (meta, stats)
}

/// Every (state, key bytes, value) of a backend, over all its key groups.
pub fn dump(backend: &dyn KeyedStateBackend) -> Vec<(u16, Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    for kg in backend.key_groups().iter() {
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = backend.list_entries(kg, after.as_deref(), 7).unwrap();
            for e in &page.entries {
                out.push((kg, e.key.clone(), e.value.clone()));
            }
            match page.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
    }
    out
}

//! The engine's side of keyed state: it opens (or restores) a `caudal-checkpoints` backend for
//! each keyed operator subtask, hands it to the operator through [`OperatorContext::keyed_state`],
//! takes the synchronous snapshot part at the barrier, and forwards `checkpoint_complete`.
//! The state code itself (backends, layout, snapshots, uploads) lives in `caudal-checkpoints`;
//! the asynchronous upload runs on the job's uploader threads (`runtime::upload`).
//!
//! [`OperatorContext::keyed_state`]: crate::OperatorContext::keyed_state

use crate::types::{CheckpointBarrier, CheckpointId};
use crate::{Error, Result};
use caudal_checkpoints::{
    BackendKind, CheckpointPaths, CheckpointStore, HeapStateBackend, KeyGroupRange, KeyedStateBackend,
    OperatorId, StateBackendConfig, StateHandle, StateLocation, StateSnapshot, SubtaskIndex,
};
use parking_lot::{MappedMutexGuard, Mutex, MutexGuard};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Exclusive access to an operator subtask's keyed-state backend.
pub type KeyedStateGuard<'a> = MappedMutexGuard<'a, dyn KeyedStateBackend>;

/// Where a subtask's backend comes from when the job restores.
pub(crate) struct RestoreSource {
    pub(crate) checkpoint: CheckpointId,
    /// The handles of every old subtask whose key groups intersect this subtask's range.
    pub(crate) handles: Vec<StateHandle>,
    pub(crate) store: Arc<dyn CheckpointStore>,
    /// A savepoint's files belong to the user: the next checkpoint uploads its own copies.
    pub(crate) from_savepoint: bool,
}

/// How to open a subtask's backend.
pub(crate) struct StateSetup {
    pub(crate) config: StateBackendConfig,
    /// The subtask's working directory (RocksDB files).
    pub(crate) dir: PathBuf,
    pub(crate) operator: OperatorId,
    pub(crate) range: KeyGroupRange,
    pub(crate) restore: Option<RestoreSource>,
}

enum Slot {
    /// Not opened yet (opened on first use, or at start when restoring).
    Closed(Box<StateSetup>),
    Open {
        backend: Box<dyn KeyedStateBackend>,
        dir: Option<PathBuf>,
    },
    /// Opening failed; the error was returned to the first caller.
    Failed(String),
}

/// The keyed state of one operator subtask, opened lazily on first use.
///
/// Shared behind a mutex so that [`crate::OperatorContext`] stays `Clone`; operators lock it
/// once per batch, never per record.
#[derive(Clone)]
pub struct KeyedState {
    slot: Arc<Mutex<Slot>>,
    cache_entries: usize,
    /// Where snapshots go: (object names of the job, operator, subtask).
    location: Option<(CheckpointPaths, OperatorId, SubtaskIndex)>,
}

impl std::fmt::Debug for KeyedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &*self.slot.lock() {
            Slot::Closed(_) => "closed".to_string(),
            Slot::Open { backend, .. } => format!("open ({})", backend.kind()),
            Slot::Failed(e) => format!("failed: {e}"),
        };
        write!(f, "KeyedState({state})")
    }
}

/// The synchronous part of a subtask's snapshot, waiting for its upload.
pub(crate) struct TakenKeyedSnapshot {
    pub(crate) snapshot: Box<dyn StateSnapshot>,
    /// How long the synchronous part took (the operator's write-through, the backend's flush +
    /// RocksDB checkpoint, or the heap copy).
    pub(crate) sync: Duration,
}

impl KeyedState {
    pub(crate) fn new(setup: StateSetup, paths: CheckpointPaths, subtask: u32) -> Self {
        let cache_entries = setup.config.cache_entries();
        let location = Some((paths, setup.operator.clone(), SubtaskIndex(subtask)));
        KeyedState { slot: Arc::new(Mutex::new(Slot::Closed(Box::new(setup)))), cache_entries, location }
    }

    /// An empty heap backend over `range` (operator tests).
    pub fn heap(range: KeyGroupRange) -> Self {
        Self::from_backend(Box::new(HeapStateBackend::new(range)))
    }

    /// Keyed state held by `backend` (operator tests), not snapshotted by an engine.
    pub fn from_backend(backend: Box<dyn KeyedStateBackend>) -> Self {
        KeyedState {
            slot: Arc::new(Mutex::new(Slot::Open { backend, dir: None })),
            cache_entries: caudal_checkpoints::StateBackendConfig::default().cache_entries(),
            location: None,
        }
    }

    /// The same state with an operator cache of `entries` (operator tests of the spill path).
    pub fn with_cache_entries(mut self, entries: usize) -> Self {
        self.cache_entries = entries;
        self
    }

    /// How many entries an operator may keep in its own write-back cache in front of the
    /// backend (`state.cache_entries`).
    pub fn cache_entries(&self) -> usize {
        self.cache_entries
    }

    /// Locks the backend, opening (or restoring) it on first use.
    pub fn lock(&self) -> Result<KeyedStateGuard<'_>> {
        let mut slot = self.slot.lock();
        if let Slot::Closed(_) = &*slot {
            let Slot::Closed(setup) = std::mem::replace(&mut *slot, Slot::Failed(String::new())) else {
                unreachable!("checked above")
            };
            match open(*setup) {
                Ok(open) => *slot = open,
                Err(e) => {
                    *slot = Slot::Failed(e.to_string());
                    return Err(e);
                }
            }
        }
        if let Slot::Failed(e) = &*slot {
            return Err(Error::Operator(format!("keyed state could not be opened: {e}")));
        }
        Ok(MutexGuard::map(slot, |s| match s {
            Slot::Open { backend, .. } => backend.as_mut(),
            _ => unreachable!("opened above"),
        }))
    }

    /// Opens the backend now if the job restores state into it (so that the snapshot of the
    /// next checkpoint carries the restored state even if no record touches it); returns
    /// whether it restored.
    pub(crate) fn open_if_restoring(&self) -> Result<bool> {
        let restoring = matches!(&*self.slot.lock(), Slot::Closed(s) if s.restore.is_some());
        if restoring {
            drop(self.lock()?);
        }
        Ok(restoring)
    }

    /// The synchronous part of the snapshot for the checkpoint of `barrier`, if the backend
    /// is open.
    pub(crate) fn snapshot(&self, barrier: &CheckpointBarrier) -> Result<Option<TakenKeyedSnapshot>> {
        let Some((paths, operator, subtask)) = &self.location else { return Ok(None) };
        let mut slot = self.slot.lock();
        let Slot::Open { backend, .. } = &mut *slot else { return Ok(None) };
        let location = StateLocation {
            paths: paths.clone(),
            checkpoint: barrier.id,
            operator: operator.clone(),
            subtask: *subtask,
            latest_completed: barrier.latest_completed,
        };
        let start = Instant::now();
        let snapshot = backend.snapshot(&location)?;
        Ok(Some(TakenKeyedSnapshot { snapshot, sync: start.elapsed() }))
    }

    /// Checkpoint `id` is complete: the backend may reference its files from now on.
    pub(crate) fn notify_checkpoint_complete(&self, id: CheckpointId) {
        if let Slot::Open { backend, .. } = &mut *self.slot.lock() {
            backend.notify_checkpoint_complete(id);
        }
    }

    /// Closes the backend and removes its working directory.
    pub(crate) fn close(&self) {
        let mut slot = self.slot.lock();
        if let Slot::Open { dir: Some(dir), .. } =
            std::mem::replace(&mut *slot, Slot::Failed("closed".into()))
        {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn open(setup: StateSetup) -> Result<Slot> {
    let StateSetup { config, dir, operator, range, restore } = setup;
    let backend = match restore {
        Some(r) => {
            let mut b =
                config.restore(&dir, &operator, range, &r.handles, r.store.as_ref()).map_err(|e| {
                    Error::config(
                        "restore",
                        format!(
                            "restoring the keyed state of `{operator}` from {}: {e}",
                            r.checkpoint.label()
                        ),
                    )
                })?;
            if r.from_savepoint {
                b.upload_all_files_next();
            }
            b
        }
        None => config.open(&dir, &operator, range)?,
    };
    let dir = (config.kind == BackendKind::Rocksdb).then_some(dir);
    Ok(Slot::Open { backend, dir })
}

impl From<caudal_checkpoints::Error> for Error {
    fn from(e: caudal_checkpoints::Error) -> Self {
        Error::CheckpointStorage { context: "keyed state".into(), source: Box::new(e) }
    }
}

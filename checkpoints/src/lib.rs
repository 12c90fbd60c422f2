//! Caudal checkpoints: keyed state backends, snapshots and checkpoint storage.
//!
//! In: snapshots from tasks (state handles produced by a [`KeyedStateBackend`], opaque
//! source positions). Out: a completed checkpoint in storage, and restored backends.
//! **A checkpoint is complete only once its metadata is durable**: `chk-<n>/_metadata`
//! is written last, with put-if-absent, after every subtask acknowledged.
//!
//! * [`backend`]: the [`KeyedStateBackend`] trait, [`HeapStateBackend`] and
//!   [`RocksDbStateBackend`] (incremental snapshots, rescaling restore), and
//!   [`CachingBackend`], a write-back cache for the hot path;
//! * [`state`]: typed [`ValueState`], [`MapState`], [`ListState`], [`AggregatingState`];
//! * [`store`]: [`CheckpointStore`] (in memory, local directory, S3) and
//!   [`CheckpointPaths`], the owner of every object name;
//! * [`metadata`], [`protocol`]: the metadata and the pure checkpoint state machine;
//! * [`retention`]: keep the last k checkpoints, savepoints;
//! * [`runs`]: which run owns the storage now (a newer run's claim fences older ones).
//!
//! # Example
//!
//! One subtask, one checkpoint, one restore:
//!
//! ```
//! use caudal_checkpoints::*;
//!
//! let store = InMemoryCheckpointStore::new();
//! let paths = CheckpointPaths::new();
//! let op = OperatorId::new("counter")?;
//! let range = KeyGroupRange::of_subtask(128, 1, 0);
//! let count: ValueState<String, u64> = ValueState::new("count")?;
//!
//! let mut backend = HeapStateBackend::new(range);
//! count.put(&mut backend, 5, &"sensor-1".to_string(), &(), &42)?;
//!
//! // Barrier 1: synchronous snapshot, then the upload (may run on another thread).
//! let id = CheckpointId(1);
//! let location = StateLocation { paths: paths.clone(), checkpoint: id, operator: op.clone(), subtask: SubtaskIndex(0), latest_completed: None };
//! let snapshot = backend.snapshot(&location)?;
//! let result = snapshot.upload(&store)?;
//!
//! // The coordinator collects the ack and writes the metadata last.
//! let mut pending = PendingCheckpoint::new(id, CheckpointKind::Checkpoint, 0, 60_000, [(op.clone(), 1)]);
//! let ack = SubtaskSnapshot { keyed_state: Some(result.handle), operator_state: None };
//! assert_eq!(pending.acknowledge(&op, SubtaskIndex(0), ack, 10)?, AckOutcome::AllAcknowledged);
//! complete_checkpoint(&store, &paths, &mut pending, "my-job", 128)?;
//! backend.notify_checkpoint_complete(id);
//!
//! // Restore.
//! let meta = latest_completed(&store, &paths, "my-job")?.expect("a completed checkpoint");
//! let handles = handles_for_range(&meta.operators[&op].keyed_handles(), range);
//! let restored = HeapStateBackend::restore(range, &handles, &store)?;
//! assert_eq!(count.get(&restored, 5, &"sensor-1".to_string(), &())?, Some(42));
//! # Ok::<(), caudal_checkpoints::Error>(())
//! ```

pub mod backend;
mod error;
mod ids;
pub mod keygroup;
pub mod keys;
pub mod lineage;
pub mod metadata;
pub mod protocol;
pub mod retention;
pub mod runs;
pub mod state;
pub mod store;

pub use backend::{
    handles_for_range, BackendKind, CachingBackend, EntryHint, EntryPage, HeapStateBackend, KeyGroupStats,
    KeyedStateBackend, RawEntry, RocksDbConfig, RocksDbStateBackend, SnapshotResult, StateBackendConfig,
    StateHandle, StateSnapshot, StateWriteBatch, StoredFile, UploadStats,
};
pub use error::{Error, ErrorClass, Result};
pub use ids::{CheckpointId, OperatorId, SubtaskIndex};
pub use keygroup::{KeyGroupRange, DEFAULT_MAX_PARALLELISM};
pub use keys::{StateId, StateKey};
pub use lineage::{CheckpointRef, Lineage};
pub use metadata::{
    latest_completed, latest_completed_with_fallback, read_metadata, Blob, CheckpointKind,
    CheckpointMetadata, OperatorSnapshot, SubtaskSnapshot,
};
pub use protocol::{complete_checkpoint, AbortCause, AckOutcome, CheckpointState, PendingCheckpoint};
pub use retention::{apply_retention, create_savepoint, RetentionConfig, RetentionReport};
pub use state::{AggregatingState, ListState, MapState, ValueState};
pub use store::{
    s3_bucket_store, s3_bucket_store_with_retry, CheckpointPaths, CheckpointStorageConfig, CheckpointStore,
    InMemoryCheckpointStore, ObjectCheckpointStore, S3Config, StateLocation, StorageUrl,
};

//! The one configuration the engine needs to open or restore a backend.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{
    CachingBackend, HeapStateBackend, KeyedStateBackend, RocksDbConfig, RocksDbStateBackend, StateHandle,
};
use crate::ids::OperatorId;
use crate::keygroup::KeyGroupRange;
use crate::store::CheckpointStore;
use crate::Result;

/// Keys an operator keeps deserialized per subtask over RocksDB, by default.
pub const DEFAULT_OPERATOR_CACHE_ENTRIES: usize = 100_000;

/// Which backend holds keyed state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// In memory (tests, small jobs).
    Heap,
    /// RocksDB on local disk (the default for jobs).
    #[default]
    Rocksdb,
}

/// State backend settings of a job. `build`-style entry points: [`Self::open`] and
/// [`Self::restore`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StateBackendConfig {
    /// `rocksdb` (default) or `heap` (also accepted as `backend`: `state.backend`).
    #[serde(alias = "backend")]
    pub kind: BackendKind,
    /// Keys an operator keeps deserialized in memory per subtask (the window operators),
    /// written through to the backend at checkpoints (and when there are more). `None` (the
    /// default): 100,000 with RocksDB, no bound on the heap — there the backend is memory too,
    /// so the operator's objects are the working copy and the backend holds what checkpoints
    /// write through (bounding them only added a serialize and a map lookup per record once
    /// the keys outgrew the bound).
    pub cache_entries: Option<usize>,
    /// MiB of keys and values the write-back cache in front of RocksDB may hold per operator
    /// subtask (see [`super::cache`]); 0 disables it. `None` (the default): 128 MiB, about
    /// 1.4 million small values. A working set that fits is read and written in memory and
    /// reaches RocksDB once per checkpoint; one that does not pays a RocksDB read per miss.
    pub cache_mb: Option<usize>,
    /// RocksDB tuning.
    pub rocksdb: RocksDbConfig,
}

impl Default for StateBackendConfig {
    fn default() -> Self {
        StateBackendConfig {
            kind: BackendKind::Rocksdb,
            cache_entries: None,
            cache_mb: None,
            rocksdb: RocksDbConfig::default(),
        }
    }
}

impl StateBackendConfig {
    /// Heap state, for tests.
    pub fn heap() -> Self {
        StateBackendConfig { kind: BackendKind::Heap, ..Default::default() }
    }

    /// The operator cache's size (see [`Self::cache_entries`]'s field doc).
    pub fn cache_entries(&self) -> usize {
        self.cache_entries.unwrap_or(match self.kind {
            BackendKind::Rocksdb => DEFAULT_OPERATOR_CACHE_ENTRIES,
            BackendKind::Heap => usize::MAX,
        })
    }

    /// The write-back cache's budget in bytes (see [`Self::cache_mb`]'s field doc).
    pub fn cache_bytes(&self) -> usize {
        self.cache_mb.map_or(super::cache::DEFAULT_CACHE_BYTES, |mb| mb.saturating_mul(1 << 20))
    }

    /// Checks the values; errors name the field.
    pub fn validate(&self) -> Result<()> {
        self.rocksdb.validate()
    }

    /// An empty backend for `operator` over `range`; `dir` is the subtask's working
    /// directory (unused by the heap backend).
    pub fn open(
        &self,
        dir: &Path,
        operator: &OperatorId,
        range: KeyGroupRange,
    ) -> Result<Box<dyn KeyedStateBackend>> {
        self.validate()?;
        Ok(match self.kind {
            BackendKind::Heap => Box::new(HeapStateBackend::new(range)),
            BackendKind::Rocksdb => {
                self.wrap(RocksDbStateBackend::open(dir, operator, range, &self.rocksdb)?)
            }
        })
    }

    /// A backend for `operator` over `range` restored from `handles` (the handles of
    /// all old subtasks whose ranges intersect `range`: see
    /// [`super::handles_for_range`]).
    pub fn restore(
        &self,
        dir: &Path,
        operator: &OperatorId,
        range: KeyGroupRange,
        handles: &[StateHandle],
        store: &dyn CheckpointStore,
    ) -> Result<Box<dyn KeyedStateBackend>> {
        self.validate()?;
        Ok(match self.kind {
            BackendKind::Heap => Box::new(HeapStateBackend::restore(range, handles, store)?),
            BackendKind::Rocksdb => {
                self.wrap(RocksDbStateBackend::restore(dir, operator, range, &self.rocksdb, handles, store)?)
            }
        })
    }

    fn wrap(&self, backend: RocksDbStateBackend) -> Box<dyn KeyedStateBackend> {
        match self.cache_bytes() {
            0 => Box::new(backend),
            budget => Box::new(CachingBackend::new(backend, budget)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_with_defaults_and_rejects_unknown_fields() {
        let c: StateBackendConfig = serde_json::from_str(r#"{"kind":"heap"}"#).unwrap();
        assert_eq!(c.kind, BackendKind::Heap);
        let c: StateBackendConfig = serde_json::from_str(r#"{"backend":"heap"}"#).unwrap();
        assert_eq!(c.kind, BackendKind::Heap);
        assert_eq!(c.rocksdb, RocksDbConfig::default());
        assert_eq!(c.cache_entries(), usize::MAX, "no bound on the heap by default");
        let c: StateBackendConfig = serde_json::from_str(r#"{"kind":"heap","cache_entries":500}"#).unwrap();
        assert_eq!(c.cache_entries(), 500);
        assert_eq!(StateBackendConfig::default().cache_entries(), DEFAULT_OPERATOR_CACHE_ENTRIES);
        assert_eq!(StateBackendConfig::default().cache_bytes(), 128 << 20);
        let c: StateBackendConfig = serde_json::from_str(r#"{"cache_mb":0}"#).unwrap();
        assert_eq!(c.cache_bytes(), 0, "0 disables the write-back cache");
        let c: StateBackendConfig = serde_json::from_str(r#"{"rocksdb":{"block_cache_mb":256}}"#).unwrap();
        assert_eq!(c.kind, BackendKind::Rocksdb);
        assert_eq!(c.rocksdb.block_cache_mb, 256);
        assert!(serde_json::from_str::<StateBackendConfig>(r#"{"rocksdb":{"cache_mb":1}}"#).is_err());
        let bad = StateBackendConfig {
            rocksdb: RocksDbConfig { max_background_jobs: 0, ..Default::default() },
            ..Default::default()
        };
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.contains("rocksdb.max_background_jobs"), "{err}");
    }
}

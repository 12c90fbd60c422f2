//! The operator traits: how user logic plugs into the engine.
//!
//! An operator is one trait with one required method (`process_batch`) and no-op hooks.
//! Stateless map/filter/flat_map are closures the engine wraps; keyed windows and
//! connectors implement the full trait in `caudal-operators`.

use crate::metrics::SubtaskMetrics;
use crate::state::{KeyedState, KeyedStateGuard};
use crate::types::{Batch, CheckpointId, Data, Timestamp};
use crate::Result;
use std::sync::Arc;

/// What an operator instance knows about where it runs.
#[derive(Debug, Clone)]
pub struct OperatorContext {
    /// The job's name.
    pub job_name: String,
    /// The operator's name in the graph.
    pub operator_name: String,
    /// This instance's index, `0..parallelism`.
    pub subtask: u32,
    /// How many instances run.
    pub parallelism: u32,
    /// The number of key groups of the job.
    pub max_parallelism: u32,
    /// The key groups this instance owns (meaningful for keyed operators).
    pub key_groups: std::ops::Range<u16>,
    /// The current input watermark.
    pub watermark: Timestamp,
    /// This instance's counters, shared with the metrics registry.
    pub metrics: Arc<SubtaskMetrics>,
    /// The operator's stable id in checkpoints (`<graph index>-<name>`).
    pub operator_uid: String,
    /// True when the job takes checkpoints (sinks then publish only on completion).
    pub checkpointing: bool,
    /// The checkpoint interval and timeout when checkpointing: the longest a pre-committed
    /// transaction waits for its commit is about interval + timeout + a restart.
    pub checkpoint_timing: Option<(std::time::Duration, std::time::Duration)>,
    /// The checkpoint the job restored from, if any.
    pub restored_checkpoint: Option<CheckpointId>,
    /// This run (attempt) of the job: the same in every subtask of the attempt, in every
    /// process of a cluster, and new for every run, a restart inside the same process
    /// included ([`new_attempt_id`]). Sinks tag their in-progress output with it, so that a
    /// restore removes exactly what earlier runs left.
    pub attempt: String,
    /// The snapshots of every subtask of this operator in the restored checkpoint; the
    /// engine hands them to [`Operator::restore`] / [`Sink::restore`] before `on_start`.
    pub restored: Option<Vec<Vec<u8>>>,
    /// This operator's snapshots in the completed checkpoints that later runs took on from
    /// the restored one (a savepoint restored a second time, an older checkpoint restored
    /// after the job went on), newest first: a sink that cannot commit a restored
    /// transaction again finds there whether such a run committed it.
    pub later_snapshots: Vec<LaterSnapshot>,
    /// Whether this run still owns the job's checkpoint storage (`None` when the job keeps
    /// no checkpoints): a sink checks it before it begins output under a name a newer
    /// run's restore could not know yet.
    pub fence: Option<crate::RunFence>,
    /// The keyed state of a keyed operator (its input is partitioned by `key_by`).
    pub(crate) keyed: Option<KeyedState>,
    /// The state browser's queries for this subtask (keyed operators of embedded jobs).
    pub(crate) state_queries: Option<crossbeam_channel::Receiver<crate::state_query::StateQuery>>,
}

/// An operator's snapshot in a checkpoint taken after the restored one on its line (by the
/// same run later, or by a run restored from it): what that run had done by then — a sink's
/// pending list there no longer names what it committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaterSnapshot {
    /// The later checkpoint.
    pub checkpoint: caudal_checkpoints::CheckpointId,
    /// The run that took it.
    pub run: String,
    /// The operator's snapshot of every subtask there.
    pub subtasks: Vec<Vec<u8>>,
}

/// A new id for a run of a job: short lower-case hex, unique per call (time, process id
/// and a counter), so that two runs in one process differ too.
pub fn new_attempt_id() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{:x}", nanos ^ (u64::from(std::process::id()) << 32) ^ n.rotate_right(8))
}

impl OperatorContext {
    /// The context of subtask `subtask` of `parallelism` of a non-keyed operator outside
    /// a running job (connector tests, tools); set the public fields as needed.
    pub fn unkeyed(job_name: &str, operator_name: &str, subtask: u32, parallelism: u32) -> Self {
        let max_parallelism = crate::keygroup::DEFAULT_MAX_PARALLELISM;
        OperatorContext {
            job_name: job_name.to_owned(),
            operator_name: operator_name.to_owned(),
            subtask,
            parallelism,
            max_parallelism,
            key_groups: crate::keygroup::key_group_range(subtask, max_parallelism, parallelism),
            watermark: crate::types::MIN_WATERMARK,
            metrics: std::sync::Arc::new(crate::metrics::SubtaskMetrics::default()),
            operator_uid: format!("0-{operator_name}"),
            checkpointing: false,
            checkpoint_timing: None,
            restored_checkpoint: None,
            attempt: new_attempt_id(),
            restored: None,
            later_snapshots: Vec::new(),
            fence: None,
            keyed: None,
            state_queries: None,
        }
    }

    /// The keyed-state backend of this subtask (RocksDB or heap, by `JobConfig::state`),
    /// holding the key groups of [`Self::key_groups`]; restored from the checkpoint when the
    /// job restores. The engine snapshots it at every barrier and tells it when a checkpoint
    /// completes. Lock it once per batch, not per record. An error for operators that are
    /// not keyed.
    pub fn keyed_state(&self) -> Result<KeyedStateGuard<'_>> {
        match &self.keyed {
            Some(k) => k.lock(),
            None => Err(crate::Error::Graph(format!(
                "operator `{}` has no keyed state: apply it to a `key_by` stream",
                self.operator_name
            ))),
        }
    }

    /// How many entries the operator may keep in its own write-back cache in front of the
    /// keyed-state backend (`JobConfig::state.cache_entries`).
    pub fn keyed_state_cache_entries(&self) -> usize {
        self.keyed.as_ref().map_or(0, KeyedState::cache_entries)
    }
}

/// A stream operator: batches in, batches out.
///
/// `out` is a buffer the engine drains after each call; an operator may push any number of
/// records to it (the engine splits them into batches).
pub trait Operator: Send + 'static {
    /// The input element type.
    type In: Data;
    /// The output element type.
    type Out: Data;

    /// Process one batch of input records.
    fn process_batch(
        &mut self,
        batch: Batch<Self::In>,
        out: &mut Batch<Self::Out>,
        ctx: &mut OperatorContext,
    ) -> Result<()>;

    /// Called once before the first record.
    fn on_start(&mut self, _ctx: &mut OperatorContext) -> Result<()> {
        Ok(())
    }

    /// The input watermark advanced to `watermark` (`ctx.watermark` holds it too).
    fn on_watermark(
        &mut self,
        _watermark: Timestamp,
        _out: &mut Batch<Self::Out>,
        _ctx: &mut OperatorContext,
    ) -> Result<()> {
        Ok(())
    }

    /// Wall-clock time reached `now` (ms since the epoch), at or after
    /// [`Operator::next_processing_time`]: fire what is due. The task calls it between
    /// batches, within about 10 ms of that time.
    fn on_processing_time(
        &mut self,
        _now: Timestamp,
        _out: &mut Batch<Self::Out>,
        _ctx: &mut OperatorContext,
    ) -> Result<()> {
        Ok(())
    }

    /// The wall-clock time (ms since the epoch) at which this operator wants
    /// [`Operator::on_processing_time`] next; `None` (the default): never.
    fn next_processing_time(&self) -> Option<Timestamp> {
        None
    }

    /// Barrier `checkpoint` arrived, before the operator is snapshotted and the barrier goes
    /// on (Flink's `prepareSnapshotPreBarrier`): emit what belongs to the epoch that ends
    /// here. What is pushed to `out` reaches every consumer before the barrier does — e.g. the
    /// files a writer closed, for a committer downstream to record in the same checkpoint.
    fn prepare_snapshot_pre_barrier(
        &mut self,
        _checkpoint: CheckpointId,
        _out: &mut Batch<Self::Out>,
        _ctx: &mut OperatorContext,
    ) -> Result<()> {
        Ok(())
    }

    /// A checkpoint barrier passed: return this operator's state snapshot, if it has state.
    fn snapshot(&mut self, _checkpoint: CheckpointId, _ctx: &mut OperatorContext) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }

    /// Restore from a snapshot taken by [`Operator::snapshot`] (one blob per old subtask).
    fn restore(&mut self, _snapshots: Vec<Vec<u8>>, _ctx: &mut OperatorContext) -> Result<()> {
        Ok(())
    }

    /// Checkpoint `checkpoint` is complete: commit what was pre-committed for it.
    fn on_checkpoint_complete(
        &mut self,
        _checkpoint: CheckpointId,
        _ctx: &mut OperatorContext,
    ) -> Result<()> {
        Ok(())
    }

    /// The input ended (or the job stops): flush and release resources.
    fn on_close(&mut self, _out: &mut Batch<Self::Out>, _ctx: &mut OperatorContext) -> Result<()> {
        Ok(())
    }

    /// The operator's hooks for the state browser ([`StateBrowse`]), when it has keyed state
    /// worth showing; `None` (the default): its state is listed undecoded.
    fn state_browser(&mut self) -> Option<&mut dyn StateBrowse> {
        None
    }
}

/// What the state browser ([`crate::state_query`]) asks of an operator with keyed state,
/// offered through [`Operator::state_browser`]: to write its cache through before a listing,
/// and to decode its keys and values for people.
pub trait StateBrowse {
    /// The state browser is about to read this operator's keyed state (on the task thread,
    /// between batches; see [`crate::state_query`]): write any state cached in memory through
    /// to the backend, so that the reader sees the live state.
    fn prepare_state_read(&mut self, _ctx: &mut OperatorContext) -> Result<()> {
        Ok(())
    }

    /// The state browser's key lookup: the key group and stored encoding of a user key given
    /// as JSON (`7`, `"sensor-7"`); `None` when this operator cannot decode keys, an error
    /// when `key` is not a key of this operator.
    fn state_key_from_json(
        &self,
        _key: &serde_json::Value,
        _ctx: &OperatorContext,
    ) -> Option<Result<(u16, Vec<u8>)>> {
        None
    }

    /// The state browser's key lookup, before it reads the backend: the current entries of
    /// `key` (encoded as by [`StateBrowse::state_key_from_json`]) held in memory and newer than
    /// the backend, as `(state name, encoded namespace, value)`; `None` when the backend is
    /// current for this key. Lets a lookup skip [`StateBrowse::prepare_state_read`].
    fn cached_state(&self, _key: &[u8]) -> Option<crate::state_query::CachedEntries> {
        None
    }

    /// The state browser: a stored user key as JSON, `None` when it cannot be decoded.
    fn state_key_to_json(&self, _key: &[u8]) -> Option<serde_json::Value> {
        None
    }

    /// The state browser: a stored value of state `state` as JSON, `None` when it cannot be
    /// decoded (it is then shown as hex with its size).
    fn state_value_to_json(&self, _state: &str, _value: &[u8]) -> Option<serde_json::Value> {
        None
    }
}

/// The browser of an operator that offers no hooks: nothing decoded.
pub(crate) struct Undecoded;

impl StateBrowse for Undecoded {}

/// A sink: the end of a stream. Sinks flush at barriers and commit on checkpoint completion.
pub trait Sink: Send + 'static {
    /// The element type written.
    type In: Data;

    /// Write one batch.
    fn write_batch(&mut self, batch: Batch<Self::In>, ctx: &mut OperatorContext) -> Result<()>;

    /// Called once before the first record.
    fn on_start(&mut self, _ctx: &mut OperatorContext) -> Result<()> {
        Ok(())
    }

    /// Restore from the pre-commit snapshots of every old subtask (the job restored from
    /// `ctx.restored_checkpoint`): commit what they pre-committed, discard what is newer.
    fn restore(&mut self, _snapshots: Vec<Vec<u8>>, _ctx: &mut OperatorContext) -> Result<()> {
        Ok(())
    }

    /// Barrier of `checkpoint`: flush and pre-commit; return the pending-commit handles.
    fn pre_commit(
        &mut self,
        _checkpoint: CheckpointId,
        _ctx: &mut OperatorContext,
    ) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }

    /// Checkpoint `checkpoint` is complete: commit everything pre-committed up to it.
    fn on_checkpoint_complete(
        &mut self,
        _checkpoint: CheckpointId,
        _ctx: &mut OperatorContext,
    ) -> Result<()> {
        Ok(())
    }

    /// The input ended or the job stops: flush and close.
    fn on_close(&mut self, _ctx: &mut OperatorContext) -> Result<()> {
        Ok(())
    }
}

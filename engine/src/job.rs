//! What the outside (REST API, web UI, CLI) can see of a job while it runs.

use crate::graph::JobPlan;
use crate::metrics::MetricsRegistry;
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The lifecycle of a job (Flink's states).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobStatus {
    /// Built, not yet running.
    Created,
    /// Tasks are running.
    Running,
    /// A task failed; tasks are being cancelled.
    Failing,
    /// Waiting to restart after a failure.
    Restarting,
    /// Failed for good.
    Failed,
    /// Stopped by the user.
    Canceled,
    /// Bounded input consumed, or stopped cleanly.
    Finished,
}

/// A failure of the job, kept in its history.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FailureRecord {
    /// When, ms since the epoch.
    pub at_ms: i64,
    /// The error, with task, operator and cause.
    pub cause: String,
}

/// One completed or failed checkpoint, as shown in the UI.
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointStats {
    /// Checkpoint id.
    pub id: u64,
    /// `COMPLETED`, `FAILED` or `IN_PROGRESS`.
    pub status: String,
    /// Trigger time, ms since the epoch.
    pub trigger_ms: i64,
    /// Trigger to completion, ms.
    pub duration_ms: u64,
    /// Total state size referenced, bytes.
    pub size_bytes: u64,
    /// Bytes uploaded by this checkpoint (incremental).
    pub incremental_bytes: u64,
    /// The slowest subtask's synchronous keyed-state snapshot part (RocksDB flush +
    /// checkpoint), microseconds: the time its records waited.
    pub sync_us: u64,
    /// The slowest subtask's asynchronous part (upload of new files), microseconds.
    pub upload_us: u64,
    /// The longest barrier alignment of a task with several inputs, microseconds.
    pub alignment_us: u64,
    /// Per task subtask that acknowledged: its operators and what its snapshot cost.
    pub tasks: Vec<TaskCheckpointStats>,
    /// Why it failed, if it did.
    pub failure: Option<String>,
}

/// How a job checkpoints, as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointSettings {
    /// Between two checkpoints, ms (`None`: only on demand and at the end).
    pub interval_ms: Option<u64>,
    /// A checkpoint not complete after this long fails, ms.
    pub timeout_ms: u64,
    /// At least this long between the end of one checkpoint and the next, ms.
    pub min_pause_ms: u64,
    /// Completed checkpoints kept.
    pub retained: usize,
    /// Where checkpoints are stored (`file:///…`, `s3://…`).
    pub storage: String,
}

/// What one task subtask's part of a checkpoint cost.
#[derive(Debug, Clone, Serialize)]
pub struct TaskCheckpointStats {
    /// The operators of the task (a chain), upstream first.
    pub operators: Vec<String>,
    /// The subtask.
    pub subtask: u32,
    /// First to last barrier at its inputs, microseconds (0 for a source or one input).
    pub alignment_us: u64,
    /// Synchronous snapshot part (records waited), microseconds.
    pub sync_us: u64,
    /// Asynchronous part (upload), microseconds.
    pub upload_us: u64,
    /// State referenced, bytes.
    pub state_bytes: u64,
    /// Bytes uploaded for this checkpoint.
    pub uploaded_bytes: u64,
}

/// A savepoint asked for while the job runs (REST, `caudal savepoint`), and how it went.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SavepointRequest {
    /// The savepoint's name: it is written to `<storage>/<job>/savepoints/<name>/`.
    pub name: String,
    /// When it was asked for, ms since the epoch.
    pub requested_ms: i64,
    /// `PENDING` (waiting for the checkpoint in flight), `IN_PROGRESS`, `COMPLETED`, `FAILED`.
    pub status: String,
    /// The checkpoint taken for it.
    pub checkpoint: Option<u64>,
    /// The restore path (`--restore savepoints/<name>`) once completed.
    pub path: Option<String>,
    /// Why it failed, if it did.
    pub failure: Option<String>,
}

/// Why a savepoint request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SavepointRefused {
    /// The name is not a valid savepoint name.
    #[error("{0}")]
    InvalidName(String),
    /// A savepoint of that name was already asked for.
    #[error("a savepoint named `{0}` was already requested")]
    Duplicate(String),
    /// The job does not checkpoint, or has ended.
    #[error("{0}")]
    Unavailable(String),
}

/// A job as seen from outside: status, plan, counters, checkpoints and failures.
#[derive(Debug)]
pub struct JobView {
    /// Job name.
    pub name: String,
    /// The plan (operators, parallelism, chaining, edges).
    pub plan: JobPlan,
    /// Start time, ms since the epoch.
    pub started_ms: i64,
    /// Counters of every operator and subtask.
    pub metrics: Arc<MetricsRegistry>,
    status: RwLock<JobStatus>,
    failures: RwLock<Vec<FailureRecord>>,
    checkpoints: RwLock<Vec<CheckpointStats>>,
    savepoints: RwLock<Vec<SavepointRequest>>,
    /// Set while a checkpoint coordinator drives the job: savepoints can be taken.
    checkpointing: std::sync::atomic::AtomicBool,
    /// Ends the job at once (no final checkpoint in cluster mode; embedded: as `stop`).
    cancel: StopHandle,
    /// Ends the job after a final checkpoint.
    stop: StopHandle,
    /// The savepoint a stop asked for (copied from the final checkpoint).
    stop_savepoint: RwLock<Option<String>>,
    checkpoint_settings: RwLock<Option<CheckpointSettings>>,
    /// The state browser's mailboxes of the job's keyed operator subtasks.
    pub(crate) state_queries: Arc<crate::state_query::StateQueries>,
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl JobView {
    pub(crate) fn new(
        name: &str,
        plan: JobPlan,
        metrics: Arc<MetricsRegistry>,
        cancel: StopHandle,
        stop: StopHandle,
    ) -> Self {
        JobView {
            name: name.to_string(),
            plan,
            started_ms: now_ms(),
            metrics,
            status: RwLock::new(JobStatus::Created),
            failures: RwLock::new(Vec::new()),
            checkpoints: RwLock::new(Vec::new()),
            savepoints: RwLock::new(Vec::new()),
            checkpointing: std::sync::atomic::AtomicBool::new(false),
            cancel,
            stop,
            stop_savepoint: RwLock::new(None),
            checkpoint_settings: RwLock::new(None),
            state_queries: Arc::default(),
        }
    }

    /// Current status.
    pub fn status(&self) -> JobStatus {
        *self.status.read()
    }

    pub(crate) fn set_status(&self, s: JobStatus) {
        *self.status.write() = s;
    }

    /// Failure history, oldest first.
    pub fn failures(&self) -> Vec<FailureRecord> {
        self.failures.read().clone()
    }

    pub(crate) fn record_failure(&self, cause: String) {
        self.failures.write().push(FailureRecord { at_ms: now_ms(), cause });
    }

    /// Checkpoint history, oldest first.
    pub fn checkpoints(&self) -> Vec<CheckpointStats> {
        self.checkpoints.read().clone()
    }

    pub(crate) fn record_checkpoint(&self, stats: CheckpointStats) {
        let mut c = self.checkpoints.write();
        if let Some(existing) = c.iter_mut().find(|x| x.id == stats.id) {
            *existing = stats;
        } else {
            c.push(stats);
        }
    }

    /// Asks for a savepoint named `name` (`sp-<ms since the epoch>` when `None`): the
    /// coordinator triggers a checkpoint at once (after the one in flight) and copies it to
    /// `savepoints/<name>` when it completes. Follow it with [`Self::savepoints`].
    pub fn request_savepoint(&self, name: Option<String>) -> Result<SavepointRequest, SavepointRefused> {
        use std::sync::atomic::Ordering;
        let now = now_ms();
        let name = name.unwrap_or_else(|| format!("sp-{now}"));
        caudal_checkpoints::CheckpointPaths::validate_savepoint_name(&name)
            .map_err(|e| SavepointRefused::InvalidName(e.to_string()))?;
        let status = self.status();
        if matches!(status, JobStatus::Failed | JobStatus::Canceled | JobStatus::Finished) {
            return Err(SavepointRefused::Unavailable(format!("job `{}` has ended ({status:?})", self.name)));
        }
        if !self.checkpointing.load(Ordering::SeqCst) {
            return Err(SavepointRefused::Unavailable(format!(
                "job `{}` does not take checkpoints now (checkpointing off, or not running): no savepoint",
                self.name
            )));
        }
        let mut savepoints = self.savepoints.write();
        if savepoints.iter().any(|s| s.name == name) {
            return Err(SavepointRefused::Duplicate(name));
        }
        let request = SavepointRequest {
            name,
            requested_ms: now,
            status: "PENDING".into(),
            checkpoint: None,
            path: None,
            failure: None,
        };
        savepoints.push(request.clone());
        Ok(request)
    }

    /// Savepoints asked for while the job ran, oldest first.
    pub fn savepoints(&self) -> Vec<SavepointRequest> {
        self.savepoints.read().clone()
    }

    /// The oldest request still waiting for its checkpoint.
    pub(crate) fn next_pending_savepoint(&self) -> Option<String> {
        self.savepoints.read().iter().find(|s| s.status == "PENDING").map(|s| s.name.clone())
    }

    pub(crate) fn update_savepoint(&self, name: &str, update: impl FnOnce(&mut SavepointRequest)) {
        if let Some(s) = self.savepoints.write().iter_mut().find(|s| s.name == name) {
            update(s);
        }
    }

    /// Whether a coordinator takes checkpoints (and so savepoints) now.
    pub(crate) fn set_checkpointing(&self, on: bool) {
        self.checkpointing.store(on, std::sync::atomic::Ordering::SeqCst);
        if !on {
            // Nobody will take them any more.
            for s in self.savepoints.write().iter_mut().filter(|s| s.status == "PENDING") {
                s.status = "FAILED".into();
                s.failure = Some("the job stopped checkpointing before the savepoint was taken".into());
            }
        }
    }

    /// Ask the job to end now.
    pub fn cancel(&self) {
        self.cancel.stop();
    }

    /// Ask the job to stop after a final checkpoint, copied to `savepoints/<savepoint>` if
    /// given (then the job must be taking checkpoints).
    pub fn request_stop(&self, savepoint: Option<String>) -> Result<(), SavepointRefused> {
        if let Some(name) = &savepoint {
            caudal_checkpoints::CheckpointPaths::validate_savepoint_name(name)
                .map_err(|e| SavepointRefused::InvalidName(e.to_string()))?;
            if !self.checkpointing.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(SavepointRefused::Unavailable(format!(
                    "job `{}` does not take checkpoints now: it cannot stop with a savepoint",
                    self.name
                )));
            }
            *self.stop_savepoint.write() = savepoint;
        }
        self.stop.stop();
        Ok(())
    }

    /// How the job checkpoints (`None` until a coordinator runs it, or when it does not).
    pub fn checkpoint_settings(&self) -> Option<CheckpointSettings> {
        self.checkpoint_settings.read().clone()
    }

    pub(crate) fn set_checkpoint_settings(&self, settings: CheckpointSettings) {
        *self.checkpoint_settings.write() = Some(settings);
    }

    /// The savepoint a stop asked for.
    pub fn stop_savepoint(&self) -> Option<String> {
        self.stop_savepoint.read().clone()
    }
}

/// Stops a running job cleanly (as Ctrl-C does): sources end, sinks flush.
#[derive(Clone, Debug)]
pub struct StopHandle(Arc<std::sync::atomic::AtomicBool>);

impl StopHandle {
    /// Ask the job to stop.
    pub fn stop(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// A handle that sets `flag` (the job manager watches it for its cluster jobs).
    pub(crate) fn from_flag(flag: Arc<std::sync::atomic::AtomicBool>) -> Self {
        StopHandle(flag)
    }
}

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
    /// Why it failed, if it did.
    pub failure: Option<String>,
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
    stop: crate::StopHandle,
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
        stop: crate::StopHandle,
    ) -> Self {
        JobView {
            name: name.to_string(),
            plan,
            started_ms: now_ms(),
            metrics,
            status: RwLock::new(JobStatus::Created),
            failures: RwLock::new(Vec::new()),
            checkpoints: RwLock::new(Vec::new()),
            stop,
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

    /// Ask the job to stop cleanly.
    pub fn cancel(&self) {
        self.stop.stop();
    }
}

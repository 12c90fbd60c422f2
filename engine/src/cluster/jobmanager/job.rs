//! A job of the cluster: what was submitted ([`JobSpec`], persisted so a restarted job
//! manager resumes it), its plan, its view in the REST API and its run-time state.

use crate::cluster::plan::PlanDocument;
use crate::cluster::protocol::SubtaskReport;
use crate::job::{FailureRecord, JobStatus, JobView};
use crate::metrics::{MetricsRegistry, SubtaskMetrics};
use crate::{Error, Result};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// What the user submitted: enough to run the job again after a job manager restart.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct JobSpec {
    /// The job's name (from `env.execute(name)`): its id in the cluster and its checkpoint root.
    pub(crate) name: String,
    pub(crate) binary_sha256: String,
    pub(crate) args: Vec<String>,
    pub(crate) parallelism: Option<u32>,
    /// The checkpoint the first attempt restores (`chk-N` or a path under the job's root).
    pub(crate) restore: Option<String>,
    /// Checkpoints of this submission have ids from here on: a restart restores the latest
    /// of them, never one of an earlier submission.
    pub(crate) checkpoint_floor: u64,
    pub(crate) submitted_ms: i64,
    /// The final status once reached (`FINISHED`, `CANCELED`, `FAILED`).
    #[serde(default)]
    pub(crate) final_status: Option<String>,
    /// How the job ended, as the job list showed it then: a restarted job manager lists it
    /// again (and never runs it again).
    #[serde(default)]
    pub(crate) ended: Option<ClusterJobView>,
}

/// Where job specs are kept: `<data-dir>/jobs/<name>.json`.
#[derive(Debug, Clone)]
pub(crate) struct JobRecords {
    dir: PathBuf,
}

impl JobRecords {
    pub(crate) fn open(data_dir: &Path) -> Result<Self> {
        let dir = data_dir.join("jobs");
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        Ok(JobRecords { dir })
    }

    fn path(&self, name: &str) -> PathBuf {
        let clean: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
            .collect();
        self.dir.join(format!("{clean}.json"))
    }

    /// Writes `spec` atomically.
    pub(crate) fn save(&self, spec: &JobSpec) -> Result<()> {
        let path = self.path(&spec.name);
        let tmp = path.with_extension("json.tmp");
        let data = serde_json::to_vec_pretty(spec)
            .map_err(|e| Error::Cluster(format!("encoding job record: {e}")))?;
        std::fs::write(&tmp, data)
            .and_then(|_| std::fs::rename(&tmp, &path))
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))
    }

    /// Every stored spec (unreadable files are reported and skipped).
    pub(crate) fn load_all(&self) -> Vec<JobSpec> {
        let mut specs = Vec::new();
        for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.extension().is_some_and(|x| x == "json") {
                match std::fs::read(&p)
                    .map_err(|e| e.to_string())
                    .and_then(|d| serde_json::from_slice::<JobSpec>(&d).map_err(|e| e.to_string()))
                {
                    Ok(s) => specs.push(s),
                    Err(e) => tracing::warn!("caudal jobmanager: ignoring job record {}: {e}", p.display()),
                }
            }
        }
        specs.sort_by_key(|s| s.submitted_ms);
        specs
    }
}

/// Run-time state of a job, for display.
#[derive(Debug, Clone, Default)]
pub(crate) struct JobState {
    /// What the job is doing or waiting for, in words.
    pub(crate) detail: String,
    pub(crate) attempt: u32,
    pub(crate) restarts: u32,
    /// Task managers running the current attempt.
    pub(crate) task_managers: Vec<String>,
    pub(crate) last_checkpoint: Option<u64>,
    /// The savepoint a stop asked for, once written (`savepoints/<name>`) or failed.
    pub(crate) stop_savepoint: Option<Result<String, String>>,
}

/// A job of the cluster.
#[derive(Debug)]
pub(crate) struct ClusterJob {
    pub(crate) spec: Mutex<JobSpec>,
    pub(crate) doc: PlanDocument,
    pub(crate) view: Arc<JobView>,
    /// Set by `caudal cancel` (and the REST API's cancel).
    pub(crate) cancel: Arc<AtomicBool>,
    /// Set by `caudal stop`: take a final checkpoint, then end (resumable with `--restore latest`).
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) state: Mutex<JobState>,
    /// Per operator id, per subtask: the counters the executors report (the UI reads them).
    counters: Vec<Vec<Arc<SubtaskMetrics>>>,
}

impl ClusterJob {
    pub(crate) fn new(spec: JobSpec, doc: PlanDocument) -> Self {
        let cancel = Arc::new(AtomicBool::new(false));
        let plan = doc.job_plan();
        let metrics = Arc::new(MetricsRegistry::default());
        let counters = plan
            .operators
            .iter()
            .map(|o| metrics.register(o.id as u32, &o.name, o.kind, o.parallelism))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let view = Arc::new(JobView::new(
            &spec.name,
            plan,
            metrics,
            crate::StopHandle::from_flag(cancel.clone()),
            crate::StopHandle::from_flag(stop.clone()),
        ));
        ClusterJob {
            spec: Mutex::new(spec),
            doc,
            view,
            cancel,
            stop,
            state: Mutex::new(JobState::default()),
            counters,
        }
    }

    /// Copies an executor's report into the job's counters.
    pub(crate) fn record_counters(&self, subtasks: &[SubtaskReport]) {
        for c in subtasks {
            let Some(m) = self.counters.get(c.operator as usize).and_then(|o| o.get(c.subtask as usize))
            else {
                continue;
            };
            m.mirror_snapshot(&c.counters);
        }
    }

    pub(crate) fn name(&self) -> String {
        self.spec.lock().name.clone()
    }

    pub(crate) fn set_detail(&self, detail: impl Into<String>) {
        self.state.lock().detail = detail.into();
    }

    /// The view `GET /api/v1/cluster/jobs` answers.
    pub(crate) fn summary(&self) -> ClusterJobView {
        let spec = self.spec.lock().clone();
        let state = self.state.lock().clone();
        ClusterJobView {
            name: spec.name,
            status: self.view.status(),
            detail: state.detail,
            attempt: state.attempt,
            restarts: state.restarts,
            task_managers: state.task_managers,
            last_checkpoint: state.last_checkpoint,
            slots: self.doc.slots_needed(),
            binary_sha256: spec.binary_sha256,
            args: spec.args,
            submitted_ms: spec.submitted_ms,
            failures: self.view.failures(),
        }
    }
}

/// A job as `GET /api/v1/cluster/jobs` and `caudal list` show it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterJobView {
    /// The job's name.
    pub name: String,
    /// CREATED, RUNNING, FAILING, RESTARTING, FAILED, CANCELED or FINISHED.
    pub status: JobStatus,
    /// What it does or waits for, in words.
    pub detail: String,
    /// Attempts started (1 + restarts, plus one after a job manager restart).
    pub attempt: u32,
    /// Restarts after failures.
    pub restarts: u32,
    /// Task managers running it.
    pub task_managers: Vec<String>,
    /// The last completed checkpoint.
    pub last_checkpoint: Option<u64>,
    /// Slots it needs.
    pub slots: u32,
    /// Its binary.
    pub binary_sha256: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Submission time, ms since the epoch.
    pub submitted_ms: i64,
    /// Failures, oldest first, with their causes.
    pub failures: Vec<FailureRecord>,
}

/// True for the statuses a job never leaves.
pub(crate) fn is_final(status: JobStatus) -> bool {
    matches!(status, JobStatus::Finished | JobStatus::Canceled | JobStatus::Failed)
}

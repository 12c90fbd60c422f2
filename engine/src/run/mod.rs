//! The life of a job's run in this process: one home for what the embedded runner
//! ([`local`]) and a cluster executor (`crate::cluster::executor`) both do.
//!
//! ```text
//! JobParts ──► Run::prepare ──► Run::spawn ──► (the caller's loop: StopRule) ──► Run::finish
//!              validate, crash    uploader,      coordinator ticks or job          join, uploads
//!              points, compile,   task threads   manager relay                     drained, the
//!              restore, state dir                                                  first failure
//! ```
//!
//! The job manager's attempt (`crate::cluster::jobmanager::attempt`) coordinates executors
//! of other processes; it shares the [`StopRule`] and talks to the coordinator through the
//! same [`Participants`] trait the tasks of this process implement here.

mod fence;
pub(crate) mod local;

pub use fence::RunFence;

use crate::config::JobConfig;
use crate::coordinator::{Coordinator, Participants, Tick};
use crate::graph::{GraphBuilder, JobPlan};
use crate::job::JobView;
use crate::metrics::{MetricsRegistry, OperatorSnapshot};
use crate::restore::open_and_load_restore;
use crate::runtime::executor::{
    build_tasks, compile, spawn, JobControl, JobStateEnv, PhysicalTask, RestoredState, RunningTask,
};
use crate::runtime::remote::RemoteChannels;
use crate::runtime::state_dir::LocalStateDir;
use crate::runtime::task::{CheckpointAck, TaskCommand};
use crate::runtime::upload::Uploader;
use crate::types::{CheckpointBarrier, CheckpointId};
use crate::Result;
use caudal_checkpoints::{CheckpointPaths, CheckpointStore, Lineage};
use crossbeam_channel::{Receiver, Sender};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Called with the operators' counters every `progress_interval`.
pub type ProgressFn = Box<dyn Fn(&[OperatorSnapshot], Duration) + Send>;

/// What the API hands to whoever runs the job: its graph and its settings.
pub(crate) struct JobParts {
    pub(crate) graph: Rc<RefCell<GraphBuilder>>,
    pub(crate) config: JobConfig,
    pub(crate) metrics: Arc<MetricsRegistry>,
    pub(crate) control: JobControl,
    pub(crate) progress: Option<ProgressFn>,
}

/// What a finished job reports.
#[derive(Debug, Clone)]
pub struct JobResult {
    /// Every operator's final counters.
    pub operators: Vec<OperatorSnapshot>,
    /// Wall-clock duration of the run.
    pub elapsed: Duration,
    /// The last completed checkpoint (restored or taken), if checkpointing was on.
    pub last_checkpoint: Option<CheckpointId>,
    /// Every checkpoint of the run: status, duration, sizes, synchronous and upload times.
    pub checkpoints: Vec<crate::job::CheckpointStats>,
    /// The savepoint written on stop (`checkpoints.savepoint_on_stop`), as a restore path.
    pub savepoint: Option<String>,
}

impl JobResult {
    /// The final counters of the operator named `name`.
    pub fn operator(&self, name: &str) -> Option<&OperatorSnapshot> {
        self.operators.iter().find(|o| o.name == name)
    }
}

/// A run of the job's subtasks in this process, from its restore to its teardown.
pub(crate) struct Run {
    pub(crate) plan: JobPlan,
    /// Checkpoint storage, when the run checkpoints.
    pub(crate) storage: Option<(Arc<dyn CheckpointStore>, CheckpointPaths)>,
    pub(crate) restored: RestoredState,
    pub(crate) state: JobStateEnv,
    pub(crate) started: Instant,
    tasks: Vec<PhysicalTask>,
    uploader: Option<Uploader>,
    state_dir: LocalStateDir,
}

impl Run {
    /// Validates `config`, arms the crash points, compiles the graph, loads what the run
    /// restores, creates its local state directory and builds its subtasks: every subtask
    /// (embedded), or with `remote` only those of this process's slots (cluster executor).
    /// `attempt` is the run's id (the job manager's attempt; a new one when `None`).
    pub(crate) fn prepare(
        parts: &JobParts,
        config: &JobConfig,
        job_name: &str,
        attempt: Option<String>,
        queries: Arc<crate::state_query::StateQueries>,
        remote: Option<&mut RemoteChannels>,
    ) -> Result<Run> {
        config.validate()?;
        crate::crash::install(config);
        let started = Instant::now();
        let graph = parts.graph.borrow();
        let compiled = compile(&graph, config, job_name)?;
        // Embedded, the run claims its storage before it picks what to restore; an executor
        // (given the job manager's attempt) never does: the job manager claimed for the
        // attempt before it deployed it.
        let embedded = attempt.is_none();
        // Every run is one of its own, even a restore in the same process.
        let attempt = attempt.filter(|a| !a.is_empty()).unwrap_or_else(crate::operator::new_attempt_id);
        let (storage, restored) = if config.checkpoints.enabled() {
            let claim = embedded.then_some(attempt.as_str());
            let (store, paths, restored) = open_and_load_restore(&config.checkpoints, &compiled.plan, claim)?;
            (Some((store, paths)), restored)
        } else {
            (None, RestoredState::default())
        };
        let state_dir = LocalStateDir::create(config.state_dir.as_deref(), job_name)?;
        let state = JobStateEnv {
            attempt,
            config: config.state.clone(),
            dir: state_dir.path().to_path_buf(),
            paths: storage.as_ref().map_or_else(|| CheckpointPaths::under(job_name), |(_, p)| p.clone()),
            store: storage.as_ref().map(|(s, _)| s.clone()),
            queries: Some(queries),
        };
        let tasks =
            build_tasks(&graph, &compiled, config, job_name, &parts.metrics, &restored, &state, remote)?;
        Ok(Run { plan: compiled.plan, storage, restored, state, started, tasks, uploader: None, state_dir })
    }

    /// The coordinator of a run that checkpoints, reading acks from `acks`.
    pub(crate) fn coordinator(
        &self,
        config: &JobConfig,
        acks: Receiver<CheckpointAck>,
        view: Arc<JobView>,
    ) -> Result<Option<Coordinator>> {
        let Some((store, paths)) = &self.storage else { return Ok(None) };
        let lineage =
            Lineage { run: self.state.attempt.clone(), restored_from: self.restored.restore_points.clone() };
        Coordinator::new(
            store.clone(),
            paths.clone(),
            config.checkpoints.clone(),
            acks,
            self.restored.checkpoint,
            lineage,
            view,
        )
        .map(Some)
    }

    /// Starts the snapshot uploader (when the run checkpoints) and a thread per task.
    pub(crate) fn spawn(
        &mut self,
        control: &JobControl,
        acks: Option<Sender<CheckpointAck>>,
    ) -> Result<Vec<RunningTask>> {
        if let Some((store, _)) = &self.storage {
            self.uploader = Some(Uploader::start(store.clone())?);
        }
        let tasks = std::mem::take(&mut self.tasks);
        spawn(tasks, control, acks, self.uploader.as_ref().and_then(Uploader::queue))
    }

    /// Ends the run: a failed or cancelled one gives its tasks a moment to notice and never
    /// waits for ever; otherwise every task is joined and every upload drained. Returns the
    /// first failure; the local state directory is removed either way.
    pub(crate) fn finish(self, handles: Vec<RunningTask>, control: &JobControl) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(2);
        while handles.iter().any(|h| !h.thread.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Some(e) = control.failure.lock().take() {
            return Err(e);
        }
        for h in handles {
            let _ = h.thread.join();
        }
        if let Some(u) = self.uploader {
            u.finish();
        }
        drop(self.state_dir);
        match control.failure.lock().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The one stop rule of every run, embedded or in a cluster: a stop request or the end of
/// every source's input first takes a final checkpoint, and only once it completed do the
/// sources stop (their sinks then close); without checkpoints they stop at once. A final
/// checkpoint that is overdue, or checkpoints failing beyond what the job tolerates, fail
/// the run (the coordinator's error).
pub(crate) struct StopRule {
    stop_sent: bool,
}

impl StopRule {
    pub(crate) fn new() -> Self {
        StopRule { stop_sent: false }
    }

    /// One tick: drives the coordinator (if any) and answers true exactly once, in the tick
    /// the sources are to stop.
    pub(crate) fn tick(
        &mut self,
        coordinator: Option<&mut Coordinator>,
        participants: &dyn Participants,
        view: &Arc<JobView>,
        stopping: bool,
    ) -> Result<bool> {
        let stop_now = match coordinator {
            Some(c) => c.tick(participants, view, stopping)? == Tick::StopSources,
            None => stopping,
        };
        let first = stop_now && !self.stop_sent;
        self.stop_sent |= stop_now;
        Ok(first)
    }
}

/// Calls the job's progress function every `progress_interval`.
pub(crate) struct ProgressTicker {
    last: Instant,
}

impl ProgressTicker {
    pub(crate) fn new() -> Self {
        ProgressTicker { last: Instant::now() }
    }

    pub(crate) fn tick(&mut self, parts: &JobParts, every: Option<Duration>, started: Instant) {
        if let (Some(every), Some(f)) = (every, &parts.progress) {
            if self.last.elapsed() >= every {
                self.last = Instant::now();
                f(&parts.metrics.snapshot(), started.elapsed());
            }
        }
    }
}

/// The tasks of this process take part in its checkpoints directly.
impl Participants for Vec<RunningTask> {
    fn trigger(&self, barrier: CheckpointBarrier) {
        for t in self.iter().filter(|t| t.is_source) {
            let _ = t.commands.send(TaskCommand::TriggerCheckpoint(barrier));
        }
    }

    fn complete(&self, id: CheckpointId) {
        for t in self {
            let _ = t.commands.send(TaskCommand::CheckpointComplete(id));
        }
    }

    fn any_finished(&self) -> bool {
        self.iter().any(|t| t.thread.is_finished())
    }
}

//! `StreamEnv`: where a job starts; builds the graph and executes it.

use super::stream::{DataStream, Graph};
use crate::config::JobConfig;
use crate::coordinator::{Coordinator, Tick};
use crate::graph::{JobPlan, NodeKind, SourceSetup};
use crate::job::{JobStatus, JobView};
use crate::metrics::{MetricsRegistry, OperatorSnapshot};
use crate::restore::open_and_load_restore;
use crate::runtime::chain::Fanout;
use crate::runtime::executor::{build_tasks, compile, spawn, JobControl, JobStateEnv, RestoredState};
use crate::runtime::state_dir::LocalStateDir;
use crate::runtime::task::{SourceRunner, SourceTaskSettings};
use crate::runtime::upload::Uploader;
use crate::source::{Source, SourceContext, SourceOutput, SourcePoll, SourceReader, WatermarkStrategy};
use crate::types::Data;
use crate::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Called with the operators' counters every `progress_interval`.
pub type ProgressFn = Box<dyn Fn(&[OperatorSnapshot], Duration) + Send>;

/// The entry point of a job: sources start here, `execute` runs the graph.
///
/// # Examples
/// ```
/// use caudal::{StreamEnv, testing::CollectSink};
/// let env = StreamEnv::new();
/// let (sink, results) = CollectSink::new();
/// env.from_iter("numbers", 1..=10_i64)
///     .map(|n| n * n)
///     .filter(|n| n % 2 == 0)
///     .sink("collect", move |_| Ok(sink.clone()));
/// env.execute("squares").unwrap();
/// let mut got = results.lock().clone();
/// got.sort();
/// assert_eq!(got, vec![4, 16, 36, 64, 100]);
/// ```
pub struct StreamEnv {
    // pub(crate): cluster mode's executor (crate::cluster::executor) runs the same graph.
    pub(crate) graph: Graph,
    pub(crate) config: JobConfig,
    pub(crate) metrics: Arc<MetricsRegistry>,
    pub(crate) control: JobControl,
    pub(crate) progress: Option<ProgressFn>,
}

impl std::fmt::Debug for StreamEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamEnv").field("config", &self.config).finish()
    }
}

impl Default for StreamEnv {
    fn default() -> Self {
        Self::new()
    }
}

/// Stops a running job cleanly (as Ctrl-C does): sources end, sinks flush.
#[derive(Clone, Debug)]
pub struct StopHandle(Arc<std::sync::atomic::AtomicBool>);

impl StopHandle {
    /// Ask the job to stop.
    pub fn stop(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// A handle that sets `flag` (the job manager watches it for its cluster jobs).
    pub(crate) fn from_flag(flag: Arc<std::sync::atomic::AtomicBool>) -> Self {
        StopHandle(flag)
    }
}

/// What a finished job reports.
#[derive(Debug, Clone)]
pub struct JobResult {
    /// Every operator's final counters.
    pub operators: Vec<OperatorSnapshot>,
    /// Wall-clock duration of the run.
    pub elapsed: Duration,
    /// The last completed checkpoint (restored or taken), if checkpointing was on.
    pub last_checkpoint: Option<crate::types::CheckpointId>,
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

impl StreamEnv {
    /// An environment with the default configuration (and `CAUDAL__*` overrides ignored).
    pub fn new() -> Self {
        Self::with_config(JobConfig::default())
    }

    /// An environment with `config`.
    pub fn with_config(config: JobConfig) -> Self {
        StreamEnv {
            graph: Graph::default(),
            config,
            metrics: Arc::new(MetricsRegistry::default()),
            control: JobControl::default(),
            progress: None,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &JobConfig {
        &self.config
    }

    /// The job's counters, readable while it runs.
    pub fn metrics(&self) -> Arc<MetricsRegistry> {
        self.metrics.clone()
    }

    /// A handle that stops the job cleanly from another thread.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle(self.control.stop_requested.clone())
    }

    /// Call `f` with the counters every `config.progress_interval`.
    pub fn on_progress(&mut self, f: impl Fn(&[OperatorSnapshot], Duration) + Send + 'static) {
        self.progress = Some(Box::new(f));
    }

    /// Add a source with a watermark strategy.
    pub fn source<S: Source>(
        &self,
        name: &str,
        source: S,
        watermarks: WatermarkStrategy<S::Out>,
    ) -> DataStream<S::Out> {
        let source = Arc::new(source);
        let node = self.graph.borrow_mut().add(
            name,
            NodeKind::Source(Box::new(move |ctx: SourceContext, setup: SourceSetup, targets| {
                let reader = source.create_reader(&ctx, &setup.restored)?;
                let settings = SourceTaskSettings {
                    uid: setup.uid,
                    timestamp: watermarks.timestamp.clone(),
                    out_of_orderness: watermarks.out_of_orderness,
                    idle_timeout: watermarks.idle_timeout,
                    batch_size: setup.batch_size,
                    linger: setup.linger,
                    metrics: setup.metrics,
                    checkpointing: setup.checkpointing,
                    latency_marker_interval: setup.latency_marker_interval,
                };
                Ok(Box::new(SourceRunner::new(reader, settings, Fanout::new(targets)))
                    as Box<dyn crate::runtime::task::SourceTask>)
            })),
            Vec::new(),
        );
        DataStream::new(self.graph.clone(), node)
    }

    /// A bounded source over a collection, read by one subtask, without event time.
    pub fn from_iter<T, I>(&self, name: &str, items: I) -> DataStream<T>
    where
        T: Data + Sync,
        I: IntoIterator<Item = T>,
    {
        let items: Vec<T> = items.into_iter().collect();
        self.source(name, IterSource { items: Arc::new(items) }, WatermarkStrategy::none()).parallelism(1)
    }

    /// The plan: operators, parallelism, chaining and edges.
    pub fn plan(&self, job_name: &str) -> Result<JobPlan> {
        self.config.validate()?;
        Ok(compile(&self.graph.borrow(), &self.config, job_name)?.plan)
    }

    /// Run the job until its bounded input ends, it is stopped, or a task fails.
    ///
    /// With checkpointing on (`config.checkpoints.interval`), a stop (Ctrl-C, SIGTERM,
    /// [`StopHandle::stop`]) first takes a final checkpoint, so that what the sinks
    /// published is exactly what a restore continues from.
    ///
    /// Under a cluster (see [`crate::cluster`]) the same call answers the job manager
    /// instead: with `--caudal-plan` / `CAUDAL__PRINT_PLAN=1` it prints the plan as JSON and
    /// exits; with `CAUDAL__EXECUTOR` set it runs the subtasks the job manager deploys.
    pub fn execute(self, job_name: &str) -> Result<JobResult> {
        match crate::cluster::role::ClusterRole::from_env()? {
            crate::cluster::role::ClusterRole::Embedded => {}
            crate::cluster::role::ClusterRole::PrintPlan { parallelism } => {
                let mut config = self.config.clone();
                if let Some(p) = parallelism {
                    config.parallelism = p;
                }
                config.validate()?;
                let plan = compile(&self.graph.borrow(), &config, job_name)?.plan;
                println!("{}", crate::cluster::plan::document(&plan, &config)?);
                std::process::exit(0);
            }
            crate::cluster::role::ClusterRole::Executor(settings) => {
                return crate::cluster::executor::run(self, job_name, settings);
            }
        }
        self.config.validate()?;
        crate::crash::install(&self.config);
        let started = Instant::now();
        let graph = self.graph.borrow();
        let compiled = compile(&graph, &self.config, job_name)?;
        let checkpointing = self.config.checkpoints.enabled();
        let (coordinator_parts, restored) = if checkpointing {
            let (store, paths, restored) = open_and_load_restore(&self.config.checkpoints, &compiled.plan)?;
            if let Some(name) = &self.config.checkpoints.savepoint_on_stop {
                paths.savepoint_dir(name).map_err(|e| Error::config("savepoint_on_stop", e.to_string()))?;
            }
            (Some((store, paths)), restored)
        } else {
            (None, RestoredState::default())
        };
        let state_dir = LocalStateDir::create(self.config.state_dir.as_deref(), job_name)?;
        let state = JobStateEnv {
            // Every call is a run of its own, even a restore in the same process.
            attempt: crate::operator::new_attempt_id(),
            config: self.config.state.clone(),
            dir: state_dir.path().to_path_buf(),
            paths: coordinator_parts
                .as_ref()
                .map_or_else(|| caudal_checkpoints::CheckpointPaths::under(job_name), |(_, p)| p.clone()),
            store: coordinator_parts.as_ref().map(|(s, _)| s.clone()),
            queries: Some(Arc::new(crate::state_query::StateQueries::new())),
        };
        let tasks = build_tasks(&graph, &compiled, &self.config, job_name, &self.metrics, &restored, &state)?;
        drop(graph);
        let stop_requested = self.control.stop_requested.clone();
        if self.config.handle_signals {
            for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                // A second signal exits at once; the first asks for a clean stop.
                signal_hook::flag::register_conditional_shutdown(sig, 130, stop_requested.clone())
                    .map_err(|e| Error::io("installing the signal handler", e))?;
                signal_hook::flag::register(sig, stop_requested.clone())
                    .map_err(|e| Error::io("installing the signal handler", e))?;
            }
        }
        let mut view = JobView::new(
            job_name,
            compiled.plan.clone(),
            self.metrics.clone(),
            self.stop_handle(),
            self.stop_handle(),
        );
        if let Some(queries) = &state.queries {
            view.state_queries = queries.clone();
        }
        let view = Arc::new(view);
        view.set_status(JobStatus::Running);
        let (ack_tx, ack_rx) = crossbeam_channel::unbounded();
        let mut coordinator = match coordinator_parts {
            Some((store, paths)) => Some(Coordinator::new(
                store,
                paths,
                self.config.checkpoints.clone(),
                ack_rx,
                restored.checkpoint,
                caudal_checkpoints::Lineage {
                    run: state.attempt.clone(),
                    restored_from: restored.restore_points.clone(),
                },
                view.clone(),
            )?),
            None => None,
        };
        // The REST API and web UI, for as long as this call runs (dropped on return); after
        // the coordinator, so that a savepoint can be asked for from the first request on.
        let _web = match self.config.web_bind {
            Some(addr) => {
                let server =
                    crate::web::WebServer::start_for_job(addr, view.clone(), &self.config.web_allowed_hosts);
                Some(server.inspect_err(|_| view.set_status(JobStatus::Failed))?)
            }
            None => None,
        };
        let uploader = match &coordinator_parts_store(&state, coordinator.is_some()) {
            Some(store) => Some(Uploader::start(store.clone())?),
            None => None,
        };
        let handles = spawn(
            tasks,
            &self.control,
            coordinator.as_ref().map(|_| ack_tx),
            uploader.as_ref().and_then(Uploader::queue),
        )?;
        let mut last_progress = Instant::now();
        let sources = handles.iter().filter(|h| h.is_source).count();
        while handles.iter().any(|h| !h.thread.is_finished()) {
            std::thread::sleep(Duration::from_millis(10));
            // A stop, or every source at the end of its input: final checkpoint, then end.
            let at_end = self.control.sources_at_end.load(Ordering::SeqCst) >= sources;
            let stopping = stop_requested.load(Ordering::SeqCst) || at_end;
            match coordinator.as_mut() {
                Some(c) if !self.control.cancel.load(Ordering::SeqCst) => {
                    // Sources stop after the final checkpoint; a job whose checkpoints fail
                    // beyond what it tolerates, or whose final one is overdue, fails instead.
                    match c.tick(&handles, &view, stopping) {
                        Ok(Tick::StopSources) => self.control.stop.store(true, Ordering::SeqCst),
                        Ok(Tick::Continue) => {}
                        Err(e) => self.control.fail(e),
                    }
                }
                _ if stopping => self.control.stop.store(true, Ordering::SeqCst),
                _ => {}
            }
            if let (Some(every), Some(f)) = (self.config.progress_interval, &self.progress) {
                if last_progress.elapsed() >= every {
                    last_progress = Instant::now();
                    f(&self.metrics.snapshot(), started.elapsed());
                }
            }
        }
        for h in handles {
            let _ = h.thread.join();
        }
        if let Some(u) = uploader {
            u.finish();
        }
        drop(state_dir);
        if let Some(e) = self.control.failure.lock().take() {
            view.record_failure(e.to_string());
            view.set_status(JobStatus::Failed);
            return Err(e);
        }
        let stopped = stop_requested.load(Ordering::SeqCst);
        let asked = self.config.checkpoints.savepoint_on_stop.clone().or_else(|| view.stop_savepoint());
        let savepoint = match (asked, &coordinator) {
            (Some(name), Some(c)) if stopped => Some(c.savepoint_of_final_checkpoint(&name)?),
            _ => None,
        };
        view.set_status(if stopped { JobStatus::Canceled } else { JobStatus::Finished });
        Ok(JobResult {
            operators: self.metrics.snapshot(),
            elapsed: started.elapsed(),
            last_checkpoint: coordinator.and_then(|c| c.last_completed),
            checkpoints: view.checkpoints(),
            savepoint,
        })
    }
}

/// The store uploads go to, when the job checkpoints.
fn coordinator_parts_store(
    state: &JobStateEnv,
    checkpointing: bool,
) -> Option<Arc<dyn caudal_checkpoints::CheckpointStore>> {
    state.store.clone().filter(|_| checkpointing)
}

struct IterSource<T> {
    items: Arc<Vec<T>>,
}

impl<T: Data + Sync> Source for IterSource<T> {
    type Out = T;

    fn create_reader(&self, _ctx: &SourceContext, restored: &[Vec<u8>]) -> Result<Box<dyn SourceReader<T>>> {
        let next = match restored.first() {
            Some(p) if p.len() == 8 => {
                u64::from_le_bytes([p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]]) as usize
            }
            _ => 0,
        };
        Ok(Box::new(IterReader { items: self.items.clone(), next }))
    }
}

struct IterReader<T> {
    items: Arc<Vec<T>>,
    next: usize,
}

impl<T: Data + Sync> SourceReader<T> for IterReader<T> {
    fn splits(&self) -> usize {
        1
    }

    fn poll(&mut self, out: &mut SourceOutput<'_, T>) -> Result<SourcePoll> {
        let n = out.capacity_left().min(self.items.len() - self.next);
        for item in &self.items[self.next..self.next + n] {
            out.collect(0, item.clone());
        }
        self.next += n;
        Ok(if self.next >= self.items.len() { SourcePoll::Finished } else { SourcePoll::Ready })
    }

    fn position(&mut self) -> Result<Vec<u8>> {
        Ok((self.next as u64).to_le_bytes().to_vec())
    }
}

//! `StreamEnv`: where a job starts; builds the graph and executes it.

use super::stream::{DataStream, Graph};
use crate::config::JobConfig;
use crate::graph::{JobPlan, NodeKind, SourceSetup};
use crate::job::StopHandle;
use crate::metrics::{MetricsRegistry, OperatorSnapshot};
use crate::run::{JobParts, JobResult, ProgressFn};
use crate::runtime::chain::Fanout;
use crate::runtime::executor::{compile, JobControl};
use crate::runtime::task::{SourceRunner, SourceTaskSettings};
use crate::source::{Source, SourceContext, SourceOutput, SourcePoll, SourceReader, WatermarkStrategy};
use crate::types::Data;
use crate::Result;
use std::sync::Arc;
use std::time::Duration;

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
    graph: Graph,
    config: JobConfig,
    metrics: Arc<MetricsRegistry>,
    control: JobControl,
    progress: Option<ProgressFn>,
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

impl StreamEnv {
    /// An environment with the default configuration (and `CAUDAL__*` overrides ignored).
    pub fn new() -> Self {
        Self::with_config(JobConfig::default())
    }

    /// An environment with `config`.
    pub fn with_config(config: JobConfig) -> Self {
        crate::logging::init();
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
        StopHandle::from_flag(self.control.stop_requested.clone())
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

    /// A bounded source over a collection, read by one subtask, with event time and
    /// watermarks from `watermarks` (tests and examples of event-time logic).
    pub fn from_iter_with<T, I>(
        &self,
        name: &str,
        items: I,
        watermarks: WatermarkStrategy<T>,
    ) -> DataStream<T>
    where
        T: Data + Sync,
        I: IntoIterator<Item = T>,
    {
        let items: Vec<T> = items.into_iter().collect();
        self.source(name, IterSource { items: Arc::new(items) }, watermarks).parallelism(1)
    }

    /// The plan: operators, parallelism, chaining and edges.
    pub fn plan(&self, job_name: &str) -> Result<JobPlan> {
        self.config.validate()?;
        Ok(compile(&self.graph.borrow(), &self.config, job_name)?.plan)
    }

    /// Whether every subtask of the job runs in this process, as in the embedded default:
    /// state shared by operators through memory (an `Arc`) reaches all of them. `false` in
    /// a cluster executor, which runs the subtasks the job manager gives it, beside others
    /// in other processes.
    pub fn runs_in_one_process(&self) -> bool {
        !matches!(
            crate::cluster::role::ClusterRole::from_env(),
            Ok(crate::cluster::role::ClusterRole::Executor(_))
        )
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
                return crate::cluster::executor::run(self.into_parts(), job_name, *settings);
            }
        }
        crate::run::local::execute(self.into_parts(), job_name)
    }

    /// The graph and settings, for whoever runs the job.
    fn into_parts(self) -> JobParts {
        JobParts {
            graph: self.graph,
            config: self.config,
            metrics: self.metrics,
            control: self.control,
            progress: self.progress,
        }
    }
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

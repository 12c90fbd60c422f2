//! Compiles the logical graph into tasks (chaining, channels) and runs them, a thread each.

use super::chain::ChainNode;
use super::exchange::ChannelMessage;
use super::task::{InputGate, SourceTask, TaskCommand, TaskEnv};
use crate::config::JobConfig;
use crate::error::TaskLocation;
use crate::graph::{
    EdgeKind, GraphBuilder, JobPlan, NodeId, NodeKind, PartitionMode, PlanEdge, PlanNode, SourceSetup,
};
use crate::keygroup::key_group_range;
use crate::metrics::{MetricsRegistry, SubtaskMetrics};
use crate::operator::OperatorContext;
use crate::source::SourceContext;
use crate::state::{KeyedState, RestoreSource, StateSetup};
use crate::types::MIN_WATERMARK;
use crate::{Error, Result};
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The graph with parallelism and chaining decided.
pub(crate) struct Compiled {
    pub(crate) plan: JobPlan,
    parallelism: Vec<u32>,
    /// Per node: (consumer, input index).
    outputs: Vec<Vec<(NodeId, usize)>>,
    /// Per node and input: chained?
    chained: Vec<Vec<bool>>,
    heads: Vec<NodeId>,
}

pub(crate) fn compile(graph: &GraphBuilder, config: &JobConfig, job: &str) -> Result<Compiled> {
    graph.check()?;
    let n = graph.nodes.len();
    if n == 0 {
        return Err(Error::Graph("the job has no operators: add a source and a sink".into()));
    }
    let mut parallelism = Vec::with_capacity(n);
    for node in &graph.nodes {
        let p = node.parallelism.unwrap_or(config.parallelism);
        if p == 0 {
            return Err(Error::config(format!("{}.parallelism", node.name), "must be at least 1"));
        }
        if p > config.max_parallelism {
            return Err(Error::config(
                format!("{}.parallelism", node.name),
                format!("{p} exceeds max_parallelism {}", config.max_parallelism),
            ));
        }
        parallelism.push(p);
    }
    let mut outputs = vec![Vec::new(); n];
    let mut chained = Vec::with_capacity(n);
    for (v, node) in graph.nodes.iter().enumerate() {
        let mut c = Vec::new();
        for (k, e) in node.inputs.iter().enumerate() {
            outputs[e.from].push((v, k));
            c.push(
                node.inputs.len() == 1
                    && e.kind == EdgeKind::Forward
                    && parallelism[e.from] == parallelism[v],
            );
        }
        chained.push(c);
    }
    let mut has_consumer = vec![false; n];
    for outs in &outputs {
        for (v, _) in outs {
            has_consumer[*v] = true;
        }
    }
    for (i, node) in graph.nodes.iter().enumerate() {
        if !matches!(node.kind, NodeKind::Sink(_)) && outputs[i].is_empty() {
            return Err(Error::Graph(format!("operator `{}` has no consumer: add a sink", node.name)));
        }
    }
    let heads: Vec<NodeId> = (0..n).filter(|&v| !(chained[v].len() == 1 && chained[v][0])).collect();
    let mut task_of = vec![0; n];
    for v in 0..n {
        task_of[v] =
            if chained[v].len() == 1 && chained[v][0] { task_of[graph.nodes[v].inputs[0].from] } else { v };
    }
    let uids = crate::graph::operator_uids(&graph.nodes)?;
    let plan = JobPlan {
        job: job.to_string(),
        max_parallelism: config.max_parallelism,
        operators: graph
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| PlanNode {
                id: i,
                name: node.name.clone(),
                kind: node.kind.label(),
                parallelism: parallelism[i],
                task: task_of[i],
                uid: uids[i].clone(),
            })
            .collect(),
        edges: graph
            .nodes
            .iter()
            .enumerate()
            .flat_map(|(v, node)| {
                let chained = &chained;
                node.inputs.iter().enumerate().map(move |(k, e)| PlanEdge {
                    from: e.from,
                    to: v,
                    partitioning: e.kind,
                    chained: chained[v][k],
                })
            })
            .collect(),
    };
    Ok(Compiled { plan, parallelism, outputs, chained, heads })
}

fn mode(kind: EdgeKind, p_from: u32, p_to: u32) -> PartitionMode {
    match kind {
        EdgeKind::Hash => PartitionMode::Hash,
        EdgeKind::Broadcast => PartitionMode::Broadcast,
        EdgeKind::Forward if p_from == p_to => PartitionMode::Forward,
        _ => PartitionMode::Rebalance,
    }
}

/// A task ready to run on its own thread.
pub(crate) enum Runnable {
    Source(Box<dyn SourceTask>),
    Gate(InputGate, Box<dyn ChainNode>),
}

pub(crate) struct PhysicalTask {
    pub(crate) name: String,
    pub(crate) subtask: u32,
    pub(crate) runnable: Runnable,
    pub(crate) commands: Sender<TaskCommand>,
    pub(crate) command_rx: Receiver<TaskCommand>,
}

/// The state a job restores from: per operator uid, the snapshots of all its old subtasks.
#[derive(Debug, Default)]
pub(crate) struct RestoredState {
    pub(crate) checkpoint: Option<caudal_checkpoints::CheckpointId>,
    pub(crate) operators: HashMap<String, Vec<Vec<u8>>>,
    /// Keyed-state handles of every old subtask, per operator uid.
    pub(crate) keyed: HashMap<String, Vec<caudal_checkpoints::StateHandle>>,
    /// Restoring from a savepoint (its files are not reused by new checkpoints).
    pub(crate) from_savepoint: bool,
    /// The restore points of the checkpoints this run takes (its lineage).
    pub(crate) restore_points: Vec<caudal_checkpoints::CheckpointRef>,
    /// Per operator uid, its snapshots in checkpoints later runs took on from the restored
    /// one ([`crate::OperatorContext::later_snapshots`]).
    pub(crate) later: HashMap<String, Vec<crate::LaterSnapshot>>,
}

/// What the executor needs to give keyed operators their state backends, and every
/// operator this run's attempt id.
pub(crate) struct JobStateEnv {
    /// This run of the job ([`crate::OperatorContext::attempt`]): a new id per `execute`
    /// in embedded mode, the job manager's attempt in a cluster (shared by its executors).
    pub(crate) attempt: String,
    pub(crate) config: caudal_checkpoints::StateBackendConfig,
    /// The job's local state directory: `<dir>/<operator uid>/<subtask>` per backend.
    pub(crate) dir: std::path::PathBuf,
    /// Object names of the job's checkpoints.
    pub(crate) paths: caudal_checkpoints::CheckpointPaths,
    /// Checkpoint storage (when checkpointing or restoring).
    pub(crate) store: Option<Arc<dyn caudal_checkpoints::CheckpointStore>>,
    /// Where keyed operator subtasks register their state-browser mailboxes (embedded mode).
    pub(crate) queries: Option<Arc<crate::state_query::StateQueries>>,
}

/// Builds the subtasks on the calling thread (factories are not `Send`): every subtask of
/// every task, or with `remote` (cluster mode) only those of this process's slots, the
/// channels that cross processes handed to `remote` (bridged by `cluster::shuffle`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn build_tasks(
    graph: &GraphBuilder,
    compiled: &Compiled,
    config: &JobConfig,
    job: &str,
    metrics: &MetricsRegistry,
    restored: &RestoredState,
    state: &JobStateEnv,
    mut remote: Option<&mut super::remote::RemoteChannels>,
) -> Result<Vec<PhysicalTask>> {
    let p = &compiled.parallelism;
    let node_metrics: Vec<Vec<Arc<SubtaskMetrics>>> = graph
        .nodes
        .iter()
        .enumerate()
        .map(|(i, node)| metrics.register(i as u32, &node.name, node.kind.label(), p[i]))
        .collect();
    let capacity = (config.channel_capacity / config.batch_size).max(1);
    // senders[(v, k)][i] = senders of upstream subtask i; receivers[v][j] = inputs of subtask j.
    let mut senders: HashMap<(NodeId, usize), Vec<Vec<Sender<ChannelMessage>>>> = HashMap::new();
    let mut receivers: Vec<Vec<Vec<Receiver<ChannelMessage>>>> =
        (0..graph.nodes.len()).map(|v| (0..p[v]).map(|_| Vec::new()).collect()).collect();
    for (v, node) in graph.nodes.iter().enumerate() {
        for (k, e) in node.inputs.iter().enumerate() {
            if compiled.chained[v][k] {
                continue;
            }
            let (pu, pv) = (p[e.from], p[v]);
            let m = mode(e.kind, pu, pv);
            let mut per_upstream = Vec::with_capacity(pu as usize);
            for i in 0..pu {
                let mut out = Vec::new();
                let targets: Vec<u32> = if m == PartitionMode::Forward { vec![i] } else { (0..pv).collect() };
                for j in targets {
                    let (tx, rx) = bounded(capacity);
                    if let Some(r) = remote.as_deref_mut() {
                        r.register(
                            super::remote::ChannelKey::new(v, k, i, j),
                            (&tx, &rx),
                            e.codec,
                            &node_metrics[e.from][i as usize],
                            &node_metrics[v][j as usize],
                        );
                    }
                    out.push(tx);
                    receivers[v][j as usize].push(rx);
                }
                per_upstream.push(out);
            }
            senders.insert((v, k), per_upstream);
        }
    }

    let builder = ChainBuilder {
        graph,
        compiled,
        config,
        job,
        node_metrics: &node_metrics,
        senders: &senders,
        restored,
        state,
        wake: std::cell::RefCell::new(None),
    };
    let mut tasks = Vec::new();
    for &h in &compiled.heads {
        for i in 0..p[h] {
            if remote.as_deref().is_some_and(|r| !r.is_local(i)) {
                continue; // another process runs this subtask
            }
            let name = graph.nodes[h].name.clone();
            let (commands, command_rx) = unbounded();
            *builder.wake.borrow_mut() = Some(commands.clone());
            let runnable = match &graph.nodes[h].kind {
                NodeKind::Source(factory) => {
                    let targets = builder.targets(h, i)?;
                    let ctx = SourceContext {
                        job_name: job.to_string(),
                        operator_name: name.clone(),
                        subtask: i,
                        parallelism: p[h],
                        metrics: node_metrics[h][i as usize].clone(),
                    };
                    let uid = compiled.plan.operators[h].uid.clone();
                    let setup = SourceSetup {
                        restored: restored.operators.get(&uid).cloned().unwrap_or_default(),
                        uid,
                        metrics: node_metrics[h][i as usize].clone(),
                        batch_size: config.batch_size,
                        linger: config.linger,
                        checkpointing: config.checkpoints.enabled(),
                        latency_marker_interval: config.latency_marker_interval,
                    };
                    Runnable::Source(factory(ctx, setup, targets)?)
                }
                _ => {
                    let head = builder.build(h, i)?;
                    let gate = InputGate::new(std::mem::take(&mut receivers[h][i as usize]));
                    Runnable::Gate(gate, head)
                }
            };
            tasks.push(PhysicalTask { name, subtask: i, runnable, commands, command_rx });
        }
    }
    Ok(tasks)
}

struct ChainBuilder<'a> {
    graph: &'a GraphBuilder,
    compiled: &'a Compiled,
    config: &'a JobConfig,
    job: &'a str,
    node_metrics: &'a [Vec<Arc<SubtaskMetrics>>],
    senders: &'a HashMap<(NodeId, usize), Vec<Vec<Sender<ChannelMessage>>>>,
    restored: &'a RestoredState,
    state: &'a JobStateEnv,
    /// The command channel of the task being built (wakes it for state queries).
    wake: std::cell::RefCell<Option<Sender<TaskCommand>>>,
}

impl ChainBuilder<'_> {
    /// The keyed state of subtask `i` of node `n`, if its input is keyed (`key_by`).
    fn keyed_state(&self, n: NodeId, i: u32, range: &std::ops::Range<u16>) -> Result<Option<KeyedState>> {
        let node = &self.graph.nodes[n];
        // Keyed: every input is partitioned by key (`key_by`, both sides of a keyed
        // `connect`), or broadcast to every subtask besides a keyed one.
        let keyed = matches!(node.kind, NodeKind::Operator(_))
            && node.inputs.iter().any(|e| e.kind == EdgeKind::Hash)
            && node.inputs.iter().all(|e| matches!(e.kind, EdgeKind::Hash | EdgeKind::Broadcast));
        if !keyed {
            return Ok(None);
        }
        let uid = &self.compiled.plan.operators[n].uid;
        let operator = caudal_checkpoints::OperatorId::new(uid.clone())
            .map_err(|e| Error::config(format!("{}.name", node.name), e.to_string()))?;
        let range = caudal_checkpoints::KeyGroupRange::new(range.start, range.end);
        let restore = match (self.restored.keyed.get(uid), &self.state.store, self.restored.checkpoint) {
            (Some(handles), Some(store), Some(checkpoint)) => Some(RestoreSource {
                checkpoint,
                handles: caudal_checkpoints::handles_for_range(handles, range),
                store: store.clone(),
                from_savepoint: self.restored.from_savepoint,
            }),
            _ => None,
        };
        let setup = StateSetup {
            config: self.state.config.clone(),
            dir: self.state.dir.join(uid).join(i.to_string()),
            operator,
            range,
            restore,
        };
        Ok(Some(KeyedState::new(setup, self.state.paths.clone(), i)))
    }

    fn targets(&self, n: NodeId, i: u32) -> Result<Vec<Box<dyn ChainNode>>> {
        let mut targets = Vec::new();
        for &(v, k) in &self.compiled.outputs[n] {
            if self.compiled.chained[v][k] {
                targets.push(self.build(v, i)?);
            } else {
                let e = &self.graph.nodes[v].inputs[k];
                let m = mode(e.kind, self.compiled.parallelism[n], self.compiled.parallelism[v]);
                let senders =
                    self.senders.get(&(v, k)).and_then(|s| s.get(i as usize)).cloned().unwrap_or_default();
                targets.push((e.make_output)(
                    m,
                    senders,
                    self.config.batch_size,
                    self.config.max_parallelism,
                    self.node_metrics[n][i as usize].clone(),
                ));
            }
        }
        Ok(targets)
    }

    fn build(&self, n: NodeId, i: u32) -> Result<Box<dyn ChainNode>> {
        let node = &self.graph.nodes[n];
        let p = self.compiled.parallelism[n];
        let key_groups = key_group_range(i, self.config.max_parallelism, p);
        let keyed = self.keyed_state(n, i, &key_groups)?;
        let state_queries = match (&keyed, &self.state.queries, self.wake.borrow().as_ref()) {
            (Some(_), Some(queries), Some(wake)) => {
                Some(queries.register(n as u32, i, key_groups.clone(), wake.clone()))
            }
            _ => None,
        };
        let ctx = OperatorContext {
            job_name: self.job.to_string(),
            operator_name: node.name.clone(),
            subtask: i,
            parallelism: p,
            max_parallelism: self.config.max_parallelism,
            key_groups,
            watermark: MIN_WATERMARK,
            metrics: self.node_metrics[n][i as usize].clone(),
            operator_uid: self.compiled.plan.operators[n].uid.clone(),
            checkpointing: self.config.checkpoints.enabled(),
            checkpoint_timing: self.config.checkpoints.interval.map(|i| (i, self.config.checkpoints.timeout)),
            restored_checkpoint: self.restored.checkpoint,
            attempt: self.state.attempt.clone(),
            restored: self.restored.operators.get(&self.compiled.plan.operators[n].uid).cloned(),
            later_snapshots: self
                .restored
                .later
                .get(&self.compiled.plan.operators[n].uid)
                .cloned()
                .unwrap_or_default(),
            fence: self.state.store.as_ref().map(|store| {
                crate::RunFence::new(store.clone(), self.state.paths.clone(), &self.state.attempt)
            }),
            keyed,
            state_queries,
        };
        let targets = self.targets(n, i)?;
        match &node.kind {
            NodeKind::Operator(f) | NodeKind::Sink(f) => f(ctx, targets),
            NodeKind::Source(_) => Err(Error::Graph(format!("source `{}` cannot have an input", node.name))),
        }
    }
}

/// The first failure of a job, and the flags every task watches.
#[derive(Clone, Default)]
pub(crate) struct JobControl {
    /// Set by Ctrl-C / SIGTERM / `StopHandle`: the job should stop (after a final checkpoint).
    pub(crate) stop_requested: Arc<AtomicBool>,
    /// Set by the job: sources end their streams now.
    pub(crate) stop: Arc<AtomicBool>,
    /// Source subtasks waiting at the end of their input for the final checkpoint.
    pub(crate) sources_at_end: Arc<std::sync::atomic::AtomicUsize>,
    pub(crate) cancel: Arc<AtomicBool>,
    pub(crate) failure: Arc<Mutex<Option<Error>>>,
}

impl JobControl {
    pub(crate) fn fail(&self, e: Error) {
        let mut f = self.failure.lock();
        if f.is_none() {
            *f = Some(e);
        }
        self.cancel.store(true, Ordering::SeqCst);
    }
}

/// A running task: its thread and its command channel.
pub(crate) struct RunningTask {
    pub(crate) is_source: bool,
    pub(crate) commands: Sender<TaskCommand>,
    pub(crate) thread: std::thread::JoinHandle<()>,
}

/// Spawns the tasks, a thread each.
pub(crate) fn spawn(
    tasks: Vec<PhysicalTask>,
    control: &JobControl,
    acks: Option<Sender<super::task::CheckpointAck>>,
    uploads: Option<super::upload::UploadQueue>,
) -> Result<Vec<RunningTask>> {
    let mut handles = Vec::new();
    for t in tasks {
        let is_source = matches!(t.runnable, Runnable::Source(_));
        let commands = t.commands.clone();
        let env = TaskEnv {
            task: t.name.clone(),
            subtask: t.subtask,
            commands: t.command_rx,
            acks: acks.clone(),
            uploads: uploads.clone(),
            stop: control.stop.clone(),
            cancel: control.cancel.clone(),
            sources_at_end: control.sources_at_end.clone(),
        };
        let control = control.clone();
        let thread_name = format!("{} #{}", t.name, t.subtask);
        let runnable = t.runnable;
        let h = std::thread::Builder::new()
            .name(thread_name)
            .spawn(move || {
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match runnable {
                    Runnable::Source(mut s) => s.run(&env),
                    Runnable::Gate(gate, mut head) => gate.run(head.as_mut(), &env),
                }));
                let location =
                    TaskLocation { task: env.task.clone(), operator: String::new(), subtask: env.subtask };
                match result {
                    Ok(Ok(())) => {}
                    Ok(Err(Error::Cancelled)) => {}
                    Ok(Err(Error::Task { location: mut l, source })) => {
                        l.task = env.task.clone();
                        control.fail(Error::Task { location: l, source });
                    }
                    Ok(Err(Error::Panic { location: mut l, message })) => {
                        l.task = env.task.clone();
                        control.fail(Error::Panic { location: l, message });
                    }
                    Ok(Err(e)) => control.fail(Error::in_task(location, e)),
                    Err(p) => control
                        .fail(Error::Panic { location, message: super::chain::panic_message(p.as_ref()) }),
                }
            })
            .map_err(|e| Error::io("spawning a task thread", e))?;
        handles.push(RunningTask { is_source, commands, thread: h });
    }
    Ok(handles)
}

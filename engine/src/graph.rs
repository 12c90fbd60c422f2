//! The logical job graph the DataStream API builds, and its plan as the JSON of `--caudal-plan`.

use crate::metrics::SubtaskMetrics;
use crate::operator::OperatorContext;
use crate::runtime::chain::ChainNode;
use crate::runtime::exchange::{ChannelMessage, Partitioner};
use crate::runtime::task::SourceTask;
use crate::source::SourceContext;
use crate::Result;
use crossbeam_channel::Sender;
use serde::Serialize;
use std::sync::Arc;

pub(crate) type NodeId = usize;

/// What the engine hands a source subtask besides its context.
pub(crate) struct SourceSetup {
    /// The source's uid in checkpoints.
    pub(crate) uid: String,
    /// Positions of every subtask of the restored checkpoint (empty on a fresh start).
    pub(crate) restored: Vec<Vec<u8>>,
    pub(crate) metrics: Arc<SubtaskMetrics>,
    pub(crate) batch_size: usize,
    pub(crate) linger: std::time::Duration,
    pub(crate) checkpointing: bool,
    pub(crate) latency_marker_interval: Option<std::time::Duration>,
}

/// Builds a source subtask given its context and its (already built) consumers.
pub(crate) type SourceFactory =
    Box<dyn Fn(SourceContext, SourceSetup, Vec<Box<dyn ChainNode>>) -> Result<Box<dyn SourceTask>>>;

/// Builds an operator or sink subtask given its context and its consumers.
pub(crate) type OperatorFactory =
    Box<dyn Fn(OperatorContext, Vec<Box<dyn ChainNode>>) -> Result<Box<dyn ChainNode>>>;

/// Builds the sending end of an edge, typed by the upstream element type.
pub(crate) type OutputFactory = Arc<
    dyn Fn(PartitionMode, Vec<Sender<ChannelMessage>>, usize, u32, Arc<SubtaskMetrics>) -> Box<dyn ChainNode>,
>;

/// How an edge partitions, as declared by the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EdgeKind {
    /// Subtask i to subtask i (becomes rebalance when parallelism differs).
    Forward,
    /// Round-robin over all consumer subtasks.
    Rebalance,
    /// By key group.
    Hash,
}

/// How an edge partitions at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PartitionMode {
    Forward,
    Rebalance,
    Hash,
}

impl PartitionMode {
    pub(crate) fn partitioner<T>(
        self,
        router: Option<&crate::runtime::exchange::KeyRouter<T>>,
        max_parallelism: u32,
    ) -> Partitioner<T> {
        match (self, router) {
            (PartitionMode::Hash, Some(r)) => Partitioner::Hash { router: r.clone(), max_parallelism },
            (PartitionMode::Forward, _) => Partitioner::Forward,
            _ => Partitioner::Rebalance { next: 0 },
        }
    }
}

pub(crate) enum NodeKind {
    Source(SourceFactory),
    Operator(OperatorFactory),
    Sink(OperatorFactory),
}

impl NodeKind {
    pub(crate) fn label(&self) -> &'static str {
        match self {
            NodeKind::Source(_) => "source",
            NodeKind::Operator(_) => "operator",
            NodeKind::Sink(_) => "sink",
        }
    }
}

pub(crate) struct Edge {
    pub(crate) from: NodeId,
    pub(crate) kind: EdgeKind,
    pub(crate) make_output: OutputFactory,
    /// Serializes the edge's batches when its ends run in different processes (cluster mode).
    pub(crate) codec: crate::cluster::codec::BatchCodec,
}

pub(crate) struct Node {
    pub(crate) name: String,
    pub(crate) parallelism: Option<u32>,
    pub(crate) kind: NodeKind,
    pub(crate) inputs: Vec<Edge>,
}

/// The logical graph under construction.
#[derive(Default)]
pub(crate) struct GraphBuilder {
    pub(crate) nodes: Vec<Node>,
}

impl GraphBuilder {
    pub(crate) fn add(&mut self, name: &str, kind: NodeKind, inputs: Vec<Edge>) -> NodeId {
        self.nodes.push(Node { name: name.to_string(), parallelism: None, kind, inputs });
        self.nodes.len() - 1
    }

    pub(crate) fn set_name(&mut self, node: NodeId, name: &str) {
        self.nodes[node].name = name.to_string();
    }

    pub(crate) fn set_parallelism(&mut self, node: NodeId, parallelism: u32) {
        self.nodes[node].parallelism = Some(parallelism);
    }
}

/// One operator of the plan.
#[derive(Debug, Clone, Serialize)]
pub struct PlanNode {
    /// Operator id (its index in the graph).
    pub id: usize,
    /// Operator name.
    pub name: String,
    /// `source`, `operator` or `sink`.
    pub kind: &'static str,
    /// Number of subtasks.
    pub parallelism: u32,
    /// The task (chain) this operator runs in: the id of the chain's head.
    pub task: usize,
    /// Stable id of the operator's state in checkpoints: `<id>-<name>`.
    pub uid: String,
}

/// The checkpoint id of operator `index` named `name`: `<index>-<name>` with every
/// character outside `[A-Za-z0-9._-]` replaced by `_`.
pub(crate) fn operator_uid(index: usize, name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
        .collect();
    let mut uid = format!("{index}-{clean}");
    uid.truncate(120);
    uid
}

/// One edge of the plan.
#[derive(Debug, Clone, Serialize)]
pub struct PlanEdge {
    /// Upstream operator id.
    pub from: usize,
    /// Downstream operator id.
    pub to: usize,
    /// Partitioning: `forward`, `rebalance`, `hash`.
    pub partitioning: EdgeKind,
    /// True when both ends run in one task (no channel).
    pub chained: bool,
}

/// The logical graph with parallelism and chaining decided: what `--caudal-plan` prints.
#[derive(Debug, Clone, Serialize)]
pub struct JobPlan {
    /// The job name.
    pub job: String,
    /// Key groups.
    pub max_parallelism: u32,
    /// Operators in creation order.
    pub operators: Vec<PlanNode>,
    /// Edges.
    pub edges: Vec<PlanEdge>,
}

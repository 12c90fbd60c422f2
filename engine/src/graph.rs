//! The logical job graph the DataStream API builds, and its plan as the JSON of `--caudal-plan`.

use crate::metrics::SubtaskMetrics;
use crate::operator::OperatorContext;
use crate::runtime::chain::ChainNode;
use crate::runtime::exchange::{ChannelMessage, Partitioner};
use crate::runtime::task::SourceTask;
use crate::source::SourceContext;
use crate::{Error, Result};
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
    /// Every record to every consumer subtask.
    Broadcast,
}

/// How an edge partitions at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PartitionMode {
    Forward,
    Rebalance,
    Hash,
    Broadcast,
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
            (PartitionMode::Broadcast, _) => Partitioner::Broadcast,
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
    pub(crate) codec: crate::runtime::codec::BatchCodec,
}

pub(crate) struct Node {
    pub(crate) name: String,
    /// The uid set with `.uid(..)`; `None`: derived from the name (see [`operator_uids`]).
    pub(crate) uid: Option<String>,
    pub(crate) parallelism: Option<u32>,
    pub(crate) kind: NodeKind,
    pub(crate) inputs: Vec<Edge>,
    /// Stateless steps chained after this node that take its parallelism and its name with
    /// their suffix (the main and side outputs of a process function).
    pub(crate) followers: Vec<(NodeId, String)>,
}

/// The logical graph under construction.
#[derive(Default)]
pub(crate) struct GraphBuilder {
    pub(crate) nodes: Vec<Node>,
    /// Mistakes in the use of the API, reported when the job is built.
    pub(crate) errors: Vec<String>,
}

impl GraphBuilder {
    pub(crate) fn add(&mut self, name: &str, kind: NodeKind, inputs: Vec<Edge>) -> NodeId {
        self.nodes.push(Node {
            name: name.to_string(),
            uid: None,
            parallelism: None,
            kind,
            inputs,
            followers: Vec::new(),
        });
        self.nodes.len() - 1
    }

    pub(crate) fn set_name(&mut self, node: NodeId, name: &str) {
        self.nodes[node].name = name.to_string();
        for (f, suffix) in self.nodes[node].followers.clone() {
            self.nodes[f].name = format!("{name}{suffix}");
        }
    }

    pub(crate) fn set_uid(&mut self, node: NodeId, uid: &str) {
        self.nodes[node].uid = Some(uid.to_string());
    }

    pub(crate) fn set_parallelism(&mut self, node: NodeId, parallelism: u32) {
        self.nodes[node].parallelism = Some(parallelism);
        for (f, _) in self.nodes[node].followers.clone() {
            self.nodes[f].parallelism = Some(parallelism);
        }
    }

    /// `follower` takes `owner`'s parallelism and its name with `suffix`, now and later.
    pub(crate) fn follow(&mut self, owner: NodeId, follower: NodeId, suffix: &str) {
        self.nodes[follower].name = format!("{}{suffix}", self.nodes[owner].name);
        self.nodes[follower].parallelism = self.nodes[owner].parallelism;
        self.nodes[owner].followers.push((follower, suffix.to_string()));
    }

    /// Records a mistake in the use of the API; the job then fails to build with it.
    pub(crate) fn error(&mut self, message: String) {
        self.errors.push(message);
    }

    /// The API mistakes recorded, as one error.
    pub(crate) fn check(&self) -> Result<()> {
        match self.errors.as_slice() {
            [] => Ok(()),
            errors => Err(Error::Graph(errors.join("; "))),
        }
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
    /// Stable id of the operator's state in checkpoints: set with `.uid(..)`, or derived
    /// from the name (see [`operator_uids`]).
    pub uid: String,
}

/// Longest uid accepted.
const MAX_UID_LEN: usize = 120;

/// The uid of every node, in graph order: the state of an operator in a checkpoint is found
/// by it, so it must not change when other operators are added or removed.
///
/// A uid set with `.uid(..)` is used as it is (`[A-Za-z0-9._-]`, at most 120 characters).
/// Otherwise it is derived from the name, with every character outside that set replaced by
/// `_`: the first operator of a name gets the name, the k-th after it `<name>.<k>`. The
/// default is stable when operators of other names come and go, not when another operator
/// of the same name is added before it: jobs meant to be upgraded set uids (as in Flink).
pub(crate) fn operator_uids(nodes: &[Node]) -> Result<Vec<String>> {
    let mut seen_names: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut uids = Vec::with_capacity(nodes.len());
    for node in nodes {
        let uid = match &node.uid {
            Some(uid) => {
                check_uid(uid, &node.name)?;
                uid.clone()
            }
            None => {
                let clean = uid_safe(&node.name);
                let k = seen_names.entry(clean.clone()).or_insert(0);
                let mut uid = if *k == 0 { clean } else { format!("{clean}.{k}") };
                *k += 1;
                uid.truncate(MAX_UID_LEN);
                uid
            }
        };
        uids.push(uid);
    }
    for (i, uid) in uids.iter().enumerate() {
        if let Some(j) = uids[..i].iter().position(|u| u == uid) {
            return Err(Error::Graph(format!(
                "operators `{}` and `{}` have the same uid `{uid}`: give one of them another with .uid(..)",
                nodes[j].name, nodes[i].name
            )));
        }
    }
    Ok(uids)
}

/// A character of uids: `[A-Za-z0-9._-]`, safe in file and object names.
fn is_uid_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// `s` with every character that cannot be in a uid replaced by `_`: a uid derived from a
/// name, or a name (a job's, say) put next to uids in file and object names.
pub fn uid_safe(s: &str) -> String {
    s.chars().map(|c| if is_uid_char(c) { c } else { '_' }).collect()
}

fn check_uid(uid: &str, name: &str) -> Result<()> {
    let ok = !uid.is_empty() && uid.len() <= MAX_UID_LEN && uid.chars().all(is_uid_char);
    if ok {
        Ok(())
    } else {
        Err(Error::Graph(format!(
            "operator `{name}`: uid `{uid}` must be 1 to {MAX_UID_LEN} characters of A-Z, a-z, 0-9, `.`, `_`, `-`"
        )))
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(nodes: &[(&str, Option<&str>)]) -> Vec<Node> {
        nodes
            .iter()
            .map(|(name, uid)| Node {
                name: name.to_string(),
                uid: uid.map(str::to_string),
                parallelism: None,
                kind: NodeKind::Sink(Box::new(|_, _| Err(Error::Graph("not built in this test".into())))),
                inputs: Vec::new(),
                followers: Vec::new(),
            })
            .collect()
    }

    #[test]
    fn default_uids_depend_on_the_name_and_the_rank_among_same_named_operators_only() {
        let uids =
            operator_uids(&graph(&[("source", None), ("map", None), ("map", None), ("sink one", None)]))
                .unwrap();
        assert_eq!(uids, ["source", "map", "map.1", "sink_one"]);
        // An operator of another name added in front changes no other uid.
        let uids = operator_uids(&graph(&[
            ("archive", None),
            ("source", None),
            ("map", None),
            ("map", None),
            ("sink one", None),
        ]))
        .unwrap();
        assert_eq!(uids, ["archive", "source", "map", "map.1", "sink_one"]);
    }

    #[test]
    fn explicit_uids_are_kept_checked_and_unique() {
        let uids = operator_uids(&graph(&[("map", Some("celsius")), ("map", None)])).unwrap();
        assert_eq!(uids, ["celsius", "map"]);
        let e = operator_uids(&graph(&[("a", Some("x")), ("b", Some("x"))])).unwrap_err().to_string();
        assert!(e.contains("`a` and `b` have the same uid `x`"), "{e}");
        let e = operator_uids(&graph(&[("map", None), ("other", Some("map"))])).unwrap_err().to_string();
        assert!(e.contains("same uid `map`"), "{e}");
        for bad in ["", "a b", "ü", &"x".repeat(121)] {
            let e = operator_uids(&graph(&[("op", Some(bad))])).unwrap_err().to_string();
            assert!(e.contains("must be 1 to 120 characters"), "{bad}: {e}");
        }
    }
}

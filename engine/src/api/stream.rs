//! `DataStream`, `KeyedStream` and `DataStreamSink`: typed handles on graph nodes.

use super::functions::{FilterOp, FlatMapOp, MapOp, PassThrough, TimestampOp};
use crate::graph::{Edge, EdgeKind, GraphBuilder, NodeId, NodeKind, OutputFactory, PartitionMode};
use crate::operator::{Operator, OperatorContext, Sink};
use crate::runtime::chain::{ChainNode, OperatorNode, SinkNode};
use crate::runtime::exchange::{key_router, ExchangeOutput, KeyRouter};
use crate::types::{Data, Key, Timestamp};
use crate::Result;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::Arc;

pub(crate) type Graph = Rc<RefCell<GraphBuilder>>;

fn output_factory<T: Data>(router: Option<KeyRouter<T>>) -> OutputFactory {
    Arc::new(move |mode: PartitionMode, senders, batch_size, max_parallelism, metrics| {
        let partitioner = mode.partitioner(router.as_ref(), max_parallelism);
        Box::new(ExchangeOutput::<T>::new(partitioner, senders, batch_size, metrics)) as Box<dyn ChainNode>
    })
}

/// A stream of `T` records: the output of one operator.
pub struct DataStream<T> {
    pub(crate) graph: Graph,
    pub(crate) node: NodeId,
    pub(crate) next_edge: EdgeKind,
    /// The process operator this stream is the main output of: `.name`, `.uid` and
    /// `.parallelism` apply to it, and its side outputs can be taken.
    pub(crate) process: Option<NodeId>,
    pub(crate) _t: PhantomData<fn() -> T>,
}

impl<T> Clone for DataStream<T> {
    /// Another handle on the same stream: each use becomes a consumer (fan-out).
    fn clone(&self) -> Self {
        DataStream {
            graph: self.graph.clone(),
            node: self.node,
            next_edge: self.next_edge,
            process: self.process,
            _t: PhantomData,
        }
    }
}

impl<T> std::fmt::Debug for DataStream<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DataStream(node {})", self.node)
    }
}

impl<T: Data> DataStream<T> {
    pub(crate) fn new(graph: Graph, node: NodeId) -> Self {
        DataStream { graph, node, next_edge: EdgeKind::Forward, process: None, _t: PhantomData }
    }

    /// This stream is the main output of process operator `process`.
    pub(crate) fn owned_by(mut self, process: NodeId) -> Self {
        self.process = Some(process);
        self
    }

    /// The process operator's own (tagged) output, when this stream is its main output.
    pub(crate) fn tagged_source(&self) -> Option<DataStream<crate::api::process::Tagged<T>>> {
        self.process.map(|p| DataStream::new(self.graph.clone(), p))
    }

    /// The node `.name`, `.uid` and `.parallelism` apply to.
    fn owner(&self) -> NodeId {
        self.process.unwrap_or(self.node)
    }

    pub(crate) fn edge(&self, kind: EdgeKind, router: Option<KeyRouter<T>>) -> Edge {
        Edge {
            from: self.node,
            kind,
            make_output: output_factory::<T>(router),
            codec: crate::runtime::codec::BatchCodec::of::<T>(),
        }
    }

    /// Name this operator (shown in the plan, metrics, errors and the UI).
    pub fn name(self, name: &str) -> Self {
        self.graph.borrow_mut().set_name(self.owner(), name);
        self
    }

    /// Run this operator with `parallelism` subtasks instead of the job's default.
    pub fn parallelism(self, parallelism: u32) -> Self {
        self.graph.borrow_mut().set_parallelism(self.owner(), parallelism);
        self
    }

    /// Set this operator's uid: the id its state has in checkpoints and savepoints.
    ///
    /// A restore finds each operator's state by uid, so set one on every stateful operator
    /// and sink of a job that will be changed and restored (as in Flink). Without one the
    /// uid is derived from the name, which changes when another operator of the same name
    /// is added before this one. `[A-Za-z0-9._-]`, at most 120 characters, unique in the job.
    pub fn uid(self, uid: &str) -> Self {
        self.graph.borrow_mut().set_uid(self.owner(), uid);
        self
    }

    /// Distribute the next operator's input round-robin over its subtasks.
    pub fn rebalance(mut self) -> Self {
        self.next_edge = EdgeKind::Rebalance;
        self
    }

    /// Apply a custom operator; `factory` builds one instance per subtask.
    pub fn transform<O, F>(self, name: &str, factory: F) -> DataStream<O::Out>
    where
        O: Operator<In = T>,
        F: Fn(&OperatorContext) -> Result<O> + 'static,
    {
        let edge = self.edge(self.next_edge, None);
        add_operator(&self.graph, name, edge, factory)
    }

    /// Transform every record.
    ///
    /// # Examples
    /// ```
    /// # use caudal::StreamEnv;
    /// let env = StreamEnv::new();
    /// let celsius = env.from_iter("readings", vec![212.0_f64, 32.0]).map(|f| (f - 32.0) * 5.0 / 9.0);
    /// # let _ = celsius;
    /// ```
    pub fn map<U: Data, F: Fn(T) -> U + Send + Sync + 'static>(self, f: F) -> DataStream<U> {
        let f = Arc::new(f);
        self.transform("map", move |_| Ok(MapOp { f: f.clone(), _t: PhantomData }))
    }

    /// Set each record's event time from its value (watermarks still come from upstream).
    pub fn assign_timestamps<F: Fn(&T) -> Timestamp + Send + Sync + 'static>(self, f: F) -> DataStream<T> {
        let f = Arc::new(f);
        self.transform("assign-timestamps", move |_| Ok(TimestampOp { f: f.clone(), _t: PhantomData }))
    }

    /// Keep the records for which `f` is true.
    pub fn filter<F: Fn(&T) -> bool + Send + Sync + 'static>(self, f: F) -> DataStream<T> {
        let f = Arc::new(f);
        self.transform("filter", move |_| Ok(FilterOp { f: f.clone(), _t: PhantomData }))
    }

    /// Zero or more records per record.
    pub fn flat_map<U, I, F>(self, f: F) -> DataStream<U>
    where
        U: Data,
        I: IntoIterator<Item = U> + 'static,
        F: Fn(T) -> I + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        self.transform("flat_map", move |_| Ok(FlatMapOp { f: f.clone(), _t: PhantomData }))
    }

    /// Merge with other streams of the same type.
    pub fn union(self, others: Vec<DataStream<T>>) -> DataStream<T> {
        let mut inputs = vec![self.edge(self.next_edge, None)];
        for o in &others {
            inputs.push(o.edge(o.next_edge, None));
        }
        let node = self.graph.borrow_mut().add(
            "union",
            NodeKind::Operator(Box::new(|ctx, targets| {
                Ok(Box::new(OperatorNode::new(PassThrough::<T>(PhantomData), ctx, targets))
                    as Box<dyn ChainNode>)
            })),
            inputs,
        );
        DataStream::new(self.graph.clone(), node)
    }

    /// Partition by key: records with equal keys go to the same subtask (by key group).
    pub fn key_by<K: Key, F: Fn(&T) -> K + Send + Sync + 'static>(self, key: F) -> KeyedStream<K, T> {
        KeyedStream { stream: self, key: Arc::new(key) }
    }

    /// Write the stream to a sink; `factory` builds one instance per subtask.
    pub fn sink<S, F>(self, name: &str, factory: F) -> DataStreamSink
    where
        S: Sink<In = T>,
        F: Fn(&OperatorContext) -> Result<S> + 'static,
    {
        let edge = self.edge(self.next_edge, None);
        let node = self.graph.borrow_mut().add(
            name,
            NodeKind::Sink(Box::new(move |ctx, _targets| {
                let sink = factory(&ctx)?;
                Ok(Box::new(SinkNode::new(sink, ctx)) as Box<dyn ChainNode>)
            })),
            vec![edge],
        );
        DataStreamSink { graph: self.graph.clone(), node }
    }
}

fn add_operator<O, F>(graph: &Graph, name: &str, edge: Edge, factory: F) -> DataStream<O::Out>
where
    O: Operator,
    F: Fn(&OperatorContext) -> Result<O> + 'static,
{
    let node = graph.borrow_mut().add(
        name,
        NodeKind::Operator(Box::new(move |ctx, targets| {
            let op = factory(&ctx)?;
            Ok(Box::new(OperatorNode::new(op, ctx, targets)) as Box<dyn ChainNode>)
        })),
        vec![edge],
    );
    DataStream::new(graph.clone(), node)
}

/// A stream partitioned by key: the input of keyed state and windows.
pub struct KeyedStream<K, T> {
    pub(crate) stream: DataStream<T>,
    key: Arc<dyn Fn(&T) -> K + Send + Sync>,
}

impl<K, T> std::fmt::Debug for KeyedStream<K, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyedStream(node {})", self.stream.node)
    }
}

impl<K: Key, T: Data> KeyedStream<K, T> {
    /// The key extractor, for keyed operators.
    pub fn key_fn(&self) -> Arc<dyn Fn(&T) -> K + Send + Sync> {
        self.key.clone()
    }

    /// Apply a keyed operator: its input is hash-partitioned by key group.
    pub fn transform<O, F>(self, name: &str, factory: F) -> DataStream<O::Out>
    where
        O: Operator<In = T>,
        F: Fn(&OperatorContext) -> Result<O> + 'static,
    {
        let key = self.key.clone();
        let router = key_router::<T, K>(move |v| key(v));
        let edge = self.stream.edge(EdgeKind::Hash, Some(router));
        add_operator(&self.stream.graph, name, edge, factory)
    }
}

/// The handle of a sink, to name it and set its parallelism.
pub struct DataStreamSink {
    graph: Graph,
    node: NodeId,
}

impl std::fmt::Debug for DataStreamSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DataStreamSink(node {})", self.node)
    }
}

impl DataStreamSink {
    /// Name the sink.
    pub fn name(self, name: &str) -> Self {
        self.graph.borrow_mut().set_name(self.node, name);
        self
    }

    /// Run the sink with `parallelism` subtasks.
    pub fn parallelism(self, parallelism: u32) -> Self {
        self.graph.borrow_mut().set_parallelism(self.node, parallelism);
        self
    }

    /// Set the sink's uid: the id of its state (its pending epochs) in checkpoints. See
    /// [`DataStream::uid`].
    pub fn uid(self, uid: &str) -> Self {
        self.graph.borrow_mut().set_uid(self.node, uid);
        self
    }
}

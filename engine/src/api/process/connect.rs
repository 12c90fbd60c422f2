//! Two inputs: `a.connect(b)` and its process functions.
//!
//! Both inputs become one stream of [`TwoInputs`] (each side mapped where it is produced)
//! feeding one operator: its input gate takes the watermark as the minimum of both sides
//! and aligns barriers across both, as for any operator with several inputs. Keyed on both
//! sides, both edges are hash-partitioned by the same key type, so a key's elements of
//! either side meet on one subtask, with the key's state and timers.

use super::context::{Context, KeyedContext, Output};
use super::function::{KeyedProcessFunction, ProcessFunction};
use super::main_of;
use super::operator::KeyedProcessOperator;
use crate::api::stream::{DataStream, Graph};
use crate::graph::{EdgeKind, NodeKind};
use crate::runtime::chain::{ChainNode, OperatorNode};
use crate::runtime::exchange::key_router;
use crate::types::{Data, Key, Timestamp};
use crate::Result;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// An element of two connected streams.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TwoInputs<A, B> {
    /// From the first stream.
    First(A),
    /// From the second stream.
    Second(B),
}

/// A function over two connected streams (Flink's `CoProcessFunction`).
pub trait CoProcessFunction<A, B, O>: Clone + Send + 'static {
    /// Handles an element of the first stream.
    fn process_element1(&mut self, value: A, ctx: &mut Context<'_>, out: &mut Output<'_, O>) -> Result<()>;
    /// Handles an element of the second stream.
    fn process_element2(&mut self, value: B, ctx: &mut Context<'_>, out: &mut Output<'_, O>) -> Result<()>;
}

/// A function over two streams keyed alike (Flink's `KeyedCoProcessFunction`): both sides'
/// elements of a key share its state and timers.
pub trait KeyedCoProcessFunction<K, A, B, O>: Clone + Send + 'static {
    /// Handles an element of the first stream.
    fn process_element1(
        &mut self,
        value: A,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Output<'_, O>,
    ) -> Result<()>;
    /// Handles an element of the second stream.
    fn process_element2(
        &mut self,
        value: B,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Output<'_, O>,
    ) -> Result<()>;
    /// A timer of the key in `ctx` fired (see [`KeyedProcessFunction::on_timer`]).
    fn on_timer(
        &mut self,
        _timestamp: Timestamp,
        _ctx: &mut KeyedContext<'_, K>,
        _out: &mut Output<'_, O>,
    ) -> Result<()> {
        Ok(())
    }
}

#[derive(Clone)]
struct Co<F>(F);

impl<A, B, O, F: CoProcessFunction<A, B, O>> ProcessFunction<TwoInputs<A, B>, O> for Co<F> {
    fn process_element(
        &mut self,
        v: TwoInputs<A, B>,
        ctx: &mut Context<'_>,
        out: &mut Output<'_, O>,
    ) -> Result<()> {
        match v {
            TwoInputs::First(a) => self.0.process_element1(a, ctx, out),
            TwoInputs::Second(b) => self.0.process_element2(b, ctx, out),
        }
    }
}

#[derive(Clone)]
pub(crate) struct KeyedCo<F>(pub(crate) F);

impl<K, A, B, O, F: KeyedCoProcessFunction<K, A, B, O>> KeyedProcessFunction<K, TwoInputs<A, B>, O>
    for KeyedCo<F>
{
    fn process_element(
        &mut self,
        v: TwoInputs<A, B>,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Output<'_, O>,
    ) -> Result<()> {
        match v {
            TwoInputs::First(a) => self.0.process_element1(a, ctx, out),
            TwoInputs::Second(b) => self.0.process_element2(b, ctx, out),
        }
    }

    fn on_timer(
        &mut self,
        ts: Timestamp,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Output<'_, O>,
    ) -> Result<()> {
        self.0.on_timer(ts, ctx, out)
    }
}

/// Two streams connected with `DataStream::connect`.
pub struct ConnectedStreams<A, B> {
    first: DataStream<A>,
    second: DataStream<B>,
}

impl<A, B> std::fmt::Debug for ConnectedStreams<A, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ConnectedStreams({:?}, {:?})", self.first, self.second)
    }
}

impl<A: Data> DataStream<A> {
    /// Connect with another stream (of any type) for a two-input process function.
    pub fn connect<B: Data>(self, other: DataStream<B>) -> ConnectedStreams<A, B> {
        ConnectedStreams { first: self, second: other }
    }
}

impl<A: Data, B: Data> ConnectedStreams<A, B> {
    /// Both streams as one of [`TwoInputs`], each side mapped where it is produced.
    fn sides(self) -> [DataStream<TwoInputs<A, B>>; 2] {
        let first = self.first.map(TwoInputs::<A, B>::First).name("connect.first");
        let second = self.second.map(TwoInputs::<A, B>::Second).name("connect.second");
        [first, second]
    }

    /// Apply a two-input process function (without keys: no keyed state or timers).
    pub fn process<O: Data, F: CoProcessFunction<A, B, O>>(self, f: F) -> DataStream<O> {
        let [first, second] = self.sides();
        first.union(vec![second]).process(Co(f))
    }

    /// Key both sides (by keys of one type): a key's elements of either side meet.
    pub fn key_by<K: Key>(
        self,
        first: impl Fn(&A) -> K + Send + Sync + 'static,
        second: impl Fn(&B) -> K + Send + Sync + 'static,
    ) -> KeyedConnectedStreams<K, A, B> {
        let key = Arc::new(move |e: &TwoInputs<A, B>| match e {
            TwoInputs::First(a) => first(a),
            TwoInputs::Second(b) => second(b),
        });
        KeyedConnectedStreams { streams: self, key }
    }
}

type TwoKey<K, A, B> = Arc<dyn Fn(&TwoInputs<A, B>) -> K + Send + Sync>;

/// Two connected streams keyed alike (`ConnectedStreams::key_by`).
pub struct KeyedConnectedStreams<K, A, B> {
    streams: ConnectedStreams<A, B>,
    key: TwoKey<K, A, B>,
}

impl<K, A, B> std::fmt::Debug for KeyedConnectedStreams<K, A, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyedConnectedStreams({:?})", self.streams)
    }
}

impl<K: Key, A: Data, B: Data> KeyedConnectedStreams<K, A, B> {
    /// Apply a keyed two-input process function: state and timers per key, shared by both
    /// sides. Set a `.uid(..)` on the result: its state is found by it.
    pub fn process<O: Data, F: KeyedCoProcessFunction<K, A, B, O>>(self, f: F) -> DataStream<O> {
        let key = self.key;
        let [first, second] = self.streams.sides();
        let router = {
            let key = key.clone();
            key_router::<TwoInputs<A, B>, K>(move |v| key(v))
        };
        let edges =
            vec![first.edge(EdgeKind::Hash, Some(router.clone())), second.edge(EdgeKind::Hash, Some(router))];
        let graph: Graph = first.graph.clone();
        let factory = KeyedCo(f);
        let node = graph.borrow_mut().add(
            "co-process",
            NodeKind::Operator(Box::new(move |ctx, targets| {
                let op = KeyedProcessOperator::new(factory.clone(), key.clone());
                Ok(Box::new(OperatorNode::new(op, ctx, targets)) as Box<dyn ChainNode>)
            })),
            edges,
        );
        main_of(DataStream::new(graph, node))
    }
}

//! Broadcast state: a low-volume control stream sent to every subtask of a keyed operator
//! (Flink's `KeyedBroadcastProcessFunction`).
//!
//! `control.broadcast()` sends each control element to every subtask; `keyed.connect(..)`
//! joins it with a keyed stream. The function writes the broadcast state while it handles a
//! control element and reads it (read-only) while it handles a keyed element or a timer. Every
//! subtask sees the same control elements in the same order before each barrier, so their
//! broadcast states agree: subtask 0 snapshots it, and on restore every subtask (at any
//! parallelism) starts from that copy.

use super::codec;
use super::connect::TwoInputs;
use super::context::{KeyedContext, Output};
use super::keyed_core::{HasKeyedCore, KeyedCore, Now};
use super::main_of;
use super::side_output::{OutputTag, SideRecords, Tagged};
use super::timers::TimeDomain;
use crate::api::stream::{DataStream, KeyedStream};
use crate::graph::{EdgeKind, NodeKind};
use crate::keygroup::{key_group_of, subtask_for_key_group};
use crate::operator::{Operator, OperatorContext, StateBrowse};
use crate::runtime::chain::{ChainNode, OperatorNode};
use crate::runtime::exchange::KeyRouter;
use crate::types::{Batch, CheckpointId, Data, Key, Timestamp};
use crate::{Error, Result};
use caudal_checkpoints::KeyedStateBackend;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;

/// A named map of broadcast state (Flink's `MapStateDescriptor` used for broadcast state).
#[derive(Debug)]
pub struct BroadcastStateDescriptor<UK, V> {
    name: String,
    _t: PhantomData<fn() -> (UK, V)>,
}

impl<UK, V> Clone for BroadcastStateDescriptor<UK, V> {
    fn clone(&self) -> Self {
        BroadcastStateDescriptor { name: self.name.clone(), _t: PhantomData }
    }
}

impl<UK: Serialize + DeserializeOwned, V: Serialize + DeserializeOwned> BroadcastStateDescriptor<UK, V> {
    /// A broadcast map named `name`.
    pub fn new(name: &str) -> Self {
        BroadcastStateDescriptor { name: name.to_string(), _t: PhantomData }
    }

    /// The map's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Every broadcast map of a subtask: name → encoded key → encoded value.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub(crate) struct BroadcastState {
    maps: BTreeMap<String, BTreeMap<Vec<u8>, Vec<u8>>>,
}

fn codec_error(map: &str, e: impl std::fmt::Display) -> Error {
    Error::CorruptState(format!("broadcast state `{map}`: {e}"))
}

fn encode<T: Serialize + ?Sized>(map: &str, v: &T) -> Result<Vec<u8>> {
    codec::encode_to_vec(v).map_err(|e| codec_error(map, e))
}

fn decode<T: DeserializeOwned>(map: &str, bytes: &[u8]) -> Result<T> {
    codec::decode(bytes).map_err(|e| codec_error(map, e))
}

/// Read access to one broadcast map.
pub struct BroadcastView<'a, UK, V> {
    map: Option<&'a BTreeMap<Vec<u8>, Vec<u8>>>,
    name: &'a str,
    _t: PhantomData<fn() -> (UK, V)>,
}

impl<UK: Serialize + DeserializeOwned, V: Serialize + DeserializeOwned> BroadcastView<'_, UK, V> {
    /// The value of `key`.
    pub fn get(&self, key: &UK) -> Result<Option<V>> {
        let Some(map) = self.map else { return Ok(None) };
        map.get(&encode(self.name, key)?).map(|v| decode(self.name, v)).transpose()
    }

    /// Every entry, in the order of the encoded keys.
    pub fn entries(&self) -> Result<Vec<(UK, V)>> {
        let Some(map) = self.map else { return Ok(Vec::new()) };
        map.iter().map(|(k, v)| Ok((decode(self.name, k)?, decode(self.name, v)?))).collect()
    }
}

/// Write access to one broadcast map (while a control element is handled).
pub struct BroadcastMapMut<'a, UK, V> {
    map: &'a mut BTreeMap<Vec<u8>, Vec<u8>>,
    name: String,
    _t: PhantomData<fn() -> (UK, V)>,
}

impl<UK: Serialize + DeserializeOwned, V: Serialize + DeserializeOwned> BroadcastMapMut<'_, UK, V> {
    /// The value of `key`.
    pub fn get(&self, key: &UK) -> Result<Option<V>> {
        self.map.get(&encode(&self.name, key)?).map(|v| decode(&self.name, v)).transpose()
    }

    /// Sets `key` to `value`.
    pub fn put(&mut self, key: &UK, value: &V) -> Result<()> {
        let (k, v) = (encode(&self.name, key)?, encode(&self.name, value)?);
        self.map.insert(k, v);
        Ok(())
    }

    /// Removes `key`.
    pub fn remove(&mut self, key: &UK) -> Result<()> {
        self.map.remove(&encode(&self.name, key)?);
        Ok(())
    }

    /// Removes every entry.
    pub fn clear(&mut self) {
        self.map.clear();
    }

    /// Every entry, in the order of the encoded keys.
    pub fn entries(&self) -> Result<Vec<(UK, V)>> {
        self.map.iter().map(|(k, v)| Ok((decode(&self.name, k)?, decode(&self.name, v)?))).collect()
    }
}

impl<K> KeyedContext<'_, K> {
    /// The broadcast map `state`, read-only (functions connected to a broadcast stream; an
    /// error elsewhere).
    pub fn broadcast_state<'s, UK, V>(
        &'s self,
        state: &'s BroadcastStateDescriptor<UK, V>,
    ) -> Result<BroadcastView<'s, UK, V>> {
        let all = self.broadcast.ok_or_else(|| {
            Error::Graph(format!(
                "broadcast state `{}`: this function is not connected to a broadcast stream",
                state.name
            ))
        })?;
        Ok(BroadcastView { map: all.maps.get(&state.name), name: &state.name, _t: PhantomData })
    }
}

/// The context of a control element: the broadcast state, writable.
pub struct BroadcastContext<'a> {
    state: &'a mut BroadcastState,
    timestamp: Timestamp,
    watermark: Timestamp,
    processing_time: Timestamp,
    side: &'a mut SideRecords,
}

impl BroadcastContext<'_> {
    /// The broadcast map `state`, writable.
    pub fn state<UK: Serialize + DeserializeOwned, V: Serialize + DeserializeOwned>(
        &mut self,
        state: &BroadcastStateDescriptor<UK, V>,
    ) -> BroadcastMapMut<'_, UK, V> {
        let map = self.state.maps.entry(state.name.clone()).or_default();
        BroadcastMapMut { map, name: state.name.clone(), _t: PhantomData }
    }

    /// The control element's event time.
    pub fn timestamp(&self) -> Timestamp {
        self.timestamp
    }

    /// The operator's current input watermark.
    pub fn current_watermark(&self) -> Timestamp {
        self.watermark
    }

    /// Wall-clock time, ms since the epoch (read once per batch).
    pub fn current_processing_time(&self) -> Timestamp {
        self.processing_time
    }

    /// Emits `value` to the side output `tag`.
    pub fn output<S: Data>(&mut self, tag: &OutputTag<S>, value: S) -> Result<()> {
        self.side.push(tag, self.timestamp, &value)
    }
}

/// A keyed function with a broadcast control input (Flink's `KeyedBroadcastProcessFunction`).
pub trait KeyedBroadcastProcessFunction<K, I, C, O>: Clone + Send + 'static {
    /// Handles a keyed element; `ctx.broadcast_state(&D)` reads the broadcast state.
    fn process_element(
        &mut self,
        value: I,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Output<'_, O>,
    ) -> Result<()>;

    /// Handles a control element (every subtask gets each one); write the broadcast state
    /// through `ctx.state(&D)`. It has no key: keyed state and timers are not reachable here.
    fn process_broadcast_element(
        &mut self,
        value: C,
        ctx: &mut BroadcastContext<'_>,
        out: &mut Output<'_, O>,
    ) -> Result<()>;

    /// A timer of the key in `ctx` fired (see `KeyedProcessFunction::on_timer`).
    fn on_timer(
        &mut self,
        _timestamp: Timestamp,
        _ctx: &mut KeyedContext<'_, K>,
        _out: &mut Output<'_, O>,
    ) -> Result<()> {
        Ok(())
    }
}

/// A stream every subtask of the operator it is connected to receives whole.
pub struct BroadcastStream<C> {
    stream: DataStream<C>,
}

impl<C> std::fmt::Debug for BroadcastStream<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BroadcastStream({:?})", self.stream)
    }
}

impl<C: Data> DataStream<C> {
    /// Broadcast this (low-volume) stream: connect it to a keyed stream, whose every subtask
    /// then receives every element.
    pub fn broadcast(self) -> BroadcastStream<C> {
        BroadcastStream { stream: self }
    }
}

/// A keyed stream connected to a broadcast stream.
pub struct BroadcastConnectedStreams<K, I, C> {
    keyed: KeyedStream<K, I>,
    control: BroadcastStream<C>,
}

impl<K, I, C> std::fmt::Debug for BroadcastConnectedStreams<K, I, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BroadcastConnectedStreams({:?}, {:?})", self.keyed, self.control)
    }
}

impl<K: Key, I: Data> KeyedStream<K, I> {
    /// Connect with a broadcast control stream.
    pub fn connect<C: Data>(self, control: BroadcastStream<C>) -> BroadcastConnectedStreams<K, I, C> {
        BroadcastConnectedStreams { keyed: self, control }
    }
}

impl<K: Key, I: Data, C: Data> BroadcastConnectedStreams<K, I, C> {
    /// Apply a keyed broadcast process function. Set a `.uid(..)` on the result.
    pub fn process<O: Data, F: KeyedBroadcastProcessFunction<K, I, C, O>>(self, f: F) -> DataStream<O> {
        let key = self.keyed.key_fn();
        let first = self.keyed.stream.map(TwoInputs::<I, C>::First).name("connect.keyed");
        let second = self.control.stream.map(TwoInputs::<I, C>::Second).name("connect.broadcast");
        let router: KeyRouter<TwoInputs<I, C>> = {
            let key = key.clone();
            Arc::new(move |v: &TwoInputs<I, C>, max_parallelism: u32, parallelism: u32| match v {
                TwoInputs::First(i) => subtask_for_key_group(
                    key_group_of(&key(i), max_parallelism),
                    max_parallelism,
                    parallelism,
                ),
                TwoInputs::Second(_) => 0, // never routed: this edge is the keyed one
            })
        };
        let edges = vec![first.edge(EdgeKind::Hash, Some(router)), second.edge(EdgeKind::Broadcast, None)];
        let graph = first.graph.clone();
        let node = graph.borrow_mut().add(
            "broadcast-process",
            NodeKind::Operator(Box::new(move |ctx, targets| {
                let op = KeyedBroadcastOperator::<K, I, C, O, F>::new(f.clone(), key.clone());
                Ok(Box::new(OperatorNode::new(op, ctx, targets)) as Box<dyn ChainNode>)
            })),
            edges,
        );
        main_of(DataStream::new(graph, node))
    }
}

/// Runs a [`KeyedBroadcastProcessFunction`] on one subtask.
pub(crate) struct KeyedBroadcastOperator<K, I, C, O, F> {
    f: F,
    key: Arc<dyn Fn(&I) -> K + Send + Sync>,
    core: KeyedCore,
    state: BroadcastState,
    side: SideRecords,
    _t: PhantomData<fn(I, C) -> O>,
}

impl<K, I, C, O, F> KeyedBroadcastOperator<K, I, C, O, F> {
    pub(crate) fn new(f: F, key: Arc<dyn Fn(&I) -> K + Send + Sync>) -> Self {
        KeyedBroadcastOperator {
            f,
            key,
            core: KeyedCore::default(),
            state: BroadcastState::default(),
            side: SideRecords::default(),
            _t: PhantomData,
        }
    }
}

impl<K: Key, I: Data, C: Data, O: Data, F: KeyedBroadcastProcessFunction<K, I, C, O>> Operator
    for KeyedBroadcastOperator<K, I, C, O, F>
{
    type In = TwoInputs<I, C>;
    type Out = Tagged<O>;

    fn process_batch(
        &mut self,
        batch: Batch<TwoInputs<I, C>>,
        out: &mut Batch<Tagged<O>>,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        let (now, max_parallelism) = (Now::of(ctx), ctx.max_parallelism);
        let mut guard = ctx.keyed_state()?;
        let backend: &mut dyn KeyedStateBackend = &mut *guard;
        for r in batch {
            match r.value {
                TwoInputs::First(value) => {
                    let key = (self.key)(&value);
                    let f = &mut self.f;
                    let state = Some(&self.state);
                    self.core.element(
                        backend,
                        &key,
                        r.ts,
                        now,
                        max_parallelism,
                        state,
                        out,
                        |kctx, output| f.process_element(value, kctx, output),
                    )?;
                }
                TwoInputs::Second(control) => {
                    let mut bctx = BroadcastContext {
                        state: &mut self.state,
                        timestamp: r.ts,
                        watermark: now.watermark,
                        processing_time: now.processing,
                        side: &mut self.side,
                    };
                    self.f.process_broadcast_element(
                        control,
                        &mut bctx,
                        &mut Output { out: &mut *out, ts: r.ts },
                    )?;
                    self.side.drain_into(out);
                }
            }
        }
        Ok(())
    }

    fn on_watermark(
        &mut self,
        watermark: Timestamp,
        out: &mut Batch<Tagged<O>>,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        let (f, state) = (&mut self.f, Some(&self.state));
        self.core.fire(TimeDomain::EventTime, watermark, ctx, state, out, |ts, kctx, output| {
            f.on_timer(ts, kctx, output)
        })
    }

    fn on_processing_time(
        &mut self,
        now: Timestamp,
        out: &mut Batch<Tagged<O>>,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        let (f, state) = (&mut self.f, Some(&self.state));
        self.core.fire(TimeDomain::ProcessingTime, now, ctx, state, out, |ts, kctx, output| {
            f.on_timer(ts, kctx, output)
        })?;
        self.core.processing_time(now, ctx)
    }

    fn next_processing_time(&self) -> Option<Timestamp> {
        self.core.next_processing_time()
    }

    /// Subtask 0 snapshots the broadcast state (all subtasks hold the same); keyed state and
    /// timers are in the backend.
    fn snapshot(&mut self, _checkpoint: CheckpointId, ctx: &mut OperatorContext) -> Result<Option<Vec<u8>>> {
        self.core.at_barrier(ctx)?;
        if ctx.subtask != 0 {
            return Ok(None);
        }
        encode("(all)", &self.state).map(Some)
    }

    /// Every subtask starts from subtask 0's copy of the broadcast state.
    fn restore(&mut self, snapshots: Vec<Vec<u8>>, ctx: &mut OperatorContext) -> Result<()> {
        if let Some(copy) = snapshots.first() {
            self.state = decode("(all)", copy)?;
        }
        self.core.restore(ctx)
    }

    fn state_browser(&mut self) -> Option<&mut dyn StateBrowse> {
        Some(self)
    }
}

impl<K: Key, I: Data, C: Data, O: Data, F: KeyedBroadcastProcessFunction<K, I, C, O>> HasKeyedCore
    for KeyedBroadcastOperator<K, I, C, O, F>
{
    type Key = K;
    fn core_mut(&mut self) -> &mut KeyedCore {
        &mut self.core
    }
    fn core(&self) -> &KeyedCore {
        &self.core
    }
}

//! The operators that run process functions: per element, per due timer, and the TTL
//! cleanup between them.

use super::context::{Context, KeyedContext, Output};
use super::function::{KeyedProcessFunction, ProcessFunction};
use super::side_output::{SideRecords, Tagged};
use super::state::{Clocks, StateRegistry, TtlCleanup};
use super::timers::{TimeDomain, Timers};
use crate::keygroup::key_group_of;
use crate::operator::{Operator, OperatorContext, StateBrowse};
use crate::types::{Batch, CheckpointId, Data, Key, Timestamp};
use crate::{Error, Result};
use caudal_checkpoints::KeyedStateBackend;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::runtime::processing_clock::now_ms;

/// Entries the TTL cleanup reads at a barrier, and every second.
const CLEANUP_AT_BARRIER: usize = 4096;
const CLEANUP_PER_SECOND: usize = 1024;

fn key_codec_error(e: impl std::fmt::Display) -> Error {
    Error::Operator(format!("process function key: {e}"))
}

/// Runs a [`KeyedProcessFunction`] on one subtask.
pub(crate) struct KeyedProcessOperator<K, I, O, F> {
    f: F,
    key: Arc<dyn Fn(&I) -> K + Send + Sync>,
    timers: Timers,
    registry: StateRegistry,
    cleanup: TtlCleanup,
    next_cleanup: Timestamp,
    side: SideRecords,
    key_bytes: Vec<u8>,
    _t: PhantomData<fn(I) -> O>,
}

impl<K: Key, I: Data, O: Data, F: KeyedProcessFunction<K, I, O>> KeyedProcessOperator<K, I, O, F> {
    pub(crate) fn new(f: F, key: Arc<dyn Fn(&I) -> K + Send + Sync>) -> Self {
        KeyedProcessOperator {
            f,
            key,
            timers: Timers::default(),
            registry: StateRegistry::default(),
            cleanup: TtlCleanup::default(),
            next_cleanup: 0,
            side: SideRecords::default(),
            key_bytes: Vec::new(),
            _t: PhantomData,
        }
    }

    /// Fires the timers of `domain` due by `now`, in time order (those the function
    /// registers while firing included).
    fn fire(
        &mut self,
        domain: TimeDomain,
        now: Timestamp,
        out: &mut Batch<Tagged<O>>,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        if self.timers.of(domain).next().is_none_or(|t| t > now) {
            return Ok(());
        }
        let watermark = ctx.watermark;
        let processing_time = now_ms();
        let mut guard = ctx.keyed_state()?;
        let backend: &mut dyn KeyedStateBackend = &mut *guard;
        while let Some((ts, key_group, key_bytes)) = self.timers.of(domain).pop_due(backend, now)? {
            let (key, _): (K, usize) =
                bincode::serde::decode_from_slice(&key_bytes, bincode::config::standard())
                    .map_err(key_codec_error)?;
            let mut kctx = KeyedContext {
                key: &key,
                key_bytes: &key_bytes,
                key_group,
                timestamp: ts,
                watermark,
                processing_time,
                firing: Some(domain),
                backend: &mut *backend,
                timers: &mut self.timers,
                registry: &mut self.registry,
                side: &mut self.side,
            };
            let mut output = Output { out: &mut *out, ts };
            self.f.on_timer(ts, &mut kctx, &mut output)?;
            self.side.drain_into(out);
        }
        Ok(())
    }

    fn clean_expired(&mut self, ctx: &mut OperatorContext, budget: usize) -> Result<()> {
        if !self.registry.has_ttl() {
            return Ok(());
        }
        let now = now_ms();
        let clocks = Clocks { event_write: ctx.watermark, watermark: ctx.watermark, processing: now };
        let mut guard = ctx.keyed_state()?;
        self.cleanup.run(&mut *guard, &self.registry, clocks, budget)
    }
}

impl<K: Key, I: Data, O: Data, F: KeyedProcessFunction<K, I, O>> Operator
    for KeyedProcessOperator<K, I, O, F>
{
    type In = I;
    type Out = Tagged<O>;

    fn process_batch(
        &mut self,
        batch: Batch<I>,
        out: &mut Batch<Tagged<O>>,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        let (watermark, max_parallelism) = (ctx.watermark, ctx.max_parallelism);
        let processing_time = now_ms();
        let mut guard = ctx.keyed_state()?;
        let backend: &mut dyn KeyedStateBackend = &mut *guard;
        for r in batch {
            let key = (self.key)(&r.value);
            let key_group = key_group_of(&key, max_parallelism);
            self.key_bytes.clear();
            bincode::serde::encode_into_std_write(&key, &mut self.key_bytes, bincode::config::standard())
                .map_err(key_codec_error)?;
            let mut kctx = KeyedContext {
                key: &key,
                key_bytes: &self.key_bytes,
                key_group,
                timestamp: r.ts,
                watermark,
                processing_time,
                firing: None,
                backend: &mut *backend,
                timers: &mut self.timers,
                registry: &mut self.registry,
                side: &mut self.side,
            };
            let mut output = Output { out: &mut *out, ts: r.ts };
            self.f.process_element(r.value, &mut kctx, &mut output)?;
            self.side.drain_into(out);
        }
        Ok(())
    }

    fn on_watermark(
        &mut self,
        watermark: Timestamp,
        out: &mut Batch<Tagged<O>>,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        self.fire(TimeDomain::EventTime, watermark, out, ctx)
    }

    fn on_processing_time(
        &mut self,
        now: Timestamp,
        out: &mut Batch<Tagged<O>>,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        self.fire(TimeDomain::ProcessingTime, now, out, ctx)?;
        if now >= self.next_cleanup {
            self.next_cleanup = now + 1000;
            self.clean_expired(ctx, CLEANUP_PER_SECOND)?;
        }
        Ok(())
    }

    fn next_processing_time(&self) -> Option<Timestamp> {
        let cleanup = self.registry.has_ttl().then_some(self.next_cleanup);
        match (self.timers.processing.next(), cleanup) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Timers and state are in the keyed backend already; the TTL cleanup takes its turn.
    fn snapshot(&mut self, _checkpoint: CheckpointId, ctx: &mut OperatorContext) -> Result<Option<Vec<u8>>> {
        self.clean_expired(ctx, CLEANUP_AT_BARRIER)?;
        Ok(None)
    }

    /// The engine restored the backend (this subtask's key groups): rebuild the timer queues.
    fn restore(&mut self, _snapshots: Vec<Vec<u8>>, ctx: &mut OperatorContext) -> Result<()> {
        let guard = ctx.keyed_state()?;
        self.timers.rebuild(&*guard)
    }

    fn state_browser(&mut self) -> Option<&mut dyn StateBrowse> {
        Some(self)
    }
}

/// The state browser's hooks: keys decoded as the function's key type, values of every
/// state the subtask has used as JSON (with their TTL), timers by kind. Everything is in the
/// backend already: nothing to write through.
impl<K: Key, I: Data, O: Data, F: KeyedProcessFunction<K, I, O>> StateBrowse
    for KeyedProcessOperator<K, I, O, F>
{
    fn state_key_from_json(
        &self,
        key: &serde_json::Value,
        ctx: &OperatorContext,
    ) -> Option<Result<(u16, Vec<u8>)>> {
        let typed: K = match serde_json::from_value(key.clone()) {
            Ok(k) => k,
            Err(e) => {
                let ty = std::any::type_name::<K>();
                return Some(Err(Error::Operator(format!("{key} is not a key of type {ty}: {e}"))));
            }
        };
        let encoded =
            bincode::serde::encode_to_vec(&typed, bincode::config::standard()).map_err(key_codec_error);
        Some(encoded.map(|bytes| (key_group_of(&typed, ctx.max_parallelism), bytes)))
    }

    fn state_key_to_json(&self, key: &[u8]) -> Option<serde_json::Value> {
        let (k, _): (K, usize) = bincode::serde::decode_from_slice(key, bincode::config::standard()).ok()?;
        serde_json::to_value(k).ok()
    }

    fn state_value_to_json(&self, state: &str, value: &[u8]) -> Option<serde_json::Value> {
        match state {
            super::timers::EVENT_TIMERS => Some(serde_json::json!({ "timer": "event time" })),
            super::timers::PROCESSING_TIMERS => Some(serde_json::json!({ "timer": "processing time" })),
            name => self.registry.to_json(name, value),
        }
    }
}

/// Runs a [`ProcessFunction`] on one subtask.
pub(crate) struct ProcessOperator<I, O, F> {
    pub(crate) f: F,
    pub(crate) side: SideRecords,
    pub(crate) _t: PhantomData<fn(I) -> O>,
}

impl<I: Data, O: Data, F: ProcessFunction<I, O>> Operator for ProcessOperator<I, O, F> {
    type In = I;
    type Out = Tagged<O>;

    fn process_batch(
        &mut self,
        batch: Batch<I>,
        out: &mut Batch<Tagged<O>>,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        let processing_time = now_ms();
        for r in batch {
            let mut pctx =
                Context { timestamp: r.ts, watermark: ctx.watermark, processing_time, side: &mut self.side };
            let mut output = Output { out: &mut *out, ts: r.ts };
            self.f.process_element(r.value, &mut pctx, &mut output)?;
            self.side.drain_into(out);
        }
        Ok(())
    }
}

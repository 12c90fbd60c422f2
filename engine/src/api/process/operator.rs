//! The operators that run one-input process functions: keyed (per element, per due timer,
//! with the TTL cleanup between) and not keyed.

use super::context::{Context, Output};
use super::function::{KeyedProcessFunction, ProcessFunction};
use super::keyed_core::{HasKeyedCore, KeyedCore, Now};
use super::side_output::{SideRecords, Tagged};
use super::timers::TimeDomain;
use crate::operator::{Operator, OperatorContext, StateBrowse};
use crate::runtime::processing_clock::now_ms;
use crate::types::{Batch, CheckpointId, Data, Key, Timestamp};
use crate::Result;
use caudal_checkpoints::KeyedStateBackend;
use std::marker::PhantomData;
use std::sync::Arc;

/// Runs a [`KeyedProcessFunction`] on one subtask.
pub(crate) struct KeyedProcessOperator<K, I, O, F> {
    f: F,
    key: Arc<dyn Fn(&I) -> K + Send + Sync>,
    core: KeyedCore,
    /// The keys of the batch being processed.
    keys: Vec<K>,
    _t: PhantomData<fn(I) -> O>,
}

impl<K: Key, I: Data, O: Data, F: KeyedProcessFunction<K, I, O>> KeyedProcessOperator<K, I, O, F> {
    pub(crate) fn new(f: F, key: Arc<dyn Fn(&I) -> K + Send + Sync>) -> Self {
        KeyedProcessOperator { f, key, core: KeyedCore::default(), keys: Vec::new(), _t: PhantomData }
    }

    fn fire(
        &mut self,
        domain: TimeDomain,
        due: Timestamp,
        out: &mut Batch<Tagged<O>>,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        let f = &mut self.f;
        self.core.fire(domain, due, ctx, None, out, |ts, kctx, output| f.on_timer(ts, kctx, output))
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
        let (now, max_parallelism) = (Now::of(ctx), ctx.max_parallelism);
        let mut guard = ctx.keyed_state()?;
        let backend: &mut dyn KeyedStateBackend = &mut *guard;
        if !self.core.announcing(backend) {
            for r in batch {
                let key = (self.key)(&r.value);
                let f = &mut self.f;
                self.core.element(backend, &key, r.ts, now, max_parallelism, None, out, |kctx, output| {
                    f.process_element(r.value, kctx, output)
                })?;
            }
            return Ok(());
        }
        self.keys.clear();
        self.keys.extend(batch.iter().map(|r| (self.key)(&r.value)));
        self.core.encode_keys(&self.keys, max_parallelism)?;
        self.core.announce_first(backend);
        for (i, (r, key)) in batch.into_iter().zip(self.keys.drain(..)).enumerate() {
            let f = &mut self.f;
            self.core.batch_element(i, backend, &key, r.ts, now, out, |kctx, output| {
                f.process_element(r.value, kctx, output)
            })?;
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
        self.core.processing_time(now, ctx)
    }

    fn next_processing_time(&self) -> Option<Timestamp> {
        self.core.next_processing_time()
    }

    /// Timers and state are in the keyed backend already; the TTL cleanup takes its turn.
    fn snapshot(&mut self, _checkpoint: CheckpointId, ctx: &mut OperatorContext) -> Result<Option<Vec<u8>>> {
        self.core.at_barrier(ctx)?;
        Ok(None)
    }

    /// The engine restored the backend (this subtask's key groups): rebuild the timer queues.
    fn restore(&mut self, _snapshots: Vec<Vec<u8>>, ctx: &mut OperatorContext) -> Result<()> {
        self.core.restore(ctx)
    }

    fn state_browser(&mut self) -> Option<&mut dyn StateBrowse> {
        Some(self)
    }
}

impl<K: Key, I: Data, O: Data, F: KeyedProcessFunction<K, I, O>> HasKeyedCore
    for KeyedProcessOperator<K, I, O, F>
{
    type Key = K;
    fn core_mut(&mut self) -> &mut KeyedCore {
        &mut self.core
    }
    fn core(&self) -> &KeyedCore {
        &self.core
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

//! Chained operators inside one task: type-erased nodes that pass batches by value.
//!
//! A batch crosses a node boundary as `Box<dyn Any>` (one downcast per batch, never per
//! record). Fan-out to several consumers clones the batch for all but the last.

use crate::error::TaskLocation;
use crate::operator::{Operator, OperatorContext, Sink};
use crate::state_query;
use crate::types::{Batch, CheckpointBarrier, CheckpointId, Data, LatencyMarker, Timestamp};
use crate::{Error, Result};
use std::any::Any;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// A batch of some `Record<T>` type, boxed.
pub(crate) type AnyBatch = Box<dyn Any + Send>;

/// What one operator of a chain snapshotted at a barrier.
pub(crate) struct TakenSnapshot {
    /// The operator's uid in checkpoints.
    pub(crate) uid: String,
    /// Opaque operator state (a source's position, a sink's pending commits).
    pub(crate) operator_state: Option<Vec<u8>>,
    /// The synchronous part of its keyed-state snapshot, to upload before the ack.
    pub(crate) keyed: Option<crate::state::TakenKeyedSnapshot>,
}

impl TakenSnapshot {
    pub(crate) fn operator(uid: String, operator_state: Option<Vec<u8>>) -> Self {
        TakenSnapshot { uid, operator_state, keyed: None }
    }
}

/// Snapshots taken at a barrier, for every operator of the chain.
pub(crate) type SnapshotSink<'a> = &'a mut Vec<TakenSnapshot>;

/// A node of a task's operator tree.
pub(crate) trait ChainNode: Send {
    fn open(&mut self) -> Result<()>;
    fn process(&mut self, batch: AnyBatch) -> Result<()>;
    fn watermark(&mut self, wm: Timestamp) -> Result<()>;
    fn idle(&mut self) -> Result<()>;
    fn barrier(&mut self, barrier: CheckpointBarrier, snapshots: SnapshotSink<'_>) -> Result<()>;
    fn checkpoint_complete(&mut self, id: CheckpointId) -> Result<()>;
    /// End of input: close, flush and propagate `End`.
    fn end(&mut self) -> Result<()>;
    /// Answer the state browser's queries waiting for this node and the nodes after it
    /// (between batches; see [`crate::state_query`]).
    fn serve_state_queries(&mut self) -> Result<()> {
        Ok(())
    }
    /// A latency marker arrived: record its age, pass it on.
    fn latency_marker(&mut self, _marker: LatencyMarker) -> Result<()> {
        Ok(())
    }
    /// Wall-clock time is `now` (ms since the epoch): operators whose processing time is
    /// due fire; returns the earliest time this node or a node after it wants next.
    fn processing_time(&mut self, _now: Timestamp) -> Result<Option<Timestamp>> {
        Ok(None)
    }
}

/// The typed fan-out of a node to its consumers.
pub(crate) struct Fanout<T> {
    targets: Vec<Box<dyn ChainNode>>,
    _t: std::marker::PhantomData<fn(T)>,
}

impl<T: Data> Fanout<T> {
    pub(crate) fn new(targets: Vec<Box<dyn ChainNode>>) -> Self {
        Fanout { targets, _t: std::marker::PhantomData }
    }

    pub(crate) fn push(&mut self, batch: Batch<T>) -> Result<()> {
        match self.targets.len() {
            0 => Ok(()),
            1 => self.targets[0].process(Box::new(batch)),
            n => {
                for t in &mut self.targets[..n - 1] {
                    t.process(Box::new(batch.clone()))?;
                }
                self.targets[n - 1].process(Box::new(batch))
            }
        }
    }

    pub(crate) fn each(&mut self, mut f: impl FnMut(&mut dyn ChainNode) -> Result<()>) -> Result<()> {
        for t in &mut self.targets {
            f(t.as_mut())?;
        }
        Ok(())
    }

    /// [`ChainNode::processing_time`] of every consumer: the earliest time any wants next.
    pub(crate) fn processing_time(&mut self, now: Timestamp) -> Result<Option<Timestamp>> {
        let mut next: Option<Timestamp> = None;
        for t in &mut self.targets {
            if let Some(at) = t.processing_time(now)? {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        Ok(next)
    }
}

pub(crate) fn downcast<T: Data>(batch: AnyBatch, ctx: &OperatorContext) -> Result<Batch<T>> {
    batch.downcast::<Batch<T>>().map(|b| *b).map_err(|_| {
        Error::in_task(
            location(ctx),
            Error::Internal(format!("batch of unexpected type (expected {})", std::any::type_name::<T>())),
        )
    })
}

pub(crate) fn location(ctx: &OperatorContext) -> TaskLocation {
    TaskLocation {
        task: ctx.operator_name.clone(),
        operator: ctx.operator_name.clone(),
        subtask: ctx.subtask,
    }
}

/// Calls user code with the operator's context, turning an error or a panic into an error
/// that names the operator.
#[inline]
pub(crate) fn call<R>(
    ctx: &mut OperatorContext,
    f: impl FnOnce(&mut OperatorContext) -> Result<R>,
) -> Result<R> {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut *ctx)));
    match r {
        Ok(r) => r.map_err(|e| in_operator(e, ctx)),
        Err(p) => Err(Error::Panic { location: location(ctx), message: panic_message(p.as_ref()) }),
    }
}

/// The message of a panic payload.
pub(crate) fn panic_message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Adds the operator's location to an error that has none.
pub(crate) fn in_operator(e: Error, ctx: &OperatorContext) -> Error {
    match e {
        Error::Task { .. } | Error::Panic { .. } | Error::Cancelled => e,
        other => Error::in_task(location(ctx), other),
    }
}

/// An [`Operator`] with its output buffer and consumers.
pub(crate) struct OperatorNode<O: Operator> {
    op: O,
    ctx: OperatorContext,
    out: Batch<O::Out>,
    fanout: Fanout<O::Out>,
}

impl<O: Operator> OperatorNode<O> {
    pub(crate) fn new(op: O, ctx: OperatorContext, targets: Vec<Box<dyn ChainNode>>) -> Self {
        OperatorNode { op, ctx, out: Vec::new(), fanout: Fanout::new(targets) }
    }

    fn flush(&mut self) -> Result<()> {
        if self.out.is_empty() {
            return Ok(());
        }
        let out = std::mem::take(&mut self.out);
        self.ctx.metrics.add_out(out.len());
        self.fanout.push(out)
    }
}

impl<O: Operator> ChainNode for OperatorNode<O> {
    fn open(&mut self) -> Result<()> {
        let op = &mut self.op;
        let start = Instant::now();
        let mut restored_keyed = false;
        if let Some(keyed) = &self.ctx.keyed {
            restored_keyed = keyed.open_if_restoring().map_err(|e| in_operator(e, &self.ctx))?;
        }
        if let Some(snapshots) = self.ctx.restored.take() {
            call(&mut self.ctx, |ctx| op.restore(snapshots, ctx))?;
        }
        if restored_keyed {
            let ms = start.elapsed().as_millis() as u64;
            self.ctx
                .metrics
                .counter(crate::metrics::names::STATE_RESTORE_MS)
                .fetch_add(ms, Ordering::Relaxed);
        }
        call(&mut self.ctx, |ctx| op.on_start(ctx))?;
        self.fanout.each(|t| t.open())
    }

    fn process(&mut self, batch: AnyBatch) -> Result<()> {
        let batch = downcast::<O::In>(batch, &self.ctx)?;
        self.ctx.metrics.add_in(batch.len());
        let start = Instant::now();
        let (op, out) = (&mut self.op, &mut self.out);
        call(&mut self.ctx, |ctx| op.process_batch(batch, out, ctx))?;
        self.ctx
            .metrics
            .busy_ns
            .fetch_add(start.elapsed().as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
        self.flush()
    }

    fn watermark(&mut self, wm: Timestamp) -> Result<()> {
        self.ctx.watermark = wm;
        self.ctx.metrics.set_watermark(wm);
        let (op, out) = (&mut self.op, &mut self.out);
        call(&mut self.ctx, |ctx| op.on_watermark(wm, out, ctx))?;
        self.flush()?;
        self.fanout.each(|t| t.watermark(wm))
    }

    fn idle(&mut self) -> Result<()> {
        self.fanout.each(|t| t.idle())
    }

    fn barrier(&mut self, barrier: CheckpointBarrier, snapshots: SnapshotSink<'_>) -> Result<()> {
        let (op, out) = (&mut self.op, &mut self.out);
        call(&mut self.ctx, |ctx| op.prepare_snapshot_pre_barrier(barrier.id, out, ctx))?;
        self.flush()?;
        let op = &mut self.op;
        let start = Instant::now();
        let operator_state = call(&mut self.ctx, |ctx| op.snapshot(barrier.id, ctx))?;
        // The synchronous part of the keyed-state snapshot; the upload runs off this thread.
        let mut keyed = match &self.ctx.keyed {
            Some(k) => k.snapshot(&barrier).map_err(|e| in_operator(e, &self.ctx))?,
            None => None,
        };
        if let Some(k) = keyed.as_mut() {
            // Records waited for the operator's write-through and the backend's snapshot.
            k.sync = start.elapsed();
        }
        snapshots.push(TakenSnapshot { uid: self.ctx.operator_uid.clone(), operator_state, keyed });
        self.fanout.each(|t| t.barrier(barrier, snapshots))
    }

    fn checkpoint_complete(&mut self, id: CheckpointId) -> Result<()> {
        if let Some(k) = &self.ctx.keyed {
            k.notify_checkpoint_complete(id);
        }
        let op = &mut self.op;
        call(&mut self.ctx, |ctx| op.on_checkpoint_complete(id, ctx))?;
        self.fanout.each(|t| t.checkpoint_complete(id))
    }

    fn end(&mut self) -> Result<()> {
        let (op, out) = (&mut self.op, &mut self.out);
        call(&mut self.ctx, |ctx| op.on_close(out, ctx))?;
        self.flush()?;
        if let Some(k) = &self.ctx.keyed {
            k.close();
        }
        self.fanout.each(|t| t.end())
    }

    fn serve_state_queries(&mut self) -> Result<()> {
        if let (Some(rx), Some(keyed)) = (self.ctx.state_queries.clone(), self.ctx.keyed.clone()) {
            while let Ok(query) = rx.try_recv() {
                let mut undecoded = crate::operator::Undecoded;
                let browse: &mut dyn crate::operator::StateBrowse = match self.op.state_browser() {
                    Some(b) => b,
                    None => &mut undecoded,
                };
                // A lookup reads the operator's cache first (StateBrowse::cached_state): no flush.
                let prepared = match query.request {
                    state_query::StateRequest::Lookup { .. } => Ok(()),
                    _ => call(&mut self.ctx, |ctx| browse.prepare_state_read(ctx)),
                };
                let reply = match prepared {
                    Ok(()) => {
                        let decoder = Decoder { op: &*browse, ctx: &self.ctx };
                        state_query::answer(query.request, &keyed, &self.ctx.key_groups, &decoder)
                    }
                    Err(e) => state_query::StateReply::Failed(e.to_string()),
                };
                // The server may have given up waiting; nothing to do then.
                let _ = query.reply.send(reply);
            }
        }
        self.fanout.each(|t| t.serve_state_queries())
    }

    fn latency_marker(&mut self, marker: LatencyMarker) -> Result<()> {
        self.ctx.metrics.record_latency_us(marker.age_us());
        self.fanout.each(|t| t.latency_marker(marker))
    }

    fn processing_time(&mut self, now: Timestamp) -> Result<Option<Timestamp>> {
        if self.op.next_processing_time().is_some_and(|at| at <= now) {
            let (op, out) = (&mut self.op, &mut self.out);
            call(&mut self.ctx, |ctx| op.on_processing_time(now, out, ctx))?;
            self.flush()?;
        }
        let own = self.op.next_processing_time();
        let after = self.fanout.processing_time(now)?;
        Ok(match (own, after) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }
}

/// An operator's state hooks as the state browser's decoder.
struct Decoder<'a> {
    op: &'a dyn crate::operator::StateBrowse,
    ctx: &'a OperatorContext,
}

impl state_query::StateDecoder for Decoder<'_> {
    fn key_from_json(&self, key: &serde_json::Value) -> Option<Result<(u16, Vec<u8>)>> {
        self.op.state_key_from_json(key, self.ctx)
    }

    fn key_to_json(&self, key: &[u8]) -> Option<serde_json::Value> {
        self.op.state_key_to_json(key)
    }

    fn value_to_json(&self, state: &str, value: &[u8]) -> Option<serde_json::Value> {
        self.op.state_value_to_json(state, value)
    }

    fn cached(&self, key: &[u8]) -> Option<state_query::CachedEntries> {
        self.op.cached_state(key)
    }
}

/// A [`Sink`] at the end of a chain.
pub(crate) struct SinkNode<S: Sink> {
    sink: S,
    ctx: OperatorContext,
}

impl<S: Sink> SinkNode<S> {
    pub(crate) fn new(sink: S, ctx: OperatorContext) -> Self {
        SinkNode { sink, ctx }
    }
}

impl<S: Sink> ChainNode for SinkNode<S> {
    fn open(&mut self) -> Result<()> {
        let sink = &mut self.sink;
        if let Some(snapshots) = self.ctx.restored.take() {
            call(&mut self.ctx, |ctx| sink.restore(snapshots, ctx))?;
        }
        call(&mut self.ctx, |ctx| sink.on_start(ctx))
    }

    fn process(&mut self, batch: AnyBatch) -> Result<()> {
        let batch = downcast::<S::In>(batch, &self.ctx)?;
        let n = batch.len();
        self.ctx.metrics.add_in(n);
        let start = Instant::now();
        let sink = &mut self.sink;
        call(&mut self.ctx, |ctx| sink.write_batch(batch, ctx))?;
        self.ctx
            .metrics
            .busy_ns
            .fetch_add(start.elapsed().as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
        self.ctx.metrics.add_out(n);
        Ok(())
    }

    fn watermark(&mut self, wm: Timestamp) -> Result<()> {
        self.ctx.watermark = wm;
        self.ctx.metrics.set_watermark(wm);
        Ok(())
    }

    fn idle(&mut self) -> Result<()> {
        Ok(())
    }

    fn barrier(&mut self, barrier: CheckpointBarrier, snapshots: SnapshotSink<'_>) -> Result<()> {
        let sink = &mut self.sink;
        let s = call(&mut self.ctx, |ctx| sink.pre_commit(barrier.id, ctx))?;
        snapshots.push(TakenSnapshot::operator(self.ctx.operator_uid.clone(), s));
        crate::crash::point(crate::crash::AFTER_SINK_PRE_COMMIT, barrier.id);
        Ok(())
    }

    fn checkpoint_complete(&mut self, id: CheckpointId) -> Result<()> {
        let sink = &mut self.sink;
        call(&mut self.ctx, |ctx| sink.on_checkpoint_complete(id, ctx))
    }

    fn end(&mut self) -> Result<()> {
        let sink = &mut self.sink;
        call(&mut self.ctx, |ctx| sink.on_close(ctx))
    }

    fn latency_marker(&mut self, marker: LatencyMarker) -> Result<()> {
        self.ctx.metrics.record_latency_us(marker.age_us());
        Ok(())
    }
}

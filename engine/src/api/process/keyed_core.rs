//! What every keyed process operator shares: the current key's context for an element,
//! timer firing, the TTL cleanup, and the state browser's decoding.

use std::ops::Range;

use super::broadcast::BroadcastState;
use super::codec::{self, append_encoded};
use super::context::{KeyedContext, Output};
use super::side_output::{SideRecords, Tagged};
use super::state::{Clocks, StateRegistry, TtlCleanup};
use super::timers::{TimeDomain, Timers, EVENT_TIMERS, PROCESSING_TIMERS};
use crate::keygroup::key_group_of;
use crate::operator::{OperatorContext, StateBrowse};
use crate::runtime::processing_clock::now_ms;
use crate::types::{Batch, Key, Timestamp};
use crate::{Error, Result};
use caudal_checkpoints::{KeyedStateBackend, StateId, StateKey};

/// Elements ahead of the one processed whose state lookups are announced to the backend
/// ([`KeyedStateBackend::prefetch`]): enough to cover a memory read with the work of the
/// elements before it, few enough that what was read is still in the cache.
const ANNOUNCE_AHEAD: usize = 8;

/// Entries the TTL cleanup reads at a barrier, and every second.
const CLEANUP_AT_BARRIER: usize = 4096;
const CLEANUP_PER_SECOND: usize = 1024;

fn key_codec_error(e: impl std::fmt::Display) -> Error {
    Error::CorruptState(format!("process function key: {e}"))
}

/// A keyed process subtask's timers, known states and side records.
#[derive(Default)]
pub(crate) struct KeyedCore {
    timers: Timers,
    registry: StateRegistry,
    cleanup: TtlCleanup,
    next_cleanup: Timestamp,
    side: SideRecords,
    /// The keys of the batch, encoded once: each element's key group and the end of its
    /// key's bytes in `key_bytes`.
    keys: Vec<(u16, usize)>,
    key_bytes: Vec<u8>,
    /// The states whose lookups are announced for each element, and the elements handled
    /// since they were chosen.
    announced: Vec<StateId>,
    elements: usize,
    /// The state handles' buffer (see [`KeyedContext`]).
    buffer: Vec<u8>,
}

/// The times an element or timer is handled at.
#[derive(Clone, Copy)]
pub(crate) struct Now {
    pub(crate) watermark: Timestamp,
    pub(crate) processing: Timestamp,
}

impl Now {
    pub(crate) fn of(ctx: &OperatorContext) -> Self {
        Now { watermark: ctx.watermark, processing: now_ms() }
    }

    /// The clocks of an element or timer at `ts`.
    fn at(self, ts: Timestamp) -> Clocks {
        Clocks { event_write: ts, watermark: self.watermark, processing: self.processing }
    }
}

impl KeyedCore {
    /// Calls `call` with the context of `key` for an element at `ts`; its side records go
    /// into `out` after it.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) fn element<K: Key, O>(
        &mut self,
        backend: &mut dyn KeyedStateBackend,
        key: &K,
        ts: Timestamp,
        now: Now,
        max_parallelism: u32,
        broadcast: Option<&BroadcastState>,
        out: &mut Batch<Tagged<O>>,
        call: impl FnOnce(&mut KeyedContext<'_, K>, &mut Output<'_, O>) -> Result<()>,
    ) -> Result<()> {
        self.key_bytes.clear();
        append_encoded(key, &mut self.key_bytes).map_err(key_codec_error)?;
        let key_group = key_group_of(key, max_parallelism);
        self.call(key_group, 0..self.key_bytes.len(), backend, key, ts, now, broadcast, out, call)
    }

    /// Starts a batch: whether to announce its elements' state lookups to `backend` (see
    /// [`KeyedStateBackend::prefetch`]), which it finds useful now, for the states the
    /// elements since the last batch used at least every other time. If so, the batch goes
    /// through [`Self::encode_keys`], [`Self::announce_first`] and, per element,
    /// [`Self::batch_element`]; else through [`Self::element`].
    pub(crate) fn announcing(&mut self, backend: &dyn KeyedStateBackend) -> bool {
        self.registry.announced(self.elements, &mut self.announced);
        self.elements = 0;
        !self.announced.is_empty() && backend.prefetch_useful()
    }

    /// Encodes the keys of the batch's elements.
    pub(crate) fn encode_keys<'k, K: Key + 'k>(
        &mut self,
        keys: impl IntoIterator<Item = &'k K>,
        max_parallelism: u32,
    ) -> Result<()> {
        self.keys.clear();
        self.key_bytes.clear();
        keys.into_iter().try_for_each(|key| self.push_key(key, max_parallelism))
    }

    #[inline]
    fn push_key<K: Key>(&mut self, key: &K, max_parallelism: u32) -> Result<()> {
        append_encoded(key, &mut self.key_bytes).map_err(key_codec_error)?;
        self.keys.push((key_group_of(key, max_parallelism), self.key_bytes.len()));
        Ok(())
    }

    /// Element `i`'s key group and where its encoded key is in `key_bytes`.
    fn key_of(&self, i: usize) -> Option<(u16, Range<usize>)> {
        let (key_group, end) = *self.keys.get(i)?;
        let start = i.checked_sub(1).map_or(0, |p| self.keys[p].1);
        Some((key_group, start..end))
    }

    /// Announces the state lookups of the batch's first elements.
    pub(crate) fn announce_first(&self, backend: &mut dyn KeyedStateBackend) {
        (0..ANNOUNCE_AHEAD).for_each(|i| self.announce(backend, i));
    }

    fn announce(&self, backend: &mut dyn KeyedStateBackend, i: usize) {
        if let Some((key_group, key)) = self.key_of(i) {
            for id in &self.announced {
                backend.prefetch(&StateKey::new(key_group, id, &self.key_bytes[key.clone()]));
            }
        }
    }

    /// [`Self::element`] for the batch's element `i`, whose key is `key`; announces the
    /// lookups of the element [`ANNOUNCE_AHEAD`] after it first.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) fn batch_element<K: Key, O>(
        &mut self,
        i: usize,
        backend: &mut dyn KeyedStateBackend,
        key: &K,
        ts: Timestamp,
        now: Now,
        out: &mut Batch<Tagged<O>>,
        call: impl FnOnce(&mut KeyedContext<'_, K>, &mut Output<'_, O>) -> Result<()>,
    ) -> Result<()> {
        self.announce(backend, i + ANNOUNCE_AHEAD);
        let (key_group, bytes) =
            self.key_of(i).ok_or_else(|| Error::Operator(format!("no key for element {i}")))?;
        self.call(key_group, bytes, backend, key, ts, now, None, out, call)
    }

    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn call<K: Key, O>(
        &mut self,
        key_group: u16,
        key_bytes: Range<usize>,
        backend: &mut dyn KeyedStateBackend,
        key: &K,
        ts: Timestamp,
        now: Now,
        broadcast: Option<&BroadcastState>,
        out: &mut Batch<Tagged<O>>,
        call: impl FnOnce(&mut KeyedContext<'_, K>, &mut Output<'_, O>) -> Result<()>,
    ) -> Result<()> {
        self.elements += 1;
        let mut kctx = KeyedContext {
            key,
            key_bytes: &self.key_bytes[key_bytes],
            key_group,
            clocks: now.at(ts),
            firing: None,
            backend,
            timers: &mut self.timers,
            registry: &mut self.registry,
            side: &mut self.side,
            buffer: &mut self.buffer,
            broadcast,
        };
        call(&mut kctx, &mut Output { out: &mut *out, ts })?;
        self.side.drain_into(out);
        Ok(())
    }

    /// Fires the timers of `domain` due by `due`, in time order (those registered while
    /// firing included), each with `call`.
    pub(crate) fn fire<K: Key, O>(
        &mut self,
        domain: TimeDomain,
        due: Timestamp,
        ctx: &mut OperatorContext,
        broadcast: Option<&BroadcastState>,
        out: &mut Batch<Tagged<O>>,
        mut call: impl FnMut(Timestamp, &mut KeyedContext<'_, K>, &mut Output<'_, O>) -> Result<()>,
    ) -> Result<()> {
        if self.timers.of(domain).next().is_none_or(|t| t > due) {
            return Ok(());
        }
        let now = Now::of(ctx);
        let mut guard = ctx.keyed_state()?;
        let backend: &mut dyn KeyedStateBackend = &mut *guard;
        while let Some((ts, key_group, key_bytes)) = self.timers.of(domain).pop_due(due) {
            let key: K = codec::decode(&key_bytes).map_err(key_codec_error)?;
            let mut kctx = KeyedContext {
                key: &key,
                key_bytes: &key_bytes,
                key_group,
                clocks: now.at(ts),
                firing: Some(domain),
                backend: &mut *backend,
                timers: &mut self.timers,
                registry: &mut self.registry,
                side: &mut self.side,
                buffer: &mut self.buffer,
                broadcast,
            };
            call(ts, &mut kctx, &mut Output { out: &mut *out, ts })?;
            self.side.drain_into(out);
        }
        Ok(())
    }

    fn clean_expired(&mut self, ctx: &mut OperatorContext, budget: usize) -> Result<()> {
        if !self.registry.has_ttl() {
            return Ok(());
        }
        let clocks = Clocks { event_write: ctx.watermark, watermark: ctx.watermark, processing: now_ms() };
        let mut guard = ctx.keyed_state()?;
        self.cleanup.run(&mut *guard, &self.registry, clocks, budget)
    }

    /// At a barrier: the timers' changes written through (the state is in the backend
    /// already), and the TTL cleanup's turn.
    pub(crate) fn at_barrier(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        self.write_through(ctx)?;
        self.clean_expired(ctx, CLEANUP_AT_BARRIER)
    }

    /// Writes the timers' changes through to the backend (before a snapshot or a state
    /// browser's listing).
    pub(crate) fn write_through(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        let mut guard = ctx.keyed_state()?;
        self.timers.write_through(&mut *guard)
    }

    /// Processing time reached `now`: the TTL cleanup's turn, once a second.
    pub(crate) fn processing_time(&mut self, now: Timestamp, ctx: &mut OperatorContext) -> Result<()> {
        if now >= self.next_cleanup {
            self.next_cleanup = now + 1000;
            self.clean_expired(ctx, CLEANUP_PER_SECOND)?;
        }
        Ok(())
    }

    /// The next processing time the operator wants: a timer, or the cleanup's turn.
    pub(crate) fn next_processing_time(&self) -> Option<Timestamp> {
        let cleanup = self.registry.has_ttl().then_some(self.next_cleanup);
        match (self.timers.processing.next(), cleanup) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The backend was restored: rebuild the timer queues.
    pub(crate) fn restore(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        let guard = ctx.keyed_state()?;
        self.timers.rebuild(&*guard)
    }

    /// The state browser: a key given as JSON, its key group and encoding.
    pub(crate) fn key_from_json<K: Key>(
        key: &serde_json::Value,
        max_parallelism: u32,
    ) -> Result<(u16, Vec<u8>)> {
        let typed: K = serde_json::from_value(key.clone()).map_err(|e| {
            Error::Operator(format!("{key} is not a key of type {}: {e}", std::any::type_name::<K>()))
        })?;
        let encoded = codec::encode_to_vec(&typed).map_err(key_codec_error)?;
        Ok((key_group_of(&typed, max_parallelism), encoded))
    }

    /// The state browser: a stored key as JSON.
    pub(crate) fn key_to_json<K: Key>(key: &[u8]) -> Option<serde_json::Value> {
        serde_json::to_value(codec::decode::<K>(key).ok()?).ok()
    }

    /// The state browser: a stored value as JSON (timers by kind, states the subtask used).
    pub(crate) fn value_to_json(&self, state: &str, value: &[u8]) -> Option<serde_json::Value> {
        match state {
            EVENT_TIMERS => Some(serde_json::json!({ "timer": "event time" })),
            PROCESSING_TIMERS => Some(serde_json::json!({ "timer": "processing time" })),
            name => self.registry.to_json(name, value),
        }
    }
}

/// A keyed process operator: the state browser's hooks come from its core.
pub(crate) trait HasKeyedCore {
    /// The function's key type.
    type Key: Key;
    fn core(&self) -> &KeyedCore;
    fn core_mut(&mut self) -> &mut KeyedCore;
}

/// Keys decoded as the function's key type, values of every state the subtask has used as
/// JSON (with their TTL), timers by kind; a listing first writes the timers through.
impl<T: HasKeyedCore> StateBrowse for T {
    fn prepare_state_read(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        self.core_mut().write_through(ctx)
    }

    fn state_key_from_json(
        &self,
        key: &serde_json::Value,
        ctx: &OperatorContext,
    ) -> Option<Result<(u16, Vec<u8>)>> {
        Some(KeyedCore::key_from_json::<T::Key>(key, ctx.max_parallelism))
    }

    fn state_key_to_json(&self, key: &[u8]) -> Option<serde_json::Value> {
        KeyedCore::key_to_json::<T::Key>(key)
    }

    fn state_value_to_json(&self, state: &str, value: &[u8]) -> Option<serde_json::Value> {
        self.core().value_to_json(state, value)
    }
}

//! What a process function sees while it handles an element or a timer: the contexts
//! (time, the current key, its state and timers, side outputs) and the output collector.

use super::side_output::{OutputTag, SideRecords, Tagged};
use super::state::{
    AggregatingHandle, AggregatingStateDescriptor, Clocks, ListHandle, ListStateDescriptor, MapHandle,
    MapStateDescriptor, ReducingHandle, ReducingStateDescriptor, Scope, StateRegistry, ValueHandle,
    ValueStateDescriptor,
};
use super::timers::{TimeDomain, Timers};
use crate::types::{Batch, Data, Record, Timestamp};
use crate::Result;
use caudal_checkpoints::KeyedStateBackend;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Where a process function's main output goes.
pub struct Output<'a, O> {
    pub(crate) out: &'a mut Batch<Tagged<O>>,
    /// The timestamp `collect` gives: the element's, or the firing timer's.
    pub(crate) ts: Timestamp,
}

impl<O> Output<'_, O> {
    /// Emits `value` with the timestamp of the element (or the firing timer).
    pub fn collect(&mut self, value: O) {
        self.out.push(Record::new(self.ts, Tagged::Main(value)));
    }

    /// Emits `value` with event time `ts`.
    pub fn collect_at(&mut self, ts: Timestamp, value: O) {
        self.out.push(Record::new(ts, Tagged::Main(value)));
    }
}

/// The context of a (non-keyed) process function.
pub struct Context<'a> {
    pub(crate) timestamp: Timestamp,
    pub(crate) watermark: Timestamp,
    pub(crate) processing_time: Timestamp,
    pub(crate) side: &'a mut SideRecords,
}

impl Context<'_> {
    /// The element's event time.
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

    /// Emits `value` to the side output `tag` (read it with `DataStream::side_output`), with
    /// the element's timestamp.
    pub fn output<S: Data>(&mut self, tag: &OutputTag<S>, value: S) -> Result<()> {
        self.side.push(tag, self.timestamp, &value)
    }
}

/// The context of a keyed process function: the current key, its state and timers.
pub struct KeyedContext<'a, K> {
    pub(crate) key: &'a K,
    pub(crate) key_bytes: &'a [u8],
    pub(crate) key_group: u16,
    /// The element's (or firing timer's) time, the watermark and the wall clock. The state
    /// handles take them by reference: only a state with a TTL reads them.
    pub(crate) clocks: Clocks,
    pub(crate) firing: Option<TimeDomain>,
    pub(crate) backend: &'a mut dyn KeyedStateBackend,
    pub(crate) timers: &'a mut Timers,
    pub(crate) registry: &'a mut StateRegistry,
    pub(crate) side: &'a mut SideRecords,
    /// The state handles' read and encode buffer.
    pub(crate) buffer: &'a mut Vec<u8>,
    /// The broadcast state, read-only (functions connected to a broadcast stream).
    pub(crate) broadcast: Option<&'a super::broadcast::BroadcastState>,
}

impl<K> KeyedContext<'_, K> {
    /// The key of the element (or of the firing timer).
    pub fn key(&self) -> &K {
        self.key
    }

    /// The element's event time, or the firing timer's time.
    pub fn timestamp(&self) -> Timestamp {
        self.clocks.event_write
    }

    /// The operator's current input watermark.
    pub fn current_watermark(&self) -> Timestamp {
        self.clocks.watermark
    }

    /// Wall-clock time, ms since the epoch (read once per batch).
    pub fn current_processing_time(&self) -> Timestamp {
        self.clocks.processing
    }

    /// In `on_timer`: which kind of timer fires; `None` in `process_element`.
    pub fn time_domain(&self) -> Option<TimeDomain> {
        self.firing
    }

    /// Fires `on_timer` for this key once the watermark reaches `ts` (one timer per key and
    /// time: registering it again does nothing). Checkpointed with the key's state.
    pub fn register_event_time_timer(&mut self, ts: Timestamp) -> Result<()> {
        self.timers.event.register(ts, self.key_group, self.key_bytes);
        Ok(())
    }

    /// Deletes this key's event-time timer at `ts`, if any.
    pub fn delete_event_time_timer(&mut self, ts: Timestamp) -> Result<()> {
        self.timers.event.delete(ts, self.key_group, self.key_bytes);
        Ok(())
    }

    /// Fires `on_timer` for this key once the wall clock reaches `ts` (ms since the epoch).
    pub fn register_processing_time_timer(&mut self, ts: Timestamp) -> Result<()> {
        self.timers.processing.register(ts, self.key_group, self.key_bytes);
        Ok(())
    }

    /// Deletes this key's processing-time timer at `ts`, if any.
    pub fn delete_processing_time_timer(&mut self, ts: Timestamp) -> Result<()> {
        self.timers.processing.delete(ts, self.key_group, self.key_bytes);
        Ok(())
    }

    fn scope(&mut self) -> Scope<'_> {
        Scope {
            backend: &mut *self.backend,
            key_group: self.key_group,
            key: self.key_bytes,
            clocks: &self.clocks,
            hint: None,
            registry: &mut *self.registry,
            buffer: &mut *self.buffer,
        }
    }

    /// The current key's value of `state`.
    pub fn value<'s, V: Serialize + DeserializeOwned>(
        &'s mut self,
        state: &'s ValueStateDescriptor<V>,
    ) -> ValueHandle<'s, V> {
        ValueHandle::new(self.scope(), state)
    }

    /// The current key's list of `state`.
    pub fn list<'s, V: Serialize + DeserializeOwned>(
        &'s mut self,
        state: &'s ListStateDescriptor<V>,
    ) -> ListHandle<'s, V> {
        ListHandle::new(self.scope(), state)
    }

    /// The current key's map of `state`.
    pub fn map<'s, UK: Serialize + DeserializeOwned, V: Serialize + DeserializeOwned>(
        &'s mut self,
        state: &'s MapStateDescriptor<UK, V>,
    ) -> MapHandle<'s, UK, V> {
        MapHandle::new(self.scope(), state)
    }

    /// The current key's reduced value of `state`.
    pub fn reducing<'s, V: Serialize + DeserializeOwned>(
        &'s mut self,
        state: &'s ReducingStateDescriptor<V>,
    ) -> ReducingHandle<'s, V> {
        ReducingHandle::new(self.scope(), state)
    }

    /// The current key's accumulator of `state`.
    pub fn aggregating<'s, I, ACC: Serialize + DeserializeOwned + Default>(
        &'s mut self,
        state: &'s AggregatingStateDescriptor<I, ACC>,
    ) -> AggregatingHandle<'s, I, ACC> {
        AggregatingHandle::new(self.scope(), state)
    }

    /// Emits `value` to the side output `tag`, with the element's (or timer's) timestamp.
    pub fn output<S: Data>(&mut self, tag: &OutputTag<S>, value: S) -> Result<()> {
        self.side.push(tag, self.clocks.event_write, &value)
    }
}

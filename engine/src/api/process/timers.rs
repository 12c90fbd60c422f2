//! Timers of keyed process functions: event-time and processing-time, at most one per key
//! and timestamp.
//!
//! Each timer is an entry of the subtask's keyed-state backend (state `_timer.event` or
//! `_timer.proc`, the timer's key, its timestamp as the namespace), written when it is
//! registered and deleted when it fires or is deleted, so timers are in every checkpoint,
//! placed by key group, and follow their keys when a job is rescaled. A queue in memory
//! orders them by time; after a restore it is rebuilt from the backend (one contiguous scan
//! per key group and timer state).

use crate::types::Timestamp;
use crate::Result;
use caudal_checkpoints::keys::decode_key;
use caudal_checkpoints::{KeyedStateBackend, StateId, StateKey};
use std::collections::BTreeSet;

/// Which clock a timer runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimeDomain {
    /// Fires when the watermark reaches its time.
    EventTime,
    /// Fires when the wall clock reaches its time.
    ProcessingTime,
}

/// The namespace of a timer entry: its timestamp, ordered as bytes like the numbers.
fn encode_time(ts: Timestamp) -> [u8; 8] {
    ((ts as u64) ^ (1 << 63)).to_be_bytes()
}

fn decode_time(bytes: &[u8]) -> Option<Timestamp> {
    let b: [u8; 8] = bytes.try_into().ok()?;
    Some((u64::from_be_bytes(b) ^ (1 << 63)) as i64)
}

/// The state names of the timers in the backend.
pub(crate) const EVENT_TIMERS: &str = "_timer.event";
pub(crate) const PROCESSING_TIMERS: &str = "_timer.proc";

/// A due timer: its time, and the key group and encoded key it belongs to.
pub(crate) type DueTimer = (Timestamp, u16, Vec<u8>);

/// The timers of one domain.
pub(crate) struct TimerQueue {
    state: StateId,
    queue: BTreeSet<DueTimer>,
}

impl TimerQueue {
    fn new(name: &str) -> Self {
        // Constant, valid names.
        TimerQueue {
            state: StateId::new(name).unwrap_or_else(|_| unreachable!("valid name")),
            queue: BTreeSet::new(),
        }
    }

    fn entry<'a>(&'a self, key_group: u16, key: &'a [u8], time: &'a [u8; 8]) -> StateKey<'a> {
        let mut sk = StateKey::new(key_group, &self.state, key);
        sk.namespace = time;
        sk
    }

    /// Registers a timer (nothing when the key has one at `ts` already).
    pub(crate) fn register(
        &mut self,
        backend: &mut dyn KeyedStateBackend,
        ts: Timestamp,
        key_group: u16,
        key: &[u8],
    ) -> Result<()> {
        if self.queue.insert((ts, key_group, key.to_vec())) {
            let time = encode_time(ts);
            backend.put(&self.entry(key_group, key, &time), &[])?;
        }
        Ok(())
    }

    /// Deletes a timer (nothing when there is none).
    pub(crate) fn delete(
        &mut self,
        backend: &mut dyn KeyedStateBackend,
        ts: Timestamp,
        key_group: u16,
        key: &[u8],
    ) -> Result<()> {
        if self.queue.remove(&(ts, key_group, key.to_vec())) {
            let time = encode_time(ts);
            backend.delete(&self.entry(key_group, key, &time))?;
        }
        Ok(())
    }

    /// Takes the earliest timer due by `now` off the queue and the backend.
    pub(crate) fn pop_due(
        &mut self,
        backend: &mut dyn KeyedStateBackend,
        now: Timestamp,
    ) -> Result<Option<DueTimer>> {
        if self.queue.first().is_none_or(|t| t.0 > now) {
            return Ok(None);
        }
        let Some(timer) = self.queue.pop_first() else { return Ok(None) };
        let time = encode_time(timer.0);
        backend.delete(&self.entry(timer.1, &timer.2, &time))?;
        Ok(Some(timer))
    }

    /// The earliest timer's time.
    pub(crate) fn next(&self) -> Option<Timestamp> {
        self.queue.first().map(|t| t.0)
    }

    /// Number of timers.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// Rebuilds the queue from the backend (after a restore).
    fn rebuild(&mut self, backend: &dyn KeyedStateBackend) -> Result<()> {
        self.queue.clear();
        for kg in backend.key_groups().iter() {
            let mut prefix = Vec::new();
            StateKey::new(kg, &self.state, &[]).encode_into(&mut prefix)?;
            prefix.truncate(2 + 1 + self.state.name().len());
            let mut after = Some(prefix.clone());
            while let Some(from) = after.take() {
                let page = backend.list_entries(kg, Some(&from), 4096)?;
                let mut past = false;
                for e in &page.entries {
                    if !e.key.starts_with(&prefix) {
                        past = true;
                        break;
                    }
                    let Some(d) = decode_key(&e.key) else { continue };
                    if let Some(ts) = decode_time(d.namespace) {
                        self.queue.insert((ts, kg, d.key.to_vec()));
                    }
                }
                if !past {
                    after = page.next;
                }
            }
        }
        Ok(())
    }
}

/// A keyed process subtask's timers, both domains.
pub(crate) struct Timers {
    pub(crate) event: TimerQueue,
    pub(crate) processing: TimerQueue,
}

impl Default for Timers {
    fn default() -> Self {
        Timers { event: TimerQueue::new(EVENT_TIMERS), processing: TimerQueue::new(PROCESSING_TIMERS) }
    }
}

impl Timers {
    /// The queue of `domain`.
    pub(crate) fn of(&mut self, domain: TimeDomain) -> &mut TimerQueue {
        match domain {
            TimeDomain::EventTime => &mut self.event,
            TimeDomain::ProcessingTime => &mut self.processing,
        }
    }

    /// Rebuilds both queues from the backend (after a restore).
    pub(crate) fn rebuild(&mut self, backend: &dyn KeyedStateBackend) -> Result<()> {
        self.event.rebuild(backend)?;
        self.processing.rebuild(backend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use caudal_checkpoints::{HeapStateBackend, KeyGroupRange};

    #[test]
    fn times_order_as_bytes_like_numbers() {
        let times = [i64::MIN, -5, -1, 0, 1, 7, 1_767_225_600_000, i64::MAX];
        for w in times.windows(2) {
            assert!(encode_time(w[0]) < encode_time(w[1]), "{w:?}");
        }
        for t in times {
            assert_eq!(decode_time(&encode_time(t)), Some(t));
        }
    }

    #[test]
    fn timers_survive_a_rebuild_from_the_backend_and_fire_in_time_order() {
        let mut backend = HeapStateBackend::new(KeyGroupRange::all(8));
        let mut timers = Timers::default();
        timers.event.register(&mut backend, 30, 1, b"a").unwrap();
        timers.event.register(&mut backend, 10, 5, b"b").unwrap();
        timers.event.register(&mut backend, 10, 5, b"b").unwrap(); // once per key and time
        timers.event.register(&mut backend, 20, 1, b"a").unwrap();
        timers.processing.register(&mut backend, 99, 2, b"c").unwrap();
        timers.event.delete(&mut backend, 20, 1, b"a").unwrap();
        let mut rebuilt = Timers::default();
        rebuilt.rebuild(&backend).unwrap();
        assert_eq!(rebuilt.event.len(), 2);
        assert_eq!(rebuilt.processing.next(), Some(99));
        assert_eq!(rebuilt.event.pop_due(&mut backend, 15).unwrap(), Some((10, 5, b"b".to_vec())));
        assert_eq!(rebuilt.event.pop_due(&mut backend, 15).unwrap(), None);
        assert_eq!(rebuilt.event.pop_due(&mut backend, 30).unwrap(), Some((30, 1, b"a".to_vec())));
        let mut again = Timers::default();
        again.rebuild(&backend).unwrap();
        assert_eq!((again.event.len(), again.processing.len()), (0, 1), "fired timers leave the backend");
    }
}

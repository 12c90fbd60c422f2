//! Timers of keyed process functions: event-time and processing-time, at most one per key
//! and timestamp.
//!
//! In memory, timers wait in buckets by time (a B-tree of times, each with its keys) with a
//! set of the live ones, so registering, deleting and firing cost a hash and a push or a
//! pop whatever the number of timers (a deleted timer stays in its bucket until its time and
//! is skipped then). At each barrier the timers registered or removed since the last one
//! are written through to the subtask's keyed-state backend (state `_timer.event` or
//! `_timer.proc`, the timer's key, its timestamp as the namespace): timers are in every
//! checkpoint, placed by key group, and follow their keys when a job is rescaled; a timer
//! registered and gone between two barriers never reaches the backend. After a restore the
//! queue is rebuilt from the backend (one contiguous scan per key group and timer state).

use crate::types::Timestamp;
use crate::Result;
use caudal_checkpoints::keys::decode_key;
use caudal_checkpoints::{KeyedStateBackend, StateId, StateKey, StateWriteBatch};
use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::Arc;

type Fast = BuildHasherDefault<crate::keygroup::StableHasher>;

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

/// A timer as kept in memory (the key shared by its bucket entry and the live set).
#[derive(Clone)]
struct Timer(Timestamp, u16, Arc<[u8]>);

/// A timer's identity, owned ([`Timer`]) or borrowed from the caller: the live set is
/// looked up without copying the key.
trait TimerId {
    fn id(&self) -> (Timestamp, u16, &[u8]);
}

impl TimerId for Timer {
    fn id(&self) -> (Timestamp, u16, &[u8]) {
        (self.0, self.1, &self.2)
    }
}

impl TimerId for (Timestamp, u16, &[u8]) {
    fn id(&self) -> (Timestamp, u16, &[u8]) {
        *self
    }
}

impl Hash for dyn TimerId + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id().hash(state)
    }
}

impl PartialEq for dyn TimerId + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.id() == other.id()
    }
}

impl Eq for dyn TimerId + '_ {}

impl Hash for Timer {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id().hash(state)
    }
}

impl PartialEq for Timer {
    fn eq(&self, other: &Self) -> bool {
        self.id() == other.id()
    }
}

impl Eq for Timer {}

impl<'a> Borrow<dyn TimerId + 'a> for Timer {
    fn borrow(&self) -> &(dyn TimerId + 'a) {
        self
    }
}

/// A bucket's entry: the key group and key of a timer at the bucket's time.
type Keyed = (u16, Arc<[u8]>);

/// What the backend must learn at the next write-through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// Registered since (not in the backend yet).
    Added,
    /// Gone since (in the backend).
    Removed,
}

/// The timers of one domain.
pub(crate) struct TimerQueue {
    state: StateId,
    buckets: BTreeMap<Timestamp, Vec<Keyed>>,
    live: HashSet<Timer, Fast>,
    changes: HashMap<Timer, Change, Fast>,
}

impl TimerQueue {
    fn new(name: &str) -> Self {
        TimerQueue {
            // Constant, valid names.
            state: StateId::new(name).unwrap_or_else(|_| unreachable!("valid name")),
            buckets: BTreeMap::new(),
            live: HashSet::default(),
            changes: HashMap::default(),
        }
    }

    fn note(&mut self, timer: Timer, change: Change) {
        match (self.changes.get(&timer), change) {
            // Added and gone between two write-throughs: the backend never hears of it.
            (Some(Change::Added), Change::Removed) => {
                self.changes.remove(&timer);
            }
            // Gone, then registered again: the backend still has it.
            (Some(Change::Removed), Change::Added) => {
                self.changes.remove(&timer);
            }
            _ => {
                self.changes.insert(timer, change);
            }
        }
    }

    /// Registers a timer (nothing when the key has one at `ts` already).
    pub(crate) fn register(&mut self, ts: Timestamp, key_group: u16, key: &[u8]) {
        // One hash for a new timer (the usual case), at the price of a copy of the key for
        // one that exists.
        let timer = Timer(ts, key_group, Arc::from(key));
        if self.live.insert(timer.clone()) {
            self.buckets.entry(ts).or_default().push((key_group, timer.2.clone()));
            self.note(timer, Change::Added);
        }
    }

    /// Deletes a timer (nothing when there is none).
    pub(crate) fn delete(&mut self, ts: Timestamp, key_group: u16, key: &[u8]) {
        if let Some(timer) = self.live.take(&(ts, key_group, key) as &dyn TimerId) {
            self.note(timer, Change::Removed);
        }
    }

    /// Takes the earliest live timer due by `now` off the queue.
    pub(crate) fn pop_due(&mut self, now: Timestamp) -> Option<DueTimer> {
        loop {
            let mut first = self.buckets.first_entry()?;
            let ts = *first.key();
            if ts > now {
                return None;
            }
            let Some((key_group, key)) = first.get_mut().pop() else {
                first.remove();
                continue;
            };
            if first.get().is_empty() {
                first.remove();
            }
            let timer = Timer(ts, key_group, key);
            if self.live.remove(&timer) {
                let due = (ts, key_group, timer.2.to_vec());
                self.note(timer, Change::Removed);
                return Some(due);
            }
            // A deleted (or already fired) timer's entry: skip it.
        }
    }

    /// The earliest time a timer may be due at (a deleted one's, until its bucket is passed).
    pub(crate) fn next(&self) -> Option<Timestamp> {
        self.buckets.keys().next().copied()
    }

    /// Number of live timers.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.live.len()
    }

    /// Writes the timers registered and removed since the last write-through to the backend.
    pub(crate) fn write_through(&mut self, backend: &mut dyn KeyedStateBackend) -> Result<()> {
        if self.changes.is_empty() {
            return Ok(());
        }
        let mut batch = StateWriteBatch::new();
        for (Timer(ts, key_group, key), change) in self.changes.drain() {
            let time = encode_time(ts);
            let mut sk = StateKey::new(key_group, &self.state, &key);
            sk.namespace = &time;
            match change {
                Change::Added => batch.put(&sk, &[])?,
                Change::Removed => batch.delete(&sk)?,
            }
        }
        Ok(backend.write_batch(batch)?)
    }

    /// Rebuilds the queue from the backend (after a restore).
    fn rebuild(&mut self, backend: &dyn KeyedStateBackend) -> Result<()> {
        self.buckets.clear();
        self.live.clear();
        self.changes.clear();
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
                        let timer = Timer(ts, kg, Arc::from(d.key));
                        if self.live.insert(timer.clone()) {
                            self.buckets.entry(ts).or_default().push((kg, timer.2));
                        }
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

    /// Writes both queues' changes through to the backend (at a barrier).
    pub(crate) fn write_through(&mut self, backend: &mut dyn KeyedStateBackend) -> Result<()> {
        self.event.write_through(backend)?;
        self.processing.write_through(backend)
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
        timers.event.register(30, 1, b"a");
        timers.event.register(10, 5, b"b");
        timers.event.register(10, 5, b"b"); // once per key and time
        timers.event.register(20, 1, b"a");
        timers.processing.register(99, 2, b"c");
        timers.event.delete(20, 1, b"a");
        timers.event.register(40, 3, b"gone");
        timers.event.delete(40, 3, b"gone"); // never reaches the backend
        timers.write_through(&mut backend).unwrap();
        assert_eq!(backend.key_group_stats().unwrap().iter().map(|s| s.entries).sum::<u64>(), 3);
        let mut rebuilt = Timers::default();
        rebuilt.rebuild(&backend).unwrap();
        assert_eq!(rebuilt.event.len(), 2);
        assert_eq!(rebuilt.processing.next(), Some(99));
        assert_eq!(rebuilt.event.pop_due(15), Some((10, 5, b"b".to_vec())));
        assert_eq!(rebuilt.event.pop_due(15), None);
        assert_eq!(rebuilt.event.pop_due(30), Some((30, 1, b"a".to_vec())));
        rebuilt.write_through(&mut backend).unwrap();
        let mut again = Timers::default();
        again.rebuild(&backend).unwrap();
        assert_eq!((again.event.len(), again.processing.len()), (0, 1), "fired timers leave the backend");
    }

    #[test]
    fn a_timer_deleted_and_registered_again_fires_once() {
        let mut timers = Timers::default();
        timers.event.register(10, 0, b"k");
        timers.event.delete(10, 0, b"k");
        timers.event.register(10, 0, b"k");
        assert_eq!(timers.event.pop_due(10), Some((10, 0, b"k".to_vec())));
        assert_eq!(timers.event.pop_due(10), None, "its stale entry is skipped");
    }
}

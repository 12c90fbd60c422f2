//! Timers of keyed process functions: event-time and processing-time, at most one per key
//! and timestamp.
//!
//! In memory, timers wait in buckets by time (a B-tree of times: the timers of many keys
//! often share a time), each with its timers in the order they were registered and an index
//! of their positions by key, so registering, deleting and firing cost one lookup of the
//! time, one hash and a push or a pop whatever the number of timers (a deleted timer stays
//! in its bucket's order until its turn and is skipped then). Timers of one time are usually
//! registered together, in the order they are deleted or fired in later, so a bucket's index
//! (a position per timer) stays warm in cache and its timers are read in order. A bucket
//! whose timers all fired or were deleted goes at once, and the next new time reuses its
//! memory (a timer moved per record, as a silence detector does, keeps two buckets' worth,
//! not one per time still ahead). A key of up to [`INLINE_KEY`] bytes (a number, a short
//! string) is stored inline: a timer costs no allocation and its lookup no pointer chase.
//!
//! At each barrier the timers registered or removed since the last one are written through
//! (one pass over the indexes: no list of changes to keep between barriers) to the
//! subtask's keyed-state backend (state `_timer.event` or `_timer.proc`, the timer's key,
//! its timestamp as the namespace): timers are in every checkpoint, placed by key group, and
//! follow their keys when a job is rescaled; a timer registered and gone between two barriers
//! never reaches the backend. After a restore the queue is rebuilt from the backend (one
//! contiguous scan per key group and timer state).

use crate::types::Timestamp;
use crate::Result;
use caudal_checkpoints::keys::decode_key;
use caudal_checkpoints::{KeyedStateBackend, StateId, StateKey, StateWriteBatch};
use hashbrown::HashTable;
use std::collections::{btree_map, BTreeMap};
use std::ops::Deref;
use std::sync::Arc;

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

/// The longest encoded key a timer keeps inline.
pub(crate) const INLINE_KEY: usize = 22;

/// A timer's encoded key: inline up to [`INLINE_KEY`] bytes, shared beyond (a timer fired
/// or deleted that the backend holds is also on the list of those to delete there).
#[derive(Clone)]
pub(crate) enum TimerKey {
    Inline(u8, [u8; INLINE_KEY]),
    Shared(Arc<[u8]>),
}

impl TimerKey {
    fn new(key: &[u8]) -> TimerKey {
        match u8::try_from(key.len()) {
            Ok(len) if key.len() <= INLINE_KEY => {
                let mut bytes = [0; INLINE_KEY];
                bytes[..key.len()].copy_from_slice(key);
                TimerKey::Inline(len, bytes)
            }
            _ => TimerKey::Shared(Arc::from(key)),
        }
    }
}

impl Deref for TimerKey {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            TimerKey::Inline(len, bytes) => &bytes[..usize::from(*len)],
            TimerKey::Shared(key) => key,
        }
    }
}

impl std::fmt::Debug for TimerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", &**self)
    }
}

/// A due timer: its time, and the key group and encoded key it belongs to.
pub(crate) type DueTimer = (Timestamp, u16, TimerKey);

/// A timer: its time, key group and key.
#[derive(Clone, Debug)]
struct Timer(Timestamp, u16, TimerKey);

/// Where a timer stands: whether it is live (waits to fire) and whether the backend holds
/// it (as of the last write-through). A timer neither live nor held by the backend is gone:
/// its bucket's index has no entry for it; the next write-through puts the live ones the
/// backend does not hold and deletes the others it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Status {
    live: bool,
    stored: bool,
}

/// A timer in its time's bucket.
#[derive(Debug)]
struct Entry {
    key_group: u16,
    key: TimerKey,
    status: Status,
}

/// The timers of one time: in the order they were registered (fired from the end; a gone
/// timer's entry stays until its turn and is skipped then), and an index of the position of
/// every one that is live or that the backend holds — probed once per register or delete,
/// and small (a position per timer) so it stays in cache. Keys of one time are usually
/// registered in the order they are later deleted or fired in (a timer per record at its
/// time plus a constant, the records of each round in the same order), so the entries are
/// read in order too, not at random.
#[derive(Default)]
struct Bucket {
    timers: Vec<Entry>,
    index: HashTable<usize>,
}

/// Whether the timer at `position` is `key_group`'s `key`.
fn is(timers: &[Entry], position: usize, key_group: u16, key: &[u8]) -> bool {
    timers.get(position).is_some_and(|e| e.key_group == key_group && *e.key == *key)
}

impl Bucket {
    /// Indexes a new live timer.
    fn push(&mut self, hash: u64, hasher: &ahash::RandomState, key_group: u16, key: TimerKey, stored: bool) {
        let position = self.timers.len();
        self.timers.push(Entry { key_group, key, status: Status { live: true, stored } });
        let timers = &self.timers;
        self.index.insert_unique(hash, position, |p| {
            timers.get(*p).map_or(0, |e| hasher.hash_one((e.key_group, &*e.key)))
        });
    }

    /// Empty, its capacity kept.
    fn emptied(mut self) -> Bucket {
        self.timers.clear();
        self.index.clear();
        self
    }
}

/// The timers of one domain.
pub(crate) struct TimerQueue {
    state: StateId,
    /// The buckets by time. A bucket goes when its order is spent (every timer fired or
    /// deleted) or its table is empty (every timer deleted, none held by the backend).
    buckets: BTreeMap<Timestamp, Bucket>,
    /// A bucket that went, emptied, for the next new time: its table and order keep their
    /// capacity, so the timers of a time, registered together, fill it without growing it
    /// (and the memory of the times whose timers were all moved is reused at once).
    spare: Option<Bucket>,
    /// Hashes a timer's key group and key. ahash with a random seed: keys come from the data.
    hasher: ahash::RandomState,
    /// Timers the backend holds whose bucket went (fired or deleted): deleted from the
    /// backend at the next write-through, before anything registered since is written.
    doomed: Vec<Timer>,
}

/// Puts (or deletes) the timer of `key` at `ts` of state `state` in `batch`.
fn write(
    batch: &mut StateWriteBatch,
    state: &StateId,
    (ts, key_group, key): (Timestamp, u16, &[u8]),
    put: bool,
) -> Result<()> {
    let time = encode_time(ts);
    let mut sk = StateKey::new(key_group, state, key);
    sk.namespace = &time;
    if put {
        batch.put(&sk, &[])?;
    } else {
        batch.delete(&sk)?;
    }
    Ok(())
}

impl TimerQueue {
    fn new(name: &str) -> Self {
        TimerQueue {
            // Constant, valid names.
            state: StateId::new(name).unwrap_or_else(|_| unreachable!("valid name")),
            buckets: BTreeMap::new(),
            spare: None,
            hasher: ahash::RandomState::new(),
            doomed: Vec::new(),
        }
    }

    fn hash(&self, key_group: u16, key: &[u8]) -> u64 {
        self.hasher.hash_one((key_group, key))
    }

    /// Registers a timer (nothing when the key has one at `ts` already).
    pub(crate) fn register(&mut self, ts: Timestamp, key_group: u16, key: &[u8]) {
        let hash = self.hash(key_group, key);
        let spare = &mut self.spare;
        let bucket = self.buckets.entry(ts).or_insert_with(|| spare.take().unwrap_or_default());
        if let Some(&position) = bucket.index.find(hash, |p| is(&bucket.timers, *p, key_group, key)) {
            if let Some(e) = bucket.timers.get_mut(position) {
                // Live already, or deleted since the backend learnt of it: live (again), no
                // change to write.
                e.status.live = true;
            }
            return;
        }
        bucket.push(hash, &self.hasher, key_group, TimerKey::new(key), false);
    }

    /// Deletes a timer (nothing when there is none).
    pub(crate) fn delete(&mut self, ts: Timestamp, key_group: u16, key: &[u8]) {
        let hash = self.hash(key_group, key);
        let btree_map::Entry::Occupied(mut slot) = self.buckets.entry(ts) else { return };
        let Bucket { timers, index } = slot.get_mut();
        let Ok(found) = index.find_entry(hash, |p| is(timers, *p, key_group, key)) else { return };
        let Some(e) = timers.get_mut(*found.get()) else { return };
        e.status.live = false;
        if !e.status.stored {
            // Registered and gone between two write-throughs: the backend never hears of it.
            found.remove();
            if index.is_empty() {
                // Its entries are gone timers only.
                self.spare = Some(slot.remove().emptied());
            }
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
            let bucket = first.get_mut();
            let mut due = None;
            if let Some(Entry { key_group, key, status }) = bucket.timers.pop() {
                if status.live || status.stored {
                    let (position, hash) = (bucket.timers.len(), self.hasher.hash_one((key_group, &*key)));
                    if let Ok(found) = bucket.index.find_entry(hash, |p| *p == position) {
                        found.remove();
                    }
                    if status.stored {
                        // Fired or deleted: it leaves the backend at the next write-through.
                        self.doomed.push(Timer(ts, key_group, key.clone()));
                    }
                    due = status.live.then_some((ts, key_group, key));
                }
            }
            if bucket.timers.is_empty() {
                debug_assert!(bucket.index.is_empty(), "an indexed timer has no entry");
                self.spare = Some(first.remove().emptied());
            }
            if due.is_some() {
                return due;
            }
        }
    }

    /// The earliest time a timer may be due at (a deleted one's, until its bucket is passed).
    pub(crate) fn next(&self) -> Option<Timestamp> {
        self.buckets.keys().next().copied()
    }

    /// Number of timers live or held by the backend (indexed), or waiting to leave the backend.
    #[cfg(test)]
    fn entries(&self) -> usize {
        self.buckets.values().map(|b| b.index.len()).sum::<usize>() + self.doomed.len()
    }

    /// Number of live timers.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.buckets
            .values()
            .flat_map(|b| b.index.iter().filter_map(|p| b.timers.get(*p)))
            .filter(|e| e.status.live)
            .count()
    }

    /// Writes the timers registered and removed since the last write-through to the backend:
    /// one pass over the indexes (the live timers and those the backend still holds).
    pub(crate) fn write_through(&mut self, backend: &mut dyn KeyedStateBackend) -> Result<()> {
        let mut batch = StateWriteBatch::new();
        // First: a doomed timer registered again since is put after its delete.
        for Timer(ts, key_group, key) in std::mem::take(&mut self.doomed) {
            write(&mut batch, &self.state, (ts, key_group, &key), false)?;
        }
        let mut failed = None;
        for (ts, bucket) in &mut self.buckets {
            let Bucket { timers, index } = bucket;
            index.retain(|p| {
                let Some(Entry { key_group, key, status }) = timers.get_mut(*p) else { return false };
                let (put, keep) = match (status.live, status.stored) {
                    (true, false) => (true, true),
                    (false, true) => (false, false),
                    _ => return true, // nothing to say
                };
                if let Err(e) = write(&mut batch, &self.state, (*ts, *key_group, key), put) {
                    failed.get_or_insert(e);
                }
                status.stored = put;
                keep
            });
        }
        // A bucket whose timers are all gone goes.
        self.buckets.retain(|_, b| !b.index.is_empty());
        if let Some(e) = failed {
            return Err(e);
        }
        if batch.is_empty() {
            return Ok(());
        }
        Ok(backend.write_batch(batch)?)
    }

    /// Rebuilds the queue from the backend (after a restore).
    fn rebuild(&mut self, backend: &dyn KeyedStateBackend) -> Result<()> {
        self.buckets.clear();
        self.doomed.clear();
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
                        let hash = self.hash(kg, d.key);
                        let bucket = self.buckets.entry(ts).or_default();
                        if bucket.index.find(hash, |p| is(&bucket.timers, *p, kg, d.key)).is_none() {
                            bucket.push(hash, &self.hasher, kg, TimerKey::new(d.key), true);
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

    fn owned((ts, key_group, key): DueTimer) -> (Timestamp, u16, Vec<u8>) {
        (ts, key_group, key.to_vec())
    }

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
        assert_eq!(rebuilt.event.pop_due(15).map(owned), Some((10, 5, b"b".to_vec())));
        assert_eq!(rebuilt.event.pop_due(15).map(owned), None);
        assert_eq!(rebuilt.event.pop_due(30).map(owned), Some((30, 1, b"a".to_vec())));
        rebuilt.write_through(&mut backend).unwrap();
        let mut again = Timers::default();
        again.rebuild(&backend).unwrap();
        assert_eq!((again.event.len(), again.processing.len()), (0, 1), "fired timers leave the backend");
    }

    #[test]
    fn without_barriers_only_live_timers_are_kept_and_the_next_write_through_is_exact() {
        let mut backend = HeapStateBackend::new(KeyGroupRange::all(8));
        let mut timers = Timers::default();
        timers.event.register(5_000_000, 0, b"stored");
        timers.write_through(&mut backend).unwrap();
        // 100,000 timers registered and fired between two barriers (a job without checkpoints).
        for i in 0..100_000i64 {
            timers.event.register(10 + i, (i % 8) as u16, &i.to_be_bytes());
            assert_eq!(timers.event.pop_due(10 + i).map(|t| t.0), Some(10 + i));
            // The stored timer and none of the fired ones: nothing grows.
            assert_eq!((timers.event.buckets.len(), timers.event.entries()), (1, 1), "at {i}");
        }
        // 100,000 registered and deleted at once (the silence detector's pattern): their
        // buckets go at once.
        let started = std::time::Instant::now();
        for i in 0..100_000i64 {
            timers.event.register(2_000_000 + i, (i % 8) as u16, &i.to_be_bytes());
            timers.event.delete(2_000_000 + i, (i % 8) as u16, &i.to_be_bytes());
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "{:?}", started.elapsed());
        assert_eq!(timers.event.entries(), 1, "only the stored timer has an entry");
        assert_eq!(timers.event.buckets.len(), 1, "only the stored timer's bucket is left");
        // Timers the backend holds, deleted, then many others fired before the write-through:
        // their deletes must still reach the backend.
        for i in 0..2_000i64 {
            timers.event.register(3_000_000 + i, (i % 8) as u16, &i.to_be_bytes());
        }
        timers.write_through(&mut backend).unwrap();
        for i in 0..2_000i64 {
            timers.event.delete(3_000_000 + i, (i % 8) as u16, &i.to_be_bytes());
        }
        for i in 0..6_000i64 {
            timers.event.register(4_000_000 + i, 0, &i.to_be_bytes());
            assert!(timers.event.pop_due(4_000_000 + i).is_some());
        }
        timers.event.register(1_000_000, 3, b"new");
        timers.event.register(1_000_001, 4, b"deleted");
        timers.event.delete(1_000_001, 4, b"deleted");
        timers.event.delete(5_000_000, 0, b"stored");
        timers.write_through(&mut backend).unwrap();
        let mut rebuilt = Timers::default();
        rebuilt.rebuild(&backend).unwrap();
        assert_eq!(rebuilt.event.len(), 1, "only the new timer is in the backend");
        assert_eq!(rebuilt.event.pop_due(i64::MAX).map(owned), Some((1_000_000, 3, b"new".to_vec())));
    }

    #[test]
    fn a_stored_timer_fired_leaves_the_backend_even_when_registered_again_before_the_barrier() {
        let mut backend = HeapStateBackend::new(KeyGroupRange::all(8));
        let mut timers = Timers::default();
        for key in [b"once".as_slice(), b"again", b"other"] {
            timers.event.register(10, 2, key);
        }
        timers.write_through(&mut backend).unwrap();
        // All three fire: their bucket goes, the backend still holds them.
        let fired: Vec<_> = std::iter::from_fn(|| timers.event.pop_due(10)).collect();
        assert_eq!(fired.len(), 3);
        assert_eq!(timers.event.next(), None, "the spent bucket is gone");
        // One is registered again at the same time before the barrier.
        timers.event.register(10, 2, b"again");
        timers.write_through(&mut backend).unwrap();
        let mut rebuilt = Timers::default();
        rebuilt.rebuild(&backend).unwrap();
        assert_eq!(rebuilt.event.pop_due(10).map(owned), Some((10, 2, b"again".to_vec())));
        assert_eq!(rebuilt.event.pop_due(i64::MAX).map(owned), None, "the fired ones left the backend");
        // And this queue (not rebuilt) agrees.
        assert_eq!(timers.event.pop_due(10).map(owned), Some((10, 2, b"again".to_vec())));
        timers.write_through(&mut backend).unwrap();
        let mut empty = Timers::default();
        empty.rebuild(&backend).unwrap();
        assert_eq!(empty.event.len(), 0);
    }

    #[test]
    fn a_timer_deleted_and_registered_again_fires_once() {
        let mut timers = Timers::default();
        timers.event.register(10, 0, b"k");
        timers.event.delete(10, 0, b"k");
        timers.event.register(10, 0, b"k");
        assert_eq!(timers.event.pop_due(10).map(owned), Some((10, 0, b"k".to_vec())));
        assert_eq!(timers.event.pop_due(10).map(owned), None, "its stale entry is skipped");
    }

    #[test]
    fn a_timer_fired_and_registered_again_without_barriers_leaves_nothing_behind() {
        let mut timers = Timers::default();
        for _ in 0..10_000 {
            timers.event.register(7, 0, b"same");
            assert_eq!(timers.event.pop_due(7).map(owned), Some((7, 0, b"same".to_vec())));
        }
        assert_eq!((timers.event.buckets.len(), timers.event.entries()), (0, 0));
    }

    #[test]
    fn keys_longer_than_the_inline_limit_behave_like_short_ones() {
        let long = vec![b'x'; INLINE_KEY + 1];
        let short = vec![b'y'; INLINE_KEY];
        let mut backend = HeapStateBackend::new(KeyGroupRange::all(8));
        let mut timers = Timers::default();
        for key in [&long, &short] {
            timers.event.register(20, 1, key);
            timers.event.register(20, 1, key);
            timers.event.register(10, 1, key);
            timers.event.delete(10, 1, key);
        }
        timers.write_through(&mut backend).unwrap();
        let mut rebuilt = Timers::default();
        rebuilt.rebuild(&backend).unwrap();
        assert_eq!(rebuilt.event.len(), 2);
        let mut due: Vec<_> = std::iter::from_fn(|| rebuilt.event.pop_due(20).map(owned)).collect();
        due.sort();
        assert_eq!(due, [(20, 1, long.clone()), (20, 1, short.clone())]);
        assert_eq!(rebuilt.event.pop_due(i64::MAX).map(owned), None);
    }
}

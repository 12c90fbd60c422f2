//! Timers of keyed process functions: event-time and processing-time, at most one per key
//! and timestamp.
//!
//! In memory, timers wait in buckets by time (a B-tree of times: the timers of many keys
//! often share a time), each with its keys in order and a table of its live timers (and of
//! those the backend still holds), so registering, deleting and firing cost one lookup of
//! the time, one hash and a push or a pop whatever the number of timers (a deleted timer
//! stays in its bucket's order until its time and is skipped then). Timers of one time are
//! usually registered together and always fire together, so their bucket's table is warm in
//! cache when probed. A key of up to [`INLINE_KEY`] bytes (a number,
//! a short string) is stored inline: a timer costs no allocation and its lookup no pointer
//! chase. At each barrier the timers registered or removed since the last one are written
//! through to the subtask's keyed-state backend (state `_timer.event` or `_timer.proc`, the
//! timer's key, its timestamp as the namespace): timers are in every checkpoint, placed by
//! key group, and follow their keys when a job is rescaled; a timer registered and gone
//! between two barriers never reaches the backend. After a restore the queue is rebuilt from
//! the backend (one contiguous scan per key group and timer state).

use crate::types::Timestamp;
use crate::Result;
use caudal_checkpoints::keys::decode_key;
use caudal_checkpoints::{KeyedStateBackend, StateId, StateKey, StateWriteBatch};
use hashbrown::hash_table::OccupiedEntry;
use hashbrown::HashTable;
use std::collections::BTreeMap;
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

/// A timer's encoded key: inline up to [`INLINE_KEY`] bytes, shared beyond (the map, the
/// heap and the list of changes each hold the timer).
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

/// Where a timer stands: whether it is live (waits to fire), whether the backend holds it
/// (as of the last write-through), and whether it is on the list of timers to look at at
/// the next write-through. A timer neither live nor held by the backend has no entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Status {
    live: bool,
    stored: bool,
    touched: bool,
}

/// A timer's entry in its time's bucket.
type Slot = (u16, TimerKey, Status);

/// The timers of one time: their keys in the order they became live (fired from the end; a
/// deleted timer's entry stays until its time and is skipped then), and every one that is
/// live or that the backend holds, with its status — a table probed once per register,
/// delete or fire, and small and warm in cache when timers of one time come together (a
/// timer per record at its time plus a constant, say), where one table of every timer would
/// cost a cache miss per probe.
#[derive(Default)]
struct Bucket {
    order: Vec<(u16, TimerKey)>,
    table: HashTable<Slot>,
}

/// The timers of one domain.
pub(crate) struct TimerQueue {
    state: StateId,
    /// The buckets by time. A bucket goes when its order is spent (every timer fired or
    /// deleted).
    buckets: BTreeMap<Timestamp, Bucket>,
    /// Hashes a timer's key group and key. ahash with a random seed: keys come from the data.
    hasher: ahash::RandomState,
    /// Timers in the buckets' tables.
    entries: usize,
    /// The timers whose status changed since the last write-through (entries of timers gone
    /// since are skipped then, and dropped when the list outgrows the tables).
    touched: Vec<Timer>,
    /// Timers the backend holds whose bucket went (fired or deleted): deleted from the
    /// backend at the next write-through, before anything registered since is written.
    doomed: Vec<Timer>,
    /// The list's length that triggers its next compaction.
    compact_at: usize,
}

/// The status of the timer `(ts, key_group, key)`, when it has an entry.
fn status_of<'b>(
    buckets: &'b mut BTreeMap<Timestamp, Bucket>,
    hasher: &ahash::RandomState,
    Timer(ts, key_group, key): &Timer,
) -> Option<&'b mut Status> {
    let bucket = buckets.get_mut(ts)?;
    let hash = hasher.hash_one((*key_group, &**key));
    bucket.table.find_mut(hash, |(g, k, _)| g == key_group && **k == **key).map(|(_, _, status)| status)
}

/// Puts (or deletes) timer `(ts, key_group, key)` of state `state` in `batch`.
fn write(
    batch: &mut StateWriteBatch,
    state: &StateId,
    Timer(ts, key_group, key): &Timer,
    put: bool,
) -> Result<()> {
    let time = encode_time(*ts);
    let mut sk = StateKey::new(*key_group, state, key);
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
            hasher: ahash::RandomState::new(),
            entries: 0,
            touched: Vec::new(),
            doomed: Vec::new(),
            compact_at: 1024,
        }
    }

    fn hash(&self, key_group: u16, key: &[u8]) -> u64 {
        self.hasher.hash_one((key_group, key))
    }

    /// Keeps only the list's entries still waiting for the write-through, each once, when
    /// the list has grown past `compact_at`: without barriers (a job that never checkpoints)
    /// it would grow with every timer registered and fired. The next compaction waits until
    /// the list has doubled again, so each costs no more lookups than the pushes since the
    /// last one.
    fn compact_touched(&mut self) {
        if self.touched.len() <= self.compact_at {
            return;
        }
        let (buckets, hasher) = (&mut self.buckets, &self.hasher);
        // A kept entry's flag is cleared so that a second entry of the same timer is dropped,
        // then set again.
        self.touched.retain(|t| match status_of(buckets, hasher, t) {
            Some(status) if status.touched => {
                status.touched = false;
                true
            }
            _ => false,
        });
        for t in &self.touched {
            if let Some(status) = status_of(buckets, hasher, t) {
                status.touched = true;
            }
        }
        self.compact_at = 2 * self.touched.len().max(self.entries) + 1024;
    }

    /// Registers a timer (nothing when the key has one at `ts` already).
    pub(crate) fn register(&mut self, ts: Timestamp, key_group: u16, key: &[u8]) {
        let hash = self.hash(key_group, key);
        let bucket = self.buckets.entry(ts).or_default();
        if let Some((_, k, status)) = bucket.table.find_mut(hash, |(g, k, _)| *g == key_group && **k == *key)
        {
            if !status.live {
                // Deleted since the backend learnt of it: live again, no change to write.
                status.live = true;
                bucket.order.push((key_group, k.clone()));
            }
            return;
        }
        let k = TimerKey::new(key);
        bucket.order.push((key_group, k.clone()));
        let hasher = &self.hasher;
        bucket.table.insert_unique(
            hash,
            (key_group, k.clone(), Status { live: true, stored: false, touched: true }),
            |(g, k, _)| hasher.hash_one((*g, &**k)),
        );
        self.entries += 1;
        self.touched.push(Timer(ts, key_group, k));
        self.compact_touched();
    }

    /// Deletes a timer (nothing when there is none).
    pub(crate) fn delete(&mut self, ts: Timestamp, key_group: u16, key: &[u8]) {
        let hash = self.hash(key_group, key);
        let Some(bucket) = self.buckets.get_mut(&ts) else { return };
        if let Ok(entry) = bucket.table.find_entry(hash, |(g, k, _)| *g == key_group && **k == *key) {
            let (_, removed) = Self::retire(entry, ts, &mut self.touched);
            self.entries -= usize::from(removed);
        }
    }

    /// Takes a timer out of the live ones (deleted or fired): whether it was live, and
    /// whether its entry went. One the backend holds stays, not live, listed for the next
    /// write-through; one registered and gone between two write-throughs is dropped: the
    /// backend never hears of it.
    fn retire(mut entry: OccupiedEntry<'_, Slot>, ts: Timestamp, touched: &mut Vec<Timer>) -> (bool, bool) {
        let (key_group, key, status) = entry.get_mut();
        if !status.live {
            return (false, false);
        }
        if status.stored {
            status.live = false;
            if !status.touched {
                status.touched = true;
                touched.push(Timer(ts, *key_group, key.clone()));
            }
            (true, false)
        } else {
            entry.remove();
            (true, true)
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
            if let Some((key_group, key)) = bucket.order.pop() {
                let hash = self.hasher.hash_one((key_group, &*key));
                // A deleted (or already fired) timer's entry is skipped.
                if let Ok(entry) = bucket.table.find_entry(hash, |(g, k, _)| *g == key_group && **k == *key) {
                    let (live, removed) = Self::retire(entry, ts, &mut self.touched);
                    self.entries -= usize::from(removed);
                    due = live.then_some((ts, key_group, key));
                }
            }
            if bucket.order.is_empty() {
                // Every timer of this time fired or was deleted: those the backend still
                // holds leave it at the next write-through.
                let bucket = first.remove();
                self.entries -= bucket.table.len();
                for (key_group, key, status) in bucket.table {
                    debug_assert!(!status.live, "a live timer has an entry in its bucket's order");
                    if status.stored {
                        self.doomed.push(Timer(ts, key_group, key));
                    }
                }
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

    /// Number of live timers.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.buckets.values().flat_map(|b| b.table.iter()).filter(|(_, _, s)| s.live).count()
    }

    /// Writes the timers registered and removed since the last write-through to the backend.
    pub(crate) fn write_through(&mut self, backend: &mut dyn KeyedStateBackend) -> Result<()> {
        if self.touched.is_empty() && self.doomed.is_empty() {
            return Ok(());
        }
        let mut batch = StateWriteBatch::new();
        // First: a doomed timer registered again since is put after its delete.
        for timer in std::mem::take(&mut self.doomed) {
            write(&mut batch, &self.state, &timer, false)?;
        }
        for timer in std::mem::take(&mut self.touched) {
            let Timer(ts, key_group, key) = &timer;
            let hash = self.hash(*key_group, key);
            let Some(bucket) = self.buckets.get_mut(ts) else { continue };
            let Ok(mut e) = bucket.table.find_entry(hash, |(g, k, _)| g == key_group && **k == **key) else {
                continue;
            };
            let status = &mut e.get_mut().2;
            let Status { live, stored, touched } = *status;
            if !touched {
                continue; // listed twice (gone and registered again): done already
            }
            status.touched = false;
            match (live, stored) {
                (true, false) => {
                    status.stored = true;
                    write(&mut batch, &self.state, &timer, true)?;
                }
                (false, true) => {
                    e.remove();
                    self.entries -= 1;
                    write(&mut batch, &self.state, &timer, false)?;
                }
                // Deleted and registered again, or nothing to say.
                _ => {}
            }
        }
        self.compact_at = 2 * self.entries + 1024;
        Ok(backend.write_batch(batch)?)
    }

    /// Rebuilds the queue from the backend (after a restore).
    fn rebuild(&mut self, backend: &dyn KeyedStateBackend) -> Result<()> {
        self.buckets.clear();
        self.entries = 0;
        self.touched.clear();
        self.doomed.clear();
        self.compact_at = 1024;
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
                        if bucket.table.find(hash, |(g, k, _)| *g == kg && **k == *d.key).is_none() {
                            let key = TimerKey::new(d.key);
                            bucket.order.push((kg, key.clone()));
                            let hasher = &self.hasher;
                            bucket.table.insert_unique(
                                hash,
                                (kg, key, Status { live: true, stored: true, touched: false }),
                                |(g, k, _)| hasher.hash_one((*g, &**k)),
                            );
                            self.entries += 1;
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
    fn without_barriers_the_list_of_changes_stays_bounded_and_the_next_write_through_is_exact() {
        let mut backend = HeapStateBackend::new(KeyGroupRange::all(8));
        let mut timers = Timers::default();
        timers.event.register(5_000_000, 0, b"stored");
        timers.write_through(&mut backend).unwrap();
        // 100,000 timers registered and fired between two barriers (a job without checkpoints).
        for i in 0..100_000i64 {
            timers.event.register(10 + i, (i % 8) as u16, &i.to_be_bytes());
            assert_eq!(timers.event.pop_due(10 + i).map(|t| t.0), Some(10 + i));
            // At most two timers live (the stored one and this one): the list stays short.
            assert!(timers.event.touched.len() <= 2 * 2 + 2050, "{} at {i}", timers.event.touched.len());
        }
        // 100,000 registered and deleted at once (the silence detector's pattern): their bucket
        // entries stay until their time, so compaction keeps them; it must not run per call.
        let started = std::time::Instant::now();
        for i in 0..100_000i64 {
            timers.event.register(2_000_000 + i, (i % 8) as u16, &i.to_be_bytes());
            timers.event.delete(2_000_000 + i, (i % 8) as u16, &i.to_be_bytes());
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "{:?}", started.elapsed());
        assert!(timers.event.touched.len() <= 2 * 100_000 + 1025, "{}", timers.event.touched.len());
        // Timers the backend holds, deleted, then the list compacted before the write-through:
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
    fn a_timer_fired_and_registered_again_without_barriers_is_listed_once() {
        let mut timers = Timers::default();
        for _ in 0..10_000 {
            timers.event.register(7, 0, b"same");
            assert_eq!(timers.event.pop_due(7).map(owned), Some((7, 0, b"same".to_vec())));
        }
        assert!(timers.event.touched.len() <= 1025, "{}", timers.event.touched.len());
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

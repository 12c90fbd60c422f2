//! The keyed window operator: assigns records to windows, keeps one accumulator per key and
//! window, fires when the watermark passes a window's end, and counts late records.
//!
//! State lives in the subtask's keyed-state backend (`OperatorContext::keyed_state`: RocksDB or
//! heap), one entry per key (state `window`, key = the record key) whose value is its open
//! windows `([(window, fired)], [accumulator])`: windows first, so a restore rebuilds the
//! timers without decoding accumulators.
//! The hot path never touches the backend per record: a [`WindowCache`] pre-aggregates the keys
//! in use in memory and writes the changed ones through at every barrier (then the engine
//! snapshots the backend) or when it outgrows `state.cache_entries` (100,000 keys with
//! RocksDB, no bound on the heap backend); a key not in the cache costs one backend read.
//! Event-time timers stay in memory and are rebuilt from the backend on restore (one
//! contiguous scan of the subtask's key groups).

use super::assigner::{TimeWindow, WindowAssigner};
use super::function::WindowEmitter;
use caudal::keygroup::{key_group_of, StableHasher};
use caudal::metrics::names;
use caudal::{Batch, Data, Key, Operator, OperatorContext, Record, Result, StateBrowse, Timestamp};
use caudal_checkpoints::keys::decode_key;
use caudal_checkpoints::{KeyedStateBackend, StateId, StateKey, StateWriteBatch};
use serde::{Deserialize, Serialize};
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<StableHasher>>;

/// The name of the window operator's state in the backend.
pub const WINDOW_STATE: &str = "window";

/// What the window operator emits: results, and late records when a side output is asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WindowOutput<R, T> {
    /// A fired window's output.
    Result(R),
    /// A record that arrived after its windows were cleaned up.
    Late(T),
}

#[derive(Debug, Clone)]
struct WindowSlot<A> {
    window: TimeWindow,
    acc: A,
    fired: bool,
}

/// The stored value of a key: its windows first, so that a restore rebuilds the timers
/// without decoding the accumulators.
type StoredWindows<A> = (Vec<(TimeWindow, bool)>, Vec<A>);

fn encode_slots<A: Data>(slots: &[WindowSlot<A>]) -> Result<Vec<u8>> {
    let windows: Vec<(TimeWindow, bool)> = slots.iter().map(|s| (s.window, s.fired)).collect();
    let accs: Vec<&A> = slots.iter().map(|s| &s.acc).collect();
    encode(&(windows, accs))
}

fn decode_slots<A: Data>(bytes: &[u8]) -> Result<Vec<WindowSlot<A>>> {
    let (windows, accs): StoredWindows<A> = decode(bytes)?;
    if windows.len() != accs.len() {
        return Err(codec_err(
            "decoding",
            format!("{} windows but {} accumulators", windows.len(), accs.len()),
        ));
    }
    Ok(windows
        .into_iter()
        .zip(accs)
        .map(|((window, fired), acc)| WindowSlot { window, acc, fired })
        .collect())
}

/// The windows of a stored value (its prefix).
fn decode_windows(bytes: &[u8]) -> Result<Vec<(TimeWindow, bool)>> {
    decode(bytes)
}

/// One key's open windows, cached in memory.
struct KeyEntry<A> {
    key_group: u16,
    slots: Vec<WindowSlot<A>>,
    /// Changed since it was last written to the backend.
    dirty: bool,
    /// The backend may hold an older value (so an empty entry must be deleted there).
    persisted: bool,
}

fn codec_err(what: &str, e: impl std::fmt::Display) -> caudal::Error {
    caudal::Error::CorruptState(format!("window state {what}: {e}"))
}

fn encode<V: Serialize + ?Sized>(v: &V) -> Result<Vec<u8>> {
    bincode::serde::encode_to_vec(v, bincode::config::standard()).map_err(|e| codec_err("encoding", e))
}

fn decode<V: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<V> {
    bincode::serde::decode_from_slice(bytes, bincode::config::standard())
        .map(|(v, _)| v)
        .map_err(|e| codec_err("decoding (corrupt or from another job version)", e))
}

/// The write-back cache of window state in front of the keyed-state backend.
struct WindowCache<K, A> {
    entries: FastMap<K, KeyEntry<A>>,
    state: StateId,
    capacity: usize,
    max_parallelism: u32,
}

impl<K: Key, A: Data> WindowCache<K, A> {
    fn new(capacity: usize, max_parallelism: u32) -> Self {
        WindowCache {
            entries: FastMap::default(),
            // A constant, valid name.
            state: StateId::new(WINDOW_STATE).unwrap_or_else(|_| unreachable!("valid state name")),
            capacity: capacity.max(1),
            max_parallelism,
        }
    }

    /// The entry of `key`: from memory, else read from the backend, else a new empty one.
    fn load(&mut self, backend: &dyn KeyedStateBackend, key: &K) -> Result<&mut KeyEntry<A>> {
        match self.entries.entry(key.clone()) {
            Entry::Occupied(e) => Ok(e.into_mut()),
            Entry::Vacant(v) => {
                let key_group = key_group_of(key, self.max_parallelism);
                let encoded = encode(key)?;
                let stored = backend.get(&StateKey::new(key_group, &self.state, &encoded))?;
                let (slots, persisted) = match stored {
                    Some(bytes) => (decode_slots(&bytes)?, true),
                    None => (Vec::new(), false),
                };
                Ok(v.insert(KeyEntry { key_group, slots, dirty: false, persisted }))
            }
        }
    }

    /// Writes every changed entry to the backend in one batch; with `evict`, empties the cache.
    fn flush(&mut self, backend: &mut dyn KeyedStateBackend, evict: bool) -> Result<()> {
        let mut batch = StateWriteBatch::new();
        for (key, e) in self.entries.iter_mut().filter(|(_, e)| e.dirty) {
            let encoded = encode(key)?;
            let sk = StateKey::new(e.key_group, &self.state, &encoded);
            if e.slots.is_empty() {
                batch.delete(&sk)?;
                e.persisted = false;
            } else {
                batch.put(&sk, &encode_slots(&e.slots)?)?;
                e.persisted = true;
            }
            e.dirty = false;
        }
        backend.write_batch(batch)?;
        if evict {
            self.entries.clear();
        } else {
            self.entries.retain(|_, e| !e.slots.is_empty());
        }
        Ok(())
    }

    /// Spills to the backend when the cache outgrew its capacity.
    fn bound(&mut self, backend: &mut dyn KeyedStateBackend) -> Result<()> {
        if self.entries.len() > self.capacity {
            self.flush(backend, true)?;
        }
        Ok(())
    }
}

/// Event time: the watermark, and timers (fire time → keys with a window ending, or cleaned
/// up, then).
struct Timers<K> {
    at: BTreeMap<Timestamp, Vec<K>>,
    lateness: i64,
    watermark: Timestamp,
}

impl<K: Key> Timers<K> {
    fn cleanup_time(&self, w: &TimeWindow) -> Timestamp {
        w.max_timestamp().saturating_add(self.lateness)
    }

    /// Whether `w` is past its cleanup time (a record for it is late).
    fn is_gone(&self, w: &TimeWindow) -> bool {
        self.cleanup_time(w) <= self.watermark
    }

    fn register(&mut self, key: &K, w: &TimeWindow) {
        self.at.entry(w.max_timestamp()).or_default().push(key.clone());
        if self.lateness > 0 {
            self.at.entry(self.cleanup_time(w)).or_default().push(key.clone());
        }
    }
}

/// Turns a firing window into output records.
struct Firing<K, T, E: WindowEmitter<K, T>> {
    emitter: Arc<E>,
    emitted: Vec<E::Out>,
    windows_fired: Option<Arc<AtomicU64>>,
    _t: std::marker::PhantomData<fn(K, T)>,
}

impl<K, T: Data, E: WindowEmitter<K, T>> Firing<K, T, E> {
    fn emit(&mut self, key: &K, window: TimeWindow, acc: &E::Acc, out: &mut Batch<WindowOutput<E::Out, T>>) {
        self.emitter.emit(key, window, acc, &mut self.emitted);
        if let Some(c) = &self.windows_fired {
            c.fetch_add(1, Ordering::Relaxed);
        }
        let ts = window.max_timestamp();
        out.extend(self.emitted.drain(..).map(|v| Record::new(ts, WindowOutput::Result(v))));
    }
}

/// Keyed window operator.
pub struct WindowOperator<K, T, E: WindowEmitter<K, T>> {
    key: Arc<dyn Fn(&T) -> K + Send + Sync>,
    assigner: WindowAssigner,
    late_side_output: bool,
    firing: Firing<K, T, E>,
    cache: Option<WindowCache<K, E::Acc>>,
    timers: Timers<K>,
    assigned: Vec<TimeWindow>,
    late_records: Option<Arc<AtomicU64>>,
}

impl<K: Key, T: Data, E: WindowEmitter<K, T>> WindowOperator<K, T, E> {
    /// A window operator; `lateness` in ms keeps windows open for late records after firing.
    pub fn new(
        key: Arc<dyn Fn(&T) -> K + Send + Sync>,
        assigner: WindowAssigner,
        lateness: i64,
        emitter: Arc<E>,
        late_side_output: bool,
    ) -> Self {
        WindowOperator {
            key,
            assigner,
            late_side_output,
            firing: Firing {
                emitter,
                emitted: Vec::new(),
                windows_fired: None,
                _t: std::marker::PhantomData,
            },
            cache: None,
            timers: Timers {
                at: BTreeMap::new(),
                lateness: lateness.max(0),
                watermark: caudal::types::MIN_WATERMARK,
            },
            assigned: Vec::new(),
            late_records: None,
        }
    }

    fn cache(&mut self, ctx: &OperatorContext) -> &mut WindowCache<K, E::Acc> {
        self.cache
            .get_or_insert_with(|| WindowCache::new(ctx.keyed_state_cache_entries(), ctx.max_parallelism))
    }

    /// Number of (key, window) accumulators held in memory (the rest is in the backend).
    pub fn open_windows(&self) -> usize {
        self.cache.as_ref().map_or(0, |c| c.entries.values().map(|e| e.slots.len()).sum())
    }

    /// Rebuilds the timers of every window in the backend (after a restore).
    fn rebuild_timers(&mut self, backend: &dyn KeyedStateBackend) -> Result<()> {
        for kg in backend.key_groups().iter() {
            let mut after: Option<Vec<u8>> = None;
            loop {
                let page = backend.list_entries(kg, after.as_deref(), 4096)?;
                for e in &page.entries {
                    let Some(d) = decode_key(&e.key).filter(|d| d.state == WINDOW_STATE) else { continue };
                    let key: K = decode(d.key)?;
                    for (window, _) in decode_windows(&e.value)? {
                        self.timers.register(&key, &window);
                    }
                }
                match page.next {
                    Some(n) => after = Some(n),
                    None => break,
                }
            }
        }
        Ok(())
    }
}

/// Adds `value` to its (fixed) windows `assigned` of `entry`; returns whether any took it.
fn add_fixed<K: Key, T: Data, E: WindowEmitter<K, T>>(
    entry: &mut KeyEntry<E::Acc>,
    key: &K,
    value: &T,
    assigned: &[TimeWindow],
    timers: &mut Timers<K>,
    firing: &mut Firing<K, T, E>,
    out: &mut Batch<WindowOutput<E::Out, T>>,
) -> bool {
    let mut accepted = false;
    for w in assigned {
        if timers.is_gone(w) {
            continue;
        }
        accepted = true;
        entry.dirty = true;
        let idx = match entry.slots.iter().position(|s| s.window == *w) {
            Some(i) => i,
            None => {
                entry.slots.push(WindowSlot { window: *w, acc: firing.emitter.create(), fired: false });
                timers.register(key, w);
                entry.slots.len() - 1
            }
        };
        let slot = &mut entry.slots[idx];
        firing.emitter.add(&mut slot.acc, value);
        if slot.fired {
            // Late but within allowed lateness: fire again with the update.
            let (window, acc) = (slot.window, slot.acc.clone());
            firing.emit(key, window, &acc, out);
        }
    }
    accepted
}

/// Adds `value` to its session window, merging the sessions it touches.
fn add_session<K: Key, T: Data, E: WindowEmitter<K, T>>(
    entry: &mut KeyEntry<E::Acc>,
    key: &K,
    value: &T,
    mut window: TimeWindow,
    timers: &mut Timers<K>,
    firing: &mut Firing<K, T, E>,
    out: &mut Batch<WindowOutput<E::Out, T>>,
) {
    let mut acc = firing.emitter.create();
    firing.emitter.add(&mut acc, value);
    let mut i = 0;
    while i < entry.slots.len() {
        if entry.slots[i].window.intersects(&window) {
            let s = entry.slots.swap_remove(i);
            window = window.cover(&s.window);
            let mut merged = s.acc;
            firing.emitter.merge(&mut merged, acc);
            acc = merged;
        } else {
            i += 1;
        }
    }
    // A merged session fires again only once the watermark has passed its (new) end.
    let refire = window.max_timestamp() <= timers.watermark;
    if refire {
        firing.emit(key, window, &acc, out);
    }
    entry.slots.push(WindowSlot { window, acc, fired: refire });
    entry.dirty = true;
    timers.register(key, &window);
}

/// Fires the windows of `entry` that ended by `watermark`, drops those past cleanup.
fn fire_entry<K: Key, T: Data, E: WindowEmitter<K, T>>(
    entry: &mut KeyEntry<E::Acc>,
    key: &K,
    timers: &Timers<K>,
    firing: &mut Firing<K, T, E>,
    out: &mut Batch<WindowOutput<E::Out, T>>,
) {
    let watermark = timers.watermark;
    entry.slots.sort_by_key(|s| s.window);
    let before = entry.slots.len();
    for s in entry.slots.iter_mut() {
        if !s.fired && s.window.max_timestamp() <= watermark {
            firing.emit(key, s.window, &s.acc, out);
            s.fired = true;
            entry.dirty = true;
        }
    }
    entry.slots.retain(|s| !timers.is_gone(&s.window));
    if entry.slots.len() != before {
        entry.dirty = true;
    }
}

impl<K: Key, T: Data, E: WindowEmitter<K, T>> Operator for WindowOperator<K, T, E> {
    type In = T;
    type Out = WindowOutput<E::Out, T>;

    /// Writes the changed windows through to the keyed-state backend; the engine then
    /// snapshots the backend (the window operator has no other state).
    fn snapshot(
        &mut self,
        _checkpoint: caudal::CheckpointId,
        ctx: &mut OperatorContext,
    ) -> Result<Option<Vec<u8>>> {
        if let Some(cache) = &mut self.cache {
            cache.flush(&mut *ctx.keyed_state()?, false)?;
        }
        Ok(None)
    }

    /// The engine restored the backend (this subtask's key groups); rebuild the timers.
    fn restore(&mut self, _snapshots: Vec<Vec<u8>>, ctx: &mut OperatorContext) -> Result<()> {
        self.cache = None;
        self.timers.at.clear();
        let started = std::time::Instant::now();
        self.rebuild_timers(&*ctx.keyed_state()?)?;
        let ms = started.elapsed().as_millis() as u64;
        ctx.metrics.counter(names::TIMER_REBUILD_MS).fetch_add(ms, Ordering::Relaxed);
        Ok(())
    }

    fn on_start(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        self.late_records = Some(ctx.metrics.counter(names::LATE_RECORDS));
        self.firing.windows_fired = Some(ctx.metrics.counter(names::WINDOWS_FIRED));
        Ok(())
    }

    fn process_batch(
        &mut self,
        batch: Batch<T>,
        out: &mut Batch<Self::Out>,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        self.cache(ctx);
        let mut backend = ctx.keyed_state()?;
        let Self { key: key_fn, assigner, late_side_output, firing, cache, timers, assigned, .. } = self;
        let Some(cache) = cache.as_mut() else { return Ok(()) };
        let mut late = 0u64;
        for r in batch {
            let key = key_fn(&r.value);
            assigned.clear();
            assigner.assign(r.ts, assigned);
            let accepted = if assigner.is_merging() {
                match assigned.first().copied() {
                    Some(w) if !timers.is_gone(&w) => {
                        let entry = cache.load(&*backend, &key)?;
                        add_session(entry, &key, &r.value, w, timers, firing, out);
                        true
                    }
                    _ => false,
                }
            } else if assigned.iter().all(|w| timers.is_gone(w)) {
                false
            } else {
                let entry = cache.load(&*backend, &key)?;
                add_fixed(entry, &key, &r.value, assigned, timers, firing, out)
            };
            if !accepted {
                late += 1;
                if *late_side_output {
                    out.push(Record::new(r.ts, WindowOutput::Late(r.value)));
                }
            }
        }
        cache.bound(&mut *backend)?;
        if late > 0 {
            if let Some(c) = &self.late_records {
                c.fetch_add(late, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    fn on_watermark(
        &mut self,
        watermark: Timestamp,
        out: &mut Batch<Self::Out>,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        if watermark <= self.timers.watermark {
            return Ok(());
        }
        self.timers.watermark = watermark;
        let due = self.timers.at.first_key_value().is_some_and(|(t, _)| *t <= watermark);
        if !due {
            return Ok(());
        }
        self.cache(ctx);
        let mut backend = ctx.keyed_state()?;
        let Self { firing, cache, timers, .. } = self;
        let Some(cache) = cache.as_mut() else { return Ok(()) };
        while let Some(entry) = timers.at.first_entry() {
            if *entry.key() > watermark {
                break;
            }
            for key in entry.remove() {
                let e = cache.load(&*backend, &key)?;
                fire_entry(e, &key, timers, firing, out);
                if e.slots.is_empty() && !e.persisted {
                    cache.entries.remove(&key);
                }
            }
        }
        cache.bound(&mut *backend)
    }

    fn state_browser(&mut self) -> Option<&mut dyn StateBrowse> {
        Some(self)
    }
}

/// The state browser's hooks: windows written through before a listing, keys and windows
/// decoded from the cache or the backend.
impl<K: Key, T: Data, E: WindowEmitter<K, T>> StateBrowse for WindowOperator<K, T, E> {
    /// The state browser reads the backend next: write the changed windows through, as at
    /// a barrier (the cache keeps them; only the dirty ones are written).
    fn prepare_state_read(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        if let Some(cache) = &mut self.cache {
            cache.flush(&mut *ctx.keyed_state()?, false)?;
        }
        Ok(())
    }

    fn state_key_from_json(
        &self,
        key: &serde_json::Value,
        ctx: &OperatorContext,
    ) -> Option<Result<(u16, Vec<u8>)>> {
        let typed: K = match serde_json::from_value(key.clone()) {
            Ok(k) => k,
            Err(e) => {
                let ty = std::any::type_name::<K>();
                return Some(Err(caudal::Error::Operator(format!("{key} is not a key of type {ty}: {e}"))));
            }
        };
        Some(encode(&typed).map(|bytes| (key_group_of(&typed, ctx.max_parallelism), bytes)))
    }

    /// A key in the cache: its windows as they are now (the backend may hold older ones).
    fn cached_state(&self, key: &[u8]) -> Option<caudal::state_query::CachedEntries> {
        let typed: K = decode(key).ok()?;
        let entry = self.cache.as_ref()?.entries.get(&typed)?;
        if entry.slots.is_empty() {
            return Some(Vec::new()); // every window fired and cleaned up: no state
        }
        let value = encode_slots(&entry.slots).ok()?;
        Some(vec![(WINDOW_STATE.to_string(), Vec::new(), value)])
    }

    fn state_key_to_json(&self, key: &[u8]) -> Option<serde_json::Value> {
        serde_json::to_value(decode::<K>(key).ok()?).ok()
    }

    /// `{"windows": [{"start", "end", "fired", "accumulator"}]}` for state `window`.
    fn state_value_to_json(&self, state: &str, value: &[u8]) -> Option<serde_json::Value> {
        if state != WINDOW_STATE {
            return None;
        }
        let slots = decode_slots::<E::Acc>(value).ok()?;
        let windows = slots
            .iter()
            .map(|s| {
                Some(serde_json::json!({
                    "start": s.window.start,
                    "end": s.window.end,
                    "fired": s.fired,
                    "accumulator": serde_json::to_value(&s.acc).ok()?,
                }))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(serde_json::json!({ "windows": windows }))
    }
}

//! The keyed window operator: assigns records to windows, keeps one accumulator per key and
//! window, fires when the watermark passes a window's end, and counts late records.

use super::assigner::{TimeWindow, WindowAssigner};
use super::function::WindowEmitter;
use caudal::keygroup::StableHasher;
use caudal::metrics::names;
use caudal::{Batch, Data, Key, Operator, OperatorContext, Record, Result, Timestamp};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<StableHasher>>;

/// What the window operator emits: results, and late records when a side output is asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WindowOutput<R, T> {
    /// A fired window's output.
    Result(R),
    /// A record that arrived after its windows were cleaned up.
    Late(T),
}

struct WindowSlot<A> {
    window: TimeWindow,
    acc: A,
    fired: bool,
}

/// Keyed window operator.
pub struct WindowOperator<K, T, E: WindowEmitter<K, T>> {
    key: Arc<dyn Fn(&T) -> K + Send + Sync>,
    assigner: WindowAssigner,
    lateness: i64,
    emitter: Arc<E>,
    late_side_output: bool,
    state: FastMap<K, Vec<WindowSlot<E::Acc>>>,
    timers: BTreeMap<Timestamp, Vec<K>>,
    watermark: Timestamp,
    assigned: Vec<TimeWindow>,
    emitted: Vec<E::Out>,
    late_records: Option<Arc<AtomicU64>>,
    windows_fired: Option<Arc<AtomicU64>>,
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
            lateness: lateness.max(0),
            emitter,
            late_side_output,
            state: FastMap::default(),
            timers: BTreeMap::new(),
            watermark: caudal::types::MIN_WATERMARK,
            assigned: Vec::new(),
            emitted: Vec::new(),
            late_records: None,
            windows_fired: None,
        }
    }

    fn cleanup_time(&self, w: &TimeWindow) -> Timestamp {
        w.max_timestamp().saturating_add(self.lateness)
    }

    fn register(&mut self, key: &K, w: &TimeWindow) {
        self.timers.entry(w.max_timestamp()).or_default().push(key.clone());
        if self.lateness > 0 {
            self.timers.entry(self.cleanup_time(w)).or_default().push(key.clone());
        }
    }

    fn emit(&mut self, key: &K, window: TimeWindow, acc: &E::Acc, out: &mut Batch<WindowOutput<E::Out, T>>) {
        self.emitter.emit(key, window, acc, &mut self.emitted);
        if let Some(c) = &self.windows_fired {
            c.fetch_add(1, Ordering::Relaxed);
        }
        let ts = window.max_timestamp();
        out.extend(self.emitted.drain(..).map(|v| Record::new(ts, WindowOutput::Result(v))));
    }

    fn add_fixed(&mut self, key: K, value: &T, out: &mut Batch<WindowOutput<E::Out, T>>) -> bool {
        let mut accepted = false;
        let assigned = std::mem::take(&mut self.assigned);
        for w in &assigned {
            if self.cleanup_time(w) <= self.watermark {
                continue;
            }
            accepted = true;
            let slots = self.state.entry(key.clone()).or_default();
            let idx = match slots.iter().position(|s| s.window == *w) {
                Some(i) => i,
                None => {
                    slots.push(WindowSlot { window: *w, acc: self.emitter.create(), fired: false });
                    let i = slots.len() - 1;
                    self.register(&key, w);
                    i
                }
            };
            let slots = self.state.get_mut(&key).map(|s| &mut s[idx]);
            if let Some(slot) = slots {
                self.emitter.add(&mut slot.acc, value);
                if slot.fired {
                    // Late but within allowed lateness: fire again with the update.
                    let (window, acc) = (slot.window, slot.acc.clone());
                    self.emit(&key, window, &acc, out);
                }
            }
        }
        self.assigned = assigned;
        accepted
    }

    fn add_session(&mut self, key: K, value: &T, out: &mut Batch<WindowOutput<E::Out, T>>) -> bool {
        let Some(mut window) = self.assigned.first().copied() else { return false };
        if self.cleanup_time(&window) <= self.watermark {
            return false;
        }
        let mut acc = self.emitter.create();
        self.emitter.add(&mut acc, value);
        let slots = self.state.entry(key.clone()).or_default();
        let mut i = 0;
        while i < slots.len() {
            if slots[i].window.intersects(&window) {
                let s = slots.swap_remove(i);
                window = window.cover(&s.window);
                let mut merged = s.acc;
                self.emitter.merge(&mut merged, acc);
                acc = merged;
            } else {
                i += 1;
            }
        }
        // A merged session fires again only once the watermark has passed its (new) end.
        let refire = window.max_timestamp() <= self.watermark;
        if refire {
            self.emit(&key, window, &acc, out);
        }
        if let Some(slots) = self.state.get_mut(&key) {
            slots.push(WindowSlot { window, acc, fired: refire });
        }
        self.register(&key, &window);
        true
    }

    fn fire_key(&mut self, key: &K, out: &mut Batch<WindowOutput<E::Out, T>>) {
        let Some(mut slots) = self.state.remove(key) else { return };
        slots.sort_by_key(|s| s.window);
        let wm = self.watermark;
        let mut keep = Vec::with_capacity(slots.len());
        for mut s in slots {
            if !s.fired && s.window.max_timestamp() <= wm {
                self.emit(key, s.window, &s.acc, out);
                s.fired = true;
            }
            if self.cleanup_time(&s.window) > wm {
                keep.push(s);
            }
        }
        if !keep.is_empty() {
            self.state.insert(key.clone(), keep);
        }
    }

    /// Number of (key, window) accumulators held.
    pub fn open_windows(&self) -> usize {
        self.state.values().map(Vec::len).sum()
    }
}

/// The checkpointed form of the window state: per key, its windows.
type Snapshot<K, A> = Vec<(K, Vec<(TimeWindow, A, bool)>)>;

fn codec_err(what: &str, e: impl std::fmt::Display) -> caudal::Error {
    caudal::Error::Operator(format!("window state {what}: {e}"))
}

impl<K: Key, T: Data, E: WindowEmitter<K, T>> Operator for WindowOperator<K, T, E> {
    type In = T;
    type Out = WindowOutput<E::Out, T>;

    fn snapshot(
        &mut self,
        _checkpoint: caudal::CheckpointId,
        _ctx: &mut OperatorContext,
    ) -> Result<Option<Vec<u8>>> {
        let mut keys: Vec<&K> = self.state.keys().collect();
        keys.sort();
        let snapshot: Snapshot<&K, &E::Acc> = keys
            .into_iter()
            .map(|k| {
                let slots = self.state[k].iter().map(|s| (s.window, &s.acc, s.fired)).collect();
                (k, slots)
            })
            .collect();
        bincode::serde::encode_to_vec(&snapshot, bincode::config::standard())
            .map(Some)
            .map_err(|e| codec_err("encoding", e))
    }

    fn restore(&mut self, snapshots: Vec<Vec<u8>>, ctx: &mut OperatorContext) -> Result<()> {
        for blob in snapshots {
            let (snapshot, _): (Snapshot<K, E::Acc>, usize) =
                bincode::serde::decode_from_slice(&blob, bincode::config::standard())
                    .map_err(|e| codec_err("decoding (corrupt or from another job version)", e))?;
            for (key, slots) in snapshot {
                // After a rescale each subtask keeps only the keys of its key groups.
                if !ctx.key_groups.contains(&caudal::keygroup::key_group_of(&key, ctx.max_parallelism)) {
                    continue;
                }
                for (window, _, _) in &slots {
                    self.register(&key, window);
                }
                let slots = slots.into_iter().map(|(window, acc, fired)| WindowSlot { window, acc, fired });
                self.state.entry(key).or_default().extend(slots);
            }
        }
        Ok(())
    }

    fn on_start(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        self.late_records = Some(ctx.metrics.counter(names::LATE_RECORDS));
        self.windows_fired = Some(ctx.metrics.counter(names::WINDOWS_FIRED));
        Ok(())
    }

    fn process_batch(
        &mut self,
        batch: Batch<T>,
        out: &mut Batch<Self::Out>,
        _ctx: &mut OperatorContext,
    ) -> Result<()> {
        let mut late = 0u64;
        for r in batch {
            let key = (self.key)(&r.value);
            self.assigned.clear();
            self.assigner.assign(r.ts, &mut self.assigned);
            let accepted = if self.assigner.is_merging() {
                self.add_session(key, &r.value, out)
            } else {
                self.add_fixed(key, &r.value, out)
            };
            if !accepted {
                late += 1;
                if self.late_side_output {
                    out.push(Record::new(r.ts, WindowOutput::Late(r.value)));
                }
            }
        }
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
        _ctx: &mut OperatorContext,
    ) -> Result<()> {
        if watermark <= self.watermark {
            return Ok(());
        }
        self.watermark = watermark;
        while let Some(entry) = self.timers.first_entry() {
            if *entry.key() > watermark {
                break;
            }
            let keys = entry.remove();
            for key in keys {
                self.fire_key(&key, out);
            }
        }
        Ok(())
    }
}

//! The large keyed state of the state benchmarks (`state_checkpoint`, `big_state_job`): a
//! source that loads `keys` keys of `value_bytes` incompressible bytes each, then — once a
//! completed checkpoint holds the whole load — updates a stride of them at a fixed rate; and
//! the aggregate that keeps the latest payload of a key (one window per key holds it).

use caudal::{Result as CaudalResult, Source, SourceContext, SourceOutput, SourcePoll, SourceReader};
use caudal::{StreamEnv, WatermarkStrategy};
use caudal_operators::sinks::DiscardSink;
use caudal_operators::window::{AggregateFunction, KeyedWindowExt, WindowAssigner};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// (key, payload)
/// The state's shape and update rate, as flags of the runners.
#[derive(Debug, Clone, clap::Args)]
pub struct StateShape {
    /// Distinct keys.
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: u64,
    /// Bytes of state per key.
    #[arg(long, default_value_t = 1000)]
    pub value_bytes: usize,
    /// Fraction of the keys updated per checkpoint interval after the load.
    #[arg(long, default_value_t = 0.01)]
    pub update_fraction: f64,
    /// Seconds between checkpoints.
    #[arg(long, default_value_t = 2.0)]
    pub checkpoint_interval: f64,
}

impl StateShape {
    /// The checkpoint interval.
    pub fn interval(&self) -> Duration {
        Duration::from_secs_f64(self.checkpoint_interval)
    }

    /// The source of this shape, ending after `total` records (`u64::MAX`: never).
    pub fn source(&self, total: u64) -> LoadThenUpdate {
        LoadThenUpdate {
            keys: self.keys,
            value_bytes: self.value_bytes.max(8),
            updates_per_sec: self.keys as f64 * self.update_fraction / self.checkpoint_interval,
            total,
        }
    }
}

/// `source` (one subtask) → key by key → one day-long window per key keeping the latest
/// payload (the operator `state`) → discard. One event-time instant: nothing fires before
/// the end of input, so the state only grows to the load.
pub fn add_pipeline(env: &StreamEnv, source: LoadThenUpdate) {
    env.source(
        "load-then-update",
        source,
        WatermarkStrategy::bounded_out_of_orderness(Duration::ZERO, |_| 0),
    )
    .parallelism(1)
    .key_by(|e: &Entry| e.0)
    .window(WindowAssigner::tumbling(Duration::from_secs(86_400)))
    .name("state")
    .aggregate(Latest)
    .sink("discard", |_| Ok(DiscardSink::default()));
}

/// (key, payload)
pub type Entry = (u64, Vec<u8>);

/// Emits every key once (the load), then updates at a rate of `updates_per_sec` until
/// `total` records were emitted.
pub struct LoadThenUpdate {
    /// Distinct keys loaded first.
    pub keys: u64,
    /// Bytes of state per key.
    pub value_bytes: usize,
    /// Updates per second after the load.
    pub updates_per_sec: f64,
    /// Records in all (load + updates); `u64::MAX`: unbounded.
    pub total: u64,
}

struct Reader {
    cfg: LoadThenUpdate,
    next: u64,
    updates_started: Option<Instant>,
    /// Position recorded by the last snapshot (at most one checkpoint is in flight).
    snapshotted: u64,
    /// The load is in a completed checkpoint: updates may start.
    loaded: bool,
}

/// The first checkpoint holding the whole load (its id), set by the source.
pub static LOADED_AT: AtomicU64 = AtomicU64::new(0);

impl Source for LoadThenUpdate {
    type Out = Entry;

    fn create_reader(
        &self,
        _ctx: &SourceContext,
        restored: &[Vec<u8>],
    ) -> CaudalResult<Box<dyn SourceReader<Entry>>> {
        let next = restored.first().and_then(|p| p.as_slice().try_into().ok()).map_or(0, u64::from_le_bytes);
        let cfg = LoadThenUpdate { ..*self };
        let loaded = next >= self.keys;
        Ok(Box::new(Reader { cfg, next, updates_started: None, snapshotted: 0, loaded }))
    }
}

impl SourceReader<Entry> for Reader {
    fn splits(&self) -> usize {
        1
    }

    fn poll(&mut self, out: &mut SourceOutput<'_, Entry>) -> CaudalResult<SourcePoll> {
        let c = &self.cfg;
        while out.capacity_left() > 0 && self.next < c.total {
            let n = self.next;
            if n >= c.keys {
                if !self.loaded {
                    // Updates start once a checkpoint holds the whole load.
                    return Ok(SourcePoll::Pending(Duration::from_millis(5)));
                }
                let started = *self.updates_started.get_or_insert_with(Instant::now);
                let due = (started.elapsed().as_secs_f64() * c.updates_per_sec) as u64;
                if n - c.keys >= due {
                    return Ok(SourcePoll::Pending(Duration::from_millis(5)));
                }
            }
            // Updates walk the keys with a stride so they spread over all key groups.
            let key = if n < c.keys { n } else { (n - c.keys).wrapping_mul(7919) % c.keys };
            // Incompressible bytes (xorshift), like real state after LZ4.
            let mut x = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let payload: Vec<u8> = (0..c.value_bytes)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            out.collect(0, (key, payload));
            self.next += 1;
        }
        Ok(if self.next >= c.total { SourcePoll::Finished } else { SourcePoll::Ready })
    }

    fn position(&mut self) -> CaudalResult<Vec<u8>> {
        self.snapshotted = self.next;
        Ok(self.next.to_le_bytes().to_vec())
    }

    fn on_checkpoint_complete(&mut self, checkpoint: caudal::CheckpointId) -> CaudalResult<()> {
        if !self.loaded && self.snapshotted >= self.cfg.keys {
            self.loaded = true;
            LOADED_AT.store(checkpoint.0, Ordering::SeqCst);
        }
        Ok(())
    }
}

impl Clone for LoadThenUpdate {
    fn clone(&self) -> Self {
        LoadThenUpdate { ..*self }
    }
}

/// Keeps the latest payload of a key.
pub struct Latest;

impl AggregateFunction<Entry> for Latest {
    type Acc = Vec<u8>;
    type Out = usize;
    fn create(&self) -> Vec<u8> {
        Vec::new()
    }
    fn add(&self, acc: &mut Vec<u8>, v: &Entry) {
        acc.clone_from(&v.1);
    }
    fn merge(&self, acc: &mut Vec<u8>, o: Vec<u8>) {
        *acc = o;
    }
    fn result(&self, acc: &Vec<u8>) -> usize {
        acc.len()
    }
}

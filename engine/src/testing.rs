//! Helpers for tests and examples: a sink that collects into shared memory, a source that
//! counts.

use crate::operator::{OperatorContext, Sink};
use crate::types::{Batch, Data};
use crate::Result;
use parking_lot::Mutex;
use std::sync::Arc;

/// Collects every value it receives (from all subtasks) into a shared vector.
#[derive(Debug)]
pub struct CollectSink<T> {
    out: Arc<Mutex<Vec<T>>>,
}

impl<T> Clone for CollectSink<T> {
    fn clone(&self) -> Self {
        CollectSink { out: self.out.clone() }
    }
}

impl<T: Data> CollectSink<T> {
    /// A sink and the vector it fills.
    pub fn new() -> (Self, Arc<Mutex<Vec<T>>>) {
        let out = Arc::new(Mutex::new(Vec::new()));
        (CollectSink { out: out.clone() }, out)
    }
}

impl<T: Data> Sink for CollectSink<T> {
    type In = T;

    fn write_batch(&mut self, batch: Batch<T>, _ctx: &mut OperatorContext) -> Result<()> {
        self.out.lock().extend(batch.into_iter().map(|r| r.value));
        Ok(())
    }
}

/// A snapshot taken by [`OperatorHarness::snapshot`].
#[derive(Debug, Clone)]
pub struct HarnessSnapshot {
    /// What `Operator::snapshot` returned.
    pub operator_state: Option<Vec<u8>>,
    /// The keyed state's handle.
    pub keyed: caudal_checkpoints::StateHandle,
    store: Arc<caudal_checkpoints::InMemoryCheckpointStore>,
}

/// Drives one operator instance directly, as a task would: batches, watermarks, close.
///
/// ```
/// use caudal::testing::OperatorHarness;
/// use caudal::{Batch, Operator, OperatorContext, Record, Result};
/// struct Double;
/// impl Operator for Double {
///     type In = i64;
///     type Out = i64;
///     fn process_batch(&mut self, b: Batch<i64>, out: &mut Batch<i64>, _: &mut OperatorContext) -> Result<()> {
///         out.extend(b.into_iter().map(|r| Record::new(r.ts, r.value * 2)));
///         Ok(())
///     }
/// }
/// let mut h = OperatorHarness::new(Double).unwrap();
/// h.process(vec![Record::new(1, 21)]).unwrap();
/// assert_eq!(h.take_values(), vec![42]);
/// ```
pub struct OperatorHarness<O: crate::Operator> {
    op: O,
    ctx: crate::OperatorContext,
    out: Batch<O::Out>,
}

impl<O: crate::Operator> std::fmt::Debug for OperatorHarness<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OperatorHarness({})", self.ctx.operator_name)
    }
}

impl<O: crate::Operator> OperatorHarness<O> {
    /// Start `op` as subtask 0 of 1.
    pub fn new(mut op: O) -> Result<Self> {
        let mut ctx = crate::OperatorContext {
            job_name: "test".into(),
            operator_name: "under-test".into(),
            subtask: 0,
            parallelism: 1,
            max_parallelism: crate::keygroup::DEFAULT_MAX_PARALLELISM,
            key_groups: 0..crate::keygroup::DEFAULT_MAX_PARALLELISM as u16,
            watermark: crate::types::MIN_WATERMARK,
            metrics: Arc::new(crate::metrics::SubtaskMetrics::default()),
            operator_uid: "0-under-test".into(),
            checkpointing: false,
            checkpoint_timing: None,
            restored_checkpoint: None,
            attempt: crate::operator::new_attempt_id(),
            restored: None,
            later_snapshots: Vec::new(),
            fence: None,
            keyed: Some(crate::state::KeyedState::heap(caudal_checkpoints::KeyGroupRange::all(
                crate::keygroup::DEFAULT_MAX_PARALLELISM as u16,
            ))),
            state_queries: None,
        };
        op.on_start(&mut ctx)?;
        Ok(OperatorHarness { op, ctx, out: Vec::new() })
    }

    /// Replaces the keyed state (before the first record), e.g. with a small write-back
    /// cache or a RocksDB backend.
    pub fn with_keyed_state(mut self, keyed: crate::state::KeyedState) -> Self {
        self.ctx.keyed = Some(keyed);
        self
    }

    /// Feed a batch.
    pub fn process(&mut self, batch: Batch<O::In>) -> Result<()> {
        self.op.process_batch(batch, &mut self.out, &mut self.ctx)
    }

    /// Advance the watermark.
    pub fn watermark(&mut self, wm: crate::Timestamp) -> Result<()> {
        self.ctx.watermark = wm;
        self.op.on_watermark(wm, &mut self.out, &mut self.ctx)
    }

    /// Advance processing time to `now` (ms since the epoch), as a task would once the
    /// operator's `next_processing_time` has passed.
    pub fn processing_time(&mut self, now: crate::Timestamp) -> Result<()> {
        if self.op.next_processing_time().is_some_and(|at| at <= now) {
            self.op.on_processing_time(now, &mut self.out, &mut self.ctx)?;
        }
        Ok(())
    }

    /// Close the operator (end of input).
    pub fn close(&mut self) -> Result<()> {
        self.op.on_close(&mut self.out, &mut self.ctx)
    }

    /// The output records so far (drained).
    pub fn take(&mut self) -> Batch<O::Out> {
        std::mem::take(&mut self.out)
    }

    /// The output values so far (drained).
    pub fn take_values(&mut self) -> Vec<O::Out> {
        self.take().into_iter().map(|r| r.value).collect()
    }

    /// Take a snapshot as at a checkpoint barrier: the operator's own state and its keyed
    /// state (a heap snapshot, uploaded to an in-memory store).
    pub fn snapshot(&mut self, checkpoint: u64) -> Result<HarnessSnapshot> {
        let id = crate::CheckpointId(checkpoint);
        let operator_state = self.op.snapshot(id, &mut self.ctx)?;
        let store = Arc::new(caudal_checkpoints::InMemoryCheckpointStore::new());
        let location = caudal_checkpoints::StateLocation {
            paths: caudal_checkpoints::CheckpointPaths::new(),
            checkpoint: id,
            operator: caudal_checkpoints::OperatorId::new(self.ctx.operator_uid.clone())?,
            subtask: caudal_checkpoints::SubtaskIndex(self.ctx.subtask),
            latest_completed: None,
        };
        let keyed = self.ctx.keyed_state()?.snapshot(&location)?.upload(store.as_ref())?.handle;
        Ok(HarnessSnapshot { operator_state, keyed, store })
    }

    /// Restore from snapshots (one per old subtask) as subtask `subtask` of `parallelism`:
    /// the keyed state of the new key-group range (rescaling), then `Operator::restore`.
    pub fn restore_as(
        &mut self,
        snapshots: Vec<HarnessSnapshot>,
        subtask: u32,
        parallelism: u32,
    ) -> Result<()> {
        self.ctx.subtask = subtask;
        self.ctx.parallelism = parallelism;
        self.ctx.key_groups =
            crate::keygroup::key_group_range(subtask, self.ctx.max_parallelism, parallelism);
        let range =
            caudal_checkpoints::KeyGroupRange::new(self.ctx.key_groups.start, self.ctx.key_groups.end);
        let mut backend = caudal_checkpoints::HeapStateBackend::new(range);
        let mut blobs = Vec::new();
        for s in snapshots {
            let handles = caudal_checkpoints::handles_for_range(std::slice::from_ref(&s.keyed), range);
            let part = caudal_checkpoints::HeapStateBackend::restore(range, &handles, s.store.as_ref())?;
            for kg in range.iter() {
                let mut after: Option<Vec<u8>> = None;
                loop {
                    let page = caudal_checkpoints::KeyedStateBackend::list_entries(
                        &part,
                        kg,
                        after.as_deref(),
                        1024,
                    )?;
                    let mut batch = caudal_checkpoints::StateWriteBatch::new();
                    for e in &page.entries {
                        batch.put_raw(e.key.clone(), e.value.clone());
                    }
                    caudal_checkpoints::KeyedStateBackend::write_batch(&mut backend, batch)?;
                    match page.next {
                        Some(n) => after = Some(n),
                        None => break,
                    }
                }
            }
            blobs.extend(s.operator_state);
        }
        self.ctx.keyed = Some(crate::state::KeyedState::from_backend(Box::new(backend)));
        self.op.restore(blobs, &mut self.ctx)
    }

    /// The keyed state of the operator under test.
    pub fn keyed_state(&self) -> Result<crate::state::KeyedStateGuard<'_>> {
        self.ctx.keyed_state()
    }

    /// A custom counter of the operator.
    pub fn counter(&self, name: &'static str) -> u64 {
        self.ctx.metrics.counter(name).load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The operator.
    pub fn operator(&self) -> &O {
        &self.op
    }
}

/// Parses a table of whitespace-separated columns, one record per line; `#` starts a
/// comment and the first line may be a header (skipped when its first cell isn't a number).
///
/// ```
/// let rows = caudal::testing::parse_table("ts sensor temp_f\n 1 7 212.0\n 2 7 32.0");
/// assert_eq!(rows, vec![vec!["1", "7", "212.0"], vec!["2", "7", "32.0"]]);
/// ```
pub fn parse_table(table: &str) -> Vec<Vec<&str>> {
    let mut rows = Vec::new();
    for (i, line) in table.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let cells: Vec<&str> = line.split_whitespace().collect();
        if i == 0 && cells.first().is_some_and(|c| c.parse::<f64>().is_err()) {
            continue;
        }
        rows.push(cells);
    }
    rows
}

/// Counts `0..n` in every subtask: one split, no positions (a restore starts over).
#[derive(Debug, Clone)]
pub struct CountSource(pub u64);

struct CountReader {
    n: u64,
    next: u64,
}

impl crate::Source for CountSource {
    type Out = u64;
    fn create_reader(
        &self,
        _: &crate::SourceContext,
        _: &[Vec<u8>],
    ) -> Result<Box<dyn crate::SourceReader<u64>>> {
        Ok(Box::new(CountReader { n: self.0, next: 0 }))
    }
}

impl crate::SourceReader<u64> for CountReader {
    fn splits(&self) -> usize {
        1
    }
    fn poll(&mut self, out: &mut crate::SourceOutput<'_, u64>) -> Result<crate::SourcePoll> {
        while out.capacity_left() > 0 && self.next < self.n {
            out.collect(0, self.next);
            self.next += 1;
        }
        Ok(if self.next == self.n { crate::SourcePoll::Finished } else { crate::SourcePoll::Ready })
    }
}

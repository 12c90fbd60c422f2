//! Sources: split readers, timestamp assignment and watermark generation.
//!
//! A source is divided into splits (a Kafka partition, a generator shard). Each subtask
//! reads some splits; the engine tracks a bounded-out-of-orderness watermark per split and
//! emits the minimum over splits that are neither idle nor finished.

mod rate_limit;

pub use rate_limit::RateLimited;

use crate::types::{Data, Record, Timestamp, MAX_WATERMARK, MIN_WATERMARK};
use crate::Result;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where a source subtask runs.
#[derive(Debug, Clone)]
pub struct SourceContext {
    /// The job's name.
    pub job_name: String,
    /// This subtask's counters (a source adds its own, e.g. per-partition lag).
    pub metrics: Arc<crate::metrics::SubtaskMetrics>,
    /// The source operator's name.
    pub operator_name: String,
    /// This subtask's index.
    pub subtask: u32,
    /// The source's parallelism.
    pub parallelism: u32,
}

/// A source: creates one reader per subtask.
pub trait Source: Send + Sync + 'static {
    /// The element type produced.
    type Out: Data;

    /// The reader of subtask `ctx.subtask`.
    ///
    /// `restored` holds the positions every subtask of the restored checkpoint reported
    /// (empty on a fresh start); after a rescale a reader takes the splits it now owns from
    /// whichever blob has them.
    fn create_reader(
        &self,
        ctx: &SourceContext,
        restored: &[Vec<u8>],
    ) -> Result<Box<dyn SourceReader<Self::Out>>>;
}

/// What a poll found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourcePoll {
    /// Records were emitted (or may be available right away).
    Ready,
    /// Nothing available now; poll again after at most this long.
    Pending(Duration),
    /// Every split of this reader is finished.
    Finished,
}

/// One subtask's reader of a source.
pub trait SourceReader<T>: Send {
    /// The number of splits this reader owns (indices `0..splits()` in [`SourceOutput::collect`]).
    fn splits(&self) -> usize;

    /// Emit up to `out.capacity_left()` records.
    fn poll(&mut self, out: &mut SourceOutput<'_, T>) -> Result<SourcePoll>;

    /// The reader's position after the last emitted record (sequence numbers, offsets).
    fn position(&mut self) -> Result<Vec<u8>> {
        Ok(Vec::new())
    }

    /// The checkpoint holding the position up to which the reader read is complete.
    fn on_checkpoint_complete(&mut self, _checkpoint: crate::types::CheckpointId) -> Result<()> {
        Ok(())
    }
}

/// Extracts the event time of a record.
pub type TimestampFn<T> = Arc<dyn Fn(&T) -> Timestamp + Send + Sync>;

/// How a source assigns timestamps and generates watermarks.
pub struct WatermarkStrategy<T> {
    pub(crate) timestamp: Option<TimestampFn<T>>,
    pub(crate) out_of_orderness: Duration,
    pub(crate) idle_timeout: Option<Duration>,
}

impl<T> Clone for WatermarkStrategy<T> {
    fn clone(&self) -> Self {
        WatermarkStrategy {
            timestamp: self.timestamp.clone(),
            out_of_orderness: self.out_of_orderness,
            idle_timeout: self.idle_timeout,
        }
    }
}

impl<T> WatermarkStrategy<T> {
    /// No event time: records carry [`MIN_WATERMARK`]; only the final watermark is emitted.
    pub fn none() -> Self {
        WatermarkStrategy { timestamp: None, out_of_orderness: Duration::ZERO, idle_timeout: None }
    }

    /// Event time from `timestamp`, watermark = max seen − `out_of_orderness` − 1 ms per split.
    ///
    /// # Examples
    /// ```
    /// use caudal::WatermarkStrategy;
    /// use std::time::Duration;
    /// let s: WatermarkStrategy<(i64, f64)> =
    ///     WatermarkStrategy::bounded_out_of_orderness(Duration::from_secs(5), |r: &(i64, f64)| r.0)
    ///         .with_idleness(Duration::from_secs(30));
    /// # let _ = s;
    /// ```
    pub fn bounded_out_of_orderness(
        out_of_orderness: Duration,
        timestamp: impl Fn(&T) -> Timestamp + Send + Sync + 'static,
    ) -> Self {
        WatermarkStrategy { timestamp: Some(Arc::new(timestamp)), out_of_orderness, idle_timeout: None }
    }

    /// Exclude a split from the watermark after it emitted nothing for `timeout`.
    pub fn with_idleness(mut self, timeout: Duration) -> Self {
        self.idle_timeout = Some(timeout);
        self
    }

    /// The same strategy for a source whose records wrap a `T` or hold something else
    /// (e.g. a Kafka record that did not decode, sent on as a dead letter). With a timestamp
    /// function, a record holding a `T` is timed as the `T`, and one holding none carries
    /// [`MIN_WATERMARK`]: it keeps its split active and never moves its watermark (its own
    /// time, if any, is not the stream's event time: a dead letter's broker timestamp would
    /// make the next readings late).
    pub fn lift<U>(self, inner: impl Fn(&U) -> Option<&T> + Send + Sync + 'static) -> WatermarkStrategy<U>
    where
        T: 'static,
    {
        let timestamp = self
            .timestamp
            .map(|f| Arc::new(move |u: &U| inner(u).map_or(MIN_WATERMARK, |t| f(t))) as TimestampFn<U>);
        WatermarkStrategy {
            timestamp,
            out_of_orderness: self.out_of_orderness,
            idle_timeout: self.idle_timeout,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct SplitClock {
    max_ts: Timestamp,
    last_active: Instant,
    finished: bool,
}

/// Per-split watermark state of one source subtask.
pub(crate) struct SplitWatermarks {
    splits: Vec<SplitClock>,
    delay_ms: i64,
    idle_timeout: Option<Duration>,
}

impl SplitWatermarks {
    pub(crate) fn new(n: usize, out_of_orderness: Duration, idle_timeout: Option<Duration>) -> Self {
        let now = Instant::now();
        SplitWatermarks {
            splits: vec![SplitClock { max_ts: MIN_WATERMARK, last_active: now, finished: false }; n],
            delay_ms: i64::try_from(out_of_orderness.as_millis()).unwrap_or(i64::MAX),
            idle_timeout,
        }
    }

    /// Called for every record a source emits: inlined, with a split seen for the first
    /// time handled out of line.
    #[inline]
    pub(crate) fn observe(&mut self, split: usize, ts: Timestamp, now: Instant) {
        let Some(s) = self.splits.get_mut(split) else { return self.observe_new(split, ts, now) };
        if ts > s.max_ts {
            s.max_ts = ts;
        }
        s.last_active = now;
    }

    #[cold]
    #[inline(never)]
    fn observe_new(&mut self, split: usize, ts: Timestamp, now: Instant) {
        self.splits
            .resize(split + 1, SplitClock { max_ts: MIN_WATERMARK, last_active: now, finished: false });
        self.observe(split, ts, now);
    }

    /// Split `split` is not idle now, though it emitted nothing.
    pub(crate) fn touch(&mut self, split: usize, now: Instant) {
        if let Some(s) = self.splits.get_mut(split) {
            s.last_active = now;
        }
    }

    pub(crate) fn finish(&mut self, split: usize) {
        if let Some(s) = self.splits.get_mut(split) {
            s.finished = true;
        }
    }

    /// Split `split`'s own watermark (`None` before its first record).
    pub(crate) fn split(&self, split: usize) -> Option<Timestamp> {
        let s = self.splits.get(split)?;
        if s.finished {
            Some(MAX_WATERMARK)
        } else if s.max_ts == MIN_WATERMARK {
            None
        } else {
            Some(s.max_ts - self.delay_ms - 1)
        }
    }

    /// The subtask watermark: `Some(wm)` over the active splits, `None` when all are idle.
    pub(crate) fn current(&self, now: Instant) -> Option<Timestamp> {
        // No split yet (an unbounded reader whose partitions are all another subtask's, until
        // one is added): idle, not at the end of time — records may come later.
        if self.splits.is_empty() {
            return None;
        }
        let mut wm = MAX_WATERMARK;
        let mut any_active = false;
        let mut all_finished = true;
        for s in &self.splits {
            if s.finished {
                continue;
            }
            all_finished = false;
            if let Some(t) = self.idle_timeout {
                if now.duration_since(s.last_active) >= t {
                    continue;
                }
            }
            any_active = true;
            let w = if s.max_ts == MIN_WATERMARK { MIN_WATERMARK } else { s.max_ts - self.delay_ms - 1 };
            wm = wm.min(w);
        }
        if all_finished {
            Some(MAX_WATERMARK)
        } else if any_active {
            Some(wm)
        } else {
            None
        }
    }
}

/// The buffer a reader emits into; assigns timestamps and tracks split watermarks.
pub struct SourceOutput<'a, T> {
    pub(crate) batch: &'a mut Vec<Record<T>>,
    pub(crate) capacity: usize,
    pub(crate) timestamp: Option<&'a TimestampFn<T>>,
    pub(crate) clocks: &'a mut SplitWatermarks,
    pub(crate) now: Instant,
}

impl<T> SourceOutput<'_, T> {
    /// Emit `value` read from local split `split`.
    #[inline]
    pub fn collect(&mut self, split: usize, value: T) {
        let ts = match self.timestamp {
            Some(f) => {
                let ts = f(&value);
                self.clocks.observe(split, ts, self.now);
                ts
            }
            None => MIN_WATERMARK,
        };
        self.batch.push(Record { ts, value });
    }

    /// Emit a record whose timestamp the reader knows (e.g. a Kafka record timestamp),
    /// unless the strategy has its own timestamp function.
    #[inline]
    pub fn collect_with_timestamp(&mut self, split: usize, ts: Timestamp, value: T) {
        let ts = match self.timestamp {
            Some(f) => f(&value),
            None => ts,
        };
        self.clocks.observe(split, ts, self.now);
        self.batch.push(Record { ts, value });
    }

    /// Split `split` is known to hold records not read yet (a Kafka partition whose end
    /// offset is past the reader's position while its fetches stall — its broker away, its
    /// leader moving): however long it stays silent, it is not idle. Otherwise the idleness
    /// timeout would let the watermark move on without it, and its records, once read, would
    /// be late: a broker failover would change the job's results.
    pub fn split_has_backlog(&mut self, split: usize) {
        self.clocks.touch(split, self.now);
    }

    /// Mark split `split` finished: it no longer holds the watermark back.
    pub fn finish_split(&mut self, split: usize) {
        self.clocks.finish(split);
    }

    /// The watermark of split `split` so far (`None` before its first record), for sources
    /// that show per-split progress (e.g. per Kafka partition).
    pub fn split_watermark(&self, split: usize) -> Option<Timestamp> {
        self.clocks.split(split)
    }

    /// How many more records fit into this poll's batch.
    pub fn capacity_left(&self) -> usize {
        self.capacity.saturating_sub(self.batch.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lifted_strategy_times_what_wraps_a_record_and_leaves_the_rest_untimed() {
        let s = WatermarkStrategy::bounded_out_of_orderness(Duration::from_secs(1), |r: &i64| *r)
            .with_idleness(Duration::from_secs(7))
            .lift(|r: &Result<i64, String>| r.as_ref().ok());
        let f = s.timestamp.as_ref().expect("still event time");
        assert_eq!(f(&Ok(42)), 42);
        assert_eq!(f(&Err("bad".into())), MIN_WATERMARK);
        assert_eq!(
            (s.out_of_orderness, s.idle_timeout),
            (Duration::from_secs(1), Some(Duration::from_secs(7)))
        );
        let mut w = SplitWatermarks::new(1, Duration::ZERO, None);
        let now = Instant::now();
        w.observe(0, 1_000, now);
        w.observe(0, f(&Err("bad".into())), now);
        assert_eq!(w.split(0), Some(999), "an untimed record leaves the split's watermark alone");
        assert!(WatermarkStrategy::<i64>::none().lift(|r: &Option<i64>| r.as_ref()).timestamp.is_none());
    }

    #[test]
    fn a_silent_split_with_a_backlog_is_not_idle() {
        let t0 = Instant::now();
        let mut w = SplitWatermarks::new(2, Duration::ZERO, Some(Duration::from_secs(5)));
        w.observe(0, 1000, t0);
        w.observe(1, 500, t0);
        // Split 1's fetches stall (its broker is away) while it still has records to read.
        let later = t0 + Duration::from_secs(6);
        w.observe(0, 9000, later);
        w.touch(1, later);
        assert_eq!(w.current(later), Some(499), "the stalled split holds the watermark back");
        // Without a backlog it goes idle as before.
        let much_later = later + Duration::from_secs(6);
        w.observe(0, 9500, much_later);
        assert_eq!(w.current(much_later), Some(9499));
    }

    #[test]
    fn watermark_is_min_over_active_splits() {
        let t0 = Instant::now();
        let mut w = SplitWatermarks::new(2, Duration::from_millis(10), Some(Duration::from_secs(5)));
        assert_eq!(w.current(t0), Some(MIN_WATERMARK));
        w.observe(0, 1000, t0);
        w.observe(1, 500, t0);
        assert_eq!(w.current(t0), Some(489));
        // split 1 goes idle: only split 0 counts
        let later = t0 + Duration::from_secs(6);
        w.observe(0, 2000, later);
        assert_eq!(w.current(later), Some(1989));
        // all idle
        assert_eq!(w.current(later + Duration::from_secs(6)), None);
        w.finish(0);
        w.finish(1);
        assert_eq!(w.current(later), Some(MAX_WATERMARK));
    }
}

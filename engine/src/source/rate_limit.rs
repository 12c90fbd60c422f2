//! A ceiling on a source's read rate: records per second over the whole source, shared
//! evenly by its subtasks (Flink's `RateLimiterStrategy`).
//!
//! Flow: `inner reader ─► token bucket ─► SourceOutput`. A poll may emit at most the tokens
//! the bucket holds; a bucket with less than 10 ms of tokens answers `Pending` until it has
//! them, so a slow source wakes a hundred times a second with a batch, not once per record
//! (at 2,500 records/s a wake per token cost a debug executor half a core). The bucket holds
//! at most 100 ms of tokens, so a pause is not followed by a burst.
//! Positions and checkpoint notifications pass through untouched: a rate-limited source
//! checkpoints and restores exactly like the one it wraps.

use super::{Source, SourceContext, SourceOutput, SourcePoll, SourceReader};
use crate::{Error, Result};
use std::time::{Duration, Instant};

/// `inner`, reading at most `records_per_second` records per second in total.
#[derive(Debug)]
pub struct RateLimited<S> {
    inner: S,
    records_per_second: f64,
}

impl<S: Source> RateLimited<S> {
    /// Limits `inner` to `records_per_second` (> 0) over all its subtasks.
    pub fn new(inner: S, records_per_second: f64) -> Result<Self> {
        if !(records_per_second.is_finite() && records_per_second > 0.0) {
            return Err(Error::config(
                "source rate limit",
                format!("must be a positive number of records per second, got {records_per_second}"),
            ));
        }
        Ok(RateLimited { inner, records_per_second })
    }
}

impl<S: Source> Source for RateLimited<S> {
    type Out = S::Out;

    fn create_reader(
        &self,
        ctx: &SourceContext,
        restored: &[Vec<u8>],
    ) -> Result<Box<dyn SourceReader<S::Out>>> {
        let rate = self.records_per_second / f64::from(ctx.parallelism.max(1));
        Ok(Box::new(RateLimitedReader {
            inner: self.inner.create_reader(ctx, restored)?,
            bucket: TokenBucket::new(rate, Instant::now()),
        }))
    }
}

struct RateLimitedReader<T> {
    inner: Box<dyn SourceReader<T>>,
    bucket: TokenBucket,
}

impl<T: Send> SourceReader<T> for RateLimitedReader<T> {
    fn splits(&self) -> usize {
        self.inner.splits()
    }

    fn poll(&mut self, out: &mut SourceOutput<'_, T>) -> Result<SourcePoll> {
        let allowed = match self.bucket.available(out.now) {
            Ok(n) => n,
            Err(wait) => return Ok(SourcePoll::Pending(wait)),
        };
        let before = out.batch.len();
        let capacity = out.capacity;
        out.capacity = capacity.min(before.saturating_add(allowed));
        let poll = self.inner.poll(out);
        out.capacity = capacity;
        self.bucket.take(out.batch.len().saturating_sub(before));
        poll
    }

    fn position(&mut self) -> Result<Vec<u8>> {
        self.inner.position()
    }

    fn on_checkpoint_complete(&mut self, checkpoint: crate::types::CheckpointId) -> Result<()> {
        self.inner.on_checkpoint_complete(checkpoint)
    }
}

/// Tokens refilled at `rate` per second, at most 100 ms (and at least one) in store, granted
/// once 10 ms of them (and at least one) have gathered.
#[derive(Debug)]
struct TokenBucket {
    rate: f64,
    tokens: f64,
    grant: f64,
    burst: f64,
    refilled: Instant,
}

impl TokenBucket {
    fn new(rate: f64, now: Instant) -> Self {
        let burst = (rate / 10.0).max(1.0);
        let grant = (rate / 100.0).max(1.0);
        TokenBucket { rate, tokens: 0.0, grant, burst, refilled: now }
    }

    /// Whole tokens available now, or how long until a grant's worth is.
    fn available(&mut self, now: Instant) -> std::result::Result<usize, Duration> {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.refilled = now;
        if self.tokens >= self.grant {
            Ok(self.tokens as usize)
        } else {
            Err(Duration::from_secs_f64((self.grant - self.tokens) / self.rate).max(Duration::from_millis(1)))
        }
    }

    fn take(&mut self, n: usize) {
        self.tokens -= n as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_grants_the_rate_and_no_burst_after_a_pause() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1000.0, t0);
        // Empty at start: the first grant (10 ms of tokens) is due after 10 ms.
        assert_eq!(b.available(t0), Err(Duration::from_millis(10)));
        assert!(b.available(t0 + Duration::from_millis(5)).is_err());
        assert_eq!(b.available(t0 + Duration::from_millis(50)), Ok(50));
        b.take(50);
        // A long pause refills at most 100 ms worth.
        assert_eq!(b.available(t0 + Duration::from_secs(10)), Ok(100));
        b.take(100);
        assert!(b.available(t0 + Duration::from_secs(10)).is_err());
        // A slow rate is granted one token at a time.
        let mut slow = TokenBucket::new(2.0, t0);
        assert_eq!(slow.available(t0 + Duration::from_millis(500)), Ok(1));
    }

    #[test]
    fn a_limited_source_delivers_everything_no_faster_than_the_rate() {
        let env = crate::StreamEnv::new();
        let (sink, out) = crate::testing::CollectSink::new();
        let source = RateLimited::new(crate::testing::CountSource(1000), 4000.0).unwrap();
        env.source("count", source, crate::WatermarkStrategy::none())
            .parallelism(2)
            .sink("out", move |_| Ok(sink.clone()));
        let start = Instant::now();
        env.execute("rate-limited").unwrap();
        // Each of the two subtasks reads 1000 records at 2000/s from an empty bucket.
        assert!(start.elapsed() >= Duration::from_millis(450), "{:?}", start.elapsed());
        let mut got = out.lock().clone();
        got.sort_unstable();
        let want: Vec<u64> = (0..1000).flat_map(|i| [i, i]).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_rate_that_is_not_positive_is_refused() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let err = RateLimited::new(crate::testing::CountSource(1), bad).unwrap_err().to_string();
            assert!(err.contains("rate limit"), "{err}");
        }
    }
}

//! The interval join (Flink's `IntervalJoin`): pairs of two keyed streams whose elements of
//! one key lie within bounds of each other in event time.
//!
//! `a.interval_join(b).between(lower, upper).process(f)` emits `f(key, a, b)` for every pair
//! with `a.ts + lower <= b.ts <= a.ts + upper`, at event time `max(a.ts, b.ts)`. It is a keyed
//! two-input process function: each side's elements wait in keyed map state (bucketed by
//! timestamp) for the other side's; a bucket is dropped by an event-time timer once the
//! watermark says no element of the other side can match it any more. As in Flink, an
//! element that arrives late (at or behind the watermark) is dropped.

use super::connect::KeyedCoProcessFunction;
use super::context::{KeyedContext, Output};
use super::state::MapStateDescriptor;
use crate::api::stream::{DataStream, KeyedStream};
use crate::types::{Data, Key, Timestamp};
use crate::{Error, Result};
use std::sync::Arc;
use std::time::Duration;

/// Two keyed streams to join by interval (`KeyedStream::interval_join`).
pub struct IntervalJoin<K, A, B> {
    left: KeyedStream<K, A>,
    right: KeyedStream<K, B>,
}

impl<K, A, B> std::fmt::Debug for IntervalJoin<K, A, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IntervalJoin({:?}, {:?})", self.left, self.right)
    }
}

/// An interval join with its bounds set.
pub struct IntervalJoinBetween<K, A, B> {
    join: IntervalJoin<K, A, B>,
    lower: i64,
    upper: i64,
}

impl<K, A, B> std::fmt::Debug for IntervalJoinBetween<K, A, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IntervalJoin({:?}, [{}, {}] ms)", self.join, self.lower, self.upper)
    }
}

impl<K: Key, A: Data> KeyedStream<K, A> {
    /// Join with another stream keyed alike, by event-time interval.
    pub fn interval_join<B: Data>(self, other: KeyedStream<K, B>) -> IntervalJoin<K, A, B> {
        IntervalJoin { left: self, right: other }
    }
}

/// A signed duration in ms (`-` for before).
fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl<K: Key, A: Data, B: Data> IntervalJoin<K, A, B> {
    /// Pairs with `a.ts - before <= b.ts <= a.ts + after`.
    pub fn between(self, before: Duration, after: Duration) -> IntervalJoinBetween<K, A, B> {
        IntervalJoinBetween { join: self, lower: -ms(before), upper: ms(after) }
    }

    /// Pairs with `a.ts + lower <= b.ts <= a.ts + upper` (ms, either may be negative).
    pub fn between_ms(self, lower: i64, upper: i64) -> IntervalJoinBetween<K, A, B> {
        IntervalJoinBetween { join: self, lower, upper }
    }
}

impl<K: Key, A: Data, B: Data> IntervalJoinBetween<K, A, B> {
    /// Emit `f(key, a, b)` for every pair. Set a `.uid(..)` on the result: the waiting
    /// elements are state.
    pub fn process<O: Data>(self, f: impl Fn(&K, &A, &B) -> O + Send + Sync + 'static) -> DataStream<O> {
        let (lower, upper) = (self.lower, self.upper);
        if lower > upper {
            let graph = self.join.left.stream.graph.clone();
            graph
                .borrow_mut()
                .error(format!("interval join: lower bound {lower} ms is above the upper bound {upper} ms"));
        }
        let (ka, kb) = (self.join.left.key_fn(), self.join.right.key_fn());
        self.join
            .left
            .stream
            .connect(self.join.right.stream)
            .key_by(move |a: &A| ka(a), move |b: &B| kb(b))
            .process(Joiner {
                lower,
                upper,
                left: MapStateDescriptor::new("left"),
                right: MapStateDescriptor::new("right"),
                f: Arc::new(f),
            })
            .name("interval-join")
    }
}

type JoinFn<K, A, B, O> = Arc<dyn Fn(&K, &A, &B) -> O + Send + Sync>;

struct Joiner<K, A, B, O> {
    lower: i64,
    upper: i64,
    left: MapStateDescriptor<Timestamp, Vec<A>>,
    right: MapStateDescriptor<Timestamp, Vec<B>>,
    f: JoinFn<K, A, B, O>,
}

impl<K, A, B, O> Clone for Joiner<K, A, B, O> {
    fn clone(&self) -> Self {
        Joiner {
            lower: self.lower,
            upper: self.upper,
            left: self.left.clone(),
            right: self.right.clone(),
            f: self.f.clone(),
        }
    }
}

fn overflow() -> Error {
    Error::Operator("interval join: a timestamp plus a bound overflows".into())
}

impl<K: Key, A: Data, B: Data, O: Data> KeyedCoProcessFunction<K, A, B, O> for Joiner<K, A, B, O> {
    fn process_element1(
        &mut self,
        a: A,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Output<'_, O>,
    ) -> Result<()> {
        let ts = ctx.timestamp();
        if ts <= ctx.current_watermark() {
            return Ok(()); // late: its matches may have been cleaned up already
        }
        let (from, to) = (
            ts.checked_add(self.lower).ok_or_else(overflow)?,
            ts.checked_add(self.upper).ok_or_else(overflow)?,
        );
        let key = ctx.key().clone();
        for (bts, bs) in ctx.map(&self.right).entries()? {
            if (from..=to).contains(&bts) {
                for b in &bs {
                    out.collect_at(ts.max(bts), (self.f)(&key, &a, b));
                }
            }
        }
        let mut left = ctx.map(&self.left);
        let mut bucket = left.get(&ts)?.unwrap_or_default();
        bucket.push(a);
        left.insert(&ts, &bucket)?;
        // No right element can match `a` once the watermark passes ts + upper.
        ctx.register_event_time_timer(to.max(ts))
    }

    fn process_element2(
        &mut self,
        b: B,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Output<'_, O>,
    ) -> Result<()> {
        let ts = ctx.timestamp();
        if ts <= ctx.current_watermark() {
            return Ok(());
        }
        let (from, to) = (
            ts.checked_sub(self.upper).ok_or_else(overflow)?,
            ts.checked_sub(self.lower).ok_or_else(overflow)?,
        );
        let key = ctx.key().clone();
        for (ats, as_) in ctx.map(&self.left).entries()? {
            if (from..=to).contains(&ats) {
                for a in &as_ {
                    out.collect_at(ts.max(ats), (self.f)(&key, a, &b));
                }
            }
        }
        let mut right = ctx.map(&self.right);
        let mut bucket = right.get(&ts)?.unwrap_or_default();
        bucket.push(b);
        right.insert(&ts, &bucket)?;
        // No left element can match `b` once the watermark passes ts - lower.
        ctx.register_event_time_timer(to.max(ts))
    }

    /// Drops the buckets whose time to be matched is over: each registered a timer at its
    /// last useful time (`max(ts + upper, ts)` on the left, `max(ts - lower, ts)` on the
    /// right), so the buckets of timer `t` are the left one of `t - upper` (of `t` when the
    /// upper bound is negative) and the right one of `t + lower` (of `t` when the lower bound
    /// is positive) — two removals, whatever the number of buckets waiting.
    fn on_timer(
        &mut self,
        t: Timestamp,
        ctx: &mut KeyedContext<'_, K>,
        _out: &mut Output<'_, O>,
    ) -> Result<()> {
        let left = if self.upper >= 0 { t.checked_sub(self.upper) } else { Some(t) };
        let right = if self.lower <= 0 { t.checked_add(self.lower) } else { Some(t) };
        if let Some(ts) = left {
            ctx.map(&self.left).remove(&ts)?;
        }
        if let Some(ts) = right {
            ctx.map(&self.right).remove(&ts)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::process::connect::{KeyedCo, TwoInputs};
    use crate::api::process::operator::KeyedProcessOperator;
    use crate::api::process::Tagged;
    use crate::testing::OperatorHarness;
    use crate::types::Record;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Left(u8, i64),
        Right(u8, i64),
        Watermark(i64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u8..3, 0i64..40).prop_map(|(k, d)| Op::Left(k, d)),
            3 => (0u8..3, 0i64..40).prop_map(|(k, d)| Op::Right(k, d)),
            2 => (0i64..15).prop_map(Op::Watermark),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Elements at the watermark plus 0..40 ms, watermarks in small steps: every pair of
        /// accepted elements within the bounds comes out once, whatever the cleanup did.
        #[test]
        fn pairs_equal_a_nested_loop_over_the_elements_that_were_not_late(
            ops in prop::collection::vec(op(), 1..150), lower in -20i64..10, width in 0i64..30,
        ) {
            let upper = lower + width;
            let joiner = Joiner {
                lower,
                upper,
                left: MapStateDescriptor::new("left"),
                right: MapStateDescriptor::new("right"),
                f: Arc::new(|k: &u8, a: &i64, b: &i64| (*k, *a, *b)),
            };
            let key = Arc::new(|e: &TwoInputs<(u8, i64), (u8, i64)>| match e {
                TwoInputs::First(a) => a.0,
                TwoInputs::Second(b) => b.0,
            });
            let op = KeyedProcessOperator::new(KeyedCo(JoinerOn(joiner)), key);
            let mut h = OperatorHarness::new(op).unwrap();
            let (mut wm, mut left, mut right) = (0i64, Vec::new(), Vec::new());
            // The operator's watermark: none until the first is given.
            let mut given: Option<i64> = None;
            for op in ops {
                let late = |ts: i64| given.is_some_and(|w| ts <= w);
                match op {
                    Op::Left(k, d) => {
                        if !late(wm + d) {
                            left.push((k, wm + d));
                        }
                        h.process(vec![Record::new(wm + d, TwoInputs::First((k, wm + d)))]).unwrap();
                    }
                    Op::Right(k, d) => {
                        if !late(wm + d) {
                            right.push((k, wm + d));
                        }
                        h.process(vec![Record::new(wm + d, TwoInputs::Second((k, wm + d)))]).unwrap();
                    }
                    Op::Watermark(d) => {
                        wm += d;
                        given = Some(wm);
                        h.watermark(wm).unwrap();
                    }
                }
            }
            let mut got: Vec<(u8, i64, i64)> = h
                .take()
                .into_iter()
                .filter_map(|r| match r.value { Tagged::Main(v) => Some(v), Tagged::Side(..) => None })
                .collect();
            got.sort();
            // Once the watermark passes every bucket's time, the cleanup left no element.
            h.watermark(wm + 1_000).unwrap();
            let waiting: u64 = h.keyed_state().unwrap().key_group_stats().unwrap().iter().map(|s| s.entries).sum();
            prop_assert_eq!(waiting, 0, "elements left in state");
            let mut want = Vec::new();
            for a in &left {
                for b in &right {
                    if a.0 == b.0 && a.1 + lower <= b.1 && b.1 <= a.1 + upper {
                        want.push((a.0, a.1, b.1));
                    }
                }
            }
            want.sort();
            prop_assert_eq!(got, want);
        }
    }

    /// The joiner on (key, ts) elements whose payload is their timestamp.
    #[derive(Clone)]
    struct JoinerOn(Joiner<u8, i64, i64, (u8, i64, i64)>);

    impl KeyedCoProcessFunction<u8, (u8, i64), (u8, i64), (u8, i64, i64)> for JoinerOn {
        fn process_element1(
            &mut self,
            a: (u8, i64),
            ctx: &mut KeyedContext<'_, u8>,
            out: &mut Output<'_, (u8, i64, i64)>,
        ) -> Result<()> {
            self.0.process_element1(a.1, ctx, out)
        }
        fn process_element2(
            &mut self,
            b: (u8, i64),
            ctx: &mut KeyedContext<'_, u8>,
            out: &mut Output<'_, (u8, i64, i64)>,
        ) -> Result<()> {
            self.0.process_element2(b.1, ctx, out)
        }
        fn on_timer(
            &mut self,
            t: Timestamp,
            ctx: &mut KeyedContext<'_, u8>,
            out: &mut Output<'_, (u8, i64, i64)>,
        ) -> Result<()> {
            self.0.on_timer(t, ctx, out)
        }
    }
}

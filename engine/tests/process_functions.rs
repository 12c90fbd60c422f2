//! Process functions in running jobs: keyed state, event-time and processing-time timers and
//! side outputs through the real runtime (threads, key-by exchanges, watermarks), each
//! checked against a model computed without the engine.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use caudal::process::{
    on_bad_record, BroadcastContext, BroadcastStateDescriptor, CoProcessFunction, Context, FailedElement,
    KeyedBroadcastProcessFunction, KeyedCoProcessFunction, KeyedContext, KeyedProcessFunction,
    ListStateDescriptor, OnBadRecord, Output, OutputTag, ProcessFunction, TimeDomain, ValueStateDescriptor,
};
use caudal::testing::CollectSink;
use caudal::types::MAX_WATERMARK;
use caudal::{
    JobConfig, Result, Source, SourceContext, SourceOutput, SourcePoll, SourceReader, StreamEnv, Timestamp,
    WatermarkStrategy,
};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

fn config(parallelism: u32) -> JobConfig {
    JobConfig { parallelism, batch_size: 16, ..JobConfig::default() }
}

static ODD: OutputTag<(u32, i64)> = OutputTag::new("odd");

/// Per key: counts readings, keeps one event-time timer `GAP` after the latest one, and
/// says how many it saw when the timer fires (a "session" of the key ended); odd values
/// also go to a side output.
#[derive(Clone)]
struct Sessions {
    count: ValueStateDescriptor<u64>,
    timer: ValueStateDescriptor<Timestamp>,
}

const GAP: i64 = 100;

impl KeyedProcessFunction<u32, (u32, i64), (u32, Timestamp, u64)> for Sessions {
    fn process_element(
        &mut self,
        value: (u32, i64),
        ctx: &mut KeyedContext<'_, u32>,
        out: &mut Output<'_, (u32, Timestamp, u64)>,
    ) -> Result<()> {
        if value.1 % 2 != 0 {
            ctx.output(&ODD, value)?;
        }
        if let Some(old) = ctx.value(&self.timer).get()? {
            ctx.delete_event_time_timer(old)?;
            if old < ctx.timestamp() {
                // The session ended before this element; its timer had not fired yet
                // (the watermark lags the elements): close it now, as the timer would have.
                let n = ctx.value(&self.count).get()?.unwrap_or(0);
                out.collect_at(old, (*ctx.key(), old, n));
                ctx.value(&self.count).clear()?;
            }
        }
        let n = ctx.value(&self.count).get()?.unwrap_or(0) + 1;
        ctx.value(&self.count).set(&n)?;
        let at = ctx.timestamp() + GAP;
        ctx.register_event_time_timer(at)?;
        ctx.value(&self.timer).set(&at)
    }

    fn on_timer(
        &mut self,
        ts: Timestamp,
        ctx: &mut KeyedContext<'_, u32>,
        out: &mut Output<'_, (u32, Timestamp, u64)>,
    ) -> Result<()> {
        assert_eq!(ctx.time_domain(), Some(TimeDomain::EventTime));
        let n = ctx.value(&self.count).get()?.unwrap_or(0);
        ctx.value(&self.count).clear()?;
        ctx.value(&self.timer).clear()?;
        out.collect((*ctx.key(), ts, n));
        Ok(())
    }
}

/// (key, ts) readings of 7 keys with gaps of `GAP` or more now and then.
fn readings() -> Vec<(u32, i64)> {
    let mut out = Vec::new();
    for i in 0..2_000i64 {
        let key = (i % 7) as u32;
        // every 150th step jumps ahead: each key's session ends there
        let ts = i * 3 + (i / 150) * 400;
        out.push((key, ts));
    }
    out
}

/// The sessions the readings imply, computed directly.
fn expected_sessions(readings: &[(u32, i64)]) -> Vec<(u32, Timestamp, u64)> {
    let mut per_key: BTreeMap<u32, Vec<i64>> = BTreeMap::new();
    for (k, ts) in readings {
        per_key.entry(*k).or_default().push(*ts);
    }
    let mut out = Vec::new();
    for (k, times) in per_key {
        let mut count = 0;
        for (i, t) in times.iter().enumerate() {
            count += 1;
            let next = times.get(i + 1);
            if next.is_none_or(|n| *n > t + GAP) {
                out.push((k, t + GAP, count));
                count = 0;
            }
        }
    }
    out.sort();
    out
}

#[test]
fn keyed_state_event_time_timers_and_a_side_output_in_a_parallel_job_equal_the_model() {
    let input = readings();
    let env = StreamEnv::with_config(config(3));
    let watermarks = WatermarkStrategy::bounded_out_of_orderness(Duration::ZERO, |r: &(u32, i64)| r.1);
    let sessions = env
        .from_iter_with("readings", input.clone(), watermarks)
        .key_by(|r: &(u32, i64)| r.0)
        .process(Sessions {
            count: ValueStateDescriptor::new("count"),
            timer: ValueStateDescriptor::new("timer"),
        })
        .name("sessions")
        .uid("sessions");
    let (odd_sink, odd) = CollectSink::new();
    sessions.side_output(&ODD).sink("odd", move |_| Ok(odd_sink.clone()));
    let (sink, out) = CollectSink::new();
    sessions.sink("sessions-out", move |_| Ok(sink.clone()));
    let plan = env.plan("sessions").unwrap();
    assert!(plan.operators.iter().any(|o| o.name == "sessions" && o.uid == "sessions"), "{plan:?}");
    env.execute("sessions").unwrap();

    let mut got = out.lock().clone();
    got.sort();
    let want = expected_sessions(&input);
    assert!(want.len() > 7 * 10, "the input makes many sessions: {}", want.len());
    assert_eq!(got, want);
    let mut odd_got = odd.lock().clone();
    odd_got.sort();
    let mut odd_want: Vec<_> = input.iter().copied().filter(|r| r.1 % 2 != 0).collect();
    odd_want.sort();
    assert_eq!(odd_got, odd_want);
}

/// Splits numbers: evens on the main output, odds on a side output, each with its timestamp.
#[derive(Clone)]
struct Split;

static ODDS: OutputTag<u64> = OutputTag::new("odds");

impl ProcessFunction<u64, u64> for Split {
    fn process_element(&mut self, v: u64, ctx: &mut Context<'_>, out: &mut Output<'_, u64>) -> Result<()> {
        assert_eq!(ctx.timestamp(), v as i64 * 10);
        if v.is_multiple_of(2) {
            out.collect(v);
            Ok(())
        } else {
            ctx.output(&ODDS, v)
        }
    }
}

#[test]
fn a_process_function_without_key_splits_a_stream_by_side_output() {
    let env = StreamEnv::with_config(config(2));
    let watermarks = WatermarkStrategy::bounded_out_of_orderness(Duration::ZERO, |v: &u64| *v as i64 * 10);
    let split =
        env.from_iter_with("numbers", 0..1_000u64, watermarks).rebalance().process(Split).name("split");
    let (odd_sink, odds) = CollectSink::new();
    split.side_output(&ODDS).map(|v| v * 100).sink("odds", move |_| Ok(odd_sink.clone()));
    let (even_sink, evens) = CollectSink::new();
    split.sink("evens", move |_| Ok(even_sink.clone()));
    env.execute("split").unwrap();
    let mut e = evens.lock().clone();
    e.sort();
    assert_eq!(e, (0..1_000).filter(|v| v % 2 == 0).collect::<Vec<u64>>());
    let mut o = odds.lock().clone();
    o.sort();
    assert_eq!(o, (0..1_000).filter(|v| v % 2 == 1).map(|v| v * 100).collect::<Vec<u64>>());
}

#[test]
fn a_side_output_of_a_stream_that_no_process_function_made_fails_the_build() {
    let env = StreamEnv::new();
    let numbers = env.from_iter("numbers", 0..10u64).map(|v| v + 1);
    numbers.side_output(&ODDS).sink("odds", |_| Ok(CollectSink::new().0));
    let err = env.execute("wrong").unwrap_err().to_string();
    assert!(
        err.contains("side_output(`odds`)") && err.contains("not the output of a process function"),
        "{err}"
    );
}

/// Emits its items, then nothing for `hold`, then ends: a job that stays up without input.
struct ThenWait {
    items: Vec<u32>,
    hold: Duration,
}

struct ThenWaitReader {
    items: Vec<u32>,
    until: Option<Instant>,
    hold: Duration,
}

impl Source for ThenWait {
    type Out = u32;
    fn create_reader(&self, _: &SourceContext, _: &[Vec<u8>]) -> Result<Box<dyn SourceReader<u32>>> {
        Ok(Box::new(ThenWaitReader { items: self.items.clone(), until: None, hold: self.hold }))
    }
}

impl SourceReader<u32> for ThenWaitReader {
    fn splits(&self) -> usize {
        1
    }
    fn poll(&mut self, out: &mut SourceOutput<'_, u32>) -> Result<SourcePoll> {
        if !self.items.is_empty() {
            for v in self.items.drain(..) {
                out.collect(0, v);
            }
            self.until = Some(Instant::now() + self.hold);
            return Ok(SourcePoll::Ready);
        }
        match self.until {
            Some(t) if Instant::now() < t => Ok(SourcePoll::Pending(Duration::from_millis(20))),
            _ => Ok(SourcePoll::Finished),
        }
    }
}

/// Sets a processing-time timer 100 ms after each key's element; reports how late it fired.
#[derive(Clone)]
struct Alarm;

impl KeyedProcessFunction<u32, u32, (u32, i64)> for Alarm {
    fn process_element(
        &mut self,
        _: u32,
        ctx: &mut KeyedContext<'_, u32>,
        _: &mut Output<'_, (u32, i64)>,
    ) -> Result<()> {
        let at = ctx.current_processing_time() + 100;
        ctx.register_processing_time_timer(at)
    }

    fn on_timer(
        &mut self,
        ts: Timestamp,
        ctx: &mut KeyedContext<'_, u32>,
        out: &mut Output<'_, (u32, i64)>,
    ) -> Result<()> {
        assert_eq!(ctx.time_domain(), Some(TimeDomain::ProcessingTime));
        assert_ne!(ctx.current_watermark(), MAX_WATERMARK);
        out.collect((*ctx.key(), ctx.current_processing_time() - ts));
        Ok(())
    }
}

#[test]
fn processing_time_timers_fire_on_the_wall_clock_while_the_input_is_quiet() {
    let env = StreamEnv::with_config(config(2));
    let source = ThenWait { items: (0..5).collect(), hold: Duration::from_millis(1_500) };
    let (sink, out) = CollectSink::new();
    env.source("quiet", source, WatermarkStrategy::none())
        .parallelism(1)
        .key_by(|v: &u32| *v % 5)
        .process(Alarm)
        .sink("alarms", move |_| Ok(sink.clone()));
    env.execute("alarms").unwrap();
    let mut got = out.lock().clone();
    got.sort();
    assert_eq!(
        got.iter().map(|a| a.0).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4],
        "one timer per key: {got:?}"
    );
    for (key, late) in got {
        assert!((0..500).contains(&late), "key {key}'s timer fired {late} ms late");
    }
}

// ---- two inputs --------------------------------------------------------------------------

/// Orders meet their customer: an order waits in the key's list state until the customer's
/// name is known, then goes out with it.
#[derive(Clone)]
struct Enrich {
    name: ValueStateDescriptor<String>,
    waiting: ListStateDescriptor<u64>,
}

impl KeyedCoProcessFunction<u32, (u32, u64), (u32, String), (String, u64)> for Enrich {
    fn process_element1(
        &mut self,
        (_, amount): (u32, u64),
        ctx: &mut KeyedContext<'_, u32>,
        out: &mut Output<'_, (String, u64)>,
    ) -> Result<()> {
        match ctx.value(&self.name).get()? {
            Some(name) => out.collect((name, amount)),
            None => ctx.list(&self.waiting).add(&amount)?,
        }
        Ok(())
    }

    fn process_element2(
        &mut self,
        (_, name): (u32, String),
        ctx: &mut KeyedContext<'_, u32>,
        out: &mut Output<'_, (String, u64)>,
    ) -> Result<()> {
        for amount in ctx.list(&self.waiting).get()? {
            out.collect((name.clone(), amount));
        }
        ctx.list(&self.waiting).clear()?;
        ctx.value(&self.name).set(&name)
    }
}

#[test]
fn two_streams_keyed_alike_meet_per_key_whatever_comes_first() {
    let orders: Vec<(u32, u64)> = (0..3_000u64).map(|i| ((i % 50) as u32, i)).collect();
    // Customers 0..40 only: orders of 40..50 wait for ever.
    let customers: Vec<(u32, String)> = (0..40u32).rev().map(|c| (c, format!("customer-{c}"))).collect();
    let env = StreamEnv::with_config(config(3));
    let (sink, out) = CollectSink::new();
    env.from_iter("orders", orders.clone())
        .connect(env.from_iter("customers", customers))
        .key_by(|o: &(u32, u64)| o.0, |c: &(u32, String)| c.0)
        .process(Enrich {
            name: ValueStateDescriptor::new("name"),
            waiting: ListStateDescriptor::new("waiting"),
        })
        .uid("enrich")
        .sink("enriched", move |_| Ok(sink.clone()));
    env.execute("enrich").unwrap();
    let mut got = out.lock().clone();
    got.sort();
    let mut want: Vec<(String, u64)> =
        orders.iter().filter(|o| o.0 < 40).map(|o| (format!("customer-{}", o.0), o.1)).collect();
    want.sort();
    assert_eq!(got, want);
}

/// Labels each element with its side.
#[derive(Clone)]
struct Label;

impl CoProcessFunction<u64, String, String> for Label {
    fn process_element1(&mut self, v: u64, _: &mut Context<'_>, out: &mut Output<'_, String>) -> Result<()> {
        out.collect(format!("number {v}"));
        Ok(())
    }

    fn process_element2(
        &mut self,
        v: String,
        _: &mut Context<'_>,
        out: &mut Output<'_, String>,
    ) -> Result<()> {
        out.collect(format!("word {v}"));
        Ok(())
    }
}

#[test]
fn two_streams_of_different_types_go_through_one_function() {
    let env = StreamEnv::with_config(config(2));
    let (sink, out) = CollectSink::new();
    let words = ["a", "b", "c"].map(String::from);
    env.from_iter("numbers", 0..100u64)
        .connect(env.from_iter("words", words))
        .process(Label)
        .sink("out", move |_| Ok(sink.clone()));
    env.execute("label").unwrap();
    let mut got = out.lock().clone();
    got.sort();
    let mut want: Vec<String> =
        (0..100).map(|v| format!("number {v}")).chain(["a", "b", "c"].map(|w| format!("word {w}"))).collect();
    want.sort();
    assert_eq!(got, want);
}

/// Registers a timer at every element's time; when one fires, every element of either side
/// up to that time must have arrived (the watermark is the minimum of both inputs).
#[derive(Clone)]
struct SeenBy {
    seen: ListStateDescriptor<i64>,
    all: std::sync::Arc<Vec<i64>>,
}

impl KeyedCoProcessFunction<u8, i64, i64, (i64, usize, usize)> for SeenBy {
    fn process_element1(
        &mut self,
        ts: i64,
        ctx: &mut KeyedContext<'_, u8>,
        _: &mut Output<'_, (i64, usize, usize)>,
    ) -> Result<()> {
        ctx.list(&self.seen).add(&ts)?;
        ctx.register_event_time_timer(ts)
    }

    fn process_element2(
        &mut self,
        ts: i64,
        ctx: &mut KeyedContext<'_, u8>,
        out: &mut Output<'_, (i64, usize, usize)>,
    ) -> Result<()> {
        self.process_element1(ts, ctx, out) // both sides alike
    }

    fn on_timer(
        &mut self,
        ts: Timestamp,
        ctx: &mut KeyedContext<'_, u8>,
        out: &mut Output<'_, (i64, usize, usize)>,
    ) -> Result<()> {
        let seen = ctx.list(&self.seen).get()?.into_iter().filter(|t| *t <= ts).count();
        out.collect((ts, seen, self.all.iter().filter(|t| **t <= ts).count()));
        Ok(())
    }
}

#[test]
fn a_two_input_operators_watermark_is_the_minimum_of_both_inputs() {
    // A fast side and a side that is throttled: without the minimum, timers would fire before
    // the slow side's elements up to their time arrived.
    let fast: Vec<i64> = (0..400).map(|i| i * 10).collect();
    let slow: Vec<i64> = (0..400).map(|i| i * 10 + 5).collect();
    let all: Vec<i64> = fast.iter().chain(&slow).copied().collect();
    let env = StreamEnv::with_config(config(2));
    let wm = || WatermarkStrategy::bounded_out_of_orderness(Duration::ZERO, |t: &i64| *t);
    let slow_source = Throttled { items: slow, every: Duration::from_millis(2) };
    let (sink, out) = CollectSink::new();
    env.from_iter_with("fast", fast, wm())
        .connect(env.source("slow", slow_source, wm()).parallelism(1))
        .key_by(|_: &i64| 0u8, |_: &i64| 0u8)
        .process(SeenBy { seen: ListStateDescriptor::new("seen"), all: std::sync::Arc::new(all.clone()) })
        .sink("checks", move |_| Ok(sink.clone()));
    env.execute("min-watermark").unwrap();
    let got = out.lock().clone();
    assert_eq!(got.len(), all.len(), "one timer per element time");
    let early: Vec<_> = got.iter().filter(|(_, seen, want)| seen != want).take(3).collect();
    assert!(early.is_empty(), "timers fired before both inputs passed them: {early:?}");
}

/// Emits its items one every `every`, then ends.
struct Throttled<T> {
    items: Vec<T>,
    every: Duration,
}

struct ThrottledReader<T> {
    items: std::vec::IntoIter<T>,
    every: Duration,
    next: Instant,
}

impl<T: caudal::Data + Sync> Source for Throttled<T> {
    type Out = T;
    fn create_reader(&self, _: &SourceContext, _: &[Vec<u8>]) -> Result<Box<dyn SourceReader<T>>> {
        Ok(Box::new(ThrottledReader {
            items: self.items.clone().into_iter(),
            every: self.every,
            next: Instant::now(),
        }))
    }
}

impl<T: caudal::Data> SourceReader<T> for ThrottledReader<T> {
    fn splits(&self) -> usize {
        1
    }
    fn poll(&mut self, out: &mut SourceOutput<'_, T>) -> Result<SourcePoll> {
        let now = Instant::now();
        if now < self.next {
            return Ok(SourcePoll::Pending(self.next - now));
        }
        match self.items.next() {
            Some(v) => {
                out.collect(0, v);
                self.next = now + self.every;
                Ok(SourcePoll::Ready)
            }
            None => Ok(SourcePoll::Finished),
        }
    }
}

// ---- broadcast state ---------------------------------------------------------------------

/// Readings judged by the limit in force at their event time: the control stream's limits
/// (effective from their timestamp) are broadcast state; a reading waits in keyed state until
/// the watermark passes it, when every limit up to its time has arrived at every subtask.
#[derive(Clone)]
struct Judge {
    limits: BroadcastStateDescriptor<i64, f64>,
    waiting: ListStateDescriptor<(i64, f64)>,
}

impl KeyedBroadcastProcessFunction<u32, (u32, i64, f64), (i64, f64), (u32, i64, bool)> for Judge {
    fn process_element(
        &mut self,
        (_, ts, v): (u32, i64, f64),
        ctx: &mut KeyedContext<'_, u32>,
        _: &mut Output<'_, (u32, i64, bool)>,
    ) -> Result<()> {
        ctx.list(&self.waiting).add(&(ts, v))?;
        ctx.register_event_time_timer(ts)
    }

    fn process_broadcast_element(
        &mut self,
        (from, limit): (i64, f64),
        ctx: &mut BroadcastContext<'_>,
        _: &mut Output<'_, (u32, i64, bool)>,
    ) -> Result<()> {
        ctx.state(&self.limits).put(&from, &limit)
    }

    fn on_timer(
        &mut self,
        ts: Timestamp,
        ctx: &mut KeyedContext<'_, u32>,
        out: &mut Output<'_, (u32, i64, bool)>,
    ) -> Result<()> {
        let limits = ctx.broadcast_state(&self.limits)?.entries()?;
        let in_force = limits.iter().rev().find(|(from, _)| *from <= ts).map_or(f64::INFINITY, |l| l.1);
        let waiting = ctx.list(&self.waiting).get()?;
        let (due, later): (Vec<_>, Vec<_>) = waiting.into_iter().partition(|(t, _)| *t <= ts);
        for (t, v) in due {
            out.collect((*ctx.key(), t, v <= in_force));
        }
        ctx.list(&self.waiting).update(&later)
    }
}

#[test]
fn readings_are_judged_by_the_broadcast_limit_in_force_at_their_event_time_on_every_subtask() {
    let readings: Vec<(u32, i64, f64)> =
        (0..2_000i64).map(|i| ((i % 30) as u32, i * 5, (i % 97) as f64)).collect();
    // The limit changes three times; the control stream is slow, the readings are not.
    let limits = vec![(0i64, 50.0f64), (2_500, 20.0), (6_000, 90.0)];
    let limit_at = |ts: i64| limits.iter().rev().find(|l| l.0 <= ts).unwrap().1;
    let env = StreamEnv::with_config(config(3));
    let wm_r = WatermarkStrategy::bounded_out_of_orderness(Duration::ZERO, |r: &(u32, i64, f64)| r.1);
    let control = Throttled { items: limits.clone(), every: Duration::from_millis(50) };
    let wm_c = WatermarkStrategy::bounded_out_of_orderness(Duration::ZERO, |l: &(i64, f64)| l.0);
    let (sink, out) = CollectSink::new();
    env.from_iter_with("readings", readings.clone(), wm_r)
        .key_by(|r: &(u32, i64, f64)| r.0)
        .connect(env.source("limits", control, wm_c).parallelism(1).broadcast())
        .process(Judge {
            limits: BroadcastStateDescriptor::new("limits"),
            waiting: ListStateDescriptor::new("waiting"),
        })
        .uid("judge")
        .sink("judged", move |_| Ok(sink.clone()));
    env.execute("judge").unwrap();
    let mut got = out.lock().clone();
    got.sort_by_key(|j| (j.0, j.1));
    let mut want: Vec<(u32, i64, bool)> = readings.iter().map(|r| (r.0, r.1, r.2 <= limit_at(r.1))).collect();
    want.sort_by_key(|j| (j.0, j.1));
    assert_eq!(got, want);
}

/// Squares numbers; a multiple of 7 is a bad record (as a parse error would be).
#[derive(Clone)]
struct SquareUnlessSeven;

fn square_unless_seven<O>(v: u64, out: &mut Output<'_, O>, wrap: impl Fn(u64) -> O) -> Result<()> {
    if v.is_multiple_of(7) {
        return Err(caudal::Error::BadRecord(format!("{v} is a multiple of 7")));
    }
    out.collect(wrap(v * v));
    Ok(())
}

impl ProcessFunction<u64, u64> for SquareUnlessSeven {
    fn process_element(&mut self, v: u64, _: &mut Context<'_>, out: &mut Output<'_, u64>) -> Result<()> {
        square_unless_seven(v, out, |s| s)
    }
}

impl KeyedProcessFunction<u64, u64, u64> for SquareUnlessSeven {
    fn process_element(
        &mut self,
        v: u64,
        _: &mut KeyedContext<'_, u64>,
        out: &mut Output<'_, u64>,
    ) -> Result<()> {
        square_unless_seven(v, out, |s| s)
    }
}

static NOT_SQUARED: OutputTag<FailedElement<u64>> = OutputTag::new("not-squared");

fn squares_of_the_good() -> Vec<u64> {
    (0..500u64).filter(|v| !v.is_multiple_of(7)).map(|v| v * v).collect()
}

/// #43: a bad record fails the job at once by default; skipped or sent to a side output
/// (with the operator and the error) when the operator's policy says so, keyed or not.
#[test]
fn an_operators_bad_records_fail_the_job_or_are_skipped_or_side_output_as_its_policy_says() {
    let env = StreamEnv::with_config(config(2));
    let squares = env.from_iter("numbers", 0..500u64).process(on_bad_record(
        SquareUnlessSeven,
        "square",
        OnBadRecord::Fail,
    ));
    squares.sink("out", |_| Ok(CollectSink::new().0));
    let err = env.execute("fail").unwrap_err();
    assert!(!err.is_retryable(), "a bad record is not retried: {err}");
    assert!(err.to_string().contains("is a multiple of 7"), "{err}");

    let env = StreamEnv::with_config(config(2));
    let squares = env.from_iter("numbers", 0..500u64).process(on_bad_record(
        SquareUnlessSeven,
        "square",
        OnBadRecord::Skip,
    ));
    let (sink, got) = CollectSink::new();
    squares.sink("out", move |_| Ok(sink.clone()));
    env.execute("skip").unwrap();
    let mut got = got.lock().clone();
    got.sort_unstable();
    assert_eq!(got, squares_of_the_good());

    let env = StreamEnv::with_config(config(2));
    let policy = OnBadRecord::SideOutput(&NOT_SQUARED);
    let squares = env.from_iter("numbers", 0..500u64).key_by(|v: &u64| v % 5).process(on_bad_record(
        SquareUnlessSeven,
        "keyed-square",
        policy,
    ));
    let (failed_sink, failed) = CollectSink::new();
    squares.side_output(&NOT_SQUARED).sink("failed", move |_| Ok(failed_sink.clone()));
    let (sink, got) = CollectSink::new();
    squares.sink("out", move |_| Ok(sink.clone()));
    env.execute("side-output").unwrap();
    let mut got = got.lock().clone();
    got.sort_unstable();
    assert_eq!(got, squares_of_the_good());
    let mut failed = failed.lock().clone();
    failed.sort_unstable_by_key(|f| f.element);
    let want: Vec<FailedElement<u64>> = (0..500u64)
        .filter(|v| v.is_multiple_of(7))
        .map(|v| FailedElement {
            element: v,
            operator: "keyed-square".into(),
            error: format!("{v} is a multiple of 7"),
        })
        .collect();
    assert_eq!(failed, want);
}

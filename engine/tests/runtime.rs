//! The runtime end to end: chaining, partitioning, union, failures, backpressure.

use caudal::testing::CollectSink;
use caudal::{
    Batch, JobConfig, OperatorContext, Result, Sink, Source, SourceContext, SourceOutput, SourcePoll,
};
use caudal::{SourceReader, StreamEnv, WatermarkStrategy};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn config(parallelism: u32) -> JobConfig {
    JobConfig { parallelism, handle_signals: false, ..JobConfig::default() }
}

#[test]
fn key_by_sends_each_key_to_exactly_one_subtask() {
    let env = StreamEnv::with_config(config(4));
    let (sink, out) = CollectSink::new();
    env.from_iter("numbers", 0..10_000u64)
        .rebalance()
        .map(|n| n)
        .parallelism(3)
        .key_by(|n: &u64| n % 97)
        .transform("tag-subtask", |_ctx| Ok(TagSubtask))
        .sink("collect", move |_| Ok(sink.clone()));
    env.execute("keyed").unwrap();
    let out = out.lock();
    assert_eq!(out.len(), 10_000);
    let mut owner: BTreeMap<u64, BTreeSet<u32>> = BTreeMap::new();
    for (n, subtask) in out.iter() {
        owner.entry(n % 97).or_default().insert(*subtask);
    }
    assert_eq!(owner.len(), 97);
    assert!(owner.values().all(|s| s.len() == 1), "a key reached several subtasks");
    let used: BTreeSet<u32> = owner.values().flatten().copied().collect();
    assert!(used.len() > 1, "keys should spread over subtasks: {used:?}");
}

/// Tags each value with the subtask that saw it.
struct TagSubtask;
impl caudal::Operator for TagSubtask {
    type In = u64;
    type Out = (u64, u32);
    fn process_batch(
        &mut self,
        b: Batch<u64>,
        out: &mut Batch<(u64, u32)>,
        ctx: &mut OperatorContext,
    ) -> Result<()> {
        out.extend(b.into_iter().map(|r| caudal::Record::new(r.ts, (r.value, ctx.subtask))));
        Ok(())
    }
}

#[test]
fn plan_chains_forward_edges_and_breaks_at_key_by_and_parallelism_changes() {
    let env = StreamEnv::with_config(config(2));
    let s = env
        .from_iter("src", 0..10u64)
        .map(|n| n + 1)
        .name("inc")
        .parallelism(1)
        .filter(|n| n % 2 == 0)
        .name("even");
    s.clone().sink("side", |_| Ok(caudal::testing::CollectSink::<u64>::new().0));
    s.key_by(|n: &u64| *n).transform("tag", |_| Ok(TagSubtask)).sink("out", |_| Ok(CollectSink::new().0));
    let plan = env.plan("p").unwrap();
    let by_name = |n: &str| plan.operators.iter().find(|o| o.name == n).unwrap().clone();
    assert_eq!(by_name("inc").task, by_name("src").task, "src → inc chained (both parallelism 1)");
    assert_eq!(by_name("even").parallelism, 2);
    assert_ne!(by_name("even").task, by_name("inc").task, "parallelism change breaks the chain");
    assert_ne!(by_name("tag").task, by_name("even").task, "key_by breaks the chain");
    let hash = plan.edges.iter().find(|e| e.to == by_name("tag").id).unwrap();
    assert_eq!(hash.partitioning, caudal::EdgeKind::Hash);
    let json = serde_json::to_string(&plan).unwrap();
    assert!(json.contains("\"partitioning\":\"hash\""), "{json}");
}

#[test]
fn union_merges_streams() {
    let env = StreamEnv::with_config(config(2));
    let (sink, out) = CollectSink::new();
    let a = env.from_iter("a", 0..100i64);
    let b = env.from_iter("b", 1000..1100i64);
    let c = env.from_iter("c", 5000..5001i64).map(|x| x * 2);
    a.union(vec![b, c]).sink("collect", move |_| Ok(sink.clone()));
    env.execute("union").unwrap();
    let mut got = out.lock().clone();
    got.sort();
    let mut want: Vec<i64> = (0..100).chain(1000..1100).collect();
    want.push(10_000);
    assert_eq!(got, want);
}

#[test]
fn a_panicking_operator_fails_the_job_with_its_name_and_cause() {
    let env = StreamEnv::with_config(config(2));
    env.from_iter("numbers", 0..100_000u64)
        .rebalance()
        .map(|n| {
            if n == 5_000 {
                panic!("boom at {n}");
            }
            n
        })
        .name("explode")
        .sink("discard", |_| Ok(CollectSink::new().0));
    let err = env.execute("failing").unwrap_err().to_string();
    assert!(err.contains("explode"), "{err}");
    assert!(err.contains("boom at 5000"), "{err}");
}

#[test]
fn an_operator_error_fails_the_job_and_names_the_operator() {
    let env = StreamEnv::with_config(config(1));
    env.from_iter("numbers", 0..10u64)
        .transform("picky", |_| Ok(Picky))
        .sink("discard", |_| Ok(CollectSink::<u64>::new().0));
    let err = env.execute("failing").unwrap_err().to_string();
    assert!(err.contains("picky"), "{err}");
    assert!(err.contains("7 is not welcome"), "{err}");
}

struct Picky;
impl caudal::Operator for Picky {
    type In = u64;
    type Out = u64;
    fn process_batch(&mut self, b: Batch<u64>, out: &mut Batch<u64>, _: &mut OperatorContext) -> Result<()> {
        for r in b {
            if r.value == 7 {
                return Err(caudal::Error::Operator("7 is not welcome".into()));
            }
            out.push(r);
        }
        Ok(())
    }
}

/// An endless source of numbers.
struct Endless;
impl Source for Endless {
    type Out = u64;
    fn create_reader(&self, _: &SourceContext, _: &[Vec<u8>]) -> Result<Box<dyn SourceReader<u64>>> {
        Ok(Box::new(EndlessReader(0)))
    }
}
struct EndlessReader(u64);
impl SourceReader<u64> for EndlessReader {
    fn splits(&self) -> usize {
        1
    }
    fn poll(&mut self, out: &mut SourceOutput<'_, u64>) -> Result<SourcePoll> {
        for _ in 0..out.capacity_left() {
            out.collect(0, self.0);
            self.0 += 1;
        }
        Ok(SourcePoll::Ready)
    }
}

/// A sink that sleeps per batch.
struct SlowSink;
impl Sink for SlowSink {
    type In = (u64, [u64; 32]);
    fn write_batch(&mut self, _: Batch<Self::In>, _: &mut OperatorContext) -> Result<()> {
        std::thread::sleep(Duration::from_millis(5));
        Ok(())
    }
}

#[test]
fn a_slow_sink_throttles_the_source_and_buffers_stay_bounded() {
    let cfg = JobConfig { batch_size: 256, channel_capacity: 1024, ..config(1) };
    let env = StreamEnv::with_config(cfg);
    env.source("endless", Endless, WatermarkStrategy::none())
        .map(|n| (n, [0u64; 32]))
        .key_by(|r: &(u64, [u64; 32])| r.0 % 10)
        .transform("pass", |_| Ok(Pass))
        .sink("slow", |_| Ok(SlowSink));
    let metrics = env.metrics();
    let stop = env.stop_handle();
    let max_in_flight = Arc::new(AtomicU64::new(0));
    let watcher = {
        let max_in_flight = max_in_flight.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(2) {
                let ops = metrics.snapshot();
                let produced = ops.iter().find(|o| o.name == "endless").map_or(0, |o| o.records_out);
                let consumed = ops.iter().find(|o| o.name == "slow").map_or(0, |o| o.records_in);
                max_in_flight.fetch_max(produced.saturating_sub(consumed), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
            stop.stop();
        })
    };
    let result = env.execute("backpressure").unwrap();
    watcher.join().unwrap();
    let produced = result.operator("endless").unwrap().records_out;
    // The sink takes ~51 k records/s (256 per 5 ms); without backpressure the source
    // would produce millions in 2 s.
    assert!(produced < 200_000, "source was not throttled: {produced} records");
    // Two channels of 1024 records plus a batch in each task's hands.
    let bound = 2 * 1024 + 4 * 256;
    let seen = max_in_flight.load(Ordering::Relaxed);
    assert!(seen <= bound as u64, "{seen} records in flight, bound {bound}");
}

struct Pass;
impl caudal::Operator for Pass {
    type In = (u64, [u64; 32]);
    type Out = (u64, [u64; 32]);
    fn process_batch(
        &mut self,
        mut b: Batch<Self::In>,
        out: &mut Batch<Self::Out>,
        _: &mut OperatorContext,
    ) -> Result<()> {
        out.append(&mut b);
        Ok(())
    }
}

#[test]
fn a_stopped_unbounded_job_ends_cleanly() {
    let env = StreamEnv::with_config(config(2));
    let (sink, out) = CollectSink::new();
    env.source("endless", Endless, WatermarkStrategy::none()).sink("collect", move |_| Ok(sink.clone()));
    let stop = env.stop_handle();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        stop.stop();
    });
    let result = env.execute("stoppable").unwrap();
    let produced = result.operator("endless").unwrap().records_out;
    assert!(produced > 0);
    assert_eq!(out.lock().len() as u64, produced, "every produced record reached the sink");
}

#[test]
fn bad_parallelism_names_the_operator() {
    let env = StreamEnv::with_config(config(1));
    env.from_iter("n", 0..1u64)
        .map(|n| n)
        .name("too-wide")
        .parallelism(500)
        .sink("s", |_| Ok(CollectSink::new().0));
    let err = env.execute("bad").unwrap_err().to_string();
    assert!(err.contains("too-wide.parallelism"), "{err}");
}

#[test]
fn a_panic_in_a_chained_operator_names_that_operator() {
    let env = StreamEnv::with_config(config(1));
    env.from_iter("numbers", 0..100u64)
        .map(|n| if n == 42 { panic!("bad reading {n}") } else { n })
        .name("chained-explode")
        .sink("discard", |_| Ok(CollectSink::new().0));
    let err = env.execute("failing").unwrap_err().to_string();
    assert!(err.contains("operator `chained-explode`"), "{err}");
    assert!(err.contains("task `numbers`"), "{err}");
    assert!(err.contains("bad reading 42"), "{err}");
}

/// Records the attempt id each sink subtask was started with.
struct RecordAttempt(Arc<parking_lot::Mutex<Vec<String>>>);
impl Sink for RecordAttempt {
    type In = u64;
    fn on_start(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        self.0.lock().push(ctx.attempt.clone());
        Ok(())
    }
    fn write_batch(&mut self, _batch: Batch<u64>, _ctx: &mut OperatorContext) -> Result<()> {
        Ok(())
    }
}

#[test]
fn every_subtask_of_a_run_shares_its_attempt_id_and_every_run_gets_a_new_one() {
    let runs: Vec<BTreeSet<String>> = (0..2)
        .map(|_| {
            let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
            let env = StreamEnv::with_config(config(3));
            let s = seen.clone();
            env.from_iter("numbers", 0..10u64)
                .rebalance()
                .sink("record", move |_| Ok(RecordAttempt(s.clone())));
            env.execute("attempts").unwrap();
            let ids: Vec<String> = seen.lock().clone();
            assert_eq!(ids.len(), 3, "one per subtask");
            ids.into_iter().collect()
        })
        .collect();
    assert!(runs.iter().all(|r| r.len() == 1), "one id per run: {runs:?}");
    assert_ne!(runs[0], runs[1], "a second run in the same process is another attempt");
}

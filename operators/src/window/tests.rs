//! Window operator tests: tables for the semantics, proptest against a naive model.

use super::*;
use caudal::testing::{parse_table, OperatorHarness};
use caudal::types::MAX_WATERMARK;
use caudal::{metrics::names, Record, Timestamp};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

/// (key, value)
type Ev = (u32, i64);

struct Sum;
impl AggregateFunction<Ev> for Sum {
    type Acc = i64;
    type Out = i64;
    fn create(&self) -> i64 {
        0
    }
    fn add(&self, acc: &mut i64, v: &Ev) {
        *acc += v.1;
    }
    fn merge(&self, acc: &mut i64, o: i64) {
        *acc += o;
    }
    fn result(&self, acc: &i64) -> i64 {
        *acc
    }
}

type Out = WindowOutput<WindowResult<u32, i64>, Ev>;

fn harness(
    assigner: WindowAssigner,
    lateness: i64,
) -> OperatorHarness<WindowOperator<u32, Ev, AggregateEmitter<Sum>>> {
    let key: Arc<dyn Fn(&Ev) -> u32 + Send + Sync> = Arc::new(|e: &Ev| e.0);
    OperatorHarness::new(WindowOperator::new(key, assigner, lateness, Arc::new(AggregateEmitter(Sum)), true))
        .unwrap()
}

/// Runs a table of `ts key value` records and `wm <ts>` lines; returns the output lines
/// `R key start end sum` / `L key value`.
fn run(assigner: WindowAssigner, lateness: i64, table: &str) -> Vec<String> {
    let mut h = harness(assigner, lateness);
    let mut lines = Vec::new();
    for row in parse_table(table) {
        if row[0] == "wm" {
            h.watermark(row[1].parse().unwrap()).unwrap();
        } else {
            let ts: Timestamp = row[0].parse().unwrap();
            h.process(vec![Record::new(ts, (row[1].parse().unwrap(), row[2].parse().unwrap()))]).unwrap();
        }
        for o in h.take_values() {
            lines.push(match o {
                WindowOutput::Result(r) => {
                    format!("R {} {} {} {}", r.key, r.window.start, r.window.end, r.value)
                }
                WindowOutput::Late((k, v)) => format!("L {k} {v}"),
            });
        }
    }
    lines
}

fn tumbling(ms: u64) -> WindowAssigner {
    WindowAssigner::tumbling(std::time::Duration::from_millis(ms))
}

#[test]
fn tumbling_fires_when_watermark_passes_end() {
    let out = run(
        tumbling(10),
        0,
        "ts key value
         1  1   5
         3  1   7
         12 1   1
         wm 8       # not yet: window [0,10) ends at 9
         wm 9
         wm 30",
    );
    assert_eq!(out, vec!["R 1 0 10 12", "R 1 10 20 1"]);
}

#[test]
fn late_records_are_counted_and_side_output_never_dropped_silently() {
    let mut h = harness(tumbling(10), 0);
    h.process(vec![Record::new(1, (1, 5))]).unwrap();
    h.watermark(20).unwrap();
    h.process(vec![Record::new(2, (1, 9))]).unwrap();
    let out = h.take_values();
    assert_eq!(
        out,
        vec![
            Out::Result(WindowResult { key: 1, window: TimeWindow { start: 0, end: 10 }, value: 5 }),
            Out::Late((1, 9)),
        ]
    );
    assert_eq!(h.counter(names::LATE_RECORDS), 1);
    assert_eq!(h.counter(names::WINDOWS_FIRED), 1);
}

#[test]
fn allowed_lateness_refires_with_the_update_then_cleans_up() {
    let out = run(
        tumbling(10),
        5,
        "ts key value
         1  1   5
         wm 9
         2  1   1      # late but within lateness: fires again
         wm 14         # cleanup time 9 + 5 = 14
         3  1   100    # now too late",
    );
    assert_eq!(out, vec!["R 1 0 10 5", "R 1 0 10 6", "L 1 100"]);
}

#[test]
fn sliding_windows_overlap() {
    let out = run(
        WindowAssigner::sliding(std::time::Duration::from_millis(10), std::time::Duration::from_millis(5)),
        0,
        "ts key value
         6  1   1
         wm 100",
    );
    assert_eq!(out, vec!["R 1 0 10 1", "R 1 5 15 1"]);
}

#[test]
fn sessions_merge_across_out_of_order_records() {
    let out = run(
        WindowAssigner::session(std::time::Duration::from_millis(10)),
        0,
        "ts key value
         0  1   1
         25 1   2
         12 1   4     # bridges [0,10) and [25,35) via [12,22)? no: 22 < 25 - stays apart from the second
         8  1   8     # joins [0,10) and [12,22) into [0,22)
         wm 100",
    );
    assert_eq!(out, vec!["R 1 0 22 13", "R 1 25 35 2"]);
}

#[test]
fn keys_are_independent() {
    let out = run(
        tumbling(10),
        0,
        "ts key value
         1  1   1
         2  2   10
         3  1   1
         wm 9",
    );
    let mut out = out;
    out.sort();
    assert_eq!(out, vec!["R 1 0 10 2", "R 2 0 10 10"]);
}

/// Input: records and watermark advances.
#[derive(Debug, Clone)]
enum Step {
    Rec(Timestamp, u32, i64),
    Wm(Timestamp),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            4 => (0i64..200, 0u32..3, 1i64..100).prop_map(|(t, k, v)| Step::Rec(t, k, v)),
            1 => (0i64..200).prop_map(Step::Wm),
        ],
        0..80,
    )
}

/// Feeds the steps (watermarks made monotonic), then the final watermark. Returns the last
/// result per (key, window) and the late records, checking no window fires early.
#[allow(clippy::type_complexity)]
fn drive(
    assigner: WindowAssigner,
    lateness: i64,
    steps: &[Step],
) -> (BTreeMap<(u32, i64, i64), i64>, Vec<Ev>) {
    let mut h = harness(assigner, lateness);
    let mut wm = Timestamp::MIN;
    let mut finals = BTreeMap::new();
    let mut late = Vec::new();
    let mut collect = |h: &mut OperatorHarness<_>, wm: Timestamp| {
        for o in h.take_values() {
            match o {
                Out::Result(r) => {
                    assert!(
                        r.window.max_timestamp() <= wm,
                        "window {:?} fired early at watermark {wm}",
                        r.window
                    );
                    finals.insert((r.key, r.window.start, r.window.end), r.value);
                }
                Out::Late(e) => late.push(e),
            }
        }
    };
    for s in steps {
        match *s {
            Step::Rec(t, k, v) => h.process(vec![Record::new(t, (k, v))]).unwrap(),
            Step::Wm(w) => {
                wm = wm.max(w);
                h.watermark(wm).unwrap();
            }
        }
        collect(&mut h, wm);
    }
    h.watermark(MAX_WATERMARK).unwrap();
    collect(&mut h, MAX_WATERMARK);
    (finals, late)
}

/// The naive model of fixed windows: a record counts for a window iff the window was not
/// cleaned up (max_ts + lateness > watermark) when it arrived; late iff it counts nowhere.
#[allow(clippy::type_complexity)]
fn model_fixed(
    assigner: WindowAssigner,
    lateness: i64,
    steps: &[Step],
) -> (BTreeMap<(u32, i64, i64), i64>, Vec<Ev>) {
    let mut wm = Timestamp::MIN;
    let mut sums = BTreeMap::new();
    let mut late = Vec::new();
    for s in steps {
        match *s {
            Step::Wm(w) => wm = wm.max(w),
            Step::Rec(t, k, v) => {
                let mut ws = Vec::new();
                assigner.assign(t, &mut ws);
                let mut counted = false;
                for w in ws {
                    if w.max_timestamp() + lateness > wm {
                        *sums.entry((k, w.start, w.end)).or_insert(0) += v;
                        counted = true;
                    }
                }
                if !counted {
                    late.push((k, v));
                }
            }
        }
    }
    (sums, late)
}

proptest! {
    #[test]
    fn tumbling_matches_model(steps in steps(), size in 1u64..50, lateness in 0i64..30) {
        let a = tumbling(size);
        prop_assert_eq!(drive(a, lateness, &steps), model_fixed(a, lateness, &steps));
    }

    #[test]
    fn sliding_matches_model(steps in steps(), size in 2u64..50, slide_div in 1u64..5, lateness in 0i64..30) {
        let slide = (size / slide_div).max(1);
        let a = WindowAssigner::sliding(std::time::Duration::from_millis(size), std::time::Duration::from_millis(slide));
        prop_assert_eq!(drive(a, lateness, &steps), model_fixed(a, lateness, &steps));
    }

    /// Sessions, out of order: with lateness beyond the input's span nothing is cleaned up
    /// early, so the final sessions are the gap-merge of all records.
    #[test]
    fn sessions_match_model(steps in steps(), gap in 1u64..40) {
        let a = WindowAssigner::session(std::time::Duration::from_millis(gap));
        let (got, late) = drive(a, 10_000, &steps);
        prop_assert!(late.is_empty());
        let mut per_key: BTreeMap<u32, Vec<(i64, i64)>> = BTreeMap::new();
        for s in &steps {
            if let Step::Rec(t, k, v) = *s {
                per_key.entry(k).or_default().push((t, v));
            }
        }
        let mut want = BTreeMap::new();
        for (k, mut recs) in per_key {
            recs.sort();
            let (mut start, mut end, mut sum) = (recs[0].0, recs[0].0 + gap as i64, 0);
            for (t, v) in recs {
                if t > end {
                    want.insert((k, start, end), sum);
                    start = t;
                    sum = 0;
                }
                end = end.max(t + gap as i64);
                sum += v;
            }
            want.insert((k, start, end), sum);
        }
        // Intermediate sessions may have fired before a merge; the final ones must match.
        for (w, sum) in &want {
            prop_assert_eq!(got.get(w), Some(sum), "session {:?}", w);
        }
    }
}

#[test]
fn state_survives_snapshot_and_restore_with_rescale() {
    // Two subtasks' worth of keys in one operator, snapshotted, restored into 3 subtasks.
    let mut h = harness(tumbling(10), 0);
    for k in 0..20u32 {
        h.process(vec![Record::new(1, (k, 1)), Record::new(2, (k, i64::from(k)))]).unwrap();
    }
    let snapshot = h.snapshot(1).unwrap();
    assert!(snapshot.operator_state.is_none(), "window state lives in the keyed-state backend");
    let mut restored = Vec::new();
    for subtask in 0..3 {
        let mut r = harness(tumbling(10), 0);
        r.restore_as(vec![snapshot.clone()], subtask, 3).unwrap();
        let owner =
            caudal::keygroup::subtask_for_key_group(caudal::keygroup::key_group_of(&0u32, 128), 128, 3);
        if subtask == owner {
            r.process(vec![Record::new(3, (0, 100))]).unwrap(); // keys reach their owner only
        }
        r.watermark(100).unwrap();
        restored.extend(r.take_values());
    }
    let mut sums: Vec<(u32, i64)> = restored
        .into_iter()
        .filter_map(|o| match o {
            Out::Result(r) => Some((r.key, r.value)),
            Out::Late(_) => None,
        })
        .collect();
    sums.sort();
    // Each key exactly once, in the subtask owning its key group; key 0 with the extra 100.
    let key0: Vec<i64> = sums.iter().filter(|(k, _)| *k == 0).map(|(_, v)| *v).collect();
    assert_eq!(key0, vec![101]);
    let others: Vec<(u32, i64)> = sums.into_iter().filter(|(k, _)| *k != 0).collect();
    assert_eq!(others, (1..20u32).map(|k| (k, 1 + i64::from(k))).collect::<Vec<_>>());
}

#[test]
fn corrupt_state_is_a_clear_error() {
    let mut h = harness(tumbling(10), 0);
    h.process(vec![Record::new(1, (7, 1))]).unwrap();
    let snapshot = h.snapshot(1).unwrap();
    // Overwrite the stored windows of key 7 with garbage.
    {
        let mut backend = h.keyed_state().unwrap();
        let state = caudal_checkpoints::StateId::new(super::operator::WINDOW_STATE).unwrap();
        let key = bincode::serde::encode_to_vec(7u32, bincode::config::standard()).unwrap();
        let kg = caudal::keygroup::key_group_of(&7u32, 128);
        backend.put(&caudal_checkpoints::StateKey::new(kg, &state, &key), &[0xff, 0x01, 0x02]).unwrap();
    }
    let corrupt = h.snapshot(2).unwrap();
    let mut r = harness(tumbling(10), 0);
    r.restore_as(vec![snapshot], 0, 1).unwrap();
    let mut r = harness(tumbling(10), 0);
    let err = r.restore_as(vec![corrupt], 0, 1).unwrap_err().to_string();
    assert!(err.contains("window state decoding"), "{err}");
}

#[test]
fn records_are_pre_aggregated_in_memory_and_written_through_at_the_barrier() {
    let mut h = harness(tumbling(10), 0);
    for i in 0..100 {
        h.process(vec![Record::new(i % 10, (i as u32 % 4, 1))]).unwrap();
    }
    let stored = |h: &OperatorHarness<_>| {
        let backend = h.keyed_state().unwrap();
        backend.key_group_stats().unwrap().iter().map(|s| s.entries).sum::<u64>()
    };
    assert_eq!(stored(&h), 0, "nothing is written per record");
    h.snapshot(1).unwrap();
    assert_eq!(stored(&h), 4, "one entry per key after the barrier");
    h.watermark(100).unwrap();
    h.snapshot(2).unwrap();
    assert_eq!(stored(&h), 0, "fired windows are deleted");
    let mut sums: Vec<(u32, i64)> = h
        .take_values()
        .into_iter()
        .filter_map(|o| match o {
            Out::Result(r) => Some((r.key, r.value)),
            Out::Late(_) => None,
        })
        .collect();
    sums.sort();
    assert_eq!(sums, vec![(0, 25), (1, 25), (2, 25), (3, 25)]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// A write-back cache of 1-3 keys (spilling to the backend, reading back on a miss) and a
    /// RocksDB backend give exactly the windows of the in-memory default.
    #[test]
    fn a_tiny_cache_and_rocksdb_give_the_same_windows(
        events in proptest::collection::vec((0i64..200, 0u32..12, -5i64..5), 1..120),
        cache in 1usize..4,
        lateness in 0i64..30,
    ) {
        let feed = |mut h: OperatorHarness<WindowOperator<u32, Ev, AggregateEmitter<Sum>>>| {
            let mut out = Vec::new();
            for (i, (ts, k, v)) in events.iter().enumerate() {
                h.process(vec![Record::new(*ts, (*k, *v))]).unwrap();
                if i % 7 == 6 {
                    h.watermark(*ts - 20).unwrap();
                }
                if i % 11 == 10 {
                    h.snapshot(i as u64).unwrap();
                }
            }
            h.watermark(MAX_WATERMARK).unwrap();
            for o in h.take_values() {
                out.push(format!("{o:?}"));
            }
            out.sort();
            out
        };
        let want = feed(harness(tumbling(10), lateness));
        let range = caudal_checkpoints::KeyGroupRange::all(128);
        let small = caudal::KeyedState::heap(range).with_cache_entries(cache);
        prop_assert_eq!(&feed(harness(tumbling(10), lateness).with_keyed_state(small)), &want);
        let dir = tempfile::tempdir().unwrap();
        let op = caudal_checkpoints::OperatorId::new("w").unwrap();
        let rocks = caudal_checkpoints::RocksDbStateBackend::open(dir.path(), &op, range, &Default::default()).unwrap();
        let rocks = caudal::KeyedState::from_backend(Box::new(rocks)).with_cache_entries(cache);
        prop_assert_eq!(&feed(harness(tumbling(10), lateness).with_keyed_state(rocks)), &want);
    }
}

/// The window join by nested loops: pairs of equal key in the same tumbling window.
fn nested_loop_window_join(left: &[(u8, i64)], right: &[(u8, i64)], size: i64) -> Vec<(u8, i64, i64)> {
    let mut out = Vec::new();
    for a in left {
        for b in right {
            if a.0 == b.0 && a.1.div_euclid(size) == b.1.div_euclid(size) {
                out.push((a.0, a.1, b.1));
            }
        }
    }
    out.sort();
    out
}

fn window_join_job(left: Vec<(u8, i64)>, right: Vec<(u8, i64)>, size: i64) -> Vec<(u8, i64, i64)> {
    use caudal::{JobConfig, StreamEnv, WatermarkStrategy};
    let env = StreamEnv::with_config(JobConfig { parallelism: 2, batch_size: 16, ..JobConfig::default() });
    let wm = || WatermarkStrategy::bounded_out_of_orderness(std::time::Duration::ZERO, |e: &(u8, i64)| e.1);
    let (sink, out) = caudal::testing::CollectSink::new();
    env.from_iter_with("left", left, wm())
        .join(env.from_iter_with("right", right, wm()))
        .where_(|a: &(u8, i64)| a.0)
        .equal_to(|b: &(u8, i64)| b.0)
        .window(WindowAssigner::tumbling(std::time::Duration::from_millis(size as u64)))
        .uid("join")
        .apply(|a: &(u8, i64), b: &(u8, i64)| (a.0, a.1, b.1))
        .sink("pairs", move |_| Ok(sink.clone()));
    env.execute("window-join").unwrap();
    let mut got = out.lock().clone();
    got.sort();
    got
}

fn in_order(gaps: Vec<(u8, i64)>) -> Vec<(u8, i64)> {
    let mut t = 0;
    gaps.into_iter()
        .map(|(k, gap)| {
            t += gap;
            (k, t)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    #[test]
    fn the_window_join_equals_a_nested_loop_join(
        left in prop::collection::vec((0u8..4, 0i64..15), 0..250),
        right in prop::collection::vec((0u8..4, 0i64..15), 0..250),
        size in 5i64..80,
    ) {
        let (left, right) = (in_order(left), in_order(right));
        let want = nested_loop_window_join(&left, &right, size);
        prop_assert_eq!(window_join_job(left, right, size), want);
    }
}

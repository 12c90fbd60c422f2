//! Process functions against naive models: timers (random registrations, deletions, clock
//! advances, restores and rescaling), TTL (random writes, reads and watermark advances),
//! a table test per state kind, and the state kinds in batches whose lookups are announced
//! ahead against a naive model.

use super::operator::KeyedProcessOperator;
use super::*;
use crate::testing::OperatorHarness;
use crate::types::{Record, Timestamp};
use crate::Result;
use proptest::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

fn harness<K: crate::Key, I: crate::Data, O: crate::Data, F: KeyedProcessFunction<K, I, O>>(
    f: F,
    key: fn(&I) -> K,
) -> OperatorHarness<KeyedProcessOperator<K, I, O, F>> {
    OperatorHarness::new(KeyedProcessOperator::new(f, Arc::new(key))).unwrap()
}

fn main_values<O>(records: Vec<Record<Tagged<O>>>) -> Vec<O> {
    records
        .into_iter()
        .filter_map(|r| match r.value {
            Tagged::Main(v) => Some(v),
            Tagged::Side(..) => None,
        })
        .collect()
}

// ---- timers ------------------------------------------------------------------------------

#[derive(Debug, Clone, Serialize, Deserialize)]
enum TimerCmd {
    Register(TimeDomainFlag, Timestamp),
    Delete(TimeDomainFlag, Timestamp),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
enum TimeDomainFlag {
    Event,
    Processing,
}

/// Registers and deletes timers as told; emits (time, key, domain) when one fires.
#[derive(Clone)]
struct TimerProbe;

impl KeyedProcessFunction<u8, (u8, TimerCmd), (Timestamp, u8, TimeDomainFlag)> for TimerProbe {
    fn process_element(
        &mut self,
        (_, cmd): (u8, TimerCmd),
        ctx: &mut KeyedContext<'_, u8>,
        _out: &mut Output<'_, (Timestamp, u8, TimeDomainFlag)>,
    ) -> Result<()> {
        match cmd {
            TimerCmd::Register(TimeDomainFlag::Event, t) => ctx.register_event_time_timer(t),
            TimerCmd::Delete(TimeDomainFlag::Event, t) => ctx.delete_event_time_timer(t),
            TimerCmd::Register(TimeDomainFlag::Processing, t) => ctx.register_processing_time_timer(t),
            TimerCmd::Delete(TimeDomainFlag::Processing, t) => ctx.delete_processing_time_timer(t),
        }
    }

    fn on_timer(
        &mut self,
        ts: Timestamp,
        ctx: &mut KeyedContext<'_, u8>,
        out: &mut Output<'_, (Timestamp, u8, TimeDomainFlag)>,
    ) -> Result<()> {
        let domain = match ctx.time_domain() {
            Some(TimeDomain::EventTime) => TimeDomainFlag::Event,
            _ => TimeDomainFlag::Processing,
        };
        assert_eq!(ctx.timestamp(), ts);
        out.collect((ts, *ctx.key(), domain));
        Ok(())
    }
}

#[derive(Debug, Clone)]
enum TimerOp {
    Element(u8, TimerCmd),
    Watermark(Timestamp),
    ProcessingTime(Timestamp),
    SnapshotAndRestore,
    /// A checkpoint the job goes on from (the timers written through, the queue kept).
    Snapshot,
}

fn timer_op() -> impl Strategy<Value = TimerOp> {
    let domain = prop_oneof![Just(TimeDomainFlag::Event), Just(TimeDomainFlag::Processing)];
    prop_oneof![
        4 => (0u8..6, domain.clone(), 0i64..300).prop_map(|(k, d, t)| TimerOp::Element(k, TimerCmd::Register(d, t))),
        2 => (0u8..6, domain, 0i64..300).prop_map(|(k, d, t)| TimerOp::Element(k, TimerCmd::Delete(d, t))),
        2 => (0i64..60).prop_map(TimerOp::Watermark),
        2 => (0i64..60).prop_map(TimerOp::ProcessingTime),
        1 => Just(TimerOp::SnapshotAndRestore),
        1 => Just(TimerOp::Snapshot),
    ]
}

type Fired = Vec<(Timestamp, u8, TimeDomainFlag)>;

/// Fires (and forgets) the model's timers due by `now` in one domain.
fn fire_model(timers: &mut BTreeSet<(Timestamp, u8)>, now: Timestamp, domain: TimeDomainFlag) -> Fired {
    let due: Vec<_> = timers.iter().copied().filter(|(t, _)| *t <= now).collect();
    due.iter().for_each(|d| {
        timers.remove(d);
    });
    due.into_iter().map(|(t, k)| (t, k, domain)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn timers_fire_once_per_key_and_time_in_time_order_across_restores(ops in prop::collection::vec(timer_op(), 1..80)) {
        let mut h = harness(TimerProbe, |e: &(u8, TimerCmd)| e.0);
        let (mut event, mut processing) = (BTreeSet::new(), BTreeSet::new());
        let (mut wm, mut now) = (0i64, 0i64);
        for (n, op) in ops.into_iter().enumerate() {
            match op {
                TimerOp::Element(k, cmd) => {
                    match &cmd {
                        TimerCmd::Register(TimeDomainFlag::Event, t) => { event.insert((*t, k)); }
                        TimerCmd::Delete(TimeDomainFlag::Event, t) => { event.remove(&(*t, k)); }
                        TimerCmd::Register(TimeDomainFlag::Processing, t) => { processing.insert((*t, k)); }
                        TimerCmd::Delete(TimeDomainFlag::Processing, t) => { processing.remove(&(*t, k)); }
                    }
                    h.process(vec![Record::new(wm, (k, cmd))]).unwrap();
                    prop_assert!(h.take().is_empty());
                }
                TimerOp::Watermark(d) => {
                    wm += d;
                    h.watermark(wm).unwrap();
                    let got = main_values(h.take());
                    let want = fire_model(&mut event, wm, TimeDomainFlag::Event);
                    prop_assert!(got.windows(2).all(|w| w[0].0 <= w[1].0), "time order: {got:?}");
                    let mut sorted = got.clone();
                    sorted.sort();
                    prop_assert_eq!(sorted, want);
                }
                TimerOp::ProcessingTime(d) => {
                    now += d;
                    h.processing_time(now).unwrap();
                    let mut got = main_values(h.take());
                    got.sort();
                    prop_assert_eq!(got, fire_model(&mut processing, now, TimeDomainFlag::Processing));
                }
                TimerOp::SnapshotAndRestore => {
                    let snapshot = h.snapshot(n as u64 + 1).unwrap();
                    h = harness(TimerProbe, |e: &(u8, TimerCmd)| e.0);
                    h.restore_as(vec![snapshot], 0, 1).unwrap();
                }
                TimerOp::Snapshot => {
                    h.snapshot(n as u64 + 1).unwrap();
                }
            }
        }
    }
}

#[test]
fn timers_follow_their_keys_when_the_job_is_rescaled() {
    let mut h = harness(TimerProbe, |e: &(u8, TimerCmd)| e.0);
    let all: BTreeSet<(Timestamp, u8)> = (0..=255u8).map(|k| (i64::from(k) * 3, k)).collect();
    for (t, k) in &all {
        h.process(vec![Record::new(0, (*k, TimerCmd::Register(TimeDomainFlag::Event, *t)))]).unwrap();
    }
    let snapshot = h.snapshot(1).unwrap();
    let mut fired = BTreeSet::new();
    for subtask in 0..3 {
        let mut part = harness(TimerProbe, |e: &(u8, TimerCmd)| e.0);
        part.restore_as(vec![snapshot.clone()], subtask, 3).unwrap();
        part.watermark(crate::types::MAX_WATERMARK).unwrap();
        let got = main_values(part.take());
        assert!(!got.is_empty(), "subtask {subtask} of 3 owns some keys");
        for (t, k, _) in got {
            assert!(fired.insert((t, k)), "timer ({t}, {k}) fired twice");
        }
    }
    assert_eq!(fired, all);
}

// ---- TTL ---------------------------------------------------------------------------------

const TTL_MS: i64 = 10;

#[derive(Debug, Clone, Serialize, Deserialize)]
enum TtlCmd {
    Set(u32),
    Get,
    Push(u32),
    List,
    Put(u8, u32),
    Entries,
}

/// Event-time TTL states driven by commands; reads emit what they see.
#[derive(Clone)]
struct TtlProbe {
    value: ValueStateDescriptor<u32>,
    list: ListStateDescriptor<u32>,
    map: MapStateDescriptor<u8, u32>,
}

impl TtlProbe {
    fn new() -> Self {
        let ttl = StateTtl::event_time(Duration::from_millis(TTL_MS as u64));
        TtlProbe {
            value: ValueStateDescriptor::new("v").with_ttl(ttl),
            list: ListStateDescriptor::new("l").with_ttl(ttl),
            map: MapStateDescriptor::new("m").with_ttl(ttl),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
enum Seen {
    Value(Option<u32>),
    List(Vec<u32>),
    Entries(Vec<(u8, u32)>),
}

impl KeyedProcessFunction<u8, (u8, TtlCmd), Seen> for TtlProbe {
    fn process_element(
        &mut self,
        (_, cmd): (u8, TtlCmd),
        ctx: &mut KeyedContext<'_, u8>,
        out: &mut Output<'_, Seen>,
    ) -> Result<()> {
        match cmd {
            TtlCmd::Set(v) => ctx.value(&self.value).set(&v)?,
            TtlCmd::Get => out.collect(Seen::Value(ctx.value(&self.value).get()?)),
            TtlCmd::Push(v) => ctx.list(&self.list).add(&v)?,
            TtlCmd::List => out.collect(Seen::List(ctx.list(&self.list).get()?)),
            TtlCmd::Put(k, v) => ctx.map(&self.map).insert(&k, &v)?,
            TtlCmd::Entries => out.collect(Seen::Entries(ctx.map(&self.map).entries()?)),
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
enum TtlOp {
    /// An element of `key` at `watermark + offset`.
    Element(u8, i64, TtlCmd),
    Watermark(i64),
}

fn ttl_op() -> impl Strategy<Value = TtlOp> {
    let cmd = prop_oneof![
        (0u32..100).prop_map(TtlCmd::Set),
        Just(TtlCmd::Get),
        (0u32..100).prop_map(TtlCmd::Push),
        Just(TtlCmd::List),
        (0u8..3, 0u32..100).prop_map(|(k, v)| TtlCmd::Put(k, v)),
        Just(TtlCmd::Entries),
    ];
    prop_oneof![
        4 => (0u8..3, 0i64..8, cmd).prop_map(|(k, o, c)| TtlOp::Element(k, o, c)),
        1 => (0i64..12).prop_map(TtlOp::Watermark),
    ]
}

/// The naive model: every value with its expiry, filtered at read time.
#[derive(Default)]
struct TtlModel {
    value: BTreeMap<u8, (u32, i64)>,
    list: BTreeMap<u8, Vec<(u32, i64)>>,
    map: BTreeMap<u8, BTreeMap<u8, (u32, i64)>>,
}

impl TtlModel {
    fn apply(&mut self, key: u8, ts: i64, cmd: &TtlCmd, wm: i64) -> Option<Seen> {
        let live = |expiry: i64| expiry > wm;
        match *cmd {
            TtlCmd::Set(v) => {
                self.value.insert(key, (v, ts + TTL_MS));
                None
            }
            TtlCmd::Get => Some(Seen::Value(self.value.get(&key).filter(|e| live(e.1)).map(|e| e.0))),
            TtlCmd::Push(v) => {
                self.list.entry(key).or_default().push((v, ts + TTL_MS));
                None
            }
            TtlCmd::List => Some(Seen::List(
                self.list.get(&key).map_or(vec![], |l| l.iter().filter(|e| live(e.1)).map(|e| e.0).collect()),
            )),
            TtlCmd::Put(k, v) => {
                self.map.entry(key).or_default().insert(k, (v, ts + TTL_MS));
                None
            }
            TtlCmd::Entries => {
                Some(Seen::Entries(self.map.get(&key).map_or(vec![], |m| {
                    m.iter().filter(|(_, e)| live(e.1)).map(|(k, e)| (*k, e.0)).collect()
                })))
            }
        }
    }
}

fn stored_entries(h: &OperatorHarness<KeyedProcessOperator<u8, (u8, TtlCmd), Seen, TtlProbe>>) -> usize {
    let backend = h.keyed_state().unwrap();
    backend.key_group_stats().unwrap().iter().map(|s| s.entries as usize).sum()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn expired_values_are_invisible_at_once_and_gone_after_the_next_barrier(ops in prop::collection::vec(ttl_op(), 1..120)) {
        let mut h = harness(TtlProbe::new(), |e: &(u8, TtlCmd)| e.0);
        let mut model = TtlModel::default();
        let mut wm = 0i64;
        for op in ops {
            match op {
                TtlOp::Element(key, offset, cmd) => {
                    let ts = wm + offset;
                    let want = model.apply(key, ts, &cmd, wm);
                    h.process(vec![Record::new(ts, (key, cmd))]).unwrap();
                    prop_assert_eq!(main_values(h.take()), want.into_iter().collect::<Vec<_>>());
                }
                TtlOp::Watermark(d) => {
                    wm += d;
                    h.watermark(wm).unwrap();
                }
            }
        }
        // Everything expires; the next barrier's cleanup deletes it all (far under its budget).
        h.watermark(wm + 1_000).unwrap();
        h.snapshot(1).unwrap();
        prop_assert_eq!(stored_entries(&h), 0);
    }
}

#[test]
fn processing_time_ttl_runs_on_the_wall_clock() {
    #[derive(Clone)]
    struct Remember(ValueStateDescriptor<u32>);
    impl KeyedProcessFunction<u8, (u8, Option<u32>), Option<u32>> for Remember {
        fn process_element(
            &mut self,
            (_, v): (u8, Option<u32>),
            ctx: &mut KeyedContext<'_, u8>,
            out: &mut Output<'_, Option<u32>>,
        ) -> Result<()> {
            match v {
                Some(v) => ctx.value(&self.0).set(&v),
                None => {
                    out.collect(ctx.value(&self.0).get()?);
                    Ok(())
                }
            }
        }
    }
    let ttl = StateTtl::processing_time(Duration::from_millis(150));
    let mut h = harness(Remember(ValueStateDescriptor::new("r").with_ttl(ttl)), |e: &(u8, Option<u32>)| e.0);
    h.process(vec![Record::new(0, (1, Some(7))), Record::new(0, (1, None))]).unwrap();
    assert_eq!(main_values(h.take()), vec![Some(7)]);
    std::thread::sleep(Duration::from_millis(200));
    h.process(vec![Record::new(0, (1, None))]).unwrap();
    assert_eq!(main_values(h.take()), vec![None], "expired by the wall clock, the watermark never moved");
}

// ---- one table per state kind ------------------------------------------------------------

/// Runs one command per element against every state kind and reports what it reads.
#[derive(Clone)]
struct Kinds {
    value: ValueStateDescriptor<i64>,
    list: ListStateDescriptor<i64>,
    map: MapStateDescriptor<String, i64>,
    sum: ReducingStateDescriptor<i64>,
    stats: AggregatingStateDescriptor<i64, (u32, i64)>,
}

impl KeyedProcessFunction<String, (String, String), String> for Kinds {
    fn process_element(
        &mut self,
        (_, cmd): (String, String),
        ctx: &mut KeyedContext<'_, String>,
        out: &mut Output<'_, String>,
    ) -> Result<()> {
        let parts: Vec<&str> = cmd.split_whitespace().collect();
        let n = |i: usize| parts.get(i).and_then(|s| s.parse::<i64>().ok()).unwrap_or(0);
        let seen = match parts[0] {
            "set" => format!("{:?}", ctx.value(&self.value).set(&n(1))),
            "get" => format!("{:?}", ctx.value(&self.value).get()?),
            "clear" => format!("{:?}", ctx.value(&self.value).clear()),
            "push" => format!("{:?}", ctx.list(&self.list).add(&n(1))),
            "list" => format!("{:?}", ctx.list(&self.list).get()?),
            "relist" => format!("{:?}", ctx.list(&self.list).update(&[n(1), n(2)])),
            "put" => format!("{:?}", ctx.map(&self.map).insert(&parts[1].to_string(), &n(2))),
            "del" => format!("{:?}", ctx.map(&self.map).remove(&parts[1].to_string())),
            "take" => format!("{:?}", ctx.map(&self.map).take(&parts[1].to_string())?),
            "entries" => format!("{:?}", ctx.map(&self.map).entries()?),
            "has" => format!("{:?}", ctx.map(&self.map).contains(&parts[1].to_string())?),
            "sum" => format!("{:?}", ctx.reducing(&self.sum).add(n(1))?),
            "stats" => format!("{:?}", ctx.aggregating(&self.stats).add(&n(1))?),
            other => panic!("unknown command {other}"),
        };
        out.collect(format!("{} {cmd} -> {seen}", ctx.key()));
        Ok(())
    }
}

#[test]
fn every_state_kind_reads_what_was_written_per_key() {
    let table = "
        # key  command        reads
        a      get            None
        a      set 5          Ok(())
        b      get            None
        a      get            Some(5)
        a      clear          Ok(())
        a      get            None
        a      push 1         Ok(())
        a      push 2         Ok(())
        b      list           []
        a      list           [1, 2]
        a      relist 7 8     Ok(())
        a      list           [7, 8]
        a      put x 1        Ok(())
        a      put y 2        Ok(())
        a      put x 3        Ok(())
        b      has x          false
        a      has x          true
        a      entries        [(\"x\", 3), (\"y\", 2)]
        a      del x          Ok(())
        a      entries        [(\"y\", 2)]
        a      take y         Some(2)
        a      take y         None
        a      entries        []
        a      sum 4          4
        a      sum 6          10
        b      sum 1          1
        a      stats 3        (1, 3)
        a      stats -5       (2, -2)
    ";
    let mut h = harness(kinds(), |e: &(String, String)| e.0.clone());
    for line in table.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (key, rest) = line.split_once(char::is_whitespace).unwrap();
        let (cmd, reads) = rest.trim().split_once("  ").map(|(c, r)| (c.trim(), r.trim())).unwrap();
        h.process(vec![Record::new(0, (key.to_string(), cmd.to_string()))]).unwrap();
        assert_eq!(main_values(h.take()), vec![format!("{key} {cmd} -> {reads}")], "{line}");
    }
}

fn kinds() -> Kinds {
    Kinds {
        value: ValueStateDescriptor::new("value"),
        list: ListStateDescriptor::new("list"),
        map: MapStateDescriptor::new("map"),
        sum: ReducingStateDescriptor::new("sum", |a: &i64, b: &i64| a + b),
        stats: AggregatingStateDescriptor::new("stats", |acc: &mut (u32, i64), v: &i64| {
            acc.0 += 1;
            acc.1 += v;
        }),
    }
}

/// What [`Kinds`] reads, computed naively.
#[derive(Default)]
struct KindsModel {
    value: BTreeMap<String, i64>,
    list: BTreeMap<String, Vec<i64>>,
    map: BTreeMap<String, BTreeMap<String, i64>>,
    sum: BTreeMap<String, i64>,
}

impl KindsModel {
    fn apply(&mut self, key: &str, cmd: &str) -> String {
        let parts: Vec<&str> = cmd.split_whitespace().collect();
        let n = |i: usize| parts.get(i).and_then(|s| s.parse::<i64>().ok()).unwrap_or(0);
        let k = key.to_string();
        let seen = match parts[0] {
            "set" => {
                self.value.insert(k, n(1));
                "Ok(())".to_string()
            }
            "get" => format!("{:?}", self.value.get(key)),
            "push" => {
                self.list.entry(k).or_default().push(n(1));
                "Ok(())".to_string()
            }
            "list" => format!("{:?}", self.list.get(key).cloned().unwrap_or_default()),
            "put" => {
                self.map.entry(k).or_default().insert(parts[1].to_string(), n(2));
                "Ok(())".to_string()
            }
            "entries" => format!(
                "{:?}",
                self.map.get(key).cloned().unwrap_or_default().into_iter().collect::<Vec<_>>()
            ),
            "sum" => format!("{:?}", *self.sum.entry(k).and_modify(|s| *s += n(1)).or_insert(n(1))),
            other => panic!("unknown command {other}"),
        };
        format!("{key} {cmd} -> {seen}")
    }
}

fn kinds_cmd() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (-3i64..3).prop_map(|n| format!("set {n}")),
        4 => Just("get".to_string()),
        1 => (-3i64..3).prop_map(|n| format!("push {n}")),
        1 => Just("list".to_string()),
        1 => (prop_oneof![Just("x"), Just("y")], -3i64..3).prop_map(|(m, n)| format!("put {m} {n}")),
        1 => Just("entries".to_string()),
        1 => (-3i64..3).prop_map(|n| format!("sum {n}")),
    ]
}

proptest! {
    /// Batches of elements whose state lookups are announced ahead (a heap backend that
    /// takes announcements at any size; the value state is used by most elements, so it is
    /// announced, and the elements using another state skip its announcements) read what a
    /// naive model says.
    #[test]
    fn states_read_what_was_written_when_lookups_are_announced_ahead(
        elements in prop::collection::vec((0u8..24, kinds_cmd()), 1..300),
        batch in 1usize..40,
    ) {
        let backend = caudal_checkpoints::HeapStateBackend::new(caudal_checkpoints::KeyGroupRange::all(128));
        let keyed = crate::state::KeyedState::from_backend(Box::new(backend.announce_from(0)));
        let mut h = harness(kinds(), |e: &(String, String)| e.0.clone()).with_keyed_state(keyed);
        let mut model = KindsModel::default();
        for chunk in elements.chunks(batch) {
            let records = chunk.iter().map(|(k, cmd)| Record::new(0, (format!("k{k}"), cmd.clone()))).collect();
            h.process(records).unwrap();
            let want: Vec<String> = chunk.iter().map(|(k, cmd)| model.apply(&format!("k{k}"), cmd)).collect();
            prop_assert_eq!(main_values(h.take()), want);
        }
    }
}

#[test]
fn state_names_of_the_engine_and_invalid_ones_fail_at_first_use_naming_them() {
    #[derive(Clone)]
    struct Bad(ValueStateDescriptor<u8>);
    impl KeyedProcessFunction<u8, u8, u8> for Bad {
        fn process_element(
            &mut self,
            _: u8,
            ctx: &mut KeyedContext<'_, u8>,
            _: &mut Output<'_, u8>,
        ) -> Result<()> {
            ctx.value(&self.0).get().map(|_| ())
        }
    }
    for name in ["_timer.event", ""] {
        let mut h = harness(Bad(ValueStateDescriptor::new(name)), |k: &u8| *k);
        let err = h.process(vec![Record::new(0, 1)]).unwrap_err().to_string();
        assert!(err.contains(&format!("state name `{name}`")), "{err}");
    }
}

// ---- broadcast state ---------------------------------------------------------------------

/// Keeps the latest control value; a keyed element reads it.
#[derive(Clone)]
struct Latest(BroadcastStateDescriptor<String, i64>);

impl KeyedBroadcastProcessFunction<u8, u8, i64, (u8, Option<i64>)> for Latest {
    fn process_element(
        &mut self,
        k: u8,
        ctx: &mut KeyedContext<'_, u8>,
        out: &mut Output<'_, (u8, Option<i64>)>,
    ) -> Result<()> {
        let limit = ctx.broadcast_state(&self.0)?.get(&"limit".to_string())?;
        out.collect((k, limit));
        Ok(())
    }

    fn process_broadcast_element(
        &mut self,
        v: i64,
        ctx: &mut BroadcastContext<'_>,
        _out: &mut Output<'_, (u8, Option<i64>)>,
    ) -> Result<()> {
        ctx.state(&self.0).put(&"limit".to_string(), &v)
    }
}

#[test]
fn broadcast_state_is_checkpointed_once_and_every_subtask_restores_it_at_any_parallelism() {
    use super::broadcast::KeyedBroadcastOperator;
    let op = || {
        OperatorHarness::new(KeyedBroadcastOperator::new(
            Latest(BroadcastStateDescriptor::new("limits")),
            Arc::new(|k: &u8| *k),
        ))
        .unwrap()
    };
    // Two subtasks of a parallelism-2 run, each given the control elements.
    let mut snapshots = Vec::new();
    for subtask in 0..2u32 {
        let mut h = op();
        let range = crate::keygroup::key_group_range(subtask, 128, 2);
        let snap = {
            h.restore_as(Vec::new(), subtask, 2).unwrap();
            h.process(vec![Record::new(0, TwoInputs::Second(10)), Record::new(1, TwoInputs::Second(42))])
                .unwrap();
            assert!(range.start < range.end);
            h.snapshot(1).unwrap()
        };
        assert_eq!(
            snap.operator_state.is_some(),
            subtask == 0,
            "only subtask 0 snapshots the broadcast state"
        );
        snapshots.push(snap);
    }
    // Restored at parallelism 3: every subtask reads the limit.
    for subtask in 0..3u32 {
        let mut h = op();
        h.restore_as(snapshots.clone(), subtask, 3).unwrap();
        let keys: Vec<u8> = (0..=255u8)
            .filter(|k| {
                crate::keygroup::key_group_range(subtask, 128, 3)
                    .contains(&crate::keygroup::key_group_of(k, 128))
            })
            .take(3)
            .collect();
        h.process(keys.iter().map(|k| Record::new(5, TwoInputs::First(*k))).collect()).unwrap();
        assert_eq!(
            main_values(h.take()),
            keys.iter().map(|k| (*k, Some(42))).collect::<Vec<_>>(),
            "subtask {subtask} of 3"
        );
    }
}

#[test]
fn broadcast_state_outside_a_broadcast_connection_is_an_error_naming_it() {
    #[derive(Clone)]
    struct Reads(BroadcastStateDescriptor<u8, u8>);
    impl KeyedProcessFunction<u8, u8, u8> for Reads {
        fn process_element(
            &mut self,
            _: u8,
            ctx: &mut KeyedContext<'_, u8>,
            _: &mut Output<'_, u8>,
        ) -> Result<()> {
            ctx.broadcast_state(&self.0).map(|_| ())
        }
    }
    let mut h = harness(Reads(BroadcastStateDescriptor::new("rules")), |k: &u8| *k);
    let err = h.process(vec![Record::new(0, 1)]).unwrap_err().to_string();
    assert!(
        err.contains("broadcast state `rules`") && err.contains("not connected to a broadcast stream"),
        "{err}"
    );
}

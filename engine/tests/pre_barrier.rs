//! `Operator::prepare_snapshot_pre_barrier`: what an operator emits there reaches its
//! consumers ahead of the barrier — a sink's pre-commit of checkpoint `n` has seen the
//! records the operator emitted for `n`, at every checkpoint, across a network exchange.

use caudal::{
    Batch, CheckpointId, JobConfig, Operator, OperatorContext, Record, Result, Sink, StreamEnv,
    WatermarkStrategy,
};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Emits `(checkpoint, records seen)` at each barrier, nothing else.
struct Tally(u64);

impl Operator for Tally {
    type In = u64;
    type Out = (u64, u64);
    fn process_batch(
        &mut self,
        batch: Batch<u64>,
        _: &mut Batch<(u64, u64)>,
        _: &mut OperatorContext,
    ) -> Result<()> {
        self.0 += batch.len() as u64;
        Ok(())
    }
    fn prepare_snapshot_pre_barrier(
        &mut self,
        checkpoint: CheckpointId,
        out: &mut Batch<(u64, u64)>,
        _: &mut OperatorContext,
    ) -> Result<()> {
        out.push(Record::new(0, (checkpoint.0, self.0)));
        Ok(())
    }
}

/// Each pre-commit's checkpoint and the newest tally received by then.
type Seen = Arc<Mutex<Vec<(u64, Option<(u64, u64)>)>>>;

/// At each pre-commit, the newest tally received and the checkpoint.
struct Check {
    last: Option<(u64, u64)>,
    seen: Seen,
}

impl Sink for Check {
    type In = (u64, u64);
    fn write_batch(&mut self, batch: Batch<(u64, u64)>, _: &mut OperatorContext) -> Result<()> {
        self.last = batch.last().map(|r| r.value).or(self.last);
        Ok(())
    }
    fn pre_commit(&mut self, checkpoint: CheckpointId, _: &mut OperatorContext) -> Result<Option<Vec<u8>>> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).push((checkpoint.0, self.last));
        Ok(None)
    }
}

#[test]
fn what_an_operator_emits_before_the_barrier_is_in_the_consumers_checkpoint() {
    let mut config = JobConfig { parallelism: 2, handle_signals: false, ..JobConfig::default() };
    config.checkpoints.interval = Some(Duration::from_millis(30));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    config.checkpoints.storage.url = dir.path().display().to_string();
    let env = StreamEnv::with_config(config);
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let sink_seen = seen.clone();
    let source = caudal::RateLimited::new(caudal::testing::CountSource(3000), 10_000.0)
        .unwrap_or_else(|e| panic!("{e}"));
    env.source("count", source, WatermarkStrategy::none())
        .parallelism(1)
        .transform("tally", |_| Ok(Tally(0)))
        .parallelism(1)
        .sink("check", move |_| Ok(Check { last: None, seen: sink_seen.clone() }))
        .parallelism(2);
    env.execute("pre-barrier").unwrap_or_else(|e| panic!("{e}"));
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    // Two sink subtasks; the round-robin exchange gives each tally to one of them, so each
    // pre-commit has the tally of its checkpoint or none yet at all, never an older one
    // while a newer went to it.
    let with_tally: Vec<_> = seen.iter().filter(|(_, t)| t.is_some()).collect();
    assert!(with_tally.len() >= 3, "too few checkpoints: {seen:?}");
    let mut last_count = 0;
    for (checkpoint, tally) in &seen {
        if let Some((tallied, count)) = tally {
            assert!(tallied <= checkpoint, "a tally of a later checkpoint arrived first: {seen:?}");
            last_count = last_count.max(*count);
        }
    }
    // Both subtasks together got every checkpoint's tally before its barrier.
    let mut by_checkpoint: std::collections::BTreeMap<u64, bool> = Default::default();
    for (checkpoint, tally) in &seen {
        let e = by_checkpoint.entry(*checkpoint).or_default();
        *e |= tally.is_some_and(|(t, _)| t == *checkpoint);
    }
    assert!(by_checkpoint.values().all(|&got| got), "a checkpoint's tally came after its barrier: {seen:?}");
    assert_eq!(last_count, 3000, "the final checkpoint's tally counts every record");
}

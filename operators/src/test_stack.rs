//! Tests only: the running test stack's addresses (`scripts/services.sh env`), unique
//! names, and a sink context. Without a service's variable a test prints why and passes,
//! unless `CAUDAL_REQUIRE_STACK` is set (CI), in which case it fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use caudal::{Batch, CheckpointId, OperatorContext, Sink};

/// The value of `var`, or `None` (the test then returns) after saying why.
pub(crate) fn service(var: &str) -> Option<String> {
    caudal_test_stack::service(var)
}

/// A name no other test run uses (lower case, `[a-z0-9_]`).
pub(crate) fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("t_{what}_{}_{}", std::process::id(), nanos % 1_000_000_000_000)
}

/// The context of subtask `subtask` of a checkpointing job `job`, restored from `restored`.
pub(crate) fn context(job: &str, subtask: u32, restored: Option<u64>) -> OperatorContext {
    let mut ctx = OperatorContext::unkeyed(job, "sink", subtask, 1);
    ctx.operator_uid = "sink".into();
    ctx.checkpointing = true;
    ctx.restored_checkpoint = restored.map(CheckpointId);
    ctx
}

/// Wraps a sink and fails the job right after `inner` pre-committed checkpoint `at`: the
/// epoch is prepared (or uploaded) but the checkpoint never completes.
pub(crate) struct FailsAfterPreCommit<S> {
    pub(crate) inner: S,
    pub(crate) at: u64,
}

impl<S: Sink> Sink for FailsAfterPreCommit<S> {
    type In = S::In;

    fn write_batch(&mut self, batch: Batch<S::In>, ctx: &mut OperatorContext) -> caudal::Result<()> {
        self.inner.write_batch(batch, ctx)
    }

    fn on_start(&mut self, ctx: &mut OperatorContext) -> caudal::Result<()> {
        self.inner.on_start(ctx)
    }

    fn restore(&mut self, snapshots: Vec<Vec<u8>>, ctx: &mut OperatorContext) -> caudal::Result<()> {
        self.inner.restore(snapshots, ctx)
    }

    fn pre_commit(&mut self, c: CheckpointId, ctx: &mut OperatorContext) -> caudal::Result<Option<Vec<u8>>> {
        let handles = self.inner.pre_commit(c, ctx)?;
        if c.0 == self.at {
            return Err(caudal::Error::Operator(format!(
                "injected failure after pre-committing checkpoint {c}"
            )));
        }
        Ok(handles)
    }

    fn on_checkpoint_complete(&mut self, c: CheckpointId, ctx: &mut OperatorContext) -> caudal::Result<()> {
        self.inner.on_checkpoint_complete(c, ctx)
    }

    fn on_close(&mut self, ctx: &mut OperatorContext) -> caudal::Result<()> {
        self.inner.on_close(ctx)
    }
}

/// Runs job `job` in this process: `items` → `sink`, one record every 20 ms, a checkpoint
/// every 100 ms. With `fail_at`, the run fails right after the sink pre-committed that
/// checkpoint; without, it restores the latest completed checkpoint (as a restart does)
/// and runs to the end.
pub(crate) fn run_in_process<T, S>(
    job: &str,
    items: Vec<T>,
    checkpoints: &std::path::Path,
    fail_at: Option<u64>,
    sink: impl Fn() -> caudal::Result<S> + 'static,
) -> caudal::Result<caudal::JobResult>
where
    T: caudal::Data + Sync,
    S: Sink<In = T>,
{
    let mut config = caudal::JobConfig {
        handle_signals: false,
        latency_marker_interval: None,
        batch_size: 1, // a barrier can come between any two records
        ..caudal::JobConfig::default()
    };
    config.checkpoints.interval = Some(std::time::Duration::from_millis(100));
    config.checkpoints.storage.url = checkpoints.display().to_string();
    if fail_at.is_none() {
        config.checkpoints.restore = Some(caudal::RestoreFrom::Latest);
    }
    let env = caudal::StreamEnv::with_config(config);
    env.from_iter("items", items)
        .map(|r| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            r
        })
        .sink("sink", move |_| Ok(FailsAfterPreCommit { inner: sink()?, at: fail_at.unwrap_or(u64::MAX) }));
    env.execute(job)
}

//! Crash points of the checkpoint protocol, for recovery tests.
//!
//! A test sets `CAUDAL__TEST_CRASH_AT=<point>:<checkpoint>` (read by the `JobConfig` loader);
//! when the job reaches that point of that checkpoint the process sends itself SIGKILL —
//! no destructor, no flush, no signal handler, no core dump: what `kill -9` or the OOM killer
//! does there. Unset, a point costs one atomic load.
//!
//! `<checkpoint>` may be `final`: the final checkpoint of the end of the input, a stop or a
//! stop with savepoint, whatever its number — known in the process that runs the checkpoint
//! coordinator (an embedded job, or a cluster's job manager), which tells a cluster's
//! executors before their barriers.
//!
//! `CAUDAL__TEST_PAUSE_AT=<point>:<checkpoint>:<ms>` instead holds the thread that reaches
//! the point for `ms` milliseconds (once), so a test can fail a service exactly there — e.g.
//! restart PostgreSQL while every sink's epoch is prepared and none is committed yet.
//! `CAUDAL__TEST_FREEZE_AT=<point>:<checkpoint>` stops the whole process there (SIGSTOP,
//! once), as a frozen VM or a long pause would, until the test sends SIGCONT: a zombie.

use crate::types::CheckpointId;
use std::sync::OnceLock;

/// A sink wrote records of epoch `n` — after barrier `n − 1`, before barrier `n` reached it
/// — into its open transaction, and they are at the broker (the Kafka sink) or the
/// database (the PostgreSQL sink, their keys locked).
pub const BEFORE_SINK_BARRIER: &str = "before-sink-barrier";
/// A task snapshotted its operators for the checkpoint but has not acked it yet.
pub const AFTER_SNAPSHOT_BEFORE_ACK: &str = "after-snapshot-before-ack";
/// A sink flushed and pre-committed its epoch (the barrier passed it).
pub const AFTER_SINK_PRE_COMMIT: &str = "after-sink-pre-commit";
/// A keyed-state upload (the asynchronous part of a snapshot) is half done: some of the
/// subtask's files are in checkpoint storage, the others not, and it has not acked.
pub const DURING_ASYNC_UPLOAD: &str = "during-async-upload";
/// Every task acked; the metadata is not written yet.
pub const BEFORE_METADATA: &str = "before-metadata";
/// The metadata is durable (the checkpoint is complete); no task was notified yet.
pub const AFTER_METADATA_BEFORE_NOTIFY: &str = "after-metadata-before-notify";
/// A sink is committing (some of its pending files are published, some not).
pub const DURING_SINK_COMMIT: &str = "during-sink-commit";
/// A restored job has read its checkpoint's metadata; no operator has restored yet (the
/// sinks' restore-time commits have points of their own: `during-*-recommit`,
/// `during-archive-republish`).
pub const DURING_RESTORE: &str = "during-restore";
/// A restored Kafka sink subtask committed the first transaction the checkpoint recorded
/// (the others of the process, and of the subtask, not yet); the checkpoint is the restored one.
pub const DURING_KAFKA_RECOMMIT: &str = "during-kafka-recommit";
/// A restored PostgreSQL sink committed the first of several prepared epochs (`COMMIT
/// PREPARED`), not the rest; the checkpoint is the restored one.
pub const DURING_POSTGRES_RECOMMIT: &str = "during-postgres-recommit";
/// A restored archive sink published the first pre-committed file of its checkpoint (the
/// others, and the removal of stale in-progress files, not yet); the checkpoint is the
/// restored one.
pub const DURING_ARCHIVE_REPUBLISH: &str = "during-archive-republish";
/// An Iceberg committer read the table and did not find the checkpoint's snapshot there; it
/// has not sent the commit yet.
pub const ICEBERG_AFTER_TABLE_CHECK: &str = "iceberg-after-table-check";
/// An Iceberg committer wrote the new table metadata of the checkpoint's snapshot; the
/// catalog does not point at it yet.
pub const ICEBERG_BEFORE_CATALOG_UPDATE: &str = "iceberg-before-catalog-update";
/// The catalog points at the checkpoint's Iceberg snapshot; the committer has not had the
/// answer (as when it is lost on the way).
pub const ICEBERG_AFTER_CATALOG_UPDATE: &str = "iceberg-after-catalog-update";

/// The checkpoint of a crash or pause point given as `final` ([`FINAL_CHECKPOINT`] then says
/// which one it is).
pub const FINAL: u64 = u64::MAX;

/// The final checkpoint the coordinator of this process triggered (0: none yet).
static FINAL_CHECKPOINT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The coordinator triggers `checkpoint` as the final one (of the end of the input or a stop);
/// in a cluster the job manager tells the executors too (`ToExecutor::FinalCheckpoint`), so
/// their crash points at `final` fire.
pub(crate) fn mark_final(checkpoint: CheckpointId) {
    FINAL_CHECKPOINT.store(checkpoint.0, std::sync::atomic::Ordering::SeqCst);
}

/// Whether the coordinator of this process marked `checkpoint` final.
pub(crate) fn is_marked_final(checkpoint: CheckpointId) -> bool {
    FINAL_CHECKPOINT.load(std::sync::atomic::Ordering::SeqCst) == checkpoint.0 && checkpoint.0 != 0
}

/// Whether the armed `armed_at` (a number, or [`FINAL`]) is `checkpoint`.
#[inline]
fn is(armed_at: u64, checkpoint: CheckpointId) -> bool {
    armed_at == checkpoint.0
        || (armed_at == FINAL && FINAL_CHECKPOINT.load(std::sync::atomic::Ordering::SeqCst) == checkpoint.0)
}

static CRASH_AT: OnceLock<(String, u64)> = OnceLock::new();
static PAUSE_AT: OnceLock<(String, u64, u64)> = OnceLock::new();
static PAUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static FREEZE_AT: OnceLock<(String, u64)> = OnceLock::new();
static FROZEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Arms the crash, pause and freeze points `config` names (once per process).
pub(crate) fn install(config: &crate::JobConfig) {
    if let Some((point, checkpoint)) = &config.crash_at {
        let _ = CRASH_AT.set((point.clone(), *checkpoint));
    }
    if let Some((point, checkpoint, ms)) = &config.pause_at {
        let _ = PAUSE_AT.set((point.clone(), *checkpoint, *ms));
    }
    if let Some((point, checkpoint)) = &config.freeze_at {
        let _ = FREEZE_AT.set((point.clone(), *checkpoint));
    }
}

/// Whether `name` at `checkpoint` is the armed crash point (or a freeze point not reached
/// yet): for a point that must prepare what it crashes with (e.g. flush records to a
/// broker) before [`point`].
#[inline]
pub fn armed(name: &str, checkpoint: CheckpointId) -> bool {
    names(&CRASH_AT, name, checkpoint)
        || (names(&FREEZE_AT, name, checkpoint) && !FROZEN.load(std::sync::atomic::Ordering::SeqCst))
}

/// Whether the point armed in `slot` is `name` at `checkpoint`.
#[inline]
fn names(slot: &OnceLock<(String, u64)>, name: &str, checkpoint: CheckpointId) -> bool {
    slot.get().is_some_and(|(p, c)| p == name && is(*c, checkpoint))
}

/// Kill the process if `name` at `checkpoint` is the armed crash point; hold the thread if
/// it is the armed pause point, stop the process if it is the armed freeze point (each
/// for the first thread that reaches it).
#[inline]
pub fn point(name: &str, checkpoint: CheckpointId) {
    if let Some((p, c, ms)) = PAUSE_AT.get() {
        if p == name && is(*c, checkpoint) && !PAUSED.swap(true, std::sync::atomic::Ordering::SeqCst) {
            eprintln!("caudal: pause point {name} at checkpoint {checkpoint}: holding for {ms} ms");
            std::thread::sleep(std::time::Duration::from_millis(*ms));
            eprintln!("caudal: pause point {name} at checkpoint {checkpoint}: going on");
        }
    }
    if names(&FREEZE_AT, name, checkpoint) && !FROZEN.swap(true, std::sync::atomic::Ordering::SeqCst) {
        eprintln!("caudal: freeze point {name} at checkpoint {checkpoint}: stopping the process (SIGSTOP)");
        let _ = signal_hook::low_level::raise(signal_hook::consts::SIGSTOP);
        eprintln!("caudal: freeze point {name} at checkpoint {checkpoint}: resumed");
    }
    if names(&CRASH_AT, name, checkpoint) {
        eprintln!("caudal: crash point {name} at checkpoint {checkpoint}: killing the process (SIGKILL)");
        kill_self();
    }
}

/// SIGKILL to this process: it cannot be caught, so nothing of the process runs after it.
fn kill_self() -> ! {
    let _ = signal_hook::low_level::raise(signal_hook::consts::SIGKILL);
    // Not reached: SIGKILL is delivered before raise returns. Should it fail, abort still
    // ends the process without unwinding.
    std::process::abort()
}

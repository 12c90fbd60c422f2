//! Crash points of the checkpoint protocol, for recovery tests.
//!
//! A test sets `CAUDAL__TEST_CRASH_AT=<point>:<checkpoint>` (read by the `JobConfig` loader);
//! when the job reaches that point of that checkpoint the process sends itself SIGKILL —
//! no destructor, no flush, no signal handler, no core dump: what `kill -9` or the OOM killer
//! does there. Unset, a point costs one atomic load.

use crate::types::CheckpointId;
use std::sync::OnceLock;

/// A sink wrote records of epoch `n` — after barrier `n − 1`, before barrier `n` reached it
/// — into its open transaction, and they are at the broker (the Kafka sink).
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
/// A restored job has read its checkpoint and is restoring operators.
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

static CRASH_AT: OnceLock<(String, u64)> = OnceLock::new();

/// Arm the crash point (once per process).
pub(crate) fn install(point: &str, checkpoint: u64) {
    let _ = CRASH_AT.set((point.to_string(), checkpoint));
}

/// Whether `name` at `checkpoint` is the armed crash point: for a point that must prepare
/// what it crashes with (e.g. flush records to a broker) before [`point`].
#[inline]
pub fn armed(name: &str, checkpoint: CheckpointId) -> bool {
    CRASH_AT.get().is_some_and(|(p, c)| p == name && *c == checkpoint.0)
}

/// Kill the process if `name` at `checkpoint` is the armed crash point.
#[inline]
pub fn point(name: &str, checkpoint: CheckpointId) {
    if armed(name, checkpoint) {
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

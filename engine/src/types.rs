//! The values that travel between tasks: records, batches and in-band events.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Event time in milliseconds since the Unix epoch.
pub type Timestamp = i64;

/// The smallest watermark: nothing is known yet.
pub const MIN_WATERMARK: Timestamp = i64::MIN;
/// The final watermark of a bounded stream: every window fires.
pub const MAX_WATERMARK: Timestamp = i64::MAX;

/// A record with its event timestamp. Operators see `value`; the engine keeps `ts`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record<T> {
    /// Event time assigned at the source (or [`MIN_WATERMARK`] when the stream has none).
    pub ts: Timestamp,
    /// The user's value.
    pub value: T,
}

impl<T> Record<T> {
    /// A record at event time `ts`.
    pub fn new(ts: Timestamp, value: T) -> Self {
        Record { ts, value }
    }
}

/// Records travel in batches; a batch never exceeds the configured batch size.
pub type Batch<T> = Vec<Record<T>>;

/// The element bound of a stream: what a record must be to cross threads and processes
/// and to be kept in checkpointed state.
pub trait Data: Clone + Send + fmt::Debug + Serialize + serde::de::DeserializeOwned + 'static {}
impl<T: Clone + Send + fmt::Debug + Serialize + serde::de::DeserializeOwned + 'static> Data for T {}

/// The bound of a key: hashed stably into a key group, compared, cloned into state.
pub trait Key: Data + std::hash::Hash + Eq + Ord {}
impl<T: Data + std::hash::Hash + Eq + Ord> Key for T {}

pub use caudal_checkpoints::{CheckpointId, SubtaskIndex};

/// The barrier of checkpoint `id`, injected at the sources and aligned at every task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointBarrier {
    /// The checkpoint this barrier belongs to.
    pub id: CheckpointId,
    /// Wall-clock time of the trigger, milliseconds since the epoch.
    pub triggered_at: i64,
    /// The latest checkpoint completed when this one was triggered: the only one whose
    /// files an incremental snapshot may reuse (see `StateLocation::latest_completed`).
    pub latest_completed: Option<CheckpointId>,
}

/// A latency marker (as in Flink): a source subtask emits one every
/// `JobConfig::latency_marker_interval`; it travels behind the records sent before it, and
/// every operator it reaches records `now - emitted` in its latency histogram. Wall-clock
/// time, so markers that cross processes on hosts with skewed clocks show that skew.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyMarker {
    /// When the source emitted it, nanoseconds since the epoch.
    pub emitted_ns: i64,
}

impl LatencyMarker {
    /// A marker emitted now.
    pub fn now() -> Self {
        LatencyMarker { emitted_ns: now_ns() }
    }

    /// Microseconds from its emission until now (0 if the clock went back).
    pub fn age_us(&self) -> u64 {
        (now_ns().saturating_sub(self.emitted_ns).max(0) / 1000) as u64
    }
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// What travels on every channel: data and the in-band events, in order.
#[derive(Debug, Clone)]
pub enum StreamMessage<B> {
    /// A batch of records.
    Data(B),
    /// No record with a smaller timestamp follows on this channel.
    Watermark(Timestamp),
    /// The channel has no data for now: exclude it from the watermark minimum.
    Idle,
    /// Checkpoint barrier: everything before it belongs to the checkpoint.
    Barrier(CheckpointBarrier),
    /// The channel is finished.
    End,
    /// A latency marker (see [`LatencyMarker`]).
    LatencyMarker(LatencyMarker),
}

//! Caudal: a dataflow stream processor.
//!
//! **In:** a job graph built with the DataStream API ([`StreamEnv`], [`DataStream`],
//! [`KeyedStream`]) from sources, operators and sinks that implement [`Source`],
//! [`Operator`] and [`Sink`]. **Out:** the graph running in parallel — a thread per task,
//! forward edges of equal parallelism chained into one task, bounded channels between
//! tasks (backpressure, never unbounded buffering), records in batches with in-band
//! watermarks, checkpoint barriers and end-of-stream markers.
//!
//! **Invariant:** on every channel, messages arrive in the order they were sent, and a
//! watermark `w` promises that no later record on that channel has a timestamp `<= w`
//! unless it is late (and then it is counted, never silently dropped).
//!
//! ```
//! use caudal::{StreamEnv, testing::CollectSink};
//! let env = StreamEnv::new();
//! let (sink, out) = CollectSink::new();
//! env.from_iter("temps-f", vec![212.0_f64, 32.0, 5000.0])
//!     .map(|f| (f - 32.0) * 5.0 / 9.0).name("to-celsius")
//!     .filter(|c| *c > -50.0 && *c < 60.0).name("anomalies")
//!     .sink("out", move |_| Ok(sink.clone()));
//! env.execute("example").unwrap();
//! assert_eq!(*out.lock(), vec![0.0]);
//! ```
//! (212 °F is 100 °C: an anomaly for this filter, as is 5000 °F.)

mod api;
pub mod calendar;
pub mod cluster;
pub mod config;
mod coordinator;
pub mod crash;
pub mod error;
mod graph;
pub mod job;
pub mod keygroup;
pub mod logging;
pub mod metrics;
pub mod operator;
mod restore;
mod run;
mod runtime;
pub mod savepoint;
pub mod source;
pub mod state;
pub mod state_query;
pub mod testing;
pub mod types;
pub mod web;

pub use api::env::StreamEnv;
pub use api::stream::{DataStream, DataStreamSink, KeyedStream};
pub use api::{async_io, process};
pub use config::{CheckpointConfig, JobConfig, RestoreFrom};
pub use error::{Error, Result, TaskLocation};
pub use graph::{uid_safe, EdgeKind, JobPlan, PlanEdge, PlanNode};
pub use job::StopHandle;
pub use job::{
    CheckpointSettings, JobStatus, JobView, SavepointRefused, SavepointRequest, TaskCheckpointStats,
};
pub use operator::{new_attempt_id, LaterSnapshot, Operator, OperatorContext, Sink, StateBrowse};
pub use run::{JobResult, ProgressFn, RunFence};
pub use source::{
    RateLimited, Source, SourceContext, SourceOutput, SourcePoll, SourceReader, WatermarkStrategy,
};
pub use state::{KeyedState, KeyedStateGuard};
pub use types::{Batch, CheckpointBarrier, CheckpointId, Data, Key, Record, StreamMessage, Timestamp};

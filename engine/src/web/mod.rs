//! The REST API and web UI of running jobs (DESIGN.md §7).
//!
//! **In:** [`JobView`](crate::JobView)s registered in a [`JobRegistry`]. **Out:** JSON under
//! `/api/v1` (described by `/api/v1/openapi.json`), Prometheus text at `/metrics`, and a
//! UI at `/` built on that API and embedded in the binary.
//!
//! **Invariant:** serving never slows a task: the server runs on its own thread with a
//! current-thread runtime, and a request only copies relaxed atomics and short-held locks.
//! A sampler on that thread copies every job's counters and gauges once a second and keeps
//! five minutes of them; per-second rates, busy/backpressured ratios and the Kafka lag
//! history come from that history. The one exception, the operator state browser
//! (`state.rs`), never reads state itself: it asks the owning task, which answers between two
//! batches (see [`crate::state_query`]).
//!
//! Embedded mode starts it from `StreamEnv::execute` when [`JobConfig::web_bind`](crate::JobConfig)
//! is set, and stops it when `execute` returns:
//!
//! ```no_run
//! use caudal::{JobConfig, StreamEnv};
//! let config = JobConfig { web_bind: Some("127.0.0.1:8081".parse().unwrap()), ..JobConfig::default() };
//! let env = StreamEnv::with_config(config);
//! // ... build the job ...
//! # env.from_iter("n", 0..10u64).sink("out", |_| Ok(caudal::testing::CollectSink::new().0));
//! env.execute("my-job").unwrap(); // http://127.0.0.1:8081 while it runs
//! ```

mod api;
mod assets;
mod guard;
mod kafka;
pub mod prometheus;
mod registry;
mod savepoints;
mod server;
mod state;
mod tls;
mod transactions;
mod views;

pub(crate) use guard::Access;
pub use registry::{JobRegistry, HISTORY_SAMPLES, SAMPLE_INTERVAL};
pub use savepoints::SavepointsView;
pub(crate) use server::WebAccess;
pub use server::WebServer;

/// The OpenAPI 3 document served at `/api/v1/openapi.json`.
pub const OPENAPI_JSON: &str = api::OPENAPI_JSON;

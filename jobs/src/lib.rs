//! Caudal's job binaries and the pipelines they run.
//!
//! **In:** flags. **Out:** a running job. Each pipeline is a library function so tests and
//! benchmarks build exactly the graph the binary runs.

pub mod alerts;
pub mod cli;
pub mod enrich;
pub mod limits;
pub mod produce;
pub mod temperature;
pub mod user_interactions;

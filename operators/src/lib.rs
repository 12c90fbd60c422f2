//! Caudal operators: keyed windows, sources and sinks.
//!
//! **In:** the engine's [`caudal::Operator`], [`caudal::Source`] and [`caudal::Sink`]
//! traits. **Out:** concrete operators a job plugs into its graph — event-time windows
//! ([`window`]), the sensor generator ([`generator`]), and file, stdout and discarding
//! sinks ([`sinks`]).
//!
//! **Invariant:** no operator panics on data: bad records are counted and routed, never
//! silently dropped.

pub mod generator;
pub mod kafka;
pub mod sinks;
pub mod window;

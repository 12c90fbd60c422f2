//! Caudal operators: keyed windows, sources and sinks.
//!
//! **In:** the engine's [`caudal::Operator`], [`caudal::Source`] and [`caudal::Sink`]
//! traits. **Out:** concrete operators a job plugs into its graph — event-time windows
//! ([`window`]), the sensor generator ([`generator`]), file, stdout and discarding sinks
//! ([`sinks`]), and the serving and storage sinks: PostgreSQL upserts ([`postgres`]), Redis
//! latest values ([`redis`]), the Avro archive on a directory or S3 ([`archive`]) and Iceberg
//! tables ([`iceberg`]), with
//! bounded retries while a service is away ([`retry`]).
//!
//! **Invariant:** no operator panics on data: bad records are counted and routed, never
//! silently dropped.

pub mod archive;
pub mod generator;
pub mod iceberg;
pub mod kafka;
pub mod postgres;
pub mod redis;
pub mod retry;
pub mod sinks;
#[cfg(test)]
mod test_stack;
pub mod tls;
pub mod window;

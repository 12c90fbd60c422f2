//! The PostgreSQL sink: records upserted into a table, exactly once per checkpoint epoch;
//! and a lookup for `async_map` ([`lookup`]).
//!
//! **In:** records (structs of scalar fields). **Out:** rows of `schema.table`, one per
//! key, the table created if absent with a column per field. **Invariant:** the rows of
//! an epoch become visible together, when its checkpoint completes, and a restore neither
//! loses nor repeats an epoch (prepared transactions + the `caudal_sink_epochs` table, see
//! [`sink`]).
//!
//! ```no_run
//! use caudal_operators::postgres::PostgresSinkConfig;
//! # #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)] struct Reading { sensor_id: u64, ts: i64, temp_c: f64 }
//! # let env = caudal::StreamEnv::new();
//! # let readings: caudal::DataStream<Reading> = env.from_iter("r", Vec::<Reading>::new());
//! let config = PostgresSinkConfig::new("postgres://caudal@127.0.0.1:5432/caudal", "readings", &["sensor_id", "ts"]);
//! readings.sink("readings-pg", move |_| config.build::<Reading>());
//! ```

mod buffer;
mod client;
mod config;
pub mod lookup;
pub mod row;
pub mod sink;
pub(crate) mod tls;
mod txn;

#[cfg(test)]
mod tests;

pub(crate) use config::redact;
pub use config::PostgresSinkConfig;
pub use lookup::PostgresLookup;
pub use sink::PostgresSink;
pub use txn::EPOCHS_TABLE;

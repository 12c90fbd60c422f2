//! The Redis sink: the latest value of each key as a hash, moving only forward in event
//! time.
//!
//! **In:** records that implement [`RedisHash`] (a key, an event time, fields).
//! **Out:** one hash `<prefix><key>` per key with the fields of the newest record and its
//! `ts`. **Invariant:** a hash never goes back in event time — a Lua script compares `ts`
//! before writing — so replays after a restore (at-least-once delivery) leave the same end
//! state as a run without failures: idempotent, exactly-once in effect.
//!
//! ```no_run
//! use caudal_operators::redis::{HashFields, RedisHash, RedisSinkConfig};
//! #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
//! struct Reading { sensor_id: u64, ts: i64, temp_c: f64 }
//! impl RedisHash for Reading {
//!     fn key(&self) -> String { self.sensor_id.to_string() }
//!     fn event_time(&self) -> i64 { self.ts }
//!     fn fields(&self, out: &mut HashFields) { out.push(("celsius", self.temp_c.to_string())); }
//! }
//! # let env = caudal::StreamEnv::new();
//! # let readings: caudal::DataStream<Reading> = env.from_iter("r", Vec::<Reading>::new());
//! let config = RedisSinkConfig::new("redis://127.0.0.1:6379/");
//! readings.sink("latest", move |_| config.build::<Reading>());
//! ```

mod config;
mod sink;

#[cfg(test)]
mod tests;

pub use config::RedisSinkConfig;
pub use sink::{HashFields, RedisHash, RedisSink, FORWARD_ONLY_HSET, KEYS_PER_CALL};

//! The sensor generator: the stand-in for the reference architecture's Kafka Connect
//! temperature connector.
//!
//! `sensors` sensors, each at a fixed latitude/longitude, emit `rate` readings per second
//! (0 = as fast as possible) in °F. The sensors are divided into `splits` shards; split `k`
//! owns the sensors `s` with `s % splits == k`, and its n-th record is a pure function of
//! (seed, k, n). The position of a split is that sequence number `n`, so a restored
//! reader replays exactly; the data never depends on the parallelism.

mod model;
mod reader;

pub use model::{climate_c, mix, position, reading};
pub use reader::GeneratorReader;

use caudal::{Error, Result, Source, SourceContext, SourceReader};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A raw reading, as a temperature sensor reports it (the Avro record of `schemas/`).
pub use caudal_schemas::SensorReading;

/// 2026-01-01T00:00:00Z: event time of the first reading of a bounded run.
pub const DEFAULT_BOUNDED_START_MS: i64 = 1_767_225_600_000;

/// Configuration of the sensor generator.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeneratorConfig {
    /// Number of sensors (at least 1).
    pub sensors: u64,
    /// Readings per sensor per second of wall-clock time; 0 = as fast as possible.
    /// Event time always advances by `1000 / rate` ms per reading (1000 ms when 0).
    pub rate: f64,
    /// Total readings over all sensors (bounded run); `None` = unbounded.
    pub records: Option<u64>,
    /// Seed: the same seed gives the same readings.
    pub seed: u64,
    /// Fraction of readings that are sensor faults (impossible values), in [0, 1].
    pub faulty_fraction: f64,
    /// Number of shards (at most `sensors`); the unit of parallelism and replay.
    pub splits: u32,
    /// Event time of the first reading; `None`: 2026-01-01 for bounded runs, now otherwise.
    pub start_ms: Option<i64>,
    /// Event time between two readings of a sensor; `None`: `1000 / rate` ms (1000 when
    /// unthrottled). Set it to keep the same data at another wall-clock rate.
    pub event_interval_ms: Option<i64>,
}

impl Default for GeneratorConfig {
    fn default() -> Self {
        GeneratorConfig {
            sensors: 5,
            rate: 1.0,
            records: None,
            seed: 42,
            faulty_fraction: 0.01,
            splits: 8,
            start_ms: None,
            event_interval_ms: None,
        }
    }
}

impl GeneratorConfig {
    /// Validate and build the source.
    pub fn build(self) -> Result<SensorGenerator> {
        if self.sensors == 0 {
            return Err(Error::config("sensors", "must be at least 1"));
        }
        if !self.rate.is_finite() || self.rate < 0.0 {
            return Err(Error::config(
                "rate",
                format!("must be 0 (unthrottled) or positive, got {}", self.rate),
            ));
        }
        if !(0.0..=1.0).contains(&self.faulty_fraction) {
            return Err(Error::config("faulty_fraction", "must be between 0 and 1"));
        }
        if self.splits == 0 {
            return Err(Error::config("splits", "must be at least 1"));
        }
        let splits = u64::from(self.splits).min(self.sensors) as u32;
        if self.event_interval_ms.is_some_and(|i| i < 1) {
            return Err(Error::config("event_interval_ms", "must be at least 1"));
        }
        let interval_ms = self.event_interval_ms.unwrap_or(if self.rate > 0.0 {
            ((1000.0 / self.rate) as i64).max(1)
        } else {
            1000
        });
        let start_ms = self.start_ms.unwrap_or_else(|| {
            if self.records.is_some() || self.rate == 0.0 {
                DEFAULT_BOUNDED_START_MS
            } else {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis() as i64)
                    .unwrap_or(DEFAULT_BOUNDED_START_MS);
                now - now.rem_euclid(1000)
            }
        });
        Ok(SensorGenerator { config: self, splits, interval_ms, start_ms })
    }
}

/// The generator source (build it with [`GeneratorConfig::build`]).
#[derive(Debug, Clone)]
pub struct SensorGenerator {
    config: GeneratorConfig,
    splits: u32,
    interval_ms: i64,
    start_ms: i64,
}

/// The checkpointed position of a generator reader: next sequence number per split.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GeneratorPosition {
    /// Event time of round 0 (fixed for the job's lifetime).
    pub start_ms: i64,
    /// (split, next sequence number).
    pub splits: Vec<(u32, u64)>,
}

impl SensorGenerator {
    /// The number of splits.
    pub fn splits(&self) -> u32 {
        self.splits
    }

    /// Event time of round 0.
    pub fn start_ms(&self) -> i64 {
        self.start_ms
    }

    /// Records split `k` emits in a bounded run: its share of the first `records` readings
    /// in round-major order (round 0 of every sensor, then round 1, ...), so every sensor
    /// gets the same number of readings, give or take one.
    pub fn split_records(&self, k: u32) -> Option<u64> {
        self.config.records.map(|r| {
            let (s, k) = (u64::from(self.splits), u64::from(k));
            let full_rounds = r / self.config.sensors;
            let rem = r % self.config.sensors;
            let partial = if rem > k { (rem - k).div_ceil(s) } else { 0 };
            full_rounds * self.split_sensors(k as u32) + partial
        })
    }

    /// Sensors owned by split `k`.
    pub fn split_sensors(&self, k: u32) -> u64 {
        let s = u64::from(self.splits);
        (self.config.sensors - u64::from(k)).div_ceil(s)
    }

    /// How long between two readings of a sensor, in wall-clock time (zero: unthrottled).
    pub fn pacing(&self) -> Duration {
        if self.config.rate > 0.0 {
            Duration::from_secs_f64(1.0 / self.config.rate)
        } else {
            Duration::ZERO
        }
    }

    /// The n-th record of split `k`.
    #[inline]
    pub fn record(&self, k: u32, n: u64, sensors_in_split: u64) -> SensorReading {
        let round = n / sensors_in_split;
        let sensor = u64::from(k) + (n % sensors_in_split) * u64::from(self.splits);
        let ts = self.start_ms + round as i64 * self.interval_ms;
        reading(self.config.seed, sensor, round, ts, self.config.faulty_fraction)
    }
}

impl Source for SensorGenerator {
    type Out = SensorReading;

    fn create_reader(
        &self,
        ctx: &SourceContext,
        restored: &[Vec<u8>],
    ) -> Result<Box<dyn SourceReader<SensorReading>>> {
        let mut positions = Vec::new();
        let mut start_ms = self.start_ms;
        for blob in restored {
            let p: GeneratorPosition = serde_json::from_slice(blob)
                .map_err(|e| Error::Operator(format!("generator: corrupt checkpointed position: {e}")))?;
            start_ms = p.start_ms;
            positions.extend(p.splits);
        }
        let mut generator = self.clone();
        generator.start_ms = start_ms;
        Ok(Box::new(GeneratorReader::new(generator, ctx.subtask, ctx.parallelism, &positions)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_runs_give_every_sensor_its_share() {
        for (sensors, splits, records) in [(50u64, 8u32, 30_000u64), (7, 3, 100), (5, 8, 12), (1000, 8, 999)]
        {
            let g =
                GeneratorConfig { sensors, splits, records: Some(records), rate: 0.0, ..Default::default() }
                    .build()
                    .unwrap();
            let total: u64 = (0..g.splits()).map(|k| g.split_records(k).unwrap()).sum();
            assert_eq!(total, records);
            let mut per_sensor = std::collections::BTreeMap::new();
            for k in 0..g.splits() {
                for n in 0..g.split_records(k).unwrap() {
                    *per_sensor.entry(g.record(k, n, g.split_sensors(k)).sensor_id).or_insert(0u64) += 1;
                }
            }
            let (min, max) = (per_sensor.values().min().unwrap(), per_sensor.values().max().unwrap());
            assert!(max - min <= 1, "{sensors} sensors, {splits} splits: {min}..{max}");
        }
    }

    #[test]
    fn bad_configuration_names_the_setting() {
        let err = GeneratorConfig { sensors: 0, ..Default::default() }.build().unwrap_err().to_string();
        assert!(err.contains("sensors"), "{err}");
        let err = GeneratorConfig { rate: -1.0, ..Default::default() }.build().unwrap_err().to_string();
        assert!(err.contains("rate"), "{err}");
    }
}

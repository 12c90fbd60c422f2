//! The sensor generator: the stand-in for the reference architecture's Kafka Connect
//! temperature connector.
//!
//! `sensors` sensors, each at a fixed latitude/longitude, emit `rate` readings per second
//! (0 = as fast as possible) in °F. The sensors are divided into `splits` shards; split `k`
//! owns the sensors `s` with `s % splits == k`, and its n-th record is a pure function of
//! (seed, k, n). The position of a split is that sequence number `n`, so a restored
//! reader replays exactly; the data never depends on the parallelism.

mod cursor;
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
    /// Sensors that go quiet: their readings in these stretches of event time are not
    /// emitted (the rest of the data is unchanged).
    #[serde(default)]
    pub outages: Vec<Outage>,
}

/// A sensor's silence: no reading with event time in `[start + from_ms, start + to_ms)`,
/// where `start` is the event time of the first reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outage {
    /// The sensor.
    pub sensor: u64,
    /// Start of the silence, ms of event time after the first reading.
    pub from_ms: i64,
    /// End of the silence (exclusive).
    pub to_ms: i64,
}

impl std::str::FromStr for Outage {
    type Err = String;

    /// `SENSOR:FROM_SECS:TO_SECS` (seconds of event time from the start, decimals allowed).
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let bad = || format!("`{s}`: expected SENSOR:FROM_SECS:TO_SECS, e.g. 3:60:180");
        let parts: Vec<&str> = s.split(':').collect();
        let [sensor, from, to] = parts.as_slice() else { return Err(bad()) };
        let sensor: u64 = sensor.trim().parse().map_err(|_| bad())?;
        let secs = |v: &str| -> std::result::Result<i64, String> {
            let f: f64 = v.trim().parse().map_err(|_| bad())?;
            if !f.is_finite() || f < 0.0 {
                return Err(format!("`{s}`: times must be seconds >= 0"));
            }
            Ok((f * 1000.0).round() as i64)
        };
        let (from_ms, to_ms) = (secs(from)?, secs(to)?);
        if from_ms >= to_ms {
            return Err(format!("`{s}`: the outage must end after it starts"));
        }
        Ok(Outage { sensor, from_ms, to_ms })
    }
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
            outages: Vec::new(),
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
        if let Some(o) = self.outages.iter().find(|o| o.sensor >= self.sensors) {
            return Err(Error::config(
                "outages",
                format!(
                    "sensor {} is not one of the {} sensors (0..{})",
                    o.sensor, self.sensors, self.sensors
                ),
            ));
        }
        if let Some(o) = self.outages.iter().find(|o| o.from_ms < 0 || o.from_ms >= o.to_ms) {
            return Err(Error::config(
                "outages",
                format!("{o:?} must start at 0 or later and end after it starts"),
            ));
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

    /// The n-th record of split `k`, `None` when its sensor is in an outage then.
    #[inline]
    pub fn emitted(&self, k: u32, n: u64, sensors_in_split: u64) -> Option<SensorReading> {
        let r = self.record(k, n, sensors_in_split);
        (!self.silenced(&r)).then_some(r)
    }

    /// The n-th record of split `k` (whether or not an outage silences it).
    #[inline]
    pub fn record(&self, k: u32, n: u64, sensors_in_split: u64) -> SensorReading {
        let round = n / sensors_in_split;
        let sensor = self.sensor_of(u64::from(k), n % sensors_in_split);
        reading(self.config.seed, sensor, round, self.round_ts(round), self.config.faulty_fraction)
    }

    /// The sensor at `slot` of a round of split `split`.
    #[inline]
    fn sensor_of(&self, split: u64, slot: u64) -> u64 {
        split + slot * u64::from(self.splits)
    }

    /// Event time of round `round`.
    #[inline]
    fn round_ts(&self, round: u64) -> i64 {
        self.start_ms + round as i64 * self.interval_ms
    }

    /// Whether an outage silences reading `r`.
    #[inline]
    fn silenced(&self, r: &SensorReading) -> bool {
        self.config.outages.iter().any(|o| {
            o.sensor == r.sensor_id as u64
                && (self.start_ms + o.from_ms..self.start_ms + o.to_ms).contains(&r.ts)
        })
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
                .map_err(|e| Error::CorruptState(format!("generator: corrupt checkpointed position: {e}")))?;
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

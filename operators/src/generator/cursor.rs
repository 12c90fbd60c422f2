//! A split's walk through its readings: round and slot kept as counters, so a reading costs
//! no division, and the split's sensors' positions computed once instead of per reading.
//! It yields exactly what [`SensorGenerator::emitted`] gives for each sequence number.

use super::model::{position, reading_at};
use super::{SensorGenerator, SensorReading};

/// Positions kept per split, at most (16 bytes each: 16 MiB); sensors past them have theirs
/// computed per reading.
const MAX_KEPT_POSITIONS: u64 = 1 << 20;

/// Where a split is: the round and slot (the sensor's place in a round) of its next reading.
pub(crate) struct SplitCursor {
    split: u64,
    sensors: u64,
    round: u64,
    slot: u64,
    /// The positions of the split's first sensors, by slot.
    positions: Vec<(f64, f64)>,
}

impl SplitCursor {
    /// The cursor of split `k` of `generator` at sequence number `next`.
    pub(crate) fn new(generator: &SensorGenerator, k: u32, next: u64) -> Self {
        let sensors = generator.split_sensors(k);
        let split = u64::from(k);
        let seed = generator.config.seed;
        let positions = (0..sensors.min(MAX_KEPT_POSITIONS))
            .map(|slot| position(seed, generator.sensor_of(split, slot)))
            .collect();
        SplitCursor { split, sensors, round: next / sensors, slot: next % sensors, positions }
    }

    /// The split's sensors: readings in a round.
    pub(crate) fn sensors(&self) -> u64 {
        self.sensors
    }

    /// Readings left in the current round, the one at the cursor included.
    pub(crate) fn left_in_round(&self) -> u64 {
        self.sensors - self.slot
    }

    /// The reading at the cursor (`None` when an outage silences it); the cursor moves on.
    #[inline]
    pub(crate) fn next(&mut self, generator: &SensorGenerator) -> Option<SensorReading> {
        let sensor = generator.sensor_of(self.split, self.slot);
        let seed = generator.config.seed;
        let position = match self.positions.get(self.slot as usize) {
            Some(&p) => p,
            None => position(seed, sensor),
        };
        let ts = generator.round_ts(self.round);
        let r = reading_at(seed, sensor, position, self.round, ts, generator.config.faulty_fraction);
        self.slot += 1;
        if self.slot == self.sensors {
            self.slot = 0;
            self.round += 1;
        }
        (!generator.silenced(&r)).then_some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generator::{GeneratorConfig, Outage};

    #[test]
    fn the_cursor_yields_what_emitted_gives_from_any_start() {
        let outages = vec![Outage { sensor: 3, from_ms: 2_000, to_ms: 9_000 }];
        for (sensors, splits) in [(50u64, 8u32), (7, 3), (5, 8), (1, 1)] {
            let config = GeneratorConfig {
                sensors,
                splits,
                rate: 0.0,
                outages: outages.clone(),
                ..Default::default()
            };
            let Ok(g) = config.build() else { continue };
            for k in 0..g.splits() {
                let per_split = g.split_sensors(k);
                for start in [0, 1, per_split - 1, per_split, 3 * per_split + 1] {
                    let mut cursor = SplitCursor::new(&g, k, start);
                    for n in start..start + 4 * per_split + 3 {
                        assert_eq!(
                            cursor.next(&g),
                            g.emitted(k, n, per_split),
                            "{sensors}/{splits} k={k} n={n}"
                        );
                    }
                }
            }
        }
    }
}

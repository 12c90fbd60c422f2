//! A split's walk through its readings: round and slot kept as counters, so a reading costs
//! no division, the split's sensors' sites worked out once instead of per reading, and a
//! round's share of the model once per round. It yields exactly what
//! [`SensorGenerator::emitted`] gives for each sequence number.

use super::model::{reading_at, Round, Site};
use super::{SensorGenerator, SensorReading};

/// Sites kept per split, at most (32 bytes each: 32 MiB); sensors past them have theirs
/// worked out per reading.
const MAX_KEPT_SITES: u64 = 1 << 20;

/// Where a split is: the round and slot (the sensor's place in a round) of its next reading.
pub(crate) struct SplitCursor {
    split: u64,
    sensors: u64,
    /// The current round, worked out.
    round: Round,
    slot: u64,
    /// The sites of the split's first sensors, by slot.
    sites: Vec<Site>,
}

impl SplitCursor {
    /// The cursor of split `k` of `generator` at sequence number `next`.
    pub(crate) fn new(generator: &SensorGenerator, k: u32, next: u64) -> Self {
        let sensors = generator.split_sensors(k);
        let split = u64::from(k);
        let seed = generator.config.seed;
        let sites = (0..sensors.min(MAX_KEPT_SITES))
            .map(|slot| Site::of(seed, generator.sensor_of(split, slot)))
            .collect();
        let round = next / sensors;
        SplitCursor {
            split,
            sensors,
            round: Round::of(round, generator.round_ts(round)),
            slot: next % sensors,
            sites,
        }
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
        let faulty_fraction = generator.config.faulty_fraction;
        let r = match self.sites.get(self.slot as usize) {
            Some(site) => reading_at(seed, sensor, site, &self.round, faulty_fraction),
            None => reading_at(seed, sensor, &Site::of(seed, sensor), &self.round, faulty_fraction),
        };
        self.slot += 1;
        if self.slot == self.sensors {
            self.slot = 0;
            let round = self.round.number() + 1;
            self.round = Round::of(round, generator.round_ts(round));
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

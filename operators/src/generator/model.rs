//! The temperature model: a deterministic function of (seed, sensor, reading index).
//!
//! Temperature follows the sensor's local solar time (from its longitude) and its distance
//! from the equator, plus noise; a configurable fraction of readings are physically
//! impossible (sensor faults) for the anomaly filter to drop.

use super::SensorReading;

/// SplitMix64: a strong 64-bit mix, so readings are a pure function of their coordinates.
#[inline]
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[inline]
fn unit(seed: u64, a: u64, b: u64, salt: u64) -> f64 {
    unit_keyed(seed, a, mix(b ^ mix(salt)))
}

/// [`unit`] with its innermost mix (of `b` and the salt) done: the part a round's readings
/// share.
#[inline]
fn unit_keyed(seed: u64, a: u64, b_key: u64) -> f64 {
    let h = mix(seed ^ mix(a ^ b_key));
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// A sensor's fixed position: latitude in [-60, 70), longitude in [-180, 180).
pub fn position(seed: u64, sensor: u64) -> (f64, f64) {
    let lat = -60.0 + 130.0 * unit(seed, sensor, 0, 1);
    let lon = -180.0 + 360.0 * unit(seed, sensor, 0, 2);
    (lat, lon)
}

/// The true temperature in °C at `lat`/`lon` at UTC time `ts` (ms), without noise.
pub fn climate_c(lat: f64, lon: f64, ts: i64) -> f64 {
    Site::at(lat, lon).climate_c(utc_hours(ts))
}

/// The hours since midnight UTC at `ts` (ms).
#[inline]
fn utc_hours(ts: i64) -> f64 {
    (ts.rem_euclid(86_400_000)) as f64 / 3_600_000.0
}

/// What the model needs of a sensor's position, worked out once per sensor.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Site {
    lat: f64,
    lon: f64,
    /// Local solar time's offset from UTC, hours.
    lon_hours: f64,
    /// The daily mean temperature, °C.
    base: f64,
}

impl Site {
    pub(crate) fn of(seed: u64, sensor: u64) -> Self {
        let (lat, lon) = position(seed, sensor);
        Site::at(lat, lon)
    }

    fn at(lat: f64, lon: f64) -> Self {
        Site { lat, lon, lon_hours: lon / 15.0, base: 28.0 - 0.45 * lat.abs() }
    }

    #[inline]
    fn climate_c(&self, utc_hours: f64) -> f64 {
        let local = hours_of_day(utc_hours + self.lon_hours);
        let diurnal = 6.0 * (std::f64::consts::TAU * (local - 15.0) / 24.0).cos();
        self.base + diurnal
    }
}

/// What the model needs of a round (its number and time), worked out once per round: the
/// round's part of each random draw, and the time of day.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Round {
    round: u64,
    ts: i64,
    utc_hours: f64,
    faulty: u64,
    faulty_low: u64,
    noise: [u64; 2],
}

impl Round {
    pub(crate) fn of(round: u64, ts: i64) -> Self {
        let key = |salt: u64| mix(round ^ mix(salt));
        Round {
            round,
            ts,
            utc_hours: utc_hours(ts),
            faulty: key(3),
            faulty_low: key(4),
            noise: [key(5), key(6)],
        }
    }

    pub(crate) fn number(&self) -> u64 {
        self.round
    }
}

/// `hours.rem_euclid(24.0)`, to the bit, without the `fmod` call for the hours a local
/// time can be (UTC hours plus a longitude's offset: -12 to 36); others take `rem_euclid`.
#[inline]
fn hours_of_day(hours: f64) -> f64 {
    if (0.0..24.0).contains(&hours) {
        hours
    } else if (24.0..48.0).contains(&hours) {
        // Exact (Sterbenz), as fmod's result is.
        hours - 24.0
    } else if hours > -24.0 && hours < 0.0 {
        // fmod leaves it as it is; rem_euclid then adds 24 (-24 itself gives -0: not here).
        hours + 24.0
    } else {
        hours.rem_euclid(24.0)
    }
}

/// The reading of `sensor` number `round` at time `ts`.
#[inline]
pub fn reading(seed: u64, sensor: u64, round: u64, ts: i64, faulty_fraction: f64) -> SensorReading {
    reading_at(seed, sensor, &Site::of(seed, sensor), &Round::of(round, ts), faulty_fraction)
}

/// [`reading`] of a sensor whose [`Site`] and round are worked out (to the same bits).
///
/// Always inlined into the generator's loop. As a call it returned the reading through
/// memory, which the caller copied on with 16-byte loads across the callee's 8-byte stores
/// (a load that waits for those stores to reach the cache): the generator's thread ran 16
/// instructions a reading more (callgrind, 334 against 318).
#[inline(always)]
pub(crate) fn reading_at(
    seed: u64,
    sensor: u64,
    site: &Site,
    round: &Round,
    faulty_fraction: f64,
) -> SensorReading {
    let faulty = faulty_fraction > 0.0 && unit_keyed(seed, sensor, round.faulty) < faulty_fraction;
    let temp_f = if faulty {
        // Impossible readings: below absolute zero or far above any weather on Earth.
        if unit_keyed(seed, sensor, round.faulty_low) < 0.5 {
            -500.0
        } else {
            400.0
        }
    } else {
        // Noise in [-1.5, 1.5) °C: the mean of two uniforms, centred.
        let [a, b] = round.noise;
        let noise = 1.5 * (unit_keyed(seed, sensor, a) + unit_keyed(seed, sensor, b) - 1.0);
        let c = site.climate_c(round.utc_hours) + noise;
        c * 9.0 / 5.0 + 32.0
    };
    SensorReading { sensor_id: sensor as i64, ts: round.ts, lat: site.lat, lon: site.lon, temp_f }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_are_deterministic_for_a_seed() {
        assert_eq!(reading(7, 3, 10, 1_000, 0.1), reading(7, 3, 10, 1_000, 0.1));
        assert_ne!(reading(7, 3, 10, 1_000, 0.0).temp_f, reading(8, 3, 10, 1_000, 0.0).temp_f);
    }

    /// Readings written out to the bit: the data is what the tests' oracles, the demo and
    /// the benchmarks' Flink port (`SensorModel.java`) rely on, so a change to how the model
    /// is worked out (e.g. what is computed once per sensor or round) must not move any of it.
    #[test]
    fn golden_readings() {
        let start = 1_767_225_600_000i64;
        let at = |seed, sensor, round: u64, interval: i64, faulty| {
            reading(seed, sensor, round, start + round as i64 * interval, faulty)
        };
        let golden = [
            (0u64, 0u64, 0xc036_8911_d3b4_31be_u64, 0x405b_901c_92c4_62d0_u64, 0x404d_dfcf_3942_b55f_u64),
            (7, 3, 0xc03e_c4da_92d2_d0ff, 0xbff6_1a2e_f993_1780, 0x4049_2a87_7c60_f3c2),
            (9_999, 41, 0xc04a_10a2_7b6a_d021, 0x404b_1d7a_5e54_5744, 0x403e_2cc4_9158_9446),
            (123_456, 86_399, 0x4045_b546_3514_3192, 0xc065_e368_55b5_c9b0, 0x404b_2322_0698_0bc8),
            (3, 1_000_000, 0xc035_ed6f_8ae0_a554, 0xc04a_51bb_4813_9b9a, 0x4051_53ff_2fd7_c1f2),
        ];
        for (sensor, round, lat, lon, temp_f) in golden {
            let r = at(42, sensor, round, 1000, 0.01);
            assert_eq!(
                (r.lat.to_bits(), r.lon.to_bits(), r.temp_f.to_bits()),
                (lat, lon, temp_f),
                "sensor {sensor} round {round}: {r:?}"
            );
        }
        let faults: Vec<u64> = (0..100_000u64)
            .filter(
                |i| matches!(at(42, i % 1000, i / 1000, 1000, 0.01).temp_f, t if t == 400.0 || t == -500.0),
            )
            .collect();
        assert_eq!(faults.len(), 997);
        assert_eq!(faults.iter().fold(0u64, |h, f| mix(h ^ f)), 0xcda0_b67e_53a4_d650);
        let all = (0..200_000u64)
            .fold(0u64, |h, i| mix(h ^ at(7, i % 10_000, i / 10_000, 100, 0.05).temp_f.to_bits()));
        assert_eq!(all, 0x0858_a623_bcdd_9092);
    }

    #[test]
    fn hours_of_day_is_rem_euclid_to_the_bit() {
        let edges =
            [-48.0, -24.0, -23.999_999_999, -12.0, -1e-300, -0.0, 0.0, 1e-300, 12.5, 23.999_999_999_999_996];
        let more = [24.0, 24.000_000_000_000_004, 35.99, 47.999, 48.0, 100.0, f64::NAN, f64::INFINITY];
        let spread = (0..100_000).map(|i| -30.0 + 80.0 * unit(9, i, 0, 7));
        for h in edges.into_iter().chain(more).chain(spread) {
            let (got, want) = (hours_of_day(h), h.rem_euclid(24.0));
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{h}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn warmer_at_the_equator_and_in_the_afternoon() {
        let noon_utc = 12 * 3_600_000;
        assert!(climate_c(0.0, 45.0, noon_utc) > climate_c(60.0, 45.0, noon_utc));
        // lon 0: 15:00 local is the warmest, 03:00 the coldest.
        assert!(climate_c(10.0, 0.0, 15 * 3_600_000) > climate_c(10.0, 0.0, 3 * 3_600_000));
    }

    #[test]
    fn faulty_fraction_is_respected_and_faults_are_impossible() {
        let n = 100_000u64;
        let faulty = (0..n)
            .map(|r| reading(1, r % 100, r / 100, 0, 0.05))
            .filter(|r| {
                let c = (r.temp_f - 32.0) * 5.0 / 9.0;
                c <= -50.0 || c >= 60.0
            })
            .count() as f64;
        assert!((faulty / n as f64 - 0.05).abs() < 0.005, "{faulty}");
    }

    #[test]
    fn healthy_readings_are_plausible() {
        for r in 0..10_000u64 {
            let x = reading(3, r % 1000, r / 1000, (r as i64) * 1000, 0.0);
            let c = (x.temp_f - 32.0) * 5.0 / 9.0;
            assert!(c > -20.0 && c < 40.0, "{x:?}");
        }
    }
}

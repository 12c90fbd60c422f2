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
    let h = mix(seed ^ mix(a ^ mix(b ^ mix(salt))));
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
    let utc_hours = (ts.rem_euclid(86_400_000)) as f64 / 3_600_000.0;
    let local = hours_of_day(utc_hours + lon / 15.0);
    let base = 28.0 - 0.45 * lat.abs();
    let diurnal = 6.0 * (std::f64::consts::TAU * (local - 15.0) / 24.0).cos();
    base + diurnal
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
    reading_at(seed, sensor, position(seed, sensor), round, ts, faulty_fraction)
}

/// [`reading`] of a sensor whose [`position`] is known.
#[inline]
pub(crate) fn reading_at(
    seed: u64,
    sensor: u64,
    (lat, lon): (f64, f64),
    round: u64,
    ts: i64,
    faulty_fraction: f64,
) -> SensorReading {
    let faulty = faulty_fraction > 0.0 && unit(seed, sensor, round, 3) < faulty_fraction;
    let temp_f = if faulty {
        // Impossible readings: below absolute zero or far above any weather on Earth.
        if unit(seed, sensor, round, 4) < 0.5 {
            -500.0
        } else {
            400.0
        }
    } else {
        // Noise in [-1.5, 1.5) °C: the mean of two uniforms, centred.
        let noise = 1.5 * (unit(seed, sensor, round, 5) + unit(seed, sensor, round, 6) - 1.0);
        let c = climate_c(lat, lon, ts) + noise;
        c * 9.0 / 5.0 + 32.0
    };
    SensorReading { sensor_id: sensor as i64, ts, lat, lon, temp_f }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_are_deterministic_for_a_seed() {
        assert_eq!(reading(7, 3, 10, 1_000, 0.1), reading(7, 3, 10, 1_000, 0.1));
        assert_ne!(reading(7, 3, 10, 1_000, 0.0).temp_f, reading(8, 3, 10, 1_000, 0.0).temp_f);
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

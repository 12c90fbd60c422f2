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
    let local = (utc_hours + lon / 15.0).rem_euclid(24.0);
    let base = 28.0 - 0.45 * lat.abs();
    let diurnal = 6.0 * (std::f64::consts::TAU * (local - 15.0) / 24.0).cos();
    base + diurnal
}

/// The reading of `sensor` number `round` at time `ts`.
#[inline]
pub fn reading(seed: u64, sensor: u64, round: u64, ts: i64, faulty_fraction: f64) -> SensorReading {
    let (lat, lon) = position(seed, sensor);
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

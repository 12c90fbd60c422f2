//! The temperature job's output computed from the generator's model alone: no `StreamEnv`,
//! no operator code. What the tests compare a killed, restored, rescaled run with is what
//! the input implies, not another run of the engine.
//!
//! The generator's first `records` readings, in round-major order (round 0 of every
//! sensor, then round 1, …), each converted to °C, the impossible ones (−50 < °C < 60 fails)
//! dropped; per sensor and tumbling window of event time: count, min, max and mean, the sum
//! taken in event-time order (each sensor's readings reach its window in that order).
//! Readings in an outage (`--outage`) are not emitted; the silent-sensor alerts follow from
//! the outages alone: one `SILENT` and one `RECOVERED` per outage longer than the silence.

use caudal_operators::generator::{reading, DEFAULT_BOUNDED_START_MS};
use caudal_schemas::{AlertKind, ProcessedReading, SensorAlert, WindowStats};
use std::collections::BTreeMap;

/// The flags of the bounded, throttled run the process-level tests share (jobs/tests and
/// tests/tests): 20 sensors, 6,000 readings at 1,500/s (~4 s) with seed 11 over 6 splits,
/// 1-second windows of event time, checkpoints every 300 ms, no progress line. Its model is
/// [`Model::RUN`] plus the run's outages.
pub const RUN_ARGS: [&str; 18] = [
    "--sensors",
    "20",
    "--records",
    "6000",
    "--rate",
    "75",
    "--event-interval-ms",
    "100",
    "--window-secs",
    "1",
    "--seed",
    "11",
    "--splits",
    "6",
    "--checkpoint-interval",
    "0.3",
    "--progress-secs",
    "0",
];

/// The generator's settings of a run (`--sensors`, `--records`, `--seed`,
/// `--event-interval-ms`, `--faulty-fraction`) and the window length.
#[derive(Debug, Clone, Copy)]
pub struct Model {
    pub sensors: u64,
    pub records: u64,
    pub seed: u64,
    pub interval_ms: i64,
    pub faulty_fraction: f64,
    pub window_ms: i64,
    /// `--outage` flags as (sensor, from ms, to ms) of event time after the first reading.
    pub outages: &'static [(u64, i64, i64)],
    /// `--silence-secs` in ms (`None`: no alerts).
    pub silence_ms: Option<i64>,
    /// The changes of `--limits-file` (none: the fixed −50 < °C < 60).
    pub limits: &'static [Limit],
    /// The `sensors` table of `--sensor-metadata`: (sensor_id, site, name); a sensor not in
    /// it (or no table) has an empty site and name.
    pub sites: &'static [(i64, &'static str, &'static str)],
}

/// One line of a limits file: band, latitude range, °C bounds, in force from this many ms
/// of event time after the first reading (`None`: from the beginning).
#[derive(Debug, Clone, Copy)]
pub struct Limit {
    pub band: &'static str,
    pub lat: (f64, f64),
    pub celsius: (f64, f64),
    pub from_ms: Option<i64>,
}

// Not every test binary that includes this module writes limits files.
#[allow(dead_code)]
impl Limit {
    /// The line as the limits file has it.
    pub fn json(&self) -> String {
        let from = self
            .from_ms
            .map_or(String::new(), |ms| format!(r#","from_ts":{}"#, DEFAULT_BOUNDED_START_MS + ms));
        format!(
            r#"{{"band":"{}","lat_min":{},"lat_max":{},"min_c":{},"max_c":{}{from}}}"#,
            self.band, self.lat.0, self.lat.1, self.celsius.0, self.celsius.1
        )
    }
}

impl Model {
    /// Whether `temp_c` at `lat` and event time `ts` passes the anomaly filter: the bounds
    /// of the first band (by name) whose latest change in force at `ts` covers `lat`.
    fn plausible(&self, lat: f64, ts: i64, temp_c: f64) -> bool {
        let t = ts - DEFAULT_BOUNDED_START_MS;
        let mut bands: Vec<&str> = self.limits.iter().map(|l| l.band).collect();
        bands.sort_unstable();
        bands.dedup();
        let mut bounds = (-50.0, 60.0);
        for band in bands {
            let mut in_force: Option<&Limit> = None;
            for l in self.limits.iter().filter(|l| l.band == band) {
                let from = l.from_ms.unwrap_or(i64::MIN);
                if from <= t && in_force.is_none_or(|f| f.from_ms.unwrap_or(i64::MIN) <= from) {
                    in_force = Some(l);
                }
            }
            if let Some(l) = in_force.filter(|l| l.lat.0 <= lat && lat < l.lat.1) {
                bounds = l.celsius;
                break;
            }
        }
        temp_c > bounds.0 && temp_c < bounds.1
    }
}

impl Model {
    /// The model of [`RUN_ARGS`], without outages or alerts.
    pub const RUN: Model = Model {
        sensors: 20,
        records: 6000,
        seed: 11,
        interval_ms: 100,
        faulty_fraction: 0.01,
        window_ms: 1000,
        outages: &[],
        silence_ms: None,
        limits: &[],
        sites: &[],
    };

    /// The site and name of `sensor` in [`Model::sites`] (empty when not there).
    fn site_of(&self, sensor: i64) -> (String, String) {
        self.sites
            .iter()
            .find(|s| s.0 == sensor)
            .map_or((String::new(), String::new()), |s| (s.1.to_string(), s.2.to_string()))
    }

    fn silenced(&self, sensor: u64, ts: i64) -> bool {
        let t = ts - DEFAULT_BOUNDED_START_MS;
        self.outages.iter().any(|(s, from, to)| *s == sensor && (*from..*to).contains(&t))
    }

    /// Event times of every reading `sensor` has in the input, outages ignored.
    fn rounds(&self, sensor: u64) -> impl Iterator<Item = i64> + '_ {
        let rounds = self.records / self.sensors + u64::from(sensor < self.records % self.sensors);
        (0..rounds).map(|r| DEFAULT_BOUNDED_START_MS + r as i64 * self.interval_ms)
    }
}

/// The alerts the outages imply, as JSON lines, sorted: for each outage of a sensor, its
/// last reading before and its first after; a gap longer than the silence makes one
/// `SILENT` (last + silence) and one `RECOVERED` (the first after). Outages must lie inside
/// the input with readings on both sides, and not touch each other.
pub fn expected_alerts(m: &Model) -> Vec<String> {
    let mut lines: Vec<String> =
        expected_alert_records(m).iter().map(|a| serde_json::to_string(a).expect("JSON")).collect();
    lines.sort();
    lines
}

/// [`expected_alerts`] as records, in the order of the outages.
pub fn expected_alert_records(m: &Model) -> Vec<SensorAlert> {
    let Some(silence) = m.silence_ms else { return Vec::new() };
    let mut alerts = Vec::new();
    for &(sensor, from, to) in m.outages {
        let start = DEFAULT_BOUNDED_START_MS;
        let last =
            m.rounds(sensor).filter(|t| *t < start + from).last().expect("a reading before the outage");
        let first = m.rounds(sensor).find(|t| *t >= start + to).expect("a reading after the outage");
        assert!(
            !m.silenced(sensor, last) && !m.silenced(sensor, first),
            "outages of sensor {sensor} touch each other"
        );
        if first - last > silence {
            let alert = |kind, ts| SensorAlert { sensor_id: sensor as i64, kind, ts, last_seen: last };
            alerts.push(alert(AlertKind::Silent, last + silence));
            alerts.push(alert(AlertKind::Recovered, first));
        }
    }
    alerts
}

/// What the job publishes: windows and readings as JSON lines, each list sorted.
pub fn expected(m: &Model) -> (Vec<String>, Vec<String>) {
    let (windows, readings) = expected_records(m);
    let mut windows: Vec<String> =
        windows.iter().map(|w| serde_json::to_string(w).expect("a window is JSON")).collect();
    let mut readings: Vec<String> =
        readings.iter().map(|r| serde_json::to_string(r).expect("a reading is JSON")).collect();
    readings.sort();
    windows.sort();
    (windows, readings)
}

/// What the job publishes, as records (windows by sensor and start, readings in the
/// generator's order). Compare values through these, not through parsed JSON: serde_json's
/// default float parsing may be one unit in the last place off.
pub fn expected_records(m: &Model) -> (Vec<WindowStats>, Vec<ProcessedReading>) {
    let mut readings = Vec::new();
    // (sensor, window start) → (count, min, max, sum), in event-time order per sensor.
    let mut windows: BTreeMap<(i64, i64), (i64, f64, f64, f64)> = BTreeMap::new();
    for i in 0..m.records {
        let (sensor, round) = (i % m.sensors, i / m.sensors);
        let ts = DEFAULT_BOUNDED_START_MS + round as i64 * m.interval_ms;
        if m.silenced(sensor, ts) {
            continue;
        }
        let r = reading(m.seed, sensor, round, ts, m.faulty_fraction);
        let temp_c = (r.temp_f - 32.0) * 5.0 / 9.0;
        if !m.plausible(r.lat, ts, temp_c) {
            continue;
        }
        let p = ProcessedReading {
            sensor_id: r.sensor_id,
            ts,
            lat: r.lat,
            lon: r.lon,
            temp_c,
            temp_f: r.temp_f,
            site: m.site_of(r.sensor_id).0,
            name: m.site_of(r.sensor_id).1,
        };
        let start = ts - ts.rem_euclid(m.window_ms);
        let w = windows.entry((p.sensor_id, start)).or_insert((0, f64::INFINITY, f64::NEG_INFINITY, 0.0));
        w.0 += 1;
        w.1 = w.1.min(temp_c);
        w.2 = w.2.max(temp_c);
        w.3 += temp_c;
        readings.push(p);
    }
    let windows = windows
        .into_iter()
        .map(|((sensor_id, window_start), (count, min_c, max_c, sum))| WindowStats {
            sensor_id,
            window_start,
            window_end: window_start + m.window_ms,
            count,
            min_c,
            max_c,
            mean_c: sum / count as f64,
        })
        .collect();
    (windows, readings)
}

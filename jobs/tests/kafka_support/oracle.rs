//! What a Kafka-input run of the temperature job must publish, computed from its input
//! topic alone: read with a plain `read_committed` consumer, decoded with apache-avro (not
//! Caudal's codec), no engine code. Readings: each converted to °C, the impossible ones
//! (not −50 < °C < 60) dropped. Windows: per sensor and tumbling event-time window, count,
//! min, max and mean, the sum taken in event-time order (a sensor's readings sit in one
//! partition in that order). Alerts: per sensor, every gap between two consecutive readings
//! (faulty ones included) longer than the silence makes a `SILENT` at the first + silence
//! and a `RECOVERED` at the second.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use super::{read_committed, Stack};
use caudal_schemas::{ProcessedReading, SensorAlert, SensorReading, WindowStats};
use std::collections::BTreeMap;

/// A reading as compared: (sensor, ts, lat, lon, °C, °F), floats by their bits.
pub type ReadingKey = (i64, i64, u64, u64, u64, u64);

/// A window as compared: (sensor, start, end, count, min, max, mean), floats by their bits.
pub type WindowKey = (i64, i64, i64, i64, u64, u64, u64);

/// Avro payloads without their 5-byte Confluent header, decoded with apache-avro as `T`.
pub fn decode_all<T: caudal_schemas::AvroRecord>(payloads: impl Iterator<Item = Vec<u8>>) -> Vec<T> {
    let reader =
        apache_avro::reader::datum::GenericDatumReader::builder(T::schema()).build().expect("an Avro reader");
    payloads
        .map(|p| {
            let value = reader.read_value(&mut &p[..]).expect("an Avro record");
            apache_avro::from_value::<T>(&value).expect("a record of the schema")
        })
        .collect()
}

/// The payloads of framed records, their 5-byte Confluent header dropped.
fn payloads(records: &[(Vec<u8>, Vec<u8>)]) -> impl Iterator<Item = Vec<u8>> + '_ {
    records.iter().map(|(_, v)| v.get(5..).unwrap_or_default().to_vec())
}

/// The readings of published (key, Avro payload without its header) records, sorted.
pub fn readings_of(published: &[(Vec<u8>, Vec<u8>)]) -> Vec<ReadingKey> {
    let mut v: Vec<ReadingKey> = decode_all::<ProcessedReading>(published.iter().map(|(_, v)| v.clone()))
        .into_iter()
        .map(|r| {
            (r.sensor_id, r.ts, r.lat.to_bits(), r.lon.to_bits(), r.temp_c.to_bits(), r.temp_f.to_bits())
        })
        .collect();
    v.sort_unstable();
    v
}

/// The windows of published (key, Avro payload without its header) records, sorted.
pub fn windows_of(published: &[(Vec<u8>, Vec<u8>)]) -> Vec<WindowKey> {
    let mut v: Vec<WindowKey> = decode_all::<WindowStats>(published.iter().map(|(_, v)| v.clone()))
        .into_iter()
        .map(|w| {
            (
                w.sensor_id,
                w.window_start,
                w.window_end,
                w.count,
                w.min_c.to_bits(),
                w.max_c.to_bits(),
                w.mean_c.to_bits(),
            )
        })
        .collect();
    v.sort_unstable();
    v
}

/// The input topic's plausible readings in °C, in each sensor's order in the topic.
fn plausible(stack: &Stack, input: &str) -> Vec<ProcessedReading> {
    decode_all::<SensorReading>(payloads(&read_committed(stack, input)))
        .into_iter()
        .filter_map(|r| {
            let temp_c = (r.temp_f - 32.0) * 5.0 / 9.0;
            (temp_c > -50.0 && temp_c < 60.0).then_some(ProcessedReading {
                sensor_id: r.sensor_id,
                ts: r.ts,
                lat: r.lat,
                lon: r.lon,
                temp_c,
                temp_f: r.temp_f,
                site: String::new(),
                name: String::new(),
            })
        })
        .collect()
}

/// (readings, windows of `window_ms`) that the input topic implies, each sorted.
pub fn expected(stack: &Stack, input: &str, window_ms: i64) -> (Vec<ReadingKey>, Vec<WindowKey>) {
    let mut readings = plausible(stack, input);
    // Event-time order per sensor (stable: the topic's order among equal timestamps).
    readings.sort_by_key(|r| (r.sensor_id, r.ts));
    let mut windows: BTreeMap<(i64, i64), (i64, f64, f64, f64)> = BTreeMap::new();
    for r in &readings {
        let start = r.ts - r.ts.rem_euclid(window_ms);
        let w = windows.entry((r.sensor_id, start)).or_insert((0, f64::INFINITY, f64::NEG_INFINITY, 0.0));
        w.0 += 1;
        w.1 = w.1.min(r.temp_c);
        w.2 = w.2.max(r.temp_c);
        w.3 += r.temp_c;
    }
    let mut readings: Vec<ReadingKey> = readings
        .iter()
        .map(|r| {
            (r.sensor_id, r.ts, r.lat.to_bits(), r.lon.to_bits(), r.temp_c.to_bits(), r.temp_f.to_bits())
        })
        .collect();
    readings.sort_unstable();
    let windows = windows
        .into_iter()
        .map(|((sensor, start), (count, min, max, sum))| {
            (
                sensor,
                start,
                start + window_ms,
                count,
                min.to_bits(),
                max.to_bits(),
                (sum / count as f64).to_bits(),
            )
        })
        .collect();
    (readings, windows)
}

/// An alert as compared: (sensor, kind, ts, last seen).
pub type AlertKey = (i64, String, i64, i64);

/// The alerts of published (key, Avro payload without its header) records, sorted.
pub fn alerts_of(published: &[(Vec<u8>, Vec<u8>)]) -> Vec<AlertKey> {
    let mut v: Vec<AlertKey> = decode_all::<SensorAlert>(published.iter().map(|(_, v)| v.clone()))
        .into_iter()
        .map(|a| (a.sensor_id, a.kind.to_string(), a.ts, a.last_seen))
        .collect();
    v.sort_unstable();
    v
}

/// The silent-sensor alerts the input topic implies for a silence of `silence_ms`, sorted.
pub fn expected_alerts(stack: &Stack, input: &str, silence_ms: i64) -> Vec<AlertKey> {
    let mut times: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for r in decode_all::<SensorReading>(payloads(&read_committed(stack, input))) {
        times.entry(r.sensor_id).or_default().push(r.ts);
    }
    let mut alerts = Vec::new();
    for (sensor, mut ts) in times {
        ts.sort_unstable();
        for pair in ts.windows(2) {
            let (last, next) = (pair[0], pair[1]);
            if next - last > silence_ms {
                alerts.push((sensor, "SILENT".to_string(), last + silence_ms, last));
                alerts.push((sensor, "RECOVERED".to_string(), next, last));
            }
        }
    }
    alerts.sort_unstable();
    alerts
}

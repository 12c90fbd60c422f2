//! The `temperature` pipeline of the reference architecture:
//! generator → °F→°C → anomaly filter → key by sensor → 1-minute tumbling windows
//! (count, min, max, mean °C) → sink; the converted readings are a second output.

use caudal::{DataStream, Result, StreamEnv, WatermarkStrategy};
use caudal_operators::generator::{GeneratorConfig, SensorReading};
use caudal_operators::sinks::{DiscardSink, JsonFileSink, StdoutSink};
use caudal_operators::window::{AggregateFunction, KeyedWindowExt, WindowAssigner};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// A reading converted to Celsius.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessedReading {
    /// The sensor.
    pub sensor_id: u64,
    /// Event time, ms since the epoch.
    pub ts: i64,
    /// Latitude.
    pub lat: f64,
    /// Longitude.
    pub lon: f64,
    /// Temperature in °C.
    pub temp_c: f64,
    /// Temperature in °F, as read.
    pub temp_f: f64,
}

/// Per-sensor statistics of one window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowStats {
    /// The sensor.
    pub sensor_id: u64,
    /// Window start, ms since the epoch (inclusive).
    pub window_start: i64,
    /// Window end, ms since the epoch (exclusive).
    pub window_end: i64,
    /// Readings in the window.
    pub count: u64,
    /// Minimum °C.
    pub min_c: f64,
    /// Maximum °C.
    pub max_c: f64,
    /// Mean °C.
    pub mean_c: f64,
}

/// °F → °C.
pub fn to_celsius(r: SensorReading) -> ProcessedReading {
    ProcessedReading {
        sensor_id: r.sensor_id,
        ts: r.ts,
        lat: r.lat,
        lon: r.lon,
        temp_c: (r.temp_f - 32.0) * 5.0 / 9.0,
        temp_f: r.temp_f,
    }
}

/// The anomaly filter: keep −50 < °C < 60.
pub fn is_plausible(r: &ProcessedReading) -> bool {
    r.temp_c > -50.0 && r.temp_c < 60.0
}

/// count, min, max and sum of °C.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TempAcc {
    /// Readings.
    pub count: u64,
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
    /// Sum.
    pub sum: f64,
}

/// The window aggregate of the job.
#[derive(Debug, Clone, Copy, Default)]
pub struct TempStats;

impl AggregateFunction<ProcessedReading> for TempStats {
    type Acc = TempAcc;
    type Out = TempAcc;

    fn create(&self) -> TempAcc {
        TempAcc { count: 0, min: f64::INFINITY, max: f64::NEG_INFINITY, sum: 0.0 }
    }

    #[inline]
    fn add(&self, acc: &mut TempAcc, r: &ProcessedReading) {
        acc.count += 1;
        acc.min = acc.min.min(r.temp_c);
        acc.max = acc.max.max(r.temp_c);
        acc.sum += r.temp_c;
    }

    fn merge(&self, acc: &mut TempAcc, o: TempAcc) {
        acc.count += o.count;
        acc.min = acc.min.min(o.min);
        acc.max = acc.max.max(o.max);
        acc.sum += o.sum;
    }

    fn result(&self, acc: &TempAcc) -> TempAcc {
        *acc
    }
}

/// Where the job's two outputs go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkKind {
    /// `<output>/windows/part-N.jsonl` and `<output>/readings/part-N.jsonl`.
    File(PathBuf),
    /// JSON lines on stdout.
    Stdout,
    /// Count and drop (benchmarks).
    Discard,
}

/// The job's settings (from flags in the binary).
#[derive(Debug, Clone)]
pub struct TemperatureJob {
    /// The generator.
    pub generator: GeneratorConfig,
    /// The window length.
    pub window: Duration,
    /// Bounded out-of-orderness of the watermark.
    pub out_of_orderness: Duration,
    /// The sinks.
    pub sink: SinkKind,
}

/// Names of the job's operators (metrics, progress line, UI).
pub mod names {
    /// The generator source.
    pub const SOURCE: &str = "sensor-generator";
    /// °F → °C.
    pub const TO_CELSIUS: &str = "to-celsius";
    /// −50 < °C < 60.
    pub const ANOMALY_FILTER: &str = "anomaly-filter";
    /// The window operator.
    pub const WINDOWS: &str = "window-stats";
    /// Readings sink.
    pub const READINGS_SINK: &str = "readings-sink";
    /// Window statistics sink.
    pub const WINDOWS_SINK: &str = "windows-sink";
}

impl TemperatureJob {
    /// Add the pipeline to `env`.
    pub fn build(&self, env: &StreamEnv) -> Result<()> {
        let generator = self.generator.clone().build()?;
        let watermarks =
            WatermarkStrategy::bounded_out_of_orderness(self.out_of_orderness, |r: &SensorReading| r.ts)
                .with_idleness(Duration::from_secs(30));
        let readings = env
            .source(names::SOURCE, generator, watermarks)
            .map(to_celsius)
            .name(names::TO_CELSIUS)
            .filter(is_plausible)
            .name(names::ANOMALY_FILTER);
        let windows = readings
            .clone()
            .key_by(|r: &ProcessedReading| r.sensor_id)
            .window(WindowAssigner::tumbling(self.window))
            .name(names::WINDOWS)
            .aggregate(TempStats)
            .map(|w| WindowStats {
                sensor_id: w.key,
                window_start: w.window.start,
                window_end: w.window.end,
                count: w.value.count,
                min_c: w.value.min,
                max_c: w.value.max,
                mean_c: w.value.sum / w.value.count.max(1) as f64,
            })
            .name("to-window-stats");
        self.sink(readings, names::READINGS_SINK, "readings");
        self.sink(windows, names::WINDOWS_SINK, "windows");
        Ok(())
    }

    fn sink<T: caudal::Data + Serialize>(&self, stream: DataStream<T>, name: &str, folder: &str) {
        match &self.sink {
            SinkKind::File(dir) => {
                let dir = dir.join(folder);
                stream.sink(name, move |_| Ok(JsonFileSink::new(dir.clone())));
            }
            SinkKind::Stdout => {
                let prefix = folder.to_string();
                stream.sink(name, move |_| Ok(StdoutSink::new(&prefix)));
            }
            SinkKind::Discard => {
                stream.sink(name, |_| Ok(DiscardSink::default()));
            }
        }
    }
}

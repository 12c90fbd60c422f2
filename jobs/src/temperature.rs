//! The `temperature` pipeline of the reference architecture:
//! generator → °F→°C → anomaly filter → key by sensor → 1-minute tumbling windows
//! (count, min, max, mean °C) → sink; the converted readings are a second output, and with
//! a silence set, silent-sensor alerts (`alerts.rs`) a third. With a limits file or topic,
//! the anomaly filter's bounds change while the job runs (`limits/`).

use caudal::{DataStream, RateLimited, Result, Source, StreamEnv, WatermarkStrategy};
use caudal_operators::archive::ArchiveConfig;
use caudal_operators::generator::{GeneratorConfig, SensorReading};
use caudal_operators::iceberg::{IcebergConfig, IcebergSink};
use caudal_operators::kafka::{
    connection_properties, split_dead_letters, with_dead_letters, AvroDecoder, AvroSerializer, DeadLetter,
    DeadLetterSerializer, Decoded, DeliveryGuarantee, JsonDecoder, KafkaSinkConfig, KafkaSourceConfig,
};
use caudal_operators::postgres::PostgresSinkConfig;
use caudal_operators::redis::RedisSinkConfig;
use caudal_operators::sinks::{DiscardSink, JsonFileSink, StdoutSink};
use caudal_operators::window::{AggregateFunction, KeyedWindowExt, WindowAssigner};
use caudal_schemas::{AvroRecord, RegistryAccess};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

use crate::alerts::SilenceDetector;
pub use crate::enrich::SensorMetadata;
use crate::limits::{
    EndsWith, InputEnd, LimitChange, LimitLine, LimitsFile, LimitsFilter, SplitRejected, UntilInputEnds,
    CONTROL_IDLENESS, REJECTED_LIMITS,
};
use caudal_operators::kafka::{JsonSerializer, KafkaSource};
pub use caudal_schemas::{AlertKind, ProcessedReading, SensorAlert, WindowStats};
use std::sync::Arc;

/// °F → °C.
pub fn to_celsius(r: SensorReading) -> ProcessedReading {
    ProcessedReading {
        sensor_id: r.sensor_id,
        ts: r.ts,
        lat: r.lat,
        lon: r.lon,
        temp_c: (r.temp_f - 32.0) * 5.0 / 9.0,
        temp_f: r.temp_f,
        site: String::new(),
        name: String::new(),
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
    /// Avro into Kafka topics, exactly-once by default.
    Kafka(Box<KafkaOutput>),
}

/// Where the readings come from.
#[derive(Debug, Clone)]
pub enum SourceKind {
    /// The simulated sensors.
    Generator(GeneratorConfig),
    /// Avro readings from a Kafka topic (written by `temperature produce`).
    Kafka(KafkaInput),
}

/// How long a silent input partition holds the watermark back (`--idleness-secs`).
pub const DEFAULT_IDLENESS: Duration = Duration::from_secs(30);

/// The Kafka topic the readings are read from.
#[derive(Debug, Clone, PartialEq)]
pub struct KafkaInput {
    /// `host:port[,…]`.
    pub brokers: String,
    /// How to reach the schema registry.
    pub schema_registry: RegistryAccess,
    /// The topic (`earth-temp`).
    pub topic: String,
    /// Read up to the end offsets present at start, then finish.
    pub bounded: bool,
    /// Where undecodable records go.
    pub dead_letter_topic: Option<String>,
    /// More undecodable records than this in a minute fail the job.
    pub max_bad_records_per_minute: Option<u64>,
    /// At most this many records per second over all source subtasks.
    pub max_records_per_second: Option<f64>,
    /// librdkafka consumer properties passed through (checked at start).
    pub properties: Vec<(String, String)>,
    /// How often to look for partitions added to the topic (`None`: never).
    pub partition_discovery: Option<Duration>,
    /// How long a partition may stay silent, with nothing left to read, before the
    /// watermark moves on without it.
    pub idleness: Duration,
}

/// The Kafka topics the results go to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaOutput {
    /// `host:port[,…]`.
    pub brokers: String,
    /// How to reach the schema registry.
    pub schema_registry: RegistryAccess,
    /// Topic of the converted readings (`processed-temp`).
    pub readings_topic: String,
    /// Topic of the window statistics (`temp-windows`).
    pub windows_topic: String,
    /// Topic of the silent-sensor alerts (`temp-alerts`).
    pub alerts_topic: String,
    /// Exactly-once (default), at-least-once or none.
    pub delivery: DeliveryGuarantee,
    /// The producers' `transaction.timeout.ms`.
    pub transaction_timeout: Duration,
    /// Prefix of the transactional ids (`None`: `temperature-<operator>`); two deployments
    /// writing at the same time need different prefixes.
    pub transactional_id_prefix: Option<String>,
    /// librdkafka producer properties passed through (checked at start).
    pub properties: Vec<(String, String)>,
}

/// Where the anomaly limits come from (see `limits/`).
#[derive(Debug, Clone, PartialEq)]
pub enum LimitsInput {
    /// JSON lines in a file watched on disk; rejected lines go to `<output>/rejected-limits`
    /// (file sink), stdout, or `dead_letter_topic` (Kafka sink).
    File {
        /// The file.
        path: PathBuf,
        /// With the Kafka sink: where rejected lines go (`None`: counted and logged only).
        dead_letter_topic: Option<String>,
    },
    /// JSON records of a Kafka topic; rejected ones are counted and go to the source's
    /// dead-letter topic.
    Kafka {
        /// `host:port[,…]`.
        brokers: String,
        /// The consumer's librdkafka properties (connection and security settings included).
        properties: Vec<(String, String)>,
        /// The topic.
        topic: String,
        /// Where records that are not changes go.
        dead_letter_topic: Option<String>,
    },
}

/// The serving and storage sinks, each optional, besides the main [`SinkKind`].
#[derive(Debug, Clone, Default)]
pub struct ServeSinks {
    /// Readings upserted into `<schema>.sensor_readings` keyed (sensor_id, ts), window
    /// statistics into `<schema>.window_stats` keyed (sensor_id, window_start), each
    /// sensor's latest reading into `<schema>.sensor_latest` keyed sensor_id. The config's
    /// `table` and `key` are set per output.
    pub postgres: Option<PostgresSinkConfig>,
    /// The latest reading of each sensor as the hash `sensor:{id}`.
    pub redis: Option<RedisSinkConfig>,
    /// Readings as Avro files partitioned by date and hour.
    pub archive: Option<ArchiveConfig>,
    /// Readings into an Iceberg table (partitioned on `ts`).
    pub iceberg_readings: Option<IcebergConfig>,
    /// Window statistics into an Iceberg table (partitioned on `window_start`).
    pub iceberg_windows: Option<IcebergConfig>,
}

/// Tables of the PostgreSQL sinks.
pub mod tables {
    /// Processed readings, keyed (sensor_id, ts).
    pub const READINGS: &str = "sensor_readings";
    /// Window statistics, keyed (sensor_id, window_start).
    pub const WINDOWS: &str = "window_stats";
    /// The latest reading of each sensor, keyed sensor_id: the same key in every epoch.
    pub const LATEST: &str = "sensor_latest";
    /// Silent-sensor alerts, keyed (sensor_id, kind, ts).
    pub const ALERTS: &str = "sensor_alerts";
}

/// The job's settings (from flags in the binary).
#[derive(Debug, Clone)]
pub struct TemperatureJob {
    /// Where the readings come from.
    pub source: SourceKind,
    /// The window length.
    pub window: Duration,
    /// Bounded out-of-orderness of the watermark.
    pub out_of_orderness: Duration,
    /// The sinks.
    pub sink: SinkKind,
    /// PostgreSQL, Redis and the archive, when enabled.
    pub serve: ServeSinks,
    /// Raise silent-sensor alerts after this much event time without a reading (`None`:
    /// no alerts).
    pub silence: Option<Duration>,
    /// Dynamic anomaly limits (`None`: the fixed −50 < °C < 60).
    pub limits: Option<LimitsInput>,
    /// Each reading's site and name from a PostgreSQL table (`None`: left empty).
    pub metadata: Option<SensorMetadata>,
}

/// Names of the job's operators (metrics, progress line, UI), which are also their uids:
/// the ids of their state in checkpoints, fixed so that a restore finds every operator's
/// state whichever optional sinks are switched on or off.
pub mod names {
    /// The generator source.
    pub const SOURCE: &str = "sensor-generator";
    /// The Kafka source.
    pub const KAFKA_SOURCE: &str = "kafka-readings";
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
    /// Readings into PostgreSQL.
    pub const READINGS_POSTGRES: &str = "readings-postgres";
    /// Window statistics into PostgreSQL.
    pub const WINDOWS_POSTGRES: &str = "windows-postgres";
    /// Each sensor's latest reading into PostgreSQL.
    pub const LATEST_POSTGRES: &str = "latest-postgres";
    /// Latest reading per sensor into Redis.
    pub const READINGS_REDIS: &str = "readings-redis";
    /// Readings archived as Avro files.
    pub const READINGS_ARCHIVE: &str = "readings-archive";
    /// Readings into an Iceberg table (operators `readings-iceberg-writer` and
    /// `readings-iceberg-committer`).
    pub const READINGS_ICEBERG: &str = "readings-iceberg";
    /// Window statistics into an Iceberg table.
    pub const WINDOWS_ICEBERG: &str = "windows-iceberg";
    /// Window result → `WindowStats`.
    pub const TO_WINDOW_STATS: &str = "to-window-stats";
    /// The silent-sensor detector (keyed process function).
    pub const SILENCE: &str = "silence-alerts";
    /// Alerts sink.
    pub const ALERTS_SINK: &str = "alerts-sink";
    /// Alerts into PostgreSQL.
    pub const ALERTS_POSTGRES: &str = "alerts-postgres";
    /// The limit changes (file or topic).
    pub const LIMITS_SOURCE: &str = "limits-source";
    /// Changes from rejected lines of the limits file.
    pub const LIMITS_CHECK: &str = "limits-check";
    /// The anomaly filter with dynamic limits (broadcast state).
    pub const ANOMALY_LIMITS: &str = "anomaly-limits";
    /// Rejected lines of the limits file.
    pub const REJECTED_LIMITS_SINK: &str = "rejected-limits-sink";
    /// Site and name looked up per reading (async I/O).
    pub const METADATA: &str = "sensor-metadata";
    /// The lookup's answer put on the reading.
    pub const WITH_METADATA: &str = "with-metadata";
    /// Readings whose lookups all failed (`--on-lookup-failure side-output`).
    pub const LOOKUP_FAILURES_SINK: &str = "lookup-failures-sink";
    /// Input records that did not decode, split from the readings (`--dead-letter-topic`).
    pub const DEAD_LETTER_SPLIT: &str = "dead-letter-split";
    /// Their sink: the dead-letter topic.
    pub const DEAD_LETTERS_SINK: &str = "dead-letters-sink";
    /// Limits records that are not changes, split from the changes.
    pub const LIMITS_DEAD_LETTER_SPLIT: &str = "limits-dead-letter-split";
    /// Their sink: the limits' dead-letter topic.
    pub const LIMITS_DEAD_LETTERS_SINK: &str = "limits-dead-letters-sink";
}

impl TemperatureJob {
    /// Add the pipeline to `env`.
    pub fn build(&self, env: &StreamEnv) -> Result<()> {
        let idleness = match &self.source {
            SourceKind::Kafka(input) => input.idleness,
            SourceKind::Generator(_) => DEFAULT_IDLENESS,
        };
        let watermarks =
            WatermarkStrategy::bounded_out_of_orderness(self.out_of_orderness, |r: &SensorReading| r.ts)
                .with_idleness(idleness);
        // With dynamic limits in a bounded run, the control stream ends when the readings
        // do (when they run in this process; else it is read to its end at start).
        let bounded = match &self.source {
            SourceKind::Generator(g) => g.records.is_some(),
            SourceKind::Kafka(input) => input.bounded,
        };
        let end =
            self.limits.as_ref().filter(|_| bounded && env.runs_in_one_process()).map(|_| InputEnd::new());
        let read_to_end = bounded && !env.runs_in_one_process();
        let raw = match &self.source {
            SourceKind::Generator(generator) => {
                let generator = generator.clone().build()?;
                source(env, names::SOURCE, generator, watermarks, end.clone()).uid(names::SOURCE)
            }
            SourceKind::Kafka(input) => {
                let mut config = KafkaSourceConfig::new(&input.brokers, &input.topic).bounded(input.bounded);
                config.max_bad_records_per_minute = input.max_bad_records_per_minute;
                config.properties = input.properties.clone();
                config.partition_discovery = input.partition_discovery;
                let decoder = AvroDecoder::<SensorReading>::factory(input.schema_registry.clone());
                let rate = input.max_records_per_second;
                match &input.dead_letter_topic {
                    None => kafka_source(env, config.build(decoder)?, watermarks, rate, end.clone())?,
                    Some(topic) => {
                        let source = config.build(with_dead_letters(decoder))?;
                        let read =
                            kafka_source(env, source, watermarks.lift(Decoded::record), rate, end.clone())?;
                        let (readings, letters) = split_dead_letters(read, names::DEAD_LETTER_SPLIT);
                        let from = (input.brokers.as_str(), input.properties.as_slice());
                        self.dead_letter_sink(letters, names::DEAD_LETTERS_SINK, from, topic);
                        readings
                    }
                }
            }
        };
        let celsius = raw.map(to_celsius).name(names::TO_CELSIUS).uid(names::TO_CELSIUS);
        // Every reading shows the sensor is alive, a faulty one too: alerts see them all.
        let alerts = self.silence.map(|silence| {
            celsius
                .clone()
                .key_by(|r: &ProcessedReading| r.sensor_id)
                .process(SilenceDetector::new(silence))
                .name(names::SILENCE)
                .uid(names::SILENCE)
        });
        let readings = match &self.limits {
            Some(limits) => celsius
                .key_by(|r: &ProcessedReading| r.sensor_id)
                .connect(self.limit_changes(env, limits, end, read_to_end)?.broadcast())
                .process(LimitsFilter::default())
                .name(names::ANOMALY_LIMITS)
                .uid(names::ANOMALY_LIMITS),
            None => celsius.filter(is_plausible).name(names::ANOMALY_FILTER).uid(names::ANOMALY_FILTER),
        };
        let readings = match &self.metadata {
            Some(metadata) => {
                let (enriched, failures) = crate::enrich::enrich(readings, metadata)?;
                if let Some(failures) = failures {
                    let topic = metadata.failures_topic.as_ref();
                    self.json_side_sink(failures, names::LOOKUP_FAILURES_SINK, "lookup-failures", topic);
                }
                enriched
            }
            None => readings,
        };
        let windows = readings
            .clone()
            .key_by(|r: &ProcessedReading| r.sensor_id)
            .window(WindowAssigner::tumbling(self.window))
            .name(names::WINDOWS)
            .uid(names::WINDOWS)
            .aggregate(TempStats)
            .map(|w| WindowStats {
                sensor_id: w.key,
                window_start: w.window.start,
                window_end: w.window.end,
                count: w.value.count as i64,
                min_c: w.value.min,
                max_c: w.value.max,
                mean_c: w.value.sum / w.value.count.max(1) as f64,
            })
            .name(names::TO_WINDOW_STATS)
            .uid(names::TO_WINDOW_STATS);
        if let Some(pg) = &self.serve.postgres {
            // One config per table: the shared settings, its table and its key.
            let table = |table: &str, key: &[&str]| -> Result<PostgresSinkConfig> {
                let mut config = pg.clone();
                config.table = table.into();
                config.key = key.iter().map(|k| k.to_string()).collect();
                config.validate()?;
                Ok(config)
            };
            let readings_pg = table(tables::READINGS, &["sensor_id", "ts"])?;
            readings
                .clone()
                .sink(names::READINGS_POSTGRES, move |_| readings_pg.build::<ProcessedReading>())
                .uid(names::READINGS_POSTGRES);
            let windows_pg = table(tables::WINDOWS, &["sensor_id", "window_start"])?;
            windows
                .clone()
                .sink(names::WINDOWS_POSTGRES, move |_| windows_pg.build::<WindowStats>())
                .uid(names::WINDOWS_POSTGRES);
            // A sensor's readings come in order through one subtask (one generator split or
            // Kafka partition each): the last upsert of an epoch is its latest reading.
            let latest_pg = table(tables::LATEST, &["sensor_id"])?;
            readings
                .clone()
                .sink(names::LATEST_POSTGRES, move |_| latest_pg.build::<ProcessedReading>())
                .uid(names::LATEST_POSTGRES);
            if let Some(alerts) = &alerts {
                let alerts_pg = table(tables::ALERTS, &["sensor_id", "kind", "ts"])?;
                alerts
                    .clone()
                    .sink(names::ALERTS_POSTGRES, move |_| alerts_pg.build::<SensorAlert>())
                    .uid(names::ALERTS_POSTGRES);
            }
        }
        if let Some(redis) = &self.serve.redis {
            redis.validate()?;
            let redis = redis.clone();
            readings
                .clone()
                .sink(names::READINGS_REDIS, move |_| redis.build::<ProcessedReading>())
                .uid(names::READINGS_REDIS);
        }
        if let Some(archive) = &self.serve.archive {
            archive.validate()?;
            let archive = archive.clone();
            readings
                .clone()
                .sink(names::READINGS_ARCHIVE, move |_| archive.build::<ProcessedReading>())
                .uid(names::READINGS_ARCHIVE);
        }
        if let Some(lake) = &self.serve.iceberg_readings {
            lake.validate()?;
            IcebergSink::new(names::READINGS_ICEBERG, lake.clone()).write(readings.clone());
        }
        if let Some(lake) = &self.serve.iceberg_windows {
            lake.validate()?;
            IcebergSink::new(names::WINDOWS_ICEBERG, lake.clone()).write(windows.clone());
        }
        self.sink(readings, names::READINGS_SINK, "readings", |r| r.sensor_id);
        self.sink(windows, names::WINDOWS_SINK, "windows", |w| w.sensor_id);
        if let Some(alerts) = alerts {
            self.sink(alerts, names::ALERTS_SINK, "alerts", |a| a.sensor_id);
        }
        Ok(())
    }

    /// The checked limit changes, at parallelism 1; their event time is when they take
    /// effect, and a quiet control stream is idle. Watched until `end` (a bounded run in
    /// one process), read to the end they have at start (`read_to_end`: a bounded run over
    /// several processes), or watched for good (an unbounded run).
    fn limit_changes(
        &self,
        env: &StreamEnv,
        limits: &LimitsInput,
        end: Option<Arc<InputEnd>>,
        read_to_end: bool,
    ) -> Result<DataStream<LimitChange>> {
        match limits {
            LimitsInput::File { path, dead_letter_topic } => {
                let watermarks = WatermarkStrategy::bounded_out_of_orderness(Duration::ZERO, LimitLine::ts)
                    .with_idleness(CONTROL_IDLENESS);
                let file = LimitsFile::new(path)?;
                let file = if read_to_end { file.to_its_end() } else { file };
                let lines = control_source(env, file, watermarks, end);
                let changes = lines.process(SplitRejected).name(names::LIMITS_CHECK).uid(names::LIMITS_CHECK);
                let rejected = changes.side_output(&REJECTED_LIMITS);
                self.json_side_sink(
                    rejected,
                    names::REJECTED_LIMITS_SINK,
                    "rejected-limits",
                    dead_letter_topic.as_ref(),
                );
                Ok(changes)
            }
            LimitsInput::Kafka { brokers, properties, topic, dead_letter_topic } => {
                let mut config = KafkaSourceConfig::new(brokers, topic).bounded(read_to_end);
                config.properties = properties.clone();
                let watermarks =
                    WatermarkStrategy::bounded_out_of_orderness(Duration::ZERO, |c: &LimitChange| c.from_ts)
                        .with_idleness(CONTROL_IDLENESS);
                let Some(dead_letters) = dead_letter_topic else {
                    return Ok(control_source(
                        env,
                        KafkaSource::<LimitChange>::json(config),
                        watermarks,
                        end,
                    ));
                };
                let source = config.build(with_dead_letters(JsonDecoder::factory::<LimitChange>()))?;
                let read = control_source(env, source, watermarks.lift(Decoded::record), end);
                let (changes, letters) = split_dead_letters(read, names::LIMITS_DEAD_LETTER_SPLIT);
                self.dead_letter_sink(
                    letters,
                    names::LIMITS_DEAD_LETTERS_SINK,
                    (brokers, properties),
                    dead_letters,
                );
                Ok(changes)
            }
        }
    }

    /// Input records that did not decode, into the Kafka topic `topic` on the brokers they
    /// were read `from` (with the input's properties): through a transaction per checkpoint
    /// epoch as the Kafka output (its delivery, producer properties and transactional-id
    /// prefix, `<prefix>-<name>`); with any other sink exactly-once too, the ids prefixed
    /// `caudal-dead-letters-<topic>`, with the input's connection and security properties.
    fn dead_letter_sink(
        &self,
        letters: DataStream<DeadLetter>,
        name: &str,
        from: (&str, &[(String, String)]),
        topic: &str,
    ) {
        let (brokers, input_properties) = from;
        let mut config = KafkaSinkConfig::new(brokers, topic);
        match &self.sink {
            SinkKind::Kafka(output) => {
                config = config.delivery(output.delivery).transaction_timeout(output.transaction_timeout);
                config.transactional_id_prefix =
                    output.transactional_id_prefix.as_ref().map(|p| format!("{p}-{name}"));
                config.properties = output.properties.clone();
            }
            _ => {
                config.transactional_id_prefix = Some(format!("caudal-dead-letters-{topic}"));
                config.properties = connection_properties(input_properties);
            }
        }
        letters.sink(name, move |_| config.build(DeadLetterSerializer)).uid(name);
    }

    /// A side output of JSON records (rejected limit changes, failed lookups): into
    /// `<output>/<folder>` (file sink), stdout, or `topic` with the Kafka sink; else counted
    /// by its sink and dropped.
    fn json_side_sink<T: caudal::Data + Serialize>(
        &self,
        stream: DataStream<T>,
        name: &str,
        folder: &str,
        topic: Option<&String>,
    ) {
        match (&self.sink, topic) {
            (SinkKind::File(dir), _) => {
                let dir = dir.join(folder);
                stream.sink(name, move |_| Ok(JsonFileSink::new(dir.clone()))).uid(name);
            }
            (SinkKind::Stdout, _) => {
                let prefix = folder.to_string();
                stream.sink(name, move |_| Ok(StdoutSink::new(&prefix))).uid(name);
            }
            (SinkKind::Kafka(output), Some(topic)) => {
                let mut config = KafkaSinkConfig::new(&output.brokers, topic).delivery(output.delivery);
                config.transactional_id_prefix =
                    output.transactional_id_prefix.as_ref().map(|p| format!("{p}-{folder}"));
                stream.sink(name, move |_| config.build(JsonSerializer)).uid(name);
            }
            _ => {
                stream.sink(name, |_| Ok(DiscardSink::default())).uid(name);
            }
        }
    }

    fn sink<T: caudal::Data + Serialize + AvroRecord>(
        &self,
        stream: DataStream<T>,
        name: &str,
        folder: &str,
        key: fn(&T) -> i64,
    ) {
        match &self.sink {
            SinkKind::Kafka(output) => {
                let topic = match folder {
                    "readings" => &output.readings_topic,
                    "alerts" => &output.alerts_topic,
                    _ => &output.windows_topic,
                };
                let mut config = KafkaSinkConfig::new(&output.brokers, topic)
                    .delivery(output.delivery)
                    .transaction_timeout(output.transaction_timeout);
                config.transactional_id_prefix =
                    output.transactional_id_prefix.as_ref().map(|p| format!("{p}-{folder}"));
                config.properties = output.properties.clone();
                let registry = output.schema_registry.clone();
                stream
                    .sink(name, move |_| {
                        let serializer = AvroSerializer::<T>::new(registry.clone()).keyed(key);
                        config.build(serializer)
                    })
                    .uid(name);
            }
            SinkKind::File(dir) => {
                let dir = dir.join(folder);
                stream.sink(name, move |_| Ok(JsonFileSink::new(dir.clone()))).uid(name);
            }
            SinkKind::Stdout => {
                let prefix = folder.to_string();
                stream.sink(name, move |_| Ok(StdoutSink::new(&prefix))).uid(name);
            }
            SinkKind::Discard => {
                stream.sink(name, |_| Ok(DiscardSink::default())).uid(name);
            }
        }
    }
}

/// The readings' Kafka source (of readings, or of readings and dead letters), at most
/// `rate` records per second, telling `end` (dynamic limits) when it finished.
fn kafka_source<T: caudal::Data>(
    env: &StreamEnv,
    source: KafkaSource<T>,
    watermarks: WatermarkStrategy<T>,
    rate: Option<f64>,
    end: Option<Arc<InputEnd>>,
) -> Result<DataStream<T>> {
    let stream = match rate {
        Some(rate) => {
            self::source(env, names::KAFKA_SOURCE, RateLimited::new(source, rate)?, watermarks, end)
        }
        None => self::source(env, names::KAFKA_SOURCE, source, watermarks, end),
    };
    Ok(stream.uid(names::KAFKA_SOURCE))
}

/// Adds the readings' source, telling `end` (dynamic limits) when it finished.
fn source<S: Source>(
    env: &StreamEnv,
    name: &str,
    source: S,
    watermarks: WatermarkStrategy<S::Out>,
    end: Option<Arc<InputEnd>>,
) -> DataStream<S::Out> {
    match end {
        Some(end) => env.source(name, EndsWith::new(source, end), watermarks),
        None => env.source(name, source, watermarks),
    }
}

/// Adds the limit changes' source at parallelism 1, ending with the readings when `end` is
/// given.
fn control_source<S: Source>(
    env: &StreamEnv,
    source: S,
    watermarks: WatermarkStrategy<S::Out>,
    end: Option<Arc<InputEnd>>,
) -> DataStream<S::Out> {
    match end {
        Some(end) => env.source(names::LIMITS_SOURCE, UntilInputEnds::new(source, end), watermarks),
        None => env.source(names::LIMITS_SOURCE, source, watermarks),
    }
    .parallelism(1)
    .uid(names::LIMITS_SOURCE)
}

//! `temperature`: simulated sensors → °C → anomaly filter → per-sensor 1-minute windows.
//!
//! With no flags: 5 sensors at 1 reading per second each, unbounded, results under
//! `./data/output`, a progress line every 5 seconds. Ctrl-C stops cleanly.
//!
//! `--source kafka` reads Avro readings from `--input-topic` instead; `--sink kafka` writes
//! the results to `--output-topic` and `--windows-topic` exactly once.
//! `temperature produce` writes simulated readings into a topic; `temperature savepoint`
//! creates, lists and deletes savepoints.

use anyhow::Context;
use caudal::metrics::{names as metric, OperatorSnapshot};
use caudal::{JobConfig, StreamEnv};
use caudal_jobs::cli::KafkaArgs;
use caudal_jobs::enrich::LookupFailures;
use caudal_jobs::produce::Producer;
use caudal_jobs::temperature::{
    names, KafkaInput, KafkaOutput, LimitsInput, SensorMetadata, ServeSinks, SinkKind, SourceKind,
    TemperatureJob,
};
use caudal_operators::archive::ArchiveConfig;
use caudal_operators::generator::{GeneratorConfig, Outage};
use caudal_operators::iceberg::IcebergConfig;
use caudal_operators::kafka::DeliveryGuarantee;
use caudal_operators::postgres::PostgresSinkConfig;
use caudal_operators::redis::RedisSinkConfig;
use clap::{Args as ClapArgs, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Sink {
    /// Newline-delimited JSON files under --output.
    File,
    /// JSON lines on stdout.
    Stdout,
    /// Count and discard (benchmarks).
    Discard,
    /// Avro into --output-topic and --windows-topic.
    Kafka,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Input {
    /// The simulated sensors.
    Generator,
    /// Avro readings from --input-topic.
    Kafka,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Delivery {
    /// A Kafka transaction per checkpoint, committed when it completes.
    ExactlyOnce,
    /// Idempotent producer flushed at checkpoints: duplicates after a restore.
    AtLeastOnce,
    /// Fire and forget.
    None,
}

/// Where keyed (window) state lives.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum StateBackend {
    /// RocksDB on local disk, incremental checkpoints (the default).
    Rocksdb,
    /// In memory (small jobs, tests).
    Heap,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write simulated sensor readings into a Kafka topic (Avro, keyed by sensor id).
    Produce(ProduceArgs),
    /// Savepoints: copy a completed checkpoint into savepoints/NAME (kept until deleted),
    /// list them, or delete one.
    Savepoint(SavepointArgs),
}

#[derive(Debug, ClapArgs)]
struct SavepointArgs {
    /// Checkpoint storage: a directory, file:///path or s3://bucket/prefix.
    #[arg(long, default_value = "data/checkpoints")]
    checkpoint_dir: String,
    /// The savepoint to create (default: savepoint-<unix seconds>).
    #[arg(long, conflicts_with_all = ["list", "delete"])]
    name: Option<String>,
    /// The checkpoint to copy, e.g. chk-7 (default: the latest completed).
    #[arg(long, conflicts_with_all = ["list", "delete"])]
    from: Option<String>,
    /// List the savepoints.
    #[arg(long)]
    list: bool,
    /// Delete the savepoint NAME.
    #[arg(long, value_name = "NAME", conflicts_with = "list")]
    delete: Option<String>,
}

/// The job's name: its checkpoints live under `<checkpoint-dir>/temperature/`.
const JOB: &str = "temperature";

fn savepoint(args: &SavepointArgs) -> anyhow::Result<()> {
    let mut config = JobConfig::default();
    config.checkpoints.storage.url = args.checkpoint_dir.clone();
    let config = config.with_env_overrides()?;
    let checkpoints = &config.checkpoints;
    if args.list {
        for name in caudal::savepoint::list_savepoints(checkpoints, JOB)? {
            println!("savepoints/{name}");
        }
    } else if let Some(name) = &args.delete {
        let n = caudal::savepoint::delete_savepoint(checkpoints, JOB, name)?;
        eprintln!("temperature: deleted savepoints/{name} ({n} objects)");
    } else {
        let name = args.name.clone().unwrap_or_else(|| {
            let secs =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            format!("savepoint-{secs}")
        });
        let path = caudal::savepoint::create_savepoint(checkpoints, JOB, args.from.as_deref(), &name)?;
        eprintln!("temperature: savepoint written; restore with --restore {path}");
        println!("{path}");
    }
    Ok(())
}

/// The simulated sensors.
#[derive(Debug, ClapArgs)]
struct SensorArgs {
    /// Number of simulated sensors.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    sensors: u64,
    /// Readings per sensor per second; 0 = as fast as possible.
    #[arg(long, default_value_t = 1.0, value_parser = non_negative)]
    rate: f64,
    /// Stop after this many readings in total (bounded run); unbounded when absent.
    #[arg(long)]
    records: Option<u64>,
    /// Event time between two readings of a sensor, ms (default: 1000 / rate).
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    event_interval_ms: Option<i64>,
    /// Seed of the generator: the same seed gives the same readings.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Fraction of faulty (impossible) readings the anomaly filter must drop.
    #[arg(long, default_value_t = 0.01, value_parser = fraction)]
    faulty_fraction: f64,
    /// Number of generator shards (the unit of source parallelism and replay).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    splits: u32,
    /// Sensor SENSOR reports nothing from FROM_SECS to TO_SECS of event time after the first
    /// reading (repeatable): makes silent-sensor alerts (--silence-secs) for demos and tests.
    #[arg(long = "outage", value_name = "SENSOR:FROM_SECS:TO_SECS")]
    outages: Vec<Outage>,
}

impl SensorArgs {
    fn generator(&self) -> GeneratorConfig {
        GeneratorConfig {
            sensors: self.sensors,
            rate: self.rate,
            records: self.records,
            seed: self.seed,
            faulty_fraction: self.faulty_fraction,
            splits: self.splits,
            start_ms: None,
            event_interval_ms: self.event_interval_ms,
            outages: self.outages.clone(),
        }
    }
}

#[derive(Debug, ClapArgs)]
struct ProduceArgs {
    /// The topic written.
    #[arg(long, default_value = "earth-temp")]
    topic: String,
    #[command(flatten)]
    sensors: SensorArgs,
    #[command(flatten)]
    kafka: KafkaArgs,
}

/// The temperature pipeline of the reference architecture.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None, allow_negative_numbers = true)]
#[command(args_conflicts_with_subcommands = true)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    sensors: SensorArgs,
    /// Where readings come from.
    #[arg(long, value_enum, default_value_t = Input::Generator)]
    source: Input,
    /// The topic --source kafka reads.
    #[arg(long, default_value = "earth-temp")]
    input_topic: String,
    /// With --source kafka: read up to the end offsets present at start, then finish.
    #[arg(long)]
    bounded: bool,
    /// With --source kafka: topic for records that cannot be decoded.
    #[arg(long)]
    dead_letter_topic: Option<String>,
    /// With --source kafka: fail the job when more records than this cannot be decoded in
    /// any minute (an input of which every record is bad fails it anyway).
    #[arg(long, value_name = "N")]
    max_bad_records_per_minute: Option<u64>,
    /// With --source kafka (unbounded): how often to look for partitions added to the input
    /// topic, which are then read from their beginning (0: never).
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    partition_discovery_secs: f64,
    /// With --source kafka: how long a partition with nothing left to read may stay silent
    /// before the watermark moves on without it (its records, if any come, may then be late).
    #[arg(long, value_name = "SECS", default_value_t = 30.0, value_parser = positive)]
    idleness_secs: f64,
    /// With --source kafka: read at most this many records per second (all subtasks together).
    #[arg(long, value_name = "RECORDS", value_parser = positive)]
    max_records_per_second: Option<f64>,
    /// The topic --sink kafka writes the converted readings to.
    #[arg(long, default_value = "processed-temp")]
    output_topic: String,
    /// The topic --sink kafka writes the window statistics to.
    #[arg(long, default_value = "temp-windows")]
    windows_topic: String,
    /// The topic --sink kafka writes the silent-sensor alerts to.
    #[arg(long, default_value = "temp-alerts")]
    alerts_topic: String,
    /// Raise an alert when a sensor sends no reading for this many seconds of event time
    /// (SILENT), and when it reports again (RECOVERED): to <output>/alerts, the alerts topic
    /// and the sensor_alerts table. Off when absent.
    #[arg(long, value_name = "SECS", value_parser = positive)]
    silence_secs: Option<f64>,
    /// Change the anomaly filter's bounds per latitude band while the job runs: a file of
    /// JSON lines, watched (appended lines, or the file replaced), e.g.
    /// {"band":"tropics","lat_min":-23.5,"lat_max":23.5,"min_c":-10,"max_c":45,"from_ts":1767225615000}
    /// — in force from that event time (ms); a line that is not a change is counted and
    /// dead-lettered (<output>/rejected-limits, or --limits-dead-letter-topic), never applied.
    #[arg(long, value_name = "PATH", conflicts_with = "limits_topic")]
    limits_file: Option<PathBuf>,
    /// The same changes as JSON records of a Kafka topic (on --brokers).
    #[arg(long, value_name = "TOPIC")]
    limits_topic: Option<String>,
    /// Where limit changes that are not changes go in Kafka (with --limits-topic, or with
    /// --limits-file and --sink kafka).
    #[arg(long, value_name = "TOPIC")]
    limits_dead_letter_topic: Option<String>,
    /// Put each reading's site and name on it, looked up by sensor_id in a PostgreSQL table
    /// (columns sensor_id BIGINT, site TEXT, name TEXT) through async I/O:
    /// postgres://user[:password]@host:port/db. Empty for a sensor not in the table.
    #[arg(long, value_name = "URL")]
    sensor_metadata: Option<String>,
    /// The table (or view) of --sensor-metadata, optionally schema.table.
    #[arg(long, value_name = "NAME", default_value = "sensors")]
    sensor_metadata_table: String,
    /// How long one metadata lookup may take (then it is retried; after 3 retries the job
    /// fails naming the reading).
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    lookup_timeout_ms: u64,
    /// Metadata lookups after the first, on an error or a timeout (backoff from 100 ms,
    /// doubling).
    #[arg(long, value_name = "N", default_value_t = 3)]
    lookup_retries: u32,
    /// Sensors whose metadata is kept in memory (0: ask for every reading).
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    lookup_cache_entries: usize,
    /// What a reading whose metadata lookups all failed does: fail the job (naming it), or
    /// go to <output>/lookup-failures (or --lookup-failures-topic) with the error while the
    /// job goes on.
    #[arg(long, value_enum, default_value_t = OnLookupFailure::Fail)]
    on_lookup_failure: OnLookupFailure,
    /// With --on-lookup-failure side-output and --sink kafka: the topic of the failures
    /// (JSON).
    #[arg(long, value_name = "TOPIC")]
    lookup_failures_topic: Option<String>,
    /// Delivery guarantee of --sink kafka.
    #[arg(long, value_enum, default_value_t = Delivery::ExactlyOnce)]
    delivery: Delivery,
    /// transaction.timeout.ms of --sink kafka, in seconds (within the broker's
    /// transaction.max.timeout.ms; above checkpoint interval + timeout + a restart).
    #[arg(long, default_value_t = 900)]
    transaction_timeout_secs: u64,
    /// Prefix of --sink kafka's transactional ids (default: the job and operator names).
    /// Two deployments writing at the same time must use different prefixes: they would
    /// fence each other's transactions.
    #[arg(long)]
    transactional_id_prefix: Option<String>,
    #[command(flatten)]
    kafka: KafkaArgs,
    /// Parallelism of every operator.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=128))]
    parallelism: u32,
    /// Window length in seconds.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    window_secs: u64,
    /// Where results go.
    #[arg(long, value_enum, default_value_t = Sink::File)]
    sink: Sink,
    /// Output directory of the file sink.
    #[arg(long, default_value = "data/output")]
    output: PathBuf,
    /// Also upsert readings, window statistics and each sensor's latest reading into
    /// PostgreSQL (postgres://user[:password]@host:port/database), exactly once per checkpoint.
    #[arg(long, value_name = "URL")]
    postgres: Option<String>,
    /// Schema of the PostgreSQL tables (created if absent).
    #[arg(long, value_name = "NAME", default_value = "public")]
    postgres_schema: String,
    /// Milliseconds a PostgreSQL row may wait for more before it is sent.
    #[arg(long, value_name = "MS", default_value_t = 200)]
    postgres_linger_ms: u64,
    /// Also keep the latest reading of each sensor in Redis (redis://host:port/) as the
    /// hash `sensor:{id}`.
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
    /// Prefix of the Redis hash keys.
    #[arg(long, value_name = "PREFIX", default_value = "sensor:")]
    redis_prefix: String,
    /// PEM file of the CA a rediss:// server's certificate is signed by (default: the
    /// system's roots).
    #[arg(long, value_name = "FILE")]
    redis_tls_ca: Option<PathBuf>,
    /// Also archive readings as Avro files partitioned date=YYYY-MM-DD/hour=HH/ into a
    /// directory or s3://bucket/prefix (S3 settings: CAUDAL__S3__* variables).
    #[arg(long, value_name = "URL")]
    archive: Option<String>,
    /// Also write readings into this Iceberg table (NAMESPACE.TABLE), one snapshot per
    /// checkpoint, exactly once; with --iceberg-catalog and --iceberg-warehouse.
    #[arg(long, value_name = "NAMESPACE.TABLE")]
    iceberg_table: Option<String>,
    /// Also write window statistics into this Iceberg table (partitioned on window_start).
    #[arg(long, value_name = "NAMESPACE.TABLE")]
    iceberg_windows_table: Option<String>,
    /// The Iceberg catalog: the SQL catalog's database (postgres://user@host:port/db: the
    /// JDBC catalog's tables, which Trino, Spark and pyiceberg read) or a REST catalog
    /// (http://host:port or https://…, the URL whose /v1/config answers).
    #[arg(long, value_name = "URL")]
    iceberg_catalog: Option<String>,
    /// The SQL catalog's name in that database (a REST catalog: only a label).
    #[arg(long, value_name = "NAME", default_value = "caudal")]
    iceberg_catalog_name: String,
    /// Where new Iceberg tables go: a directory or s3://bucket/prefix (S3 settings:
    /// CAUDAL__S3__* variables).
    #[arg(long, value_name = "DIR|URL")]
    iceberg_warehouse: Option<String>,
    /// How new Iceberg tables are partitioned on event time: hour, day, month or none.
    #[arg(long, value_name = "TRANSFORM", default_value = "day")]
    iceberg_partition: caudal_operators::iceberg::Partitioning,
    /// Expire all but the newest N snapshots of each Iceberg table after each commit
    /// (metadata only; default: keep all).
    #[arg(long, value_name = "N")]
    iceberg_keep_snapshots: Option<usize>,
    /// Seconds between checkpoints (0 = no checkpoints). Output files are published when a
    /// checkpoint completes.
    #[arg(long, default_value_t = 60.0, value_parser = non_negative)]
    checkpoint_interval: f64,
    /// Checkpoint storage: a directory, file:///path or s3://bucket/prefix.
    #[arg(long, default_value = "data/checkpoints")]
    checkpoint_dir: String,
    /// Completed checkpoints to keep.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    retained_checkpoints: u64,
    /// Restore from `latest` or a checkpoint directory (e.g. chk-7) before running.
    #[arg(long)]
    restore: Option<String>,
    /// With --restore latest: skip a corrupt latest checkpoint and use the previous one.
    #[arg(long)]
    fallback: bool,
    /// With --restore: drop the state of operators the checkpoint has and this job no longer
    /// has (by uid), with a warning each, instead of refusing to restore.
    #[arg(long)]
    allow_non_restored_state: bool,
    /// On Ctrl-C / SIGTERM, keep the final checkpoint as savepoint NAME (restore it with
    /// --restore savepoints/NAME).
    #[arg(long, value_name = "NAME")]
    stop_with_savepoint: Option<String>,
    /// Where keyed (window) state lives.
    #[arg(long, value_enum, default_value_t = StateBackend::Rocksdb)]
    state_backend: StateBackend,
    /// Local working directory of RocksDB (default: under the system temp dir).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Seconds between progress lines (0 = none).
    #[arg(long, default_value_t = 5)]
    progress_secs: u64,
    /// Address of the web UI and REST API while the job runs (127.0.0.1: this machine only).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8081")]
    ui_bind: std::net::SocketAddr,
    /// A host name the web UI answers to besides IP addresses and localhost (repeatable);
    /// requests naming any other host are refused (DNS rebinding).
    #[arg(long = "ui-allowed-host", value_name = "NAME")]
    ui_allowed_hosts: Vec<String>,
    /// A secret file (e.g. `openssl rand -hex 32 > FILE`) every request to the web UI and
    /// REST API must carry (bearer token, or sign in with it); required off loopback.
    #[arg(long, value_name = "FILE", env = "CAUDAL__WEB_SECRET_FILE")]
    ui_secret_file: Option<PathBuf>,
    /// Run without the web UI and REST API.
    #[arg(long)]
    no_ui: bool,
    /// Print the plan as JSON and exit (the engine answers it in `execute`; `caudal submit`
    /// asks every job binary this).
    #[arg(long = "caudal-plan", hide = true)]
    _caudal_plan: bool,
}

fn non_negative(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(format!("must be 0 (unthrottled) or positive, got {s}"))
    }
}

fn positive(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(format!("must be positive, got {s}"))
    }
}

fn fraction(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("must be between 0 and 1, got {s}"))
    }
}

fn find<'a>(ops: &'a [OperatorSnapshot], name: &str) -> Option<&'a OperatorSnapshot> {
    ops.iter().find(|o| o.name == name)
}

fn progress_line(ops: &[OperatorSnapshot], elapsed: Duration) -> String {
    let read =
        find(ops, names::SOURCE).or_else(|| find(ops, names::KAFKA_SOURCE)).map_or(0, |o| o.records_out);
    let dropped = find(ops, names::ANOMALY_FILTER).map_or(0, |o| o.records_in - o.records_out);
    let fired =
        find(ops, names::WINDOWS).and_then(|o| o.counters.get(metric::WINDOWS_FIRED).copied()).unwrap_or(0);
    let late =
        find(ops, names::WINDOWS).and_then(|o| o.counters.get(metric::LATE_RECORDS).copied()).unwrap_or(0);
    let written = find(ops, names::READINGS_SINK).map_or(0, |o| o.records_in);
    let secs = elapsed.as_secs_f64().max(0.001);
    format!(
        "[{:>6.1}s] read {read} ({:.0}/s), anomalies dropped {dropped}, readings out {written}, windows fired {fired}, late {late}",
        secs,
        read as f64 / secs
    )
}

fn produce(args: &ProduceArgs) -> anyhow::Result<()> {
    let producer = Producer {
        generator: args.sensors.generator(),
        brokers: args.kafka.brokers.clone(),
        schema_registry: args.kafka.registry()?,
        topic: args.topic.clone(),
        properties: args.kafka.for_producers()?,
    };
    let config = JobConfig { web_bind: None, progress_interval: None, ..JobConfig::default() };
    eprintln!("temperature produce: writing readings to `{}` on {}", args.topic, args.kafka.brokers);
    let result = producer.run(config.with_env_overrides()?).context("producing readings")?;
    let written = result.operators.iter().find(|o| o.kind == "sink").map_or(0, |o| o.records_in);
    eprintln!("temperature produce: {written} readings in {:.1}s", result.elapsed.as_secs_f64());
    Ok(())
}

/// `--on-lookup-failure`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum OnLookupFailure {
    /// Fail the job, naming the reading.
    Fail,
    /// Send the reading to the lookup-failures output and go on.
    SideOutput,
}

/// The Iceberg table `table` of the flags, partitioned on `partition_field`.
fn iceberg(
    args: &Args,
    table: Option<&str>,
    partition_field: &str,
    config: &JobConfig,
) -> anyhow::Result<Option<IcebergConfig>> {
    let Some(table) = table else { return Ok(None) };
    let (Some(catalog), Some(warehouse)) = (&args.iceberg_catalog, &args.iceberg_warehouse) else {
        anyhow::bail!("--iceberg-table and --iceberg-windows-table need --iceberg-catalog URL and --iceberg-warehouse DIR|s3://…");
    };
    let mut lake = IcebergConfig::new(catalog, warehouse, table);
    lake.catalog_name = args.iceberg_catalog_name.clone();
    lake.partition_field = partition_field.to_string();
    lake.partitioning = args.iceberg_partition;
    lake.keep_snapshots = args.iceberg_keep_snapshots;
    lake.s3 = config.checkpoints.storage.s3.clone();
    lake.validate()?;
    Ok(Some(lake))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match &args.command {
        Some(Command::Produce(p)) => return produce(p),
        Some(Command::Savepoint(sp)) => return savepoint(sp),
        None => {}
    }
    let mut config = JobConfig {
        parallelism: args.parallelism,
        progress_interval: (args.progress_secs > 0).then(|| Duration::from_secs(args.progress_secs)),
        web_bind: (!args.no_ui).then_some(args.ui_bind),
        web_allowed_hosts: args.ui_allowed_hosts.clone(),
        web_secret_file: args.ui_secret_file.clone(),
        ..JobConfig::default()
    };
    config.checkpoints.interval =
        (args.checkpoint_interval > 0.0).then(|| Duration::from_secs_f64(args.checkpoint_interval));
    config.checkpoints.storage.url = args.checkpoint_dir.clone();
    config.checkpoints.retained = args.retained_checkpoints as usize;
    config.checkpoints.restore = args.restore.as_deref().map(str::parse).transpose()?;
    config.checkpoints.allow_non_restored_state |= args.allow_non_restored_state;
    config.checkpoints.fallback = args.fallback;
    config.checkpoints.savepoint_on_stop = args.stop_with_savepoint.clone();
    config.state.kind = match args.state_backend {
        StateBackend::Rocksdb => caudal_checkpoints::BackendKind::Rocksdb,
        StateBackend::Heap => caudal_checkpoints::BackendKind::Heap,
    };
    config.state_dir = args.state_dir.clone();
    let config = config.with_env_overrides()?;
    let job = TemperatureJob {
        source: match args.source {
            Input::Generator => SourceKind::Generator(args.sensors.generator()),
            Input::Kafka => SourceKind::Kafka(KafkaInput {
                brokers: args.kafka.brokers.clone(),
                schema_registry: args.kafka.registry()?,
                topic: args.input_topic.clone(),
                bounded: args.bounded,
                dead_letter_topic: args.dead_letter_topic.clone(),
                max_bad_records_per_minute: args.max_bad_records_per_minute,
                max_records_per_second: args.max_records_per_second,
                properties: args.kafka.for_consumers()?,
                partition_discovery: (args.partition_discovery_secs > 0.0)
                    .then(|| Duration::from_secs_f64(args.partition_discovery_secs)),
                idleness: Duration::from_secs_f64(args.idleness_secs),
            }),
        },
        window: Duration::from_secs(args.window_secs),
        out_of_orderness: Duration::from_secs(1),
        sink: match args.sink {
            Sink::File => SinkKind::File(args.output.clone()),
            Sink::Stdout => SinkKind::Stdout,
            Sink::Discard => SinkKind::Discard,
            Sink::Kafka => SinkKind::Kafka(Box::new(KafkaOutput {
                brokers: args.kafka.brokers.clone(),
                schema_registry: args.kafka.registry()?,
                readings_topic: args.output_topic.clone(),
                windows_topic: args.windows_topic.clone(),
                alerts_topic: args.alerts_topic.clone(),
                delivery: match args.delivery {
                    Delivery::ExactlyOnce => DeliveryGuarantee::ExactlyOnce,
                    Delivery::AtLeastOnce => DeliveryGuarantee::AtLeastOnce,
                    Delivery::None => DeliveryGuarantee::None,
                },
                transaction_timeout: Duration::from_secs(args.transaction_timeout_secs),
                transactional_id_prefix: args.transactional_id_prefix.clone(),
                properties: args.kafka.for_producers()?,
            })),
        },
        serve: ServeSinks {
            postgres: args.postgres.as_ref().map(|url| {
                let mut pg = PostgresSinkConfig::new(url, "", &[]);
                pg.schema = args.postgres_schema.clone();
                pg.linger_ms = args.postgres_linger_ms;
                pg
            }),
            redis: args.redis.as_ref().map(|url| {
                let mut redis = RedisSinkConfig::new(url);
                redis.key_prefix = args.redis_prefix.clone();
                redis.tls_ca = args.redis_tls_ca.clone();
                redis
            }),
            archive: args.archive.as_ref().map(|url| {
                let mut archive = ArchiveConfig::new(url);
                archive.s3 = config.checkpoints.storage.s3.clone();
                archive
            }),
            iceberg_readings: iceberg(&args, args.iceberg_table.as_deref(), "ts", &config)?,
            iceberg_windows: iceberg(&args, args.iceberg_windows_table.as_deref(), "window_start", &config)?,
        },
        silence: args.silence_secs.map(Duration::from_secs_f64),
        limits: match (&args.limits_file, &args.limits_topic) {
            (Some(path), _) => Some(LimitsInput::File {
                path: path.clone(),
                dead_letter_topic: args.limits_dead_letter_topic.clone(),
            }),
            (None, Some(topic)) => Some(LimitsInput::Kafka {
                brokers: args.kafka.brokers.clone(),
                properties: args.kafka.for_consumers()?,
                topic: topic.clone(),
                dead_letter_topic: args.limits_dead_letter_topic.clone(),
            }),
            (None, None) => None,
        },
        metadata: args.sensor_metadata.as_ref().map(|url| SensorMetadata {
            table: args.sensor_metadata_table.clone(),
            timeout: Duration::from_millis(args.lookup_timeout_ms.max(1)),
            cache_entries: args.lookup_cache_entries,
            retries: args.lookup_retries,
            failures: match args.on_lookup_failure {
                OnLookupFailure::Fail => LookupFailures::FailTheJob,
                OnLookupFailure::SideOutput => LookupFailures::SideOutput,
            },
            failures_topic: args.lookup_failures_topic.clone(),
            ..SensorMetadata::new(url)
        }),
    };
    let mut env = StreamEnv::with_config(config);
    job.build(&env).context("building the temperature job")?;
    env.on_progress(|ops, elapsed| eprintln!("{}", progress_line(ops, elapsed)));
    if let SinkKind::File(dir) = &job.sink {
        let alerts = if job.silence.is_some() { ",alerts" } else { "" };
        eprintln!("temperature: writing to {}/{{readings,windows{alerts}}}; Ctrl-C stops", dir.display());
    }
    if let Some(addr) = env.config().web_bind {
        eprintln!("temperature: web UI at http://{addr}/jobs/temperature (REST API under /api/v1)");
    }
    let result = env.execute(JOB).context("temperature job failed")?;
    eprintln!("{}", progress_line(&result.operators, result.elapsed));
    if let Some(path) = &result.savepoint {
        eprintln!("temperature: savepoint written; restore with --restore {path}");
    }
    eprintln!("temperature: finished in {:.1}s", result.elapsed.as_secs_f64());
    Ok(())
}

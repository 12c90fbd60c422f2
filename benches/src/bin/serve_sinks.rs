//! Throughput and latency of the serving sinks against the running test stack
//! (`eval "$(scripts/services.sh env)"`):
//!
//! * `postgres`: generated readings → °C → PostgreSQL upserts with checkpoints (rows/s);
//! * `redis`: the same into the Redis latest-reading hashes (records/s);
//! * `latency`: a throttled run with event time = wall-clock time, a poller reading the
//!   hashes every millisecond: reading → visible in Redis, p50/p99/max;
//! * `job`: the whole temperature job with the file sink discarded and PostgreSQL, Redis
//!   and a local archive on (readings/s);
//! * `iceberg`: readings → °C → an Iceberg table (SQL catalog in PostgreSQL, a local
//!   warehouse, or `--iceberg-warehouse s3://…`): rows/s, snapshots, files per minute,
//!   average file size and commit latency, at `--checkpoint-interval`.
//!
//! ```text
//! cargo run --release -p caudal-benches --bin serve_sinks -- --mode postgres,redis,latency,job
//! ```

use anyhow::{bail, Context};
use caudal::{JobConfig, StreamEnv, WatermarkStrategy};
use caudal_jobs::temperature::{
    is_plausible, to_celsius, ProcessedReading, ServeSinks, SinkKind, SourceKind, TemperatureJob,
};
use caudal_operators::archive::ArchiveConfig;
use caudal_operators::generator::{GeneratorConfig, SensorReading};
use caudal_operators::postgres::PostgresSinkConfig;
use caudal_operators::redis::RedisSinkConfig;
use clap::{Parser, ValueEnum};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Postgres,
    Redis,
    Latency,
    Job,
    Iceberg,
}

#[derive(Debug, Parser)]
#[command(about = "Caudal serving sinks: rows/s into PostgreSQL and Redis, reading → Redis latency")]
struct Args {
    /// What to measure.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Mode::Postgres, Mode::Redis, Mode::Latency, Mode::Job])]
    mode: Vec<Mode>,
    /// Readings per throughput run.
    #[arg(long, default_value_t = 1_000_000)]
    records: u64,
    /// Simulated sensors.
    #[arg(long, default_value_t = 10_000)]
    sensors: u64,
    /// Parallelism of the throughput runs.
    #[arg(long, default_value_t = 1)]
    parallelism: u32,
    /// Seconds between checkpoints (PostgreSQL commits per checkpoint).
    #[arg(long, default_value_t = 1.0)]
    checkpoint_interval: f64,
    /// Latency run: readings per second (all sensors together) and duration.
    #[arg(long, default_value_t = 2_000.0)]
    latency_rate: f64,
    /// Latency run: seconds.
    #[arg(long, default_value_t = 10)]
    latency_secs: u64,
    /// Iceberg run: the warehouse (default: a temporary directory).
    #[arg(long)]
    iceberg_warehouse: Option<String>,
}

fn var(name: &str) -> anyhow::Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set: eval \"$(scripts/services.sh env)\""))
}

fn unique(what: &str) -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("bench_{what}_{}", nanos % 1_000_000_000_000)
}

fn env(args: &Args, dir: &std::path::Path) -> StreamEnv {
    let mut config =
        JobConfig { parallelism: args.parallelism, handle_signals: false, ..JobConfig::default() };
    config.checkpoints.interval = Some(Duration::from_secs_f64(args.checkpoint_interval));
    config.checkpoints.storage.url = dir.join("ckpt").display().to_string();
    StreamEnv::with_config(config)
}

fn generator(args: &Args, rate: f64, records: u64, start_ms: Option<i64>) -> GeneratorConfig {
    GeneratorConfig {
        sensors: args.sensors,
        rate,
        records: Some(records),
        seed: 1,
        faulty_fraction: 0.0,
        splits: 8,
        start_ms,
        event_interval_ms: None,
        outages: Vec::new(),
    }
}

fn readings(env: &StreamEnv, g: GeneratorConfig) -> anyhow::Result<caudal::DataStream<ProcessedReading>> {
    let source = g.build()?;
    let wm = WatermarkStrategy::bounded_out_of_orderness(Duration::from_secs(1), |r: &SensorReading| r.ts);
    Ok(env.source("generator", source, wm).map(to_celsius).filter(is_plausible))
}

fn report(name: &str, records: u64, secs: f64) {
    println!("{name:<28} {records:>10} rows in {secs:>6.2}s = {:>9.0} rows/s", records as f64 / secs);
}

fn postgres(args: &Args) -> anyhow::Result<()> {
    let url = var("CAUDAL_POSTGRES_URL")?;
    let dir = tempfile_dir()?;
    let env = env(args, &dir);
    let mut config = PostgresSinkConfig::new(&url, "readings", &["sensor_id", "ts"]);
    config.schema = unique("pg");
    let schema = config.schema.clone();
    readings(&env, generator(args, 0.0, args.records, None))?
        .sink("pg", move |_| config.build::<ProcessedReading>());
    let start = Instant::now();
    let result = env.execute("bench-postgres")?;
    let secs = start.elapsed().as_secs_f64();
    let written = result.operators.iter().find(|o| o.name == "pg").map_or(0, |o| o.records_in);
    report(&format!("postgres (p={})", args.parallelism), written, secs);
    drop_schema(&url, &schema);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn iceberg(args: &Args) -> anyhow::Result<()> {
    use caudal_operators::iceberg::{metrics, IcebergConfig, IcebergSink};
    let url = var("CAUDAL_POSTGRES_URL")?;
    let dir = tempfile_dir()?;
    let env = env(args, &dir);
    let warehouse =
        args.iceberg_warehouse.clone().unwrap_or_else(|| dir.join("warehouse").display().to_string());
    let mut config = IcebergConfig::new(&url, &warehouse, &format!("{}.readings", unique("lake")));
    config.s3 = JobConfig::default().with_env_overrides()?.checkpoints.storage.s3;
    IcebergSink::new("lake", config).write(readings(&env, generator(args, 0.0, args.records, None))?);
    let start = Instant::now();
    let result = env.execute("bench-iceberg")?;
    let secs = start.elapsed().as_secs_f64();
    let written = result.operators.iter().find(|o| o.name == "lake-writer").map_or(0, |o| o.records_in);
    let committer = result.operators.iter().find(|o| o.name == "lake-committer").context("no committer")?;
    let c = |name: &str| committer.counters.get(name).copied().unwrap_or(0);
    let (commits, files, bytes) =
        (c(metrics::COMMITS).max(1), c(metrics::FILES).max(1), c(metrics::FILE_BYTES));
    report(
        &format!("iceberg (p={}, checkpoint {}s)", args.parallelism, args.checkpoint_interval),
        written,
        secs,
    );
    println!(
        "  {} snapshots, {} files ({:.0} files/min), {:.1} MB per file, commit {:.0} ms on average",
        c(metrics::COMMITS),
        c(metrics::FILES),
        files as f64 / secs * 60.0,
        bytes as f64 / files as f64 / 1e6,
        c(metrics::COMMIT_MS) as f64 / commits as f64
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn drop_schema(url: &str, schema: &str) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
    rt.block_on(async {
        if let Ok((client, conn)) = tokio_postgres::connect(url, tokio_postgres::NoTls).await {
            tokio::spawn(conn);
            let _ = client.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE")).await;
        }
    });
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(unique("serve"));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn redis_config(url: &str, prefix: &str) -> RedisSinkConfig {
    let mut c = RedisSinkConfig::new(url);
    c.key_prefix = prefix.to_string();
    c
}

fn delete_keys(url: &str, prefix: &str) {
    if let Ok(mut c) = redis::Client::open(url).and_then(|c| c.get_connection()) {
        let keys: Vec<String> =
            redis::cmd("KEYS").arg(format!("{prefix}*")).query(&mut c).unwrap_or_default();
        for chunk in keys.chunks(1000) {
            let _: redis::RedisResult<()> = redis::cmd("DEL").arg(chunk).query(&mut c);
        }
    }
}

fn redis_throughput(args: &Args) -> anyhow::Result<()> {
    let url = var("CAUDAL_REDIS_URL")?;
    let dir = tempfile_dir()?;
    let env = env(args, &dir);
    let prefix = format!("{}:sensor:", unique("redis"));
    let config = redis_config(&url, &prefix);
    readings(&env, generator(args, 0.0, args.records, None))?
        .sink("redis", move |_| config.build::<ProcessedReading>());
    let start = Instant::now();
    let result = env.execute("bench-redis")?;
    let secs = start.elapsed().as_secs_f64();
    let written = result.operators.iter().find(|o| o.name == "redis").map_or(0, |o| o.records_in);
    report(&format!("redis (p={})", args.parallelism), written, secs);
    delete_keys(&url, &prefix);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Reading → visible in Redis. The generator runs at wall-clock pace with event time =
/// now, so a hash whose `ts` changes was written `now - ts` ms after its reading was made
/// (plus at most the 1 ms poll period).
fn latency(args: &Args) -> anyhow::Result<()> {
    let url = var("CAUDAL_REDIS_URL")?;
    let dir = tempfile_dir()?;
    let sensors = 100u64;
    let per_sensor = args.latency_rate / sensors as f64;
    let records = (args.latency_rate * args.latency_secs as f64) as u64;
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    };
    let env = env(args, &dir);
    let prefix = format!("{}:sensor:", unique("latency"));
    let config = redis_config(&url, &prefix);
    let g = GeneratorConfig { sensors, ..generator(args, per_sensor, records, Some(now_ms())) };
    readings(&env, g)?.sink("redis", move |_| config.build::<ProcessedReading>());
    let done = Arc::new(AtomicBool::new(false));
    let poller = {
        let (done, url, prefix) = (done.clone(), url.clone(), prefix.clone());
        std::thread::spawn(move || -> anyhow::Result<hdrhistogram::Histogram<u64>> {
            let mut c = redis::Client::open(url.as_str())?.get_connection()?;
            let mut hist = hdrhistogram::Histogram::<u64>::new(3)?;
            let mut last = vec![0i64; sensors as usize];
            let mut pipe = redis::pipe();
            for s in 0..sensors {
                pipe.cmd("HGET").arg(format!("{prefix}{s}")).arg("ts");
            }
            while !done.load(Ordering::Relaxed) {
                let ts: Vec<Option<i64>> = pipe.query(&mut c)?;
                let now = now_ms();
                for (i, t) in ts.into_iter().enumerate() {
                    if let Some(t) = t {
                        if t != last[i] {
                            last[i] = t;
                            hist.record((now - t).max(0) as u64)?;
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(hist)
        })
    };
    env.execute("bench-latency")?;
    done.store(true, Ordering::Relaxed);
    let hist = poller.join().map_err(|_| anyhow::anyhow!("poller panicked"))??;
    println!(
        "reading → Redis visible      {} samples at {:.0} readings/s: p50 {} ms, p99 {} ms, max {} ms",
        hist.len(),
        args.latency_rate,
        hist.value_at_quantile(0.5),
        hist.value_at_quantile(0.99),
        hist.max()
    );
    delete_keys(&url, &prefix);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn job(args: &Args) -> anyhow::Result<()> {
    let (pg_url, redis_url) = (var("CAUDAL_POSTGRES_URL")?, var("CAUDAL_REDIS_URL")?);
    let dir = tempfile_dir()?;
    let env = env(args, &dir);
    let mut pg = PostgresSinkConfig::new(&pg_url, "", &[]);
    pg.schema = unique("job");
    let schema = pg.schema.clone();
    let prefix = format!("{}:sensor:", unique("job"));
    TemperatureJob {
        source: SourceKind::Generator(generator(args, 0.0, args.records, None)),
        window: Duration::from_secs(60),
        out_of_orderness: Duration::from_secs(1),
        sink: SinkKind::Discard,
        serve: ServeSinks {
            postgres: Some(pg),
            redis: Some(redis_config(&redis_url, &prefix)),
            archive: Some(ArchiveConfig::new(dir.join("archive").display().to_string())),
            ..ServeSinks::default()
        },
        silence: None,
        limits: None,
        metadata: None,
    }
    .build(&env)?;
    let start = Instant::now();
    let result = env.execute("bench-job")?;
    let secs = start.elapsed().as_secs_f64();
    let read = result.operators.iter().filter(|o| o.kind == "source").map(|o| o.records_out).sum::<u64>();
    report(&format!("job, all sinks (p={})", args.parallelism), read, secs);
    drop_schema(&pg_url, &schema);
    delete_keys(&redis_url, &prefix);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.mode.is_empty() {
        bail!("no --mode");
    }
    for mode in &args.mode {
        match mode {
            Mode::Postgres => postgres(&args)?,
            Mode::Redis => redis_throughput(&args)?,
            Mode::Latency => latency(&args)?,
            Mode::Job => job(&args)?,
            Mode::Iceberg => iceberg(&args)?,
        }
    }
    Ok(())
}

//! End-to-end throughput runner: runs a pipeline unthrottled into the counting sink and
//! prints records/s, records/s per CPU-core-second, CPU-seconds per million records and
//! peak RSS. Each configuration runs in a child process so RSS and CPU are its own.
//!
//! ```text
//! cargo run --release -p caudal-benches --bin throughput -- --records 20000000 --parallelism 1,2
//! # window state on the heap vs in RocksDB, 100,000 sensors, a checkpoint every 5 s
//! cargo run --release -p caudal-benches --bin throughput -- --pipeline temperature \
//!     --sensors 100000 --state-backend heap,rocksdb --checkpoint-interval 5 --parallelism 1
//! # keyed process functions: ValueState read-modify-write, a timer per record, the alert job
//! cargo run --release -p caudal-benches --bin throughput -- --pipeline count,timers,alerts \
//!     --sensors 10000 --state-backend heap,rocksdb --parallelism 1
//! ```

use anyhow::{bail, Context};
use caudal::process::{KeyedContext, KeyedProcessFunction, Output, ValueStateDescriptor};
use caudal::{JobConfig, StreamEnv, WatermarkStrategy};
use caudal_benches::cpu_seconds;
use caudal_jobs::temperature::{is_plausible, to_celsius, SinkKind, SourceKind, TemperatureJob};
use caudal_operators::generator::{GeneratorConfig, SensorReading};
use caudal_operators::sinks::DiscardSink;
use clap::{Parser, ValueEnum};
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Pipeline {
    /// generator → °C → filter → key_by → 1-minute windows → discard (and readings → discard).
    Temperature,
    /// pre-generated readings in memory → °C → filter → discard: the chained hot path.
    MapFilter,
    /// generator → key_by → a keyed process function: a running count per key in
    /// ValueState, read-modified-written per record (emits nothing).
    Count,
    /// generator → key_by → a keyed process function registering an event-time timer at
    /// ts + 60 s per record; each firing emits one record (every timer fires).
    Timers,
    /// the temperature pipeline with silent-sensor alerts (30 s of silence).
    Alerts,
}

/// A running count per key in ValueState (the `count` pipeline).
#[derive(Clone)]
struct Count(ValueStateDescriptor<u64>);

impl KeyedProcessFunction<i64, SensorReading, u64> for Count {
    fn process_element(
        &mut self,
        _: SensorReading,
        ctx: &mut KeyedContext<'_, i64>,
        _: &mut Output<'_, u64>,
    ) -> caudal::Result<()> {
        let mut count = ctx.value(&self.0);
        let n = count.get()?.unwrap_or(0) + 1;
        count.set(&n)
    }
}

/// A timer per record (the `timers` pipeline).
#[derive(Clone)]
struct TimerPerRecord;

impl KeyedProcessFunction<i64, SensorReading, u64> for TimerPerRecord {
    fn process_element(
        &mut self,
        r: SensorReading,
        ctx: &mut KeyedContext<'_, i64>,
        _: &mut Output<'_, u64>,
    ) -> caudal::Result<()> {
        ctx.register_event_time_timer(r.ts + 60_000)
    }

    fn on_timer(
        &mut self,
        _: caudal::Timestamp,
        _: &mut KeyedContext<'_, i64>,
        out: &mut Output<'_, u64>,
    ) -> caudal::Result<()> {
        out.collect(1);
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Backend {
    /// Keyed state in memory.
    Heap,
    /// Keyed state in RocksDB (the default for jobs).
    Rocksdb,
}

#[derive(Debug, Parser)]
#[command(about = "Caudal end-to-end throughput runner")]
struct Args {
    /// Pipelines to run.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Pipeline::Temperature, Pipeline::MapFilter])]
    pipeline: Vec<Pipeline>,
    /// Readings per run.
    #[arg(long, default_value_t = 20_000_000)]
    records: u64,
    /// Simulated sensors.
    #[arg(long, default_value_t = 10_000)]
    sensors: u64,
    /// Parallelism values to run, comma separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 2])]
    parallelism: Vec<u32>,
    /// Keyed-state backends to run the temperature pipeline on, comma separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Backend::Rocksdb])]
    state_backend: Vec<Backend>,
    /// Seconds between checkpoints (to a fresh local directory); 0 = none.
    #[arg(long, default_value_t = 0.0)]
    checkpoint_interval: f64,
    /// Internal: run one configuration and print its figures.
    #[arg(long, hide = true)]
    child: bool,
}

fn proc_status_kb(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn run_child(args: &Args, pipeline: Pipeline, parallelism: u32, backend: Backend) -> anyhow::Result<()> {
    let (records, sensors) = (args.records, args.sensors);
    // CAUDAL__* settings (batch size, channel capacity, …) apply, as they do to any job.
    let mut config =
        JobConfig { parallelism, handle_signals: false, ..JobConfig::default() }.with_env_overrides()?;
    config.state.kind = match backend {
        Backend::Heap => caudal_checkpoints::BackendKind::Heap,
        Backend::Rocksdb => caudal_checkpoints::BackendKind::Rocksdb,
    };
    let ckpt_dir = std::env::temp_dir().join(format!("caudal-throughput-{}", std::process::id()));
    if args.checkpoint_interval > 0.0 {
        config.checkpoints.interval = Some(Duration::from_secs_f64(args.checkpoint_interval));
        config.checkpoints.storage.url = ckpt_dir.display().to_string();
    }
    let env = StreamEnv::with_config(config);
    let generator = GeneratorConfig {
        sensors,
        rate: 0.0,
        records: Some(records),
        seed: 1,
        faulty_fraction: 0.01,
        splits: 8,
        start_ms: None,
        event_interval_ms: None,
        outages: Vec::new(),
    };
    match pipeline {
        Pipeline::Temperature => TemperatureJob {
            source: SourceKind::Generator(generator),
            window: Duration::from_secs(60),
            out_of_orderness: Duration::from_secs(1),
            sink: SinkKind::Discard,
            serve: Default::default(),
            silence: None,
            limits: None,
            metadata: None,
        }
        .build(&env)?,
        Pipeline::Alerts => TemperatureJob {
            source: SourceKind::Generator(generator),
            window: Duration::from_secs(60),
            out_of_orderness: Duration::from_secs(1),
            sink: SinkKind::Discard,
            serve: Default::default(),
            silence: Some(Duration::from_secs(30)),
            limits: None,
            metadata: None,
        }
        .build(&env)?,
        Pipeline::Count | Pipeline::Timers => {
            let watermarks =
                WatermarkStrategy::bounded_out_of_orderness(Duration::from_secs(1), |r: &SensorReading| r.ts);
            let keyed = env
                .source("generator", generator.build()?, watermarks)
                .key_by(|r: &SensorReading| r.sensor_id);
            let out = if pipeline == Pipeline::Count {
                keyed.process(Count(ValueStateDescriptor::new("count")))
            } else {
                keyed.process(TimerPerRecord)
            };
            out.sink("discard", |_| Ok(DiscardSink::default()));
        }
        Pipeline::MapFilter => {
            let g = generator.build()?;
            let mut readings = Vec::with_capacity(records as usize);
            'outer: for k in 0..g.splits() {
                for n in 0..g.split_records(k).unwrap_or(0) {
                    readings.push(g.record(k, n, g.split_sensors(k)));
                    if readings.len() as u64 >= records {
                        break 'outer;
                    }
                }
            }
            // One in-memory source subtask per parallel pipeline.
            let mut streams = Vec::new();
            let chunk = readings.len().div_ceil(parallelism as usize).max(1);
            for (i, part) in readings.chunks(chunk).enumerate() {
                streams.push(env.from_iter(&format!("memory-{i}"), part.to_vec()));
            }
            for s in streams {
                s.map(to_celsius).filter(is_plausible).sink("discard", |_| Ok(DiscardSink::default()));
            }
        }
    }
    let cpu0 = cpu_seconds();
    let start = Instant::now();
    let result = env.execute("throughput")?;
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let read = result.operators.iter().filter(|o| o.kind == "source").map(|o| o.records_out).sum::<u64>();
    let completed = result.checkpoints.iter().filter(|c| c.status == "COMPLETED").count();
    let _ = std::fs::remove_dir_all(&ckpt_dir);
    println!(
        "{{\"records\":{read},\"seconds\":{secs:.3},\"cpu_seconds\":{cpu:.3},\"peak_rss_kb\":{},\"checkpoints\":{completed}}}",
        proc_status_kb("VmHWM:")
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.child {
        let (Some(&pipeline), Some(&p), Some(&backend)) =
            (args.pipeline.first(), args.parallelism.first(), args.state_backend.first())
        else {
            bail!("--child needs one pipeline, one parallelism and one state backend");
        };
        return run_child(&args, pipeline, p, backend);
    }
    let exe = std::env::current_exe()?;
    println!(
        "{:<12} {:>7} {:>3} {:>12} {:>8} {:>14} {:>16} {:>14} {:>10} {:>6}",
        "pipeline",
        "state",
        "p",
        "records",
        "secs",
        "records/s",
        "rec/s per core",
        "CPU-s per 1M",
        "peak RSS",
        "chkpts"
    );
    let runs = args.pipeline.iter().flat_map(|&pl| {
        let backends =
            if pl == Pipeline::MapFilter { vec![Backend::Heap] } else { args.state_backend.clone() };
        args.parallelism.iter().flat_map(move |&p| backends.clone().into_iter().map(move |b| (pl, p, b)))
    });
    for (pipeline, p, backend) in runs {
        {
            let name = format!("{pipeline:?}").to_lowercase();
            let state = format!("{backend:?}").to_lowercase();
            let out = Command::new(&exe)
                .args(["--child", "--pipeline", &name.replace("mapfilter", "map-filter")])
                .args(["--parallelism", &p.to_string(), "--state-backend", &state])
                .args(["--records", &args.records.to_string(), "--sensors", &args.sensors.to_string()])
                .args(["--checkpoint-interval", &args.checkpoint_interval.to_string()])
                .output()
                .context("running a child")?;
            if !out.status.success() {
                bail!("child failed: {}", String::from_utf8_lossy(&out.stderr));
            }
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("child output")?;
            let records = v["records"].as_f64().unwrap_or(0.0);
            let secs = v["seconds"].as_f64().unwrap_or(1.0);
            let cpu = v["cpu_seconds"].as_f64().unwrap_or(0.0);
            let cores_used = (cpu / secs).max(0.01);
            println!(
                "{:<12} {:>7} {:>3} {:>12} {:>8.2} {:>14.0} {:>16.0} {:>14.3} {:>7} MB {:>6}",
                name,
                state,
                p,
                records,
                secs,
                records / secs,
                records / secs / cores_used,
                cpu / (records / 1e6),
                v["peak_rss_kb"].as_u64().unwrap_or(0) / 1024,
                v["checkpoints"].as_u64().unwrap_or(0)
            );
        }
    }
    Ok(())
}

//! Load check of the REST API: the temperature pipeline runs unthrottled over a bounded
//! input while N clients poll the API as the job page does (every endpoint the UI reads,
//! `/metrics`, the state and transactions endpoints, and a key lookup in the window
//! state), and the job's throughput is compared with a run without clients. Runs alternate
//! (without, with, without, with, …) and the medians are compared, so a noisy neighbour
//! hits both sides. Wall-clock throughput on a shared machine is noisy, so each run also
//! reports the process's CPU-seconds per million readings (the job, the server and the
//! clients, which would run elsewhere in production: an upper bound of what serving costs);
//! on a machine the job saturates, the throughput loss is about the relative CPU increase.
//!
//! ```text
//! cargo run --release -p caudal-benches --bin api_load -- --clients 50 --records 4000000 --runs 3
//! # the cost of latency markers: the same without clients, markers off vs every 200 ms
//! cargo run --release -p caudal-benches --bin api_load -- --clients 0 --latency-marker-ms 0,200
//! ```

use anyhow::Context;
use caudal::{JobConfig, StreamEnv};
use caudal_jobs::temperature::{SinkKind, SourceKind, TemperatureJob};
use caudal_operators::generator::GeneratorConfig;
use clap::Parser;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(about = "Throughput of the temperature job with and without N clients polling its REST API")]
struct Args {
    /// Concurrent API clients in the loaded runs.
    #[arg(long, default_value_t = 50)]
    clients: usize,
    /// Milliseconds between two polls of one client (the UI polls every 1000).
    #[arg(long, default_value_t = 1000)]
    poll_ms: u64,
    /// Readings per run.
    #[arg(long, default_value_t = 4_000_000)]
    records: u64,
    /// Sensors (keys of the window state).
    #[arg(long, default_value_t = 1000)]
    sensors: u64,
    /// Parallelism of the job.
    #[arg(long, default_value_t = 2)]
    parallelism: u32,
    /// Pairs of runs (without and with clients).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Leave the state lookup out of each poll (it is answered by the window task itself).
    #[arg(long)]
    no_lookup: bool,
    /// Internal: be the clients' process of a run, polling the server at this address until
    /// stdin closes.
    #[arg(long, hide = true)]
    clients_for: Option<SocketAddr>,
    /// Latency marker intervals to compare, ms (0: off), e.g. `0,200`; each gets its runs.
    #[arg(long, value_delimiter = ',', default_value = "200")]
    latency_marker_ms: Vec<u64>,
}

/// What the clients did during one run.
#[derive(Debug, Default)]
struct ClientStats {
    requests: AtomicU64,
    errors: AtomicU64,
}

/// The paths one poll reads (the job page's, plus `/metrics`, the state browser and a lookup).
fn poll_paths(job: &str, sensor: u64, lookup: bool) -> Vec<String> {
    let j = format!("/api/v1/jobs/{job}");
    let mut paths: Vec<String> = vec![
        "/api/v1/jobs".into(),
        j.clone(),
        format!("{j}/metrics?history=120"),
        format!("{j}/watermarks"),
        format!("{j}/checkpoints"),
        format!("{j}/kafka?history=120"),
        format!("{j}/state"),
        format!("{j}/transactions"),
        "/metrics".into(),
    ];
    if lookup {
        paths.push(format!("{j}/operators/window-stats/state?key={sensor}"));
    }
    paths
}

struct ClientSettings {
    poll: Duration,
    sensors: u64,
    lookup: bool,
}

fn client(addr: SocketAddr, id: usize, settings: &ClientSettings, stop: &AtomicBool, stats: &ClientStats) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    // Wait for the server (it starts with the job), as a browser would retry.
    while agent.get(format!("http://{addr}/api/v1/jobs")).call().is_err() {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let sensor = (id as u64 * 31 + round) % settings.sensors.max(1);
        for path in poll_paths("api-load", sensor, settings.lookup) {
            let answer = agent.get(format!("http://{addr}{path}")).call();
            if stop.load(Ordering::Relaxed) {
                return; // the job ended: its server with it
            }
            match answer {
                // 404: a sensor without an open window at that instant; still a served request.
                Ok(mut r) if r.status() == 200 || r.status() == 404 => {
                    let _ = r.body_mut().read_to_vec();
                    stats.requests.fetch_add(1, Ordering::Relaxed);
                }
                Ok(r) => {
                    stats.errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("client {id}: GET {path}: {}", r.status());
                }
                Err(e) => {
                    stats.errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("client {id}: GET {path}: {e}");
                    break;
                }
            }
        }
        round += 1;
        if let Some(rest) = settings.poll.checked_sub(started.elapsed()) {
            std::thread::sleep(rest);
        }
    }
}

struct RunResult {
    records_per_sec: f64,
    requests: u64,
    errors: u64,
    secs: f64,
    /// CPU seconds of the web server's thread and of the clients' process during the run.
    server_cpu: f64,
    clients_cpu: f64,
    /// CPU seconds of the job's process (tasks and server) per million readings.
    cpu_per_million: f64,
}

/// User + system CPU seconds of this process's threads whose name starts with `prefix`
/// (from /proc/self/task; a thread's name is its `comm`, at most 15 bytes).
fn threads_cpu(prefix: &str) -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0.0 };
    let mut total = 0.0;
    for t in tasks.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.trim_end().starts_with(prefix) {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
        let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        total += (ticks(11) + ticks(12)) / 100.0;
    }
    total
}

fn run(args: &Args, clients: usize, marker: Option<Duration>) -> anyhow::Result<RunResult> {
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let generator = GeneratorConfig {
        sensors: args.sensors,
        rate: 0.0,
        records: Some(args.records),
        seed: 1,
        faulty_fraction: 0.01,
        splits: 8,
        start_ms: None,
        event_interval_ms: None,
        outages: Vec::new(),
    };
    let job = TemperatureJob {
        source: SourceKind::Generator(generator),
        window: Duration::from_secs(60),
        out_of_orderness: Duration::from_secs(1),
        sink: SinkKind::Discard,
        serve: Default::default(),
        silence: None,
        limits: None,
        metadata: None,
    };
    let config = JobConfig {
        parallelism: args.parallelism,
        handle_signals: false,
        web_bind: Some(addr),
        latency_marker_interval: marker,
        ..JobConfig::default()
    };
    let env = StreamEnv::with_config(config);
    job.build(&env)?;
    let stop = Arc::new(AtomicBool::new(false));
    // The clients run in a child process (this binary with --clients-for), so that this
    // process's CPU is the job's and its server's only.
    let child = if clients > 0 {
        let mut cmd = std::process::Command::new(std::env::current_exe()?);
        cmd.args(["--clients-for", &addr.to_string(), "--clients", &clients.to_string()])
            .args(["--poll-ms", &args.poll_ms.to_string(), "--sensors", &args.sensors.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        if args.no_lookup {
            cmd.arg("--no-lookup");
        }
        Some(cmd.spawn().context("starting the clients' process")?)
    } else {
        None
    };
    let cpu_before = caudal_benches::cpu_seconds();
    let started = Instant::now();
    // The server's thread exists only while `execute` runs: sample its CPU just before the end.
    let server_cpu = Arc::new(parking_cpu::Last::default());
    let sampler = {
        let (server_cpu, stop) = (server_cpu.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                server_cpu.set(threads_cpu("caudal-web"));
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let result = env.execute("api-load");
    let secs = started.elapsed().as_secs_f64();
    let cpu = caudal_benches::cpu_seconds() - cpu_before;
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    // Closing its stdin stops the clients' process; it prints `requests errors cpu_seconds`.
    let (mut requests, mut errors, mut clients_cpu) = (0, 0, 0.0);
    if let Some(mut child) = child {
        drop(child.stdin.take());
        let out = child.wait_with_output().context("waiting for the clients' process")?;
        let text = String::from_utf8_lossy(&out.stdout);
        let f: Vec<&str> = text.split_whitespace().collect();
        requests = f.first().and_then(|v| v.parse().ok()).unwrap_or(0);
        errors = f.get(1).and_then(|v| v.parse().ok()).unwrap_or(0);
        clients_cpu = f.get(2).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    }
    let result = result.context("the job failed")?;
    let records = result.operator("sensor-generator").map_or(0, |o| o.records_out);
    Ok(RunResult {
        records_per_sec: records as f64 / secs,
        requests,
        errors,
        secs,
        server_cpu: server_cpu.get(),
        clients_cpu,
        cpu_per_million: cpu / (records.max(1) as f64 / 1e6),
    })
}

/// The last value a sampler saw.
mod parking_cpu {
    use std::sync::atomic::{AtomicU64, Ordering};

    #[derive(Default)]
    pub(crate) struct Last(AtomicU64);

    impl Last {
        pub(crate) fn set(&self, v: f64) {
            if v > 0.0 {
                self.0.store(v.to_bits(), Ordering::Relaxed);
            }
        }
        pub(crate) fn get(&self) -> f64 {
            f64::from_bits(self.0.load(Ordering::Relaxed))
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return 0.0;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The clients' process: `clients` threads poll `addr` until stdin closes, then it prints
/// `requests errors cpu_seconds`.
fn clients_process(args: &Args, addr: SocketAddr) {
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(ClientStats::default());
    let threads: Vec<_> = (0..args.clients)
        .map(|id| {
            let (stop, stats) = (stop.clone(), stats.clone());
            let settings = ClientSettings {
                poll: Duration::from_millis(args.poll_ms),
                sensors: args.sensors,
                lookup: !args.no_lookup,
            };
            std::thread::spawn(move || client(addr, id, &settings, &stop, &stats))
        })
        .collect();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    println!(
        "{} {} {:.3}",
        stats.requests.load(Ordering::Relaxed),
        stats.errors.load(Ordering::Relaxed),
        caudal_benches::cpu_seconds()
    );
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(addr) = args.clients_for {
        clients_process(&args, addr);
        return Ok(());
    }
    println!(
        "temperature job, {} readings, {} sensors, parallelism {}; loaded runs: {} clients polling every {} ms",
        args.records, args.sensors, args.parallelism, args.clients, args.poll_ms
    );
    for &marker_ms in &args.latency_marker_ms {
        let marker = (marker_ms > 0).then(|| Duration::from_millis(marker_ms));
        let (mut quiet, mut loaded) = (Vec::new(), Vec::new());
        let (mut quiet_cpu, mut loaded_cpu) = (Vec::new(), Vec::new());
        for i in 0..args.runs {
            let q = run(&args, 0, marker)?;
            println!(
                "  markers {marker_ms:>4} ms, run {}: no clients  {:>12.0} rec/s ({:.1} s, {:.3} CPU-s per M)",
                i + 1,
                q.records_per_sec,
                q.secs,
                q.cpu_per_million
            );
            quiet.push(q.records_per_sec);
            quiet_cpu.push(q.cpu_per_million);
            if args.clients > 0 {
                let l = run(&args, args.clients, marker)?;
                println!(
                    "  markers {marker_ms:>4} ms, run {}: {} clients {:>12.0} rec/s ({:.1} s, {} requests = {:.0}/s, \
                     {} errors; CPU: server {:.2} s, clients {:.2} s, {:.3} CPU-s per M)",
                    i + 1,
                    args.clients,
                    l.records_per_sec,
                    l.secs,
                    l.requests,
                    l.requests as f64 / l.secs,
                    l.errors,
                    l.server_cpu,
                    l.clients_cpu,
                    l.cpu_per_million
                );
                loaded.push(l.records_per_sec);
                loaded_cpu.push(l.cpu_per_million);
            }
        }
        let (q, qc) = (median(quiet), median(quiet_cpu));
        if args.clients > 0 {
            let (l, lc) = (median(loaded), median(loaded_cpu));
            println!(
                "markers {marker_ms} ms: median {q:.0} rec/s without clients, {l:.0} rec/s with {} clients: {:+.1} %; \
                 CPU per million readings {qc:.3} s vs {lc:.3} s: {:+.1} %",
                args.clients,
                (l / q - 1.0) * 100.0,
                (lc / qc - 1.0) * 100.0
            );
        } else {
            println!("markers {marker_ms} ms: median {q:.0} rec/s, {qc:.3} CPU-s per million readings");
        }
    }
    Ok(())
}

//! The operator state browser through the REST API, against the temperature job's window
//! operator (`window-stats`: key by sensor, 1-minute tumbling windows, `TempStats`) running
//! embedded, on RocksDB and on the heap backend.
//!
//! A scripted source emits a first phase of readings (all in the first minute, so no window
//! fires), waits, emits a second phase, waits again, then ends. While it waits the test
//! looks up sensors and checks count/min/max/sum against the input; after the second phase
//! the same lookup shows the new readings (the state is live, not the last checkpoint's);
//! when the job ends, the fired windows must equal what the lookup returned.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use caudal::testing::CollectSink;
use caudal::{JobConfig, Result, Source, SourceContext, SourceOutput, SourcePoll, SourceReader, StreamEnv};
use caudal::{StopHandle, WatermarkStrategy};
use caudal_checkpoints::{BackendKind, StateBackendConfig};
use caudal_jobs::temperature::{is_plausible, names, to_celsius, ProcessedReading, TempAcc, TempStats};
use caudal_operators::generator::SensorReading;
use caudal_operators::window::{KeyedWindowExt, WindowAssigner, WindowResult};
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SENSORS: i64 = 25;

/// The readings of phase 1 or 2: every sensor, several readings each, one implausible one
/// (filtered out before the windows) in phase 1.
fn phase(n: usize) -> Vec<SensorReading> {
    let mut out = Vec::new();
    for i in 0..(if n == 1 { 4 } else { 2 }) {
        for s in 0..SENSORS {
            let temp_f = 20.0 + ((s * 7 + i * 13 + n as i64 * 31) % 90) as f64 + 0.25 * i as f64;
            let ts = 1_000 + (n as i64 - 1) * 20_000 + i * 1_000 + s;
            out.push(SensorReading { sensor_id: s, ts, lat: 0.0, lon: 0.0, temp_f });
        }
    }
    if n == 1 {
        out.push(SensorReading { sensor_id: 7, ts: 5_000, lat: 0.0, lon: 0.0, temp_f: 9_000.0 });
    }
    out
}

/// What the window of `sensor` must hold after `phases` phases.
fn expected(sensor: i64, phases: usize) -> TempAcc {
    let mut acc = TempAcc { count: 0, min: f64::INFINITY, max: f64::NEG_INFINITY, sum: 0.0 };
    for n in 1..=phases {
        for r in phase(n).into_iter().filter(|r| r.sensor_id == sensor).map(to_celsius) {
            if is_plausible(&r) {
                acc.count += 1;
                acc.min = acc.min.min(r.temp_c);
                acc.max = acc.max.max(r.temp_c);
                acc.sum += r.temp_c;
            }
        }
    }
    acc
}

/// Emits phase 1, then phase 2 once `allowed` reaches 2, then ends once it reaches 3.
struct Scripted {
    allowed: Arc<AtomicUsize>,
}

impl Source for Scripted {
    type Out = SensorReading;
    fn create_reader(
        &self,
        ctx: &SourceContext,
        _: &[Vec<u8>],
    ) -> Result<Box<dyn SourceReader<SensorReading>>> {
        let emits = ctx.subtask == 0;
        Ok(Box::new(ScriptedReader { allowed: self.allowed.clone(), emits, done: 0, pending: Vec::new() }))
    }
}

struct ScriptedReader {
    allowed: Arc<AtomicUsize>,
    /// Only subtask 0 emits; the others follow the script empty-handed.
    emits: bool,
    /// Phases emitted.
    done: usize,
    pending: Vec<SensorReading>,
}

impl SourceReader<SensorReading> for ScriptedReader {
    fn splits(&self) -> usize {
        1
    }
    fn poll(&mut self, out: &mut SourceOutput<'_, SensorReading>) -> Result<SourcePoll> {
        if self.pending.is_empty() {
            let allowed = self.allowed.load(Ordering::SeqCst);
            if self.done >= 2 && allowed >= 3 {
                return Ok(SourcePoll::Finished);
            }
            if self.done >= allowed || self.done >= 2 {
                return Ok(SourcePoll::Pending(Duration::from_millis(10)));
            }
            self.done += 1;
            self.pending = if self.emits { phase(self.done) } else { Vec::new() };
            self.pending.reverse();
        }
        while out.capacity_left() > 0 {
            match self.pending.pop() {
                Some(r) => out.collect(0, r),
                None => break,
            }
        }
        Ok(SourcePoll::Ready)
    }
}

fn start(
    job: &str,
    addr: SocketAddr,
    kind: BackendKind,
    allowed: Arc<AtomicUsize>,
    dir: &std::path::Path,
    sink: CollectSink<WindowResult<i64, TempAcc>>,
    cache_entries: usize,
) -> (StopHandle, std::thread::JoinHandle<Result<caudal::JobResult>>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let job = job.to_string();
    let dir = dir.to_path_buf();
    let runner = std::thread::spawn(move || {
        let config = JobConfig {
            parallelism: 2,
            handle_signals: false,
            web_bind: Some(addr),
            state: StateBackendConfig {
                kind,
                cache_entries: Some(cache_entries),
                ..StateBackendConfig::default()
            },
            state_dir: Some(dir),
            ..JobConfig::default()
        };
        let env = StreamEnv::with_config(config);
        let watermarks =
            WatermarkStrategy::bounded_out_of_orderness(Duration::from_secs(1), |r: &SensorReading| r.ts);
        env.source("readings", Scripted { allowed }, watermarks)
            .map(to_celsius)
            .name(names::TO_CELSIUS)
            .filter(is_plausible)
            .name(names::ANOMALY_FILTER)
            .key_by(|r: &ProcessedReading| r.sensor_id)
            .window(WindowAssigner::tumbling(Duration::from_secs(60)))
            .name(names::WINDOWS)
            .aggregate(TempStats)
            .sink("collect", move |_| Ok(sink.clone()));
        let _ = tx.send(env.stop_handle());
        env.execute(&job)
    });
    let stop = rx.recv_timeout(Duration::from_secs(30)).expect("the job did not build");
    (stop, runner)
}

struct Api {
    base: String,
    agent: ureq::Agent,
}

impl Api {
    fn get(&self, path: &str) -> (u16, Value) {
        let mut r = self.agent.get(format!("{}{path}", self.base)).call().expect("the server answers");
        let status = r.status().as_u16();
        let body = r.body_mut().read_to_string().unwrap();
        (status, serde_json::from_str(&body).unwrap_or(Value::String(body)))
    }

    fn ok(&self, path: &str) -> Value {
        let (status, body) = self.get(path);
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    /// Asserts `GET path` fails with `status` and an error naming `needle`.
    fn error(&self, path: &str, status: u16, needle: &str) {
        let (s, body) = self.get(path);
        assert_eq!(s, status, "GET {path}: {body}");
        let msg = body["error"].as_str().unwrap_or_else(|| panic!("no JSON error body for {path}: {body}"));
        assert!(msg.contains(needle), "GET {path}: `{msg}` does not name `{needle}`");
    }

    fn wait_records_in(&self, job: &str, want: u64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let (200, m) = self.get(&format!("/api/v1/jobs/{job}/metrics")) {
                let op =
                    m["operators"].as_array().unwrap().iter().find(|o| o["name"] == names::WINDOWS).cloned();
                if op.is_some_and(|o| o["records_in"].as_u64() == Some(want)) {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "the windows did not receive {want} records");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn assert_acc(got: &Value, want: &TempAcc, what: &str) {
    assert_eq!(got["count"].as_u64(), Some(want.count), "{what}: count in {got}");
    assert_eq!(got["min"].as_f64(), Some(want.min), "{what}: min in {got}");
    assert_eq!(got["max"].as_f64(), Some(want.max), "{what}: max in {got}");
    assert!((got["sum"].as_f64().unwrap() - want.sum).abs() < 1e-9, "{what}: sum in {got}");
}

fn plausible_count(phases: usize) -> u64 {
    (1..=phases).flat_map(phase).map(to_celsius).filter(is_plausible).count() as u64
}

/// `cache_entries`: the window operator's cache; smaller than its keys, lookups of evicted
/// keys read the backend, else the cache.
fn browse_state_of_running_window_operator(kind: BackendKind, job: &str, cache_entries: usize) {
    let addr = caudal_test_stack::free_addr();
    let dir = tempfile::tempdir().unwrap();
    let allowed = Arc::new(AtomicUsize::new(1));
    let (sink, windows) = CollectSink::new();
    let (stop, runner) = start(job, addr, kind, allowed.clone(), dir.path(), sink, cache_entries);
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        .timeout_global(Some(Duration::from_secs(15)))
        .build()
        .into();
    let api = Api { base: format!("http://{addr}"), agent };
    let deadline = Instant::now() + Duration::from_secs(30);
    while api.agent.get(format!("{}/api/v1/jobs", api.base)).call().is_err() {
        assert!(Instant::now() < deadline, "the web server did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
    api.wait_records_in(job, plausible_count(1));
    let op = format!("/api/v1/jobs/{job}/operators/{}/state", names::WINDOWS);

    // Which operators have state: the window operator, both subtasks, all key groups.
    let overview = api.ok(&format!("/api/v1/jobs/{job}/state"));
    let ops = overview["operators"].as_array().unwrap();
    assert_eq!(ops.len(), 1, "{overview}");
    assert_eq!(ops[0]["operator"], names::WINDOWS);
    let subtasks = ops[0]["subtasks"].as_array().unwrap();
    assert_eq!(subtasks.len(), 2);
    assert_eq!(subtasks[0]["key_group_start"], 0);
    assert_eq!(subtasks[1]["key_group_end"], 128);

    // A lookup returns the open window's accumulator, equal to the input's statistics.
    for sensor in [0, 7, 24] {
        let v = api.ok(&format!("{op}?key={sensor}"));
        assert_eq!(v["key"], sensor, "{v}");
        let entries = v["entries"].as_array().unwrap();
        assert_eq!(entries.len(), 1, "{v}");
        assert_eq!(entries[0]["state"], "window");
        assert_eq!(entries[0]["key"], sensor);
        let w = &entries[0]["value"]["windows"];
        assert_eq!(w.as_array().unwrap().len(), 1, "{v}");
        assert_eq!((w[0]["start"].as_i64(), w[0]["end"].as_i64()), (Some(0), Some(60_000)));
        assert_eq!(w[0]["fired"], false);
        assert_acc(&w[0]["accumulator"], &expected(sensor, 1), &format!("sensor {sensor}, phase 1"));
        assert!(entries[0]["value_bytes"].as_u64().unwrap() > 0);
    }

    // Sizes: one entry per sensor over all key groups, one row per key group.
    let sizes = api.ok(&format!("{op}/sizes"));
    assert_eq!(sizes["entries"].as_u64(), Some(SENSORS as u64), "{sizes}");
    let groups = sizes["key_groups"].as_array().unwrap();
    assert_eq!(groups.len(), 128);
    assert!(sizes["bytes"].as_u64().unwrap() > 0);

    // Listing a key group page by page (1 entry a page) finds exactly its entries, each of
    // which a lookup finds in that key group.
    let busiest = groups.iter().max_by_key(|g| g["entries"].as_u64()).unwrap();
    let kg = busiest["key_group"].as_u64().unwrap();
    let mut seen = Vec::new();
    let mut after = String::new();
    loop {
        let page = api.ok(&format!("{op}/keys?key_group={kg}&limit=1{after}"));
        assert_eq!(page["subtask"], busiest["subtask"]);
        for e in page["entries"].as_array().unwrap() {
            seen.push(e["key"].as_i64().unwrap());
        }
        match page["next"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
        assert!(seen.len() <= SENSORS as usize, "paging does not end");
    }
    assert_eq!(seen.len() as u64, busiest["entries"].as_u64().unwrap(), "{seen:?}");
    for key in &seen {
        assert_eq!(api.ok(&format!("{op}?key={key}"))["key_group"].as_u64(), Some(kg));
    }

    // Errors: unknown job, operator or key → 404; an operator without keyed state → 404;
    // malformed parameters → 400 naming the parameter.
    api.error(&format!("/api/v1/jobs/nope/operators/{}/state?key=1", names::WINDOWS), 404, "nope");
    api.error(&format!("/api/v1/jobs/{job}/operators/nope/state?key=1"), 404, "nope");
    api.error(
        &format!("/api/v1/jobs/{job}/operators/{}/state?key=1", names::TO_CELSIUS),
        404,
        "no keyed state",
    );
    api.error(&format!("{op}?key=99999"), 404, "99999");
    api.error(&format!("{op}?key=abc"), 400, "`key`");
    api.error(&op, 400, "`key`");
    api.error(&format!("{op}/keys"), 400, "`key_group`");
    api.error(&format!("{op}/keys?key_group=x"), 400, "`key_group`");
    api.error(&format!("{op}/keys?key_group=128"), 400, "`key_group`");
    api.error(&format!("{op}/keys?key_group=0&limit=0"), 400, "`limit`");
    api.error(&format!("{op}/keys?key_group=0&after=zz"), 400, "`after`");
    api.error(&format!("{op}/sizes?x=1"), 400, "`x`");

    // Live: phase 2's readings show in the next lookup.
    allowed.store(2, Ordering::SeqCst);
    api.wait_records_in(job, plausible_count(2));
    let v = api.ok(&format!("{op}?key=7"));
    let live = v["entries"][0]["value"]["windows"][0]["accumulator"].clone();
    assert_acc(&live, &expected(7, 2), "sensor 7, phase 2");

    // The end fires every window: each equals the state the lookup showed.
    allowed.store(3, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !runner.is_finished() {
        assert!(Instant::now() < deadline, "the job did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
    runner.join().unwrap().expect("the job ends cleanly");
    drop(stop);
    let windows = windows.lock();
    assert_eq!(windows.len(), SENSORS as usize);
    let fired = windows.iter().find(|w| w.key == 7).unwrap();
    assert_eq!(fired.value.count, live["count"].as_u64().unwrap());
    assert_eq!(fired.value.min, live["min"].as_f64().unwrap());
    assert_eq!(fired.value.max, live["max"].as_f64().unwrap());
    for w in windows.iter() {
        let want = expected(w.key, 2);
        assert_eq!(
            (w.value.count, w.value.min, w.value.max),
            (want.count, want.min, want.max),
            "sensor {}",
            w.key
        );
    }
}

#[test]
fn state_browser_reads_live_window_state_on_rocksdb() {
    // 25 sensors over 2 subtasks, 4 cached each: most lookups read RocksDB.
    browse_state_of_running_window_operator(BackendKind::Rocksdb, "state-api-rocksdb", 4);
}

#[test]
fn state_browser_reads_live_window_state_on_heap() {
    // Every key cached: lookups answer from the operator's cache.
    browse_state_of_running_window_operator(BackendKind::Heap, "state-api-heap", 10_000);
}

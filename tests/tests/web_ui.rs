//! The web UI in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`, installed by `scripts/install-deps.sh`) driven over WebDriver,
//! against the real temperature pipeline run embedded with `web_bind`.
//!
//! Screenshots of each page land in `target/ui-screenshots/` (or
//! `$CAUDAL_ARTIFACTS/ui-screenshots/`).

// Test helpers fail the test by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// The Kafka tests' helpers (stack addresses, topic creation, producing).
#[path = "../../jobs/tests/kafka_support/mod.rs"]
mod kafka_support;

// A job manager and task managers as processes (tests/tests/cluster_support).
mod cluster_support;

use caudal::{JobConfig, StopHandle, StreamEnv};
use caudal_jobs::temperature::{SinkKind, SourceKind, TemperatureJob};
use caudal_operators::generator::GeneratorConfig;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use caudal_test_stack::free_addr;

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

fn artifacts() -> PathBuf {
    let root = match std::env::var_os("CAUDAL_ARTIFACTS") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")), std::path::PathBuf::from)
            .join("..")
            .join("target"),
    };
    let dir = root.join("ui-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The first of `candidates` that exists, else whatever `which name` finds.
fn find_binary(env_var: &str, candidates: &[&str], name: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env_var) {
        return Some(PathBuf::from(p)).filter(|p| p.exists());
    }
    if let Some(p) = candidates.iter().map(PathBuf::from).find(|p| p.exists()) {
        return Some(p);
    }
    let out = Command::new("which").arg(name).output().ok()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !path.is_empty()).then(|| PathBuf::from(path))
}

/// A WebDriver session on a chromedriver this test started (ended on drop).
struct Browser {
    driver: Child,
    base: String,
    session: String,
    agent: ureq::Agent,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn start() -> Browser {
        let missing = |what: &str| -> ! {
            panic!(
                "{what} not found: the web UI tests need Debian's chromium and chromium-driver. \
                 Run scripts/install-deps.sh (or set CHROMIUM / CHROMEDRIVER to their paths)."
            )
        };
        let chromium =
            find_binary("CHROMIUM", &["/usr/bin/chromium", "/usr/bin/chromium-browser"], "chromium")
                .unwrap_or_else(|| missing("chromium"));
        let chromedriver = find_binary("CHROMEDRIVER", &["/usr/bin/chromedriver"], "chromedriver")
            .unwrap_or_else(|| missing("chromedriver"));
        let port = free_addr().port();
        let driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", chromedriver.display()));
        let profile = tempfile::tempdir().unwrap();
        let mut b = Browser {
            driver,
            base: format!("http://127.0.0.1:{port}"),
            session: String::new(),
            agent: agent(),
            _profile: profile,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = b.agent.get(format!("{}/status", b.base)).call().ok().and_then(|mut r| {
                r.body_mut().read_json::<Value>().ok().map(|v| v["value"]["ready"] == true)
            });
            if ready == Some(true) {
                break;
            }
            assert!(Instant::now() < deadline, "chromedriver did not become ready on port {port}");
            std::thread::sleep(Duration::from_millis(100));
        }
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
            "--window-size=1360,1000",
            "--force-device-scale-factor=1",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("--user-data-dir={}", b._profile.path().display())])
        .collect::<Vec<_>>();
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": chromium.to_string_lossy(), "args": args },
        }}});
        let v = b.call("POST", "/session", Some(caps));
        b.session = v["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {v}")).to_string();
        b
    }

    /// A WebDriver command; returns its `value`.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.base);
        let resp = match (method, body) {
            ("GET", _) => self.agent.get(&url).call(),
            ("DELETE", _) => self.agent.delete(&url).call(),
            (_, Some(b)) => self.agent.post(&url).send_json(b),
            (_, None) => self.agent.post(&url).send_json(json!({})),
        };
        let mut resp = resp.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = resp.status();
        let v: Value = resp.body_mut().read_json().unwrap_or(Value::Null);
        assert!(status.is_success(), "{method} {path}: {status} {v}");
        v["value"].clone()
    }

    fn session(&self, path: &str) -> String {
        format!("/session/{}{path}", self.session)
    }

    fn goto(&self, url: &str) {
        self.call("POST", &self.session("/url"), Some(json!({ "url": url })));
    }

    /// Run `script` (a function body) in the page; returns what it returns.
    fn eval(&self, script: &str) -> Value {
        self.call("POST", &self.session("/execute/sync"), Some(json!({ "script": script, "args": [] })))
    }

    /// Poll `script` until it returns something truthy; returns that.
    fn wait_for(&self, what: &str, script: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.eval(script);
            let truthy = !matches!(&v, Value::Null | Value::Bool(false))
                && v.as_array().is_none_or(|a| !a.is_empty())
                && v.as_str().is_none_or(|s| !s.is_empty());
            if truthy {
                return v;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what} (last: {v})");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn resize(&self, width: u64, height: u64) {
        self.call("POST", &self.session("/window/rect"), Some(json!({ "width": width, "height": height })));
    }

    /// A PNG of the viewport, written to `path`.
    fn screenshot(&self, path: &Path) {
        let v = self.call("GET", &self.session("/screenshot"), None);
        let png = base64_decode(v.as_str().expect("screenshot is base64"));
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        std::fs::write(path, png).unwrap();
    }

    /// The whole page: grow the window to the document's height first.
    fn full_page_screenshot(&self, path: &Path) {
        let h = self.eval("return document.documentElement.scrollHeight;").as_u64().unwrap_or(1000);
        self.resize(1360, h.clamp(600, 6000) + 120);
        std::thread::sleep(Duration::from_millis(1_500)); // one refresh at the new size
        self.screenshot(path);
        self.resize(1360, 1000);
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.agent.delete(format!("{}/session/{}", self.base, self.session)).call();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for v in s.bytes().filter_map(val) {
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// The temperature pipeline, unbounded and throttled, serving its UI on `addr`.
/// The temperature job's detail from the REST API at `base`, if it answers 200.
fn detail(http: &ureq::Agent, base: &str) -> Option<Value> {
    let mut r = http.get(format!("{base}/api/v1/jobs/temperature")).call().ok()?;
    if r.status() != 200 {
        return None;
    }
    r.body_mut().read_json().ok()
}

/// Polls the job's detail until `done` holds (at most 20 s); returns it.
fn wait_for_detail(http: &ureq::Agent, base: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = detail(http, base).filter(|v| done(v)) {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what} on {base}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn start_temperature(
    addr: SocketAddr,
) -> (StopHandle, std::thread::JoinHandle<caudal::Result<caudal::JobResult>>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let runner = std::thread::spawn(move || {
        let job = TemperatureJob {
            source: SourceKind::Generator(GeneratorConfig {
                sensors: 40,
                rate: 25.0,
                records: None,
                seed: 7,
                faulty_fraction: 0.02,
                splits: 4,
                start_ms: None,
                event_interval_ms: None,
                outages: Vec::new(),
            }),
            window: Duration::from_secs(5),
            out_of_orderness: Duration::from_secs(1),
            sink: SinkKind::Discard,
            serve: Default::default(),
            silence: None,
            limits: None,
            metadata: None,
        };
        let config =
            JobConfig { parallelism: 2, handle_signals: false, web_bind: Some(addr), ..JobConfig::default() };
        let env = StreamEnv::with_config(config);
        job.build(&env)?;
        let _ = tx.send(env.stop_handle());
        env.execute("temperature")
    });
    let stop = rx.recv_timeout(Duration::from_secs(30)).expect("the job did not build");
    (stop, runner)
}

#[test]
fn job_page_shows_every_operator_and_live_rates_in_chromium() {
    let addr = free_addr();
    let (stop, runner) = start_temperature(addr);
    let stop_on_panic = StopOnDrop(Some(stop));
    let base = format!("http://{addr}");
    let http = agent();
    let detail = wait_for_detail(&http, &base, "the job's web server", |_| true);
    let mut operators: Vec<String> = detail["operators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap().to_string())
        .collect();
    operators.sort();
    assert!(operators.len() >= 6, "{operators:?}");

    let shots = artifacts();
    let browser = Browser::start();

    // Overview: the job is listed, running, with a link to its page.
    browser.goto(&format!("{base}/"));
    let listed = browser.wait_for(
        "the job list",
        "const a = document.querySelector('#jobs a'); return a ? a.textContent : null;",
        Duration::from_secs(20),
    );
    assert_eq!(listed, "temperature");
    browser.wait_for(
        "the job's input rate",
        "const c = document.querySelectorAll('#jobs tbody td'); return c.length > 5 && c[5].textContent !== '—';",
        Duration::from_secs(20),
    );
    assert!(browser.eval("return document.querySelector('#jobs .badge').textContent;") == "RUNNING");
    // An embedded job has no task managers: the card stays hidden.
    assert!(browser.eval("return document.querySelector('#tms-card').hidden;") == true);
    browser.screenshot(&shots.join("overview.png"));

    // Job page: the graph has every operator, labelled, with its partitioning on edges.
    browser.goto(&format!("{base}/jobs/temperature"));
    let drawn = browser.wait_for(
        "the operator graph",
        "return Array.from(document.querySelectorAll('#job-graph .op-node')).map(g => g.dataset.operator);",
        Duration::from_secs(20),
    );
    let mut drawn: Vec<String> =
        drawn.as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
    drawn.sort();
    assert_eq!(drawn, operators, "every operator is a box of the graph");
    let svg_text = browser.eval("return document.querySelector('#job-graph').textContent;");
    for name in &operators {
        assert!(svg_text.as_str().unwrap().contains(name.as_str()), "graph text lacks {name}");
    }
    let labels = browser.eval(
        "return Array.from(document.querySelectorAll('#job-graph .edge-label text')).map(t => t.textContent);",
    );
    let labels: Vec<&str> = labels.as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(labels.len(), detail["edges"].as_array().unwrap().len(), "{labels:?}");
    assert!(labels.contains(&"hash"), "key_by shows as a hash edge: {labels:?}");
    let chained = browser.eval("return document.querySelectorAll('#job-graph .edge-label.chained').length;");
    let want = detail["edges"].as_array().unwrap().iter().filter(|e| e["chained"] == true).count();
    assert_eq!(chained.as_u64().unwrap() as usize, want, "chained edges are marked");

    // Rates: after a few samples every operator has a line with several points, and the
    // source's box shows a non-zero rate.
    let points = browser.wait_for(
        "the rates chart",
        "const p = Array.from(document.querySelectorAll('#rates-chart path.series'));
         const n = p.map(e => (e.getAttribute('d').match(/L/g) || []).length + 1);
         return p.length > 0 && Math.min(...n) >= 3 ? n : null;",
        Duration::from_secs(30),
    );
    assert_eq!(points.as_array().unwrap().len(), operators.len(), "one line per operator");
    let source_rate = browser.wait_for(
        "a source rate in the graph",
        "const g = document.querySelector('#job-graph .op-node[data-operator=\"sensor-generator\"] .op-rate');
         return g && !g.textContent.startsWith('0 ') && !g.textContent.startsWith('—') ? g.textContent : null;",
        Duration::from_secs(20),
    );
    assert!(source_rate.as_str().unwrap().ends_with("rec/s"), "{source_rate}");

    // Tables: operators, watermarks (event time flows), empty checkpoints, no failures.
    let rows = browser.eval("return document.querySelectorAll('#operators tbody tr').length;");
    assert_eq!(rows.as_u64().unwrap() as usize, operators.len());
    browser.wait_for(
        "an event-time watermark at the windows",
        "const r = document.querySelector('#watermarks tr[data-operator=\"window-stats\"]');
         return r && /\\d\\d:\\d\\d:\\d\\d/.test(r.children[1].textContent);",
        Duration::from_secs(30),
    );
    let cp = browser.eval("return document.querySelector('#checkpoints-table').textContent;");
    assert!(cp.as_str().unwrap().contains("No checkpoints yet"), "{cp}");
    let failures = browser.eval("return document.querySelector('#failures').textContent;");
    assert!(failures.as_str().unwrap().contains("No failures"), "{failures}");
    assert_eq!(browser.eval("return document.querySelector('#live').classList.contains('ok');"), true);

    // Latency: every operator after the source shows p50 / p99 / max, in that order.
    let latency = browser.wait_for(
        "latency of the windows",
        "const c = document.querySelector('#operators tr[data-operator=\"window-stats\"] td.latency[data-max]');
         return c ? [Number(c.dataset.p50), Number(c.dataset.p99), Number(c.dataset.max), c.textContent] : null;",
        Duration::from_secs(20),
    );
    let l = latency.as_array().unwrap();
    let (p50, p99, max) = (l[0].as_f64().unwrap(), l[1].as_f64().unwrap(), l[2].as_f64().unwrap());
    assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{latency}");
    assert_eq!(l[3].as_str().unwrap().matches(" / ").count(), 2, "{latency}");

    // Operator state: the panel offers the window operator; its key-group sizes are drawn;
    // a bar lists the keys of its key group; a key's lookup shows its open window.
    browser.wait_for(
        "the state panel with the window operator",
        "const c = document.querySelector('#state-card');
         return c && !c.hidden && document.querySelector('#state-operator').value === 'window-stats';",
        Duration::from_secs(20),
    );
    let looked_up = browser.wait_for(
        "a sensor's window in the state panel",
        "const row = document.querySelector('#state-result .state-window td[data-field=\"count\"]');
         if (row) return row.textContent;
         const key = document.querySelector('#state-keys [data-key]');
         if (key) { key.click(); return null; }
         const bars = Array.from(document.querySelectorAll('#state-sizes .kg-bar'));
         const busiest = bars.sort((a, b) => b.getAttribute('height') - a.getAttribute('height'))[0];
         if (busiest) busiest.dispatchEvent(new MouseEvent('click', { bubbles: true }));
         else document.querySelector('#state-sizes-btn').click();
         return null;",
        Duration::from_secs(30),
    );
    let count: u64 = looked_up.as_str().unwrap().replace(',', "").parse().unwrap();
    assert!(count >= 1, "an open window holds at least one reading: {looked_up}");
    let header = browser.eval("return document.querySelector('#state-result .state-found b').textContent;");
    assert!(header.as_str().unwrap().starts_with("Key "), "{header}");
    browser.eval("document.querySelector('#state-card').scrollIntoView(); return null;");
    browser.screenshot(&shots.join("state.png"));

    // Subtasks expand on click.
    browser.eval("document.querySelector('#operators [data-toggle]').click(); return null;");
    browser.wait_for(
        "subtask rows",
        "return document.querySelectorAll('#operators tr.sub').length > 0;",
        Duration::from_secs(5),
    );
    browser.screenshot(&shots.join("job.png"));
    browser.full_page_screenshot(&shots.join("job-full.png"));

    // Cancel from the UI: the job stops cleanly and its server goes with it.
    browser.eval("window.confirm = () => true; document.querySelector('#cancel-btn').click(); return null;");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !runner.is_finished() {
        assert!(Instant::now() < deadline, "the job did not stop after Cancel");
        std::thread::sleep(Duration::from_millis(50));
    }
    let result = runner.join().unwrap().expect("the job ends cleanly");
    assert!(result.operator("sensor-generator").unwrap().records_out > 0);
    browser.wait_for(
        "the disconnected state",
        "return document.querySelector('#live').classList.contains('bad');",
        Duration::from_secs(10),
    );
    drop(stop_on_panic);
}

#[test]
fn kafka_lag_panel_shows_every_partition_in_chromium() {
    let Some(stack) = kafka_support::stack() else { return };
    let topic = kafka_support::unique("lag-ui");
    kafka_support::create_topic(&stack, &topic, 2);
    let records = [30i64, 50];
    for (p, n) in records.iter().enumerate() {
        let batch: Vec<(Vec<u8>, Vec<u8>)> =
            (0..*n).map(|i| (vec![], format!("{{\"n\":{i}}}").into_bytes())).collect();
        kafka_support::produce_raw(&stack, &topic, p as i32, &batch);
    }
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let config = JobConfig {
        parallelism: 1,
        handle_signals: false,
        web_bind: Some(addr),
        state_dir: Some(dir.path().join("state")),
        checkpoints: caudal::CheckpointConfig {
            interval: Some(Duration::from_millis(500)),
            storage: caudal_checkpoints::CheckpointStorageConfig {
                url: dir.path().join("checkpoints").display().to_string(),
                ..Default::default()
            },
            ..Default::default()
        },
        ..JobConfig::default()
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let mut source = caudal_operators::kafka::KafkaSourceConfig::new(&stack.brokers, &topic);
    source.properties.push(("fetch.min.bytes".into(), "2000".into()));
    // The readings are also written exactly-once into `out_topic`; the gate on a second
    // branch can hold a checkpoint open, so that a pre-committed transaction stays listed.
    let out_topic = kafka_support::unique("txn-ui");
    kafka_support::create_topic(&stack, &out_topic, 1);
    let mut sink = caudal_operators::kafka::KafkaSinkConfig::new(&stack.brokers, &out_topic)
        .transaction_timeout(Duration::from_secs(900));
    sink.transactional_id_prefix = Some(kafka_support::unique("txn-ui"));
    sink.properties.push(("linger.ms".into(), "7".into()));
    let gate = Gate(Arc::new(AtomicBool::new(true)));
    let _open_on_drop = OpenOnDrop(gate.0.clone());
    let job_gate = gate.clone();
    let runner = std::thread::spawn(move || {
        let env = StreamEnv::with_config(config);
        let readings = env.source(
            "readings",
            caudal_operators::kafka::KafkaSource::<Value>::json(source),
            caudal::WatermarkStrategy::none(),
        );
        readings.clone().sink("discard", |_| Ok(caudal::testing::CollectSink::new().0));
        readings.clone().sink("kafka-out", move |_| {
            Ok(caudal_operators::kafka::KafkaSink::new(sink.clone(), caudal_operators::kafka::JsonSerializer))
        });
        readings
            .rebalance()
            .transform("gate", move |_| Ok(job_gate.clone()))
            .sink("gated", |_| Ok(caudal::testing::CollectSink::new().0));
        let _ = tx.send(env.stop_handle());
        env.execute("kafka-lag-ui")
    });
    let stop = StopOnDrop(Some(rx.recv_timeout(Duration::from_secs(30)).expect("the job did not build")));

    let browser = Browser::start();
    browser.goto(&format!("http://{addr}/jobs/kafka-lag-ui"));
    // One row per partition with its end offset, and the lag down to 0 once checkpointed.
    let rows = browser.wait_for(
        "the lag table at 0 with every end offset",
        "const rows = Array.from(document.querySelectorAll('#kafka-card:not([hidden]) #kafka tbody tr'));
         const t = document.querySelector('#kafka-total');
         return rows.length && t && t.textContent === '0'
           ? rows.map(r => [r.dataset.partition, r.children[3].textContent, r.children[5].textContent]) : null;",
        Duration::from_secs(60),
    );
    let want: Vec<Value> =
        records.iter().enumerate().map(|(p, n)| json!([p.to_string(), n.to_string(), "0"])).collect();
    assert_eq!(rows, Value::Array(want));
    // Bytes in the operators table: the source's are the values it read (keys are empty),
    // the Kafka sink's bytes out are positive, an in-process sink serializes nothing.
    let read: usize =
        records.iter().map(|n| (0..*n).map(|i| format!("{{\"n\":{i}}}").len()).sum::<usize>()).sum();
    let bytes = browser.wait_for(
        "bytes in and out in the operators table",
        "const cell = (op, c) => document.querySelector(`#operators tr[data-operator=\"${op}\"] td.${c}`);
         const r = cell('readings', 'bytes-in'), k = cell('kafka-out', 'bytes-out'), d = cell('discard', 'bytes-in');
         return r && k && d && Number(k.dataset.bytes) > 0
           ? [Number(r.dataset.bytes), r.textContent.includes('B'), d.textContent] : null;",
        Duration::from_secs(30),
    );
    assert_eq!(bytes, json!([read, true, "—"]));
    // Each partition's watermark in the source (record timestamps here).
    browser.wait_for(
        "a watermark per partition",
        "const w = Array.from(document.querySelectorAll('#kafka td.kafka-wm'));
         return w.length === 2 && w.every(c => c.textContent !== '—' && c.textContent !== '');",
        Duration::from_secs(20),
    );
    // The chart: a line per partition once the sampler has a few points.
    let lines = browser.wait_for(
        "a lag line per partition",
        "const p = Array.from(document.querySelectorAll('#kafka-chart path.series'));
         return p.length === 2 && p.every(e => (e.getAttribute('d').match(/L/g) || []).length >= 2)
           ? p.map(e => e.dataset.partition) : null;",
        Duration::from_secs(30),
    );
    assert_eq!(lines, json!(["0", "1"]));
    let legend = browser.eval("return document.querySelector('#kafka-legend').textContent;");
    assert!(legend.as_str().unwrap().contains("partition 1"), "{legend}");
    // Broker health: every partition read or written, one replica, in sync.
    let health = browser.wait_for(
        "broker health of the source's and the sink's partitions",
        "const rows = Array.from(document.querySelectorAll('#kafka-health-table tbody tr'));
         return rows.length === 3 && rows.every(r => r.children[5].textContent === '1' && r.children[6].textContent === '0')
           ? rows.map(r => [r.dataset.kind, r.dataset.partition, r.children[4].textContent, r.children[6].textContent,
                            r.children[7].textContent, r.children[8].textContent]) : null;",
        Duration::from_secs(30),
    );
    assert_eq!(
        health,
        json!([
            ["source", "0", "1", "0", "0", "in sync"],
            ["source", "1", "1", "0", "0", "in sync"],
            ["sink", "0", "1", "0", "0", "in sync"]
        ]),
        "(replicas, ISR shrinks, ISR expands, state)"
    );
    // The sink's producers: a row per broker, requests counted, no errors on a healthy one.
    let producers = browser.wait_for(
        "the sink's producers per broker",
        "const rows = Array.from(document.querySelectorAll('#kafka-producers-table tbody tr'));
         return rows.length && rows.every(r => Number(r.children[4].textContent) > 0)
           ? rows.map(r => [r.children[0].textContent, r.children[5].textContent, r.children[8].textContent]) : null;",
        Duration::from_secs(30),
    );
    assert_eq!(producers, json!([["kafka-out", "0", "0"]]), "(sink, errors, disconnects)");
    let summary = browser.eval("return document.querySelector('#kafka-health p').textContent;");
    assert!(summary.as_str().unwrap().contains("every partition in sync"), "{summary}");
    // The effective client settings: the properties given, Caudal's own, librdkafka's
    // defaults of the rest that matter, without the per-producer transactional id.
    let settings = browser.wait_for(
        "the effective client settings",
        "const s = (op, client, key) => { const r = document.querySelector(
           `#kafka-clients details[data-operator='${op}'][data-client='${client}'] tr[data-setting='${key}']`);
           return r ? r.children[1].textContent : null; };
         const v = [s('kafka-out', 'producer', 'linger.ms'), s('kafka-out', 'producer', 'acks'),
           s('kafka-out', 'producer', 'enable.idempotence'), s('kafka-out', 'producer', 'batch.size'),
           s('kafka-out', 'producer', 'transactional.id'), s('readings', 'consumer', 'fetch.min.bytes'),
           s('readings', 'consumer', 'isolation.level'), s('readings', 'consumer', 'queued.min.messages')];
         return v[0] ? v : null;",
        Duration::from_secs(30),
    );
    let got: Vec<Option<&str>> = settings.as_array().unwrap().iter().map(|v| v.as_str()).collect();
    assert_eq!(got[..3], [Some("7"), Some("all"), Some("true")], "{settings}");
    assert!(got[3].is_some_and(|b| b.parse::<u64>().is_ok()), "batch.size, a default: {settings}");
    assert_eq!(got[4], None, "the transactional id is per producer: {settings}");
    assert_eq!(got[5..7], [Some("2000"), Some("read_committed")], "{settings}");
    assert!(got[7].is_some_and(|n| n.parse::<u64>().is_ok()), "queued.min.messages, a default: {settings}");
    browser.eval("window.scrollTo(0, document.querySelector('#kafka-card').offsetTop - 70); return null;");
    browser.screenshot(&artifacts().join("kafka-lag.png"));
    // Checkpoints: a bar per checkpoint in the duration chart, rows with their alignment, and
    // the job's settings in the header.
    let bars = browser.wait_for(
        "checkpoint bars",
        "const b = document.querySelectorAll('#checkpoint-chart rect.ckpt-bar');
         const rows = document.querySelectorAll('#checkpoints tbody tr');
         return b.length >= 1 && rows.length >= 1 ? [b.length, rows[0].children.length] : null;",
        Duration::from_secs(30),
    );
    assert_eq!(
        bars[1], 10,
        "ID, status, triggered, duration, alignment, sync, upload, size, incremental, failure"
    );
    let settings = browser.eval("return document.querySelector('#checkpoint-counts').textContent;");
    assert!(settings.as_str().unwrap().contains("file://"), "{settings}");
    browser
        .eval("window.scrollTo(0, document.querySelector('#checkpoints-card').offsetTop - 70); return null;");
    browser.screenshot(&artifacts().join("checkpoints.png"));

    // Sink transactions: with the gate closed, new readings are pre-committed at the next
    // barrier and wait there (the gate holds the checkpoint open), listed with their age.
    gate.0.store(false, Ordering::SeqCst);
    let batch: Vec<(Vec<u8>, Vec<u8>)> =
        (0..7).map(|i| (vec![], format!("{{\"n\":{i}}}").into_bytes())).collect();
    kafka_support::produce_raw(&stack, &topic, 0, &batch);
    let row = browser.wait_for(
        "a pre-committed transaction in the table",
        "const r = document.querySelector('#txn-card:not([hidden]) #transactions tr[data-state=\"pre_committed\"]');
         return r ? Array.from(r.children).map(c => c.textContent) : null;",
        Duration::from_secs(60),
    );
    let cells: Vec<&str> = row.as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    assert_eq!(cells[0], "kafka-out", "{cells:?}");
    assert!(cells[5].starts_with("pre-committed"), "{cells:?}");
    assert_eq!(cells[6], "7", "{cells:?}");
    assert!(cells[7].contains(" / 15m"), "age against the 900 s timeout: {cells:?}");
    browser.eval("window.scrollTo(0, document.querySelector('#txn-card').offsetTop - 70); return null;");
    browser.screenshot(&artifacts().join("kafka-transactions.png"));
    gate.0.store(true, Ordering::SeqCst);
    browser.wait_for(
        "the transaction committed",
        "return document.querySelectorAll('#transactions tr[data-state]').length === 0;",
        Duration::from_secs(60),
    );

    drop(stop);
    runner.join().unwrap().expect("the job ends cleanly");
}

/// Holds every batch while closed.
#[derive(Clone)]
struct Gate(Arc<AtomicBool>);

impl caudal::Operator for Gate {
    type In = Value;
    type Out = Value;
    fn process_batch(
        &mut self,
        mut b: caudal::Batch<Value>,
        out: &mut caudal::Batch<Value>,
        _: &mut caudal::OperatorContext,
    ) -> caudal::Result<()> {
        while !self.0.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
        out.append(&mut b);
        Ok(())
    }
}

/// A job manager's overview lists its task managers: slots in use, executors, heartbeat age.
#[test]
fn task_managers_of_a_job_manager_in_chromium() {
    let mut c = cluster_support::Cluster::start(&[]);
    c.start_taskmanager("tm-ui-1", 2);
    c.start_taskmanager("tm-ui-2", 1);
    c.wait_for_task_managers(2);
    let browser = Browser::start();
    browser.goto(&c.url());
    let names = browser.wait_for(
        "both task managers in the table",
        "const rows = [...document.querySelectorAll('#task-managers tbody tr')];
         return rows.length === 2 ? rows.map((r) => r.cells[0].textContent + ' ' + r.cells[2].textContent) : null;",
        Duration::from_secs(20),
    );
    let mut names: Vec<String> =
        names.as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
    names.sort();
    assert_eq!(names, ["tm-ui-1 0 / 2", "tm-ui-2 0 / 1"]);
    let meta = browser.eval("return document.querySelector('#tms-meta').textContent;");
    assert!(meta.as_str().unwrap().contains("0 of 3 slots in use"), "{meta}");
    let heartbeat =
        browser.eval("return document.querySelector('#task-managers tbody tr').cells[4].textContent;");
    assert!(heartbeat.as_str().unwrap().ends_with("ms ago"), "{heartbeat}");
    browser.full_page_screenshot(&artifacts().join("task-managers.png"));
}

/// Opens the gate when the test ends, panicking or not, so the job can stop.
struct OpenOnDrop(Arc<AtomicBool>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Stops the job if the test panics before it cancels it.
struct StopOnDrop(Option<StopHandle>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            s.stop();
        }
    }
}

/// Serves `html` to every request on `listener` (a page of another origin), until the test ends.
fn serve_page(listener: std::net::TcpListener, html: String) {
    use std::io::{Read, Write};
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{html}",
                html.len()
            );
        }
    });
}

/// A page of another origin that the user visits while the job runs tries what any page can:
/// a form POST and a `fetch` to stop or cancel the job (simple requests, no preflight), and a
/// JSON `fetch` (which needs a preflight the server never grants). None gets through: the job
/// is still running afterwards.
#[test]
fn a_page_of_another_origin_cannot_stop_or_cancel_a_job_in_chromium() {
    let addr = free_addr();
    let (stop, _runner) = start_temperature(addr);
    let _stop_on_panic = StopOnDrop(Some(stop));
    let base = format!("http://{addr}");
    let http = agent();
    let status =
        |http: &ureq::Agent| detail(http, &base).and_then(|v| v["status"].as_str().map(str::to_string));
    wait_for_detail(&http, &base, "the job running", |v| v["status"] == "RUNNING");
    let evil = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let evil_url = format!("http://{}/", evil.local_addr().unwrap());
    let job = format!("{base}/api/v1/jobs/temperature");
    serve_page(
        evil,
        format!(
            r#"<!doctype html><html><body>
<iframe name="sink"></iframe>
<form id="f" method="POST" action="{job}/cancel" enctype="text/plain" target="sink">
  <input name='{{"savepoint":' value='null}}'></form>
<script>
window.results = [];
const post = (what, path, type) => fetch("{job}" + path, {{
    method: "POST", mode: what === "json" ? "cors" : "no-cors",
    headers: {{ "Content-Type": type }}, body: "{{}}" }})
  .then(r => results.push(what + ":" + r.type + ":" + r.status))
  .catch(e => results.push(what + ":blocked"));
post("text-stop", "/stop", "text/plain");
post("text-cancel", "/cancel", "text/plain");
post("json", "/cancel", "application/json");
document.getElementById("f").submit();
</script></body></html>"#
        ),
    );
    let browser = Browser::start();
    browser.goto(&evil_url);
    let results = browser.wait_for(
        "the page's three requests",
        "return window.results && window.results.length === 3 ? window.results.slice().sort() : null;",
        Duration::from_secs(20),
    );
    let results: Vec<String> =
        results.as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
    // Simple requests go out (their answers are opaque to the page); the JSON one never
    // passes its preflight.
    assert!(results.contains(&"json:blocked".to_string()), "{results:?}");
    std::thread::sleep(Duration::from_millis(1500)); // the form post and the stop would act by now
    assert_eq!(
        status(&http).as_deref(),
        Some("RUNNING"),
        "a page of another origin stopped the job: {results:?}"
    );
    browser.full_page_screenshot(&artifacts().join("cross-origin-refused.png"));
}

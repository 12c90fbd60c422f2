//! The REST API against a running embedded job: every endpoint, its values and its errors.

// Test helpers fail the test by panicking.
#![allow(clippy::unwrap_used)]

use caudal::{
    Batch, JobConfig, OperatorContext, Result, Sink, Source, SourceContext, SourceOutput, SourcePoll,
};
use caudal::{SourceReader, StreamEnv, WatermarkStrategy};
use serde_json::Value;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const JOB: &str = "web-api-test";

/// Emits `per_sec` records per second per subtask, stamped with the wall clock.
struct Ticks {
    per_sec: u64,
}

impl Source for Ticks {
    type Out = u64;
    fn create_reader(&self, ctx: &SourceContext, _: &[Vec<u8>]) -> Result<Box<dyn SourceReader<u64>>> {
        Ok(Box::new(TickReader {
            per_sec: self.per_sec,
            start: Instant::now(),
            sent: 0,
            base: ctx.subtask as u64,
        }))
    }
}

struct TickReader {
    per_sec: u64,
    start: Instant,
    sent: u64,
    base: u64,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

impl SourceReader<u64> for TickReader {
    fn splits(&self) -> usize {
        1
    }
    fn poll(&mut self, out: &mut SourceOutput<'_, u64>) -> Result<SourcePoll> {
        let due = (self.start.elapsed().as_secs_f64() * self.per_sec as f64) as u64;
        let n = due.saturating_sub(self.sent).min(out.capacity_left() as u64);
        for i in 0..n {
            out.collect(0, self.base + 2 * (self.sent + i));
        }
        self.sent += n;
        Ok(if n == 0 { SourcePoll::Pending(Duration::from_millis(5)) } else { SourcePoll::Ready })
    }
}

struct Pass;
impl caudal::Operator for Pass {
    type In = u64;
    type Out = u64;
    fn process_batch(
        &mut self,
        mut b: Batch<u64>,
        out: &mut Batch<u64>,
        _: &mut OperatorContext,
    ) -> Result<()> {
        out.append(&mut b);
        Ok(())
    }
}

struct Discard;
impl Sink for Discard {
    type In = u64;
    fn write_batch(&mut self, _: Batch<u64>, _: &mut OperatorContext) -> Result<()> {
        Ok(())
    }
}

use caudal_test_stack::free_addr;

/// ticks (p2) → double (chained) → hash → pass (p3) → count (chained).
fn job(addr: SocketAddr) -> StreamEnv {
    let config =
        JobConfig { parallelism: 2, handle_signals: false, web_bind: Some(addr), ..JobConfig::default() };
    let env = StreamEnv::with_config(config);
    let wm = WatermarkStrategy::bounded_out_of_orderness(Duration::ZERO, |_: &u64| now_ms());
    env.source("ticks", Ticks { per_sec: 2_000 }, wm)
        .map(|n| n * 2)
        .name("double")
        .key_by(|n: &u64| n % 16)
        .transform("pass", |_| Ok(Pass))
        .parallelism(3)
        .sink("count", |_| Ok(Discard))
        .parallelism(3);
    env
}

/// A GET naming `host` in its Host header, over a plain TCP connection (an HTTP client
/// library sets the header itself); the whole answer.
fn raw_get(addr: SocketAddr, path: &str, host: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
}

struct Client {
    base: String,
    agent: ureq::Agent,
}

struct Reply {
    status: u16,
    content_type: String,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
    /// A 4xx with `{ "error": "..." }`; returns the message.
    fn error(&self, status: u16) -> String {
        assert_eq!(self.status, status, "{}", self.body);
        assert!(self.content_type.starts_with("application/json"), "{}", self.content_type);
        self.json()["error"].as_str().unwrap_or_else(|| panic!("no error field: {}", self.body)).to_string()
    }
}

impl Client {
    fn new(addr: SocketAddr) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .proxy(None)
            .timeout_global(Some(Duration::from_secs(5)))
            .build()
            .into();
        Client { base: format!("http://{addr}"), agent }
    }
    fn finish(mut r: ureq::http::Response<ureq::Body>) -> Reply {
        let content_type =
            r.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let body = r.body_mut().read_to_string().unwrap();
        Reply { status: r.status().as_u16(), content_type, body }
    }
    fn get(&self, path: &str) -> Reply {
        Self::finish(self.agent.get(format!("{}{path}", self.base)).call().unwrap())
    }
    fn post(&self, path: &str) -> Reply {
        let request = self.agent.post(format!("{}{path}", self.base)).content_type("application/json");
        Self::finish(request.send("{}").unwrap())
    }
    fn post_json(&self, path: &str, body: &str) -> Reply {
        let request = self.agent.post(format!("{}{path}", self.base)).content_type("application/json");
        Self::finish(request.send(body).unwrap())
    }
    fn ok(&self, path: &str) -> Value {
        let r = self.get(path);
        assert_eq!(r.status, 200, "GET {path}: {}", r.body);
        r.json()
    }
    fn wait_up(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(r) = self.agent.get(format!("{}/api/v1/jobs", self.base)).call() {
                if r.status() == 200 {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "the web server did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn op<'a>(ops: &'a Value, name: &str) -> &'a Value {
    ops.as_array().unwrap().iter().find(|o| o["name"] == name).unwrap_or_else(|| panic!("no operator {name}"))
}

#[test]
fn every_endpoint_against_a_running_job() {
    let addr = free_addr();
    let runner = std::thread::spawn(move || job(addr).execute(JOB));
    let c = Client::new(addr);
    c.wait_up();

    // --- job list and its filter
    let jobs = c.ok("/api/v1/jobs");
    assert_eq!(jobs["jobs"].as_array().unwrap().len(), 1, "{jobs}");
    let j = &jobs["jobs"][0];
    assert_eq!(j["name"], JOB);
    assert_eq!(j["status"], "RUNNING");
    assert_eq!(j["operators"], 4);
    assert_eq!(j["tasks"], 2);
    assert!((j["start_ms"].as_i64().unwrap() - now_ms()).abs() < 60_000, "{j}");
    assert_eq!(c.ok("/api/v1/jobs?status=running")["jobs"].as_array().unwrap().len(), 1);
    assert_eq!(c.ok("/api/v1/jobs?status=FINISHED")["jobs"].as_array().unwrap().len(), 0);
    let e = c.get("/api/v1/jobs?status=sleeping").error(400);
    assert!(e.contains("`status`") && e.contains("sleeping") && e.contains("RUNNING"), "{e}");
    let e = c.get("/api/v1/jobs?colour=red").error(400);
    assert!(e.contains("`colour`"), "{e}");

    // --- detail: plan, chaining, partitioning, tasks, failures
    let d = c.ok(&format!("/api/v1/jobs/{JOB}"));
    assert_eq!(d["status"], "RUNNING");
    let names: Vec<&str> =
        d["operators"].as_array().unwrap().iter().map(|o| o["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["ticks", "double", "pass", "count"]);
    assert_eq!(op(&d["operators"], "ticks")["parallelism"], 2);
    assert_eq!(op(&d["operators"], "pass")["parallelism"], 3);
    assert_eq!(op(&d["operators"], "double")["task"], op(&d["operators"], "ticks")["id"]);
    let edges = d["edges"].as_array().unwrap();
    assert_eq!(edges.len(), 3);
    assert!(edges
        .iter()
        .any(|e| e["from"] == 0 && e["to"] == 1 && e["partitioning"] == "forward" && e["chained"] == true));
    assert!(edges
        .iter()
        .any(|e| e["from"] == 1 && e["to"] == 2 && e["partitioning"] == "hash" && e["chained"] == false));
    let tasks = d["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2);
    assert_eq!(tasks[1]["operators"], serde_json::json!([2, 3]));
    assert_eq!(d["failures"], serde_json::json!([]));

    // --- unknown job: 404 with a JSON body, on every job endpoint
    for path in ["", "/metrics", "/watermarks", "/checkpoints", "/kafka", "/transactions", "/state"] {
        let e = c.get(&format!("/api/v1/jobs/no-such-job{path}")).error(404);
        assert!(e.contains("no-such-job"), "{e}");
    }
    assert!(c.post("/api/v1/jobs/no-such-job/cancel").error(404).contains("no-such-job"));
    assert!(c.get("/api/v1/nothing-here").error(404).contains("/api/v1/nothing-here"));
    // malformed input: 400 naming the parameter; a wrong method: 405, both in JSON
    assert!(c.get("/api/v1/jobs/%FF%FE").error(400).contains("`name`"));
    assert!(c.get(&format!("/api/v1/jobs/{JOB}/metrics?history=abc")).error(400).contains("`history`"));
    assert!(c.get(&format!("/api/v1/jobs/{JOB}/metrics?history=100000")).error(400).contains("`history`"));
    assert!(c.get(&format!("/api/v1/jobs/{JOB}/watermarks?x=1")).error(400).contains("`x`"));
    assert!(c.get(&format!("/api/v1/jobs/{JOB}/cancel")).error(405).contains("GET"));

    // --- metrics: counts grow between two polls, rates from the sampler
    std::thread::sleep(Duration::from_millis(2_200));
    let m1 = c.ok(&format!("/api/v1/jobs/{JOB}/metrics"));
    std::thread::sleep(Duration::from_millis(1_200));
    let m2 = c.ok(&format!("/api/v1/jobs/{JOB}/metrics?history=60"));
    let out = |m: &Value, name: &str| op(&m["operators"], name)["records_out"].as_u64().unwrap();
    assert!(
        out(&m2, "ticks") > out(&m1, "ticks"),
        "records out did not grow: {} then {}",
        out(&m1, "ticks"),
        out(&m2, "ticks")
    );
    assert!(out(&m2, "count") > out(&m1, "count"));
    let ticks = op(&m2["operators"], "ticks");
    assert_eq!(ticks["parallelism"], 2);
    let subs = ticks["subtasks"].as_array().unwrap();
    assert_eq!(subs.len(), 2);
    assert_eq!(
        subs.iter().map(|s| s["records_out"].as_u64().unwrap()).sum::<u64>(),
        ticks["records_out"].as_u64().unwrap()
    );
    // 2 subtasks × 2000/s; generous bounds for a loaded machine
    let rate = ticks["records_out_per_sec"].as_f64().unwrap();
    assert!((500.0..20_000.0).contains(&rate), "ticks rate {rate}");
    let pass = op(&m2["operators"], "pass");
    assert_eq!(pass["subtasks"].as_array().unwrap().len(), 3);
    assert!(pass["records_in_per_sec"].as_f64().unwrap() > 0.0);
    let busy = pass["busy_ratio"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&busy), "{busy}");
    assert!(pass["backpressured_ratio"].as_f64().is_some());
    assert!(pass["watermark"].as_i64().is_some(), "{pass}");
    assert_eq!(m2["sample_interval_ms"], 1000);
    assert!(m1.get("history").is_none(), "history only when asked for");
    let h = &m2["history"];
    let points = h["at_ms"].as_array().unwrap().len();
    assert!(points >= 2, "{h}");
    let series = op(&h["operators"], "ticks");
    assert_eq!(series["records_out_per_sec"].as_array().unwrap().len(), points);
    assert!(series["records_out_per_sec"].as_array().unwrap().iter().any(|v| v.as_f64().unwrap() > 0.0));
    // Latency (markers every 200 ms from each source subtask): none at the source, ordered
    // quantiles above 0 at every operator after it, chained or behind a channel, per subtask too.
    assert!(ticks["latency"].is_null(), "{ticks}");
    for name in ["double", "pass", "count"] {
        let o = op(&m2["operators"], name);
        let l = &o["latency"];
        let (count, p50, p99, max) =
            (l["count"].as_u64(), l["p50_us"].as_u64(), l["p99_us"].as_u64(), l["max_us"].as_u64());
        let (count, p50, p99, max) = (count.unwrap(), p50.unwrap(), p99.unwrap(), max.unwrap());
        assert!(count >= 2, "{name}: {l}");
        assert!(0 < p50 && p50 <= p99 && p99 <= max, "{name}: {l}");
        for s in o["subtasks"].as_array().unwrap() {
            let l = &s["latency"];
            assert!(l["p50_us"].as_u64().unwrap() <= l["max_us"].as_u64().unwrap(), "{name}: {s}");
        }
    }

    // --- watermarks: per operator and subtask; who holds each minimum back
    let w = c.ok(&format!("/api/v1/jobs/{JOB}/watermarks"));
    for o in w["operators"].as_array().unwrap() {
        assert_eq!(o["state"], "ACTIVE", "{o}");
        let lag = o["lag_ms"].as_i64().unwrap();
        assert!((-1_000..30_000).contains(&lag), "{o}");
        assert!(o["subtasks"].as_array().unwrap().iter().any(|s| s["is_minimum"] == true), "{o}");
    }
    let t = op(&w["operators"], "ticks");
    assert_eq!(t["held_back_by"]["operator"], "ticks", "a source holds itself back: {t}");
    let p = op(&w["operators"], "pass");
    assert_eq!(p["held_back_by"]["operator"], "double", "{p}");
    assert!(p["held_back_by"]["subtask"].as_u64().unwrap() < 2);
    assert_eq!(op(&w["operators"], "count")["held_back_by"]["operator"], "pass");

    // --- checkpoints: none taken by this job
    let cp = c.ok(&format!("/api/v1/jobs/{JOB}/checkpoints"));
    assert_eq!(cp["checkpoints"], serde_json::json!([]));
    assert_eq!(cp["counts"]["completed"], 0);
    assert!(cp["latest_completed"].is_null());
    assert!(cp["config"].is_null(), "no checkpoint settings: {cp}");

    // --- kafka: no Kafka source in this job (the values: tests/tests/kafka_lag_api.rs)
    let k = c.ok(&format!("/api/v1/jobs/{JOB}/kafka"));
    assert_eq!(k["sources"], serde_json::json!([]), "{k}");
    assert!(c.get(&format!("/api/v1/jobs/{JOB}/kafka?history=301")).error(400).contains("`history`"));
    // --- transactions: no Kafka sink here either (the values: tests/tests/kafka_transactions_api.rs)
    let t = c.ok(&format!("/api/v1/jobs/{JOB}/transactions"));
    assert_eq!(t["sinks"], serde_json::json!([]), "{t}");

    // --- Prometheus text
    let r = c.get("/metrics");
    assert_eq!(r.status, 200);
    assert!(r.content_type.starts_with("text/plain; version=0.0.4"), "{}", r.content_type);
    let text = r.body;
    for want in [
        format!("caudal_job_status{{job=\"{JOB}\",status=\"RUNNING\"}} 1"),
        format!("caudal_job_status{{job=\"{JOB}\",status=\"FAILED\"}} 0"),
        format!("caudal_operator_records_out_total{{job=\"{JOB}\",operator=\"ticks\",operator_id=\"0\",subtask=\"1\"}} "),
        format!("caudal_operator_records_in_total{{job=\"{JOB}\",operator=\"pass\",operator_id=\"2\",subtask=\"2\"}} "),
        format!("caudal_operator_watermark_milliseconds{{job=\"{JOB}\",operator=\"count\",operator_id=\"3\",subtask=\"0\"}} "),
        format!("caudal_operator_latency_seconds{{job=\"{JOB}\",operator=\"pass\",operator_id=\"2\",quantile=\"0.99\"}} "),
        format!("caudal_operator_latency_seconds{{job=\"{JOB}\",operator=\"count\",operator_id=\"3\",quantile=\"1\"}} "),
        "# TYPE caudal_operator_records_out_total counter".to_string(),
        "# TYPE caudal_operator_watermark_milliseconds gauge".to_string(),
    ] {
        assert!(text.contains(&want), "missing `{want}` in\n{text}");
    }
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad line {line}"));
        assert!(series.starts_with("caudal_") && series.ends_with('}'), "{line}");
        value.parse::<f64>().unwrap_or_else(|_| panic!("bad value in {line}"));
    }

    // --- the UI and its assets
    let index = c.get("/");
    assert_eq!(index.status, 200);
    assert!(index.content_type.starts_with("text/html") && index.body.contains("/assets/app.js"));
    assert_eq!(c.get(&format!("/jobs/{JOB}")).status, 200);
    for asset in ["app.js", "kafka.js", "state.js", "app.css", "favicon.svg"] {
        assert_eq!(c.get(&format!("/assets/{asset}")).status, 200, "{asset}");
    }
    assert_eq!(c.get("/assets/nope.js").status, 404);
    assert_eq!(c.get("/no/such/page").status, 404);

    // --- savepoints: this job takes no checkpoints, so none can be asked for
    let r = c.post(&format!("/api/v1/jobs/{JOB}/savepoints"));
    assert!(r.error(409).contains("does not take checkpoints"), "{}", r.body);
    assert_eq!(c.ok(&format!("/api/v1/jobs/{JOB}/savepoints"))["savepoints"], serde_json::json!([]));
    assert!(c.post("/api/v1/jobs/no-such-job/savepoints").error(404).contains("no-such-job"));
    // … nor stop with one (the job keeps running); a bad name or body is a 400 naming it.
    let stop = format!("/api/v1/jobs/{JOB}/stop");
    let r = c.post_json(&stop, r#"{"savepoint": "kept"}"#);
    assert!(r.error(409).contains("does not take checkpoints"), "{}", r.body);
    assert!(c.post_json(&stop, r#"{"savepoint": "a/b"}"#).error(400).contains("`name`"));
    assert!(c.post_json(&stop, r#"{"save": "x"}"#).error(400).contains("`body`"));
    assert!(c.post("/api/v1/jobs/no-such-job/stop").error(404).contains("no-such-job"));

    // --- other web sites: what any page can send is refused, the job keeps running
    let cancel = format!("{}/api/v1/jobs/{JOB}/cancel", c.base);
    let stop_url = format!("{}{stop}", c.base);
    for (url, content_type, origin) in [
        (&cancel, "text/plain", "http://evil.example"),
        (&stop_url, "text/plain", "http://evil.example"),
        (&cancel, "application/x-www-form-urlencoded", "null"),
        (&cancel, "application/json", "http://evil.example"),
        (&cancel, "application/json", "http://127.0.0.1:1"),
    ] {
        let mut r = c
            .agent
            .post(url)
            .header("Origin", origin)
            .content_type(content_type)
            .send(r#"{"savepoint": null}"#)
            .unwrap();
        let status = r.status().as_u16();
        let body = r.body_mut().read_to_string().unwrap();
        assert!(status == 403 || status == 415, "{content_type} from {origin}: {status} {body}");
    }
    let mut r = c
        .agent
        .post(&cancel)
        .content_type("application/json")
        .header("Sec-Fetch-Site", "cross-site")
        .send("{}")
        .unwrap();
    assert_eq!(r.status().as_u16(), 403, "{}", r.body_mut().read_to_string().unwrap());
    // DNS rebinding: a request naming another host reads nothing.
    let answer = raw_get(addr, &format!("/api/v1/jobs/{JOB}/state"), "evil.example:8081");
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(answer.contains("--ui-allowed-host evil.example"), "{answer}");
    assert!(raw_get(addr, &format!("/api/v1/jobs/{JOB}"), "localhost").starts_with("HTTP/1.1 200"));
    assert_eq!(
        c.ok(&format!("/api/v1/jobs/{JOB}"))["status"],
        "RUNNING",
        "a refused request stopped the job"
    );
    assert!(!runner.is_finished());

    // --- cancel: accepted, and the job ends (which stops the server)
    let r = c.post(&format!("/api/v1/jobs/{JOB}/cancel"));
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.json()["cancel_requested"], true);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !runner.is_finished() {
        assert!(Instant::now() < deadline, "the job did not stop after cancel");
        std::thread::sleep(Duration::from_millis(20));
    }
    let result = runner.join().unwrap().unwrap();
    assert!(result.operator("ticks").unwrap().records_out > 0);
    assert!(std::net::TcpStream::connect(addr).is_err(), "the server outlived the job");
}

#[test]
fn openapi_document_describes_every_endpoint() {
    let doc: Value = serde_json::from_str(caudal::web::OPENAPI_JSON).expect("openapi.json is JSON");
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths: Vec<&str> = doc["paths"].as_object().unwrap().keys().map(|k| k.as_str()).collect();
    let want = [
        ("/api/v1/jobs", "get"),
        ("/api/v1/jobs/{name}", "get"),
        ("/api/v1/jobs/{name}/metrics", "get"),
        ("/api/v1/jobs/{name}/watermarks", "get"),
        ("/api/v1/jobs/{name}/checkpoints", "get"),
        ("/api/v1/jobs/{name}/kafka", "get"),
        ("/api/v1/jobs/{name}/cancel", "post"),
        ("/api/v1/jobs/{name}/savepoints", "get"),
        ("/api/v1/jobs/{name}/savepoints", "post"),
        ("/api/v1/jobs/{name}/stop", "post"),
        ("/api/v1/jobs/{name}/transactions", "get"),
        ("/api/v1/jobs/{name}/state", "get"),
        ("/api/v1/jobs/{name}/operators/{operator}/state", "get"),
        ("/api/v1/jobs/{name}/operators/{operator}/state/keys", "get"),
        ("/api/v1/jobs/{name}/operators/{operator}/state/sizes", "get"),
        ("/api/v1/openapi.json", "get"),
        ("/metrics", "get"),
    ];
    let distinct: std::collections::BTreeSet<&str> = want.iter().map(|(p, _)| *p).collect();
    assert_eq!(paths.len(), distinct.len(), "{paths:?}");
    for (path, method) in want {
        let op = &doc["paths"][path][method];
        assert!(op.is_object(), "{method} {path} is not documented");
        assert!(op["responses"]["200"].is_object() || op["responses"]["202"].is_object(), "{path}");
        if path.contains("{name}") {
            assert!(op["responses"]["404"].is_object(), "{path} documents no 404");
        }
    }
    // every $ref resolves
    let text = caudal::web::OPENAPI_JSON;
    for piece in text.split("\"$ref\": \"#/components/schemas/").skip(1) {
        let name = &piece[..piece.find('"').unwrap()];
        assert!(doc["components"]["schemas"][name].is_object(), "dangling $ref {name}");
    }
}

#[test]
fn the_served_openapi_document_is_the_checked_in_one() {
    let addr = free_addr();
    let registry = std::sync::Arc::new(caudal::web::JobRegistry::new());
    let server = caudal::web::WebServer::start(addr, registry).unwrap();
    let c = Client::new(server.local_addr());
    let r = c.get("/api/v1/openapi.json");
    assert_eq!(r.status, 200);
    assert!(r.content_type.starts_with("application/json"));
    assert_eq!(r.body, caudal::web::OPENAPI_JSON);
    assert_eq!(c.ok("/api/v1/jobs")["jobs"], serde_json::json!([]));
    drop(server);
    assert!(std::net::TcpStream::connect(addr).is_err(), "dropping the server stops it");
}

#[test]
fn an_address_in_use_is_a_config_error_naming_web_bind() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let env = job(addr);
    let err = env.execute(JOB).unwrap_err();
    assert!(matches!(err, caudal::Error::Config { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("web_bind") && msg.contains(&addr.to_string()), "{msg}");
}

#[test]
fn web_bind_reads_its_environment_override() {
    // The only test of this binary that touches the environment.
    std::env::set_var("CAUDAL__WEB_BIND", "127.0.0.1:9");
    let c = JobConfig::default().with_env_overrides().unwrap();
    assert_eq!(c.web_bind, Some("127.0.0.1:9".parse().unwrap()));
    std::env::set_var("CAUDAL__WEB_BIND", "off");
    assert_eq!(JobConfig::default().with_env_overrides().unwrap().web_bind, None);
    std::env::set_var("CAUDAL__WEB_BIND", "localhost");
    let err = JobConfig::default().with_env_overrides().unwrap_err().to_string();
    std::env::remove_var("CAUDAL__WEB_BIND");
    assert!(err.contains("CAUDAL__WEB_BIND") && err.contains("localhost"), "{err}");
    assert_eq!(JobConfig::default().web_bind, None, "no server unless asked for");
}

/// Random requests — paths, query strings, methods, content types and bodies, printable or
/// not — get an answer below 500 from a server with a running job, and the server keeps
/// answering afterwards.
#[test]
fn random_requests_never_get_a_server_error() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let addr = free_addr();
    let runner = std::thread::spawn(move || job(addr).execute(JOB));
    let c = Client::new(addr);
    c.wait_up();
    let segment = prop_oneof![
        Just(JOB.to_string()),
        Just("jobs".to_string()),
        Just("operators".to_string()),
        Just("state".to_string()),
        "[a-zA-Z0-9%._~-]{0,12}",
        "\\PC{0,8}".prop_map(|s| s.bytes().map(|b| format!("%{b:02X}")).collect::<String>()),
    ];
    let request = (
        proptest::collection::vec(segment, 0..6),
        "[a-z_=&%0-9-]{0,24}",
        prop_oneof![Just("GET"), Just("POST"), Just("PUT"), Just("DELETE")],
        prop_oneof![Just("application/json"), Just("text/plain"), Just("")],
        proptest::collection::vec(any::<u8>(), 0..64),
    );
    let mut runner_cfg =
        TestRunner::new(Config { cases: 96, failure_persistence: None, ..Config::default() });
    runner_cfg
        .run(&request, |(segments, query, method, content_type, body)| {
            if segments.iter().any(|s| s == "cancel" || s == "stop") {
                return Ok(()); // would end the job (and the server) by design
            }
            let body = if matches!(method, "POST" | "PUT") { body } else { Vec::new() };
            let url = format!("{}/api/v1/{}?{query}", c.base, segments.join("/"));
            let mut b = ureq::http::Request::builder().method(method).uri(&url);
            if !content_type.is_empty() {
                b = b.header("Content-Type", content_type);
            }
            let status = match b.body(body) {
                Ok(req) => match c.agent.run(req) {
                    Ok(r) => r.status().as_u16(),
                    Err(e) => panic!("{method} {url}: {e}"),
                },
                Err(_) => return Ok(()), // not a request at all
            };
            prop_assert!(status < 500, "{method} {url} ({content_type}): {status}");
            Ok(())
        })
        .unwrap();
    assert_eq!(
        c.ok(&format!("/api/v1/jobs/{JOB}"))["name"],
        JOB,
        "the server answers after the random requests"
    );
    assert_eq!(c.post(&format!("/api/v1/jobs/{JOB}/cancel")).status, 202);
    let _ = runner.join().unwrap();
}

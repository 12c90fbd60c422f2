//! Kafka consumer lag through the REST API and `/metrics`, against a running embedded job
//! reading a real topic: the lag of each partition is its whole content while nothing is
//! checkpointed, and falls to 0 once the input is consumed and a checkpoint completed, also
//! when the input was written in transactions (whose commit markers take an offset).
//!
//! The job: `lag-source` (the Kafka source, parallelism 2 over 3 partitions) → hash →
//! `gate` (blocks until the test opens it) → `discard`. While the gate is closed no
//! checkpoint can complete past any record, so the lag is known exactly.
//!
//! Needs the test stack (`scripts/services.sh start`); skipped without it unless
//! `CAUDAL_REQUIRE_STACK` is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../jobs/tests/kafka_support/mod.rs"]
mod kafka_support;

use caudal::{Batch, CheckpointConfig, JobConfig, OperatorContext, StreamEnv, WatermarkStrategy};
use caudal_operators::kafka::{KafkaSource, KafkaSourceConfig};
use caudal_operators::sinks::DiscardSink;
use kafka_support::{create_topic, produce_raw, stack, unique};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const JOB: &str = "kafka-lag-test";
/// Records produced into partition `p`: different per partition, so a mix-up shows.
const RECORDS: [i64; 3] = [40, 70, 100];

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Reading {
    n: u64,
}

/// Holds every batch until the test opens the gate; counts what passed.
#[derive(Clone, Default)]
struct Gate {
    open: Arc<AtomicBool>,
    passed: Arc<AtomicU64>,
}

impl caudal::Operator for Gate {
    type In = Reading;
    type Out = Reading;
    fn process_batch(
        &mut self,
        mut batch: Batch<Reading>,
        out: &mut Batch<Reading>,
        _: &mut OperatorContext,
    ) -> caudal::Result<()> {
        while !self.open.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.passed.fetch_add(batch.len() as u64, Ordering::Relaxed);
        out.append(&mut batch);
        Ok(())
    }
}

/// Opens the gate when the test ends, panicking or not, so the job can stop.
struct OpenOnDrop(Arc<AtomicBool>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

use caudal_test_stack::free_addr;

struct Api {
    base: String,
    job: String,
    agent: ureq::Agent,
}

impl Api {
    fn new(addr: SocketAddr, job: &str) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .proxy(None)
            .timeout_global(Some(Duration::from_secs(5)))
            .build()
            .into();
        Api { base: format!("http://{addr}"), job: job.to_string(), agent }
    }

    /// Status and body of `GET path` (`None` while the server is not up).
    fn get(&self, path: &str) -> Option<(u16, String)> {
        let mut r = self.agent.get(format!("{}{path}", self.base)).call().ok()?;
        Some((r.status().as_u16(), r.body_mut().read_to_string().unwrap()))
    }

    /// Cancel the job through the API and wait for it to end.
    fn cancel(&self, runner: std::thread::JoinHandle<caudal::Result<caudal::JobResult>>) {
        let url = format!("{}/api/v1/jobs/{}/cancel", self.base, self.job);
        let r = self.agent.post(url).content_type("application/json").send("{}").unwrap();
        assert_eq!(r.status().as_u16(), 202);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !runner.is_finished() {
            assert!(Instant::now() < deadline, "the job did not stop after cancel");
            std::thread::sleep(Duration::from_millis(20));
        }
        runner.join().unwrap().expect("the job ends cleanly");
    }

    fn json(&self, path: &str) -> Option<Value> {
        self.get(path).filter(|(s, _)| *s == 200).map(|(_, b)| serde_json::from_str(&b).unwrap())
    }

    /// Poll `/kafka` until `done` holds; returns that answer.
    fn kafka_until(&self, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = Value::Null;
        loop {
            if let Some(v) = self.json(&format!("/api/v1/jobs/{}/kafka", self.job)) {
                if done(&v) {
                    return v;
                }
                last = v;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}; last answer: {last}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn partitions(v: &Value) -> &Vec<Value> {
    v["sources"][0]["partitions"].as_array().unwrap()
}

/// The last known value of a partition's lag history.
fn last_in_history(p: &Value) -> Option<i64> {
    p["lag_history"].as_array().unwrap().iter().rev().find_map(|v| v.as_i64())
}

/// A running job over `topic` behind `gate`, serving its API; the temp dir holds its state.
struct Running {
    api: Api,
    runner: std::thread::JoinHandle<caudal::Result<caudal::JobResult>>,
    _dir: tempfile::TempDir,
}

fn start(brokers: &str, topic: &str, job: &str, gate: Gate) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let config = JobConfig {
        parallelism: 2,
        handle_signals: false,
        web_bind: Some(addr),
        state_dir: Some(dir.path().join("state")),
        checkpoints: CheckpointConfig {
            interval: Some(Duration::from_millis(300)),
            storage: caudal_checkpoints::CheckpointStorageConfig {
                url: dir.path().join("checkpoints").display().to_string(),
                ..Default::default()
            },
            ..CheckpointConfig::default()
        },
        ..JobConfig::default()
    };
    let mut source = KafkaSourceConfig::new(brokers, topic);
    source.lag_interval = Duration::from_millis(200);
    let name = job.to_string();
    let runner = std::thread::spawn(move || {
        let env = StreamEnv::with_config(config);
        env.source("lag-source", KafkaSource::<Reading>::json(source), WatermarkStrategy::none())
            .key_by(|r: &Reading| r.n % 7)
            .transform("gate", move |_| Ok(gate.clone()))
            .sink("discard", |_| Ok(DiscardSink::default()));
        env.execute(&name)
    });
    Running { api: Api::new(addr, job), runner, _dir: dir }
}

fn records(n: i64) -> Vec<(Vec<u8>, Vec<u8>)> {
    (0..n).map(|i| (i.to_string().into_bytes(), format!("{{\"n\":{i}}}").into_bytes())).collect()
}

#[test]
fn lag_per_partition_is_served_and_falls_to_zero_after_a_checkpoint() {
    let Some(stack) = stack() else { return };
    let topic = unique("lag");
    create_topic(&stack, &topic, 3);
    for (p, n) in RECORDS.iter().enumerate() {
        produce_raw(&stack, &topic, p as i32, &records(*n));
    }
    let gate = Gate::default();
    let _open_on_drop = OpenOnDrop(gate.open.clone());
    let Running { api, runner, _dir } = start(&stack.brokers, &topic, JOB, gate.clone());

    // --- gate closed: every record is read, none is covered by a checkpoint
    let v = api.kafka_until("every partition's end offset", |v| {
        v["sources"].as_array().is_some_and(|s| s.len() == 1)
            && partitions(v).len() == 3
            && partitions(v).iter().all(|p| p["end_offset"].is_i64())
    });
    let source = &v["sources"][0];
    assert_eq!(source["operator"], "lag-source", "{v}");
    assert_eq!(source["parallelism"], 2, "{v}");
    assert_eq!(source["lag"], RECORDS.iter().sum::<i64>(), "{v}");
    for (p, want) in partitions(&v).iter().zip(RECORDS) {
        assert_eq!(p["topic"], topic.as_str());
        assert_eq!(p["end_offset"], want, "{p}");
        assert_eq!(p["lag"], want, "the whole partition is lag before a checkpoint: {p}");
        assert!(p["checkpointed_offset"].is_null(), "no checkpoint can pass the closed gate: {p}");
        assert!(p["catch_up_ms"].is_null(), "no progress, no catch-up time: {p}");
    }
    assert_eq!(
        partitions(&v).iter().map(|p| p["partition"].as_i64().unwrap()).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    // The sampler's history catches up with the current values.
    let v = api.kafka_until("the lag in the history", |v| {
        partitions(v).iter().zip(RECORDS).all(|(p, want)| last_in_history(p) == Some(want))
    });
    assert_eq!(
        v["history_at_ms"].as_array().unwrap().len(),
        partitions(&v)[0]["lag_history"].as_array().unwrap().len()
    );
    let (status, text) = api.get("/metrics").unwrap();
    assert_eq!(status, 200);
    for (p, want) in RECORDS.iter().enumerate() {
        let labels = format!(
            "job=\"{JOB}\",operator=\"lag-source\",operator_id=\"0\",topic=\"{topic}\",partition=\"{p}\""
        );
        for line in [
            format!("caudal_kafka_partition_lag{{{labels}}} {want}"),
            format!("caudal_kafka_partition_end_offset{{{labels}}} {want}"),
        ] {
            assert!(text.contains(&line), "missing `{line}` in\n{text}");
        }
        assert!(!text.contains(&format!("caudal_kafka_partition_checkpointed_offset{{{labels}}}")), "{text}");
    }

    // --- gate open: the input is consumed, a checkpoint covers it, the lag falls to 0
    gate.open.store(true, Ordering::Relaxed);
    let v = api.kafka_until("lag 0 after a checkpoint", |v| {
        partitions(v).iter().zip(RECORDS).all(|(p, want)| {
            p["checkpointed_offset"] == want && p["lag"] == 0 && last_in_history(p) == Some(0)
        })
    });
    assert_eq!(v["sources"][0]["lag"], 0, "{v}");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    for (p, want) in partitions(&v).iter().zip(RECORDS) {
        assert_eq!(p["end_offset"], want, "{p}");
        // Its watermark in the source: the latest record timestamp (produce time) - 1 ms.
        let wm = p["watermark"].as_i64().unwrap_or_else(|| panic!("no watermark: {p}"));
        assert!(now - 600_000 < wm && wm < now, "watermark {wm} vs now {now}: {p}");
        // The lag in time: behind by about now - watermark; caught up (no lag left).
        let behind = p["behind_ms"].as_i64().unwrap_or_else(|| panic!("no behind_ms: {p}"));
        assert!(
            behind >= 0 && behind <= now - wm + 5_000,
            "behind {behind} ms vs now - watermark {}: {p}",
            now - wm
        );
        assert_eq!(p["catch_up_ms"], 0, "no lag left: {p}");
        let history: Vec<i64> =
            p["lag_history"].as_array().unwrap().iter().filter_map(Value::as_i64).collect();
        assert!(history.contains(&want), "the history keeps the lag before the checkpoint: {p}");
    }
    // Bytes in: exactly the keys and values read from the topic; the shuffle within the
    // process serializes nothing, so no other operator counts bytes.
    let read: usize =
        RECORDS.iter().map(|n| records(*n).iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()).sum();
    let m = api.json(&format!("/api/v1/jobs/{JOB}/metrics")).unwrap();
    let ops = m["operators"].as_array().unwrap();
    assert_eq!(ops[0]["name"], "lag-source", "{m}");
    assert_eq!(ops[0]["bytes_in"], read as u64, "{m}");
    let per_subtask: u64 =
        ops[0]["subtasks"].as_array().unwrap().iter().map(|s| s["bytes_in"].as_u64().unwrap()).sum();
    assert_eq!(per_subtask, read as u64, "{m}");
    for op in ops {
        assert_eq!(op["bytes_out"], 0, "{op}");
        if op["name"] != "lag-source" {
            assert_eq!(op["bytes_in"], 0, "{op}");
        }
    }
    let (_, text) = api.get("/metrics").unwrap();
    let labels =
        format!("job=\"{JOB}\",operator=\"lag-source\",operator_id=\"0\",topic=\"{topic}\",partition=\"2\"");
    let prefix = format!("caudal_operator_bytes_in_total{{job=\"{JOB}\",operator=\"lag-source\",");
    let bytes: u64 = text
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(bytes, read as u64, "{text}");
    for line in [
        format!("caudal_kafka_partition_lag{{{labels}}} 0"),
        format!("caudal_kafka_partition_checkpointed_offset{{{labels}}} {}", RECORDS[2]),
    ] {
        assert!(text.contains(&line), "missing `{line}` in\n{text}");
    }

    // --- errors: unknown job, bad parameter
    let (status, body) = api.get("/api/v1/jobs/no-such-job/kafka").unwrap();
    assert_eq!(status, 404, "{body}");
    assert!(serde_json::from_str::<Value>(&body).unwrap()["error"].as_str().unwrap().contains("no-such-job"));
    let (status, body) = api.get(&format!("/api/v1/jobs/{JOB}/kafka?history=x")).unwrap();
    assert_eq!(status, 400, "{body}");

    // --- cancel: the job stops with every record through the gate
    api.cancel(runner);
    assert_eq!(gate.passed.load(Ordering::Relaxed), RECORDS.iter().sum::<i64>() as u64);
}

/// Each partition written in one transaction: its commit marker takes the offset after the
/// last record, so the end offset is one past it; the lag still falls to 0.
#[test]
fn lag_falls_to_zero_over_transactional_input() {
    let Some(stack) = stack() else { return };
    let topic = unique("lag-txn");
    create_topic(&stack, &topic, 3);
    for (p, n) in RECORDS.iter().enumerate() {
        produce_in_transaction(&stack.brokers, &topic, p as i32, &records(*n));
    }
    let gate = Gate { open: Arc::new(AtomicBool::new(true)), ..Gate::default() };
    let Running { api, runner, _dir } = start(&stack.brokers, &topic, "kafka-lag-txn-test", gate.clone());
    let v = api.kafka_until("lag 0 after a checkpoint", |v| {
        v["sources"].as_array().is_some_and(|s| s.len() == 1)
            && partitions(v).len() == 3
            && partitions(v).iter().all(|p| p["lag"] == 0 && p["end_offset"].is_i64())
    });
    for (p, n) in partitions(&v).iter().zip(RECORDS) {
        assert_eq!(p["end_offset"], n + 1, "n records and a commit marker: {p}");
        assert_eq!(p["checkpointed_offset"], n + 1, "the checkpoint covers the marker too: {p}");
    }
    api.cancel(runner);
    assert_eq!(gate.passed.load(Ordering::Relaxed), RECORDS.iter().sum::<i64>() as u64);
}

fn produce_in_transaction(brokers: &str, topic: &str, partition: i32, records: &[(Vec<u8>, Vec<u8>)]) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("transactional.id", unique("lag-txn-producer"))
        .create()
        .unwrap();
    producer.init_transactions(Duration::from_secs(30)).unwrap();
    producer.begin_transaction().unwrap();
    for (k, v) in records {
        producer.send(BaseRecord::to(topic).partition(partition).key(k).payload(v)).unwrap();
    }
    producer.commit_transaction(Duration::from_secs(30)).unwrap();
}

//! Pending Kafka sink transactions through the REST API, against a running embedded job
//! writing exactly-once into a real topic.
//!
//! The job: `numbers` (a scripted source) → `kafka-out` (the exactly-once Kafka sink, chained)
//! and `numbers` → hash → `gate` (blocks until the test opens it) → `discard`. While the gate
//! is closed checkpoint 1 cannot complete, so the transaction the sink pre-committed at its
//! barrier waits, listed as `pre_committed`; the records of the source's second phase go into
//! the next epoch's `open` transaction. Opening the gate lets the checkpoints complete: both
//! are committed and leave the list, and a `read_committed` reader sees every record.
//!
//! Needs the test stack (`scripts/services.sh start`); skipped without it unless
//! `CAUDAL_REQUIRE_STACK` is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../jobs/tests/kafka_support/mod.rs"]
mod kafka_support;

use caudal::{Batch, CheckpointConfig, JobConfig, OperatorContext, Result, StreamEnv};
use caudal::{Source, SourceContext, SourceOutput, SourcePoll, SourceReader, WatermarkStrategy};
use caudal_operators::kafka::{DeliveryGuarantee, JsonSerializer, KafkaSink, KafkaSinkConfig};
use caudal_operators::sinks::DiscardSink;
use kafka_support::{create_topic, read_committed, stack, unique};
use serde_json::Value;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PHASE_1: u64 = 30;
const PHASE_2: u64 = 12;
const TXN_TIMEOUT: Duration = Duration::from_secs(300);

/// Emits `PHASE_1` numbers, then `PHASE_2` more once `allowed` reaches 2, then idles.
struct Numbers {
    allowed: Arc<AtomicUsize>,
}

impl Source for Numbers {
    type Out = u64;
    fn create_reader(&self, _: &SourceContext, _: &[Vec<u8>]) -> Result<Box<dyn SourceReader<u64>>> {
        Ok(Box::new(NumbersReader { allowed: self.allowed.clone(), phase: 0 }))
    }
}

struct NumbersReader {
    allowed: Arc<AtomicUsize>,
    phase: usize,
}

impl SourceReader<u64> for NumbersReader {
    fn splits(&self) -> usize {
        1
    }
    fn poll(&mut self, out: &mut SourceOutput<'_, u64>) -> Result<SourcePoll> {
        if self.phase >= 2 || self.allowed.load(Ordering::SeqCst) <= self.phase {
            return Ok(SourcePoll::Pending(Duration::from_millis(10)));
        }
        self.phase += 1;
        let (from, n) = if self.phase == 1 { (0, PHASE_1) } else { (PHASE_1, PHASE_2) };
        for i in from..from + n {
            out.collect(0, i);
        }
        Ok(SourcePoll::Ready)
    }
}

/// Holds every batch until the test opens it.
#[derive(Clone, Default)]
struct Gate {
    open: Arc<AtomicBool>,
}

impl caudal::Operator for Gate {
    type In = u64;
    type Out = u64;
    fn process_batch(
        &mut self,
        mut b: Batch<u64>,
        out: &mut Batch<u64>,
        _: &mut OperatorContext,
    ) -> Result<()> {
        while !self.open.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
        out.append(&mut b);
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

fn get(agent: &ureq::Agent, url: &str) -> Option<Value> {
    let mut r = agent.get(url).call().ok()?;
    (r.status() == 200).then(|| r.body_mut().read_json().unwrap())
}

/// Polls the transactions of `kafka-out` until `done` holds; returns them.
fn until(agent: &ureq::Agent, url: &str, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = Value::Null;
    loop {
        if let Some(v) = get(agent, url) {
            let sink = v["sinks"].as_array().unwrap().iter().find(|s| s["operator"] == "kafka-out").cloned();
            if let Some(sink) = sink {
                let txns = sink["transactions"].as_array().unwrap().clone();
                if done(&txns) {
                    return txns;
                }
            }
            last = v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}; last answer: {last}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn pending_and_open_sink_transactions_are_listed_until_committed() {
    let Some(stack) = stack() else { return };
    let topic = unique("txn-api");
    create_topic(&stack, &topic, 1);
    let prefix = unique("txn-api-prefix");
    let dir = tempfile::tempdir().unwrap();
    let addr = caudal_test_stack::free_addr();
    let config = JobConfig {
        parallelism: 1,
        handle_signals: false,
        web_bind: Some(addr),
        state_dir: Some(dir.path().join("state")),
        checkpoints: CheckpointConfig {
            interval: Some(Duration::from_millis(500)),
            timeout: Duration::from_secs(60),
            storage: caudal_checkpoints::CheckpointStorageConfig {
                url: dir.path().join("checkpoints").display().to_string(),
                ..Default::default()
            },
            ..CheckpointConfig::default()
        },
        ..JobConfig::default()
    };
    let mut sink = KafkaSinkConfig::new(&stack.brokers, &topic)
        .delivery(DeliveryGuarantee::ExactlyOnce)
        .transaction_timeout(TXN_TIMEOUT);
    sink.transactional_id_prefix = Some(prefix.clone());
    let allowed = Arc::new(AtomicUsize::new(1));
    let gate = Gate::default();
    let _open_on_drop = OpenOnDrop(gate.open.clone());
    let (source_allowed, job_gate) = (allowed.clone(), gate.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    let runner = std::thread::spawn(move || {
        let env = StreamEnv::with_config(config);
        let _ = tx.send(env.stop_handle());
        let numbers = env.source("numbers", Numbers { allowed: source_allowed }, WatermarkStrategy::none());
        numbers.clone().sink("kafka-out", move |_| Ok(KafkaSink::new(sink.clone(), JsonSerializer)));
        numbers
            .key_by(|n: &u64| *n % 5)
            .transform("gate", move |_| Ok(job_gate.clone()))
            .sink("discard", |_| Ok(DiscardSink::default()));
        env.execute("kafka-txn-api")
    });
    let stop = rx.recv_timeout(Duration::from_secs(30)).expect("the job did not build");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let url = format!("http://{addr}/api/v1/jobs/kafka-txn-api/transactions");

    // Checkpoint 1's barrier pre-committed phase 1; the gate holds the checkpoint open.
    let txns = until(&agent, &url, "a pre-committed transaction", |t| {
        t.iter().any(|x| x["state"] == "pre_committed")
    });
    assert_eq!(txns.len(), 1, "{txns:?}");
    let pre = &txns[0];
    assert_eq!(pre["checkpoint"], 1);
    assert_eq!(pre["records"].as_u64(), Some(PHASE_1));
    assert!(pre["transactional_id"].as_str().unwrap().starts_with(&prefix), "{pre}");
    assert!(pre["producer_id"].as_i64().unwrap() >= 0, "{pre}");
    assert!(pre["producer_epoch"].as_i64().unwrap() >= 0, "{pre}");
    assert_eq!(pre["timeout_ms"].as_u64(), Some(TXN_TIMEOUT.as_millis() as u64));
    let age = pre["age_ms"].as_i64().unwrap();
    assert!(age >= 0 && (age as u128) < TXN_TIMEOUT.as_millis(), "{pre}");
    let fraction = pre["timeout_fraction"].as_f64().unwrap();
    assert!((0.0..1.0).contains(&fraction), "{pre}");

    // Phase 2 goes into the next epoch's transaction, under another transactional id.
    allowed.store(2, Ordering::SeqCst);
    let txns = until(&agent, &url, "the open transaction of phase 2", |t| {
        t.iter().any(|x| x["state"] == "open" && x["records"].as_u64() == Some(PHASE_2))
    });
    assert_eq!(txns.len(), 2, "{txns:?}");
    let (pre2, open) = (&txns[0], &txns[1]);
    assert_eq!(pre2["transactional_id"], pre["transactional_id"], "oldest checkpoint first");
    assert_eq!(pre2["state"], "pre_committed");
    assert_eq!(open["checkpoint"], 2);
    assert_ne!(open["transactional_id"], pre["transactional_id"]);
    assert_ne!(open["producer_id"], pre["producer_id"]);
    assert!(open["age_ms"].as_i64().unwrap() >= 0);

    // `/metrics`: the age of each, labelled with id, state and checkpoint.
    let mut r = agent.get(format!("http://{addr}/metrics")).call().unwrap();
    let text = r.body_mut().read_to_string().unwrap();
    for (t, state, checkpoint) in [(pre, "pre_committed", 1), (open, "open", 2)] {
        let id = t["transactional_id"].as_str().unwrap();
        let series = format!(
            "caudal_kafka_sink_transaction_age_seconds{{job=\"kafka-txn-api\",operator=\"kafka-out\",operator_id=\"1\",\
             transactional_id=\"{id}\",state=\"{state}\",checkpoint=\"{checkpoint}\"}} "
        );
        assert!(text.contains(&series), "no `{series}` in /metrics:\n{text}");
    }

    // Open the gate: the checkpoints complete and commit both; nothing is pending any more.
    gate.open.store(true, Ordering::Relaxed);
    until(&agent, &url, "every transaction committed", |t| t.is_empty());
    let committed = read_committed(&stack, &topic);
    assert_eq!(committed.len() as u64, PHASE_1 + PHASE_2);
    // The sink's bytes out: exactly the keys and values now in the topic.
    let written: usize = committed.iter().map(|(k, v)| k.len() + v.len()).sum();
    let metrics = get(&agent, &format!("http://{addr}/api/v1/jobs/kafka-txn-api/metrics")).unwrap();
    let sink = metrics["operators"].as_array().unwrap().iter().find(|o| o["name"] == "kafka-out").unwrap();
    assert_eq!(sink["bytes_out"], written as u64, "{sink}");
    assert_eq!(sink["bytes_in"], 0, "records reach the sink unserialized: {sink}");

    // Unknown job: 404; unknown parameter: 400 naming it.
    let r = agent.get(format!("http://{addr}/api/v1/jobs/nope/transactions")).call().unwrap();
    assert_eq!(r.status(), 404);
    let mut r = agent.get(format!("{url}?x=1")).call().unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.body_mut().read_to_string().unwrap().contains("`x`"));

    stop.stop();
    runner.join().unwrap().expect("the job ends cleanly");
}

//! Broker health seen from the client through the REST API and `/metrics`, against a running
//! embedded job that reads one real topic (2 partitions) and writes another (1 partition)
//! on the test stack's single-node broker: every partition has a leader, one replica and one
//! in-sync replica, so none is under-replicated.
//!
//! Needs the test stack (`scripts/services.sh start`); skipped without it unless
//! `CAUDAL_REQUIRE_STACK` is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../jobs/tests/kafka_support/mod.rs"]
mod kafka_support;

use caudal::{JobConfig, StreamEnv, WatermarkStrategy};
use caudal_operators::kafka::{
    DeliveryGuarantee, JsonSerializer, KafkaSink, KafkaSinkConfig, KafkaSource, KafkaSourceConfig,
};
use kafka_support::{create_topic, stack, unique};
use serde_json::Value;
use std::time::{Duration, Instant};

#[test]
fn partitions_of_sources_and_sinks_report_replicas_and_in_sync_replicas() {
    let Some(stack) = stack() else { return };
    let (input, output) = (unique("health-in"), unique("health-out"));
    create_topic(&stack, &input, 2);
    create_topic(&stack, &output, 1);
    let Running { agent, base, stop, runner } = run(&stack, &input, &output, "kafka-health");
    let deadline = Instant::now() + Duration::from_secs(60);
    let v: Value = loop {
        let answer = agent
            .get(format!("{base}/api/v1/jobs/kafka-health/kafka"))
            .call()
            .ok()
            .and_then(|mut r| (r.status() == 200).then(|| r.body_mut().read_json::<Value>().unwrap()));
        if let Some(v) = answer {
            let known = v["health"].as_array().is_some_and(|h| {
                h.len() == 2
                    && h.iter().all(|t| {
                        t["partitions"].as_array().unwrap().iter().all(|p| p["in_sync_replicas"].is_i64())
                    })
            });
            if known {
                break v;
            }
        }
        assert!(Instant::now() < deadline, "no broker health for both topics");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(v["under_replicated_partitions"], 0, "{v}");
    let health = v["health"].as_array().unwrap();
    let by_topic = |t: &str| health.iter().find(|h| h["topic"] == t).unwrap_or_else(|| panic!("{t} in {v}"));
    for (topic, operator, kind, partitions) in [(&input, "in", "source", 2), (&output, "out", "sink", 1)] {
        let h = by_topic(topic);
        assert_eq!(h["operator"], operator);
        assert_eq!(h["kind"], kind);
        assert_eq!(h["under_replicated"], 0);
        let parts = h["partitions"].as_array().unwrap();
        assert_eq!(parts.len(), partitions, "{h}");
        for (i, p) in parts.iter().enumerate() {
            assert_eq!(p["partition"], i as i64);
            assert_eq!(p["replicas"], 1, "{p}");
            assert_eq!(p["in_sync_replicas"], 1, "{p}");
            assert_eq!(p["under_replicated"], false, "{p}");
            assert!(p["leader"].as_i64().unwrap() >= 0, "{p}");
        }
    }
    // The effective client settings of both connectors (the UI's "Client settings").
    let clients = v["clients"].as_array().unwrap();
    let setting = |op: &str, client: &str, key: &str| {
        let c = clients.iter().find(|c| c["operator"] == op && c["client"] == client);
        c.and_then(|c| c["settings"][key].as_str()).map(str::to_string)
    };
    assert_eq!(setting("in", "consumer", "isolation.level").as_deref(), Some("read_committed"), "{v}");
    assert_eq!(setting("in", "consumer", "bootstrap.servers"), Some(stack.brokers.clone()), "{v}");
    assert!(setting("in", "consumer", "fetch.max.bytes").is_some(), "a librdkafka default shown: {v}");
    assert_eq!(setting("out", "producer", "acks").as_deref(), Some("all"), "{v}");
    assert_eq!(setting("out", "producer", "compression.type").as_deref(), Some("lz4"), "{v}");
    // The source's lag entries carry the same numbers.
    for p in v["sources"][0]["partitions"].as_array().unwrap() {
        assert_eq!((p["replicas"].as_i64(), p["in_sync_replicas"].as_i64()), (Some(1), Some(1)), "{p}");
    }
    let text = agent.get(format!("{base}/metrics")).call().unwrap().body_mut().read_to_string().unwrap();
    for (topic, operator, id) in [(&input, "in", 0), (&output, "out", 1)] {
        let labels = format!("job=\"kafka-health\",operator=\"{operator}\",operator_id=\"{id}\",topic=\"{topic}\",partition=\"0\"");
        for series in ["caudal_kafka_partition_replicas", "caudal_kafka_partition_in_sync_replicas"] {
            let line = format!("{series}{{{labels}}} 1");
            assert!(text.contains(&line), "no `{line}` in /metrics:\n{text}");
        }
    }
    stop.stop();
    runner.join().unwrap().expect("the job ends cleanly");
}

/// What the sink's producers see of the broker (#14: producer request latency and error
/// rate): per broker, request latency p50/p99 of the last second, requests, and no errors,
/// retries, timeouts or lost connections on a healthy broker — in the REST API and /metrics.
#[test]
fn a_sinks_producers_report_request_latency_and_errors_per_broker() {
    let Some(stack) = stack() else { return };
    let (input, output) = (unique("producer-in"), unique("producer-out"));
    create_topic(&stack, &input, 1);
    create_topic(&stack, &output, 1);
    // Records keep coming while the test looks (the sink's producer reports its statistics
    // as it writes).
    let feeding = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let feeder = {
        let (stack, input, feeding) = (stack.clone(), input.clone(), feeding.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while feeding.load(std::sync::atomic::Ordering::Relaxed) {
                let records: Vec<(Vec<u8>, Vec<u8>)> =
                    (0..2_000).map(|i| (Vec::new(), format!("{{\"n\":{}}}", n + i).into_bytes())).collect();
                kafka_support::produce_raw(&stack, &input, 0, &records);
                n += 2_000;
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let Running { agent, base, stop, runner } = run(&stack, &input, &output, "kafka-producers");
    let deadline = Instant::now() + Duration::from_secs(60);
    let producer: Value = loop {
        let answer = agent
            .get(format!("{base}/api/v1/jobs/kafka-producers/kafka"))
            .call()
            .ok()
            .and_then(|mut r| (r.status() == 200).then(|| r.body_mut().read_json::<Value>().unwrap()));
        let seen = answer.as_ref().and_then(|v| {
            v["producers"]
                .as_array()?
                .iter()
                .find(|p| p["requests"].as_i64() > Some(0) && p["rtt_p50_ms"].is_f64())
                .cloned()
        });
        if let Some(p) = seen {
            break p;
        }
        assert!(Instant::now() < deadline, "no producer statistics after 60 s: {answer:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(producer["operator"], "out", "{producer}");
    assert!(producer["broker"].as_i64() >= Some(0), "{producer}");
    let (p50, p99) = (producer["rtt_p50_ms"].as_f64().unwrap(), producer["rtt_p99_ms"].as_f64().unwrap());
    assert!(p50 >= 0.0 && p99 >= p50, "latency p50 {p50} p99 {p99}");
    for what in ["errors", "retries", "timeouts", "disconnects"] {
        assert_eq!(producer[what], 0, "{what} on a healthy broker: {producer}");
    }
    let text = agent.get(format!("{base}/metrics")).call().unwrap().body_mut().read_to_string().unwrap();
    let broker = producer["broker"].as_i64().unwrap();
    let labels = format!(
        "job=\"kafka-producers\",operator=\"out\",operator_id=\"1\",subtask=\"0\",broker=\"{broker}\""
    );
    for series in [
        format!("caudal_kafka_producer_events_total{{{labels},what=\"requests\"}}"),
        format!("caudal_kafka_producer_request_latency_seconds{{{labels},quantile=\"0.99\"}}"),
    ] {
        assert!(text.contains(&series), "no `{series}` in /metrics:\n{text}");
    }
    feeding.store(false, std::sync::atomic::Ordering::Relaxed);
    feeder.join().unwrap();
    stop.stop();
    runner.join().unwrap().expect("the job ends cleanly");
}

/// The job under test: JSON records from `input` into `output` (at-least-once), its REST API
/// on a free port.
struct Running {
    agent: ureq::Agent,
    base: String,
    stop: caudal::StopHandle,
    runner: std::thread::JoinHandle<caudal::Result<caudal::JobResult>>,
}

fn run(stack: &kafka_support::Stack, input: &str, output: &str, job: &'static str) -> Running {
    let addr = caudal_test_stack::free_addr();
    let config =
        JobConfig { parallelism: 1, handle_signals: false, web_bind: Some(addr), ..JobConfig::default() };
    let source = KafkaSourceConfig::new(&stack.brokers, input);
    let sink = KafkaSinkConfig::new(&stack.brokers, output).delivery(DeliveryGuarantee::AtLeastOnce);
    let (tx, rx) = std::sync::mpsc::channel();
    let runner = std::thread::spawn(move || {
        let env = StreamEnv::with_config(config);
        env.source("in", KafkaSource::<Value>::json(source), WatermarkStrategy::none())
            .sink("out", move |_| Ok(KafkaSink::new(sink.clone(), JsonSerializer)));
        let _ = tx.send(env.stop_handle());
        env.execute(job)
    });
    let stop = rx.recv_timeout(Duration::from_secs(30)).expect("the job did not build");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    Running { agent, base: format!("http://{addr}"), stop, runner }
}

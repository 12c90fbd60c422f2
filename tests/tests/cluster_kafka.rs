//! Cluster mode with Kafka in and out, against the real broker and schema registry: the
//! temperature job reads Avro readings from a 4-partition topic and writes readings and
//! window statistics through Kafka transactions, at parallelism 4 over three task managers.
//! One task manager is SIGKILLed mid-run; the job recovers on the others, and a
//! `read_committed` consumer sees exactly what the input topic implies (readings and
//! windows computed from it without the engine, `kafka_support::oracle`), and the
//! job manager shows the per-partition lag its executors report.
//!
//! Needs `CAUDAL_KAFKA_BROKERS` and `CAUDAL_SCHEMA_REGISTRY` (`scripts/services.sh start`);
//! without them the test says so and passes, unless `CAUDAL_REQUIRE_STACK` is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../jobs/tests/kafka_support/mod.rs"]
mod kafka_support;

mod cluster_support;

use cluster_support::{status, stderr, temperature, Cluster};
use kafka_support::{
    client_properties_with, create_topic, oracle, read_committed, secure_kafka, stack, unique, Stack,
};
use std::process::Command;

const READINGS: u64 = 40_000;

/// Readings and windows, each as sorted (key, Avro payload without the 5-byte header: the
/// runs write to distinct subjects, so schema ids differ).
type Output = (Vec<(Vec<u8>, Vec<u8>)>, Vec<(Vec<u8>, Vec<u8>)>);

fn published(stack: &Stack, readings: &str, windows: &str) -> Output {
    let strip = |records: Vec<(Vec<u8>, Vec<u8>)>| {
        let mut v: Vec<_> =
            records.into_iter().map(|(k, v)| (k, v.get(5..).unwrap_or_default().to_vec())).collect();
        v.sort();
        v
    };
    (strip(read_committed(stack, readings)), strip(read_committed(stack, windows)))
}

/// The job's flags: Kafka in (bounded, at most 8,000 readings/s so the run lasts ~5 s) and
/// Kafka out (exactly-once), its own output topics and transactional ids.
fn job_args(stack: &Stack, input: &str, readings: &str, windows: &str) -> Vec<String> {
    [
        "--source",
        "kafka",
        "--input-topic",
        input,
        "--bounded",
        "--max-records-per-second",
        "8000",
        "--sink",
        "kafka",
        "--output-topic",
        readings,
        "--windows-topic",
        windows,
        "--transactional-id-prefix",
        readings,
        "--brokers",
        &stack.brokers,
        "--schema-registry",
        &stack.registry,
        "--window-secs",
        "10",
        "--checkpoint-interval",
        "0.3",
        "--progress-secs",
        "0",
        "--no-ui",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A new 4-partition input topic with READINGS readings of 100 sensors (seed `seed`).
fn produce(stack: &Stack, name: &str, seed: u64) -> String {
    let input = unique(name);
    create_topic(stack, &input, 4);
    let o = Command::new(temperature())
        .args(["produce", "--topic", &input, "--sensors", "100", "--rate", "0", "--seed", &seed.to_string()])
        .args(["--records", &READINGS.to_string(), "--event-interval-ms", "100"])
        .args(["--brokers", &stack.brokers, "--schema-registry", &stack.registry])
        .output()
        .unwrap();
    assert!(o.status.success(), "produce failed: {}", stderr(&o));
    input
}

fn topics(stack: &Stack, name: &str) -> (String, String) {
    let (readings, windows) = (unique(&format!("{name}-readings")), unique(&format!("{name}-windows")));
    create_topic(stack, &readings, 2);
    create_topic(stack, &windows, 2);
    (readings, windows)
}

#[test]
fn a_killed_task_manager_with_kafka_in_and_out_commits_exactly_what_the_input_implies() {
    let Some(stack) = stack() else { return };
    let input = produce(&stack, "cluster-in", 9);

    // What the input implies (read and decoded without the engine).
    let (want_readings, want_windows) = oracle::expected(&stack, &input, 10_000);
    assert!(want_readings.len() as u64 > READINGS * 9 / 10 && want_windows.len() > 100);

    // The cluster run, losing a task manager.
    let (readings, windows) = topics(&stack, "cluster-killed");
    let mut c = Cluster::start(&[]);
    for tm in ["tm-1", "tm-2", "tm-3"] {
        c.start_taskmanager(tm, 2);
    }
    c.wait_for_task_managers(3);
    let o = c.submit(4, &job_args(&stack, &input, &readings, &windows));
    assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());
    let running = c.wait_job("temperature", 30, "running with a checkpoint", |j| {
        status(j) == "RUNNING" && j["last_checkpoint"].as_u64().is_some()
    });
    let placed = running["task_managers"].as_array().unwrap();
    let victim = placed[1].as_str().unwrap().to_string();
    c.kill_taskmanager(&victim);
    // Generous: on the 2-core machine the single test broker has stalled for up to a minute
    // under this load (KRaft metadata writes taking 55 s); the job waits it out and must
    // still end exact, which is what is checked below.
    let done = c.wait_job("temperature", 240, "FINISHED", |j| status(j) == "FINISHED");
    assert!(done["restarts"].as_u64().unwrap() >= 1, "the kill came after the end: {done:#}");
    // The executors' per-partition gauges reach the job manager's REST API: the job read
    // every partition to its end, so each lag is 0.
    let kafka = c.get("/api/v1/jobs/temperature/kafka").unwrap();
    let partitions = kafka["sources"][0]["partitions"].as_array().unwrap();
    assert_eq!(partitions.len(), 4, "{kafka:#}");
    assert!(partitions.iter().all(|p| p["lag"] == 0 && p["end_offset"].as_i64() > Some(0)), "{kafka:#}");
    let got = published(&stack, &readings, &windows);
    let (got_readings, got_windows) = (oracle::readings_of(&got.0), oracle::windows_of(&got.1));
    for (name, equal, counts) in [
        ("readings", got_readings == want_readings, (got_readings.len(), want_readings.len())),
        ("windows", got_windows == want_windows, (got_windows.len(), want_windows.len())),
    ] {
        assert!(
            equal,
            "task manager {victim} killed: {name} differ from what the input implies: {} vs {}{}",
            counts.0,
            counts.1,
            c.logs()
        );
    }
}

/// A task manager paused with its executors (SIGSTOP) past the heartbeat timeout, the job
/// recovered on the other slots, then resumed (SIGCONT) while the job runs on (#12): the old
/// attempt's producers were fenced by the new attempt's `init_transactions` on the same
/// transactional ids, its executors find their job manager gone and exit, and a
/// `read_committed` consumer sees exactly what the input implies.
#[test]
fn a_paused_task_manager_resumed_after_the_job_moved_on_leaves_the_kafka_output_exact() {
    let Some(stack) = stack() else { return };
    let input = produce(&stack, "cluster-paused-in", 17);
    let (want_readings, want_windows) = oracle::expected(&stack, &input, 10_000);

    let (readings, windows) = topics(&stack, "cluster-paused");
    let mut c = Cluster::start(&[]);
    for tm in ["tm-1", "tm-2", "tm-3"] {
        c.start_taskmanager(tm, 2);
    }
    c.wait_for_task_managers(3);
    let mut args = job_args(&stack, &input, &readings, &windows);
    let rate = args.iter().position(|a| a == "--max-records-per-second").unwrap() + 1;
    args[rate] = "2000".into(); // ~20 s: the pause, the recovery and the resume happen mid-run
    let o = c.submit(4, &args);
    assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());
    // The first checkpoint took more than 30 s in some CI runs (idle cores, no error logged;
    // the single broker's KRaft controller is the suspect, see scripts/README.md), about 2 s
    // in most: its latency is printed, and this test is about what follows it.
    let started = std::time::Instant::now();
    let running = c.wait_job("temperature", 90, "running with a checkpoint", |j| {
        status(j) == "RUNNING" && j["last_checkpoint"].as_u64().is_some()
    });
    eprintln!("first checkpoint after {:.1} s", started.elapsed().as_secs_f64());
    let victim = running["task_managers"][0].as_str().unwrap().to_string();
    c.pause_until_the_job_moved_on("temperature", &victim, &running);
    let done = c.wait_job("temperature", 240, "FINISHED", |j| status(j) == "FINISHED");
    assert!(done["restarts"].as_u64().unwrap() >= 1, "{done:#}");
    let got = published(&stack, &readings, &windows);
    let (got_readings, got_windows) = (oracle::readings_of(&got.0), oracle::windows_of(&got.1));
    assert_eq!(got_readings.len(), want_readings.len(), "readings after the pause{}", c.logs());
    assert!(got_readings == want_readings, "readings differ from what the input implies");
    assert_eq!(got_windows.len(), want_windows.len(), "windows after the pause");
    assert!(got_windows == want_windows, "windows differ from what the input implies");
}

/// Errors keep their class from the executor to the job manager: an input topic that does
/// not exist is a configuration error, so the job fails at once with its cause instead of
/// being restarted up to the cap (an outage of the checkpoint storage, by contrast, is
/// retried: `cluster.rs`).
#[test]
fn a_configuration_error_in_an_executor_fails_the_job_without_restarts() {
    let Some(stack) = stack() else { return };
    let (readings, windows) = topics(&stack, "cluster-no-input");
    let missing = unique("cluster-missing-input");
    let mut c = Cluster::start(&["--max-restarts", "5"]);
    c.start_taskmanager("tm-1", 2);
    c.wait_for_task_managers(1);
    let o = c.submit(2, &job_args(&stack, &missing, &readings, &windows));
    assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());
    let failed = c.wait_job("temperature", 60, "FAILED", |j| status(j) == "FAILED");
    let detail = failed["detail"].as_str().unwrap();
    assert!(detail.contains("not retryable") && detail.contains("does not exist"), "{failed:#}");
    assert_eq!(failed["restarts"], 0, "{failed:#}");
    assert_eq!(failed["failures"].as_array().unwrap().len(), 1, "{failed:#}");
}

/// A secured platform in a cluster (#44): a wrong SASL password and a wrong registry
/// password in the `--kafka-config` the executors read each fail the job at start with the
/// refusal named, once — no restart — and the password never reaches the job manager's
/// view.
#[test]
fn a_wrong_kafka_or_registry_password_fails_a_cluster_job_at_start_without_restarts() {
    let Some(stack) = stack() else { return };
    let Some(secure) = secure_kafka() else { return };
    let input = unique("cluster-secure-in");
    create_topic(&stack, &input, 2);
    let (readings, windows) = topics(&stack, "cluster-secure");
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(&["--max-restarts", "5"]);
    c.start_taskmanager("tm-1", 2);
    c.wait_for_task_managers(1);
    for (what, key, cause) in [
        ("kafka", "sasl.password=", "uthentication failed"),
        ("registry", "basic.auth.user.info=caudal:", "HTTP 401"),
    ] {
        let wrong = client_properties_with(&secure.config, key, &format!("{key}not-the-password"));
        let config = dir.path().join(format!("{what}.properties"));
        std::fs::write(&config, wrong).unwrap();
        let mut args = job_args(&stack, &input, &readings, &windows);
        let at = args.iter().position(|a| a == "--schema-registry").unwrap();
        args.drain(at..at + 2);
        let at = args.iter().position(|a| a == "--brokers").unwrap();
        args[at + 1] = secure.brokers.clone();
        args.extend(["--kafka-config".to_owned(), config.display().to_string()]);
        let o = c.submit(2, &args);
        assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());
        let failed = c.wait_job("temperature", 90, &format!("FAILED on the {what} password"), |j| {
            status(j) == "FAILED" && j["detail"].as_str().is_some_and(|d| d.contains(cause))
        });
        let detail = failed["detail"].as_str().unwrap();
        assert!(detail.contains("not retryable"), "{what}: {failed:#}");
        assert_eq!(failed["restarts"], 0, "{what}: {failed:#}");
        assert_eq!(failed["failures"].as_array().unwrap().len(), 1, "{what}: {failed:#}");
        assert!(
            !failed.to_string().contains("not-the-password"),
            "{what}: the password was shown: {failed:#}"
        );
    }
}

//! Kafka broker failover (#12): a private 3-broker KRaft cluster (`scripts/services.sh start
//! kafka1 kafka2 kafka3`, replication factor 3, `min.insync.replicas` 2, the transaction
//! state log replicated), an exactly-once Kafka → Kafka run of the temperature job, and the
//! broker that leads an output partition — and a partition of the transaction state log,
//! so the coordinator of some of the job's transactions — SIGKILLed mid-run and started
//! again later. Meanwhile the job's REST API shows the under-replicated partitions (the web
//! UI's broker-health panel reads it). A `read_committed` consumer then sees exactly what the
//! input topic implies (`kafka_support::oracle`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kafka_support;

use caudal_test_stack::free_port;
use kafka_support::{oracle, read_committed, stack, unique, Stack};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const READINGS: u64 = 300_000;

/// Three brokers of a cluster of their own, in a temp folder; purged when dropped.
struct Brokers {
    dir: tempfile::TempDir,
    ports: Vec<u16>,
    controller_ports: Vec<u16>,
}

impl Brokers {
    fn services(&self, cmd: &str, which: &[&str]) {
        let script = std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")), std::path::PathBuf::from)
            .join("../scripts/services.sh");
        let join = |p: &[u16]| p.iter().map(u16::to_string).collect::<Vec<_>>().join(",");
        let out = Command::new(script)
            .arg(cmd)
            .args(which)
            .env("CAUDAL_STACK_DIR", self.dir.path())
            .env("CAUDAL_KAFKA_NODE_PORTS", join(&self.ports))
            .env("CAUDAL_KAFKA_NODE_CONTROLLER_PORTS", join(&self.controller_ports))
            .env("CAUDAL_NO_INSTALL", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "services.sh {cmd} {which:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn start() -> Brokers {
        let b = Brokers {
            dir: tempfile::tempdir().unwrap(),
            ports: (0..3).map(|_| free_port()).collect(),
            controller_ports: (0..3).map(|_| free_port()).collect(),
        };
        b.services("start", &["kafka1", "kafka2", "kafka3"]);
        b
    }

    fn bootstrap(&self) -> String {
        self.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect::<Vec<_>>().join(",")
    }

    /// SIGKILLs node `n` (1..=3).
    fn kill(&self, n: i32) {
        let pidfile = self.dir.path().join(format!("kafka{n}/kafka{n}.pid"));
        let pid = std::fs::read_to_string(&pidfile).unwrap().trim().to_string();
        let out = Command::new("kill").args(["-KILL", &pid]).output().unwrap();
        assert!(out.status.success(), "kill {pid}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for Brokers {
    fn drop(&mut self) {
        self.services("purge", &["kafka1", "kafka2", "kafka3"]);
    }
}

fn create_replicated(brokers: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", brokers).create().unwrap();
    let topic_def =
        NewTopic::new(topic, partitions, TopicReplication::Fixed(3)).set("min.insync.replicas", "2");
    let results =
        futures::executor::block_on(admin.create_topics(
            &[topic_def],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        ))
        .expect("create topics");
    for r in results {
        r.map_err(|(t, e)| format!("creating {t}: {e}")).unwrap();
    }
}

/// The broker ids leading each partition of `topic`.
fn leaders(brokers: &str, topic: &str) -> Vec<i32> {
    let c: BaseConsumer = ClientConfig::new().set("bootstrap.servers", brokers).create().unwrap();
    let md = c.fetch_metadata(Some(topic), Duration::from_secs(10)).unwrap();
    md.topics()[0].partitions().iter().map(|p| p.leader()).collect()
}

fn spawn_job(
    stack: &Stack,
    input: &str,
    readings: &str,
    windows: &str,
    ckpt: &Path,
    ui: u16,
    restore: bool,
) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_temperature"));
    cmd.args(["--source", "kafka", "--input-topic", input, "--bounded", "--max-records-per-second", "5000"])
        .args(["--sink", "kafka", "--output-topic", readings, "--windows-topic", windows])
        .args(["--transactional-id-prefix", readings, "--brokers", &stack.brokers])
        .args(["--schema-registry", &stack.registry, "--window-secs", "10", "--parallelism", "2"])
        .args(["--checkpoint-interval", "0.3", "--progress-secs", "1"])
        .args(["--ui-bind", &format!("127.0.0.1:{ui}")])
        .arg("--checkpoint-dir")
        .arg(ckpt)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if restore {
        cmd.args(["--restore", "latest"]);
    }
    cmd.spawn().unwrap()
}

#[test]
fn a_broker_leading_an_output_partition_and_transactions_killed_mid_run_loses_and_repeats_nothing() {
    let Some(shared) = stack() else { return };
    let brokers = Brokers::start();
    let stack = Stack { brokers: brokers.bootstrap(), registry: shared.registry.clone() };
    let (input, readings, windows) = (unique("fo-in"), unique("fo-readings"), unique("fo-windows"));
    create_replicated(&stack.brokers, &input, 4);
    create_replicated(&stack.brokers, &readings, 2);
    create_replicated(&stack.brokers, &windows, 2);
    let o = Command::new(env!("CARGO_BIN_EXE_temperature"))
        .args(["produce", "--topic", &input, "--sensors", "100", "--rate", "0", "--seed", "13"])
        .args(["--records", &READINGS.to_string(), "--event-interval-ms", "100"])
        .args(["--brokers", &stack.brokers, "--schema-registry", &stack.registry])
        .output()
        .unwrap();
    assert!(o.status.success(), "produce failed: {}", String::from_utf8_lossy(&o.stderr));

    let ckpt = tempfile::tempdir().unwrap();
    let ui = free_port();
    let mut child = spawn_job(&stack, &input, &readings, &windows, ckpt.path(), ui, false);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(2)))
        .build()
        .into();
    let kafka_api = || -> Option<serde_json::Value> {
        let mut r = agent.get(format!("http://127.0.0.1:{ui}/api/v1/jobs/temperature/kafka")).call().ok()?;
        r.body_mut().read_json().ok()
    };
    // Running, with a checkpoint, all partitions in sync.
    let start = Instant::now();
    while !std::fs::read_dir(ckpt.path().join("temperature"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| e.path().join("_metadata").exists())
    {
        assert!(start.elapsed() < Duration::from_secs(60), "no checkpoint completed");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The victim leads an output partition and the readings sink sends to it (its
    // statistics come every second): the kill hits a broker the producers use.
    let requests_to = |v: &serde_json::Value, broker: i32| -> i64 {
        v["producers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["broker"].as_i64() == Some(i64::from(broker)) && p["operator"] == "readings-sink")
            .filter_map(|p| p["requests"].as_i64())
            .sum()
    };
    let asked = Instant::now();
    let victim = loop {
        let output_leaders = leaders(&stack.brokers, &readings);
        let used = kafka_api().and_then(|v| {
            output_leaders
                .iter()
                .copied()
                .filter(|&b| requests_to(&v, b) > 0)
                .max_by_key(|&b| requests_to(&v, b))
        });
        if let Some(b) = used {
            break b;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(30),
            "the readings sink sends to none of its partitions' leaders {output_leaders:?}: {:?}",
            kafka_api()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let coordinates = leaders(&stack.brokers, "__transaction_state");
    assert!(
        coordinates.contains(&victim),
        "broker {victim} leads no partition of the transaction state log ({coordinates:?})"
    );
    brokers.kill(victim);
    let killed = Instant::now();
    // The broker-health panel's numbers: under-replicated partitions while it is down.
    let shrinks = |v: &serde_json::Value, what: &str| -> u64 {
        v["health"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|h| h["partitions"].as_array().into_iter().flatten())
            .filter_map(|p| p[what].as_u64())
            .sum()
    };
    // ... and the ISR shrinks the probe counted (#14: the reference platform's ISR shrink rate).
    let seen = loop {
        if let Some(v) = kafka_api()
            .filter(|v| v["under_replicated_partitions"].as_u64() > Some(0) && shrinks(v, "isr_shrinks") > 0)
        {
            break v;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(40),
            "no under-replicated partition shown: {:?}",
            kafka_api()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!(
        "broker {victim} killed; {} partitions under-replicated after {:?}",
        seen["under_replicated_partitions"],
        killed.elapsed()
    );
    // The sinks' producers saw the broker go (#14: producer error rate): lost connections,
    // errors, retries or timeouts towards it.
    let troubles = |v: &serde_json::Value| -> i64 {
        v["producers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["broker"].as_i64() == Some(i64::from(victim)))
            .map(|p| {
                ["disconnects", "errors", "retries", "timeouts"]
                    .iter()
                    .filter_map(|w| p[*w].as_i64())
                    .sum::<i64>()
            })
            .sum()
    };
    loop {
        match kafka_api() {
            Some(v) if troubles(&v) > 0 => break,
            Some(v) => assert!(
                killed.elapsed() < Duration::from_secs(60),
                "the producers report no trouble with the killed broker {victim}: {v}"
            ),
            // The job failed over the lost broker (its restore is checked below).
            None => {
                eprintln!("the job ended before its producers' statistics were read");
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // A run that failed over the lost broker is restored now, on the two brokers left (the
    // topics need two in sync), so that a job runs while the third comes back.
    if child.try_wait().unwrap().is_some() {
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success(), "the input (~60 s) ended before the broker came back");
        eprintln!(
            "the job failed over the lost broker; restoring:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        child = spawn_job(&stack, &input, &readings, &windows, ckpt.path(), ui, true);
        let started = Instant::now();
        while kafka_api().is_none_or(|v| v["health"].as_array().is_none_or(|h| h.is_empty())) {
            assert!(started.elapsed() < Duration::from_secs(30), "the restored job shows no broker health");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    brokers.services("start", &[&format!("kafka{victim}")]);
    // Back in sync: the ISR expands the probe counts while the job still runs. The input
    // lasts well past this; a job that fails as the broker returns (leaders move back) is
    // the one case that cannot show it (a restored run starts in sync): said.
    let back = Instant::now();
    loop {
        if let Some(v) = kafka_api() {
            if shrinks(&v, "isr_expands") > 0 {
                eprintln!("ISR expanded again after {:?}", back.elapsed());
                break;
            }
        } else if let Some(status) = child.try_wait().unwrap() {
            assert!(!status.success(), "the input ended before the ISR expanded again");
            eprintln!("the job failed as broker {victim} came back, before the ISR expanded");
            break;
        }
        assert!(back.elapsed() < Duration::from_secs(90), "no ISR expand counted after the restart");
        std::thread::sleep(Duration::from_millis(500));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    // Whether it rode out the failover or was restored after it, the output must be exact;
    // a restored run that fails again is restored once more (said).
    if out.status.success() {
        eprintln!("the job ended:\n{err}");
    } else {
        eprintln!("the job failed; restoring:\n{err}");
        let restored = spawn_job(&stack, &input, &readings, &windows, ckpt.path(), free_port(), true);
        let out = restored.wait_with_output().unwrap();
        assert!(out.status.success(), "the restore failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let (want_readings, want_windows) = oracle::expected(&stack, &input, 10_000);
    let strip = |records: Vec<(Vec<u8>, Vec<u8>)>| -> Vec<(Vec<u8>, Vec<u8>)> {
        records.into_iter().map(|(k, v)| (k, v.get(5..).unwrap_or_default().to_vec())).collect()
    };
    let got_readings = oracle::readings_of(&strip(read_committed(&stack, &readings)));
    let got_windows = oracle::windows_of(&strip(read_committed(&stack, &windows)));
    assert_eq!(got_readings.len(), want_readings.len(), "readings after the failover");
    assert!(got_readings == want_readings, "readings differ from the input's");
    if got_windows != want_windows {
        let missing: Vec<_> = want_windows.iter().filter(|w| got_windows.binary_search(w).is_err()).collect();
        let sensors: std::collections::BTreeSet<i64> = missing.iter().map(|w| w.0).collect();
        let starts: std::collections::BTreeSet<i64> = missing.iter().map(|w| w.1).collect();
        eprintln!("{} windows missing: sensors {sensors:?}, window starts {starts:?}", missing.len());
    }
    assert_eq!(got_windows.len(), want_windows.len(), "windows after the failover");
    assert!(got_windows == want_windows, "windows differ from the input's");
}

//! The soak (#12): a bounded Kafka → Kafka run of 1,000,000 readings at parallelism 4 on a
//! job manager and three task managers, exactly-once, with SIGKILLs at random moments spread
//! over task managers (started again under a new name), executors and the job manager
//! (started again with the same data directory). A `read_committed` consumer must then see
//! exactly what the input topic implies (`kafka_support::oracle`: readings and window
//! statistics computed without the engine).
//!
//! `CAUDAL_SOAK_KILLS` sets the number of kills (default 12, what the test command runs;
//! `scripts/test.sh --soak` runs 50); `CAUDAL_SOAK_SEED` replays the kills of a printed seed.
//! The run is throttled (`RATE`) so that it outlasts the kills, which are spread over about
//! half of its nominal length; it is bounded by the input, the kills by their number. Every
//! kill must land on a live process before the run ends, the first three hit one process of
//! each kind (in an order the seed picks), and the restarts stay within two per kill.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../jobs/tests/kafka_support/mod.rs"]
mod kafka_support;

mod cluster_support;

use cluster_support::{status, stderr, temperature, Cluster};
use kafka_support::{create_topic, oracle, read_committed, stack, unique};
use std::process::Command;
use std::time::{Duration, Instant};

const READINGS: u64 = 1_000_000;
/// Readings per second, all source subtasks together: the run takes at least
/// `READINGS / RATE` seconds of processing, however fast the machine (restarts add to it).
const RATE: u64 = 10_000;

fn kills() -> usize {
    std::env::var("CAUDAL_SOAK_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(12)
}

/// The kinds of process the soak kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Victim {
    JobManager,
    TaskManager,
    Executor,
}

/// A small deterministic generator (the seed is printed, so a failing soak can be replayed).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n.max(1)
    }
}

#[test]
fn a_million_readings_kafka_to_kafka_under_random_kills_of_every_process_is_exact() {
    let Some(stack) = stack() else { return };
    let input = unique("soak-in");
    create_topic(&stack, &input, 4);
    let o = Command::new(temperature())
        .args(["produce", "--topic", &input, "--sensors", "1000", "--rate", "0", "--seed", "21"])
        .args(["--records", &READINGS.to_string(), "--event-interval-ms", "100"])
        .args(["--brokers", &stack.brokers, "--schema-registry", &stack.registry])
        .output()
        .unwrap();
    assert!(o.status.success(), "produce failed: {}", stderr(&o));
    let (readings, windows) = (unique("soak-readings"), unique("soak-windows"));
    create_topic(&stack, &readings, 4);
    create_topic(&stack, &windows, 4);

    let max_restarts = 2 * kills() + 2;
    let mut c = Cluster::start(&["--max-restarts", &max_restarts.to_string()]);
    let mut names = vec!["tm-1".to_string(), "tm-2".to_string(), "tm-3".to_string()];
    for tm in &names {
        c.start_taskmanager(tm, 2);
    }
    c.wait_for_task_managers(3);
    let args: Vec<String> = [
        "--source",
        "kafka",
        "--input-topic",
        &input,
        "--bounded",
        "--max-records-per-second",
        &RATE.to_string(),
        "--sink",
        "kafka",
        "--output-topic",
        &readings,
        "--windows-topic",
        &windows,
        "--transactional-id-prefix",
        &readings,
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
    .collect();
    let o = c.submit(4, &args);
    assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());

    let seed = std::env::var("CAUDAL_SOAK_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("soak: seed {seed}, {} kills", kills());
    let mut rng = Rng(seed);
    // The first three kills hit each kind of process once, in an order of the seed's.
    let mut kinds = [Victim::JobManager, Victim::TaskManager, Victim::Executor];
    let first = rng.below(3) as usize;
    kinds.swap(0, first);
    let second = 1 + rng.below(2) as usize;
    kinds.swap(1, second);
    let mut hit = std::collections::BTreeSet::new();
    let started = Instant::now();
    let mut done = None;
    let mut log = Vec::new();
    for k in 0..kills() {
        // Running (again), with a checkpoint of this attempt or an earlier one.
        let running = c.wait_job("temperature", 120, "running", |j| {
            matches!(status(j), "RUNNING" | "FINISHED") && j["last_checkpoint"].as_u64().is_some()
        });
        if status(&running) == "FINISHED" {
            done = Some(running);
            break;
        }
        // Spread over the first half of the run's processing time on average (the wait for
        // "running" above does not count: the job makes no progress while it restarts), so
        // the kills land in every phase of it and all of them before its end.
        let spread_ms = READINGS * 1000 / RATE;
        std::thread::sleep(Duration::from_millis(500 + rng.below(spread_ms / kills().max(1) as u64)));
        let kind = match kinds.get(k) {
            Some(kind) => *kind,
            None => match rng.below(10) {
                0 | 1 => Victim::JobManager,
                2..=5 => Victim::TaskManager,
                _ => Victim::Executor,
            },
        };
        let victim = match kind {
            Victim::JobManager => {
                c.kill_jobmanager();
                c.start_jobmanager();
                "the job manager".to_string()
            }
            Victim::TaskManager => {
                let i = rng.below(names.len() as u64) as usize;
                let name = names.remove(i);
                c.kill_taskmanager(&name);
                let next = format!("tm-{}", k + 4);
                c.start_taskmanager(&next, 2);
                names.push(next.clone());
                format!("task manager {name} (replaced by {next})")
            }
            Victim::Executor => {
                // An executor of a task manager that runs one (a fresh task manager may run
                // none): a kill that finds no process would not count.
                let deadline = Instant::now() + Duration::from_secs(60);
                let (name, pid) = loop {
                    let offset = rng.below(names.len() as u64) as usize;
                    let found =
                        (0..names.len()).map(|i| &names[(offset + i) % names.len()]).find_map(|name| {
                            let executors: Vec<u32> = c.taskmanager_pids(name).into_iter().skip(1).collect();
                            executors.first().map(|pid| (name.clone(), *pid))
                        });
                    if let Some(found) = found {
                        break found;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "no executor to kill for 60 s (kill {k}, seed {seed})"
                    );
                    std::thread::sleep(Duration::from_millis(100));
                };
                Cluster::signal(&[pid], "KILL");
                format!("executor {pid} of {name}")
            }
        };
        hit.insert(kind);
        log.push(format!("{:>6.1}s kill {k}: {victim}", started.elapsed().as_secs_f64()));
    }
    let done = match done {
        Some(d) => d,
        None => c.wait_job("temperature", 300, "FINISHED", |j| status(j) == "FINISHED"),
    };
    eprintln!(
        "soak: {}\nfinished after {:?}, {} restarts",
        log.join("\n"),
        started.elapsed(),
        done["restarts"]
    );
    assert_eq!(log.len(), kills(), "the run ended before every kill landed (seed {seed}): {log:#?}");
    assert_eq!(hit.len(), 3, "not every kind of process was killed (seed {seed}): {log:#?}");
    let restarts = done["restarts"].as_u64().unwrap();
    assert!(
        restarts as usize <= max_restarts,
        "{restarts} restarts for {} kills (seed {seed}): {log:#?}",
        kills()
    );

    let (want_readings, want_windows) = oracle::expected(&stack, &input, 10_000);
    let strip = |records: Vec<(Vec<u8>, Vec<u8>)>| -> Vec<(Vec<u8>, Vec<u8>)> {
        records.into_iter().map(|(k, v)| (k, v.get(5..).unwrap_or_default().to_vec())).collect()
    };
    let got_readings = oracle::readings_of(&strip(read_committed(&stack, &readings)));
    let got_windows = oracle::windows_of(&strip(read_committed(&stack, &windows)));
    assert_eq!(got_readings.len(), want_readings.len(), "readings: seed {seed}\n{}", log.join("\n"));
    assert!(got_readings == want_readings, "readings differ from the input's: seed {seed}");
    assert_eq!(got_windows.len(), want_windows.len(), "windows: seed {seed}\n{}", log.join("\n"));
    assert!(got_windows == want_windows, "windows differ from the input's: seed {seed}");
}

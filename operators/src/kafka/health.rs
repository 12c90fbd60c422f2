//! Broker health seen from the client: per partition of a source's or sink's topic, its
//! leader, its replicas and its in-sync replicas, from the cluster metadata.
//!
//! librdkafka's statistics carry no ISR, so a probe thread of its own (one per source subtask,
//! and one per sink, on subtask 0) asks for the topic's metadata every [`HEALTH_INTERVAL`] —
//! first right at start — and publishes the answer as the partition gauges
//! `kafka.<topic>.<partition>.{leader,replicas,in_sync_replicas}` of
//! [`caudal::metrics::kafka_gauges`]. A partition whose in-sync replicas are fewer than its
//! replicas is under-replicated (the REST API and the UI flag it). The probe never runs on a
//! task thread, so a slow or unreachable broker does not stall records; when the metadata
//! cannot be read the gauges go back to unknown (-1).
//!
//! Between two answers it also counts, per partition, how often the in-sync replicas shrank
//! and expanded (`isr_shrinks`, `isr_expands`: what brokers report as their ISR shrink and
//! expand rates, seen from the client), and it keeps the topic's partition ids, so a source
//! discovers partitions added while it runs.

use caudal::metrics::{kafka_gauges as g, SubtaskMetrics};
use parking_lot::Mutex;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the metadata is read again.
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(10);

/// How long one metadata request may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(5);

/// The health gauges of one partition.
struct PartitionHealth {
    leader: Arc<AtomicI64>,
    replicas: Arc<AtomicI64>,
    in_sync: Arc<AtomicI64>,
    shrinks: Arc<AtomicI64>,
    expands: Arc<AtomicI64>,
    /// The in-sync replicas of the last answer (-1: none yet).
    last_in_sync: i64,
}

impl PartitionHealth {
    fn set(&mut self, leader: i64, replicas: i64, in_sync: i64) {
        self.leader.store(leader, Ordering::Relaxed);
        self.replicas.store(replicas, Ordering::Relaxed);
        self.in_sync.store(in_sync, Ordering::Relaxed);
        if in_sync >= 0 {
            if self.last_in_sync >= 0 && in_sync < self.last_in_sync {
                self.shrinks.fetch_add(1, Ordering::Relaxed);
            } else if self.last_in_sync >= 0 && in_sync > self.last_in_sync {
                self.expands.fetch_add(1, Ordering::Relaxed);
            }
            self.last_in_sync = in_sync;
        }
    }
}

/// Which of the topic's partitions a probe publishes gauges for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Probed {
    /// Every partition (a sink, on subtask 0).
    All,
    /// Those of a source subtask: partition p belongs to subtask p mod parallelism.
    OfSubtask { subtask: u32, parallelism: u32 },
}

impl Probed {
    pub(crate) fn covers(self, partition: i32) -> bool {
        match self {
            Probed::All => true,
            Probed::OfSubtask { subtask, parallelism } => {
                u32::try_from(partition).is_ok_and(|p| p % parallelism.max(1) == subtask)
            }
        }
    }
}

/// A running probe; dropping it stops the thread (which may finish a request first).
pub(crate) struct HealthProbe {
    stop: Arc<AtomicBool>,
    /// Every partition id of the topic in the last answer (empty before the first).
    partitions: Arc<Mutex<Vec<i32>>>,
}

impl Drop for HealthProbe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl HealthProbe {
    /// Probes `partitions` of `topic` (all of them when `None`) on `brokers`, with the
    /// security settings among `properties`, into the gauges of `metrics`.
    pub(crate) fn start(
        brokers: &str,
        properties: &[(String, String)],
        topic: &str,
        probed: Probed,
        interval: Duration,
        metrics: Arc<SubtaskMetrics>,
    ) -> Option<HealthProbe> {
        // No probe is better than a failed job: health is for display only.
        let consumer: BaseConsumer = super::connection_config(brokers, properties).create().ok()?;
        let stop = Arc::new(AtomicBool::new(false));
        let partitions = Arc::new(Mutex::new(Vec::new()));
        let (flag, seen) = (stop.clone(), partitions.clone());
        let topic = topic.to_string();
        std::thread::Builder::new()
            .name(format!("kafka-health {topic}"))
            .spawn(move || run(consumer, &topic, probed, interval, &metrics, &seen, &flag))
            .ok()?;
        Some(HealthProbe { stop, partitions })
    }

    /// The topic's partition ids as last read (empty before the first answer).
    pub(crate) fn partitions(&self) -> Vec<i32> {
        self.partitions.lock().clone()
    }
}

fn run(
    consumer: BaseConsumer,
    topic: &str,
    probed: Probed,
    interval: Duration,
    metrics: &SubtaskMetrics,
    seen: &Mutex<Vec<i32>>,
    stop: &AtomicBool,
) {
    let mut gauges: BTreeMap<i32, PartitionHealth> = BTreeMap::new();
    let gauge = |p: i32, what: &str| metrics.gauge(g::name(topic, p, what));
    while !stop.load(Ordering::Relaxed) {
        match consumer.fetch_metadata(Some(topic), METADATA_TIMEOUT) {
            Ok(metadata) => {
                for t in metadata.topics().iter().filter(|t| t.name() == topic && t.error().is_none()) {
                    *seen.lock() = t.partitions().iter().map(|p| p.id()).collect();
                    for p in t.partitions() {
                        if !probed.covers(p.id()) {
                            continue;
                        }
                        let h = gauges.entry(p.id()).or_insert_with(|| PartitionHealth {
                            leader: gauge(p.id(), g::LEADER),
                            replicas: gauge(p.id(), g::REPLICAS),
                            in_sync: gauge(p.id(), g::IN_SYNC_REPLICAS),
                            shrinks: gauge(p.id(), g::ISR_SHRINKS),
                            expands: gauge(p.id(), g::ISR_EXPANDS),
                            last_in_sync: -1,
                        });
                        h.set(i64::from(p.leader()), p.replicas().len() as i64, p.isr().len() as i64);
                    }
                }
            }
            Err(_) => {
                for h in gauges.values_mut() {
                    h.set(-1, -1, -1);
                }
            }
        }
        let next = Instant::now() + interval;
        while Instant::now() < next && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

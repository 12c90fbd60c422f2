//! Counters per operator and subtask, shared between tasks, the progress line and the REST API.
//!
//! Counters are relaxed atomics updated once per batch, never per record. Latency is a
//! histogram per subtask fed by latency markers (a few per second, never per record).

use crate::types::{Timestamp, MIN_WATERMARK};
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

/// Metric names, in one place.
pub mod names {
    /// Records that arrived after their window was cleaned up.
    pub const LATE_RECORDS: &str = "late_records";
    /// Windows fired (results emitted).
    pub const WINDOWS_FIRED: &str = "windows_fired";
    /// Milliseconds a keyed operator subtask spent restoring its keyed state (download,
    /// verify, open, rescale) at start.
    pub const STATE_RESTORE_MS: &str = "state_restore_ms";
    /// Milliseconds a window operator subtask spent rebuilding its timers from the restored
    /// state (part of [`STATE_RESTORE_MS`]).
    pub const TIMER_REBUILD_MS: &str = "timer_rebuild_ms";
    /// Attempts a sink repeated after a transient failure of its external service.
    pub const SINK_RETRIES: &str = "sink_retries";
}

/// The per-partition gauges a Kafka source (lag, health) or sink (health) publishes,
/// `kafka.<topic>.<partition>.<what>`: the connector writes them, the REST API, the UI and
/// `/metrics` read them back.
pub mod kafka_gauges {
    /// The partition's end offset: its last stable offset (what a `read_committed` reader
    /// can reach) from the client's statistics; negative until the first statistics arrive.
    pub const END_OFFSET: &str = "end_offset";
    /// The next offset of the partition in the last completed checkpoint (past transaction
    /// markers the consumer had stepped over: they take an offset but hold no record);
    /// negative before one.
    pub const CHECKPOINTED_OFFSET: &str = "checkpointed_offset";
    /// `end_offset - checkpointed_offset` (records not yet covered by a checkpoint);
    /// negative while the end offset is unknown.
    pub const LAG: &str = "lag";
    /// Broker health (sources and sinks): the broker id of the partition's leader (-1: none
    /// or unknown), from the cluster metadata.
    pub const LEADER: &str = "leader";
    /// Broker health: how many replicas the partition has (-1: unknown).
    pub const REPLICAS: &str = "replicas";
    /// Broker health: how many of them are in sync (-1: unknown); fewer than
    /// [`REPLICAS`] means under-replicated.
    pub const IN_SYNC_REPLICAS: &str = "in_sync_replicas";
    /// Broker health: how often the in-sync replicas shrank since the job started, between
    /// two metadata answers (a counter, kept as a gauge of the partition).
    pub const ISR_SHRINKS: &str = "isr_shrinks";
    /// Broker health: how often the in-sync replicas expanded again since the job started.
    pub const ISR_EXPANDS: &str = "isr_expands";
    /// The partition's watermark in the source (its split's bounded-out-of-orderness
    /// watermark, ms since the epoch); negative before its first record.
    pub const WATERMARK: &str = "watermark";

    /// The gauge name of `what` for partition `partition` of `topic`.
    pub fn name(topic: &str, partition: i32, what: &str) -> String {
        format!("kafka.{topic}.{partition}.{what}")
    }

    /// `(topic, partition, what)` of a gauge name made by [`name`] (topics may contain
    /// dots; partitions and `what` do not).
    pub fn parse(name: &str) -> Option<(&str, i32, &str)> {
        let rest = name.strip_prefix("kafka.")?;
        let (rest, what) = rest.rsplit_once('.')?;
        let (topic, partition) = rest.rsplit_once('.')?;
        let partition = partition.parse().ok()?;
        (!topic.is_empty()).then_some((topic, partition, what))
    }
}

/// What a Kafka sink subtask's producers see of each broker, from librdkafka's statistics
/// (every second): `kafka_producer.<broker id>.<what>`. Counters are summed over the
/// subtask's producers (an exactly-once sink has a small pool); latencies are the largest of
/// their last statistics window.
pub mod kafka_producer_gauges {
    /// Produce request round-trip time, median of the last window, microseconds.
    pub const RTT_P50_US: &str = "rtt_p50_us";
    /// Produce request round-trip time, 99th percentile of the last window, microseconds.
    pub const RTT_P99_US: &str = "rtt_p99_us";
    /// Requests sent to the broker.
    pub const REQUESTS: &str = "requests";
    /// Transmission errors.
    pub const ERRORS: &str = "errors";
    /// Requests sent again.
    pub const RETRIES: &str = "retries";
    /// Requests that timed out.
    pub const TIMEOUTS: &str = "timeouts";
    /// Connections to the broker that were lost.
    pub const DISCONNECTS: &str = "disconnects";
    /// Every `what`, in display order.
    pub const ALL: [&str; 7] = [RTT_P50_US, RTT_P99_US, REQUESTS, ERRORS, RETRIES, TIMEOUTS, DISCONNECTS];

    /// The values of [`ALL`] before any statistics: latencies unknown (-1), counts 0.
    pub const NONE: [i64; 7] = [-1, -1, 0, 0, 0, 0, 0];

    /// Adds `v` (values in the order of [`ALL`]) to `into`: the larger latency, summed counts
    /// (negative counts, "unknown", count as 0).
    pub fn merge(into: &mut [i64; 7], v: &[i64; 7]) {
        for (i, (t, v)) in into.iter_mut().zip(v).enumerate() {
            *t = if i < 2 { (*t).max(*v) } else { *t + (*v).max(0) };
        }
    }

    /// The gauge name of `what` for broker `broker`.
    pub fn name(broker: i32, what: &str) -> String {
        format!("kafka_producer.{broker}.{what}")
    }

    /// `(broker, what)` of a gauge name made by [`name`].
    pub fn parse(name: &str) -> Option<(i32, &str)> {
        let rest = name.strip_prefix("kafka_producer.")?;
        let (broker, what) = rest.split_once('.')?;
        Some((broker.parse().ok()?, what))
    }
}

/// The per-transaction gauges an exactly-once Kafka sink publishes,
/// `kafka_txn.<transactional id>.<what>`, one set per transactional id of its small pool: the
/// sink writes them when a transaction changes state, the REST API and the UI read them back.
pub mod kafka_txn_gauges {
    /// [`STATE_IDLE`], [`STATE_OPEN`], [`STATE_PRE_COMMITTED`] or [`STATE_COMMITTING`].
    pub const STATE: &str = "state";
    /// The producer id the transaction coordinator assigned to the transactional id.
    pub const PRODUCER_ID: &str = "producer_id";
    /// The producer epoch of the transaction.
    pub const PRODUCER_EPOCH: &str = "producer_epoch";
    /// The checkpoint the transaction belongs to: the one whose barrier pre-committed it, or
    /// for an open transaction the next checkpoint.
    pub const CHECKPOINT: &str = "checkpoint";
    /// When its first record was written (the broker's timeout clock starts then), ms since
    /// the epoch; negative before.
    pub const OPENED_MS: &str = "opened_ms";
    /// Records written into it (updated once per batch).
    pub const RECORDS: &str = "records";
    /// The sink's `transaction.timeout.ms`.
    pub const TIMEOUT_MS: &str = "timeout_ms";

    /// No transaction under this id (free, or committed).
    pub const STATE_IDLE: i64 = 0;
    /// Open: records of the current epoch go into it.
    pub const STATE_OPEN: i64 = 1;
    /// Flushed at a barrier, waiting for its checkpoint to complete.
    pub const STATE_PRE_COMMITTED: i64 = 2;
    /// Its checkpoint completed; the commit is in progress.
    pub const STATE_COMMITTING: i64 = 3;

    /// The gauge name of `what` for transactional id `id`.
    pub fn name(id: &str, what: &str) -> String {
        format!("kafka_txn.{id}.{what}")
    }

    /// `(transactional id, what)` of a gauge name made by [`name`] (ids may contain dots).
    pub fn parse(name: &str) -> Option<(&str, &str)> {
        let rest = name.strip_prefix("kafka_txn.")?;
        let (id, what) = rest.rsplit_once('.')?;
        (!id.is_empty()).then_some((id, what))
    }

    /// The name of a state value, `None` for [`STATE_IDLE`] and unknown values.
    pub fn state_name(state: i64) -> Option<&'static str> {
        match state {
            STATE_OPEN => Some("open"),
            STATE_PRE_COMMITTED => Some("pre_committed"),
            STATE_COMMITTING => Some("committing"),
            _ => None,
        }
    }
}

/// Names of the info entries ([`SubtaskMetrics::set_info`]) that hold a Kafka connector's
/// effective client settings: `kafka.consumer.<property>` and `kafka.producer.<property>`.
pub mod kafka_client_settings {
    /// A Kafka source's consumer.
    pub const CONSUMER: &str = "consumer";
    /// A Kafka sink's producers (one setting list for all of a subtask's producers; the
    /// per-producer `transactional.id` is left out).
    pub const PRODUCER: &str = "producer";

    /// The info name of `property` of a `client` ([`CONSUMER`] or [`PRODUCER`]).
    pub fn name(client: &str, property: &str) -> String {
        format!("kafka.{client}.{property}")
    }

    /// `(client, property)` of an info name made by [`name`].
    pub fn parse(name: &str) -> Option<(&str, &str)> {
        let rest = name.strip_prefix("kafka.")?;
        let (client, property) = rest.split_once('.')?;
        (matches!(client, CONSUMER | PRODUCER) && !property.is_empty()).then_some((client, property))
    }
}

/// How long a latency histogram window lasts: a read covers the current window and the one
/// before, i.e. the last 30 to 60 s.
pub const LATENCY_WINDOW: std::time::Duration = std::time::Duration::from_secs(30);

/// The record latency one operator subtask saw (from latency markers), over the last
/// [`LATENCY_WINDOW`] to twice that: `hdrhistogram`s of microseconds at 2 significant digits
/// (1 % resolution), the summary recomputed at each marker (a few per second) so that reads
/// copy it.
#[derive(Debug)]
pub struct LatencyHistogram {
    current: hdrhistogram::Histogram<u64>,
    /// The previous window plus the current one.
    window: hdrhistogram::Histogram<u64>,
    started: std::time::Instant,
    summary: Option<LatencySummary>,
}

fn new_histogram() -> hdrhistogram::Histogram<u64> {
    // 1 µs to 1 s to start with (a few KB), growing when a slower marker arrives.
    let mut h = hdrhistogram::Histogram::new_with_bounds(1, 1_000_000, 2)
        .unwrap_or_else(|_| unreachable!("valid histogram bounds"));
    h.auto(true);
    h
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            current: new_histogram(),
            window: new_histogram(),
            started: std::time::Instant::now(),
            summary: None,
        }
    }
}

impl LatencyHistogram {
    /// Record one latency.
    pub fn record(&mut self, us: u64) {
        if self.started.elapsed() >= LATENCY_WINDOW {
            let previous = std::mem::replace(&mut self.current, new_histogram());
            self.window = previous;
            self.started = std::time::Instant::now();
        }
        // Auto-resizing: cannot be out of range.
        let _ = self.current.record(us.max(1));
        let _ = self.window.record(us.max(1));
        self.summary = LatencySummary::of(&self.window);
    }
}

/// p50, p99 and max of a latency histogram.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub struct LatencySummary {
    /// Markers seen in the window.
    pub count: u64,
    /// Median, microseconds.
    pub p50_us: u64,
    /// 99th percentile, microseconds.
    pub p99_us: u64,
    /// Maximum, microseconds.
    pub max_us: u64,
}

impl LatencySummary {
    fn of(h: &hdrhistogram::Histogram<u64>) -> Option<Self> {
        (!h.is_empty()).then(|| LatencySummary {
            count: h.len(),
            p50_us: h.value_at_quantile(0.5),
            p99_us: h.value_at_quantile(0.99),
            max_us: h.max(),
        })
    }
}

/// Several subtasks' summaries combined without their histograms: counts summed, quantiles
/// the largest (an upper bound of the merged quantile).
fn upper_bound(summaries: impl Iterator<Item = Option<LatencySummary>>) -> Option<LatencySummary> {
    summaries.flatten().reduce(|a, b| LatencySummary {
        count: a.count + b.count,
        p50_us: a.p50_us.max(b.p50_us),
        p99_us: a.p99_us.max(b.p99_us),
        max_us: a.max_us.max(b.max_us),
    })
}

/// The counters of one operator subtask.
#[derive(Debug)]
pub struct SubtaskMetrics {
    /// Records into the operator.
    pub records_in: AtomicU64,
    /// Records out of the operator.
    pub records_out: AtomicU64,
    /// Serialized bytes into the operator: from an external system (a Kafka source: keys and
    /// values as read) or over the network (cluster mode: batches from another process).
    /// Records passed within a process are never serialized and count no bytes (as in Flink).
    pub bytes_in: AtomicU64,
    /// Serialized bytes out of the operator: to an external system (a Kafka sink: keys and
    /// values as written) or over the network to another process.
    pub bytes_out: AtomicU64,
    /// The operator's current input watermark.
    pub watermark: AtomicI64,
    /// Nanoseconds spent processing.
    pub busy_ns: AtomicU64,
    /// Nanoseconds spent blocked on a full output channel.
    pub backpressured_ns: AtomicU64,
    custom: Mutex<BTreeMap<String, Arc<AtomicU64>>>,
    gauges: Mutex<BTreeMap<String, Arc<AtomicI64>>>,
    info: Mutex<BTreeMap<String, String>>,
    latency: Mutex<LatencyHistogram>,
}

impl Default for SubtaskMetrics {
    fn default() -> Self {
        SubtaskMetrics {
            records_in: AtomicU64::new(0),
            records_out: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            watermark: AtomicI64::new(MIN_WATERMARK),
            busy_ns: AtomicU64::new(0),
            backpressured_ns: AtomicU64::new(0),
            custom: Mutex::new(BTreeMap::new()),
            gauges: Mutex::new(BTreeMap::new()),
            info: Mutex::new(BTreeMap::new()),
            latency: Mutex::new(LatencyHistogram::default()),
        }
    }
}

impl SubtaskMetrics {
    /// A named counter of this subtask (created on first use; keep the handle).
    pub fn counter(&self, name: &'static str) -> Arc<AtomicU64> {
        self.custom.lock().entry(name.to_string()).or_default().clone()
    }

    /// This subtask's counters now.
    pub fn snapshot(&self) -> SubtaskSnapshot {
        SubtaskSnapshot {
            records_in: self.records_in.load(Ordering::Relaxed),
            records_out: self.records_out.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            watermark: self.watermark.load(Ordering::Relaxed),
            busy_ns: self.busy_ns.load(Ordering::Relaxed),
            backpressured_ns: self.backpressured_ns.load(Ordering::Relaxed),
            counters: self.custom_values(),
            gauges: self.gauge_values(),
            info: self.info.lock().clone(),
            latency: self.latency(),
        }
    }

    /// Shows what another process reported for this subtask (cluster mode: the job manager
    /// mirrors its executors' subtasks; the latency histogram itself stays there).
    pub fn mirror_snapshot(&self, s: &SubtaskSnapshot) {
        self.records_in.store(s.records_in, Ordering::Relaxed);
        self.records_out.store(s.records_out, Ordering::Relaxed);
        self.bytes_in.store(s.bytes_in, Ordering::Relaxed);
        self.bytes_out.store(s.bytes_out, Ordering::Relaxed);
        self.watermark.store(s.watermark, Ordering::Relaxed);
        self.busy_ns.store(s.busy_ns, Ordering::Relaxed);
        self.backpressured_ns.store(s.backpressured_ns, Ordering::Relaxed);
        let mut custom = self.custom.lock();
        for (name, value) in &s.counters {
            custom.entry(name.clone()).or_default().store(*value, Ordering::Relaxed);
        }
        drop(custom);
        let mut gauges = self.gauges.lock();
        for (name, value) in &s.gauges {
            gauges.entry(name.clone()).or_default().store(*value, Ordering::Relaxed);
        }
        drop(gauges);
        let mut info = self.info.lock();
        if *info != s.info {
            info.clone_from(&s.info);
        }
        drop(info);
        self.latency.lock().summary = s.latency;
    }

    /// The current value of every custom counter.
    pub fn custom_values(&self) -> BTreeMap<String, u64> {
        self.custom.lock().iter().map(|(k, v)| (k.clone(), v.load(Ordering::Relaxed))).collect()
    }

    /// A named gauge of this subtask, e.g. `kafka.earth-temp.3.lag` (see [`kafka_gauges`];
    /// created on first use; keep the handle).
    pub fn gauge(&self, name: impl Into<String>) -> Arc<AtomicI64> {
        self.gauges.lock().entry(name.into()).or_default().clone()
    }

    /// The current value of every gauge.
    pub fn gauge_values(&self) -> BTreeMap<String, i64> {
        self.gauges.lock().iter().map(|(k, v)| (k.clone(), v.load(Ordering::Relaxed))).collect()
    }

    /// Says a fact about this subtask that is text, not a number, e.g. an effective client
    /// setting (`kafka.producer.linger.ms` = `5`, see [`kafka_client_settings`]); shown by
    /// the REST API, carried to the job manager in cluster mode. Set once, at start.
    pub fn set_info(&self, name: impl Into<String>, value: impl Into<String>) {
        self.info.lock().insert(name.into(), value.into());
    }

    /// Record the age of a latency marker that reached this subtask, in microseconds.
    pub fn record_latency_us(&self, us: u64) {
        self.latency.lock().record(us);
    }

    /// p50/p99/max of the latency markers of the last 30-60 s (`None`: none arrived).
    pub fn latency(&self) -> Option<LatencySummary> {
        self.latency.lock().summary
    }

    pub(crate) fn add_in(&self, n: usize) {
        self.records_in.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_out(&self, n: usize) {
        self.records_out.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Count `n` serialized bytes read (once per batch or poll, never per record).
    pub fn add_bytes_in(&self, n: usize) {
        self.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Count `n` serialized bytes written (once per batch, never per record).
    pub fn add_bytes_out(&self, n: usize) {
        self.bytes_out.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn set_watermark(&self, wm: Timestamp) {
        self.watermark.store(wm, Ordering::Relaxed);
    }
}

/// Every operator's counters, in graph order.
#[derive(Debug, Default)]
pub struct MetricsRegistry {
    operators: Mutex<Vec<OperatorEntry>>,
}

#[derive(Debug)]
struct OperatorEntry {
    id: u32,
    name: String,
    kind: &'static str,
    subtasks: Vec<Arc<SubtaskMetrics>>,
}

/// A point-in-time copy of one operator's counters, summed over subtasks.
#[derive(Debug, Clone, Serialize)]
pub struct OperatorSnapshot {
    /// Operator id.
    pub id: u32,
    /// Operator name.
    pub name: String,
    /// `source`, `operator` or `sink`.
    pub kind: &'static str,
    /// Records in, over all subtasks.
    pub records_in: u64,
    /// Records out, over all subtasks.
    pub records_out: u64,
    /// Serialized bytes in, over all subtasks (see [`SubtaskMetrics::bytes_in`]).
    pub bytes_in: u64,
    /// Serialized bytes out, over all subtasks (see [`SubtaskMetrics::bytes_out`]).
    pub bytes_out: u64,
    /// The minimum watermark over subtasks.
    pub watermark: Timestamp,
    /// Per subtask: records in, records out, watermark.
    pub subtasks: Vec<SubtaskSnapshot>,
    /// Custom counters, summed over subtasks.
    pub counters: BTreeMap<String, u64>,
    /// Gauges of every subtask (names are unique per subtask, e.g. per Kafka partition).
    pub gauges: BTreeMap<String, i64>,
    /// Text facts of the subtasks (the first subtask's value where they differ).
    pub info: BTreeMap<String, String>,
    /// Record latency over all subtasks (from latency markers; `None`: none arrived).
    pub latency: Option<LatencySummary>,
}

/// One subtask's counters: what the REST API shows, and what an executor reports to its job
/// manager (cluster mode), which mirrors it ([`SubtaskMetrics::mirror_snapshot`]).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SubtaskSnapshot {
    /// Records in.
    pub records_in: u64,
    /// Records out.
    pub records_out: u64,
    /// Serialized bytes in.
    pub bytes_in: u64,
    /// Serialized bytes out.
    pub bytes_out: u64,
    /// Input watermark.
    pub watermark: Timestamp,
    /// Nanoseconds busy.
    pub busy_ns: u64,
    /// Nanoseconds backpressured.
    pub backpressured_ns: u64,
    /// Custom counters (the operator's view sums them).
    pub counters: BTreeMap<String, u64>,
    /// Gauges (per Kafka partition: end offset, checkpointed offset, lag, …).
    pub gauges: BTreeMap<String, i64>,
    /// Text facts ([`SubtaskMetrics::set_info`]).
    pub info: BTreeMap<String, String>,
    /// Record latency (from latency markers; `None`: none arrived).
    pub latency: Option<LatencySummary>,
}

impl MetricsRegistry {
    /// Register an operator with `parallelism` subtasks; returns their counters.
    pub fn register(
        &self,
        id: u32,
        name: &str,
        kind: &'static str,
        parallelism: u32,
    ) -> Vec<Arc<SubtaskMetrics>> {
        let subtasks: Vec<_> = (0..parallelism).map(|_| Arc::new(SubtaskMetrics::default())).collect();
        self.operators.lock().push(OperatorEntry {
            id,
            name: name.to_string(),
            kind,
            subtasks: subtasks.clone(),
        });
        subtasks
    }

    /// A copy of every operator's counters.
    pub fn snapshot(&self) -> Vec<OperatorSnapshot> {
        let ops = self.operators.lock();
        ops.iter()
            .map(|op| {
                let subtasks: Vec<SubtaskSnapshot> = op.subtasks.iter().map(|s| s.snapshot()).collect();
                // One subtask: its summary; several: their windows merged (or, when the
                // histograms live in executor processes, the largest of their quantiles).
                let latency = match &op.subtasks[..] {
                    [one] => one.latency(),
                    many => {
                        let mut merged = new_histogram();
                        for s in many {
                            let _ = merged.add(&s.latency.lock().window);
                        }
                        LatencySummary::of(&merged).or_else(|| upper_bound(many.iter().map(|s| s.latency())))
                    }
                };
                let mut counters = BTreeMap::new();
                for s in &subtasks {
                    for (k, v) in &s.counters {
                        *counters.entry(k.clone()).or_insert(0) += v;
                    }
                }
                let gauges = subtasks.iter().flat_map(|s| s.gauges.clone()).collect();
                let mut info = BTreeMap::new();
                for s in &subtasks {
                    for (k, v) in &s.info {
                        info.entry(k.clone()).or_insert_with(|| v.clone());
                    }
                }
                OperatorSnapshot {
                    id: op.id,
                    name: op.name.clone(),
                    kind: op.kind,
                    records_in: subtasks.iter().map(|s| s.records_in).sum(),
                    records_out: subtasks.iter().map(|s| s.records_out).sum(),
                    bytes_in: subtasks.iter().map(|s| s.bytes_in).sum(),
                    bytes_out: subtasks.iter().map(|s| s.bytes_out).sum(),
                    watermark: subtasks.iter().map(|s| s.watermark).min().unwrap_or(MIN_WATERMARK),
                    subtasks,
                    counters,
                    gauges,
                    info,
                    latency,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::kafka_gauges::{name, parse, LAG};

    #[test]
    fn kafka_txn_gauge_names_round_trip_with_dotted_ids() {
        use super::kafka_txn_gauges as t;
        assert_eq!(t::name("job.a-sink-0-1", t::STATE), "kafka_txn.job.a-sink-0-1.state");
        assert_eq!(t::parse("kafka_txn.job.a-sink-0-1.state"), Some(("job.a-sink-0-1", "state")));
        assert_eq!(t::parse("kafka_txn..state"), None);
        assert_eq!(t::parse("kafka.t.1.lag"), None);
        assert_eq!(t::state_name(t::STATE_PRE_COMMITTED), Some("pre_committed"));
        assert_eq!(t::state_name(t::STATE_IDLE), None);
    }

    #[test]
    fn kafka_client_setting_names_round_trip_with_dotted_properties() {
        use super::kafka_client_settings as c;
        assert_eq!(c::name(c::PRODUCER, "linger.ms"), "kafka.producer.linger.ms");
        assert_eq!(c::parse("kafka.producer.linger.ms"), Some(("producer", "linger.ms")));
        assert_eq!(c::parse("kafka.consumer.fetch.min.bytes"), Some(("consumer", "fetch.min.bytes")));
        assert_eq!(c::parse("kafka.t.3.lag"), None);
        assert_eq!(c::parse("kafka.producer."), None);
    }

    #[test]
    fn kafka_gauge_names_round_trip_with_dotted_topics() {
        assert_eq!(name("earth.temp", 3, LAG), "kafka.earth.temp.3.lag");
        assert_eq!(parse("kafka.earth.temp.3.lag"), Some(("earth.temp", 3, "lag")));
        assert_eq!(parse("kafka.t.12.end_offset"), Some(("t", 12, "end_offset")));
        assert_eq!(parse("kafka.t.x.lag"), None);
        assert_eq!(parse("kafka..3.lag"), None);
        assert_eq!(parse("other.t.3.lag"), None);
    }
}

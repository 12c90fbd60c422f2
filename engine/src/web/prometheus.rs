//! `/metrics` in the Prometheus text exposition format (version 0.0.4).

use super::registry::JobRegistry;
use super::views::{status_name, ALL_STATUSES};
use crate::metrics::{kafka_gauges, kafka_producer_gauges};
use crate::types::{MAX_WATERMARK, MIN_WATERMARK};
use std::fmt::Write;

/// The content type of the text format.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Metric names, in one place.
pub mod names {
    /// 1 for the job's current status, 0 for the others (label `status`).
    pub const JOB_STATUS: &str = "caudal_job_status";
    /// Job start, seconds since the epoch.
    pub const JOB_START_TIME: &str = "caudal_job_start_time_seconds";
    /// Failures of the job.
    pub const JOB_FAILURES: &str = "caudal_job_failures_total";
    /// Checkpoints by status (label `status`).
    pub const CHECKPOINTS: &str = "caudal_checkpoints_total";
    /// Records into an operator subtask.
    pub const RECORDS_IN: &str = "caudal_operator_records_in_total";
    /// Records out of an operator subtask.
    pub const RECORDS_OUT: &str = "caudal_operator_records_out_total";
    /// Serialized bytes into an operator subtask from an external system or another process.
    pub const BYTES_IN: &str = "caudal_operator_bytes_in_total";
    /// Serialized bytes out of an operator subtask to an external system or another process.
    pub const BYTES_OUT: &str = "caudal_operator_bytes_out_total";
    /// Seconds an operator subtask spent processing.
    pub const BUSY_SECONDS: &str = "caudal_operator_busy_seconds_total";
    /// Seconds an operator subtask spent blocked on a full output channel.
    pub const BACKPRESSURED_SECONDS: &str = "caudal_operator_backpressured_seconds_total";
    /// An operator subtask's input watermark, ms since the epoch (absent before the first).
    pub const WATERMARK: &str = "caudal_operator_watermark_milliseconds";
    /// Record latency from the sources to an operator (all subtasks, last 30-60 s, from
    /// latency markers) at `quantile` 0.5, 0.99 and 1 (the maximum).
    pub const LATENCY: &str = "caudal_operator_latency_seconds";
    /// An operator's own counters (label `counter`, e.g. `late_records`).
    pub const OPERATOR_COUNTER: &str = "caudal_operator_counter_total";
    /// A Kafka source partition's end (last stable) offset (labels `topic`, `partition`).
    pub const KAFKA_END_OFFSET: &str = "caudal_kafka_partition_end_offset";
    /// A Kafka source partition's offset in the last completed checkpoint.
    pub const KAFKA_CHECKPOINTED_OFFSET: &str = "caudal_kafka_partition_checkpointed_offset";
    /// A Kafka source partition's lag: end offset minus checkpointed offset.
    pub const KAFKA_LAG: &str = "caudal_kafka_partition_lag";
    /// Replicas of a Kafka source or sink partition, from the cluster metadata.
    pub const KAFKA_REPLICAS: &str = "caudal_kafka_partition_replicas";
    /// In-sync replicas of a Kafka source or sink partition (fewer than the replicas:
    /// under-replicated).
    pub const KAFKA_ISR: &str = "caudal_kafka_partition_in_sync_replicas";
    /// Times the in-sync replicas of a Kafka partition shrank since the job started.
    /// Produce request round-trip time of a Kafka sink subtask's producers to a broker.
    pub const KAFKA_PRODUCER_RTT: &str = "caudal_kafka_producer_request_latency_seconds";
    /// Requests, errors, retries, timeouts and lost connections of a Kafka sink subtask's
    /// producers to a broker (label `what`).
    pub const KAFKA_PRODUCER_EVENTS: &str = "caudal_kafka_producer_events_total";
    pub const KAFKA_ISR_SHRINKS: &str = "caudal_kafka_partition_isr_shrinks_total";
    /// Times the in-sync replicas of a Kafka partition expanded since the job started.
    pub const KAFKA_ISR_EXPANDS: &str = "caudal_kafka_partition_isr_expands_total";
    /// Age of an open or pending Kafka sink transaction (labels `transactional_id`, `state`,
    /// `checkpoint`), from its first record; compare with `transaction.timeout.ms`.
    pub const KAFKA_TXN_AGE: &str = "caudal_kafka_sink_transaction_age_seconds";
}

/// Escape a label value: backslash, double quote and line feed.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    lines: String,
}

impl Family {
    fn new(name: &'static str, kind: &'static str, help: &'static str) -> Self {
        Family { name, help, kind, lines: String::new() }
    }

    fn add(&mut self, labels: &str, value: impl std::fmt::Display) {
        let _ = writeln!(self.lines, "{}{{{labels}}} {value}", self.name);
    }

    fn write_to(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind);
        out.push_str(&self.lines);
    }
}

/// Every series of every job.
pub(crate) fn render(registry: &JobRegistry) -> String {
    let mut families = Families::new();
    let now = crate::job::now_ms();
    for job in registry.list() {
        families.add_job(&job, now);
    }
    families.write()
}

/// Every family of series, in the order `/metrics` lists them.
struct Families {
    status: Family,
    start: Family,
    failures: Family,
    checkpoints: Family,
    rin: Family,
    rout: Family,
    bin: Family,
    bout: Family,
    busy: Family,
    bp: Family,
    wm: Family,
    latency: Family,
    custom: Family,
    kafka_end: Family,
    kafka_done: Family,
    kafka_lag: Family,
    kafka_replicas: Family,
    kafka_isr: Family,
    isr_shrinks: Family,
    isr_expands: Family,
    producer_rtt: Family,
    producer_events: Family,
    txn_age: Family,
}

impl Families {
    fn new() -> Self {
        use names::*;
        Families {
            status: Family::new(JOB_STATUS, "gauge", "1 for the job's current status, 0 for the others."),
            start: Family::new(JOB_START_TIME, "gauge", "Job start time, seconds since the epoch."),
            failures: Family::new(JOB_FAILURES, "counter", "Failures of the job."),
            checkpoints: Family::new(CHECKPOINTS, "counter", "Checkpoints of the job by status."),
            rin: Family::new(RECORDS_IN, "counter", "Records into an operator subtask."),
            rout: Family::new(RECORDS_OUT, "counter", "Records out of an operator subtask."),
            bin: Family::new(
                BYTES_IN,
                "counter",
                "Serialized bytes into an operator subtask from an external system or another process.",
            ),
            bout: Family::new(
                BYTES_OUT,
                "counter",
                "Serialized bytes out of an operator subtask to an external system or another process.",
            ),
            busy: Family::new(BUSY_SECONDS, "counter", "Seconds an operator subtask spent processing."),
            bp: Family::new(
                BACKPRESSURED_SECONDS,
                "counter",
                "Seconds an operator subtask spent blocked on a full output channel.",
            ),
            wm: Family::new(
                WATERMARK,
                "gauge",
                "Input watermark of an operator subtask, milliseconds since the epoch.",
            ),
            latency: Family::new(
                LATENCY,
                "gauge",
                "Record latency from the sources to an operator over the last 30-60 s (latency markers), by quantile.",
            ),
            custom: Family::new(OPERATOR_COUNTER, "counter", "Operator-specific counters, summed over subtasks."),
            kafka_end: Family::new(KAFKA_END_OFFSET, "gauge", "End (last stable) offset of a Kafka source partition."),
            kafka_done: Family::new(
                KAFKA_CHECKPOINTED_OFFSET,
                "gauge",
                "Next offset of a Kafka source partition in the last completed checkpoint.",
            ),
            kafka_lag: Family::new(
                KAFKA_LAG,
                "gauge",
                "Records of a Kafka source partition not yet covered by a completed checkpoint.",
            ),
            kafka_replicas: Family::new(KAFKA_REPLICAS, "gauge", "Replicas of a Kafka source or sink partition."),
            kafka_isr: Family::new(KAFKA_ISR, "gauge", "In-sync replicas of a Kafka source or sink partition."),
            isr_shrinks: Family::new(
                KAFKA_ISR_SHRINKS,
                "counter",
                "Times the in-sync replicas of a Kafka source or sink partition shrank since the job started.",
            ),
            isr_expands: Family::new(
                KAFKA_ISR_EXPANDS,
                "counter",
                "Times the in-sync replicas of a Kafka source or sink partition expanded since the job started.",
            ),
            producer_rtt: Family::new(
                KAFKA_PRODUCER_RTT,
                "gauge",
                "Produce request round-trip time of a Kafka sink subtask's producers to a broker, last second, by quantile.",
            ),
            producer_events: Family::new(
                KAFKA_PRODUCER_EVENTS,
                "counter",
                "Requests, errors, retries, timeouts and lost connections of a Kafka sink subtask's producers to a broker.",
            ),
            txn_age: Family::new(
                KAFKA_TXN_AGE,
                "gauge",
                "Age of an open or pre-committed Kafka sink transaction since its first record.",
            ),
        }
    }

    /// The series of one job.
    fn add_job(&mut self, job: &super::registry::JobEntry, now: i64) {
        for sink in super::transactions::TransactionsView::of(job, now).sinks {
            let o = format!(
                "job=\"{}\",operator=\"{}\",operator_id=\"{}\"",
                label(&job.view.name),
                label(&sink.operator),
                sink.operator_id
            );
            for t in sink.transactions {
                let Some(age) = t.age_ms else { continue };
                let l = format!(
                    "{o},transactional_id=\"{}\",state=\"{}\",checkpoint=\"{}\"",
                    label(&t.transactional_id),
                    t.state,
                    t.checkpoint
                );
                self.txn_age.add(&l, age as f64 / 1000.0);
            }
        }
        let v = &job.view;
        let j = label(&v.name);
        let current = v.status();
        for s in ALL_STATUSES {
            self.status.add(&format!("job=\"{j}\",status=\"{}\"", status_name(s)), u8::from(s == current));
        }
        self.start.add(&format!("job=\"{j}\""), v.started_ms as f64 / 1000.0);
        self.failures.add(&format!("job=\"{j}\""), v.failures().len());
        let cps = v.checkpoints();
        for st in ["COMPLETED", "FAILED", "IN_PROGRESS"] {
            self.checkpoints
                .add(&format!("job=\"{j}\",status=\"{st}\""), cps.iter().filter(|c| c.status == st).count());
        }
        for op in v.metrics.snapshot() {
            let o = format!("job=\"{j}\",operator=\"{}\",operator_id=\"{}\"", label(&op.name), op.id);
            for (i, s) in op.subtasks.iter().enumerate() {
                let l = format!("{o},subtask=\"{i}\"");
                self.rin.add(&l, s.records_in);
                self.rout.add(&l, s.records_out);
                self.bin.add(&l, s.bytes_in);
                self.bout.add(&l, s.bytes_out);
                self.busy.add(&l, s.busy_ns as f64 / 1e9);
                self.bp.add(&l, s.backpressured_ns as f64 / 1e9);
                if s.watermark != MIN_WATERMARK && s.watermark != MAX_WATERMARK {
                    self.wm.add(&l, s.watermark);
                }
                for (name, value) in &s.gauges {
                    let Some((broker, what)) = kafka_producer_gauges::parse(name) else { continue };
                    let b = format!("{l},broker=\"{broker}\"");
                    match what {
                        kafka_producer_gauges::RTT_P50_US if *value >= 0 => {
                            self.producer_rtt.add(&format!("{b},quantile=\"0.5\""), *value as f64 / 1e6)
                        }
                        kafka_producer_gauges::RTT_P99_US if *value >= 0 => {
                            self.producer_rtt.add(&format!("{b},quantile=\"0.99\""), *value as f64 / 1e6)
                        }
                        kafka_producer_gauges::RTT_P50_US | kafka_producer_gauges::RTT_P99_US => {}
                        _ => self.producer_events.add(&format!("{b},what=\"{what}\""), value),
                    }
                }
            }
            if let Some(l) = op.latency {
                for (q, us) in [("0.5", l.p50_us), ("0.99", l.p99_us), ("1", l.max_us)] {
                    self.latency.add(&format!("{o},quantile=\"{q}\""), us as f64 / 1e6);
                }
            }
            for (name, value) in &op.counters {
                self.custom.add(&format!("{o},counter=\"{}\"", label(name)), value);
            }
            for (name, value) in &op.gauges {
                let Some((topic, partition, what)) = kafka_gauges::parse(name) else { continue };
                let family = match what {
                    kafka_gauges::END_OFFSET => &mut self.kafka_end,
                    kafka_gauges::CHECKPOINTED_OFFSET => &mut self.kafka_done,
                    kafka_gauges::LAG => &mut self.kafka_lag,
                    kafka_gauges::REPLICAS => &mut self.kafka_replicas,
                    kafka_gauges::IN_SYNC_REPLICAS => &mut self.kafka_isr,
                    kafka_gauges::ISR_SHRINKS => &mut self.isr_shrinks,
                    kafka_gauges::ISR_EXPANDS => &mut self.isr_expands,
                    _ => continue,
                };
                // Negative: not known yet (no statistics or no checkpoint so far).
                if *value >= 0 {
                    family.add(&format!("{o},topic=\"{}\",partition=\"{partition}\"", label(topic)), value);
                }
            }
        }
    }

    fn write(&self) -> String {
        let mut out = String::new();
        for f in [
            &self.status,
            &self.start,
            &self.failures,
            &self.checkpoints,
            &self.rin,
            &self.rout,
            &self.bin,
            &self.bout,
            &self.busy,
            &self.bp,
            &self.wm,
            &self.latency,
            &self.custom,
            &self.kafka_end,
            &self.kafka_done,
            &self.kafka_lag,
            &self.kafka_replicas,
            &self.kafka_isr,
            &self.isr_shrinks,
            &self.isr_expands,
            &self.producer_rtt,
            &self.producer_events,
            &self.txn_age,
        ] {
            f.write_to(&mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::label;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}

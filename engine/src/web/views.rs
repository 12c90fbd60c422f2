//! The JSON documents of the REST API, built from a [`JobView`] and its sampled history.
//!
//! Field names and meanings are those of `openapi.json`; change both together.

use super::registry::{rates_between, JobEntry, SubtaskRates, HISTORY_SAMPLES, SAMPLE_INTERVAL};
use crate::graph::{EdgeKind, PlanEdge, PlanNode};
use crate::job::{CheckpointStats, FailureRecord, JobStatus, JobView};
use crate::metrics::OperatorSnapshot;
use crate::types::{Timestamp, MAX_WATERMARK, MIN_WATERMARK};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// Every status, for filters and the Prometheus status gauge.
pub(crate) const ALL_STATUSES: [JobStatus; 7] = [
    JobStatus::Created,
    JobStatus::Running,
    JobStatus::Failing,
    JobStatus::Restarting,
    JobStatus::Failed,
    JobStatus::Canceled,
    JobStatus::Finished,
];

/// The name of a status as the API spells it (`RUNNING`).
pub(crate) fn status_name(status: JobStatus) -> String {
    match serde_json::to_value(status) {
        Ok(serde_json::Value::String(s)) => s,
        _ => format!("{status:?}").to_uppercase(),
    }
}

/// `{ "error": "..." }`
#[derive(Debug, Serialize)]
pub(crate) struct ErrorBody {
    pub(crate) error: String,
}

/// `GET /api/v1/jobs`
#[derive(Debug, Serialize)]
pub(crate) struct JobList {
    pub(crate) jobs: Vec<JobSummary>,
}

/// One job of the list.
#[derive(Debug, Serialize)]
pub(crate) struct JobSummary {
    pub(crate) name: String,
    pub(crate) status: JobStatus,
    pub(crate) start_ms: i64,
    pub(crate) duration_ms: i64,
    pub(crate) operators: usize,
    pub(crate) tasks: usize,
    pub(crate) failures: usize,
}

impl JobSummary {
    pub(crate) fn of(job: &JobEntry, now: i64) -> Self {
        let v = &job.view;
        JobSummary {
            name: v.name.clone(),
            status: v.status(),
            start_ms: v.started_ms,
            duration_ms: job.duration_ms(now),
            operators: v.plan.operators.len(),
            tasks: tasks(v).len(),
            failures: v.failures().len(),
        }
    }
}

/// `GET /api/v1/jobs/{name}`
#[derive(Debug, Serialize)]
pub(crate) struct JobDetail {
    pub(crate) name: String,
    pub(crate) status: JobStatus,
    pub(crate) start_ms: i64,
    pub(crate) duration_ms: i64,
    pub(crate) now_ms: i64,
    pub(crate) max_parallelism: u32,
    pub(crate) operators: Vec<PlanNode>,
    pub(crate) edges: Vec<PlanEdge>,
    pub(crate) tasks: Vec<TaskView>,
    pub(crate) failures: Vec<FailureRecord>,
}

/// A task: a chain of operators that runs on one thread per subtask.
#[derive(Debug, Serialize)]
pub(crate) struct TaskView {
    /// The id of the chain's head operator.
    pub(crate) id: usize,
    /// The head operator's name.
    pub(crate) name: String,
    pub(crate) parallelism: u32,
    /// Operator ids in the chain, upstream first.
    pub(crate) operators: Vec<usize>,
}

fn tasks(v: &JobView) -> Vec<TaskView> {
    let mut out: Vec<TaskView> = Vec::new();
    for op in &v.plan.operators {
        match out.iter_mut().find(|t| t.id == op.task) {
            Some(t) => t.operators.push(op.id),
            None => {
                let head = v.plan.operators.iter().find(|o| o.id == op.task).unwrap_or(op);
                out.push(TaskView {
                    id: op.task,
                    name: head.name.clone(),
                    parallelism: head.parallelism,
                    operators: vec![op.id],
                });
            }
        }
    }
    out
}

impl JobDetail {
    pub(crate) fn of(job: &JobEntry, now: i64) -> Self {
        let v = &job.view;
        JobDetail {
            name: v.name.clone(),
            status: v.status(),
            start_ms: v.started_ms,
            duration_ms: job.duration_ms(now),
            now_ms: now,
            max_parallelism: v.plan.max_parallelism,
            operators: v.plan.operators.clone(),
            edges: v.plan.edges.clone(),
            tasks: tasks(v),
            failures: v.failures(),
        }
    }
}

/// `GET /api/v1/jobs/{name}/metrics`
#[derive(Debug, Serialize)]
pub(crate) struct MetricsView {
    pub(crate) job: String,
    pub(crate) status: JobStatus,
    pub(crate) now_ms: i64,
    pub(crate) sample_interval_ms: u64,
    pub(crate) operators: Vec<OperatorMetrics>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) history: Option<RateHistory>,
}

/// One operator's counters and rates.
#[derive(Debug, Serialize)]
pub(crate) struct OperatorMetrics {
    pub(crate) id: u32,
    pub(crate) name: String,
    pub(crate) kind: &'static str,
    pub(crate) parallelism: usize,
    pub(crate) records_in: u64,
    pub(crate) records_out: u64,
    pub(crate) records_in_per_sec: Option<f64>,
    pub(crate) records_out_per_sec: Option<f64>,
    /// Serialized bytes read from an external system or another process (0 on edges within
    /// a process: records there are never serialized).
    pub(crate) bytes_in: u64,
    /// Serialized bytes written to an external system or another process.
    pub(crate) bytes_out: u64,
    pub(crate) bytes_in_per_sec: Option<f64>,
    pub(crate) bytes_out_per_sec: Option<f64>,
    pub(crate) busy_ns: u64,
    pub(crate) backpressured_ns: u64,
    /// The busiest subtask's ratio.
    pub(crate) busy_ratio: Option<f64>,
    /// The most backpressured subtask's ratio.
    pub(crate) backpressured_ratio: Option<f64>,
    pub(crate) watermark: Option<Timestamp>,
    pub(crate) counters: BTreeMap<String, u64>,
    /// Record latency from the sources to this operator over the last 30-60 s, all subtasks
    /// (latency markers; `null` before the first, and at sources).
    pub(crate) latency: Option<crate::metrics::LatencySummary>,
    pub(crate) subtasks: Vec<SubtaskMetricsView>,
}

/// One subtask's counters and rates.
#[derive(Debug, Serialize)]
pub(crate) struct SubtaskMetricsView {
    pub(crate) subtask: u32,
    pub(crate) records_in: u64,
    pub(crate) records_out: u64,
    pub(crate) records_in_per_sec: Option<f64>,
    pub(crate) records_out_per_sec: Option<f64>,
    /// Serialized bytes read from an external system or another process (0 on edges within
    /// a process: records there are never serialized).
    pub(crate) bytes_in: u64,
    /// Serialized bytes written to an external system or another process.
    pub(crate) bytes_out: u64,
    pub(crate) bytes_in_per_sec: Option<f64>,
    pub(crate) bytes_out_per_sec: Option<f64>,
    pub(crate) busy_ns: u64,
    pub(crate) backpressured_ns: u64,
    pub(crate) busy_ratio: Option<f64>,
    pub(crate) backpressured_ratio: Option<f64>,
    pub(crate) watermark: Option<Timestamp>,
    pub(crate) latency: Option<crate::metrics::LatencySummary>,
}

/// Rates over time, one point per sample interval (columnar: `at_ms[i]` is the end of
/// the interval of every series' `[i]`).
#[derive(Debug, Serialize)]
pub(crate) struct RateHistory {
    pub(crate) at_ms: Vec<i64>,
    pub(crate) operators: Vec<OperatorRateSeries>,
}

/// One operator's rates over time, summed over subtasks.
#[derive(Debug, Serialize)]
pub(crate) struct OperatorRateSeries {
    pub(crate) id: u32,
    pub(crate) name: String,
    pub(crate) records_in_per_sec: Vec<f64>,
    pub(crate) records_out_per_sec: Vec<f64>,
}

/// The largest `history` the metrics endpoint accepts, in seconds.
pub(crate) const MAX_HISTORY_SECS: u64 = (HISTORY_SAMPLES as u64) * SAMPLE_INTERVAL.as_secs();

/// A real event time, or `None` for "no watermark yet" and "end of stream".
fn event_time(wm: Timestamp) -> Option<Timestamp> {
    (wm != MIN_WATERMARK && wm != MAX_WATERMARK).then_some(wm)
}

fn max_of(values: impl Iterator<Item = f64>) -> Option<f64> {
    values.fold(None, |m, v| Some(m.map_or(v, |m: f64| m.max(v))))
}

impl MetricsView {
    pub(crate) fn of(job: &JobEntry, now: i64, history_secs: Option<u64>) -> Self {
        let snapshot = job.view.metrics.snapshot();
        let (rates, history) = job.with_history(|h| {
            let rates: Vec<Option<Vec<SubtaskRates>>> =
                snapshot.iter().map(|op| h.latest_rates(op.id)).collect();
            let history = history_secs.map(|secs| {
                let samples: Vec<_> = h.since(Duration::from_secs(secs)).collect();
                let pairs: Vec<_> = samples.windows(2).map(|w| (w[0], w[1])).collect();
                RateHistory {
                    at_ms: pairs.iter().map(|(_, b)| b.at_ms).collect(),
                    operators: snapshot
                        .iter()
                        .map(|op| {
                            let sums: Vec<(f64, f64)> = pairs
                                .iter()
                                .map(|(a, b)| {
                                    rates_between(a, b, op.id)
                                        .unwrap_or_default()
                                        .iter()
                                        .fold((0.0, 0.0), |(i, o), r| {
                                            (i + r.records_in_per_sec, o + r.records_out_per_sec)
                                        })
                                })
                                .collect();
                            OperatorRateSeries {
                                id: op.id,
                                name: op.name.clone(),
                                records_in_per_sec: sums.iter().map(|s| s.0).collect(),
                                records_out_per_sec: sums.iter().map(|s| s.1).collect(),
                            }
                        })
                        .collect(),
                }
            });
            (rates, history)
        });
        let operators =
            snapshot.iter().zip(rates).map(|(op, rates)| operator_metrics(op, rates.as_deref())).collect();
        MetricsView {
            job: job.view.name.clone(),
            status: job.view.status(),
            now_ms: now,
            sample_interval_ms: SAMPLE_INTERVAL.as_millis() as u64,
            operators,
            history,
        }
    }
}

fn operator_metrics(op: &OperatorSnapshot, rates: Option<&[SubtaskRates]>) -> OperatorMetrics {
    let rate = |i: usize| rates.and_then(|r| r.get(i)).copied();
    let subtasks: Vec<SubtaskMetricsView> = op
        .subtasks
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let r = rate(i);
            SubtaskMetricsView {
                subtask: i as u32,
                records_in: s.records_in,
                records_out: s.records_out,
                records_in_per_sec: r.map(|r| r.records_in_per_sec),
                records_out_per_sec: r.map(|r| r.records_out_per_sec),
                bytes_in: s.bytes_in,
                bytes_out: s.bytes_out,
                bytes_in_per_sec: r.map(|r| r.bytes_in_per_sec),
                bytes_out_per_sec: r.map(|r| r.bytes_out_per_sec),
                busy_ns: s.busy_ns,
                backpressured_ns: s.backpressured_ns,
                busy_ratio: r.map(|r| r.busy_ratio),
                backpressured_ratio: r.map(|r| r.backpressured_ratio),
                watermark: event_time(s.watermark),
                latency: s.latency,
            }
        })
        .collect();
    let sum = |f: fn(&SubtaskRates) -> f64| rates.map(|r| r.iter().map(f).sum::<f64>());
    let max = |f: fn(&SubtaskRates) -> f64| rates.and_then(|r| max_of(r.iter().map(f)));
    OperatorMetrics {
        id: op.id,
        name: op.name.clone(),
        kind: op.kind,
        parallelism: op.subtasks.len(),
        records_in: op.records_in,
        records_out: op.records_out,
        records_in_per_sec: sum(|r| r.records_in_per_sec),
        records_out_per_sec: sum(|r| r.records_out_per_sec),
        bytes_in: op.bytes_in,
        bytes_out: op.bytes_out,
        bytes_in_per_sec: sum(|r| r.bytes_in_per_sec),
        bytes_out_per_sec: sum(|r| r.bytes_out_per_sec),
        busy_ns: op.subtasks.iter().map(|s| s.busy_ns).sum(),
        backpressured_ns: op.subtasks.iter().map(|s| s.backpressured_ns).sum(),
        busy_ratio: max(|r| r.busy_ratio),
        backpressured_ratio: max(|r| r.backpressured_ratio),
        watermark: event_time(op.watermark),
        counters: op.counters.clone(),
        latency: op.latency,
        subtasks,
    }
}

/// `GET /api/v1/jobs/{name}/watermarks`
#[derive(Debug, Serialize)]
pub(crate) struct WatermarksView {
    pub(crate) job: String,
    pub(crate) now_ms: i64,
    pub(crate) operators: Vec<OperatorWatermarks>,
}

/// Whether a watermark is an event time yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub(crate) enum WatermarkState {
    /// No watermark has arrived yet.
    None,
    /// An event time.
    Active,
    /// The input ended (final watermark).
    Ended,
}

fn state(wm: Timestamp) -> WatermarkState {
    match wm {
        MIN_WATERMARK => WatermarkState::None,
        MAX_WATERMARK => WatermarkState::Ended,
        _ => WatermarkState::Active,
    }
}

/// One operator's watermark: the minimum over its subtasks, and who holds it back.
#[derive(Debug, Serialize)]
pub(crate) struct OperatorWatermarks {
    pub(crate) id: u32,
    pub(crate) name: String,
    pub(crate) kind: &'static str,
    pub(crate) watermark: Option<Timestamp>,
    pub(crate) state: WatermarkState,
    /// `now_ms - watermark`, when the watermark is an event time.
    pub(crate) lag_ms: Option<i64>,
    pub(crate) subtasks: Vec<SubtaskWatermark>,
    /// The upstream subtask (for a source: its own subtask) whose watermark is the
    /// operator's minimum.
    pub(crate) held_back_by: Option<HeldBackBy>,
}

/// One subtask's input watermark.
#[derive(Debug, Serialize)]
pub(crate) struct SubtaskWatermark {
    pub(crate) subtask: u32,
    pub(crate) watermark: Option<Timestamp>,
    pub(crate) state: WatermarkState,
    /// True for the subtask(s) holding the operator's minimum.
    pub(crate) is_minimum: bool,
}

/// The subtask whose watermark an operator's minimum waits for.
#[derive(Debug, Serialize)]
pub(crate) struct HeldBackBy {
    pub(crate) operator_id: u32,
    pub(crate) operator: String,
    pub(crate) subtask: u32,
    pub(crate) watermark: Option<Timestamp>,
    pub(crate) state: WatermarkState,
}

/// The index of the smallest value (the first, on ties).
fn argmin(values: impl Iterator<Item = Timestamp>) -> Option<(usize, Timestamp)> {
    values.enumerate().fold(None, |best, (i, w)| match best {
        Some((_, b)) if b <= w => best,
        _ => Some((i, w)),
    })
}

impl WatermarksView {
    pub(crate) fn of(job: &JobEntry, now: i64) -> Self {
        let v = &job.view;
        let snapshot = v.metrics.snapshot();
        let by_id = |id: usize| snapshot.iter().find(|o| o.id as usize == id);
        let operators = snapshot
            .iter()
            .map(|op| {
                let min = argmin(op.subtasks.iter().map(|s| s.watermark));
                let subtasks = op
                    .subtasks
                    .iter()
                    .enumerate()
                    .map(|(i, s)| SubtaskWatermark {
                        subtask: i as u32,
                        watermark: event_time(s.watermark),
                        state: state(s.watermark),
                        is_minimum: min.is_some_and(|(_, m)| m == s.watermark),
                    })
                    .collect();
                let held_back_by = min.and_then(|(sub, _)| {
                    let inputs: Vec<&PlanEdge> =
                        v.plan.edges.iter().filter(|e| e.to == op.id as usize).collect();
                    if inputs.is_empty() {
                        let w = op.subtasks[sub].watermark;
                        return Some(HeldBackBy {
                            operator_id: op.id,
                            operator: op.name.clone(),
                            subtask: sub as u32,
                            watermark: event_time(w),
                            state: state(w),
                        });
                    }
                    // Candidates: every upstream subtask that feeds subtask `sub`.
                    let mut best: Option<(&OperatorSnapshot, usize, Timestamp)> = None;
                    for e in inputs {
                        let Some(up) = by_id(e.from) else { continue };
                        let one_to_one =
                            e.partitioning == EdgeKind::Forward && up.subtasks.len() == op.subtasks.len();
                        for (j, s) in up.subtasks.iter().enumerate() {
                            if one_to_one && j != sub {
                                continue;
                            }
                            if best.is_none_or(|(_, _, b)| s.watermark < b) {
                                best = Some((up, j, s.watermark));
                            }
                        }
                    }
                    best.map(|(up, j, w)| HeldBackBy {
                        operator_id: up.id,
                        operator: up.name.clone(),
                        subtask: j as u32,
                        watermark: event_time(w),
                        state: state(w),
                    })
                });
                OperatorWatermarks {
                    id: op.id,
                    name: op.name.clone(),
                    kind: op.kind,
                    watermark: event_time(op.watermark),
                    state: state(op.watermark),
                    lag_ms: event_time(op.watermark).map(|w| now.saturating_sub(w)),
                    subtasks,
                    held_back_by,
                }
            })
            .collect();
        WatermarksView { job: v.name.clone(), now_ms: now, operators }
    }
}

/// `GET /api/v1/jobs/{name}/checkpoints`
#[derive(Debug, Serialize)]
pub(crate) struct CheckpointsView {
    pub(crate) job: String,
    /// How the job checkpoints; `None` when it does not.
    pub(crate) config: Option<crate::job::CheckpointSettings>,
    pub(crate) counts: CheckpointCounts,
    pub(crate) latest_completed: Option<CheckpointStats>,
    pub(crate) checkpoints: Vec<CheckpointStats>,
}

/// Checkpoints by status.
#[derive(Debug, Default, Serialize)]
pub(crate) struct CheckpointCounts {
    pub(crate) completed: usize,
    pub(crate) failed: usize,
    pub(crate) in_progress: usize,
}

impl CheckpointsView {
    pub(crate) fn of(job: &JobEntry) -> Self {
        let checkpoints = job.view.checkpoints();
        let mut counts = CheckpointCounts::default();
        for c in &checkpoints {
            match c.status.as_str() {
                "COMPLETED" => counts.completed += 1,
                "FAILED" => counts.failed += 1,
                _ => counts.in_progress += 1,
            }
        }
        let latest_completed = checkpoints.iter().rev().find(|c| c.status == "COMPLETED").cloned();
        let config = job.view.checkpoint_settings();
        CheckpointsView { job: job.view.name.clone(), config, counts, latest_completed, checkpoints }
    }
}

/// `POST /api/v1/jobs/{name}/cancel`
#[derive(Debug, Serialize)]
pub(crate) struct CancelView {
    pub(crate) job: String,
    pub(crate) cancel_requested: bool,
    pub(crate) status: JobStatus,
}

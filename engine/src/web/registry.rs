//! The jobs a server shows, and the sampled history their rates are computed from.

use crate::job::{now_ms, JobStatus, JobView};
use crate::metrics::OperatorSnapshot;
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the sampler copies every job's counters.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// How many samples each job keeps (5 minutes at [`SAMPLE_INTERVAL`]).
pub const HISTORY_SAMPLES: usize = 300;

/// The jobs a [`WebServer`](super::WebServer) serves, by name.
///
/// Embedded mode registers the one job `StreamEnv::execute` runs; a job manager registers
/// every job it runs. A job registered under a name that is taken replaces the old one.
#[derive(Debug, Default)]
pub struct JobRegistry {
    jobs: RwLock<Vec<Arc<JobEntry>>>,
}

impl JobRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Show `view` (and start sampling its counters).
    pub fn register(&self, view: Arc<JobView>) {
        let entry = Arc::new(JobEntry { view, history: Mutex::new(History::default()) });
        entry.sample(Instant::now());
        let mut jobs = self.jobs.write();
        jobs.retain(|j| j.view.name != entry.view.name);
        jobs.push(entry);
    }

    /// Stop showing the job named `name`; true when it was shown.
    pub fn unregister(&self, name: &str) -> bool {
        let mut jobs = self.jobs.write();
        let before = jobs.len();
        jobs.retain(|j| j.view.name != name);
        jobs.len() != before
    }

    /// The names of the jobs shown, in registration order.
    pub fn names(&self) -> Vec<String> {
        self.jobs.read().iter().map(|j| j.view.name.clone()).collect()
    }

    pub(crate) fn get(&self, name: &str) -> Option<Arc<JobEntry>> {
        self.jobs.read().iter().find(|j| j.view.name == name).cloned()
    }

    pub(crate) fn list(&self) -> Vec<Arc<JobEntry>> {
        self.jobs.read().clone()
    }

    /// Take one sample of every job (the sampler calls this every [`SAMPLE_INTERVAL`]).
    pub(crate) fn sample_all(&self) {
        let now = Instant::now();
        for job in self.list() {
            job.sample(now);
        }
    }
}

/// One job and its sampled history.
#[derive(Debug)]
pub(crate) struct JobEntry {
    pub(crate) view: Arc<JobView>,
    history: Mutex<History>,
}

/// The counters of one subtask at one instant.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SubtaskSample {
    pub(crate) records_in: u64,
    pub(crate) records_out: u64,
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
    pub(crate) busy_ns: u64,
    pub(crate) backpressured_ns: u64,
}

/// Every subtask's counters at one instant.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    pub(crate) at: Instant,
    pub(crate) at_ms: i64,
    /// Per operator (by id): per subtask.
    pub(crate) operators: Vec<(u32, Vec<SubtaskSample>)>,
    /// Per operator that has gauges (by id): their values (e.g. Kafka lag per partition).
    pub(crate) gauges: Vec<(u32, BTreeMap<String, i64>)>,
}

impl Sample {
    fn of(snapshot: &[OperatorSnapshot], at: Instant, at_ms: i64) -> Self {
        let operators = snapshot
            .iter()
            .map(|op| {
                let subtasks = op
                    .subtasks
                    .iter()
                    .map(|s| SubtaskSample {
                        records_in: s.records_in,
                        records_out: s.records_out,
                        bytes_in: s.bytes_in,
                        bytes_out: s.bytes_out,
                        busy_ns: s.busy_ns,
                        backpressured_ns: s.backpressured_ns,
                    })
                    .collect();
                (op.id, subtasks)
            })
            .collect();
        let gauges =
            snapshot.iter().filter(|op| !op.gauges.is_empty()).map(|op| (op.id, op.gauges.clone())).collect();
        Sample { at, at_ms, operators, gauges }
    }

    pub(crate) fn operator(&self, id: u32) -> Option<&[SubtaskSample]> {
        self.operators.iter().find(|(i, _)| *i == id).map(|(_, s)| s.as_slice())
    }

    /// The value of gauge `name` of operator `id` at this instant.
    pub(crate) fn gauge(&self, id: u32, name: &str) -> Option<i64> {
        self.gauges.iter().find(|(i, _)| *i == id).and_then(|(_, g)| g.get(name)).copied()
    }
}

/// Per-second rates of one subtask between two samples.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct SubtaskRates {
    pub(crate) records_in_per_sec: f64,
    pub(crate) records_out_per_sec: f64,
    pub(crate) bytes_in_per_sec: f64,
    pub(crate) bytes_out_per_sec: f64,
    /// Share of wall-clock time spent processing, 0..=1.
    pub(crate) busy_ratio: f64,
    /// Share of wall-clock time spent blocked on a full output channel, 0..=1.
    pub(crate) backpressured_ratio: f64,
}

impl SubtaskRates {
    pub(crate) fn between(old: &SubtaskSample, new: &SubtaskSample, elapsed: Duration) -> Self {
        let secs = elapsed.as_secs_f64();
        if secs <= 0.0 {
            return SubtaskRates::default();
        }
        let nanos = secs * 1e9;
        let per_sec = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs;
        let ratio = |a: u64, b: u64| (b.saturating_sub(a) as f64 / nanos).clamp(0.0, 1.0);
        SubtaskRates {
            records_in_per_sec: per_sec(old.records_in, new.records_in),
            records_out_per_sec: per_sec(old.records_out, new.records_out),
            bytes_in_per_sec: per_sec(old.bytes_in, new.bytes_in),
            bytes_out_per_sec: per_sec(old.bytes_out, new.bytes_out),
            busy_ratio: ratio(old.busy_ns, new.busy_ns),
            backpressured_ratio: ratio(old.backpressured_ns, new.backpressured_ns),
        }
    }
}

/// The last [`HISTORY_SAMPLES`] samples of a job, and when it reached a final status.
#[derive(Debug, Default)]
pub(crate) struct History {
    pub(crate) samples: VecDeque<Sample>,
    pub(crate) ended_ms: Option<i64>,
}

impl History {
    /// Rates of every subtask of operator `id` between the last two samples.
    pub(crate) fn latest_rates(&self, id: u32) -> Option<Vec<SubtaskRates>> {
        let n = self.samples.len();
        if n < 2 {
            return None;
        }
        rates_between(&self.samples[n - 2], &self.samples[n - 1], id)
    }

    /// The samples of the last `window`, oldest first.
    pub(crate) fn since(&self, window: Duration) -> impl Iterator<Item = &Sample> {
        let newest = self.samples.back().map(|s| s.at);
        self.samples.iter().filter(move |s| newest.is_some_and(|n| n.duration_since(s.at) <= window))
    }
}

/// Rates of every subtask of operator `id` from `old` to `new`.
pub(crate) fn rates_between(old: &Sample, new: &Sample, id: u32) -> Option<Vec<SubtaskRates>> {
    let (a, b) = (old.operator(id)?, new.operator(id)?);
    let elapsed = new.at.duration_since(old.at);
    Some(a.iter().zip(b).map(|(x, y)| SubtaskRates::between(x, y, elapsed)).collect())
}

impl JobEntry {
    fn sample(&self, at: Instant) {
        let snapshot = self.view.metrics.snapshot();
        let sample = Sample::of(&snapshot, at, now_ms());
        let status = self.view.status();
        let mut h = self.history.lock();
        if h.ended_ms.is_none() && is_final(status) {
            h.ended_ms = Some(sample.at_ms);
        }
        // A sample right after another (registration, then the sampler's first tick) would
        // turn a start-up burst into a spike of the rate.
        if h.samples.back().is_some_and(|last| at.duration_since(last.at) < SAMPLE_INTERVAL / 2) {
            return;
        }
        if h.samples.len() >= HISTORY_SAMPLES {
            h.samples.pop_front();
        }
        h.samples.push_back(sample);
    }

    /// Run `f` with the history locked (keep it short: the sampler waits).
    pub(crate) fn with_history<R>(&self, f: impl FnOnce(&History) -> R) -> R {
        f(&self.history.lock())
    }

    /// Time since start, up to the end when the job has ended.
    pub(crate) fn duration_ms(&self, now: i64) -> i64 {
        let end = self.history.lock().ended_ms.filter(|_| is_final(self.view.status())).unwrap_or(now);
        (end - self.view.started_ms).max(0)
    }
}

/// True for statuses a job never leaves.
pub(crate) fn is_final(status: JobStatus) -> bool {
    matches!(status, JobStatus::Finished | JobStatus::Canceled | JobStatus::Failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_deltas_over_elapsed_time_and_ratios_are_clamped() {
        let old = SubtaskSample { records_in: 100, records_out: 50, bytes_in: 1_000, ..Default::default() };
        let new = SubtaskSample {
            records_in: 300,
            records_out: 150,
            bytes_in: 9_000,
            bytes_out: 4_000,
            busy_ns: 500_000_000,
            backpressured_ns: 5_000_000_000,
        };
        let r = SubtaskRates::between(&old, &new, Duration::from_secs(2));
        assert_eq!(r.records_in_per_sec, 100.0);
        assert_eq!(r.records_out_per_sec, 50.0);
        assert_eq!((r.bytes_in_per_sec, r.bytes_out_per_sec), (4_000.0, 2_000.0));
        assert_eq!(r.busy_ratio, 0.25);
        assert_eq!(r.backpressured_ratio, 1.0);
        assert_eq!(SubtaskRates::between(&new, &old, Duration::ZERO), SubtaskRates::default());
    }
}

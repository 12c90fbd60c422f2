//! The plan document: what a job binary prints for `--caudal-plan` (or
//! `CAUDAL__PRINT_PLAN=1`), and how the job manager gets it from an uploaded binary.
//!
//! One line of JSON on stdout: `{"caudal_plan":1,"plan":{…JobPlan…},"checkpoints":{…}}`.
//! The job manager runs the binary with the job's arguments, reads that line, and knows
//! the operators, their parallelism (hence the slots needed) and the checkpoint settings.

use crate::config::JobConfig;
use crate::graph::{EdgeKind, JobPlan, PlanEdge, PlanNode};
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The version of the document's layout.
pub(crate) const PLAN_VERSION: u32 = 1;

/// The job's checkpoint settings, as its binary configured them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct PlanCheckpoints {
    /// Interval, ms; `None`: no checkpoints.
    pub(crate) interval_ms: Option<u64>,
    /// Timeout, ms.
    pub(crate) timeout_ms: u64,
    /// Minimum pause, ms.
    pub(crate) min_pause_ms: u64,
    /// Completed checkpoints retained.
    pub(crate) retained: usize,
}

/// One operator as the job manager reads it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct DocOperator {
    pub(crate) id: usize,
    pub(crate) name: String,
    pub(crate) kind: String,
    pub(crate) parallelism: u32,
    pub(crate) task: usize,
    pub(crate) uid: String,
}

/// One edge as the job manager reads it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct DocEdge {
    pub(crate) from: usize,
    pub(crate) to: usize,
    pub(crate) partitioning: String,
    pub(crate) chained: bool,
}

/// The plan as the job manager reads it (the same JSON as [`JobPlan`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct DocPlan {
    pub(crate) job: String,
    pub(crate) max_parallelism: u32,
    pub(crate) operators: Vec<DocOperator>,
    pub(crate) edges: Vec<DocEdge>,
}

/// What `--caudal-plan` prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PlanDocument {
    /// [`PLAN_VERSION`].
    pub(crate) caudal_plan: u32,
    pub(crate) plan: DocPlan,
    pub(crate) checkpoints: PlanCheckpoints,
}

impl PlanDocument {
    /// Slots the job needs: its largest operator parallelism (subtasks of different
    /// operators share a slot, as in Flink).
    pub(crate) fn slots_needed(&self) -> u32 {
        self.plan.operators.iter().map(|o| o.parallelism).max().unwrap_or(1)
    }

    /// Source subtasks in the whole job.
    pub(crate) fn source_subtasks(&self) -> usize {
        self.plan.operators.iter().filter(|o| o.kind == "source").map(|o| o.parallelism as usize).sum()
    }

    /// Back to the engine's plan type (for the job's view in the REST API).
    pub(crate) fn job_plan(&self) -> JobPlan {
        let kind = |k: &str| -> &'static str {
            match k {
                "source" => "source",
                "sink" => "sink",
                _ => "operator",
            }
        };
        JobPlan {
            job: self.plan.job.clone(),
            max_parallelism: self.plan.max_parallelism,
            operators: self
                .plan
                .operators
                .iter()
                .map(|o| PlanNode {
                    id: o.id,
                    name: o.name.clone(),
                    kind: kind(&o.kind),
                    parallelism: o.parallelism,
                    task: o.task,
                    uid: o.uid.clone(),
                })
                .collect(),
            edges: self
                .plan
                .edges
                .iter()
                .map(|e| PlanEdge {
                    from: e.from,
                    to: e.to,
                    partitioning: match e.partitioning.as_str() {
                        "hash" => EdgeKind::Hash,
                        "rebalance" => EdgeKind::Rebalance,
                        "broadcast" => EdgeKind::Broadcast,
                        _ => EdgeKind::Forward,
                    },
                    chained: e.chained,
                })
                .collect(),
        }
    }

    /// The checkpoint config of the job on the cluster's checkpoint storage.
    pub(crate) fn checkpoint_config(
        &self,
        cluster: &crate::cluster::jobmanager::JobManagerConfig,
    ) -> crate::config::CheckpointConfig {
        let mut c = crate::config::CheckpointConfig {
            interval: self.checkpoints.interval_ms.map(Duration::from_millis),
            timeout: Duration::from_millis(self.checkpoints.timeout_ms),
            min_pause: Duration::from_millis(self.checkpoints.min_pause_ms),
            retained: self.checkpoints.retained,
            ..Default::default()
        };
        c.storage.url.clone_from(&cluster.checkpoint_url);
        c.storage.s3 = cluster.checkpoint_s3.clone();
        c
    }
}

/// The document of `plan` under `config` (what the job binary prints).
pub(crate) fn document(plan: &JobPlan, config: &JobConfig) -> Result<String> {
    let value = serde_json::json!({
        "caudal_plan": PLAN_VERSION,
        "plan": plan,
        "checkpoints": PlanCheckpoints {
            interval_ms: config.checkpoints.interval.map(|d| d.as_millis() as u64),
            timeout_ms: config.checkpoints.timeout.as_millis() as u64,
            min_pause_ms: config.checkpoints.min_pause.as_millis() as u64,
            retained: config.checkpoints.retained,
        },
    });
    serde_json::to_string(&value).map_err(|e| Error::Cluster(format!("encoding the plan: {e}")))
}

/// How long a binary may take to print its plan.
pub(crate) const PLAN_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs `binary args…` as the plan printer and parses its plan; every way this can go
/// wrong is an error that says the binary is not (or not a working) Caudal job.
pub(crate) fn plan_of_binary(
    binary: &Path,
    args: &[String],
    parallelism: Option<u32>,
) -> Result<PlanDocument> {
    let mut cmd = Command::new(binary);
    cmd.args(args)
        .env("CAUDAL__PRINT_PLAN", "1")
        .env("CAUDAL__WEB_BIND", "off")
        .env_remove("CAUDAL__EXECUTOR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(p) = parallelism {
        cmd.env("CAUDAL__PARALLELISM", p.to_string());
    }
    let mut child = cmd.spawn().map_err(|e| {
        Error::Cluster(format!("the uploaded file cannot be run as a program ({e}): not a Caudal job binary"))
    })?;
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let out_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        if let Some(o) = stdout.as_mut() {
            let _ = o.take(16 * 1024 * 1024).read_to_end(&mut s);
        }
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        if let Some(o) = stderr.as_mut() {
            let _ = o.take(1024 * 1024).read_to_end(&mut s);
        }
        s
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() > PLAN_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Cluster(format!(
                    "the binary did not print a Caudal plan within {}s (run with {}): not a Caudal job binary, or it does not reach env.execute()",
                    PLAN_TIMEOUT.as_secs(),
                    super::role::PLAN_ARG
                )));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(Error::io("waiting for the plan printer", e)),
        }
    };
    let stdout = String::from_utf8_lossy(&out_reader.join().unwrap_or_default()).to_string();
    let stderr = String::from_utf8_lossy(&err_reader.join().unwrap_or_default()).to_string();
    let doc = stdout.lines().rev().find_map(|l| serde_json::from_str::<PlanDocument>(l.trim()).ok());
    match doc {
        Some(d) if d.caudal_plan == PLAN_VERSION && status.success() => Ok(d),
        Some(d) if d.caudal_plan != PLAN_VERSION => Err(Error::Cluster(format!(
            "the binary prints plan version {}, this job manager reads version {PLAN_VERSION}: rebuild the job against this Caudal",
            d.caudal_plan
        ))),
        _ => {
            let tail: Vec<&str> = stderr.lines().rev().take(5).collect::<Vec<_>>().into_iter().rev().collect();
            Err(Error::Cluster(format!(
                "not a Caudal job binary: asked for its plan ({}), it exited with {status} and printed no plan{}",
                super::role::PLAN_ARG,
                if tail.is_empty() { String::new() } else { format!("; its last output: {}", tail.join(" | ")) }
            )))
        }
    }
}

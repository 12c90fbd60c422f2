//! Submitting a job: check the binary, get its plan, check the slots and the restore
//! point, record the job and start its driver — and resume recorded jobs at start-up.

use super::job::{ClusterJob, ClusterJobView, JobSpec};
use super::Cluster;
use crate::cluster::plan::plan_of_binary;
use crate::coordinator::open_store;
use caudal_checkpoints::metadata::{checkpoint_dirs, completed_checkpoints};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// `POST /api/v1/cluster/jobs`: what `caudal submit` sends after uploading the binary.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubmitRequest {
    /// The uploaded binary.
    pub binary_sha256: String,
    /// The job's own arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Default parallelism of the job's operators (`None`: the job's own).
    #[serde(default)]
    pub parallelism: Option<u32>,
    /// `latest` or a checkpoint directory (`chk-7`, `savepoints/NAME`) to start from.
    #[serde(default)]
    pub restore: Option<String>,
}

/// Why a submission was refused.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The request or the binary is at fault (HTTP 400).
    Invalid(String),
    /// A job with that name is still running (HTTP 409).
    Conflict(String),
}

/// Validates and starts a job.
pub(crate) fn submit(cluster: &Arc<Cluster>, req: SubmitRequest) -> Result<ClusterJobView, Refused> {
    let sha = req.binary_sha256.trim().to_string();
    if !cluster.blobs.contains(&sha) {
        return Err(Refused::Invalid(format!(
            "binary {sha} was not uploaded: PUT it to /api/v1/cluster/blobs/{sha} first (caudal submit does)"
        )));
    }
    if req.parallelism == Some(0) {
        return Err(Refused::Invalid("--parallelism must be at least 1".into()));
    }
    let doc = plan_of_binary(&cluster.blobs.path(&sha), &req.args, req.parallelism)
        .map_err(|e| Refused::Invalid(e.to_string()))?;
    let name = doc.plan.job.clone();
    if let Some(old) = cluster.jobs.lock().get(&name) {
        let status = old.view.status();
        if !super::job::is_final(status) {
            return Err(Refused::Conflict(format!(
                "a job named `{name}` is already {status:?}: cancel it first (caudal cancel {name})"
            )));
        }
    }
    let needed = doc.slots_needed();
    let (_, total, largest, n) = cluster.tms.capacity();
    if n == 0 {
        return Err(Refused::Invalid(
            "no task manager is registered: start one with `caudal taskmanager --jobmanager URL --slots N`"
                .into(),
        ));
    }
    if needed > total {
        return Err(Refused::Invalid(format!(
            "job `{name}` needs {needed} slots (its largest operator parallelism), but the cluster has {total} \
             slots in {n} task managers (the largest has {largest}): lower --parallelism or add task managers"
        )));
    }
    let config = doc.checkpoint_config(&cluster.config);
    let (store, paths) = open_store(&config, &name).map_err(|e| Refused::Invalid(e.to_string()))?;
    let storage = |e: caudal_checkpoints::Error| Refused::Invalid(format!("checkpoint storage: {e}"));
    let restore = match req.restore.as_deref().map(str::trim) {
        None | Some("") => None,
        Some("latest") => match completed_checkpoints(store.as_ref(), &paths).map_err(storage)?.last() {
            Some(id) => Some(paths.checkpoint_dir(*id)),
            None => {
                return Err(Refused::Invalid(format!(
                    "--restore latest: no completed checkpoint of job `{name}` in {}/{}: nothing to restore \
                     (submit without --restore to start from scratch)",
                    store.location(),
                    paths.root()
                )))
            }
        },
        Some(p) => Some(p.to_string()),
    };
    let floor = checkpoint_dirs(store.as_ref(), &paths).map_err(storage)?.last().map_or(1, |id| id.0 + 1);
    let spec = JobSpec {
        name: name.clone(),
        binary_sha256: sha,
        args: req.args,
        parallelism: req.parallelism,
        restore,
        checkpoint_floor: floor,
        submitted_ms: crate::job::now_ms(),
        final_status: None,
        ended: None,
    };
    cluster.records.save(&spec).map_err(|e| Refused::Invalid(e.to_string()))?;
    let job = Arc::new(ClusterJob::new(spec, doc));
    job.set_detail("created: waiting for slots");
    cluster.ended.lock().remove(&name);
    cluster.launch(job.clone()).map_err(|e| Refused::Invalid(e.to_string()))?;
    tracing::info!("caudal jobmanager: job `{name}` submitted ({needed} slots)");
    Ok(job.summary())
}

/// Tries at reading a job's plan from its binary when a restarted job manager resumes it.
const RESUME_PLAN_TRIES: u32 = 5;

/// Starts again every recorded job that had not ended (after a job manager restart), and
/// lists again those that had (as they ended; they never run again).
pub(crate) fn resume_jobs(cluster: &Arc<Cluster>) {
    for spec in cluster.records.load_all() {
        if spec.final_status.is_some() {
            if let Some(view) = spec.ended {
                cluster.ended.lock().insert(spec.name, view);
            }
            continue;
        }
        let name = spec.name.clone();
        if !cluster.blobs.contains(&spec.binary_sha256) {
            tracing::error!(
                "caudal jobmanager: cannot resume job `{name}`: its binary {} is gone",
                spec.binary_sha256
            );
            continue;
        }
        // The binary prints its plan again; on a loaded machine (or one that just came back)
        // that can fail once without meaning anything: a few tries before giving up on it.
        let binary = cluster.blobs.path(&spec.binary_sha256);
        let mut planned = plan_of_binary(&binary, &spec.args, spec.parallelism);
        for attempt in 2..=RESUME_PLAN_TRIES {
            let Err(e) = &planned else { break };
            tracing::warn!("caudal jobmanager: reading the plan of job `{name}` to resume it failed ({e}); try {attempt} of {RESUME_PLAN_TRIES}");
            std::thread::sleep(std::time::Duration::from_secs(1));
            planned = plan_of_binary(&binary, &spec.args, spec.parallelism);
        }
        match planned {
            Ok(doc) => {
                let job = Arc::new(ClusterJob::new(spec, doc));
                job.set_detail("resumed after a job manager restart: waiting for slots");
                tracing::info!(
                    "caudal jobmanager: resuming job `{name}` from its latest completed checkpoint"
                );
                if let Err(e) = cluster.launch(job) {
                    tracing::error!("caudal jobmanager: cannot resume job `{name}`: {e}");
                }
            }
            Err(e) => tracing::error!("caudal jobmanager: cannot resume job `{name}`: {e}"),
        }
    }
}

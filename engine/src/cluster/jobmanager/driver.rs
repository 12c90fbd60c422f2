//! A job's state machine, one thread per job:
//!
//! ```text
//! CREATED ─► (attempt) ─► RUNNING ─► FINISHED
//!                 │           │
//!                 │           └─► failure ─► FAILING ─► RESTARTING ─► (attempt) …
//!                 │                              └─► FAILED (not retryable, or over the restart cap)
//!                 └─► cancel ─► CANCELED
//! ```
//!
//! Every attempt restores the latest checkpoint completed by this submission (found in
//! checkpoint storage, so a restarted job manager does the same), or what the user asked
//! to restore at submission, or starts from scratch.

use super::attempt::{self, Outcome};
use super::job::ClusterJob;
use super::restart::{Decision, RestartHistory};
use super::Cluster;
use crate::coordinator::open_store;
use crate::job::JobStatus;
use crate::Result;
use caudal_checkpoints::metadata::completed_checkpoints;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The checkpoint directory the next attempt restores.
pub(crate) fn restore_point(cluster: &Cluster, job: &ClusterJob) -> Result<Option<String>> {
    let spec = job.spec.lock().clone();
    let config = job.doc.checkpoint_config(&cluster.config);
    let (store, paths) = open_store(&config, &spec.name)?;
    // The class stays: a storage outage is retried like any failed attempt.
    let ids = completed_checkpoints(store.as_ref(), &paths).map_err(|e| crate::Error::CheckpointStorage {
        context: format!("listing the checkpoints of `{}`", spec.name),
        source: Box::new(e),
    })?;
    Ok(match ids.into_iter().rfind(|id| id.0 >= spec.checkpoint_floor) {
        Some(id) => Some(paths.checkpoint_dir(id)),
        None => spec.restore,
    })
}

fn finish(cluster: &Cluster, job: &ClusterJob, status: JobStatus, detail: String) {
    job.view.set_status(status);
    job.set_detail(detail);
    job.state.lock().task_managers.clear();
    let view = job.summary();
    let spec = {
        let mut spec = job.spec.lock();
        spec.final_status = Some(format!("{status:?}").to_uppercase());
        spec.ended = Some(view);
        spec.clone()
    };
    if let Err(e) = cluster.records.save(&spec) {
        tracing::warn!("caudal jobmanager: {e}");
    }
    tracing::info!("caudal jobmanager: job `{}` {:?}: {}", spec.name, status, job.state.lock().detail);
}

/// Drives `job` until it reaches a final status.
pub(crate) fn drive(cluster: Arc<Cluster>, job: Arc<ClusterJob>) {
    let mut history = RestartHistory::new(cluster.config.restart.clone());
    loop {
        let outcome = match restore_point(&cluster, &job) {
            Ok(restore) => attempt::run(&cluster, &job, restore),
            Err(e) => Outcome::Failed {
                cause: format!("cannot read checkpoint storage: {e}"),
                retryable: e.is_retryable(),
                progressed: false,
            },
        };
        match outcome {
            Outcome::Finished if job.stop.load(Ordering::SeqCst) => {
                let last = job.state.lock().last_checkpoint;
                let detail = match last {
                    Some(n) => {
                        format!("stopped after its final checkpoint {n}: resume with --restore latest")
                    }
                    None => "stopped (no checkpoint taken)".to_string(),
                };
                let detail = match job.state.lock().stop_savepoint.clone() {
                    Some(Ok(path)) => format!("{detail}; savepoint written: resume with --restore {path}"),
                    Some(Err(cause)) => format!("{detail}; the savepoint was NOT written: {cause}"),
                    None => detail,
                };
                return finish(&cluster, &job, JobStatus::Finished, detail);
            }
            Outcome::Finished => return finish(&cluster, &job, JobStatus::Finished, "finished".into()),
            Outcome::Canceled => return finish(&cluster, &job, JobStatus::Canceled, "canceled".into()),
            Outcome::Failed { cause, retryable, progressed } => {
                tracing::warn!(job = %job.name(), "caudal jobmanager: job `{}` failed: {cause}", job.name());
                job.view.set_status(JobStatus::Failing);
                job.view.record_failure(cause.clone());
                if !retryable {
                    return finish(
                        &cluster,
                        &job,
                        JobStatus::Failed,
                        format!("failed (not retryable): {cause}"),
                    );
                }
                if progressed {
                    history.on_stable();
                }
                match history.on_failure(Instant::now()) {
                    Decision::GiveUp { restarts } => {
                        let window = cluster.config.restart.window;
                        return finish(
                            &cluster,
                            &job,
                            JobStatus::Failed,
                            format!(
                                "failed after {restarts} restarts within {window:?}; last cause: {cause}"
                            ),
                        );
                    }
                    Decision::RestartAfter(wait) => {
                        job.state.lock().restarts += 1;
                        job.view.set_status(JobStatus::Restarting);
                        job.set_detail(format!("restarting in {wait:?} after: {cause}"));
                        let until = Instant::now() + wait;
                        while Instant::now() < until {
                            if job.cancel.load(Ordering::SeqCst) || job.stop.load(Ordering::SeqCst) {
                                return finish(&cluster, &job, JobStatus::Canceled, "canceled".into());
                            }
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    }
                }
            }
        }
    }
}

//! What a run restores from: the checkpoint or savepoint `CheckpointConfig::restore`
//! names, checked against the job (max_parallelism, operator uids), split per operator
//! uid for the subtasks — and the checkpoints later runs took on from it, which sinks
//! read to tell what such a run already committed ([`caudal_checkpoints::lineage`]).
//!
//! In: the job's checkpoint storage and plan. Out: [`RestoredState`] for the executor, the
//! restore points for the coordinator's [`Lineage`].

use crate::config::{CheckpointConfig, RestoreFrom};
use crate::coordinator::open_store;
use crate::graph::JobPlan;
use crate::runtime::executor::RestoredState;
use crate::LaterSnapshot;
use crate::{Error, Result};
use caudal_checkpoints::metadata::completed_checkpoints;
use caudal_checkpoints::{
    latest_completed, latest_completed_with_fallback, read_metadata, CheckpointKind, CheckpointMetadata,
    CheckpointPaths, CheckpointStore, Lineage,
};
use std::collections::HashMap;
use std::sync::Arc;

/// Completed checkpoints read, newest first, when looking for descendants of the restored one.
const DESCENDANTS_READ: usize = 16;

/// A failed read of the checkpoint to restore, with its class kept: a storage outage is
/// retried by the job manager, a corrupt or foreign checkpoint is not.
fn restore_err(e: caudal_checkpoints::Error) -> Error {
    Error::CheckpointStorage { context: "restore".into(), source: Box::new(e) }
}

/// Reads the checkpoint to restore from, by the rules of `config.restore`.
fn load_restore(
    config: &CheckpointConfig,
    store: &dyn CheckpointStore,
    paths: &CheckpointPaths,
    job: &str,
) -> Result<Option<CheckpointMetadata>> {
    let Some(from) = &config.restore else { return Ok(None) };
    let meta = match from {
        RestoreFrom::Latest if config.fallback => match latest_completed_with_fallback(store, paths, job) {
            Ok(Some(r)) => {
                for s in &r.skipped {
                    tracing::warn!(
                        "caudal: skipping corrupt checkpoint {}: {}",
                        s.checkpoint_id.label(),
                        s.error
                    );
                }
                Some(r.metadata)
            }
            Ok(None) => None,
            Err(e) => return Err(restore_err(e)),
        },
        RestoreFrom::Latest => latest_completed(store, paths, job).map_err(restore_err)?,
        RestoreFrom::Path(p) => {
            let dir = if p.starts_with(paths.root()) {
                p.clone()
            } else {
                format!("{}/{}", paths.root().trim_end_matches('/'), p)
            };
            Some(caudal_checkpoints::metadata::read_metadata_in(store, &dir, job).map_err(restore_err)?)
        }
    };
    match meta {
        Some(m) => Ok(Some(m)),
        None => Err(Error::config(
            "restore",
            format!(
                "no completed checkpoint of job `{job}` in {}/{}: nothing to restore (start without --restore to begin from scratch)",
                store.location(),
                paths.root()
            ),
        )),
    }
}

/// Opens the job's checkpoint storage and reads what to restore (announced on stderr, with
/// the during-restore crash point): the first step of every process that runs subtasks.
/// With `claim_for`, run `claim_for` claims the storage first (embedded runs; a job
/// manager claims for its executors), so it restores whatever an earlier run completed.
///
/// A checkpoint that does not fit `plan` fails here, before any record is processed: one
/// taken with another `max_parallelism` (its key groups cannot be remapped), or one holding
/// state of operators the job no longer has, unless `allow_non_restored_state`.
pub(crate) fn open_and_load_restore(
    config: &CheckpointConfig,
    plan: &JobPlan,
    claim_for: Option<&str>,
) -> Result<(Arc<dyn CheckpointStore>, CheckpointPaths, RestoredState)> {
    let job = plan.job.as_str();
    let (store, paths) = open_store(config, job)?;
    if let Some(run) = claim_for {
        crate::RunFence::new(store.clone(), paths.clone(), run).claim()?;
    }
    let meta = load_restore(config, store.as_ref(), &paths, job)?;
    if let Some(m) = &meta {
        check_fits(m, plan, config.allow_non_restored_state)?;
    }
    let restored = match &meta {
        Some(m) => restored_state(m, &descendants(store.as_ref(), &paths, job, m)),
        None => RestoredState::default(),
    };
    if let Some(m) = &meta {
        tracing::info!("caudal: restoring job `{job}` from checkpoint {}", m.checkpoint_id.label());
        crate::crash::point(crate::crash::DURING_RESTORE, m.checkpoint_id);
    }
    Ok((store, paths, restored))
}

/// The restore rules of a checkpoint against the job that restores it.
fn check_fits(meta: &CheckpointMetadata, plan: &JobPlan, allow_non_restored_state: bool) -> Result<()> {
    let label = meta.checkpoint_id.label();
    if u32::from(meta.max_parallelism) != plan.max_parallelism {
        return Err(Error::config(
            "max_parallelism",
            format!(
                "checkpoint {label} was taken with max_parallelism {}, this job has {}: keyed state is \
                 split into that many key groups and cannot be regrouped; restore with max_parallelism {}",
                meta.max_parallelism, plan.max_parallelism, meta.max_parallelism
            ),
        ));
    }
    let unmapped: Vec<&str> = meta
        .operators
        .iter()
        .filter(|(_, op)| {
            op.subtasks.values().any(|s| s.operator_state.as_ref().is_some_and(|b| !b.0.is_empty()))
                || !op.keyed_handles().is_empty()
        })
        .map(|(id, _)| id.as_str())
        .filter(|uid| !plan.operators.iter().any(|o| o.uid == *uid))
        .collect();
    if unmapped.is_empty() {
        return Ok(());
    }
    if allow_non_restored_state {
        for uid in &unmapped {
            tracing::warn!(
                "caudal: dropping the state of operator `{uid}` of checkpoint {label}: this job has no operator with that uid (allow_non_restored_state)"
            );
        }
        return Ok(());
    }
    let have: Vec<&str> = plan.operators.iter().map(|o| o.uid.as_str()).collect();
    Err(Error::config(
        "restore",
        format!(
            "checkpoint {label} holds state of operators this job does not have: {}; the job's operator uids are {}. \
             Give the operators the uids they had (.uid(..)), or restore with --allow-non-restored-state \
             (CAUDAL__ALLOW_NON_RESTORED_STATE=1) to drop that state; a sink's pending output is then lost",
            unmapped.join(", "),
            have.join(", ")
        ),
    ))
}

/// The restore points of the checkpoints a run restored by `config` takes (the job
/// manager's coordinator; its executors read the same checkpoint for their state).
pub(crate) fn restore_points(
    config: &CheckpointConfig,
    store: &dyn CheckpointStore,
    paths: &CheckpointPaths,
    job: &str,
) -> Result<Vec<caudal_checkpoints::CheckpointRef>> {
    let meta = load_restore(config, store, paths, job)?;
    Ok(Lineage::of_run("", meta.as_ref()).restored_from)
}

/// The completed checkpoints (of the newest [`DESCENDANTS_READ`]) that descend from
/// `restored`: taken later by its run, or by runs restored from it. Evidence only: one
/// that cannot be read is left out with a warning.
fn descendants(
    store: &dyn CheckpointStore,
    paths: &CheckpointPaths,
    job: &str,
    restored: &CheckpointMetadata,
) -> Vec<CheckpointMetadata> {
    let ancestor = restored.reference();
    if ancestor.run.is_empty() {
        return Vec::new();
    }
    let ids = match completed_checkpoints(store, paths) {
        Ok(ids) => ids,
        Err(e) => {
            tracing::warn!("caudal: listing the checkpoints after the restored one: {e}");
            return Vec::new();
        }
    };
    ids.into_iter()
        .rev()
        .take(DESCENDANTS_READ)
        .filter_map(|id| match read_metadata(store, paths, id, job) {
            Ok(m) => m.descends_from(&ancestor).then_some(m),
            Err(e) => {
                tracing::warn!("caudal: reading {} (after the restored checkpoint): {e}", id.label());
                None
            }
        })
        .collect()
}

/// The operator snapshots of a checkpoint, by operator uid (all old subtasks, in order),
/// with the operators' snapshots in `descendants`.
fn restored_state(meta: &CheckpointMetadata, descendants: &[CheckpointMetadata]) -> RestoredState {
    let mut operators = HashMap::new();
    let mut keyed = HashMap::new();
    for (id, op) in &meta.operators {
        let blobs: Vec<Vec<u8>> =
            op.subtasks.values().filter_map(|s| s.operator_state.as_ref().map(|b| b.0.clone())).collect();
        operators.insert(id.as_str().to_string(), blobs);
        let handles = op.keyed_handles();
        if !handles.is_empty() {
            keyed.insert(id.as_str().to_string(), handles);
        }
    }
    let mut later: HashMap<String, Vec<LaterSnapshot>> = HashMap::new();
    for d in descendants {
        for (id, op) in &d.operators {
            later.entry(id.as_str().to_string()).or_default().push(LaterSnapshot {
                checkpoint: d.checkpoint_id,
                run: d.lineage.run.clone(),
                subtasks: op
                    .subtasks
                    .values()
                    .filter_map(|s| s.operator_state.as_ref().map(|b| b.0.clone()))
                    .collect(),
            });
        }
    }
    RestoredState {
        checkpoint: Some(meta.checkpoint_id),
        operators,
        keyed,
        from_savepoint: meta.kind == CheckpointKind::Savepoint,
        restore_points: Lineage::of_run("", Some(meta)).restored_from,
        later,
    }
}

//! Retention of completed checkpoints, and savepoints.
//!
//! Retention keeps the last `k` completed checkpoints, deletes older `chk-<n>` folders
//! (and folders of aborted checkpoints older than the latest completed one), and every
//! `shared/` file that no retained checkpoint references — except files uploaded by a
//! checkpoint newer than the latest completed one, which may belong to a checkpoint in
//! flight. Savepoints live under `savepoints/` with copies of all their files and are
//! never touched by retention.

use std::collections::HashSet;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::ids::CheckpointId;
use crate::metadata::{
    checkpoint_dirs, completed_checkpoints, read_metadata, read_metadata_in, CheckpointKind,
    CheckpointMetadata,
};
use crate::store::{delete_dir, CheckpointPaths, CheckpointStore};
use crate::{Error, Result};

/// How many completed checkpoints to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Completed checkpoints kept (at least 1; default 3).
    pub retained_checkpoints: usize,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig { retained_checkpoints: 3 }
    }
}

impl RetentionConfig {
    /// Checks the values; errors name the field.
    pub fn validate(&self) -> Result<()> {
        if self.retained_checkpoints == 0 {
            return Err(Error::config(
                "checkpoints.retained_checkpoints",
                "must be at least 1: the latest completed checkpoint is needed for recovery",
            ));
        }
        Ok(())
    }
}

/// What retention deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// The completed checkpoints kept.
    pub retained: Vec<CheckpointId>,
    /// The checkpoint folders deleted (completed beyond k, or aborted).
    pub deleted_checkpoints: Vec<CheckpointId>,
    /// Shared objects deleted.
    pub deleted_shared_files: Vec<String>,
}

/// Applies retention for `job_name`. Reads the metadata of every retained checkpoint;
/// if one cannot be read, nothing shared is deleted and the error is returned.
pub fn apply_retention(
    store: &dyn CheckpointStore,
    paths: &CheckpointPaths,
    job_name: &str,
    config: &RetentionConfig,
) -> Result<RetentionReport> {
    config.validate()?;
    let completed = completed_checkpoints(store, paths)?;
    let Some(latest) = completed.last().copied() else {
        return Ok(RetentionReport::default());
    };
    let keep_from = completed.len().saturating_sub(config.retained_checkpoints);
    let retained: Vec<CheckpointId> = completed[keep_from..].to_vec();

    // Read every retained checkpoint first: their references protect shared files.
    let mut referenced = HashSet::new();
    for id in &retained {
        let meta = read_metadata(store, paths, *id, job_name)?;
        referenced.extend(meta.referenced_objects());
    }

    let mut report = RetentionReport { retained: retained.clone(), ..Default::default() };
    let oldest_retained = retained.first().copied().unwrap_or(latest);
    for id in checkpoint_dirs(store, paths)? {
        let completed_and_old = id < oldest_retained;
        let aborted = id < latest && !completed.contains(&id);
        if completed_and_old || aborted {
            // The metadata goes first, so a crash half-way leaves no "complete" checkpoint
            // with missing files.
            store.delete(&paths.metadata(id))?;
            delete_dir(store, &paths.checkpoint_dir(id))?;
            report.deleted_checkpoints.push(id);
        }
    }

    for entry in store.list(&paths.shared_dir())? {
        if referenced.contains(&entry.path) {
            continue;
        }
        let in_flight = paths.parse_shared_file(&entry.path).is_none_or(|s| s.first_checkpoint > latest);
        if in_flight {
            continue;
        }
        store.delete(&entry.path)?;
        report.deleted_shared_files.push(entry.path);
    }
    Ok(report)
}

/// Copies completed checkpoint `id` into a self-contained savepoint
/// `savepoints/<name>/` (all files copied, metadata written last with
/// put-if-absent) and returns the savepoint's metadata.
pub fn create_savepoint(
    store: &dyn CheckpointStore,
    paths: &CheckpointPaths,
    id: CheckpointId,
    name: &str,
    job_name: &str,
) -> Result<CheckpointMetadata> {
    let mut meta = read_metadata(store, paths, id, job_name)?;
    let target = paths.savepoint_metadata(name)?;
    if store.head(&target)?.is_some() {
        return Err(Error::config("savepoint name", format!("savepoint `{name}` already exists")));
    }
    for op in meta.operators.values_mut() {
        for st in op.subtasks.values_mut() {
            if let Some(h) = st.keyed_state.as_mut() {
                for f in h.files_mut() {
                    let copy = paths.savepoint_copy(name, &f.object)?;
                    store.copy(&f.object, &copy)?;
                    f.object = copy;
                }
            }
        }
    }
    meta.kind = CheckpointKind::Savepoint;
    store.put_if_absent(&target, Bytes::from(meta.to_json()?))?;
    Ok(meta)
}

/// Reads savepoint `name` of `job_name`, validated like a checkpoint.
pub fn read_savepoint(
    store: &dyn CheckpointStore,
    paths: &CheckpointPaths,
    name: &str,
    job_name: &str,
) -> Result<CheckpointMetadata> {
    read_metadata_in(store, &paths.savepoint_dir(name)?, job_name)
}

/// Names of the savepoints in storage.
pub fn list_savepoints(store: &dyn CheckpointStore, paths: &CheckpointPaths) -> Result<Vec<String>> {
    let mut names = store.list_dirs(&paths.savepoints_dir())?;
    names.sort();
    Ok(names)
}

/// Deletes savepoint `name` (metadata first).
pub fn delete_savepoint(store: &dyn CheckpointStore, paths: &CheckpointPaths, name: &str) -> Result<usize> {
    store.delete(&paths.savepoint_metadata(name)?)?;
    delete_dir(store, &paths.savepoint_dir(name)?)
}

//! Savepoints from the command line: a completed checkpoint copied into
//! `<storage>/<job>/savepoints/<name>/` (every file copied, metadata written last), kept until
//! deleted — retention never touches it — and restorable with
//! `restore = Path("savepoints/<name>")` at any parallelism.
//!
//! A running job takes one on stop with `CheckpointConfig::savepoint_on_stop`; these functions
//! work on the storage alone, with or without a running job.

use crate::config::CheckpointConfig;
use crate::coordinator::open_store;
use crate::types::CheckpointId;
use crate::{Error, Result};
use caudal_checkpoints::metadata::completed_checkpoints;
use caudal_checkpoints::retention::{delete_savepoint as delete, list_savepoints as list};

fn err(what: &str) -> impl Fn(caudal_checkpoints::Error) -> Error + '_ {
    move |e| Error::config(what, e.to_string())
}

/// Copies checkpoint `from` (`chk-N`; the latest completed one when `None`) of `job` into the
/// savepoint `name`; returns its restore path `savepoints/<name>`.
pub fn create_savepoint(
    config: &CheckpointConfig,
    job: &str,
    from: Option<&str>,
    name: &str,
) -> Result<String> {
    let (store, paths) = open_store(config, job)?;
    let id = match from {
        Some(dir) => caudal_checkpoints::CheckpointPaths::parse_checkpoint_dir(dir.trim_end_matches('/'))
            .ok_or_else(|| Error::config("savepoint --from", format!("expected chk-<n>, got `{dir}`")))?,
        None => completed_checkpoints(store.as_ref(), &paths)
            .map_err(err("checkpoints.storage"))?
            .last()
            .copied()
            .ok_or_else(|| {
                Error::config(
                    "savepoint",
                    format!(
                        "no completed checkpoint of job `{job}` in {}/{}",
                        store.location(),
                        paths.root()
                    ),
                )
            })?,
    };
    copy(store.as_ref(), &paths, id, name, job)?;
    Ok(format!("savepoints/{name}"))
}

fn copy(
    store: &dyn caudal_checkpoints::CheckpointStore,
    paths: &caudal_checkpoints::CheckpointPaths,
    id: CheckpointId,
    name: &str,
    job: &str,
) -> Result<()> {
    caudal_checkpoints::create_savepoint(store, paths, id, name, job).map(|_| ()).map_err(err("savepoint"))
}

/// The savepoints of `job`, by name.
pub fn list_savepoints(config: &CheckpointConfig, job: &str) -> Result<Vec<String>> {
    let (store, paths) = open_store(config, job)?;
    list(store.as_ref(), &paths).map_err(err("checkpoints.storage"))
}

/// Deletes the savepoint `name` of `job`; returns how many objects were removed.
pub fn delete_savepoint(config: &CheckpointConfig, job: &str, name: &str) -> Result<usize> {
    let (store, paths) = open_store(config, job)?;
    let n = delete(store.as_ref(), &paths, name).map_err(err("savepoint"))?;
    if n == 0 {
        return Err(Error::config("savepoint", format!("no savepoint `{name}` of job `{job}`")));
    }
    Ok(n)
}

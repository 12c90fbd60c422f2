//! Checkpoint metadata: the JSON object that makes a checkpoint complete.
//!
//! `chk-<n>/_metadata` is written last, with put-if-absent; a checkpoint without it
//! does not exist for restore. Reading validates the JSON, the job name and that every
//! referenced file is present with its recorded size; errors name the file and the
//! checkpoint.

use std::collections::BTreeMap;
use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::backend::StateHandle;
use crate::ids::{CheckpointId, OperatorId, SubtaskIndex};
use crate::lineage::Lineage;
use crate::store::{CheckpointPaths, CheckpointStore, METADATA_FILE};
use crate::{Error, Result};

/// Version of the metadata format written by this crate.
pub const METADATA_FORMAT_VERSION: u32 = 1;

/// Checkpoint (automatic, retained last-k) or savepoint (user-triggered, kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointKind {
    /// Taken by the coordinator on its interval.
    Checkpoint,
    /// Taken on request and kept until deleted.
    Savepoint,
}

/// Opaque bytes of an operator (a source's position, a sink's pending transactions),
/// stored as hex in the JSON.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Blob(pub Vec<u8>);

impl fmt::Debug for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Blob({} bytes)", self.0.len())
    }
}

impl Serialize for Blob {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut hex = String::with_capacity(self.0.len() * 2);
        for b in &self.0 {
            hex.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
            hex.push(char::from_digit(u32::from(b & 0xf), 16).unwrap_or('0'));
        }
        s.serialize_str(&hex)
    }
}

impl<'de> Deserialize<'de> for Blob {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let hex = String::deserialize(d)?;
        if hex.len() % 2 != 0 {
            return Err(serde::de::Error::custom("odd number of hex digits"));
        }
        (0..hex.len())
            .step_by(2)
            .map(|i| {
                u8::from_str_radix(hex.get(i..i + 2).unwrap_or("x"), 16)
                    .map_err(|_| serde::de::Error::custom("invalid hex digit"))
            })
            .collect::<std::result::Result<Vec<u8>, _>>()
            .map(Blob)
    }
}

/// The state of one subtask in a checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubtaskSnapshot {
    /// Keyed state, for stateful keyed operators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyed_state: Option<StateHandle>,
    /// Opaque operator state: a source's position (offsets, sequence numbers), a sink's
    /// pending transaction handles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_state: Option<Blob>,
}

/// The state of one operator in a checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorSnapshot {
    /// Parallelism at checkpoint time.
    pub parallelism: u32,
    /// Per subtask.
    pub subtasks: BTreeMap<SubtaskIndex, SubtaskSnapshot>,
}

impl OperatorSnapshot {
    /// The keyed-state handles of all subtasks.
    pub fn keyed_handles(&self) -> Vec<StateHandle> {
        self.subtasks.values().filter_map(|s| s.keyed_state.clone()).collect()
    }
}

/// Everything needed to restore a job from a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointMetadata {
    /// [`METADATA_FORMAT_VERSION`] at write time.
    pub format_version: u32,
    /// The job this checkpoint belongs to.
    pub job_name: String,
    /// The checkpoint number.
    pub checkpoint_id: CheckpointId,
    /// Checkpoint or savepoint.
    pub kind: CheckpointKind,
    /// When the coordinator triggered it (ms since the Unix epoch).
    pub trigger_time_ms: u64,
    /// When the last ack arrived (ms since the Unix epoch).
    pub complete_time_ms: u64,
    /// Number of key groups of the job.
    pub max_parallelism: u16,
    /// Per operator.
    pub operators: BTreeMap<OperatorId, OperatorSnapshot>,
    /// The run that took it and the restore points before it (empty when written by a
    /// version before lineages).
    #[serde(default)]
    pub lineage: Lineage,
}

impl CheckpointMetadata {
    /// Pretty JSON.
    pub fn to_json(&self) -> Result<Vec<u8>> {
        serde_json::to_vec_pretty(self)
            .map_err(|e| Error::Codec { state: "checkpoint metadata".into(), reason: e.to_string() })
    }

    /// Parses JSON read from `file` of checkpoint `checkpoint` (both for errors).
    pub fn from_json(data: &[u8], checkpoint: &str, file: &str) -> Result<Self> {
        let bad = |reason: String| Error::BadMetadata {
            checkpoint: checkpoint.to_string(),
            file: file.to_string(),
            reason,
        };
        let meta: CheckpointMetadata = serde_json::from_slice(data).map_err(|e| bad(e.to_string()))?;
        if meta.format_version != METADATA_FORMAT_VERSION {
            return Err(bad(format!(
                "format version {} is not supported (expected {METADATA_FORMAT_VERSION})",
                meta.format_version
            )));
        }
        Ok(meta)
    }

    /// Every state handle with its operator and subtask.
    pub fn handles(&self) -> impl Iterator<Item = (&OperatorId, SubtaskIndex, &StateHandle)> {
        self.operators.iter().flat_map(|(op, o)| {
            o.subtasks.iter().filter_map(move |(i, s)| s.keyed_state.as_ref().map(|h| (op, *i, h)))
        })
    }

    /// Object names of every file the checkpoint references.
    pub fn referenced_objects(&self) -> Vec<String> {
        self.handles().flat_map(|(_, _, h)| h.files().into_iter().map(|f| f.object.clone())).collect()
    }

    /// Total bytes of the referenced files.
    pub fn state_size(&self) -> u64 {
        self.handles().map(|(_, _, h)| h.state_size()).sum()
    }
}

fn label(dir: &str) -> String {
    dir.trim_end_matches('/').to_string()
}

/// Writes `chk-<n>/_metadata` with put-if-absent: from now on checkpoint n is
/// complete. Returns the object name.
pub fn write_metadata(
    store: &dyn CheckpointStore,
    paths: &CheckpointPaths,
    meta: &CheckpointMetadata,
) -> Result<String> {
    let path = paths.metadata(meta.checkpoint_id);
    match store.put_if_absent(&path, Bytes::from(meta.to_json()?)) {
        Ok(()) => Ok(path),
        Err(Error::AlreadyExists { .. }) => Err(Error::Protocol {
            checkpoint: label(&paths.checkpoint_dir(meta.checkpoint_id)),
            reason: format!("metadata `{path}` already exists: checkpoint ids must not be reused"),
        }),
        Err(e) => Err(e),
    }
}

/// Reads and validates the metadata in directory `dir` (`chk-7`, `savepoints/name`,
/// with the paths' root) for job `job_name`, and checks that every referenced file
/// exists with its recorded size.
pub fn read_metadata_in(
    store: &dyn CheckpointStore,
    dir: &str,
    job_name: &str,
) -> Result<CheckpointMetadata> {
    let checkpoint = label(dir);
    let file = format!("{}/{METADATA_FILE}", dir.trim_end_matches('/'));
    let data = match store.get(&file) {
        Ok(d) => d,
        Err(Error::NotFound { .. }) => return Err(Error::MissingFile { checkpoint, file }),
        Err(e) => return Err(e),
    };
    let meta = CheckpointMetadata::from_json(&data, &checkpoint, &file)?;
    if meta.job_name != job_name {
        return Err(Error::WrongJob {
            checkpoint,
            file,
            expected: job_name.to_string(),
            found: meta.job_name,
        });
    }
    verify_files(store, &meta, &checkpoint)?;
    Ok(meta)
}

/// Reads checkpoint `id` (see [`read_metadata_in`]).
pub fn read_metadata(
    store: &dyn CheckpointStore,
    paths: &CheckpointPaths,
    id: CheckpointId,
    job_name: &str,
) -> Result<CheckpointMetadata> {
    read_metadata_in(store, &paths.checkpoint_dir(id), job_name)
}

/// Checks that every file of `meta` exists with its recorded size.
pub fn verify_files(store: &dyn CheckpointStore, meta: &CheckpointMetadata, checkpoint: &str) -> Result<()> {
    for (_, _, handle) in meta.handles() {
        for f in handle.files() {
            match store.head(&f.object)? {
                None => {
                    return Err(Error::MissingFile {
                        checkpoint: checkpoint.to_string(),
                        file: f.object.clone(),
                    })
                }
                Some(size) if size != f.size => {
                    return Err(Error::CorruptFile {
                        checkpoint: checkpoint.to_string(),
                        file: f.object.clone(),
                        reason: format!("{size} bytes, expected {} (truncated or overwritten)", f.size),
                    })
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

/// Ids of the checkpoints whose metadata exists, ascending.
pub fn completed_checkpoints(
    store: &dyn CheckpointStore,
    paths: &CheckpointPaths,
) -> Result<Vec<CheckpointId>> {
    let mut ids = Vec::new();
    for dir in store.list_dirs(paths.root())? {
        if let Some(id) = CheckpointPaths::parse_checkpoint_dir(&dir) {
            if store.head(&paths.metadata(id))?.is_some() {
                ids.push(id);
            }
        }
    }
    ids.sort();
    Ok(ids)
}

/// Ids of every `chk-<n>` directory, complete or not, ascending.
pub fn checkpoint_dirs(store: &dyn CheckpointStore, paths: &CheckpointPaths) -> Result<Vec<CheckpointId>> {
    let mut ids: Vec<CheckpointId> = store
        .list_dirs(paths.root())?
        .iter()
        .filter_map(|d| CheckpointPaths::parse_checkpoint_dir(d))
        .collect();
    ids.sort();
    Ok(ids)
}

/// The latest completed checkpoint of `job_name`, validated; `None` if there is none.
/// A corrupt latest checkpoint is an error (see [`latest_completed_with_fallback`]).
pub fn latest_completed(
    store: &dyn CheckpointStore,
    paths: &CheckpointPaths,
    job_name: &str,
) -> Result<Option<CheckpointMetadata>> {
    match completed_checkpoints(store, paths)?.last() {
        None => Ok(None),
        Some(id) => read_metadata(store, paths, *id, job_name).map(Some),
    }
}

/// A checkpoint skipped by [`latest_completed_with_fallback`] and why.
#[derive(Debug)]
pub struct SkippedCheckpoint {
    /// The skipped checkpoint.
    pub checkpoint_id: CheckpointId,
    /// What was wrong with it.
    pub error: Error,
}

/// The result of [`latest_completed_with_fallback`].
#[derive(Debug)]
pub struct FallbackRestore {
    /// The newest valid checkpoint.
    pub metadata: CheckpointMetadata,
    /// Newer checkpoints that were skipped, newest first: report them to the user.
    pub skipped: Vec<SkippedCheckpoint>,
}

/// Like [`latest_completed`], but skips corrupt checkpoints (newest first) and says
/// which. `Ok(None)` only when no checkpoint exists; when every checkpoint is corrupt
/// it returns the newest one's error, never a silent start from scratch.
pub fn latest_completed_with_fallback(
    store: &dyn CheckpointStore,
    paths: &CheckpointPaths,
    job_name: &str,
) -> Result<Option<FallbackRestore>> {
    let ids = completed_checkpoints(store, paths)?;
    let mut skipped = Vec::new();
    for id in ids.iter().rev() {
        match read_metadata(store, paths, *id, job_name) {
            Ok(metadata) => return Ok(Some(FallbackRestore { metadata, skipped })),
            Err(e) if e.class() == crate::ErrorClass::User => {
                skipped.push(SkippedCheckpoint { checkpoint_id: *id, error: e })
            }
            Err(e) => return Err(e),
        }
    }
    match skipped.into_iter().next() {
        None => Ok(None),
        Some(newest) => Err(newest.error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_hex_round_trip() {
        let b = Blob(vec![0, 1, 0xab, 0xff]);
        let j = serde_json::to_string(&b).unwrap();
        assert_eq!(j, "\"0001abff\"");
        assert_eq!(serde_json::from_str::<Blob>(&j).unwrap(), b);
        assert!(serde_json::from_str::<Blob>("\"0g\"").is_err());
    }
}

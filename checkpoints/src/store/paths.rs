//! Every object name of checkpoint storage, in one place.
//!
//! ```text
//! chk-<n>/_metadata                          written last: n is complete once it exists
//! chk-<n>/<operator>/<subtask>/<file>        files private to checkpoint n
//! shared/<backend-instance>/<n>-<sst>        immutable SST files, shared by checkpoints
//! savepoints/<name>/_metadata                a self-contained savepoint ...
//! savepoints/<name>/<original object name>   ... with copies of all its files
//! _runs/<seq>-<run>                          claims: the newest run owns the storage
//! ```

use crate::ids::{CheckpointId, OperatorId, SubtaskIndex};
use crate::{Error, Result};

/// The name of the metadata object inside a checkpoint or savepoint directory.
pub const METADATA_FILE: &str = "_metadata";

/// Builds and parses object names, optionally under a root prefix (a job's folder).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckpointPaths {
    root: String,
}

impl CheckpointPaths {
    /// Names at the root of the store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Names under `prefix/` (for example one folder per job).
    pub fn under(prefix: &str) -> Self {
        CheckpointPaths { root: super::dir_prefix(prefix) }
    }

    /// The root prefix (`""` or ending in `/`).
    pub fn root(&self) -> &str {
        &self.root
    }

    /// `chk-<n>`
    pub fn checkpoint_dir(&self, id: CheckpointId) -> String {
        format!("{}chk-{id}", self.root)
    }

    /// `chk-<n>/_metadata`
    pub fn metadata(&self, id: CheckpointId) -> String {
        format!("{}chk-{id}/{METADATA_FILE}", self.root)
    }

    /// The checkpoint id of a directory name `chk-<n>` (without root).
    pub fn parse_checkpoint_dir(name: &str) -> Option<CheckpointId> {
        let n = name.strip_prefix("chk-")?;
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        n.parse().ok().map(CheckpointId)
    }

    /// `chk-<n>/<operator>/<subtask>/<file>`
    pub fn state_file(
        &self,
        id: CheckpointId,
        operator: &OperatorId,
        subtask: SubtaskIndex,
        file: &str,
    ) -> String {
        format!("{}chk-{id}/{operator}/{subtask}/{file}", self.root)
    }

    /// `shared`
    pub fn shared_dir(&self) -> String {
        format!("{}shared", self.root)
    }

    /// `shared/<instance>/<n>-<sst>`: `n` is the checkpoint that first uploaded it.
    pub fn shared_file(&self, instance: &str, first_checkpoint: CheckpointId, sst: &str) -> String {
        format!("{}shared/{instance}/{first_checkpoint}-{sst}", self.root)
    }

    /// Parses a shared file name (with root) back into its parts.
    pub fn parse_shared_file(&self, path: &str) -> Option<SharedFileName> {
        let rest = path.strip_prefix(&self.root)?.strip_prefix("shared/")?;
        let (instance, file) = rest.split_once('/')?;
        let (n, sst) = file.split_once('-')?;
        Some(SharedFileName {
            instance: instance.to_string(),
            first_checkpoint: CheckpointId(n.parse().ok()?),
            sst: sst.to_string(),
        })
    }

    /// `_runs`: the runs' claims of the storage ([`crate::runs`]).
    pub fn runs_dir(&self) -> String {
        format!("{}_runs", self.root)
    }

    /// `_runs/<seq>-<run>` (`seq` zero-padded, so names sort in claim order).
    pub fn run_claim(&self, seq: u64, run: &str) -> String {
        format!("{}_runs/{seq:020}-{run}", self.root)
    }

    /// A claim's file name (without directory) back into its parts.
    pub fn parse_run_claim(name: &str) -> Option<crate::runs::RunClaim> {
        let (seq, run) = name.split_once('-')?;
        (seq.len() == 20 && !run.is_empty())
            .then(|| Some(crate::runs::RunClaim { seq: seq.parse().ok()?, run: run.to_string() }))?
    }

    /// `savepoints`
    pub fn savepoints_dir(&self) -> String {
        format!("{}savepoints", self.root)
    }

    /// `savepoints/<name>`; the name must be a path-safe token.
    pub fn savepoint_dir(&self, name: &str) -> Result<String> {
        Self::validate_savepoint_name(name)?;
        Ok(format!("{}savepoints/{name}", self.root))
    }

    /// A savepoint name is 1-128 characters of `[A-Za-z0-9._-]`, not starting with a dot.
    pub fn validate_savepoint_name(name: &str) -> Result<()> {
        let ok = !name.is_empty()
            && name.len() <= 128
            && !name.starts_with('.')
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if ok {
            Ok(())
        } else {
            Err(Error::config(
                "savepoint name",
                format!("`{name}` must be 1-128 characters of [A-Za-z0-9._-]"),
            ))
        }
    }

    /// `savepoints/<name>/_metadata`
    pub fn savepoint_metadata(&self, name: &str) -> Result<String> {
        Ok(format!("{}/{METADATA_FILE}", self.savepoint_dir(name)?))
    }

    /// `savepoints/<name>/<original>` for an object `original` of a checkpoint.
    pub fn savepoint_copy(&self, name: &str, original: &str) -> Result<String> {
        let original = original.strip_prefix(&self.root).unwrap_or(original);
        Ok(format!("{}/{original}", self.savepoint_dir(name)?))
    }
}

/// The parts of a shared file name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedFileName {
    /// The backend instance that wrote the SST.
    pub instance: String,
    /// The checkpoint that uploaded it first.
    pub first_checkpoint: CheckpointId,
    /// RocksDB's file name (`000012.sst`).
    pub sst: String,
}

/// Where one subtask's snapshot of one checkpoint goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateLocation {
    /// Object names.
    pub paths: CheckpointPaths,
    /// The checkpoint being taken.
    pub checkpoint: CheckpointId,
    /// The stateful operator.
    pub operator: OperatorId,
    /// Its subtask.
    pub subtask: SubtaskIndex,
    /// The latest checkpoint the coordinator had completed when it triggered this one
    /// (`None` before the first). Retention keeps its files until a later checkpoint
    /// completes, which cannot happen while this one is in flight, so an incremental
    /// snapshot reuses files of this checkpoint only: a backend that learned of no
    /// completion since (late notifications) would otherwise reuse files of an older
    /// checkpoint that retention has already deleted.
    pub latest_completed: Option<CheckpointId>,
}

impl StateLocation {
    /// A file private to this checkpoint, operator and subtask.
    pub fn private_file(&self, file: &str) -> String {
        self.paths.state_file(self.checkpoint, &self.operator, self.subtask, file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let p = CheckpointPaths::under("job1/");
        let id = CheckpointId(12);
        assert_eq!(p.metadata(id), "job1/chk-12/_metadata");
        let op = OperatorId::new("win").unwrap();
        assert_eq!(p.state_file(id, &op, SubtaskIndex(2), "x"), "job1/chk-12/win/2/x");
        let s = p.shared_file("abc", id, "000007.sst");
        assert_eq!(s, "job1/shared/abc/12-000007.sst");
        let parsed = p.parse_shared_file(&s).unwrap();
        assert_eq!(parsed.first_checkpoint, id);
        assert_eq!(parsed.sst, "000007.sst");
        assert_eq!(CheckpointPaths::parse_checkpoint_dir("chk-12"), Some(id));
        assert_eq!(CheckpointPaths::parse_checkpoint_dir("chk-1x"), None);
        assert_eq!(p.savepoint_copy("sp", &s).unwrap(), "job1/savepoints/sp/shared/abc/12-000007.sst");
        assert!(p.savepoint_dir("../x").is_err());
        let claim = p.run_claim(7, "a1-b");
        assert_eq!(claim, "job1/_runs/00000000000000000007-a1-b");
        let parsed = CheckpointPaths::parse_run_claim(claim.rsplit('/').next().unwrap()).unwrap();
        assert_eq!((parsed.seq, parsed.run.as_str()), (7, "a1-b"));
    }
}

//! Identifier newtypes shared by the checkpoint protocol, the metadata and the engine.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The number of a checkpoint; increases by one per triggered checkpoint of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CheckpointId(pub u64);

impl CheckpointId {
    /// The next checkpoint id.
    pub fn next(self) -> CheckpointId {
        CheckpointId(self.0 + 1)
    }

    /// `chk-<n>`, the name used in errors and object names.
    pub fn label(self) -> String {
        format!("chk-{}", self.0)
    }
}

impl fmt::Display for CheckpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The stable name of an operator in the job graph (`"window-avg"`); used in object
/// names and as the RocksDB column family, so it must be a path-safe token.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OperatorId(String);

impl OperatorId {
    /// Creates an operator id; allowed characters are ASCII letters, digits, `-`, `_`
    /// and `.` (not leading), at most 128 of them.
    pub fn new(name: impl Into<String>) -> crate::Result<Self> {
        let name = name.into();
        let ok = !name.is_empty()
            && name.len() <= 128
            && !name.starts_with('.')
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if ok {
            Ok(OperatorId(name))
        } else {
            Err(crate::Error::config(
                "operator id",
                format!("`{name}` must be 1-128 characters of [A-Za-z0-9._-], not starting with `.`"),
            ))
        }
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for OperatorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The index of a parallel subtask of an operator, `0..parallelism`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SubtaskIndex(pub u32);

impl fmt::Display for SubtaskIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

//! The engine's error type.

use std::fmt;

/// Where an error happened: the task, the operator and the subtask.
#[derive(Debug, Clone, Default)]
pub struct TaskLocation {
    /// The task (chain of operators) name.
    pub task: String,
    /// The operator inside the chain, when known.
    pub operator: String,
    /// The subtask index.
    pub subtask: u32,
}

impl fmt::Display for TaskLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task `{}` subtask {}", self.task, self.subtask)?;
        if !self.operator.is_empty() {
            write!(f, ", operator `{}`", self.operator)?;
        }
        Ok(())
    }
}

/// Errors of the engine. Classified so the job manager can choose between restart and fail.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The job was built or configured wrongly: fix the job or its flags.
    #[error("invalid configuration `{setting}`: {message}")]
    Config {
        /// The setting (flag or key) at fault.
        setting: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The job graph cannot run as built.
    #[error("invalid job graph: {0}")]
    Graph(String),
    /// A user function or operator failed; restartable.
    #[error("{location}: {message}")]
    Task {
        /// Where it failed.
        location: TaskLocation,
        /// The cause.
        message: String,
    },
    /// A user function panicked.
    #[error("{location}: panicked: {message}")]
    Panic {
        /// Where it panicked.
        location: TaskLocation,
        /// The panic message.
        message: String,
    },
    /// An external system failed (file system, network, storage); usually retryable.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Any other operator error, with its message.
    #[error("{0}")]
    Operator(String),
    /// Cluster mode: the job manager, a task manager or an executor refused or failed
    /// (bad binary, too few slots, unreachable job manager, lost connection).
    #[error("{0}")]
    Cluster(String),
    /// Checkpoint storage or keyed state failed (reading a checkpoint to restore, writing
    /// one): retryable when the cause is (storage briefly unreachable), not when the
    /// checkpoint itself is bad (missing or corrupt file, another job's metadata).
    #[error("{context}: {source}")]
    CheckpointStorage {
        /// What was being done.
        context: String,
        /// The classified cause (boxed: it is large, and rare).
        #[source]
        source: Box<caudal_checkpoints::Error>,
    },
    /// Checkpoints failed more often in a row than the job tolerates, or the final
    /// checkpoint of a bounded job or a stop did not complete: what the sinks wrote since
    /// the last completed checkpoint is not committed. A restore from that checkpoint
    /// replays it (retryable).
    #[error("{0}")]
    CheckpointsFailed(String),
    /// The job was cancelled.
    #[error("job cancelled")]
    Cancelled,
}

impl Error {
    /// An I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { context: context.into(), source }
    }

    /// A configuration error naming the setting.
    pub fn config(setting: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Config { setting: setting.into(), message: message.into() }
    }

    /// True when a restart may help (external failures, task failures).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::CheckpointStorage { source, .. } => source.is_retryable(),
            _ => !matches!(self, Error::Config { .. } | Error::Graph(_) | Error::Cancelled),
        }
    }
}

/// The engine's result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// The class of a checkpoint-storage error survives the crate seam: the job manager
    /// restarts after an outage, not after a corrupt checkpoint.
    #[test]
    fn checkpoint_errors_keep_their_class() {
        let outage = caudal_checkpoints::Error::Io {
            context: "reading",
            path: "/ckpt/chk-3/_metadata".into(),
            source: std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"),
        };
        let corrupt = caudal_checkpoints::Error::BadMetadata {
            checkpoint: "chk-3".into(),
            file: "_metadata".into(),
            reason: "not JSON".into(),
        };
        let wrap = |e| Error::CheckpointStorage { context: "restore".into(), source: Box::new(e) };
        assert!(wrap(outage).is_retryable());
        let e = wrap(corrupt);
        assert!(!e.is_retryable());
        assert!(e.to_string().starts_with("restore: checkpoint chk-3"), "{e}");
    }
}

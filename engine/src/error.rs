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
    /// A user function or operator failed, named by where: restartable when its cause is
    /// (a refused password or a corrupt checkpoint stays final inside a task).
    #[error("{location}: {source}")]
    Task {
        /// Where it failed.
        location: TaskLocation,
        /// The cause, with its class.
        source: Box<Error>,
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
    /// A user function or operator failed for another reason; restartable.
    #[error("{0}")]
    Operator(String),
    /// A system outside the engine (Kafka, PostgreSQL, Redis, object storage, the schema
    /// registry, a lookup service) failed or refused. Retryable when the system may
    /// recover (unreachable, timed out, a transaction fenced), not when it refused the
    /// request itself (a constraint, a rejected schema).
    #[error("{message}")]
    External {
        /// The system: `kafka`, `postgresql`, `redis`, `object storage`, `schema registry`, …
        system: &'static str,
        /// What failed, with the system's answer.
        message: String,
        /// Whether a restart may help.
        retryable: bool,
    },
    /// State the engine wrote itself (a checkpointed position, a sink's pre-commit state,
    /// an operator's keyed or operator state) does not read back: a restart would restore
    /// the same bytes, so it is not retried.
    #[error("{0}")]
    CorruptState(String),
    /// A record cannot be written the way its sink needs it (it does not fit the schema,
    /// it cannot be serialized): replaying it would fail the same way, so it is not
    /// retried; the checkpoint before it keeps the input.
    #[error("{0}")]
    BadRecord(String),
    /// Output of a completed checkpoint can no longer be committed (a transaction that
    /// expired, a pre-committed file that vanished): those records are lost. Not retried;
    /// the message says what to check.
    #[error("{0}")]
    OutputLost(String),
    /// The engine broke one of its own invariants: a bug, reported rather than retried.
    #[error("internal error: {0}")]
    Internal(String),
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
    /// A newer run of the job claimed its checkpoint storage (a restart elsewhere, a
    /// second process on the same directory): this run completes no checkpoint and begins
    /// no transaction any more. Not retried — the newer run goes on.
    #[error("{0}")]
    Superseded(String),
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

    /// An external system's failure that a restart may fix.
    pub fn external(system: &'static str, message: impl Into<String>) -> Self {
        Error::External { system, message: message.into(), retryable: true }
    }

    /// `cause` raised at `location`, keeping its class.
    pub fn in_task(location: TaskLocation, cause: Error) -> Self {
        Error::Task { location, source: Box::new(cause) }
    }

    /// An external system's refusal that a restart would meet again.
    pub fn external_refused(system: &'static str, message: impl Into<String>) -> Self {
        Error::External { system, message: message.into(), retryable: false }
    }

    /// True when a restart may help (external failures, task failures).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::CheckpointStorage { source, .. } => source.is_retryable(),
            Error::External { retryable, .. } => *retryable,
            Error::Task { source, .. } => source.is_retryable(),
            Error::Config { .. }
            | Error::Graph(_)
            | Error::Cancelled
            | Error::CorruptState(_)
            | Error::BadRecord(_)
            | Error::OutputLost(_)
            | Error::Superseded(_)
            | Error::Internal(_) => false,
            Error::Panic { .. }
            | Error::Io { .. }
            | Error::Operator(_)
            | Error::Cluster(_)
            | Error::CheckpointsFailed(_) => true,
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

    /// Each class answers whether a restart may help, and says only its message.
    #[test]
    fn each_class_says_whether_a_restart_helps() {
        let cases = [
            (Error::external("kafka", "broker down"), true),
            (Error::external_refused("postgresql", "password authentication failed"), false),
            (Error::CorruptState("generator: corrupt checkpointed position".into()), false),
            (Error::BadRecord("a record does not fit its Avro schema".into()), false),
            (Error::OutputLost("the transaction of checkpoint 3 can no longer be committed".into()), false),
            (Error::Internal("exchange got a batch of another type".into()), false),
            (Error::config("--slots", "must be at least 1"), false),
            (Error::Operator("injected failure".into()), true),
        ];
        for (e, retryable) in cases {
            assert_eq!(e.is_retryable(), retryable, "{e:?}");
        }
        assert_eq!(Error::external("kafka", "broker down").to_string(), "broker down");
    }

    /// An error raised inside a task keeps its class: a refused password or lost output is
    /// final there too (a cluster restarted such jobs up to the cap), an outage is not.
    #[test]
    fn a_task_error_keeps_its_cause_class() {
        let at = || TaskLocation { task: "sink".into(), operator: "sink".into(), subtask: 1 };
        let refused =
            Error::in_task(at(), Error::external_refused("postgresql", "role \"nobody\" does not exist"));
        assert!(!refused.is_retryable(), "{refused:?}");
        assert_eq!(
            refused.to_string(),
            "task `sink` subtask 1, operator `sink`: role \"nobody\" does not exist"
        );
        assert!(!Error::in_task(at(), Error::OutputLost("gone".into())).is_retryable());
        assert!(!Error::in_task(at(), Error::CorruptState("bad".into())).is_retryable());
        assert!(!Error::in_task(at(), Error::config("--postgres", "bad url")).is_retryable());
        assert!(Error::in_task(at(), Error::external("kafka", "broker down")).is_retryable());
        assert!(Error::in_task(at(), Error::Operator("a user function failed".into())).is_retryable());
    }
}

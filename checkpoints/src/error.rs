//! The crate's one error type, classified so the job manager can choose between
//! restarting (retryable, external) and failing the job (user, internal).

use std::path::PathBuf;

/// Result alias used across `caudal-checkpoints`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Who is at fault, which decides what the job manager does with the error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Bad configuration or a bad request (wrong job name, corrupt checkpoint chosen
    /// by the user): fail with a message, restarting will not help.
    User,
    /// Storage or the disk failed: usually worth a restart.
    External,
    /// A bug or a broken invariant inside Caudal.
    Internal,
}

/// Errors of state backends, checkpoint storage and the checkpoint protocol.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration value is invalid; `field` names the setting.
    #[error("invalid configuration `{field}`: {reason}")]
    Config { field: String, reason: String },

    /// An object that was expected in checkpoint storage does not exist.
    #[error("object `{path}` not found in checkpoint storage")]
    NotFound { path: String },

    /// `put_if_absent` found an object at the path.
    #[error("object `{path}` already exists in checkpoint storage")]
    AlreadyExists { path: String },

    /// The object store failed (network, permissions, server error).
    #[error("checkpoint storage {op} `{path}` failed: {source}")]
    Storage {
        op: &'static str,
        path: String,
        #[source]
        source: object_store::Error,
    },

    /// A local file operation failed.
    #[error("{context} `{}`: {source}", path.display())]
    Io {
        context: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// RocksDB returned an error.
    #[error("RocksDB {context}: {source}")]
    RocksDb {
        context: String,
        #[source]
        source: rocksdb::Error,
    },

    /// A value or key could not be encoded or decoded.
    #[error("state codec error in `{state}`: {reason}")]
    Codec { state: String, reason: String },

    /// A key of a key group outside the backend's range was used.
    #[error("key group {key_group} is outside this backend's range {range}")]
    KeyGroupOutOfRange { key_group: u16, range: String },

    /// A file referenced by a checkpoint is missing.
    #[error("checkpoint {checkpoint}: file `{file}` is missing")]
    MissingFile { checkpoint: String, file: String },

    /// A file referenced by a checkpoint is truncated or corrupt.
    #[error("checkpoint {checkpoint}: file `{file}` is corrupt: {reason}")]
    CorruptFile { checkpoint: String, file: String, reason: String },

    /// The checkpoint's metadata cannot be read.
    #[error("checkpoint {checkpoint}: metadata `{file}` is invalid: {reason}")]
    BadMetadata { checkpoint: String, file: String, reason: String },

    /// The checkpoint belongs to another job.
    #[error("checkpoint {checkpoint}: metadata `{file}` belongs to job `{found}`, not `{expected}`")]
    WrongJob { checkpoint: String, file: String, expected: String, found: String },

    /// The checkpoint protocol received an event that does not fit its state.
    #[error("checkpoint {checkpoint}: {reason}")]
    Protocol { checkpoint: String, reason: String },

    /// A state handle cannot be restored by this backend.
    #[error("cannot restore: {reason}")]
    Restore { reason: String },
}

impl Error {
    /// The class of this error.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Config { .. }
            | Error::MissingFile { .. }
            | Error::CorruptFile { .. }
            | Error::BadMetadata { .. }
            | Error::WrongJob { .. }
            | Error::Restore { .. } => ErrorClass::User,
            Error::NotFound { .. } | Error::Storage { .. } | Error::Io { .. } => ErrorClass::External,
            Error::RocksDb { .. }
            | Error::Codec { .. }
            | Error::KeyGroupOutOfRange { .. }
            | Error::AlreadyExists { .. }
            | Error::Protocol { .. } => ErrorClass::Internal,
        }
    }

    /// Whether retrying the same operation (or restarting the job) may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Storage { source, .. } => !matches!(
                source,
                object_store::Error::NotImplemented { .. }
                    | object_store::Error::PermissionDenied { .. }
                    | object_store::Error::Unauthenticated { .. }
            ),
            Error::Io { .. } | Error::NotFound { .. } => true,
            _ => false,
        }
    }

    pub(crate) fn io(
        context: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { context, path, source }
    }

    pub(crate) fn rocks(context: impl Into<String>) -> impl FnOnce(rocksdb::Error) -> Error {
        let context = context.into();
        move |source| Error::RocksDb { context, source }
    }

    pub(crate) fn config(field: &str, reason: impl Into<String>) -> Error {
        Error::Config { field: field.to_string(), reason: reason.into() }
    }
}

//! The crate's one error type.

use std::fmt;

/// `Result` with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in `caudal-schemas`.
///
/// [`Error::is_bad_data`] tells a source which errors belong to one record (count it,
/// dead-letter it, keep going); [`Error::is_retryable`] tells the job manager which
/// errors are worth a restart.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The first byte of a framed message is not the Confluent magic byte 0.
    #[error("bad magic byte {found:#04x}: expected 0x00 (Confluent-framed Avro)")]
    BadMagic {
        /// The byte found.
        found: u8,
    },

    /// A framed message is shorter than the 5-byte header.
    #[error("truncated frame header: {len} bytes, need at least 5 (magic byte + schema id)")]
    TruncatedHeader {
        /// Length of the message.
        len: usize,
    },

    /// The frame names a schema id the registry does not know.
    #[error("unknown schema id {id}")]
    UnknownSchemaId {
        /// The schema id of the frame.
        id: u32,
    },

    /// Avro bytes that do not decode with the writer schema.
    #[error("invalid Avro data: {0}")]
    Decode(#[from] DecodeError),

    /// Bytes written with another schema could not be resolved into the reader schema,
    /// or a value could not be encoded by the generic (apache-avro) path.
    #[error("schema resolution failed (writer schema id {writer_id:?}): {reason}")]
    Resolution {
        /// The writer schema id when known.
        writer_id: Option<u32>,
        /// apache-avro's explanation.
        reason: String,
    },

    /// Schema text that does not parse as Avro.
    #[error("invalid Avro schema: {reason}")]
    InvalidSchema {
        /// apache-avro's explanation.
        reason: String,
    },

    /// The registry answered with an error status.
    #[error("{0}")]
    Registry(RegistryError),

    /// The registry could not be reached or answered something that is not its API.
    #[error("schema registry {url} unavailable: {reason}")]
    RegistryUnavailable {
        /// The request URL.
        url: String,
        /// Transport or protocol error.
        reason: String,
    },

    /// The registry cannot be reached with the settings given, and trying again will not
    /// change that: a certificate the client does not trust (or the registry refused the
    /// client's), a CA or key file that cannot be read, a URL that is not one.
    #[error("schema registry {url}: {reason}")]
    RegistryRefused {
        /// The registry's base URL or the request's.
        url: String,
        /// What was refused, and what to change.
        reason: String,
    },
}

impl Error {
    /// True for errors that belong to one input record (bad magic byte, truncated header,
    /// unknown schema id, undecodable or unresolvable Avro): count, dead-letter, continue.
    pub fn is_bad_data(&self) -> bool {
        matches!(
            self,
            Error::BadMagic { .. }
                | Error::TruncatedHeader { .. }
                | Error::UnknownSchemaId { .. }
                | Error::Decode(_)
                | Error::Resolution { .. }
        )
    }

    /// True for errors that may go away on retry: the registry is unreachable or
    /// answered 5xx / 408 / 429. A refused password (401, 403) or certificate is not.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::RegistryUnavailable { .. } => true,
            Error::Registry(e) => e.status >= 500 || e.status == 408 || e.status == 429,
            _ => false,
        }
    }

    pub(crate) fn invalid_schema(e: impl fmt::Display) -> Self {
        Error::InvalidSchema { reason: e.to_string() }
    }
}

/// An error answer of the schema registry: HTTP status plus the Confluent
/// `error_code` and `message` when the body carried them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryError {
    /// Method and URL of the request.
    pub request: String,
    /// HTTP status.
    pub status: u16,
    /// Confluent error code (e.g. 40401 subject not found, 40403 schema not found,
    /// 409 incompatible schema, 42201 invalid schema).
    pub error_code: Option<i64>,
    /// The registry's message, or the raw body when it was not Confluent JSON.
    pub message: String,
}

impl RegistryError {
    /// The "subject already exists" conflict a registry answers when two first
    /// registrations of one subject race (not an incompatibility, which names no
    /// existing artifact): asking again succeeds.
    pub fn is_subject_create_race(&self) -> bool {
        self.status == 409 && self.message.contains("already exists")
    }
}

impl fmt::Display for RegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "schema registry: {} -> HTTP {}", self.request, self.status)?;
        if let Some(code) = self.error_code {
            write!(f, " (error_code {code})")?;
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

/// Why Avro bytes did not decode on the fast path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input ended inside a value.
    #[error("truncated: input ended while reading {what}")]
    Truncated {
        /// What was being read.
        what: &'static str,
    },
    /// A variable-length integer longer than 10 bytes or above 64 bits.
    #[error("varint overflows 64 bits")]
    VarintOverflow,
    /// A negative string or bytes length.
    #[error("negative length {0}")]
    NegativeLength(i64),
    /// A string that is not UTF-8.
    #[error("string is not valid UTF-8")]
    InvalidUtf8,
    /// An enum symbol or union branch index out of range.
    #[error("{what} index {index} out of range")]
    BadIndex {
        /// `"enum"` or `"union"`.
        what: &'static str,
        /// The index read.
        index: i64,
    },
    /// Bytes left over after the record.
    #[error("{0} trailing bytes after the record")]
    TrailingBytes(usize),
}

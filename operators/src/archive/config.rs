//! [`ArchiveConfig`]: where the archive sink writes; built into an [`ArchiveSink`] by
//! [`ArchiveConfig::build`].

use super::sink::ArchiveSink;
use crate::retry::RetryPolicy;
use caudal::{Error, Result};
use caudal_checkpoints::{S3Config, StorageUrl};
use serde::{Deserialize, Serialize};

/// Settings of the object-storage archive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchiveConfig {
    /// A directory, `file:///absolute/path` or `s3://bucket/prefix`.
    pub url: String,
    /// Endpoint, region and credentials when `url` is `s3://…` (the checkpoint storage's
    /// settings; `CAUDAL__S3__*` variables).
    #[serde(default)]
    pub s3: S3Config,
    /// A file is cut (uploaded as in-progress, published with its epoch) once it holds
    /// this many bytes; otherwise one file per partition, subtask and epoch.
    #[serde(default = "default_target_file_bytes")]
    pub target_file_bytes: usize,
    /// Retries while the storage is unreachable.
    #[serde(default)]
    pub retry: RetryPolicy,
}

fn default_target_file_bytes() -> usize {
    64 << 20
}

impl ArchiveConfig {
    /// An archive at `url` (S3 settings at their defaults).
    pub fn new(url: impl Into<String>) -> Self {
        ArchiveConfig {
            url: url.into(),
            s3: S3Config::default(),
            target_file_bytes: default_target_file_bytes(),
            retry: RetryPolicy::default(),
        }
    }

    /// Checks every setting, naming the one at fault.
    pub fn validate(&self) -> Result<()> {
        StorageUrl::parse(&self.url).map_err(|e| {
            Error::config("archive.url", e.to_string().replace("checkpoint storage url", "archive url"))
        })?;
        if self.target_file_bytes < 1024 {
            return Err(Error::config("archive.target_file_bytes", "must be at least 1024"));
        }
        self.retry.validate("archive")
    }

    /// Validates and builds the sink for Avro records of type `R`.
    pub fn build<R: caudal_schemas::AvroRecord>(&self) -> Result<ArchiveSink<R>> {
        self.validate()?;
        Ok(ArchiveSink::new(self.clone()))
    }
}

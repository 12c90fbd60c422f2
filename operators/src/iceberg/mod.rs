//! Apache Iceberg tables, written exactly once: records in, Parquet data files and one table
//! snapshot per completed checkpoint out, in a catalog that Trino, Spark, pyiceberg and
//! DuckDB read.
//!
//! **In:** records with an Avro schema ([`caudal_schemas::AvroRecord`]; the table's schema
//! is derived from it). **Out:** a table in the SQL catalog (PostgreSQL) or a REST catalog
//! ([`catalog`]: picked by the URL) whose files live in a local directory or an S3 bucket
//! ([`storage`]).
//!
//! ```text
//! stream ─► IcebergWriter × p ──DataFiles (ahead of each barrier)──► IcebergCommitter × 1
//!             Parquet files in <table>/data/…                         snapshot per checkpoint
//! ```
//!
//! **Invariant:** a record is in the table once: its file is committed with the checkpoint
//! whose barrier closed it, a commit already in the table (found by its checkpoint id) is
//! never repeated, and files no completed checkpoint recorded are deleted on restore (see
//! [`committer`]).
//!
//! ```no_run
//! use caudal_operators::iceberg::{IcebergConfig, IcebergSink};
//! use caudal_schemas::ProcessedReading;
//! # let env = caudal::StreamEnv::new();
//! # let readings: caudal::DataStream<ProcessedReading> = env.from_iter("r", Vec::<ProcessedReading>::new());
//! let config = IcebergConfig::new("postgres://caudal@127.0.0.1/caudal", "s3://lake/warehouse", "sensors.readings");
//! IcebergSink::new("readings-lake", config).write(readings);
//! ```

pub mod catalog;
pub mod committer;
mod config;
mod schema;
pub mod storage;
mod table;
pub mod writer;

#[cfg(test)]
mod tests;

pub use catalog::{open as open_catalog, IcebergCatalog, PostgresCatalog};
pub use committer::{committed_checkpoint, IcebergCommitter};
pub use config::{IcebergConfig, Partitioning};
pub use table::summary;
pub use writer::{DataFiles, IcebergWriter};

use caudal::{Data, DataStream, DataStreamSink};

/// The committer's counters (the UI's operator view, `/metrics`).
pub mod metrics {
    /// Snapshots committed.
    pub const COMMITS: &str = "iceberg_commits";
    /// Milliseconds spent committing, all commits together (the catalog round trips, the
    /// manifest and metadata writes).
    pub const COMMIT_MS: &str = "iceberg_commit_ms";
    /// Data files committed.
    pub const FILES: &str = "iceberg_files";
    /// Bytes of the data files committed.
    pub const FILE_BYTES: &str = "iceberg_file_bytes";
}
use caudal_schemas::AvroRecord;

/// An Iceberg table sink: writers at the stream's parallelism, one committer.
#[derive(Debug, Clone)]
pub struct IcebergSink {
    name: String,
    config: IcebergConfig,
}

impl IcebergSink {
    /// The sink `name` (its operators are `<name>-writer` and `<name>-committer`, also
    /// their uids; the name is in every data file's name and snapshot summary).
    pub fn new(name: &str, config: IcebergConfig) -> Self {
        IcebergSink { name: name.to_string(), config }
    }

    /// Writes `stream` into the table.
    pub fn write<R: AvroRecord + Data>(self, stream: DataStream<R>) -> DataStreamSink {
        let (writer, committer) = (format!("{}-writer", self.name), format!("{}-committer", self.name));
        let (config, name) = (self.config.clone(), self.name.clone());
        let files = stream
            .transform(&writer, move |_| {
                config.validate()?;
                Ok(IcebergWriter::<R>::new(config.clone(), name.clone()))
            })
            .uid(&writer);
        let (config, name) = (self.config, self.name);
        files
            .sink(&committer, move |_| {
                config.validate()?;
                Ok(IcebergCommitter::new(config.clone(), name.clone()))
            })
            .parallelism(1)
            .uid(&committer)
    }
}

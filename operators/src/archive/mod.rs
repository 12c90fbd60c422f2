//! The object-storage archive: records as Avro object container files in a local
//! directory or an S3 bucket, partitioned `date=YYYY-MM-DD/hour=HH/` by event time,
//! published exactly once per checkpoint.
//!
//! **In:** records with an Avro schema ([`caudal_schemas::AvroRecord`]). **Out:** files
//! `<root>/date=…/hour=…/part-<subtask>-<checkpoint>-<k>.<run>.avro` that any Avro reader
//! opens. **Invariant:** a file appears under its final name only once its checkpoint is
//! complete, and a restore publishes what the checkpoint recorded and discards the rest
//! (see [`sink`]): each record is archived exactly once.
//!
//! ```no_run
//! use caudal_operators::archive::ArchiveConfig;
//! use caudal_schemas::ProcessedReading;
//! # let env = caudal::StreamEnv::new();
//! # let readings: caudal::DataStream<ProcessedReading> = env.from_iter("r", Vec::<ProcessedReading>::new());
//! let config = ArchiveConfig::new("s3://caudal/archive/readings");
//! readings.sink("archive", move |_| config.build::<ProcessedReading>());
//! ```

mod config;
pub mod partition;
pub mod sink;

#[cfg(test)]
mod tests;

pub use config::ArchiveConfig;
pub use partition::partition;
pub use sink::{ArchiveSink, IN_PROGRESS};

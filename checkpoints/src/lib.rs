//! Caudal checkpoints: state backends and checkpoint storage.
//!
//! In: snapshots from tasks. Out: a completed checkpoint in storage.
//! A checkpoint is complete only once its metadata is durable.

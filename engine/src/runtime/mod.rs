//! The runtime: chains, channels, task loops and the executor.

pub(crate) mod chain;
pub(crate) mod codec;
pub(crate) mod exchange;
pub(crate) mod executor;
pub(crate) mod processing_clock;
pub(crate) mod remote;
pub(crate) mod state_dir;
pub(crate) mod task;
pub(crate) mod upload;

pub(crate) use task::TaskCommand;

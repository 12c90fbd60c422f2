//! The DataStream API: how a job builds its graph.

pub mod async_io;
pub(crate) mod env;
pub(crate) mod functions;
pub mod process;
pub(crate) mod stream;

//! Simple sinks: newline-delimited JSON files, stdout, and a counting/discarding sink.

mod discard;
mod file;
pub(crate) mod shared_dir;
mod stdout;

pub use discard::DiscardSink;
pub use file::JsonFileSink;
pub use stdout::StdoutSink;

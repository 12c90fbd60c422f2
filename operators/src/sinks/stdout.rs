//! Prints each record as a JSON line on stdout, prefixed with the sink's name.

use caudal::{Batch, Data, Error, OperatorContext, Result, Sink};
use serde::Serialize;
use std::io::Write;
use std::marker::PhantomData;

/// Writes records to stdout as `<prefix> <json>` lines.
pub struct StdoutSink<T> {
    prefix: String,
    _t: PhantomData<fn(T)>,
}

impl<T> std::fmt::Debug for StdoutSink<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StdoutSink({})", self.prefix)
    }
}

impl<T> StdoutSink<T> {
    /// A sink printing lines that start with `prefix`.
    pub fn new(prefix: &str) -> Self {
        StdoutSink { prefix: prefix.to_string(), _t: PhantomData }
    }
}

impl<T: Data + Serialize> Sink for StdoutSink<T> {
    type In = T;

    fn write_batch(&mut self, batch: Batch<T>, _ctx: &mut OperatorContext) -> Result<()> {
        let mut buf = Vec::with_capacity(batch.len() * 96);
        for r in batch {
            buf.extend_from_slice(self.prefix.as_bytes());
            buf.push(b' ');
            serde_json::to_writer(&mut buf, &r.value).map_err(|e| Error::BadRecord(format!("JSON: {e}")))?;
            buf.push(b'\n');
        }
        let mut out = std::io::stdout().lock();
        out.write_all(&buf).map_err(|e| Error::io("writing to stdout", e))?;
        out.flush().map_err(|e| Error::io("writing to stdout", e))
    }
}

//! Newline-delimited JSON, one file per subtask: `<dir>/part-<subtask>.jsonl`.

use caudal::{Batch, Data, Error, OperatorContext, Result, Sink};
use serde::Serialize;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::marker::PhantomData;
use std::path::PathBuf;

/// Writes each record as one JSON line. Flushed at every barrier and at the end.
pub struct JsonFileSink<T> {
    dir: PathBuf,
    writer: Option<BufWriter<File>>,
    line: Vec<u8>,
    _t: PhantomData<fn(T)>,
}

impl<T> std::fmt::Debug for JsonFileSink<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JsonFileSink({})", self.dir.display())
    }
}

impl<T> JsonFileSink<T> {
    /// A sink writing under `dir` (created if absent).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        JsonFileSink { dir: dir.into(), writer: None, line: Vec::new(), _t: PhantomData }
    }

    /// The file of `subtask`.
    pub fn part_path(&self, subtask: u32) -> PathBuf {
        self.dir.join(format!("part-{subtask}.jsonl"))
    }
}

impl<T: Data + Serialize> Sink for JsonFileSink<T> {
    type In = T;

    fn on_start(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| Error::io(format!("creating output directory {}", self.dir.display()), e))?;
        let path = self.part_path(ctx.subtask);
        let file = File::create(&path).map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
        self.writer = Some(BufWriter::with_capacity(256 * 1024, file));
        Ok(())
    }

    fn write_batch(&mut self, batch: Batch<T>, _ctx: &mut OperatorContext) -> Result<()> {
        let Some(w) = self.writer.as_mut() else {
            return Err(Error::Operator("file sink written before start".into()));
        };
        for r in batch {
            self.line.clear();
            serde_json::to_writer(&mut self.line, &r.value)
                .map_err(|e| Error::Operator(format!("serializing a record to JSON: {e}")))?;
            self.line.push(b'\n');
            w.write_all(&self.line)
                .map_err(|e| Error::io(format!("writing to {}", self.dir.display()), e))?;
        }
        Ok(())
    }

    fn pre_commit(
        &mut self,
        _checkpoint: caudal::CheckpointId,
        _ctx: &mut OperatorContext,
    ) -> Result<Option<Vec<u8>>> {
        if let Some(w) = self.writer.as_mut() {
            w.flush().map_err(|e| Error::io(format!("flushing {}", self.dir.display()), e))?;
        }
        Ok(None)
    }

    fn on_close(&mut self, _ctx: &mut OperatorContext) -> Result<()> {
        if let Some(mut w) = self.writer.take() {
            w.flush().map_err(|e| Error::io(format!("flushing {}", self.dir.display()), e))?;
        }
        Ok(())
    }
}

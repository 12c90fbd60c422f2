//! A control stream that ends with the input it controls: a bounded run of the job
//! finishes when its readings are read, though the limits file or topic is still watched.
//!
//! The readings' source is wrapped in [`EndsWith`], which counts its subtasks that
//! finished in an [`InputEnd`]; the control source is wrapped in [`UntilInputEnds`], which
//! reads on until every reading subtask has finished and then finishes too. Both share the
//! `InputEnd` through the job's process, so this is for a job whose subtasks all run in one
//! process (`StreamEnv::runs_in_one_process`): a cluster executor would not see the
//! readings' subtasks of other executors finish. There a bounded run reads the control
//! stream to the end it has at start instead (`LimitsFile::to_its_end`, a bounded Kafka
//! source).

use caudal::{Result, Source, SourceContext, SourceOutput, SourcePoll, SourceReader};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// How many subtasks of the controlled input have finished, of how many.
#[derive(Debug, Default)]
pub struct InputEnd {
    finished: AtomicU32,
    of: AtomicU32,
}

impl InputEnd {
    /// A new, shared end.
    pub fn new() -> Arc<Self> {
        Arc::new(InputEnd::default())
    }

    /// Whether every subtask of the input has finished.
    pub fn reached(&self) -> bool {
        let of = self.of.load(Ordering::Acquire);
        of > 0 && self.finished.load(Ordering::Acquire) >= of
    }
}

/// `inner`, telling `end` when all its subtasks finished.
#[derive(Debug)]
pub struct EndsWith<S> {
    inner: S,
    end: Arc<InputEnd>,
}

impl<S> EndsWith<S> {
    /// Wraps the input.
    pub fn new(inner: S, end: Arc<InputEnd>) -> Self {
        EndsWith { inner, end }
    }
}

impl<S: Source> Source for EndsWith<S> {
    type Out = S::Out;

    fn create_reader(
        &self,
        ctx: &SourceContext,
        restored: &[Vec<u8>],
    ) -> Result<Box<dyn SourceReader<S::Out>>> {
        self.end.of.store(ctx.parallelism.max(1), Ordering::Release);
        Ok(Box::new(EndsWithReader {
            inner: self.inner.create_reader(ctx, restored)?,
            end: self.end.clone(),
            counted: false,
        }))
    }
}

struct EndsWithReader<T> {
    inner: Box<dyn SourceReader<T>>,
    end: Arc<InputEnd>,
    counted: bool,
}

impl<T: Send> SourceReader<T> for EndsWithReader<T> {
    fn splits(&self) -> usize {
        self.inner.splits()
    }

    fn poll(&mut self, out: &mut SourceOutput<'_, T>) -> Result<SourcePoll> {
        let poll = self.inner.poll(out)?;
        if poll == SourcePoll::Finished && !self.counted {
            self.counted = true;
            self.end.finished.fetch_add(1, Ordering::AcqRel);
        }
        Ok(poll)
    }

    fn position(&mut self) -> Result<Vec<u8>> {
        self.inner.position()
    }

    fn on_checkpoint_complete(&mut self, checkpoint: caudal::CheckpointId) -> Result<()> {
        self.inner.on_checkpoint_complete(checkpoint)
    }
}

/// `inner`, finishing once `end` is reached.
#[derive(Debug)]
pub struct UntilInputEnds<S> {
    inner: S,
    end: Arc<InputEnd>,
}

impl<S> UntilInputEnds<S> {
    /// Wraps the control source.
    pub fn new(inner: S, end: Arc<InputEnd>) -> Self {
        UntilInputEnds { inner, end }
    }
}

impl<S: Source> Source for UntilInputEnds<S> {
    type Out = S::Out;

    fn create_reader(
        &self,
        ctx: &SourceContext,
        restored: &[Vec<u8>],
    ) -> Result<Box<dyn SourceReader<S::Out>>> {
        Ok(Box::new(UntilReader { inner: self.inner.create_reader(ctx, restored)?, end: self.end.clone() }))
    }
}

struct UntilReader<T> {
    inner: Box<dyn SourceReader<T>>,
    end: Arc<InputEnd>,
}

impl<T: Send> SourceReader<T> for UntilReader<T> {
    fn splits(&self) -> usize {
        self.inner.splits()
    }

    fn poll(&mut self, out: &mut SourceOutput<'_, T>) -> Result<SourcePoll> {
        // Read what is there first: a change written before the input ended is applied.
        let ended = self.end.reached();
        let poll = self.inner.poll(out)?;
        if ended && poll != SourcePoll::Ready {
            for split in 0..self.inner.splits() {
                out.finish_split(split);
            }
            return Ok(SourcePoll::Finished);
        }
        Ok(poll)
    }

    fn position(&mut self) -> Result<Vec<u8>> {
        self.inner.position()
    }

    fn on_checkpoint_complete(&mut self, checkpoint: caudal::CheckpointId) -> Result<()> {
        self.inner.on_checkpoint_complete(checkpoint)
    }
}

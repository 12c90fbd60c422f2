//! `--limits-file`: limit changes as JSON lines in a file watched on disk.
//!
//! The reader tails the file: it emits each complete line appended since the last poll
//! (checked: a [`LimitLine::Rejected`] when it is not a change, counted as `bad_records`),
//! and checkpoints the byte offset of the next line. A file replaced or cut short (an editor
//! saving it) is read again from its start: applying a change twice is the same as once.

use super::LimitChange;
use caudal::process::{Context, Output, OutputTag, ProcessFunction};
use caudal::{Error, Result, Source, SourceContext, SourceOutput, SourcePoll, SourceReader};
use serde::{Deserialize, Serialize};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often the file is looked at when nothing new was in it.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// A line of the limits file: a change, or why it is not one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum LimitLine {
    /// A valid change.
    Change(LimitChange),
    /// A line that is not a change: never applied, dead-lettered.
    Rejected(RejectedLimit),
}

impl LimitLine {
    /// The event time of the line: a change's `from_ts`.
    pub fn ts(&self) -> caudal::Timestamp {
        match self {
            LimitLine::Change(c) => c.from_ts,
            LimitLine::Rejected(_) => caudal::types::MIN_WATERMARK,
        }
    }
}

/// A rejected limits record, as the dead-letter output has it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RejectedLimit {
    /// The record as read.
    pub record: String,
    /// Why it is not a change.
    pub error: String,
    /// Where it was read from (`<file>:<byte offset>`).
    pub origin: String,
}

/// The side output of [`SplitRejected`].
pub const REJECTED_LIMITS: OutputTag<RejectedLimit> = OutputTag::new("rejected-limits");

/// Passes the changes on and sends the rejected lines to [`REJECTED_LIMITS`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SplitRejected;

impl ProcessFunction<LimitLine, LimitChange> for SplitRejected {
    fn process_element(
        &mut self,
        line: LimitLine,
        ctx: &mut Context<'_>,
        out: &mut Output<'_, LimitChange>,
    ) -> Result<()> {
        match line {
            LimitLine::Change(c) => out.collect(c),
            LimitLine::Rejected(r) => ctx.output(&REJECTED_LIMITS, r)?,
        }
        Ok(())
    }
}

/// The limits file source (parallelism 1: one reader of one file).
#[derive(Debug, Clone)]
pub struct LimitsFile {
    path: PathBuf,
    watch: bool,
}

impl LimitsFile {
    /// Watches `path`, which must exist (an empty file is fine).
    pub fn new(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        if !path.is_file() {
            return Err(Error::config(
                "--limits-file",
                format!("{} is not a file (create it, empty or with changes, first)", path.display()),
            ));
        }
        Ok(LimitsFile { path, watch: true })
    }

    /// Reads the file to the end it has when the reader first looks, then finishes (a
    /// bounded run whose readings may end in another process: see `input_end.rs`).
    pub fn to_its_end(mut self) -> Self {
        self.watch = false;
        self
    }
}

/// What the reader checkpoints.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct FilePosition {
    /// The byte offset of the next line.
    offset: u64,
    /// The file's inode when it was read: another one means the file was replaced.
    inode: u64,
}

impl Source for LimitsFile {
    type Out = LimitLine;

    fn create_reader(
        &self,
        ctx: &SourceContext,
        restored: &[Vec<u8>],
    ) -> Result<Box<dyn SourceReader<LimitLine>>> {
        let position = match restored.iter().find(|b| !b.is_empty()) {
            Some(blob) => serde_json::from_slice(blob)
                .map_err(|e| Error::CorruptState(format!("limits file: the checkpointed position: {e}")))?,
            None => FilePosition::default(),
        };
        // One reader reads the file; the others (parallelism > 1) have nothing to read.
        let owns = ctx.subtask == 0;
        Ok(Box::new(LimitsFileReader {
            path: self.path.clone(),
            position,
            owns,
            watch: self.watch,
            end: None,
            bad_records: ctx.metrics.counter("bad_records"),
            buf: Vec::new(),
        }))
    }
}

struct LimitsFileReader {
    path: PathBuf,
    position: FilePosition,
    owns: bool,
    /// Watch for more, or finish at `end`.
    watch: bool,
    /// Without `watch`: the file's length when first read.
    end: Option<u64>,
    bad_records: Arc<AtomicU64>,
    /// Bytes read past the last complete line.
    buf: Vec<u8>,
}

impl LimitsFileReader {
    /// The bytes appended since `position`, re-reading a replaced or shortened file.
    fn read_new(&mut self) -> Result<()> {
        let io = |e| Error::io(format!("reading the limits file {}", self.path.display()), e);
        let mut file = std::fs::File::open(&self.path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if meta.ino() != self.position.inode || meta.len() < self.position.offset {
            if self.position.inode != 0 {
                tracing::info!("limits file {} was replaced: reading it again", self.path.display());
            }
            self.position = FilePosition { offset: 0, inode: meta.ino() };
            self.buf.clear();
        }
        let from = self.position.offset + self.buf.len() as u64;
        if meta.len() > from {
            file.seek(SeekFrom::Start(from)).map_err(io)?;
            file.take(meta.len() - from).read_to_end(&mut self.buf).map_err(io)?;
        }
        Ok(())
    }
}

impl SourceReader<LimitLine> for LimitsFileReader {
    fn splits(&self) -> usize {
        usize::from(self.owns)
    }

    fn poll(&mut self, out: &mut SourceOutput<'_, LimitLine>) -> Result<SourcePoll> {
        if !self.owns {
            return Ok(if self.watch {
                SourcePoll::Pending(Duration::from_secs(1))
            } else {
                SourcePoll::Finished
            });
        }
        if !self.buf.contains(&b'\n') && (self.watch || self.end.is_none()) {
            self.read_new()?;
            self.end.get_or_insert(self.position.offset + self.buf.len() as u64);
        }
        let mut emitted = false;
        while out.capacity_left() > 0 {
            let Some(end) = self.buf.iter().position(|b| *b == b'\n') else { break };
            let line: Vec<u8> = self.buf.drain(..=end).collect();
            let origin = format!("{}:{}", self.path.display(), self.position.offset);
            self.position.offset += line.len() as u64;
            let text = String::from_utf8_lossy(&line).trim().to_string();
            if text.is_empty() || text.starts_with('#') {
                continue;
            }
            let parsed = match LimitChange::parse(&text) {
                Ok(change) => LimitLine::Change(change),
                Err(error) => {
                    self.bad_records.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("limits file: {origin}: not a limit change ({error}): dead-lettered");
                    LimitLine::Rejected(RejectedLimit { record: text, error, origin })
                }
            };
            out.collect(0, parsed);
            emitted = true;
        }
        Ok(match (emitted, self.watch) {
            (true, _) => SourcePoll::Ready,
            (false, true) => SourcePoll::Pending(POLL_INTERVAL),
            (false, false) => {
                out.finish_split(0);
                SourcePoll::Finished
            }
        })
    }

    fn position(&mut self) -> Result<Vec<u8>> {
        serde_json::to_vec(&self.position).map_err(|e| Error::Internal(format!("limits file position: {e}")))
    }
}

//! Newline-delimited JSON files with exactly-once publication (two-phase commit).
//!
//! Records of one checkpoint epoch go to an in-progress file per subtask under
//! `<dir>/.inprogress/`. At the barrier of checkpoint `n` the file is flushed, synced and
//! renamed `part-<subtask>-<n>.<attempt>.pending`, the rename synced too (pre-commit,
//! recorded in the snapshot); when `n` completes it is moved to
//! `<dir>/part-<subtask>-<n>.<attempt>.jsonl` (commit: linked, the link synced, then the
//! pending name removed), never over an existing file. On restore
//! from `n`, the pending files recorded in `n` are published and every other in-progress
//! file is deleted: they hold records the restored job will produce again.
//!
//! Readers see only `<dir>/*.jsonl`: each record exactly once, even across kills. Without
//! checkpointing, or at the end of bounded input, the open file is published at close. In a
//! cluster the directory must be shared by every host (checked: `shared_dir`).

use caudal::types::MAX_WATERMARK;
use caudal::{crash, Batch, CheckpointId, Data, Error, OperatorContext, Result, Sink};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use super::shared_dir::SharedDir;

const IN_PROGRESS: &str = ".inprogress";

/// A pre-committed file waiting for its checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Pending {
    checkpoint: u64,
    /// File name under `.inprogress/`.
    pending: String,
    /// File name under the output directory.
    published: String,
}

/// Writes each record as one JSON line; publishes atomically per checkpoint.
pub struct JsonFileSink<T> {
    dir: PathBuf,
    subtask: u32,
    /// This run of the job ([`OperatorContext::attempt`]).
    attempt: String,
    writer: Option<(BufWriter<File>, PathBuf)>,
    pending: Vec<Pending>,
    line: Vec<u8>,
    /// Whether every subtask sees this directory (checked at the first completed checkpoint).
    shared: Option<SharedDir>,
    _t: PhantomData<fn(T)>,
}

impl<T> std::fmt::Debug for JsonFileSink<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JsonFileSink({})", self.dir.display())
    }
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

/// Makes the entries of `dir` durable (a rename or link into it survives a power loss).
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(format!("syncing {}", dir.display())))
}

/// Moves `from` to `to` unless that was done already (by another subtask, or before a
/// crash), never over another file: `to` is linked first (which fails if it exists), then
/// `from` removed. An existing `to` that is not `from`'s file (another run writing into the
/// same directory, say with other checkpoint storage) fails the job instead of silently
/// replacing published records. The link is made durable before `from` goes, so a power
/// loss never leaves neither.
fn publish(from: &Path, to: &Path) -> Result<()> {
    match std::fs::hard_link(from, to) {
        Ok(()) => sync_dir(to.parent().unwrap_or(Path::new(".")))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if !same_file(from, to) && from.exists() {
                return Err(Error::config(
                    "output",
                    format!(
                        "publishing {}: {} already exists and holds other records; refusing to overwrite it \
                     (does another job or run write into the same output directory?)",
                        from.display(),
                        to.display()
                    ),
                ));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && to.exists() => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::OutputLost(format!(
                "pre-committed file {} is missing and was never published: its records are lost \
                 (was the output directory changed between runs?)",
                from.display()
            )))
        }
        Err(e) => return Err(Error::io(format!("publishing {}", from.display()), e)),
    }
    match std::fs::remove_file(from) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("publishing {}", from.display()), e)),
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

impl<T> JsonFileSink<T> {
    /// A sink writing under `dir` (created if absent).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        JsonFileSink {
            dir: dir.into(),
            subtask: 0,
            attempt: String::new(),
            writer: None,
            pending: Vec::new(),
            line: Vec::new(),
            shared: None,
            _t: PhantomData,
        }
    }

    fn in_progress(&self) -> PathBuf {
        self.dir.join(IN_PROGRESS)
    }

    fn open_writer(&mut self) -> Result<&mut BufWriter<File>> {
        if self.writer.is_none() {
            let path = self.in_progress().join(format!("part-{}.{}.open", self.subtask, self.attempt));
            let file = File::create(&path).map_err(io(format!("creating {}", path.display())))?;
            self.writer = Some((BufWriter::with_capacity(256 * 1024, file), path));
        }
        match self.writer.as_mut() {
            Some((w, _)) => Ok(w),
            None => Err(Error::Operator("file sink: no writer".into())),
        }
    }

    /// Flushes and syncs the open file; returns its path.
    fn close_writer(&mut self) -> Result<Option<PathBuf>> {
        let Some((mut w, path)) = self.writer.take() else { return Ok(None) };
        w.flush().map_err(io(format!("flushing {}", path.display())))?;
        let file =
            w.into_inner().map_err(|e| Error::io(format!("flushing {}", path.display()), e.into_error()))?;
        file.sync_all().map_err(io(format!("syncing {}", path.display())))?;
        Ok(Some(path))
    }

    fn commit_up_to(&mut self, checkpoint: u64) -> Result<()> {
        let (due, rest): (Vec<Pending>, Vec<Pending>) =
            std::mem::take(&mut self.pending).into_iter().partition(|p| p.checkpoint <= checkpoint);
        self.pending = rest;
        for (i, p) in due.iter().enumerate() {
            publish(&self.in_progress().join(&p.pending), &self.dir.join(&p.published))?;
            if i == 0 {
                crash::point(crash::DURING_SINK_COMMIT, CheckpointId(checkpoint));
            }
        }
        Ok(())
    }
}

impl<T: Data + Serialize> Sink for JsonFileSink<T> {
    type In = T;

    fn restore(&mut self, snapshots: Vec<Vec<u8>>, ctx: &mut OperatorContext) -> Result<()> {
        self.attempt = ctx.attempt.clone();
        std::fs::create_dir_all(self.in_progress())
            .map_err(io(format!("creating {}", self.dir.display())))?;
        let restored = ctx.restored_checkpoint.map_or(0, |c| c.0);
        let mut keep = std::collections::HashSet::new();
        for blob in snapshots {
            let pending: Vec<Pending> = serde_json::from_slice(&blob)
                .map_err(|e| Error::CorruptState(format!("file sink: corrupt pre-commit state: {e}")))?;
            for p in pending.into_iter().filter(|p| p.checkpoint <= restored) {
                publish(&self.in_progress().join(&p.pending), &self.dir.join(&p.published))?;
                keep.insert(p.pending);
            }
        }
        // Everything else in progress belongs to epochs after the restored checkpoint or to
        // crashed attempts: the restored job writes those records again. Each subtask removes
        // only its own files (subtask 0 also those of subtasks beyond the new parallelism): in
        // cluster mode the other subtasks run in other processes and may be writing already.
        let owner = |name: &str| -> Option<u32> {
            name.strip_prefix("part-")?.split(['-', '.']).next()?.parse().ok()
        };
        let entries =
            std::fs::read_dir(self.in_progress()).map_err(io(format!("listing {}", self.dir.display())))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let mine = match owner(&name) {
                Some(s) => s == ctx.subtask || (ctx.subtask == 0 && s >= ctx.parallelism),
                None => ctx.subtask == 0,
            };
            if mine && !keep.contains(&name) && !name.contains(&format!(".{}.", self.attempt)) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(())
    }

    fn on_start(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        self.subtask = ctx.subtask;
        self.attempt = ctx.attempt.clone();
        std::fs::create_dir_all(self.in_progress())
            .map_err(io(format!("creating output directory {}", self.dir.display())))?;
        if ctx.checkpointing {
            self.shared = Some(SharedDir::announce(&self.dir, ctx)?);
        }
        Ok(())
    }

    fn write_batch(&mut self, batch: Batch<T>, _ctx: &mut OperatorContext) -> Result<()> {
        let mut line = std::mem::take(&mut self.line);
        let w = self.open_writer()?;
        for r in batch {
            line.clear();
            serde_json::to_writer(&mut line, &r.value)
                .map_err(|e| Error::BadRecord(format!("serializing a record to JSON: {e}")))?;
            line.push(b'\n');
            w.write_all(&line).map_err(io("writing an output file".to_string()))?;
        }
        self.line = line;
        Ok(())
    }

    fn pre_commit(
        &mut self,
        checkpoint: CheckpointId,
        _ctx: &mut OperatorContext,
    ) -> Result<Option<Vec<u8>>> {
        if let Some(path) = self.close_writer()? {
            let pending = format!("part-{}-{}.{}.pending", self.subtask, checkpoint.0, self.attempt);
            std::fs::rename(&path, self.in_progress().join(&pending))
                .map_err(io(format!("pre-committing {}", path.display())))?;
            // The checkpoint will name the file: its name must survive a power loss too.
            sync_dir(&self.in_progress())?;
            self.pending.push(Pending {
                checkpoint: checkpoint.0,
                pending,
                // The attempt too: another run with other checkpoint storage numbers its
                // checkpoints from 1 again.
                published: format!("part-{}-{}.{}.jsonl", self.subtask, checkpoint.0, self.attempt),
            });
        }
        serde_json::to_vec(&self.pending)
            .map(Some)
            .map_err(|e| Error::Internal(format!("file sink: encoding pre-commit state: {e}")))
    }

    fn on_checkpoint_complete(&mut self, checkpoint: CheckpointId, _ctx: &mut OperatorContext) -> Result<()> {
        if let Some(shared) = self.shared.as_mut() {
            shared.check_once("output")?;
        }
        self.commit_up_to(checkpoint.0)
    }

    fn on_close(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        let end_of_input = ctx.watermark == MAX_WATERMARK;
        if ctx.checkpointing && !end_of_input {
            // Stopped or cancelled: what is not committed is replayed by a restore.
            drop(self.writer.take());
            return Ok(());
        }
        // End of input (or no checkpoints): publish everything, the open file last.
        self.commit_up_to(u64::MAX)?;
        if let Some(path) = self.close_writer()? {
            publish(&path, &self.dir.join(format!("part-{}-end.{}.jsonl", self.subtask, self.attempt)))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publishing_moves_once_and_never_overwrites_other_records() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("a.pending"), dir.path().join("a.jsonl"));
        std::fs::write(&from, "1\n").unwrap();
        publish(&from, &to).unwrap();
        assert!(!from.exists());
        assert_eq!(std::fs::read_to_string(&to).unwrap(), "1\n");
        // Again (a restore publishing what was published before a crash): nothing to do.
        publish(&from, &to).unwrap();
        // Killed between the link and the unlink: both names are the same file.
        let half = dir.path().join("b.pending");
        let half_to = dir.path().join("b.jsonl");
        std::fs::write(&half, "2\n").unwrap();
        std::fs::hard_link(&half, &half_to).unwrap();
        publish(&half, &half_to).unwrap();
        assert!(!half.exists());
        // Another run's file of the same name stays, and the job is told.
        let other = dir.path().join("c.pending");
        std::fs::write(&other, "3\n").unwrap();
        let e = publish(&other, &to).unwrap_err().to_string();
        assert!(e.contains("refusing to overwrite"), "{e}");
        assert_eq!(std::fs::read_to_string(&to).unwrap(), "1\n");
        assert!(other.exists(), "the pending file is kept for a fix by hand");
        // Gone and never published: lost, said so.
        let e = publish(&dir.path().join("d.pending"), &dir.path().join("d.jsonl")).unwrap_err().to_string();
        assert!(e.contains("never published"), "{e}");
    }
}

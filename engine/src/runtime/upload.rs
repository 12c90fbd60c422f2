//! The asynchronous part of checkpoints: uploads keyed-state snapshots off the task threads,
//! then sends the task's ack with the resulting state handles.
//!
//! A task takes the synchronous part at the barrier (`KeyedStateBackend::snapshot`: a RocksDB
//! flush + hard-link checkpoint) and goes back to its records; one of the job's uploader
//! threads runs `StateSnapshot::upload` (new SST files only: incremental) and acks. A failed
//! upload declines the checkpoint (it aborts; the job keeps running).

use super::chain::TakenSnapshot;
use super::task::{AckStats, CheckpointAck};
use crate::types::CheckpointId;
use caudal_checkpoints::store::ObjectEntry;
use caudal_checkpoints::{Blob, CheckpointStore, SubtaskSnapshot};
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// How many uploads of different subtasks run at once.
const UPLOAD_THREADS: usize = 2;

/// One subtask's snapshots of one checkpoint, waiting for upload.
pub(crate) struct UploadJob {
    pub(crate) checkpoint: CheckpointId,
    pub(crate) subtask: u32,
    pub(crate) snapshots: Vec<TakenSnapshot>,
    /// The task's barrier alignment, reported with the ack.
    pub(crate) alignment: std::time::Duration,
    pub(crate) acks: Sender<CheckpointAck>,
}

/// Where tasks hand their uploads.
#[derive(Clone)]
pub(crate) struct UploadQueue(Sender<UploadJob>);

impl UploadQueue {
    pub(crate) fn submit(&self, job: UploadJob) {
        // The uploader lives as long as the job; if it is gone the checkpoint just times out.
        let _ = self.0.send(job);
    }
}

/// The job's uploader threads.
pub(crate) struct Uploader {
    queue: Option<Sender<UploadJob>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Uploader {
    pub(crate) fn start(store: Arc<dyn CheckpointStore>) -> crate::Result<Self> {
        let (tx, rx) = unbounded::<UploadJob>();
        let mut threads = Vec::new();
        for i in 0..UPLOAD_THREADS {
            let (rx, store) = (rx.clone(), store.clone());
            let t = std::thread::Builder::new()
                .name(format!("checkpoint-upload-{i}"))
                .spawn(move || run(&rx, store.as_ref()))
                .map_err(|e| crate::Error::io("spawning a checkpoint upload thread", e))?;
            threads.push(t);
        }
        Ok(Uploader { queue: Some(tx), threads })
    }

    pub(crate) fn queue(&self) -> Option<UploadQueue> {
        self.queue.clone().map(UploadQueue)
    }

    /// Waits for the uploads in progress (after every task ended).
    pub(crate) fn finish(mut self) {
        self.queue = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn run(jobs: &Receiver<UploadJob>, store: &dyn CheckpointStore) {
    while let Ok(job) = jobs.recv() {
        let mut ack = upload(job.checkpoint, job.subtask, job.snapshots, store);
        ack.stats.alignment = job.alignment;
        let _ = job.acks.send(ack);
    }
}

/// Uploads every keyed snapshot of a subtask and builds its ack.
pub(crate) fn upload(
    checkpoint: CheckpointId,
    subtask: u32,
    snapshots: Vec<TakenSnapshot>,
    store: &dyn CheckpointStore,
) -> CheckpointAck {
    let start = Instant::now();
    let mut stats = AckStats::default();
    let mut out = Vec::with_capacity(snapshots.len());
    let crash_store = CrashPointStore { inner: store, checkpoint };
    for s in snapshots {
        let mut snapshot = SubtaskSnapshot { keyed_state: None, operator_state: s.operator_state.map(Blob) };
        if let Some(keyed) = s.keyed {
            stats.sync = stats.sync.max(keyed.sync);
            match keyed.snapshot.upload(&crash_store) {
                Ok(result) => {
                    stats.uploaded_bytes += result.stats.uploaded_bytes;
                    stats.state_bytes += result.handle.state_size();
                    snapshot.keyed_state = Some(result.handle);
                }
                Err(e) => {
                    return CheckpointAck {
                        checkpoint,
                        subtask,
                        snapshots: Err(format!("uploading the keyed state of `{}`: {e}", s.uid)),
                        stats,
                    }
                }
            }
        }
        if let Some(b) = &snapshot.operator_state {
            stats.state_bytes += b.0.len() as u64;
            stats.uploaded_bytes += b.0.len() as u64;
        }
        out.push((s.uid, snapshot));
    }
    stats.upload = start.elapsed();
    CheckpointAck { checkpoint, subtask, snapshots: Ok(out), stats }
}

/// The store as seen by an upload, with the crash point "during the async upload": after the
/// first half of a snapshot's files is in storage, before the rest — only in an upload of at
/// least two files, where that moment exists (tests only; unarmed it costs a comparison and
/// changes nothing).
#[derive(Debug)]
struct CrashPointStore<'a> {
    inner: &'a dyn CheckpointStore,
    checkpoint: CheckpointId,
}

impl CheckpointStore for CrashPointStore<'_> {
    fn location(&self) -> String {
        self.inner.location()
    }
    fn get(&self, path: &str) -> caudal_checkpoints::Result<bytes::Bytes> {
        self.inner.get(path)
    }
    fn head(&self, path: &str) -> caudal_checkpoints::Result<Option<u64>> {
        self.inner.head(path)
    }
    fn put(&self, path: &str, data: bytes::Bytes) -> caudal_checkpoints::Result<()> {
        // One object is in storage or not: nothing is half done here.
        self.inner.put(path, data)
    }
    fn put_if_absent(&self, path: &str, data: bytes::Bytes) -> caudal_checkpoints::Result<()> {
        self.inner.put_if_absent(path, data)
    }
    fn list(&self, prefix: &str) -> caudal_checkpoints::Result<Vec<ObjectEntry>> {
        self.inner.list(prefix)
    }
    fn list_dirs(&self, prefix: &str) -> caudal_checkpoints::Result<Vec<String>> {
        self.inner.list_dirs(prefix)
    }
    fn delete(&self, path: &str) -> caudal_checkpoints::Result<()> {
        self.inner.delete(path)
    }
    fn put_files(&self, files: &[(String, &Path)]) -> caudal_checkpoints::Result<()> {
        // Unarmed, the upload is what production does: one batch (the store uploads its
        // files in parallel). Armed, two: the crash comes between them.
        if !crate::crash::armed(crate::crash::DURING_ASYNC_UPLOAD, self.checkpoint) {
            return self.inner.put_files(files);
        }
        if files.len() < 2 {
            // A single file: there is no moment with some of it stored and some not.
            return self.inner.put_files(files);
        }
        let half = files.len() / 2;
        self.inner.put_files(&files[..half])?;
        // What the test checks on disk: these are stored, those not yet.
        let names = |part: &[(String, &Path)]| {
            part.iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>().join(",")
        };
        eprintln!(
            "caudal: {}: in storage: {}; not yet: {}",
            crate::crash::DURING_ASYNC_UPLOAD,
            names(&files[..half]),
            names(&files[half..])
        );
        crate::crash::point(crate::crash::DURING_ASYNC_UPLOAD, self.checkpoint);
        self.inner.put_files(&files[half..])
    }
    fn copy(&self, from: &str, to: &str) -> caudal_checkpoints::Result<()> {
        self.inner.copy(from, to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use caudal_checkpoints::InMemoryCheckpointStore;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Counts the batches it is asked to upload.
    #[derive(Debug, Default)]
    struct Batches {
        inner: InMemoryCheckpointStore,
        calls: AtomicUsize,
    }

    impl CheckpointStore for Batches {
        fn location(&self) -> String {
            self.inner.location()
        }
        fn get(&self, path: &str) -> caudal_checkpoints::Result<bytes::Bytes> {
            self.inner.get(path)
        }
        fn head(&self, path: &str) -> caudal_checkpoints::Result<Option<u64>> {
            self.inner.head(path)
        }
        fn put(&self, path: &str, data: bytes::Bytes) -> caudal_checkpoints::Result<()> {
            self.inner.put(path, data)
        }
        fn put_if_absent(&self, path: &str, data: bytes::Bytes) -> caudal_checkpoints::Result<()> {
            self.inner.put_if_absent(path, data)
        }
        fn list(&self, prefix: &str) -> caudal_checkpoints::Result<Vec<ObjectEntry>> {
            self.inner.list(prefix)
        }
        fn list_dirs(&self, prefix: &str) -> caudal_checkpoints::Result<Vec<String>> {
            self.inner.list_dirs(prefix)
        }
        fn delete(&self, path: &str) -> caudal_checkpoints::Result<()> {
            self.inner.delete(path)
        }
        fn put_files(&self, files: &[(String, &Path)]) -> caudal_checkpoints::Result<()> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.inner.put_files(files)
        }
        fn copy(&self, from: &str, to: &str) -> caudal_checkpoints::Result<()> {
            self.inner.copy(from, to)
        }
    }

    #[test]
    fn an_unarmed_crash_point_leaves_the_upload_one_batch() {
        let dir = tempfile::tempdir().unwrap();
        let paths: Vec<std::path::PathBuf> = (0..4).map(|i| dir.path().join(format!("f{i}"))).collect();
        for p in &paths {
            std::fs::write(p, b"x").unwrap();
        }
        let files: Vec<(String, &Path)> =
            paths.iter().enumerate().map(|(i, p)| (format!("o{i}"), p.as_path())).collect();
        let store = Batches::default();
        let crash = CrashPointStore { inner: &store, checkpoint: CheckpointId(3) };
        crash.put_files(&files).unwrap();
        assert_eq!(store.calls.load(Ordering::SeqCst), 1, "the files went out in more than one batch");
        assert_eq!(store.inner.put_count(), 4);
    }
}

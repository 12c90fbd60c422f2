//! [`ArchiveSink`]: Avro object container files per partition, subtask and epoch,
//! published exactly once (two-phase, like the JSON file sink).
//!
//! Records of the open epoch are appended to one in-memory Avro writer per
//! `date=…/hour=…` partition of their event time. A writer that reaches
//! `target_file_bytes` is uploaded at once as an in-progress object
//! `_inprogress/<job>/<uid>/part-<subtask>-<file>.<attempt>.avro`; at barrier `n` the rest
//! are uploaded the same way and all of them are recorded in the snapshot with their final
//! names `<partition>/part-<uid>-<subtask>-<n>-<k>.<attempt>.avro` (pre-commit). When `n` completes
//! each is copied to its final name and the in-progress object deleted (commit). On restore
//! from `n`, subtask 0 publishes what `n` recorded and deletes every other in-progress
//! object of earlier runs of this sink (never another sink's or job's on the same URL):
//! their records are written again by the restored job.
//!
//! Readers list everything outside `_inprogress/`: each record exactly once.

use super::config::ArchiveConfig;
use super::partition::partition;
use crate::retry::Failure;
use apache_avro::Writer;
use bytes::Bytes;
use caudal::types::MAX_WATERMARK;
use caudal::{crash, Batch, CheckpointId, Data, Error, OperatorContext, Result, Sink};
use caudal_checkpoints::{CheckpointStorageConfig, CheckpointStore, ObjectCheckpointStore};
use caudal_schemas::AvroRecord;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::marker::PhantomData;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Where in-progress objects live, under the archive's root.
pub const IN_PROGRESS: &str = "_inprogress";

/// An uploaded in-progress object and the name it gets when its checkpoint completes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Pending {
    checkpoint: u64,
    in_progress: String,
    published: String,
}

/// An in-progress object of the open epoch (its final name is chosen at the barrier).
#[derive(Debug)]
struct Uploaded {
    in_progress: String,
    partition: String,
}

/// Archives records of type `R` as Avro container files.
pub struct ArchiveSink<R: 'static> {
    config: ArchiveConfig,
    store: Option<ObjectCheckpointStore>,
    writers: BTreeMap<String, Writer<'static, Vec<u8>>>,
    uploaded: Vec<Uploaded>,
    pending: Vec<Pending>,
    subtask: u32,
    files: u64,
    /// This run of the job ([`OperatorContext::attempt`]).
    attempt: String,
    /// `_inprogress/<job>/<operator uid>`: this sink's in-progress objects, apart from
    /// those of other jobs and sinks archiving to the same place.
    in_progress: String,
    /// The operator uid, made object-name safe.
    uid: String,
    what: String,
    checkpointing: bool,
    retries: Arc<AtomicU64>,
    /// The subtask's counters (bytes out: the Avro files uploaded).
    metrics: Arc<caudal::metrics::SubtaskMetrics>,
    _r: PhantomData<fn(R)>,
}

impl<R> std::fmt::Debug for ArchiveSink<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ArchiveSink({})", self.config.url)
    }
}

fn storage(e: caudal_checkpoints::Error) -> Failure {
    if e.is_retryable() && !matches!(e, caudal_checkpoints::Error::NotFound { .. }) {
        Failure::Transient(e.to_string())
    } else {
        Failure::Permanent(e.to_string())
    }
}

impl<R: AvroRecord> ArchiveSink<R> {
    pub(crate) fn new(config: ArchiveConfig) -> Self {
        ArchiveSink {
            what: format!("archive sink ({})", config.url),
            config,
            store: None,
            writers: BTreeMap::new(),
            uploaded: Vec::new(),
            pending: Vec::new(),
            subtask: 0,
            files: 0,
            attempt: String::new(),
            in_progress: IN_PROGRESS.to_string(),
            uid: String::new(),
            checkpointing: false,
            retries: Arc::new(AtomicU64::new(0)),
            metrics: Arc::default(),
            _r: PhantomData,
        }
    }

    fn init(&mut self, ctx: &OperatorContext) -> Result<()> {
        self.subtask = ctx.subtask;
        self.attempt = ctx.attempt.clone();
        self.uid = caudal::uid_safe(&ctx.operator_uid);
        self.in_progress = format!("{IN_PROGRESS}/{}/{}", caudal::uid_safe(&ctx.job_name), self.uid);
        self.checkpointing = ctx.checkpointing;
        self.retries = ctx.metrics.counter(caudal::metrics::names::SINK_RETRIES);
        self.metrics = ctx.metrics.clone();
        self.what = format!("archive sink `{}`[{}] ({})", ctx.operator_name, ctx.subtask, self.config.url);
        if self.store.is_none() {
            let storage =
                CheckpointStorageConfig { url: self.config.url.clone(), s3: self.config.s3.clone() };
            let store = storage.build().map_err(|e| {
                Error::external("object storage", format!("{}: opening the storage: {e}", self.what))
            })?;
            self.store = Some(store);
        }
        Ok(())
    }

    /// Runs a storage operation with the sink's retry policy.
    fn with_store<T>(
        &self,
        doing: &str,
        f: impl Fn(&ObjectCheckpointStore) -> caudal_checkpoints::Result<T>,
    ) -> Result<T> {
        let store =
            self.store.as_ref().ok_or_else(|| Error::Internal(format!("{}: not started", self.what)))?;
        self.config.retry.run_counted(
            "object storage",
            &format!("{}: {doing}", self.what),
            &self.retries,
            |_| f(store).map_err(storage),
        )
    }

    fn new_writer() -> Result<Writer<'static, Vec<u8>>> {
        Writer::new(R::schema(), Vec::new())
            .map_err(|e| Error::Internal(format!("archive: Avro writer: {e}")))
    }

    /// Finishes the writer of `partition` and uploads it as in-progress.
    fn cut(&mut self, partition: &str) -> Result<()> {
        let Some(writer) = self.writers.remove(partition) else { return Ok(()) };
        let bytes = writer
            .into_inner()
            .map_err(|e| Error::Internal(format!("{}: finishing an Avro file: {e}", self.what)))?;
        let name = format!("{}/part-{}-{}.{}.avro", self.in_progress, self.subtask, self.files, self.attempt);
        self.files += 1;
        let data = Bytes::from(bytes);
        self.with_store("uploading an in-progress file", |s| s.put(&name, data.clone()))?;
        self.metrics.add_bytes_out(data.len());
        self.uploaded.push(Uploaded { in_progress: name, partition: partition.to_string() });
        Ok(())
    }

    fn cut_all(&mut self) -> Result<()> {
        let partitions: Vec<String> = self.writers.keys().cloned().collect();
        for p in partitions {
            self.cut(&p)?;
        }
        Ok(())
    }

    /// Names the epoch's uploads for checkpoint `n` and moves them to `pending`.
    fn close_epoch(&mut self, n: u64, label: &str) {
        for (k, u) in std::mem::take(&mut self.uploaded).into_iter().enumerate() {
            self.pending.push(Pending {
                checkpoint: n,
                // The sink's uid and the run: two sinks of one job, or two jobs, archiving to
                // the same place never write the same name.
                published: format!(
                    "{}/part-{}-{}-{label}-{k}.{}.avro",
                    u.partition, self.uid, self.subtask, self.attempt
                ),
                in_progress: u.in_progress,
            });
        }
    }

    /// Copies `p` to its final name and deletes the in-progress object.
    fn publish(&self, p: &Pending) -> Result<()> {
        let what = format!("publishing {}", p.published);
        self.config.retry.run_counted(
            "object storage",
            &format!("{}: {what}", self.what),
            &self.retries,
            |_| {
                let store = self.store.as_ref().ok_or_else(|| Failure::Permanent("not started".into()))?;
                match store.copy(&p.in_progress, &p.published) {
                    Ok(()) => {}
                    Err(caudal_checkpoints::Error::NotFound { .. }) => {
                        // Published before a crash (the in-progress object is deleted only after the copy)?
                        return match store.head(&p.published).map_err(storage)? {
                            Some(_) => Ok(()),
                            None => Err(Failure::Permanent(format!(
                            "pre-committed file {} is missing and was never published as {}: its records are \
                             lost (was the archive changed between runs?)",
                            p.in_progress, p.published
                        ))),
                        };
                    }
                    Err(e) => return Err(storage(e)),
                }
                store.delete(&p.in_progress).map_err(storage)
            },
        )
    }

    fn commit_up_to(&mut self, checkpoint: u64) -> Result<()> {
        let (due, rest): (Vec<Pending>, Vec<Pending>) =
            std::mem::take(&mut self.pending).into_iter().partition(|p| p.checkpoint <= checkpoint);
        self.pending = rest;
        for (i, p) in due.iter().enumerate() {
            self.publish(p)?;
            if i == 0 {
                crash::point(crash::DURING_SINK_COMMIT, CheckpointId(p.checkpoint));
            }
        }
        Ok(())
    }
}

impl<R: AvroRecord + Data> Sink for ArchiveSink<R> {
    type In = R;

    fn restore(&mut self, snapshots: Vec<Vec<u8>>, ctx: &mut OperatorContext) -> Result<()> {
        self.init(ctx)?;
        if ctx.subtask != 0 {
            return Ok(());
        }
        let restored = ctx.restored_checkpoint.map_or(0, |c| c.0);
        let mut keep = HashSet::new();
        for blob in snapshots {
            let pending: Vec<Pending> = serde_json::from_slice(&blob)
                .map_err(|e| Error::CorruptState(format!("{}: corrupt pre-commit state: {e}", self.what)))?;
            for p in pending.into_iter().filter(|p| p.checkpoint <= restored) {
                self.publish(&p)?;
                if keep.is_empty() {
                    crash::point(crash::DURING_ARCHIVE_REPUBLISH, CheckpointId(restored));
                }
                keep.insert(p.in_progress);
            }
        }
        // Every other in-progress object of an earlier run holds records the restored job
        // writes again. Those of this run are spared: other subtasks of it (in a cluster, in
        // other processes) may be uploading already. The run is the engine's attempt
        // (`OperatorContext::attempt`), new for every run, so a restart inside the same
        // process still removes what its failed predecessor left.
        let suffix = format!(".{}.avro", self.attempt);
        // Only this sink's: other jobs and sinks may archive to the same place.
        let stale = self.with_store("listing in-progress files", |s| s.list(&self.in_progress))?;
        for entry in stale.into_iter().filter(|e| !keep.contains(&e.path) && !e.path.ends_with(&suffix)) {
            self.with_store("deleting a stale in-progress file", |s| s.delete(&entry.path))?;
        }
        Ok(())
    }

    fn on_start(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        self.init(ctx)
    }

    fn write_batch(&mut self, batch: Batch<R>, _ctx: &mut OperatorContext) -> Result<()> {
        let mut full = Vec::new();
        for r in batch {
            let p = partition(r.ts);
            let writer = match self.writers.entry(p) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => e.insert(Self::new_writer()?),
            };
            writer.append_ser(&r.value).map_err(|e| {
                Error::BadRecord(format!("{}: a record does not fit its Avro schema: {e}", self.what))
            })?;
        }
        for (p, w) in &self.writers {
            if w.get_ref().len() >= self.config.target_file_bytes {
                full.push(p.clone());
            }
        }
        for p in full {
            self.cut(&p)?;
        }
        Ok(())
    }

    fn pre_commit(
        &mut self,
        checkpoint: CheckpointId,
        _ctx: &mut OperatorContext,
    ) -> Result<Option<Vec<u8>>> {
        if !self.checkpointing {
            return Ok(None);
        }
        self.cut_all()?;
        self.close_epoch(checkpoint.0, &checkpoint.0.to_string());
        serde_json::to_vec(&self.pending)
            .map(Some)
            .map_err(|e| Error::Internal(format!("{}: encoding pre-commit state: {e}", self.what)))
    }

    fn on_checkpoint_complete(&mut self, checkpoint: CheckpointId, _ctx: &mut OperatorContext) -> Result<()> {
        self.commit_up_to(checkpoint.0)
    }

    fn on_close(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        let end_of_input = ctx.watermark == MAX_WATERMARK;
        if self.checkpointing && !end_of_input {
            // Stopped or cancelled: what is not committed is replayed by a restore.
            self.writers.clear();
            return Ok(());
        }
        // End of input (or no checkpoints): publish everything, the open files last.
        self.commit_up_to(u64::MAX)?;
        self.cut_all()?;
        self.close_epoch(u64::MAX, "end");
        self.commit_up_to(u64::MAX)
    }
}

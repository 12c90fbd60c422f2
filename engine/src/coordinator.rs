//! The checkpoint coordinator of a job: triggers barriers at the sources, collects acks,
//! writes the metadata last (then the checkpoint is complete), notifies every participant,
//! applies retention. What a run restores from is `crate::restore`'s.
//!
//! The protocol's state lives in `caudal_checkpoints::PendingCheckpoint` (pure logic); this
//! file is the I/O edge: the checkpoint store, and the [`Participants`] it talks to — the
//! tasks of this process in embedded mode, the executors of an attempt in a cluster.

use crate::config::CheckpointConfig;
use crate::job::{now_ms, CheckpointStats, JobView, TaskCheckpointStats};
use crate::runtime::task::CheckpointAck;
use crate::types::{CheckpointBarrier, CheckpointId};
use crate::{Error, Result, RunFence};
use caudal_checkpoints::metadata::checkpoint_dirs;
use caudal_checkpoints::{
    apply_retention, complete_checkpoint, AckOutcome, CheckpointKind, CheckpointPaths, CheckpointStore,
    Lineage, OperatorId, PendingCheckpoint, RetentionConfig, SubtaskIndex,
};
use crossbeam_channel::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn state_err(e: caudal_checkpoints::Error) -> Error {
    Error::CheckpointStorage { context: "checkpoint storage".into(), source: Box::new(e) }
}

/// Who takes part in the checkpoints: what the coordinator tells, and the one thing it asks.
pub(crate) trait Participants {
    /// Take checkpoint `barrier.id` now (sent to the sources, which inject the barrier).
    fn trigger(&self, barrier: CheckpointBarrier);
    /// Checkpoint `id` is complete: commit (sent to every task).
    fn complete(&self, id: CheckpointId);
    /// True once any task has ended: it can take part in no further checkpoint.
    fn any_finished(&self) -> bool;
}

/// Opens the job's checkpoint storage: `<storage>/<job>/`.
pub(crate) fn open_store(
    config: &CheckpointConfig,
    job: &str,
) -> Result<(Arc<dyn CheckpointStore>, CheckpointPaths)> {
    let store = config
        .storage
        .build()
        .map_err(|e| Error::config("checkpoints.storage", format!("{}: {e}", config.storage.url)))?;
    Ok((Arc::new(store), CheckpointPaths::under(job)))
}

struct InFlight {
    pending: PendingCheckpoint,
    started: Instant,
    /// State referenced by the checkpoint, bytes.
    bytes: u64,
    /// Bytes uploaded by this checkpoint (incremental).
    uploaded: u64,
    /// The slowest subtask's synchronous snapshot part.
    sync: Duration,
    /// The slowest subtask's upload.
    upload: Duration,
    /// The longest alignment.
    alignment: Duration,
    /// Per acknowledging task subtask.
    tasks: Vec<TaskCheckpointStats>,
}

/// Drives checkpoints of one running job.
pub(crate) struct Coordinator {
    store: Arc<dyn CheckpointStore>,
    paths: CheckpointPaths,
    config: CheckpointConfig,
    job: String,
    max_parallelism: u16,
    operators: Vec<(OperatorId, u32)>,
    next_id: CheckpointId,
    in_flight: Option<InFlight>,
    last_end: Instant,
    acks: Receiver<CheckpointAck>,
    /// The last completed checkpoint.
    pub(crate) last_completed: Option<CheckpointId>,
    /// This run and its restore points, recorded in every checkpoint it completes.
    lineage: Lineage,
    /// Whether this run still owns the storage (checked before every metadata write).
    fence: RunFence,
    /// The checkpoint requested by a stop, and whether it completed.
    final_checkpoint: Option<CheckpointId>,
    /// The checkpoint in flight for a requested savepoint, and the savepoint's name.
    savepoint: Option<(CheckpointId, String)>,
    /// Savepoints being copied out of their checkpoint (retention waits for them).
    copies: Vec<std::thread::JoinHandle<()>>,
    /// Retention after the last completed checkpoint, while it runs.
    retention: Option<std::thread::JoinHandle<()>>,
    /// The job's view: savepoint requests arrive through it, and it says whether they can.
    view: Arc<JobView>,
    /// Checkpoints failed since the last one completed.
    failed_in_a_row: u32,
    /// The cause of the last failure.
    last_failure: Option<String>,
    /// When the first tick asked to stop (a stop, or every source at the end of its input).
    stopping_since: Option<Instant>,
}

impl Drop for Coordinator {
    /// The attempt is over: savepoint copies and retention finish, requests nobody will
    /// take fail.
    fn drop(&mut self) {
        for copy in self.copies.drain(..).chain(self.retention.take()) {
            let _ = copy.join();
        }
        self.view.set_checkpointing(false);
    }
}

/// What a tick decided.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Tick {
    /// Keep running.
    Continue,
    /// The final checkpoint of a stop is complete (or impossible): stop the sources now.
    StopSources,
}

impl Coordinator {
    pub(crate) fn new(
        store: Arc<dyn CheckpointStore>,
        paths: CheckpointPaths,
        config: CheckpointConfig,
        acks: Receiver<CheckpointAck>,
        restored: Option<CheckpointId>,
        lineage: Lineage,
        view: Arc<JobView>,
    ) -> Result<Self> {
        let plan = &view.plan;
        RetentionConfig { retained_checkpoints: config.retained }
            .validate()
            .map_err(|e| Error::config("checkpoints.retained", e.to_string()))?;
        let operators = plan
            .operators
            .iter()
            .map(|o| {
                OperatorId::new(o.uid.clone())
                    .map(|id| (id, o.parallelism))
                    .map_err(|e| Error::config(format!("{}.name", o.name), e.to_string()))
            })
            .collect::<Result<Vec<_>>>()?;
        // Never reuse an id, even of a checkpoint that did not complete before a crash.
        let last = checkpoint_dirs(store.as_ref(), &paths).map_err(state_err)?.last().copied();
        let next_id = last
            .map_or(CheckpointId(1), CheckpointId::next)
            .max(restored.map_or(CheckpointId(1), CheckpointId::next));
        // Nothing of this job writes to its storage yet: what a killed run was writing can go.
        match store.sweep_interrupted_writes(paths.root()) {
            Ok(swept) if !swept.is_empty() => {
                tracing::info!(
                    "caudal: removed {} file(s) a killed run left half-written: {swept:?}",
                    swept.len()
                )
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("caudal: could not remove half-written files of a killed run: {e}"),
        }
        view.set_checkpoint_settings(crate::job::CheckpointSettings {
            interval_ms: config.interval.map(|i| i.as_millis() as u64),
            timeout_ms: config.timeout.as_millis() as u64,
            min_pause_ms: config.min_pause.as_millis() as u64,
            retained: config.retained,
            storage: store.location(),
        });
        view.set_checkpointing(true);
        let fence = RunFence::new(store.clone(), paths.clone(), &lineage.run);
        Ok(Coordinator {
            store,
            paths,
            config,
            job: view.name.clone(),
            max_parallelism: u16::try_from(plan.max_parallelism).unwrap_or(u16::MAX),
            operators,
            next_id,
            in_flight: None,
            last_end: Instant::now(),
            acks,
            last_completed: restored,
            fence,
            lineage,
            final_checkpoint: None,
            savepoint: None,
            copies: Vec::new(),
            retention: None,
            view,
            failed_in_a_row: 0,
            last_failure: None,
            stopping_since: None,
        })
    }

    fn trigger(&mut self, tasks: &dyn Participants, view: &JobView) {
        let id = self.next_id;
        self.next_id = id.next();
        let trigger_ms = now_ms();
        let barrier =
            CheckpointBarrier { id, triggered_at: trigger_ms, latest_completed: self.last_completed };
        let pending = PendingCheckpoint::new(
            id,
            CheckpointKind::Checkpoint,
            trigger_ms as u64,
            self.config.timeout.as_millis() as u64,
            self.operators.clone(),
        )
        .with_lineage(self.lineage.clone());
        tasks.trigger(barrier);
        view.record_checkpoint(CheckpointStats {
            id: id.0,
            status: "IN_PROGRESS".into(),
            trigger_ms,
            duration_ms: 0,
            size_bytes: 0,
            incremental_bytes: 0,
            sync_us: 0,
            upload_us: 0,
            alignment_us: 0,
            tasks: Vec::new(),
            failure: None,
        });
        self.in_flight = Some(InFlight {
            pending,
            started: Instant::now(),
            bytes: 0,
            uploaded: 0,
            sync: Duration::ZERO,
            upload: Duration::ZERO,
            alignment: Duration::ZERO,
            tasks: Vec::new(),
        });
    }

    fn fail(&mut self, view: &JobView, cause: String) {
        if let Some(f) = self.in_flight.take() {
            tracing::warn!(
                checkpoint = f.pending.id().0,
                "caudal: checkpoint {} failed: {cause}",
                f.pending.id().0
            );
            if let Some((_, name)) = self.savepoint.take_if(|(id, _)| *id == f.pending.id()) {
                view.update_savepoint(&name, |s| {
                    s.status = "FAILED".into();
                    s.failure = Some(format!("its checkpoint {} failed: {cause}", f.pending.id().0));
                });
            } else {
                // As in Flink, a failed savepoint fails only itself.
                self.failed_in_a_row += 1;
                self.last_failure = Some(format!("checkpoint {} failed: {cause}", f.pending.id().0));
            }
            view.record_checkpoint(CheckpointStats {
                id: f.pending.id().0,
                status: "FAILED".into(),
                trigger_ms: now_ms() - f.started.elapsed().as_millis() as i64,
                duration_ms: f.started.elapsed().as_millis() as u64,
                size_bytes: 0,
                incremental_bytes: 0,
                sync_us: f.sync.as_micros() as u64,
                upload_us: f.upload.as_micros() as u64,
                alignment_us: f.alignment.as_micros() as u64,
                tasks: f.tasks,
                failure: Some(cause),
            });
            self.last_end = Instant::now();
        }
    }

    fn on_ack(&mut self, ack: CheckpointAck, tasks: &dyn Participants, view: &Arc<JobView>) -> Result<()> {
        let Some(f) = self.in_flight.as_mut() else { return Ok(()) };
        if ack.checkpoint != f.pending.id() {
            return Ok(()); // a late ack of an aborted checkpoint
        }
        f.sync = f.sync.max(ack.stats.sync);
        f.upload = f.upload.max(ack.stats.upload);
        f.alignment = f.alignment.max(ack.stats.alignment);
        if let Ok(snapshots) = &ack.snapshots {
            let name = |uid: &str| {
                view.plan
                    .operators
                    .iter()
                    .find(|o| o.uid == uid)
                    .map_or_else(|| uid.to_string(), |o| o.name.clone())
            };
            f.tasks.push(TaskCheckpointStats {
                operators: snapshots.iter().map(|(uid, _)| name(uid)).collect(),
                subtask: ack.subtask,
                alignment_us: ack.stats.alignment.as_micros() as u64,
                sync_us: ack.stats.sync.as_micros() as u64,
                upload_us: ack.stats.upload.as_micros() as u64,
                state_bytes: ack.stats.state_bytes,
                uploaded_bytes: ack.stats.uploaded_bytes,
            });
        }
        f.bytes += ack.stats.state_bytes;
        f.uploaded += ack.stats.uploaded_bytes;
        let snapshots = match ack.snapshots {
            Ok(s) => s,
            Err(reason) => {
                self.fail(view, format!("subtask {} declined: {reason}", ack.subtask));
                return Ok(());
            }
        };
        let mut all = false;
        for (uid, snapshot) in snapshots {
            let op = OperatorId::new(uid).map_err(state_err)?;
            match f.pending.acknowledge(&op, SubtaskIndex(ack.subtask), snapshot, now_ms() as u64) {
                Ok(AckOutcome::AllAcknowledged) => all = true,
                Ok(_) => {}
                Err(e) => {
                    let cause = e.to_string();
                    self.fail(view, cause);
                    return Ok(());
                }
            }
        }
        if all {
            self.complete(tasks, view)?;
        }
        Ok(())
    }

    fn complete(&mut self, tasks: &dyn Participants, view: &Arc<JobView>) -> Result<()> {
        let Some(mut f) = self.in_flight.take() else { return Ok(()) };
        let id = f.pending.id();
        crate::crash::point(crate::crash::BEFORE_METADATA, id);
        // A newer run restored meanwhile (this one was frozen or cut off): its checkpoint
        // must not complete, or this run's sinks would commit what the newer run writes again.
        match self.fence.check(&format!("completing checkpoint {}", id.0)) {
            Ok(()) => {}
            Err(e @ Error::Superseded(_)) => return Err(e),
            Err(e) => {
                self.in_flight = Some(f);
                self.fail(view, format!("reading the runs' claims: {e}"));
                return Ok(());
            }
        }
        match complete_checkpoint(
            self.store.as_ref(),
            &self.paths,
            &mut f.pending,
            &self.job,
            self.max_parallelism,
        ) {
            Ok(_) => {}
            Err(e) => {
                self.in_flight = Some(f);
                self.fail(view, format!("writing the metadata: {e}"));
                return Ok(());
            }
        }
        crate::crash::point(crate::crash::AFTER_METADATA_BEFORE_NOTIFY, id);
        tasks.complete(id);
        self.last_completed = Some(id);
        self.last_end = Instant::now();
        self.failed_in_a_row = 0;
        view.record_checkpoint(CheckpointStats {
            id: id.0,
            status: "COMPLETED".into(),
            trigger_ms: now_ms() - f.started.elapsed().as_millis() as i64,
            duration_ms: f.started.elapsed().as_millis() as u64,
            size_bytes: f.bytes,
            incremental_bytes: f.uploaded,
            sync_us: f.sync.as_micros() as u64,
            upload_us: f.upload.as_micros() as u64,
            alignment_us: f.alignment.as_micros() as u64,
            tasks: std::mem::take(&mut f.tasks),
            failure: None,
        });
        if let Some((_, name)) = self.savepoint.take_if(|(s, _)| *s == id) {
            self.copy_to_savepoint(id, name, view);
        }
        self.start_retention(id);
        Ok(())
    }

    /// Applies retention after checkpoint `id` on a thread of its own: a slow or unreachable
    /// store (whose client retries for minutes) must not stop the coordinator from
    /// triggering, timing out and failing checkpoints meanwhile. One at a time, and none
    /// while a savepoint is being copied (it must not delete the copy's files); a skipped
    /// one catches up at the next completion. A retention that started before a checkpoint
    /// completed deletes nothing that checkpoint or the one after it needs: it keeps the
    /// files of newer checkpoints and of its latest completed one, the only one the next
    /// snapshot reuses.
    fn start_retention(&mut self, id: CheckpointId) {
        self.copies.retain(|c| !c.is_finished());
        if !self.copies.is_empty() || self.retention.as_ref().is_some_and(|r| !r.is_finished()) {
            return;
        }
        let (store, paths, job) = (self.store.clone(), self.paths.clone(), self.job.clone());
        let config = RetentionConfig { retained_checkpoints: self.config.retained };
        let retain = move || {
            if let Err(e) = apply_retention(store.as_ref(), &paths, &job, &config) {
                tracing::warn!("caudal: retention after checkpoint {}: {e}", id.0);
            }
        };
        self.retention = std::thread::Builder::new().name("caudal-retention".into()).spawn(retain).ok();
    }

    /// Copies checkpoint `id` into `savepoints/<name>` on a thread of its own (a large state
    /// takes a while to copy; checkpoints go on meanwhile).
    fn copy_to_savepoint(&mut self, id: CheckpointId, name: String, view: &Arc<JobView>) {
        let (store, paths, job, view) =
            (self.store.clone(), self.paths.clone(), self.job.clone(), view.clone());
        let copy = move || {
            let result = caudal_checkpoints::create_savepoint(store.as_ref(), &paths, id, &name, &job);
            match &result {
                Ok(_) => tracing::info!(
                    "caudal: savepoint `{name}` of {} written to {}/{}savepoints/{name}",
                    id.label(),
                    store.location(),
                    paths.root()
                ),
                Err(e) => tracing::warn!("caudal: savepoint `{name}` of {}: {e}", id.label()),
            }
            view.update_savepoint(&name, |s| match result {
                Ok(_) => {
                    s.status = "COMPLETED".into();
                    s.path = Some(format!("savepoints/{name}"));
                }
                Err(e) => {
                    s.status = "FAILED".into();
                    s.failure = Some(format!("copying {}: {e}", id.label()));
                }
            });
        };
        match std::thread::Builder::new().name("savepoint-copy".into()).spawn(copy) {
            Ok(handle) => self.copies.push(handle),
            Err(e) => tracing::warn!("caudal: cannot start the savepoint copy: {e}"),
        }
    }

    /// One step: collect acks, time out, trigger when due. `stop_requested`: take a final
    /// checkpoint, then tell the caller to stop the sources.
    pub(crate) fn tick(
        &mut self,
        tasks: &dyn Participants,
        view: &Arc<JobView>,
        stop_requested: bool,
    ) -> Result<Tick> {
        while let Ok(ack) = self.acks.try_recv() {
            self.on_ack(ack, tasks, view)?;
        }
        if let Some(f) = self.in_flight.as_mut() {
            if f.pending.check_timeout(now_ms() as u64) {
                let cause = format!("timed out after {:?}", self.config.timeout);
                self.fail(view, cause);
            }
        }
        // The end-of-input rule: sources stop (and sinks close) only after the final
        // checkpoint completed; one that does not complete in time fails the job instead.
        if stop_requested {
            let waited = self.stopping_since.get_or_insert_with(Instant::now).elapsed();
            if waited > self.stop_timeout() && !self.final_checkpoint_done() {
                return Err(self.final_checkpoint_overdue(waited));
            }
        }
        // A task that finished cannot take part in a checkpoint: no more checkpoints. (Tasks
        // wait for the final checkpoint before they finish; one that finished failed, and the
        // job fails with its error.)
        let some_finished = tasks.any_finished();
        if some_finished {
            if self.in_flight.is_some() {
                self.fail(view, "a task finished before acknowledging".into());
            }
            return Ok(if stop_requested && self.final_checkpoint_done() {
                Tick::StopSources
            } else {
                Tick::Continue
            });
        }
        if self.failed_in_a_row > self.config.tolerable_failed_checkpoints {
            return Err(self.checkpointing_failed());
        }
        if stop_requested {
            match self.final_checkpoint {
                Some(id) if self.last_completed >= Some(id) => return Ok(Tick::StopSources),
                // It failed, and the job tolerates that: take another.
                Some(_) if self.in_flight.is_none() => {
                    self.final_checkpoint = Some(self.next_id);
                    crate::crash::mark_final(self.next_id);
                    self.trigger(tasks, view);
                    return Ok(Tick::Continue);
                }
                Some(_) => return Ok(Tick::Continue),
                // A checkpoint in flight cannot be the final one: its barrier may have left the
                // sources before the end of their input, and the records after it would never
                // be committed. Let it finish, then take the final checkpoint.
                None if self.in_flight.is_some() => return Ok(Tick::Continue),
                None => {
                    self.final_checkpoint = Some(self.next_id);
                    crate::crash::mark_final(self.next_id);
                    self.trigger(tasks, view);
                    return Ok(Tick::Continue);
                }
            }
        }
        // A requested savepoint: a checkpoint now, after the one in flight.
        if self.in_flight.is_none() {
            if let Some(name) = view.next_pending_savepoint() {
                let id = self.next_id;
                view.update_savepoint(&name, |s| {
                    s.status = "IN_PROGRESS".into();
                    s.checkpoint = Some(id.0);
                });
                self.savepoint = Some((id, name));
                self.trigger(tasks, view);
                return Ok(Tick::Continue);
            }
        }
        let Some(interval) = self.config.interval else { return Ok(Tick::Continue) };
        if self.in_flight.is_none() && self.last_end.elapsed() >= interval.max(self.config.min_pause) {
            self.trigger(tasks, view);
        }
        Ok(Tick::Continue)
    }

    /// Copies the final checkpoint of a stop into the savepoint `savepoints/<name>` (kept until
    /// deleted); returns its restore path.
    pub(crate) fn savepoint_of_final_checkpoint(&self, name: &str) -> Result<String> {
        let id = match (self.final_checkpoint, self.last_completed) {
            (Some(f), Some(done)) if done >= f => done,
            _ => {
                return Err(Error::CheckpointsFailed(format!(
                "savepoint `{name}`: the final checkpoint of the stop did not complete (last completed: {})",
                self.last_completed.map_or_else(|| "none".into(), |c| c.label())
            )))
            }
        };
        caudal_checkpoints::create_savepoint(self.store.as_ref(), &self.paths, id, name, &self.job).map_err(
            |e| Error::CheckpointStorage {
                context: format!("savepoint `{name}` of {}", id.label()),
                source: Box::new(e),
            },
        )?;
        let dir = self.paths.savepoint_dir(name).map_err(state_err)?;
        tracing::info!("caudal: savepoint of {} written to {}/{dir}", id.label(), self.store.location());
        Ok(format!("savepoints/{name}"))
    }

    /// True when the final checkpoint of a stop or of the end of input completed.
    fn final_checkpoint_done(&self) -> bool {
        self.final_checkpoint.is_some_and(|f| self.last_completed >= Some(f))
    }

    /// The job fails: checkpoints failed beyond what it tolerates.
    fn checkpointing_failed(&self) -> Error {
        Error::CheckpointsFailed(format!(
            "{} checkpoint(s) failed in a row, more than tolerable_failed_checkpoints = {} \
             (CAUDAL__TOLERABLE_FAILED_CHECKPOINTS); last: {}. Nothing after checkpoint {} is committed: \
             restore from it to continue",
            self.failed_in_a_row,
            self.config.tolerable_failed_checkpoints,
            self.last_failure.as_deref().unwrap_or("unknown"),
            self.resume_point(),
        ))
    }

    /// The job fails: its final checkpoint did not complete within `waited`.
    fn final_checkpoint_overdue(&self, waited: Duration) -> Error {
        Error::CheckpointsFailed(format!(
            "the final checkpoint did not complete within {waited:?}; nothing after checkpoint {} is \
             committed: restore from it to finish the job",
            self.resume_point(),
        ))
    }

    /// The checkpoint a restore after a failure continues from, as the messages name it.
    fn resume_point(&self) -> String {
        self.last_completed.map_or_else(|| "none (start again)".into(), |c| c.label())
    }

    /// How long a stop may wait for its final checkpoint: the checkpoint in flight may
    /// take the timeout, then the final one too.
    fn stop_timeout(&self) -> Duration {
        self.config.timeout.saturating_mul(2)
    }
}

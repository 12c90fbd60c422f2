//! [`IcebergCommitter`]: the single committer of an Iceberg sink — the writers' data files
//! in, one table snapshot per completed checkpoint out.
//!
//! **Protocol.** The writers' [`DataFiles`] for epoch `n` arrive before barrier `n` (they
//! are emitted ahead of it). At barrier `n` the committer records them as pending in its
//! snapshot. When checkpoint `n` completes it commits each pending epoch `≤ n`, oldest first,
//! as one fast-append snapshot whose summary carries the job, the sink, the run and the
//! checkpoint id. Before every attempt it reads the table: an epoch whose checkpoint id is
//! already in the run's newest snapshot (walking back from the current one) is not
//! committed again — a commit that landed before a crash, or before an answer was lost, is
//! never repeated (Flink's `max-committed-checkpoint-id` rule) — and the commit goes on top of
//! the very table looked at, or not at all ([`super::catalog`]). That look comes before every
//! retry too: a conflict is not retried inside Iceberg's transaction (it would append the
//! files again on top of whatever came first), and a commit whose answer was lost — the SQL
//! catalog's connection dropped, a REST catalog's `5xx` or timeout — is retried only after
//! the table has been read again ([`super::catalog`]).
//!
//! **Restore from `m`.** The pending epochs `≤ m` of the restored snapshot belong to
//! completed checkpoints: they are committed (unless already in the table). Then every data
//! file that an earlier attempt of this run (the restored line of checkpoints; each
//! checkpoint lists the attempts that wrote for it) left and that no snapshot of the table
//! references is deleted: it holds records the restored job writes again. Files of other
//! runs — another deployment of the same job writing the same table — are never touched,
//! nor files an older snapshot still references (time travel after a compaction).
//!
//! One committer per table (parallelism 1), rather than one commit per writer: one snapshot
//! per checkpoint, no commit conflicts between subtasks, and the time-travel rule "the
//! snapshot of checkpoint `n` holds exactly the records before barrier `n`".

use super::config::IcebergConfig;
use super::table::{classify, summary, TableClient};
use super::writer::{file_prefix, name_part, DataFiles};
use crate::retry::Failure;
use caudal::types::MAX_WATERMARK;
use caudal::{crash, Batch, CheckpointId, Error, OperatorContext, Result, Sink};
use iceberg::spec::{deserialize_data_file_from_json, DataFile, TableMetadata};
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::ErrorKind;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What the committer keeps in a checkpoint.
#[derive(Debug, Default, Serialize, Deserialize)]
struct CommitterState {
    run: String,
    pending: Vec<DataFiles>,
    /// The attempts of this run so far (their data files are named after them); absent in
    /// the states of releases before it, whose restores fall back to the sink's file prefix.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    attempts: Vec<String>,
}

/// Commits the files of an Iceberg sink's writers, once per checkpoint.
pub struct IcebergCommitter {
    config: IcebergConfig,
    sink: String,
    client: Option<TableClient>,
    run: String,
    job: String,
    attempt: String,
    received: Vec<DataFiles>,
    pending: Vec<DataFiles>,
    /// The attempts of this run, this one included once started.
    attempts: Vec<String>,
    checkpointing: bool,
    what: String,
    metrics: Arc<caudal::metrics::SubtaskMetrics>,
}

impl std::fmt::Debug for IcebergCommitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IcebergCommitter({})", self.config.table)
    }
}

/// The newest checkpoint id `run` of `sink` committed: the table property its commits set,
/// or (tables committed by releases before it) walking back from the current snapshot; 0
/// when none.
pub fn committed_checkpoint(metadata: &TableMetadata, sink: &str, run: &str) -> u64 {
    let recorded =
        metadata.properties().get(&summary::committed_property(sink, run)).and_then(|c| c.parse().ok());
    recorded.unwrap_or(0).max(committed_in_snapshots(metadata, sink, run))
}

/// The newest checkpoint id `run` of `sink` committed among the current snapshot and its
/// ancestors still in the table.
fn committed_in_snapshots(metadata: &TableMetadata, sink: &str, run: &str) -> u64 {
    let mut next = metadata.current_snapshot_id();
    while let Some(snapshot) = next.and_then(|id| metadata.snapshot_by_id(id)) {
        let p = &snapshot.summary().additional_properties;
        if p.get(summary::RUN).map(String::as_str) == Some(run)
            && p.get(summary::SINK).map(String::as_str) == Some(sink)
        {
            return p.get(summary::CHECKPOINT).and_then(|c| c.parse().ok()).unwrap_or(0);
        }
        next = snapshot.parent_snapshot_id();
    }
    0
}

impl IcebergCommitter {
    pub(crate) fn new(config: IcebergConfig, sink: String) -> Self {
        IcebergCommitter {
            what: format!("iceberg committer ({})", config.table),
            config,
            sink,
            client: None,
            run: String::new(),
            job: String::new(),
            attempt: String::new(),
            received: Vec::new(),
            pending: Vec::new(),
            attempts: Vec::new(),
            checkpointing: false,
            metrics: Arc::default(),
        }
    }

    fn init(&mut self, ctx: &OperatorContext) -> Result<()> {
        if self.client.is_some() {
            return Ok(());
        }
        self.what = format!("iceberg committer `{}` ({})", ctx.operator_name, self.config.table);
        self.job = ctx.job_name.clone();
        self.attempt = ctx.attempt.clone();
        self.checkpointing = ctx.checkpointing;
        self.metrics = ctx.metrics.clone();
        let retries = ctx.metrics.counter(caudal::metrics::names::SINK_RETRIES);
        self.client = Some(TableClient::new(&self.config, self.what.clone(), retries)?);
        Ok(())
    }

    fn client(&mut self) -> Result<&mut TableClient> {
        let what = &self.what;
        self.client.as_mut().ok_or_else(|| Error::Internal(format!("{what}: not started")))
    }

    /// Commits every pending epoch up to `checkpoint`, oldest first.
    fn commit_due(&mut self, checkpoint: u64) -> Result<()> {
        let (due, rest): (Vec<DataFiles>, Vec<DataFiles>) =
            std::mem::take(&mut self.pending).into_iter().partition(|f| f.checkpoint <= checkpoint);
        self.pending = rest;
        let mut epochs: BTreeMap<u64, Vec<DataFiles>> = BTreeMap::new();
        for f in due {
            epochs.entry(f.checkpoint).or_default().push(f);
        }
        for (i, (epoch, files)) in epochs.into_iter().enumerate() {
            self.commit_epoch(epoch, &files)?;
            if i == 0 && epoch != u64::MAX {
                crash::point(crash::DURING_SINK_COMMIT, CheckpointId(epoch));
            }
        }
        Ok(())
    }

    /// Commits `files` as the snapshot of checkpoint `epoch` (`u64::MAX`: the end of an
    /// input without checkpoints), unless the table has it already.
    fn commit_epoch(&mut self, epoch: u64, files: &[DataFiles]) -> Result<()> {
        let (job, sink, run) = (self.job.clone(), self.sink.clone(), self.run.clone());
        let rows: u64 = files.iter().map(|f| f.rows).sum();
        let keep = self.config.keep_snapshots;
        let started = std::time::Instant::now();
        let metrics = self.metrics.clone();
        let client = self.client()?;
        let committed = client.retry(&format!("committing checkpoint {epoch}"), |c| {
            let table = c.load()?;
            if epoch != u64::MAX && committed_checkpoint(table.metadata(), &sink, &run) >= epoch {
                return Ok(None);
            }
            if epoch != u64::MAX {
                crash::point(crash::ICEBERG_AFTER_TABLE_CHECK, CheckpointId(epoch));
            }
            let data_files = decode(table.metadata(), files)?;
            let mut props = HashMap::from([
                (summary::JOB.to_string(), job.clone()),
                (summary::SINK.to_string(), sink.clone()),
                (summary::RUN.to_string(), run.clone()),
            ]);
            if epoch != u64::MAX {
                props.insert(summary::CHECKPOINT.to_string(), epoch.to_string());
            }
            let tx = Transaction::new(&table);
            // Duplicates are ruled out by the checkpoint id above; Iceberg's own check
            // would read every manifest of the table at each commit.
            let append = tx
                .fast_append()
                .with_check_duplicate(false)
                .add_data_files(data_files)
                .set_snapshot_properties(props);
            let tx = append.apply(tx).map_err(|e| classify(&e))?;
            // The guard above, kept where snapshot expiry cannot take it away.
            let tx = if epoch == u64::MAX {
                tx
            } else {
                let property = tx
                    .update_table_properties()
                    .set(summary::committed_property(&sink, &run), epoch.to_string());
                property.apply(tx).map_err(|e| classify(&e))?
            };
            let (catalog, rt) = c.catalog()?;
            match rt.block_on(super::catalog::committing(epoch, &table, tx.commit(catalog))) {
                Ok(t) => Ok(Some(t)),
                Err(e) if e.kind() == ErrorKind::CatalogCommitConflicts => {
                    Err(Failure::Transient(format!("another writer committed first: {e:#}")))
                }
                Err(e) => Err(classify(&e)),
            }
        })?;
        match committed {
            Some(table) => {
                let count =
                    |name: &'static str, n: u64| metrics.counter(name).fetch_add(n, Ordering::Relaxed);
                count(super::metrics::COMMITS, 1);
                count(super::metrics::COMMIT_MS, started.elapsed().as_millis() as u64);
                count(super::metrics::FILES, files.iter().map(|f| f.files.len() as u64).sum());
                count(super::metrics::FILE_BYTES, files.iter().map(|f| f.bytes).sum());
                tracing::debug!("caudal: {}: committed checkpoint {epoch} ({rows} rows)", client.what);
                if let Some(keep) = keep {
                    expire(client, &table, keep);
                }
            }
            None => tracing::info!(
                "caudal: {}: checkpoint {epoch} was committed before (found in the table): not again",
                client.what
            ),
        }
        Ok(())
    }

    /// Deletes the data files of this run's earlier attempts that no snapshot references.
    fn delete_orphans(&mut self) -> Result<()> {
        let prefix = file_prefix(&self.job, &self.sink);
        let current = format!("{prefix}{}.", name_part(&self.attempt));
        // A state of an earlier release names no attempts: the sink's prefix, as then.
        let earlier: Vec<String> = if self.attempts.is_empty() {
            vec![prefix.clone()]
        } else {
            self.attempts
                .iter()
                .filter(|a| **a != self.attempt)
                .map(|a| format!("{prefix}{}.", name_part(a)))
                .collect()
        };
        let s3 = self.config.s3.clone();
        let client = self.client()?;
        let (table, live) = client.retry("listing live data files", |c| {
            let table = c.load()?;
            let live = c.block(live_files(&table)).map_err(|e| classify(&e))?;
            Ok((table, live))
        })?;
        let data = format!("{}/data", table.metadata().location().trim_end_matches('/'));
        let listed = client.retry("listing data files", |c| {
            c.block(super::storage::list(&s3, &data)).map_err(|e| classify(&e))
        })?;
        let mut deleted = 0;
        for path in listed {
            let name = path.rsplit('/').next().unwrap_or_default();
            let ours = earlier.iter().any(|p| name.starts_with(p.as_str())) && !name.starts_with(&current);
            if ours && !live.contains(&super::storage::canonical(&path)) {
                client.retry("deleting an uncommitted data file", |c| {
                    c.block(c.file_io().delete(&path)).map_err(|e| classify(&e))
                })?;
                deleted += 1;
            }
        }
        if deleted > 0 {
            tracing::info!("caudal: {}: deleted {deleted} data file(s) no checkpoint completed", client.what);
        }
        Ok(())
    }
}

/// The writers' files as Iceberg data files of `metadata`'s specs and schemas.
fn decode(metadata: &TableMetadata, files: &[DataFiles]) -> std::result::Result<Vec<DataFile>, Failure> {
    let mut out = Vec::new();
    for f in files {
        let spec = metadata
            .partition_spec_by_id(f.spec_id)
            .ok_or_else(|| Failure::Permanent(format!("the table has no partition spec {}", f.spec_id)))?;
        let schema = metadata
            .schema_by_id(f.schema_id)
            .ok_or_else(|| Failure::Permanent(format!("the table has no schema {}", f.schema_id)))?;
        let partition_type = spec.partition_type(schema).map_err(|e| Failure::Permanent(format!("{e:#}")))?;
        for json in &f.files {
            out.push(
                deserialize_data_file_from_json(json, f.spec_id, &partition_type, schema)
                    .map_err(|e| Failure::Permanent(format!("a writer's data file: {e:#}")))?,
            );
        }
    }
    Ok(out)
}

/// Every data file a snapshot of the table references — not only the current one: after a
/// compaction an older snapshot (time travel) still reads the files it replaced. As
/// [`super::storage::canonical`] locations, to be compared with a listing.
async fn live_files(table: &Table) -> iceberg::Result<HashSet<String>> {
    let mut live = HashSet::new();
    let mut manifests = HashSet::new();
    for snapshot in table.metadata().snapshots() {
        let list = table.manifest_list_reader(snapshot).load().await?;
        for manifest in list.entries() {
            if !manifests.insert(manifest.manifest_path.clone()) {
                continue;
            }
            for entry in manifest.load_manifest(table.file_io()).await?.entries() {
                live.insert(super::storage::canonical(entry.file_path()));
            }
        }
    }
    Ok(live)
}

/// Expires all but the newest `keep` snapshots; a failure is logged and left for the next
/// commit.
fn expire(client: &mut TableClient, table: &Table, keep: usize) {
    if table.metadata().snapshots().len() <= keep {
        return;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let tx = Transaction::new(table);
    let action = tx.expire_snapshots().retain_last(keep).expire_older_than_ms(now + 1);
    let what = client.what.clone();
    let result = action.apply(tx).and_then(|tx| match client.catalog() {
        Ok((catalog, rt)) => rt.block_on(tx.commit(catalog)),
        Err(f) => Err(iceberg::Error::new(ErrorKind::Unexpected, f.message().to_string())),
    });
    if let Err(e) = result {
        tracing::warn!("caudal: {what}: expiring snapshots: {e:#} (tried again after the next commit)");
    }
}

impl Sink for IcebergCommitter {
    type In = DataFiles;

    fn restore(&mut self, snapshots: Vec<Vec<u8>>, ctx: &mut OperatorContext) -> Result<()> {
        self.init(ctx)?;
        let restored = ctx.restored_checkpoint.map_or(0, |c| c.0);
        for blob in snapshots {
            let state: CommitterState = serde_json::from_slice(&blob)
                .map_err(|e| Error::CorruptState(format!("{}: corrupt committer state: {e}", self.what)))?;
            if self.run.is_empty() {
                self.run = state.run;
            }
            for a in state.attempts {
                if !self.attempts.contains(&a) {
                    self.attempts.push(a);
                }
            }
            self.pending.extend(state.pending.into_iter().filter(|f| f.checkpoint <= restored));
        }
        self.commit_due(restored)?;
        self.delete_orphans()
    }

    fn on_start(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        self.init(ctx)?;
        if self.run.is_empty() {
            self.run = uuid::Uuid::new_v4().to_string();
        }
        if !self.attempts.contains(&self.attempt) {
            self.attempts.push(self.attempt.clone());
        }
        Ok(())
    }

    fn write_batch(&mut self, batch: Batch<DataFiles>, _ctx: &mut OperatorContext) -> Result<()> {
        self.received.extend(batch.into_iter().map(|r| r.value));
        Ok(())
    }

    fn pre_commit(
        &mut self,
        _checkpoint: CheckpointId,
        _ctx: &mut OperatorContext,
    ) -> Result<Option<Vec<u8>>> {
        self.pending.append(&mut self.received);
        let state = CommitterState {
            run: self.run.clone(),
            pending: self.pending.clone(),
            attempts: self.attempts.clone(),
        };
        serde_json::to_vec(&state)
            .map(Some)
            .map_err(|e| Error::Internal(format!("{}: encoding committer state: {e}", self.what)))
    }

    fn on_checkpoint_complete(&mut self, checkpoint: CheckpointId, _ctx: &mut OperatorContext) -> Result<()> {
        self.commit_due(checkpoint.0)
    }

    fn on_close(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        let end_of_input = ctx.watermark == MAX_WATERMARK;
        if self.checkpointing && !end_of_input {
            // Stopped or cancelled: a restore commits what its checkpoint recorded.
            return Ok(());
        }
        self.pending.append(&mut self.received);
        self.commit_due(u64::MAX)
    }
}

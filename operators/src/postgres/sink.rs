//! [`PostgresSink`]: upserts with one prepared transaction per checkpoint epoch.
//!
//! Epoch `n` (the records between barriers `n-1` and `n`) is written in one database
//! transaction on the sink's data connection, `batch_rows` rows per
//! `INSERT … SELECT * FROM unnest(…) ON CONFLICT (key) DO UPDATE`. At barrier `n` the
//! transaction records its id in `caudal_sink_epochs` and is prepared
//! (`PREPARE TRANSACTION`); the id goes into the checkpoint. When `n` completes, a second
//! (control) connection runs `COMMIT PREPARED`. On restore from `n`, subtask 0 commits
//! the transactions recorded in `n` (or finds them in `caudal_sink_epochs`, committed) and
//! rolls back every other prepared transaction of this sink from earlier runs: their
//! records are replayed. A fresh start rolls back all of them.
//!
//! The rows of the open epoch stay in memory until it is prepared: if the connection breaks
//! mid-epoch (the transaction is gone with it), the sink reconnects with backoff and sends
//! them again. Meanwhile the task blocks: the job backpressures, nothing is dropped.

use super::buffer::{RowBuffer, Shape};
use super::client::{block, block_raw, classify, runtime, Connection};
use super::config::{quote, PostgresSinkConfig};
use super::row::{to_row, SqlValue};
use super::tls::MakeRustls;
use super::txn::{self, EpochIds, EpochSql, HeldEpoch, PreparedEpoch, SinkState};
use crate::retry::Failure;
use caudal::types::MAX_WATERMARK;
use caudal::{crash, Batch, CheckpointId, Data, Error, OperatorContext, Result, Sink};
use serde::Serialize;
use std::collections::HashSet;
use std::marker::PhantomData;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};

/// The SQL of the sink's table, derived from the first record.
#[derive(Debug, Clone)]
struct TableSql {
    schema: String,
    table: String,
    qualified: String,
    create: String,
    upsert: String,
    /// `(column, ALTER TABLE … ADD COLUMN …)` of every column that is not in the key: a
    /// record type that gained a field adds it to an existing table (nullable: the rows
    /// written before have none).
    add_columns: Vec<(String, String)>,
}

impl TableSql {
    fn new(schema: &str, table: &str, shape: &Shape, key: &[String]) -> TableSql {
        let t = format!("{}.{}", quote(schema), quote(table));
        let columns: Vec<String> = shape.names.iter().map(|n| quote(n)).collect();
        let defs: Vec<String> = shape
            .names
            .iter()
            .zip(&shape.types)
            .map(|(n, ty)| format!("{} {} NOT NULL", quote(n), ty.ddl()))
            .collect();
        let keys: Vec<String> = key.iter().map(|k| quote(k)).collect();
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {t} ({}, PRIMARY KEY ({}))",
            defs.join(", "),
            keys.join(", ")
        );
        let unnest: Vec<String> = shape
            .types
            .iter()
            .enumerate()
            .map(|(i, ty)| format!("${}::{}", i + 1, ty.array_cast()))
            .collect();
        let updates: Vec<String> = shape
            .names
            .iter()
            .filter(|n| !key.iter().any(|k| k == *n))
            .map(|n| format!("{c} = EXCLUDED.{c}", c = quote(n)))
            .collect();
        let action = if updates.is_empty() {
            "DO NOTHING".to_string()
        } else {
            format!("DO UPDATE SET {}", updates.join(", "))
        };
        let upsert = format!(
            "INSERT INTO {t} ({}) SELECT * FROM unnest({}) ON CONFLICT ({}) {action}",
            columns.join(", "),
            unnest.join(", "),
            keys.join(", ")
        );
        let add_columns = shape
            .names
            .iter()
            .zip(&shape.types)
            .filter(|(n, _)| !key.iter().any(|k| k == *n))
            .map(|(n, ty)| {
                (n.to_string(), format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {} {}", quote(n), ty.ddl()))
            })
            .collect();
        TableSql { schema: schema.into(), table: table.into(), qualified: t, create, upsert, add_columns }
    }
}

/// Upserts records of type `T` into a PostgreSQL table, exactly once per checkpoint epoch.
pub struct PostgresSink<T> {
    config: PostgresSinkConfig,
    rt: Option<tokio::runtime::Runtime>,
    data: Connection,
    control: Connection,
    epoch_sql: EpochSql,
    table: Option<TableSql>,
    upsert: Option<Statement>,
    rows: Option<RowBuffer>,
    row: Vec<(&'static str, SqlValue)>,
    /// Rows of `rows` sent in the open transaction.
    sent: usize,
    /// A transaction is open on the data connection.
    in_txn: bool,
    first_unsent: Option<Instant>,
    pending: Vec<PreparedEpoch>,
    /// Epochs closed while an earlier one was still prepared: in the checkpoint, written
    /// when a checkpoint covering them completes (see [`HeldEpoch`]).
    held: Vec<HeldEpoch>,
    /// The open epoch's records while it may have to be held (an earlier epoch prepared or
    /// held since the epoch began).
    stash: Vec<T>,
    ids: Option<EpochIds>,
    what: String,
    checkpointing: bool,
    /// This run claimed the sink (see `txn`'s fencing).
    claimed: bool,
    /// The last checkpoint barrier seen (or restored): the open epoch is the next one.
    last_barrier: u64,
    retries: Arc<AtomicU64>,
    _t: PhantomData<fn(T)>,
}

impl<T> std::fmt::Debug for PostgresSink<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PostgresSink({}.{})", self.config.schema, self.config.table)
    }
}

fn internal(what: &str) -> Failure {
    Failure::Permanent(format!("internal: {what}"))
}

/// Runs one DDL statement. Another subtask creating the same object at the same moment is
/// success: PostgreSQL makes the second `CREATE` wait for the first one's transaction and
/// fails it (duplicate, or a unique violation in the catalog) only once that committed, so the
/// object exists.
fn ddl(rt: &tokio::runtime::Runtime, timeout: Duration, client: &Client, sql: &str) -> Result<(), Failure> {
    match block_raw(rt, timeout, "creating tables", client.batch_execute(sql))? {
        Ok(()) => Ok(()),
        Err(e)
            if [
                SqlState::UNIQUE_VIOLATION,
                SqlState::DUPLICATE_TABLE,
                SqlState::DUPLICATE_SCHEMA,
                SqlState::DUPLICATE_OBJECT,
            ]
            .iter()
            .any(|s| e.code() == Some(s)) =>
        {
            Ok(())
        }
        Err(e) => Err(classify("creating tables", &e)),
    }
}

/// Creates a table unless it exists (`CREATE TABLE IF NOT EXISTS` alone would need the
/// CREATE privilege on the schema even when the table is there).
fn create_table(
    rt: &tokio::runtime::Runtime,
    timeout: Duration,
    client: &Client,
    qualified: &str,
    create: &str,
) -> Result<(), Failure> {
    let found = block(
        rt,
        timeout,
        "looking up a table",
        client.query_one("SELECT to_regclass($1)::text", &[&qualified]),
    )?;
    if found.get::<_, Option<String>>(0).is_some() {
        return Ok(());
    }
    ddl(rt, timeout, client, create)
}

/// Adds the columns of `table` an existing table lacks (the record type gained a field).
///
/// `ALTER TABLE` waits for every lock on the table, and a prepared transaction of another
/// subtask holds one until its checkpoint completes — which waits for this subtask: the
/// `ALTER` gives up after [`ALTER_LOCK_TIMEOUT`], and when another subtask added the column
/// meanwhile that is as good; otherwise it is retried.
fn add_missing_columns(
    rt: &tokio::runtime::Runtime,
    timeout: Duration,
    client: &Client,
    table: &TableSql,
) -> Result<(), Failure> {
    let present = |what: &str| -> Result<Vec<String>, Failure> {
        let rows = block(
            rt,
            timeout,
            what,
            client.query(
                "SELECT column_name::text FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2",
                &[&table.schema, &table.table],
            ),
        )?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    };
    let before = present("looking up the table's columns")?;
    for (column, alter) in table.add_columns.iter().filter(|(c, _)| !before.contains(c)) {
        tracing::info!("PostgreSQL sink: adding column `{column}` to {}", table.qualified);
        let sql = format!(
            "BEGIN; SET LOCAL lock_timeout = '{}ms'; {alter}; COMMIT",
            ALTER_LOCK_TIMEOUT.as_millis()
        );
        if let Err(e) = block_raw(rt, timeout, "adding a column", client.batch_execute(&sql))? {
            let _ = block_raw(rt, timeout, "rolling back", client.batch_execute("ROLLBACK"))?;
            if !present("looking up the table's columns again")?.contains(column) {
                return Err(classify(&format!("adding column `{column}`"), &e));
            }
        }
    }
    Ok(())
}

/// How long adding a column waits for the table's locks.
const ALTER_LOCK_TIMEOUT: Duration = Duration::from_secs(2);

/// Creates the schema (unless it exists: creating needs a privilege using does not) and
/// the `caudal_sink_epochs` table.
fn bookkeeping(
    rt: &tokio::runtime::Runtime,
    timeout: Duration,
    client: &Client,
    schema: &str,
    epoch_sql: &EpochSql,
) -> Result<(), Failure> {
    let exists = block(
        rt,
        timeout,
        "looking up the schema",
        client.query_opt("SELECT 1 FROM pg_namespace WHERE nspname = $1", &[&schema]),
    )?;
    if exists.is_none() {
        ddl(rt, timeout, client, &format!("CREATE SCHEMA IF NOT EXISTS {}", quote(schema)))?;
    }
    create_table(rt, timeout, client, &epoch_sql.qualified, &epoch_sql.create)?;
    create_table(rt, timeout, client, &epoch_sql.fences, &epoch_sql.create_fences)
}

/// Fails, rolling nothing forward, when a later run claimed the sink (see `txn`).
fn check_claim(
    rt: &tokio::runtime::Runtime,
    timeout: Duration,
    client: &Client,
    fence_of: &str,
    ids: &EpochIds,
    what: &str,
) -> Result<(), Failure> {
    let row = block(rt, timeout, "reading the sink's claim", client.query_opt(fence_of, &[&ids.prefix]))?;
    match row.map(|r| r.get::<_, String>(0)) {
        Some(claimant) if claimant != ids.attempt => Err(Failure::Permanent(format!(
            "{what}: fenced: a later run of this job (attempt {claimant}) writes this table now; \
             this run (attempt {}) stops without preparing",
            ids.attempt
        ))),
        _ => Ok(()),
    }
}

/// Checks the server's `max_prepared_transactions` (as `SHOW` prints it).
fn prepared_transactions_enabled(max: &str) -> Result<(), String> {
    match max.trim().parse::<u64>() {
        Ok(n) if n > 0 => Ok(()),
        _ => Err(format!(
            "the server has max_prepared_transactions = {max}: exactly-once writes need prepared \
             transactions; set max_prepared_transactions to at least twice the number of sink subtasks \
             in postgresql.conf and restart PostgreSQL (or run the job without checkpoints)"
        )),
    }
}

impl<T> PostgresSink<T> {
    pub(crate) fn new(config: PostgresSinkConfig, pg: tokio_postgres::Config, tls: MakeRustls) -> Self {
        let timeout = Duration::from_secs(config.timeout_secs);
        PostgresSink {
            epoch_sql: EpochSql::new(&config.schema),
            what: format!("PostgreSQL sink ({}.{})", config.schema, config.table),
            data: Connection::new(pg.clone(), tls.clone(), timeout),
            control: Connection::new(pg, tls, timeout),
            config,
            rt: None,
            table: None,
            upsert: None,
            rows: None,
            row: Vec::new(),
            sent: 0,
            in_txn: false,
            first_unsent: None,
            pending: Vec::new(),
            held: Vec::new(),
            stash: Vec::new(),
            ids: None,
            checkpointing: false,
            claimed: false,
            last_barrier: 0,
            retries: Arc::new(AtomicU64::new(0)),
            _t: PhantomData,
        }
    }

    fn init(&mut self, ctx: &OperatorContext) -> Result<()> {
        if self.rt.is_none() {
            self.rt = Some(runtime().map_err(|e| Error::io("starting the PostgreSQL sink's runtime", e))?);
        }
        let database = self.data_config_db();
        self.ids = Some(EpochIds::new(
            &ctx.job_name,
            &ctx.operator_name,
            &database,
            &self.config.schema,
            &self.config.table,
            ctx.subtask,
            &ctx.attempt,
        ));
        self.checkpointing = ctx.checkpointing;
        if let Some(ids) = &self.ids {
            let name = ids.application_name();
            self.data.set_application_name(&name);
            self.control.set_application_name(&name);
        }
        self.retries = ctx.metrics.counter(caudal::metrics::names::SINK_RETRIES);
        self.what = format!(
            "PostgreSQL sink `{}`[{}] ({}.{})",
            ctx.operator_name, ctx.subtask, self.config.schema, self.config.table
        );
        Ok(())
    }

    fn data_config_db(&self) -> String {
        self.config
            .connection()
            .ok()
            .and_then(|(c, _)| c.get_dbname().map(str::to_string))
            .unwrap_or_default()
    }

    fn timeout(&self) -> Duration {
        self.data.timeout()
    }

    /// Connects the data connection if needed and (re)creates tables and the statement.
    fn connect_data(&mut self) -> Result<(), Failure> {
        let rt = self.rt.as_ref().ok_or_else(|| internal("no runtime"))?;
        let timeout = self.data.timeout();
        let (client, fresh) = self.data.get(rt)?;
        if !fresh && self.upsert.is_some() {
            return Ok(());
        }
        self.in_txn = false;
        self.sent = 0;
        self.upsert = None;
        bookkeeping(rt, timeout, client, &self.config.schema, &self.epoch_sql)?;
        if let Some(ids) = self.ids.as_ref().filter(|_| self.checkpointing) {
            check_claim(rt, timeout, client, &self.epoch_sql.fence_of, ids, &self.what)?;
        }
        if let Some(table) = &self.table {
            create_table(rt, timeout, client, &table.qualified, &table.create)?;
            add_missing_columns(rt, timeout, client, table)?;
            self.upsert = Some(block(rt, timeout, "preparing the upsert", client.prepare(&table.upsert))?);
        }
        Ok(())
    }

    /// Sends the rows not yet in the open transaction (opening it, and after a reconnect
    /// sending the whole epoch again).
    fn try_send(&mut self) -> Result<(), Failure> {
        self.connect_data()?;
        let rt = self.rt.as_ref().ok_or_else(|| internal("no runtime"))?;
        let timeout = self.data.timeout();
        let (client, _) = self.data.get(rt)?;
        if !self.in_txn {
            block(rt, timeout, "beginning a transaction", client.batch_execute("BEGIN"))?;
            self.in_txn = true;
            self.sent = 0;
        }
        let Some(rows) = self.rows.as_ref() else { return Ok(()) };
        let Some(stmt) = self.upsert.as_ref() else { return Err(internal("no upsert statement")) };
        while self.sent < rows.len() {
            let end = (self.sent + self.config.batch_rows).min(rows.len());
            let distinct = rows.distinct_rows(self.sent..end);
            let params = rows.params(&distinct);
            let refs: Vec<&(dyn ToSql + Sync)> =
                params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)).collect();
            block(rt, timeout, "upserting rows", client.execute(stmt, &refs))?;
            self.sent = end;
        }
        Ok(())
    }

    /// Sends the rows not yet sent and records `gid` as the epoch of `checkpoint`, both in
    /// the open transaction: once it commits, `caudal_sink_epochs` says so.
    fn send_and_record(&mut self, gid: &str, checkpoint: u64) -> Result<(), Failure> {
        self.try_send()?;
        let (sink, subtask) =
            self.ids.as_ref().map(|i| (i.sink.clone(), i.subtask as i32)).unwrap_or_default();
        let n = checkpoint as i64;
        let timeout = self.data.timeout();
        let rt = self.rt.as_ref().ok_or_else(|| internal("no runtime"))?;
        let (client, _) = self.data.get(rt)?;
        let record = &self.epoch_sql.record;
        block(rt, timeout, "recording the epoch", client.execute(record, &[&gid, &sink, &subtask, &n]))?;
        Ok(())
    }

    /// Runs `f`; any failure leaves the data connection (and its transaction) behind.
    fn on_data<R>(&mut self, f: impl FnOnce(&mut Self) -> Result<R, Failure>) -> Result<R, Failure> {
        let r = f(self);
        if r.is_err() {
            self.data.reset();
            self.upsert = None;
            self.in_txn = false;
            self.sent = 0;
        }
        r
    }

    fn control<R>(
        &mut self,
        f: impl FnOnce(&tokio::runtime::Runtime, Duration, &Client) -> Result<R, Failure>,
    ) -> Result<R, Failure> {
        let rt = self.rt.as_ref().ok_or_else(|| internal("no runtime"))?;
        let timeout = self.control.timeout();
        let r = match self.control.get(rt) {
            Ok((client, fresh)) => {
                let created = if fresh {
                    bookkeeping(rt, timeout, client, &self.config.schema, &self.epoch_sql)
                } else {
                    Ok(())
                };
                created.and_then(|()| f(rt, timeout, client))
            }
            Err(e) => Err(e),
        };
        if matches!(r, Err(Failure::Transient(_))) {
            self.control.reset();
        }
        r
    }

    fn is_prepared(&mut self, gid: &str) -> Result<bool, Failure> {
        self.control(|rt, timeout, c| {
            let row = block(
                rt,
                timeout,
                "looking up prepared transactions",
                c.query_opt("SELECT 1 FROM pg_prepared_xacts WHERE gid = $1", &[&gid]),
            )?;
            Ok(row.is_some())
        })
    }

    /// `COMMIT PREPARED`; a transaction already gone must be in `caudal_sink_epochs`.
    fn commit_prepared(&mut self, epoch: &PreparedEpoch) -> Result<(), Failure> {
        let committed_sql = self.epoch_sql.committed.clone();
        self.control(|rt, timeout, c| {
            match block_raw(rt, timeout, "committing", c.batch_execute(&txn::commit(&epoch.gid)))? {
                Ok(()) => Ok(()),
                Err(e) if e.code() == Some(&SqlState::UNDEFINED_OBJECT) => {
                    let done = block(rt, timeout, "looking up committed epochs", c.query_opt(&committed_sql, &[&epoch.gid]))?;
                    if done.is_some() {
                        Ok(())
                    } else {
                        Err(Failure::Permanent(format!(
                            "prepared transaction {} of checkpoint {} is gone and was never committed: its rows are \
                             lost (rolled back by hand, or another job with the same name writes this table?)",
                            epoch.gid, epoch.checkpoint
                        )))
                    }
                }
                Err(e) => Err(classify("committing", &e)),
            }
        })
    }

    fn retry<R>(
        &mut self,
        doing: &str,
        mut f: impl FnMut(&mut Self, u32) -> Result<R, Failure>,
    ) -> Result<R> {
        let policy = self.config.retry.clone();
        let what = format!("{}: {doing}", self.what);
        let retries = self.retries.clone();
        policy.run_counted("postgresql", &what, &retries, |n| f(self, n))
    }

    /// Sends the waiting rows when there are `batch_rows` of them or the oldest waited
    /// `linger_ms` — but not while an earlier epoch of this sink is prepared and not yet
    /// committed: its transaction holds the row locks of its keys, an upsert of the same key
    /// (a "latest per sensor" table repeats keys every epoch) would wait for them, and the
    /// `COMMIT PREPARED` that releases them runs on this very thread when the checkpoint
    /// completes. The rows wait in memory (as the open epoch does anyway) until then.
    fn flush_if_due(&mut self) -> Result<()> {
        if self.must_wait() {
            return Ok(());
        }
        let waiting = self.rows.as_ref().map_or(0, |r| r.len() - self.sent);
        let due = self
            .first_unsent
            .is_some_and(|first| first.elapsed() >= Duration::from_millis(self.config.linger_ms));
        if waiting >= self.config.batch_rows || (waiting > 0 && due) {
            self.flush()?;
        }
        Ok(())
    }

    /// Sends waiting rows; without checkpoints also commits them.
    fn flush(&mut self) -> Result<()> {
        let autocommit = !self.checkpointing;
        let unsent = self.rows.as_ref().map_or(0, |r| r.len() - self.sent);
        if unsent == 0 && !(autocommit && self.in_txn) {
            self.first_unsent = None;
            return Ok(());
        }
        self.retry("writing rows", |s, _| {
            s.on_data(|s| {
                s.try_send()?;
                if autocommit {
                    s.commit_open()?;
                }
                Ok(())
            })
        })?;
        self.first_unsent = None;
        if autocommit {
            self.clear_epoch();
        } else {
            // Rows of the open epoch are in its transaction (their keys locked).
            crash::point(crash::BEFORE_SINK_BARRIER, CheckpointId(self.last_barrier + 1));
        }
        Ok(())
    }

    /// `COMMIT` of the open transaction (no checkpoints, or the end of the input).
    fn commit_open(&mut self) -> Result<(), Failure> {
        let rt = self.rt.as_ref().ok_or_else(|| internal("no runtime"))?;
        let timeout = self.data.timeout();
        let (client, _) = self.data.get(rt)?;
        block(rt, timeout, "committing", client.batch_execute("COMMIT"))?;
        self.in_txn = false;
        Ok(())
    }

    fn clear_epoch(&mut self) {
        if let Some(rows) = self.rows.as_mut() {
            rows.clear();
        }
        self.sent = 0;
        self.in_txn = false;
    }

    fn commit_up_to(&mut self, checkpoint: u64) -> Result<()> {
        let due: Vec<PreparedEpoch> =
            self.pending.iter().filter(|p| p.checkpoint <= checkpoint).cloned().collect();
        for (i, epoch) in due.iter().enumerate() {
            self.retry(&format!("committing checkpoint {}", epoch.checkpoint), |s, _| {
                s.commit_prepared(epoch)
            })?;
            self.pending.retain(|p| p.gid != epoch.gid);
            if i == 0 {
                crash::point(crash::DURING_SINK_COMMIT, CheckpointId(epoch.checkpoint));
            }
        }
        Ok(())
    }

    /// Claims the sink for this run and ends the sessions of earlier runs (see `txn`): an
    /// earlier run still alive somewhere holds no row lock this one would wait for, and can
    /// prepare nothing more. Once per run and subtask, before its first row.
    fn claim(&mut self) -> Result<()> {
        let Some(ids) = self.ids.as_ref().filter(|_| !self.claimed) else { return Ok(()) };
        let (sink, attempt) = (ids.prefix.clone(), ids.attempt.clone());
        let (prefix, own) = (ids.sessions_prefix(), ids.application_name());
        let (claim, terminate) = (self.epoch_sql.claim.clone(), self.epoch_sql.terminate);
        self.retry("claiming the sink", |s, _| {
            s.control(|rt, timeout, c| {
                block(rt, timeout, "claiming the sink", c.execute(&claim, &[&sink, &attempt]))
            })
        })?;
        let ended = self.retry("ending the sessions of earlier runs", |s, _| {
            s.control(|rt, timeout, c| {
                match block_raw(rt, timeout, "ending sessions", c.query_one(terminate, &[&prefix, &own]))? {
                    Ok(row) => Ok(row.get::<_, i64>(0)),
                    // Not allowed to signal them (another role): the claim still fences them
                    // at their next PREPARE or connection.
                    Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => Ok(-1),
                    Err(e) => Err(classify("ending sessions", &e)),
                }
            })
        })?;
        match ended {
            -1 => tracing::warn!(
                "caudal: {}: not allowed to end the sessions of earlier runs; they are fenced at their next PREPARE",
                self.what
            ),
            0 => {}
            n => tracing::info!("caudal: {}: ended {n} session(s) of earlier runs (fenced)", self.what),
        }
        self.claimed = true;
        Ok(())
    }

    /// Commits `keep` (the epochs of the restored checkpoint) and rolls back every other
    /// prepared transaction of this sink left by earlier runs.
    fn recover(&mut self, keep: &[PreparedEpoch]) -> Result<()> {
        let prefix = self.ids.as_ref().map(|i| i.prefix.clone()).unwrap_or_default();
        let prepared_sql = self.epoch_sql.prepared;
        let lingering: Vec<String> = self.retry("listing prepared transactions", |s, _| {
            s.control(|rt, timeout, c| {
                let rows =
                    block(rt, timeout, "listing prepared transactions", c.query(prepared_sql, &[&prefix]))?;
                Ok(rows.iter().map(|r| r.get::<_, String>(0)).collect())
            })
        })?;
        let keep_ids: HashSet<&str> = keep.iter().map(|p| p.gid.as_str()).collect();
        for (i, epoch) in keep.iter().enumerate() {
            self.retry(&format!("committing restored checkpoint {}", epoch.checkpoint), |s, _| {
                s.commit_prepared(epoch)
            })?;
            if i == 0 && keep.len() > 1 {
                let restored = keep.iter().map(|e| e.checkpoint).max().unwrap_or(epoch.checkpoint);
                crash::point(crash::DURING_POSTGRES_RECOMMIT, CheckpointId(restored));
            }
        }
        // Those of this run are spared: other subtasks of it (in a cluster, in other
        // processes) may have prepared already. The run is the engine's attempt
        // (`OperatorContext::attempt`), new for every run, so a restart inside the same
        // process still rolls back what its failed predecessor prepared.
        let stale: Vec<String> = lingering
            .into_iter()
            .filter(|g| !keep_ids.contains(g.as_str()) && !self.is_this_attempt(g))
            .collect();
        for gid in &stale {
            self.retry("rolling back a newer epoch", |s, _| {
                s.control(|rt, timeout, c| {
                    match block_raw(rt, timeout, "rolling back", c.batch_execute(&txn::rollback(gid)))? {
                        Ok(()) => Ok(()),
                        Err(e) if e.code() == Some(&SqlState::UNDEFINED_OBJECT) => Ok(()),
                        Err(e) => Err(classify("rolling back", &e)),
                    }
                })
            })?;
            tracing::info!("caudal: {}: rolled back {gid} (newer than the restored checkpoint)", self.what);
        }
        Ok(())
    }

    /// Exactly-once needs `PREPARE TRANSACTION`, which PostgreSQL disables by default.
    fn check_prepared_transactions_enabled(&mut self) -> Result<()> {
        let max: String = self.retry("checking max_prepared_transactions", |s, _| {
            s.control(|rt, timeout, c| {
                let row = block(
                    rt,
                    timeout,
                    "checking max_prepared_transactions",
                    c.query_one("SHOW max_prepared_transactions", &[]),
                )?;
                Ok(row.get::<_, String>(0))
            })
        })?;
        prepared_transactions_enabled(&max).map_err(|m| {
            Error::config(
                "postgres (server setting max_prepared_transactions)",
                format!("{}: {m}", self.what),
            )
        })
    }

    fn is_this_attempt(&self, gid: &str) -> bool {
        self.ids.as_ref().is_some_and(|i| i.is_this_attempt(gid))
    }

    fn snapshot(&self) -> Result<Option<Vec<u8>>> {
        let state = SinkState { prepared: self.pending.clone(), held: self.held.clone() };
        serde_json::to_vec(&state)
            .map(Some)
            .map_err(|e| Error::Internal(format!("{}: encoding pre-commit state: {e}", self.what)))
    }

    /// An earlier epoch is prepared and not committed, or held: the open epoch's rows wait
    /// (in memory) for it, and its records are kept so that it can be held in turn.
    fn must_wait(&self) -> bool {
        self.checkpointing && !(self.pending.is_empty() && self.held.is_empty())
    }
}

impl<T: Data + Serialize> PostgresSink<T> {
    /// A record into the open epoch's rows (the table's shape from the first record).
    fn buffer(&mut self, value: &T) -> Result<()> {
        self.row.clear();
        to_row(value, &mut self.row).map_err(|e| Error::BadRecord(format!("{}: {e}", self.what)))?;
        if self.rows.is_none() {
            let shape = Shape::of(&self.row);
            let mut key = Vec::new();
            for k in &self.config.key {
                let i = shape.names.iter().position(|n| n == k).ok_or_else(|| {
                    Error::config(
                        "postgres.key",
                        format!("column `{k}` is not a field of the record ({})", shape.names.join(", ")),
                    )
                })?;
                key.push(i);
            }
            self.table =
                Some(TableSql::new(&self.config.schema, &self.config.table, &shape, &self.config.key));
            self.rows = Some(RowBuffer::new(shape, key));
        }
        if let Some(rows) = self.rows.as_mut() {
            rows.push(&mut self.row).map_err(|e| Error::BadRecord(format!("{}: {e}", self.what)))?;
        }
        Ok(())
    }

    /// Barrier `checkpoint` while an earlier epoch is prepared or held: the open epoch is
    /// held (its records go into the checkpoint), not prepared.
    fn hold(&mut self, checkpoint: u64) -> Result<()> {
        let records = bincode::serde::encode_to_vec(&self.stash, bincode::config::standard())
            .map_err(|e| Error::Internal(format!("{}: encoding held records: {e}", self.what)))?;
        let gid = self.ids.as_ref().map(|i| i.gid(checkpoint)).unwrap_or_default();
        tracing::info!(
            "caudal: {}: checkpoint {checkpoint}'s {} rows are held in the checkpoint: an earlier epoch is \
             still prepared, not committed (a failed checkpoint?)",
            self.what,
            self.stash.len()
        );
        self.held.push(HeldEpoch { checkpoint, gid, records });
        self.stash.clear();
        self.clear_epoch();
        self.first_unsent = None;
        Ok(())
    }

    /// Writes and commits the held epochs of checkpoints up to `checkpoint` (completed, or
    /// restored), in order, once no prepared epoch holds locks before them. Each commits with
    /// its id recorded in `caudal_sink_epochs`; one found there was written already.
    fn write_held_up_to(&mut self, checkpoint: u64) -> Result<()> {
        if self.pending.iter().any(|p| p.checkpoint <= checkpoint) {
            return Ok(());
        }
        while self.held.first().is_some_and(|h| h.checkpoint <= checkpoint) {
            let epoch = self.held.remove(0);
            self.write_held(&epoch)?;
        }
        if !self.must_wait() {
            // The open epoch no longer needs its records kept: its rows go as usual.
            self.stash.clear();
        }
        Ok(())
    }

    fn write_held(&mut self, epoch: &HeldEpoch) -> Result<()> {
        let committed_sql = self.epoch_sql.committed.clone();
        let gid = epoch.gid.clone();
        let done = self.retry("looking up committed epochs", |s, _| {
            s.control(|rt, timeout, c| {
                let row =
                    block(rt, timeout, "looking up committed epochs", c.query_opt(&committed_sql, &[&gid]))?;
                Ok(row.is_some())
            })
        })?;
        if done {
            return Ok(());
        }
        let (records, _): (Vec<T>, usize) =
            bincode::serde::decode_from_slice(&epoch.records, bincode::config::standard()).map_err(|e| {
                Error::CorruptState(format!(
                    "{}: the held records of checkpoint {}: {e}",
                    self.what, epoch.checkpoint
                ))
            })?;
        // The open epoch's rows step aside while the held ones go out.
        let open = self.rows.take();
        let open_in_txn = std::mem::take(&mut self.in_txn);
        let result = (|| {
            for r in &records {
                self.buffer(r)?;
            }
            self.sent = 0;
            self.retry(&format!("writing the held rows of checkpoint {}", epoch.checkpoint), |s, _| {
                s.on_data(|s| {
                    s.send_and_record(&gid, epoch.checkpoint)?;
                    s.commit_open()
                })
            })
        })();
        self.clear_epoch();
        if open.is_some() {
            self.rows = open;
        }
        self.in_txn = open_in_txn;
        result
    }
}

impl<T: Data + Serialize> Sink for PostgresSink<T> {
    type In = T;

    fn restore(&mut self, snapshots: Vec<Vec<u8>>, ctx: &mut OperatorContext) -> Result<()> {
        self.init(ctx)?;
        if ctx.subtask != 0 {
            return Ok(());
        }
        let restored = ctx.restored_checkpoint.map_or(0, |c| c.0);
        let mut keep = Vec::new();
        let mut held = Vec::new();
        for blob in snapshots {
            let state = SinkState::decode(&blob)
                .map_err(|e| Error::CorruptState(format!("{}: corrupt pre-commit state: {e}", self.what)))?;
            keep.extend(state.prepared.into_iter().filter(|p| p.checkpoint <= restored));
            held.extend(state.held.into_iter().filter(|h| h.checkpoint <= restored));
        }
        self.last_barrier = restored;
        self.claim()?;
        self.recover(&keep)?;
        // Every old subtask's held epochs, after every prepared one (they are newer).
        held.sort_by_key(|h| h.checkpoint);
        for epoch in &held {
            self.write_held(epoch)?;
        }
        Ok(())
    }

    fn on_start(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        self.init(ctx)?;
        if ctx.checkpointing {
            self.check_prepared_transactions_enabled()?;
            self.claim()?;
        }
        if ctx.restored_checkpoint.is_none() && ctx.checkpointing && ctx.subtask == 0 {
            // A fresh start: transactions prepared by earlier runs belong to nobody.
            self.recover(&[])?;
        }
        Ok(())
    }

    fn write_batch(&mut self, batch: Batch<T>, _ctx: &mut OperatorContext) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        for r in &batch {
            self.buffer(&r.value)?;
        }
        if self.must_wait() {
            self.stash.extend(batch.into_iter().map(|r| r.value));
        }
        self.first_unsent.get_or_insert_with(Instant::now);
        self.flush_if_due()
    }

    fn pre_commit(
        &mut self,
        checkpoint: CheckpointId,
        _ctx: &mut OperatorContext,
    ) -> Result<Option<Vec<u8>>> {
        if !self.checkpointing {
            self.flush()?;
            return Ok(None);
        }
        self.last_barrier = checkpoint.0;
        if self.rows.as_ref().is_some_and(|r| !r.is_empty()) && self.must_wait() {
            self.hold(checkpoint.0)?;
        } else if self.rows.as_ref().is_some_and(|r| !r.is_empty()) {
            let gid = self.ids.as_ref().map(|i| i.gid(checkpoint.0)).unwrap_or_default();
            self.retry(&format!("preparing checkpoint {}", checkpoint.0), |s, attempt| {
                if attempt > 0 && s.is_prepared(&gid)? {
                    return Ok(());
                }
                s.on_data(|s| {
                    s.send_and_record(&gid, checkpoint.0)?;
                    let rt = s.rt.as_ref().ok_or_else(|| internal("no runtime"))?;
                    let timeout = s.timeout();
                    let (client, _) = s.data.get(rt)?;
                    if let Some(ids) = &s.ids {
                        check_claim(rt, timeout, client, &s.epoch_sql.fence_of, ids, &s.what)?;
                    }
                    block(
                        rt,
                        timeout,
                        "preparing the transaction",
                        client.batch_execute(&txn::prepare(&gid)),
                    )?;
                    Ok(())
                })
            })?;
            self.pending.push(PreparedEpoch { checkpoint: checkpoint.0, gid });
            self.clear_epoch();
            self.first_unsent = None;
        }
        self.snapshot()
    }

    fn on_checkpoint_complete(&mut self, checkpoint: CheckpointId, _ctx: &mut OperatorContext) -> Result<()> {
        self.commit_up_to(checkpoint.0)?;
        self.write_held_up_to(checkpoint.0)?;
        // The locks are released: the rows that waited for them can go.
        self.flush_if_due()
    }

    fn on_close(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        let end_of_input = ctx.watermark == MAX_WATERMARK;
        if self.checkpointing && !end_of_input {
            // Stopped or cancelled: the open transaction dies with the connection, prepared
            // ones wait for the restore.
            self.data.reset();
            return Ok(());
        }
        self.commit_up_to(u64::MAX)?;
        self.write_held_up_to(u64::MAX)?;
        if self.checkpointing {
            // Rows after the last barrier (the final checkpoint normally leaves none).
            self.checkpointing = false;
        }
        self.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::row::SqlType;

    #[test]
    fn disabled_prepared_transactions_name_the_setting_and_the_fix() {
        assert!(prepared_transactions_enabled("64").is_ok());
        let e = prepared_transactions_enabled("0").unwrap_err();
        assert!(e.contains("max_prepared_transactions = 0") && e.contains("postgresql.conf"), "{e}");
    }

    #[test]
    fn upsert_sql_from_the_shape() {
        let shape = Shape {
            names: vec!["sensor_id", "ts", "temp_c"],
            types: vec![SqlType::BigInt, SqlType::BigInt, SqlType::Double],
        };
        let sql = TableSql::new("s", "r", &shape, &["sensor_id".into(), "ts".into()]);
        assert_eq!(
            sql.create,
            "CREATE TABLE IF NOT EXISTS \"s\".\"r\" (\"sensor_id\" BIGINT NOT NULL, \"ts\" BIGINT NOT NULL, \
             \"temp_c\" DOUBLE PRECISION NOT NULL, PRIMARY KEY (\"sensor_id\", \"ts\"))"
        );
        assert_eq!(
            sql.upsert,
            "INSERT INTO \"s\".\"r\" (\"sensor_id\", \"ts\", \"temp_c\") SELECT * FROM unnest($1::int8[], $2::int8[], \
             $3::float8[]) ON CONFLICT (\"sensor_id\", \"ts\") DO UPDATE SET \"temp_c\" = EXCLUDED.\"temp_c\""
        );
    }
}

//! [`TableClient`]: one operator's connection to the catalog and the table — created if
//! absent, evolved to hold the record type, reconnected after the catalog went away.
//!
//! The client owns a small current-thread tokio runtime: every Iceberg call runs to
//! completion on the operator's thread (the engine's threads are not async).

use super::catalog::{self, IcebergCatalog};
use super::config::{IcebergConfig, Partitioning};
use super::schema::RecordLayout;
use super::storage::file_io;
use crate::retry::Failure;
use caudal::{Error, Result};
use iceberg::io::FileIO;
use iceberg::spec::{Transform, UnboundPartitionSpec};
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::{Catalog, ErrorKind, NamespaceIdent, TableCreation, TableIdent};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Snapshot summary keys Caudal writes with each commit (Flink's `flink.job-id` and
/// `flink.max-committed-checkpoint-id`, for Caudal).
pub mod summary {
    /// The job's name.
    pub const JOB: &str = "caudal.job";
    /// The sink's name (its committer's uid without the suffix).
    pub const SINK: &str = "caudal.sink";
    /// The run: new when the job starts without a checkpoint, kept across restores.
    pub const RUN: &str = "caudal.run";
    /// The checkpoint whose epoch the snapshot holds.
    pub const CHECKPOINT: &str = "caudal.checkpoint-id";

    /// The table property that keeps the newest checkpoint a run of a sink committed, set in
    /// the same commit as its snapshot: snapshots expire (another writer's maintenance may
    /// remove every snapshot of the run), table properties do not.
    pub fn committed_property(sink: &str, run: &str) -> String {
        format!("caudal.committed-checkpoint.{sink}.{run}")
    }
}

/// A catalog connection and the table, for one operator.
pub(crate) struct TableClient {
    pub(crate) config: IcebergConfig,
    pub(crate) ident: TableIdent,
    runtime: tokio::runtime::Runtime,
    catalog: Option<IcebergCatalog>,
    file_io: FileIO,
    warehouse: String,
    /// Names the operator in logs and errors.
    pub(crate) what: String,
    pub(crate) retries: Arc<AtomicU64>,
}

/// How much another attempt can help after an Iceberg error.
pub(crate) fn classify(e: &iceberg::Error) -> Failure {
    match e.kind() {
        ErrorKind::DataInvalid | ErrorKind::FeatureUnsupported | ErrorKind::PreconditionFailed => {
            Failure::Permanent(format!("{e:#}"))
        }
        _ => Failure::Transient(format!("{e:#}")),
    }
}

impl TableClient {
    pub(crate) fn new(config: &IcebergConfig, what: String, retries: Arc<AtomicU64>) -> Result<Self> {
        config.validate()?;
        let (namespace, name) = config.table_ident()?;
        let ident = TableIdent::new(
            NamespaceIdent::from_vec(namespace).map_err(|e| Error::config("iceberg.table", e.to_string()))?,
            name,
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Internal(format!("{what}: starting the Iceberg runtime: {e}")))?;
        Ok(TableClient {
            warehouse: config.warehouse_uri()?,
            file_io: file_io(&config.s3, &config.retry),
            config: config.clone(),
            ident,
            runtime,
            catalog: None,
            what,
            retries,
        })
    }

    pub(crate) fn file_io(&self) -> &FileIO {
        &self.file_io
    }

    /// Runs `f` on the client's runtime.
    pub(crate) fn block<T>(&self, f: impl Future<Output = T>) -> T {
        self.runtime.block_on(f)
    }

    /// The catalog, connected (again) if needed, and the runtime to call it on.
    pub(crate) fn catalog(
        &mut self,
    ) -> std::result::Result<(&IcebergCatalog, &tokio::runtime::Runtime), Failure> {
        if self.catalog.as_ref().is_none_or(IcebergCatalog::is_closed) {
            self.catalog = None;
            let c = &self.config;
            let connecting = catalog::open(&c.catalog_url, &c.catalog_name, &self.warehouse, &c.s3, &c.retry);
            let catalog = self
                .runtime
                .block_on(async {
                    tokio::time::timeout(std::time::Duration::from_secs(30), connecting).await
                })
                .map_err(|_| Failure::Transient("connecting to the catalog: no answer within 30s".into()))?
                .map_err(|e| Failure::Transient(format!("{e:#}")))?;
            self.catalog = Some(catalog);
        }
        match &self.catalog {
            Some(c) => Ok((c, &self.runtime)),
            None => Err(Failure::Transient("not connected".into())),
        }
    }

    /// Runs `attempt` with the retry policy: a transient failure drops the connection and
    /// tries again after a backoff.
    pub(crate) fn retry<T>(
        &mut self,
        doing: &str,
        mut attempt: impl FnMut(&mut Self) -> std::result::Result<T, Failure>,
    ) -> Result<T> {
        let policy = self.config.retry.clone();
        let what = format!("{}: {doing}", self.what);
        let retries = self.retries.clone();
        policy.run_counted("iceberg", &what, &retries, |_| {
            let r = attempt(self);
            if matches!(r, Err(Failure::Transient(_))) {
                self.catalog = None;
            }
            r
        })
    }

    /// The table as the catalog has it now.
    pub(crate) fn load(&mut self) -> std::result::Result<Table, Failure> {
        let ident = self.ident.clone();
        let (catalog, rt) = self.catalog()?;
        let table = rt.block_on(catalog.load_table(&ident)).map_err(|e| classify(&e))?;
        Ok(table)
    }

    /// The table, created if absent (with its namespace) and given the columns `layout`
    /// needs; a table that cannot hold `layout` fails, naming the column.
    pub(crate) fn ensure(&mut self, layout: &RecordLayout) -> Result<Table> {
        self.retry("opening the table", |c| {
            let table = c.create_if_absent(layout)?;
            let added = layout.evolution(table.metadata().current_schema()).map_err(|e| {
                Failure::Permanent(format!("table {} cannot hold the record type: {e}", c.ident))
            })?;
            if added.is_empty() {
                return Ok(table);
            }
            let names = layout.missing_from(table.metadata().current_schema());
            let tx = Transaction::new(&table);
            let mut action = tx.update_schema();
            for column in added {
                action = action.add_column(column);
            }
            let tx = action.apply(tx).map_err(|e| classify(&e))?;
            let what = c.what.clone();
            let ident = c.ident.clone();
            let (catalog, rt) = c.catalog()?;
            match rt.block_on(tx.commit(catalog)) {
                Ok(t) => {
                    tracing::info!("caudal: {what}: table {ident} gained columns {names:?}");
                    Ok(t)
                }
                // Another writer added them first: read the table again.
                Err(e) if e.kind() == ErrorKind::CatalogCommitConflicts => {
                    Err(Failure::Transient(format!("adding columns {names:?}: {e:#}")))
                }
                Err(e) => Err(classify(&e)),
            }
        })
    }

    fn create_if_absent(&mut self, layout: &RecordLayout) -> std::result::Result<Table, Failure> {
        let ident = self.ident.clone();
        let schema = layout.table_schema().map_err(|e| Failure::Permanent(format!("{e:#}")))?;
        let spec = partition_spec(&self.config, &schema)?;
        let what = self.what.clone();
        let (catalog, rt) = self.catalog()?;
        match rt.block_on(catalog.load_table(&ident)) {
            Ok(t) => return Ok(t),
            Err(e) if e.kind() == ErrorKind::TableNotFound => {}
            Err(e) => return Err(classify(&e)),
        }
        match rt.block_on(catalog.create_namespace(ident.namespace(), HashMap::new())) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NamespaceAlreadyExists => {}
            Err(e) => return Err(classify(&e)),
        }
        let creation = TableCreation::builder()
            .name(ident.name().to_string())
            .schema(schema)
            .partition_spec(spec)
            .properties([("write.format.default".to_string(), "parquet".to_string())])
            .build();
        match rt.block_on(catalog.create_table(ident.namespace(), creation)) {
            Ok(t) => {
                tracing::info!("caudal: {what}: created table {ident}");
                Ok(t)
            }
            Err(e) if e.kind() == ErrorKind::TableAlreadyExists => {
                rt.block_on(catalog.load_table(&ident)).map_err(|e| classify(&e))
            }
            Err(e) => Err(classify(&e)),
        }
    }
}

/// The partition spec of a new table: `config.partitioning` of `config.partition_field`.
fn partition_spec(
    config: &IcebergConfig,
    schema: &iceberg::spec::Schema,
) -> std::result::Result<UnboundPartitionSpec, Failure> {
    let transform = match config.partitioning {
        // The spec id is spelled out: Iceberg's Java REST server (1.10) refuses a
        // create-table request whose spec has none.
        Partitioning::None => return Ok(UnboundPartitionSpec::builder().with_spec_id(0).build()),
        Partitioning::Hour => Transform::Hour,
        Partitioning::Day => Transform::Day,
        Partitioning::Month => Transform::Month,
    };
    let field = schema.field_by_name(&config.partition_field).ok_or_else(|| {
        Failure::Permanent(format!(
            "iceberg.partition_field: the record type has no field `{}` to partition on",
            config.partition_field
        ))
    })?;
    let name = format!("{}_{}", field.name, format!("{transform}").to_lowercase());
    UnboundPartitionSpec::builder()
        .with_spec_id(0)
        .add_partition_field(field.id, name, transform)
        .map(|b| b.build())
        .map_err(|e| Failure::Permanent(format!("{e:#}")))
}

//! The catalogs the Iceberg sink writes through, picked by URL: the SQL catalog in
//! PostgreSQL ([`sql`], `postgres://…`) or a REST catalog ([`rest`], `http://…` or
//! `https://…`).
//!
//! **In:** the catalog URL, a name, the warehouse and the S3 settings. **Out:**
//! [`IcebergCatalog`], an [`iceberg::Catalog`] whose tables' files go through Caudal's own
//! storage ([`super::storage`]) whichever the catalog.
//!
//! **Invariant:** whichever the catalog, a commit that may have landed is never sent again
//! unseen. A conflict (the SQL catalog's `UPDATE` matched no row; REST's `409`) left nothing
//! behind, but it is handed to the caller as is rather than retried inside the transaction:
//! Iceberg's own retry would append the same files on top of whatever came first — the
//! committer instead reads the table, finds whether its checkpoint is already there, and
//! only then commits again. Any other failure (a lost answer, `5xx`, a timeout) has an
//! unknown outcome and is not retryable here at all. And the commit goes on top of exactly
//! the table the committer looked at: Iceberg's transaction reads the table once more
//! before it sends the commit, and a table that moved in between (another commit of the
//! same checkpoint landed — one a killed process had in flight) is a conflict too, so the
//! committer looks again instead of appending its files a second time.
//!
//! [`open`] is the one way in: the job's committer and writers, `caudal iceberg snapshots`
//! and the tests all open their catalog through it.

pub mod rest;
pub mod sql;

use super::storage;
use crate::retry::RetryPolicy;
use async_trait::async_trait;
use caudal_checkpoints::S3Config;
use iceberg::table::Table;
use iceberg::{
    Catalog, Error, ErrorKind, Namespace, NamespaceIdent, Result, TableCommit, TableCreation, TableIdent,
};
use iceberg_catalog_rest::RestCatalog;
use std::collections::HashMap;
use std::future::Future;

pub use sql::PostgresCatalog;

/// The commit in flight, as the catalog sees it from inside the transaction.
#[derive(Debug, Clone)]
struct Committing {
    /// The checkpoint whose epoch it carries: the REST catalog's crash points name it (the
    /// request itself is opaque to us; the SQL catalog reads it from the metadata it writes).
    checkpoint: u64,
    /// The table's metadata as the committer read it when it looked for its checkpoint.
    base: Option<String>,
}

tokio::task_local! {
    static COMMITTING: Committing;
}

/// Runs `commit` (a transaction's commit) as the commit of checkpoint `checkpoint` on top of
/// `base`, the table the committer looked at: the transaction's own refresh of the table
/// must find it unchanged, or the commit is handed back as a conflict, unsent (module doc).
pub(crate) async fn committing<F: Future>(checkpoint: u64, base: &Table, commit: F) -> F::Output {
    let base = base.metadata_location().map(str::to_string);
    COMMITTING.scope(Committing { checkpoint, base }, commit).await
}

/// An Iceberg catalog Caudal opened: the SQL catalog or a REST catalog.
#[derive(Debug)]
pub enum IcebergCatalog {
    /// The SQL ("JDBC") catalog in PostgreSQL.
    Sql(Box<PostgresCatalog>),
    /// A REST catalog; new tables go under `warehouse`.
    Rest { catalog: Box<RestCatalog>, warehouse: String },
}

/// Opens the catalog at `url`: `postgres://…` (or `postgresql://…`) is the SQL catalog
/// named `name` in that database, `http://…` or `https://…` a REST catalog (`name` is then
/// only a label). New tables go under `warehouse` (an absolute URI; empty for a caller that
/// creates none). Their files are reached with `s3`, the S3 client retrying with `retry`.
pub async fn open(
    url: &str,
    name: &str,
    warehouse: &str,
    s3: &S3Config,
    retry: &RetryPolicy,
) -> Result<IcebergCatalog> {
    if rest::is_rest_url(url) {
        let catalog = rest::connect(url, name, storage::factory(s3, retry)).await?;
        let warehouse = warehouse.trim_end_matches('/').to_string();
        return Ok(IcebergCatalog::Rest { catalog: Box::new(catalog), warehouse });
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let io = storage::file_io(s3, retry);
        return Ok(IcebergCatalog::Sql(Box::new(PostgresCatalog::connect(url, name, warehouse, io).await?)));
    }
    Err(Error::new(
        ErrorKind::DataInvalid,
        format!("`{url}` is neither a SQL catalog (postgres://…) nor a REST catalog (http(s)://…)"),
    ))
}

impl IcebergCatalog {
    /// The catalog `config` names, as [`open`] opens it.
    pub async fn for_config(config: &super::IcebergConfig) -> Result<Self> {
        let warehouse =
            config.warehouse_uri().map_err(|e| Error::new(ErrorKind::DataInvalid, e.to_string()))?;
        open(&config.catalog_url, &config.catalog_name, &warehouse, &config.s3, &config.retry).await
    }

    /// Whether the catalog must be opened again (the SQL catalog's connection is gone; a
    /// REST catalog has no connection to lose).
    pub fn is_closed(&self) -> bool {
        match self {
            IcebergCatalog::Sql(c) => c.is_closed(),
            IcebergCatalog::Rest { .. } => false,
        }
    }

    fn inner(&self) -> &dyn Catalog {
        match self {
            IcebergCatalog::Sql(c) => c.as_ref(),
            IcebergCatalog::Rest { catalog, .. } => catalog.as_ref(),
        }
    }
}

#[async_trait]
impl Catalog for IcebergCatalog {
    async fn list_namespaces(&self, parent: Option<&NamespaceIdent>) -> Result<Vec<NamespaceIdent>> {
        self.inner().list_namespaces(parent).await
    }

    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<Namespace> {
        self.inner().create_namespace(namespace, properties).await
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> Result<Namespace> {
        self.inner().get_namespace(namespace).await
    }

    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> Result<bool> {
        self.inner().namespace_exists(namespace).await
    }

    async fn update_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<()> {
        self.inner().update_namespace(namespace, properties).await
    }

    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> Result<()> {
        self.inner().drop_namespace(namespace).await
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> Result<Vec<TableIdent>> {
        self.inner().list_tables(namespace).await
    }

    /// A new table without a location goes under the warehouse, at
    /// `<warehouse>/<namespace levels>/<table>`, whichever the catalog (a REST server would
    /// otherwise place it under a warehouse of its own).
    async fn create_table(&self, namespace: &NamespaceIdent, creation: TableCreation) -> Result<Table> {
        match self {
            IcebergCatalog::Sql(c) => c.create_table(namespace, creation).await,
            IcebergCatalog::Rest { catalog, warehouse } => {
                let creation = match creation.location {
                    Some(_) => creation,
                    None if warehouse.is_empty() => creation,
                    None => TableCreation {
                        location: Some(format!("{warehouse}/{}/{}", namespace.join("/"), creation.name)),
                        ..creation
                    },
                };
                catalog.create_table(namespace, creation).await
            }
        }
    }

    /// Inside [`committing`], a table that moved since the committer looked at it is a
    /// conflict: Iceberg's transaction reads the table again before it commits and would
    /// otherwise append on top of whatever landed in between — the commit of the same
    /// checkpoint by a process that died with it in flight, say.
    async fn load_table(&self, table: &TableIdent) -> Result<Table> {
        let loaded = self.inner().load_table(table).await?;
        if let Ok(Some(base)) = COMMITTING.try_with(|c| c.base.clone()) {
            if loaded.metadata_location() != Some(base.as_str()) {
                return Err(Error::new(
                    ErrorKind::CatalogCommitConflicts,
                    format!("table {table} changed after the committer read it ({base}): read it again"),
                )
                .with_retryable(false));
            }
        }
        Ok(loaded)
    }

    async fn drop_table(&self, table: &TableIdent) -> Result<()> {
        self.inner().drop_table(table).await
    }

    async fn purge_table(&self, table: &TableIdent) -> Result<()> {
        self.inner().purge_table(table).await
    }

    async fn table_exists(&self, table: &TableIdent) -> Result<bool> {
        self.inner().table_exists(table).await
    }

    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> Result<()> {
        self.inner().rename_table(src, dest).await
    }

    async fn register_table(&self, table: &TableIdent, metadata_location: String) -> Result<Table> {
        self.inner().register_table(table, metadata_location).await
    }

    async fn update_table(&self, commit: TableCommit) -> Result<Table> {
        let result = match self {
            IcebergCatalog::Sql(c) => c.update_table(commit).await,
            IcebergCatalog::Rest { catalog, .. } => {
                let checkpoint = caudal::CheckpointId(COMMITTING.try_with(|c| c.checkpoint).unwrap_or(0));
                caudal::crash::point(caudal::crash::ICEBERG_BEFORE_CATALOG_UPDATE, checkpoint);
                let result = catalog.update_table(commit).await;
                caudal::crash::point(caudal::crash::ICEBERG_AFTER_CATALOG_UPDATE, checkpoint);
                result
            }
        };
        // Not retried inside the transaction: the caller looks at the table first (module doc).
        result.map_err(|e| match e.kind() {
            ErrorKind::CatalogCommitConflicts => e.with_retryable(false),
            _ => e,
        })
    }
}

//! The Iceberg SQL catalog ("JDBC catalog") on PostgreSQL, over `tokio-postgres`.
//!
//! **In:** the catalog's database and name. **Out:** [`iceberg::Catalog`]: namespaces and
//! tables in the two tables Java's `JdbcCatalog`, pyiceberg's `SqlCatalog`, Trino and Spark
//! read — `iceberg_tables (catalog_name, table_namespace, table_name, metadata_location,
//! previous_metadata_location, iceberg_type)` and `iceberg_namespace_properties` — created if
//! absent.
//!
//! **Invariant:** a commit is one `UPDATE … WHERE metadata_location = <the base>`: it
//! lands whole or not at all, and a concurrent writer's commit makes it fail as a conflict
//! (retryable: nothing of it landed). Any other failure is *not* retryable here — an
//! answer lost after the `UPDATE` ran may hide a commit that landed, which only a look at
//! the table can tell (the Iceberg committer does that before it tries again).
//!
//! Written on the PostgreSQL client the sinks already use rather than on
//! `iceberg-catalog-sql`, which brings `sqlx` (a second PostgreSQL stack) for these two
//! tables.

use async_trait::async_trait;
use iceberg::io::FileIO;
use iceberg::spec::{TableMetadata, TableMetadataBuilder};
use iceberg::table::Table;
use iceberg::{
    Catalog, Error, ErrorKind, MetadataLocation, Namespace, NamespaceIdent, Result, Runtime, TableCommit,
    TableCreation, TableIdent,
};
use std::collections::HashMap;
use std::str::FromStr;
use tokio_postgres::Client;

const TABLE_RECORD_TYPE: &str = "TABLE";

/// A SQL catalog in a PostgreSQL database.
pub struct PostgresCatalog {
    name: String,
    warehouse: String,
    client: Client,
    file_io: FileIO,
    runtime: Runtime,
}

impl std::fmt::Debug for PostgresCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PostgresCatalog({}, warehouse {})", self.name, self.warehouse)
    }
}

/// An error of the catalog's database, never retryable (see the module doc).
fn db(what: &str, e: tokio_postgres::Error) -> Error {
    let detail = match e.as_db_error() {
        Some(d) => format!("{}: {}", d.code().code(), d.message()),
        None => e.to_string(),
    };
    Error::new(ErrorKind::Unexpected, format!("catalog database: {what}: {detail}")).with_source(e)
}

/// The Caudal checkpoint id of `metadata`'s current snapshot (0: none), for the crash
/// points of a commit.
fn checkpoint_of(metadata: &TableMetadata) -> u64 {
    metadata
        .current_snapshot()
        .and_then(|s| {
            s.summary().additional_properties.get(crate::iceberg::summary::CHECKPOINT)?.parse().ok()
        })
        .unwrap_or(0)
}

fn ns(namespace: &NamespaceIdent) -> String {
    namespace.join(".")
}

impl PostgresCatalog {
    /// Connects to `url` (spawning the connection on the current tokio runtime) and creates
    /// the catalog's tables if absent. New tables go under `warehouse` (an absolute URI).
    /// Callers open catalogs with [`super::open`], which picks the kind by URL.
    pub async fn connect(url: &str, name: &str, warehouse: &str, file_io: FileIO) -> Result<Self> {
        let (config, tls) = crate::postgres::tls::parse(url)
            .map_err(|e| Error::new(ErrorKind::DataInvalid, format!("catalog database URL: {e}")))?;
        let (client, connection) = config.connect(tls).await.map_err(|e| db("connecting", e))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("caudal: iceberg catalog connection ended: {e}");
            }
        });
        client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS iceberg_tables (
                    catalog_name VARCHAR(255) NOT NULL,
                    table_namespace VARCHAR(255) NOT NULL,
                    table_name VARCHAR(255) NOT NULL,
                    metadata_location VARCHAR(1000),
                    previous_metadata_location VARCHAR(1000),
                    iceberg_type VARCHAR(5),
                    PRIMARY KEY (catalog_name, table_namespace, table_name));
                 CREATE TABLE IF NOT EXISTS iceberg_namespace_properties (
                    catalog_name VARCHAR(255) NOT NULL,
                    namespace VARCHAR(255) NOT NULL,
                    property_key VARCHAR(255),
                    property_value VARCHAR(1000),
                    PRIMARY KEY (catalog_name, namespace, property_key));",
            )
            .await
            .or_else(|e| {
                // Two writers creating the tables at once: one wins, the other sees a unique violation.
                if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) {
                    Ok(())
                } else {
                    Err(db("creating the catalog tables", e))
                }
            })?;
        Ok(PostgresCatalog {
            name: name.to_string(),
            warehouse: warehouse.trim_end_matches('/').to_string(),
            client,
            file_io,
            runtime: Runtime::try_current()?,
        })
    }

    /// Whether the database connection is gone (a new catalog must connect).
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    fn table(&self, ident: TableIdent, location: String, metadata: TableMetadata) -> Result<Table> {
        Table::builder()
            .file_io(self.file_io.clone())
            .identifier(ident)
            .metadata_location(location)
            .metadata(metadata)
            .runtime(self.runtime.clone())
            .build()
    }

    async fn metadata_location(&self, ident: &TableIdent) -> Result<Option<String>> {
        let rows = self
            .client
            .query(
                "SELECT metadata_location FROM iceberg_tables
                 WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3
                   AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL)",
                &[&self.name, &ns(ident.namespace()), &ident.name()],
            )
            .await
            .map_err(|e| db("looking up a table", e))?;
        Ok(rows.first().and_then(|r| r.get::<_, Option<String>>(0)))
    }

    async fn properties(&self, namespace: &NamespaceIdent) -> Result<Option<HashMap<String, String>>> {
        let rows = self
            .client
            .query(
                "SELECT property_key, property_value FROM iceberg_namespace_properties
                 WHERE catalog_name = $1 AND namespace = $2",
                &[&self.name, &ns(namespace)],
            )
            .await
            .map_err(|e| db("reading namespace properties", e))?;
        if rows.is_empty() {
            return Ok(None);
        }
        Ok(Some(
            rows.iter()
                .filter_map(|r| {
                    Some((r.get::<_, Option<String>>(0)?, r.get::<_, Option<String>>(1).unwrap_or_default()))
                })
                .collect(),
        ))
    }

    fn no_such_table(ident: &TableIdent) -> Error {
        Error::new(ErrorKind::TableNotFound, format!("no table {ident} in the catalog"))
    }
}

#[async_trait]
impl Catalog for PostgresCatalog {
    async fn list_namespaces(&self, parent: Option<&NamespaceIdent>) -> Result<Vec<NamespaceIdent>> {
        let rows = self
            .client
            .query(
                "SELECT table_namespace FROM iceberg_tables WHERE catalog_name = $1
                 UNION SELECT namespace FROM iceberg_namespace_properties WHERE catalog_name = $1",
                &[&self.name],
            )
            .await
            .map_err(|e| db("listing namespaces", e))?;
        let mut out = Vec::new();
        for r in rows {
            let name: String = r.get(0);
            let ident = NamespaceIdent::from_strs(name.split('.'))?;
            let keep = match parent {
                None => ident.len() == 1,
                Some(p) => ident.len() == p.len() + 1 && ident.starts_with(p.as_ref()),
            };
            if keep && !out.contains(&ident) {
                out.push(ident);
            }
        }
        Ok(out)
    }

    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<Namespace> {
        if self.namespace_exists(namespace).await? {
            return Err(Error::new(
                ErrorKind::NamespaceAlreadyExists,
                format!("namespace {namespace:?} exists"),
            ));
        }
        // Java's JdbcCatalog marks an empty namespace with `exists = true`.
        let mut props = properties.clone();
        props.entry("exists".to_string()).or_insert_with(|| "true".to_string());
        for (k, v) in &props {
            self.client
                .execute(
                    "INSERT INTO iceberg_namespace_properties (catalog_name, namespace, property_key, property_value)
                     VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                    &[&self.name, &ns(namespace), k, v],
                )
                .await
                .map_err(|e| db("creating a namespace", e))?;
        }
        Ok(Namespace::with_properties(namespace.clone(), properties))
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> Result<Namespace> {
        match self.properties(namespace).await? {
            Some(p) => Ok(Namespace::with_properties(namespace.clone(), p)),
            None if self.namespace_exists(namespace).await? => Ok(Namespace::new(namespace.clone())),
            None => Err(Error::new(ErrorKind::NamespaceNotFound, format!("no namespace {namespace:?}"))),
        }
    }

    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> Result<bool> {
        let row = self
            .client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM iceberg_namespace_properties WHERE catalog_name = $1 AND namespace = $2)
                     OR EXISTS (SELECT 1 FROM iceberg_tables WHERE catalog_name = $1 AND table_namespace = $2)",
                &[&self.name, &ns(namespace)],
            )
            .await
            .map_err(|e| db("looking up a namespace", e))?;
        Ok(row.get(0))
    }

    async fn update_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<()> {
        if !self.namespace_exists(namespace).await? {
            return Err(Error::new(ErrorKind::NamespaceNotFound, format!("no namespace {namespace:?}")));
        }
        for (k, v) in &properties {
            self.client
                .execute(
                    "INSERT INTO iceberg_namespace_properties (catalog_name, namespace, property_key, property_value)
                     VALUES ($1, $2, $3, $4)
                     ON CONFLICT (catalog_name, namespace, property_key) DO UPDATE SET property_value = $4",
                    &[&self.name, &ns(namespace), k, v],
                )
                .await
                .map_err(|e| db("updating a namespace", e))?;
        }
        Ok(())
    }

    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> Result<()> {
        if !self.list_tables(namespace).await?.is_empty() {
            return Err(Error::new(
                ErrorKind::DataInvalid,
                format!("namespace {namespace:?} still has tables"),
            ));
        }
        self.client
            .execute(
                "DELETE FROM iceberg_namespace_properties WHERE catalog_name = $1 AND namespace = $2",
                &[&self.name, &ns(namespace)],
            )
            .await
            .map_err(|e| db("dropping a namespace", e))?;
        Ok(())
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> Result<Vec<TableIdent>> {
        let rows = self
            .client
            .query(
                "SELECT table_name FROM iceberg_tables
                 WHERE catalog_name = $1 AND table_namespace = $2 AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL)",
                &[&self.name, &ns(namespace)],
            )
            .await
            .map_err(|e| db("listing tables", e))?;
        Ok(rows.iter().map(|r| TableIdent::new(namespace.clone(), r.get(0))).collect())
    }

    async fn create_table(&self, namespace: &NamespaceIdent, creation: TableCreation) -> Result<Table> {
        let ident = TableIdent::new(namespace.clone(), creation.name.clone());
        if self.metadata_location(&ident).await?.is_some() {
            return Err(Error::new(ErrorKind::TableAlreadyExists, format!("table {ident} exists")));
        }
        let location = match &creation.location {
            Some(l) => l.clone(),
            None => format!("{}/{}/{}", self.warehouse, namespace.join("/"), creation.name),
        };
        let creation = TableCreation { location: Some(location.clone()), ..creation };
        let metadata = TableMetadataBuilder::from_table_creation(creation)?.build()?.metadata;
        let metadata_location = MetadataLocation::new_with_metadata(location, &metadata);
        metadata.write_to(&self.file_io, &metadata_location).await?;
        let metadata_location = metadata_location.to_string();
        let inserted = self
            .client
            .execute(
                "INSERT INTO iceberg_tables
                   (catalog_name, table_namespace, table_name, metadata_location, iceberg_type)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                &[&self.name, &ns(namespace), &ident.name(), &metadata_location, &TABLE_RECORD_TYPE],
            )
            .await
            .map_err(|e| db("creating a table", e))?;
        if inserted == 0 {
            // Another writer created it first; its metadata is the table's.
            let _ = self.file_io.delete(&metadata_location).await;
            return Err(Error::new(ErrorKind::TableAlreadyExists, format!("table {ident} exists")));
        }
        self.table(ident, metadata_location, metadata)
    }

    async fn load_table(&self, ident: &TableIdent) -> Result<Table> {
        let location = self.metadata_location(ident).await?.ok_or_else(|| Self::no_such_table(ident))?;
        let metadata = TableMetadata::read_from(&self.file_io, &location).await?;
        self.table(ident.clone(), location, metadata)
    }

    async fn drop_table(&self, ident: &TableIdent) -> Result<()> {
        let n = self
            .client
            .execute(
                "DELETE FROM iceberg_tables WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3",
                &[&self.name, &ns(ident.namespace()), &ident.name()],
            )
            .await
            .map_err(|e| db("dropping a table", e))?;
        if n == 0 {
            return Err(Self::no_such_table(ident));
        }
        Ok(())
    }

    async fn purge_table(&self, ident: &TableIdent) -> Result<()> {
        let table = self.load_table(ident).await?;
        self.drop_table(ident).await?;
        iceberg::drop_table_data(&table).await
    }

    async fn table_exists(&self, ident: &TableIdent) -> Result<bool> {
        Ok(self.metadata_location(ident).await?.is_some())
    }

    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> Result<()> {
        if self.table_exists(dest).await? {
            return Err(Error::new(ErrorKind::TableAlreadyExists, format!("table {dest} exists")));
        }
        let n = self
            .client
            .execute(
                "UPDATE iceberg_tables SET table_namespace = $4, table_name = $5
                 WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3",
                &[&self.name, &ns(src.namespace()), &src.name(), &ns(dest.namespace()), &dest.name()],
            )
            .await
            .map_err(|e| db("renaming a table", e))?;
        if n == 0 {
            return Err(Self::no_such_table(src));
        }
        Ok(())
    }

    async fn register_table(&self, ident: &TableIdent, metadata_location: String) -> Result<Table> {
        if self.table_exists(ident).await? {
            return Err(Error::new(ErrorKind::TableAlreadyExists, format!("table {ident} exists")));
        }
        let metadata = TableMetadata::read_from(&self.file_io, &metadata_location).await?;
        self.client
            .execute(
                "INSERT INTO iceberg_tables
                   (catalog_name, table_namespace, table_name, metadata_location, iceberg_type)
                 VALUES ($1, $2, $3, $4, $5)",
                &[&self.name, &ns(ident.namespace()), &ident.name(), &metadata_location, &TABLE_RECORD_TYPE],
            )
            .await
            .map_err(|e| db("registering a table", e))?;
        self.table(ident.clone(), metadata_location, metadata)
    }

    async fn update_table(&self, commit: TableCommit) -> Result<Table> {
        let ident = commit.identifier().clone();
        let current = self.load_table(&ident).await?;
        let base = current.metadata_location_result()?.to_string();
        let staged = commit.apply(current)?;
        let staged_location = MetadataLocation::from_str(staged.metadata_location_result()?)?;
        staged.metadata().write_to(staged.file_io(), &staged_location).await?;
        let staged_location = staged_location.to_string();
        let checkpoint = caudal::CheckpointId(checkpoint_of(staged.metadata()));
        caudal::crash::point(caudal::crash::ICEBERG_BEFORE_CATALOG_UPDATE, checkpoint);
        let n = self
            .client
            .execute(
                "UPDATE iceberg_tables SET metadata_location = $1, previous_metadata_location = $2
                 WHERE catalog_name = $3 AND table_namespace = $4 AND table_name = $5 AND metadata_location = $2",
                &[&staged_location, &base, &self.name, &ns(ident.namespace()), &ident.name()],
            )
            .await
            .map_err(|e| db("committing", e))?;
        caudal::crash::point(caudal::crash::ICEBERG_AFTER_CATALOG_UPDATE, checkpoint);
        if n == 0 {
            let _ = self.file_io.delete(&staged_location).await;
            return Err(Error::new(
                ErrorKind::CatalogCommitConflicts,
                format!("table {ident} changed since {base} was read"),
            )
            .with_retryable(true));
        }
        Ok(staged)
    }
}

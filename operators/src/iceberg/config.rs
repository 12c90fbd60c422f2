//! [`IcebergConfig`]: which catalog, warehouse and table the Iceberg sink writes, how the
//! table is partitioned and kept.

use crate::retry::RetryPolicy;
use caudal::{Error, Result};
use caudal_checkpoints::{S3Config, StorageUrl};
use serde::{Deserialize, Serialize};

/// How the table is partitioned: an Iceberg transform of the record's event-time field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Partitioning {
    /// `hour(ts)`.
    Hour,
    /// `day(ts)` (the default).
    Day,
    /// `month(ts)`.
    Month,
    /// Not partitioned.
    None,
}

impl std::str::FromStr for Partitioning {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "hour" => Ok(Partitioning::Hour),
            "day" => Ok(Partitioning::Day),
            "month" => Ok(Partitioning::Month),
            "none" => Ok(Partitioning::None),
            other => Err(format!("`{other}` is not a partitioning; use hour, day, month or none")),
        }
    }
}

/// Settings of the Iceberg table sink.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IcebergConfig {
    /// The catalog: the SQL catalog's database, `postgres://user@host:port/db` (the JDBC
    /// catalog's `iceberg_tables` schema, which Java, Trino, Spark and pyiceberg share), or a
    /// REST catalog's base URL, `http://host:port[/path]` or `https://…` (the one whose
    /// `/v1/config` answers).
    pub catalog_url: String,
    /// The SQL catalog's name inside that database (`catalog_name` column; Java's and
    /// pyiceberg's catalog name); for a REST catalog only a label in errors.
    #[serde(default = "default_catalog_name")]
    pub catalog_name: String,
    /// Where new tables are placed: a directory, `file:///absolute/path` or
    /// `s3://bucket/prefix` (a table lives at `<warehouse>/<namespace>/<table>`). A REST
    /// catalog's server writes the tables' metadata there too: it must reach it (S3).
    pub warehouse: String,
    /// `namespace.table` (the namespace may have several levels: `a.b.table`).
    pub table: String,
    /// The event-time field partitioned on, and how.
    #[serde(default = "default_partition_field")]
    pub partition_field: String,
    #[serde(default = "default_partitioning")]
    pub partitioning: Partitioning,
    /// Endpoint, region and credentials when the warehouse is `s3://…` (the checkpoint
    /// storage's settings; `CAUDAL__S3__*` variables).
    #[serde(default)]
    pub s3: S3Config,
    /// A data file is closed once it holds about this many bytes; otherwise one file per
    /// partition, writer subtask and checkpoint.
    #[serde(default = "default_target_file_bytes")]
    pub target_file_bytes: usize,
    /// After each commit, expire all but the newest this many snapshots (metadata only:
    /// the files stay referenced by the current snapshot). `None`: keep every snapshot.
    #[serde(default)]
    pub keep_snapshots: Option<usize>,
    /// Retries while the catalog or the storage is unreachable.
    #[serde(default)]
    pub retry: RetryPolicy,
}

fn default_catalog_name() -> String {
    "caudal".to_string()
}

fn default_partition_field() -> String {
    "ts".to_string()
}

fn default_partitioning() -> Partitioning {
    Partitioning::Day
}

fn default_target_file_bytes() -> usize {
    128 << 20
}

impl IcebergConfig {
    /// The table `table` in the catalog at `catalog_url`, new tables under `warehouse`.
    pub fn new(catalog_url: &str, warehouse: &str, table: &str) -> Self {
        IcebergConfig {
            catalog_url: catalog_url.to_string(),
            catalog_name: default_catalog_name(),
            warehouse: warehouse.to_string(),
            table: table.to_string(),
            partition_field: default_partition_field(),
            partitioning: default_partitioning(),
            s3: S3Config::default(),
            target_file_bytes: default_target_file_bytes(),
            keep_snapshots: None,
            retry: RetryPolicy::default(),
        }
    }

    /// The table's namespace levels and name.
    pub fn table_ident(&self) -> Result<(Vec<String>, String)> {
        let parts: Vec<&str> = self.table.split('.').collect();
        if parts.len() < 2 || parts.iter().any(|p| p.trim().is_empty()) {
            return Err(Error::config(
                "iceberg.table",
                format!("`{}` is not NAMESPACE.TABLE (e.g. sensors.readings)", self.table),
            ));
        }
        let (name, namespace) = parts.split_last().map(|(n, ns)| (n.to_string(), ns)).unwrap_or_default();
        Ok((namespace.iter().map(|s| s.to_string()).collect(), name))
    }

    /// The warehouse as an absolute URI (`file:///…` or `s3://…`), without a trailing `/`.
    pub fn warehouse_uri(&self) -> Result<String> {
        let url = StorageUrl::parse(&self.warehouse).map_err(|e| {
            Error::config(
                "iceberg.warehouse",
                e.to_string().replace("checkpoint storage url", "iceberg warehouse"),
            )
        })?;
        Ok(match url {
            StorageUrl::S3 { bucket, prefix } if prefix.is_empty() => format!("s3://{bucket}"),
            StorageUrl::S3 { bucket, prefix } => format!("s3://{bucket}/{prefix}"),
            StorageUrl::Local(dir) => {
                std::fs::create_dir_all(&dir).map_err(|e| {
                    Error::config("iceberg.warehouse", format!("creating {}: {e}", dir.display()))
                })?;
                let abs = dir.canonicalize().map_err(|e| {
                    Error::config("iceberg.warehouse", format!("resolving {}: {e}", dir.display()))
                })?;
                format!("file://{}", abs.display().to_string().trim_end_matches('/'))
            }
        })
    }

    /// Checks every setting, naming the one at fault.
    pub fn validate(&self) -> Result<()> {
        let url = &self.catalog_url;
        let sql = url.starts_with("postgres://") || url.starts_with("postgresql://");
        if !sql && !super::catalog::rest::is_rest_url(url) {
            return Err(Error::config(
                "iceberg.catalog_url",
                format!(
                    "`{url}` is neither a postgres:// URL (the SQL catalog's database) nor an \
                     http:// or https:// URL (a REST catalog)"
                ),
            ));
        }
        if !sql && url.trim_end_matches('/').split_once("://").is_none_or(|(_, rest)| rest.is_empty()) {
            return Err(Error::config("iceberg.catalog_url", format!("`{url}` names no host")));
        }
        if self.catalog_name.trim().is_empty() {
            return Err(Error::config("iceberg.catalog_name", "is empty"));
        }
        self.table_ident()?;
        StorageUrl::parse(&self.warehouse).map_err(|e| {
            Error::config(
                "iceberg.warehouse",
                e.to_string().replace("checkpoint storage url", "iceberg warehouse"),
            )
        })?;
        if self.target_file_bytes < 1024 {
            return Err(Error::config("iceberg.target_file_bytes", "must be at least 1024"));
        }
        if self.keep_snapshots == Some(0) {
            return Err(Error::config("iceberg.keep_snapshots", "must be at least 1 (the current snapshot)"));
        }
        self.retry.validate("iceberg")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_needs_a_namespace_and_a_catalog_a_postgres_or_rest_url() {
        let c = IcebergConfig::new("postgres://u@h/db", "/tmp/w", "sensors.readings");
        assert_eq!(c.table_ident().unwrap(), (vec!["sensors".to_string()], "readings".to_string()));
        let nested = IcebergConfig::new("postgres://u@h/db", "/tmp/w", "a.b.t");
        assert_eq!(nested.table_ident().unwrap(), (vec!["a".to_string(), "b".to_string()], "t".to_string()));
        for bad in ["readings", "sensors.", ".readings"] {
            let err = IcebergConfig::new("postgres://u@h/db", "/tmp/w", bad).validate().unwrap_err();
            assert!(err.to_string().contains("iceberg.table"), "{err}");
        }
        for bad in ["mysql://h/db", "http://", "https:///", "127.0.0.1:8181"] {
            let err = IcebergConfig::new(bad, "/tmp/w", "a.b").validate().unwrap_err();
            assert!(err.to_string().contains("iceberg.catalog_url"), "{bad}: {err}");
        }
        for good in ["postgresql://h/db", "http://127.0.0.1:8181", "https://catalog.example.com/api/catalog/"]
        {
            IcebergConfig::new(good, "/tmp/w", "a.b").validate().unwrap();
        }
        let err = IcebergConfig::new("postgres://h/db", "gs://x", "a.b").validate().unwrap_err();
        assert!(err.to_string().contains("iceberg.warehouse"), "{err}");
        assert_eq!("day".parse::<Partitioning>(), Ok(Partitioning::Day));
        assert!("week".parse::<Partitioning>().is_err());
    }
}

//! [`PostgresSinkConfig`]: where and how the PostgreSQL sink writes; built into a
//! [`PostgresSink`] by [`PostgresSinkConfig::build`].

use super::sink::PostgresSink;
use super::tls::MakeRustls;
use crate::retry::RetryPolicy;
use caudal::{Error, Result};
use serde::{Deserialize, Serialize};

/// Settings of one PostgreSQL sink (one table).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresSinkConfig {
    /// Connection URL: `postgres://user[:password]@host[:port]/database[?options]`.
    pub url: String,
    /// Schema of the table and of the `caudal_sink_epochs` bookkeeping table (created if
    /// absent).
    #[serde(default = "default_schema")]
    pub schema: String,
    /// The table records are upserted into; created if absent with one column per field of
    /// the record (integers `BIGINT`, floats `DOUBLE PRECISION`, booleans, strings `TEXT`).
    pub table: String,
    /// The primary key: the upsert's conflict target (e.g. `["sensor_id", "ts"]`).
    pub key: Vec<String>,
    /// Rows per `INSERT … ON CONFLICT` statement.
    #[serde(default = "default_batch_rows")]
    pub batch_rows: usize,
    /// Rows are sent at the latest this long after they arrived (ms), even if fewer than
    /// `batch_rows` are waiting. They become visible when their checkpoint completes.
    #[serde(default = "default_linger_ms")]
    pub linger_ms: u64,
    /// Timeout of one connection attempt or statement, seconds.
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
    /// Retries while the database is unreachable.
    #[serde(default)]
    pub retry: RetryPolicy,
}

fn default_schema() -> String {
    "public".to_string()
}
fn default_batch_rows() -> usize {
    4096
}
fn default_linger_ms() -> u64 {
    200
}
fn default_timeout_secs() -> u64 {
    30
}

impl PostgresSinkConfig {
    /// A sink of `table` keyed by `key`, other settings at their defaults.
    pub fn new(url: impl Into<String>, table: impl Into<String>, key: &[&str]) -> Self {
        PostgresSinkConfig {
            url: url.into(),
            schema: default_schema(),
            table: table.into(),
            key: key.iter().map(|k| k.to_string()).collect(),
            batch_rows: default_batch_rows(),
            linger_ms: default_linger_ms(),
            timeout_secs: default_timeout_secs(),
            retry: RetryPolicy::default(),
        }
    }

    /// Checks every setting, naming the one at fault (the CA and key files the URL names
    /// are read).
    pub fn validate(&self) -> Result<()> {
        self.connection().map(|_| ())
    }

    /// The connection settings and the TLS connector the URL asks for, every setting
    /// checked.
    pub(crate) fn connection(&self) -> Result<(tokio_postgres::Config, MakeRustls)> {
        let (pg, tls) = super::tls::parse(&self.url).map_err(|e| {
            Error::config(
                "postgres.url",
                format!(
                    "cannot use `{}`: {e}; expected postgres://user@host:port/database[?sslmode=…]",
                    redact(&self.url)
                ),
            )
        })?;
        if pg.get_dbname().is_none() {
            return Err(Error::config(
                "postgres.url",
                "names no database: postgres://user@host:port/DATABASE",
            ));
        }
        identifier("postgres.schema", &self.schema)?;
        identifier("postgres.table", &self.table)?;
        if self.key.is_empty() {
            return Err(Error::config(
                "postgres.key",
                "needs at least one column (the upsert's conflict target)",
            ));
        }
        for k in &self.key {
            identifier("postgres.key", k)?;
        }
        if self.batch_rows == 0 || self.batch_rows > 100_000 {
            return Err(Error::config("postgres.batch_rows", "must be between 1 and 100000"));
        }
        if self.timeout_secs == 0 {
            return Err(Error::config("postgres.timeout_secs", "must be at least 1"));
        }
        self.retry.validate("postgres")?;
        Ok((pg, tls))
    }

    /// Validates and builds the sink for records of type `T`.
    pub fn build<T>(&self) -> Result<PostgresSink<T>> {
        let (pg, tls) = self.connection()?;
        Ok(PostgresSink::new(self.clone(), pg, tls))
    }
}

/// An SQL identifier we can quote safely.
fn identifier(setting: &str, name: &str) -> Result<()> {
    if name.is_empty() || name.len() > 63 || name.contains('\0') {
        return Err(Error::config(setting, format!("`{name}` is not a valid identifier (1 to 63 bytes)")));
    }
    Ok(())
}

/// `"name"` with inner quotes doubled.
pub(crate) fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The URL without its password, for messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_setting() {
        let ok = PostgresSinkConfig::new("postgres://u@127.0.0.1:5432/db", "t", &["a"]);
        assert!(ok.validate().is_ok());
        let mut c = ok.clone();
        c.url = "postgres://u@127.0.0.1:5432".into();
        assert!(c.validate().unwrap_err().to_string().contains("postgres.url"));
        let mut c = ok.clone();
        c.key.clear();
        assert!(c.validate().unwrap_err().to_string().contains("postgres.key"));
        let mut c = ok;
        c.table = String::new();
        assert!(c.validate().unwrap_err().to_string().contains("postgres.table"));
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let e =
            serde_json::from_str::<PostgresSinkConfig>(r#"{"url":"x","table":"t","key":["a"],"bogus":1}"#);
        assert!(e.is_err());
    }

    #[test]
    fn passwords_are_redacted_and_names_quoted() {
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(quote("a\"b"), "\"a\"\"b\"");
    }
}

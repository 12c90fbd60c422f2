//! [`RedisSinkConfig`]: where the Redis sink writes; built into a [`RedisSink`] by
//! [`RedisSinkConfig::build`].

use super::sink::RedisSink;
use crate::retry::RetryPolicy;
use caudal::{Error, Result};
use serde::{Deserialize, Serialize};

/// Settings of a Redis latest-value sink.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSinkConfig {
    /// `redis://[user:password@]host:port[/db]`, or `rediss://…` for TLS (the server's
    /// certificate checked against the system's roots, or `tls_ca`).
    pub url: String,
    /// PEM file of the CA(s) a `rediss://` server's certificate must be signed by.
    #[serde(default)]
    pub tls_ca: Option<std::path::PathBuf>,
    /// PEM files of a client certificate and its key, for a server that asks for one.
    #[serde(default)]
    pub tls_client_cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// Prefix of every hash key: the record with key `7` goes to `<prefix>7`.
    #[serde(default = "default_prefix")]
    pub key_prefix: String,
    /// Timeout of one connection attempt or pipeline, seconds.
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
    /// Retries while Redis is unreachable.
    #[serde(default)]
    pub retry: RetryPolicy,
}

fn default_prefix() -> String {
    "sensor:".to_string()
}
fn default_timeout_secs() -> u64 {
    10
}

impl RedisSinkConfig {
    /// A sink writing `sensor:<key>` hashes to `url`.
    pub fn new(url: impl Into<String>) -> Self {
        RedisSinkConfig {
            url: url.into(),
            tls_ca: None,
            tls_client_cert: None,
            key_prefix: default_prefix(),
            timeout_secs: default_timeout_secs(),
            retry: RetryPolicy::default(),
        }
    }

    /// Checks every setting, naming the one at fault.
    pub fn validate(&self) -> Result<::redis::Client> {
        if self.timeout_secs == 0 {
            return Err(Error::config("redis.timeout_secs", "must be at least 1"));
        }
        self.retry.validate("redis")?;
        let bad = |e: &dyn std::fmt::Display| {
            Error::config(
                "redis.url",
                format!(
                    "cannot use `{}`: {e}; expected redis[s]://[user:password@]host:port/",
                    redact(&self.url)
                ),
            )
        };
        // `${env:NAME}` reads a variable (the password, typically).
        let url = caudal_schemas::client_properties::expand_env(&self.url).map_err(|e| bad(&e))?;
        if self.tls_ca.is_none() && self.tls_client_cert.is_none() {
            return ::redis::Client::open(url.as_str()).map_err(|e| bad(&e));
        }
        if !url.starts_with("rediss://") {
            return Err(Error::config("redis.tls_ca", "TLS settings need a rediss:// URL"));
        }
        let read = |setting: &str, path: &std::path::Path| {
            std::fs::read(path)
                .map_err(|e| Error::config(setting, format!("cannot read {}: {e}", path.display())))
        };
        let root_cert = self.tls_ca.as_deref().map(|ca| read("redis.tls_ca", ca)).transpose()?;
        let client_tls = match &self.tls_client_cert {
            Some((cert, key)) => Some(::redis::ClientTlsConfig {
                client_cert: read("redis.tls_client_cert", cert)?,
                client_key: read("redis.tls_client_cert", key)?,
            }),
            None => None,
        };
        ::redis::Client::build_with_tls(url.as_str(), ::redis::TlsCertificates { client_tls, root_cert })
            .map_err(|e| bad(&e))
    }

    /// Validates and builds the sink for records of type `T`.
    pub fn build<T>(&self) -> Result<RedisSink<T>> {
        let client = self.validate()?;
        Ok(RedisSink::new(self.clone(), client))
    }
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    crate::postgres::redact(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_url_names_the_setting() {
        assert!(RedisSinkConfig::new("redis://127.0.0.1:6379/").validate().is_ok());
        let e = RedisSinkConfig::new("http://x").validate().unwrap_err().to_string();
        assert!(e.contains("redis.url"), "{e}");
        let e = RedisSinkConfig::new("http://u:secret@x").validate().unwrap_err().to_string();
        assert!(!e.contains("secret"), "{e}");
        let tls = RedisSinkConfig {
            tls_ca: Some("/nonexistent/ca.pem".into()),
            ..RedisSinkConfig::new("redis://x/")
        };
        assert!(tls.validate().unwrap_err().to_string().contains("rediss://"));
        let tls = RedisSinkConfig { url: "rediss://x/".into(), ..tls };
        assert!(tls.validate().unwrap_err().to_string().contains("/nonexistent/ca.pem"));
    }
}

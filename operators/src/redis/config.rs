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
    /// `redis://[user:password@]host:port[/db]`.
    pub url: String,
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
        ::redis::Client::open(self.url.as_str()).map_err(|e| {
            Error::config("redis.url", format!("cannot use `{}`: {e}; expected redis://host:port/", self.url))
        })
    }

    /// Validates and builds the sink for records of type `T`.
    pub fn build<T>(&self) -> Result<RedisSink<T>> {
        let client = self.validate()?;
        Ok(RedisSink::new(self.clone(), client))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_url_names_the_setting() {
        assert!(RedisSinkConfig::new("redis://127.0.0.1:6379/").validate().is_ok());
        let e = RedisSinkConfig::new("http://x").validate().unwrap_err().to_string();
        assert!(e.contains("redis.url"), "{e}");
    }
}

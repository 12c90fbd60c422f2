//! The job's engine configuration: the one place that reads `CAUDAL__*` variables.

use crate::{Error, Result};
use std::time::Duration;

/// Engine settings of a job. Defaults suit a laptop; every field can be set by the job
/// binary (from its flags) and overridden by `CAUDAL__<KEY>` environment variables.
#[derive(Debug, Clone)]
pub struct JobConfig {
    /// Default parallelism of every operator that sets none (`CAUDAL__PARALLELISM`).
    pub parallelism: u32,
    /// Number of key groups: the upper bound of any keyed operator's parallelism.
    pub max_parallelism: u32,
    /// Records per batch on channels (`CAUDAL__BATCH_SIZE`).
    pub batch_size: usize,
    /// Capacity of each channel, in records (`CAUDAL__CHANNEL_CAPACITY`).
    pub channel_capacity: usize,
    /// How long a source waits to fill a batch before sending it anyway.
    pub linger: Duration,
    /// Print a progress line this often (`None`: quiet).
    pub progress_interval: Option<Duration>,
    /// Stop cleanly on SIGINT/SIGTERM.
    pub handle_signals: bool,
    /// Serve the REST API and web UI on this address while the job runs (`None`: no
    /// server; `CAUDAL__WEB_BIND`, `off` disables). Bind 127.0.0.1 unless other hosts
    /// should reach it.
    pub web_bind: Option<std::net::SocketAddr>,
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            parallelism: 1,
            max_parallelism: crate::keygroup::DEFAULT_MAX_PARALLELISM,
            batch_size: 1024,
            channel_capacity: 16 * 1024,
            linger: Duration::from_millis(5),
            progress_interval: None,
            handle_signals: true,
            web_bind: None,
        }
    }
}

impl JobConfig {
    /// Apply `CAUDAL__*` environment overrides.
    pub fn with_env_overrides(mut self) -> Result<Self> {
        for (key, value) in std::env::vars() {
            let Some(name) = key.strip_prefix("CAUDAL__") else {
                continue;
            };
            let parse_u = |v: &str| -> Result<u64> {
                v.parse::<u64>()
                    .map_err(|_| Error::config(key.clone(), format!("expected a whole number, got `{v}`")))
            };
            match name {
                "PARALLELISM" => self.parallelism = parse_u(&value)? as u32,
                "MAX_PARALLELISM" => self.max_parallelism = parse_u(&value)? as u32,
                "BATCH_SIZE" => self.batch_size = parse_u(&value)? as usize,
                "CHANNEL_CAPACITY" => self.channel_capacity = parse_u(&value)? as usize,
                "WEB_BIND" => {
                    self.web_bind = match value.trim() {
                        "" | "off" | "none" => None,
                        v => Some(v.parse().map_err(|_| {
                            Error::config(
                                key.clone(),
                                format!("expected an address like 127.0.0.1:8081, got `{v}`"),
                            )
                        })?),
                    }
                }
                _ => {}
            }
        }
        Ok(self)
    }

    /// Check the settings, naming the one at fault.
    pub fn validate(&self) -> Result<()> {
        if self.parallelism == 0 {
            return Err(Error::config("parallelism", "must be at least 1"));
        }
        if self.max_parallelism == 0 || self.max_parallelism > u32::from(u16::MAX) {
            return Err(Error::config("max_parallelism", "must be between 1 and 65535"));
        }
        if self.parallelism > self.max_parallelism {
            return Err(Error::config(
                "parallelism",
                format!("{} exceeds max_parallelism {}", self.parallelism, self.max_parallelism),
            ));
        }
        if self.batch_size == 0 {
            return Err(Error::config("batch_size", "must be at least 1"));
        }
        if self.channel_capacity < self.batch_size {
            return Err(Error::config("channel_capacity", "must hold at least one batch (>= batch_size)"));
        }
        Ok(())
    }
}

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
    /// Host names the web server answers to besides IP addresses and `localhost`: a request
    /// naming another host is refused (DNS rebinding). `CAUDAL__WEB_ALLOWED_HOSTS`,
    /// comma-separated.
    pub web_allowed_hosts: Vec<String>,
    /// A secret file (at least 16 bytes, e.g. `openssl rand -hex 32`): every request must
    /// carry it as `Authorization: Bearer …`, or a session cookie from signing in with it.
    /// Required off loopback (`CAUDAL__WEB_SECRET_FILE`).
    pub web_secret_file: Option<std::path::PathBuf>,
    /// Checkpointing: interval, storage, retention, restore.
    pub checkpoints: CheckpointConfig,
    /// Keyed state (`state.backend`): RocksDB (default) or heap, cache and RocksDB tuning
    /// (`CAUDAL__STATE_BACKEND=rocksdb|heap`).
    pub state: caudal_checkpoints::StateBackendConfig,
    /// Local working directory of the RocksDB backends (`CAUDAL__STATE_DIR`); default: a
    /// fresh directory under the system temp dir, removed when the job ends.
    pub state_dir: Option<std::path::PathBuf>,
    /// How often each source subtask emits a latency marker, from which every operator
    /// keeps a latency histogram (p50/p99/max in the REST API and `/metrics`); `None`
    /// disables them (`CAUDAL__LATENCY_MARKER_INTERVAL_MS`, 0 disables). Default 200 ms.
    pub latency_marker_interval: Option<Duration>,
    /// Tests only: SIGKILL the process at this crash point of this checkpoint
    /// (`CAUDAL__TEST_CRASH_AT=<point>:<checkpoint>`, see [`crate::crash`]).
    pub crash_at: Option<(String, u64)>,
    /// Tests: hold the thread at a crash point for a while instead
    /// (`CAUDAL__TEST_PAUSE_AT=<point>:<checkpoint>:<ms>`, see `crate::crash`).
    pub pause_at: Option<(String, u64, u64)>,
    /// Tests: freeze the whole process (SIGSTOP, as a frozen VM) at a crash point, until it
    /// is sent SIGCONT (`CAUDAL__TEST_FREEZE_AT=<point>:<checkpoint>`).
    pub freeze_at: Option<(String, u64)>,
}

/// Where a job restores from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreFrom {
    /// The latest completed checkpoint in the checkpoint storage.
    Latest,
    /// A checkpoint or savepoint directory (`chk-7`, `savepoints/NAME`, or a full path under storage).
    Path(String),
}

impl std::str::FromStr for RestoreFrom {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "" => Err(Error::config("restore", "expected `latest` or a checkpoint path")),
            "latest" => Ok(RestoreFrom::Latest),
            p => Ok(RestoreFrom::Path(p.to_string())),
        }
    }
}

/// Checkpoint settings (Flink's `execution.checkpointing.*`).
#[derive(Debug, Clone)]
pub struct CheckpointConfig {
    /// Time between checkpoints; `None` disables checkpointing (`CAUDAL__CHECKPOINT_INTERVAL_MS`).
    pub interval: Option<Duration>,
    /// A checkpoint not complete after this long is aborted (`CAUDAL__CHECKPOINT_TIMEOUT_MS`).
    pub timeout: Duration,
    /// Failed checkpoints in a row the job survives; one more fails the job, so that sinks'
    /// pending transactions never outlive their timeouts unnoticed (Flink's
    /// `execution.checkpointing.tolerable-failed-checkpoints`, default 0 as there;
    /// `CAUDAL__TOLERABLE_FAILED_CHECKPOINTS`).
    pub tolerable_failed_checkpoints: u32,
    /// Minimum time between the end of one checkpoint and the start of the next.
    pub min_pause: Duration,
    /// Storage: a directory (default `data/checkpoints`), `file:///abs/path` or
    /// `s3://bucket/prefix` with S3 settings (`CAUDAL__CHECKPOINT_DIR` sets the URL).
    /// Each job keeps its checkpoints under `<storage>/<job name>/`.
    pub storage: caudal_checkpoints::CheckpointStorageConfig,
    /// Completed checkpoints kept (older ones and their unreferenced files are deleted).
    pub retained: usize,
    /// Restore from this checkpoint at start.
    pub restore: Option<RestoreFrom>,
    /// With `restore = latest`: skip a corrupt latest checkpoint and use the previous one.
    pub fallback: bool,
    /// Restore even when the checkpoint holds state of operators (by uid) that the job no
    /// longer has, dropping that state with a warning per uid; otherwise such a restore
    /// fails before processing (Flink's `--allowNonRestoredState`;
    /// `CAUDAL__ALLOW_NON_RESTORED_STATE=1`).
    pub allow_non_restored_state: bool,
    /// On a stop (Ctrl-C, SIGTERM, `StopHandle`), keep the final checkpoint as the savepoint
    /// `savepoints/<name>` (a self-contained copy retention never deletes; restore it with
    /// `restore = Path("savepoints/<name>")`).
    pub savepoint_on_stop: Option<String>,
}

impl CheckpointConfig {
    /// True when the job checkpoints: it has an interval, or it restores (then at least its
    /// final checkpoint is taken, and sinks commit only what a checkpoint covers).
    pub fn enabled(&self) -> bool {
        self.interval.is_some() || self.restore.is_some()
    }
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            interval: None,
            timeout: Duration::from_secs(600),
            tolerable_failed_checkpoints: 0,
            min_pause: Duration::ZERO,
            storage: caudal_checkpoints::CheckpointStorageConfig {
                url: "data/checkpoints".to_string(),
                ..Default::default()
            },
            retained: 3,
            restore: None,
            fallback: false,
            allow_non_restored_state: false,
            savepoint_on_stop: None,
        }
    }
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
            web_allowed_hosts: Vec::new(),
            web_secret_file: None,
            checkpoints: CheckpointConfig::default(),
            state: caudal_checkpoints::StateBackendConfig::default(),
            state_dir: None,
            latency_marker_interval: Some(Duration::from_millis(200)),
            crash_at: None,
            pause_at: None,
            freeze_at: None,
        }
    }
}

/// The `CAUDAL__<NAME>` settings [`JobConfig::with_overrides`] reads (`S3__<FIELD>` for
/// the S3 ones).
const KNOWN_VARIABLES: &[&str] = &[
    "PARALLELISM",
    "MAX_PARALLELISM",
    "BATCH_SIZE",
    "CHANNEL_CAPACITY",
    "CHECKPOINT_INTERVAL_MS",
    "CHECKPOINT_DIR",
    "CHECKPOINT_TIMEOUT_MS",
    "TOLERABLE_FAILED_CHECKPOINTS",
    "ALLOW_NON_RESTORED_STATE",
    "S3__<FIELD>",
    "STATE_BACKEND",
    "STATE_CACHE_MB",
    "STATE_DIR",
    "LATENCY_MARKER_INTERVAL_MS",
    "TEST_CRASH_AT",
    "TEST_PAUSE_AT",
    "WEB_ALLOWED_HOSTS",
    "WEB_BIND",
];

/// `CAUDAL__<NAME>` variables that set the process's role, not a setting
/// (`crate::cluster::role`).
const ROLE_VARIABLES: &[&str] = &["PRINT_PLAN", "EXECUTOR", "EXECUTOR_ID", "EXECUTOR_WATCH_STDIN"];

impl JobConfig {
    /// Apply `CAUDAL__*` environment overrides.
    pub fn with_env_overrides(self) -> Result<Self> {
        self.with_overrides(std::env::vars())
    }

    /// [`Self::with_env_overrides`] over the given `(name, value)` variables. A `CAUDAL__`
    /// name that is no setting is an error naming it (a typo must not run the job with a
    /// default silently), except the process roles `crate::cluster::role` reads.
    pub fn with_overrides(mut self, vars: impl IntoIterator<Item = (String, String)>) -> Result<Self> {
        for (key, value) in vars {
            let Some(name) = key.strip_prefix("CAUDAL__") else {
                continue;
            };
            let parse_u = |v: &str| -> Result<u64> {
                v.parse::<u64>()
                    .map_err(|_| Error::config(key.clone(), format!("expected a whole number, got `{v}`")))
            };
            // A crash or pause point's checkpoint: a number, or `final`.
            let parse_checkpoint = |v: &str| -> Result<u64> {
                if v == "final" {
                    Ok(crate::crash::FINAL)
                } else {
                    parse_u(v)
                }
            };
            // `<point>:<checkpoint>` (a crash or freeze point).
            let point_at = |value: &str| -> Result<(String, u64)> {
                let (point, id) = value.rsplit_once(':').ok_or_else(|| {
                    Error::config(
                        key.clone(),
                        "expected <point>:<checkpoint>, e.g. before-metadata:3 or during-sink-commit:final",
                    )
                })?;
                Ok((point.to_string(), parse_checkpoint(id)?))
            };
            match name {
                "PARALLELISM" => self.parallelism = parse_u(&value)? as u32,
                "MAX_PARALLELISM" => self.max_parallelism = parse_u(&value)? as u32,
                "BATCH_SIZE" => self.batch_size = parse_u(&value)? as usize,
                "CHANNEL_CAPACITY" => self.channel_capacity = parse_u(&value)? as usize,
                "CHECKPOINT_INTERVAL_MS" => {
                    let ms = parse_u(&value)?;
                    self.checkpoints.interval = (ms > 0).then(|| Duration::from_millis(ms));
                }
                "CHECKPOINT_DIR" => self.checkpoints.storage.url = value.clone(),
                "CHECKPOINT_TIMEOUT_MS" => {
                    let ms = parse_u(&value)?;
                    if ms == 0 {
                        return Err(Error::config(key.clone(), "must be at least 1"));
                    }
                    self.checkpoints.timeout = Duration::from_millis(ms);
                }
                "TOLERABLE_FAILED_CHECKPOINTS" => {
                    self.checkpoints.tolerable_failed_checkpoints =
                        u32::try_from(parse_u(&value)?).unwrap_or(u32::MAX)
                }
                "ALLOW_NON_RESTORED_STATE" => {
                    self.checkpoints.allow_non_restored_state =
                        parse_flag(&value).map_err(|m| Error::config(key.clone(), m))?
                }
                s3 if s3.starts_with("S3__") => self.set_s3(&key, &s3[4..], &value)?,
                "STATE_BACKEND" => {
                    self.state.kind = parse_backend(&value).map_err(|m| Error::config(key.clone(), m))?
                }
                "STATE_CACHE_MB" => self.state.cache_mb = Some(parse_u(&value)? as usize),
                "STATE_DIR" => self.state_dir = Some(value.clone().into()),
                "LATENCY_MARKER_INTERVAL_MS" => {
                    let ms = parse_u(&value)?;
                    self.latency_marker_interval = (ms > 0).then(|| Duration::from_millis(ms));
                }
                "TEST_CRASH_AT" => self.crash_at = Some(point_at(&value)?),
                "TEST_FREEZE_AT" => self.freeze_at = Some(point_at(&value)?),
                "TEST_PAUSE_AT" => {
                    let bad = || {
                        Error::config(
                            key.clone(),
                            "expected <point>:<checkpoint>:<ms>, e.g. after-metadata-before-notify:3:5000",
                        )
                    };
                    let mut parts = value.rsplitn(3, ':');
                    let (ms, id, point) = (parts.next(), parts.next(), parts.next());
                    let (Some(ms), Some(id), Some(point)) = (ms, id, point) else { return Err(bad()) };
                    self.pause_at = Some((point.to_string(), parse_checkpoint(id)?, parse_u(ms)?));
                }
                "WEB_ALLOWED_HOSTS" => {
                    self.web_allowed_hosts = value
                        .split(',')
                        .map(str::trim)
                        .filter(|h| !h.is_empty())
                        .map(str::to_string)
                        .collect()
                }
                "WEB_SECRET_FILE" => {
                    self.web_secret_file = Some(value.trim()).filter(|v| !v.is_empty()).map(Into::into)
                }
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
                role if ROLE_VARIABLES.contains(&role) => {}
                _ => {
                    return Err(Error::config(
                        key.clone(),
                        format!("unknown setting; known: {}", KNOWN_VARIABLES.join(", ")),
                    ))
                }
            }
        }
        Ok(self)
    }

    /// `CAUDAL__S3__<FIELD>`: the S3 settings of checkpoint storage, also used by sinks
    /// that write to S3 (the archive).
    fn set_s3(&mut self, key: &str, field: &str, value: &str) -> Result<()> {
        let s3 = &mut self.checkpoints.storage.s3;
        let flag = |v: &str| parse_flag(v).map_err(|m| Error::config(key, m));
        let text = |v: &str| (!v.trim().is_empty()).then(|| v.trim().to_string());
        match field {
            "ENDPOINT" => s3.endpoint = text(value),
            "REGION" => s3.region = value.trim().to_string(),
            "ACCESS_KEY_ID" => s3.access_key_id = text(value),
            "SECRET_ACCESS_KEY" => s3.secret_access_key = text(value),
            "SESSION_TOKEN" => s3.session_token = text(value),
            "ALLOW_HTTP" => s3.allow_http = flag(value)?,
            "VIRTUAL_HOSTED_STYLE" => s3.virtual_hosted_style = flag(value)?,
            "CONDITIONAL_PUT" => s3.conditional_put = flag(value)?,
            _ => {
                return Err(Error::config(
                    key,
                    "unknown S3 setting; known: ENDPOINT, REGION, ACCESS_KEY_ID, SECRET_ACCESS_KEY, \
                     SESSION_TOKEN, ALLOW_HTTP, VIRTUAL_HOSTED_STYLE, CONDITIONAL_PUT",
                ))
            }
        }
        Ok(())
    }

    /// Check the settings, naming the one at fault.
    pub fn validate(&self) -> Result<()> {
        self.state.validate().map_err(|e| Error::config("state", e.to_string()))?;
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

/// Parses `state.backend`: `rocksdb` or `heap`.
pub fn parse_backend(value: &str) -> std::result::Result<caudal_checkpoints::BackendKind, String> {
    match value.trim() {
        "rocksdb" => Ok(caudal_checkpoints::BackendKind::Rocksdb),
        "heap" => Ok(caudal_checkpoints::BackendKind::Heap),
        v => Err(format!("expected `rocksdb` or `heap`, got `{v}`")),
    }
}

/// `1`/`true`/`yes`/`on` or `0`/`false`/`no`/`off`.
fn parse_flag(v: &str) -> std::result::Result<bool, String> {
    match v.trim() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        other => Err(format!("expected true or false, got `{other}`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn an_unknown_setting_is_an_error_naming_it_and_roles_and_other_variables_pass() {
        let e = JobConfig::default()
            .with_overrides(vars(&[("CAUDAL__CHECKPOINT_INTERVAL", "1000")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("CAUDAL__CHECKPOINT_INTERVAL") && e.contains("CHECKPOINT_INTERVAL_MS"), "{e}");
        let c = JobConfig::default()
            .with_overrides(vars(&[
                ("CAUDAL__CHECKPOINT_INTERVAL_MS", "1000"),
                ("CAUDAL__STATE_CACHE_MB", "32"),
                ("CAUDAL__EXECUTOR_ID", "x"),
                ("CAUDAL_KAFKA_BROKERS", "not ours"),
                ("PATH", "/bin"),
            ]))
            .unwrap();
        assert_eq!(c.checkpoints.interval, Some(Duration::from_millis(1000)));
        assert_eq!(c.state.cache_bytes(), 32 << 20);
    }

    #[test]
    fn s3_settings_from_variables() {
        let mut c = JobConfig::default();
        c.set_s3("CAUDAL__S3__ENDPOINT", "ENDPOINT", "http://127.0.0.1:19000").unwrap();
        c.set_s3("CAUDAL__S3__ALLOW_HTTP", "ALLOW_HTTP", "true").unwrap();
        c.set_s3("CAUDAL__S3__ACCESS_KEY_ID", "ACCESS_KEY_ID", "k").unwrap();
        let s3 = &c.checkpoints.storage.s3;
        assert_eq!(s3.endpoint.as_deref(), Some("http://127.0.0.1:19000"));
        assert!(s3.allow_http);
        assert_eq!(s3.access_key_id.as_deref(), Some("k"));
        let e = c.set_s3("CAUDAL__S3__ALLOW_HTTP", "ALLOW_HTTP", "maybe").unwrap_err().to_string();
        assert!(e.contains("CAUDAL__S3__ALLOW_HTTP"), "{e}");
        assert!(c.set_s3("CAUDAL__S3__BOGUS", "BOGUS", "x").is_err());
    }
}

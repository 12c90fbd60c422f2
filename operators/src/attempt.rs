//! This process's attempt id: names the in-progress output of one run of a job so that a
//! restore can tell its own files and transactions from those of crashed earlier runs.

use std::sync::OnceLock;

/// A short hex id, unique per process (start time in ns mixed with the pid).
pub fn id() -> &'static str {
    static ATTEMPT: OnceLock<String> = OnceLock::new();
    ATTEMPT.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        format!("{:x}", nanos ^ (u64::from(std::process::id()) << 32))
    })
}

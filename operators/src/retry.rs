//! Bounded retry with exponential backoff for sinks that talk to an external service.
//!
//! A sink classifies each failure as [`Failure::Transient`] (the service went away, a
//! timeout: try again after a pause) or [`Failure::Permanent`] (wrong password, missing
//! permission, bad SQL: fail the job now). While a sink retries it blocks its task, so the
//! job backpressures instead of dropping records. Every retry is logged; after
//! [`RetryPolicy::give_up_after`] the last cause fails the job.

use caudal::{Error, Result};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How a sink retries transient failures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// First pause after a failure, ms.
    #[serde(default = "default_initial_ms")]
    pub initial_backoff_ms: u64,
    /// Longest pause between two attempts, ms (the pause doubles up to this).
    #[serde(default = "default_max_ms")]
    pub max_backoff_ms: u64,
    /// Fail the job when the service stays unreachable this long, seconds.
    #[serde(default = "default_give_up_secs")]
    pub give_up_after_secs: u64,
}

fn default_initial_ms() -> u64 {
    100
}
fn default_max_ms() -> u64 {
    5_000
}
fn default_give_up_secs() -> u64 {
    300
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial_backoff_ms: default_initial_ms(),
            max_backoff_ms: default_max_ms(),
            give_up_after_secs: default_give_up_secs(),
        }
    }
}

/// What went wrong in one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Worth another attempt (connection refused or lost, timeout, server starting up).
    Transient(String),
    /// Another attempt cannot help (authentication, permission, invalid statement).
    Permanent(String),
}

impl Failure {
    /// The cause.
    pub fn message(&self) -> &str {
        match self {
            Failure::Transient(m) | Failure::Permanent(m) => m,
        }
    }
}

impl RetryPolicy {
    /// Checks the settings; `field` prefixes the setting names in errors.
    pub fn validate(&self, field: &str) -> Result<()> {
        if self.initial_backoff_ms == 0 || self.max_backoff_ms < self.initial_backoff_ms {
            return Err(Error::config(
                format!("{field}.retry"),
                "need 0 < initial_backoff_ms <= max_backoff_ms",
            ));
        }
        Ok(())
    }

    /// Runs `attempt` until it succeeds, fails permanently or the service stayed away for
    /// `give_up_after_secs`. `what` names the sink and the operation in logs and errors
    /// ("PostgreSQL sink `readings-sink`[0]: writing rows"). `attempt` gets the attempt
    /// number (0 first) so it can reconnect or check what a lost call did. `system` classes
    /// the error ([`Error::External`]): retryable when the service stayed away, not when it
    /// refused.
    pub fn run<T>(
        &self,
        system: &'static str,
        what: &str,
        attempt: impl FnMut(u32) -> Result<T, Failure>,
    ) -> Result<T> {
        self.run_counted(system, what, &AtomicU64::new(0), attempt)
    }

    /// [`RetryPolicy::run`], adding each retry to `retries` (the sink's
    /// [`caudal::metrics::names::SINK_RETRIES`] counter).
    pub fn run_counted<T>(
        &self,
        system: &'static str,
        what: &str,
        retries: &AtomicU64,
        mut attempt: impl FnMut(u32) -> Result<T, Failure>,
    ) -> Result<T> {
        let start = Instant::now();
        let mut backoff = Duration::from_millis(self.initial_backoff_ms);
        let max = Duration::from_millis(self.max_backoff_ms);
        let give_up = Duration::from_secs(self.give_up_after_secs);
        let mut n = 0u32;
        loop {
            match attempt(n) {
                Ok(v) => {
                    if n > 0 {
                        tracing::info!(
                            "caudal: {what}: succeeded after {n} retries ({:.1}s)",
                            start.elapsed().as_secs_f64()
                        );
                    }
                    return Ok(v);
                }
                Err(Failure::Permanent(cause)) => {
                    return Err(Error::external_refused(system, format!("{what}: {cause}")));
                }
                Err(Failure::Transient(cause)) => {
                    if start.elapsed() >= give_up {
                        return Err(Error::external(
                            system,
                            format!(
                                "{what}: gave up after {} attempts over {:.0}s: {cause}",
                                n + 1,
                                start.elapsed().as_secs_f64()
                            ),
                        ));
                    }
                    tracing::warn!("caudal: {what}: {cause}; retrying in {} ms", backoff.as_millis());
                    retries.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(max);
                    n += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick() -> RetryPolicy {
        RetryPolicy { initial_backoff_ms: 1, max_backoff_ms: 2, give_up_after_secs: 1 }
    }

    #[test]
    fn transient_failures_are_retried_until_success() {
        let retries = AtomicU64::new(0);
        let r = quick().run_counted("test", "test", &retries, |n| {
            if n < 3 {
                Err(Failure::Transient("down".into()))
            } else {
                Ok(n)
            }
        });
        assert_eq!(r.ok(), Some(3));
        assert_eq!(retries.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn a_permanent_failure_stops_at_once_and_names_the_cause() {
        let mut calls = 0;
        let r: Result<()> = quick().run("test", "sink x", |_| {
            calls += 1;
            Err(Failure::Permanent("password authentication failed".into()))
        });
        assert_eq!(calls, 1);
        assert!(r.as_ref().is_err_and(|e| !e.is_retryable()), "a refusal is not restarted: {r:?}");
        let e = r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("sink x") && e.contains("password authentication failed"), "{e}");
    }

    #[test]
    fn gives_up_after_the_deadline() {
        let policy = RetryPolicy { initial_backoff_ms: 50, max_backoff_ms: 100, give_up_after_secs: 0 };
        let r: Result<()> = policy.run("test", "sink y", |_| Err(Failure::Transient("refused".into())));
        assert!(r.as_ref().is_err_and(|e| e.is_retryable()), "an outage is restarted: {r:?}");
        let e = r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("gave up") && e.contains("refused"), "{e}");
    }
}

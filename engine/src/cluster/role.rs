//! Which part a job binary plays when `StreamEnv::execute` runs: the embedded default, the
//! plan printer, or a cluster executor. The environment variables below are part of the
//! engine's configuration loader (like `CAUDAL__*` in `config.rs`); task managers and the
//! job manager set them, users do not.
//!
//! | variable | meaning |
//! |---|---|
//! | `CAUDAL__PRINT_PLAN=1` (or the argument `--caudal-plan`) | print the plan as JSON on stdout and exit |
//! | `CAUDAL__PARALLELISM=N` | with the plan printer: the parallelism the job will be submitted with |
//! | `CAUDAL__EXECUTOR=HOST:PORT` | run as an executor of the job manager at that control address |
//! | `CAUDAL__EXECUTOR_ID=ID` | the executor's id, given by the job manager |
//! | `CAUDAL__EXECUTOR_WATCH_STDIN=1` | exit when stdin closes (the task manager died) |

use crate::{Error, Result};

/// The command-line argument that asks a job binary for its plan.
pub const PLAN_ARG: &str = "--caudal-plan";

/// What `execute` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClusterRole {
    /// Run the whole job in this process (the default).
    Embedded,
    /// Print the plan and exit.
    PrintPlan { parallelism: Option<u32> },
    /// Run the subtasks the job manager deploys.
    Executor(Box<ExecutorSettings>),
}

/// How an executor reaches its job manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExecutorSettings {
    /// The job manager's control address (`host:port`).
    pub(crate) jobmanager: String,
    /// This executor's id.
    pub(crate) executor_id: String,
    /// Exit when stdin reaches its end (the parent task manager is gone).
    pub(crate) watch_stdin: bool,
    /// The cluster secret and TLS identity the task manager handed over
    /// (`CAUDAL_CLUSTER_SECRET_FILE`, `CAUDAL_TLS_*`).
    pub(crate) trust: super::transport::ClusterTrust,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl ClusterRole {
    /// The role from the process environment and arguments.
    pub(crate) fn from_env() -> Result<Self> {
        if var("CAUDAL__PRINT_PLAN").is_some_and(|v| v != "0") || std::env::args().any(|a| a == PLAN_ARG) {
            let parallelism = match var("CAUDAL__PARALLELISM") {
                Some(v) => Some(v.trim().parse::<u32>().map_err(|_| {
                    Error::config("CAUDAL__PARALLELISM", format!("expected a whole number, got `{v}`"))
                })?),
                None => None,
            };
            return Ok(ClusterRole::PrintPlan { parallelism });
        }
        if let Some(jobmanager) = var("CAUDAL__EXECUTOR") {
            let executor_id = var("CAUDAL__EXECUTOR_ID").ok_or_else(|| {
                Error::config(
                    "CAUDAL__EXECUTOR_ID",
                    "must be set with CAUDAL__EXECUTOR (task managers set both)",
                )
            })?;
            let watch_stdin = var("CAUDAL__EXECUTOR_WATCH_STDIN").is_some_and(|v| v != "0");
            let trust = super::transport::ClusterTrust::from_env()?;
            return Ok(ClusterRole::Executor(Box::new(ExecutorSettings {
                jobmanager,
                executor_id,
                watch_stdin,
                trust,
            })));
        }
        Ok(ClusterRole::Embedded)
    }
}

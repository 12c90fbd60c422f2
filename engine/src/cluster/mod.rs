//! Cluster mode (DESIGN.md §2): a job manager, task managers, and job binaries run as
//! executor processes.
//!
//! **In:** a job binary submitted to the job manager (`caudal submit`), task managers that
//! register slots. **Out:** the job's subtasks running in child executor processes of the
//! task managers, checkpointed by the job manager's coordinator, restarted from the latest
//! completed checkpoint when an executor or a task manager dies.
//!
//! **Invariant:** a job attempt starts only after every executor of the previous attempt
//! is gone (its control connection closed, or its process reported exited), and it
//! restores the latest checkpoint this submission completed: the sinks' two-phase commit
//! then publishes every record exactly once across failures.
//!
//! The processes:
//! * `caudal jobmanager` ([`jobmanager`]): REST API and UI (HTTP), a control port (framed
//!   TCP, [`protocol`]) for task managers and executors, the checkpoint coordinator and one
//!   driver thread per job (the job's state machine: created → running → failing →
//!   restarting → … → finished / canceled / failed).
//! * `caudal taskmanager` ([`taskmanager`]): registers its slots, heartbeats, fetches job
//!   binaries (content-addressed by sha256) and runs them as child executor processes.
//! * The executor ([`executor`]): the job binary itself, started with `CAUDAL__EXECUTOR`
//!   set. `StreamEnv::execute` then runs the subtasks the job manager deploys and talks to
//!   it instead of running its own coordinator. `CAUDAL__PRINT_PLAN=1` (or `--caudal-plan`)
//!   makes `execute` print the plan as JSON and exit ([`plan`]).
//!
//! A job's subtasks spread over the task managers' slots; channels between executors run
//! over TCP ([`shuffle`]). Every control and shuffle connection goes through
//! [`transport::ClusterTrust`]: mutual TLS ([`tls`], certificates from [`certs`]) and the
//! cluster secret ([`auth`]), each when configured.

pub mod auth;
pub(crate) mod blob;
pub mod certs;
pub mod cli;
pub(crate) mod client;
pub(crate) mod executor;
pub mod jobmanager;
pub(crate) mod plan;
pub(crate) mod protocol;
pub(crate) mod role;
pub(crate) mod shuffle;
pub(crate) mod state_forward;
pub mod taskmanager;
pub mod tls;
pub mod transport;

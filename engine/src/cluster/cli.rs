//! The `caudal` command line: `jobmanager`, `taskmanager`, `submit`, `list`, `savepoint`,
//! `stop`, `cancel`, `certs`.

use super::client::JobManagerClient;
use super::jobmanager::submit::SubmitRequest;
use super::jobmanager::{ClusterJobView, JobManager, JobManagerConfig, RestartStrategy};
use super::taskmanager::{self, TaskManagerConfig};
use super::transport::ClusterTrust;
use crate::job::JobStatus;
use crate::{Error, Result};
use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Caudal cluster: run a job manager and task managers, submit job binaries to them.
#[derive(Debug, Parser)]
#[command(name = "caudal", version, about = "Caudal cluster: run a job manager and task managers, submit job binaries to them", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
    /// The cluster secret (a file of at least 16 bytes, e.g. `openssl rand -hex 32`): the job
    /// manager, every task manager (and through it every executor) and the client commands
    /// must use the same. Control and shuffle connections prove it; a job manager listening
    /// off loopback also requires it as the REST API's bearer token.
    #[arg(long, global = true, value_name = "FILE", env = "CAUDAL_CLUSTER_SECRET_FILE")]
    secret_file: Option<PathBuf>,
    /// This process's TLS certificate (PEM, e.g. from `caudal certs`). With --tls-key and
    /// --tls-ca, every control and shuffle connection runs over mutual TLS: the job manager,
    /// every task manager (and through it every executor) need certificates of one CA.
    #[arg(long, global = true, value_name = "FILE", env = "CAUDAL_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, global = true, value_name = "FILE", env = "CAUDAL_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// The cluster's CA certificate (PEM): peers must show a certificate it signed.
    #[arg(long, global = true, value_name = "FILE", env = "CAUDAL_TLS_CA")]
    tls_ca: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Commands {
    /// Run the job manager: REST API and web UI, control port, checkpoint coordinator.
    Jobmanager {
        /// Address of the REST API and web UI (and of binary uploads).
        #[arg(long, default_value = "127.0.0.1:8081")]
        bind: SocketAddr,
        /// A host name the REST API and web UI answer to besides IP addresses and localhost
        /// (repeatable); requests naming any other host are refused (DNS rebinding).
        #[arg(long = "ui-allowed-host", value_name = "NAME")]
        ui_allowed_hosts: Vec<String>,
        /// Address of the control port task managers and executors connect to.
        #[arg(long, default_value = "127.0.0.1:6123")]
        rpc_bind: SocketAddr,
        /// Checkpoint storage of every job: a directory, file:///path or s3://bucket/prefix
        /// (shared storage when task managers run on several hosts).
        #[arg(long, default_value = "data/checkpoints")]
        checkpoint_dir: String,
        /// Job binaries and job records (a restarted job manager resumes the jobs recorded here).
        #[arg(long, default_value = "data/jobmanager")]
        data_dir: PathBuf,
        /// A task manager or executor silent this long is declared failed.
        #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(100..))]
        heartbeat_timeout_ms: u64,
        /// Listen on addresses other hosts reach (--bind, --rpc-bind off loopback) without a
        /// --secret-file: anyone who reaches the ports can run programs on every task
        /// manager. Only on a network nobody else is on.
        #[arg(long)]
        insecure_allow_remote: bool,
        /// Restarts allowed within --restart-window-secs; one more failure fails the job.
        #[arg(long, default_value_t = 10)]
        max_restarts: u32,
        /// The window of --max-restarts.
        #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
        restart_window_secs: u64,
        /// Wait before the first restart; doubles after each failure.
        #[arg(long, default_value_t = 500)]
        restart_backoff_ms: u64,
        /// The longest wait between restarts.
        #[arg(long, default_value_t = 30_000)]
        restart_backoff_max_ms: u64,
    },
    /// Run a task manager: offer slots to the job manager, run executors.
    Taskmanager {
        /// The job manager's HTTP URL.
        #[arg(long, default_value = "http://127.0.0.1:8081")]
        jobmanager: String,
        /// Slots offered (subtasks of one job's operators share a slot).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        slots: u32,
        /// Name, unique in the cluster (default: host-pid).
        #[arg(long)]
        name: Option<String>,
        /// Where fetched job binaries are cached.
        #[arg(long, default_value = "data/taskmanager")]
        data_dir: PathBuf,
        /// The job manager silent this long is lost (executors are killed, registration retried).
        #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(100..))]
        heartbeat_timeout_ms: u64,
    },
    /// Upload a job binary and run it on the cluster.
    Submit {
        /// The job binary (a program that builds a graph and calls env.execute).
        binary: PathBuf,
        /// Default parallelism of the job's operators.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        parallelism: Option<u32>,
        /// Start from `latest` (the job's latest completed checkpoint) or a checkpoint directory.
        #[arg(long)]
        restore: Option<String>,
        /// Wait until the job ends; exit 1 unless it FINISHED.
        #[arg(long)]
        wait: bool,
        /// The job manager's HTTP URL.
        #[arg(long, default_value = "http://127.0.0.1:8081")]
        jobmanager: String,
        /// Arguments of the job binary (after `--`).
        #[arg(last = true)]
        job_args: Vec<String>,
    },
    /// List the jobs with their status and failures.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// The job manager's HTTP URL.
        #[arg(long, default_value = "http://127.0.0.1:8081")]
        jobmanager: String,
    },
    /// Take a savepoint of a running job: a checkpoint now, copied to
    /// `<checkpoint-dir>/<job>/savepoints/<name>/` and kept until deleted; prints its restore
    /// path (`submit --restore savepoints/<name>`).
    Savepoint {
        /// The job's name.
        job: String,
        /// The savepoint's name (default: `sp-<ms since the epoch>`).
        #[arg(long)]
        name: Option<String>,
        /// Return once asked for, without waiting for it to be written.
        #[arg(long)]
        detach: bool,
        /// Give up waiting after this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
        /// The job manager's HTTP URL (or an embedded job's UI address).
        #[arg(long, default_value = "http://127.0.0.1:8081")]
        jobmanager: String,
    },
    /// Stop a job: take a final checkpoint, then end it (`submit --restore latest` resumes it).
    Stop {
        /// The job's name.
        job: String,
        /// Also copy the final checkpoint to the savepoint NAME (kept until deleted).
        #[arg(long, value_name = "NAME")]
        savepoint: Option<String>,
        /// Wait until it has stopped.
        #[arg(long)]
        wait: bool,
        /// The job manager's HTTP URL.
        #[arg(long, default_value = "http://127.0.0.1:8081")]
        jobmanager: String,
    },
    /// Cancel a job (no final checkpoint).
    Cancel {
        /// The job's name.
        job: String,
        /// The job manager's HTTP URL.
        #[arg(long, default_value = "http://127.0.0.1:8081")]
        jobmanager: String,
    },
    /// Make a CA and a certificate per process for the cluster's mutual TLS: DIR/ca.pem and
    /// DIR/NAME.pem + DIR/NAME.key for each --name (the CA's key is not kept).
    Certs {
        /// The directory to write (existing files are never overwritten).
        #[arg(long, default_value = "certs")]
        out: PathBuf,
        /// A process to make a certificate for (repeatable), e.g. jobmanager, tm-1.
        #[arg(long = "name", required = true)]
        names: Vec<String>,
        /// Another host name or IP address the certificates name besides localhost and
        /// 127.0.0.1 (repeatable; informational: the cluster checks the CA, not names).
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// Validity in days.
        #[arg(long, default_value_t = super::certs::DEFAULT_DAYS, value_parser = clap::value_parser!(u32).range(1..))]
        days: u32,
    },
    /// Any other command `X` runs the program `caudal-X` (next to `caudal`, or on PATH) with
    /// the remaining arguments, e.g. `caudal schema check NEW.avsc --subject S --registry URL`.
    #[command(external_subcommand)]
    External(Vec<String>),
}

/// Entry point of the `caudal` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let trust = cli.secret_file.as_deref().map(super::auth::ClusterSecret::from_file).transpose().and_then(
        |secret| {
            let tls = super::tls::ClusterTls::from_options(cli.tls_cert, cli.tls_key, cli.tls_ca)?;
            Ok(ClusterTrust { secret, tls })
        },
    );
    let trust = match trust {
        Ok(t) => t,
        Err(e) => {
            eprintln!("caudal: {e}");
            return ExitCode::from(2);
        }
    };
    match run(cli.command, trust) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("caudal: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Commands, trust: ClusterTrust) -> Result<ExitCode> {
    let client = |url: &str| JobManagerClient::new(url, &trust);
    match command {
        Commands::Jobmanager {
            bind,
            ui_allowed_hosts,
            rpc_bind,
            checkpoint_dir,
            data_dir,
            heartbeat_timeout_ms,
            insecure_allow_remote,
            max_restarts,
            restart_window_secs,
            restart_backoff_ms,
            restart_backoff_max_ms,
        } => {
            // The environment's settings that concern the job manager: the checkpoint
            // storage's S3 settings, and a crash or pause point of the coordinator (tests).
            let env = crate::JobConfig::default().with_env_overrides()?;
            crate::crash::install(&env);
            let jm = JobManager::start(JobManagerConfig {
                http_bind: bind,
                http_allowed_hosts: ui_allowed_hosts,
                rpc_bind,
                checkpoint_url: checkpoint_dir,
                checkpoint_s3: env.checkpoints.storage.s3,
                data_dir,
                heartbeat_timeout: Duration::from_millis(heartbeat_timeout_ms),
                allow_remote: insecure_allow_remote,
                trust: trust.clone(),
                restart: RestartStrategy {
                    initial_backoff: Duration::from_millis(restart_backoff_ms),
                    max_backoff: Duration::from_millis(restart_backoff_max_ms.max(restart_backoff_ms)),
                    max_restarts,
                    window: Duration::from_secs(restart_window_secs),
                },
            })?;
            tracing::info!(
                "caudal jobmanager: REST API and web UI at {}, control port {}",
                jm.http_url(),
                jm.rpc_addr()
            );
            jm.wait();
            Ok(ExitCode::SUCCESS)
        }
        Commands::Taskmanager { jobmanager, slots, name, data_dir, heartbeat_timeout_ms } => {
            let mut config = TaskManagerConfig {
                jobmanager,
                slots,
                data_dir,
                heartbeat_timeout: Duration::from_millis(heartbeat_timeout_ms),
                trust: trust.clone(),
                ..TaskManagerConfig::default()
            };
            if let Some(n) = name {
                config.name = n;
            }
            taskmanager::run(config)?;
            Ok(ExitCode::SUCCESS)
        }
        Commands::Submit { binary, parallelism, restore, wait, jobmanager, job_args } => {
            let client = client(&jobmanager)?;
            let sha = client.upload(&binary)?;
            let view =
                client.submit(&SubmitRequest { binary_sha256: sha, args: job_args, parallelism, restore })?;
            println!("submitted job `{}` ({} slots): {}", view.name, view.slots, view.detail);
            if !wait {
                return Ok(ExitCode::SUCCESS);
            }
            follow_until_ended(&client, &view.name)
        }
        Commands::List { json, jobmanager } => {
            let jobs = client(&jobmanager)?.jobs()?;
            if json {
                let text = serde_json::to_string_pretty(&jobs).map_err(|e| Error::Cluster(e.to_string()))?;
                println!("{text}");
            } else {
                print!("{}", table(&jobs));
            }
            Ok(ExitCode::SUCCESS)
        }
        Commands::Savepoint { job, name, detach, timeout_secs, jobmanager } => {
            let client = client(&jobmanager)?;
            let asked = client.trigger_savepoint(&job, name.as_deref())?;
            eprintln!("savepoint `{}` of job `{job}` requested", asked.name);
            if detach {
                return Ok(ExitCode::SUCCESS);
            }
            wait_for_savepoint(&client, &job, &asked.name, timeout_secs)
        }
        Commands::Stop { job, savepoint, wait, jobmanager } => {
            let client = client(&jobmanager)?;
            let view = client.stop(&job, savepoint.as_deref())?;
            println!("stopping job `{}` (was {:?})", view.name, view.status);
            if !wait {
                return Ok(ExitCode::SUCCESS);
            }
            wait_until_stopped(&client, &job)
        }
        Commands::Cancel { job, jobmanager } => {
            let view = client(&jobmanager)?.cancel(&job)?;
            println!("cancelling job `{}` (was {:?})", view.name, view.status);
            Ok(ExitCode::SUCCESS)
        }
        Commands::Certs { out, names, hosts, days } => {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let made = super::certs::generate_for_days(&out, &names, &hosts, days)?;
            println!("CA certificate: {}", out.join("ca.pem").display());
            for files in made {
                println!(
                    "  --tls-cert {} --tls-key {} --tls-ca {}",
                    files.cert.display(),
                    files.key.display(),
                    files.ca.display()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Commands::External(args) => run_plugin(&args),
    }
}

/// `caudal submit --wait`: prints each change of the job's status until it ends.
fn follow_until_ended(client: &JobManagerClient, name: &str) -> Result<ExitCode> {
    let mut last = String::new();
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let jobs = client.jobs()?;
        let Some(job) = jobs.into_iter().find(|j| j.name == name) else {
            return Err(Error::Cluster(format!("job `{name}` disappeared from the job manager")));
        };
        let line = format!("{:?}: {}", job.status, job.detail);
        if line != last {
            eprintln!("{}: {line}", job.name);
            last = line;
        }
        match job.status {
            JobStatus::Finished => return Ok(ExitCode::SUCCESS),
            JobStatus::Failed | JobStatus::Canceled => return Ok(ExitCode::FAILURE),
            _ => {}
        }
    }
}

/// `caudal savepoint` (without `--detach`): waits until the savepoint is written.
fn wait_for_savepoint(
    client: &JobManagerClient,
    job: &str,
    name: &str,
    timeout_secs: u64,
) -> Result<ExitCode> {
    let deadline = std::time::Instant::now() + Duration::from_secs(timeout_secs);
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let list = client.savepoints(job)?;
        let Some(sp) = list.into_iter().find(|s| s.name == name) else {
            return Err(Error::Cluster(format!("savepoint `{name}` disappeared")));
        };
        match sp.status.as_str() {
            "COMPLETED" => {
                println!("{}", sp.path.unwrap_or_default());
                return Ok(ExitCode::SUCCESS);
            }
            "FAILED" => {
                return Err(Error::Cluster(format!(
                    "savepoint `{}` failed: {}",
                    sp.name,
                    sp.failure.unwrap_or_default()
                )))
            }
            _ if std::time::Instant::now() > deadline => {
                return Err(Error::Cluster(format!(
                    "savepoint `{}` not written after {timeout_secs} s (status {})",
                    sp.name, sp.status
                )))
            }
            _ => {}
        }
    }
}

/// `caudal stop --wait`: waits until the job ended.
fn wait_until_stopped(client: &JobManagerClient, job: &str) -> Result<ExitCode> {
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let Some(j) = client.jobs()?.into_iter().find(|j| j.name == job) else { break };
        if matches!(j.status, JobStatus::Finished | JobStatus::Failed | JobStatus::Canceled) {
            println!("job `{}` {:?}: {}", j.name, j.status, j.detail);
            return Ok(if j.status == JobStatus::Finished { ExitCode::SUCCESS } else { ExitCode::FAILURE });
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `caudal X ARGS…` → `caudal-X ARGS…`, like git and cargo: tools outside the engine (the
/// schema check lives with the schemas) under one command.
fn run_plugin(args: &[String]) -> Result<ExitCode> {
    let Some((name, rest)) = args.split_first() else { return Ok(ExitCode::FAILURE) };
    let program = format!("caudal-{name}");
    let beside = std::env::current_exe().ok().and_then(|exe| exe.parent().map(|d| d.join(&program)));
    let path = beside.filter(|p| p.is_file()).unwrap_or_else(|| program.clone().into());
    match std::process::Command::new(&path).args(rest).status() {
        Ok(status) => {
            Ok(status.code().and_then(|c| u8::try_from(c).ok()).map_or(ExitCode::FAILURE, ExitCode::from))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::Config {
            setting: name.clone(),
            message: format!(
                "unknown command `{name}` (no program `{program}` next to caudal or on PATH); \
                 see `caudal --help`"
            ),
        }),
        Err(e) => Err(Error::io(format!("running {}", path.display()), e)),
    }
}

/// The jobs as a table, each followed by its failures.
fn table(jobs: &[ClusterJobView]) -> String {
    if jobs.is_empty() {
        return "no jobs\n".into();
    }
    let mut out = format!(
        "{:<20} {:<11} {:>7} {:>8} {:>10} {:<16} {}\n",
        "JOB", "STATUS", "ATTEMPT", "RESTARTS", "CHECKPOINT", "TASK MANAGERS", "DETAIL"
    );
    for j in jobs {
        let status = serde_json::to_value(j.status)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        out.push_str(&format!(
            "{:<20} {:<11} {:>7} {:>8} {:>10} {:<16} {}\n",
            j.name,
            status,
            j.attempt,
            j.restarts,
            j.last_checkpoint.map_or("-".into(), |c| c.to_string()),
            if j.task_managers.is_empty() { "-".into() } else { j.task_managers.join(",") },
            j.detail
        ));
        for f in &j.failures {
            out.push_str(&format!("    failure at {} ms: {}\n", f.at_ms, f.cause));
        }
    }
    out
}

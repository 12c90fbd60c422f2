//! The task manager (`caudal taskmanager`): registers its slots with the job manager,
//! heartbeats, and runs job binaries as child executor processes when told to.
//!
//! Binaries are fetched once from the job manager and cached by sha256 under
//! `<data-dir>/blobs/`. Each executor gets the job manager's control address and its id in
//! its environment (see `cluster::role`) and a pipe on stdin: when the task manager dies,
//! the pipe closes and the executor exits, so a killed task manager leaves no orphans.
//! When the job manager is lost, the task manager kills its executors and registers again
//! as soon as the job manager is back.
//!
//! ```no_run
//! use caudal::cluster::taskmanager::{run, TaskManagerConfig};
//! run(TaskManagerConfig { slots: 4, ..TaskManagerConfig::default() }).unwrap();
//! ```

use super::blob::BlobStore;
use super::client::JobManagerClient;
use super::protocol::{write_frame, FromTaskManager, Hello, Link, ToTaskManager, HEARTBEAT_INTERVAL};
use crate::{Error, Result};
use crossbeam_channel::{unbounded, RecvTimeoutError};
use std::collections::HashMap;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Settings of a task manager (flags of `caudal taskmanager`).
#[derive(Debug, Clone)]
pub struct TaskManagerConfig {
    /// The job manager's HTTP URL (`--jobmanager`, default `http://127.0.0.1:8081`).
    pub jobmanager: String,
    /// Slots offered (`--slots`).
    pub slots: u32,
    /// Name, unique in the cluster (`--name`, default `<host>-<pid>`).
    pub name: String,
    /// Cached binaries (`--data-dir`, default `data/taskmanager`).
    pub data_dir: PathBuf,
    /// The job manager silent this long is lost (`--heartbeat-timeout-ms`).
    pub heartbeat_timeout: Duration,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

impl Default for TaskManagerConfig {
    fn default() -> Self {
        TaskManagerConfig {
            jobmanager: "http://127.0.0.1:8081".into(),
            slots: 1,
            name: format!("{}-{}", hostname(), std::process::id()),
            data_dir: PathBuf::from("data/taskmanager"),
            heartbeat_timeout: Duration::from_secs(5),
        }
    }
}

/// Why a session with the job manager ended.
enum SessionEnd {
    /// Try again (the job manager is unreachable or was lost).
    Retry(String),
    /// Stop (the job manager refused this task manager).
    Fatal(String),
}

/// Runs the task manager until it is refused or the process ends.
pub fn run(config: TaskManagerConfig) -> Result<()> {
    if config.slots == 0 {
        return Err(Error::config("--slots", "must be at least 1"));
    }
    let client = JobManagerClient::new(&config.jobmanager)?;
    let blobs = BlobStore::open(&config.data_dir.join("blobs"))?;
    let mut announced = String::new();
    loop {
        match session(&config, &client, &blobs) {
            SessionEnd::Fatal(reason) => return Err(Error::Cluster(reason)),
            SessionEnd::Retry(reason) => {
                if reason != announced {
                    tracing::warn!("caudal taskmanager {}: {reason}; retrying every second", config.name);
                    announced = reason;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// Executors and their state.
#[derive(Default)]
struct Executors {
    running: HashMap<String, (Child, std::process::ChildStdin)>,
    /// Stop requests for executors still being started.
    stop_requested: Vec<String>,
}

impl Executors {
    fn kill_all(&mut self) {
        for (id, (mut child, _stdin)) in self.running.drain() {
            let _ = child.kill();
            let _ = child.wait();
            tracing::info!("caudal taskmanager: killed executor {id}");
        }
    }
}

impl Drop for Executors {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// How [`describe`] reports an exit with code 0.
pub(crate) const CLEAN_EXIT: &str = "exit code 0";

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => status.to_string(),
    }
}

fn session(config: &TaskManagerConfig, client: &JobManagerClient, blobs: &BlobStore) -> SessionEnd {
    let info = match client.info() {
        Ok(i) => i,
        Err(e) => return SessionEnd::Retry(e.to_string()),
    };
    let rpc = format!("{}:{}", client.host(), info.rpc_port);
    let mut stream = match TcpStream::connect(&rpc) {
        Ok(s) => s,
        Err(e) => {
            return SessionEnd::Retry(format!("cannot reach the job manager's control port {rpc}: {e}"))
        }
    };
    let hello = Hello::TaskManager {
        name: config.name.clone(),
        slots: config.slots,
        location: format!("{} pid {}", hostname(), std::process::id()),
    };
    if let Err(e) = write_frame(&mut stream, &hello) {
        return SessionEnd::Retry(format!("registering at {rpc}: {e}"));
    }
    let link: Link<ToTaskManager> = match Link::start(stream, "jobmanager") {
        Ok(l) => l,
        Err(e) => return SessionEnd::Retry(format!("registering at {rpc}: {e}")),
    };
    match link.incoming.recv_timeout(Duration::from_secs(10)) {
        Ok(Ok(ToTaskManager::Welcome)) => {}
        Ok(Ok(ToTaskManager::Refused { reason })) => return SessionEnd::Fatal(format!("refused: {reason}")),
        Ok(Ok(other)) => return SessionEnd::Retry(format!("unexpected first answer {other:?}")),
        Ok(Err(reason)) => return SessionEnd::Retry(format!("registering at {rpc}: {reason}")),
        Err(_) => return SessionEnd::Retry(format!("no answer to the registration at {rpc}")),
    }
    tracing::info!(
        "caudal taskmanager {}: registered at {} ({rpc}) with {} slots",
        config.name,
        config.jobmanager,
        config.slots
    );
    let mut executors = Executors::default();
    let (started_tx, started_rx) =
        unbounded::<(String, std::result::Result<(Child, std::process::ChildStdin), String>)>();
    let (mut last_heard, mut last_sent) = (Instant::now(), Instant::now());
    let send = |m: &FromTaskManager| link.sender.send(m);
    let end = loop {
        match link.incoming.recv_timeout(Duration::from_millis(20)) {
            Ok(Ok(msg)) => {
                last_heard = Instant::now();
                match msg {
                    ToTaskManager::StartExecutor { executor_id, binary_sha256, args, env } => {
                        let (client, blobs, tx) = (client.clone(), blobs.clone(), started_tx.clone());
                        let exec_env = vec![
                            ("CAUDAL__EXECUTOR".to_string(), rpc.clone()),
                            ("CAUDAL__EXECUTOR_ID".to_string(), executor_id.clone()),
                            ("CAUDAL__EXECUTOR_WATCH_STDIN".to_string(), "1".to_string()),
                        ];
                        // Downloading may take a while: never stall the heartbeats.
                        let _ = std::thread::Builder::new().name("caudal-start-executor".into()).spawn(
                            move || {
                                let r = start_executor(
                                    &client,
                                    &blobs,
                                    &binary_sha256,
                                    &args,
                                    env.into_iter().chain(exec_env),
                                );
                                let _ = tx.send((executor_id, r));
                            },
                        );
                    }
                    ToTaskManager::StopExecutor { executor_id } => {
                        match executors.running.get_mut(&executor_id) {
                            Some((child, _)) => {
                                let _ = child.kill();
                            }
                            None => executors.stop_requested.push(executor_id),
                        }
                    }
                    ToTaskManager::Heartbeat | ToTaskManager::Welcome | ToTaskManager::Refused { .. } => {}
                }
            }
            Ok(Err(reason)) => break format!("lost the job manager ({reason})"),
            Err(RecvTimeoutError::Disconnected) => break "lost the job manager".to_string(),
            Err(RecvTimeoutError::Timeout) => {}
        }
        while let Ok((id, result)) = started_rx.try_recv() {
            match result {
                Ok((mut child, stdin)) => {
                    tracing::info!(
                        "caudal taskmanager {}: started executor {id} (pid {})",
                        config.name,
                        child.id()
                    );
                    if let Some(i) = executors.stop_requested.iter().position(|s| *s == id) {
                        executors.stop_requested.remove(i);
                        let _ = child.kill();
                    }
                    executors.running.insert(id, (child, stdin));
                }
                Err(error) => {
                    tracing::warn!("caudal taskmanager {}: cannot start executor {id}: {error}", config.name);
                    if send(&FromTaskManager::ExecutorFailedToStart { executor_id: id, error }).is_err() {
                        break;
                    }
                }
            }
        }
        let mut exited = Vec::new();
        for (id, (child, _)) in executors.running.iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                exited.push((id.clone(), describe(status)));
            }
        }
        let mut lost = None;
        for (id, status) in exited {
            executors.running.remove(&id);
            tracing::info!("caudal taskmanager {}: executor {id} ended ({status})", config.name);
            if let Err(e) = send(&FromTaskManager::ExecutorExited { executor_id: id, status }) {
                lost = Some(format!("lost the job manager ({e})"));
            }
        }
        if let Some(l) = lost {
            break l;
        }
        if last_sent.elapsed() >= HEARTBEAT_INTERVAL {
            last_sent = Instant::now();
            if let Err(e) = send(&FromTaskManager::Heartbeat) {
                break format!("lost the job manager ({e})");
            }
        }
        if last_heard.elapsed() > config.heartbeat_timeout {
            break format!("the job manager was silent for {:?}", config.heartbeat_timeout);
        }
    };
    link.sender.close();
    tracing::info!(
        "caudal taskmanager {}: {end}: killing {} executors",
        config.name,
        executors.running.len()
    );
    executors.kill_all();
    SessionEnd::Retry(end)
}

fn start_executor(
    client: &JobManagerClient,
    blobs: &BlobStore,
    sha: &str,
    args: &[String],
    env: impl Iterator<Item = (String, String)>,
) -> std::result::Result<(Child, std::process::ChildStdin), String> {
    if !blobs.contains(sha) {
        client.download(sha, blobs).map_err(|e| e.to_string())?;
    }
    let mut child = Command::new(blobs.path(sha))
        .args(args)
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("running {}: {e}", blobs.path(sha).display()))?;
    let stdin = child.stdin.take().ok_or_else(|| "no stdin pipe to the executor".to_string())?;
    Ok((child, stdin))
}

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
use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};
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
    /// The cluster secret (`--secret-file`) and TLS identity (`--tls-*`), proven to the job
    /// manager and handed to the executors ([`crate::cluster::transport`]).
    pub trust: crate::cluster::transport::ClusterTrust,
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
            trust: Default::default(),
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
    let client = JobManagerClient::new(&config.jobmanager, &config.trust)?;
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

/// A registered task manager's link to the job manager and the executors it runs.
struct Session<'a> {
    config: &'a TaskManagerConfig,
    client: &'a JobManagerClient,
    blobs: &'a BlobStore,
    /// The job manager's control address, given to executors.
    rpc: String,
    link: Link<ToTaskManager>,
    executors: Executors,
    started_tx: Sender<StartedExecutor>,
    started_rx: Receiver<StartedExecutor>,
}

/// An executor's id and its process, or why it could not be started.
type StartedExecutor = (String, std::result::Result<(Child, std::process::ChildStdin), String>);

fn session(config: &TaskManagerConfig, client: &JobManagerClient, blobs: &BlobStore) -> SessionEnd {
    let mut session = match Session::register(config, client, blobs) {
        Ok(s) => s,
        Err(end) => return end,
    };
    let end = session.serve();
    session.link.sender.close();
    tracing::info!(
        "caudal taskmanager {}: {end}: killing {} executors",
        config.name,
        session.executors.running.len()
    );
    session.executors.kill_all();
    SessionEnd::Retry(end)
}

impl<'a> Session<'a> {
    /// Connects to the job manager's control port and registers this task manager's slots.
    fn register(
        config: &'a TaskManagerConfig,
        client: &'a JobManagerClient,
        blobs: &'a BlobStore,
    ) -> std::result::Result<Self, SessionEnd> {
        let info = client.info().map_err(|e| SessionEnd::Retry(e.to_string()))?;
        let rpc = format!("{}:{}", client.host(), info.rpc_port);
        let stream = TcpStream::connect(&rpc).map_err(|e| {
            SessionEnd::Retry(format!("cannot reach the job manager's control port {rpc}: {e}"))
        })?;
        let mut conn = config
            .trust
            .connect(stream)
            .map_err(|e| SessionEnd::Retry(format!("authenticating at {rpc}: {e}")))?;
        let hello = Hello::TaskManager {
            name: config.name.clone(),
            slots: config.slots,
            location: format!("{} pid {}", hostname(), std::process::id()),
        };
        let registering = |e: &dyn std::fmt::Display| SessionEnd::Retry(format!("registering at {rpc}: {e}"));
        write_frame(&mut conn.writer, &hello).map_err(|e| registering(&e))?;
        let link: Link<ToTaskManager> = Link::start(conn, "jobmanager").map_err(|e| registering(&e))?;
        match link.incoming.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(ToTaskManager::Welcome)) => {}
            Ok(Ok(ToTaskManager::Refused { reason })) => {
                return Err(SessionEnd::Fatal(format!("refused: {reason}")))
            }
            Ok(Ok(other)) => return Err(SessionEnd::Retry(format!("unexpected first answer {other:?}"))),
            Ok(Err(reason)) => return Err(registering(&reason)),
            Err(_) => return Err(SessionEnd::Retry(format!("no answer to the registration at {rpc}"))),
        }
        tracing::info!(
            "caudal taskmanager {}: registered at {} ({rpc}) with {} slots",
            config.name,
            config.jobmanager,
            config.slots
        );
        let (started_tx, started_rx) = unbounded();
        Ok(Session {
            config,
            client,
            blobs,
            rpc,
            link,
            executors: Executors::default(),
            started_tx,
            started_rx,
        })
    }

    /// Serves the job manager until it is lost; returns why the session ended.
    fn serve(&mut self) -> String {
        let (mut last_heard, mut last_sent) = (Instant::now(), Instant::now());
        loop {
            match self.link.incoming.recv_timeout(Duration::from_millis(20)) {
                Ok(Ok(msg)) => {
                    last_heard = Instant::now();
                    self.on_message(msg);
                }
                Ok(Err(reason)) => return format!("lost the job manager ({reason})"),
                Err(RecvTimeoutError::Disconnected) => return "lost the job manager".to_string(),
                Err(RecvTimeoutError::Timeout) => {}
            }
            if let Err(lost) = self.take_started().and_then(|()| self.reap_exited()) {
                return lost;
            }
            if last_sent.elapsed() >= HEARTBEAT_INTERVAL {
                last_sent = Instant::now();
                if let Err(e) = self.link.sender.send(&FromTaskManager::Heartbeat) {
                    return format!("lost the job manager ({e})");
                }
            }
            if last_heard.elapsed() > self.config.heartbeat_timeout {
                return format!("the job manager was silent for {:?}", self.config.heartbeat_timeout);
            }
        }
    }

    fn on_message(&mut self, msg: ToTaskManager) {
        match msg {
            ToTaskManager::StartExecutor { executor_id, binary_sha256, args, env } => {
                let (client, blobs, tx) = (self.client.clone(), self.blobs.clone(), self.started_tx.clone());
                let mut exec_env = vec![
                    ("CAUDAL__EXECUTOR".to_string(), self.rpc.clone()),
                    ("CAUDAL__EXECUTOR_ID".to_string(), executor_id.clone()),
                    ("CAUDAL__EXECUTOR_WATCH_STDIN".to_string(), "1".to_string()),
                ];
                exec_env.extend(self.config.trust.executor_env());
                // Downloading may take a while: never stall the heartbeats.
                let _ = std::thread::Builder::new().name("caudal-start-executor".into()).spawn(move || {
                    let r = start_executor(
                        &client,
                        &blobs,
                        &binary_sha256,
                        &args,
                        env.into_iter().chain(exec_env),
                    );
                    let _ = tx.send((executor_id, r));
                });
            }
            ToTaskManager::StopExecutor { executor_id } => match self.executors.running.get_mut(&executor_id)
            {
                Some((child, _)) => {
                    let _ = child.kill();
                }
                None => self.executors.stop_requested.push(executor_id),
            },
            ToTaskManager::Heartbeat | ToTaskManager::Welcome | ToTaskManager::Refused { .. } => {}
        }
    }

    /// Takes in the executors started since the last call (killing those already told to
    /// stop) and reports those that could not start.
    fn take_started(&mut self) -> std::result::Result<(), String> {
        while let Ok((id, result)) = self.started_rx.try_recv() {
            match result {
                Ok((mut child, stdin)) => {
                    tracing::info!(
                        "caudal taskmanager {}: started executor {id} (pid {})",
                        self.config.name,
                        child.id()
                    );
                    if let Some(i) = self.executors.stop_requested.iter().position(|s| *s == id) {
                        self.executors.stop_requested.remove(i);
                        let _ = child.kill();
                    }
                    self.executors.running.insert(id, (child, stdin));
                }
                Err(error) => {
                    tracing::warn!(
                        "caudal taskmanager {}: cannot start executor {id}: {error}",
                        self.config.name
                    );
                    let failed = FromTaskManager::ExecutorFailedToStart { executor_id: id, error };
                    self.link.sender.send(&failed).map_err(|e| format!("lost the job manager ({e})"))?;
                }
            }
        }
        Ok(())
    }

    /// Reports the executors that ended since the last call.
    fn reap_exited(&mut self) -> std::result::Result<(), String> {
        let mut exited = Vec::new();
        for (id, (child, _)) in self.executors.running.iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                exited.push((id.clone(), describe(status)));
            }
        }
        let mut lost = Ok(());
        for (id, status) in exited {
            self.executors.running.remove(&id);
            tracing::info!("caudal taskmanager {}: executor {id} ended ({status})", self.config.name);
            if let Err(e) =
                self.link.sender.send(&FromTaskManager::ExecutorExited { executor_id: id, status })
            {
                lost = Err(format!("lost the job manager ({e})"));
            }
        }
        lost
    }
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

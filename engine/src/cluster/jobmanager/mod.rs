//! The job manager (`caudal jobmanager`): accepts job binaries, schedules them onto task
//! manager slots, coordinates their checkpoints and restarts them after failures.
//!
//! Two ports: HTTP ([`JobManagerConfig::http_bind`], REST API + web UI, binary upload) and
//! the control port ([`JobManagerConfig::rpc_bind`], framed TCP for task managers and
//! executors, see `cluster::protocol`). Job binaries are kept content-addressed under
//! `<data-dir>/blobs/`, submitted jobs under `<data-dir>/jobs/`: a restarted job manager
//! resumes every job that had not ended, from its latest completed checkpoint.
//!
//! ```no_run
//! use caudal::cluster::jobmanager::{JobManager, JobManagerConfig};
//! let jm = JobManager::start(JobManagerConfig::default()).unwrap();
//! println!("REST API and UI at {}", jm.http_url());
//! jm.wait(); // serves until the process ends
//! ```

mod attempt;
mod driver;
pub(crate) mod http;
pub(crate) mod job;
pub mod restart;
pub(crate) mod submit;
pub(crate) mod taskmanagers;

pub use job::ClusterJobView;
pub use restart::RestartStrategy;
pub use taskmanagers::TaskManagerView;

use self::job::{ClusterJob, JobRecords};
use self::taskmanagers::{ExecutorEvent, TaskManagers};
use super::blob::BlobStore;
use super::protocol::{read_frame, FromTaskManager, Hello, Link, ToTaskManager, HEARTBEAT_INTERVAL};
use crate::web::{Access, JobRegistry, WebAccess, WebServer};
use crate::{Error, Result};
use crossbeam_channel::RecvTimeoutError;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Settings of a job manager (flags of `caudal jobmanager`).
#[derive(Debug, Clone)]
pub struct JobManagerConfig {
    /// REST API, web UI and binary upload (`--bind`, default 127.0.0.1:8081).
    pub http_bind: SocketAddr,
    /// Host names the REST API and web UI answer to besides IP addresses and localhost
    /// (`--ui-allowed-host`).
    pub http_allowed_hosts: Vec<String>,
    /// Control port for task managers and executors (`--rpc-bind`, default 127.0.0.1:6123).
    pub rpc_bind: SocketAddr,
    /// Checkpoint storage of every job: a directory, `file:///path` or `s3://bucket/prefix`
    /// (`--checkpoint-dir`). Task managers on other hosts need shared storage.
    pub checkpoint_url: String,
    /// The S3 settings of `checkpoint_url` (`CAUDAL__S3__*`, as the executors read them).
    pub checkpoint_s3: caudal_checkpoints::S3Config,
    /// Binaries and job records (`--data-dir`, default `data/jobmanager`).
    pub data_dir: PathBuf,
    /// A task manager or executor silent this long is declared failed (`--heartbeat-timeout-ms`).
    pub heartbeat_timeout: Duration,
    /// Listen off loopback without a cluster secret (`--insecure-allow-remote`); refused
    /// otherwise.
    pub allow_remote: bool,
    /// What every control and shuffle connection proves: the cluster secret (`--secret-file`,
    /// off loopback also the REST API's bearer token) and mutual TLS (`--tls-*`), each when set
    /// ([`crate::cluster::transport`]).
    pub trust: crate::cluster::transport::ClusterTrust,
    /// Restarts after failures.
    pub restart: RestartStrategy,
}

impl Default for JobManagerConfig {
    fn default() -> Self {
        JobManagerConfig {
            http_bind: SocketAddr::from(([127, 0, 0, 1], 8081)),
            http_allowed_hosts: Vec::new(),
            rpc_bind: SocketAddr::from(([127, 0, 0, 1], 6123)),
            checkpoint_url: "data/checkpoints".into(),
            checkpoint_s3: caudal_checkpoints::S3Config::default(),
            data_dir: PathBuf::from("data/jobmanager"),
            heartbeat_timeout: Duration::from_secs(5),
            allow_remote: false,
            trust: Default::default(),
            restart: RestartStrategy::default(),
        }
    }
}

/// A relative checkpoint directory made absolute: executors run in other directories.
fn absolute_storage_url(url: &str) -> Result<String> {
    if url.contains("://") || url.starts_with('/') {
        return Ok(url.to_string());
    }
    let cwd = std::env::current_dir().map_err(|e| Error::io("reading the current directory", e))?;
    Ok(cwd.join(url).display().to_string())
}

/// The job manager's shared state.
#[derive(Debug)]
pub(crate) struct Cluster {
    pub(crate) config: JobManagerConfig,
    /// This job manager's start time: part of executor ids, so ids never repeat.
    pub(crate) epoch: i64,
    pub(crate) rpc_addr: SocketAddr,
    pub(crate) tms: TaskManagers,
    pub(crate) jobs: Mutex<BTreeMap<String, Arc<ClusterJob>>>,
    /// Jobs that had ended before this job manager started (from their records), as they
    /// ended: listed, never run again.
    pub(crate) ended: Mutex<BTreeMap<String, ClusterJobView>>,
    pub(crate) blobs: BlobStore,
    pub(crate) records: JobRecords,
    pub(crate) registry: Arc<JobRegistry>,
}

impl Cluster {
    /// Starts the driver thread of `job`.
    pub(crate) fn launch(self: &Arc<Self>, job: Arc<ClusterJob>) -> Result<()> {
        self.registry.register(job.view.clone());
        self.jobs.lock().insert(job.name(), job.clone());
        let cluster = self.clone();
        std::thread::Builder::new()
            .name(format!("caudal-job-{}", job.name()))
            .spawn(move || driver::drive(cluster, job))
            .map_err(|e| Error::io("spawning a job driver", e))?;
        Ok(())
    }
}

/// A running job manager.
#[derive(Debug)]
pub struct JobManager {
    cluster: Arc<Cluster>,
    web: WebServer,
}

impl JobManager {
    /// Binds both ports, resumes the jobs a previous run left unfinished, and serves.
    pub fn start(config: JobManagerConfig) -> Result<JobManager> {
        let mut config = config;
        for (flag, addr) in [("--bind", config.http_bind), ("--rpc-bind", config.rpc_bind)] {
            let trusted = config.trust.secret.is_some() || config.trust.tls.is_some();
            if !addr.ip().is_loopback() && !config.allow_remote && !trusted {
                return Err(Error::config(
                    flag,
                    format!(
                        "refusing to listen on {addr} without a cluster secret or TLS: anyone who reaches this \
                         port could upload a program and run it on every task manager. Give every process of \
                         the cluster --secret-file FILE (e.g. `openssl rand -hex 32 > FILE`) or certificates \
                         (--tls-cert/--tls-key/--tls-ca, see `caudal certs`), bind to 127.0.0.1 (the default), \
                         or pass --insecure-allow-remote on a network only you control"
                    ),
                ));
            }
        }
        config.checkpoint_url = absolute_storage_url(&config.checkpoint_url)?;
        // Fail now, naming the setting, rather than at the first checkpoint.
        caudal_checkpoints::CheckpointStorageConfig {
            url: config.checkpoint_url.clone(),
            s3: config.checkpoint_s3.clone(),
        }
        .build()
        .map_err(|e| Error::config("--checkpoint-dir", format!("{}: {e}", config.checkpoint_url)))?;
        let listener = TcpListener::bind(config.rpc_bind)
            .map_err(|e| Error::config("--rpc-bind", format!("cannot listen on {}: {e}", config.rpc_bind)))?;
        let rpc_addr = listener.local_addr().map_err(|e| Error::io("reading the control address", e))?;
        let registry = Arc::new(JobRegistry::new());
        let cluster = Arc::new(Cluster {
            epoch: crate::job::now_ms(),
            rpc_addr,
            tms: TaskManagers::default(),
            jobs: Mutex::new(BTreeMap::new()),
            ended: Mutex::new(BTreeMap::new()),
            blobs: BlobStore::open(&config.data_dir.join("blobs"))?,
            records: JobRecords::open(&config.data_dir)?,
            registry: registry.clone(),
            config,
        });
        let trust = &cluster.config.trust;
        let access = WebAccess {
            allowed_hosts: cluster.config.http_allowed_hosts.clone(),
            // Off loopback the REST API takes the cluster secret as its bearer token, or a
            // client certificate of the cluster's CA over HTTPS.
            sign_in: (!cluster.config.http_bind.ip().is_loopback())
                .then(|| Access { secret: trust.secret.clone(), client_certificate: trust.tls.is_some() }),
            // With the cluster's TLS identity, the REST API and UI are HTTPS too.
            tls: trust.tls.as_ref().map(|t| t.https_server()),
        };
        let web =
            WebServer::start_with(cluster.config.http_bind, registry, http::routes(cluster.clone()), access)?;
        let accepting = cluster.clone();
        std::thread::Builder::new()
            .name("caudal-accept".into())
            .spawn(move || accept_loop(accepting, listener))
            .map_err(|e| Error::io("spawning the control port's acceptor", e))?;
        submit::resume_jobs(&cluster);
        Ok(JobManager { cluster, web })
    }

    /// `http://<address>` of the REST API and UI (`https://` with TLS).
    pub fn http_url(&self) -> String {
        self.web.url()
    }

    /// The control port's address.
    pub fn rpc_addr(&self) -> SocketAddr {
        self.cluster.rpc_addr
    }

    /// Serve until the process ends.
    pub fn wait(self) {
        loop {
            std::thread::park();
        }
    }
}

fn accept_loop(cluster: Arc<Cluster>, listener: TcpListener) {
    for stream in listener.incoming() {
        match stream {
            Ok(s) => {
                let cluster = cluster.clone();
                let _ = std::thread::Builder::new().name("caudal-hello".into()).spawn(move || {
                    if let Err(e) = on_connection(&cluster, s) {
                        tracing::warn!("caudal jobmanager: control connection refused: {e}");
                    }
                });
            }
            Err(e) => {
                tracing::warn!("caudal jobmanager: accepting a control connection: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn on_connection(cluster: &Arc<Cluster>, stream: TcpStream) -> std::io::Result<()> {
    let mut conn = cluster.config.trust.accept(stream)?;
    conn.socket().set_read_timeout(Some(Duration::from_secs(10)))?;
    let hello: Hello = read_frame(&mut conn.reader)?;
    conn.socket().set_read_timeout(None)?;
    match hello {
        Hello::Executor { executor_id } => {
            let link = Link::start(conn, &executor_id)?;
            let sender = link.sender.clone();
            if !cluster.tms.route(&executor_id, ExecutorEvent::Connected(link)) {
                tracing::warn!(
                    "caudal jobmanager: executor {executor_id} belongs to no current attempt: closing it"
                );
                sender.close();
            }
            Ok(())
        }
        Hello::TaskManager { name, slots, location } => {
            let link: Link<FromTaskManager> = Link::start(conn, &name)?;
            serve_task_manager(cluster, link, &name, slots, &location);
            Ok(())
        }
    }
}

/// Registers a task manager and follows it until it is lost.
fn serve_task_manager(
    cluster: &Cluster,
    link: Link<FromTaskManager>,
    name: &str,
    slots: u32,
    location: &str,
) {
    if let Err(reason) = cluster.tms.register(name, slots, location, link.sender.clone()) {
        let _ = link.sender.send(&ToTaskManager::Refused { reason });
        link.sender.close();
        return;
    }
    if link.sender.send(&ToTaskManager::Welcome).is_err() {
        cluster.tms.remove(name, &format!("task manager {name} ({location}) lost during registration"));
        return;
    }
    tracing::info!(
        "caudal jobmanager: task manager {name} registered from {location} ({}) with {slots} slots",
        link.peer
    );
    let timeout = cluster.config.heartbeat_timeout;
    let (mut last_heard, mut last_sent) = (Instant::now(), Instant::now());
    let reason = loop {
        match link.incoming.recv_timeout(Duration::from_millis(50)) {
            Ok(Ok(msg)) => {
                last_heard = Instant::now();
                cluster.tms.touch(name);
                match msg {
                    FromTaskManager::Heartbeat => {}
                    FromTaskManager::ExecutorExited { executor_id, status } => {
                        cluster.tms.release(&executor_id);
                        cluster.tms.route(&executor_id, ExecutorEvent::Exited(status));
                    }
                    FromTaskManager::ExecutorFailedToStart { executor_id, error } => {
                        cluster.tms.release(&executor_id);
                        cluster.tms.route(&executor_id, ExecutorEvent::StartFailed(error));
                    }
                }
            }
            Ok(Err(reason)) => break reason,
            Err(RecvTimeoutError::Disconnected) => break "connection closed".to_string(),
            Err(RecvTimeoutError::Timeout) => {}
        }
        if last_heard.elapsed() > timeout {
            break format!("no heartbeat for {timeout:?}");
        }
        if last_sent.elapsed() >= HEARTBEAT_INTERVAL {
            last_sent = Instant::now();
            if let Err(e) = link.sender.send(&ToTaskManager::Heartbeat) {
                break format!("cannot send to it: {e}");
            }
        }
    };
    link.sender.close();
    let cause = format!("task manager {name} ({location}) lost: {reason}");
    tracing::warn!("caudal jobmanager: {cause}");
    cluster.tms.remove(name, &cause);
}

//! The executor: a job binary started by a task manager (`CAUDAL__EXECUTOR` set). It
//! connects to the job manager, receives its [`Deployment`], builds and runs the subtasks,
//! and relays between them and the job manager: checkpoint triggers and completions in,
//! acks, progress and the final outcome out.
//!
//! An executor never outlives its job manager's interest in it: it exits at once when the
//! control connection closes, when the job manager is silent for the heartbeat timeout,
//! when it is cancelled, or (with `CAUDAL__EXECUTOR_WATCH_STDIN`) when its task manager
//! dies. So a new attempt of the job never runs next to a zombie of the old one.

use super::protocol::{
    Deployment, FromExecutor, Hello, Link, SubtaskReport, ToExecutor, WireAckStats, HEARTBEAT_INTERVAL,
};
use super::role::ExecutorSettings;
use super::shuffle::{self, RemoteChannels};
use super::state_forward::ExecutorStateServer;
use crate::config::{JobConfig, RestoreFrom};
use crate::coordinator::Participants;
use crate::run::{JobParts, JobResult, ProgressTicker, Run};
use crate::runtime::task::CheckpointAck;
use crate::{Error, Result};
use crossbeam_channel::TryRecvError;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Exit code of an executor that lost its job manager or task manager.
pub(crate) const EXIT_LOST: i32 = 3;
/// Exit code of an executor the job manager cancelled.
pub(crate) const EXIT_CANCELLED: i32 = 4;

fn lost(what: &str) -> ! {
    tracing::warn!("caudal executor {}: {what}: exiting", std::process::id());
    std::process::exit(EXIT_LOST)
}

/// Exit when stdin ends: the task manager that started us holds its write end.
fn watch_stdin() {
    let spawned = std::thread::Builder::new().name("caudal-parent-watch".into()).spawn(|| {
        let mut buf = [0u8; 64];
        loop {
            match std::io::Read::read(&mut std::io::stdin(), &mut buf) {
                Ok(0) | Err(_) => lost("the task manager is gone (stdin closed)"),
                Ok(_) => {}
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("caudal executor: cannot watch the task manager: {e}");
    }
}

fn connect(addr: &str) -> Result<TcpStream> {
    let started = Instant::now();
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => return Ok(s),
            Err(e) if started.elapsed() > Duration::from_secs(10) => {
                return Err(Error::Cluster(format!(
                    "cannot reach the job manager's control port {addr}: {e}"
                )))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Runs the executor role of the job to the end.
pub(crate) fn run(env: JobParts, job_name: &str, settings: ExecutorSettings) -> Result<JobResult> {
    if settings.watch_stdin {
        watch_stdin();
    }
    let stream = connect(&settings.jobmanager)?;
    // Peers reach this executor's data port on the interface the job manager is reached from.
    let local_ip =
        stream.local_addr().map_err(|e| Error::io("reading the control socket's address", e))?.ip();
    let conn = settings.trust.connect(stream).map_err(|e| {
        Error::Cluster(format!("authenticating at the job manager {}: {e}", settings.jobmanager))
    })?;
    let link: Link<ToExecutor> =
        Link::start(conn, "jobmanager").map_err(|e| Error::io("connecting to the job manager", e))?;
    link.sender
        .send(&Hello::Executor { executor_id: settings.executor_id.clone() })
        .map_err(|e| Error::io("greeting the job manager", e))?;
    let data = TcpListener::bind((local_ip, 0)).map_err(|e| Error::io("binding the data port", e))?;
    let data_addr = data.local_addr().map_err(|e| Error::io("reading the data port", e))?;
    link.sender
        .send(&FromExecutor::DataPort { addr: data_addr.to_string() })
        .map_err(|e| Error::io("greeting the job manager", e))?;
    let deployment = match link.incoming.recv_timeout(Duration::from_secs(30)) {
        Ok(Ok(ToExecutor::Deploy(d))) => d,
        Ok(Ok(other)) => return Err(Error::Cluster(format!("expected a deployment, got {other:?}"))),
        Ok(Err(reason)) => {
            lost(&format!("the job manager closed the connection before deploying ({reason})"))
        }
        Err(_) => lost("no deployment from the job manager within 30 s"),
    };
    let config = deployed_config(&env.config, &deployment);
    let outcome = run_deployed(&env, &config, job_name, &link, &deployment, data, settings.trust.clone());
    let (error, retryable) = match &outcome {
        Ok(_) | Err(Error::Cancelled) => (None, false),
        Err(e) => (Some(e.to_string()), e.is_retryable()),
    };
    if !matches!(outcome, Err(Error::Cancelled)) {
        let _ = link.sender.send(&FromExecutor::Metrics { subtasks: local_counters(&env, &deployment) });
        let _ = link.sender.send(&FromExecutor::Finished { error, retryable });
    }
    outcome
}

/// The job's own config with the job manager's decisions applied.
fn deployed_config(own: &JobConfig, d: &Deployment) -> JobConfig {
    let mut config = own.clone();
    config.web_bind = None;
    if let Some(p) = d.parallelism {
        config.parallelism = p;
    }
    config.checkpoints.storage.url = d.checkpoint_url.clone();
    config.checkpoints.restore = d.restore.clone().map(RestoreFrom::Path);
    config.checkpoints.fallback = false;
    config
}

fn run_deployed(
    env: &JobParts,
    config: &JobConfig,
    job_name: &str,
    link: &Link<ToExecutor>,
    deployment: &Deployment,
    data: TcpListener,
    trust: super::transport::ClusterTrust,
) -> Result<JobResult> {
    // The job manager's state browser reaches these through `state_forward`.
    let queries = Arc::new(crate::state_query::StateQueries::new());
    let mut state_server = ExecutorStateServer::new(queries.clone());
    // Subtasks of other executors' slots are built there; channels to them cross the network.
    let me = deployment.executor_index;
    let mut remote = match deployment.peers.get(me as usize) {
        Some(p) if deployment.peers.len() > 1 => Some(RemoteChannels::new(p.slots.iter().copied())),
        _ => None,
    };
    // The job manager's attempt: the same in every executor of it, new in the next one.
    let attempt = Some(deployment.attempt.clone());
    let mut run = Run::prepare(env, config, job_name, attempt, queries, remote.as_mut())?;
    let (ack_tx, ack_rx) = crossbeam_channel::unbounded();
    let control = env.control.clone();
    let mut senders = Vec::new();
    if let Some(remote) = remote {
        let capacity = (config.channel_capacity / config.batch_size).max(1);
        senders = shuffle::start(data, remote, me, &deployment.peers, capacity, &control, trust)?;
    }
    let handles = run.spawn(&control, Some(ack_tx))?;
    let sources = handles.iter().filter(|h| h.is_source).count();
    let send = |m: &FromExecutor| {
        if let Err(e) = link.sender.send(m) {
            lost(&format!("cannot reach the job manager ({e})"));
        }
    };
    send(&FromExecutor::Running { tasks: handles.len(), sources, keyed: state_server.keyed() });
    let timeout = Duration::from_millis(deployment_timeout_ms(deployment));
    let (mut last_sent, mut last_heard, mut progress) =
        (Instant::now(), Instant::now(), ProgressTicker::new());
    let mut reported = (0, 0);
    loop {
        loop {
            match link.incoming.try_recv() {
                Ok(Ok(msg)) => {
                    last_heard = Instant::now();
                    match msg {
                        ToExecutor::FinalCheckpoint(id) => crate::crash::mark_final(id),
                        ToExecutor::TriggerCheckpoint(b) => handles.trigger(b),
                        ToExecutor::CheckpointComplete(id) => handles.complete(id),
                        ToExecutor::Stop => control.stop.store(true, Ordering::SeqCst),
                        // The attempt is over: exit now rather than wait for every task to
                        // notice (what this process leaves behind, a restore cleans up, as
                        // after a kill), so the next attempt starts sooner.
                        ToExecutor::Cancel => {
                            control.cancel.store(true, Ordering::SeqCst);
                            tracing::info!(
                                "caudal executor {}: cancelled by the job manager",
                                std::process::id()
                            );
                            std::process::exit(EXIT_CANCELLED);
                        }
                        ToExecutor::StateQuery { id, operator, subtask, request } => {
                            if let Some(answer) = state_server.query(id, operator, subtask, &request) {
                                send(&answer);
                            }
                        }
                        ToExecutor::Heartbeat | ToExecutor::Deploy(_) => {}
                    }
                }
                Ok(Err(reason)) => lost(&format!("the job manager connection ended ({reason})")),
                Err(TryRecvError::Disconnected) => lost("the job manager connection ended"),
                Err(TryRecvError::Empty) => break,
            }
        }
        while let Ok(ack) = ack_rx.try_recv() {
            send(&wire_ack(ack));
        }
        for answer in state_server.ready() {
            send(&answer);
        }
        let finished = handles.iter().filter(|h| h.thread.is_finished()).count();
        let now = (control.sources_at_end.load(Ordering::SeqCst), finished);
        if now != reported {
            reported = now;
            send(&FromExecutor::Progress { sources_at_end: now.0, tasks_finished: now.1 });
        }
        if finished == handles.len() || control.cancel.load(Ordering::SeqCst) {
            break;
        }
        if last_sent.elapsed() >= HEARTBEAT_INTERVAL {
            last_sent = Instant::now();
            send(&FromExecutor::Heartbeat);
            send(&FromExecutor::Metrics { subtasks: local_counters(env, deployment) });
        }
        if last_heard.elapsed() > timeout {
            lost(&format!("no word from the job manager for {timeout:?}"));
        }
        progress.tick(env, config.progress_interval, run.started);
        std::thread::sleep(Duration::from_millis(5));
    }
    let started = run.started;
    run.finish(handles, &control)?;
    // What the tasks sent to other executors must be on the wire before this process ends.
    for s in senders {
        let _ = s.join();
    }
    if let Some(e) = control.failure.lock().take() {
        return Err(e);
    }
    Ok(JobResult {
        operators: env.metrics.snapshot(),
        elapsed: started.elapsed(),
        last_checkpoint: None, // the job manager knows
        checkpoints: Vec::new(),
        savepoint: None,
    })
}

fn deployment_timeout_ms(d: &Deployment) -> u64 {
    d.heartbeat_timeout_ms.max(1000)
}

/// The counters of the subtasks this executor runs (subtask `i` runs in slot `i`).
fn local_counters(env: &JobParts, deployment: &Deployment) -> Vec<SubtaskReport> {
    let local = deployment.peers.get(deployment.executor_index as usize).map(|p| &p.slots);
    let mut out = Vec::new();
    for op in env.metrics.snapshot() {
        for (i, s) in op.subtasks.iter().enumerate() {
            if local.is_some_and(|slots| !slots.contains(&(i as u32))) {
                continue;
            }
            out.push(SubtaskReport { operator: op.id, subtask: i as u32, counters: s.clone() });
        }
    }
    out
}

/// A task's ack as it travels to the job manager (snapshots as metadata JSON).
fn wire_ack(ack: CheckpointAck) -> FromExecutor {
    let snapshots = ack.snapshots.and_then(|list| {
        list.into_iter()
            .map(|(uid, s)| serde_json::to_vec(&s).map(|json| (uid, json)).map_err(|e| e.to_string()))
            .collect::<std::result::Result<Vec<_>, String>>()
    });
    FromExecutor::Ack {
        checkpoint: ack.checkpoint,
        subtask: ack.subtask,
        snapshots,
        stats: WireAckStats::of(&ack.stats),
    }
}

//! One attempt of a job: reserve slots, start an executor on a task manager, deploy,
//! then run the checkpoint coordinator against the executor until the job finishes, is
//! cancelled or fails — and always make sure the executor is gone before returning.
//!
//! The coordinator is the embedded one (`crate::coordinator`): it drives "tasks" through
//! their command channels. Here one proxy task stands for the executor: what the
//! coordinator sends it is forwarded over the control connection, and its thread ends
//! when the executor reports a finished task (so no checkpoint is triggered after that).

use super::taskmanagers::ExecutorEvent;
use super::Cluster;
use crate::cluster::jobmanager::job::ClusterJob;
use crate::cluster::protocol::{
    Deployment, FromExecutor, Link, ToExecutor, ToTaskManager, HEARTBEAT_INTERVAL,
};
use crate::coordinator::{open_store, Coordinator, Tick};
use crate::job::JobStatus;
use crate::runtime::executor::RunningTask;
use crate::runtime::task::{CheckpointAck, TaskCommand};
use crate::types::CheckpointId;
use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, TryRecvError};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a task manager may take to fetch the binary and start the executor.
const EXECUTOR_START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long an executor may take to build its subtasks (restoring state included).
const DEPLOY_TIMEOUT: Duration = Duration::from_secs(300);

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Finished,
    Canceled,
    Failed {
        cause: String,
        /// False for errors a restart cannot fix (bad configuration, corrupt checkpoint).
        retryable: bool,
        /// The attempt completed a checkpoint (the backoff starts over).
        progressed: bool,
    },
}

fn failed(cause: impl Into<String>) -> Outcome {
    Outcome::Failed { cause: cause.into(), retryable: true, progressed: false }
}

/// Runs one attempt that restores `restore` (a checkpoint directory), or starts fresh.
pub(crate) fn run(cluster: &Cluster, job: &ClusterJob, restore: Option<String>) -> Outcome {
    let attempt = {
        let mut s = job.state.lock();
        s.attempt += 1;
        s.task_managers.clear();
        s.attempt
    };
    let executor_id = format!("{}.{}.{attempt}", job.name(), cluster.epoch);
    let (tx, events) = unbounded();
    cluster.tms.add_route(&executor_id, tx);
    let mut a = Attempt {
        cluster,
        job,
        executor_id,
        events,
        tm: None,
        link: None,
        link_closed: false,
        process_gone: false,
        restored: None,
        last_completed: None,
    };
    let mut outcome = a.run(restore);
    if let Outcome::Failed { progressed, .. } = &mut outcome {
        *progressed = a.last_completed > a.restored;
    }
    a.cleanup(&outcome);
    cluster.tms.remove_route(&a.executor_id);
    outcome
}

struct Attempt<'a> {
    cluster: &'a Cluster,
    job: &'a ClusterJob,
    executor_id: String,
    events: Receiver<ExecutorEvent>,
    tm: Option<String>,
    link: Option<Link<FromExecutor>>,
    link_closed: bool,
    process_gone: bool,
    restored: Option<CheckpointId>,
    last_completed: Option<CheckpointId>,
}

impl Attempt<'_> {
    fn cancelled(&self) -> bool {
        self.job.cancel.load(Ordering::SeqCst)
    }

    fn where_(&self) -> String {
        format!("executor {} on task manager {}", self.executor_id, self.tm.as_deref().unwrap_or("?"))
    }

    /// An executor event seen while running: every one but a duplicate connection ends the attempt.
    fn on_event(&mut self, event: ExecutorEvent) -> Option<Outcome> {
        let w = self.where_();
        match event {
            ExecutorEvent::Connected(_) => None,
            ExecutorEvent::Exited(status) => {
                self.process_gone = true;
                Some(failed(format!("{w} exited ({status})")))
            }
            ExecutorEvent::StartFailed(e) => {
                self.process_gone = true;
                Some(failed(format!("{w} could not be started: {e}")))
            }
            ExecutorEvent::TaskManagerLost(cause) => {
                self.process_gone = true;
                Some(failed(cause))
            }
        }
    }

    fn run(&mut self, restore: Option<String>) -> Outcome {
        let job = self.job;
        let needed = job.doc.slots_needed();
        let sender = loop {
            if self.cancelled() {
                return Outcome::Canceled;
            }
            if let Some((tm, sender)) = self.cluster.tms.allocate(&self.executor_id, needed) {
                self.tm = Some(tm.clone());
                job.state.lock().task_managers = vec![tm];
                break sender;
            }
            let (free, total, _, n) = self.cluster.tms.capacity();
            job.set_detail(format!(
                "waiting for {needed} free slots on one task manager ({free} of {total} slots free in {n} task managers)"
            ));
            std::thread::sleep(Duration::from_millis(100));
        };
        let spec = job.spec.lock().clone();
        job.set_detail(format!("starting {}", self.where_()));
        let start = ToTaskManager::StartExecutor {
            executor_id: self.executor_id.clone(),
            binary_sha256: spec.binary_sha256.clone(),
            args: spec.args.clone(),
            env: Vec::new(),
        };
        if let Err(e) = sender.send(&start) {
            self.process_gone = true;
            return failed(format!("cannot reach task manager {}: {e}", self.tm.as_deref().unwrap_or("?")));
        }
        let started = Instant::now();
        let link = loop {
            if self.cancelled() {
                return Outcome::Canceled;
            }
            match self.events.recv_timeout(Duration::from_millis(100)) {
                Ok(ExecutorEvent::Connected(link)) => break link,
                Ok(other) => {
                    if let Some(o) = self.on_event(other) {
                        return o;
                    }
                }
                Err(RecvTimeoutError::Timeout) if started.elapsed() > EXECUTOR_START_TIMEOUT => {
                    return failed(format!(
                        "{} did not connect within {EXECUTOR_START_TIMEOUT:?}",
                        self.where_()
                    ))
                }
                Err(_) => {}
            }
        };
        self.link = Some(link);
        self.restored = restore
            .as_deref()
            .and_then(|r| r.rsplit('/').next())
            .and_then(caudal_checkpoints::CheckpointPaths::parse_checkpoint_dir);
        self.last_completed = self.restored;
        let deployment = Deployment {
            parallelism: spec.parallelism,
            checkpoint_url: self.cluster.config.checkpoint_url.clone(),
            restore,
            heartbeat_timeout_ms: self.cluster.config.heartbeat_timeout.as_millis() as u64,
        };
        if let Err(e) = self.send(&ToExecutor::Deploy(deployment)) {
            return failed(format!("{}: cannot deploy: {e}", self.where_()));
        }
        self.run_deployed()
    }

    fn send(&self, msg: &ToExecutor) -> std::io::Result<()> {
        match &self.link {
            Some(l) => l.sender.send(msg),
            None => Ok(()),
        }
    }

    fn run_deployed(&mut self) -> Outcome {
        let job = self.job;
        let name = job.name();
        let checkpoints = job.doc.checkpoint_config(&self.cluster.config.checkpoint_url);
        let (ack_tx, ack_rx) = unbounded();
        let mut coordinator = if checkpoints.interval.is_some() {
            let built = open_store(&checkpoints, &name).and_then(|(store, paths)| {
                Coordinator::new(
                    store,
                    paths,
                    checkpoints.clone(),
                    &name,
                    &job.view.plan,
                    ack_rx,
                    self.restored,
                )
            });
            match built {
                Ok(c) => Some(c),
                Err(e) => return failed(format!("checkpoint coordinator: {e}")),
            }
        } else {
            None
        };
        // The proxy task of the executor (see the module doc).
        let (cmd_tx, cmd_rx) = unbounded::<TaskCommand>();
        let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(0);
        let thread = match std::thread::Builder::new().name("caudal-executor-proxy".into()).spawn(move || {
            let _ = done_rx.recv();
        }) {
            Ok(t) => t,
            Err(e) => return failed(format!("spawning the executor proxy: {e}")),
        };
        let mut done_tx = Some(done_tx);
        let proxies = vec![RunningTask { is_source: true, commands: cmd_tx, thread }];
        let timeout = self.cluster.config.heartbeat_timeout;
        let total_sources = job.doc.source_subtasks();
        let deployed = Instant::now();
        let (mut last_heard, mut last_sent) = (Instant::now(), Instant::now());
        let (mut running, mut stop_sent) = (false, false);
        let mut stop_since: Option<Instant> = None;
        let mut sources_at_end = 0;
        loop {
            if self.cancelled() {
                return Outcome::Canceled;
            }
            let Some(link) = &self.link else { return failed("internal: no executor link") };
            loop {
                match link.incoming.try_recv() {
                    Ok(Ok(msg)) => {
                        last_heard = Instant::now();
                        match msg {
                            FromExecutor::Running { tasks, sources } => {
                                running = true;
                                job.view.set_status(JobStatus::Running);
                                job.set_detail(format!(
                                    "running: {tasks} tasks ({sources} source subtasks) in {}",
                                    self.where_()
                                ));
                            }
                            FromExecutor::Ack { checkpoint, subtask, snapshots } => {
                                let _ = ack_tx.send(CheckpointAck { checkpoint, subtask, snapshots });
                            }
                            FromExecutor::Progress { sources_at_end: s, tasks_finished } => {
                                sources_at_end = s;
                                if tasks_finished > 0 {
                                    drop(done_tx.take());
                                }
                            }
                            FromExecutor::Finished { error: None, .. } => return Outcome::Finished,
                            FromExecutor::Finished { error: Some(e), retryable } => {
                                return Outcome::Failed {
                                    cause: format!("{}: {e}", self.where_()),
                                    retryable,
                                    progressed: false,
                                }
                            }
                            FromExecutor::Heartbeat => {}
                        }
                    }
                    Ok(Err(reason)) => {
                        self.link_closed = true;
                        return failed(format!("{}: control connection lost ({reason})", self.where_()));
                    }
                    Err(TryRecvError::Disconnected) => {
                        self.link_closed = true;
                        return failed(format!("{}: control connection lost", self.where_()));
                    }
                    Err(TryRecvError::Empty) => break,
                }
            }
            while let Ok(ev) = self.events.try_recv() {
                if let Some(o) = self.on_event(ev) {
                    return o;
                }
            }
            if last_sent.elapsed() >= HEARTBEAT_INTERVAL {
                last_sent = Instant::now();
                if let Err(e) = self.send(&ToExecutor::Heartbeat) {
                    return failed(format!("{}: cannot send: {e}", self.where_()));
                }
            }
            if last_heard.elapsed() > timeout {
                return failed(format!("{} missed its heartbeats for {timeout:?}", self.where_()));
            }
            if !running {
                if deployed.elapsed() > DEPLOY_TIMEOUT {
                    return failed(format!(
                        "{} did not start its subtasks within {DEPLOY_TIMEOUT:?}",
                        self.where_()
                    ));
                }
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            let stopping = total_sources > 0 && sources_at_end >= total_sources;
            if stopping && stop_since.is_none() {
                stop_since = Some(Instant::now());
            }
            let mut stop_now = stopping && coordinator.is_none();
            if let Some(c) = coordinator.as_mut() {
                match c.tick(&proxies, &job.view, stopping) {
                    Ok(tick) => {
                        let overdue = stop_since.is_some_and(|t| t.elapsed() > c.stop_timeout());
                        stop_now = tick == Tick::StopSources || overdue;
                    }
                    Err(e) => return failed(format!("checkpoint coordinator: {e}")),
                }
                if c.last_completed != self.last_completed {
                    self.last_completed = c.last_completed;
                    job.state.lock().last_checkpoint = c.last_completed.map(|i| i.0);
                }
            }
            if stop_now && !stop_sent {
                stop_sent = true;
                job.set_detail(format!("input ended: final checkpoint taken, stopping {}", self.where_()));
                if let Err(e) = self.send(&ToExecutor::Stop) {
                    return failed(format!("{}: cannot send: {e}", self.where_()));
                }
            }
            while let Ok(cmd) = cmd_rx.try_recv() {
                let msg = match cmd {
                    TaskCommand::TriggerCheckpoint(b) => ToExecutor::TriggerCheckpoint(b),
                    TaskCommand::CheckpointComplete(id) => ToExecutor::CheckpointComplete(id),
                };
                if let Err(e) = self.send(&msg) {
                    return failed(format!("{}: cannot send: {e}", self.where_()));
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Makes sure the executor is gone: cancel it, ask its task manager to kill it, wait
    /// (at most the heartbeat timeout) until its connection closed and its process ended.
    fn cleanup(&mut self, outcome: &Outcome) {
        if *outcome != Outcome::Finished {
            let _ = self.send(&ToExecutor::Cancel);
            if let Some(sender) = self.tm.as_deref().and_then(|tm| self.cluster.tms.sender(tm)) {
                let _ = sender.send(&ToTaskManager::StopExecutor { executor_id: self.executor_id.clone() });
            }
        }
        if self.tm.is_none() {
            self.process_gone = true;
        }
        if self.link.is_none() {
            self.link_closed = true;
        }
        let deadline = Instant::now() + self.cluster.config.heartbeat_timeout;
        while !(self.link_closed && self.process_gone) && Instant::now() < deadline {
            if let Some(link) = &self.link {
                match link.incoming.recv_timeout(Duration::from_millis(10)) {
                    Ok(Err(_)) | Err(RecvTimeoutError::Disconnected) => self.link_closed = true,
                    _ => {}
                }
            }
            while let Ok(ev) = self.events.try_recv() {
                if !matches!(ev, ExecutorEvent::Connected(_)) {
                    self.process_gone = true;
                }
            }
            if self.link_closed && !self.process_gone {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        if !(self.link_closed && self.process_gone) {
            eprintln!(
                "caudal jobmanager: {} did not confirm its end within {:?}",
                self.where_(),
                self.cluster.config.heartbeat_timeout
            );
        }
        if let Some(link) = &self.link {
            link.sender.close();
        }
        self.cluster.tms.release(&self.executor_id);
    }
}

//! One attempt of a job: reserve slots (spread over task managers), start one executor
//! per task manager used, tell every executor its slots and its peers' data addresses,
//! then run the checkpoint coordinator against the executors until the job finishes, is
//! cancelled or fails — and always make sure every executor is gone before returning.
//!
//! The coordinator is the embedded one (`crate::coordinator`), and the executors are its
//! [`Participants`]: a trigger or completion it sends in a tick is queued per executor and
//! goes out over the control connections after the tick, in order, before any `Stop`
//! ([`to_executors`]); once an executor reports a finished task no checkpoint is
//! triggered any more. Acks from every executor go to the one coordinator. The stop rule
//! is the embedded one too ([`StopRule`]).

use super::taskmanagers::ExecutorEvent;
use super::Cluster;
use crate::cluster::jobmanager::job::ClusterJob;
use crate::cluster::protocol::{
    Deployment, FromExecutor, Link, Peer, Sender as LinkSender, ToExecutor, ToTaskManager, HEARTBEAT_INTERVAL,
};
use crate::cluster::state_forward::RemoteState;
use crate::config::{CheckpointConfig, RestoreFrom};
use crate::coordinator::{open_store, Coordinator, Participants};
use crate::job::JobStatus;
use crate::restore::restore_points;
use crate::run::StopRule;
use crate::runtime::task::{CheckpointAck, TaskCommand};
use crate::types::{CheckpointBarrier, CheckpointId};
use caudal_checkpoints::Lineage;
use crossbeam_channel::{unbounded, Receiver, Sender, TryRecvError};
use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long task managers may take to fetch the binary and start the executors.
const EXECUTOR_START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long executors may take to build their subtasks (restoring state included).
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

/// One executor of the attempt.
struct Exec {
    id: String,
    tm: String,
    tm_sender: LinkSender,
    slots: Vec<u32>,
    link: Option<Link<FromExecutor>>,
    data_addr: Option<String>,
    link_closed: bool,
    process_gone: bool,
    running: bool,
    finished: bool,
    sources_at_end: usize,
    last_heard: Instant,
    /// The executor reported a finished task: it takes part in no further checkpoint.
    tasks_finished: bool,
    /// State queries for its keyed subtasks wake this channel (and are then forwarded).
    wake: (Sender<TaskCommand>, Receiver<TaskCommand>),
    /// State browser queries to its keyed subtasks.
    state: RemoteState,
}

impl Exec {
    fn name(&self) -> String {
        format!("executor {} on task manager {}", self.id, self.tm)
    }

    fn send(&self, msg: &ToExecutor) -> Result<(), Outcome> {
        match &self.link {
            Some(l) => l.sender.send(msg).map_err(|e| failed(format!("{}: cannot send: {e}", self.name()))),
            None => Ok(()),
        }
    }
}

/// Runs one attempt that restores `restore` (a checkpoint directory), or starts fresh.
pub(crate) fn run(cluster: &Cluster, job: &ClusterJob, restore: Option<String>) -> Outcome {
    let attempt = {
        let mut s = job.state.lock();
        s.attempt += 1;
        s.task_managers.clear();
        s.attempt
    };
    let (tx, events) = unbounded();
    let mut a = Attempt {
        cluster,
        job,
        prefix: format!("{}.{}.{attempt}", job.name(), cluster.epoch),
        // Unique per job manager run (its start time) and attempt.
        attempt_id: format!("{:x}a{attempt}", cluster.epoch),
        route: tx,
        events,
        execs: Vec::new(),
        restore: None,
        restored: None,
        last_completed: None,
    };
    let mut outcome = a.run(restore);
    if let Outcome::Failed { progressed, .. } = &mut outcome {
        *progressed = a.last_completed > a.restored;
    }
    a.cleanup(&mut outcome);
    outcome
}

struct Attempt<'a> {
    cluster: &'a Cluster,
    job: &'a ClusterJob,
    prefix: String,
    /// Given to every executor ([`Deployment::attempt`]).
    attempt_id: String,
    route: Sender<(String, ExecutorEvent)>,
    events: Receiver<(String, ExecutorEvent)>,
    execs: Vec<Exec>,
    /// The checkpoint directory restored from, as the executors are told.
    restore: Option<String>,
    restored: Option<CheckpointId>,
    last_completed: Option<CheckpointId>,
}

impl Attempt<'_> {
    /// Cancelled, or stopped before it runs (nothing to checkpoint yet).
    fn cancelled(&self) -> bool {
        self.job.cancel.load(Ordering::SeqCst)
            || (self.job.stop.load(Ordering::SeqCst) && !self.execs.iter().all(|e| e.running))
    }

    /// An executor event: `Some(outcome)` when it ends the attempt.
    fn on_event(&mut self, id: &str, event: ExecutorEvent) -> Option<Outcome> {
        let e = self.execs.iter_mut().find(|e| e.id == id)?;
        let name = e.name();
        match event {
            ExecutorEvent::Connected(link) => {
                e.last_heard = Instant::now();
                e.link = Some(link);
                None
            }
            // A clean exit follows the executor's `Finished`, which may still wait unread on
            // its link (the task manager's report took another connection): the link decides.
            ExecutorEvent::Exited(status) if status == super::super::taskmanager::CLEAN_EXIT => {
                e.process_gone = true;
                None
            }
            ExecutorEvent::Exited(status) => {
                e.process_gone = true;
                (!e.finished).then(|| failed(format!("{name} exited ({status})")))
            }
            ExecutorEvent::StartFailed(err) => {
                e.process_gone = true;
                Some(failed(format!("{name} could not be started: {err}")))
            }
            ExecutorEvent::TaskManagerLost(cause) => {
                e.process_gone = true;
                (!e.finished).then_some(failed(cause))
            }
        }
    }

    fn drain_events(&mut self, wait: Duration) -> Option<Outcome> {
        let first = match self.events.recv_timeout(wait) {
            Ok(ev) => ev,
            Err(_) => return None,
        };
        let mut pending = vec![first];
        while let Ok(ev) = self.events.try_recv() {
            pending.push(ev);
        }
        let mut outcome = None;
        for (id, ev) in pending {
            if let Some(o) = self.on_event(&id, ev) {
                outcome.get_or_insert(o);
            }
        }
        outcome
    }

    fn run(&mut self, restore: Option<String>) -> Outcome {
        let job = self.job;
        let needed = job.doc.slots_needed();
        let placed = loop {
            if self.cancelled() {
                return Outcome::Canceled;
            }
            let prefix = self.prefix.clone();
            if let Some(p) = self.cluster.tms.allocate(needed, |i| format!("{prefix}.{i}")) {
                break p;
            }
            let (free, total, _, n) = self.cluster.tms.capacity();
            job.set_detail(format!(
                "waiting for {needed} free slots ({free} of {total} slots free in {n} task managers)"
            ));
            std::thread::sleep(Duration::from_millis(100));
        };
        for p in placed {
            self.cluster.tms.add_route(&p.executor_id, self.route.clone());
            self.execs.push(Exec {
                id: p.executor_id,
                tm: p.task_manager,
                tm_sender: p.sender,
                slots: p.slots,
                link: None,
                data_addr: None,
                link_closed: false,
                process_gone: false,
                running: false,
                finished: false,
                sources_at_end: 0,
                last_heard: Instant::now(),
                tasks_finished: false,
                wake: unbounded(),
                state: RemoteState::default(),
            });
        }
        job.state.lock().task_managers = self.execs.iter().map(|e| e.tm.clone()).collect();
        job.set_detail(format!("starting {} executors", self.execs.len()));
        let spec = job.spec.lock().clone();
        for e in &mut self.execs {
            let start = ToTaskManager::StartExecutor {
                executor_id: e.id.clone(),
                binary_sha256: spec.binary_sha256.clone(),
                args: spec.args.clone(),
                env: Vec::new(),
            };
            if let Err(err) = e.tm_sender.send(&start) {
                e.process_gone = true;
                return failed(format!("cannot reach task manager {}: {err}", e.tm));
            }
        }
        // Every executor connects and says where its data port is.
        let started = Instant::now();
        while self.execs.iter().any(|e| e.data_addr.is_none()) {
            if self.cancelled() {
                return Outcome::Canceled;
            }
            if let Some(o) = self.drain_events(Duration::from_millis(20)) {
                return o;
            }
            for e in &mut self.execs {
                let Some(link) = &e.link else { continue };
                match link.incoming.try_recv() {
                    Ok(Ok(FromExecutor::DataPort { addr })) => e.data_addr = Some(addr),
                    Ok(Ok(other)) => {
                        return failed(format!("{}: expected its data port, got {other:?}", e.name()))
                    }
                    Ok(Err(reason)) => {
                        e.link_closed = true;
                        return failed(format!("{}: control connection lost ({reason})", e.name()));
                    }
                    Err(_) => {}
                }
            }
            if started.elapsed() > EXECUTOR_START_TIMEOUT {
                return failed(format!(
                    "the executors did not all connect within {EXECUTOR_START_TIMEOUT:?}"
                ));
            }
        }
        self.restore.clone_from(&restore);
        self.restored = restore
            .as_deref()
            .and_then(|r| r.rsplit('/').next())
            .and_then(caudal_checkpoints::CheckpointPaths::parse_checkpoint_dir);
        self.last_completed = self.restored;
        if let Err(o) = self.claim_storage() {
            return o;
        }
        let peers: Vec<Peer> = self
            .execs
            .iter()
            .map(|e| Peer { slots: e.slots.clone(), addr: e.data_addr.clone().unwrap_or_default() })
            .collect();
        for (i, e) in self.execs.iter().enumerate() {
            let deployment = Deployment {
                parallelism: spec.parallelism,
                checkpoint_url: self.cluster.config.checkpoint_url.clone(),
                restore: restore.clone(),
                heartbeat_timeout_ms: self.cluster.config.heartbeat_timeout.as_millis() as u64,
                executor_index: i as u32,
                attempt: self.attempt_id.clone(),
                peers: peers.clone(),
            };
            if let Err(o) = e.send(&ToExecutor::Deploy(deployment)) {
                return o;
            }
        }
        self.run_deployed()
    }

    /// Claims the job's checkpoint storage for this attempt before its executors restore,
    /// where the attempt checkpoints (as [`Self::coordinator`]): executors of earlier
    /// attempts that still live find the claim before they begin output a restore would not
    /// know (`crate::RunFence`).
    fn claim_storage(&self) -> Result<(), Outcome> {
        let checkpoints = self.job.doc.checkpoint_config(&self.cluster.config);
        if checkpoints.interval.is_none() && self.restored.is_none() {
            return Ok(());
        }
        open_store(&checkpoints, &self.job.name())
            .and_then(|(store, paths)| crate::RunFence::new(store, paths, &self.attempt_id).claim())
            .map_err(|e| failed(format!("claiming the checkpoint storage: {e}")))
    }

    /// The attempt's checkpoint coordinator, reading the executors' acks from `acks`. As
    /// `CheckpointConfig::enabled` in the executors: a restored attempt checkpoints (at
    /// least its final checkpoint), or its sinks would wait for completions forever.
    fn coordinator(&self, acks: Receiver<CheckpointAck>) -> Result<Option<Coordinator>, Outcome> {
        let name = self.job.name();
        let checkpoints = self.job.doc.checkpoint_config(&self.cluster.config);
        if checkpoints.interval.is_none() && self.restored.is_none() {
            return Ok(None);
        }
        let built = open_store(&checkpoints, &name).and_then(|(store, paths)| {
            let restore = CheckpointConfig {
                restore: self.restore.clone().map(RestoreFrom::Path),
                ..checkpoints.clone()
            };
            let restored_from = restore_points(&restore, store.as_ref(), &paths, &name)?;
            let lineage = Lineage { run: self.attempt_id.clone(), restored_from };
            Coordinator::new(store, paths, checkpoints, acks, self.restored, lineage, self.job.view.clone())
        });
        built.map(Some).map_err(|e| failed(format!("checkpoint coordinator: {e}")))
    }

    fn run_deployed(&mut self) -> Outcome {
        let job = self.job;
        let (ack_tx, ack_rx) = unbounded();
        let mut coordinator = match self.coordinator(ack_rx) {
            Ok(c) => c,
            Err(o) => return o,
        };
        let timeout = self.cluster.config.heartbeat_timeout;
        let total_sources = job.doc.source_subtasks();
        let deployed = Instant::now();
        let mut last_sent = Instant::now();
        let mut rule = StopRule::new();
        loop {
            if self.cancelled() {
                return Outcome::Canceled;
            }
            // Process deaths first: a lost task manager is the root cause of the data
            // connection errors its peers report a moment later.
            if let Some(o) = self.drain_events(Duration::ZERO) {
                return o;
            }
            if let Some(o) = self.poll_executors(&ack_tx, timeout) {
                return o;
            }
            if self.execs.iter().all(|e| e.finished) {
                let savepoint = job.view.stop_savepoint().filter(|_| job.stop.load(Ordering::SeqCst));
                if let Some(name) = savepoint {
                    let written = match &coordinator {
                        Some(c) => c.savepoint_of_final_checkpoint(&name).map_err(|e| e.to_string()),
                        None => Err("the job takes no checkpoints".to_string()),
                    };
                    job.state.lock().stop_savepoint = Some(written);
                }
                return Outcome::Finished;
            }
            if last_sent.elapsed() >= HEARTBEAT_INTERVAL {
                last_sent = Instant::now();
                for e in self.execs.iter().filter(|e| !e.finished) {
                    if let Err(o) = e.send(&ToExecutor::Heartbeat) {
                        return o;
                    }
                }
            }
            if !self.execs.iter().all(|e| e.running) {
                if deployed.elapsed() > DEPLOY_TIMEOUT {
                    return failed(format!(
                        "the executors did not start their subtasks within {DEPLOY_TIMEOUT:?}"
                    ));
                }
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            if job.view.status() != JobStatus::Running {
                job.view.set_status(JobStatus::Running);
                let names: Vec<String> =
                    self.execs.iter().map(|e| format!("{} {:?}", e.tm, e.slots)).collect();
                job.set_detail(format!("running on task managers (slots): {}", names.join(", ")));
            }
            let at_end: usize = self.execs.iter().map(|e| e.sources_at_end).sum();
            let stopping = (total_sources > 0 && at_end >= total_sources) || job.stop.load(Ordering::SeqCst);
            let outbox = Outbox::of(&self.execs);
            // As in embedded mode: Stop only after the final checkpoint completed;
            // overdue or failing checkpoints fail the attempt.
            let stop = match rule.tick(coordinator.as_mut(), &outbox, &job.view, stopping) {
                Ok(stop) => stop,
                Err(err) => return failed(format!("checkpoint coordinator: {err}")),
            };
            if let Some(c) = &coordinator {
                if c.last_completed != self.last_completed {
                    self.last_completed = c.last_completed;
                    job.state.lock().last_checkpoint = c.last_completed.map(|i| i.0);
                }
            }
            if stop {
                job.set_detail("final checkpoint taken, stopping");
            }
            let woken: Vec<bool> = self.execs.iter().map(|e| e.wake.1.try_iter().count() > 0).collect();
            let execs = &mut self.execs;
            let msgs = to_executors(outbox.queued.into_inner(), &woken, stop, |i| execs[i].state.forward());
            for (i, msg) in &msgs {
                if let Err(o) = self.execs[*i].send(msg) {
                    return o;
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Reads what every executor sent since the last tick; the outcome when one failed,
    /// lost its connection before finishing, or missed its heartbeats.
    fn poll_executors(&mut self, ack_tx: &Sender<CheckpointAck>, timeout: Duration) -> Option<Outcome> {
        let job = self.job;
        for e in &mut self.execs {
            let Some(link) = &e.link else { continue };
            loop {
                match link.incoming.try_recv() {
                    Ok(Ok(msg)) => {
                        e.last_heard = Instant::now();
                        match msg {
                            FromExecutor::Running { keyed, .. } => {
                                e.running = true;
                                e.state.register(&job.view.state_queries, &keyed, &e.wake.0);
                            }
                            FromExecutor::StateAnswer { id, reply } => e.state.answer(id, reply),
                            FromExecutor::Ack { checkpoint, subtask, snapshots, stats } => {
                                let snapshots = snapshots.and_then(|list| {
                                    list.into_iter()
                                        .map(|(uid, json)| {
                                            serde_json::from_slice(&json)
                                                .map(|s| (uid, s))
                                                .map_err(|e| format!("undecodable snapshot: {e}"))
                                        })
                                        .collect::<Result<Vec<_>, String>>()
                                });
                                let stats = stats.stats();
                                let _ = ack_tx.send(CheckpointAck { checkpoint, subtask, snapshots, stats });
                            }
                            FromExecutor::Progress { sources_at_end, tasks_finished } => {
                                e.sources_at_end = sources_at_end;
                                e.tasks_finished |= tasks_finished > 0;
                            }
                            FromExecutor::Finished { error: None, .. } => e.finished = true,
                            FromExecutor::Finished { error: Some(err), retryable } => {
                                return Some(Outcome::Failed {
                                    cause: format!("{}: {err}", e.name()),
                                    retryable,
                                    progressed: false,
                                });
                            }
                            FromExecutor::Metrics { subtasks } => job.record_counters(&subtasks),
                            FromExecutor::Heartbeat | FromExecutor::DataPort { .. } => {}
                        }
                    }
                    Ok(Err(reason)) => {
                        e.link_closed = true;
                        if e.finished {
                            break;
                        }
                        return Some(failed(format!("{}: control connection lost ({reason})", e.name())));
                    }
                    Err(TryRecvError::Disconnected) => {
                        e.link_closed = true;
                        if e.finished {
                            break;
                        }
                        return Some(failed(format!("{}: control connection lost", e.name())));
                    }
                    Err(TryRecvError::Empty) => break,
                }
            }
            if !e.finished && e.last_heard.elapsed() > timeout {
                return Some(failed(format!("{} missed its heartbeats for {timeout:?}", e.name())));
            }
        }
        None
    }

    /// Makes sure every executor is gone: cancel it, ask its task manager to kill it, wait
    /// (at most the heartbeat timeout) until its connection closed and its process ended.
    /// An error no restart can mend that an executor reports meanwhile becomes the outcome's
    /// cause: the failure seen first is often a consequence (a peer whose data connection
    /// went away when the executor with the real cause exited).
    fn cleanup(&mut self, outcome: &mut Outcome) {
        for e in &mut self.execs {
            if !e.finished || *outcome != Outcome::Finished {
                let _ = e.send(&ToExecutor::Cancel);
                let _ = e.tm_sender.send(&ToTaskManager::StopExecutor { executor_id: e.id.clone() });
            }
            if e.link.is_none() {
                e.link_closed = true;
            }
        }
        let deadline = Instant::now() + self.cluster.config.heartbeat_timeout;
        while self.execs.iter().any(|e| !(e.link_closed && e.process_gone)) && Instant::now() < deadline {
            for e in &mut self.execs {
                if let Some(link) = &e.link {
                    loop {
                        match link.incoming.try_recv() {
                            Ok(Err(_)) | Err(TryRecvError::Disconnected) => {
                                e.link_closed = true;
                                break;
                            }
                            Ok(Ok(FromExecutor::Finished { error: Some(err), retryable: false })) => {
                                if let Outcome::Failed { cause, retryable, .. } = outcome {
                                    if *retryable {
                                        tracing::info!(
                                            "caudal jobmanager: {} reported the cause behind `{cause}`",
                                            e.name()
                                        );
                                        *cause = format!("{}: {err}", e.name());
                                        *retryable = false;
                                    }
                                }
                            }
                            Ok(Ok(_)) => {}
                            Err(TryRecvError::Empty) => break,
                        }
                    }
                }
            }
            let _ = self.drain_events(Duration::from_millis(10));
        }
        for e in &self.execs {
            if !(e.link_closed && e.process_gone) {
                tracing::error!(
                    "caudal jobmanager: {} did not confirm its end within {:?}",
                    e.name(),
                    self.cluster.config.heartbeat_timeout
                );
            }
            if let Some(link) = &e.link {
                link.sender.close();
            }
            self.cluster.tms.release(&e.id);
            self.cluster.tms.remove_route(&e.id);
        }
    }
}

/// The executors as the coordinator's participants in one tick: what it sends is queued
/// per executor (none to one whose subtasks all finished), to go out after the tick.
struct Outbox {
    finished: Vec<bool>,
    tasks_finished: bool,
    queued: RefCell<Vec<(usize, ToExecutor)>>,
}

impl Outbox {
    fn of(execs: &[Exec]) -> Self {
        Outbox {
            finished: execs.iter().map(|e| e.finished).collect(),
            tasks_finished: execs.iter().any(|e| e.tasks_finished),
            queued: RefCell::new(Vec::new()),
        }
    }

    fn queue(&self, msg: impl Fn() -> ToExecutor) {
        let mut q = self.queued.borrow_mut();
        q.extend(self.finished.iter().enumerate().filter(|(_, f)| !**f).map(|(i, _)| (i, msg())));
    }
}

impl Participants for Outbox {
    fn trigger(&self, barrier: CheckpointBarrier) {
        if crate::crash::is_marked_final(barrier.id) {
            self.queue(|| ToExecutor::FinalCheckpoint(barrier.id));
        }
        self.queue(|| ToExecutor::TriggerCheckpoint(barrier));
    }

    fn complete(&self, id: CheckpointId) {
        self.queue(|| ToExecutor::CheckpointComplete(id));
    }

    fn any_finished(&self) -> bool {
        self.tasks_finished
    }
}

/// What the job manager sends its executors in one tick, in order, as (executor index,
/// message): the coordinator's messages of the tick, then the state queries of each
/// executor that was woken for them, then `Stop` to every executor when the job stops now.
/// The final checkpoint's `CheckpointComplete` is among the coordinator's messages of the
/// tick that stops, and must reach every executor before any `Stop`: tasks commit it
/// before they close their sinks (sent the other way round, the last epoch could stay
/// pre-committed).
fn to_executors(
    queued: Vec<(usize, ToExecutor)>,
    woken: &[bool],
    stop: bool,
    mut forward_state_queries: impl FnMut(usize) -> Vec<ToExecutor>,
) -> Vec<(usize, ToExecutor)> {
    let mut msgs = queued;
    for (i, _) in woken.iter().enumerate().filter(|(_, w)| **w) {
        msgs.extend(forward_state_queries(i).into_iter().map(|m| (i, m)));
    }
    if stop {
        msgs.extend((0..woken.len()).map(|i| (i, ToExecutor::Stop)));
    }
    msgs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_final_checkpoints_completion_goes_out_before_any_stop() {
        let outbox = Outbox {
            finished: vec![false, false, true],
            tasks_finished: true,
            queued: RefCell::new(Vec::new()),
        };
        outbox.complete(CheckpointId(7));
        let msgs = to_executors(outbox.queued.into_inner(), &[false; 3], true, |_| Vec::new());
        let order: Vec<String> = msgs.iter().map(|(i, m)| format!("{i}:{m:?}")).collect();
        assert_eq!(
            order,
            [
                "0:CheckpointComplete(CheckpointId(7))",
                "1:CheckpointComplete(CheckpointId(7))",
                "0:Stop",
                "1:Stop",
                "2:Stop"
            ],
            "a finished executor gets no commands, but the stop"
        );
        let msgs = to_executors(Vec::new(), &[true], false, |_| vec![ToExecutor::Heartbeat]);
        assert!(matches!(msgs.as_slice(), [(0, ToExecutor::Heartbeat)]), "{msgs:?}");
    }
}

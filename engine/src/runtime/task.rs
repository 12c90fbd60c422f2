//! Task loops: a source task polls its reader; every other task reads its input gate.
//! Both drive a chain of operators and obey commands (checkpoint, complete, cancel).

use super::chain::{AnyBatch, ChainNode, Fanout, TakenSnapshot};
use super::exchange::ChannelMessage;
use super::processing_clock::ProcessingClock;
use super::upload::{UploadJob, UploadQueue};
use crate::metrics::SubtaskMetrics;
use crate::source::{SourceOutput, SourcePoll, SourceReader, SplitWatermarks, TimestampFn};
use crate::types::{
    Batch, CheckpointBarrier, CheckpointId, Data, LatencyMarker, StreamMessage, Timestamp, MAX_WATERMARK,
    MIN_WATERMARK,
};
use crate::{Error, Result};
use caudal_checkpoints::{Blob, SubtaskSnapshot};
use crossbeam_channel::{Receiver, RecvTimeoutError, Select, Sender};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Commands the job sends to a running task.
#[derive(Debug, Clone, Copy)]
pub(crate) enum TaskCommand {
    /// Sources only: take checkpoint `barrier.id` now.
    TriggerCheckpoint(CheckpointBarrier),
    /// Checkpoint complete: commit.
    CheckpointComplete(CheckpointId),
    /// The state browser left queries in a keyed operator's mailbox (`state_query`).
    ServeStateQueries,
}

/// A task's acknowledgement of a checkpoint, with the snapshots of its operators.
#[derive(Debug)]
pub(crate) struct CheckpointAck {
    pub(crate) checkpoint: CheckpointId,
    pub(crate) subtask: u32,
    /// (operator uid, snapshot) for every operator of the chain, the source's position first;
    /// an error declines the checkpoint (an upload failed).
    pub(crate) snapshots: std::result::Result<Vec<(String, SubtaskSnapshot)>, String>,
    pub(crate) stats: AckStats,
}

/// What a subtask's snapshot cost.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AckStats {
    /// From the first barrier at the task's inputs to the last (0 for one input or a source).
    pub(crate) alignment: Duration,
    /// The longest synchronous keyed-state snapshot part of the task's operators.
    pub(crate) sync: Duration,
    /// The asynchronous part (uploads) of the task.
    pub(crate) upload: Duration,
    /// Bytes written to checkpoint storage for this checkpoint.
    pub(crate) uploaded_bytes: u64,
    /// Bytes of state referenced (uploaded now or earlier).
    pub(crate) state_bytes: u64,
}

/// What every task loop shares with the job.
#[derive(Clone)]
pub(crate) struct TaskEnv {
    pub(crate) task: String,
    pub(crate) subtask: u32,
    pub(crate) commands: Receiver<TaskCommand>,
    pub(crate) acks: Option<Sender<CheckpointAck>>,
    /// Where keyed-state snapshots are uploaded (off the task thread) before the ack.
    pub(crate) uploads: Option<UploadQueue>,
    /// Graceful stop (Ctrl-C, stop-with-savepoint): sources end their streams.
    pub(crate) stop: Arc<AtomicBool>,
    /// Hard cancel (a task failed): every loop returns as soon as it can.
    pub(crate) cancel: Arc<AtomicBool>,
    /// Source subtasks that reached the end of their input and wait for the final checkpoint.
    pub(crate) sources_at_end: Arc<std::sync::atomic::AtomicUsize>,
}

impl TaskEnv {
    /// Acks `checkpoint` now, or after the keyed-state uploads when there are any.
    fn ack(&self, checkpoint: CheckpointId, snapshots: Vec<TakenSnapshot>, alignment: Duration) {
        crate::crash::point(crate::crash::AFTER_SNAPSHOT_BEFORE_ACK, checkpoint);
        let Some(acks) = &self.acks else { return };
        let subtask = self.subtask;
        match &self.uploads {
            Some(q) if snapshots.iter().any(|s| s.keyed.is_some()) => {
                q.submit(UploadJob { checkpoint, subtask, snapshots, alignment, acks: acks.clone() })
            }
            _ => {
                let snapshots = snapshots
                    .into_iter()
                    .map(|s| {
                        let state =
                            SubtaskSnapshot { keyed_state: None, operator_state: s.operator_state.map(Blob) };
                        (s.uid, state)
                    })
                    .collect();
                let stats = AckStats { alignment, ..AckStats::default() };
                // The coordinator may be gone at shutdown; a lost ack only aborts that checkpoint.
                let _ = acks.send(CheckpointAck { checkpoint, subtask, snapshots: Ok(snapshots), stats });
            }
        }
    }
}

/// A runnable source task (type-erased).
pub(crate) trait SourceTask: Send {
    fn run(&mut self, env: &TaskEnv) -> Result<()>;
}

/// Settings of a source task loop.
pub(crate) struct SourceTaskSettings<T> {
    /// The source operator's uid in checkpoints.
    pub(crate) uid: String,
    pub(crate) timestamp: Option<TimestampFn<T>>,
    pub(crate) out_of_orderness: Duration,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) batch_size: usize,
    pub(crate) linger: Duration,
    pub(crate) metrics: Arc<SubtaskMetrics>,
    /// With checkpoints, a finished source waits for the final checkpoint before it ends.
    pub(crate) checkpointing: bool,
    /// Emit a latency marker this often (`None`: never).
    pub(crate) latency_marker_interval: Option<Duration>,
}

pub(crate) struct SourceRunner<T: Data> {
    reader: Box<dyn SourceReader<T>>,
    settings: SourceTaskSettings<T>,
    fanout: Fanout<T>,
    buf: Batch<T>,
    clocks: SplitWatermarks,
    last_wm: Timestamp,
    idle: bool,
    next_marker: Option<Instant>,
}

impl<T: Data> SourceRunner<T> {
    pub(crate) fn new(
        reader: Box<dyn SourceReader<T>>,
        settings: SourceTaskSettings<T>,
        fanout: Fanout<T>,
    ) -> Self {
        let clocks = SplitWatermarks::new(reader.splits(), settings.out_of_orderness, settings.idle_timeout);
        SourceRunner {
            reader,
            settings,
            fanout,
            buf: Vec::new(),
            clocks,
            last_wm: MIN_WATERMARK,
            idle: false,
            next_marker: None,
        }
    }

    /// After a flush: a latency marker when one is due (behind the records just sent).
    fn maybe_latency_marker(&mut self, now: Instant) -> Result<()> {
        let Some(interval) = self.settings.latency_marker_interval else { return Ok(()) };
        if self.next_marker.is_some_and(|at| now < at) {
            return Ok(());
        }
        self.next_marker = Some(now + interval);
        let marker = LatencyMarker::now();
        self.fanout.each(|t| t.latency_marker(marker))
    }

    fn flush(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let batch = std::mem::replace(&mut self.buf, Vec::with_capacity(self.settings.batch_size));
        self.settings.metrics.add_out(batch.len());
        self.fanout.push(batch)
    }

    fn emit_watermark(&mut self, now: Instant) -> Result<()> {
        if self.settings.timestamp.is_none() {
            return Ok(());
        }
        match self.clocks.current(now) {
            Some(wm) if wm > self.last_wm || (self.idle && wm >= self.last_wm) => {
                self.last_wm = wm;
                self.idle = false;
                self.settings.metrics.set_watermark(wm);
                self.fanout.each(|t| t.watermark(wm))
            }
            Some(_) => Ok(()),
            None if !self.idle => {
                self.idle = true;
                self.fanout.each(|t| t.idle())
            }
            None => Ok(()),
        }
    }

    fn handle(&mut self, cmd: TaskCommand, env: &TaskEnv) -> Result<()> {
        match cmd {
            TaskCommand::TriggerCheckpoint(barrier) => {
                self.flush()?;
                let position = self.reader.position()?;
                let mut snapshots = vec![TakenSnapshot::operator(self.settings.uid.clone(), Some(position))];
                self.fanout.each(|t| t.barrier(barrier, &mut snapshots))?;
                env.ack(barrier.id, snapshots, Duration::ZERO);
                Ok(())
            }
            TaskCommand::CheckpointComplete(id) => {
                self.reader.on_checkpoint_complete(id)?;
                self.fanout.each(|t| t.checkpoint_complete(id))
            }
            TaskCommand::ServeStateQueries => self.fanout.each(|t| t.serve_state_queries()),
        }
    }

    /// The completion of a checkpoint that finished just before the stop is queued by the
    /// time the stop is seen (it is sent first): chained sinks commit it before they close.
    fn deliver_queued_completions(&mut self, env: &TaskEnv) -> Result<()> {
        while let Ok(cmd) = env.commands.try_recv() {
            if let TaskCommand::CheckpointComplete(_) = cmd {
                self.handle(cmd, env)?;
            }
        }
        Ok(())
    }

    /// End of input with checkpoints on: fire everything downstream (final watermark), then
    /// take part in the final checkpoint, so what sinks publish at the end is committed by a
    /// checkpoint — a kill at any moment after it loses and duplicates nothing. Ends when
    /// the job says stop.
    fn await_final_checkpoint(&mut self, env: &TaskEnv) -> Result<()> {
        self.flush()?;
        self.settings.metrics.set_watermark(MAX_WATERMARK);
        self.fanout.each(|t| t.watermark(MAX_WATERMARK))?;
        env.sources_at_end.fetch_add(1, Ordering::SeqCst);
        loop {
            if env.cancel.load(Ordering::Relaxed) {
                return Err(Error::Cancelled);
            }
            if env.stop.load(Ordering::Relaxed) {
                self.deliver_queued_completions(env)?;
                return self.fanout.each(|t| t.end());
            }
            match env.commands.recv_timeout(Duration::from_millis(20)) {
                Ok(cmd) => self.handle(cmd, env)?,
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    fn finish(&mut self, final_watermark: bool) -> Result<()> {
        self.flush()?;
        if final_watermark {
            self.settings.metrics.set_watermark(MAX_WATERMARK);
            self.fanout.each(|t| t.watermark(MAX_WATERMARK))?;
        }
        self.fanout.each(|t| t.end())
    }
}

impl<T: Data> SourceTask for SourceRunner<T> {
    fn run(&mut self, env: &TaskEnv) -> Result<()> {
        self.fanout.each(|t| t.open())?;
        let mut first_buffered: Option<Instant> = None;
        let mut clock = ProcessingClock::new();
        loop {
            while let Ok(cmd) = env.commands.try_recv() {
                self.handle(cmd, env)?;
            }
            let fanout = &mut self.fanout;
            clock.tick(|now| fanout.processing_time(now))?;
            if env.cancel.load(Ordering::Relaxed) {
                return Err(Error::Cancelled);
            }
            if env.stop.load(Ordering::Relaxed) {
                self.deliver_queued_completions(env)?;
                return self.finish(false);
            }
            let now = Instant::now();
            let poll = {
                let mut out = SourceOutput {
                    batch: &mut self.buf,
                    capacity: self.settings.batch_size,
                    timestamp: self.settings.timestamp.as_ref(),
                    clocks: &mut self.clocks,
                    now,
                };
                self.reader.poll(&mut out)?
            };
            match poll {
                SourcePoll::Ready => {
                    if self.buf.is_empty() {
                        continue;
                    }
                    let first = *first_buffered.get_or_insert(now);
                    if self.buf.len() >= self.settings.batch_size
                        || now.duration_since(first) >= self.settings.linger
                    {
                        self.flush()?;
                        first_buffered = None;
                        self.emit_watermark(now)?;
                        self.maybe_latency_marker(now)?;
                        clock.touched();
                    }
                }
                SourcePoll::Pending(wait) => {
                    self.flush()?;
                    first_buffered = None;
                    self.emit_watermark(now)?;
                    self.maybe_latency_marker(now)?;
                    clock.touched();
                    let wait = clock.wait(wait.min(Duration::from_millis(50)));
                    match env.commands.recv_timeout(wait) {
                        Ok(cmd) => self.handle(cmd, env)?,
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => std::thread::sleep(wait),
                    }
                }
                SourcePoll::Finished if self.settings.checkpointing => {
                    return self.await_final_checkpoint(env)
                }
                SourcePoll::Finished => return self.finish(true),
            }
        }
    }
}

struct InputChannel {
    rx: Receiver<ChannelMessage>,
    watermark: Timestamp,
    idle: bool,
    ended: bool,
    blocked: bool,
}

/// The receiving side of a task: merges its input channels, tracks the minimum watermark
/// over active inputs and aligns checkpoint barriers.
pub(crate) struct InputGate {
    inputs: Vec<InputChannel>,
    watermark: Timestamp,
    idle: bool,
    aligning: Option<(CheckpointBarrier, usize)>,
    /// When the first barrier of the checkpoint being aligned arrived.
    aligning_since: Instant,
}

impl InputGate {
    pub(crate) fn new(receivers: Vec<Receiver<ChannelMessage>>) -> Self {
        let inputs = receivers
            .into_iter()
            .map(|rx| InputChannel {
                rx,
                watermark: MIN_WATERMARK,
                idle: false,
                ended: false,
                blocked: false,
            })
            .collect();
        InputGate {
            inputs,
            watermark: MIN_WATERMARK,
            idle: false,
            aligning: None,
            aligning_since: Instant::now(),
        }
    }

    /// Run `head` until every input ended (Ok) or the job is cancelled.
    pub(crate) fn run(mut self, head: &mut dyn ChainNode, env: &TaskEnv) -> Result<()> {
        head.open()?;
        if self.inputs.is_empty() {
            return head.end();
        }
        let mut clock = ProcessingClock::new();
        loop {
            if env.cancel.load(Ordering::Relaxed) {
                return Err(Error::Cancelled);
            }
            // Commands before data: a checkpoint's completion, sent before the next barrier
            // was even triggered, reaches the sinks before that barrier does (a sink may
            // hold back writes until its pre-committed epoch is committed).
            while let Ok(cmd) = env.commands.try_recv() {
                Self::on_command(cmd, head)?;
            }
            clock.tick(|now| head.processing_time(now))?;
            let mut sel = Select::new();
            let mut index = Vec::with_capacity(self.inputs.len());
            for (i, input) in self.inputs.iter().enumerate() {
                if !input.ended && !input.blocked {
                    sel.recv(&input.rx);
                    index.push(i);
                }
            }
            let control = sel.recv(&env.commands);
            let op = match sel.select_timeout(clock.wait(Duration::from_millis(200))) {
                Ok(op) => op,
                Err(_) => continue,
            };
            if op.index() == control {
                match op.recv(&env.commands) {
                    Ok(cmd) => Self::on_command(cmd, head)?,
                    Err(_) => return Err(Error::Cancelled),
                }
                continue;
            }
            let i = index[op.index()];
            let msg = match op.recv(&self.inputs[i].rx) {
                Ok(m) => m,
                Err(_) => {
                    // The upstream task went away without End: it failed or was cancelled.
                    return Err(Error::Cancelled);
                }
            };
            clock.touched();
            if self.on_message(i, msg, head, env)? {
                return Ok(());
            }
        }
    }

    fn on_command(cmd: TaskCommand, head: &mut dyn ChainNode) -> Result<()> {
        match cmd {
            TaskCommand::CheckpointComplete(id) => head.checkpoint_complete(id),
            TaskCommand::TriggerCheckpoint(_) => Ok(()),
            TaskCommand::ServeStateQueries => head.serve_state_queries(),
        }
    }

    /// Returns true when every input has ended.
    fn on_message(
        &mut self,
        i: usize,
        msg: StreamMessage<AnyBatch>,
        head: &mut dyn ChainNode,
        env: &TaskEnv,
    ) -> Result<bool> {
        match msg {
            StreamMessage::Data(batch) => head.process(batch)?,
            StreamMessage::LatencyMarker(marker) => head.latency_marker(marker)?,
            StreamMessage::Watermark(wm) => {
                let input = &mut self.inputs[i];
                input.idle = false;
                if wm > input.watermark {
                    input.watermark = wm;
                }
                self.update_watermark(head)?;
            }
            StreamMessage::Idle => {
                self.inputs[i].idle = true;
                self.update_watermark(head)?;
            }
            StreamMessage::Barrier(barrier) => {
                self.inputs[i].blocked = true;
                let seen = match self.aligning {
                    Some((b, n)) if b.id == barrier.id => n + 1,
                    _ => {
                        self.aligning_since = Instant::now();
                        1
                    }
                };
                self.aligning = Some((barrier, seen));
                self.maybe_complete_alignment(head, env)?;
            }
            StreamMessage::End => {
                self.inputs[i].ended = true;
                self.inputs[i].blocked = false;
                if self.inputs.iter().all(|c| c.ended) {
                    // The final checkpoint's completion was sent before the sources were
                    // told to end, so it is queued by now: deliver it before closing, or
                    // sinks would close with that epoch still uncommitted.
                    deliver_queued_completions(head, env)?;
                    head.end()?;
                    return Ok(true);
                }
                self.update_watermark(head)?;
                self.maybe_complete_alignment(head, env)?;
            }
        }
        Ok(false)
    }

    fn maybe_complete_alignment(&mut self, head: &mut dyn ChainNode, env: &TaskEnv) -> Result<()> {
        let Some((barrier, seen)) = self.aligning else {
            return Ok(());
        };
        let live = self.inputs.iter().filter(|c| !c.ended).count();
        let blocked = self.inputs.iter().filter(|c| c.blocked && !c.ended).count();
        if seen >= live && blocked >= live {
            let mut snapshots = Vec::new();
            head.barrier(barrier, &mut snapshots)?;
            env.ack(barrier.id, snapshots, self.aligning_since.elapsed());
            self.aligning = None;
            for c in &mut self.inputs {
                c.blocked = false;
            }
        }
        Ok(())
    }

    fn update_watermark(&mut self, head: &mut dyn ChainNode) -> Result<()> {
        let mut min = MAX_WATERMARK;
        let mut active = 0;
        let mut open = 0;
        for c in &self.inputs {
            if c.ended {
                continue;
            }
            open += 1;
            if c.idle {
                continue;
            }
            active += 1;
            min = min.min(c.watermark);
        }
        if open > 0 && active == 0 {
            if !self.idle {
                self.idle = true;
                head.idle()?;
            }
            return Ok(());
        }
        self.idle = false;
        if min > self.watermark {
            self.watermark = min;
            head.watermark(min)?;
        }
        Ok(())
    }
}

/// Delivers every `CheckpointComplete` already queued for this task (before it closes).
fn deliver_queued_completions(head: &mut dyn ChainNode, env: &TaskEnv) -> Result<()> {
    while let Ok(cmd) = env.commands.try_recv() {
        if let TaskCommand::CheckpointComplete(id) = cmd {
            head.checkpoint_complete(id)?;
        }
    }
    Ok(())
}

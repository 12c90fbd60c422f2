//! The control protocol between the job manager, task managers and executors: one TCP
//! connection each, carrying length-prefixed `bincode` frames (`u32` big-endian length,
//! then the message). The first frame names the peer ([`Hello`]); both sides send a
//! heartbeat every [`HEARTBEAT_INTERVAL`], so a silent peer is noticed by its timeout and a
//! dead one by the closed connection.

use super::transport::{Closer, Conn};
use crate::types::{CheckpointBarrier, CheckpointId};
use crossbeam_channel::{unbounded, Receiver};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use std::sync::Arc;
use std::time::Duration;

/// How often every peer sends a heartbeat.
pub(crate) const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(500);

/// The largest frame accepted (a checkpoint ack carries operator snapshots).
pub(crate) const MAX_FRAME: usize = 512 * 1024 * 1024;

/// The first frame on a connection to the job manager's control port.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Hello {
    /// A task manager offering `slots`.
    TaskManager {
        /// Its name (unique in the cluster).
        name: String,
        /// Slots it offers.
        slots: u32,
        /// Its host and process id, for display.
        location: String,
    },
    /// An executor started by a task manager for the job manager.
    Executor {
        /// The id the job manager gave it.
        executor_id: String,
    },
}

/// Job manager → task manager.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum ToTaskManager {
    /// Registration accepted.
    Welcome,
    /// Registration refused (for example: the name is taken).
    Refused { reason: String },
    /// Start the job binary `binary_sha256` as executor `executor_id`.
    StartExecutor {
        executor_id: String,
        binary_sha256: String,
        args: Vec<String>,
        env: Vec<(String, String)>,
    },
    /// Kill executor `executor_id`.
    StopExecutor { executor_id: String },
    /// Still alive.
    Heartbeat,
}

/// Task manager → job manager.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum FromTaskManager {
    /// Still alive.
    Heartbeat,
    /// The executor process ended (`status` as the OS reports it).
    ExecutorExited { executor_id: String, status: String },
    /// The executor could not be started (binary download or spawn failed).
    ExecutorFailedToStart { executor_id: String, error: String },
}

/// What an executor is to run: the job manager's decisions that override the job's config.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Deployment {
    /// Default parallelism of the job's operators (`None`: the job's own).
    pub(crate) parallelism: Option<u32>,
    /// The cluster's checkpoint storage URL.
    pub(crate) checkpoint_url: String,
    /// Restore from this checkpoint directory (relative to the job's checkpoint root).
    pub(crate) restore: Option<String>,
    /// The executor exits when the job manager is silent this long.
    pub(crate) heartbeat_timeout_ms: u64,
    /// This executor's index in `peers`.
    pub(crate) executor_index: u32,
    /// The attempt's id (`[0-9a-z]`), the same for every executor of the attempt: sinks
    /// tag in-progress output with it ([`crate::OperatorContext::attempt`]).
    #[serde(default)]
    pub(crate) attempt: String,
    /// Every executor of the attempt: its slots and data address. Subtask `i` of every
    /// task runs in slot `i`.
    pub(crate) peers: Vec<Peer>,
}

/// An executor of an attempt, as its peers see it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Peer {
    /// Its slots (= the subtask indices it runs).
    pub(crate) slots: Vec<u32>,
    /// Its data address (`host:port`) for the shuffle between processes.
    pub(crate) addr: String,
}

/// Job manager → executor.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum ToExecutor {
    /// Build and start the subtasks.
    Deploy(Deployment),
    /// The checkpoint triggered next is the final one (for crash points at `final`).
    FinalCheckpoint(CheckpointId),
    /// Inject checkpoint barrier at the sources.
    TriggerCheckpoint(CheckpointBarrier),
    /// Checkpoint complete: sinks commit.
    CheckpointComplete(CheckpointId),
    /// Sources end their streams (after the final checkpoint).
    Stop,
    /// Cancel everything and exit.
    Cancel,
    /// Still alive.
    Heartbeat,
    /// A state browser query for keyed operator subtask `subtask` of operator `operator`
    /// (a [`crate::state_query::StateRequest`] as JSON); answered by [`FromExecutor::StateAnswer`].
    StateQuery { id: u64, operator: u32, subtask: u32, request: String },
}

/// Executor → job manager.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum FromExecutor {
    /// Sent right after the hello: where peers send this executor data.
    DataPort { addr: String },
    /// The subtasks run; `keyed` are its keyed operator subtasks, whose state the job
    /// manager's state browser may query.
    Running { tasks: usize, sources: usize, keyed: Vec<KeyedSubtask> },
    /// A subtask acknowledged a checkpoint with its snapshots `(operator uid, snapshot as the
    /// JSON of the checkpoint metadata)`, or declined it (an upload failed).
    Ack {
        checkpoint: CheckpointId,
        subtask: u32,
        snapshots: Result<Vec<(String, Vec<u8>)>, String>,
        stats: WireAckStats,
    },
    /// Source subtasks at the end of their input, and tasks that have ended.
    Progress { sources_at_end: usize, tasks_finished: usize },
    /// Every subtask ended; `error` says why when they did not end well.
    Finished { error: Option<String>, retryable: bool },
    /// Still alive.
    Heartbeat,
    /// Counters of this executor's subtasks (every second), for the job manager's UI.
    Metrics { subtasks: Vec<SubtaskReport> },
    /// The answer to [`ToExecutor::StateQuery`] `id`: a [`crate::state_query::StateReply`] as
    /// JSON, or `None` when the subtask is gone (the job manager's API then says the job is
    /// not running).
    StateAnswer { id: u64, reply: Option<String> },
}

/// A keyed operator subtask an executor runs, and the key groups it owns.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct KeyedSubtask {
    pub(crate) operator: u32,
    pub(crate) subtask: u32,
    pub(crate) key_groups: (u16, u16),
}

/// What a subtask's snapshot cost (`runtime::task::AckStats` on the wire).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub(crate) struct WireAckStats {
    pub(crate) alignment_us: u64,
    pub(crate) sync_us: u64,
    pub(crate) upload_us: u64,
    pub(crate) uploaded_bytes: u64,
    pub(crate) state_bytes: u64,
}

impl WireAckStats {
    pub(crate) fn of(s: &crate::runtime::task::AckStats) -> Self {
        WireAckStats {
            alignment_us: s.alignment.as_micros() as u64,
            sync_us: s.sync.as_micros() as u64,
            upload_us: s.upload.as_micros() as u64,
            uploaded_bytes: s.uploaded_bytes,
            state_bytes: s.state_bytes,
        }
    }

    pub(crate) fn stats(&self) -> crate::runtime::task::AckStats {
        crate::runtime::task::AckStats {
            alignment: Duration::from_micros(self.alignment_us),
            sync: Duration::from_micros(self.sync_us),
            upload: Duration::from_micros(self.upload_us),
            uploaded_bytes: self.uploaded_bytes,
            state_bytes: self.state_bytes,
        }
    }
}

/// The counters of one subtask of one operator, as an executor reports them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SubtaskReport {
    pub(crate) operator: u32,
    pub(crate) subtask: u32,
    pub(crate) counters: crate::metrics::SubtaskSnapshot,
}

/// Writes one frame.
pub(crate) fn write_frame<T: Serialize>(w: &mut impl Write, msg: &T) -> io::Result<()> {
    write_frame_unflushed(w, msg)?;
    w.flush()
}

/// Writes one frame into `w` without flushing it (batching writes into a `BufWriter`).
pub(crate) fn write_frame_unflushed<T: Serialize>(w: &mut impl Write, msg: &T) -> io::Result<()> {
    let body = bincode::serde::encode_to_vec(msg, bincode::config::standard())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    let len = u32::try_from(body.len())
        .ok()
        .filter(|l| (*l as usize) <= MAX_FRAME)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "frame larger than MAX_FRAME"))?;
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&len.to_be_bytes());
    buf.extend_from_slice(&body);
    w.write_all(&buf)
}

/// Reads one frame; `UnexpectedEof` when the peer closed the connection.
pub(crate) fn read_frame<T: DeserializeOwned>(r: &mut impl Read) -> io::Result<T> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds MAX_FRAME"),
        ));
    }
    // Grown as bytes arrive, not allocated from the length: a peer claiming a large frame
    // costs memory only for what it really sends.
    let mut body = Vec::with_capacity(len.min(64 * 1024));
    r.take(len as u64).read_to_end(&mut body)?;
    if body.len() < len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("frame cut off after {} of {len} bytes", body.len()),
        ));
    }
    crate::runtime::codec::decode_bounded(&body)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("undecodable frame: {e}")))
}

/// The sending half of a connection, shareable between threads.
#[derive(Clone)]
pub(crate) struct Sender {
    writer: Arc<Mutex<Box<dyn Write + Send>>>,
    closer: Closer,
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sender({:?})", self.closer)
    }
}

impl Sender {
    /// Sends one message; an error means the connection is gone.
    pub(crate) fn send<T: Serialize>(&self, msg: &T) -> io::Result<()> {
        write_frame(&mut *self.writer.lock(), msg)
    }

    /// Closes both directions: the peer's reads end, and so do ours.
    pub(crate) fn close(&self) {
        self.closer.close();
    }
}

/// A connection after its hello: messages arrive on `incoming` (read by a thread); the
/// last item is `Err(reason)` when the connection ends.
#[derive(Debug)]
pub(crate) struct Link<In> {
    pub(crate) sender: Sender,
    pub(crate) incoming: Receiver<Result<In, String>>,
    pub(crate) peer: String,
}

impl<In: DeserializeOwned + Send + 'static> Link<In> {
    /// Starts the reader thread of `conn` (authenticated: [`super::transport`]).
    pub(crate) fn start(conn: Conn, name: &str) -> io::Result<Self> {
        let Conn { mut reader, writer, closer, .. } = conn;
        let socket = closer.socket();
        let _ = socket.set_nodelay(true);
        // A peer that stops reading must not block our writers forever.
        let _ = socket.set_write_timeout(Some(Duration::from_secs(10)));
        let peer = closer.peer();
        let (tx, incoming) = unbounded();
        std::thread::Builder::new().name(format!("caudal-read-{name}")).spawn(move || loop {
            match read_frame::<In>(&mut reader) {
                Ok(m) => {
                    if tx.send(Ok(m)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let reason = if e.kind() == io::ErrorKind::UnexpectedEof {
                        "connection closed".to_string()
                    } else {
                        e.to_string()
                    };
                    let _ = tx.send(Err(reason));
                    return;
                }
            }
        })?;
        Ok(Link { sender: Sender { writer: Arc::new(Mutex::new(writer)), closer }, incoming, peer })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an executor's subtask counts is what the job manager shows: every field of the
    /// snapshot crosses the wire (one type on both sides, nothing copied field by field).
    #[test]
    fn a_subtasks_counters_reach_the_job_manager_whole() {
        use crate::metrics::SubtaskMetrics;
        let executor = SubtaskMetrics::default();
        executor.add_in(5);
        executor.add_out(4);
        executor.add_bytes_in(300);
        executor.watermark.store(1_000, std::sync::atomic::Ordering::Relaxed);
        executor.counter("late").store(2, std::sync::atomic::Ordering::Relaxed);
        executor.gauge("kafka.t.0.lag").store(17, std::sync::atomic::Ordering::Relaxed);
        executor.record_latency_us(1_500);
        executor.set_info("kafka.producer.linger.ms", "5");
        let sent = SubtaskReport { operator: 3, subtask: 1, counters: executor.snapshot() };
        let mut buf = Vec::new();
        write_frame(&mut buf, &FromExecutor::Metrics { subtasks: vec![sent] }).unwrap();
        let FromExecutor::Metrics { subtasks } = read_frame::<FromExecutor>(&mut &buf[..]).unwrap() else {
            panic!("not a metrics frame")
        };
        let job_manager = SubtaskMetrics::default();
        job_manager.mirror_snapshot(&subtasks[0].counters);
        assert_eq!(
            format!("{:?}", job_manager.snapshot()),
            format!("{:?}", executor.snapshot()),
            "the job manager's mirror differs from the executor's subtask"
        );
    }

    #[test]
    fn frames_round_trip_and_a_closed_stream_is_eof() {
        let mut buf = Vec::new();
        let msg = FromExecutor::Ack {
            checkpoint: CheckpointId(7),
            subtask: 2,
            snapshots: Ok(vec![("0-src".into(), vec![1, 2, 3]), ("1-map".into(), Vec::new())]),
            stats: WireAckStats::default(),
        };
        write_frame(&mut buf, &msg).unwrap();
        write_frame(&mut buf, &FromExecutor::Heartbeat).unwrap();
        let mut r = &buf[..];
        match read_frame::<FromExecutor>(&mut r).unwrap() {
            FromExecutor::Ack { checkpoint, subtask, snapshots, .. } => {
                assert_eq!((checkpoint, subtask, snapshots.unwrap().len()), (CheckpointId(7), 2, 2));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(read_frame::<FromExecutor>(&mut r).unwrap(), FromExecutor::Heartbeat));
        let err = read_frame::<FromExecutor>(&mut r).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    fn encoded<T: Serialize>(msg: &T) -> Vec<u8> {
        let mut buf = Vec::new();
        write_frame(&mut buf, msg).unwrap();
        buf
    }

    proptest::proptest! {
        /// Random bytes, and every cut of valid frames, are errors — never a panic, and never
        /// an allocation beyond what arrived.
        #[test]
        fn any_bytes_are_a_frame_or_an_error(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let _ = read_frame::<FromExecutor>(&mut &bytes[..]);
            let _ = read_frame::<ToExecutor>(&mut &bytes[..]);
            let _ = read_frame::<Hello>(&mut &bytes[..]);
            let _ = read_frame::<FromTaskManager>(&mut &bytes[..]);
            let _ = read_frame::<ToTaskManager>(&mut &bytes[..]);
        }

        /// A frame whose length matches its random body gets past the length check to the
        /// decoders (#43: random bytes almost never did): a message or an error, no panic.
        #[test]
        fn a_well_framed_random_body_is_a_message_or_an_error(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let mut frame = (body.len() as u32).to_be_bytes().to_vec();
            frame.extend_from_slice(&body);
            let _ = read_frame::<FromExecutor>(&mut &frame[..]);
            let _ = read_frame::<ToExecutor>(&mut &frame[..]);
            let _ = read_frame::<Hello>(&mut &frame[..]);
            let _ = read_frame::<FromTaskManager>(&mut &frame[..]);
            let _ = read_frame::<ToTaskManager>(&mut &frame[..]);
        }

        /// Valid messages with some bytes changed: input the decoders take far into a
        /// message before it goes wrong.
        #[test]
        fn a_valid_frame_with_bytes_changed_is_a_message_or_an_error(
            changes in proptest::collection::vec((proptest::prelude::any::<usize>(), 1u8..), 1..8)
        ) {
            let hello = Hello::TaskManager { name: "tm-1".into(), slots: 4, location: "host:1".into() };
            let finished = FromExecutor::Finished { error: Some("sink `out`: refused".into()), retryable: false };
            for mut frame in [encoded(&hello), encoded(&finished)] {
                let body = frame.len() - 4;
                for (at, flip) in &changes {
                    frame[4 + at % body] ^= flip;
                }
                let _ = read_frame::<Hello>(&mut &frame[..]);
                let _ = read_frame::<FromExecutor>(&mut &frame[..]);
                let _ = read_frame::<ToExecutor>(&mut &frame[..]);
            }
        }

        #[test]
        fn a_cut_frame_is_an_error(cut in 0usize..64) {
            let mut buf = Vec::new();
            let msg = Hello::TaskManager { name: "tm-1".into(), slots: 4, location: "host:1".into() };
            write_frame(&mut buf, &msg).unwrap();
            let cut = cut.min(buf.len() - 1);
            proptest::prop_assert!(read_frame::<Hello>(&mut &buf[..cut]).is_err());
        }

        /// A length prefix up to the limit with a short body: an error after reading what
        /// came, the claimed size is never allocated up front.
        #[test]
        fn a_large_claimed_length_with_a_short_body_is_an_error(len in 1u32..(MAX_FRAME as u32), body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let mut frame = len.to_be_bytes().to_vec();
            frame.extend_from_slice(&body);
            if (len as usize) > body.len() {
                proptest::prop_assert!(read_frame::<FromExecutor>(&mut &frame[..]).is_err());
            }
        }
    }

    #[test]
    fn an_oversized_length_is_refused_before_allocating() {
        let mut r = &u32::MAX.to_be_bytes()[..];
        let err = read_frame::<FromExecutor>(&mut r).unwrap_err();
        assert!(err.to_string().contains("MAX_FRAME"), "{err}");
    }
}

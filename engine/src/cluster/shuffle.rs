//! The data plane between executors: channels whose two ends run in different processes
//! travel over TCP, with credit-based flow control so backpressure crosses processes.
//!
//! * One connection per (sending executor, receiving executor), multiplexing every
//!   channel between them; frames are length-prefixed `bincode` ([`Wire`]), batches encoded
//!   by their edge's codec, watermarks, idleness, barriers and end-of-stream in band, in
//!   channel order.
//! * Credits: the receiving end of a channel is the same bounded in-process channel as
//!   within a process (capacity C batches). The sender starts with C credits per channel
//!   and spends one per message; the receiver grants credits back as the consuming task
//!   frees space. So a message always fits when it arrives, the connection is never
//!   blocked by one full channel (no head-of-line blocking, which would deadlock barrier
//!   alignment), and a slow consumer stops its producer in another process.
//! * A connection that breaks before every channel on it ended fails the executor (the job
//!   manager then restarts the job from its latest checkpoint).
//! * Every connection proves the cluster's trust first (TLS, secret: [`super::transport`]);
//!   a peer that cannot is refused and logged, and the job goes on.

use super::protocol::{read_frame, write_frame, write_frame_unflushed, Peer};
use super::transport::{ClusterTrust, Conn};
use crate::metrics::SubtaskMetrics;
use crate::runtime::codec::BatchCodec;
use crate::runtime::exchange::ChannelMessage;
use crate::runtime::executor::JobControl;
pub(crate) use crate::runtime::remote::{ChannelKey, Outbound, RemoteChannels};
use crate::types::{CheckpointBarrier, LatencyMarker, StreamMessage, Timestamp};
use crate::{Error, Result};
use crossbeam_channel::{unbounded, Select, Sender, TrySendError};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::io::{BufReader, BufWriter};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A frame on a data connection.
#[derive(Debug, Serialize, Deserialize)]
enum Wire {
    /// First frame: the sending executor's index.
    Hello {
        from: u32,
    },
    Data {
        key: ChannelKey,
        batch: Vec<u8>,
    },
    Watermark {
        key: ChannelKey,
        ts: Timestamp,
    },
    Idle {
        key: ChannelKey,
    },
    Barrier {
        key: ChannelKey,
        barrier: CheckpointBarrier,
    },
    End {
        key: ChannelKey,
    },
    /// Receiver → sender: `n` more messages may be sent on `key`.
    Credit {
        key: ChannelKey,
        n: u32,
    },
    Latency {
        key: ChannelKey,
        marker: LatencyMarker,
    },
}

fn fail(control: &JobControl, message: String) {
    if !control.cancel.load(Ordering::SeqCst) && !control.stop.load(Ordering::SeqCst) {
        control.fail(Error::Cluster(message));
    }
}

/// Starts the bridges of `channels`: a sender thread per peer this process sends to, and
/// the acceptor of the peers that send here. `capacity` is every channel's capacity in
/// messages (the initial credit). Returns the sender threads: they end once every channel
/// they carry has sent its end of stream (join them before the process exits).
pub(crate) fn start(
    listener: TcpListener,
    channels: RemoteChannels,
    me: u32,
    peers: &[Peer],
    capacity: usize,
    control: &JobControl,
    trust: ClusterTrust,
) -> Result<Vec<std::thread::JoinHandle<()>>> {
    let RemoteChannels { outbound, inbound, .. } = channels;
    let mut senders = Vec::new();
    let mut by_peer: HashMap<usize, Vec<Outbound>> = HashMap::new();
    for (key, rx, codec, metrics) in outbound {
        let peer = peers.iter().position(|p| p.slots.contains(&key.to)).ok_or_else(|| {
            Error::Cluster(format!("internal: no executor runs subtask {} of node {}", key.to, key.node))
        })?;
        by_peer.entry(peer).or_default().push((key, rx, codec, metrics));
    }
    for (peer, chans) in by_peer {
        let addr = peers[peer].addr.clone();
        let (control, trust) = (control.clone(), trust.clone());
        let sender = std::thread::Builder::new()
            .name(format!("caudal-send-{peer}"))
            .spawn(move || {
                if let Err(e) = send_loop(&addr, me, chans, capacity as i64, &control, &trust) {
                    fail(&control, format!("data connection to the executor at {addr}: {e}"));
                }
            })
            .map_err(|e| Error::io("spawning a data sender", e))?;
        senders.push(sender);
    }
    let inbound: Arc<HashMap<ChannelKey, Inbound>> = Arc::new(
        inbound
            .into_iter()
            .map(|(key, tx, codec, metrics)| {
                (
                    key,
                    Inbound {
                        tx,
                        codec,
                        metrics,
                        outstanding: AtomicI64::new(capacity as i64),
                        ended: AtomicBool::new(false),
                    },
                )
            })
            .collect(),
    );
    if !inbound.is_empty() {
        let control = control.clone();
        std::thread::Builder::new()
            .name("caudal-data-accept".into())
            .spawn(move || {
                for stream in listener.incoming().flatten() {
                    let (inbound, control, trust) = (inbound.clone(), control.clone(), trust.clone());
                    let _ = std::thread::Builder::new().name("caudal-recv".into()).spawn(move || {
                        // A peer without the cluster's trust is refused and logged; the job goes on.
                        let conn = match trust.accept(stream) {
                            Ok(conn) => conn,
                            Err(e) => {
                                tracing::warn!("caudal executor: data connection refused: {e}");
                                return;
                            }
                        };
                        if let Err(e) = receive_loop(conn, &inbound, capacity as i64, &control) {
                            fail(&control, format!("data connection: {e}"));
                        }
                    });
                }
            })
            .map_err(|e| Error::io("spawning the data acceptor", e))?;
    }
    Ok(senders)
}

fn connect(addr: &str, control: &JobControl) -> Result<TcpStream> {
    let started = Instant::now();
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => return Ok(s),
            Err(e)
                if started.elapsed() > Duration::from_secs(10) || control.cancel.load(Ordering::SeqCst) =>
            {
                return Err(Error::io(format!("connecting to {addr}"), e))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn send_loop(
    addr: &str,
    me: u32,
    chans: Vec<Outbound>,
    capacity: i64,
    control: &JobControl,
    trust: &ClusterTrust,
) -> Result<()> {
    let stream = connect(addr, control)?;
    let _ = stream.set_nodelay(true);
    let Conn { reader, writer, closer, .. } =
        trust.connect(stream).map_err(|e| Error::io("authenticating a data connection", e))?;
    let mut reader = BufReader::new(reader);
    let mut writer = BufWriter::with_capacity(64 * 1024, writer);
    write_frame(&mut writer, &Wire::Hello { from: me }).map_err(|e| Error::io("greeting", e))?;
    let (credit_tx, credit_rx) = unbounded::<(ChannelKey, u32)>();
    std::thread::Builder::new()
        .name("caudal-credits-in".into())
        .spawn(move || {
            while let Ok(Wire::Credit { key, n }) = read_frame::<Wire>(&mut reader) {
                if credit_tx.send((key, n)).is_err() {
                    return;
                }
            }
        })
        .map_err(|e| Error::io("spawning a credit reader", e))?;
    let index: HashMap<ChannelKey, usize> = chans.iter().enumerate().map(|(i, (k, ..))| (*k, i)).collect();
    let mut credits = vec![capacity; chans.len()];
    let mut ended = vec![false; chans.len()];
    while ended.iter().any(|e| !e) {
        if control.cancel.load(Ordering::Relaxed) {
            return Ok(());
        }
        let mut sel = Select::new();
        let mut ids = Vec::new();
        for (c, (_, rx, ..)) in chans.iter().enumerate() {
            if !ended[c] && credits[c] > 0 {
                sel.recv(rx);
                ids.push(c);
            }
        }
        let credit_op = sel.recv(&credit_rx);
        // Frames are buffered while messages keep coming, flushed when none is ready.
        let op = match sel.try_select() {
            Ok(op) => op,
            Err(_) => {
                writer.flush().map_err(|e| Error::io("sending", e))?;
                let Ok(op) = sel.select_timeout(Duration::from_millis(100)) else { continue };
                op
            }
        };
        if op.index() == credit_op {
            match op.recv(&credit_rx) {
                Ok((key, n)) => {
                    if let Some(&c) = index.get(&key) {
                        credits[c] += i64::from(n);
                    }
                }
                Err(_) => return Err(Error::Cluster("the receiving executor closed the connection".into())),
            }
            continue;
        }
        let c = ids[op.index()];
        let (key, rx, codec, metrics) = &chans[c];
        let msg = match op.recv(rx) {
            Ok(m) => m,
            Err(_) => {
                ended[c] = true; // the upstream task ended without End: it failed or was cancelled
                continue;
            }
        };
        credits[c] -= 1;
        let frame = match msg {
            StreamMessage::Data(batch) => {
                let batch = (codec.encode)(batch)?;
                metrics.add_bytes_out(batch.len());
                Wire::Data { key: *key, batch }
            }
            StreamMessage::Watermark(ts) => Wire::Watermark { key: *key, ts },
            StreamMessage::Idle => Wire::Idle { key: *key },
            StreamMessage::Barrier(barrier) => Wire::Barrier { key: *key, barrier },
            StreamMessage::LatencyMarker(marker) => Wire::Latency { key: *key, marker },
            StreamMessage::End => {
                ended[c] = true;
                Wire::End { key: *key }
            }
        };
        write_frame_unflushed(&mut writer, &frame).map_err(|e| Error::io("sending", e))?;
    }
    writer.flush().map_err(|e| Error::io("sending", e))?;
    // Every channel ended: tell the receiver (its reads end, then it drops the connection).
    closer.shutdown_write();
    Ok(())
}

struct Inbound {
    tx: Sender<ChannelMessage>,
    codec: BatchCodec,
    /// The consuming operator subtask's counters.
    metrics: Arc<SubtaskMetrics>,
    /// Credits granted and not yet used by the sender.
    outstanding: AtomicI64,
    ended: AtomicBool,
}

fn receive_loop(
    conn: Conn,
    inbound: &Arc<HashMap<ChannelKey, Inbound>>,
    capacity: i64,
    control: &JobControl,
) -> Result<()> {
    let _ = conn.socket().set_nodelay(true);
    let Conn { reader, writer, .. } = conn;
    let writer = Arc::new(Mutex::new(BufWriter::new(writer)));
    let mut reader = BufReader::with_capacity(64 * 1024, reader);
    let from = match read_frame::<Wire>(&mut reader) {
        Ok(Wire::Hello { from }) => from,
        Ok(other) => return Err(Error::Cluster(format!("expected a hello, got {other:?}"))),
        Err(e) => return Err(Error::io("reading a data hello", e)),
    };
    let active: Arc<Mutex<BTreeSet<ChannelKey>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    {
        let (inbound, active, done, writer) = (inbound.clone(), active.clone(), done.clone(), writer.clone());
        std::thread::Builder::new()
            .name("caudal-credits-out".into())
            .spawn(move || grant_credits(&inbound, &active, &done, &writer, capacity))
            .map_err(|e| Error::io("spawning a credit granter", e))?;
    }
    let result = (|| -> Result<()> {
        loop {
            let frame = match read_frame::<Wire>(&mut reader) {
                Ok(f) => f,
                Err(e) => {
                    let open =
                        active.lock().iter().filter(|k| !inbound[*k].ended.load(Ordering::SeqCst)).count();
                    if open > 0 {
                        return Err(Error::Cluster(format!(
                            "executor {from} went away with {open} channels still open ({e})"
                        )));
                    }
                    return Ok(());
                }
            };
            let (key, msg) = match frame {
                Wire::Data { key, batch } => {
                    let ch = channel(inbound, key)?;
                    ch.metrics.add_bytes_in(batch.len());
                    (key, StreamMessage::Data((ch.codec.decode)(&batch)?))
                }
                Wire::Watermark { key, ts } => (key, StreamMessage::Watermark(ts)),
                Wire::Idle { key } => (key, StreamMessage::Idle),
                Wire::Barrier { key, barrier } => (key, StreamMessage::Barrier(barrier)),
                Wire::End { key } => (key, StreamMessage::End),
                Wire::Latency { key, marker } => (key, StreamMessage::LatencyMarker(marker)),
                Wire::Hello { .. } | Wire::Credit { .. } => continue,
            };
            let ch = channel(inbound, key)?;
            active.lock().insert(key);
            if matches!(msg, StreamMessage::End) {
                ch.ended.store(true, Ordering::SeqCst);
            }
            // Credits guarantee room; a blocking send is only the fallback.
            match ch.tx.try_send(msg) {
                Ok(()) | Err(TrySendError::Disconnected(_)) => {}
                Err(TrySendError::Full(m)) => {
                    let _ = ch.tx.send(m);
                }
            }
            // After the push: a grant computed in between under-counts, never over-grants.
            ch.outstanding.fetch_sub(1, Ordering::SeqCst);
        }
    })();
    done.store(true, Ordering::SeqCst);
    let _ = control;
    result
}

fn channel(inbound: &HashMap<ChannelKey, Inbound>, key: ChannelKey) -> Result<&Inbound> {
    inbound
        .get(&key)
        .ok_or_else(|| Error::Cluster(format!("a peer sent on channel {key:?}, which is not ours")))
}

/// Every millisecond: give back the room the consuming tasks freed.
fn grant_credits(
    inbound: &HashMap<ChannelKey, Inbound>,
    active: &Mutex<BTreeSet<ChannelKey>>,
    done: &AtomicBool,
    writer: &Mutex<BufWriter<Box<dyn Write + Send>>>,
    capacity: i64,
) {
    while !done.load(Ordering::SeqCst) {
        let keys: Vec<ChannelKey> = active.lock().iter().copied().collect();
        let mut w = writer.lock();
        for key in keys {
            let ch = &inbound[&key];
            if ch.ended.load(Ordering::SeqCst) {
                continue;
            }
            let grant = capacity - ch.tx.len() as i64 - ch.outstanding.load(Ordering::SeqCst);
            if grant > 0 {
                ch.outstanding.fetch_add(grant, Ordering::SeqCst);
                if write_frame(&mut *w, &Wire::Credit { key, n: grant as u32 }).is_err() {
                    return;
                }
            }
        }
        drop(w);
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Batch, Record};
    use crossbeam_channel::bounded;

    fn batch(v: u64) -> ChannelMessage {
        StreamMessage::Data(Box::new(vec![Record::new(0, v)]))
    }

    /// Two executors in one process over loopback: executor 0 runs subtask 0 (producer),
    /// executor 1 runs subtask 1 (consumer) of one channel.
    #[test]
    fn a_slow_consumer_stops_the_producer_across_the_connection_and_nothing_is_lost() {
        let capacity = 4;
        let key = ChannelKey::new(1, 0, 0, 1);
        let codec = BatchCodec::of::<u64>();
        let (up_tx, up_rx) = bounded::<ChannelMessage>(capacity); // the producer's process
        let (down_tx, down_rx) = bounded::<ChannelMessage>(capacity); // the consumer's process
        let (upstream, downstream) =
            (Arc::new(SubtaskMetrics::default()), Arc::new(SubtaskMetrics::default()));
        let mut producer_side = RemoteChannels::new([0]);
        producer_side.register(key, (&up_tx, &up_rx), codec, &upstream, &downstream);
        let mut consumer_side = RemoteChannels::new([1]);
        consumer_side.register(key, (&down_tx, &down_rx), codec, &upstream, &downstream);
        drop((up_rx, down_tx));
        let (l0, l1) = (TcpListener::bind("127.0.0.1:0").unwrap(), TcpListener::bind("127.0.0.1:0").unwrap());
        let peers = vec![
            Peer { slots: vec![0], addr: l0.local_addr().unwrap().to_string() },
            Peer { slots: vec![1], addr: l1.local_addr().unwrap().to_string() },
        ];
        let control = JobControl::default();
        // The data connection runs over mutual TLS, and both executors prove the cluster secret in it.
        let certs = tempfile::tempdir().unwrap();
        let ids = super::super::certs::generate(certs.path(), &["exec-0", "exec-1"], &[]).unwrap();
        let trust = |i: usize| ClusterTrust {
            secret: Some(super::super::auth::ClusterSecret::from_bytes(b"a shuffle test's secret")),
            tls: Some(super::super::tls::ClusterTls::from_files(ids[i].clone()).unwrap()),
        };
        let senders = start(l0, producer_side, 0, &peers, capacity, &control, trust(0)).unwrap();
        assert!(start(l1, consumer_side, 1, &peers, capacity, &control, trust(1)).unwrap().is_empty());
        // The consumer reads nothing: the producer fills its channel, the consumer's channel
        // and nothing more — backpressure across the connection.
        let mut sent = 0u64;
        let quiet_since = Instant::now();
        while quiet_since.elapsed() < Duration::from_millis(500) {
            match up_tx.try_send(batch(sent)) {
                Ok(()) => sent += 1,
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
        assert!(
            sent as usize <= 2 * capacity + 1,
            "{sent} messages left the producer for {capacity} + {capacity} slots"
        );
        assert_eq!(down_rx.len(), capacity, "the consumer's channel is full");
        // Now the consumer reads: everything arrives, in order, then the end.
        let consumer = std::thread::spawn(move || {
            let mut got = Vec::new();
            loop {
                match down_rx.recv_timeout(Duration::from_secs(10)).unwrap() {
                    StreamMessage::Data(b) => {
                        got.extend(b.downcast::<Batch<u64>>().unwrap().iter().map(|r| r.value))
                    }
                    StreamMessage::End => return got,
                    _ => {}
                }
            }
        });
        for v in sent..100 {
            up_tx.send(batch(v)).unwrap();
        }
        up_tx.send(StreamMessage::End).unwrap();
        assert_eq!(consumer.join().unwrap(), (0..100).collect::<Vec<u64>>());
        for s in senders {
            s.join().unwrap();
        }
        // Bytes are counted on both sides: the encoded batches, as many sent as received.
        let sent_bytes = upstream.bytes_out.load(Ordering::Relaxed);
        let one_batch = (codec.encode)(Box::new(vec![Record::new(0, 7u64)])).unwrap().len() as u64;
        assert!(sent_bytes >= 100 * one_batch, "{sent_bytes} bytes for 100 batches of {one_batch}");
        assert_eq!(downstream.bytes_in.load(Ordering::Relaxed), sent_bytes);
        assert_eq!(
            (upstream.bytes_in.load(Ordering::Relaxed), downstream.bytes_out.load(Ordering::Relaxed)),
            (0, 0)
        );
        assert!(control.failure.lock().is_none());
    }
}

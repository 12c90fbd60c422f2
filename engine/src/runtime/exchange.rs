//! Channels between tasks: the sending side (partitioning) and the receiving side (input gate).

use super::chain::{AnyBatch, ChainNode, SnapshotSink};
use crate::keygroup::{key_group_of, subtask_for_key_group};
use crate::metrics::SubtaskMetrics;
use crate::types::{Batch, CheckpointBarrier, CheckpointId, Data, LatencyMarker, StreamMessage, Timestamp};
use crate::{Error, Result};
use crossbeam_channel::{Sender, TrySendError};
use std::hash::Hash;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A message on an in-process channel.
pub(crate) type ChannelMessage = StreamMessage<AnyBatch>;

/// Routes a record to one of `n` channels.
pub(crate) type KeyRouter<T> = Arc<dyn Fn(&T, u32, u32) -> u32 + Send + Sync>;

/// A router for `key_by`: key → key group → owning subtask.
pub(crate) fn key_router<T, K: Hash>(key: impl Fn(&T) -> K + Send + Sync + 'static) -> KeyRouter<T> {
    Arc::new(move |value: &T, max_parallelism: u32, parallelism: u32| {
        subtask_for_key_group(key_group_of(&key(value), max_parallelism), max_parallelism, parallelism)
    })
}

/// How a non-chained edge distributes records over the consumer's subtasks.
pub(crate) enum Partitioner<T> {
    /// One channel, to the subtask with the same index.
    Forward,
    /// Batches round-robin over all channels.
    Rebalance { next: usize },
    /// By key group.
    Hash { router: KeyRouter<T>, max_parallelism: u32 },
    /// Every batch to every channel.
    Broadcast,
}

/// The sending end of an edge, as the last node of a chain.
pub(crate) struct ExchangeOutput<T> {
    partitioner: Partitioner<T>,
    senders: Vec<Sender<ChannelMessage>>,
    /// Per channel: how a send waits while it is full.
    rooms: Vec<RoomWait>,
    buffers: Vec<Batch<T>>,
    batch_size: usize,
    metrics: Arc<SubtaskMetrics>,
}

/// How a sender waits for room in a full channel: it sleeps, and sends again, for about as
/// long as its consumer takes to empty half the channel (learnt from what each pause freed).
///
/// A blocking send would be woken by the consumer as soon as one message is taken, and then
/// find the channel full again after one message: a wake-up (a futex syscall and an
/// interrupt to the other core, on the consumer's thread) per batch, which was a tenth of a
/// keyed subtask's time behind a faster source. Waiting for half the channel costs the
/// consumer nothing, and the sender one sleep per half channel. The consumer never starves:
/// half the channel is still queued when the sender sends again, unless it suddenly runs
/// faster than twice the rate learnt, and then for one pause at most.
pub(crate) struct RoomWait {
    pause: Duration,
}

impl RoomWait {
    const FIRST: Duration = Duration::from_micros(50);
    const LONGEST: Duration = Duration::from_millis(2);
    const SHORTEST: Duration = Duration::from_micros(10);

    pub(crate) fn new() -> Self {
        RoomWait { pause: Self::FIRST }
    }

    /// Sends `msg` on `sender`, which was full a moment ago; `Err(Cancelled)` when its
    /// receiver went away.
    pub(crate) fn send(&mut self, sender: &Sender<ChannelMessage>, mut msg: ChannelMessage) -> Result<()> {
        let capacity = sender.capacity().unwrap_or(1).max(1);
        loop {
            std::thread::sleep(self.pause);
            let free = capacity.saturating_sub(sender.len());
            if free * 4 < capacity {
                self.pause = (self.pause * 2).min(Self::LONGEST);
            } else if free * 4 > capacity * 3 {
                self.pause = (self.pause / 2).max(Self::SHORTEST);
            }
            match sender.try_send(msg) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Full(back)) => msg = back,
                Err(TrySendError::Disconnected(_)) => return Err(Error::Cancelled),
            }
        }
    }

    /// The pause it has learnt.
    #[cfg(test)]
    pub(crate) fn pause(&self) -> Duration {
        self.pause
    }
}

impl<T: Data> ExchangeOutput<T> {
    pub(crate) fn new(
        partitioner: Partitioner<T>,
        senders: Vec<Sender<ChannelMessage>>,
        batch_size: usize,
        metrics: Arc<SubtaskMetrics>,
    ) -> Self {
        let buffers = (0..senders.len()).map(|_| Vec::new()).collect();
        let rooms = (0..senders.len()).map(|_| RoomWait::new()).collect();
        ExchangeOutput { partitioner, senders, rooms, buffers, batch_size, metrics }
    }

    fn send(&mut self, target: usize, msg: ChannelMessage) -> Result<()> {
        let sender = &self.senders[target];
        match sender.try_send(msg) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(msg)) => {
                let start = Instant::now();
                let r = self.rooms[target].send(sender, msg);
                self.metrics.backpressured_ns.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
                r
            }
            Err(TrySendError::Disconnected(_)) => Err(Error::Cancelled),
        }
    }

    fn send_batch(&mut self, target: usize, mut batch: Batch<T>) -> Result<()> {
        while batch.len() > self.batch_size {
            let rest = batch.split_off(self.batch_size);
            self.send(target, StreamMessage::Data(Box::new(batch)))?;
            batch = rest;
        }
        if !batch.is_empty() {
            self.send(target, StreamMessage::Data(Box::new(batch)))?;
        }
        Ok(())
    }

    fn broadcast(&mut self, msg: impl Fn() -> ChannelMessage) -> Result<()> {
        for target in 0..self.senders.len() {
            self.send(target, msg())?;
        }
        Ok(())
    }
}

impl<T: Data> ChainNode for ExchangeOutput<T> {
    fn open(&mut self) -> Result<()> {
        Ok(())
    }

    fn process(&mut self, batch: AnyBatch) -> Result<()> {
        let batch = batch.downcast::<Batch<T>>().map(|b| *b).map_err(|_| {
            Error::Internal(format!(
                "internal: exchange got a batch that is not {}",
                std::any::type_name::<T>()
            ))
        })?;
        let n = self.senders.len();
        match &mut self.partitioner {
            Partitioner::Forward => self.send_batch(0, batch),
            Partitioner::Broadcast => {
                for target in 1..n {
                    self.send_batch(target, batch.clone())?;
                }
                self.send_batch(0, batch)
            }
            Partitioner::Rebalance { next } => {
                let target = *next % n;
                *next = next.wrapping_add(1);
                self.send_batch(target, batch)
            }
            Partitioner::Hash { router, max_parallelism } => {
                if n == 1 {
                    return self.send_batch(0, batch);
                }
                let (router, mp) = (router.clone(), *max_parallelism);
                for record in batch {
                    let target = router(&record.value, mp, n as u32) as usize;
                    self.buffers[target].push(record);
                }
                for target in 0..n {
                    if !self.buffers[target].is_empty() {
                        let b = std::mem::take(&mut self.buffers[target]);
                        self.send_batch(target, b)?;
                    }
                }
                Ok(())
            }
        }
    }

    fn watermark(&mut self, wm: Timestamp) -> Result<()> {
        self.broadcast(|| StreamMessage::Watermark(wm))
    }

    fn idle(&mut self) -> Result<()> {
        self.broadcast(|| StreamMessage::Idle)
    }

    fn barrier(&mut self, barrier: CheckpointBarrier, _snapshots: SnapshotSink<'_>) -> Result<()> {
        self.broadcast(|| StreamMessage::Barrier(barrier))
    }

    fn checkpoint_complete(&mut self, _id: CheckpointId) -> Result<()> {
        Ok(())
    }

    fn end(&mut self) -> Result<()> {
        self.broadcast(|| StreamMessage::End)
    }

    fn latency_marker(&mut self, marker: LatencyMarker) -> Result<()> {
        self.broadcast(|| StreamMessage::LatencyMarker(marker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::bounded;

    fn data(n: u64) -> ChannelMessage {
        StreamMessage::Data(Box::new(vec![n]))
    }

    fn number(msg: ChannelMessage) -> u64 {
        match msg {
            StreamMessage::Data(b) => b.downcast::<Vec<u64>>().map(|v| v[0]).unwrap_or(u64::MAX),
            _ => u64::MAX,
        }
    }

    /// A consumer that stalls now and then: every message arrives, in order, and the pause
    /// learnt stays within its bounds.
    #[test]
    fn a_full_channel_is_waited_out_and_nothing_is_lost_or_reordered() {
        let (tx, rx) = bounded::<ChannelMessage>(16);
        let consumer = std::thread::spawn(move || {
            let mut got = Vec::new();
            while let Ok(msg) = rx.recv() {
                got.push(number(msg));
                if got.len() % 500 == 0 {
                    std::thread::sleep(Duration::from_millis(5));
                } else if got.len() % 7 == 0 {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
            got
        });
        let mut room = RoomWait::new();
        let mut waited = 0;
        for n in 0..3_000 {
            match tx.try_send(data(n)) {
                Ok(()) => {}
                Err(TrySendError::Full(msg)) => {
                    waited += 1;
                    room.send(&tx, msg).unwrap();
                    assert!((RoomWait::SHORTEST..=RoomWait::LONGEST).contains(&room.pause()));
                }
                Err(TrySendError::Disconnected(_)) => panic!("consumer gone"),
            }
        }
        drop(tx);
        assert_eq!(consumer.join().unwrap(), (0..3_000).collect::<Vec<_>>());
        assert!(waited > 0, "the consumer is slower: the channel must have filled");
    }

    #[test]
    fn a_receiver_gone_while_waiting_cancels_the_send() {
        let (tx, rx) = bounded::<ChannelMessage>(1);
        tx.try_send(data(0)).unwrap();
        let dropper = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            drop(rx);
        });
        assert!(matches!(RoomWait::new().send(&tx, data(1)), Err(Error::Cancelled)));
        dropper.join().unwrap();
    }
}

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
use std::time::Instant;

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
    buffers: Vec<Batch<T>>,
    batch_size: usize,
    metrics: Arc<SubtaskMetrics>,
}

impl<T: Data> ExchangeOutput<T> {
    pub(crate) fn new(
        partitioner: Partitioner<T>,
        senders: Vec<Sender<ChannelMessage>>,
        batch_size: usize,
        metrics: Arc<SubtaskMetrics>,
    ) -> Self {
        let buffers = (0..senders.len()).map(|_| Vec::new()).collect();
        ExchangeOutput { partitioner, senders, buffers, batch_size, metrics }
    }

    fn send(&self, target: usize, msg: ChannelMessage) -> Result<()> {
        let sender = &self.senders[target];
        match sender.try_send(msg) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(msg)) => {
                let start = Instant::now();
                let r = sender.send(msg).map_err(|_| Error::Cancelled);
                self.metrics.backpressured_ns.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
                r
            }
            Err(TrySendError::Disconnected(_)) => Err(Error::Cancelled),
        }
    }

    fn send_batch(&self, target: usize, mut batch: Batch<T>) -> Result<()> {
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

    fn broadcast(&self, msg: impl Fn() -> ChannelMessage) -> Result<()> {
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

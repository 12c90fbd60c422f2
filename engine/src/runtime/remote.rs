//! The channels of this process whose other end runs in another process (cluster mode):
//! collected while the tasks are built, bridged over TCP by `crate::cluster::shuffle`.

use super::codec::BatchCodec;
use super::exchange::ChannelMessage;
use crate::metrics::SubtaskMetrics;
use crossbeam_channel::{Receiver, Sender};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::sync::Arc;

/// One channel of the job: input `input` of node `node`, from upstream subtask `from` to
/// subtask `to`. Both processes compute the same keys from the same graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct ChannelKey {
    pub(crate) node: u32,
    pub(crate) input: u32,
    pub(crate) from: u32,
    pub(crate) to: u32,
}

impl ChannelKey {
    pub(crate) fn new(node: usize, input: usize, from: u32, to: u32) -> Self {
        ChannelKey { node: node as u32, input: input as u32, from, to }
    }
}

/// The channels of this process that cross to another, collected while building tasks.
#[derive(Debug, Default)]
pub(crate) struct RemoteChannels {
    pub(crate) local: BTreeSet<u32>,
    /// Local upstream, remote consumer: read here, send over the network (the bytes sent
    /// count as the upstream operator subtask's bytes out).
    pub(crate) outbound: Vec<Outbound>,
    /// Remote upstream, local consumer: received from the network, pushed here (the bytes
    /// received count as the consuming operator subtask's bytes in).
    pub(crate) inbound: Vec<(ChannelKey, Sender<ChannelMessage>, BatchCodec, Arc<SubtaskMetrics>)>,
}

/// One channel this process sends over the network.
pub(crate) type Outbound = (ChannelKey, Receiver<ChannelMessage>, BatchCodec, Arc<SubtaskMetrics>);

impl RemoteChannels {
    /// Subtask index `i` of every task runs in slot `i`; this process has `local_slots`.
    pub(crate) fn new(local_slots: impl IntoIterator<Item = u32>) -> Self {
        RemoteChannels { local: local_slots.into_iter().collect(), ..Default::default() }
    }

    /// True when subtask `subtask` (of any task) runs in this process.
    pub(crate) fn is_local(&self, subtask: u32) -> bool {
        self.local.contains(&subtask)
    }

    /// Called for every channel: keeps the end this process must bridge, if any, with the
    /// counters of the operator subtask on this side (`sender` upstream, `receiver` downstream).
    pub(crate) fn register(
        &mut self,
        key: ChannelKey,
        (tx, rx): (&Sender<ChannelMessage>, &Receiver<ChannelMessage>),
        codec: BatchCodec,
        sender: &Arc<SubtaskMetrics>,
        receiver: &Arc<SubtaskMetrics>,
    ) {
        match (self.is_local(key.from), self.is_local(key.to)) {
            (true, false) => self.outbound.push((key, rx.clone(), codec, sender.clone())),
            (false, true) => self.inbound.push((key, tx.clone(), codec, receiver.clone())),
            _ => {}
        }
    }
}

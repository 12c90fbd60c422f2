//! Before a restored sink writes anything: commit the transactions its checkpoint recorded
//! as pending, then abort whatever else its transactional ids left open.
//!
//! librdkafka cannot resume a transaction begun by another process, so both go straight to
//! the transaction coordinator (`EndTxn` with the recorded producer id and epoch). Committing
//! an already committed transaction again is harmless. A transaction that can no longer be
//! committed (fenced, aborted, timed out) was either committed by a later run that went on
//! from the same checkpoint (a savepoint restored twice, an older checkpoint restored after
//! the job went on: that run re-initialised the ids) — then a checkpoint that run completed
//! no longer lists it, and the sink goes on — or its records are lost, and the job fails
//! saying so rather than continue with a hole in its output. Flink's sink ignores the
//! refusal in both cases alike (FLINK-8086), which hides the second.

use super::transactions::{RecordedTxn, SinkSnapshot};
use crate::kafka::txn_coordinator::{TxnCoordinatorClient, TxnCoordinatorError};
use caudal::{Error, Result};
use std::collections::HashSet;

/// Transactional ids probed per old subtask at most: the pool never grows past it
/// ([`super::transactions`] fails the job first), so a restore finds every id a run used.
pub(crate) const MAX_PROBED_IDS: u32 = 64;

/// Subtask numbers probed at most for ids of earlier runs with a larger parallelism.
const MAX_PROBED_SUBTASKS: u32 = 4096;

/// Unknown subtask ids in a row after which no larger one is probed.
const PROBED_GAP: u32 = 32;

/// What one sink subtask recovers: the old subtasks whose transactions it takes over.
#[derive(Debug)]
pub(crate) struct Recovery<'a> {
    pub(crate) coordinator: &'a TxnCoordinatorClient,
    /// `<prefix>` of the sink's transactional ids (`<prefix>-<subtask>-<index>`).
    pub(crate) prefix: &'a str,
    pub(crate) subtask: u32,
    pub(crate) parallelism: u32,
    pub(crate) topic: &'a str,
    /// The sink's snapshots in the checkpoints later runs completed on from the restored one.
    pub(crate) later: &'a [LaterCheckpoint],
    /// The sink's `transaction.timeout.ms` (for the sessions that fence earlier runs).
    pub(crate) transaction_timeout: std::time::Duration,
}

/// The sink's snapshots (every subtask's) in a checkpoint completed after the restored one
/// on its line ([`caudal::OperatorContext::later_snapshots`]).
#[derive(Debug)]
pub(crate) struct LaterCheckpoint {
    pub(crate) checkpoint: u64,
    pub(crate) snapshots: Vec<SinkSnapshot>,
}

/// The later checkpoint that proves `txn` committed: a sink subtask lists a pre-committed
/// transaction until it has committed it, so a checkpoint taken after the restored one on
/// its line that lists it nowhere was taken after its commit.
fn committed_in(later: &[LaterCheckpoint], txn: &RecordedTxn) -> Option<u64> {
    later
        .iter()
        .find(|l| !l.snapshots.is_empty() && !l.snapshots.iter().any(|s| s.pending.contains(txn)))
        .map(|l| l.checkpoint)
}

impl Recovery<'_> {
    /// Commits the pending transactions of `snapshots` (every old subtask's) that this
    /// subtask takes over, then aborts open transactions of those subtasks' ids.
    /// `restored` is the checkpoint restored from; `None` on a fresh start (only aborts).
    ///
    /// Returns the indices of this subtask's own ids the restored checkpoint lists: they
    /// must stay untouched (no `init_transactions`, which would move their epoch on) until
    /// a newer checkpoint completes, or a second restore from the same checkpoint could not
    /// tell "committed" from "lost".
    pub(crate) fn run(&self, snapshots: &[SinkSnapshot], restored: Option<u64>) -> Result<Vec<u32>> {
        let old_parallelism = u32::try_from(snapshots.len()).unwrap_or(u32::MAX);
        let mut mine: Vec<u32> =
            (0..old_parallelism).filter(|j| j % self.parallelism.max(1) == self.subtask).collect();
        if !mine.contains(&self.subtask) {
            mine.push(self.subtask);
        }
        let mut committed = HashSet::new();
        for snapshot in snapshots.iter().filter(|s| mine.contains(&s.subtask)) {
            for txn in &snapshot.pending {
                if let Some(r) = restored.filter(|r| txn.checkpoint <= *r) {
                    self.recommit(txn)?;
                    if committed.is_empty() {
                        caudal::crash::point(caudal::crash::DURING_KAFKA_RECOMMIT, caudal::CheckpointId(r));
                    }
                    committed.insert(txn.transactional_id.clone());
                }
            }
        }
        // Subtasks beyond both the checkpoint's and this run's parallelism (an earlier run,
        // crashed before any checkpoint or never restored, ran with more): their ids may hold
        // open transactions too, which would stall read_committed readers until the broker
        // times them out. Ids are used from index 0 on, so a subtask whose first id the
        // coordinator does not know never wrote — but a later one may have (a subtask that
        // had no records yet when the run was killed): probing stops only after
        // PROBED_GAP unknown subtasks in a row.
        let p = self.parallelism.max(1);
        let mut beyond = old_parallelism.max(p);
        beyond += (self.subtask + p - beyond % p) % p;
        let mut unknown_in_a_row = 0;
        while beyond < MAX_PROBED_SUBTASKS && unknown_in_a_row < PROBED_GAP {
            let known = self
                .coordinator
                .describe(&transactional_id(self.prefix, beyond, 0))
                .map_err(|e| super::coordinator_error(self.topic, e))?;
            if known.is_some() {
                mine.push(beyond);
                unknown_in_a_row = 0;
            } else {
                unknown_in_a_row += 1;
            }
            beyond += p;
        }
        for old in mine {
            self.abort_lingering(old, &committed)?;
        }
        let own = format!("{}-{}-", self.prefix, self.subtask);
        Ok(committed.iter().filter_map(|id| id.strip_prefix(&own)?.parse().ok()).collect())
    }

    fn recommit(&self, txn: &RecordedTxn) -> Result<()> {
        match self.coordinator.end_txn(&txn.transactional_id, txn.producer_id, txn.producer_epoch, true) {
            Ok(()) => {
                tracing::info!(
                    "caudal: kafka sink into `{}`: committed `{}` of checkpoint {} (producer {} epoch {})",
                    self.topic,
                    txn.transactional_id,
                    txn.checkpoint,
                    txn.producer_id,
                    txn.producer_epoch
                );
                Ok(())
            }
            Err(e @ (TxnCoordinatorError::Unreachable { .. } | TxnCoordinatorError::Unauthorized { .. })) => {
                Err(super::coordinator_error(self.topic, e))
            }
            Err(e) => {
                if let Some(later) = committed_in(self.later, txn) {
                    tracing::warn!(
                        "caudal: kafka sink into `{}`: `{}` of checkpoint {} was committed by a later run that \
                         went on from this checkpoint (its checkpoint {later} no longer lists it; the coordinator \
                         refused it again: {e})",
                        self.topic, txn.transactional_id, txn.checkpoint
                    );
                    return Ok(());
                }
                let now = self
                    .coordinator
                    .describe(&txn.transactional_id)
                    .ok()
                    .flatten()
                    .map(|d| format!("{} (producer {} epoch {})", d.state, d.producer_id, d.producer_epoch))
                    .unwrap_or_else(|| "unknown".into());
                Err(Error::OutputLost(format!(
                    "kafka sink into `{}`: the transaction of checkpoint {} (`{}`, producer {} epoch {}) \
                     can no longer be committed — its records are LOST ({e}; the coordinator now holds \
                     {now}). Was transaction.timeout.ms shorter than the time the job was down, or did \
                     another job use the same transactional ids?",
                    self.topic, txn.checkpoint, txn.transactional_id, txn.producer_id, txn.producer_epoch
                )))
            }
        }
    }

    /// Fences every id of `old_subtask` an earlier run used, except those just recommitted
    /// (a second restore from the same checkpoint must find them at their recorded epoch):
    /// a transaction it left open is aborted, and a producer it still holds — a zombie,
    /// frozen or cut off, that would begin a new transaction on an idle id and leave it open
    /// for readers to wait on — is refused from then on.
    fn abort_lingering(&self, old_subtask: u32, committed: &HashSet<String>) -> Result<()> {
        for index in 0..MAX_PROBED_IDS {
            let id = transactional_id(self.prefix, old_subtask, index);
            let described =
                self.coordinator.describe(&id).map_err(|e| super::coordinator_error(self.topic, e))?;
            let Some(state) = described else { break };
            if committed.contains(&id) {
                continue;
            }
            if state.is_open() {
                tracing::info!(
                    "caudal: kafka sink into `{}`: aborting `{id}` left open by an earlier run (producer {} epoch {})",
                    self.topic, state.producer_id, state.producer_epoch
                );
            }
            self.coordinator
                .fence(&id, self.transaction_timeout)
                .map_err(|e| super::coordinator_error(self.topic, e))?;
        }
        Ok(())
    }
}

/// `<prefix>-<subtask>-<index>`.
pub(crate) fn transactional_id(prefix: &str, subtask: u32, index: u32) -> String {
    format!("{prefix}-{subtask}-{index}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(checkpoint: u64, epoch: i16) -> RecordedTxn {
        RecordedTxn { checkpoint, transactional_id: "t-0-0".into(), producer_id: 7, producer_epoch: epoch }
    }

    fn later(checkpoint: u64, pending: Vec<Vec<RecordedTxn>>) -> LaterCheckpoint {
        let snapshots = pending
            .into_iter()
            .enumerate()
            .map(|(i, pending)| SinkSnapshot { subtask: i as u32, pending })
            .collect();
        LaterCheckpoint { checkpoint, snapshots }
    }

    #[test]
    fn only_a_later_checkpoint_that_lists_the_transaction_nowhere_proves_its_commit() {
        let t = txn(3, 1);
        // Checkpoint 4 was taken before the commit (still pending at subtask 1).
        let before = later(4, vec![vec![], vec![t.clone()]]);
        assert_eq!(committed_in(std::slice::from_ref(&before), &t), None);
        // No later checkpoint, or one without this sink: no evidence.
        assert_eq!(committed_in(&[], &t), None);
        assert_eq!(committed_in(&[later(5, vec![])], &t), None);
        // Checkpoint 6 lists it nowhere (another transaction of the same id is a different one).
        let after = later(6, vec![vec![txn(6, 2)], vec![]]);
        assert_eq!(committed_in(&[before, after], &t), Some(6));
    }
}

//! The checkpoint protocol as pure logic over observed facts.
//!
//! A [`PendingCheckpoint`] is fed what the coordinator observes (acks, declines, the
//! clock, "the metadata is durable", commit confirmations) and answers with its state;
//! it does no I/O. The one I/O step, writing the metadata, is [`complete_checkpoint`]
//! at the edge.
//!
//! ```text
//! Pending ──all acks + metadata durable──► Complete ──notify──► Committing ──all confirmed──► Committed
//!    │
//!    └──timeout / decline / abort──► Aborted(cause)
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::ids::{CheckpointId, OperatorId, SubtaskIndex};
use crate::lineage::Lineage;
use crate::metadata::{
    write_metadata, CheckpointKind, CheckpointMetadata, OperatorSnapshot, SubtaskSnapshot,
    METADATA_FORMAT_VERSION,
};
use crate::store::{CheckpointPaths, CheckpointStore};
use crate::{Error, Result};

/// Why a checkpoint was aborted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AbortCause {
    /// Not every subtask acknowledged before the deadline.
    Timeout {
        /// Milliseconds since the trigger.
        after_ms: u64,
        /// The subtasks that had not acknowledged.
        missing: Vec<(OperatorId, SubtaskIndex)>,
    },
    /// A subtask could not take its snapshot.
    Declined {
        /// The operator.
        operator: OperatorId,
        /// The subtask.
        subtask: SubtaskIndex,
        /// Its reason.
        reason: String,
    },
    /// The coordinator gave up (job failing, cancelled, storage error).
    Cancelled(String),
}

impl fmt::Display for AbortCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AbortCause::Timeout { after_ms, missing } => {
                write!(f, "timed out after {after_ms} ms waiting for")?;
                for (op, st) in missing.iter().take(5) {
                    write!(f, " {op}/{st}")?;
                }
                if missing.len() > 5 {
                    write!(f, " and {} more", missing.len() - 5)?;
                }
                Ok(())
            }
            AbortCause::Declined { operator, subtask, reason } => {
                write!(f, "declined by {operator}/{subtask}: {reason}")
            }
            AbortCause::Cancelled(why) => write!(f, "cancelled: {why}"),
        }
    }
}

/// Where a checkpoint is in the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointState {
    /// Triggered; collecting acks (or all acked, metadata not durable yet).
    Pending,
    /// The metadata is durable: the checkpoint exists for restore.
    Complete,
    /// `checkpoint_complete` is being delivered; sinks are committing.
    Committing,
    /// Every subtask confirmed the commit.
    Committed,
    /// Will never complete.
    Aborted(AbortCause),
}

/// What an acknowledgement changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    /// More acks are expected.
    Waiting {
        /// How many.
        remaining: usize,
    },
    /// That was the last ack: write the metadata.
    AllAcknowledged,
    /// The checkpoint is no longer pending (aborted): the ack is dropped. The subtask's
    /// uploaded files are cleaned up by retention.
    Ignored,
}

/// One checkpoint in flight, tracked by the coordinator.
#[derive(Debug, Clone)]
pub struct PendingCheckpoint {
    id: CheckpointId,
    kind: CheckpointKind,
    trigger_time_ms: u64,
    timeout_ms: u64,
    parallelism: BTreeMap<OperatorId, u32>,
    missing: BTreeSet<(OperatorId, SubtaskIndex)>,
    acks: BTreeMap<OperatorId, BTreeMap<SubtaskIndex, SubtaskSnapshot>>,
    last_ack_ms: u64,
    unconfirmed: BTreeSet<(OperatorId, SubtaskIndex)>,
    state: CheckpointState,
    lineage: Lineage,
}

impl PendingCheckpoint {
    /// A checkpoint triggered at `trigger_time_ms`, expecting one ack from every subtask
    /// of `operators` (`(operator, parallelism)`), aborted after `timeout_ms`.
    pub fn new(
        id: CheckpointId,
        kind: CheckpointKind,
        trigger_time_ms: u64,
        timeout_ms: u64,
        operators: impl IntoIterator<Item = (OperatorId, u32)>,
    ) -> Self {
        let parallelism: BTreeMap<OperatorId, u32> = operators.into_iter().collect();
        let missing: BTreeSet<_> = parallelism
            .iter()
            .flat_map(|(op, p)| (0..*p).map(move |i| (op.clone(), SubtaskIndex(i))))
            .collect();
        PendingCheckpoint {
            id,
            kind,
            trigger_time_ms,
            timeout_ms,
            unconfirmed: missing.clone(),
            parallelism,
            missing,
            acks: BTreeMap::new(),
            last_ack_ms: trigger_time_ms,
            state: CheckpointState::Pending,
            lineage: Lineage::default(),
        }
    }

    /// Records `lineage` (the run taking the checkpoint, its restore points) in the metadata.
    pub fn with_lineage(mut self, lineage: Lineage) -> Self {
        self.lineage = lineage;
        self
    }

    /// The checkpoint id.
    pub fn id(&self) -> CheckpointId {
        self.id
    }

    /// The current state.
    pub fn state(&self) -> &CheckpointState {
        &self.state
    }

    /// The subtasks that have not acknowledged.
    pub fn missing(&self) -> impl Iterator<Item = &(OperatorId, SubtaskIndex)> {
        self.missing.iter()
    }

    /// Whether every expected subtask acknowledged.
    pub fn is_fully_acknowledged(&self) -> bool {
        self.missing.is_empty()
    }

    fn protocol_error(&self, reason: String) -> Error {
        Error::Protocol { checkpoint: self.id.label(), reason }
    }

    /// A subtask acknowledged with its snapshot at `now_ms`.
    pub fn acknowledge(
        &mut self,
        operator: &OperatorId,
        subtask: SubtaskIndex,
        snapshot: SubtaskSnapshot,
        now_ms: u64,
    ) -> Result<AckOutcome> {
        match self.state {
            CheckpointState::Pending => {}
            CheckpointState::Aborted(_) => return Ok(AckOutcome::Ignored),
            _ => {
                return Err(self
                    .protocol_error(format!("ack from {operator}/{subtask} after the checkpoint completed")))
            }
        }
        if !self.missing.remove(&(operator.clone(), subtask)) {
            let known = self.parallelism.get(operator).is_some_and(|p| subtask.0 < *p);
            return Err(self.protocol_error(if known {
                format!("duplicate ack from {operator}/{subtask}")
            } else {
                format!("ack from unexpected subtask {operator}/{subtask}")
            }));
        }
        self.acks.entry(operator.clone()).or_default().insert(subtask, snapshot);
        self.last_ack_ms = self.last_ack_ms.max(now_ms);
        Ok(if self.missing.is_empty() {
            AckOutcome::AllAcknowledged
        } else {
            AckOutcome::Waiting { remaining: self.missing.len() }
        })
    }

    /// A subtask declined (its snapshot failed): the checkpoint is aborted.
    pub fn decline(&mut self, operator: &OperatorId, subtask: SubtaskIndex, reason: &str) {
        self.abort(AbortCause::Declined { operator: operator.clone(), subtask, reason: reason.to_string() });
    }

    /// Aborts if still pending past the deadline; returns whether it aborted now.
    pub fn check_timeout(&mut self, now_ms: u64) -> bool {
        let elapsed = now_ms.saturating_sub(self.trigger_time_ms);
        if self.state == CheckpointState::Pending && elapsed >= self.timeout_ms {
            self.abort(AbortCause::Timeout {
                after_ms: elapsed,
                missing: self.missing.iter().cloned().collect(),
            });
            return true;
        }
        false
    }

    /// Aborts a pending checkpoint (no effect once complete: the metadata is durable).
    pub fn abort(&mut self, cause: AbortCause) {
        if self.state == CheckpointState::Pending {
            self.state = CheckpointState::Aborted(cause);
        }
    }

    /// The metadata to write, once every subtask acknowledged.
    pub fn metadata(&self, job_name: &str, max_parallelism: u16) -> Result<CheckpointMetadata> {
        if self.state != CheckpointState::Pending || !self.missing.is_empty() {
            return Err(self.protocol_error(format!(
                "metadata requested in state {:?} with {} acks missing",
                self.state,
                self.missing.len()
            )));
        }
        let operators = self
            .parallelism
            .iter()
            .map(|(op, p)| {
                let subtasks = self.acks.get(op).cloned().unwrap_or_default();
                (op.clone(), OperatorSnapshot { parallelism: *p, subtasks })
            })
            .collect();
        Ok(CheckpointMetadata {
            format_version: METADATA_FORMAT_VERSION,
            job_name: job_name.to_string(),
            checkpoint_id: self.id,
            kind: self.kind,
            trigger_time_ms: self.trigger_time_ms,
            complete_time_ms: self.last_ack_ms,
            max_parallelism,
            operators,
            lineage: self.lineage.clone(),
        })
    }

    /// The metadata is durable: Pending → Complete.
    pub fn metadata_durable(&mut self) -> Result<()> {
        if self.state != CheckpointState::Pending || !self.missing.is_empty() {
            return Err(self.protocol_error(format!("cannot complete in state {:?}", self.state)));
        }
        self.state = CheckpointState::Complete;
        Ok(())
    }

    /// `checkpoint_complete` is being sent to every subtask: Complete → Committing.
    pub fn start_commit(&mut self) -> Result<()> {
        if self.state != CheckpointState::Complete {
            return Err(self.protocol_error(format!("cannot commit in state {:?}", self.state)));
        }
        self.state = CheckpointState::Committing;
        Ok(())
    }

    /// A subtask handled `checkpoint_complete`; returns true once all have
    /// (Committing → Committed).
    pub fn commit_confirmed(&mut self, operator: &OperatorId, subtask: SubtaskIndex) -> Result<bool> {
        if self.state != CheckpointState::Committing {
            return Err(self.protocol_error(format!(
                "commit confirmation from {operator}/{subtask} in state {:?}",
                self.state
            )));
        }
        self.unconfirmed.remove(&(operator.clone(), subtask));
        if self.unconfirmed.is_empty() {
            self.state = CheckpointState::Committed;
        }
        Ok(self.state == CheckpointState::Committed)
    }
}

/// The I/O edge of completion: writes the metadata of a fully acknowledged checkpoint
/// (put-if-absent) and only then marks it Complete. On a storage error the checkpoint
/// stays Pending; the caller aborts it or retries.
pub fn complete_checkpoint(
    store: &dyn CheckpointStore,
    paths: &CheckpointPaths,
    pending: &mut PendingCheckpoint,
    job_name: &str,
    max_parallelism: u16,
) -> Result<CheckpointMetadata> {
    let meta = pending.metadata(job_name, max_parallelism)?;
    write_metadata(store, paths, &meta)?;
    pending.metadata_durable()?;
    Ok(meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(name: &str) -> OperatorId {
        OperatorId::new(name).unwrap()
    }

    fn pending() -> PendingCheckpoint {
        PendingCheckpoint::new(
            CheckpointId(4),
            CheckpointKind::Checkpoint,
            1_000,
            500,
            [(op("src"), 2), (op("win"), 1)],
        )
    }

    #[test]
    fn completes_after_all_acks_and_durable_metadata() {
        let mut p = pending();
        let s = SubtaskSnapshot::default();
        assert_eq!(
            p.acknowledge(&op("src"), SubtaskIndex(0), s.clone(), 1_010).unwrap(),
            AckOutcome::Waiting { remaining: 2 }
        );
        assert!(p.metadata("job", 128).is_err());
        p.acknowledge(&op("win"), SubtaskIndex(0), s.clone(), 1_020).unwrap();
        assert!(p.acknowledge(&op("win"), SubtaskIndex(0), s.clone(), 1_020).is_err());
        assert!(p.acknowledge(&op("win"), SubtaskIndex(5), s.clone(), 1_020).is_err());
        assert_eq!(
            p.acknowledge(&op("src"), SubtaskIndex(1), s, 1_030).unwrap(),
            AckOutcome::AllAcknowledged
        );
        // Still Pending until the metadata is durable.
        assert_eq!(p.state(), &CheckpointState::Pending);
        let meta = p.metadata("job", 128).unwrap();
        assert_eq!(meta.operators[&op("src")].subtasks.len(), 2);
        assert!(p.start_commit().is_err());
        p.metadata_durable().unwrap();
        assert_eq!(p.state(), &CheckpointState::Complete);
    }

    #[test]
    fn full_cycle_through_the_store() {
        let store = crate::store::InMemoryCheckpointStore::new();
        let paths = CheckpointPaths::new();
        let mut p = pending();
        for (o, i) in [("src", 0), ("src", 1), ("win", 0)] {
            p.acknowledge(&op(o), SubtaskIndex(i), SubtaskSnapshot::default(), 1_100).unwrap();
        }
        let meta = complete_checkpoint(&store, &paths, &mut p, "job", 128).unwrap();
        assert_eq!(meta.complete_time_ms, 1_100);
        assert_eq!(p.state(), &CheckpointState::Complete);
        p.abort(AbortCause::Cancelled("late".into()));
        assert_eq!(p.state(), &CheckpointState::Complete, "complete is final for aborts");
        p.start_commit().unwrap();
        assert!(!p.commit_confirmed(&op("src"), SubtaskIndex(0)).unwrap());
        assert!(!p.commit_confirmed(&op("src"), SubtaskIndex(1)).unwrap());
        assert!(p.commit_confirmed(&op("win"), SubtaskIndex(0)).unwrap());
        assert_eq!(p.state(), &CheckpointState::Committed);
        // The id cannot be completed twice.
        let mut again = pending();
        for (o, i) in [("src", 0), ("src", 1), ("win", 0)] {
            again.acknowledge(&op(o), SubtaskIndex(i), SubtaskSnapshot::default(), 1_100).unwrap();
        }
        assert!(complete_checkpoint(&store, &paths, &mut again, "job", 128).is_err());
        assert_eq!(again.state(), &CheckpointState::Pending);
    }

    #[test]
    fn timeout_aborts_with_missing_subtasks() {
        let mut p = pending();
        p.acknowledge(&op("src"), SubtaskIndex(0), SubtaskSnapshot::default(), 1_010).unwrap();
        assert!(!p.check_timeout(1_499));
        assert!(p.check_timeout(1_500));
        match p.state() {
            CheckpointState::Aborted(AbortCause::Timeout { missing, .. }) => {
                assert_eq!(missing.len(), 2);
                assert!(p.state_display().contains("src/1"));
            }
            s => panic!("{s:?}"),
        }
        assert_eq!(
            p.acknowledge(&op("src"), SubtaskIndex(1), SubtaskSnapshot::default(), 1_600).unwrap(),
            AckOutcome::Ignored
        );
        assert!(p.metadata("job", 128).is_err());
    }

    #[test]
    fn decline_aborts() {
        let mut p = pending();
        p.decline(&op("win"), SubtaskIndex(0), "disk full");
        assert!(matches!(p.state(), CheckpointState::Aborted(AbortCause::Declined { .. })));
    }

    impl PendingCheckpoint {
        fn state_display(&self) -> String {
            match &self.state {
                CheckpointState::Aborted(c) => c.to_string(),
                s => format!("{s:?}"),
            }
        }
    }
}

//! Where a checkpoint sits in a job's history: the run that took it, and the checkpoints
//! its line of runs was restored from.
//!
//! A restore from checkpoint `S` can meet the work of a later run that restored from `S`
//! too (or ran on after it): a savepoint restored twice, an older retained checkpoint
//! restored after the job went on. What that run did with `S`'s state — above all, which of
//! its pending transactions it committed — shows in the checkpoints it completed, the
//! *descendants* of `S` ([`CheckpointMetadata::descends_from`]); a sink can tell
//! "committed by a later run" from "lost" by them instead of guessing.

use serde::{Deserialize, Serialize};

use crate::ids::CheckpointId;
use crate::metadata::CheckpointMetadata;

/// Restore points kept per lineage (newest first); older ones are dropped.
pub const MAX_RESTORE_POINTS: usize = 64;

/// One checkpoint of one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointRef {
    /// The run that took it.
    pub run: String,
    /// Its number.
    pub checkpoint: CheckpointId,
}

/// The history of a checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Lineage {
    /// The run (attempt) that took the checkpoint; empty in metadata written before
    /// lineages were recorded (such a checkpoint is nobody's ancestor).
    pub run: String,
    /// The checkpoints the run was restored from, and each of those its run was restored
    /// from, newest first (at most [`MAX_RESTORE_POINTS`]).
    pub restored_from: Vec<CheckpointRef>,
}

impl Lineage {
    /// The lineage of the checkpoints run `run` takes after restoring `restored` (if any).
    pub fn of_run(run: impl Into<String>, restored: Option<&CheckpointMetadata>) -> Lineage {
        let restored_from = match restored {
            Some(m) if !m.lineage.run.is_empty() => std::iter::once(m.reference())
                .chain(m.lineage.restored_from.iter().cloned())
                .take(MAX_RESTORE_POINTS)
                .collect(),
            _ => Vec::new(),
        };
        Lineage { run: run.into(), restored_from }
    }
}

impl CheckpointMetadata {
    /// This checkpoint as a restore point.
    pub fn reference(&self) -> CheckpointRef {
        CheckpointRef { run: self.lineage.run.clone(), checkpoint: self.checkpoint_id }
    }

    /// Whether this checkpoint was taken after `ancestor` on a line that passed through it:
    /// by the same run later, or by a run restored from it or from one of its descendants.
    /// A savepoint is the checkpoint it copies (same run and number), not a descendant.
    pub fn descends_from(&self, ancestor: &CheckpointRef) -> bool {
        if ancestor.run.is_empty() {
            return false;
        }
        (self.lineage.run == ancestor.run && self.checkpoint_id > ancestor.checkpoint)
            || self
                .lineage
                .restored_from
                .iter()
                .any(|r| r.run == ancestor.run && r.checkpoint >= ancestor.checkpoint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::{CheckpointKind, METADATA_FORMAT_VERSION};

    fn meta(run: &str, id: u64, restored: Option<&CheckpointMetadata>) -> CheckpointMetadata {
        CheckpointMetadata {
            format_version: METADATA_FORMAT_VERSION,
            job_name: "j".into(),
            checkpoint_id: CheckpointId(id),
            kind: CheckpointKind::Checkpoint,
            trigger_time_ms: 0,
            complete_time_ms: 0,
            max_parallelism: 128,
            operators: Default::default(),
            lineage: Lineage::of_run(run, restored),
        }
    }

    #[test]
    fn descendants_are_later_checkpoints_of_the_run_and_of_runs_restored_from_it() {
        let a3 = meta("a", 3, None);
        let a5 = meta("a", 5, None);
        let b7 = meta("b", 7, Some(&a3)); // b restored from a's checkpoint 3
        let c9 = meta("c", 9, Some(&b7)); // c restored from b's 7
        let d8 = meta("d", 8, Some(&meta("a", 2, None))); // d restored from a's 2
        let fresh = meta("e", 4, None);
        let s = a3.reference();
        assert!(a5.descends_from(&s));
        assert!(b7.descends_from(&s));
        assert!(c9.descends_from(&s));
        assert!(!d8.descends_from(&s), "a branch from before 3");
        assert!(!fresh.descends_from(&s), "a fresh start");
        assert!(!a3.descends_from(&s), "itself (or its savepoint)");
        assert!(!meta("a", 2, None).descends_from(&s));
        assert!(a5.descends_from(&meta("a", 4, None).reference()));
    }

    #[test]
    fn metadata_of_before_lineages_is_nobodys_ancestor_nor_descendant() {
        let old = meta("", 3, None);
        assert!(!meta("", 5, None).descends_from(&old.reference()));
        assert_eq!(Lineage::of_run("b", Some(&old)).restored_from, Vec::new());
        let json = br#"{"format_version":1,"job_name":"j","checkpoint_id":3,"kind":"checkpoint",
            "trigger_time_ms":0,"complete_time_ms":0,"max_parallelism":128,"operators":{}}"#;
        let parsed = CheckpointMetadata::from_json(json, "chk-3", "_metadata").unwrap();
        assert_eq!(parsed.lineage, Lineage::default());
    }

    #[test]
    fn restore_points_are_bounded() {
        let mut m = meta("r0", 1, None);
        for i in 1..(MAX_RESTORE_POINTS as u64 + 10) {
            m = meta(&format!("r{i}"), i + 1, Some(&m));
        }
        assert_eq!(m.lineage.restored_from.len(), MAX_RESTORE_POINTS);
        assert_eq!(m.lineage.restored_from[0].checkpoint, CheckpointId(MAX_RESTORE_POINTS as u64 + 9));
    }
}

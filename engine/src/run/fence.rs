//! The run fence: whether this run still owns its job's checkpoint storage.
//!
//! A run claims the storage before anything of it restores (`caudal_checkpoints::runs`);
//! an earlier run that still lives — frozen, cut off, a second process started on the same
//! directory — finds the newer claim at its next step that others could see: the
//! coordinator before it writes a checkpoint's metadata, a sink before it begins output
//! under a name a restore would not know yet (a Kafka producer's new transactional id).

use crate::{Error, Result};
use caudal_checkpoints::runs::{claim_run, newer_claim};
use caudal_checkpoints::{CheckpointPaths, CheckpointStore};
use std::sync::Arc;

/// One run's view of the claims on its checkpoint storage. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RunFence {
    store: Arc<dyn CheckpointStore>,
    paths: CheckpointPaths,
    run: String,
}

impl RunFence {
    /// The fence of `run` over the storage at `paths`.
    pub fn new(store: Arc<dyn CheckpointStore>, paths: CheckpointPaths, run: impl Into<String>) -> Self {
        RunFence { store, paths, run: run.into() }
    }

    /// Claims the storage for this run: from now on, earlier runs are superseded.
    pub(crate) fn claim(&self) -> Result<()> {
        let claim =
            claim_run(self.store.as_ref(), &self.paths, &self.run).map_err(|e| Error::CheckpointStorage {
                context: "claiming the checkpoint storage for this run".into(),
                source: Box::new(e),
            })?;
        tracing::debug!(seq = claim.seq, "caudal: run `{}` claimed `{}`", self.run, self.store.location());
        Ok(())
    }

    /// `Ok` while no newer run claimed the storage; [`Error::Superseded`] once one did,
    /// naming `next_step` (what this run was about to do).
    pub fn check(&self, next_step: &str) -> Result<()> {
        let newer = newer_claim(self.store.as_ref(), &self.paths, &self.run).map_err(|e| {
            Error::CheckpointStorage {
                context: "reading the runs' claims of the checkpoint storage".into(),
                source: Box::new(e),
            }
        })?;
        match newer {
            None => Ok(()),
            Some(claim) => Err(Error::Superseded(format!(
                "this run (`{}`) of the job is superseded: run `{}` claimed its checkpoint storage `{}` after it \
                 (a restart elsewhere, or a second process on the same storage), so this run stops before {next_step}; \
                 the newer run goes on",
                self.run,
                claim.run,
                self.store.location()
            ))),
        }
    }
}

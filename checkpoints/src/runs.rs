//! Which run of a job owns its checkpoint storage now.
//!
//! Every run claims the storage before anything of it restores: `_runs/<seq>-<run>`,
//! written with put-if-absent at the next sequence number, so two runs that claim at once
//! get different numbers and the later claim wins. A run that a newer claim superseded —
//! frozen, cut off, a second process started on the same directory — is told so by
//! [`newer_claim`] and must complete no checkpoint and begin no transaction from then on.
//!
//! Why that fences: whatever the old run did *before* the new claim, the new run sees when
//! it restores after claiming (a transactional id it initialised, a checkpoint it
//! completed); whatever it would do *after*, it checks the claims first and stops.

use bytes::Bytes;

use crate::store::{CheckpointPaths, CheckpointStore};
use crate::{Error, Result};

/// Claims kept; older ones are deleted when a run claims.
const KEPT_CLAIMS: usize = 16;

/// Claims tried in a row before giving up (each lost race means another run claimed).
const CLAIM_ATTEMPTS: usize = 32;

/// One run's claim of the storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunClaim {
    /// Its position among the claims: the highest owns the storage.
    pub seq: u64,
    /// The run (attempt id) that claimed.
    pub run: String,
}

/// Claims the storage for `run`: from now on, earlier runs are superseded.
pub fn claim_run(store: &dyn CheckpointStore, paths: &CheckpointPaths, run: &str) -> Result<RunClaim> {
    if run.is_empty() || !run.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(Error::config("run id", format!("`{run}` must be [A-Za-z0-9_-]+")));
    }
    for _ in 0..CLAIM_ATTEMPTS {
        let claims = claims(store, paths)?;
        let seq = claims.last().map_or(1, |c| c.seq + 1);
        match store.put_if_absent(&paths.run_claim(seq, run), Bytes::from(run.to_string())) {
            Ok(()) => {
                let stale = claims.len().saturating_sub(KEPT_CLAIMS - 1);
                for old in &claims[..stale] {
                    // Best effort: a claim left behind only costs a name in a listing.
                    let _ = store.delete(&paths.run_claim(old.seq, &old.run));
                }
                return Ok(RunClaim { seq, run: run.to_string() });
            }
            Err(Error::AlreadyExists { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::Protocol {
        checkpoint: paths.runs_dir(),
        reason: format!(
            "{CLAIM_ATTEMPTS} claims in a row lost to other runs: is a job restarting in a loop?"
        ),
    })
}

/// The newest claim, when it is not `run`'s: `run` is superseded by it. `None` while `run`
/// owns the storage, and where no run ever claimed it (storage of an earlier release).
pub fn newer_claim(
    store: &dyn CheckpointStore,
    paths: &CheckpointPaths,
    run: &str,
) -> Result<Option<RunClaim>> {
    Ok(claims(store, paths)?.pop().filter(|c| c.run != run))
}

/// Every claim, oldest first.
fn claims(store: &dyn CheckpointStore, paths: &CheckpointPaths) -> Result<Vec<RunClaim>> {
    let mut claims: Vec<RunClaim> = store
        .list(&paths.runs_dir())?
        .iter()
        .filter_map(|e| CheckpointPaths::parse_run_claim(e.path.rsplit('/').next()?))
        .collect();
    claims.sort_by_key(|c| c.seq);
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::InMemoryCheckpointStore;

    #[test]
    fn the_newest_claim_owns_the_storage() {
        let store = InMemoryCheckpointStore::new();
        let paths = CheckpointPaths::under("job");
        assert_eq!(newer_claim(&store, &paths, "a1").unwrap(), None, "unclaimed storage fences nobody");
        assert_eq!(claim_run(&store, &paths, "a1").unwrap().seq, 1);
        assert_eq!(newer_claim(&store, &paths, "a1").unwrap(), None);
        let b = claim_run(&store, &paths, "b2").unwrap();
        assert_eq!(b.seq, 2);
        assert_eq!(newer_claim(&store, &paths, "a1").unwrap(), Some(b));
        assert_eq!(newer_claim(&store, &paths, "b2").unwrap(), None);
        assert!(claim_run(&store, &paths, "../x").is_err());
    }

    #[test]
    fn old_claims_are_pruned_and_the_sequence_goes_on() {
        let store = InMemoryCheckpointStore::new();
        let paths = CheckpointPaths::new();
        for i in 0..40 {
            claim_run(&store, &paths, &format!("r{i}")).unwrap();
        }
        let left = claims(&store, &paths).unwrap();
        assert_eq!(left.len(), KEPT_CLAIMS);
        assert_eq!(left.last().unwrap(), &RunClaim { seq: 40, run: "r39".into() });
        assert_eq!(newer_claim(&store, &paths, "r38").unwrap().map(|c| c.seq), Some(40));
    }
}

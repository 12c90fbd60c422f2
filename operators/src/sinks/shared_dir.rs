//! Whether every subtask of a file-based sink sees the same directory. In a cluster a
//! restarted subtask may run on another host, and it publishes or deletes what the dead
//! one pre-committed there: the directory must be storage every task manager shares (NFS,
//! a shared volume). Each subtask writes a marker naming its run under `<dir>/.subtasks/`;
//! when the run's first checkpoint completes (every subtask has started by then), each
//! checks that it sees the markers of all the others: a directory that is each host's own
//! fails the job at once, naming it, instead of losing output at the first failover.

use caudal::{Error, OperatorContext, Result};
use std::path::{Path, PathBuf};

const MARKERS: &str = ".subtasks";

/// One subtask's marker and check.
#[derive(Debug)]
pub(crate) struct SharedDir {
    markers: PathBuf,
    subtask: u32,
    parallelism: u32,
    attempt: String,
    checked: bool,
}

impl SharedDir {
    /// Writes this subtask's marker under `dir` (a sink with one subtask has nothing to
    /// check).
    pub(crate) fn announce(dir: &Path, ctx: &OperatorContext) -> Result<Self> {
        let markers = dir.join(MARKERS);
        let shared = SharedDir {
            markers,
            subtask: ctx.subtask,
            parallelism: ctx.parallelism,
            attempt: ctx.attempt.clone(),
            checked: ctx.parallelism <= 1,
        };
        if !shared.checked {
            std::fs::create_dir_all(&shared.markers)
                .and_then(|()| std::fs::write(shared.markers.join(ctx.subtask.to_string()), &shared.attempt))
                .map_err(|e| Error::io(format!("writing a marker under {}", shared.markers.display()), e))?;
        }
        Ok(shared)
    }

    /// At the first completed checkpoint of the run: fails when this subtask cannot see the
    /// marker of another subtask of the same run.
    pub(crate) fn check_once(&mut self, what: &str) -> Result<()> {
        if self.checked {
            return Ok(());
        }
        let unseen: Vec<u32> = (0..self.parallelism)
            .filter(|s| {
                std::fs::read_to_string(self.markers.join(s.to_string())).ok().as_deref()
                    != Some(&self.attempt)
            })
            .collect();
        if !unseen.is_empty() {
            let dir = self.markers.parent().unwrap_or(&self.markers);
            return Err(Error::config(
                what,
                format!(
                    "{} is not shared by the hosts of this job: subtask {} cannot see what subtask(s) {unseen:?} \
                     of the same run wrote there. In a cluster a file-based sink needs storage every task \
                     manager shares (NFS, a shared volume), or write to object storage (the archive sink, an \
                     s3:// warehouse)",
                    dir.display(),
                    self.subtask
                ),
            ));
        }
        self.checked = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(subtask: u32, parallelism: u32, attempt: &str) -> OperatorContext {
        let mut ctx = OperatorContext::unkeyed("job", "sink", subtask, parallelism);
        ctx.attempt = attempt.into();
        ctx
    }

    #[test]
    fn subtasks_that_share_the_directory_pass_and_one_that_does_not_fails_naming_it() {
        let shared = tempfile::tempdir().unwrap();
        let mut a = SharedDir::announce(shared.path(), &ctx(0, 2, "r1")).unwrap();
        let mut b = SharedDir::announce(shared.path(), &ctx(1, 2, "r1")).unwrap();
        a.check_once("output").unwrap();
        b.check_once("output").unwrap();

        let (here, there) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut a = SharedDir::announce(here.path(), &ctx(0, 2, "r2")).unwrap();
        let _b = SharedDir::announce(there.path(), &ctx(1, 2, "r2")).unwrap();
        let e = a.check_once("output").unwrap_err().to_string();
        assert!(e.contains("not shared") && e.contains("[1]"), "{e}");

        // A marker of an earlier run is not this run's subtask.
        let mut c = SharedDir::announce(shared.path(), &ctx(0, 2, "r3")).unwrap();
        assert!(c.check_once("output").unwrap_err().to_string().contains("[1]"));
    }
}

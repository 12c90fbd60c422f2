//! Whether every subtask of a file-based sink sees the same directory. In a cluster a
//! restarted subtask may run on another host, and it publishes or deletes what the dead
//! one pre-committed there: the directory must be storage every task manager shares (NFS,
//! a shared volume). Each subtask writes a marker naming its run under `<dir>/.subtasks/`;
//! when the run's first checkpoint completes (every subtask has started by then), each
//! checks that it sees the markers of all the others: a directory that is each host's own
//! fails the job at once, naming it, instead of losing output at the first failover.

use caudal::{Error, OperatorContext, Result};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MARKERS: &str = ".subtasks";

/// One subtask's marker and check.
#[derive(Debug)]
pub(crate) struct SharedDir {
    /// The directory the sink writes (named in the error).
    dir: PathBuf,
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
        Self::announce_in(dir, &dir.join(MARKERS), ctx)
    }

    /// As [`Self::announce`], with the markers in `markers` (a folder of `dir` of this sink's
    /// own, where several sinks write into one directory).
    pub(crate) fn announce_in(dir: &Path, markers: &Path, ctx: &OperatorContext) -> Result<Self> {
        let shared = SharedDir {
            dir: dir.to_path_buf(),
            markers: markers.to_path_buf(),
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
        let unseen = self.unseen();
        if !unseen.is_empty() {
            return Err(self.not_shared(what, &unseen));
        }
        self.checked = true;
        Ok(())
    }

    /// Right after every subtask announced (at start): waits up to `wait` for the markers of
    /// all the others, then fails as [`Self::check_once`] does — for a sink whose subtasks
    /// read what the others wrote before any checkpoint (a table's metadata).
    pub(crate) fn wait_for_all(&mut self, what: &str, wait: Duration) -> Result<()> {
        let deadline = Instant::now() + wait;
        while !self.checked {
            let unseen = self.unseen();
            if unseen.is_empty() {
                self.checked = true;
            } else if Instant::now() >= deadline {
                return Err(self.not_shared(what, &unseen));
            } else {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// The subtasks of this run whose markers this subtask cannot see.
    fn unseen(&self) -> Vec<u32> {
        (0..self.parallelism)
            .filter(|s| {
                std::fs::read_to_string(self.markers.join(s.to_string())).ok().as_deref()
                    != Some(&self.attempt)
            })
            .collect()
    }

    fn not_shared(&self, what: &str, unseen: &[u32]) -> Error {
        Error::config(
            what,
            format!(
                "{} is not shared by the hosts of this job: subtask {} cannot see what subtask(s) {unseen:?} \
                 of the same run wrote there. In a cluster a file-based sink needs storage every task \
                 manager shares (NFS, a shared volume), or write to object storage (the archive sink, an \
                 s3:// warehouse)",
                self.dir.display(),
                self.subtask
            ),
        )
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

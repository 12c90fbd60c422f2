//! The local working directory of a job run (RocksDB files), and the cleanup of those that
//! killed runs left behind.
//!
//! Each run's directory holds a lock file that the run keeps locked (`flock`) for as long
//! as it lives; the kernel releases the lock when the process dies, even by SIGKILL. A
//! directory is abandoned exactly when its lock can be taken — which holds across PID
//! namespaces (containers sharing a volume), where a process id says nothing.

use crate::{Error, Result};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The lock file inside a run's directory.
const LOCK_FILE: &str = ".caudal-run.lock";

/// A directory younger than this is never removed: the run creating it may not have locked
/// it yet (directories without a lock file, from Caudal versions before it, are then judged
/// by their process id).
const MIN_AGE: Duration = Duration::from_secs(60);

/// The run's directory, removed when dropped (the job ended).
pub(crate) struct LocalStateDir {
    path: PathBuf,
    /// Held for the run's lifetime: while it is locked, no other run removes the directory.
    _lock: File,
}

impl LocalStateDir {
    /// `<base>/<job>-<pid>-<n>`, `base` = `state_dir` or `<temp>/caudal-state`. Abandoned
    /// directories of earlier runs there are removed first.
    pub(crate) fn create(base: Option<&Path>, job: &str) -> Result<Self> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let base = base.map_or_else(|| std::env::temp_dir().join("caudal-state"), Path::to_path_buf);
        remove_abandoned(&base);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let safe: String =
            job.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
        let path = base.join(format!("{safe}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&path)
            .map_err(|e| Error::io(format!("creating state dir {}", path.display()), e))?;
        let lock_path = path.join(LOCK_FILE);
        let lock = File::create(&lock_path)
            .map_err(|e| Error::io(format!("creating {}", lock_path.display()), e))?;
        // Blocking: a cleanup of another run may hold it for a moment while it looks.
        lock.lock().map_err(|e| Error::io(format!("locking {}", lock_path.display()), e))?;
        Ok(LocalStateDir { path, _lock: lock })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for LocalStateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Removes the directories under `base` whose run is gone.
fn remove_abandoned(base: &Path) {
    for entry in std::fs::read_dir(base).into_iter().flatten().flatten() {
        let dir = entry.path();
        if dir.is_dir() && abandoned(&dir) {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

fn abandoned(dir: &Path) -> bool {
    let old = std::fs::metadata(dir)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age >= MIN_AGE);
    if !old {
        return false;
    }
    match File::open(dir.join(LOCK_FILE)) {
        // Taken only when no live process holds it; dropped (released) right after.
        Ok(lock) => lock.try_lock().is_ok(),
        Err(_) => legacy_abandoned(dir),
    }
}

/// `<job>-<pid>-<n>` without a lock file: abandoned when its process is gone.
fn legacy_abandoned(dir: &Path) -> bool {
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut parts = name.rsplitn(3, '-');
    let (Some(_n), Some(pid), Some(_job)) = (parts.next(), parts.next(), parts.next()) else { return false };
    let proc = Path::new("/proc");
    proc.join("self").exists() && pid.parse::<u32>().is_ok() && !proc.join(pid).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Makes `dir` look two minutes old.
    fn age(dir: &Path) {
        let then = std::time::SystemTime::now() - Duration::from_secs(120);
        File::open(dir).unwrap().set_modified(then).unwrap();
    }

    #[test]
    fn a_locked_directory_survives_the_cleanup_whatever_its_pid_and_an_unlocked_one_goes() {
        let base = tempfile::tempdir().unwrap();
        // A run in another PID namespace: its pid means nothing here, its lock is held.
        let live = base.path().join("job-999999999-0");
        std::fs::create_dir_all(&live).unwrap();
        let held = File::create(live.join(LOCK_FILE)).unwrap();
        held.try_lock().unwrap();
        // A run that was killed: its lock file is there, nobody holds it.
        let dead = base.path().join("job-999999998-0");
        std::fs::create_dir_all(&dead).unwrap();
        File::create(dead.join(LOCK_FILE)).unwrap();
        // A fresh directory of an older version (no lock file): too young to judge.
        let legacy = base.path().join("job-999999997-0");
        std::fs::create_dir_all(&legacy).unwrap();
        // A directory just created by a run that has not locked it yet.
        let starting = base.path().join("job-999999996-0");
        std::fs::create_dir_all(&starting).unwrap();
        File::create(starting.join(LOCK_FILE)).unwrap();
        for dir in [&live, &dead] {
            age(dir);
        }

        let mine = LocalStateDir::create(Some(base.path()), "job").unwrap();
        assert!(live.exists(), "a directory whose lock is held was removed");
        assert!(!dead.exists(), "an abandoned directory was kept");
        assert!(legacy.exists(), "a young directory without a lock file was removed");
        assert!(starting.exists(), "a young directory was removed before its run locked it");
        assert!(mine.path().join(LOCK_FILE).exists());
        // Its own lock keeps it from a second cleanup, and the end of the run removes it.
        remove_abandoned(base.path());
        assert!(mine.path().exists());
        let path = mine.path().to_path_buf();
        drop(mine);
        assert!(!path.exists());
        drop(held);
        remove_abandoned(base.path());
        assert!(!live.exists(), "released by its owner, the directory is abandoned");
    }
}

//! A run that froze itself at a `CAUDAL__TEST_FREEZE_AT` point (SIGSTOP, as a frozen VM or
//! a long GC pause would): wait for it, resume it later, and never let it outlive the test.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::{Duration, Instant};

/// A process that is or will be frozen; killed when dropped.
pub struct Frozen(pub u32);

impl Frozen {
    /// Waits until process `pid` is stopped; panics after `secs`.
    pub fn wait_for(pid: u32, secs: u64, point: &str) -> Frozen {
        let frozen = Frozen(pid);
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !frozen.is_stopped() {
            assert!(Instant::now() < deadline, "the run did not freeze at {point} within {secs} s");
            std::thread::sleep(Duration::from_millis(20));
        }
        frozen
    }

    fn is_stopped(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.0))
            .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T')))
    }

    /// Lets it go on (SIGCONT).
    pub fn resume(&self) {
        let _ = Command::new("kill").args(["-CONT", &self.0.to_string()]).status();
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-KILL", &self.0.to_string()]).status();
    }
}

//! When a task loop tells its chain that wall-clock time moved on (processing-time timers).
//!
//! The chain answers [`ChainNode::processing_time`] with the earliest time it wants next;
//! the loop calls it again at that time. Anything the chain handled since may have
//! registered an earlier timer, so after activity it also asks again within [`RECHECK`].
//! An idle task with no timer wakes up for nothing.
//!
//! [`ChainNode::processing_time`]: super::chain::ChainNode::processing_time

use crate::types::Timestamp;
use crate::Result;
use std::time::{Duration, Instant};

/// Wall-clock time, ms since the epoch: processing time.
pub(crate) fn now_ms() -> Timestamp {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// How soon after activity the chain is asked again.
const RECHECK: Duration = Duration::from_millis(10);

pub(crate) struct ProcessingClock {
    next: Option<Timestamp>,
    asked: Instant,
    /// The chain handled something since it was last asked.
    active: bool,
}

impl ProcessingClock {
    pub(crate) fn new() -> Self {
        ProcessingClock { next: None, asked: Instant::now(), active: true }
    }

    /// The chain handled a message.
    pub(crate) fn touched(&mut self) {
        self.active = true;
    }

    /// Asks the chain (`ask(now)`) when its time is due or it was active a while ago.
    pub(crate) fn tick(&mut self, ask: impl FnOnce(Timestamp) -> Result<Option<Timestamp>>) -> Result<()> {
        let now = now_ms();
        let due = self.next.is_some_and(|at| at <= now);
        if due || (self.active && self.asked.elapsed() >= RECHECK) {
            self.next = ask(now)?;
            self.asked = Instant::now();
            self.active = false;
        }
        Ok(())
    }

    /// How long the loop may wait for input, at most `max`, before it must tick again.
    pub(crate) fn wait(&self, max: Duration) -> Duration {
        let mut wait = max;
        if self.active {
            wait = wait.min(RECHECK);
        }
        if let Some(at) = self.next {
            let ms = at.saturating_sub(now_ms()).max(0);
            wait = wait.min(Duration::from_millis(ms as u64));
        }
        wait
    }
}

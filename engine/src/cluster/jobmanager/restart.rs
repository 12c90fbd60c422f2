//! The restart strategy: exponential backoff between attempts, and a cap on restarts
//! within a sliding window (Flink's exponential-delay strategy with a failure-rate cap).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Settings of the restart strategy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartStrategy {
    /// Wait before the first restart.
    pub initial_backoff: Duration,
    /// The wait doubles after each failure up to this.
    pub max_backoff: Duration,
    /// At most this many restarts within `window`; one more failure fails the job.
    pub max_restarts: u32,
    /// The sliding window of `max_restarts`.
    pub window: Duration,
}

impl Default for RestartStrategy {
    fn default() -> Self {
        RestartStrategy {
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            max_restarts: 10,
            window: Duration::from_secs(600),
        }
    }
}

/// What the strategy decided after a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Restart after this wait.
    RestartAfter(Duration),
    /// Give up: too many restarts within the window.
    GiveUp { restarts: u32 },
}

/// The restarts of one job.
#[derive(Debug)]
pub(crate) struct RestartHistory {
    strategy: RestartStrategy,
    restarts: VecDeque<Instant>,
    backoff: Duration,
}

impl RestartHistory {
    pub(crate) fn new(strategy: RestartStrategy) -> Self {
        let backoff = strategy.initial_backoff;
        RestartHistory { strategy, restarts: VecDeque::new(), backoff }
    }

    /// A failure at `now`: restart (after how long) or give up.
    pub(crate) fn on_failure(&mut self, now: Instant) -> Decision {
        while self.restarts.front().is_some_and(|t| now.duration_since(*t) > self.strategy.window) {
            self.restarts.pop_front();
        }
        if self.restarts.len() as u32 >= self.strategy.max_restarts {
            return Decision::GiveUp { restarts: self.restarts.len() as u32 };
        }
        self.restarts.push_back(now);
        let wait = self.backoff;
        self.backoff = (self.backoff * 2).min(self.strategy.max_backoff);
        Decision::RestartAfter(wait)
    }

    /// The attempt ran well for a while: start the backoff from the beginning again.
    pub(crate) fn on_stable(&mut self) {
        self.backoff = self.strategy.initial_backoff;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_and_the_window_limits_restarts() {
        let strategy = RestartStrategy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(300),
            max_restarts: 3,
            window: Duration::from_secs(10),
        };
        let mut h = RestartHistory::new(strategy);
        let t0 = Instant::now();
        assert_eq!(h.on_failure(t0), Decision::RestartAfter(Duration::from_millis(100)));
        assert_eq!(h.on_failure(t0), Decision::RestartAfter(Duration::from_millis(200)));
        assert_eq!(h.on_failure(t0), Decision::RestartAfter(Duration::from_millis(300)));
        assert_eq!(h.on_failure(t0), Decision::GiveUp { restarts: 3 });
        // Out of the window, restarts are allowed again.
        let later = t0 + Duration::from_secs(11);
        assert_eq!(h.on_failure(later), Decision::RestartAfter(Duration::from_millis(300)));
        h.on_stable();
        assert_eq!(h.on_failure(later), Decision::RestartAfter(Duration::from_millis(100)));
    }
}

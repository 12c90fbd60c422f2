//! Window assigners: which windows a timestamp belongs to.

use caudal::Timestamp;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A half-open event-time interval `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TimeWindow {
    /// First millisecond in the window.
    pub start: Timestamp,
    /// First millisecond after the window.
    pub end: Timestamp,
}

impl TimeWindow {
    /// The last timestamp that belongs to the window; it fires when the watermark reaches it.
    pub fn max_timestamp(&self) -> Timestamp {
        self.end - 1
    }

    /// True when the windows overlap or touch (session windows merge then).
    pub fn intersects(&self, other: &TimeWindow) -> bool {
        self.start <= other.end && self.end >= other.start
    }

    /// The smallest window covering both.
    pub fn cover(&self, other: &TimeWindow) -> TimeWindow {
        TimeWindow { start: self.start.min(other.start), end: self.end.max(other.end) }
    }
}

/// How records are grouped into windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowAssigner {
    /// Fixed-size, non-overlapping windows aligned to the epoch (plus offset).
    Tumbling {
        /// Window length in ms.
        size: i64,
        /// Alignment offset in ms.
        offset: i64,
    },
    /// Fixed-size windows starting every `slide` ms; a record belongs to `size / slide` windows.
    Sliding {
        /// Window length in ms.
        size: i64,
        /// Distance between window starts in ms.
        slide: i64,
    },
    /// Windows per key that close after a gap of inactivity; overlapping sessions merge.
    Session {
        /// Inactivity gap in ms.
        gap: i64,
    },
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

impl WindowAssigner {
    /// Tumbling windows of `size`.
    pub fn tumbling(size: Duration) -> Self {
        WindowAssigner::Tumbling { size: ms(size), offset: 0 }
    }

    /// Sliding windows of `size` every `slide`.
    pub fn sliding(size: Duration, slide: Duration) -> Self {
        WindowAssigner::Sliding { size: ms(size), slide: ms(slide) }
    }

    /// Session windows with inactivity `gap`.
    pub fn session(gap: Duration) -> Self {
        WindowAssigner::Session { gap: ms(gap) }
    }

    /// True for session windows.
    pub fn is_merging(&self) -> bool {
        matches!(self, WindowAssigner::Session { .. })
    }

    /// The windows `ts` belongs to, appended to `out`.
    pub fn assign(&self, ts: Timestamp, out: &mut Vec<TimeWindow>) {
        match *self {
            WindowAssigner::Tumbling { size, offset } => {
                let start = window_start(ts, offset, size);
                out.push(TimeWindow { start, end: start.saturating_add(size) });
            }
            WindowAssigner::Sliding { size, slide } => {
                let last_start = window_start(ts, 0, slide);
                let mut start = last_start;
                while start > ts.saturating_sub(size) {
                    out.push(TimeWindow { start, end: start.saturating_add(size) });
                    start = start.saturating_sub(slide);
                }
            }
            WindowAssigner::Session { gap } => {
                out.push(TimeWindow { start: ts, end: ts.saturating_add(gap) })
            }
        }
    }
}

/// The start of the window of `size` containing `ts` (works for negative timestamps).
pub fn window_start(ts: Timestamp, offset: i64, size: i64) -> Timestamp {
    ts - (ts - offset).rem_euclid(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tumbling_aligns_to_size() {
        let mut w = Vec::new();
        WindowAssigner::tumbling(Duration::from_secs(60)).assign(61_000, &mut w);
        assert_eq!(w, vec![TimeWindow { start: 60_000, end: 120_000 }]);
        w.clear();
        WindowAssigner::tumbling(Duration::from_secs(60)).assign(-1, &mut w);
        assert_eq!(w, vec![TimeWindow { start: -60_000, end: 0 }]);
    }

    #[test]
    fn sliding_gives_size_over_slide_windows() {
        let mut w = Vec::new();
        WindowAssigner::sliding(Duration::from_secs(30), Duration::from_secs(10)).assign(25_000, &mut w);
        w.sort();
        assert_eq!(
            w,
            vec![
                TimeWindow { start: 0, end: 30_000 },
                TimeWindow { start: 10_000, end: 40_000 },
                TimeWindow { start: 20_000, end: 50_000 },
            ]
        );
    }
}

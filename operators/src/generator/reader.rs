//! One subtask's reader over its generator splits.

use super::cursor::SplitCursor;
use super::{GeneratorPosition, SensorGenerator, SensorReading};
use caudal::{Result, SourceOutput, SourcePoll, SourceReader};
use std::time::{Duration, Instant};

struct SplitState {
    split: u32,
    next: u64,
    /// At `next`.
    cursor: SplitCursor,
    end: Option<u64>,
    /// Throttled runs: when the next round is due.
    due: Instant,
    finished: bool,
}

/// Reads the splits `k` with `k % parallelism == subtask`.
pub struct GeneratorReader {
    generator: SensorGenerator,
    splits: Vec<SplitState>,
    pacing: Duration,
    cursor: usize,
}

/// Records emitted from one split before moving to the next (unthrottled runs).
const CHUNK: u64 = 128;

impl GeneratorReader {
    /// A reader for `subtask` of `parallelism`, resuming from `positions` (split, next seq).
    pub fn new(generator: SensorGenerator, subtask: u32, parallelism: u32, positions: &[(u32, u64)]) -> Self {
        let now = Instant::now();
        let splits = (0..generator.splits())
            .filter(|k| k % parallelism == subtask)
            .map(|k| {
                let next = positions.iter().find(|(s, _)| *s == k).map(|(_, n)| *n).unwrap_or(0);
                let end = generator.split_records(k);
                SplitState {
                    split: k,
                    next,
                    cursor: SplitCursor::new(&generator, k, next),
                    end,
                    due: now,
                    finished: end.is_some_and(|e| next >= e),
                }
            })
            .collect();
        let pacing = generator.pacing();
        GeneratorReader { generator, splits, pacing, cursor: 0 }
    }
}

impl SourceReader<SensorReading> for GeneratorReader {
    fn splits(&self) -> usize {
        self.splits.len()
    }

    fn poll(&mut self, out: &mut SourceOutput<'_, SensorReading>) -> Result<SourcePoll> {
        let now = Instant::now();
        let mut earliest: Option<Instant> = None;
        let n = self.splits.len();
        for step in 0..n {
            let i = (self.cursor + step) % n;
            let s = &mut self.splits[i];
            if s.finished {
                out.finish_split(i);
                continue;
            }
            let budget = out.capacity_left() as u64;
            if budget == 0 {
                break;
            }
            let mut take = if self.pacing.is_zero() {
                CHUNK.min(budget)
            } else if s.due <= now {
                // A whole round (one reading per sensor) is due; emit from where we are in it.
                s.cursor.left_in_round().min(budget)
            } else {
                earliest = Some(earliest.map_or(s.due, |e| e.min(s.due)));
                0
            };
            if let Some(end) = s.end {
                take = take.min(end - s.next);
            }
            for _ in 0..take {
                if let Some(r) = s.cursor.next(&self.generator) {
                    out.collect(i, r);
                }
            }
            s.next += take;
            if !self.pacing.is_zero() && take > 0 && s.cursor.left_in_round() == s.cursor.sensors() {
                s.due += self.pacing;
                if s.due + self.pacing * 4 < now {
                    // Far behind (e.g. after a pause): don't burst to catch up.
                    s.due = now;
                }
            }
            if s.end.is_some_and(|e| s.next >= e) {
                s.finished = true;
                out.finish_split(i);
            }
        }
        self.cursor = (self.cursor + 1) % n.max(1);
        if self.splits.iter().all(|s| s.finished) {
            return Ok(SourcePoll::Finished);
        }
        match earliest {
            Some(due) if out.capacity_left() > 0 && self.splits.iter().all(|s| s.finished || s.due > now) => {
                Ok(SourcePoll::Pending(due.saturating_duration_since(now)))
            }
            _ => Ok(SourcePoll::Ready),
        }
    }

    fn position(&mut self) -> Result<Vec<u8>> {
        let p = GeneratorPosition {
            start_ms: self.generator.start_ms(),
            splits: self.splits.iter().map(|s| (s.split, s.next)).collect(),
        };
        serde_json::to_vec(&p).map_err(|e| caudal::Error::Internal(format!("generator position: {e}")))
    }
}

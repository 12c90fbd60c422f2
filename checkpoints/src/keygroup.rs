//! Key groups: the unit of state placement and of rescaling.
//!
//! A key hashes into one of `max_parallelism` key groups (default 128); each subtask of
//! a keyed operator owns one contiguous [`KeyGroupRange`]. The assignment matches
//! Flink's: subtask `i` of `p` owns `[ceil(i*m/p), ceil((i+1)*m/p))`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The default number of key groups of a job.
pub const DEFAULT_MAX_PARALLELISM: u16 = 128;

/// A **half-open** range of key groups `[start, end)`: `start` is owned, `end` is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyGroupRange {
    /// First key group of the range.
    pub start: u16,
    /// One past the last key group of the range.
    pub end: u16,
}

impl KeyGroupRange {
    /// `[start, end)`; an `end` below `start` gives an empty range.
    pub fn new(start: u16, end: u16) -> Self {
        KeyGroupRange { start, end: end.max(start) }
    }

    /// All key groups of a job: `[0, max_parallelism)`.
    pub fn all(max_parallelism: u16) -> Self {
        KeyGroupRange::new(0, max_parallelism)
    }

    /// The range owned by subtask `index` of `parallelism` subtasks.
    pub fn of_subtask(max_parallelism: u16, parallelism: u32, index: u32) -> Self {
        let m = u64::from(max_parallelism);
        let p = u64::from(parallelism.max(1));
        let i = u64::from(index.min(parallelism.saturating_sub(1)));
        let start = (i * m).div_ceil(p);
        let end = ((i + 1) * m).div_ceil(p);
        // Both are <= m <= u16::MAX.
        KeyGroupRange::new(start as u16, end as u16)
    }

    /// The subtask (of `parallelism`) that owns `key_group`.
    pub fn subtask_of(max_parallelism: u16, parallelism: u32, key_group: u16) -> u32 {
        let p = u64::from(parallelism.max(1));
        let m = u64::from(max_parallelism.max(1));
        (u64::from(key_group) * p / m) as u32
    }

    /// Number of key groups in the range.
    pub fn len(&self) -> usize {
        usize::from(self.end - self.start)
    }

    /// Whether the range holds no key group.
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }

    /// Whether `key_group` belongs to the range.
    pub fn contains(&self, key_group: u16) -> bool {
        self.start <= key_group && key_group < self.end
    }

    /// The key groups in both ranges.
    pub fn intersect(&self, other: &KeyGroupRange) -> KeyGroupRange {
        KeyGroupRange::new(self.start.max(other.start), self.end.min(other.end))
    }

    /// Whether the ranges share a key group.
    pub fn intersects(&self, other: &KeyGroupRange) -> bool {
        !self.intersect(other).is_empty()
    }

    /// The key groups in order.
    pub fn iter(&self) -> std::ops::Range<u16> {
        self.start..self.end
    }
}

impl fmt::Display for KeyGroupRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}, {})", self.start, self.end)
    }
}

/// A stable 64-bit hash of serialized key bytes (FNV-1a), for engines that do not bring
/// their own. The same bytes give the same hash on every machine and every run.
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // Final avalanche so that keys differing in the last byte spread over key groups.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h
}

/// The key group of a key hash.
pub fn key_group_of_hash(hash: u64, max_parallelism: u16) -> u16 {
    (hash % u64::from(max_parallelism.max(1))) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subtask_ranges_partition_all_key_groups() {
        for p in 1..=17u32 {
            let mut next = 0u16;
            for i in 0..p {
                let r = KeyGroupRange::of_subtask(128, p, i);
                assert_eq!(r.start, next, "p={p} i={i}");
                for kg in r.iter() {
                    assert_eq!(KeyGroupRange::subtask_of(128, p, kg), i);
                }
                next = r.end;
            }
            assert_eq!(next, 128);
        }
    }

    #[test]
    fn intersect() {
        let a = KeyGroupRange::new(0, 64);
        let b = KeyGroupRange::new(43, 86);
        assert_eq!(a.intersect(&b), KeyGroupRange::new(43, 64));
        assert!(!a.intersects(&KeyGroupRange::new(64, 128)));
        assert_eq!(a.to_string(), "[0, 64)");
    }
}

//! Key groups: the unit of state placement and of rescaling.
//!
//! A key hashes — with [`StableHasher`], independent of process, platform and Rust version —
//! into one of `max_parallelism` key groups (default 128); each subtask of a keyed operator
//! owns one contiguous [`KeyGroupRange`]. Keyed state is stored by key group, so the hash is
//! part of the state format: this is its only home. The assignment matches
//! Flink's: subtask `i` of `p` owns `[ceil(i*m/p), ceil((i+1)*m/p))`.

use std::fmt;
use std::hash::{Hash, Hasher};

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

/// A 64-bit FNV-1a hasher finished with a murmur3 mix: stable across runs and builds.
#[derive(Debug, Clone)]
pub struct StableHasher(u64);

impl Default for StableHasher {
    fn default() -> Self {
        StableHasher(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for StableHasher {
    fn finish(&self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, i: u64) {
        // One multiply-xor round per word keeps integer keys fast.
        self.0 = (self.0 ^ i).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(29);
    }

    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }

    fn write_i64(&mut self, i: i64) {
        self.write_u64(i as u64);
    }

    fn write_i32(&mut self, i: i32) {
        self.write_u64(i as u64);
    }

    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
}

/// The stable hash of a key.
pub fn stable_hash<K: Hash + ?Sized>(key: &K) -> u64 {
    let mut h = StableHasher::default();
    key.hash(&mut h);
    h.finish()
}

/// The key group of `key` among `max_parallelism` groups: its hash modulo the groups,
/// taken with a mask when their number is a power of two (the default 128; the same result,
/// without a 64-bit division per record).
#[inline]
pub fn key_group_of<K: Hash + ?Sized>(key: &K, max_parallelism: u32) -> u16 {
    let groups = u64::from(max_parallelism.max(1));
    let hash = stable_hash(key);
    let group = if groups.is_power_of_two() { hash & (groups - 1) } else { hash % groups };
    group as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key groups of fixed keys, written out: they are part of the state format (a
    /// checkpoint's keyed state is stored by key group), so a toolchain, dependency or code
    /// change that moves any of them breaks every restore, and must fail here first.
    #[test]
    fn golden_key_groups() {
        assert_eq!(key_group_of("sensor-7", 128), key_group_of(&"sensor-7".to_string(), 128));
        let ints: Vec<u16> = (0i64..10).map(|k| key_group_of(&k, 128)).collect();
        let unsigned: Vec<u16> = [0u64, 1, 42, u64::MAX].iter().map(|k| key_group_of(k, 128)).collect();
        let strings: Vec<u16> =
            ["", "a", "sensor-7", "user-12", "ünïcödé"].iter().map(|k| key_group_of(*k, 128)).collect();
        let tuples: Vec<u16> =
            [("user-1".to_string(), 0u8), ("user-1".to_string(), 1), ("user-2".to_string(), 0)]
                .iter()
                .map(|k| key_group_of(k, 128))
                .collect();
        let other_max: Vec<u16> = (0i64..5).map(|k| key_group_of(&k, 64)).collect();
        let hashes: Vec<u64> = [0i64, 1, 1_000_000].iter().map(stable_hash).collect();
        let got = format!("{ints:?} {unsigned:?} {strings:?} {tuples:?} {other_max:?} {hashes:?}");
        assert_eq!(
            got, GOLDEN,
            "the key-group hash changed: checkpoints of earlier builds no longer restore"
        );
    }

    const GOLDEN: &str = "[5, 30, 104, 15, 101, 4, 12, 2, 90, 14] [5, 30, 7, 1] [87, 27, 91, 66, 107] [83, 26, 91] \
                           [5, 30, 40, 15, 37] [10289086932421556613, 2559488295069153438, 1209794114379875312]";

    proptest::proptest! {
        /// The mask taken for a power of two is the modulo, for any number of groups.
        #[test]
        fn key_group_is_the_hash_modulo_the_groups(key: i64, max_parallelism in 0u32..=40_000, shift in 0u32..16) {
            for groups in [max_parallelism, 1 << shift] {
                let want = (stable_hash(&key) % u64::from(groups.max(1))) as u16;
                proptest::prop_assert_eq!(key_group_of(&key, groups), want);
            }
        }
    }

    #[test]
    fn keys_spread_over_groups() {
        let mut counts = [0u32; 128];
        for k in 0u64..12_800 {
            counts[key_group_of(&k, 128) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| c > 50 && c < 150), "{counts:?}");
    }

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

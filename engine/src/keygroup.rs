//! Key groups: the unit of state placement and rescaling.
//!
//! A key hashes (stably, independent of process, platform and Rust version) into one of
//! `max_parallelism` key groups; a contiguous range of key groups belongs to each subtask.

use std::hash::{Hash, Hasher};

/// The default number of key groups.
pub const DEFAULT_MAX_PARALLELISM: u32 = 128;

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

/// The key group of `key` among `max_parallelism` groups.
pub fn key_group_of<K: Hash + ?Sized>(key: &K, max_parallelism: u32) -> u16 {
    (stable_hash(key) % u64::from(max_parallelism.max(1))) as u16
}

/// The subtask (of `parallelism`) that owns `key_group` (Flink's formula: contiguous ranges).
pub fn subtask_for_key_group(key_group: u16, max_parallelism: u32, parallelism: u32) -> u32 {
    (u32::from(key_group) * parallelism / max_parallelism.max(1)).min(parallelism.saturating_sub(1))
}

/// The key groups `[start, end)` owned by `subtask` of `parallelism`.
pub fn key_group_range(subtask: u32, max_parallelism: u32, parallelism: u32) -> std::ops::Range<u16> {
    let start = (subtask * max_parallelism).div_ceil(parallelism);
    let end = ((subtask + 1) * max_parallelism).div_ceil(parallelism);
    start as u16..end.min(max_parallelism) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

    #[test]
    fn keys_spread_over_groups() {
        let mut counts = [0u32; 128];
        for k in 0u64..12_800 {
            counts[key_group_of(&k, 128) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| c > 50 && c < 150), "{counts:?}");
    }

    proptest! {
        #[test]
        fn range_and_owner_agree(p in 1u32..=128, kg in 0u16..128) {
            let owner = subtask_for_key_group(kg, 128, p);
            prop_assert!(owner < p);
            prop_assert!(key_group_range(owner, 128, p).contains(&kg));
        }

        #[test]
        fn ranges_partition_all_groups(p in 1u32..=128) {
            let mut next = 0u16;
            for s in 0..p {
                let r = key_group_range(s, 128, p);
                prop_assert_eq!(r.start, next);
                next = r.end;
            }
            prop_assert_eq!(next, 128);
        }
    }
}

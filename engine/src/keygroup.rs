//! Key groups: the unit of state placement and rescaling, as the engine's operators use them.
//!
//! The hash and the ranges live with the state format in `caudal_checkpoints::keygroup`
//! (one home, one golden test); this module gives them the engine's `u32` parallelism types.

pub use caudal_checkpoints::keygroup::{key_group_of, stable_hash, StableHasher};
use caudal_checkpoints::KeyGroupRange;

/// The default number of key groups.
pub const DEFAULT_MAX_PARALLELISM: u32 = caudal_checkpoints::DEFAULT_MAX_PARALLELISM as u32;

fn max_u16(max_parallelism: u32) -> u16 {
    u16::try_from(max_parallelism).unwrap_or(u16::MAX)
}

/// The subtask (of `parallelism`) that owns `key_group` (Flink's formula: contiguous ranges).
pub fn subtask_for_key_group(key_group: u16, max_parallelism: u32, parallelism: u32) -> u32 {
    KeyGroupRange::subtask_of(max_u16(max_parallelism), parallelism, key_group)
        .min(parallelism.saturating_sub(1))
}

/// The key groups `[start, end)` owned by `subtask` of `parallelism`.
pub fn key_group_range(subtask: u32, max_parallelism: u32, parallelism: u32) -> std::ops::Range<u16> {
    let r = KeyGroupRange::of_subtask(max_u16(max_parallelism), parallelism, subtask);
    r.start..r.end
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

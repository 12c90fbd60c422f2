//! The heap backend's hash of an entry's prefix: seeded at random, and short for short
//! prefixes.
//!
//! A prefix (key group, state, key, namespace) is 15-20 bytes for most jobs' states, and a
//! keyed record hashes one or two. ahash's portable path (no AES on the default target)
//! spends three dependent multiplies on such a slice — the length, the bytes, the finish —
//! and 8 % of the count pipeline's keyed thread. Here a prefix of up to 16 bytes is two
//! word loads and two folded multiplies with the seeds, up to 32 bytes three; longer ones
//! go to ahash. The seeds are random per table, as ahash's are: keys come from the data, so an
//! input must not be able to aim at one bucket (the multiply of seed-mixed words is the
//! construction of foldhash's and ahash's fallback hashes).

/// A random seed and the hash it gives.
#[derive(Debug, Clone)]
pub(super) struct PrefixHasher {
    seeds: [u64; 4],
    long: ahash::RandomState,
}

impl Default for PrefixHasher {
    fn default() -> Self {
        let long = ahash::RandomState::new();
        let seeds = [1u64, 2, 3, 4].map(|i| long.hash_one(i));
        PrefixHasher { seeds, long }
    }
}

/// The high and low halves of the 128-bit product, folded (mixes every input bit into
/// the low bits, which place an entry in the table).
#[inline(always)]
fn folded_multiply(a: u64, b: u64) -> u64 {
    let full = u128::from(a) * u128::from(b);
    (full as u64) ^ ((full >> 64) as u64)
}

#[inline(always)]
fn word(bytes: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(w)
}

#[inline(always)]
fn half_word(bytes: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&bytes[at..at + 4]);
    u64::from(u32::from_le_bytes(w))
}

impl PrefixHasher {
    /// The hash of `bytes`.
    #[inline]
    pub(super) fn hash(&self, bytes: &[u8]) -> u64 {
        let [s0, s1, s2, s3] = self.seeds;
        let len = bytes.len();
        let (lo, hi) = match len {
            // Overlapping loads cover every byte; the length tells overlaps apart.
            8..=16 => (word(bytes, 0), word(bytes, len - 8)),
            17..=32 => {
                let head = folded_multiply(word(bytes, 0) ^ s3, word(bytes, 8) ^ s2);
                (head ^ word(bytes, len - 16), word(bytes, len - 8))
            }
            4..=7 => (half_word(bytes, 0), half_word(bytes, len - 4)),
            1..=3 => {
                let spread =
                    u64::from(bytes[0]) | u64::from(bytes[len / 2]) << 8 | u64::from(bytes[len - 1]) << 16;
                (spread, 0)
            }
            0 => (0, 0),
            _ => return self.long.hash_one(bytes),
        };
        // One multiply leaves the low bits (which place the entry) a near-linear function of
        // the words' high bits when the other word is the same for every key (the key
        // group's and state's bytes); the second spreads every bit over them.
        folded_multiply(folded_multiply(lo ^ s0, hi ^ s1) ^ s2, s3 ^ len as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Prefixes that differ in one byte, or only in length (a zero byte more), hash apart,
    /// at every length the short paths take; and the hash is the same for the same bytes.
    #[test]
    fn one_byte_or_one_length_apart_hashes_apart() {
        let h = PrefixHasher::default();
        for len in 0..=40usize {
            let base: Vec<u8> = (0..len as u8).map(|b| b.wrapping_mul(31)).collect();
            assert_eq!(h.hash(&base), h.hash(&base.clone()));
            let mut seen = HashSet::from([h.hash(&base)]);
            for at in 0..len {
                for flip in [1u8, 0x80] {
                    let mut other = base.clone();
                    other[at] ^= flip;
                    assert!(seen.insert(h.hash(&other)), "length {len}, byte {at} ^ {flip:#x} collides");
                }
            }
            let mut longer = base.clone();
            longer.push(0);
            assert_ne!(h.hash(&base), h.hash(&longer), "length {len} and a zero byte more");
        }
    }

    /// The low bits that place an entry spread 10,000 small keys' prefixes (the count
    /// pipeline's: key group, state, a 4-byte key) over 16,384 buckets at least as evenly as
    /// chance — whether the keys differ in their low bytes or only in their high ones, and
    /// for every seed tried (a hash with one multiply passed for some seeds only).
    #[test]
    fn the_low_bits_spread_small_keys_for_every_seed() {
        for _ in 0..40 {
            let h = PrefixHasher::default();
            for shift in [0, 16] {
                let mut per_bucket = vec![0u32; 1 << 14];
                for key in 0u32..10_000 {
                    let mut prefix = vec![0, 7, 5, b'c', b'o', b'u', b'n', b't', 0, 4];
                    prefix.extend_from_slice(&(key << shift).to_le_bytes());
                    prefix.extend_from_slice(&[0, 0]);
                    per_bucket[(h.hash(&prefix) as usize) & ((1 << 14) - 1)] += 1;
                }
                // Chance leaves about 16,384 × e^(-10,000/16,384) ≈ 8,900 buckets empty
                // (give or take 70); keys bunched in fewer buckets would leave more.
                let empty = per_bucket.iter().filter(|&&n| n == 0).count();
                assert!(empty < 9_300, "keys << {shift}: {empty} empty buckets");
                assert!(
                    per_bucket.iter().all(|&n| n <= 9),
                    "keys << {shift}: a bucket with more than 9 keys"
                );
            }
        }
    }
}

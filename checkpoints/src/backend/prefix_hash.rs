//! The heap backend's hash of an entry's prefix (key group, state, key, namespace): seeded
//! at random, computed from the parts, short for short keys.
//!
//! From the parts, not from the encoded prefix: a lookup would encode the prefix into a
//! buffer piece by piece and read it back at once as words, and a load spanning several
//! recent small stores waits for them to reach the cache (the stall was most of the hash's
//! time, 7 % of the count pipeline's keyed thread). The key's bytes were written when the
//! record came in, the state's name is hashed once into its [`StateId`]'s digest, and an
//! entry restored from encoded bytes is hashed from its decoded parts, the same way.
//!
//! A prefix of up to 16 bytes with no namespace and a key of up to 6 bytes (a short state
//! name and an integer key: most keyed state outside windows) is hashed as its image, the
//! prefix as one 128-bit number put together in registers from the key group, the state's
//! precomputed part and the key's bytes ([`StateKey::prefix_image`]); the table compares
//! it with a slot's prefix as two words too. An encoded prefix of that shape is hashed from
//! the same image, read from its bytes. Every other prefix is hashed from its parts: a key
//! of up to 16 bytes is two word loads and two folded multiplies with the seeds, up
//! to 32 bytes three; longer ones go to ahash (ahash's portable path, the one without AES,
//! spends three dependent multiplies and a call on any slice). The seeds are random per
//! table, as ahash's are: keys come from the data, so an input must not be able to aim at
//! one bucket (the multiply of seed-mixed words is the construction of foldhash's and
//! ahash's fallback hashes).
//!
//! [`StateId`]: crate::keys::StateId
//! [`StateKey::prefix_image`]: crate::keys::StateKey::prefix_image

use crate::keys::{decode_key, has_image, name_digest, small_image, StateKey};

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
    /// The hash of `key`'s prefix.
    #[inline(always)]
    pub(super) fn hash_key(&self, key: &StateKey<'_>) -> u64 {
        match key.prefix_image() {
            Some((image, len)) => self.hash_image(image, len),
            None => self.hash_parts_of(key),
        }
    }

    /// The hash of `key`'s prefix when it has no image ([`StateKey::prefix_image`] is `None`).
    #[inline(always)]
    pub(super) fn hash_parts_of(&self, key: &StateKey<'_>) -> u64 {
        self.hash_parts(key.key_group, key.state.digest(), key.key, key.namespace)
    }

    /// The hash of a prefix of up to 16 bytes, from its image ([`StateKey::prefix_image`]).
    #[inline(always)]
    pub(super) fn hash_image(&self, image: u128, len: usize) -> u64 {
        let [s0, s1, s2, s3] = self.seeds;
        folded_multiply(folded_multiply(image as u64 ^ s0, (image >> 64) as u64 ^ s1) ^ s2, s3 ^ len as u64)
    }

    /// The hash of an encoded prefix: the same as [`Self::hash_key`]'s for the key it
    /// encodes (bytes that encode no key are hashed whole).
    pub(super) fn hash_encoded(&self, prefix: &[u8]) -> u64 {
        match decode_key(prefix) {
            // The prefixes that have an image (`StateKey::prefix_image`).
            Some(k) if k.map_key.is_empty() && has_image(prefix.len(), k.key.len(), k.namespace.len()) => {
                self.hash_image(small_image(prefix), prefix.len())
            }
            Some(k) if k.map_key.is_empty() => {
                self.hash_parts(k.key_group, name_digest(k.state.as_bytes()), k.key, k.namespace)
            }
            _ => self.long.hash_one(prefix),
        }
    }

    #[inline(always)]
    fn hash_parts(&self, key_group: u16, state: u64, key: &[u8], namespace: &[u8]) -> u64 {
        // The key's hash is well mixed: the state's digest and the key group only move it.
        let mut h = self.hash_bytes(key) ^ state ^ (u64::from(key_group) << 48);
        if !namespace.is_empty() {
            let [_, _, s2, s3] = self.seeds;
            h = folded_multiply(h ^ s2, self.hash_bytes(namespace) ^ s3);
        }
        h
    }

    /// The hash of `bytes`.
    #[inline(always)]
    fn hash_bytes(&self, bytes: &[u8]) -> u64 {
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
        // one word's high bits when the other word is the same for every key (keys that
        // share their first bytes); the second spreads every bit over them.
        folded_multiply(folded_multiply(lo ^ s0, hi ^ s1) ^ s2, s3 ^ len as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Byte strings that differ in one byte, or only in length (a zero byte more), hash apart,
    /// at every length the short paths take; and the hash is the same for the same bytes.
    #[test]
    fn one_byte_or_one_length_apart_hashes_apart() {
        let h = PrefixHasher::default();
        for len in 0..=40usize {
            let base: Vec<u8> = (0..len as u8).map(|b| b.wrapping_mul(31)).collect();
            assert_eq!(h.hash_bytes(&base), h.hash_bytes(&base.clone()));
            let mut seen = HashSet::from([h.hash_bytes(&base)]);
            for at in 0..len {
                for flip in [1u8, 0x80] {
                    let mut other = base.clone();
                    other[at] ^= flip;
                    assert!(
                        seen.insert(h.hash_bytes(&other)),
                        "length {len}, byte {at} ^ {flip:#x} collides"
                    );
                }
            }
            let mut longer = base.clone();
            longer.push(0);
            assert_ne!(h.hash_bytes(&base), h.hash_bytes(&longer), "length {len} and a zero byte more");
        }
    }

    /// A key hashes the same from its parts as from its encoded prefix, whatever its
    /// state, key and namespace; bytes that encode no key are hashed too.
    #[test]
    fn parts_and_encoded_prefix_hash_alike() {
        use crate::keys::StateId;
        let h = PrefixHasher::default();
        let states = [StateId::new("count").unwrap(), StateId::new("a-longer-state-name").unwrap()];
        for state in &states {
            for len in [0usize, 1, 3, 4, 7, 8, 9, 16, 17, 31, 32, 33, 100] {
                let key: Vec<u8> = (0..len as u8).collect();
                for namespace in [&b""[..], b"w", b"window-0000000000001"] {
                    let k = StateKey { key_group: 77, state, key: &key, namespace, map_key: &[] };
                    let mut prefix = Vec::new();
                    k.encode_prefix_into(&mut prefix).unwrap();
                    assert_eq!(
                        h.hash_key(&k),
                        h.hash_encoded(&prefix),
                        "{state} key of {len} bytes, namespace {namespace:?}"
                    );
                }
            }
        }
        assert_eq!(h.hash_encoded(&[1, 2]), h.hash_encoded(&[1, 2]));
    }

    /// Keys that differ only in their state, key group or namespace hash apart.
    #[test]
    fn state_key_group_and_namespace_take_part() {
        use crate::keys::StateId;
        let h = PrefixHasher::default();
        let (a, b) = (StateId::new("a").unwrap(), StateId::new("b").unwrap());
        let key = 42u32.to_le_bytes();
        let at = |kg, state, namespace| {
            h.hash_key(&StateKey { key_group: kg, state, key: &key, namespace, map_key: &[] })
        };
        let all = [at(0, &a, b""), at(1, &a, b""), at(0, &b, b""), at(0, &a, b"1"), at(0, &a, b"2")];
        assert_eq!(all.iter().collect::<HashSet<_>>().len(), all.len(), "{all:?}");
    }

    /// The low bits that place an entry spread 10,000 small keys (4 bytes, counting in their
    /// low bytes or only in their high ones, or 1-3 bytes of varint) over 16,384 buckets at
    /// least as evenly as chance, for every seed tried (a hash of one multiply passed for
    /// some seeds only).
    #[test]
    fn the_low_bits_spread_small_keys_for_every_seed() {
        use crate::keys::StateId;
        let state = StateId::new("count").unwrap();
        fn varint(mut n: u32) -> Vec<u8> {
            let mut out = Vec::new();
            while n >= 0x80 {
                out.push(n as u8 | 0x80);
                n >>= 7;
            }
            out.push(n as u8);
            out
        }
        type Encoding = (&'static str, fn(u32) -> Vec<u8>);
        let encodings: [Encoding; 3] = [
            ("4 bytes", |k| k.to_le_bytes().to_vec()),
            ("4 bytes << 16", |k| (k << 16).to_le_bytes().to_vec()),
            ("varint", varint),
        ];
        for _ in 0..40 {
            let h = PrefixHasher::default();
            for (name, encode) in &encodings {
                let mut per_bucket = vec![0u32; 1 << 14];
                for key in 0u32..10_000 {
                    let bytes = encode(key);
                    let hash = h.hash_key(&StateKey::new(5, &state, &bytes));
                    per_bucket[(hash as usize) & ((1 << 14) - 1)] += 1;
                }
                // Chance leaves about 16,384 × e^(-10,000/16,384) ≈ 8,900 buckets empty
                // (give or take 70); keys bunched in fewer buckets would leave more.
                let empty = per_bucket.iter().filter(|&&n| n == 0).count();
                assert!(empty < 9_300, "{name}: {empty} empty buckets");
                assert!(per_bucket.iter().all(|&n| n <= 9), "{name}: a bucket with more than 9 keys");
            }
        }
    }
}

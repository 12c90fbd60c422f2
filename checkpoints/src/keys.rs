//! The byte layout of state keys, shared by every backend.
//!
//! ```text
//! key_group: u16 BE | state: u8 len + name | key: u16 BE len + bytes | namespace: u16 BE len + bytes | map_key: rest
//! ```
//!
//! The key group comes first, so a key-group range is one contiguous range of the
//! sorted key space; the state name, key and namespace are length-prefixed, so no
//! prefix of one state (key, namespace) can be the prefix of another. `map_key` is
//! empty except for map state, whose entries of one (key, namespace) share a prefix.

use std::fmt;
use std::sync::Arc;

use crate::{Error, Result};

/// The name of a registered state (`"window-sums"`), validated and pre-encoded.
///
/// Names are stored in every key, so keep them short; at most 255 bytes.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct StateId {
    /// `len u8 | name`.
    encoded: Arc<[u8]>,
    /// [`name_digest`] of the name: what the heap backend's hash takes for the state.
    digest: u64,
    /// The state's part of a short prefix's image ([`StateKey::prefix_image`]): `encoded`
    /// as [`small_image`] reads it, moved past the key group's two bytes (0 for a name too
    /// long for any such prefix).
    image: u128,
}

/// The longest prefix with an image ([`StateKey::prefix_image`]).
const IMAGE_MAX_LEN: usize = 16;
/// The longest key of a prefix with an image: its length and bytes fill one `u64`.
const IMAGE_MAX_KEY: usize = 6;

/// Whether a prefix of `len` bytes, with a key of `key` bytes and a namespace of `namespace`
/// bytes, has an image: the one rule for [`StateKey::prefix_image`] and for the heap
/// backend's hash of an encoded prefix, which must agree.
#[inline(always)]
pub(crate) fn has_image(len: usize, key: usize, namespace: usize) -> bool {
    len <= IMAGE_MAX_LEN && key <= IMAGE_MAX_KEY && namespace == 0
}

/// A stable 64-bit digest of a state's name (the heap backend hashes a state by it; from an
/// encoded key's name as from a [`StateId`]).
pub(crate) fn name_digest(name: &[u8]) -> u64 {
    crate::keygroup::stable_hash(name)
}

impl StateId {
    /// Validates the name (1..=255 bytes).
    pub fn new(name: &str) -> Result<Self> {
        let len = u8::try_from(name.len())
            .ok()
            .filter(|l| *l > 0)
            .ok_or_else(|| Error::config("state name", format!("`{name}` must be 1-255 bytes")))?;
        let mut encoded = Vec::with_capacity(name.len() + 1);
        encoded.push(len);
        encoded.extend_from_slice(name.as_bytes());
        // A prefix is 6 bytes more than the name's encoding: the key group and two lengths.
        let image = if 6 + encoded.len() <= IMAGE_MAX_LEN { small_image(&encoded) << 16 } else { 0 };
        let digest = name_digest(name.as_bytes());
        Ok(StateId { encoded: encoded.into(), digest, image })
    }

    /// The state's name.
    pub fn name(&self) -> &str {
        // Built from a &str in `new`.
        std::str::from_utf8(&self.encoded[1..]).unwrap_or("?")
    }

    pub(crate) fn encoded(&self) -> &[u8] {
        &self.encoded
    }

    pub(crate) fn digest(&self) -> u64 {
        self.digest
    }
}

impl fmt::Debug for StateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StateId({:?})", self.name())
    }
}

impl fmt::Display for StateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The address of one state entry, borrowed from the caller.
#[derive(Debug, Clone, Copy)]
pub struct StateKey<'a> {
    /// The key group of `key`.
    pub key_group: u16,
    /// Which registered state.
    pub state: &'a StateId,
    /// The serialized record key (the key of `key_by`).
    pub key: &'a [u8],
    /// The serialized namespace (the window), empty for none.
    pub namespace: &'a [u8],
    /// The serialized map key for map state, empty otherwise.
    pub map_key: &'a [u8],
}

impl<'a> StateKey<'a> {
    /// An entry without namespace and map key.
    pub fn new(key_group: u16, state: &'a StateId, key: &'a [u8]) -> Self {
        StateKey { key_group, state, key, namespace: &[], map_key: &[] }
    }

    /// Appends the full encoded key to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<()> {
        self.encode_prefix_into(out)?;
        out.extend_from_slice(self.map_key);
        Ok(())
    }

    /// The full encoded key.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(
            2 + self.state.encoded().len() + 4 + self.key.len() + self.namespace.len() + self.map_key.len(),
        );
        self.encode_into(&mut out)?;
        Ok(out)
    }

    /// Appends the encoding up to and including the namespace (the prefix shared by
    /// all map entries of this key and namespace).
    #[inline]
    pub fn encode_prefix_into(&self, out: &mut Vec<u8>) -> Result<()> {
        let key_len = len_u16(self.key, self.state, "key")?;
        let namespace_len = len_u16(self.namespace, self.state, "namespace")?;
        let state = self.state.encoded();
        out.reserve(2 + state.len() + 2 + self.key.len() + 2 + self.namespace.len());
        out.extend_from_slice(&self.key_group.to_be_bytes());
        out.extend_from_slice(state);
        out.extend_from_slice(&key_len.to_be_bytes());
        out.extend_from_slice(self.key);
        out.extend_from_slice(&namespace_len.to_be_bytes());
        out.extend_from_slice(self.namespace);
        Ok(())
    }

    /// The encoded prefix ([`Self::encode_prefix_into`]'s bytes) as one little-endian
    /// `u128` (its first byte the lowest), with its length; `None` unless it is at most 16
    /// bytes with no namespace and a key of up to 6 bytes. Worked out in registers from the
    /// parts: a short prefix (a state name of up to 9 letters, a small integer key) is
    /// hashed and compared as two words, with no bytes written and read back (see the heap
    /// backend's prefix hash). The namespace's length, zero, is the image's zero bytes.
    #[inline(always)]
    pub(crate) fn prefix_image(&self) -> Option<(u128, usize)> {
        let (state, key) = (self.state.encoded().len(), self.key.len());
        let len = 6 + state + key;
        if !has_image(len, key, self.namespace.len()) {
            return None;
        }
        // The key's length (big-endian) and bytes fill at most 8 bytes; they start right
        // after the state's name, which ends within the first 12 (so the shift is below 128).
        let tail = u64::from((key as u16).swap_bytes()) | small_word(self.key) << 16;
        let image = u128::from(self.key_group.swap_bytes())
            | self.state.image
            | u128::from(tail) << (8 * (2 + state));
        Some((image, len))
    }

    /// Whether `prefix` is this key's encoded prefix ([`Self::encode_prefix_into`]'s
    /// bytes), compared part by part without encoding it. The total length is checked
    /// first: it fixes where every part starts, so no part is looked for, and the prefix is
    /// split at those places once (no part is bounds-checked again).
    #[inline(always)]
    pub fn prefix_matches(&self, prefix: &[u8]) -> bool {
        let (state, key, namespace) = (self.state.encoded(), self.key, self.namespace);
        if prefix.len() != 6 + state.len() + key.len() + namespace.len() {
            return false;
        }
        let Some((group, rest)) = prefix.split_first_chunk::<2>() else { return false };
        let (stored_state, rest) = rest.split_at(state.len());
        let Some((key_len, rest)) = rest.split_first_chunk::<2>() else { return false };
        let (stored_key, rest) = rest.split_at(key.len());
        let Some((namespace_len, stored_namespace)) = rest.split_first_chunk::<2>() else { return false };
        // A part longer than a u16 holds never matches a stored length.
        *group == self.key_group.to_be_bytes()
            && usize::from(u16::from_be_bytes(*key_len)) == key.len()
            && usize::from(u16::from_be_bytes(*namespace_len)) == namespace.len()
            && bytes_eq(stored_state, state)
            && bytes_eq(stored_key, key)
            && bytes_eq(stored_namespace, namespace)
    }
}

/// `a == b`, without a call to `memcmp` for slices of up to 32 bytes — the size of most
/// keys' parts and prefixes (a prefix is 16 bytes with a 6-byte state name and a small
/// integer key, 19 with "last-seen"), for which the call costs more than the comparison
/// (two overlapping loads per side here). Always inlined: at a call the lengths are often
/// known equal already, or the slice empty, and the dispatch below then folds away.
#[inline(always)]
pub(crate) fn bytes_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    match n {
        0 => true,
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        4..=7 => word::<4>(a, 0) == word::<4>(b, 0) && word::<4>(a, n - 4) == word::<4>(b, n - 4),
        8..=16 => word::<8>(a, 0) == word::<8>(b, 0) && word::<8>(a, n - 8) == word::<8>(b, n - 8),
        17..=32 => word::<16>(a, 0) == word::<16>(b, 0) && word::<16>(a, n - 16) == word::<16>(b, n - 16),
        _ => a == b,
    }
}

/// Up to 16 bytes as a little-endian `u128` (the first byte the lowest, zeros above the
/// last), read with at most two loads that may overlap (the bytes they share are the same).
/// Bytes past the 16th are not taken.
pub(crate) fn small_image(b: &[u8]) -> u128 {
    let n = b.len().min(16);
    if n <= 8 {
        return u128::from(small_word(b));
    }
    let (lo, hi) = (u64::from_le_bytes(word::<8>(b, 0)), u64::from_le_bytes(word::<8>(b, n - 8)));
    u128::from(lo) | u128::from(hi) << (8 * (n - 8))
}

/// Up to 8 bytes as a little-endian `u64`, as [`small_image`] reads them (bytes past the
/// 8th are not taken).
#[inline(always)]
pub(crate) fn small_word(b: &[u8]) -> u64 {
    let n = b.len().min(8);
    match n {
        0 => 0,
        1..=3 => {
            u64::from(b[0]) | u64::from(b[n / 2]) << (8 * (n / 2)) | u64::from(b[n - 1]) << (8 * (n - 1))
        }
        _ => {
            let (lo, hi) = (u32::from_le_bytes(word::<4>(b, 0)), u32::from_le_bytes(word::<4>(b, n - 4)));
            u64::from(lo) | u64::from(hi) << (8 * (n - 4))
        }
    }
}

/// `dst.copy_from_slice(src)`, without a call to `memcpy` for up to 16 bytes (a small
/// value overwritten in place, see [`bytes_eq`]).
#[inline]
pub(crate) fn copy_small(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    if dst.len() != n {
        return dst.copy_from_slice(src);
    }
    match n {
        0 => {}
        1..=3 => {
            dst[0] = src[0];
            dst[n / 2] = src[n / 2];
            dst[n - 1] = src[n - 1];
        }
        4..=7 => {
            dst[..4].copy_from_slice(&word::<4>(src, 0));
            dst[n - 4..].copy_from_slice(&word::<4>(src, n - 4));
        }
        8..=16 => {
            dst[..8].copy_from_slice(&word::<8>(src, 0));
            dst[n - 8..].copy_from_slice(&word::<8>(src, n - 8));
        }
        _ => dst.copy_from_slice(src),
    }
}

/// The `N` bytes of `s` at `at` (in bounds: the callers' lengths say so).
#[inline]
fn word<const N: usize>(s: &[u8], at: usize) -> [u8; N] {
    let mut w = [0u8; N];
    w.copy_from_slice(&s[at..at + N]);
    w
}

/// The length of a key part, which is stored as a `u16`.
#[inline]
fn len_u16(bytes: &[u8], state: &StateId, what: &str) -> Result<u16> {
    u16::try_from(bytes.len()).map_err(|_| Error::Codec {
        state: state.name().to_string(),
        reason: format!("{what} is {} bytes, the limit is 65535", bytes.len()),
    })
}

/// A decoded key, borrowing from the encoded bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodedKey<'a> {
    /// Key group.
    pub key_group: u16,
    /// State name.
    pub state: &'a str,
    /// Serialized record key.
    pub key: &'a [u8],
    /// Serialized namespace.
    pub namespace: &'a [u8],
    /// Serialized map key (empty for non-map state).
    pub map_key: &'a [u8],
}

/// Decodes an encoded key; `None` when the bytes do not follow the layout.
pub fn decode_key(bytes: &[u8]) -> Option<DecodedKey<'_>> {
    let (kg, rest) = bytes.split_first_chunk::<2>()?;
    let (name_len, rest) = rest.split_first()?;
    let name_len = usize::from(*name_len);
    if rest.len() < name_len {
        return None;
    }
    let (name, rest) = rest.split_at(name_len);
    let state = std::str::from_utf8(name).ok()?;
    let (key, rest) = split_len_prefixed(rest)?;
    let (namespace, map_key) = split_len_prefixed(rest)?;
    Some(DecodedKey { key_group: u16::from_be_bytes(*kg), state, key, namespace, map_key })
}

fn split_len_prefixed(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = bytes.split_first_chunk::<2>()?;
    let len = usize::from(u16::from_be_bytes(*len));
    if rest.len() < len {
        return None;
    }
    Some(rest.split_at(len))
}

/// The length of an encoded key's prefix: everything up to and including the namespace
/// (what the entries of one map state share); `None` when the bytes do not follow the
/// layout. No prefix is a proper prefix of another (every part is length-prefixed), so
/// full keys sort by prefix first, then by map key.
pub fn prefix_len(bytes: &[u8]) -> Option<usize> {
    let name_len = usize::from(*bytes.get(2)?);
    let mut at = 3 + name_len;
    for _ in 0..2 {
        let len = bytes.get(at..at + 2)?;
        at += 2 + usize::from(u16::from_be_bytes([len[0], len[1]]));
    }
    (at <= bytes.len()).then_some(at)
}

/// The encoded key group of a key (its first two bytes).
pub fn key_group_of_encoded(bytes: &[u8]) -> Option<u16> {
    bytes.first_chunk::<2>().map(|b| u16::from_be_bytes(*b))
}

/// Lower bound (inclusive) of the keys of key group `kg`.
pub fn key_group_lower_bound(kg: u16) -> [u8; 2] {
    kg.to_be_bytes()
}

/// Upper bound (exclusive) of the keys of key group `kg`: the start of `kg + 1`, or
/// `None` past the last group (`u16::MAX`).
pub fn key_group_upper_bound(kg: u16) -> Option<[u8; 2]> {
    kg.checked_add(1).map(u16::to_be_bytes)
}

/// The smallest byte string greater than every string starting with `prefix`, or
/// `None` when there is none (all bytes 0xff).
pub fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut out = prefix.to_vec();
    while let Some(last) = out.pop() {
        if last < 0xff {
            out.push(last + 1);
            return Some(out);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let s = StateId::new("sums").unwrap();
        let k = StateKey { key_group: 77, state: &s, key: b"sensor-1", namespace: b"w", map_key: b"mk" };
        let enc = k.encode().unwrap();
        let d = decode_key(&enc).unwrap();
        assert_eq!(d.key_group, 77);
        assert_eq!(d.state, "sums");
        assert_eq!(d.key, b"sensor-1");
        assert_eq!(d.namespace, b"w");
        assert_eq!(d.map_key, b"mk");
    }

    /// A short prefix's image is its encoded bytes, read as [`small_image`] reads them, for
    /// every state name, key and key group whose prefix has one; and exactly the prefixes
    /// of at most 16 bytes, with no namespace and a key of up to 6 bytes, have one.
    #[test]
    fn a_short_prefix_image_is_its_encoded_bytes() {
        let states =
            ["a", "count", "last-seen", "ninechars", "a-longer-state-name"].map(|n| StateId::new(n).unwrap());
        for state in &states {
            for key_len in 0..=10u8 {
                let key: Vec<u8> = (0..key_len).map(|i| 0xf0 ^ i.wrapping_mul(37)).collect();
                for namespace in [&b""[..], b"w"] {
                    for key_group in [0u16, 1, 0x1234, 0xff00, u16::MAX] {
                        let k = StateKey { key_group, state, key: &key, namespace, map_key: &[] };
                        let mut prefix = Vec::new();
                        k.encode_prefix_into(&mut prefix).unwrap();
                        let fits = prefix.len() <= 16 && key.len() <= 6 && namespace.is_empty();
                        let expected = fits.then(|| (small_image(&prefix), prefix.len()));
                        assert_eq!(k.prefix_image(), expected, "{state} key {key:?} namespace {namespace:?}");
                        if fits {
                            let image = small_image(&prefix).to_le_bytes();
                            assert_eq!(&image[..prefix.len()], &prefix[..]);
                            assert!(image[prefix.len()..].iter().all(|b| *b == 0));
                        }
                    }
                }
            }
        }
    }

    /// Up to 16 bytes read as one little-endian number, byte by byte the same at every
    /// length (the loads overlap differently at each); bytes past 16 are not taken.
    #[test]
    fn small_image_reads_every_byte_once() {
        let bytes: Vec<u8> = (1..=20).collect();
        for n in 0..=20 {
            let expected = bytes[..n.min(16)].iter().rev().fold(0u128, |acc, b| acc << 8 | u128::from(*b));
            assert_eq!(small_image(&bytes[..n]), expected, "{n} bytes");
            if n <= 8 {
                assert_eq!(u128::from(small_word(&bytes[..n])), expected, "{n} bytes as a word");
            }
        }
    }

    #[test]
    fn state_names_do_not_collide_as_prefixes() {
        let a = StateId::new("a").unwrap();
        let ab = StateId::new("ab").unwrap();
        let ka = StateKey::new(1, &a, b"bx").encode().unwrap();
        let kab = StateKey::new(1, &ab, b"x").encode().unwrap();
        let mut pa = Vec::new();
        StateKey::new(1, &a, b"").encode_into(&mut pa).unwrap();
        assert!(!kab.starts_with(&ka));
        assert_ne!(decode_key(&ka).unwrap().state, decode_key(&kab).unwrap().state);
    }

    #[test]
    fn prefix_length_ends_after_the_namespace() {
        let s = StateId::new("sums").unwrap();
        let k = StateKey { key_group: 77, state: &s, key: b"sensor-1", namespace: b"w", map_key: b"mk" };
        let enc = k.encode().unwrap();
        let mut prefix = Vec::new();
        k.encode_prefix_into(&mut prefix).unwrap();
        assert_eq!(prefix_len(&enc), Some(prefix.len()));
        assert_eq!(prefix_len(&prefix), Some(prefix.len()));
        for cut in 0..prefix.len() {
            assert_eq!(prefix_len(&prefix[..cut]), None, "cut at {cut}");
        }
    }

    proptest::proptest! {
        /// A key's prefix matches its own encoding and no other key's, whatever the parts.
        #[test]
        fn a_prefix_matches_exactly_its_own_encoding(
            a in (0u16..3, 0usize..3, proptest::collection::vec(0u8..3, 0..3), proptest::collection::vec(0u8..3, 0..3)),
            b in (0u16..3, 0usize..3, proptest::collection::vec(0u8..3, 0..3), proptest::collection::vec(0u8..3, 0..3)),
        ) {
            let ids = [StateId::new("a").unwrap(), StateId::new("ab").unwrap(), StateId::new("b").unwrap()];
            let key = |(kg, s, k, n): &(u16, usize, Vec<u8>, Vec<u8>)| -> Vec<u8> {
                let mut p = Vec::new();
                let sk = StateKey { key_group: *kg, state: &ids[*s], key: k, namespace: n, map_key: b"m" };
                sk.encode_prefix_into(&mut p).unwrap();
                p
            };
            let sk = StateKey { key_group: a.0, state: &ids[a.1], key: &a.2, namespace: &a.3, map_key: b"" };
            let (pa, pb) = (key(&a), key(&b));
            proptest::prop_assert!(sk.prefix_matches(&pa));
            proptest::prop_assert_eq!(sk.prefix_matches(&pb), pa == pb);
            for cut in 0..pa.len() {
                proptest::prop_assert!(!sk.prefix_matches(&pa[..cut]), "cut at {}", cut);
            }
            let mut longer = pa.clone();
            longer.push(0);
            proptest::prop_assert!(!sk.prefix_matches(&longer));
        }

        /// `bytes_eq` is `==` at every length, above all its load edges (3/4, 7/8, 16/17, 32/33).
        #[test]
        fn bytes_eq_is_slice_equality(
            a in proptest::collection::vec(0u8..2, 0..40),
            flip in proptest::option::of(0usize..40),
            cut in proptest::option::of(0usize..40),
        ) {
            let mut b = a.clone();
            if let Some(i) = flip.filter(|i| *i < b.len()) {
                b[i] ^= 1;
            }
            if let Some(n) = cut.filter(|n| *n < b.len()) {
                b.truncate(n);
            }
            proptest::prop_assert_eq!(bytes_eq(&a, &b), a == b);
            proptest::prop_assert!(bytes_eq(&a, &a));
        }

        /// `copy_small` is `copy_from_slice` at every length, above all its load edges.
        #[test]
        fn copy_small_copies_every_byte(src in proptest::collection::vec(proptest::num::u8::ANY, 0..40)) {
            let mut dst = vec![0xAA; src.len()];
            copy_small(&mut dst, &src);
            proptest::prop_assert_eq!(dst, src);
        }
    }

    #[test]
    fn successor() {
        assert_eq!(prefix_successor(&[1, 2]), Some(vec![1, 3]));
        assert_eq!(prefix_successor(&[1, 0xff]), Some(vec![2]));
        assert_eq!(prefix_successor(&[0xff]), None);
    }
}

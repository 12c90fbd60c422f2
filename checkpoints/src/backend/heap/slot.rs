//! One bucket of a key group's table: the entries under one prefix (key group, state, key,
//! namespace), held in the bucket itself when they are small.
//!
//! A prefix and its value of up to [`INLINE`] bytes together (a short state name, a small
//! key and a counter, a timestamp or a small accumulator) live in the slot: a lookup reads
//! one cache line and nothing else, and the table is all the memory the state takes — for
//! 10,000 such keys half a megabyte, which stays in a core's cache next to the records
//! streaming through. Anything bigger, and map state, is spilled: the slot holds an index
//! into its group's [`Spill`], where the bytes are kept as before (the prefix followed by
//! the value in one allocation, or a map's entries in map-key order). A slot that has
//! spilled stays spilled.

use std::collections::BTreeMap;
use std::num::NonZeroU32;

use crate::backend::probe_table::Hashed;
use crate::keys::copy_small;

/// The bytes a slot holds itself.
pub(super) const INLINE: usize = 26;

/// [`Slot::len`] of a slot whose bytes are in its group's [`Spill`].
const SPILLED: u8 = u8::MAX;

/// How a value changes.
#[derive(Clone, Copy)]
pub(super) enum Change<'a> {
    /// Replaced by these bytes.
    Set(&'a [u8]),
    /// These bytes added at its end (a framed list element).
    Append(&'a [u8]),
}

impl Change<'_> {
    /// Applies the change to the bytes from `start` on (the value's, after its prefix).
    fn apply(self, bytes: &mut Vec<u8>, start: usize) {
        match self {
            // In place when the length is unchanged; the capacity is kept otherwise.
            Change::Set(v) if bytes.len().checked_sub(start) == Some(v.len()) => {
                copy_small(&mut bytes[start..], v)
            }
            Change::Set(v) => {
                bytes.truncate(start);
                bytes.extend_from_slice(v);
            }
            Change::Append(v) => bytes.extend_from_slice(v),
        }
    }

    /// The value's length after the change, from `len` bytes.
    fn len_after(self, len: usize) -> usize {
        match self {
            Change::Set(v) => v.len(),
            Change::Append(v) => len + v.len(),
        }
    }
}

/// What is stored under one prefix, with the prefix's hash tag ([`tag`]: what the table
/// places and compares it by). 32 bytes and aligned to them: one bucket of the table, never
/// across two cache lines.
#[derive(Debug, Clone)]
#[repr(align(32))]
pub(super) struct Slot {
    hash: NonZeroU32,
    /// Inline: the prefix's length in `inline`.
    prefix_len: u8,
    /// Inline: the prefix's and the value's length in `inline`. [`SPILLED`]: `inline` starts
    /// with the index of the slot's body in its group's [`Spill`] (a little-endian u32).
    len: u8,
    inline: [u8; INLINE],
}

const _: () = assert!(std::mem::size_of::<Option<Slot>>() == 32);

/// The low 32 bits of a prefix's hash with the top one set: never zero (so that an empty
/// bucket costs no byte of its own), and the same bucket in any table of up to 2^31.
/// Every hash the table is given goes through it.
#[inline]
pub(super) fn tagged(hash: u64) -> u64 {
    hash | 1 << 31
}

impl Hashed for Slot {
    #[inline]
    fn hash(&self) -> u32 {
        self.hash.get()
    }
}

/// The bytes of a spilled slot.
#[derive(Debug, Clone)]
enum Body {
    /// The one entry whose full key is the prefix (value, list, reducing state), too big to
    /// be inline: the prefix followed by the value.
    Value { prefix_len: u32, bytes: Vec<u8> },
    /// Map state: entries `prefix + map key` in map-key order (the empty map key is the
    /// prefix itself).
    Map(Box<MapSlot>),
    /// An index no slot holds (on the free list).
    Free,
}

#[derive(Debug, Clone)]
struct MapSlot {
    prefix: Vec<u8>,
    entries: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// A group's spilled bodies by index; freed indexes are given out again.
#[derive(Debug, Clone, Default)]
pub(super) struct Spill {
    bodies: Vec<Body>,
    free: Vec<u32>,
}

/// What a spilled slot names when its index is not in the spill (never, by construction).
static MISSING: Body = Body::Free;

impl Spill {
    fn add(&mut self, body: Body) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.bodies[i as usize] = body;
                i
            }
            None => {
                self.bodies.push(body);
                // A group holds fewer than 2^32 entries: its table indexes buckets by u32.
                (self.bodies.len() - 1) as u32
            }
        }
    }

    fn get(&self, i: u32) -> &Body {
        self.bodies.get(i as usize).unwrap_or(&MISSING)
    }

    fn get_mut(&mut self, i: u32) -> Option<&mut Body> {
        self.bodies.get_mut(i as usize)
    }

    fn release(&mut self, i: u32) {
        if let Some(body) = self.bodies.get_mut(i as usize) {
            *body = Body::Free;
            self.free.push(i);
        }
    }
}

impl Slot {
    /// The slot of `prefix` with the value at `map_key` made by `change` from nothing.
    pub(super) fn new(
        hash: u64,
        prefix: &[u8],
        map_key: &[u8],
        change: Change<'_>,
        spill: &mut Spill,
    ) -> Slot {
        let hash = NonZeroU32::new(tagged(hash) as u32).unwrap_or(NonZeroU32::MIN);
        let mut slot = Slot { hash, prefix_len: 0, len: 0, inline: [0; INLINE] };
        if !map_key.is_empty() {
            let mut value = Vec::new();
            change.apply(&mut value, 0);
            let entries = BTreeMap::from([(map_key.to_vec(), value)]);
            slot.spilled_to(spill.add(Body::Map(Box::new(MapSlot { prefix: prefix.to_vec(), entries }))));
            return slot;
        }
        if prefix.len() <= INLINE {
            slot.inline[..prefix.len()].copy_from_slice(prefix);
            (slot.prefix_len, slot.len) = (prefix.len() as u8, prefix.len() as u8);
        } else {
            let bytes = prefix.to_vec();
            // A prefix is a few hundred bytes at most (a state name is ≤ 255 bytes, a key and
            // a namespace ≤ 65,535 each).
            slot.spilled_to(spill.add(Body::Value { prefix_len: prefix.len() as u32, bytes }));
        }
        slot.change(map_key, change, spill);
        slot
    }

    /// The index of its body in the spill, when spilled.
    #[inline]
    fn spilled(&self) -> Option<u32> {
        (self.len == SPILLED)
            .then(|| u32::from_le_bytes([self.inline[0], self.inline[1], self.inline[2], self.inline[3]]))
    }

    fn spilled_to(&mut self, i: u32) {
        self.len = SPILLED;
        self.inline[..4].copy_from_slice(&i.to_le_bytes());
    }

    /// Moves its inline bytes to the spill.
    #[cold]
    #[inline(never)]
    fn spill(&mut self, spill: &mut Spill) -> u32 {
        let body = Body::Value {
            prefix_len: u32::from(self.prefix_len),
            bytes: self.inline[..usize::from(self.len)].to_vec(),
        };
        let i = spill.add(body);
        self.spilled_to(i);
        i
    }

    /// Whether the slot's prefix is the one `image` holds (`len` bytes of it, 8 to 16, see
    /// [`StateKey::prefix_image`]); `None` when the prefix is spilled. Two word loads: the
    /// inline bytes run past any such prefix, and the second word's bytes past `len` (the
    /// value's) are masked off.
    ///
    /// [`StateKey::prefix_image`]: crate::keys::StateKey::prefix_image
    #[inline(always)]
    pub(super) fn prefix_is(&self, image: u128, len: usize) -> Option<bool> {
        if self.len == SPILLED {
            return None;
        }
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&self.inline[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let high_mask = u64::MAX.checked_shr(8 * 16usize.saturating_sub(len) as u32).unwrap_or(0);
        Some(
            usize::from(self.prefix_len) == len
                && word(0) == image as u64
                && word(8) & high_mask == (image >> 64) as u64,
        )
    }

    #[inline(always)]
    pub(super) fn prefix<'a>(&'a self, spill: &'a Spill) -> &'a [u8] {
        match self.spilled() {
            None => &self.inline[..usize::from(self.prefix_len)],
            Some(i) => match spill.get(i) {
                Body::Value { prefix_len, bytes } => &bytes[..*prefix_len as usize],
                Body::Map(m) => &m.prefix,
                Body::Free => &[],
            },
        }
    }

    /// The value at `map_key`.
    #[inline(always)]
    pub(super) fn get<'a>(&'a self, map_key: &[u8], spill: &'a Spill) -> Option<&'a [u8]> {
        match self.spilled() {
            None => {
                map_key.is_empty().then(|| &self.inline[usize::from(self.prefix_len)..usize::from(self.len)])
            }
            Some(i) => match spill.get(i) {
                Body::Value { prefix_len, bytes } => {
                    map_key.is_empty().then(|| &bytes[*prefix_len as usize..])
                }
                Body::Map(m) => m.entries.get(map_key).map(Vec::as_slice),
                Body::Free => None,
            },
        }
    }

    /// Changes the value at `map_key`, created empty if absent.
    #[inline(always)]
    pub(super) fn change(&mut self, map_key: &[u8], change: Change<'_>, spill: &mut Spill) {
        let i = match self.spilled() {
            None => {
                let (start, end) = (usize::from(self.prefix_len), usize::from(self.len));
                let new_end = start + change.len_after(end - start);
                if map_key.is_empty() && new_end <= INLINE {
                    match change {
                        Change::Set(v) => copy_small(&mut self.inline[start..new_end], v),
                        Change::Append(v) => self.inline[end..new_end].copy_from_slice(v),
                    }
                    self.len = new_end as u8;
                    return;
                }
                self.spill(spill)
            }
            Some(i) => i,
        };
        change_spilled(spill, i, map_key, change);
    }

    /// Removes `map_key`; whether the slot is empty afterwards (then the caller takes it out
    /// of the table and [`Self::release`]s it).
    pub(super) fn remove(&mut self, map_key: &[u8], spill: &mut Spill) -> bool {
        match self.spilled().and_then(|i| spill.get_mut(i)) {
            Some(Body::Map(m)) => {
                m.entries.remove(map_key);
                m.entries.is_empty()
            }
            _ => map_key.is_empty(),
        }
    }

    /// Gives its spilled body back (a slot taken out of its table).
    pub(super) fn release(self, spill: &mut Spill) {
        if let Some(i) = self.spilled() {
            spill.release(i);
        }
    }

    /// Every `(map key, value)` in map-key order.
    pub(super) fn entries<'a>(
        &'a self,
        spill: &'a Spill,
    ) -> Box<dyn Iterator<Item = (&'a [u8], &'a [u8])> + 'a> {
        match self.spilled().map(|i| spill.get(i)) {
            Some(Body::Map(m)) => Box::new(m.entries.iter().map(|(k, v)| (k.as_slice(), v.as_slice()))),
            _ => Box::new(self.get(&[], spill).map(|v| (&[][..], v)).into_iter()),
        }
    }

    /// The bytes of its entries' full keys and values.
    pub(super) fn bytes(&self, spill: &Spill) -> u64 {
        let prefix = self.prefix(spill).len();
        self.entries(spill).map(|(mk, v)| (prefix + mk.len() + v.len()) as u64).sum()
    }

    /// Where its value's bytes are when they are not in the slot (for a prefetch).
    pub(super) fn spilled_bytes<'a>(&self, spill: &'a Spill) -> Option<&'a [u8]> {
        match self.spilled().map(|i| spill.get(i)) {
            Some(Body::Value { bytes, .. }) => Some(bytes),
            _ => None,
        }
    }
}

/// [`Slot::change`] of a spilled body.
fn change_spilled(spill: &mut Spill, i: u32, map_key: &[u8], change: Change<'_>) {
    let Some(body) = spill.get_mut(i) else { return };
    if let Body::Value { prefix_len, bytes } = body {
        let prefix_len = *prefix_len as usize;
        if map_key.is_empty() {
            return change.apply(bytes, prefix_len);
        }
        let value = bytes.split_off(prefix_len);
        let prefix = std::mem::take(bytes);
        *body = Body::Map(Box::new(MapSlot { prefix, entries: BTreeMap::from([(Vec::new(), value)]) }));
    }
    if let Body::Map(m) = body {
        // Not `entry`: it would need an owned key on every hit.
        if let Some(v) = m.entries.get_mut(map_key) {
            change.apply(v, 0);
        } else {
            let mut v = Vec::new();
            change.apply(&mut v, 0);
            m.entries.insert(map_key.to_vec(), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(slot: &Slot, spill: &Spill) -> Vec<(Vec<u8>, Vec<u8>)> {
        slot.entries(spill).map(|(k, v)| (k.to_vec(), v.to_vec())).collect()
    }

    /// A slot against a model (its prefix and a map of values) through every way a slot
    /// changes: inline, growing past [`INLINE`] by a set or an append, turned into a map,
    /// entries removed; the spill's indexes are given out again once released.
    #[test]
    fn a_slot_keeps_its_prefix_and_values_inline_and_spilled() {
        for prefix_len in [0, 1, 10, INLINE - 1, INLINE, INLINE + 1, 300] {
            let prefix: Vec<u8> = (0..prefix_len).map(|i| i as u8 ^ 0x5a).collect();
            let mut spill = Spill::default();
            let mut slot = Slot::new(7, &prefix, &[], Change::Set(b"ab"), &mut spill);
            let mut model = BTreeMap::from([(Vec::new(), b"ab".to_vec())]);
            let steps: [(&[u8], Change<'_>); 7] = [
                (&[], Change::Set(b"")),
                (&[], Change::Append(b"xyz")),
                (&[], Change::Append(&[9; 20])),
                (&[], Change::Set(b"small again")),
                (b"k2", Change::Set(b"map")),
                (b"k1", Change::Append(b"m")),
                (&[], Change::Set(b"v")),
            ];
            for (map_key, change) in steps {
                slot.change(map_key, change, &mut spill);
                let value = model.entry(map_key.to_vec()).or_default();
                match change {
                    Change::Set(v) => *value = v.to_vec(),
                    Change::Append(v) => value.extend_from_slice(v),
                }
                assert_eq!(slot.prefix(&spill), prefix.as_slice(), "prefix of {prefix_len}");
                assert_eq!(values(&slot, &spill), model.clone().into_iter().collect::<Vec<_>>());
                for (k, v) in &model {
                    assert_eq!(slot.get(k, &spill), Some(v.as_slice()));
                }
                let bytes: usize = model.iter().map(|(k, v)| prefix.len() + k.len() + v.len()).sum();
                assert_eq!(slot.bytes(&spill), bytes as u64);
            }
            assert!(!slot.remove(b"k2", &mut spill));
            assert!(!slot.remove(b"k1", &mut spill));
            assert!(slot.remove(&[], &mut spill));
            let spilled = slot.spilled();
            slot.release(&mut spill);
            // The released index is the next one given out.
            let again = Slot::new(8, &[1; 40], &[], Change::Set(b"x"), &mut spill);
            assert_eq!(again.spilled(), spilled.or(Some(0)));
        }
    }

    /// A slot's prefix compared as an image: equal exactly when the bytes are, whatever
    /// value follows the prefix inline (its bytes are masked off), and not answered for a
    /// spilled slot (the caller compares the bytes).
    #[test]
    fn a_prefix_image_matches_exactly_its_own_prefix() {
        use crate::keys::small_image;
        let prefixes: Vec<Vec<u8>> = (8..=16usize)
            .flat_map(|len| {
                let base: Vec<u8> = (0..len as u8).map(|i| i.wrapping_mul(29) | 1).collect();
                let mut last_flipped = base.clone();
                last_flipped[len - 1] ^= 0x80;
                let mut first_flipped = base.clone();
                first_flipped[0] ^= 1;
                [base, last_flipped, first_flipped]
            })
            .collect();
        let mut spill = Spill::default();
        for prefix in &prefixes {
            for value in [&b""[..], &[0], &[0xff; 3], &[7; 10]] {
                let slot = Slot::new(1, prefix, &[], Change::Set(value), &mut spill);
                for other in &prefixes {
                    let same = Some(other == prefix);
                    assert_eq!(
                        slot.prefix_is(small_image(other), other.len()),
                        same,
                        "{prefix:?} / {other:?}"
                    );
                }
            }
        }
        let spilled = Slot::new(1, &prefixes[0], b"map-key", Change::Set(b"v"), &mut spill);
        assert_eq!(spilled.prefix_is(small_image(&prefixes[0]), prefixes[0].len()), None);
    }

    #[test]
    fn a_small_value_stays_inline_and_the_hash_tag_is_never_zero() {
        let mut spill = Spill::default();
        let slot = Slot::new(0, b"prefix-of-16-byt", &[], Change::Set(&[1; 10]), &mut spill);
        assert_eq!(slot.spilled(), None);
        assert_eq!(slot.hash(), 1 << 31);
        assert_eq!(slot.get(&[], &spill), Some(&[1u8; 10][..]));
        let slot = Slot::new(0, b"prefix-of-16-byt", &[], Change::Set(&[1; 11]), &mut spill);
        assert_eq!(slot.spilled(), Some(0));
    }
}

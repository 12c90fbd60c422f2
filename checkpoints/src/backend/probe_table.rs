//! The heap backend's hash table: open addressing with linear probing, each entry holding
//! (the low 32 bits of) its own hash, so that a bucket is the entry itself.
//!
//! Why not hashbrown: a lookup there reads the control bytes, then the slot, then what the
//! slot points to — three dependent cache misses once a table outgrows the cache, and no
//! way to start them early, since a slot's address is known only after the probe. Here a
//! bucket's address follows from the hash alone, so [`ProbeTable::prefetch`] can ask for it
//! while earlier records are still being processed, and a second step can ask for what the
//! found entry points to (see the heap backend's look-ahead).
//!
//! The table grows past 3/4 full (a well-mixed hash keeps the probes short: 2.5 buckets for
//! a hit when full, 1.3 just after growing; two buckets share a cache line). At 5/8 it took
//! 40 % more memory for 10,000 keys over 128 key groups, past a core's cache, and lookups
//! waited on memory more than they saved in probes (count, 10k keys: 5 % slower). A
//! removal shifts the following entries back instead of leaving a tombstone, so a probe
//! never walks past deleted entries. Growing and removing move entries: a bucket index is
//! valid only until the next insert or removal.

/// What a table stores: an entry that knows the low 32 bits of its hash (enough to place
/// it in a table of up to 2^32 buckets, and to tell most entries apart without comparing
/// keys).
pub(crate) trait Hashed {
    fn hash(&self) -> u32;
}

/// The table. The caller gives the hashes and the equality.
#[derive(Debug, Clone)]
pub(crate) struct ProbeTable<T> {
    /// A power of two in length, or empty.
    buckets: Box<[Option<T>]>,
    items: usize,
    /// Inserts and removals so far: a bucket index taken when it read `n` is
    /// still the same entry's while it reads `n`.
    moves: u64,
}

impl<T> Default for ProbeTable<T> {
    fn default() -> Self {
        ProbeTable { buckets: Box::new([]), items: 0, moves: 0 }
    }
}

/// The smallest table that holds anything.
const MIN_BUCKETS: usize = 8;

impl<T: Hashed> ProbeTable<T> {
    pub(crate) fn len(&self) -> usize {
        self.items
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.items == 0
    }

    /// Changes whenever an entry may have moved (an insert, which may grow the table, or a
    /// removal, which shifts entries back).
    #[inline]
    pub(crate) fn moves(&self) -> u64 {
        self.moves
    }

    fn mask(&self) -> usize {
        self.buckets.len().wrapping_sub(1)
    }

    /// The bucket of the entry with `hash` for which `eq` holds.
    #[inline(always)]
    pub(crate) fn find(&self, hash: u64, mut eq: impl FnMut(&T) -> bool) -> Option<usize> {
        if self.buckets.is_empty() {
            return None;
        }
        let mask = self.mask();
        let tag = hash as u32;
        let mut i = tag as usize & mask;
        loop {
            match &self.buckets[i] {
                None => return None,
                Some(value) if value.hash() == tag && eq(value) => return Some(i),
                Some(_) => i = (i + 1) & mask,
            }
        }
    }

    pub(crate) fn get(&self, bucket: usize) -> Option<&T> {
        self.buckets.get(bucket)?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, bucket: usize) -> Option<&mut T> {
        self.buckets.get_mut(bucket)?.as_mut()
    }

    /// Inserts `value`; the caller knows it is not in the table. Returns its bucket.
    pub(crate) fn insert_unique(&mut self, value: T) -> usize {
        if (self.items + 1) * 4 > self.buckets.len() * 3 {
            self.grow();
        }
        self.items += 1;
        self.moves += 1;
        let i = self.free_bucket(value.hash());
        self.buckets[i] = Some(value);
        i
    }

    /// The first empty bucket of `hash`'s probe (there is one: the table is never full).
    fn free_bucket(&self, hash: u32) -> usize {
        let mask = self.mask();
        let mut i = hash as usize & mask;
        while self.buckets[i].is_some() {
            i = (i + 1) & mask;
        }
        i
    }

    /// Twice the buckets, every entry placed again by its stored hash.
    fn grow(&mut self) {
        let len = (self.buckets.len() * 2).max(MIN_BUCKETS);
        let old = std::mem::replace(&mut self.buckets, (0..len).map(|_| None).collect());
        for value in old.into_vec().into_iter().flatten() {
            let i = self.free_bucket(value.hash());
            self.buckets[i] = Some(value);
        }
    }

    /// Removes the entry in `bucket`, moving back the entries after it whose probe passes
    /// through it.
    pub(crate) fn remove(&mut self, bucket: usize) -> Option<T> {
        let removed = self.buckets.get_mut(bucket)?.take()?;
        self.items -= 1;
        self.moves += 1;
        let mask = self.mask();
        let mut hole = bucket;
        let mut i = (bucket + 1) & mask;
        while let Some(value) = &self.buckets[i] {
            let home = value.hash() as usize & mask;
            // The entry at `i` may move to the hole when its probe, from `home` to `i`,
            // passes through the hole.
            if (i.wrapping_sub(home) & mask) >= (i.wrapping_sub(hole) & mask) {
                self.buckets[hole] = self.buckets[i].take();
                hole = i;
            }
            i = (i + 1) & mask;
        }
        Some(removed)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.buckets.iter().flatten()
    }

    /// Asks the CPU to bring in the bucket where `hash`'s probe starts (and the next one, in
    /// the next cache line when buckets are half a line or more). Changes nothing.
    #[inline]
    pub(crate) fn prefetch(&self, hash: u64) {
        if let Some(start) = self.buckets.get(hash as u32 as usize & self.mask()) {
            let start: *const Option<T> = start;
            prefetch_line(start.cast());
            if std::mem::size_of::<Option<T>>() >= 32 {
                prefetch_line(start.wrapping_add(1).cast());
            }
        }
    }
}

/// Asks the CPU to bring the cache line holding `p` into the cache. A hint: it never faults,
/// whatever the address, and changes nothing a program can observe but time.
///
/// The workspace's one `unsafe` block: the intrinsic is marked unsafe only because it is a
/// `#[target_feature(enable = "sse")]` function, and SSE is part of x86-64 itself.
#[inline(always)]
#[allow(unsafe_code)]
pub(crate) fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 has no architecturally visible effect and never faults, for any
    // address; every x86-64 CPU has SSE.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16),
        Remove(u16),
    }

    /// A small hash space on purpose: many keys share a home bucket, so probes are long
    /// and wrap around the end, and removals shift runs back.
    fn hash_of(key: u16, spread: u64) -> u64 {
        u64::from(key % 37).wrapping_mul(spread)
    }

    /// A key, its value and its hash.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    struct Entry(u16, u32, u32);

    impl Hashed for Entry {
        fn hash(&self) -> u32 {
            self.2
        }
    }

    impl Hashed for u64 {
        fn hash(&self) -> u32 {
            *self as u32
        }
    }

    impl Hashed for u8 {
        fn hash(&self) -> u32 {
            u32::from(*self)
        }
    }

    proptest! {
        /// Against a `HashMap`: after any inserts and removals every key is found where the
        /// table says, with its value, and nothing else is.
        #[test]
        fn behaves_like_a_map(
            ops in proptest::collection::vec(
                prop_oneof![any::<u16>().prop_map(|k| Op::Insert(k % 200)), any::<u16>().prop_map(|k| Op::Remove(k % 200))],
                0..600,
            ),
            spread in prop_oneof![Just(1u64), Just(0x9e37_79b9_7f4a_7c15u64)],
        ) {
            let mut table: ProbeTable<Entry> = ProbeTable::default();
            let mut model: HashMap<u16, u32> = HashMap::new();
            for (n, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Insert(k) => {
                        let hash = hash_of(k, spread);
                        match table.find(hash, |e| e.0 == k) {
                            Some(b) => table.get_mut(b).unwrap().1 = n as u32,
                            None => {
                                let b = table.insert_unique(Entry(k, n as u32, hash as u32));
                                prop_assert_eq!(table.get(b), Some(&Entry(k, n as u32, hash as u32)));
                            }
                        }
                        model.insert(k, n as u32);
                    }
                    Op::Remove(k) => {
                        let found = table.find(hash_of(k, spread), |e| e.0 == k);
                        let removed = found.and_then(|b| table.remove(b)).map(|e| e.1);
                        prop_assert_eq!(removed, model.remove(&k));
                    }
                }
                prop_assert_eq!(table.len(), model.len());
            }
            for k in 0..200u16 {
                let found = table.find(hash_of(k, spread), |e| e.0 == k).and_then(|b| table.get(b));
                prop_assert_eq!(found.map(|e| e.1), model.get(&k).copied());
            }
            let mut listed: Vec<(u16, u32)> = table.iter().map(|e| (e.0, e.1)).collect();
            listed.sort_unstable();
            let mut expected: Vec<(u16, u32)> = model.into_iter().collect();
            expected.sort_unstable();
            prop_assert_eq!(listed, expected);
        }
    }

    #[test]
    fn an_empty_table_finds_nothing_and_prefetches_nothing() {
        let table: ProbeTable<u8> = ProbeTable::default();
        assert_eq!(table.find(7, |_| true), None);
        assert_eq!(table.get(0), None);
        table.prefetch(7);
        assert!(table.is_empty());
    }

    #[test]
    fn grows_past_three_quarters_full() {
        let mut table = ProbeTable::default();
        for k in 0..6u64 {
            table.insert_unique(k);
        }
        assert_eq!(table.buckets.len(), 8);
        table.insert_unique(6u64);
        assert_eq!(table.buckets.len(), 16);
        assert!((0..7).all(|k| table.find(k, |v| *v == k).is_some()));
    }
}

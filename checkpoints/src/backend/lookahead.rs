//! The heap backend's look-ahead: state lookups announced a few records before they
//! happen ([`super::KeyedStateBackend::prefetch`]), found in two steps while the records
//! before them are processed.
//!
//! Once the state outgrows the CPU's caches a lookup waits on two dependent memory reads —
//! the bucket, then the entry's bytes it points to — about as long as the rest of a
//! record's processing together. An announcement encodes the key's prefix, hashes it and
//! asks for the bucket's cache lines ([`Probed::prefetch_start`]); [`LAG`] announcements
//! later, when those lines have arrived, it finds the bucket by its stored hash and asks
//! for the entry's bytes ([`Probed::find_by_hash`]); the access itself then only checks
//! that the bucket holds its prefix ([`Probed::holds`]) and reads it from the cache.
//!
//! Nothing here is trusted: a bucket found ahead is checked against the prefix when the
//! access comes (an insert or removal since may have moved it, and a hash may collide), and
//! a key absent when it was announced is looked for again. An announcement that is never
//! accessed falls out of the ring.

use std::collections::VecDeque;

use crate::keys::StateKey;

/// Announcements kept: enough for several records' lookups of a few states each.
const CAPACITY: usize = 32;

/// Announcements between asking for a bucket and reading it.
const LAG: usize = 4;

/// How many of the oldest announcements an access compares itself with (a function that
/// skips a state now and then leaves announcements behind it).
const SCAN: usize = 4;

/// A hash table the look-ahead can work on.
pub(super) trait Probed {
    /// The hash of `key`'s prefix.
    fn hash(&self, key: &StateKey<'_>) -> u64;
    /// Asks for the memory where `hash`'s probe starts.
    fn prefetch_start(&self, hash: u64);
    /// The first bucket holding `hash`, without comparing keys (which would wait for the
    /// entry's memory); asks for that entry's memory.
    fn find_by_hash(&self, hash: u64) -> Option<usize>;
    /// Whether `bucket` holds the entry under `prefix`.
    fn holds(&self, bucket: usize, prefix: &[u8]) -> bool;
    /// The bucket of the entry under `prefix`, whose hash is `hash`.
    fn find(&self, hash: u64, prefix: &[u8]) -> Option<usize>;
}

/// Where an announced key was found.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Found {
    /// Not looked for yet.
    Pending,
    /// A bucket whose entry has the key's hash.
    At(usize),
    /// No entry had the key's hash.
    Absent,
}

#[derive(Debug, Clone)]
struct Announced {
    key_group: u16,
    prefix: Vec<u8>,
    hash: u64,
    found: Found,
}

/// The announcements, oldest first.
#[derive(Debug, Clone, Default)]
pub(super) struct Lookahead {
    ring: VecDeque<Announced>,
    /// Prefix buffers of announcements gone, reused (no allocation per announcement).
    spare: Vec<Vec<u8>>,
}

/// What the look-ahead knows of an accessed key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Lookup {
    /// The hash of the key's prefix.
    pub(super) hash: u64,
    /// The bucket holding it, checked; `None` when it is not in the table.
    pub(super) bucket: Option<usize>,
}

impl Lookahead {
    /// Announces `key`, whose key group's table `group_of` gives (`None`: not this
    /// backend's), and takes the second step for the announcement [`LAG`] before it.
    pub(super) fn announce<'g, G: Probed + 'g>(
        &mut self,
        key: &StateKey<'_>,
        group_of: impl Fn(u16) -> Option<&'g G>,
    ) {
        let Some(group) = group_of(key.key_group) else { return };
        let mut prefix = self.spare.pop().unwrap_or_default();
        prefix.clear();
        if key.encode_prefix_into(&mut prefix).is_err() {
            // The access will report the bad key.
            self.spare.push(prefix);
            return;
        }
        let hash = group.hash(key);
        group.prefetch_start(hash);
        if self.ring.len() == CAPACITY {
            self.drop_oldest();
        }
        self.ring.push_back(Announced { key_group: key.key_group, prefix, hash, found: Found::Pending });
        if let Some(behind) = self.ring.len().checked_sub(LAG + 1) {
            let a = &mut self.ring[behind];
            if a.found == Found::Pending {
                if let Some(g) = group_of(a.key_group) {
                    a.found = g.find_by_hash(a.hash).map_or(Found::Absent, Found::At);
                }
            }
        }
    }

    /// The access to `key` in `group` (its key group's table): what its announcement found,
    /// checked, when it is among the oldest; the announcements before it are dropped.
    #[inline]
    pub(super) fn take<G: Probed>(&mut self, key: &StateKey<'_>, group: &G) -> Option<Lookup> {
        if self.ring.is_empty() {
            return None;
        }
        self.take_announced(key, group)
    }

    fn take_announced<G: Probed>(&mut self, key: &StateKey<'_>, group: &G) -> Option<Lookup> {
        let at = self
            .ring
            .iter()
            .take(SCAN)
            .position(|a| a.key_group == key.key_group && key.prefix_matches(&a.prefix))?;
        for _ in 0..at {
            self.drop_oldest();
        }
        let a = self.ring.pop_front()?;
        let bucket = match a.found {
            Found::At(b) if group.holds(b, &a.prefix) => Some(b),
            // Moved, a collision, absent then (perhaps inserted since), or not looked for.
            _ => group.find(a.hash, &a.prefix),
        };
        self.spare.push(a.prefix);
        Some(Lookup { hash: a.hash, bucket })
    }

    fn drop_oldest(&mut self) {
        if let Some(a) = self.ring.pop_front() {
            self.spare.push(a.prefix);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::StateId;
    use std::cell::RefCell;
    use std::collections::HashMap;

    /// A table of prefixes by bucket, which records the calls the look-ahead makes.
    #[derive(Default)]
    struct Fake {
        buckets: HashMap<usize, Vec<u8>>,
        calls: RefCell<Vec<&'static str>>,
    }

    impl Fake {
        fn bucket_of(prefix: &[u8]) -> usize {
            prefix.iter().map(|b| usize::from(*b)).sum()
        }
        fn insert(&mut self, prefix: Vec<u8>) {
            self.buckets.insert(Self::bucket_of(&prefix), prefix);
        }
    }

    impl Probed for Fake {
        fn hash(&self, key: &StateKey<'_>) -> u64 {
            Self::bucket_of(&prefix(key)) as u64
        }
        fn prefetch_start(&self, _: u64) {
            self.calls.borrow_mut().push("prefetch");
        }
        fn find_by_hash(&self, hash: u64) -> Option<usize> {
            self.calls.borrow_mut().push("find_by_hash");
            self.buckets.contains_key(&(hash as usize)).then_some(hash as usize)
        }
        fn holds(&self, bucket: usize, prefix: &[u8]) -> bool {
            self.calls.borrow_mut().push("holds");
            self.buckets.get(&bucket).is_some_and(|p| p == prefix)
        }
        fn find(&self, hash: u64, prefix: &[u8]) -> Option<usize> {
            self.calls.borrow_mut().push("find");
            self.holds(hash as usize, prefix).then_some(hash as usize)
        }
    }

    fn prefix(key: &StateKey<'_>) -> Vec<u8> {
        let mut p = Vec::new();
        key.encode_prefix_into(&mut p).unwrap();
        p
    }

    #[test]
    fn finds_ahead_in_two_steps_and_checks_at_the_access() {
        let id = StateId::new("count").unwrap();
        let keys: Vec<[u8; 1]> = (0..8u8).map(|k| [k]).collect();
        let key = |k: usize| StateKey::new(3, &id, &keys[k]);
        let mut table = Fake::default();
        for k in 0..6 {
            table.insert(prefix(&key(k)));
        }
        let mut ahead = Lookahead::default();
        for k in 0..8 {
            ahead.announce(&key(k), |kg| (kg == 3).then_some(&table));
        }
        let calls = table.calls.take();
        assert_eq!(calls.iter().filter(|c| **c == "prefetch").count(), 8);
        assert_eq!(calls.iter().filter(|c| **c == "find_by_hash").count(), 8 - LAG, "{calls:?}");

        // Found ahead: only checked.
        let found = ahead.take(&key(0), &table).unwrap();
        assert_eq!(
            found,
            Lookup { hash: table.hash(&key(0)), bucket: Some(Fake::bucket_of(&prefix(&key(0)))) }
        );
        assert_eq!(table.calls.take(), ["holds"]);
        // A key not announced: nothing known, nothing dropped.
        let other = [99u8];
        assert_eq!(ahead.take(&StateKey::new(3, &id, &other), &table), None);
        // Key 1 skipped: key 2 is found and 1's announcement dropped.
        assert!(ahead.take(&key(2), &table).unwrap().bucket.is_some());
        assert_eq!(ahead.take(&key(1), &table), None);
        // Moved since: looked for again.
        let moved = table.buckets.remove(&Fake::bucket_of(&prefix(&key(3)))).unwrap();
        assert_eq!(ahead.take(&key(3), &table).unwrap().bucket, None);
        table.insert(moved);
        table.calls.take();
        // Not looked for yet (announced less than LAG ago): looked for now.
        for k in 4..7 {
            assert!(ahead.take(&key(k), &table).is_some());
        }
        assert_eq!(ahead.take(&key(6), &table), None, "taken once");
        let absent = ahead.take(&key(7), &table).unwrap();
        assert_eq!(absent.bucket, None);
        assert!(table.calls.take().contains(&"find"));
    }

    #[test]
    fn keeps_the_newest_announcements_and_ignores_other_key_groups() {
        let id = StateId::new("count").unwrap();
        let keys: Vec<[u8; 2]> = (0..100u16).map(|k| k.to_be_bytes()).collect();
        let table = Fake::default();
        let mut ahead = Lookahead::default();
        for k in &keys {
            ahead.announce(&StateKey::new(1, &id, k), |kg| (kg == 1).then_some(&table));
        }
        ahead.announce(&StateKey::new(2, &id, &keys[0]), |kg| (kg == 1).then_some(&table));
        assert_eq!(ahead.ring.len(), CAPACITY);
        assert_eq!(ahead.take(&StateKey::new(1, &id, &keys[0]), &table), None, "dropped");
        assert!(ahead.take(&StateKey::new(1, &id, &keys[100 - CAPACITY]), &table).is_some());
    }
}

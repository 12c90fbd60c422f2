//! The key layout makes a key-group range one contiguous scan.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::collections::BTreeSet;

use caudal_checkpoints::keys::{key_group_lower_bound, key_group_upper_bound};
use caudal_checkpoints::*;
use proptest::prelude::*;

fn entry() -> impl Strategy<Value = (u16, String, Vec<u8>, Vec<u8>)> {
    (
        0u16..128,
        prop::sample::select(vec!["a", "ab", "b", "window-sum"]).prop_map(str::to_string),
        prop::collection::vec(any::<u8>(), 0..6),
        prop::collection::vec(any::<u8>(), 0..3),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Encoded keys of random key groups, sorted as RocksDB sorts them: the keys between
    /// the bounds of [start, end) are exactly those of the key groups in the range.
    #[test]
    fn a_key_group_range_is_one_contiguous_scan(
        entries in prop::collection::vec(entry(), 1..80),
        start in 0u16..128,
        len in 0u16..128,
    ) {
        let end = (start + len).min(128);
        let mut sorted = BTreeSet::new();
        for (kg, state, key, ns) in &entries {
            let id = StateId::new(state).unwrap();
            let k = StateKey { key_group: *kg, state: &id, key, namespace: ns, map_key: &[] };
            sorted.insert(k.encode().unwrap());
        }
        let lower = key_group_lower_bound(start).to_vec();
        let in_scan: Vec<&Vec<u8>> = match key_group_upper_bound(end.saturating_sub(1)) {
            Some(upper) if end > start => sorted.range(lower..upper.to_vec()).collect(),
            _ => Vec::new(),
        };
        let expected: Vec<&Vec<u8>> = sorted
            .iter()
            .filter(|k| {
                let kg = u16::from_be_bytes([k[0], k[1]]);
                start <= kg && kg < end
            })
            .collect();
        prop_assert_eq!(in_scan, expected);
    }

    /// Decoding gives back what was encoded, for any parts.
    #[test]
    fn keys_round_trip((kg, state, key, ns) in entry(), map_key in prop::collection::vec(any::<u8>(), 0..4)) {
        let id = StateId::new(&state).unwrap();
        let enc = StateKey { key_group: kg, state: &id, key: &key, namespace: &ns, map_key: &map_key }.encode().unwrap();
        let d = keys::decode_key(&enc).unwrap();
        prop_assert_eq!((d.key_group, d.state, d.key, d.namespace, d.map_key), (kg, state.as_str(), &key[..], &ns[..], &map_key[..]));
    }
}

/// The same property on the real RocksDB backend: `key_group_stats` and
/// `list_entries` of each group see exactly the keys written to it.
#[test]
fn rocksdb_scans_see_exactly_their_key_groups() {
    let range = KeyGroupRange::new(40, 90);
    let mut t = common::open(common::Kind::RocksDb, range);
    let id = StateId::new("s").unwrap();
    let mut expected = vec![0u64; range.len()];
    for i in 0..2_000u32 {
        let kg = range.start + (i * 7919 % range.len() as u32) as u16;
        let key = i.to_be_bytes();
        t.backend.put(&StateKey::new(kg, &id, &key), b"v").unwrap();
        expected[usize::from(kg - range.start)] += 1;
    }
    let stats = t.backend.key_group_stats().unwrap();
    for s in stats {
        assert_eq!(s.entries, expected[usize::from(s.key_group - range.start)]);
    }
    for kg in [40u16, 41, 89] {
        let page = t.backend.list_entries(kg, None, 10_000).unwrap();
        assert!(page.entries.iter().all(|e| e.decoded().unwrap().key_group == kg));
        assert_eq!(page.entries.len() as u64, expected[usize::from(kg - range.start)]);
    }
}

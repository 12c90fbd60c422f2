//! The write-back cache behaves like the backend it wraps (the heap backend as model).
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use caudal_checkpoints::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Put(u8, u8, u8),
    Delete(u8, u8),
    Append(u8, u8, u8),
    Get(u8, u8),
    ClearMap(u8),
    Snapshot,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..4, 0u8..6, any::<u8>()).prop_map(|(kg, k, v)| Op::Put(kg, k, v)),
        2 => (0u8..4, 0u8..6).prop_map(|(kg, k)| Op::Delete(kg, k)),
        2 => (0u8..4, 0u8..6, any::<u8>()).prop_map(|(kg, k, v)| Op::Append(kg, k, v)),
        4 => (0u8..4, 0u8..6).prop_map(|(kg, k)| Op::Get(kg, k)),
        1 => (0u8..4).prop_map(Op::ClearMap),
        1 => Just(Op::Snapshot),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn cache_equals_model(ops in prop::collection::vec(op(), 1..120), capacity in 1usize..8) {
        // A budget of about `capacity` small entries (each a key of ~12 bytes and a value of up
        // to a few dozen), so evictions happen all the time.
        let budget = capacity * (caudal_checkpoints::backend::cache::ENTRY_OVERHEAD + 16);
        let range = KeyGroupRange::new(0, 4);
        let mut model = HeapStateBackend::new(range);
        let mut cached = CachingBackend::new(HeapStateBackend::new(range), budget);
        let store = InMemoryCheckpointStore::new();
        let state = StateId::new("s").unwrap();
        for (i, op) in ops.iter().enumerate() {
            // Keys share the state and the record key; the "namespace" varies so that
            // map scans over one (key) prefix see several entries.
            match op {
                Op::Put(kg, k, v) => {
                    let key = StateKey { key_group: u16::from(*kg), state: &state, key: b"r", namespace: &[], map_key: &[*k] };
                    model.put(&key, &[*v]).unwrap();
                    cached.put(&key, &[*v]).unwrap();
                }
                Op::Delete(kg, k) => {
                    let key = StateKey { key_group: u16::from(*kg), state: &state, key: b"r", namespace: &[], map_key: &[*k] };
                    model.delete(&key).unwrap();
                    cached.delete(&key).unwrap();
                }
                Op::Append(kg, k, v) => {
                    let key = StateKey { key_group: u16::from(*kg), state: &state, key: b"r", namespace: &[], map_key: &[*k] };
                    model.append(&key, &[*v]).unwrap();
                    cached.append(&key, &[*v]).unwrap();
                }
                Op::Get(kg, k) => {
                    let key = StateKey { key_group: u16::from(*kg), state: &state, key: b"r", namespace: &[], map_key: &[*k] };
                    prop_assert_eq!(model.get(&key).unwrap(), cached.get(&key).unwrap(), "op {}", i);
                }
                Op::ClearMap(kg) => {
                    let key = StateKey::new(u16::from(*kg), &state, b"r");
                    model.delete_map(&key).unwrap();
                    cached.delete_map(&key).unwrap();
                }
                Op::Snapshot => {
                    let loc = common::location(&CheckpointPaths::new(), i as u64 + 1, 0);
                    let a = model.snapshot(&loc).unwrap().upload(&store).unwrap();
                    let b = cached.snapshot(&loc).unwrap().upload(&store).unwrap();
                    prop_assert_eq!(a.handle.state_size(), b.handle.state_size());
                }
            }
        }
        for kg in range.iter() {
            let key = StateKey::new(kg, &state, b"r");
            prop_assert_eq!(model.scan_map(&key).unwrap(), cached.scan_map(&key).unwrap());
        }
        prop_assert_eq!(model.key_group_stats().unwrap(), cached.key_group_stats().unwrap());
        let inner = cached.into_inner().unwrap();
        prop_assert_eq!(common::dump(&model), common::dump(&inner));
    }
}

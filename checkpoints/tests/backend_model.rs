//! Every backend behaves like a sorted map of full encoded keys (the layout of `keys.rs`):
//! random puts, deletes, appends, batches, map scans and clears, state-browser pages and
//! snapshot-restores, lookups announced ahead, reads and writes with (perhaps stale) hints
//! of where an entry is, with value and map entries of one (key, namespace) mixed — the heap
//! backend stores them apart (a value under its prefix, map entries in a map under it), so
//! this is its test against the naive model.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use caudal_checkpoints::backend::frame_list_element;
use caudal_checkpoints::*;
use common::{Kind, KINDS};
use proptest::prelude::*;
use std::collections::BTreeMap;

/// An entry's address: key group, state, key, namespace, map key (indexes into small sets).
type Addr = (u8, u8, u8, u8, u8);

#[derive(Debug, Clone)]
enum Op {
    Put(Addr, u8),
    Delete(Addr),
    Append(Addr, u8),
    Batch(Vec<(Addr, Option<u8>)>),
    Get(Addr),
    Scan(Addr),
    ClearMap(Addr),
    Page(u8, u8),
    SnapshotRestore,
    /// A snapshot taken and kept while the ops go on; uploaded and restored at the end, it
    /// must hold the entries of its moment.
    SnapshotHeld,
    /// A lookup announced (changes nothing; later ops may or may not access it, and the
    /// ops between may move or remove what it found).
    Prefetch(Addr),
    /// A read that keeps where the backend found the entry ([`KeyedStateBackend::read_hinted`]).
    HintedGet(Addr),
    /// A put to the address of the last hinted read, with its hint — stale when the ops
    /// since moved or removed entries (a read-modify-write with work in between).
    HintedPut(u8),
}

const STATES: [&str; 2] = ["a", "ab"];
const KEYS: [&[u8]; 3] = [b"", b"r", b"rr"];
const NAMESPACES: [&[u8]; 2] = [b"", b"n"];
const MAP_KEYS: [&[u8]; 3] = [b"", b"x", b"xy"];

fn addr() -> impl Strategy<Value = Addr> {
    (0u8..3, 0u8..2, 0u8..3, 0u8..2, 0u8..3)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (addr(), any::<u8>()).prop_map(|(a, v)| Op::Put(a, v)),
        2 => addr().prop_map(Op::Delete),
        2 => (addr(), any::<u8>()).prop_map(|(a, v)| Op::Append(a, v)),
        1 => prop::collection::vec((addr(), prop::option::of(any::<u8>())), 0..6).prop_map(Op::Batch),
        4 => addr().prop_map(Op::Get),
        2 => addr().prop_map(Op::Scan),
        1 => addr().prop_map(Op::ClearMap),
        2 => (0u8..3, 1u8..5).prop_map(|(kg, limit)| Op::Page(kg, limit)),
        1 => Just(Op::SnapshotRestore),
        1 => Just(Op::SnapshotHeld),
        6 => addr().prop_map(Op::Prefetch),
        4 => addr().prop_map(Op::HintedGet),
        4 => any::<u8>().prop_map(Op::HintedPut),
    ]
}

fn state_ids() -> Vec<StateId> {
    STATES.iter().map(|s| StateId::new(s).unwrap()).collect()
}

fn key<'a>(ids: &'a [StateId], a: Addr) -> StateKey<'a> {
    StateKey {
        key_group: u16::from(a.0),
        state: &ids[usize::from(a.1)],
        key: KEYS[usize::from(a.2)],
        namespace: NAMESPACES[usize::from(a.3)],
        map_key: MAP_KEYS[usize::from(a.4)],
    }
}

/// A put's value: 0-60 bytes, so values and lists of every small size are checked (and a
/// slot layout with a size limit would be checked across it both ways).
fn value(v: u8) -> Vec<u8> {
    vec![v; usize::from(v % 61)]
}

fn prefix(k: &StateKey<'_>) -> Vec<u8> {
    let mut p = Vec::new();
    k.encode_prefix_into(&mut p).unwrap();
    p
}

/// Every entry of `range`, by full key.
fn all_entries(backend: &dyn KeyedStateBackend, range: KeyGroupRange) -> BTreeMap<Vec<u8>, Vec<u8>> {
    range
        .iter()
        .flat_map(|kg| backend.list_entries(kg, None, 10_000).unwrap().entries)
        .map(|e| (e.key, e.value))
        .collect()
}

/// A snapshot kept while the ops go on: the op that took it, and the model of its moment.
type Held = (usize, Box<dyn StateSnapshot>, BTreeMap<Vec<u8>, Vec<u8>>);

/// Uploads and restores each held snapshot: it must hold the entries of its moment.
fn check_held(
    kind: Kind,
    range: KeyGroupRange,
    store: &InMemoryCheckpointStore,
    held: Vec<Held>,
) -> std::result::Result<(), TestCaseError> {
    for (i, snap, then) in held {
        let handle = snap.upload(store).unwrap().handle;
        let restored = common::restore(kind, range, &[handle], store).unwrap();
        prop_assert_eq!(
            all_entries(restored.backend.as_ref(), range),
            then,
            "{:?}: snapshot held at op {}",
            kind,
            i
        );
    }
    Ok(())
}

fn run(kind: Kind, ops: &[Op]) -> std::result::Result<(), TestCaseError> {
    let range = KeyGroupRange::new(0, 3);
    let ids = state_ids();
    let store = InMemoryCheckpointStore::new();
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut b = common::open(kind, range);
    let mut held = Vec::new();
    let mut hinted: Option<(Addr, Option<EntryHint>)> = None;
    let mut buffer = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Put(a, v) => {
                let k = key(&ids, *a);
                b.backend.put(&k, &value(*v)).unwrap();
                model.insert(k.encode().unwrap(), value(*v));
            }
            Op::Delete(a) => {
                let k = key(&ids, *a);
                b.backend.delete(&k).unwrap();
                model.remove(&k.encode().unwrap());
            }
            Op::Append(a, v) => {
                let k = key(&ids, *a);
                b.backend.append(&k, &[*v]).unwrap();
                model.entry(k.encode().unwrap()).or_default().extend(frame_list_element(&[*v]));
            }
            Op::Batch(writes) => {
                let mut batch = StateWriteBatch::new();
                for (a, v) in writes {
                    let k = key(&ids, *a);
                    match v {
                        Some(v) => {
                            batch.put(&k, &value(*v)).unwrap();
                            model.insert(k.encode().unwrap(), value(*v));
                        }
                        None => {
                            batch.delete(&k).unwrap();
                            model.remove(&k.encode().unwrap());
                        }
                    }
                }
                b.backend.write_batch(batch).unwrap();
            }
            Op::Prefetch(a) => b.backend.prefetch(&key(&ids, *a)),
            Op::HintedGet(a) => {
                let k = key(&ids, *a);
                let mut hint = None;
                let got = b.backend.read_hinted(&k, &mut buffer, &mut hint).unwrap().map(<[u8]>::to_vec);
                let want = model.get(&k.encode().unwrap()).cloned();
                prop_assert_eq!(got, want, "{:?} op {} {:?}", kind, i, op);
                hinted = Some((*a, hint));
            }
            Op::HintedPut(v) => {
                if let Some((a, hint)) = hinted {
                    let k = key(&ids, a);
                    b.backend.put_hinted(&k, &value(*v), hint.as_ref()).unwrap();
                    model.insert(k.encode().unwrap(), value(*v));
                }
            }
            Op::Get(a) => {
                let k = key(&ids, *a);
                prop_assert_eq!(
                    b.backend.get(&k).unwrap(),
                    model.get(&k.encode().unwrap()).cloned(),
                    "{:?} op {} {:?}",
                    kind,
                    i,
                    op
                );
            }
            Op::Scan(a) => {
                let k = key(&ids, *a);
                let p = prefix(&k);
                let want: Vec<RawEntry> = model
                    .range(p.clone()..)
                    .take_while(|(key, _)| key.starts_with(&p))
                    .map(|(key, value)| RawEntry { key: key.clone(), value: value.clone() })
                    .collect();
                prop_assert_eq!(b.backend.scan_map(&k).unwrap(), want, "{:?} op {} {:?}", kind, i, op);
            }
            Op::ClearMap(a) => {
                let k = key(&ids, *a);
                let p = prefix(&k);
                b.backend.delete_map(&k).unwrap();
                model.retain(|key, _| !key.starts_with(&p));
            }
            Op::Page(kg, limit) => {
                // Page through the key group `limit` entries at a time.
                let lower = u16::from(*kg).to_be_bytes().to_vec();
                let want: Vec<Vec<u8>> = model
                    .range(lower..)
                    .take_while(|(key, _)| key[..2] == u16::from(*kg).to_be_bytes())
                    .map(|(k, _)| k.clone())
                    .collect();
                let mut got = Vec::new();
                let mut after: Option<Vec<u8>> = None;
                loop {
                    let page = b
                        .backend
                        .list_entries(u16::from(*kg), after.as_deref(), usize::from(*limit))
                        .unwrap();
                    prop_assert!(page.entries.len() <= usize::from(*limit));
                    got.extend(page.entries.into_iter().map(|e| e.key));
                    match page.next {
                        Some(n) => after = Some(n),
                        None => break,
                    }
                }
                prop_assert_eq!(got, want, "{:?} op {} {:?}", kind, i, op);
            }
            Op::SnapshotRestore => {
                // The held snapshots' backend goes: they are uploaded (and checked) first.
                check_held(kind, range, &store, std::mem::take(&mut held))?;
                let loc = common::location(&CheckpointPaths::new(), i as u64 + 1, 0);
                let snap = b.backend.snapshot(&loc).unwrap().upload(&store).unwrap();
                b = common::restore(kind, range, &[snap.handle], &store).unwrap();
                // A hint names a place in the backend it came from.
                hinted = None;
            }
            Op::SnapshotHeld => {
                let loc = common::location(&CheckpointPaths::new(), i as u64 + 1, 0);
                held.push((i, b.backend.snapshot(&loc).unwrap(), model.clone()));
            }
        }
    }
    check_held(kind, range, &store, std::mem::take(&mut held))?;
    let stats: u64 = b.backend.key_group_stats().unwrap().iter().map(|s| s.entries).sum();
    prop_assert_eq!(stats, model.len() as u64, "{:?}: entries", kind);
    let bytes: u64 = b.backend.key_group_stats().unwrap().iter().map(|s| s.bytes).sum();
    prop_assert_eq!(
        bytes,
        model.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum::<u64>(),
        "{:?}: bytes",
        kind
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_backend_equals_a_sorted_map_of_full_keys(ops in prop::collection::vec(op(), 1..80)) {
        for kind in KINDS.into_iter().chain([Kind::HeapAnnouncing]) {
            run(kind, &ops)?;
        }
    }
}

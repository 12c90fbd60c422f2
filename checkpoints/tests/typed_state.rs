//! Every typed state, the same test body against the heap and the RocksDB backend.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use caudal_checkpoints::*;
use common::{kg_of, open, Kind, KINDS};
use serde::{Deserialize, Serialize};

/// A window namespace like the engine's.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Window {
    start: i64,
    end: i64,
}

const W1: Window = Window { start: 0, end: 60 };
const W2: Window = Window { start: 60, end: 120 };

fn value_state(kind: Kind) {
    let mut t = open(kind, KeyGroupRange::all(128));
    let b = t.backend.as_mut();
    let s: ValueState<String, f64> = ValueState::new("last-temp").unwrap();
    let k = "sensor-1".to_string();
    let kg = kg_of(&k);
    assert_eq!(s.get(b, kg, &k, &W1).unwrap(), None);
    s.put(b, kg, &k, &W1, &21.5).unwrap();
    s.put(b, kg, &k, &W2, &22.5).unwrap();
    assert_eq!(s.get(b, kg, &k, &W1).unwrap(), Some(21.5));
    assert_eq!(s.get(b, kg, &k, &W2).unwrap(), Some(22.5));
    s.put(b, kg, &k, &W1, &23.0).unwrap();
    assert_eq!(s.get(b, kg, &k, &W1).unwrap(), Some(23.0));
    s.clear(b, kg, &k, &W1).unwrap();
    assert_eq!(s.get(b, kg, &k, &W1).unwrap(), None);
    assert_eq!(s.get(b, kg, &k, &W2).unwrap(), Some(22.5), "{kind:?}: other namespace kept");
    // Another state with the same key does not see it.
    let other: ValueState<String, f64> = ValueState::new("last-temp2").unwrap();
    assert_eq!(other.get(b, kg, &k, &W2).unwrap(), None);
}

fn map_state(kind: Kind) {
    let mut t = open(kind, KeyGroupRange::all(128));
    let b = t.backend.as_mut();
    let s: MapState<u32, String, u64> = MapState::new("counts").unwrap();
    let kg = 3;
    s.insert(b, kg, &7, &(), &"a".to_string(), &1).unwrap();
    s.insert(b, kg, &7, &(), &"b".to_string(), &2).unwrap();
    s.insert(b, kg, &8, &(), &"a".to_string(), &100).unwrap();
    // Key 7 must not see key 70's entries (length-prefixed keys).
    s.insert(b, kg, &70, &(), &"z".to_string(), &9).unwrap();
    assert_eq!(s.get(b, kg, &7, &(), &"b".to_string()).unwrap(), Some(2));
    let mut entries = s.entries(b, kg, &7, &()).unwrap();
    entries.sort();
    assert_eq!(entries, vec![("a".to_string(), 1), ("b".to_string(), 2)]);
    s.remove(b, kg, &7, &(), &"a".to_string()).unwrap();
    assert_eq!(s.entries(b, kg, &7, &()).unwrap(), vec![("b".to_string(), 2)]);
    s.clear(b, kg, &7, &()).unwrap();
    assert!(s.entries(b, kg, &7, &()).unwrap().is_empty());
    assert_eq!(s.entries(b, kg, &8, &()).unwrap(), vec![("a".to_string(), 100)], "{kind:?}");
}

fn list_state(kind: Kind) {
    let mut t = open(kind, KeyGroupRange::all(128));
    let b = t.backend.as_mut();
    let s: ListState<String, (i64, f32)> = ListState::new("readings").unwrap();
    let k = "s9".to_string();
    let kg = kg_of(&k);
    assert!(s.get(b, kg, &k, &W1).unwrap().is_empty());
    for i in 0..5 {
        s.add(b, kg, &k, &W1, &(i, i as f32 * 1.5)).unwrap();
    }
    s.add(b, kg, &k, &W2, &(99, 0.0)).unwrap();
    assert_eq!(
        s.get(b, kg, &k, &W1).unwrap(),
        vec![(0, 0.0), (1, 1.5), (2, 3.0), (3, 4.5), (4, 6.0)],
        "{kind:?}"
    );
    s.update(b, kg, &k, &W1, &[(7, 7.0)]).unwrap();
    s.add(b, kg, &k, &W1, &(8, 8.0)).unwrap();
    assert_eq!(s.get(b, kg, &k, &W1).unwrap(), vec![(7, 7.0), (8, 8.0)]);
    s.clear(b, kg, &k, &W1).unwrap();
    assert!(s.get(b, kg, &k, &W1).unwrap().is_empty());
    assert_eq!(s.get(b, kg, &k, &W2).unwrap(), vec![(99, 0.0)]);
}

#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
struct Avg {
    sum: f64,
    count: u64,
}

fn aggregating_state(kind: Kind) {
    let mut t = open(kind, KeyGroupRange::all(128));
    let b = t.backend.as_mut();
    let s: AggregatingState<String, Avg> = AggregatingState::new("avg").unwrap();
    let k = "sensor-3".to_string();
    let kg = kg_of(&k);
    for v in [10.0, 20.0, 30.0] {
        s.add(b, kg, &k, &W1, |acc| {
            acc.sum += v;
            acc.count += 1;
        })
        .unwrap();
    }
    let acc = s.get(b, kg, &k, &W1).unwrap().unwrap();
    assert_eq!(acc.sum / acc.count as f64, 20.0, "{kind:?}");
    assert_eq!(s.get(b, kg, &k, &W2).unwrap(), None);
    s.clear(b, kg, &k, &W1).unwrap();
    assert_eq!(s.get(b, kg, &k, &W1).unwrap(), None);
}

fn batches_and_browser(kind: Kind) {
    let range = KeyGroupRange::new(10, 20);
    let mut t = open(kind, range);
    let b = t.backend.as_mut();
    let id = StateId::new("v").unwrap();
    let mut batch = StateWriteBatch::new();
    for kg in range.iter() {
        for i in 0..(kg - 9) {
            let key = [i as u8];
            batch.put(&StateKey::new(kg, &id, &key), b"xy").unwrap();
        }
    }
    b.write_batch(batch).unwrap();
    // A key group outside the range is refused, and a bad batch changes nothing.
    let mut bad = StateWriteBatch::new();
    bad.put(&StateKey::new(15, &id, b"new"), b"1").unwrap();
    bad.put(&StateKey::new(30, &id, b"k"), b"1").unwrap();
    assert!(matches!(b.write_batch(bad), Err(Error::KeyGroupOutOfRange { .. })));
    assert_eq!(b.get(&StateKey::new(15, &id, b"new")).unwrap(), None, "{kind:?}");
    assert!(b.get(&StateKey::new(9, &id, b"k")).is_err());

    let stats = b.key_group_stats().unwrap();
    assert_eq!(stats.len(), 10);
    for s in &stats {
        assert_eq!(s.entries, u64::from(s.key_group - 9), "{kind:?} {s:?}");
    }
    let page = b.list_entries(19, None, 4).unwrap();
    assert_eq!(page.entries.len(), 4);
    let rest = b.list_entries(19, page.next.as_deref(), 100).unwrap();
    assert_eq!(rest.entries.len(), 6);
    assert!(rest.next.is_none());
    let d = rest.entries[0].decoded().unwrap();
    assert_eq!((d.key_group, d.state), (19, "v"));
}

#[test]
fn value_state_on_both_backends() {
    KINDS.into_iter().for_each(value_state);
}

#[test]
fn map_state_on_both_backends() {
    KINDS.into_iter().for_each(map_state);
}

#[test]
fn list_state_on_both_backends() {
    KINDS.into_iter().for_each(list_state);
}

#[test]
fn aggregating_state_on_both_backends() {
    KINDS.into_iter().for_each(aggregating_state);
}

#[test]
fn batches_and_state_browser_on_both_backends() {
    KINDS.into_iter().for_each(batches_and_browser);
}

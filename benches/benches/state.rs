//! Keyed state and checkpoint benchmarks (`caudal-checkpoints`).
//!
//! ```sh
//! cargo bench -p caudal-benches --bench state                       # 32 MB of state
//! CAUDAL_BENCH_STATE_MB=1024 cargo bench -p caudal-benches --bench state -- checkpoint
//! ```
//!
//! * `value_state/{heap,rocksdb,rocksdb+cache}/{get,put}`: one typed `ValueState` access
//!   on 100,000 keys (`rocksdb+cache`: RocksDB behind the default write-back cache).
//! * `read_modify_write/heap/{10000,1000000}`: a get and a put of the same key through the
//!   heap backend's byte interface (a keyed process function's per-record state access).
//! * `checkpoint/<N>MB/sync`: the synchronous snapshot part (flush + RocksDB
//!   checkpoint of hard links) after 1 % of the keys changed.
//! * `checkpoint/<N>MB/incremental_upload`: the asynchronous part to a local
//!   directory store (only the new SST files are copied).
//! * `checkpoint/<N>MB/restore`: download + open of the whole state.
//!
//! The state size comes from `CAUDAL_BENCH_STATE_MB` (default 32). For the 1 GB figure
//! set it to 1024; the fill takes a minute or two and needs ~3 GB of free disk in the
//! temp directory (the database, the store and a restore).

use std::hint::black_box;
use std::time::{Duration, Instant};

use caudal_checkpoints::{
    CachingBackend, CheckpointId, CheckpointPaths, CheckpointStore, HeapStateBackend, KeyGroupRange,
    KeyedStateBackend, ObjectCheckpointStore, OperatorId, RocksDbConfig, RocksDbStateBackend, StateId,
    StateKey, StateLocation, SubtaskIndex, ValueState,
};
use criterion::{criterion_group, criterion_main, Criterion};

const KEYS: u64 = 100_000;

fn key_group(key: u64) -> u16 {
    caudal_checkpoints::keygroup::key_group_of(&key, 128)
}

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn op() -> OperatorId {
    OperatorId::new("bench").expect("valid operator id")
}

fn value_state(c: &mut Criterion) {
    let state: ValueState<u64, (f64, u64)> = ValueState::new("avg").expect("valid state name");
    let dir = tempfile::tempdir().expect("temp dir");
    let range = KeyGroupRange::all(128);
    let mut backends: Vec<(&str, Box<dyn KeyedStateBackend>)> = vec![
        ("heap", Box::new(HeapStateBackend::new(range))),
        (
            "rocksdb",
            Box::new(
                RocksDbStateBackend::open(&dir.path().join("plain"), &op(), range, &RocksDbConfig::default())
                    .expect("open"),
            ),
        ),
        (
            "rocksdb+cache",
            Box::new(CachingBackend::new(
                RocksDbStateBackend::open(
                    &dir.path().join("cached"),
                    &op(),
                    range,
                    &RocksDbConfig::default(),
                )
                .expect("open"),
                caudal_checkpoints::backend::cache::DEFAULT_CACHE_BYTES,
            )),
        ),
    ];
    let mut group = c.benchmark_group("value_state");
    for (name, backend) in backends.iter_mut() {
        for k in 0..KEYS {
            state.put(backend.as_mut(), key_group(k), &k, &(), &(k as f64, 1)).expect("put");
        }
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        group.bench_function(format!("{name}/put"), |b| {
            b.iter(|| {
                let k = next(&mut x) % KEYS;
                state.put(backend.as_mut(), key_group(k), &k, &(), &(black_box(k as f64), 2)).expect("put")
            })
        });
        group.bench_function(format!("{name}/get"), |b| {
            b.iter(|| {
                let k = next(&mut x) % KEYS;
                black_box(state.get(backend.as_ref(), key_group(k), &k, &()).expect("get"))
            })
        });
    }
    group.finish();
}

/// A running count per key read and written back through the backend's byte interface, as
/// a keyed process function's `ValueState` does per record (10,000 and 1,000,000 keys).
fn read_modify_write(c: &mut Criterion) {
    let id = StateId::new("count").expect("valid state name");
    let mut group = c.benchmark_group("read_modify_write");
    for keys in [10_000u64, 1_000_000] {
        let mut backend = HeapStateBackend::new(KeyGroupRange::all(128));
        let encoded: Vec<(u16, [u8; 8])> = (0..keys).map(|k| (key_group(k), k.to_be_bytes())).collect();
        let mut value = Vec::new();
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        group.bench_function(format!("heap/{keys}"), |b| {
            b.iter(|| {
                let (kg, key) = &encoded[(next(&mut x) % keys) as usize];
                let sk = StateKey::new(*kg, &id, key);
                let n = if backend.get_into(&sk, &mut value).expect("get") { value[0] } else { 0 };
                backend.put(&sk, &[black_box(n.wrapping_add(1))]).expect("put")
            })
        });
    }
    group.finish();
}

fn state_mb() -> u64 {
    std::env::var("CAUDAL_BENCH_STATE_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(32)
}

/// Poorly compressible values so that N MB of state is ~N MB of SST files.
fn value(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len).map(|_| next(&mut x) as u8).collect()
}

fn checkpoint(c: &mut Criterion) {
    const VALUE: usize = 200;
    let mb = state_mb();
    let keys = mb * (1 << 20) / (VALUE as u64 + 16);
    let work = tempfile::tempdir().expect("temp dir");
    let store = ObjectCheckpointStore::local(&work.path().join("store")).expect("local store");
    let config = RocksDbConfig { write_buffer_mb: 64, target_file_size_mb: 64, ..RocksDbConfig::default() };
    let range = KeyGroupRange::all(128);
    let mut backend =
        RocksDbStateBackend::open(&work.path().join("db"), &op(), range, &config).expect("open");
    let id = StateId::new("s").expect("state name");
    for k in 0..keys {
        let key = k.to_be_bytes();
        backend.put(&StateKey::new(key_group(k), &id, &key), &value(k, VALUE)).expect("fill");
    }
    let paths = CheckpointPaths::new();
    let mut n = 0u64;
    let mut take = |backend: &mut RocksDbStateBackend, change: u64| -> (Duration, Duration, u64, u64) {
        n += 1;
        let mut x = n.wrapping_mul(0x9e37_79b9);
        for _ in 0..change {
            let k = next(&mut x) % keys;
            let key = k.to_be_bytes();
            backend.put(&StateKey::new(key_group(k), &id, &key), &value(k ^ n, VALUE)).expect("change");
        }
        let location = StateLocation {
            paths: paths.clone(),
            checkpoint: CheckpointId(n),
            operator: op(),
            subtask: SubtaskIndex(0),
            latest_completed: (n > 1).then(|| CheckpointId(n - 1)),
        };
        let t0 = Instant::now();
        let snapshot = backend.snapshot(&location).expect("sync snapshot");
        let sync = t0.elapsed();
        let t1 = Instant::now();
        let result = snapshot.upload(&store).expect("upload");
        let upload = t1.elapsed();
        backend.notify_checkpoint_complete(CheckpointId(n));
        (sync, upload, result.stats.uploaded_bytes, result.handle.state_size())
    };
    // The first, full checkpoint.
    let (sync, upload, bytes, total) = take(&mut backend, 0);
    eprintln!(
        "checkpoint/{mb}MB: first full checkpoint: sync {sync:?}, upload {upload:?} ({bytes} of {total} bytes)"
    );
    let change = keys / 100;
    let mut group = c.benchmark_group(format!("checkpoint/{mb}MB"));
    group.sample_size(10);
    group.bench_function("sync", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| take(&mut backend, change).0).sum())
    });
    group.bench_function("incremental_upload", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    let (_, upload, bytes, total) = take(&mut backend, change);
                    eprintln!("  uploaded {bytes} of {total} bytes");
                    upload
                })
                .sum()
        })
    });
    let (_, _, _, _) = take(&mut backend, change);
    let last = CheckpointId(n);
    let handle_store: &dyn CheckpointStore = &store;
    let snapshot = backend
        .snapshot(&StateLocation {
            paths: paths.clone(),
            checkpoint: last.next(),
            operator: op(),
            subtask: SubtaskIndex(0),
            latest_completed: Some(last),
        })
        .expect("snapshot");
    let handle = snapshot.upload(handle_store).expect("upload").handle;
    group.bench_function("restore", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for i in 0..iters {
                let dir = work.path().join(format!("restore-{i}"));
                let t = Instant::now();
                let r = RocksDbStateBackend::restore(
                    &dir,
                    &op(),
                    range,
                    &config,
                    std::slice::from_ref(&handle),
                    &store,
                )
                .expect("restore");
                total += t.elapsed();
                drop(r);
                let _ = std::fs::remove_dir_all(&dir);
            }
            total
        })
    });
    group.finish();
}

criterion_group!(benches, value_state, read_modify_write, checkpoint);
criterion_main!(benches);

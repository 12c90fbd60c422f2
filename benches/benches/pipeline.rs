#![allow(clippy::unwrap_used)]
//! Hot paths of the temperature pipeline, per record: the generator, °F→°C + filter, key
//! groups, and the window operator.
//!
//! `cargo bench -p caudal-benches --bench pipeline`

use caudal::keygroup::key_group_of;
use caudal::testing::OperatorHarness;
use caudal::Record;
use caudal_jobs::temperature::{is_plausible, to_celsius, ProcessedReading, TempStats};
use caudal_operators::generator::GeneratorConfig;
use caudal_operators::window::{AggregateEmitter, WindowAssigner, WindowOperator};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

const N: u64 = 10_000;

fn bench(c: &mut Criterion) {
    let g = GeneratorConfig { sensors: 10_000, rate: 0.0, records: Some(N), ..Default::default() }
        .build()
        .unwrap();
    let sensors = g.split_sensors(0);
    let readings: Vec<_> = (0..N).map(|n| g.record(0, n, sensors)).collect();

    let mut group = c.benchmark_group("per-record");
    group.throughput(Throughput::Elements(N));
    group.bench_function("generator", |b| {
        b.iter(|| (0..N).map(|n| black_box(g.record(0, n, sensors)).temp_f).sum::<f64>())
    });
    group.bench_function("to-celsius+filter", |b| {
        b.iter(|| readings.iter().cloned().map(to_celsius).filter(is_plausible).count())
    });
    group.bench_function("key-group", |b| {
        b.iter(|| readings.iter().map(|r| key_group_of(&r.sensor_id, 128) as u64).sum::<u64>())
    });
    let processed: Vec<Record<ProcessedReading>> =
        readings.iter().cloned().map(|r| Record::new(r.ts, to_celsius(r))).collect();
    group.bench_function("window-aggregate", |b| {
        b.iter(|| {
            let key: Arc<dyn Fn(&ProcessedReading) -> i64 + Send + Sync> = Arc::new(|r| r.sensor_id);
            let op = WindowOperator::new(
                key,
                WindowAssigner::tumbling(Duration::from_secs(60)),
                0,
                Arc::new(AggregateEmitter(TempStats)),
                false,
            );
            let mut h = OperatorHarness::new(op).unwrap();
            for chunk in processed.chunks(1024) {
                h.process(chunk.to_vec()).unwrap();
            }
            h.watermark(i64::MAX).unwrap();
            h.take().len()
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);

//! Avro codec micro-benchmarks: Caudal's hand-written fast path against apache-avro's
//! generic paths, for `SensorReading` (the record every temperature job decodes).
//!
//! `cargo bench -p caudal-benches --bench avro`
//!
//! Each iteration handles a batch of `BATCH` records, reported as elements/s. The
//! target of DESIGN.md / issue 4 is `decode/fast` ≥ 5 M records/s per core.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use caudal_schemas::apache_avro::reader::datum::GenericDatumReader;
use caudal_schemas::apache_avro::types::Value;
use caudal_schemas::apache_avro::writer::datum::GenericDatumWriter;
use caudal_schemas::apache_avro::{from_value, Schema};
use caudal_schemas::wire::write_header;
use caudal_schemas::{AvroRecord, Deserializer, InMemorySchemaStore, SchemaStore, SensorReading, Serializer};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const BATCH: usize = 1024;

/// Deterministic, realistic readings: 100 sensors, current timestamps, plausible values.
fn readings() -> Vec<SensorReading> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        state >> 11
    };
    (0..BATCH)
        .map(|i| {
            let unit = |n: u64| (n % 1_000_000) as f64 / 1_000_000.0;
            SensorReading {
                sensor_id: (next() % 100) as i64,
                ts: 1_764_500_000_000 + (i as i64) * 10,
                lat: unit(next()) * 180.0 - 90.0,
                lon: unit(next()) * 360.0 - 180.0,
                temp_f: unit(next()) * 120.0 - 20.0,
            }
        })
        .collect()
}

fn to_value(r: &SensorReading) -> Value {
    Value::Record(vec![
        ("sensor_id".into(), Value::Long(r.sensor_id)),
        ("ts".into(), Value::TimestampMillis(r.ts)),
        ("lat".into(), Value::Double(r.lat)),
        ("lon".into(), Value::Double(r.lon)),
        ("temp_f".into(), Value::Double(r.temp_f)),
    ])
}

const SENSOR_V2: &str = r#"{"type":"record","name":"SensorReading","namespace":"io.caudal","fields":[
    {"name":"sensor_id","type":"long"},
    {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
    {"name":"lat","type":"double"},{"name":"lon","type":"double"},
    {"name":"temp_f","type":"double"},
    {"name":"unit","type":"string","default":"F"}]}"#;

fn bench_encode(c: &mut Criterion) {
    let records = readings();
    let schema = SensorReading::schema();
    let mut group = c.benchmark_group("avro/SensorReading/encode");
    group.throughput(Throughput::Elements(BATCH as u64));

    let mut out = Vec::with_capacity(BATCH * 48);
    group.bench_function("fast", |b| {
        b.iter(|| {
            out.clear();
            for r in &records {
                r.encode(&mut out);
            }
            black_box(out.len())
        })
    });

    let serializer = Serializer::<SensorReading>::with_schema_id(1);
    group.bench_function("fast-framed", |b| {
        b.iter(|| {
            out.clear();
            for r in &records {
                serializer.serialize(r, &mut out);
            }
            black_box(out.len())
        })
    });

    let writer = GenericDatumWriter::builder(schema).build().expect("writer");
    group.bench_function("apache-avro-serde", |b| {
        b.iter(|| {
            out.clear();
            for r in &records {
                writer.write_ser(&mut out, r).expect("encode");
            }
            black_box(out.len())
        })
    });
    group.bench_function("apache-avro-value", |b| {
        b.iter(|| {
            out.clear();
            for r in &records {
                writer.write_value(&mut out, to_value(r)).expect("encode");
            }
            black_box(out.len())
        })
    });
    group.finish();
}

fn bench_decode(c: &mut Criterion) {
    let records = readings();
    let schema = SensorReading::schema();
    let mut concatenated = Vec::new();
    for r in &records {
        r.encode(&mut concatenated);
    }
    let mut group = c.benchmark_group("avro/SensorReading/decode");
    group.throughput(Throughput::Elements(BATCH as u64));

    group.bench_function("fast", |b| {
        b.iter(|| {
            let mut buf = concatenated.as_slice();
            let mut sum = 0.0;
            while !buf.is_empty() {
                let r = SensorReading::decode(&mut buf).expect("decode");
                sum += r.temp_f;
            }
            black_box(sum)
        })
    });

    // One Kafka message per record, through the registry-aware deserializer.
    let store = Arc::new(InMemorySchemaStore::new());
    let serializer = Serializer::<SensorReading>::for_topic(store.as_ref(), "earth-temp").expect("register");
    let messages: Vec<Vec<u8>> = records.iter().map(|r| serializer.to_vec(r)).collect();
    let mut deserializer = Deserializer::<SensorReading>::new(store.clone());
    group.bench_function("fast-framed", |b| {
        b.iter(|| {
            let mut sum = 0.0;
            for m in &messages {
                sum += deserializer.deserialize(m).expect("decode").temp_f;
            }
            black_box(sum)
        })
    });

    let reader = GenericDatumReader::builder(schema).build().expect("reader");
    group.bench_function("apache-avro-value", |b| {
        b.iter(|| {
            let mut buf = concatenated.as_slice();
            let mut sum = 0.0;
            while !buf.is_empty() {
                let value = reader.read_value(&mut buf).expect("decode");
                sum += from_value::<SensorReading>(&value).expect("convert").temp_f;
            }
            black_box(sum)
        })
    });
    group.bench_function("apache-avro-serde", |b| {
        b.iter(|| {
            let mut buf = concatenated.as_slice();
            let mut sum = 0.0;
            while !buf.is_empty() {
                sum += reader.read_deser::<SensorReading>(&mut buf).expect("decode").temp_f;
            }
            black_box(sum)
        })
    });

    // Schema evolution: the writer added a defaulted field, so no record can take the
    // fast path as is.
    let v2 = Schema::parse_str(SENSOR_V2).expect("v2 schema");
    let v2_id = store.register("earth-temp-value", &v2).expect("register v2");
    let v2_writer = GenericDatumWriter::builder(&v2).build().expect("writer");
    let v2_messages: Vec<Vec<u8>> = records
        .iter()
        .map(|r| {
            let Value::Record(mut fields) = to_value(r) else { unreachable!("to_value builds records") };
            fields.push(("unit".into(), Value::String("F".into())));
            let mut m = Vec::new();
            write_header(&mut m, v2_id);
            v2_writer.write_value(&mut m, Value::Record(fields)).expect("encode v2");
            m
        })
        .collect();
    // Caudal: a compiled rewrite into the reader layout, then the fast path.
    group.bench_function("evolved-framed", |b| {
        b.iter(|| {
            let mut sum = 0.0;
            for m in &v2_messages {
                sum += deserializer.deserialize(m).expect("decode").temp_f;
            }
            black_box(sum)
        })
    });
    // apache-avro's resolution of the same bytes, reader built once.
    let resolving = GenericDatumReader::builder(&v2).reader_schema(schema).build().expect("reader");
    group.bench_function("evolved-apache-avro-resolution", |b| {
        b.iter(|| {
            let mut sum = 0.0;
            for m in &v2_messages {
                let mut payload = &m[5..];
                let value = resolving.read_value(&mut payload).expect("decode");
                sum += from_value::<SensorReading>(&value).expect("convert").temp_f;
            }
            black_box(sum)
        })
    });
    group.finish();
}

criterion_group! {
    name = avro;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    targets = bench_encode, bench_decode
}
criterion_main!(avro);

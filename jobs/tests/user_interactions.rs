//! The `user-interactions` job against the real broker and registry: produced
//! interactions are counted per user, event type and minute, exactly once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kafka_support;

use caudal_schemas::{AvroRecord, EventType, UserInteraction, UserInteractionCount};
use kafka_support::{create_topic, read_committed, stack, unique, Stack};
use std::collections::BTreeMap;
use std::process::Command;

/// Runs the job over `input` (bounded) into `output`; returns its stderr after checking it
/// succeeded.
fn run_bounded(stack: &Stack, input: &str, output: &str) -> String {
    let ckpt = tempfile::tempdir().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_user-interactions"))
        .args(["--input-topic", input, "--output-topic", output, "--bounded", "--no-ui"])
        .args(["--parallelism", "2", "--checkpoint-interval", "0.5", "--transactional-id-prefix", output])
        .args(["--brokers", &stack.brokers, "--schema-registry", &stack.registry])
        .arg("--checkpoint-dir")
        .arg(ckpt.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr).to_string();
    assert!(run.status.success(), "{err}");
    err
}

#[test]
fn interactions_are_counted_per_user_type_and_minute_exactly_once() {
    let Some(stack) = stack() else { return };
    let (input, output) = (unique("ui-in"), unique("ui-out"));
    create_topic(&stack, &input, 3);
    create_topic(&stack, &output, 2);
    let produced = Command::new(env!("CARGO_BIN_EXE_user-interactions"))
        .args(["produce", "--topic", &input, "--users", "15", "--records", "3000", "--seed", "9"])
        .args(["--brokers", &stack.brokers, "--schema-registry", &stack.registry])
        .output()
        .unwrap();
    assert!(produced.status.success(), "{}", String::from_utf8_lossy(&produced.stderr));

    run_bounded(&stack, &input, &output);

    // What the counts must be, from the input as a reader sees it.
    let mut expected: BTreeMap<(String, EventType, i64), i64> = BTreeMap::new();
    for (_, value) in read_committed(&stack, &input) {
        let e = UserInteraction::from_slice(&value[5..]).unwrap();
        *expected.entry((e.user_id, e.event_type, e.ts - e.ts.rem_euclid(60_000))).or_default() += 1;
    }
    assert_eq!(expected.values().sum::<i64>(), 3000);

    let mut got = BTreeMap::new();
    for (key, value) in read_committed(&stack, &output) {
        let c = UserInteractionCount::from_slice(&value[5..]).unwrap();
        assert_eq!(key, c.user_id.as_bytes(), "counts are keyed by user");
        assert_eq!(c.window_end - c.window_start, 60_000);
        let previous = got.insert((c.user_id, c.event_type, c.window_start), c.count);
        assert!(previous.is_none(), "a window counted twice");
    }
    assert_eq!(got, expected);
}

/// The reference design's own producer (confluent-kafka's `SerializingProducer` and
/// `AvroSerializer`, its schema in `com.mycompany.events` with the event time in
/// `timestamp_ms`; idempotent, acks=all, snappy) feeds the job, and every interaction is
/// counted once (#43: every record failed schema resolution, and the run ended with exit 0
/// and no output). The expected counts come from the input decoded with the writer's own
/// schema by apache-avro, no Caudal code.
#[test]
fn the_reference_designs_producer_feeds_the_job() {
    let Some(stack) = stack() else { return };
    let Some(python) = caudal_test_stack::service("CAUDAL_PYTHON") else { return };
    let (input, output) = (unique("ui-ref-in"), unique("ui-ref-out"));
    create_topic(&stack, &input, 3);
    create_topic(&stack, &output, 2);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/reference-producer.py");
    let produced = Command::new(&python)
        .args([script, &stack.brokers, &stack.registry, &input, "3000", "5"])
        .output()
        .unwrap();
    assert!(
        produced.status.success(),
        "the reference producer failed: {}",
        String::from_utf8_lossy(&produced.stderr)
    );

    let err = run_bounded(&stack, &input, &output);
    assert!(!err.contains("bad record"), "records of the reference producer were refused: {err}");

    // The input as its writer wrote it: each value's schema id, that schema from the
    // registry, the datum decoded with it.
    let registry = caudal_schemas::RegistryClient::new(&stack.registry).unwrap();
    let mut expected: BTreeMap<(String, String, i64), i64> = BTreeMap::new();
    for (_, value) in read_committed(&stack, &input) {
        let id = u32::from_be_bytes(value[1..5].try_into().unwrap());
        let writer = registry.get_schema(id).unwrap();
        let datum = apache_avro::reader::datum::GenericDatumReader::builder(&writer)
            .build()
            .unwrap()
            .read_value(&mut &value[5..])
            .unwrap();
        let apache_avro::types::Value::Record(fields) = datum else { panic!("not a record: {datum:?}") };
        let field = |name: &str| fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()).unwrap();
        let (
            apache_avro::types::Value::String(user),
            apache_avro::types::Value::Enum(_, kind),
            apache_avro::types::Value::Long(ts),
        ) = (field("user_id"), field("event_type"), field("timestamp_ms"))
        else {
            panic!("not the reference schema: {fields:?}")
        };
        *expected.entry((user, kind, ts - ts.rem_euclid(60_000))).or_default() += 1;
    }
    assert_eq!(expected.values().sum::<i64>(), 3000);

    let mut got = BTreeMap::new();
    for (_, value) in read_committed(&stack, &output) {
        let c = UserInteractionCount::from_slice(&value[5..]).unwrap();
        let kind = serde_json::to_value(c.event_type).unwrap().as_str().unwrap().to_string();
        assert!(got.insert((c.user_id, kind, c.window_start), c.count).is_none(), "a window counted twice");
    }
    assert_eq!(got, expected);
}

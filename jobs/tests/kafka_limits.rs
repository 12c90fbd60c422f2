//! Dynamic anomaly limits from a Kafka topic (#16, `--limits-topic`), against the real
//! broker: the temperature job (generator in, files out) judges each reading by the change
//! of its band in force at its event time, as the oracle does without the engine; a record
//! of the limits topic that is not a change is counted and goes to the dead-letter topic,
//! never applied.
//!
//! Needs the test stack (`scripts/services.sh start`); skipped without it unless
//! `CAUDAL_REQUIRE_STACK` is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod kafka_support;

use common::oracle::{self, Limit, Model};
use common::*;
use kafka_support::{create_topic, produce_raw, read_committed_with_headers, stack, unique};

const LIMITS: [Limit; 3] = [
    Limit { band: "south", lat: (-90.0, 0.0), celsius: (-5.0, 30.0), from_ms: None },
    Limit { band: "north", lat: (0.0, 90.0), celsius: (0.0, 25.0), from_ms: Some(10_000) },
    Limit { band: "north", lat: (0.0, 90.0), celsius: (-10.0, 35.0), from_ms: Some(20_000) },
];

#[test]
fn changes_from_a_limits_topic_apply_at_their_event_time_and_bad_records_are_dead_lettered() {
    let Some(stack) = stack() else { return };
    let (topic, dlq) = (unique("limits"), unique("limits-dlq"));
    create_topic(&stack, &topic, 1);
    create_topic(&stack, &dlq, 1);
    let mut records: Vec<(Vec<u8>, Vec<u8>)> =
        LIMITS[..2].iter().map(|l| (Vec::new(), l.json().into_bytes())).collect();
    records.push((Vec::new(), b"{\"band\": \"north\"}".to_vec()));
    records.push((Vec::new(), LIMITS[2].json().into_bytes()));
    produce_raw(&stack, &topic, 0, &records);

    let d = dirs();
    let mut args = base_args(&d.out, &d.ckpt, 2);
    args.extend(
        ["--limits-topic", &topic, "--limits-dead-letter-topic", &dlq, "--brokers", &stack.brokers]
            .map(String::from),
    );
    let (status, err) = wait(spawn(&args, false, &[]));
    assert!(status.success(), "the run failed: {err}");
    let model = Model { limits: &LIMITS, ..BASE_MODEL };
    let (windows, readings) = oracle::expected(&model);
    assert_ne!(readings.len(), oracle::expected(&BASE_MODEL).1.len(), "the limits change the outcome");
    assert_same_lines(&published(&d.out, "readings"), &readings, "readings");
    assert_same_lines(&published(&d.out, "windows"), &windows, "windows");
    let dead = read_committed_with_headers(&stack, &dlq);
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].1, b"{\"band\": \"north\"}", "{dead:?}");
    assert!(
        dead[0].2.iter().any(|(_, v)| v.contains("max_c") || v.contains("missing")),
        "the error is in a header: {dead:?}"
    );
}

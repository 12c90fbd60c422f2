//! The `user-interactions` job against the real broker and registry: produced
//! interactions are counted per user, event type and minute, exactly once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kafka_support;

use caudal_schemas::{AvroRecord, EventType, UserInteraction, UserInteractionCount};
use kafka_support::{create_topic, read_committed, stack, unique};
use std::collections::BTreeMap;
use std::process::Command;

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

    let ckpt = tempfile::tempdir().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_user-interactions"))
        .args(["--input-topic", &input, "--output-topic", &output, "--bounded", "--no-ui"])
        .args(["--parallelism", "2", "--checkpoint-interval", "0.5", "--transactional-id-prefix", &output])
        .args(["--brokers", &stack.brokers, "--schema-registry", &stack.registry])
        .arg("--checkpoint-dir")
        .arg(ckpt.path())
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));

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

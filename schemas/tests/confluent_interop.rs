//! Interoperability with the official Confluent client (`confluent-kafka` from PyPI, in the
//! test stack's venv `$CAUDAL_PYTHON`), in both directions, through the real registry:
//! Confluent-framed Avro written by Caudal is decoded by the client's `AvroDeserializer`,
//! and what the client's `AvroSerializer` writes is decoded by Caudal's `Deserializer`
//! (`scripts/confluent-interop.py` is the client's half). The client's registry checks of
//! `scripts/check-stack.py` (BACKWARD: a defaulted field accepted, a required one refused
//! with 409; Avro through Kafka) run here too, so the test command covers them.
//!
//! Needs `CAUDAL_SCHEMA_REGISTRY` and `CAUDAL_PYTHON` (`scripts/services.sh start`); without
//! them the tests say so and pass, unless `CAUDAL_REQUIRE_STACK` is set (CI).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers

use std::fmt::Debug;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use caudal_schemas::{
    AvroRecord, Deserializer, EventType, RegistryClient, SensorReading, Serializer, UserInteraction,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The registry URL and the venv's python, or `None` (skipped) without the stack.
fn stack() -> Option<(String, String)> {
    let [registry, python] = caudal_test_stack::services(["CAUDAL_SCHEMA_REGISTRY", "CAUDAL_PYTHON"])?;
    Some((registry, python))
}

fn script(name: &str) -> PathBuf {
    // At run time: cargo reuses a test binary built in another checkout of the same workspace.
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")), std::path::PathBuf::from)
        .join("../scripts")
        .join(name)
}

fn unique_topic(what: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("caudal-test-interop-{what}-{}-{nanos}", std::process::id())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// Caudal encodes `records` for the Confluent client to decode, and decodes what the
/// client encodes from the same records: both must give the records back.
fn both_directions<T>(records: &[T])
where
    T: AvroRecord + Serialize + DeserializeOwned + PartialEq + Debug,
{
    let Some((registry, python)) = stack() else { return };
    let client = Arc::new(RegistryClient::new(&registry).unwrap());
    let topic = unique_topic("rt");
    let serializer = Serializer::<T>::for_topic(client.as_ref(), &topic).unwrap();
    let request = serde_json::json!({
        "messages": records.iter().map(|r| hex(&serializer.to_vec(r))).collect::<Vec<_>>(),
        "records": records,
    });
    let mut child = Command::new(&python)
        .arg(script("confluent-interop.py"))
        .args([&registry, &topic])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run $CAUDAL_PYTHON");
    child.stdin.take().unwrap().write_all(request.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the Confluent client failed: {}", String::from_utf8_lossy(&out.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    // Caudal → Confluent: the client's AvroDeserializer reads Caudal's messages.
    let decoded: Vec<T> = serde_json::from_value(answer["decoded"].clone()).unwrap();
    assert_eq!(decoded, records, "what the Confluent client decoded of Caudal's messages");

    // Confluent → Caudal: Caudal's Deserializer reads the client's messages, framed with the
    // id the registry gave Caudal's schema.
    let mut deserializer = Deserializer::<T>::new(Arc::new(RegistryClient::new(&registry).unwrap()));
    let encoded = answer["encoded"].as_array().unwrap();
    assert_eq!(encoded.len(), records.len());
    for (message, want) in encoded.iter().zip(records) {
        let bytes = unhex(message.as_str().unwrap());
        assert_eq!(bytes[0], 0, "magic byte");
        assert_eq!(u32::from_be_bytes(bytes[1..5].try_into().unwrap()), serializer.schema_id());
        assert_eq!(&deserializer.deserialize(&bytes).unwrap(), want, "Caudal decoding the client's message");
    }
}

#[test]
fn sensor_readings_cross_between_caudal_and_the_confluent_client_both_ways() {
    both_directions(&[
        SensorReading { sensor_id: 1, ts: 1_767_225_600_000, lat: 48.85, lon: 2.35, temp_f: 71.6 },
        SensorReading { sensor_id: -7, ts: 0, lat: -90.0, lon: 180.0, temp_f: -40.0 },
        SensorReading { sensor_id: i64::MAX, ts: 1_700_000_000_123, lat: 0.1, lon: -0.2, temp_f: 1e-3 },
    ]);
}

#[test]
fn user_interactions_with_enum_and_optional_field_cross_both_ways() {
    both_directions(&[
        UserInteraction {
            user_id: "u-1".into(),
            event_type: EventType::Click,
            ts: 1_767_225_600_000,
            page_url: Some("https://example.org/é".into()),
        },
        UserInteraction { user_id: String::new(), event_type: EventType::Purchase, ts: 1, page_url: None },
    ]);
}

#[test]
fn the_confluent_clients_registry_checks_of_check_stack_pass() {
    let Some((_, python)) = stack() else { return };
    // The registry part of check-stack.py, with the broker when the stack has one (Avro
    // through Kafka with the client's serializers).
    let out =
        Command::new(&python).arg(script("check-stack.py")).args(["--require-all", "registry"]).output();
    let out = out.expect("run $CAUDAL_PYTHON scripts/check-stack.py");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "check-stack.py registry failed:\n{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(report.contains("check-stack: 1 passed, 0 failed, 0 skipped"), "{report}");
    assert!(report.contains("incompatible rejected (409)"), "{report}");
}

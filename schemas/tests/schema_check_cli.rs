//! `caudal-schema check` against the real registry: a compatible evolution passes, an
//! incompatible one is reported with the field at fault, and the registry agrees.
//!
//! Needs `CAUDAL_SCHEMA_REGISTRY` (`scripts/services.sh start`); skipped without it unless
//! `CAUDAL_REQUIRE_STACK` is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use caudal_schemas::{subject_for_topic, AvroRecord, CompatibilityLevel, RegistryClient, SensorReading};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

fn registry() -> Option<String> {
    caudal_test_stack::service("CAUDAL_SCHEMA_REGISTRY")
}

const WITH_DEFAULTED_UNIT: &str = r#"{"type":"record","name":"SensorReading","namespace":"io.caudal","fields":[
    {"name":"sensor_id","type":"long"},
    {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
    {"name":"lat","type":"double"},{"name":"lon","type":"double"},
    {"name":"temp_f","type":"double"},
    {"name":"unit","type":"string","default":"F"}]}"#;

const WITH_REQUIRED_UNIT: &str = r#"{"type":"record","name":"SensorReading","namespace":"io.caudal","fields":[
    {"name":"sensor_id","type":"long"},
    {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
    {"name":"lat","type":"double"},{"name":"lon","type":"double"},
    {"name":"temp_f","type":"double"},
    {"name":"unit","type":"string"}]}"#;

const TEMP_AS_STRING: &str = r#"{"type":"record","name":"SensorReading","namespace":"io.caudal","fields":[
    {"name":"sensor_id","type":"long"},
    {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
    {"name":"lat","type":"double"},{"name":"lon","type":"double"},
    {"name":"temp_f","type":"string"}]}"#;

fn check(registry: &str, subject: &str, schema: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("new.avsc");
    std::fs::write(&file, schema).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_caudal-schema"))
        .arg("check")
        .arg(&file)
        .args(["--subject", subject, "--registry", registry, "--ask-registry"])
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn schema_check_reports_compatible_and_incompatible_evolutions_as_the_registry_does() {
    let Some(registry) = registry() else { return };
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    let subject = subject_for_topic(&format!("schema-check-{}-{nanos}", std::process::id()));
    let client = RegistryClient::new(&registry).unwrap();
    client.set_compatibility(&subject, CompatibilityLevel::Backward).unwrap();
    client.register_json(&subject, SensorReading::schema_json()).unwrap();

    let (code, out) = check(&registry, &subject, WITH_DEFAULTED_UNIT);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("compatible") && out.contains("registry says: compatible"), "{out}");

    let (code, out) = check(&registry, &subject, WITH_REQUIRED_UNIT);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("INCOMPATIBLE") && out.contains("`unit`"), "{out}");
    assert!(out.contains("registry says: incompatible"), "{out}");

    let (code, out) = check(&registry, &subject, TEMP_AS_STRING);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("temp_f"), "{out}");
}

#[test]
fn schema_check_of_an_unknown_subject_or_a_bad_file_is_an_error_not_a_verdict() {
    let Some(registry) = registry() else { return };
    let (code, out) = check(&registry, "no-such-subject-caudal-value", WITH_DEFAULTED_UNIT);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("404") || out.contains("no-such-subject"), "{out}");
    let (code, out) = check(&registry, "x-value", "{not avro");
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("not a valid Avro schema"), "{out}");
}

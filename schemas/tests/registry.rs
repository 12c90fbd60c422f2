//! The registry client against a real Confluent-compatible registry, whose base URL is
//! taken from `CAUDAL_SCHEMA_REGISTRY` (e.g. `http://127.0.0.1:18081` or an Apicurio
//! `.../apis/ccompat/v7` URL).
//!
//! Without the variable the tests print why and pass, unless `CAUDAL_REQUIRE_STACK` is
//! set (CI), in which case they fail.

#![allow(clippy::unwrap_used)] // test helpers

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use caudal_schemas::wire::write_header;
use caudal_schemas::{
    codec::encode_generic, subject_for_topic, AvroRecord, CompatibilityLevel, Deserializer, Error,
    RegistryClient, Schema, SchemaStore, SensorReading, Serializer, UserInteraction,
};

fn registry() -> Option<RegistryClient> {
    let url = caudal_test_stack::service("CAUDAL_SCHEMA_REGISTRY")?;
    Some(RegistryClient::new(&url).expect("CAUDAL_SCHEMA_REGISTRY is not a URL"))
}

/// A topic name no other run has used, so tests never see each other's versions.
fn unique_topic(what: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("caudal-test-{what}-{}-{nanos}", std::process::id())
}

const SENSOR_V2_WITH_UNIT: &str = r#"{"type":"record","name":"SensorReading","namespace":"io.caudal","fields":[
    {"name":"sensor_id","type":"long"},
    {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
    {"name":"lat","type":"double"},{"name":"lon","type":"double"},
    {"name":"temp_f","type":"double"},
    {"name":"unit","type":"string","default":"F"}]}"#;

const SENSOR_V2_UNIT_NO_DEFAULT: &str = r#"{"type":"record","name":"SensorReading","namespace":"io.caudal","fields":[
    {"name":"sensor_id","type":"long"},
    {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
    {"name":"lat","type":"double"},{"name":"lon","type":"double"},
    {"name":"temp_f","type":"double"},
    {"name":"unit","type":"string"}]}"#;

#[test]
fn register_is_idempotent_and_ids_resolve_from_a_fresh_client() {
    let Some(client) = registry() else { return };
    let subject = subject_for_topic(&unique_topic("register"));
    let id = client.register(&subject, SensorReading::schema()).expect("register");
    assert_eq!(client.register(&subject, SensorReading::schema()).unwrap(), id);

    let fresh = RegistryClient::new(client.base_url()).unwrap();
    assert_eq!(
        fresh.register(&subject, SensorReading::schema()).unwrap(),
        id,
        "registering the same schema again must return the same id"
    );
    let fetched = fresh.get_schema(id).unwrap();
    assert_eq!(&*fetched, SensorReading::schema());

    let latest = fresh.latest(&subject).unwrap();
    assert_eq!((latest.id, latest.version), (id, 1));
    assert_eq!(latest.subject, subject);
    assert!(fresh.subjects().unwrap().contains(&subject));
}

#[test]
fn unknown_ids_and_subjects_are_named_errors() {
    let Some(client) = registry() else { return };
    let err = client.get_schema(2_000_000_000).unwrap_err();
    assert!(matches!(err, Error::UnknownSchemaId { id: 2_000_000_000 }), "{err}");
    assert!(err.is_bad_data());

    let subject = subject_for_topic(&unique_topic("missing"));
    match client.latest(&subject).unwrap_err() {
        Error::Registry(e) => {
            assert_eq!(e.status, 404, "{e}");
            assert!(e.to_string().contains(&subject), "{e}");
        }
        other => panic!("expected a registry error, got {other}"),
    }
}

#[test]
fn backward_subject_accepts_defaulted_fields_and_refuses_required_ones() {
    let Some(client) = registry() else { return };
    let subject = subject_for_topic(&unique_topic("backward"));
    client.set_compatibility(&subject, CompatibilityLevel::Backward).unwrap();
    let v1 = client.register(&subject, SensorReading::schema()).unwrap();
    assert_eq!(client.compatibility(&subject).unwrap(), Some(CompatibilityLevel::Backward));

    // Adding a field without a default: new readers could not read v1 data.
    let report = client.test_compatibility(&subject, SENSOR_V2_UNIT_NO_DEFAULT).unwrap();
    assert!(!report.is_compatible, "{report:?}");
    // Our local check agrees with the registry, and names the field.
    let new = Schema::parse_str(SENSOR_V2_UNIT_NO_DEFAULT).unwrap();
    assert!(caudal_schemas::check_backward(&new, SensorReading::schema()).is_err());
    let verdict = client.check_against_latest(&subject, &new).unwrap();
    let reason = verdict.unwrap_err().reason;
    assert!(reason.contains("`unit`"), "{reason}");
    match client.register_json(&subject, SENSOR_V2_UNIT_NO_DEFAULT) {
        Err(Error::Registry(e)) => assert_eq!(e.status, 409, "{e}"),
        other => panic!("an incompatible schema must be refused with 409, got {other:?}"),
    }

    // Adding it with a default is fine.
    let report = client.test_compatibility(&subject, SENSOR_V2_WITH_UNIT).unwrap();
    assert!(report.is_compatible, "{report:?}");
    let with_default = Schema::parse_str(SENSOR_V2_WITH_UNIT).unwrap();
    assert_eq!(client.check_against_latest(&subject, &with_default).unwrap(), Ok(()));
    let v2 = client.register_json(&subject, SENSOR_V2_WITH_UNIT).unwrap();
    assert_ne!(v1, v2);
    assert_eq!(client.latest(&subject).unwrap().version, 2);
}

#[test]
fn serializer_and_deserializer_through_the_registry_with_evolution() {
    let Some(client) = registry() else { return };
    let client = Arc::new(client);
    let topic = unique_topic("serdes");
    let serializer = Serializer::<SensorReading>::for_topic(client.as_ref(), &topic).unwrap();
    let reading = SensorReading { sensor_id: 11, ts: 1_700_000_000_000, lat: 1.5, lon: -2.5, temp_f: 98.6 };
    let message = serializer.to_vec(&reading);

    // A consumer with its own client: the id is resolved through the registry.
    let consumer = Arc::new(RegistryClient::new(client.base_url()).unwrap());
    let mut deserializer = Deserializer::<SensorReading>::new(consumer);
    assert_eq!(deserializer.deserialize(&message).unwrap(), reading);
    assert_eq!(deserializer.last_fast_id(), Some(serializer.schema_id()));

    // A producer moves to v2 (added defaulted field): the running reader keeps reading.
    let subject = subject_for_topic(&topic);
    let v2_id = client.register_json(&subject, SENSOR_V2_WITH_UNIT).unwrap();
    #[derive(serde::Serialize)]
    struct V2<'a> {
        sensor_id: i64,
        ts: i64,
        lat: f64,
        lon: f64,
        temp_f: f64,
        unit: &'a str,
    }
    let v2 = Schema::parse_str(SENSOR_V2_WITH_UNIT).unwrap();
    let mut message = Vec::new();
    write_header(&mut message, v2_id);
    message.extend(
        encode_generic(
            &v2,
            &V2 { sensor_id: 11, ts: 1_700_000_000_000, lat: 1.5, lon: -2.5, temp_f: 98.6, unit: "F" },
        )
        .unwrap(),
    );
    assert_eq!(deserializer.deserialize(&message).unwrap(), reading);

    // And another record type under another topic gets another id.
    let other = Serializer::<UserInteraction>::for_topic(client.as_ref(), &unique_topic("ui")).unwrap();
    assert_ne!(other.schema_id(), serializer.schema_id());
}

//! The registry client against the stack's secured registry (#44): HTTPS with a CA of the
//! stack's own and HTTP basic auth, configured by the Confluent clients' property names in
//! the `client.properties` of `CAUDAL_KAFKA_SECURE_CONFIG`. Schemas are registered and
//! read through it, and every wrong setting fails at once with its cause, never as
//! something a retry could mend, and without showing the password.
//!
//! Without the variable the tests print why and pass, unless `CAUDAL_REQUIRE_STACK` is
//! set (CI), in which case they fail.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use caudal_schemas::{
    subject_for_topic, AvroRecord, ClientProperties, CompatibilityLevel, Error, RegistryAccess,
    RegistryClient, RegistryCredentials, SchemaStore, SensorReading,
};

/// The stack's client.properties, and the access it describes.
fn secured() -> Option<(std::path::PathBuf, RegistryAccess)> {
    let config = caudal_test_stack::service("CAUDAL_KAFKA_SECURE_CONFIG")?;
    let properties = ClientProperties::load(config.as_ref()).unwrap();
    let access = RegistryAccess::from_properties("http://unused:1", &properties).unwrap();
    assert!(access.is_https(), "the stack's secured registry is not HTTPS: {access:?}");
    assert!(access.credentials.is_some() && access.ca.is_some(), "{access:?}");
    Some((config.into(), access))
}

fn connect(access: &RegistryAccess) -> Result<RegistryClient, Error> {
    RegistryClient::connect(access, Duration::from_secs(10))
}

fn unique_subject(what: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    subject_for_topic(&format!("caudal-secured-{what}-{}-{nanos}", std::process::id()))
}

fn password(access: &RegistryAccess) -> String {
    match &access.credentials {
        Some(RegistryCredentials::Basic { password, .. }) => password.clone(),
        other => panic!("the stack's registry takes basic auth: {other:?}"),
    }
}

#[test]
fn schemas_are_registered_and_read_over_https_with_basic_auth() {
    let Some((_, access)) = secured() else { return };
    let client = connect(&access).unwrap();
    client.check_access().expect("the secured registry let the client in");
    let subject = unique_subject("register");
    let id = client.register(&subject, SensorReading::schema()).expect("register over HTTPS");
    let fresh = connect(&access).unwrap();
    assert_eq!(&*fresh.schema_by_id(id).unwrap(), SensorReading::schema());
    assert_eq!(fresh.latest(&subject).unwrap().id, id);
}

#[test]
fn a_wrong_password_is_a_refusal_no_retry_mends_and_the_password_is_not_shown() {
    let Some((_, access)) = secured() else { return };
    let right = password(&access);
    let wrong = RegistryAccess {
        credentials: Some(RegistryCredentials::Basic { user: "caudal".into(), password: "not-it".into() }),
        ..access.clone()
    };
    let e = connect(&wrong).unwrap().check_access().unwrap_err();
    assert!(matches!(&e, Error::Registry(r) if r.status == 401), "{e}");
    assert!(!e.is_retryable(), "{e}");
    let shown = format!("{e} {e:?} {wrong:?}");
    assert!(!shown.contains("not-it") && !shown.contains(&right), "a password was shown: {shown}");

    let anonymous = RegistryAccess { credentials: None, ..access };
    let e =
        connect(&anonymous).unwrap().register(&unique_subject("anon"), SensorReading::schema()).unwrap_err();
    assert!(matches!(&e, Error::Registry(r) if r.status == 401), "{e}");
    assert!(!e.is_retryable(), "{e}");
}

#[test]
fn a_registry_certificate_of_an_unknown_ca_is_refused_naming_the_setting() {
    let Some((_, access)) = secured() else { return };
    // The system's roots do not know the stack's CA.
    let system_roots = RegistryAccess { ca: None, ..access.clone() };
    let e = connect(&system_roots).unwrap().check_access().unwrap_err();
    assert!(matches!(e, Error::RegistryRefused { .. }), "{e:?}");
    assert!(!e.is_retryable());
    assert!(e.to_string().contains("schema.registry.ssl.ca.location"), "{e}");

    // Plain HTTP to the TLS port is not a registry: retryable at most, never a success.
    let plain = RegistryAccess { url: access.url.replacen("https://", "http://", 1), ..access.clone() };
    assert!(connect(&plain).unwrap().check_access().is_err());

    // A CA file that is not one fails when the client is made.
    let dir = tempfile::tempdir().unwrap();
    let bogus = dir.path().join("ca.pem");
    std::fs::write(&bogus, "not a certificate").unwrap();
    let e = connect(&RegistryAccess { ca: Some(bogus), ..access }).unwrap_err();
    assert!(
        matches!(e, Error::RegistryRefused { .. }) && e.to_string().contains("no PEM certificate"),
        "{e}"
    );
}

/// `caudal schema check --kafka-config client.properties`: the URL, credentials and CA all
/// from the file; with a wrong password in it, exit status 2 naming 401.
#[test]
fn schema_check_reaches_the_secured_registry_through_the_client_properties() {
    let Some((config, access)) = secured() else { return };
    let client = connect(&access).unwrap();
    let subject = unique_subject("check");
    client.set_compatibility(&subject, CompatibilityLevel::Backward).unwrap();
    client.register_json(&subject, SensorReading::schema_json()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("same.avsc");
    std::fs::write(&schema, SensorReading::schema_json()).unwrap();
    let check = |config: &std::path::Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_caudal-schema"))
            .arg("check")
            .arg(&schema)
            .args(["--subject", &subject, "--ask-registry", "--kafka-config"])
            .arg(config)
            .output()
            .unwrap();
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.code(), text)
    };
    let (code, out) = check(&config);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("registry says: compatible"), "{out}");

    let right = password(&access);
    let wrong = dir.path().join("wrong.properties");
    std::fs::write(&wrong, std::fs::read_to_string(&config).unwrap().replace(&right, "not-it")).unwrap();
    let (code, out) = check(&wrong);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("401"), "{out}");
    assert!(!out.contains("not-it") && !out.contains(&right), "a password was shown: {out}");
}

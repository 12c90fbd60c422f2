//! `caudal-schema check NEW.avsc --subject SUBJECT --registry URL` (also reached as
//! `caudal schema check …`): is NEW compatible with the latest version of SUBJECT at the
//! subject's compatibility level (BACKWARD unless configured otherwise)? Run it before a
//! deploy. Exit status 0: compatible; 1: incompatible, with the reason; 2: the check could
//! not be made (bad file, registry unreachable or refusing, unknown subject).
//!
//! `--kafka-config FILE` reads the registry's URL, credentials and CA from the jobs'
//! `client.properties` (schema.registry.url, basic.auth.*, bearer.auth.token,
//! schema.registry.ssl.*); `--registry` names another URL.
//!
//! The registry also answers the same question (`--ask-registry`): both verdicts are shown
//! and must agree.

use caudal_schemas::{ClientProperties, RegistryAccess, RegistryClient, Schema};
use std::process::ExitCode;

const USAGE: &str = "usage: caudal-schema check NEW.avsc --subject SUBJECT \
                     (--registry URL | --kafka-config client.properties) [--ask-registry]";

struct Check {
    file: String,
    subject: String,
    registry: RegistryAccess,
    ask_registry: bool,
}

fn parse(args: &[String]) -> Result<Check, String> {
    let mut it = args.iter();
    match it.next().map(String::as_str) {
        Some("check") => {}
        Some("-h" | "--help") | None => return Err(USAGE.to_owned()),
        Some(other) => return Err(format!("unknown command `{other}`\n{USAGE}")),
    }
    let (mut file, mut subject, mut registry, mut ask_registry) = (None, None, None, false);
    let mut config = std::env::var_os("CAUDAL_KAFKA_CONFIG").map(std::path::PathBuf::from);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--subject" => subject = it.next().cloned(),
            "--registry" => registry = it.next().cloned(),
            "--kafka-config" => config = it.next().map(std::path::PathBuf::from),
            "--ask-registry" => ask_registry = true,
            flag if flag.starts_with("--") => return Err(format!("unknown flag `{flag}`\n{USAGE}")),
            path => file = Some(path.to_owned()),
        }
    }
    // The URL: --registry, else the file's schema.registry.url, else $CAUDAL_SCHEMA_REGISTRY.
    let properties = match &config {
        Some(path) => ClientProperties::load(path).map_err(|e| format!("--kafka-config: {e}"))?,
        None => ClientProperties::default(),
    };
    let access = RegistryAccess::resolve(registry.as_deref(), &properties, "")
        .map_err(|e| format!("--kafka-config: {e}"))?;
    let access = (!access.url.trim().is_empty()).then_some(access);
    match (file, subject, access) {
        (Some(file), Some(subject), Some(registry)) => Ok(Check { file, subject, registry, ask_registry }),
        _ => Err(format!("NEW.avsc, --subject and --registry (or --kafka-config) are required\n{USAGE}")),
    }
}

fn run(check: &Check) -> Result<bool, String> {
    let text = std::fs::read_to_string(&check.file).map_err(|e| format!("reading {}: {e}", check.file))?;
    let new =
        Schema::parse_str(&text).map_err(|e| format!("{} is not a valid Avro schema: {e}", check.file))?;
    let client = RegistryClient::connect(&check.registry, caudal_schemas::registry::DEFAULT_TIMEOUT)
        .map_err(|e| e.to_string())?;
    let verdict = client.check_against_latest(&check.subject, &new).map_err(|e| e.to_string())?;
    let compatible = match &verdict {
        Ok(()) => {
            println!("compatible: {} can be registered under `{}`", check.file, check.subject);
            true
        }
        Err(incompatible) => {
            println!(
                "INCOMPATIBLE ({:?}) with the latest version of `{}`: {}",
                incompatible.level, check.subject, incompatible.reason
            );
            false
        }
    };
    if check.ask_registry {
        let report = client.test_compatibility(&check.subject, &text).map_err(|e| e.to_string())?;
        println!("registry says: {}", if report.is_compatible { "compatible" } else { "incompatible" });
        if report.is_compatible != compatible {
            return Err("the registry and Caudal's check disagree".to_owned());
        }
    }
    Ok(compatible)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let check = match parse(&args) {
        Ok(check) => check,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match run(&check) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(message) => {
            eprintln!("caudal-schema: {message}");
            ExitCode::from(2)
        }
    }
}

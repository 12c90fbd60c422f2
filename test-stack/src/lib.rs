//! Tests only: the one gate of every test that needs a service of the test stack
//! (`scripts/services.sh start`, whose `env` sets `CAUDAL_KAFKA_BROKERS`,
//! `CAUDAL_SCHEMA_REGISTRY`, `CAUDAL_S3_ENDPOINT`, `CAUDAL_POSTGRES_URL`, and
//! `CAUDAL_ICEBERG_REST_URL` once `start iceberg-rest` ran, …).
//!
//! In: the environment. Out: the service's address, or `None` — the test then says why and
//! passes — unless the stack is required ([`required`]: `CAUDAL_REQUIRE_STACK` set to
//! anything but empty or `0`, as the test command sets it), in which case the test fails.
//! Leaf crates can dev-depend on it: it depends on nothing.
//!
//! Also the ports of servers a test starts itself ([`free_port`]).

mod ports;

pub use ports::{free_addr, free_port};

/// True when a missing service is a failure, not a skip.
pub fn required() -> bool {
    std::env::var("CAUDAL_REQUIRE_STACK").is_ok_and(|v| !v.trim().is_empty() && v.trim() != "0")
}

/// The values of `vars` (all of them set and not empty), or `None` after saying which is
/// missing; panics instead when the stack is [`required`].
pub fn services<const N: usize>(vars: [&str; N]) -> Option<[String; N]> {
    let values = vars.map(|v| std::env::var(v).ok().filter(|s| !s.trim().is_empty()));
    if values.iter().all(Option::is_some) {
        return Some(values.map(Option::unwrap_or_default));
    }
    let missing: Vec<&str> = vars.iter().zip(&values).filter(|(_, v)| v.is_none()).map(|(n, _)| *n).collect();
    // The services started only when named.
    let named: Vec<&str> =
        missing.iter().filter_map(|m| (*m == "CAUDAL_ICEBERG_REST_URL").then_some("iceberg-rest")).collect();
    let why = format!(
        "{} not set: run scripts/services.sh start{} and eval \"$(scripts/services.sh env)\"",
        missing.join(", "),
        if named.is_empty() { String::new() } else { format!(" (then start {})", named.join(" ")) }
    );
    assert!(!required(), "{why} (CAUDAL_REQUIRE_STACK is set: the test stack must run)");
    eprintln!("skipped: {why}");
    None
}

/// The value of `var`, as [`services`] with one.
pub fn service(var: &str) -> Option<String> {
    services([var]).map(|[v]| v)
}

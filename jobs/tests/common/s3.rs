//! The S3 server of the test stack (`scripts/services.sh`): the settings a job gets, a store
//! the test reads with, and a fresh prefix per test.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

/// The S3 test stack's settings, or `None` (the test then says why and passes) unless
/// `CAUDAL_REQUIRE_STACK` is set.
pub fn env() -> Option<Vec<(&'static str, String)>> {
    let endpoint = caudal_test_stack::service("CAUDAL_S3_ENDPOINT")?;
    let var = |n: &str, d: &str| std::env::var(n).unwrap_or_else(|_| d.to_string());
    Some(vec![
        ("CAUDAL__S3__ALLOW_HTTP", endpoint.starts_with("http://").to_string()),
        ("CAUDAL__S3__ENDPOINT", endpoint),
        ("CAUDAL__S3__REGION", var("CAUDAL_S3_REGION", "us-east-1")),
        ("CAUDAL__S3__ACCESS_KEY_ID", var("CAUDAL_S3_ACCESS_KEY_ID", "test")),
        ("CAUDAL__S3__SECRET_ACCESS_KEY", var("CAUDAL_S3_SECRET_ACCESS_KEY", "test")),
    ])
}

pub fn store(url: &str, env: &[(&str, String)]) -> caudal_checkpoints::ObjectCheckpointStore {
    let get = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
    let endpoint = get("CAUDAL__S3__ENDPOINT");
    caudal_checkpoints::CheckpointStorageConfig {
        url: url.to_string(),
        s3: caudal_checkpoints::S3Config {
            allow_http: endpoint.as_deref().is_some_and(|e| e.starts_with("http://")),
            endpoint,
            region: get("CAUDAL__S3__REGION").unwrap(),
            access_key_id: get("CAUDAL__S3__ACCESS_KEY_ID"),
            secret_access_key: get("CAUDAL__S3__SECRET_ACCESS_KEY"),
            ..Default::default()
        },
    }
    .build()
    .unwrap()
}

/// `s3://<bucket>/tests/<name>-<unique>`: a prefix no other test or run uses.
pub fn unique_url(name: &str) -> String {
    let bucket = std::env::var("CAUDAL_S3_BUCKET").unwrap_or_else(|_| "caudal".into());
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("s3://{bucket}/tests/{name}-{}-{nanos}", std::process::id())
}

//! The S3 path against a real S3-compatible server (moto, started by
//! `scripts/services.sh start`).
//!
//! Reads `CAUDAL_S3_ENDPOINT`, `CAUDAL_S3_BUCKET`, `CAUDAL_S3_ACCESS_KEY_ID`,
//! `CAUDAL_S3_SECRET_ACCESS_KEY`, `CAUDAL_S3_REGION`. Without `CAUDAL_S3_ENDPOINT` the
//! test says so and passes, unless `CAUDAL_REQUIRE_STACK=1`.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use caudal_checkpoints::*;
use common::{checkpoint, dump, open, restore, Kind};

fn s3_store(prefix: &str, conditional_put: bool) -> Option<ObjectCheckpointStore> {
    let endpoint = caudal_test_stack::service("CAUDAL_S3_ENDPOINT")?;
    let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_string());
    let bucket = var("CAUDAL_S3_BUCKET", "caudal");
    let config = CheckpointStorageConfig {
        url: format!("s3://{bucket}/{prefix}"),
        s3: S3Config {
            endpoint: Some(endpoint.clone()),
            region: var("CAUDAL_S3_REGION", "us-east-1"),
            access_key_id: Some(var("CAUDAL_S3_ACCESS_KEY_ID", "test")),
            secret_access_key: Some(var("CAUDAL_S3_SECRET_ACCESS_KEY", "test")),
            allow_http: endpoint.starts_with("http://"),
            conditional_put,
            ..Default::default()
        },
    };
    Some(config.build().unwrap())
}

fn unique_prefix(name: &str) -> String {
    format!("tests/{name}-{}", uuid::Uuid::new_v4().simple())
}

#[test]
fn s3_checkpoint_restore_and_retention() {
    let Some(store) = s3_store(&unique_prefix("ckpt"), true) else {
        return;
    };
    let paths = CheckpointPaths::under("temperature");
    let range = KeyGroupRange::all(128);
    let mut t = open(Kind::RocksDb, range);
    let id = StateId::new("s").unwrap();
    for n in 1..=4u64 {
        for i in 0..2_000u32 {
            t.backend.put(&StateKey::new((i % 128) as u16, &id, &i.to_be_bytes()), &[n as u8; 64]).unwrap();
        }
        let (_, stats) = checkpoint(&store, &paths, "temperature", n, &mut [&mut t]);
        if n > 1 {
            assert!(stats[0].reused_files > 0 || stats[0].uploaded_files > 0);
        }
        apply_retention(&store, &paths, "temperature", &RetentionConfig::default()).unwrap();
    }
    // The metadata cannot be written twice (conditional put on the server).
    let again = store.put_if_absent(&paths.metadata(CheckpointId(4)), bytes::Bytes::from_static(b"{}"));
    assert!(matches!(again, Err(Error::AlreadyExists { .. })), "{again:?}");

    let meta = latest_completed(&store, &paths, "temperature").unwrap().unwrap();
    assert_eq!(meta.checkpoint_id, CheckpointId(4));
    let ids = metadata::completed_checkpoints(&store, &paths).unwrap();
    assert_eq!(ids, vec![CheckpointId(2), CheckpointId(3), CheckpointId(4)]);
    let r = restore(Kind::RocksDb, range, &meta.operators[&common::op()].keyed_handles(), &store).unwrap();
    assert_eq!(dump(r.backend.as_ref()), dump(t.backend.as_ref()));
    store::delete_dir(&store, "").unwrap();
}

#[test]
fn s3_store_contract_with_and_without_conditional_put() {
    for conditional in [true, false] {
        let Some(store) = s3_store(&unique_prefix("contract"), conditional) else {
            return;
        };
        store.put("a/1", bytes::Bytes::from_static(b"one")).unwrap();
        assert_eq!(store.head("a/1").unwrap(), Some(3));
        assert_eq!(store.list_dirs("").unwrap(), ["a"]);
        store.put_if_absent("a/m", bytes::Bytes::from_static(b"m")).unwrap();
        assert!(matches!(
            store.put_if_absent("a/m", bytes::Bytes::from_static(b"n")),
            Err(Error::AlreadyExists { .. })
        ));
        assert_eq!(&store.get("a/m").unwrap()[..], b"m");
        store.copy("a/m", "b/m").unwrap();
        assert_eq!(store::delete_dir(&store, "").unwrap(), 3);
        assert!(store.list("").unwrap().is_empty());
    }
}

//! The Iceberg sink's protocol against the real catalogs — the SQL catalog's database
//! (`CAUDAL_POSTGRES_URL`) and the stack's REST catalog (`CAUDAL_ICEBERG_REST_URL`) — and a
//! local or S3 (`CAUDAL_S3_ENDPOINT`) warehouse, driving the writer and the committer by
//! hand: one snapshot per completed checkpoint with its id, no second commit of an epoch the
//! table has, pending epochs committed on restore, files of dead attempts deleted. The table
//! is read back with the `iceberg` crate's scan here; `jobs/tests/iceberg.rs` reads it with
//! pyiceberg after real runs and kills.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::{summary, DataFiles, IcebergCatalog, IcebergCommitter, IcebergConfig, IcebergWriter};
use crate::test_stack::{context, service, unique};
use caudal::{Batch, CheckpointId, Operator, OperatorContext, Record, Sink};
use caudal_checkpoints::S3Config;
use caudal_schemas::ProcessedReading;
use futures::TryStreamExt;
use iceberg::{Catalog, TableIdent};

const DAY: i64 = 86_400_000;
const START: i64 = 1_767_225_600_000; // 2026-01-01T00:00Z

fn readings(from: i64, n: i64) -> Batch<ProcessedReading> {
    (from..from + n)
        .map(|i| {
            let ts = START + (i % 3) * DAY + i;
            Record::new(
                ts,
                ProcessedReading {
                    sensor_id: i,
                    ts,
                    lat: 1.0,
                    lon: 2.0,
                    temp_c: 20.0,
                    temp_f: 68.0,
                    site: "roof".into(),
                    name: format!("sensor {i}"),
                },
            )
        })
        .collect()
}

fn ctx(attempt: &str, restored: Option<u64>) -> OperatorContext {
    let mut c = context("iceberg-test", 0, restored);
    c.attempt = attempt.to_string();
    c
}

/// What the table holds: sensor ids (sorted) and the snapshots' checkpoint ids.
fn table_contents(config: &IcebergConfig) -> (Vec<i64>, Vec<String>, String) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let catalog = IcebergCatalog::for_config(config).await.unwrap();
        let (ns, name) = config.table_ident().unwrap();
        let ident = TableIdent::new(iceberg::NamespaceIdent::from_vec(ns).unwrap(), name);
        let table = catalog.load_table(&ident).await.unwrap();
        let mut ids = Vec::new();
        if table.metadata().current_snapshot().is_some() {
            let batches: Vec<arrow_array::RecordBatch> = table
                .scan()
                .select(["sensor_id"])
                .build()
                .unwrap()
                .to_arrow()
                .await
                .unwrap()
                .try_collect()
                .await
                .unwrap();
            for b in batches {
                let col = b.column(0).as_any().downcast_ref::<arrow_array::Int64Array>().unwrap();
                ids.extend(col.values().iter().copied());
            }
        }
        ids.sort_unstable();
        let mut snapshots: Vec<_> = table.metadata().snapshots().collect();
        snapshots.sort_by_key(|s| s.sequence_number());
        let checkpoints = snapshots
            .iter()
            .map(|s| s.summary().additional_properties.get(summary::CHECKPOINT).cloned().unwrap_or_default())
            .collect();
        (ids, checkpoints, table.metadata().location().to_string())
    })
}

fn data_files(location: &str, s3: &S3Config) -> Vec<String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut files = rt.block_on(super::storage::list(s3, &format!("{location}/data"))).unwrap();
    files.sort();
    files
}

fn config(warehouse: &str, s3: S3Config) -> Option<IcebergConfig> {
    let pg = service("CAUDAL_POSTGRES_URL")?;
    let mut c = IcebergConfig::new(&pg, warehouse, &format!("{}.readings", unique("ns")));
    c.s3 = s3;
    Some(c)
}

fn protocol(config: IcebergConfig) {
    // Attempt a1: epoch 1 (100 readings over three days) completes and commits.
    let mut writer = IcebergWriter::<ProcessedReading>::new(config.clone(), "lake".into());
    let mut committer = IcebergCommitter::new(config.clone(), "lake".into());
    let (mut wctx, mut cctx) = (ctx("a1", None), ctx("a1", None));
    writer.on_start(&mut wctx).unwrap();
    committer.on_start(&mut cctx).unwrap();
    let mut out: Batch<DataFiles> = Vec::new();
    writer.process_batch(readings(0, 100), &mut out, &mut wctx).unwrap();
    assert!(out.is_empty(), "files are handed over at the barrier only");
    writer.prepare_snapshot_pre_barrier(CheckpointId(1), &mut out, &mut wctx).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].value.files.len(), 3, "one file per day partition");
    committer.write_batch(std::mem::take(&mut out), &mut cctx).unwrap();
    let state1 = committer.pre_commit(CheckpointId(1), &mut cctx).unwrap().unwrap();
    committer.on_checkpoint_complete(CheckpointId(1), &mut cctx).unwrap();
    let (ids, checkpoints, location) = table_contents(&config);
    assert_eq!(ids, (0..100).collect::<Vec<_>>());
    assert_eq!(checkpoints, ["1"]);

    // Epoch 2 is pre-committed (in checkpoint 2), then the process dies before completion.
    writer.process_batch(readings(100, 50), &mut out, &mut wctx).unwrap();
    writer.prepare_snapshot_pre_barrier(CheckpointId(2), &mut out, &mut wctx).unwrap();
    committer.write_batch(std::mem::take(&mut out), &mut cctx).unwrap();
    let state2 = committer.pre_commit(CheckpointId(2), &mut cctx).unwrap().unwrap();
    // ... and epoch 3's files are written but never handed over.
    writer.process_batch(readings(150, 25), &mut out, &mut wctx).unwrap();
    writer.prepare_snapshot_pre_barrier(CheckpointId(3), &mut out, &mut wctx).unwrap();
    let orphans: Vec<String> = out[0]
        .value
        .files
        .iter()
        .map(|j| {
            let v: serde_json::Value = serde_json::from_str(j).unwrap();
            v["file_path"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(orphans.len(), 3);
    drop((writer, committer));

    // Attempt a2 restores checkpoint 1: nothing is committed twice; epoch 2 and 3's files are
    // no checkpoint's and are deleted.
    let mut restored = IcebergCommitter::new(config.clone(), "lake".into());
    let mut rctx = ctx("a2", Some(1));
    restored.restore(vec![state1.clone()], &mut rctx).unwrap();
    restored.on_start(&mut rctx).unwrap();
    let (ids, checkpoints, _) = table_contents(&config);
    assert_eq!(ids, (0..100).collect::<Vec<_>>());
    assert_eq!(checkpoints, ["1"], "checkpoint 1 is in the table already: not again");
    let files = data_files(&location, &config.s3);
    assert_eq!(files.len(), 3, "only checkpoint 1's files are left: {files:?}");
    for o in &orphans {
        assert!(!files.contains(o), "{o} survived");
    }
    drop(restored);

    // Attempt a3 restores checkpoint 1 again (a2 died before its first checkpoint) and
    // writes epoch 2; checkpoint 2 completes, and the process dies before it is notified.
    let mut writer = IcebergWriter::<ProcessedReading>::new(config.clone(), "lake".into());
    let mut committer = IcebergCommitter::new(config.clone(), "lake".into());
    let (mut wctx, mut cctx) = (ctx("a3", Some(1)), ctx("a3", Some(1)));
    committer.restore(vec![state1], &mut cctx).unwrap();
    committer.on_start(&mut cctx).unwrap();
    writer.on_start(&mut wctx).unwrap();
    writer.process_batch(readings(100, 50), &mut out, &mut wctx).unwrap();
    writer.prepare_snapshot_pre_barrier(CheckpointId(2), &mut out, &mut wctx).unwrap();
    committer.write_batch(std::mem::take(&mut out), &mut cctx).unwrap();
    let state2b = committer.pre_commit(CheckpointId(2), &mut cctx).unwrap().unwrap();
    drop((writer, committer));
    assert!(!state2.is_empty());
    // Attempt a4 restores checkpoint 2 (completed, never notified): its pending epoch is committed.
    let mut committer = IcebergCommitter::new(config.clone(), "lake".into());
    let mut cctx = ctx("a4", Some(2));
    committer.restore(vec![state2b.clone()], &mut cctx).unwrap();
    let (ids, checkpoints, _) = table_contents(&config);
    assert_eq!(ids, (0..150).collect::<Vec<_>>());
    assert_eq!(checkpoints, ["1", "2"]);
    // And once more (a crash right after that commit): not twice.
    let mut again = IcebergCommitter::new(config.clone(), "lake".into());
    again.restore(vec![state2b], &mut ctx("a5", Some(2))).unwrap();
    let (ids, checkpoints, _) = table_contents(&config);
    assert_eq!(ids, (0..150).collect::<Vec<_>>());
    assert_eq!(checkpoints, ["1", "2"]);
}

#[test]
fn an_epoch_is_committed_once_with_its_checkpoint_and_dead_attempts_leave_no_files() {
    let dir = tempfile::tempdir().unwrap();
    let Some(config) = config(dir.path().to_str().unwrap(), S3Config::default()) else { return };
    protocol(config);
}

/// The stack's S3 server as the warehouse's storage, or `None` (see `service`).
fn s3_config() -> Option<S3Config> {
    let endpoint = service("CAUDAL_S3_ENDPOINT")?;
    Some(S3Config {
        endpoint: Some(endpoint),
        access_key_id: Some(std::env::var("CAUDAL_S3_ACCESS_KEY_ID").unwrap_or_else(|_| "test".into())),
        secret_access_key: Some(
            std::env::var("CAUDAL_S3_SECRET_ACCESS_KEY").unwrap_or_else(|_| "test".into()),
        ),
        allow_http: true,
        ..S3Config::default()
    })
}

/// A new prefix of the stack's bucket.
fn s3_warehouse() -> String {
    let bucket = std::env::var("CAUDAL_S3_BUCKET").unwrap_or_else(|_| "caudal".into());
    format!("s3://{bucket}/{}", unique("lake"))
}

#[test]
fn the_protocol_holds_on_s3() {
    let Some(s3) = s3_config() else { return };
    let Some(config) = config(&s3_warehouse(), s3) else { return };
    protocol(config);
}

/// The stack's REST catalog (`scripts/services.sh start iceberg-rest`), its tables on S3 (the
/// server writes their metadata there too), or `None` (see `service`).
fn rest_config() -> Option<IcebergConfig> {
    let [url] = caudal_test_stack::services(["CAUDAL_ICEBERG_REST_URL"])?;
    let mut c = IcebergConfig::new(&url, &s3_warehouse(), &format!("{}.readings", unique("ns")));
    c.s3 = s3_config()?;
    Some(c)
}

#[test]
fn the_protocol_holds_through_a_rest_catalog() {
    let Some(config) = rest_config() else { return };
    protocol(config);
}

/// A REST commit that meets `409 Conflict` comes back to the committer as a conflict —
/// not retried inside Iceberg's transaction, which would append the files again on top of
/// whatever came first — and nothing of it is in the table.
#[test]
fn a_rest_conflict_is_handed_back_not_retried_inside_the_transaction() {
    use iceberg::transaction::{ApplyTransactionAction, Transaction};
    let Some(config) = rest_config() else { return };
    write_epoch(&config, "a1", 1, readings(0, 10));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let catalog = IcebergCatalog::for_config(&config).await.unwrap();
        assert!(matches!(catalog, IcebergCatalog::Rest { .. }));
        let (ns, name) = config.table_ident().unwrap();
        let ident = TableIdent::new(iceberg::NamespaceIdent::from_vec(ns).unwrap(), name);
        let stale = catalog.load_table(&ident).await.unwrap();
        // Another writer commits first: a snapshot (of checkpoint 1's first file again)
        // moves `main`.
        let fresh = catalog.load_table(&ident).await.unwrap();
        let files = stale.metadata().current_snapshot().unwrap();
        let list = fresh.manifest_list_reader(files).load().await.unwrap();
        let entries = list.entries()[0].load_manifest(fresh.file_io()).await.unwrap();
        let data_file = entries.entries()[0].data_file().clone();
        let tx = Transaction::new(&fresh);
        let tx = tx
            .fast_append()
            .with_check_duplicate(false)
            .add_data_files([data_file.clone()])
            .apply(tx)
            .unwrap();
        tx.commit(&catalog).await.unwrap();
        // This writer's commit on the table it read before: the server refuses it (its
        // requirement on `main` fails), and the transaction hands the conflict back at once.
        let behind = Stale { catalog: &catalog, table: stale.clone(), updates: Default::default() };
        let tx = Transaction::new(&stale);
        let tx = tx.fast_append().with_check_duplicate(false).add_data_files([data_file]).apply(tx).unwrap();
        let err = tx.commit(&behind).await.unwrap_err();
        assert_eq!(err.kind(), iceberg::ErrorKind::CatalogCommitConflicts, "{err}");
        assert!(!err.retryable(), "{err}");
        assert_eq!(behind.updates.load(std::sync::atomic::Ordering::Relaxed), 1, "sent once");
        let now = catalog.load_table(&ident).await.unwrap();
        assert_eq!(now.metadata().snapshots().count(), 2, "checkpoint 1 and the other writer's");
    });
}

/// The committer read the table (its checkpoint not there) and then a commit landed — the
/// same checkpoint's, sent by a process killed with it in flight. Iceberg's transaction reads
/// the table again before it commits, and on its own would append the files on top of what
/// landed; inside [`super::catalog::committing`] that second read finds the table moved and
/// the commit comes back as a conflict, unsent, so the committer looks again. Against the
/// SQL catalog and the REST catalog.
fn a_table_that_moved_after_the_look_is_a_conflict(config: IcebergConfig) {
    use iceberg::transaction::{ApplyTransactionAction, Transaction};
    write_epoch(&config, "a1", 1, readings(0, 10));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let catalog = IcebergCatalog::for_config(&config).await.unwrap();
        let (ns, name) = config.table_ident().unwrap();
        let ident = TableIdent::new(iceberg::NamespaceIdent::from_vec(ns).unwrap(), name);
        let looked_at = catalog.load_table(&ident).await.unwrap();
        let snapshot = looked_at.metadata().current_snapshot().unwrap();
        let list = looked_at.manifest_list_reader(snapshot).load().await.unwrap();
        let entries = list.entries()[0].load_manifest(looked_at.file_io()).await.unwrap();
        let data_file = entries.entries()[0].data_file().clone();
        let append = |table: &iceberg::table::Table| {
            let tx = Transaction::new(table);
            tx.fast_append()
                .with_check_duplicate(false)
                .add_data_files([data_file.clone()])
                .apply(tx)
                .unwrap()
        };
        // The commit in flight lands after the look.
        append(&looked_at).commit(&catalog).await.unwrap();
        let err =
            super::catalog::committing(2, &looked_at, append(&looked_at).commit(&catalog)).await.unwrap_err();
        assert_eq!(err.kind(), iceberg::ErrorKind::CatalogCommitConflicts, "{err}");
        assert!(!err.retryable(), "{err}");
        assert!(err.to_string().contains("changed after the committer read it"), "{err}");
        let now = catalog.load_table(&ident).await.unwrap();
        assert_eq!(now.metadata().snapshots().count(), 2, "checkpoint 1 and the one that landed, no third");
        // On top of the table as it is now, the same commit goes through.
        super::catalog::committing(2, &now, append(&now).commit(&catalog)).await.unwrap();
        assert_eq!(catalog.load_table(&ident).await.unwrap().metadata().snapshots().count(), 3);
    });
}

#[test]
fn a_table_that_moved_after_the_committers_look_is_a_conflict_in_the_sql_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let Some(config) = config(dir.path().to_str().unwrap(), S3Config::default()) else { return };
    a_table_that_moved_after_the_look_is_a_conflict(config);
}

#[test]
fn a_table_that_moved_after_the_committers_look_is_a_conflict_in_the_rest_catalog() {
    let Some(config) = rest_config() else { return };
    a_table_that_moved_after_the_look_is_a_conflict(config);
}

/// The REST catalog as a writer sees it whose view of the table is behind: every load
/// answers the table as it was read, commits go through (and are counted).
#[derive(Debug)]
struct Stale<'a> {
    catalog: &'a IcebergCatalog,
    table: iceberg::table::Table,
    updates: std::sync::atomic::AtomicU64,
}

#[test]
fn a_table_that_cannot_hold_the_record_type_fails_at_start_naming_the_column() {
    let dir = tempfile::tempdir().unwrap();
    let Some(config) = config(dir.path().to_str().unwrap(), S3Config::default()) else { return };
    // The table exists with `ts` as a string.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let catalog = IcebergCatalog::for_config(&config).await.unwrap();
        let (ns, name) = config.table_ident().unwrap();
        let ns = iceberg::NamespaceIdent::from_vec(ns).unwrap();
        catalog.create_namespace(&ns, Default::default()).await.unwrap();
        let schema = iceberg::spec::Schema::builder()
            .with_fields([std::sync::Arc::new(iceberg::spec::NestedField::required(
                1,
                "ts",
                iceberg::spec::Type::Primitive(iceberg::spec::PrimitiveType::String),
            ))])
            .build()
            .unwrap();
        catalog
            .create_table(&ns, iceberg::TableCreation::builder().name(name).schema(schema).build())
            .await
            .unwrap();
    });
    let mut writer = IcebergWriter::<ProcessedReading>::new(config, "lake".into());
    let err = writer.on_start(&mut ctx("a1", None)).unwrap_err().to_string();
    assert!(err.contains("column `ts`"), "{err}");
}

/// A reading as an older version of the record type had it: no `site`, no `name`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct OldReading {
    sensor_id: i64,
    ts: i64,
    lat: f64,
    lon: f64,
    temp_c: f64,
    temp_f: f64,
}

const OLD_READING_AVSC: &str = r#"{"type": "record", "name": "ProcessedReading", "namespace": "io.caudal", "fields": [
  {"name": "sensor_id", "type": "long"},
  {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
  {"name": "lat", "type": "double"}, {"name": "lon", "type": "double"},
  {"name": "temp_c", "type": "double"}, {"name": "temp_f", "type": "double"}]}"#;

impl caudal_schemas::AvroRecord for OldReading {
    fn schema_json() -> &'static str {
        OLD_READING_AVSC
    }
    fn schema() -> &'static caudal_schemas::Schema {
        static S: std::sync::OnceLock<caudal_schemas::Schema> = std::sync::OnceLock::new();
        S.get_or_init(|| caudal_schemas::parse_schema(OLD_READING_AVSC).unwrap())
    }
    fn encode(&self, out: &mut Vec<u8>) {
        use caudal_schemas::codec::{put_double, put_long};
        put_long(out, self.sensor_id);
        put_long(out, self.ts);
        put_double(out, self.lat);
        put_double(out, self.lon);
        put_double(out, self.temp_c);
        put_double(out, self.temp_f);
    }
    fn decode(_: &mut &[u8]) -> caudal_schemas::Result<Self> {
        unreachable!("the writer only encodes")
    }
}

/// One epoch of `R` records written and committed as checkpoint `checkpoint` by attempt `attempt`.
fn write_epoch<R: caudal_schemas::AvroRecord + caudal::Data>(
    config: &IcebergConfig,
    attempt: &str,
    checkpoint: u64,
    records: Batch<R>,
) {
    let mut writer = IcebergWriter::<R>::new(config.clone(), "lake".into());
    let mut committer = IcebergCommitter::new(config.clone(), "lake".into());
    let (mut wctx, mut cctx) = (ctx(attempt, None), ctx(attempt, None));
    writer.on_start(&mut wctx).unwrap();
    committer.on_start(&mut cctx).unwrap();
    let mut out = Vec::new();
    writer.process_batch(records, &mut out, &mut wctx).unwrap();
    writer.prepare_snapshot_pre_barrier(CheckpointId(checkpoint), &mut out, &mut wctx).unwrap();
    committer.write_batch(out, &mut cctx).unwrap();
    committer.pre_commit(CheckpointId(checkpoint), &mut cctx).unwrap();
    committer.on_checkpoint_complete(CheckpointId(checkpoint), &mut cctx).unwrap();
}

#[test]
fn a_field_the_record_type_gained_becomes_a_column_and_old_rows_read_null() {
    let dir = tempfile::tempdir().unwrap();
    let Some(config) = config(dir.path().to_str().unwrap(), S3Config::default()) else { return };
    let old: Batch<OldReading> = readings(0, 10)
        .into_iter()
        .map(|r| {
            let v = r.value;
            Record::new(
                r.ts,
                OldReading {
                    sensor_id: v.sensor_id,
                    ts: v.ts,
                    lat: v.lat,
                    lon: v.lon,
                    temp_c: v.temp_c,
                    temp_f: v.temp_f,
                },
            )
        })
        .collect();
    write_epoch(&config, "a1", 1, old);
    // The job is upgraded: the record type has `site` and `name` now.
    write_epoch(&config, "a2", 2, readings(10, 5));
    let (ids, checkpoints, _) = table_contents(&config);
    assert_eq!(ids, (0..15).collect::<Vec<_>>());
    assert_eq!(checkpoints.len(), 2);
    // pyiceberg, the independent reader, sees every row: the old ones with null site.
    let Some(python) = service("CAUDAL_PYTHON") else { return };
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/iceberg-read.py");
    let o = std::process::Command::new(python)
        .arg(script)
        .args([&config.catalog_url, &config.catalog_name, &config.table])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        answer["columns"],
        serde_json::json!(["sensor_id", "ts", "lat", "lon", "temp_c", "temp_f", "site", "name"])
    );
    let rows = answer["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 15);
    for r in rows {
        let id = r["sensor_id"].as_i64().unwrap();
        if id < 10 {
            assert!(r["site"].is_null() && r["name"].is_null(), "{r}");
        } else {
            assert_eq!(r["site"], "roof", "{r}");
        }
    }
}

#[test]
fn keep_snapshots_expires_all_but_the_newest_and_the_rows_stay() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut config) = config(dir.path().to_str().unwrap(), S3Config::default()) else { return };
    config.keep_snapshots = Some(2);
    for c in 1..=4 {
        write_epoch(&config, &format!("a{c}"), c, readings((c as i64 - 1) * 10, 10));
    }
    let (ids, checkpoints, _) = table_contents(&config);
    assert_eq!(ids, (0..40).collect::<Vec<_>>());
    assert_eq!(checkpoints, ["3", "4"]);
}

/// A writer starting against an unreachable catalog retries for the policy's second, then
/// fails with a retryable error naming the sink.
fn assert_an_unreachable_catalog_is_retried_then_fails(catalog_url: &str, warehouse: &str) {
    let mut config = IcebergConfig::new(catalog_url, warehouse, "a.b");
    config.retry.initial_backoff_ms = 50;
    config.retry.max_backoff_ms = 100;
    config.retry.give_up_after_secs = 1;
    let mut writer = IcebergWriter::<ProcessedReading>::new(config, "lake".into());
    let mut c = ctx("a1", None);
    let start = std::time::Instant::now();
    let err = writer.on_start(&mut c).unwrap_err();
    assert!(start.elapsed() >= std::time::Duration::from_secs(1), "gave up at once");
    let msg = err.to_string();
    assert!(msg.contains("iceberg") && msg.contains("gave up after"), "{msg}");
    assert!(err.is_retryable(), "the catalog was away, not refusing: {msg}");
    let retries =
        c.metrics.counter(caudal::metrics::names::SINK_RETRIES).load(std::sync::atomic::Ordering::Relaxed);
    assert!(retries >= 3, "{retries} retries");
}

#[test]
fn an_unreachable_catalog_is_retried_then_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    assert_an_unreachable_catalog_is_retried_then_fails(
        "postgres://caudal@127.0.0.1:1/none",
        dir.path().to_str().unwrap(),
    );
}

#[async_trait::async_trait]
impl iceberg::Catalog for Stale<'_> {
    async fn load_table(&self, _: &TableIdent) -> iceberg::Result<iceberg::table::Table> {
        Ok(self.table.clone())
    }
    async fn update_table(&self, commit: iceberg::TableCommit) -> iceberg::Result<iceberg::table::Table> {
        self.updates.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.catalog.update_table(commit).await
    }
    async fn list_namespaces(
        &self,
        parent: Option<&iceberg::NamespaceIdent>,
    ) -> iceberg::Result<Vec<iceberg::NamespaceIdent>> {
        self.catalog.list_namespaces(parent).await
    }
    async fn create_namespace(
        &self,
        ns: &iceberg::NamespaceIdent,
        props: std::collections::HashMap<String, String>,
    ) -> iceberg::Result<iceberg::Namespace> {
        self.catalog.create_namespace(ns, props).await
    }
    async fn get_namespace(&self, ns: &iceberg::NamespaceIdent) -> iceberg::Result<iceberg::Namespace> {
        self.catalog.get_namespace(ns).await
    }
    async fn namespace_exists(&self, ns: &iceberg::NamespaceIdent) -> iceberg::Result<bool> {
        self.catalog.namespace_exists(ns).await
    }
    async fn update_namespace(
        &self,
        ns: &iceberg::NamespaceIdent,
        props: std::collections::HashMap<String, String>,
    ) -> iceberg::Result<()> {
        self.catalog.update_namespace(ns, props).await
    }
    async fn drop_namespace(&self, ns: &iceberg::NamespaceIdent) -> iceberg::Result<()> {
        self.catalog.drop_namespace(ns).await
    }
    async fn list_tables(&self, ns: &iceberg::NamespaceIdent) -> iceberg::Result<Vec<TableIdent>> {
        self.catalog.list_tables(ns).await
    }
    async fn create_table(
        &self,
        ns: &iceberg::NamespaceIdent,
        creation: iceberg::TableCreation,
    ) -> iceberg::Result<iceberg::table::Table> {
        self.catalog.create_table(ns, creation).await
    }
    async fn drop_table(&self, t: &TableIdent) -> iceberg::Result<()> {
        self.catalog.drop_table(t).await
    }
    async fn purge_table(&self, t: &TableIdent) -> iceberg::Result<()> {
        self.catalog.purge_table(t).await
    }
    async fn table_exists(&self, t: &TableIdent) -> iceberg::Result<bool> {
        self.catalog.table_exists(t).await
    }
    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> iceberg::Result<()> {
        self.catalog.rename_table(src, dest).await
    }
    async fn register_table(
        &self,
        t: &TableIdent,
        location: String,
    ) -> iceberg::Result<iceberg::table::Table> {
        self.catalog.register_table(t, location).await
    }
}

#[test]
fn an_unreachable_rest_catalog_is_retried_then_fails_naming_it() {
    assert_an_unreachable_catalog_is_retried_then_fails("http://127.0.0.1:1", "s3://caudal/none");
}

/// Two deployments of the same job (the same job and sink names, another run) write one
/// table. A restore of one deletes what its own dead attempts left, never the other's files
/// that wait for their checkpoint (#43: it deleted by the sink's file-name prefix, and the
/// other deployment then committed a snapshot of missing files).
#[test]
fn a_restore_leaves_another_deployments_files_alone() {
    let dir = tempfile::tempdir().unwrap();
    let Some(config) = config(dir.path().to_str().unwrap(), S3Config::default()) else { return };
    let mut out: Batch<DataFiles> = Vec::new();
    // Deployment A, attempt a1: checkpoint 1 completes; epoch 2 is pre-committed, never completed.
    let mut writer = IcebergWriter::<ProcessedReading>::new(config.clone(), "lake".into());
    let mut committer = IcebergCommitter::new(config.clone(), "lake".into());
    let (mut wctx, mut cctx) = (ctx("a1", None), ctx("a1", None));
    writer.on_start(&mut wctx).unwrap();
    committer.on_start(&mut cctx).unwrap();
    writer.process_batch(readings(0, 10), &mut out, &mut wctx).unwrap();
    writer.prepare_snapshot_pre_barrier(CheckpointId(1), &mut out, &mut wctx).unwrap();
    committer.write_batch(std::mem::take(&mut out), &mut cctx).unwrap();
    let a_state1 = committer.pre_commit(CheckpointId(1), &mut cctx).unwrap().unwrap();
    committer.on_checkpoint_complete(CheckpointId(1), &mut cctx).unwrap();
    writer.process_batch(readings(10, 10), &mut out, &mut wctx).unwrap();
    writer.prepare_snapshot_pre_barrier(CheckpointId(2), &mut out, &mut wctx).unwrap();
    committer.write_batch(std::mem::take(&mut out), &mut cctx).unwrap();
    committer.pre_commit(CheckpointId(2), &mut cctx).unwrap();
    drop((writer, committer));
    let (_, _, location) = table_contents(&config);
    let a_files = data_files(&location, &config.s3);

    // Deployment B, attempt b1: its epoch 1 is pre-committed, its checkpoint not complete yet.
    let mut b_writer = IcebergWriter::<ProcessedReading>::new(config.clone(), "lake".into());
    let mut b_committer = IcebergCommitter::new(config.clone(), "lake".into());
    let (mut bw, mut bc) = (ctx("b1", None), ctx("b1", None));
    b_writer.on_start(&mut bw).unwrap();
    b_committer.on_start(&mut bc).unwrap();
    b_writer.process_batch(readings(100, 10), &mut out, &mut bw).unwrap();
    b_writer.prepare_snapshot_pre_barrier(CheckpointId(1), &mut out, &mut bw).unwrap();
    b_committer.write_batch(std::mem::take(&mut out), &mut bc).unwrap();
    b_committer.pre_commit(CheckpointId(1), &mut bc).unwrap();
    let b_files: Vec<String> =
        data_files(&location, &config.s3).into_iter().filter(|f| !a_files.contains(f)).collect();
    assert_eq!(b_files.len(), 3, "one file per day partition: {b_files:?}");

    // A restores its checkpoint 1 as attempt a2: its epoch 2's files go, B's stay.
    let mut restored = IcebergCommitter::new(config.clone(), "lake".into());
    let mut rctx = ctx("a2", Some(1));
    restored.restore(vec![a_state1], &mut rctx).unwrap();
    let left = data_files(&location, &config.s3);
    for f in &b_files {
        assert!(left.contains(f), "another deployment's file was deleted: {f}");
    }
    assert_eq!(left.len(), 3 + 3, "A's checkpoint 1 and B's epoch 1: {left:?}");
    // B's checkpoint completes: the table reads both deployments' records.
    b_committer.on_checkpoint_complete(CheckpointId(1), &mut bc).unwrap();
    let (ids, _, _) = table_contents(&config);
    assert_eq!(ids, (0..10).chain(100..110).collect::<Vec<_>>());
}

/// Another writer's maintenance expires every snapshot of this run (it keeps one snapshot,
/// its own); then this run restores a checkpoint whose epoch it had committed. The commit
/// guard finds it in the table's properties and does not append it again (#43: it walked the
/// snapshots still in the table only, found none of this run, and committed a second time).
#[test]
fn an_epoch_is_not_committed_again_after_another_writer_expired_its_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let Some(config) = config(dir.path().to_str().unwrap(), S3Config::default()) else { return };
    let mut out: Batch<DataFiles> = Vec::new();
    let mut epoch = |config: &IcebergConfig, attempt: &str, from: i64| -> Vec<u8> {
        let mut writer = IcebergWriter::<ProcessedReading>::new(config.clone(), "lake".into());
        let mut committer = IcebergCommitter::new(config.clone(), "lake".into());
        let (mut wctx, mut cctx) = (ctx(attempt, None), ctx(attempt, None));
        writer.on_start(&mut wctx).unwrap();
        committer.on_start(&mut cctx).unwrap();
        writer.process_batch(readings(from, 10), &mut out, &mut wctx).unwrap();
        writer.prepare_snapshot_pre_barrier(CheckpointId(1), &mut out, &mut wctx).unwrap();
        committer.write_batch(std::mem::take(&mut out), &mut cctx).unwrap();
        let state = committer.pre_commit(CheckpointId(1), &mut cctx).unwrap().unwrap();
        committer.on_checkpoint_complete(CheckpointId(1), &mut cctx).unwrap();
        state
    };
    // Run A commits its checkpoint 1.
    let a_state1 = epoch(&config, "a1", 0);
    // Run B commits too and keeps one snapshot: A's snapshot is expired.
    let mut b_config = config.clone();
    b_config.keep_snapshots = Some(1);
    epoch(&b_config, "b1", 100);
    let (ids, checkpoints, _) = table_contents(&config);
    assert_eq!(checkpoints.len(), 1, "only B's snapshot is left: {checkpoints:?}");
    assert_eq!(ids, (0..10).chain(100..110).collect::<Vec<_>>());
    // A restores its checkpoint 1 (say its notification was lost): not committed again.
    let mut restored = IcebergCommitter::new(config.clone(), "lake".into());
    restored.restore(vec![a_state1], &mut ctx("a2", Some(1))).unwrap();
    let (ids, checkpoints, _) = table_contents(&config);
    assert_eq!(checkpoints.len(), 1, "no snapshot added: {checkpoints:?}");
    assert_eq!(ids, (0..10).chain(100..110).collect::<Vec<_>>(), "A's epoch is in the table once");
}

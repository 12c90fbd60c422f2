//! Enrichment (#16): the temperature job with `--sensor-metadata`, each reading's site and
//! name looked up in a real PostgreSQL table through async I/O, checked against what the
//! input and the table imply (the oracle puts the table's site and name on each reading,
//! without the engine; sensors not in the table get empty ones). Killed with lookups in
//! flight and restored (rescaled), the output is still exact; a lookup that keeps timing out
//! fails the job naming the reading.
//!
//! Needs `CAUDAL_POSTGRES_URL` (`scripts/services.sh start`); skipped without it unless
//! `CAUDAL_REQUIRE_STACK` is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::oracle::Model;
use common::*;
use std::time::{Duration, Instant};

/// The `sensors` table: 15 of the 20 sensors (15–19 are not in it).
const SITES: [(i64, &str, &str); 15] = [
    (0, "north-roof", "sensor-00"),
    (1, "south-yard", "sensor-01"),
    (2, "north-roof", "sensor-02"),
    (3, "south-yard", "sensor-03"),
    (4, "north-roof", "sensor-04"),
    (5, "south-yard", "sensor-05"),
    (6, "north-roof", "sensor-06"),
    (7, "south-yard", "sensor-07"),
    (8, "north-roof", "sensor-08"),
    (9, "south-yard", "sensor-09"),
    (10, "north-roof", "sensor-10"),
    (11, "south-yard", "sensor-11"),
    (12, "north-roof", "sensor-12"),
    (13, "south-yard", "sensor-13"),
    (14, "north-roof", "sensor-14"),
];

const MODEL: Model = Model { sites: &SITES, ..BASE_MODEL };

/// A schema of its own with the `sensors` table, dropped at the end.
struct Metadata {
    url: String,
    schema: String,
}

impl Metadata {
    fn create(what: &str) -> Option<Metadata> {
        let url = caudal_test_stack::service("CAUDAL_POSTGRES_URL")?;
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        let m = Metadata { url, schema: format!("{what}_{}_{nanos}", std::process::id()) };
        let rows: Vec<String> =
            SITES.iter().map(|(id, site, name)| format!("({id}, '{site}', '{name}')")).collect();
        m.execute(&format!(
            "CREATE SCHEMA \"{s}\"; CREATE TABLE \"{s}\".sensors (sensor_id BIGINT PRIMARY KEY, site TEXT NOT NULL, \
             name TEXT NOT NULL); INSERT INTO \"{s}\".sensors VALUES {};",
            rows.join(", "),
            s = m.schema
        ));
        Some(m)
    }

    fn execute(&self, sql: &str) {
        self.try_execute(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    fn try_execute(&self, sql: &str) -> Result<(), tokio_postgres::Error> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls).await?;
            tokio::spawn(conn);
            client.batch_execute(sql).await
        })
    }

    fn args(&self, d: &Dirs, parallelism: u32, table: &str, extra: &[&str]) -> Vec<String> {
        let mut a = base_args(&d.out, &d.ckpt, parallelism);
        a.extend(
            ["--sensor-metadata", &self.url, "--sensor-metadata-table", &format!("{}.{table}", self.schema)]
                .map(String::from),
        );
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }
}

impl Drop for Metadata {
    /// Ends the lookups a failed job left queued on the server (a slow view's), then drops
    /// the schema; says so if it cannot (a leftover schema is no failure of the test).
    fn drop(&mut self) {
        let s = &self.schema;
        let sql = format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() \
             AND query LIKE '%{s}%'; DROP SCHEMA IF EXISTS \"{s}\" CASCADE"
        );
        if let Err(e) = self.try_execute(&sql) {
            eprintln!("dropping schema {s}: {e}");
        }
    }
}

#[test]
fn readings_carry_their_sensors_site_and_name_from_postgresql() {
    let Some(m) = Metadata::create("enrich_clean") else { return };
    let d = dirs();
    let (status, err) = wait(spawn(&m.args(&d, 2, "sensors", &[]), false, &[]));
    assert!(status.success(), "the run failed: {err}");
    assert_equals_model(&d, &MODEL, "a clean run");
    let readings = published(&d.out, "readings");
    assert!(
        readings.iter().any(|r| r.contains(r#""site":"south-yard","name":"sensor-03""#)),
        "{:?}",
        readings.first()
    );
    assert!(readings
        .iter()
        .any(|r| r.contains(r#""sensor_id":17,"#) && r.contains(r#""site":"","name":"""#)));
}

#[test]
fn killed_with_lookups_in_flight_and_restored_rescaled_the_output_is_exact() {
    let Some(m) = Metadata::create("enrich_kill") else { return };
    // No cache: every reading is a lookup, so lookups are in flight whenever it runs.
    let extra = ["--lookup-cache-entries", "0"];
    for (i, (before, after)) in [(1u32, 2u32), (2, 1)].into_iter().enumerate() {
        let d = dirs();
        let delay = Duration::from_millis(150 + 400 * i as u64);
        kill_after_first_checkpoint(&d, &m.args(&d, before, "sensors", &extra), delay);
        let (status, err) = wait(spawn(&m.args(&d, after, "sensors", &extra), true, &[]));
        assert!(status.success(), "the restored run failed: {err}");
        assert_equals_model(&d, &MODEL, &format!("killed at p={before}, restored at p={after}"));
    }
}

#[test]
fn a_lookup_that_keeps_timing_out_fails_the_job_naming_the_reading() {
    let Some(m) = Metadata::create("enrich_slow") else { return };
    m.execute(&format!(
        "CREATE VIEW \"{s}\".slow AS SELECT sensor_id, site, name FROM \"{s}\".sensors WHERE (SELECT true FROM pg_sleep(0.5))",
        s = m.schema
    ));
    let d = dirs();
    let started = Instant::now();
    let (status, err) = wait(spawn(&m.args(&d, 1, "slow", &["--lookup-timeout-ms", "100"]), false, &[]));
    assert!(!status.success(), "the job ended well: {err}");
    assert!(err.contains("the request for ProcessedReading { sensor_id:"), "the reading is named: {err}");
    assert!(err.contains("failed 4 times") && err.contains("timed out after 100ms"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
    assert!(published(&d.out, "readings").is_empty(), "nothing published without a completed lookup");
}

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

use common::oracle::{self, Model};
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
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(conn);
            client.batch_execute(sql).await.unwrap();
        });
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
    fn drop(&mut self) {
        self.execute(&format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.schema));
    }
}

fn assert_output_is_the_models(d: &Dirs, what: &str) {
    let (windows, readings) = oracle::expected(&MODEL);
    assert_same_lines(&published(&d.out, "readings"), &readings, &format!("{what}: readings"));
    assert_same_lines(&published(&d.out, "windows"), &windows, &format!("{what}: windows"));
    assert_same_lines(&published(&d.out, "alerts"), expected_alerts(), &format!("{what}: alerts"));
}

#[test]
fn readings_carry_their_sensors_site_and_name_from_postgresql() {
    let Some(m) = Metadata::create("enrich_clean") else { return };
    let d = dirs();
    let (status, err) = wait(spawn(&m.args(&d, 2, "sensors", &[]), false, &[]));
    assert!(status.success(), "the run failed: {err}");
    assert_output_is_the_models(&d, "a clean run");
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
        let mut child = spawn(&m.args(&d, before, "sensors", &extra), false, &[]);
        let start = Instant::now();
        while !has_completed_checkpoint(&d.ckpt) {
            assert!(start.elapsed() < Duration::from_secs(30), "no checkpoint completed");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(150 + 400 * i as u64));
        assert!(child.try_wait().unwrap().is_none(), "the run ended before the kill");
        child.kill().unwrap();
        let _ = child.wait();
        let (status, err) = wait(spawn(&m.args(&d, after, "sensors", &extra), true, &[]));
        assert!(status.success(), "the restored run failed: {err}");
        assert_output_is_the_models(&d, &format!("killed at p={before}, restored at p={after}"));
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

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

/// `--on-lookup-failure side-output`: the readings of a sensor whose lookup always fails (its
/// row's site raises an error) go to `<output>/lookup-failures` with the error after both
/// attempts (`--lookup-retries 1`); every other reading, and its windows, is what the model implies; the job ends.
#[test]
fn with_a_side_output_the_readings_whose_lookups_fail_go_there_and_the_job_goes_on() {
    let Some(m) = Metadata::create("enrich_side") else { return };
    m.execute(&format!(
        "CREATE FUNCTION \"{s}\".site_of(id BIGINT, site TEXT) RETURNS TEXT LANGUAGE plpgsql AS $$ BEGIN \
           IF id = 7 THEN RAISE EXCEPTION 'sensor 7 is broken'; END IF; RETURN site; END $$; \
         CREATE VIEW \"{s}\".flaky AS SELECT sensor_id, \"{s}\".site_of(sensor_id, site) AS site, name FROM \"{s}\".sensors",
        s = m.schema
    ));
    let d = dirs();
    let args = m.args(&d, 2, "flaky", &["--on-lookup-failure", "side-output", "--lookup-retries", "1"]);
    let (status, err) = wait(spawn(&args, false, &[]));
    assert!(status.success(), "the run failed: {err}");
    let (windows, readings) = oracle::expected(&MODEL);
    let of_7 = |l: &String| l.starts_with(r#"{"sensor_id":7,"#);
    let (failed, passed): (Vec<String>, Vec<String>) = readings.into_iter().partition(of_7);
    let windows: Vec<String> = windows.into_iter().filter(|w| !of_7(w)).collect();
    assert_same_lines(&published(&d.out, "readings"), &passed, "readings");
    assert_same_lines(&published(&d.out, "windows"), &windows, "windows");
    let failures = published(&d.out, "lookup-failures");
    assert_eq!(failures.len(), failed.len(), "one failure per reading of sensor 7");
    for f in &failures {
        let v: serde_json::Value = serde_json::from_str(f).unwrap();
        assert_eq!(v["reading"]["sensor_id"], 7, "{f}");
        assert_eq!(v["attempts"], 2, "{f}");
        assert!(v["error"].as_str().unwrap().contains("sensor 7 is broken"), "{f}");
    }
}

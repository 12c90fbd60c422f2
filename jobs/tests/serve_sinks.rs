//! The temperature job with its PostgreSQL, Redis and archive sinks against the real
//! services (`scripts/services.sh env`): SIGKILLed at random moments and restored (the
//! archive on the stack's S3), the tables, hashes and Avro objects equal those of an
//! uninterrupted run (the archive into a directory) — itself checked, table by table, hash by
//! hash and record by record, against what the input implies (`common::oracle`) — and no
//! in-progress object is left;
//! crashed inside the commit window, likewise; PostgreSQL and Redis stopped mid-run
//! (private instances on ports of their own) until the job stalled on each, the job retries,
//! backpressures and ends with the same results; a wrong password or an unknown role fails
//! the job at once naming the sink and the cause. The same sinks in a cluster, a task
//! manager SIGKILLed mid-run, end with what the input implies.
//!
//! Without the services' variables the tests print why and pass, unless
//! `CAUDAL_REQUIRE_STACK` is set (CI).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

mod common;

/// The cluster of `tests/tests` (job manager and task managers as real processes).
#[path = "../../tests/tests/cluster_support/mod.rs"]
mod cluster_support;

use caudal_test_stack::free_port;

use caudal_checkpoints::{CheckpointStorageConfig, CheckpointStore, S3Config};
use caudal_schemas::{ProcessedReading, WindowStats};

fn service(var: &str) -> Option<String> {
    caudal_test_stack::service(var)
}

/// Readings of one run.
const RECORDS: u64 = 6000;

fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("t_{what}_{}_{}", std::process::id(), nanos % 1_000_000_000_000)
}

/// Where one run writes: its own PostgreSQL schema, Redis prefix, archive and output dirs.
struct Target {
    pg_url: String,
    /// The job's PostgreSQL URL when it is not `pg_url` (which the test reads with).
    job_pg_url: Option<String>,
    /// The job's Redis URL when it is not `redis_url` (which the test reads with).
    job_redis_url: Option<String>,
    redis_url: String,
    schema: String,
    prefix: String,
    _tmp: tempfile::TempDir,
    out: PathBuf,
    ckpt: PathBuf,
    /// A directory or s3://bucket/prefix.
    archive: String,
    s3: S3Config,
    env: Vec<(String, String)>,
    extra: Vec<String>,
    /// Values that replace those of `args()`'s base flags (`--records`, `--rate`, …).
    set: Vec<(&'static str, String)>,
    /// Serve the REST API on this port while the job runs (`None`: `--no-ui`).
    ui_port: Option<u16>,
}

impl Target {
    fn new(what: &str, pg_url: &str, redis_url: &str) -> Target {
        let tmp = tempfile::tempdir().unwrap();
        let name = unique(what);
        Target {
            pg_url: pg_url.into(),
            job_pg_url: None,
            job_redis_url: None,
            redis_url: redis_url.into(),
            prefix: format!("{name}:sensor:"),
            schema: name,
            out: tmp.path().join("out"),
            ckpt: tmp.path().join("ckpt"),
            archive: tmp.path().join("archive").display().to_string(),
            s3: S3Config::default(),
            env: Vec::new(),
            extra: Vec::new(),
            set: Vec::new(),
            ui_port: None,
            _tmp: tmp,
        }
    }

    /// Archives into the test stack's S3 bucket instead of a directory.
    fn on_s3(mut self, s3: S3Config, env: Vec<(String, String)>) -> Target {
        let bucket = std::env::var("CAUDAL_S3_BUCKET").unwrap_or_else(|_| "caudal".into());
        self.archive = format!("s3://{bucket}/{}", self.schema);
        self.s3 = s3;
        self.env = env;
        self
    }

    /// A bounded, throttled run: 20 sensors, 6,000 readings at 1,500/s (~4 s), 1-second
    /// windows, checkpoints every 300 ms, parallelism 2.
    fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = common::oracle::RUN_ARGS
            .iter()
            .chain(&["--parallelism", "2"])
            // The outages and silence of common::BASE_MODEL: alerts too.
            .chain(&common::ALERT_ARGS)
            .map(|s| s.to_string())
            .collect();
        for (flag, value) in &self.set {
            let i = a.iter().position(|f| f == flag).unwrap_or_else(|| panic!("{flag} is not a base flag"));
            a[i + 1] = value.clone();
        }
        for (flag, value) in [
            ("--output", self.out.display().to_string()),
            ("--checkpoint-dir", self.ckpt.display().to_string()),
            ("--postgres", self.job_pg_url.clone().unwrap_or_else(|| self.pg_url.clone())),
            ("--postgres-schema", self.schema.clone()),
            ("--redis", self.job_redis_url.clone().unwrap_or_else(|| self.redis_url.clone())),
            ("--redis-prefix", self.prefix.clone()),
            ("--archive", self.archive.clone()),
        ] {
            a.push(flag.into());
            a.push(value);
        }
        match self.ui_port {
            Some(port) => a.extend(["--ui-bind".to_string(), format!("127.0.0.1:{port}")]),
            None => a.push("--no-ui".into()),
        }
        a.extend(self.extra.iter().cloned());
        a
    }

    fn spawn(&self, restore: bool) -> Child {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_temperature"));
        cmd.args(self.args()).stdout(Stdio::null()).stderr(Stdio::piped());
        if restore {
            cmd.args(["--restore", "latest"]);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd.spawn().expect("start temperature")
    }

    fn has_checkpoint(&self) -> bool {
        std::fs::read_dir(self.ckpt.join("temperature"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.path().join("_metadata").exists())
    }

    /// Restores (when a checkpoint completed) and runs to the end. The restore must succeed
    /// at once: a failed restore is a test failure, never retried.
    fn finish(&self) {
        let (status, err) = wait(self.spawn(self.has_checkpoint()));
        assert!(status.success(), "the restored run failed ({status}):\n{err}");
    }

    fn results(&self) -> Results {
        Results {
            readings: pg_rows(
                &self.pg_url,
                &format!(
                    "SELECT sensor_id, ts, lat, lon, temp_c, temp_f FROM \"{}\".sensor_readings ORDER BY 1, 2",
                    self.schema
                ),
            ),
            windows: pg_rows(
                &self.pg_url,
                &format!(
                    "SELECT sensor_id, window_start, window_end, count, min_c, max_c, mean_c \
                     FROM \"{}\".window_stats ORDER BY 1, 2",
                    self.schema
                ),
            ),
            latest: pg_rows(
                &self.pg_url,
                &format!(
                    "SELECT sensor_id, ts, lat, lon, temp_c, temp_f FROM \"{}\".sensor_latest ORDER BY 1",
                    self.schema
                ),
            ),
            alerts: pg_rows(
                &self.pg_url,
                &format!(
                    "SELECT sensor_id, kind, ts, last_seen FROM \"{}\".sensor_alerts ORDER BY 1, 2, 3",
                    self.schema
                ),
            ),
            hashes: redis_hashes(&self.redis_url, &self.prefix),
            archive: archive(&self.archive, &self.s3),
        }
    }

    /// Logs every committed write into `<schema>.caudal_test_writes` (table, key): the two
    /// keyed tables are created here first, as the sinks would create them, with a trigger
    /// on insert and update. A row written and rolled back leaves no log row (the trigger
    /// runs in the writing transaction); an epoch applied twice leaves two.
    fn log_writes(&self) {
        let s = &self.schema;
        let log = |table: &str, key: &str| {
            format!(
                "CREATE FUNCTION \"{s}\".log_{table}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
                 INSERT INTO \"{s}\".caudal_test_writes VALUES (TG_TABLE_NAME, {key}); RETURN NEW; END $$; \
                 CREATE TRIGGER log_writes AFTER INSERT OR UPDATE ON \"{s}\".{table} \
                 FOR EACH ROW EXECUTE FUNCTION \"{s}\".log_{table}();"
            )
        };
        pg_rows(
            &self.pg_url,
            &format!(
                "CREATE SCHEMA \"{s}\"; \
                 CREATE TABLE \"{s}\".sensor_readings (sensor_id BIGINT NOT NULL, ts BIGINT NOT NULL, \
                   lat DOUBLE PRECISION NOT NULL, lon DOUBLE PRECISION NOT NULL, temp_c DOUBLE PRECISION NOT NULL, \
                   temp_f DOUBLE PRECISION NOT NULL, PRIMARY KEY (sensor_id, ts)); \
                 CREATE TABLE \"{s}\".window_stats (sensor_id BIGINT NOT NULL, window_start BIGINT NOT NULL, \
                   window_end BIGINT NOT NULL, count BIGINT NOT NULL, min_c DOUBLE PRECISION NOT NULL, \
                   max_c DOUBLE PRECISION NOT NULL, mean_c DOUBLE PRECISION NOT NULL, \
                   PRIMARY KEY (sensor_id, window_start)); \
                 CREATE TABLE \"{s}\".sensor_alerts (sensor_id BIGINT NOT NULL, kind TEXT NOT NULL, \
                   ts BIGINT NOT NULL, last_seen BIGINT NOT NULL, PRIMARY KEY (sensor_id, kind, ts)); \
                 CREATE TABLE \"{s}\".caudal_test_writes (tbl TEXT NOT NULL, k TEXT NOT NULL); {} {} {}",
                log("sensor_readings", "NEW.sensor_id || '/' || NEW.ts"),
                log("window_stats", "NEW.sensor_id || '/' || NEW.window_start"),
                log("sensor_alerts", "NEW.sensor_id || '/' || NEW.kind || '/' || NEW.ts"),
            ),
        );
    }

    /// Every key of the three logged tables was written by exactly one committed transaction.
    fn assert_each_row_written_once(&self, got: &Results, what: &str) {
        let s = &self.schema;
        let twice = pg_rows(
            &self.pg_url,
            &format!(
                "SELECT tbl, k, count(*) FROM \"{s}\".caudal_test_writes GROUP BY tbl, k HAVING count(*) > 1 \
                 ORDER BY 1, 2 LIMIT 5"
            ),
        );
        assert!(twice.is_empty(), "{what}: rows written by more than one committed transaction: {twice:?}");
        let writes = pg_rows(&self.pg_url, &format!("SELECT count(*) FROM \"{s}\".caudal_test_writes"));
        assert_eq!(
            writes,
            [(got.readings.len() + got.windows.len() + got.alerts.len()).to_string()],
            "{what}: one logged write per row"
        );
    }

    fn cleanup(&self) {
        self.cleanup_redis();
        // A lock timeout: a lingering prepared transaction (a bug) must not hang the cleanup.
        let _ = pg_rows(
            &self.pg_url,
            &format!("SET lock_timeout = '5s'; DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.schema),
        );
    }

    /// The archive's in-progress objects (none once a run finished).
    fn in_progress(&self) -> Vec<String> {
        let store =
            (CheckpointStorageConfig { url: self.archive.clone(), s3: self.s3.clone() }).build().unwrap();
        store.list("_inprogress").unwrap().into_iter().map(|e| e.path).collect()
    }

    /// Deletes the archived objects (S3 runs; directories go with the temp dir).
    fn cleanup_archive(&self) {
        if let Ok(store) =
            (CheckpointStorageConfig { url: self.archive.clone(), s3: self.s3.clone() }).build()
        {
            for e in store.list("").unwrap_or_default() {
                let _ = store.delete(&e.path);
            }
        }
    }

    fn cleanup_redis(&self) {
        if let Ok(mut c) = redis::Client::open(self.redis_url.as_str()).and_then(|c| c.get_connection()) {
            let keys: Vec<String> =
                redis::cmd("KEYS").arg(format!("{}*", self.prefix)).query(&mut c).unwrap_or_default();
            for k in keys {
                let _: redis::RedisResult<()> = redis::cmd("DEL").arg(k).query(&mut c);
            }
        }
    }
}

fn wait(child: Child) -> (ExitStatus, String) {
    let out = child.wait_with_output().expect("wait");
    (out.status, String::from_utf8_lossy(&out.stderr).to_string())
}

/// Every row as text (floats printed exactly), in the query's order.
fn pg_rows(url: &str, sql: &str) -> Vec<String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        let rows = client.simple_query(sql).await.unwrap();
        rows.iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => {
                    Some((0..r.len()).map(|i| r.get(i).unwrap_or("NULL")).collect::<Vec<_>>().join(" "))
                }
                _ => None,
            })
            .collect()
    })
}

fn redis_hashes(url: &str, prefix: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}*")).query(&mut c).unwrap();
    keys.into_iter()
        .map(|k| {
            let h: BTreeMap<String, String> = redis::cmd("HGETALL").arg(&k).query(&mut c).unwrap();
            (k.trim_start_matches(prefix).to_string(), h)
        })
        .collect()
}

/// Every hash write of the Redis sink under one key prefix, as Redis executes it: MONITOR
/// shows the HSETs the sink's Lua script runs, so `(key, ts)` → times written. A replayed
/// reading the script refuses (not newer than the stored one) is no write; an epoch applied
/// twice would be two — what the final hashes alone cannot show.
struct RedisWrites {
    counts: std::sync::Arc<std::sync::Mutex<BTreeMap<(String, String), u32>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RedisWrites {
    fn watch(url: &str, prefix: &str) -> RedisWrites {
        let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
        con.send_packed_command(&redis::cmd("MONITOR").get_packed_command()).unwrap();
        let ok = con.recv_response().unwrap();
        assert!(matches!(ok, redis::Value::Okay | redis::Value::SimpleString(_)), "MONITOR: {ok:?}");
        con.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let counts = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (c, st, prefix) = (counts.clone(), stop.clone(), prefix.to_string());
        let thread = std::thread::spawn(move || {
            while !st.load(std::sync::atomic::Ordering::SeqCst) {
                let line = match con.recv_response() {
                    Ok(redis::Value::SimpleString(line)) => line,
                    Ok(_) => continue,
                    Err(e) if e.is_timeout() => continue,
                    Err(e) => panic!("MONITOR: {e}"),
                };
                // 1700000000.123 [0 lua] "HSET" "<key>" "ts" "<ts>" ...
                let args: Vec<&str> = line.split('"').skip(1).step_by(2).collect();
                if let [cmd, key, "ts", ts, ..] = args[..] {
                    if cmd.eq_ignore_ascii_case("hset") && key.starts_with(&prefix) {
                        *c.lock().unwrap().entry((key.to_string(), ts.to_string())).or_insert(0) += 1;
                    }
                }
            }
        });
        RedisWrites { counts, stop, thread: Some(thread) }
    }

    /// Stops watching; every `(key, ts)` was written once, and there were writes.
    fn assert_each_written_once(mut self, what: &str) {
        std::thread::sleep(Duration::from_millis(300)); // the last lines of MONITOR
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        let counts = self.counts.lock().unwrap();
        assert!(!counts.is_empty(), "{what}: MONITOR saw no hash write of the sink");
        let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).take(5).collect();
        assert!(twice.is_empty(), "{what}: Redis hash writes applied more than once: {twice:?}");
    }
}

/// The S3 settings of the test stack, as the job gets them (`CAUDAL__S3__*`).
fn s3_env() -> Option<(S3Config, Vec<(String, String)>)> {
    let endpoint = service("CAUDAL_S3_ENDPOINT")?;
    let var = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
    let s3 = S3Config {
        endpoint: Some(endpoint.clone()),
        region: var("CAUDAL_S3_REGION", "us-east-1"),
        access_key_id: Some(var("CAUDAL_S3_ACCESS_KEY_ID", "test")),
        secret_access_key: Some(var("CAUDAL_S3_SECRET_ACCESS_KEY", "test")),
        allow_http: true,
        ..S3Config::default()
    };
    let env = vec![
        ("CAUDAL__S3__ENDPOINT".to_string(), endpoint),
        ("CAUDAL__S3__REGION".to_string(), s3.region.clone()),
        ("CAUDAL__S3__ACCESS_KEY_ID".to_string(), s3.access_key_id.clone().unwrap_or_default()),
        ("CAUDAL__S3__SECRET_ACCESS_KEY".to_string(), s3.secret_access_key.clone().unwrap_or_default()),
        ("CAUDAL__S3__ALLOW_HTTP".to_string(), "true".to_string()),
    ];
    Some((s3, env))
}

/// Partition → the records of all its published files (Avro reader), sorted.
fn archive(url: &str, s3: &S3Config) -> BTreeMap<String, Vec<String>> {
    let store = CheckpointStorageConfig { url: url.to_string(), s3: s3.clone() }.build().unwrap();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in store.list("").unwrap() {
        if e.path.starts_with("_inprogress") || !e.path.ends_with(".avro") {
            continue;
        }
        let partition = e.path.rsplit_once('/').map_or("", |(p, _)| p).to_string();
        let bytes = store.get(&e.path).unwrap();
        let reader = apache_avro::Reader::new(&bytes[..]).unwrap();
        let records = out.entry(partition).or_default();
        for v in reader {
            let r: caudal_schemas::ProcessedReading = apache_avro::from_value(&v.unwrap()).unwrap();
            records.push(format!("{r:?}"));
        }
    }
    out.values_mut().for_each(|v| v.sort());
    out
}

#[derive(Debug, PartialEq)]
struct Results {
    readings: Vec<String>,
    windows: Vec<String>,
    /// `sensor_alerts`: silent-sensor alerts.
    alerts: Vec<String>,
    /// `sensor_latest`: one row per sensor, upserted in every epoch.
    latest: Vec<String>,
    hashes: BTreeMap<String, BTreeMap<String, String>>,
    archive: BTreeMap<String, Vec<String>>,
}

fn assert_same(got: &Results, want: &Results, what: &str) {
    assert_eq!(got.readings.len(), want.readings.len(), "{what}: PostgreSQL reading rows");
    assert!(got.readings == want.readings, "{what}: PostgreSQL readings differ from the clean run");
    assert_eq!(got.windows.len(), want.windows.len(), "{what}: PostgreSQL window rows");
    assert!(got.windows == want.windows, "{what}: PostgreSQL windows differ from the clean run");
    assert_eq!(got.latest, want.latest, "{what}: PostgreSQL sensor_latest differs from the clean run");
    assert_eq!(got.alerts, want.alerts, "{what}: PostgreSQL sensor_alerts differ from the clean run");
    assert_eq!(got.hashes, want.hashes, "{what}: Redis hashes differ from the clean run");
    let count = |a: &BTreeMap<String, Vec<String>>| a.values().map(Vec::len).sum::<usize>();
    assert_eq!(
        got.archive.keys().collect::<Vec<_>>(),
        want.archive.keys().collect::<Vec<_>>(),
        "{what}: archive partitions"
    );
    assert_eq!(count(&got.archive), count(&want.archive), "{what}: archived records");
    assert!(got.archive == want.archive, "{what}: archived records differ from the clean run");
}

/// The uninterrupted run's results (once per test binary, on the shared services).
fn clean(pg: &str, redis: &str) -> &'static Results {
    static CLEAN: std::sync::OnceLock<Results> = std::sync::OnceLock::new();
    CLEAN.get_or_init(|| {
        let t = Target::new("clean", pg, redis);
        let (status, err) = wait(t.spawn(false));
        assert!(status.success(), "clean run failed: {err}");
        let r = t.results();
        t.cleanup();
        assert!(
            r.readings.len() > 5000 && r.windows.len() > 100,
            "clean run too small: {} {}",
            r.readings.len(),
            r.windows.len()
        );
        assert_eq!(r.latest, latest_of(&r.readings), "sensor_latest holds each sensor's last reading");
        assert_eq!(r.hashes.len(), 20, "one hash per sensor");
        assert!(r
            .hashes
            .values()
            .all(|h| ["celsius", "fahrenheit", "lat", "lon", "ts"].iter().all(|f| h.contains_key(*f))));
        assert_eq!(r.archive.values().map(Vec::len).sum::<usize>(), r.readings.len());
        assert_is_what_the_input_implies(&r);
        r
    })
}

/// A row or value as text with every float in one spelling (PostgreSQL writes `1e-05`,
/// Rust `0.00001`): floats parsed and written back shortest-exact.
fn norm(text: &str) -> String {
    text.split(' ')
        .map(|f| match f.parse::<i64>() {
            Ok(_) => f.to_string(),
            Err(_) => f.parse::<f64>().map_or_else(|_| f.to_string(), |x| format!("{x:?}")),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn same(got: &[String], want: &[String], what: &str) {
    common::assert_same_lines(got, want, what);
}

fn sorted(rows: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = rows.into_iter().map(|r| norm(&r)).collect();
    v.sort();
    v
}

/// The reference the kill tests compare with is itself what the input implies: every table,
/// hash and archived record equals the generator model's (`common::oracle`, no engine code).
fn assert_is_what_the_input_implies(r: &Results) {
    assert_eq!(common::BASE_MODEL.records, RECORDS, "the oracle models this file's runs");
    let (windows, readings) = common::oracle::expected_records(&common::BASE_MODEL);
    let row = |p: &ProcessedReading| {
        format!("{} {} {} {} {} {}", p.sensor_id, p.ts, p.lat, p.lon, p.temp_c, p.temp_f)
    };
    assert_eq!(
        sorted(r.readings.clone()),
        sorted(readings.iter().map(row)),
        "PostgreSQL readings vs the input"
    );
    let window = |w: &WindowStats| {
        format!(
            "{} {} {} {} {} {} {}",
            w.sensor_id, w.window_start, w.window_end, w.count, w.min_c, w.max_c, w.mean_c
        )
    };
    assert_eq!(
        sorted(r.windows.clone()),
        sorted(windows.iter().map(window)),
        "PostgreSQL windows vs the input"
    );
    let alerts = common::oracle::expected_alert_records(&common::BASE_MODEL)
        .iter()
        .map(|a| format!("{} {} {} {}", a.sensor_id, a.kind, a.ts, a.last_seen))
        .collect::<Vec<_>>();
    assert_eq!(alerts.len(), 6, "the outages alert");
    assert_eq!(sorted(r.alerts.clone()), sorted(alerts), "PostgreSQL sensor_alerts vs the outages");
    let mut latest: BTreeMap<i64, &ProcessedReading> = BTreeMap::new();
    for p in &readings {
        if latest.get(&p.sensor_id).is_none_or(|l| l.ts < p.ts) {
            latest.insert(p.sensor_id, p);
        }
    }
    assert_eq!(
        sorted(r.latest.clone()),
        sorted(latest.values().map(|p| row(p))),
        "sensor_latest vs the input"
    );
    let hashes: BTreeMap<String, BTreeMap<String, String>> = latest
        .values()
        .map(|p| {
            let fields = [("celsius", p.temp_c), ("fahrenheit", p.temp_f), ("lat", p.lat), ("lon", p.lon)]
                .map(|(k, v)| (k.to_string(), norm(&v.to_string())));
            let mut h: BTreeMap<String, String> = fields.into_iter().collect();
            h.insert("ts".into(), p.ts.to_string());
            (p.sensor_id.to_string(), h)
        })
        .collect();
    let got_hashes: BTreeMap<String, BTreeMap<String, String>> = r
        .hashes
        .iter()
        .map(|(k, h)| (k.clone(), h.iter().map(|(f, v)| (f.clone(), norm(v))).collect()))
        .collect();
    assert_eq!(got_hashes, hashes, "Redis hashes vs the input");
    // The archive: every plausible reading once, each in the partition of its event hour.
    let hour = |ts: i64| format!("hour={:02}", ts.div_euclid(3_600_000).rem_euclid(24));
    let ts_of: std::collections::HashMap<String, i64> =
        readings.iter().map(|p| (format!("{p:?}"), p.ts)).collect();
    let mut archived = Vec::new();
    for (partition, records) in &r.archive {
        for record in records {
            let ts =
                ts_of.get(record).unwrap_or_else(|| panic!("archived, not implied by the input: {record}"));
            assert!(partition.ends_with(&hour(*ts)), "{record} archived in {partition}");
        }
        archived.extend(records.iter().cloned());
    }
    archived.sort();
    let mut want: Vec<String> = readings.iter().map(|p| format!("{p:?}")).collect();
    want.sort();
    same(&archived, &want, "archived records vs the input");
}

/// Each sensor's reading with the largest timestamp, from rows `sensor_id ts …` sorted by
/// (sensor_id, ts): what `sensor_latest` must hold.
fn latest_of(readings: &[String]) -> Vec<String> {
    let sensor = |row: &str| row.split(' ').next().unwrap_or_default().to_string();
    let mut latest: Vec<String> = Vec::new();
    for row in readings {
        match latest.last_mut() {
            Some(last) if sensor(last) == sensor(row) => *last = row.clone(),
            _ => latest.push(row.clone()),
        }
    }
    latest
}

/// The scenario that hung before: each sensor's key repeats in every epoch of
/// `sensor_latest`, rows go out after 1 ms, checkpoints every second. Epoch n+1's upsert of a
/// key must not wait on the row lock of epoch n's prepared transaction, whose COMMIT
/// PREPARED runs on the same task thread.
#[test]
fn a_key_upserted_in_every_epoch_with_a_short_linger_neither_hangs_nor_loses() {
    let (Some(pg), Some(redis)) = (service("CAUDAL_POSTGRES_URL"), service("CAUDAL_REDIS_URL")) else {
        return;
    };
    let mut t = Target::new("latest", &pg, &redis);
    t.set = vec![
        ("--sensors", "10".into()),
        ("--records", "20000".into()),
        ("--rate", "200".into()),
        ("--event-interval-ms", "5".into()),
        ("--checkpoint-interval", "1".into()),
    ];
    t.extra = vec!["--postgres-linger-ms".into(), "1".into()];
    let mut child = t.spawn(false);
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() && started.elapsed() < Duration::from_secs(90) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let hung = child.try_wait().unwrap().is_none();
    if hung {
        child.kill().unwrap();
    }
    let (status, err) = wait(child);
    // (A prepared transaction of the hung run is left behind: roll it back by hand.)
    assert!(!hung, "the job hung (killed after 90 s): {err}");
    let got = t.results();
    // A prepared transaction left behind holds its locks on the schema's tables.
    let prepared = pg_rows(
        &pg,
        &format!(
            "SELECT c.relname || ' ' || l.mode FROM pg_locks l JOIN pg_class c ON l.relation = c.oid \
             JOIN pg_namespace n ON c.relnamespace = n.oid WHERE n.nspname = '{}'",
            t.schema
        ),
    );
    t.cleanup();
    assert!(status.success(), "{err}");
    let files = published_lines(&t.out.join("readings"));
    assert!(files > 19_000, "the file sink published {files} readings");
    assert_eq!(got.readings.len(), files, "PostgreSQL has every reading the file sink published");
    assert_eq!(got.latest.len(), 10, "one row per sensor");
    assert_eq!(got.latest, latest_of(&got.readings), "sensor_latest holds each sensor's last reading");
    assert!(prepared.is_empty(), "locks of prepared transactions left behind: {prepared:?}");
}

fn published_lines(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "jsonl"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap().lines().count())
        .sum()
}

/// A tiny deterministic RNG for kill times.
fn next(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    *seed >> 33
}

#[test]
fn killed_at_random_the_tables_hashes_and_files_equal_the_clean_run() {
    let (Some(pg), Some(redis)) = (service("CAUDAL_POSTGRES_URL"), service("CAUDAL_REDIS_URL")) else {
        return;
    };
    let want = clean(&pg, &redis);
    let Some((s3, s3_env)) = s3_env() else { return };
    // The archive goes to S3: publish (copy, delete) and the restore's listing and deletion
    // of in-progress objects run against a real object store under SIGKILL.
    let t = Target::new("killed", &pg, &redis).on_s3(s3, s3_env);
    t.log_writes();
    let redis_writes = RedisWrites::watch(&redis, &t.prefix);
    let mut seed = 0xdecaf;
    let mut kills = 0;
    while kills < 4 {
        let mut child = t.spawn(t.has_checkpoint());
        let delay = Duration::from_millis(500 + next(&mut seed) % 1200);
        let start = Instant::now();
        while start.elapsed() < delay && child.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(10));
        }
        if child.try_wait().unwrap().is_some() {
            break; // finished before the kill
        }
        child.kill().unwrap(); // SIGKILL
        let (status, _) = wait(child);
        assert_eq!(status.signal(), Some(9));
        kills += 1;
    }
    assert!(kills >= 2, "the job finished too early to be killed ({kills} kills)");
    t.finish();
    let got = t.results();
    t.assert_each_row_written_once(&got, &format!("after {kills} kills"));
    redis_writes.assert_each_written_once(&format!("after {kills} kills"));
    let in_progress = t.in_progress();
    t.cleanup();
    t.cleanup_archive();
    assert_same(&got, want, &format!("after {kills} kills"));
    assert!(in_progress.is_empty(), "in-progress objects left behind: {in_progress:?}");
}

/// Crashes (SIGKILL) inside the commit window of checkpoint 2 — after its
/// metadata is durable but before any sink heard of it, and while the sinks commit — then
/// restores until the end. Only the PostgreSQL and archive sinks run their commit there
/// (`--sink discard`): the restore must commit what checkpoint 2 prepared, exactly once.
#[test]
fn crashed_inside_the_commit_window_the_tables_and_files_equal_the_clean_run() {
    let (Some(pg), Some(redis)) = (service("CAUDAL_POSTGRES_URL"), service("CAUDAL_REDIS_URL")) else {
        return;
    };
    let want = clean(&pg, &redis);
    for point in ["after-metadata-before-notify", "during-sink-commit"] {
        let mut t = Target::new("crash", &pg, &redis);
        t.extra = vec!["--sink".into(), "discard".into()];
        t.env = vec![("CAUDAL__TEST_CRASH_AT".into(), format!("{point}:2"))];
        t.log_writes();
        let redis_writes = RedisWrites::watch(&redis, &t.prefix);
        let (status, err) = wait(t.spawn(false));
        assert_eq!(status.signal(), Some(9), "the crash point {point} was not reached: {status} {err}");
        assert!(err.contains(&format!("crash point {point}")), "died elsewhere: {err}");
        t.env.clear();
        t.finish();
        let got = t.results();
        t.assert_each_row_written_once(&got, point);
        redis_writes.assert_each_written_once(point);
        t.cleanup();
        assert_same(&got, want, point);
    }
}

/// Crashed inside the restore's own commit (#12): the run is killed after checkpoint 2's
/// metadata is durable, its restore is killed again half-way through committing what 2
/// recorded — after the first of the PostgreSQL sinks' `COMMIT PREPARED`s, or after the
/// archive published its first pre-committed file — and a second restore ends exact, each
/// row written once.
/// The checkpoint completed with every sink's epoch prepared (PostgreSQL), uploaded
/// (archive) or written (Redis) when the job dies; the restore runs at another parallelism
/// (#43: none did with sink output pending): the new subtask 0 commits every old subtask's
/// prepared epoch, and tables, hashes and files equal the clean run, each row written once.
#[test]
fn crashed_in_the_commit_window_and_restored_at_another_parallelism_the_results_equal_the_clean_run() {
    let (Some(pg), Some(redis)) = (service("CAUDAL_POSTGRES_URL"), service("CAUDAL_REDIS_URL")) else {
        return;
    };
    let want = clean(&pg, &redis);
    for to in ["3", "1"] {
        let what = format!("committed checkpoint 2 pending, restored at parallelism {to}");
        let mut t = Target::new("rescale", &pg, &redis);
        t.extra = vec!["--sink".into(), "discard".into()];
        t.env = vec![("CAUDAL__TEST_CRASH_AT".into(), "after-metadata-before-notify:2".into())];
        t.log_writes();
        let (status, err) = wait(t.spawn(false));
        assert_eq!(status.signal(), Some(9), "{what}: the crash point was not reached: {status} {err}");
        t.env.clear();
        t.set.push(("--parallelism", to.into()));
        t.finish();
        let got = t.results();
        t.assert_each_row_written_once(&got, &what);
        t.cleanup();
        assert_same(&got, want, &what);
    }
}

#[test]
fn crashed_inside_the_restores_commit_a_second_restore_ends_exact() {
    let (Some(pg), Some(redis)) = (service("CAUDAL_POSTGRES_URL"), service("CAUDAL_REDIS_URL")) else {
        return;
    };
    let want = clean(&pg, &redis);
    for point in ["during-postgres-recommit", "during-archive-republish"] {
        let mut t = Target::new("recommit", &pg, &redis);
        t.extra = vec!["--sink".into(), "discard".into()];
        t.env = vec![("CAUDAL__TEST_CRASH_AT".into(), "after-metadata-before-notify:2".into())];
        t.log_writes();
        let (status, err) = wait(t.spawn(false));
        assert_eq!(status.signal(), Some(9), "not killed after checkpoint 2's metadata: {status} {err}");
        t.env = vec![("CAUDAL__TEST_CRASH_AT".into(), format!("{point}:2"))];
        let (status, err) = wait(t.spawn(true));
        assert_eq!(status.signal(), Some(9), "the restore did not reach {point}: {status} {err}");
        assert!(err.contains(&format!("crash point {point} at checkpoint 2")), "died elsewhere: {err}");
        t.env.clear();
        t.finish();
        let got = t.results();
        t.assert_each_row_written_once(&got, point);
        t.cleanup();
        assert_same(&got, want, point);
    }
}

/// A private PostgreSQL and Redis (scripts/services.sh with a stack dir and ports of their
/// own), so stopping them disturbs nobody.
struct PrivateStack {
    dir: tempfile::TempDir,
    pg_port: u16,
    redis_port: u16,
    redis_tls_port: u16,
}

impl PrivateStack {
    fn services(&self, cmd: &str, which: &[&str]) {
        // At run time: cargo reuses a test binary built in another checkout of the same
        // workspace (the compile-time path would be that checkout's).
        let script = std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")), std::path::PathBuf::from)
            .join("../scripts/services.sh");
        let out = Command::new(script)
            .arg(cmd)
            .args(which)
            .env("CAUDAL_STACK_DIR", self.dir.path())
            .env("CAUDAL_POSTGRES_PORT", self.pg_port.to_string())
            .env("CAUDAL_REDIS_PORT", self.redis_port.to_string())
            .env("CAUDAL_REDIS_TLS_PORT", self.redis_tls_port.to_string())
            .env("CAUDAL_NO_INSTALL", "1")
            // Data that survives a restart, as a production server's does (#43: the stack's
            // Redis kept nothing across one, so a test restarting it could not fail).
            .env("CAUDAL_DURABLE", "1")
            .output()
            .unwrap();
        assert!(out.status.success(), "services.sh {cmd}: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn start() -> PrivateStack {
        let s = PrivateStack {
            dir: tempfile::tempdir().unwrap(),
            pg_port: free_port(),
            redis_port: free_port(),
            redis_tls_port: free_port(),
        };
        s.services("start", &["postgres", "redis"]);
        s
    }

    fn pg_url(&self) -> String {
        format!("postgres://caudal@127.0.0.1:{}/caudal", self.pg_port)
    }

    fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.redis_port)
    }
}

impl Drop for PrivateStack {
    fn drop(&mut self) {
        // Purge, not stop: PostgreSQL's files may live outside the stack folder.
        self.services("purge", &["postgres", "redis"]);
    }
}

/// PostgreSQL and Redis (both durable: fsync, Redis's append-only file synced at every
/// write) restarted while every sink's epoch 3 is prepared and none is committed yet (#12): the coordinator is held right after checkpoint 3's metadata is
/// durable (`CAUDAL__TEST_PAUSE_AT`), both servers are stopped and started meanwhile, then
/// the sinks are told. The prepared transactions survive the restart, `COMMIT PREPARED` runs
/// on a new connection, and the tables and hashes are exact, each row written once, no
/// prepared transaction left.
#[test]
fn postgres_and_redis_restarted_between_prepare_and_commit_lose_and_repeat_nothing() {
    let (Some(pg), Some(redis)) = (service("CAUDAL_POSTGRES_URL"), service("CAUDAL_REDIS_URL")) else {
        return;
    };
    let want = clean(&pg, &redis);
    let stack = PrivateStack::start();
    let mut t = Target::new("prepared", &stack.pg_url(), &stack.redis_url());
    t.extra = vec!["--sink".into(), "discard".into()];
    t.env = vec![("CAUDAL__TEST_PAUSE_AT".into(), "after-metadata-before-notify:3:8000".into())];
    t.log_writes();
    let child = t.spawn(false);
    let metadata = t.ckpt.join("temperature/chk-3/_metadata");
    let start = Instant::now();
    while !metadata.exists() {
        assert!(start.elapsed() < Duration::from_secs(30), "checkpoint 3 did not complete");
        std::thread::sleep(Duration::from_millis(10));
    }
    let paused = Instant::now();
    let prepared = pg_rows(&stack.pg_url(), "SELECT count(*) FROM pg_prepared_xacts");
    assert_ne!(prepared, ["0"], "no epoch was prepared when the servers went down");
    // The job is frozen while the servers restart, so what they hold before and after can be
    // compared: what the sinks wrote and the servers acknowledged must still be there.
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    std::thread::sleep(Duration::from_millis(200)); // what was on its way is in
    let hashes = redis_hashes(&stack.redis_url(), &t.prefix);
    assert!(!hashes.is_empty(), "nothing was written to Redis before the restart");
    stack.services("stop", &["postgres", "redis"]);
    stack.services("start", &["postgres", "redis"]);
    assert_eq!(pg_rows(&stack.pg_url(), "SELECT count(*) FROM pg_prepared_xacts"), prepared);
    assert_eq!(redis_hashes(&stack.redis_url(), &t.prefix), hashes, "Redis lost writes in the restart");
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    assert!(
        paused.elapsed() < Duration::from_secs(8),
        "the restart outlasted the pause: {:?}",
        paused.elapsed()
    );
    let (status, err) = wait(child);
    assert!(status.success(), "the job failed: {err}");
    assert!(err.contains("pause point after-metadata-before-notify at checkpoint 3"), "{err}");
    let got = t.results();
    t.assert_each_row_written_once(&got, "restarted between prepare and commit");
    assert_eq!(pg_rows(&stack.pg_url(), "SELECT count(*) FROM pg_prepared_xacts"), ["0"]);
    assert_same(&got, want, "PostgreSQL and Redis restarted between prepare and commit");
}

/// What the job's REST API (`/api/v1/jobs/temperature/metrics`) says of the generator and
/// the sinks of the outage.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Progress {
    /// Records the generator emitted (all subtasks).
    generated: u64,
    /// `sink_retries` of the readings' PostgreSQL sink and of the Redis sink.
    postgres_retries: u64,
    redis_retries: u64,
}

fn progress(agent: &ureq::Agent, port: u16) -> Option<Progress> {
    let url = format!("http://127.0.0.1:{port}/api/v1/jobs/temperature/metrics");
    let mut response = agent.get(&url).call().ok()?;
    let body = response.body_mut().read_to_string().ok()?;
    let m: serde_json::Value = serde_json::from_str(&body).ok()?;
    let op = |name: &str| m["operators"].as_array()?.iter().find(|o| o["name"] == name).cloned();
    let retries = |name: &str| op(name).and_then(|o| o["counters"]["sink_retries"].as_u64()).unwrap_or(0);
    Some(Progress {
        generated: op("sensor-generator")?["records_out"].as_u64()?,
        postgres_retries: retries("readings-postgres"),
        redis_retries: retries("readings-redis"),
    })
}

/// Polls the job's metrics until `done` holds while the generator has emitted nothing new
/// for a second before the end of its input (the job is backpressured: the source
/// stalled); returns that reading. Panics after 30 s with the last one.
fn wait_stalled(agent: &ureq::Agent, port: u16, what: &str, done: impl Fn(&Progress) -> bool) -> Progress {
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut last, mut since): (Option<Progress>, Instant) = (None, Instant::now());
    loop {
        if let Some(p) = progress(agent, port) {
            assert!(p.generated < RECORDS, "{what}: the input ended before the job stalled: {p:?}");
            if last.is_some_and(|q| q.generated != p.generated) {
                since = Instant::now();
            }
            last = Some(p);
            if done(&p) && since.elapsed() >= Duration::from_secs(1) {
                return p;
            }
        }
        assert!(Instant::now() < deadline, "{what}: the job did not stall waiting for the service: {last:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Both services go away while the job runs and stay away until the job has stalled
/// (the generator emits nothing for a second, well before the end of its input) with the
/// sinks retrying; then one comes back, and the other only once the job stalled again on
/// it. So both sinks retried and backpressured the job, and the last readings of every
/// sensor (the Redis hashes) were written after the outage: a sink that dropped writes
/// while its service was away, instead of waiting, differs from the clean run.
#[test]
fn postgres_and_redis_stopped_and_started_mid_run_the_job_waits_and_loses_nothing() {
    let (Some(pg), Some(redis)) = (service("CAUDAL_POSTGRES_URL"), service("CAUDAL_REDIS_URL")) else {
        return;
    };
    let want = clean(&pg, &redis);
    let Some((s3, s3_env)) = s3_env() else { return };
    let stack = PrivateStack::start();
    // The archive goes to S3 here (the crash-window test archives into a directory).
    let mut t = Target::new("restart", &stack.pg_url(), &stack.redis_url()).on_s3(s3, s3_env);
    let port = free_port();
    t.ui_port = Some(port);
    let agent: ureq::Agent =
        ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(2))).build().into();
    let child = t.spawn(false);
    // Mid-run: the sinks have written, most of the input is still to come.
    let started = wait_until(&agent, port, |p| p.generated >= 600);
    stack.services("stop", &["postgres", "redis"]);
    let first = wait_stalled(&agent, port, "both down", |p| {
        p.postgres_retries > started.postgres_retries || p.redis_retries > started.redis_retries
    });
    // The sink that waits holds the chain; bring its service back and the other one's
    // turn comes.
    let (back, other) = if first.postgres_retries > started.postgres_retries {
        ("postgres", "redis")
    } else {
        ("redis", "postgres")
    };
    stack.services("start", &[back]);
    let second = wait_stalled(&agent, port, &format!("{other} down"), |p| {
        p.postgres_retries > started.postgres_retries && p.redis_retries > started.redis_retries
    });
    stack.services("start", &[other]);
    eprintln!("outage: from {started:?}, stalled on both at {first:?}, {back} back, stalled on {other} at {second:?}");
    let (status, err) = wait(child);
    assert!(status.success(), "the job survives the outage: {err}");
    assert!(second.generated < RECORDS, "the outage ended before the input did: {second:?}");
    for sink in ["readings-postgres", "readings-redis"] {
        let named = format!("`{sink}`");
        let logged = err.lines().any(|l| l.contains(&named) && l.contains("retrying"));
        assert!(logged, "{sink} logged its retries: {err}");
    }
    let got = t.results();
    t.cleanup_archive();
    assert_same(&got, want, "PostgreSQL and Redis restarted");
}

/// Polls the job's metrics until `ready` holds (30 s at most).
fn wait_until(agent: &ureq::Agent, port: u16, ready: impl Fn(&Progress) -> bool) -> Progress {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(p) = progress(agent, port).filter(|p| ready(p)) {
            return p;
        }
        assert!(Instant::now() < deadline, "the job's metrics never got there: {:?}", progress(agent, port));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The secured endpoints of the stack: PostgreSQL and Redis over TLS with passwords, and
/// the stack's CA; `None` (the test skipped) when the stack does not run them.
fn secured() -> Option<(String, String, String)> {
    let [pg_tls, redis_tls, ca] =
        caudal_test_stack::services(["CAUDAL_POSTGRES_TLS_URL", "CAUDAL_REDIS_TLS_URL", "CAUDAL_STACK_CA"])?;
    Some((pg_tls, redis_tls, ca))
}

/// The password of the stack's role `caudal_tls` in a URL of it.
fn password_in(url: &str) -> String {
    url.split_once("caudal_tls:").unwrap().1.split_once('@').unwrap().0.to_owned()
}

/// A secured platform (#44): the PostgreSQL sinks over TLS (`sslmode=verify-full`, the
/// stack's CA) as a role with a SCRAM password that the server refuses without TLS, and the
/// Redis sink over TLS (`rediss://`, the same CA) as an ACL user with a password. Killed in
/// the commit window of checkpoint 2, the restore commits what it prepared over TLS; tables
/// and hashes equal the clean run's, each row and hash written once.
#[test]
fn over_tls_with_passwords_a_crash_in_the_commit_window_ends_exact() {
    let (Some(pg), Some(redis)) = (service("CAUDAL_POSTGRES_URL"), service("CAUDAL_REDIS_URL")) else {
        return;
    };
    let Some((pg_tls, redis_tls, ca)) = secured() else { return };
    let want = clean(&pg, &redis);
    let mut t = Target::new("tls", &pg, &redis);
    // The passwords reach the job through variables the URLs name, not on its command line.
    let (pg_password, redis_password) = (password_in(&pg_tls), password_in(&redis_tls));
    t.job_pg_url = Some(pg_tls.replacen(&pg_password, "${env:CAUDAL_TEST_PG_PASSWORD}", 1));
    t.job_redis_url = Some(redis_tls.replacen(&redis_password, "${env:CAUDAL_TEST_REDIS_PASSWORD}", 1));
    t.extra = vec!["--sink".into(), "discard".into(), "--redis-tls-ca".into(), ca];
    t.env = vec![
        ("CAUDAL__TEST_CRASH_AT".into(), "after-metadata-before-notify:2".into()),
        ("CAUDAL_TEST_PG_PASSWORD".into(), pg_password),
        ("CAUDAL_TEST_REDIS_PASSWORD".into(), redis_password),
    ];
    t.log_writes();
    pg_rows(
        &pg,
        &format!(
            "ALTER SCHEMA \"{s}\" OWNER TO caudal_tls; ALTER TABLE \"{s}\".sensor_readings OWNER TO caudal_tls; \
             ALTER TABLE \"{s}\".window_stats OWNER TO caudal_tls; ALTER TABLE \"{s}\".sensor_alerts OWNER TO caudal_tls; \
             ALTER TABLE \"{s}\".caudal_test_writes OWNER TO caudal_tls",
            s = t.schema
        ),
    );
    let redis_writes = RedisWrites::watch(&redis, &t.prefix);
    let (status, err) = wait(t.spawn(false));
    assert_eq!(status.signal(), Some(9), "the crash point was not reached: {status} {err}");
    t.env.retain(|(k, _)| k != "CAUDAL__TEST_CRASH_AT");
    t.finish();
    let got = t.results();
    t.assert_each_row_written_once(&got, "over TLS");
    redis_writes.assert_each_written_once("over TLS");
    t.cleanup();
    assert_same(&got, want, "over TLS, crashed in the commit window");
}

/// Each wrong TLS or password setting fails the job at start, naming the sink and the
/// cause, never retried as if transient, never showing a password (#44): PostgreSQL without
/// TLS for a role the server takes over TLS only, with a CA the server's certificate was not
/// signed by (the system's roots), with a wrong password; Redis with a wrong password and
/// with the system's roots.
#[test]
fn wrong_tls_and_password_settings_fail_the_job_at_start_naming_the_cause() {
    let (Some(pg), Some(redis)) = (service("CAUDAL_POSTGRES_URL"), service("CAUDAL_REDIS_URL")) else {
        return;
    };
    let Some((pg_tls, redis_tls, ca)) = secured() else { return };
    let (pg_password, redis_password) = (password_in(&pg_tls), password_in(&redis_tls));
    let (pg_base, _) = pg_tls.split_once('?').unwrap();
    let wrong = |url: &str, password: &str| url.replacen(&format!(":{password}@"), ":not-the-password@", 1);
    let redis_ca = vec!["--redis-tls-ca".to_string(), ca.clone()];
    for (what, pg_url, redis_url, extra, sink, cause) in [
        (
            "PostgreSQL without TLS",
            format!("{pg_base}?sslmode=disable"),
            redis.clone(),
            vec![],
            "PostgreSQL sink",
            "no encryption",
        ),
        (
            "PostgreSQL with an unknown CA",
            format!("{pg_base}?sslmode=verify-full&sslrootcert=system"),
            redis.clone(),
            vec![],
            "PostgreSQL sink",
            "not trusted",
        ),
        (
            "PostgreSQL with a wrong password",
            wrong(&pg_tls, &pg_password),
            redis.clone(),
            vec![],
            "PostgreSQL sink",
            "password authentication failed",
        ),
        (
            "Redis with a wrong password",
            pg.clone(),
            wrong(&redis_tls, &redis_password),
            redis_ca,
            "Redis sink",
            "authentication failed",
        ),
        ("Redis with an unknown CA", pg.clone(), redis_tls.clone(), vec![], "Redis sink", "not trusted"),
    ] {
        let mut t = Target::new("tlswrong", &pg, &redis);
        t.job_pg_url = Some(pg_url);
        t.job_redis_url = Some(redis_url);
        t.extra = extra;
        let started = Instant::now();
        let (status, err) = wait(t.spawn(false));
        t.cleanup();
        assert!(!status.success(), "{what}: the job ran");
        assert!(err.contains(sink) && err.contains(cause), "{what}: {err}");
        for secret in [&pg_password, &redis_password, &"not-the-password".to_string()] {
            assert!(!err.contains(secret.as_str()), "{what}: a password was shown: {err}");
        }
        assert!(started.elapsed() < Duration::from_secs(60), "{what}: retried as if transient");
    }
}

/// A permanent failure (an unknown role) fails the job at once, naming the sink and the cause.
#[test]
fn an_unknown_postgres_role_fails_the_job_naming_the_sink_and_the_cause() {
    let (Some(pg), Some(redis)) = (service("CAUDAL_POSTGRES_URL"), service("CAUDAL_REDIS_URL")) else {
        return;
    };
    let pg: tokio_postgres::Config = pg.parse().unwrap();
    let host = match &pg.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        #[allow(unreachable_patterns)]
        _ => "127.0.0.1".into(),
    };
    let url =
        format!("postgres://no_such_role_caudal@{host}:{}/{}", pg.get_ports()[0], pg.get_dbname().unwrap());
    let t = Target::new("badrole", &url, &redis);
    let (status, err) = wait(t.spawn(false));
    t.cleanup_redis();
    assert!(!status.success());
    assert!(err.contains("PostgreSQL sink") && err.contains("no_such_role_caudal"), "{err}");
}

/// A wrong password (for the role scripts/services.sh creates with one) fails the job at
/// once, naming the sink and the cause.
#[test]
fn a_wrong_postgres_password_fails_the_job_naming_the_sink_and_the_cause() {
    let (Some(pg), Some(redis)) = (service("CAUDAL_POSTGRES_URL"), service("CAUDAL_REDIS_URL")) else {
        return;
    };
    let role = pg_rows(&pg, "SELECT 1 FROM pg_roles WHERE rolname = 'caudal_pw'");
    assert!(!role.is_empty(), "no role caudal_pw: run scripts/services.sh start postgres (it creates it)");
    let pg: tokio_postgres::Config = pg.parse().unwrap();
    let host = match &pg.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        #[allow(unreachable_patterns)]
        _ => "127.0.0.1".into(),
    };
    let url = format!("postgres://caudal_pw:wrong@{host}:{}/{}", pg.get_ports()[0], pg.get_dbname().unwrap());
    let t = Target::new("badpassword", &url, &redis);
    let started = Instant::now();
    let (status, err) = wait(t.spawn(false));
    t.cleanup_redis();
    assert!(!status.success());
    assert!(
        ["readings-postgres", "windows-postgres", "latest-postgres", "alerts-postgres"]
            .iter()
            .any(|s| err.contains(&format!("PostgreSQL sink `{s}`")))
            && err.contains("password authentication failed"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(60), "not retried as if transient");
}

/// The PostgreSQL, Redis and archive sinks in a cluster (#43: they ran embedded only): a job
/// manager and two task managers, one SIGKILLed mid-run and replaced; the job resumes on the
/// others from its last checkpoint (the restored epochs committed by the new attempt, the dead
/// one's prepared transactions rolled back), and the tables, hashes and archived records are
/// what the input implies.
#[test]
fn in_a_cluster_with_a_task_manager_killed_the_tables_hashes_and_files_are_what_the_input_implies() {
    use cluster_support::Cluster;
    let (Some(pg), Some(redis)) = (service("CAUDAL_POSTGRES_URL"), service("CAUDAL_REDIS_URL")) else {
        return;
    };
    let mut t = Target::new("cluster", &pg, &redis);
    // ~12 s: room for a kill after the first checkpoint.
    t.set.push(("--rate", "25".into()));
    let mut args = t.args();
    // The job manager decides where checkpoints go.
    let at = args.iter().position(|a| a == "--checkpoint-dir").unwrap();
    args.drain(at..at + 2);
    let mut c = Cluster::start(&[]);
    for tm in ["tm-1", "tm-2"] {
        c.start_taskmanager(tm, 2);
    }
    c.wait_for_task_managers(2);
    let o = c.submit(2, &args);
    assert!(o.status.success(), "submit failed: {}{}", String::from_utf8_lossy(&o.stderr), c.logs());
    c.kill_a_task_manager_of("temperature", "tm-3", 2, 120);
    let r = t.results();
    assert_is_what_the_input_implies(&r);
    assert!(t.in_progress().is_empty(), "in-progress archive objects left: {:?}", t.in_progress());
    t.cleanup();
}

/// Waits for `child` at most `secs`; SIGKILLs it and fails the test past that.
fn wait_within(child: Child, secs: u64, what: &str) -> (ExitStatus, String) {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(wait(child));
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(done) => done,
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            let (_, err) = rx.recv().expect("the killed process's output");
            panic!("{what}: still running after {secs} s:\n{err}");
        }
    }
}

/// A real zombie (#43): the run freezes itself (SIGSTOP, as a frozen VM would) with rows of
/// epoch 3 in its open PostgreSQL transactions, their keys locked; a second run restores
/// checkpoint 2 meanwhile. Before the fencing, the second run's upserts of the same keys
/// waited for those locks (statement timeouts and retries for minutes); now it claims the
/// sinks, ends the frozen run's sessions and finishes. Resumed, the frozen run is fenced —
/// it reconnects, finds the claim and stops without preparing — and the tables, hashes and
/// files are what the clean run wrote, each row written once.
#[test]
fn a_frozen_run_resumed_after_its_successor_restored_is_fenced_and_holds_nothing_back() {
    zombie_resumed_after_its_successor(
        "before-sink-barrier:3",
        Some("session(s) of earlier runs (fenced)"),
        "fenced",
    );
}

/// A zombie past its sinks' pre-commit (#43): frozen with every sink's epoch 3 prepared —
/// PostgreSQL transactions prepared, archive files written in progress, Redis writes held —
/// just before its coordinator writes checkpoint 3's metadata. Its successor claims the
/// job's checkpoint storage, restores checkpoint 2 and finishes. Resumed, the zombie finds
/// the newer claim before the metadata write and stops: checkpoint 3 never completes in it,
/// so none of its sinks commits what the successor wrote again.
#[test]
fn a_run_frozen_before_its_checkpoint_completed_is_superseded_and_commits_nothing() {
    zombie_resumed_after_its_successor("before-metadata:3", None, "is superseded");
}

/// Freezes a run at `point`, lets a successor restore and finish, resumes the frozen run and
/// checks that it stopped with `zombie_stops_with` and that every sink holds what the clean
/// run wrote, each row written once.
fn zombie_resumed_after_its_successor(point: &str, successor_says: Option<&str>, zombie_stops_with: &str) {
    let (Some(pg), Some(redis)) = (service("CAUDAL_POSTGRES_URL"), service("CAUDAL_REDIS_URL")) else {
        return;
    };
    let want = clean(&pg, &redis);
    let mut t = Target::new("zombie", &pg, &redis);
    t.extra = vec!["--sink".into(), "discard".into()];
    t.env = vec![("CAUDAL__TEST_FREEZE_AT".into(), point.into())];
    t.log_writes();
    let redis_writes = RedisWrites::watch(&redis, &t.prefix);
    let zombie = t.spawn(false);
    let frozen = common::frozen::Frozen::wait_for(zombie.id(), 60, point);
    assert!(t.has_checkpoint(), "frozen before any checkpoint completed");

    t.env.clear();
    let (status, err) = wait_within(t.spawn(true), 120, "the successor of a frozen run");
    assert!(status.success(), "the successor failed ({status}):\n{err}");
    if let Some(says) = successor_says {
        assert!(err.contains(says), "the successor did not say `{says}`:\n{err}");
    }

    frozen.resume();
    let (status, err) = wait_within(zombie, 60, "the resumed zombie");
    let (name, checkpoint) = point.split_once(':').unwrap();
    let froze = format!("freeze point {name} at checkpoint {checkpoint}");
    assert!(err.contains(&froze), "frozen elsewhere:\n{err}");
    assert!(!status.success(), "the resumed zombie must stop:\n{err}");
    assert!(err.contains(zombie_stops_with), "the zombie stopped for another reason:\n{err}");

    let got = t.results();
    t.assert_each_row_written_once(&got, "a zombie resumed");
    redis_writes.assert_each_written_once("a zombie resumed");
    t.cleanup();
    assert_same(&got, want, &format!("a run frozen at {point} resumed after its successor restored"));
}

//! Exactly-once into Iceberg, judged by an independent reader: the temperature job writes
//! its readings and window statistics into Iceberg tables (the SQL catalog in the test
//! stack's PostgreSQL or its REST catalog, files in a local warehouse or on the S3 server),
//! and pyiceberg
//! (`scripts/iceberg-read.py`) reads them back — after a clean bounded run, after a SIGKILL
//! at each crash point of the commit protocol and at random moments. The rows must be
//! exactly what the generator's input implies (`common/oracle.rs`, without the engine):
//! no loss, no duplicate. Each snapshot carries its checkpoint id and holds exactly the
//! readings the file sink published up to that checkpoint (time travel). In a cluster too,
//! with a task manager killed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../tests/tests/cluster_support/mod.rs"]
mod cluster_support;
mod common;

use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The catalog and the reader, or `None` (the test passes after saying why) unless
/// `CAUDAL_REQUIRE_STACK` is set.
struct Lake {
    catalog: String,
    python: String,
    namespace: String,
    warehouse: String,
    /// The S3 endpoint when the warehouse is on S3.
    s3: Option<String>,
    env: Vec<(&'static str, String)>,
}

impl Lake {
    fn local(dir: &Path) -> Option<Lake> {
        let [catalog, python] = caudal_test_stack::services(["CAUDAL_POSTGRES_URL", "CAUDAL_PYTHON"])?;
        Some(Lake {
            catalog,
            python,
            namespace: namespace(),
            warehouse: dir.display().to_string(),
            s3: None,
            env: vec![],
        })
    }

    fn s3() -> Option<Lake> {
        let [catalog, python] = caudal_test_stack::services(["CAUDAL_POSTGRES_URL", "CAUDAL_PYTHON"])?;
        let env = s3::env()?;
        let endpoint = env.iter().find(|(k, _)| *k == "CAUDAL__S3__ENDPOINT").map(|(_, v)| v.clone());
        Some(Lake {
            catalog,
            python,
            namespace: namespace(),
            warehouse: s3::unique_url("lake"),
            s3: endpoint,
            env,
        })
    }

    /// The stack's REST catalog (`scripts/services.sh start iceberg-rest`), tables on S3
    /// (its server writes their metadata there).
    fn rest() -> Option<Lake> {
        let [catalog, python] = caudal_test_stack::services(["CAUDAL_ICEBERG_REST_URL", "CAUDAL_PYTHON"])?;
        Some(Lake { catalog, python, ..Lake::s3()? })
    }

    fn args(&self, base: Vec<String>) -> Vec<String> {
        let ns = &self.namespace;
        base.into_iter()
            .chain([
                "--iceberg-catalog".into(),
                self.catalog.clone(),
                "--iceberg-warehouse".into(),
                self.warehouse.clone(),
                "--iceberg-table".into(),
                format!("{ns}.readings"),
                "--iceberg-windows-table".into(),
                format!("{ns}.windows"),
            ])
            .collect()
    }

    /// pyiceberg's answer for `table` (see `scripts/iceberg-read.py`).
    fn read(&self, table: &str) -> Value {
        self.try_read(table).unwrap_or_else(|e| panic!("pyiceberg failed: {e}"))
    }

    /// pyiceberg's answer for `table`, or what it said when it failed (no table yet, say).
    fn try_read(&self, table: &str) -> Result<Value, String> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/iceberg-read.py");
        let mut cmd = Command::new(&self.python);
        cmd.arg(script).args([&self.catalog, "caudal", &format!("{}.{table}", self.namespace)]);
        if let Some(endpoint) = &self.s3 {
            cmd.arg(endpoint);
        }
        let o = cmd.output().unwrap();
        if !o.status.success() {
            return Err(String::from_utf8_lossy(&o.stderr).to_string());
        }
        Ok(serde_json::from_slice(&o.stdout).unwrap())
    }
}

/// A float pyiceberg answered as its repr text, exactly.
fn float(v: &Value) -> f64 {
    v.as_str().unwrap_or_else(|| panic!("not a float's text: {v}")).parse().unwrap()
}

fn namespace() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("t{}_{}", std::process::id(), nanos % 1_000_000_000_000)
}

/// Restores `args` and runs it to the end; the restore must succeed at once (a failed
/// restore is a test failure, never retried). Answers the run's stderr, for the story a
/// failed check tells.
fn finish_with(args: &[String], env: &[(&str, String)]) -> String {
    let (status, err) = wait(spawn(args, true, env));
    assert!(status.success(), "the restored run failed ({status}):\n{err}");
    err
}

/// What the lake's `table` went through, for a failed check's message: each snapshot's
/// checkpoint id, run, rows and the files it added.
fn snapshot_story(lake: &Lake, table: &str) -> String {
    let Ok(answer) = lake.try_read(table) else { return format!("{table}: unreadable") };
    let mut story = format!("snapshots of {table}:\n");
    for s in answer["snapshots"].as_array().into_iter().flatten() {
        let p = &s["summary"];
        story += &format!(
            "  id {} parent {} checkpoint {} run {} rows {} added files {} added records {}\n",
            s["id"],
            s["parent"],
            p["caudal.checkpoint-id"],
            p["caudal.run"],
            s["rows"],
            p["added-data-files"],
            p["added-records"]
        );
    }
    story
}
/// The lake holds exactly what the input implies: every plausible reading and every window
/// once (pyiceberg's rows against the oracle), one snapshot per checkpoint. `runs` (the
/// jobs' stderr) goes into the message when it does not, with each table's snapshots.
fn assert_lake_equals_model(lake: &Lake, what: &str, runs: &str) {
    let (windows, readings) = oracle::expected_records(&BASE_MODEL);
    let fail = |table: &str, diff: String| -> ! {
        panic!("{what}: iceberg {table}: {diff}\n{}\nthe runs' stderr:\n{runs}", snapshot_story(lake, table))
    };
    let answer = lake.read("readings");
    let mut got: Vec<String> = answer["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{} {} {} {} {}",
                r["sensor_id"],
                r["ts"],
                float(&r["temp_c"]),
                float(&r["temp_f"]),
                float(&r["lat"])
            )
        })
        .collect();
    got.sort();
    let mut want: Vec<String> = readings
        .iter()
        .map(|r| format!("{} {} {} {} {}", r.sensor_id, r.ts, r.temp_c, r.temp_f, r.lat))
        .collect();
    want.sort();
    if let Some(diff) = lines_differ(&got, &want) {
        fail("readings", diff);
    }
    assert_one_snapshot_per_checkpoint(&answer, what);

    let answer = lake.read("windows");
    let mut got: Vec<String> = answer["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            let (min, max, mean) = (float(&w["min_c"]), float(&w["max_c"]), float(&w["mean_c"]));
            format!(
                "{} {} {} {} {min} {max} {mean}",
                w["sensor_id"], w["window_start"], w["window_end"], w["count"]
            )
        })
        .collect();
    got.sort();
    let mut want: Vec<String> = windows
        .iter()
        .map(|w| {
            let (min, max, mean) = (w.min_c, w.max_c, w.mean_c);
            format!("{} {} {} {} {min} {max} {mean}", w.sensor_id, w.window_start, w.window_end, w.count)
        })
        .collect();
    want.sort();
    if let Some(diff) = lines_differ(&got, &want) {
        fail("windows", diff);
    }
}

/// Every snapshot names its checkpoint, the ids rise, and each holds more rows than the last.
fn assert_one_snapshot_per_checkpoint(answer: &Value, what: &str) -> Vec<(u64, u64)> {
    let mut last = (0, 0);
    let mut out = Vec::new();
    for s in answer["snapshots"].as_array().unwrap() {
        let checkpoint: u64 = s["summary"]["caudal.checkpoint-id"].as_str().unwrap().parse().unwrap();
        let rows = s["rows"].as_u64().unwrap();
        assert!(checkpoint > last.0 && rows > last.1, "{what}: snapshot {s} after {last:?}");
        assert!(s["summary"]["caudal.run"].is_string(), "{what}: snapshot {s} has no run");
        last = (checkpoint, rows);
        out.push(last);
    }
    assert!(!out.is_empty(), "{what}: no snapshot");
    out
}

/// Lines the file sink published per checkpoint (`part-<subtask>-<checkpoint>.<attempt>.jsonl`).
fn file_sink_lines_per_checkpoint(out: &Path) -> BTreeMap<u64, u64> {
    let mut per = BTreeMap::new();
    for e in std::fs::read_dir(out.join("readings")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(rest) = name.strip_prefix("part-") else { continue };
        let checkpoint: u64 = rest.split(['-', '.']).nth(1).unwrap().parse().unwrap();
        let lines = std::fs::read_to_string(e.path()).unwrap().lines().count() as u64;
        *per.entry(checkpoint).or_default() += lines;
    }
    per
}

fn clean_run(lake: Lake) {
    let d = dirs();
    let args = lake.args(base_args(&d.out, &d.ckpt, 2));
    let (status, err) = wait(spawn(&args, false, &lake.env));
    assert!(status.success(), "the run failed: {err}");
    assert_lake_equals_model(&lake, "clean run", &err);
    assert_equals_expected(&d, "clean run");
    // Time travel: the snapshot of checkpoint n holds exactly what the file sink published
    // up to n (both sinks close their epoch at the same barrier).
    let snapshots = assert_one_snapshot_per_checkpoint(&lake.read("readings"), "clean run");
    let per = file_sink_lines_per_checkpoint(&d.out);
    for &(checkpoint, rows) in &snapshots {
        let published: u64 = per.range(..=checkpoint).map(|(_, n)| n).sum();
        assert_eq!(rows, published, "the snapshot of checkpoint {checkpoint}");
    }
    // `caudal iceberg snapshots` lists the same snapshots with their checkpoint ids.
    let cli = Path::new(env!("CARGO_BIN_EXE_temperature")).with_file_name("caudal-iceberg");
    let o = Command::new(cli)
        .args(["snapshots", &format!("{}.readings", lake.namespace), "--catalog", &lake.catalog])
        .envs(lake.env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "caudal iceberg snapshots: {}", String::from_utf8_lossy(&o.stderr));
    let ids: Vec<u64> =
        listed.lines().skip(1).map(|l| l.split_whitespace().nth(3).unwrap().parse().unwrap()).collect();
    assert_eq!(ids, snapshots.iter().map(|s| s.0).collect::<Vec<_>>(), "{listed}");
    assert!(listed.contains("readings-iceberg"), "{listed}");
}

#[test]
fn a_bounded_run_into_a_local_warehouse_is_read_back_by_pyiceberg_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let Some(lake) = Lake::local(dir.path()) else { return };
    clean_run(lake);
}

#[test]
fn a_bounded_run_into_an_s3_warehouse_is_read_back_by_pyiceberg_exactly() {
    let Some(lake) = Lake::s3() else { return };
    clean_run(lake);
}

/// The REST catalog instead of the SQL one: the same rows, snapshots and time travel, read
/// back by pyiceberg's `RestCatalog`, and `caudal iceberg snapshots` through the same URL.
#[test]
fn a_bounded_run_through_the_rest_catalog_is_read_back_by_pyiceberg_exactly() {
    let Some(lake) = Lake::rest() else { return };
    clean_run(lake);
}

/// Kills the job at `point` of checkpoint 2, restores it until it finishes, and checks the
/// lake (and the file sink) against the oracle.
fn crash_at(point: &str, restore_crash: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    let Some(lake) = Lake::local(dir.path()) else { return };
    crash_in(&lake, point, restore_crash);
}

/// [`crash_at`] into `lake`.
fn crash_in(lake: &Lake, point: &str, restore_crash: Option<&str>) {
    let d = dirs();
    let args = lake.args(base_args(&d.out, &d.ckpt, 2));
    let with = |crash: String| {
        let mut env = lake.env.clone();
        env.push(("CAUDAL__TEST_CRASH_AT", crash));
        env
    };
    let (status, err) = wait(spawn(&args, false, &with(format!("{point}:2"))));
    assert_eq!(status.signal(), Some(9), "the crash point {point} was not reached: {status} {err}");
    assert!(err.contains(&format!("crash point {point}")), "{err}");
    let mut runs = format!("-- the run killed at {point}:\n{err}");
    if let Some(again) = restore_crash {
        let restored = latest_checkpoint(&d.ckpt).unwrap();
        let (status, err) = wait(spawn(&args, true, &with(format!("{again}:{restored}"))));
        assert_eq!(status.signal(), Some(9), "the crash point {again} was not reached: {status} {err}");
        runs += &format!("-- the restore killed at {again}:\n{err}");
    }
    runs += &format!("-- the restore that finished:\n{}", finish_with(&args, &lake.env));
    assert_lake_equals_model(lake, point, &runs);
    assert_equals_expected(&d, point);
}

/// Checkpoint 2 complete, its Iceberg epoch not committed, when the job dies; the restore
/// runs at another parallelism (#43: none did with sink output pending). The committer is
/// one subtask whatever the writers' parallelism: it commits the recorded epoch once.
#[test]
fn killed_after_the_checkpoint_completed_and_restored_at_another_parallelism_the_lake_is_exact() {
    for to in [3, 1] {
        let dir = tempfile::tempdir().unwrap();
        let Some(lake) = Lake::local(dir.path()) else { return };
        let d = dirs();
        let mut env = lake.env.clone();
        env.push(("CAUDAL__TEST_CRASH_AT", "after-metadata-before-notify:2".into()));
        let (status, err) = wait(spawn(&lake.args(base_args(&d.out, &d.ckpt, 2)), false, &env));
        assert_eq!(status.signal(), Some(9), "the crash point was not reached: {status} {err}");
        let runs = format!(
            "-- the run killed with checkpoint 2 pending:\n{err}-- the restore at parallelism {to}:\n{}",
            finish_with(&lake.args(base_args(&d.out, &d.ckpt, to)), &lake.env)
        );
        let what = format!("restored at parallelism {to} with checkpoint 2 pending");
        assert_lake_equals_model(&lake, &what, &runs);
        assert_equals_expected(&d, &what);
    }
}

#[test]
fn killed_after_the_barrier_the_lake_is_exact() {
    crash_at("after-sink-pre-commit", None);
}

#[test]
fn killed_after_the_checkpoint_completed_before_the_commit_the_lake_is_exact() {
    crash_at("after-metadata-before-notify", None);
}

#[test]
fn killed_during_the_commit_before_the_catalog_update_the_lake_is_exact() {
    crash_at("iceberg-before-catalog-update", None);
}

#[test]
fn killed_during_the_commit_after_the_catalog_update_the_lake_is_exact() {
    crash_at("iceberg-after-catalog-update", None);
}

/// Through the REST catalog: killed after the server took the commit of checkpoint 2 and
/// before the committer heard the answer — the restore reads the table, finds checkpoint 2
/// there and does not commit it again.
#[test]
fn killed_after_the_rest_catalog_took_the_commit_the_lake_is_exact() {
    let Some(lake) = Lake::rest() else { return };
    crash_in(&lake, "iceberg-after-catalog-update", None);
}

/// Through the REST catalog: killed before the commit of checkpoint 2 was sent (its manifests
/// written) — the restore commits it, once.
#[test]
fn killed_before_the_rest_catalog_update_the_lake_is_exact() {
    let Some(lake) = Lake::rest() else { return };
    crash_in(&lake, "iceberg-before-catalog-update", None);
}

/// Killed after the committer looked at the table for checkpoint 2 (not there) and before
/// it sent the commit: the restore commits it, once.
#[test]
fn killed_after_the_committers_look_before_its_commit_the_lake_is_exact() {
    crash_at("iceberg-after-table-check", None);
}

/// Through the REST catalog: the process dies while the windows table's first commit (of
/// checkpoint `n`) is on its way, and that commit lands only after the restored committer
/// looked at the table and did not find `n` there — between its look and its commit (a link
/// in front of the catalog holds the request back and releases it while the restored
/// committer is held at the after-table-check point). Iceberg's transaction reads the table
/// once more before it commits; the committer commits only on top of the table it looked
/// at, so it meets a conflict, looks again, finds `n` and does not append `n`'s files a
/// second time.
#[test]
fn a_commit_that_lands_between_the_restored_committers_look_and_its_commit_is_not_made_again() {
    let Some(mut lake) = Lake::rest() else { return };
    let link =
        common::faulty_link::FaultyLink::to(lake.catalog.trim_start_matches("http://").trim_end_matches('/'));
    lake.catalog = link.url();
    link.hold_request(&format!("POST /v1/namespaces/{}/tables/windows ", lake.namespace));
    let d = dirs();
    let args = lake.args(base_args(&d.out, &d.ckpt, 2));
    let mut child = spawn(&args, false, &lake.env);
    let checkpoint = until("a commit of the windows table is held", || {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before a windows commit was held");
        link.held().and_then(|request| checkpoint_in(&request))
    });
    // The readings' commit of the same checkpoint is not held: let it land first, so that
    // only the windows committer finds its checkpoint missing after the restore.
    until("the readings table has the held checkpoint", || {
        let readings = lake.try_read("readings").ok()?;
        let ids: Vec<&str> = readings["snapshots"]
            .as_array()?
            .iter()
            .filter_map(|s| s["summary"]["caudal.checkpoint-id"].as_str())
            .collect();
        ids.contains(&checkpoint.to_string().as_str()).then_some(())
    });
    child.kill().unwrap();
    let mut runs =
        format!("-- killed with checkpoint {checkpoint}'s windows commit held:\n{}", wait(child).1);

    // Held 8 s: the released commit must land within the hold (it takes well under a second),
    // or the restored commit would go first and the race would not happen.
    let mut env = lake.env.clone();
    env.push(("CAUDAL__TEST_PAUSE_AT", format!("iceberg-after-table-check:{checkpoint}:8000")));
    let restored = Watched::spawn(&args, true, &env);
    until("the restored windows committer looked at the table", || {
        restored.stderr().contains("pause point iceberg-after-table-check").then_some(())
    });
    link.release_held();
    until("the held commit landed", || link.held_answered().then_some(()));
    let (status, err) = restored.wait();
    runs += &format!("-- the restore:\n{err}");
    assert!(status.success(), "the restored run failed ({status}):\n{runs}");
    let found = format!(
        "({}.windows): checkpoint {checkpoint} was committed before (found in the table): not again",
        lake.namespace
    );
    assert!(err.contains(&found), "the windows committer did not find its checkpoint: {runs}");
    assert_lake_equals_model(&lake, "a commit landing between the look and the commit", &runs);
    assert_equals_expected(&d, "a commit landing between the look and the commit");
}

/// The checkpoint id an Iceberg commit request carries in its snapshot summary.
fn checkpoint_in(request: &str) -> Option<u64> {
    let rest = request.split("\"caudal.checkpoint-id\":\"").nth(1)?;
    rest.split('"').next()?.parse().ok()
}

/// Polls `ready` every 20 ms until it answers, for at most 60 s.
fn until<T>(what: &str, mut ready: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(t) = ready() {
            return t;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "not within 60 s: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A job whose stderr the test reads while it runs.
struct Watched {
    child: std::process::Child,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    reader: std::thread::JoinHandle<()>,
}

impl Watched {
    fn spawn(args: &[String], restore: bool, env: &[(&str, String)]) -> Watched {
        use std::io::Read;
        let mut child = spawn(args, restore, env);
        let mut pipe = child.stderr.take().unwrap();
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let collected = stderr.clone();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = pipe.read(&mut buf) {
                collected.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Watched { child, stderr, reader }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn wait(mut self) -> (std::process::ExitStatus, String) {
        let status = self.child.wait().unwrap();
        self.reader.join().unwrap();
        let err = self.stderr.lock().unwrap().clone();
        (status, err)
    }
}

/// Through the REST catalog, the answer to the commit of the readings' first checkpoint is
/// lost on the way back (the server applied it; the connection closes as its answer starts):
/// the committer does not send it again blindly — it reads the table, finds the checkpoint
/// there, and goes on. The lake is exact, one snapshot per checkpoint.
#[test]
fn a_rest_commit_whose_answer_is_lost_is_found_in_the_table_not_sent_again() {
    let Some(mut lake) = Lake::rest() else { return };
    let link =
        common::faulty_link::FaultyLink::to(lake.catalog.trim_start_matches("http://").trim_end_matches('/'));
    lake.catalog = link.url();
    link.lose_answers(&format!("POST /v1/namespaces/{}/tables/readings ", lake.namespace), 1);
    let d = dirs();
    let args = lake.args(base_args(&d.out, &d.ckpt, 2));
    let (status, err) = wait(spawn(&args, false, &lake.env));
    assert!(status.success(), "the run failed: {err}");
    assert_eq!(link.answers_lost(), 1, "no commit answer was lost: {err}");
    assert!(err.contains("was committed before (found in the table): not again"), "{err}");
    assert_lake_equals_model(&lake, "a lost commit answer", &err);
    assert_equals_expected(&d, "a lost commit answer");
}

#[test]
fn killed_during_the_restore_the_lake_is_exact() {
    crash_at("after-metadata-before-notify", Some("during-restore"));
}

#[test]
fn killed_at_ten_random_moments_the_lake_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let Some(lake) = Lake::local(dir.path()) else { return };
    let d = dirs();
    let args = lake.args(base_args(&d.out, &d.ckpt, 2));
    let mut seed: u64 = 0x1ceb;
    let mut kills = 0;
    let mut runs = String::new();
    while kills < 10 {
        let mut child = spawn(&args, has_completed_checkpoint(&d.ckpt), &[]);
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let delay = Duration::from_millis(300 + (seed >> 33) % 900);
        let start = Instant::now();
        while start.elapsed() < delay && child.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(10));
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        child.kill().unwrap();
        runs += &format!("-- killed after {delay:?}:\n{}", wait(child).1);
        kills += 1;
    }
    assert!(kills >= 5, "the job finished too early to be killed ({kills} kills)");
    runs += &format!("-- the restore that finished:\n{}", finish_with(&args, &[]));
    assert_lake_equals_model(&lake, &format!("after {kills} kills"), &runs);
    assert_equals_expected(&d, &format!("after {kills} kills"));
}

/// Trino from the test stack (`scripts/services.sh start trino`: its Iceberg connector on the
/// same JDBC catalog and S3), stopped again when dropped.
struct Trino {
    url: String,
}

impl Trino {
    fn start() -> Option<Trino> {
        caudal_test_stack::services(["CAUDAL_POSTGRES_URL", "CAUDAL_S3_ENDPOINT"])?;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/services.sh");
        let o = Command::new(&script).args(["start", "trino"]).output().unwrap();
        assert!(
            o.status.success(),
            "services.sh start trino: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        let port = std::env::var("CAUDAL_TRINO_PORT").unwrap_or_else(|_| "18090".into());
        Some(Trino { url: format!("http://127.0.0.1:{port}") })
    }

    /// The rows of `sql` through Trino's client protocol (POST, then follow `nextUri`).
    fn query(&self, sql: &str) -> Vec<Vec<Value>> {
        let agent: ureq::Agent = ureq::Agent::config_builder().proxy(None).build().into();
        let mut answer: Value = agent
            .post(&format!("{}/v1/statement", self.url))
            .header("X-Trino-User", "caudal")
            .send(sql)
            .unwrap()
            .body_mut()
            .read_json()
            .unwrap();
        let mut rows = Vec::new();
        loop {
            if let Some(e) = answer.get("error") {
                panic!("trino: {sql}: {}", e["message"]);
            }
            if let Some(data) = answer["data"].as_array() {
                rows.extend(data.iter().map(|r| r.as_array().unwrap().clone()));
            }
            let Some(next) = answer["nextUri"].as_str().map(str::to_string) else { break };
            answer = agent.get(&next).call().unwrap().body_mut().read_json().unwrap();
        }
        rows
    }
}

impl Drop for Trino {
    fn drop(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/services.sh");
        let _ = Command::new(script).args(["stop", "trino"]).output();
    }
}

/// A double Trino gave as text (`1.48E1`), parsed exactly (serde_json's number parsing may
/// be one unit in the last place off).
fn exact(v: &Value) -> f64 {
    v.as_str().unwrap_or_else(|| panic!("not a double's text: {v}")).parse().unwrap()
}

/// The reference platform's query engine reads the lake: a run into an S3 warehouse killed
/// once in the commit window (after the catalog update, before the committer learned of
/// it), then Trino's count and per-sensor aggregates equal what the input implies, and
/// every snapshot time-travelled to through Trino holds the rows pyiceberg counts in it.
#[test]
fn trino_reads_the_lake_exactly_after_a_kill_in_the_commit_window() {
    let Some(lake) = Lake::s3() else { return };
    let Some(trino) = Trino::start() else { return };
    let d = dirs();
    let args = lake.args(base_args(&d.out, &d.ckpt, 2));
    let point = "iceberg-after-catalog-update";
    let mut env = lake.env.clone();
    env.push(("CAUDAL__TEST_CRASH_AT", format!("{point}:2")));
    let (status, err) = wait(spawn(&args, false, &env));
    assert_eq!(status.signal(), Some(9), "the crash point {point} was not reached: {status} {err}");
    let runs =
        format!("-- the run killed at {point}:\n{err}-- the restore:\n{}", finish_with(&args, &lake.env));
    assert_lake_equals_model(&lake, "S3, killed in the commit window", &runs);

    let (windows, readings) = oracle::expected_records(&BASE_MODEL);
    let table = format!("lake.{}.readings", lake.namespace);
    let total = trino.query(&format!("SELECT count(*) FROM {table}"));
    assert_eq!(total, vec![vec![Value::from(readings.len())]], "trino: count(*)");
    let mut want: BTreeMap<i64, (u64, f64, f64)> = BTreeMap::new();
    for r in &readings {
        let e = want.entry(r.sensor_id).or_insert((0, f64::MAX, f64::MIN));
        *e = (e.0 + 1, e.1.min(r.temp_c), e.2.max(r.temp_c));
    }
    let got: BTreeMap<i64, (u64, f64, f64)> = trino
        .query(&format!(
            "SELECT sensor_id, count(*), CAST(min(temp_c) AS varchar), CAST(max(temp_c) AS varchar) \
             FROM {table} GROUP BY sensor_id"
        ))
        .into_iter()
        .map(|r| (r[0].as_i64().unwrap(), (r[1].as_u64().unwrap(), exact(&r[2]), exact(&r[3]))))
        .collect();
    assert_eq!(got, want, "trino: per-sensor count, min and max");
    let w = trino.query(&format!("SELECT count(*), sum(\"count\") FROM lake.{}.windows", lake.namespace));
    let want_w = (windows.len() as u64, windows.iter().map(|w| w.count as u64).sum::<u64>());
    assert_eq!((w[0][0].as_u64().unwrap(), w[0][1].as_u64().unwrap()), want_w, "trino: windows");
    for s in lake.read("readings")["snapshots"].as_array().unwrap() {
        let at = trino.query(&format!("SELECT count(*) FROM {table} FOR VERSION AS OF {}", s["id"]));
        assert_eq!(
            at[0][0], s["rows"],
            "trino: the snapshot of checkpoint {}",
            s["summary"]["caudal.checkpoint-id"]
        );
    }
}

/// The S3 server behind a link the test cuts for 3 s mid-run (`common::faulty_link`; the
/// server keeps its objects): the writers' uploads and the committer's metadata wait in the
/// S3 client's retries with backoff — the job stalls (backpressure) rather than failing or
/// dropping an epoch — and when the link is back the run ends with the lake exact.
#[test]
fn an_s3_outage_stalls_the_lake_and_the_run_ends_exact() {
    let Some(mut lake) = Lake::s3() else { return };
    let endpoint = lake.s3.clone().unwrap();
    let link =
        common::faulty_link::FaultyLink::to(endpoint.trim_start_matches("http://").trim_end_matches('/'));
    for (k, v) in &mut lake.env {
        if *k == "CAUDAL__S3__ENDPOINT" {
            *v = link.url();
        }
    }
    let d = dirs();
    let mut args = lake.args(base_args(&d.out, &d.ckpt, 2));
    let i = args.iter().position(|x| x == "--rate").unwrap();
    args[i + 1] = "25".into(); // a ~12 s run
    let child = spawn(&args, false, &lake.env);
    let start = Instant::now();
    while lake.try_read("readings").map_or(true, |a| a["snapshots"].as_array().is_none_or(|s| s.len() < 2)) {
        assert!(start.elapsed() < Duration::from_secs(60), "no two snapshots within 60 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    link.cut();
    std::thread::sleep(Duration::from_secs(3));
    link.restore();
    let (status, err) = wait(child);
    assert!(status.success(), "the job did not ride out a 3 s S3 outage: {err}");
    assert!(err.contains("backing off"), "no request met the outage (no retry logged): {err}");
    assert_lake_equals_model(&lake, "a 3 s S3 outage", &err);
    assert_equals_expected(&d, "a 3 s S3 outage");
}

/// Iceberg in a cluster (#43): tables through the REST catalog on S3, the job at parallelism
/// 2 over two task managers, one of them killed after the first checkpoint and replaced.
/// The restarted attempt's committer commits what the dead one left, its writers' files
/// are cleaned by run, and the lake equals the model, one snapshot per checkpoint.
#[test]
fn in_a_cluster_with_a_task_manager_killed_the_lake_is_exact() {
    use cluster_support::Cluster;
    let Some(lake) = Lake::rest() else { return };
    let d = dirs();
    let mut args = lake.args(base_args(&d.out, &d.ckpt, 2));
    // The job manager decides where checkpoints go; each executor where its state goes.
    for flag in ["--checkpoint-dir", "--state-dir"] {
        let at = args.iter().position(|a| a == flag).unwrap();
        args.drain(at..at + 2);
    }
    // ~12 s: room for a kill after the first checkpoint.
    let rate = args.iter().position(|a| a == "--rate").unwrap() + 1;
    args[rate] = "25".into();
    let mut c = Cluster::start_with(&[], None, &lake.env);
    for tm in ["tm-1", "tm-2"] {
        c.start_taskmanager(tm, 2);
    }
    c.wait_for_task_managers(2);
    let o = c.submit(2, &args);
    assert!(o.status.success(), "submit failed: {}{}", String::from_utf8_lossy(&o.stderr), c.logs());
    c.kill_a_task_manager_of("temperature", "tm-3", 2, 120);
    assert_lake_equals_model(&lake, "a task manager killed", &c.logs());
}

/// A local warehouse that the hosts of a cluster do not share (#43) fails the job at start,
/// naming it, with no restart: the second task manager sees a private, empty directory
/// there (a tmpfs over it in a mount namespace of its own), as a host with a disk of its own
/// would. Without the check, its writer could not read the table's metadata the other wrote
/// and the job restarted until its cap, naming a missing file.
#[test]
fn a_local_warehouse_the_hosts_do_not_share_fails_the_job_naming_it() {
    use cluster_support::{status, Cluster};
    let d = dirs();
    let warehouse = d.tmp.path().join("warehouse");
    let Some(lake) = Lake::local(&warehouse) else { return };
    let mut args = lake.args(base_args(&d.out, &d.ckpt, 2));
    for flag in ["--checkpoint-dir", "--state-dir"] {
        let at = args.iter().position(|a| a == flag).unwrap();
        args.drain(at..at + 2);
    }
    let mut c = Cluster::start_with(&[], None, &lake.env);
    c.start_taskmanager("tm-1", 1);
    c.start_taskmanager_with_a_private("tm-2", 1, &warehouse);
    c.wait_for_task_managers(2);
    let o = c.submit(2, &args);
    assert!(o.status.success(), "submit failed: {}{}", String::from_utf8_lossy(&o.stderr), c.logs());
    let failed = c.wait_job("temperature", 90, "FAILED", |j| status(j) == "FAILED");
    let detail = failed["detail"].as_str().unwrap();
    assert!(
        detail.contains(&warehouse.display().to_string()) && detail.contains("is not shared by the hosts"),
        "{failed:#}"
    );
    assert_eq!(failed["restarts"].as_u64(), Some(0), "{failed:#}");
}

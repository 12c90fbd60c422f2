//! Savepoints (on stop, from the CLI and through the REST API of a running job), the S3 checkpoint storage (a kill and a restore
//! through a real S3 server), and bad checkpoint files (truncated SST, bad metadata, wrong
//! job): errors name the file and the checkpoint.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::time::{Duration, Instant};

fn sigterm(child: &std::process::Child) {
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
}

fn savepoint_cli(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_temperature")).arg("savepoint").args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// Stop with a savepoint at parallelism 2, delete every checkpoint, restore the savepoint at
/// parallelism 3: the output equals the clean run's.
#[test]
fn stop_with_savepoint_then_restore_it_after_the_checkpoints_are_gone() {
    let d = dirs();
    let mut args = base_args(&d.out, &d.ckpt, 2);
    args.extend(["--stop-with-savepoint".into(), "before-upgrade".into()]);
    let child = spawn(&args, false, &[]);
    std::thread::sleep(Duration::from_millis(1500));
    sigterm(&child);
    let (status, err) = wait(child);
    assert!(status.success(), "{err}");
    assert!(err.contains("--restore savepoints/before-upgrade"), "{err}");
    let job = d.ckpt.join("temperature");
    assert!(job.join("savepoints/before-upgrade/_metadata").exists());
    // Kept until deleted: retention and the loss of every checkpoint do not touch it.
    for e in std::fs::read_dir(&job).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("chk-") || e.file_name() == "shared" {
            std::fs::remove_dir_all(e.path()).unwrap();
        }
    }
    let (status, err) =
        wait(spawn_with(&base_args(&d.out, &d.ckpt, 3), Some("savepoints/before-upgrade"), &[]));
    assert!(status.success(), "{err}");
    assert_equals_expected(&d, "restored from a savepoint");
    // The restored job's own checkpoints do not reference the savepoint's files.
    let referenced = referenced_objects(&job);
    assert!(referenced.iter().all(|o| !o.contains("savepoints/")), "{referenced:?}");
    // list and delete
    let dir = d.ckpt.display().to_string();
    let (ok, out, err) = savepoint_cli(&["--checkpoint-dir", &dir, "--list"]);
    assert!(ok && out.contains("savepoints/before-upgrade"), "{out} {err}");
    let (ok, _, err) = savepoint_cli(&["--checkpoint-dir", &dir, "--delete", "before-upgrade"]);
    assert!(ok, "{err}");
    let left = files_under(&d.ckpt, &job.join("savepoints/before-upgrade"));
    assert!(left.is_empty(), "{left:?}");
    let (ok, _, err) = savepoint_cli(&["--checkpoint-dir", &dir, "--delete", "before-upgrade"]);
    assert!(!ok && err.contains("no savepoint `before-upgrade`"), "{err}");
}

/// `temperature savepoint` copies the latest completed checkpoint of a killed job; the job
/// restores from it.
#[test]
fn savepoint_cli_copies_the_latest_checkpoint_and_the_job_restores_from_it() {
    let d = dirs();
    let mut child = spawn(&base_args(&d.out, &d.ckpt, 2), false, &[]);
    let start = Instant::now();
    while latest_checkpoint(&d.ckpt).is_none_or(|n| n < 2) && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    wait(child);
    let dir = d.ckpt.display().to_string();
    let (ok, out, err) = savepoint_cli(&["--checkpoint-dir", &dir, "--name", "sp1"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "savepoints/sp1");
    let (ok, _, err) = savepoint_cli(&["--checkpoint-dir", &dir, "--name", "sp1"]);
    assert!(!ok && err.contains("already exists"), "{err}");
    let (status, err) = wait(spawn_with(&base_args(&d.out, &d.ckpt, 2), Some("savepoints/sp1"), &[]));
    assert!(status.success(), "{err}");
    assert_equals_expected(&d, "restored from a CLI savepoint");
}

/// The job with its REST API on a free port and checkpoints every minute (so that only what
/// the test asks for is taken before the end).
fn spawn_with_api(d: &Dirs) -> (std::process::Child, u16) {
    let port = caudal_test_stack::free_port();
    let mut args: Vec<String> = base_args(&d.out, &d.ckpt, 2)
        .into_iter()
        .map(|a| if a == "0.3" { "60".into() } else { a }) // --checkpoint-interval
        .filter(|a| a != "--no-ui")
        .collect();
    args.extend(["--ui-bind".into(), format!("127.0.0.1:{port}")]);
    (spawn(&args, false, &[]), port)
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).proxy(None).build().into()
}

/// `POST /api/v1/jobs/temperature/stop` with a savepoint, early in the run: the job takes a
/// final checkpoint, keeps it as the savepoint and ends; restored from it, it completes to
/// the clean output.
#[test]
fn a_stop_with_a_savepoint_through_the_api_resumes_to_the_clean_output() {
    let d = dirs();
    let (child, port) = spawn_with_api(&d);
    let url = format!("http://127.0.0.1:{port}/api/v1/jobs/temperature/stop");
    let start = Instant::now();
    let (status, body) = loop {
        match agent().post(&url).content_type("application/json").send(r#"{"savepoint": "at-stop"}"#) {
            Ok(mut r) => break (r.status().as_u16(), r.body_mut().read_to_string().unwrap()),
            Err(_) if start.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => panic!("the job's API did not come up: {e}"),
        }
    };
    assert_eq!(status, 202, "{body}");
    let (status, err) = wait(child);
    assert!(status.success(), "{err}");
    assert!(err.contains("savepoints/at-stop"), "{err}");
    assert!(d.ckpt.join("temperature/savepoints/at-stop/_metadata").exists());
    let partial = published(&d.out, "readings").len();
    assert!(partial < expected().1.len(), "the stop came after the end of the input");
    let (status, err) = wait(spawn_with(&base_args(&d.out, &d.ckpt, 1), Some("savepoints/at-stop"), &[]));
    assert!(status.success(), "{err}");
    assert_equals_expected(&d, "stopped with a savepoint through the API, then restored from it");
}

/// `POST /api/v1/jobs/temperature/savepoints` on a running job: a checkpoint is taken at once
/// (the interval is a minute) and copied to `savepoints/<name>`; the job is then killed, and
/// restoring the savepoint at another parallelism publishes exactly the clean output.
#[test]
fn a_savepoint_asked_for_through_the_api_restores_to_the_clean_output() {
    let d = dirs();
    let (mut child, port) = spawn_with_api(&d);
    let agent = agent();
    let url = format!("http://127.0.0.1:{port}/api/v1/jobs/temperature/savepoints");
    let post = |body: &str| {
        let mut r = agent.post(&url).content_type("application/json").send(body).unwrap();
        let status = r.status().as_u16();
        let body: serde_json::Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
        (status, body)
    };
    let start = Instant::now();
    let (status, body) = loop {
        match agent.post(&url).content_type("application/json").send(r#"{"name": "mid-run"}"#) {
            Ok(mut r) => {
                let status = r.status().as_u16();
                break (status, r.body_mut().read_to_string().unwrap());
            }
            Err(_) if start.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => panic!("the job's API did not come up: {e}"),
        }
    };
    assert_eq!(status, 202, "{body}");
    let (status, body) = post(r#"{"name": "mid-run"}"#);
    assert_eq!(status, 409, "a second request of the same name: {body}");
    let (status, body) = post(r#"{"name": "../escape"}"#);
    assert!(status == 400 && body["error"].as_str().unwrap().contains("`name`"), "{body}");
    let (status, body) = post(r#"{"nmae": "typo"}"#);
    assert!(status == 400 && body["error"].as_str().unwrap().contains("`body`"), "{body}");
    let savepoint = loop {
        let mut r = agent.get(&url).call().unwrap();
        let list: serde_json::Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
        let sp = list["savepoints"][0].clone();
        assert_eq!(sp["name"], "mid-run", "{list}");
        match sp["status"].as_str().unwrap() {
            "COMPLETED" => break sp,
            "PENDING" | "IN_PROGRESS" => {}
            other => panic!("savepoint {other}: {list}"),
        }
        assert!(start.elapsed() < Duration::from_secs(20), "the savepoint did not complete: {list}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(savepoint["path"], "savepoints/mid-run");
    // Its checkpoint in the history: per task subtask, the operators and what the snapshot
    // cost; and the job's checkpoint settings.
    let checkpoints: serde_json::Value = {
        let url = format!("http://127.0.0.1:{port}/api/v1/jobs/temperature/checkpoints");
        serde_json::from_str(&agent.get(&url).call().unwrap().body_mut().read_to_string().unwrap()).unwrap()
    };
    let config = &checkpoints["config"];
    assert_eq!(config["interval_ms"], 60_000, "{checkpoints:#}");
    assert_eq!(config["retained"], 3);
    assert!(config["storage"].as_str().unwrap().starts_with("file://"), "{config}");
    let taken = checkpoints["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == savepoint["checkpoint"])
        .unwrap_or_else(|| panic!("no checkpoint {} in {checkpoints:#}", savepoint["checkpoint"]));
    assert_eq!(taken["status"], "COMPLETED");
    let tasks = taken["tasks"].as_array().unwrap();
    let windows: Vec<_> = tasks
        .iter()
        .filter(|t| t["operators"].as_array().unwrap().iter().any(|o| o.as_str().unwrap().contains("window")))
        .collect();
    assert_eq!(windows.len(), 2, "both window subtasks acknowledged: {taken:#}");
    assert!(
        windows.iter().all(|t| t["state_bytes"].as_u64() > Some(0) && t["alignment_us"].is_u64()),
        "{taken:#}"
    );
    assert!(
        taken["alignment_us"].as_u64() >= windows.iter().map(|t| t["alignment_us"].as_u64()).max().unwrap()
    );
    assert!(d.ckpt.join("temperature/savepoints/mid-run/_metadata").exists());
    assert!(child.try_wait().unwrap().is_none(), "the job ended before the savepoint was taken");
    child.kill().unwrap();
    wait(child);
    let (status, err) = wait(spawn_with(&base_args(&d.out, &d.ckpt, 3), Some("savepoints/mid-run"), &[]));
    assert!(status.success(), "{err}");
    assert_equals_expected(&d, "restored from a savepoint taken through the API");
}

/// The temperature job checkpoints into S3, is killed, restores from S3 and finishes with
/// the clean run's output; retention keeps S3 free of unreferenced files.
#[test]
fn temperature_on_s3_checkpoint_storage_survives_a_kill() {
    use caudal_checkpoints::metadata::completed_checkpoints;
    use caudal_checkpoints::{CheckpointPaths, CheckpointStore};
    let Some(env) = s3::env() else { return };
    let url = s3::unique_url("temperature");
    let store = s3::store(&url, &env);
    let paths = CheckpointPaths::under("temperature");
    let d = dirs();
    let args = |p: u32| {
        let mut a = base_args(&d.out, &d.ckpt, p);
        let i = a.iter().position(|x| x == "--checkpoint-dir").unwrap();
        a[i + 1] = url.clone();
        a
    };
    let mut child = spawn(&args(2), false, &env);
    let start = Instant::now();
    while completed_checkpoints(&store, &paths).unwrap().len() < 2
        && start.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(child.try_wait().unwrap().is_none(), "the job ended before the kill");
    child.kill().unwrap();
    let (status, _) = wait(child);
    assert_eq!(status.signal(), Some(9));
    assert!(!d.ckpt.exists(), "nothing was written to the local checkpoint dir");
    let (status, err) = wait(spawn(&args(2), true, &env));
    assert!(status.success() && err.contains("restoring job `temperature`"), "the restore failed: {err}");
    assert_equals_expected(&d, "kill and restore through S3");
    let referenced: Vec<String> = completed_checkpoints(&store, &paths)
        .unwrap()
        .iter()
        .flat_map(|id| {
            caudal_checkpoints::read_metadata(&store, &paths, *id, "temperature")
                .unwrap()
                .referenced_objects()
        })
        .collect();
    let shared = store.list(&paths.shared_dir()).unwrap();
    for f in &shared {
        assert!(referenced.contains(&f.path), "`{}` is referenced by no retained checkpoint", f.path);
    }
    caudal_checkpoints::store::delete_dir(&store, "").unwrap();
}

/// Runs the job until two checkpoints completed, then kills it.
fn two_checkpoints_then_kill(d: &Dirs) -> u64 {
    let mut child = spawn(&base_args(&d.out, &d.ckpt, 1), false, &[]);
    let start = Instant::now();
    while latest_checkpoint(&d.ckpt).is_none_or(|n| n < 2) && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    wait(child);
    latest_checkpoint(&d.ckpt).expect("checkpoints completed")
}

#[test]
fn a_truncated_sst_names_the_file_and_the_checkpoint() {
    let d = dirs();
    let latest = two_checkpoints_then_kill(&d);
    let job = d.ckpt.join("temperature");
    let meta = std::fs::read_to_string(job.join(format!("chk-{latest}/_metadata"))).unwrap();
    let mut objects = Vec::new();
    let json: serde_json::Value = serde_json::from_str(&meta).unwrap();
    fn ssts(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::String(s) if s.ends_with(".sst") && s.contains("/shared/") => {
                out.push(s.clone())
            }
            serde_json::Value::Object(m) => m.values().for_each(|v| ssts(v, out)),
            serde_json::Value::Array(a) => a.iter().for_each(|v| ssts(v, out)),
            _ => {}
        }
    }
    ssts(&json, &mut objects);
    let sst = objects.first().expect("the latest checkpoint references an SST file").clone();
    let file = d.ckpt.join(&sst);
    let data = std::fs::read(&file).unwrap();
    std::fs::write(&file, &data[..data.len() / 2]).unwrap();
    let (status, err) = wait(spawn(&base_args(&d.out, &d.ckpt, 1), true, &[]));
    assert!(!status.success(), "a truncated SST must not be restored");
    assert!(err.contains(&format!("chk-{latest}")), "{err}");
    assert!(err.contains(sst.trim_start_matches("temperature/")), "{err}");
    assert!(err.contains("truncated"), "{err}");
}

#[test]
fn a_corrupted_sst_of_the_right_size_names_the_file_and_the_checkpoint() {
    let d = dirs();
    let latest = two_checkpoints_then_kill(&d);
    let job = d.ckpt.join("temperature");
    let referenced = referenced_objects(&job);
    let meta = std::fs::read_to_string(job.join(format!("chk-{latest}/_metadata"))).unwrap();
    let sst = referenced
        .iter()
        .find(|o| o.ends_with(".sst") && meta.contains(o.as_str()))
        .expect("the latest checkpoint references an SST file");
    let file = d.ckpt.join(sst);
    let mut data = std::fs::read(&file).unwrap();
    let mid = data.len() / 2;
    data[mid] ^= 0xff;
    std::fs::write(&file, &data).unwrap();
    let (status, err) = wait(spawn(&base_args(&d.out, &d.ckpt, 1), true, &[]));
    assert!(!status.success(), "a corrupt SST must not be restored");
    assert!(err.contains(&format!("chk-{latest}")) && err.contains(sst.as_str()), "{err}");
    assert!(err.contains("sha256"), "{err}");
}

#[test]
fn a_checkpoint_of_another_job_is_refused_naming_the_file() {
    let d = dirs();
    let latest = two_checkpoints_then_kill(&d);
    let meta = d.ckpt.join(format!("temperature/chk-{latest}/_metadata"));
    let text = std::fs::read_to_string(&meta).unwrap();
    std::fs::write(&meta, text.replace(r#""job_name": "temperature""#, r#""job_name": "user-interactions""#))
        .unwrap();
    let (status, err) = wait(spawn(&base_args(&d.out, &d.ckpt, 1), true, &[]));
    assert!(!status.success());
    assert!(err.contains(&format!("chk-{latest}/_metadata")) && err.contains("user-interactions"), "{err}");
}

//! The cluster secret (#11): a job manager, task managers and executors that share
//! `--secret-file` run a job whose shuffle crosses processes, every control and data
//! connection authenticated; a task manager with another secret (or none) is refused while
//! the job runs on and finishes with exactly the output its input implies; a job manager
//! listening off loopback answers 401 to a request without the secret as bearer token (or the
//! web UI's session cookie, which signing in with the secret sets), so an unauthenticated
//! submit runs nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cluster_support;
#[allow(dead_code)] // the alert half of the model is not used here
#[path = "../../jobs/tests/common/oracle.rs"]
mod oracle;

use cluster_support::*;
use std::path::Path;
use std::process::{Command, Stdio};

fn secret_file(dir: &Path, name: &str, secret: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, secret).unwrap();
    let mut perms = std::fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o600);
    std::fs::set_permissions(&path, perms).unwrap();
    path.display().to_string()
}

/// A bounded run of ~6 s (the generator throttled) with the file sink.
fn job_args(out: &Path) -> Vec<String> {
    throttled_args(&oracle::RUN_ARGS, 50, out)
}

#[test]
fn with_a_cluster_secret_the_job_runs_and_a_task_manager_without_it_is_refused() {
    let keys = tempfile::tempdir().unwrap();
    let secret = secret_file(keys.path(), "secret", "5f0c3b9e1d2a4c6b8e7f9a0b1c2d3e4f\n");
    let wrong = secret_file(keys.path(), "wrong", "00000000000000000000000000000000\n");
    let mut c = Cluster::start_with(&[], None, &[("CAUDAL_CLUSTER_SECRET_FILE", secret)]);
    // One slot each: a job at parallelism 2 spans both, its key_by shuffle crosses processes.
    c.start_taskmanager("tm-1", 1);
    c.start_taskmanager("tm-2", 1);
    c.wait_for_task_managers(2);
    let out = c.dir.path().join("out");
    let o = c.submit(2, &job_args(&out));
    assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());
    assert!(stderr(&o).contains("uploading temperature: 100%"), "upload progress: {}", stderr(&o));
    let running = c.wait_job("temperature", 30, "running with a checkpoint", |j| {
        status(j) == "RUNNING" && j["last_checkpoint"].as_u64().is_some()
    });
    assert_eq!(running["task_managers"].as_array().unwrap().len(), 2, "{running:#}");

    // Intruders: another secret, and none at all.
    c.start_taskmanager_with_env("intruder", 4, &[("CAUDAL_CLUSTER_SECRET_FILE", wrong.as_str())]);
    c.start_taskmanager_with_env("anonymous", 4, &[("CAUDAL_CLUSTER_SECRET_FILE", "")]);
    assert_refused(&c, &["intruder", "anonymous"]);
    assert!(c.logs().contains("refused this process's cluster secret"), "the intruder says why:{}", c.logs());

    assert_finished_exactly(&c, &out, &oracle::expected(&oracle::Model::RUN));
}

#[test]
fn off_loopback_the_rest_api_needs_the_secret_and_an_unauthenticated_submit_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(dir.path(), "secret", "a-cluster-secret-of-enough-length\n");
    let (http, rpc) = (free_port(), free_port());
    let mut jm = Command::new(caudal())
        .args(["jobmanager", "--bind", &format!("0.0.0.0:{http}"), "--rpc-bind", &format!("0.0.0.0:{rpc}")])
        .args(["--data-dir", &dir.path().join("jm").display().to_string()])
        .args(["--checkpoint-dir", &dir.path().join("ckpt").display().to_string()])
        .args(["--secret-file", &secret])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let agent = http_agent();
    let url = format!("http://127.0.0.1:{http}/api/v1/cluster");
    let status = first_status(&agent, &url);
    assert_eq!(status, 401, "a request without the bearer token");
    let token = std::fs::read_to_string(&secret).unwrap();
    let r = agent.get(&url).header("Authorization", &format!("Bearer {}", token.trim())).call().unwrap();
    assert_eq!(r.status().as_u16(), 200, "with the token");
    let wrong = agent.get(&url).header("Authorization", "Bearer not-the-secret-at-all").call().unwrap();
    assert_eq!(wrong.status().as_u16(), 401);

    // A browser: the UI's page is a sign-in form, not the UI; the secret buys a session cookie.
    let base = format!("http://127.0.0.1:{http}");
    let mut page = agent.get(&format!("{base}/")).header("Accept", "text/html").call().unwrap();
    assert_eq!(page.status().as_u16(), 401);
    let html = page.body_mut().read_to_string().unwrap();
    assert!(html.contains("Sign in") && !html.contains("/api/v1/jobs"), "{html}");
    let login = format!("{base}/api/v1/login");
    let json = |token: &str| serde_json::json!({ "token": token }).to_string();
    let bad = agent
        .post(&login)
        .header("Content-Type", "application/json")
        .send(json("guess-guess-guess"))
        .unwrap();
    assert_eq!(bad.status().as_u16(), 401);
    assert!(bad.headers().get("set-cookie").is_none());
    let cross = agent
        .post(&login)
        .header("Content-Type", "application/json")
        .header("Origin", "http://evil.example")
        .send(json(token.trim()))
        .unwrap();
    assert_eq!(cross.status().as_u16(), 403, "another site cannot sign a browser in");
    let ok = agent.post(&login).header("Content-Type", "application/json").send(json(token.trim())).unwrap();
    assert_eq!(ok.status().as_u16(), 204);
    let cookie = ok.headers().get("set-cookie").unwrap().to_str().unwrap().to_string();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
    let session = cookie.split(';').next().unwrap();
    assert!(!session.contains(token.trim()), "the cookie is not the secret itself");
    let r = agent.get(&url).header("Cookie", session).call().unwrap();
    assert_eq!(r.status().as_u16(), 200, "with the session cookie");

    // `caudal submit` without the secret: refused, nothing runs.
    let jobmanager = format!("http://127.0.0.1:{http}");
    let o = Command::new(caudal())
        .env_remove("CAUDAL_CLUSTER_SECRET_FILE")
        .args(["submit", &temperature().display().to_string(), "--jobmanager", &jobmanager, "--", "--no-ui"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("401") || stderr(&o).contains("Bearer"), "{}", stderr(&o));
    // With it, the listing works and shows no job.
    let o = Command::new(caudal())
        .args(["list", "--json", "--jobmanager", &jobmanager, "--secret-file", &secret])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let jobs: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(jobs, serde_json::json!([]), "nothing was submitted");
    jm.kill().unwrap();
    let _ = jm.wait();
}

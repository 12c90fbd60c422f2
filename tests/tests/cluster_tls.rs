//! Mutual TLS of the cluster (#11): `caudal certs` makes a CA and a certificate per process;
//! a job manager and two task managers with them run a job whose shuffle crosses processes
//! over TLS, and finish with exactly the output the input implies, while a task manager with
//! a certificate of another CA, one without TLS, and a plain connection to the control port
//! are refused and disturb nothing; a task manager SIGKILLed mid-run is replaced and the job
//! resumes over TLS, still exact. The job manager's REST API is HTTPS then: off loopback a
//! certificate of the cluster's CA is what lets a client in.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cluster_support;
#[allow(dead_code)] // the alert half of the model is not used here
#[path = "../../jobs/tests/common/oracle.rs"]
mod oracle;

use cluster_support::*;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `caudal certs --out DIR --name …`, checked.
fn certs(dir: &Path, names: &[&str]) {
    let mut cmd = Command::new(caudal());
    cmd.args(["certs", "--out", &dir.display().to_string()]);
    for n in names {
        cmd.args(["--name", n]);
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "caudal certs: {}", stderr(&o));
}

/// The TLS environment of a process: its certificate and key, and `ca`.
fn tls_env(dir: &Path, name: &str, ca: &Path) -> Vec<(&'static str, String)> {
    let file = |ext: &str| dir.join(format!("{name}.{ext}")).display().to_string();
    vec![
        ("CAUDAL_TLS_CERT", file("pem")),
        ("CAUDAL_TLS_KEY", file("key")),
        ("CAUDAL_TLS_CA", ca.display().to_string()),
    ]
}

#[test]
fn over_mutual_tls_a_job_runs_exactly_and_task_managers_without_the_clusters_certificate_are_refused() {
    let keys = tempfile::tempdir().unwrap();
    let (ours, rogue): (PathBuf, PathBuf) = (keys.path().join("cluster"), keys.path().join("rogue"));
    certs(&ours, &["jobmanager", "tm-1", "tm-2", "tm-3"]);
    certs(&rogue, &["intruder"]);
    let ca = ours.join("ca.pem");
    let mut c = Cluster::start_with(&[], None, &tls_env(&ours, "jobmanager", &ca));
    for tm in ["tm-1", "tm-2"] {
        let env = tls_env(&ours, tm, &ca);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        c.start_taskmanager_with_env(tm, 1, &env);
    }
    c.wait_for_task_managers(2);
    // One slot each: a job at parallelism 2 spans both, its key_by shuffle crosses processes.
    let out = c.dir.path().join("out");
    // ~15 s, so the intruders and a task manager's death come while it runs.
    let args = throttled_args(&oracle::RUN_ARGS, 20, &out);
    let o = c.submit(2, &args);
    assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());
    let running = c.wait_job("temperature", 30, "running with a checkpoint", |j| {
        status(j) == "RUNNING" && j["last_checkpoint"].as_u64().is_some()
    });
    assert_eq!(running["task_managers"].as_array().unwrap().len(), 2, "{running:#}");

    // Intruders: a task manager with a certificate of another CA, one without TLS (plain
    // HTTP to the job manager), and a plain connection to the control port. The REST API is
    // HTTPS with the cluster's CA, so neither task manager learns where the control port is.
    let intruder = tls_env(&rogue, "intruder", &rogue.join("ca.pem"));
    let intruder: Vec<(&str, &str)> = intruder.iter().map(|(k, v)| (*k, v.as_str())).collect();
    c.start_taskmanager_with_env("intruder", 4, &intruder);
    let plain_url = c.url().replace("https://", "http://");
    c.start_taskmanager_at(
        &plain_url,
        "plain",
        4,
        &[("CAUDAL_TLS_CERT", ""), ("CAUDAL_TLS_KEY", ""), ("CAUDAL_TLS_CA", "")],
    );
    let mut control = std::net::TcpStream::connect(("127.0.0.1", c.rpc)).unwrap();
    control.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = control.write_all(b"\0\0\0\x20a plain hello to the control port....");
    let _ = control.read_to_end(&mut Vec::new()); // the job manager hangs up
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(c.logs().contains("control connection refused")
        && ["intruder", "plain"].iter().all(|tm| log_of(&c, tm).contains("cannot reach the job manager")))
    {
        assert!(Instant::now() < deadline, "the intruders were not refused:{}", c.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(c.logs().contains("TLS handshake failed"), "the refusal names TLS:{}", c.logs());
    assert_not_registered(&c, &["intruder", "plain"]);

    // A task manager dies mid-run (#43: no TLS cluster was ever killed): the job resumes on
    // a new one that has the cluster's certificate, over TLS again.
    let before = c.wait_job("temperature", 30, "running", |j| status(j) == "RUNNING");
    assert_eq!(before["restarts"], 0, "the intruders disturbed nothing: {before:#}");
    c.kill_taskmanager("tm-2");
    let env = tls_env(&ours, "tm-3", &ca);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    c.start_taskmanager_with_env("tm-3", 1, &env);
    let attempt = before["attempt"].as_u64().unwrap();
    let again = c.wait_job("temperature", 60, "running again", |j| {
        j["attempt"].as_u64() > Some(attempt) && matches!(status(j), "RUNNING" | "FINISHED")
    });
    assert!(again["task_managers"].as_array().unwrap().iter().any(|t| t == "tm-3"), "{again:#}");
    let done = c.wait_job("temperature", 90, "FINISHED", |j| status(j) == "FINISHED");
    assert!(done["restarts"].as_u64().unwrap() >= 1, "{done:#}");
    let (windows, readings) = oracle::expected(&oracle::Model::RUN);
    assert!(published(&out, "readings") == readings, "readings differ from what the input implies");
    assert!(published(&out, "windows") == windows, "windows differ from what the input implies");
}

#[test]
fn tls_flags_come_together_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(caudal())
        .env_remove("CAUDAL_TLS_KEY")
        .env_remove("CAUDAL_TLS_CA")
        .args(["jobmanager", "--tls-cert", &dir.path().join("x.pem").display().to_string()])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("missing --tls-key, --tls-ca"), "{}", stderr(&o));
}

fn log_of(c: &Cluster, name: &str) -> String {
    std::fs::read_to_string(c.dir.path().join(format!("{name}.log"))).unwrap_or_default()
}

#[test]
fn off_loopback_over_https_a_certificate_of_the_clusters_ca_lets_a_client_in() {
    let dir = tempfile::tempdir().unwrap();
    let (ours, rogue) = (dir.path().join("cluster"), dir.path().join("rogue"));
    certs(&ours, &["jobmanager", "admin"]);
    certs(&rogue, &["intruder"]);
    let ca = ours.join("ca.pem");
    let (http, rpc) = (free_port(), free_port());
    // No cluster secret: TLS alone lets a job manager listen off loopback.
    let mut jm = Command::new(caudal())
        .envs(tls_env(&ours, "jobmanager", &ca))
        .env_remove("CAUDAL_CLUSTER_SECRET_FILE")
        .args(["jobmanager", "--bind", &format!("0.0.0.0:{http}"), "--rpc-bind", &format!("0.0.0.0:{rpc}")])
        .args(["--data-dir", &dir.path().join("jm").display().to_string()])
        .args(["--checkpoint-dir", &dir.path().join("ckpt").display().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let file = |d: &Path, name: &str| d.join(name);
    let admin = https_agent(Some((&file(&ours, "admin.pem"), &file(&ours, "admin.key"))), &ca);
    let url = format!("https://127.0.0.1:{http}/api/v1/cluster");
    let status = first_status(&admin, &url);
    assert_eq!(status, 200, "a client with a certificate of the cluster's CA needs no token");

    // HTTPS without a client certificate: the connection is fine, the request is not.
    let anonymous = https_agent(None, &ca);
    let mut r = anonymous.get(&url).call().unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let why = r.body_mut().read_to_string().unwrap();
    assert!(why.contains("TLS client certificate"), "{why}");
    // A certificate of another CA fails the handshake; plain HTTP gets no answer.
    let stranger = https_agent(Some((&file(&rogue, "intruder.pem"), &file(&rogue, "intruder.key"))), &ca);
    assert!(stranger.get(&url).call().is_err(), "a certificate of another CA is refused");
    let plain = http_agent().get(&format!("http://127.0.0.1:{http}/api/v1/cluster")).call();
    assert!(!matches!(plain, Ok(r) if r.status() == 200), "plain HTTP is not served");

    // The commands: with the cluster's certificates (an http:// URL, such as the default,
    // means https:// then) they work; without them `submit` runs nothing.
    let jobmanager = format!("http://127.0.0.1:{http}");
    let caudal_as = |identity: Option<&str>| {
        let mut cmd = Command::new(caudal());
        cmd.env_remove("CAUDAL_CLUSTER_SECRET_FILE");
        match identity {
            Some(name) => cmd.envs(tls_env(&ours, name, &ca)),
            None => {
                cmd.env_remove("CAUDAL_TLS_CERT").env_remove("CAUDAL_TLS_KEY").env_remove("CAUDAL_TLS_CA")
            }
        };
        cmd
    };
    let o = caudal_as(None)
        .args(["submit", &temperature().display().to_string(), "--jobmanager", &jobmanager, "--", "--no-ui"])
        .output()
        .unwrap();
    assert!(!o.status.success(), "a submit without TLS must fail");
    let o = caudal_as(None)
        .args(["list", "--jobmanager", &jobmanager.replace("http://", "https://")])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--tls-ca"), "HTTPS without the CA names the flags: {}", stderr(&o));
    let o = caudal_as(Some("admin")).args(["list", "--json", "--jobmanager", &jobmanager]).output().unwrap();
    assert!(o.status.success(), "caudal list over HTTPS: {}", stderr(&o));
    let jobs: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(jobs, serde_json::json!([]), "the refused submit ran nothing");
    jm.kill().unwrap();
    let _ = jm.wait();
}

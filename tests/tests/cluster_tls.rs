//! Mutual TLS of the cluster (#11): `caudal certs` makes a CA and a certificate per process;
//! a job manager and two task managers with them run a job whose shuffle crosses processes
//! over TLS, and finish with exactly the output the input implies, while a task manager with
//! a certificate of another CA, and one without TLS, are refused and disturb nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cluster_support;
#[allow(dead_code)] // the alert half of the model is not used here
#[path = "../../jobs/tests/common/oracle.rs"]
mod oracle;

use cluster_support::*;
use std::path::{Path, PathBuf};
use std::process::Command;

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
    certs(&ours, &["jobmanager", "tm-1", "tm-2"]);
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
    let args = throttled_args(&oracle::RUN_ARGS, 50, &out); // ~6 s, so the intruders come while it runs
    let o = c.submit(2, &args);
    assert!(o.status.success(), "submit failed: {}{}", stderr(&o), c.logs());
    let running = c.wait_job("temperature", 30, "running with a checkpoint", |j| {
        status(j) == "RUNNING" && j["last_checkpoint"].as_u64().is_some()
    });
    assert_eq!(running["task_managers"].as_array().unwrap().len(), 2, "{running:#}");

    // Intruders: a certificate from another CA, and no TLS at all.
    let intruder = tls_env(&rogue, "intruder", &rogue.join("ca.pem"));
    let intruder: Vec<(&str, &str)> = intruder.iter().map(|(k, v)| (*k, v.as_str())).collect();
    c.start_taskmanager_with_env("intruder", 4, &intruder);
    c.start_taskmanager_with_env(
        "plain",
        4,
        &[("CAUDAL_TLS_CERT", ""), ("CAUDAL_TLS_KEY", ""), ("CAUDAL_TLS_CA", "")],
    );
    assert_refused(&c, &["intruder", "plain"]);
    assert!(c.logs().contains("TLS handshake failed"), "the refusal names TLS:{}", c.logs());

    assert_finished_exactly(&c, &out, &oracle::expected(&oracle::Model::RUN));
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

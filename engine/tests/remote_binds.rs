//! Safe by default (#11): without a cluster secret (`--secret-file`), `caudal jobmanager`
//! refuses to listen off loopback — its REST API (`--bind`) or its control port
//! (`--rpc-bind`) — naming the flag, unless `--insecure-allow-remote` says the network is the
//! user's own. (With a secret: `tests/tests/cluster_auth.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A job manager with its folders in `dir`.
fn jobmanager(dir: &tempfile::TempDir, args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_caudal"))
        .arg("jobmanager")
        .args(["--data-dir", &dir.path().join("jm").display().to_string()])
        .args(["--checkpoint-dir", &dir.path().join("ckpt").display().to_string()])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_job_manager_off_loopback_is_refused_naming_the_flag_unless_allowed() {
    for (flag, args) in [
        ("--bind", ["--bind", "0.0.0.0:0", "--rpc-bind", "127.0.0.1:0"]),
        ("--rpc-bind", ["--bind", "127.0.0.1:0", "--rpc-bind", "0.0.0.0:0"]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = jobmanager(&dir, &args).wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag}: started off loopback: {err}");
        assert!(err.contains(flag) && err.contains("without a cluster secret"), "{flag}: {err}");
    }
    // Allowed: it runs (until killed).
    let dir = tempfile::tempdir().unwrap();
    let mut child =
        jobmanager(&dir, &["--bind", "0.0.0.0:0", "--rpc-bind", "0.0.0.0:0", "--insecure-allow-remote"]);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        assert!(child.try_wait().unwrap().is_none(), "--insecure-allow-remote did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill().unwrap();
    let _ = child.wait();
}

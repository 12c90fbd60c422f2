//! Who may drive an embedded job's web UI and REST API (#44): off loopback the job refuses
//! to serve them without a secret, naming the flag; with `--ui-secret-file`, a request
//! without the secret (bearer token or session cookie) is refused with 401 and changes
//! nothing, and one with it is served.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::time::{Duration, Instant};

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).proxy(None).build().into()
}

fn args_with_ui(d: &Dirs, ui: &[String]) -> Vec<String> {
    let mut args: Vec<String> =
        base_args(&d.out, &d.ckpt, 1).into_iter().filter(|a| a != "--no-ui").collect();
    args.extend(ui.iter().cloned());
    args
}

#[test]
fn off_loopback_without_a_secret_the_ui_is_refused_naming_the_flag() {
    let d = dirs();
    // Port 0 on every interface: refused before anything listens.
    let started = Instant::now();
    let (status, err) = wait(spawn(&args_with_ui(&d, &["--ui-bind".into(), "0.0.0.0:0".into()]), false, &[]));
    assert!(!status.success(), "the job served its UI off loopback without authentication:\n{err}");
    assert!(err.contains("--ui-bind") && err.contains("--ui-secret-file"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
    assert!(published(&d.out, "readings").is_empty(), "the job ran anyway");
}

#[test]
fn with_a_secret_a_request_without_it_gets_401_and_changes_nothing() {
    let d = dirs();
    let secret = d.tmp.path().join("ui-secret");
    std::fs::write(&secret, "0123456789abcdef0123456789abcdef\n").unwrap();
    let port = caudal_test_stack::free_port();
    let ui = [
        "--ui-bind".into(),
        format!("127.0.0.1:{port}"),
        "--ui-secret-file".into(),
        secret.display().to_string(),
    ];
    // A long run (slowed down) so that it is still running when asked.
    let mut args = args_with_ui(&d, &ui);
    let rate = args.iter().position(|a| a == "--rate").unwrap();
    args[rate + 1] = "500".into();
    let mut child = spawn(&args, false, &[]);
    let base = format!("http://127.0.0.1:{port}/api/v1/jobs/temperature");
    let http = agent();
    let started = Instant::now();
    let status = loop {
        match http.get(&base).call() {
            Ok(r) => break r.status().as_u16(),
            Err(_) if started.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => panic!("the job's API did not come up: {e}"),
        }
    };
    assert_eq!(status, 401, "a request without the secret was served");
    let stop = http
        .post(format!("{base}/stop"))
        .header("Origin", format!("http://127.0.0.1:{port}"))
        .content_type("application/json")
        .send("{}")
        .unwrap();
    assert_eq!(stop.status().as_u16(), 401);
    let wrong = http.get(&base).header("Authorization", "Bearer not-the-secret-at-all").call().unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    let mut ok =
        http.get(&base).header("Authorization", "Bearer 0123456789abcdef0123456789abcdef").call().unwrap();
    assert_eq!(ok.status().as_u16(), 200);
    let job: serde_json::Value = serde_json::from_str(&ok.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(job["status"], "RUNNING", "the refused stop stopped the job: {job}");
    let _ = child.kill();
    let _ = child.wait();
}

//! Logging (#13): library lines go through `tracing` with a level, one line per event, and
//! `RUST_LOG` filters them — seen in the real `caudal jobmanager` and task manager processes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cluster_support;

use cluster_support::Cluster;
use std::time::{Duration, Instant};

fn wait_for_log(c: &Cluster, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let logs = c.logs();
        if logs.contains(what) {
            return logs;
        }
        assert!(Instant::now() < deadline, "no `{what}` in the logs:\n{logs}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn lines_carry_their_level_and_rust_log_filters_them() {
    // The default is `info`.
    let mut c = Cluster::start(&[]);
    c.start_taskmanager("tm-1", 1);
    c.wait_for_task_managers(1);
    let logs = c.logs();
    let line = logs.lines().find(|l| l.contains("caudal jobmanager: REST API and web UI at")).unwrap();
    assert!(line.contains(" INFO "), "no level on the line: {line}");
    c.kill_taskmanager("tm-1");
    // Its registration line names it too: wait for the line that says it is lost.
    let logs = wait_for_log(&c, ") lost: ");
    let lost = logs.lines().find(|l| l.contains("task manager tm-1") && l.contains(") lost: ")).unwrap();
    assert!(lost.contains(" WARN "), "a lost task manager is a warning: {lost}");
    drop(c);

    // RUST_LOG=warn: the warning, not the information.
    let mut c = Cluster::start_with(&[], None, &[("RUST_LOG", "warn".into())]);
    c.start_taskmanager("tm-1", 1);
    c.wait_for_task_managers(1);
    c.kill_taskmanager("tm-1");
    let logs = wait_for_log(&c, " WARN caudal jobmanager: task manager tm-1");
    assert!(!logs.contains(" INFO "), "RUST_LOG=warn let info lines through:\n{logs}");
    assert!(!logs.contains("REST API and web UI at"), "{logs}");
    drop(c);

    // A RUST_LOG that does not parse is said, and logging stays at info.
    let c = Cluster::start_with(&[], None, &[("RUST_LOG", "caudal=loudest".into())]);
    let logs = wait_for_log(&c, "REST API and web UI at");
    assert!(logs.contains("ignoring RUST_LOG=\"caudal=loudest\""), "{logs}");
}

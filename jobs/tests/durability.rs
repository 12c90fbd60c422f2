//! What the exactly-once protocol relies on is on disk before it relies on it, shown by the
//! system calls of a real run (`strace -f -y`; strace comes with `scripts/install-deps.sh`):
//! a power loss at any moment must not leave a completed checkpoint without its `_metadata`
//! while a sink already published its epoch, nor a pre-committed file the checkpoint names
//! without its name or its records. For every epoch the file sink publishes, in this order:
//!
//! 1. the epoch's records synced (`fsync` of the open file), renamed to its pending name,
//!    and that rename synced (`fsync` of `.inprogress/`);
//! 2. the checkpoint's `chk-<n>/_metadata` synced, with `chk-<n>/` and the job's folder;
//! 3. the pending file linked to its published name, the link synced (`fsync` of the output
//!    folder), and only then the pending name removed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::collections::HashMap;
use std::process::Command;

/// One completed system call: its name, its arguments (with `-y`, fds carry their path as
/// `5</path>`), in the order the calls returned.
#[derive(Debug)]
struct Call {
    name: String,
    args: String,
}

/// Parses `strace -f -y -o` output, joining `<unfinished ...>` / `<... resumed>` halves:
/// a call counts where it returned.
fn calls(trace: &str) -> Vec<Call> {
    let mut unfinished: HashMap<&str, String> = HashMap::new();
    let mut out = Vec::new();
    for line in trace.lines() {
        let Some((pid, rest)) = line.split_once(' ') else { continue };
        let rest = rest.trim_start();
        if let Some(head) = rest.strip_suffix("<unfinished ...>") {
            unfinished.insert(pid, head.to_string());
            continue;
        }
        let full = if rest.starts_with("<...") {
            let Some(head) = unfinished.remove(pid) else { continue };
            let tail = rest.split_once("resumed>").map_or("", |(_, t)| t);
            format!("{head}{tail}")
        } else {
            rest.to_string()
        };
        let Some((name, args)) = full.split_once('(') else { continue };
        // `) = 0`, the result often padded to a column: failed calls promise nothing.
        if !full.rsplit_once(')').is_some_and(|(_, result)| result.trim_start().starts_with("= 0")) {
            continue;
        }
        out.push(Call { name: name.to_string(), args: args.to_string() });
    }
    out
}

/// The first call at or after `from` that satisfies `pred`.
fn find(calls: &[Call], from: usize, pred: impl Fn(&Call) -> bool) -> Option<usize> {
    calls.iter().skip(from).position(pred).map(|i| i + from)
}

fn is_fsync_of(c: &Call, path: &str) -> bool {
    (c.name == "fsync" || c.name == "fdatasync") && c.args.contains(&format!("<{path}>"))
}

/// Paths quoted in a call's arguments.
fn quoted(c: &Call) -> Vec<&str> {
    c.args.split('"').skip(1).step_by(2).collect()
}

fn strace_present() -> bool {
    let present = Command::new("strace").arg("-V").output().is_ok_and(|o| o.status.success());
    if !present {
        assert!(!caudal_test_stack::required(), "strace is missing (scripts/install-deps.sh installs it)");
        eprintln!("skipping: strace is missing (scripts/install-deps.sh installs it)");
    }
    present
}

#[test]
fn every_published_epoch_was_durable_in_the_order_the_protocol_needs() {
    if !strace_present() {
        return;
    }
    let d = dirs();
    let trace_file = d.tmp.path().join("trace");
    let out = Command::new("strace")
        .args([
            "-f",
            "-y",
            "-qq",
            "-e",
            "trace=fsync,fdatasync,rename,renameat,renameat2,link,linkat,unlink,unlinkat",
        ])
        .arg("-o")
        .arg(&trace_file)
        .arg(env!("CARGO_BIN_EXE_temperature"))
        .args(base_args(&d.out, &d.ckpt, 2))
        .output()
        .unwrap();
    assert!(out.status.success(), "the job failed: {}", String::from_utf8_lossy(&out.stderr));
    let (windows, readings) = oracle::expected(&BASE_MODEL);
    assert_eq!(published(&d.out, "readings"), readings);
    assert_eq!(published(&d.out, "windows"), windows);

    let trace = std::fs::read_to_string(&trace_file).unwrap();
    let calls = calls(&trace);
    let job_dir = d.ckpt.join("temperature").display().to_string();
    let mut epochs = 0;
    for (i, publish) in calls.iter().enumerate().filter(|(_, c)| c.name == "link" || c.name == "linkat") {
        let [from, to] = quoted(publish)[..] else { panic!("{publish:?}") };
        let name = from.rsplit('/').next().unwrap();
        let Some(rest) = name.strip_suffix(".pending") else { continue };
        // part-<subtask>-<n>.<attempt>
        let checkpoint: u64 = rest.split(['-', '.']).nth(2).unwrap().parse().unwrap();
        let inprogress = from.rsplit_once('/').unwrap().0;
        let folder = to.rsplit_once('/').unwrap().0;
        let what = format!("{name} (checkpoint {checkpoint})");

        // 1. The records, the pending name, and the rename.
        let renamed = calls[..i]
            .iter()
            .rposition(|c| c.name.starts_with("rename") && quoted(c).get(1) == Some(&from))
            .unwrap_or_else(|| panic!("{what}: no rename to its pending name before it was published"));
        let open = quoted(&calls[renamed])[0];
        assert!(
            calls[..renamed].iter().any(|c| is_fsync_of(c, open)),
            "{what}: its records were not synced before the pre-commit rename"
        );
        let rename_synced = find(&calls, renamed, |c| is_fsync_of(c, inprogress))
            .unwrap_or_else(|| panic!("{what}: the pre-commit rename was never synced"));

        // 2. The checkpoint's metadata and its folders, after the pre-commit, before the link.
        let meta = format!("{job_dir}/chk-{checkpoint}/_metadata");
        let meta_synced = find(&calls, renamed, |c| is_fsync_of(c, &meta))
            .unwrap_or_else(|| panic!("{what}: {meta} was never synced"));
        assert!(
            rename_synced < meta_synced,
            "{what}: the pending name synced only after the checkpoint completed"
        );
        for dir in [format!("{job_dir}/chk-{checkpoint}"), job_dir.clone()] {
            let synced = find(&calls, meta_synced, |c| is_fsync_of(c, &dir));
            assert!(synced.is_some_and(|s| s < i), "{what}: {dir} not synced before the epoch was published");
        }
        assert!(meta_synced < i, "{what}: published before its checkpoint's metadata was durable");

        // 3. The link synced before the pending name goes.
        let removed = find(&calls, i, |c| c.name.starts_with("unlink") && quoted(c).first() == Some(&from))
            .unwrap_or_else(|| panic!("{what}: the pending name was never removed"));
        let link_synced = find(&calls, i, |c| is_fsync_of(c, folder));
        assert!(
            link_synced.is_some_and(|s| s < removed),
            "{what}: the pending name was removed before the link was durable"
        );
        epochs += 1;
    }
    // Checkpoints every 0.3 s over a ~4 s run, two sinks at parallelism 2.
    assert!(epochs >= 10, "only {epochs} epochs published through checkpoints: {}", trace.len());
}

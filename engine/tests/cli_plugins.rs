//! `caudal X` runs `caudal-X` (like git and cargo); an unknown X is a clear error.
#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn an_unknown_command_names_the_program_it_looked_for() {
    let out = Command::new(env!("CARGO_BIN_EXE_caudal")).arg("no-such-tool").output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("caudal-no-such-tool") && err.contains("caudal --help"), "{err}");
}

#[test]
fn a_command_found_next_to_caudal_runs_with_the_remaining_arguments() {
    // A plugin beside a copy of `caudal`: a shell script echoing its arguments.
    let dir = tempfile::tempdir().unwrap();
    let caudal = dir.path().join("caudal");
    std::fs::copy(env!("CARGO_BIN_EXE_caudal"), &caudal).unwrap();
    let plugin = dir.path().join("caudal-echo");
    std::fs::write(&plugin, "#!/bin/sh\necho \"plugin got: $*\"\nexit 3\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(&caudal).args(["echo", "check", "--subject", "s"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "plugin got: check --subject s");
    assert_eq!(out.status.code(), Some(3), "the plugin's exit status is passed on");
}

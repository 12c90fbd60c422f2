//! The README's job example is `jobs/examples/hottest_sensor.rs`, which cargo compiles (and
//! `cargo test` builds): the first Rust block under "Write your own job" must be that file
//! without its module doc, so the README never shows code that no longer compiles.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

fn root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("..")
}

#[test]
fn the_readme_job_example_is_the_compiled_example_file() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let example = std::fs::read_to_string(root().join("jobs/examples/hottest_sensor.rs")).unwrap();
    let section = readme.split("## Write your own job").nth(1).expect("the README's job section");
    let block =
        section.split("```rust\n").nth(1).and_then(|b| b.split("```\n").next()).expect("a rust block");
    let code: String = example
        .lines()
        .skip_while(|l| l.starts_with("//!"))
        .skip_while(|l| l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        block, code,
        "README.md's example differs from jobs/examples/hottest_sensor.rs: copy the file"
    );
}

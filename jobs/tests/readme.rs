//! The README's job examples are `jobs/examples/hottest_sensor.rs` and
//! `jobs/examples/readings_per_minute.rs`, which cargo compiles (and `cargo test` builds):
//! the first Rust block under "Write your own job" and under "Process functions" must be
//! those files without their module doc, so the README never shows code that no longer
//! compiles.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

fn root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("..")
}

/// The `n`-th Rust block under `heading` in the README equals `example` without its
/// module doc.
fn assert_block_is_example(heading: &str, n: usize, example: &str) {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let code = std::fs::read_to_string(root().join(example)).unwrap();
    let section = readme.split(heading).nth(1).expect("the README's section");
    let block =
        section.split("```rust\n").nth(n).and_then(|b| b.split("```\n").next()).expect("a rust block");
    let code: String = code
        .lines()
        .skip_while(|l| l.starts_with("//!"))
        .skip_while(|l| l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(block, code, "README.md's example differs from {example}: copy the file");
}

#[test]
fn the_readme_job_example_is_the_compiled_example_file() {
    assert_block_is_example("## Write your own job", 1, "jobs/examples/hottest_sensor.rs");
}

#[test]
fn the_readme_process_function_example_is_the_compiled_example_file() {
    assert_block_is_example("### Process functions", 1, "jobs/examples/readings_per_minute.rs");
}

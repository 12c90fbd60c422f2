//! Logging. Every line the engine and its connectors log goes through `tracing`, with a
//! level (and fields where a log pipeline wants them: `job`, `checkpoint`), one line per
//! event on stderr:
//!
//! ```text
//! 2026-12-01T17:40:02.120347Z  INFO caudal: restoring job `temperature` from checkpoint chk-12
//! 2026-12-01T17:40:09.511093Z  WARN caudal: checkpoint 14 failed: timed out after 10s checkpoint=14
//! ```
//!
//! `RUST_LOG` filters as usual (`RUST_LOG=warn`, `RUST_LOG=info,caudal::cluster=debug`); the
//! default is `info`. A job's progress line and the CLI's answers are output, not logs, and
//! stay as they are. A program that installs its own `tracing` subscriber first keeps it.

use tracing_subscriber::EnvFilter;

/// Installs the stderr subscriber, once per process (`StreamEnv` and the `caudal` binary
/// call it; later calls and an already installed subscriber are left alone).
pub fn init() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = match std::env::var("RUST_LOG") {
            Ok(spec) if !spec.trim().is_empty() => EnvFilter::try_new(&spec).unwrap_or_else(|e| {
                eprintln!("caudal: ignoring RUST_LOG={spec:?} ({e}); logging at info");
                EnvFilter::new("info")
            }),
            _ => EnvFilter::new("info"),
        };
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_target(false)
            .try_init();
    });
}

//! Tests only: the running test stack's addresses (`scripts/services.sh env`), unique
//! names, and a sink context. Without a service's variable a test prints why and passes,
//! unless `CAUDAL_REQUIRE_STACK` is set (CI), in which case it fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use caudal::{CheckpointId, OperatorContext};

/// The value of `var`, or `None` (the test then returns) after saying why.
pub(crate) fn service(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => Some(v),
        _ if std::env::var_os("CAUDAL_REQUIRE_STACK").is_some() => {
            panic!("{var} is not set: run scripts/services.sh start and eval \"$(scripts/services.sh env)\"")
        }
        _ => {
            eprintln!("skipped: {var} is not set; run scripts/services.sh start and eval \"$(scripts/services.sh env)\"");
            None
        }
    }
}

/// A name no other test run uses (lower case, `[a-z0-9_]`).
pub(crate) fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("t_{what}_{}_{}", std::process::id(), nanos % 1_000_000_000_000)
}

/// The context of subtask `subtask` of a checkpointing job `job`, restored from `restored`.
pub(crate) fn context(job: &str, subtask: u32, restored: Option<u64>) -> OperatorContext {
    let mut ctx = OperatorContext::unkeyed(job, "sink", subtask, 1);
    ctx.operator_uid = "9-sink".into();
    ctx.checkpointing = true;
    ctx.restored_checkpoint = restored.map(CheckpointId);
    ctx
}

//! Checkpoints of a large keyed state through the engine: a keyed window operator on RocksDB
//! is loaded with `--keys` keys of `--value-bytes` each (1 GB by default), then a small
//! fraction of the keys is updated between checkpoints. Prints, from the job's own checkpoint
//! statistics, the synchronous part (flush + RocksDB checkpoint: the time records wait) and the
//! upload of the incremental checkpoints (p50/p99/max), then restores the job from its last
//! loaded checkpoint and prints the restore time (download, verify, open, timer rebuild).
//!
//! ```text
//! cargo run --release -p caudal-benches --bin state_checkpoint -- --keys 1000000 --value-bytes 1000
//! ```

use anyhow::Context;
use caudal::metrics::names;
use caudal::{JobConfig, RestoreFrom, StreamEnv};
use caudal_benches::big_state::{add_pipeline, StateShape, LOADED_AT};
use clap::Parser;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Instant;

#[derive(Debug, Clone, Parser)]
#[command(about = "Checkpoint and restore of a large keyed state through the engine")]
struct Args {
    #[command(flatten)]
    shape: StateShape,
    /// Checkpoints to take after the load.
    #[arg(long, default_value_t = 20)]
    checkpoints: u64,
    /// Checkpoint storage (default: a fresh directory under the temp dir, removed at the end).
    #[arg(long)]
    checkpoint_dir: Option<PathBuf>,
    /// Only restore checkpoint N of a `--checkpoint-dir` kept from an earlier run.
    #[arg(long, value_name = "N", requires = "checkpoint_dir")]
    restore_only: Option<u64>,
}

fn run(
    args: &Args,
    dir: &str,
    restore: Option<RestoreFrom>,
    total: u64,
) -> anyhow::Result<caudal::JobResult> {
    let mut config = JobConfig { parallelism: 1, handle_signals: false, ..JobConfig::default() };
    config.checkpoints.interval = Some(args.shape.interval());
    config.checkpoints.storage.url = dir.to_string();
    config.checkpoints.retained = 3;
    config.checkpoints.restore = restore;
    let env = StreamEnv::with_config(config);
    add_pipeline(&env, args.shape.source(total));
    Ok(env.execute("state-checkpoint")?)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Restores checkpoint `id` and prints how long it took, and how long the timers took.
fn restore(args: &Args, url: &str, id: u64, size_mb: f64) -> anyhow::Result<()> {
    let started = Instant::now();
    let restored = run(args, url, Some(RestoreFrom::Path(format!("chk-{id}"))), args.shape.keys)
        .context("restore run")?;
    let counter = |name| restored.operator("state").and_then(|o| o.counters.get(name).copied()).unwrap_or(0);
    println!(
        "restore of chk-{id} ({size_mb:.0} MB): {} ms (download, verify, open: {} ms; timer rebuild: {} ms); \
         restored run {:.1}s",
        counter(names::STATE_RESTORE_MS),
        counter(names::STATE_RESTORE_MS).saturating_sub(counter(names::TIMER_REBUILD_MS)),
        counter(names::TIMER_REBUILD_MS),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let owned = args.checkpoint_dir.is_none();
    let dir = args
        .checkpoint_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("caudal-state-bench-{}", std::process::id())));
    let url = dir.display().to_string();
    if let Some(id) = args.restore_only {
        return restore(&args, &url, id, 0.0);
    }
    let shape = &args.shape;
    let updates = (shape.keys as f64 * shape.update_fraction) as u64 * args.checkpoints;
    let total = shape.keys + updates;
    eprintln!(
        "loading {} keys x {} B = {:.0} MB, then {} updates over ~{} checkpoints",
        shape.keys,
        shape.value_bytes,
        (shape.keys as f64 * shape.value_bytes as f64) / 1e6,
        updates,
        args.checkpoints
    );
    let started = Instant::now();
    let result = run(&args, &url, None, total).context("load and update run")?;
    eprintln!("run took {:.1}s", started.elapsed().as_secs_f64());
    let done: Vec<_> = result.checkpoints.iter().filter(|c| c.status == "COMPLETED").collect();
    let loaded_at = LOADED_AT.load(Ordering::SeqCst);
    println!(
        "{:>5} {:>10} {:>10} {:>10} {:>12} {:>12}",
        "chk", "total ms", "sync ms", "upload ms", "size MB", "uploaded MB"
    );
    for c in &done {
        println!(
            "{:>5} {:>10} {:>10.1} {:>10.1} {:>12.1} {:>12.1}",
            c.id,
            c.duration_ms,
            c.sync_us as f64 / 1e3,
            c.upload_us as f64 / 1e3,
            c.size_bytes as f64 / 1e6,
            c.incremental_bytes as f64 / 1e6
        );
    }
    let Some(first_full) = done.iter().position(|c| c.id == loaded_at) else {
        anyhow::bail!("no checkpoint held the whole load");
    };
    // Incremental checkpoints: after the first full one, before the final one (taken after the
    // end of input fired every window).
    let incremental: Vec<_> = done[first_full + 1..done.len().saturating_sub(1)].to_vec();
    let mut sync: Vec<f64> = incremental.iter().map(|c| c.sync_us as f64 / 1e3).collect();
    let mut upload: Vec<f64> = incremental.iter().map(|c| c.upload_us as f64 / 1e3).collect();
    let mut total_ms: Vec<f64> = incremental.iter().map(|c| c.duration_ms as f64).collect();
    for v in [&mut sync, &mut upload, &mut total_ms] {
        v.sort_by(f64::total_cmp);
    }
    let new_share: Vec<f64> =
        incremental.iter().map(|c| c.incremental_bytes as f64 / c.size_bytes.max(1) as f64).collect();
    println!(
        "incremental checkpoints: {} (new bytes {:.1}-{:.1} % of the state)",
        incremental.len(),
        new_share.iter().copied().fold(f64::INFINITY, f64::min) * 100.0,
        new_share.iter().copied().fold(0.0, f64::max) * 100.0
    );
    for (name, v) in [("sync part", &sync), ("upload", &upload), ("trigger to complete", &total_ms)] {
        println!(
            "  {name:<20} p50 {:>8.1} ms  p99 {:>8.1} ms  max {:>8.1} ms",
            percentile(v, 0.5),
            percentile(v, 0.99),
            v.last().copied().unwrap_or(0.0)
        );
    }
    let restore_from = incremental.last().map_or(done[first_full].id, |c| c.id);
    let size = done.iter().find(|c| c.id == restore_from).map_or(0.0, |c| c.size_bytes as f64 / 1e6);
    restore(&args, &url, restore_from, size)?;
    if owned {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

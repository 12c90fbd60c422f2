//! A job with a large keyed state, to submit to a cluster: `benches/cluster.sh` kills a task
//! manager once its checkpoints hold the whole state, and times the recovery (detection,
//! restart, download and restore of the state, processing again). Unbounded: it loads
//! `--keys` keys of `--value-bytes` each (1 GB by default) into a keyed window operator on
//! RocksDB, then updates `--update-fraction` of them per checkpoint interval.
//!
//! ```text
//! caudal submit target/release/big_state_job --parallelism 2 -- --keys 1000000 --value-bytes 1000
//! ```

use caudal::{JobConfig, StreamEnv, WatermarkStrategy};
use caudal_benches::big_state::{Entry, Latest, LoadThenUpdate};
use caudal_operators::sinks::DiscardSink;
use caudal_operators::window::{KeyedWindowExt, WindowAssigner};
use clap::Parser;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(about = "An unbounded job with a large keyed state (RocksDB), for recovery benchmarks")]
struct Args {
    /// Distinct keys.
    #[arg(long, default_value_t = 1_000_000)]
    keys: u64,
    /// Bytes of state per key.
    #[arg(long, default_value_t = 1000)]
    value_bytes: usize,
    /// Fraction of the keys updated per checkpoint interval after the load.
    #[arg(long, default_value_t = 0.01)]
    update_fraction: f64,
    /// Seconds between checkpoints.
    #[arg(long, default_value_t = 2.0)]
    checkpoint_interval: f64,
    /// Parallelism of the stateful operator (the source has one subtask).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=128))]
    parallelism: u32,
    /// Checkpoint storage when run on its own (a job manager sets its own).
    #[arg(long, default_value = "data/checkpoints")]
    checkpoint_dir: String,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut config = JobConfig { parallelism: args.parallelism, ..JobConfig::default() };
    config.checkpoints.interval = Some(Duration::from_secs_f64(args.checkpoint_interval));
    config.checkpoints.storage.url = args.checkpoint_dir.clone();
    let env = StreamEnv::with_config(config.with_env_overrides()?);
    let source = LoadThenUpdate {
        keys: args.keys,
        value_bytes: args.value_bytes.max(8),
        updates_per_sec: args.keys as f64 * args.update_fraction / args.checkpoint_interval,
        total: u64::MAX,
    };
    // One event-time instant, one day-long window per key: the state only grows to the load.
    env.source(
        "load-then-update",
        source,
        WatermarkStrategy::bounded_out_of_orderness(Duration::ZERO, |_| 0),
    )
    .parallelism(1)
    .key_by(|e: &Entry| e.0)
    .window(WindowAssigner::tumbling(Duration::from_secs(86_400)))
    .name("state")
    .aggregate(Latest)
    .sink("discard", |_| Ok(DiscardSink::default()));
    env.execute("big-state")?;
    Ok(())
}

//! A job with a large keyed state, to submit to a cluster: `benches/cluster.sh` kills a task
//! manager once its checkpoints hold the whole state, and times the recovery (detection,
//! restart, download and restore of the state, processing again). Unbounded: it loads
//! `--keys` keys of `--value-bytes` each (1 GB by default) into a keyed window operator on
//! RocksDB, then updates `--update-fraction` of them per checkpoint interval.
//!
//! ```text
//! caudal submit target/release/big_state_job --parallelism 2 -- --keys 1000000 --value-bytes 1000
//! ```

use caudal::{JobConfig, StreamEnv};
use caudal_benches::big_state::{add_pipeline, StateShape};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(about = "An unbounded job with a large keyed state (RocksDB), for recovery benchmarks")]
struct Args {
    #[command(flatten)]
    shape: StateShape,
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
    config.checkpoints.interval = Some(args.shape.interval());
    config.checkpoints.storage.url = args.checkpoint_dir.clone();
    let env = StreamEnv::with_config(config.with_env_overrides()?);
    add_pipeline(&env, args.shape.source(u64::MAX));
    env.execute("big-state")?;
    Ok(())
}

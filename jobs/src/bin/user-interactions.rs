//! `user-interactions`: web interactions → count per user and event type in 1-minute
//! windows → Kafka, exactly once. `user-interactions produce` writes simulated
//! interactions into the input topic.

use anyhow::Context;
use caudal::{JobConfig, StreamEnv};
use caudal_jobs::cli::KafkaArgs;
use caudal_jobs::user_interactions::{produce, UserInteractionsJob};
use caudal_operators::kafka::DeliveryGuarantee;
use clap::{Parser, Subcommand};
use std::time::Duration;

#[derive(Debug, Subcommand)]
enum Command {
    /// Write simulated interactions into the input topic (Avro, keyed by user).
    Produce {
        /// The topic written.
        #[arg(long, default_value = "prod.web.user_interactions")]
        topic: String,
        /// Distinct users.
        #[arg(long, default_value_t = 100)]
        users: u64,
        /// Interactions to write (100 ms of event time apart).
        #[arg(long, default_value_t = 10_000)]
        records: u64,
        /// Seed: the same seed gives the same interactions.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        #[command(flatten)]
        kafka: KafkaArgs,
    },
}

/// Counts web interactions per user and event type in 1-minute windows.
#[derive(Debug, Parser)]
#[command(version, about, args_conflicts_with_subcommands = true)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// The topic read.
    #[arg(long, default_value = "prod.web.user_interactions")]
    input_topic: String,
    /// The topic written.
    #[arg(long, default_value = "prod.web.user_interaction_counts")]
    output_topic: String,
    /// Read up to the end offsets present at start, then finish.
    #[arg(long)]
    bounded: bool,
    /// Window length in seconds.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    window_secs: u64,
    /// Parallelism of every operator.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=128))]
    parallelism: u32,
    /// Seconds between checkpoints (the output is committed at each).
    #[arg(long, default_value_t = 60.0)]
    checkpoint_interval: f64,
    /// Checkpoint storage: a directory, file:///path or s3://bucket/prefix.
    #[arg(long, default_value = "data/checkpoints")]
    checkpoint_dir: String,
    /// Restore from `latest` or a checkpoint directory before running.
    #[arg(long)]
    restore: Option<String>,
    /// With --restore: drop the state of operators the checkpoint has and this job no longer
    /// has (by uid), with a warning each, instead of refusing to restore.
    #[arg(long)]
    allow_non_restored_state: bool,
    /// Prefix of the sink's transactional ids (default: job and operator names).
    #[arg(long)]
    transactional_id_prefix: Option<String>,
    /// Address of the web UI and REST API.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8081")]
    ui_bind: std::net::SocketAddr,
    /// A host name the web UI answers to besides IP addresses and localhost (repeatable);
    /// requests naming any other host are refused (DNS rebinding).
    #[arg(long = "ui-allowed-host", value_name = "NAME")]
    ui_allowed_hosts: Vec<String>,
    /// A secret file (e.g. `openssl rand -hex 32 > FILE`) every request to the web UI and
    /// REST API must carry (bearer token, or sign in with it); required off loopback.
    #[arg(long, value_name = "FILE", env = "CAUDAL__WEB_SECRET_FILE")]
    ui_secret_file: Option<std::path::PathBuf>,
    /// Run without the web UI.
    #[arg(long)]
    no_ui: bool,
    #[command(flatten)]
    kafka: KafkaArgs,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(Command::Produce { topic, users, records, seed, kafka }) = &args.command {
        let config = JobConfig { web_bind: None, progress_interval: None, ..JobConfig::default() };
        let result = produce(
            (&kafka.brokers, &kafka.for_producers()?),
            &kafka.registry()?,
            topic,
            (*users, *records, *seed),
            config.with_env_overrides()?,
        )
        .context("producing interactions")?;
        eprintln!(
            "user-interactions produce: {records} interactions into `{topic}` in {:.1}s",
            result.elapsed.as_secs_f64()
        );
        return Ok(());
    }
    let mut config = JobConfig {
        parallelism: args.parallelism,
        web_bind: (!args.no_ui).then_some(args.ui_bind),
        web_allowed_hosts: args.ui_allowed_hosts.clone(),
        web_secret_file: args.ui_secret_file.clone(),
        progress_interval: None,
        ..JobConfig::default()
    };
    config.checkpoints.interval =
        (args.checkpoint_interval > 0.0).then(|| Duration::from_secs_f64(args.checkpoint_interval));
    config.checkpoints.storage.url = args.checkpoint_dir.clone();
    config.checkpoints.restore = args.restore.as_deref().map(str::parse).transpose()?;
    config.checkpoints.allow_non_restored_state |= args.allow_non_restored_state;
    let job = UserInteractionsJob {
        brokers: args.kafka.brokers.clone(),
        schema_registry: args.kafka.registry()?,
        input_topic: args.input_topic.clone(),
        output_topic: args.output_topic.clone(),
        bounded: args.bounded,
        window: Duration::from_secs(args.window_secs),
        delivery: DeliveryGuarantee::ExactlyOnce,
        transactional_id_prefix: args.transactional_id_prefix.clone(),
        consumer_properties: args.kafka.for_consumers()?,
        producer_properties: args.kafka.for_producers()?,
    };
    let env = StreamEnv::with_config(config.with_env_overrides()?);
    job.build(&env).context("building the user-interactions job")?;
    let result = env.execute("user-interactions").context("user-interactions job failed")?;
    eprintln!("user-interactions: finished in {:.1}s", result.elapsed.as_secs_f64());
    Ok(())
}

//! `caudal-topic` (also reached as `caudal topic …`): Kafka topics as the reference platform
//! sizes and watches them.
//!
//! ```text
//! caudal topic create NAME --partitions N [--replication R] [--config K=V]...
//! caudal topic create NAME --target-rate R --per-partition-rate r [--parallelism P] [...]
//! caudal topic describe NAME
//! ```
//!
//! The sizing rule of the reference platform: at least R/r partitions (the target rate over
//! what one partition sustains), and at least the consumer parallelism (a subtask without a
//! partition idles). `describe` shows partitions, leaders, replicas and in-sync replicas,
//! the topic's non-default configs, low and end offsets, and every consumer group with
//! committed offsets on the topic, with its lag. `--brokers` (default
//! `$CAUDAL_KAFKA_BROKERS`, else 127.0.0.1:9092); `--kafka-config FILE` (default
//! `$CAUDAL_KAFKA_CONFIG`) and `--kafka-property K=V` as the jobs take them (a secured cluster). Exit status 0: done; 1: Kafka refused or
//! failed; 2: bad usage.

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "usage: caudal topic create NAME (--partitions N | --target-rate R --per-partition-rate r [--parallelism P]) \
[--replication R] [--config K=V]... [--brokers B] [--kafka-config FILE] [--kafka-property K=V]...\n       \
caudal topic describe NAME [--brokers B] [--kafka-config FILE] [--kafka-property K=V]...";
const TIMEOUT: Duration = Duration::from_secs(15);

/// A line of the answer (written out at the end: a closed pipe, as `| head`, is no error).
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($out, $($arg)*);
    }};
}

#[derive(Debug, Default)]
struct Args {
    command: String,
    topic: String,
    brokers: String,
    /// The client properties: `--kafka-config`'s Kafka keys, then `--kafka-property`.
    kafka: Vec<(String, String)>,
    partitions: Option<i32>,
    replication: i32,
    configs: Vec<(String, String)>,
    target_rate: Option<f64>,
    per_partition_rate: Option<f64>,
    parallelism: Option<i32>,
}

fn number<T: std::str::FromStr>(flag: &str, v: Option<&String>) -> Result<T, String> {
    let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
    v.parse().map_err(|_| format!("{flag}: `{v}` is not a number"))
}

fn parse(argv: &[String]) -> Result<Args, String> {
    let mut it = argv.iter();
    let command = match it.next().map(String::as_str) {
        Some(c @ ("create" | "describe")) => c.to_string(),
        Some("-h" | "--help") | None => return Err(USAGE.into()),
        Some(other) => return Err(format!("unknown command `{other}`\n{USAGE}")),
    };
    let mut a = Args {
        command,
        replication: 1,
        brokers: std::env::var("CAUDAL_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into()),
        ..Args::default()
    };
    let mut config = std::env::var("CAUDAL_KAFKA_CONFIG").ok().filter(|c| !c.is_empty());
    let mut extra = Vec::new();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--partitions" => a.partitions = Some(number(arg, it.next())?),
            "--replication" => a.replication = number(arg, it.next())?,
            "--target-rate" => a.target_rate = Some(number(arg, it.next())?),
            "--per-partition-rate" => a.per_partition_rate = Some(number(arg, it.next())?),
            "--parallelism" => a.parallelism = Some(number(arg, it.next())?),
            "--brokers" => a.brokers = it.next().cloned().ok_or("--brokers needs a value")?,
            "--kafka-config" => config = Some(it.next().cloned().ok_or("--kafka-config needs a file")?),
            "--kafka-property" => {
                let kv = it.next().ok_or("--kafka-property needs KEY=VALUE")?;
                extra.push(caudal_operators::kafka::properties::parse_property(kv)?);
            }
            "--config" => {
                let kv = it.next().ok_or("--config needs KEY=VALUE")?;
                let (k, v) = kv.split_once('=').ok_or_else(|| format!("--config `{kv}` is not KEY=VALUE"))?;
                a.configs.push((k.to_string(), v.to_string()));
            }
            flag if flag.starts_with("--") => return Err(format!("unknown flag `{flag}`\n{USAGE}")),
            name if a.topic.is_empty() => a.topic = name.to_string(),
            extra => return Err(format!("unexpected `{extra}`\n{USAGE}")),
        }
    }
    if a.topic.is_empty() {
        return Err(format!("no topic named\n{USAGE}"));
    }
    if let Some(path) = config {
        a.kafka = caudal_operators::kafka::ClientProperties::load(std::path::Path::new(&path))
            .map_err(|e| e.to_string())?
            .kafka;
    }
    a.kafka.extend(extra);
    let by_rate = a.target_rate.is_some() && a.per_partition_rate.is_some();
    if a.command == "create" && a.partitions.is_some() == by_rate {
        return Err(format!("give --partitions N, or --target-rate and --per-partition-rate\n{USAGE}"));
    }
    Ok(a)
}

/// The reference platform's rule: at least `target / per_partition` partitions, and at
/// least the consumer parallelism.
fn sized(target: f64, per_partition: f64, parallelism: i32) -> Result<i32, String> {
    if !(target > 0.0 && per_partition > 0.0) {
        return Err("--target-rate and --per-partition-rate must be positive".into());
    }
    let by_rate = (target / per_partition).ceil();
    if by_rate > f64::from(i32::MAX) {
        return Err("that many partitions is beyond what Kafka allows".into());
    }
    Ok((by_rate as i32).max(parallelism).max(1))
}

impl Args {
    /// A client of the brokers with the user's properties.
    fn client(&self) -> ClientConfig {
        let mut client = ClientConfig::new();
        client.set("bootstrap.servers", &self.brokers);
        for (k, v) in &self.kafka {
            client.set(k, v);
        }
        client
    }
}

fn admin(a: &Args) -> Result<AdminClient<DefaultClientContext>, String> {
    a.client().create().map_err(|e| e.to_string())
}

fn create(a: &Args, out: &mut String) -> Result<(), String> {
    let partitions = match (a.partitions, a.target_rate, a.per_partition_rate) {
        (Some(n), None, None) if n > 0 => n,
        (Some(_), None, None) => return Err("--partitions must be at least 1".into()),
        (None, Some(target), Some(per)) => {
            let parallelism = a.parallelism.unwrap_or(1);
            let n = sized(target, per, parallelism)?;
            say!(out,
                "sizing: at least {target}/{per} = {} partitions for the rate, at least {parallelism} for the \
                 consumer parallelism: {n}",
                (target / per).ceil()
            );
            n
        }
        _ => return Err(format!("give --partitions N, or --target-rate and --per-partition-rate\n{USAGE}")),
    };
    let mut topic = NewTopic::new(&a.topic, partitions, TopicReplication::Fixed(a.replication));
    for (k, v) in &a.configs {
        topic = topic.set(k, v);
    }
    let admin = admin(a)?;
    let results = futures::executor::block_on(
        admin.create_topics(&[topic], &AdminOptions::new().operation_timeout(Some(TIMEOUT))),
    )
    .map_err(|e| format!("creating `{}` on {}: {e}", a.topic, a.brokers))?;
    for r in results {
        r.map_err(|(t, e)| format!("creating `{t}`: {e}"))?;
    }
    say!(out, "created `{}`: {partitions} partitions, replication {}", a.topic, a.replication);
    Ok(())
}

fn describe(a: &Args, out: &mut String) -> Result<(), String> {
    let consumer: BaseConsumer = a.client().create().map_err(|e| e.to_string())?;
    let metadata = consumer
        .fetch_metadata(Some(&a.topic), TIMEOUT)
        .map_err(|e| format!("reading metadata from {}: {e}", a.brokers))?;
    let topic = metadata
        .topics()
        .iter()
        .find(|t| t.name() == a.topic && t.error().is_none())
        .ok_or_else(|| format!("topic `{}` does not exist on {}", a.topic, a.brokers))?;
    let mut ends = Vec::new();
    say!(out, "topic {}: {} partitions", a.topic, topic.partitions().len());
    say!(out, "partition  leader  replicas  in-sync  low offset  end offset");
    for p in topic.partitions() {
        let (low, high) = consumer.fetch_watermarks(&a.topic, p.id(), TIMEOUT).map_err(|e| e.to_string())?;
        ends.push((p.id(), high));
        let under = if p.isr().len() < p.replicas().len() { "  under-replicated" } else { "" };
        say!(
            out,
            "{:>9}  {:>6}  {:>8}  {:>7}  {low:>10}  {high:>10}{under}",
            p.id(),
            p.leader(),
            format!("{:?}", p.replicas()),
            format!("{:?}", p.isr())
        );
    }
    let admin = admin(a)?;
    let configs = futures::executor::block_on(
        admin.describe_configs(&[ResourceSpecifier::Topic(&a.topic)], &AdminOptions::new()),
    )
    .map_err(|e| format!("reading the configs of `{}`: {e}", a.topic))?;
    say!(out, "configs (not default):");
    for resource in configs.into_iter().flatten() {
        for entry in resource.entries.iter().filter(|e| !e.is_default) {
            say!(out, "  {}={}", entry.name, entry.value.as_deref().unwrap_or(""));
        }
    }
    let groups =
        consumer.fetch_group_list(None, TIMEOUT).map_err(|e| format!("listing consumer groups: {e}"))?;
    say!(out, "consumer groups with offsets on it (lag = end offset - committed):");
    let mut any = false;
    for group in groups.groups() {
        let reader: BaseConsumer =
            a.client().set("group.id", group.name()).create().map_err(|e| e.to_string())?;
        let mut tpl = TopicPartitionList::new();
        for (p, _) in &ends {
            tpl.add_partition(&a.topic, *p);
        }
        let Ok(committed) = reader.committed_offsets(tpl, TIMEOUT) else { continue };
        let offsets: Vec<(i32, i64)> = committed
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some((e.partition(), o)),
                _ => None,
            })
            .collect();
        if offsets.is_empty() {
            continue;
        }
        any = true;
        let lag: i64 = offsets
            .iter()
            .map(|(p, o)| ends.iter().find(|(q, _)| q == p).map_or(0, |(_, end)| (end - o).max(0)))
            .sum();
        let each: Vec<String> = offsets.iter().map(|(p, o)| format!("{p}:{o}")).collect();
        say!(out, "  {}  lag {lag}  committed {}", group.name(), each.join(" "));
    }
    if !any {
        say!(out, "  (none)");
    }
    Ok(())
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let mut out = String::new();
    let done = if args.command == "create" { create(&args, &mut out) } else { describe(&args, &mut out) };
    let _ = std::io::Write::write_all(&mut std::io::stdout(), out.as_bytes());
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("caudal topic: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sizing_rule_takes_the_rate_and_the_parallelism() {
        assert_eq!(sized(100_000.0, 10_000.0, 4), Ok(10));
        assert_eq!(sized(100_000.0, 30_000.0, 1), Ok(4));
        assert_eq!(sized(1_000.0, 10_000.0, 6), Ok(6));
        assert!(sized(0.0, 1.0, 1).is_err());
    }

    #[test]
    fn bad_usage_is_said() {
        let args = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(parse(&args(&["create"])).unwrap_err().contains("no topic"));
        assert!(parse(&args(&["create", "t", "--partitions", "x"])).unwrap_err().contains("not a number"));
        assert!(parse(&args(&["drop", "t"])).unwrap_err().contains("unknown command"));
        assert!(parse(&args(&["create", "t"])).unwrap_err().contains("--partitions N"));
        let a = parse(&args(&["create", "t", "--partitions", "3", "--config", "retention.ms=1000"])).unwrap();
        assert_eq!((a.partitions, a.configs.len()), (Some(3), 1));
    }
}

//! One source subtask: its partitions, their offsets, decoding and dead letters.

use super::bad_records::BadRecordBudget;
use super::decode::{DecodeError, KafkaDecoder};
use super::{KafkaSourceConfig, StartFrom};
use crate::kafka::health::{Probed, HEALTH_INTERVAL};
use crate::kafka::DeadLetter;
use caudal::metrics::kafka_client_settings::CONSUMER;
use caudal::metrics::kafka_gauges;
use caudal::types::MIN_WATERMARK;
use caudal::{CheckpointId, Error, Result, SourceContext, SourceOutput, SourcePoll, SourceReader};
use parking_lot::RwLock;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::statistics::Statistics;
use rdkafka::ClientContext;
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The consumer's `fetch.queue.backoff.ms` unless the job sets it (`--consumer-property`).
const FETCH_QUEUE_BACKOFF_MS: &str = "10";

const METADATA_TIMEOUT: Duration = Duration::from_secs(30);

/// The gauges of one partition (named by `caudal::metrics::kafka_gauges`; negative means
/// "not known yet", which the REST API shows as null).
#[derive(Clone)]
struct PartitionGauges {
    end_offset: Arc<AtomicI64>,
    checkpointed: Arc<AtomicI64>,
    lag: Arc<AtomicI64>,
    watermark: Arc<AtomicI64>,
}

impl PartitionGauges {
    /// The gauges of `partition` of `topic` in the subtask's `metrics`, all unknown (-1).
    fn new(metrics: &caudal::metrics::SubtaskMetrics, topic: &str, partition: i32) -> Self {
        let gauge = |what: &str| metrics.gauge(kafka_gauges::name(topic, partition, what));
        let gauges = PartitionGauges {
            end_offset: gauge(kafka_gauges::END_OFFSET),
            checkpointed: gauge(kafka_gauges::CHECKPOINTED_OFFSET),
            lag: gauge(kafka_gauges::LAG),
            watermark: gauge(kafka_gauges::WATERMARK),
        };
        for g in [&gauges.end_offset, &gauges.checkpointed, &gauges.lag, &gauges.watermark] {
            g.store(-1, Ordering::Relaxed);
        }
        gauges
    }

    /// Recompute the lag from the end offset and the checkpointed offset (none yet counts
    /// as 0); it stays unknown until the first statistics give the end offset.
    fn update_lag(&self) {
        let end = self.end_offset.load(Ordering::Relaxed);
        if end >= 0 {
            let done = self.checkpointed.load(Ordering::Relaxed).max(0);
            self.lag.store((end - done).max(0), Ordering::Relaxed);
        }
    }
}

/// Receives librdkafka's statistics (on the polling thread, every `lag_interval`) and
/// turns them into end-offset and lag gauges, without a blocking broker call.
struct LagContext {
    topic: String,
    partitions: RwLock<BTreeMap<i32, PartitionGauges>>,
}

impl ClientContext for LagContext {
    fn stats(&self, statistics: Statistics) {
        let Some(topic) = statistics.topics.get(&self.topic) else { return };
        let gauges = self.partitions.read();
        for (p, stats) in &topic.partitions {
            if let Some(g) = gauges.get(p) {
                // The last stable offset: what a read_committed reader can reach.
                let end = if stats.ls_offset >= 0 { stats.ls_offset } else { stats.hi_offset };
                if end >= 0 {
                    g.end_offset.store(end, Ordering::Relaxed);
                    g.update_lag();
                }
            }
        }
    }
}

impl ConsumerContext for LagContext {}

/// What a source subtask puts in a checkpoint: the next offset of each of its partitions
/// (every one, read from or not), and for a bounded source where each partition ends.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Positions {
    topic: String,
    offsets: BTreeMap<i32, i64>,
    /// Bounded: the end offset of each partition, fixed when the job first started, so that
    /// a restored run reads up to the same offsets as an uninterrupted one even when the
    /// topic grew meanwhile.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    ends: BTreeMap<i32, i64>,
    /// How many partitions the topic had as far as the reader knew (at its start, or
    /// since discovered): a partition numbered past them was added after this snapshot.
    /// Absent in snapshots of older releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    topic_partitions: Option<i32>,
}

impl Positions {
    /// The positions of `topic` in the restored snapshots of this subtask (all of them
    /// after a rescale: each holds some partitions).
    fn restored(topic: &str, blobs: &[Vec<u8>]) -> Result<Positions> {
        let mut all = Positions { topic: topic.to_owned(), ..Positions::default() };
        for blob in blobs {
            let positions: Positions = serde_json::from_slice(blob).map_err(|e| {
                Error::CorruptState(format!(
                    "kafka source `{topic}`: the checkpointed offsets are corrupt: {e}"
                ))
            })?;
            if positions.topic == topic {
                all.offsets.extend(positions.offsets);
                all.ends.extend(positions.ends);
                all.topic_partitions = all.topic_partitions.max(positions.topic_partitions);
            }
        }
        Ok(all)
    }

    /// `partition` was added to the topic after the snapshot these positions come from, so
    /// a restored reader reads it from its beginning, as the running one did (or would
    /// have, had it found it before the failure), whatever the start policy.
    fn added_since(&self, partition: i32) -> bool {
        self.topic_partitions.is_some_and(|known| partition >= known)
    }
}

/// Per-partition state and gauges.
struct PartitionState {
    partition: i32,
    /// The next offset to read: restored, committed, or where `StartFrom` put it at open
    /// (resolved to an offset then, so every snapshot has it).
    next: i64,
    /// Bounded: stop before this offset.
    end: Option<i64>,
    /// Where the consumer stood when it last reached the partition's end: past `next` when
    /// transaction markers follow the last record (they take offsets but are no records).
    reached_end_at: i64,
    /// Bounded: the wait for an open transaction below the end was logged.
    waiting_logged: bool,
    finished: bool,
    gauges: PartitionGauges,
}

impl PartitionState {
    fn new(partition: i32, next: i64, end: Option<i64>, gauges: PartitionGauges) -> Self {
        PartitionState {
            partition,
            next,
            end,
            reached_end_at: -1,
            waiting_logged: false,
            finished: false,
            gauges,
        }
    }

    /// Bounded: everything below the end was read or stepped over. The consumer reaching
    /// the end it can see is not enough: a transaction open below the end stops a
    /// `read_committed` consumer there until it commits (its records then follow) or
    /// aborts.
    fn read_to_end(&self) -> bool {
        self.end.is_some_and(|end| self.read_up_to() >= end)
    }

    /// How far the partition is read: the next record's offset, or where the consumer
    /// stood when it last reached the end, whichever is further.
    fn read_up_to(&self) -> i64 {
        self.next.max(self.reached_end_at)
    }

    /// Records past the position are known to exist (the bounded end, or the end offset the
    /// last statistics gave): a silent partition is then stalled, not idle. The position is
    /// the next record's offset or, once the consumer reached the end, where it stood then:
    /// a quiet partition written by a transactional producer (another exactly-once job)
    /// ends in a commit marker, and counting that as backlog would hold the watermark back
    /// for good.
    fn has_backlog(&self) -> bool {
        let end = self.end.unwrap_or_else(|| self.gauges.end_offset.load(Ordering::Relaxed));
        end > self.read_up_to()
    }
}

/// Reads the partitions of one subtask.
pub struct KafkaSourceReader<T> {
    consumer: BaseConsumer<LagContext>,
    topic: String,
    bounded: bool,
    partitions: Vec<PartitionState>,
    decoder: Box<dyn KafkaDecoder<T>>,
    /// The source operator's name (in dead letters).
    operator: String,
    bad_records: Arc<AtomicU64>,
    budget: BadRecordBudget,
    /// The subtask's counters (bytes read: keys and values as they come from the broker).
    metrics: Arc<caudal::metrics::SubtaskMetrics>,
    last_positions: Option<Positions>,
    /// Per partition, what the last snapshot covers for the lag gauge (see [`Self::covered`]).
    last_covered: BTreeMap<i32, i64>,
    /// Leader, replicas and in-sync replicas of this subtask's partitions; the topic's
    /// partition ids (for discovery).
    health: Option<crate::kafka::health::HealthProbe>,
    /// Which partitions are this subtask's.
    probed: Probed,
    /// How often partitions added to the topic are looked for (`None`: never; bounded).
    discovery: Option<Duration>,
    last_discovery: Instant,
    /// How many partitions the topic has, as far as this reader knows (checkpointed: a
    /// restore reads partitions added since from their beginning).
    topic_partitions: i32,
}

impl<T> std::fmt::Debug for KafkaSourceReader<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KafkaSourceReader({} {:?})",
            self.topic,
            self.partitions.iter().map(|p| p.partition).collect::<Vec<_>>()
        )
    }
}

/// The consumer's settings: the source's defaults, then the user's properties over them.
fn consumer_config(config: &KafkaSourceConfig, group: &str) -> ClientConfig {
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &config.brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        // librdkafka pauses fetching a partition this long once its local queue holds
        // `queued.min.messages`; at its default (1 s) the reader drains the queue well
        // before and then waits: 155 k records/s where it reads 1.6 M with 10 ms
        // (benches/README.md, "Where the Kafka path waited").
        .set("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS)
        .set("statistics.interval.ms", config.lag_interval.as_millis().max(100).to_string())
        .set(
            "auto.offset.reset",
            match config.start_from {
                StartFrom::Earliest | StartFrom::Committed => "earliest",
                StartFrom::Latest => "latest",
            },
        );
    for (k, v) in &config.properties {
        client.set(k, v);
    }
    client
}

/// The topic's partitions this subtask reads (partition `p` goes to subtask `p % parallelism`),
/// and how many partitions the topic has.
fn partitions_of_subtask(
    consumer: &BaseConsumer<LagContext>,
    config: &KafkaSourceConfig,
    ctx: &SourceContext,
) -> Result<(Vec<i32>, i32)> {
    let topic = config.topic.as_str();
    let metadata = consumer
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
        .map_err(kafka_error(topic, &format!("reading metadata from {}", config.brokers)))?;
    let all: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if all.is_empty() {
        return Err(Error::Config {
            setting: "input-topic".into(),
            message: format!("topic `{topic}` does not exist on {} (create it first)", config.brokers),
        });
    }
    let count = all.iter().max().map_or(0, |p| p + 1);
    let mut mine: Vec<i32> = all
        .into_iter()
        .filter(|p| u32::try_from(*p).is_ok_and(|p| p % ctx.parallelism.max(1) == ctx.subtask))
        .collect();
    mine.sort_unstable();
    Ok((mine, count))
}

/// The consumer group's committed offsets of `partitions` (those it has).
fn committed_offsets(
    consumer: &BaseConsumer<LagContext>,
    topic: &str,
    partitions: &[i32],
) -> Result<BTreeMap<i32, i64>> {
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        tpl.add_partition(topic, *p);
    }
    Ok(consumer
        .committed_offsets(tpl, METADATA_TIMEOUT)
        .map_err(kafka_error(topic, "reading the group's committed offsets"))?
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect())
}

/// Decides where each of `mine` starts (restored offset, else the group's committed one,
/// else `StartFrom`; a partition added to the topic after the restored checkpoint from its
/// beginning) and where a bounded read ends, and assigns them to the consumer.
fn assign(
    consumer: &BaseConsumer<LagContext>,
    config: &KafkaSourceConfig,
    ctx: &SourceContext,
    mine: Vec<i32>,
    restored: &Positions,
    committed: &BTreeMap<i32, i64>,
) -> Result<Vec<PartitionState>> {
    let topic = config.topic.as_str();
    let ends = if config.bounded { Some(EndProbe::new(config)?) } else { None };
    let mut partitions = Vec::with_capacity(mine.len());
    let mut assignment = TopicPartitionList::new();
    for p in mine {
        let known = restored.offsets.get(&p).or_else(|| committed.get(&p)).copied();
        let end = match (&ends, restored.ends.get(&p)) {
            (None, _) => None,
            (Some(_), Some(end)) => Some(*end),
            (Some(probe), None) => Some(probe.end_of(topic, p)?),
        };
        // Where a partition not read before starts, as an offset: a snapshot taken before
        // its first record then still says where it starts (else a restore would apply
        // `StartFrom` again: `Latest` would skip what came since the first start).
        let next = match known {
            Some(o) => o,
            None => {
                let (low, high) = consumer
                    .fetch_watermarks(topic, p, METADATA_TIMEOUT)
                    .map_err(kafka_error(topic, &format!("reading the offsets of partition {p}")))?;
                if restored.added_since(p) {
                    tracing::info!(
                        "caudal: kafka source `{topic}`: partition {p} was added to the topic after the \
                         restored checkpoint: reading it from its beginning"
                    );
                    low
                } else {
                    match config.start_from {
                        StartFrom::Earliest | StartFrom::Committed => low,
                        StartFrom::Latest => high,
                    }
                }
            }
        };
        assignment
            .add_partition_offset(topic, p, Offset::Offset(next))
            .map_err(kafka_error(topic, "assigning partitions"))?;
        // Unknown until the first statistics / the first checkpoint (or the restored one).
        let gauges = PartitionGauges::new(&ctx.metrics, topic, p);
        gauges.checkpointed.store(known.unwrap_or(-1), Ordering::Relaxed);
        consumer.context().partitions.write().insert(p, gauges.clone());
        partitions.push(PartitionState::new(p, next, end, gauges));
    }
    consumer.assign(&assignment).map_err(kafka_error(topic, "assigning partitions"))?;
    Ok(partitions)
}

/// Where a bounded read of a partition ends: its high watermark at the first start, the
/// records of transactions still open then included. A `read_committed` consumer's own
/// end offsets stop at the first open transaction (the last stable offset), which would
/// leave out what that transaction commits later and every record committed after it.
struct EndProbe(BaseConsumer);

impl EndProbe {
    fn new(config: &KafkaSourceConfig) -> Result<Self> {
        let mut settings = ClientConfig::new();
        settings.set("bootstrap.servers", &config.brokers);
        for (k, v) in &config.properties {
            settings.set(k, v);
        }
        settings.set("isolation.level", "read_uncommitted");
        settings
            .create()
            .map(EndProbe)
            .map_err(|e| Error::Config { setting: "kafka consumer".into(), message: e.to_string() })
    }

    fn end_of(&self, topic: &str, partition: i32) -> Result<i64> {
        self.0
            .fetch_watermarks(topic, partition, METADATA_TIMEOUT)
            .map(|(_, high)| high)
            .map_err(kafka_error(topic, &format!("reading the end offset of partition {partition}")))
    }
}

fn kafka_error<'a>(topic: &'a str, what: &str) -> impl Fn(KafkaError) -> Error + 'a {
    let what = what.to_owned();
    move |e| Error::external("kafka", format!("kafka source `{topic}`: {what}: {e}"))
}

impl<T> KafkaSourceReader<T> {
    /// Connects, finds this subtask's partitions and where each starts.
    pub fn open(
        config: &KafkaSourceConfig,
        decoder: Box<dyn KafkaDecoder<T>>,
        ctx: &SourceContext,
        restored: &[Vec<u8>],
    ) -> Result<Self> {
        let topic = config.topic.as_str();
        let group = config
            .group_id
            .clone()
            .unwrap_or_else(|| format!("caudal-{}-{}", ctx.job_name, ctx.operator_name));
        crate::kafka::properties::check_consumer_properties(&config.properties)?;
        crate::kafka::check_access(
            &config.brokers,
            &config.properties,
            &format!("kafka source of `{topic}`"),
        )?;
        let context = LagContext { topic: topic.to_owned(), partitions: RwLock::new(BTreeMap::new()) };
        let settings = consumer_config(config, &group);
        crate::kafka::properties::publish_effective(&settings, CONSUMER, &ctx.metrics);
        let consumer: BaseConsumer<LagContext> = settings
            .create_with_context(context)
            .map_err(|e| Error::Config { setting: "kafka consumer".into(), message: e.to_string() })?;
        let (mine, topic_partitions) = partitions_of_subtask(&consumer, config, ctx)?;
        let checkpointed = Positions::restored(topic, restored)?;
        let committed = if restored.is_empty() && config.start_from == StartFrom::Committed {
            committed_offsets(&consumer, topic, &mine)?
        } else {
            BTreeMap::new()
        };
        let partitions = assign(&consumer, config, ctx, mine, &checkpointed, &committed)?;
        let probed = Probed::OfSubtask { subtask: ctx.subtask, parallelism: ctx.parallelism };
        let discovery = config.partition_discovery.filter(|_| !config.bounded);
        let health = crate::kafka::health::HealthProbe::start(
            &config.brokers,
            &config.properties,
            topic,
            probed,
            discovery.map_or(HEALTH_INTERVAL, |d| d.min(HEALTH_INTERVAL)),
            ctx.metrics.clone(),
        );
        let mut reader = KafkaSourceReader {
            consumer,
            topic: topic.to_owned(),
            bounded: config.bounded,
            partitions,
            decoder,
            operator: ctx.operator_name.clone(),
            bad_records: ctx.metrics.counter("bad_records"),
            budget: BadRecordBudget::new(topic, config.max_bad_records_per_minute),
            metrics: ctx.metrics.clone(),
            last_positions: None,
            last_covered: BTreeMap::new(),
            health,
            probed,
            discovery,
            last_discovery: Instant::now(),
            topic_partitions,
        };
        for i in 0..reader.partitions.len() {
            let done = reader.partitions[i].end.is_some_and(|e| reader.partitions[i].next >= e);
            if done {
                reader.finish(i)?;
            }
        }
        Ok(reader)
    }

    fn finish(&mut self, i: usize) -> Result<()> {
        let p = &mut self.partitions[i];
        if !p.finished {
            p.finished = true;
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&self.topic, p.partition);
            self.consumer.pause(&tpl).map_err(kafka_error(&self.topic, "pausing a finished partition"))?;
        }
        Ok(())
    }

    /// Partitions of this subtask that were added to the topic since the reader started (as
    /// the health probe last saw the topic): assigned from their beginning, and from then on
    /// read, watermarked and checkpointed like the others (a new split each).
    fn discover(&mut self) -> Result<()> {
        let (Some(every), Some(health)) = (self.discovery, &self.health) else { return Ok(()) };
        if self.last_discovery.elapsed() < every {
            return Ok(());
        }
        self.last_discovery = Instant::now();
        let all = health.partitions();
        self.topic_partitions = all.iter().map(|p| p + 1).fold(self.topic_partitions, i32::max);
        let added: Vec<i32> =
            all.into_iter().filter(|p| self.probed.covers(*p) && self.split_of(*p).is_none()).collect();
        if added.is_empty() {
            return Ok(());
        }
        for p in &added {
            let gauges = PartitionGauges::new(&self.metrics, &self.topic, *p);
            self.consumer.context().partitions.write().insert(*p, gauges.clone());
            self.partitions.push(PartitionState::new(*p, 0, None, gauges));
        }
        // The whole assignment again, every partition where the reader is: librdkafka drops
        // what it had fetched past that, so nothing is read twice.
        let mut assignment = TopicPartitionList::new();
        for p in &self.partitions {
            let at = if added.contains(&p.partition) { Offset::Beginning } else { Offset::Offset(p.next) };
            assignment
                .add_partition_offset(&self.topic, p.partition, at)
                .map_err(kafka_error(&self.topic, "assigning partitions"))?;
        }
        self.consumer.assign(&assignment).map_err(kafka_error(&self.topic, "assigning added partitions"))?;
        tracing::info!(
            "caudal: kafka source `{}`: partition(s) {added:?} were added to the topic: reading them from their beginning",
            self.topic
        );
        Ok(())
    }

    /// The consumer reached the end of `partition`: remember where it stands (past the
    /// transaction markers that follow the last record, which it stepped over).
    /// Returns the partition's split.
    fn reached_end(&mut self, partition: i32) -> Option<usize> {
        let i = self.split_of(partition)?;
        let at = self.consumer_positions().get(&partition).copied().unwrap_or(-1);
        let p = &mut self.partitions[i];
        p.reached_end_at = p.reached_end_at.max(at);
        if p.end.is_some() && !p.read_to_end() && !p.waiting_logged {
            p.waiting_logged = true;
            tracing::info!(
                "caudal: kafka source `{}`: partition {partition} holds records of a transaction still open \
                 below its end offset {}: waiting until it commits or aborts",
                self.topic,
                p.end.unwrap_or_default()
            );
        }
        Some(i)
    }

    /// The consumer's position in each assigned partition that has one.
    fn consumer_positions(&self) -> BTreeMap<i32, i64> {
        match self.consumer.position() {
            Ok(tpl) => tpl
                .elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(o) => Some((e.partition(), o)),
                    _ => None,
                })
                .collect(),
            Err(_) => BTreeMap::new(),
        }
    }

    fn split_of(&self, partition: i32) -> Option<usize> {
        self.partitions.iter().position(|p| p.partition == partition)
    }

    /// Per partition, the offset a snapshot of `positions` covers for the lag: its next
    /// offset, or the consumer's position when that is further because the consumer stepped
    /// over transaction markers after the last record (they take an offset but are no
    /// record: without this a transactional input would show a lag of 1 forever).
    /// Finished partitions keep their next offset (records past a bounded end are skipped).
    fn covered(&self, positions: &Positions) -> BTreeMap<i32, i64> {
        let consumer_at = self.consumer_positions();
        positions
            .offsets
            .iter()
            .map(|(p, next)| {
                let open = self.split_of(*p).is_some_and(|i| !self.partitions[i].finished);
                let at = consumer_at.get(p).copied().filter(|_| open).unwrap_or(*next);
                (*p, at.max(*next))
            })
            .collect()
    }

    fn positions(&self) -> Positions {
        Positions {
            topic: self.topic.clone(),
            offsets: self.partitions.iter().map(|p| (p.partition, p.next)).collect(),
            ends: self.partitions.iter().filter_map(|p| p.end.map(|e| (p.partition, e))).collect(),
            topic_partitions: Some(self.topic_partitions),
        }
    }
}

impl<T: Send> SourceReader<T> for KafkaSourceReader<T> {
    fn splits(&self) -> usize {
        self.partitions.len()
    }

    fn poll(&mut self, out: &mut SourceOutput<'_, T>) -> Result<SourcePoll> {
        for (i, p) in self.partitions.iter().enumerate() {
            if p.finished {
                out.finish_split(i);
            } else if p.has_backlog() {
                out.split_has_backlog(i);
            }
        }
        if self.bounded && self.partitions.iter().all(|p| p.finished) {
            self.budget.at_end()?;
            return Ok(SourcePoll::Finished);
        }
        self.discover()?;
        let (mut read, mut bytes) = (0usize, 0usize);
        while out.capacity_left() > 0 {
            let event = match self.consumer.poll(Duration::ZERO) {
                None => break,
                Some(event) => event,
            };
            let msg = match event {
                Ok(msg) => msg,
                Err(KafkaError::PartitionEOF(partition)) => {
                    if let Some(i) = self.reached_end(partition) {
                        if self.partitions[i].read_to_end() {
                            self.finish(i)?;
                            out.finish_split(i);
                        }
                    }
                    continue;
                }
                Err(e @ KafkaError::MessageConsumptionFatal(_)) => {
                    return Err(kafka_error(&self.topic, "consuming")(e));
                }
                Err(e) => {
                    // Transient (broker down, leader moving): librdkafka retries by itself.
                    tracing::warn!("caudal: kafka source `{}`: {e}", self.topic);
                    continue;
                }
            };
            let partition = msg.partition();
            let offset = msg.offset();
            let Some(i) = self.split_of(partition) else { continue };
            let state = &self.partitions[i];
            if state.finished || state.end.is_some_and(|end| offset >= end) {
                self.finish(i)?;
                out.finish_split(i);
                continue;
            }
            read += 1;
            bytes += msg.key_len() + msg.payload_len();
            match self.decoder.decode(msg.key(), msg.payload().unwrap_or(&[])) {
                Ok(value) => {
                    self.budget.good();
                    let ts = msg.timestamp().to_millis().unwrap_or(MIN_WATERMARK);
                    out.collect_with_timestamp(i, ts, value);
                }
                Err(DecodeError::BadData(reason)) => {
                    let n = self.bad_records.fetch_add(1, Ordering::Relaxed);
                    if n < 10 || n.is_power_of_two() {
                        tracing::warn!(
                            "caudal: kafka source `{}`: bad record at partition {partition} offset {offset} \
                             ({} so far): {reason}",
                            self.topic,
                            n + 1
                        );
                    }
                    let letter = DeadLetter {
                        topic: self.topic.clone(),
                        partition,
                        offset,
                        operator: self.operator.clone(),
                        error: reason,
                        key: msg.key().map(<[u8]>::to_vec),
                        value: msg.payload().unwrap_or(&[]).to_vec(),
                    };
                    let reason = format!("partition {partition} offset {offset}: {}", letter.error);
                    self.budget.bad(&reason, Instant::now())?;
                    if let Some(value) = self.decoder.dead_letter(letter) {
                        let ts = msg.timestamp().to_millis().unwrap_or(MIN_WATERMARK);
                        out.collect_with_timestamp(i, ts, value);
                    }
                }
                Err(DecodeError::Unavailable(reason)) => {
                    return Err(Error::external(
                        "schema registry",
                        format!(
                        "kafka source `{}`: cannot decode partition {partition} offset {offset}: {reason}",
                        self.topic
                    ),
                    ));
                }
            }
            self.partitions[i].next = offset + 1;
            if self.partitions[i].end.is_some_and(|end| offset + 1 >= end) {
                self.finish(i)?;
                out.finish_split(i);
            }
        }
        if read > 0 {
            self.metrics.add_bytes_in(bytes);
            // Per-partition watermarks for the UI: a few stores per poll, not per record.
            for (i, p) in self.partitions.iter().enumerate() {
                if let Some(wm) = out.split_watermark(i).filter(|w| *w != caudal::types::MAX_WATERMARK) {
                    p.gauges.watermark.store(wm, Ordering::Relaxed);
                }
            }
            Ok(SourcePoll::Ready)
        } else if self.bounded && self.partitions.iter().all(|p| p.finished) {
            self.budget.at_end()?;
            Ok(SourcePoll::Finished)
        } else {
            Ok(SourcePoll::Pending(Duration::from_millis(10)))
        }
    }

    fn position(&mut self) -> Result<Vec<u8>> {
        let positions = self.positions();
        let blob = serde_json::to_vec(&positions);
        self.last_covered = self.covered(&positions);
        self.last_positions = Some(positions);
        blob.map_err(|e| Error::Internal(format!("kafka source `{}`: encoding offsets: {e}", self.topic)))
    }

    fn on_checkpoint_complete(&mut self, _checkpoint: CheckpointId) -> Result<()> {
        let Some(positions) = self.last_positions.take() else { return Ok(()) };
        let mut tpl = TopicPartitionList::new();
        for (p, next) in &positions.offsets {
            tpl.add_partition_offset(&self.topic, *p, Offset::Offset(*next))
                .map_err(kafka_error(&self.topic, "committing offsets"))?;
            if let Some(i) = self.split_of(*p) {
                // The lag falls now, not at the next statistics: a finished bounded
                // partition is no longer polled, so no statistics would come.
                let gauges = &self.partitions[i].gauges;
                let covered = self.last_covered.get(p).copied().unwrap_or(*next);
                gauges.checkpointed.store(covered, Ordering::Relaxed);
                gauges.update_lag();
            }
        }
        if tpl.count() > 0 {
            // For lag tools only: a failed commit is logged, never fatal.
            if let Err(e) = self.consumer.commit(&tpl, CommitMode::Async) {
                tracing::warn!("caudal: kafka source `{}`: committing offsets to the group: {e}", self.topic);
            }
        }
        Ok(())
    }
}

//! The `user-interactions` pipeline: web interactions from Kafka → count per user and
//! event type in 1-minute tumbling windows of event time → Kafka, exactly once.
//!
//! `prod.web.user_interactions` (Avro `UserInteraction`) ─► key by (user, type) ─►
//! tumbling window count ─► `prod.web.user_interaction_counts` (Avro
//! `UserInteractionCount`, keyed by user).

use caudal::{Result, StreamEnv, WatermarkStrategy};
use caudal_operators::generator::mix;
use caudal_operators::kafka::{
    AvroDecoder, AvroSerializer, DeliveryGuarantee, KafkaSinkConfig, KafkaSourceConfig,
};
use caudal_operators::window::{AggregateFunction, KeyedWindowExt, WindowAssigner};
use caudal_schemas::{EventType, RegistryAccess, UserInteraction, UserInteractionCount};
use std::time::Duration;

/// Names of the job's operators, which are also their uids (the ids of their state in
/// checkpoints).
pub mod names {
    /// The Kafka source.
    pub const SOURCE: &str = "interactions";
    /// The window operator.
    pub const WINDOWS: &str = "count-per-user-and-type";
    /// The Kafka sink.
    pub const SINK: &str = "interaction-counts";
    /// Window result → `UserInteractionCount`.
    pub const TO_COUNTS: &str = "to-counts";
}

/// Counts records.
#[derive(Debug, Clone, Copy, Default)]
pub struct Count;

impl AggregateFunction<UserInteraction> for Count {
    type Acc = i64;
    type Out = i64;

    fn create(&self) -> i64 {
        0
    }

    fn add(&self, acc: &mut i64, _: &UserInteraction) {
        *acc += 1;
    }

    fn merge(&self, acc: &mut i64, other: i64) {
        *acc += other;
    }

    fn result(&self, acc: &i64) -> i64 {
        *acc
    }
}

/// The job's settings.
#[derive(Debug, Clone)]
pub struct UserInteractionsJob {
    /// `host:port[,…]`.
    pub brokers: String,
    /// How to reach the schema registry.
    pub schema_registry: RegistryAccess,
    /// `prod.web.user_interactions`.
    pub input_topic: String,
    /// `prod.web.user_interaction_counts`.
    pub output_topic: String,
    /// Read up to the end offsets present at start, then finish.
    pub bounded: bool,
    /// The window length (1 minute).
    pub window: Duration,
    /// Exactly-once (default), at-least-once or none.
    pub delivery: DeliveryGuarantee,
    /// Prefix of the sink's transactional ids.
    pub transactional_id_prefix: Option<String>,
    /// librdkafka consumer properties of the source (checked at start).
    pub consumer_properties: Vec<(String, String)>,
    /// librdkafka producer properties of the sink (checked at start).
    pub producer_properties: Vec<(String, String)>,
}

impl UserInteractionsJob {
    /// Adds the pipeline to `env`.
    pub fn build(&self, env: &StreamEnv) -> Result<()> {
        let mut input = KafkaSourceConfig::new(&self.brokers, &self.input_topic).bounded(self.bounded);
        input.properties = self.consumer_properties.clone();
        let source = input.build(AvroDecoder::<UserInteraction>::factory(self.schema_registry.clone()))?;
        let watermarks =
            WatermarkStrategy::bounded_out_of_orderness(Duration::from_secs(5), |e: &UserInteraction| e.ts)
                .with_idleness(Duration::from_secs(30));
        let mut sink = KafkaSinkConfig::new(&self.brokers, &self.output_topic).delivery(self.delivery);
        sink.transactional_id_prefix = self.transactional_id_prefix.clone();
        sink.properties = self.producer_properties.clone();
        let registry = self.schema_registry.clone();
        env.source(names::SOURCE, source, watermarks)
            .uid(names::SOURCE)
            .key_by(|e: &UserInteraction| (e.user_id.clone(), e.event_type))
            .window(WindowAssigner::tumbling(self.window))
            .name(names::WINDOWS)
            .uid(names::WINDOWS)
            .aggregate(Count)
            .map(|w| UserInteractionCount {
                user_id: w.key.0.clone(),
                event_type: w.key.1,
                window_start: w.window.start,
                window_end: w.window.end,
                count: w.value,
            })
            .name(names::TO_COUNTS)
            .uid(names::TO_COUNTS)
            .sink(names::SINK, move |_| {
                let serializer = AvroSerializer::<UserInteractionCount>::new(registry.clone())
                    .keyed(|c| c.user_id.clone());
                sink.build(serializer)
            })
            .uid(names::SINK);
        Ok(())
    }
}

/// The `n`-th interaction of a deterministic stream: `users` users, one interaction
/// every `interval_ms` of event time from `start_ms`.
pub fn interaction(seed: u64, users: u64, n: u64, start_ms: i64, interval_ms: i64) -> UserInteraction {
    let h = mix(seed ^ mix(n));
    let user = h % users.max(1);
    let event_type = match (h >> 20) % 10 {
        0 => EventType::Purchase,
        1..=4 => EventType::Click,
        _ => EventType::View,
    };
    let page_url =
        (!(h >> 32).is_multiple_of(4)).then(|| format!("https://shop.example/p/{}", (h >> 40) % 50));
    UserInteraction {
        user_id: format!("user-{user}"),
        event_type,
        ts: start_ms + i64::try_from(n).unwrap_or(i64::MAX).saturating_mul(interval_ms),
        page_url,
    }
}

/// Writes `records` interactions into `topic` on `brokers` with the producer `properties`
/// (Avro, keyed by user, idempotent producer).
pub fn produce(
    (brokers, properties): (&str, &[(String, String)]),
    schema_registry: &RegistryAccess,
    topic: &str,
    (users, records, seed): (u64, u64, u64),
    config: caudal::JobConfig,
) -> Result<caudal::JobResult> {
    let start_ms = caudal_operators::generator::DEFAULT_BOUNDED_START_MS;
    let env = StreamEnv::with_config(config);
    let mut sink = KafkaSinkConfig::new(brokers, topic).delivery(DeliveryGuarantee::AtLeastOnce);
    sink.properties = properties.to_vec();
    let registry = schema_registry.clone();
    env.from_iter("interactions", (0..records).map(|n| interaction(seed, users, n, start_ms, 100))).sink(
        "kafka-producer",
        move |_| {
            let serializer =
                AvroSerializer::<UserInteraction>::new(registry.clone()).keyed(|e| e.user_id.clone());
            sink.build(serializer)
        },
    );
    env.execute(&format!("produce-{topic}"))
}

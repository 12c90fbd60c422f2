//! One librdkafka producer and what it delivered: the building block of the sink.

use super::config::KafkaSinkConfig;
use caudal::metrics::{kafka_producer_gauges, SubtaskMetrics};
use caudal::{Error, Result};
use parking_lot::Mutex;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, Message};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Queues `record`, serving delivery reports while librdkafka's queue is full: the
/// producer's backpressure.
fn send_waiting<C: ProducerContext<DeliveryOpaque = ()>>(
    producer: &BaseProducer<C>,
    mut record: BaseRecord<'_, [u8], [u8]>,
) -> std::result::Result<(), KafkaError> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                record = back;
                producer.poll(Duration::from_millis(50));
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// Delivery reports of one producer: the first failure is kept for the error message.
#[derive(Debug, Default)]
pub(crate) struct DeliveryWatch {
    pub(crate) delivered: AtomicU64,
    pub(crate) failed: AtomicU64,
    first_error: Mutex<Option<String>>,
}

/// librdkafka calls back here for every delivered or failed record, and with its
/// statistics (when the producer reports broker statistics).
pub(crate) struct WatchingContext(Arc<DeliveryWatch>, Option<Arc<BrokerStats>>);

impl ClientContext for WatchingContext {
    fn stats(&self, statistics: Statistics) {
        if let Some(stats) = &self.1 {
            stats.update(&statistics);
        }
    }
}

/// What a sink subtask's producers see of each broker: per (producer, broker) the last
/// statistics, published as [`kafka_producer_gauges`] (counters summed over the producers,
/// latencies the largest of their last windows).
pub(crate) struct BrokerStats {
    metrics: Arc<SubtaskMetrics>,
    last: Mutex<BTreeMap<(String, i32), [i64; 7]>>,
}

impl BrokerStats {
    pub(crate) fn new(metrics: Arc<SubtaskMetrics>) -> Arc<Self> {
        Arc::new(BrokerStats { metrics, last: Mutex::new(BTreeMap::new()) })
    }

    fn update(&self, s: &Statistics) {
        let mut last = self.last.lock();
        for b in s.brokers.values().filter(|b| b.nodeid >= 0) {
            let (p50, p99) = b.rtt.as_ref().filter(|w| w.cnt > 0).map_or((-1, -1), |w| (w.p50, w.p99));
            last.insert(
                (s.name.clone(), b.nodeid),
                [
                    p50,
                    p99,
                    b.tx as i64,
                    b.txerrs as i64,
                    b.txretries as i64,
                    b.req_timeouts as i64,
                    b.disconnects.unwrap_or(0),
                ],
            );
        }
        let mut per_broker: BTreeMap<i32, [i64; 7]> = BTreeMap::new();
        for ((_, broker), v) in last.iter() {
            kafka_producer_gauges::merge(per_broker.entry(*broker).or_insert(kafka_producer_gauges::NONE), v);
        }
        for (broker, values) in per_broker {
            for (what, value) in kafka_producer_gauges::ALL.iter().zip(values) {
                self.metrics.gauge(kafka_producer_gauges::name(broker, what)).store(value, Ordering::Relaxed);
            }
        }
    }
}

impl ProducerContext for WatchingContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => {
                self.0.delivered.fetch_add(1, Ordering::Relaxed);
            }
            Err((e, msg)) => {
                self.0.failed.fetch_add(1, Ordering::Relaxed);
                let mut first = self.0.first_error.lock();
                if first.is_none() {
                    *first = Some(format!("{e} (topic {}, partition {})", msg.topic(), msg.partition()));
                }
            }
        }
    }
}

/// A producer plus its delivery reports.
pub(crate) struct SinkProducer {
    pub(crate) producer: BaseProducer<WatchingContext>,
    pub(crate) watch: Arc<DeliveryWatch>,
    topic: String,
    timeout: Duration,
}

impl SinkProducer {
    /// A producer for `config`, transactional when `transactional_id` is given, idempotent
    /// unless delivery is `none`.
    pub(crate) fn create(
        config: &KafkaSinkConfig,
        transactional_id: Option<&str>,
        stats: Option<Arc<BrokerStats>>,
    ) -> Result<Self> {
        let client = Self::client_config(config, transactional_id, stats.is_some())?;
        let watch = Arc::new(DeliveryWatch::default());
        let producer =
            client.create_with_context(WatchingContext(watch.clone(), stats)).map_err(|e| Error::Config {
                setting: "kafka producer".into(),
                message: format!("{e} (sink into `{}`)", config.topic),
            })?;
        Ok(SinkProducer { producer, watch, topic: config.topic.clone(), timeout: config.request_timeout })
    }

    /// The settings of a producer of `config`: the sink's defaults, then the user's
    /// properties over them (checked first).
    pub(crate) fn client_config(
        config: &KafkaSinkConfig,
        transactional_id: Option<&str>,
        statistics: bool,
    ) -> Result<ClientConfig> {
        crate::kafka::properties::check_producer_properties(&config.properties, config.delivery)?;
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", &config.brokers)
            .set("acks", "all")
            .set("compression.type", "lz4")
            .set("linger.ms", "5")
            .set("message.timeout.ms", config.request_timeout.as_millis().to_string());
        if config.delivery != super::DeliveryGuarantee::None {
            client.set("enable.idempotence", "true");
        }
        if let Some(id) = transactional_id {
            client
                .set("transactional.id", id)
                .set("transaction.timeout.ms", config.transaction_timeout.as_millis().to_string());
        }
        if statistics {
            client.set("statistics.interval.ms", "1000");
        }
        for (k, v) in &config.properties {
            client.set(k, v);
        }
        Ok(client)
    }

    /// Queues one record (stamped `timestamp` when positive, else now), waiting while
    /// librdkafka's queue is full (backpressure).
    pub(crate) fn send(
        &self,
        key: Option<&[u8]>,
        value: &[u8],
        timestamp: i64,
        headers: Option<OwnedHeaders>,
    ) -> Result<()> {
        let mut record = BaseRecord::<[u8], [u8]>::to(&self.topic).payload(value);
        if let Some(headers) = headers {
            record = record.headers(headers);
        }
        if let Some(key) = key {
            record = record.key(key);
        }
        if timestamp > 0 {
            record = record.timestamp(timestamp);
        }
        send_waiting(&self.producer, record).map_err(|e| {
            Error::external(
                "kafka",
                format!("kafka sink: producing into `{}`: {e}{}", self.topic, self.fatal()),
            )
        })
    }

    /// Why the producer is in its fatal state, if it is (e.g. fenced by a newer producer of
    /// its transactional id: a later run of the job took over), as a suffix of a message.
    fn fatal(&self) -> String {
        match self.producer.client().fatal_error() {
            Some((code, reason)) => format!(" — {code:?}: {reason}"),
            None => String::new(),
        }
    }

    /// Serves delivery reports without waiting.
    pub(crate) fn poll(&self) {
        self.producer.poll(Duration::ZERO);
    }

    /// Waits until every queued record is acknowledged; fails if any was not.
    pub(crate) fn flush(&self) -> Result<()> {
        self.producer.flush(self.timeout).map_err(|e| {
            Error::external("kafka", format!("kafka sink: flushing into `{}`: {e}", self.topic))
        })?;
        self.check_deliveries()
    }

    /// The first delivery failure, as an error.
    pub(crate) fn check_deliveries(&self) -> Result<()> {
        if self.watch.failed.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        let first = self.watch.first_error.lock().clone().unwrap_or_default();
        Err(Error::external(
            "kafka",
            format!(
                "kafka sink: {} record(s) into `{}` were not delivered; first: {first}",
                self.watch.failed.load(Ordering::Relaxed),
                self.topic
            ),
        ))
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }
}

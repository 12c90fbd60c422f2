//! The Kafka sink: records in, Kafka records out — exactly once through a transaction per
//! checkpoint epoch (DESIGN.md §5), or at-least-once, or fire-and-forget.
//!
//! Exactly-once: records of epoch `n` go into a transaction; at the barrier of checkpoint
//! `n` it is flushed and its `(transactional id, producer id, epoch)` stored in the
//! snapshot; when `n` completes it is committed. A restore from `n` commits what `n`
//! recorded as pending (the crash may have hit between "complete" and "committed") and
//! aborts anything newer, before the first record is written. Readers use
//! `isolation.level=read_committed`. At start the sink checks its `transaction.timeout.ms`
//! against the checkpoint cycle and against the brokers' `transaction.max.timeout.ms`.

mod broker_limits;
mod config;
mod producer;
mod recovery;
mod serialize;
mod transactions;

pub use config::{DeliveryGuarantee, KafkaSinkConfig, RESTART_ALLOWANCE};
pub use serialize::{AvroSerializer, JsonSerializer, KafkaSerializer, KeyFn};
pub use transactions::{RecordedTxn, SinkSnapshot};

use crate::kafka::txn_coordinator::TxnCoordinatorClient;
use caudal::metrics::kafka_client_settings::PRODUCER;
use caudal::{Batch, CheckpointId, Data, Error, OperatorContext, Result, Sink};
use producer::SinkProducer;
use recovery::{LaterCheckpoint, Recovery};
use transactions::Transactions;

enum Mode {
    /// Before `on_start`.
    Idle,
    Transactional(Box<Transactions>),
    Plain(SinkProducer),
}

/// Writes a stream into a Kafka topic.
pub struct KafkaSink<T> {
    config: KafkaSinkConfig,
    serializer: Box<dyn KafkaSerializer<T>>,
    mode: Mode,
    restored: Vec<SinkSnapshot>,
    key: Vec<u8>,
    value: Vec<u8>,
    /// Leader, replicas and in-sync replicas of the topic's partitions (subtask 0 only).
    health: Option<crate::kafka::health::HealthProbe>,
}

impl<T> std::fmt::Debug for KafkaSink<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KafkaSink({} {:?})", self.config.topic, self.config.delivery)
    }
}

impl<T: Data> KafkaSink<T> {
    /// A sink configured by `config`, encoding records with `serializer`.
    pub fn new(config: KafkaSinkConfig, serializer: impl KafkaSerializer<T>) -> Self {
        KafkaSink {
            config,
            serializer: Box::new(serializer),
            mode: Mode::Idle,
            restored: Vec::new(),
            key: Vec::new(),
            value: Vec::new(),
            health: None,
        }
    }

    fn prefix(&self, ctx: &OperatorContext) -> String {
        self.config
            .transactional_id_prefix
            .clone()
            .unwrap_or_else(|| format!("{}-{}", ctx.job_name, ctx.operator_uid))
    }
}

impl<T: Data> KafkaSink<T> {
    fn decode(&self, blobs: &[Vec<u8>]) -> Result<Vec<SinkSnapshot>> {
        blobs
            .iter()
            .map(|blob| {
                serde_json::from_slice(blob).map_err(|e| {
                    Error::CorruptState(format!(
                        "kafka sink into `{}`: the checkpointed transaction list is corrupt: {e}",
                        self.config.topic
                    ))
                })
            })
            .collect()
    }

    /// The sink's snapshots in checkpoints later runs took on from the restored one.
    fn later_snapshots(&self, ctx: &OperatorContext) -> Result<Vec<LaterCheckpoint>> {
        ctx.later_snapshots
            .iter()
            .map(|l| Ok(LaterCheckpoint { checkpoint: l.checkpoint.0, snapshots: self.decode(&l.subtasks)? }))
            .collect()
    }
}

impl<T: Data> Sink for KafkaSink<T> {
    type In = T;

    fn restore(&mut self, snapshots: Vec<Vec<u8>>, _ctx: &mut OperatorContext) -> Result<()> {
        self.restored = self.decode(&snapshots)?;
        Ok(())
    }

    fn on_start(&mut self, ctx: &mut OperatorContext) -> Result<()> {
        self.config.check_timeout(ctx.checkpoint_timing)?;
        if ctx.subtask == 0 {
            self.health = crate::kafka::health::HealthProbe::start(
                &self.config.brokers,
                &self.config.properties,
                &self.config.topic,
                crate::kafka::health::Probed::All,
                crate::kafka::health::HEALTH_INTERVAL,
                ctx.metrics.clone(),
            );
        }
        crate::kafka::check_access(
            &self.config.brokers,
            &self.config.properties,
            &format!("kafka sink into `{}`", self.config.topic),
        )?;
        self.serializer.open(&self.config.topic)?;
        let transactional = (self.config.delivery == DeliveryGuarantee::ExactlyOnce).then_some("");
        let settings = SinkProducer::client_config(&self.config, transactional, true)?;
        crate::kafka::properties::publish_effective(&settings, PRODUCER, &ctx.metrics);
        self.mode = match self.config.delivery {
            DeliveryGuarantee::ExactlyOnce if ctx.checkpoint_timing.is_none() => {
                // Without periodic checkpoints (none at all, or a restored job with only its
                // final one) one transaction would span the whole run, and a run longer than
                // transaction.timeout.ms (a quiet tail is enough) would end in lost records.
                let takes = if ctx.checkpointing { "only its final one" } else { "none" };
                return Err(Error::config(
                    "--checkpoint-interval",
                    format!(
                        "kafka sink into `{}`: exactly-once commits its transactions when checkpoints \
                         complete, and this job takes {takes}: one transaction would span the whole run \
                         (aborted by the broker after transaction.timeout.ms). Set a checkpoint interval, \
                         or use at-least-once",
                        self.config.topic
                    ),
                ));
            }
            DeliveryGuarantee::ExactlyOnce => {
                broker_limits::check_broker_max_timeout(&self.config)?;
                let coordinator =
                    TxnCoordinatorClient::new(&self.config.brokers, self.config.request_timeout)
                        .with_security(self.config.security()?);
                let prefix = self.prefix(ctx);
                let restored = ctx.restored_checkpoint.map(|c| c.0);
                let later = self.later_snapshots(ctx)?;
                let reserved = Recovery {
                    coordinator: &coordinator,
                    prefix: &prefix,
                    subtask: ctx.subtask,
                    parallelism: ctx.parallelism,
                    topic: &self.config.topic,
                    later: &later,
                    transaction_timeout: self.config.transaction_timeout,
                }
                .run(&self.restored, restored)?;
                self.restored.clear();
                let mut txns = Transactions::new(
                    self.config.clone(),
                    coordinator,
                    prefix,
                    ctx.subtask,
                    ctx.metrics.clone(),
                );
                txns.reserve(reserved, restored.unwrap_or(0));
                txns.set_checkpoint_timing(ctx.checkpoint_timing);
                txns.set_fence(ctx.fence.clone());
                Mode::Transactional(Box::new(txns))
            }
            DeliveryGuarantee::AtLeastOnce | DeliveryGuarantee::None => Mode::Plain(SinkProducer::create(
                &self.config,
                None,
                Some(producer::BrokerStats::new(ctx.metrics.clone())),
            )?),
        };
        Ok(())
    }

    fn write_batch(&mut self, batch: Batch<T>, ctx: &mut OperatorContext) -> Result<()> {
        let mut bytes = 0;
        for record in &batch {
            self.key.clear();
            self.value.clear();
            let keyed = self.serializer.serialize(&record.value, &mut self.key, &mut self.value)?;
            let key = keyed.then_some(self.key.as_slice());
            bytes += key.map_or(0, <[u8]>::len) + self.value.len();
            let timestamp = if self.config.event_time_timestamps { record.ts } else { 0 };
            let headers = self.serializer.headers(&record.value);
            match &mut self.mode {
                Mode::Transactional(txns) => txns.send(key, &self.value, timestamp, headers)?,
                Mode::Plain(producer) => producer.send(key, &self.value, timestamp, headers)?,
                Mode::Idle => return Err(Error::Operator("kafka sink written before on_start".into())),
            }
        }
        ctx.metrics.add_bytes_out(bytes);
        match &self.mode {
            Mode::Transactional(txns) => {
                txns.poll();
                txns.crash_point_before_barrier()?;
            }
            Mode::Plain(producer) => {
                producer.poll();
                producer.check_deliveries()?;
            }
            Mode::Idle => {}
        }
        Ok(())
    }

    fn pre_commit(
        &mut self,
        checkpoint: CheckpointId,
        _ctx: &mut OperatorContext,
    ) -> Result<Option<Vec<u8>>> {
        match &mut self.mode {
            Mode::Transactional(txns) => {
                let snapshot = txns.pre_commit(checkpoint)?;
                serde_json::to_vec(&snapshot)
                    .map(Some)
                    .map_err(|e| Error::Internal(format!("kafka sink: encoding its snapshot: {e}")))
            }
            Mode::Plain(producer) if self.config.delivery == DeliveryGuarantee::AtLeastOnce => {
                producer.flush()?;
                Ok(None)
            }
            _ => Ok(None),
        }
    }

    fn on_checkpoint_complete(&mut self, checkpoint: CheckpointId, _ctx: &mut OperatorContext) -> Result<()> {
        match &mut self.mode {
            Mode::Transactional(txns) => txns.commit_up_to(checkpoint),
            _ => Ok(()),
        }
    }

    fn on_close(&mut self, _ctx: &mut OperatorContext) -> Result<()> {
        self.health = None;
        match &mut self.mode {
            // Whatever is still open is newer than the last completed checkpoint (the final
            // one at the end of input left nothing open): a restore writes it again.
            Mode::Transactional(txns) => {
                txns.abort_open();
                Ok(())
            }
            Mode::Plain(producer) => producer.flush(),
            Mode::Idle => Ok(()),
        }
    }
}

/// A failed conversation with the transaction coordinator as a job error: a refusal of the
/// connection itself (credentials, certificates) is final, the rest may pass with a restart.
pub(crate) fn coordinator_error(topic: &str, e: crate::kafka::txn_coordinator::TxnCoordinatorError) -> Error {
    let message = format!("kafka sink into `{topic}`: {e}");
    if e.is_refused_access() {
        Error::external_refused("kafka", message)
    } else {
        Error::external("kafka", message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
    struct Row {
        n: u64,
    }

    /// Without checkpoints an exactly-once sink would hold one transaction for the whole run:
    /// refused at start, before any broker is contacted.
    #[test]
    fn exactly_once_without_checkpoints_is_refused_at_start() {
        let mut ctx = OperatorContext::unkeyed("job", "sink", 1, 2);
        ctx.checkpointing = false;
        let mut sink = KafkaSink::<Row>::new(KafkaSinkConfig::new("127.0.0.1:1", "out"), JsonSerializer);
        let e = sink.on_start(&mut ctx).unwrap_err().to_string();
        assert!(e.contains("this job takes none") && e.contains("at-least-once"), "{e}");
    }

    /// A restored job without a checkpoint interval takes only its final checkpoint: the same
    /// one transaction for the whole run, refused the same way (#43: before, it started, and
    /// a quiet tail longer than transaction.timeout.ms ended in lost records).
    #[test]
    fn exactly_once_with_only_a_final_checkpoint_is_refused_at_start() {
        let mut ctx = OperatorContext::unkeyed("job", "sink", 1, 2);
        ctx.checkpointing = true;
        ctx.checkpoint_timing = None;
        let mut sink = KafkaSink::<Row>::new(KafkaSinkConfig::new("127.0.0.1:1", "out"), JsonSerializer);
        let e = sink.on_start(&mut ctx).unwrap_err();
        assert!(!e.is_retryable(), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("only its final one") && e.contains("--checkpoint-interval"), "{e}");
    }
}

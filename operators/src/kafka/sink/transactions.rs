//! The transactions of one exactly-once sink subtask: one per checkpoint epoch, from a
//! small pool of transactional ids.
//!
//! ```text
//!   open ──barrier n──► pending(n) ──checkpoint n complete──► committed ──later checkpoint──► free
//!    ▲                    (listed in snapshot n)                (still listed in n)              │
//!    └─────────────────────────────── begin next epoch ◄──────────────────────────────────────────┘
//! ```
//!
//! A transactional id is reused only when no completed checkpoint lists its last
//! transaction: a restore then finds every listed transaction under the same
//! `(producer id, epoch)` it was recorded with, and committing it again cannot commit a
//! newer transaction of the same id by mistake. After a restore the same holds for the ids
//! the restored checkpoint lists ("reserved" until a newer checkpoint completes), so a
//! second restore from that checkpoint finds them committed rather than fenced. When the
//! newer checkpoint completes, the reserved ids are fenced (a new session each, moving
//! their epoch on): an earlier run still alive — a zombie that held one as an idle producer
//! and began a transaction on it — is refused from then on and its transaction aborted,
//! instead of staying open for readers to wait on until the broker's timeout. (Every other
//! id of an earlier run the restore fences at once: `recovery.rs`.)

use super::config::KafkaSinkConfig;
use super::producer::{BrokerStats, SinkProducer};
use super::recovery::MAX_PROBED_IDS;
use crate::kafka::txn_coordinator::TxnCoordinatorClient;
use caudal::metrics::{kafka_txn_gauges as g, SubtaskMetrics};
use caudal::{crash, CheckpointId, Error, Result, RunFence};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::Producer;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A transaction recorded in a checkpoint: enough to commit it from another process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedTxn {
    /// The checkpoint whose barrier closed the transaction.
    pub checkpoint: u64,
    /// `<prefix>-<subtask>-<index>`.
    pub transactional_id: String,
    /// The producer id the coordinator assigned.
    pub producer_id: i64,
    /// The producer epoch of the transaction.
    pub producer_epoch: i16,
}

/// What a sink subtask puts in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SinkSnapshot {
    /// The subtask that took it.
    pub subtask: u32,
    /// Transactions pre-committed and not known to be committed at the barrier.
    pub pending: Vec<RecordedTxn>,
}

/// One transactional producer of the pool.
pub(crate) struct TxnProducer {
    pub(crate) transactional_id: String,
    index: u32,
    producer: SinkProducer,
    producer_id: i64,
    producer_epoch: i16,
    /// The coordinator was asked, after this producer's first commit, whether it still holds
    /// the recorded (producer id, epoch) — see [`same_producer_after_commit`].
    checked_after_commit: bool,
    /// Records written in the open transaction.
    pub(crate) records: u64,
    /// When its first record went out: the broker's transaction timer runs from about then.
    began: Option<Instant>,
    gauges: TxnGauges,
}

/// What the REST API shows of one transactional id ([`caudal::metrics::kafka_txn_gauges`]);
/// written when its transaction changes state and once per batch, never per record.
struct TxnGauges {
    state: Arc<AtomicI64>,
    checkpoint: Arc<AtomicI64>,
    opened_ms: Arc<AtomicI64>,
    records: Arc<AtomicI64>,
}

impl TxnGauges {
    fn new(metrics: &SubtaskMetrics, id: &str, producer_id: i64, epoch: i16, timeout_ms: i64) -> Self {
        metrics.gauge(g::name(id, g::PRODUCER_ID)).store(producer_id, Ordering::Relaxed);
        metrics.gauge(g::name(id, g::PRODUCER_EPOCH)).store(i64::from(epoch), Ordering::Relaxed);
        metrics.gauge(g::name(id, g::TIMEOUT_MS)).store(timeout_ms, Ordering::Relaxed);
        TxnGauges {
            state: metrics.gauge(g::name(id, g::STATE)),
            checkpoint: metrics.gauge(g::name(id, g::CHECKPOINT)),
            opened_ms: metrics.gauge(g::name(id, g::OPENED_MS)),
            records: metrics.gauge(g::name(id, g::RECORDS)),
        }
    }

    fn set(&self, state: i64, checkpoint: u64) {
        self.checkpoint.store(checkpoint as i64, Ordering::Relaxed);
        self.state.store(state, Ordering::Relaxed);
    }
}

struct Pending {
    checkpoint: u64,
    /// The last checkpoint whose snapshot listed this transaction.
    listed_until: u64,
    txn: TxnProducer,
}

/// The pool and the life cycle of one subtask's transactions.
pub(crate) struct Transactions {
    config: KafkaSinkConfig,
    coordinator: TxnCoordinatorClient,
    /// The sink's transactional id prefix.
    id_prefix: String,
    subtask: u32,
    open: Option<TxnProducer>,
    pending: Vec<Pending>,
    committed: Vec<Pending>,
    free: Vec<TxnProducer>,
    /// Indices listed in the restored checkpoint, with that checkpoint: not to be
    /// initialised again until a newer checkpoint completes.
    reserved: Vec<(u32, u64)>,
    /// The last checkpoint whose barrier passed (the open transaction belongs to the next).
    last_barrier: u64,
    /// How long a pending transaction may still have to live after a barrier: the time
    /// until the next checkpoint could complete (interval + checkpoint timeout) and a
    /// restart ([`super::config::RESTART_ALLOWANCE`]). `None`: unknown (no checkpoint timing).
    /// A transaction of a failed checkpoint older than `transaction.timeout.ms - horizon`
    /// fails the job at the next barrier.
    horizon: Option<Duration>,
    metrics: Arc<SubtaskMetrics>,
    /// The next producer, being made on a thread of its own (`init_transactions` waits for
    /// the coordinator, half a second at times): the transaction after a barrier begins on
    /// a producer made while the one before ran, so records do not wait for it.
    ahead: Option<(u32, std::thread::JoinHandle<Result<TxnProducer>>)>,
    /// What the pool's producers see of the brokers (one set of gauges for the subtask).
    stats: Arc<BrokerStats>,
    /// Whether this run still owns the job's storage (checked for every new producer).
    fence: Option<RunFence>,
}

/// What making a producer needs, off the task thread.
#[derive(Clone)]
struct ProducerMaker {
    config: KafkaSinkConfig,
    coordinator: TxnCoordinatorClient,
    id_prefix: String,
    metrics: Arc<SubtaskMetrics>,
    stats: Arc<BrokerStats>,
    fence: Option<RunFence>,
}

impl Transactions {
    pub(crate) fn new(
        config: KafkaSinkConfig,
        coordinator: TxnCoordinatorClient,
        id_prefix: String,
        subtask: u32,
        metrics: Arc<SubtaskMetrics>,
    ) -> Self {
        Transactions {
            config,
            coordinator,
            id_prefix,
            subtask,
            open: None,
            pending: Vec::new(),
            committed: Vec::new(),
            free: Vec::new(),
            reserved: Vec::new(),
            last_barrier: 0,
            horizon: None,
            stats: BrokerStats::new(metrics.clone()),
            metrics,
            ahead: None,
            fence: None,
        }
    }

    /// The run's fence (`OperatorContext::fence`): a producer made for a new transactional
    /// id is used only once the fence says no newer run claimed the job's storage.
    pub(crate) fn set_fence(&mut self, fence: Option<RunFence>) {
        self.fence = fence;
    }

    /// The checkpoint interval and timeout of the job (`OperatorContext::checkpoint_timing`).
    pub(crate) fn set_checkpoint_timing(&mut self, timing: Option<(Duration, Duration)>) {
        self.horizon =
            timing.map(|(interval, timeout)| interval + timeout + super::config::RESTART_ALLOWANCE);
    }

    /// Keeps `indices` (listed in restored checkpoint `checkpoint`) untouched until a newer
    /// checkpoint completes.
    pub(crate) fn reserve(&mut self, indices: Vec<u32>, checkpoint: u64) {
        self.reserved.extend(indices.into_iter().map(|i| (i, checkpoint)));
        self.last_barrier = self.last_barrier.max(checkpoint);
    }

    /// The producer of the open transaction, beginning one if none is open.
    pub(crate) fn open(&mut self) -> Result<&mut TxnProducer> {
        if self.open.is_none() {
            let txn = match self.free.pop() {
                Some(txn) => txn,
                None => match self.ahead.take() {
                    Some((_, made)) => made
                        .join()
                        .map_err(|_| Error::Operator("kafka sink: the producer maker panicked".into()))??,
                    None => self.create_producer()?,
                },
            };
            txn.producer
                .producer
                .begin_transaction()
                .map_err(|e| self.fatal("beginning a transaction", &txn, e))?;
            txn.gauges.opened_ms.store(-1, Ordering::Relaxed);
            txn.gauges.records.store(0, Ordering::Relaxed);
            txn.gauges.set(g::STATE_OPEN, self.last_barrier + 1);
            self.open = Some(txn);
            // The next producer, made while this transaction runs (its id is in use now, so
            // the next is another). While restored ids are reserved it is made when needed:
            // after a newer checkpoint completed it may be one of them (`commit_up_to`).
            if self.free.is_empty() && self.reserved.is_empty() {
                self.make_ahead();
            }
        }
        self.open.as_mut().ok_or_else(|| Error::Operator("kafka sink: no open transaction".into()))
    }

    /// Once per barrier: a producer made ahead that is ready joins the free ones, and every
    /// producer not in use is served (its statistics and reports would pile up in its queue).
    fn serve_idle_producers(&mut self) -> Result<()> {
        if self.ahead.as_ref().is_some_and(|(_, made)| made.is_finished()) {
            if let Some((_, made)) = self.ahead.take() {
                let txn = made
                    .join()
                    .map_err(|_| Error::Operator("kafka sink: the producer maker panicked".into()))??;
                self.free.push(txn);
            }
        }
        for txn in self
            .free
            .iter()
            .chain(self.pending.iter().map(|p| &p.txn))
            .chain(self.committed.iter().map(|p| &p.txn))
        {
            txn.producer.poll();
        }
        Ok(())
    }

    /// Serves delivery reports of the open transaction (once per batch).
    pub(crate) fn poll(&self) {
        if let Some(txn) = &self.open {
            txn.gauges.records.store(txn.records as i64, Ordering::Relaxed);
            txn.producer.poll();
        }
    }

    pub(crate) fn send(
        &mut self,
        key: Option<&[u8]>,
        value: &[u8],
        timestamp: i64,
        headers: Option<OwnedHeaders>,
    ) -> Result<()> {
        let txn = self.open()?;
        txn.producer.send(key, value, timestamp, headers)?;
        if txn.records == 0 {
            txn.gauges.opened_ms.store(caudal::job::now_ms(), Ordering::Relaxed);
            txn.began = Some(Instant::now());
        }
        txn.records += 1;
        Ok(())
    }

    /// The crash point "before the barrier" ([`crash::BEFORE_SINK_BARRIER`]): records of
    /// epoch `n` are in the open transaction at the broker, barrier `n` has not arrived.
    pub(crate) fn crash_point_before_barrier(&self) -> Result<()> {
        let epoch = CheckpointId(self.last_barrier + 1);
        if let Some(txn) = self.open.as_ref().filter(|t| t.records > 0) {
            if crash::armed(crash::BEFORE_SINK_BARRIER, epoch) {
                txn.producer.flush()?;
                crash::point(crash::BEFORE_SINK_BARRIER, epoch);
            }
        }
        Ok(())
    }

    /// Barrier `checkpoint`: flush the open transaction and move it to pending; return the
    /// snapshot listing every pending transaction.
    pub(crate) fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<SinkSnapshot> {
        self.serve_idle_producers()?;
        if let Some(txn) = self.open.take() {
            if txn.records == 0 {
                // An empty transaction stays open for the next epoch: there is nothing to
                // commit, and the coordinator knows no transaction to commit later.
                self.open = Some(txn);
            } else {
                let started = Instant::now();
                txn.producer.flush()?;
                tracing::debug!(
                    checkpoint = checkpoint.0,
                    ms = started.elapsed().as_millis() as u64,
                    "kafka sink `{}`: flushed `{}` at the barrier",
                    self.id_prefix,
                    txn.transactional_id
                );
                txn.gauges.records.store(txn.records as i64, Ordering::Relaxed);
                txn.gauges.set(g::STATE_PRE_COMMITTED, checkpoint.0);
                self.pending.push(Pending { checkpoint: checkpoint.0, listed_until: checkpoint.0, txn });
            }
        }
        for p in &mut self.pending {
            p.listed_until = checkpoint.0;
        }
        // Transactions of checkpoints that failed (tolerable_failed_checkpoints > 0) wait for
        // this one; the one pre-committed now fits the timeout by `check_timeout`.
        if let Some(horizon) = self.horizon {
            let ages: Vec<Duration> = self
                .pending
                .iter()
                .map(|p| match p.txn.began {
                    Some(b) if p.checkpoint < checkpoint.0 => b.elapsed(),
                    _ => Duration::ZERO,
                })
                .collect();
            if let Some(i) = first_to_outlive(&ages, horizon, self.config.transaction_timeout) {
                let p = &self.pending[i];
                return Err(Error::CheckpointsFailed(format!(
                    "kafka sink into `{}`: transaction `{}` of checkpoint {} is still not committed after {:?}; \
                     if this checkpoint failed too, or the job had to restart, the broker would abort it \
                     (transaction.timeout.ms = {} ms) before a checkpoint could commit it and its records \
                     would be lost. Failing the job now instead: a restore from the last completed checkpoint \
                     writes them again",
                    self.config.topic,
                    p.txn.transactional_id,
                    p.checkpoint,
                    ages[i],
                    self.config.transaction_timeout.as_millis()
                )));
            }
        }
        self.last_barrier = self.last_barrier.max(checkpoint.0);
        if let Some(txn) = &self.open {
            // An empty transaction carried over belongs to the next epoch now.
            txn.gauges.set(g::STATE_OPEN, self.last_barrier + 1);
        }
        Ok(SinkSnapshot {
            subtask: self.subtask,
            pending: self
                .pending
                .iter()
                .map(|p| RecordedTxn {
                    checkpoint: p.checkpoint,
                    transactional_id: p.txn.transactional_id.clone(),
                    producer_id: p.txn.producer_id,
                    producer_epoch: p.txn.producer_epoch,
                })
                .collect(),
        })
    }

    /// Checkpoint `checkpoint` is complete: commit every pending transaction up to it and
    /// free the ids no completed checkpoint lists any more.
    pub(crate) fn commit_up_to(&mut self, checkpoint: CheckpointId) -> Result<()> {
        let (due, rest): (Vec<Pending>, Vec<Pending>) =
            std::mem::take(&mut self.pending).into_iter().partition(|p| p.checkpoint <= checkpoint.0);
        self.pending = rest;
        let (free, still_listed): (Vec<Pending>, Vec<Pending>) =
            std::mem::take(&mut self.committed).into_iter().partition(|p| p.listed_until < checkpoint.0);
        self.committed = still_listed;
        self.free.extend(free.into_iter().map(|p| p.txn));
        let released: Vec<u32> =
            self.reserved.iter().filter(|(_, until)| *until < checkpoint.0).map(|(i, _)| *i).collect();
        self.reserved.retain(|(_, until)| *until >= checkpoint.0);
        for index in released {
            let id = super::recovery::transactional_id(&self.id_prefix, self.subtask, index);
            if let Err(e) = self.coordinator.fence(&id, self.config.transaction_timeout) {
                // A zombie's transaction on it, if any, then ends at the broker's timeout.
                tracing::warn!("caudal: kafka sink into `{}`: fencing `{id}`: {e}", self.config.topic);
            }
        }
        for (i, p) in due.into_iter().enumerate() {
            let txn = &p.txn;
            txn.gauges.set(g::STATE_COMMITTING, p.checkpoint);
            let started = Instant::now();
            txn.producer
                .producer
                .commit_transaction(txn.producer.timeout())
                .map_err(|e| self.fatal("committing", txn, e))?;
            tracing::debug!(
                checkpoint = p.checkpoint,
                ms = started.elapsed().as_millis() as u64,
                "kafka sink `{}`: committed `{}`",
                self.id_prefix,
                txn.transactional_id
            );
            if i == 0 {
                crash::point(crash::DURING_SINK_COMMIT, checkpoint);
            }
            let mut p = p;
            if !p.txn.checked_after_commit {
                self.check_same_producer(&p.txn)?;
                p.txn.checked_after_commit = true;
            }
            p.txn.gauges.set(g::STATE_IDLE, p.checkpoint);
            p.txn.records = 0;
            p.txn.began = None;
            self.committed.push(p);
        }
        if self.free.is_empty() {
            self.make_ahead();
        }
        Ok(())
    }

    /// After a producer's first commit: the coordinator must still hold the (producer id,
    /// epoch) recorded for it, which every later transaction of the producer records too and
    /// a restore's recommit sends. Kafka's transaction protocol v2 (KIP-890) bumps the epoch
    /// at every commit: with a client and broker speaking it, a recommit after a crash would be
    /// refused as fenced and the records lost. The job fails now instead, naming the cause.
    fn check_same_producer(&self, txn: &TxnProducer) -> Result<()> {
        let described = self
            .coordinator
            .describe(&txn.transactional_id)
            .map_err(|e| super::coordinator_error(&self.config.topic, e))?;
        let recorded = (txn.producer_id, txn.producer_epoch);
        match described {
            Some(d) if !same_producer_after_commit(recorded, (d.producer_id, d.producer_epoch)) => {
                // A newer run that fenced the id moves its epoch too: say that, not KIP-890.
                if let Some(fence) = &self.fence {
                    if let Err(e @ Error::Superseded(_)) =
                        fence.check(&format!("using `{}` again", txn.transactional_id))
                    {
                        return Err(e);
                    }
                }
                Err(Error::config(
                    "kafka.delivery",
                    format!(
                        "kafka sink into `{}`: after committing `{}` the coordinator holds producer {} epoch {}, \
                         not the producer {} epoch {} this sink records for its transactions: the client and \
                         brokers speak Kafka's transaction protocol v2 (KIP-890), which Caudal's recommit after \
                         a crash does not support yet. Use at-least-once, or brokers with transaction.version=1",
                        self.config.topic,
                        txn.transactional_id,
                        d.producer_id,
                        d.producer_epoch,
                        txn.producer_id,
                        txn.producer_epoch
                    ),
                ))
            }
            _ => Ok(()),
        }
    }

    /// On close with checkpoints: what is still open belongs to no checkpoint; abort it so
    /// readers do not wait for it (pending transactions stay for a restore to commit).
    pub(crate) fn abort_open(&mut self) {
        if let Some((_, made)) = self.ahead.take() {
            let _ = made.join(); // its producer is dropped unused: it holds no transaction
        }
        if let Some(txn) = self.open.take() {
            if txn.records > 0 {
                let _ = txn.producer.producer.abort_transaction(txn.producer.timeout());
            }
            txn.gauges.set(g::STATE_IDLE, self.last_barrier + 1);
        }
    }

    /// The index of the next transactional id: one no restored checkpoint lists. The pool is
    /// bounded by what a restore probes ([`MAX_PROBED_IDS`]): past it (checkpoints have not
    /// completed for that many epochs) the job fails — a restore from the last completed
    /// checkpoint writes the epochs again — rather than use ids a restore would not find.
    fn next_free_index(&mut self) -> Result<u32> {
        let mut used: Vec<u32> = self.reserved.iter().map(|(i, _)| *i).collect();
        used.extend(self.open.iter().map(|t| t.index));
        used.extend(self.pending.iter().chain(&self.committed).map(|p| p.txn.index));
        used.extend(self.free.iter().map(|t| t.index));
        used.extend(self.ahead.iter().map(|(i, _)| *i));
        // The lowest id free: a job's ids stay few (0, 1, 2, … per subtask), and an id a
        // restored checkpoint listed is taken again once a newer checkpoint completed.
        let index = (0..).find(|i| !used.contains(i)).unwrap_or(u32::MAX);
        if index >= MAX_PROBED_IDS {
            return Err(Error::CheckpointsFailed(format!(
                "kafka sink `{}`: all {MAX_PROBED_IDS} transactional ids of subtask {} hold transactions no \
                 completed checkpoint committed: checkpoints are failing or not completing (see the \
                 checkpoint history); failing the job so that a restore writes those epochs again",
                self.id_prefix, self.subtask
            )));
        }
        if index >= 16 {
            tracing_warn(&format!(
                "kafka sink `{}`: {} transactional ids in use: checkpoints are failing or not completing",
                self.id_prefix,
                index + 1
            ));
        }
        Ok(index)
    }

    fn maker(&self) -> ProducerMaker {
        ProducerMaker {
            config: self.config.clone(),
            coordinator: self.coordinator.clone(),
            id_prefix: self.id_prefix.clone(),
            metrics: self.metrics.clone(),
            stats: self.stats.clone(),
            fence: self.fence.clone(),
        }
    }

    fn create_producer(&mut self) -> Result<TxnProducer> {
        let index = self.next_free_index()?;
        self.maker().make(self.subtask, index)
    }

    /// Starts making the next producer on a thread of its own (none when one is on its way).
    fn make_ahead(&mut self) {
        if self.ahead.is_some() {
            return;
        }
        // No free id: the producer that needs one fails the job when it is asked for.
        let Ok(index) = self.next_free_index() else { return };
        let (maker, subtask) = (self.maker(), self.subtask);
        let spawned = std::thread::Builder::new()
            .name("kafka-producer-maker".into())
            .spawn(move || maker.make(subtask, index));
        // No thread: the producer is made when it is needed, on the task thread.
        if let Ok(handle) = spawned {
            self.ahead = Some((index, handle));
        }
    }

    fn fatal(&self, what: &str, txn: &TxnProducer, e: KafkaError) -> Error {
        Error::external(
            "kafka",
            format!(
                "kafka sink into `{}`: {what} transaction `{}` (index {}, producer {} epoch {}): {e}",
                self.config.topic, txn.transactional_id, txn.index, txn.producer_id, txn.producer_epoch
            ),
        )
    }
}

impl ProducerMaker {
    /// The producer of transactional id `index` of `subtask`, initialised (which fences an
    /// older producer of that id and aborts what it left open) and described.
    fn make(&self, subtask: u32, index: u32) -> Result<TxnProducer> {
        let transactional_id = super::recovery::transactional_id(&self.id_prefix, subtask, index);
        let started = Instant::now();
        let producer = SinkProducer::create(&self.config, Some(&transactional_id), Some(self.stats.clone()))?;
        // Fences any older producer of this id and aborts what it left open.
        producer.producer.init_transactions(self.config.request_timeout).map_err(|e| {
            match e.rdkafka_error_code() {
                Some(RDKafkaErrorCode::InvalidTransactionTimeout) => Error::Config {
                    setting: "transaction.timeout.ms".into(),
                    message: format!(
                        "the broker refuses transaction.timeout.ms = {} ms of the Kafka sink into `{}`: \
                         it exceeds the broker's transaction.max.timeout.ms; lower the sink's \
                         transaction timeout or raise transaction.max.timeout.ms on the brokers",
                        self.config.transaction_timeout.as_millis(),
                        self.config.topic
                    ),
                },
                _ => Error::external(
                    "kafka",
                    format!(
                        "kafka sink into `{}`: init_transactions of `{transactional_id}`: {e}",
                        self.config.topic
                    ),
                ),
            }
        })?;
        let described = self
            .coordinator
            .describe(&transactional_id)
            .map_err(|e| super::coordinator_error(&self.config.topic, e))?
            .ok_or_else(|| {
                Error::Internal(format!(
                    "kafka sink: the coordinator does not know `{transactional_id}` right after init_transactions"
                ))
            })?;
        // Checked after init_transactions, not before: a newer run that claimed later
        // restores later, finds this id in use and fences it; one that claimed earlier is
        // seen here, and no transaction begins on the id.
        // Storage out of reach: the run's checkpoints fail meanwhile, so nothing it writes
        // commits; it goes on (as tolerable_failed_checkpoints allows) rather than fail.
        if let Some(fence) = &self.fence {
            match fence.check(&format!("beginning transactions on `{transactional_id}`")) {
                Ok(()) => {}
                Err(e @ Error::Superseded(_)) => return Err(e),
                Err(e) => tracing::warn!(
                    "kafka sink `{}`: {e}: going on with `{transactional_id}` without knowing whether a newer run took over",
                    self.id_prefix
                ),
            }
        }
        tracing::debug!(
            ms = started.elapsed().as_millis() as u64,
            "kafka sink `{}`: producer `{transactional_id}` ready (init_transactions)",
            self.id_prefix
        );
        let gauges = TxnGauges::new(
            &self.metrics,
            &transactional_id,
            described.producer_id,
            described.producer_epoch,
            self.config.transaction_timeout.as_millis() as i64,
        );
        Ok(TxnProducer {
            transactional_id,
            index,
            producer,
            producer_id: described.producer_id,
            producer_epoch: described.producer_epoch,
            checked_after_commit: false,
            records: 0,
            began: None,
            gauges,
        })
    }
}

fn tracing_warn(message: &str) {
    tracing::warn!("caudal: {message}");
}

/// The first pending transaction (by age since its first record) that would outlive
/// `timeout` if it had to wait `horizon` more: the broker would abort it before the next
/// chance to commit it.
fn first_to_outlive(ages: &[Duration], horizon: Duration, timeout: Duration) -> Option<usize> {
    ages.iter().position(|age| *age + horizon > timeout)
}

/// Whether the coordinator's `(producer id, epoch)` after a commit is still the `recorded`
/// one (the classic protocol: the epoch is fixed for a producer session).
fn same_producer_after_commit(recorded: (i64, i16), described: (i64, i16)) -> bool {
    recorded == described
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_epoch_moved_by_a_commit_is_not_the_same_producer() {
        assert!(same_producer_after_commit((7, 3), (7, 3)));
        assert!(!same_producer_after_commit((7, 3), (7, 4)), "KIP-890 bumps the epoch at each commit");
        assert!(!same_producer_after_commit((7, 3), (8, 0)));
    }

    /// The pool never uses an id a restore would not probe (#43: it grew without bound
    /// while checkpoints failed, and recovery probed 64 ids).
    #[test]
    fn the_pool_stops_at_the_ids_a_restore_probes() {
        let coordinator = TxnCoordinatorClient::new("127.0.0.1:1", Duration::from_millis(10));
        let config = KafkaSinkConfig::new("127.0.0.1:1", "out");
        let mut txns = Transactions::new(config, coordinator, "job-sink".into(), 0, Arc::default());
        txns.reserve((0..MAX_PROBED_IDS - 1).collect(), 1);
        assert_eq!(txns.next_free_index().unwrap(), MAX_PROBED_IDS - 1);
        txns.reserve(vec![MAX_PROBED_IDS - 1], 1);
        let e = txns.next_free_index().unwrap_err();
        assert!(e.is_retryable() && e.to_string().contains("all 64 transactional ids"), "{e}");
    }

    #[test]
    fn a_pending_transaction_that_could_not_be_committed_in_time_is_found() {
        let (horizon, timeout) = (Duration::from_secs(780), Duration::from_secs(900));
        // One checkpoint interval old (60 s): the next checkpoint has time to commit it.
        assert_eq!(first_to_outlive(&[Duration::from_secs(60)], horizon, timeout), None);
        // Its checkpoint failed and the next one too (180 s): it would time out meanwhile.
        let ages = [Duration::from_secs(180), Duration::from_secs(60)];
        assert_eq!(first_to_outlive(&ages, horizon, timeout), Some(0));
        assert_eq!(first_to_outlive(&[], horizon, timeout), None);
    }
}

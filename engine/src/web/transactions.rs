//! `GET /api/v1/jobs/{name}/transactions`: the open and pending transactions of every
//! exactly-once Kafka sink, with their age against `transaction.timeout.ms`.
//!
//! Built from the gauges the sinks publish (named by [`kafka_txn_gauges`]): one set per
//! transactional id of a sink's pool; ids without a transaction (free, or committed) are
//! left out, and an operator with none of these gauges is not a transactional sink.

use super::registry::JobEntry;
use crate::job::JobStatus;
use crate::metrics::kafka_txn_gauges as g;
use serde::Serialize;
use std::collections::BTreeMap;

/// `GET /api/v1/jobs/{name}/transactions`
#[derive(Debug, Serialize)]
pub(crate) struct TransactionsView {
    pub(crate) job: String,
    pub(crate) status: JobStatus,
    pub(crate) now_ms: i64,
    pub(crate) sinks: Vec<SinkTransactions>,
}

/// One exactly-once Kafka sink.
#[derive(Debug, Serialize)]
pub(crate) struct SinkTransactions {
    pub(crate) operator_id: u32,
    pub(crate) operator: String,
    pub(crate) parallelism: usize,
    /// Transactional ids in the sink's pools (all subtasks), with or without a transaction.
    pub(crate) transactional_ids: usize,
    /// The open and pending transactions, oldest checkpoint first.
    pub(crate) transactions: Vec<TransactionView>,
}

/// One transaction.
#[derive(Debug, Serialize)]
pub(crate) struct TransactionView {
    pub(crate) transactional_id: String,
    pub(crate) producer_id: i64,
    pub(crate) producer_epoch: i64,
    /// The checkpoint it belongs to (for an open transaction: the next one).
    pub(crate) checkpoint: i64,
    /// `open`, `pre_committed` (waiting for its checkpoint to complete) or `committing`.
    pub(crate) state: &'static str,
    pub(crate) records: i64,
    /// When its first record was written (`null` while it has none).
    pub(crate) opened_ms: Option<i64>,
    pub(crate) age_ms: Option<i64>,
    pub(crate) timeout_ms: i64,
    /// `age_ms / timeout_ms`: at 1 the broker aborts it (and the data is lost to the job).
    pub(crate) timeout_fraction: Option<f64>,
}

impl TransactionsView {
    pub(crate) fn of(job: &JobEntry, now: i64) -> Self {
        let sinks = job
            .view
            .metrics
            .snapshot()
            .into_iter()
            .filter_map(|op| {
                let mut ids: BTreeMap<&str, BTreeMap<&str, i64>> = BTreeMap::new();
                for (name, value) in &op.gauges {
                    if let Some((id, what)) = g::parse(name) {
                        ids.entry(id).or_default().insert(what, *value);
                    }
                }
                if ids.is_empty() {
                    return None;
                }
                let mut transactions: Vec<TransactionView> = ids
                    .iter()
                    .filter_map(|(id, v)| {
                        let get = |what: &str| v.get(what).copied().unwrap_or(-1);
                        let state = g::state_name(get(g::STATE))?;
                        let opened_ms = Some(get(g::OPENED_MS)).filter(|t| *t > 0);
                        let age_ms = opened_ms.map(|t| (now - t).max(0));
                        let timeout_ms = get(g::TIMEOUT_MS);
                        Some(TransactionView {
                            transactional_id: id.to_string(),
                            producer_id: get(g::PRODUCER_ID),
                            producer_epoch: get(g::PRODUCER_EPOCH),
                            checkpoint: get(g::CHECKPOINT),
                            state,
                            records: get(g::RECORDS).max(0),
                            opened_ms,
                            age_ms,
                            timeout_ms,
                            timeout_fraction: age_ms
                                .filter(|_| timeout_ms > 0)
                                .map(|a| a as f64 / timeout_ms as f64),
                        })
                    })
                    .collect();
                transactions.sort_by(|a, b| {
                    (a.checkpoint, &a.transactional_id).cmp(&(b.checkpoint, &b.transactional_id))
                });
                let ids_in_pools = ids.len();
                Some(SinkTransactions {
                    operator_id: op.id,
                    operator: op.name,
                    parallelism: op.subtasks.len(),
                    transactional_ids: ids_in_pools,
                    transactions,
                })
            })
            .collect();
        TransactionsView { job: job.view.name.clone(), status: job.view.status(), now_ms: now, sinks }
    }
}

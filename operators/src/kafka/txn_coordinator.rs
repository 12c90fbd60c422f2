//! Talks to Kafka's transaction coordinator directly, over the Kafka protocol: what
//! librdkafka cannot do.
//!
//! librdkafka can only finish a transaction its own producer instance began. After a
//! crash between "checkpoint complete" and "transaction committed", the restored sink must
//! commit a transaction begun by a dead process, knowing only its
//! `(transactional_id, producer_id, epoch)` from the checkpoint. This module does that with
//! `FindCoordinator` + `EndTxn` (and `DescribeTransactions` to see where a transactional id
//! stands), each a blocking request/response on a short-lived connection — TCP or TLS,
//! authenticated with SASL from the sink's own Kafka properties ([`super::wire`]).
//!
//! Flow: `transactional id ─FindCoordinator→ coordinator address ─Describe/EndTxn→ answer`.

use super::wire::{Connection, KafkaSecurity, WireError};
use kafka_protocol::messages::{
    ApiKey, DescribeTransactionsRequest, DescribeTransactionsResponse, EndTxnRequest, EndTxnResponse,
    FindCoordinatorRequest, FindCoordinatorResponse, InitProducerIdRequest, InitProducerIdResponse,
    ProducerId, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use std::time::{Duration, Instant};

/// Protocol versions used. EndTxn ≤ 4 is the classic (TV1) transaction protocol that
/// librdkafka speaks; its epoch stays fixed for the life of a producer session.
const FIND_COORDINATOR_VERSION: i16 = 3;
const END_TXN_VERSION: i16 = 3;
const DESCRIBE_TRANSACTIONS_VERSION: i16 = 0;
/// InitProducerId v1: a new session for a transactional id, as a producer starting up asks
/// for one (no producer id or epoch of ours to name).
const INIT_PRODUCER_ID_VERSION: i16 = 1;

/// Kafka error codes this module acts on.
mod code {
    pub const NONE: i16 = 0;
    pub const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    pub const NOT_COORDINATOR: i16 = 16;
    pub const CONCURRENT_TRANSACTIONS: i16 = 51;
    pub const TRANSACTIONAL_ID_NOT_FOUND: i16 = 105;
}

/// Where a transactional id stands at its coordinator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnDescription {
    /// `Empty`, `Ongoing`, `PrepareCommit`, `PrepareAbort`, `CompleteCommit`,
    /// `CompleteAbort`, `Dead`, `PrepareEpochFence`.
    pub state: String,
    /// The producer id the coordinator holds for the transactional id.
    pub producer_id: i64,
    /// Its current epoch.
    pub producer_epoch: i16,
}

impl TxnDescription {
    /// A transaction is open (records written, no end marker yet).
    pub fn is_open(&self) -> bool {
        self.state == "Ongoing"
    }
}

/// A failed conversation with the coordinator.
#[derive(Debug, thiserror::Error)]
pub enum TxnCoordinatorError {
    /// No broker answered.
    #[error("kafka transaction coordinator for `{transactional_id}`: {reason}")]
    Unreachable {
        /// The transactional id asked about.
        transactional_id: String,
        /// Why.
        reason: String,
    },
    /// The broker refused the connection itself (its certificate, our credentials): a
    /// retry meets the same refusal.
    #[error("kafka transaction coordinator for `{transactional_id}`: {reason}")]
    Unauthorized {
        /// The transactional id asked about.
        transactional_id: String,
        /// Why.
        reason: String,
    },
    /// The coordinator answered with an error code.
    #[error("kafka transaction coordinator: {request} for `{transactional_id}` answered {name} ({code})")]
    Refused {
        /// What was asked.
        request: &'static str,
        /// The transactional id.
        transactional_id: String,
        /// The Kafka error code.
        code: i16,
        /// Its name.
        name: String,
    },
}

impl TxnCoordinatorError {
    /// The broker refused the connection itself (certificate, credentials).
    pub fn is_refused_access(&self) -> bool {
        matches!(self, TxnCoordinatorError::Unauthorized { .. })
    }

    /// The Kafka error code of a refusal.
    pub fn code(&self) -> Option<i16> {
        match self {
            TxnCoordinatorError::Refused { code, .. } => Some(*code),
            TxnCoordinatorError::Unreachable { .. } | TxnCoordinatorError::Unauthorized { .. } => None,
        }
    }
}

type Result<T> = std::result::Result<T, TxnCoordinatorError>;

/// A blocking client of transaction coordinators, bootstrapped from a broker list.
#[derive(Debug, Clone)]
pub struct TxnCoordinatorClient {
    bootstrap: Vec<String>,
    timeout: Duration,
    security: KafkaSecurity,
}

impl TxnCoordinatorClient {
    /// A client for the cluster behind `brokers` (`host:port[,host:port…]`); `timeout`
    /// bounds every call, retries included.
    pub fn new(brokers: &str, timeout: Duration) -> Self {
        let bootstrap = brokers.split(',').map(|b| b.trim().to_owned()).filter(|b| !b.is_empty()).collect();
        TxnCoordinatorClient { bootstrap, timeout, security: KafkaSecurity::default() }
    }

    /// The same client over TLS and SASL as `security` says (from the sink's properties).
    pub fn with_security(mut self, security: KafkaSecurity) -> Self {
        self.security = security;
        self
    }

    /// Connects and authenticates to one bootstrap broker, as every call will: a setting the
    /// brokers refuse (a wrong password, a CA that did not sign them) fails here, at a job's
    /// start, and not at its first restore.
    pub fn check_access(&self) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        let mut last = None;
        for broker in &self.bootstrap {
            match Connection::open(broker, deadline, &self.security) {
                Ok(_) => return Ok(()),
                Err(e) => last = Some(e),
            }
        }
        Err(match last {
            Some(e) => wire_error("(access check)", e),
            None => TxnCoordinatorError::Unreachable {
                transactional_id: "(access check)".into(),
                reason: "no bootstrap broker configured".into(),
            },
        })
    }

    /// Where `transactional_id` stands, or `None` if the coordinator does not know it.
    pub fn describe(&self, transactional_id: &str) -> Result<Option<TxnDescription>> {
        self.with_coordinator(transactional_id, "DescribeTransactions", |conn| {
            let request =
                DescribeTransactionsRequest::default().with_transactional_ids(vec![TransactionalId(
                    StrBytes::from_string(transactional_id.into()),
                )]);
            let response: DescribeTransactionsResponse = conn
                .call(ApiKey::DescribeTransactions, &request, DESCRIBE_TRANSACTIONS_VERSION)
                .map_err(|e| wire_error(transactional_id, e))?;
            let Some(state) = response.transaction_states.into_iter().next() else {
                return Ok(Answer::Done(None));
            };
            match state.error_code {
                code::NONE => Ok(Answer::Done(Some(TxnDescription {
                    state: state.transaction_state.as_str().to_owned(),
                    producer_id: state.producer_id.0,
                    producer_epoch: state.producer_epoch,
                }))),
                code::TRANSACTIONAL_ID_NOT_FOUND => Ok(Answer::Done(None)),
                other => Ok(Answer::Code(other)),
            }
        })
    }

    /// Ends the transaction of `(transactional_id, producer_id, epoch)`: commits it when
    /// `commit`, aborts it otherwise. Ending an already committed transaction the same way
    /// again succeeds (the coordinator answers NONE).
    pub fn end_txn(&self, transactional_id: &str, producer_id: i64, epoch: i16, commit: bool) -> Result<()> {
        let what = if commit { "EndTxn(commit)" } else { "EndTxn(abort)" };
        self.with_coordinator(transactional_id, what, |conn| {
            let request = EndTxnRequest::default()
                .with_transactional_id(TransactionalId(StrBytes::from_string(transactional_id.into())))
                .with_producer_id(ProducerId(producer_id))
                .with_producer_epoch(epoch)
                .with_committed(commit);
            let response: EndTxnResponse = conn
                .call(ApiKey::EndTxn, &request, END_TXN_VERSION)
                .map_err(|e| wire_error(transactional_id, e))?;
            Ok(match response.error_code {
                code::NONE => Answer::Done(()),
                other => Answer::Code(other),
            })
        })
    }

    /// Fences `transactional_id`: starts a new producer session for it (InitProducerId), as a
    /// producer starting up does, which moves its epoch on — any producer still holding the
    /// old one (a zombie: a frozen or cut-off earlier run) is refused from then on — and
    /// aborts a transaction it left open. Nothing uses the new session.
    pub fn fence(&self, transactional_id: &str, transaction_timeout: Duration) -> Result<()> {
        let timeout_ms = i32::try_from(transaction_timeout.as_millis()).unwrap_or(i32::MAX);
        self.with_coordinator(transactional_id, "InitProducerId", |conn| {
            let request = InitProducerIdRequest::default()
                .with_transactional_id(Some(TransactionalId(StrBytes::from_string(transactional_id.into()))))
                .with_transaction_timeout_ms(timeout_ms);
            let response: InitProducerIdResponse = conn
                .call(ApiKey::InitProducerId, &request, INIT_PRODUCER_ID_VERSION)
                .map_err(|e| wire_error(transactional_id, e))?;
            Ok(match response.error_code {
                code::NONE => Answer::Done(()),
                other => Answer::Code(other),
            })
        })
    }

    /// Runs `call` against the coordinator of `transactional_id`, finding it first and
    /// retrying while the coordinator is loading, moving or busy with the same id.
    fn with_coordinator<T>(
        &self,
        transactional_id: &str,
        request: &'static str,
        mut call: impl FnMut(&mut Connection) -> Result<Answer<T>>,
    ) -> Result<T> {
        let deadline = Instant::now() + self.timeout;
        let mut backoff = Duration::from_millis(20);
        loop {
            let outcome = self.find_coordinator(transactional_id, deadline).and_then(|address| {
                let mut conn = Connection::open(&address, deadline, &self.security)
                    .map_err(|e| wire_error(transactional_id, e))?;
                call(&mut conn)
            });
            let retryable = match outcome {
                Ok(Answer::Done(value)) => return Ok(value),
                Ok(Answer::Code(code)) if is_retryable(code) => {
                    TxnCoordinatorError::refused(request, transactional_id, code)
                }
                Ok(Answer::Code(code)) => {
                    return Err(TxnCoordinatorError::refused(request, transactional_id, code))
                }
                Err(e @ TxnCoordinatorError::Unreachable { .. }) => e,
                Err(e) if e.code().is_some_and(is_retryable) => e,
                Err(e) => return Err(e),
            };
            if Instant::now() + backoff > deadline {
                return Err(retryable);
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    fn find_coordinator(&self, transactional_id: &str, deadline: Instant) -> Result<String> {
        let mut last_error = None;
        for broker in &self.bootstrap {
            let mut conn = match Connection::open(broker, deadline, &self.security) {
                Ok(conn) => conn,
                Err(e @ WireError::Refused(_)) => return Err(wire_error(transactional_id, e)),
                Err(e) => {
                    last_error = Some(wire_error(transactional_id, e));
                    continue;
                }
            };
            let request = FindCoordinatorRequest::default()
                .with_key(StrBytes::from_string(transactional_id.into()))
                .with_key_type(1);
            let response: FindCoordinatorResponse = conn
                .call(ApiKey::FindCoordinator, &request, FIND_COORDINATOR_VERSION)
                .map_err(|e| wire_error(transactional_id, e))?;
            if response.error_code != code::NONE {
                return Err(TxnCoordinatorError::refused(
                    "FindCoordinator",
                    transactional_id,
                    response.error_code,
                ));
            }
            return Ok(format!("{}:{}", response.host.as_str(), response.port));
        }
        Err(last_error.unwrap_or_else(|| TxnCoordinatorError::Unreachable {
            transactional_id: transactional_id.to_owned(),
            reason: "no bootstrap broker configured".to_owned(),
        }))
    }
}

enum Answer<T> {
    Done(T),
    Code(i16),
}

fn is_retryable(code: i16) -> bool {
    matches!(
        code,
        code::COORDINATOR_LOAD_IN_PROGRESS
            | code::COORDINATOR_NOT_AVAILABLE
            | code::NOT_COORDINATOR
            | code::CONCURRENT_TRANSACTIONS
    )
}

impl TxnCoordinatorError {
    fn refused(request: &'static str, transactional_id: &str, code: i16) -> Self {
        let name = kafka_protocol::error::ResponseError::try_from_code(code)
            .map(|e| e.to_string())
            .unwrap_or_else(|| "UNKNOWN".to_owned());
        TxnCoordinatorError::Refused { request, transactional_id: transactional_id.to_owned(), code, name }
    }
}

fn wire_error(transactional_id: &str, e: WireError) -> TxnCoordinatorError {
    let transactional_id = transactional_id.to_owned();
    match e {
        WireError::Unreachable(reason) => TxnCoordinatorError::Unreachable { transactional_id, reason },
        WireError::Refused(reason) => TxnCoordinatorError::Unauthorized { transactional_id, reason },
    }
}

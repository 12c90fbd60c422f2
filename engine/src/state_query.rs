//! Reading the live keyed state of a running operator (the state browser of the REST API).
//!
//! **In:** a [`StateRequest`] for one keyed operator subtask (look up a key, list a page of a
//! key group's entries, entry counts and bytes per key group). **Out:** a [`StateReply`]
//! with keys and values decoded as JSON where the operator can decode them
//! ([`StateBrowse::state_key_to_json`](crate::StateBrowse::state_key_to_json) and friends), else
//! as hex and byte length.
//!
//! **Invariant: state is only ever read by the task thread that owns it, between two
//! batches.** The web server never touches a backend: it puts the query into the subtask's
//! small bounded mailbox ([`StateQueries`]) and wakes the task with a
//! `ServeStateQueries` command on the task's command channel (the one checkpoint triggers
//! and completions use). The task drains the mailbox when it handles that command, which
//! it does only between batches — so a reader never sees a batch half applied and never
//! races the operator — and answers on a one-shot channel the server awaits with a
//! timeout. A key lookup first asks the operator for the key's entries in its in-memory
//! cache ([`StateBrowse::cached_state`](crate::StateBrowse::cached_state): a hash lookup), and reads
//! the backend only when the operator holds none newer; listing a key group and the sizes
//! first have the operator write its cache through to the backend
//! ([`StateBrowse::prepare_state_read`](crate::StateBrowse::prepare_state_read); the window operator
//! does what it does at a barrier). Either way an answer is the live state, not the state of
//! the last checkpoint. The hot path pays nothing: no per-batch poll, no lock.
//! A task stuck on backpressure answers late; the server then reports a timeout.
//!
//! Works for RocksDB and heap backends alike (it uses the backend's own
//! `get`/`list_entries`/`key_group_stats`).
//!
//! **Cluster mode:** the job manager's API reaches executor processes the same way. Each
//! executor reports its keyed subtasks when they run; the job manager registers a mailbox per
//! subtask whose wake-up goes to that executor's wake channel in the attempt
//! (`cluster::jobmanager::attempt`), which forwards the query over the executor's control connection as JSON. The executor puts it
//! into its own subtask's mailbox as above and sends the answer back; the job manager hands
//! it to the waiting request. Executors that go away take their pending queries with them:
//! the API then answers that the job is not running.

use crate::state::KeyedState;
use crate::Result;
use caudal_checkpoints::keys::{decode_key, DecodedKey};
use caudal_checkpoints::{KeyGroupStats, StateId, StateKey};
use crossbeam_channel::{Receiver, Sender, TrySendError};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::Range;

/// How many queries may wait for one subtask; more are answered "busy".
pub const MAILBOX_CAPACITY: usize = 64;

/// The most entries one page of a key group may hold.
pub const MAX_PAGE: usize = 1000;

/// The most entries a key lookup returns (one key has one entry per state and namespace).
const MAX_LOOKUP_ENTRIES: usize = 256;

/// A key's entries held in an operator's memory: `(state name, encoded namespace, value)`.
pub type CachedEntries = Vec<(String, Vec<u8>, Vec<u8>)>;

/// What to read.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum StateRequest {
    /// Every entry of one user key, given as JSON (decoded by the operator).
    Lookup {
        /// The key, e.g. `7` or `"sensor-7"`.
        key: serde_json::Value,
    },
    /// A page of the entries of one key group.
    Keys {
        /// The key group.
        key_group: u16,
        /// The encoded key of the last entry of the previous page.
        after: Option<Vec<u8>>,
        /// Page size, `1..=MAX_PAGE`.
        limit: usize,
    },
    /// Entry count and bytes of every key group of the subtask.
    Sizes,
}

/// One stored entry, decoded as far as possible.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StateEntry {
    /// The state's name (e.g. `window`).
    pub state: String,
    /// The user key as JSON, when the operator can decode it.
    pub key: Option<serde_json::Value>,
    /// The encoded user key, hex.
    pub key_hex: String,
    /// The namespace, hex (empty for most states).
    pub namespace_hex: String,
    /// The map key of a map-state entry, hex.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub map_key_hex: String,
    /// The value as JSON, when the operator can decode it.
    pub value: Option<serde_json::Value>,
    /// The stored value's size in bytes.
    pub value_bytes: usize,
    /// The first 64 bytes of the value, hex, when it could not be decoded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_hex: Option<String>,
    /// The full encoded key, hex: pass it as `after` to continue a listing from here.
    pub cursor: String,
}

/// What a subtask answered.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum StateReply {
    /// The key (or key group) belongs to another subtask.
    NotOwned,
    /// The entries of a looked-up key (empty: the key has no state).
    Lookup {
        /// The key's key group.
        key_group: u16,
        /// Its entries.
        entries: Vec<StateEntry>,
    },
    /// A page of a key group.
    Keys {
        /// The entries, in key order.
        entries: Vec<StateEntry>,
        /// The cursor of the next page, hex; `None` on the last page.
        next: Option<String>,
    },
    /// Per key group: entries and bytes.
    Sizes(Vec<KeyGroupStats>),
    /// The request was wrong for this operator (e.g. a key of the wrong type).
    BadRequest(String),
    /// Reading failed.
    Failed(String),
    /// The subtask cannot take the query now (its mailbox is full); retry.
    Unavailable(String),
}

/// A request and where to send its answer.
#[derive(Debug)]
pub(crate) struct StateQuery {
    pub(crate) request: StateRequest,
    pub(crate) reply: tokio::sync::oneshot::Sender<StateReply>,
}

/// The mailbox of one keyed operator subtask.
#[derive(Debug, Clone)]
pub(crate) struct Mailbox {
    pub(crate) key_groups: Range<u16>,
    queries: Sender<StateQuery>,
    wake: Sender<crate::runtime::TaskCommand>,
}

/// Why a query could not be delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeliveryError {
    /// The mailbox is full (the task is slow to answer).
    Busy,
    /// The task has ended.
    Gone,
}

impl Mailbox {
    /// Hands `query` to the task and wakes it.
    pub(crate) fn send(&self, query: StateQuery) -> std::result::Result<(), DeliveryError> {
        self.queries.try_send(query).map_err(|e| match e {
            TrySendError::Full(_) => DeliveryError::Busy,
            TrySendError::Disconnected(_) => DeliveryError::Gone,
        })?;
        self.wake.send(crate::runtime::TaskCommand::ServeStateQueries).map_err(|_| DeliveryError::Gone)
    }
}

/// Per subtask: the key groups it owns.
pub(crate) type SubtaskKeyGroups = Vec<(u32, Range<u16>)>;

/// The mailboxes of every keyed operator subtask of a job: tasks register them when they are
/// built, the REST API sends to them.
#[derive(Debug, Default)]
pub struct StateQueries {
    /// Operator id → per subtask.
    operators: Mutex<BTreeMap<u32, BTreeMap<u32, Mailbox>>>,
}

impl StateQueries {
    /// No mailboxes (yet).
    pub fn new() -> Self {
        Self::default()
    }

    /// A mailbox for subtask `subtask` of operator `operator` owning `key_groups`, woken through
    /// `wake`; replaces an earlier one (a restarted task). Returns the task's receiving end.
    pub(crate) fn register(
        &self,
        operator: u32,
        subtask: u32,
        key_groups: Range<u16>,
        wake: Sender<crate::runtime::TaskCommand>,
    ) -> Receiver<StateQuery> {
        let (queries, rx) = crossbeam_channel::bounded(MAILBOX_CAPACITY);
        let mailbox = Mailbox { key_groups, queries, wake };
        self.operators.lock().entry(operator).or_default().insert(subtask, mailbox);
        rx
    }

    /// The mailboxes of `operator`, by subtask; empty when it has no keyed state.
    pub(crate) fn mailboxes(&self, operator: u32) -> Vec<(u32, Mailbox)> {
        self.operators
            .lock()
            .get(&operator)
            .map(|m| m.iter().map(|(s, b)| (*s, b.clone())).collect())
            .unwrap_or_default()
    }

    /// The ids of the operators with keyed state, with each subtask's key groups.
    pub(crate) fn operators(&self) -> Vec<(u32, SubtaskKeyGroups)> {
        self.operators
            .lock()
            .iter()
            .map(|(id, subs)| (*id, subs.iter().map(|(s, m)| (*s, m.key_groups.clone())).collect()))
            .collect()
    }
}

/// How an operator decodes its stored keys and values (its `Operator` hooks).
pub(crate) trait StateDecoder {
    fn key_from_json(&self, key: &serde_json::Value) -> Option<Result<(u16, Vec<u8>)>>;
    fn key_to_json(&self, key: &[u8]) -> Option<serde_json::Value>;
    fn value_to_json(&self, state: &str, value: &[u8]) -> Option<serde_json::Value>;
    fn cached(&self, key: &[u8]) -> Option<CachedEntries>;
}

/// Answers `request` from `keyed` (on the task thread, between batches).
pub(crate) fn answer(
    request: StateRequest,
    keyed: &KeyedState,
    key_groups: &Range<u16>,
    decoder: &dyn StateDecoder,
) -> StateReply {
    match try_answer(request, keyed, key_groups, decoder) {
        Ok(r) => r,
        Err(e) => StateReply::Failed(e.to_string()),
    }
}

fn try_answer(
    request: StateRequest,
    keyed: &KeyedState,
    key_groups: &Range<u16>,
    decoder: &dyn StateDecoder,
) -> Result<StateReply> {
    match request {
        StateRequest::Lookup { key } => {
            let (key_group, encoded) = match decoder.key_from_json(&key) {
                None => {
                    return Ok(StateReply::BadRequest(
                        "this operator cannot decode keys; browse its key groups instead".into(),
                    ))
                }
                Some(Err(e)) => return Ok(StateReply::BadRequest(e.to_string())),
                Some(Ok(k)) => k,
            };
            if !key_groups.contains(&key_group) {
                return Ok(StateReply::NotOwned);
            }
            if let Some(cached) = decoder.cached(&encoded) {
                let mut entries = Vec::with_capacity(cached.len());
                for (state, namespace, value) in cached {
                    let id = StateId::new(&state)?;
                    let sk = StateKey { namespace: &namespace, ..StateKey::new(key_group, &id, &encoded) };
                    let full = sk.encode()?;
                    let d = DecodedKey {
                        key_group,
                        state: &state,
                        key: &encoded,
                        namespace: &namespace,
                        map_key: &[],
                    };
                    entries.push(entry(&full, d, &value, decoder));
                }
                return Ok(StateReply::Lookup { key_group, entries });
            }
            let backend = keyed.lock()?;
            let mut entries = Vec::new();
            let mut after: Option<Vec<u8>> = None;
            // The key's entries (one per state and namespace) are spread over its key group.
            loop {
                let page = backend.list_entries(key_group, after.as_deref(), 4096)?;
                for e in &page.entries {
                    if let Some(d) = decode_key(&e.key).filter(|d| d.key == encoded.as_slice()) {
                        if entries.len() < MAX_LOOKUP_ENTRIES {
                            entries.push(entry(&e.key, d, &e.value, decoder));
                        }
                    }
                }
                match page.next {
                    Some(n) => after = Some(n),
                    None => break,
                }
            }
            Ok(StateReply::Lookup { key_group, entries })
        }
        StateRequest::Keys { key_group, after, limit } => {
            if !key_groups.contains(&key_group) {
                return Ok(StateReply::NotOwned);
            }
            let backend = keyed.lock()?;
            let page = backend.list_entries(key_group, after.as_deref(), limit.clamp(1, MAX_PAGE))?;
            let entries = page
                .entries
                .iter()
                .filter_map(|e| decode_key(&e.key).map(|d| entry(&e.key, d, &e.value, decoder)))
                .collect();
            Ok(StateReply::Keys { entries, next: page.next.as_deref().map(hex) })
        }
        StateRequest::Sizes => Ok(StateReply::Sizes(keyed.lock()?.key_group_stats()?)),
    }
}

fn entry(full_key: &[u8], d: DecodedKey<'_>, value: &[u8], decoder: &dyn StateDecoder) -> StateEntry {
    let decoded = decoder.value_to_json(d.state, value);
    StateEntry {
        state: d.state.to_string(),
        key: decoder.key_to_json(d.key),
        key_hex: hex(d.key),
        namespace_hex: hex(d.namespace),
        map_key_hex: hex(d.map_key),
        value_hex: decoded.is_none().then(|| hex(&value[..value.len().min(64)])),
        value: decoded,
        value_bytes: value.len(),
        cursor: hex(full_key),
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The bytes of a hex string (either case); `None` when it is not hex.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| s.get(i..i + 2).and_then(|p| u8::from_str_radix(p, 16).ok())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_rejects_garbage() {
        assert_eq!(hex(&[0, 0xab, 0x10]), "00ab10");
        assert_eq!(unhex("00AB10"), Some(vec![0, 0xab, 0x10]));
        assert_eq!(unhex("0"), None);
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex(""), Some(vec![]));
    }
}

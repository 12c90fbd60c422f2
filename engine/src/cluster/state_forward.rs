//! The state browser across processes: the job manager's REST API queries keyed state that
//! lives in executor processes.
//!
//! **In (job manager):** queries the REST API put into the mailboxes [`RemoteState`]
//! registered for an executor's keyed subtasks. **Out:** [`ToExecutor::StateQuery`] frames
//! on that executor's control connection. **In (executor):** those frames, handed by
//! [`ExecutorStateServer`] to the local subtask's mailbox exactly as in embedded mode (the
//! task answers between two batches). **Out:** [`FromExecutor::StateAnswer`] frames, which
//! [`RemoteState::answer`] hands to the waiting request. Requests and replies travel as JSON
//! (they hold JSON keys and values, which `bincode` cannot carry).
//!
//! Nothing here blocks a control loop: the executor polls its pending answers, and a query
//! whose executor goes away is dropped with it, which the API reports as "not running".

use super::protocol::{FromExecutor, KeyedSubtask, ToExecutor};
use crate::runtime::task::TaskCommand;
use crate::state_query::{DeliveryError, StateQueries, StateQuery, StateReply, StateRequest};
use crossbeam_channel::{Receiver, Sender};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How long an executor waits for its task's answer before giving up on a query (the job
/// manager's API has long stopped waiting by then).
const EXECUTOR_ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// Job manager side: the mailboxes of one executor's keyed subtasks and the queries sent to
/// it that await their answer.
#[derive(Debug, Default)]
pub(crate) struct RemoteState {
    mailboxes: Vec<(u32, u32, Receiver<StateQuery>)>,
    pending: HashMap<u64, oneshot::Sender<StateReply>>,
    next_id: u64,
}

impl RemoteState {
    /// Registers a mailbox in the job's `queries` for each subtask in `keyed` (replacing
    /// those of an earlier attempt); `wake` is the executor's wake channel in the attempt,
    /// woken when a query arrives.
    pub(crate) fn register(
        &mut self,
        queries: &StateQueries,
        keyed: &[KeyedSubtask],
        wake: &Sender<TaskCommand>,
    ) {
        for k in keyed {
            let rx = queries.register(k.operator, k.subtask, k.key_groups.0..k.key_groups.1, wake.clone());
            self.mailboxes.push((k.operator, k.subtask, rx));
        }
    }

    /// The queries waiting in the mailboxes, as frames for the executor.
    pub(crate) fn forward(&mut self) -> Vec<ToExecutor> {
        let mut frames = Vec::new();
        for (operator, subtask, rx) in &self.mailboxes {
            while let Ok(StateQuery { request, reply }) = rx.try_recv() {
                match serde_json::to_string(&request) {
                    Ok(request) => {
                        let id = self.next_id;
                        self.next_id += 1;
                        self.pending.insert(id, reply);
                        frames.push(ToExecutor::StateQuery {
                            id,
                            operator: *operator,
                            subtask: *subtask,
                            request,
                        });
                    }
                    Err(e) => {
                        let _ = reply.send(StateReply::Failed(format!("encoding the query: {e}")));
                    }
                }
            }
        }
        frames
    }

    /// The executor answered query `id` (`None`: its subtask is gone).
    pub(crate) fn answer(&mut self, id: u64, reply: Option<String>) {
        let Some(waiting) = self.pending.remove(&id) else { return };
        match reply.map(|json| serde_json::from_str::<StateReply>(&json)) {
            Some(Ok(reply)) => {
                let _ = waiting.send(reply);
            }
            Some(Err(e)) => {
                let _ =
                    waiting.send(StateReply::Failed(format!("undecodable answer from the executor: {e}")));
            }
            None => drop(waiting), // the API reports the job as not running
        }
    }
}

/// Executor side: hands the job manager's queries to the local subtasks and collects their
/// answers.
pub(crate) struct ExecutorStateServer {
    queries: Arc<StateQueries>,
    pending: Vec<(u64, Instant, oneshot::Receiver<StateReply>)>,
}

impl ExecutorStateServer {
    pub(crate) fn new(queries: Arc<StateQueries>) -> Self {
        ExecutorStateServer { queries, pending: Vec::new() }
    }

    /// This executor's keyed subtasks, for [`FromExecutor::Running`].
    pub(crate) fn keyed(&self) -> Vec<KeyedSubtask> {
        self.queries
            .operators()
            .into_iter()
            .flat_map(|(operator, subtasks)| {
                subtasks.into_iter().map(move |(subtask, kg)| KeyedSubtask {
                    operator,
                    subtask,
                    key_groups: (kg.start, kg.end),
                })
            })
            .collect()
    }

    /// Query `id` from the job manager: delivered to the subtask's mailbox, or answered at
    /// once when it cannot be.
    pub(crate) fn query(
        &mut self,
        id: u64,
        operator: u32,
        subtask: u32,
        request: &str,
    ) -> Option<FromExecutor> {
        let request: StateRequest = match serde_json::from_str(request) {
            Ok(r) => r,
            Err(e) => return Some(answer(id, Some(StateReply::Failed(format!("undecodable query: {e}"))))),
        };
        let mailbox = self.queries.mailboxes(operator).into_iter().find(|(s, _)| *s == subtask);
        let Some((_, mailbox)) = mailbox else { return Some(answer(id, None)) };
        let (reply, rx) = oneshot::channel();
        match mailbox.send(StateQuery { request, reply }) {
            Ok(()) => {
                self.pending.push((id, Instant::now(), rx));
                None
            }
            Err(DeliveryError::Busy) => Some(answer(
                id,
                Some(StateReply::Unavailable("the task has too many state queries waiting; retry".into())),
            )),
            Err(DeliveryError::Gone) => Some(answer(id, None)),
        }
    }

    /// The answers that arrived (or timed out) since the last call.
    pub(crate) fn ready(&mut self) -> Vec<FromExecutor> {
        let mut out = Vec::new();
        self.pending.retain_mut(|(id, since, rx)| match rx.try_recv() {
            Ok(reply) => {
                out.push(answer(*id, Some(reply)));
                false
            }
            Err(oneshot::error::TryRecvError::Closed) => {
                out.push(answer(*id, None));
                false
            }
            Err(oneshot::error::TryRecvError::Empty) if since.elapsed() > EXECUTOR_ANSWER_TIMEOUT => {
                out.push(answer(*id, Some(StateReply::Unavailable("the task did not answer; retry".into()))));
                false
            }
            Err(oneshot::error::TryRecvError::Empty) => true,
        });
        out
    }
}

fn answer(id: u64, reply: Option<StateReply>) -> FromExecutor {
    // A reply always encodes (plain data); should it not, the API reports the job as not running.
    FromExecutor::StateAnswer { id, reply: reply.and_then(|r| serde_json::to_string(&r).ok()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_query::StateEntry;

    fn entry() -> StateEntry {
        StateEntry {
            state: "window".into(),
            key: Some(serde_json::json!(7)),
            key_hex: "07".into(),
            namespace_hex: String::new(),
            map_key_hex: String::new(),
            value: Some(serde_json::json!({"count": 3})),
            value_bytes: 12,
            value_hex: None,
            cursor: "0007".into(),
        }
    }

    /// A query from the job manager's mailbox to the executor's subtask and its answer back,
    /// through the frames the control connection carries.
    #[test]
    fn a_query_crosses_to_the_executor_and_its_answer_comes_back() {
        // Executor side: subtask 1 of operator 4 owns key groups 64..128.
        let local = Arc::new(StateQueries::new());
        let (task_wake, woken) = crossbeam_channel::unbounded();
        let task_mailbox = local.register(4, 1, 64..128, task_wake);
        let mut server = ExecutorStateServer::new(local);
        let keyed = server.keyed();
        assert_eq!(keyed.len(), 1);
        assert_eq!((keyed[0].operator, keyed[0].subtask, keyed[0].key_groups), (4, 1, (64, 128)));

        // Job manager side: the mailbox registered from the executor's report.
        let jm = StateQueries::new();
        let (proxy_wake, proxy_woken) = crossbeam_channel::unbounded();
        let mut remote = RemoteState::default();
        remote.register(&jm, &keyed, &proxy_wake);
        let (_, mailbox) = jm.mailboxes(4).into_iter().next().unwrap();
        assert_eq!(mailbox.key_groups, 64..128);
        let (reply, mut answered) = oneshot::channel();
        let request = StateRequest::Lookup { key: serde_json::json!(7) };
        mailbox.send(StateQuery { request, reply }).unwrap();
        assert!(matches!(proxy_woken.try_recv(), Ok(TaskCommand::ServeStateQueries)));
        let frames = remote.forward();
        let [ToExecutor::StateQuery { id, operator, subtask, request }] = &frames[..] else {
            panic!("{frames:?}")
        };

        // The executor hands it to its task, which answers between two batches.
        assert!(server.query(*id, *operator, *subtask, request).is_none());
        assert!(matches!(woken.try_recv(), Ok(TaskCommand::ServeStateQueries)));
        let q = task_mailbox.try_recv().unwrap();
        assert!(matches!(&q.request, StateRequest::Lookup { key } if *key == 7));
        let _ = q.reply.send(StateReply::Lookup { key_group: 70, entries: vec![entry()] });
        let [FromExecutor::StateAnswer { id, reply }] = &server.ready()[..] else { panic!("no answer") };
        remote.answer(*id, reply.clone());
        match answered.try_recv() {
            Ok(StateReply::Lookup { key_group: 70, entries }) => {
                assert_eq!(entries.len(), 1);
                assert_eq!((entries[0].map_key_hex.as_str(), entries[0].value_hex.as_ref()), ("", None));
                assert_eq!(entries[0].value, Some(serde_json::json!({"count": 3})));
            }
            other => panic!("{other:?}"),
        }

        // A subtask the executor does not run: the request sees "gone".
        let (reply, mut gone) = oneshot::channel();
        mailbox.send(StateQuery { request: StateRequest::Sizes, reply }).unwrap();
        let frames = remote.forward();
        let [ToExecutor::StateQuery { id, request, .. }] = &frames[..] else { panic!("{frames:?}") };
        let Some(FromExecutor::StateAnswer { id, reply }) = server.query(*id, 4, 0, request) else {
            panic!("answered at once")
        };
        assert!(reply.is_none());
        remote.answer(id, reply);
        assert!(matches!(gone.try_recv(), Err(oneshot::error::TryRecvError::Closed)));
    }
}

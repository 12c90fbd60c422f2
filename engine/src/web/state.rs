//! The operator state browser: `GET /api/v1/jobs/{name}/state` (which operators have keyed
//! state) and, under `/api/v1/jobs/{name}/operators/{operator}/state`, a key lookup, a paged
//! listing of a key group and the sizes per key group.
//!
//! The server never reads a backend itself: it posts the query to the subtask's mailbox and
//! awaits the task's answer, which the task gives between two batches (see
//! [`crate::state_query`] for why that is safe and free for the hot path).

use super::api::{job_name, params, ApiError, Params, Reg};
use super::registry::JobEntry;
use crate::job::JobStatus;
use crate::state_query::{
    unhex, DeliveryError, Mailbox, StateEntry, StateQuery, StateReply, StateRequest, MAX_PAGE,
};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::Json;
use caudal_checkpoints::KeyGroupStats;
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

/// How long the server waits for a task's answer.
pub(crate) const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Default page size of a key-group listing.
const DEFAULT_PAGE: usize = 100;

/// `GET /api/v1/jobs/{name}/state`
#[derive(Debug, Serialize)]
pub(crate) struct StateOverview {
    pub(crate) job: String,
    pub(crate) status: JobStatus,
    /// The keyed operators (those whose state can be browsed).
    pub(crate) operators: Vec<KeyedOperator>,
}

#[derive(Debug, Serialize)]
pub(crate) struct KeyedOperator {
    pub(crate) operator_id: u32,
    pub(crate) operator: String,
    pub(crate) parallelism: usize,
    pub(crate) subtasks: Vec<KeyedSubtask>,
}

#[derive(Debug, Serialize)]
pub(crate) struct KeyedSubtask {
    pub(crate) subtask: u32,
    /// First key group owned.
    pub(crate) key_group_start: u16,
    /// One past the last key group owned.
    pub(crate) key_group_end: u16,
}

/// `GET /api/v1/jobs/{name}/operators/{operator}/state?key=…`
#[derive(Debug, Serialize)]
pub(crate) struct StateLookup {
    pub(crate) job: String,
    pub(crate) operator: String,
    pub(crate) key: serde_json::Value,
    pub(crate) key_group: u16,
    pub(crate) subtask: u32,
    pub(crate) entries: Vec<StateEntry>,
}

/// `GET /api/v1/jobs/{name}/operators/{operator}/state/keys?key_group=…`
#[derive(Debug, Serialize)]
pub(crate) struct StateKeysPage {
    pub(crate) job: String,
    pub(crate) operator: String,
    pub(crate) key_group: u16,
    pub(crate) subtask: u32,
    pub(crate) entries: Vec<StateEntry>,
    /// Pass as `after` for the next page; `null` on the last page.
    pub(crate) next: Option<String>,
}

/// `GET /api/v1/jobs/{name}/operators/{operator}/state/sizes`
#[derive(Debug, Serialize)]
pub(crate) struct StateSizes {
    pub(crate) job: String,
    pub(crate) operator: String,
    pub(crate) entries: u64,
    pub(crate) bytes: u64,
    /// Per key group, every subtask's, in key-group order.
    pub(crate) key_groups: Vec<KeyGroupSize>,
}

#[derive(Debug, Serialize)]
pub(crate) struct KeyGroupSize {
    pub(crate) key_group: u16,
    pub(crate) subtask: u32,
    pub(crate) entries: u64,
    pub(crate) bytes: u64,
}

type JobOperatorPath = Result<Path<(String, String)>, PathRejection>;

pub(crate) async fn job_state(
    State(reg): Reg,
    path: Result<Path<String>, PathRejection>,
    query: Params,
) -> Result<Json<StateOverview>, ApiError> {
    let name = job_name(path)?;
    params(query, &[])?;
    let job = reg.get(&name).ok_or_else(|| ApiError::no_job(&name))?;
    let operators = job
        .view
        .state_queries
        .operators()
        .into_iter()
        .map(|(id, subtasks)| KeyedOperator {
            operator_id: id,
            operator: operator_name(&job, id),
            parallelism: subtasks.len(),
            subtasks: subtasks
                .into_iter()
                .map(|(subtask, kg)| KeyedSubtask {
                    subtask,
                    key_group_start: kg.start,
                    key_group_end: kg.end,
                })
                .collect(),
        })
        .collect();
    Ok(Json(StateOverview { job: name, status: job.view.status(), operators }))
}

pub(crate) async fn lookup(
    State(reg): Reg,
    path: JobOperatorPath,
    query: Params,
) -> Result<Json<StateLookup>, ApiError> {
    let (job, op_id, op_name) = resolve(&reg, path)?;
    let p = params(query, &["key"])?;
    let raw = p.get("key").ok_or_else(|| ApiError::bad_parameter("key", "missing (the key to look up)"))?;
    if raw.is_empty() {
        return Err(ApiError::bad_parameter("key", "empty"));
    }
    // `7` is the number 7, `"7"` the string; text that is not JSON is a string key.
    let key: serde_json::Value =
        serde_json::from_str(raw).unwrap_or_else(|_| serde_json::Value::String(raw.clone()));
    let mailboxes = mailboxes(&job, op_id, &op_name)?;
    // The key's key group is known to the operator only (it hashes the typed key): ask all.
    let mut pending = Vec::new();
    for (subtask, mailbox) in &mailboxes {
        pending.push((*subtask, ask(&job, mailbox, StateRequest::Lookup { key: key.clone() })?));
    }
    for (subtask, rx) in pending {
        match wait(&job, rx).await? {
            StateReply::NotOwned => continue,
            StateReply::Lookup { key_group, entries } if entries.is_empty() => {
                return Err(ApiError::not_found(format!(
                    "no state for key {key} in operator `{op_name}` (key group {key_group}, subtask {subtask})"
                )))
            }
            StateReply::Lookup { key_group, entries } => {
                return Ok(Json(StateLookup {
                    job: job.view.name.clone(),
                    operator: op_name,
                    key,
                    key_group,
                    subtask,
                    entries,
                }))
            }
            other => return Err(reply_error(other, "key")),
        }
    }
    Err(ApiError::not_found(format!("no subtask of operator `{op_name}` owns key {key}")))
}

pub(crate) async fn keys(
    State(reg): Reg,
    path: JobOperatorPath,
    query: Params,
) -> Result<Json<StateKeysPage>, ApiError> {
    let (job, op_id, op_name) = resolve(&reg, path)?;
    let p = params(query, &["key_group", "after", "limit"])?;
    let key_group = match p.get("key_group") {
        None => return Err(ApiError::bad_parameter("key_group", "missing (a key group number)")),
        Some(s) => s.parse::<u16>().map_err(|_| {
            ApiError::bad_parameter("key_group", format!("expected a key group number, got `{s}`"))
        })?,
    };
    let after = match p.get("after") {
        None => None,
        Some(s) => Some(unhex(s).filter(|b| !b.is_empty()).ok_or_else(|| {
            ApiError::bad_parameter(
                "after",
                format!("expected the hex `next` of the previous page, got `{s}`"),
            )
        })?),
    };
    let limit = match p.get("limit") {
        None => DEFAULT_PAGE,
        Some(s) => s.parse::<usize>().ok().filter(|l| (1..=MAX_PAGE).contains(l)).ok_or_else(|| {
            ApiError::bad_parameter("limit", format!("expected 1 to {MAX_PAGE}, got `{s}`"))
        })?,
    };
    let mailboxes = mailboxes(&job, op_id, &op_name)?;
    let Some((subtask, mailbox)) = mailboxes.iter().find(|(_, m)| m.key_groups.contains(&key_group)) else {
        let max = mailboxes.iter().map(|(_, m)| m.key_groups.end).max().unwrap_or(0);
        return Err(ApiError::bad_parameter(
            "key_group",
            format!("operator `{op_name}` has key groups 0 to {}, not {key_group}", max.saturating_sub(1)),
        ));
    };
    let rx = ask(&job, mailbox, StateRequest::Keys { key_group, after, limit })?;
    match wait(&job, rx).await? {
        StateReply::Keys { entries, next } => Ok(Json(StateKeysPage {
            job: job.view.name.clone(),
            operator: op_name,
            key_group,
            subtask: *subtask,
            entries,
            next,
        })),
        other => Err(reply_error(other, "after")),
    }
}

pub(crate) async fn sizes(
    State(reg): Reg,
    path: JobOperatorPath,
    query: Params,
) -> Result<Json<StateSizes>, ApiError> {
    let (job, op_id, op_name) = resolve(&reg, path)?;
    params(query, &[])?;
    let mut pending = Vec::new();
    for (subtask, mailbox) in mailboxes(&job, op_id, &op_name)? {
        pending.push((subtask, ask(&job, &mailbox, StateRequest::Sizes)?));
    }
    let mut key_groups = Vec::new();
    for (subtask, rx) in pending {
        match wait(&job, rx).await? {
            StateReply::Sizes(stats) => {
                key_groups.extend(stats.into_iter().map(|KeyGroupStats { key_group, entries, bytes }| {
                    KeyGroupSize { key_group, subtask, entries, bytes }
                }))
            }
            other => return Err(reply_error(other, "operator")),
        }
    }
    key_groups.sort_by_key(|k| k.key_group);
    Ok(Json(StateSizes {
        job: job.view.name.clone(),
        operator: op_name,
        entries: key_groups.iter().map(|k| k.entries).sum(),
        bytes: key_groups.iter().map(|k| k.bytes).sum(),
        key_groups,
    }))
}

fn operator_name(job: &JobEntry, id: u32) -> String {
    job.view.plan.operators.get(id as usize).map_or_else(|| id.to_string(), |o| o.name.clone())
}

/// The job and the operator (by name, or by id) of the path.
fn resolve(
    reg: &super::registry::JobRegistry,
    path: JobOperatorPath,
) -> Result<(Arc<JobEntry>, u32, String), ApiError> {
    let Path((name, operator)) = path.map_err(|e| ApiError::bad_parameter("operator", e.body_text()))?;
    let job = reg.get(&name).ok_or_else(|| ApiError::no_job(&name))?;
    let ops = &job.view.plan.operators;
    let id = ops
        .iter()
        .position(|o| o.name == operator)
        .or_else(|| operator.parse::<usize>().ok().filter(|i| *i < ops.len()))
        .ok_or_else(|| ApiError::not_found(format!("job `{name}` has no operator `{operator}`")))?;
    let op_name = ops[id].name.clone();
    Ok((job, id as u32, op_name))
}

fn mailboxes(job: &JobEntry, id: u32, op_name: &str) -> Result<Vec<(u32, Mailbox)>, ApiError> {
    let m = job.view.state_queries.mailboxes(id);
    if m.is_empty() {
        return Err(ApiError::not_found(format!(
            "operator `{op_name}` has no keyed state to browse (only operators after a key_by have; \
             in cluster mode, once its subtasks run)"
        )));
    }
    Ok(m)
}

fn ask(
    job: &JobEntry,
    mailbox: &Mailbox,
    request: StateRequest,
) -> Result<tokio::sync::oneshot::Receiver<StateReply>, ApiError> {
    let (reply, rx) = tokio::sync::oneshot::channel();
    mailbox.send(StateQuery { request, reply }).map_err(|e| match e {
        DeliveryError::Busy => ApiError::unavailable("the task has too many state queries waiting; retry"),
        DeliveryError::Gone => not_running(job),
    })?;
    Ok(rx)
}

async fn wait(
    job: &JobEntry,
    rx: tokio::sync::oneshot::Receiver<StateReply>,
) -> Result<StateReply, ApiError> {
    match tokio::time::timeout(ANSWER_TIMEOUT, rx).await {
        Ok(Ok(reply)) => Ok(reply),
        Ok(Err(_)) => Err(not_running(job)),
        Err(_) => Err(ApiError::unavailable(format!(
            "the task did not answer within {} s (it may be blocked by backpressure); retry",
            ANSWER_TIMEOUT.as_secs()
        ))),
    }
}

fn not_running(job: &JobEntry) -> ApiError {
    ApiError::conflict(format!(
        "job `{}` is {:?}: its state can be browsed only while it runs",
        job.view.name,
        job.view.status()
    ))
}

fn reply_error(reply: StateReply, parameter: &str) -> ApiError {
    match reply {
        StateReply::BadRequest(m) => ApiError::bad_parameter(parameter, m),
        StateReply::Failed(m) => ApiError::internal(format!("reading the state failed: {m}")),
        StateReply::Unavailable(m) => ApiError::unavailable(m),
        other => ApiError::internal(format!("unexpected answer from the task: {other:?}")),
    }
}

//! The job manager's own endpoints, next to the REST API of its jobs:
//!
//! | method | path | |
//! |---|---|---|
//! | GET | `/api/v1/cluster` | control port, checkpoint storage, task managers and slots |
//! | PUT | `/api/v1/cluster/blobs/{sha256}` | upload a job binary (body: the file) |
//! | GET | `/api/v1/cluster/blobs/{sha256}` | download it (task managers do) |
//! | GET | `/api/v1/cluster/jobs` | every job: status, detail, attempts, failures |
//! | POST | `/api/v1/cluster/jobs` | submit ([`SubmitRequest`]) |
//! | POST | `/api/v1/cluster/jobs/{name}/cancel` | cancel |
//! | POST | `/api/v1/cluster/jobs/{name}/stop` | final checkpoint, then stop (resumable); body `{"savepoint": "NAME"}` (optional) also copies it to `savepoints/NAME` |
//!
//! Savepoints of a running job: `POST /api/v1/jobs/{name}/savepoints` (the jobs' REST API).

use super::job::{is_final, ClusterJobView};
use super::submit::{submit, Refused, SubmitRequest};
use super::taskmanagers::TaskManagerView;
use super::Cluster;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

type St = State<Arc<Cluster>>;

/// `GET /api/v1/cluster`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterInfo {
    /// The control port's address as bound (task managers use its port with the host they reached).
    pub rpc_addr: String,
    /// The control port.
    pub rpc_port: u16,
    /// Checkpoint storage of every job.
    pub checkpoint_url: String,
    /// Slots in all task managers.
    pub slots_total: u32,
    /// Slots free.
    pub slots_free: u32,
    /// The task managers.
    pub task_managers: Vec<TaskManagerView>,
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(serde_json::json!({ "error": message.into() }))).into_response()
}

pub(crate) fn routes(cluster: Arc<Cluster>) -> Router {
    Router::new()
        .route("/api/v1/cluster", get(info))
        .route("/api/v1/cluster/blobs/{sha}", put(upload).get(download))
        .route("/api/v1/cluster/jobs", get(list).post(submit_job))
        .route("/api/v1/cluster/jobs/{name}/cancel", post(cancel))
        .route("/api/v1/cluster/jobs/{name}/stop", post(stop))
        .layer(DefaultBodyLimit::disable())
        .with_state(cluster)
}

async fn info(State(c): St) -> Json<ClusterInfo> {
    let (free, total, _, _) = c.tms.capacity();
    Json(ClusterInfo {
        rpc_addr: c.rpc_addr.to_string(),
        rpc_port: c.rpc_addr.port(),
        checkpoint_url: c.config.checkpoint_url.clone(),
        slots_total: total,
        slots_free: free,
        task_managers: c.tms.views(),
    })
}

/// Streams the upload into the blob store (binaries are hundreds of MB in debug builds).
async fn upload(State(c): St, Path(sha): Path<String>, body: Body) -> Response {
    if c.blobs.contains(&sha) {
        // Read what the client sends anyway: closing early would break its upload.
        let mut stream = body.into_data_stream();
        while let Some(Ok(_)) = stream.next().await {}
        return (StatusCode::OK, Json(serde_json::json!({ "binary_sha256": sha }))).into_response();
    }
    let mut writer = match c.blobs.writer(&sha) {
        Ok(w) => Some(w),
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    // A refused upload (not an executable, too large) stores nothing more; the rest of the
    // body is read and dropped (up to the size limit) so the client gets the reason.
    let mut refused: Option<String> = None;
    let mut dropped = 0u64;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("receiving binary {sha}: {e}")),
        };
        match writer.as_mut() {
            Some(w) => {
                if let Err(e) = w.write(&chunk) {
                    refused = Some(e.to_string());
                    writer = None; // deletes what was written
                }
            }
            None => {
                dropped += chunk.len() as u64;
                if dropped > crate::cluster::blob::MAX_BINARY_BYTES {
                    break;
                }
            }
        }
    }
    if let Some(why) = refused {
        let status =
            if why.contains("larger than") { StatusCode::PAYLOAD_TOO_LARGE } else { StatusCode::BAD_REQUEST };
        return error(status, why);
    }
    let Some(writer) = writer else { return error(StatusCode::BAD_REQUEST, "upload refused") };
    match tokio::task::spawn_blocking(move || writer.finish()).await {
        Ok(Ok(_)) => (StatusCode::CREATED, Json(serde_json::json!({ "binary_sha256": sha }))).into_response(),
        Ok(Err(e)) => error(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn download(State(c): St, Path(sha): Path<String>) -> Response {
    if !c.blobs.contains(&sha) {
        return error(StatusCode::NOT_FOUND, format!("no binary {sha}"));
    }
    match tokio::fs::File::open(c.blobs.path(&sha)).await {
        Ok(file) => {
            let body = Body::from_stream(chunks(file));
            ([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response()
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// A file as a stream of 1 MB chunks.
fn chunks(file: tokio::fs::File) -> impl futures::Stream<Item = std::io::Result<Vec<u8>>> + Send + 'static {
    futures::stream::unfold(file, |mut file| async move {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0u8; 1 << 20];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(buf), file))
            }
            Err(e) => Some((Err(e), file)),
        }
    })
}

async fn list(State(c): St) -> Json<Vec<ClusterJobView>> {
    let jobs: Vec<_> = c.jobs.lock().values().cloned().collect();
    let mut views: Vec<ClusterJobView> = jobs.iter().map(|j| j.summary()).collect();
    let ended = c.ended.lock();
    views.extend(ended.values().filter(|e| !jobs.iter().any(|j| j.name() == e.name)).cloned());
    views.sort_by(|a, b| a.name.cmp(&b.name));
    Json(views)
}

async fn submit_job(
    State(c): St,
    body: Result<Json<SubmitRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Json(req) = match body {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid submit request: {e}")),
    };
    match tokio::task::spawn_blocking(move || submit(&c, req)).await {
        Ok(Ok(view)) => (StatusCode::CREATED, Json(view)).into_response(),
        Ok(Err(Refused::Invalid(m))) => error(StatusCode::BAD_REQUEST, m),
        Ok(Err(Refused::Conflict(m))) => error(StatusCode::CONFLICT, m),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn cancel(State(c): St, Path(name): Path<String>) -> Response {
    let Some(job) = c.jobs.lock().get(&name).cloned() else {
        return not_running(&c, &name);
    };
    let status = job.view.status();
    if is_final(status) {
        return error(StatusCode::CONFLICT, format!("job `{name}` has already ended ({status:?})"));
    }
    job.view.cancel();
    (StatusCode::ACCEPTED, Json(job.summary())).into_response()
}

/// The answer to a cancel or stop of a job this job manager does not run.
fn not_running(c: &Cluster, name: &str) -> Response {
    match c.ended.lock().get(name) {
        Some(e) => error(StatusCode::CONFLICT, format!("job `{name}` has already ended ({:?})", e.status)),
        None => error(StatusCode::NOT_FOUND, format!("no job named `{name}`")),
    }
}

/// The body of a stop (optional).
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StopRequest {
    /// Also copy the final checkpoint to `savepoints/<name>` (kept until deleted).
    pub savepoint: Option<String>,
}

async fn stop(State(c): St, Path(name): Path<String>, body: axum::body::Bytes) -> Response {
    let Some(job) = c.jobs.lock().get(&name).cloned() else {
        return not_running(&c, &name);
    };
    let request: StopRequest = if body.iter().all(u8::is_ascii_whitespace) {
        StopRequest::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid stop request: {e}")),
        }
    };
    let status = job.view.status();
    if is_final(status) {
        return error(StatusCode::CONFLICT, format!("job `{name}` has already ended ({status:?})"));
    }
    match job.view.request_stop(request.savepoint) {
        Ok(()) => {}
        Err(e @ crate::job::SavepointRefused::InvalidName(_)) => {
            return error(StatusCode::BAD_REQUEST, e.to_string())
        }
        Err(e) => return error(StatusCode::CONFLICT, e.to_string()),
    }
    (StatusCode::ACCEPTED, Json(job.summary())).into_response()
}

//! Savepoints of a running job: `POST /api/v1/jobs/{name}/savepoints` asks for one (body
//! `{"name": "…"}`, optional), `GET` lists those asked for with their status and restore
//! path. The job's checkpoint coordinator takes a checkpoint at once (after the one in
//! flight) and copies it to `<storage>/<job>/savepoints/<name>/`; `--restore
//! savepoints/<name>` resumes from it, at any parallelism. `POST /api/v1/jobs/{name}/stop`
//! (body `{"savepoint": "…"}`, optional) stops the job after a final checkpoint, kept as a
//! savepoint when named. The same endpoints serve an embedded job and every job of a job
//! manager (`caudal savepoint JOB`).

use super::api::{job_name, params, ApiError, Params, Reg};
use crate::job::{SavepointRefused, SavepointRequest};
use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};

/// `GET /api/v1/jobs/{name}/savepoints`
#[derive(Debug, Serialize, Deserialize)]
pub struct SavepointsView {
    /// The job.
    pub job: String,
    /// Savepoints asked for while it ran, oldest first.
    pub savepoints: Vec<SavepointRequest>,
}

/// The body of `POST /api/v1/jobs/{name}/savepoints`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavepointBody {
    name: Option<String>,
}

/// The body of `POST /api/v1/jobs/{name}/stop`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StopBody {
    savepoint: Option<String>,
}

/// `POST /api/v1/jobs/{name}/stop`
#[derive(Debug, Serialize)]
pub(super) struct StopView {
    job: String,
    stop_requested: bool,
    savepoint: Option<String>,
    status: crate::JobStatus,
}

/// Parses an optional JSON body (empty: the default).
fn body<T: Default + serde::de::DeserializeOwned>(bytes: &Bytes) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        Ok(T::default())
    } else {
        serde_json::from_slice(bytes).map_err(|e| ApiError::bad_parameter("body", e))
    }
}

fn refused(e: SavepointRefused) -> ApiError {
    match e {
        SavepointRefused::InvalidName(_) => ApiError::bad_parameter("name", e),
        _ => ApiError::conflict(e.to_string()),
    }
}

pub(super) async fn stop(
    axum::extract::State(reg): Reg,
    path: Result<Path<String>, PathRejection>,
    query: Params,
    bytes: Bytes,
) -> Result<(StatusCode, Json<StopView>), ApiError> {
    let name = job_name(path)?;
    params(query, &[])?;
    let job = reg.get(&name).ok_or_else(|| ApiError::no_job(&name))?;
    let request: StopBody = body(&bytes)?;
    let status = job.view.status();
    if super::registry::is_final(status) {
        return Err(ApiError::conflict(format!("job `{name}` has already ended ({status:?})")));
    }
    job.view.request_stop(request.savepoint.clone()).map_err(refused)?;
    let view = StopView { job: name, stop_requested: true, savepoint: request.savepoint, status };
    Ok((StatusCode::ACCEPTED, Json(view)))
}

pub(super) async fn list(
    axum::extract::State(reg): Reg,
    path: Result<Path<String>, PathRejection>,
    query: Params,
) -> Result<Json<SavepointsView>, ApiError> {
    let name = job_name(path)?;
    params(query, &[])?;
    let job = reg.get(&name).ok_or_else(|| ApiError::no_job(&name))?;
    Ok(Json(SavepointsView { job: name, savepoints: job.view.savepoints() }))
}

pub(super) async fn trigger(
    axum::extract::State(reg): Reg,
    path: Result<Path<String>, PathRejection>,
    query: Params,
    bytes: Bytes,
) -> Result<(StatusCode, Json<SavepointRequest>), ApiError> {
    let name = job_name(path)?;
    params(query, &[])?;
    let job = reg.get(&name).ok_or_else(|| ApiError::no_job(&name))?;
    let request: SavepointBody = body(&bytes)?;
    let asked = job.view.request_savepoint(request.name).map_err(refused)?;
    Ok((StatusCode::ACCEPTED, Json(asked)))
}

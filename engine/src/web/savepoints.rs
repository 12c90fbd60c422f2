//! Savepoints of a running job: `POST /api/v1/jobs/{name}/savepoints` asks for one (body
//! `{"name": "…"}`, optional), `GET` lists those asked for with their status and restore
//! path. The job's checkpoint coordinator takes a checkpoint at once (after the one in
//! flight) and copies it to `<storage>/<job>/savepoints/<name>/`; `--restore
//! savepoints/<name>` resumes from it, at any parallelism. The same endpoints serve an
//! embedded job and every job of a job manager (`caudal savepoint JOB`).

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
    body: Bytes,
) -> Result<(StatusCode, Json<SavepointRequest>), ApiError> {
    let name = job_name(path)?;
    params(query, &[])?;
    let job = reg.get(&name).ok_or_else(|| ApiError::no_job(&name))?;
    let body: SavepointBody = if body.iter().all(u8::is_ascii_whitespace) {
        SavepointBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_parameter("body", e))?
    };
    match job.view.request_savepoint(body.name) {
        Ok(request) => Ok((StatusCode::ACCEPTED, Json(request))),
        Err(e @ SavepointRefused::InvalidName(_)) => Err(ApiError::bad_parameter("name", e)),
        Err(e) => Err(ApiError::conflict(e.to_string())),
    }
}

//! The router: `/api/v1` (JSON), `/metrics` (Prometheus) and the UI's pages and assets.

use super::kafka::KafkaView;
use super::registry::JobRegistry;
use super::transactions::TransactionsView;
use super::views::{
    status_name, CancelView, CheckpointsView, ErrorBody, JobDetail, JobList, JobSummary, MetricsView,
    WatermarksView, ALL_STATUSES, MAX_HISTORY_SECS,
};
use super::{assets, prometheus, savepoints, state};
use crate::job::now_ms;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The OpenAPI 3 document of every endpoint.
pub(crate) const OPENAPI_JSON: &str = include_str!("openapi.json");

pub(super) type Reg = State<Arc<JobRegistry>>;
pub(super) type Params = Result<Query<BTreeMap<String, String>>, QueryRejection>;

/// An error answered as `{ "error": "..." }` with its status code.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub(super) fn not_found(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::NOT_FOUND, message: message.into() }
    }

    /// 409: the request does not fit the job's status.
    pub(super) fn conflict(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::CONFLICT, message: message.into() }
    }

    /// 503: try again later.
    pub(super) fn unavailable(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: message.into() }
    }

    /// 500: the server failed (never for bad input).
    pub(super) fn internal(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, message: message.into() }
    }

    pub(super) fn bad_parameter(name: &str, message: impl std::fmt::Display) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: format!("invalid parameter `{name}`: {message}"),
        }
    }

    pub(super) fn no_job(name: &str) -> Self {
        Self::not_found(format!("no job named `{name}`"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(ErrorBody { error: self.message })).into_response()
    }
}

type ApiResult<T> = Result<Json<T>, ApiError>;

/// The whole application.
pub(crate) fn router(registry: Arc<JobRegistry>) -> Router {
    let api = Router::new()
        .route("/jobs", get(list_jobs))
        .route("/jobs/{name}", get(job_detail))
        .route("/jobs/{name}/metrics", get(job_metrics))
        .route("/jobs/{name}/watermarks", get(job_watermarks))
        .route("/jobs/{name}/checkpoints", get(job_checkpoints))
        .route("/jobs/{name}/kafka", get(job_kafka))
        .route("/jobs/{name}/cancel", post(cancel_job))
        .route("/jobs/{name}/savepoints", get(savepoints::list).post(savepoints::trigger))
        .route("/jobs/{name}/stop", post(savepoints::stop))
        .route("/jobs/{name}/transactions", get(job_transactions))
        .route("/jobs/{name}/state", get(state::job_state))
        .route("/jobs/{name}/operators/{operator}/state", get(state::lookup))
        .route("/jobs/{name}/operators/{operator}/state/keys", get(state::keys))
        .route("/jobs/{name}/operators/{operator}/state/sizes", get(state::sizes))
        .route("/openapi.json", get(openapi));
    Router::new()
        .nest("/api/v1", api)
        .route("/metrics", get(prometheus_metrics))
        .route("/", get(assets::index))
        .route("/jobs/{name}", get(assets::index))
        .route("/assets/{file}", get(assets::asset))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(registry)
}

/// Query parameters, rejecting any that is not in `known`.
pub(super) fn params(query: Params, known: &[&str]) -> Result<BTreeMap<String, String>, ApiError> {
    let Query(map) = query.map_err(|e| ApiError {
        status: StatusCode::BAD_REQUEST,
        message: format!("malformed query string: {}", e.body_text()),
    })?;
    if let Some(unknown) = map.keys().find(|k| !known.contains(&k.as_str())) {
        let expected = if known.is_empty() { "none".to_string() } else { known.join(", ") };
        return Err(ApiError::bad_parameter(unknown, format!("unknown parameter (expected: {expected})")));
    }
    Ok(map)
}

pub(super) fn job_name(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    path.map(|Path(name)| name).map_err(|e| ApiError::bad_parameter("name", e.body_text()))
}

async fn list_jobs(State(reg): Reg, query: Params) -> ApiResult<JobList> {
    let p = params(query, &["status"])?;
    let status = match p.get("status") {
        None => None,
        Some(s) => {
            Some(ALL_STATUSES.into_iter().find(|st| status_name(*st).eq_ignore_ascii_case(s)).ok_or_else(
                || {
                    let names: Vec<String> = ALL_STATUSES.iter().map(|s| status_name(*s)).collect();
                    ApiError::bad_parameter("status", format!("`{s}` is not one of {}", names.join(", ")))
                },
            )?)
        }
    };
    let now = now_ms();
    let jobs = reg
        .list()
        .iter()
        .filter(|j| status.is_none_or(|s| j.view.status() == s))
        .map(|j| JobSummary::of(j, now))
        .collect();
    Ok(Json(JobList { jobs }))
}

async fn job_detail(
    State(reg): Reg,
    path: Result<Path<String>, PathRejection>,
    query: Params,
) -> ApiResult<JobDetail> {
    let name = job_name(path)?;
    params(query, &[])?;
    let job = reg.get(&name).ok_or_else(|| ApiError::no_job(&name))?;
    Ok(Json(JobDetail::of(&job, now_ms())))
}

async fn job_metrics(
    State(reg): Reg,
    path: Result<Path<String>, PathRejection>,
    query: Params,
) -> ApiResult<MetricsView> {
    let name = job_name(path)?;
    let p = params(query, &["history"])?;
    let history = history_secs(&p)?;
    let job = reg.get(&name).ok_or_else(|| ApiError::no_job(&name))?;
    Ok(Json(MetricsView::of(&job, now_ms(), history)))
}

/// The `history` parameter: whole seconds from 0 to [`MAX_HISTORY_SECS`].
fn history_secs(p: &BTreeMap<String, String>) -> Result<Option<u64>, ApiError> {
    match p.get("history") {
        None => Ok(None),
        Some(h) => match h.parse::<u64>() {
            Ok(secs) if secs <= MAX_HISTORY_SECS => Ok(Some(secs)),
            _ => Err(ApiError::bad_parameter(
                "history",
                format!("expected whole seconds from 0 to {MAX_HISTORY_SECS}, got `{h}`"),
            )),
        },
    }
}

async fn job_kafka(
    State(reg): Reg,
    path: Result<Path<String>, PathRejection>,
    query: Params,
) -> ApiResult<KafkaView> {
    let name = job_name(path)?;
    let p = params(query, &["history"])?;
    let history = history_secs(&p)?.unwrap_or(MAX_HISTORY_SECS);
    let job = reg.get(&name).ok_or_else(|| ApiError::no_job(&name))?;
    Ok(Json(KafkaView::of(&job, now_ms(), Duration::from_secs(history))))
}

async fn job_transactions(
    State(reg): Reg,
    path: Result<Path<String>, PathRejection>,
    query: Params,
) -> ApiResult<TransactionsView> {
    let name = job_name(path)?;
    params(query, &[])?;
    let job = reg.get(&name).ok_or_else(|| ApiError::no_job(&name))?;
    Ok(Json(TransactionsView::of(&job, now_ms())))
}

async fn job_watermarks(
    State(reg): Reg,
    path: Result<Path<String>, PathRejection>,
    query: Params,
) -> ApiResult<WatermarksView> {
    let name = job_name(path)?;
    params(query, &[])?;
    let job = reg.get(&name).ok_or_else(|| ApiError::no_job(&name))?;
    Ok(Json(WatermarksView::of(&job, now_ms())))
}

async fn job_checkpoints(
    State(reg): Reg,
    path: Result<Path<String>, PathRejection>,
    query: Params,
) -> ApiResult<CheckpointsView> {
    let name = job_name(path)?;
    params(query, &[])?;
    let job = reg.get(&name).ok_or_else(|| ApiError::no_job(&name))?;
    Ok(Json(CheckpointsView::of(&job)))
}

async fn cancel_job(
    State(reg): Reg,
    path: Result<Path<String>, PathRejection>,
    query: Params,
) -> Result<(StatusCode, Json<CancelView>), ApiError> {
    let name = job_name(path)?;
    params(query, &[])?;
    let job = reg.get(&name).ok_or_else(|| ApiError::no_job(&name))?;
    let status = job.view.status();
    if super::registry::is_final(status) {
        return Err(ApiError {
            status: StatusCode::CONFLICT,
            message: format!("job `{name}` has already ended ({})", status_name(status)),
        });
    }
    job.view.cancel();
    Ok((StatusCode::ACCEPTED, Json(CancelView { job: name, cancel_requested: true, status })))
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON).into_response()
}

async fn prometheus_metrics(State(reg): Reg) -> Response {
    ([(header::CONTENT_TYPE, prometheus::CONTENT_TYPE)], prometheus::render(&reg)).into_response()
}

async fn not_found(uri: Uri) -> Response {
    if uri.path().starts_with("/api/") {
        ApiError::not_found(format!("no endpoint `{}`; see /api/v1/openapi.json", uri.path())).into_response()
    } else {
        assets::not_found_page()
    }
}

async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: format!("method {method} is not allowed on `{}`; see /api/v1/openapi.json", uri.path()),
    }
    .into_response()
}

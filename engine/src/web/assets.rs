//! The web UI: plain HTML, CSS and JavaScript compiled into the binary.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const KAFKA_JS: &str = include_str!("assets/kafka.js");
const STATE_JS: &str = include_str!("assets/state.js");
const APP_CSS: &str = include_str!("assets/app.css");
const FAVICON_SVG: &str = include_str!("assets/favicon.svg");

fn page(status: StatusCode, content_type: &'static str, body: &'static str) -> Response {
    (status, [(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body)
        .into_response()
}

/// The single page: the overview at `/`, a job at `/jobs/{name}` (routed in app.js).
pub(crate) async fn index() -> Response {
    page(StatusCode::OK, "text/html; charset=utf-8", INDEX_HTML)
}

/// `/assets/{file}`
pub(crate) async fn asset(Path(file): Path<String>) -> Response {
    match file.as_str() {
        "app.js" => page(StatusCode::OK, "text/javascript; charset=utf-8", APP_JS),
        "kafka.js" => page(StatusCode::OK, "text/javascript; charset=utf-8", KAFKA_JS),
        "state.js" => page(StatusCode::OK, "text/javascript; charset=utf-8", STATE_JS),
        "app.css" => page(StatusCode::OK, "text/css; charset=utf-8", APP_CSS),
        "favicon.svg" => page(StatusCode::OK, "image/svg+xml", FAVICON_SVG),
        _ => not_found_page(),
    }
}

/// A plain 404 page for paths outside the API.
pub(crate) fn not_found_page() -> Response {
    page(
        StatusCode::NOT_FOUND,
        "text/html; charset=utf-8",
        "<!doctype html><title>Not found · Caudal</title><p>Not found. <a href=\"/\">Jobs</a></p>",
    )
}

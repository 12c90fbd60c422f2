//! What keeps other web sites out of the REST API and UI: every request is checked before
//! any handler sees it.
//!
//! * **DNS rebinding**: the `Host` a request names must be one this server answers to — an
//!   IP address (a rebinding page always names a host), `localhost` (or `*.localhost`), or
//!   a name given with `--ui-allowed-host` (`web_allowed_hosts`). Otherwise 403: a page of
//!   `evil.example` that resolves its name to 127.0.0.1 reads nothing.
//! * **Cross-site requests**: a request that changes state (any method but GET, HEAD,
//!   OPTIONS) needs a content type a browser can only send cross-site after a CORS preflight
//!   (`application/json`, or `application/octet-stream` for uploads), which this server never
//!   grants; and when it comes from a browser (`Origin`, `Sec-Fetch-Site`), the origin must be
//!   this server's own. So neither a form post nor a `fetch` of another page stops a job.
//!
//! Clients that are not browsers (curl, `caudal`, scripts) send no `Origin` and are not
//! affected beyond the content type.

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::sync::Arc;

/// The hosts a server answers to besides IP addresses and `localhost`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Guard {
    allowed_hosts: Vec<String>,
    /// When set (a job manager listening off loopback), every request must carry
    /// `Authorization: Bearer <the cluster secret>`.
    bearer: Option<crate::cluster::auth::ClusterSecret>,
}

impl Guard {
    pub(crate) fn new(allowed_hosts: &[String], bearer: Option<crate::cluster::auth::ClusterSecret>) -> Self {
        Guard { allowed_hosts: allowed_hosts.iter().map(|h| h.trim().to_ascii_lowercase()).collect(), bearer }
    }

    /// Why `host` (a `Host` header's value, `name[:port]`) is refused, if it is.
    fn refuse_host(&self, host: &str) -> Option<String> {
        let name = host_name(host).to_ascii_lowercase();
        let ok = name.parse::<std::net::IpAddr>().is_ok()
            || name == "localhost"
            || name.ends_with(".localhost")
            || self.allowed_hosts.contains(&name);
        (!ok).then(|| {
            format!(
                "this server does not answer to the host `{name}` (protection against DNS rebinding); \
                 allow it with --ui-allowed-host {name} (CAUDAL__WEB_ALLOWED_HOSTS)"
            )
        })
    }

    /// Why a request is refused, if it is: the status and the message.
    fn check(&self, req: &Request) -> Option<(StatusCode, String)> {
        let headers = req.headers();
        let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
        if let Some(secret) = &self.bearer {
            if !text(header::AUTHORIZATION).is_some_and(|h| secret.accepts_bearer(h)) {
                return Some((
                    StatusCode::UNAUTHORIZED,
                    "this job manager listens off loopback: every request needs `Authorization: Bearer <the \
                     cluster secret>` (caudal commands: --secret-file or CAUDAL_CLUSTER_SECRET_FILE)"
                        .to_string(),
                ));
            }
        }
        let host =
            text(header::HOST).map(str::to_string).or_else(|| req.uri().authority().map(|a| a.to_string()));
        if let Some(host) = &host {
            if let Some(why) = self.refuse_host(host) {
                return Some((StatusCode::FORBIDDEN, why));
            }
        }
        if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
            return None;
        }
        let content_type = text(header::CONTENT_TYPE).unwrap_or("");
        let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        if !matches!(essence.as_str(), "application/json" | "application/octet-stream") {
            return Some((
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "a {} request needs Content-Type: application/json (got `{content_type}`): \
                     requests any web page could send are refused",
                    req.method()
                ),
            ));
        }
        if let Some(site) = text(header::HeaderName::from_static("sec-fetch-site")) {
            if !matches!(site, "same-origin" | "none") {
                return Some((
                    StatusCode::FORBIDDEN,
                    format!("cross-site request refused (Sec-Fetch-Site: {site})"),
                ));
            }
        }
        if let Some(origin) = text(header::ORIGIN) {
            let own = host.as_deref().is_some_and(|h| {
                origin.eq_ignore_ascii_case(&format!("http://{h}"))
                    || origin.eq_ignore_ascii_case(&format!("https://{h}"))
            });
            if !own {
                return Some((
                    StatusCode::FORBIDDEN,
                    format!(
                        "cross-origin request refused (Origin: {origin}, this server: {})",
                        host.unwrap_or_default()
                    ),
                ));
            }
        }
        None
    }
}

/// `name` of `name`, `name:port`, `[v6]` or `[v6]:port`.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// The middleware.
pub(crate) async fn guard(State(guard): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    match guard.check(&req) {
        Some((status, message)) => (status, Json(serde_json::json!({ "error": message }))).into_response(),
        None => next.run(req).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    fn request(method: &str, headers: &[(&str, &str)]) -> Request {
        let mut b = Request::builder().method(method).uri("/api/v1/jobs/j/cancel");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Body::empty()).unwrap()
    }

    #[test]
    fn hosts_other_than_addresses_localhost_and_allowed_names_are_refused() {
        let g = Guard::new(&["caudal.internal".into()], None);
        for ok in [
            "127.0.0.1:8081",
            "localhost:8081",
            "LOCALHOST",
            "app.localhost:1",
            "[::1]:8081",
            "10.0.0.5",
            "caudal.internal:8081",
        ] {
            assert_eq!(g.check(&request("GET", &[("host", ok)])), None, "{ok}");
        }
        let (status, why) = g.check(&request("GET", &[("host", "evil.example:8081")])).unwrap();
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(why.contains("--ui-allowed-host evil.example"), "{why}");
        assert!(g.check(&request("GET", &[("host", "localhost.evil.example")])).is_some());
    }

    #[test]
    fn state_changes_need_json_and_the_servers_own_origin() {
        let g = Guard::default();
        let host = ("host", "127.0.0.1:8081");
        let json = ("content-type", "application/json");
        // curl, caudal: no Origin.
        assert_eq!(g.check(&request("POST", &[host, json])), None);
        assert_eq!(g.check(&request("PUT", &[host, ("content-type", "application/octet-stream")])), None);
        // The UI itself.
        let own = [host, json, ("origin", "http://127.0.0.1:8081"), ("sec-fetch-site", "same-origin")];
        assert_eq!(g.check(&request("POST", &own)), None);
        // What any page can send without a preflight.
        for simple in
            ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""]
        {
            let r = g.check(&request("POST", &[host, ("content-type", simple)])).unwrap();
            assert_eq!(r.0, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{simple}");
        }
        let (status, _) = g.check(&request("POST", &[host])).unwrap();
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        // Another origin, even on this machine.
        for (k, v) in
            [("origin", "http://evil.example"), ("origin", "http://127.0.0.1:3000"), ("origin", "null")]
        {
            let (status, why) = g.check(&request("POST", &[host, json, (k, v)])).unwrap();
            assert_eq!(status, StatusCode::FORBIDDEN, "{v}: {why}");
        }
        for site in ["cross-site", "same-site"] {
            let r = g.check(&request("POST", &[host, json, ("sec-fetch-site", site)])).unwrap();
            assert_eq!(r.0, StatusCode::FORBIDDEN, "{site}");
        }
        // Reads stay open to any client of an allowed host.
        assert_eq!(g.check(&request("GET", &[host, ("origin", "http://evil.example")])), None);
    }
}

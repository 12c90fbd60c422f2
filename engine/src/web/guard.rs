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
//! * **Off loopback** (a job manager on another interface, with a cluster secret or TLS):
//!   every request needs `Authorization: Bearer <secret>`, the web UI's session cookie, or —
//!   over HTTPS — a client certificate the cluster's CA signed (see `tls.rs`). A browser that
//!   has none is shown a sign-in page (the 401's body, nothing else), which posts the secret
//!   to `POST /api/v1/login`; that sets `caudal_session` (HttpOnly, SameSite=Strict, Secure
//!   over HTTPS; its end time and an HMAC of it under the secret, so the server keeps no
//!   sessions, a session ends after [`SESSION_LIFETIME`], and a new secret ends them all).
//!   After [`MAX_FAILED_SIGN_INS`] wrong secrets within a minute, sign-ins are refused with
//!   429 until the minute has passed.
//!
//! Clients that are not browsers (curl, `caudal`, scripts) send no `Origin` and are not
//! affected beyond the content type.

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::Json;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a signed-in web UI stays signed in.
pub(crate) const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Wrong secrets a minute before sign-ins are refused for the rest of it.
pub(crate) const MAX_FAILED_SIGN_INS: usize = 10;

/// The hosts a server answers to besides IP addresses and `localhost`, and who may use it.
#[derive(Debug, Default)]
pub(crate) struct Guard {
    allowed_hosts: Vec<String>,
    /// When set (a job manager listening off loopback), every request must prove it.
    access: Option<Access>,
    /// The server speaks HTTPS: the session cookie is `Secure`.
    https: bool,
    /// When the recent wrong sign-ins were (the last minute's).
    failed_sign_ins: Mutex<VecDeque<Instant>>,
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// What a request may prove to be let in (a job manager off loopback).
#[derive(Debug, Clone, Default)]
pub(crate) struct Access {
    /// `Authorization: Bearer <the cluster secret>`, or the UI's session cookie.
    pub(crate) secret: Option<crate::cluster::auth::ClusterSecret>,
    /// A TLS client certificate the cluster's CA signed (the server speaks HTTPS).
    pub(crate) client_certificate: bool,
}

impl Guard {
    pub(crate) fn new(allowed_hosts: &[String], access: Option<Access>) -> Self {
        Guard {
            allowed_hosts: allowed_hosts.iter().map(|h| h.trim().to_ascii_lowercase()).collect(),
            access,
            ..Guard::default()
        }
    }

    /// The same, serving HTTPS.
    pub(crate) fn over_https(self, https: bool) -> Self {
        Guard { https, ..self }
    }

    /// The wrong sign-ins of the last minute.
    fn failed_sign_ins(&self) -> std::sync::MutexGuard<'_, VecDeque<Instant>> {
        let mut failed = self.failed_sign_ins.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while failed.front().is_some_and(|t| t.elapsed() > Duration::from_secs(60)) {
            failed.pop_front();
        }
        failed
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
        if let Some(access) = &self.access {
            let by_secret = access.secret.as_ref().is_some_and(|secret| {
                text(header::AUTHORIZATION).is_some_and(|h| secret.accepts_bearer(h))
                    || text(header::COOKIE).is_some_and(|c| secret.accepts_ui_session(c, unix_now()))
            });
            let by_certificate = access.client_certificate
                && req
                    .extensions()
                    .get::<axum::extract::ConnectInfo<super::tls::Peer>>()
                    .is_some_and(|peer| peer.0.member);
            let may_sign_in = access.secret.is_some() && is_login(req);
            if !by_secret && !by_certificate && !may_sign_in {
                let ways = match (&access.secret, access.client_certificate) {
                    (Some(_), true) => "`Authorization: Bearer <the cluster secret>` (caudal commands: \
                                        --secret-file or CAUDAL_CLUSTER_SECRET_FILE), a signed-in web UI, or a \
                                        TLS client certificate of the cluster's CA (--tls-cert)",
                    (Some(_), false) => "`Authorization: Bearer <the cluster secret>` (caudal commands: \
                                         --secret-file or CAUDAL_CLUSTER_SECRET_FILE) or a signed-in web UI",
                    (None, _) => "a TLS client certificate of the cluster's CA (caudal commands: --tls-cert, \
                                  --tls-key, --tls-ca)",
                };
                return Some((
                    StatusCode::UNAUTHORIZED,
                    format!("this job manager listens off loopback: every request needs {ways}"),
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

fn is_login(req: &Request) -> bool {
    req.method() == Method::POST && req.uri().path() == LOGIN_PATH
}

const LOGIN_PATH: &str = "/api/v1/login";

/// The middleware.
pub(crate) async fn guard(State(guard): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    match guard.check(&req) {
        Some((StatusCode::UNAUTHORIZED, _))
            if wants_html(&req) && guard.access.as_ref().is_some_and(|a| a.secret.is_some()) =>
        {
            (StatusCode::UNAUTHORIZED, Html(SIGN_IN_PAGE)).into_response()
        }
        Some((status, message)) => (status, Json(serde_json::json!({ "error": message }))).into_response(),
        None => match guard.access.as_ref().and_then(|a| a.secret.as_ref()) {
            Some(secret) if is_login(&req) => sign_in(&guard, secret, req).await,
            _ => next.run(req).await,
        },
    }
}

/// A browser navigating to a page (not a script's `fetch` of the API).
fn wants_html(req: &Request) -> bool {
    req.method() == Method::GET
        && req
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("text/html"))
}

/// `POST /api/v1/login {"token": "<the cluster secret>"}`: sets the session cookie.
async fn sign_in(guard: &Guard, secret: &crate::cluster::auth::ClusterSecret, req: Request) -> Response {
    let refused =
        |why: &str| (StatusCode::UNAUTHORIZED, Json(serde_json::json!({ "error": why }))).into_response();
    if guard.failed_sign_ins().len() >= MAX_FAILED_SIGN_INS {
        let why = format!(
            "more than {MAX_FAILED_SIGN_INS} wrong secrets in the last minute: wait, then sign in again"
        );
        return (StatusCode::TOO_MANY_REQUESTS, Json(serde_json::json!({ "error": why }))).into_response();
    }
    let Ok(body) = axum::body::to_bytes(req.into_body(), 64 * 1024).await else {
        return refused("the sign-in request is larger than 64 KiB");
    };
    let token = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("token").and_then(|t| t.as_str()).map(str::to_string));
    let Some(token) = token else { return refused("expected {\"token\": \"<the cluster secret>\"}") };
    if !secret.accepts_bearer(&format!("Bearer {token}")) {
        guard.failed_sign_ins().push_back(Instant::now());
        tracing::warn!("caudal web: a sign-in with a wrong secret was refused");
        return refused("that is not the cluster secret");
    }
    let lifetime = SESSION_LIFETIME.as_secs();
    let cookie = format!(
        "{}={}; HttpOnly; SameSite=Strict; Path=/; Max-Age={lifetime}{}",
        crate::cluster::auth::UI_SESSION_COOKIE,
        secret.ui_session(unix_now() + lifetime),
        if guard.https { "; Secure" } else { "" }
    );
    (StatusCode::NO_CONTENT, [(header::SET_COOKIE, cookie)]).into_response()
}

/// What a browser without a session sees instead of the UI.
const SIGN_IN_PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Caudal: sign in</title>
<style>body{font:15px system-ui,sans-serif;max-width:30em;margin:12vh auto;padding:0 1em}
input,button{font:inherit;padding:.45em;margin:.3em 0}input{width:100%;box-sizing:border-box}#error{color:#b00020}</style>
</head><body>
<h1>Caudal job manager</h1>
<p>This job manager listens off loopback. Sign in with the cluster secret (the contents of its <code>--secret-file</code>).</p>
<form id="signin"><input id="token" type="password" autocomplete="current-password" placeholder="cluster secret" autofocus required>
<button type="submit">Sign in</button></form><p id="error"></p>
<script>
document.getElementById('signin').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const r = await fetch('/api/v1/login', {method: 'POST', headers: {'Content-Type': 'application/json'},
    body: JSON.stringify({token: document.getElementById('token').value})});
  if (r.ok) { location.reload(); return; }
  document.getElementById('error').textContent = (await r.json().catch(() => ({}))).error || ('HTTP ' + r.status);
});
</script></body></html>"#;

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

    #[test]
    fn off_loopback_a_request_needs_the_bearer_or_the_session_cookie() {
        let secret = crate::cluster::auth::ClusterSecret::from_bytes(b"an off-loopback test secret");
        let g = Guard::new(&[], Some(Access { secret: Some(secret.clone()), client_certificate: true }));
        let host = ("host", "10.0.0.5:8081");
        let (status, _) = g.check(&request("GET", &[host])).unwrap();
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(
            g.check(&request("GET", &[host, ("authorization", "Bearer an off-loopback test secret")])),
            None
        );
        let cookie = format!("theme=dark; caudal_session={}", secret.ui_session(unix_now() + 60));
        assert_eq!(g.check(&request("GET", &[host, ("cookie", &cookie)])), None);
        // An ended session, one whose end was moved, one of another secret: refused.
        let unauthorized = |cookie: &str| g.check(&request("GET", &[host, ("cookie", cookie)])).map(|r| r.0);
        let ended = format!("caudal_session={}", secret.ui_session(unix_now() - 1));
        assert_eq!(unauthorized(&ended), Some(StatusCode::UNAUTHORIZED));
        let session = secret.ui_session(unix_now() + 60);
        let (_, mac) = session.split_once('.').unwrap();
        let moved = format!("caudal_session={}.{mac}", unix_now() + 10 * 365 * 86400);
        assert_eq!(unauthorized(&moved), Some(StatusCode::UNAUTHORIZED));
        let other = crate::cluster::auth::ClusterSecret::from_bytes(b"the secret after a rotation");
        let revoked = format!("caudal_session={}", other.ui_session(unix_now() + 60));
        assert_eq!(unauthorized(&revoked), Some(StatusCode::UNAUTHORIZED));
        let forged = "caudal_session=00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
        assert_eq!(
            g.check(&request("GET", &[host, ("cookie", forged)])).unwrap().0,
            StatusCode::UNAUTHORIZED
        );
        // Signing in needs no session, but is a state change like any other: JSON, own origin.
        let login = |headers: &[(&str, &str)]| {
            let mut b = Request::builder().method("POST").uri(LOGIN_PATH);
            for (k, v) in headers {
                b = b.header(*k, *v);
            }
            g.check(&b.body(Body::empty()).unwrap())
        };
        assert_eq!(login(&[host, ("content-type", "application/json")]), None);
        assert_eq!(
            login(&[host, ("content-type", "text/plain")]).unwrap().0,
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );
        let evil = [host, ("content-type", "application/json"), ("origin", "http://evil.example")];
        assert_eq!(login(&evil).unwrap().0, StatusCode::FORBIDDEN);
    }

    #[test]
    fn over_https_a_client_certificate_of_the_clusters_ca_lets_a_request_in() {
        let peer = |member: bool| super::super::tls::Peer { addr: "10.0.0.9:5000".parse().unwrap(), member };
        let with_peer = |member: Option<bool>| {
            let mut req = request("GET", &[("host", "10.0.0.5:8081")]);
            if let Some(m) = member {
                req.extensions_mut().insert(axum::extract::ConnectInfo(peer(m)));
            }
            req
        };
        let certificates_only = Guard::new(&[], Some(Access { secret: None, client_certificate: true }));
        assert_eq!(certificates_only.check(&with_peer(Some(true))), None);
        for refused in [with_peer(Some(false)), with_peer(None)] {
            let (status, why) = certificates_only.check(&refused).unwrap();
            assert_eq!(status, StatusCode::UNAUTHORIZED);
            assert!(why.contains("TLS client certificate"), "{why}");
        }
        // Without TLS a peer is never a member, whatever it claims: only the secret counts.
        let secret_only = Guard::new(
            &[],
            Some(Access {
                secret: Some(crate::cluster::auth::ClusterSecret::from_bytes(b"s")),
                client_certificate: false,
            }),
        );
        assert_eq!(secret_only.check(&with_peer(Some(true))).unwrap().0, StatusCode::UNAUTHORIZED);
    }

    fn sign_in_request(token: &str) -> Request {
        Request::builder()
            .method("POST")
            .uri(LOGIN_PATH)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::json!({ "token": token }).to_string()))
            .unwrap()
    }

    #[tokio::test]
    async fn a_session_ends_is_secure_over_https_and_wrong_secrets_are_rate_limited() {
        let secret = crate::cluster::auth::ClusterSecret::from_bytes(b"a sign-in test secret, long");
        let g = Guard::new(&[], Some(Access { secret: Some(secret.clone()), client_certificate: false }))
            .over_https(true);
        let ok = sign_in(&g, &secret, sign_in_request("a sign-in test secret, long")).await;
        assert_eq!(ok.status(), StatusCode::NO_CONTENT);
        let cookie = ok.headers()[header::SET_COOKIE].to_str().unwrap().to_string();
        assert!(cookie.contains("HttpOnly") && cookie.contains("; Secure"), "{cookie}");
        assert!(cookie.contains(&format!("Max-Age={}", SESSION_LIFETIME.as_secs())), "{cookie}");
        let value = cookie.split(';').next().unwrap().split_once('=').unwrap().1;
        let expires: u64 = value.split_once('.').unwrap().0.parse().unwrap();
        assert!(expires.abs_diff(unix_now() + SESSION_LIFETIME.as_secs()) < 5, "{cookie}");
        assert!(secret.accepts_ui_session(&format!("caudal_session={value}"), unix_now()));
        assert!(!secret.accepts_ui_session(&format!("caudal_session={value}"), expires));

        for _ in 0..MAX_FAILED_SIGN_INS {
            let r = sign_in(&g, &secret, sign_in_request("a wrong secret")).await;
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        }
        // Now even the right secret waits for the minute to pass.
        let r = sign_in(&g, &secret, sign_in_request("a sign-in test secret, long")).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);

        let plain = Guard::new(&[], Some(Access { secret: Some(secret.clone()), client_certificate: false }));
        let r = sign_in(&plain, &secret, sign_in_request("a sign-in test secret, long")).await;
        assert!(!r.headers()[header::SET_COOKIE].to_str().unwrap().contains("Secure"));
    }
}

//! A client of the job manager's HTTP API: what `caudal submit|list|cancel` and task
//! managers use. Every failure names the job manager's URL and what to do.

use super::blob::{sha256_of_file, BlobStore};
use super::jobmanager::http::ClusterInfo;
use super::jobmanager::submit::SubmitRequest;
use super::jobmanager::ClusterJobView;
use crate::job::SavepointRequest;
use crate::{Error, Result};
use serde::de::DeserializeOwned;
use std::time::Duration;

/// The job manager at `base` (`http://host:port`, or `https://` when it has TLS).
#[derive(Debug, Clone)]
pub(crate) struct JobManagerClient {
    base: String,
    agent: ureq::Agent,
}

impl JobManagerClient {
    /// A client of `url` with this process's `trust`: every request carries its secret as
    /// the bearer token; with TLS it speaks HTTPS (also to an `http://` URL), trusts only the
    /// cluster's CA and presents this process's certificate (which lets it in off loopback
    /// without the secret).
    pub(crate) fn new(url: &str, trust: &super::transport::ClusterTrust) -> Result<Self> {
        let mut base = url.trim().trim_end_matches('/').to_string();
        if !base.starts_with("https://") && !base.starts_with("http://") {
            return Err(Error::config(
                "--jobmanager",
                format!("expected http://HOST:PORT or https://HOST:PORT, got `{url}`"),
            ));
        }
        // A job manager with TLS serves only HTTPS: with the cluster's certificates an
        // http:// URL (such as the default) means the same job manager over https://.
        if trust.tls.is_some() {
            if let Some(rest) = base.strip_prefix("http://") {
                base = format!("https://{rest}");
            }
        }
        let mut config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .proxy(None)
            .timeout_connect(Some(Duration::from_secs(5)))
            .timeout_global(Some(Duration::from_secs(120)));
        match &trust.tls {
            Some(tls) => config = config.tls_config(tls.https_client()),
            None if base.starts_with("https://") => {
                return Err(Error::config(
                    "--tls-ca",
                    format!(
                        "`{url}`: HTTPS to a job manager needs the cluster's certificates \
                         (--tls-cert, --tls-key, --tls-ca): its CA is the only one trusted"
                    ),
                ))
            }
            None => {}
        }
        if let Some(secret) = &trust.secret {
            let value = format!("Bearer {}", secret.bearer());
            config = config.middleware(
                move |mut req: ureq::http::Request<ureq::SendBody>,
                      next: ureq::middleware::MiddlewareNext| {
                    if let Ok(v) = ureq::http::HeaderValue::from_str(&value) {
                        req.headers_mut().insert(ureq::http::header::AUTHORIZATION, v);
                    }
                    next.handle(req)
                },
            );
        }
        let agent = config.build().into();
        Ok(JobManagerClient { base, agent })
    }

    /// `host` of the base URL (task managers connect to its control port there).
    pub(crate) fn host(&self) -> &str {
        let rest = self.base.trim_start_matches("https://").trim_start_matches("http://");
        let authority = rest.split('/').next().unwrap_or(rest);
        match authority.rsplit_once(':') {
            Some((h, _)) => h,
            None => authority,
        }
    }

    fn unreachable(&self, e: ureq::Error) -> Error {
        Error::Cluster(format!(
            "cannot reach the job manager at {}: {e} (is `caudal jobmanager` running there? set --jobmanager URL)",
            self.base
        ))
    }

    fn unauthorized(&self) -> Error {
        Error::Cluster(format!(
            "the job manager at {} answered 401 Unauthorized: it listens off loopback and needs the cluster \
             secret as a bearer token (--secret-file FILE or CAUDAL_CLUSTER_SECRET_FILE) or, over https://, \
             a certificate of the cluster's CA (--tls-cert, --tls-key, --tls-ca)",
            self.base
        ))
    }

    fn answer<T: DeserializeOwned>(
        &self,
        what: &str,
        r: std::result::Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<T> {
        let mut r = r.map_err(|e| self.unreachable(e))?;
        let status = r.status().as_u16();
        let body = r
            .body_mut()
            .with_config()
            .limit(1 << 30)
            .read_to_vec()
            .map_err(|e| Error::Cluster(format!("{what}: reading the answer of {}: {e}", self.base)))?;
        if !(200..300).contains(&status) {
            let message = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_string))
                .unwrap_or_else(|| String::from_utf8_lossy(&body).to_string());
            return Err(Error::Cluster(format!("{what}: {message}")));
        }
        serde_json::from_slice(&body)
            .map_err(|e| Error::Cluster(format!("{what}: unexpected answer from {} ({e})", self.base)))
    }

    pub(crate) fn info(&self) -> Result<ClusterInfo> {
        self.answer("cluster info", self.agent.get(format!("{}/api/v1/cluster", self.base)).call())
    }

    pub(crate) fn jobs(&self) -> Result<Vec<ClusterJobView>> {
        self.answer("list", self.agent.get(format!("{}/api/v1/cluster/jobs", self.base)).call())
    }

    pub(crate) fn cancel(&self, job: &str) -> Result<ClusterJobView> {
        self.answer(
            &format!("cancel `{job}`"),
            self.agent
                .post(format!("{}/api/v1/cluster/jobs/{job}/cancel", self.base))
                .content_type("application/json")
                .send("{}"),
        )
    }

    /// Stops `job` after a final checkpoint, copied to `savepoints/<savepoint>` if given.
    pub(crate) fn stop(&self, job: &str, savepoint: Option<&str>) -> Result<ClusterJobView> {
        let body = serde_json::json!({ "savepoint": savepoint }).to_string();
        self.answer(
            &format!("stop `{job}`"),
            self.agent
                .post(format!("{}/api/v1/cluster/jobs/{job}/stop", self.base))
                .content_type("application/json")
                .send(body),
        )
    }

    /// Asks `job` for a savepoint (`name`, or one the job chooses).
    pub(crate) fn trigger_savepoint(&self, job: &str, name: Option<&str>) -> Result<SavepointRequest> {
        let body = serde_json::json!({ "name": name }).to_string();
        self.answer(
            &format!("savepoint of `{job}`"),
            self.agent
                .post(format!("{}/api/v1/jobs/{job}/savepoints", self.base))
                .content_type("application/json")
                .send(body),
        )
    }

    /// The savepoints asked of `job`.
    pub(crate) fn savepoints(&self, job: &str) -> Result<Vec<SavepointRequest>> {
        let view: crate::web::SavepointsView = self.answer(
            &format!("savepoints of `{job}`"),
            self.agent.get(format!("{}/api/v1/jobs/{job}/savepoints", self.base)).call(),
        )?;
        Ok(view.savepoints)
    }

    /// Uploads the binary at `path` (streamed) and returns its sha256.
    pub(crate) fn upload(&self, path: &std::path::Path) -> Result<String> {
        let sha = sha256_of_file(path)?;
        let url = format!("{}/api/v1/cluster/blobs/{sha}", self.base);
        match self.agent.head(&url).call().map_err(|e| self.unreachable(e))?.status().as_u16() {
            200 => return Ok(sha), // content-addressed: the job manager has it already
            401 => return Err(self.unauthorized()),
            _ => {}
        }
        let file =
            std::fs::File::open(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut head = [0u8; 4];
        let is_elf = std::io::Read::read_exact(&mut (&file), &mut head).is_ok() && &head == b"\x7fELF";
        if !is_elf {
            return Err(Error::Cluster(format!(
                "{} is not an executable (no ELF header): submit a job binary built with Caudal \
                 (cargo build --release --bin JOB)",
                path.display()
            )));
        }
        let file =
            std::fs::File::open(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        let name =
            path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        let reader = Progress { inner: file, name, size, sent: 0, shown: 0 };
        let _: serde_json::Value = self.answer(
            "upload",
            self.agent
                .put(format!("{}/api/v1/cluster/blobs/{sha}", self.base))
                .content_type("application/octet-stream")
                .send(ureq::SendBody::from_owned_reader(reader)),
        )?;
        Ok(sha)
    }

    pub(crate) fn submit(&self, req: &SubmitRequest) -> Result<ClusterJobView> {
        self.answer("submit", self.agent.post(format!("{}/api/v1/cluster/jobs", self.base)).send_json(req))
    }

    /// Downloads binary `sha` into `blobs` (streamed, hash checked).
    pub(crate) fn download(&self, sha: &str, blobs: &BlobStore) -> Result<()> {
        let r = self
            .agent
            .get(format!("{}/api/v1/cluster/blobs/{sha}", self.base))
            .call()
            .map_err(|e| self.unreachable(e))?;
        if r.status() != 200 {
            return Err(Error::Cluster(format!("downloading binary {sha}: HTTP {}", r.status())));
        }
        let mut reader = r.into_body().into_with_config().limit(u64::MAX).reader();
        let mut writer = blobs.writer(sha)?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = std::io::Read::read(&mut reader, &mut buf)
                .map_err(|e| Error::Cluster(format!("downloading binary {sha}: {e}")))?;
            if n == 0 {
                break;
            }
            writer.write(&buf[..n])?;
        }
        writer.finish().map(|_| ())
    }
}

/// A file being uploaded, saying on stderr how far it got (every 10 %).
struct Progress {
    inner: std::fs::File,
    name: String,
    size: u64,
    sent: u64,
    shown: u64,
}

impl std::io::Read for Progress {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.sent += n as u64;
        let tenths = (self.sent * 10).checked_div(self.size).unwrap_or(10);
        if tenths > self.shown {
            self.shown = tenths;
            eprintln!(
                "uploading {}: {}% of {:.1} MB",
                self.name,
                (tenths * 10).min(100),
                self.size as f64 / 1e6
            );
        }
        Ok(n)
    }
}

//! The server's own thread: a current-thread Tokio runtime serving the router and
//! running the sampler, so serving never takes a core from the tasks.

use super::api;
use super::registry::{JobRegistry, SAMPLE_INTERVAL};
use crate::job::JobView;
use crate::{Error, Result};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::oneshot;

/// A running web server; dropping it stops the server and joins its thread.
///
/// # Examples
/// ```
/// use caudal::web::{JobRegistry, WebServer};
/// use std::sync::Arc;
/// let server = WebServer::start("127.0.0.1:0".parse().unwrap(), Arc::new(JobRegistry::new())).unwrap();
/// assert!(server.url().starts_with("http://127.0.0.1:"));
/// drop(server); // stops it
/// ```
#[derive(Debug)]
pub struct WebServer {
    addr: SocketAddr,
    /// `https` when it serves TLS.
    scheme: &'static str,
    registry: Arc<JobRegistry>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl WebServer {
    /// Listen on `bind` and serve the jobs of `registry` until dropped.
    ///
    /// Fails with a configuration error naming `web_bind` when the address cannot be bound.
    pub fn start(bind: SocketAddr, registry: Arc<JobRegistry>) -> Result<WebServer> {
        Self::start_with(bind, registry, axum::Router::new(), WebAccess::default())
    }

    /// Like [`WebServer::start`], also serving `extra` routes (the job manager's own
    /// endpoints under `/api/v1/cluster`), reached and guarded as `access` says.
    pub(crate) fn start_with(
        bind: SocketAddr,
        registry: Arc<JobRegistry>,
        extra: axum::Router,
        access: WebAccess,
    ) -> Result<WebServer> {
        let listener = std::net::TcpListener::bind(bind)
            .map_err(|e| Error::config("web_bind", format!("cannot listen on {bind}: {e}")))?;
        listener.set_nonblocking(true).map_err(|e| Error::io("web server: configuring the listener", e))?;
        let addr =
            listener.local_addr().map_err(|e| Error::io("web server: reading the bound address", e))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::io("web server: starting its runtime", e))?;
        let listener = {
            let _entered = runtime.enter();
            tokio::net::TcpListener::from_std(listener)
                .map_err(|e| Error::io("web server: registering the listener", e))?
        };
        let (shutdown, stopped) = oneshot::channel::<()>();
        let guard = Arc::new(
            super::guard::Guard::new(&access.allowed_hosts, access.sign_in).over_https(access.tls.is_some()),
        );
        let scheme = if access.tls.is_some() { "https" } else { "http" };
        let app = api::router(registry.clone())
            .merge(extra)
            .layer(axum::middleware::from_fn_with_state(guard, super::guard::guard));
        let sampled = registry.clone();
        let thread = std::thread::Builder::new()
            .name("caudal-web".into())
            .spawn(move || {
                runtime.block_on(async move {
                    tokio::spawn(async move {
                        let mut tick = tokio::time::interval(SAMPLE_INTERVAL);
                        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                        loop {
                            tick.tick().await;
                            sampled.sample_all();
                        }
                    });
                    let served = async move {
                        match access.tls {
                            None => axum::serve(listener, app).await,
                            Some(config) => {
                                let tls = super::tls::TlsListener::new(listener, config)?;
                                let app = app.into_make_service_with_connect_info::<super::tls::Peer>();
                                axum::serve(tls, app).await
                            }
                        }
                    };
                    tokio::select! {
                        r = served => {
                            if let Err(e) = r {
                                tracing::error!("caudal web server on {addr} stopped: {e}");
                            }
                        }
                        _ = stopped => {}
                    }
                });
                // Dropping the runtime here ends open connections and the sampler.
            })
            .map_err(|e| Error::io("web server: spawning its thread", e))?;
        Ok(WebServer { addr, scheme, registry, shutdown: Some(shutdown), thread: Some(thread) })
    }

    /// Serve one job (embedded mode: what `StreamEnv::execute` does with `web_bind`).
    ///
    /// Off loopback it refuses to start without `config.web_secret_file`: stop, cancel,
    /// savepoints and the state browser would be anyone's on the network. With the secret,
    /// every request must carry it as a bearer token or a session cookie (sign-in page).
    pub fn start_for_job(
        bind: SocketAddr,
        job: Arc<JobView>,
        config: &crate::JobConfig,
    ) -> Result<WebServer> {
        let secret = config
            .web_secret_file
            .as_deref()
            .map(|path| {
                crate::cluster::auth::ClusterSecret::from_file(path)
                    .map_err(|e| Error::config("web_secret_file (--ui-secret-file)", e.to_string()))
            })
            .transpose()?;
        if !bind.ip().is_loopback() && secret.is_none() {
            return Err(Error::config(
                "web_bind (--ui-bind)",
                format!(
                    "refusing to serve the web UI and REST API on {bind} without authentication: anyone who \
                     reaches it could stop or cancel the job, take savepoints and read its state. Give \
                     --ui-secret-file FILE (CAUDAL__WEB_SECRET_FILE; e.g. `openssl rand -hex 32 > FILE`), whose \
                     contents every request then carries as a bearer token or signs in with, or bind \
                     127.0.0.1 (the default)"
                ),
            ));
        }
        let registry = Arc::new(JobRegistry::new());
        registry.register(job);
        let access = WebAccess {
            allowed_hosts: config.web_allowed_hosts.clone(),
            sign_in: secret
                .map(|secret| super::guard::Access { secret: Some(secret), client_certificate: false }),
            tls: None,
        };
        Self::start_with(bind, registry, axum::Router::new(), access)
    }

    /// The address the server listens on (the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<address>` (`https://` when it serves TLS), the UI's overview page.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// The jobs the server shows.
    pub fn registry(&self) -> &Arc<JobRegistry> {
        &self.registry
    }
}

/// How a server is reached and who may use it: a job manager's settings (embedded mode: the
/// defaults and `web_allowed_hosts`).
#[derive(Debug, Clone, Default)]
pub(crate) struct WebAccess {
    /// Host names it answers to besides IP addresses and `localhost` (see `guard.rs`).
    pub(crate) allowed_hosts: Vec<String>,
    /// What every request must prove (a job manager off loopback); `None`: nothing.
    pub(crate) sign_in: Option<super::guard::Access>,
    /// Serve HTTPS with this configuration (a job manager with `--tls-*`).
    pub(crate) tls: Option<Arc<rustls::ServerConfig>>,
}

impl Drop for WebServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

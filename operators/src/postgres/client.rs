//! A blocking PostgreSQL connection for a sink thread: `tokio-postgres` on a small
//! current-thread runtime the sink owns, every call bounded by a timeout, every error
//! classified as transient (reconnect and retry) or permanent (fail the job).

use super::tls::MakeRustls;
use crate::retry::Failure;
use std::future::Future;
use std::time::Duration;
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

/// One connection, opened lazily and dropped after any transient failure.
pub(crate) struct Connection {
    config: tokio_postgres::Config,
    tls: MakeRustls,
    timeout: Duration,
    client: Option<Client>,
}

/// The runtime the sink's connections run on.
pub(crate) fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()
}

/// Runs `f` to completion within `timeout`.
pub(crate) fn block<T>(
    rt: &tokio::runtime::Runtime,
    timeout: Duration,
    what: &str,
    f: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, Failure> {
    block_raw(rt, timeout, what, f)?.map_err(|e| classify(what, &e))
}

/// Runs `f` within `timeout`; the database's answer is left for the caller to inspect.
pub(crate) fn block_raw<T>(
    rt: &tokio::runtime::Runtime,
    timeout: Duration,
    what: &str,
    f: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<Result<T, tokio_postgres::Error>, Failure> {
    rt.block_on(async { tokio::time::timeout(timeout, f).await })
        .map_err(|_| Failure::Transient(format!("{what}: no answer within {}s", timeout.as_secs())))
}

impl Connection {
    pub(crate) fn new(config: tokio_postgres::Config, tls: MakeRustls, timeout: Duration) -> Self {
        Connection { config, tls, timeout, client: None }
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Names the sessions opened from now on (`application_name`).
    pub(crate) fn set_application_name(&mut self, name: &str) {
        self.config.application_name(name);
    }

    pub(crate) fn is_open(&self) -> bool {
        self.client.as_ref().is_some_and(|c| !c.is_closed())
    }

    /// The client, connecting first if needed. `fresh` is true on a new connection.
    pub(crate) fn get(&mut self, rt: &tokio::runtime::Runtime) -> Result<(&Client, bool), Failure> {
        let mut fresh = false;
        if !self.is_open() {
            self.client = None;
            let (client, conn) =
                block(rt, self.timeout, "connecting", self.config.connect(self.tls.clone()))?;
            rt.spawn(async move {
                let _ = conn.await;
            });
            self.client = Some(client);
            fresh = true;
        }
        match self.client.as_ref() {
            Some(c) => Ok((c, fresh)),
            None => Err(Failure::Transient("not connected".into())),
        }
    }

    /// Forgets the connection (after a failure its state is unknown).
    pub(crate) fn reset(&mut self) {
        self.client = None;
    }
}

/// Transient: the server is unreachable, restarting, shutting down, overloaded, or the
/// connection broke. Permanent: everything else (authentication, a TLS certificate refused,
/// permission, a missing database, invalid SQL, a constraint).
pub(crate) fn classify(what: &str, e: &tokio_postgres::Error) -> Failure {
    let message = format!("{what}: {}", describe(e));
    if let Some(db) = e.as_db_error() {
        let code = db.code();
        let transient = code.code().starts_with("08")
            || *code == SqlState::ADMIN_SHUTDOWN
            || *code == SqlState::CRASH_SHUTDOWN
            || *code == SqlState::CANNOT_CONNECT_NOW
            || *code == SqlState::TOO_MANY_CONNECTIONS
            || *code == SqlState::T_R_SERIALIZATION_FAILURE
            || *code == SqlState::T_R_DEADLOCK_DETECTED
            || *code == SqlState::QUERY_CANCELED
            || *code == SqlState::LOCK_NOT_AVAILABLE
            || *code == SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT;
        return if transient { Failure::Transient(message) } else { Failure::Permanent(message) };
    }
    if let Some(refusal) = super::tls::tls_refusal(e) {
        return Failure::Permanent(format!("{what}: {refusal}"));
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    let mut io = false;
    while let Some(s) = source {
        io |= s.is::<std::io::Error>();
        source = s.source();
    }
    if e.is_closed() || io || message.contains("connection closed") || message.contains("unexpected EOF") {
        Failure::Transient(message)
    } else {
        Failure::Permanent(message)
    }
}

/// The error with its SQLSTATE and its causes.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!(
            "{} (SQLSTATE {}){}",
            db.message(),
            db.code().code(),
            db.detail().map(|d| format!(": {d}")).unwrap_or_default()
        );
    }
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(c) = source {
        let c_s = c.to_string();
        if !s.contains(&c_s) {
            s.push_str(": ");
            s.push_str(&c_s);
        }
        source = c.source();
    }
    s
}

//! HTTPS for the REST API and UI: a listener that hands axum TLS connections, each with
//! whether its client proved membership of the cluster.
//!
//! **In:** TCP connections and the server's rustls configuration (the job manager's
//! certificate; a client certificate is asked for, not required — see
//! `ClusterTls::https_server`). **Out:** finished TLS sessions, each with a [`Peer`]: its
//! address, and `member` when it presented a certificate the cluster's CA signed (rustls
//! has verified it by then; a certificate of another issuer fails the handshake). The
//! guard lets a member in without the bearer token.
//!
//! Handshakes run in tasks of their own, each with a deadline, so a client that connects
//! and says nothing holds up no one else.

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use rustls::ServerConfig;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;

/// How long a client has to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Finished handshakes waiting for axum to take them.
const READY_QUEUE: usize = 64;

/// Who is on the other end of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Peer {
    pub(crate) addr: SocketAddr,
    /// It presented a client certificate the cluster's CA signed.
    pub(crate) member: bool,
}

/// TLS connections for `axum::serve`.
pub(crate) struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, Peer)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Accepts on `tcp` and handshakes with `config`; must be called within a Tokio runtime,
    /// which runs the accepting task until the runtime is dropped.
    pub(crate) fn new(tcp: TcpListener, config: Arc<ServerConfig>) -> io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(READY_QUEUE);
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        tokio::spawn(async move {
            loop {
                let (stream, addr) = match tcp.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: wait, as axum's own loop does.
                        tracing::warn!("caudal web: accepting a connection on {local} failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let member = tls.get_ref().1.peer_certificates().is_some_and(|c| !c.is_empty());
                            let _ = tx.send((tls, Peer { addr, member })).await;
                        }
                        Ok(Err(e)) => tracing::info!("caudal web: TLS handshake with {addr} failed: {e}"),
                        Err(_) => tracing::info!("caudal web: TLS handshake with {addr} timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { ready, local })
    }
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accepting task ended (its runtime is shutting down): nothing more comes.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(Peer { addr: self.local, member: false })
    }
}

impl Connected<IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        *stream.remote_addr()
    }
}

//! The connection settings of every PostgreSQL client of Caudal (the sink, the lookup, the
//! Iceberg SQL catalog): a `postgres://` URL whose TLS options mean what they mean to libpq,
//! served by rustls on Caudal's aws-lc-rs provider.
//!
//! | option | meaning |
//! |---|---|
//! | `sslmode=disable` | no TLS |
//! | `allow`, `prefer` (the default) | TLS when the server offers it, the server not checked |
//! | `require` | TLS or no connection; the server not checked (checked as `verify-ca` when `sslrootcert` is given, as libpq does) |
//! | `verify-ca` | TLS, the server's certificate signed by `sslrootcert` |
//! | `verify-full` | as `verify-ca`, and the certificate names the host |
//! | `sslrootcert=FILE` | the CA(s) to trust (PEM); `system`: the system's roots |
//! | `sslcert=FILE`, `sslkey=FILE` | a client certificate and its key (PEM, unencrypted) |
//!
//! Passwords go with the user (`postgres://user:password@…`) or in `password=`; SCRAM-SHA-256
//! is negotiated by tokio-postgres.

use crate::tls::ClientTls;
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::SslMode;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

/// A parsed connection URL and the TLS connector its options ask for.
///
/// `${env:NAME}` in the URL reads a variable (the password, typically), so neither the
/// command line nor a saved configuration holds it.
pub(crate) fn parse(url: &str) -> Result<(tokio_postgres::Config, MakeRustls), String> {
    let url = caudal_schemas::client_properties::expand_env(url)?;
    let (rest, options) = split_tls_options(&url)?;
    let mut config = tokio_postgres::Config::from_str(&rest).map_err(|e| {
        let hint = if rest.contains('=') && !rest.contains("://") {
            " (TLS options are read from the URL form, postgres://…?sslmode=…)"
        } else {
            ""
        };
        format!("{e}{hint}")
    })?;
    let mode = options.mode.as_deref().unwrap_or("prefer");
    let (ssl_mode, verify) = match mode {
        "disable" => (SslMode::Disable, Verify::Nothing),
        "allow" | "prefer" | "require" => {
            let ssl = if mode == "require" { SslMode::Require } else { SslMode::Prefer };
            (ssl, if options.root_cert.is_some() { Verify::Ca } else { Verify::Nothing })
        }
        "verify-ca" => (SslMode::Require, Verify::Ca),
        "verify-full" => (SslMode::Require, Verify::Full),
        other => {
            return Err(format!(
                "sslmode `{other}` is not one of disable, allow, prefer, require, verify-ca, verify-full"
            ))
        }
    };
    config.ssl_mode(ssl_mode);
    let ca = match options.root_cert.as_deref() {
        None | Some("system") => None,
        Some(path) => Some(PathBuf::from(path)),
    };
    let client = ClientTls {
        ca,
        cert: options.cert.map(PathBuf::from),
        key: options.key.map(PathBuf::from),
        verify_hostname: verify == Verify::Full,
    };
    let tls = match (ssl_mode, verify) {
        (SslMode::Disable, _) => None,
        (_, Verify::Nothing) => Some(client.config_unverified()?),
        _ => Some(client.config()?),
    };
    Ok((config, MakeRustls { tls }))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verify {
    Nothing,
    Ca,
    Full,
}

#[derive(Debug, Default)]
struct TlsOptions {
    mode: Option<String>,
    root_cert: Option<String>,
    cert: Option<String>,
    key: Option<String>,
}

/// The URL without the TLS options tokio-postgres does not read (it knows `sslmode` only as
/// disable / prefer / require), and those options.
fn split_tls_options(url: &str) -> Result<(String, TlsOptions), String> {
    let mut options = TlsOptions::default();
    let Some((base, query)) = url.split_once('?').filter(|_| url.contains("://")) else {
        for key in ["sslrootcert", "sslcert", "sslkey", "verify-full", "verify-ca"] {
            if url.contains(key) {
                return Err(format!(
                    "`{key}` is read from the URL form only: postgres://…?sslmode=…&sslrootcert=…"
                ));
            }
        }
        return Ok((url.to_owned(), options));
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value)?;
        match key {
            "sslmode" => options.mode = Some(value),
            "sslrootcert" => options.root_cert = Some(value),
            "sslcert" => options.cert = Some(value),
            "sslkey" => options.key = Some(value),
            _ => kept.push(pair),
        }
    }
    let rest = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
    Ok((rest, options))
}

fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3).ok_or_else(|| format!("bad escape in `{s}`"))?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| format!("bad escape in `{s}`"))?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("`{s}` is not UTF-8"))
}

/// tokio-postgres' TLS: rustls when the options ask for it (never used with `disable`).
#[derive(Clone)]
pub(crate) struct MakeRustls {
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for MakeRustls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MakeRustls").field("tls", &self.tls.is_some()).finish()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> MakeTlsConnect<S> for MakeRustls {
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    /// Called for every connection, TLS or not: what cannot be set up fails only if the
    /// handshake is attempted (never with `sslmode=disable`).
    fn make_tls_connect(&mut self, domain: &str) -> io::Result<RustlsConnect> {
        let setup = match (&self.tls, rustls::pki_types::ServerName::try_from(domain.to_owned())) {
            (None, _) => Err("TLS is off (sslmode=disable)".to_owned()),
            (Some(_), Err(e)) => Err(format!("host `{domain}`: {e}")),
            (Some(config), Ok(name)) => Ok((tokio_rustls::TlsConnector::from(config.clone()), name)),
        };
        Ok(RustlsConnect { setup })
    }
}

/// One connection's TLS handshake.
pub(crate) struct RustlsConnect {
    setup: Result<(tokio_rustls::TlsConnector, rustls::pki_types::ServerName<'static>), String>,
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> TlsConnect<S> for RustlsConnect {
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let (connector, name) = self.setup.map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            Ok(RustlsStream(connector.connect(name, stream).await?))
        })
    }
}

/// A connection over TLS. No channel binding: SCRAM-SHA-256 without `-PLUS`, as libpq's
/// `channel_binding=prefer` falls back to.
pub(crate) struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// The reason, when `e` is a TLS refusal no retry mends, with what to check.
pub(crate) fn tls_refusal(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    crate::tls::refusal_in(e).map(|why| format!("{why}: check sslrootcert, the host name, sslcert / sslkey"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_tls_options_are_taken_out_of_the_url_and_the_rest_kept() {
        let (rest, o) = split_tls_options(
            "postgres://u:p@h:5432/db?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca.pem&sslcert=/c&sslkey=/k",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u:p@h:5432/db?application_name=x");
        assert_eq!(o.mode.as_deref(), Some("verify-full"));
        assert_eq!(o.root_cert.as_deref(), Some("/etc/ca.pem"));
        assert_eq!((o.cert.as_deref(), o.key.as_deref()), (Some("/c"), Some("/k")));
        let (rest, o) = split_tls_options("postgres://h/db").unwrap();
        assert_eq!(rest, "postgres://h/db");
        assert!(o.mode.is_none());
    }

    #[test]
    fn modes_map_to_what_libpq_does() {
        let mode = |url: &str| parse(url).map(|(c, t)| (c.get_ssl_mode(), t.tls.is_some()));
        assert_eq!(mode("postgres://h/db").unwrap(), (SslMode::Prefer, true));
        assert_eq!(mode("postgres://h/db?sslmode=disable").unwrap(), (SslMode::Disable, false));
        assert_eq!(mode("postgres://h/db?sslmode=require").unwrap(), (SslMode::Require, true));
        assert_eq!(
            mode("postgres://h/db?sslmode=verify-full&sslrootcert=system").unwrap().0,
            SslMode::Require
        );
        let e = mode("postgres://h/db?sslmode=verify-everything").unwrap_err();
        assert!(e.contains("verify-everything"), "{e}");
        let e = mode("postgres://h/db?sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem").unwrap_err();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
        let e = mode("postgres://u:${env:CAUDAL_SURELY_UNSET_VARIABLE}@h/db").unwrap_err();
        assert!(e.contains("CAUDAL_SURELY_UNSET_VARIABLE"), "{e}");
        let e = mode("host=h dbname=db sslrootcert=/x").unwrap_err();
        assert!(e.contains("URL form"), "{e}");
    }
}

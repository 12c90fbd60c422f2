//! The Iceberg REST catalog protocol, over `iceberg-catalog-rest`.
//!
//! **In:** the catalog's `http://` or `https://` base URL (the one whose `/v1/config` answers).
//! **Out:** an [`iceberg_catalog_rest::RestCatalog`] whose tables read and write their files
//! through Caudal's own storage factory ([`crate::iceberg::storage`]: `object_store`, the
//! checkpoints' S3 client and settings), not a file I/O the server hands out.
//!
//! **Commits.** The server applies a commit's requirements and updates atomically: `409
//! Conflict` means nothing landed (retryable); `5xx`, a timeout or a lost answer leave the
//! commit's fate unknown, and only a look at the table can tell (the committer does that
//! before it tries again — see [`super`]).
//!
//! The HTTP client is the reqwest the crate is written on, with deadlines of its own (a
//! catalog that stops answering must not hold the committer forever) and, for `https://`,
//! rustls with Caudal's aws-lc-rs provider and the system's root certificates.

use iceberg::io::StorageFactory;
use iceberg::{CatalogBuilder, Error, ErrorKind, Result, Runtime};
use iceberg_catalog_rest::{RestCatalog, RestCatalogBuilder, REST_CATALOG_PROP_URI};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// How long a connection to the catalog may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one request may take, answer included. A commit that runs into it has an
/// unknown fate: the committer reads the table before it tries again.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether `url` names a REST catalog (`http://…` or `https://…`).
pub fn is_rest_url(url: &str) -> bool {
    url.starts_with("http://") || url.starts_with("https://")
}

/// The REST catalog at `url` (`name` is only a label in its errors), its tables' files read
/// and written through `storage`. Nothing is sent until the first call (then `/v1/config`).
pub async fn connect(url: &str, name: &str, storage: Arc<dyn StorageFactory>) -> Result<RestCatalog> {
    let client = http_client(url)?;
    RestCatalogBuilder::default()
        .with_client(client)
        .with_storage_factory(storage)
        .with_runtime(Runtime::try_current()?)
        .load(
            name,
            HashMap::from([(REST_CATALOG_PROP_URI.to_string(), url.trim_end_matches('/').to_string())]),
        )
        .await
}

/// The HTTP client for `url`, with deadlines. reqwest builds a TLS configuration even for a
/// plain-HTTP client, and without one handed to it looks for a process-wide rustls provider
/// (Caudal installs none: it would panic), so it always gets ours — with the system's roots
/// for `https://`, with none for `http://` (never used).
fn http_client(url: &str) -> Result<reqwest::Client> {
    let roots = if url.starts_with("https://") { system_roots()? } else { rustls::RootCertStore::empty() };
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT)
        .use_preconfigured_tls(tls(roots)?)
        .build()
        .map_err(|e| {
            Error::new(ErrorKind::Unexpected, format!("building the REST catalog's HTTP client: {e}"))
                .with_source(e)
        })
}

/// The system's root certificates (`SSL_CERT_FILE` / `SSL_CERT_DIR` replace them).
fn system_roots() -> Result<rustls::RootCertStore> {
    crate::tls::system_roots()
        .map_err(|e| Error::new(ErrorKind::Unexpected, format!("REST catalog over https: {e}")))
}

/// TLS 1.2/1.3 with the aws-lc-rs provider, trusting `roots`.
fn tls(roots: rustls::RootCertStore) -> Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::new(ErrorKind::Unexpected, format!("REST catalog TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rest_url_is_http_or_https() {
        assert!(is_rest_url("http://127.0.0.1:8181"));
        assert!(is_rest_url("https://catalog.example.com/api/catalog"));
        assert!(!is_rest_url("postgres://caudal@127.0.0.1/caudal"));
        assert!(!is_rest_url("httpx://h"));
    }

    #[test]
    fn an_https_client_builds_on_our_provider_and_the_system_roots() {
        // No process-wide rustls provider is installed: the client must not need one.
        http_client("https://catalog.example.com").unwrap();
        http_client("http://127.0.0.1:1").unwrap();
    }
}

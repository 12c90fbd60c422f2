//! Mutual TLS for the cluster's control and shuffle connections (rustls, TLS 1.3 only).
//!
//! **In:** three PEM files — this process's certificate (chain), its private key, and the
//! cluster's CA certificate (`--tls-cert`, `--tls-key`, `--tls-ca`; executors get the task
//! manager's through [`CERT_ENV`], [`KEY_ENV`], [`CA_ENV`]). **Out:** rustls client and server
//! connections that present this process's certificate and accept only a peer whose
//! certificate the cluster's CA signed — in both directions, so neither side talks to a
//! stranger.
//!
//! Membership of the cluster is a certificate from its CA; host names are not checked (as
//! in Flink's internal TLS): processes reach each other by addresses a certificate made
//! before the cluster started cannot know. So give the cluster a CA of its own
//! (`caudal certs` makes one), never a public one.
//!
//! The same identity serves the job manager's REST API and UI over HTTPS
//! ([`ClusterTls::https_server`]: a client certificate is asked for, not required) and is
//! what `caudal` commands and task managers present to it ([`ClusterTls::https_client`]:
//! there the job manager's name *is* checked, as any HTTPS client does — give its
//! certificate the names users type, `caudal certs --host`).

use crate::{Error, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, RootCertStore, ServerConfig};
use rustls::{ServerConnection, SignatureScheme};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The environment variables that hand the TLS files to executors.
pub const CERT_ENV: &str = "CAUDAL_TLS_CERT";
/// See [`CERT_ENV`].
pub const KEY_ENV: &str = "CAUDAL_TLS_KEY";
/// See [`CERT_ENV`].
pub const CA_ENV: &str = "CAUDAL_TLS_CA";

/// The name a client sends (SNI); servers do not check it, see the module doc.
const CLUSTER_NAME: &str = "caudal.cluster";

/// Where a process's TLS identity comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// This process's certificate, PEM (its chain, leaf first).
    pub cert: PathBuf,
    /// Its private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The cluster's CA certificate, PEM: the only issuer a peer's certificate may have.
    pub ca: PathBuf,
}

/// This process's TLS identity and the cluster's CA, ready for connections.
#[derive(Clone)]
pub struct ClusterTls {
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
    https: Arc<ServerConfig>,
    https_client: ureq::tls::TlsConfig,
    files: TlsFiles,
}

impl PartialEq for ClusterTls {
    fn eq(&self, other: &Self) -> bool {
        self.files == other.files
    }
}

impl Eq for ClusterTls {}

impl std::fmt::Debug for ClusterTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterTls({:?})", self.files)
    }
}

impl ClusterTls {
    /// The identity in `files`; an unreadable or invalid file is an error naming it.
    pub fn from_files(files: TlsFiles) -> Result<Self> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let chain = certificates(&files.cert, "--tls-cert")?;
        let key_pem = std::fs::read(&files.key)
            .map_err(|e| Error::config("--tls-key", format!("cannot read {}: {e}", files.key.display())))?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
            Error::config("--tls-key", format!("no private key in {}: {e}", files.key.display()))
        })?;
        let mut roots = RootCertStore::empty();
        let ca = certificates(&files.ca, "--tls-ca")?;
        for ca in ca.iter().cloned() {
            roots.add(ca).map_err(|e| {
                Error::config(
                    "--tls-ca",
                    format!("{} is not a usable CA certificate: {e}", files.ca.display()),
                )
            })?;
        }
        let roots = Arc::new(roots);
        let bad = |flag: &str, e: &dyn std::fmt::Display| Error::config(flag, e.to_string());
        // Cluster connections require a client certificate of the cluster's CA; HTTPS asks for
        // one without requiring it (browsers and curl come without, and sign in with the
        // secret), and one that comes must be of the cluster's CA too.
        let server_config = |optional_client: bool| -> Result<ServerConfig> {
            let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone());
            let verifier = if optional_client { verifier.allow_unauthenticated() } else { verifier };
            ServerConfig::builder_with_provider(provider.clone())
                .with_protocol_versions(&[&rustls::version::TLS13])
                .map_err(|e| bad("--tls-cert", &e))?
                .with_client_cert_verifier(verifier.build().map_err(|e| bad("--tls-ca", &e))?)
                .with_single_cert(chain.clone(), key.clone_key())
                .map_err(|e| {
                    bad(
                        "--tls-key",
                        &format!("{} does not fit {}: {e}", files.key.display(), files.cert.display()),
                    )
                })
        };
        let mut server = server_config(false)?;
        // Connections are long-lived and never resumed: no tickets to send after the handshake.
        server.send_tls13_tickets = 0;
        let mut https = server_config(true)?;
        https.alpn_protocols = vec![b"http/1.1".to_vec()];
        let verifier =
            Arc::new(SignedByClusterCa { roots, algorithms: provider.signature_verification_algorithms });
        let client = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| bad("--tls-cert", &e))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_auth_cert(chain.clone(), key)
            .map_err(|e| bad("--tls-key", &e))?;
        let https_client = {
            use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig, TlsProvider};
            let owned = |c: &CertificateDer<'_>| Certificate::from_der(c.as_ref()).to_owned();
            let key = PrivateKey::from_pem(&key_pem).map_err(|e| bad("--tls-key", &e))?;
            let chain: Vec<Certificate<'static>> = chain.iter().map(owned).collect();
            TlsConfig::builder()
                .provider(TlsProvider::Rustls)
                .root_certs(RootCerts::Specific(Arc::new(ca.iter().map(owned).collect())))
                .client_cert(Some(ClientCert::new_with_certs(&chain, key)))
                .unversioned_rustls_crypto_provider(provider.clone())
                .build()
        };
        Ok(ClusterTls {
            client: Arc::new(client),
            server: Arc::new(server),
            https: Arc::new(https),
            https_client,
            files,
        })
    }

    /// The identity from the three flags: all of them, or none (no TLS).
    pub fn from_options(
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        ca: Option<PathBuf>,
    ) -> Result<Option<Self>> {
        match (cert, key, ca) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Self::from_files(TlsFiles { cert, key, ca }).map(Some),
            (cert, key, ca) => {
                let missing: Vec<&str> = [
                    ("--tls-cert", cert.is_none()),
                    ("--tls-key", key.is_none()),
                    ("--tls-ca", ca.is_none()),
                ]
                .into_iter()
                .filter_map(|(flag, absent)| absent.then_some(flag))
                .collect();
                Err(Error::config(
                    missing[0],
                    format!(
                        "TLS needs --tls-cert, --tls-key and --tls-ca together; missing {}",
                        missing.join(", ")
                    ),
                ))
            }
        }
    }

    /// The identity named by [`CERT_ENV`], [`KEY_ENV`] and [`CA_ENV`], if set.
    pub fn from_env() -> Result<Option<Self>> {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        Self::from_options(var(CERT_ENV), var(KEY_ENV), var(CA_ENV))
    }

    /// The files it was read from (handed to executors).
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The environment that gives an executor this identity.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        let f = &self.files;
        [(CERT_ENV, &f.cert), (KEY_ENV, &f.key), (CA_ENV, &f.ca)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.display().to_string()))
            .collect()
    }

    /// A client connection, before its handshake.
    pub(crate) fn client(&self) -> io::Result<ClientConnection> {
        let name = ServerName::try_from(CLUSTER_NAME).map_err(io::Error::other)?;
        ClientConnection::new(self.client.clone(), name).map_err(io::Error::other)
    }

    /// A server connection, before its handshake.
    pub(crate) fn server(&self) -> io::Result<ServerConnection> {
        ServerConnection::new(self.server.clone()).map_err(io::Error::other)
    }

    /// The REST API's and UI's HTTPS: this process's certificate; clients may present one of
    /// the cluster's CA (then they need no bearer token off loopback), or none.
    pub(crate) fn https_server(&self) -> Arc<ServerConfig> {
        self.https.clone()
    }

    /// An HTTPS client of a job manager: trusts only the cluster's CA (checking the server's
    /// name, as HTTPS does) and presents this process's certificate.
    pub(crate) fn https_client(&self) -> ureq::tls::TlsConfig {
        self.https_client.clone()
    }
}

fn certificates(path: &Path, flag: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| Error::config(flag, format!("cannot read certificates from {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(Error::config(flag, format!("{} holds no PEM certificate", path.display())));
    }
    Ok(certs)
}

/// A server certificate is good when the cluster's CA signed it and it is valid now; its
/// names are not checked (see the module doc).
#[derive(Debug)]
struct SignedByClusterCa {
    roots: Arc<RootCertStore>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for SignedByClusterCa {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.algorithms.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

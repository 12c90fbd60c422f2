//! Client TLS of the connectors (the Kafka transaction client, PostgreSQL, the Iceberg REST
//! catalog):
//! rustls on Caudal's aws-lc-rs provider — never a process-wide one — trusting the system's
//! roots or the user's CA, optionally presenting a client certificate, checking the server's
//! name unless told not to (as librdkafka's `ssl.endpoint.identification.algorithm=none`).

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a TLS client trusts and shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// PEM file of the CA certificates to trust; the system's roots when `None`.
    pub ca: Option<PathBuf>,
    /// PEM file of this client's certificate chain (mutual TLS), with `key`.
    pub cert: Option<PathBuf>,
    /// PEM file of this client's private key (unencrypted).
    pub key: Option<PathBuf>,
    /// Check that the server's certificate names the host connected to (the default).
    pub verify_hostname: bool,
}

impl ClientTls {
    /// The rustls configuration; errors name the file at fault.
    pub fn config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        let roots = match &self.ca {
            Some(path) => {
                let mut roots = RootCertStore::empty();
                for cert in certificates(path)? {
                    roots.add(cert).map_err(|e| format!("CA certificate in {}: {e}", path.display()))?;
                }
                roots
            }
            None => system_roots()?,
        };
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = if self.verify_hostname {
            builder.with_root_certificates(roots)
        } else {
            let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| e.to_string())?;
            builder.dangerous().with_custom_certificate_verifier(Arc::new(AnyName { inner }))
        };
        self.with_client_cert(builder)
    }

    /// A configuration that encrypts but trusts any server certificate (`ca` and
    /// `verify_hostname` unused): libpq's `sslmode=require` without a root certificate.
    /// Handshake signatures are still checked, so the peer holds the certificate's key.
    pub fn config_unverified(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate { provider }));
        self.with_client_cert(builder)
    }

    fn with_client_cert(
        &self,
        builder: rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert>,
    ) -> Result<Arc<rustls::ClientConfig>, String> {
        let config = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let key_pem =
                    std::fs::read(key).map_err(|e| format!("cannot read {}: {e}", key.display()))?;
                let key_der = PrivateKeyDer::from_pem_slice(&key_pem)
                    .map_err(|e| format!("{} holds no unencrypted PEM private key: {e}", key.display()))?;
                builder
                    .with_client_auth_cert(certificates(cert)?, key_der)
                    .map_err(|e| format!("{} does not fit {}: {e}", key.display(), cert.display()))?
            }
            (None, None) => builder.with_no_client_auth(),
            _ => return Err("a client certificate needs both its certificate and its key file".into()),
        };
        Ok(Arc::new(config))
    }
}

/// The TLS refusal in `e` or its causes, if there is one: the peer's certificate not
/// trusted, or the peer refused ours — what no retry mends.
pub(crate) fn refusal_in(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        let found = s.downcast_ref::<rustls::Error>().or_else(|| {
            s.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        match found {
            Some(rustls::Error::InvalidCertificate(why)) => {
                return Some(format!("the server's TLS certificate is not trusted ({why:?})"))
            }
            Some(rustls::Error::AlertReceived(alert)) => {
                return Some(format!("the server refused the TLS handshake ({alert:?})"))
            }
            _ => {}
        }
        source = s.source();
    }
    None
}

/// The system's root certificates (`SSL_CERT_FILE` / `SSL_CERT_DIR` replace them).
pub(crate) fn system_roots() -> Result<RootCertStore, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found.errors.first().map_or_else(|| "none found".to_string(), ToString::to_string);
        return Err(format!("no usable root certificate on this system ({why})"));
    }
    Ok(roots)
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read certificates from {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

/// The CA's verification with the server's name not checked.
#[derive(Debug)]
struct AnyName {
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Any certificate, its handshake signature checked (see [`ClientTls::config_unverified`]).
#[derive(Debug)]
struct AnyCertificate {
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

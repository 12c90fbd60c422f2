//! How to reach a schema registry: its URL, the credentials it asks for and the TLS trust
//! it needs, read from the Confluent clients' own property names in a `client.properties`
//! ([`RegistryAccess::from_properties`]):
//!
//! | key | meaning |
//! |---|---|
//! | `schema.registry.url` | the registry's base URL (one; `https://` for TLS) |
//! | `basic.auth.credentials.source` | `USER_INFO` (default), `URL` (`https://user:pass@host`), or `SASL_INHERIT` (the Kafka `sasl.username` / `sasl.password`) |
//! | `basic.auth.user.info` | `user:password` |
//! | `bearer.auth.credentials.source` | `STATIC_TOKEN` (the only one supported) |
//! | `bearer.auth.token` | the token, sent as `Authorization: Bearer …` |
//! | `schema.registry.ssl.ca.location` | PEM file of the CA(s) to trust instead of the system's |
//! | `schema.registry.ssl.certificate.location`, `schema.registry.ssl.key.location` | a client certificate and its key (PEM), for registries that ask for one |
//!
//! Nothing here is ever shown unmasked: `Debug` hides the password and the token.

use std::path::PathBuf;
use std::sync::Arc;

use crate::client_properties::ClientProperties;

/// The variable naming the registry when neither a flag nor the client properties do.
pub const REGISTRY_ENV: &str = "CAUDAL_SCHEMA_REGISTRY";

/// What a registry client needs to reach its registry.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RegistryAccess {
    /// The base URL (`http(s)://host:port[/prefix]`), without credentials.
    pub url: String,
    /// What to authenticate with, if anything.
    pub credentials: Option<RegistryCredentials>,
    /// The CA(s) to trust (PEM); the system's roots when `None`.
    pub ca: Option<PathBuf>,
    /// A client certificate and its private key (PEM), when the registry asks for one.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

/// How a client authenticates to the registry.
#[derive(Clone, PartialEq, Eq)]
pub enum RegistryCredentials {
    /// HTTP basic authentication.
    Basic {
        /// The user.
        user: String,
        /// The password.
        password: String,
    },
    /// A bearer token.
    Bearer(String),
}

impl std::fmt::Debug for RegistryCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegistryCredentials::Basic { user, .. } => write!(f, "Basic({user}:******)"),
            RegistryCredentials::Bearer(_) => f.write_str("Bearer(******)"),
        }
    }
}

impl std::fmt::Debug for RegistryAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAccess")
            .field("url", &self.url)
            .field("credentials", &self.credentials)
            .field("ca", &self.ca)
            .field("client_cert", &self.client_cert.as_ref().map(|(cert, _)| cert))
            .finish()
    }
}

impl From<&str> for RegistryAccess {
    fn from(url: &str) -> Self {
        RegistryAccess { url: url.to_owned(), ..RegistryAccess::default() }
    }
}

impl From<String> for RegistryAccess {
    fn from(url: String) -> Self {
        RegistryAccess { url, ..RegistryAccess::default() }
    }
}

impl From<&String> for RegistryAccess {
    fn from(url: &String) -> Self {
        RegistryAccess::from(url.as_str())
    }
}

impl RegistryAccess {
    /// The access `properties` describe; `url` when they name no `schema.registry.url`.
    /// Settings Caudal cannot honour are refused with the reason, never ignored.
    pub fn from_properties(url: &str, properties: &ClientProperties) -> Result<Self, String> {
        let get = |key: &str| properties.registry_value(key);
        let kafka =
            |key: &str| properties.kafka.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        for (key, _) in &properties.registry {
            if !KNOWN_KEYS.contains(&key.as_str()) {
                return Err(unknown_key(key));
            }
        }
        let url = get("schema.registry.url").unwrap_or(url).trim();
        if url.contains(',') {
            return Err(format!(
                "schema.registry.url `{url}`: Caudal reaches one registry URL; give one (a load balancer's)"
            ));
        }
        let (url, user_info_in_url) = split_user_info(url);
        let basic = match get("basic.auth.credentials.source") {
            None | Some("USER_INFO") => get("basic.auth.user.info")
                .or(get("schema.registry.basic.auth.user.info"))
                .map(|info| basic_from_user_info(info, "basic.auth.user.info"))
                .transpose()?,
            Some("URL") => Some(basic_from_user_info(
                user_info_in_url.as_deref().ok_or(
                    "basic.auth.credentials.source=URL, but schema.registry.url has no user:password@",
                )?,
                "schema.registry.url",
            )?),
            Some("SASL_INHERIT") => match (kafka("sasl.username"), kafka("sasl.password")) {
                (Some(user), Some(password)) => {
                    Some(RegistryCredentials::Basic { user: user.to_owned(), password: password.to_owned() })
                }
                _ => {
                    return Err("basic.auth.credentials.source=SASL_INHERIT needs sasl.username and \
                                sasl.password among the Kafka settings"
                        .to_owned())
                }
            },
            Some(other) => {
                return Err(format!(
                    "basic.auth.credentials.source `{other}` is not one of USER_INFO, URL, SASL_INHERIT"
                ))
            }
        };
        let bearer = match get("bearer.auth.credentials.source") {
            None | Some("STATIC_TOKEN") => {
                get("bearer.auth.token").map(|t| RegistryCredentials::Bearer(t.to_owned()))
            }
            Some(other) => {
                return Err(format!(
                    "bearer.auth.credentials.source `{other}` is not supported: Caudal sends a static \
                     token (STATIC_TOKEN with bearer.auth.token)"
                ))
            }
        };
        let credentials = match (basic, bearer) {
            (Some(_), Some(_)) => {
                return Err(
                    "both basic.auth.* and bearer.auth.* credentials are set for the registry: keep one"
                        .to_owned(),
                )
            }
            (basic, bearer) => basic.or(bearer),
        };
        let ca = get("schema.registry.ssl.ca.location").map(PathBuf::from);
        let client_cert = match (
            get("schema.registry.ssl.certificate.location"),
            get("schema.registry.ssl.key.location"),
        ) {
            (Some(cert), Some(key)) => Some((PathBuf::from(cert), PathBuf::from(key))),
            (None, None) => None,
            _ => {
                return Err("schema.registry.ssl.certificate.location and schema.registry.ssl.key.location \
                            go together"
                    .to_owned())
            }
        };
        if let Some(algorithm) = get("schema.registry.ssl.endpoint.identification.algorithm") {
            if !algorithm.eq_ignore_ascii_case("https") {
                return Err(format!(
                    "schema.registry.ssl.endpoint.identification.algorithm `{algorithm}`: Caudal always \
                     checks the registry's host name (give its certificate that name)"
                ));
            }
        }
        Ok(RegistryAccess { url, credentials, ca, client_cert })
    }

    /// The access a command asks for: the URL from `flag` (`--schema-registry`), else
    /// `properties`' `schema.registry.url`, else [`REGISTRY_ENV`], else `default` (empty:
    /// none named); credentials and TLS from `properties`.
    pub fn resolve(flag: Option<&str>, properties: &ClientProperties, default: &str) -> Result<Self, String> {
        let fallback = std::env::var(REGISTRY_ENV).ok().filter(|u| !u.trim().is_empty());
        let mut access = Self::from_properties(fallback.as_deref().unwrap_or(default), properties)?;
        if let Some(url) = flag {
            access.url = url.to_owned();
        }
        Ok(access)
    }

    /// True when the URL is `https://`.
    pub fn is_https(&self) -> bool {
        self.url.trim_start().to_ascii_lowercase().starts_with("https://")
    }

    /// The `Authorization` header's value, if any.
    pub(crate) fn authorization(&self) -> Option<String> {
        use base64::Engine;
        match &self.credentials {
            None => None,
            Some(RegistryCredentials::Basic { user, password }) => {
                let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
                Some(format!("Basic {encoded}"))
            }
            Some(RegistryCredentials::Bearer(token)) => Some(format!("Bearer {token}")),
        }
    }

    /// The TLS settings of an `https://` registry: the CA given (or the system's roots) and
    /// the client certificate, on rustls with the aws-lc-rs provider.
    pub(crate) fn tls_config(&self) -> Result<ureq::tls::TlsConfig, String> {
        use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig, TlsProvider};
        let read = |path: &PathBuf, what: &str| {
            std::fs::read(path).map_err(|e| format!("{what} {}: {e}", path.display()))
        };
        let roots: Vec<Certificate<'static>> = match &self.ca {
            Some(path) => {
                let what = "schema.registry.ssl.ca.location";
                let certs = pem_certificates(&read(path, what)?)
                    .map_err(|e| format!("{what} {}: {e}", path.display()))?;
                if certs.is_empty() {
                    return Err(format!(
                        "schema.registry.ssl.ca.location {}: no PEM certificate in it",
                        path.display()
                    ));
                }
                certs
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                if found.certs.is_empty() {
                    return Err(format!(
                        "no CA to check the registry's certificate with: the system has none ({:?}); \
                         set schema.registry.ssl.ca.location",
                        found.errors.first()
                    ));
                }
                found.certs.iter().map(|c| Certificate::from_der(c.as_ref()).to_owned()).collect()
            }
        };
        let client_cert = match &self.client_cert {
            None => None,
            Some((cert, key)) => {
                let what = "schema.registry.ssl.certificate.location";
                let chain = pem_certificates(&read(cert, what)?)
                    .map_err(|e| format!("{what} {}: {e}", cert.display()))?;
                let what = "schema.registry.ssl.key.location";
                let key = PrivateKey::from_pem(&read(key, what)?)
                    .map_err(|e| format!("{what} {}: {e} (an unencrypted PEM key)", key.display()))?;
                Some(ClientCert::new_with_certs(&chain, key))
            }
        };
        Ok(TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .root_certs(RootCerts::Specific(Arc::new(roots)))
            .client_cert(client_cert)
            .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
            .build())
    }
}

/// The certificates of a PEM file (other items, such as a key, skipped).
fn pem_certificates(pem: &[u8]) -> Result<Vec<ureq::tls::Certificate<'static>>, ureq::Error> {
    ureq::tls::parse_pem(pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(Ok(c)),
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        })
        .collect()
}

const KNOWN_KEYS: &[&str] = &[
    "schema.registry.url",
    "basic.auth.credentials.source",
    "basic.auth.user.info",
    "schema.registry.basic.auth.user.info",
    "bearer.auth.credentials.source",
    "bearer.auth.token",
    "schema.registry.ssl.ca.location",
    "schema.registry.ssl.certificate.location",
    "schema.registry.ssl.key.location",
    "schema.registry.ssl.endpoint.identification.algorithm",
];

fn unknown_key(key: &str) -> String {
    if key.contains("truststore") || key.contains("keystore") {
        return format!(
            "{key}: Caudal reads PEM files, not Java key stores; use schema.registry.ssl.ca.location \
             (and schema.registry.ssl.certificate.location / .key.location)"
        );
    }
    if key.starts_with("bearer.auth.") {
        return format!(
            "{key} is not supported: the registry takes a static token (bearer.auth.token); \
             OAuth client credentials are not implemented"
        );
    }
    format!("{key} is not a registry setting Caudal knows (known: {})", KNOWN_KEYS.join(", "))
}

/// `https://user:pass@host/…` → (`https://host/…`, `Some("user:pass")`).
fn split_user_info(url: &str) -> (String, Option<String>) {
    let Some((scheme, rest)) = url.split_once("://") else { return (url.to_owned(), None) };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => (format!("{scheme}://{}", &rest[at + 1..]), Some(rest[..at].to_owned())),
        None => (url.to_owned(), None),
    }
}

fn basic_from_user_info(info: &str, key: &str) -> Result<RegistryCredentials, String> {
    match info.split_once(':') {
        Some((user, password)) if !user.is_empty() => {
            Ok(RegistryCredentials::Basic { user: user.to_owned(), password: password.to_owned() })
        }
        _ => Err(format!("{key}: the user info must be user:password")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(text: &str) -> ClientProperties {
        ClientProperties::parse(text, |_| None).unwrap()
    }

    #[test]
    fn the_confluent_keys_give_url_credentials_and_ca() {
        let p = props(
            "security.protocol=SASL_SSL\nschema.registry.url=https://r.example:8443/apis/ccompat/v7\n\
             basic.auth.credentials.source=USER_INFO\nbasic.auth.user.info=svc:pa:ss\n\
             schema.registry.ssl.ca.location=/etc/ca.pem\n",
        );
        let a = RegistryAccess::from_properties("http://default:8081", &p).unwrap();
        assert_eq!(a.url, "https://r.example:8443/apis/ccompat/v7");
        assert_eq!(
            a.credentials,
            Some(RegistryCredentials::Basic { user: "svc".into(), password: "pa:ss".into() })
        );
        assert_eq!(a.ca, Some(PathBuf::from("/etc/ca.pem")));
        assert!(a.is_https());
        assert_eq!(a.authorization().unwrap(), "Basic c3ZjOnBhOnNz");
        let shown = format!("{a:?}");
        assert!(!shown.contains("pa:ss") && shown.contains("svc"), "{shown}");
    }

    #[test]
    fn credentials_come_from_the_url_the_kafka_login_or_a_token() {
        let a = RegistryAccess::from_properties(
            "x",
            &props("schema.registry.url=https://u:p@r:1/x\nbasic.auth.credentials.source=URL\n"),
        )
        .unwrap();
        assert_eq!(a.url, "https://r:1/x");
        assert_eq!(
            a.credentials,
            Some(RegistryCredentials::Basic { user: "u".into(), password: "p".into() })
        );
        let a = RegistryAccess::from_properties(
            "http://r:1",
            &props("sasl.username=k\nsasl.password=s\nbasic.auth.credentials.source=SASL_INHERIT\n"),
        )
        .unwrap();
        assert_eq!(
            a.credentials,
            Some(RegistryCredentials::Basic { user: "k".into(), password: "s".into() })
        );
        let a = RegistryAccess::from_properties("http://r:1", &props("bearer.auth.token=t0k\n")).unwrap();
        assert_eq!(a.authorization().unwrap(), "Bearer t0k");
        assert!(!format!("{a:?}").contains("t0k"));
        let none = RegistryAccess::from_properties("http://r:1", &props("security.protocol=SSL\n")).unwrap();
        assert_eq!(none, RegistryAccess::from("http://r:1"));
    }

    #[test]
    fn settings_caudal_cannot_honour_are_refused_by_name() {
        for (text, named) in [
            ("schema.registry.ssl.truststore.location=/x.jks", "Java key stores"),
            ("bearer.auth.credentials.source=OAUTHBEARER", "OAUTHBEARER"),
            ("bearer.auth.client.id=x", "bearer.auth.client.id"),
            ("schema.registry.urll=http://x", "schema.registry.urll"),
            ("basic.auth.user.info=nocolon", "user:password"),
            ("basic.auth.user.info=a:b\nbearer.auth.token=t", "keep one"),
            ("basic.auth.credentials.source=URL", "no user:password@"),
            ("basic.auth.credentials.source=SASL_INHERIT", "sasl.username"),
            ("schema.registry.url=http://a:1,http://b:1", "one registry URL"),
            ("schema.registry.ssl.certificate.location=/c.pem", "go together"),
            ("schema.registry.ssl.endpoint.identification.algorithm=", "host name"),
        ] {
            let e = RegistryAccess::from_properties("http://r:1", &props(text)).unwrap_err();
            assert!(e.contains(named), "{text}: {e}");
        }
    }
}

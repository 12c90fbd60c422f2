//! How the native client reaches a secured broker, from the same properties librdkafka takes
//! (`security.protocol`, `sasl.*`, `ssl.*`): TLS with rustls, SASL PLAIN and SCRAM. What it
//! cannot speak is refused when the settings are read — at a job's start — naming the key.

use super::scram::ScramHash;
use crate::tls::ClientTls;
use std::path::PathBuf;
use std::sync::Arc;

/// The security of a connection to the brokers.
#[derive(Clone, Default)]
pub struct KafkaSecurity {
    pub(crate) tls: Option<Arc<rustls::ClientConfig>>,
    pub(crate) sasl: Option<Sasl>,
}

impl std::fmt::Debug for KafkaSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSecurity")
            .field("tls", &self.tls.is_some())
            .field("sasl", &self.sasl.as_ref().map(|s| (s.mechanism, s.username.as_str())))
            .finish()
    }
}

/// SASL credentials (the password is never shown).
#[derive(Clone)]
pub(crate) struct Sasl {
    pub(crate) mechanism: Mechanism,
    pub(crate) username: String,
    pub(crate) password: String,
}

/// The SASL mechanisms the native client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mechanism {
    Plain,
    Scram(ScramHash),
}

impl Mechanism {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::Scram(ScramHash::Sha256) => "SCRAM-SHA-256",
            Mechanism::Scram(ScramHash::Sha512) => "SCRAM-SHA-512",
        }
    }
}

impl KafkaSecurity {
    /// Reads `security.protocol`, `sasl.*` and `ssl.*` among `properties` (librdkafka's
    /// names; later entries win). `Err` names the setting the native client cannot honour.
    pub fn from_properties(properties: &[(String, String)]) -> Result<Self, String> {
        let get = |key: &str| properties.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.trim());
        let protocol = get("security.protocol").unwrap_or("plaintext").to_ascii_lowercase();
        let (tls, sasl) = match protocol.as_str() {
            "plaintext" => (false, false),
            "ssl" => (true, false),
            "sasl_plaintext" => (false, true),
            "sasl_ssl" => (true, true),
            other => {
                return Err(format!(
                    "security.protocol={other} is not one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"
                ))
            }
        };
        let mut security = KafkaSecurity::default();
        if tls {
            for unsupported in [
                "ssl.key.password",
                "ssl.keystore.location",
                "ssl.ca.pem",
                "ssl.certificate.pem",
                "ssl.key.pem",
            ] {
                if get(unsupported).is_some() {
                    return Err(format!(
                        "{unsupported} is not supported by Caudal's transaction client: give PEM files in \
                         ssl.ca.location, ssl.certificate.location and ssl.key.location (an unencrypted key)"
                    ));
                }
            }
            let verify_hostname =
                match get("ssl.endpoint.identification.algorithm").map(str::to_ascii_lowercase) {
                    None => true,
                    Some(v) if v == "https" => true,
                    Some(v) if v == "none" || v.is_empty() => false,
                    Some(v) => {
                        return Err(format!("ssl.endpoint.identification.algorithm={v} is not https or none"))
                    }
                };
            let client = ClientTls {
                ca: get("ssl.ca.location").map(PathBuf::from),
                cert: get("ssl.certificate.location").map(PathBuf::from),
                key: get("ssl.key.location").map(PathBuf::from),
                verify_hostname,
            };
            security.tls = Some(client.config().map_err(|e| format!("TLS settings (ssl.*): {e}"))?);
        }
        if sasl {
            // librdkafka's own default mechanism is GSSAPI.
            let name =
                get("sasl.mechanism").or(get("sasl.mechanisms")).unwrap_or("GSSAPI").to_ascii_uppercase();
            let mechanism = match name.as_str() {
                "PLAIN" => Mechanism::Plain,
                "SCRAM-SHA-256" => Mechanism::Scram(ScramHash::Sha256),
                "SCRAM-SHA-512" => Mechanism::Scram(ScramHash::Sha512),
                other => {
                    return Err(format!(
                        "sasl.mechanism={other} is not supported by Caudal's transaction client (it speaks \
                         PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512)"
                    ))
                }
            };
            let need = |key: &str| {
                get(key).map(str::to_owned).ok_or_else(|| format!("sasl.mechanism={name} needs {key}"))
            };
            security.sasl =
                Some(Sasl { mechanism, username: need("sasl.username")?, password: need("sasl.password")? });
        }
        Ok(security)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(kv: &[(&str, &str)]) -> Vec<(String, String)> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn settings_it_cannot_honour_are_refused_naming_them() {
        assert!(KafkaSecurity::from_properties(&[]).unwrap().tls.is_none());
        let e =
            KafkaSecurity::from_properties(&props(&[("security.protocol", "SASL_PLAINTEXT")])).unwrap_err();
        assert!(e.contains("GSSAPI"), "{e}");
        let e = KafkaSecurity::from_properties(&props(&[
            ("security.protocol", "sasl_plaintext"),
            ("sasl.mechanism", "OAUTHBEARER"),
        ]))
        .unwrap_err();
        assert!(e.contains("OAUTHBEARER"), "{e}");
        let e = KafkaSecurity::from_properties(&props(&[
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
            ("sasl.username", "u"),
        ]))
        .unwrap_err();
        assert!(e.contains("sasl.password"), "{e}");
        let e = KafkaSecurity::from_properties(&props(&[
            ("security.protocol", "ssl"),
            ("ssl.key.password", "x"),
        ]))
        .unwrap_err();
        assert!(e.contains("ssl.key.password"), "{e}");
        let e = KafkaSecurity::from_properties(&props(&[
            ("security.protocol", "ssl"),
            ("ssl.ca.location", "/nope"),
        ]))
        .unwrap_err();
        assert!(e.contains("/nope"), "{e}");
        assert!(KafkaSecurity::from_properties(&props(&[("security.protocol", "kerberos")])).is_err());
    }

    #[test]
    fn the_password_is_never_shown() {
        let s = KafkaSecurity::from_properties(&props(&[
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanism", "scram-sha-256"),
            ("sasl.username", "alice"),
            ("sasl.password", "s3cret-pw"),
        ]))
        .unwrap();
        let shown = format!("{s:?}");
        assert!(shown.contains("alice") && !shown.contains("s3cret-pw"), "{shown}");
        assert_eq!(s.sasl.unwrap().mechanism, Mechanism::Scram(ScramHash::Sha256));
    }
}

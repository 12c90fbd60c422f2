//! One Kafka client configuration, kept the way Kafka users keep it: a `client.properties`
//! file with the keys the Java client and librdkafka share (`security.protocol`, `sasl.*`,
//! `ssl.*`, …) and, in the same file, the Confluent registry client's own
//! (`schema.registry.url`, `basic.auth.*`, `bearer.auth.*`, `schema.registry.ssl.*`).
//!
//! Values may name an environment variable, `${env:NAME}`, as Kafka's `EnvVarConfigProvider`
//! does: a secret then stays out of the file. Nothing here is ever logged or shown unmasked
//! ([`is_secret`]).

use std::path::Path;

/// The keys of a `client.properties` file, split by who takes them.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ClientProperties {
    /// For every Kafka client (librdkafka's names).
    pub kafka: Vec<(String, String)>,
    /// For the schema registry client (the Confluent clients' names).
    pub registry: Vec<(String, String)>,
}

impl std::fmt::Debug for ClientProperties {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = |kv: &[(String, String)]| -> Vec<String> {
            kv.iter().map(|(k, v)| format!("{k}={}", if is_secret(k) { "******" } else { v })).collect()
        };
        f.debug_struct("ClientProperties")
            .field("kafka", &shown(&self.kafka))
            .field("registry", &shown(&self.registry))
            .finish()
    }
}

/// True for a key whose value must never be shown (passwords, secrets, keys, credentials).
pub fn is_secret(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.contains("password")
        || k.contains("secret")
        || k.ends_with(".key.pem")
        || k == "basic.auth.user.info"
        || k == "bearer.auth.token"
        || k.contains("jaas.config")
        || k.contains("sasl.oauthbearer.config")
}

fn is_registry_key(key: &str) -> bool {
    ["schema.registry.", "basic.auth.", "bearer.auth."].iter().any(|p| key.starts_with(p))
}

impl ClientProperties {
    /// Reads `path` (`key=value` or `key: value` lines, `#` and `!` comments); the error
    /// names the file and the line.
    pub fn load(path: &Path) -> std::result::Result<Self, String> {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::parse(&text, |name| std::env::var(name).ok()).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses the text of a properties file; `env` looks up `${env:NAME}`.
    pub fn parse(text: &str, env: impl Fn(&str) -> Option<String>) -> std::result::Result<Self, String> {
        let mut out = ClientProperties::default();
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                continue;
            }
            if line.ends_with('\\') {
                return Err(format!("line {}: continuation lines are not supported", n + 1));
            }
            let at = line.find(['=', ':']).ok_or_else(|| format!("line {}: not key=value", n + 1))?;
            let (key, value) = (line[..at].trim(), line[at + 1..].trim());
            if key.is_empty() {
                return Err(format!("line {}: no key", n + 1));
            }
            let value = substitute(value, &env).map_err(|e| format!("line {} ({key}): {e}", n + 1))?;
            let side = if is_registry_key(key) { &mut out.registry } else { &mut out.kafka };
            side.push((key.to_owned(), value));
        }
        Ok(out)
    }

    /// The value of registry key `key`, if set.
    pub fn registry_value(&self, key: &str) -> Option<&str> {
        self.registry.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// `value` with every `${env:NAME}` replaced by the variable's value (from this process's
/// environment): a connection URL can name its password without holding it, e.g.
/// `postgres://app:${env:PG_PASSWORD}@db:5432/iot`.
pub fn expand_env(value: &str) -> std::result::Result<String, String> {
    substitute(value, &|name: &str| std::env::var(name).ok())
}

/// Replaces every `${env:NAME}` in `value` by the variable's value.
fn substitute(value: &str, env: &impl Fn(&str) -> Option<String>) -> std::result::Result<String, String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(at) = rest.find("${env:") {
        out.push_str(&rest[..at]);
        let tail = &rest[at + 6..];
        let end = tail.find('}').ok_or("an unclosed ${env:…}")?;
        let name = &tail[..end];
        out.push_str(&env(name).ok_or_else(|| format!("the environment variable {name} is not set"))?);
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_properties_file_splits_into_kafka_and_registry_keys() {
        let text = "# a comment\n! another\nsecurity.protocol=SASL_SSL\nsasl.mechanism : SCRAM-SHA-512\n\
                    sasl.username=caudal\nsasl.password=${env:KAFKA_PW}\n\nschema.registry.url=https://r:8443\n\
                    basic.auth.credentials.source=USER_INFO\nbasic.auth.user.info=u:${env:REG_PW}\n";
        let env = |n: &str| match n {
            "KAFKA_PW" => Some("k-secret".to_string()),
            "REG_PW" => Some("r-secret".to_string()),
            _ => None,
        };
        let p = ClientProperties::parse(text, env).unwrap();
        assert_eq!(p.kafka.len(), 4);
        assert!(p.kafka.contains(&("sasl.mechanism".into(), "SCRAM-SHA-512".into())));
        assert!(p.kafka.contains(&("sasl.password".into(), "k-secret".into())));
        assert_eq!(p.registry_value("basic.auth.user.info"), Some("u:r-secret"));
        let shown = format!("{p:?}");
        assert!(!shown.contains("k-secret") && !shown.contains("r-secret"), "{shown}");
    }

    #[test]
    fn bad_lines_and_missing_variables_are_named() {
        let none = |_: &str| None;
        assert!(ClientProperties::parse("just a line", none).unwrap_err().contains("line 1"));
        assert!(ClientProperties::parse("a=b\\", none).unwrap_err().contains("continuation"));
        let e = ClientProperties::parse("x=1\nsasl.password=${env:NOPE}", none).unwrap_err();
        assert!(e.contains("line 2") && e.contains("NOPE"), "{e}");
        assert!(ClientProperties::parse("k=${env:OPEN", none).is_err());
    }
}

//! Schema lookup and registration: the [`SchemaStore`] trait, a blocking client of the
//! Confluent Schema Registry REST API ([`RegistryClient`]) and an in-memory store for
//! tests ([`InMemorySchemaStore`]).
//!
//! The client works with any Confluent-compatible registry (Confluent, Apicurio's
//! `ccompat` API, Redpanda, Karapace, `caudal registry`); the base URL may carry a path
//! prefix, e.g. `http://127.0.0.1:18081/apis/ccompat/v7`. Schema ids are immutable, so
//! both directions (id → schema, subject + schema → id) are cached for the client's
//! lifetime.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use apache_avro::Schema;
use parking_lot::{Mutex, RwLock};
use serde::Deserialize;
use serde_json::json;

use crate::compat::{check, CompatibilityLevel, Incompatibility};
use crate::error::{Error, RegistryError, Result};
use crate::registry_access::RegistryAccess;

/// The registry's content type for request bodies.
pub const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

const ACCEPT: &str = "application/vnd.schemaregistry.v1+json, \
                      application/vnd.schemaregistry+json; qs=0.9, application/json; qs=0.5";

/// Default timeout of one registry request.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The subject a topic's values are registered under (`TopicNameStrategy`).
pub fn subject_for_topic(topic: &str) -> String {
    format!("{topic}-value")
}

/// Where serializers register schemas and deserializers look writer schemas up.
///
/// Called on cache misses only, never per record.
pub trait SchemaStore: Send + Sync {
    /// Registers `schema` under `subject` (or finds it already registered) and returns
    /// its global id.
    fn register(&self, subject: &str, schema: &Schema) -> Result<u32>;

    /// The schema with global id `id`; [`Error::UnknownSchemaId`] when there is none.
    fn schema_by_id(&self, id: u32) -> Result<Arc<Schema>>;
}

/// One version of a subject.
#[derive(Debug, Clone)]
pub struct RegisteredSchema {
    /// The subject.
    pub subject: String,
    /// Global schema id.
    pub id: u32,
    /// Version within the subject (1, 2, …).
    pub version: u32,
    /// The schema.
    pub schema: Arc<Schema>,
}

/// The registry's answer to a compatibility test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompatibilityReport {
    /// Whether the schema may be registered under the subject.
    pub is_compatible: bool,
    /// The registry's reasons, when it gave any.
    pub messages: Vec<String>,
}

/// Blocking client of the Confluent Schema Registry REST API, with an id cache.
///
/// Share one per process (`Arc<RegistryClient>`): the caches are behind locks and only
/// touched on serializer/deserializer cache misses.
pub struct RegistryClient {
    base_url: String,
    agent: ureq::Agent,
    /// The `Authorization` header, when the registry asks for credentials (never shown).
    authorization: Option<String>,
    schemas_by_id: RwLock<HashMap<u32, Arc<Schema>>>,
    ids_by_subject_schema: RwLock<HashMap<(String, String), u32>>,
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryClient").field("base_url", &self.base_url).finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct IdResponse {
    id: u32,
}

#[derive(Deserialize)]
struct SchemaResponse {
    schema: String,
    #[serde(rename = "schemaType")]
    schema_type: Option<String>,
}

#[derive(Deserialize)]
struct VersionResponse {
    subject: String,
    id: u32,
    version: u32,
    schema: String,
    #[serde(rename = "schemaType")]
    schema_type: Option<String>,
}

#[derive(Deserialize)]
struct ConfigResponse {
    #[serde(alias = "compatibilityLevel")]
    compatibility: String,
}

#[derive(Deserialize)]
struct CompatibilityResponse {
    is_compatible: bool,
    #[serde(default)]
    messages: Vec<String>,
}

#[derive(Deserialize)]
struct ErrorBody {
    error_code: Option<i64>,
    message: Option<String>,
}

enum Method<'a> {
    Get,
    Post(&'a serde_json::Value),
    Put(&'a serde_json::Value),
}

impl Method<'_> {
    fn name(&self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post(_) => "POST",
            Method::Put(_) => "PUT",
        }
    }
}

impl RegistryClient {
    /// A client of the registry at `base_url` (`http://host:port[/prefix]`), with
    /// [`DEFAULT_TIMEOUT`] per request. No request is made until the first call.
    pub fn new(base_url: &str) -> Result<Self> {
        Self::with_timeout(base_url, DEFAULT_TIMEOUT)
    }

    /// As [`RegistryClient::new`], with a per-request timeout.
    pub fn with_timeout(base_url: &str, timeout: Duration) -> Result<Self> {
        Self::connect(&RegistryAccess::from(base_url), timeout)
    }

    /// A client of the registry `access` describes (URL, credentials, TLS trust), with a
    /// per-request timeout. The CA and key files are read here; no request is made.
    pub fn connect(access: &RegistryAccess, timeout: Duration) -> Result<Self> {
        let trimmed = access.url.trim().trim_end_matches('/');
        let rest = trimmed.strip_prefix("http://").or_else(|| trimmed.strip_prefix("https://"));
        if rest.is_none_or(|host| host.is_empty() || host.starts_with('/')) {
            return Err(Error::RegistryRefused {
                url: access.url.clone(),
                reason: "the registry URL must look like http://host:port[/path-prefix]".to_owned(),
            });
        }
        let mut config =
            ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(timeout));
        if access.is_https() {
            let tls = access
                .tls_config()
                .map_err(|reason| Error::RegistryRefused { url: trimmed.to_owned(), reason })?;
            config = config.tls_config(tls);
        }
        Ok(Self {
            base_url: trimmed.to_owned(),
            agent: config.build().new_agent(),
            authorization: access.authorization(),
            schemas_by_id: RwLock::new(HashMap::new()),
            ids_by_subject_schema: RwLock::new(HashMap::new()),
        })
    }

    /// Whether the registry lets this client in: one cheap request (the global
    /// compatibility level). `Ok` when it answers; a refused password or certificate is an
    /// error for which [`Error::is_retryable`] is false.
    pub fn check_access(&self) -> Result<()> {
        let _: serde_json::Value = self.request(Method::Get, "/config")?;
        Ok(())
    }

    /// The base URL, without trailing slash.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Registers `schema_json` under `subject` (`POST /subjects/{subject}/versions`) and
    /// returns its global id. Registering an already registered schema returns the
    /// existing id; the answer is cached.
    ///
    /// An incompatible schema is refused by the registry with HTTP 409.
    pub fn register_json(&self, subject: &str, schema_json: &str) -> Result<u32> {
        let key = (subject.to_owned(), schema_json.to_owned());
        if let Some(id) = self.ids_by_subject_schema.read().get(&key) {
            return Ok(*id);
        }
        let body = json!({ "schema": schema_json });
        let path = format!("/subjects/{}/versions", encode_segment(subject));
        // Registering is idempotent, so a failed attempt is simply made again: Apicurio's
        // ccompat API loses races between concurrent first registrations of one subject or
        // one schema (409 "already exists", or 500 from a unique-key violation), and any
        // registry may answer 5xx or time out for a moment.
        // Up to ~10 s in all (backoff 20 ms doubling to 2 s), each retry said on stderr.
        const ATTEMPTS: u32 = 10;
        let mut attempt = 0u32;
        let resp: IdResponse = loop {
            let why = match self.request(Method::Post(&body), &path) {
                Err(Error::Registry(e)) if attempt + 1 < ATTEMPTS && e.is_subject_create_race() => {
                    e.to_string()
                }
                Err(e) if attempt + 1 < ATTEMPTS && e.is_retryable() => e.to_string(),
                other => break other?,
            };
            let wait = std::time::Duration::from_millis((20u64 << attempt).min(2000));
            tracing::warn!("caudal: {why}; registering again in {wait:?} ({} of {ATTEMPTS})", attempt + 2);
            std::thread::sleep(wait);
            attempt += 1;
        };
        self.ids_by_subject_schema.write().insert(key, resp.id);
        Ok(resp.id)
    }

    /// The schema with global id `id` (`GET /schemas/ids/{id}`), cached.
    pub fn get_schema(&self, id: u32) -> Result<Arc<Schema>> {
        if let Some(schema) = self.schemas_by_id.read().get(&id) {
            return Ok(Arc::clone(schema));
        }
        let path = format!("/schemas/ids/{id}");
        let resp: SchemaResponse = match self.request(Method::Get, &path) {
            Ok(resp) => resp,
            Err(Error::Registry(e)) if e.status == 404 => return Err(Error::UnknownSchemaId { id }),
            Err(e) => return Err(e),
        };
        let schema = Arc::new(parse_avro(&resp.schema, resp.schema_type.as_deref())?);
        self.schemas_by_id.write().insert(id, Arc::clone(&schema));
        Ok(schema)
    }

    /// The latest version of `subject` (`GET /subjects/{subject}/versions/latest`).
    /// Not cached: it changes when producers register.
    pub fn latest(&self, subject: &str) -> Result<RegisteredSchema> {
        let path = format!("/subjects/{}/versions/latest", encode_segment(subject));
        let resp: VersionResponse = self.request(Method::Get, &path)?;
        let schema = Arc::new(parse_avro(&resp.schema, resp.schema_type.as_deref())?);
        self.schemas_by_id.write().insert(resp.id, Arc::clone(&schema));
        Ok(RegisteredSchema { subject: resp.subject, id: resp.id, version: resp.version, schema })
    }

    /// All subjects (`GET /subjects`).
    pub fn subjects(&self) -> Result<Vec<String>> {
        self.request(Method::Get, "/subjects")
    }

    /// Sets the compatibility level of `subject` (`PUT /config/{subject}`).
    pub fn set_compatibility(&self, subject: &str, level: CompatibilityLevel) -> Result<()> {
        let body = json!({ "compatibility": level.as_str() });
        let path = format!("/config/{}", encode_segment(subject));
        let _: serde_json::Value = self.request(Method::Put(&body), &path)?;
        Ok(())
    }

    /// The compatibility level that applies to `subject`
    /// (`GET /config/{subject}?defaultToGlobal=true`). `None` for a level Caudal does
    /// not know.
    pub fn compatibility(&self, subject: &str) -> Result<Option<CompatibilityLevel>> {
        let path = format!("/config/{}?defaultToGlobal=true", encode_segment(subject));
        let resp: ConfigResponse = self.request(Method::Get, &path)?;
        Ok(CompatibilityLevel::parse(&resp.compatibility))
    }

    /// Asks the registry whether `schema_json` may be registered under `subject`
    /// (`POST /compatibility/subjects/{subject}/versions/latest?verbose=true`).
    /// A subject without versions is an error (HTTP 404, error code 40401).
    pub fn test_compatibility(&self, subject: &str, schema_json: &str) -> Result<CompatibilityReport> {
        let body = json!({ "schema": schema_json });
        let path =
            format!("/compatibility/subjects/{}/versions/latest?verbose=true", encode_segment(subject));
        let resp: CompatibilityResponse = self.request(Method::Post(&body), &path)?;
        Ok(CompatibilityReport { is_compatible: resp.is_compatible, messages: resp.messages })
    }

    /// Checks `new` locally against the latest version of `subject` at the subject's
    /// compatibility level (as `caudal schema check` does before a deploy): the outer
    /// `Result` is the registry conversation, the inner one the verdict with a
    /// human-readable reason. Levels Caudal does not know are checked as BACKWARD.
    pub fn check_against_latest(&self, subject: &str, new: &Schema) -> Result<Result<(), Incompatibility>> {
        let latest = self.latest(subject)?;
        let level = self.compatibility(subject)?.unwrap_or(CompatibilityLevel::Backward);
        Ok(check(level, new, &latest.schema))
    }

    fn request<T: serde::de::DeserializeOwned>(&self, method: Method<'_>, path: &str) -> Result<T> {
        let url = format!("{}{}", self.base_url, path);
        let authorization = self.authorization.as_deref();
        let sent = match &method {
            Method::Get => self.agent.get(&url).header("Accept", ACCEPT).authorized(authorization).call(),
            Method::Post(body) => self
                .agent
                .post(&url)
                .header("Accept", ACCEPT)
                .authorized(authorization)
                .content_type(CONTENT_TYPE)
                .send(body.to_string()),
            Method::Put(body) => self
                .agent
                .put(&url)
                .header("Accept", ACCEPT)
                .authorized(authorization)
                .content_type(CONTENT_TYPE)
                .send(body.to_string()),
        };
        let unavailable = |reason: String| Error::RegistryUnavailable { url: url.clone(), reason };
        let mut resp = sent.map_err(|e| match tls_refusal(&e) {
            Some(reason) => Error::RegistryRefused { url: url.clone(), reason },
            None => unavailable(e.to_string()),
        })?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| unavailable(format!("reading the HTTP {status} answer: {e}")))?;
        if !(200..300).contains(&status) {
            let mut error = registry_error(format!("{} {url}", method.name()), status, &text);
            if status == 401 || status == 403 {
                let sent =
                    if self.authorization.is_some() { "the credentials given" } else { "no credentials" };
                error.message = format!(
                    "{} — refused with {sent} (basic.auth.user.info or bearer.auth.token)",
                    error.message
                );
            }
            return Err(Error::Registry(error));
        }
        serde_json::from_str(&text).map_err(|e| {
            unavailable(format!(
                "HTTP {status} answer is not the registry API ({e}): {}",
                truncate(&text, 200)
            ))
        })
    }
}

/// Sets the `Authorization` header when there is one.
trait Authorized {
    fn authorized(self, authorization: Option<&str>) -> Self;
}

impl<B> Authorized for ureq::RequestBuilder<B> {
    fn authorized(self, authorization: Option<&str>) -> Self {
        match authorization {
            Some(value) => self.header("Authorization", value),
            None => self,
        }
    }
}

/// The reason, when a request failed because TLS refused a certificate (ours or the
/// registry's): no retry mends that.
fn tls_refusal(e: &ureq::Error) -> Option<String> {
    let ureq::Error::Io(io) = e else { return None };
    match io.get_ref()?.downcast_ref::<rustls::Error>()? {
        rustls::Error::InvalidCertificate(why) => Some(format!(
            "the registry's TLS certificate is not trusted ({why:?}); check \
             schema.registry.ssl.ca.location and the URL's host name"
        )),
        rustls::Error::AlertReceived(alert) => Some(format!(
            "the registry refused the TLS handshake ({alert:?}); it may want a client certificate \
             (schema.registry.ssl.certificate.location / .key.location) or trust ours"
        )),
        _ => None,
    }
}

impl SchemaStore for RegistryClient {
    fn register(&self, subject: &str, schema: &Schema) -> Result<u32> {
        self.register_json(subject, &schema_to_json(schema)?)
    }

    fn schema_by_id(&self, id: u32) -> Result<Arc<Schema>> {
        self.get_schema(id)
    }
}

/// The full JSON of a parsed schema (defaults, logical types and docs kept), as sent to
/// the registry.
pub fn schema_to_json(schema: &Schema) -> Result<String> {
    serde_json::to_string(schema).map_err(Error::invalid_schema)
}

fn parse_avro(text: &str, schema_type: Option<&str>) -> Result<Schema> {
    match schema_type {
        None | Some("AVRO") => Schema::parse_str(text).map_err(Error::invalid_schema),
        Some(other) => Err(Error::InvalidSchema {
            reason: format!("registry schema is {other}, Caudal reads AVRO only"),
        }),
    }
}

fn registry_error(request: String, status: u16, body: &str) -> RegistryError {
    match serde_json::from_str::<ErrorBody>(body) {
        Ok(ErrorBody { error_code, message }) if error_code.is_some() || message.is_some() => {
            RegistryError { request, status, error_code, message: message.unwrap_or_default() }
        }
        _ => RegistryError { request, status, error_code: None, message: truncate(body, 200).to_owned() },
    }
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Percent-encodes one URL path segment (everything but RFC 3986 unreserved bytes).
fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// An in-memory [`SchemaStore`] for tests: ids from 1, the same schema gets the same id
/// under every subject, as in Confluent's registry.
#[derive(Debug, Default)]
pub struct InMemorySchemaStore {
    inner: Mutex<InMemoryInner>,
}

#[derive(Debug, Default)]
struct InMemoryInner {
    by_id: HashMap<u32, Arc<Schema>>,
    by_json: HashMap<String, u32>,
    subjects: HashMap<String, Vec<u32>>,
}

impl InMemorySchemaStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts `schema` under a chosen id (e.g. to simulate another producer's schema).
    pub fn insert(&self, id: u32, schema: Schema) -> Result<()> {
        let json = schema_to_json(&schema)?;
        let mut inner = self.inner.lock();
        inner.by_json.insert(json, id);
        inner.by_id.insert(id, Arc::new(schema));
        Ok(())
    }

    /// The ids registered under `subject`, oldest first.
    pub fn versions(&self, subject: &str) -> Vec<u32> {
        self.inner.lock().subjects.get(subject).cloned().unwrap_or_default()
    }
}

impl SchemaStore for InMemorySchemaStore {
    fn register(&self, subject: &str, schema: &Schema) -> Result<u32> {
        let json = schema_to_json(schema)?;
        let mut inner = self.inner.lock();
        let id = match inner.by_json.get(&json) {
            Some(id) => *id,
            None => {
                let id = inner.by_id.keys().max().map_or(1, |max| max + 1);
                inner.by_json.insert(json, id);
                inner.by_id.insert(id, Arc::new(schema.clone()));
                id
            }
        };
        let versions = inner.subjects.entry(subject.to_owned()).or_default();
        if !versions.contains(&id) {
            versions.push(id);
        }
        Ok(id)
    }

    fn schema_by_id(&self, id: u32) -> Result<Arc<Schema>> {
        self.inner.lock().by_id.get(&id).cloned().ok_or(Error::UnknownSchemaId { id })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::AvroRecord;
    use crate::records::{SensorReading, UserInteraction};

    #[test]
    fn subject_naming_is_topic_name_strategy() {
        assert_eq!(subject_for_topic("earth-temp"), "earth-temp-value");
    }

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(encode_segment("earth-temp-value"), "earth-temp-value");
        assert_eq!(encode_segment("a b/c"), "a%20b%2Fc");
        assert_eq!(encode_segment("é"), "%C3%A9");
    }

    #[test]
    fn base_urls_are_validated_and_trimmed() {
        let c = RegistryClient::new("http://127.0.0.1:18081/apis/ccompat/v7/").unwrap();
        assert_eq!(c.base_url(), "http://127.0.0.1:18081/apis/ccompat/v7");
        for bad in ["127.0.0.1:8081", "", "http://", "ftp://x"] {
            let err = RegistryClient::new(bad).unwrap_err();
            assert!(err.to_string().contains("http://host:port"), "{bad}: {err}");
            assert!(!err.is_retryable());
        }
    }

    #[test]
    fn error_bodies_keep_status_code_and_message() {
        let e = registry_error(
            "POST http://r/subjects/s/versions".into(),
            409,
            r#"{"error_code":409,"message":"Schema being registered is incompatible"}"#,
        );
        assert_eq!(e.status, 409);
        assert_eq!(e.error_code, Some(409));
        assert_eq!(
            e.to_string(),
            "schema registry: POST http://r/subjects/s/versions -> HTTP 409 \
             (error_code 409): Schema being registered is incompatible"
        );
        let e = registry_error("GET x".into(), 502, "<html>Bad Gateway</html>");
        assert_eq!(e.error_code, None);
        assert_eq!(e.message, "<html>Bad Gateway</html>");
        assert!(Error::Registry(e).is_retryable());
    }

    #[test]
    fn schema_json_keeps_defaults_and_logical_types() {
        let json = schema_to_json(UserInteraction::schema()).unwrap();
        assert!(json.contains("timestamp-millis"), "{json}");
        assert!(json.contains(r#""default":null"#), "{json}");
        assert_eq!(&Schema::parse_str(&json).unwrap(), UserInteraction::schema());
    }

    #[test]
    fn in_memory_store_dedupes_by_schema() {
        let store = InMemorySchemaStore::new();
        let a = store.register("t-value", SensorReading::schema()).unwrap();
        let b = store.register("u-value", SensorReading::schema()).unwrap();
        let c = store.register("u-value", UserInteraction::schema()).unwrap();
        assert_eq!((a, b, c), (1, 1, 2));
        assert_eq!(store.versions("u-value"), vec![1, 2]);
        assert_eq!(&*store.schema_by_id(2).unwrap(), UserInteraction::schema());
        assert!(matches!(store.schema_by_id(3), Err(Error::UnknownSchemaId { id: 3 })));
    }
}

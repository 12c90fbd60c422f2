//! [`CheckpointStore`] over `object_store`: a local directory or an S3 bucket.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use super::{CheckpointStore, ObjectEntry};
use crate::{Error, Result};

/// How many files [`CheckpointStore::put_files`] uploads at once.
const UPLOAD_CONCURRENCY: usize = 4;

/// Where checkpoints are stored. Built into an [`ObjectCheckpointStore`] by
/// [`CheckpointStorageConfig::build`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointStorageConfig {
    /// `./data/checkpoints` (default), any relative or absolute path,
    /// `file:///absolute/path`, or `s3://bucket/optional/prefix`.
    #[serde(default = "default_url")]
    pub url: String,
    /// Connection settings used when `url` is `s3://…`.
    #[serde(default)]
    pub s3: S3Config,
}

fn default_url() -> String {
    "./data/checkpoints".to_string()
}

impl Default for CheckpointStorageConfig {
    fn default() -> Self {
        CheckpointStorageConfig { url: default_url(), s3: S3Config::default() }
    }
}

impl CheckpointStorageConfig {
    /// Validates the configuration and opens the store (creating a local directory).
    pub fn build(&self) -> Result<ObjectCheckpointStore> {
        match StorageUrl::parse(&self.url)? {
            StorageUrl::Local(dir) => ObjectCheckpointStore::local(&dir),
            StorageUrl::S3 { bucket, prefix } => ObjectCheckpointStore::s3(&bucket, &prefix, &self.s3),
        }
    }
}

/// S3 connection settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Config {
    /// Endpoint URL for S3-compatible servers (`http://127.0.0.1:19000`); AWS when unset.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Region of the bucket.
    #[serde(default = "default_region")]
    pub region: String,
    /// Access key id; with `secret_access_key`. Without both, the AWS credential chain
    /// of object_store (instance metadata) is used.
    #[serde(default)]
    pub access_key_id: Option<String>,
    /// Secret access key.
    #[serde(default)]
    pub secret_access_key: Option<String>,
    /// Session token for temporary credentials.
    #[serde(default)]
    pub session_token: Option<String>,
    /// Allow plain `http://` endpoints (local test servers).
    #[serde(default)]
    pub allow_http: bool,
    /// Use `bucket.endpoint` host names instead of `endpoint/bucket` paths.
    #[serde(default)]
    pub virtual_hosted_style: bool,
    /// Use the server's conditional put (`If-None-Match: *`) for atomic creation of
    /// checkpoint metadata (default true). Set false for servers without it; creation
    /// then falls back to head + put, which is not atomic against a concurrent writer.
    #[serde(default = "default_true")]
    pub conditional_put: bool,
}

fn default_region() -> String {
    "us-east-1".to_string()
}

fn default_true() -> bool {
    true
}

impl Default for S3Config {
    fn default() -> Self {
        S3Config {
            endpoint: None,
            region: default_region(),
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
            allow_http: false,
            virtual_hosted_style: false,
            conditional_put: true,
        }
    }
}

/// A parsed storage URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageUrl {
    /// A local directory.
    Local(PathBuf),
    /// An S3 bucket and a key prefix (may be empty, no leading or trailing `/`).
    S3 { bucket: String, prefix: String },
}

impl StorageUrl {
    /// Parses `file:///abs`, a plain path, or `s3://bucket/prefix`.
    pub fn parse(url: &str) -> Result<StorageUrl> {
        let url = url.trim();
        if url.is_empty() {
            return Err(Error::config("checkpoint storage url", "is empty"));
        }
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(Error::config(
                    "checkpoint storage url",
                    format!("`{url}` has no bucket; expected s3://bucket/prefix"),
                ));
            }
            return Ok(StorageUrl::S3 {
                bucket: bucket.to_string(),
                prefix: prefix.trim_matches('/').to_string(),
            });
        }
        if let Some(rest) = url.strip_prefix("file://") {
            if !rest.starts_with('/') {
                return Err(Error::config(
                    "checkpoint storage url",
                    format!("`{url}` must be an absolute path: file:///dir"),
                ));
            }
            return Ok(StorageUrl::Local(PathBuf::from(rest)));
        }
        if let Some((scheme, _)) = url.split_once("://") {
            return Err(Error::config(
                "checkpoint storage url",
                format!("unsupported scheme `{scheme}` in `{url}`; use a path, file:// or s3://"),
            ));
        }
        Ok(StorageUrl::Local(PathBuf::from(url)))
    }
}

/// Checkpoint storage on `object_store`, with a blocking API: it owns a small
/// current-thread tokio runtime. Meant for plain threads; inside an async runtime each
/// call blocks the calling worker (it runs on a helper thread).
pub struct ObjectCheckpointStore {
    store: Arc<dyn ObjectStore>,
    runtime: tokio::runtime::Runtime,
    conditional_put: bool,
    location: String,
    /// The directory of a local store.
    local_root: Option<PathBuf>,
}

impl std::fmt::Debug for ObjectCheckpointStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectCheckpointStore")
            .field("location", &self.location)
            .field("conditional_put", &self.conditional_put)
            .finish()
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::io("starting the storage runtime", "tokio"))
}

/// The `object_store` client of the S3 bucket `bucket` with `config`'s endpoint, region and
/// credentials: checkpoint storage, the archive and the Iceberg warehouse share it.
pub fn s3_bucket_store(bucket: &str, config: &S3Config) -> Result<Arc<dyn ObjectStore>> {
    s3_bucket_store_with_retry(bucket, config, object_store::RetryConfig::default())
}

/// [`s3_bucket_store`] with the client's retries set to `retry` (a sink whose writes must
/// ride out an outage waits longer than checkpoint storage, whose checkpoint times out).
pub fn s3_bucket_store_with_retry(
    bucket: &str,
    config: &S3Config,
    retry: object_store::RetryConfig,
) -> Result<Arc<dyn ObjectStore>> {
    let mut b = AmazonS3Builder::new()
        .with_retry(retry)
        .with_bucket_name(bucket)
        .with_region(&config.region)
        .with_allow_http(config.allow_http)
        .with_virtual_hosted_style_request(config.virtual_hosted_style)
        .with_conditional_put(if config.conditional_put {
            S3ConditionalPut::ETagMatch
        } else {
            S3ConditionalPut::Disabled
        });
    if let Some(endpoint) = &config.endpoint {
        if endpoint.starts_with("http://") && !config.allow_http {
            return Err(Error::config(
                "s3.allow_http",
                format!("endpoint `{endpoint}` is plain http; set allow_http = true"),
            ));
        }
        b = b.with_endpoint(endpoint);
    }
    match (&config.access_key_id, &config.secret_access_key) {
        (Some(id), Some(secret)) => {
            b = b.with_access_key_id(id).with_secret_access_key(secret);
        }
        (None, None) => {}
        _ => {
            return Err(Error::config(
                "s3.access_key_id",
                "access_key_id and secret_access_key must be set together",
            ))
        }
    }
    if let Some(token) = &config.session_token {
        b = b.with_token(token);
    }
    let s3 =
        b.build().map_err(|source| Error::Storage { op: "open", path: format!("s3://{bucket}"), source })?;
    Ok(Arc::new(s3))
}

impl ObjectCheckpointStore {
    /// A store in the local directory `dir` (created if missing).
    pub fn local(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(Error::io("creating checkpoint directory", dir))?;
        let abs = dir.canonicalize().map_err(Error::io("resolving checkpoint directory", dir))?;
        let fs = LocalFileSystem::new_with_prefix(&abs).map_err(|source| Error::Storage {
            op: "open",
            path: abs.display().to_string(),
            source,
        })?;
        Ok(ObjectCheckpointStore {
            store: Arc::new(fs),
            runtime: runtime()?,
            conditional_put: true,
            location: format!("file://{}", abs.display()),
            local_root: Some(abs.clone()),
        })
    }

    /// A store in `s3://bucket/prefix`.
    pub fn s3(bucket: &str, prefix: &str, config: &S3Config) -> Result<Self> {
        let location =
            if prefix.is_empty() { format!("s3://{bucket}") } else { format!("s3://{bucket}/{prefix}") };
        let s3 = s3_bucket_store(bucket, config)?;
        let store: Arc<dyn ObjectStore> =
            if prefix.is_empty() { s3 } else { Arc::new(PrefixStore::new(s3, prefix)) };
        Ok(ObjectCheckpointStore {
            store,
            runtime: runtime()?,
            conditional_put: config.conditional_put,
            location,
            local_root: None,
        })
    }

    /// A local store makes what it wrote durable before it says so: the file, and the
    /// directories above it (the rename that published it, the directory it created). `object_store` does neither, and a
    /// checkpoint whose `_metadata` survives a power loss only as an empty file — while the
    /// sinks already committed its epoch — cannot be restored.
    fn sync_local(&self, path: &str) -> Result<()> {
        let Some(root) = &self.local_root else { return Ok(()) };
        let file = root.join(path.trim_start_matches('/'));
        std::fs::File::open(&file).and_then(|f| f.sync_all()).map_err(Error::io("syncing", &file))?;
        // The directories up to the root: a new `chk-<n>/` is an entry of its parent too.
        for dir in file.ancestors().skip(1).take_while(|d| d.starts_with(root)) {
            std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(Error::io("syncing", dir))?;
        }
        Ok(())
    }

    /// Runs `f` on the store's runtime. Called from inside another tokio runtime (a
    /// REST handler, say), it runs on a short-lived helper thread instead of panicking.
    fn block_on<F>(&self, f: F) -> F::Output
    where
        F: Future + Send,
        F::Output: Send,
    {
        if tokio::runtime::Handle::try_current().is_err() {
            return self.runtime.block_on(f);
        }
        std::thread::scope(|s| match s.spawn(|| self.runtime.block_on(f)).join() {
            Ok(v) => v,
            Err(panic) => std::panic::resume_unwind(panic),
        })
    }
}

fn map_err<'a>(op: &'static str, path: &'a str) -> impl FnOnce(object_store::Error) -> Error + 'a {
    move |source| match source {
        object_store::Error::NotFound { .. } => Error::NotFound { path: path.to_string() },
        object_store::Error::AlreadyExists { .. } => Error::AlreadyExists { path: path.to_string() },
        source => Error::Storage { op, path: path.to_string(), source },
    }
}

fn object_path(path: &str) -> ObjectPath {
    ObjectPath::from(path)
}

impl CheckpointStore for ObjectCheckpointStore {
    fn location(&self) -> String {
        self.location.clone()
    }

    fn get(&self, path: &str) -> Result<Bytes> {
        self.block_on(async {
            let r = self.store.get(&object_path(path)).await.map_err(map_err("get", path))?;
            r.bytes().await.map_err(map_err("get", path))
        })
    }

    fn head(&self, path: &str) -> Result<Option<u64>> {
        match self.block_on(self.store.head(&object_path(path))) {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(map_err("head", path)(e)),
        }
    }

    fn put(&self, path: &str, data: Bytes) -> Result<()> {
        self.block_on(self.store.put(&object_path(path), PutPayload::from(data)))
            .map(|_| ())
            .map_err(map_err("put", path))?;
        self.sync_local(path)
    }

    fn put_if_absent(&self, path: &str, data: Bytes) -> Result<()> {
        if !self.conditional_put {
            if self.head(path)?.is_some() {
                return Err(Error::AlreadyExists { path: path.to_string() });
            }
            return self.put(path, data);
        }
        let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
        match self.block_on(self.store.put_opts(&object_path(path), PutPayload::from(data), opts)) {
            Ok(_) => self.sync_local(path),
            Err(object_store::Error::Precondition { .. }) => {
                Err(Error::AlreadyExists { path: path.to_string() })
            }
            Err(e) => Err(map_err("put_if_absent", path)(e)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectEntry>> {
        let p = prefix.trim_matches('/');
        let op = (!p.is_empty()).then(|| object_path(p));
        let metas: Vec<_> = self
            .block_on(self.store.list(op.as_ref()).try_collect::<Vec<_>>())
            .map_err(map_err("list", prefix))?;
        Ok(metas.into_iter().map(|m| ObjectEntry { path: m.location.to_string(), size: m.size }).collect())
    }

    fn list_dirs(&self, prefix: &str) -> Result<Vec<String>> {
        let p = prefix.trim_matches('/');
        let op = (!p.is_empty()).then(|| object_path(p));
        let r =
            self.block_on(self.store.list_with_delimiter(op.as_ref())).map_err(map_err("list", prefix))?;
        Ok(r.common_prefixes.iter().filter_map(|d| d.filename().map(str::to_string)).collect())
    }

    fn sweep_interrupted_writes(&self, prefix: &str) -> Result<Vec<String>> {
        let Some(root) = &self.local_root else { return Ok(Vec::new()) };
        let mut swept = Vec::new();
        sweep_staged(root, &root.join(prefix.trim_matches('/')), &mut swept)?;
        Ok(swept)
    }

    fn delete(&self, path: &str) -> Result<()> {
        match self.block_on(self.store.delete(&object_path(path))) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(map_err("delete", path)(e)),
        }
    }

    fn put_files(&self, files: &[(String, &Path)]) -> Result<()> {
        let store = &self.store;
        self.block_on(
            futures::stream::iter(files.iter().map(|(path, local)| async move {
                let data = std::fs::read(local).map_err(Error::io("reading", *local))?;
                store.put(&object_path(path), PutPayload::from(data)).await.map_err(map_err("put", path))?;
                Ok::<(), Error>(())
            }))
            .buffer_unordered(UPLOAD_CONCURRENCY)
            .try_collect::<Vec<()>>(),
        )?;
        files.iter().try_for_each(|(path, _)| self.sync_local(path))
    }

    fn copy(&self, from: &str, to: &str) -> Result<()> {
        self.block_on(self.store.copy(&object_path(from), &object_path(to))).map_err(map_err("copy", from))
    }
}

/// Deletes `object_store`'s staged uploads (`<name>#<digits>`) under `dir`, recursively,
/// except under `savepoints/`.
fn sweep_staged(root: &Path, dir: &Path, swept: &mut Vec<String>) -> Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io("listing", dir)(e)),
    };
    for entry in entries {
        let path = entry.map_err(Error::io("listing", dir))?.path();
        if path.is_dir() {
            // A savepoint may be being copied by another process (`temperature savepoint`).
            if !path.ends_with("savepoints") {
                sweep_staged(root, &path, swept)?;
            }
            continue;
        }
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let staged = name
            .rsplit_once('#')
            .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if staged {
            std::fs::remove_file(&path).map_err(Error::io("removing", &path))?;
            swept.push(path.strip_prefix(root).unwrap_or(&path).display().to_string());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_removes_staged_uploads_that_list_cannot_see_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let store = ObjectCheckpointStore::local(dir.path()).unwrap();
        for (name, data) in [
            ("job/shared/a.sst#1", "half"),
            ("job/shared/b.sst", "whole"),
            ("job/shared/odd#name", "whole"),
            ("job/chk-3/op#12", "half"),
            ("job/savepoints/s/c.sst#1", "a copy in progress"),
        ] {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, data).unwrap();
        }
        let mut visible: Vec<String> = store.list("job").unwrap().into_iter().map(|e| e.path).collect();
        visible.sort();
        assert!(!visible.iter().any(|p| p.ends_with("#1") || p.ends_with("#12")), "{visible:?}");
        let mut swept = store.sweep_interrupted_writes("job/").unwrap();
        swept.sort();
        assert_eq!(swept, ["job/chk-3/op#12", "job/shared/a.sst#1"]);
        assert!(dir.path().join("job/shared/b.sst").exists());
        assert!(dir.path().join("job/shared/odd#name").exists());
        assert!(dir.path().join("job/savepoints/s/c.sst#1").exists());
        assert_eq!(store.sweep_interrupted_writes("no-such-job").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn parse_urls() {
        assert_eq!(
            StorageUrl::parse("s3://b/x/y/").unwrap(),
            StorageUrl::S3 { bucket: "b".into(), prefix: "x/y".into() }
        );
        assert_eq!(
            StorageUrl::parse("s3://b").unwrap(),
            StorageUrl::S3 { bucket: "b".into(), prefix: "".into() }
        );
        assert_eq!(StorageUrl::parse("file:///tmp/c").unwrap(), StorageUrl::Local("/tmp/c".into()));
        assert_eq!(
            StorageUrl::parse("./data/checkpoints").unwrap(),
            StorageUrl::Local("./data/checkpoints".into())
        );
        assert!(StorageUrl::parse("file://rel").is_err());
        assert!(StorageUrl::parse("gs://b").is_err());
        assert!(StorageUrl::parse("s3:///p").is_err());
    }

    #[test]
    fn config_rejects_unknown_fields() {
        let e = serde_json::from_str::<CheckpointStorageConfig>(r#"{"url":"x","bogus":1}"#);
        assert!(e.is_err());
        let c: CheckpointStorageConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(c.url, "./data/checkpoints");
        assert!(c.s3.conditional_put);
    }

    #[test]
    fn works_inside_another_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let store = ObjectCheckpointStore::local(dir.path()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            store.put("x", Bytes::from_static(b"1")).unwrap();
            assert_eq!(store.head("x").unwrap(), Some(1));
        });
    }

    #[test]
    fn local_store_contract() {
        let dir = tempfile::tempdir().unwrap();
        let store = ObjectCheckpointStore::local(dir.path()).unwrap();
        super::super::contract::check(&store);
    }
}

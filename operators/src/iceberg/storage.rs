//! Iceberg's file I/O on `object_store`: the warehouse is a local directory or an S3 bucket,
//! reached with the same client and settings as checkpoint storage and the archive (no
//! second S3 stack in the binary).
//!
//! **In:** absolute locations as Iceberg writes them (`file:///…`, `s3://bucket/…`).
//! **Out:** [`iceberg::io::Storage`] operations on the matching store.

use crate::retry::RetryPolicy;
use async_trait::async_trait;
use bytes::Bytes;
use caudal_checkpoints::S3Config;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use iceberg::io::{FileIO, FileIOBuilder, FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage};
use iceberg::io::{StorageConfig, StorageFactory};
use iceberg::{Error, ErrorKind, Result};
use object_store::buffered::BufWriter;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use tokio::io::AsyncWriteExt;

/// The S3 client's retries for the warehouse, from the sink's retry policy: a writer cannot
/// redo a file it failed to close, so its requests must ride out an outage themselves (the
/// client's default spends 10 retries within ~3 s). Backoff from `initial_backoff_ms`
/// doubling up to `max_backoff_ms`, for `give_up_after_secs`; the stream waits meanwhile
/// (backpressure).
fn client_retry(policy: &RetryPolicy) -> object_store::RetryConfig {
    use std::time::Duration;
    object_store::RetryConfig {
        backoff: object_store::BackoffConfig {
            init_backoff: Duration::from_millis(policy.initial_backoff_ms),
            max_backoff: Duration::from_millis(policy.max_backoff_ms),
            base: 2.0,
        },
        // The time limit, not the count, ends the retries.
        max_retries: usize::MAX,
        retry_timeout: Duration::from_secs(policy.give_up_after_secs),
    }
}

/// A [`FileIO`] over local directories and S3 buckets reached with `s3`, its requests
/// retried by `retry`.
pub fn file_io(s3: &S3Config, retry: &RetryPolicy) -> FileIO {
    FileIOBuilder::new(factory(s3, retry)).build()
}

/// The storage of [`file_io`], for a catalog that builds its tables' file I/O itself (the
/// REST catalog: whatever the server says of storage, files go through this one).
pub fn factory(s3: &S3Config, retry: &RetryPolicy) -> Arc<dyn StorageFactory> {
    Arc::new(ObjectStorageFactory { s3: s3.clone(), retry: retry.clone() })
}

/// Builds [`ObjectStorage`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ObjectStorageFactory {
    s3: S3Config,
    retry: RetryPolicy,
}

#[typetag::serde]
impl StorageFactory for ObjectStorageFactory {
    fn build(&self, _config: &StorageConfig) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(ObjectStorage {
            s3: self.s3.clone(),
            retry: Some(self.retry.clone()),
            buckets: Arc::default(),
        }))
    }
}

/// Iceberg storage on `object_store`: `file://` paths on the local file system, `s3://`
/// paths on one client per bucket.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ObjectStorage {
    s3: S3Config,
    /// How the S3 client retries (`None`: its default, for a caller that retries itself).
    retry: Option<RetryPolicy>,
    #[serde(skip)]
    buckets: Arc<Mutex<HashMap<String, Arc<dyn ObjectStore>>>>,
}

fn io_error(what: &str, path: &str, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::new(ErrorKind::Unexpected, format!("{what} {path}")).with_source(e)
}

impl ObjectStorage {
    /// The store holding `path` and the object's name in it.
    fn resolve(&self, path: &str) -> Result<(Arc<dyn ObjectStore>, ObjectPath)> {
        if let Some(rest) = path.strip_prefix("s3://").or_else(|| path.strip_prefix("s3a://")) {
            let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
            let store = {
                let mut buckets =
                    self.buckets.lock().map_err(|_| Error::new(ErrorKind::Unexpected, "poisoned"))?;
                match buckets.get(bucket) {
                    Some(s) => s.clone(),
                    None => {
                        let retry = self.retry.as_ref().map_or_else(Default::default, client_retry);
                        let s = caudal_checkpoints::s3_bucket_store_with_retry(bucket, &self.s3, retry)
                            .map_err(|e| io_error("opening bucket of", path, e))?;
                        buckets.insert(bucket.to_string(), s.clone());
                        s
                    }
                }
            };
            let key = ObjectPath::parse(key).map_err(|e| io_error("parsing", path, e))?;
            return Ok((store, key));
        }
        let local = path.strip_prefix("file://").unwrap_or(path);
        if !local.starts_with('/') {
            return Err(Error::new(
                ErrorKind::DataInvalid,
                format!("`{path}` is neither s3://… nor an absolute file:// path"),
            ));
        }
        let key =
            ObjectPath::parse(local.trim_start_matches('/')).map_err(|e| io_error("parsing", path, e))?;
        Ok((Arc::new(LocalFileSystem::new()), key))
    }
}

#[async_trait]
#[typetag::serde]
impl Storage for ObjectStorage {
    async fn exists(&self, path: &str) -> Result<bool> {
        let (store, key) = self.resolve(path)?;
        match store.head(&key).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(io_error("looking up", path, e)),
        }
    }

    async fn metadata(&self, path: &str) -> Result<FileMetadata> {
        let (store, key) = self.resolve(path)?;
        let meta = store.head(&key).await.map_err(|e| io_error("looking up", path, e))?;
        Ok(FileMetadata { size: meta.size })
    }

    async fn read(&self, path: &str) -> Result<Bytes> {
        let (store, key) = self.resolve(path)?;
        let got = store.get(&key).await.map_err(|e| io_error("reading", path, e))?;
        got.bytes().await.map_err(|e| io_error("reading", path, e))
    }

    async fn reader(&self, path: &str) -> Result<Box<dyn FileRead>> {
        let (store, key) = self.resolve(path)?;
        Ok(Box::new(ObjectRead { store, key, path: path.to_string() }))
    }

    async fn write(&self, path: &str, bs: Bytes) -> Result<()> {
        let (store, key) = self.resolve(path)?;
        store.put(&key, PutPayload::from(bs)).await.map_err(|e| io_error("writing", path, e))?;
        Ok(())
    }

    async fn writer(&self, path: &str) -> Result<Box<dyn FileWrite>> {
        let (store, key) = self.resolve(path)?;
        Ok(Box::new(ObjectWrite { writer: BufWriter::new(store, key), path: path.to_string() }))
    }

    async fn delete(&self, path: &str) -> Result<()> {
        let (store, key) = self.resolve(path)?;
        match store.delete(&key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(io_error("deleting", path, e)),
        }
    }

    async fn delete_prefix(&self, path: &str) -> Result<()> {
        let (store, key) = self.resolve(path)?;
        let listed: Vec<ObjectPath> = store
            .list(Some(&key))
            .map_ok(|m| m.location)
            .try_collect()
            .await
            .map_err(|e| io_error("listing", path, e))?;
        for k in listed {
            match store.delete(&k).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(io_error("deleting under", path, e)),
            }
        }
        Ok(())
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> Result<()> {
        while let Some(p) = paths.next().await {
            self.delete(&p).await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_string()))
    }

    fn new_output(&self, path: &str) -> Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_string()))
    }
}

struct ObjectRead {
    store: Arc<dyn ObjectStore>,
    key: ObjectPath,
    path: String,
}

#[async_trait]
impl FileRead for ObjectRead {
    async fn read(&self, range: Range<u64>) -> Result<Bytes> {
        self.store.get_range(&self.key, range).await.map_err(|e| io_error("reading", &self.path, e))
    }
}

/// Uploads as it goes (multipart once past the buffer): a data file is never held whole in
/// memory twice.
struct ObjectWrite {
    writer: BufWriter,
    path: String,
}

#[async_trait]
impl FileWrite for ObjectWrite {
    async fn write(&mut self, bs: Bytes) -> Result<()> {
        self.writer.put(bs).await.map_err(|e| io_error("writing", &self.path, e))
    }

    async fn close(&mut self) -> Result<()> {
        self.writer.shutdown().await.map_err(|e| io_error("finishing", &self.path, e))
    }
}

/// `(scheme, rest)` of an `s3://` or `s3a://` location.
fn s3_scheme(location: &str) -> Option<(&'static str, &str)> {
    location
        .strip_prefix("s3://")
        .map(|rest| ("s3://", rest))
        .or_else(|| location.strip_prefix("s3a://").map(|rest| ("s3a://", rest)))
}

/// One spelling of a location, for comparing what a table references with what a listing
/// finds: `s3a://` as `s3://`, and a local file as its absolute path (`file:///a/b`,
/// `file:/a/b` and `/a/b` are one file) — a warehouse given without a scheme is referenced
/// as `/…` and listed as `file:///…`.
pub(crate) fn canonical(location: &str) -> String {
    if let Some((_, rest)) = s3_scheme(location) {
        return format!("s3://{rest}");
    }
    let local =
        location.strip_prefix("file://").or_else(|| location.strip_prefix("file:")).unwrap_or(location);
    let mut path = String::from("/");
    for part in local.split('/').filter(|p| !p.is_empty() && *p != ".") {
        path.push_str(part);
        path.push('/');
    }
    if path.len() > 1 {
        path.pop();
    }
    path
}

/// The location of every object under `prefix` (an absolute `file://` or `s3://` location).
pub(crate) async fn list(storage_s3: &S3Config, prefix: &str) -> Result<Vec<String>> {
    // The caller retries a failed listing with its policy.
    let storage = ObjectStorage { s3: storage_s3.clone(), retry: None, buckets: Arc::default() };
    let (store, key) = storage.resolve(prefix)?;
    // `s3://bucket` (or `s3a://bucket`) or `file://`; object names carry no leading `/`.
    let root = match s3_scheme(prefix) {
        Some((scheme, rest)) => format!("{scheme}{}", rest.split('/').next().unwrap_or_default()),
        None => "file://".to_string(),
    };
    let listed: Vec<ObjectPath> = match store.list(Some(&key)).map_ok(|m| m.location).try_collect().await {
        Ok(l) => l,
        Err(object_store::Error::NotFound { .. }) => Vec::new(),
        Err(e) => return Err(io_error("listing", prefix, e)),
    };
    Ok(listed.into_iter().map(|k| format!("{root}/{k}")).collect())
}

#[cfg(test)]
mod canonical_tests {
    use super::canonical;

    #[test]
    fn one_spelling_per_location() {
        for same in [
            "file:///w/t/data/a.parquet",
            "file:/w/t/data/a.parquet",
            "/w/t/data/a.parquet",
            "/w//t/./data/a.parquet",
        ] {
            assert_eq!(canonical(same), "/w/t/data/a.parquet", "{same}");
        }
        assert_eq!(canonical("s3a://b/w/a.parquet"), "s3://b/w/a.parquet");
        assert_eq!(canonical("s3://b/w/a.parquet"), "s3://b/w/a.parquet");
        assert_ne!(canonical("/w/t/a"), canonical("/w/t/b"));
    }
}

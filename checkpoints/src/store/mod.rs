//! Checkpoint storage: a small blocking key-value interface over object names.
//!
//! [`CheckpointStore`] is what the protocol needs and nothing more; object names are
//! `/`-separated and relative to the store's root, and every name is built by
//! [`CheckpointPaths`]. [`InMemoryCheckpointStore`] is the fake for tests;
//! [`ObjectCheckpointStore`] is the real one over `object_store` (a local directory or
//! S3), configured by [`CheckpointStorageConfig`].

mod memory;
mod object;
mod paths;

use std::fmt;
use std::path::Path;

use bytes::Bytes;

pub use memory::InMemoryCheckpointStore;
pub use object::{
    s3_bucket_store, s3_bucket_store_with_retry, CheckpointStorageConfig, ObjectCheckpointStore, S3Config,
    StorageUrl,
};
pub use paths::{CheckpointPaths, SharedFileName, StateLocation, METADATA_FILE};

use crate::{Error, Result};

/// One object found by [`CheckpointStore::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectEntry {
    /// Full object name relative to the store root.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
}

/// Blocking access to checkpoint storage. Implementations are cheap to share between
/// threads (`Arc<dyn CheckpointStore>`).
///
/// `prefix` arguments are directory-like: `list("chk-3")` returns the objects under
/// `chk-3/`, `list("")` every object.
pub trait CheckpointStore: Send + Sync + fmt::Debug {
    /// Where the store points (`file:///data/checkpoints`, `s3://bucket/prefix`).
    fn location(&self) -> String;

    /// The object's bytes; [`Error::NotFound`] when absent.
    fn get(&self, path: &str) -> Result<Bytes>;

    /// The object's size, `None` when absent.
    fn head(&self, path: &str) -> Result<Option<u64>>;

    /// Writes the object atomically, replacing any previous one.
    fn put(&self, path: &str, data: Bytes) -> Result<()>;

    /// Creates the object atomically; [`Error::AlreadyExists`] if it exists.
    fn put_if_absent(&self, path: &str, data: Bytes) -> Result<()>;

    /// Objects under the directory `prefix`, in no particular order.
    fn list(&self, prefix: &str) -> Result<Vec<ObjectEntry>>;

    /// Names of the immediate sub-directories of `prefix` (without the prefix).
    fn list_dirs(&self, prefix: &str) -> Result<Vec<String>>;

    /// Deletes the object; deleting an absent object is not an error.
    fn delete(&self, path: &str) -> Result<()>;

    /// Uploads local files (`(object name, local path)`), possibly concurrently.
    fn put_files(&self, files: &[(String, &Path)]) -> Result<()> {
        for (path, local) in files {
            let data = std::fs::read(local).map_err(Error::io("reading", *local))?;
            self.put(path, Bytes::from(data))?;
        }
        Ok(())
    }

    /// Copies an object inside the store.
    fn copy(&self, from: &str, to: &str) -> Result<()> {
        let data = self.get(from)?;
        self.put(to, data)
    }

    /// Deletes what writers killed mid-write left under `prefix` and that [`Self::list`]
    /// cannot see (so retention never would): a local directory's staged uploads
    /// (`<name>#<n>`). Only safe while nothing writes there; returns the paths deleted.
    /// Object stores have nothing of the kind (an S3 bucket's incomplete multipart uploads
    /// are for its lifecycle rules).
    fn sweep_interrupted_writes(&self, _prefix: &str) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
}

/// Deletes every object under the directory `prefix`; returns how many were deleted.
pub fn delete_dir(store: &dyn CheckpointStore, prefix: &str) -> Result<usize> {
    let entries = store.list(prefix)?;
    for e in &entries {
        store.delete(&e.path)?;
    }
    Ok(entries.len())
}

pub(crate) fn dir_prefix(prefix: &str) -> String {
    let p = prefix.trim_matches('/');
    if p.is_empty() {
        String::new()
    } else {
        format!("{p}/")
    }
}

#[cfg(test)]
pub(crate) mod contract {
    //! The same assertions for every store implementation.
    use super::*;

    pub fn check(store: &dyn CheckpointStore) {
        let before = store.list("t").unwrap();
        assert!(before.is_empty(), "{before:?}");
        store.put("t/a/1", Bytes::from_static(b"one")).unwrap();
        store.put("t/a/2", Bytes::from_static(b"two!")).unwrap();
        store.put("t/b/3", Bytes::from_static(b"3")).unwrap();
        store.put("tx/4", Bytes::from_static(b"4")).unwrap();
        assert_eq!(&store.get("t/a/2").unwrap()[..], b"two!");
        assert_eq!(store.head("t/a/2").unwrap(), Some(4));
        assert_eq!(store.head("t/a/9").unwrap(), None);
        assert!(matches!(store.get("t/a/9"), Err(Error::NotFound { .. })));
        let mut names: Vec<_> = store.list("t").unwrap().into_iter().map(|e| e.path).collect();
        names.sort();
        assert_eq!(names, ["t/a/1", "t/a/2", "t/b/3"]);
        let mut dirs = store.list_dirs("t").unwrap();
        dirs.sort();
        assert_eq!(dirs, ["a", "b"]);
        store.put_if_absent("t/c", Bytes::from_static(b"c")).unwrap();
        let again = store.put_if_absent("t/c", Bytes::from_static(b"d"));
        assert!(matches!(again, Err(Error::AlreadyExists { .. })), "{again:?}");
        assert_eq!(&store.get("t/c").unwrap()[..], b"c");
        store.copy("t/c", "t/d").unwrap();
        assert_eq!(&store.get("t/d").unwrap()[..], b"c");
        store.delete("t/c").unwrap();
        store.delete("t/c").unwrap();
        assert_eq!(delete_dir(store, "t").unwrap(), 4);
        store.delete("tx/4").unwrap();
        assert!(store.list("t").unwrap().is_empty());
    }
}

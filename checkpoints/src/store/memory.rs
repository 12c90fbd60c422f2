//! An in-memory [`CheckpointStore`] for tests.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;

use super::{dir_prefix, CheckpointStore, ObjectEntry};
use crate::{Error, Result};

/// A map from object name to bytes behind a mutex. Counts the bytes and objects
/// written, so tests can check incremental uploads.
#[derive(Debug, Default)]
pub struct InMemoryCheckpointStore {
    objects: Mutex<BTreeMap<String, Bytes>>,
    puts: AtomicU64,
    put_bytes: AtomicU64,
}

impl InMemoryCheckpointStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of objects written so far (put, put_if_absent, copy).
    pub fn put_count(&self) -> u64 {
        self.puts.load(Ordering::Relaxed)
    }

    /// Bytes written so far.
    pub fn put_bytes(&self) -> u64 {
        self.put_bytes.load(Ordering::Relaxed)
    }

    /// Replaces an object's bytes without counting (tests that corrupt storage).
    pub fn overwrite(&self, path: &str, data: Bytes) {
        self.objects.lock().insert(path.to_string(), data);
    }

    fn count(&self, len: usize) {
        self.puts.fetch_add(1, Ordering::Relaxed);
        self.put_bytes.fetch_add(len as u64, Ordering::Relaxed);
    }
}

impl CheckpointStore for InMemoryCheckpointStore {
    fn location(&self) -> String {
        "memory://".to_string()
    }

    fn get(&self, path: &str) -> Result<Bytes> {
        self.objects.lock().get(path).cloned().ok_or_else(|| Error::NotFound { path: path.to_string() })
    }

    fn head(&self, path: &str) -> Result<Option<u64>> {
        Ok(self.objects.lock().get(path).map(|b| b.len() as u64))
    }

    fn put(&self, path: &str, data: Bytes) -> Result<()> {
        self.count(data.len());
        self.objects.lock().insert(path.to_string(), data);
        Ok(())
    }

    fn put_if_absent(&self, path: &str, data: Bytes) -> Result<()> {
        let mut objects = self.objects.lock();
        if objects.contains_key(path) {
            return Err(Error::AlreadyExists { path: path.to_string() });
        }
        self.count(data.len());
        objects.insert(path.to_string(), data);
        Ok(())
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectEntry>> {
        let prefix = dir_prefix(prefix);
        Ok(self
            .objects
            .lock()
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .map(|(k, v)| ObjectEntry { path: k.clone(), size: v.len() as u64 })
            .collect())
    }

    fn list_dirs(&self, prefix: &str) -> Result<Vec<String>> {
        let prefix = dir_prefix(prefix);
        let dirs: BTreeSet<String> = self
            .objects
            .lock()
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .filter_map(|(k, _)| k[prefix.len()..].split_once('/').map(|(d, _)| d.to_string()))
            .collect();
        Ok(dirs.into_iter().collect())
    }

    fn delete(&self, path: &str) -> Result<()> {
        self.objects.lock().remove(path);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn contract() {
        super::super::contract::check(&super::InMemoryCheckpointStore::new());
    }
}

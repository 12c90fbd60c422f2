//! Content-addressed storage of job binaries: a file per sha256, executable, written
//! atomically (temporary file, then rename), so a name always holds exactly its content.

use crate::{Error, Result};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The sha256 of `data`, lowercase hex.
#[cfg(test)]
pub(crate) fn sha256_hex(data: &[u8]) -> String {
    let digest = Sha256::digest(data);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// True when `s` looks like a sha256 in hex (64 lowercase hex digits).
pub(crate) fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A directory of binaries named by their sha256.
#[derive(Debug, Clone)]
pub(crate) struct BlobStore {
    dir: PathBuf,
}

impl BlobStore {
    /// Opens (creates) `dir`.
    pub(crate) fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        Ok(BlobStore { dir: dir.to_path_buf() })
    }

    /// Where blob `sha` lives (it may not exist).
    pub(crate) fn path(&self, sha: &str) -> PathBuf {
        self.dir.join(sha)
    }

    /// True when blob `sha` is stored.
    pub(crate) fn contains(&self, sha: &str) -> bool {
        is_sha256(sha) && self.path(sha).is_file()
    }

    /// Stores `data` under `sha`, checking that `sha` is its hash.
    #[cfg(test)]
    pub(crate) fn put(&self, sha: &str, data: &[u8]) -> Result<PathBuf> {
        let mut w = self.writer(sha)?;
        w.write(data)?;
        w.finish()
    }

    /// A writer of blob `sha` that streams to a temporary file; [`BlobWriter::finish`]
    /// checks the hash and publishes it.
    pub(crate) fn writer(&self, sha: &str) -> Result<BlobWriter> {
        if !is_sha256(sha) {
            return Err(Error::Cluster(format!("`{sha}` is not a sha256 (64 lowercase hex digits)")));
        }
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = self.dir.join(format!(".{sha}.{}.{n}.tmp", std::process::id()));
        let file =
            std::fs::File::create(&tmp).map_err(|e| Error::io(format!("creating {}", tmp.display()), e))?;
        Ok(BlobWriter {
            file: std::io::BufWriter::with_capacity(1 << 20, file),
            hasher: Sha256::new(),
            sha: sha.to_string(),
            tmp,
            path: self.path(sha),
            written: 0,
            head: Vec::with_capacity(4),
        })
    }
}

/// A blob being written (see [`BlobStore::writer`]); dropped unfinished, it leaves nothing.
#[derive(Debug)]
pub(crate) struct BlobWriter {
    file: std::io::BufWriter<std::fs::File>,
    hasher: Sha256,
    sha: String,
    tmp: PathBuf,
    path: PathBuf,
    written: u64,
    /// The first bytes, until they show an ELF executable.
    head: Vec<u8>,
}

/// The largest job binary accepted (a debug build with line tables and RocksDB is ~500 MB).
pub(crate) const MAX_BINARY_BYTES: u64 = 2 << 30;

/// What every job binary starts with: an ELF executable's magic number.
const ELF_MAGIC: &[u8; 4] = b"\x7fELF";

impl BlobWriter {
    /// Appends `chunk`; refuses an upload that is not an ELF executable (from its first
    /// bytes) or grows past [`MAX_BINARY_BYTES`], before storing more of it.
    pub(crate) fn write(&mut self, chunk: &[u8]) -> Result<()> {
        if self.head.len() < ELF_MAGIC.len() {
            let take = (ELF_MAGIC.len() - self.head.len()).min(chunk.len());
            self.head.extend_from_slice(&chunk[..take]);
            if !ELF_MAGIC.starts_with(&self.head) {
                return Err(Error::Cluster(
                    "the upload is not an executable (no ELF header): a job binary is a program built with \
                     Caudal (cargo build --release --bin JOB); nothing was stored"
                        .into(),
                ));
            }
        }
        self.written += chunk.len() as u64;
        if self.written > MAX_BINARY_BYTES {
            return Err(Error::Cluster(format!(
                "the upload is larger than {} MiB, the most a job binary may be; nothing was stored",
                MAX_BINARY_BYTES >> 20
            )));
        }
        self.hasher.update(chunk);
        self.file.write_all(chunk).map_err(|e| Error::io(format!("writing {}", self.tmp.display()), e))
    }

    /// Checks the hash and publishes the blob under its name.
    pub(crate) fn finish(mut self) -> Result<PathBuf> {
        if self.head.len() < ELF_MAGIC.len() {
            return Err(Error::Cluster(
                "the upload is too short to be a job binary; nothing was stored".into(),
            ));
        }
        let actual: String =
            std::mem::take(&mut self.hasher).finalize().iter().map(|b| format!("{b:02x}")).collect();
        if actual != self.sha {
            return Err(Error::Cluster(format!(
                "the upload's sha256 is {actual}, not {}: the binary was changed or truncated in transit",
                self.sha
            )));
        }
        let publish = |w: &mut Self| -> std::io::Result<()> {
            w.file.flush()?;
            w.file.get_ref().sync_all()?;
            std::fs::set_permissions(&w.tmp, std::fs::Permissions::from_mode(0o755))?;
            std::fs::rename(&w.tmp, &w.path)
        };
        publish(&mut self).map_err(|e| Error::io(format!("storing binary {}", self.path.display()), e))?;
        Ok(self.path.clone())
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.tmp); // gone already when published
    }
}

/// The sha256 of the file at `path`, read in chunks.
pub(crate) fn sha256_of_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = std::io::Read::read(&mut f, &mut buf)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_are_named_by_their_hash_and_a_wrong_hash_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        assert_eq!(sha256_hex(b"hello"), "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824");
        let binary = b"\x7fELF and the rest of a program";
        let sha = sha256_hex(binary);
        let p = store.put(&sha, binary).unwrap();
        assert_eq!(std::fs::read(p).unwrap(), binary);
        assert!(store.contains(&sha));
        let err = store.put(&sha256_hex(b"other"), binary).unwrap_err();
        assert!(err.to_string().contains("changed or truncated"), "{err}");
        assert!(store.put("../etc", b"x").is_err());
    }

    #[test]
    fn what_is_not_an_executable_is_refused_from_its_first_bytes_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        let text = b"#!/bin/sh\nrm -rf /\n";
        let err = store.put(&sha256_hex(text), text).unwrap_err();
        assert!(err.to_string().contains("not an executable"), "{err}");
        // The header split over chunks is still recognised, and a prefix of it is too short.
        let mut w = store.writer(&sha256_hex(b"\x7fELF")).unwrap();
        w.write(b"\x7fE").unwrap();
        w.write(b"LF").unwrap();
        w.finish().unwrap();
        let err = store.put(&sha256_hex(b"\x7fE"), b"\x7fE").unwrap_err();
        assert!(err.to_string().contains("too short"), "{err}");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(left.len(), 1, "only the accepted blob is stored: {left:?}");
    }
}

//! The cluster secret: every control and shuffle connection between the job manager, task
//! managers and executors proves it, both ways, before a byte of the protocol flows.
//!
//! **In:** a secret file (`--secret-file`, or `CAUDAL_CLUSTER_SECRET_FILE` for executors,
//! which the task manager sets) shared by every process of the cluster. **Out:** a
//! connection whose peer proved the secret, or an error naming what failed.
//!
//! Handshake (mutual challenge–response, HMAC-SHA256; the secret never crosses the wire):
//!
//! ```text
//! server → client   "CAUDALA1" ‖ nonce_s (32 random bytes)
//! client → server   nonce_c ‖ HMAC(secret, "client" ‖ nonce_s ‖ nonce_c)
//! server → client   HMAC(secret, "server" ‖ nonce_c ‖ nonce_s)      (only if the client's was right)
//! ```
//!
//! A peer with another secret, or none, is refused by the side that accepted it: the
//! connection is closed and logged; nothing else changes (the job keeps running). Without a
//! secret both sides skip the handshake — which is why a job manager refuses to listen off
//! loopback without one. The same secret is the bearer token of the job manager's REST API
//! when it listens off loopback (see [`ClusterSecret::bearer`]). The secret authenticates;
//! encryption is TLS's ([`super::tls`]), inside which this handshake then runs.

use crate::{Error, Result};
use sha2::{Digest, Sha256};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The environment variable that hands the secret file to executors.
pub const SECRET_FILE_ENV: &str = "CAUDAL_CLUSTER_SECRET_FILE";
const MAGIC: &[u8; 8] = b"CAUDALA1";
/// The cookie of a signed-in web UI.
pub(crate) const UI_SESSION_COOKIE: &str = "caudal_session";

/// The shared secret of a cluster (its bytes are never printed).
#[derive(Clone)]
pub struct ClusterSecret {
    bytes: Arc<[u8]>,
    path: PathBuf,
}

impl PartialEq for ClusterSecret {
    fn eq(&self, other: &Self) -> bool {
        equal(&self.bytes, &other.bytes)
    }
}

impl Eq for ClusterSecret {}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterSecret({})", self.path.display())
    }
}

impl ClusterSecret {
    /// The secret in `path`: its contents without surrounding whitespace, at least 16 bytes.
    pub fn from_file(path: &Path) -> Result<Self> {
        let raw = std::fs::read(path)
            .map_err(|e| Error::config("--secret-file", format!("cannot read {}: {e}", path.display())))?;
        let text = String::from_utf8_lossy(&raw);
        let secret = text.trim();
        if secret.len() < 16 {
            return Err(Error::config(
                "--secret-file",
                format!(
                    "{} holds {} bytes; a cluster secret needs at least 16 (e.g. `openssl rand -hex 32`)",
                    path.display(),
                    secret.len()
                ),
            ));
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            if let Ok(meta) = std::fs::metadata(path) {
                if meta.permissions().mode() & 0o077 != 0 {
                    tracing::warn!(
                        "caudal: the cluster secret {} can be read by other users (chmod 600 it)",
                        path.display()
                    );
                }
            }
        }
        Ok(ClusterSecret { bytes: secret.as_bytes().into(), path: path.to_path_buf() })
    }

    /// A secret held in memory only (tests).
    #[cfg(test)]
    pub(crate) fn from_bytes(bytes: &[u8]) -> Self {
        ClusterSecret { bytes: bytes.into(), path: PathBuf::from("(memory)") }
    }

    /// The secret named by [`SECRET_FILE_ENV`], if set.
    pub fn from_env() -> Result<Option<Self>> {
        match std::env::var_os(SECRET_FILE_ENV).filter(|v| !v.is_empty()) {
            Some(p) => Self::from_file(Path::new(&p)).map(Some),
            None => Ok(None),
        }
    }

    /// The file it was read from (handed to executors through [`SECRET_FILE_ENV`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The REST API's bearer token: `Authorization: Bearer <this>`.
    pub fn bearer(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    /// Whether `header` (an `Authorization` value) carries this secret, compared in constant time.
    pub fn accepts_bearer(&self, header: &str) -> bool {
        header.strip_prefix("Bearer ").is_some_and(|t| equal(t.trim().as_bytes(), &self.bytes))
    }

    /// The web UI's session cookie value for a session that ends at `expires` (seconds since
    /// the Unix epoch): `<expires>.<HMAC of it under the secret>`, so the server keeps no
    /// sessions, none outlives its end, and a new secret ends every session.
    pub(crate) fn ui_session(&self, expires: u64) -> String {
        let mac: String = self
            .mac(&[b"caudal web ui session v2", expires.to_string().as_bytes()])
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("{expires}.{mac}")
    }

    /// Whether a `Cookie` header carries a UI session of this secret that has not ended at
    /// `now` (seconds since the Unix epoch), compared in constant time.
    pub(crate) fn accepts_ui_session(&self, cookies: &str, now: u64) -> bool {
        cookies.split(';').filter_map(|c| c.trim().strip_prefix(UI_SESSION_COOKIE)?.strip_prefix('=')).any(
            |v| {
                let Some(expires) = v.split_once('.').and_then(|(e, _)| e.parse::<u64>().ok()) else {
                    return false;
                };
                expires > now && equal(v.as_bytes(), self.ui_session(expires).as_bytes())
            },
        )
    }

    fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        hmac_sha256(&self.bytes, parts)
    }
}

/// The accepting side's half: proves `secret` to the peer and checks the peer's proof
/// (the caller bounds how long it waits: [`super::transport`]).
pub(crate) fn accept<S: Read + Write>(stream: &mut S, secret: &ClusterSecret) -> io::Result<()> {
    let mine = nonce()?;
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&mine);
    stream.write_all(&hello)?;
    let mut answer = [0u8; 64];
    stream.read_exact(&mut answer).map_err(|e| refused(&format!("no proof of the cluster secret ({e})")))?;
    let (theirs, proof) = answer.split_at(32);
    if !equal(proof, &secret.mac(&[b"client", &mine, theirs])) {
        return Err(refused("the peer does not know the cluster secret"));
    }
    stream.write_all(&secret.mac(&[b"server", theirs, &mine]))?;
    stream.flush()
}

/// The connecting side's half.
pub(crate) fn connect<S: Read + Write>(stream: &mut S, secret: &ClusterSecret) -> io::Result<()> {
    let mut hello = [0u8; 40];
    stream.read_exact(&mut hello).map_err(|e| {
        refused(&format!(
            "no cluster-secret challenge from the peer (is it started without --secret-file?): {e}"
        ))
    })?;
    if &hello[..8] != MAGIC {
        return Err(refused("the peer does not speak the cluster handshake"));
    }
    let theirs = &hello[8..];
    let mine = nonce()?;
    let mut answer = mine.to_vec();
    answer.extend_from_slice(&secret.mac(&[b"client", theirs, &mine]));
    stream.write_all(&answer)?;
    stream.flush()?;
    let mut proof = [0u8; 32];
    stream.read_exact(&mut proof).map_err(|_| {
        refused("the peer refused this process's cluster secret (a different --secret-file?)")
    })?;
    if !equal(&proof, &secret.mac(&[b"server", &mine, theirs])) {
        return Err(refused("the peer does not know the cluster secret"));
    }
    Ok(())
}

fn refused(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, why.to_string())
}

/// 32 random bytes from the kernel's generator.
fn nonce() -> io::Result<[u8; 32]> {
    let mut n = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut n)?;
    Ok(n)
}

/// Equal in time independent of where they differ.
fn equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// HMAC-SHA256 (RFC 2104) of the concatenated `parts`.
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    for p in parts {
        inner.update(p);
    }
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    fn secret(s: &str) -> ClusterSecret {
        ClusterSecret { bytes: s.as_bytes().into(), path: PathBuf::from("test") }
    }

    #[test]
    fn hmac_matches_rfc_4231_test_case_2() {
        let mac = hmac_sha256(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }

    fn handshake(server: &str, client: &str) -> (io::Result<()>, io::Result<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let server = secret(server);
        let accepting = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap_or_else(|e| panic!("{e}"));
            let r = accept(&mut s, &server);
            if r.is_err() {
                drop(s);
            }
            r
        });
        let mut c = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
        let r = connect(&mut c, &secret(client));
        drop(c);
        (accepting.join().unwrap_or_else(|_| panic!("server panicked")), r)
    }

    #[test]
    fn the_same_secret_passes_and_another_is_refused_on_both_sides() {
        let (s, c) = handshake("correct horse battery staple", "correct horse battery staple");
        assert!(s.is_ok() && c.is_ok(), "{s:?} {c:?}");
        let (s, c) = handshake("correct horse battery staple", "wrong horse battery staple!");
        assert_eq!(s.unwrap_err().kind(), io::ErrorKind::PermissionDenied);
        assert!(c.unwrap_err().to_string().contains("refused"));
    }

    #[test]
    fn a_short_secret_file_is_refused_and_the_bearer_is_checked() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let short = dir.path().join("short");
        std::fs::write(&short, "abc\n").unwrap_or_else(|e| panic!("{e}"));
        assert!(ClusterSecret::from_file(&short).unwrap_err().to_string().contains("at least 16"));
        let good = dir.path().join("good");
        std::fs::write(&good, "0123456789abcdef0123\n").unwrap_or_else(|e| panic!("{e}"));
        let s = ClusterSecret::from_file(&good).unwrap_or_else(|e| panic!("{e}"));
        assert!(s.accepts_bearer("Bearer 0123456789abcdef0123"));
        assert!(!s.accepts_bearer("Bearer 0123456789abcdef0124"));
        assert!(!s.accepts_bearer("Basic 0123456789abcdef0123"));
        assert!(!format!("{s:?}").contains("0123"), "the secret is not printed");
    }
}

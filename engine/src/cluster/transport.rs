//! Connections between the processes of a cluster: a TCP stream made trustworthy by the
//! cluster's [`ClusterTrust`] — mutual TLS, the cluster secret, both or neither — and split
//! into a reading half and a writing half that two threads use at once.
//!
//! **In:** a connected `TcpStream`. **Out:** a [`Conn`] whose halves carry the protocol's
//! bytes (encrypted under TLS), or an error saying why the peer was refused.
//!
//! On a new connection the TLS handshake comes first (both sides show a certificate of the
//! cluster's CA), then the secret's challenge–response inside it, then the protocol.
//!
//! Under TLS the halves share one rustls connection behind a lock that is never held across
//! a blocking socket call: the reader blocks on its own clone of the socket, then feeds
//! what arrived to rustls; a writer encrypts under the lock and writes the ciphertext under
//! a second lock (taken first) that keeps records in order on the wire.

use super::auth::ClusterSecret;
use super::tls::ClusterTls;
use parking_lot::Mutex;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::Duration;

/// How long a peer has to complete the handshakes.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What every control and shuffle connection of a cluster proves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterTrust {
    /// The cluster secret (`--secret-file`): a mutual HMAC challenge–response.
    pub secret: Option<ClusterSecret>,
    /// Mutual TLS (`--tls-cert`, `--tls-key`, `--tls-ca`): encryption and certificates.
    pub tls: Option<ClusterTls>,
}

impl ClusterTrust {
    /// What the task manager handed an executor through its environment.
    pub(crate) fn from_env() -> crate::Result<Self> {
        Ok(ClusterTrust { secret: ClusterSecret::from_env()?, tls: ClusterTls::from_env()? })
    }

    /// The environment that gives an executor the same trust.
    pub(crate) fn executor_env(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if let Some(secret) = &self.secret {
            env.push((super::auth::SECRET_FILE_ENV.to_string(), secret.path().display().to_string()));
        }
        if let Some(tls) = &self.tls {
            env.extend(tls.env());
        }
        env
    }

    /// The accepting side of a new connection.
    pub(crate) fn accept(&self, stream: TcpStream) -> io::Result<Conn> {
        self.secure(stream, Side::Server)
    }

    /// The connecting side of a new connection.
    pub(crate) fn connect(&self, stream: TcpStream) -> io::Result<Conn> {
        self.secure(stream, Side::Client)
    }

    fn secure(&self, mut stream: TcpStream, side: Side) -> io::Result<Conn> {
        stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        let mut conn = match &self.tls {
            None => Conn::plain(stream)?,
            Some(tls) => {
                let mut session: rustls::Connection = match side {
                    Side::Server => tls.server()?.into(),
                    Side::Client => tls.client()?.into(),
                };
                while session.is_handshaking() {
                    session.complete_io(&mut stream).map_err(|e| refused_tls(side, e))?;
                }
                while session.wants_write() {
                    session.write_tls(&mut stream)?;
                }
                Conn::tls(stream, session)?
            }
        };
        if let Some(secret) = &self.secret {
            let mut both = Both(&mut conn.reader, &mut conn.writer);
            match side {
                Side::Server => super::auth::accept(&mut both, secret)?,
                Side::Client => super::auth::connect(&mut both, secret)?,
            }
        }
        conn.socket.set_read_timeout(None)?;
        Ok(conn)
    }
}

#[derive(Clone, Copy)]
enum Side {
    Server,
    Client,
}

fn refused_tls(side: Side, e: io::Error) -> io::Error {
    let who = match side {
        Side::Server => "the peer's",
        Side::Client => "this process's or the peer's",
    };
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("TLS handshake failed ({e}): {who} certificate is not from the cluster's CA, or the peer does not speak TLS"),
    )
}

/// An established connection: its halves, and a handle that closes it.
pub(crate) struct Conn {
    pub(crate) reader: Box<dyn Read + Send>,
    pub(crate) writer: Box<dyn Write + Send>,
    pub(crate) closer: Closer,
    socket: TcpStream,
}

impl Conn {
    fn plain(stream: TcpStream) -> io::Result<Self> {
        let (reader, writer) = (stream.try_clone()?, stream.try_clone()?);
        let closer = Closer { socket: Arc::new(stream.try_clone()?), tls: None };
        Ok(Conn { reader: Box::new(reader), writer: Box::new(writer), closer, socket: stream })
    }

    fn tls(stream: TcpStream, mut session: rustls::Connection) -> io::Result<Self> {
        // A write is encrypted whole and its records sent at once ([`Shared::with_wire`]), so
        // rustls need not hold back plaintext: what it buffers is one write call's worth.
        session.set_buffer_limit(None);
        let shared = Arc::new(Shared { session: Mutex::new(session), wire: Mutex::new(stream.try_clone()?) });
        let reader = TlsReader {
            shared: shared.clone(),
            socket: stream.try_clone()?,
            raw: vec![0; 16 * 1024],
            pending: 0..0,
        };
        let writer = TlsWriter { shared: shared.clone() };
        let closer = Closer { socket: Arc::new(stream.try_clone()?), tls: Some(shared) };
        Ok(Conn { reader: Box::new(reader), writer: Box::new(writer), closer, socket: stream })
    }

    /// The underlying socket (addresses, options).
    pub(crate) fn socket(&self) -> &TcpStream {
        &self.socket
    }
}

/// Reads and writes through two borrowed halves (the secret's handshake).
struct Both<'a>(&'a mut Box<dyn Read + Send>, &'a mut Box<dyn Write + Send>);

impl Read for Both<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Both<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.1.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.1.flush()
    }
}

/// Ends a connection from any thread.
#[derive(Clone)]
pub(crate) struct Closer {
    socket: Arc<TcpStream>,
    tls: Option<Arc<Shared>>,
}

impl std::fmt::Debug for Closer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Closer({:?}, tls: {})", self.socket.peer_addr().ok(), self.tls.is_some())
    }
}

impl Closer {
    /// Ends our direction (the peer reads an end of stream; TLS says so with close_notify);
    /// the peer's direction stays open.
    pub(crate) fn shutdown_write(&self) {
        if let Some(shared) = &self.tls {
            let _ = shared.with_wire(|s| {
                s.send_close_notify();
                Ok(())
            });
        }
        let _ = self.socket.shutdown(Shutdown::Write);
    }

    /// Closes both directions: the peer's reads end, and so do ours.
    pub(crate) fn close(&self) {
        let _ = self.socket.shutdown(Shutdown::Both);
    }

    /// The underlying socket (addresses, options).
    pub(crate) fn socket(&self) -> &TcpStream {
        &self.socket
    }

    /// The peer's address, for messages.
    pub(crate) fn peer(&self) -> String {
        self.socket.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into())
    }
}

/// One TLS session shared by a connection's halves.
struct Shared {
    session: Mutex<rustls::Connection>,
    /// The socket's writing side; held while ciphertext goes out (taken before `session`).
    wire: Mutex<TcpStream>,
}

impl Shared {
    /// Runs `f` on the session, then sends whatever TLS records it produced.
    fn with_wire<T>(&self, f: impl FnOnce(&mut rustls::Connection) -> io::Result<T>) -> io::Result<T> {
        let mut wire = self.wire.lock();
        let mut out = Vec::new();
        let value = {
            let mut session = self.session.lock();
            let value = f(&mut session)?;
            while session.wants_write() {
                session.write_tls(&mut out)?;
            }
            value
        };
        wire.write_all(&out)?;
        Ok(value)
    }
}

struct TlsWriter {
    shared: Arc<Shared>,
}

impl Write for TlsWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.shared.with_wire(|s| {
            s.writer().write_all(buf)?;
            Ok(buf.len())
        })
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(()) // every write leaves as TLS records at once
    }
}

struct TlsReader {
    shared: Arc<Shared>,
    socket: TcpStream,
    /// Ciphertext read from the socket; `pending` is what rustls has not taken yet.
    raw: Vec<u8>,
    pending: std::ops::Range<usize>,
}

impl Read for TlsReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            let fed = !self.pending.is_empty();
            let answer = {
                let mut session = self.shared.session.lock();
                // Plaintext first: rustls refuses more ciphertext while its plaintext is full.
                match session.reader().read(buf) {
                    Ok(n) => return Ok(n), // 0: the peer's close_notify
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                if self.pending.is_empty() {
                    false
                } else {
                    let mut rest = &self.raw[self.pending.clone()];
                    let before = rest.len();
                    session.read_tls(&mut rest)?;
                    self.pending.start += before - rest.len();
                    session
                        .process_new_packets()
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    session.wants_write()
                }
            };
            if answer {
                // A record to answer (a key update): send it without holding the session.
                self.shared.with_wire(|_| Ok(()))?;
            }
            if fed {
                continue; // what was fed may have made plaintext: read that first
            }
            {
                let n = self.socket.read(&mut self.raw)?;
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer closed the connection without a TLS close_notify",
                    ));
                }
                self.pending = 0..n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// `caudal certs`' CA and certificates, in a temporary directory.
    fn identities(dir: &std::path::Path, ca_name: &str, names: &[&str]) -> Vec<ClusterTls> {
        let made = super::super::certs::generate(&dir.join(ca_name), names, &[]).unwrap();
        made.into_iter().map(|files| ClusterTls::from_files(files).unwrap()).collect()
    }

    fn pair(server: ClusterTrust, client: ClusterTrust) -> (io::Result<Conn>, io::Result<Conn>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let accepting = std::thread::spawn(move || server.accept(listener.accept().unwrap().0));
        let mut connected = client.connect(TcpStream::connect(addr).unwrap());
        // Say something, as a task manager's hello would: a server waiting for TLS sees it at once.
        if let Ok(c) = connected.as_mut() {
            let _ = c.writer.write_all(b"hello\n");
        }
        (accepting.join().unwrap(), connected)
    }

    #[test]
    fn tls_halves_carry_both_directions_at_once_and_end_with_close_notify() {
        let dir = tempfile::tempdir().unwrap();
        let ids = identities(dir.path(), "ca", &["a", "b"]);
        let secret = Some(ClusterSecret::from_bytes(b"a transport test's secret"));
        let a = ClusterTrust { secret: secret.clone(), tls: Some(ids[0].clone()) };
        let b = ClusterTrust { secret, tls: Some(ids[1].clone()) };
        let (server, client) = pair(a, b);
        let (mut server, mut client) = (server.unwrap(), client.unwrap());
        // 4 MiB each way, written while the other side writes too: no deadlock, no loss.
        let payload: Vec<u8> = (0..4u32 << 20).map(|i| (i * 7 + i / 251) as u8).collect();
        let expected = payload.clone();
        let mut server_writer = std::mem::replace(&mut server.writer, Box::new(io::sink()));
        let (p, closer) = (payload.clone(), server.closer.clone());
        let writing = std::thread::spawn(move || {
            for chunk in p.chunks(10_000) {
                server_writer.write_all(chunk).unwrap();
            }
            closer.shutdown_write();
        });
        let mut client_writer = std::mem::replace(&mut client.writer, Box::new(io::sink()));
        let p = payload.clone();
        let echo = std::thread::spawn(move || {
            client_writer.write_all(&p).unwrap();
        });
        let mut got = Vec::new();
        client.reader.read_to_end(&mut got).unwrap();
        assert!(got == expected, "the client read {} bytes, not the 4 MiB sent", got.len());
        let mut hello = [0u8; 6];
        server.reader.read_exact(&mut hello).unwrap();
        assert_eq!(&hello, b"hello\n", "what `pair` says first");
        let mut back = vec![0u8; payload.len()];
        server.reader.read_exact(&mut back).unwrap();
        assert!(back == expected, "the server read other bytes than the client sent");
        writing.join().unwrap();
        echo.join().unwrap();
    }

    #[test]
    fn a_certificate_from_another_ca_or_no_tls_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ours = identities(dir.path(), "ca", &["jobmanager", "tm"]);
        let theirs = identities(dir.path(), "rogue-ca", &["intruder"]);
        let server = || ClusterTrust { secret: None, tls: Some(ours[0].clone()) };
        let (s, _c) = pair(server(), ClusterTrust { secret: None, tls: Some(theirs[0].clone()) });
        let e = s.err().expect("a rogue certificate was accepted");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        let (s, _c) = pair(server(), ClusterTrust::default());
        assert!(s.is_err(), "a plain TCP peer was accepted by a TLS server");
        // And a client refuses a server whose certificate another CA signed.
        let (_s, c) = pair(
            ClusterTrust { secret: None, tls: Some(theirs[0].clone()) },
            ClusterTrust { secret: None, tls: Some(ours[1].clone()) },
        );
        assert!(c.is_err(), "the client trusted a server of another CA");
        let (s, c) = pair(server(), ClusterTrust { secret: None, tls: Some(ours[1].clone()) });
        assert!(s.is_ok() && c.is_ok(), "the cluster's own certificates: {:?} {:?}", s.err(), c.err());
    }
}

//! A TCP link the test can cut: a forwarder on a loopback port of its own in front of a
//! real server (the S3 server, say). Cut, it resets every open connection and every new
//! one, as a network partition or a server that went away would; restored, it forwards
//! again. The server keeps its data throughout (an in-memory server stopped and started
//! again would not). It can also lose the answers to chosen requests: the request reaches the
//! server, and the connection closes as the answer starts — a commit whose fate the client
//! cannot know. Or it can hold a chosen request back: its client sees no answer, and the
//! request reaches the server only when the test releases it — after its client was
//! killed, say (a commit a dead process had in flight, landing late).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct FaultyLink {
    port: u16,
    up: Arc<AtomicBool>,
    /// Bumped by every cut: connections of an older generation close.
    generation: Arc<AtomicU64>,
    loss: Arc<Loss>,
    hold: Arc<Hold>,
}

/// The request the link is to hold back: the first that starts with `prefix`.
#[derive(Default)]
struct Hold {
    prefix: Mutex<Vec<u8>>,
    /// Its bytes, once one is held.
    bytes: Mutex<Vec<u8>>,
    held: AtomicBool,
    released: AtomicBool,
    answered: AtomicBool,
}

impl Hold {
    /// Whether the request starting `chunk` is the one to hold (then it is taken).
    fn takes(&self, chunk: &[u8]) -> bool {
        let prefix = self.prefix.lock().unwrap();
        !prefix.is_empty() && chunk.starts_with(&prefix) && !self.held.swap(true, Ordering::SeqCst)
    }

    /// After the held request's client is gone (or the link was cut): waits for the
    /// release, sends the request to `server` and waits until its answer began.
    fn deliver(&self, server: &mut TcpStream) {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while !self.released.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if server.write_all(&self.bytes.lock().unwrap()).is_err() {
            return;
        }
        // The answer is read (and noted) by the connection's other pump.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !self.answered.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// What the link does with a chunk a client sent.
enum Fate {
    Forward,
    /// Kept back (a held request): not sent, the connection stays.
    Keep,
    /// Not sent; both ends close.
    Refuse,
}

/// The answers the link is to lose: to the next `left` requests that start with `prefix`.
#[derive(Default)]
struct Loss {
    prefix: Mutex<Vec<u8>>,
    left: AtomicU32,
    lost: AtomicU32,
}

impl Loss {
    /// Whether the request starting `chunk` is one whose answer is to be lost (counted).
    fn takes(&self, chunk: &[u8]) -> bool {
        let prefix = self.prefix.lock().unwrap();
        !prefix.is_empty()
            && chunk.starts_with(&prefix)
            && self.left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
    }
}

impl FaultyLink {
    /// Forwards a new loopback port to `target` (`host:port`).
    pub fn to(target: &str) -> FaultyLink {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (up, generation) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicU64::new(0)));
        let loss = Arc::new(Loss::default());
        let hold = Arc::new(Hold::default());
        let (u, g, l, h, target) =
            (up.clone(), generation.clone(), loss.clone(), hold.clone(), target.to_string());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if !u.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&target) else { continue };
                let born = g.load(Ordering::SeqCst);
                // Set by a request whose answer is to be lost, cleared by the loss.
                let losing = Arc::new(AtomicBool::new(false));
                // Set when this connection carries the held request.
                let holding = Arc::new(AtomicBool::new(false));
                let (from, to, g2, l2, h2, losing2, holding2) = (
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    g.clone(),
                    l.clone(),
                    h.clone(),
                    losing.clone(),
                    holding.clone(),
                );
                std::thread::spawn(move || {
                    let linger = |server: &mut TcpStream| {
                        if holding2.load(Ordering::SeqCst) {
                            h2.deliver(server);
                        }
                    };
                    let fate = |chunk: &[u8]| {
                        if holding2.load(Ordering::SeqCst) || h2.takes(chunk) {
                            holding2.store(true, Ordering::SeqCst);
                            h2.bytes.lock().unwrap().extend_from_slice(chunk);
                            return Fate::Keep;
                        }
                        if l2.takes(chunk) {
                            losing2.store(true, Ordering::SeqCst);
                        }
                        Fate::Forward
                    };
                    pump(from, to, &g2, born, fate, linger)
                });
                let (from, to, g2, l2, h2) = (
                    server.try_clone().unwrap(),
                    client.try_clone().unwrap(),
                    g.clone(),
                    l.clone(),
                    h.clone(),
                );
                std::thread::spawn(move || {
                    let fate = |_: &[u8]| {
                        if holding.load(Ordering::SeqCst) {
                            h2.answered.store(true, Ordering::SeqCst);
                        }
                        if losing.swap(false, Ordering::SeqCst) {
                            l2.lost.fetch_add(1, Ordering::SeqCst);
                            return Fate::Refuse;
                        }
                        Fate::Forward
                    };
                    pump(from, to, &g2, born, fate, |_| {})
                });
            }
        });
        FaultyLink { port, up, generation, loss, hold }
    }

    /// The first request whose bytes start with `prefix` is held back: not sent until
    /// [`Self::release_held`], even if its client goes away meanwhile.
    pub fn hold_request(&self, prefix: &str) {
        *self.hold.prefix.lock().unwrap() = prefix.as_bytes().to_vec();
    }

    /// The held request's bytes (as text), once one is held.
    pub fn held(&self) -> Option<String> {
        self.hold
            .held
            .load(Ordering::SeqCst)
            .then(|| String::from_utf8_lossy(&self.hold.bytes.lock().unwrap()).to_string())
    }

    /// Sends the held request on, once its client is gone.
    pub fn release_held(&self) {
        self.hold.released.store(true, Ordering::SeqCst);
    }

    /// Whether the server answered the released request.
    pub fn held_answered(&self) -> bool {
        self.hold.answered.load(Ordering::SeqCst)
    }

    /// The answers to the next `count` requests whose bytes start with `prefix` (an HTTP
    /// request line's start, say) are lost: each request reaches the server, and the
    /// connection closes when the server starts answering.
    pub fn lose_answers(&self, prefix: &str, count: u32) {
        *self.loss.prefix.lock().unwrap() = prefix.as_bytes().to_vec();
        self.loss.left.store(count, Ordering::SeqCst);
    }

    /// How many answers were lost so far.
    pub fn answers_lost(&self) -> u32 {
        self.loss.lost.load(Ordering::SeqCst)
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every open connection is reset, new ones are refused until [`Self::restore`].
    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    pub fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for FaultyLink {
    fn drop(&mut self) {
        self.cut();
    }
}

/// Copies `from` to `to` until either end closes, the link is cut or `fate` refuses a chunk
/// (then both ends close, the chunk unsent); `linger` has `to` before it closes.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    generation: &AtomicU64,
    born: u64,
    mut fate: impl FnMut(&[u8]) -> Fate,
    linger: impl FnOnce(&mut TcpStream),
) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = [0u8; 64 * 1024];
    while generation.load(Ordering::SeqCst) == born {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => match fate(&buf[..n]) {
                Fate::Forward if to.write_all(&buf[..n]).is_ok() => {}
                Fate::Keep => {}
                Fate::Forward | Fate::Refuse => break,
            },
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    linger(&mut to);
    let _ = to.shutdown(Shutdown::Both);
}

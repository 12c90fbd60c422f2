//! A TCP link the test can cut: a forwarder on a loopback port of its own in front of a
//! real server (the S3 server, say). Cut, it resets every open connection and every new
//! one, as a network partition or a server that went away would; restored, it forwards
//! again. The server keeps its data throughout (an in-memory server stopped and started
//! again would not). It can also lose the answers to chosen requests: the request reaches the
//! server, and the connection closes as the answer starts — a commit whose fate the client
//! cannot know.
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
        let (u, g, l, target) = (up.clone(), generation.clone(), loss.clone(), target.to_string());
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
                let (from, to, g2, l2, losing2) = (
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    g.clone(),
                    l.clone(),
                    losing.clone(),
                );
                std::thread::spawn(move || {
                    pump(from, to, &g2, born, |chunk| {
                        if l2.takes(chunk) {
                            losing2.store(true, Ordering::SeqCst);
                        }
                        true
                    })
                });
                let (from, to, g2, l2) =
                    (server.try_clone().unwrap(), client.try_clone().unwrap(), g.clone(), l.clone());
                std::thread::spawn(move || {
                    pump(from, to, &g2, born, |_| {
                        if losing.swap(false, Ordering::SeqCst) {
                            l2.lost.fetch_add(1, Ordering::SeqCst);
                            return false;
                        }
                        true
                    })
                });
            }
        });
        FaultyLink { port, up, generation, loss }
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

/// Copies `from` to `to` until either end closes, the link is cut or `forward` refuses a
/// chunk (then both ends close, the chunk unsent).
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    generation: &AtomicU64,
    born: u64,
    mut forward: impl FnMut(&[u8]) -> bool,
) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = [0u8; 64 * 1024];
    while generation.load(Ordering::SeqCst) == born {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if !forward(&buf[..n]) || to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

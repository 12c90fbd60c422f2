//! A TCP link the test can cut: a forwarder on a loopback port of its own in front of a
//! real server (the S3 server, say). Cut, it resets every open connection and every new
//! one, as a network partition or a server that went away would; restored, it forwards
//! again. The server keeps its data throughout (an in-memory server stopped and started
//! again would not).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct FaultyLink {
    port: u16,
    up: Arc<AtomicBool>,
    /// Bumped by every cut: connections of an older generation close.
    generation: Arc<AtomicU64>,
}

impl FaultyLink {
    /// Forwards a new loopback port to `target` (`host:port`).
    pub fn to(target: &str) -> FaultyLink {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (up, generation) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicU64::new(0)));
        let (u, g, target) = (up.clone(), generation.clone(), target.to_string());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if !u.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&target) else { continue };
                let born = g.load(Ordering::SeqCst);
                for (from, to) in [(&client, &server), (&server, &client)] {
                    let (from, to, g) = (from.try_clone().unwrap(), to.try_clone().unwrap(), g.clone());
                    std::thread::spawn(move || pump(from, to, &g, born));
                }
            }
        });
        FaultyLink { port, up, generation }
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

/// Copies `from` to `to` until either end closes or the link is cut.
fn pump(mut from: TcpStream, mut to: TcpStream, generation: &AtomicU64, born: u64) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = [0u8; 64 * 1024];
    while generation.load(Ordering::SeqCst) == born {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
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

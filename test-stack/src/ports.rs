//! Ports for servers a test starts itself (a private Redis, a job's web UI, a cluster's
//! job manager), taken where no other process is handed them.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// Where [`free_port`] looks: below Linux's ephemeral range (32768-60999), which the kernel
/// never hands out on its own.
const PORTS: std::ops::Range<u16> = 20_000..32_000;

static CALLS: AtomicU64 = AtomicU64::new(0);
static SEED: OnceLock<u64> = OnceLock::new();

/// A port free on loopback now, for a server this test starts. Not `bind(0)`: the port it
/// gives is one the kernel hands to the next `bind(0)` or outgoing connection of any
/// process — here another test's job took one between this test's check and its start.
/// A process walks the range from a start of its own in steps prime to its length, so its
/// calls give each port once; processes start apart.
pub fn free_port() -> u16 {
    let seed = *SEED.get_or_init(|| {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        nanos ^ u64::from(std::process::id()).rotate_left(32)
    });
    let span = u64::from(PORTS.end - PORTS.start);
    for _ in 0..span {
        let call = CALLS.fetch_add(1, Ordering::Relaxed);
        let port = PORTS.start + ((seed.wrapping_add(call.wrapping_mul(7_919))) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 in {PORTS:?}")
}

/// A loopback address with a [`free_port`].
pub fn free_addr() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], free_port()))
}

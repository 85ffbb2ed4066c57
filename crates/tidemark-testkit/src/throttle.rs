//! A proxy that makes a bucket on loopback behave as a real one does: as slow per connection (a
//! bucket serves one stream at roughly 80–100 MB/s, where an emulator on loopback is faster
//! than any disk), or breaking connections mid-answer. Used by the benchmarks (`--throttle`)
//! and by the tests of what a slow or broken stream changes.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// A TCP proxy on 127.0.0.1 in front of `endpoint` (`http://host:port`) that sends each
/// connection's answers at most `mib_s` MiB/s (requests pass unthrottled). Its threads live as
/// long as the process.
pub fn throttling_proxy(endpoint: &str, mib_s: f64) -> Result<SocketAddr, String> {
    if mib_s.is_nan() || mib_s <= 0.0 {
        return Err("--throttle must be a positive rate in MiB/s".into());
    }
    shaping_proxy(endpoint, Shape { mib_s: Some(mib_s), ..Shape::default() })
}

/// What a [`shaping_proxy`] does to each connection: to its answers and, with `up_mib_s`, to
/// its requests (which otherwise pass as they are).
#[derive(Clone, Copy, Debug, Default)]
pub struct Shape {
    /// At most this many MiB/s.
    pub mib_s: Option<f64>,
    /// The connection closed once it has sent this many bytes of answers, headers included: a
    /// GET of more than that breaks mid-object, as a bucket's connections sometimes do.
    pub cut_after: Option<u64>,
    /// Requests (an upload's body) at most this many MiB/s, as a slow link to a server.
    pub up_mib_s: Option<f64>,
}

/// A TCP proxy on 127.0.0.1 in front of `endpoint` (`http://host:port`) that shapes each
/// connection's answers as `shape` says. Its threads live as long as the process.
pub fn shaping_proxy(endpoint: &str, shape: Shape) -> Result<SocketAddr, String> {
    let authority = endpoint.split("://").nth(1).unwrap_or(endpoint).trim_end_matches('/');
    let target = authority
        .to_socket_addrs()
        .map_err(|e| format!("--endpoint {endpoint}: {e}"))?
        .next()
        .ok_or_else(|| format!("--endpoint {endpoint}: no address"))?;
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("the proxy: {e}"))?;
    let addr = listener.local_addr().map_err(|e| format!("the proxy: {e}"))?;
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            std::thread::spawn(move || relay(client, target, shape));
        }
    });
    Ok(addr)
}

fn relay(client: TcpStream, target: SocketAddr, shape: Shape) {
    let bytes_per_s = shape.mib_s.map_or(f64::INFINITY, |m| m * 1024.0 * 1024.0);
    let cut_after = shape.cut_after.unwrap_or(u64::MAX);
    let Ok(server) = TcpStream::connect(target) else { return };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (Ok(mut cr), Ok(mut sw)) = (client.try_clone(), server.try_clone()) else { return };
    let up_per_s = shape.up_mib_s.map_or(f64::INFINITY, |m| m * 1024.0 * 1024.0);
    let up = std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        let mut pace = Pace::default();
        loop {
            let n = match cr.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if sw.write_all(&buf[..n]).is_err() {
                break;
            }
            pace.sent(n, up_per_s);
        }
        let _ = sw.shutdown(Shutdown::Write);
    });
    let (mut sr, mut cw) = (server, client);
    let mut buf = vec![0u8; 64 << 10];
    let mut pace = Pace::default();
    let mut sent = 0u64;
    loop {
        let n = match sr.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let n = n.min(usize::try_from(cut_after - sent).unwrap_or(usize::MAX));
        if cw.write_all(&buf[..n]).is_err() {
            break;
        }
        sent += n as u64;
        if sent == cut_after {
            // Both ways at once, as a reset connection: the client sees its answer end early.
            let _ = (cw.shutdown(Shutdown::Both), sr.shutdown(Shutdown::Both));
            break;
        }
        pace.sent(n, bytes_per_s);
    }
    let _ = cw.shutdown(Shutdown::Write);
    let _ = up.join();
}

/// When the next byte of one direction of a connection may go, at a rate.
struct Pace {
    next: Instant,
}

impl Default for Pace {
    fn default() -> Self {
        Pace { next: Instant::now() }
    }
}

impl Pace {
    /// `n` bytes went: waits until the rate allows more.
    fn sent(&mut self, n: usize, bytes_per_s: f64) {
        let now = Instant::now();
        self.next = self.next.max(now) + Duration::from_secs_f64(n as f64 / bytes_per_s);
        // Sleep only once a few milliseconds are owed: a sleep per read would cap the rate at a
        // read per timer tick.
        if self.next > now + Duration::from_millis(5) {
            std::thread::sleep(self.next - now);
        }
    }
}

//! A proxy that makes a bucket on loopback as slow per connection as a real one: a bucket
//! serves one stream at roughly 80–100 MB/s, where an emulator on loopback is faster than any
//! disk. Used by the benchmarks (`--throttle`) and by the tests of what a slow stream changes.

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
    let authority = endpoint.split("://").nth(1).unwrap_or(endpoint).trim_end_matches('/');
    let target = authority
        .to_socket_addrs()
        .map_err(|e| format!("--endpoint {endpoint}: {e}"))?
        .next()
        .ok_or_else(|| format!("--endpoint {endpoint}: no address"))?;
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("the throttling proxy: {e}"))?;
    let addr = listener.local_addr().map_err(|e| format!("the throttling proxy: {e}"))?;
    let bytes_per_s = mib_s * 1024.0 * 1024.0;
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            std::thread::spawn(move || relay(client, target, bytes_per_s));
        }
    });
    Ok(addr)
}

fn relay(client: TcpStream, target: SocketAddr, bytes_per_s: f64) {
    let Ok(server) = TcpStream::connect(target) else { return };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (Ok(mut cr), Ok(mut sw)) = (client.try_clone(), server.try_clone()) else { return };
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut cr, &mut sw);
        let _ = sw.shutdown(Shutdown::Write);
    });
    let (mut sr, mut cw) = (server, client);
    let mut buf = vec![0u8; 64 << 10];
    let mut next = Instant::now();
    loop {
        let n = match sr.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if cw.write_all(&buf[..n]).is_err() {
            break;
        }
        let now = Instant::now();
        next = next.max(now) + Duration::from_secs_f64(n as f64 / bytes_per_s);
        // Sleep only once a few milliseconds are owed: a sleep per read would cap the rate at a
        // read per timer tick.
        if next > now + Duration::from_millis(5) {
            std::thread::sleep(next - now);
        }
    }
    let _ = cw.shutdown(Shutdown::Write);
    let _ = up.join();
}

//! The listener's limits over real TCP connections on loopback.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use tidemark_http::{Limits, serve, tower};

async fn start(limits: Limits) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "hello" }));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(listener, tower(app), limits, None, async move {
        let _ = rx.await;
    }));
    (addr, tx)
}

/// Sends one request and returns the whole answer (the server closes with `Connection: close`).
async fn request(addr: std::net::SocketAddr, host: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test]
async fn idle_clients_cannot_hold_the_listener() {
    let limits = Limits { max_connections: 4, header_timeout: Duration::from_secs(1), ..Limits::default() };
    let (addr, _stop) = start(limits).await;
    // Four clients take every slot and never finish their request heads.
    let mut stalled = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: loc").await.unwrap();
        stalled.push(s);
    }
    // A real client still gets its answer once the header deadline frees the slots.
    let began = Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(10), request(addr, "127.0.0.1")).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("hello"), "{answer}");
    assert!(began.elapsed() >= Duration::from_millis(500), "it waited for a slot: {:?}", began.elapsed());
    // The stalled clients were disconnected (EOF, or a 408 and then EOF).
    for mut s in stalled {
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await.unwrap().ok();
    }
}

#[tokio::test]
async fn silent_and_idle_keep_alive_clients_are_dropped_too() {
    let limits = Limits { max_connections: 2, header_timeout: Duration::from_secs(1), ..Limits::default() };
    let (addr, _stop) = start(limits).await;
    // One connects and says nothing; one is served and then idles on its kept-alive connection.
    let _silent = TcpStream::connect(addr).await.unwrap();
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n").await.unwrap();
    let mut buf = [0u8; 256];
    let n = idle.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    // Both slots are taken; the deadline frees them.
    let answer = tokio::time::timeout(Duration::from_secs(10), request(addr, "127.0.0.1")).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn an_oversized_head_is_refused() {
    let (addr, _stop) = start(Limits { max_head_bytes: 16 * 1024, ..Limits::default() }).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let big = "x".repeat(64 * 1024);
    let _ = s.write_all(format!("GET / HTTP/1.1\r\nHost: localhost\r\nX-Big: {big}\r\n\r\n").as_bytes()).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await.unwrap();
    let out = String::from_utf8_lossy(&out);
    assert!(out.is_empty() || out.starts_with("HTTP/1.1 431"), "{out}");
    // The listener still serves others.
    assert!(request(addr, "localhost").await.starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn a_loopback_listener_serves_loopback_names_only() {
    let (addr, _stop) = start(Limits::default()).await;
    for host in ["127.0.0.1", &addr.to_string(), "localhost", &format!("localhost:{}", addr.port())] {
        let answer = request(addr, host).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{host}: {answer}");
    }
    // DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1.
    for host in ["evil.example", &format!("evil.example:{}", addr.port()), "localhost.evil.example"] {
        let answer = request(addr, host).await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{host}: {answer}");
        assert!(answer.contains("loopback"), "{answer}");
    }
}

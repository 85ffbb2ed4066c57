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
async fn idle_clients_give_way_to_new_ones() {
    let limits = Limits { max_connections: 4, header_timeout: Duration::from_secs(20), ..Limits::default() };
    let (addr, _stop) = start(limits).await;
    // Four clients take every slot and never finish their request heads.
    let mut stalled = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: loc").await.unwrap();
        stalled.push(s);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A real client is answered at once: the oldest stalled one gives way, not after a deadline.
    let began = Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(5), request(addr, "127.0.0.1")).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("hello"), "{answer}");
    assert!(began.elapsed() < Duration::from_secs(2), "answered without waiting: {:?}", began.elapsed());
    let closed = |mut s: TcpStream| async move {
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut rest)).await.is_ok()
    };
    let open = |s: &mut TcpStream| {
        let mut buf = [0u8; 1];
        let read = s.try_read(&mut buf);
        matches!(read, Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock)
    };
    let mut stalled = stalled.into_iter();
    assert!(closed(stalled.next().unwrap()).await, "the oldest gave way");
    let mut rest: Vec<TcpStream> = stalled.collect();
    assert!(rest.iter_mut().all(open), "the others still wait on their deadline");
    // Three newer stalled clients: the first takes the free slot, the next two shed the two
    // oldest, in order.
    let mut newer = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: loc").await.unwrap();
        newer.push(s);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut last = rest.pop().unwrap();
    for s in rest {
        assert!(closed(s).await, "shed oldest first");
    }
    assert!(open(&mut last), "the youngest of the first four is still served");
}

#[tokio::test]
async fn a_request_in_progress_is_never_shed() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "hello" })).route(
        "/slow",
        axum::routing::get(|| async {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            "slow answer"
        }),
    );
    let limits = Limits { max_connections: 2, ..Limits::default() };
    let (_tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(listener, tower(app), limits, None, async move {
        let _ = rx.await;
    }));
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /slow HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Two more clients, one after the other: each takes the second slot from the one before; the
    // slow request keeps its own.
    for _ in 0..2 {
        assert!(request(addr, "localhost").await.starts_with("HTTP/1.1 200"));
    }
    let mut answer = String::new();
    slow.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("slow answer"), "{answer}");
}

#[tokio::test]
async fn silent_and_idle_keep_alive_clients_are_dropped_too() {
    let limits = Limits {
        first_byte_timeout: Duration::from_millis(300),
        header_timeout: Duration::from_secs(2),
        ..Limits::default()
    };
    let (addr, _stop) = start(limits).await;
    // One connects and says nothing; one trickles a head; one is served and then idles on its
    // kept-alive connection.
    let began = Instant::now();
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut trickling = TcpStream::connect(addr).await.unwrap();
    trickling.write_all(b"GET / HT").await.unwrap();
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n").await.unwrap();
    let mut buf = [0u8; 256];
    let n = idle.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    // The silent one goes at the first-byte deadline, the others at the head deadline.
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), silent.read_to_end(&mut rest)).await.unwrap().ok();
    assert!(began.elapsed() < Duration::from_millis(1500), "silent: {:?}", began.elapsed());
    for s in [&mut trickling, &mut idle] {
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await.unwrap().ok();
    }
    assert!(began.elapsed() >= Duration::from_millis(1500), "the head deadline: {:?}", began.elapsed());
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

#[tokio::test]
async fn a_unix_socket_serves_any_host_and_drops_a_silent_client() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "hello" }));
    let limits = Limits { first_byte_timeout: Duration::from_millis(300), ..Limits::default() };
    tokio::spawn(serve(listener, tower(app), limits, None, std::future::pending()));
    // No web page reaches a Unix socket: the loopback listener's Host check does not apply.
    let mut s = tokio::net::UnixStream::connect(&path).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200") && out.ends_with("hello"), "{out}");
    // One that says nothing goes at the first-byte deadline.
    let began = Instant::now();
    let mut silent = tokio::net::UnixStream::connect(&path).await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), silent.read_to_end(&mut rest)).await.unwrap().ok();
    assert!(began.elapsed() < Duration::from_millis(1500), "silent: {:?}", began.elapsed());
}

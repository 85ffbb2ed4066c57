//! HTTPS on a listener: a client trusting the private CA is served; one that does not, or that
//! speaks plain HTTP, is not; a client that never finishes its handshake holds no slot.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use tidemark_http::{Limits, serve, tls, tower};

#[tokio::test]
async fn https_with_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = tidemark_testkit::tls::TestCa::new(dir.path());
    let acceptor = tls::acceptor(&ca.cert, &ca.key).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "hello" }));
    let limits = Limits { max_connections: 1, header_timeout: Duration::from_secs(1), ..Limits::default() };
    tokio::spawn(serve(listener, tower(app), limits, Some(acceptor), std::future::pending()));

    // A client that never starts its handshake: the deadline frees its slot.
    let _stalled = tokio::net::TcpStream::connect(addr).await.unwrap();

    tls::trust(&ca.ca).unwrap();
    assert!(tls::trusts_private_ca());
    let client = tls::client_builder().build().unwrap();
    let body = tokio::time::timeout(Duration::from_secs(10), async {
        client.get(format!("https://127.0.0.1:{}/", addr.port())).send().await.unwrap().text().await.unwrap()
    })
    .await
    .unwrap();
    assert_eq!(body, "hello");
    let by_name = client.get(format!("https://localhost:{}/", addr.port())).send().await.unwrap();
    assert_eq!(by_name.status(), 200);

    // Without the CA: the certificate is not trusted.
    let stranger = reqwest::Client::builder().build().unwrap();
    let err = stranger.get(format!("https://127.0.0.1:{}/", addr.port())).send().await.unwrap_err();
    // Refused by its own verification: the certificate's issuer is not one it trusts.
    assert!(err.is_connect() && format!("{err:?}").contains("UnknownIssuer"), "{err:?}");
    // Plain HTTP to an HTTPS listener gets no HTTP answer.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    assert!(!out.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&out));

    // Files that are not a certificate and key say so.
    let err = tls::acceptor(&ca.key, &ca.key).map(drop).unwrap_err();
    assert!(err.contains("no PEM certificate"), "{err}");
    let err = tls::acceptor(&ca.cert, &dir.path().join("missing.key")).map(drop).unwrap_err();
    assert!(err.contains("missing.key"), "{err}");
}

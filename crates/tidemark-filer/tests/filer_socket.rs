//! The filer's socket (`DATA_DIR/filer.sock`): how it is bound and removed, and how a client
//! beside the filer finds it, checks it reached the same filer, and goes back to TCP when the
//! socket goes away. (Every call of the `Filer` contract over the socket: `filer_api`'s
//! `on_socket` tests.)

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures::StreamExt;
use tidemark_core::{ByteStream, Filer};
use tidemark_filer::{DataDir, HttpFiler, LocalFiler, http};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A filer on TCP and on its socket; stops serving (and removes the socket) when the sender
/// is used or dropped.
async fn filer_beside(
    dir: &std::path::Path,
) -> (String, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let filer: Arc<dyn Filer> = Arc::new(LocalFiler::open(DataDir::open(dir).unwrap()).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let socket = http::Socket::bind(dir).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(async move {
        let stopped = async {
            let _ = stopped.await;
        };
        http::serve_beside(listener, Some(socket), filer, Default::default(), None, stopped).await.unwrap();
    });
    (addr, stop, served)
}

fn body(data: &[u8]) -> ByteStream {
    futures::stream::iter(data.chunks(100_000).map(|c| Ok(Bytes::copy_from_slice(c))).collect::<Vec<_>>()).boxed()
}

async fn read_all(f: &HttpFiler, path: &str) -> Vec<u8> {
    let (_, s) = f.read(path, None).await.unwrap();
    s.map(|c| c.unwrap()).collect::<Vec<Bytes>>().await.concat()
}

/// A TCP proxy to `to` that counts the bytes its clients send: requests that go over the
/// socket do not pass it.
async fn counting_proxy(to: Arc<std::sync::Mutex<String>>) -> (String, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let sent = Arc::new(AtomicU64::new(0));
    let counted = sent.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let to = to.lock().unwrap().clone();
            let counted = counted.clone();
            tokio::spawn(async move {
                let Ok(mut server) = tokio::net::TcpStream::connect(&to).await else { return };
                let (mut cr, mut cw) = client.split();
                let (mut sr, mut sw) = server.split();
                let up = async {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = cr.read(&mut buf).await {
                        if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        counted.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    let _ = sw.shutdown().await;
                };
                let down = async {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                    let _ = cw.shutdown().await;
                };
                tokio::join!(up, down);
            });
        }
    });
    (addr, sent)
}

#[tokio::test]
async fn the_socket_is_the_users_alone_replaces_a_stale_one_and_goes_with_the_filer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(http::SOCKET_FILE);
    // A socket a filer that was killed left behind.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let (addr, stop, served) = filer_beside(dir.path()).await;
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let health = HttpFiler::new(&addr, None).unwrap().health().await.unwrap();
    assert_eq!(health.socket.as_deref(), Some(path.to_str().unwrap()));
    assert_eq!(health.instance.as_ref().map(String::len), Some(32));
    stop.send(()).unwrap();
    served.await.unwrap();
    assert!(!path.exists(), "the socket outlived its filer");

    // Something else at that name is not the filer's to remove.
    std::fs::write(&path, b"a user's file").unwrap();
    let Err(e) = http::Socket::bind(dir.path()) else { panic!("bound over a regular file") };
    assert!(e.to_string().contains("not a socket") && e.to_string().contains("filer.sock"), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), b"a user's file");
}

#[tokio::test]
async fn a_client_beside_the_filer_uses_its_socket_and_tcp_when_the_socket_goes() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, stop, served) = filer_beside(dir.path()).await;
    let to = Arc::new(std::sync::Mutex::new(addr));
    let (proxy, sent) = counting_proxy(to.clone()).await;
    let client = HttpFiler::new(&proxy, None).unwrap().through_socket().await;
    let socket = dir.path().join(http::SOCKET_FILE);
    assert_eq!(client.socket_path(), Some(socket.to_str().unwrap()));

    // Over the socket: nothing passes the TCP proxy.
    let before = sent.load(Ordering::Relaxed);
    let data = vec![7u8; 3 << 20];
    client.write("/f", body(&data), Default::default()).await.unwrap();
    assert_eq!(read_all(&client, "/f").await, data);
    assert_eq!(sent.load(Ordering::Relaxed), before, "a request went over TCP");

    // The filer restarts without its socket (`--no-socket`): the same client reaches it over TCP.
    stop.send(()).unwrap();
    served.await.unwrap();
    let filer: Arc<dyn Filer> = Arc::new(LocalFiler::open(DataDir::open(dir.path()).unwrap()).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    *to.lock().unwrap() = listener.local_addr().unwrap().to_string();
    tokio::spawn(http::serve_with(listener, filer, Default::default(), None, std::future::pending()));
    assert!(!socket.exists());
    assert_eq!(client.stat("/f").await.unwrap().unwrap().size, 3 << 20);
    assert_eq!(read_all(&client, "/f").await, data);
    assert!(sent.load(Ordering::Relaxed) > before, "the requests did not go over TCP");
}

/// A server that answers every request with `health` (a filer's health answer, as another
/// filer would give it), once per connection.
async fn answering(health: serde_json::Value) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let body = health.to_string();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = listener.accept().await {
            let mut buf = vec![0u8; 4096];
            let _ = c.read(&mut buf).await;
            let resp = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = c.write_all(resp.as_bytes()).await;
        }
    });
    addr
}

#[tokio::test]
async fn a_socket_of_another_filer_or_another_user_is_not_used() {
    let (dir, dir2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_addr, _stop, _served) = filer_beside(dir.path()).await;
    let socket = dir.path().join(http::SOCKET_FILE).to_str().unwrap().to_string();
    let health = |socket: &str, instance: &str| {
        serde_json::json!({"status": "ok", "version": "0", "store": "sqlite", "last_seq": 0,
            "socket": socket, "instance": instance})
    };
    // A filer elsewhere whose socket has the same path as this machine's filer's.
    let elsewhere = answering(health(&socket, "another filer")).await;
    let client = HttpFiler::new(&elsewhere, None).unwrap().through_socket().await;
    assert_eq!(client.socket_path(), None);
    // A socket path that is no socket, or none at all.
    let file = dir.path().join("LOCK").to_str().unwrap().to_string();
    for path in [file.as_str(), "/nonexistent/filer.sock"] {
        let other = answering(health(path, "x")).await;
        assert_eq!(HttpFiler::new(&other, None).unwrap().through_socket().await.socket_path(), None, "{path}");
    }
    // The right filer's socket, but another user's.
    let (addr, _stop2, _served2) = filer_beside(dir2.path()).await;
    let socket2 = dir2.path().join(http::SOCKET_FILE);
    std::os::unix::fs::chown(&socket2, Some(65534), None).unwrap();
    assert_eq!(HttpFiler::new(&addr, None).unwrap().through_socket().await.socket_path(), None);
    std::os::unix::fs::chown(&socket2, Some(my_uid()), None).unwrap();
    assert!(HttpFiler::new(&addr, None).unwrap().through_socket().await.socket_path().is_some());
    // A filer from before sockets: no socket, nothing tried.
    let old = answering(serde_json::json!({"status": "ok", "version": "0", "store": "sqlite", "last_seq": 0})).await;
    assert_eq!(HttpFiler::new(&old, None).unwrap().through_socket().await.socket_path(), None);
}

/// This process's user id (the owner of the sockets it binds).
fn my_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    let probe = tempfile::tempfile().unwrap();
    probe.metadata().unwrap().uid()
}

//! How every Tidemark listener (the filer's API, the admin, the S3 gateway) serves HTTP: one
//! accept loop within the process's connection budget (the oldest idle connection gives way
//! when it is spent, see [`slots`]), deadlines for a first byte and for each request head, a
//! cap on a head's size, graceful shutdown, and — on a loopback listener — the `Host` check that
//! keeps web pages out (DNS rebinding: a page from `evil.example` whose name later resolves to
//! 127.0.0.1 can reach a loopback port, but its requests still say `Host: evil.example`).
//!
//! With a [`tls::acceptor`], the listener speaks HTTPS only (the handshake is bounded by the same
//! deadline as a request head).
//!
//! The servers keep their own routing and error formats; this crate sits under them.

mod slots;
pub mod tls;

use std::error::Error as StdError;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

type BoxError = Box<dyn StdError + Send + Sync>;
type Body = UnsyncBoxBody<Bytes, BoxError>;
/// One answer of the guarded service (boxed: the compiler cannot prove the unboxed future
/// `Send` for every lifetime the connection asks about).
type Answer = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Response<Body>, BoxError>> + Send>>;

/// What one listener allows its clients.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections this listener holds at most; beyond that, or beyond the process's budget
    /// (sized from its file-descriptor limit, shared by its listeners), the oldest idle
    /// connection gives way to a new one. Unbounded by default: the process's budget decides.
    pub max_connections: usize,
    /// A client that has sent nothing this long after connecting is disconnected.
    pub first_byte_timeout: Duration,
    /// A client that has not sent a whole request head this long after it began (or after
    /// its previous response) is disconnected: an idle or trickling client cannot hold a slot.
    pub header_timeout: Duration,
    /// The most bytes a request head may have; a larger one is answered 431 and closed.
    pub max_head_bytes: usize,
    /// On shutdown, how long requests in flight may still run.
    pub drain: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: usize::MAX,
            first_byte_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(30),
            max_head_bytes: 64 * 1024,
            drain: Duration::from_secs(10),
        }
    }
}

/// A listener on `addr` whose queue of connections not yet accepted is as long as the system
/// allows (`net.core.somaxconn`), not tokio's 1,024: under a flood of clients reconnecting as
/// fast as they are shed, a shorter queue overflows and a new client's connection waits a
/// second for its SYN to be sent again.
pub fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(65_535)
}

/// Whether two secrets (tokens) are equal, in a time that depends on their length only, not on
/// where they first differ.
/// The base URLs of `addrs`: one address (`host:port` or a URL) or several separated by commas,
/// as clients that fail over between servers take them (`http://` when no scheme is given).
/// `what` names the server kind in errors ("filer", "admin").
pub fn base_urls(addrs: &str, what: &str) -> Result<Vec<String>, String> {
    let mut bases = Vec::new();
    for one in addrs.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        let base = if one.starts_with("http://") || one.starts_with("https://") {
            one.trim_end_matches('/').to_string()
        } else {
            format!("http://{one}")
        };
        let parsed = base.parse::<hyper::Uri>().map_err(|e| format!("bad {what} address {one:?}: {e}"))?;
        if parsed.host().is_none() {
            return Err(format!("bad {what} address {one:?}: no host"));
        }
        bases.push(base);
    }
    if bases.is_empty() {
        return Err(format!("no {what} address in {addrs:?}"));
    }
    Ok(bases)
}

pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether a request naming `host` (its `Host` header or HTTP/2 authority) may be served by a
/// listener on a loopback address: only loopback names (`localhost`, `*.localhost`, 127.0.0.0/8,
/// `::1`) may. A request without one (HTTP/1.0) is no browser's.
pub fn loopback_host_allowed(host: Option<&str>) -> bool {
    let Some(host) = host else { return true };
    let name = match host.strip_prefix('[') {
        // [v6]:port
        Some(rest) => match rest.split_once(']') {
            Some((v6, _)) => v6,
            None => return false,
        },
        None => match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            Some(_) => return false,
            None => host,
        },
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The host a request names, from its URI's authority (HTTP/2, absolute-form) or `Host` header.
fn host_of<B>(req: &Request<B>) -> Option<String> {
    if let Some(a) = req.uri().authority() {
        return Some(a.as_str().to_string());
    }
    req.headers().get(hyper::header::HOST).map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
}

fn refused(host: &str) -> Response<Full<Bytes>> {
    let shown: String = host.chars().take(100).map(|c| if c.is_control() { '?' } else { c }).collect();
    let body = format!(
        "refused: this server listens on loopback and serves requests for localhost or 127.0.0.1 only, \
         not for the host {shown:?} (a web page cannot reach it through DNS rebinding); \
         connect to 127.0.0.1, or listen on another address with a token\n"
    );
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = StatusCode::FORBIDDEN;
    resp.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain"));
    resp
}

type Connection = std::pin::Pin<Box<dyn std::future::Future<Output = hyper::Result<()>> + Send>>;

/// One connection served, boxed outside any async block, where the compiler can still see that
/// it is Send (inside a spawned block it loses the lifetimes it needs).
fn connection<I, S>(
    http: &hyper::server::conn::http1::Builder,
    io: I,
    svc: S,
    watcher: hyper_util::server::graceful::Watcher,
) -> Connection
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<Request<Incoming>, Response = Response<Body>, Error = BoxError, Future = Answer>
        + Send
        + 'static,
{
    Box::pin(watcher.watch(http.serve_connection(TokioIo::new(io), svc)))
}

/// Who sent a request: the client's address, and whether it came over TLS. Every request
/// [`serve`] hands on carries it in its extensions (for rules on the source address or on secure
/// transport, such as S3 bucket policies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub addr: SocketAddr,
    pub tls: bool,
}

/// What [`serve`] accepts connections on: a TCP listener, or a Unix socket (the filer's, for
/// the clients on its machine: mounts, gateways and workers).
pub trait Listener: Send + 'static {
    type Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static;

    /// The next connection, and who made it (a Unix socket's clients show as `127.0.0.1:0`:
    /// they are on this machine).
    fn accept(&self) -> impl std::future::Future<Output = std::io::Result<(Self::Io, SocketAddr)>> + Send;

    /// Where it listens, for the log.
    fn name(&self) -> String;

    /// Whether requests must name a loopback host: a TCP listener on loopback (see the crate's
    /// doc). No web page reaches a Unix socket.
    fn checks_host(&self) -> bool;

    /// Waits until the connection's first byte arrives, without taking it; false if it closed
    /// (or failed) first.
    fn first_byte(io: &Self::Io) -> impl std::future::Future<Output = bool> + Send;
}

impl Listener for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;

    async fn accept(&self) -> std::io::Result<(Self::Io, SocketAddr)> {
        tokio::net::TcpListener::accept(self).await
    }

    fn name(&self) -> String {
        self.local_addr().map(|a| a.to_string()).unwrap_or_else(|e| format!("a TCP listener ({e})"))
    }

    fn checks_host(&self) -> bool {
        self.local_addr().is_ok_and(|a| a.ip().is_loopback())
    }

    async fn first_byte(io: &Self::Io) -> bool {
        // `peek`, not `readable`: an accepted stream is assumed readable until a read finds it
        // is not.
        matches!(io.peek(&mut [0u8; 1]).await, Ok(n) if n > 0)
    }
}

impl Listener for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;

    async fn accept(&self) -> std::io::Result<(Self::Io, SocketAddr)> {
        let (io, _) = tokio::net::UnixListener::accept(self).await?;
        Ok((io, SocketAddr::from(([127, 0, 0, 1], 0))))
    }

    fn name(&self) -> String {
        match self.local_addr().ok().and_then(|a| a.as_pathname().map(|p| p.display().to_string())) {
            Some(path) => path,
            None => "a Unix socket".into(),
        }
    }

    fn checks_host(&self) -> bool {
        false
    }

    async fn first_byte(io: &Self::Io) -> bool {
        // tokio's UnixStream has no `peek`: wait for readiness, then peek with `recv`; a
        // spurious readiness clears itself (WouldBlock) and the wait goes on.
        loop {
            if io.readable().await.is_err() {
                return false;
            }
            let peeked = io.try_io(tokio::io::Interest::READABLE, || {
                rustix::net::recv(io, &mut [0u8; 1], rustix::net::RecvFlags::PEEK)
                    .map(|(n, _)| n)
                    .map_err(std::io::Error::from)
            });
            match peeked {
                Ok(n) => return n > 0,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(_) => return false,
            }
        }
    }
}

/// Serves `service` on `listener` until `shutdown` resolves, then lets requests in flight finish
/// (at most `limits.drain`); HTTPS only when `tls` is given. On a loopback listener, requests for
/// other host names are refused.
pub async fn serve<L, S, B>(
    listener: L,
    service: S,
    limits: Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> std::io::Result<()>
where
    L: Listener,
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let local = listener.name();
    let check_host = listener.checks_host();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_head_bytes.max(8192));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let registry = slots::registry();
    static LISTENERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let listener_id = LISTENERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let listener_open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut shutdown = std::pin::pin!(shutdown);
    'accept: loop {
        let (stream, peer_addr) = tokio::select! {
            r = Listener::accept(&listener) => match r {
                Ok(c) => c,
                Err(e) if out_of_descriptors(&e) => {
                    // The process ran out of descriptors: an idle connection gives way (the
                    // client waiting in the listen queue is accepted next time round).
                    if registry.shed_oldest() {
                        let _ = tokio::time::timeout(Duration::from_millis(100), registry.freed.notified()).await;
                    } else {
                        tracing::warn!(error = %e, addr = %local, "accept failed and every connection is busy");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, addr = %local, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = shutdown.as_mut() => break,
        };
        let slot = loop {
            // Registered before looking, so a connection that ends in between still wakes us.
            let mut freed = std::pin::pin!(registry.freed.notified());
            freed.as_mut().enable();
            match registry.admit(listener_id, &listener_open, limits.max_connections) {
                Ok(slot) => break slot,
                Err(slots::Full::Shed) => {}
                Err(slots::Full::AllBusy) => {
                    tracing::debug!(addr = %local, "every connection has a request in progress; waiting for one to end");
                }
            }
            tokio::select! {
                () = freed => {}
                () = shutdown.as_mut() => break 'accept,
            }
        };
        let svc = service.clone();
        let state = slot.state.clone();
        let peer = Peer { addr: peer_addr, tls: tls.is_some() };
        let guarded = hyper::service::service_fn(move |mut req: Request<Incoming>| -> Answer {
            req.extensions_mut().insert(peer);
            let svc = svc.clone();
            let state = state.clone();
            Box::pin(async move {
                use std::sync::atomic::Ordering;
                if state.compare_exchange(slots::IDLE, slots::BUSY, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                    // Shed just before its head arrived: it is being closed.
                    return Ok(busy_answer());
                }
                let busy = Busy(state);
                if check_host && let Some(host) = host_of(&req).filter(|h| !loopback_host_allowed(Some(h))) {
                    tracing::warn!(host = %host.escape_debug(), "refused a request for another host on a loopback listener");
                    let body = refused(&host).map(|b| b.map_err(|never| match never {}).boxed_unsync());
                    return Ok(body.map(|b| Tracked { body: b, _busy: busy }.boxed_unsync()));
                }
                match svc.call(req).await {
                    // Busy until the answer's last byte is sent (its body dropped).
                    Ok(resp) => Ok(resp
                        .map(|b| Tracked { body: b.map_err(Into::into).boxed_unsync(), _busy: busy }.boxed_unsync())),
                    Err(e) => Err(e.into()),
                }
            })
        });
        let (watcher, tls, http) = (graceful.watcher(), tls.clone(), http.clone());
        let (first_byte, deadline) = (limits.first_byte_timeout, limits.header_timeout);
        tokio::spawn(async move {
            let served = async move {
                // A client that sends nothing is given up sooner than one sending a head; until
                // its first byte it costs no buffer.
                if !matches!(tokio::time::timeout(first_byte, L::first_byte(&stream)).await, Ok(true)) {
                    return;
                }
                let conn = match tls {
                    None => connection(&http, stream, guarded, watcher),
                    // A client that does not finish its handshake in time holds no slot.
                    Some(acceptor) => match tokio::time::timeout(deadline, acceptor.accept(stream)).await {
                        Ok(Ok(s)) => connection(&http, s, guarded, watcher),
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => return,
                    },
                };
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
            };
            tokio::select! {
                () = served => {}
                () = slot.shed.notified() => tracing::debug!("an idle connection gave way to a newer one"),
            }
            // The slot is freed only once the connection is gone.
            drop(slot);
        });
    }
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(limits.drain) => {
            tracing::warn!(addr = %local, "requests still running after {:?}; stopping anyway", limits.drain);
        }
    }
    Ok(())
}

/// Whether accept failed for want of file descriptors (the process's or the system's).
fn out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(rustix::io::Errno::from_io_error(e), Some(rustix::io::Errno::MFILE | rustix::io::Errno::NFILE))
}

/// The answer to a request that arrived on a connection already chosen to give way.
fn busy_answer() -> Response<Body> {
    let body = Full::new(Bytes::from_static(b"the server is shedding idle connections; retry\n"));
    let mut resp = Response::new(body.map_err(|never| match never {}).boxed_unsync());
    *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    resp.headers_mut().insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
    resp.headers_mut().insert(hyper::header::RETRY_AFTER, hyper::header::HeaderValue::from_static("1"));
    resp
}

/// Marks a connection busy while it lives: from a request head until its answer is sent.
struct Busy(Arc<std::sync::atomic::AtomicU8>);

impl Drop for Busy {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        let _ = self.0.compare_exchange(slots::BUSY, slots::IDLE, Ordering::AcqRel, Ordering::Relaxed);
    }
}

/// An answer's body that keeps its connection busy until it is sent (or dropped).
struct Tracked {
    body: Body,
    _busy: Busy,
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, BoxError>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// An axum router as a service for [`serve`].
pub fn tower<T>(svc: T) -> hyper_util::service::TowerToHyperService<T> {
    hyper_util::service::TowerToHyperService::new(svc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_only() {
        for ok in [
            None,
            Some("localhost"),
            Some("localhost:8888"),
            Some("LOCALHOST."),
            Some("bucket.localhost:8333"),
            Some("127.0.0.1"),
            Some("127.0.0.1:8888"),
            Some("127.3.2.1:1"),
            Some("[::1]:8888"),
            Some("[::1]"),
        ] {
            assert!(loopback_host_allowed(ok), "{ok:?}");
        }
        for bad in [
            "evil.example",
            "evil.example:8888",
            "localhost.evil.example",
            "10.0.0.1:8888",
            "0.0.0.0:8888",
            "[::2]:1",
            "[::1",
            "localhost:http",
            "",
        ] {
            assert!(!loopback_host_allowed(Some(bad)), "{bad:?}");
        }
    }
}

//! How every Tidemark listener (the filer's API, the admin, the S3 gateway) serves HTTP: one
//! accept loop with a bound on connections, a deadline for each request head and a cap on its
//! size, graceful shutdown, and — on a loopback listener — the `Host` check that keeps web pages
//! out (DNS rebinding: a page from `evil.example` whose name later resolves to 127.0.0.1 can
//! reach a loopback port, but its requests still say `Host: evil.example`).
//!
//! With a [`tls::acceptor`], the listener speaks HTTPS only (the handshake is bounded by the same
//! deadline as a request head).
//!
//! The servers keep their own routing and error formats; this crate sits under them.

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
    /// Connections served at once; more wait in the kernel's listen queue until one ends.
    pub max_connections: usize,
    /// A client that has not sent a whole request head this long after connecting (or after
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
            max_connections: 1024,
            header_timeout: Duration::from_secs(30),
            max_head_bytes: 64 * 1024,
            drain: Duration::from_secs(10),
        }
    }
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

/// Serves `service` on `listener` until `shutdown` resolves, then lets requests in flight finish
/// (at most `limits.drain`); HTTPS only when `tls` is given. On a loopback listener, requests for
/// other host names are refused.
pub async fn serve<S, B>(
    listener: tokio::net::TcpListener,
    service: S,
    limits: Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> std::io::Result<()>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let local: SocketAddr = listener.local_addr()?;
    let check_host = local.ip().is_loopback();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_head_bytes.max(8192));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p.map_err(std::io::Error::other)?,
            () = shutdown.as_mut() => break,
        };
        let (stream, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, addr = %local, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = shutdown.as_mut() => break,
        };
        let svc = service.clone();
        let guarded = hyper::service::service_fn(move |req: Request<Incoming>| -> Answer {
            let svc = svc.clone();
            Box::pin(async move {
                if check_host && let Some(host) = host_of(&req).filter(|h| !loopback_host_allowed(Some(h))) {
                    tracing::warn!(host = %host.escape_debug(), "refused a request for another host on a loopback listener");
                    return Ok(refused(&host).map(|b| b.map_err(|never| match never {}).boxed_unsync()));
                }
                match svc.call(req).await {
                    Ok(resp) => Ok(resp.map(|b| b.map_err(Into::into).boxed_unsync())),
                    Err(e) => Err(e.into()),
                }
            })
        });
        let (watcher, tls, http, deadline) = (graceful.watcher(), tls.clone(), http.clone(), limits.header_timeout);
        tokio::spawn(async move {
            let _slot = permit;
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

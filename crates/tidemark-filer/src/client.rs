//! `HttpFiler`: the filer's HTTP API as a [`Filer`]. Errors the filer returns arrive as the same
//! [`Error`] variants; failing to reach the filer at all is `Unavailable`, naming the address.

use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use futures::{StreamExt, TryStreamExt};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::de::DeserializeOwned;

use tidemark_core::backoff::Resumes;
use tidemark_core::cache::{CacheOutcome, CacheStats, CacheStatus};
use tidemark_core::error::ErrorBody;
use tidemark_core::filer::{Reopened, resuming};
use tidemark_core::model::{Applied, ChangeRecord, Entry, Fence, Lease, Page, Precondition, Txn, TxnBatch, TxnOutcome};
use tidemark_core::{ByteRange, ByteStream, ChangedMidRead, DeleteOptions, Error, Filer, Health, Result, WriteOptions};

use crate::http::{
    AcquireRequest, CacheStatusRequest, ENTRY_HEADER, EXTENDED_HEADER, MAX_EXTENDED_BYTES, MAX_STATUS_PATHS,
    PathsRequest, ReleaseRequest, RenewRequest, SPARSE_HEADER,
};

/// A client of one filer, or of several filers of one cluster (`A,B,C`): a request goes to the
/// filer that last answered; when that one cannot be reached (the connection is refused, or no
/// answer comes in time) later requests go to the next, and a request that never reached the
/// filer (its connection failed) is sent to the next one at once. A request that may have
/// reached a filer is never sent again — a write may have landed — and a refused request (a
/// failed precondition, a lost fence) is an answer, not a failure to fail over from.
#[derive(Clone, Debug)]
pub struct HttpFiler {
    bases: std::sync::Arc<Vec<String>>,
    /// Index (modulo the number of filers) of the filer requests go to.
    current: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    token: Option<String>,
    client: reqwest::Client,
    /// The socket of the filer beside this client, once [`HttpFiler::through_socket`] found it.
    socket: Option<std::sync::Arc<FilerSocket>>,
}

/// A filer's API on its Unix socket (`Health::socket`): the same filer as one of the client's
/// addresses, on this machine, reached with less of the kernel's work per byte than over
/// loopback TCP.
#[derive(Debug)]
struct FilerSocket {
    /// Which of the client's filers (an index into `bases`) it is the socket of.
    base: usize,
    path: String,
    client: reqwest::Client,
    /// Until when requests go over TCP instead: the socket refused a connection (the filer is
    /// restarting, or stopped serving it).
    down_until: std::sync::Mutex<Option<std::time::Instant>>,
}

/// How long after its socket refused a connection a client reaches that filer over TCP only.
const SOCKET_DOWN: Duration = Duration::from_secs(10);

impl FilerSocket {
    fn usable(&self) -> bool {
        let mut down = self.down_until.lock().unwrap_or_else(|p| p.into_inner());
        match *down {
            Some(until) if std::time::Instant::now() < until => false,
            Some(_) => {
                *down = None;
                true
            }
            None => true,
        }
    }

    fn went_away(&self, base: &str, e: &reqwest::Error) {
        let mut down = self.down_until.lock().unwrap_or_else(|p| p.into_inner());
        if down.is_none() {
            tracing::warn!(socket = %self.path, filer = base, error = %innermost(e), "the filer's socket refused a connection; reaching it over TCP for a while");
        }
        *down = Some(std::time::Instant::now() + SOCKET_DOWN);
    }
}

/// Where one request goes: a filer's base URL, over its socket when the client found one.
struct Target<'a> {
    base: &'a str,
    socket: Option<&'a FilerSocket>,
}

/// How long a metadata request waits for its answer, so a filer that accepts connections but
/// does not answer (paused, overloaded) is failed over from. Content requests, which stream for
/// as long as the file takes, and change-log requests, which long-poll, set their own bounds.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

impl HttpFiler {
    /// `addr` is `host:port` or a URL (`http://host:port`), or several separated by commas.
    pub fn new(addr: &str, token: Option<String>) -> Result<Self> {
        let bases = tidemark_http::base_urls(addr, "filer").map_err(Error::invalid_argument)?;
        let client = tidemark_http::tls::client_builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| Error::internal(format!("building the HTTP client: {e}")))?;
        Ok(HttpFiler {
            bases: std::sync::Arc::new(bases),
            current: Default::default(),
            token: token.filter(|t| !t.is_empty()),
            client,
            socket: None,
        })
    }

    /// This client, reaching the filer over its Unix socket when it is on this machine: when
    /// the filer's health names a socket that is this user's own, and the filer answering there
    /// has the same `instance` as the one answering at the address. Otherwise (another machine,
    /// another user, no socket, an older filer) this client as it was. A request the socket
    /// refuses goes over TCP, and so do requests for the next few seconds.
    pub async fn through_socket(self) -> HttpFiler {
        match self.find_socket().await {
            Ok(socket) => {
                tracing::info!(filer = self.base_at(socket.base), socket = %socket.path, "reaching the filer through its socket");
                HttpFiler { socket: Some(std::sync::Arc::new(socket)), ..self }
            }
            Err(why) => {
                tracing::debug!(filer = self.base_url(), "reaching the filer over TCP: {why}");
                self
            }
        }
    }

    async fn find_socket(&self) -> std::result::Result<FilerSocket, String> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let health = self.health().await.map_err(|e| e.to_string())?;
        // The filer that answered (a failed connection moves `current` on before the answer).
        let base = self.current.load(std::sync::atomic::Ordering::Relaxed) % self.bases.len();
        let (Some(path), Some(instance)) = (health.socket, health.instance) else {
            return Err("the filer names no socket".into());
        };
        let meta = std::fs::symlink_metadata(&path).map_err(|e| format!("its socket {path}: {e}"))?;
        if !meta.file_type().is_socket() || meta.uid() != rustix::process::geteuid().as_raw() {
            return Err(format!("{path} is not a socket of this user's"));
        }
        let client = reqwest::Client::builder()
            .unix_socket(path.as_str())
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("building a client of {path}: {e}"))?;
        let socket = FilerSocket { base, path, client, down_until: Default::default() };
        // Asked on the socket alone (no falling back to TCP): is it the same filer?
        let target = Target { base: self.base_at(base), socket: Some(&socket) };
        let resp = self
            .request_at(&target, Method::GET, "health")
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .map_err(|e| format!("{}: {}", socket.path, innermost(&e)))?;
        let there: Health = check(&target.shown(), resp)
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| format!("{}: {e}", socket.path))?;
        if there.instance.as_deref() != Some(instance.as_str()) {
            return Err(format!("{} is another filer's than the one at {}", socket.path, target.base));
        }
        Ok(socket)
    }

    /// The socket requests go to, if any: the path of the filer's socket this client uses.
    pub fn socket_path(&self) -> Option<&str> {
        self.socket.as_deref().map(|s| s.path.as_str())
    }

    /// The same filer reached with the cluster token it keeps in its data directory, when it is
    /// `tidemark server` without tokens on this machine and this user may read that file (the
    /// data directory's owner, who could read the secrets from its store anyway): how a shell on
    /// the server's machine reads a remote's secrets whole to open the remote, while every other
    /// client sees them masked. `None` otherwise.
    ///
    /// The file the filer names is read only if it is a loopback filer's, is called
    /// `cluster.token`, is this user's own with mode 0600, and holds a token's 64 hex digits: a
    /// filer cannot have this client read any other file and send it back.
    pub async fn with_local_cluster_token(&self) -> Option<HttpFiler> {
        use std::os::unix::fs::MetadataExt;
        let base = reqwest::Url::parse(self.base_url()).ok()?;
        if !tidemark_http::loopback_host_allowed(Some(base.host_str()?)) {
            return None;
        }
        let file = std::path::PathBuf::from(self.health().await.ok()?.cluster_token_file?);
        if file.file_name()? != "cluster.token" {
            return None;
        }
        let meta = std::fs::symlink_metadata(&file).ok()?;
        let me = rustix::process::geteuid().as_raw();
        if !meta.is_file() || meta.mode() & 0o777 != 0o600 || meta.uid() != me || meta.len() != 64 {
            return None;
        }
        let token = std::fs::read_to_string(&file).ok()?;
        if token.len() != 64 || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        Some(HttpFiler { token: Some(token), ..self.clone() })
    }

    /// The filer requests go to now.
    pub fn base_url(&self) -> &str {
        self.base_at(self.current.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn base_at(&self, i: usize) -> &str {
        &self.bases[i % self.bases.len()]
    }

    /// Moves on from the filer at `i` (once, however many requests saw it fail).
    fn failover(&self, i: usize) {
        use std::sync::atomic::Ordering;
        if self.bases.len() > 1 && self.current.compare_exchange(i, i + 1, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            tracing::warn!(from = self.base_at(i), to = self.base_at(i + 1), "filer unreachable; trying the next");
        }
    }

    /// Where a request to the filer at `i` goes.
    fn target(&self, i: usize) -> Target<'_> {
        let socket = self.socket.as_deref().filter(|s| s.base == i % self.bases.len() && s.usable());
        Target { base: self.base_at(i), socket }
    }

    fn request_at(&self, t: &Target, method: Method, endpoint: &str) -> RequestBuilder {
        let rb = match t.socket {
            // The host names no machine (the socket does); it is loopback's, as a check expects.
            Some(s) => s.client.request(method, format!("http://localhost/api/v1/{endpoint}")),
            None => self.client.request(method, format!("{}/api/v1/{endpoint}", t.base)),
        };
        match &self.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    /// The entry at `path` and one request's stream of its content (or of `range` of it).
    async fn open_content(&self, path: &str, range: Option<ByteRange>) -> Result<(Entry, ByteStream)> {
        let spec = match range {
            Some(r) => Some(match r.length {
                Some(0) => return Err(Error::invalid_argument("an empty range")),
                Some(n) => format!("bytes={}-{}", r.offset, r.offset.saturating_add(n - 1)),
                None => format!("bytes={}-", r.offset),
            }),
            None => None,
        };
        let (resp, i) = self
            .send_with(|u| {
                let rb = self.request_at(u, Method::GET, "content").query(&[("path", path)]);
                match &spec {
                    Some(spec) => rb.header(reqwest::header::RANGE, spec),
                    None => rb,
                }
            })
            .await?;
        if resp.status() == StatusCode::RANGE_NOT_SATISFIABLE
            && let Some(r) = range
            && let Ok(entry) = entry_of(&resp)
            && entry.size == r.offset
        {
            // A range at the very end: the filer says 416 (HTTP has no empty 206) and sends the
            // entry; the read returns nothing, as the local filer's does.
            return Ok((entry, futures::stream::empty().boxed()));
        }
        let resp = check(self.base_at(i), resp).await?;
        let entry = entry_of(&resp)?;
        let stream = resp.bytes_stream().map_err(std::io::Error::other).boxed();
        Ok((entry, stream))
    }

    /// Sends the request `make` builds for a filer's base URL, failing over as the type says.
    async fn send_with(&self, make: impl Fn(&Target) -> RequestBuilder) -> Result<(Response, usize)> {
        let mut last = None;
        let mut tried = 0;
        while tried < self.bases.len() {
            let i = self.current.load(std::sync::atomic::Ordering::Relaxed);
            let target = self.target(i);
            match make(&target).send().await {
                Ok(resp) => return Ok((resp, i)),
                Err(e) => {
                    let never_reached = e.is_connect();
                    if let Some(socket) = target.socket
                        && never_reached
                    {
                        // The same filer over TCP, at once (the request never reached it).
                        socket.went_away(target.base, &e);
                        continue;
                    }
                    let err = transport(&target.shown(), e);
                    self.failover(i);
                    if !never_reached {
                        return Err(err);
                    }
                    last = Some(err);
                    tried += 1;
                }
            }
        }
        Err(last.unwrap_or_else(|| Error::internal("no filer to send to")))
    }

    /// Sends a metadata request (bounded in time) and checks its answer.
    async fn send(&self, make: impl Fn(&Target) -> RequestBuilder) -> Result<Response> {
        let (resp, i) = self.send_with(|b| make(b).timeout(REQUEST_TIMEOUT)).await?;
        check(self.base_at(i), resp).await
    }

    async fn call<T: DeserializeOwned>(&self, make: impl Fn(&Target) -> RequestBuilder) -> Result<T> {
        let (resp, i) = self.send_with(|b| make(b).timeout(REQUEST_TIMEOUT)).await?;
        let base = self.base_at(i);
        check(base, resp).await?.json().await.map_err(|e| transport(base, e))
    }
}

/// How many times in a row a content stream that breaks is opened again from where it broke
/// (if the file is still the version it began at: never the bytes of another version after
/// those of one, [`ChangedMidRead`]), and the first wait (doubling): 0.2 + 0.4 + 0.8 + 1.6 s,
/// time for a client of several filers to reach the next.
const RESUMES_IN_A_ROW: u32 = 4;
const RESUME_BACKOFF: Duration = Duration::from_millis(200);

/// The response if it succeeded, else the error it carries.
async fn check(base: &str, resp: Response) -> Result<Response> {
    if resp.status().is_success() {
        return Ok(resp);
    }
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    match serde_json::from_str::<ErrorBody>(&text) {
        Ok(body) => Err(body.error),
        Err(_) if status == StatusCode::PAYLOAD_TOO_LARGE => Err(Error::invalid_argument(format!(
            "the filer at {base} refused a request body this large ({status}); send less at once"
        ))),
        Err(_) if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::BAD_GATEWAY => {
            Err(Error::Unavailable { message: format!("filer at {base} answered {status}") })
        }
        Err(_) => Err(Error::internal(format!("filer at {base} answered {status}: {}", text.trim()))),
    }
}

impl Target<'_> {
    /// The filer as errors name it.
    fn shown(&self) -> String {
        match self.socket {
            Some(s) => format!("{} (through its socket {})", self.base, s.path),
            None => self.base.to_string(),
        }
    }
}

/// The innermost cause of `e`: what actually happened (connection refused, DNS, reset).
fn innermost(e: &reqwest::Error) -> &dyn std::error::Error {
    let mut cause: &dyn std::error::Error = e;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    cause
}

fn transport(base: &str, e: reqwest::Error) -> Error {
    let cause = innermost(&e);
    let message = if e.is_connect() {
        format!(
            "cannot connect to the filer at {base} ({cause}); is `tidemark server` or `tidemark filer` running there? \
             Set --filer or TIDEMARK_FILER"
        )
    } else if e.is_timeout() {
        format!("the filer at {base} did not answer in time ({cause})")
    } else if e.is_decode() {
        format!("the answer of the filer at {base} could not be decoded ({cause})")
    } else {
        format!("request to the filer at {base} failed ({cause})")
    };
    Error::Unavailable { message }
}

#[async_trait]
impl Filer for HttpFiler {
    async fn health(&self) -> Result<Health> {
        self.call(|u| self.request_at(u, Method::GET, "health")).await
    }

    async fn stat_many(&self, paths: &[String]) -> Result<Vec<Option<Entry>>> {
        let req = PathsRequest { paths: paths.to_vec() };
        let out: Vec<Option<Entry>> = self.call(|u| self.request_at(u, Method::POST, "entries").json(&req)).await?;
        if out.len() != paths.len() {
            return Err(Error::internal(format!(
                "the filer at {} answered {} entries for {} paths",
                self.base_url(),
                out.len(),
                paths.len()
            )));
        }
        Ok(out)
    }

    async fn stat(&self, path: &str) -> Result<Option<Entry>> {
        match self.call(|u| self.request_at(u, Method::GET, "entry").query(&[("path", path)])).await {
            Ok(e) => Ok(Some(e)),
            Err(Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn describe(&self, path: &str) -> Result<Option<Entry>> {
        match self
            .call(|u| self.request_at(u, Method::GET, "entry").query(&[("path", path), ("describe", "true")]))
            .await
        {
            Ok(e) => Ok(Some(e)),
            Err(Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn list(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page> {
        self.call(|u| {
            let rb = self.request_at(u, Method::GET, "list").query(&[("dir", dir)]).query(&[("limit", limit)]);
            match start_after {
                Some(a) => rb.query(&[("start_after", a)]),
                None => rb,
            }
        })
        .await
    }

    async fn scan(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page> {
        self.call(|u| {
            let rb = self.request_at(u, Method::GET, "scan").query(&[("dir", dir)]).query(&[("limit", limit)]);
            match start_after {
                Some(a) => rb.query(&[("start_after", a)]),
                None => rb,
            }
        })
        .await
    }

    async fn count(&self, dir: &str, except: Option<&str>) -> Result<u64> {
        self.call(|u| {
            let mut q = vec![("dir", dir)];
            if let Some(x) = except {
                q.push(("except", x));
            }
            self.request_at(u, Method::GET, "count").query(&q)
        })
        .await
    }

    async fn read(&self, path: &str, range: Option<ByteRange>) -> Result<(Entry, ByteStream)> {
        let (entry, stream) = self.open_content(path, range).await?;
        let pos = range.map_or(0, |r| r.offset);
        let end = match range.and_then(|r| r.length) {
            Some(n) => pos.saturating_add(n).min(entry.size),
            None => entry.size,
        };
        let (filer, path, version) = (self.clone(), path.to_string(), entry.version);
        let reopen = move |rest: ByteRange, e: &std::io::Error| {
            tracing::info!(path, at = rest.offset, error = %e, "resuming the read where it broke");
            let (filer, path) = (filer.clone(), path.clone());
            async move {
                let changed = |now| {
                    let c = ChangedMidRead { path: path.clone(), was: version, now };
                    tracing::warn!(path, at = rest.offset, "{c}");
                    Reopened::Fail(std::io::Error::other(c))
                };
                match filer.open_content(&path, Some(rest)).await {
                    Ok((entry, stream)) if entry.version == version => Reopened::Stream(stream),
                    Ok((entry, _)) => changed(Some(entry.version)),
                    Err(Error::NotFound { .. } | Error::IsADirectory { .. } | Error::NotADirectory { .. }) => {
                        changed(None)
                    }
                    Err(e) if e.is_retryable() => Reopened::Retry(std::io::Error::other(e)),
                    Err(e) => Reopened::Fail(std::io::Error::other(e)),
                }
            }
        };
        let resumes = Resumes::new(RESUME_BACKOFF, RESUMES_IN_A_ROW);
        Ok((entry, resuming(stream, pos, end, resumes, reopen)))
    }

    async fn write(&self, path: &str, body: ByteStream, opts: WriteOptions) -> Result<Entry> {
        let extended = match &opts.extended {
            Some(ext) => {
                let json = serde_json::to_vec(ext).map_err(Error::internal)?;
                if json.len() > MAX_EXTENDED_BYTES {
                    return Err(Error::invalid_argument(format!(
                        "{} bytes of extended attributes; at most {MAX_EXTENDED_BYTES}",
                        json.len()
                    )));
                }
                Some(base64::engine::general_purpose::STANDARD.encode(json))
            }
            None => None,
        };
        // The body streams once: a write is sent to one filer, and never again (on a failure
        // the next request goes to the next filer).
        let i = self.current.load(std::sync::atomic::Ordering::Relaxed);
        let target = self.target(i);
        let mut rb =
            self.request_at(&target, Method::PUT, "content").query(&[("path", path), ("origin", opts.origin.as_str())]);
        match opts.precondition {
            Precondition::Any => {}
            Precondition::Absent => rb = rb.query(&[("if_absent", true)]),
            Precondition::Version(v) => rb = rb.query(&[("if_version", v)]),
        }
        if let Some(m) = opts.mode {
            rb = rb.query(&[("mode", m)]);
        }
        if let Some(t) = opts.mtime_ms {
            rb = rb.query(&[("mtime_ms", t)]);
        }
        for (name, id) in [("uid", opts.uid), ("gid", opts.gid)] {
            if let Some(id) = id {
                rb = rb.query(&[(name, id)]);
            }
        }
        if opts.dir_times {
            rb = rb.query(&[("dir_times", true)]);
        }
        if let Some(ext) = &extended {
            rb = rb.header(EXTENDED_HEADER, ext);
        }
        if let Some(layout) = &opts.sparse {
            rb = rb.header(SPARSE_HEADER, layout.to_header());
        }
        let resp = match rb.body(reqwest::Body::wrap_stream(body)).send().await {
            Ok(r) => r,
            Err(e) => {
                match target.socket {
                    // The next request reaches this filer over TCP (a body is sent once).
                    Some(socket) if e.is_connect() => socket.went_away(target.base, &e),
                    _ => self.failover(i),
                }
                return Err(transport(&target.shown(), e));
            }
        };
        let base = self.base_at(i);
        check(base, resp).await?.json().await.map_err(|e| transport(base, e))
    }

    async fn delete(&self, path: &str, opts: DeleteOptions) -> Result<Applied> {
        if opts.precondition == Precondition::Absent {
            return Err(Error::invalid_argument("a delete cannot require the entry to be absent"));
        }
        self.call(|u| {
            let rb = self
                .request_at(u, Method::DELETE, "entry")
                .query(&[("path", path)])
                .query(&[("recursive", opts.recursive)]);
            let rb = if opts.dir_times { rb.query(&[("dir_times", true)]) } else { rb };
            match opts.precondition {
                Precondition::Version(v) => rb.query(&[("if_version", v)]),
                _ => rb,
            }
        })
        .await
    }

    async fn apply(&self, txn: Txn) -> Result<Applied> {
        self.call(|u| self.request_at(u, Method::POST, "apply").json(&txn)).await
    }

    async fn apply_many(&self, batch: TxnBatch) -> Result<Vec<Result<Applied>>> {
        let n = batch.txns.len();
        let out: Vec<TxnOutcome> = self.call(|u| self.request_at(u, Method::POST, "apply-many").json(&batch)).await?;
        if out.len() != n {
            return Err(Error::internal(format!(
                "the filer at {} answered {} results for a batch of {n}",
                self.base_url(),
                out.len()
            )));
        }
        Ok(out.into_iter().map(Result::from).collect())
    }

    async fn lease_acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Lease> {
        let req = AcquireRequest { name: name.into(), holder: holder.into(), ttl_ms: ttl.as_millis() as u64 };
        self.call(|u| self.request_at(u, Method::POST, "lease/acquire").json(&req)).await
    }

    async fn lease_renew(&self, fence: &Fence, ttl: Duration) -> Result<Lease> {
        let req = RenewRequest { fence: fence.clone(), ttl_ms: ttl.as_millis() as u64 };
        self.call(|u| self.request_at(u, Method::POST, "lease/renew").json(&req)).await
    }

    async fn lease_release(&self, fence: &Fence) -> Result<()> {
        let req = ReleaseRequest { fence: fence.clone() };
        self.send(|u| self.request_at(u, Method::POST, "lease/release").json(&req)).await?;
        Ok(())
    }

    async fn lease_get(&self, name: &str) -> Result<Option<Lease>> {
        self.call(|u| self.request_at(u, Method::GET, "lease").query(&[("name", name)])).await
    }

    async fn changes(&self, after: u64, limit: usize, wait: Duration) -> Result<Vec<ChangeRecord>> {
        let (resp, i) = self
            .send_with(|u| {
                self.request_at(u, Method::GET, "changes")
                    .query(&[("after", after), ("limit", limit as u64), ("wait_ms", wait.as_millis() as u64)])
                    .timeout(wait + REQUEST_TIMEOUT)
            })
            .await?;
        let base = self.base_at(i);
        check(base, resp).await?.json().await.map_err(|e| transport(base, e))
    }

    async fn cache_status(&self, paths: &[String]) -> Result<Vec<CacheStatus>> {
        let mut out = Vec::with_capacity(paths.len());
        for part in paths.chunks(MAX_STATUS_PATHS) {
            let req = CacheStatusRequest { paths: part.to_vec() };
            let got: Vec<CacheStatus> =
                self.call(|u| self.request_at(u, Method::POST, "cache/status").json(&req)).await?;
            out.extend(got);
        }
        Ok(out)
    }

    async fn cache_fetch(&self, path: &str, wait: bool) -> Result<CacheOutcome> {
        let ask = |u: &Target| {
            self.request_at(u, Method::POST, "cache/fetch").query(&[("path", path)]).query(&[("wait", wait)])
        };
        if !wait {
            return self.call(ask).await;
        }
        // Waiting for a whole file's fetch takes as long as the file does.
        let (resp, i) = self.send_with(ask).await?;
        let base = self.base_at(i);
        check(base, resp).await?.json().await.map_err(|e| transport(base, e))
    }

    async fn cache_drop(&self, path: &str) -> Result<CacheOutcome> {
        self.call(|u| self.request_at(u, Method::POST, "cache/drop").query(&[("path", path)])).await
    }

    async fn cache_stats(&self) -> Result<CacheStats> {
        self.call(|u| self.request_at(u, Method::GET, "cache/stats")).await
    }

    async fn local_file(&self, path: &str) -> Result<Option<tidemark_core::filer::LocalFile>> {
        // A filer from before this call answers 404 for the route: no local file, as for a path
        // whose bytes lie elsewhere.
        match self.call(|u| self.request_at(u, Method::GET, "content/local").query(&[("path", path)])).await {
            Err(Error::NotFound { .. }) => Ok(None),
            r => r,
        }
    }
}

/// The entry the filer sends with a content response.
fn entry_of(resp: &Response) -> Result<Entry> {
    let header = resp
        .headers()
        .get(ENTRY_HEADER)
        .ok_or_else(|| Error::internal(format!("the filer's content response lacks {ENTRY_HEADER}")))?;
    let json = base64::engine::general_purpose::STANDARD
        .decode(header.as_bytes())
        .map_err(|e| Error::internal(format!("bad {ENTRY_HEADER}: {e}")))?;
    serde_json::from_slice(&json).map_err(|e| Error::internal(format!("bad {ENTRY_HEADER}: {e}")))
}

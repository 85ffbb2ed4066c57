//! `HttpFiler`: the filer's HTTP API as a [`Filer`]. Errors the filer returns arrive as the same
//! [`Error`] variants; failing to reach the filer at all is `Unavailable`, naming the address.

use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use futures::{StreamExt, TryStreamExt};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::de::DeserializeOwned;

use tidemark_core::cache::{CacheOutcome, CacheStats, CacheStatus};
use tidemark_core::error::ErrorBody;
use tidemark_core::model::{Applied, ChangeRecord, Entry, Fence, Lease, Page, Precondition, Txn, TxnBatch, TxnOutcome};
use tidemark_core::{ByteRange, ByteStream, DeleteOptions, Error, Filer, Health, Result, WriteOptions};

use crate::http::{
    AcquireRequest, CacheStatusRequest, ENTRY_HEADER, EXTENDED_HEADER, MAX_EXTENDED_BYTES, MAX_STATUS_PATHS,
    PathsRequest, ReleaseRequest, RenewRequest,
};

#[derive(Clone, Debug)]
pub struct HttpFiler {
    base: String,
    token: Option<String>,
    client: reqwest::Client,
}

impl HttpFiler {
    /// `addr` is `host:port` or a URL (`http://host:port`).
    pub fn new(addr: &str, token: Option<String>) -> Result<Self> {
        let base = if addr.starts_with("http://") || addr.starts_with("https://") {
            addr.trim_end_matches('/').to_string()
        } else {
            format!("http://{addr}")
        };
        reqwest::Url::parse(&base).map_err(|e| Error::invalid_argument(format!("bad filer address {addr:?}: {e}")))?;
        let client = tidemark_http::tls::client_builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| Error::internal(format!("building the HTTP client: {e}")))?;
        Ok(HttpFiler { base, token: token.filter(|t| !t.is_empty()), client })
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    fn request(&self, method: Method, endpoint: &str) -> RequestBuilder {
        let rb = self.client.request(method, format!("{}/api/v1/{endpoint}", self.base));
        match &self.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    async fn send(&self, rb: RequestBuilder) -> Result<Response> {
        let resp = rb.send().await.map_err(|e| self.transport(e))?;
        self.check(resp).await
    }

    /// The response if it succeeded, else the error it carries.
    async fn check(&self, resp: Response) -> Result<Response> {
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        match serde_json::from_str::<ErrorBody>(&text) {
            Ok(body) => Err(body.error),
            Err(_) if status == StatusCode::PAYLOAD_TOO_LARGE => Err(Error::invalid_argument(format!(
                "the filer at {} refused a request body this large ({status}); send less at once",
                self.base
            ))),
            Err(_) if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::BAD_GATEWAY => {
                Err(Error::Unavailable { message: format!("filer at {} answered {status}", self.base) })
            }
            Err(_) => Err(Error::internal(format!("filer at {} answered {status}: {}", self.base, text.trim()))),
        }
    }

    async fn call<T: DeserializeOwned>(&self, rb: RequestBuilder) -> Result<T> {
        let resp = self.send(rb).await?;
        resp.json().await.map_err(|e| self.transport(e))
    }

    fn transport(&self, e: reqwest::Error) -> Error {
        // The innermost cause says what actually happened (connection refused, DNS, reset).
        let mut cause: &dyn std::error::Error = &e;
        while let Some(inner) = cause.source() {
            cause = inner;
        }
        let message = if e.is_connect() {
            format!(
                "cannot connect to the filer at {} ({cause}); is `tidemark server` or `tidemark filer` running there? \
                 Set --filer or TIDEMARK_FILER",
                self.base
            )
        } else if e.is_timeout() {
            format!("the filer at {} did not answer in time ({cause})", self.base)
        } else if e.is_decode() {
            format!("the answer of the filer at {} could not be decoded ({cause})", self.base)
        } else {
            format!("request to the filer at {} failed ({cause})", self.base)
        };
        Error::Unavailable { message }
    }
}

#[async_trait]
impl Filer for HttpFiler {
    async fn health(&self) -> Result<Health> {
        self.call(self.request(Method::GET, "health")).await
    }

    async fn stat_many(&self, paths: &[String]) -> Result<Vec<Option<Entry>>> {
        let req = PathsRequest { paths: paths.to_vec() };
        let out: Vec<Option<Entry>> = self.call(self.request(Method::POST, "entries").json(&req)).await?;
        if out.len() != paths.len() {
            return Err(Error::internal(format!(
                "the filer at {} answered {} entries for {} paths",
                self.base,
                out.len(),
                paths.len()
            )));
        }
        Ok(out)
    }

    async fn stat(&self, path: &str) -> Result<Option<Entry>> {
        match self.call(self.request(Method::GET, "entry").query(&[("path", path)])).await {
            Ok(e) => Ok(Some(e)),
            Err(Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn list(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page> {
        let mut rb = self.request(Method::GET, "list").query(&[("dir", dir)]).query(&[("limit", limit)]);
        if let Some(a) = start_after {
            rb = rb.query(&[("start_after", a)]);
        }
        self.call(rb).await
    }

    async fn scan(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page> {
        let mut rb = self.request(Method::GET, "scan").query(&[("dir", dir)]).query(&[("limit", limit)]);
        if let Some(a) = start_after {
            rb = rb.query(&[("start_after", a)]);
        }
        self.call(rb).await
    }

    async fn count(&self, dir: &str) -> Result<u64> {
        self.call(self.request(Method::GET, "count").query(&[("dir", dir)])).await
    }

    async fn read(&self, path: &str, range: Option<ByteRange>) -> Result<(Entry, ByteStream)> {
        let mut rb = self.request(Method::GET, "content").query(&[("path", path)]);
        if let Some(r) = range {
            let spec = match r.length {
                Some(0) => return Err(Error::invalid_argument("an empty range")),
                Some(n) => format!("bytes={}-{}", r.offset, r.offset.saturating_add(n - 1)),
                None => format!("bytes={}-", r.offset),
            };
            rb = rb.header(reqwest::header::RANGE, spec);
        }
        let resp = rb.send().await.map_err(|e| self.transport(e))?;
        if resp.status() == StatusCode::RANGE_NOT_SATISFIABLE
            && let Some(r) = range
            && let Ok(entry) = entry_of(&resp)
            && entry.size == r.offset
        {
            // A range at the very end: the filer says 416 (HTTP has no empty 206) and sends the
            // entry; the read returns nothing, as the local filer's does.
            return Ok((entry, futures::stream::empty().boxed()));
        }
        let resp = self.check(resp).await?;
        let entry = entry_of(&resp)?;
        let stream = resp.bytes_stream().map_err(std::io::Error::other).boxed();
        Ok((entry, stream))
    }

    async fn write(&self, path: &str, body: ByteStream, opts: WriteOptions) -> Result<Entry> {
        let mut rb = self.request(Method::PUT, "content").query(&[("path", path), ("origin", opts.origin.as_str())]);
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
        if let Some(ext) = &opts.extended {
            let json = serde_json::to_vec(ext).map_err(Error::internal)?;
            if json.len() > MAX_EXTENDED_BYTES {
                return Err(Error::invalid_argument(format!(
                    "{} bytes of extended attributes; at most {MAX_EXTENDED_BYTES}",
                    json.len()
                )));
            }
            rb = rb.header(EXTENDED_HEADER, base64::engine::general_purpose::STANDARD.encode(json));
        }
        self.call(rb.body(reqwest::Body::wrap_stream(body))).await
    }

    async fn delete(&self, path: &str, opts: DeleteOptions) -> Result<Applied> {
        let mut rb =
            self.request(Method::DELETE, "entry").query(&[("path", path)]).query(&[("recursive", opts.recursive)]);
        match opts.precondition {
            Precondition::Any => {}
            Precondition::Version(v) => rb = rb.query(&[("if_version", v)]),
            Precondition::Absent => {
                return Err(Error::invalid_argument("a delete cannot require the entry to be absent"));
            }
        }
        self.call(rb).await
    }

    async fn apply(&self, txn: Txn) -> Result<Applied> {
        self.call(self.request(Method::POST, "apply").json(&txn)).await
    }

    async fn apply_many(&self, batch: TxnBatch) -> Result<Vec<Result<Applied>>> {
        let n = batch.txns.len();
        let out: Vec<TxnOutcome> = self.call(self.request(Method::POST, "apply-many").json(&batch)).await?;
        if out.len() != n {
            return Err(Error::internal(format!(
                "the filer at {} answered {} results for a batch of {n}",
                self.base,
                out.len()
            )));
        }
        Ok(out.into_iter().map(Result::from).collect())
    }

    async fn lease_acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Lease> {
        let req = AcquireRequest { name: name.into(), holder: holder.into(), ttl_ms: ttl.as_millis() as u64 };
        self.call(self.request(Method::POST, "lease/acquire").json(&req)).await
    }

    async fn lease_renew(&self, fence: &Fence, ttl: Duration) -> Result<Lease> {
        let req = RenewRequest { fence: fence.clone(), ttl_ms: ttl.as_millis() as u64 };
        self.call(self.request(Method::POST, "lease/renew").json(&req)).await
    }

    async fn lease_release(&self, fence: &Fence) -> Result<()> {
        self.send(self.request(Method::POST, "lease/release").json(&ReleaseRequest { fence: fence.clone() })).await?;
        Ok(())
    }

    async fn lease_get(&self, name: &str) -> Result<Option<Lease>> {
        self.call(self.request(Method::GET, "lease").query(&[("name", name)])).await
    }

    async fn changes(&self, after: u64, limit: usize, wait: Duration) -> Result<Vec<ChangeRecord>> {
        let rb = self
            .request(Method::GET, "changes")
            .query(&[("after", after), ("limit", limit as u64), ("wait_ms", wait.as_millis() as u64)])
            .timeout(wait + Duration::from_secs(30));
        self.call(rb).await
    }

    async fn cache_status(&self, paths: &[String]) -> Result<Vec<CacheStatus>> {
        let mut out = Vec::with_capacity(paths.len());
        for part in paths.chunks(MAX_STATUS_PATHS) {
            let req = CacheStatusRequest { paths: part.to_vec() };
            let got: Vec<CacheStatus> = self.call(self.request(Method::POST, "cache/status").json(&req)).await?;
            out.extend(got);
        }
        Ok(out)
    }

    async fn cache_fetch(&self, path: &str, wait: bool) -> Result<CacheOutcome> {
        let rb = self.request(Method::POST, "cache/fetch").query(&[("path", path)]).query(&[("wait", wait)]);
        self.call(rb).await
    }

    async fn cache_drop(&self, path: &str) -> Result<CacheOutcome> {
        self.call(self.request(Method::POST, "cache/drop").query(&[("path", path)])).await
    }

    async fn cache_stats(&self) -> Result<CacheStats> {
        self.call(self.request(Method::GET, "cache/stats")).await
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

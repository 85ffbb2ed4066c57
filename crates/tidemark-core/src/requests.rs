//! Every request to a bucket, counted by operation: a reconcile's summary, a subscription's
//! counters and the filer's `/metrics` say what the bucket was asked, and so what it cost.
//!
//! [`Counted`] wraps any [`RemoteStorage`] and counts each call at the trait: one call is one
//! request of the operation it is named for (`LIST`, `HEAD`, `GET`, `PUT`, `DELETE`, `COPY`),
//! except `MULTIPART`, an upload in parts (several requests: its start, each part, its end).
//! A provider's own retries of a failed request are not counted again.
//!
//! A subscription's queue is counted by its source, at each request it sends: [`RECEIVE`] (SQS
//! `ReceiveMessage`, Pub/Sub `pull`, Azure `GetMessages`), [`ACK`] (`DeleteMessageBatch` of up
//! to 10, `acknowledge`, Azure's `DeleteMessage` of one), [`VISIBILITY`]
//! (`ChangeMessageVisibility`, `modifyAckDeadline`, `UpdateMessage`: an extension or a release),
//! [`DEPTH`] (reading the dead-letter queue's depth) and [`SEND`] (Azure: a message moved to the
//! poison queue).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;

use crate::ByteRange;
use crate::error::Result;
use crate::filer::ByteStream;
use crate::remote::{ListPage, ObjectHeaders, PART, RemoteObject, RemoteStorage};

/// A receive of messages from a queue (one request, however many messages it returns).
pub const RECEIVE: &str = "RECEIVE";
/// An acknowledgement: the messages deleted from the queue (one request per batch sent).
pub const ACK: &str = "ACK";
/// A message's visibility changed: kept longer, or given back.
pub const VISIBILITY: &str = "VISIBILITY";
/// The depth of a dead-letter queue read.
pub const DEPTH: &str = "DEPTH";
/// A message sent to a queue.
pub const SEND: &str = "SEND";

/// Requests by operation. Cloning shares the counts.
#[derive(Debug, Clone, Default)]
pub struct Requests(Arc<Mutex<BTreeMap<&'static str, u64>>>);

impl Requests {
    pub fn count(&self, op: &'static str) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()).entry(op).or_default() += 1;
    }

    /// The counts so far, by operation.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    /// `LIST 3, HEAD 1` (nothing: `none`).
    pub fn line(counts: &BTreeMap<String, u64>) -> String {
        if counts.values().all(|n| *n == 0) {
            return "none".into();
        }
        counts.iter().filter(|(_, n)| **n > 0).map(|(op, n)| format!("{op} {n}")).collect::<Vec<_>>().join(", ")
    }
}

/// Adds `more` to `into`, operation by operation.
pub fn add(into: &mut BTreeMap<String, u64>, more: &BTreeMap<String, u64>) {
    for (op, n) in more {
        *into.entry(op.clone()).or_default() += n;
    }
}

/// What requests cost: US dollars per 1,000 requests, by provider (`s3`, `gcs`, `azure`, as
/// [`crate::remote::StorageKind`] names them) and operation. [`Prices::list`] holds the
/// providers' published list prices (docs/SEMANTICS.md, "Requests are counted", names each
/// source); an operator's own
/// (a negotiated rate, another region or storage class) replace them, operation by operation,
/// with [`Prices::with_overrides`].
#[derive(Debug, Clone, PartialEq)]
pub struct Prices(BTreeMap<String, BTreeMap<String, f64>>);

impl Prices {
    /// The list prices, per 1,000 requests. S3 Standard: `PUT`, `COPY`, `LIST` (and the parts of
    /// a `MULTIPART`, counted here as one) $0.005, `GET` and `HEAD` $0.0004, `DELETE` free; SQS
    /// standard queues $0.40 a million requests, whatever the action. GCS Standard: class A
    /// (`PUT`, `COPY`, `LIST`, `MULTIPART`) $0.005, class B (`GET`, `HEAD`) $0.0004, `DELETE`
    /// free; Pub/Sub charges for the bytes it moves, not per request ($0). Azure: Microsoft's
    /// sample prices for the hot tier (writes and lists $0.055, reads $0.0044 per 10,000);
    /// queue operations are not priced here (give yours).
    pub fn list() -> Prices {
        // (provider, the writing and listing class, the reading class, the queue's requests).
        let table =
            [("s3", 0.005, 0.0004, Some(0.0004)), ("gcs", 0.005, 0.0004, Some(0.0)), ("azure", 0.0055, 0.00044, None)];
        const WRITES: [&str; 4] = ["LIST", "PUT", "COPY", "MULTIPART"];
        const READS: [&str; 2] = ["GET", "HEAD"];
        const QUEUE: [&str; 5] = [RECEIVE, ACK, VISIBILITY, DEPTH, SEND];
        Prices(
            table
                .into_iter()
                .map(|(provider, writes, reads, queue)| {
                    let ops = WRITES
                        .iter()
                        .map(|op| (op.to_string(), writes))
                        .chain(READS.iter().map(|op| (op.to_string(), reads)))
                        .chain([("DELETE".to_string(), 0.0)])
                        .chain(queue.into_iter().flat_map(|usd| QUEUE.iter().map(move |op| (op.to_string(), usd))))
                        .collect();
                    (provider.to_string(), ops)
                })
                .collect(),
        )
    }

    /// These prices with `json`'s in their place: `{"s3": {"LIST": 0.0054, "GET": 0.00043}}`
    /// (dollars per 1,000 requests). Anything else is refused, naming what is wrong.
    pub fn with_overrides(mut self, json: &str) -> std::result::Result<Prices, String> {
        let given: BTreeMap<String, BTreeMap<String, f64>> = serde_json::from_str(json).map_err(|e| {
            format!(
                "request prices: {e}; expected {{\"s3\": {{\"LIST\": 0.005, ...}}, ...}} in dollars per 1,000 requests"
            )
        })?;
        for (provider, ops) in given {
            if crate::remote::StorageKind::parse(&provider).is_none_or(|k| k == crate::remote::StorageKind::Local) {
                return Err(format!("request prices: {provider:?} is not a provider (s3, gcs or azure)"));
            }
            for (op, usd) in ops {
                if !(usd.is_finite() && usd >= 0.0) {
                    return Err(format!(
                        "request prices: {provider} {op} = {usd}: give dollars per 1,000 requests, 0 or more"
                    ));
                }
                self.0.entry(provider.clone()).or_default().insert(op, usd);
            }
        }
        Ok(self)
    }

    /// What `counts` of `provider`'s requests cost in dollars, and which of its operations
    /// have no price (not counted in it).
    pub fn cost(&self, provider: &str, counts: &BTreeMap<String, f64>) -> (f64, Vec<String>) {
        let table = self.0.get(provider);
        let mut usd = 0.0;
        let mut unpriced = Vec::new();
        for (op, n) in counts.iter().filter(|(_, n)| **n > 0.0) {
            match table.and_then(|t| t.get(op)) {
                Some(p) => usd += p * n / 1000.0,
                None => unpriced.push(op.clone()),
            }
        }
        (usd, unpriced)
    }
}

/// A storage whose requests are counted in `requests`.
pub struct Counted<S> {
    inner: S,
    requests: Requests,
}

impl<S> Counted<S> {
    pub fn new(inner: S, requests: Requests) -> Self {
        Counted { inner, requests }
    }

    pub fn requests(&self) -> &Requests {
        &self.requests
    }
}

#[async_trait]
impl<S> RemoteStorage for Counted<S>
where
    S: std::ops::Deref + Send + Sync + 'static,
    S::Target: RemoteStorage,
{
    fn describe(&self) -> String {
        self.inner.describe()
    }

    async fn stat(&self, key: &str) -> Result<Option<RemoteObject>> {
        self.requests.count("HEAD");
        self.inner.stat(key).await
    }

    async fn list(&self, prefix: &str, start_after: Option<&str>, page: Option<&str>, max: usize) -> Result<ListPage> {
        self.requests.count("LIST");
        self.inner.list(prefix, start_after, page, max).await
    }

    fn lists_from_anywhere(&self) -> bool {
        self.inner.lists_from_anywhere()
    }

    async fn get(&self, key: &str, range: Option<ByteRange>, if_etag: Option<&str>) -> Result<ByteStream> {
        self.requests.count("GET");
        self.inner.get(key, range, if_etag).await
    }

    async fn put(&self, key: &str, body: Bytes, metadata: BTreeMap<String, String>) -> Result<RemoteObject> {
        self.requests.count("PUT");
        self.inner.put(key, body, metadata).await
    }

    async fn put_with_headers(
        &self,
        key: &str,
        body: Bytes,
        metadata: BTreeMap<String, String>,
        headers: &ObjectHeaders,
    ) -> Result<RemoteObject> {
        self.requests.count("PUT");
        self.inner.put_with_headers(key, body, metadata, headers).await
    }

    async fn put_stream(
        &self,
        key: &str,
        body: ByteStream,
        size: u64,
        metadata: BTreeMap<String, String>,
        headers: &ObjectHeaders,
    ) -> Result<RemoteObject> {
        self.requests.count(if size > PART as u64 { "MULTIPART" } else { "PUT" });
        self.inner.put_stream(key, body, size, metadata, headers).await
    }

    async fn put_in_parts(
        &self,
        key: &str,
        body: ByteStream,
        size: u64,
        metadata: BTreeMap<String, String>,
        headers: &ObjectHeaders,
    ) -> Result<RemoteObject> {
        self.requests.count("MULTIPART");
        self.inner.put_in_parts(key, body, size, metadata, headers).await
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.requests.count("DELETE");
        self.inner.delete(key).await
    }

    async fn copy(
        &self,
        from: &str,
        to: &str,
        if_etag: &str,
        metadata: BTreeMap<String, String>,
        headers: &ObjectHeaders,
    ) -> Result<RemoteObject> {
        self.requests.count("COPY");
        self.inner.copy(from, to, if_etag, metadata, headers).await
    }
}

#[cfg(test)]
mod price_tests {
    use super::*;

    #[test]
    fn requests_are_priced_per_thousand_and_overridden_by_operation() {
        let p = Prices::list();
        let counts: BTreeMap<String, f64> =
            [("LIST".to_string(), 2000.0), ("HEAD".into(), 10_000.0), ("DELETE".into(), 5.0)].into();
        let (usd, unpriced) = p.cost("s3", &counts);
        assert!((usd - (2.0 * 0.005 + 10.0 * 0.0004)).abs() < 1e-12, "{usd}");
        assert!(unpriced.is_empty());
        let q: BTreeMap<String, f64> = [(RECEIVE.to_string(), 1000.0)].into();
        assert_eq!(p.cost("azure", &q).1, vec![RECEIVE.to_string()], "Azure's queue has no list price here");
        let mine = p.clone().with_overrides(r#"{"s3": {"LIST": 0.01}, "azure": {"RECEIVE": 0.0001}}"#).unwrap();
        assert!((mine.cost("s3", &counts).0 - (2.0 * 0.01 + 10.0 * 0.0004)).abs() < 1e-12);
        assert!(mine.cost("azure", &q).1.is_empty());
        for bad in [r#"{"local": {"LIST": 1}}"#, r#"{"s3": {"LIST": -1}}"#, r#"{"s3": 3}"#, "not json"] {
            let e = p.clone().with_overrides(bad).unwrap_err();
            assert!(e.starts_with("request prices: "), "{e}");
        }
    }
}

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

//! A bucket whose LIST pages answer after a delay, as a real bucket's round trip does (50–200
//! ms a page, however fast the client), counting the LISTs in flight at once: for the tests and
//! benchmarks of a listing in key ranges.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tidemark_core::remote::{ListPage, RemoteObject};
use tidemark_core::{ByteRange, ByteStream, RemoteStorage, Result};

/// `inner` with every LIST answered after `delay`; the other calls pass as they are.
pub struct SlowLists<S> {
    pub inner: S,
    delay: Duration,
    now: AtomicUsize,
    most: AtomicUsize,
}

impl<S> SlowLists<S> {
    pub fn new(inner: S, delay: Duration) -> Self {
        SlowLists { inner, delay, now: AtomicUsize::new(0), most: AtomicUsize::new(0) }
    }

    /// The most LISTs in flight at once since the last [`reset`](Self::reset).
    pub fn most_at_once(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }

    pub fn reset(&self) {
        self.most.store(0, Ordering::SeqCst);
    }
}

#[async_trait]
impl<S: RemoteStorage> RemoteStorage for SlowLists<S> {
    fn describe(&self) -> String {
        format!("{} (LIST after {:?})", self.inner.describe(), self.delay)
    }
    async fn stat(&self, key: &str) -> Result<Option<RemoteObject>> {
        self.inner.stat(key).await
    }
    async fn list(&self, prefix: &str, after: Option<&str>, token: Option<&str>, max: usize) -> Result<ListPage> {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        self.inner.list(prefix, after, token, max).await
    }
    fn lists_from_anywhere(&self) -> bool {
        self.inner.lists_from_anywhere()
    }
    async fn get(&self, key: &str, range: Option<ByteRange>, if_etag: Option<&str>) -> Result<ByteStream> {
        self.inner.get(key, range, if_etag).await
    }
    async fn put(&self, key: &str, body: Bytes, metadata: BTreeMap<String, String>) -> Result<RemoteObject> {
        self.inner.put(key, body, metadata).await
    }
    async fn delete(&self, key: &str) -> Result<()> {
        self.inner.delete(key).await
    }
}

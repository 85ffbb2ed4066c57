//! An in-process bucket: a sorted map of keys to bytes and metadata. For the simulation and the
//! benchmarks (no I/O at all), and as a reference model of the `RemoteStorage` contract.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;

use tidemark_core::remote::{ListPage, RemoteObject};
use tidemark_core::{ByteRange, ByteStream, Clock, Error, RemoteStorage, Result, SystemClock};

#[derive(Default)]
struct Inner {
    objects: BTreeMap<String, (Bytes, RemoteObject)>,
}

/// How many calls of each kind a `MemoryStorage` has served.
#[derive(Debug, Default)]
pub struct CallCounts {
    pub stat: AtomicU64,
    pub list: AtomicU64,
    pub get: AtomicU64,
    pub put: AtomicU64,
    pub delete: AtomicU64,
}

#[derive(Clone)]
pub struct MemoryStorage {
    inner: Arc<Mutex<Inner>>,
    etags: Arc<AtomicU64>,
    clock: Arc<dyn Clock>,
    pub calls: Arc<CallCounts>,
}

impl Default for MemoryStorage {
    fn default() -> Self {
        Self::new(Arc::new(SystemClock))
    }
}

impl MemoryStorage {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        MemoryStorage { inner: Arc::default(), etags: Arc::default(), clock, calls: Arc::default() }
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>> {
        self.inner.lock().map_err(|_| Error::internal("memory storage poisoned"))
    }

    /// Inserts an object directly (test set-up and benchmarks), returning its metadata.
    pub fn insert(&self, key: &str, body: Bytes, metadata: BTreeMap<String, String>) -> Result<RemoteObject> {
        let n = self.etags.fetch_add(1, Ordering::Relaxed) + 1;
        let obj = RemoteObject {
            key: key.to_string(),
            size: body.len() as u64,
            etag: format!("m{n:x}"),
            last_modified_ms: self.clock.now_ms(),
            version_id: None,
            user_metadata: Some(metadata),
            headers: None,
        };
        self.lock()?.objects.insert(key.to_string(), (body, obj.clone()));
        Ok(obj)
    }

    pub fn remove(&self, key: &str) -> Result<()> {
        self.lock()?.objects.remove(key);
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.inner.lock().map(|i| i.objects.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait]
impl RemoteStorage for MemoryStorage {
    fn describe(&self) -> String {
        "memory:".into()
    }

    async fn stat(&self, key: &str) -> Result<Option<RemoteObject>> {
        self.calls.stat.fetch_add(1, Ordering::Relaxed);
        Ok(self.lock()?.objects.get(key).map(|(_, o)| o.clone()))
    }

    async fn list(&self, prefix: &str, start_after: Option<&str>, page: Option<&str>, max: usize) -> Result<ListPage> {
        self.calls.list.fetch_add(1, Ordering::Relaxed);
        let max = max.max(1);
        let inner = self.lock()?;
        let lower = match page.or(start_after) {
            Some(a) if a >= prefix => Bound::Excluded(a.to_string()),
            _ => Bound::Included(prefix.to_string()),
        };
        let mut objects: Vec<RemoteObject> = inner
            .objects
            .range((lower, Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .take(max + 1)
            .map(|(_, (_, o))| RemoteObject { user_metadata: None, ..o.clone() })
            .collect();
        let more = objects.len() > max;
        objects.truncate(max);
        let next = if more { objects.last().map(|o| o.key.clone()) } else { None };
        Ok(ListPage { objects, next })
    }

    async fn get(&self, key: &str, range: Option<ByteRange>, if_etag: Option<&str>) -> Result<ByteStream> {
        self.calls.get.fetch_add(1, Ordering::Relaxed);
        let (body, obj) = self.lock()?.objects.get(key).cloned().ok_or_else(|| Error::not_found(key))?;
        if if_etag.is_some_and(|e| e != obj.etag) {
            return Err(Error::PreconditionFailed { path: key.into(), current: None });
        }
        let bytes = match range {
            None => body,
            Some(r) => {
                let start = (r.offset as usize).min(body.len());
                let end = r.length.map_or(body.len(), |n| start.saturating_add(n as usize).min(body.len()));
                body.slice(start..end)
            }
        };
        Ok(futures::stream::once(async move { Ok(bytes) }).boxed())
    }

    async fn put(&self, key: &str, body: Bytes, metadata: BTreeMap<String, String>) -> Result<RemoteObject> {
        self.calls.put.fetch_add(1, Ordering::Relaxed);
        self.insert(key, body, metadata)
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.calls.delete.fetch_add(1, Ordering::Relaxed);
        self.remove(key)
    }
}

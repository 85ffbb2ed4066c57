//! Adapters between the engine and the simulated world. Two kinds:
//!
//! - **Checkers** see every call and record violations of the properties as they happen: a
//!   fenced write that landed although its generation is no longer the lease's, an
//!   acknowledgement of a message whose change the namespace does not reflect.
//! - **Breakers** turn the correct engine into the deliberately broken variants the simulation
//!   must catch, without touching production code: one strips the fence from every write, one
//!   acknowledges every delivery on receipt, one answers HEAD from the last event's payload, one
//!   makes every notification claim it was sent long ago, so that the slice's memory of its
//!   HEADs answers notifications of changes those HEADs never saw.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tidemark_core::cache::CacheOutcome;

use tidemark_core::events::{AckReport, Decoded, Delivery, EventSource, Provider, decode};
use tidemark_core::model::{Applied, ChangeRecord, Entry, Fence, Lease, Page, Txn, TxnBatch};
use tidemark_core::remote::{ListPage, RemoteObject};
use tidemark_core::{ByteRange, ByteStream, DeleteOptions, Error, Filer, Health, RemoteStorage, Result, WriteOptions};

use crate::queue::SimQueue;
use crate::rng::hash;

pub type Violations = Arc<Mutex<Vec<String>>>;

/// The last event payload received per key (`None`: a removal), for the payload-trusting variant.
pub type Payloads = Arc<Mutex<BTreeMap<String, Option<RemoteObject>>>>;

pub fn violate(v: &Violations, what: String) {
    v.lock().unwrap_or_else(|p| p.into_inner()).push(what);
}

/// A worker's view of the filer: checks that every fenced write that succeeds carries the
/// lease's current generation; with `strip_fence` (a broken variant) it drops the fence first.
pub struct FencedFiler {
    pub inner: Arc<dyn Filer>,
    pub strip_fence: bool,
    pub violations: Violations,
    pub worker: String,
}

impl FencedFiler {
    /// Records a violation if a write with `fence` landed although the lease has moved on.
    async fn check_landed(&self, fence: Option<Fence>) -> Result<()> {
        if let Some(f) = fence {
            let current = self.inner.lease_get(&f.lease).await?;
            if current.as_ref().is_none_or(|l| l.generation != f.generation) {
                violate(
                    &self.violations,
                    format!(
                        "{}: a write with lease generation {} landed while the lease is at {:?}",
                        self.worker,
                        f.generation,
                        current.map(|l| l.generation)
                    ),
                );
            }
        }
        Ok(())
    }
}

#[async_trait]
impl Filer for FencedFiler {
    async fn health(&self) -> Result<Health> {
        self.inner.health().await
    }
    async fn stat(&self, path: &str) -> Result<Option<Entry>> {
        self.inner.stat(path).await
    }
    async fn list(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page> {
        self.inner.list(dir, start_after, limit).await
    }
    async fn scan(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page> {
        self.inner.scan(dir, start_after, limit).await
    }
    async fn count(&self, dir: &str, except: Option<&str>) -> Result<u64> {
        self.inner.count(dir, except).await
    }
    async fn read(&self, path: &str, range: Option<ByteRange>) -> Result<(Entry, ByteStream)> {
        self.inner.read(path, range).await
    }
    async fn write(&self, path: &str, body: ByteStream, opts: WriteOptions) -> Result<Entry> {
        self.inner.write(path, body, opts).await
    }
    async fn delete(&self, path: &str, opts: DeleteOptions) -> Result<Applied> {
        self.inner.delete(path, opts).await
    }
    async fn stat_many(&self, paths: &[String]) -> Result<Vec<Option<Entry>>> {
        self.inner.stat_many(paths).await
    }
    async fn apply(&self, mut txn: Txn) -> Result<Applied> {
        let fence = txn.fence.clone();
        if self.strip_fence {
            txn.fence = None;
        }
        let out = self.inner.apply(txn).await?;
        self.check_landed(fence).await?;
        Ok(out)
    }
    async fn apply_many(&self, mut batch: TxnBatch) -> Result<Vec<Result<Applied>>> {
        let fence = batch.fence.clone();
        if self.strip_fence {
            batch.fence = None;
        }
        let out = self.inner.apply_many(batch).await?;
        if out.iter().any(|r| r.is_ok()) {
            self.check_landed(fence).await?;
        }
        Ok(out)
    }
    async fn lease_acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Lease> {
        self.inner.lease_acquire(name, holder, ttl).await
    }
    async fn lease_renew(&self, fence: &Fence, ttl: Duration) -> Result<Lease> {
        self.inner.lease_renew(fence, ttl).await
    }
    async fn lease_release(&self, fence: &Fence) -> Result<()> {
        self.inner.lease_release(fence).await
    }
    async fn lease_get(&self, name: &str) -> Result<Option<Lease>> {
        self.inner.lease_get(name).await
    }
    async fn changes(&self, after: u64, limit: usize, wait: Duration) -> Result<Vec<ChangeRecord>> {
        self.inner.changes(after, limit, wait).await
    }
    async fn cache_fetch(&self, path: &str, wait: bool) -> Result<CacheOutcome> {
        self.inner.cache_fetch(path, wait).await
    }
}

/// What the bucket has been: every key's states in order, by a global version number.
#[derive(Default, Debug)]
pub struct History {
    /// etag → the version that wrote it.
    pub etag_version: BTreeMap<String, u64>,
    /// key → (version, exists) for every change.
    pub changes: BTreeMap<String, Vec<(u64, bool)>>,
    /// etag → the bytes of that object version (what a read of an entry at that etag must return).
    pub content: BTreeMap<String, Bytes>,
}

impl History {
    /// Whether the namespace's `entry` for `key` reflects a bucket state at least as new as
    /// `version` (or a local write, which wins).
    pub fn reflects(&self, key: &str, entry: Option<&Entry>, version: u64) -> bool {
        match entry {
            Some(e) if tidemark_core::decide::is_locally_dirty(e) => true,
            Some(e) => e.remote.as_ref().and_then(|r| self.etag_version.get(&r.etag)).is_some_and(|v| *v >= version),
            None => self.changes.get(key).is_some_and(|c| c.iter().any(|(v, exists)| !exists && *v >= version)),
        }
    }
}

/// The queue as a worker sees it: checks each acknowledgement against the namespace; with
/// `ack_first` (a broken variant) it acknowledges every delivery as soon as it is received.
pub struct CheckedQueue {
    pub queue: SimQueue,
    pub filer: Arc<dyn Filer>,
    pub history: Arc<Mutex<History>>,
    pub dir: String,
    pub ack_first: bool,
    /// Every delivery claims it was sent long ago (the memory-trusting variant).
    pub forge_sent: bool,
    pub violations: Violations,
    /// The last event payload received per key, for the payload-trusting variant.
    pub payloads: Payloads,
}

impl CheckedQueue {
    async fn check(&self, receipts: &[String]) -> Result<()> {
        for r in receipts {
            let Some(m) = self.queue.message_of(r) else { continue };
            let path = format!("{}/{}", self.dir, m.key);
            let entry = self.filer.stat(&path).await?;
            let mut ok =
                self.history.lock().unwrap_or_else(|p| p.into_inner()).reflects(&m.key, entry.as_ref(), m.version);
            // A user's delete waiting for the outbound sync wins over the object it deleted (the
            // final comparison catches a tombstone that hid a newer object).
            if !ok && entry.is_none() {
                ok = tidemark_engine::docs::tombstone(&*self.filer, &path).await?.is_some();
            }
            if !ok {
                violate(
                    &self.violations,
                    format!(
                        "message {} (key {:?}, version {}) acknowledged before its change was applied",
                        m.id, m.key, m.version
                    ),
                );
            }
        }
        Ok(())
    }
}

#[async_trait]
impl EventSource for CheckedQueue {
    fn describe(&self) -> String {
        self.queue.describe()
    }
    fn max_batch(&self) -> usize {
        self.queue.max_batch()
    }
    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>> {
        let got = self.queue.receive(max, wait).await?;
        {
            let mut p = self.payloads.lock().unwrap_or_else(|p| p.into_inner());
            for d in &got {
                if let Decoded::Events { events } = decode(Provider::S3, d) {
                    for e in events {
                        let obj = matches!(e.kind, tidemark_core::events::EventKind::Created).then(|| RemoteObject {
                            key: e.key.clone(),
                            size: e.size.unwrap_or(0),
                            etag: e.etag.clone().unwrap_or_default(),
                            last_modified_ms: e.event_time_ms.unwrap_or(0),
                            version_id: None,
                            user_metadata: None,
                            headers: None,
                        });
                        p.insert(e.key, obj);
                    }
                }
            }
        }
        let mut got = got;
        if self.forge_sent {
            // Every notification claims to have been sent long ago: before any HEAD.
            for d in &mut got {
                d.sent_at_ms = Some(0);
            }
        }
        if self.ack_first {
            let ids: Vec<String> = got.iter().map(|d| d.ack_id.clone()).collect();
            self.check(&ids).await?;
            self.queue.ack(&ids).await?;
        }
        Ok(got)
    }
    async fn ack(&self, ack_ids: &[String]) -> Result<AckReport> {
        self.check(ack_ids).await?;
        self.queue.ack(ack_ids).await
    }
    async fn extend(&self, ack_id: &str, by: Duration) -> Result<()> {
        self.queue.extend(ack_id, by).await
    }
    async fn release(&self, ack_id: &str, delay: Duration) -> Result<()> {
        self.queue.release(ack_id, delay).await
    }
}

/// The bucket as the applier sees it: HEADs fail transiently for some calls (decided by a hash
/// of the seed, the key and how often it was asked, so the order of concurrent calls does not
/// matter); with `trust_payload` (a broken variant) HEAD answers from the last event's payload.
pub struct SimRemote {
    pub inner: Arc<dyn RemoteStorage>,
    pub seed: u64,
    pub flaky_pct: u64,
    pub asked: Mutex<BTreeMap<String, u64>>,
    pub trust_payload: Option<Payloads>,
    /// The pre-binding echo rule (a broken variant), over this filer and mount directory: an
    /// object with this cluster's origin and a version at or below the entry's (or its
    /// tombstone's) is answered as the entry (or the deleted object) already has it, which is
    /// what taking it for an echo did.
    pub old_echo_rule: Option<(Arc<dyn Filer>, String)>,
}

impl SimRemote {
    async fn as_old_echo_rule_saw_it(&self, key: &str, o: RemoteObject) -> Result<RemoteObject> {
        use tidemark_core::decide::{ORIGIN_METADATA, VERSION_METADATA};
        let Some((filer, dir)) = &self.old_echo_rule else { return Ok(o) };
        let meta = o.user_metadata.clone().unwrap_or_default();
        if meta.get(ORIGIN_METADATA).map(String::as_str) != Some("sim-cluster") {
            return Ok(o);
        }
        let Some(v) = meta.get(VERSION_METADATA).and_then(|v| v.parse::<u64>().ok()) else { return Ok(o) };
        let path = format!("{dir}/{key}");
        match filer.stat(&path).await? {
            Some(e) if v <= e.version => Ok(match &e.remote {
                Some(r) => RemoteObject {
                    etag: r.etag.clone(),
                    last_modified_ms: r.remote_mtime_ms,
                    size: r.remote_size,
                    user_metadata: None,
                    ..o
                },
                None => o, // local-only: skipped either way
            }),
            Some(_) => Ok(o),
            None => match tidemark_engine::docs::tombstone(&**filer, &path).await? {
                Some(t) if t.version >= v => {
                    Ok(RemoteObject { etag: t.etag, last_modified_ms: t.remote_mtime_ms, user_metadata: None, ..o })
                }
                _ => Ok(o),
            },
        }
    }
}

#[async_trait]
impl RemoteStorage for SimRemote {
    fn describe(&self) -> String {
        "sim:bucket".into()
    }
    async fn stat(&self, key: &str) -> Result<Option<RemoteObject>> {
        let n = {
            let mut a = self.asked.lock().unwrap_or_else(|p| p.into_inner());
            let n = a.entry(key.to_string()).or_default();
            *n += 1;
            *n
        };
        if hash(self.seed, key, n) % 100 < self.flaky_pct {
            return Err(Error::Unavailable { message: format!("simulated HEAD failure of {key}") });
        }
        if let Some(p) = &self.trust_payload
            && let Some(o) = p.lock().unwrap_or_else(|p| p.into_inner()).get(key)
        {
            return Ok(o.clone());
        }
        match self.inner.stat(key).await? {
            Some(o) => Ok(Some(self.as_old_echo_rule_saw_it(key, o).await?)),
            None => Ok(None),
        }
    }
    async fn list(&self, prefix: &str, start_after: Option<&str>, page: Option<&str>, max: usize) -> Result<ListPage> {
        self.inner.list(prefix, start_after, page, max).await
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

/// The bucket as a reconcile lists it, with its range boundary off by one (a broken variant): a
/// listing that begins after a key (a range of a listing in key ranges, not its first) loses
/// its first key.
pub struct LosingRangeStarts(pub Arc<dyn RemoteStorage>);

#[async_trait]
impl RemoteStorage for LosingRangeStarts {
    fn describe(&self) -> String {
        self.0.describe()
    }
    async fn stat(&self, key: &str) -> Result<Option<RemoteObject>> {
        self.0.stat(key).await
    }
    async fn list(&self, prefix: &str, start_after: Option<&str>, page: Option<&str>, max: usize) -> Result<ListPage> {
        let mut p = self.0.list(prefix, start_after, page, max).await?;
        if start_after.is_some() && page.is_none() && !p.objects.is_empty() {
            p.objects.remove(0);
        }
        Ok(p)
    }
    async fn get(&self, key: &str, range: Option<ByteRange>, if_etag: Option<&str>) -> Result<ByteStream> {
        self.0.get(key, range, if_etag).await
    }
    async fn put(&self, key: &str, body: Bytes, metadata: BTreeMap<String, String>) -> Result<RemoteObject> {
        self.0.put(key, body, metadata).await
    }
    async fn delete(&self, key: &str) -> Result<()> {
        self.0.delete(key).await
    }
}

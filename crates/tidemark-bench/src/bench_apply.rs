//! `tidemark-bench apply`: what Tidemark itself costs per event. The real applier runs against
//! the in-process memory bucket and queue (zero latency), into a fresh SQLite namespace, so the
//! figure is decode + coalesce + HEAD (a map lookup) + decide + conditional write + ack. Timing
//! wrappers around the bucket, the filer and the queue split the time by stage.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;

use tidemark_cloud::memory::MemoryStorage;
use tidemark_core::events::{AckReport, Delivery, EventSource, Provider};
use tidemark_core::model::{Applied, ChangeRecord, Entry, Fence, Lease, NewEntry, Origin, Page, Txn, TxnBatch};
use tidemark_core::remote::{ListPage, Mount, RemoteLocation, RemoteObject};
use tidemark_core::subscription::EventTypes;
use tidemark_core::{
    ByteRange, ByteStream, Clock, DeleteOptions, Filer, Health, ManualClock, RemoteStorage, Result, WriteOptions,
};
use tidemark_engine::apply::{ApplyContext, Counters, apply_batch};
use tidemark_filer::{DataDir, LocalFiler};

#[derive(Default)]
pub(crate) struct Stage {
    calls: AtomicU64,
    nanos: AtomicU64,
}

impl Stage {
    async fn time<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        let t = Instant::now();
        let out = f.await;
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.nanos.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        out
    }
    pub(crate) fn secs(&self) -> f64 {
        self.nanos.load(Ordering::Relaxed) as f64 / 1e9
    }
    pub(crate) fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}

/// Time and calls per stage of applying events. `deletes` counts the delete calls the queue's
/// acks cost (an ack of N deliveries is N / max_batch delete-batch calls on SQS).
#[derive(Default)]
pub(crate) struct Stages {
    pub(crate) head: Stage,
    pub(crate) list: Stage,
    pub(crate) entry_read: Stage,
    pub(crate) write: Stage,
    pub(crate) ack: Stage,
    pub(crate) receive: Stage,
    pub(crate) deletes: AtomicU64,
    pub(crate) received: AtomicU64,
}

impl Stages {
    /// Where the time went, summed over concurrent calls.
    pub(crate) fn breakdown(&self, wall: f64) -> String {
        format!(
            "time in HEAD {:.2} s, entry read {:.2} s, conditional write {:.2} s, receive {:.2} s, ack {:.2} s (summed over concurrent calls; wall {wall:.2} s)",
            self.head.secs(),
            self.entry_read.secs(),
            self.write.secs(),
            self.receive.secs(),
            self.ack.secs()
        )
    }
}

/// A bucket whose HEAD and LIST calls are timed and counted.
#[derive(Clone)]
pub(crate) struct TimedRemote<R>(pub(crate) R, pub(crate) Arc<Stages>);

#[async_trait]
impl<R: RemoteStorage> RemoteStorage for TimedRemote<R> {
    fn describe(&self) -> String {
        self.0.describe()
    }
    async fn stat(&self, key: &str) -> Result<Option<RemoteObject>> {
        self.1.head.time(self.0.stat(key)).await
    }
    async fn list(&self, prefix: &str, start_after: Option<&str>, page: Option<&str>, max: usize) -> Result<ListPage> {
        self.1.list.time(self.0.list(prefix, start_after, page, max)).await
    }
    fn lists_from_anywhere(&self) -> bool {
        self.0.lists_from_anywhere()
    }
    async fn get(&self, key: &str, range: Option<ByteRange>, if_etag: Option<&str>) -> Result<ByteStream> {
        self.0.get(key, range, if_etag).await
    }
    async fn put(
        &self,
        key: &str,
        body: Bytes,
        metadata: std::collections::BTreeMap<String, String>,
    ) -> Result<RemoteObject> {
        self.0.put(key, body, metadata).await
    }
    async fn delete(&self, key: &str) -> Result<()> {
        self.0.delete(key).await
    }
}

/// A filer whose entry reads and conditional writes are timed.
pub(crate) struct TimedFiler(pub(crate) Arc<LocalFiler>, pub(crate) Arc<Stages>);

#[async_trait]
impl Filer for TimedFiler {
    async fn health(&self) -> Result<Health> {
        self.0.health().await
    }
    async fn stat(&self, path: &str) -> Result<Option<Entry>> {
        self.1.entry_read.time(self.0.stat(path)).await
    }
    async fn list(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page> {
        self.0.list(dir, start_after, limit).await
    }
    async fn scan(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page> {
        self.0.scan(dir, start_after, limit).await
    }
    async fn count(&self, dir: &str, except: Option<&str>) -> Result<u64> {
        self.0.count(dir, except).await
    }
    async fn read(&self, path: &str, range: Option<ByteRange>) -> Result<(Entry, ByteStream)> {
        self.0.read(path, range).await
    }
    async fn write(&self, path: &str, body: ByteStream, opts: WriteOptions) -> Result<Entry> {
        self.0.write(path, body, opts).await
    }
    async fn delete(&self, path: &str, opts: DeleteOptions) -> Result<Applied> {
        self.0.delete(path, opts).await
    }
    async fn apply(&self, txn: Txn) -> Result<Applied> {
        self.1.write.time(self.0.apply(txn)).await
    }
    async fn apply_many(&self, batch: TxnBatch) -> Result<Vec<Result<Applied>>> {
        self.1.write.time(self.0.apply_many(batch)).await
    }
    async fn stat_many(&self, paths: &[String]) -> Result<Vec<Option<Entry>>> {
        self.1.entry_read.time(self.0.stat_many(paths)).await
    }
    async fn lease_acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Lease> {
        self.0.lease_acquire(name, holder, ttl).await
    }
    async fn lease_renew(&self, fence: &Fence, ttl: Duration) -> Result<Lease> {
        self.0.lease_renew(fence, ttl).await
    }
    async fn lease_release(&self, fence: &Fence) -> Result<()> {
        self.0.lease_release(fence).await
    }
    async fn lease_get(&self, name: &str) -> Result<Option<Lease>> {
        self.0.lease_get(name).await
    }
    async fn changes(&self, after: u64, limit: usize, wait: Duration) -> Result<Vec<ChangeRecord>> {
        self.0.changes(after, limit, wait).await
    }
}

/// The bench's queue: every notification queued up front, received in order, acknowledged by
/// id, each call O(1) per delivery — so the figures are the applier's, not a queue's. (The
/// simulation's queue shuffles every visible message on every receive, which is right for
/// finding orderings and costs O(n) per call.) Nothing here expires: the bench never leaves
/// a delivery unhandled for long.
#[derive(Clone, Default)]
pub(crate) struct BenchQueue(Arc<std::sync::Mutex<BenchQueueState>>);

#[derive(Default)]
pub(crate) struct BenchQueueState {
    next: u64,
    ready: std::collections::VecDeque<(u64, Bytes, i64)>,
    in_flight: std::collections::HashMap<String, (u64, Bytes, i64)>,
}

impl BenchQueue {
    fn send(&self, body: Bytes, sent_at_ms: i64) {
        let mut q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        q.next += 1;
        let id = q.next;
        q.ready.push_back((id, body, sent_at_ms));
    }
}

#[async_trait]
impl EventSource for BenchQueue {
    fn describe(&self) -> String {
        "bench:queue".into()
    }
    fn max_batch(&self) -> usize {
        10
    }
    async fn receive(&self, max: usize, _wait: Duration) -> Result<Vec<Delivery>> {
        let mut q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        while out.len() < max.min(10) {
            let Some((id, body, sent)) = q.ready.pop_front() else { break };
            let ack_id = format!("m{id}");
            out.push(Delivery {
                ack_id: ack_id.clone(),
                body: body.clone(),
                attributes: Default::default(),
                receive_count: 1,
                sent_at_ms: Some(sent),
            });
            q.in_flight.insert(ack_id, (id, body, sent));
        }
        Ok(out)
    }
    async fn ack(&self, ack_ids: &[String]) -> Result<AckReport> {
        let mut q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        Ok(AckReport::removing(ack_ids, |id| q.in_flight.remove(id).is_some()))
    }
    async fn extend(&self, _ack_id: &str, _by: Duration) -> Result<()> {
        Ok(())
    }
    async fn release(&self, ack_id: &str, _delay: Duration) -> Result<()> {
        let mut q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = q.in_flight.remove(ack_id) {
            q.ready.push_back(m);
        }
        Ok(())
    }
}

/// A queue whose receives and acks are timed and counted.
pub(crate) struct TimedQueue<Q>(pub(crate) Q, pub(crate) Arc<Stages>);

#[async_trait]
impl<Q: EventSource> EventSource for TimedQueue<Q> {
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn max_batch(&self) -> usize {
        self.0.max_batch()
    }
    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>> {
        let got = self.1.receive.time(self.0.receive(max, wait)).await;
        if let Ok(d) = &got {
            self.1.received.fetch_add(d.len() as u64, Ordering::Relaxed);
        }
        got
    }
    async fn ack(&self, ack_ids: &[String]) -> Result<AckReport> {
        self.1.deletes.fetch_add(ack_ids.len().div_ceil(self.0.max_batch().max(1)) as u64, Ordering::Relaxed);
        self.1.ack.time(self.0.ack(ack_ids)).await
    }
    async fn extend(&self, ack_id: &str, by: Duration) -> Result<()> {
        self.0.extend(ack_id, by).await
    }
    async fn release(&self, ack_id: &str, delay: Duration) -> Result<()> {
        self.0.release(ack_id, delay).await
    }
}

/// Receives and applies until `expected` deliveries were handled, as a slice does (a receive, a
/// backlog gathered into a larger batch, the batch applied and acknowledged), giving up after
/// 60 s without a delivery. Returns the number of batches.
async fn drain(
    filer: &dyn Filer,
    remote: &dyn RemoteStorage,
    source: &dyn EventSource,
    ctx: &ApplyContext<'_>,
    expected: u64,
    wait: Duration,
    counters: &mut Counters,
) -> std::result::Result<u64, String> {
    let mut batches = 0u64;
    let mut idle_since = Instant::now();
    while counters.applied + counters.ignored < expected {
        let batch = source.receive(source.max_batch(), wait).await.map_err(|e| e.to_string())?;
        if batch.is_empty() {
            if idle_since.elapsed() > Duration::from_secs(60) {
                return Err(format!(
                    "only {} of {expected} notifications arrived and were applied within 60 s ({} failed)",
                    counters.applied + counters.ignored,
                    counters.failed
                ));
            }
            if wait.is_zero() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            continue;
        }
        idle_since = Instant::now();
        let batch = tidemark_engine::slice::gather(source, batch).await;
        batches += 1;
        apply_batch(filer, remote, source, ctx, batch, counters).await.map_err(|e| e.to_string())?;
    }
    Ok(batches)
}

fn notification(key: &str, o: &RemoteObject, now_ms: i64) -> Bytes {
    let body = serde_json::json!({"Records": [{
        "eventVersion": "2.1", "eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
        "eventTime": tidemark_core::format_rfc3339_ms(now_ms),
        "s3": {"bucket": {"name": "b"}, "object": {"key": key, "size": o.size, "eTag": o.etag}},
    }]});
    Bytes::from(body.to_string())
}

pub async fn run(
    events: usize,
    keys: Option<usize>,
    concurrency: usize,
    filers: usize,
    data_dir: Option<std::path::PathBuf>,
    store: Option<String>,
) -> std::result::Result<(), String> {
    let keys = keys.unwrap_or(events).clamp(1, events.max(1));
    let filers = filers.max(1);
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let dir = data_dir.unwrap_or_else(|| tmp.path().to_path_buf());
    if filers > 1 && !store.as_deref().is_some_and(|s| s.starts_with("postgres")) {
        return Err("--filers above 1 needs --store postgres://...: only a shared store has several filers".into());
    }
    // Each filer is what a `tidemark filer` process holds: its own data directory and its own
    // connections to the store.
    let mut all = Vec::with_capacity(filers);
    for n in 0..filers {
        let data_dir = DataDir::open(dir.join(format!("filer{n}"))).map_err(|e| e.to_string())?;
        let filer = match store.as_deref() {
            Some(url) if url.starts_with("postgres") => {
                let pg = tidemark_store::PgStore::connect(url).await.map_err(|e| e.to_string())?;
                LocalFiler::open_with_store(data_dir, Arc::new(pg))
            }
            Some(other) => {
                return Err(format!("--store {other:?}: the bench measures the default SQLite or postgres://..."));
            }
            None => LocalFiler::open(data_dir),
        };
        all.push(Arc::new(filer.map_err(|e| e.to_string())?));
    }
    let stages = Arc::new(Stages::default());
    let clock = ManualClock::new(1_800_000_000_000);
    let bucket = MemoryStorage::new(Arc::new(clock.clone()));
    let queues: Vec<BenchQueue> = (0..filers).map(|_| BenchQueue::default()).collect();
    let mount = Mount {
        dir: "/mnt/bench".into(),
        location: RemoteLocation { storage: "mem".into(), bucket: "b".into(), path: String::new() },
        sync: false,
    };
    all[0].apply(Txn::put(&mount.dir, NewEntry::dir(0), Origin::System)).await.map_err(|e| e.to_string())?;
    // Every event names a key whose object exists; with fewer keys than events, each key is
    // overwritten several times and its notifications arrive in one burst. With several filers,
    // each has the queue of its own keys.
    for i in 0..events {
        let k = i % keys;
        let key = format!("d{:02}/obj-{:08}.bin", k % 100, k);
        let o =
            bucket.insert(&key, Bytes::from(vec![b'x'; 1 + i % 64]), Default::default()).map_err(|e| e.to_string())?;
        queues[k % filers].send(notification(&key, &o, clock.now_ms()), clock.now_ms());
    }
    // The burst was queued before the workers look: their HEADs start after every notification
    // was sent (by more than the clock-skew margin), as for any backlog.
    clock.advance_ms(2 * tidemark_engine::recent::SKEW_MARGIN_MS);
    let remote = TimedRemote(bucket.clone(), stages.clone());
    let types = EventTypes::default();
    let heads_before = bucket.calls.stat.load(Ordering::Relaxed);
    let began = Instant::now();
    // Each filer's applier is a task of its own, as in its own process: the filers' work runs
    // on every core the runtime has, not interleaved in one task.
    let runs = all.iter().zip(&queues).map(|(filer, queue)| {
        let (stages, remote, mount, types, clock) =
            (stages.clone(), remote.clone(), mount.clone(), types.clone(), clock.clone());
        let (filer, queue) = (filer.clone(), queue.clone());
        tokio::spawn(async move {
            let (remote, mount, types, clock) = (&remote, &mount, &types, &clock);
            let timed_filer = TimedFiler(filer, stages.clone());
            let source = TimedQueue(queue.clone(), stages);
            let recent = tidemark_engine::recent::RecentHeads::new();
            let ctx = ApplyContext {
                mount,
                provider: Provider::S3,
                event_types: types,
                cluster_id: Some("bench"),
                fence: None,
                concurrency,
                retry_delay: Duration::from_secs(1),
                visibility: Duration::ZERO,
                clock,
                prefetch: None,
                recent: Some(&recent),
                max_receives: None,
            };
            let expected = queue.0.lock().unwrap_or_else(|p| p.into_inner()).ready.len() as u64;
            let mut counters = Counters::default();
            let batches = drain(&timed_filer, remote, &source, &ctx, expected, Duration::ZERO, &mut counters).await?;
            Ok::<_, String>((batches, counters))
        })
    });
    let results = futures::future::join_all(runs).await;
    let wall = began.elapsed().as_secs_f64();
    let mut counters = Counters::default();
    let mut batches = 0;
    for r in results {
        let (b, c) = r.map_err(|e| format!("a filer's run failed: {e}"))??;
        batches += b;
        counters.applied += c.applied;
        counters.received += c.received;
        counters.failed += c.failed;
        counters.changes += c.changes;
        counters.heads_saved += c.heads_saved;
    }
    let heads = bucket.calls.stat.load(Ordering::Relaxed) - heads_before;
    println!(
        "bench apply: {events} notifications over {keys} keys, {filers} filer{} on the store, HEADs {concurrency} at once, receives of {} gathered up to {} (store: {})",
        if filers == 1 { "" } else { "s" },
        queues[0].max_batch(),
        tidemark_engine::slice::GATHER,
        match &store {
            Some(_) => "PostgreSQL".to_string(),
            None if dir == tmp.path() => "SQLite in a temporary directory".to_string(),
            None => format!("SQLite in {}", dir.display()),
        }
    );
    println!(
        "  {:.2} s: {:.0} events/s applied ({} applied, {} received, {} failed), {} entries changed, {batches} batches",
        wall,
        counters.applied as f64 / wall,
        counters.applied,
        counters.received,
        counters.failed,
        counters.changes
    );
    println!(
        "  HEAD calls: {heads} for {keys} distinct keys ({:.2} per key; {} answered by an earlier HEAD of the slice)",
        heads as f64 / keys as f64,
        counters.heads_saved
    );
    let parts = [
        ("HEAD (memory bucket)", &stages.head),
        ("entry read (store, batched)", &stages.entry_read),
        ("conditional write (store, batched)", &stages.write),
        ("ack (memory queue)", &stages.ack),
        ("receive (memory queue)", &stages.receive),
    ];
    let summed: f64 = parts.iter().map(|(_, s)| s.secs()).sum();
    println!("  per stage (time summed over concurrent calls; wall {wall:.2} s):");
    for (name, s) in parts {
        println!(
            "    {name:<34} {:>8} calls {:>8.3} s {:>6.1} µs/call",
            s.calls(),
            s.secs(),
            if s.calls() == 0 { 0.0 } else { s.secs() * 1e6 / s.calls() as f64 }
        );
    }
    if filers == 1 {
        // One batch at a time: the stages add up to the wall time but for the HEADs, which
        // overlap at concurrency above 1.
        println!(
            "    {:<34} {:>23.3} s (decode, coalesce, decide, bookkeeping: wall minus the stages{})",
            "the rest",
            (wall - summed).max(0.0),
            if concurrency == 1 { "" } else { ", HEADs overlapping" }
        );
        println!("    per event, all in: {:.1} µs", wall * 1e6 / counters.applied.max(1) as f64);
    } else {
        println!("    (stages overlap: {filers} filers write at once)");
    }
    Ok(())
}

//! `tidemark-bench s3`: the end-to-end figures against an S3-compatible endpoint that also serves
//! SQS (moto in `scripts/bench.sh`), each reported as a ratio to what a plain client achieves
//! against the same server in the same run — absolute times on shared machines drift, ratios
//! measured side by side do not.
//!
//! - Apply throughput: a backlog of N notifications (N object puts into a bucket whose
//!   notifications go to an SQS queue), drained by a real slice into a fresh SQLite
//!   namespace, at several concurrencies; the limit is the SDK doing the calls each event needs
//!   (one HEAD at the same concurrency, and a tenth of a receive and of a delete batch).
//! - API cost per applied event, counted on the calls Tidemark made.
//! - Reconcile of a bucket of M objects, baseline and no-change, against the raw LIST of it.
//!
//! It creates buckets and a queue named `tidemark-bench-<run>`; meant for an emulator.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use futures::{StreamExt, TryStreamExt};

use tidemark_cloud::aws::provision::S3Notifications;
use tidemark_cloud::aws::s3::S3Storage;
use tidemark_cloud::aws::sqs::SqsSource;
use tidemark_core::events::Provider;
use tidemark_core::model::{NewEntry, Origin, Txn};
use tidemark_core::remote::{Mount, RemoteConf, RemoteLocation, StorageKind};
use tidemark_core::subscription::{
    EventTypes, Identity, ManagedResources, SubscriptionDoc, SubscriptionOptions, Topology,
};
use tidemark_core::{Clock, Filer, RemoteStorage, SystemClock};
use tidemark_engine::apply::Counters;
use tidemark_engine::reconcile::{ReconcileOptions, reconcile};
use tidemark_engine::slice::{GATHER, ReconcileMarker, Slice, SliceEnd, SliceObserver, marker_path};
use tidemark_filer::{CacheConfig, DataDir, LocalFiler};

use crate::bench_apply::{Stages, TimedFiler, TimedQueue, TimedRemote};

#[derive(Args)]
pub struct S3Bench {
    #[command(flatten)]
    endpoint: Endpoint,
    /// Notifications per apply run (each run puts this many new objects first). moto's receive
    /// scans its whole queue, so much larger backlogs measure moto rather than Tidemark.
    #[arg(long, default_value_t = 300)]
    events: usize,
    /// The apply concurrencies to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    concurrency: Vec<usize>,
    /// Objects in the bucket the reconcile runs against (0: skip the reconcile).
    #[arg(long, default_value_t = 10_000)]
    objects: usize,
    /// Concurrent puts while filling the buckets.
    #[arg(long, default_value_t = 16)]
    put_concurrency: usize,
}

/// An S3-compatible endpoint and its credentials.
#[derive(Args, Clone)]
pub struct Endpoint {
    /// The S3 endpoint (for `bench s3`, one that serves SQS too, as moto does).
    #[arg(long, env = "TIDEMARK_BENCH_S3_ENDPOINT")]
    pub endpoint: String,
    /// The endpoint's access key (moto takes any).
    #[arg(long, default_value = "testing")]
    pub access_key: String,
    /// The endpoint's secret key.
    #[arg(long, default_value = "testing", hide_default_value = true)]
    pub secret_key: String,
    #[arg(long, default_value = "us-east-1")]
    pub region: String,
}

/// A name unique to this run (milliseconds since the epoch, in hex).
pub(crate) fn run_id() -> String {
    format!("{:x}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis())
}

impl Endpoint {
    /// A new bucket `PREFIX-RUN` on this endpoint, with the run id and a storage client for it.
    pub(crate) async fn fresh_bucket(&self, prefix: &str) -> Result<(String, String, S3Storage), String> {
        let run = run_id();
        let bucket = format!("{prefix}-{run}");
        let storage = S3Storage::connect(&self.conf(), &bucket).await.map_err(err)?;
        create_bucket(storage.client(), &bucket)
            .await
            .map_err(|e| format!("{e} (is {} an S3 endpoint?)", self.endpoint))?;
        Ok((run, bucket, storage))
    }

    /// The remote `bench` on this endpoint.
    pub(crate) fn conf(&self) -> RemoteConf {
        RemoteConf {
            name: "bench".into(),
            kind: StorageKind::S3,
            settings: [
                ("endpoint", &self.endpoint),
                ("access_key", &self.access_key),
                ("secret_key", &self.secret_key),
                ("region", &self.region),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        }
    }
}

pub(crate) fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// An SDK call's failure in one line: an unreachable endpoint says so, anything else in full.
pub(crate) fn sdk_err<E: std::error::Error + 'static, R: std::fmt::Debug>(
    op: &str,
    e: aws_sdk_s3::error::SdkError<E, R>,
) -> String {
    use aws_sdk_s3::error::SdkError;
    match &e {
        SdkError::DispatchFailure(d) => {
            // The connector's own message is "io error"; the cause is at the end of the chain.
            let mut cause: Option<&(dyn std::error::Error + 'static)> =
                d.as_connector_error().map(|c| c as &(dyn std::error::Error + 'static));
            let mut last = String::from("dispatch failure");
            while let Some(c) = cause {
                last = c.to_string();
                cause = c.source();
            }
            format!("{op}: cannot reach the endpoint ({last})")
        }
        SdkError::TimeoutError(_) => format!("{op}: the endpoint timed out"),
        _ => format!("{op}: {}", aws_sdk_s3::error::DisplayErrorContext(&e)),
    }
}

/// Puts `keys` (small distinct bodies) `concurrency` at a time; returns the seconds it took.
async fn put_all(storage: &dyn RemoteStorage, keys: &[String], concurrency: usize) -> Result<f64, String> {
    let t = Instant::now();
    futures::stream::iter(keys.iter().enumerate())
        .map(|(i, k)| async move { storage.put(k, Bytes::from(format!("object {i}")), Default::default()).await })
        .buffer_unordered(concurrency.max(1))
        .try_for_each(|_| async { Ok(()) })
        .await
        .map_err(err)?;
    Ok(t.elapsed().as_secs_f64())
}

/// The plain client: `keys.len()` HEADs through the SDK, `concurrency` at a time.
async fn raw_heads(s3: &aws_sdk_s3::Client, bucket: &str, keys: &[String], concurrency: usize) -> Result<f64, String> {
    let t = Instant::now();
    futures::stream::iter(keys)
        .map(|k| async move { s3.head_object().bucket(bucket).key(k).send().await })
        .buffer_unordered(concurrency.max(1))
        .try_for_each(|_| async { Ok(()) })
        .await
        .map_err(|e| sdk_err("HeadObject", e))?;
    Ok(t.elapsed().as_secs_f64())
}

/// The plain client's receive-and-delete: `n` messages of `body` sent to a scratch queue, then
/// received 10 at a time and deleted in batches of 10 — after each receive (`gather` 1), or
/// after `gather` receives as a slice gathers a backlog. Returns (seconds, receive calls, delete
/// calls) of the draining alone.
async fn raw_receive_delete(
    sqs: &aws_sdk_sqs::Client,
    name: &str,
    n: usize,
    body: &str,
    gather: usize,
) -> Result<(f64, u64, u64), String> {
    use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
    let sdk = |e: &dyn std::fmt::Debug| format!("SQS on the scratch queue {name}: {e:?}");
    let url = sqs.create_queue().queue_name(name).send().await.map_err(|e| sdk(&e))?;
    let url = url.queue_url().unwrap_or_default().to_string();
    for chunk in (0..n).collect::<Vec<_>>().chunks(10) {
        let entries = chunk
            .iter()
            .map(|i| SendMessageBatchRequestEntry::builder().id(i.to_string()).message_body(body).build())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| sdk(&e))?;
        sqs.send_message_batch().queue_url(&url).set_entries(Some(entries)).send().await.map_err(|e| sdk(&e))?;
    }
    let (mut got, mut receives, mut deletes) = (0usize, 0u64, 0u64);
    let mut handles: Vec<String> = Vec::new();
    let t = Instant::now();
    while got < n {
        let out = sqs
            .receive_message()
            .queue_url(&url)
            .max_number_of_messages(10)
            .wait_time_seconds(if handles.is_empty() { 1 } else { 0 })
            .send()
            .await
            .map_err(|e| sdk(&e))?;
        receives += 1;
        let before = handles.len();
        handles.extend(out.messages().iter().filter_map(|m| m.receipt_handle().map(str::to_string)));
        let fresh = handles.len() - before;
        got += fresh;
        if fresh == 0 && handles.is_empty() && t.elapsed() > Duration::from_secs(60) {
            return Err(format!("the scratch queue {name} gave {got} of {n} messages in 60 s"));
        }
        if handles.len() < gather * 10 && fresh == 10 && got < n {
            continue; // as a slice gathers: a full receive means a backlog, so receive more first
        }
        for chunk in handles.chunks(10) {
            delete_batch(sqs, &url, &chunk.iter().map(String::as_str).collect::<Vec<_>>()).await?;
            deletes += 1;
        }
        handles.clear();
    }
    let secs = t.elapsed().as_secs_f64();
    let _ = sqs.delete_queue().queue_url(&url).send().await;
    Ok((secs, receives, deletes))
}

/// The plain client's delete: one `DeleteMessageBatch` of up to 10 receipt handles.
async fn delete_batch(sqs: &aws_sdk_sqs::Client, url: &str, handles: &[&str]) -> Result<(), String> {
    use aws_sdk_sqs::types::DeleteMessageBatchRequestEntry;
    let entries = handles
        .iter()
        .enumerate()
        .map(|(i, h)| DeleteMessageBatchRequestEntry::builder().id(i.to_string()).receipt_handle(*h).build())
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    sqs.delete_message_batch()
        .queue_url(url)
        .set_entries(Some(entries))
        .send()
        .await
        .map_err(|e| format!("DeleteMessageBatch {url}: {}", aws_sdk_sqs::error::DisplayErrorContext(e)))?;
    Ok(())
}

/// Waits until the queue holds `n` visible messages: the puts' notifications have all arrived.
async fn wait_queued(sqs: &aws_sdk_sqs::Client, url: &str, n: usize) -> Result<(), String> {
    use aws_sdk_sqs::types::QueueAttributeName;
    let t = Instant::now();
    loop {
        let out = sqs
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .send()
            .await
            .map_err(|e| format!("GetQueueAttributes {url}: {}", aws_sdk_sqs::error::DisplayErrorContext(e)))?;
        let queued = out
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::ApproximateNumberOfMessages))
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        if queued >= n {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(120) {
            return Err(format!("only {queued} of {n} notifications reached {url} within 120 s"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A fresh filer in `dir` with the mount's directory (and, if given, that cache set-up).
/// A fresh filer in `dir` with the bucket of `storage` mounted at `mount.dir`: its remote's
/// configuration and the mount mapping written, its metadata imported, content cached per
/// `cache`.
pub(crate) async fn filer_with_bucket(
    dir: &std::path::Path,
    conf: &RemoteConf,
    mount: &Mount,
    storage: &S3Storage,
    cache: CacheConfig,
) -> Result<Arc<LocalFiler>, String> {
    use tidemark_core::remote::{MountMapping, system_paths};
    let filer = fresh_filer(dir, mount, Some(cache)).await?;
    tidemark_engine::docs::write_json(&*filer, &system_paths::remote_conf(&conf.name), conf, None)
        .await
        .map_err(err)?;
    let mapping = MountMapping { mounts: vec![mount.clone()] };
    tidemark_engine::docs::write_json(&*filer, system_paths::MOUNT_MAPPING, &mapping, None).await.map_err(err)?;
    reconcile(&*filer, storage, mount, &ReconcileOptions::default(), &mut |_| {}).await.map_err(err)?;
    Ok(filer)
}

pub(crate) async fn fresh_filer(
    dir: &std::path::Path,
    mount: &Mount,
    cache: Option<CacheConfig>,
) -> Result<Arc<LocalFiler>, String> {
    let mut filer = LocalFiler::open(DataDir::open(dir).map_err(err)?).map_err(err)?;
    if let Some(c) = cache {
        filer = filer.with_cache(c).map_err(err)?;
    }
    filer.apply(Txn::put(&mount.dir, NewEntry::dir(0), Origin::System)).await.map_err(err)?;
    Ok(Arc::new(filer))
}

pub(crate) async fn create_bucket(s3: &aws_sdk_s3::Client, bucket: &str) -> Result<(), String> {
    s3.create_bucket().bucket(bucket).send().await.map_err(|e| sdk_err(&format!("CreateBucket {bucket}"), e))?;
    Ok(())
}

/// One applied event's calls: the per-event share of a run's HEAD, receive and delete calls.
struct Cost {
    heads: f64,
    receives: f64,
    deletes: f64,
}

pub async fn run(b: S3Bench) -> Result<(), String> {
    if b.events == 0 || b.concurrency.is_empty() || b.concurrency.contains(&0) {
        return Err("--events and every --concurrency must be at least 1".into());
    }
    let conf = b.endpoint.conf();
    let (run, bucket, storage) = b.endpoint.fresh_bucket("tidemark-bench").await?;
    let s3 = storage.client().clone();
    let sqs = tidemark_cloud::aws::sqs::client(&conf).await.map_err(err)?;
    let notifications = S3Notifications::connect(&conf, &bucket).await.map_err(err)?;
    let mut managed = ManagedResources::default();
    let types = EventTypes::default();
    let queue_url = notifications
        .provision_sqs_direct(&bucket, "", &types, 0, &|_| run.clone(), &mut managed)
        .await
        .map_err(err)?;
    println!(
        "bench s3: {} ({}), bucket {bucket} with S3 → SQS notifications; {} events per run, concurrencies {:?}",
        b.endpoint.endpoint,
        storage.describe(),
        b.events,
        b.concurrency
    );
    let outcome = apply_runs(&b, &conf, &storage, &s3, &sqs, &bucket, &queue_url, &run).await;
    if let Err(e) = notifications.teardown_all(&mut managed).await {
        eprintln!("bench s3: tearing down the notification and queue of {bucket}: {e}");
    }
    let cost = outcome?;
    let listing = if b.objects > 0 { Some(reconcile_run(&b, &conf, &s3, &run).await?) } else { None };
    cost_table(&cost, listing);
    println!("  (the buckets tidemark-bench-{run}* are left on the endpoint)");
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn apply_runs(
    b: &S3Bench,
    conf: &RemoteConf,
    storage: &S3Storage,
    s3: &aws_sdk_s3::Client,
    sqs: &aws_sdk_sqs::Client,
    bucket: &str,
    queue_url: &str,
    run: &str,
) -> Result<Cost, String> {
    let tmp = tempfile::tempdir().map_err(err)?;
    let mount = Mount {
        dir: "/mnt/bench".into(),
        location: RemoteLocation { storage: conf.name.clone(), bucket: bucket.into(), path: String::new() },
        sync: false,
    };
    let visibility = Duration::from_secs(60);
    let mut cost = Cost { heads: 0.0, receives: 0.0, deletes: 0.0 };
    // The receive-and-delete share, once: it does not depend on the apply concurrency. The body
    // is a notification of the size moto sends.
    let sample = serde_json::json!({"Records": [{"eventVersion": "2.1", "eventSource": "aws:s3",
        "eventName": "ObjectCreated:Put", "eventTime": "2026-12-02T00:00:00.000Z",
        "s3": {"bucket": {"name": bucket}, "object": {"key": "c01/obj-00000000.bin", "size": 12, "eTag": "0123456789abcdef0123456789abcdef"}}}]})
    .to_string();
    let mut rd_secs = f64::MAX;
    for (gather, how) in [(1, "after each receive"), (GATHER / 10, "after gathering 10 receives, as a slice does")] {
        let (secs, receives, deletes) =
            raw_receive_delete(sqs, &format!("tidemark-bench-{run}-raw{gather}"), b.events, &sample, gather).await?;
        println!(
            "  plain client, receives of 10, delete batches of 10 {how}: {} messages in {secs:.2} s ({receives} receives, {deletes} delete batches)",
            b.events,
        );
        rd_secs = rd_secs.min(secs);
    }
    println!(
        "  {:>11} | {:>9} | {:>13} | {:>12} | {:>14} | {:>5} | HEAD / receive / delete calls per applied event",
        "concurrency", "put/s", "plain HEAD/s", "limit ev/s", "Tidemark ev/s", "ratio"
    );
    for &c in &b.concurrency {
        let keys: Vec<String> = (0..b.events).map(|i| format!("c{c:02}/obj-{i:08}.bin")).collect();
        let put_secs = put_all(storage, &keys, b.put_concurrency).await?;
        wait_queued(sqs, queue_url, b.events).await?;
        let head_secs = raw_heads(s3, bucket, &keys, c).await?;
        // The limit: every event's calls at the plain client's rates, the HEADs at this
        // concurrency and the receive/delete share (the faster way) one after another, as in a slice.
        let limit = b.events as f64 / (head_secs + rd_secs);
        let stages = Arc::new(Stages::default());
        let filer = fresh_filer(&tmp.path().join(format!("c{c}")), &mount, None).await?;
        let remote = TimedRemote(storage.clone(), stages.clone());
        let source = TimedQueue(SqsSource::new(sqs.clone(), queue_url).with_visibility(visibility), stages.clone());
        let timed_filer = TimedFiler(filer.clone(), stages.clone());
        let (secs, counters) =
            slice_run(&timed_filer, &remote, &source, &mount, queue_url, c, visibility, b.events).await?;
        let rate = counters.applied as f64 / secs;
        let applied = counters.applied.max(1) as f64;
        cost = Cost {
            heads: stages.head.calls() as f64 / applied,
            receives: stages.receive.calls() as f64 / applied,
            deletes: stages.deletes.load(Ordering::Relaxed) as f64 / applied,
        };
        println!(
            "  {c:>11} | {:>9.0} | {:>13.0} | {limit:>12.0} | {rate:>14.0} | {:>5.2} | {:.2} / {:.3} / {:.3} ({} applied, {} changed, {} failed)",
            b.events as f64 / put_secs,
            b.events as f64 / head_secs,
            rate / limit,
            cost.heads,
            cost.receives,
            cost.deletes,
            counters.applied,
            counters.changes,
            counters.failed,
        );
        println!("  {:>11}   {}", "", stages.breakdown(secs));
    }
    Ok(cost)
}

/// Wakes the bench once `want` keys were applied.
struct AppliedKeys {
    keys: std::sync::atomic::AtomicUsize,
    want: usize,
    done: tokio::sync::Notify,
}

impl SliceObserver for AppliedKeys {
    fn batch_applied(&self, _: &str, _: Duration, lags_ms: &[i64]) {
        // Every notification of the bench carries an event time, so each applied key has a lag.
        if self.keys.fetch_add(lags_ms.len(), Ordering::SeqCst) + lags_ms.len() >= self.want {
            self.done.notify_one();
        }
    }
}

/// Runs a real slice over the queue until `want` keys were applied (or two minutes passed);
/// returns its seconds and counters.
#[allow(clippy::too_many_arguments)]
async fn slice_run(
    filer: &dyn Filer,
    storage: &dyn RemoteStorage,
    source: &dyn tidemark_core::events::EventSource,
    mount: &Mount,
    queue_url: &str,
    concurrency: usize,
    visibility: Duration,
    want: usize,
) -> Result<(f64, Counters), String> {
    let identity = Identity {
        queue: queue_url.into(),
        topology: Topology::SqsDirect,
        bucket: mount.location.bucket.clone(),
        prefix: String::new(),
        event_types: EventTypes::default(),
    };
    let doc = SubscriptionDoc {
        dir: mount.dir.clone(),
        fingerprint: identity.fingerprint(),
        identity,
        options: SubscriptionOptions {
            apply_concurrency: concurrency,
            visibility_timeout_secs: visibility.as_secs(),
            ..Default::default()
        },
        managed: Default::default(),
        created_at_ms: 0,
        updated_at_ms: 0,
    };
    // A reconcile just completed: the slice only tails.
    let now = SystemClock.now_ms();
    let marker = ReconcileMarker {
        fingerprint: doc.fingerprint.clone(),
        last_full_reconcile_at_ms: Some(now),
        last_tail_at_ms: Some(now),
    };
    tidemark_engine::docs::write_json(filer, &marker_path(&doc.fingerprint), &marker, None).await.map_err(err)?;
    let observer = AppliedKeys { keys: Default::default(), want, done: Default::default() };
    let slice = Slice {
        filer,
        storage,
        source,
        clock: &SystemClock,
        doc: &doc,
        mount,
        provider: Provider::S3,
        cluster_id: Some("bench"),
        holder: "bench",
        length: Duration::from_secs(120),
        lease_ttl: Duration::from_secs(30),
        observer: &observer,
        requests: None,
    };
    let t = Instant::now();
    let outcome = slice.run(observer.done.notified()).await.map_err(err)?;
    let secs = t.elapsed().as_secs_f64();
    if outcome.end != SliceEnd::Cancelled {
        return Err(format!(
            "the slice ended {:?} with {} of {want} keys applied ({:?})",
            outcome.end,
            observer.keys.load(Ordering::SeqCst),
            outcome.counters
        ));
    }
    Ok((secs, outcome.counters))
}

/// LIST pages and seconds of the raw listing, for the cost table.
struct Listing {
    objects: usize,
    pages: u64,
}

async fn reconcile_run(b: &S3Bench, conf: &RemoteConf, s3: &aws_sdk_s3::Client, run: &str) -> Result<Listing, String> {
    let bucket = format!("tidemark-bench-{run}-list");
    create_bucket(s3, &bucket).await?;
    let storage = S3Storage::connect(conf, &bucket).await.map_err(err)?;
    let keys: Vec<String> = (0..b.objects).map(|i| format!("data/{:03}/obj-{i:08}.bin", i / 100 % 1000)).collect();
    let put_secs = put_all(&storage, &keys, b.put_concurrency).await?;
    println!(
        "  reconcile: {} objects put into {bucket} in {put_secs:.1} s ({:.0} puts/s)",
        b.objects,
        b.objects as f64 / put_secs
    );
    // The plain client: the bucket listed through the SDK, 1,000 keys a page.
    let t = Instant::now();
    let mut pages = 0u64;
    let mut listed = 0usize;
    let mut token: Option<String> = None;
    loop {
        let out = s3
            .list_objects_v2()
            .bucket(&bucket)
            .max_keys(1000)
            .set_continuation_token(token.take())
            .send()
            .await
            .map_err(|e| sdk_err(&format!("ListObjectsV2 {bucket}"), e))?;
        pages += 1;
        listed += out.contents().len();
        match out.next_continuation_token() {
            Some(next) if out.is_truncated() == Some(true) => token = Some(next.to_string()),
            _ => break,
        }
    }
    let list_secs = t.elapsed().as_secs_f64();
    println!("  plain client LIST: {listed} objects in {pages} pages, {list_secs:.2} s");
    let mount = Mount {
        dir: "/mnt/bench".into(),
        location: RemoteLocation { storage: conf.name.clone(), bucket: bucket.clone(), path: String::new() },
        sync: false,
    };
    let tmp = tempfile::tempdir().map_err(err)?;
    let filer = fresh_filer(tmp.path(), &mount, None).await?;
    let stages = Arc::new(Stages::default());
    let remote = TimedRemote(storage, stages.clone());
    let opts = ReconcileOptions { page_size: 1000, ..Default::default() };
    for pass in ["baseline import", "no-change reconcile"] {
        let lists = stages.list.calls();
        let heads = stages.head.calls();
        let t = Instant::now();
        let report = reconcile(&*filer, &remote, &mount, &opts, &mut |_| {}).await.map_err(err)?;
        let secs = t.elapsed().as_secs_f64();
        println!(
            "  {pass}: {secs:.2} s = {:.2} × the raw LIST ({} LIST pages, {} HEADs, {:.0} store writes/s): {}",
            secs / list_secs,
            stages.list.calls() - lists,
            stages.head.calls() - heads,
            report.changes() as f64 / secs,
            report.summary()
        );
    }
    Ok(Listing { objects: b.objects, pages })
}

/// API calls an hour, events against a scheduled full reconcile, for a few bucket sizes and
/// change rates, from the per-event and per-page costs just measured.
fn cost_table(cost: &Cost, listing: Option<Listing>) {
    let per_event = cost.heads + cost.receives + cost.deletes;
    println!(
        "  API cost per applied event (measured, last run): {:.2} HEAD + {:.3} receive + {:.3} delete = {per_event:.2} calls",
        cost.heads, cost.receives, cost.deletes
    );
    // An idle long-polling consumer: one receive per 20 s wait (SQS's longest).
    let idle_receives = 3600.0 / 20.0;
    let Some(listing) = listing else { return };
    let pages_per_object = listing.pages as f64 / listing.objects.max(1) as f64;
    println!(
        "  LIST pages per object (measured): {pages_per_object:.4}; idle long polling: {idle_receives:.0} receives an hour"
    );
    println!(
        "  {:>12} | {:>14} | {:>22} | {:>28}",
        "bucket size", "changes/hour", "events: calls/hour", "meta.sync every 5 min: LISTs/hour"
    );
    for size in [10_000u64, 1_000_000, 100_000_000] {
        for changes in [100u64, 10_000] {
            let events = changes as f64 * per_event + idle_receives;
            let lists = (size as f64 * pages_per_object).ceil() * 12.0;
            println!("  {size:>12} | {changes:>14} | {events:>22.0} | {lists:>28.0}");
        }
    }
}

/// The keys a notification names (`Records[].s3.object.key`, URL-encoded by S3 and moto; the
/// bench's keys have no spaces, so `+` needs no care).
fn notified_keys(body: &str) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let records = v.get("Records").and_then(|r| r.as_array()).cloned().unwrap_or_default();
    records
        .iter()
        .filter_map(|r| r.pointer("/s3/object/key").and_then(|k| k.as_str()))
        .filter_map(tidemark_core::events::percent_decode)
        .collect()
}

/// Receives (long polling, 10 at a time), deletes, and notes when each key's notification
/// first arrived, until `want` keys arrived; an error after 60 s without a new one.
async fn receive_keys(
    sqs: &aws_sdk_sqs::Client,
    url: &str,
    seen: &mut std::collections::HashMap<String, Instant>,
    want: usize,
) -> Result<(), String> {
    let mut progress = Instant::now();
    while seen.len() < want {
        if progress.elapsed() > Duration::from_secs(60) {
            return Err(format!("{} of {want} notifications arrived on {url} within 60 s", seen.len()));
        }
        let out = sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .wait_time_seconds(20)
            .send()
            .await
            .map_err(|e| format!("ReceiveMessage {url}: {}", aws_sdk_sqs::error::DisplayErrorContext(e)))?;
        let now = Instant::now();
        for m in out.messages() {
            for key in notified_keys(m.body().unwrap_or_default()) {
                seen.entry(key).or_insert_with(|| {
                    progress = now;
                    now
                });
            }
        }
        let handles: Vec<&str> = out.messages().iter().filter_map(|m| m.receipt_handle()).collect();
        if !handles.is_empty() {
            delete_batch(sqs, url, &handles).await?;
        }
    }
    Ok(())
}

/// The latency limit of S3 → SQS on `conf`'s endpoint: objects put into a scratch bucket with
/// an `sqs_direct` queue, each timed from its put to the moment a plain long-polling client
/// received its notification — one after another, or `rate` puts a second.
pub async fn put_to_receive(
    conf: &RemoteConf,
    run: &str,
    puts: usize,
    rate: Option<f64>,
) -> Result<Vec<Duration>, String> {
    let bucket = format!("tidemark-bench-{run}-limit");
    let storage = S3Storage::connect(conf, &bucket).await.map_err(err)?;
    create_bucket(storage.client(), &bucket).await?;
    let sqs = tidemark_cloud::aws::sqs::client(conf).await.map_err(err)?;
    let notifications = S3Notifications::connect(conf, &bucket).await.map_err(err)?;
    let mut managed = ManagedResources::default();
    let url = notifications
        .provision_sqs_direct(&bucket, "", &EventTypes::default(), 0, &|_| format!("{run}-limit"), &mut managed)
        .await
        .map_err(err)?;
    let keys: Vec<String> = (0..puts).map(|i| format!("limit/{i:05}.txt")).collect();
    let outcome = async {
        let mut seen = std::collections::HashMap::new();
        let mut started = Vec::with_capacity(puts);
        match rate {
            None => {
                for (i, key) in keys.iter().enumerate() {
                    started.push(Instant::now());
                    storage.put(key, Bytes::from(format!("{i}")), Default::default()).await.map_err(err)?;
                    receive_keys(&sqs, &url, &mut seen, i + 1).await?;
                }
            }
            Some(rate) => {
                let storage = Arc::new(storage.clone());
                let producer = async {
                    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
                    let mut tasks = tokio::task::JoinSet::new();
                    let mut started = Vec::with_capacity(keys.len());
                    for (i, key) in keys.iter().enumerate() {
                        ticker.tick().await;
                        started.push(Instant::now());
                        let (storage, key) = (storage.clone(), key.clone());
                        tasks.spawn(
                            async move { storage.put(&key, Bytes::from(format!("{i}")), Default::default()).await },
                        );
                    }
                    while let Some(put) = tasks.join_next().await {
                        if let Ok(Err(e)) = put {
                            eprintln!("bench latency: a put of the limit measurement failed: {e}");
                        }
                    }
                    started
                };
                let (received, s) = tokio::join!(receive_keys(&sqs, &url, &mut seen, puts), producer);
                started = s;
                received?;
            }
        }
        Ok::<_, String>(
            keys.iter()
                .zip(started)
                .filter_map(|(k, t)| seen.get(k).map(|v| v.saturating_duration_since(t)))
                .collect::<Vec<_>>(),
        )
    }
    .await;
    if let Err(e) = notifications.teardown_all(&mut managed).await {
        eprintln!("bench latency: tearing down the scratch queue of {bucket}: {e}");
    }
    outcome
}

//! The applier against moto, through real queue messages: S3 → SQS notifications and crafted
//! messages whose payload disagrees with the bucket.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_sqs::types::QueueAttributeName;
use bytes::Bytes;
use futures::StreamExt;
use tidemark_cloud::aws::s3::S3Storage;
use tidemark_cloud::aws::sqs::{SqsSource, client};
use tidemark_core::events::{EventSource, Provider};
use tidemark_core::model::{Content, NewEntry, Origin, Txn};
use tidemark_core::remote::{ListPage, Mount, RemoteConf, RemoteLocation, RemoteObject, StorageKind};
use tidemark_core::{ByteRange, ByteStream, Error, Filer, RemoteStorage, SystemClock, WriteOptions};
use tidemark_engine::apply::{ApplyContext, Counters, EventTypes, apply_batch};
use tidemark_filer::{DataDir, LocalFiler};
use tidemark_testkit::{Moto, unique_name};

fn conf(endpoint: &str) -> RemoteConf {
    let settings =
        [("endpoint", endpoint), ("access_key", "testing"), ("secret_key", "testing"), ("region", "us-east-1")];
    RemoteConf {
        name: "moto".into(),
        kind: StorageKind::S3,
        settings: settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    }
}

struct World {
    filer: Arc<LocalFiler>,
    bucket: String,
    s3: Arc<S3Storage>,
    source: SqsSource,
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    mount: Mount,
    _moto: Moto,
    _dir: tempfile::TempDir,
}

async fn world() -> World {
    let moto = Moto::get();
    let c = conf(&moto.endpoint);
    let bucket = unique_name("ap");
    let s3 = S3Storage::connect(&c, &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();
    let sqs = client(&c).await.unwrap();
    // A queue the bucket's notifications reach (set up with Tidemark's own provisioning).
    let mut managed = tidemark_core::subscription::ManagedResources::default();
    let queue_url = tidemark_cloud::aws::provision::S3Notifications::connect(&c, &bucket)
        .await
        .unwrap()
        .provision_sqs_direct(
            &unique_name("q"),
            "",
            &Default::default(),
            0,
            &|u: &str| u.len().to_string(),
            &mut managed,
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let filer = Arc::new(LocalFiler::open(DataDir::open(dir.path()).unwrap()).unwrap());
    let mount = Mount {
        dir: "/mnt/data".into(),
        location: RemoteLocation { storage: "moto".into(), bucket: bucket.clone(), path: String::new() },
        sync: false,
    };
    filer.apply(Txn::put("/mnt/data", NewEntry::dir(0), Origin::System)).await.unwrap();
    let source = SqsSource::new(sqs.clone(), queue_url.clone());
    World { filer, bucket, s3: Arc::new(s3), source, sqs, queue_url, mount, _moto: moto, _dir: dir }
}

/// Receives and applies until `until` holds (or 20 s pass).
async fn pump(w: &World, storage: &dyn RemoteStorage, counters: &mut Counters, until: impl Fn(&Counters) -> bool) {
    let types = EventTypes::default();
    let clock = SystemClock;
    let ctx = ApplyContext {
        mount: &w.mount,
        provider: Provider::S3,
        event_types: &types,
        cluster_id: Some("cluster-a"),
        fence: None,
        concurrency: 4,
        retry_delay: Duration::ZERO,
        visibility: Duration::from_secs(30),
        clock: &clock,
        prefetch: None,
        recent: None,
        max_receives: None,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !until(counters) {
        assert!(Instant::now() < deadline, "timed out: {counters:?}");
        let batch = w.source.receive(10, Duration::from_secs(1)).await.unwrap();
        if !batch.is_empty() {
            apply_batch(&*w.filer, storage, &w.source, &ctx, batch, counters).await.unwrap();
        }
    }
}

async fn size_of(w: &World, p: &str) -> Option<u64> {
    w.filer.stat(p).await.unwrap().map(|e| e.size)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_overwrite_and_delete_in_the_bucket_reach_the_namespace() {
    let w = world().await;
    let mut c = Counters::default();
    pump(&w, &*w.s3, &mut c, |c| c.ignored >= 1).await; // the s3:TestEvent
    assert_eq!(c.ignored_reasons.get("test event"), Some(&1));

    w.s3.put("photos/a b+ü.jpg", Bytes::from_static(b"one"), BTreeMap::new()).await.unwrap();
    pump(&w, &*w.s3, &mut c, |c| c.applied >= 1).await;
    let e = w.filer.stat("/mnt/data/photos/a b+ü.jpg").await.unwrap().expect("created");
    assert_eq!((e.size, e.content), (3, Content::Remote), "metadata only: the content is not fetched");

    w.s3.put("photos/a b+ü.jpg", Bytes::from_static(b"three"), BTreeMap::new()).await.unwrap();
    pump(&w, &*w.s3, &mut c, |c| c.applied >= 2).await;
    assert_eq!(size_of(&w, "/mnt/data/photos/a b+ü.jpg").await, Some(5));

    w.s3.delete("photos/a b+ü.jpg").await.unwrap();
    pump(&w, &*w.s3, &mut c, |c| c.applied >= 3).await;
    assert_eq!(size_of(&w, "/mnt/data/photos/a b+ü.jpg").await, None);
    // The directory the key implied goes with its last key, as a reconcile would remove it.
    assert!(w.filer.stat("/mnt/data/photos").await.unwrap().is_none(), "the emptied directory is removed");
    assert_eq!((c.received, c.applied, c.failed, c.changes), (4, 3, 0, 4), "{c:?}");
    assert!(c.max_lag_ms.is_some());
}

fn crafted(bucket: &str, key: &str, name: &str, size: u64) -> String {
    serde_json::json!({"Records": [{
        "eventVersion": "2.1", "eventSource": "aws:s3", "eventTime": "2020-01-01T00:00:00.000Z", "eventName": name,
        "s3": {"bucket": {"name": bucket}, "object": {"key": key, "size": size, "eTag": "bogus"}}
    }]})
    .to_string()
}

async fn send(w: &World, body: &str) {
    w.sqs.send_message().queue_url(&w.queue_url).message_body(body).send().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_duplicated_and_out_of_order_events_converge_to_the_bucket() {
    let w = world().await;
    let mut c = Counters::default();
    pump(&w, &*w.s3, &mut c, |c| c.ignored >= 1).await;
    // Objects whose current state the crafted events misdescribe.
    w.s3.put("exists.txt", Bytes::from_static(b"here"), BTreeMap::new()).await.unwrap();
    pump(&w, &*w.s3, &mut c, |c| c.applied >= 1).await;
    let before = c.clone();
    send(&w, &crafted(&w.bucket, "exists.txt", "ObjectRemoved:Delete", 0)).await; // stale delete
    send(&w, &crafted(&w.bucket, "never.txt", "ObjectCreated:Put", 999)).await; // created, then gone
    for _ in 0..3 {
        send(&w, &crafted(&w.bucket, "exists.txt", "ObjectCreated:Put", 1)).await; // duplicates, wrong size
    }
    send(&w, &crafted("someone-elses-bucket", "x", "ObjectCreated:Put", 1)).await;
    pump(&w, &*w.s3, &mut c, |c| c.received >= before.received + 6).await;
    assert_eq!(size_of(&w, "/mnt/data/exists.txt").await, Some(4), "the HEAD wins: it exists with 4 bytes");
    assert_eq!(size_of(&w, "/mnt/data/never.txt").await, None, "the HEAD wins: it does not exist");
    assert_eq!(c.applied - before.applied, 5, "each message handled counts once: {c:?}");
    assert_eq!(c.changes, before.changes, "nothing changed: the namespace already matched the bucket");
    assert_eq!(c.ignored_reasons.get("another bucket"), Some(&1));
}

/// A storage whose HEAD can fail, or can let a local write land between the HEAD and the write.
struct Interfering {
    inner: Arc<S3Storage>,
    slow_head: Duration,
    fail_heads: AtomicUsize,
    heads: AtomicUsize,
    local_write: Option<(Arc<LocalFiler>, String)>,
}

#[async_trait]
impl RemoteStorage for Interfering {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn stat(&self, key: &str) -> tidemark_core::Result<Option<RemoteObject>> {
        self.heads.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.slow_head).await;
        if self.fail_heads.load(Ordering::SeqCst) > 0 {
            self.fail_heads.fetch_sub(1, Ordering::SeqCst);
            return Err(Error::Unavailable { message: "injected HEAD failure".into() });
        }
        let r = self.inner.stat(key).await;
        if let Some((filer, path)) = &self.local_write {
            let body: ByteStream = futures::stream::once(async { Ok(Bytes::from_static(b"written locally")) }).boxed();
            filer.write(path, body, WriteOptions::default()).await.unwrap();
        }
        r
    }
    async fn list(&self, p: &str, a: Option<&str>, t: Option<&str>, m: usize) -> tidemark_core::Result<ListPage> {
        self.inner.list(p, a, t, m).await
    }
    fn lists_from_anywhere(&self) -> bool {
        self.inner.lists_from_anywhere()
    }
    async fn get(&self, k: &str, r: Option<ByteRange>, e: Option<&str>) -> tidemark_core::Result<ByteStream> {
        self.inner.get(k, r, e).await
    }
    async fn put(&self, k: &str, b: Bytes, m: BTreeMap<String, String>) -> tidemark_core::Result<RemoteObject> {
        self.inner.put(k, b, m).await
    }
    async fn delete(&self, k: &str) -> tidemark_core::Result<()> {
        self.inner.delete(k).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_write_between_head_and_write_is_not_clobbered() {
    let w = world().await;
    let mut c = Counters::default();
    pump(&w, &*w.s3, &mut c, |c| c.ignored >= 1).await;
    w.s3.put("race.txt", Bytes::from_static(b"remote"), BTreeMap::new()).await.unwrap();
    let racing = Interfering {
        inner: w.s3.clone(),
        slow_head: Duration::ZERO,
        fail_heads: AtomicUsize::new(0),
        heads: AtomicUsize::new(0),
        local_write: Some((w.filer.clone(), "/mnt/data/race.txt".into())),
    };
    pump(&w, &racing, &mut c, |c| c.applied >= 1).await;
    let (_, s) = w.filer.read("/mnt/data/race.txt", None).await.unwrap();
    let bytes: Vec<Bytes> = s.map(|b| b.unwrap()).collect().await;
    assert_eq!(bytes.concat(), b"written locally", "the local write survives the event's apply");
    assert_eq!(c.changes, 0, "{c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_failure_leaves_the_message_to_redeliver_and_it_is_applied_once() {
    let w = world().await;
    let mut c = Counters::default();
    pump(&w, &*w.s3, &mut c, |c| c.ignored >= 1).await;
    w.s3.put("flaky.txt", Bytes::from_static(b"abc"), BTreeMap::new()).await.unwrap();
    let flaky = Interfering {
        inner: w.s3.clone(),
        slow_head: Duration::ZERO,
        fail_heads: AtomicUsize::new(2),
        heads: AtomicUsize::new(0),
        local_write: None,
    };
    pump(&w, &flaky, &mut c, |c| c.applied >= 1).await;
    assert_eq!(size_of(&w, "/mnt/data/flaky.txt").await, Some(3));
    assert_eq!((c.failed, c.applied), (2, 1), "two failed deliveries, then one apply: {c:?}");
    assert_eq!(c.failed_reasons.get("HEAD failed"), Some(&2), "{c:?}");
    assert_eq!(c.received, 4, "test event + the same message three times");
    assert_eq!(flaky.heads.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_stops_the_batch_and_acknowledges_nothing() {
    let w = world().await;
    let mut c = Counters::default();
    pump(&w, &*w.s3, &mut c, |c| c.ignored >= 1).await;
    let ours = w.filer.lease_acquire("fp", "worker-a", Duration::from_millis(200)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    w.filer.lease_acquire("fp", "worker-b", Duration::from_secs(30)).await.unwrap();
    w.s3.put("fenced.txt", Bytes::from_static(b"x"), BTreeMap::new()).await.unwrap();
    let types = EventTypes::default();
    let clock = SystemClock;
    let fence = ours.fence();
    let ctx = ApplyContext {
        mount: &w.mount,
        provider: Provider::S3,
        event_types: &types,
        cluster_id: None,
        fence: Some(&fence),
        concurrency: 4,
        retry_delay: Duration::ZERO,
        visibility: Duration::from_secs(30),
        clock: &clock,
        prefetch: None,
        recent: None,
        max_receives: None,
    };
    let batch = w.source.receive(10, Duration::from_secs(5)).await.unwrap();
    assert_eq!(batch.len(), 1);
    let err = apply_batch(&*w.filer, &*w.s3, &w.source, &ctx, batch, &mut c).await.unwrap_err();
    assert!(matches!(err, Error::Fenced { .. }), "{err}");
    assert_eq!(size_of(&w, "/mnt/data/fenced.txt").await, None, "the stale holder wrote nothing");
    // Not acknowledged: it comes back (after the visibility timeout; make it visible now).
    let inflight = w
        .sqs
        .get_queue_attributes()
        .queue_url(&w.queue_url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .unwrap();
    assert_eq!(inflight.attributes().unwrap()[&QueueAttributeName::ApproximateNumberOfMessagesNotVisible], "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_message_is_counted_failed_and_never_acknowledged() {
    let w = world().await;
    let mut c = Counters::default();
    pump(&w, &*w.s3, &mut c, |c| c.ignored >= 1).await;
    send(&w, "this is not a notification").await;
    pump(&w, &*w.s3, &mut c, |c| c.failed >= 1).await;
    assert_eq!(c.failed_reasons.get("malformed message"), Some(&1), "{c:?}");
    let attrs = w
        .sqs
        .get_queue_attributes()
        .queue_url(&w.queue_url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .unwrap();
    assert_eq!(
        attrs.attributes().unwrap()[&QueueAttributeName::ApproximateNumberOfMessagesNotVisible],
        "1",
        "still on the queue"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_batch_keeps_its_messages_invisible_with_heartbeats() {
    let w = world().await;
    let mut c = Counters::default();
    pump(&w, &*w.s3, &mut c, |c| c.ignored >= 1).await;
    w.s3.put("slow.txt", Bytes::from_static(b"s"), BTreeMap::new()).await.unwrap();
    // Visibility 3 s, a HEAD that takes 7 s: without heartbeats another receiver would get it.
    let slow = Interfering {
        inner: w.s3.clone(),
        slow_head: Duration::from_secs(7),
        fail_heads: AtomicUsize::new(0),
        heads: AtomicUsize::new(0),
        local_write: None,
    };
    let batch = w.source.receive(10, Duration::from_secs(5)).await.unwrap();
    assert_eq!(batch.len(), 1);
    w.sqs
        .change_message_visibility()
        .queue_url(&w.queue_url)
        .receipt_handle(&batch[0].ack_id)
        .visibility_timeout(3)
        .send()
        .await
        .unwrap();
    let types = EventTypes::default();
    let clock = SystemClock;
    let ctx = ApplyContext {
        mount: &w.mount,
        provider: Provider::S3,
        event_types: &types,
        cluster_id: None,
        fence: None,
        concurrency: 1,
        retry_delay: Duration::ZERO,
        visibility: Duration::from_secs(3),
        clock: &clock,
        prefetch: None,
        recent: None,
        max_receives: None,
    };
    let other = SqsSource::new(w.sqs.clone(), w.queue_url.clone());
    let (report, stolen) = tokio::join!(apply_batch(&*w.filer, &slow, &w.source, &ctx, batch, &mut c), async {
        tokio::time::sleep(Duration::from_millis(4500)).await;
        other.receive(10, Duration::from_secs(1)).await.unwrap()
    });
    assert_eq!(report.unwrap().acked, 1);
    assert!(stolen.is_empty(), "the heartbeat kept the message from another receiver: {stolen:?}");
    assert_eq!(size_of(&w, "/mnt/data/slow.txt").await, Some(1));
}

/// The common ordering with `remote.sync.enable`: the bucket's event for this cluster's own
/// upload arrives while the entry is still local-only (a new file) or dirty (an overwrite),
/// because the outbound sync has not recorded the upload yet. Forced here by uploading as the
/// outbound sync does (origin marker and the entry's version) and never recording it: both
/// events count as echoes, and neither entry is touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echo_is_an_echo_before_the_outbound_sync_records_the_upload() {
    use tidemark_core::decide::upload_metadata;
    let w = world().await;
    let mut c = Counters::default();
    pump(&w, &*w.s3, &mut c, |c| c.ignored >= 1).await; // the s3:TestEvent
    // A file the bucket had first, then overwritten here: dirty.
    w.s3.put("old.txt", Bytes::from_static(b"theirs"), BTreeMap::new()).await.unwrap();
    pump(&w, &*w.s3, &mut c, |c| c.applied >= 1).await;
    let write = |p: &'static str, body: &'static [u8]| {
        let f = w.filer.clone();
        async move {
            let s = futures::stream::once(async move { Ok(Bytes::from_static(body)) }).boxed();
            f.write(p, s, WriteOptions::default()).await.unwrap()
        }
    };
    let dirty = write("/mnt/data/old.txt", b"ours now").await;
    let fresh = write("/mnt/data/new.txt", b"brand new").await;
    for (key, e, body) in [("old.txt", &dirty, &b"ours now"[..]), ("new.txt", &fresh, &b"brand new"[..])] {
        let meta = upload_metadata("cluster-a", &e.path, e.version);
        w.s3.put(key, Bytes::copy_from_slice(body), meta).await.unwrap();
    }
    let before = c.clone();
    pump(&w, &*w.s3, &mut c, |c| c.echo_suppressed >= before.echo_suppressed + 2).await;
    assert_eq!(c.echo_suppressed - before.echo_suppressed, 2, "{c:?}");
    assert_eq!(c.changes, before.changes, "nothing rewritten: {c:?}");
    for e in [&dirty, &fresh] {
        let now = w.filer.stat(&e.path).await.unwrap().unwrap();
        assert_eq!((now.version, now.remote.is_none()), (e.version, e.remote.is_none()), "{}", e.path);
    }
}

/// S3 reports an object a lifecycle rule expired as `s3:LifecycleExpiration:Delete` (or
/// `:DeleteMarkerCreated` in a versioned bucket), not as `ObjectRemoved:*`. moto runs no
/// lifecycle rules, so the object is deleted, the notification moto sends for that is drained
/// unapplied, and the message S3 would send for an expiration is put on the queue instead: the
/// entry leaves the namespace as for a delete, counted applied. The provisioned configuration
/// asks for those events (`s3:LifecycleExpiration:*`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lifecycle_expiration_removes_the_entry_like_a_delete() {
    let w = world().await;
    let config = w.s3.client().get_bucket_notification_configuration().bucket(&w.bucket).send().await.unwrap();
    let events: Vec<String> =
        config.queue_configurations().iter().flat_map(|q| q.events().iter().map(|e| e.as_str().to_string())).collect();
    assert!(events.iter().any(|e| e == "s3:LifecycleExpiration:*"), "provisioned: {events:?}");
    let mut c = Counters::default();
    pump(&w, &*w.s3, &mut c, |c| c.ignored >= 1).await; // the s3:TestEvent
    for key in ["logs/old.txt", "logs/marked.txt"] {
        w.s3.put(key, Bytes::from_static(b"expiring"), BTreeMap::new()).await.unwrap();
    }
    pump(&w, &*w.s3, &mut c, |c| c.applied >= 2).await;
    for key in ["logs/old.txt", "logs/marked.txt"] {
        w.s3.delete(key).await.unwrap();
    }
    // Drain moto's own ObjectRemoved notifications without applying them.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut drained = 0;
    while drained < 2 {
        assert!(Instant::now() < deadline, "moto's delete notifications did not arrive");
        let batch = w.source.receive(10, Duration::from_secs(1)).await.unwrap();
        drained += batch.len();
        w.source.ack(&batch.iter().map(|d| d.ack_id.clone()).collect::<Vec<_>>()).await.unwrap();
    }
    assert!(w.filer.stat("/mnt/data/logs/old.txt").await.unwrap().is_some(), "not applied yet");
    for (key, name) in
        [("logs/old.txt", "LifecycleExpiration:Delete"), ("logs/marked.txt", "LifecycleExpiration:DeleteMarkerCreated")]
    {
        let body = serde_json::json!({"Records": [{
            "eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "us-east-1",
            "eventTime": "2026-12-04T10:00:00.000Z", "eventName": name,
            "userIdentity": {"principalId": "s3.amazonaws.com"},
            "s3": {"s3SchemaVersion": "1.0", "bucket": {"name": w.bucket, "arn": format!("arn:aws:s3:::{}", w.bucket)},
                   "object": {"key": key.replace('/', "%2F"), "sequencer": "0055AED6DCD90281E5"}}
        }]});
        w.sqs.send_message().queue_url(&w.queue_url).message_body(body.to_string()).send().await.unwrap();
    }
    let before = c.applied;
    pump(&w, &*w.s3, &mut c, |c| c.applied >= before + 2).await;
    for p in ["/mnt/data/logs/old.txt", "/mnt/data/logs/marked.txt"] {
        assert!(w.filer.stat(p).await.unwrap().is_none(), "{p} expired: {c:?}");
    }
    assert_eq!(c.ignored_reasons.get("event type not subscribed"), None, "{c:?}");
}

/// A copy of this cluster's upload to another key keeps its metadata (S3's default
/// `MetadataDirective: COPY`); it is a put like any other there, applied and counted applied —
/// not taken for an echo — while the upload's own event at its own key still is one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_of_an_own_upload_to_another_key_is_applied_not_an_echo() {
    use tidemark_core::decide::upload_metadata;
    let w = world().await;
    let mut c = Counters::default();
    pump(&w, &*w.s3, &mut c, |c| c.ignored >= 1).await; // the s3:TestEvent
    // A local write to /mnt/data/a.txt, and this cluster's upload of it.
    let a = w
        .filer
        .write(
            "/mnt/data/a.txt",
            futures::stream::once(async { Ok(Bytes::from_static(b"ours")) }).boxed(),
            WriteOptions::default(),
        )
        .await
        .unwrap();
    assert!(a.version > 0);
    // /mnt/data/b.txt mirrors an object someone else put, at a version above the upload's: the
    // old rule took any such object for an echo.
    w.s3.put("b.txt", Bytes::from_static(b"theirs"), BTreeMap::new()).await.unwrap();
    pump(&w, &*w.s3, &mut c, |c| c.applied >= 1).await;
    let b = w.filer.stat("/mnt/data/b.txt").await.unwrap().unwrap();
    assert!(b.version > a.version);
    w.s3.put("a.txt", Bytes::from_static(b"ours"), upload_metadata("cluster-a", "/mnt/data/a.txt", a.version))
        .await
        .unwrap();
    pump(&w, &*w.s3, &mut c, |c| c.echo_suppressed >= 1).await;
    let before = c.clone();
    w.s3.client()
        .copy_object()
        .bucket(&w.bucket)
        .key("b.txt")
        .copy_source(format!("{}/a.txt", w.bucket))
        .send()
        .await
        .unwrap();
    let copied = w.s3.stat("b.txt").await.unwrap().unwrap();
    assert_eq!(copied.user_metadata.as_ref().unwrap()["tidemark-origin"], "cluster-a", "the copy kept the metadata");
    pump(&w, &*w.s3, &mut c, |c| c.applied > before.applied).await;
    let now = w.filer.stat("/mnt/data/b.txt").await.unwrap().unwrap();
    assert_eq!(now.remote.as_ref().unwrap().etag, copied.etag, "the copy is what /mnt/data/b.txt mirrors: {c:?}");
    assert_eq!((c.echo_suppressed, c.changes), (before.echo_suppressed, before.changes + 1), "{c:?}");
}

//! The slice engine against moto: a new identity runs its baseline before it tails; the marker,
//! lease and status blob are keyed by the fingerprint; a held lease refuses a second runner.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use tidemark_cloud::aws::s3::S3Storage;
use tidemark_cloud::aws::sqs::{SqsSource, client};
use tidemark_core::events::Provider;
use tidemark_core::model::{NewEntry, Origin, Txn};
use tidemark_core::remote::{Mount, RemoteLocation};
use tidemark_core::subscription::{EventTypes, Identity, SubscriptionDoc, SubscriptionOptions, Topology};
use tidemark_core::{Error, Filer, RemoteStorage, SystemClock};
use tidemark_engine::docs::read_json;
use tidemark_engine::slice::{
    ReconcileKind, ReconcileMarker, Slice, SliceEnd, SliceState, StatusBlob, lease_name, marker_path, status_path,
};
use tidemark_filer::{DataDir, LocalFiler};
use tidemark_testkit::{Moto, unique_name};

struct Fixture {
    _moto: Moto,
    _dir: tempfile::TempDir,
    s3: S3Storage,
    filer: LocalFiler,
    mount: Mount,
    source: SqsSource,
    doc: SubscriptionDoc,
}

/// A bucket holding `objects`, its notifications reaching a queue, a filer with the mount.
async fn fixture(objects: &[&str]) -> Fixture {
    let moto = Moto::get();
    let conf = moto.conf("moto");
    let bucket = unique_name("sl");
    let s3 = S3Storage::connect(&conf, &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();
    for k in objects {
        s3.put(k, Bytes::from_static(b"old"), BTreeMap::new()).await.unwrap();
    }
    let sqs = client(&conf).await.unwrap();
    // A queue the bucket's notifications reach (set up with Tidemark's own provisioning).
    let mut managed = tidemark_core::subscription::ManagedResources::default();
    let url = tidemark_cloud::aws::provision::S3Notifications::connect(&conf, &bucket)
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
    let filer = LocalFiler::open(DataDir::open(dir.path()).unwrap()).unwrap();
    filer.apply(Txn::put("/mnt/data", NewEntry::dir(0), Origin::System)).await.unwrap();
    let mount = Mount {
        dir: "/mnt/data".into(),
        location: RemoteLocation { storage: "moto".into(), bucket: bucket.clone(), path: String::new() },
        sync: false,
    };
    let source = SqsSource::new(sqs.clone(), url.clone());
    let identity = Identity {
        queue: url.clone(),
        topology: Topology::ByoQueue,
        bucket: bucket.clone(),
        prefix: String::new(),
        event_types: EventTypes::default(),
    };
    let doc = SubscriptionDoc {
        dir: "/mnt/data".into(),
        fingerprint: identity.fingerprint(),
        identity,
        options: SubscriptionOptions { visibility_timeout_secs: 30, ..Default::default() },
        managed: Default::default(),
        created_at_ms: 0,
        updated_at_ms: 0,
    };
    Fixture { _moto: moto, _dir: dir, s3, filer, mount, source, doc }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_identity_runs_its_baseline_then_tails_and_a_repointed_one_runs_it_again() {
    // Objects that exist before any notification: only a baseline can find them.
    let f = fixture(&["old/1.txt", "old/2.txt", "photos/old.jpg"]).await;
    let (filer, s3, source, mount, doc) = (&f.filer, &f.s3, &f.source, &f.mount, &f.doc);
    let clock = SystemClock;
    let slice = |doc: &SubscriptionDoc, holder: &'static str| {
        let doc = doc.clone();
        let clock = &clock;
        async move {
            let s = Slice {
                filer,
                storage: s3,
                source,
                clock,
                doc: &doc,
                mount,
                provider: Provider::S3,
                cluster_id: None,
                holder,
                length: Duration::from_secs(4),
                observer: &tidemark_engine::slice::NoObserver,
                requests: None,
                lease_ttl: Duration::from_secs(10),
            };
            s.run(std::future::pending()).await
        }
    };

    // A put while the first slice tails is applied by it.
    let putter = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        s3.put("photos/new.jpg", Bytes::from_static(b"new!"), BTreeMap::new()).await.unwrap();
    };
    let (first, ()) = tokio::join!(slice(doc, "worker-a"), putter);
    let first = first.unwrap();
    assert_eq!((first.end.clone(), first.reconciled), (SliceEnd::Deadline, Some(ReconcileKind::Baseline)));
    for p in ["/mnt/data/old/1.txt", "/mnt/data/old/2.txt", "/mnt/data/photos/old.jpg"] {
        assert!(filer.stat(p).await.unwrap().is_some(), "{p}: the baseline found what existed before");
    }
    assert_eq!(filer.stat("/mnt/data/photos/new.jpg").await.unwrap().map(|e| e.size), Some(4), "tailed");
    let (marker, _) =
        read_json::<ReconcileMarker>(filer, &marker_path(&doc.fingerprint)).await.unwrap().expect("a marker");
    assert!(marker.last_full_reconcile_at_ms.is_some() && marker.last_tail_at_ms.is_some());
    let (status, _) =
        read_json::<StatusBlob>(filer, &status_path(&doc.fingerprint)).await.unwrap().expect("a status blob");
    assert_eq!(
        (status.state, status.lease_holder.as_str(), status.lease_generation),
        (SliceState::Idle, "worker-a", 1)
    );
    assert!(status.counters.applied >= 1, "{:?}", status.counters);
    let lease = filer.lease_get(&lease_name(&doc.fingerprint)).await.unwrap().unwrap();
    assert!(lease.expires_at_ms <= clock_now(), "released at the end of the slice");

    // The next slice of the same identity tails without a reconcile, with a new generation.
    let second = slice(doc, "worker-b").await.unwrap();
    assert_eq!((second.reconciled, second.generation), (None, 2));

    // A re-pointed subscription (another prefix) is a new identity: a baseline again.
    let mut repointed = doc.clone();
    repointed.identity.prefix = "photos/".into();
    repointed.fingerprint = repointed.identity.fingerprint();
    let third = slice(&repointed, "worker-a").await.unwrap();
    assert_eq!(third.reconciled, Some(ReconcileKind::Baseline));

    // A lease held by a live slice refuses a second runner.
    filer.lease_acquire(&lease_name(&doc.fingerprint), "someone-else", Duration::from_secs(30)).await.unwrap();
    let err = slice(doc, "worker-a").await.unwrap_err();
    assert!(matches!(err, Error::LeaseHeld { .. }), "{err}");
}

fn clock_now() -> i64 {
    tidemark_core::Clock::now_ms(&SystemClock)
}

/// A queue whose every receive takes longer than the slice's whole lease (a slow queue, a
/// congested network).
struct SlowSource<'a>(&'a SqsSource, Duration);

#[async_trait::async_trait]
impl tidemark_core::events::EventSource for SlowSource<'static> {
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn max_batch(&self) -> usize {
        self.0.max_batch()
    }
    async fn receive(&self, max: usize, wait: Duration) -> tidemark_core::Result<Vec<tidemark_core::events::Delivery>> {
        tokio::time::sleep(self.1).await;
        self.0.receive(max, wait).await
    }
    async fn ack(&self, ids: &[String]) -> tidemark_core::Result<tidemark_core::events::AckReport> {
        self.0.ack(ids).await
    }
    async fn extend(&self, id: &str, by: Duration) -> tidemark_core::Result<()> {
        self.0.extend(id, by).await
    }
    async fn release(&self, id: &str, delay: Duration) -> tidemark_core::Result<()> {
        self.0.release(id, delay).await
    }
}

/// The lease is renewed beside the slice's work, not only between receives: a receive (or a
/// reconcile, or a batch) that outlasts the lease does not lose it — which, redone by the next
/// slice and lost again, would never make progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_that_outlasts_the_lease_keeps_it() {
    let f: &'static Fixture = Box::leak(Box::new(fixture(&[]).await));
    f.s3.put("slow.txt", Bytes::from_static(b"slow"), BTreeMap::new()).await.unwrap();
    let slow = SlowSource(&f.source, Duration::from_secs(3));
    let slice = Slice {
        filer: &f.filer,
        storage: &f.s3,
        source: &slow,
        clock: &SystemClock,
        doc: &f.doc,
        mount: &f.mount,
        provider: Provider::S3,
        cluster_id: None,
        holder: "worker-a",
        length: Duration::from_secs(8),
        observer: &tidemark_engine::slice::NoObserver,
        requests: None,
        lease_ttl: Duration::from_secs(2),
    };
    let out = slice.run(std::future::pending()).await.unwrap();
    assert_eq!(out.end, SliceEnd::Deadline, "{out:?}");
    assert_eq!(out.generation, 1, "one lease, kept");
    assert!(f.filer.stat("/mnt/data/slow.txt").await.unwrap().is_some(), "applied");
}

/// A slice cancelled (a worker's SIGTERM, the admin's cancel) while its long poll is in flight:
/// the poll cannot be called back, so the slice lets it end and gives back what it brought.
/// A change made just after the cancel is seen by the next slice at once — not after the
/// visibility timeout (30 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_slice_gives_back_what_its_poll_in_flight_brought() {
    let f = fixture(&[]).await;
    let clock = SystemClock;
    let slice = |holder: &'static str, length: u64| Slice {
        filer: &f.filer,
        storage: &f.s3,
        source: &f.source,
        clock: &clock,
        doc: &f.doc,
        mount: &f.mount,
        provider: Provider::S3,
        cluster_id: None,
        holder,
        length: Duration::from_secs(length),
        observer: &tidemark_engine::slice::NoObserver,
        requests: None,
        lease_ttl: Duration::from_secs(10),
    };
    // The first slice runs its baseline, then long-polls; it is cancelled mid-poll, and the
    // put lands in that poll.
    let first = slice("worker-a", 60);
    let (cancel_tx, cancel_rx) = tokio::sync::oneshot::channel::<()>();
    let canceller = async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let _ = cancel_tx.send(());
        tokio::time::sleep(Duration::from_millis(200)).await;
        f.s3.put("after-cancel.txt", Bytes::from_static(b"x"), BTreeMap::new()).await.unwrap();
    };
    let (out, ()) = tokio::join!(
        first.run(async {
            let _ = cancel_rx.await;
        }),
        canceller
    );
    assert_eq!(out.unwrap().end, SliceEnd::Cancelled);
    let t0 = std::time::Instant::now();
    let second = slice("worker-b", 5);
    let out = second.run(std::future::pending()).await.unwrap();
    let e = f.filer.stat("/mnt/data/after-cancel.txt").await.unwrap();
    assert!(e.is_some(), "the next slice applied it: {out:?}");
    assert!(t0.elapsed() < Duration::from_secs(20), "well before the visibility timeout: {:?}", t0.elapsed());
}

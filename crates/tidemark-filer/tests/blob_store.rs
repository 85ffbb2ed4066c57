//! File content on a shared object store (`--blob-store`), against moto: what a write stores,
//! what a read returns (whole and ranged, small, single-request and multipart), what the
//! collector removes and what it must never remove.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tidemark_core::model::Content;
use tidemark_core::{ByteRange, DeleteOptions, Filer, WriteOptions};
use tidemark_filer::blobs::{BlobStoreUrl, S3Blobs};
use tidemark_filer::gc::{self, BlobCollector};
use tidemark_filer::leader::LeaderTask;
use tidemark_filer::{DataDir, LocalFiler};
use tidemark_testkit::{Moto, unique_name};

struct World {
    filer: Arc<LocalFiler>,
    blobs: S3Blobs,
    _moto: Moto,
    _dir: tempfile::TempDir,
}

async fn world() -> World {
    let moto = Moto::get();
    let bucket = unique_name("blobs");
    let storage = tidemark_cloud::aws::s3::S3Storage::connect(&moto.conf("s3"), &bucket).await.unwrap();
    storage.client().create_bucket().bucket(&bucket).send().await.unwrap();
    let url = BlobStoreUrl::parse(&format!("s3://{bucket}/cluster-a?endpoint={}", moto.endpoint)).unwrap();
    let blobs = S3Blobs::connect(&url, Some(("testing", "testing"))).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let filer = LocalFiler::open(DataDir::open(dir.path()).unwrap()).unwrap().with_blob_store(blobs.clone());
    World { filer: Arc::new(filer), blobs, _moto: moto, _dir: dir }
}

fn pattern(n: usize, seed: u8) -> Bytes {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect::<Vec<u8>>().into()
}

async fn write(w: &World, path: &str, body: Bytes) -> tidemark_core::Entry {
    // In pieces, as a client streams it.
    let pieces: Vec<std::io::Result<Bytes>> = body.chunks(100_000).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
    w.filer.write(path, futures::stream::iter(pieces).boxed(), WriteOptions::default()).await.unwrap()
}

async fn read(w: &World, path: &str, range: Option<ByteRange>) -> Vec<u8> {
    let (_, s) = w.filer.read(path, range).await.unwrap();
    let parts: Vec<Bytes> = s.map(|c| c.unwrap()).collect().await;
    parts.concat()
}

async fn listed(w: &World) -> Vec<String> {
    let (ids, next) = w.blobs.list(None).await.unwrap();
    assert!(next.is_none());
    ids.into_iter().map(|(id, _)| id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_of_every_size_round_trips_through_the_blob_store() {
    let w = world().await;
    let small = write(&w, "/f/small", Bytes::from_static(b"inline")).await;
    assert_eq!(small.content, Content::Inline, "small content stays in the store");
    for (path, size) in [("/f/one-put", 100_000), ("/f/multipart", 20 * 1024 * 1024 + 12_345)] {
        let body = pattern(size, 7);
        let e = write(&w, path, body.clone()).await;
        let Content::Blob { id } = &e.content else { panic!("{path}: {:?}", e.content) };
        assert_eq!(w.blobs.size_of(id).await.unwrap(), Some(size as u64), "{path}: the object holds the bytes");
        assert_eq!(read(&w, path, None).await, body, "{path}");
        let r = ByteRange { offset: (size as u64) - 9_000_000.min(size as u64 - 10), length: Some(10) };
        assert_eq!(read(&w, path, Some(r)).await, &body[r.offset as usize..r.offset as usize + 10], "{path} ranged");
        let md5 = md5_of(&body);
        assert_eq!(e.extended.get("md5"), Some(&md5), "{path}: the MD5 hashed as it streamed");
    }
    assert_eq!(listed(&w).await.len(), 2);
}

fn md5_of(b: &[u8]) -> String {
    use md5::Digest;
    md5::Md5::digest(b).iter().map(|x| format!("{x:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_breaks_off_leaves_no_object_behind() {
    let w = world().await;
    for size in [200_000, 18 * 1024 * 1024] {
        let pieces: Vec<std::io::Result<Bytes>> =
            vec![Ok(pattern(size, 1)), Err(std::io::Error::other("client went away"))];
        let err = w.filer.write("/f/broken", futures::stream::iter(pieces).boxed(), WriteOptions::default()).await;
        assert!(err.unwrap_err().to_string().contains("client went away"));
    }
    assert!(listed(&w).await.is_empty(), "neither the single put nor the multipart upload left an object");
    assert!(w.filer.stat("/f/broken").await.unwrap().is_none());
}

/// The collector removes the blob of every version a commit let go of (overwritten, deleted,
/// replaced by small content), and only after its grace period; the sweep removes a blob that
/// no entry ever named (a crash between storing and committing), once old enough; nothing an
/// entry names is ever removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_collector_removes_what_commits_let_go_and_the_sweep_what_nothing_named() {
    let w = world().await;
    let v1 = write(&w, "/g/overwritten", pattern(100_000, 1)).await;
    write(&w, "/g/overwritten", pattern(150_000, 2)).await;
    write(&w, "/g/deleted", pattern(120_000, 3)).await;
    w.filer.delete("/g/deleted", DeleteOptions::default()).await.unwrap();
    write(&w, "/g/shrunk", pattern(120_000, 4)).await;
    write(&w, "/g/shrunk", Bytes::from_static(b"tiny now")).await;
    let kept = write(&w, "/g/kept", pattern(300_000, 5)).await;
    // What a crash between storing and committing leaves: a blob nothing names.
    let orphan = "0123456789abcdef0123456789abcdef";
    w.blobs.put_as(orphan, aws_sdk_s3::primitives::ByteStream::from_static(b"never committed")).await.unwrap();
    assert_eq!(listed(&w).await.len(), 6, "nothing is removed before the collector runs");
    let Content::Blob { id: old } = &v1.content else { panic!() };
    assert_eq!(read_blob(&w, old).await, pattern(100_000, 1), "a reader of the old entry still finds its bytes");

    let lease = w.filer.lease_acquire(gc::LEASE, "test", Duration::from_secs(30)).await.unwrap();
    // Within the grace period: nothing goes.
    let patient =
        BlobCollector::new(w.filer.clone(), "test").with_grace(Duration::from_secs(3600)).with_poll(Duration::ZERO);
    patient.resume().await.unwrap();
    step_until_idle(&patient, &lease.fence()).await;
    assert_eq!(listed(&w).await.len(), 6, "young records wait for their grace period");
    // Past it: the three let go of go; the sweep (at start) keeps the orphan, too young.
    let collector = BlobCollector::new(w.filer.clone(), "test").with_grace(Duration::ZERO).with_poll(Duration::ZERO);
    collector.resume().await.unwrap();
    step_until_idle(&collector, &lease.fence()).await;
    let left = listed(&w).await;
    let Content::Blob { id: kept_id } = &kept.content else { panic!() };
    let over = match w.filer.stat("/g/overwritten").await.unwrap().unwrap().content {
        Content::Blob { id } => id,
        c => panic!("{c:?}"),
    };
    let mut want = vec![kept_id.clone(), over, orphan.to_string()];
    want.sort();
    assert_eq!(left, want, "only what entries name, and the young orphan");
    // The sweep with no minimum age takes the orphan and nothing named.
    let now = w.filer.clock().now_ms() + 1000;
    let report = gc::sweep(w.filer.store().as_ref(), w.filer.blobs(), now, Duration::ZERO).await.unwrap();
    assert_eq!((report.removed, report.named), (1, 2), "{report}");
    assert_eq!(read(&w, "/g/kept", None).await, pattern(300_000, 5));
    assert_eq!(read(&w, "/g/overwritten", None).await, pattern(150_000, 2));
    // A second pass changes nothing.
    step_until_idle(&collector, &lease.fence()).await;
    assert_eq!(listed(&w).await.len(), 2);
}

async fn read_blob(w: &World, id: &str) -> Vec<u8> {
    let parts: Vec<Bytes> = w.blobs.open_range(id, None).await.unwrap().map(|c| c.unwrap()).collect().await;
    parts.concat()
}

/// Steps the collector until it has read the whole change log.
async fn step_until_idle(c: &BlobCollector, fence: &tidemark_core::model::Fence) {
    for _ in 0..5 {
        tokio::time::timeout(Duration::from_secs(20), c.step(fence)).await.expect("a step ends").unwrap();
    }
}

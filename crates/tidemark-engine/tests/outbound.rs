//! The outbound sync's per-record decisions, on the in-memory bucket and a real filer.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use futures::StreamExt;
use tidemark_cloud::memory::MemoryStorage;
use tidemark_core::decide::is_locally_dirty;
use tidemark_core::model::{NewEntry, Origin, Txn};
use tidemark_core::remote::{Mount, RemoteLocation};
use tidemark_core::{ByteStream, DeleteOptions, Filer, SystemClock, WriteOptions};
use tidemark_engine::outbound::{OutboundOutcome, sync_record};
use tidemark_filer::{DataDir, LocalFiler};

fn body(s: &'static str) -> ByteStream {
    futures::stream::once(async move { Ok(Bytes::from_static(s.as_bytes())) }).boxed()
}

async fn setup() -> (Arc<LocalFiler>, MemoryStorage, Mount, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let filer = Arc::new(LocalFiler::open(DataDir::open(dir.path()).unwrap()).unwrap());
    filer.apply(Txn::put("/m", NewEntry::dir(0), Origin::System)).await.unwrap();
    let mount = Mount {
        dir: "/m".into(),
        location: RemoteLocation { storage: "mem".into(), bucket: "b".into(), path: "pre".into() },
        sync: true,
    };
    (filer, MemoryStorage::default(), mount, dir)
}

async fn sync_all_since(filer: &LocalFiler, bucket: &MemoryStorage, mount: &Mount, after: u64) -> Vec<OutboundOutcome> {
    let mut out = Vec::new();
    for r in filer.changes(after, 1000, std::time::Duration::ZERO).await.unwrap() {
        if tidemark_core::path::is_within(&r.path, &mount.dir) {
            out.push(sync_record(filer, bucket, mount, "cluster-1", &SystemClock, &r).await.unwrap());
        }
    }
    out
}

#[tokio::test]
async fn a_local_write_is_uploaded_once_with_origin_metadata_and_recorded() {
    let (filer, bucket, mount, _d) = setup().await;
    let start = filer.store().last_seq().await.unwrap();
    let e = filer.write("/m/dir/a.txt", body("hello"), WriteOptions::default()).await.unwrap();
    let out = sync_all_since(&filer, &bucket, &mount, start).await;
    assert!(
        out.contains(&OutboundOutcome::Uploaded { path: "/m/dir/a.txt".into(), key: "pre/dir/a.txt".into() }),
        "{out:?}"
    );
    let obj = tidemark_core::RemoteStorage::stat(&bucket, "pre/dir/a.txt").await.unwrap().unwrap();
    let meta = obj.user_metadata.clone().unwrap();
    assert_eq!(meta["tidemark-origin"], "cluster-1");
    assert_eq!(meta["tidemark-version"], e.version.to_string());
    let synced = filer.stat("/m/dir/a.txt").await.unwrap().unwrap();
    assert_eq!(synced.remote.as_ref().unwrap().etag, obj.etag, "the upload's etag is recorded");
    assert!(!is_locally_dirty(&synced), "no longer dirty");
    // Handling the same records again (a restart before the cursor was saved) uploads nothing.
    let puts = bucket.calls.put.load(Ordering::SeqCst);
    let again = sync_all_since(&filer, &bucket, &mount, start).await;
    assert!(again.iter().all(|o| *o == OutboundOutcome::Nothing), "{again:?}");
    assert_eq!(bucket.calls.put.load(Ordering::SeqCst), puts);
}

#[tokio::test]
async fn user_deletes_propagate_and_remote_ones_do_not() {
    let (filer, bucket, mount, _d) = setup().await;
    filer.write("/m/x.txt", body("x"), WriteOptions::default()).await.unwrap();
    sync_all_since(&filer, &bucket, &mount, 0).await;
    assert!(!bucket.is_empty());

    // A delete applied from the remote (origin remote) never deletes the object again.
    let before = filer.store().last_seq().await.unwrap();
    let v = filer.stat("/m/x.txt").await.unwrap().unwrap().version;
    let remote_delete =
        Txn::delete("/m/x.txt", false, Origin::Remote).with_precondition(tidemark_core::Precondition::Version(v));
    filer.apply(remote_delete).await.unwrap();
    let out = sync_all_since(&filer, &bucket, &mount, before).await;
    assert!(out.iter().all(|o| *o == OutboundOutcome::Nothing), "{out:?}");
    assert_eq!(bucket.calls.delete.load(Ordering::SeqCst), 0);

    // A user's delete does.
    filer.write("/m/y.txt", body("y"), WriteOptions::default()).await.unwrap();
    let mid = filer.store().last_seq().await.unwrap();
    sync_all_since(&filer, &bucket, &mount, before).await;
    filer.delete("/m/y.txt", DeleteOptions::default()).await.unwrap();
    let out = sync_all_since(&filer, &bucket, &mount, mid).await;
    assert!(out.contains(&OutboundOutcome::Deleted { path: "/m/y.txt".into(), key: "pre/y.txt".into() }), "{out:?}");
    assert!(tidemark_core::RemoteStorage::stat(&bucket, "pre/y.txt").await.unwrap().is_none());
    // A local-only file deleted before it was ever uploaded touches nothing.
    filer.write("/m/z.txt", body("z"), WriteOptions::default()).await.unwrap();
    filer.delete("/m/z.txt", DeleteOptions::default()).await.unwrap();
    let deletes = bucket.calls.delete.load(Ordering::SeqCst);
    let tail = filer.store().last_seq().await.unwrap() - 1;
    sync_all_since(&filer, &bucket, &mount, tail).await;
    assert_eq!(bucket.calls.delete.load(Ordering::SeqCst), deletes);
}

#[tokio::test]
async fn a_superseded_version_is_left_to_its_newer_record() {
    let (filer, bucket, mount, _d) = setup().await;
    let start = filer.store().last_seq().await.unwrap();
    filer.write("/m/f", body("one"), WriteOptions::default()).await.unwrap();
    let first = filer.changes(start, 10, std::time::Duration::ZERO).await.unwrap();
    filer.write("/m/f", body("two!"), WriteOptions::default()).await.unwrap();
    // Handling the first record now uploads the current content (it looks at current state)...
    for r in &first {
        sync_record(&*filer, &bucket, &mount, "c", &SystemClock, r).await.unwrap();
    }
    let obj = tidemark_core::RemoteStorage::stat(&bucket, "pre/f").await.unwrap().unwrap();
    assert_eq!(obj.size, 4);
    // ...and the second record then finds it synced.
    let rest = sync_all_since(&filer, &bucket, &mount, first.last().unwrap().seq).await;
    assert!(rest.iter().all(|o| *o == OutboundOutcome::Nothing), "{rest:?}");
}

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

/// A mount of the memory bucket that syncs, as `remote.mount` leaves it (its mapping document,
/// so the filer renames in place and leaves tombstones), with reads served by `bucket`.
async fn synced_mount_of(filer: &LocalFiler, bucket: &MemoryStorage, mount: &Mount) {
    use tidemark_core::model::Content;
    use tidemark_core::remote::{MountMapping, system_paths};
    let doc = Bytes::from(serde_json::to_vec(&MountMapping { mounts: vec![mount.clone()] }).unwrap());
    let txn =
        Txn::put(system_paths::MOUNT_MAPPING, NewEntry::file(doc.len() as u64, 1, Content::Inline), Origin::System)
            .with_data(doc);
    filer.apply(txn).await.unwrap();
    filer.remotes().provide("mem", "b", Arc::new(bucket.clone()));
}

async fn reconcile_mount(filer: &LocalFiler, bucket: &MemoryStorage, mount: &Mount) {
    let opts = tidemark_engine::reconcile::ReconcileOptions {
        delete: true,
        cluster_id: Some("cluster-1".into()),
        ..Default::default()
    };
    tidemark_engine::reconcile::reconcile(filer, bucket, mount, &opts, &mut |_| {}).await.unwrap();
}

async fn read(filer: &LocalFiler, p: &str) -> Vec<u8> {
    let (_, mut s) = filer.read(p, None).await.unwrap();
    let mut out = Vec::new();
    while let Some(c) = s.next().await {
        out.extend_from_slice(&c.unwrap());
    }
    out
}

async fn keys(bucket: &MemoryStorage) -> Vec<String> {
    let page = tidemark_core::RemoteStorage::list(bucket, "pre/", None, None, 1000).await.unwrap();
    page.objects.into_iter().map(|o| o.key).collect()
}

/// A rename in a mount that syncs moves the bucket's keys: each object is put at its new key
/// (from the old key's bytes, the file not being cached), then the old key deleted — never
/// before, whichever record a crash stops at (every prefix of the records is handled, then all
/// of them again, as a restart does). Meanwhile the files read their bytes from the old keys, and
/// a reconcile neither brings the old keys back nor drops the moved files.
#[tokio::test]
async fn a_rename_moves_the_keys_after_their_copies_at_any_point_of_a_restart() {
    let objects = [("pre/d/a", "A"), ("pre/d/sub/b", "BB"), ("pre/c", "CCC")];
    let moved = [("/m/e/a", "pre/d/a", "pre/e/a", "A"), ("/m/e/sub/b", "pre/d/sub/b", "pre/e/sub/b", "BB")];
    for stop in 0..12 {
        let (filer, bucket, mount, _d) = setup().await;
        synced_mount_of(&filer, &bucket, &mount).await;
        for (k, v) in objects {
            tidemark_core::RemoteStorage::put(&bucket, k, Bytes::from(v), Default::default()).await.unwrap();
        }
        reconcile_mount(&filer, &bucket, &mount).await;
        assert_eq!(read(&filer, "/m/d/a").await, b"A");
        let start = filer.store().last_seq().await.unwrap();
        filer.apply(Txn::rename("/m/d", "/m/e", Origin::Local)).await.unwrap();
        // Not carried yet: read from the old keys; a reconcile changes nothing.
        for (p, _, _, v) in moved {
            assert_eq!(read(&filer, p).await, v.as_bytes(), "{p}");
        }
        reconcile_mount(&filer, &bucket, &mount).await;
        assert!(filer.stat("/m/d").await.unwrap().is_none(), "the old keys are not brought back");
        assert!(filer.stat("/m/e/sub/b").await.unwrap().is_some(), "the moved files stay");
        let records = filer.changes(start, 1000, std::time::Duration::ZERO).await.unwrap();
        for r in records.iter().take(stop) {
            sync_record(&*filer, &bucket, &mount, "cluster-1", &SystemClock, r).await.unwrap();
            // No object is ever deleted before its copy exists.
            let now = keys(&bucket).await;
            for (p, old, new, _) in moved {
                assert!(now.iter().any(|k| k == old || k == new), "after {stop} records, {p} has no object: {now:?}");
            }
        }
        // The restart: every record again, from the cursor before the rename.
        let mut outcomes = Vec::new();
        for r in records.iter().filter(|r| tidemark_core::path::is_within(&r.path, "/m")) {
            outcomes.push(sync_record(&*filer, &bucket, &mount, "cluster-1", &SystemClock, r).await.unwrap());
        }
        assert_eq!(keys(&bucket).await, vec!["pre/c", "pre/e/a", "pre/e/sub/b"], "after a stop at {stop}");
        for (p, _, new, v) in moved {
            let e = filer.stat(p).await.unwrap().unwrap();
            assert!(!is_locally_dirty(&e) && !tidemark_core::decide::is_moved(&e), "{p}: {e:?}");
            let o = tidemark_core::RemoteStorage::stat(&bucket, new).await.unwrap().unwrap();
            assert_eq!(e.remote.as_ref().unwrap().etag, o.etag);
            assert_eq!(read(&filer, p).await, v.as_bytes());
        }
        let tombstones = filer.list(tidemark_core::remote::system_paths::TOMBSTONES_DIR, None, 10).await;
        assert!(tombstones.map(|p| p.entries.is_empty()).unwrap_or(true), "the rename's tombstones are gone");
        // The bucket's events for the copies are echoes; a reconcile now changes nothing.
        let before = filer.store().last_seq().await.unwrap();
        reconcile_mount(&filer, &bucket, &mount).await;
        let writes = filer.changes(before, 10, std::time::Duration::ZERO).await.unwrap();
        assert!(writes.is_empty(), "{writes:?}");
        if stop == 0 {
            assert!(
                outcomes.iter().any(|o| matches!(o, OutboundOutcome::Moved { path, .. } if path == "/m/e/a")),
                "{outcomes:?}"
            );
        }
    }
}

/// Renamed twice before the sync, renamed back, deleted after a rename, or replaced by another
/// rename: each object ends at the key of the entry holding it and nowhere else. A renamed file
/// whose object someone else deleted at its old key before the sync goes, as that delete
/// would have taken it.
#[tokio::test]
async fn renames_before_the_sync_end_at_the_last_key_and_lose_nothing() {
    let (filer, bucket, mount, _d) = setup().await;
    synced_mount_of(&filer, &bucket, &mount).await;
    for (k, v) in [("pre/a", "1"), ("pre/back", "2"), ("pre/gone", "3"), ("pre/x", "4"), ("pre/y", "5"), ("pre/z", "6")]
    {
        tidemark_core::RemoteStorage::put(&bucket, k, Bytes::from(v), Default::default()).await.unwrap();
    }
    reconcile_mount(&filer, &bucket, &mount).await;
    let start = filer.store().last_seq().await.unwrap();
    let mv = |a: &'static str, b: &'static str| Txn::rename(a, b, Origin::Local);
    for t in [
        mv("/m/a", "/m/b"),
        mv("/m/b", "/m/c"),
        mv("/m/back", "/m/tmp"),
        mv("/m/tmp", "/m/back"),
        mv("/m/gone", "/m/gone2"),
    ] {
        filer.apply(t).await.unwrap();
    }
    // x is renamed, then deleted; y is renamed over z (whose own object goes with it).
    filer.apply(mv("/m/x", "/m/x2")).await.unwrap();
    filer.delete("/m/x2", DeleteOptions::default()).await.unwrap();
    filer.apply(mv("/m/z", "/m/z2")).await.unwrap();
    filer.apply(mv("/m/y", "/m/z2")).await.unwrap();
    // Someone deletes the object behind a renamed file before the sync.
    tidemark_core::RemoteStorage::delete(&bucket, "pre/gone").await.unwrap();
    let out = sync_all_since(&filer, &bucket, &mount, start).await;
    assert!(out.iter().any(|o| matches!(o, OutboundOutcome::SourceGone { path, .. } if path == "/m/gone2")), "{out:?}");
    assert_eq!(keys(&bucket).await, vec!["pre/back", "pre/c", "pre/z2"]);
    assert_eq!(read(&filer, "/m/c").await, b"1");
    assert_eq!(read(&filer, "/m/back").await, b"2");
    assert_eq!(read(&filer, "/m/z2").await, b"5");
    assert!(filer.stat("/m/gone2").await.unwrap().is_none());
    let names: Vec<String> = filer.list("/m", None, 100).await.unwrap().entries.into_iter().map(|e| e.path).collect();
    assert_eq!(names, vec!["/m/back", "/m/c", "/m/z2"]);
    reconcile_mount(&filer, &bucket, &mount).await;
    let again: Vec<String> = filer.list("/m", None, 100).await.unwrap().entries.into_iter().map(|e| e.path).collect();
    assert_eq!(again, names, "a reconcile after the sync finds nothing to change");
}

/// A file renamed away and renamed again before the sync, while a new file is written at its
/// first path: the new file's upload must not overwrite the object the renamed file still reads
/// from (its old key) before that object has been copied.
#[tokio::test]
async fn a_new_file_at_an_old_path_waits_for_the_renamed_file_to_be_copied() {
    let (filer, bucket, mount, _d) = setup().await;
    synced_mount_of(&filer, &bucket, &mount).await;
    tidemark_core::RemoteStorage::put(&bucket, "pre/a", Bytes::from("first"), Default::default()).await.unwrap();
    reconcile_mount(&filer, &bucket, &mount).await;
    let start = filer.store().last_seq().await.unwrap();
    filer.apply(Txn::rename("/m/a", "/m/b", Origin::Local)).await.unwrap();
    filer.write("/m/a", body("second"), WriteOptions::default()).await.unwrap();
    filer.apply(Txn::rename("/m/b", "/m/c", Origin::Local)).await.unwrap();
    let out = sync_all_since(&filer, &bucket, &mount, start).await;
    assert_eq!(read(&filer, "/m/c").await, b"first", "{out:?}");
    assert_eq!(read(&filer, "/m/a").await, b"second");
    assert_eq!(keys(&bucket).await, vec!["pre/a", "pre/c"]);
}

/// The memory bucket whose deletes fail while `failing` is set (a bucket that refuses, or a
/// crash between the copy's record and the old key's delete).
struct FailingDeletes {
    inner: MemoryStorage,
    failing: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl tidemark_core::RemoteStorage for FailingDeletes {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn stat(&self, key: &str) -> tidemark_core::Result<Option<tidemark_core::remote::RemoteObject>> {
        self.inner.stat(key).await
    }
    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        page: Option<&str>,
        max: usize,
    ) -> tidemark_core::Result<tidemark_core::remote::ListPage> {
        self.inner.list(prefix, start_after, page, max).await
    }
    async fn get(
        &self,
        key: &str,
        range: Option<tidemark_core::ByteRange>,
        if_etag: Option<&str>,
    ) -> tidemark_core::Result<ByteStream> {
        self.inner.get(key, range, if_etag).await
    }
    async fn put(
        &self,
        key: &str,
        body: Bytes,
        metadata: std::collections::BTreeMap<String, String>,
    ) -> tidemark_core::Result<tidemark_core::remote::RemoteObject> {
        self.inner.put(key, body, metadata).await
    }
    async fn delete(&self, key: &str) -> tidemark_core::Result<()> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(tidemark_core::Error::Unavailable { message: format!("{key}: injected") });
        }
        self.inner.delete(key).await
    }
}

/// A rename carried (the object put at its new key and recorded) whose old key's delete failed,
/// or never ran (a crash): handling the records again deletes it, and nothing else.
#[tokio::test]
async fn an_old_key_whose_delete_failed_is_deleted_when_the_records_are_handled_again() {
    let (filer, bucket, mount, _d) = setup().await;
    synced_mount_of(&filer, &bucket, &mount).await;
    tidemark_core::RemoteStorage::put(&bucket, "pre/a", Bytes::from("A"), Default::default()).await.unwrap();
    reconcile_mount(&filer, &bucket, &mount).await;
    let start = filer.store().last_seq().await.unwrap();
    filer.apply(Txn::rename("/m/a", "/m/b", Origin::Local)).await.unwrap();
    let failing = FailingDeletes { inner: bucket.clone(), failing: true.into() };
    let records = filer.changes(start, 100, std::time::Duration::ZERO).await.unwrap();
    let mine: Vec<_> = records.iter().filter(|r| tidemark_core::path::is_within(&r.path, "/m")).collect();
    let first = sync_record(&*filer, &failing, &mount, "cluster-1", &SystemClock, mine[0]).await;
    assert!(first.is_err(), "{first:?}");
    assert_eq!(keys(&bucket).await, vec!["pre/a", "pre/b"], "copied, recorded, the old key still there");
    failing.failing.store(false, Ordering::SeqCst);
    for r in &mine {
        sync_record(&*filer, &failing, &mount, "cluster-1", &SystemClock, r).await.unwrap();
    }
    assert_eq!(keys(&bucket).await, vec!["pre/b"]);
    assert_eq!(read(&filer, "/m/b").await, b"A");
    let tombstones = filer.list(tidemark_core::remote::system_paths::TOMBSTONES_DIR, None, 10).await;
    assert!(tombstones.map(|p| p.entries.is_empty()).unwrap_or(true));
}

/// Two files swapped through a third name before the sync (neither cached): each key ends with
/// the other's bytes, and neither is lost on the way, though each upload overwrites the object
/// the other reads.
#[tokio::test]
async fn a_swap_before_the_sync_keeps_both_files() {
    let (filer, bucket, mount, _d) = setup().await;
    synced_mount_of(&filer, &bucket, &mount).await;
    for (k, v) in [("pre/x", "ex"), ("pre/y", "why")] {
        tidemark_core::RemoteStorage::put(&bucket, k, Bytes::from(v), Default::default()).await.unwrap();
    }
    reconcile_mount(&filer, &bucket, &mount).await;
    let start = filer.store().last_seq().await.unwrap();
    for (a, b) in [("/m/x", "/m/t"), ("/m/y", "/m/x"), ("/m/t", "/m/y")] {
        filer.apply(Txn::rename(a, b, Origin::Local)).await.unwrap();
    }
    let out = sync_all_since(&filer, &bucket, &mount, start).await;
    assert_eq!(read(&filer, "/m/x").await, b"why", "{out:?}");
    assert_eq!(read(&filer, "/m/y").await, b"ex");
    assert_eq!(keys(&bucket).await, vec!["pre/x", "pre/y"]);
    for (k, v) in [("pre/x", "why"), ("pre/y", "ex")] {
        let o = tidemark_core::RemoteStorage::stat(&bucket, k).await.unwrap().unwrap();
        assert_eq!(o.size, v.len() as u64, "{k}");
    }
    reconcile_mount(&filer, &bucket, &mount).await;
    assert_eq!(read(&filer, "/m/x").await, b"why");
    assert!(filer.stat("/m/t").await.unwrap().is_none(), "nothing at the third name");
}

/// A file written, uploaded and recorded, then deleted from the bucket (and so from the
/// namespace); a new file written at its path and deleted by its user before it was uploaded;
/// meanwhile someone restores the first file's upload: that object is not the new file's pending
/// upload (it is from before the new file was created) and the user's delete leaves it.
#[tokio::test]
async fn a_restored_upload_of_an_earlier_file_is_not_taken_for_a_new_files_own() {
    let (filer, bucket, mount, _d) = setup().await;
    synced_mount_of(&filer, &bucket, &mount).await;
    let start = filer.store().last_seq().await.unwrap();
    filer.write("/m/a", body("first"), WriteOptions::default()).await.unwrap();
    sync_all_since(&filer, &bucket, &mount, start).await;
    let first = tidemark_core::RemoteStorage::stat(&bucket, "pre/a").await.unwrap().unwrap();
    let s = tidemark_core::RemoteStorage::get(&bucket, "pre/a", None, None).await.unwrap();
    let first_bytes: Vec<u8> = s.map(|c| c.unwrap()).collect::<Vec<_>>().await.concat();
    // Deleted in the bucket; its event applied.
    tidemark_core::RemoteStorage::delete(&bucket, "pre/a").await.unwrap();
    let v = filer.stat("/m/a").await.unwrap().unwrap().version;
    filer
        .apply(Txn::delete("/m/a", false, Origin::Remote).with_precondition(tidemark_core::Precondition::Version(v)))
        .await
        .unwrap();
    // A new file there, deleted before the sync uploaded it.
    let mid = filer.store().last_seq().await.unwrap();
    filer.write("/m/a", body("second"), WriteOptions::default()).await.unwrap();
    filer.delete("/m/a", DeleteOptions::default()).await.unwrap();
    // Someone restores the first file's upload (a copy keeps its metadata).
    tidemark_core::RemoteStorage::put(&bucket, "pre/a", Bytes::from(first_bytes), first.user_metadata.clone().unwrap())
        .await
        .unwrap();
    let out = sync_all_since(&filer, &bucket, &mount, mid).await;
    assert!(tidemark_core::RemoteStorage::stat(&bucket, "pre/a").await.unwrap().is_some(), "{out:?}");
    assert!(out.iter().any(|o| matches!(o, OutboundOutcome::KeptNewer { .. })), "{out:?}");
}

/// `mv a b; mv b c` while the sync is copying b's bytes to b's key: that copy is nobody's. Its
/// event (here a reconcile, which decides as an event's apply does) must not bring `b` back — the
/// second rename left a tombstone of b's pending upload — and the sync deletes it when it handles
/// b's old path; `c` ends at its key with its bytes.
#[tokio::test]
async fn an_upload_in_flight_when_its_file_is_renamed_again_is_nobodys_and_goes() {
    let (filer, bucket, mount, _d) = setup().await;
    synced_mount_of(&filer, &bucket, &mount).await;
    tidemark_core::RemoteStorage::put(&bucket, "pre/a", Bytes::from("1"), Default::default()).await.unwrap();
    reconcile_mount(&filer, &bucket, &mount).await;
    let start = filer.store().last_seq().await.unwrap();
    filer.apply(Txn::rename("/m/a", "/m/b", Origin::Local)).await.unwrap();
    // The sync's copy of b, as it makes it (its metadata names b's version)...
    let b = filer.stat("/m/b").await.unwrap().unwrap();
    let meta = tidemark_core::decide::upload_metadata("cluster-1", "/m/b", b.version);
    let etag = b.remote.as_ref().unwrap().etag.clone();
    tidemark_core::RemoteStorage::copy(&bucket, "pre/a", "pre/b", &etag, meta, &Default::default()).await.unwrap();
    // ...lands just after the user's second rename.
    filer.apply(Txn::rename("/m/b", "/m/c", Origin::Local)).await.unwrap();
    reconcile_mount(&filer, &bucket, &mount).await;
    assert!(filer.stat("/m/b").await.unwrap().is_none(), "the in-flight copy brought the renamed file back");
    sync_all_since(&filer, &bucket, &mount, start).await;
    assert_eq!(keys(&bucket).await, vec!["pre/c"]);
    assert_eq!(read(&filer, "/m/c").await, b"1");
    let names: Vec<String> = filer.list("/m", None, 100).await.unwrap().entries.into_iter().map(|e| e.path).collect();
    assert_eq!(names, vec!["/m/c"]);
    reconcile_mount(&filer, &bucket, &mount).await;
    assert!(filer.stat("/m/b").await.unwrap().is_none());
}

/// A new file deleted by its user while the sync is putting it at its key: that upload is
/// nobody's. Its event (here a reconcile, which decides as an event's apply does) must not bring
/// the file back — the delete left a tombstone of the pending upload — and the sync deletes the
/// object when it handles the delete.
#[tokio::test]
async fn an_upload_in_flight_when_its_file_is_deleted_is_nobodys_and_goes() {
    let (filer, bucket, mount, _d) = setup().await;
    synced_mount_of(&filer, &bucket, &mount).await;
    let start = filer.store().last_seq().await.unwrap();
    let e = filer.write("/m/new", body("fresh"), WriteOptions::default()).await.unwrap();
    // The sync's upload of it, as it makes it (its metadata names the file's version)...
    let meta = tidemark_core::decide::upload_metadata("cluster-1", "/m/new", e.version);
    tidemark_core::RemoteStorage::put(&bucket, "pre/new", Bytes::from("fresh"), meta).await.unwrap();
    // ...lands just after the user's delete.
    filer.delete("/m/new", DeleteOptions::default()).await.unwrap();
    reconcile_mount(&filer, &bucket, &mount).await;
    assert!(filer.stat("/m/new").await.unwrap().is_none(), "the in-flight upload brought the deleted file back");
    sync_all_since(&filer, &bucket, &mount, start).await;
    assert!(keys(&bucket).await.is_empty(), "{:?}", keys(&bucket).await);
    reconcile_mount(&filer, &bucket, &mount).await;
    assert!(filer.stat("/m/new").await.unwrap().is_none());
}

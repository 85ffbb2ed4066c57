//! The content cache, on a real filer over a local-directory bucket: reads served from the
//! cache make no remote call (the object can be gone and the read still succeeds), ranges fetch
//! only their chunks, one fetch per cold chunk whatever the readers, a new remote version is
//! never served old bytes, eviction keeps the budget, and crashes leave nothing reachable.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use tidemark_cloud::local::LocalStorage;
use tidemark_core::cache::{CachedChunk, content_id};
use tidemark_core::model::{NewEntry, Origin, Txn};
use tidemark_core::remote::{Mount, MountMapping, RemoteConf, RemoteLocation, StorageKind, system_paths};
use tidemark_core::{ByteRange, Error, Filer, WriteOptions};
use tidemark_engine::docs::write_json;
use tidemark_engine::reconcile::{ReconcileOptions, reconcile};
use tidemark_filer::{CacheConfig, DataDir, LocalFiler};

const CHUNK: u64 = 4096;

struct Setup {
    filer: Arc<LocalFiler>,
    bucket: PathBuf,
    storage: LocalStorage,
    mount: Mount,
    data: PathBuf,
    _tmp: tempfile::TempDir,
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

async fn open(data: &Path, budget: u64) -> Arc<LocalFiler> {
    open_chunked(data, budget, CHUNK).await
}

async fn open_chunked(data: &Path, budget: u64, chunk_bytes: u64) -> Arc<LocalFiler> {
    let filer = LocalFiler::open(DataDir::open(data).unwrap()).unwrap();
    // The tests' buckets are temporary directories: any local root may be served.
    filer.remotes().allow_local(tidemark_cloud::local::LocalRoots::any());
    Arc::new(filer.with_cache(CacheConfig { budget_bytes: budget, chunk_bytes }).unwrap())
}

async fn setup(budget: u64) -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("buckets");
    let bucket = root.join("bkt");
    std::fs::create_dir_all(&bucket).unwrap();
    let data = tmp.path().join("data");
    let filer = open(&data, budget).await;
    let conf = RemoteConf {
        name: "loc".into(),
        kind: StorageKind::Local,
        settings: [("root".to_string(), root.display().to_string())].into_iter().collect(),
    };
    write_json(&*filer, &system_paths::remote_conf("loc"), &conf, None).await.unwrap();
    let mount = Mount {
        dir: "/m".into(),
        location: RemoteLocation { storage: "loc".into(), bucket: "bkt".into(), path: String::new() },
        sync: false,
    };
    write_json(&*filer, system_paths::MOUNT_MAPPING, &MountMapping { mounts: vec![mount.clone()] }, None)
        .await
        .unwrap();
    filer.apply(Txn::put("/m", NewEntry::dir(0), Origin::System)).await.unwrap();
    let storage = LocalStorage::at(&root, "bkt").unwrap();
    Setup { filer, bucket, storage, mount, data, _tmp: tmp }
}

impl Setup {
    fn put(&self, key: &str, bytes: &[u8]) {
        let p = self.bucket.join(key);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }

    async fn sync(&self) {
        reconcile(&*self.filer, &self.storage, &self.mount, &ReconcileOptions::default(), &mut |_| {}).await.unwrap();
    }

    async fn read(&self, p: &str, range: Option<ByteRange>) -> Result<Vec<u8>, Error> {
        let (_, mut s) = self.filer.read(p, range).await?;
        let mut out = Vec::new();
        while let Some(c) = s.next().await {
            out.extend_from_slice(&c.map_err(|e| Error::Unavailable { message: e.to_string() })?);
        }
        self.filer.cache().idle().await;
        Ok(out)
    }

    async fn stats(&self) -> tidemark_core::cache::CacheStats {
        self.filer.cache_stats().await.unwrap()
    }

    async fn cached(&self, p: &str) -> u64 {
        self.filer.cache_status(&[p.to_string()]).await.unwrap()[0].cached_bytes
    }
}

#[tokio::test]
async fn a_second_read_makes_no_remote_call_and_survives_the_object_going() {
    let s = setup(1 << 30).await;
    let body = pattern(10 * CHUNK as usize + 123, 1);
    s.put("a.bin", &body);
    s.put("other.bin", b"never read");
    s.sync().await;

    assert_eq!(s.read("/m/a.bin", None).await.unwrap(), body);
    let cold = s.stats().await;
    assert_eq!(cold.misses, 11, "every chunk fetched once");
    assert_eq!(cold.requests, 1, "by one ranged GET for the run of missing chunks");
    assert_eq!(cold.bytes_fetched, body.len() as u64);
    assert_eq!(s.cached("/m/a.bin").await, body.len() as u64);

    assert_eq!(s.read("/m/a.bin", None).await.unwrap(), body);
    let warm = s.stats().await;
    assert_eq!(warm.misses, cold.misses, "the second read made no remote call");
    assert_eq!(warm.hits, 11);
    assert_eq!(warm.bytes_served, body.len() as u64);

    // The bucket loses both objects (as if it were unreachable): the cached file still reads,
    // the uncached one fails with one clear line.
    std::fs::remove_file(s.bucket.join("a.bin")).unwrap();
    std::fs::remove_file(s.bucket.join("other.bin")).unwrap();
    assert_eq!(s.read("/m/a.bin", None).await.unwrap(), body, "served from the cache alone");
    let err = s.read("/m/other.bin", None).await.unwrap_err().to_string();
    assert!(err.contains("/m/other.bin") && err.contains("gone from the bucket"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[tokio::test]
async fn ranges_fetch_only_their_chunks_cold_and_warm() {
    let s = setup(1 << 30).await;
    let body = pattern(20 * CHUNK as usize, 2);
    s.put("big.bin", &body);
    s.sync().await;

    let r = ByteRange { offset: 5 * CHUNK + 10, length: Some(100) };
    assert_eq!(s.read("/m/big.bin", Some(r)).await.unwrap(), &body[5 * CHUNK as usize + 10..][..100]);
    let st = s.stats().await;
    assert_eq!((st.misses, st.requests), (1, 1), "a small range fetches one chunk, not the object");
    assert_eq!(s.cached("/m/big.bin").await, CHUNK);

    // Across a chunk boundary: one more chunk; the cached one is a hit.
    let r = ByteRange { offset: 6 * CHUNK - 5, length: Some(10) };
    assert_eq!(s.read("/m/big.bin", Some(r)).await.unwrap(), &body[6 * CHUNK as usize - 5..][..10]);
    let st = s.stats().await;
    assert_eq!((st.misses, st.hits), (2, 1));

    // To the end, from inside the last chunk; and an empty range at the end.
    let r = ByteRange { offset: 20 * CHUNK - 7, length: None };
    assert_eq!(s.read("/m/big.bin", Some(r)).await.unwrap(), &body[body.len() - 7..]);
    let r = ByteRange { offset: 20 * CHUNK, length: None };
    assert!(s.read("/m/big.bin", Some(r)).await.unwrap().is_empty());
    assert_eq!(s.stats().await.misses, 3);
    assert_eq!(s.read("/m/big.bin", None).await.unwrap(), body);
    let st = s.stats().await;
    assert_eq!(st.misses, 20);
    // The runs between the cached chunks: 0..5, 7..19 (chunk 6 came with the second read).
    assert_eq!(st.requests, 3 + 2, "{st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_early_does_not_fetch_the_whole_object() {
    let s = setup(1 << 30).await;
    let body = pattern(60 * CHUNK as usize, 5);
    s.put("huge.bin", &body);
    s.sync().await;
    let (_, mut stream) = s.filer.read("/m/huge.bin", None).await.unwrap();
    let mut got = 0;
    while got < 2 * CHUNK as usize {
        got += stream.next().await.unwrap().unwrap().len();
    }
    drop(stream);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let st = s.stats().await;
    assert!(st.misses <= 10, "a few chunks ahead of the reader at most: {st:?}");
    // Another reader picks the run up where it waits, and gets every byte.
    assert_eq!(s.read("/m/huge.bin", None).await.unwrap(), body);
    assert_eq!(s.stats().await.misses, 60, "still one fetch per chunk");
}

/// A run fetches chunks ahead of its reader, and they are written and recorded before a slow
/// reader comes for them: the reader still takes them from memory, not back from the disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_takes_the_chunks_fetched_ahead_of_it_from_memory() {
    let s = setup(1 << 30).await;
    let body = pattern(24 * CHUNK as usize + 7, 9);
    s.put("slow.bin", &body);
    s.sync().await;
    let (_, mut stream) = s.filer.read("/m/slow.bin", None).await.unwrap();
    let mut got = Vec::new();
    while let Some(piece) = stream.next().await {
        got.extend_from_slice(&piece.unwrap());
        // Time for the chunks ahead to be written, fsynced and recorded (a few ms each here;
        // eight ahead wait at most a quarter of the second the cache holds them).
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    }
    assert_eq!(got, body);
    s.filer.cache().idle().await;
    let st = s.stats().await;
    assert_eq!((st.misses, st.requests), (25, 1), "one GET, every chunk fetched once: {st:?}");
    assert_eq!(st.read_back, 0, "no chunk read back from the disk: {st:?}");
    assert_eq!(s.cached("/m/slow.bin").await, body.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_readers_of_a_cold_object_share_one_fetch_per_chunk() {
    let s = setup(1 << 30).await;
    let body = pattern(3 * CHUNK as usize + 1, 3);
    s.put("hot.bin", &body);
    s.sync().await;
    let barrier = Arc::new(tokio::sync::Barrier::new(32));
    let readers: Vec<_> = (0..32)
        .map(|_| {
            let (filer, barrier) = (s.filer.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let (_, st) = filer.read("/m/hot.bin", None).await.unwrap();
                let parts: Vec<Bytes> = st.map(|c| c.unwrap()).collect().await;
                parts.concat()
            })
        })
        .collect();
    for r in readers {
        assert_eq!(r.await.unwrap(), body);
    }
    s.filer.cache().idle().await;
    let st = s.stats().await;
    assert_eq!((st.misses, st.requests), (4, 1), "one GET for 32 readers: {st:?}");
}

#[tokio::test]
async fn a_new_remote_version_is_never_served_old_bytes() {
    let s = setup(1 << 30).await;
    s.put("f.txt", b"version one");
    s.sync().await;
    assert_eq!(s.read("/m/f.txt", None).await.unwrap(), b"version one");
    let v1 = s.filer.stat("/m/f.txt").await.unwrap().unwrap();
    let id1 = content_id(&v1).unwrap();
    let old_file = s.data.join("cache").join(&id1[..2]).join(&id1);
    assert!(old_file.is_file());

    // Overwritten in the bucket: until the metadata moves, the entry's version is what a read
    // returns (from the cache); once the reconcile commits, never again.
    std::thread::sleep(std::time::Duration::from_millis(20));
    s.put("f.txt", b"version two, longer");
    assert_eq!(s.read("/m/f.txt", None).await.unwrap(), b"version one", "the entry still describes v1");
    s.sync().await;
    assert_eq!(s.read("/m/f.txt", None).await.unwrap(), b"version two, longer");
    let node = s.filer.cache().node().to_string();
    let rows = s.filer.store().cache_chunks(&node, "/m/f.txt").await.unwrap();
    assert!(rows.iter().all(|c| c.content_id != id1), "the old version's records went with the update");
    assert!(!old_file.exists(), "and its bytes were reclaimed");

    // A late fetch of the old version (one that raced the update) cannot record it.
    let late = CachedChunk { node, path: "/m/f.txt".into(), content_id: id1, chunk: 0, len: 11, last_read_ms: 0 };
    assert!(!s.filer.store().cache_record(late).await.unwrap());

    // A delete in the bucket: the entry goes, and its cache with it.
    std::fs::remove_file(s.bucket.join("f.txt")).unwrap();
    s.sync().await;
    assert!(s.filer.stat("/m/f.txt").await.unwrap().is_none());
    assert_eq!(s.stats().await.resident_chunks, 0);
}

#[tokio::test]
async fn local_writes_replace_cached_content_and_are_never_cache() {
    let s = setup(1 << 30).await;
    s.put("f.txt", b"from the bucket");
    s.sync().await;
    assert_eq!(s.read("/m/f.txt", None).await.unwrap(), b"from the bucket");
    assert!(s.cached("/m/f.txt").await > 0);
    let body = futures::stream::once(async { Ok(Bytes::from_static(b"written here")) }).boxed();
    s.filer.write("/m/f.txt", body, WriteOptions::default()).await.unwrap();
    assert_eq!(s.read("/m/f.txt", None).await.unwrap(), b"written here");
    assert_eq!(s.cached("/m/f.txt").await, 0, "the write dropped the cached bytes");
    let out = s.filer.cache_fetch("/m/f.txt", true).await.unwrap();
    assert!(out.skipped.as_deref().is_some_and(|r| r.contains("never cache")), "{out:?}");
    let out = s.filer.cache_drop("/m/f.txt").await.unwrap();
    assert_eq!(out.bytes, 0);
    assert_eq!(s.read("/m/f.txt", None).await.unwrap(), b"written here", "uncache never touches local data");
}

#[tokio::test]
async fn fetch_and_drop_a_whole_file() {
    let s = setup(1 << 30).await;
    let body = pattern(5 * CHUNK as usize, 4);
    s.put("x.bin", &body);
    s.sync().await;
    let out = s.filer.cache_fetch("/m/x.bin", true).await.unwrap();
    assert_eq!((out.bytes, out.cached_bytes), (body.len() as u64, body.len() as u64), "{out:?}");
    let again = s.filer.cache_fetch("/m/x.bin", true).await.unwrap();
    assert_eq!(again.bytes, 0, "nothing left to fetch");
    assert_eq!(s.read("/m/x.bin", None).await.unwrap(), body);
    assert_eq!(s.stats().await.misses, 5, "the read after remote.cache was all hits");
    let dropped = s.filer.cache_drop("/m/x.bin").await.unwrap();
    assert_eq!(dropped.bytes, body.len() as u64);
    assert_eq!(s.cached("/m/x.bin").await, 0);
    let before = s.stats().await.requests;
    // At once: the fetches just recorded are still joinable for a moment.
    assert_eq!(s.read("/m/x.bin", None).await.unwrap(), body, "metadata stays; the next read fetches again");
    let after = s.stats().await;
    assert_eq!(after.misses, 10);
    assert_eq!(after.requests - before, 1, "one GET for the dropped run, not one per chunk: {after:?}");
}

#[tokio::test]
async fn eviction_keeps_the_budget_least_recently_read_first() {
    let s = setup(3 * CHUNK).await;
    for name in ["a", "b", "c", "d"] {
        s.put(name, &pattern(CHUNK as usize, name.as_bytes()[0]));
    }
    s.sync().await;
    for name in ["a", "b", "c"] {
        s.read(&format!("/m/{name}"), None).await.unwrap();
    }
    // `a` is read again: `b` is now the least recently read.
    std::thread::sleep(std::time::Duration::from_millis(5));
    s.read("/m/a", None).await.unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    s.read("/m/d", None).await.unwrap();
    s.filer.cache().housekeep().await.unwrap();
    let st = s.stats().await;
    assert!(st.resident_bytes <= 3 * CHUNK, "{st:?}");
    assert_eq!(st.evictions, 1, "{st:?}");
    assert_eq!(s.cached("/m/b").await, 0, "the least recently read went");
    for name in ["a", "c", "d"] {
        assert_eq!(s.cached(&format!("/m/{name}")).await, CHUNK, "{name} stays");
    }
    assert_eq!(s.read("/m/b", None).await.unwrap(), pattern(CHUNK as usize, b'b'), "an evicted file reads again");
}

#[tokio::test]
async fn the_budget_is_accounted_across_restarts_and_strays_are_swept() {
    let s = setup(1 << 30).await;
    s.put("a", &pattern(2 * CHUNK as usize, 9));
    s.sync().await;
    s.read("/m/a", None).await.unwrap();
    let node = s.filer.cache().node().to_string();
    s.filer.cache().housekeep().await.unwrap();
    let Setup { filer, data, _tmp, .. } = s;
    drop(filer);

    // What a crash can leave: a partial fetch in tmp/, and written bytes whose record never
    // committed.
    let stray = data.join("cache").join("ab").join("ab".repeat(16));
    std::fs::create_dir_all(stray.parent().unwrap()).unwrap();
    std::fs::write(&stray, b"unrecorded").unwrap();
    // Left by a crash a while ago: the sweep leaves files written in the seconds before it (a
    // fetch may be about to record them).
    let ago = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    std::fs::File::options().write(true).open(&stray).unwrap().set_modified(ago).unwrap();
    let fresh = data.join("cache").join("cd").join("cd".repeat(16));
    std::fs::create_dir_all(fresh.parent().unwrap()).unwrap();
    std::fs::write(&fresh, b"just written").unwrap();
    std::fs::write(data.join("cache").join("tmp").join("partial"), b"half").unwrap();

    let filer = open(&data, 1 << 30).await;
    assert_eq!(filer.cache().node(), node, "the node id is kept");
    assert!(!data.join("cache").join("tmp").join("partial").exists(), "partial fetches are cleared at start");
    // The sweep runs at start in the background; run one more to know it has.
    filer.cache().sweep().await.unwrap();
    assert!(!stray.exists(), "unrecorded bytes are swept");
    assert!(fresh.exists(), "unrecorded bytes written just now are left for the next sweep");
    filer.cache().housekeep().await.unwrap();
    let st = filer.cache_stats().await.unwrap();
    assert_eq!((st.resident_bytes, st.resident_chunks), (2 * CHUNK, 2), "accounted from the store after a restart");
    let (_, body) = filer.read("/m/a", None).await.unwrap();
    let parts: Vec<Bytes> = body.map(|c| c.unwrap()).collect().await;
    assert_eq!(parts.concat(), pattern(2 * CHUNK as usize, 9));
    assert_eq!(filer.cache_stats().await.unwrap().misses, 0, "served from what survived the restart");
}

/// A wholly cached object is one plain file the filer names to a FUSE mount beside it
/// (`local_file`, with the file's identity); a partly cached one is not named. When the object
/// leaves the cache (`remote.uncache`, an eviction), its file is unlinked, never emptied: a
/// reader that opened it, as a mount's kernel does, still reads every byte, and the file the
/// next read makes is another one.
#[tokio::test]
async fn a_wholly_cached_object_is_one_file_its_readers_keep() {
    let s = setup(1 << 30).await;
    let body = pattern(5 * CHUNK as usize + 17, 6);
    s.put("a.bin", &body);
    s.sync().await;
    assert_eq!(s.filer.local_file("/m/a.bin").await.unwrap(), None, "nothing cached");
    let r = ByteRange { offset: CHUNK, length: Some(10) };
    s.read("/m/a.bin", Some(r)).await.unwrap();
    assert_eq!(s.filer.local_file("/m/a.bin").await.unwrap(), None, "a chunk of six cached");

    s.filer.cache_fetch("/m/a.bin", true).await.unwrap();
    let whole = s.filer.local_file("/m/a.bin").await.unwrap().expect("cached whole");
    let entry = s.filer.stat("/m/a.bin").await.unwrap().unwrap();
    assert_eq!((whole.version, whole.size), (entry.version, entry.size));
    assert!(whole.file.starts_with(&s.data.display().to_string()), "{whole:?}");
    let opened = std::fs::File::open(&whole.file).unwrap();
    {
        use std::os::unix::fs::MetadataExt;
        let m = opened.metadata().unwrap();
        let id = whole.identity.unwrap();
        assert_eq!((m.dev(), m.ino()), (id.dev, id.ino));
    }
    assert_eq!(std::fs::read(&whole.file).unwrap(), body, "the file is the object, byte for byte");

    let dropped = s.filer.cache_drop("/m/a.bin").await.unwrap();
    assert_eq!(dropped.bytes, body.len() as u64);
    assert!(!std::path::Path::new(&whole.file).exists(), "unlinked");
    assert_eq!(s.filer.local_file("/m/a.bin").await.unwrap(), None);
    let mut kept = Vec::new();
    std::io::Read::read_to_end(&mut &opened, &mut kept).unwrap();
    assert_eq!(kept, body, "whoever had it open reads every byte still");

    s.filer.cache_fetch("/m/a.bin", true).await.unwrap();
    let again = s.filer.local_file("/m/a.bin").await.unwrap().expect("cached whole again");
    assert_ne!(again.identity, whole.identity, "another file at the same name");
    assert_eq!(std::fs::read(&again.file).unwrap(), body);
    // A local write makes the entry local content: no cache file is named for it any more.
    let w = futures::stream::once(async { Ok(Bytes::from_static(b"local")) }).boxed();
    s.filer.write("/m/a.bin", w, WriteOptions::default()).await.unwrap();
    let local = s.filer.local_file("/m/a.bin").await.unwrap();
    assert!(local.as_ref().is_none_or(|f| !f.file.contains("/cache/")), "{local:?}");
}

/// A read that looked its chunks up before the object left the cache, and reads them after
/// the object's file was made again by another read (holding only that read's chunk, the rest
/// a hole that reads as zeros), fetches what the new file does not hold: it never serves the
/// new file's holes as the object's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_never_serves_a_hole_of_a_file_made_again() {
    let s = setup(1 << 30).await;
    let body = pattern(20 * CHUNK as usize, 11);
    s.put("a.bin", &body);
    s.sync().await;
    s.filer.cache_fetch("/m/a.bin", true).await.unwrap();
    let (_, mut stream) = s.filer.read("/m/a.bin", None).await.unwrap();
    // The first chunk: the stream has looked all 20 up as cached, and reads a few ahead.
    let mut got = stream.next().await.unwrap().unwrap().to_vec();
    s.filer.cache_drop("/m/a.bin").await.unwrap();
    let r = ByteRange { offset: 15 * CHUNK, length: Some(CHUNK) };
    assert_eq!(s.read("/m/a.bin", Some(r)).await.unwrap(), &body[15 * CHUNK as usize..][..CHUNK as usize]);
    assert_eq!(s.cached("/m/a.bin").await, CHUNK, "the file made again holds one chunk");
    while let Some(part) = stream.next().await {
        got.extend_from_slice(&part.unwrap());
    }
    assert_eq!(got, body, "every byte the object's, none from a hole");
}

/// An object leaves the cache whole: the one whose chunk was least recently read goes with
/// every chunk it has, and its file with them.
#[tokio::test]
async fn eviction_takes_whole_objects() {
    let s = setup(4 * CHUNK).await;
    s.put("big", &pattern(3 * CHUNK as usize, 1));
    s.put("small", &pattern(CHUNK as usize, 2));
    s.put("new", &pattern(CHUNK as usize, 3));
    s.sync().await;
    s.read("/m/big", None).await.unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    s.read("/m/small", None).await.unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    s.read("/m/new", None).await.unwrap();
    s.filer.cache().housekeep().await.unwrap();
    let st = s.stats().await;
    assert_eq!((st.resident_bytes, st.evictions), (2 * CHUNK, 3), "all of big, for one chunk over: {st:?}");
    assert_eq!(s.cached("/m/big").await, 0);
    let big = content_id(&s.filer.stat("/m/big").await.unwrap().unwrap()).unwrap();
    assert!(!s.data.join("cache").join(&big[..2]).join(&big).exists(), "its file went with it");
    assert_eq!(s.read("/m/big", None).await.unwrap(), pattern(3 * CHUNK as usize, 1));
}

/// A chunk's record names it by index, and an index means bytes `k * chunk size ..`: a filer
/// restarted with another `--cache-chunk-size` must not read the old chunks as new ones. The
/// cache forgets what it held under the old size (records and files), once, before any read,
/// and serves every range right; after another restart with the same size it keeps its chunks.
#[tokio::test]
async fn a_new_chunk_size_forgets_the_chunks_of_the_old() {
    let s = setup(1 << 30).await;
    // Chunks half the old size: the old chunk `k` is longer than the new one and starts
    // further in, so a read of it as the new `k` would get bytes from the wrong place.
    // `pattern` repeats every 256 bytes, as chunks do: these differ between any two offsets.
    let unique = |n: usize, seed: u32| -> Vec<u8> {
        (0..n as u32).flat_map(|i| (i.wrapping_mul(2_654_435_761) ^ seed).to_le_bytes()).take(n).collect()
    };
    let body = unique(12 * CHUNK as usize, 7);
    let short = unique(3 * CHUNK as usize, 8);
    s.put("a.bin", &body);
    s.put("short.bin", &short);
    s.sync().await;
    assert_eq!(s.read("/m/a.bin", None).await.unwrap(), body);
    assert_eq!(s.read("/m/short.bin", None).await.unwrap(), short);
    s.filer.cache().housekeep().await.unwrap();
    let Setup { filer, data, _tmp, .. } = s;
    let node = filer.cache().node().to_string();
    drop(filer);

    for round in 0..2 {
        let filer = open_chunked(&data, 1 << 30, CHUNK / 2).await;
        let read = |p: &'static str, r: Option<ByteRange>| {
            let filer = filer.clone();
            async move {
                let (_, body) = filer.read(p, r).await.unwrap();
                let parts: Vec<Bytes> = body.map(|c| c.unwrap()).collect().await;
                filer.cache().idle().await;
                parts.concat()
            }
        };
        let r = ByteRange { offset: 2 * CHUNK + 5, length: Some(3 * CHUNK) };
        assert_eq!(read("/m/a.bin", Some(r)).await, &body[2 * CHUNK as usize + 5..][..3 * CHUNK as usize]);
        assert_eq!(read("/m/a.bin", None).await, body, "round {round}");
        assert_eq!(read("/m/short.bin", None).await, short, "round {round}");
        let st = filer.cache_stats().await.unwrap();
        if round == 0 {
            assert_eq!(st.misses, 24 + 6, "everything fetched again in the new size: {st:?}");
        } else {
            assert_eq!(st.misses, 0, "kept across a restart with the same size: {st:?}");
        }
        filer.cache().housekeep().await.unwrap();
        let st = filer.cache_stats().await.unwrap();
        assert_eq!((st.resident_bytes, st.resident_chunks), (15 * CHUNK, 30), "no record of the old size left");
        let rows = filer.store().cache_chunks(&node, "/m/a.bin").await.unwrap();
        assert!(rows.iter().all(|c| c.len == CHUNK / 2), "{rows:?}");
        drop(filer);
    }
}

#[tokio::test]
async fn with_the_cache_off_every_read_goes_to_the_bucket() {
    let s = setup(0).await;
    s.put("a", b"plain");
    s.sync().await;
    assert_eq!(s.read("/m/a", None).await.unwrap(), b"plain");
    assert_eq!(s.read("/m/a", None).await.unwrap(), b"plain");
    let st = s.stats().await;
    assert_eq!((st.hits, st.misses, st.budget_bytes), (0, 0, 0));
    assert_eq!(s.cached("/m/a").await, 0);
    std::fs::remove_file(s.bucket.join("a")).unwrap();
    assert!(s.read("/m/a", None).await.is_err());
}

//! The content cache as a user meets it: `tidemark server` against a real S3 (moto), read with
//! the shell and the filer's HTTP API. A second read makes no remote call (the cache's counters,
//! and a private moto that is then stopped); 32 readers of a cold object fetch each chunk once,
//! with one GET; an overwrite in the bucket is what the next read returns once its event is applied or
//! `remote.meta.sync` ran; `remote.cache`/`remote.uncache` with filters; eviction within a small
//! `--cache-size`; a SIGKILL during a large fetch leaves no bytes that a read would serve; a
//! slow stream is read with parallel ranged GETs.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use tidemark_cloud::aws::s3::S3Storage;
use tidemark_core::cache::CacheStats;
use tidemark_core::{Filer, RemoteStorage};
use tidemark_filer::HttpFiler;
use tidemark_testkit::{Moto, Shape, TidemarkProcess, eventually, fails, ok, run_shell, shaping_proxy, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

const CHUNK: usize = 64 * 1024;

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(17).wrapping_add(seed)).collect()
}

struct World {
    server: TidemarkProcess,
    s3: S3Storage,
    bucket: String,
    filer: HttpFiler,
    _tmp: tempfile::TempDir,
}

/// A bucket on `moto`, mounted at /mnt/s3 of a fresh server started with `extra` flags.
async fn world(moto: &Moto, extra: &[&str]) -> World {
    let conf = moto.conf("s3");
    let bucket = unique_name("cache");
    let s3 = S3Storage::connect(&conf, &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut args = vec!["--cache-chunk-size", "64K"];
    args.extend_from_slice(extra);
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &args);
    let filer = HttpFiler::new(&server.addr, None).unwrap();
    let w = World { server, s3, bucket, filer, _tmp: tmp };
    w.sh_ok(&format!(
        "remote.configure -name=s3 -type=s3 -s3.endpoint={} -s3.access_key=testing -s3.secret_key=testing",
        moto.endpoint
    ));
    w
}

impl World {
    fn sh(&self, cmd: &str) -> Output {
        run_shell(bin(), &self.server.addr, cmd, &[])
    }
    fn sh_ok(&self, cmd: &str) -> String {
        ok(self.sh(cmd))
    }
    async fn put(&self, key: &str, body: &[u8]) {
        self.s3.put(key, Bytes::copy_from_slice(body), BTreeMap::new()).await.unwrap();
    }
    async fn stats(&self) -> CacheStats {
        self.filer.cache_stats().await.unwrap()
    }
    async fn read(&self, p: &str) -> Vec<u8> {
        let (_, s) = self.filer.read(p, None).await.unwrap();
        let parts: Vec<Bytes> = s.map(|c| c.unwrap()).collect().await;
        parts.concat()
    }
    async fn cached(&self, p: &str) -> u64 {
        self.filer.cache_status(&[p.to_string()]).await.unwrap()[0].cached_bytes
    }
    /// Waits until the chunks reads fetched are recorded (a read does not wait for that).
    async fn settle(&self, p: &str, bytes: u64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.cached(p).await < bytes {
            assert!(
                Instant::now() < deadline,
                "{p}: {bytes} bytes never got cached; the server's log:\n{}",
                self.server.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_are_local_once_cached_and_survive_the_bucket_going() {
    // A private moto: this test stops it.
    let moto = Moto::start();
    let w = world(&moto, &[]).await;
    let big = pattern(3 * CHUNK + 100, 1);
    w.put("data/small.txt", b"hello from s3").await;
    w.put("data/big.bin", &big).await;
    w.put("data/notes/a.md", b"# a").await;
    w.put("data/notes/b.md", b"# b").await;
    w.put("data/other.txt", b"never cached").await;
    w.sh_ok(&format!("remote.mount -dir=/mnt/s3 -remote=s3/{}/data", w.bucket));

    // Read twice: the second read is a hit and fetches nothing.
    assert_eq!(w.sh_ok("fs.cat /mnt/s3/small.txt"), "hello from s3");
    w.settle("/mnt/s3/small.txt", 13).await;
    let cold = w.stats().await;
    assert_eq!((cold.misses, cold.bytes_fetched), (1, 13), "{cold:?}");
    assert_eq!(w.sh_ok("fs.cat /mnt/s3/small.txt"), "hello from s3");
    let warm = w.stats().await;
    assert_eq!(warm.misses, cold.misses, "the second read made no remote call: {warm:?}");
    assert_eq!(warm.hits, cold.hits + 1);

    // 32 readers of a cold object at once: one GET per chunk.
    let filer = Arc::new(w.filer.clone());
    let readers: Vec<_> = (0..32)
        .map(|_| {
            let filer = filer.clone();
            tokio::spawn(async move {
                let (_, s) = filer.read("/mnt/s3/big.bin", None).await.unwrap();
                let parts: Vec<Bytes> = s.map(|c| c.unwrap()).collect().await;
                parts.concat()
            })
        })
        .collect();
    for r in readers {
        assert_eq!(r.await.unwrap(), big);
    }
    let after = w.stats().await;
    assert_eq!(after.misses - warm.misses, 4, "4 chunks, each fetched once for 32 readers: {after:?}");
    assert_eq!(after.requests - warm.requests, 1, "by one ranged GET: {after:?}");
    w.settle("/mnt/s3/big.bin", big.len() as u64).await;

    // remote.cache with a filter; fs.ls -l and fs.meta.cat show what is cached.
    let out = w.sh_ok("remote.cache -dir=/mnt/s3 -include=*.md");
    assert!(out.contains("cached 2 files") && out.contains("0 failed"), "{out}");
    let ls = w.sh_ok("fs.ls -l /mnt/s3/notes");
    assert!(ls.lines().all(|l| l.contains(" 100% ")), "{ls}");
    let ls = w.sh_ok("fs.ls -l /mnt/s3");
    assert!(ls.lines().any(|l| l.ends_with("   0% other.txt")), "{ls}");
    assert!(ls.lines().any(|l| l.ends_with("    - notes/")), "{ls}");
    let meta: serde_json::Value = serde_json::from_str(&w.sh_ok("fs.meta.cat /mnt/s3/big.bin")).unwrap();
    assert_eq!(meta["cache"]["cached_bytes"], big.len() as u64, "{meta}");
    assert_eq!(meta["cache"]["chunks"], 4, "{meta}");
    let again = w.sh_ok("remote.cache -dir=/mnt/s3 -include=*.md");
    assert!(again.contains("cached 0 files") && again.contains("2 already cached"), "{again}");

    // remote.uncache with a filter drops only what matches.
    let out = w.sh_ok("remote.uncache -dir=/mnt/s3 -include=a.md");
    assert!(out.contains("dropped the cached content of 1 files"), "{out}");
    assert_eq!(w.cached("/mnt/s3/notes/a.md").await, 0);
    assert_eq!(w.cached("/mnt/s3/notes/b.md").await, 3);
    let err = fails(w.sh("remote.cache -dir=/mnt/s3 -include=[x"));
    assert!(err.contains("-include"), "{err}");
    let err = fails(w.sh("remote.cache -dir=/mnt/s3 -concurrent=0"));
    assert!(err.contains("-concurrent"), "{err}");

    // The bucket goes away: what is cached still reads, what is not fails in one clear line.
    drop(moto);
    assert_eq!(w.read("/mnt/s3/big.bin").await, big, "served from the cache with moto stopped");
    assert_eq!(w.sh_ok("fs.cat /mnt/s3/notes/b.md"), "# b");
    let err = fails(w.sh("fs.cat /mnt/s3/other.txt"));
    assert!(err.contains("/mnt/s3/other.txt") && err.contains("not cached here"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");

    // The filer's /metrics carries the same figures.
    let metrics = reqwest::get(format!("http://{}/metrics", w.server.addr)).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("tidemark_cache_hits_total"), "{metrics}");
    assert!(metrics.contains("tidemark_cache_resident_bytes"), "{metrics}");
}

/// A bucket that streams slowly (a proxy serving 4 MiB/s per connection) is read with several
/// ranged GETs at once once the first stream has shown its rate; the reader gets the object's
/// bytes in order, and every chunk is cached once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_stream_is_read_with_parallel_ranged_gets() {
    let moto = Moto::start();
    let w = world(&moto, &[]).await;
    let proxy = tidemark_testkit::throttling_proxy(&moto.endpoint, 4.0).unwrap();
    w.sh_ok(&format!(
        "remote.configure -name=s3 -type=s3 -s3.endpoint=http://{proxy} -s3.access_key=testing -s3.secret_key=testing"
    ));
    let big = pattern(64 * CHUNK, 3);
    w.put("slow/big.bin", &big).await;
    w.sh_ok(&format!("remote.mount -dir=/mnt/slow -remote=s3/{}/slow", w.bucket));
    let before = w.stats().await;
    let t = Instant::now();
    assert_eq!(w.read("/mnt/slow/big.bin").await, big);
    let took = t.elapsed();
    w.settle("/mnt/slow/big.bin", big.len() as u64).await;
    let after = w.stats().await;
    assert_eq!(after.misses - before.misses, 64, "each chunk fetched once: {after:?}");
    // One stream for the chunk that shows its rate and a run more, then runs of 4 to 16 chunks
    // (longer when a GET is slow to answer: see `cache::split_chunks`).
    // At the longest runs (16) that is 1 + 3 GETs.
    let requests = after.requests - before.requests;
    assert!(requests >= 4, "{requests} GETs for 64 chunks of a slow stream: {after:?}");
    eprintln!("4 MiB at 4 MiB/s per connection: {took:?} with {requests} GETs");
}

/// The bucket behind a proxy that shapes its answers (`shape`), as remote `s3`.
fn through(w: &World, moto: &Moto, shape: Shape) {
    let proxy = shaping_proxy(&moto.endpoint, shape).unwrap();
    w.sh_ok(&format!(
        "remote.configure -name=s3 -type=s3 -s3.endpoint=http://{proxy} -s3.access_key=testing -s3.secret_key=testing"
    ));
}

/// A bucket whose connections break mid-answer (a proxy closing each after 300 KiB): each
/// broken stream is resumed where it broke, with a ranged GET of the same version; the reader
/// gets every byte once, in order, and the resumes are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_broken_mid_object_is_resumed_where_it_broke() {
    let moto = Moto::get();
    let w = world(&moto, &[]).await;
    through(&w, &moto, Shape { cut_after: Some(300 << 10), ..Shape::default() });
    let big = pattern(32 * CHUNK + 1000, 5);
    w.put("cut/big.bin", &big).await;
    w.sh_ok(&format!("remote.mount -dir=/mnt/cut -remote=s3/{}/cut", w.bucket));
    let before = w.stats().await;
    assert_eq!(w.read("/mnt/cut/big.bin").await, big);
    w.settle("/mnt/cut/big.bin", big.len() as u64).await;
    let after = w.stats().await;
    let (resumed, begun) = (after.resumed - before.resumed, after.requests - before.requests);
    // 2 MiB in connections of 300 KiB: seven GETs at least, whether begun or resumed (a stream
    // that breaks looks slow, and may be split into parallel runs).
    assert!(resumed >= 1 && resumed + begun >= 7, "{resumed} resumes, {begun} GETs begun: {after:?}");
    assert_eq!(after.misses - before.misses, 33, "each chunk fetched once: {after:?}");
    let metrics = reqwest::get(format!("http://{}/metrics", w.server.addr)).await.unwrap().text().await.unwrap();
    assert!(metrics.contains(&format!("tidemark_cache_resumed_total {}", after.resumed)), "{metrics}");
}

/// A stream that keeps breaking without bringing anything much (a proxy closing each
/// connection after 2 KiB of its answer) is given up after five resumes in a row: the read
/// fails, saying so, and does not hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_keeps_breaking_is_given_up() {
    let moto = Moto::get();
    let w = world(&moto, &[]).await;
    w.put("cut/big.bin", &pattern(4 * CHUNK, 6)).await;
    w.sh_ok(&format!("remote.mount -dir=/mnt/cut -remote=s3/{}/cut", w.bucket));
    through(&w, &moto, Shape { cut_after: Some(2048), ..Shape::default() });
    let t = Instant::now();
    let err = w.filer.read("/mnt/cut/big.bin", None).await.err().expect("the read fails").to_string();
    assert!(err.contains("mid-object") && err.contains("gave up"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(20), "given up in {:?}", t.elapsed());
    assert_eq!(w.cached("/mnt/cut/big.bin").await, 0, "nothing cached of it");
}

/// An object overwritten in the bucket while its stream is broken: the resume asks for the
/// version the entry describes, the bucket has another, and the read fails rather than go on
/// with the other version's bytes; the server's log says what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_never_goes_on_with_another_version() {
    let moto = Moto::get();
    let w = world(&moto, &[]).await;
    let v1 = pattern(16 * CHUNK, 7);
    w.put("cut/big.bin", &v1).await;
    w.sh_ok(&format!("remote.mount -dir=/mnt/cut -remote=s3/{}/cut", w.bucket));
    // Slow enough that the first connection breaks (at 320 KiB, 0.6 s) well after the overwrite.
    through(&w, &moto, Shape { mib_s: Some(0.5), cut_after: Some(320 << 10), ..Shape::default() });
    let (_, mut stream) = w.filer.read("/mnt/cut/big.bin", None).await.unwrap();
    let first = stream.next().await.unwrap().unwrap();
    assert_eq!(first[..], v1[..first.len()]);
    w.put("cut/big.bin", &pattern(16 * CHUNK, 8)).await;
    let mut got = first.to_vec();
    let mut failed = false;
    while let Some(part) = stream.next().await {
        match part {
            Ok(b) => got.extend_from_slice(&b),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    assert!(failed, "the read failed ({} bytes came)", got.len());
    assert!(got.len() < v1.len() && got[..] == v1[..got.len()], "only the first version's bytes came");
    eventually("the server to say why", || w.server.stderr().contains("the object changed in the bucket"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overwrite_in_the_bucket_is_what_the_next_read_returns() {
    let moto = Moto::get();
    let w = world(&moto, &[]).await;
    w.put("f.txt", b"version one").await;
    w.sh_ok(&format!("remote.mount -dir=/mnt/s3 -remote=s3/{}", w.bucket));
    assert_eq!(w.read("/mnt/s3/f.txt").await, b"version one");
    w.settle("/mnt/s3/f.txt", 11).await;

    // Without events: the entry (and so the read) stays at v1 until remote.meta.sync.
    w.put("f.txt", b"version two").await;
    assert_eq!(w.read("/mnt/s3/f.txt").await, b"version one", "the entry still describes v1");
    let out = w.sh_ok("remote.meta.sync -dir=/mnt/s3");
    assert!(out.contains("/mnt/s3/f.txt (update)"), "{out}");
    assert_eq!(w.read("/mnt/s3/f.txt").await, b"version two");
    w.settle("/mnt/s3/f.txt", 11).await;

    // With events: once the event is applied, no read returns the old bytes. With -prefetch,
    // the new version of a matching file is fetched without anyone reading it.
    let err = fails(w.sh("remote.events.enable -dir=/mnt/s3 -prefetch=[x"));
    assert!(err.contains("-prefetch"), "{err}");
    w.sh_ok("remote.events.enable -dir=/mnt/s3 -prefetch=*.txt -prefetchMaxSize=1K");
    let listed = w.sh_ok("remote.events.list -json");
    assert!(listed.contains("\"prefetch\": \"*.txt\"") && listed.contains("\"prefetch_max_size\": 1024"), "{listed}");
    // The baseline reconcile first: what it brings in is metadata only, as every reconcile.
    eventually("the subscription to tail", || {
        w.sh_ok("remote.events.list").lines().nth(1).is_some_and(|l| l.split('\t').nth(6) == Some("tailing"))
    });
    let v2 = w.filer.stat("/mnt/s3/f.txt").await.unwrap().unwrap();
    w.put("f.txt", b"version three, longer").await;
    w.put("g.bin", b"not a match").await;
    w.put("big.txt", &[b'x'; 2048]).await;
    eventually("the overwrite's event to be applied", || {
        let now = futures::executor::block_on(w.filer.stat("/mnt/s3/f.txt")).unwrap().unwrap();
        now.remote.as_ref().map(|r| &r.etag) != v2.remote.as_ref().map(|r| &r.etag)
    });
    w.settle("/mnt/s3/f.txt", 21).await;
    eventually("the other events to be applied", || {
        let s = |p| futures::executor::block_on(w.filer.stat(p)).unwrap().is_some();
        s("/mnt/s3/g.bin") && s("/mnt/s3/big.txt")
    });
    let before = w.stats().await;
    assert_eq!(w.read("/mnt/s3/f.txt").await, b"version three, longer");
    assert_eq!(w.stats().await.misses, before.misses, "prefetched: the first read was local");
    assert_eq!(w.sh_ok("fs.cat /mnt/s3/f.txt"), "version three, longer");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(w.cached("/mnt/s3/g.bin").await, 0, "not matching -prefetch");
    assert_eq!(w.cached("/mnt/s3/big.txt").await, 0, "over -prefetchMaxSize");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_keeps_a_small_cache_size() {
    let moto = Moto::get();
    let w = world(&moto, &["--cache-size", "192K"]).await;
    for i in 0..5u8 {
        w.put(&format!("f{i}"), &pattern(CHUNK, i)).await;
    }
    w.sh_ok(&format!("remote.mount -dir=/mnt/s3 -remote=s3/{}", w.bucket));
    for i in 0..5u8 {
        assert_eq!(w.read(&format!("/mnt/s3/f{i}")).await, pattern(CHUNK, i));
        // In order, so the least recently read are the first ones.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = w.stats().await;
        if s.evictions >= 2 && s.resident_bytes <= 192 * 1024 {
            assert_eq!(s.budget_bytes, 192 * 1024);
            break;
        }
        assert!(Instant::now() < deadline, "never evicted down to the budget: {s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(w.cached("/mnt/s3/f0").await, 0, "the least recently read went first");
    assert_eq!(w.cached("/mnt/s3/f4").await, CHUNK as u64, "the newest stays");
    assert_eq!(w.read("/mnt/s3/f0").await, pattern(CHUNK, 0), "an evicted file is fetched again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_during_a_large_fetch_leaves_nothing_a_read_would_serve() {
    let moto = Moto::get();
    let mut w = world(&moto, &[]).await;
    let chunks = 400;
    let body = pattern(chunks * CHUNK, 7);
    w.put("large.bin", &body).await;
    w.sh_ok(&format!("remote.mount -dir=/mnt/s3 -remote=s3/{}", w.bucket));

    // Read a third of it slowly, then kill the server mid-fetch.
    let (_, mut s) = w.filer.read("/mnt/s3/large.bin", None).await.unwrap();
    let mut got = 0usize;
    while got < chunks / 3 * CHUNK {
        got += s.next().await.unwrap().unwrap().len();
    }
    w.server.kill();
    drop(s);

    let data = w.server.data_dir.clone();
    let server = TidemarkProcess::server(bin(), &data, &["--cache-chunk-size", "64K"]);
    let filer = HttpFiler::new(&server.addr, None).unwrap();
    assert!(std::fs::read_dir(data.join("cache/tmp")).unwrap().next().is_none(), "partial fetches are gone");
    let status = filer.cache_status(&["/mnt/s3/large.bin".to_string()]).await.unwrap().remove(0);
    assert!(status.chunks < chunks as u64, "the fetch was cut: {status:?}");
    // Every recorded chunk's bytes are all there; a full read returns exactly the object.
    let (_, s) = filer.read("/mnt/s3/large.bin", None).await.unwrap();
    let parts: Vec<Bytes> = s.map(|c| c.unwrap()).collect().await;
    assert_eq!(parts.concat(), body);
    let stats = filer.cache_stats().await.unwrap();
    assert_eq!(stats.hits + stats.misses, chunks as u64, "{stats:?}");
    assert_eq!(stats.hits, status.chunks, "what survived the kill was served from the cache: {stats:?}");
}

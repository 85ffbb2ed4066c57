//! SIGKILL the server in the middle of writes: every acknowledged write survives, no entry is
//! torn (every entry's bytes are all there), and an interrupted overwrite leaves the old file.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tidemark_core::{ByteStream, Error, Filer, WriteOptions};
use tidemark_filer::HttpFiler;
use tidemark_testkit::TidemarkProcess;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

/// Deterministic content for file `name`, `len` bytes, so a reader can check every byte.
fn pattern(name: &str, len: usize) -> Vec<u8> {
    let seed = name.bytes().fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32));
    (0..len as u32).map(|i| (seed.wrapping_add(i).wrapping_mul(2_654_435_761) >> 24) as u8).collect()
}

fn whole(data: Vec<u8>) -> ByteStream {
    futures::stream::once(async move { Ok(Bytes::from(data)) }).boxed()
}

/// A body that trickles out 64 KiB chunks every 10 ms and never ends: the server dies first.
fn endless() -> ByteStream {
    futures::stream::unfold(0u64, |i| async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        Some((Ok::<_, std::io::Error>(Bytes::from(vec![(i % 251) as u8; 64 * 1024])), i + 1))
    })
    .boxed()
}

async fn read_all(f: &HttpFiler, path: &str) -> Vec<u8> {
    let (entry, s) = f.read(path, None).await.unwrap_or_else(|e| panic!("read {path}: {e}"));
    let parts: Vec<Bytes> = s.map(|c| c.unwrap_or_else(|e| panic!("reading {path}: {e}"))).collect().await;
    let bytes = parts.concat();
    assert_eq!(bytes.len() as u64, entry.size, "{path}: the entry's size and its bytes agree (no torn entry)");
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_write_loses_no_committed_entry_and_leaves_no_torn_one() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut server = TidemarkProcess::server(bin(), &data, &[]);
    let filer = HttpFiler::new(&server.addr, None).unwrap();

    let old_big = pattern("/c/big-old", 3_000_000);
    filer.write("/c/big", whole(old_big.clone()), WriteOptions::default()).await.unwrap();

    // A stream of small and medium writes, recording each acknowledged one.
    let acked: Arc<Mutex<Vec<(String, usize)>>> = Arc::default();
    let writer = {
        let (filer, acked) = (filer.clone(), acked.clone());
        tokio::spawn(async move {
            for i in 0.. {
                let (name, len) = (format!("/c/f{i:05}"), if i % 5 == 0 { 100_000 } else { 300 });
                match filer.write(&name, whole(pattern(&name, len)), WriteOptions::default()).await {
                    Ok(_) => acked.lock().unwrap().push((name, len)),
                    Err(_) => return,
                }
            }
        })
    };
    // An overwrite and a new file whose bodies are still arriving when the server dies.
    let overwrite = {
        let filer = filer.clone();
        tokio::spawn(async move { filer.write("/c/big", endless(), WriteOptions::default()).await })
    };
    let fresh = {
        let filer = filer.clone();
        tokio::spawn(async move { filer.write("/c/fresh", endless(), WriteOptions::default()).await })
    };

    // Kill once enough writes were acknowledged (however slow the machine), while the endless
    // uploads are still streaming.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while acked.lock().unwrap().len() < 30 {
        assert!(tokio::time::Instant::now() < deadline, "too few writes were acknowledged in 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.kill();
    writer.await.unwrap();
    let overwrite = overwrite.await.unwrap();
    let fresh = fresh.await.unwrap();
    assert!(overwrite.is_err() && fresh.is_err(), "endless writes cannot have finished: {overwrite:?} {fresh:?}");
    let acked = acked.lock().unwrap().clone();

    let server = TidemarkProcess::server(bin(), &data, &[]);
    let filer = HttpFiler::new(&server.addr, None).unwrap();
    for (name, len) in &acked {
        assert_eq!(read_all(&filer, name).await, pattern(name, *len), "{name} was acknowledged, so it survives intact");
    }
    assert_eq!(read_all(&filer, "/c/big").await, old_big, "an interrupted overwrite leaves the old content");
    assert!(
        matches!(filer.read("/c/fresh", None).await, Err(Error::NotFound { .. })),
        "an interrupted new file does not appear"
    );

    // Whatever else is there (a write committed just before the kill but not yet acknowledged)
    // is whole too.
    let mut after = None;
    loop {
        let page = filer.scan("/c", after.as_deref(), 500).await.unwrap();
        for e in &page.entries {
            if !e.is_dir() {
                read_all(&filer, &e.path).await;
            }
        }
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert!(std::fs::read_dir(data.join("tmp")).unwrap().next().is_none(), "partial uploads are cleared at start");
}

/// SIGKILL the server while batches of transactions stream in: every acknowledged batch survives
/// whole, and any other batch is all there or not there at all; the change log stays dense.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_batches_leaves_each_batch_whole_or_absent() {
    use tidemark_core::model::{Content, NewEntry, Origin, Txn, TxnBatch};
    const PER: usize = 50;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut server = TidemarkProcess::server(bin(), &data, &[]);
    let filer = HttpFiler::new(&server.addr, None).unwrap();
    let acked: Arc<Mutex<Vec<usize>>> = Arc::default();
    // Two writers, so the kill can land while batches wait for the writer as well as in it.
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let (filer, acked) = (filer.clone(), acked.clone());
            tokio::spawn(async move {
                for i in (w..).step_by(2) {
                    let txns = (0..PER)
                        .map(|j| {
                            let e = NewEntry::file(j as u64, 1, Content::Inline);
                            Txn::put(format!("/batches/{i:05}/{j:02}"), e, Origin::Remote)
                                .with_data(Bytes::from(vec![b'x'; j]))
                        })
                        .collect();
                    match filer.apply_many(TxnBatch { fence: None, txns }).await {
                        Ok(out) => {
                            assert!(out.iter().all(|r| r.is_ok()), "{out:?}");
                            acked.lock().unwrap().push(i);
                        }
                        Err(_) => return,
                    }
                }
            })
        })
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while acked.lock().unwrap().len() < 20 {
        assert!(tokio::time::Instant::now() < deadline, "too few batches were acknowledged in 60 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.kill();
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();

    let server = TidemarkProcess::server(bin(), &data, &[]);
    let filer = HttpFiler::new(&server.addr, None).unwrap();
    let mut per_batch = std::collections::BTreeMap::<String, usize>::new();
    let mut after = None;
    loop {
        let page = filer.scan("/batches", after.as_deref(), 1000).await.unwrap();
        for e in page.entries.iter().filter(|e| !e.is_dir()) {
            *per_batch.entry(e.path.split('/').nth(2).unwrap().to_string()).or_default() += 1;
            assert_eq!(read_all(&filer, &e.path).await.len() as u64, e.size);
        }
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    for (batch, n) in &per_batch {
        assert_eq!(*n, PER, "batch {batch}: {n} of its {PER} transactions survived the kill");
    }
    for i in &acked {
        assert!(per_batch.contains_key(&format!("{i:05}")), "acknowledged batch {i} is gone");
    }
    let log = filer.changes(0, 10_000, Duration::ZERO).await.unwrap();
    assert!(log.windows(2).all(|w| w[0].seq + 1 == w[1].seq), "the change log stays dense");
    eprintln!("{} batches acknowledged before the kill, {} on disk after it", acked.len(), per_batch.len());
}

/// SIGKILL the server, twice, while its outbound sync carries a renamed directory of 400 files
/// to the bucket (a `local` remote on this disk): at each kill every file's bytes are whole at
/// its old key or its new one; after each restart the sync resumes from its cursor; in the end
/// every file is at its new key and no old key is left, the namespace reads every file, no
/// tombstone is left, and a reconcile finds nothing to change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_while_a_rename_is_carried_to_the_bucket_loses_no_object() {
    use tidemark_core::model::{Origin, Txn};
    const N: usize = 400;
    let tmp = tempfile::tempdir().unwrap();
    let (data, root) = (tmp.path().join("data"), tmp.path().join("root"));
    let bucket = root.join("bkt");
    std::fs::create_dir_all(bucket.join("tree")).unwrap();
    let want = |i: usize| pattern(&format!("f{i:03}"), 1000 + i);
    for i in 0..N {
        std::fs::write(bucket.join(format!("tree/f{i:03}")), want(i)).unwrap();
    }
    let root_s = root.to_str().unwrap().to_string();
    // A short lease, so the restarted server takes the sync over from the killed one soon.
    let args = ["--s3-addr", "off", "--local-root", &root_s, "--task-lease-ttl", "2"];
    let mut server = TidemarkProcess::server(bin(), &data, &args);
    let sh = |addr: &str, c: &str| {
        let o = tidemark_testkit::run_shell(bin(), addr, c, &[]);
        assert!(o.status.success(), "{c}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    sh(&server.addr, &format!("remote.configure -name=loc -type=local -local.root={root_s}"));
    sh(&server.addr, "remote.mount -dir=/buckets/loc -remote=loc/bkt");
    sh(&server.addr, "remote.sync.enable -dir=/buckets/loc");
    let filer = HttpFiler::new(&server.addr, None).unwrap();
    filer.apply(Txn::rename("/buckets/loc/tree", "/buckets/loc/moved", Origin::Local)).await.unwrap();
    let count = |dir: &str| std::fs::read_dir(bucket.join(dir)).map(|d| d.count()).unwrap_or(0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    for round in 1..=2 {
        while count("moved") < round * N / 3 {
            assert!(tokio::time::Instant::now() < deadline, "the sync moved {} keys in time", count("moved"));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        server.kill();
        for i in 0..N {
            let at = |dir: &str| std::fs::read(bucket.join(dir).join(format!("f{i:03}"))).ok();
            assert!(
                at("tree") == Some(want(i)) || at("moved") == Some(want(i)),
                "f{i:03} after kill {round}: old {:?} bytes, new {:?} bytes",
                at("tree").map(|b| b.len()),
                at("moved").map(|b| b.len())
            );
        }
        eprintln!("kill {round}: {} keys moved, {} left", count("moved"), count("tree"));
        server = TidemarkProcess::server(bin(), &data, &args);
    }
    while count("moved") < N || count("tree") > 0 {
        assert!(tokio::time::Instant::now() < deadline, "moved {}, left {}", count("moved"), count("tree"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in 0..N {
        assert_eq!(std::fs::read(bucket.join(format!("moved/f{i:03}"))).unwrap(), want(i), "f{i:03}");
    }
    let filer = HttpFiler::new(&server.addr, None).unwrap();
    for i in (0..N).step_by(37) {
        assert_eq!(read_all(&filer, &format!("/buckets/loc/moved/f{i:03}")).await, want(i));
    }
    // The last tombstones go with the last records; give the sync a moment to finish them.
    let tombstones = tidemark_core::remote::system_paths::TOMBSTONES_DIR;
    let t = tokio::time::Instant::now();
    while filer.list(tombstones, None, 10).await.is_ok_and(|p| !p.entries.is_empty()) {
        assert!(t.elapsed() < Duration::from_secs(20), "tombstones left: {:?}", filer.list(tombstones, None, 10).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(filer.stat("/buckets/loc/tree").await.unwrap().is_none());
    let out = sh(&server.addr, "remote.meta.sync -dir=/buckets/loc");
    assert!(out.contains("created 0, updated 0, deleted 0"), "{out}");
}

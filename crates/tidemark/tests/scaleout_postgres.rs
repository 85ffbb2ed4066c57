//! The scaled-out deployment on one PostgreSQL database: two filers (`--store postgres://`), an
//! admin and three workers, against moto's S3 and SQS. Events for 2,000 keys are applied with
//! nothing lost or applied twice while the lease holder is paused past its lease (its late
//! writes refused by the fence), the next holder is killed and restarted, and one filer is
//! restarted mid-run. Both filers serve the same namespace, the same change log and, through
//! the blob store, the same files.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use tidemark_cloud::aws::s3::S3Storage;
use tidemark_core::{Filer, RemoteStorage};
use tidemark_filer::HttpFiler;
use tidemark_testkit::{LogsOnFailure, Moto, Postgres, TidemarkProcess, ok, run_shell, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

async fn eventually<F: std::future::Future<Output = bool>>(what: &str, within: Duration, mut check: impl FnMut() -> F) {
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out after {within:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The subscription's live lease, asked of a filer: (holder, generation).
async fn live_lease(filer: &HttpFiler, name: &str) -> Option<(String, u64)> {
    let lease = filer.lease_get(name).await.ok()??;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    (lease.expires_at_ms > now).then_some((lease.holder, lease.generation))
}

/// The live lease, waiting out the moment between two slices when there is none.
async fn wait_live_lease(filer: &HttpFiler, name: &str) -> (String, u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(l) = live_lease(filer, name).await {
            return l;
        }
        assert!(Instant::now() < deadline, "no worker held the subscription's lease within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn worker(admin: &str, filer: &str, id: &str, log: &Path) -> TidemarkProcess {
    TidemarkProcess::start_quiet(
        bin(),
        log,
        &["worker", "--admin", admin, "--filer", filer, "--id", id, "--lease-ttl", "4", "--max-execute", "2"],
        |log| log.contains("registered with the admin"),
    )
}

/// A filer of the cluster: content on the shared blob store (several filers refuse without one).
fn filer(dir: &Path, store: &str, addr: &str, blob_store: &str) -> TidemarkProcess {
    TidemarkProcess::start_with_env(
        bin(),
        dir,
        &["filer", "--data-dir", dir.to_str().unwrap(), "--addr", addr, "--store", store, "--blob-store", blob_store],
        1,
        &[("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")],
    )
}

/// Does every expected key exist with its size, read through `filer`?
async fn all_there(filer: &HttpFiler, expected: &BTreeMap<String, usize>) -> bool {
    let missing = futures::stream::iter(expected.iter())
        .map(|(p, size)| async move { filer.stat(p).await.ok().flatten().is_some_and(|e| e.size == *size as u64) })
        .buffer_unordered(8)
        .filter(|present| std::future::ready(!present))
        .count()
        .await;
    missing == 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_filers_and_three_workers_on_one_database_lose_nothing_through_pauses_kills_and_restarts() {
    let moto = Moto::get();
    let pg = Postgres::get();
    let store = pg.fresh_database("scaleout");
    let conf = moto.conf("s3");
    let bucket = unique_name("scaleout");
    let s3 = S3Storage::connect(&conf, &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let _logs = LogsOnFailure(tmp.path().to_path_buf());
    // File content on a bucket of its own (the mounted one holds only the mount's objects).
    let blob_bucket = unique_name("scaleout-blobs");
    s3.client().create_bucket().bucket(&blob_bucket).send().await.unwrap();
    let blob_store = format!("s3://{blob_bucket}?endpoint={}", moto.endpoint);
    let f1_p = filer(&tmp.path().join("f1"), &store, "127.0.0.1:0", &blob_store);
    let mut f2_p = filer(&tmp.path().join("f2"), &store, "127.0.0.1:0", &blob_store);
    let (f1, f2) = (f1_p.addr.clone(), f2_p.addr.clone());
    let admin_p = TidemarkProcess::start(
        bin(),
        &tmp.path().join("admin"),
        &["admin", "--filer", &f1, "--addr", "127.0.0.1:0", "--worker-timeout", "3"],
    );
    let a = admin_p.addr.clone();

    // Configured through the second filer; the admin, on the first, sees it.
    let sh = |cmd: &str| ok(run_shell(bin(), &f2, cmd, &[]));
    sh(&format!(
        "remote.configure -name=s3 -type=s3 -s3.endpoint={} -s3.access_key=testing -s3.secret_key=testing",
        moto.endpoint
    ));
    sh(&format!("remote.mount -dir=/mnt/data -remote=s3/{bucket}"));
    sh("remote.events.enable -dir=/mnt/data -slice=6s -visibility=5s");

    // Two workers write through the first filer, one through the second.
    let logs = |id: &str, n: u32| tmp.path().join(format!("{id}-{n}.log"));
    let mut workers: BTreeMap<String, (TidemarkProcess, u32)> = BTreeMap::new();
    for (id, via) in [("w1", &f1), ("w2", &f1), ("w3", &f2)] {
        workers.insert(id.to_string(), (worker(&a, via, id, &logs(id, 0)), 0));
    }
    let via = |id: &str| if id == "w3" { f2.clone() } else { f1.clone() };

    let (c1, c2) = (HttpFiler::new(&f1, None).unwrap(), HttpFiler::new(&f2, None).unwrap());
    let mut expected: BTreeMap<String, usize> = BTreeMap::new();
    let mut next = 0usize;
    let mut put_batch = async |count: usize, expected: &mut BTreeMap<String, usize>| {
        let keys: Vec<(String, usize)> = (next..next + count).map(|n| (format!("k{n:05}.bin"), n % 29 + 1)).collect();
        next += count;
        futures::stream::iter(keys.iter())
            .for_each_concurrent(8, |(key, size)| {
                let s3 = &s3;
                async move {
                    s3.put(key, Bytes::from(vec![b'x'; *size]), Default::default()).await.unwrap();
                }
            })
            .await;
        expected.extend(keys.into_iter().map(|(k, s)| (format!("/mnt/data/{k}"), s)));
    };
    let sub_lease = async || {
        let subs: serde_json::Value =
            reqwest::get(format!("http://{a}/api/v1/subscriptions")).await.unwrap().json().await.unwrap();
        subs["subscriptions"][0]["fingerprint"].as_str().map(|fp| format!("remote_events/{fp}"))
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let lease_name = loop {
        if let Some(n) = sub_lease().await
            && live_lease(&c1, &n).await.is_some()
        {
            break n;
        }
        assert!(Instant::now() < deadline, "no first slice within 30 s");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let started = Instant::now();

    // 1. Events flow; what the workers wrote through either filer reads the same through both.
    put_batch(500, &mut expected).await;
    eventually("phase 1 through filer 2", Duration::from_secs(180), async || all_there(&c2, &expected).await).await;
    assert!(all_there(&c1, &expected).await);

    // 2. Pause the lease holder past its lease: another worker takes over with a higher
    //    generation; woken, the paused one's writes are refused by the fence.
    let (holder, generation) = wait_live_lease(&c1, &lease_name).await;
    workers[&holder].0.signal("STOP");
    put_batch(500, &mut expected).await;
    eventually("another worker takes the lease", Duration::from_secs(40), async || {
        live_lease(&c1, &lease_name).await.is_some_and(|(h, g)| h != holder && g > generation)
    })
    .await;
    eventually("phase 2", Duration::from_secs(180), async || all_there(&c1, &expected).await).await;
    workers[&holder].0.signal("CONT");
    let paused_log = logs(&holder, workers[&holder].1);
    eventually("the woken worker's slice ends on the fence", Duration::from_secs(30), async || {
        std::fs::read_to_string(&paused_log).unwrap_or_default().contains("lease_lost")
    })
    .await;

    // 3. Kill the holder mid-slice while puts arrive, and restart it.
    let (holder, _) = wait_live_lease(&c1, &lease_name).await;
    workers.get_mut(&holder).unwrap().0.kill();
    put_batch(500, &mut expected).await;
    let n = workers[&holder].1 + 1;
    let restarted = worker(&a, &via(&holder), &holder, &logs(&holder, n));
    workers.insert(holder.clone(), (restarted, n));
    eventually("phase 3", Duration::from_secs(180), async || all_there(&c1, &expected).await).await;

    // 4. Restart filer 2 (same address and data directory) while puts arrive: the worker that
    //    writes through it retries until it is back.
    let f2_dir = tmp.path().join("f2");
    f2_p.kill();
    put_batch(250, &mut expected).await;
    f2_p = filer(&f2_dir, &store, &f2, &blob_store);
    put_batch(250, &mut expected).await;
    eventually("phase 4 through the restarted filer", Duration::from_secs(180), async || {
        all_there(&c2, &expected).await
    })
    .await;
    let elapsed = started.elapsed();

    // Nothing applied twice: each key was put once, so the namespace changed it exactly once.
    // And both filers serve one change log: the same records, in the same dense order.
    let read_log = async |f: &HttpFiler| {
        let mut all = Vec::new();
        loop {
            let recs = f
                .changes(all.last().map_or(0, |r: &tidemark_core::model::ChangeRecord| r.seq), 1000, Duration::ZERO)
                .await
                .unwrap();
            if recs.is_empty() {
                return all;
            }
            all.extend(recs);
        }
    };
    let (log1, log2) = (read_log(&c1).await, read_log(&c2).await);
    let common = log1.len().min(log2.len());
    assert!(common > 2000);
    assert_eq!(log1[..common], log2[..common], "both filers serve the same change log");
    assert!(log1.windows(2).all(|w| w[0].seq + 1 == w[1].seq), "dense and in order");
    // The first slice's baseline reconcile lists the bucket while the first puts land: the
    // events that follow refresh those entries' attributes, which is not applying them again.
    let mut per_path: BTreeMap<&str, usize> = BTreeMap::new();
    for r in log1.iter().filter(|r| expected.contains_key(&r.path) && tidemark_testkit::brings_bytes(r)) {
        *per_path.entry(&r.path).or_default() += 1;
    }
    let twice: Vec<_> = per_path.iter().filter(|(_, c)| **c != 1).collect();
    assert!(twice.is_empty(), "applied more than once: {twice:?}");
    assert_eq!(per_path.len(), expected.len(), "every key applied");
    eprintln!(
        "{} keys applied in {:.1} s across the pause, the kill and the filer restart",
        expected.len(),
        elapsed.as_secs_f64()
    );

    // Content: a small file (inline in the database) and a large one (on the blob store)
    // written through one filer read, byte for byte, through the other.
    let (small, big) = (tmp.path().join("small.txt"), tmp.path().join("big.bin"));
    std::fs::write(&small, "small, shared").unwrap();
    std::fs::write(&big, vec![b'b'; 100 * 1024]).unwrap();
    ok(run_shell(
        bin(),
        &f1,
        &format!("fs.put {} /docs/small.txt; fs.put {} /docs/big.bin", small.display(), big.display()),
        &[],
    ));
    assert_eq!(ok(run_shell(bin(), &f2, "fs.cat /docs/small.txt", &[])), "small, shared");
    assert_eq!(ok(run_shell(bin(), &f2, "fs.cat /docs/big.bin", &[])), "b".repeat(100 * 1024));

    // Which worker ran which slice, for whoever reads a failure.
    for (id, (_, n)) in &workers {
        for i in 0..=*n {
            let text = std::fs::read_to_string(logs(id, i)).unwrap_or_default();
            for line in text.lines().filter(|l| l.contains("slice ended") || l.contains("slice failed")) {
                eprintln!("{id}-{i}: {line}");
            }
        }
    }
    drop((f1_p, f2_p, admin_p, workers));
}

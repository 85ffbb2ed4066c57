//! Several filers on one PostgreSQL database keep file content on a shared blob store (moto):
//! a file written through one filer's S3 gateway is read, byte for byte, through another's at
//! once and after the first filer is SIGKILLed; a filer that could not read the cluster's files
//! refuses to start and names the flag; a crash between storing a file's bytes and committing
//! it, and one between the collector's removal and its cursor, leave nothing a read misses and
//! nothing `tidemark blobs gc` cannot collect.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use tidemark_cloud::aws::s3::S3Storage;
use tidemark_core::model::Content;
use tidemark_core::{Filer, RemoteStorage, WriteOptions};
use tidemark_filer::HttpFiler;
use tidemark_testkit::{Moto, Postgres, TidemarkProcess, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

const AWS: &[(&str, &str)] = &[("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")];

fn filer(dir: &Path, store: &str, blob_store: Option<&str>, env: &[(&str, &str)]) -> TidemarkProcess {
    // Leases of a few seconds: the tests kill filers, and the next takes their work over.
    let mut args = vec![
        "filer",
        "--data-dir",
        dir.to_str().unwrap(),
        "--addr",
        "127.0.0.1:0",
        "--store",
        store,
        "--task-lease-ttl",
        "3",
    ];
    if let Some(b) = blob_store {
        args.extend(["--blob-store", b]);
    }
    let env: Vec<(&str, &str)> = AWS.iter().chain(env).copied().collect();
    TidemarkProcess::start_with_env(bin(), dir, &args, 1, &env)
}

/// `tidemark filer ...` that must refuse to start: its stderr.
fn refused(dir: &Path, store: &str, blob_store: Option<&str>) -> String {
    let mut cmd = Command::new(bin());
    cmd.args(["filer", "--data-dir", dir.to_str().unwrap(), "--addr", "127.0.0.1:0", "--store", store])
        .envs(AWS.iter().copied());
    if let Some(b) = blob_store {
        cmd.args(["--blob-store", b]);
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "should refuse: {err}");
    err
}

fn gateway(dir: &Path, filer: &str) -> TidemarkProcess {
    TidemarkProcess::start(bin(), dir, &["s3", "--filer", filer, "--addr", "127.0.0.1:0"])
}

/// A client of a gateway (the development key, on loopback).
async fn client(gw: &str, bucket: &str) -> S3Storage {
    let settings =
        [("endpoint", format!("http://{gw}")), ("access_key", "tidemark".into()), ("secret_key", "tidemark".into())];
    let conf = tidemark_core::remote::RemoteConf {
        name: "gw".into(),
        kind: tidemark_core::remote::StorageKind::S3,
        settings: settings.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
    };
    S3Storage::connect(&conf, bucket).await.unwrap()
}

async fn get(s: &S3Storage, key: &str) -> Vec<u8> {
    let parts: Vec<Bytes> = s.get(key, None, None).await.unwrap().map(|c| c.unwrap()).collect().await;
    parts.concat()
}

/// The whole content of `path`, read through `filer`.
async fn read_back(filer: &HttpFiler, path: &str) -> Vec<u8> {
    let (_, s) = filer.read(path, None).await.unwrap();
    s.map(|c| c.unwrap()).collect::<Vec<Bytes>>().await.concat()
}

fn pattern(n: usize, seed: u8) -> Bytes {
    (0..n).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed)).collect::<Vec<u8>>().into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_filer_reads_every_file_and_a_filer_that_could_not_refuses_to_start() {
    let moto = Moto::get();
    let pg = Postgres::get();
    let store = pg.fresh_database("blobs");
    let bucket = unique_name("blobs");
    let blob_bucket = S3Storage::connect(&moto.conf("s3"), &bucket).await.unwrap();
    blob_bucket.client().create_bucket().bucket(&bucket).send().await.unwrap();
    let url = format!("s3://{bucket}/cluster?endpoint={}", moto.endpoint);
    let tmp = tempfile::tempdir().unwrap();
    let mut a = filer(&tmp.path().join("a"), &store, Some(&url), &[]);
    let b = filer(&tmp.path().join("b"), &store, Some(&url), &[]);
    let (gw_a, gw_b) = (gateway(&tmp.path().join("gw-a"), &a.addr), gateway(&tmp.path().join("gw-b"), &b.addr));

    let (via_a, via_b) = (client(&gw_a.addr, "shared").await, client(&gw_b.addr, "shared").await);
    via_a.client().create_bucket().bucket("shared").send().await.unwrap();
    let one_mib = pattern(1 << 20, 3);
    via_a.put("big.bin", one_mib.clone(), Default::default()).await.unwrap();
    assert_eq!(get(&via_b, "big.bin").await, one_mib, "read through the other filer's gateway at once");
    // The bytes are in the blob store, under the prefix, not in filer A's data directory.
    let (objects, _) = (blob_bucket.list("cluster/blobs/", None, None, 100).await.unwrap().objects, ());
    assert_eq!(objects.len(), 1, "{objects:?}");
    assert!(std::fs::read_dir(tmp.path().join("a/blobs")).map_or(0, |d| d.count()) == 0, "nothing in A's blobs/");

    a.kill();
    assert_eq!(get(&via_b, "big.bin").await, one_mib, "still read through B after A was SIGKILLed");
    let filer_b = HttpFiler::new(&b.addr, None).unwrap();
    assert_eq!(read_back(&filer_b, "/buckets/shared/big.bin").await, one_mib);

    // A filer that could not read them refuses, naming the flag (and the store, where useful).
    let err = refused(&tmp.path().join("c"), &store, None);
    assert!(err.contains("--blob-store") && err.contains(&format!("s3://{bucket}/cluster/")), "{err}");
    let other = format!("s3://{bucket}/elsewhere?endpoint={}", moto.endpoint);
    let err = refused(&tmp.path().join("d"), &store, Some(&other));
    assert!(err.contains("give every filer the same --blob-store"), "{err}");
    let err = refused(&tmp.path().join("e"), &store, Some("s3://no-such-bucket-here?endpoint=http://127.0.0.1:9"));
    assert!(err.contains("--blob-store") && err.contains("does not answer"), "{err}");
}

/// Two filers on one database without a blob store: the second refuses, naming the flag and
/// the command that moves the first one's files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_filer_without_a_blob_store_refuses_and_migrate_moves_the_first_ones_files() {
    let moto = Moto::get();
    let pg = Postgres::get();
    let store = pg.fresh_database("blobs_migrate");
    let tmp = tempfile::tempdir().unwrap();
    let mut a = filer(&tmp.path().join("a"), &store, None, &[]);
    let filer_a = HttpFiler::new(&a.addr, None).unwrap();
    let body = pattern(300_000, 9);
    let b2 = body.clone();
    filer_a
        .write("/docs/big.bin", futures::stream::once(async move { Ok(b2) }).boxed(), WriteOptions::default())
        .await
        .unwrap();
    let err = refused(&tmp.path().join("b"), &store, None);
    assert!(err.contains("--blob-store") && err.contains("tidemark blobs migrate"), "{err}");

    let bucket = unique_name("migrate");
    let s3 = S3Storage::connect(&moto.conf("s3"), &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();
    let url = format!("s3://{bucket}?endpoint={}", moto.endpoint);
    // The filer must be stopped to migrate its directory.
    let busy = Command::new(bin())
        .args([
            "blobs",
            "migrate",
            "--data-dir",
            tmp.path().join("a").to_str().unwrap(),
            "--store",
            &store,
            "--blob-store",
            &url,
        ])
        .envs(AWS.iter().copied())
        .output()
        .unwrap();
    assert_eq!(busy.status.code(), Some(1), "{}", String::from_utf8_lossy(&busy.stderr));
    a.signal("TERM");
    a.wait_exit(Duration::from_secs(10)).expect("stops on SIGTERM");
    for _ in 0..2 {
        let out = Command::new(bin())
            .args([
                "blobs",
                "migrate",
                "--data-dir",
                tmp.path().join("a").to_str().unwrap(),
                "--store",
                &store,
                "--blob-store",
                &url,
            ])
            .envs(AWS.iter().copied())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("--blob-store"), "{text}");
    }
    let b = filer(&tmp.path().join("b"), &store, Some(&url), &[]);
    let filer_b = HttpFiler::new(&b.addr, None).unwrap();
    assert_eq!(read_back(&filer_b, "/docs/big.bin").await, body, "moved, read through another filer");
}

/// SIGKILL (a failpoint that aborts the process) between storing a file's bytes and committing
/// its entry, and between the collector's removal of a blob and the write of its cursor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_between_the_steps_lose_nothing_and_leave_only_collectable_garbage() {
    let moto = Moto::get();
    let pg = Postgres::get();
    let store = pg.fresh_database("blobs_crash");
    let bucket = unique_name("crash");
    let s3 = S3Storage::connect(&moto.conf("s3"), &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();
    let url = format!("s3://{bucket}?endpoint={}", moto.endpoint);
    let tmp = tempfile::tempdir().unwrap();
    let blobs = || async { s3.list("blobs/", None, None, 1000).await.unwrap().objects.len() };
    let put = |f: &HttpFiler, p: &'static str, body: Bytes| {
        let f = f.clone();
        async move { f.write(p, futures::stream::once(async move { Ok(body) }).boxed(), WriteOptions::default()).await }
    };

    // 1. Between storing and committing.
    let mut a =
        filer(&tmp.path().join("a"), &store, Some(&url), &[("TIDEMARK_FAILPOINTS", "blob-stored-before-commit")]);
    let fa = HttpFiler::new(&a.addr, None).unwrap();
    assert!(put(&fa, "/x/lost.bin", pattern(200_000, 1)).await.is_err(), "the write was never acknowledged");
    a.wait_exit(Duration::from_secs(10)).expect("the failpoint killed it");
    assert_eq!(blobs().await, 1, "its bytes are in the store, named by nothing");
    let a = filer(&tmp.path().join("a"), &store, Some(&url), &[("TIDEMARK_BLOB_GRACE_SECS", "0")]);
    let fa = HttpFiler::new(&a.addr, None).unwrap();
    assert!(fa.stat("/x/lost.bin").await.unwrap().is_none(), "no entry without its bytes");
    put(&fa, "/x/kept.bin", pattern(250_000, 2)).await.unwrap();
    let gc = |min_age: &str| {
        let out = Command::new(bin())
            .args([
                "blobs",
                "gc",
                "--data-dir",
                tmp.path().join("gc").to_str().unwrap(),
                "--store",
                &store,
                "--blob-store",
                &url,
                "--min-age",
                min_age,
            ])
            .envs(AWS.iter().copied())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(gc("1h").contains("0 removed, 1 unnamed but younger"), "young garbage is kept");
    let swept = gc("0s");
    assert!(swept.contains("1 named, 1 removed"), "{swept}");
    assert_eq!(blobs().await, 1);

    // 2. Between the collector's removal and its cursor: the removal is repeated, harmlessly.
    // (SIGTERM: the filer hands its leases over at once.)
    let mut a = a;
    a.signal("TERM");
    a.wait_exit(Duration::from_secs(10)).expect("stops on SIGTERM");
    let mut a = filer(
        &tmp.path().join("a"),
        &store,
        Some(&url),
        &[("TIDEMARK_FAILPOINTS", "blob-removed-before-cursor"), ("TIDEMARK_BLOB_GRACE_SECS", "0")],
    );
    let fa = HttpFiler::new(&a.addr, None).unwrap();
    put(&fa, "/x/kept.bin", pattern(260_000, 3)).await.unwrap();
    a.wait_exit(Duration::from_secs(30)).expect("the collector hit its failpoint");
    assert_eq!(blobs().await, 1, "the overwritten version's blob went; the new one is there");
    let a = filer(&tmp.path().join("a"), &store, Some(&url), &[("TIDEMARK_BLOB_GRACE_SECS", "0")]);
    let fa = HttpFiler::new(&a.addr, None).unwrap();
    assert_eq!(read_back(&fa, "/x/kept.bin").await, pattern(260_000, 3));
    // The collector takes over (once the dead process's lease ran out), repeats the removal it
    // had not recorded, and goes on: the blob of a version overwritten now goes too.
    put(&fa, "/x/other.bin", pattern(100_000, 4)).await.unwrap();
    put(&fa, "/x/other.bin", pattern(100_001, 5)).await.unwrap();
    assert_eq!(blobs().await, 3);
    let deadline = Instant::now() + Duration::from_secs(30);
    while blobs().await != 2 {
        assert!(Instant::now() < deadline, "the collector did not resume");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (p, body) in [("/x/kept.bin", pattern(260_000, 3)), ("/x/other.bin", pattern(100_001, 5))] {
        assert_eq!(read_back(&fa, p).await, body, "{p}");
    }
    let e = fa.stat("/x/kept.bin").await.unwrap().unwrap();
    assert!(matches!(e.content, Content::Blob { .. }));
}

/// The content cache of every filer follows changes made through any filer: a remote-backed
/// file read (and cached) through both filers, overwritten in the bucket and synced through
/// filer A, reads as the new version through filer B at once — B's cache records were dropped
/// by the commit A made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_through_one_filer_is_what_every_filers_cache_serves() {
    let moto = Moto::get();
    let pg = Postgres::get();
    let store = pg.fresh_database("caches");
    let (data, blob_bucket) = (unique_name("cached"), unique_name("cblobs"));
    let s3 = S3Storage::connect(&moto.conf("s3"), &data).await.unwrap();
    for b in [&data, &blob_bucket] {
        s3.client().create_bucket().bucket(b).send().await.unwrap();
    }
    let url = format!("s3://{blob_bucket}?endpoint={}", moto.endpoint);
    let tmp = tempfile::tempdir().unwrap();
    let a = filer(&tmp.path().join("a"), &store, Some(&url), &[]);
    let b = filer(&tmp.path().join("b"), &store, Some(&url), &[]);
    let sh = |addr: &str, cmd: &str| tidemark_testkit::ok(tidemark_testkit::run_shell(bin(), addr, cmd, &[]));
    sh(
        &a.addr,
        &format!(
            "remote.configure -name=s3 -type=s3 -s3.endpoint={} -s3.access_key=testing -s3.secret_key=testing",
            moto.endpoint
        ),
    );
    let v1 = pattern(3 * 1024 * 1024, 1);
    s3.put("big.bin", v1.clone(), Default::default()).await.unwrap();
    sh(&a.addr, &format!("remote.mount -dir=/mnt/data -remote=s3/{data}"));
    let (fa, fb) = (HttpFiler::new(&a.addr, None).unwrap(), HttpFiler::new(&b.addr, None).unwrap());
    let read = |f: &HttpFiler| {
        let f = f.clone();
        async move { read_back(&f, "/mnt/data/big.bin").await }
    };
    for f in [&fa, &fb] {
        assert_eq!(read(f).await, v1);
    }
    // Both caches hold it (a read does not wait for the records; they follow at once).
    let deadline = Instant::now() + Duration::from_secs(10);
    for f in [&fa, &fb] {
        loop {
            let st = f.cache_status(&["/mnt/data/big.bin".to_string()]).await.unwrap();
            if st[0].cached_bytes == v1.len() as u64 {
                break;
            }
            assert!(Instant::now() < deadline, "not cached: {st:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let v2 = pattern(3 * 1024 * 1024, 2);
    s3.put("big.bin", v2.clone(), Default::default()).await.unwrap();
    assert_eq!(read(&fb).await, v1, "before the change is synced, B serves the version its entry describes");
    let synced = sh(&a.addr, "remote.meta.sync -dir=/mnt/data");
    assert!(synced.contains("updated 1"), "{synced}");
    assert_eq!(read(&fb).await, v2, "once the sync through A committed, B serves the new bytes");
    assert_eq!(read(&fa).await, v2);

    // The outbound sync uploads from the blob store: a large file written through B under the
    // synced mount reaches the bucket, whichever filer runs the sync.
    sh(&a.addr, "remote.sync.enable -dir=/mnt/data");
    let local = pattern(300_000, 3);
    let body = local.clone();
    fb.write("/mnt/data/up.bin", futures::stream::once(async move { Ok(body) }).boxed(), WriteOptions::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while s3.stat("up.bin").await.unwrap().is_none() {
        assert!(Instant::now() < deadline, "not uploaded");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let parts: Vec<Bytes> = s3.get("up.bin", None, None).await.unwrap().map(|c| c.unwrap()).collect().await;
    assert_eq!(parts.concat(), local, "the bucket holds the blob's bytes");
}

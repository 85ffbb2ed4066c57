//! What the clouds send, end to end as a user runs it (`tidemark server` against moto): two
//! mounted buckets, `/a` synced to a versioned bucket, `/b` another bucket, both with events on.
//!
//! - A file written to `/a` is uploaded with this cluster's metadata; copied into bucket B with
//!   S3's default CopyObject (metadata kept, as `aws s3 cp`, rclone and replication do), it is
//!   what `/b` shows within seconds — applied, not taken for an echo.
//! - An older upload of `/a/v.txt` restored over it by a copy of its version ("restore this
//!   version") is what `/a/v.txt` shows: a change, not an echo of an older version.
//! - A bucket holding a key XML cannot carry (`bad\x01key.txt`) mounts and reconciles whole.

use std::path::Path;

use aws_sdk_s3::types::{BucketVersioningStatus, VersioningConfiguration};
use bytes::Bytes;
use tidemark_cloud::aws::s3::S3Storage;
use tidemark_core::{Filer, RemoteStorage};
use tidemark_filer::HttpFiler;
use tidemark_testkit::{Moto, TidemarkProcess, eventually, ok, run_shell, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

/// The subscription of `dir` as `remote.events.list -json` shows it.
fn subscription(addr: &str, dir: &str) -> serde_json::Value {
    let docs: serde_json::Value =
        serde_json::from_str(&ok(run_shell(bin(), addr, "remote.events.list -json", &[]))).unwrap();
    docs.as_array().unwrap().iter().find(|d| d["dir"] == dir).cloned().unwrap_or_default()
}

fn counter(sub: &serde_json::Value, name: &str) -> u64 {
    sub["status"]["counters"][name].as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_own_uploads_and_restored_versions_are_changes_not_echoes() {
    let moto = Moto::get();
    let conf = moto.conf("s3");
    let (bucket_a, bucket_b) = (unique_name("ca"), unique_name("cb"));
    let a = S3Storage::connect(&conf, &bucket_a).await.unwrap();
    let b = S3Storage::connect(&conf, &bucket_b).await.unwrap();
    for (s, name) in [(&a, &bucket_a), (&b, &bucket_b)] {
        s.client().create_bucket().bucket(name).send().await.unwrap();
    }
    a.client()
        .put_bucket_versioning()
        .bucket(&bucket_a)
        .versioning_configuration(VersioningConfiguration::builder().status(BucketVersioningStatus::Enabled).build())
        .send()
        .await
        .unwrap();
    // Bucket B already holds k.txt (someone else's) and a key XML 1.0 cannot carry.
    b.put("k.txt", Bytes::from_static(b"theirs"), Default::default()).await.unwrap();
    b.put("bad\u{1}key.txt", Bytes::from_static(b"control"), Default::default()).await.unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[]);
    ok(sh(&moto.configure_command("s3")));
    ok(sh(&format!("remote.mount -dir=/a -remote=s3/{bucket_a}")));
    ok(sh("remote.sync.enable -dir=/a"));
    ok(sh("remote.events.enable -dir=/a"));
    let mounted = ok(sh(&format!("remote.mount -dir=/b -remote=s3/{bucket_b}")));
    assert!(mounted.contains("created 2"), "the key with a control character mounts with the rest: {mounted}");
    assert!(ok(sh("fs.ls /b")).contains("bad\\x01key.txt"), "listed, printed escaped");
    ok(sh("remote.events.enable -dir=/b"));
    let filer = HttpFiler::new(&server.addr, None).unwrap();
    eventually("both subscriptions tailing", || {
        ["/a", "/b"].iter().all(|d| subscription(&server.addr, d)["status"]["state"] == "tailing")
    });

    // A file written to /a is uploaded, bound to its entry.
    let local = tmp.path().join("k.txt");
    std::fs::write(&local, "ours, written to /a").unwrap();
    ok(sh(&format!("fs.put {} /a/k.txt", local.display())));
    let recorded = |path: &'static str| {
        let filer = &filer;
        let storage = if path.starts_with("/a") { &a } else { &b };
        let key = path.rsplit('/').next().unwrap().to_string();
        async move {
            let Some(o) = storage.stat(&key).await.unwrap() else { return false };
            filer.stat(path).await.unwrap().and_then(|e| e.remote).is_some_and(|r| r.etag == o.etag)
        }
    };
    for _ in 0..200 {
        if recorded("/a/k.txt").await {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(recorded("/a/k.txt").await, "the upload of /a/k.txt is recorded");
    let uploaded = a.stat("k.txt").await.unwrap().unwrap();
    let meta = uploaded.user_metadata.clone().unwrap();
    assert_eq!(meta["tidemark-entry"], tidemark_core::decide::entry_binding("/a/k.txt"), "{meta:?}");

    // Copied into bucket B with its metadata: /b shows it, applied, and no echo is counted.
    let b_before = subscription(&server.addr, "/b");
    let t0 = std::time::Instant::now();
    b.client()
        .copy_object()
        .bucket(&bucket_b)
        .key("k.txt")
        .copy_source(format!("{bucket_a}/k.txt"))
        .send()
        .await
        .unwrap();
    eventually("the copy in /b", || String::from_utf8_lossy(&sh("fs.cat /b/k.txt").stdout) == "ours, written to /a");
    let visible_after = t0.elapsed();
    eventually("the /b counters", || {
        counter(&subscription(&server.addr, "/b"), "applied") > counter(&b_before, "applied")
    });
    let b_after = subscription(&server.addr, "/b");
    assert_eq!(counter(&b_after, "echo_suppressed"), 0, "a copy is not an echo: {b_after}");
    eprintln!("copy into another mounted bucket visible after {visible_after:?}");

    // Two versions of /a/v.txt, each uploaded and recorded; then the first restored by a copy.
    for body in ["version one", "version two"] {
        std::fs::write(&local, body).unwrap();
        ok(sh(&format!("fs.put {} /a/v.txt", local.display())));
        eventually("the upload", || {
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(async {
                    let o = a.stat("v.txt").await.unwrap();
                    o.is_some()
                        && recorded("/a/v.txt").await
                        && String::from_utf8_lossy(&sh("fs.cat /a/v.txt").stdout) == body
                })
            })
        });
    }
    let versions = a.client().list_object_versions().bucket(&bucket_a).prefix("v.txt").send().await.unwrap();
    // The first version by its bytes (both may carry the same second as their time).
    let v1_etag = "5f432711af7ffa8942d5588e21259022"; // MD5 of "version one"
    let first = versions
        .versions()
        .iter()
        .find(|v| v.key() == Some("v.txt") && v.e_tag().is_some_and(|e| e.trim_matches('"') == v1_etag))
        .and_then(|v| v.version_id())
        .unwrap_or_else(|| panic!("the first version of v.txt: {versions:?}"))
        .to_string();
    let a_before = subscription(&server.addr, "/a");
    a.client()
        .copy_object()
        .bucket(&bucket_a)
        .key("v.txt")
        .copy_source(format!("{bucket_a}/v.txt?versionId={first}"))
        .send()
        .await
        .unwrap();
    let restored = a.stat("v.txt").await.unwrap().unwrap();
    assert!(restored.user_metadata.as_ref().unwrap().contains_key("tidemark-version"), "the restore kept the metadata");
    for _ in 0..100 {
        if String::from_utf8_lossy(&sh("fs.cat /a/v.txt").stdout) == "version one" {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let cat = sh("fs.cat /a/v.txt");
    assert_eq!(
        String::from_utf8_lossy(&cat.stdout),
        "version one",
        "the restored version in /a: {} / {} / {}\n{}",
        String::from_utf8_lossy(&cat.stderr),
        ok(sh("fs.meta.cat /a/v.txt")),
        subscription(&server.addr, "/a"),
        server.stderr()
    );
    let e = filer.stat("/a/v.txt").await.unwrap().unwrap();
    assert_eq!(e.remote.unwrap().etag, restored.etag, "the entry mirrors the restored object");
    eventually("the /a counters", || {
        counter(&subscription(&server.addr, "/a"), "applied") > counter(&a_before, "applied")
    });
    // A reconcile agrees with what the events did: nothing left to change.
    let synced = ok(sh("remote.meta.sync -dir=/a"));
    assert!(synced.contains("created 0, updated 0, deleted 0"), "{synced}");
    let synced = ok(sh("remote.meta.sync -dir=/b"));
    assert!(synced.contains("created 0, updated 0, deleted 0"), "{synced}");
}

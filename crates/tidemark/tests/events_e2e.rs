//! The whole loop, as a user runs it: `tidemark server`, an S3 mount, `remote.events.enable`
//! (provisioning a queue), and then changes made directly in the bucket appear in the namespace
//! within seconds, applied by the server's own worker (its admin schedules the slices).

use std::path::Path;

use bytes::Bytes;
use tidemark_cloud::aws::s3::S3Storage;
use tidemark_core::RemoteStorage;
use tidemark_testkit::{Moto, TidemarkProcess, eventually, ok, run_shell, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_changes_reach_the_namespace_through_events() {
    let moto = Moto::get();
    let conf = moto.conf("s3");
    let bucket = unique_name("e2e");
    let s3 = S3Storage::connect(&conf, &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();
    s3.put("before.txt", Bytes::from_static(b"was there first"), Default::default()).await.unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[]);
    ok(sh(&moto.configure_command("s3")));
    ok(sh(&format!("remote.mount -dir=/mnt/data -remote=s3/{bucket}")));
    ok(sh("remote.events.enable -dir=/mnt/data"));

    // A new object appears, with its content read lazily from the bucket.
    s3.put("dir/new file.txt", Bytes::from_static(b"hello from the bucket"), Default::default()).await.unwrap();
    eventually("the new object", || sh("fs.cat '/mnt/data/dir/new file.txt'").status.success());
    assert_eq!(ok(sh("fs.cat '/mnt/data/dir/new file.txt'")), "hello from the bucket");
    // An overwrite and a delete follow.
    s3.put("dir/new file.txt", Bytes::from_static(b"changed"), Default::default()).await.unwrap();
    eventually("the overwrite", || {
        String::from_utf8_lossy(&sh("fs.cat '/mnt/data/dir/new file.txt'").stdout) == "changed"
    });
    s3.delete("before.txt").await.unwrap();
    eventually("the delete", || !sh("fs.cat /mnt/data/before.txt").status.success());

    // The subscription shows the slice's state and counters.
    eventually("counters", || {
        let docs: serde_json::Value = serde_json::from_str(&ok(sh("remote.events.list -json"))).unwrap();
        docs[0]["status"]["counters"]["applied"].as_u64().unwrap_or(0) >= 3
    });
    let docs: serde_json::Value = serde_json::from_str(&ok(sh("remote.events.list -json"))).unwrap();
    let status = &docs[0]["status"];
    assert_eq!(status["state"], "tailing", "{status}");
    assert_eq!(status["last_reconcile"][0], "baseline");
}

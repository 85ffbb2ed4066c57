//! Re-pointing a subscription — disable, then enable with another queue or prefix — is a new
//! identity: its first slice runs a baseline, so objects that reached the bucket while no queue
//! told Tidemark about them appear (a marker keyed on the directory would have skipped them).

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use tidemark_cloud::aws::s3::S3Storage;
use tidemark_core::RemoteStorage;
use tidemark_testkit::{Moto, TidemarkProcess, eventually, ok, run_shell, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repointed_subscription_runs_a_baseline_first() {
    let moto = Moto::get();
    let conf = moto.conf("s3");
    let bucket = unique_name("repoint");
    let s3 = S3Storage::connect(&conf, &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();
    // Two queues nothing routes to: only reconciles can find objects.
    let sqs = tidemark_cloud::aws::sqs::client(&conf).await.unwrap();
    let mut queues = Vec::new();
    for q in ["one", "two"] {
        let name = format!("{bucket}-{q}");
        queues.push(sqs.create_queue().queue_name(name).send().await.unwrap().queue_url.unwrap());
    }

    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[]);
    ok(sh(&moto.configure_command("s3")));
    ok(sh(&format!("remote.mount -dir=/mnt/data -remote=s3/{bucket}")));
    s3.put("before-first.txt", Bytes::from_static(b"1"), Default::default()).await.unwrap();
    ok(sh(&format!("remote.events.enable -dir=/mnt/data -queue={}", queues[0])));
    let status = |fp: &str| -> serde_json::Value {
        let docs: serde_json::Value = serde_json::from_str(&ok(sh("remote.events.list -json"))).unwrap();
        let d = docs.as_array().unwrap().iter().find(|d| d["fingerprint"] == fp).cloned().unwrap_or_default();
        d["status"].clone()
    };
    let fp_of = || -> String {
        let docs: serde_json::Value = serde_json::from_str(&ok(sh("remote.events.list -json"))).unwrap();
        docs[0]["fingerprint"].as_str().unwrap().to_string()
    };
    let fp1 = fp_of();
    eventually("the first identity's baseline", || status(&fp1)["last_reconcile"][0] == "baseline");
    assert!(sh("fs.cat /mnt/data/before-first.txt").status.success(), "the baseline imported it");

    // Tailing a queue nothing routes to, a new object stays unseen.
    s3.put("while-tailing.txt", Bytes::from_static(b"22"), Default::default()).await.unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert!(!sh("fs.cat /mnt/data/while-tailing.txt").status.success(), "no event, no reconcile due");

    // Re-pointed to the other queue: a new fingerprint, never reconciled, so a baseline first.
    ok(sh("remote.events.disable -dir=/mnt/data"));
    ok(sh(&format!("remote.events.enable -dir=/mnt/data -queue={}", queues[1])));
    let fp2 = fp_of();
    assert_ne!(fp1, fp2);
    eventually("the re-pointed identity's baseline", || status(&fp2)["last_reconcile"][0] == "baseline");
    assert_eq!(ok(sh("fs.cat /mnt/data/while-tailing.txt")), "22");

    // And a narrower prefix on the same queue is new again.
    s3.put("photos/new.jpg", Bytes::from_static(b"333"), Default::default()).await.unwrap();
    ok(sh("remote.events.disable -dir=/mnt/data"));
    ok(sh(&format!("remote.events.enable -dir=/mnt/data -queue={} -prefix=photos", queues[1])));
    let fp3 = fp_of();
    assert!(fp3 != fp2 && fp3 != fp1);
    eventually("the prefix identity's baseline", || status(&fp3)["last_reconcile"][0] == "baseline");
    assert_eq!(ok(sh("fs.cat /mnt/data/photos/new.jpg")), "333");
}

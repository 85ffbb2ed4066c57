//! S3 through EventBridge (`-via=eventbridge`) against moto, as a user runs it: provisioning
//! turns the bucket's EventBridge delivery on (keeping its other configuration), puts a rule of
//! this cluster's on the default bus and the queue as its target; puts and deletes — keys with
//! spaces, `+` and unicode among them — reach the namespace as fast as through a direct queue
//! in the same run; teardown removes the rule, the queue and its dead-letter queue, and says
//! that it turned EventBridge off again (Tidemark turned it on, no other rule of its needs it).

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tidemark_cloud::aws::s3::S3Storage;
use tidemark_core::RemoteStorage;
use tidemark_testkit::{Moto, TidemarkProcess, eventually, ok, run_shell, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

fn subscription(addr: &str, dir: &str) -> serde_json::Value {
    let docs: serde_json::Value =
        serde_json::from_str(&ok(run_shell(bin(), addr, "remote.events.list -json", &[]))).unwrap();
    docs.as_array().unwrap().iter().find(|d| d["dir"] == dir).cloned().unwrap_or_default()
}

/// Seconds from a put until `ls` shows it, over `n` puts.
fn put_to_visible(rt: &tokio::runtime::Handle, s3: &S3Storage, addr: &str, dir: &str, n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let key = format!("lag-{i}.txt");
            let t = Instant::now();
            rt.block_on(s3.put(&key, Bytes::from_static(b"x"), Default::default())).unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            while !ok(run_shell(bin(), addr, &format!("fs.ls {dir}"), &[])).contains(&key) {
                assert!(Instant::now() < deadline, "{key} not visible in {dir}");
                std::thread::sleep(Duration::from_millis(20));
            }
            t.elapsed().as_secs_f64()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventbridge_provisions_delivers_and_tears_down() {
    let moto = Moto::get();
    let conf = moto.conf("s3");
    let (bucket, direct_bucket) = (unique_name("eb"), unique_name("ebd"));
    let s3 = S3Storage::connect(&conf, &bucket).await.unwrap();
    let direct = S3Storage::connect(&conf, &direct_bucket).await.unwrap();
    for (s, b) in [(&s3, &bucket), (&direct, &direct_bucket)] {
        s.client().create_bucket().bucket(b).send().await.unwrap();
    }
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[]);
    ok(sh(&moto.configure_command("s3")));
    ok(sh(&format!("remote.mount -dir=/mnt/eb -remote=s3/{bucket}")));
    ok(sh(&format!("remote.mount -dir=/mnt/direct -remote=s3/{direct_bucket}")));
    let enabled = ok(sh("remote.events.enable -dir=/mnt/eb -via=eventbridge"));
    assert!(enabled.contains("provisioned eventbridge"), "{enabled}");
    ok(sh("remote.events.enable -dir=/mnt/direct"));
    let doc = subscription(&server.addr, "/mnt/eb");
    assert_eq!(doc["identity"]["topology"], "eventbridge");
    let rule = doc["managed"]["rule_name"].as_str().unwrap().to_string();
    assert_eq!(doc["managed"]["eventbridge_turned_on"], true);
    // (moto keeps EventBridgeConfiguration but never returns it from GetBucketNotificationConfiguration:
    // that it is on shows in the events that arrive below.)
    eventually("both tailing", || {
        ["/mnt/eb", "/mnt/direct"].iter().all(|d| subscription(&server.addr, d)["status"]["state"] == "tailing")
    });

    // Keys that need encoding arrive as themselves; a delete leaves.
    for key in ["a b+c.txt", "ü/x.txt", "50%.txt"] {
        s3.put(key, Bytes::from_static(b"k"), Default::default()).await.unwrap();
    }
    eventually("the keys through EventBridge", || {
        let ls = ok(sh("fs.ls /mnt/eb")) + &ok(sh("fs.ls /mnt/eb/ü"));
        ls.contains("a b+c.txt") && ls.contains("x.txt") && ls.contains("50%.txt")
    });
    s3.delete("a b+c.txt").await.unwrap();
    eventually("the delete through EventBridge", || !ok(sh("fs.ls /mnt/eb")).contains("a b+c.txt"));

    // Put → visible, beside a direct queue in the same run.
    let rt = tokio::runtime::Handle::current();
    let (eb, dq) = tokio::task::block_in_place(|| {
        (
            put_to_visible(&rt, &s3, &server.addr, "/mnt/eb", 10),
            put_to_visible(&rt, &direct, &server.addr, "/mnt/direct", 10),
        )
    });
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (eb_p50, dq_p50) = (median(eb), median(dq));
    eprintln!("put → visible, p50 of 10: eventbridge {eb_p50:.3} s, sqs_direct {dq_p50:.3} s");
    assert!(eb_p50 < 2.0, "eventbridge p50 {eb_p50:.3} s (sqs_direct {dq_p50:.3} s)");

    let torn = ok(sh("remote.events.disable -dir=/mnt/eb -teardown"));
    assert!(torn.contains(&format!("EventBridge rule {rule}")), "{torn}");
    // Which of the two happened is said: no other rule of Tidemark's needs it here.
    assert!(torn.contains("turned the bucket's EventBridge delivery off (Tidemark had turned it on)"), "{torn}");
    let queues: Vec<String> = tidemark_cloud::aws::sqs::client(&conf)
        .await
        .unwrap()
        .list_queues()
        .send()
        .await
        .unwrap()
        .queue_urls()
        .to_vec();
    assert!(!queues.iter().any(|q| q.ends_with(&rule) || q.ends_with(&format!("{rule}-dead"))), "{queues:?}");
}

//! A worker told to stop (SIGTERM) while its slice is in a long poll ends the slice only when the
//! poll comes back (up to 19 s on SQS: what the poll took off the queue must be given back). All
//! that time it keeps heart-beating as *draining*, so the admin — whose worker timeout here is
//! 2 s — neither calls it dead nor hands its slice to another worker; then it leaves.

use std::path::Path;
use std::time::{Duration, Instant};

use tidemark_testkit::{Moto, TidemarkProcess, ok, run_shell, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

async fn workers(admin: &str) -> Vec<serde_json::Value> {
    let body = reqwest::get(format!("http://{admin}/api/v1/workers")).await.unwrap().text().await.unwrap();
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    doc["workers"].as_array().cloned().unwrap_or_default()
}

async fn tailing(filer: &str) -> bool {
    let out = ok(run_shell(bin(), filer, "remote.events.list", &[]));
    out.lines().nth(1).is_some_and(|l| l.split('\t').nth(6) == Some("tailing"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_worker_keeps_heart_beating_until_its_slice_has_ended() {
    let moto = Moto::get();
    let bucket = unique_name("drain");
    let s3 = tidemark_cloud::aws::s3::S3Storage::connect(&moto.conf("s3"), &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let filer =
        TidemarkProcess::start(bin(), &data, &["filer", "--data-dir", data.to_str().unwrap(), "--addr", "127.0.0.1:0"]);
    let admin = TidemarkProcess::start(
        bin(),
        &tmp.path().join("admin"),
        &["admin", "--filer", &filer.addr, "--addr", "127.0.0.1:0", "--worker-timeout", "2"],
    );
    let sh = |cmd: &str| ok(run_shell(bin(), &filer.addr, cmd, &[]));
    sh(&moto.configure_command("s3"));
    sh(&format!("remote.mount -dir=/mnt/data -remote=s3/{bucket}"));
    // A long slice: idle, it waits in long polls of up to 19 s.
    sh("remote.events.enable -dir=/mnt/data -slice=120s");

    // A drain is as long as the poll in flight has left: from 0 to 19 s. One longer than the
    // admin's timeout shows the heartbeats at work; a short one (a poll just ending) proves
    // nothing, and the worker is started again (at most 4 times).
    let mut longest = Duration::ZERO;
    for attempt in 0..4 {
        let id = format!("w{attempt}");
        let log = tmp.path().join(format!("{id}.log"));
        let mut worker = TidemarkProcess::start_quiet(
            bin(),
            &log,
            &["worker", "--admin", &admin.addr, "--filer", &filer.addr, "--id", &id, "--lease-ttl", "4"],
            |log| log.contains("registered with the admin"),
        );
        let began = Instant::now();
        while !tailing(&filer.addr).await {
            assert!(began.elapsed() < Duration::from_secs(60), "the subscription tails");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Into a long poll of an empty queue.
        tokio::time::sleep(Duration::from_secs(3)).await;
        worker.signal("TERM");
        let stopped = Instant::now();
        let mut seen_draining = false;
        let exit = loop {
            if let Some(exit) = worker.wait_exit(Duration::ZERO) {
                break exit;
            }
            let listed = workers(&admin.addr).await;
            let me = listed.iter().find(|w| w["worker_id"] == id.as_str());
            match me {
                Some(w) => seen_draining |= w["draining"] == true,
                None => {
                    // Gone from the admin's list while still running: only after it said it
                    // leaves (its last act).
                    assert!(
                        std::fs::read_to_string(&log).unwrap_or_default().contains("worker stopped"),
                        "the admin dropped worker {id} {:?} into its drain, while it still ran",
                        stopped.elapsed()
                    );
                }
            }
            assert!(stopped.elapsed() < Duration::from_secs(40), "the worker ends its drain");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let drain = stopped.elapsed();
        assert!(exit.success(), "{exit:?}");
        longest = longest.max(drain);
        if drain > Duration::from_secs(3) {
            assert!(seen_draining, "listed as draining during a drain of {drain:?}");
            return;
        }
    }
    panic!("no drain outlasted the admin's 2 s worker timeout in four tries (longest {longest:?})");
}

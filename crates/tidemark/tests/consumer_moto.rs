//! The consumer's edges against moto, as a user runs `tidemark server`:
//!
//! - A message that can never be applied (not an S3 notification at all) is received
//!   `-maxReceives` times, then moved by the queue's redrive policy to the dead-letter queue
//!   Tidemark provisioned; `remote.events.list` shows it waiting there (DEAD), counted `failed`
//!   with its reason, and changes after it still apply.
//! - A server stopped (SIGTERM) while its slice waits in a long poll gives back what that poll
//!   brings: a change made just after the stop is visible within seconds of the restart, not
//!   after the queue's visibility timeout (60 s).

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tidemark_cloud::aws::s3::S3Storage;
use tidemark_cloud::aws::sqs::client;
use tidemark_core::RemoteStorage;
use tidemark_testkit::{Moto, TidemarkProcess, eventually, ok, run_shell, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

fn subscription(addr: &str) -> serde_json::Value {
    let docs: serde_json::Value =
        serde_json::from_str(&ok(run_shell(bin(), addr, "remote.events.list -json", &[]))).unwrap();
    docs[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_never_applies_is_dead_lettered_and_shown() {
    let moto = Moto::get();
    let conf = moto.conf("s3");
    let bucket = unique_name("dl");
    let s3 = S3Storage::connect(&conf, &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[]);
    ok(sh(&moto.configure_command("s3")));
    ok(sh(&format!("remote.mount -dir=/mnt/data -remote=s3/{bucket}")));
    // Short slices, so each one's start and end samples the dead-letter queue soon; a short
    // visibility, so a failed message comes back at once.
    let enabled = ok(sh("remote.events.enable -dir=/mnt/data -maxReceives=2 -visibility=1 -slice=3s"));
    assert!(enabled.contains("dead letters after 2 receives"), "{enabled}");
    let err = String::from_utf8_lossy(&sh("remote.events.enable -dir=/mnt/data -maxReceives=5").stderr).into_owned();
    assert!(err.contains("-teardown"), "a provisioned dead-letter setting changes only with a new queue: {err}");
    eventually("tailing", || subscription(&server.addr)["status"]["state"] == "tailing");
    let doc = subscription(&server.addr);
    let (queue, dead) = (
        doc["managed"]["queue_url"].as_str().unwrap().to_string(),
        doc["managed"]["dead_letter_queue_url"].as_str().unwrap().to_string(),
    );

    let sqs = client(&conf).await.unwrap();
    sqs.send_message().queue_url(&queue).message_body("not an S3 notification").send().await.unwrap();
    let depth = || {
        let (sqs, dead) = (sqs.clone(), dead.clone());
        async move {
            let a = sqs
                .get_queue_attributes()
                .queue_url(&dead)
                .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
                .send()
                .await
                .unwrap();
            a.attributes().unwrap()[&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages]
                .parse::<u64>()
                .unwrap()
        }
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while depth().await == 0 {
        assert!(Instant::now() < deadline, "not dead-lettered: {}", subscription(&server.addr));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eventually("DEAD shown", || {
        let list = ok(sh("remote.events.list"));
        subscription(&server.addr)["status"]["dead_lettered"] == 1 && list.contains("DEAD")
    });
    let status = subscription(&server.addr)["status"].clone();
    assert!(status["counters"]["failed"].as_u64().unwrap() >= 2, "{status}");
    // The log says what happens next at each receive: redelivered, then (the last) dead-lettered.
    let log = server.stderr();
    assert!(log.contains("malformed message left to redeliver"), "{log}");
    assert!(log.contains("malformed message, its last receive: it goes to the dead-letter queue next"), "{log}");
    // And the queue goes on: a put after it is applied.
    s3.put("after.txt", Bytes::from_static(b"after"), Default::default()).await.unwrap();
    eventually("applied after the poison message", || ok(sh("fs.ls /mnt/data")).contains("after.txt"));

    let torn = ok(sh("remote.events.disable -dir=/mnt/data -teardown"));
    assert!(torn.contains(&format!("dead-letter queue {dead} with the 1 message(s) it still held")), "{torn}");
    let queues: Vec<String> = sqs.list_queues().send().await.unwrap().queue_urls().to_vec();
    assert!(!queues.contains(&dead) && !queues.contains(&queue), "{queues:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_made_as_the_server_stops_is_seen_right_after_it_restarts() {
    let moto = Moto::get();
    let bucket = unique_name("drain");
    let s3 = S3Storage::connect(&moto.conf("s3"), &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut server = TidemarkProcess::server(bin(), &data, &[]);
    let sh = |addr: &str, cmd: &str| run_shell(bin(), addr, cmd, &[]);
    ok(sh(&server.addr, &moto.configure_command("s3")));
    ok(sh(&server.addr, &format!("remote.mount -dir=/mnt/data -remote=s3/{bucket}")));
    // The default visibility (60 s): a message a dead poll took would stay hidden that long.
    ok(sh(&server.addr, "remote.events.enable -dir=/mnt/data"));
    eventually("tailing", || subscription(&server.addr)["status"]["state"] == "tailing");
    s3.put("before.txt", Bytes::from_static(b"b"), Default::default()).await.unwrap();
    eventually("before.txt", || ok(sh(&server.addr, "fs.ls /mnt/data")).contains("before.txt"));
    // The slice now waits in a long poll. Stop the server, and change the bucket right after.
    server.signal("TERM");
    s3.put("during.txt", Bytes::from_static(b"d"), Default::default()).await.unwrap();
    assert!(server.wait_exit(Duration::from_secs(30)).is_some_and(|s| s.success()), "a clean exit on SIGTERM");
    drop(server);
    let restarted = TidemarkProcess::server(bin(), &data, &[]);
    let t = Instant::now();
    eventually("during.txt after the restart", || ok(sh(&restarted.addr, "fs.ls /mnt/data")).contains("during.txt"));
    let took = t.elapsed();
    eprintln!("a change made as the server stopped was visible {took:?} after the restart");
    assert!(took < Duration::from_secs(5), "visible {took:?} after the restart, not after the visibility timeout");
}

/// The dead-letter depth shown is current while a long slice tails: read every 30 s, not only
/// at the slice's start and end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dead_letter_depth_is_read_again_while_a_slice_tails() {
    let moto = Moto::get();
    let conf = moto.conf("s3");
    let bucket = unique_name("dldepth");
    let s3 = S3Storage::connect(&conf, &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[]);
    ok(sh(&moto.configure_command("s3")));
    ok(sh(&format!("remote.mount -dir=/mnt/data -remote=s3/{bucket}")));
    ok(sh("remote.events.enable -dir=/mnt/data -maxReceives=2 -visibility=1 -slice=180s"));
    eventually("tailing", || subscription(&server.addr)["status"]["state"] == "tailing");
    let started = subscription(&server.addr)["status"]["slice_started_at_ms"].clone();
    let queue = subscription(&server.addr)["managed"]["queue_url"].as_str().unwrap().to_string();
    let sqs = client(&conf).await.unwrap();
    sqs.send_message().queue_url(&queue).message_body("not an S3 notification").send().await.unwrap();
    let t = Instant::now();
    let deadline = t + Duration::from_secs(60);
    loop {
        let status = subscription(&server.addr)["status"].clone();
        if status["dead_lettered"] == 1 {
            assert_eq!(status["slice_started_at_ms"], started, "seen within the same slice: {status}");
            eprintln!("dead-letter depth shown {:?} after the message was sent", t.elapsed());
            break;
        }
        assert!(Instant::now() < deadline, "the depth not shown within 60 s: {status}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

//! Every request Tidemark makes of a bucket is counted, and the count is what the bucket served:
//! compared, for a scripted sequence, with moto's own recording of the requests it answered.

use std::path::Path;

use bytes::Bytes;
use tidemark_cloud::aws::s3::S3Storage;
use tidemark_core::RemoteStorage;
use tidemark_testkit::{Moto, TidemarkProcess, ok, run_shell, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

/// The ListObjectsV2 requests moto recorded for `bucket` (path-style: `/bucket/?list-type=2...`).
fn lists_of(recorded: &[(String, String)], bucket: &str) -> usize {
    recorded
        .iter()
        .filter(|(m, p)| {
            m == "GET"
                && (p.starts_with(&format!("/{bucket}?")) || p.starts_with(&format!("/{bucket}/?")))
                && p.contains("list-type=2")
        })
        .count()
}

/// `requests: LIST 3, HEAD 1` in a reconcile's summary: the count of `op`.
fn counted(summary: &str, op: &str) -> usize {
    let part = summary.split("requests: ").nth(1).unwrap_or_else(|| panic!("no requests in {summary}"));
    let part = part.split(';').next().unwrap();
    part.split(", ")
        .find_map(|p| p.strip_prefix(&format!("{op} ")))
        .map_or(0, |n| n.trim().parse().unwrap_or_else(|_| panic!("{op} in {summary}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciles_requests_are_counted_as_the_bucket_served_them() {
    let tmp = tempfile::tempdir().unwrap();
    let recording = tmp.path().join("moto-requests.jsonl");
    let moto = Moto::recording(&recording);
    let bucket = unique_name("requests");
    let s3 = S3Storage::connect(&moto.conf("m"), &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();
    // 2,300 keys: three pages of a sequential listing, more ranges than one when listed at once.
    let keys: Vec<String> = (0..2300).map(|i| format!("data/{:02}/{i:05}.json", i % 17)).collect();
    for chunk in keys.chunks(100) {
        futures::future::join_all(chunk.iter().map(|k| s3.put(k, Bytes::from_static(b"x"), Default::default())))
            .await
            .into_iter()
            .for_each(|r| {
                r.unwrap();
            });
    }
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &["--s3-addr", "off"]);
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[]);
    ok(sh(&moto.configure_command("m")));
    let mounted = ok(sh(&format!("remote.mount -dir=/mnt/b -remote=m/{bucket}/data")));
    assert!(mounted.contains("created 2300"), "{mounted}");

    for ranges in [1, 8] {
        std::fs::write(&recording, b"").unwrap();
        let out = ok(sh(&format!("remote.meta.sync -dir=/mnt/b -quiet -listRanges={ranges}")));
        let summary = out.lines().last().unwrap();
        let recorded = Moto::recorded(&recording);
        let served = lists_of(&recorded, &bucket);
        eprintln!("{ranges} ranges: {summary}\n  moto served {served} LISTs of {bucket}");
        assert_eq!(counted(summary, "LIST"), served, "{ranges} ranges: {summary}");
        if ranges == 1 {
            assert_eq!(served, 3, "one stream of three pages: {summary}");
        } else {
            assert!(served >= 3, "{summary}");
        }
        // Nothing changed, and nothing else was asked of the bucket.
        assert!(summary.contains("created 0, updated 0, deleted 0"), "{summary}");
        let others: Vec<_> = recorded.iter().filter(|(_, p)| p.starts_with(&format!("/{bucket}"))).collect();
        assert_eq!(others.len(), served, "only LISTs: {others:?}");
        assert_eq!(counted(summary, "HEAD") + counted(summary, "GET"), 0, "{summary}");
    }

    // The filer's own requests: reads of two files fetch them through its content cache.
    std::fs::write(&recording, b"").unwrap();
    let filer = tidemark_filer::HttpFiler::new(&server.addr, None).unwrap();
    let before = tidemark_core::Filer::cache_stats(&filer).await.unwrap().remote_requests;
    for k in ["data/00/00000.json", "data/05/00005.json"] {
        assert_eq!(ok(sh(&format!("fs.cat /mnt/b/{}", &k["data/".len()..]))), "x");
    }
    let after = tidemark_core::Filer::cache_stats(&filer).await.unwrap().remote_requests;
    let of = |m: &std::collections::BTreeMap<String, std::collections::BTreeMap<String, u64>>, op: &str| {
        m.get("m").and_then(|ops| ops.get(op)).copied().unwrap_or(0)
    };
    let recorded = Moto::recorded(&recording);
    let gets = recorded.iter().filter(|(m, p)| m == "GET" && p.starts_with(&format!("/{bucket}/data/"))).count();
    let heads = recorded.iter().filter(|(m, p)| m == "HEAD" && p.starts_with(&format!("/{bucket}/"))).count();
    eprintln!("reads: the filer counted {after:?} (before {before:?}); moto served {gets} GETs, {heads} HEADs");
    assert_eq!((of(&after, "GET") - of(&before, "GET")) as usize, gets, "GETs");
    assert_eq!((of(&after, "HEAD") - of(&before, "HEAD")) as usize, heads, "HEADs");
    assert!(gets >= 2, "each file fetched: {recorded:?}");
}

/// A subscription's queue requests are counted as SQS served them: receives (one each, however
/// many messages), acknowledgements (one per batch of up to 10), visibility changes (an
/// extension and a release) and the dead-letter queue's depth — each equal to moto's recording.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queues_requests_are_counted_as_the_queue_served_them() {
    use std::time::Duration;
    use tidemark_core::events::EventSource;
    use tidemark_core::requests::{self, Requests};

    let tmp = tempfile::tempdir().unwrap();
    let recording = tmp.path().join("moto-requests.jsonl");
    let moto = Moto::recording(&recording);
    let conf = moto.conf("m");
    let sqs = tidemark_cloud::aws::sqs::client(&conf).await.unwrap();
    let queue = |name: String| {
        let sqs = sqs.clone();
        async move { sqs.create_queue().queue_name(name).send().await.unwrap().queue_url().unwrap().to_string() }
    };
    let url = queue(unique_name("events")).await;
    let dead = queue(unique_name("events-dead")).await;
    for i in 0..13 {
        sqs.send_message().queue_url(&url).message_body(format!("m{i}")).send().await.unwrap();
    }
    std::fs::write(&recording, b"").unwrap();

    let counted = Requests::default();
    let source = tidemark_cloud::aws::sqs::SqsSource::connect(&conf, &url)
        .await
        .unwrap()
        .with_dead_letter(Some(&dead))
        .with_requests(counted.clone());
    let mut got = Vec::new();
    while got.len() < 13 {
        got.extend(source.receive(10, Duration::from_secs(1)).await.unwrap());
    }
    source.extend(&got[0].ack_id, Duration::from_secs(60)).await.unwrap();
    source.release(&got[1].ack_id, Duration::ZERO).await.unwrap();
    // Eleven acknowledgements: two batches.
    let ids: Vec<String> = got[2..].iter().map(|d| d.ack_id.clone()).collect();
    let report = source.ack(&ids).await.unwrap();
    assert_eq!(report.acked.len(), 11, "{report:?}");
    assert_eq!(source.dead_lettered().await.unwrap(), Some(0));

    let served = Moto::recorded_actions(&recording);
    let of = |action: &str| served.iter().filter(|a| *a == action).count() as u64;
    let counts = counted.snapshot();
    let mine = |op: &str| counts.get(op).copied().unwrap_or(0);
    eprintln!("counted {counts:?}; moto served {served:?}");
    assert_eq!(mine(requests::RECEIVE), of("ReceiveMessage"), "receives");
    assert!(mine(requests::RECEIVE) >= 2, "13 messages take two receives at least");
    assert_eq!(mine(requests::ACK), of("DeleteMessageBatch"), "acknowledgements");
    assert_eq!(mine(requests::ACK), 2, "11 acknowledgements are two batches");
    assert_eq!(mine(requests::VISIBILITY), of("ChangeMessageVisibility"), "visibility changes");
    assert_eq!(mine(requests::VISIBILITY), 2, "an extension and a release");
    assert_eq!(mine(requests::DEPTH), of("GetQueueAttributes"), "depth reads");
    assert_eq!(counts.values().sum::<u64>(), served.len() as u64, "nothing else asked: {served:?}");
}

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

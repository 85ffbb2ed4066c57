//! What an entry keeps of its object, end to end as a user runs it (`tidemark server` against
//! moto, events on):
//!
//! - An object put with Content-Type, Content-Encoding, Content-Disposition, Content-Language,
//!   Cache-Control, Expires and user metadata is read back through the S3 gateway and the HTTP
//!   API with all of them, as S3 answers.
//! - An object in the GLACIER storage class: `fs.ls -l` says it is archived, `fs.cat` fails naming
//!   the class and the restore to run, the gateway answers 403 InvalidObjectState (not 503, which
//!   clients retry), `remote.cache` skips it with a count; once restored (the
//!   `ObjectRestore:Completed` event) it reads.
//! - A file PUT through the gateway with headers and metadata is uploaded to the bucket with them.

use std::path::Path;

use aws_sdk_s3::primitives::ByteStream as SdkBody;
use aws_sdk_s3::types::{RestoreRequest, StorageClass};
use tidemark_cloud::aws::s3::S3Storage;
use tidemark_core::RemoteStorage;
use tidemark_testkit::{Moto, TidemarkProcess, eventually, ok, run_shell, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

/// A client of the gateway (the development key, on loopback).
async fn gateway_client(gw: &str, bucket: &str) -> S3Storage {
    let settings =
        [("endpoint", format!("http://{gw}")), ("access_key", "tidemark".into()), ("secret_key", "tidemark".into())];
    let conf = tidemark_core::remote::RemoteConf {
        name: "gw".into(),
        kind: tidemark_core::remote::StorageKind::S3,
        settings: settings.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
    };
    S3Storage::connect(&conf, bucket).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_keep_the_objects_headers_and_archived_objects_say_so() {
    let moto = Moto::get();
    let bucket = unique_name("hdr");
    let s3 = S3Storage::connect(&moto.conf("s3"), &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[]);
    ok(sh(&moto.configure_command("s3")));
    ok(sh(&format!("remote.mount -dir=/buckets/hdr -remote=s3/{bucket}")));
    ok(sh("remote.events.enable -dir=/buckets/hdr"));
    eventually("the subscription tailing", || ok(sh("remote.events.list")).contains("tailing"));

    let expires = "Wed, 21 Oct 2037 07:28:00 GMT";
    let gz = b"\x1f\x8b\x08\x00 not really gzip, but labelled so".to_vec();
    s3.client()
        .put_object()
        .bucket(&bucket)
        .key("page.html.gz")
        .body(SdkBody::from(gz.clone()))
        .content_type("text/html; charset=utf-8")
        .content_encoding("gzip")
        .content_disposition("attachment; filename=\"page.html\"")
        .content_language("de")
        .cache_control("max-age=60")
        .expires(aws_sdk_s3::primitives::DateTime::from_secs(2139722880))
        .metadata("owner", "ops")
        .send()
        .await
        .unwrap();
    s3.client()
        .put_object()
        .bucket(&bucket)
        .key("cold.bin")
        .body(SdkBody::from(b"frozen bytes".to_vec()))
        .storage_class(StorageClass::Glacier)
        .send()
        .await
        .unwrap();
    eventually("both applied", || {
        let ls = ok(sh("fs.ls -l /buckets/hdr"));
        ls.contains("page.html.gz") && ls.contains("cold.bin")
    });

    // Through the gateway: every header and the metadata, on HEAD and GET.
    let gw = gateway_client(&server.s3_addr, "hdr").await;
    let head = gw.client().head_object().bucket("hdr").key("page.html.gz").send().await.unwrap();
    assert_eq!(head.content_type(), Some("text/html; charset=utf-8"));
    assert_eq!(head.content_encoding(), Some("gzip"));
    assert_eq!(head.content_disposition(), Some("attachment; filename=\"page.html\""));
    assert_eq!(head.content_language(), Some("de"));
    assert_eq!(head.cache_control(), Some("max-age=60"));
    assert_eq!(head.expires_string(), Some(expires));
    assert_eq!(head.metadata().and_then(|m| m.get("owner")).map(String::as_str), Some("ops"));
    let got = gw.client().get_object().bucket("hdr").key("page.html.gz").send().await.unwrap();
    assert_eq!(got.content_type(), Some("text/html; charset=utf-8"));
    assert_eq!(got.content_encoding(), Some("gzip"));
    assert_eq!(got.body.collect().await.unwrap().into_bytes().as_ref(), &gz[..], "the bytes as stored, not decoded");

    // Through the HTTP API.
    let resp =
        reqwest::get(format!("http://{}/api/v1/content?path=/buckets/hdr/page.html.gz", server.addr)).await.unwrap();
    assert_eq!(resp.status(), 200);
    let h = resp.headers();
    assert_eq!(h["content-type"], "text/html; charset=utf-8");
    assert_eq!(h["content-encoding"], "gzip");
    assert_eq!(h["cache-control"], "max-age=60");
    assert_eq!(h["content-language"], "de");
    assert_eq!(h["expires"], expires);

    // The archived object: said in the listing, a clear error on read, 403 InvalidObjectState.
    let ls = ok(sh("fs.ls -l /buckets/hdr"));
    let line = ls.lines().find(|l| l.contains("cold.bin")).unwrap();
    assert!(line.contains("archived: GLACIER"), "{ls}");
    let cat = sh("fs.cat /buckets/hdr/cold.bin");
    let err = String::from_utf8_lossy(&cat.stderr);
    assert!(!cat.status.success());
    assert!(err.contains("archived in storage class GLACIER") && err.contains("restore-object"), "{err}");
    assert!(!err.contains("credentials"), "not mistaken for a refusal: {err}");
    let refused = gw.client().get_object().bucket("hdr").key("cold.bin").send().await.unwrap_err();
    let raw = refused.raw_response().map(|r| r.status().as_u16());
    assert_eq!(raw, Some(403), "{refused:?}");
    assert_eq!(aws_sdk_s3::error::ProvideErrorMetadata::code(&refused), Some("InvalidObjectState"));
    let cached = ok(sh("remote.cache -dir=/buckets/hdr"));
    assert!(cached.contains("1 archived") && cached.contains("0 failed"), "{cached}");

    // Restored: moto finishes at once and sends ObjectRestore:Completed, which the provisioned
    // configuration asks for; the entry's restore state follows and the bytes read.
    s3.client()
        .restore_object()
        .bucket(&bucket)
        .key("cold.bin")
        .restore_request(RestoreRequest::builder().days(1).build())
        .send()
        .await
        .unwrap();
    // moto moves the restore on when the object is next looked at (and then sends the event).
    let _ = s3.stat("cold.bin").await.unwrap();
    eventually("the restored object reads", || {
        String::from_utf8_lossy(&sh("fs.cat /buckets/hdr/cold.bin").stdout) == "frozen bytes"
    });
    let ls = ok(sh("fs.ls -l /buckets/hdr"));
    assert!(!ls.contains("archived"), "{ls}");

    // The other way: a file PUT through the gateway with headers and metadata reaches the
    // bucket with them (the outbound sync).
    ok(sh("remote.sync.enable -dir=/buckets/hdr"));
    gw.client()
        .put_object()
        .bucket("hdr")
        .key("report.csv")
        .body(SdkBody::from(b"a,b\n1,2\n".to_vec()))
        .content_type("text/csv")
        .content_disposition("inline")
        .cache_control("no-cache")
        .metadata("source", "gateway")
        .send()
        .await
        .unwrap();
    let mut uploaded = None;
    for _ in 0..200 {
        uploaded = s3.client().head_object().bucket(&bucket).key("report.csv").send().await.ok();
        if uploaded.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let uploaded = uploaded.expect("report.csv uploaded to the bucket");
    assert_eq!(uploaded.content_type(), Some("text/csv"));
    assert_eq!(uploaded.content_disposition(), Some("inline"));
    assert_eq!(uploaded.cache_control(), Some("no-cache"));
    let meta = uploaded.metadata().cloned().unwrap_or_default();
    assert_eq!(meta.get("source").map(String::as_str), Some("gateway"), "{meta:?}");
    assert!(meta.contains_key("tidemark-entry"), "still bound to its entry: {meta:?}");
    // And the gateway still answers with them once the upload is recorded.
    eventually("recorded", || ok(sh("fs.meta.cat /buckets/hdr/report.csv")).contains("last_local_sync_ms"));
    let head = gw.client().head_object().bucket("hdr").key("report.csv").send().await.unwrap();
    assert_eq!(head.content_type(), Some("text/csv"));
    assert_eq!(head.metadata().and_then(|m| m.get("source")).map(String::as_str), Some("gateway"));
}

/// The filer's count of HEADs that asked a bucket for an object's headers.
async fn header_heads(filer: &str) -> u64 {
    let metrics = reqwest::get(format!("http://{filer}/metrics")).await.unwrap().text().await.unwrap();
    let line = metrics.lines().find(|l| l.starts_with("tidemark_cache_header_heads_total ")).expect("the counter");
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Objects a bucket held before it was mounted came from its listing, which carries no headers:
/// their entries learn them from the bucket once — at the first gateway HEAD or GET, the first
/// read through the HTTP API, or the first read of any kind — and every answer, the first
/// included, carries the object's own Content-Type and Content-Encoding, never
/// `binary/octet-stream`. Counted; nothing is asked at mount time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_mounted_from_a_listing_are_served_with_their_own_headers() {
    let moto = Moto::get();
    let bucket = unique_name("lst");
    let s3 = S3Storage::connect(&moto.conf("s3"), &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();
    for key in ["via-head.txt.gz", "via-api.txt.gz", "via-cat.txt.gz"] {
        s3.client()
            .put_object()
            .bucket(&bucket)
            .key(key)
            .body(SdkBody::from(b"\x1f\x8bnot really gzip".to_vec()))
            .content_type("text/plain")
            .content_encoding("gzip")
            .send()
            .await
            .unwrap();
    }
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[]);
    ok(sh(&moto.configure_command("s3")));
    ok(sh(&format!("remote.mount -dir=/buckets/lst -remote=s3/{bucket}")));
    assert_eq!(header_heads(&server.addr).await, 0, "no HEAD per key at mount time");
    let meta = ok(sh("fs.meta.cat /buckets/lst/via-head.txt.gz"));
    assert!(!meta.contains("s3.content-type"), "a listing carries no headers: {meta}");

    // Through the gateway: the first HEAD asks the bucket, once; the GET after it does not.
    let gw = gateway_client(&server.s3_addr, "lst").await;
    let head = gw.client().head_object().bucket("lst").key("via-head.txt.gz").send().await.unwrap();
    assert_eq!((head.content_type(), head.content_encoding()), (Some("text/plain"), Some("gzip")));
    assert_eq!(header_heads(&server.addr).await, 1);
    let got = gw.client().get_object().bucket("lst").key("via-head.txt.gz").send().await.unwrap();
    assert_eq!((got.content_type(), got.content_encoding()), (Some("text/plain"), Some("gzip")));
    let ranged = gw.client().get_object().bucket("lst").key("via-head.txt.gz").range("bytes=0-1").send().await;
    assert_eq!(ranged.unwrap().content_type(), Some("text/plain"), "a ranged GET too");
    assert_eq!(header_heads(&server.addr).await, 1, "asked once");

    // Through the HTTP API: the very first read answers with them.
    let resp =
        reqwest::get(format!("http://{}/api/v1/content?path=/buckets/lst/via-api.txt.gz", server.addr)).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/plain");
    assert_eq!(resp.headers()["content-encoding"], "gzip");
    assert_eq!(header_heads(&server.addr).await, 2);

    // Any first read records them (here the shell's, through the filer): the gateway asks no more.
    assert_eq!(
        String::from_utf8_lossy(&sh("fs.cat /buckets/lst/via-cat.txt.gz").stdout),
        "\u{1f}\u{fffd}not really gzip"
    );
    assert_eq!(header_heads(&server.addr).await, 3);
    let meta = ok(sh("fs.meta.cat /buckets/lst/via-cat.txt.gz"));
    assert!(
        meta.contains("\"s3.content-type\": \"text/plain\"") && meta.contains("\"s3.content-encoding\": \"gzip\""),
        "{meta}"
    );
    let head = gw.client().head_object().bucket("lst").key("via-cat.txt.gz").send().await.unwrap();
    assert_eq!(head.content_type(), Some("text/plain"));
    assert_eq!(header_heads(&server.addr).await, 3, "recorded: not asked again");
    let ls = ok(sh("fs.ls -l /buckets/lst"));
    assert_eq!(ls.lines().filter(|l| l.contains(".txt.gz") && l.contains(" 17 ")).count(), 3, "{ls}");
}

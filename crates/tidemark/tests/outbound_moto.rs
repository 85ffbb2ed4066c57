//! The outbound sync, end to end against moto: a file written through the filer is uploaded with
//! origin metadata; its bucket event comes back and is suppressed as an echo (the entry is not
//! rewritten); a user's delete is propagated; after a restart the sync resumes.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use tidemark_cloud::aws::s3::S3Storage;
use tidemark_cloud::aws::sqs::{SqsSource, client};
use tidemark_core::events::{EventSource, Provider};
use tidemark_core::remote::{Mount, RemoteLocation};
use tidemark_core::{Filer, RemoteStorage, SystemClock};
use tidemark_engine::apply::{ApplyContext, Counters, EventTypes, apply_batch};
use tidemark_filer::HttpFiler;
use tidemark_testkit::{Moto, TidemarkProcess, run_shell, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

fn ok(o: Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && !err.contains("panicked"), "failed: {err}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

async fn wait_for<F: std::future::Future<Output = bool>>(what: &str, mut f: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_echoes_deletes_and_resumes() {
    let moto = Moto::get();
    let conf = moto.conf("s3");
    let bucket = unique_name("ob");
    let s3 = S3Storage::connect(&conf, &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();
    let sqs = client(&conf).await.unwrap();
    // A queue the bucket's notifications reach (set up with Tidemark's own provisioning).
    let mut managed = tidemark_core::subscription::ManagedResources::default();
    let url = tidemark_cloud::aws::provision::S3Notifications::connect(&conf, &bucket)
        .await
        .unwrap()
        .provision_sqs_direct(
            &unique_name("q"),
            "",
            &Default::default(),
            0,
            &|u: &str| u.len().to_string(),
            &mut managed,
        )
        .await
        .unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut server = TidemarkProcess::server(bin(), &data, &[]);
    let sh = |addr: &str, cmd: &str| ok(run_shell(bin(), addr, cmd, &[]));
    sh(
        &server.addr,
        &format!(
            "remote.configure -name=s3 -type=s3 -s3.endpoint={} -s3.access_key=testing -s3.secret_key=testing",
            moto.endpoint
        ),
    );
    sh(&server.addr, &format!("remote.mount -dir=/mnt/data -remote=s3/{bucket}"));
    assert!(sh(&server.addr, "remote.sync.enable -dir=/mnt/data").contains("enabled"));
    assert!(sh(&server.addr, "remote.mount").contains("\tsync"));
    let local = tmp.path().join("report.txt");
    std::fs::write(&local, "written through the filer").unwrap();
    sh(&server.addr, &format!("fs.put {} /mnt/data/docs/report.txt", local.display()));

    wait_for("the upload", || async { s3.stat("docs/report.txt").await.unwrap().is_some() }).await;
    let obj = s3.stat("docs/report.txt").await.unwrap().unwrap();
    let cluster: serde_json::Value =
        serde_json::from_str(&sh(&server.addr, "fs.cat /etc/tidemark/cluster.json")).unwrap();
    let meta = obj.user_metadata.clone().unwrap();
    assert_eq!(meta["tidemark-origin"], cluster["id"].as_str().unwrap());
    assert!(meta["tidemark-version"].parse::<u64>().is_ok());
    let filer = HttpFiler::new(&server.addr, None).unwrap();
    wait_for("the recorded etag", || async {
        filer.stat("/mnt/data/docs/report.txt").await.unwrap().unwrap().remote.is_some_and(|r| r.etag == obj.etag)
    })
    .await;
    let synced = filer.stat("/mnt/data/docs/report.txt").await.unwrap().unwrap();
    assert_eq!(sh(&server.addr, "fs.cat /mnt/data/docs/report.txt"), "written through the filer");

    // The bucket's event for the upload comes back: an echo, suppressed; the entry is untouched.
    let source = SqsSource::new(sqs.clone(), url.clone());
    let mount = Mount {
        dir: "/mnt/data".into(),
        location: RemoteLocation { storage: "s3".into(), bucket: bucket.clone(), path: String::new() },
        sync: true,
    };
    let (types, clock) = (EventTypes::default(), SystemClock);
    let cluster_id = cluster["id"].as_str().unwrap().to_string();
    let ctx = ApplyContext {
        mount: &mount,
        provider: Provider::S3,
        event_types: &types,
        cluster_id: Some(&cluster_id),
        fence: None,
        concurrency: 2,
        retry_delay: Duration::ZERO,
        visibility: Duration::from_secs(30),
        clock: &clock,
        prefetch: None,
        recent: None,
        max_receives: None,
    };
    let mut counters = Counters::default();
    let deadline = Instant::now() + Duration::from_secs(20);
    while counters.echo_suppressed == 0 {
        assert!(Instant::now() < deadline, "no echo seen: {counters:?}");
        let batch = source.receive(10, Duration::from_secs(1)).await.unwrap();
        apply_batch(&filer, &s3, &source, &ctx, batch, &mut counters).await.unwrap();
    }
    assert_eq!(counters.changes, 0, "{counters:?}");
    assert_eq!(
        filer.stat("/mnt/data/docs/report.txt").await.unwrap().unwrap().version,
        synced.version,
        "not rewritten"
    );

    // A user's delete reaches the bucket.
    sh(&server.addr, "fs.rm /mnt/data/docs/report.txt");
    wait_for("the delete", || async { s3.stat("docs/report.txt").await.unwrap().is_none() }).await;

    // Restart: the sync resumes from its cursor (a system document, so any filer could).
    let cursor = |addr: &str| -> u64 {
        let doc: serde_json::Value =
            serde_json::from_str(&sh(addr, "fs.cat /etc/tidemark/outbound/cursor.json")).unwrap();
        doc["seq"].as_u64().unwrap()
    };
    let cursor_before = cursor(&server.addr);
    assert!(cursor_before > 0);
    let status = std::process::Command::new("kill").args(["-TERM", &server.pid().to_string()]).status().unwrap();
    assert!(status.success());
    server.wait_exit(Duration::from_secs(10)).expect("the server stops on SIGTERM");
    let server = TidemarkProcess::server(bin(), &data, &[]);
    std::fs::write(&local, "after the restart").unwrap();
    sh(&server.addr, &format!("fs.put {} /mnt/data/later.txt", local.display()));
    wait_for("the upload after the restart", || async { s3.stat("later.txt").await.unwrap().is_some() }).await;
    // The cursor is written just after the batch's uploads.
    wait_for("the cursor to move", || async { cursor(&server.addr) > cursor_before }).await;
}

/// A file larger than an upload's part goes to the bucket as a multipart upload, streamed from
/// the filer (never whole in memory, nor bound by S3's 5 GiB single PUT): the object is the
/// file's bytes, its etag a multipart one, and its metadata says whose upload it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_file_is_uploaded_in_parts() {
    let moto = Moto::get();
    let bucket = unique_name("obig");
    let s3 = S3Storage::connect(&moto.conf("s3"), &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let sh = |cmd: &str| ok(run_shell(bin(), &server.addr, cmd, &[]));
    sh(&moto.configure_command("s3"));
    sh(&format!("remote.mount -dir=/mnt/data -remote=s3/{bucket}"));
    sh("remote.sync.enable -dir=/mnt/data");
    let body: Vec<u8> = (0..20_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let local = tmp.path().join("big.bin");
    std::fs::write(&local, &body).unwrap();
    sh(&format!("fs.put {} /mnt/data/big.bin", local.display()));

    wait_for("the upload", || async { s3.stat("big.bin").await.unwrap().is_some() }).await;
    let obj = s3.stat("big.bin").await.unwrap().unwrap();
    assert_eq!(obj.size, body.len() as u64);
    assert!(obj.etag.ends_with("-3"), "three parts of 8 MiB at most: {}", obj.etag);
    assert!(obj.user_metadata.unwrap_or_default().contains_key("tidemark-origin"), "whose upload it is");
    let got: Vec<bytes::Bytes> = futures::StreamExt::collect::<Vec<_>>(s3.get("big.bin", None, None).await.unwrap())
        .await
        .into_iter()
        .map(|c| c.unwrap())
        .collect();
    assert!(got.concat() == body, "the file's bytes");
    // The entry records the object uploaded.
    let filer = HttpFiler::new(&server.addr, None).unwrap();
    wait_for("the entry to record the upload", || async {
        let e = filer.stat("/mnt/data/big.bin").await.unwrap().unwrap();
        e.remote.is_some_and(|r| r.etag == obj.etag)
    })
    .await;
}

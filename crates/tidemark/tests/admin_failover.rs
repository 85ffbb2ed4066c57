//! Several admins on one cluster: one is active (it holds the lease `admin/active` in the store),
//! the others stand by — their pages read-only, naming the active one, their worker API refused
//! — and take over when it is SIGKILLed or paused. Workers given the list of admins follow the
//! active one; events put in the bucket keep reaching the namespace across each takeover.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tidemark_cloud::aws::s3::S3Storage;
use tidemark_core::{Filer, RemoteStorage};
use tidemark_filer::HttpFiler;
use tidemark_testkit::{LogsOnFailure, Moto, TidemarkProcess, ok, run_shell, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

const TTL: u64 = 3;

fn admin(dir: &Path, filer: &str, addr: &str) -> TidemarkProcess {
    let ttl = TTL.to_string();
    TidemarkProcess::start(
        bin(),
        dir,
        &["admin", "--filer", filer, "--addr", addr, "--lease-ttl", &ttl, "--worker-timeout", "3"],
    )
}

async fn health(addr: &str) -> Option<serde_json::Value> {
    let resp = reqwest::Client::new()
        .get(format!("http://{addr}/api/v1/health"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    resp.json().await.ok()
}

async fn role(addr: &str) -> String {
    health(addr).await.map(|h| h["role"].as_str().unwrap_or_default().to_string()).unwrap_or_default()
}

async fn eventually<F: std::future::Future<Output = bool>>(what: &str, within: Duration, mut check: impl FnMut() -> F) {
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out after {within:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Puts `key` in the bucket and returns how long it took to show in the namespace.
async fn put_until_visible(s3: &S3Storage, filer: &HttpFiler, key: &str, within: Duration) -> Duration {
    let t0 = Instant::now();
    s3.put(key, Bytes::copy_from_slice(key.as_bytes()), Default::default()).await.unwrap();
    let path = format!("/mnt/data/{key}");
    eventually(&format!("{key} in the namespace"), within, || async {
        filer.stat(&path).await.ok().flatten().is_some()
    })
    .await;
    t0.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_admin_takes_over_when_the_active_one_is_killed_or_paused() {
    let moto = Moto::get();
    let bucket = unique_name("adminfo");
    let s3 = S3Storage::connect(&moto.conf("s3"), &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let _logs = LogsOnFailure(tmp.path().to_path_buf());
    let filer_p = TidemarkProcess::start(
        bin(),
        &tmp.path().join("filer"),
        &["filer", "--data-dir", tmp.path().join("filer").to_str().unwrap(), "--addr", "127.0.0.1:0"],
    );
    let sh = |cmd: &str| ok(run_shell(bin(), &filer_p.addr, cmd, &[]));
    sh(&format!(
        "remote.configure -name=s3 -type=s3 -s3.endpoint={} -s3.access_key=testing -s3.secret_key=testing",
        moto.endpoint
    ));
    sh(&format!("remote.mount -dir=/mnt/data -remote=s3/{bucket}"));
    sh("remote.events.enable -dir=/mnt/data");
    let filer = HttpFiler::new(&filer_p.addr, None).unwrap();

    // Two admins on fixed ports (a restarted one comes back where workers look for it).
    let ports: Vec<String> = (0..2).map(|_| format!("127.0.0.1:{}", tidemark_testkit::process::free_port())).collect();
    let mut a = admin(&tmp.path().join("admin-a"), &filer_p.addr, &ports[0]);
    eventually("admin A active", Duration::from_secs(10), || async { role(&ports[0]).await == "active" }).await;
    let b = admin(&tmp.path().join("admin-b"), &filer_p.addr, &ports[1]);
    eventually("admin B standing by", Duration::from_secs(10), || async { role(&ports[1]).await == "standby" }).await;
    let page = reqwest::get(format!("http://{}/subscriptions", ports[1])).await.unwrap().text().await.unwrap();
    assert!(page.contains("id=\"standby\"") && page.contains(&format!("http://{}", ports[0])), "{page}");
    // A standby refuses changes and the worker API, naming the active admin.
    let refused = reqwest::Client::new()
        .put(format!("http://{}/api/v1/job-types", ports[1]))
        .json(&serde_json::json!({"job_type": "remote_events", "enabled": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    assert!(refused.text().await.unwrap().contains(&ports[0]));

    let admins = ports.join(",");
    let workers: Vec<TidemarkProcess> = (0..2)
        .map(|i| {
            TidemarkProcess::start_quiet(
                bin(),
                &tmp.path().join(format!("worker-{i}.log")),
                &["worker", "--admin", &admins, "--filer", &filer_p.addr, "--id", &format!("w{i}"), "--lease-ttl", "4"],
                |log| log.contains("registered with the admin"),
            )
        })
        .collect();
    let first = put_until_visible(&s3, &filer, "before.txt", Duration::from_secs(30)).await;
    eprintln!("put → visible with admin A active: {first:?}");

    // The active admin is SIGKILLed: B takes over within the lease's ttl; puts are visible again
    // within the ttl + 10 s.
    a.kill();
    let t0 = Instant::now();
    eventually("admin B to take over", Duration::from_secs(TTL + 5), || async { role(&ports[1]).await == "active" })
        .await;
    let took_over = t0.elapsed();
    let after_kill = put_until_visible(&s3, &filer, "after-kill.txt", Duration::from_secs(TTL + 10)).await;
    eprintln!("admin B active {took_over:?} after A's SIGKILL; put → visible {after_kill:?}");

    // A comes back and stands by; B is paused (SIGSTOP) past its lease: A takes over, and B,
    // resumed, finds its lease taken and stands by — one active admin, never two.
    let a = admin(&tmp.path().join("admin-a2"), &filer_p.addr, &ports[0]);
    eventually("admin A back, standing by", Duration::from_secs(10), || async { role(&ports[0]).await == "standby" })
        .await;
    b.signal("STOP");
    eventually("admin A to take over from the paused B", Duration::from_secs(TTL + 5), || async {
        role(&ports[0]).await == "active"
    })
    .await;
    let after_pause = put_until_visible(&s3, &filer, "after-pause.txt", Duration::from_secs(TTL + 10)).await;
    b.signal("CONT");
    eventually("the resumed B to stand by", Duration::from_secs(TTL + 5), || async {
        role(&ports[1]).await == "standby"
    })
    .await;
    assert_eq!(role(&ports[0]).await, "active");
    let last = put_until_visible(&s3, &filer, "after-resume.txt", Duration::from_secs(30)).await;
    eprintln!("put → visible after the pause: {after_pause:?}; after B resumed: {last:?}");
    // Every change was applied exactly once across the takeovers.
    let docs: serde_json::Value = serde_json::from_str(&sh("remote.events.list -json")).unwrap();
    let failed = docs[0]["status"]["counters"]["failed"].as_u64().unwrap_or(0);
    assert_eq!(failed, 0, "{docs}");
    drop((workers, a, b));
}

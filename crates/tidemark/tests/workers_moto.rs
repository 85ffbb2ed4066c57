//! The scaled-out deployment as separate processes — a filer, an admin and two workers — against
//! moto's S3 and SQS: events are tailed across slice boundaries with nothing lost or applied
//! twice, while the lease holder is paused past its lease (SIGSTOP) and later killed (SIGKILL).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tidemark_cloud::aws::s3::S3Storage;
use tidemark_core::{Filer, RemoteStorage};
use tidemark_filer::HttpFiler;
use tidemark_testkit::{Moto, TidemarkProcess, run_shell, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

async fn eventually<F: std::future::Future<Output = bool>>(what: &str, within: Duration, mut check: impl FnMut() -> F) {
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out after {within:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn get(admin: &str, path: &str) -> String {
    let resp = reqwest::get(format!("http://{admin}{path}")).await.unwrap();
    assert!(resp.status().is_success(), "GET {path}: {}", resp.status());
    resp.text().await.unwrap()
}

async fn subscriptions(admin: &str) -> serde_json::Value {
    serde_json::from_str(&get(admin, "/api/v1/subscriptions").await).unwrap()
}

/// The live lease of the only subscription: (holder, generation).
async fn live_lease(admin: &str) -> Option<(String, u64)> {
    let s = subscriptions(admin).await;
    let lease = &s["subscriptions"][0]["lease"];
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    (lease["expires_at_ms"].as_i64()? > now)
        .then(|| (lease["holder"].as_str().unwrap_or_default().to_string(), lease["generation"].as_u64().unwrap_or(0)))
}

async fn wait_live_lease(admin: &str) -> (String, u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(l) = live_lease(admin).await {
            return l;
        }
        assert!(Instant::now() < deadline, "no worker held the subscription's lease within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn worker(admin: &str, filer: &str, id: &str, log: &Path) -> TidemarkProcess {
    TidemarkProcess::start_quiet(
        bin(),
        log,
        &["worker", "--admin", admin, "--filer", filer, "--id", id, "--lease-ttl", "4", "--max-execute", "2"],
        |log| log.contains("registered with the admin"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_tail_across_slices_through_a_pause_and_a_kill() {
    let moto = Moto::get();
    let conf = moto.conf("s3");
    let bucket = unique_name("workers");
    let s3 = S3Storage::connect(&conf, &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let filer_p = TidemarkProcess::start(
        bin(),
        &tmp.path().join("data"),
        &["filer", "--data-dir", tmp.path().join("data").to_str().unwrap(), "--addr", "127.0.0.1:0"],
    );
    let admin_p = TidemarkProcess::start(
        bin(),
        &tmp.path().join("admin"),
        &["admin", "--filer", &filer_p.addr, "--addr", "127.0.0.1:0", "--worker-timeout", "3"],
    );
    let (f, a) = (filer_p.addr.clone(), admin_p.addr.clone());
    let sh = |cmd: &str| run_shell(bin(), &f, cmd, &[]);
    ok(sh(&moto.configure_command("s3")));
    ok(sh(&format!("remote.mount -dir=/mnt/data -remote=s3/{bucket}")));
    ok(sh("remote.events.enable -dir=/mnt/data -slice=6s -visibility=5s"));

    let mut wa = worker(&a, &f, "wa", &tmp.path().join("wa.log"));
    let mut wb = worker(&a, &f, "wb", &tmp.path().join("wb.log"));
    let filer = HttpFiler::new(&f, None).unwrap();
    let mut expected: BTreeMap<String, usize> = BTreeMap::new();
    let mut n = 0usize;
    let mut put_some = async |count: usize, every: Duration, expected: &mut BTreeMap<String, usize>| {
        for _ in 0..count {
            let key = format!("k{n:04}.txt");
            let body = "x".repeat(n % 17 + 1);
            s3.put(&key, Bytes::from(body.clone()), Default::default()).await.unwrap();
            expected.insert(format!("/mnt/data/{key}"), body.len());
            n += 1;
            tokio::time::sleep(every).await;
        }
    };
    let all_there = async |expected: &BTreeMap<String, usize>| {
        for (p, size) in expected {
            match filer.stat(p).await.unwrap() {
                Some(e) if e.size == *size as u64 => {}
                _ => return false,
            }
        }
        true
    };

    // 1. Both workers up; puts spread over several 6-second slices.
    eventually("a first slice", Duration::from_secs(30), async || live_lease(&a).await.is_some()).await;
    put_some(30, Duration::from_millis(400), &mut expected).await;
    eventually("every put of phase 1", Duration::from_secs(40), async || all_there(&expected).await).await;

    // 2. Pause the lease holder past its lease: the other takes over with a higher generation.
    //    The holder is asked of the filer itself, mid-slice: the admin's view is up to a
    //    detection pass old, and may name a worker whose slice has just ended (paused idle, it
    //    would have no slice to lose).
    let fp = subscriptions(&a).await["subscriptions"][0]["fingerprint"].as_str().unwrap().to_string();
    let (holder, generation) = loop {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
        match filer.lease_get(&format!("remote_events/{fp}")).await.unwrap() {
            // With most of its ttl (4 s, renewed every 1.3 s) ahead: held by a running slice.
            Some(l) if l.expires_at_ms > now + 2_500 => break (l.holder, l.generation),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let (paused, other) = if holder == "wa" { (&wa, "wb") } else { (&wb, "wa") };
    paused.signal("STOP");
    put_some(10, Duration::from_millis(200), &mut expected).await;
    eventually("the other worker takes the lease", Duration::from_secs(40), async || {
        live_lease(&a).await.is_some_and(|(h, g)| h == other && g > generation)
    })
    .await;
    eventually("every put while one worker was paused", Duration::from_secs(40), async || all_there(&expected).await)
        .await;
    // Woken, the paused worker finds its lease gone: its slice ends as lease lost, writing nothing.
    paused.signal("CONT");
    let paused_log = if holder == "wa" { tmp.path().join("wa.log") } else { tmp.path().join("wb.log") };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&paused_log).unwrap_or_default().contains("lease_lost") {
        assert!(
            std::time::Instant::now() < deadline,
            "the woken worker's slice did not end on the fence within 30 s; its log:\n{}",
            std::fs::read_to_string(&paused_log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // 3. Kill the holder mid-slice while puts arrive; restart it. Nothing is lost.
    put_some(5, Duration::from_millis(200), &mut expected).await;
    let (holder, _) = wait_live_lease(&a).await;
    let killed_log = tmp.path().join(format!("{holder}-restarted.log"));
    if holder == "wa" {
        wa.kill();
    } else {
        wb.kill();
    }
    put_some(10, Duration::from_millis(200), &mut expected).await;
    let restarted = worker(&a, &f, &holder, &killed_log);
    eventually("every put across the kill", Duration::from_secs(60), async || all_there(&expected).await).await;

    // 4. The admin restarts (same address): the workers register again, their running slices
    //    are adopted rather than proposed twice, and events keep flowing.
    let admin_port = a.rsplit(':').next().unwrap().to_string();
    drop(admin_p);
    let admin_p = TidemarkProcess::start(
        bin(),
        &tmp.path().join("admin2"),
        &["admin", "--filer", &f, "--addr", &format!("127.0.0.1:{admin_port}"), "--worker-timeout", "3"],
    );
    assert_eq!(admin_p.addr, a);
    put_some(5, Duration::from_millis(200), &mut expected).await;
    eventually("every put across the admin's restart", Duration::from_secs(60), async || all_there(&expected).await)
        .await;
    eventually("both workers registered again", Duration::from_secs(30), async || {
        let w: serde_json::Value = serde_json::from_str(&get(&a, "/api/v1/workers").await).unwrap();
        w["workers"].as_array().is_some_and(|w| w.len() == 2)
    })
    .await;

    // 5. SIGTERM the holder: it ends its slice cleanly — status written, lease released — and
    //    exits 0; the other worker takes over without waiting for the lease to expire.
    let (holder, generation) = wait_live_lease(&a).await;
    let (stopping, other) = if holder == "wa" { (&mut wa, "wb") } else { (&mut wb, "wa") };
    // (After a restart the holder may be the restarted process; find it by id.)
    let mut restarted = restarted;
    let stopping = if stopping.pid() == 0 { &mut restarted } else { stopping };
    stopping.signal("TERM");
    let exit = stopping.wait_exit(Duration::from_secs(30)).expect("the worker exits on SIGTERM");
    assert!(exit.success(), "{exit:?}");
    // Released, not left to expire (it would still be live: renewed every 1.3 s for 4 s). Asked
    // of the filer itself: the admin's view is up to a detection pass old.
    let fp = subscriptions(&a).await["subscriptions"][0]["fingerprint"].as_str().unwrap().to_string();
    let lease = filer.lease_get(&format!("remote_events/{fp}")).await.unwrap().unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    assert!(
        lease.holder != holder || lease.expires_at_ms <= now,
        "the stopped worker still holds the lease: {lease:?}"
    );
    // Its status blob says the slice ended (unless the next slice already wrote its own).
    let (status, _) = tidemark_engine::docs::read_json::<tidemark_engine::slice::StatusBlob>(
        &filer,
        &tidemark_engine::slice::status_path(&fp),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(
        status.lease_generation > generation || (status.lease_holder == holder && status.slice_ended_at_ms.is_some()),
        "the stopped worker's slice did not write its end: {status:?}"
    );
    eventually("the other worker takes over at once", Duration::from_secs(15), async || {
        live_lease(&a).await.is_some_and(|(h, g)| h == other && g > generation)
    })
    .await;
    put_some(5, Duration::from_millis(200), &mut expected).await;
    eventually("every put after the drain", Duration::from_secs(40), async || all_there(&expected).await).await;

    // Nothing applied twice: each key was put once, so the namespace changed it exactly once.
    let mut per_path: BTreeMap<String, usize> = BTreeMap::new();
    let mut after = 0;
    loop {
        let recs = filer.changes(after, 1000, Duration::ZERO).await.unwrap();
        let Some(last) = recs.last() else { break };
        after = last.seq;
        for r in recs.iter().filter(|r| expected.contains_key(&r.path) && tidemark_testkit::brings_bytes(r)) {
            *per_path.entry(r.path.clone()).or_default() += 1;
        }
    }
    let twice: Vec<_> = per_path.iter().filter(|(_, c)| **c != 1).collect();
    assert!(twice.is_empty(), "applied more than once: {twice:?}");
    assert_eq!(per_path.len(), expected.len());

    // The counters add up (a killed worker's last unpublished increments are lost with it, so
    // `applied` is not compared with the number of puts).
    let s = subscriptions(&a).await;
    let c = &s["subscriptions"][0]["status"]["counters"];
    assert!(c["applied"].as_u64().unwrap() > 0, "{c}");
    assert!(c["applied"].as_u64() <= c["received"].as_u64(), "{c}");
    // Every HEAD the slices asked of the bucket is counted with the subscription.
    assert!(c["requests"]["HEAD"].as_u64().is_some_and(|n| n > 0), "{c}");
    // And every request of the queue: receives, and acknowledgements of what was applied.
    for op in ["RECEIVE", "ACK"] {
        assert!(c["requests"][op].as_u64().is_some_and(|n| n > 0), "{op}: {c}");
    }
    // The Admin UI shows the requests per hour and their price at S3's list prices (once the
    // restarted admin has seen them for 10 s).
    eventually("the requests per hour on the Admin UI", Duration::from_secs(30), async || {
        let page = get(&a, "/subscriptions").await;
        page.contains("data-field=\"cost-per-hour\">$") && page.contains("at s3 list prices")
    })
    .await;
    let page = get(&a, "/subscriptions").await;
    let cell = page.split("data-field=\"requests-per-hour\">").nth(1).unwrap().split('<').next().unwrap();
    eprintln!("requests per hour: {cell}");
    let metrics = get(&a, "/metrics").await;
    for m in [
        "tidemark_remote_requests_total{",
        "tidemark_events_applied_total{",
        "tidemark_slice_duration_seconds_bucket{",
        "tidemark_event_apply_lag_seconds_bucket{",
    ] {
        assert!(metrics.contains(m), "{m} missing from /metrics:\n{metrics}");
    }
    // What each worker's slices did, for whoever reads a failure (or wants to see the story).
    for log in ["wa.log", "wb.log", &format!("{holder}-restarted.log")] {
        let text = std::fs::read_to_string(tmp.path().join(log)).unwrap_or_default();
        for line in text.lines().filter(|l| l.contains("slice ended") || l.contains("slice failed")) {
            eprintln!("{log}: {line}");
        }
    }
    drop((restarted, admin_p));
}

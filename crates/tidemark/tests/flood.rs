//! A flood on loopback: tens of thousands of connections that never finish a request, held
//! against `tidemark server`'s listeners by helper processes (`flood/hold.py`, each reopening
//! what the server closes), while a legitimate client asks the filer and the admin for their
//! health and the S3 gateway for an object over fresh connections. Bounded in time (about 30 s).
//! Prints the latencies and the server's memory; fails only if a request waits for a deadline.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use tidemark_testkit::TidemarkProcess;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

/// The resident memory of process `pid`, in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

struct Flood {
    child: Child,
    last: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Flood {
    fn start(target: &str, idle: usize, trickle: usize, source: &str, seconds: u64) -> Flood {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/flood/hold.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg(target)
            .args(["--idle", &idle.to_string(), "--trickle", &trickle.to_string(), "--source", source])
            .args(["--seconds", &seconds.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 for the flood helper");
        let last = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let out = child.stdout.take().unwrap();
        let l = last.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                *l.lock().unwrap() = line;
            }
        });
        Flood { child, last }
    }

    fn counts(&self) -> serde_json::Value {
        serde_json::from_str(&self.last.lock().unwrap()).unwrap_or(serde_json::Value::Null)
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_and_trickling_connections_does_not_hold_up_a_request() {
    flood(None).await;
}

/// The same with a server allowed only 4,096 descriptors: its budget (3,687 connections) is far
/// below the flood, so new connections are admitted by shedding the oldest idle ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_flood_beyond_the_descriptor_limit_idle_connections_give_way() {
    let report = flood(Some(4096)).await;
    assert!(report.contains("gave way"), "{report}");
}

/// Floods a `tidemark server` (run with at most `fd_limit` descriptors, if given) and returns
/// the report it printed.
async fn flood(fd_limit: Option<u32>) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let server = match fd_limit {
        None => TidemarkProcess::server(bin(), &data, &[]),
        Some(n) => {
            let limit = format!("ulimit -n {n} && exec \"$0\" \"$@\"");
            let d = data.to_str().unwrap();
            let args = [
                "-c",
                &limit,
                bin().to_str().unwrap(),
                "server",
                "--data-dir",
                d,
                "--filer-addr",
                "127.0.0.1:0",
                "--admin-addr",
                "127.0.0.1:0",
                "--s3-addr",
                "127.0.0.1:0",
            ];
            TidemarkProcess::start_with(Path::new("/bin/sh"), &data, &args, 3)
        }
    };
    let s3 = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .endpoint_url(format!("http://{}", server.s3_addr))
            .credentials_provider(Credentials::new("tidemark", "tidemark", None, None, "test"))
            .force_path_style(true)
            .build(),
    );
    s3.create_bucket().bucket("flood").send().await.unwrap();
    s3.put_object()
        .bucket("flood")
        .key("k")
        .body(aws_sdk_s3::primitives::ByteStream::from_static(b"still served"))
        .send()
        .await
        .unwrap();
    let rss_before = rss_mib(server.pid());

    // 20,000 idle connections on the filer (two helpers: a process holds at most so many
    // descriptors), 1,100 trickling ones on the gateway and 1,000 idle ones on the admin: more
    // than the server's descriptors allow, so its oldest idle connections keep giving way.
    let seconds = 30;
    let floods = [
        Flood::start(&server.addr, 10_000, 0, "127.0.0.2", seconds),
        Flood::start(&server.addr, 10_000, 0, "127.0.0.3", seconds),
        Flood::start(&server.s3_addr, 0, 1_100, "127.0.0.4", seconds),
        Flood::start(&server.admin_addr, 1_000, 0, "127.0.0.5", seconds),
    ];
    let began = Instant::now();
    while began.elapsed() < Duration::from_secs(12) {
        let open: u64 = floods.iter().filter_map(|f| f.counts()["open"].as_u64()).sum();
        if open >= 21_000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let rss_flooded = rss_mib(server.pid());

    // Each request on a connection of its own, as a new client's would be.
    let fresh = reqwest::Client::builder().pool_max_idle_per_host(0).timeout(Duration::from_secs(20)).build().unwrap();
    let (mut health, mut admin, mut get) = (Vec::new(), Vec::new(), Vec::new());
    let mut most_fds = 0;
    // Past the first-byte deadline (10 s): the server closes what the helpers open again.
    let measuring = Instant::now();
    while measuring.elapsed() < Duration::from_secs(12) {
        most_fds = most_fds.max(std::fs::read_dir(format!("/proc/{}/fd", server.pid())).map_or(0, |d| d.count()));
        let t = Instant::now();
        let r = fresh.get(format!("http://{}/api/v1/health", server.addr)).send().await.unwrap();
        assert!(r.status().is_success());
        health.push(t.elapsed());
        let t = Instant::now();
        let r = fresh.get(format!("http://{}/api/v1/health", server.admin_addr)).send().await.unwrap();
        assert!(r.status().is_success());
        admin.push(t.elapsed());
        // A client of its own: a connection of its own, signed.
        let c = s3.clone().config().clone().to_builder().build();
        let c = aws_sdk_s3::Client::from_conf(c);
        let t = Instant::now();
        let body = c.get_object().bucket("flood").key("k").send().await.unwrap().body.collect().await.unwrap();
        get.push(t.elapsed());
        assert_eq!(body.into_bytes().as_ref(), b"still served");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let rss_after = rss_mib(server.pid());
    let counts: Vec<serde_json::Value> = floods.iter().map(Flood::counts).collect();
    drop(floods);
    let mut report = String::new();
    for (what, v) in [("filer health", &mut health), ("admin health", &mut admin), ("signed GET", &mut get)] {
        v.sort();
        report.push_str(&format!(
            "{what}: p50 {:?} p99 {:?} max {:?}\n",
            percentile(v, 0.5),
            percentile(v, 0.99),
            v.last().unwrap()
        ));
    }
    report.push_str(&format!(
        "server memory: {rss_before:.0} MiB before, {rss_flooded:.0} MiB flooded, {rss_after:.0} MiB at the end; \
         at most {most_fds} descriptors open\nflood helpers: {counts:?}\n"
    ));
    println!("{report}");
    // A request that waited for a deadline (the 10 s first-byte or 30 s head deadline) would
    // mean the flood held it up.
    for v in [&health, &admin, &get] {
        assert!(*v.last().unwrap() < Duration::from_secs(5), "{report}");
    }
    assert!(counts.iter().all(|c| c["opened"].as_u64().unwrap_or(0) > 0), "the helpers ran: {report}");
    let log = server.stderr();
    if let Some(line) = log.lines().rev().find(|l| l.contains("gave way")) {
        report.push_str(&format!("server: {line}\n"));
    }
    report
}

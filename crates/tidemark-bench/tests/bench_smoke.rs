//! The benchmarks run and print their figures (tiny sizes: this checks that `scripts/bench.sh`
//! keeps working, not how fast anything is). Against the run's moto and a `tidemark server`.

use std::path::Path;
use std::process::Command;

use tidemark_testkit::{Moto, TidemarkProcess, run_shell, unique_name};

fn bench_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark-bench"))
}

/// The product binary, built beside this one by a workspace build (`cargo nextest run --workspace`).
fn bin() -> std::path::PathBuf {
    let p = bench_bin().with_file_name("tidemark");
    assert!(p.exists(), "{} is not built: build the workspace (cargo build -p tidemark) first", p.display());
    p
}

fn bench(args: &[&str]) -> String {
    let out = Command::new(bench_bin()).args(args).output().expect("running tidemark-bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "tidemark-bench {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn in_process_benchmarks_print_their_figures() {
    let apply = bench(&["apply", "--events", "50", "--concurrency", "4"]);
    assert!(apply.contains("events/s applied (50 applied"), "{apply}");
    let burst = bench(&["apply", "--events", "50", "--keys", "5"]);
    assert!(burst.contains("for 5 distinct keys"), "{burst}");
    let writes = bench(&["writes", "--writes", "64", "--tasks", "4"]);
    assert!(writes.contains("64 single conditional writes from 4 tasks") && writes.contains("writes/s"), "{writes}");
    let refused = Command::new(bench_bin()).args(["apply", "--filers", "2"]).output().unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("needs --store postgres"), "{refused:?}");
    let pg = tidemark_testkit::Postgres::get();
    let url = pg.fresh_database("bench_filers");
    let two = bench(&["apply", "--events", "40", "--filers", "2", "--store", &url]);
    assert!(two.contains("2 filers on the store") && two.contains("(40 applied"), "{two}");
    let url = pg.fresh_database("bench_writes");
    let writes = bench(&["writes", "--writes", "32", "--tasks", "4", "--store", &url]);
    assert!(writes.contains("(postgres)"), "{writes}");
    let reconcile = bench(&["reconcile", "--objects", "300", "--page-size", "100"]);
    assert!(reconcile.contains("created 300"), "{reconcile}");
    assert!(reconcile.contains("in sync 300"), "{reconcile}");
}

#[test]
fn the_moto_benchmarks_print_each_figure_beside_its_limit() {
    let moto = Moto::get();
    let s3 = bench(&["s3", "--endpoint", &moto.endpoint, "--events", "5", "--concurrency", "1,2", "--objects", "20"]);
    for expected in [
        "plain client",
        "Tidemark ev/s | ratio",
        "(5 applied, 5 changed, 0 failed)",
        "baseline import",
        "× the raw LIST",
        "calls per applied event",
        "LISTs/hour",
    ] {
        assert!(s3.contains(expected), "no {expected:?} in:\n{s3}");
    }
    let cache = bench(&[
        "cache",
        "--endpoint",
        &moto.endpoint,
        "--size",
        "1M",
        "--small",
        "3",
        "--rounds",
        "1",
        "--chunk",
        "256K",
        // The proxy a bucket slower than the disk is measured through (BENCHMARKS.md).
        "--throttle",
        "50",
    ]);
    for expected in [
        "through a proxy serving at most 50 MiB/s",
        "cold read:",
        "plain client GET",
        "warm read:",
        "local file",
        "over the HTTP API",
        "small-file warm read",
        "0 during the warm rounds",
    ] {
        assert!(cache.contains(expected), "no {expected:?} in:\n{cache}");
    }
    let gateway = bench(&[
        "gateway",
        "--endpoint",
        &moto.endpoint,
        "--size",
        "1M",
        "--requests",
        "5",
        "--puts",
        "2",
        "--throttle",
        "200",
    ]);
    for expected in [
        "through a proxy serving at most 200 MiB/s",
        "(cold, the gateway's cache empty): gateway",
        "GET 4 KiB, one at a time: gateway p50",
        "16 at a time",
        "(cached): gateway",
        "PUT 1 MiB x 2",
    ] {
        assert!(gateway.contains(expected), "no {expected:?} in:\n{gateway}");
    }
    let mount = bench(&["mount", "--size", "4M", "--files", "200", "--small", "10"]);
    for expected in
        ["sequential read, 4.0 MiB: through the filer", "ls -lR of 202 entries", "first read of a 4 KiB file"]
    {
        assert!(mount.contains(expected), "no {expected:?} in:\n{mount}");
    }
    let remote = bench(&[
        "mount",
        "--endpoint",
        &moto.endpoint,
        "--size",
        "4M",
        "--files",
        "20",
        "--peer",
        "rclone",
        "--throttle",
        "200",
    ]);
    for expected in ["plain SDK GET", "Tidemark mount: first read", "rclone mount", "Tidemark ÷ rclone"] {
        assert!(remote.contains(expected), "no {expected:?} in:\n{remote}");
    }
    let bad = Command::new(bench_bin()).args(["s3", "--endpoint", &moto.endpoint, "--events", "0"]).output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("at least 1"));

    // Latency through a running server, one put at a time and at a rate, with the S3 → SQS limit.
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(&bin(), &tmp.path().join("data"), &[]);
    let bucket = unique_name("bench");
    let created = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT", &format!("{}/{bucket}", moto.endpoint)])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&created.stdout), "200");
    let setup = run_shell(
        &bin(),
        &server.addr,
        &format!(
            "remote.configure -name=s3 -type=s3 -s3.endpoint={} -s3.access_key=testing -s3.secret_key=testing; \
             remote.mount -dir=/mnt/s3 -remote=s3/{bucket}; remote.events.enable -dir=/mnt/s3",
            moto.endpoint
        ),
        &[],
    );
    assert!(setup.status.success(), "{}", String::from_utf8_lossy(&setup.stderr));
    let one = bench(&["latency", "--filer", &server.addr, "--dir", "/mnt/s3", "--puts", "5"]);
    for expected in ["warm-up put visible", "put → visible: p50", "(5 of 5 within 60 s)", "ratio to the limit"] {
        assert!(one.contains(expected), "no {expected:?} in:\n{one}");
    }
    let rate = bench(&["latency", "--filer", &server.addr, "--dir", "/mnt/s3", "--puts", "10", "--rate", "20"]);
    assert!(rate.contains("(10 of 10 within 60 s)"), "{rate}");
    assert!(rate.contains("puts a second offered"), "{rate}");
}

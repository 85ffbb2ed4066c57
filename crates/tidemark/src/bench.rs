//! `tidemark bench ...`: benchmarks that print their figures (see docs/BENCHMARKS.md).

use std::time::Instant;

use bytes::Bytes;
use clap::{Args, Subcommand};
use tidemark_cloud::memory::MemoryStorage;
use tidemark_core::Filer;
use tidemark_core::model::{NewEntry, Origin, Txn};
use tidemark_core::remote::{Mount, RemoteLocation};
use tidemark_engine::reconcile::{ReconcileOptions, reconcile};
use tidemark_filer::{DataDir, LocalFiler};

#[derive(Subcommand)]
pub enum Bench {
    /// A full reconcile of N objects from the in-process memory bucket into a fresh SQLite
    /// namespace, then a second, no-change reconcile: time, rate and peak memory of each.
    Reconcile(ReconcileBench),
    /// The engine's own cost per event: N notifications through the real applier against the
    /// in-process memory bucket and queue (no network), into a fresh SQLite namespace; with a
    /// per-stage breakdown, and the HEADs a burst over fewer keys costs (coalescing).
    Apply(ApplyBench),
}

#[derive(Args)]
pub struct ApplyBench {
    /// Notifications to apply.
    #[arg(long, default_value_t = 10_000)]
    events: usize,
    /// Distinct keys they name (fewer than --events: a burst that coalesces).
    #[arg(long)]
    keys: Option<usize>,
    /// Distinct keys applied at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Where to put the namespace (default: a temporary directory, removed afterwards).
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
}

#[derive(Args)]
pub struct ReconcileBench {
    /// Number of objects in the bucket.
    #[arg(long, default_value_t = 100_000)]
    objects: usize,
    /// Objects per LIST page and entries per scan page.
    #[arg(long, default_value_t = 1000)]
    page_size: usize,
    /// Where to put the namespace (default: a temporary directory, removed afterwards).
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
}

/// Peak resident memory of this process (VmHWM) in KiB, and a way to reset it (Linux).
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn current_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn mib(kib: Option<u64>) -> String {
    kib.map_or("n/a".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
}

pub async fn run(bench: Bench) -> i32 {
    let result = match bench {
        Bench::Reconcile(b) => reconcile_bench(b).await,
        Bench::Apply(b) => crate::bench_apply::run(b.events, b.keys, b.concurrency, b.data_dir).await,
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

async fn reconcile_bench(b: ReconcileBench) -> Result<(), String> {
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let dir = b.data_dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let filer = LocalFiler::open(DataDir::open(&dir).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    let bucket = MemoryStorage::default();
    let setup = Instant::now();
    for i in 0..b.objects {
        // Two levels of directories, 100 files each at the bottom: a realistic shape.
        let key = format!("data/{:03}/{:03}/obj-{i:08}.bin", i / 10_000, (i / 100) % 100);
        bucket.insert(&key, Bytes::from_static(b"x"), Default::default()).map_err(|e| e.to_string())?;
    }
    let mount = Mount {
        dir: "/mnt/bench".into(),
        location: RemoteLocation { storage: "mem".into(), bucket: "b".into(), path: "data".into() },
        sync: false,
    };
    filer.apply(Txn::put(&mount.dir, NewEntry::dir(0), Origin::System)).await.map_err(|e| e.to_string())?;
    println!(
        "bench reconcile: {} objects in the memory bucket (set up in {:.1} s), page size {}",
        b.objects,
        setup.elapsed().as_secs_f64(),
        b.page_size
    );
    println!("  rss after set-up: {}", mib(current_rss_kib()));
    let opts = ReconcileOptions { page_size: b.page_size, ..Default::default() };
    for pass in ["baseline import", "no-change reconcile"] {
        reset_peak_rss();
        let before = current_rss_kib();
        let t = Instant::now();
        let report = reconcile(&filer, &bucket, &mount, &opts, &mut |_| {}).await.map_err(|e| e.to_string())?;
        let secs = t.elapsed().as_secs_f64();
        let peak = peak_rss_kib();
        println!(
            "  {pass}: {:.2} s, {:.0} objects/s, {:.0} store writes/s; rss before {} peak {} (peak - before: {})",
            secs,
            b.objects as f64 / secs,
            report.changes() as f64 / secs,
            mib(before),
            mib(peak),
            mib(peak.zip(before).map(|(p, b)| p.saturating_sub(b)))
        );
        println!("    {}", report.summary());
    }
    Ok(())
}

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
    /// Object put in the bucket → entry visible in the namespace, through a running filer and its
    /// workers (`scripts/bench.sh` sets one up against moto and a local bucket): p50 / p99 over N
    /// puts, and what a `remote.meta.sync` on a schedule would give for comparison.
    Latency(LatencyBench),
}

#[derive(Args)]
pub struct LatencyBench {
    /// The filer of a running `tidemark server` (or filer + admin + workers).
    #[arg(long, env = "TIDEMARK_FILER", default_value = "127.0.0.1:8888")]
    filer: String,
    /// A mounted directory with events enabled; objects are put into its bucket directly.
    #[arg(long)]
    dir: String,
    /// How many objects to put, one after another (each waits until visible).
    #[arg(long, default_value_t = 1000)]
    puts: usize,
    #[arg(long, env = "TIDEMARK_TOKEN", hide_env_values = true)]
    token: Option<String>,
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
    /// The store to measure: the embedded SQLite (default) or `postgres://...` (an empty database:
    /// the bench writes into it).
    #[arg(long, value_name = "URL")]
    store: Option<String>,
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
        Bench::Apply(b) => crate::bench_apply::run(b.events, b.keys, b.concurrency, b.data_dir, b.store).await,
        Bench::Latency(b) => latency_bench(b).await,
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

fn percentile(sorted: &[std::time::Duration], p: f64) -> std::time::Duration {
    if sorted.is_empty() {
        return std::time::Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn latency_bench(b: LatencyBench) -> Result<(), String> {
    use std::time::Duration;
    use tidemark_core::remote::{MountMapping, RemoteConf, system_paths};
    use tidemark_engine::docs::read_json;
    let filer = tidemark_filer::HttpFiler::new(&b.filer, b.token.clone()).map_err(|e| e.to_string())?;
    let dir = tidemark_core::path::normalize_user_path(&b.dir).map_err(|e| e.to_string())?;
    let (mapping, _) = read_json::<MountMapping>(&filer, system_paths::MOUNT_MAPPING)
        .await
        .map_err(|e| e.to_string())?
        .unwrap_or_default();
    let mount = mapping.find_dir(&dir).cloned().ok_or_else(|| format!("{dir} is not a mount"))?;
    let (conf, _) = read_json::<RemoteConf>(&filer, &system_paths::remote_conf(&mount.location.storage))
        .await
        .map_err(|e| e.to_string())?
        .ok_or("the mount's remote is not configured")?;
    let storage = tidemark_cloud::open_storage(&conf, &mount.location.bucket).await.map_err(|e| e.to_string())?;
    let run = format!(
        "{:x}",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis()
    );
    let prefix = mount.location.key_prefix();
    println!(
        "bench latency: {} puts into {} ({}), each waited for in {dir}",
        b.puts,
        conf.kind.as_str(),
        storage.describe()
    );
    let mut lat = Vec::with_capacity(b.puts);
    let mut late = 0;
    for i in 0..b.puts {
        let key = format!("{prefix}bench-latency/{run}/{i:05}.txt");
        let path = format!("{dir}/bench-latency/{run}/{i:05}.txt");
        let t = Instant::now();
        storage.put(&key, Bytes::from(format!("{i}")), Default::default()).await.map_err(|e| e.to_string())?;
        loop {
            if filer.stat(&path).await.map_err(|e| e.to_string())?.is_some() {
                lat.push(t.elapsed());
                break;
            }
            if t.elapsed() > Duration::from_secs(60) {
                late += 1;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if (i + 1) % 100 == 0 {
            eprintln!("  {} / {} puts", i + 1, b.puts);
        }
    }
    lat.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "  put → visible: p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms ({} of {} within 60 s)",
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.9)),
        ms(percentile(&lat, 0.99)),
        ms(lat.last().copied().unwrap_or_default()),
        lat.len(),
        b.puts
    );
    if late > 0 {
        println!("  {late} puts were not visible within 60 s");
    }
    // The cron alternative: a full reconcile every T leaves a change unseen for up to T plus the
    // reconcile's own duration; a uniformly timed change waits T/2 on average.
    let t = Instant::now();
    let report = reconcile(&filer, &*storage, &mount, &ReconcileOptions::default(), &mut |_| {})
        .await
        .map_err(|e| e.to_string())?;
    let d = t.elapsed();
    println!("  one remote.meta.sync of this bucket: {:.2} s ({})", d.as_secs_f64(), report.summary());
    for period in [60u64, 300, 3600] {
        let p = Duration::from_secs(period);
        println!(
            "  remote.meta.sync every {:>4} s: staleness p50 {:.1} s, p99 {:.1} s",
            period,
            (p / 2 + d).as_secs_f64(),
            (p.mul_f64(0.99) + d).as_secs_f64()
        );
    }
    Ok(())
}

//! `tidemark-bench ...`: benchmarks that print their figures (see docs/BENCHMARKS.md).

use std::sync::Arc;
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
    /// End to end against an S3-compatible endpoint that serves SQS too (moto in
    /// `scripts/bench.sh`): apply throughput at several concurrencies, the API calls per applied
    /// event, and a reconcile against the raw LIST — each beside what a plain SDK client achieves
    /// against the same server in the same run. Creates `tidemark-bench-*` buckets and queues.
    S3(crate::bench_s3::S3Bench),
    /// The content cache against an S3-compatible endpoint (moto in `scripts/bench.sh`): cold read
    /// of a large object beside a plain SDK GET, warm read beside a local file (in process and over
    /// the HTTP API), and small-file warm read latency beside the SDK's GET. Creates a
    /// `tidemark-bench-cache-*` bucket.
    Cache(crate::bench_cache::CacheBench),
    /// The S3 gateway (in process, as `tidemark server` runs it) beside an S3-compatible endpoint
    /// (moto in `scripts/bench.sh`), one SDK client against both: cached 4 KiB GETs (p50/p99,
    /// requests/s at concurrency 1 and 16), a large cached GET beside a local file, 1 MiB PUTs.
    /// Creates a `tidemark-bench-gw-*` bucket.
    Gateway(crate::bench_gateway::GatewayBench),
    /// The FUSE mount (in this process, over a fresh filer's HTTP API on loopback) beside the
    /// local disk: a large file's sequential read, `ls -lR` of a tree of small files, and the
    /// first read of a small file. Needs /dev/fuse and fusermount3.
    Mount(crate::bench_mount::MountBench),
    /// File content on a blob store (`--blob-store`) against an S3-compatible endpoint (moto in
    /// `scripts/bench.sh`): a large file's write and cold read through the filer, each beside a
    /// plain SDK PutObject/GetObject of the same bytes to the same endpoint. Creates a
    /// `tidemark-bench-blobs-*` bucket.
    Blobs(crate::bench_blobs::BlobsBench),
    /// Single conditional writes from many tasks at once, each its own transaction (as users'
    /// writes and several slices on one filer are): writes/s on the embedded SQLite or on
    /// PostgreSQL, where the store commits what waits for it together (group commit).
    Writes(WritesBench),
}

#[derive(Args)]
pub struct WritesBench {
    /// Writes in all.
    #[arg(long, default_value_t = 5_000)]
    writes: usize,
    /// Tasks writing at once.
    #[arg(long, default_value_t = 16)]
    tasks: usize,
    /// The store: the embedded SQLite (default) or `postgres://...` (an empty database).
    #[arg(long, value_name = "URL")]
    store: Option<String>,
}

#[derive(Args)]
pub struct LatencyBench {
    /// The filer of a running `tidemark server` (or filer + admin + workers).
    #[arg(long, env = "TIDEMARK_FILER", default_value = "127.0.0.1:8888")]
    filer: String,
    /// A mounted directory with events enabled; objects are put into its bucket directly.
    #[arg(long)]
    dir: String,
    /// How many objects to put.
    #[arg(long, default_value_t = 1000)]
    puts: usize,
    /// Put this many objects a second, whether or not the earlier ones are visible yet (a
    /// sustained load). Default: one after another, each waited for. Either way an entry counts
    /// as visible when it appears in the filer's change log (followed by a long poll).
    #[arg(long, value_name = "PUTS_PER_SECOND")]
    rate: Option<f64>,
    /// Skip measuring the limit (for an S3 remote: put → notification received by a plain SQS
    /// client on a scratch bucket and queue of the same endpoint).
    #[arg(long)]
    no_limit: bool,
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
    /// HEADs in flight at once (a batch's writes are one transaction whatever this is).
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Filers writing into the store at once, each with its own connections and its own share
    /// of the keys (needs --store postgres://...: several filers share only PostgreSQL).
    #[arg(long, default_value_t = 1)]
    filers: usize,
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
    /// Each LIST page answered after this many milliseconds (a real bucket: 50–200 ms).
    #[arg(long, default_value_t = 0)]
    list_latency_ms: u64,
    /// Key ranges listed at once (`-listRanges`). With --list-latency-ms, the no-change
    /// reconcile is also run with one range, in the same run, for the ratio.
    #[arg(long, default_value_t = tidemark_engine::listing::DEFAULT_RANGES)]
    ranges: usize,
    /// The keyspace's shape: `dirs` (two levels of directories, 100 files each at the bottom),
    /// `flat` (numbered keys, no `/`) or `hex` (random hexadecimal names).
    #[arg(long, value_enum, default_value_t = KeyShape::Dirs)]
    keys: KeyShape,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum KeyShape {
    Dirs,
    Flat,
    Hex,
}

impl KeyShape {
    /// The `i`th key, under the mount's `data/`.
    fn key(self, i: usize) -> String {
        match self {
            KeyShape::Dirs => format!("data/{:03}/{:03}/obj-{i:08}.bin", i / 10_000, (i / 100) % 100),
            KeyShape::Flat => format!("data/obj-{i:08}.bin"),
            // A fixed odd multiplier: distinct names in no order, the same in every run.
            KeyShape::Hex => format!("data/{:016x}", (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        }
    }
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
        Bench::Apply(b) => {
            crate::bench_apply::run(b.events, b.keys, b.concurrency, b.filers, b.data_dir, b.store).await
        }
        Bench::Latency(b) => latency_bench(b).await,
        Bench::S3(b) => crate::bench_s3::run(b).await,
        Bench::Cache(b) => crate::bench_cache::run(b).await,
        Bench::Gateway(b) => crate::bench_gateway::run(b).await,
        Bench::Mount(b) => crate::bench_mount::run(b).await,
        Bench::Writes(b) => writes_bench(b).await,
        Bench::Blobs(b) => crate::bench_blobs::run(b).await,
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
    // Each LIST page answered after the latency, as a real bucket's round trip.
    let bucket =
        tidemark_testkit::SlowLists::new(MemoryStorage::default(), std::time::Duration::from_millis(b.list_latency_ms));
    let setup = Instant::now();
    for i in 0..b.objects {
        let key = b.keys.key(i);
        bucket.inner.insert(&key, Bytes::from_static(b"x"), Default::default()).map_err(|e| e.to_string())?;
    }
    let mount = Mount {
        dir: "/mnt/bench".into(),
        location: RemoteLocation { storage: "mem".into(), bucket: "b".into(), path: "data".into() },
        sync: false,
    };
    filer.apply(Txn::put(&mount.dir, NewEntry::dir(0), Origin::System)).await.map_err(|e| e.to_string())?;
    println!(
        "bench reconcile: {} objects ({:?} keys) in the memory bucket (set up in {:.1} s), page size {}, LIST pages after {} ms, {} key ranges at once",
        b.objects,
        b.keys,
        setup.elapsed().as_secs_f64(),
        b.page_size,
        b.list_latency_ms,
        b.ranges
    );
    println!("  rss after set-up: {}", mib(current_rss_kib()));
    let mut passes = vec![("baseline import", b.ranges), ("no-change reconcile", b.ranges)];
    if b.list_latency_ms > 0 && b.ranges > 1 {
        passes.push(("no-change reconcile, one range", 1));
    }
    for (pass, ranges) in passes {
        let opts = ReconcileOptions { page_size: b.page_size, ranges, ..Default::default() };
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

async fn writes_bench(b: WritesBench) -> Result<(), String> {
    use tidemark_core::MetaStore;
    use tidemark_core::model::{Content, Precondition};
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let store: Arc<dyn MetaStore> = match b.store.as_deref() {
        Some(url) if url.starts_with("postgres") => {
            Arc::new(tidemark_store::PgStore::connect(url).await.map_err(|e| e.to_string())?)
        }
        Some(other) => return Err(format!("--store {other:?}: give postgres://... or leave it out for SQLite")),
        None => Arc::new(
            tidemark_store::SqliteStore::open(tmp.path().join("meta.db"), Arc::new(tidemark_core::SystemClock))
                .map_err(|e| e.to_string())?,
        ),
    };
    let tasks = b.tasks.clamp(1, 1024);
    let per = b.writes.div_ceil(tasks);
    let began = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for t in 0..tasks {
        let store = store.clone();
        set.spawn(async move {
            let mut lat = Vec::with_capacity(per);
            for i in 0..per {
                let txn = Txn::put(
                    format!("/bench-writes/t{t:03}/{i:06}"),
                    NewEntry::file(0, 1, Content::Empty),
                    Origin::Local,
                )
                .with_precondition(Precondition::Absent);
                let at = Instant::now();
                store.apply(txn).await.map_err(|e| e.to_string())?;
                lat.push(at.elapsed());
            }
            Ok::<_, String>(lat)
        });
    }
    let mut lat = Vec::with_capacity(tasks * per);
    while let Some(r) = set.join_next().await {
        lat.extend(r.map_err(|e| e.to_string())??);
    }
    let wall = began.elapsed().as_secs_f64();
    lat.sort();
    println!(
        "bench writes: {} single conditional writes from {tasks} tasks at once ({}): {wall:.2} s, {:.0} writes/s; each p50 {:.2} ms, p99 {:.2} ms",
        lat.len(),
        store.backend(),
        lat.len() as f64 / wall,
        percentile(&lat, 0.5).as_secs_f64() * 1000.0,
        percentile(&lat, 0.99).as_secs_f64() * 1000.0
    );
    Ok(())
}

fn percentile<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
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
    let storage =
        tidemark_cloud::open_storage(&conf, &mount.location.bucket, &tidemark_cloud::local::LocalRoots::any())
            .await
            .map_err(|e| e.to_string())?;
    let run = format!(
        "{:x}",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis()
    );
    let prefix = mount.location.key_prefix();
    let objects: Vec<(String, String)> = (0..b.puts)
        .map(|i| (format!("{prefix}bench-latency/{run}/{i:05}.txt"), format!("{dir}/bench-latency/{run}/{i:05}.txt")))
        .collect();
    println!(
        "bench latency: {} puts into {} ({}), {}, each waited for in {dir}",
        b.puts,
        conf.kind.as_str(),
        storage.describe(),
        match b.rate {
            Some(r) => format!("{r} a second"),
            None => "one after another".into(),
        }
    );
    let filer = Arc::new(filer);
    // A first object, not counted, waited for until it is visible: the subscription's first slice
    // may still be starting (the admin assigns it on its next scan, after a baseline reconcile).
    let warm = Instant::now();
    let warmup =
        [(format!("{prefix}bench-latency/{run}/warm-up.txt"), format!("{dir}/bench-latency/{run}/warm-up.txt"))];
    match timed_puts(&filer, storage.clone(), &warmup, None).await? {
        (_, 0, _) => {
            println!("  warm-up put visible after {:.0} ms (not counted)", warm.elapsed().as_secs_f64() * 1000.0)
        }
        _ => return Err(format!("the warm-up object was not visible in {dir} within 60 s: are events enabled on it?")),
    }
    let (lat, late, committed) = timed_puts(&filer, storage.clone(), &objects, b.rate).await?;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut sorted: Vec<Duration> = lat.iter().map(|(_, d)| *d).collect();
    sorted.sort();
    println!(
        "  put → visible: p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms ({} of {} within 60 s)",
        ms(percentile(&sorted, 0.5)),
        ms(percentile(&sorted, 0.9)),
        ms(percentile(&sorted, 0.99)),
        ms(sorted.last().copied().unwrap_or_default()),
        sorted.len(),
        b.puts
    );
    if !committed.is_empty() {
        // The filer's commit time is its wall clock, as is the put's start: the same machine here.
        let mut c = committed;
        c.sort_unstable();
        println!(
            "    of which put → committed by the filer (the change record's time): p50 {} ms, p99 {} ms; the rest is the change log reaching its follower",
            percentile(&c, 0.5),
            percentile(&c, 0.99)
        );
    }
    if late > 0 {
        println!("  {late} puts were not visible within 60 s");
    }
    // The slowest puts with their time of day, to find them in the server's log.
    let mut slowest = lat.clone();
    slowest.sort_by_key(|(_, d)| std::cmp::Reverse(*d));
    let p50 = percentile(&sorted, 0.5);
    for (at, d) in slowest.iter().take(3).filter(|(_, d)| *d > p50 * 5) {
        println!("  outlier: {:.0} ms, put at {}", ms(*d), tidemark_core::format_rfc3339_ms(*at));
    }
    if !b.no_limit && conf.kind == tidemark_core::remote::StorageKind::S3 {
        let limit = crate::bench_s3::put_to_receive(&conf, &run, b.puts.min(1000), b.rate).await?;
        let mut limit_sorted = limit.clone();
        limit_sorted.sort();
        let (l50, l99) = (percentile(&limit_sorted, 0.5), percentile(&limit_sorted, 0.99));
        println!(
            "  limit, put → notification received by a plain SQS client (long polling, {} puts): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
            limit.len(),
            ms(l50),
            ms(l99),
            ms(limit_sorted.last().copied().unwrap_or_default())
        );
        println!(
            "  ratio to the limit: p50 {:.2}, p99 {:.2}",
            ms(percentile(&sorted, 0.5)) / ms(l50).max(0.001),
            ms(percentile(&sorted, 0.99)) / ms(l99).max(0.001)
        );
    }
    // The cron alternative: a full reconcile every T leaves a change unseen for up to T plus the
    // reconcile's own duration; a uniformly timed change waits T/2 on average.
    let t = Instant::now();
    let report = reconcile(&*filer, &*storage, &mount, &ReconcileOptions::default(), &mut |_| {})
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

/// Wall-clock milliseconds now (for naming outliers).
fn wall_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Per put: when it started (wall ms) and how long until its entry was seen; how many were never
/// seen; and per seen put, how long until the filer committed its entry (the change record's time).
type Latencies = (Vec<(i64, std::time::Duration)>, usize, Vec<i64>);

/// Puts `objects` and times each from its put to its entry's first appearance in the filer's
/// change log (followed by a long poll, so nothing is polled for): one after another, each waited
/// for (`rate` None), or `rate` puts a second on a timer whatever the state of the earlier ones.
async fn timed_puts(
    filer: &Arc<tidemark_filer::HttpFiler>,
    storage: Arc<dyn tidemark_core::RemoteStorage>,
    objects: &[(String, String)],
    rate: Option<f64>,
) -> Result<Latencies, String> {
    use std::collections::HashMap;
    use std::time::Duration;
    if let Some(r) = rate
        && !(r > 0.0 && r.is_finite())
    {
        return Err(format!("--rate {r}: give a positive number of puts a second"));
    }
    let after = filer.health().await.map_err(|e| e.to_string())?.last_seq;
    let wanted: HashMap<String, usize> = objects.iter().enumerate().map(|(i, (_, p))| (p.clone(), i)).collect();
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Instant, i64)>();
    let follower = {
        let filer = filer.clone();
        tokio::spawn(async move {
            let mut after = after;
            let mut left = wanted;
            while !left.is_empty() {
                let records = filer.changes(after, 1000, Duration::from_secs(1)).await.map_err(|e| e.to_string())?;
                let now = Instant::now();
                for r in records {
                    after = r.seq;
                    if r.new.is_some()
                        && let Some(i) = left.remove(&r.path)
                        && seen_tx.send((i, now, r.ts_ms)).is_err()
                    {
                        return Ok(());
                    }
                }
            }
            Ok::<_, String>(())
        })
    };
    let mut started: Vec<(i64, Instant)> = Vec::with_capacity(objects.len());
    let mut seen: HashMap<usize, (Instant, i64)> = HashMap::new();
    // Collects what the follower saw until `until` holds, or 60 s pass without anything new.
    async fn collect(
        rx: &mut tokio::sync::mpsc::UnboundedReceiver<(usize, Instant, i64)>,
        seen: &mut HashMap<usize, (Instant, i64)>,
        until: impl Fn(&HashMap<usize, (Instant, i64)>) -> bool,
    ) {
        while !until(seen) {
            match tokio::time::timeout(Duration::from_secs(60), rx.recv()).await {
                Ok(Some((i, t, committed))) => {
                    seen.insert(i, (t, committed));
                }
                Ok(None) | Err(_) => return,
            }
        }
    }
    let began = Instant::now();
    match rate {
        None => {
            for (i, (key, _)) in objects.iter().enumerate() {
                started.push((wall_ms(), Instant::now()));
                storage.put(key, Bytes::from(format!("{i}")), Default::default()).await.map_err(|e| e.to_string())?;
                collect(&mut seen_rx, &mut seen, |s| s.contains_key(&i)).await;
                if (i + 1) % 100 == 0 {
                    eprintln!("  {} / {} puts", i + 1, objects.len());
                }
            }
        }
        Some(rate) => {
            let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
            let mut puts = tokio::task::JoinSet::new();
            for (i, (key, _)) in objects.iter().enumerate() {
                ticker.tick().await;
                started.push((wall_ms(), Instant::now()));
                let (storage, key) = (storage.clone(), key.clone());
                puts.spawn(async move { storage.put(&key, Bytes::from(format!("{i}")), Default::default()).await });
                if (i + 1) % 100 == 0 {
                    eprintln!("  {} / {} puts", i + 1, objects.len());
                }
            }
            println!("  {:.1} puts a second offered", objects.len() as f64 / began.elapsed().as_secs_f64());
            while let Some(put) = puts.join_next().await {
                put.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
            }
            collect(&mut seen_rx, &mut seen, |s| s.len() == objects.len()).await;
        }
    }
    follower.abort();
    let lat: Vec<(i64, Duration)> = started
        .iter()
        .enumerate()
        .filter_map(|(i, (at, t))| seen.get(&i).map(|(v, _)| (*at, v.saturating_duration_since(*t))))
        .collect();
    let committed: Vec<i64> =
        started.iter().enumerate().filter_map(|(i, (at, _))| seen.get(&i).map(|(_, c)| c - at)).collect();
    let late = objects.len() - lat.len();
    Ok((lat, late, committed))
}

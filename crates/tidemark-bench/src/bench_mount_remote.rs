//! `tidemark-bench mount --endpoint URL`: a bucket-backed file through the mount, beside a plain
//! SDK GET of the same object and (with `--peer rclone`) rclone's mount of the same bucket, in
//! one run:
//!
//! - first read of a large object through each mount (`cat`-like, 1 MiB reads) ÷ the plain GET;
//! - the same read again (Tidemark: its content cache, then the kernel's pages; rclone: its VFS
//!   cache);
//! - `ls -lR` of a tree of small objects, first and again;
//! - the object once the cache holds it whole, through a read-only mount (the kernel reads the
//!   cache's file: FUSE passthrough) and a new read-write mount (which reads that file itself),
//!   beside a local file of the same bytes: first from the disk, then from the kernel's pages.
//!
//! `--throttle MIB_S` puts a proxy that serves each connection at most that rate in front of the
//! bucket, for every client alike: a real bucket serves one stream at 80–100 MB/s, where an
//! emulator on loopback is faster than any disk.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use tidemark_core::cache::human_bytes;
use tidemark_core::remote::{Mount, RemoteLocation};
use tidemark_core::{Filer, RemoteStorage};
use tidemark_filer::{CacheConfig, HttpFiler};

use crate::bench_cache::{CpuTimes, RANGED_PARTS, best, mib_s, pattern, put_all, read_local, sdk_get, sdk_get_ranged};
use crate::bench_mount::{timed, walk};
use crate::bench_s3::{Endpoint, err, filer_with_bucket};

const DIR: &str = "/mnt/bench";

/// What the remote part of the mount bench measures.
pub struct RemoteArgs {
    pub endpoint: Endpoint,
    pub size: u64,
    pub files: usize,
    pub peer: Option<String>,
    pub throttle: Option<f64>,
}

/// A FUSE mount of `root` on the filer at `addr`, in this process, until the sender is used
/// (`read_only`: the kind that reads the filer's files through FUSE passthrough).
pub(crate) async fn mount_in_process(
    addr: &str,
    root: &str,
    mnt: &Path,
    probe: &str,
    read_only: bool,
) -> Result<(tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<Result<(), String>>), String> {
    std::fs::create_dir_all(mnt).map_err(err)?;
    // As `tidemark mount` reaches a filer on its machine: through the filer's socket.
    let client: Arc<dyn Filer> = Arc::new(HttpFiler::new(addr, None).map_err(err)?.through_socket().await);
    let args = tidemark_fuse::MountArgs {
        mountpoint: mnt.to_path_buf(),
        root: root.into(),
        read_only,
        allow_other: false,
        ttl: Duration::from_secs(60),
        timeout: Duration::from_secs(30),
        passthrough: true,
        unsaved_dir: mnt.with_extension("unsaved"),
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (report_tx, report_rx) = tokio::sync::mpsc::channel(1);
    let mounted = tokio::spawn(async move {
        // Held for as long as the mount runs: the mount stops reporting when it is dropped.
        let _report = report_tx;
        tidemark_fuse::mount(
            client,
            args,
            async {
                let _ = stop_rx.await;
            },
            report_rx,
        )
        .await
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while !mnt.join(probe).exists() {
        if Instant::now() > deadline || mounted.is_finished() {
            return Err(format!(
                "the mount at {} did not come up (is /dev/fuse there, fusermount3 installed?)",
                mnt.display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok((stop_tx, mounted))
}

/// `filer` served as `tidemark server` serves it: on loopback TCP and on its socket in
/// `data_dir`. Returns the TCP address.
pub(crate) async fn serve_filer(
    filer: Arc<dyn Filer>,
    data_dir: &Path,
) -> Result<(String, tokio::task::JoinHandle<std::io::Result<()>>), String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(err)?;
    let addr = listener.local_addr().map_err(err)?.to_string();
    let socket = tidemark_filer::http::Socket::bind(data_dir).map_err(err)?;
    let pending = std::future::pending();
    let served = tidemark_filer::http::serve_beside(listener, Some(socket), filer, Default::default(), None, pending);
    Ok((addr, tokio::spawn(served)))
}

/// rclone's mount of the bucket, as its users run it for reading (`--vfs-cache-mode full`),
/// unmounted when dropped.
struct Rclone {
    child: Child,
    mnt: PathBuf,
}

impl Drop for Rclone {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("fusermount3").arg("-uz").arg(&self.mnt).stderr(Stdio::null()).status();
    }
}

fn rclone_mount(endpoint: &Endpoint, url: &str, bucket: &str, work: &Path, probe: &str) -> Result<Rclone, String> {
    let mnt = work.join("rclone-mnt");
    std::fs::create_dir_all(&mnt).map_err(err)?;
    let log = std::fs::File::create(work.join("rclone.log")).map_err(err)?;
    let child = Command::new("rclone")
        .args(["mount", &format!("bench:{bucket}")])
        .arg(&mnt)
        .args(["--vfs-cache-mode", "full", "--cache-dir"])
        .arg(work.join("rclone-cache"))
        .args(["--config", "/dev/null", "--log-level", "NOTICE"])
        .env("RCLONE_CONFIG_BENCH_TYPE", "s3")
        .env("RCLONE_CONFIG_BENCH_PROVIDER", "Other")
        .env("RCLONE_CONFIG_BENCH_ENDPOINT", url)
        .env("RCLONE_CONFIG_BENCH_ACCESS_KEY_ID", &endpoint.access_key)
        .env("RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY", &endpoint.secret_key)
        .env("RCLONE_CONFIG_BENCH_REGION", &endpoint.region)
        // The AWS SDK in rclone 1.60 fails on a CA bundle with its own transport, and loopback
        // needs none.
        .env_remove("AWS_CA_BUNDLE")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("--peer rclone: cannot run rclone ({e}); scripts/setup.sh installs it"))?;
    let mut rclone = Rclone { child, mnt: mnt.clone() };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !mnt.join(probe).exists() {
        if Instant::now() > deadline || rclone.child.try_wait().ok().flatten().is_some() {
            let log = std::fs::read_to_string(work.join("rclone.log")).unwrap_or_default();
            return Err(format!("rclone's mount did not come up:\n{log}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(rclone)
}

/// Drops the kernel's pages of the file at `p` (written back first): its next read is from
/// the disk. Read once before: a virtual disk serves the first read after a write at a
/// fraction of its later speed (the cache's file, written with `O_DIRECT`, at 0.66 GB/s, then
/// 2.4 GB/s), so both files the figures compare meet the disk in the same state.
fn from_the_disk(p: &Path) -> Result<(), String> {
    let drop = || -> Result<(), String> {
        let f = std::fs::File::open(p).map_err(err)?;
        f.sync_all().map_err(err)?;
        rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).map_err(err)
    };
    drop()?;
    read_local(p, 1 << 20)?;
    drop()
}

/// Reads of the object once the cache holds it whole, beside a local file of the same bytes:
/// each first from the disk, then again from the kernel's pages (the better of two; seconds).
struct Cached {
    ro: (f64, f64),
    rw: (f64, f64),
    local: (f64, f64),
}

impl Cached {
    fn print(&self, size: u64) {
        let line = |name: &str, (first, again): (f64, f64)| {
            println!(
                "  {name}: first (from the disk) {:.0} MiB/s, again {:.0} MiB/s | ÷ the local file {:.2} / {:.2}",
                mib_s(size, first),
                mib_s(size, again),
                self.local.0 / first,
                self.local.1 / again
            )
        };
        println!(
            "  the object cached whole; a local file of its bytes: first (from the disk) {:.0} MiB/s, again {:.0} MiB/s",
            mib_s(size, self.local.0),
            mib_s(size, self.local.1)
        );
        line("read-only mount (the kernel reads the cache's file: FUSE passthrough)", self.ro);
        line("new read-write mount (it reads the cache's file itself)", self.rw);
    }
}

async fn cached_reads(
    filer: &Arc<tidemark_filer::LocalFiler>,
    addr: &str,
    work: &Path,
    size: u64,
) -> Result<Cached, String> {
    filer.cache().idle().await;
    let path = format!("{DIR}/large.bin");
    let file = filer
        .local_file(&path)
        .await
        .map_err(err)?
        .ok_or_else(|| format!("{path}: not cached whole after its first read"))?
        .file;
    let local = work.join("local.bin");
    std::fs::write(&local, pattern(size)).map_err(err)?;
    let mut figures = Vec::new();
    for read_only in [true, false] {
        let mnt = work.join(if read_only { "mnt-cached-ro" } else { "mnt-cached-rw" });
        let (stop, mounted) = mount_in_process(addr, DIR, &mnt, "large.bin", read_only).await?;
        let (file, large) = (PathBuf::from(&file), mnt.join("large.bin"));
        let read = tokio::task::spawn_blocking(move || -> Result<(f64, f64), String> {
            from_the_disk(&file)?;
            let first = read_local(&large, 1 << 20)?;
            Ok((first, best(&[read_local(&large, 1 << 20)?, read_local(&large, 1 << 20)?])))
        })
        .await
        .map_err(err)?;
        let _ = stop.send(());
        mounted.await.map_err(err)??;
        figures.push(read?);
    }
    let local = tokio::task::spawn_blocking(move || -> Result<(f64, f64), String> {
        from_the_disk(&local)?;
        let first = read_local(&local, 1 << 20)?;
        Ok((first, best(&[read_local(&local, 1 << 20)?, read_local(&local, 1 << 20)?])))
    })
    .await
    .map_err(err)??;
    Ok(Cached { ro: figures[0], rw: figures[1], local })
}

/// The figures of one mount: first read, read again, `ls -lR` first and again.
struct Figures {
    first: f64,
    /// Busy core-seconds of the whole machine during the first read, and their share of it.
    first_cpu: (f64, f64),
    again: f64,
    ls_first: f64,
    ls_again: f64,
}

fn print_figures(name: &str, size: u64, sdk: f64, f: &Figures) {
    println!(
        "  {name}: first read {:.0} MiB/s ({:.2} s; the machine's CPU {:.2} core-s, {:.0} % busy), again {:.0} MiB/s ({:.3} s); ls -lR first {:.3} s, again {:.3} s | first read ÷ GET {:.2}",
        mib_s(size, f.first),
        f.first,
        f.first_cpu.0,
        f.first_cpu.1 * 100.0,
        mib_s(size, f.again),
        f.again,
        f.ls_first,
        f.ls_again,
        sdk / f.first
    );
}

fn measure(mnt: &Path, files: usize) -> Result<Figures, String> {
    let large = mnt.join("large.bin");
    let cpu = CpuTimes::now();
    let first = read_local(&large, 1 << 20)?;
    let first_cpu = CpuTimes::since(cpu);
    let again = read_local(&large, 1 << 20)?;
    let tree = mnt.join("tree");
    let (ls_first, n) = timed(|| walk(&tree))?;
    let (ls_again, _) = timed(|| walk(&tree))?;
    let want = files + files.div_ceil(100);
    if n != want {
        return Err(format!("{}: the walk found {n} entries, expected {want}", tree.display()));
    }
    Ok(Figures { first, first_cpu, again, ls_first, ls_again })
}

pub async fn run(r: RemoteArgs) -> Result<(), String> {
    let mut endpoint = r.endpoint;
    let direct = endpoint.endpoint.clone();
    if let Some(rate) = r.throttle {
        let proxy = tidemark_testkit::throttling_proxy(&endpoint.endpoint, rate)?;
        endpoint.endpoint = format!("http://{proxy}");
    }
    let conf = endpoint.conf();
    let (_, bucket, storage) = endpoint.fresh_bucket("tidemark-bench-mount").await?;
    let s3 = storage.client().clone();
    let t = Instant::now();
    storage.put("large.bin", pattern(r.size), Default::default()).await.map_err(err)?;
    let names: Vec<String> = (0..r.files).map(|i| format!("tree/d{:03}/f{:05}", i / 100, i)).collect();
    put_all(&storage, &names, Bytes::from_static(b"small")).await?;
    println!(
        "bench mount, bucket-backed: {direct} ({bucket}{}): a {} object and {} small ones, put in {:.1} s",
        r.throttle.map(|t| format!(", through a proxy serving {t} MiB/s per connection")).unwrap_or_default(),
        human_bytes(r.size),
        r.files,
        t.elapsed().as_secs_f64()
    );

    // A filer with the bucket mounted, its metadata imported, serving its API on loopback.
    let tmp = tempfile::tempdir().map_err(err)?;
    let mount = Mount {
        dir: DIR.into(),
        location: RemoteLocation { storage: conf.name.clone(), bucket: bucket.clone(), path: String::new() },
        sync: false,
    };
    let cache = CacheConfig { budget_bytes: r.size * 2 + (64 << 20), ..Default::default() };
    let filer = filer_with_bucket(&tmp.path().join("data"), &conf, &mount, &storage, cache).await?;
    let (addr, server) = serve_filer(filer.clone(), &tmp.path().join("data")).await?;

    let cpu = CpuTimes::now();
    let (sdk1, n) = sdk_get(&s3, &bucket, "large.bin").await?;
    let sdk_cpu = CpuTimes::since(cpu);
    if n != r.size {
        return Err(format!("GetObject returned {n} bytes of {}", r.size));
    }
    let mnt = tmp.path().join("mnt");
    let (stop, mounted) = mount_in_process(&addr, DIR, &mnt, "large.bin", false).await?;
    let files = r.files;
    let ours = {
        let mnt = mnt.clone();
        tokio::task::spawn_blocking(move || measure(&mnt, files)).await.map_err(err)?
    };
    let _ = stop.send(());
    let unmounted = mounted.await.map_err(err)?;
    let ours = ours?;
    unmounted?;
    let peer = match r.peer.as_deref() {
        None => None,
        Some("rclone") => {
            let (endpoint, url, bucket, work) =
                (endpoint.clone(), endpoint.endpoint.clone(), bucket.clone(), tmp.path().to_path_buf());
            Some(
                tokio::task::spawn_blocking(move || {
                    let rclone = rclone_mount(&endpoint, &url, &bucket, &work, "large.bin")?;
                    measure(&rclone.mnt, files)
                })
                .await
                .map_err(err)??,
            )
        }
        Some(other) => return Err(format!("--peer {other}: the peers measured are: rclone")),
    };
    let cached = cached_reads(&filer, &addr, tmp.path(), r.size).await?;
    let (sdk2, _) = sdk_get(&s3, &bucket, "large.bin").await?;
    let (ranged, parts) = sdk_get_ranged(&s3, &bucket, "large.bin", r.size).await?;
    let sdk = best(&[sdk1, sdk2]);
    let size = r.size;
    println!(
        "  plain SDK GET of the {} object: {:.0} MiB/s (best of {sdk1:.2} / {sdk2:.2} s; the machine's CPU during the first {:.2} core-s, {:.0} % busy)",
        human_bytes(size),
        mib_s(size, sdk),
        sdk_cpu.0,
        sdk_cpu.1 * 100.0
    );
    println!(
        "  plain SDK, {parts} ranged GETs at once (as the AWS CRT and s5cmd read; the faster of {RANGED_PARTS:?} at once): {:.0} MiB/s ({ranged:.2} s), {:.2} × one GET | Tidemark's first read ÷ it {:.2}",
        mib_s(size, ranged),
        sdk / ranged,
        ranged / ours.first
    );
    print_figures("Tidemark mount", size, sdk, &ours);
    if let Some(p) = peer {
        print_figures("rclone mount (--vfs-cache-mode full)", size, sdk, &p);
        println!(
            "  Tidemark ÷ rclone (speed, higher is better): first read {:.2}, again {:.2}, ls -lR first {:.2}, again {:.2}",
            p.first / ours.first,
            p.again / ours.again,
            p.ls_first / ours.ls_first,
            p.ls_again / ours.ls_again
        );
    }
    cached.print(size);
    server.abort();
    println!("  (the bucket {bucket} is left on the endpoint)");
    Ok(())
}

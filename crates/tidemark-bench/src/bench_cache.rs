//! `tidemark-bench cache`: the content cache against an S3-compatible endpoint (moto in
//! `scripts/bench.sh`), each figure beside its limit measured in the same run:
//!
//! - cold read of a large object through the filer ÷ a plain SDK GetObject of the same object;
//! - warm read of it (from the cache) ÷ reading the same bytes from a local file;
//! - the same warm read through the filer's HTTP API (what the shell and gateways use);
//! - small-file warm reads, p50/p99, in process and over HTTP, beside the plain SDK's GET of the
//!   same objects from the endpoint.
//!
//! It creates a bucket named `tidemark-bench-cache-<run>`; meant for an emulator.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use clap::Args;
use futures::StreamExt;

use tidemark_core::cache::{human_bytes, parse_size};
use tidemark_core::remote::{Mount, RemoteLocation};
use tidemark_core::{ByteStream, Filer, RemoteStorage};
use tidemark_filer::{CacheConfig, HttpFiler};

use crate::bench_s3::{Endpoint, err, filer_with_bucket, sdk_err};

#[derive(Args)]
pub struct CacheBench {
    #[command(flatten)]
    endpoint: Endpoint,
    /// The large object's size (K/M/G suffixes).
    #[arg(long, default_value = "128M")]
    size: String,
    /// How many 4 KiB objects the small-file latencies are measured on.
    #[arg(long, default_value_t = 200)]
    small: usize,
    /// Warm reads of each small file (after the one that caches it).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// The cache's chunk size.
    #[arg(long, default_value = "8M")]
    chunk: String,
    /// Serve the endpoint's answers at most this many MiB/s per connection (a local proxy in
    /// front of it), for both Tidemark and the plain client: a bucket slower than the local disk,
    /// as a real one is for one stream, where an emulator on loopback is faster than any disk.
    #[arg(long, value_name = "MIB_S")]
    throttle: Option<f64>,
}

const SMALL_BYTES: usize = 4096;
const DIR: &str = "/mnt/bench";

async fn drain(mut s: ByteStream) -> Result<u64, String> {
    let mut n = 0u64;
    while let Some(part) = s.next().await {
        n += part.map_err(err)?.len() as u64;
    }
    Ok(n)
}

/// Seconds to read `path` through `filer`, checking the length.
async fn timed_read(filer: &dyn Filer, path: &str, want: u64) -> Result<f64, String> {
    let t = Instant::now();
    let (_, s) = filer.read(path, None).await.map_err(err)?;
    let got = drain(s).await?;
    if got != want {
        return Err(format!("{path}: read {got} bytes, expected {want}"));
    }
    Ok(t.elapsed().as_secs_f64())
}

/// `size` bytes of a fixed pseudo-random pattern (not compressible, the same every run).
pub(crate) fn pattern(size: u64) -> Bytes {
    (0..size).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect::<Vec<u8>>().into()
}

/// How many ranged GETs at once a plain parallel client reads a large object with: the faster
/// is reported (behind moto and a per-connection throttle 4 beat 8: moto serves every GET from
/// one process, and copies the object for each).
pub(crate) const RANGED_PARTS: [u64; 2] = [4, 8];

/// Seconds for the faster of [`RANGED_PARTS`] plain SDK GetObjects of `key` at once, each of
/// an equal byte range, the bodies read to their ends, and how many that was: how the fastest
/// clients read a large object (the AWS CRT, s5cmd), and what a bucket serving each connection
/// at a fixed rate allows a client at best.
pub(crate) async fn sdk_get_ranged(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    size: u64,
) -> Result<(f64, u64), String> {
    let mut fastest = (f64::MAX, 0);
    for parts in RANGED_PARTS {
        let secs = ranged_gets(s3, bucket, key, size, parts).await?;
        if secs < fastest.0 {
            fastest = (secs, parts);
        }
    }
    Ok(fastest)
}

async fn ranged_gets(s3: &aws_sdk_s3::Client, bucket: &str, key: &str, size: u64, parts: u64) -> Result<f64, String> {
    let t = Instant::now();
    let part = size.div_ceil(parts);
    let gets = (0..parts).map(|i| {
        let (from, to) = (i * part, ((i + 1) * part).min(size) - 1);
        async move {
            let out = s3
                .get_object()
                .bucket(bucket)
                .key(key)
                .range(format!("bytes={from}-{to}"))
                .send()
                .await
                .map_err(|e| sdk_err("GetObject", e))?;
            let mut body = out.body;
            let mut n = 0u64;
            while let Some(b) = body.try_next().await.map_err(err)? {
                n += b.len() as u64;
            }
            Ok::<u64, String>(n)
        }
    });
    let n: u64 = futures::future::try_join_all(gets).await?.into_iter().sum();
    if n != size {
        return Err(format!("{parts} ranged GETs returned {n} bytes of {size}"));
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Seconds for a plain SDK GetObject of `key`, the body read to its end.
pub(crate) async fn sdk_get(s3: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Result<(f64, u64), String> {
    let t = Instant::now();
    let out = s3.get_object().bucket(bucket).key(key).send().await.map_err(|e| sdk_err("GetObject", e))?;
    let mut body = out.body;
    let mut n = 0u64;
    while let Some(part) = body.try_next().await.map_err(err)? {
        n += part.len() as u64;
    }
    Ok((t.elapsed().as_secs_f64(), n))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub(crate) fn ms_p50_p99(mut samples: Vec<f64>) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    (percentile(&samples, 0.5) * 1e3, percentile(&samples, 0.99) * 1e3)
}

pub(crate) fn mib_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / (1 << 20) as f64 / secs
}

pub(crate) fn best(xs: &[f64]) -> f64 {
    xs.iter().copied().fold(f64::INFINITY, f64::min)
}

pub async fn run(b: CacheBench) -> Result<(), String> {
    let size = parse_size(&b.size).map_err(err)?;
    let chunk = parse_size(&b.chunk).map_err(err)?;
    if size == 0 || chunk < 4096 || b.small == 0 || b.rounds == 0 {
        return Err("--size, --small and --rounds must be at least 1, --chunk at least 4K".into());
    }
    let mut b = b;
    if let Some(rate) = b.throttle {
        let proxy = tidemark_testkit::throttling_proxy(&b.endpoint.endpoint, rate)?;
        println!("bench cache: {} through a proxy serving at most {rate} MiB/s per connection", b.endpoint.endpoint);
        b.endpoint.endpoint = format!("http://{proxy}");
    }
    let conf = b.endpoint.conf();
    let (_, bucket, storage) = b.endpoint.fresh_bucket("tidemark-bench-cache").await?;
    let s3 = storage.client().clone();
    let large = pattern(size);
    let t = Instant::now();
    storage.put("large.bin", large.clone(), Default::default()).await.map_err(err)?;
    println!(
        "bench cache: {} ({bucket}): a {} object put in {:.1} s; {} objects of 4 KiB; chunks of {}",
        b.endpoint.endpoint,
        human_bytes(size),
        t.elapsed().as_secs_f64(),
        b.small,
        human_bytes(chunk)
    );
    let small_keys: Vec<String> = (0..b.small).map(|i| format!("small/{i:05}.bin")).collect();
    put_all(&storage, &small_keys, Bytes::from(vec![b's'; SMALL_BYTES])).await?;

    // A filer whose cache holds everything, with the bucket mounted and its metadata imported.
    let tmp = tempfile::tempdir().map_err(err)?;
    let mount = Mount {
        dir: DIR.into(),
        location: RemoteLocation { storage: conf.name.clone(), bucket: bucket.clone(), path: String::new() },
        sync: false,
    };
    let budget = size * 2 + (b.small * SMALL_BYTES) as u64 + (64 << 20);
    let cache = CacheConfig { budget_bytes: budget, chunk_bytes: chunk };
    let filer = filer_with_bucket(tmp.path(), &conf, &mount, &storage, cache).await?;
    let path = format!("{DIR}/large.bin");

    // Cold: the filer's first read beside the plain client's GET, before and after it.
    let (sdk1, n) = sdk_get(&s3, &bucket, "large.bin").await?;
    if n != size {
        return Err(format!("GetObject returned {n} bytes of {size}"));
    }
    let cold = timed_read(&*filer, &path, size).await?;
    filer.cache().idle().await;
    let (sdk2, _) = sdk_get(&s3, &bucket, "large.bin").await?;
    let sdk = sdk1.min(sdk2);
    println!(
        "  cold read: {:.0} MiB/s ({cold:.2} s) | plain client GET: {:.0} MiB/s (best of {sdk1:.2} / {sdk2:.2} s) | ratio {:.2}",
        mib_s(size, cold),
        mib_s(size, sdk),
        sdk / cold
    );

    // What caching costs on this disk: the same bytes written as the cache writes them (a chunk
    // at a time into the object's file, each fsynced), while nothing else runs.
    let disk = write_chunks(&tmp.path().join("disk-limit"), &large, chunk as usize, true)?;
    // And without the fsyncs: what a cache that verified its chunks after a crash, instead of
    // making each durable before recording it, could write (docs/BENCHMARKS.md, the choice).
    let unsynced = write_chunks(&tmp.path().join("disk-limit"), &large, chunk as usize, false)?;
    println!(
        "  the cache's disk: {:.0} MiB/s writing the same bytes as the cache does, a chunk at a time, fsynced ({disk:.2} s), {:.0} MiB/s without the fsyncs ({unsynced:.2} s) | cold read ÷ the slower of GET and disk: {:.2}",
        mib_s(size, disk),
        mib_s(size, unsynced),
        sdk.max(disk) / cold
    );

    // Warm: from the cache, beside the same bytes read from a local file of the same disk.
    let local = tmp.path().join("local-copy.bin");
    std::fs::write(&local, &large).map_err(err)?;
    let mut warm = Vec::new();
    let mut plain = Vec::new();
    for _ in 0..3 {
        warm.push(timed_read(&*filer, &path, size).await?);
        plain.push(read_local(&local, chunk as usize)?);
    }
    let (warm, plain) = (best(&warm), best(&plain));
    println!(
        "  warm read: {:.0} MiB/s ({warm:.3} s) | local file: {:.0} MiB/s ({plain:.3} s) | ratio {:.2}",
        mib_s(size, warm),
        mib_s(size, plain),
        plain / warm
    );

    // The same through the filer's HTTP API on loopback.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(err)?;
    let addr = listener.local_addr().map_err(err)?;
    let served: Arc<dyn Filer> = filer.clone();
    let server = tokio::spawn(tidemark_filer::http::serve(listener, served, None, std::future::pending()));
    let http = HttpFiler::new(&addr.to_string(), None).map_err(err)?;
    let mut over_http = Vec::new();
    for _ in 0..3 {
        over_http.push(timed_read(&http, &path, size).await?);
    }
    let over_http = best(&over_http);
    println!(
        "  warm read over the HTTP API: {:.0} MiB/s ({over_http:.3} s) | ratio to the local file {:.2}",
        mib_s(size, over_http),
        plain / over_http
    );

    // Small files: one read caches each, then warm reads are timed one at a time.
    let paths: Vec<String> = small_keys.iter().map(|k| format!("{DIR}/{k}")).collect();
    for p in &paths {
        timed_read(&*filer, p, SMALL_BYTES as u64).await?;
    }
    filer.cache().idle().await;
    let misses = filer.cache_stats().await.map_err(err)?.misses;
    let (mut inproc, mut via_http, mut sdk_small) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..b.rounds {
        for (p, k) in paths.iter().zip(&small_keys) {
            inproc.push(timed_read(&*filer, p, SMALL_BYTES as u64).await?);
            via_http.push(timed_read(&http, p, SMALL_BYTES as u64).await?);
            sdk_small.push(sdk_get(&s3, &bucket, k).await?.0);
        }
    }
    let after = filer.cache_stats().await.map_err(err)?;
    let ((i50, i99), (h50, h99), (s50, s99)) = (ms_p50_p99(inproc), ms_p50_p99(via_http), ms_p50_p99(sdk_small));
    println!(
        "  small-file warm read ({} reads of 4 KiB): in process p50 {i50:.2} ms, p99 {i99:.2} ms | over HTTP p50 {h50:.2} ms, p99 {h99:.2} ms | plain client GET from the endpoint p50 {s50:.2} ms, p99 {s99:.2} ms | HTTP ÷ GET p50 {:.2}",
        b.small * b.rounds,
        h50 / s50
    );
    println!(
        "  cache: {} hits, {} misses ({} during the warm rounds), {} resident",
        after.hits,
        after.misses,
        after.misses - misses,
        human_bytes(after.resident_bytes)
    );
    server.abort();
    println!("  (the bucket {bucket} is left on the endpoint)");
    Ok(())
}

/// Puts `body` at each of `keys`, 16 at a time.
pub(crate) async fn put_all<S: tidemark_core::RemoteStorage>(
    storage: &S,
    keys: &[String],
    body: Bytes,
) -> Result<(), String> {
    futures::stream::iter(keys)
        .map(|k| storage.put(k, body.clone(), Default::default()))
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    Ok(())
}

/// Seconds to write `bytes` into `dir` in pieces of `chunk` bytes: with `sync` as the cache
/// writes a chunk (`write_durably`: at its offset of one file, past the page cache where the
/// file system allows, fsynced), else as plain buffered writes of one file.
fn write_chunks(dir: &std::path::Path, bytes: &[u8], chunk: usize, sync: bool) -> Result<f64, String> {
    std::fs::create_dir_all(dir).map_err(err)?;
    let p = dir.join("object");
    let t = Instant::now();
    if sync {
        for (i, part) in bytes.chunks(chunk).enumerate() {
            tidemark_filer::cache::write_durably(&p, (i * chunk) as u64, part, bytes.len() as u64).map_err(err)?;
        }
    } else {
        let mut f = std::fs::File::create(&p).map_err(err)?;
        for part in bytes.chunks(chunk) {
            std::io::Write::write_all(&mut f, part).map_err(err)?;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    std::fs::remove_dir_all(dir).map_err(err)?;
    Ok(secs)
}

/// Reads `r` to its end in `buf`-sized reads, passing each piece to `each`: how many bytes.
fn read_through(
    mut r: impl std::io::Read,
    buf: usize,
    mut each: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> std::io::Result<u64> {
    let (mut b, mut n) = (vec![0u8; buf], 0u64);
    loop {
        let k = r.read(&mut b)?;
        if k == 0 {
            return Ok(n);
        }
        each(&b[..k])?;
        n += k as u64;
    }
}

/// Seconds to read a local file in `buf`-sized reads.
pub(crate) fn read_local(p: &std::path::Path, buf: usize) -> Result<f64, String> {
    let t = Instant::now();
    let n = read_through(std::fs::File::open(p).map_err(err)?, buf, |_| Ok(())).map_err(err)?;
    std::hint::black_box(n);
    Ok(t.elapsed().as_secs_f64())
}

/// Seconds to send the bytes of `p` (in the page cache) over a loopback TCP connection to a
/// reader that drops them, both in `buf`-sized reads and writes: the ceiling of a server that
/// answers over TCP on this machine. (`sendfile`, as `std::io::copy` does, was slower here:
/// 1.8 GiB/s against 4 GiB/s with 1 MiB writes.)
pub(crate) fn read_loopback(p: &std::path::Path, buf: usize) -> Result<f64, String> {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(err)?;
    let addr = listener.local_addr().map_err(err)?;
    let path = p.to_path_buf();
    let sender = std::thread::spawn(move || -> std::io::Result<u64> {
        let (mut sock, _) = listener.accept()?;
        read_through(std::fs::File::open(path)?, buf, |piece| sock.write_all(piece))
    });
    let sock = std::net::TcpStream::connect(addr).map_err(err)?;
    let t = Instant::now();
    let n = read_through(sock, buf, |_| Ok(())).map_err(err)?;
    let secs = t.elapsed().as_secs_f64();
    let sent = sender.join().map_err(|_| "the loopback sender panicked".to_string())?.map_err(err)?;
    if n != sent {
        return Err(format!("loopback: {n} bytes received of {sent}"));
    }
    Ok(secs)
}

/// The machine's CPU time so far (all cores, every process), from /proc/stat: busy and idle
/// seconds. Two readings around a transfer say how many cores it kept busy, and whether the
/// machine had any left.
#[derive(Clone, Copy)]
pub(crate) struct CpuTimes {
    busy: f64,
    idle: f64,
}

impl CpuTimes {
    pub(crate) fn now() -> CpuTimes {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let fields: Vec<f64> =
            stat.lines().next().unwrap_or_default().split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
        // user nice system idle iowait irq softirq steal (guest time is within user).
        let tick = 100.0; // USER_HZ on Linux
        let at = |i: usize| fields.get(i).copied().unwrap_or(0.0) / tick;
        let idle = at(3) + at(4);
        let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
        CpuTimes { busy, idle }
    }

    /// Busy core-seconds since `before`, and the share of the machine they were.
    pub(crate) fn since(before: CpuTimes) -> (f64, f64) {
        let now = CpuTimes::now();
        let (busy, idle) = (now.busy - before.busy, now.idle - before.idle);
        (busy, if busy + idle > 0.0 { busy / (busy + idle) } else { 0.0 })
    }
}

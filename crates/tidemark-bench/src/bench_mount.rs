//! `tidemark-bench mount`: the FUSE mount beside the local disk, in one run. A fresh filer (over
//! its HTTP API on loopback, as `tidemark mount` talks to it) holds a large file and a tree of
//! small ones; the mount runs in this process:
//!
//! - sequential read of the large file through the mount (first read: through the filer; second:
//!   the kernel's page cache, which the mount keeps until the file changes) ÷ reading the same
//!   bytes from a local file;
//! - `ls -lR` (a walk with a stat of every entry) of the tree: first and repeated;
//! - small-file reads (open, read, close) of files not read before, p50/p99, beside local files.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use clap::Args;
use futures::StreamExt;

use tidemark_core::cache::{human_bytes, parse_size};
use tidemark_core::{Filer, WriteOptions};
use tidemark_filer::{DataDir, LocalFiler};

use crate::bench_cache::{best, mib_s, ms_p50_p99, pattern, read_local};
use crate::bench_s3::{Endpoint, err};

#[derive(Args)]
pub struct MountBench {
    /// The large file's size (K/M/G suffixes): 1G for a local file, 256M for an object.
    #[arg(long)]
    size: Option<String>,
    /// Files in the tree `ls -lR` walks (in directories of 100): 10,000 local, 1,000 objects.
    #[arg(long)]
    files: Option<usize>,
    /// Small files read once each for the latency figures.
    #[arg(long, default_value_t = 200)]
    small: usize,
    /// Measure a bucket-backed mount instead: the large file and the tree are objects in a
    /// fresh bucket on this S3 endpoint (moto in scripts/bench.sh), mounted on the filer, read
    /// through the mount beside a plain SDK GET of the same object.
    #[arg(long, value_name = "URL")]
    endpoint: Option<String>,
    /// With --endpoint: the peer that mounts the same bucket in the same run (rclone, with
    /// `--vfs-cache-mode full`).
    #[arg(long, requires = "endpoint", value_parser = ["rclone"])]
    peer: Option<String>,
    /// With --endpoint: serve the bucket's answers at most this many MiB/s per connection (a
    /// proxy in front of it, for every client alike).
    #[arg(long, value_name = "MIB_S", requires = "endpoint")]
    throttle: Option<f64>,
    /// With --endpoint: its access key (moto takes any; a Tidemark gateway on loopback takes the
    /// development key `tidemark`).
    #[arg(long, default_value = "testing", requires = "endpoint")]
    access_key: String,
    /// With --endpoint: its secret key.
    #[arg(long, default_value = "testing", hide_default_value = true, requires = "endpoint")]
    secret_key: String,
}

pub(crate) fn walk(dir: &Path) -> std::io::Result<usize> {
    let mut n = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let m = std::fs::symlink_metadata(e.path())?;
        n += 1;
        if m.is_dir() {
            n += walk(&e.path())?;
        }
    }
    Ok(n)
}

pub(crate) fn timed<T>(f: impl FnOnce() -> std::io::Result<T>) -> Result<(f64, T), String> {
    let t = Instant::now();
    let v = f().map_err(err)?;
    Ok((t.elapsed().as_secs_f64(), v))
}

fn read_small(paths: &[PathBuf]) -> Result<Vec<f64>, String> {
    let mut times = Vec::with_capacity(paths.len());
    for p in paths {
        let t = Instant::now();
        let mut f = std::fs::File::open(p).map_err(err)?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf).map_err(err)?;
        times.push(t.elapsed().as_secs_f64());
    }
    Ok(times)
}

async fn put(filer: &dyn Filer, p: String, bytes: Bytes) -> Result<(), String> {
    let body = futures::stream::once(async move { Ok(bytes) }).boxed();
    filer.write(&p, body, WriteOptions::default()).await.map_err(err)?;
    Ok(())
}

pub async fn run(b: MountBench) -> Result<(), String> {
    if let Some(url) = b.endpoint {
        let size = parse_size(b.size.as_deref().unwrap_or("256M")).map_err(err)?;
        let files = b.files.unwrap_or(1_000);
        if size == 0 || files == 0 {
            return Err("--size and --files must be at least 1".into());
        }
        let endpoint =
            Endpoint { endpoint: url, access_key: b.access_key, secret_key: b.secret_key, region: "us-east-1".into() };
        return crate::bench_mount_remote::run(crate::bench_mount_remote::RemoteArgs {
            endpoint,
            size,
            files,
            peer: b.peer,
            throttle: b.throttle,
        })
        .await;
    }
    let size = parse_size(b.size.as_deref().unwrap_or("1G")).map_err(err)?;
    let n_files = b.files.unwrap_or(10_000);
    if size == 0 || n_files == 0 || b.small == 0 || b.small > n_files {
        return Err("--size and --files must be at least 1, --small between 1 and --files".into());
    }
    let tmp = tempfile::tempdir().map_err(err)?;
    let filer = Arc::new(LocalFiler::open(DataDir::open(tmp.path().join("data")).map_err(err)?).map_err(err)?);
    let (addr, server) = crate::bench_mount_remote::serve_filer(filer.clone(), &tmp.path().join("data")).await?;

    // The large file, written in 8 MiB pieces, and the same bytes in a local file.
    let piece = pattern(8 << 20);
    let pieces = size.div_ceil(piece.len() as u64);
    let last = size - (pieces - 1) * piece.len() as u64;
    let body = futures::stream::iter((0..pieces).map({
        let piece = piece.clone();
        move |i| Ok(if i + 1 == pieces { piece.slice(..last as usize) } else { piece.clone() })
    }))
    .boxed();
    filer.write("/bench/large.bin", body, WriteOptions::default()).await.map_err(err)?;
    let local = tmp.path().join("local.bin");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&local).map_err(err)?;
        for i in 0..pieces {
            f.write_all(if i + 1 == pieces { &piece[..last as usize] } else { &piece[..] }).map_err(err)?;
        }
    }
    // The tree: 4 KiB files in directories of 100, and the same locally.
    let small = Bytes::from(vec![b's'; 4096]);
    let names: Vec<String> = (0..n_files).map(|i| format!("d{:03}/f{:05}", i / 100, i)).collect();
    futures::stream::iter(&names)
        .map(|n| put(&*filer, format!("/bench/tree/{n}"), small.clone()))
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let local_tree = tmp.path().join("local-tree");
    for n in &names {
        let p = local_tree.join(n);
        std::fs::create_dir_all(p.parent().unwrap_or(&local_tree)).map_err(err)?;
        std::fs::write(p, &small).map_err(err)?;
    }

    // The mount, in this process, over the HTTP API.
    let mnt = tmp.path().join("mnt");
    let (stop_tx, mounted) =
        crate::bench_mount_remote::mount_in_process(&addr, "/bench", &mnt, "large.bin", false).await?;
    // A read-only mount beside it: the kernel reads the filer's file itself (FUSE passthrough).
    let mnt_ro = tmp.path().join("mnt-ro");
    let (stop_ro, mounted_ro) =
        crate::bench_mount_remote::mount_in_process(&addr, "/bench", &mnt_ro, "large.bin", true).await?;
    println!(
        "bench mount: {} file and {} files of 4 KiB through a FUSE mount of a filer on {addr} (its socket, as a mount beside its filer reaches it)",
        human_bytes(size),
        n_files
    );

    let (mnt2, local2, local_tree2, mnt_ro2) = (mnt.clone(), local.clone(), local_tree.clone(), mnt_ro.clone());
    let (small_n, files) = (b.small, n_files);
    let report = tokio::task::spawn_blocking(move || -> Result<(), String> {
        // Large file: the first read through the filer, the second from the kernel's pages.
        let large = mnt2.join("large.bin");
        let first = read_local(&large, 1 << 20)?;
        let again = read_local(&large, 1 << 20)?;
        let plain = best(&[read_local(&local2, 1 << 20)?, read_local(&local2, 1 << 20)?]);
        println!(
            "  sequential read, {}: through the filer {:.0} MiB/s, again (kernel page cache) {:.0} MiB/s | local file {:.0} MiB/s | ratios {:.2} / {:.2}",
            human_bytes(size),
            mib_s(size, first),
            mib_s(size, again),
            mib_s(size, plain),
            plain / first,
            plain / again
        );
        let ro = mnt_ro2.join("large.bin");
        let (ro_first, ro_again) = (read_local(&ro, 1 << 20)?, read_local(&ro, 1 << 20)?);
        println!(
            "  sequential read, {}, read-only mount (FUSE passthrough to the filer's file): first {:.0} MiB/s, again {:.0} MiB/s | ratios {:.2} / {:.2}",
            human_bytes(size),
            mib_s(size, ro_first),
            mib_s(size, ro_again),
            plain / ro_first,
            plain / ro_again
        );
        // ls -lR: a walk with a stat of every entry.
        let tree = mnt2.join("tree");
        let (cold, n) = timed(|| walk(&tree))?;
        let (warm, _) = timed(|| walk(&tree))?;
        let (local_walk, ln) = timed(|| walk(&local_tree2))?;
        if n != ln {
            return Err(format!("the mount shows {n} entries, the local tree {ln}"));
        }
        println!(
            "  ls -lR of {n} entries: first {:.2} s, again {:.3} s | local {:.3} s | again ÷ local {:.2}",
            cold,
            warm,
            local_walk,
            warm / local_walk
        );
        // Small files not read before (the walk read only their attributes).
        let pick: Vec<String> = (0..small_n)
            .map(|i| (i * 97) % files)
            .map(|j| format!("d{:03}/f{:05}", j / 100, j))
            .collect();
        let on_mount: Vec<PathBuf> = pick.iter().map(|n| tree.join(n)).collect();
        let on_disk: Vec<PathBuf> = pick.iter().map(|n| local_tree2.join(n)).collect();
        let (m50, m99) = ms_p50_p99(read_small(&on_mount)?);
        let (l50, l99) = ms_p50_p99(read_small(&on_disk)?);
        println!(
            "  first read of a 4 KiB file ({small_n} files): p50 {m50:.2} ms, p99 {m99:.2} ms | local p50 {l50:.3} ms, p99 {l99:.3} ms"
        );
        Ok(())
    })
    .await
    .map_err(err)?;
    let _ = stop_tx.send(());
    let _ = stop_ro.send(());
    let unmounted = mounted.await.map_err(err)?;
    let unmounted_ro = mounted_ro.await.map_err(err)?;
    server.abort();
    report?;
    unmounted?;
    unmounted_ro
}

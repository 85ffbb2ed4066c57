//! `tidemark bench blobs`: file content on a blob store (`--blob-store`) against an
//! S3-compatible endpoint (moto in `scripts/bench.sh`), each figure beside its limit in the same
//! run: a file written through the filer (streamed in 1 MiB pieces, stored as a multipart upload
//! of 8 MiB parts, four in flight) ÷ a plain SDK PutObject of the same bytes to the same
//! endpoint; and its cold read (a ranged GET stream) ÷ a plain SDK GetObject. Creates a bucket
//! named `tidemark-bench-blobs-<run>`; meant for an emulator.

use std::time::Instant;

use bytes::Bytes;
use clap::Args;
use futures::StreamExt;

use tidemark_core::cache::{human_bytes, parse_size};
use tidemark_core::{Filer, WriteOptions};
use tidemark_filer::blobs::{BlobStoreUrl, S3Blobs};
use tidemark_filer::{DataDir, LocalFiler};

use crate::bench_cache::{pattern, sdk_get};
use crate::bench_s3::{Endpoint, err, sdk_err};

#[derive(Args)]
pub struct BlobsBench {
    #[command(flatten)]
    endpoint: Endpoint,
    /// The file's size (K/M/G suffixes).
    #[arg(long, default_value = "256M")]
    size: String,
    /// Rounds of each measurement (the best of them is reported, and each round's ratio).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

pub async fn run(b: BlobsBench) -> Result<(), String> {
    let size = parse_size(&b.size).map_err(err)?;
    let (_run, bucket, storage) = b.endpoint.fresh_bucket("tidemark-bench-blobs").await?;
    let s3 = storage.client().clone();
    let url = BlobStoreUrl::parse(&format!(
        "s3://{bucket}/blobs?endpoint={}&region={}",
        b.endpoint.endpoint, b.endpoint.region
    ))
    .map_err(err)?;
    let blobs = S3Blobs::connect(&url, Some((&b.endpoint.access_key, &b.endpoint.secret_key))).await.map_err(err)?;
    let dir = tempfile::tempdir().map_err(err)?;
    let filer = LocalFiler::open(DataDir::open(dir.path()).map_err(err)?).map_err(err)?.with_blob_store(blobs);
    let body = pattern(size);
    println!("blob store {} ({}): a file of {}", url.location(), b.endpoint.endpoint, human_bytes(size));
    let mut best = [f64::MAX; 4];
    for round in 0..b.rounds {
        // The plain client: one PutObject of the whole body, one GetObject.
        let t = Instant::now();
        s3.put_object()
            .bucket(&bucket)
            .key(format!("plain/{round}"))
            .body(body.clone().into())
            .send()
            .await
            .map_err(|e| sdk_err("PutObject", e))?;
        let sdk_put = t.elapsed().as_secs_f64();
        let (sdk_read, n) = sdk_get(&s3, &bucket, &format!("plain/{round}")).await?;
        if n != size {
            return Err(format!("the plain GET read {n} bytes"));
        }
        // The filer: a streamed write (1 MiB pieces, as a client sends them), then a cold read.
        let pieces: Vec<std::io::Result<Bytes>> = (0..size)
            .step_by(1 << 20)
            .map(|o| Ok(body.slice(o as usize..((o + (1 << 20)).min(size)) as usize)))
            .collect();
        let path = format!("/bench/file-{round}");
        let t = Instant::now();
        filer.write(&path, futures::stream::iter(pieces).boxed(), WriteOptions::default()).await.map_err(err)?;
        let put = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let (_, mut s) = filer.read(&path, None).await.map_err(err)?;
        let mut got = 0u64;
        while let Some(part) = s.next().await {
            got += part.map_err(err)?.len() as u64;
        }
        let read = t.elapsed().as_secs_f64();
        if got != size {
            return Err(format!("the filer read {got} bytes"));
        }
        let mib = size as f64 / (1 << 20) as f64;
        println!(
            "round {}: write {:.2} s ({:.0} MiB/s) vs plain PUT {:.2} s → {:.2}; cold read {:.2} s ({:.0} MiB/s) vs plain GET {:.2} s → {:.2}",
            round + 1,
            put,
            mib / put,
            sdk_put,
            sdk_put / put,
            read,
            mib / read,
            sdk_read,
            sdk_read / read
        );
        for (i, v) in [put, sdk_put, read, sdk_read].into_iter().enumerate() {
            best[i] = best[i].min(v);
        }
    }
    println!(
        "best of {}: write ÷ plain PUT {:.2}, cold read ÷ plain GET {:.2} (ratios of throughput; goal ≥ 0.9)",
        b.rounds,
        best[1] / best[0],
        best[3] / best[2]
    );
    Ok(())
}

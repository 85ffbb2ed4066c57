//! `tidemark-bench blobs`: file content on a blob store (`--blob-store`) against an
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
    let mut best = [f64::MAX; 5];
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
        // The plain client as a writer that does not know the length ahead must write: a
        // multipart upload of the same parts, as many in flight.
        let sdk_multipart = multipart(&s3, &bucket, &format!("plain-mp/{round}"), &body).await?;
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
            "round {}: write {:.2} s ({:.0} MiB/s) vs plain PUT {:.2} s → {:.2}, vs plain multipart {:.2} s → {:.2}; cold read {:.2} s ({:.0} MiB/s) vs plain GET {:.2} s → {:.2}",
            round + 1,
            put,
            mib / put,
            sdk_put,
            sdk_put / put,
            sdk_multipart,
            sdk_multipart / put,
            read,
            mib / read,
            sdk_read,
            sdk_read / read
        );
        for (i, v) in [put, sdk_put, read, sdk_read, sdk_multipart].into_iter().enumerate() {
            best[i] = best[i].min(v);
        }
    }
    println!(
        "best of {}: write ÷ plain PUT {:.2}, ÷ plain multipart {:.2}; cold read ÷ plain GET {:.2} (ratios of throughput; goal ≥ 0.9)",
        b.rounds,
        best[1] / best[0],
        best[4] / best[0],
        best[3] / best[2]
    );
    Ok(())
}

/// Seconds for a plain SDK multipart upload of `body` in the blob store's parts, as many in flight.
async fn multipart(s3: &aws_sdk_s3::Client, bucket: &str, key: &str, body: &Bytes) -> Result<f64, String> {
    use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
    let t = Instant::now();
    let up = s3
        .create_multipart_upload()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .map_err(|e| sdk_err("CreateMultipartUpload", e))?;
    let id = up.upload_id().unwrap_or_default().to_string();
    let mut offsets = Vec::new();
    let (mut at, mut n) = (0usize, 1);
    while at < body.len() {
        let len = tidemark_filer::blobs::part_size(n).min(body.len() - at);
        offsets.push((n, at, len));
        at += len;
        n += 1;
    }
    let sends = offsets.into_iter().map(|(n, at, len)| {
        let (s3, id, part) = (s3.clone(), id.clone(), body.slice(at..at + len));
        async move {
            let out = s3
                .upload_part()
                .bucket(bucket)
                .key(key)
                .upload_id(id)
                .part_number(n)
                .body(part.into())
                .send()
                .await
                .map_err(|e| sdk_err("UploadPart", e))?;
            Ok::<_, String>(CompletedPart::builder().part_number(n).e_tag(out.e_tag().unwrap_or_default()).build())
        }
    });
    let parts: Vec<CompletedPart> =
        futures::stream::iter(sends).buffered(4).collect::<Vec<_>>().await.into_iter().collect::<Result<_, _>>()?;
    s3.complete_multipart_upload()
        .bucket(bucket)
        .key(key)
        .upload_id(id)
        .multipart_upload(CompletedMultipartUpload::builder().set_parts(Some(parts)).build())
        .send()
        .await
        .map_err(|e| sdk_err("CompleteMultipartUpload", e))?;
    Ok(t.elapsed().as_secs_f64())
}

//! `tidemark-bench gateway`: the S3 gateway (in process, as `tidemark server` runs it) beside
//! an S3-compatible endpoint (moto in `scripts/bench.sh`), the same SDK client against both in
//! the same run:
//!
//! - GET of a cached 4 KiB object: p50/p99 one at a time, and requests/s at concurrency 1 and 16;
//! - GET of a large object through the gateway, its cache empty, ÷ a plain GET from the endpoint
//!   (`--throttle MIB_S`: both behind a proxy serving that much per connection);
//! - GET of a large cached object ÷ reading the same bytes from a local file;
//! - PUT throughput of 1 MiB objects into a local bucket, beside PUTs to the endpoint.
//!
//! It creates a bucket named `tidemark-bench-gw-<run>` on the endpoint; meant for an emulator.

use std::sync::Arc;
use std::time::Instant;

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use bytes::Bytes;
use clap::Args;
use futures::StreamExt;

use tidemark_core::cache::{human_bytes, parse_size};
use tidemark_core::remote::{Mount, RemoteLocation};
use tidemark_core::{Filer, RemoteStorage};
use tidemark_filer::CacheConfig;

use crate::bench_cache::{
    RANGED_PARTS, best, mib_s, ms_p50_p99, pattern, read_local, read_loopback, sdk_get, sdk_get_ranged,
};
use crate::bench_s3::{Endpoint, err, filer_with_bucket, sdk_err};

#[derive(Args)]
pub struct GatewayBench {
    #[command(flatten)]
    endpoint: Endpoint,
    /// The large object's size (K/M/G suffixes).
    #[arg(long, default_value = "128M")]
    size: String,
    /// GETs of the small object per measurement.
    #[arg(long, default_value_t = 500)]
    requests: usize,
    /// PUTs of 1 MiB per side.
    #[arg(long, default_value_t = 64)]
    puts: usize,
    /// Serve the endpoint's answers at most this many MiB/s per connection (a local proxy in
    /// front of it), for the gateway's bucket and the plain client alike: a bucket as slow per
    /// stream as a real one.
    #[arg(long, value_name = "MIB_S")]
    throttle: Option<f64>,
}

const BUCKET_DIR: &str = "/buckets/bench";
const SMALL: &str = "small.bin";
const LARGE: &str = "large.bin";
const PUT_BYTES: usize = 1 << 20;

fn client_for(endpoint: &str, ak: &str, sk: &str) -> aws_sdk_s3::Client {
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new(ak, sk, None, None, "bench"))
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

/// Requests/s of `n` GETs of `key`, `concurrency` at a time, and each one's seconds.
async fn gets(
    c: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    n: usize,
    concurrency: usize,
) -> Result<(f64, Vec<f64>), String> {
    let t = Instant::now();
    let times: Vec<Result<(f64, u64), String>> =
        futures::stream::iter(0..n).map(|_| sdk_get(c, bucket, key)).buffer_unordered(concurrency).collect().await;
    let rate = n as f64 / t.elapsed().as_secs_f64();
    Ok((rate, times.into_iter().map(|r| r.map(|x| x.0)).collect::<Result<_, _>>()?))
}

/// One PUT of `body` as `key`, encrypted with SSE-S3 if `sse`.
async fn put_one(c: &aws_sdk_s3::Client, bucket: &str, key: &str, body: &Bytes, sse: bool) -> Result<(), String> {
    let sse = sse.then_some(aws_sdk_s3::types::ServerSideEncryption::Aes256);
    c.put_object()
        .bucket(bucket)
        .key(key)
        .set_server_side_encryption(sse)
        .body(aws_sdk_s3::primitives::ByteStream::from(body.clone()))
        .send()
        .await
        .map(|_| ())
        .map_err(|e| sdk_err("PutObject", e))
}

/// MiB/s of `n` PUTs of `body`, 4 at a time (encrypted with SSE-S3 if `sse`).
async fn puts(c: &aws_sdk_s3::Client, bucket: &str, body: &Bytes, n: usize, sse: bool) -> Result<f64, String> {
    let t = Instant::now();
    let results: Vec<Result<(), String>> = futures::stream::iter(0..n)
        .map(|i| async move { put_one(c, bucket, &format!("put/{i:05}.bin"), body, sse).await })
        .buffer_unordered(4)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>, String>>()?;
    Ok(mib_s((n * body.len()) as u64, t.elapsed().as_secs_f64()))
}

pub async fn run(b: GatewayBench) -> Result<(), String> {
    let size = parse_size(&b.size).map_err(err)?;
    if size == 0 || b.requests == 0 || b.puts == 0 {
        return Err("--size, --requests and --puts must be at least 1".into());
    }
    let mut b = b;
    if let Some(rate) = b.throttle {
        let proxy = tidemark_testkit::throttling_proxy(&b.endpoint.endpoint, rate)?;
        println!("bench gateway: {} through a proxy serving at most {rate} MiB/s per connection", b.endpoint.endpoint);
        b.endpoint.endpoint = format!("http://{proxy}");
    }
    let conf = b.endpoint.conf();
    let (_, bucket, storage) = b.endpoint.fresh_bucket("tidemark-bench-gw").await?;
    let remote = storage.client().clone();
    let large = pattern(size);
    storage.put(LARGE, large.clone(), Default::default()).await.map_err(err)?;
    storage.put(SMALL, Bytes::from(vec![b's'; 4096]), Default::default()).await.map_err(err)?;

    // A filer with the bucket mounted at /buckets/bench, its metadata imported, and a gateway.
    let tmp = tempfile::tempdir().map_err(err)?;
    let mount = Mount {
        dir: BUCKET_DIR.into(),
        location: RemoteLocation { storage: conf.name.clone(), bucket: bucket.clone(), path: String::new() },
        sync: false,
    };
    let cache = CacheConfig { budget_bytes: size * 2 + (64 << 20), chunk_bytes: 8 << 20 };
    let filer = filer_with_bucket(tmp.path(), &conf, &mount, &storage, cache).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(err)?;
    let addr = listener.local_addr().map_err(err)?;
    let api: Arc<dyn Filer> = filer.clone();
    // A keyring of one fresh key, for SSE-S3's figures.
    let key: [u8; 32] = std::array::from_fn(|i| (i as u8).wrapping_mul(37).wrapping_add(size as u8));
    let keyring = {
        use base64::Engine as _;
        tidemark_s3::sse::Keyring::parse(&format!("aws/s3={}", base64::engine::general_purpose::STANDARD.encode(key)))?
    };
    let service = tidemark_s3::service(api, true, Some(keyring));
    let server = tokio::spawn(tidemark_s3::serve(listener, service, std::future::pending()));
    let gw = client_for(
        &format!("http://{addr}"),
        tidemark_s3::identity::DEV_ACCESS_KEY,
        tidemark_s3::identity::DEV_SECRET_KEY,
    );
    println!(
        "bench gateway: gateway on {addr} beside {} ({bucket}, mounted at {BUCKET_DIR}); a {} object and one of 4 KiB",
        b.endpoint.endpoint,
        human_bytes(size)
    );

    // Cold: the gateway's first GET of the large object (its cache empty) beside a plain GET of
    // it from the endpoint; then warm the cache with one read of the small one.
    let (cold_ep, _) = sdk_get(&remote, &bucket, LARGE).await?;
    let (cold_gw, n) = sdk_get(&gw, "bench", LARGE).await?;
    if n != size {
        return Err(format!("the gateway returned {n} bytes of {size}"));
    }
    println!(
        "  GET {} (cold, the gateway's cache empty): gateway {:.0} MiB/s ({cold_gw:.2} s) | plain GET from the endpoint {:.0} MiB/s ({cold_ep:.2} s) | gateway ÷ GET {:.2}",
        human_bytes(size),
        mib_s(size, cold_gw),
        mib_s(size, cold_ep),
        cold_ep / cold_gw
    );
    let (ranged, parts) = sdk_get_ranged(&remote, &bucket, LARGE, size).await?;
    println!(
        "  plain SDK, {parts} ranged GETs at once from the endpoint (the faster of {RANGED_PARTS:?} at once): {:.0} MiB/s ({ranged:.2} s), {:.2} × one GET | gateway's cold GET ÷ it {:.2}",
        mib_s(size, ranged),
        cold_ep / ranged,
        ranged / cold_gw
    );
    sdk_get(&gw, "bench", SMALL).await?;
    filer.cache().idle().await;

    // Small GETs: latency one at a time, then throughput at 1 and 16.
    let (gw1, gw_times) = gets(&gw, "bench", SMALL, b.requests, 1).await?;
    let (ep1, ep_times) = gets(&remote, &bucket, SMALL, b.requests, 1).await?;
    let ((g50, g99), (e50, e99)) = (ms_p50_p99(gw_times), ms_p50_p99(ep_times));
    println!(
        "  GET 4 KiB, one at a time: gateway p50 {g50:.2} ms, p99 {g99:.2} ms, {gw1:.0}/s | endpoint p50 {e50:.2} ms, p99 {e99:.2} ms, {ep1:.0}/s | gateway ÷ endpoint (rate) {:.2}",
        gw1 / ep1
    );
    let (gw16, _) = gets(&gw, "bench", SMALL, b.requests, 16).await?;
    let (ep16, _) = gets(&remote, &bucket, SMALL, b.requests, 16).await?;
    println!("  GET 4 KiB, 16 at a time: gateway {gw16:.0}/s | endpoint {ep16:.0}/s | ratio {:.2}", gw16 / ep16);

    // Large GET from the cache beside a local file of the same bytes.
    let local = tmp.path().join("local-copy.bin");
    std::fs::write(&local, &large).map_err(err)?;
    let (mut via_gw, mut plain, mut via_ep, mut via_lo) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        let (secs, n) = sdk_get(&gw, "bench", LARGE).await?;
        if n != size {
            return Err(format!("the gateway returned {n} bytes of {size}"));
        }
        via_gw.push(secs);
        plain.push(read_local(&local, 8 << 20)?);
        via_lo.push(read_loopback(&local, 1 << 20)?);
        via_ep.push(sdk_get(&remote, &bucket, LARGE).await?.0);
    }
    let (g, p, e, lo) = (best(&via_gw), best(&plain), best(&via_ep), best(&via_lo));
    println!(
        "  GET {} (cached): gateway {:.0} MiB/s | local file {:.0} MiB/s | ratio {:.2} | loopback TCP of the file {:.0} MiB/s, gateway ÷ it {:.2} | (endpoint {:.0} MiB/s)",
        human_bytes(size),
        mib_s(size, g),
        mib_s(size, p),
        p / g,
        mib_s(size, lo),
        lo / g,
        mib_s(size, e)
    );

    // PUTs of 1 MiB: into a local bucket through the gateway, beside the endpoint.
    gw.create_bucket().bucket("bench-local").send().await.map_err(|e| sdk_err("CreateBucket", e))?;
    let body = Bytes::from(vec![b'p'; PUT_BYTES]);
    let gw_put = puts(&gw, "bench-local", &body, b.puts, false).await?;
    let ep_put = puts(&remote, &bucket, &body, b.puts, false).await?;
    println!(
        "  PUT 1 MiB x {} (4 at a time): gateway {gw_put:.0} MiB/s (fsynced) | endpoint {ep_put:.0} MiB/s | ratio {:.2}",
        b.puts,
        gw_put / ep_put
    );

    // Encryption's cost, in the same local bucket: SSE-S3 beside none, for PUTs of 1 MiB and
    // GETs of the large object.
    let sse_put = puts(&gw, "bench-local", &body, b.puts, true).await?;
    put_one(&gw, "bench-local", "plain-large.bin", &large, false).await?;
    put_one(&gw, "bench-local", "sse-large.bin", &large, true).await?;
    let (mut clear, mut sealed) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        for (key, times) in [("plain-large.bin", &mut clear), ("sse-large.bin", &mut sealed)] {
            let (secs, n) = sdk_get(&gw, "bench-local", key).await?;
            if n != size {
                return Err(format!("the gateway returned {n} bytes of {size} of {key}"));
            }
            times.push(secs);
        }
    }
    let (c, e) = (best(&clear), best(&sealed));
    println!(
        "  SSE-S3: PUT 1 MiB x {} {sse_put:.0} MiB/s ÷ unencrypted {:.2} | GET {} {:.0} MiB/s ÷ unencrypted ({:.0} MiB/s) {:.2}",
        b.puts,
        sse_put / gw_put,
        human_bytes(size),
        mib_s(size, e),
        mib_s(size, c),
        c / e
    );
    server.abort();
    println!("  (the bucket {bucket} is left on the endpoint)");
    Ok(())
}

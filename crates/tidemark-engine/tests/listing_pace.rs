//! How fast a listing in key ranges goes when each LIST page takes 100 ms and nothing else
//! takes time (tokio's paused clock): the cutting's own pace, free of the machine's noise,
//! printed for three shapes of keyspace (`KEYS`, default 1,000,000; `SHAPES=flat,hex,bench`).
//! A benchmark, not a test (ignored; about 5 minutes in a debug build):
//! `cargo test -p tidemark-engine --test listing_pace -- --ignored --nocapture`.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use tidemark_cloud::memory::MemoryStorage;
use tidemark_engine::listing::Listing;

/// The `i`th key of a keyspace.
type KeyOf = fn(usize) -> String;

#[tokio::test(start_paused = true)]
#[ignore]
async fn pace() {
    let n: usize = std::env::var("KEYS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let shapes: [(&str, KeyOf); 3] = [
        // `tidemark-bench reconcile`'s keys: directories of 100 keys whose names no page foresees.
        ("bench", |i| format!("data/{:03}/{:03}/obj-{i:08}.bin", i / 10_000, (i / 100) % 100)),
        ("flat", |i| format!("k{i:08}")),
        ("hex", |i| format!("{:016x}", (i as u64).wrapping_mul(0x9E3779B97F4A7C15))),
    ];
    let only = std::env::var("SHAPES").unwrap_or_default();
    for (shape, key) in shapes {
        if !only.is_empty() && !only.split(',').any(|s| s == shape) {
            continue;
        }
        let slow = tidemark_testkit::SlowLists::new(MemoryStorage::default(), Duration::from_millis(100));
        for i in 0..n {
            slow.inner.insert(&key(i), Bytes::from_static(b"x"), BTreeMap::new()).unwrap();
        }
        for ranges in [1, 16] {
            slow.reset();
            let t = tokio::time::Instant::now();
            let mut l = Listing::new(&slow, "", 1000, ranges);
            let mut got = 0;
            while let Some(p) = l.next_page().await.unwrap() {
                got += p.len();
            }
            assert_eq!(got, n);
            eprintln!(
                "{shape} {n} keys, {ranges} ranges: {:.1} s, {} LISTs, {} ranges, at most {} at once",
                t.elapsed().as_secs_f64(),
                l.requests,
                l.splits,
                slow.most_at_once()
            );
        }
    }
}

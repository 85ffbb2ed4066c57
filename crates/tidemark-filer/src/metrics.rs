//! The filer's Prometheus `/metrics`: the content cache's counters and gauges.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use tidemark_core::cache::CacheStats;

/// The cache's figures as OpenMetrics text.
pub fn render(s: &CacheStats) -> Result<String, std::fmt::Error> {
    // The registry ends each help text with a period itself.
    let mut r = Registry::default();
    let counters: [(&str, &str, u64); 10] = [
        ("tidemark_cache_hits", "Chunks of remote-backed files served from the cache.", s.hits),
        ("tidemark_cache_misses", "Chunks fetched from the bucket because they were not cached.", s.misses),
        ("tidemark_cache_requests", "Ranged GETs the cache sent to buckets (one fills a run of chunks).", s.requests),
        ("tidemark_cache_fetched_bytes", "Bytes fetched from buckets by the cache.", s.bytes_fetched),
        ("tidemark_cache_served_bytes", "Bytes served from the cache.", s.bytes_served),
        ("tidemark_cache_evictions", "Chunks evicted to keep the cache within its budget.", s.evictions),
        ("tidemark_cache_evicted_bytes", "Bytes evicted to keep the cache within its budget.", s.evicted_bytes),
        (
            "tidemark_cache_read_back",
            "Chunks a read took back from the cache's disk just after fetching them ahead of it.",
            s.read_back,
        ),
        (
            "tidemark_cache_resumed",
            "GETs that resumed a bucket's stream broken mid-object, from the first byte not yet received.",
            s.resumed,
        ),
        (
            "tidemark_cache_header_heads",
            "HEADs that asked a bucket for the headers of an object whose entry came from a listing (once per object).",
            s.header_heads,
        ),
    ];
    for (name, help, v) in counters {
        r.register(name, help.trim_end_matches('.'), ConstCounter::new(v));
    }
    let gauges: [(&str, &str, u64); 4] = [
        ("tidemark_cache_resident_bytes", "Bytes of remote-backed files held in the cache now.", s.resident_bytes),
        ("tidemark_cache_resident_chunks", "Chunks held in the cache now.", s.resident_chunks),
        ("tidemark_cache_budget_bytes", "The cache's budget (--cache-size); 0 when it is off.", s.budget_bytes),
        ("tidemark_cache_chunk_bytes", "The size of one cached chunk.", s.chunk_bytes),
    ];
    for (name, help, v) in gauges {
        r.register(name, help.trim_end_matches('.'), ConstGauge::new(v as i64));
    }
    let requests = Family::<Vec<(String, String)>, Counter>::default();
    for (remote, ops) in &s.remote_requests {
        for (op, n) in ops {
            requests.get_or_create(&vec![("remote".into(), remote.clone()), ("op".into(), op.clone())]).inc_by(*n);
        }
    }
    r.register(
        "tidemark_remote_requests",
        "The filer's requests to buckets (the cache's GETs and HEADs, the outbound sync's writes), by remote and operation",
        requests,
    );
    let mut out = String::new();
    encode(&mut out, &r)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_figure() {
        let mut s = CacheStats { hits: 3, misses: 1, resident_bytes: 42, budget_bytes: 100, ..Default::default() };
        s.remote_requests.entry("s3".into()).or_default().insert("GET".into(), 7);
        let text = render(&s).unwrap();
        assert!(text.contains(r#"tidemark_remote_requests_total{remote="s3",op="GET"} 7"#), "{text}");
        assert!(text.contains("tidemark_cache_hits_total 3"), "{text}");
        assert!(text.contains("tidemark_cache_misses_total 1"), "{text}");
        assert!(text.contains("tidemark_cache_resident_bytes 42"), "{text}");
        assert!(text.contains("tidemark_cache_budget_bytes 100"), "{text}");
        assert!(text.trim_end().ends_with("# EOF"));
    }
}

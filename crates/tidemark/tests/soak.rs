//! A short soak under faults, as CI runs it: the whole cluster (two filers on PostgreSQL with a
//! blob store, two gateways, two admins, three workers, three subscriptions) for a minute of
//! SIGKILLs, pauses and restarts every few seconds and one restart of PostgreSQL; then nothing
//! lost, nothing clobbered, every entry equal to its bucket, no panic, converged in time.
//! `scripts/soak.sh MINUTES` runs a long one; `TIDEMARK_SOAK_SECS` sets this one's length.

use std::path::Path;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_soak_under_faults_loses_nothing() {
    let secs = std::env::var("TIDEMARK_SOAK_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    let cfg = tidemark_soak::SoakConfig {
        duration: Duration::from_secs(secs),
        tidemark: Path::new(env!("CARGO_BIN_EXE_tidemark")).to_path_buf(),
        fault_every: Duration::from_secs(3),
        converge_within: Duration::from_secs(120),
        seed: 7,
    };
    let report = tidemark_soak::run(cfg).await.expect("the soak runs");
    eprintln!("{report}");
    assert!(report.ok(), "{report}");
    let faults: u64 = report.faults.values().sum();
    assert!(faults >= secs / 6, "faults were injected: {report}");
    assert!(report.writes_acked > 0 && report.bucket_ops > 0, "{report}");
}

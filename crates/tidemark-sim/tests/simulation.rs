//! The simulation's CI budget: at least 1,000 seeds of the correct engine with every property
//! holding, and each deliberately broken variant caught within a few hundred seeds. A failure
//! prints its seed and the command that replays it; `TIDEMARK_SIM_SEEDS=100000` runs a long one.

use std::time::Instant;

use tidemark_sim::{Config, Report, Variant, replay_command, run};

fn seeds_from_env(default: u64) -> u64 {
    std::env::var("TIDEMARK_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn start_seed() -> u64 {
    std::env::var("TIDEMARK_SIM_START").ok().and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Runs seeds `from..from+n` of `variant`, a few at once; stops early at the first failure when
/// `stop_at_first`.
async fn run_many(from: u64, n: u64, variant: Variant, stop_at_first: bool) -> (u64, Vec<Report>) {
    run_many_with(from, n, variant, stop_at_first, 3).await
}

async fn run_many_with(
    from: u64,
    n: u64,
    variant: Variant,
    stop_at_first: bool,
    reconcile_page: usize,
) -> (u64, Vec<Report>) {
    let parallel = 4;
    let mut failures = Vec::new();
    let mut totals = Report::default();
    let mut ran = 0;
    let mut next = from;
    let mut set = tokio::task::JoinSet::new();
    while next < from + n || !set.is_empty() {
        while set.len() < parallel && next < from + n && (!stop_at_first || failures.is_empty()) {
            let seed = next;
            next += 1;
            set.spawn(async move { run(Config { variant, reconcile_page, ..Config::new(seed) }).await });
        }
        let Some(done) = set.join_next().await else { break };
        let report = done.expect("a simulation task panicked");
        ran += 1;
        totals.dropped += report.dropped;
        totals.deliveries += report.deliveries;
        totals.applied += report.applied;
        totals.stale_writes_refused += report.stale_writes_refused;
        totals.steps += report.steps;
        totals.slices += report.slices;
        totals.heads_saved += report.heads_saved;
        if !report.violations.is_empty() {
            failures.push(report);
        }
    }
    failures.sort_by_key(|r| r.seed);
    eprintln!(
        "{variant:?}: {ran} seeds, {} steps, {} slices, {} deliveries, {} applied, {} HEADs saved by memory, {} notifications dropped, {} stale-fenced batches refused",
        totals.steps,
        totals.slices,
        totals.deliveries,
        totals.applied,
        totals.heads_saved,
        totals.dropped,
        totals.stale_writes_refused
    );
    // The properties must hold with the memory in use, not merely while it never answers.
    if variant == Variant::Correct && ran >= 100 {
        assert!(totals.heads_saved > 0, "no HEAD was answered from memory in {ran} seeds: the memory is not exercised");
    }
    (ran, failures)
}

/// With pages of one key, every reconcile's listing is cut into key ranges among the keys
/// themselves (with pages of 3 the cuts fall past the six keys): the properties hold all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_properties_hold_with_listings_cut_among_the_keys() {
    let (ran, failures) = run_many_with(0, 200, Variant::Correct, false, 1).await;
    let first = failures.first().map(|r| (r.seed, r.violations.clone()));
    assert!(failures.is_empty(), "{} of {ran} seeds broke a property: {first:?}", failures.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_properties_hold_over_the_ci_seeds() {
    let n = seeds_from_env(1000);
    let began = Instant::now();
    let (ran, failures) = run_many(start_seed(), n, Variant::Correct, false).await;
    eprintln!(
        "simulation: {ran} seeds from {} in {:.1} s, {} failed",
        start_seed(),
        began.elapsed().as_secs_f64(),
        failures.len()
    );
    for r in failures.iter().take(5) {
        eprintln!(
            "seed {} failed:\n  {}\n  replay: {}",
            r.seed,
            r.violations.join("\n  "),
            replay_command(r.seed, Variant::Correct)
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {ran} seeds broke a property (first: seed {})",
        failures.len(),
        failures[0].seed
    );
}

/// A broken variant is caught by the property it breaks: a run of it fails with a violation
/// that says so (`property`), not merely with any failure (a set-up that fails would do that).
async fn caught(variant: Variant, property: &str) {
    let (ran, failures) = run_many(0, 300, variant, true).await;
    let first = failures.first().unwrap_or_else(|| panic!("{variant:?} was not caught in {ran} seeds"));
    assert!(
        first.violations.iter().any(|v| v.contains(property)),
        "{variant:?} failed at seed {}, but not as {property:?}: {:?}",
        first.seed,
        first.violations
    );
    eprintln!("{variant:?} caught at seed {} after {ran} seeds: {}", first.seed, first.violations[0]);
}

/// A message acknowledged whose change the namespace does not hold (property 3).
const ACKED_UNAPPLIED: &str = "acknowledged before its change was applied";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applier_that_trusts_the_event_payload_is_caught() {
    caught(Variant::TrustPayload, ACKED_UNAPPLIED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applier_that_skips_the_fence_is_caught() {
    caught(Variant::NoFence, "landed while the lease is at").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applier_that_acks_before_applying_is_caught() {
    caught(Variant::AckFirst, ACKED_UNAPPLIED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applier_that_trusts_its_memory_of_heads_too_long_is_caught() {
    caught(Variant::TrustMemory, ACKED_UNAPPLIED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applier_that_takes_copies_of_own_uploads_for_echoes_is_caught() {
    caught(Variant::EchoByVersion, ACKED_UNAPPLIED).await;
}

/// A listing in key ranges whose boundary is off by one loses a key: the final reconcile leaves
/// an object without its entry (property 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_in_ranges_that_loses_a_boundary_key_is_caught() {
    caught(Variant::RangeBoundary, "after the final reconcile").await;
}

/// Seeds that found real bugs, kept as regressions (each also names what it found).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeds_that_found_bugs_stay_fixed() {
    let found = [
        (
            1,
            "a user's delete under a synced mount undone by a stale event before the outbound sync ran (no tombstones)",
        ),
        (130, "the same, for two paths in one run"),
        (123, "an older delete record of a path removed the tombstone of a newer delete and re-created the entry"),
        (625, "a user's delete of a locally written file hid a newer object someone else put until a reconcile"),
        (908, "the same for a file that was never uploaded"),
    ];
    for (seed, what) in found {
        // As they ran when they found it: before the bucket saw copies, and users renames and links.
        let r = run(Config { copies: false, links: false, ..Config::new(seed) }).await;
        assert!(r.violations.is_empty(), "seed {seed} ({what}) broke again: {:?}", r.violations);
    }
    // Found once renames in a synced mount were made in place (2026-12-05), with every operation.
    let found = [
        (164, "a renamed file's object replaced at its old key: the file went, and hid a newer object at its new key"),
        (256, "carrying a rename mirrored an object at the old key that the user had deleted since"),
        (397, "a user's delete of a renamed file hid a newer object someone put at its key"),
        (450, "a local file renamed away hid a newer object someone put at its old key"),
        (1561, "a user's delete of a renamed file removed the tombstone of a later delete of its path"),
        (2476, "an old key was kept for a file renamed into its path, which then went, and the old object came back"),
        (5769, "a user's delete of a new local file deleted a restored upload of the earlier file at its path"),
        (4851, "a renamed file's delete took a restored older upload of its new path for its own in-flight upload"),
        (4860, "the same, another run"),
        (4937, "the same, another run"),
    ];
    for (seed, what) in found {
        let r = run(Config::new(seed)).await;
        assert!(r.violations.is_empty(), "seed {seed} ({what}) broke again: {:?}", r.violations);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_replays_the_same_run() {
    for seed in 0..20 {
        let a = run(Config::new(seed)).await;
        let b = run(Config::new(seed)).await;
        let key = |r: &Report| {
            (r.steps, r.deliveries, r.applied, r.received, r.dropped, r.stale_writes_refused, r.violations.clone())
        };
        assert_eq!(key(&a), key(&b), "seed {seed} ran differently twice");
    }
}

/// `TIDEMARK_SIM_SEED=N [TIDEMARK_SIM_VARIANT=NoFence] cargo test -p tidemark-sim --test simulation replay -- --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay() {
    let Some(seed) = std::env::var("TIDEMARK_SIM_SEED").ok().and_then(|s| s.parse().ok()) else { return };
    let variant = match std::env::var("TIDEMARK_SIM_VARIANT").as_deref() {
        Ok("TrustPayload") => Variant::TrustPayload,
        Ok("NoFence") => Variant::NoFence,
        Ok("AckFirst") => Variant::AckFirst,
        Ok("TrustMemory") => Variant::TrustMemory,
        Ok("EchoByVersion") => Variant::EchoByVersion,
        Ok("RangeBoundary") => Variant::RangeBoundary,
        _ => Variant::Correct,
    };
    let r = run(Config { variant, ..Config::new(seed) }).await;
    for line in &r.trace {
        eprintln!("{line}");
    }
    eprintln!("violations: {:#?}", r.violations);
    assert!(r.violations.is_empty(), "seed {seed} ({variant:?}) broke a property");
}

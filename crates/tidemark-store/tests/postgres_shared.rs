//! What sharing one PostgreSQL database between several filers relies on, beyond the
//! conformance suite: each `PgStore` handle here stands for one filer.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tidemark_core::model::{Content, NewEntry, Origin, Precondition, Txn};
use tidemark_core::{Error, MetaStore};
use tidemark_store::PgStore;
use tidemark_testkit::Postgres;

fn file(size: u64) -> NewEntry {
    NewEntry::file(size, 1_000, Content::Empty)
}

async fn psql(url: &str, sql: &str) -> String {
    let out = tokio::process::Command::new("psql")
        .args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_on_two_filers_make_one_dense_change_log_that_a_follower_reads_exactly_once() {
    let pg = Postgres::get();
    let url = pg.fresh_database("shared");
    let a: Arc<dyn MetaStore> = Arc::new(PgStore::connect(&url).await.unwrap());
    let b: Arc<dyn MetaStore> = Arc::new(PgStore::connect(&url).await.unwrap());
    a.apply(Txn::put("/race", file(0), Origin::Local)).await.unwrap();

    // A follower on filer B, following from before the writes, reading the log as an outbound
    // sync does, until it has reached the last record the writers made.
    let start = a.last_seq().await.unwrap();
    let (done_tx, mut done) = tokio::sync::watch::channel(None::<u64>);
    let follower = {
        let b = b.clone();
        tokio::spawn(async move {
            let mut rx = b.subscribe();
            let (mut seen, mut after) = (Vec::new(), start);
            loop {
                let page = b.changes(after, 37).await.unwrap();
                if let Some(last) = page.last() {
                    after = last.seq;
                    seen.extend(page);
                    continue;
                }
                if done.borrow().is_some_and(|end| after >= end) {
                    return seen;
                }
                let woken = tokio::time::timeout(Duration::from_secs(30), async {
                    tokio::select! { _ = rx.changed() => {}, _ = done.changed() => {} }
                });
                woken.await.expect("no wake-up within 30 s while records were missing");
            }
        })
    };

    // 2 filers x 4 writers x 50 puts of their own keys, and every writer also races a CAS on
    // /race each round: exactly one CAS per version may win, whichever filer it goes through.
    let mut tasks = Vec::new();
    for (f, store) in [a.clone(), b.clone()].into_iter().enumerate() {
        for w in 0..4 {
            let s = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut wins = 0;
                for i in 0..50 {
                    s.apply(Txn::put(format!("/f{f}/w{w}/k{i:02}"), file(i), Origin::Remote)).await.unwrap();
                    if i % 25 == 0 {
                        let v = s.get("/race").await.unwrap().unwrap().version;
                        let cas = Txn::put("/race", file(i), Origin::Local).with_precondition(Precondition::Version(v));
                        match s.apply(cas).await {
                            Ok(_) => wins += 1,
                            Err(Error::PreconditionFailed { .. }) => {}
                            Err(e) => panic!("unexpected {e}"),
                        }
                    }
                }
                wins
            }));
        }
    }
    let mut wins = 0;
    for t in tasks {
        wins += t.await.unwrap();
    }
    assert!(wins >= 1, "some CAS must win");
    done_tx.send(Some(a.last_seq().await.unwrap())).unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(60), follower).await.unwrap().unwrap();
    let expected = 400 + 2 + 8 + wins; // the puts, the /fF and /fF/wW parents, the CAS winners
    let all = a.changes(start, 10_000).await.unwrap();
    assert_eq!(all.len(), expected, "every write has its record");
    assert!(all.windows(2).all(|w| w[0].seq + 1 == w[1].seq), "dense and in order");
    assert_eq!(all, seen, "the follower on the other filer saw every record, in order, once");
    let keys: BTreeSet<&str> = all.iter().filter(|c| c.path.contains("/k")).map(|c| c.path.as_str()).collect();
    assert_eq!(keys.len(), 400);
    assert_eq!(a.last_seq().await.unwrap(), b.last_seq().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_through_one_filer_wakes_a_waiter_on_another_at_once() {
    let pg = Postgres::get();
    let url = pg.fresh_database("notify");
    let a = PgStore::connect(&url).await.unwrap();
    let b = PgStore::connect(&url).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // B's listener is up
    let mut rx = b.subscribe();
    rx.borrow_and_update();
    let t = std::time::Instant::now();
    let applied = a.apply(Txn::put("/n", file(1), Origin::Local)).await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), rx.wait_for(|s| *s >= applied.seq)).await.unwrap().unwrap();
    // NOTIFY, not the 5 s backstop poll.
    assert!(t.elapsed() < Duration::from_secs(2), "woken after {:?}", t.elapsed());

    // Cut B's listening connection (as a database restart or a network blip would): B
    // reconnects and still learns of commits made meanwhile.
    psql(
        &url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()",
    )
    .await;
    let later = a.apply(Txn::put("/n2", file(1), Origin::Local)).await.unwrap();
    tokio::time::timeout(Duration::from_secs(15), rx.wait_for(|s| *s >= later.seq)).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filers_starting_together_migrate_once() {
    let pg = Postgres::get();
    let url = pg.fresh_database("migrate");
    let starts: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn({
                let url = url.clone();
                async move { PgStore::connect(&url).await }
            })
        })
        .collect();
    for s in starts {
        s.await.unwrap().unwrap();
    }
    assert_eq!(
        psql(&url, "SELECT string_agg(version::text, ',' ORDER BY version) FROM tidemark_schema").await,
        "1,2,3"
    );
    assert_eq!(psql(&url, "SELECT count(*) FROM entries").await, "1", "one root");

    // A database written by a newer Tidemark is refused, not half-used.
    psql(&url, "INSERT INTO tidemark_schema (version) VALUES (99)").await;
    let err = PgStore::connect(&url).await.err().expect("refused").to_string();
    assert!(err.contains("newer Tidemark") && err.contains("schema version 99"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_unreachable_servers_say_what_is_wrong() {
    let err = PgStore::connect("postgres://tm:s3cret@127.0.0.1:1/tm").await.err().expect("refused").to_string();
    assert!(err.contains("cannot connect to PostgreSQL at 127.0.0.1:1/tm") && !err.contains("s3cret"), "{err}");
    let err = PgStore::connect("postgres://tm:s3cret@127.0.0.1/tm?sslmode=bogus").await.err().expect("refused");
    assert!(matches!(err, Error::InvalidArgument { .. }) && !err.to_string().contains("s3cret"), "{err}");
    let pg = Postgres::get();
    // TLS required of a server that has none: refused, saying so (never a silent plain connection).
    let plain = format!("{}?sslmode=require", pg.fresh_database("plain"));
    let err = PgStore::connect(&plain).await.err().expect("refused").to_string();
    assert!(err.contains("TLS"), "{err}");
    let missing = format!("{}_missing", pg.fresh_database("gone"));
    let err = PgStore::connect(&missing).await.err().expect("refused").to_string();
    assert!(err.contains("does not exist"), "{err}");
}

/// A writer that gives up mid-transaction (its future dropped at any point: before the lock, with
/// the lock held, while the commit is in flight) leaves its batch whole or absent, never part of
/// it; the connection it held is not reused half-way through a transaction, and every filer
/// keeps writing. Batches from two filers at once interleave whole in one dense change log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_cut_off_at_any_point_land_whole_or_not_at_all() {
    use tidemark_core::model::TxnBatch;
    let pg = Postgres::get();
    let url = pg.fresh_database("cutoff");
    let a: Arc<dyn MetaStore> = Arc::new(PgStore::connect(&url).await.unwrap());
    let b: Arc<dyn MetaStore> = Arc::new(PgStore::connect(&url).await.unwrap());
    const PER: usize = 20;
    let batch = |tag: &str| TxnBatch {
        fence: None,
        txns: (0..PER).map(|i| Txn::put(format!("/cut/{tag}/{i:02}"), file(i as u64), Origin::Remote)).collect(),
    };
    let start = a.last_seq().await.unwrap();
    // Filer B writes steadily; filer A's batches are cut off after 0 to 30 ms.
    let steady = {
        let b = b.clone();
        tokio::spawn(async move {
            for i in 0..30 {
                let out = b.apply_many(batch(&format!("b{i:02}"))).await.unwrap();
                assert!(out.iter().all(|r| r.is_ok()));
            }
        })
    };
    let mut cut = 0;
    for i in 0..60u64 {
        let tag = format!("a{i:02}");
        let s = a.clone();
        let t = batch(&tag);
        match tokio::time::timeout(Duration::from_micros(i % 12 * 2_500 + (i * 137) % 900), s.apply_many(t)).await {
            Ok(r) => assert!(r.unwrap().iter().all(|r| r.is_ok())),
            Err(_) => cut += 1,
        }
    }
    steady.await.unwrap();
    // The store still works through A, and every batch is all there or not there at all.
    a.apply(Txn::put("/cut/after", file(0), Origin::Local)).await.unwrap();
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    let mut after: Option<String> = None;
    loop {
        let page = a.scan("/cut", after.as_deref(), 500).await.unwrap();
        for e in page.entries.iter().filter(|e| !e.is_dir()) {
            let tag = e.path.split('/').nth(2).unwrap().to_string();
            *counts.entry(tag).or_default() += 1;
        }
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    for (tag, n) in &counts {
        assert!(*n == PER || tag == "after", "batch {tag} landed {n} of {PER} transactions");
    }
    assert_eq!(counts.keys().filter(|t| t.starts_with('b')).count(), 30, "every batch of the steady filer landed");
    let log = a.changes(start, 100_000).await.unwrap();
    assert!(log.windows(2).all(|w| w[0].seq + 1 == w[1].seq), "the change log stays dense");
    let landed = counts.keys().filter(|t| t.starts_with('a')).count();
    eprintln!("{cut} of filer A's 60 batches cut off; {landed} landed whole, the rest not at all");
    assert!(cut > 0 && cut < 60, "the cut-offs must cut some batches off and let some finish: {cut} of 60 cut");
}

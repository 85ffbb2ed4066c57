//! The full reconcile against the in-memory bucket and a real (in-process) filer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use tidemark_cloud::memory::MemoryStorage;
use tidemark_core::decide::SkipReason;
use tidemark_core::model::{Content, EntryKind};
use tidemark_core::remote::{Mount, RemoteLocation};
use tidemark_core::{ByteStream, Filer, WriteOptions};
use tidemark_engine::reconcile::{Item, ReconcileOptions, ReconcileReport, reconcile};
use tidemark_engine::write::Outcome;
use tidemark_filer::{DataDir, LocalFiler};

struct World {
    filer: Arc<LocalFiler>,
    bucket: MemoryStorage,
    mount: Mount,
    _dir: tempfile::TempDir,
}

async fn world(prefix: &str) -> World {
    let dir = tempfile::tempdir().unwrap();
    let filer = Arc::new(LocalFiler::open(DataDir::open(dir.path()).unwrap()).unwrap());
    let mount = Mount {
        dir: "/mnt/data".into(),
        location: RemoteLocation { storage: "mem".into(), bucket: "b".into(), path: prefix.into() },
        sync: false,
    };
    let dir_entry = tidemark_core::model::NewEntry::dir(0);
    let txn = tidemark_core::model::Txn::put("/mnt/data", dir_entry, tidemark_core::model::Origin::System);
    filer.apply(txn).await.unwrap();
    World { filer, bucket: MemoryStorage::default(), mount, _dir: dir }
}

async fn sync(w: &World, opts: &ReconcileOptions) -> (ReconcileReport, Vec<Item>) {
    let mut items = Vec::new();
    let report = reconcile(&*w.filer, &w.bucket, &w.mount, opts, &mut |i: &Item| items.push(i.clone())).await.unwrap();
    (report, items)
}

fn body(s: &str) -> ByteStream {
    futures::stream::iter([Ok(Bytes::copy_from_slice(s.as_bytes()))]).boxed()
}

fn put(w: &World, key: &str, body: &str) {
    w.bucket.insert(key, Bytes::copy_from_slice(body.as_bytes()), BTreeMap::new()).unwrap();
}

async fn files(w: &World) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let mut after = None;
    loop {
        let p = w.filer.scan("/mnt/data", after.as_deref(), 1000).await.unwrap();
        for e in &p.entries {
            if e.kind == EntryKind::File {
                out.insert(e.path.clone(), e.size);
            }
        }
        match p.next {
            Some(n) => after = Some(n),
            None => return out,
        }
    }
}

fn outcome_of<'a>(items: &'a [Item], path: &str) -> Option<&'a Outcome> {
    items.iter().find_map(|i| match i {
        Item::Path { path: p, outcome } if p == path => Some(outcome),
        _ => None,
    })
}

#[tokio::test]
async fn baseline_then_changes_converge_and_a_second_run_changes_nothing() {
    let w = world("").await;
    for k in ["a", "a b", "a+b", "a%20b", "ü/ß", "deep/x/y/z", "a-b", "a0", "dir/", "dir/inside"] {
        put(&w, k, k);
    }
    // A file/directory conflict: `c` is a file and `c/d` needs `c` as a directory.
    put(&w, "c", "file");
    put(&w, "c/d", "below");
    // Hostile keys are refused, counted, and nothing escapes the mount.
    put(&w, "../escape", "x");
    put(&w, "x//y", "x");
    let (report, items) = sync(&w, &ReconcileOptions::default()).await;
    let got = files(&w).await;
    for k in ["a", "a b", "a+b", "a%20b", "ü/ß", "deep/x/y/z", "a-b", "a0", "dir/inside", "c"] {
        assert_eq!(
            got.get(&format!("/mnt/data/{k}")),
            Some(&(k.len() as u64).max(if k == "c" { 4 } else { 0 })),
            "{k}"
        );
    }
    assert_eq!(w.filer.stat("/mnt/data/dir").await.unwrap().unwrap().kind, EntryKind::Dir);
    assert!(!got.contains_key("/mnt/data/c/d"));
    assert_eq!(outcome_of(&items, "/mnt/data/c/d"), Some(&Outcome::Skipped(SkipReason::Conflict)));
    assert_eq!(report.rejected_keys.get("dot_segment"), Some(&1));
    assert_eq!(report.rejected_keys.get("empty_segment"), Some(&1));
    assert!(w.filer.stat("/mnt/escape").await.unwrap().is_none());
    assert_eq!(report.created, 11, "9 files, the dir marker and c: {report:?}");
    let e = w.filer.stat("/mnt/data/a b").await.unwrap().unwrap();
    assert_eq!(e.content, Content::Remote, "metadata only: content stays remote");
    assert_eq!(e.remote.as_ref().unwrap().storage, "mem");

    let (again, _) = sync(&w, &ReconcileOptions::default()).await;
    assert_eq!(again.changes(), 0, "a second run on an unchanged bucket changes nothing: {}", again.summary());

    // Change, add, delete directly in the bucket.
    put(&w, "a", "changed!");
    put(&w, "new/file", "n");
    w.bucket.remove("a b").unwrap();
    w.bucket.remove("deep/x/y/z").unwrap();
    let (r, items) = sync(&w, &ReconcileOptions::default()).await;
    assert_eq!((r.created, r.updated), (1, 1), "{}", r.summary());
    assert_eq!(outcome_of(&items, "/mnt/data/a"), Some(&Outcome::Updated));
    assert_eq!(outcome_of(&items, "/mnt/data/a b"), Some(&Outcome::Deleted));
    let got = files(&w).await;
    assert_eq!(got.get("/mnt/data/a"), Some(&8));
    assert!(!got.contains_key("/mnt/data/a b") && !got.contains_key("/mnt/data/deep/x/y/z"));
    // The implied directories left empty went with their last file.
    for d in ["/mnt/data/deep", "/mnt/data/deep/x", "/mnt/data/deep/x/y"] {
        assert!(w.filer.stat(d).await.unwrap().is_none(), "{d} should be gone");
    }
    assert!(w.filer.stat("/mnt/data").await.unwrap().is_some(), "the mount directory stays");
}

#[tokio::test]
async fn local_only_and_locally_dirty_entries_are_never_touched() {
    let w = world("").await;
    put(&w, "synced", "remote v1");
    put(&w, "gone", "remote");
    sync(&w, &ReconcileOptions::default()).await;
    // A local-only file, and a local write to a synced file (now locally dirty).
    let body =
        |s: &'static str| -> ByteStream { Box::pin(futures::stream::iter([Ok(Bytes::from_static(s.as_bytes()))])) };
    w.filer.write("/mnt/data/mine", body("local only"), WriteOptions::default()).await.unwrap();
    w.filer.write("/mnt/data/synced", body("local edit"), WriteOptions::default()).await.unwrap();
    w.filer.write("/mnt/data/gone", body("edited too"), WriteOptions::default()).await.unwrap();
    put(&w, "synced", "remote v2 is longer");
    w.bucket.remove("gone").unwrap();
    let (r, items) = sync(&w, &ReconcileOptions::default()).await;
    assert_eq!(r.changes(), 0, "{}", r.summary());
    assert_eq!(outcome_of(&items, "/mnt/data/mine"), Some(&Outcome::Skipped(SkipReason::LocalOnly)));
    assert_eq!(outcome_of(&items, "/mnt/data/synced"), Some(&Outcome::Skipped(SkipReason::LocalDirty)));
    assert_eq!(outcome_of(&items, "/mnt/data/gone"), Some(&Outcome::Skipped(SkipReason::LocalDirty)));
    let got = files(&w).await;
    assert_eq!(got["/mnt/data/mine"], 10);
    assert_eq!(got["/mnt/data/synced"], 10);
    assert_eq!(got["/mnt/data/gone"], 10);
}

#[tokio::test]
async fn dry_run_writes_nothing_and_delete_false_keeps_entries() {
    let w = world("photos").await;
    put(&w, "photos/1.jpg", "one");
    put(&w, "photos/2.jpg", "two");
    put(&w, "other/x", "not mounted");
    let (r, items) = sync(&w, &ReconcileOptions { dry_run: true, ..Default::default() }).await;
    assert_eq!(r.created, 2);
    assert_eq!(items.len(), 2, "keys outside the prefix are not listed at all");
    assert!(files(&w).await.is_empty(), "dry run wrote nothing");
    sync(&w, &ReconcileOptions::default()).await;
    assert_eq!(files(&w).await.len(), 2);
    w.bucket.remove("photos/1.jpg").unwrap();
    let (r, _) = sync(&w, &ReconcileOptions { delete: false, ..Default::default() }).await;
    assert_eq!(r.deleted, 0);
    assert!(files(&w).await.contains_key("/mnt/data/1.jpg"));
    let (r, _) = sync(&w, &ReconcileOptions::default()).await;
    assert_eq!(r.deleted, 1);
}

/// The merge-join against a model, over many small random buckets and local states, at page
/// sizes that put page boundaries everywhere.
#[tokio::test]
async fn merge_join_matches_a_model_at_every_page_size() {
    let alphabet = ["a", "a-b", "a0", "b", "a/b", "a/c", "a/b/c", "b/x", "c d", "ü"];
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for round in 0..150 {
        let w = world("").await;
        let mut first: BTreeSet<&str> = BTreeSet::new();
        for k in alphabet {
            if next() % 2 == 0 {
                first.insert(k);
            }
        }
        for k in &first {
            put(&w, k, k);
        }
        let page = (next() % 4 + 1) as usize;
        let opts = ReconcileOptions { page_size: page, ..Default::default() };
        sync(&w, &opts).await;
        // Change the bucket: drop some, add some.
        let mut second = BTreeSet::new();
        for k in alphabet {
            if next() % 3 != 0 {
                second.insert(k);
            }
        }
        for k in &first {
            if !second.contains(k) {
                w.bucket.remove(k).unwrap();
            }
        }
        for k in &second {
            put(&w, k, &format!("{k}{k}"));
        }
        sync(&w, &opts).await;
        // The model: every key, except those that need a path to be both a file and a directory.
        let got = files(&w).await;
        for k in &second {
            let p = format!("/mnt/data/{k}");
            let clash = second.iter().any(|o| o.starts_with(&format!("{k}/")))
                || second.iter().any(|o| k.starts_with(&format!("{o}/")));
            if !clash {
                assert_eq!(got.get(&p), Some(&(2 * k.len() as u64)), "round {round} page {page}: {p} in {got:?}");
            }
        }
        for p in got.keys() {
            let k = p.strip_prefix("/mnt/data/").unwrap();
            assert!(second.contains(k), "round {round} page {page}: {p} has no object");
        }
        let (again, _) = sync(&w, &opts).await;
        assert_eq!(again.changes(), 0, "round {round} page {page}: {}", again.summary());
    }
}

/// A subtree reconcile looks at one path of the mount and everything below it, by the same
/// rules as a whole one, and leaves the rest alone: it brings in the keys a file stood in the way
/// of once the file is gone, removes a directory whose keys all went (and gives a file key its
/// path), and cleans up after a directory deleted or renamed as a whole.
#[tokio::test]
async fn a_subtree_reconcile_decides_one_path_and_what_is_below_it() {
    use tidemark_engine::reconcile::{reconcile_subtree, remove_if_emptied};
    let w = world("p").await;
    let opts = ReconcileOptions::default();
    let subtree = |at: &'static str| {
        let (filer, bucket, mount, opts) = (w.filer.clone(), w.bucket.clone(), w.mount.clone(), opts.clone());
        async move { reconcile_subtree(&*filer, &bucket, &mount, at, &opts, &mut |_| {}).await.unwrap() }
    };
    // `logs` is a file; `logs/day1.txt` cannot be a path while it is.
    put(&w, "p/logs", "a file");
    put(&w, "p/logs/day1.txt", "shadowed");
    put(&w, "p/other.txt", "elsewhere");
    let (first, _) = sync(&w, &opts).await;
    assert_eq!(first.skipped.get("shadowed: a file or directory is in its way"), Some(&1), "{first:?}");
    // The file goes; a subtree reconcile of its path brings in what it hid, and nothing else.
    w.bucket.remove("p/logs").unwrap();
    put(&w, "p/other.txt", "changed, not looked at");
    let r = subtree("/mnt/data/logs").await;
    assert_eq!((r.created, r.deleted, r.updated), (1, 1, 0), "{r:?}");
    let f = files(&w).await;
    assert_eq!(f.get("/mnt/data/logs/day1.txt"), Some(&8));
    assert_eq!(f.get("/mnt/data/other.txt"), Some(&9), "outside the subtree: untouched");

    // The reverse: the last key under `logs/` goes and a file `logs` is put: the emptied
    // directory is removed and the file has its path.
    put(&w, "p/logs", "a file again");
    w.bucket.remove("p/logs/day1.txt").unwrap();
    let mut del = w.filer.stat("/mnt/data/logs/day1.txt").await.unwrap().unwrap().version;
    del = w
        .filer
        .delete(
            "/mnt/data/logs/day1.txt",
            tidemark_core::DeleteOptions {
                precondition: tidemark_core::model::Precondition::Version(del),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .seq;
    assert!(del > 0);
    let r = remove_if_emptied(&*w.filer, &w.bucket, &w.mount, "/mnt/data/logs", &opts, &mut |_| {}).await.unwrap();
    assert_eq!((r.created, r.deleted), (1, 1), "{r:?}");
    let e = w.filer.stat("/mnt/data/logs").await.unwrap().unwrap();
    assert_eq!((e.kind, e.size), (EntryKind::File, 12));

    // A directory deleted as a whole (one event for the subtree), and one renamed.
    for k in ["p/d/a", "p/d/b/c", "p/d/b/e"] {
        put(&w, k, "x");
    }
    sync(&w, &opts).await;
    for k in ["p/d/a", "p/d/b/c", "p/d/b/e"] {
        w.bucket.remove(k).unwrap();
    }
    for k in ["p/n/a", "p/n/b/c", "p/n/b/e"] {
        put(&w, k, "x");
    }
    let gone = subtree("/mnt/data/d").await;
    assert_eq!(gone.deleted, 3 + 2, "three files, then b and d themselves: {gone:?}");
    assert!(w.filer.stat("/mnt/data/d").await.unwrap().is_none());
    let came = subtree("/mnt/data/n").await;
    assert_eq!(came.created, 3, "{came:?}");
    assert_eq!(files(&w).await.keys().filter(|p| p.starts_with("/mnt/data/n/")).count(), 3);
    // A whole reconcile afterwards agrees: nothing left to do.
    let (last, _) = sync(&w, &opts).await;
    assert_eq!((last.created, last.updated, last.deleted), (0, 0, 0), "{last:?}");
}

/// The listing in key ranges at once (`listing::Listing`) hands out exactly the keys a single
/// sequential stream of pages gives, in the same order, whatever the keyspace — flat, deep,
/// skewed into one prefix, hostile (`..`, `//`, control characters, non-ASCII, the last code
/// point) — the prefix, the page size and the bound on ranges; and it splits when it can.
#[test]
fn a_listing_in_key_ranges_is_the_sequential_listing() {
    use proptest::prelude::*;
    use tidemark_engine::listing::Listing;
    let piece = prop::sample::select(vec![
        "a",
        "b",
        "z",
        "0",
        "9",
        "/",
        "//",
        "..",
        " ",
        "+",
        "%2F",
        "é",
        "日本",
        "\u{1}",
        "\u{7f}",
        "\u{10FFFF}",
        "a/b/",
        "k000",
        "k001",
        "k999",
        "~",
    ]);
    let key = prop::collection::vec(piece, 1..6).prop_map(|p| p.concat());
    let skewed = prop::collection::vec(prop::sample::select(vec!["0", "1", "2", "9"]), 1..5)
        .prop_map(|p| format!("logs/2026/{}", p.concat()));
    let keys = prop::collection::btree_set(prop_oneof![key, skewed], 0..120);
    let prefix = prop::sample::select(vec!["", "a", "a/", "logs/", "logs/2026/1", "nothing"]);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let cfg = ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() };
    proptest!(cfg, |(keys in keys, prefix in prefix, page in 1usize..6, ranges in 1usize..9)| {
        let bucket = MemoryStorage::default();
        for k in &keys {
            bucket.insert(k, Bytes::from_static(b"x"), BTreeMap::new()).unwrap();
        }
        let want: Vec<String> = keys.iter().filter(|k| k.starts_with(prefix)).cloned().collect();
        let (got, requests, splits) = rt.block_on(async {
            let mut l = Listing::new(&bucket, prefix, page, ranges);
            let mut got = Vec::new();
            while let Some(p) = l.next_page().await.unwrap() {
                assert!(!p.is_empty() && p.len() <= page, "a page of {} keys", p.len());
                got.extend(p.into_iter().map(|o| o.key));
            }
            (got, l.requests, l.splits)
        });
        prop_assert_eq!(&got, &want, "prefix {:?}, page {}, ranges {}", prefix, page, ranges);
        prop_assert!(ranges > 1 || splits == 1, "one range when asked for one");
        // Every range lists at least once; past that, a request is a page of keys or the end
        // of a range.
        prop_assert!(requests <= (want.len() / page) as u64 + 2 * splits, "{} requests, {} splits", requests, splits);
    });
}

/// A whole reconcile with its listing in key ranges decides and writes exactly what the
/// sequential one does, item by item in the same order, over random buckets and namespaces.
#[tokio::test]
async fn a_reconcile_in_key_ranges_decides_as_the_sequential_one() {
    let alphabet = ["a", "a-b", "a0", "b", "a/b", "a/c", "a/b/c", "b/x", "c d", "ü", "z/1", "z/2", "z/3", "..", "x//y"];
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let label = |items: &[Item]| -> Vec<String> {
        items
            .iter()
            .map(|i| match i {
                Item::Path { path, outcome } => format!("{path} {}", outcome.label()),
                Item::RejectedKey { key, reason } => format!("{key:?} {}", reason.as_str()),
            })
            .collect()
    };
    for round in 0..60 {
        let (seq, par) = (world("").await, world("").await);
        let mut keys = Vec::new();
        for k in alphabet {
            if next() % 2 == 0 {
                keys.push(k);
            }
        }
        let page = (next() % 3 + 1) as usize;
        // A namespace that already holds some of it, and a local-only file.
        for w in [&seq, &par] {
            for k in &keys {
                put(w, k, k);
            }
            let opts = ReconcileOptions { page_size: page, ranges: 1, ..Default::default() };
            sync(w, &opts).await;
            w.filer.write("/mnt/data/local-only", body("mine"), WriteOptions::default()).await.unwrap();
        }
        let mut changed = Vec::new();
        for k in alphabet {
            match next() % 3 {
                0 => changed.push((k, None)),
                1 => changed.push((k, Some(format!("{k}{k}")))),
                _ => {}
            }
        }
        for w in [&seq, &par] {
            for (k, v) in &changed {
                match v {
                    None => {
                        let _ = w.bucket.remove(k);
                    }
                    Some(v) => put(w, k, v),
                }
            }
        }
        let (r1, i1) = sync(&seq, &ReconcileOptions { page_size: page, ranges: 1, ..Default::default() }).await;
        let (r8, i8) = sync(&par, &ReconcileOptions { page_size: page, ranges: 8, ..Default::default() }).await;
        assert_eq!(label(&i1), label(&i8), "round {round}, page {page}");
        assert_eq!(files(&seq).await, files(&par).await, "round {round}, page {page}");
        assert_eq!((r1.changes(), r1.objects_listed), (r8.changes(), r8.objects_listed), "round {round}");
        assert_eq!(r1.list_ranges, 1, "{}", r1.summary());
    }
}

/// Flat (`k0000`…), skewed (almost everything under one prefix) and deep keyspaces are listed
/// as several ranges at once, never more than the bound, and as one stream when the bound is 1.
#[tokio::test]
async fn keyspaces_of_every_shape_are_listed_in_ranges_at_once() {
    use tidemark_engine::listing::Listing;
    let flat: Vec<String> = (0..2000).map(|i| format!("k{i:04}")).collect();
    let skewed: Vec<String> =
        (0..2000).map(|i| if i % 100 == 0 { format!("a{i}") } else { format!("logs/2026/12/{i:05}.json") }).collect();
    let deep: Vec<String> = (0..2000).map(|i| format!("{}/{}/{}/f{i}", i % 3, i % 7, i % 11)).collect();
    for (shape, keys) in [("flat", flat), ("skewed", skewed), ("deep", deep)] {
        let slow = tidemark_testkit::SlowLists::new(MemoryStorage::default(), std::time::Duration::from_millis(5));
        for k in &keys {
            slow.inner.insert(k, Bytes::from_static(b"x"), BTreeMap::new()).unwrap();
        }
        let mut want = keys.clone();
        want.sort();
        for ranges in [1, 8] {
            slow.reset();
            let mut l = Listing::new(&slow, "", 50, ranges);
            let mut got = Vec::new();
            while let Some(p) = l.next_page().await.unwrap() {
                got.extend(p.into_iter().map(|o| o.key));
            }
            assert!(got == want, "{shape}, {ranges} ranges: the same keys in the same order");
            let most = slow.most_at_once();
            eprintln!("{shape}, {ranges} ranges: {} LISTs, {} ranges, at most {most} at once", l.requests, l.splits);
            if ranges == 1 {
                assert_eq!((most, l.splits, l.requests), (1, 1, 40), "{shape}: one stream of 40 pages");
            } else {
                assert!(most > 1 && most <= ranges, "{shape}: {most} LISTs at once");
                assert!(l.requests <= 2 * 40 + 8, "{shape}: {} LISTs for 40 pages", l.requests);
            }
        }
    }
}

//! The `MetaStore` conformance suite. Every backend's tests invoke [`metastore_conformance!`]
//! with a factory, which expands to one test per function below; a backend that passes them all
//! honours the contract in `tidemark_core::store`.
//!
//! The functions panic on a violated expectation, like any test.

use std::any::Any;
use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use tidemark_core::cache::{CachedChunk, content_id};
use tidemark_core::model::{
    Content, Entry, EntryKind, MAX_BATCH, Mutation, NewEntry, Origin, Precondition, RemoteEntry, Txn, TxnBatch,
};
use tidemark_core::{Error, ManualClock, MetaStore};

/// Moves the store's clock forward: a manual clock for embedded stores, a sleep for a store
/// whose clock is a database server's.
#[async_trait]
pub trait Advance: Send + Sync {
    async fn advance_ms(&self, ms: i64);
}

#[async_trait]
impl Advance for ManualClock {
    async fn advance_ms(&self, ms: i64) {
        ManualClock::advance_ms(self, ms)
    }
}

/// What a factory hands the suite: a fresh, empty store, its clock, and whatever must live as
/// long as the store (a temporary directory, a database).
pub struct Harness {
    pub store: Arc<dyn MetaStore>,
    pub clock: Arc<dyn Advance>,
    pub guard: Box<dyn Any + Send + Sync>,
}

/// Expands to one `#[tokio::test]` per conformance check; `$factory` is an expression that
/// evaluates to a `Future<Output = Harness>`.
#[macro_export]
macro_rules! metastore_conformance {
    ($factory:expr) => {
        $crate::metastore_conformance!(@each $factory;
            ordering_with_tricky_names, pagination_boundaries, each_precondition,
            implicit_parents_and_kind_conflicts, inline_content, versions_are_never_reused,
            lease_acquire_renew_expiry_takeover, stale_generation_write_is_rejected,
            change_log_order_and_contents, cas_race_one_winner_per_version, invalid_input_is_rejected,
            concurrent_mutations_stand_or_fail_alone,
            cache_records_follow_the_entry, cache_lru_scan_and_usage,
            a_batch_stands_or_fails_transaction_by_transaction, a_batch_whose_fence_fails_lands_nothing,
            batches_from_many_tasks_interleave_whole, get_many_answers_in_order,
            a_batch_may_write_one_path_several_times, fenced_batches_racing_a_takeover_land_whole_or_not_at_all,
            links_devices_and_owners_round_trip, a_rename_moves_a_tree_in_one_transaction,
            a_rename_follows_the_rules_of_rename_2, dir_times_follow_the_names_a_directory_gains_and_loses,
            hard_links_share_one_inode_entry_and_count_their_names);
    };
    (@each $factory:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let harness = $factory.await;
                $crate::conformance::$name(&harness).await;
            }
        )*
    };
}

fn file(size: u64) -> NewEntry {
    NewEntry::file(size, 1_000, Content::Empty)
}

async fn put(s: &dyn MetaStore, path: &str) -> u64 {
    s.apply(Txn::put(path, file(0), Origin::Local)).await.unwrap_or_else(|e| panic!("put {path}: {e}")).seq
}

async fn all_children(s: &dyn MetaStore, dir: &str, page: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let p = s.list(dir, after.as_deref(), page).await.unwrap();
        assert!(p.entries.len() <= page);
        out.extend(p.entries.iter().map(|e| e.path.clone()));
        match p.next {
            Some(n) => after = Some(n),
            None => return out,
        }
    }
}

async fn all_below(s: &dyn MetaStore, dir: &str, page: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let p = s.scan(dir, after.as_deref(), page).await.unwrap();
        out.extend(p.entries.iter().map(|e| e.path.clone()));
        match p.next {
            Some(n) => after = Some(n),
            None => return out,
        }
    }
}

/// Applies `txn_of(0..n)` from n tasks released at once; the results in task order.
async fn all_at_once(
    s: &Arc<dyn MetaStore>,
    n: usize,
    txn_of: impl Fn(usize) -> Txn,
) -> Vec<tidemark_core::Result<tidemark_core::model::Applied>> {
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (s, barrier, txn) = (s.clone(), barrier.clone(), txn_of(i));
            tokio::spawn(async move {
                barrier.wait().await;
                s.apply(txn).await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for handle in handles {
        out.push(handle.await.expect("a task of all_at_once panicked"));
    }
    out
}

const TRICKY: &[&str] = &["a", "a b", "a+b", "a-b", "a0", "a.b", "A", "ü", "日本", "a%2Fb", "~", "z"];

pub async fn ordering_with_tricky_names(h: &Harness) {
    let s = &*h.store;
    for name in TRICKY {
        put(s, &format!("/d/{name}")).await;
    }
    // `a` becomes a directory holding `b`, beside the file `a-b` and `a0`: byte order must put
    // `/d/a-b` < `/d/a/b` < `/d/a0` in the recursive scan, as in an S3 LIST.
    s.apply(Txn::delete("/d/a", false, Origin::Local)).await.unwrap();
    put(s, "/d/a/b").await;

    let mut expected: Vec<String> = TRICKY.iter().map(|n| format!("/d/{n}")).collect();
    expected.sort_by(|x, y| x.as_bytes().cmp(y.as_bytes()));
    assert_eq!(all_children(s, "/d", 100).await, expected, "children in byte order");

    let mut below = expected.clone();
    below.push("/d/a/b".into());
    below.sort_by(|x, y| x.as_bytes().cmp(y.as_bytes()));
    assert_eq!(all_below(s, "/d", 100).await, below, "recursive scan in byte order");
    let pos = |p: &str| below.iter().position(|x| x == p).unwrap();
    assert!(pos("/d/a-b") < pos("/d/a/b") && pos("/d/a/b") < pos("/d/a0"));

    // A root scan sees every entry but the root itself; a prefix sibling is excluded.
    put(s, "/dd").await;
    assert!(!all_below(s, "/d", 100).await.contains(&"/dd".to_string()));
    let root = all_below(s, "/", 100).await;
    assert!(
        root.contains(&"/d".to_string()) && root.contains(&"/dd".to_string()) && root.contains(&"/d/a/b".to_string())
    );
    assert!(!root.contains(&"/".to_string()), "a scan is of the entries strictly below");
}

pub async fn pagination_boundaries(h: &Harness) {
    let s = &*h.store;
    let names: Vec<String> = (0..10).map(|i| format!("/p/f{i:02}")).collect();
    for n in &names {
        put(s, n).await;
    }
    for page in [1, 3, 5, 9, 10, 11, 100] {
        assert_eq!(all_children(s, "/p", page).await, names, "page size {page}");
        assert_eq!(all_below(s, "/p", page).await, names, "scan page size {page}");
    }
    let exact = s.list("/p", None, 10).await.unwrap();
    assert_eq!(exact.entries.len(), 10);
    assert_eq!(exact.next, None, "a page that ends exactly at the last entry is the last page");
    let after_last = s.list("/p", Some("/p/f09"), 5).await.unwrap();
    assert!(after_last.entries.is_empty() && after_last.next.is_none());
    let mid = s.scan("/p", Some("/p/f04"), 2).await.unwrap();
    assert_eq!(mid.entries.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(), ["/p/f05", "/p/f06"]);
    assert_eq!(mid.next.as_deref(), Some("/p/f06"));
    // A start_after that is not itself an entry still resumes at the next greater path.
    let between = s.list("/p", Some("/p/f04x"), 1).await.unwrap();
    assert_eq!(between.entries[0].path, "/p/f05");
    assert!(s.scan("/nowhere", None, 10).await.unwrap().entries.is_empty());
    assert_eq!(s.count_below("/p", None).await.unwrap(), 10);
    assert_eq!(s.count_below("/nowhere", None).await.unwrap(), 0);
    assert_eq!(s.count_below("/", None).await.unwrap(), 11, "the ten files and /p");
    assert_eq!(s.count_below("/", Some("/p")).await.unwrap(), 0, "/p and what is below it left out");
    assert_eq!(s.count_below("/p", Some("/p/nothing")).await.unwrap(), 10, "leaving out what is not there");
    assert!(matches!(s.list("/nowhere", None, 10).await, Err(Error::NotFound { .. })));
    assert!(matches!(s.list("/p/f00", None, 10).await, Err(Error::NotADirectory { .. })));
}

pub async fn each_precondition(h: &Harness) {
    let s = &*h.store;
    let v1 = s.apply(Txn::put("/x", file(1), Origin::Local).with_precondition(Precondition::Absent)).await.unwrap().seq;
    let err =
        s.apply(Txn::put("/x", file(2), Origin::Local).with_precondition(Precondition::Absent)).await.unwrap_err();
    assert_eq!(err, Error::PreconditionFailed { path: "/x".into(), current: Some(v1) });

    let err = s
        .apply(Txn::put("/x", file(2), Origin::Local).with_precondition(Precondition::Version(v1 + 100)))
        .await
        .unwrap_err();
    assert_eq!(err, Error::PreconditionFailed { path: "/x".into(), current: Some(v1) });
    assert_eq!(s.get("/x").await.unwrap().unwrap().size, 1, "a failed precondition writes nothing");

    let a = s.apply(Txn::put("/x", file(2), Origin::Local).with_precondition(Precondition::Version(v1))).await.unwrap();
    assert!(a.seq > v1);
    assert_eq!(a.old.unwrap().version, v1);
    let v2 = a.new.unwrap().version;
    assert_eq!(v2, a.seq);
    assert_eq!(s.get("/x").await.unwrap().unwrap().version, v2);

    let err =
        s.apply(Txn::put("/y", file(0), Origin::Local).with_precondition(Precondition::Version(v2))).await.unwrap_err();
    assert_eq!(err, Error::PreconditionFailed { path: "/y".into(), current: None });

    let err = s
        .apply(Txn::delete("/x", false, Origin::Local).with_precondition(Precondition::Version(v1)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::PreconditionFailed { .. }));
    s.apply(Txn::delete("/x", false, Origin::Local).with_precondition(Precondition::Version(v2))).await.unwrap();
    assert!(s.get("/x").await.unwrap().is_none());
    assert!(matches!(s.apply(Txn::delete("/x", false, Origin::Local)).await, Err(Error::NotFound { .. })));
    s.apply(Txn::put("/x", file(3), Origin::Local)).await.unwrap();
}

pub async fn implicit_parents_and_kind_conflicts(h: &Harness) {
    let s = &*h.store;
    put(s, "/a/b/c/file").await;
    for dir in ["/a", "/a/b", "/a/b/c"] {
        let e = s.get(dir).await.unwrap().unwrap_or_else(|| panic!("{dir} was not created"));
        assert_eq!(e.kind, EntryKind::Dir);
    }
    // A file cannot have children.
    let err = s.apply(Txn::put("/a/b/c/file/under", file(0), Origin::Local)).await.unwrap_err();
    assert_eq!(err, Error::NotADirectory { path: "/a/b/c/file".into() });
    assert!(s.get("/a/b/c/file/under").await.unwrap().is_none());
    // A non-empty directory cannot become a file, nor be deleted without `recursive`.
    assert!(matches!(s.apply(Txn::put("/a/b", file(0), Origin::Local)).await, Err(Error::DirectoryNotEmpty { .. })));
    assert!(matches!(s.apply(Txn::delete("/a", false, Origin::Local)).await, Err(Error::DirectoryNotEmpty { .. })));
    assert!(s.get("/a/b/c/file").await.unwrap().is_some());
    // Recursive delete removes the tree in one transaction, children first in the log.
    let before = s.last_seq().await.unwrap();
    let applied = s.apply(Txn::delete("/a", true, Origin::Local)).await.unwrap();
    assert_eq!((applied.first_seq, applied.seq), (before + 1, before + 4));
    assert!(s.scan("/a", None, 10).await.unwrap().entries.is_empty());
    assert!(s.get("/a").await.unwrap().is_none());
    let log: Vec<String> = s.changes(before, 100).await.unwrap().into_iter().map(|c| c.path).collect();
    assert_eq!(log, ["/a/b/c/file", "/a/b/c", "/a/b", "/a"]);
    // Parents implied by a remote-backed entry are remote-backed directories with an empty etag.
    let remote = tidemark_core::model::RemoteEntry {
        storage: "r".into(),
        etag: "e".into(),
        remote_mtime_ms: 5,
        remote_size: 0,
        version_id: None,
        last_local_sync_ms: None,
        dirty_after: None,
        moved_from: None,
    };
    let mut backed = file(0);
    backed.remote = Some(remote);
    s.apply(Txn::put("/m/x/y/obj", backed, Origin::Remote)).await.unwrap();
    for dir in ["/m", "/m/x", "/m/x/y"] {
        let r = s.get(dir).await.unwrap().unwrap().remote.unwrap_or_else(|| panic!("{dir} is remote-backed"));
        assert_eq!((r.storage.as_str(), r.etag.as_str()), ("r", ""), "{dir}");
    }
    // The root always exists and stays.
    assert_eq!(s.get("/").await.unwrap().unwrap().kind, EntryKind::Dir);
}

pub async fn inline_content(h: &Harness) {
    let s = &*h.store;
    let data = Bytes::from_static(b"{\"k\": 1}");
    let txn = Txn::put("/etc/tidemark/doc.json", NewEntry::file(data.len() as u64, 1, Content::Inline), Origin::System)
        .with_data(data.clone());
    s.apply(txn).await.unwrap();
    assert_eq!(s.read_inline("/etc/tidemark/doc.json").await.unwrap(), Some(data.clone()));
    assert_eq!(s.get("/etc/tidemark/doc.json").await.unwrap().unwrap().content, Content::Inline);
    // A metadata-only update keeps the bytes; inline content cannot appear from nowhere.
    let mut meta = NewEntry::file(data.len() as u64, 2, Content::Inline);
    meta.extended.insert("k".into(), "v".into());
    s.apply(Txn::put("/etc/tidemark/doc.json", meta, Origin::System)).await.unwrap();
    assert_eq!(s.read_inline("/etc/tidemark/doc.json").await.unwrap(), Some(data.clone()));
    assert!(matches!(
        s.apply(Txn::put("/etc/tidemark/other", NewEntry::file(3, 1, Content::Inline), Origin::System)).await,
        Err(Error::InvalidArgument { .. })
    ));
    // Replacing the entry with non-inline content drops the bytes.
    s.apply(Txn::put("/etc/tidemark/doc.json", file(0), Origin::System)).await.unwrap();
    assert_eq!(s.read_inline("/etc/tidemark/doc.json").await.unwrap(), None);
    assert_eq!(s.read_inline("/missing").await.unwrap(), None);
}

/// Symbolic links, pipes, sockets and device nodes, with their owners, ctimes, targets and
/// device numbers, read back as written, from the entry and from the change log; a file
/// written over a link replaces it.
pub async fn links_devices_and_owners_round_trip(h: &Harness) {
    let s = &*h.store;
    let mut link = NewEntry::symlink("../some where/ü", 5);
    link.posix.uid = Some(1234);
    link.posix.gid = Some(0);
    link.posix.ctime_ms = Some(7);
    let mut dev = file(0);
    dev.kind = EntryKind::CharDevice;
    dev.posix.rdev = (1 << 8) | 3;
    dev.posix.uid = Some(65534);
    let mut fifo = file(0);
    fifo.kind = EntryKind::Fifo;
    let mut sock = file(0);
    sock.kind = EntryKind::Socket;
    for (p, e) in [("/k/link", &link), ("/k/dev", &dev), ("/k/fifo", &fifo), ("/k/sock", &sock)] {
        let applied = s.apply(Txn::put(p, e.clone(), Origin::Local)).await.unwrap();
        let got = s.get(p).await.unwrap().unwrap();
        assert_eq!(got.to_new(), *e, "{p}");
        assert_eq!(applied.new.unwrap().to_new(), *e, "{p}: the applied entry");
        let rec = s.changes(applied.seq - 1, 1).await.unwrap().remove(0);
        assert_eq!(rec.new.unwrap().to_new(), *e, "{p}: its change-log record");
    }
    // Bad links are refused, whatever the store.
    for bad in [NewEntry { posix: Default::default(), ..link.clone() }, NewEntry::symlink("", 1), {
        let mut f = file(0);
        f.posix.target = Some("x".into());
        f
    }] {
        let err = s.apply(Txn::put("/k/bad", bad, Origin::Local)).await.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    }
    s.apply(Txn::put("/k/link", file(0), Origin::Local)).await.unwrap();
    let e = s.get("/k/link").await.unwrap().unwrap();
    assert_eq!((e.kind, e.posix.target), (EntryKind::File, None));
}

/// A directory with files (inline and empty), a link and a subdirectory moves whole: every
/// entry at its new path with its content and attributes, nothing at the old ones, and the
/// change log has the new tree first (parents first), then the old one's removals (children
/// first) naming where each went.
pub async fn a_rename_moves_a_tree_in_one_transaction(h: &Harness) {
    let s = &*h.store;
    let data = Bytes::from_static(b"inline bytes");
    s.apply(
        Txn::put("/r/a/x.txt", NewEntry::file(data.len() as u64, 1, Content::Inline), Origin::Local)
            .with_data(data.clone()),
    )
    .await
    .unwrap();
    put(s, "/r/a/sub/deep/e").await;
    s.apply(Txn::put("/r/a/sub/l", NewEntry::symlink("../x.txt", 2), Origin::Local)).await.unwrap();
    let before: Vec<Entry> = {
        let mut v = vec![s.get("/r/a").await.unwrap().unwrap()];
        for p in all_below(s, "/r/a", 100).await {
            v.push(s.get(&p).await.unwrap().unwrap());
        }
        v
    };
    let last = s.last_seq().await.unwrap();
    let applied = s.apply(Txn::rename("/r/a", "/r/b", Origin::Local)).await.unwrap();
    let n = before.len() as u64;
    assert_eq!((applied.first_seq, applied.seq), (last + 1, last + 2 * n));
    assert_eq!(applied.new.as_ref().unwrap().path, "/r/b");
    assert!(s.get("/r/a").await.unwrap().is_none());
    assert!(all_below(s, "/r/a", 100).await.is_empty());
    for old in &before {
        let p = format!("/r/b{}", &old.path["/r/a".len()..]);
        let e = s.get(&p).await.unwrap().unwrap_or_else(|| panic!("{p} missing"));
        let mut want = old.to_new();
        let mut got = e.to_new();
        if p == "/r/b" {
            assert!(got.posix.ctime_ms.is_some(), "the moved entry's ctime is the rename's");
            (got.posix.ctime_ms, want.posix.ctime_ms) = (None, None);
        }
        assert_eq!(got, want, "{p}");
    }
    assert_eq!(s.read_inline("/r/b/x.txt").await.unwrap(), Some(data));
    let recs = s.changes(last, 1000).await.unwrap();
    assert_eq!(recs.len() as u64, 2 * n);
    let (creates, removes) = recs.split_at(n as usize);
    assert!(creates.iter().all(|r| r.old.is_none() && r.new.is_some() && r.moved_to.is_none()));
    assert!(creates.windows(2).all(|w| w[0].path < w[1].path), "parents first");
    assert!(
        removes.iter().all(|r| r.new.is_none() && r.moved_to.as_deref() == Some(&*format!("/r/b{}", &r.path[4..])))
    );
    assert!(removes.windows(2).all(|w| w[0].path > w[1].path), "children first");
}

/// What rename(2) refuses, the store refuses, and writes nothing; what it allows — replacing a
/// file, or an empty directory — it does.
pub async fn a_rename_follows_the_rules_of_rename_2(h: &Harness) {
    let s = &*h.store;
    put(s, "/q/f").await;
    put(s, "/q/g").await;
    put(s, "/q/d/inside").await;
    s.apply(Txn::put("/q/empty", NewEntry::dir(1), Origin::Local)).await.unwrap();
    let last = s.last_seq().await.unwrap();
    let refused = [
        (Txn::rename("/q/nothing", "/q/x", Origin::Local), "not_found"),
        (Txn::rename("/q/f", "/q/no/such/dir/f", Origin::Local), "not_found"),
        (Txn::rename("/q/f", "/q/g/f", Origin::Local), "not_a_directory"),
        (Txn::rename("/q/f", "/q/empty", Origin::Local), "is_a_directory"),
        (Txn::rename("/q/d", "/q/f", Origin::Local), "not_a_directory"),
        (Txn::rename("/q/empty", "/q/d", Origin::Local), "directory_not_empty"),
        (Txn::rename("/q/d", "/q/d/inside/deeper", Origin::Local), "invalid_argument"),
        (Txn::rename("/q/f", "/q/f", Origin::Local), "invalid_argument"),
        (Txn::rename("/", "/q/root", Origin::Local), "invalid_argument"),
        (
            Txn {
                mutation: Mutation::Rename { to: "/q/g".into(), to_precondition: Precondition::Absent },
                ..Txn::rename("/q/f", "", Origin::Local)
            },
            "precondition_failed",
        ),
    ];
    for (txn, code) in refused {
        let what = format!("{} -> {:?}", txn.path, txn.mutation);
        let err = s.apply(txn).await.unwrap_err();
        assert_eq!(err.code(), code, "{what}: {err}");
    }
    assert_eq!(s.last_seq().await.unwrap(), last, "a refused rename writes nothing");
    // A file replaces a file; a directory an empty directory.
    let g = s.get("/q/g").await.unwrap().unwrap();
    let applied = s.apply(Txn::rename("/q/f", "/q/g", Origin::Local)).await.unwrap();
    let recs = s.changes(applied.first_seq - 1, 10).await.unwrap();
    assert_eq!(recs[0].old.as_ref(), Some(&g), "the replaced entry is the record's old one");
    assert!(s.get("/q/f").await.unwrap().is_none());
    s.apply(Txn::rename("/q/d", "/q/empty", Origin::Local)).await.unwrap();
    assert!(s.get("/q/empty/inside").await.unwrap().is_some());
}

/// A link moves the file to its inode entry (its inline bytes along, the records as a rename's)
/// and leaves names that point there; the count of names follows links, unlinks, renames and
/// puts over a name, whatever a put of the inode says; the last name takes the inode entry with
/// it. What link(2) refuses, the store refuses, writing nothing.
pub async fn hard_links_share_one_inode_entry_and_count_their_names(h: &Harness) {
    use tidemark_core::model::{inode_of_path, inode_path};
    let s = &*h.store;
    let link = |from: &str, to: &str| Txn::link(from, to, Origin::Local);
    let data = Bytes::from_static(b"abc");
    s.apply(Txn::put("/h/a", NewEntry::file(3, 1, Content::Inline), Origin::Local).with_data(data.clone()))
        .await
        .unwrap();
    let a = s.get("/h/a").await.unwrap().unwrap();
    let last = s.last_seq().await.unwrap();
    let applied = s.apply(link("/h/a", "/h/b")).await.unwrap();
    let inode = applied.new.clone().unwrap();
    let id = inode_of_path(&inode.path).expect("an inode entry");
    assert_eq!(inode.posix.nlink, Some(2));
    assert_eq!((inode.kind, inode.size, inode.mode), (a.kind, a.size, a.mode));
    assert_eq!(s.read_inline(&inode.path).await.unwrap(), Some(data.clone()), "the bytes moved with it");
    for p in ["/h/a", "/h/b"] {
        let n = s.get(p).await.unwrap().unwrap();
        assert_eq!((n.posix.inode, n.kind, n.content.clone()), (Some(id), EntryKind::File, Content::Empty), "{p}");
    }
    let recs = s.changes(last, 100).await.unwrap();
    assert!(
        recs.iter().any(|r| r.path == "/h/a" && r.new.is_none() && r.moved_to.as_deref() == Some(&*inode.path)),
        "the file moved to its inode entry, as a rename records it: {recs:?}"
    );
    assert_eq!(applied.seq, recs.last().unwrap().seq);

    // What link(2) refuses.
    put(s, "/h/f").await;
    s.apply(Txn::put("/h/dir", NewEntry::dir(1), Origin::Local)).await.unwrap();
    let last = s.last_seq().await.unwrap();
    let refused = [
        (link("/h/nothing", "/h/x"), "not_found"),
        (link("/h/a", "/h/no/such/x"), "not_found"),
        (link("/h/a", "/h/f/x"), "not_a_directory"),
        (link("/h/a", "/h/f"), "precondition_failed"),
        (link("/h/a", "/h/a"), "invalid_argument"),
        (link("/h/dir", "/h/dir2"), "is_a_directory"),
        (link("/h/a", &inode_path(99)), "invalid_argument"),
        (Txn::delete(inode_path(id), false, Origin::Local), "invalid_argument"),
        (Txn::rename(inode_path(id), "/h/stolen", Origin::Local), "invalid_argument"),
        (Txn::put(inode_path(12345), file(1), Origin::Local), "not_found"),
    ];
    for (txn, code) in refused {
        let what = format!("{} -> {:?}", txn.path, txn.mutation);
        let err = s.apply(txn).await.unwrap_err();
        assert_eq!(err.code(), code, "{what}: {err}");
    }
    assert_eq!(s.last_seq().await.unwrap(), last, "a refused link writes nothing");

    // A third name, through a name or through the inode entry itself.
    s.apply(link("/h/b", "/h/c")).await.unwrap();
    let inode = s.apply(link(&inode_path(id), "/h/dir/d")).await.unwrap().new.unwrap();
    assert_eq!(inode.posix.nlink, Some(4));
    // A put of the inode (a chmod) keeps the count.
    let mut chmod = inode.to_new();
    (chmod.mode, chmod.posix.nlink) = (0o600, Some(99));
    let inode = s.apply(Txn::put(&inode.path, chmod, Origin::Local)).await.unwrap().new.unwrap();
    assert_eq!((inode.mode, inode.posix.nlink), (0o600, Some(4)));
    // rename(2) between two names of one file does nothing.
    let last = s.last_seq().await.unwrap();
    s.apply(Txn::rename("/h/a", "/h/c", Origin::Local)).await.unwrap();
    assert_eq!(s.last_seq().await.unwrap(), last);
    let nlink = || async { s.get(&inode_path(id)).await.unwrap().map(|e| e.posix.nlink) };
    // A precondition on a name holds on its file's version too (what a name answers as), and
    // only while the file is at it.
    let at = s.get(&inode_path(id)).await.unwrap().unwrap().version;
    let stale = Txn::delete("/h/a", false, Origin::Local).with_precondition(Precondition::Version(at - 1));
    assert_eq!(s.apply(stale).await.unwrap_err().code(), "precondition_failed");
    // Each way a name goes counts it off: unlink (conditional on the file's version), a rename
    // over it (so too), a put over it, a recursive delete of its directory.
    s.apply(Txn::delete("/h/a", false, Origin::Local).with_precondition(Precondition::Version(at))).await.unwrap();
    assert_eq!(nlink().await, Some(Some(3)));
    // A rename over a name, conditional on the file's version, as a put over it is.
    let at = s.get(&inode_path(id)).await.unwrap().unwrap().version;
    let over = |v| Txn {
        mutation: Mutation::Rename { to: "/h/b".into(), to_precondition: Precondition::Version(v) },
        ..Txn::rename("/h/f", "", Origin::Local)
    };
    assert_eq!(s.apply(over(at - 1)).await.unwrap_err().code(), "precondition_failed");
    s.apply(over(at)).await.unwrap();
    assert_eq!(nlink().await, Some(Some(2)));
    s.apply(Txn::delete("/h/dir", true, Origin::Local)).await.unwrap();
    assert_eq!(nlink().await, Some(Some(1)));
    assert_eq!(s.read_inline(&inode_path(id)).await.unwrap(), Some(data), "one name left: the bytes stay");
    let applied = s.apply(Txn::put("/h/c", file(7), Origin::Local)).await.unwrap();
    assert_eq!(nlink().await, None, "the last name took the inode entry with it");
    let recs = s.changes(applied.first_seq - 1, 10).await.unwrap();
    assert!(recs.iter().any(|r| r.path == inode_path(id) && r.new.is_none() && r.moved_to.is_none()));
}

/// With `dir_times`, a new name, a removed one and both ends of a rename set their directory's
/// mtime and ctime in the same transaction (one more record, the transaction's last, and the
/// directory in `Applied::dirs`); replacing an entry, or a directory the transaction created,
/// does not; without it, nothing does.
pub async fn dir_times_follow_the_names_a_directory_gains_and_loses(h: &Harness) {
    let s = &*h.store;
    s.apply(Txn::put("/t/a", NewEntry::dir(1), Origin::Local)).await.unwrap();
    s.apply(Txn::put("/t/b", NewEntry::dir(1), Origin::Local)).await.unwrap();
    let mtime = |e: &Entry| e.mtime_ms;
    let plain = s.apply(Txn::put("/t/a/plain", file(0), Origin::Local)).await.unwrap();
    assert!(plain.dirs.is_empty() && plain.first_seq == plain.seq, "without dir_times no directory changes");
    h.clock.advance_ms(10).await;
    let created = s.apply(Txn::put("/t/a/f", file(0), Origin::Local).with_dir_times()).await.unwrap();
    let a = s.get("/t/a").await.unwrap().unwrap();
    assert_eq!((created.seq, created.dirs.len()), (created.first_seq + 1, 1));
    assert_eq!((a.version, a.posix.ctime_ms), (created.seq, None));
    assert!(mtime(&a) > 1, "the directory's mtime is the transaction's time");
    assert_eq!(created.dirs[0], a);
    assert_eq!(a.posix.atime_ms, Some(1), "the atime stays what it was");
    let replaced = s.apply(Txn::put("/t/a/f", file(0), Origin::Local).with_dir_times()).await.unwrap();
    assert!(replaced.dirs.is_empty(), "a replaced entry's name was there");
    let deep = s.apply(Txn::put("/t/new/deeper/g", file(0), Origin::Local).with_dir_times()).await.unwrap();
    assert_eq!(deep.dirs.iter().map(|d| d.path.as_str()).collect::<Vec<_>>(), Vec::<&str>::new());
    h.clock.advance_ms(10).await;
    let renamed = s.apply(Txn::rename("/t/a/f", "/t/b/f", Origin::Local).with_dir_times()).await.unwrap();
    let dirs: Vec<&str> = renamed.dirs.iter().map(|d| d.path.as_str()).collect();
    assert_eq!(dirs, ["/t/a", "/t/b"]);
    assert!(renamed.dirs[0].mtime_ms > a.mtime_ms, "{renamed:?}");
    let mut del = Txn::delete("/t/b/f", false, Origin::Local);
    del.dir_times = true;
    let deleted = s.apply(del).await.unwrap();
    assert_eq!(deleted.dirs[0].path, "/t/b");
    let recs = s.changes(deleted.first_seq - 1, 10).await.unwrap();
    assert_eq!(recs.last().unwrap().path, "/t/b");
}

pub async fn versions_are_never_reused(h: &Harness) {
    let s = &*h.store;
    let mut seen = BTreeSet::new();
    for _ in 0..3 {
        let a = s.apply(Txn::put("/v", file(0), Origin::Local)).await.unwrap();
        assert!(seen.insert(a.new.unwrap().version));
        let d = s.apply(Txn::delete("/v", false, Origin::Local)).await.unwrap();
        assert!(seen.insert(d.seq));
    }
    let versions: Vec<u64> = seen.into_iter().collect();
    assert!(versions.windows(2).all(|w| w[0] < w[1]));
}

pub async fn lease_acquire_renew_expiry_takeover(h: &Harness) {
    let s = &*h.store;
    let a = s.lease_acquire("sub", "worker-a", 10_000).await.unwrap();
    assert_eq!((a.holder.as_str(), a.generation), ("worker-a", 1));
    let held = s.lease_acquire("sub", "worker-b", 10_000).await.unwrap_err();
    assert!(matches!(held, Error::LeaseHeld { ref holder, .. } if holder == "worker-a"), "{held}");

    h.clock.advance_ms(5_000).await;
    let renewed = s.lease_renew(&a.fence(), 10_000).await.unwrap();
    assert_eq!(renewed.generation, 1);
    assert!(renewed.expires_at_ms > a.expires_at_ms);
    h.clock.advance_ms(7_000).await;
    assert!(s.lease_acquire("sub", "worker-b", 10_000).await.is_err(), "the renewal must have extended the lease");

    // Expiry: after the ttl passes unrenewed, another holder takes over with a new generation,
    // and the old holder can no longer renew or release.
    h.clock.advance_ms(11_000).await;
    assert!(
        matches!(s.lease_renew(&a.fence(), 10_000).await, Err(Error::Fenced { .. })),
        "an expired lease cannot be renewed"
    );
    let b = s.lease_acquire("sub", "worker-b", 10_000).await.unwrap();
    assert_eq!(b.generation, 2);
    assert_eq!(
        s.lease_release(&a.fence()).await.unwrap_err(),
        Error::Fenced { lease: "sub".into(), current_generation: Some(2) }
    );

    // Re-acquiring one's own lease is a new acquisition: a new generation fences the old one.
    let b2 = s.lease_acquire("sub", "worker-b", 10_000).await.unwrap();
    assert_eq!(b2.generation, 3);
    assert!(s.lease_renew(&b.fence(), 10_000).await.is_err());

    // Release frees the lease at once; the generation keeps counting.
    s.lease_release(&b2.fence()).await.unwrap();
    let c = s.lease_acquire("sub", "worker-c", 10_000).await.unwrap();
    assert_eq!(c.generation, 4);
    assert_eq!(s.lease_get("sub").await.unwrap().unwrap(), c);
    assert!(s.lease_get("other").await.unwrap().is_none());
    assert!(matches!(s.lease_acquire("x", "w", 0).await, Err(Error::InvalidArgument { .. })));
}

pub async fn stale_generation_write_is_rejected(h: &Harness) {
    let s = &*h.store;
    let old = s.lease_acquire("fp", "w1", 1_000).await.unwrap();
    s.apply(Txn::put("/m/k", file(1), Origin::Remote).with_fence(old.fence())).await.unwrap();

    h.clock.advance_ms(1_001).await;
    // Expired but not yet taken: still fenced, nothing written.
    let err = s.apply(Txn::put("/m/k", file(2), Origin::Remote).with_fence(old.fence())).await.unwrap_err();
    assert_eq!(err, Error::Fenced { lease: "fp".into(), current_generation: Some(1) });

    let new = s.lease_acquire("fp", "w2", 1_000).await.unwrap();
    let before = s.last_seq().await.unwrap();
    for m in [Mutation::Put { entry: file(3), data: None }, Mutation::Delete { recursive: true }] {
        let txn = Txn {
            path: "/m/k".into(),
            precondition: Precondition::Any,
            fence: Some(old.fence()),
            mutation: m,
            origin: Origin::Remote,
            dir_times: false,
        };
        assert_eq!(s.apply(txn).await.unwrap_err(), Error::Fenced { lease: "fp".into(), current_generation: Some(2) });
    }
    // A forged fence (right generation, wrong holder) and a fence on an unknown lease fail too.
    let forged = tidemark_core::Fence { holder: "w1".into(), ..new.fence() };
    assert!(matches!(
        s.apply(Txn::put("/m/k", file(4), Origin::Remote).with_fence(forged)).await,
        Err(Error::Fenced { .. })
    ));
    let unknown = tidemark_core::Fence { lease: "nope".into(), ..new.fence() };
    assert_eq!(
        s.apply(Txn::put("/m/k", file(4), Origin::Remote).with_fence(unknown)).await.unwrap_err(),
        Error::Fenced { lease: "nope".into(), current_generation: None }
    );
    assert_eq!(s.last_seq().await.unwrap(), before, "rejected writes leave no change-log record");
    assert_eq!(s.get("/m/k").await.unwrap().unwrap().size, 1);
    s.apply(Txn::put("/m/k", file(5), Origin::Remote).with_fence(new.fence())).await.unwrap();
    assert_eq!(s.get("/m/k").await.unwrap().unwrap().size, 5);
}

pub async fn change_log_order_and_contents(h: &Harness) {
    let s = &*h.store;
    let start = s.last_seq().await.unwrap();
    let mut rx = s.subscribe();
    let a = s.apply(Txn::put("/c/one", file(1), Origin::Local)).await.unwrap();
    assert_eq!((a.first_seq, a.seq), (start + 1, start + 2), "the implicit parent has its own record");
    assert!(rx.has_changed().unwrap(), "subscribers are notified of commits");
    assert_eq!(*rx.borrow_and_update(), a.seq);
    s.apply(Txn::put("/c/one", file(2), Origin::Remote)).await.unwrap();
    s.apply(Txn::delete("/c/one", false, Origin::System)).await.unwrap();

    let log = s.changes(start, 100).await.unwrap();
    let summary: Vec<(&str, Origin, Option<u64>, Option<u64>)> = log
        .iter()
        .map(|c| (c.path.as_str(), c.origin, c.old.as_ref().map(|e| e.size), c.new.as_ref().map(|e| e.size)))
        .collect();
    assert_eq!(
        summary,
        [
            ("/c", Origin::Local, None, Some(0)),
            ("/c/one", Origin::Local, None, Some(1)),
            ("/c/one", Origin::Remote, Some(1), Some(2)),
            ("/c/one", Origin::System, Some(2), None),
        ]
    );
    assert!(log.windows(2).all(|w| w[0].seq + 1 == w[1].seq), "sequence numbers are dense and increasing");
    assert_eq!(log.last().unwrap().seq, s.last_seq().await.unwrap());
    for c in &log {
        if let Some(n) = &c.new {
            assert_eq!(n.version, c.seq, "a record's new entry carries the record's seq as version");
        }
    }
    let paged = s.changes(start + 1, 2).await.unwrap();
    assert_eq!(paged.iter().map(|c| c.seq).collect::<Vec<_>>(), [start + 2, start + 3]);
    assert!(s.changes(s.last_seq().await.unwrap(), 10).await.unwrap().is_empty());
}

pub async fn cas_race_one_winner_per_version(h: &Harness) {
    const TASKS: usize = 32;
    const ROUNDS: usize = 5;
    let s = h.store.clone();
    s.apply(Txn::put("/race", file(0), Origin::Local)).await.unwrap();
    for round in 0..ROUNDS {
        let v = s.get("/race").await.unwrap().unwrap().version;
        let results = all_at_once(&s, TASKS, |i| {
            Txn::put("/race", file(i as u64), Origin::Local).with_precondition(Precondition::Version(v))
        })
        .await;
        let mut winners = Vec::new();
        for (i, result) in results.into_iter().enumerate() {
            match result {
                Ok(_) => winners.push(i),
                Err(Error::PreconditionFailed { .. }) => {}
                Err(e) => panic!("task {i}: unexpected error {e}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one CAS on version {v} wins, got {winners:?}");
        assert_eq!(s.get("/race").await.unwrap().unwrap().size, winners[0] as u64);
    }
}

/// Many mutations at once (committed together where the store groups them): each succeeds or
/// fails on its own, a failed one leaves no entry and no change-log record — not even of the
/// implicit parents it created before failing — and the log stays dense.
pub async fn concurrent_mutations_stand_or_fail_alone(h: &Harness) {
    const TASKS: usize = 64;
    let s = h.store.clone();
    s.apply(Txn::put("/g/file", file(0), Origin::Local)).await.unwrap();
    let start = s.last_seq().await.unwrap();
    let results = all_at_once(&s, TASKS, |i| match i % 4 {
        // Succeeds, creating its own parent directory.
        0 => Txn::put(format!("/g/ok{i}/f"), file(i as u64), Origin::Local),
        // Fails on its precondition.
        1 => Txn::put(format!("/g/bad{i}/f"), file(0), Origin::Local).with_precondition(Precondition::Version(1 << 40)),
        // Fails: a file cannot be a parent.
        2 => Txn::put(format!("/g/file/x{i}"), file(0), Origin::Local),
        // Fails after it wrote its new parent directory: inline content without data.
        _ => Txn::put(format!("/g/bad{i}/f"), NewEntry::file(3, 1_000, Content::Inline), Origin::Local),
    })
    .await;
    let mut applied = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        match (i % 4, r) {
            (0, Ok(a)) => applied.push(a),
            (0, Err(e)) => panic!("task {i}: {e}"),
            (_, Ok(a)) => panic!("task {i} should have failed, applied at {}", a.seq),
            (_, Err(_)) => {}
        }
    }
    let log = s.changes(start, 10_000).await.unwrap();
    assert_eq!(log.len(), 2 * applied.len(), "each success: its parent and its file; failures: nothing");
    assert!(log.windows(2).all(|w| w[0].seq + 1 == w[1].seq), "the log stays dense");
    assert!(log.iter().all(|c| c.path.starts_with("/g/ok")), "no record of a failed mutation");
    for a in &applied {
        let records: Vec<u64> = log.iter().filter(|c| (a.first_seq..=a.seq).contains(&c.seq)).map(|c| c.seq).collect();
        assert_eq!(records.len() as u64, a.seq - a.first_seq + 1, "a mutation's records are its own seq range");
    }
    let below: Vec<String> = all_below(&*s, "/g", 7).await;
    assert_eq!(below.len(), 1 + 2 * applied.len(), "{below:?}");
    assert!(below.iter().all(|p| p == "/g/file" || p.starts_with("/g/ok")), "{below:?}");
}

pub async fn invalid_input_is_rejected(h: &Harness) {
    let s = &*h.store;
    for bad in ["relative", "/trailing/", "/a//b", "/a/../b", "/nul\0"] {
        assert!(matches!(s.get(bad).await, Err(Error::InvalidPath { .. })), "get {bad:?}");
        assert!(
            matches!(s.apply(Txn::put(bad, file(0), Origin::Local)).await, Err(Error::InvalidPath { .. })),
            "put {bad:?}"
        );
    }
    assert!(matches!(s.apply(Txn::delete("/", true, Origin::Local)).await, Err(Error::InvalidArgument { .. })));
    assert!(matches!(s.apply(Txn::put("/", file(0), Origin::Local)).await, Err(Error::InvalidArgument { .. })));
    assert_eq!(s.last_seq().await.unwrap(), 0, "nothing was written");
}

fn remote_file(etag: &str, size: u64) -> NewEntry {
    let mut e = NewEntry::file(size, 1_000, Content::Remote);
    e.remote = Some(RemoteEntry {
        storage: "r".into(),
        etag: etag.into(),
        remote_mtime_ms: 1_000,
        remote_size: size,
        version_id: None,
        last_local_sync_ms: None,
        dirty_after: None,
        moved_from: None,
    });
    e
}

fn chunk_for(node: &str, e: &Entry, chunk: u64, len: u64, last_read_ms: i64) -> CachedChunk {
    CachedChunk {
        node: node.into(),
        path: e.path.clone(),
        content_id: content_id(e).expect("a remote-backed entry has a content id"),
        chunk,
        len,
        last_read_ms,
    }
}

async fn put_entry(s: &dyn MetaStore, path: &str, e: NewEntry) -> Entry {
    s.apply(Txn::put(path, e, Origin::Remote)).await.unwrap_or_else(|e| panic!("put {path}: {e}")).new.unwrap()
}

/// Cache records exist only for the entry's current remote version: an invalidating write or a
/// delete removes them (every node's) in its own transaction; a metadata-only write keeps them;
/// a record for a version the entry no longer has is refused.
pub async fn cache_records_follow_the_entry(h: &Harness) {
    let s = &*h.store;
    let a = put_entry(s, "/m/a", remote_file("e1", 20)).await;
    assert!(s.cache_record(chunk_for("n1", &a, 1, 10, 5)).await.unwrap());
    assert!(s.cache_record(chunk_for("n1", &a, 0, 10, 5)).await.unwrap());
    assert!(s.cache_record(chunk_for("n2", &a, 0, 10, 5)).await.unwrap());
    let mine = s.cache_chunks("n1", "/m/a").await.unwrap();
    assert_eq!(mine.iter().map(|c| c.chunk).collect::<Vec<_>>(), [0, 1], "in chunk order, this node's only");
    let seq = s.last_seq().await.unwrap();

    let mut stale = chunk_for("n1", &a, 2, 10, 5);
    stale.content_id = "0".repeat(32);
    assert!(!s.cache_record(stale).await.unwrap(), "another version's chunk is refused");
    let mut elsewhere = chunk_for("n1", &a, 0, 10, 5);
    elsewhere.path = "/m/missing".into();
    assert!(!s.cache_record(elsewhere).await.unwrap(), "a missing entry's chunk is refused");
    assert_eq!(s.last_seq().await.unwrap(), seq, "cache records write no change-log records");

    // A metadata-only write (mode) keeps the version's records.
    let mut meta = a.to_new();
    meta.mode = 0o600;
    let a2 = s
        .apply(Txn::put("/m/a", meta, Origin::Local).with_precondition(Precondition::Version(a.version)))
        .await
        .unwrap()
        .new
        .unwrap();
    assert_eq!(s.cache_chunks("n1", "/m/a").await.unwrap().len(), 2);

    // A new remote version drops every node's records of the old one, in that transaction.
    let b = put_entry(s, "/m/a", remote_file("e2", 20)).await;
    assert!(b.version > a2.version);
    assert!(s.cache_chunks("n1", "/m/a").await.unwrap().is_empty());
    assert!(s.cache_chunks("n2", "/m/a").await.unwrap().is_empty());
    assert!(!s.cache_record(chunk_for("n1", &a, 0, 10, 5)).await.unwrap(), "a late fetch of e1 is refused");

    // A local write (content no longer remote) drops them too.
    assert!(s.cache_record(chunk_for("n1", &b, 0, 10, 5)).await.unwrap());
    let local = NewEntry::file(2, 2_000, Content::Inline);
    s.apply(Txn::put("/m/a", local, Origin::Local).with_data(Bytes::from_static(b"hi"))).await.unwrap();
    assert!(s.cache_chunks("n1", "/m/a").await.unwrap().is_empty());

    // A delete, and the children of a recursive delete.
    let c = put_entry(s, "/m/d/c", remote_file("e3", 5)).await;
    let top = put_entry(s, "/m/top", remote_file("e4", 5)).await;
    assert!(s.cache_record(chunk_for("n1", &c, 0, 5, 5)).await.unwrap());
    assert!(s.cache_record(chunk_for("n1", &top, 0, 5, 5)).await.unwrap());
    s.apply(Txn::delete("/m/d", true, Origin::Remote)).await.unwrap();
    assert!(s.cache_chunks("n1", "/m/d/c").await.unwrap().is_empty());
    s.apply(Txn::delete("/m/top", false, Origin::Remote)).await.unwrap();
    assert!(s.cache_chunks("n1", "/m/top").await.unwrap().is_empty());
    let again = put_entry(s, "/m/top", remote_file("e4", 5)).await;
    assert!(s.cache_chunks("n1", "/m/top").await.unwrap().is_empty(), "a re-created entry starts uncached");
    assert_eq!(s.cache_usage("n1").await.unwrap().chunks, 0);
    let _ = again;
}

/// Usage per node, least-recently-read order after touches, forgetting exact records, and a
/// paged walk in (path, chunk) order.
pub async fn cache_lru_scan_and_usage(h: &Harness) {
    let s = &*h.store;
    let mut files = Vec::new();
    for name in ["/c/x", "/c/y", "/c/z"] {
        files.push(put_entry(s, name, remote_file("e", 30)).await);
    }
    for (i, f) in files.iter().enumerate() {
        for k in 0..3 {
            assert!(s.cache_record(chunk_for("n1", f, k, 10, 100 + i as i64)).await.unwrap());
        }
    }
    assert!(s.cache_record(chunk_for("n2", &files[0], 0, 7, 1)).await.unwrap());
    let u = s.cache_usage("n1").await.unwrap();
    assert_eq!((u.bytes, u.chunks), (90, 9));
    assert_eq!(s.cache_usage("n2").await.unwrap().bytes, 7);
    assert_eq!(s.cache_usage("nobody").await.unwrap().chunks, 0);

    // /c/x was read last now: /c/y's chunks are the oldest.
    s.cache_touch(
        "n1",
        &[("/c/x".into(), 0, 500), ("/c/x".into(), 1, 500), ("/c/x".into(), 2, 500), ("/c/none".into(), 0, 1)],
    )
    .await
    .unwrap();
    let lru = s.cache_lru("n1", 4).await.unwrap();
    let order: Vec<(&str, u64)> = lru.iter().map(|c| (c.path.as_str(), c.chunk)).collect();
    assert_eq!(order, [("/c/y", 0), ("/c/y", 1), ("/c/y", 2), ("/c/z", 0)]);
    assert!(lru.iter().all(|c| c.node == "n1"));

    let gone = s.cache_forget(&lru[..2]).await.unwrap();
    assert_eq!(gone.len(), 2);
    assert!(s.cache_forget(&lru[..2]).await.unwrap().is_empty(), "forgetting twice is harmless");
    let mut other_version = lru[2].clone();
    other_version.content_id = "f".repeat(32);
    assert!(s.cache_forget(&[other_version]).await.unwrap().is_empty(), "matched on the content id too");
    assert_eq!(s.cache_usage("n1").await.unwrap().bytes, 70);

    let mut walked = Vec::new();
    let mut after: Option<(String, u64)> = None;
    loop {
        let page = s.cache_scan("n1", after.as_ref().map(|(p, k)| (p.as_str(), *k)), 2).await.unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 2);
        walked.extend(page.iter().map(|c| (c.path.clone(), c.chunk)));
        after = page.last().map(|c| (c.path.clone(), c.chunk));
    }
    let expect: Vec<(String, u64)> =
        [("/c/x", 0), ("/c/x", 1), ("/c/x", 2), ("/c/y", 2), ("/c/z", 0), ("/c/z", 1), ("/c/z", 2)]
            .iter()
            .map(|(p, k)| (p.to_string(), *k))
            .collect();
    assert_eq!(walked, expect);
}

fn batch(txns: Vec<Txn>) -> TxnBatch {
    TxnBatch { fence: None, txns }
}

/// One batch of mixed outcomes: each transaction succeeds or fails on its own checks, in order,
/// seeing the writes of the ones before it; a failed one leaves no entry, no implicit parent and
/// no change-log record; the successes' records are dense and each its own seq range.
pub async fn a_batch_stands_or_fails_transaction_by_transaction(h: &Harness) {
    let s = &*h.store;
    put(s, "/b/file").await;
    put(s, "/b/full/x").await;
    let start = s.last_seq().await.unwrap();
    let txns = vec![
        // 0: succeeds, creating /b/new.
        Txn::put("/b/new/a", file(1), Origin::Remote),
        // 1: a file cannot be a parent (its parent /b/file/y would be created first).
        Txn::put("/b/file/y/z", file(0), Origin::Remote),
        // 2: fails its precondition.
        Txn::put("/b/p", file(0), Origin::Remote).with_precondition(Precondition::Version(1 << 40)),
        // 3: a directory with something below it is not deleted without `recursive`.
        Txn::delete("/b/full", false, Origin::Remote),
        // 4: sees /b/new from transaction 0 (no second implicit parent).
        Txn::put("/b/new/b", file(2), Origin::Remote).with_precondition(Precondition::Absent),
        // 5: inline content without data, and nothing to keep: fails after its checks only.
        Txn::put("/b/inl/f", NewEntry::file(3, 1_000, Content::Inline), Origin::Remote),
        // 6, 7: a delete, then a put the delete made possible.
        Txn::delete("/b/file", false, Origin::Remote),
        Txn::put("/b/file", file(7), Origin::Remote).with_precondition(Precondition::Absent),
        // 8: malformed on its own (a relative path): fails alone.
        Txn::put("relative", file(0), Origin::Remote),
    ];
    let results = s.apply_many(batch(txns)).await.expect("the batch commits");
    assert_eq!(results.len(), 9);
    let ok: Vec<usize> = results.iter().enumerate().filter(|(_, r)| r.is_ok()).map(|(i, _)| i).collect();
    assert_eq!(ok, vec![0, 4, 6, 7], "{results:?}");
    assert!(matches!(results[1], Err(Error::NotADirectory { .. })), "{:?}", results[1]);
    assert!(matches!(results[2], Err(Error::PreconditionFailed { current: None, .. })), "{:?}", results[2]);
    assert!(matches!(results[3], Err(Error::DirectoryNotEmpty { .. })), "{:?}", results[3]);
    assert!(matches!(results[5], Err(Error::InvalidArgument { .. })), "{:?}", results[5]);
    assert!(matches!(results[8], Err(Error::InvalidPath { .. })), "{:?}", results[8]);
    for gone in ["/b/file/y", "/b/p", "/b/inl", "/b/inl/f"] {
        assert_eq!(s.get(gone).await.unwrap(), None, "{gone}: a failed transaction leaves nothing");
    }
    assert!(s.get("/b/full/x").await.unwrap().is_some());
    assert_eq!(s.get("/b/file").await.unwrap().unwrap().size, 7);
    let log = s.changes(start, 100).await.unwrap();
    // /b/new, /b/new/a, /b/new/b, the delete of /b/file, its new put.
    assert_eq!(
        log.iter().map(|c| c.path.as_str()).collect::<Vec<_>>(),
        ["/b/new", "/b/new/a", "/b/new/b", "/b/file", "/b/file"]
    );
    assert!(log.windows(2).all(|w| w[0].seq + 1 == w[1].seq), "the log stays dense");
    let mut next = start + 1;
    for r in results.iter().flatten() {
        assert_eq!(r.first_seq, next, "each transaction's records follow the last one's");
        next = r.seq + 1;
    }
    assert_eq!(s.last_seq().await.unwrap(), next - 1);
    // An empty batch commits nothing.
    assert!(s.apply_many(batch(Vec::new())).await.unwrap().is_empty());
    assert_eq!(s.last_seq().await.unwrap(), next - 1);
}

/// The batch's fence is checked once, in the batch's transaction: a fence that no longer holds
/// (expired, taken over, forged) fails the whole batch and nothing of it lands, however many of
/// its transactions would have passed their own checks; a malformed batch is refused whole.
pub async fn a_batch_whose_fence_fails_lands_nothing(h: &Harness) {
    let s = &*h.store;
    let lease = s.lease_acquire("bf", "w1", 1_000).await.unwrap();
    let fenced = |fence: tidemark_core::Fence, tag: &str| TxnBatch {
        fence: Some(fence),
        txns: (0..20).map(|i| Txn::put(format!("/bf/{tag}/{i}"), file(i), Origin::Remote)).collect(),
    };
    let r = s.apply_many(fenced(lease.fence(), "held")).await.unwrap();
    assert!(r.iter().all(|r| r.is_ok()));
    let before = s.last_seq().await.unwrap();

    h.clock.advance_ms(1_001).await;
    let err = s.apply_many(fenced(lease.fence(), "expired")).await.unwrap_err();
    assert_eq!(err, Error::Fenced { lease: "bf".into(), current_generation: Some(1) });
    let taken = s.lease_acquire("bf", "w2", 60_000).await.unwrap();
    let err = s.apply_many(fenced(lease.fence(), "taken")).await.unwrap_err();
    assert_eq!(err, Error::Fenced { lease: "bf".into(), current_generation: Some(2) });
    let forged = tidemark_core::Fence { holder: "w1".into(), ..taken.fence() };
    assert!(matches!(s.apply_many(fenced(forged, "forged")).await, Err(Error::Fenced { .. })));
    // A transaction that carries a fence of its own, and an oversized batch: refused whole.
    let mut own = fenced(taken.fence(), "own");
    own.txns[3].fence = Some(taken.fence());
    assert!(matches!(s.apply_many(own).await, Err(Error::InvalidArgument { .. })));
    let huge = batch((0..=MAX_BATCH).map(|i| Txn::put(format!("/bf/huge/{i}"), file(0), Origin::Remote)).collect());
    assert!(matches!(s.apply_many(huge).await, Err(Error::InvalidArgument { .. })));

    assert_eq!(s.last_seq().await.unwrap(), before, "a refused batch leaves no change-log record");
    for tag in ["expired", "taken", "forged", "own", "huge"] {
        assert_eq!(s.get(&format!("/bf/{tag}")).await.unwrap(), None, "{tag}: nothing of the batch landed");
    }
    let r = s.apply_many(fenced(taken.fence(), "new")).await.unwrap();
    assert!(r.iter().all(|r| r.is_ok()), "the current holder's batch lands");
}

/// Batches and single transactions from many tasks at once (grouped where the store groups
/// them): every batch's records are contiguous in the log, in its order, and the log is dense.
pub async fn batches_from_many_tasks_interleave_whole(h: &Harness) {
    const TASKS: usize = 16;
    const PER: usize = 25;
    let s = h.store.clone();
    let start = s.last_seq().await.unwrap();
    let handles: Vec<_> = (0..TASKS)
        .map(|t| {
            let s = s.clone();
            tokio::spawn(async move {
                if t % 4 == 3 {
                    let a = s.apply(Txn::put(format!("/many/single{t}"), file(0), Origin::Local)).await.unwrap();
                    return vec![(a.first_seq, a.seq)];
                }
                let txns = (0..PER).map(|i| Txn::put(format!("/many/t{t:02}/{i:02}"), file(i as u64), Origin::Remote));
                let out = s.apply_many(batch(txns.collect())).await.unwrap();
                out.into_iter().map(|r| r.map(|a| (a.first_seq, a.seq)).unwrap()).collect()
            })
        })
        .collect();
    let mut ranges = Vec::new();
    for h in handles {
        let r = h.await.unwrap();
        assert!(r.windows(2).all(|w| w[0].1 + 1 == w[1].0), "a batch's transactions are contiguous: {r:?}");
        ranges.push(r);
    }
    let log = s.changes(start, 100_000).await.unwrap();
    assert!(log.windows(2).all(|w| w[0].seq + 1 == w[1].seq), "the log stays dense");
    let expected: usize = ranges.iter().map(|r| r.iter().map(|(a, b)| (b - a + 1) as usize).sum::<usize>()).sum();
    assert_eq!(log.len(), expected, "every record belongs to one transaction");
    assert_eq!(all_below(&*s, "/many", 50).await.len(), (TASKS / 4) + (TASKS - TASKS / 4) * (PER + 1));
}

pub async fn get_many_answers_in_order(h: &Harness) {
    let s = &*h.store;
    put(s, "/gm/a").await;
    put(s, "/gm/c").await;
    let paths: Vec<String> = ["/gm/c", "/gm/b", "/gm/a", "/gm/c", "/gm"].iter().map(|p| p.to_string()).collect();
    let got = s.get_many(&paths).await.unwrap();
    let names: Vec<Option<&str>> = got.iter().map(|e| e.as_ref().map(|e| e.path.as_str())).collect();
    assert_eq!(names, [Some("/gm/c"), None, Some("/gm/a"), Some("/gm/c"), Some("/gm")]);
    assert!(s.get_many(&[]).await.unwrap().is_empty());
    assert!(matches!(s.get_many(&["bad".to_string()]).await, Err(Error::InvalidPath { .. })));
    let too_many: Vec<String> = (0..=MAX_BATCH).map(|i| format!("/gm/{i}")).collect();
    assert!(matches!(s.get_many(&too_many).await, Err(Error::InvalidArgument { .. })));
}

/// One batch creating, deleting and re-creating the same paths (new ones and existing ones):
/// the end state and the change log are those of the transactions in order.
pub async fn a_batch_may_write_one_path_several_times(h: &Harness) {
    let s = &*h.store;
    put(s, "/w/old").await;
    put(s, "/w/gone").await;
    let start = s.last_seq().await.unwrap();
    let txns = vec![
        Txn::put("/w/new", file(1), Origin::Remote),
        Txn::delete("/w/new", false, Origin::Remote),
        Txn::put("/w/new", file(3), Origin::Remote).with_precondition(Precondition::Absent),
        Txn::put("/w/brief", file(4), Origin::Remote),
        Txn::delete("/w/brief", false, Origin::Remote),
        Txn::delete("/w/old", false, Origin::Remote),
        Txn::put("/w/old", file(6), Origin::Remote).with_precondition(Precondition::Absent),
        Txn::put("/w/old", file(7), Origin::Remote),
        Txn::delete("/w/gone", false, Origin::Remote),
        Txn::put("/w/d/f", file(9), Origin::Remote),
        Txn::delete("/w/d", true, Origin::Remote),
        Txn::put("/w/d/g", file(11), Origin::Remote),
    ];
    let out = s.apply_many(batch(txns)).await.unwrap();
    assert!(out.iter().all(|r| r.is_ok()), "{out:?}");
    assert_eq!(s.get("/w/new").await.unwrap().unwrap().size, 3);
    assert_eq!(s.get("/w/brief").await.unwrap(), None);
    assert_eq!(s.get("/w/old").await.unwrap().unwrap().size, 7);
    assert_eq!(s.get("/w/gone").await.unwrap(), None);
    assert_eq!(s.get("/w/d/f").await.unwrap(), None);
    assert_eq!(s.get("/w/d/g").await.unwrap().unwrap().size, 11);
    assert_eq!(all_below(s, "/w", 10).await, ["/w/d", "/w/d/g", "/w/new", "/w/old"]);
    let log = s.changes(start, 100).await.unwrap();
    assert!(log.windows(2).all(|w| w[0].seq + 1 == w[1].seq), "the log stays dense");
    assert_eq!(log.last().unwrap().seq, out.last().unwrap().as_ref().unwrap().seq);
    // Every entry's version is the record that last wrote it.
    for p in ["/w/new", "/w/old", "/w/d/g"] {
        let e = s.get(p).await.unwrap().unwrap();
        let last = log.iter().rev().find(|c| c.path == p).unwrap();
        assert_eq!(e.version, last.seq, "{p}");
    }
}

/// Fenced batches streaming while the lease expires and another holder takes it: the fence is
/// checked inside each batch's transaction, so no batch is cut by the takeover — each landed
/// whole (all of it before the takeover) or not at all (refused as fenced), and once one is
/// refused every later one is too.
pub async fn fenced_batches_racing_a_takeover_land_whole_or_not_at_all(h: &Harness) {
    const PER: usize = 10;
    let s = h.store.clone();
    let old = s.lease_acquire("race", "w1", 1_000).await.unwrap();
    let writer = {
        let (s, fence) = (s.clone(), old.fence());
        tokio::spawn(async move {
            let mut outcomes: Vec<(usize, bool)> = Vec::new();
            // Until a few in a row were refused (the takeover happened), however long the clock
            // takes to expire the lease (a database's clock is real time).
            for i in 0..100_000 {
                if outcomes.len() >= 3 && outcomes[outcomes.len() - 3..].iter().all(|(_, ok)| !ok) {
                    break;
                }
                let txns = (0..PER).map(|j| Txn::put(format!("/race/{i:05}/{j}"), file(0), Origin::Remote)).collect();
                match s.apply_many(TxnBatch { fence: Some(fence.clone()), txns }).await {
                    Ok(out) => {
                        assert!(out.iter().all(|r| r.is_ok()), "{out:?}");
                        outcomes.push((i, true));
                    }
                    Err(Error::Fenced { .. }) => outcomes.push((i, false)),
                    Err(e) => panic!("batch {i}: {e}"),
                }
                tokio::task::yield_now().await;
            }
            outcomes
        })
    };
    h.clock.advance_ms(1_001).await;
    let new = s.lease_acquire("race", "w2", 60_000).await.unwrap();
    let outcomes = writer.await.unwrap();
    assert!(outcomes.iter().any(|(_, ok)| !ok), "the takeover refused later batches");
    let first_refused = outcomes.iter().position(|(_, ok)| !ok).unwrap();
    assert!(outcomes[first_refused..].iter().all(|(_, ok)| !ok), "once fenced, always fenced: {outcomes:?}");
    for (i, ok) in &outcomes {
        let below = all_below(&*s, &format!("/race/{i:05}"), 50).await.len();
        assert_eq!(below, if *ok { PER } else { 0 }, "batch {i}");
    }
    let txns = vec![Txn::put("/race/new", file(0), Origin::Remote)];
    assert!(s.apply_many(TxnBatch { fence: Some(new.fence()), txns }).await.unwrap()[0].is_ok());
}

//! The `Filer` contract, checked twice: on the in-process `LocalFiler` and through the HTTP API
//! with `HttpFiler`, so both implementations of the trait behave the same.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tidemark_core::model::{Content, MAX_BATCH, NewEntry, Origin, Precondition, Txn, TxnBatch};
use tidemark_core::{ByteRange, ByteStream, DeleteOptions, Error, Filer, WriteOptions};
use tidemark_filer::{DataDir, HttpFiler, LocalFiler, http};

struct Setup {
    filer: Arc<dyn Filer>,
    _dir: tempfile::TempDir,
    _server: Option<tokio::task::JoinHandle<()>>,
}

fn local() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let filer = LocalFiler::open(DataDir::open(dir.path()).unwrap()).unwrap();
    Setup { filer: Arc::new(filer), _dir: dir, _server: None }
}

async fn over_http(token: Option<&str>) -> (Setup, String) {
    let Setup { filer, _dir, .. } = local();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let token = token.map(str::to_string);
    let server = tokio::spawn(async move {
        http::serve(listener, filer, token, std::future::pending()).await.unwrap();
    });
    let client = HttpFiler::new(&addr, None).unwrap();
    (Setup { filer: Arc::new(client), _dir, _server: Some(server) }, addr)
}

async fn http_setup() -> Setup {
    over_http(None).await.0
}

/// The filer served on TCP and on its socket, reached by a client beside it (over the socket).
async fn socket_setup() -> Setup {
    let Setup { filer, _dir, .. } = local();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let socket = http::Socket::bind(_dir.path()).unwrap();
    let server = tokio::spawn(async move {
        http::serve_beside(listener, Some(socket), filer, Default::default(), None, std::future::pending())
            .await
            .unwrap();
    });
    let client = HttpFiler::new(&addr, None).unwrap().through_socket().await;
    assert_eq!(client.socket_path(), Some(_dir.path().join("filer.sock").to_str().unwrap()));
    Setup { filer: Arc::new(client), _dir, _server: Some(server) }
}

fn body(data: &[u8]) -> ByteStream {
    let chunks: Vec<std::io::Result<Bytes>> = data.chunks(10_000).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
    futures::stream::iter(chunks).boxed()
}

async fn read_all(f: &dyn Filer, path: &str, range: Option<ByteRange>) -> Vec<u8> {
    let (_, s) = f.read(path, range).await.unwrap_or_else(|e| panic!("read {path}: {e}"));
    let parts: Vec<Bytes> = s.map(|c| c.unwrap()).collect().await;
    parts.concat()
}

macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod on_local { $( #[tokio::test] async fn $name() { super::$name(&super::local()).await } )* }
        mod on_http { $( #[tokio::test] async fn $name() { super::$name(&super::http_setup().await).await } )* }
        mod on_socket { $( #[tokio::test] async fn $name() { super::$name(&super::socket_setup().await).await } )* }
    };
}

both!(
    write_and_read_small_and_large_files,
    apply_refuses_entries_that_promise_what_they_do_not_hold,
    listing_with_names_that_need_escaping,
    write_preconditions_and_kind_errors,
    deletes,
    fenced_apply_and_leases,
    change_log_long_poll,
    apply_cannot_steal_a_blob,
    batches_of_transactions_and_of_reads,
    a_renamed_file_keeps_its_bytes_and_a_replaced_one_lets_go,
    renames_under_a_remote_mount_are_in_place_where_it_syncs_and_refused_elsewhere,
    hard_links_answer_as_their_file_and_keep_its_bytes_until_the_last_name,
    a_sparse_write_sends_its_data_and_stores_the_whole_file,
);

/// A write that sends only its data ranges (the mount's upload of a file with holes) stores
/// the whole file: zeros in the holes, its MD5 the whole file's; a body that disagrees with its
/// layout stores nothing.
async fn a_sparse_write_sends_its_data_and_stores_the_whole_file(s: &Setup) {
    use tidemark_core::sparse::Sparse;
    let f = &*s.filer;
    let size = 5 << 20;
    let layout = Sparse::new(size, vec![(0, 3), (3 << 20, 4), (size - 1, 1)]).unwrap();
    let opts = WriteOptions { sparse: Some(layout.clone()), ..Default::default() };
    let e = f.write("/sparse/f", body(b"abcdefgh"), opts).await.unwrap();
    let mut whole = vec![0u8; size as usize];
    whole[..3].copy_from_slice(b"abc");
    whole[3 << 20..(3 << 20) + 4].copy_from_slice(b"defg");
    whole[size as usize - 1] = b'h';
    assert_eq!(e.size, size);
    let md5: String = {
        use md5::Digest;
        md5::Md5::digest(&whole).iter().map(|b| format!("{b:02x}")).collect()
    };
    assert_eq!(e.extended.get(tidemark_core::model::MD5_ATTR), Some(&md5), "the MD5 of the whole file");
    assert!(read_all(f, "/sparse/f", None).await == whole, "holes read as zeros");
    // A body longer or shorter than its ranges is refused, and the file kept as it was.
    for wrong in [&b"abcdefg"[..], b"abcdefghi"] {
        let opts = WriteOptions { sparse: Some(layout.clone()), ..Default::default() };
        assert!(f.write("/sparse/f", body(wrong), opts).await.is_err(), "{} bytes refused", wrong.len());
        assert_eq!(f.stat("/sparse/f").await.unwrap().unwrap().version, e.version);
    }
}

async fn write_and_read_small_and_large_files(s: &Setup) {
    let f = &*s.filer;
    let small = b"hello tidemark".to_vec();
    let e = f.write("/docs/readme.md", body(&small), WriteOptions::default()).await.unwrap();
    assert_eq!((e.size, e.content.clone()), (small.len() as u64, Content::Inline));
    assert_eq!(read_all(f, "/docs/readme.md", None).await, small);
    assert_eq!(read_all(f, "/docs/readme.md", Some(ByteRange { offset: 6, length: Some(4) })).await, b"tide");

    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let e = f.write("/docs/big.bin", body(&big), WriteOptions::default()).await.unwrap();
    assert!(matches!(e.content, Content::Blob { .. }));
    assert_eq!(e.size, big.len() as u64);
    assert_eq!(read_all(f, "/docs/big.bin", None).await, big);
    assert_eq!(
        read_all(f, "/docs/big.bin", Some(ByteRange { offset: 2_999_990, length: None })).await,
        &big[2_999_990..]
    );
    assert_eq!(
        read_all(f, "/docs/big.bin", Some(ByteRange { offset: 100, length: Some(1000) })).await,
        &big[100..1100]
    );
    assert!(matches!(
        f.read("/docs/big.bin", Some(ByteRange { offset: 4_000_000, length: None })).await,
        Err(Error::RangeNotSatisfiable { offset: 4_000_000, size: 3_000_000, .. })
    ));
    // A read at the very end reads nothing (as read(2) at end of file does), inline or blob.
    assert!(read_all(f, "/docs/big.bin", Some(ByteRange { offset: 3_000_000, length: None })).await.is_empty());
    assert!(read_all(f, "/docs/readme.md", Some(ByteRange { offset: 14, length: Some(1) })).await.is_empty());
    assert_eq!(
        read_all(f, "/docs/readme.md", Some(ByteRange { offset: 6, length: Some(u64::MAX) })).await,
        b"tidemark"
    );

    // Overwrite a blob with small content, then with nothing.
    f.write("/docs/big.bin", body(b"tiny"), WriteOptions::default()).await.unwrap();
    assert_eq!(read_all(f, "/docs/big.bin", None).await, b"tiny");
    let e = f.write("/docs/big.bin", body(b""), WriteOptions::default()).await.unwrap();
    assert_eq!((e.size, e.content), (0, Content::Empty));
    assert!(read_all(f, "/docs/big.bin", None).await.is_empty());

    let opts = WriteOptions { mode: Some(0o600), mtime_ms: Some(1_234), ..Default::default() };
    let e = f.write("/docs/m", body(b"x"), opts).await.unwrap();
    assert_eq!((e.mode, e.mtime_ms), (0o600, 1_234));
    assert_eq!(f.stat("/docs/m").await.unwrap().unwrap(), e);
    assert!(f.stat("/docs/none").await.unwrap().is_none());
    assert!(matches!(f.read("/docs/none", None).await, Err(Error::NotFound { .. })));
    assert!(matches!(f.read("/docs", None).await, Err(Error::IsADirectory { .. })));
}

async fn listing_with_names_that_need_escaping(s: &Setup) {
    let f = &*s.filer;
    let names = ["a b", "a+b", "a%20b", "a&b=c", "q?x", "h#1", "ü", "a-b", "a0"];
    for n in names {
        f.write(&format!("/esc/{n}"), body(n.as_bytes()), WriteOptions::default()).await.unwrap();
    }
    f.write("/esc/a/b", body(b"deep"), WriteOptions::default()).await.unwrap();
    let mut got = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = f.list("/esc", after.as_deref(), 2).await.unwrap();
        got.extend(page.entries.iter().map(|e| e.name().to_string()));
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let mut expected: Vec<String> = names.iter().map(|s| s.to_string()).chain(["a".to_string()]).collect();
    expected.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    assert_eq!(got, expected);
    for n in names {
        assert_eq!(read_all(f, &format!("/esc/{n}"), None).await, n.as_bytes());
    }
    let scanned = f.scan("/esc", None, 100).await.unwrap();
    assert_eq!(scanned.entries.len(), names.len() + 2);
    assert_eq!(f.count("/esc", None).await.unwrap(), names.len() as u64 + 2);
}

async fn write_preconditions_and_kind_errors(s: &Setup) {
    let f = &*s.filer;
    let absent = WriteOptions { precondition: Precondition::Absent, ..Default::default() };
    let e = f.write("/p/x", body(b"1"), absent.clone()).await.unwrap();
    assert_eq!(
        f.write("/p/x", body(b"2"), absent).await.unwrap_err(),
        Error::PreconditionFailed { path: "/p/x".into(), current: Some(e.version) }
    );
    let stale = WriteOptions { precondition: Precondition::Version(e.version + 1000), ..Default::default() };
    assert!(matches!(f.write("/p/x", body(&[7u8; 100_000]), stale).await, Err(Error::PreconditionFailed { .. })));
    let exact = WriteOptions { precondition: Precondition::Version(e.version), ..Default::default() };
    let e2 = f.write("/p/x", body(b"3"), exact).await.unwrap();
    assert!(e2.version > e.version);
    assert_eq!(read_all(f, "/p/x", None).await, b"3");
    assert!(matches!(f.write("/p", body(b"x"), WriteOptions::default()).await, Err(Error::IsADirectory { .. })));
    assert!(matches!(f.write("/p/x/y", body(b"x"), WriteOptions::default()).await, Err(Error::NotADirectory { .. })));
    assert!(matches!(f.write("/p/../x", body(b"x"), WriteOptions::default()).await, Err(Error::InvalidPath { .. })));
    assert!(matches!(f.write("/", body(b"x"), WriteOptions::default()).await, Err(Error::IsADirectory { .. })));
}

async fn deletes(s: &Setup) {
    let f = &*s.filer;
    f.write("/d/a/1", body(&[1u8; 70_000]), WriteOptions::default()).await.unwrap();
    f.write("/d/a/2", body(b"two"), WriteOptions::default()).await.unwrap();
    assert!(matches!(f.delete("/d/a", DeleteOptions::default()).await, Err(Error::DirectoryNotEmpty { .. })));
    let v = f.stat("/d/a/2").await.unwrap().unwrap().version;
    let stale = DeleteOptions { recursive: false, precondition: Precondition::Version(v + 99), ..Default::default() };
    assert!(matches!(f.delete("/d/a/2", stale).await, Err(Error::PreconditionFailed { .. })));
    f.delete(
        "/d/a/2",
        DeleteOptions { recursive: false, precondition: Precondition::Version(v), ..Default::default() },
    )
    .await
    .unwrap();
    f.delete("/d", DeleteOptions { recursive: true, ..Default::default() }).await.unwrap();
    assert!(f.stat("/d/a/1").await.unwrap().is_none());
    assert!(f.stat("/d").await.unwrap().is_none());
    assert!(matches!(f.delete("/d", DeleteOptions::default()).await, Err(Error::NotFound { .. })));
}

async fn fenced_apply_and_leases(s: &Setup) {
    let f = &*s.filer;
    // Long enough that a loaded machine does not expire it between two calls.
    let ttl = Duration::from_millis(1500);
    let lease = f.lease_acquire("fp-1", "worker-a", ttl).await.unwrap();
    assert_eq!(lease.generation, 1);
    assert!(matches!(f.lease_acquire("fp-1", "worker-b", ttl).await, Err(Error::LeaseHeld { .. })));
    let entry = NewEntry::file(5, 1, Content::Inline);
    let a = f
        .apply(
            Txn::put("/m/k", entry.clone(), Origin::Remote)
                .with_data(Bytes::from_static(b"fence"))
                .with_fence(lease.fence())
                .with_precondition(Precondition::Absent),
        )
        .await
        .unwrap();
    assert_eq!(a.new.as_ref().unwrap().size, 5);
    f.lease_renew(&lease.fence(), ttl).await.unwrap();
    assert_eq!(f.lease_get("fp-1").await.unwrap().unwrap().generation, 1);

    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    let b = f.lease_acquire("fp-1", "worker-b", ttl).await.unwrap();
    assert_eq!(b.generation, 2);
    let late = f.apply(Txn::put("/m/k", entry, Origin::Remote).with_fence(lease.fence())).await.unwrap_err();
    assert_eq!(late, Error::Fenced { lease: "fp-1".into(), current_generation: Some(2) });
    assert!(matches!(f.lease_release(&lease.fence()).await, Err(Error::Fenced { .. })));
    f.lease_release(&b.fence()).await.unwrap();
    assert!(f.lease_get("nope").await.unwrap().is_none());
}

async fn apply_refuses_entries_that_promise_what_they_do_not_hold(s: &Setup) {
    let f = &*s.filer;
    let refused = |txn: Txn, mentions: &'static str| async move {
        match f.apply(txn).await {
            Err(Error::InvalidArgument { message }) => assert!(message.contains(mentions), "{message}"),
            other => panic!("expected a refusal mentioning {mentions:?}: {other:?}"),
        }
    };
    // A size with nothing behind it: a GET would promise u64::MAX bytes.
    refused(Txn::put("/v/a", NewEntry::file(u64::MAX, 1, Content::Empty), Origin::Local), "size").await;
    refused(
        Txn::put("/v/a", NewEntry::file(u64::MAX, 1, Content::Inline), Origin::Local)
            .with_data(Bytes::from_static(b"x")),
        "1 bytes of inline data",
    )
    .await;
    refused(
        Txn::put("/v/a", NewEntry::file(3, 1, Content::Inline), Origin::Local).with_data(Bytes::from(vec![0; 70_000])),
        "inline",
    )
    .await;
    refused(Txn::put("/v/a", NewEntry::file(9, 1, Content::Remote), Origin::Local), "remote").await;
    // Unbounded extended attributes would travel in every response header for the entry.
    let mut big = NewEntry::file(0, 1, Content::Empty);
    big.extended.insert("k".into(), "v".repeat(9 * 1024));
    refused(Txn::put("/v/a", big, Origin::Local), "extended").await;
    // Keeping inline bytes (no data) keeps their size.
    f.apply(
        Txn::put("/v/b", NewEntry::file(2, 1, Content::Inline), Origin::Local).with_data(Bytes::from_static(b"ok")),
    )
    .await
    .unwrap();
    refused(Txn::put("/v/b", NewEntry::file(1_000, 2, Content::Inline), Origin::Local), "size").await;
    let kept = f.apply(Txn::put("/v/b", NewEntry::file(2, 3, Content::Inline), Origin::Local)).await.unwrap();
    assert_eq!(kept.new.unwrap().mtime_ms, 3);
    // A blob kept by a metadata update keeps its size.
    let e = f.write("/v/c", body(&vec![7u8; 100_000]), WriteOptions::default()).await.unwrap();
    let mut grown = NewEntry::file(u64::MAX, 4, e.content.clone());
    grown.mode = e.mode;
    refused(Txn::put("/v/c", grown, Origin::Local).with_precondition(Precondition::Version(e.version)), "size").await;
    assert_eq!(read_all(f, "/v/c", None).await.len(), 100_000);
    assert!(f.stat("/v/a").await.unwrap().is_none(), "nothing refused was written");
}

async fn change_log_long_poll(s: &Setup) {
    let f = s.filer.clone();
    let after = f.health().await.unwrap().last_seq;
    let quiet = tokio::time::Instant::now();
    assert!(f.changes(after, 10, Duration::from_millis(200)).await.unwrap().is_empty());
    assert!(quiet.elapsed() >= Duration::from_millis(150), "an empty long poll waits");

    let waiter = {
        let f = f.clone();
        tokio::spawn(async move { f.changes(after, 10, Duration::from_secs(20)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = tokio::time::Instant::now();
    f.write("/log/x", body(b"x"), WriteOptions::default()).await.unwrap();
    let got = waiter.await.unwrap().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "the long poll returns as soon as a record is written");
    assert_eq!(got.first().unwrap().seq, after + 1);
    assert!(got.iter().any(|c| c.path == "/log/x" && c.origin == Origin::Local));
}

async fn apply_cannot_steal_a_blob(s: &Setup) {
    let f = &*s.filer;
    let big = f.write("/b/one", body(&[9u8; 100_000]), WriteOptions::default()).await.unwrap();
    let Content::Blob { .. } = &big.content else { panic!("expected a blob") };
    let stolen = Txn::put("/b/two", big.to_new(), Origin::Local).with_precondition(Precondition::Absent);
    assert!(matches!(
        f.apply(stolen).await,
        Err(Error::InvalidArgument { .. }) | Err(Error::PreconditionFailed { .. })
    ));
    let unconditional = Txn::put("/b/one", big.to_new(), Origin::Local);
    assert!(matches!(f.apply(unconditional).await, Err(Error::InvalidArgument { .. })));
    // A metadata update that keeps the entry's own blob is fine, and the bytes stay.
    let mut meta = big.to_new();
    meta.extended.insert("k".into(), "v".into());
    f.apply(Txn::put("/b/one", meta, Origin::Local).with_precondition(Precondition::Version(big.version)))
        .await
        .unwrap();
    assert_eq!(read_all(f, "/b/one", None).await, vec![9u8; 100_000]);
}

/// A rename moves an entry with its blob: the bytes read back at the new path (the record that
/// removes the old path must not free them), and the blob of a file it replaced is freed.
async fn a_renamed_file_keeps_its_bytes_and_a_replaced_one_lets_go(s: &Setup) {
    let f = &*s.filer;
    let big = f.write("/mv/d/big", body(&[7u8; 100_000]), WriteOptions::default()).await.unwrap();
    let Content::Blob { .. } = &big.content else { panic!("expected a blob") };
    f.write("/mv/d/small", body(b"small"), WriteOptions::default()).await.unwrap();
    f.apply(Txn::rename("/mv/d", "/mv/e", Origin::Local)).await.unwrap();
    assert_eq!(read_all(f, "/mv/e/big", None).await, vec![7u8; 100_000]);
    assert_eq!(read_all(f, "/mv/e/small", None).await, b"small");
    assert!(matches!(f.read("/mv/d/big", None).await.err(), Some(Error::NotFound { .. })));
    // Over another file: the moved bytes stay, and read.
    let other = f.write("/mv/other", body(&[1u8; 100_000]), WriteOptions::default()).await.unwrap();
    let applied = f.apply(Txn::rename("/mv/e/big", "/mv/other", Origin::Local)).await.unwrap();
    assert_eq!(applied.new.unwrap().content, big.content);
    assert_ne!(other.content, big.content);
    assert_eq!(read_all(f, "/mv/other", None).await, vec![7u8; 100_000]);
    let recs = f.changes(applied.first_seq - 1, 10, Duration::ZERO).await.unwrap();
    assert_eq!(recs.last().unwrap().moved_to.as_deref(), Some("/mv/other"));
    // One blob left in the data directory: the moved one.
    assert_eq!(walk(&s._dir.path().join("blobs")), 1);
}

/// In a remote mount whose sync is on, a rename is made in place (the outbound sync moves the
/// bucket's keys after it); into, out of and across mounts, within a mount whose sync is off, and
/// for a directory that holds a mount, the filer refuses it with `CrossMount` (the mount then
/// copies).
async fn renames_under_a_remote_mount_are_in_place_where_it_syncs_and_refused_elsewhere(s: &Setup) {
    use tidemark_core::remote::{Mount, MountMapping, RemoteLocation, system_paths};
    let f = &*s.filer;
    let mount = |dir: &str, sync| Mount {
        dir: dir.into(),
        location: RemoteLocation { storage: "s".into(), bucket: "b".into(), path: String::new() },
        sync,
    };
    let mapping = MountMapping { mounts: vec![mount("/top/m", true), mount("/top/n", false)] };
    let doc = Bytes::from(serde_json::to_vec(&mapping).unwrap());
    let txn =
        Txn::put(system_paths::MOUNT_MAPPING, NewEntry::file(doc.len() as u64, 1, Content::Inline), Origin::System)
            .with_data(doc);
    f.apply(txn).await.unwrap();
    f.write("/top/m/in", body(b"x"), WriteOptions::default()).await.unwrap();
    f.write("/top/n/in", body(b"z"), WriteOptions::default()).await.unwrap();
    f.write("/top/out", body(b"y"), WriteOptions::default()).await.unwrap();
    for (from, to, says) in [
        ("/top/m/in", "/top/in", "/top/m"),
        ("/top/out", "/top/m/out", "/top/m"),
        ("/top/m/in", "/top/n/in2", "/top/m"),
        ("/top/n/in", "/top/n/in2", "sync is off"),
        ("/top", "/top2", "/top/m"),
        ("/top/m", "/top/m2", "/top/m"),
    ] {
        match f.apply(Txn::rename(from, to, Origin::Local)).await {
            Err(Error::CrossMount { message, .. }) => assert!(message.contains(says), "{message}"),
            other => panic!("{from} -> {to}: {other:?}"),
        }
    }
    assert_eq!(read_all(f, "/top/m/in", None).await, b"x");
    assert_eq!(read_all(f, "/top/n/in", None).await, b"z");
    // Within the mount that syncs: in place, and back.
    f.apply(Txn::rename("/top/m/in", "/top/m/d/in2", Origin::Local)).await.unwrap_err();
    f.write("/top/m/d/keep", body(b"k"), WriteOptions::default()).await.unwrap();
    f.apply(Txn::rename("/top/m/in", "/top/m/d/in2", Origin::Local)).await.unwrap();
    assert_eq!(read_all(f, "/top/m/d/in2", None).await, b"x");
    f.apply(Txn::rename("/top/m/d", "/top/m/e", Origin::Local)).await.unwrap();
    assert_eq!(read_all(f, "/top/m/e/in2", None).await, b"x");
    // Nor a second name: an object has one key.
    for (from, to) in [("/top/m/e/in2", "/top/in-link"), ("/top/out", "/top/m/out-link")] {
        match f.apply(Txn::link(from, to, Origin::Local)).await {
            Err(Error::CrossMount { message, .. }) => assert!(message.contains("/top/m"), "{message}"),
            other => panic!("link {from} -> {to}: {other:?}"),
        }
    }
}

/// Every name of a hard-linked file answers as the file (stat, list, scan, read: its size,
/// bytes, count of names and version, under the name asked for); a write at its inode entry
/// (what the mount does) changes it for every name, and so does a put of what was read at a name
/// (its attributes); a write of content at a name through the API replaces that name alone, as a
/// PUT replaces an object; preconditions hold on the version a name answered; the bytes go with
/// the last name.
async fn hard_links_answer_as_their_file_and_keep_its_bytes_until_the_last_name(s: &Setup) {
    let f = &*s.filer;
    f.write("/hl/a", body(&[7u8; 100_000]), WriteOptions::default()).await.unwrap();
    let inode = f.apply(Txn::link("/hl/a", "/hl/b", Origin::Local)).await.unwrap().new.unwrap();
    let id = tidemark_core::model::inode_of_path(&inode.path).unwrap();
    assert_eq!(inode.posix.nlink, Some(2));
    let seen = f.stat_many(&["/hl/a".into(), "/hl/b".into()]).await.unwrap();
    let listed = f.list("/hl", None, 10).await.unwrap().entries;
    let scanned = f.scan("/hl", None, 10).await.unwrap().entries;
    for (i, p) in ["/hl/a", "/hl/b"].into_iter().enumerate() {
        for e in [f.stat(p).await.unwrap().unwrap(), seen[i].clone().unwrap(), listed[i].clone(), scanned[i].clone()] {
            assert_eq!(e.path, p);
            assert_eq!((e.size, e.version, e.posix.nlink, e.posix.inode), (100_000, inode.version, Some(2), Some(id)));
            assert_eq!(e.content, inode.content);
        }
        assert_eq!(read_all(f, p, Some(ByteRange { offset: 99_999, length: None })).await, vec![7u8]);
    }
    // The mount writes the file at its inode entry: every name reads the new bytes.
    f.write(&inode.path, body(&[2u8; 50_000]), WriteOptions::default()).await.unwrap();
    for p in ["/hl/a", "/hl/b"] {
        assert_eq!(read_all(f, p, None).await, vec![2u8; 50_000], "{p}");
    }
    // What a writer read of a name and writes back — attributes, as the gateway's tagging does —
    // goes to the file; a precondition on the version it read holds.
    let b = f.stat("/hl/b").await.unwrap().unwrap();
    let mut tagged = b.to_new();
    tagged.extended.insert("s3.tag.colour".into(), "blue".into());
    let put = Txn::put("/hl/b", tagged, Origin::Local).with_precondition(Precondition::Version(b.version));
    let applied = f.apply(put).await.unwrap();
    assert_eq!(applied.new.as_ref().map(|e| (e.path.as_str(), e.posix.inode)), Some(("/hl/b", Some(id))));
    let a = f.stat("/hl/a").await.unwrap().unwrap();
    assert_eq!(a.extended.get("s3.tag.colour").map(String::as_str), Some("blue"), "seen through the other name");
    let stale = Txn::put("/hl/b", b.to_new(), Origin::Local).with_precondition(Precondition::Version(b.version));
    assert!(matches!(f.apply(stale).await, Err(Error::PreconditionFailed { .. })), "the file changed since");
    // A write at one name through the API replaces that name (conditional on what it read).
    let opts = WriteOptions { precondition: Precondition::Version(a.version), ..Default::default() };
    f.write("/hl/b", body(b"new object"), opts).await.unwrap();
    assert_eq!(read_all(f, "/hl/b", None).await, b"new object");
    let a = f.stat("/hl/a").await.unwrap().unwrap();
    assert_eq!((a.size, a.posix.nlink), (50_000, Some(1)));
    assert_eq!(read_all(f, "/hl/a", None).await, vec![2u8; 50_000]);
    // The last name takes the inode entry and its bytes with it (/hl/b's ten bytes are inline:
    // no blob is left).
    let del = DeleteOptions { precondition: Precondition::Version(a.version + 1), ..Default::default() };
    assert!(matches!(f.delete("/hl/a", del).await, Err(Error::PreconditionFailed { .. })));
    let a = f.stat("/hl/a").await.unwrap().unwrap();
    let del = DeleteOptions { precondition: Precondition::Version(a.version), ..Default::default() };
    f.delete("/hl/a", del).await.unwrap();
    assert!(f.stat(&inode.path).await.unwrap().is_none());
    assert_eq!(walk(&s._dir.path().join("blobs")), 0);
}

/// `apply_many` and `stat_many` through the filer: each transaction's own checks (the store's
/// and the filer's) fail it alone, the batch's fence fails it whole, replaced blobs are removed.
async fn batches_of_transactions_and_of_reads(s: &Setup) {
    let f = &*s.filer;
    let old = f.write("/bt/blob", body(&[1u8; 100_000]), WriteOptions::default()).await.unwrap();
    let lease = f.lease_acquire("bt", "w", Duration::from_secs(30)).await.unwrap();
    let txns = vec![
        Txn::put("/bt/a/1", NewEntry::file(0, 1, Content::Empty), Origin::Remote),
        // Refused by the filer's own check (a size with nothing behind it).
        Txn::put("/bt/a/2", NewEntry::file(5, 1, Content::Empty), Origin::Remote),
        // Refused by the store (precondition).
        Txn::put("/bt/a/3", NewEntry::file(0, 1, Content::Empty), Origin::Remote)
            .with_precondition(Precondition::Version(old.version + 1_000)),
        // Replaces the blob's entry: its bytes go.
        Txn::put("/bt/blob", NewEntry::file(2, 1, Content::Inline), Origin::Remote)
            .with_data(Bytes::from_static(b"hi"))
            .with_precondition(Precondition::Version(old.version)),
    ];
    let out = f.apply_many(TxnBatch { fence: Some(lease.fence()), txns }).await.unwrap();
    assert!(out[0].is_ok() && out[3].is_ok(), "{out:?}");
    assert!(matches!(&out[1], Err(Error::InvalidArgument { message }) if message.contains("size")), "{:?}", out[1]);
    assert!(matches!(out[2], Err(Error::PreconditionFailed { .. })), "{:?}", out[2]);
    assert_eq!(read_all(f, "/bt/blob", None).await, b"hi");

    let paths: Vec<String> = ["/bt/a/1", "/bt/a/2", "/bt/blob", "/bt"].iter().map(|p| p.to_string()).collect();
    let got = f.stat_many(&paths).await.unwrap();
    assert_eq!(got.iter().map(Option::is_some).collect::<Vec<_>>(), [true, false, true, true]);
    assert_eq!(got[2].as_ref().unwrap().size, 2);
    let too_many: Vec<String> = (0..=MAX_BATCH).map(|i| format!("/bt/{i}")).collect();
    assert!(matches!(f.stat_many(&too_many).await, Err(Error::InvalidArgument { .. })));

    // A fence that no longer holds: nothing of the batch.
    f.lease_release(&lease.fence()).await.unwrap();
    f.lease_acquire("bt", "other", Duration::from_secs(30)).await.unwrap();
    let txns = vec![Txn::put("/bt/late", NewEntry::file(0, 1, Content::Empty), Origin::Remote)];
    assert!(matches!(f.apply_many(TxnBatch { fence: Some(lease.fence()), txns }).await, Err(Error::Fenced { .. })));
    assert!(f.stat("/bt/late").await.unwrap().is_none());
}

// ---- HTTP only: what a client that is not `HttpFiler` sees ----

async fn raw(
    addr: &str,
    method: reqwest::Method,
    path_and_query: &str,
    body: Option<&str>,
    token: Option<&str>,
) -> (u16, serde_json::Value) {
    let mut rb = reqwest::Client::new().request(method, format!("http://{addr}{path_and_query}"));
    if let Some(b) = body {
        rb = rb.header("content-type", "application/json").body(b.to_string());
    }
    if let Some(t) = token {
        rb = rb.bearer_auth(t);
    }
    let resp = rb.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON ({status}): {text}")))
}

#[tokio::test]
async fn malformed_requests_get_a_4xx_json_error_naming_the_problem() {
    let (_s, addr) = over_http(None).await;
    let get = reqwest::Method::GET;
    let post = reqwest::Method::POST;
    // (method, path and query, body, status, error code, a word the message must contain)
    type Case<'a> = (reqwest::Method, &'a str, Option<&'a str>, u16, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (get.clone(), "/api/v1/entry", None, 400, "invalid_argument", "path"),
        (get.clone(), "/api/v1/entry?path=relative", None, 400, "invalid_path", "absolute"),
        (get.clone(), "/api/v1/entry?path=/a/../b", None, 400, "invalid_path", "`..`"),
        (get.clone(), "/api/v1/list?dir=/&limit=0", None, 400, "invalid_argument", "limit"),
        (get.clone(), "/api/v1/list?dir=/&limit=banana", None, 400, "invalid_argument", "limit"),
        (get.clone(), "/api/v1/list?dir=/nowhere", None, 404, "not_found", "/nowhere"),
        (post.clone(), "/api/v1/apply", Some("{not json"), 400, "invalid_argument", "JSON"),
        (post.clone(), "/api/v1/apply", Some(r#"{"path": "/x"}"#), 400, "invalid_argument", "mutation"),
        (
            post.clone(),
            "/api/v1/apply",
            Some(r#"{"path":"/x","mutation":{"op":"explode"},"origin":"local"}"#),
            400,
            "invalid_argument",
            "explode",
        ),
        (
            post.clone(),
            "/api/v1/lease/acquire",
            Some(r#"{"name":"x","holder":"h","ttl_ms":0}"#),
            400,
            "invalid_argument",
            "ttl",
        ),
        (get.clone(), "/api/v1/nope", None, 404, "not_found", "endpoint"),
        (reqwest::Method::PATCH, "/api/v1/entry?path=/", None, 405, "invalid_argument", "method"),
        (get.clone(), "/api/v1/changes?after=-1", None, 400, "invalid_argument", "after"),
    ];
    for (method, pq, body, status, code, mentions) in cases {
        let (got, json) = raw(&addr, method.clone(), pq, body, None).await;
        assert_eq!(got, status, "{method} {pq}: {json}");
        assert_eq!(json["error"]["code"], code, "{method} {pq}: {json}");
        let message = json["message"].as_str().unwrap();
        assert!(message.contains(mentions), "{method} {pq}: {message:?} should mention {mentions:?}");
    }
    // A sparse layout that is not one: refused before the body, naming the layout.
    for layout in ["banana", "10;4+2;5+1", "10;9+5"] {
        let r = reqwest::Client::new()
            .put(format!("http://{addr}/api/v1/content?path=/sp"))
            .header(http::SPARSE_HEADER, layout)
            .body("xx")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{layout}");
        let json: serde_json::Value = r.json().await.unwrap();
        assert!(json["message"].as_str().unwrap().contains("sparse"), "{layout}: {json}");
    }
}

#[tokio::test]
async fn ranges_are_parsed_with_checked_arithmetic_and_416_where_nothing_is_selected() {
    let (s, addr) = over_http(None).await;
    s.filer.write("/six", body(b"abcdef"), WriteOptions::default()).await.unwrap();
    let get = |range: &'static str| {
        let url = format!("http://{addr}/api/v1/content?path=/six");
        async move { reqwest::Client::new().get(url).header("range", range).send().await.unwrap() }
    };
    // The largest end there is: everything, not an overflow (a debug build used to panic).
    let r = get("bytes=0-18446744073709551615").await;
    assert_eq!(r.status(), 206);
    assert_eq!(r.headers()["content-range"], "bytes 0-5/6");
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"abcdef");
    let r = get("bytes=4-").await;
    assert_eq!((r.status().as_u16(), r.headers()["content-range"].to_str().unwrap()), (206, "bytes 4-5/6"));
    // Starting at or past the end selects no byte: 416 with the length, never `bytes 6-5/6`.
    for range in ["bytes=6-", "bytes=6-9", "bytes=7-", "bytes=18446744073709551615-"] {
        let r = get(range).await;
        assert_eq!(r.status(), 416, "{range}");
        assert_eq!(r.headers()["content-range"], "bytes */6", "{range}");
        let json: serde_json::Value = r.json().await.unwrap();
        assert_eq!(json["error"]["code"], "range_not_satisfiable", "{range}");
    }
    for range in ["bytes=5-4", "bytes=-3", "bytes=0-99999999999999999999", "items=0-1"] {
        assert_eq!(get(range).await.status(), 400, "{range}");
    }
}

/// A data token reaches the namespace and nothing of the control plane: the system documents
/// (a remote's secret key here), leases, and the directories above `/etc/tidemark` whose
/// removal would take it along.
#[tokio::test]
async fn a_data_token_reaches_the_namespace_not_the_control_plane() {
    let Setup { filer, _dir, .. } = local();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let tokens = http::Tokens {
        admin: Some("adm".into()),
        data: vec!["dat".into(), "dat2".into()],
        cluster: None,
        cluster_file: None,
    };
    tokens.check().unwrap();
    let _server =
        tokio::spawn(async move { http::serve_with(listener, filer, tokens, None, std::future::pending()).await });
    let admin = HttpFiler::new(&addr, Some("adm".into())).unwrap();
    let data = HttpFiler::new(&addr, Some("dat".into())).unwrap();
    let conf = "/etc/tidemark/remote/s3.conf";
    let secret = br#"{"name":"s3","type":"s3","settings":{"secret_key":"wJalrXUtnFEMI"}}"#;
    admin.write(conf, body(secret), WriteOptions::default()).await.unwrap();
    assert_eq!(read_all(&admin, conf, None).await, secret, "the admin token reaches everything");

    // The namespace: read, write, list, scan, delete.
    data.write("/docs/a.txt", body(b"data"), WriteOptions::default()).await.unwrap();
    assert_eq!(read_all(&data, "/docs/a.txt", None).await, b"data");
    assert_eq!(data.list("/docs", None, 10).await.unwrap().entries.len(), 1);
    let scanned = data.scan("/", None, 1000).await.unwrap();
    assert!(scanned.entries.iter().any(|e| e.path == "/docs/a.txt"));
    assert!(scanned.entries.iter().all(|e| !e.path.starts_with("/etc/tidemark")), "{:?}", scanned.entries);
    assert!(data.list("/etc", None, 10).await.is_ok(), "/etc itself is the namespace's");
    // Counts above the system directory leave it out, so they do not move with it (the admin
    // sees it all).
    let counts = || async { (data.count("/", None).await.unwrap(), data.count("/etc", None).await.unwrap()) };
    let before = counts().await;
    assert_eq!(before.1, 0, "nothing of /etc/tidemark in a data client's count of /etc");
    admin.write("/etc/tidemark/remote/other.conf", body(b"{}"), WriteOptions::default()).await.unwrap();
    assert_eq!(counts().await, before, "a change in the system directory does not show");
    assert!(admin.count("/etc", None).await.unwrap() >= 4, "the admin's count has it all");
    unauthorized_count(data.count("/etc/tidemark", None).await);
    // Paged through with a small limit, a scan's pages are full whatever lies in the system
    // directory (their size would otherwise count it), and names beside it (`/etc/tidemark-x`
    // sorts between the directory and its subtree) are not skipped.
    for p in ["/etc/a.txt", "/etc/tidemark-x/b.txt", "/etc/z.txt"] {
        data.write(p, body(b"x"), WriteOptions::default()).await.unwrap();
    }
    for i in 0..20 {
        admin.write(&format!("/etc/tidemark/s3/uploads/u{i}"), body(b"{}"), WriteOptions::default()).await.unwrap();
    }
    let mut whole = admin.scan("/", None, 10_000).await.unwrap().entries;
    whole.retain(|e| !e.path.starts_with("/etc/tidemark/") && e.path != "/etc/tidemark");
    let wanted: Vec<String> = whole.into_iter().map(|e| e.path).collect();
    for limit in [1, 2, 3] {
        let (mut got, mut after) = (Vec::new(), None::<String>);
        loop {
            let page = data.scan("/", after.as_deref(), limit).await.unwrap();
            if page.next.is_some() {
                assert_eq!(page.entries.len(), limit, "a page before the last is full");
            }
            got.extend(page.entries.iter().map(|e| e.path.clone()));
            match page.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        assert_eq!(got, wanted, "limit {limit}");
    }

    // Not the system directory: no read (the secret), no write (a planted document), no delete.
    let unauthorized = |r: Result<(), Error>| match r {
        Err(Error::Unauthorized { message }) => assert!(message.contains("/etc/tidemark"), "{message}"),
        other => panic!("expected a refusal: {other:?}"),
    };
    unauthorized(data.read(conf, None).await.map(drop));
    unauthorized(data.stat(conf).await.map(drop));
    unauthorized(data.list("/etc/tidemark/remote", None, 10).await.map(drop));
    unauthorized(data.write(conf, body(b"{}"), WriteOptions::default()).await.map(drop));
    unauthorized(
        data.write("/etc/tidemark/remote_events/subscriptions/x.json", body(b"{}"), WriteOptions::default())
            .await
            .map(drop),
    );
    let put = Txn::put(conf, NewEntry::file(2, 1, Content::Inline), Origin::Local).with_data(Bytes::from_static(b"{}"));
    unauthorized(data.apply(put.clone()).await.map(drop));
    // A batch is refused whole if any of it reaches the system directory, or carries a fence.
    let harmless = Txn::put("/docs/b", NewEntry::file(0, 1, Content::Empty), Origin::Local);
    let mixed = TxnBatch { fence: None, txns: vec![harmless.clone(), put] };
    unauthorized(data.apply_many(mixed).await.map(drop));
    assert!(data.stat("/docs/b").await.unwrap().is_none(), "nothing of a refused batch lands");
    let fence = tidemark_core::Fence { lease: "l".into(), holder: "h".into(), generation: 1 };
    unauthorized(data.apply_many(TxnBatch { fence: Some(fence), txns: vec![harmless.clone()] }).await.map(drop));
    unauthorized(data.stat_many(&["/docs/a.txt".to_string(), conf.to_string()]).await.map(drop));
    assert_eq!(data.apply_many(TxnBatch { fence: None, txns: vec![harmless] }).await.unwrap().len(), 1);
    for above in ["/", "/etc", "/etc/tidemark"] {
        unauthorized(data.delete(above, DeleteOptions { recursive: true, ..Default::default() }).await.map(drop));
    }
    unauthorized(data.lease_acquire("filer/outbound-sync", "me", Duration::from_secs(5)).await.map(drop));
    unauthorized(data.lease_get("filer/outbound-sync").await.map(drop));
    unauthorized(data.cache_status(&[conf.to_string()]).await.map(drop));
    assert_eq!(read_all(&admin, conf, None).await, secret, "untouched");

    // The change log keeps its sequence but not what happened in the system directory.
    let records = data.changes(0, 1000, Duration::ZERO).await.unwrap();
    let system: Vec<_> =
        records.iter().filter(|r| r.path == "/etc/tidemark" || r.path.starts_with("/etc/tidemark/")).collect();
    assert!(!system.is_empty());
    assert!(system.iter().all(|r| r.path == "/etc/tidemark" && r.old.is_none() && r.new.is_none()), "{system:?}");
    assert!(records.iter().any(|r| r.path == "/docs/a.txt" && r.new.is_some()));
    assert!(matches!(
        HttpFiler::new(&addr, Some("nope".into())).unwrap().health().await,
        Err(Error::Unauthorized { .. })
    ));
    // Data tokens alone would leave the control plane open.
    assert!(http::Tokens { admin: None, data: vec!["d".into()], cluster: None, cluster_file: None }.check().is_err());
    let same = http::Tokens { admin: Some("a".into()), data: vec!["a".into()], cluster: None, cluster_file: None };
    assert!(same.check().is_err());
}

fn unauthorized_count(r: Result<u64, Error>) {
    assert!(matches!(r, Err(Error::Unauthorized { .. })), "{r:?}");
}

/// With a cluster token, only it reads the secrets of system documents; the admin token reads
/// them masked, and a document it writes back with the masks keeps the stored secrets.
#[tokio::test]
async fn secrets_are_the_cluster_tokens_alone() {
    let Setup { filer, _dir, .. } = local();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let tokens =
        http::Tokens { admin: Some("adm".into()), data: vec![], cluster: Some("clu".into()), cluster_file: None };
    tokens.check().unwrap();
    let _server =
        tokio::spawn(async move { http::serve_with(listener, filer, tokens, None, std::future::pending()).await });
    let admin = HttpFiler::new(&addr, Some("adm".into())).unwrap();
    let cluster = HttpFiler::new(&addr, Some("clu".into())).unwrap();
    let conf = "/etc/tidemark/remote/s3.conf";
    let json = |v: Vec<u8>| serde_json::from_slice::<serde_json::Value>(&v).unwrap();
    let doc = serde_json::json!({"name": "s3", "type": "s3", "settings": {"access_key": "AKIA", "secret_key": "wJalrXUtnFEMI/K7MDENG"}});
    admin.write(conf, body(&serde_json::to_vec(&doc).unwrap()), WriteOptions::default()).await.unwrap();
    assert_eq!(json(read_all(&cluster, conf, None).await), doc, "the cluster reads it whole");
    let (entry, _) = admin.read(conf, None).await.unwrap();
    let shown = read_all(&admin, conf, None).await;
    assert_eq!(entry.size, shown.len() as u64, "the entry describes what is served");
    let mut shown = json(shown);
    assert_eq!(shown["settings"]["secret_key"], "****DENG");
    assert_eq!(shown["settings"]["access_key"], "AKIA");
    assert!(
        !String::from_utf8(read_all(&admin, conf, Some(ByteRange { offset: 0, length: None })).await)
            .unwrap()
            .contains("wJalr")
    );
    // Written back with a setting added (what remote.configure does): the secret stays.
    shown["settings"]["region"] = serde_json::json!("eu-west-1");
    admin.write(conf, body(&serde_json::to_vec(&shown).unwrap()), WriteOptions::default()).await.unwrap();
    let now = json(read_all(&cluster, conf, None).await);
    assert_eq!(
        (now["settings"]["secret_key"].as_str(), now["settings"]["region"].as_str()),
        (Some("wJalrXUtnFEMI/K7MDENG"), Some("eu-west-1"))
    );
    // The same through apply.
    let data = Bytes::from(serde_json::to_vec(&shown).unwrap());
    let put = Txn::put(conf, NewEntry::file(data.len() as u64, 1, Content::Inline), Origin::Local).with_data(data);
    admin.apply(put).await.unwrap();
    assert_eq!(json(read_all(&cluster, conf, None).await)["settings"]["secret_key"], "wJalrXUtnFEMI/K7MDENG");
    // A mask of no stored secret is refused, never stored.
    let orphan = serde_json::json!({"settings": {"secret_key": "****zzzz"}});
    match admin.write(conf, body(&serde_json::to_vec(&orphan).unwrap()), WriteOptions::default()).await {
        Err(Error::InvalidArgument { message }) => assert!(message.contains("give the secret itself"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(json(read_all(&cluster, conf, None).await)["settings"]["secret_key"], "wJalrXUtnFEMI/K7MDENG");
    // Two S3 identities whose secrets end alike: the admin adds a third with the others masked
    // (what s3.configure -apply does), and each keeps its own secret.
    let ids = "/etc/tidemark/s3/identities.json";
    let two = serde_json::json!({"identities": [
        {"name": "alice", "credentials": [{"access_key": "AK1", "secret_key": "alice-secret-WXYZ"}]},
        {"name": "bob", "credentials": [{"access_key": "AK2", "secret_key": "bobs-secret-WXYZ"}]}]});
    admin.write(ids, body(&serde_json::to_vec(&two).unwrap()), WriteOptions::default()).await.unwrap();
    let mut shown = json(read_all(&admin, ids, None).await);
    shown["identities"].as_array_mut().unwrap().push(
        serde_json::json!({"name": "carol", "credentials": [{"access_key": "AK3", "secret_key": "carol-secret-0000"}]}),
    );
    admin.write(ids, body(&serde_json::to_vec(&shown).unwrap()), WriteOptions::default()).await.unwrap();
    let now = json(read_all(&cluster, ids, None).await);
    let secrets: Vec<&str> = now["identities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["credentials"][0]["secret_key"].as_str().unwrap())
        .collect();
    assert_eq!(secrets, ["alice-secret-WXYZ", "bobs-secret-WXYZ", "carol-secret-0000"]);
    // Files outside the system directory are untouched by all this.
    admin.write("/docs/secret_key.json", body(br#"{"secret_key":"mine"}"#), WriteOptions::default()).await.unwrap();
    assert_eq!(read_all(&admin, "/docs/secret_key.json", None).await, br#"{"secret_key":"mine"}"#);
}

#[tokio::test]
async fn a_token_protects_every_endpoint() {
    let (_s, addr) = over_http(Some("s3cret")).await;
    for pq in ["/api/v1/health", "/api/v1/entry?path=/", "/api/v1/nope"] {
        let (status, json) = raw(&addr, reqwest::Method::GET, pq, None, None).await;
        assert_eq!((status, json["error"]["code"].as_str()), (401, Some("unauthorized")), "{pq}");
        let (status, _) = raw(&addr, reqwest::Method::GET, pq, None, Some("wrong")).await;
        assert_eq!(status, 401);
    }
    let (status, json) = raw(&addr, reqwest::Method::GET, "/api/v1/health", None, Some("s3cret")).await;
    assert_eq!((status, json["status"].as_str()), (200, Some("ok")));
    let no_token = HttpFiler::new(&addr, None).unwrap();
    assert!(matches!(no_token.health().await, Err(Error::Unauthorized { .. })));
    let with_token = HttpFiler::new(&addr, Some("s3cret".into())).unwrap();
    assert_eq!(with_token.health().await.unwrap().store, "sqlite");
}

/// A batch whose body is over the limit (inline content adds up) is refused with a message that
/// says so, and nothing of it lands.
#[tokio::test]
async fn an_oversized_batch_body_is_refused_clearly() {
    let (s, _addr) = over_http(None).await;
    let data = Bytes::from(vec![b'z'; 60 * 1024]);
    let txns: Vec<Txn> = (0..300)
        .map(|i| {
            Txn::put(format!("/big/{i}"), NewEntry::file(data.len() as u64, 1, Content::Inline), Origin::Local)
                .with_data(data.clone())
        })
        .collect();
    match s.filer.apply_many(TxnBatch { fence: None, txns }).await {
        Err(Error::InvalidArgument { message }) => assert!(message.contains("too large"), "{message}"),
        other => panic!("expected a refusal of the body: {other:?}"),
    }
    assert!(s.filer.stat("/big").await.unwrap().is_none());
}

#[tokio::test]
async fn an_unreachable_filer_is_unavailable_and_says_where() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let f = HttpFiler::new(&format!("127.0.0.1:{port}"), None).unwrap();
    let err = f.health().await.unwrap_err();
    assert!(err.is_retryable());
    let msg = err.to_string();
    assert!(msg.contains(&format!("127.0.0.1:{port}")) && msg.contains("cannot connect"), "{msg}");
}

#[tokio::test]
async fn overwrites_and_deletes_remove_unreferenced_blobs() {
    let dir = tempfile::tempdir().unwrap();
    let filer = LocalFiler::open(DataDir::open(dir.path()).unwrap()).unwrap();
    let count = || walk(&dir.path().join("blobs"));
    filer.write("/x/a", body(&[1u8; 100_000]), WriteOptions::default()).await.unwrap();
    filer.write("/x/b", body(&[2u8; 100_000]), WriteOptions::default()).await.unwrap();
    assert_eq!(count(), 2);
    filer.write("/x/a", body(&[3u8; 100_000]), WriteOptions::default()).await.unwrap();
    assert_eq!(count(), 2, "the overwritten blob is removed");
    let failed = WriteOptions { precondition: Precondition::Version(1), ..Default::default() };
    assert!(filer.write("/x/new", body(&[4u8; 100_000]), failed).await.is_err());
    assert_eq!(count(), 2, "a failed write leaves no blob");
    filer.delete("/x", DeleteOptions { recursive: true, ..Default::default() }).await.unwrap();
    assert_eq!(count(), 0, "a recursive delete removes the blobs below it");
}

fn walk(p: &std::path::Path) -> usize {
    std::fs::read_dir(p)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() { walk(&e.path()) } else { 1 }
        })
        .sum()
}

/// Hostile input never makes the filer panic or answer 5xx: random bytes as JSON bodies, random
/// strings as paths and query values, on every endpoint.
#[tokio::test]
async fn hostile_requests_never_crash_the_filer() {
    let (_s, addr) = over_http(None).await;
    let client = reqwest::Client::new();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let alphabet: &[&str] = &["/", "..", ".", "%00", "%ff", "a", "ü", "//", "%2F", " ", "+", "&", "=", "{", "\"", "\\"];
    let endpoints = [
        "entry",
        "list",
        "scan",
        "content",
        "apply",
        "apply-many",
        "entries",
        "lease",
        "lease/acquire",
        "lease/renew",
        "lease/release",
        "changes",
    ];
    let params = ["path", "dir", "start_after", "limit", "after", "wait_ms", "name", "recursive", "if_version", "mode"];
    for i in 0..400 {
        let endpoint = endpoints[(next() % endpoints.len() as u64) as usize];
        let mut query = String::new();
        for _ in 0..(next() % 3 + 1) {
            let p = params[(next() % params.len() as u64) as usize];
            let value: String =
                (0..(next() % 6)).map(|_| alphabet[(next() % alphabet.len() as u64) as usize]).collect();
            query.push_str(&format!("{p}={value}&"));
        }
        let body: Vec<u8> = (0..(next() % 64)).map(|_| next() as u8).collect();
        let method =
            [reqwest::Method::GET, reqwest::Method::POST, reqwest::Method::PUT, reqwest::Method::DELETE][i % 4].clone();
        let url = format!("http://{addr}/api/v1/{endpoint}?{query}wait_ms=0");
        let resp = client.request(method.clone(), &url).body(body).send().await.unwrap();
        let status = resp.status();
        assert!(!status.is_server_error(), "{method} {url} answered {status}");
        if !status.is_success() {
            let json: serde_json::Value = serde_json::from_str(&resp.text().await.unwrap()).expect("errors are JSON");
            assert!(json["error"]["code"].is_string() && json["message"].is_string());
        }
    }
    let f = HttpFiler::new(&addr, None).unwrap();
    assert_eq!(f.health().await.unwrap().status, "ok", "still serving");
}

/// A list of filers (`A,B`): requests go to one that answers; a request whose connection failed
/// is sent to the next at once; a write that failed is not sent again (its body may have
/// reached a filer), the next request goes to the next filer.
#[tokio::test]
async fn a_list_of_filers_fails_over_to_one_that_answers() {
    let (s, addr) = over_http(None).await;
    let dead =
        format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port());
    let f = HttpFiler::new(&format!("{dead}, {addr}"), None).unwrap();
    assert!(f.base_url().ends_with(&dead));
    f.health().await.expect("the second filer answers");
    assert!(f.base_url().ends_with(&addr), "requests now go to the filer that answered");
    f.write("/failover.txt", body(b"via the second"), WriteOptions::default()).await.unwrap();
    assert_eq!(s.filer.stat("/failover.txt").await.unwrap().unwrap().size, 14);
    // Both gone: the error names the last one tried; a write is tried once.
    let f = HttpFiler::new(&format!("{dead},{dead}"), None).unwrap();
    assert!(f.write("/x", body(b"never"), WriteOptions::default()).await.unwrap_err().is_retryable());
    let err = f.stat("/x").await.unwrap_err().to_string();
    assert!(err.contains(&dead) && err.contains("cannot connect"), "{err}");
    assert!(HttpFiler::new(" , ", None).unwrap_err().to_string().contains("no filer address"));
}

/// A PUT declaring more bytes than the data directory has free is refused at once with 413 and
/// a reason, before a byte of its body is read or spooled; one that fits is stored as before.
#[tokio::test]
async fn a_declared_length_beyond_the_free_space_is_refused_before_the_body() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (setup, addr) = over_http(None).await;
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    // 6 TB declared, no body sent.
    s.write_all(
        b"PUT /api/v1/content?path=/huge.bin HTTP/1.1\r\nHost: localhost\r\nContent-Length: 6000000000000\r\n\r\n",
    )
    .await
    .unwrap();
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), s.read(&mut answer)).await.unwrap().unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("too_large") && answer.contains("6000000000000") && answer.contains("free"), "{answer}");
    assert!(setup.filer.stat("/huge.bin").await.unwrap().is_none());
    let tmp = setup._dir.path().join("tmp");
    assert_eq!(std::fs::read_dir(&tmp).map_or(0, |d| d.count()), 0, "nothing spooled");
    // A body that fits, declared.
    let big = vec![7u8; 200_000];
    let r = reqwest::Client::new()
        .put(format!("http://{addr}/api/v1/content?path=/fits.bin"))
        .body(big.clone())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    assert_eq!(read_all(&*setup.filer, "/fits.bin", None).await, big);
}

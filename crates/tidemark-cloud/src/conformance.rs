//! The `RemoteStorage` conformance suite. Each provider's tests invoke
//! [`remote_storage_conformance!`] with a factory (a real emulator, a temporary directory, ...);
//! it expands to one test per check below.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;

use tidemark_core::{ByteRange, Error, RemoteStorage};

/// What a provider can represent, so the suite checks each provider against its own promises.
#[derive(Debug, Clone, Copy)]
pub struct Capabilities {
    /// Keys that a filesystem cannot hold (`a//b`, `x/../y`) are stored and listed verbatim.
    pub arbitrary_keys: bool,
    /// User metadata set on `put` comes back from `stat`.
    pub user_metadata: bool,
    /// Every directory is listed as a marker (`a/`), not only explicit marker objects.
    pub lists_directories: bool,
    /// Objects whose key ends in `/` (directory markers) can be stored.
    pub directory_markers: bool,
    /// Keys with characters XML 1.0 cannot carry (control characters) can be stored and listed.
    pub xml_unsafe_keys: bool,
    /// The headers given to `put_with_headers` (Content-Type, ...) come back from `stat`.
    pub headers: bool,
}

pub struct Harness {
    pub storage: Arc<dyn RemoteStorage>,
    pub caps: Capabilities,
    pub guard: Box<dyn Any + Send + Sync>,
}

#[macro_export]
macro_rules! remote_storage_conformance {
    ($factory:expr) => {
        $crate::remote_storage_conformance!(@each $factory;
            put_stat_get_round_trip, tricky_keys_list_in_byte_order_across_pages,
            prefix_and_start_after, ranged_and_conditional_reads, deletes, user_metadata_round_trip,
            directory_markers, hostile_keys_are_kept_verbatim_or_refused,
            keys_xml_cannot_carry_list_with_the_others, headers_round_trip, copies_are_conditional,
            a_streamed_put_of_several_parts_is_the_object_whole, a_streamed_put_of_the_wrong_length_leaves_nothing);
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

async fn read(s: &dyn RemoteStorage, key: &str, range: Option<ByteRange>) -> Vec<u8> {
    let stream = s.get(key, range, None).await.unwrap_or_else(|e| panic!("get {key}: {e}"));
    let parts: Vec<Bytes> = stream.map(|c| c.unwrap()).collect().await;
    parts.concat()
}

async fn put(s: &dyn RemoteStorage, key: &str, body: &[u8]) {
    s.put(key, Bytes::copy_from_slice(body), BTreeMap::new()).await.unwrap_or_else(|e| panic!("put {key:?}: {e}"));
}

async fn list_all(s: &dyn RemoteStorage, prefix: &str, start_after: Option<&str>, page: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let p = s
            .list(prefix, start_after, token.as_deref(), page)
            .await
            .unwrap_or_else(|e| panic!("list {prefix:?}: {e}"));
        assert!(p.objects.len() <= page, "a page holds at most {page}");
        out.extend(p.objects.into_iter().map(|o| o.key));
        match p.next {
            Some(t) => token = Some(t),
            None => return out,
        }
    }
}

/// The keys a listing must show for `keys`: with `lists_directories`, every ancestor too.
fn expected_listing(keys: &[&str], caps: Capabilities, prefix: &str) -> Vec<String> {
    let mut set: BTreeSet<String> = keys.iter().map(|k| k.to_string()).collect();
    if caps.lists_directories {
        for k in keys {
            let mut acc = String::new();
            let parts: Vec<&str> = k.split('/').collect();
            for part in &parts[..parts.len() - 1] {
                acc.push_str(part);
                acc.push('/');
                set.insert(acc.clone());
            }
        }
    }
    set.into_iter().filter(|k| k.starts_with(prefix)).collect()
}

pub async fn put_stat_get_round_trip(h: &Harness) {
    let s = &*h.storage;
    assert!(s.stat("rt/missing").await.unwrap().is_none(), "stat of a missing key is None");
    put(s, "rt/one", b"first").await;
    let a = s.stat("rt/one").await.unwrap().expect("stat after put");
    assert_eq!((a.key.as_str(), a.size), ("rt/one", 5));
    assert!(!a.etag.is_empty() && !a.etag.starts_with('"'), "etag is normalised: {:?}", a.etag);
    assert!(a.last_modified_ms > 1_600_000_000_000, "last_modified is a real time: {}", a.last_modified_ms);
    assert_eq!(read(s, "rt/one", None).await, b"first");
    put(s, "rt/one", b"second!").await;
    let b = s.stat("rt/one").await.unwrap().unwrap();
    assert_eq!(b.size, 7);
    assert_ne!(a.etag, b.etag, "an overwrite changes the etag");
    assert_eq!(read(s, "rt/one", None).await, b"second!");
    let listed = s.list("rt/", None, None, 10).await.unwrap();
    let o = listed.objects.iter().find(|o| o.key == "rt/one").unwrap();
    assert_eq!((o.size, o.etag.as_str()), (7, b.etag.as_str()), "LIST and HEAD agree");
}

const TRICKY: &[&str] =
    &["t/a", "t/a b", "t/a+b", "t/a%20b", "t/a-b", "t/a/b", "t/a0", "t/ü/ß", "t/deep/x/y/z", "t/日本", "t/A"];

pub async fn tricky_keys_list_in_byte_order_across_pages(h: &Harness) {
    let s = &*h.storage;
    // `t/a` is a file and `t/a/b` needs `t/a` as a directory: a filesystem cannot hold both.
    let keys: Vec<&str> = TRICKY.iter().copied().filter(|k| h.caps.arbitrary_keys || *k != "t/a").collect();
    for k in &keys {
        put(s, k, k.as_bytes()).await;
    }
    let expected = expected_listing(&keys, h.caps, "t/");
    for page in [1, 2, 3, 7, 1000] {
        assert_eq!(list_all(s, "t/", None, page).await, expected, "page size {page}");
    }
    for k in &keys {
        assert_eq!(read(s, k, None).await, k.as_bytes(), "{k} reads back");
    }
}

pub async fn prefix_and_start_after(h: &Harness) {
    let s = &*h.storage;
    for k in ["p/1", "p/2", "p/3", "p2/x", "q/1"] {
        put(s, k, b"x").await;
    }
    let all = list_all(s, "p/", None, 2).await;
    assert_eq!(all, expected_listing(&["p/1", "p/2", "p/3"], h.caps, "p/"));
    assert_eq!(list_all(s, "p/", Some("p/1"), 2).await, ["p/2", "p/3"]);
    assert_eq!(list_all(s, "p/", Some("p/3"), 2).await, Vec::<String>::new());
    assert!(list_all(s, "nothing-here/", None, 10).await.is_empty());
    assert!(list_all(s, "", None, 1000).await.contains(&"q/1".to_string()), "the empty prefix lists everything");
}

pub async fn ranged_and_conditional_reads(h: &Harness) {
    let s = &*h.storage;
    let body: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    put(s, "r/blob", &body).await;
    assert_eq!(read(s, "r/blob", Some(ByteRange { offset: 100, length: Some(50) })).await, &body[100..150]);
    assert_eq!(read(s, "r/blob", Some(ByteRange { offset: 9_990, length: None })).await, &body[9_990..]);
    let etag = s.stat("r/blob").await.unwrap().unwrap().etag;
    let ok = s.get("r/blob", None, Some(&etag)).await.unwrap();
    assert_eq!(ok.map(|c| c.unwrap()).collect::<Vec<_>>().await.concat(), body);
    put(s, "r/blob", b"changed").await;
    match s.get("r/blob", None, Some(&etag)).await {
        Err(Error::PreconditionFailed { .. }) => {}
        Err(e) => panic!("a read of a replaced version must fail with PreconditionFailed, got {e}"),
        Ok(_) => panic!("a read of a replaced version must not return the new bytes"),
    }
    assert!(matches!(s.get("r/missing", None, None).await, Err(Error::NotFound { .. })));
}

pub async fn deletes(h: &Harness) {
    let s = &*h.storage;
    put(s, "del/x", b"x").await;
    s.delete("del/x").await.unwrap();
    assert!(s.stat("del/x").await.unwrap().is_none());
    s.delete("del/x").await.unwrap();
    s.delete("del/never-existed").await.unwrap();
}

pub async fn user_metadata_round_trip(h: &Harness) {
    if !h.caps.user_metadata {
        return;
    }
    let s = &*h.storage;
    let mut meta = BTreeMap::new();
    meta.insert("tidemark-origin".to_string(), "cluster-1".to_string());
    meta.insert("tidemark-version".to_string(), "42".to_string());
    let put_obj = s.put("meta/x", Bytes::from_static(b"m"), meta.clone()).await.unwrap();
    assert_eq!(put_obj.user_metadata.as_ref(), Some(&meta), "put returns the object as stored");
    assert_eq!(s.stat("meta/x").await.unwrap().unwrap().user_metadata, Some(meta));
}

/// What a reader gets back besides the bytes: given on put, answered by HEAD, and by a listing
/// where the provider's listing carries it (GCS, Azure; an S3 listing says nothing: `None`).
pub async fn headers_round_trip(h: &Harness) {
    if !h.caps.headers {
        return;
    }
    let s = &*h.storage;
    let given = tidemark_core::remote::ObjectHeaders {
        content_type: Some("text/plain; charset=utf-8".into()),
        content_encoding: Some("gzip".into()),
        content_disposition: Some("attachment; filename=\"x.txt\"".into()),
        content_language: Some("de".into()),
        cache_control: Some("max-age=60".into()),
        ..Default::default()
    };
    s.put_with_headers("hdr/x", Bytes::from_static(b"h"), BTreeMap::new(), &given).await.unwrap();
    let got = s.stat("hdr/x").await.unwrap().unwrap().headers.expect("a HEAD carries the headers");
    let strip = |h: tidemark_core::remote::ObjectHeaders| tidemark_core::remote::ObjectHeaders {
        storage_class: None,
        restore: None,
        expires: None,
        ..h
    };
    assert_eq!(strip(got.clone()), given, "{got:?}");
    let page = s.list("hdr/", None, None, 10).await.unwrap();
    if let Some(listed) = page.objects[0].headers.clone() {
        // All of it as the HEAD says, or the entry would change back and forth between the
        // apply's HEAD and a reconcile's listing.
        assert_eq!(listed, got, "a listing that carries headers carries the HEAD's");
        assert_eq!(strip(listed), given);
    }
}

/// A copy (a rename carried to the bucket) takes the source's bytes if it is still the version
/// named, with the metadata given; a changed or missing source is refused, and nothing written.
pub async fn copies_are_conditional(h: &Harness) {
    let s = &*h.storage;
    let src = "cp/a b+c%d";
    put(s, src, b"copied bytes").await;
    let o = s.stat(src).await.unwrap().unwrap();
    let meta = BTreeMap::from([("tidemark-origin".to_string(), "c1".to_string())]);
    let headers = tidemark_core::remote::ObjectHeaders::default();
    let c = s.copy(src, "cp/to", &o.etag, meta.clone(), &headers).await.unwrap();
    assert_eq!(c.size, 12);
    assert_eq!(read(s, "cp/to", None).await, b"copied bytes");
    if h.caps.user_metadata {
        let got = s.stat("cp/to").await.unwrap().unwrap().user_metadata.unwrap_or_default();
        assert_eq!(got.get("tidemark-origin").map(String::as_str), Some("c1"), "{got:?}");
    }
    put(s, src, b"changed").await;
    let e = s.copy(src, "cp/to2", &o.etag, meta.clone(), &headers).await.unwrap_err();
    assert!(matches!(e, Error::PreconditionFailed { .. }), "{e}");
    s.delete(src).await.unwrap();
    let e = s.copy(src, "cp/to2", &o.etag, meta, &headers).await.unwrap_err();
    assert!(matches!(e, Error::NotFound { .. } | Error::PreconditionFailed { .. }), "{e}");
    assert!(s.stat("cp/to2").await.unwrap().is_none());
}

pub async fn directory_markers(h: &Harness) {
    let s = &*h.storage;
    if !h.caps.directory_markers {
        return;
    }
    put(s, "mk/dir/", b"").await;
    put(s, "mk/dir/inside", b"i").await;
    let m = s.stat("mk/dir/").await.unwrap().expect("a marker stats");
    assert_eq!(m.size, 0);
    assert_eq!(list_all(s, "mk/", None, 10).await, expected_listing(&["mk/dir/", "mk/dir/inside"], h.caps, "mk/"));
    // Deleting a marker with keys below it succeeds and leaves them (a renamed directory's old
    // marker goes so; on a file system the directory stays while it holds files).
    s.delete("mk/dir/").await.unwrap();
    assert_eq!(read(s, "mk/dir/inside", None).await, b"i");
}

pub async fn hostile_keys_are_kept_verbatim_or_refused(h: &Harness) {
    let s = &*h.storage;
    let hostile = ["h/x/../y", "h/a//b", "h/./z"];
    if h.caps.arbitrary_keys {
        for k in hostile {
            put(s, k, k.as_bytes()).await;
        }
        let mut want: Vec<String> = hostile.iter().map(|k| k.to_string()).collect();
        want.sort();
        assert_eq!(list_all(s, "h/", None, 2).await, want, "hostile keys list verbatim: the mapping judges them");
        for k in hostile {
            assert_eq!(read(s, k, None).await, k.as_bytes());
        }
    } else {
        for k in hostile {
            let e = s.put(k, Bytes::from_static(b"x"), BTreeMap::new()).await.unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{k}: {e}");
            assert!(e.to_string().contains(k), "the error names the key: {e}");
        }
    }
}

/// Keys any provider may hold that XML 1.0 cannot carry (control characters), beside keys whose
/// encodings are easily confused: every one lists verbatim and reads back, and none keeps the
/// others from listing — one hostile key must not stop a reconcile of the whole bucket.
pub async fn keys_xml_cannot_carry_list_with_the_others(h: &Harness) {
    let s = &*h.storage;
    let all = ["x/a", "x/bad\u{1}key.txt", "x/sp ace+plus%25 \u{7f}.txt", "x/tab\tname", "x/z"];
    let keys: Vec<&str> =
        all.into_iter().filter(|k| h.caps.xml_unsafe_keys || !k.contains(['\u{1}', '\u{7f}', '\t'])).collect();
    for k in keys.iter().copied() {
        put(s, k, k.as_bytes()).await;
    }
    let want = expected_listing(&keys, h.caps, "x/");
    for page in [1, 2, 1000] {
        assert_eq!(list_all(s, "x/", None, page).await, want, "page size {page}");
    }
    let i = want.iter().position(|k| k == keys[1]).expect("listed");
    assert_eq!(list_all(s, "x/", Some(keys[1]), 2).await, want[i + 1..].to_vec(), "start after the second key");
    for k in keys {
        assert_eq!(read(s, k, None).await, k.as_bytes(), "{k:?} reads back");
        assert!(s.stat(k).await.unwrap().is_some(), "{k:?} stats");
    }
}

/// A body in pieces of an odd size, as a file read streams.
fn pieces(body: &[u8]) -> tidemark_core::ByteStream {
    let parts: Vec<std::io::Result<Bytes>> = body.chunks(100_003).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
    futures::stream::iter(parts).boxed()
}

/// A streamed put larger than an upload's part (two parts and a bit: S3 multipart, Azure
/// blocks, a Cloud Storage resumable upload) is the object whole, with its headers and
/// metadata; one smaller than a part is one put.
pub async fn a_streamed_put_of_several_parts_is_the_object_whole(h: &Harness) {
    let s = &*h.storage;
    let body: Vec<u8> =
        (0..2 * crate::PART + 12_345).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0]).collect();
    let mut meta = BTreeMap::new();
    meta.insert("tidemark-version".to_string(), "7".to_string());
    let headers =
        tidemark_core::remote::ObjectHeaders { content_type: Some("application/x-big".into()), ..Default::default() };
    let o = s.put_stream("big/parts.bin", pieces(&body), body.len() as u64, meta.clone(), &headers).await.unwrap();
    assert_eq!(o.size, body.len() as u64);
    assert!(read(s, "big/parts.bin", None).await == body, "the bytes, whole and in order");
    let stat = s.stat("big/parts.bin").await.unwrap().unwrap();
    assert_eq!((stat.size, &stat.etag), (o.size, &o.etag), "the object the put returned");
    if h.caps.user_metadata {
        assert_eq!(stat.user_metadata.as_ref(), Some(&meta));
    }
    if h.caps.headers {
        assert_eq!(stat.headers.and_then(|h| h.content_type).as_deref(), Some("application/x-big"));
    }
    let small = &body[..1000];
    s.put_stream("big/small.bin", pieces(small), 1000, BTreeMap::new(), &Default::default()).await.unwrap();
    assert_eq!(read(s, "big/small.bin", None).await, small);
}

/// A streamed put whose body is not the length it said (a file that changed while it was
/// read) fails, and leaves no object.
pub async fn a_streamed_put_of_the_wrong_length_leaves_nothing(h: &Harness) {
    let s = &*h.storage;
    let body = vec![7u8; crate::PART + 1000];
    for (key, said) in
        [("short/large", body.len() as u64 + 5), ("long/large", body.len() as u64 - 5), ("short/small", 2000)]
    {
        let given = if key.ends_with("small") { &body[..1000] } else { &body[..] };
        let err = s.put_stream(key, pieces(given), said, BTreeMap::new(), &Default::default()).await.unwrap_err();
        assert!(err.to_string().contains(&format!("a put of {said} bytes")), "{key}: {err}");
        assert!(s.stat(key).await.unwrap().is_none(), "{key}: nothing stored");
    }
}

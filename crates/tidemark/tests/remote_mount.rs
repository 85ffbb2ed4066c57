//! `remote.configure`, `remote.mount`, `remote.meta.sync`, `remote.unmount` and lazy reads, run
//! as a user runs them (the binary and its shell), against a real S3 (moto) and a local directory.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;
use std::sync::Arc;

use bytes::Bytes;
use tidemark_cloud::aws::s3::S3Storage;
use tidemark_cloud::azure::AzureBlobStorage;
use tidemark_cloud::gcp::GcsStorage;
use tidemark_cloud::local::LocalStorage;
use tidemark_core::Filer as _;
use tidemark_core::RemoteStorage;
use tidemark_core::remote::{RemoteConf, StorageKind};
use tidemark_testkit::{Azurite, FakeGcs, Moto, TidemarkProcess, free_port, run_shell, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(o: Output) -> String {
    assert!(!text(&o.stderr).contains("panicked"), "{}", text(&o.stderr));
    assert!(o.status.success(), "failed: {}\n{}", text(&o.stdout), text(&o.stderr));
    text(&o.stdout)
}

fn fails(o: Output) -> String {
    assert!(!text(&o.stderr).contains("panicked"), "{}", text(&o.stderr));
    assert_eq!(o.status.code(), Some(1), "should fail: {}\n{}", text(&o.stdout), text(&o.stderr));
    text(&o.stderr)
}

/// A bucket to mount: how the test writes to it directly, and how Tidemark is told about it.
struct Bucket {
    storage: Arc<dyn RemoteStorage>,
    configure: String,
    name: String,
    /// S3 holds keys a filesystem cannot (a file `c` beside `c/d`, `x//y`).
    arbitrary_keys: bool,
    /// The store holds objects whose key ends in `/` (Azurite does not).
    markers: bool,
    remote: &'static str,
    /// The shell command that points the remote at nothing (as if its bucket were unreachable).
    unreachable: String,
    /// What the server must be told to serve this bucket (`--local-root` for a directory).
    server_args: Vec<String>,
    _guard: Box<dyn std::any::Any>,
}

async fn s3_bucket() -> Bucket {
    let moto = Moto::get();
    let name = unique_name("mnt");
    let settings = [("endpoint", moto.endpoint.as_str()), ("access_key", "testing"), ("secret_key", "testing")];
    let conf = RemoteConf {
        name: "s3test".into(),
        kind: StorageKind::S3,
        settings: settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    };
    let s3 = S3Storage::connect(&conf, &name).await.unwrap();
    s3.client().create_bucket().bucket(&name).send().await.unwrap();
    let configure = format!(
        "remote.configure -name=s3test -type=s3 -s3.endpoint={} -s3.access_key=testing -s3.secret_key=testing",
        moto.endpoint
    );
    Bucket {
        storage: Arc::new(s3),
        configure,
        name,
        arbitrary_keys: true,
        markers: true,
        remote: "s3test",
        unreachable: "remote.configure -name=s3test -s3.endpoint=http://127.0.0.1:1".into(),
        server_args: vec![],
        _guard: Box::new(moto),
    }
}

async fn local_bucket() -> Bucket {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("bkt")).unwrap();
    let storage = LocalStorage::at(root.path(), "bkt").unwrap();
    let configure = format!("remote.configure -name=loctest -type=local -local.root={}", root.path().display());
    Bucket {
        storage: Arc::new(storage),
        configure,
        name: "bkt".into(),
        arbitrary_keys: false,
        markers: true,
        remote: "loctest",
        unreachable: "remote.configure -name=loctest -local.root=/nonexistent/tidemark".into(),
        server_args: vec!["--local-root".into(), root.path().display().to_string()],
        _guard: Box::new(root),
    }
}

async fn gcs_bucket() -> Bucket {
    let fake = FakeGcs::get(None);
    let name = unique_name("mnt");
    let conf = RemoteConf {
        name: "gcstest".into(),
        kind: StorageKind::Gcs,
        settings: [("endpoint", fake.endpoint.as_str()), ("emulator", "true")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    let storage = GcsStorage::open(&conf, &name).unwrap();
    storage.create_bucket().await.unwrap();
    let configure =
        format!("remote.configure -name=gcstest -type=gcs -gcs.endpoint={} -gcs.emulator=true", fake.endpoint);
    Bucket {
        storage: Arc::new(storage),
        configure,
        name,
        arbitrary_keys: true,
        markers: true,
        remote: "gcstest",
        unreachable: "remote.configure -name=gcstest -gcs.endpoint=http://127.0.0.1:1".into(),
        server_args: vec![],
        _guard: Box::new(fake),
    }
}

async fn azure_bucket() -> Bucket {
    let a = Azurite::get();
    let name = unique_name("mnt");
    let settings =
        [("account", Azurite::ACCOUNT), ("account_key", Azurite::KEY), ("blob_endpoint", a.blob_endpoint.as_str())];
    let conf = RemoteConf {
        name: "aztest".into(),
        kind: StorageKind::Azure,
        settings: settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    };
    let storage = AzureBlobStorage::open(&conf, &name).unwrap();
    storage.create_container().await.unwrap();
    let configure = format!(
        "remote.configure -name=aztest -type=azure -azure.account={} -azure.account_key={} -azure.blob_endpoint={}",
        Azurite::ACCOUNT,
        Azurite::KEY,
        a.blob_endpoint
    );
    Bucket {
        storage: Arc::new(storage),
        configure,
        name,
        arbitrary_keys: false,
        markers: false,
        remote: "aztest",
        unreachable: "remote.configure -name=aztest -azure.blob_endpoint=http://127.0.0.1:1".into(),
        server_args: vec![],
        _guard: Box::new(a),
    }
}

async fn put(b: &Bucket, key: &str, body: &str) {
    b.storage.put(key, Bytes::copy_from_slice(body.as_bytes()), BTreeMap::new()).await.unwrap();
}

fn remote_name(b: &Bucket) -> &'static str {
    b.remote
}

const KEYS: &[&str] = &[
    "photos/a b.txt",
    "photos/a+b.txt",
    "photos/100%.txt",
    "photos/ünï/cödé.txt",
    "photos/deep/1/2/3/4.txt",
    "photos/dir/",
    "photos/dir/in.txt",
];

async fn scenario(b: Bucket) {
    let tmp = tempfile::tempdir().unwrap();
    let args: Vec<&str> = b.server_args.iter().map(String::as_str).collect();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &args);
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[]);
    for k in KEYS.iter().filter(|k| b.markers || !k.ends_with('/')) {
        put(&b, k, &format!("content of {k}")).await;
    }
    if b.arbitrary_keys {
        put(&b, "photos/c", "a file").await;
        put(&b, "photos/c/d", "needs c to be a directory").await;
        put(&b, "photos/x//y", "hostile").await;
    }
    put(&b, "other/not-mounted.txt", "outside the prefix").await;
    // A few hundred more, to cross listing pages.
    for chunk in (0..300).collect::<Vec<_>>().chunks(25) {
        let keys: Vec<String> = chunk.iter().map(|i| format!("photos/bulk/{i:03}.bin")).collect();
        futures::future::join_all(keys.iter().map(|k| put(&b, k, "b"))).await;
    }

    ok(sh(&b.configure));
    let listed = ok(sh("remote.configure"));
    assert!(listed.contains(remote_name(&b)), "{listed}");
    assert!(!listed.contains("secret_key=testing") && !listed.contains(Azurite::KEY), "secrets are masked: {listed}");
    let mounted = ok(sh(&format!("remote.mount -dir=/mnt/data -remote={}/{}/photos", remote_name(&b), b.name)));
    assert!(mounted.contains("mounted"), "{mounted}");

    let ls = ok(sh("fs.ls -l /mnt/data"));
    for name in ["a b.txt", "a+b.txt", "100%.txt", "ünï/", "deep/", "dir/"] {
        assert!(ls.lines().any(|l| l.ends_with(&format!(" {name}"))), "{name} in {ls}");
    }
    let bulk = ok(sh("fs.ls -l /mnt/data/bulk"));
    assert_eq!(bulk.lines().count(), 300, "every object is listed");
    assert!(bulk.lines().all(|l| l.starts_with("-rw-r--r--") && l.contains("            1 ")), "size of each: {bulk}");
    let line = ls.lines().find(|l| l.ends_with(" a b.txt")).unwrap();
    assert!(line.contains(&format!(" {} ", "content of photos/a b.txt".len())), "size shown: {line}");
    assert!(line.contains("T") && line.contains("Z"), "mtime shown: {line}");
    assert_eq!(ok(sh("fs.cat '/mnt/data/ünï/cödé.txt'")), "content of photos/ünï/cödé.txt");
    assert_eq!(ok(sh("fs.cat /mnt/data/deep/1/2/3/4.txt")), "content of photos/deep/1/2/3/4.txt");
    // Ranged lazy reads, through the filer's HTTP API.
    let filer = tidemark_filer::HttpFiler::new(&server.addr, None).unwrap();
    let range = tidemark_core::ByteRange { offset: 3, length: Some(4) };
    let (_, stream) = tidemark_core::Filer::read(&filer, "/mnt/data/deep/1/2/3/4.txt", Some(range)).await.unwrap();
    let bytes: Vec<Bytes> =
        futures::StreamExt::collect::<Vec<_>>(stream).await.into_iter().map(|c| c.unwrap()).collect();
    assert_eq!(bytes.concat(), b"tent", "bytes 3..7 of the object");

    // The content cache, for every provider: a second read is served locally; with the bucket
    // unreachable, what is cached still reads and what is not fails in one line.
    let deep = "/mnt/data/deep/1/2/3/4.txt";
    let want = "content of photos/deep/1/2/3/4.txt";
    for _ in 0..200 {
        if filer.cache_status(&[deep.to_string()]).await.unwrap()[0].cached_bytes == want.len() as u64 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let before = filer.cache_stats().await.unwrap();
    assert_eq!(ok(sh(&format!("fs.cat {deep}"))), want);
    let after = filer.cache_stats().await.unwrap();
    assert_eq!(after.misses, before.misses, "the second read made no remote call: {after:?}");
    assert!(after.hits > before.hits, "{after:?}");
    ok(sh(&b.unreachable));
    assert_eq!(ok(sh(&format!("fs.cat {deep}"))), want, "cached: read with the bucket unreachable");
    let err = fails(sh("fs.cat '/mnt/data/100%.txt'"));
    assert!(err.contains("/mnt/data/100%.txt") && err.contains("not cached here"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    ok(sh(&b.configure));
    assert_eq!(ok(sh("fs.cat '/mnt/data/100%.txt'")), "content of photos/100%.txt");
    assert!(ok(sh("fs.ls /")).contains("mnt/"));
    assert!(fails(sh("fs.cat /mnt/data/other/not-mounted.txt")).contains("no such entry"));
    if b.arbitrary_keys {
        assert_eq!(ok(sh("fs.cat /mnt/data/c")), "a file", "the file of a file/directory conflict wins its path");
        fails(sh("fs.cat /mnt/data/c/d"));
        let dry = ok(sh("remote.meta.sync -dir=/mnt/data -dryRun"));
        assert!(dry.contains("/mnt/data/c/d (skip: shadowed: a file or directory is in its way)"), "{dry}");
        assert!(dry.contains("key \"photos/x//y\" (skip: refused"), "{dry}");
    }

    // Local data: a local-only file and a local edit of a synced file.
    let local = tmp.path().join("local.txt");
    std::fs::write(&local, "written locally").unwrap();
    ok(sh(&format!("fs.put {} /mnt/data/mine.txt; fs.put {} '/mnt/data/a+b.txt'", local.display(), local.display())));

    // Change the bucket directly: overwrite, add, delete (also the edited one's object).
    put(&b, "photos/a b.txt", "changed in the bucket").await;
    put(&b, "photos/new/file.txt", "new").await;
    b.storage.delete("photos/deep/1/2/3/4.txt").await.unwrap();
    if !b.arbitrary_keys {
        // A local bucket keeps its (now empty) directories; remove them as a user would.
        for d in ["photos/deep/1/2/3/", "photos/deep/1/2/", "photos/deep/1/", "photos/deep/"] {
            b.storage.delete(d).await.unwrap();
        }
    }
    b.storage.delete("photos/a+b.txt").await.unwrap();
    put(&b, "photos/a+b.txt", "bucket overwrite of a locally edited file").await;
    let out = ok(sh("remote.meta.sync -dir=/mnt/data"));
    assert!(out.contains("/mnt/data/a b.txt (update)"), "{out}");
    assert!(out.contains("/mnt/data/new/file.txt (create)"), "{out}");
    assert!(out.contains("/mnt/data/deep/1/2/3/4.txt (delete)"), "{out}");
    assert!(out.contains("/mnt/data/a+b.txt (skip: locally dirty)"), "{out}");
    assert!(out.contains("/mnt/data/mine.txt (skip: local-only)"), "{out}");
    assert!(out.lines().last().unwrap().contains("updated 1, deleted"), "summary: {out}");
    assert_eq!(ok(sh("fs.cat '/mnt/data/a b.txt'")), "changed in the bucket");
    assert_eq!(ok(sh("fs.cat '/mnt/data/a+b.txt'")), "written locally", "the local write is never overwritten");
    assert_eq!(ok(sh("fs.cat /mnt/data/mine.txt")), "written locally");
    assert!(fails(sh("fs.ls /mnt/data/deep")).contains("no such entry"), "emptied directories go too");
    let again = ok(sh("remote.meta.sync -dir=/mnt/data -quiet"));
    assert!(again.contains("created 0, updated 0, deleted 0"), "a second run changes nothing: {again}");

    // Unmount: the mapping and the synced metadata go; the local data and every object stay.
    let out = ok(sh("remote.unmount -dir=/mnt/data"));
    assert!(out.contains("kept 2 entries"), "{out}");
    assert!(ok(sh("remote.mount")).trim().is_empty());
    fails(sh("fs.cat '/mnt/data/a b.txt'"));
    assert_eq!(ok(sh("fs.cat /mnt/data/mine.txt")), "written locally");
    assert!(b.storage.stat("photos/a b.txt").await.unwrap().is_some(), "unmount deletes no object");
    fails(sh("remote.meta.sync -dir=/mnt/data"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mount_sync_and_unmount_against_s3() {
    scenario(s3_bucket().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mount_sync_and_unmount_against_gcs() {
    scenario(gcs_bucket().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mount_sync_and_unmount_against_azure_blob() {
    scenario(azure_bucket().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mount_sync_and_unmount_against_a_local_directory() {
    scenario(local_bucket().await).await;
}

/// A download broken mid-object is resumed on every provider: the bucket behind a proxy that
/// closes each connection after 300 KiB of answers, a cold read of 2 MiB gets every byte, in
/// order, with the resumes counted. (The S3 SDK and the HTTP client of Cloud Storage and Azure
/// each report a connection closed early as an error, which is what the resume needs.)
async fn resume_scenario(b: Bucket) {
    let tmp = tempfile::tempdir().unwrap();
    let args = ["--cache-chunk-size", "64K"];
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &args);
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[]);
    let big: Vec<u8> = (0..2 * 1024 * 1024 + 1000).map(|i: usize| (i as u8).wrapping_mul(31)).collect();
    b.storage.put("cut/big.bin", Bytes::from(big.clone()), BTreeMap::new()).await.unwrap();
    // The configuration, with the bucket's endpoint behind the proxy.
    let at = b.configure.find("http://127.0.0.1:").expect("an emulator on loopback");
    let end = b.configure[at + 7..].find(['/', ' ']).map_or(b.configure.len(), |n| at + 7 + n);
    let endpoint = &b.configure[at..end];
    let cut = tidemark_testkit::Shape { cut_after: Some(300 << 10), ..Default::default() };
    let proxy = tidemark_testkit::shaping_proxy(endpoint, cut).unwrap();
    ok(sh(&b.configure.replace(endpoint, &format!("http://{proxy}"))));
    ok(sh(&format!("remote.mount -dir=/mnt/cut -remote={}/{}/cut", remote_name(&b), b.name)));
    let filer = tidemark_filer::HttpFiler::new(&server.addr, None).unwrap();
    let (_, stream) = tidemark_core::Filer::read(&filer, "/mnt/cut/big.bin", None).await.unwrap();
    let parts: Vec<Bytes> =
        futures::StreamExt::collect::<Vec<_>>(stream).await.into_iter().map(|c| c.unwrap()).collect();
    assert!(parts.concat() == big, "every byte, in order");
    let stats = filer.cache_stats().await.unwrap();
    assert!(stats.resumed >= 1 && stats.resumed + stats.requests >= 7, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_broken_mid_object_is_resumed_on_gcs() {
    resume_scenario(gcs_bucket().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_broken_mid_object_is_resumed_on_azure_blob() {
    resume_scenario(azure_bucket().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mount_errors_are_one_clear_line_and_nothing_is_half_mounted() {
    let b = s3_bucket().await;
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[]);
    ok(sh(&b.configure));
    let dead = format!("http://127.0.0.1:{}", free_port());
    ok(sh(&format!("remote.configure -name=dead -type=s3 -s3.endpoint={dead} -s3.access_key=a -s3.secret_key=b")));

    let cases = [
        (format!("remote.mount -dir=/mnt/a -remote=s3test/{}-missing", b.name), "no such entry"),
        ("remote.mount -dir=/mnt/a -remote=dead/bucket".to_string(), "cannot reach the endpoint"),
        ("remote.mount -dir=/mnt/a -remote=nosuch/bucket".to_string(), "no remote \"nosuch\""),
        ("remote.mount -dir=/mnt/a -remote=s3test".to_string(), "NAME/BUCKET"),
        ("remote.mount -dir=/mnt/a".to_string(), "-remote"),
        ("remote.configure -name=x -type=gopher".to_string(), "unknown -type"),
        ("remote.configure -name=x -type=s3 -local.root=/tmp".to_string(), "does not apply"),
        ("remote.configure -name=x -type=s3 -s3.access_key=only".to_string(), ""),
    ];
    for (cmd, says) in cases {
        let o = sh(&cmd);
        if cmd.ends_with("access_key=only") {
            // Saved, but unusable: mounting with it says which flag is missing.
            ok(o);
            let err = fails(sh(&format!("remote.mount -dir=/mnt/a -remote=x/{}", b.name)));
            assert!(err.contains("-s3.secret_key"), "{err}");
            continue;
        }
        let err = fails(o);
        assert!(err.contains(says), "{cmd}: {err}");
        assert!(err.starts_with("error: "), "{cmd}: {err}");
    }
    // Wrong credentials, against a moto that checks them as AWS does.
    let strict = Moto::start_with_auth();
    ok(sh(&format!(
        "remote.configure -name=badkeys -type=s3 -s3.endpoint={} -s3.access_key=AKIAWRONG -s3.secret_key=nope",
        strict.endpoint
    )));
    let err = fails(sh("remote.mount -dir=/mnt/a -remote=badkeys/bucket"));
    assert!(err.contains("refused") && err.contains("InvalidAccessKeyId") && err.contains("credentials"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");

    assert!(ok(sh("remote.mount")).trim().is_empty(), "nothing was mounted");
    assert!(fails(sh("fs.ls /mnt/a")).contains("no such entry"), "no directory was left behind");

    // A non-empty directory needs -nonempty, and its entries stay local-only.
    put(&b, "k.txt", "k").await;
    let f = tmp.path().join("f");
    std::fs::write(&f, "local").unwrap();
    ok(sh(&format!("fs.put {} /mnt/b/existing.txt", f.display())));
    let err = fails(sh(&format!("remote.mount -dir=/mnt/b -remote=s3test/{}", b.name)));
    assert!(err.contains("-nonempty"), "{err}");
    ok(sh(&format!("remote.mount -dir=/mnt/b -remote=s3test/{} -nonempty", b.name)));
    assert_eq!(ok(sh("fs.cat /mnt/b/k.txt")), "k");
    assert_eq!(ok(sh("fs.cat /mnt/b/existing.txt")), "local");
    let err = fails(sh(&format!("remote.mount -dir=/mnt/b/inner -remote=s3test/{}", b.name)));
    assert!(err.contains("cannot nest"), "{err}");
    let err = fails(sh("remote.configure -name=s3test -delete"));
    assert!(err.contains("remote.unmount"), "{err}");

    // An object replaced since the last sync: the read returns the version the entry describes
    // from the cache; once that is dropped, the read refuses the other bytes.
    put(&b, "k.txt", "replaced").await;
    assert_eq!(ok(sh("fs.cat /mnt/b/k.txt")), "k", "the entry's version, from the cache");
    let dropped = ok(sh("remote.uncache -dir=/mnt/b/k.txt"));
    assert!(dropped.contains("dropped the cached content of 1 files"), "{dropped}");
    let err = fails(sh("fs.cat /mnt/b/k.txt"));
    assert!(err.contains("changed in the bucket") && err.contains("remote.meta.sync"), "{err}");
}

/// The attack of a user who may configure remotes: a local remote rooted at `/`, mounted, then
/// read (`fs.cat` of a host file) and written (`remote.sync.enable` + `fs.put`). The server
/// serves only what `--local-root` allows, and a symbolic link inside an allowed bucket leads
/// nowhere either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_remote_reaches_only_what_the_operator_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    let allowed = tmp.path().join("allowed");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(allowed.join("bkt")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "host file").unwrap();
    std::fs::write(allowed.join("bkt/plain.txt"), "bucket file").unwrap();
    std::os::unix::fs::symlink(outside.join("secret.txt"), allowed.join("bkt/link.txt")).unwrap();
    std::os::unix::fs::symlink(&outside, allowed.join("bkt/dirlink")).unwrap();
    let root = allowed.display().to_string();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &["--local-root", &root]);
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[]);

    // A remote over the whole machine: the shell (its own user's rights) can mount it, but the
    // server refuses to read or write a byte of it.
    ok(sh(&format!("remote.configure -name=host -type=local -local.root={}", tmp.path().display())));
    ok(sh("remote.mount -dir=/x -remote=host/outside"));
    assert!(ok(sh("fs.ls /x")).contains("secret.txt"), "the listing is the shell's own");
    let err = fails(sh("fs.cat /x/secret.txt"));
    assert!(err.contains("not one this process may serve") && err.contains("--local-root"), "{err}");
    ok(sh("remote.sync.enable -dir=/x"));
    let local = tmp.path().join("payload");
    std::fs::write(&local, "planted").unwrap();
    ok(sh(&format!("fs.put {} /x/planted.txt", local.display())));
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(!outside.join("planted.txt").exists(), "the outbound sync wrote nothing outside --local-root");
    assert_eq!(std::fs::read_to_string(outside.join("secret.txt")).unwrap(), "host file");

    // The allowed bucket: its files serve, its links do not.
    ok(sh(&format!("remote.configure -name=ok -type=local -local.root={root}")));
    ok(sh("remote.mount -dir=/ok -remote=ok/bkt"));
    let ls = ok(sh("fs.ls /ok"));
    assert!(ls.contains("plain.txt") && !ls.contains("link"), "links are not mirrored: {ls}");
    assert_eq!(ok(sh("fs.cat /ok/plain.txt")), "bucket file");
    ok(sh("remote.sync.enable -dir=/ok"));
    ok(sh(&format!("fs.put {} /ok/dirlink/planted.txt", local.display())));
    ok(sh(&format!("fs.put {} /ok/mine.txt", local.display())));
    tidemark_testkit::eventually("the upload of /ok/mine.txt", || allowed.join("bkt/mine.txt").exists());
    assert!(!outside.join("planted.txt").exists(), "nothing written through a link");
}

/// `tidemark server` as the quick start runs it (no token): no HTTP client reads a secret it
/// configured — the shell's `fs.cat`, the API, `remote.configure` all see masks — while the
/// roles in the server read them whole and the shell of the data directory's owner still opens
/// the bucket (it reads the cluster token kept there). A shell that cannot read that file is
/// told what to do instead of sending masks to the bucket as credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_server_shows_no_client_a_secret() {
    let b = s3_bucket().await;
    let bucket = &b.name;
    // The moto holding the bucket (run alone, `Moto::get` starts a new one at every call).
    let moto = b._guard.downcast_ref::<Moto>().expect("an S3 bucket's guard is its moto");
    put(&b, "photos/a.txt", "content of a").await;
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[]);
    let secret = "moto-accepts-any-secret-WXYZ";
    ok(sh(&format!(
        "remote.configure -name=s3 -type=s3 -s3.endpoint={} -s3.access_key=testing -s3.secret_key={secret}",
        moto.endpoint
    )));
    let conf = "/etc/tidemark/remote/s3.conf";
    // The shell, the API and remote.configure: masks only.
    let shown = ok(sh(&format!("fs.cat {conf}")));
    assert!(shown.contains("****WXYZ") && !shown.contains(secret), "{shown}");
    let api = reqwest::get(format!("http://{}/api/v1/content?path={conf}", server.addr)).await.unwrap();
    let api = api.text().await.unwrap();
    assert!(api.contains("****WXYZ") && !api.contains(secret), "{api}");
    assert!(!ok(sh("remote.configure")).contains(secret));
    // The health answer names the credential file; it is the data directory's owner's alone.
    let health: serde_json::Value =
        reqwest::get(format!("http://{}/api/v1/health", server.addr)).await.unwrap().json().await.unwrap();
    let file = std::path::PathBuf::from(health["cluster_token_file"].as_str().unwrap());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    let token = std::fs::read_to_string(&file).unwrap();
    let as_cluster = async || {
        let url = format!("http://{}/api/v1/content?path={conf}", server.addr);
        reqwest::Client::new().get(url).bearer_auth(&token).send().await.unwrap().text().await.unwrap()
    };
    assert!(as_cluster().await.contains(secret), "the cluster token reads it whole");
    // The owner's shell mounts and syncs the bucket; a setting changed with the masks in place
    // keeps the secret; the server's own roles read the content.
    ok(sh(&format!("remote.mount -dir=/mnt/s -remote=s3/{bucket}/photos")));
    ok(sh("remote.configure -name=s3 -s3.region=us-east-1"));
    put(&b, "photos/b.txt", "content of b").await;
    let synced = ok(sh("remote.meta.sync -dir=/mnt/s"));
    assert!(synced.contains("b.txt") || synced.contains("1 created"), "{synced}");
    assert_eq!(ok(sh("fs.cat /mnt/s/b.txt")), "content of b");
    let stored = as_cluster().await;
    assert!(stored.contains(secret), "remote.configure kept the secret: {stored}");
    // A shell that cannot use the file (another user's, here: no longer 0600) is told what to do.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = fails(sh("remote.meta.sync -dir=/mnt/s"));
    assert!(err.contains("secret_key masked") && err.contains("cluster.token"), "{err}");
}

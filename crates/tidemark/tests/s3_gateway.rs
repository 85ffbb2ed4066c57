//! The S3 gateway as its users meet it: `tidemark server` (or `tidemark s3` beside a filer) and
//! the clients people use — boto3 for every operation, the AWS CLI and rclone for whole trees
//! (tests/s3/clients.py) — plus a bucket mounted from moto whose objects, put and overwritten
//! in moto, appear through the gateway within seconds through events and read through the
//! content cache.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use bytes::Bytes;
use tidemark_cloud::aws::s3::S3Storage;
use tidemark_core::RemoteStorage;
use tidemark_testkit::{Moto, Postgres, TidemarkProcess, eventually, free_port, ok, run_shell, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

fn clients_py() -> String {
    format!("{}/tests/s3/clients.py", env!("CARGO_MANIFEST_DIR"))
}

/// Runs one mode of tests/s3/clients.py; its output on failure.
fn python(args: &[&str], server: &TidemarkProcess) -> String {
    let out = Command::new("python3").arg(clients_py()).args(args).output().expect("running python3");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    assert!(
        out.status.success(),
        "clients.py {args:?} failed:\n{}\n{}\nthe server's log:\n{}",
        text(&out.stdout),
        text(&out.stderr),
        server.stderr()
    );
    text(&out.stdout)
}

fn endpoint(server: &TidemarkProcess) -> String {
    format!("http://{}", server.s3_addr)
}

fn sh(server: &TidemarkProcess, cmd: &str) -> Output {
    run_shell(bin(), &server.addr, cmd, &[])
}

#[test]
fn boto3_drives_every_operation() {
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let out = python(&["boto3", &endpoint(&server), "tidemark", "tidemark"], &server);
    assert!(out.contains("every operation checked"), "{out}");
    // What boto3 wrote is the namespace's: the shell sees the same files.
    let listed = ok(sh(&server, "fs.ls -l /buckets/gw-boto3"));
    assert!(listed.contains("hello.txt") && listed.contains("with space.txt"), "{listed}");
    assert_eq!(ok(sh(&server, "fs.cat /buckets/gw-boto3/hello.txt")), "hello, gateway\n");
    // Nothing of the finished or aborted uploads stays staged but the one left open.
    let staged = ok(sh(&server, "fs.ls /etc/tidemark/s3/uploads"));
    assert_eq!(staged.lines().count(), 1, "{staged}");
}

/// A bucket created through S3 is its creator's: another identity (unless its `-buckets` names
/// the bucket) can neither read, list, write nor delete it, and creating it again answers
/// BucketAlreadyExists; canned ACLs (`public-read`, `public-read-write`) open objects and
/// buckets to unsigned requests; grants (headers or a policy document) open them to an identity
/// or a group, and a grant to an unknown identity or an e-mail address is refused. Bucket policies:
/// an Allow opens (to everyone, or to an identity, under a prefix condition), a Deny wins (the
/// owner's reads and deletes included, on the source address or on plain HTTP), and a document
/// using what is not evaluated is refused.
#[test]
fn buckets_belong_to_who_made_them_and_acls_and_policies_open_them() {
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    for who in ["one", "two"] {
        let cmd = format!(
            "s3.configure -user={who} -access_key=AK{who} -secret_key={who}-secret-1 -actions=Read,Write,List,Admin -apply"
        );
        ok(sh(&server, &cmd));
    }
    std::thread::sleep(Duration::from_millis(2500));
    let out = python(&["owners", &endpoint(&server), "AKone", "one-secret-1", "AKtwo", "two-secret-1"], &server);
    assert!(out.contains("each identity's buckets are its own"), "{out}");
    let out = python(&["policies", &endpoint(&server), "AKone", "one-secret-1", "AKtwo", "two-secret-1"], &server);
    assert!(out.contains("allowed, denied and refused as written"), "{out}");
}

#[test]
fn access_keys_decide_who_may_do_what() {
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    // A dry run shows the change and saves nothing.
    let dry = ok(sh(&server, "s3.configure -user=admin -access_key=AKADMIN -secret_key=admin-secret-1 -actions=Admin"));
    assert!(dry.contains("not saved") && !dry.contains("admin-secret-1"), "{dry}");
    ok(sh(&server, "s3.configure -user=admin -access_key=AKADMIN -secret_key=admin-secret-1 -actions=Admin -apply"));
    ok(sh(
        &server,
        "s3.configure -user=reader -access_key=AKREADER -secret_key=reader-secret-1 -actions=Read,List -buckets=gw-public -apply",
    ));
    let shown = ok(sh(&server, "s3.configure"));
    assert!(shown.contains("AKREADER") && !shown.contains("reader-secret-1") && shown.contains("****et-1"), "{shown}");
    let bad = sh(&server, "s3.configure -user=x -access_key=AKX -secret_key=s3cretkey -actions=Fly -apply");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("-actions"), "{bad:?}");
    // Gateways re-read the identities within 2 s.
    std::thread::sleep(Duration::from_millis(2500));
    let e = endpoint(&server);
    let out = python(&["access", &e, "AKADMIN", "admin-secret-1", "AKREADER", "reader-secret-1"], &server);
    assert!(out.contains("every refusal checked"), "{out}");
    ok(sh(&server, "s3.configure -user=anonymous -actions=Read -buckets=gw-public -apply"));
    std::thread::sleep(Duration::from_millis(2500));
    let out = python(&["anonymous", &e], &server);
    assert!(out.contains("nothing else"), "{out}");
    // Revoking a key takes effect without a restart.
    ok(sh(&server, "s3.configure -user=reader -delete -apply"));
    std::thread::sleep(Duration::from_millis(2500));
    let out = Command::new("python3")
        .args(["-c", &format!(
            "import sys; sys.path.insert(0, {dir:?}); from clients import *; \
             expect_code('InvalidAccessKeyId', lambda: client({e:?}, 'AKREADER', 'reader-secret-1').list_buckets(), 'a revoked key')",
            dir = format!("{}/tests/s3", env!("CARGO_MANIFEST_DIR"))
        )])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn bad_input_gets_the_s3_error_it_should_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let out = python(&["errors", &endpoint(&server), "tidemark", "tidemark"], &server);
    assert!(out.contains("every bad input refused"), "{out}");
    assert!(!server.stderr().contains("panicked"), "{}", server.stderr());
    // Refused requests do not grow the log (a client without credentials could fill the disk).
    let before = server.stderr().lines().count();
    for _ in 0..200 {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(&server.s3_addr).unwrap();
        write!(
            c,
            "GET /gw-errors/keep.txt HTTP/1.1\r\nHost: {}\r\nAuthorization: AWS nobody:bm9wZQ==\r\n\
             Date: Thu, 01 Jan 2026 00:00:00 GMT\r\nConnection: close\r\n\r\n",
            server.s3_addr
        )
        .unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    }
    let grew = server.stderr().lines().count() - before;
    assert!(grew < 5, "200 refused requests wrote {grew} log lines:\n{}", server.stderr());
}

#[test]
fn the_aws_cli_and_rclone_copy_sync_and_check_trees() {
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let out = python(&["tools", &endpoint(&server), "tidemark", "tidemark", work.to_str().unwrap()], &server);
    assert!(out.contains("round-trips checked"), "{out}");
}

/// Server-side encryption as its clients use it: SSE-S3, SSE-KMS (the keyring's keys) and SSE-C
/// with boto3, the AWS CLI and rclone; the plaintext nowhere in the data directory; without a
/// keyring only SSE-C; a keyring others may read, or malformed, stops the start with its reason.
#[test]
fn objects_are_encrypted_at_rest_as_their_writers_ask() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let keys = tmp.path().join("sse-keys");
    let key = |b: u8| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode([b; 32])
    };
    std::fs::write(&keys, format!("# test keys\naws/s3={}\ntestkey-1={}\n", key(1), key(2))).unwrap();
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o644)).unwrap();
    let data = tmp.path().join("data");
    let keys_arg = keys.to_str().unwrap();
    let refused = Command::new(bin())
        .args(["server", "--data-dir", data.to_str().unwrap(), "--filer-addr", "127.0.0.1:0"])
        .args(["--admin-addr", "127.0.0.1:0", "--s3-addr", "127.0.0.1:0", "--sse-keys", keys_arg])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert!(err.contains("chmod 600"), "{err}");
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o600)).unwrap();
    let server = TidemarkProcess::server(bin(), &data, &["--sse-keys", keys_arg]);
    let bare = TidemarkProcess::server(bin(), &tmp.path().join("bare"), &[]);
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let args = [
        "sse",
        &endpoint(&server),
        "tidemark",
        "tidemark",
        work.to_str().unwrap(),
        data.to_str().unwrap(),
        "testkey-1",
        &endpoint(&bare),
    ];
    let out = python(&args, &server);
    assert!(out.contains("checked"), "{out}");
}

#[test]
fn the_s3_role_serves_a_filer_and_refuses_to_listen_openly_without_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let filer = TidemarkProcess::start(
        bin(),
        &tmp.path().join("data"),
        &["filer", "--data-dir", tmp.path().join("data").to_str().unwrap(), "--addr", "127.0.0.1:0", "--token", "t0k"],
    );
    // Beyond loopback with no key configured: refused at start, with what to do.
    let out = Command::new(bin())
        .args(["s3", "--filer", &filer.addr, "--token", "t0k", "--addr", "0.0.0.0:0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("beyond loopback") && err.contains("s3.configure"), "{err}");
    // A wrong filer token: a clear error at start, not a gateway that fails every request.
    let out = Command::new(bin()).args(["s3", "--filer", &filer.addr, "--addr", "127.0.0.1:0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let gw = TidemarkProcess::start(
        bin(),
        &tmp.path().join("gw"),
        &["s3", "--filer", &filer.addr, "--token", "t0k", "--addr", "127.0.0.1:0"],
    );
    let code = format!(
        "import sys; sys.path.insert(0, {dir:?}); from clients import client; \
         s3 = client('http://{addr}', 'tidemark', 'tidemark'); s3.create_bucket(Bucket='via-role'); \
         s3.put_object(Bucket='via-role', Key='k', Body=b'v'); \
         assert s3.get_object(Bucket='via-role', Key='k')['Body'].read() == b'v'",
        dir = format!("{}/tests/s3", env!("CARGO_MANIFEST_DIR")),
        addr = gw.addr
    );
    let out = Command::new("python3").args(["-c", &code]).output().unwrap();
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stderr), gw.stderr());
    let shown = ok(run_shell(bin(), &filer.addr, "fs.cat /buckets/via-role/k", &[("TIDEMARK_TOKEN", "t0k")]));
    assert_eq!(shown, "v");
}

/// A gateway of a cluster (`tidemark s3 --filer A,B`: two filers on one PostgreSQL, content on a
/// blob store) answers a GET whole when the filer it reads from is SIGKILLed mid-body: the
/// filer's client resumes the stream where it broke, on the other filer, and the client gets
/// every byte of a 64 MiB object in order — not a body cut short.
#[test]
fn a_gateway_of_two_filers_answers_a_get_whole_when_one_is_killed_mid_body() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (moto, pg) = (Moto::get(), Postgres::get());
    let store = pg.fresh_database("gwfo");
    let blobs = unique_name("gwfob");
    let s3 = rt.block_on(S3Storage::connect(&moto.conf("s3"), &blobs)).unwrap();
    rt.block_on(s3.client().create_bucket().bucket(&blobs).send()).unwrap();
    let blob_store = format!("s3://{blobs}?endpoint={}", moto.endpoint);
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let filer = |name: &str| TidemarkProcess::cluster_filer(bin(), &t.join(name), &store, &blob_store);
    let (mut a, b) = (filer("a"), filer("b"));
    let filers = format!("{},{}", a.addr, b.addr);
    let gw = TidemarkProcess::start(bin(), &t.join("gw"), &["s3", "--filer", &filers, "--addr", "127.0.0.1:0"]);
    let c = client_at(&format!("http://{}", gw.addr));
    let big: Vec<u8> = (0..64u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    rt.block_on(async {
        c.create_bucket().bucket("failover").send().await.unwrap();
        c.put_object().bucket("failover").key("big.bin").body(big.clone().into()).send().await.unwrap();
        let mut r = c.get_object().bucket("failover").key("big.bin").send().await.unwrap();
        let mut got = Vec::new();
        while got.len() < 1 << 20 {
            got.extend_from_slice(&r.body.try_next().await.unwrap().expect("more of the body"));
        }
        // Loopback's buffers hold a few MiB: the gateway's stream from A breaks well before its end.
        a.kill();
        while let Some(b) = r.body.try_next().await.unwrap_or_else(|e| panic!("the body broke: {e}\n{}", gw.stderr())) {
            got.extend_from_slice(&b);
        }
        assert!(got == big, "every byte, in order ({} of {})", got.len(), big.len());
    });
    let log = gw.stderr();
    assert!(log.contains("resuming the read where it broke") && log.contains("trying the next"), "{log}");
    // And on through B.
    let again = rt.block_on(gateway_get(&c, "failover", "big.bin")).expect("a GET through B");
    assert!(again.0 == big);
}

fn gateway_client(server: &TidemarkProcess) -> aws_sdk_s3::Client {
    client_at(&endpoint(server))
}

fn client_at(endpoint: &str) -> aws_sdk_s3::Client {
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("tidemark", "tidemark", None, None, "test"))
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

async fn gateway_get(c: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Option<(Vec<u8>, String)> {
    let r = c.get_object().bucket(bucket).key(key).send().await.ok()?;
    let etag = r.e_tag().unwrap_or_default().trim_matches('"').to_string();
    Some((r.body.collect().await.ok()?.into_bytes().to_vec(), etag))
}

async fn gateway_keys(c: &aws_sdk_s3::Client, bucket: &str) -> Vec<String> {
    match c.list_objects_v2().bucket(bucket).send().await {
        Ok(r) => r.contents().iter().filter_map(|o| o.key().map(str::to_string)).collect(),
        Err(_) => vec![],
    }
}

/// Waits (at most 20 s) until `check` holds; returns how long it took.
async fn within<F, Fut>(what: &str, server: &TidemarkProcess, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{what} did not happen within 20 s; the server's log:\n{}",
            server.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mounted_bucket_follows_its_remote_through_events_and_reads_through_the_cache() {
    let moto = Moto::get();
    let conf = moto.conf("s3");
    let remote_bucket = unique_name("gw-remote");
    let s3 = S3Storage::connect(&conf, &remote_bucket).await.unwrap();
    s3.client().create_bucket().bucket(&remote_bucket).send().await.unwrap();
    s3.put("seed.txt", Bytes::from_static(b"there before"), BTreeMap::new()).await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    ok(sh(
        &server,
        &format!(
            "remote.configure -name=s3 -type=s3 -s3.endpoint={} -s3.access_key=testing -s3.secret_key=testing",
            moto.endpoint
        ),
    ));
    ok(sh(&server, &format!("remote.mount -dir=/buckets/mirror -remote=s3/{remote_bucket}")));
    ok(sh(&server, "remote.events.enable -dir=/buckets/mirror"));
    eventually("the subscription to tail", || {
        ok(sh(&server, "remote.events.list")).lines().nth(1).is_some_and(|l| l.split('\t').nth(6) == Some("tailing"))
    });
    let gw = gateway_client(&server);
    assert_eq!(gateway_get(&gw, "mirror", "seed.txt").await.unwrap().0, b"there before");

    // Put in the bucket: listed and readable through the gateway within seconds, with the
    // bucket's ETag.
    let put = s3.put("new/object.txt", Bytes::from_static(b"put in the bucket"), BTreeMap::new()).await.unwrap();
    let seen = within("the new object in the gateway's listing", &server, || async {
        gateway_keys(&gw, "mirror").await.contains(&"new/object.txt".to_string())
    })
    .await;
    let (bytes, etag) = gateway_get(&gw, "mirror", "new/object.txt").await.unwrap();
    assert_eq!(bytes, b"put in the bucket");
    assert_eq!(etag, put.etag);

    // An overwrite in the bucket is what the next GET returns once its event is applied.
    s3.put("new/object.txt", Bytes::from_static(b"overwritten in the bucket"), BTreeMap::new()).await.unwrap();
    let replaced = within("the overwrite through the gateway", &server, || async {
        gateway_get(&gw, "mirror", "new/object.txt").await.is_some_and(|(b, _)| b == b"overwritten in the bucket")
    })
    .await;
    // A delete in the bucket: gone from the gateway too.
    s3.delete("seed.txt").await.unwrap();
    within("the delete through the gateway", &server, || async {
        !gateway_keys(&gw, "mirror").await.contains(&"seed.txt".to_string())
    })
    .await;
    eprintln!("put visible through the gateway after {seen:?}; overwrite after {replaced:?}");

    // Reads go through the content cache: a second GET is a hit.
    let filer = tidemark_filer::HttpFiler::new(&server.addr, None).unwrap();
    use tidemark_core::Filer;
    let before = filer.cache_stats().await.unwrap();
    assert_eq!(gateway_get(&gw, "mirror", "new/object.txt").await.unwrap().0, b"overwritten in the bucket");
    let after = filer.cache_stats().await.unwrap();
    assert!(after.hits > before.hits, "a cached read: {before:?} -> {after:?}");

    // A PUT through the gateway is a local write: dirty until the outbound sync uploads it
    // (with remote.sync.enable), and then in the bucket.
    ok(sh(&server, "remote.sync.enable -dir=/buckets/mirror"));
    gw.put_object()
        .bucket("mirror")
        .key("from-gateway.txt")
        .body(aws_sdk_s3::primitives::ByteStream::from_static(b"written through s3"))
        .send()
        .await
        .unwrap();
    within("the gateway's write in the remote bucket", &server, || async {
        s3.stat("from-gateway.txt").await.ok().flatten().is_some()
    })
    .await;
    let (bytes, _) = gateway_get(&gw, "mirror", "from-gateway.txt").await.unwrap();
    assert_eq!(bytes, b"written through s3");
    // A mounted bucket is never deleted through S3, not even empty.
    let err = gw.delete_bucket().bucket("mirror").send().await.unwrap_err();
    let msg = format!("{:?}", err.into_service_error());
    assert!(msg.contains("BucketNotEmpty") && msg.contains("remote.unmount"), "{msg}");
}

/// With a cluster token on the filer, operators (admin token) manage S3 keys without seeing the
/// stored secrets, and a gateway needs the cluster token: given the admin's, it would read every
/// secret masked, so it refuses to start and says which token to give it.
#[test]
fn the_gateway_reads_secrets_with_the_cluster_token_only() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let filer = TidemarkProcess::start(
        bin(),
        &data,
        &[
            "filer",
            "--data-dir",
            data.to_str().unwrap(),
            "--addr",
            "127.0.0.1:0",
            "--token",
            "adm",
            "--cluster-token",
            "clu",
        ],
    );
    let admin = |cmd: &str| ok(run_shell(bin(), &filer.addr, cmd, &[("TIDEMARK_TOKEN", "adm")]));
    admin("s3.configure -user=alice -access_key=AKALICE -secret_key=alice-secret-1 -actions=Admin -apply");
    // A second change read the first masked and wrote it back: alice's secret must survive it.
    admin("s3.configure -user=bob -access_key=AKBOB -secret_key=bob-secret-22 -actions=Read,List -buckets=keys -apply");
    let raw = admin("fs.cat /etc/tidemark/s3/identities.json");
    assert!(!raw.contains("alice-secret-1") && !raw.contains("bob-secret-22"), "{raw}");
    let out = Command::new(bin())
        .args(["s3", "--filer", &filer.addr, "--token", "adm", "--addr", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--cluster-token"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gw = TidemarkProcess::start(
        bin(),
        &tmp.path().join("gw"),
        &["s3", "--filer", &filer.addr, "--token", "clu", "--addr", "127.0.0.1:0"],
    );
    let code = format!(
        "import sys; sys.path.insert(0, {dir:?}); from clients import client; \
         a = client('http://{addr}', 'AKALICE', 'alice-secret-1'); a.create_bucket(Bucket='keys'); \
         a.put_object(Bucket='keys', Key='k', Body=b'v'); \
         b = client('http://{addr}', 'AKBOB', 'bob-secret-22'); \
         assert b.get_object(Bucket='keys', Key='k')['Body'].read() == b'v'",
        dir = format!("{}/tests/s3", env!("CARGO_MANIFEST_DIR")),
        addr = gw.addr
    );
    let out = Command::new("python3").args(["-c", &code]).output().unwrap();
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stderr), gw.stderr());
}

/// An upload whose body stops is given up after the idle-body deadline (2 s here, 30 s by
/// default): the connection is answered and closed, and nothing is stored.
#[test]
fn a_stalled_body_is_given_up_and_stores_nothing() {
    use std::io::{Read, Write};
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let server = TidemarkProcess::server_with_env(bin(), &data, &[], &[("TIDEMARK_BODY_IDLE_SECS", "2")]);
    let sh = |cmd: &str| tidemark_testkit::run_shell(bin(), &server.addr, cmd, &[]);
    // The filer's API answers 408 (the gateway reads bodies through the same limit and answers
    // S3's RequestTimeout: `tidemark-s3 body::tests::a_body_that_stalls_is_s3s_request_timeout`).
    let cases = [(
        server.addr.clone(),
        format!(
            "PUT /api/v1/content?path=/stall/api.bin HTTP/1.1\r\nHost: {}\r\nContent-Length: 1000\r\n\r\n",
            server.addr
        ),
    )];
    for (addr, head) in cases {
        let mut c = std::net::TcpStream::connect(&addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        c.write_all(head.as_bytes()).unwrap();
        c.write_all(b"only ten b").unwrap();
        let t = std::time::Instant::now();
        let mut answer = Vec::new();
        let _ = c.read_to_end(&mut answer);
        let waited = t.elapsed();
        assert!(waited >= Duration::from_millis(1500) && waited < Duration::from_secs(10), "answered after {waited:?}");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 408"), "a stalled body is not stored, and says why: {answer}");
        assert!(answer.contains("sent nothing for 2 s"), "{answer}");
    }
    let ls = String::from_utf8_lossy(&sh("fs.ls /").stdout).into_owned();
    assert!(!ls.contains("stall"), "{ls}");
}

/// Symbolic links, pipes and device nodes (made through the FUSE mount) have no bytes of their
/// own: the gateway neither lists nor serves them, and an object beside them is unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_and_device_nodes_are_not_objects() {
    use tidemark_core::Filer;
    use tidemark_core::model::{Content, EntryKind, NewEntry, Origin, Txn};
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let c = gateway_client(&server);
    c.create_bucket().bucket("specials").send().await.unwrap();
    c.put_object().bucket("specials").key("real.txt").body(Bytes::from_static(b"real").into()).send().await.unwrap();
    let filer = tidemark_filer::HttpFiler::new(&server.addr, None).unwrap();
    let mut fifo = NewEntry::file(0, 1, Content::Empty);
    fifo.kind = EntryKind::Fifo;
    for (p, e) in [("/buckets/specials/link", NewEntry::symlink("real.txt", 1)), ("/buckets/specials/pipe", fifo)] {
        filer.apply(Txn::put(p, e, Origin::Local)).await.unwrap();
    }
    assert_eq!(gateway_keys(&c, "specials").await, vec!["real.txt".to_string()]);
    for key in ["link", "pipe"] {
        let err = c.get_object().bucket("specials").key(key).send().await.unwrap_err();
        assert_eq!(err.into_service_error().meta().code(), Some("NoSuchKey"), "{key}");
        assert!(c.head_object().bucket("specials").key(key).send().await.is_err(), "{key}");
    }
    assert_eq!(gateway_get(&c, "specials", "real.txt").await.unwrap().0, b"real");
}

/// A file with two names in a bucket (hard-linked through the mount) is two objects with one
/// file's bytes and attributes: both listed and read, a tag put through one seen through the
/// other, a conditional delete of one leaving the other whole, a PUT to one replacing that key
/// only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hard_linked_file_is_an_object_under_each_name() {
    use aws_sdk_s3::types::{Tag, Tagging};
    use tidemark_core::Filer;
    use tidemark_core::model::{Origin, Txn};
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let c = gateway_client(&server);
    c.create_bucket().bucket("linked").send().await.unwrap();
    let data = vec![5u8; 100_000];
    c.put_object().bucket("linked").key("a").body(Bytes::from(data.clone()).into()).send().await.unwrap();
    let filer = tidemark_filer::HttpFiler::new(&server.addr, None).unwrap();
    filer.apply(Txn::link("/buckets/linked/a", "/buckets/linked/b", Origin::Local)).await.unwrap();
    assert_eq!(gateway_keys(&c, "linked").await, vec!["a".to_string(), "b".to_string()]);
    let (got, etag) = gateway_get(&c, "linked", "b").await.unwrap();
    assert_eq!((got, etag.clone()), (data.clone(), gateway_get(&c, "linked", "a").await.unwrap().1));
    let tags = Tagging::builder().tag_set(Tag::builder().key("k").value("v").build().unwrap()).build().unwrap();
    c.put_object_tagging().bucket("linked").key("a").tagging(tags).send().await.unwrap();
    let seen = c.get_object_tagging().bucket("linked").key("b").send().await.unwrap();
    assert_eq!(seen.tag_set().iter().map(|t| (t.key(), t.value())).collect::<Vec<_>>(), vec![("k", "v")]);
    let etag = c.head_object().bucket("linked").key("a").send().await.unwrap().e_tag().unwrap().to_string();
    c.delete_object().bucket("linked").key("a").if_match(&etag).send().await.unwrap();
    assert_eq!(gateway_get(&c, "linked", "b").await.unwrap().0, data);
    c.put_object().bucket("linked").key("c").body(Bytes::from_static(b"c").into()).send().await.unwrap();
    filer.apply(Txn::link("/buckets/linked/c", "/buckets/linked/d", Origin::Local)).await.unwrap();
    c.put_object().bucket("linked").key("d").body(Bytes::from_static(b"new").into()).send().await.unwrap();
    assert_eq!(gateway_get(&c, "linked", "c").await.unwrap().0, b"c");
    assert_eq!(gateway_get(&c, "linked", "d").await.unwrap().0, b"new");
}

/// The AWS SDK for Rust's checksums (as it sends them by default: computed as the body
/// streams): verified and kept, answered to HEAD and to its own validation of a GET, combined
/// for an object from parts — and forgotten once the bytes are rewritten another way (here the
/// filer's API, as the mount writes), so no client checks new bytes against an old checksum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checksums_are_kept_with_their_bytes_and_end_with_them() {
    use aws_sdk_s3::types::{ChecksumAlgorithm, ChecksumMode, ChecksumType, CompletedMultipartUpload, CompletedPart};
    use futures::StreamExt;
    use tidemark_core::{Filer, WriteOptions};
    use tidemark_s3::checksum::Algo;
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let c = gateway_client(&server);
    c.create_bucket().bucket("sums").send().await.unwrap();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let r = c
        .put_object()
        .bucket("sums")
        .key("a")
        .body(Bytes::from(data.clone()).into())
        .checksum_algorithm(ChecksumAlgorithm::Crc32C)
        .send()
        .await
        .unwrap();
    let want = Algo::Crc32c.digest_base64(&data);
    assert_eq!(r.checksum_crc32_c(), Some(want.as_str()));
    let h = c.head_object().bucket("sums").key("a").checksum_mode(ChecksumMode::Enabled).send().await.unwrap();
    assert_eq!((h.checksum_crc32_c(), h.checksum_type()), (Some(want.as_str()), Some(&ChecksumType::FullObject)));
    let g = c.get_object().bucket("sums").key("a").checksum_mode(ChecksumMode::Enabled).send().await.unwrap();
    assert_eq!(g.body.collect().await.unwrap().into_bytes().to_vec(), data, "read and validated by the SDK");

    // From parts: CRC64NVME of the whole object, the parts' CRCs combined.
    let parts = [vec![1u8; 5 * 1024 * 1024], vec![2u8; 1000]];
    let up = c
        .create_multipart_upload()
        .bucket("sums")
        .key("mp")
        .checksum_algorithm(ChecksumAlgorithm::Crc64Nvme)
        .send()
        .await
        .unwrap();
    assert_eq!(up.checksum_type(), Some(&ChecksumType::FullObject));
    let id = up.upload_id().unwrap();
    let mut done = Vec::new();
    for (n, p) in parts.iter().enumerate() {
        let n = n as i32 + 1;
        let r = c
            .upload_part()
            .bucket("sums")
            .key("mp")
            .upload_id(id)
            .part_number(n)
            .checksum_algorithm(ChecksumAlgorithm::Crc64Nvme)
            .body(Bytes::from(p.clone()).into())
            .send()
            .await
            .unwrap();
        assert_eq!(r.checksum_crc64_nvme(), Some(Algo::Crc64Nvme.digest_base64(p).as_str()));
        done.push(
            CompletedPart::builder()
                .part_number(n)
                .set_e_tag(r.e_tag().map(str::to_string))
                .set_checksum_crc64_nvme(r.checksum_crc64_nvme().map(str::to_string))
                .build(),
        );
    }
    let r = c
        .complete_multipart_upload()
        .bucket("sums")
        .key("mp")
        .upload_id(id)
        .multipart_upload(CompletedMultipartUpload::builder().set_parts(Some(done)).build())
        .send()
        .await
        .unwrap();
    let whole = Algo::Crc64Nvme.digest_base64(&parts.concat());
    assert_eq!(r.checksum_crc64_nvme(), Some(whole.as_str()));
    let g = c.get_object().bucket("sums").key("mp").checksum_mode(ChecksumMode::Enabled).send().await.unwrap();
    assert_eq!(g.checksum_crc64_nvme(), Some(whole.as_str()));
    assert_eq!(g.body.collect().await.unwrap().into_bytes().len(), parts.iter().map(Vec::len).sum::<usize>());

    // Rewritten through the filer's API: the bytes are new, their checksum and part list gone.
    let filer = tidemark_filer::HttpFiler::new(&server.addr, None).unwrap();
    for key in ["a", "mp"] {
        let body = futures::stream::once(async { Ok(Bytes::from_static(b"changed")) }).boxed();
        filer.write(&format!("/buckets/sums/{key}"), body, WriteOptions::default()).await.unwrap();
        let h = c.head_object().bucket("sums").key(key).checksum_mode(ChecksumMode::Enabled).send().await.unwrap();
        assert_eq!((h.checksum_crc32_c(), h.checksum_crc64_nvme(), h.checksum_type()), (None, None, None), "{key}");
        assert_eq!(h.e_tag(), Some("\"8977dfac2f8e04cb96e66882235f5aba\""), "{key}: the MD5 of the new bytes");
        let g = c.get_object().bucket("sums").key(key).checksum_mode(ChecksumMode::Enabled).send().await.unwrap();
        assert_eq!(g.body.collect().await.unwrap().into_bytes().as_ref(), b"changed");
    }
}

/// Lifecycle rules are carried out, not only kept: objects past their days (by prefix, by tag)
/// are deleted and uploads nobody completed are aborted, by the gateway's sweep (a "day" is
/// 2 s here, `TIDEMARK_S3_LIFECYCLE_DAY_SECS`); a disabled rule does nothing; PUT answers the
/// object's `x-amz-expiration`; what the gateway cannot carry out — a transition, any rule on a
/// bucket mounted from a remote — is refused and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_rules_expire_objects_and_abort_uploads() {
    use aws_sdk_s3::types::{
        AbortIncompleteMultipartUpload, BucketLifecycleConfiguration, ExpirationStatus, LifecycleExpiration,
        LifecycleRule, LifecycleRuleFilter, Tag, Transition, TransitionStorageClass,
    };
    let tmp = tempfile::tempdir().unwrap();
    let (data, root) = (tmp.path().join("data"), tmp.path().join("root"));
    std::fs::create_dir_all(root.join("bkt")).unwrap();
    let local_root = ["--local-root", root.to_str().unwrap()];
    let server =
        TidemarkProcess::server_with_env(bin(), &data, &local_root, &[("TIDEMARK_S3_LIFECYCLE_DAY_SECS", "2")]);
    let c = gateway_client(&server);
    c.create_bucket().bucket("lcycle").send().await.unwrap();
    for key in ["tmp/a", "tmp/deep/b", "keep/c", "tagged/x", "tagged/y"] {
        let tagging = (key == "tagged/x").then_some("k=v");
        c.put_object()
            .bucket("lcycle")
            .key(key)
            .set_tagging(tagging.map(str::to_string))
            .body(Bytes::from_static(b"x").into())
            .send()
            .await
            .unwrap();
    }
    let upload = c.create_multipart_upload().bucket("lcycle").key("tmp/big").send().await.unwrap();
    let rule = |id: &str, days: i32| {
        LifecycleRule::builder()
            .id(id)
            .status(ExpirationStatus::Enabled)
            .expiration(LifecycleExpiration::builder().days(days).build())
    };
    let rules = vec![
        rule("tmp", 1)
            .filter(LifecycleRuleFilter::builder().prefix("tmp/").build())
            .abort_incomplete_multipart_upload(
                AbortIncompleteMultipartUpload::builder().days_after_initiation(1).build(),
            )
            .build()
            .unwrap(),
        rule("tagged", 1)
            .filter(LifecycleRuleFilter::builder().tag(Tag::builder().key("k").value("v").build().unwrap()).build())
            .build()
            .unwrap(),
        rule("off", 1)
            .filter(LifecycleRuleFilter::builder().prefix("keep/").build())
            .status(ExpirationStatus::Disabled)
            .build()
            .unwrap(),
    ];
    let config = BucketLifecycleConfiguration::builder().set_rules(Some(rules)).build().unwrap();
    c.put_bucket_lifecycle_configuration().bucket("lcycle").lifecycle_configuration(config).send().await.unwrap();
    let got = c.get_bucket_lifecycle_configuration().bucket("lcycle").send().await.unwrap();
    let ids: Vec<&str> = got.rules().iter().filter_map(|r| r.id()).collect();
    assert_eq!(ids, ["tmp", "tagged", "off"]);
    let put =
        c.put_object().bucket("lcycle").key("tmp/new").body(Bytes::from_static(b"n").into()).send().await.unwrap();
    assert!(put.expiration().is_some_and(|e| e.contains("rule-id=\"tmp\"")), "{put:?}");

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let keys = gateway_keys(&c, "lcycle").await;
        let uploads = c.list_multipart_uploads().bucket("lcycle").send().await.unwrap();
        if keys == ["keep/c", "tagged/y"] && uploads.uploads().is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "not expired: {keys:?}, uploads {:?}", uploads.uploads());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let gone = c.list_parts().bucket("lcycle").key("tmp/big").upload_id(upload.upload_id().unwrap()).send().await;
    assert_eq!(gone.unwrap_err().into_service_error().meta().code(), Some("NoSuchUpload"));

    // Refused, and nothing stored: a transition, a zero-day expiration, a mounted bucket.
    let refused = |rule: LifecycleRule, bucket: &'static str| {
        let c = c.clone();
        async move {
            let config = BucketLifecycleConfiguration::builder().rules(rule).build().unwrap();
            let r = c.put_bucket_lifecycle_configuration().bucket(bucket).lifecycle_configuration(config).send().await;
            r.unwrap_err().into_service_error().meta().code().unwrap_or_default().to_string()
        }
    };
    let moving = rule("move", 30)
        .filter(LifecycleRuleFilter::builder().prefix("").build())
        .transitions(Transition::builder().days(1).storage_class(TransitionStorageClass::Glacier).build())
        .build()
        .unwrap();
    assert_eq!(refused(moving, "lcycle").await, "NotImplemented");
    assert_eq!(
        refused(rule("zero", 0).filter(LifecycleRuleFilter::builder().build()).build().unwrap(), "lcycle").await,
        "InvalidArgument"
    );
    let sh = |cmd: &str| ok(run_shell(bin(), &server.addr, cmd, &[]));
    sh(&format!("remote.configure -name=l -type=local -local.root={}", root.display()));
    sh("remote.mount -dir=/buckets/mounted -remote=l/bkt");
    assert_eq!(
        refused(rule("m", 1).filter(LifecycleRuleFilter::builder().build()).build().unwrap(), "mounted").await,
        "InvalidRequest"
    );
    assert_eq!(
        c.get_bucket_lifecycle_configuration().bucket("lcycle").send().await.unwrap().rules().len(),
        3,
        "unchanged"
    );
    c.delete_bucket_lifecycle().bucket("lcycle").send().await.unwrap();
    let none = c.get_bucket_lifecycle_configuration().bucket("lcycle").send().await.unwrap_err();
    assert_eq!(none.into_service_error().meta().code(), Some("NoSuchLifecycleConfiguration"));
}

/// A web page on another origin, in a real browser (headless Chromium), puts an object through
/// a presigned URL and reads it back — allowed by the bucket's CORS rules (the preflight of the
/// PUT answered, `ETag` exposed); the same page against a bucket without rules is blocked by the
/// browser, and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_web_page_on_another_origin_uses_a_bucket_its_cors_rules_allow() {
    use aws_sdk_s3::presigning::PresigningConfig;
    use aws_sdk_s3::types::{CorsConfiguration, CorsRule};
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let c = gateway_client(&server);
    let site = tmp.path().join("site");
    std::fs::create_dir_all(&site).unwrap();
    let port = free_port();
    let origin = format!("http://127.0.0.1:{port}");
    /// The page server, stopped when the test ends however it ends.
    struct Pages(std::process::Child);
    impl Drop for Pages {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _pages = Pages(
        Command::new("python3")
            .args(["-m", "http.server", "--bind", "127.0.0.1", &port.to_string()])
            .current_dir(&site)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python3 -m http.server"),
    );
    for bucket in ["web-cors", "web-plain"] {
        c.create_bucket().bucket(bucket).send().await.unwrap();
    }
    let rule = CorsRule::builder()
        .allowed_origins(&origin)
        .allowed_methods("GET")
        .allowed_methods("PUT")
        .allowed_headers("*")
        .expose_headers("ETag")
        .max_age_seconds(60)
        .build()
        .unwrap();
    let config = CorsConfiguration::builder().cors_rules(rule).build().unwrap();
    c.put_bucket_cors().bucket("web-cors").cors_configuration(config).send().await.unwrap();
    assert_eq!(c.get_bucket_cors().bucket("web-cors").send().await.unwrap().cors_rules().len(), 1);
    let presign = PresigningConfig::expires_in(Duration::from_secs(600)).unwrap();
    for bucket in ["web-cors", "web-plain"] {
        let put = c.put_object().bucket(bucket).key("from-browser.txt").presigned(presign.clone()).await.unwrap();
        let get = c.get_object().bucket(bucket).key("from-browser.txt").presigned(presign.clone()).await.unwrap();
        let page = format!(
            r#"<html><body><pre id="out">pending</pre><script>
(async () => {{
  const out = document.getElementById('out');
  try {{
    const put = await fetch({put:?}, {{method: 'PUT', body: 'from the browser', headers: {{'Content-Type': 'text/plain'}}}});
    const get = await fetch({get:?});
    const text = await get.text();
    out.textContent = 'put ' + put.status + ' get ' + get.status + ' [' + text + '] etag ' + get.headers.get('ETag');
  }} catch (e) {{
    out.textContent = 'blocked: ' + e;
  }}
}})();
</script></body></html>"#,
            put = put.uri(),
            get = get.uri()
        );
        std::fs::write(site.join(format!("{bucket}.html")), page).unwrap();
    }
    eventually("the page server listens", || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    let profile = tmp.path().join("profile");
    let dom = |bucket: &str| {
        tidemark_testkit::browser::dump_dom_with(
            &profile,
            &format!("{origin}/{bucket}.html"),
            &["--virtual-time-budget=10000"],
        )
    };
    let allowed = dom("web-cors");
    assert!(allowed.contains("put 200 get 200 [from the browser] etag \""), "{allowed}");
    let blocked = dom("web-plain");
    assert!(blocked.contains("blocked: TypeError"), "{blocked}");
    assert_eq!(gateway_get(&c, "web-cors", "from-browser.txt").await.unwrap().0, b"from the browser");
    assert!(gateway_get(&c, "web-plain", "from-browser.txt").await.is_none(), "the preflight was refused: no PUT");
}

/// Versioning through the AWS SDK for Rust: every PUT of a versioned bucket is a version, read
/// back by its id and listed newest first; a delete without an id leaves a delete marker (GET
/// is 404, the versions stay); deleting the marker brings the object back; deleting the current
/// version by id makes the one before it current; suspended, PUTs replace the `null` version;
/// a copy of an older version restores it. The namespace shows the current versions where they
/// always were and keeps the older ones under /buckets/.versions (hard links, no copies), which
/// is no bucket. A bucket is not deleted while it keeps versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_are_kept_read_listed_and_deleted_as_s3_has_them() {
    use aws_sdk_s3::types::{BucketVersioningStatus, VersioningConfiguration};
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let c = gateway_client(&server);
    let b = "versioned";
    c.create_bucket().bucket(b).send().await.unwrap();
    let put = |key: &'static str, body: &'static str| {
        let c = c.clone();
        async move {
            let r = c.put_object().bucket(b).key(key).body(Bytes::from_static(body.as_bytes()).into()).send().await;
            r.unwrap().version_id().map(str::to_string)
        }
    };
    let get = |key: &'static str, version: Option<String>| {
        let c = c.clone();
        async move {
            let r = c.get_object().bucket(b).key(key).set_version_id(version).send().await.ok()?;
            let id = r.version_id().map(str::to_string);
            Some((String::from_utf8(r.body.collect().await.ok()?.into_bytes().to_vec()).unwrap(), id))
        }
    };
    let versions = |key: &'static str| {
        let c = c.clone();
        async move {
            let r = c.list_object_versions().bucket(b).prefix(key).send().await.unwrap();
            let mut all: Vec<(String, bool, bool)> = r
                .versions()
                .iter()
                .map(|v| (v.version_id().unwrap().to_string(), v.is_latest().unwrap(), false))
                .chain(
                    r.delete_markers()
                        .iter()
                        .map(|m| (m.version_id().unwrap().to_string(), m.is_latest().unwrap(), true)),
                )
                .collect();
            // Newest first: versions' ids sort that way (the null version's is "null").
            all.sort_by_key(|v| (v.0 == "null", v.0.clone()));
            all
        }
    };
    // Written before versioning: the null version, then kept.
    assert_eq!(put("k", "v0").await, None);
    let enable = |s: BucketVersioningStatus| {
        let c = c.clone();
        async move {
            let conf = VersioningConfiguration::builder().status(s).build();
            c.put_bucket_versioning().bucket(b).versioning_configuration(conf).send().await.unwrap();
        }
    };
    enable(BucketVersioningStatus::Enabled).await;
    let got = c.get_bucket_versioning().bucket(b).send().await.unwrap();
    assert_eq!(got.status(), Some(&BucketVersioningStatus::Enabled));
    let v1 = put("k", "v1").await.unwrap();
    let v2 = put("k", "v2").await.unwrap();
    assert!(v1 != v2 && v1 != "null");
    assert_eq!(get("k", None).await, Some(("v2".into(), Some(v2.clone()))));
    assert_eq!(get("k", Some(v1.clone())).await.unwrap().0, "v1");
    assert_eq!(get("k", Some("null".into())).await.unwrap().0, "v0");
    let listed = versions("k").await;
    assert_eq!(
        listed,
        vec![(v2.clone(), true, false), (v1.clone(), false, false), ("null".into(), false, false)],
        "{listed:?}"
    );
    // The namespace: the current bytes at the key, the older ones kept beside.
    assert_eq!(ok(sh(&server, "fs.cat /buckets/versioned/k")), "v2");
    let kept = ok(sh(&server, "fs.ls /buckets/.versions/versioned"));
    assert_eq!(kept.lines().count(), 2, "{kept}");
    let buckets = c.list_buckets().send().await.unwrap();
    assert_eq!(buckets.buckets().iter().filter_map(|x| x.name()).collect::<Vec<_>>(), vec![b]);
    // A delete without an id: a marker, the versions stay.
    let d = c.delete_object().bucket(b).key("k").send().await.unwrap();
    assert_eq!(d.delete_marker(), Some(true));
    let marker = d.version_id().unwrap().to_string();
    let err = c.get_object().bucket(b).key("k").send().await.unwrap_err();
    assert_eq!(err.raw_response().map(|r| r.status().as_u16()), Some(404));
    assert_eq!(get("k", Some(v2.clone())).await.unwrap().0, "v2");
    let err = c.get_object().bucket(b).key("k").version_id(&marker).send().await.unwrap_err();
    assert_eq!(err.raw_response().map(|r| r.status().as_u16()), Some(405));
    assert!(gateway_keys(&c, b).await.is_empty());
    assert_eq!(versions("k").await.first(), Some(&(marker.clone(), true, true)));
    // Deleting the marker brings the object back.
    let d = c.delete_object().bucket(b).key("k").version_id(&marker).send().await.unwrap();
    assert_eq!(d.delete_marker(), Some(true));
    assert_eq!(get("k", None).await, Some(("v2".into(), Some(v2.clone()))));
    // Deleting the current version by id: the one before it is current.
    c.delete_object().bucket(b).key("k").version_id(&v2).send().await.unwrap();
    assert_eq!(get("k", None).await, Some(("v1".into(), Some(v1.clone()))));
    assert_eq!(ok(sh(&server, "fs.cat /buckets/versioned/k")), "v1");
    // A copy of an older version over its key restores it, as a new version.
    let copied = c.copy_object().bucket(b).key("k").copy_source(format!("{b}/k?versionId=null")).send().await.unwrap();
    assert_eq!(copied.copy_source_version_id(), Some("null"));
    let v3 = copied.version_id().unwrap().to_string();
    assert_eq!(get("k", None).await, Some(("v0".into(), Some(v3.clone()))));
    // Suspended: a PUT is the null version (no id answered, as RGW does), replacing the kept one.
    enable(BucketVersioningStatus::Suspended).await;
    assert_eq!(put("k", "s1").await, None);
    assert_eq!(put("k", "s2").await, None);
    let listed = versions("k").await;
    assert_eq!(
        listed,
        vec![(v3.clone(), false, false), (v1.clone(), false, false), ("null".into(), true, false)],
        "{listed:?}"
    );
    assert_eq!(get("k", Some("null".into())).await.unwrap().0, "s2");
    // Not deleted while it keeps versions; deleted once every version is.
    let err = c.delete_bucket().bucket(b).send().await.unwrap_err();
    assert_eq!(err.raw_response().map(|r| r.status().as_u16()), Some(409));
    for (id, _, _) in versions("k").await {
        c.delete_object().bucket(b).key("k").version_id(id).send().await.unwrap();
    }
    assert!(versions("k").await.is_empty());
    c.delete_bucket().bucket(b).send().await.unwrap();
    let left = sh(&server, "fs.ls /buckets/.versions");
    assert!(!String::from_utf8_lossy(&left.stdout).contains("versioned"), "{left:?}");
    // Bad version ids: S3's errors.
    c.create_bucket().bucket(b).send().await.unwrap();
    put("k", "x").await;
    let err = c.get_object().bucket(b).key("k").version_id("nonsense").send().await.unwrap_err();
    assert_eq!(err.raw_response().map(|r| r.status().as_u16()), Some(400));
}

/// Concurrent writes of one key in a versioned bucket each make a version, and concurrent
/// deletes of every version leave none — with the client's retries off, so no write or delete
/// is answered with a 503 for having raced another. The `null` version each round starts from
/// (written outside the gateway: before versioning, then through the filer's API) is kept once,
/// whichever writer keeps it. A copy and a multipart upload race
/// like a PUT. A version's bytes wait aside while it races; a gateway that dies then leaves
/// them, and they are swept after an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_and_deletes_of_a_versioned_key_lose_and_leave_nothing() {
    use aws_sdk_s3::types::{BucketVersioningStatus, CompletedMultipartUpload, CompletedPart, VersioningConfiguration};
    use tidemark_core::Filer;
    use tidemark_core::model::{Content, NewEntry, Origin, Txn};
    let tmp = tempfile::tempdir().unwrap();
    // Lifecycle days of 5 s: the gateway's sweeps run every second.
    let env = [("TIDEMARK_S3_LIFECYCLE_DAY_SECS", "5")];
    let server = TidemarkProcess::server_with_env(bin(), &tmp.path().join("data"), &[], &env);
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint(&server))
        .credentials_provider(Credentials::new("tidemark", "tidemark", None, None, "test"))
        .force_path_style(true)
        .retry_config(aws_sdk_s3::config::retry::RetryConfig::disabled())
        .build();
    let c = aws_sdk_s3::Client::from_conf(conf);
    let b = "racing";
    let seed = tmp.path().join("seed");
    std::fs::write(&seed, b"seed").unwrap();
    c.create_bucket().bucket(b).send().await.unwrap();
    c.put_object().bucket(b).key("k").body(Bytes::from_static(b"before").into()).send().await.unwrap();
    let conf = VersioningConfiguration::builder().status(BucketVersioningStatus::Enabled).build();
    c.put_bucket_versioning().bucket(b).versioning_configuration(conf).send().await.unwrap();
    let versions = || async {
        let r = c.list_object_versions().bucket(b).send().await.unwrap();
        r.versions().iter().map(|v| v.version_id().unwrap().to_string()).collect::<Vec<_>>()
    };
    const WRITERS: usize = 8;
    for round in 0..3 {
        let writes = (0..WRITERS).map(|i| {
            let c = c.clone();
            async move {
                let body = Bytes::from(format!("round {round} writer {i}"));
                match i % 4 {
                    // A copy of the key's own current version (with new metadata, as S3 requires).
                    3 => c
                        .copy_object()
                        .bucket(b)
                        .key("k")
                        .copy_source(format!("{b}/k"))
                        .metadata_directive(aws_sdk_s3::types::MetadataDirective::Replace)
                        .metadata("writer", i.to_string())
                        .send()
                        .await
                        .map(drop)
                        .map_err(|e| format!("{e:?}")),
                    // A multipart upload of one part.
                    2 => {
                        async {
                            let up = c
                                .create_multipart_upload()
                                .bucket(b)
                                .key("k")
                                .send()
                                .await
                                .map_err(|e| format!("{e:?}"))?;
                            let id = up.upload_id().unwrap();
                            let part = c
                                .upload_part()
                                .bucket(b)
                                .key("k")
                                .upload_id(id)
                                .part_number(1)
                                .body(body.into())
                                .send()
                                .await
                                .map_err(|e| format!("{e:?}"))?;
                            let done = CompletedMultipartUpload::builder()
                                .parts(
                                    CompletedPart::builder()
                                        .part_number(1)
                                        .set_e_tag(part.e_tag().map(str::to_string))
                                        .build(),
                                )
                                .build();
                            c.complete_multipart_upload()
                                .bucket(b)
                                .key("k")
                                .upload_id(id)
                                .multipart_upload(done)
                                .send()
                                .await
                                .map(drop)
                                .map_err(|e| format!("{e:?}"))
                        }
                        .await
                    }
                    _ => c
                        .put_object()
                        .bucket(b)
                        .key("k")
                        .body(body.into())
                        .send()
                        .await
                        .map(drop)
                        .map_err(|e| format!("{e:?}")),
                }
            }
        });
        for (i, r) in futures::future::join_all(writes).await.into_iter().enumerate() {
            r.unwrap_or_else(|e| panic!("round {round}, writer {i}: {e}\n{}", server.stderr()));
        }
        let listed = versions().await;
        let nulls = listed.iter().filter(|v| *v == "null").count();
        assert_eq!(nulls, 1, "round {round}: the null version is kept once: {listed:?}");
        // Every write's version, and the null one they replaced.
        assert_eq!(listed.len(), WRITERS + 1, "round {round}: every write made a version: {listed:?}");
        let deletes = listed.iter().map(|id| {
            let c = c.clone();
            async move { c.delete_object().bucket(b).key("k").version_id(id).send().await }
        });
        for r in futures::future::join_all(deletes).await {
            r.unwrap_or_else(|e| panic!("round {round}: a delete: {e:?}\n{}", server.stderr()));
        }
        assert_eq!(versions().await, Vec::<String>::new(), "round {round}: every version deleted");
        // The next round races over a null version again: one written outside the gateway.
        ok(sh(&server, &format!("fs.put {} /buckets/{b}/k", seed.display())));
    }
    // Nothing stays staged.
    let staged = sh(&server, "fs.ls /etc/tidemark/s3/staged");
    assert!(String::from_utf8_lossy(&staged.stdout).trim().is_empty(), "{staged:?}");
    // What a gateway that died between writing a version and moving it to its key left staged
    // goes after an hour (the sweep runs every second here); a version being written stays.
    let filer = tidemark_filer::HttpFiler::new(&server.addr, None).unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    for (name, mtime) in [("left", now - 2 * 3600 * 1000), ("writing", now)] {
        let e = NewEntry::file(1, mtime, Content::Inline);
        let txn =
            Txn::put(format!("/etc/tidemark/s3/staged/{name}"), e, Origin::Local).with_data(Bytes::from_static(b"x"));
        filer.apply(txn).await.unwrap();
    }
    eventually("the staged version left behind is swept", || {
        let listed = ok(sh(&server, "fs.ls /etc/tidemark/s3/staged"));
        !listed.contains("left")
    });
    assert!(ok(sh(&server, "fs.ls /etc/tidemark/s3/staged")).contains("writing"));
}

/// Lifecycle rules in a versioned bucket (days as 2 s): an expiring object is kept behind a
/// delete marker; noncurrent versions go after their days, but for the newest one the rule keeps;
/// a delete marker left with nothing behind it goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_rules_in_a_versioned_bucket_keep_what_s3_keeps() {
    use aws_sdk_s3::types::{
        BucketLifecycleConfiguration, BucketVersioningStatus, ExpirationStatus, LifecycleExpiration, LifecycleRule,
        LifecycleRuleFilter, NoncurrentVersionExpiration, VersioningConfiguration,
    };
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server_with_env(
        bin(),
        &tmp.path().join("data"),
        &[],
        &[("TIDEMARK_S3_LIFECYCLE_DAY_SECS", "2")],
    );
    let c = gateway_client(&server);
    let b = "lcv";
    c.create_bucket().bucket(b).send().await.unwrap();
    let conf = VersioningConfiguration::builder().status(BucketVersioningStatus::Enabled).build();
    c.put_bucket_versioning().bucket(b).versioning_configuration(conf).send().await.unwrap();
    let put = |key: &'static str| {
        let c = c.clone();
        async move {
            let r = c.put_object().bucket(b).key(key).body(Bytes::from_static(b"x").into()).send().await.unwrap();
            r.version_id().unwrap().to_string()
        }
    };
    let _v1 = put("old").await;
    let v2 = put("old").await;
    let v3 = put("old").await;
    let e1 = put("exp").await;
    let lone = put("lone").await;
    c.delete_object().bucket(b).key("lone").send().await.unwrap();
    c.delete_object().bucket(b).key("lone").version_id(lone).send().await.unwrap();
    let rule = |id: &str, prefix: &str| {
        LifecycleRule::builder()
            .id(id)
            .status(ExpirationStatus::Enabled)
            .filter(LifecycleRuleFilter::builder().prefix(prefix).build())
    };
    let rules = vec![
        rule("nc", "old")
            .noncurrent_version_expiration(
                NoncurrentVersionExpiration::builder().noncurrent_days(1).newer_noncurrent_versions(1).build(),
            )
            .build()
            .unwrap(),
        rule("exp", "exp").expiration(LifecycleExpiration::builder().days(1).build()).build().unwrap(),
        rule("lone", "lone")
            .expiration(LifecycleExpiration::builder().expired_object_delete_marker(true).build())
            .build()
            .unwrap(),
    ];
    let config = BucketLifecycleConfiguration::builder().set_rules(Some(rules)).build().unwrap();
    c.put_bucket_lifecycle_configuration().bucket(b).lifecycle_configuration(config).send().await.unwrap();
    // (key, version id or "marker", latest)
    let listed = || {
        let c = c.clone();
        async move {
            let r = c.list_object_versions().bucket(b).send().await.unwrap();
            let mut all: Vec<(String, String, bool)> = r
                .versions()
                .iter()
                .map(|v| (v.key().unwrap().into(), v.version_id().unwrap().into(), v.is_latest().unwrap()))
                .chain(
                    r.delete_markers()
                        .iter()
                        .map(|m| (m.key().unwrap().into(), "marker".into(), m.is_latest().unwrap())),
                )
                .collect();
            all.sort();
            all
        }
    };
    let mut want = vec![
        ("exp".to_string(), "marker".to_string(), true),
        ("exp".into(), e1.clone(), false),
        ("old".into(), v2.clone(), false),
        ("old".into(), v3.clone(), true),
    ];
    want.sort();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = listed().await;
        if now == want {
            break;
        }
        assert!(Instant::now() < deadline, "after the sweeps: {now:?}\nwanted {want:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The expired object reads as deleted, and by its version as ever.
    assert!(gateway_get(&c, b, "exp").await.is_none());
    let r = c.get_object().bucket(b).key("exp").version_id(&e1).send().await.unwrap();
    assert_eq!(r.body.collect().await.unwrap().into_bytes().as_ref(), b"x");
}

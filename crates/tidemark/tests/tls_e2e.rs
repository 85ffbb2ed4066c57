//! The scaled-out deployment with TLS on every listener — a filer, an admin and a worker as
//! separate processes, certificates from a private CA — against moto's S3 and SQS: the shell
//! configures over https, bucket events reach the namespace through the worker, the S3 gateway
//! serves boto3 over https. Clients that do not trust the CA, or speak plain HTTP, get nothing;
//! plain HTTP beyond loopback is refused unless asked for.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tidemark_cloud::aws::s3::S3Storage;
use tidemark_core::RemoteStorage;
use tidemark_testkit::tls::TestCa;
use tidemark_testkit::{Moto, TidemarkProcess, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn shell(filer: &str, ca: Option<&Path>, cmd: &str) -> Output {
    let mut c = Command::new(bin());
    c.args(["shell", "--filer", filer, "-c", cmd]).env("TIDEMARK_TOKEN", "adm").env_remove("TIDEMARK_TLS_CA");
    if let Some(ca) = ca {
        c.arg("--tls-ca").arg(ca);
    }
    c.output().unwrap()
}

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", text(&o.stderr));
    text(&o.stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filer_admin_worker_and_gateway_over_tls() {
    let moto = Moto::get();
    let conf = moto.conf("s3");
    let bucket = unique_name("tls");
    let s3 = S3Storage::connect(&conf, &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let ca = TestCa::new(tmp.path());
    let (cert, key, ca_file) = (ca.cert.to_str().unwrap(), ca.key.to_str().unwrap(), ca.ca.to_str().unwrap());
    let tls = ["--tls-cert", cert, "--tls-key", key];

    let data = tmp.path().join("data");
    // Operators hold the admin token; the workers and the gateway the cluster token.
    let mut args = vec![
        "filer",
        "--data-dir",
        data.to_str().unwrap(),
        "--addr",
        "127.0.0.1:0",
        "--token",
        "adm",
        "--cluster-token",
        "clu",
    ];
    args.extend_from_slice(&tls);
    let filer_p = TidemarkProcess::start(bin(), &data, &args);
    let filer = format!("https://{}", filer_p.addr);
    let mut args = vec![
        "admin",
        "--filer",
        &filer,
        "--addr",
        "127.0.0.1:0",
        "--token",
        "adm",
        "--cluster-token",
        "clu",
        "--tls-ca",
        ca_file,
    ];
    args.extend_from_slice(&tls);
    let admin_p = TidemarkProcess::start(bin(), &tmp.path().join("admin"), &args);
    let admin = format!("https://{}", admin_p.addr);

    // Without the CA the shell is refused by its own verification, and says where it failed.
    let err = text(&shell(&filer, None, "fs.ls /").stderr);
    assert!(err.contains("filer") && err.to_lowercase().contains("certificate") && !err.contains("panicked"), "{err}");
    // Plain HTTP to the HTTPS listener gets no answer.
    assert!(reqwest::get(format!("http://{}/api/v1/health", filer_p.addr)).await.is_err());

    let sh = |cmd: &str| ok(shell(&filer, Some(&ca.ca), cmd));
    sh(&format!(
        "remote.configure -name=s3 -type=s3 -s3.endpoint={} -s3.access_key=testing -s3.secret_key=testing",
        moto.endpoint
    ));
    // Opening the bucket needs its secret whole: the admin token is told to use the cluster's
    // (masks are never sent to the bucket as credentials).
    let refused = shell(&filer, Some(&ca.ca), &format!("remote.mount -dir=/mnt/data -remote=s3/{bucket}"));
    assert!(!refused.status.success() && text(&refused.stderr).contains("masked"), "{}", text(&refused.stderr));
    let as_cluster = |cmd: &str| {
        ok(Command::new(bin())
            .args(["shell", "--filer", &filer, "--tls-ca", ca_file, "-c", cmd])
            .env("TIDEMARK_TOKEN", "clu")
            .output()
            .unwrap())
    };
    as_cluster(&format!("remote.mount -dir=/mnt/data -remote=s3/{bucket}"));
    // The admin token sees the secret masked; changing another setting keeps the secret.
    sh("remote.configure -name=s3 -s3.secret_key=testing-secret-1");
    let shown = sh("fs.cat /etc/tidemark/remote/s3.conf");
    assert!(shown.contains("****et-1") && !shown.contains("testing-secret-1"), "{shown}");
    sh("remote.configure -name=s3 -s3.region=us-east-1");
    assert!(sh("fs.cat /etc/tidemark/remote/s3.conf").contains("us-east-1"));
    assert!(
        as_cluster("fs.cat /etc/tidemark/remote/s3.conf").contains("testing-secret-1"),
        "the workers' token reads the secret whole"
    );
    as_cluster("remote.events.enable -dir=/mnt/data -slice=6s -visibility=5s");
    let _worker = TidemarkProcess::start_quiet(
        bin(),
        &tmp.path().join("worker.log"),
        &["worker", "--admin", &admin, "--filer", &filer, "--id", "w1", "--token", "clu", "--tls-ca", ca_file],
        |log| log.contains("registered with the admin"),
    );
    s3.put("hello.txt", Bytes::from_static(b"over tls"), Default::default()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ls = shell(&filer, Some(&ca.ca), "fs.ls /mnt/data");
        if ls.status.success() && text(&ls.stdout).contains("hello.txt") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the event never arrived: {}",
            std::fs::read_to_string(tmp.path().join("worker.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(sh("fs.cat /mnt/data/hello.txt"), "over tls");
    // The admin's API over https, for a client trusting the CA.
    let pem = std::fs::read(&ca.ca).unwrap();
    let client =
        reqwest::Client::builder().tls_certs_only([reqwest::Certificate::from_pem(&pem).unwrap()]).build().unwrap();
    let subs = client.get(format!("{admin}/api/v1/subscriptions")).bearer_auth("adm").send().await.unwrap();
    assert_eq!(subs.status(), 200);
    // The workers' token opens the worker API only, not the admin's pages or reads.
    let subs = client.get(format!("{admin}/api/v1/subscriptions")).bearer_auth("clu").send().await.unwrap();
    assert_eq!(subs.status(), 401);

    // The S3 gateway over https, with boto3 verifying against the CA.
    let mut args = vec!["s3", "--filer", &filer, "--token", "clu", "--addr", "127.0.0.1:0", "--tls-ca", ca_file];
    args.extend_from_slice(&tls);
    let gw = TidemarkProcess::start(bin(), &tmp.path().join("gw"), &args);
    let code = format!(
        "import sys; sys.path.insert(0, {dir:?}); from clients import client; \
         s3 = client('https://{addr}', 'tidemark', 'tidemark'); \
         s3.create_bucket(Bucket='secure'); s3.put_object(Bucket='secure', Key='k', Body=b'v'); \
         assert s3.get_object(Bucket='secure', Key='k')['Body'].read() == b'v'",
        dir = format!("{}/tests/s3", env!("CARGO_MANIFEST_DIR")),
        addr = gw.addr,
    );
    let out = Command::new("python3").args(["-c", &code]).env("AWS_CA_BUNDLE", ca_file).output().unwrap();
    assert!(out.status.success(), "{}\n{}", text(&out.stderr), gw.stderr());
    assert_eq!(sh("fs.cat /buckets/secure/k"), "v");

    // Beyond loopback: plain HTTP is refused at start unless asked for; TLS is accepted.
    let open = |extra: &[&str]| {
        let d = tmp.path().join(format!("open{}", extra.len()));
        let mut c = Command::new(bin());
        c.args(["filer", "--data-dir", d.to_str().unwrap(), "--addr", "0.0.0.0:0", "--token", "adm"]).args(extra);
        c
    };
    let out = open(&[]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--tls-cert") && text(&out.stderr).contains("--insecure-plaintext"));
    for extra in [&["--insecure-plaintext"][..], &tls[..]] {
        let d = tmp.path().join(format!("open{}", extra.len()));
        let mut args = vec!["filer", "--data-dir", d.to_str().unwrap(), "--addr", "0.0.0.0:0", "--token", "adm"];
        args.extend_from_slice(extra);
        let p = TidemarkProcess::start(bin(), &d, &args);
        assert!(!p.addr.is_empty(), "{extra:?}");
    }
    let out = Command::new(bin()).args(["filer", "--data-dir", "x", "--tls-cert", cert]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--tls-key"), "{}", text(&out.stderr));
}

/// `tidemark server` with TLS: its filer, admin and gateway speak https, and its own worker
/// reaches its admin over https too (trusting --tls-ca).
#[test]
fn the_all_in_one_server_over_tls() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = TestCa::new(tmp.path());
    let bucket = tmp.path().join("bkt");
    let server = TidemarkProcess::server(
        bin(),
        &tmp.path().join("data"),
        &[
            "--tls-cert",
            ca.cert.to_str().unwrap(),
            "--tls-key",
            ca.key.to_str().unwrap(),
            "--tls-ca",
            ca.ca.to_str().unwrap(),
            "--token",
            "adm",
            "--local-bucket",
            bucket.to_str().unwrap(),
        ],
    );
    let filer = format!("https://{}", server.addr);
    let appears = |name: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ls = shell(&filer, Some(&ca.ca), "fs.ls /buckets/bkt");
            if ls.status.success() && text(&ls.stdout).contains(name) {
                break;
            }
            assert!(Instant::now() < deadline, "{name}: {}", server.stderr());
            std::thread::sleep(Duration::from_millis(250));
        }
    };
    // The set-up's own listing shows the first; the second comes only through the watcher,
    // which runs in a slice the worker took from the admin over https.
    std::fs::write(bucket.join("first.txt"), "x").unwrap();
    appears("first.txt");
    let slices = || {
        let out = shell(&filer, Some(&ca.ca), "remote.events.list -json");
        text(&out.stdout)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !slices().contains("tailing") {
        assert!(Instant::now() < deadline, "no slice tails: {}\n{}", slices(), server.stderr());
        std::thread::sleep(Duration::from_millis(250));
    }
    std::fs::write(bucket.join("second.txt"), "y").unwrap();
    appears("second.txt");
    assert!(!server.stderr().contains("certificate"), "{}", server.stderr());
}

/// The filer's PostgreSQL store over TLS: `sslmode=require` (or libpq's `verify-full`) verifies
/// the server's certificate against --tls-ca, every connection of the pool and the listener is
/// encrypted, and an untrusted certificate stops the filer at start with the reason.
#[test]
fn the_postgres_store_over_tls() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = TestCa::new(tmp.path());
    let pg = tidemark_testkit::Postgres::start_with_tls(Some(&ca));
    let db_url = pg.fresh_database("tls");
    let db = db_url.rsplit('/').next().unwrap().to_string();
    let ca_file = ca.ca.to_str().unwrap();
    for (i, mode) in ["require", "verify-full"].iter().enumerate() {
        let url = format!("{db_url}?sslmode={mode}");
        let data = tmp.path().join(format!("d{i}"));
        let args = [
            "filer",
            "--data-dir",
            data.to_str().unwrap(),
            "--addr",
            "127.0.0.1:0",
            "--store",
            &url,
            "--tls-ca",
            ca_file,
        ];
        let filer = TidemarkProcess::start(bin(), &data, &args);
        let local = tmp.path().join("f.txt");
        std::fs::write(&local, "stored over tls").unwrap();
        let sh = |cmd: &str| {
            let o = Command::new(bin()).args(["shell", "--filer", &filer.addr, "-c", cmd]).output().unwrap();
            ok(o)
        };
        sh(&format!("fs.put {} /f{i}.txt", local.display()));
        assert_eq!(sh(&format!("fs.cat /f{i}.txt")), "stored over tls");
        let q = format!(
            "SELECT count(*), bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.datname = '{db}' AND a.pid <> pg_backend_pid()"
        );
        let out = Command::new("psql").args(["-X", "-A", "-t", "-d", &pg.url, "-c", &q]).output().unwrap();
        let row = text(&out.stdout);
        let (n, all_ssl) = row.trim().split_once('|').unwrap_or_else(|| panic!("{row:?} {}", text(&out.stderr)));
        assert!(n.parse::<u32>().unwrap() >= 2 && all_ssl == "t", "connections {n}, all TLS: {all_ssl}");
        // Stopped cleanly, it hands its data directory's lease on (the next filer keeps its
        // content in a data directory of its own: only one such filer may run on a store).
        let mut filer = filer;
        filer.signal("TERM");
        filer.wait_exit(std::time::Duration::from_secs(10)).expect("stops on SIGTERM");
    }
    // Not trusting the server's CA: the filer does not start, and says why.
    let data = tmp.path().join("untrusted");
    let url = format!("{db_url}?sslmode=require");
    let out = Command::new(bin())
        .args(["filer", "--data-dir", data.to_str().unwrap(), "--addr", "127.0.0.1:0", "--store", &url])
        .env_remove("TIDEMARK_TLS_CA")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("PostgreSQL") && err.to_lowercase().contains("certificate"), "{err}");
}

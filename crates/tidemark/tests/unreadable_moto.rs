//! Objects the cluster may not read are never served from old bytes (`tidemark server` against
//! moto behind `tidemark_testkit::SseCProxy`, which refuses a read of an object written with a
//! customer-provided key as S3 does — moto itself serves it to anyone). A plain object read once
//! (so cached) is overwritten with an SSE-C version: the event's HEAD is refused, and that is an
//! outcome, not a retry — the entry shows the object as the bucket lists it, marked unreadable;
//! `fs.cat` fails at once naming SSE-C (never the old bytes), the gateway answers a GET 400
//! `InvalidRequest` with S3's message and a HEAD 400, it is counted, and the message is
//! acknowledged (nothing failed, nothing dead-lettered); through the mount `cat` is refused
//! EACCES ("Permission denied") while `stat` shows the new size. A new SSE-C object appears by
//! events, as unreadable.

use std::path::Path;

use aws_sdk_s3::primitives::ByteStream as SdkBody;
use base64::Engine;
use md5::Digest;
use tidemark_cloud::aws::s3::S3Storage;
use tidemark_testkit::{Moto, SseCProxy, TidemarkProcess, eventually, ok, run_shell, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

fn conf(endpoint: &str, key: &str, secret: &str) -> tidemark_core::remote::RemoteConf {
    let settings = [("endpoint", endpoint), ("access_key", key), ("secret_key", secret), ("region", "us-east-1")];
    tidemark_core::remote::RemoteConf {
        name: "c".into(),
        kind: tidemark_core::remote::StorageKind::S3,
        settings: settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_encrypted_with_a_customer_key_is_marked_unreadable_never_served_old() {
    let moto = Moto::get();
    let proxy = SseCProxy::start(&moto.endpoint);
    let bucket = unique_name("ssec");
    // Written through the proxy, so it knows which objects carry a customer key.
    let s3 = S3Storage::connect(&conf(&proxy.endpoint, "testing", "testing"), &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();
    let put = async |key: &str, body: &[u8], customer_key: Option<&[u8; 32]>| {
        let mut req = s3.client().put_object().bucket(&bucket).key(key).body(SdkBody::from(body.to_vec()));
        if let Some(k) = customer_key {
            let b64 = base64::engine::general_purpose::STANDARD;
            req = req
                .sse_customer_algorithm("AES256")
                .sse_customer_key(b64.encode(k))
                .sse_customer_key_md5(b64.encode(md5::Md5::digest(k)));
        }
        req.send().await.unwrap();
    };

    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[]);
    // Objects through the proxy; the queues straight at moto.
    ok(sh(&format!(
        "remote.configure -name=c -type=s3 -s3.endpoint={} -s3.sqs_endpoint={1} -s3.sns_endpoint={1} \
         -s3.access_key=testing -s3.secret_key=testing",
        proxy.endpoint, moto.endpoint
    )));
    ok(sh(&format!("remote.mount -dir=/buckets/enc -remote=c/{bucket}")));
    ok(sh("remote.events.enable -dir=/buckets/enc -slice=10s"));
    eventually("the subscription tailing", || ok(sh("remote.events.list")).contains("tailing"));

    put("doc.txt", b"plain v1", None).await;
    eventually("the plain object read", || sh("fs.cat /buckets/enc/doc.txt").status.success());
    assert_eq!(ok(sh("fs.cat /buckets/enc/doc.txt")), "plain v1", "read once: now cached");

    let key = [7u8; 32];
    put("doc.txt", b"secret v2, longer", Some(&key)).await;
    eventually("the SSE-C version's size shown", || ok(sh("fs.ls -l /buckets/enc")).contains("17"));
    let read = sh("fs.cat /buckets/enc/doc.txt");
    assert!(!read.status.success(), "never the old bytes: {}", String::from_utf8_lossy(&read.stdout));
    let err = String::from_utf8_lossy(&read.stderr);
    assert!(err.contains("customer-provided key"), "the reason said: {err}");
    assert!(!String::from_utf8_lossy(&read.stdout).contains("plain v1"));

    // The gateway refuses it as S3 does.
    let gw =
        S3Storage::connect(&conf(&format!("http://{}", server.s3_addr), "tidemark", "tidemark"), "enc").await.unwrap();
    let got = gw.client().get_object().bucket("enc").key("doc.txt").send().await.unwrap_err();
    let got = got.into_service_error();
    assert_eq!(aws_sdk_s3::error::ProvideErrorMetadata::code(&got), Some("InvalidRequest"), "{got:?}");
    assert!(aws_sdk_s3::error::ProvideErrorMetadata::message(&got).unwrap_or("").contains("Server Side Encryption"));
    let head = gw.client().head_object().bucket("enc").key("doc.txt").send().await.unwrap_err();
    assert_eq!(head.raw_response().map(|r| r.status().as_u16()), Some(400), "{head:?}");

    // Through the mount, with ordinary tools: the object's size, and EACCES for its bytes.
    let mnt = tmp.path().join("m");
    std::fs::create_dir_all(&mnt).unwrap();
    let mounted = Mounted(
        TidemarkProcess::start_quiet(
            bin(),
            &tmp.path().join("mount.log"),
            &["mount", "--filer", &server.addr, mnt.to_str().unwrap()],
            |l| l.contains("mounted"),
        ),
        mnt.clone(),
    );
    let file = mnt.join("buckets/enc/doc.txt");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 17, "the SSE-C version's size");
    let cat = std::process::Command::new("cat").arg(&file).output().unwrap();
    assert!(!cat.status.success(), "never the old bytes: {:?}", cat.stdout);
    assert!(String::from_utf8_lossy(&cat.stderr).contains("Permission denied"), "{cat:?}");
    drop(mounted);

    // A new SSE-C object appears by events, as unreadable.
    put("new.bin", b"never readable here", Some(&key)).await;
    eventually("the new SSE-C object listed", || ok(sh("fs.ls /buckets/enc")).contains("new.bin"));
    assert!(String::from_utf8_lossy(&sh("fs.cat /buckets/enc/new.bin").stderr).contains("customer-provided key"));

    // Counted, acknowledged, nothing failed or dead-lettered.
    let doc: serde_json::Value = serde_json::from_str(&ok(sh("remote.events.list -json"))).unwrap();
    let counters = &doc[0]["status"]["counters"];
    eventually("the counters published", || {
        let doc: serde_json::Value = serde_json::from_str(&ok(sh("remote.events.list -json"))).unwrap();
        doc[0]["status"]["counters"]["unreadable"].as_u64() == Some(2)
    });
    assert_eq!(counters["failed"].as_u64().unwrap_or(0), 0, "{counters}");
}

/// A running `tidemark mount`, killed and its mount point cleared on drop (after a failed
/// assertion too).
struct Mounted(TidemarkProcess, std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        self.0.kill();
        let _ = std::process::Command::new("fusermount3").arg("-uz").arg(&self.1).output();
    }
}

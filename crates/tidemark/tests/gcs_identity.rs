//! Cloud Storage without a key file, as a user runs it on a Google Cloud machine or in GKE with
//! workload identity: no credentials configured, so `google-cloud-auth`'s Application Default
//! Credentials find the metadata server (here `GcpDouble`'s, reached through Google's own
//! `GCE_METADATA_HOST`) and keep its tokens fresh. Tokens last 20 s and the double refuses an
//! expired one: the server reads and uploads across several expiries without a refusal.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tidemark_cloud::gcp::GcsStorage;
use tidemark_core::RemoteStorage;
use tidemark_core::remote::{RemoteConf, StorageKind};
use tidemark_testkit::{FakeGcs, GcpDouble, TidemarkProcess, ok, run_shell, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metadata_servers_tokens_are_used_and_refreshed_across_expiries() {
    let fake = FakeGcs::get(None);
    let double = GcpDouble::start(&fake.endpoint, "http://127.0.0.1:9");
    double.token_lifetime(Duration::from_secs(20));
    let bucket = unique_name("gid");
    let direct = RemoteConf {
        name: "direct".into(),
        kind: StorageKind::Gcs,
        settings: [("endpoint", fake.endpoint.as_str()), ("emulator", "true")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    let storage = GcsStorage::open(&direct, &bucket).unwrap();
    storage.create_bucket().await.unwrap();
    storage.put("data/first.txt", Bytes::from_static(b"first"), Default::default()).await.unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let metadata = double.metadata_host();
    let env = [("GCE_METADATA_HOST", metadata.as_str())];
    let server = TidemarkProcess::server_with_env(bin(), &tmp.path().join("data"), &[], &env);
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &env);
    // No credentials and no -gcs.emulator: Application Default Credentials.
    ok(sh(&format!("remote.configure -name=g -type=gcs -gcs.endpoint={}", double.endpoint)));
    ok(sh(&format!("remote.mount -dir=/mnt/g -remote=g/{bucket}/data")));
    assert!(ok(sh("remote.sync.enable -dir=/mnt/g")).contains("enabled"));
    assert_eq!(ok(sh("fs.cat /mnt/g/first.txt")), "first");
    assert!(double.ways().iter().all(|w| w == "metadata") && !double.ways().is_empty(), "{:?}", double.ways());

    // 50 s, past two expiries of any one token: every 5 s the bucket gains an object the
    // server reads (its own credentials) and the server uploads a file written here.
    let began = Instant::now();
    let mut i = 0;
    while began.elapsed() < Duration::from_secs(50) {
        storage
            .put(&format!("data/remote-{i}.txt"), Bytes::from(format!("remote {i}")), Default::default())
            .await
            .unwrap();
        ok(sh("remote.meta.sync -dir=/mnt/g"));
        assert_eq!(ok(sh(&format!("fs.cat /mnt/g/remote-{i}.txt"))), format!("remote {i}"));
        let local = tmp.path().join(format!("local-{i}.txt"));
        std::fs::write(&local, format!("local {i}")).unwrap();
        ok(sh(&format!("fs.put {} /mnt/g/local-{i}.txt", local.display())));
        i += 1;
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for j in 0..i {
        let key = format!("data/local-{j}.txt");
        while storage.stat(&key).await.unwrap().is_none() {
            assert!(Instant::now() < deadline, "{key} uploaded");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // The shells of `remote.mount` and of each `remote.meta.sync` took one token each; the
    // server's, refreshed every 10 s once under 4 minutes are left, are the rest.
    let tokens = double.ways().len();
    let server_tokens = tokens - (1 + i);
    assert!(server_tokens >= 4, "the server's token refreshed as it aged ({server_tokens} in 50 s)");
    let shown = ok(sh("remote.configure"));
    assert!(!shown.contains("service_account_json"), "nothing secret was configured: {shown}");
}

//! The listing in key ranges against each provider's real server (moto, fake-gcs-server,
//! Azurite, a local directory): the same keys in the same order as one stream of pages, with
//! each provider's own `start_after` (S3 `StartAfter`, GCS `startOffset`); Azure, whose List
//! Blobs has no such parameter, as one range.

use std::collections::BTreeMap;

use bytes::Bytes;
use tidemark_cloud::aws::s3::S3Storage;
use tidemark_cloud::azure::AzureBlobStorage;
use tidemark_cloud::gcp::GcsStorage;
use tidemark_cloud::local::{LocalRoots, LocalStorage};
use tidemark_core::RemoteStorage;
use tidemark_core::remote::{RemoteConf, StorageKind};
use tidemark_engine::listing::Listing;
use tidemark_testkit::{Azurite, FakeGcs, Moto, unique_name};

/// Keys of several shapes (flat, deep, skewed into one prefix, spaces, `+`, non-ASCII).
fn keys() -> Vec<String> {
    let mut k: Vec<String> = (0..120).map(|i| format!("p/flat-{i:04}")).collect();
    k.extend((0..100).map(|i| format!("p/logs/2026/12/{i:05}.json")));
    k.extend((0..40).map(|i| format!("p/{}/{}/f {i}+x", i % 3, i % 5)));
    k.extend(["p/ü/é", "p/日本/語", "p/a b", "p/~tilde"].map(String::from));
    k
}

async fn listed(storage: &dyn RemoteStorage, ranges: usize) -> (Vec<String>, u64, u64) {
    let mut l = Listing::new(storage, "p/", 20, ranges);
    let mut got = Vec::new();
    while let Some(p) = l.next_page().await.unwrap() {
        got.extend(p.into_iter().map(|o| o.key));
    }
    (got, l.requests, l.splits)
}

async fn check(storage: &dyn RemoteStorage, what: &str) {
    let keys = keys();
    for chunk in keys.chunks(25) {
        for r in
            futures::future::join_all(chunk.iter().map(|k| storage.put(k, Bytes::from_static(b"x"), BTreeMap::new())))
                .await
        {
            r.unwrap();
        }
    }
    storage.put("q/outside", Bytes::from_static(b"x"), BTreeMap::new()).await.unwrap();
    let mut want = keys.clone();
    want.sort();
    let (one, _, _) = listed(storage, 1).await;
    // (A local directory lists its directories too, as markers: `p/0/`.)
    let files: Vec<&String> = one.iter().filter(|k| !k.ends_with('/')).collect();
    assert!(files == want.iter().collect::<Vec<_>>(), "{what}: one range lists every key under the prefix in order");
    let (many, requests, splits) = listed(storage, 8).await;
    assert!(many == one, "{what}: eight ranges list the same keys in the same order as one");
    eprintln!("{what}: {} keys, 8 ranges: {requests} LISTs, {splits} ranges", one.len());
    if storage.lists_from_anywhere() {
        assert!(splits > 1, "{what}: the listing was cut into ranges");
    } else {
        assert_eq!(splits, 1, "{what}: one range where the store cannot begin a listing anywhere");
    }
}

#[tokio::test]
async fn s3_on_moto() {
    let moto = Moto::get();
    let bucket = unique_name("ranges");
    let s3 = S3Storage::connect(&moto.conf("m"), &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();
    check(&s3, "S3 (moto)").await;
}

#[tokio::test]
async fn gcs_on_fake_gcs_server() {
    let fake = FakeGcs::get(None);
    let settings = [("endpoint", fake.endpoint.as_str()), ("project", FakeGcs::PROJECT), ("emulator", "true")];
    let conf = RemoteConf {
        name: "g".into(),
        kind: StorageKind::Gcs,
        settings: settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    };
    let gcs = GcsStorage::open(&conf, &unique_name("ranges")).unwrap();
    gcs.create_bucket().await.unwrap();
    check(&gcs, "GCS (fake-gcs-server)").await;
}

#[tokio::test]
async fn azure_on_azurite() {
    let a = Azurite::get();
    let blobs = AzureBlobStorage::open(&a.conf("az"), &unique_name("ranges")).unwrap();
    blobs.create_container().await.unwrap();
    check(&blobs, "Azure (Azurite)").await;
}

#[tokio::test]
async fn a_local_directory() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("b")).unwrap();
    let conf = RemoteConf {
        name: "l".into(),
        kind: StorageKind::Local,
        settings: [("root".to_string(), root.path().display().to_string())].into(),
    };
    let local = LocalStorage::open(&conf, "b", &LocalRoots::any()).unwrap();
    check(&local, "local").await;
}

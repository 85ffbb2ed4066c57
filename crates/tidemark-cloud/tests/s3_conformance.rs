//! The RemoteStorage conformance suite against S3 (moto), plus S3's own error messages.

use std::sync::Arc;

use tidemark_cloud::aws::s3::S3Storage;
use tidemark_cloud::conformance::{Capabilities, Harness};
use tidemark_core::RemoteStorage;
use tidemark_core::remote::{RemoteConf, StorageKind};
use tidemark_testkit::{Moto, free_port, unique_name};

fn conf(endpoint: &str) -> RemoteConf {
    let settings =
        [("endpoint", endpoint), ("access_key", "testing"), ("secret_key", "testing"), ("region", "us-east-1")];
    RemoteConf {
        name: "moto".into(),
        kind: StorageKind::S3,
        settings: settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    }
}

async fn s3() -> Harness {
    let moto = Moto::get();
    let bucket = unique_name("conf");
    let storage = S3Storage::connect(&conf(&moto.endpoint), &bucket).await.unwrap();
    storage.client().create_bucket().bucket(&bucket).send().await.unwrap();
    Harness {
        storage: Arc::new(storage),
        caps: Capabilities {
            xml_unsafe_keys: true,
            headers: true,
            arbitrary_keys: true,
            user_metadata: true,
            lists_directories: false,
            directory_markers: true,
        },
        guard: Box::new(moto),
    }
}

tidemark_cloud::remote_storage_conformance!(s3());

#[tokio::test]
async fn s3_errors_say_what_to_fix() {
    let moto = Moto::get();
    let missing = S3Storage::connect(&conf(&moto.endpoint), "no-such-bucket-here").await.unwrap();
    let err = missing.list("", None, None, 1).await.unwrap_err().to_string();
    assert!(err.contains("no-such-bucket-here") && err.contains("no such entry"), "{err}");

    let unreachable = S3Storage::connect(&conf(&format!("http://127.0.0.1:{}", free_port())), "b").await.unwrap();
    let err = unreachable.stat("k").await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(err.to_string().contains("cannot reach the endpoint"), "{err}");

    let mut half = conf(&moto.endpoint);
    half.settings.remove("secret_key");
    let err = S3Storage::connect(&half, "b").await.unwrap_err().to_string();
    assert!(err.contains("-s3.secret_key"), "{err}");
}

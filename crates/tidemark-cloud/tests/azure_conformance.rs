//! Azure Blob (RemoteStorage) and Azure Storage Queue (EventSource) against Azurite, and Event
//! Grid-shaped messages on the queue (Azurite has no Event Grid), plain and base64.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use tidemark_cloud::azure::{AzureBlobStorage, AzureQueueSource};
use tidemark_cloud::conformance::{Capabilities, Harness};
use tidemark_cloud::event_conformance::{EventHarness, Producer};
use tidemark_core::RemoteStorage;
use tidemark_core::events::{Decoded, EventKind, EventSource, azure};
use tidemark_testkit::{Azurite, unique_name};

async fn blob() -> Harness {
    let a = Azurite::get();
    let storage = AzureBlobStorage::open(&a.conf("azurite"), &unique_name("c")).unwrap();
    storage.create_container().await.unwrap();
    Harness {
        storage: Arc::new(storage),
        // Azurite refuses blob names that end in `/`; `..` and empty segments cannot be addressed.
        caps: Capabilities {
            // Azurite answers 500 to a listing that holds such a name; Azure itself returns it
            // percent-encoded (`<Name Encoded="true">`), which `azure::blob` decodes (unit-tested).
            xml_unsafe_keys: false,
            headers: true,
            arbitrary_keys: false,
            user_metadata: true,
            lists_directories: false,
            directory_markers: false,
        },
        guard: Box::new(a),
    }
}

mod blob_storage {
    tidemark_cloud::remote_storage_conformance!(super::blob());
}

struct QueueProducer(AzureQueueSource);

#[async_trait]
impl Producer for QueueProducer {
    async fn send(&self, body: &str) {
        self.0.put_message(body).await.unwrap();
    }
}

async fn queue() -> EventHarness {
    let a = Azurite::get();
    let name = unique_name("q");
    let source = AzureQueueSource::open(&a.conf("azurite"), &name, Duration::from_secs(2)).unwrap();
    source.create_queue().await.unwrap();
    let producer = AzureQueueSource::open(&a.conf("azurite"), &name, Duration::from_secs(2)).unwrap();
    EventHarness {
        source: Arc::new(source),
        producer: Arc::new(QueueProducer(producer)),
        visibility: Duration::from_secs(2),
        guard: Box::new(a),
    }
}

mod storage_queue {
    tidemark_cloud::event_source_conformance!(super::queue());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_grid_messages_on_the_queue_decode_plain_and_base64() {
    let a = Azurite::get();
    let name = unique_name("eg");
    let q = AzureQueueSource::open(&a.conf("azurite"), &name, Duration::from_secs(5)).unwrap();
    q.create_queue().await.unwrap();
    let event = serde_json::json!({
        "topic": "/subscriptions/s/resourceGroups/g/providers/Microsoft.Storage/storageAccounts/devstoreaccount1",
        "subject": "/blobServices/default/containers/photos/blobs/dir/a b+ü.jpg",
        "eventType": "Microsoft.Storage.BlobCreated",
        "eventTime": "2026-12-02T10:00:00.0000000Z",
        "id": "1", "dataVersion": "", "metadataVersion": "1",
        "data": {"api": "PutBlob", "eTag": "0x8DC", "contentLength": 3, "url": format!("{}/photos/dir/a%20b%2B%C3%BC.jpg", a.blob_endpoint)}
    })
    .to_string();
    q.put_message(&event).await.unwrap();
    q.put_message(&base64::engine::general_purpose::STANDARD.encode(&event)).await.unwrap();
    let deliveries = q.receive(10, Duration::from_secs(10)).await.unwrap();
    assert_eq!(deliveries.len(), 2);
    for d in &deliveries {
        let Decoded::Events { events } = azure::decode(&d.body) else { panic!("{:?}", azure::decode(&d.body)) };
        assert_eq!(
            (events[0].bucket.as_str(), events[0].key.as_str(), &events[0].kind),
            ("photos", "dir/a b+ü.jpg", &EventKind::Created)
        );
    }
    let ids: Vec<String> = deliveries.iter().map(|d| d.ack_id.clone()).collect();
    assert_eq!(q.ack(&ids).await.unwrap().acked.len(), 2);
}

#[tokio::test]
async fn a_wrong_key_is_refused_with_a_clear_message() {
    let a = Azurite::get();
    let mut c = a.conf("azurite");
    c.settings.insert("account_key".into(), base64::engine::general_purpose::STANDARD.encode(b"wrong key"));
    let s = AzureBlobStorage::open(&c, "anything").unwrap();
    let err = s.list("", None, None, 1).await.unwrap_err().to_string();
    assert!(err.contains("refused") && err.contains("account key"), "{err}");
}

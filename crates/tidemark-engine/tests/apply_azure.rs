//! The applier against Azurite with the messages Event Grid puts on a Storage Queue, including
//! those of a storage account with a hierarchical namespace (Data Lake Storage Gen2): a blob
//! renamed, and directories created, renamed and deleted as a whole. Azurite has neither Event
//! Grid nor a hierarchical namespace, so the blobs under a prefix are changed as the service
//! would leave them, then the event the service sends is delivered. Also keys a file stands in
//! the way of, brought in when it goes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tidemark_cloud::azure::{AzureBlobStorage, AzureQueueSource};
use tidemark_core::events::{EventSource, Provider};
use tidemark_core::model::{NewEntry, Origin, Txn};
use tidemark_core::remote::{Mount, RemoteLocation};
use tidemark_core::{Filer, RemoteStorage, SystemClock};
use tidemark_engine::apply::{ApplyContext, Counters, EventTypes, apply_batch};
use tidemark_filer::{DataDir, LocalFiler};
use tidemark_testkit::{Azurite, unique_name};

struct World {
    filer: Arc<LocalFiler>,
    blobs: AzureBlobStorage,
    queue: AzureQueueSource,
    container: String,
    endpoint: String,
    mount: Mount,
    _azurite: Azurite,
    _dir: tempfile::TempDir,
}

async fn world() -> World {
    let a = Azurite::get();
    let conf = a.conf("az");
    let container = unique_name("hns");
    let blobs = AzureBlobStorage::open(&conf, &container).unwrap();
    blobs.create_container().await.unwrap();
    let queue = AzureQueueSource::open(&conf, &unique_name("q"), Duration::from_secs(30)).unwrap();
    queue.create_queue().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let filer = Arc::new(LocalFiler::open(DataDir::open(dir.path()).unwrap()).unwrap());
    filer.apply(Txn::put("/mnt/az", NewEntry::dir(0), Origin::System)).await.unwrap();
    let mount = Mount {
        dir: "/mnt/az".into(),
        location: RemoteLocation { storage: "az".into(), bucket: container.clone(), path: String::new() },
        sync: false,
    };
    let endpoint = a.blob_endpoint.clone();
    World { filer, blobs, queue, container, endpoint, mount, _azurite: a, _dir: dir }
}

impl World {
    /// What Event Grid puts on the queue for `event_type`; `data` gets the blob's `url`
    /// unless it names its own URLs (a rename).
    async fn deliver(&self, event_type: &str, name: &str, mut data: serde_json::Value) {
        if data.get("sourceUrl").is_none() {
            data["url"] = format!("{}/{}/{}", self.endpoint, self.container, encode(name)).into();
        }
        let event = serde_json::json!({
            "topic": "/subscriptions/s/resourceGroups/g/providers/Microsoft.Storage/storageAccounts/devstoreaccount1",
            "subject": format!("/blobServices/default/containers/{}/blobs/{name}", self.container),
            "eventType": format!("Microsoft.Storage.{event_type}"),
            "eventTime": "2026-12-04T10:00:00.0000000Z",
            "id": unique_name("id"), "dataVersion": "", "metadataVersion": "1",
            "data": data,
        });
        self.queue.put_message(&event.to_string()).await.unwrap();
    }

    fn url(&self, name: &str) -> String {
        format!("{}/{}/{}", self.endpoint, self.container, encode(name))
    }

    async fn put(&self, name: &str) {
        self.blobs.put(name, Bytes::copy_from_slice(name.as_bytes()), Default::default()).await.unwrap();
    }

    /// Receives and applies until `n` more deliveries are applied.
    async fn pump(&self, c: &mut Counters, n: u64) {
        let (types, clock) = (EventTypes::default(), SystemClock);
        let ctx = ApplyContext {
            mount: &self.mount,
            provider: Provider::Azure,
            event_types: &types,
            cluster_id: Some("cluster-a"),
            fence: None,
            concurrency: 4,
            retry_delay: Duration::ZERO,
            visibility: Duration::from_secs(30),
            clock: &clock,
            prefetch: None,
            recent: None,
            max_receives: None,
        };
        let want = c.applied + n;
        let deadline = Instant::now() + Duration::from_secs(20);
        while c.applied < want {
            assert!(Instant::now() < deadline, "timed out: {c:?}");
            let batch = self.queue.receive(32, Duration::from_secs(1)).await.unwrap();
            if !batch.is_empty() {
                apply_batch(&*self.filer, &self.blobs, &self.queue, &ctx, batch, c).await.unwrap();
            }
        }
    }

    async fn exists(&self, p: &str) -> bool {
        self.filer.stat(p).await.unwrap().is_some()
    }
}

fn encode(name: &str) -> String {
    name.split('/').map(|s| s.replace('%', "%25").replace(' ', "%20")).collect::<Vec<_>>().join("/")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renames_and_directory_events_reconcile_their_subtrees() {
    let w = world().await;
    let mut c = Counters::default();
    for name in ["logs/2025/a.txt", "logs/2025/b/c.txt", "old.txt", "x", "x/y.txt"] {
        w.put(name).await;
        w.deliver("BlobCreated", name, serde_json::json!({"api": "PutBlob"})).await;
    }
    w.pump(&mut c, 5).await;
    assert!(w.exists("/mnt/az/logs/2025/b/c.txt").await && w.exists("/mnt/az/old.txt").await);
    assert_eq!(c.shadowed, 1, "x/y.txt cannot be a path while x is a file: {c:?}");
    assert!(!w.exists("/mnt/az/x/y.txt").await);

    // A blob renamed: its source goes, its destination comes.
    w.put("new dir/new.txt").await;
    w.blobs.delete("old.txt").await.unwrap();
    let rename = serde_json::json!({"api": "RenameFile", "sourceUrl": w.url("old.txt"), "destinationUrl": w.url("new dir/new.txt")});
    w.deliver("BlobRenamed", "new dir/new.txt", rename).await;
    w.pump(&mut c, 1).await;
    assert!(!w.exists("/mnt/az/old.txt").await && w.exists("/mnt/az/new dir/new.txt").await, "{c:?}");

    // A directory renamed as a whole: one event for the subtree.
    for name in ["logs/2026/a.txt", "logs/2026/b/c.txt"] {
        w.put(name).await;
    }
    for name in ["logs/2025/a.txt", "logs/2025/b/c.txt"] {
        w.blobs.delete(name).await.unwrap();
    }
    let moved = serde_json::json!({"api": "RenameDirectory", "sourceUrl": w.url("logs/2025"), "destinationUrl": w.url("logs/2026")});
    w.deliver("DirectoryRenamed", "logs/2026", moved).await;
    w.pump(&mut c, 1).await;
    assert!(!w.exists("/mnt/az/logs/2025").await, "the source subtree is gone, directories too");
    assert!(w.exists("/mnt/az/logs/2026/a.txt").await && w.exists("/mnt/az/logs/2026/b/c.txt").await);

    // A directory deleted as a whole: its entries, and the directories it leaves empty, go.
    for name in ["logs/2026/a.txt", "logs/2026/b/c.txt"] {
        w.blobs.delete(name).await.unwrap();
    }
    w.deliver("DirectoryDeleted", "logs/2026", serde_json::json!({"api": "DeleteDirectory", "recursive": "true"}))
        .await;
    w.pump(&mut c, 1).await;
    assert!(!w.exists("/mnt/az/logs").await, "logs held nothing else: {c:?}");

    // The file in the way goes: what it hid is brought in at once, without a reconcile.
    w.blobs.delete("x").await.unwrap();
    w.deliver("BlobDeleted", "x", serde_json::json!({"api": "DeleteBlob"})).await;
    w.pump(&mut c, 1).await;
    let e = w.filer.stat("/mnt/az/x/y.txt").await.unwrap();
    assert!(e.is_some_and(|e| e.size == 7), "x/y.txt came in when x went: {c:?}");
    assert_eq!((c.failed, c.received, c.applied), (0, 9, 9), "{c:?}");
}

/// The reverse: the last key under `d/` goes while the bucket holds a file `d`: the emptied
/// directory is removed and the file has its path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_freed_by_the_last_key_under_its_path_comes_in() {
    let w = world().await;
    let mut c = Counters::default();
    for name in ["d/only.txt", "d"] {
        w.put(name).await;
        w.deliver("BlobCreated", name, serde_json::json!({"api": "PutBlob"})).await;
        w.pump(&mut c, 1).await;
    }
    assert_eq!(c.shadowed, 1, "{c:?}");
    w.blobs.delete("d/only.txt").await.unwrap();
    w.deliver("BlobDeleted", "d/only.txt", serde_json::json!({"api": "DeleteBlob"})).await;
    w.pump(&mut c, 1).await;
    let e = w.filer.stat("/mnt/az/d").await.unwrap().expect("the file d");
    assert!(!e.is_dir() && e.size == 1, "{e:?}");
}

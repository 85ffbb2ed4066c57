//! The EventSource conformance suite on the local event source (a directory's filesystem
//! notifications in an in-process queue), with messages put on its queue directly.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tidemark_cloud::event_conformance::{EventHarness, Producer};
use tidemark_cloud::local_events::LocalWatchSource;

struct Inject(Arc<LocalWatchSource>);

#[async_trait]
impl Producer for Inject {
    async fn send(&self, body: &str) {
        self.0.inject(body);
    }
}

async fn local() -> EventHarness {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("bucket")).unwrap();
    let visibility = Duration::from_secs(2);
    let source = Arc::new(LocalWatchSource::open(root.path(), "bucket", visibility).unwrap());
    EventHarness { source: source.clone(), producer: Arc::new(Inject(source)), visibility, guard: Box::new(root) }
}

tidemark_cloud::event_source_conformance!(local());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_written_in_the_directory_arrives_as_an_s3_shaped_event() {
    use tidemark_core::events::{Decoded, EventSource, Provider, decode};
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("bucket")).unwrap();
    let source = LocalWatchSource::open(root.path(), "bucket", Duration::from_secs(5)).unwrap();
    assert!(source.missed_events(), "a fresh watcher may have missed what happened before it");
    source.caught_up();
    assert!(!source.missed_events());
    std::fs::create_dir_all(root.path().join("bucket/a b")).unwrap();
    std::fs::write(root.path().join("bucket/a b/c+d.txt"), b"hello").unwrap();
    let mut keys = std::collections::BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !keys.contains("a b/c+d.txt") && std::time::Instant::now() < deadline {
        for d in source.receive(100, Duration::from_millis(500)).await.unwrap() {
            if let Decoded::Events { events } = decode(Provider::S3, &d) {
                for e in events {
                    assert_eq!(e.bucket, "bucket");
                    keys.insert(e.key);
                }
            }
            source.ack(&[d.ack_id]).await.unwrap();
        }
    }
    assert!(keys.contains("a b/c+d.txt"), "{keys:?}");
    assert!(keys.contains("a b/"), "the new directory too: {keys:?}");
}

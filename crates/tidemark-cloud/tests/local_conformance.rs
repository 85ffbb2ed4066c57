//! The RemoteStorage conformance suite on a local directory and on the in-memory bucket.

use std::sync::Arc;

use tidemark_cloud::conformance::{Capabilities, Harness};
use tidemark_cloud::local::LocalStorage;
use tidemark_cloud::memory::MemoryStorage;

async fn local() -> Harness {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("bucket")).unwrap();
    let storage = LocalStorage::at(root.path(), "bucket").unwrap();
    Harness {
        storage: Arc::new(storage),
        caps: Capabilities {
            arbitrary_keys: false,
            user_metadata: false,
            lists_directories: true,
            directory_markers: true,
        },
        guard: Box::new(root),
    }
}

async fn memory() -> Harness {
    Harness {
        storage: Arc::new(MemoryStorage::default()),
        caps: Capabilities {
            arbitrary_keys: true,
            user_metadata: true,
            lists_directories: false,
            directory_markers: true,
        },
        guard: Box::new(()),
    }
}

mod on_local {
    tidemark_cloud::remote_storage_conformance!(super::local());
}

mod on_memory {
    tidemark_cloud::remote_storage_conformance!(super::memory());
}

#[test]
fn a_missing_bucket_directory_says_what_to_fix() {
    let root = tempfile::tempdir().unwrap();
    let err = LocalStorage::at(root.path(), "nope").unwrap_err().to_string();
    assert!(err.contains("no such entry") && err.contains("-local.root"), "{err}");
}

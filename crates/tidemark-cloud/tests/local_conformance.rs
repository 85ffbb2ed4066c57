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
            xml_unsafe_keys: true,
            headers: false,
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
            xml_unsafe_keys: true,
            headers: false,
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

/// A link inside a local bucket leads nowhere: it is not listed, not read, not written through
/// and not deleted, whether it names a file or a directory outside the bucket.
#[tokio::test]
async fn symbolic_links_in_a_bucket_are_never_followed() {
    use bytes::Bytes;
    use futures::TryStreamExt;
    use tidemark_core::RemoteStorage;

    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "outside the bucket").unwrap();
    let bucket = root.path().join("bucket");
    std::fs::create_dir_all(bucket.join("real")).unwrap();
    std::fs::write(bucket.join("real/file"), "inside").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), bucket.join("file-link")).unwrap();
    std::os::unix::fs::symlink(outside.path(), bucket.join("dir-link")).unwrap();
    std::os::unix::fs::symlink(outside.path(), bucket.join("real/nested-link")).unwrap();
    let s = LocalStorage::at(root.path(), "bucket").unwrap();

    let listed: Vec<String> = s.list("", None, None, 1000).await.unwrap().objects.into_iter().map(|o| o.key).collect();
    assert_eq!(listed, ["real/", "real/file"], "links are not listed");

    for key in ["file-link", "dir-link/secret", "real/nested-link/secret", "dir-link/"] {
        assert!(s.stat(key).await.unwrap().is_none(), "{key} is no object");
    }
    for key in ["file-link", "dir-link/secret", "real/nested-link/secret"] {
        let err = match s.get(key, None, None).await {
            Ok(stream) => panic!("{key} was read: {:?}", stream.try_collect::<Vec<_>>().await),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("symbolic link"), "{key}: {err}");
    }
    for key in ["dir-link/new", "real/nested-link/new", "file-link", "dir-link/sub/"] {
        let err = s.put(key, Bytes::from_static(b"written"), Default::default()).await.unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{key}: {err}");
    }
    for key in ["dir-link/secret", "real/nested-link/secret", "file-link", "dir-link/"] {
        s.delete(key).await.unwrap();
    }
    let left: Vec<_> = std::fs::read_dir(outside.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, [std::ffi::OsString::from("secret")], "nothing written or removed outside the bucket");
    assert_eq!(std::fs::read_to_string(outside.path().join("secret")).unwrap(), "outside the bucket");
    assert!(bucket.join("file-link").symlink_metadata().unwrap().is_symlink(), "the link itself is left alone");

    // Files beside the links still work.
    let got: Vec<Bytes> = s.get("real/file", None, None).await.unwrap().try_collect().await.unwrap();
    assert_eq!(got.concat(), b"inside");
    s.put("real/new", Bytes::from_static(b"new"), Default::default()).await.unwrap();
    assert_eq!(std::fs::read_to_string(bucket.join("real/new")).unwrap(), "new");
}

/// Whoever may configure remotes may not point a local one anywhere: only directories the
/// operator allowed (`--local-root`) are served.
#[test]
fn local_remotes_serve_allowed_directories_only() {
    use tidemark_cloud::local::LocalRoots;
    use tidemark_core::remote::{RemoteConf, StorageKind};

    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("allowed/b")).unwrap();
    std::fs::create_dir_all(root.path().join("other/b")).unwrap();
    std::os::unix::fs::symlink(root.path().join("other/b"), root.path().join("allowed/sneaky")).unwrap();
    let conf = |dir: &std::path::Path| RemoteConf {
        name: "r".into(),
        kind: StorageKind::Local,
        settings: [("root".to_string(), dir.display().to_string())].into(),
    };
    let allowed = LocalRoots::only(&[root.path().join("allowed")]).unwrap();
    LocalStorage::open(&conf(&root.path().join("allowed")), "b", &allowed).unwrap();
    LocalStorage::open(&conf(root.path()), "allowed", &allowed).unwrap();
    for (dir, bucket) in [
        (root.path().join("other"), "b"),
        (root.path().to_path_buf(), "other"),
        (root.path().join("allowed"), "sneaky"),
    ] {
        let err = LocalStorage::open(&conf(&dir), bucket, &allowed).unwrap_err().to_string();
        assert!(err.contains("--local-root") && err.contains("may serve"), "{}/{bucket}: {err}", dir.display());
    }
    let err =
        LocalStorage::open(&conf(std::path::Path::new("/")), "etc", &LocalRoots::default()).unwrap_err().to_string();
    assert!(err.contains("allowed: none"), "{err}");
    LocalStorage::open(&conf(std::path::Path::new("/")), "etc", &LocalRoots::any()).unwrap();
    assert!(LocalRoots::only(&[root.path().join("missing")]).unwrap_err().to_string().contains("--local-root"));
}

//! The filer's data directory: `meta.db` (the SQLite store), `blobs/` and `tmp/` (content), and
//! `LOCK`, held exclusively while a filer runs so that two processes never share one directory.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tidemark_core::{Error, Result};

#[derive(Debug)]
pub struct DataDir {
    root: PathBuf,
    _lock: File,
}

impl DataDir {
    pub fn open(root: impl AsRef<Path>) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&root)
            .map_err(|e| Error::io(format!("creating the data directory {}", root.display()), e))?;
        // The store holds remote credentials and every file's content: this user's alone, even
        // when the directory was made beforehand with a laxer mode.
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| Error::io(format!("restricting the data directory {} to its owner", root.display()), e))?;
        let lock_path = root.join("LOCK");
        let mut lock = OpenOptions::new()
            .mode(0o600)
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&lock_path)
            .map_err(|e| Error::io(format!("opening {}", lock_path.display()), e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(&lock_path).unwrap_or_default();
                return Err(Error::Unavailable {
                    message: format!(
                        "the data directory {} is in use by another tidemark process ({}); stop it or choose another --data-dir",
                        root.display(),
                        holder.trim()
                    ),
                });
            }
            Err(TryLockError::Error(e)) => return Err(Error::io(format!("locking {}", lock_path.display()), e)),
        }
        lock.set_len(0)
            .and_then(|_| write!(lock, "pid {}", std::process::id()))
            .map_err(|e| Error::io("writing LOCK", e))?;
        // The SQLite store creates its file 0600; an older one is brought to 0600 here.
        for name in ["meta.db", "meta.db-wal", "meta.db-shm"] {
            let f = root.join(name);
            match std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::io(format!("restricting {} to its owner", f.display()), e));
                }
                _ => {}
            }
        }
        Ok(DataDir { root, _lock: lock })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn store_file(&self) -> PathBuf {
        self.root.join("meta.db")
    }
}

/// A fresh cluster credential for this run, written to `cluster.token` (0600, replaced
/// atomically) in the data directory `root` (held by this process): the credential of
/// `tidemark server` without tokens. Reading it proves what reading the data directory proves
/// (its owner, who could read the secrets from the store anyway), so the file is the whole
/// authentication. Returns the token and the file.
pub fn fresh_cluster_token(root: &Path) -> Result<(String, PathBuf)> {
    let token = tidemark_core::ids::random_hex(32, "the cluster token")?;
    let file = root.join("cluster.token");
    let tmp = root.join("cluster.token.tmp");
    let _ = std::fs::remove_file(&tmp);
    OpenOptions::new()
        .mode(0o600)
        .create_new(true)
        .write(true)
        .open(&tmp)
        .and_then(|mut f| f.write_all(token.as_bytes()).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, &file))
        .map_err(|e| Error::io(format!("writing {}", file.display()), e))?;
    let file = std::fs::canonicalize(&file).unwrap_or(file);
    Ok((token, file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_directory_is_used_by_one_process_at_a_time() {
        let root = tempfile::tempdir().unwrap();
        let first = DataDir::open(root.path()).unwrap();
        let err = DataDir::open(root.path()).unwrap_err().to_string();
        assert!(err.contains("in use by another tidemark process"), "{err}");
        drop(first);
        DataDir::open(root.path()).unwrap();
    }

    #[test]
    fn a_cluster_token_is_fresh_each_time_and_the_owners_alone() {
        let dir = tempfile::tempdir().unwrap();
        let d = DataDir::open(dir.path().join("data")).unwrap();
        let (a, file) = fresh_cluster_token(d.root()).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), a);
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        let (b, again) = fresh_cluster_token(d.root()).unwrap();
        assert_ne!(a, b);
        assert_eq!(file, again);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), b);
    }

    #[test]
    fn the_data_directory_and_its_database_are_the_owners_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let fresh = tmp.path().join("fresh");
        let d = DataDir::open(&fresh).unwrap();
        assert_eq!(mode(&fresh), 0o700);
        let store =
            tidemark_store::SqliteStore::open(d.store_file(), std::sync::Arc::new(tidemark_core::SystemClock)).unwrap();
        for f in ["meta.db", "meta.db-wal", "meta.db-shm"] {
            assert_eq!(mode(&fresh.join(f)), 0o600, "{f}");
        }
        drop((store, d));
        // Made beforehand, world-readable, with an old database and WAL: tightened.
        let old = tmp.path().join("old");
        std::fs::create_dir(&old).unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
        for f in ["meta.db", "meta.db-wal"] {
            std::fs::write(old.join(f), b"").unwrap();
            std::fs::set_permissions(old.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let _d = DataDir::open(&old).unwrap();
        assert_eq!((mode(&old), mode(&old.join("meta.db")), mode(&old.join("meta.db-wal"))), (0o700, 0o600, 0o600));
    }
}

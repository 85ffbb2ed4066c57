//! The filer's data directory: `meta.db` (the SQLite store), `blobs/` and `tmp/` (content), and
//! `LOCK`, held exclusively while a filer runs so that two processes never share one directory.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
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
        std::fs::create_dir_all(&root)
            .map_err(|e| Error::io(format!("creating the data directory {}", root.display()), e))?;
        let lock_path = root.join("LOCK");
        let mut lock = OpenOptions::new()
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
        Ok(DataDir { root, _lock: lock })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn store_file(&self) -> PathBuf {
        self.root.join("meta.db")
    }
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
}

//! What a *data* credential (`--data-token`) may do: the namespace outside the system directory
//! `/etc/tidemark/`, and nothing of the control plane. The system documents there (remote
//! configurations with their secrets, mounts, subscriptions, the outbound cursor, leases' state)
//! are read and written only with the admin token, by the commands that validate them and the
//! cluster's own roles; a data client can neither read a secret nor plant a document.
//!
//! A wrapper over any [`Filer`], so the HTTP API serves a data request with exactly the same
//! handlers as an admin one.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use tidemark_core::cache::{CacheOutcome, CacheStats, CacheStatus};
use tidemark_core::model::{Applied, ChangeRecord, Entry, Fence, Lease, Page, Txn};
use tidemark_core::remote::system_paths;
use tidemark_core::{ByteRange, ByteStream, DeleteOptions, Error, Filer, Health, Result, WriteOptions};

pub struct DataScope {
    inner: Arc<dyn Filer>,
}

impl DataScope {
    pub fn new(inner: Arc<dyn Filer>) -> Self {
        DataScope { inner }
    }
}

fn refused(what: &str) -> Error {
    Error::Unauthorized {
        message: format!(
            "{what}: the system directory {} is the admin's; a data token reaches the rest of the namespace only",
            system_paths::ROOT
        ),
    }
}

/// Whether `p` is the system directory or below it.
fn is_system(p: &str) -> bool {
    p.strip_prefix(system_paths::ROOT).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Whether a change to `p` could reach the system directory: `p` is in it, or above it (`/`,
/// `/etc`), where a recursive delete or replacing the directory with a file would take it along.
fn reaches_system(p: &str) -> bool {
    is_system(p) || p == "/" || system_paths::ROOT.strip_prefix(p).is_some_and(|rest| rest.starts_with('/'))
}

fn readable(p: &str) -> Result<()> {
    if is_system(p) { Err(refused(p)) } else { Ok(()) }
}

fn writable(p: &str) -> Result<()> {
    if reaches_system(p) { Err(refused(p)) } else { Ok(()) }
}

#[async_trait]
impl Filer for DataScope {
    async fn health(&self) -> Result<Health> {
        self.inner.health().await
    }

    async fn stat(&self, path: &str) -> Result<Option<Entry>> {
        readable(path)?;
        self.inner.stat(path).await
    }

    async fn list(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page> {
        readable(dir)?;
        self.inner.list(dir, start_after, limit).await
    }

    async fn scan(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page> {
        readable(dir)?;
        let mut page = self.inner.scan(dir, start_after, limit).await?;
        // A scan of `/` or `/etc` passes through the system directory: its entries are left out
        // (the continuation still points past them).
        page.entries.retain(|e| !is_system(&e.path));
        Ok(page)
    }

    async fn count(&self, dir: &str) -> Result<u64> {
        readable(dir)?;
        self.inner.count(dir).await
    }

    async fn read(&self, path: &str, range: Option<ByteRange>) -> Result<(Entry, ByteStream)> {
        readable(path)?;
        self.inner.read(path, range).await
    }

    async fn write(&self, path: &str, body: ByteStream, opts: WriteOptions) -> Result<Entry> {
        writable(path)?;
        self.inner.write(path, body, opts).await
    }

    async fn delete(&self, path: &str, opts: DeleteOptions) -> Result<Applied> {
        writable(path)?;
        self.inner.delete(path, opts).await
    }

    async fn apply(&self, txn: Txn) -> Result<Applied> {
        writable(&txn.path)?;
        if txn.fence.is_some() {
            // Fences come from leases, which are the cluster's own.
            return Err(refused("a fenced transaction"));
        }
        self.inner.apply(txn).await
    }

    async fn lease_acquire(&self, name: &str, _holder: &str, _ttl: Duration) -> Result<Lease> {
        Err(refused(&format!("lease {name}")))
    }

    async fn lease_renew(&self, fence: &Fence, _ttl: Duration) -> Result<Lease> {
        Err(refused(&format!("lease {}", fence.lease)))
    }

    async fn lease_release(&self, fence: &Fence) -> Result<()> {
        Err(refused(&format!("lease {}", fence.lease)))
    }

    async fn lease_get(&self, name: &str) -> Result<Option<Lease>> {
        Err(refused(&format!("lease {name}")))
    }

    async fn changes(&self, after: u64, limit: usize, wait: Duration) -> Result<Vec<ChangeRecord>> {
        let mut records = self.inner.changes(after, limit, wait).await?;
        // Redacted, not dropped: a follower must still see the sequence move on (dropping every
        // record of a page would have it ask again, at once, for the same page).
        for r in records.iter_mut().filter(|r| is_system(&r.path)) {
            r.path = system_paths::ROOT.to_string();
            r.old = None;
            r.new = None;
        }
        Ok(records)
    }

    async fn cache_status(&self, paths: &[String]) -> Result<Vec<CacheStatus>> {
        if let Some(p) = paths.iter().find(|p| is_system(p)) {
            return Err(refused(p));
        }
        self.inner.cache_status(paths).await
    }

    async fn cache_fetch(&self, path: &str, wait: bool) -> Result<CacheOutcome> {
        readable(path)?;
        self.inner.cache_fetch(path, wait).await
    }

    async fn cache_drop(&self, path: &str) -> Result<CacheOutcome> {
        readable(path)?;
        self.inner.cache_drop(path).await
    }

    async fn cache_stats(&self) -> Result<CacheStats> {
        self.inner.cache_stats().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_directory_and_what_lies_above_it() {
        for p in ["/etc/tidemark", "/etc/tidemark/remote/s3.conf"] {
            assert!(is_system(p) && reaches_system(p), "{p}");
        }
        for p in ["/", "/etc"] {
            assert!(!is_system(p) && reaches_system(p), "{p}");
        }
        for p in ["/etc/tidemarks", "/etc/tidemark.conf", "/etcetera", "/data/etc/tidemark", "/e"] {
            assert!(!is_system(p) && !reaches_system(p), "{p}");
        }
    }
}

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
use tidemark_core::model::{Applied, ChangeRecord, Entry, Fence, Lease, Page, Txn, TxnBatch};
use tidemark_core::remote::system_paths::{self, is_system, reaches_system};
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

/// A continuation past every path below the system directory: its prefix, then more of the
/// greatest character than any valid path has room for (paths are at most
/// [`MAX_PATH_BYTES`](tidemark_core::path::MAX_PATH_BYTES), ordered by their UTF-8 bytes, which
/// is code point order).
fn past_system_subtree() -> String {
    let mut s = format!("{}/", system_paths::ROOT);
    s.extend(std::iter::repeat_n('\u{10FFFF}', tidemark_core::path::MAX_PATH_BYTES / 4 + 1));
    s
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

    async fn describe(&self, path: &str) -> Result<Option<Entry>> {
        readable(path)?;
        self.inner.describe(path).await
    }

    async fn list(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page> {
        readable(dir)?;
        self.inner.list(dir, start_after, limit).await
    }

    async fn scan(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page> {
        readable(dir)?;
        if !reaches_system(dir) {
            return self.inner.scan(dir, start_after, limit).await;
        }
        // A scan of `/` or `/etc` passes the system directory. Its subtree is stepped over in
        // one seek and the page filled from beyond it, so neither a page's size nor the time it
        // took says how many entries lie there (uploads in progress, subscriptions).
        let limit = limit.max(1);
        let mut entries = Vec::with_capacity(limit.min(1024));
        let mut after = start_after.map(str::to_string);
        loop {
            let page = self.inner.scan(dir, after.as_deref(), limit - entries.len()).await?;
            let mut stepped = false;
            for e in page.entries {
                if is_system(&e.path) {
                    // The directory itself sorts before names like `/etc/tidemark-x` that are
                    // not in it; only its subtree is contiguous.
                    after = Some(if e.path == system_paths::ROOT { e.path } else { past_system_subtree() });
                    stepped = true;
                    break;
                }
                after = Some(e.path.clone());
                entries.push(e);
            }
            if !stepped {
                let next = page.next.and_then(|_| entries.last().map(|e| e.path.clone()));
                return Ok(Page { entries, next });
            }
        }
    }

    async fn count(&self, dir: &str, except: Option<&str>) -> Result<u64> {
        readable(dir)?;
        // Above the system directory (`/`, `/etc`), its entries are left out of the count, in the
        // same read (a count that moved with them would tell a data client they changed).
        let except = if reaches_system(dir) { Some(system_paths::ROOT) } else { except };
        self.inner.count(dir, except).await
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
        txn.paths().try_for_each(writable)?;
        if txn.fence.is_some() {
            // Fences come from leases, which are the cluster's own.
            return Err(refused("a fenced transaction"));
        }
        self.inner.apply(txn).await
    }

    async fn apply_many(&self, batch: TxnBatch) -> Result<Vec<Result<Applied>>> {
        // A batch is refused whole if any of it reaches beyond the token's scope.
        if batch.fence.is_some() || batch.txns.iter().any(|t| t.fence.is_some()) {
            return Err(refused("a fenced transaction"));
        }
        batch.txns.iter().flat_map(Txn::paths).try_for_each(writable)?;
        self.inner.apply_many(batch).await
    }

    async fn stat_many(&self, paths: &[String]) -> Result<Vec<Option<Entry>>> {
        paths.iter().try_for_each(|p| readable(p))?;
        self.inner.stat_many(paths).await
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

    async fn local_file(&self, path: &str) -> Result<Option<tidemark_core::filer::LocalFile>> {
        readable(path)?;
        self.inner.local_file(path).await
    }
}

/// What an operator's admin token may do once a cluster token exists: everything, but secrets in
/// system documents are read masked, and a document written back with those masks gets the
/// stored secrets back (so `remote.configure -name=x -s3.region=...` keeps the key it cannot see).
/// The cluster's own roles (workers, the S3 gateway) use the cluster token and read them whole.
pub struct AdminScope {
    inner: Arc<dyn Filer>,
}

impl AdminScope {
    /// A put of a system document written back with masks gets the stored secrets restored.
    async fn unmask_put(&self, txn: &mut Txn) -> Result<()> {
        if is_system(&txn.path)
            && let tidemark_core::model::Mutation::Put { entry, data: Some(data) } = &mut txn.mutation
        {
            let restored = self.unmasked(&txn.path, data.to_vec()).await?;
            entry.size = restored.len() as u64;
            *data = bytes::Bytes::from(restored);
        }
        Ok(())
    }

    pub fn new(inner: Arc<dyn Filer>) -> Self {
        AdminScope { inner }
    }
}

/// System documents are small; a larger body is not one this scope rewrites.
const MAX_DOC_BYTES: usize = 4 << 20;

async fn collect(path: &str, mut s: ByteStream) -> Result<Vec<u8>> {
    use futures::StreamExt;
    let mut out = Vec::new();
    while let Some(chunk) = s.next().await {
        out.extend_from_slice(&chunk.map_err(|e| Error::io(format!("reading {path}"), e))?);
        if out.len() > MAX_DOC_BYTES {
            return Err(Error::invalid_argument(format!("{path}: a system document is at most {MAX_DOC_BYTES} bytes")));
        }
    }
    Ok(out)
}

impl AdminScope {
    /// `bytes` with the stored secrets restored where they carry masks (unchanged if not JSON or
    /// nothing was masked).
    async fn unmasked(&self, path: &str, bytes: Vec<u8>) -> Result<Vec<u8>> {
        let Ok(mut doc) = serde_json::from_slice::<serde_json::Value>(&bytes) else { return Ok(bytes) };
        let stored = match self.inner.read(path, None).await {
            Ok((_, s)) => serde_json::from_slice::<serde_json::Value>(&collect(path, s).await?).ok(),
            Err(Error::NotFound { .. }) => None,
            Err(e) => return Err(e),
        };
        match tidemark_core::secrets::unmask_json(&mut doc, stored.as_ref()) {
            Ok(true) => serde_json::to_vec_pretty(&doc).map_err(Error::internal),
            Ok(false) => Ok(bytes),
            Err(why) => Err(Error::invalid_argument(format!("{path}: {why}"))),
        }
    }
}

#[async_trait]
impl Filer for AdminScope {
    async fn health(&self) -> Result<Health> {
        self.inner.health().await
    }

    async fn stat(&self, path: &str) -> Result<Option<Entry>> {
        self.inner.stat(path).await
    }

    async fn describe(&self, path: &str) -> Result<Option<Entry>> {
        self.inner.describe(path).await
    }

    async fn list(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page> {
        self.inner.list(dir, start_after, limit).await
    }

    async fn scan(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page> {
        self.inner.scan(dir, start_after, limit).await
    }

    async fn count(&self, dir: &str, except: Option<&str>) -> Result<u64> {
        self.inner.count(dir, except).await
    }

    async fn read(&self, path: &str, range: Option<ByteRange>) -> Result<(Entry, ByteStream)> {
        if !is_system(path) {
            return self.inner.read(path, range).await;
        }
        let (mut entry, stream) = self.inner.read(path, None).await?;
        let mut bytes = collect(path, stream).await?;
        if let Ok(mut doc) = serde_json::from_slice::<serde_json::Value>(&bytes) {
            tidemark_core::secrets::mask_json(&mut doc);
            bytes = serde_json::to_vec_pretty(&doc).map_err(Error::internal)?;
        }
        // The entry describes what is served: the masked document.
        entry.size = bytes.len() as u64;
        let slice = bytes::Bytes::from(bytes).slice(crate::local::slice_range(path, entry.size as usize, range)?);
        let body: ByteStream = Box::pin(futures::stream::once(async move { Ok(slice) }));
        Ok((entry, body))
    }

    async fn write(&self, path: &str, body: ByteStream, opts: WriteOptions) -> Result<Entry> {
        if !is_system(path) {
            return self.inner.write(path, body, opts).await;
        }
        let bytes = self.unmasked(path, collect(path, body).await?).await?;
        let body: ByteStream = Box::pin(futures::stream::once(async move { Ok(bytes::Bytes::from(bytes)) }));
        self.inner.write(path, body, opts).await
    }

    async fn delete(&self, path: &str, opts: DeleteOptions) -> Result<Applied> {
        self.inner.delete(path, opts).await
    }

    async fn apply(&self, mut txn: Txn) -> Result<Applied> {
        self.unmask_put(&mut txn).await?;
        self.inner.apply(txn).await
    }

    async fn apply_many(&self, mut batch: TxnBatch) -> Result<Vec<Result<Applied>>> {
        for txn in &mut batch.txns {
            self.unmask_put(txn).await?;
        }
        self.inner.apply_many(batch).await
    }

    async fn stat_many(&self, paths: &[String]) -> Result<Vec<Option<Entry>>> {
        self.inner.stat_many(paths).await
    }

    async fn lease_acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Lease> {
        self.inner.lease_acquire(name, holder, ttl).await
    }

    async fn lease_renew(&self, fence: &Fence, ttl: Duration) -> Result<Lease> {
        self.inner.lease_renew(fence, ttl).await
    }

    async fn lease_release(&self, fence: &Fence) -> Result<()> {
        self.inner.lease_release(fence).await
    }

    async fn lease_get(&self, name: &str) -> Result<Option<Lease>> {
        self.inner.lease_get(name).await
    }

    async fn changes(&self, after: u64, limit: usize, wait: Duration) -> Result<Vec<ChangeRecord>> {
        self.inner.changes(after, limit, wait).await
    }

    async fn cache_status(&self, paths: &[String]) -> Result<Vec<CacheStatus>> {
        self.inner.cache_status(paths).await
    }

    async fn cache_fetch(&self, path: &str, wait: bool) -> Result<CacheOutcome> {
        self.inner.cache_fetch(path, wait).await
    }

    async fn cache_drop(&self, path: &str) -> Result<CacheOutcome> {
        self.inner.cache_drop(path).await
    }

    async fn cache_stats(&self) -> Result<CacheStats> {
        self.inner.cache_stats().await
    }

    async fn local_file(&self, path: &str) -> Result<Option<tidemark_core::filer::LocalFile>> {
        self.inner.local_file(path).await
    }
}

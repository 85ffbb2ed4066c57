//! The in-process filer: the namespace over a `MetaStore` and the blob directory.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;

use tidemark_core::cache::{self, CacheOutcome, CacheStats, CacheStatus};
use tidemark_core::model::{
    Applied, CREATED_AFTER_ATTR, ChangeRecord, Content, Entry, EntryKind, Fence, Lease, MAX_BATCH, MAX_INLINE_BYTES,
    MD5_ATTR, Mutation, NewEntry, Page, Precondition, Txn, TxnBatch, inode_path,
};
use tidemark_core::{
    ByteRange, ByteStream, Clock, DeleteOptions, Error, Filer, Health, MetaStore, Result, SystemClock, WriteOptions,
    path,
};
use tidemark_store::SqliteStore;

use crate::blobs::{BlobDir, Blobs, S3Blobs, Stored, StoredContent};
use crate::cache::{CacheConfig, ContentCache};
use crate::datadir::DataDir;
use crate::remotes::Remotes;

/// How often a write re-reads the entry when a concurrent write changed it in between.
const WRITE_RETRIES: usize = 8;
/// The most change-log records one call returns, whatever the caller asks.
pub const MAX_CHANGES_PER_CALL: usize = 10_000;
/// The longest a change-log read waits for new records.
pub const MAX_CHANGES_WAIT: Duration = Duration::from_secs(60);

pub struct LocalFiler {
    store: Arc<dyn MetaStore>,
    /// The data directory's root (`blobs/`, `tmp/`, `cache/`).
    root: std::path::PathBuf,
    blobs: Blobs,
    remotes: Arc<Remotes>,
    cache: ContentCache,
    clock: Arc<dyn Clock>,
    /// The highest change-log sequence number this filer has committed or read (0: none yet), a
    /// lower bound of the log's end: what a new local file's `CREATED_AFTER_ATTR` says.
    seen_seq: std::sync::atomic::AtomicU64,
    _data_dir: Option<DataDir>,
}

impl LocalFiler {
    /// `entry`, with its object's headers recorded if it is remote-backed and never saw them
    /// (see `Filer::describe`): one HEAD of the object (counted), then the same entry with them,
    /// on its version. Anything else — the HEAD failing, the object another one by now (a
    /// different etag: its event or a reconcile brings it), the entry changed meanwhile — leaves
    /// the entry as it was, and a read goes on.
    async fn with_headers(&self, entry: Entry) -> Entry {
        use tidemark_core::model::object_attrs;
        let clean = entry.remote.as_ref().is_some_and(|r| r.dirty_after.is_none());
        if entry.content != Content::Remote || !clean || object_attrs::headers_seen(&entry.extended) {
            return entry;
        }
        let mut n = entry.to_new();
        match self.remotes.head(self.store.as_ref(), &entry).await {
            Ok(Some(object)) if entry.remote.as_ref().is_some_and(|r| r.etag == object.etag) => {
                object_attrs::refresh(&mut n.extended, &object, true);
            }
            Ok(_) => return entry,
            // Refused for good: recorded, so reads fail at once with the reason and no HEAD is
            // asked again for it.
            Err(Error::Unreadable { reason, .. }) => {
                tracing::warn!(path = %entry.path, %reason, "the bucket refuses this object's bytes: marked unreadable");
                n.extended.insert(object_attrs::UNREADABLE.to_string(), reason);
                n.extended.insert(object_attrs::HEADERS_SEEN.to_string(), "1".to_string());
            }
            Err(e) => {
                tracing::debug!(path = %entry.path, error = %e, "asking the bucket for an object's headers failed");
                return entry;
            }
        }
        let txn = Txn::put(&entry.path, n, tidemark_core::Origin::Remote)
            .with_precondition(Precondition::Version(entry.version));
        match self.apply(txn).await {
            Ok(Applied { new: Some(recorded), .. }) => recorded,
            Ok(_) => entry,
            Err(e) => {
                tracing::debug!(path = %entry.path, error = %e, "recording an object's headers failed");
                entry
            }
        }
    }

    /// Opens the filer on a data directory with the embedded SQLite store.
    pub fn open(data_dir: DataDir) -> Result<Self> {
        let file = data_dir.store_file();
        Self::open_sqlite(data_dir, &file)
    }

    /// Opens the filer with its SQLite store in `file` (content stays in the data directory).
    pub fn open_sqlite(data_dir: DataDir, file: &std::path::Path) -> Result<Self> {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let store = SqliteStore::open(file, clock.clone())?;
        let root = data_dir.root().to_path_buf();
        Self::assemble(Arc::new(store), &root, clock, Some(data_dir))
    }

    /// Opens the filer on a data directory (content, lock) with a store of its own choosing
    /// (a shared PostgreSQL store).
    pub fn open_with_store(data_dir: DataDir, store: Arc<dyn MetaStore>) -> Result<Self> {
        let root = data_dir.root().to_path_buf();
        Self::assemble(store, &root, Arc::new(SystemClock), Some(data_dir))
    }

    /// A filer over any store, with blobs and the cache under `blob_root` (tests, other backends).
    pub fn with_store(store: Arc<dyn MetaStore>, blob_root: &std::path::Path, clock: Arc<dyn Clock>) -> Result<Self> {
        Self::assemble(store, blob_root, clock, None)
    }

    fn assemble(
        store: Arc<dyn MetaStore>,
        root: &std::path::Path,
        clock: Arc<dyn Clock>,
        data_dir: Option<DataDir>,
    ) -> Result<Self> {
        let blobs = Blobs::Dir(BlobDir::open(root)?);
        let remotes = Arc::new(Remotes::default());
        let cache = ContentCache::open(root, store.clone(), remotes.clone(), clock.clone(), CacheConfig::default())?;
        Ok(LocalFiler {
            store,
            root: root.to_path_buf(),
            blobs,
            remotes,
            cache,
            clock,
            seen_seq: Default::default(),
            _data_dir: data_dir,
        })
    }

    /// Keeps content on a shared object store instead of the data directory (`--blob-store`),
    /// so that every filer of a cluster reads every file.
    pub fn with_blob_store(mut self, store: S3Blobs) -> Self {
        self.blobs = Blobs::S3(store);
        self
    }

    pub fn blobs(&self) -> &Blobs {
        &self.blobs
    }

    /// Sets the content cache up with `config` (its budget; 0 turns it off).
    pub fn with_cache(mut self, config: CacheConfig) -> Result<Self> {
        let root = self.root.clone();
        self.cache = ContentCache::open(&root, self.store.clone(), self.remotes.clone(), self.clock.clone(), config)?;
        Ok(self)
    }

    pub fn cache(&self) -> &ContentCache {
        &self.cache
    }

    pub fn store(&self) -> &Arc<dyn MetaStore> {
        &self.store
    }

    pub fn remotes(&self) -> &Remotes {
        &self.remotes
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// This cluster's id: created once, by the first filer, in `/etc/tidemark/cluster.json`.
    pub async fn cluster_id(&self) -> Result<String> {
        use tidemark_core::remote::system_paths::CLUSTER;
        #[derive(serde::Serialize, serde::Deserialize)]
        struct Cluster {
            id: String,
        }
        if let Some((c, _)) = crate::remotes::read_doc::<Cluster>(self.store.as_ref(), CLUSTER).await? {
            return Ok(c.id);
        }
        let id = tidemark_core::ids::random_hex(8, "a cluster id")?;
        let data = bytes::Bytes::from(serde_json::to_vec(&Cluster { id: id.clone() }).map_err(Error::internal)?);
        let txn = Txn::put(
            CLUSTER,
            NewEntry::file(data.len() as u64, self.clock.now_ms(), Content::Inline),
            tidemark_core::Origin::System,
        )
        .with_precondition(Precondition::Absent)
        .with_data(data);
        match self.store.apply(txn).await {
            Ok(_) => Ok(id),
            // Another filer created it first: theirs is the cluster's.
            Err(Error::PreconditionFailed { .. }) => {
                let (c, _) = crate::remotes::read_doc::<Cluster>(self.store.as_ref(), CLUSTER)
                    .await?
                    .ok_or_else(|| Error::internal("the cluster id vanished"))?;
                Ok(c.id)
            }
            Err(e) => Err(e),
        }
    }

    /// Under a mount that syncs, a user's delete of remote-backed files leaves a tombstone for
    /// each (written first: a crash in between leaves a tombstone whose entry still exists, which
    /// nothing reads), so that remote state the user deleted does not bring them back before the
    /// outbound sync deletes the objects. It removes the tombstones once it has.
    async fn tombstone_before_delete(&self, p: &str, recursive: bool) -> Result<()> {
        let mapping = self.mount_mapping().await?;
        if !mapping.find_for(p).is_some_and(|m| m.sync && m.dir != p) {
            return Ok(());
        }
        let victims = self.entry_and_below(p, recursive).await?;
        self.write_tombstones(victims.iter().filter(|e| !e.is_dir()).map(|e| (e, None))).await?;
        // A local-only file may be on its way to the bucket: the outbound sync may be putting it
        // at this very moment. A tombstone of that pending upload keeps its event from bringing
        // the file back, and tells the sync the object is nobody's (as a rename's does).
        let now = self.clock.now_ms();
        let pending: Vec<Txn> = victims
            .iter()
            .filter(|e| e.kind == tidemark_core::model::EntryKind::File && e.remote.is_none())
            .map(|e| tombstone_txn(&pending_upload_tombstone(e, now, None), now))
            .collect();
        self.apply_batches(pending).await
    }

    /// Applies `txns`, at most a batch at a time, failing on the first refused.
    async fn apply_batches(&self, txns: Vec<Txn>) -> Result<()> {
        for batch in txns.chunks(tidemark_core::model::MAX_BATCH) {
            for r in self.store.apply_many(TxnBatch { fence: None, txns: batch.to_vec() }).await? {
                r?;
            }
        }
        Ok(())
    }

    /// The entry at `p` and, with `below`, every entry under it (none if `p` is absent).
    async fn entry_and_below(&self, p: &str, below: bool) -> Result<Vec<Entry>> {
        let Some(entry) = self.store.get(p).await? else { return Ok(Vec::new()) };
        let mut all = vec![entry.clone()];
        if below && entry.is_dir() {
            let mut after: Option<String> = None;
            loop {
                let page = self.store.scan(p, after.as_deref(), 1000).await?;
                all.extend(page.entries);
                match page.next {
                    Some(n) => after = Some(n),
                    None => break,
                }
            }
        }
        Ok(all)
    }

    /// A tombstone for each remote-backed entry of `gone` (whose objects the outbound sync will
    /// delete), with where it was renamed to if it was; a batch of transactions at a time.
    async fn write_tombstones<'a>(&self, gone: impl Iterator<Item = (&'a Entry, Option<String>)>) -> Result<()> {
        use tidemark_core::decide::Tombstone;
        let now = self.clock.now_ms();
        let txns: Vec<Txn> = gone
            .filter_map(|(e, moved_to)| {
                let r = e.remote.as_ref()?;
                let t = Tombstone {
                    path: e.path.clone(),
                    version: e.version,
                    etag: r.etag.clone(),
                    remote_mtime_ms: r.remote_mtime_ms,
                    deleted_at_ms: now,
                    pending_upload: tidemark_core::decide::is_locally_dirty(e),
                    pending_after: r.dirty_after,
                    moved_to,
                };
                Some(tombstone_txn(&t, now))
            })
            .collect();
        self.apply_batches(txns).await
    }

    /// Applies a transaction, then removes the blobs that no entry names any more.
    async fn commit(&self, txn: Txn) -> Result<Applied> {
        let applied = self.store.apply(txn).await?;
        self.after_commit(&[&applied]).await;
        Ok(applied)
    }

    /// A lower bound of the change log's end: what this filer has committed since it started, or
    /// the store's answer the first time.
    async fn log_end(&self) -> Result<u64> {
        match self.seen_seq.load(std::sync::atomic::Ordering::Relaxed) {
            0 => {
                let seq = self.store.last_seq().await?;
                self.seen_seq.fetch_max(seq, std::sync::atomic::Ordering::Relaxed);
                Ok(seq)
            }
            seq => Ok(seq),
        }
    }

    /// After transactions committed (one, or a batch's): removes the blobs no entry names any
    /// more and the cached bytes of versions they replaced. The records of a transaction, and of
    /// a batch's transactions, are one dense range, so they are read back exactly. A failure
    /// here leaks space and loses nothing: the entries that named those bytes are gone.
    async fn after_commit(&self, applied: &[&Applied]) {
        if let Some(seq) = applied.iter().map(|a| a.seq).max() {
            self.seen_seq.fetch_max(seq, std::sync::atomic::Ordering::Relaxed);
        }
        let needs_records = |a: &&Applied| {
            a.seq > a.first_seq
                || blob_of(a.old.as_ref()).is_some()
                || a.old.as_ref().is_some_and(|o| cache::invalidates(o, a.new.as_ref()))
        };
        if !applied.iter().any(needs_records) {
            return;
        }
        let (Some(first), Some(last)) =
            (applied.iter().map(|a| a.first_seq).min(), applied.iter().map(|a| a.seq).max())
        else {
            return;
        };
        let records = match self.store.changes(first - 1, (last + 1 - first) as usize).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, first, last, "could not read back committed records; replaced bytes stay on disk");
                return;
            }
        };
        for r in records {
            if r.moved_to.is_some() {
                // Renamed: the entry, its blob and its cached bytes live on at `moved_to`.
                continue;
            }
            self.release_blob(r.old.as_ref(), r.new.as_ref()).await;
            // The transaction dropped the old version's cache records; its bytes go now.
            if let Some(old) = &r.old
                && cache::invalidates(old, r.new.as_ref())
                && let Some(id) = cache::content_id(old)
            {
                self.cache.reclaim(&id).await;
            }
        }
    }

    /// The remote mounts (none before the first `remote.mount`).
    async fn mount_mapping(&self) -> Result<tidemark_core::remote::MountMapping> {
        let path = tidemark_core::remote::system_paths::MOUNT_MAPPING;
        Ok(crate::remotes::read_doc(self.store.as_ref(), path).await?.map(|(m, _)| m).unwrap_or_default())
    }

    /// `CrossMount` if `from` or `to` lies in a remote mount (`why`: what that rules out); the
    /// mount table otherwise.
    async fn outside_remote_mounts(
        &self,
        from: &str,
        to: &str,
        why: &str,
    ) -> Result<tidemark_core::remote::MountMapping> {
        let mapping = self.mount_mapping().await?;
        for p in [from, to] {
            if let Some(m) = mapping.find_for(p) {
                return Err(Error::CrossMount {
                    path: from.to_string(),
                    message: format!("{p} is in the remote mount {}; {why}", m.dir),
                });
            }
        }
        Ok(mapping)
    }

    /// A rename is one transaction in the namespace. In a remote mount whose sync is on, the
    /// bucket's keys follow: each moved entry keeps its object's old key (`moved_from`, set by the
    /// store) until the outbound sync has put the object at the new key, then deletes the old
    /// one; a tombstone at each old path (written first, as a delete's) keeps a reconcile from
    /// bringing the old key back meanwhile. Elsewhere in remote mounts (sync off, across mounts,
    /// the mount's own directory, a directory holding one) it is refused: the caller copies.
    async fn check_rename(&self, from: &str, to: &str) -> Result<()> {
        let mapping = self.mount_mapping().await?;
        // A directory that holds a remote mount cannot move from under it.
        if let Some(m) = mapping.mounts.iter().find(|m| path::is_within(&m.dir, from)) {
            return Err(Error::CrossMount {
                path: from.to_string(),
                message: format!("the remote mount {} is below it", m.dir),
            });
        }
        let (a, b) = (mapping.find_for(from), mapping.find_for(to));
        match (a, b) {
            (None, None) => Ok(()),
            (Some(m), Some(n)) if m.dir == n.dir && m.sync && to != m.dir => {
                let moved = self.entry_and_below(from, true).await?;
                let new_path = |e: &Entry| format!("{to}{}", &e.path[from.len()..]);
                // Those whose object is at their own key get a tombstone there; a renamed entry
                // not yet carried has its first old path's, which learns where it is now.
                let at_own_key = moved.iter().filter(|e| {
                    e.remote.as_ref().is_some_and(|r| r.moved_from.is_none() && !(e.is_dir() && r.etag.is_empty()))
                });
                self.write_tombstones(at_own_key.map(|e| (e, Some(new_path(e))))).await?;
                let now = self.clock.now_ms();
                // A file whose object is not at its own key yet (local-only, or renamed and not
                // carried) may be on its way there: the outbound sync may be putting it at this
                // very moment. A tombstone of that pending upload keeps its event from bringing
                // the file back here, and tells the sync the object is nobody's.
                let pending: Vec<Txn> = moved
                    .iter()
                    .filter(|e| e.kind == tidemark_core::model::EntryKind::File)
                    .filter(|e| e.remote.as_ref().is_none_or(|r| r.moved_from.is_some()))
                    .map(|e| tombstone_txn(&pending_upload_tombstone(e, now, Some(new_path(e))), now))
                    .collect();
                self.apply_batches(pending).await?;
                for e in &moved {
                    let Some(old) = e.remote.as_ref().and_then(|r| r.moved_from.as_deref()) else { continue };
                    let at = tidemark_core::remote::system_paths::tombstone(old);
                    if let Some((mut t, _)) =
                        crate::remotes::read_doc::<tidemark_core::decide::Tombstone>(self.store.as_ref(), &at).await?
                        && t.moved_to.as_deref() == Some(&e.path)
                    {
                        t.moved_to = Some(new_path(e));
                        self.store.apply(tombstone_txn(&t, now)).await?;
                    }
                }
                Ok(())
            }
            _ => {
                let p = if a.is_some() { from } else { to };
                let m = a.or(b).map(|m| m.dir.as_str()).unwrap_or_default();
                let why = if a.is_some_and(|m| !m.sync) && a.map(|m| &m.dir) == b.map(|m| &m.dir) {
                    "its sync is off, so its bucket's keys cannot follow a rename (remote.sync.enable -dir turns it on); renames there are copies"
                } else {
                    "renames into or out of it are copies (copy, then delete the original)"
                };
                Err(Error::CrossMount {
                    path: from.to_string(),
                    message: format!("{p} is in the remote mount {m}; {why}"),
                })
            }
        }
    }

    /// A hard link is a second name in the namespace only: a bucket's object has one key, so a
    /// remote mount has no second names.
    async fn check_link(&self, from: &str, to: &str) -> Result<()> {
        // The control plane reads its documents by path: they keep theirs.
        for p in [from, to] {
            if tidemark_core::remote::system_paths::is_system(p) {
                return Err(Error::invalid_argument(format!("{p}: the system directory's documents have one name")));
            }
        }
        self.outside_remote_mounts(from, to, "its objects have one key each: no hard links").await.map(drop)
    }

    /// Hard links: each name of a file answers as the file — its inode entry's kind, size,
    /// bytes, attributes and version, under the name's path, with `posix.inode` saying which
    /// file it is. One batched read for the names among `entries`.
    async fn resolve_links<'a>(&self, entries: impl Iterator<Item = &'a mut Entry>) -> Result<()> {
        let mut names: Vec<&mut Entry> = entries.filter(|e| e.posix.inode.is_some()).collect();
        for chunk in names.chunks_mut(tidemark_core::model::MAX_BATCH) {
            let paths: Vec<String> = chunk.iter().filter_map(|e| e.posix.inode).map(inode_path).collect();
            let inodes = self.store.get_many(&paths).await?;
            for (name, inode) in chunk.iter_mut().zip(inodes) {
                // A name whose inode entry is gone (it cannot be: they go together) stays as it is.
                if let Some(mut file) = inode {
                    file.path = std::mem::take(&mut name.path);
                    file.posix.inode = name.posix.inode;
                    **name = file;
                }
            }
        }
        Ok(())
    }

    /// The filer's checks of a transaction before the store's: content that matches its size,
    /// kept content that is really there.
    async fn check_txn(&self, txn: &Txn) -> Result<()> {
        if let Mutation::Rename { to, .. } = &txn.mutation {
            self.check_rename(&txn.path, to).await?;
        }
        if let Mutation::Link { to } = &txn.mutation {
            self.check_link(&txn.path, to).await?;
        }
        if let Mutation::Put { entry, data } = &txn.mutation {
            check_put(&txn.path, entry, data.as_ref())?;
            // A put that keeps the content the entry has (its inline bytes, sent without data, or
            // its blob) keeps that content's size.
            let kept_blob = match &entry.content {
                Content::Blob { id } => Some(id.as_str()),
                _ => None,
            };
            if kept_blob.is_some() || (entry.content == Content::Inline && data.is_none()) {
                let current = self.store.get(&txn.path).await?;
                match kept_blob {
                    Some(id) => check_kept_blob(txn, id, entry.size, current.as_ref())?,
                    None if current.as_ref().is_some_and(|e| e.content == Content::Inline && e.size == entry.size) => {}
                    None => {
                        return Err(Error::invalid_argument(format!(
                            "{}: an inline put without data keeps the entry's inline bytes, so its size must be theirs",
                            txn.path
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// Removes the blob `old` named if `new` does not. In the data directory at once (a reader
    /// that opened it keeps its bytes); on a shared blob store the collector does it, after a
    /// grace period in which readers on any filer that read the old entry still find it.
    async fn release_blob(&self, old: Option<&Entry>, new: Option<&Entry>) {
        if self.blobs.is_shared() {
            return;
        }
        if let Some(id) = blob_of(old)
            && blob_of(new) != Some(id)
            && let Err(e) = self.blobs.remove(id).await
        {
            // Leaks space, loses nothing: the entry that named it is gone.
            tracing::warn!(blob = id, error = %e, "could not remove an unreferenced blob");
        }
    }

    async fn discard(&self, stored: &Stored) {
        if let Stored::Blob { id, .. } = stored {
            let _ = self.blobs.remove(id).await;
        }
    }
}

/// The tombstone of a file's upload that may be in flight as the file goes from its path
/// (deleted, or renamed to `moved_to`) before its object was put at the path's key.
fn pending_upload_tombstone(e: &Entry, now: i64, moved_to: Option<String>) -> tidemark_core::decide::Tombstone {
    let r = e.remote.as_ref();
    tidemark_core::decide::Tombstone {
        path: e.path.clone(),
        version: e.version,
        etag: r.map(|r| r.etag.clone()).unwrap_or_default(),
        remote_mtime_ms: r.map_or(0, |r| r.remote_mtime_ms),
        deleted_at_ms: now,
        pending_upload: true,
        pending_after: tidemark_core::decide::pending_after(e),
        moved_to,
    }
}

/// The write of a tombstone document.
fn tombstone_txn(t: &tidemark_core::decide::Tombstone, now: i64) -> Txn {
    let data = Bytes::from(serde_json::to_vec(t).unwrap_or_default());
    let entry = NewEntry::file(data.len() as u64, now, Content::Inline);
    Txn::put(tidemark_core::remote::system_paths::tombstone(&t.path), entry, tidemark_core::Origin::System)
        .with_data(data)
}

/// Why the content of `entry` cannot be read here.
fn missing_blob(p: &str, entry: &Entry, backend: &str, blobs: &Blobs) -> String {
    if blobs.is_shared() {
        format!("{p}: its content ({} bytes) is missing from the blob store {}", entry.size, blobs.describe())
    } else if backend == "sqlite" {
        format!("{p}: its content file ({} bytes) is missing from the data directory's blobs/", entry.size)
    } else {
        format!(
            "{p}: its content ({} bytes) was written through another filer and is kept in that filer's data \
             directory; read it through that filer (or here once the outbound sync has uploaded it)",
            entry.size
        )
    }
}

use crate::gc::blob_of;

/// The bytes of a `len`-byte content that `range` selects (a range past the end is refused).
pub(crate) fn slice_range(p: &str, len: usize, range: Option<ByteRange>) -> Result<std::ops::Range<usize>> {
    let Some(r) = range else { return Ok(0..len) };
    check_range(p, len as u64, r)?;
    let start = r.offset as usize;
    let end = r.length.map_or(len, |n| (start.saturating_add(n as usize)).min(len));
    Ok(start..end)
}

/// What an `apply` may put, whoever sends it: the size agrees with the content the entry will
/// have (a GET must not promise bytes that are not there) and the extended attributes are
/// bounded as a write's are.
fn check_put(p: &str, entry: &NewEntry, data: Option<&Bytes>) -> Result<()> {
    check_extended(p, &entry.extended)?;
    let bad = |why: String| Err(Error::invalid_argument(format!("{p}: {why}")));
    match (&entry.content, data) {
        (_, Some(_)) if entry.content != Content::Inline => bad("data goes with inline content only".into()),
        (Content::Empty, _) if entry.size != 0 => {
            bad(format!("size {} with no content; an empty entry is 0 bytes", entry.size))
        }
        (Content::Inline, Some(d)) if d.len() as u64 != entry.size => {
            bad(format!("size {} but {} bytes of inline data", entry.size, d.len()))
        }
        (Content::Inline, Some(d)) if d.len() > MAX_INLINE_BYTES => {
            bad(format!("{} bytes of inline data; at most {MAX_INLINE_BYTES} (write larger content)", d.len()))
        }
        (Content::Remote, _) if entry.remote.is_none() => bad("remote content needs the remote object it names".into()),
        _ => Ok(()),
    }
}

/// Blob content is created only by `write`. A transaction may keep an entry's existing blob (a
/// metadata update, at its size), but never point an entry at a blob another entry owns:
/// removing that one would then take the bytes from under this one.
fn check_kept_blob(txn: &Txn, id: &str, size: u64, current: Option<&Entry>) -> Result<()> {
    let Precondition::Version(v) = txn.precondition else {
        return Err(Error::invalid_argument(
            "a put that keeps blob content must be conditional on the entry's version",
        ));
    };
    match current {
        Some(e) if e.version != v => {
            Err(Error::PreconditionFailed { path: txn.path.clone(), current: Some(e.version) })
        }
        None => Err(Error::PreconditionFailed { path: txn.path.clone(), current: None }),
        Some(e) if blob_of(Some(e)) != Some(id) => {
            Err(Error::invalid_argument("blob content can only be written through a file write"))
        }
        Some(e) if e.size != size => Err(Error::invalid_argument(format!(
            "{}: a put that keeps blob content keeps its size ({} bytes)",
            txn.path, e.size
        ))),
        Some(_) => Ok(()),
    }
}

/// Extended attributes are bounded (they travel base64-encoded in a response header).
fn check_extended(p: &str, ext: &std::collections::BTreeMap<String, String>) -> Result<()> {
    let bytes: usize = ext.iter().map(|(k, v)| k.len() + v.len() + 6).sum();
    if bytes > crate::http::MAX_EXTENDED_BYTES {
        return Err(Error::invalid_argument(format!(
            "{p}: {bytes} bytes of extended attributes; at most {}",
            crate::http::MAX_EXTENDED_BYTES
        )));
    }
    Ok(())
}

/// A range may start at the end of the file (reading nothing, as a read at end of file does),
/// not past it.
fn check_range(p: &str, size: u64, r: ByteRange) -> Result<()> {
    if r.offset > size {
        return Err(Error::RangeNotSatisfiable { path: p.into(), offset: r.offset, size });
    }
    Ok(())
}

#[async_trait]
impl Filer for LocalFiler {
    async fn health(&self) -> Result<Health> {
        Ok(Health {
            status: "ok".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            store: self.store.backend().into(),
            last_seq: self.store.last_seq().await?,
            cluster_token_file: None,
            instance: None,
            socket: None,
        })
    }

    async fn stat(&self, p: &str) -> Result<Option<Entry>> {
        let mut e: Vec<Entry> = self.store.get(p).await?.into_iter().collect();
        self.resolve_links(e.iter_mut()).await?;
        Ok(e.pop())
    }

    async fn describe(&self, p: &str) -> Result<Option<Entry>> {
        match self.stat(p).await? {
            Some(e) => Ok(Some(self.with_headers(e).await)),
            None => Ok(None),
        }
    }

    async fn stat_many(&self, paths: &[String]) -> Result<Vec<Option<Entry>>> {
        let mut all = self.store.get_many(paths).await?;
        self.resolve_links(all.iter_mut().flatten()).await?;
        Ok(all)
    }

    async fn list(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page> {
        let mut page = self.store.list(dir, start_after, limit).await?;
        self.resolve_links(page.entries.iter_mut()).await?;
        Ok(page)
    }

    async fn scan(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page> {
        let mut page = self.store.scan(dir, start_after, limit).await?;
        self.resolve_links(page.entries.iter_mut()).await?;
        Ok(page)
    }

    async fn count(&self, dir: &str, except: Option<&str>) -> Result<u64> {
        self.store.count_below(dir, except).await
    }

    async fn read(&self, p: &str, range: Option<ByteRange>) -> Result<(Entry, ByteStream)> {
        // A concurrent overwrite may remove the blob between reading the entry and opening it;
        // read the entry again then. Once open, the bytes stay readable whatever happens.
        for _ in 0..WRITE_RETRIES {
            let entry = self.store.get(p).await?.ok_or_else(|| Error::not_found(p))?;
            if let Some(id) = entry.posix.inode {
                // A name of a hard-linked file: the bytes are its inode entry's.
                let (mut e, stream) = Box::pin(self.read(&inode_path(id), range)).await?;
                e.path = p.to_string();
                e.posix.inode = Some(id);
                return Ok((e, stream));
            }
            if entry.is_dir() {
                return Err(Error::IsADirectory { path: p.into() });
            }
            // The first read of an entry from a listing learns its object's headers.
            let entry = self.with_headers(entry).await;
            let stream = match &entry.content {
                Content::Empty => {
                    slice_range(p, 0, range)?;
                    futures::stream::empty().boxed()
                }
                Content::Inline => {
                    let Some(bytes) = self.store.read_inline(p).await? else { continue };
                    let r = slice_range(p, bytes.len(), range)?;
                    futures::stream::once(futures::future::ready(Ok(bytes.slice(r)))).boxed()
                }
                Content::Remote => {
                    if let Some(reason) = tidemark_core::model::object_attrs::unreadable(&entry.extended) {
                        return Err(Error::Unreadable { path: p.into(), reason: reason.to_string() });
                    }
                    if let Some(r) = range {
                        check_range(p, entry.size, r)?;
                    }
                    match self.cache.read(&entry, range).await {
                        Ok(s) => s,
                        // Named by the entry's path and, where known, its class.
                        Err(Error::Archived { storage_class, .. }) => {
                            return Err(Error::Archived {
                                path: p.into(),
                                storage_class: entry
                                    .extended
                                    .get(tidemark_core::model::object_attrs::STORAGE_CLASS)
                                    .cloned()
                                    .unwrap_or(storage_class),
                            });
                        }
                        Err(e) => return Err(e),
                    }
                }
                Content::Blob { id } => {
                    if let Some(r) = range {
                        check_range(p, entry.size, r)?;
                    }
                    match self.blobs.open_range(id, range).await {
                        Ok(s) => s,
                        Err(Error::NotFound { .. }) => {
                            // Overwritten meanwhile (read it again), or never here: with a shared
                            // store, another filer took the write and keeps the blob.
                            match self.store.get(p).await? {
                                Some(now) if now.version == entry.version => {
                                    return Err(Error::Unavailable {
                                        message: missing_blob(p, &entry, self.store.backend(), &self.blobs),
                                    });
                                }
                                _ => continue,
                            }
                        }
                        Err(e) => return Err(e),
                    }
                }
            };
            return Ok((entry, stream));
        }
        Err(Error::Unavailable { message: format!("{p}: content changed too often while being opened; retry") })
    }

    async fn write(&self, p: &str, body: ByteStream, opts: WriteOptions) -> Result<Entry> {
        path::validate(p)?;
        if p == path::ROOT {
            return Err(Error::IsADirectory { path: p.into() });
        }
        // Cheap refusals before consuming a possibly large body.
        if let Some(ext) = &opts.extended {
            check_extended(p, ext)?;
        }
        let before = self.store.get(p).await?;
        if before.as_ref().is_some_and(Entry::is_dir) {
            return Err(Error::IsADirectory { path: p.into() });
        }
        // (A name of a hard-linked file answers with its file's version: the store checks that.)
        if !opts.precondition.holds(before.as_ref().map(|e| e.version))
            && before.as_ref().is_none_or(|e| e.posix.inode.is_none())
        {
            return Err(Error::PreconditionFailed { path: p.into(), current: before.map(|e| e.version) });
        }
        if let Some(len) = opts.declared_len {
            self.blobs.room_for(p, len)?;
        }
        let body = match opts.sparse.clone() {
            Some(layout) => tidemark_core::sparse::expand(body, layout),
            None => body,
        };
        let StoredContent { stored, md5 } = self.blobs.store(body).await?;
        let stored_at = std::time::Instant::now();
        if matches!(stored, Stored::Blob { .. }) {
            tidemark_core::failpoint::hit("blob-stored-before-commit");
        }
        let (size, content, data) = match &stored {
            Stored::Inline(b) if b.is_empty() => (0, Content::Empty, None),
            Stored::Inline(b) => (b.len() as u64, Content::Inline, Some(b.clone())),
            Stored::Blob { id, size } => (*size, Content::Blob { id: id.clone() }, None),
        };
        let mut current = before;
        for _ in 0..WRITE_RETRIES {
            // Read-modify-write: a rewrite keeps what the namespace knows of the entry
            // (its remote object, its extended attributes) and is conditional on that state.
            // Over a symbolic link or a device node, the write makes a file (as `open(2)` with
            // O_CREAT does not: the mount resolves links before it writes).
            // Over a name of a hard-linked file, the write replaces that name (as a put of an
            // object replaces it); the mount writes the file all its names share at its inode entry.
            let mut entry = match &current {
                Some(e) if e.kind == EntryKind::File && e.posix.inode.is_none() => {
                    NewEntry { size, content: content.clone(), ..e.to_new() }
                }
                _ => {
                    let mut n = NewEntry::file(size, 0, content.clone());
                    n.posix.uid = opts.uid;
                    n.posix.gid = opts.gid;
                    n
                }
            };
            // A content change is a status change: the ctime follows the new mtime.
            entry.posix.ctime_ms = None;
            entry.mtime_ms = opts.mtime_ms.unwrap_or_else(|| self.clock.now_ms());
            // A local write to a remote-backed file must read as locally dirty (mtime past the
            // recorded remote mtime) whatever the clocks say, so no reconcile overwrites it.
            // The first such write after the entry was clean remembers that clean version: this
            // cluster's uploads of later versions are of pending writes, earlier ones are not.
            if let Some(r) = entry.remote.as_mut() {
                entry.mtime_ms = entry.mtime_ms.max(r.remote_mtime_ms + 1);
                if let Some(e) = current.as_ref().filter(|e| !tidemark_core::decide::is_locally_dirty(e)) {
                    r.dirty_after = Some(e.version);
                }
            }
            if let Some(mode) = opts.mode {
                entry.mode = mode;
            }
            match &opts.extended {
                Some(ext) => entry.extended = ext.clone(),
                // Kept attributes: not those that described the bytes this write replaces.
                None => tidemark_core::model::object_attrs::forget_bytes(&mut entry.extended),
            }
            entry.extended.insert(MD5_ATTR.into(), md5.clone());
            if entry.remote.is_none() {
                // A local-only file keeps when it was created (a new one: from before now), so
                // an earlier file's upload at its path is never taken for one of its own.
                let kept = current.as_ref().filter(|e| e.remote.is_none() && e.kind == EntryKind::File);
                match kept.and_then(|e| e.extended.get(CREATED_AFTER_ATTR)) {
                    Some(v) => entry.extended.insert(CREATED_AFTER_ATTR.into(), v.clone()),
                    None if kept.is_none() => {
                        entry.extended.insert(CREATED_AFTER_ATTR.into(), self.log_end().await?.to_string())
                    }
                    None => None,
                };
            }
            let precondition = match (&opts.precondition, &current) {
                (Precondition::Any, Some(e)) => Precondition::Version(e.version),
                (Precondition::Any, None) => Precondition::Absent,
                (p, _) => *p,
            };
            // The collector removes blobs nothing names once they are an hour old; a write must
            // name its blob well before that (a filer stopped between the two, say, gives up).
            if matches!(stored, Stored::Blob { .. }) && stored_at.elapsed() > crate::gc::MAX_UNNAMED {
                self.discard(&stored).await;
                return Err(Error::Unavailable {
                    message: format!(
                        "{p}: the write was held up too long between storing its bytes and committing; retry"
                    ),
                });
            }
            let txn = Txn {
                path: p.into(),
                precondition,
                fence: None,
                mutation: Mutation::Put { entry, data: data.clone() },
                origin: opts.origin,
                dir_times: opts.dir_times,
            };
            match self.commit(txn).await {
                Ok(applied) => return applied.new.ok_or_else(|| Error::internal("a put returned no entry")),
                Err(Error::PreconditionFailed { .. }) if opts.precondition == Precondition::Any => {
                    current = self.store.get(p).await?;
                    if current.as_ref().is_some_and(Entry::is_dir) {
                        self.discard(&stored).await;
                        return Err(Error::IsADirectory { path: p.into() });
                    }
                }
                Err(e) => {
                    self.discard(&stored).await;
                    return Err(e);
                }
            }
        }
        self.discard(&stored).await;
        Err(Error::Unavailable {
            message: format!("{p}: changed concurrently {WRITE_RETRIES} times during the write; retry"),
        })
    }

    async fn delete(&self, p: &str, opts: DeleteOptions) -> Result<Applied> {
        self.tombstone_before_delete(p, opts.recursive).await?;
        let mut txn = Txn::delete(p, opts.recursive, tidemark_core::Origin::Local).with_precondition(opts.precondition);
        txn.dir_times = opts.dir_times;
        self.commit(txn).await
    }

    async fn apply(&self, mut txn: Txn) -> Result<Applied> {
        // A name of a hard-linked file answers as the file: what a writer read of it and writes
        // back (an update of its attributes) goes to the file.
        let mut name = None;
        if let Mutation::Put { entry, .. } = &mut txn.mutation
            && let Some(id) = entry.posix.inode.take()
        {
            name = Some((std::mem::replace(&mut txn.path, inode_path(id)), id));
        }
        self.check_txn(&txn).await?;
        let mut applied = self.commit(txn).await?;
        if let Some((p, id)) = name {
            for e in applied.old.iter_mut().chain(applied.new.iter_mut()) {
                e.path = p.clone();
                e.posix.inode = Some(id);
            }
        }
        Ok(applied)
    }

    async fn apply_many(&self, batch: TxnBatch) -> Result<Vec<Result<Applied>>> {
        batch.validate()?;
        let TxnBatch { fence, txns } = batch;
        // The filer's own checks fail a transaction alone; the rest go to the store together.
        let mut checked = Vec::with_capacity(txns.len());
        let mut send = Vec::with_capacity(txns.len());
        for txn in txns {
            match self.check_txn(&txn).await {
                Ok(()) => {
                    checked.push(None);
                    send.push(txn);
                }
                Err(e) => checked.push(Some(e)),
            }
        }
        let mut results = self.store.apply_many(TxnBatch { fence, txns: send }).await?.into_iter();
        let out: Vec<Result<Applied>> = checked
            .into_iter()
            .map(|failed| match failed {
                Some(e) => Err(e),
                None => results
                    .next()
                    .unwrap_or_else(|| Err(Error::internal("the store answered fewer results than transactions"))),
            })
            .collect();
        let applied: Vec<&Applied> = out.iter().filter_map(|r| r.as_ref().ok()).collect();
        self.after_commit(&applied).await;
        Ok(out)
    }

    async fn lease_acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Lease> {
        self.store.lease_acquire(name, holder, ttl.as_millis() as i64).await
    }

    async fn lease_renew(&self, fence: &Fence, ttl: Duration) -> Result<Lease> {
        self.store.lease_renew(fence, ttl.as_millis() as i64).await
    }

    async fn lease_release(&self, fence: &Fence) -> Result<()> {
        self.store.lease_release(fence).await
    }

    async fn lease_get(&self, name: &str) -> Result<Option<Lease>> {
        self.store.lease_get(name).await
    }

    async fn cache_status(&self, paths: &[String]) -> Result<Vec<CacheStatus>> {
        let mut out = Vec::with_capacity(paths.len());
        for chunk in paths.chunks(MAX_BATCH) {
            let entries = self.store.get_many(chunk).await?;
            for (p, entry) in chunk.iter().zip(entries) {
                out.push(self.cache.status(p, entry.as_ref()).await?);
            }
        }
        Ok(out)
    }

    async fn cache_fetch(&self, p: &str, wait: bool) -> Result<CacheOutcome> {
        let entry = self.store.get(p).await?.ok_or_else(|| Error::not_found(p))?;
        self.cache.fetch(&entry, wait).await
    }

    async fn cache_drop(&self, p: &str) -> Result<CacheOutcome> {
        path::validate(p)?;
        let entry = self.store.get(p).await?;
        self.cache.drop_path(p, entry.as_ref()).await
    }

    async fn cache_stats(&self) -> Result<CacheStats> {
        Ok(self.cache.stats())
    }

    async fn local_file(&self, p: &str) -> Result<Option<tidemark_core::filer::LocalFile>> {
        let Some(e) = self.stat(p).await? else { return Ok(None) };
        match (&e.content, &self.blobs) {
            (Content::Blob { id }, Blobs::Dir(d)) => {
                let file = d.file_of(id)?;
                let identity = std::fs::metadata(&file).ok().map(|m| tidemark_core::filer::FileIdentity::of(&m));
                Ok(Some(tidemark_core::filer::LocalFile {
                    file: file.to_string_lossy().into_owned(),
                    version: e.version,
                    size: e.size,
                    identity,
                }))
            }
            (Content::Remote, _) => self.cache.local_file(&e).await,
            _ => Ok(None),
        }
    }

    async fn changes(&self, after: u64, limit: usize, wait: Duration) -> Result<Vec<ChangeRecord>> {
        let limit = limit.clamp(1, MAX_CHANGES_PER_CALL);
        let deadline = tokio::time::Instant::now() + wait.min(MAX_CHANGES_WAIT);
        // Subscribe before reading, so a commit between the read and the wait is not missed.
        let mut rx = self.store.subscribe();
        loop {
            let records = self.store.changes(after, limit).await?;
            if !records.is_empty() {
                return Ok(records);
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                // Timed out, or the store is gone: nothing new.
                Ok(Err(_)) | Err(_) => return Ok(records),
            }
        }
    }
}

//! The blob collector: blobs no entry names are removed, and only those.
//!
//! A blob's id is new with every content write and is named by at most one entry for its whole
//! life (a write that keeps an entry's blob must be to that entry's path; a rename moves the entry
//! with its blob, and the record removing the old path says where it went), so once a committed
//! change shows an entry letting go of a blob — overwritten, deleted, replaced by other content,
//! but not moved — nothing can name that blob again. Two ways garbage arises, two ways it goes:
//!
//! - **Unlinked by a commit.** The collector follows the change log (one filer of the cluster
//!   at a time, under the lease `filer/blob-collector`, from the cursor
//!   `/etc/tidemark/blobs/collector.json` written with that lease's fence) and removes the blob
//!   a record's old entry named and its new one does not, once the record is [`GRACE`] old —
//!   so a reader on any filer that read the old entry just before still finds its bytes. A crash
//!   between a removal and the cursor's write repeats the removal: harmless.
//! - **Never named.** A write stores its bytes before the entry that names them commits; a
//!   crash (or a failed precondition that gives up) in between leaves a blob nothing names and
//!   no record mentions. The sweep ([`sweep`]; every six hours on the collector's filer, and
//!   `tidemark blobs gc`) lists every entry and every blob, and removes blobs that no entry names
//!   and that are older than [`UNNAMED_AGE`]. A write gives up rather than commit a blob stored
//!   more than [`MAX_UNNAMED`] ago, so a blob that old and unnamed can never be named later.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use tidemark_core::model::{Content, Entry, Fence, NewEntry, Origin, Txn};
use tidemark_core::{Error, Filer, MetaStore, Result};

use crate::blobs::Blobs;
use crate::local::LocalFiler;
use crate::remotes::read_doc;

pub const LEASE: &str = "filer/blob-collector";
pub const CURSOR: &str = "/etc/tidemark/blobs/collector.json";
/// How long a blob an entry let go of stays readable.
pub const GRACE: Duration = Duration::from_secs(60);
/// How old a blob nothing names must be before the sweep removes it.
pub const UNNAMED_AGE: Duration = Duration::from_secs(3600);
/// The longest a write may take between storing its bytes and committing the entry.
pub const MAX_UNNAMED: Duration = Duration::from_secs(600);
/// How often the collector's filer sweeps.
const SWEEP_EVERY: Duration = Duration::from_secs(6 * 3600);
/// Records passed over without a removal before the cursor is written anyway.
const CURSOR_LAG: u64 = 10_000;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Cursor {
    seq: u64,
    #[serde(default)]
    last_sweep_ms: Option<i64>,
}

/// What a sweep did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SweepReport {
    pub entries_scanned: u64,
    pub blobs_listed: u64,
    pub named: u64,
    pub removed: u64,
    /// Unnamed, but too young to be sure no write is about to name them.
    pub kept_young: u64,
}

impl std::fmt::Display for SweepReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} entries scanned, {} blobs listed: {} named, {} removed, {} unnamed but younger than the minimum age (kept)",
            self.entries_scanned, self.blobs_listed, self.named, self.removed, self.kept_young
        )
    }
}

/// The blob an entry names, if any.
pub fn blob_of(e: Option<&Entry>) -> Option<&str> {
    match e.map(|e| &e.content) {
        Some(Content::Blob { id }) => Some(id),
        _ => None,
    }
}

/// Removes the blobs no entry names and that are older than `min_age` (by the blob store's
/// clock against this one's: keep `min_age` well above any skew).
pub async fn sweep(store: &dyn MetaStore, blobs: &Blobs, now_ms: i64, min_age: Duration) -> Result<SweepReport> {
    let mut report = SweepReport::default();
    // Every blob named now. A write that names a blob after this scan passed its path stored it
    // less than MAX_UNNAMED before: younger than `min_age`, so it is not a candidate.
    let mut named: HashSet<String> = HashSet::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.scan("/", after.as_deref(), 1000).await?;
        report.entries_scanned += page.entries.len() as u64;
        named.extend(page.entries.iter().filter_map(|e| blob_of(Some(e)).map(str::to_string)));
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let cutoff = now_ms - min_age.as_millis() as i64;
    let mut page: Option<String> = None;
    loop {
        let (ids, next) = blobs.list(page.as_deref()).await?;
        report.blobs_listed += ids.len() as u64;
        for (id, modified_ms) in ids {
            if named.contains(&id) {
                report.named += 1;
            } else if modified_ms < cutoff {
                blobs.remove(&id).await?;
                report.removed += 1;
            } else {
                report.kept_young += 1;
            }
        }
        match next {
            Some(n) => page = Some(n),
            None => return Ok(report),
        }
    }
}

pub struct BlobCollector {
    filer: Arc<LocalFiler>,
    holder: String,
    grace: Duration,
    /// How long a step waits for new records.
    poll: Duration,
    lease_ttl: Duration,
    cursor: std::sync::Mutex<(Cursor, u64)>,
}

impl BlobCollector {
    pub fn new(filer: Arc<LocalFiler>, holder: impl Into<String>) -> Self {
        BlobCollector {
            filer,
            holder: holder.into(),
            grace: GRACE,
            poll: Duration::from_secs(10),
            lease_ttl: crate::leader::LEASE_TTL,
            cursor: Default::default(),
        }
    }

    /// How long its lease lasts (another filer takes over this long after this one died).
    pub fn with_lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// Waits at most `poll` for new records in a step (tests: zero).
    pub fn with_poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// With another grace period (tests).
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Runs until `stop` resolves, on whichever filer holds the lease.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        let (store, holder) = (self.filer.store().clone(), self.holder.clone());
        crate::leader::lead(store, holder, &self, self.lease_ttl, stop).await
    }

    async fn write_cursor(&self, fence: &Fence, c: &Cursor) -> Result<()> {
        let data = Bytes::from(serde_json::to_vec(c).map_err(Error::internal)?);
        let entry = NewEntry::file(data.len() as u64, self.filer.clock().now_ms(), Content::Inline);
        let txn = Txn::put(CURSOR, entry, Origin::System).with_fence(fence.clone()).with_data(data);
        self.filer.store().apply(txn).await.map(|_| ())
    }
}

#[async_trait::async_trait]
impl crate::leader::LeaderTask for BlobCollector {
    fn name(&self) -> &'static str {
        "blob collector"
    }
    fn lease(&self) -> &'static str {
        LEASE
    }
    async fn resume(&self) -> Result<()> {
        let c = read_doc::<Cursor>(self.filer.store().as_ref(), CURSOR).await?.map(|(c, _)| c).unwrap_or_default();
        let seq = c.seq;
        *self.cursor.lock().unwrap_or_else(|p| p.into_inner()) = (c, seq);
        Ok(())
    }

    async fn step(&self, fence: &Fence) -> Result<()> {
        let (mut cursor, mut pos) = self.cursor.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let clock = self.filer.clock().clone();
        let records = self.filer.changes(pos, 500, self.poll).await?;
        let blobs = self.filer.blobs();
        let mut removed = false;
        for r in &records {
            let young_for = r.ts_ms + self.grace.as_millis() as i64 - clock.now_ms();
            if young_for > 0 {
                // Not yet: come back when it is old enough (or after a poll's wait, to notice a stop).
                tokio::time::sleep(Duration::from_millis(young_for as u64).min(self.poll)).await;
                break;
            }
            if let Some(id) = blob_of(r.old.as_ref())
                && blob_of(r.new.as_ref()) != Some(id)
                && r.moved_to.is_none()
            {
                blobs.remove(id).await?;
                removed = true;
                tidemark_core::failpoint::hit("blob-removed-before-cursor");
            }
            pos = r.seq;
        }
        if removed || pos - cursor.seq >= CURSOR_LAG {
            cursor.seq = pos;
            self.write_cursor(fence, &cursor).await?;
        }
        let now = clock.now_ms();
        if cursor.last_sweep_ms.is_none_or(|t| now - t >= SWEEP_EVERY.as_millis() as i64) {
            let report = sweep(self.filer.store().as_ref(), blobs, now, UNNAMED_AGE).await?;
            if report.removed > 0 {
                tracing::info!(%report, "blob collector: swept");
            }
            cursor.last_sweep_ms = Some(now);
            cursor.seq = pos;
            self.write_cursor(fence, &cursor).await?;
        }
        *self.cursor.lock().unwrap_or_else(|p| p.into_inner()) = (cursor, pos);
        Ok(())
    }
}

/// `/etc/tidemark/blobs/home.json`: where the cluster keeps file content that is neither inline
/// nor a remote object's. Recorded by the first filer; every filer after it must agree, so a
/// cluster is never silently half in one place and half in another.
pub const HOME: &str = "/etc/tidemark/blobs/home.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ContentHome {
    /// The data directory of one filer (the node id of its data directory).
    DataDir { node: String },
    /// A shared object store (`s3://bucket/prefix/`).
    BlobStore { location: String },
}

impl ContentHome {
    pub fn of(filer: &LocalFiler) -> ContentHome {
        match filer.blobs() {
            Blobs::Dir(_) => ContentHome::DataDir { node: filer.cache().node().to_string() },
            Blobs::S3(s) => ContentHome::BlobStore { location: s.url().location() },
        }
    }
}

/// The lease a filer that keeps content in its data directory holds while it runs: a second
/// such filer on the same store finds it held and refuses (its files and the first one's would
/// each be readable through one filer only).
pub const DATA_DIR_LEASE: &str = "filer/data-dir-home";

/// What `claim_home` leaves to keep up: the data-directory lease, renewed until the filer
/// stops (`None` for a blob store, which every filer shares).
pub type HomeLease = Option<tidemark_core::model::Lease>;

/// Records this filer's content home if none is, or checks that it is the recorded one: a
/// filer whose files the others could not read refuses to start, naming the flag to pass. A
/// filer that keeps its content in its data directory must be the only filer running on the
/// store (it holds [`DATA_DIR_LEASE`]); it takes the home over from a data directory whose
/// filer is gone (its files were readable through it alone, and are not now either).
pub async fn claim_home(filer: &LocalFiler, ttl: Duration) -> Result<HomeLease> {
    let mine = ContentHome::of(filer);
    let lease = match &mine {
        ContentHome::DataDir { node } => {
            match filer.store().lease_acquire(DATA_DIR_LEASE, node, ttl.as_millis() as i64).await {
                Ok(l) => Some(l),
                Err(Error::LeaseHeld { holder, .. }) => {
                    return Err(Error::invalid_argument(format!(
                        "another filer (node {holder}) runs on this store and keeps its files in its data                          directory, which this one cannot read: a cluster of several filers keeps them on a shared                          object store — start every filer with --blob-store s3://BUCKET/PREFIX, after moving what                          that filer holds there with `tidemark blobs migrate --data-dir ITS_DIR --store ... --blob-store ...`"
                    )));
                }
                Err(e) => return Err(e),
            }
        }
        ContentHome::BlobStore { .. } => None,
    };
    for _ in 0..3 {
        let recorded = read_doc::<ContentHome>(filer.store().as_ref(), HOME).await?;
        let (recorded, version) = match recorded {
            Some((h, v)) => (Some(h), Some(v)),
            None => (None, None),
        };
        let take_over = match (&recorded, &mine) {
            (None, _) => true,
            (Some(a), b) if a == b => return Ok(lease),
            (Some(ContentHome::DataDir { node }), ContentHome::DataDir { .. }) => {
                tracing::warn!(previous = %node, "this filer takes over the cluster's content home from a data directory whose filer is gone: files written through it are not readable here");
                true
            }
            (Some(ContentHome::DataDir { .. }), ContentHome::BlobStore { location }) => {
                return Err(Error::invalid_argument(format!(
                    "this cluster keeps its files in a filer's data directory, not in {location}: move them there first                      with `tidemark blobs migrate --data-dir DIR --store ... --blob-store ...` (then start with --blob-store)"
                )));
            }
            (Some(ContentHome::BlobStore { location }), ContentHome::DataDir { .. }) => {
                return Err(Error::invalid_argument(format!(
                    "this cluster keeps its files in the blob store {location}: start this filer with \
                     --blob-store {location}?endpoint=... (or TIDEMARK_BLOB_STORE) so it can read and write them"
                )));
            }
            (Some(ContentHome::BlobStore { location }), ContentHome::BlobStore { location: other }) => {
                return Err(Error::invalid_argument(format!(
                    "this cluster keeps its files in the blob store {location}, not {other}: give every filer the same --blob-store"
                )));
            }
        };
        debug_assert!(take_over);
        let data = Bytes::from(serde_json::to_vec(&mine).map_err(Error::internal)?);
        let entry = NewEntry::file(data.len() as u64, filer.clock().now_ms(), Content::Inline);
        let precondition =
            version.map_or(tidemark_core::model::Precondition::Absent, tidemark_core::model::Precondition::Version);
        let txn = Txn::put(HOME, entry, Origin::System).with_precondition(precondition).with_data(data);
        match filer.store().apply(txn).await {
            Ok(_) => return Ok(lease),
            Err(Error::PreconditionFailed { .. }) => continue, // another filer recorded first
            Err(e) => return Err(e),
        }
    }
    Err(Error::Unavailable { message: "the cluster's content home keeps changing; retry".into() })
}

/// Keeps the data-directory lease of `claim_home` until `stop`, then releases it. `Err` if it
/// was lost (this filer was paused past it and another took the home over): the caller stops.
pub async fn keep_home(
    store: Arc<dyn MetaStore>,
    lease: HomeLease,
    ttl: Duration,
    stop: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let Some(lease) = lease else {
        stop.await;
        return Ok(());
    };
    tokio::pin!(stop);
    let fence = lease.fence();
    loop {
        tokio::select! {
            _ = &mut stop => {
                let _ = store.lease_release(&fence).await;
                return Ok(());
            }
            _ = tokio::time::sleep(ttl / 3) => match store.lease_renew(&fence, ttl.as_millis() as i64).await {
                Ok(_) => {}
                Err(e @ Error::Fenced { .. }) => return Err(e),
                Err(e) => tracing::warn!(error = %e, "cannot renew the data directory's lease; retrying"),
            },
        }
    }
}

/// What `tidemark blobs migrate` did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MigrateReport {
    pub copied: u64,
    pub already_there: u64,
    pub bytes: u64,
}

/// Copies every blob of a data directory into the blob store (each under its own id, so the
/// entries that name them need no change), checks that every blob an entry names is there, and
/// then records the blob store as the cluster's content home. Safe to run again after a failure.
pub async fn migrate(
    store: &dyn MetaStore,
    from: &crate::blobs::BlobDir,
    to: &crate::blobs::S3Blobs,
    clock: &dyn tidemark_core::Clock,
    progress: &mut (dyn FnMut(&MigrateReport) + Send),
) -> Result<MigrateReport> {
    let mut report = MigrateReport::default();
    let mut page: Option<String> = None;
    loop {
        let (ids, next) = from.list(page.as_deref()).await?;
        for (id, _) in ids {
            let path = from.file_of(&id)?;
            let len = tokio::fs::metadata(&path)
                .await
                .map_err(|e| Error::io(format!("reading {}", path.display()), e))?
                .len();
            if to.size_of(&id).await? == Some(len) {
                report.already_there += 1;
            } else {
                let body = aws_sdk_s3::primitives::ByteStream::from_path(&path)
                    .await
                    .map_err(|e| Error::internal(format!("reading {}: {e}", path.display())))?;
                to.put_as(&id, body).await?;
                report.copied += 1;
                report.bytes += len;
            }
            progress(&report);
        }
        match next {
            Some(n) => page = Some(n),
            None => break,
        }
    }
    // Every blob an entry names must be there before the cluster may rely on the store.
    let mut after: Option<String> = None;
    loop {
        let p = store.scan("/", after.as_deref(), 1000).await?;
        for e in &p.entries {
            if let Some(id) = blob_of(Some(e))
                && to.size_of(id).await? != Some(e.size)
            {
                return Err(Error::Unavailable {
                    message: format!(
                        "{}: its content (blob {id}, {} bytes) is not in this data directory nor in the blob store; \
                         the home is left as it was",
                        e.path, e.size
                    ),
                });
            }
        }
        match p.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let home = ContentHome::BlobStore { location: to.url().location() };
    let data = Bytes::from(serde_json::to_vec(&home).map_err(Error::internal)?);
    let entry = NewEntry::file(data.len() as u64, clock.now_ms(), Content::Inline);
    store.apply(Txn::put(HOME, entry, Origin::System).with_data(data)).await?;
    Ok(report)
}

//! The `MetaStore` trait: the filer's durable state. Backends (SQLite now, PostgreSQL later)
//! implement it and must pass the shared conformance suite in `tidemark-store`.
//!
//! Contract, for every backend:
//! - Paths are canonical ([`crate::path::validate`]); listings and scans return entries in byte
//!   order of the path, so they merge-join with an object-store LIST (byte order of the key).
//! - [`MetaStore::apply`] is atomic: the fence, the precondition, the write, the version bump and
//!   the change-log records all commit together or not at all. A failed check writes nothing.
//! - Versions are change-log sequence numbers: strictly increasing across the whole store,
//!   never reused.
//! - Leases expire by the store's clock (the filer's, or the database's for a shared store).
//! - Cache records ([`CachedChunk`]) say which chunks of which remote version a filer holds.
//!   A transaction that changes an entry's content id ([`crate::cache::content_id`]) or deletes
//!   it removes that entry's records, every node's, in the same transaction; a record is added
//!   only while the entry still has the record's content id. Cache records are not entries: they
//!   have no version and no change-log records.

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::watch;

use crate::cache::{CacheUsage, CachedChunk};
use crate::error::Result;
use crate::model::{Applied, ChangeRecord, Entry, Fence, Lease, Page, Txn, TxnBatch};

#[async_trait]
pub trait MetaStore: Send + Sync + 'static {
    /// A short name for logs and `health` (`sqlite`, `postgres`).
    fn backend(&self) -> &'static str;

    async fn get(&self, path: &str) -> Result<Option<Entry>>;

    /// The entries at `paths`, in the same order (`None`: absent), read at one point in time;
    /// at most [`crate::model::MAX_BATCH`] paths.
    async fn get_many(&self, paths: &[String]) -> Result<Vec<Option<Entry>>>;

    /// The children of directory `dir` whose path is greater than `start_after`, at most `limit`.
    /// `NotFound` if `dir` does not exist, `NotADirectory` if it is a file.
    async fn list(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page>;

    /// Every entry strictly below `dir` (recursively) whose path is greater than `start_after`,
    /// at most `limit`. A missing `dir` yields an empty page: a scan is a range read.
    async fn scan(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page>;

    /// How many entries lie strictly below `dir` (for progress estimates), leaving out `except`
    /// and everything below it.
    async fn count_below(&self, dir: &str, except: Option<&str>) -> Result<u64>;

    /// The bytes of an entry whose content is `Inline`; `None` if absent or not inline.
    async fn read_inline(&self, path: &str) -> Result<Option<Bytes>>;

    /// The one transaction primitive; see the module docs.
    async fn apply(&self, txn: Txn) -> Result<Applied>;

    /// Many transactions in one database transaction (see [`TxnBatch`]): one result per
    /// transaction, in order. `Err` for the whole call (nothing of the batch landed) when the
    /// batch's fence does not hold, the batch is malformed, or the store failed.
    async fn apply_many(&self, batch: TxnBatch) -> Result<Vec<Result<Applied>>>;

    /// Takes the lease if it is free, expired, or already held by `holder`; every successful
    /// acquisition increments the generation. `LeaseHeld` if another holder has it unexpired.
    async fn lease_acquire(&self, name: &str, holder: &str, ttl_ms: i64) -> Result<Lease>;

    /// Extends an unexpired lease held with exactly this fence; `Fenced` otherwise.
    async fn lease_renew(&self, fence: &Fence, ttl_ms: i64) -> Result<Lease>;

    /// Gives the lease up (it becomes free; the generation is kept). Releasing a lease that is
    /// no longer held with this fence is `Fenced`.
    async fn lease_release(&self, fence: &Fence) -> Result<()>;

    async fn lease_get(&self, name: &str) -> Result<Option<Lease>>;

    /// Change-log records with `seq > after`, in order, at most `limit`.
    async fn changes(&self, after: u64, limit: usize) -> Result<Vec<ChangeRecord>>;

    /// The sequence number of the newest change-log record (0 when empty).
    async fn last_seq(&self) -> Result<u64>;

    /// The cache records `node` holds for `path`, in chunk order (any content id).
    async fn cache_chunks(&self, node: &str, path: &str) -> Result<Vec<CachedChunk>>;

    /// Records a cached chunk, atomically with a check that the entry at its path still has its
    /// content id; `false` (and nothing written) when it does not. Re-recording a chunk replaces
    /// the record.
    async fn cache_record(&self, chunk: CachedChunk) -> Result<bool>;

    /// Removes these records (matched on node, path, chunk and content id; missing ones are
    /// skipped); returns the ones that were removed.
    async fn cache_forget(&self, chunks: &[CachedChunk]) -> Result<Vec<CachedChunk>>;

    /// Sets the last-read time of records of `node` (path, chunk, ms); missing ones are skipped.
    async fn cache_touch(&self, node: &str, reads: &[(String, u64, i64)]) -> Result<()>;

    /// How much `node` holds.
    async fn cache_usage(&self, node: &str) -> Result<CacheUsage>;

    /// Up to `limit` records of `node`, least recently read first.
    async fn cache_lru(&self, node: &str, limit: usize) -> Result<Vec<CachedChunk>>;

    /// Records of `node` after `(path, chunk)` in that order, at most `limit` (a paged walk).
    async fn cache_scan(&self, node: &str, after: Option<(&str, u64)>, limit: usize) -> Result<Vec<CachedChunk>>;

    /// Notified with the newest sequence number after every commit made through this handle,
    /// so followers of the change log can wait instead of polling.
    fn subscribe(&self) -> watch::Receiver<u64>;
}

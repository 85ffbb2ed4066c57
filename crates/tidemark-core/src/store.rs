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

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::watch;

use crate::error::Result;
use crate::model::{Applied, ChangeRecord, Entry, Fence, Lease, Page, Txn};

#[async_trait]
pub trait MetaStore: Send + Sync + 'static {
    /// A short name for logs and `health` (`sqlite`, `postgres`).
    fn backend(&self) -> &'static str;

    async fn get(&self, path: &str) -> Result<Option<Entry>>;

    /// The children of directory `dir` whose path is greater than `start_after`, at most `limit`.
    /// `NotFound` if `dir` does not exist, `NotADirectory` if it is a file.
    async fn list(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page>;

    /// Every entry strictly below `dir` (recursively) whose path is greater than `start_after`,
    /// at most `limit`. A missing `dir` yields an empty page: a scan is a range read.
    async fn scan(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page>;

    /// How many entries lie strictly below `dir` (for progress estimates).
    async fn count_below(&self, dir: &str) -> Result<u64>;

    /// The bytes of an entry whose content is `Inline`; `None` if absent or not inline.
    async fn read_inline(&self, path: &str) -> Result<Option<Bytes>>;

    /// The one transaction primitive; see the module docs.
    async fn apply(&self, txn: Txn) -> Result<Applied>;

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

    /// Notified with the newest sequence number after every commit made through this handle,
    /// so followers of the change log can wait instead of polling.
    fn subscribe(&self) -> watch::Receiver<u64>;
}

//! The filer's outbound `remote.sync` loop: follows the change log and hands each local change
//! under a mount with sync enabled to `tidemark_engine::outbound::sync_record`.
//!
//! One filer of a cluster runs it at a time: the one holding the `filer/outbound-sync` lease
//! (with several filers on one shared store, the others wait to take over). Its position is the
//! system document `/etc/tidemark/outbound/cursor.json`, written after each batch that had
//! something to sync (or every 10,000 records passed over), with the
//! lease's fence, so a restart, or another filer taking over, resumes where it stopped, and a
//! filer that lost the lease cannot move it. Handling a record again is harmless (it looks at
//! current state).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tidemark_core::model::{Content, Fence, NewEntry, Origin, Txn};
use tidemark_core::remote::{MountMapping, RemoteConf, system_paths};
use tidemark_core::{Error, Filer, Result};
use tidemark_engine::outbound::{OutboundOutcome, sync_record};

use crate::local::LocalFiler;
use crate::remotes::read_doc;

/// Records passed over (none under a synced mount) before the cursor is written anyway, so a
/// restart does not re-read a long stretch of the log; below it nothing is written for them (a
/// namespace without synced mounts gets no cursor document).
const CURSOR_LAG: u64 = 10_000;

#[derive(serde::Serialize, serde::Deserialize)]
struct Cursor {
    seq: u64,
}

pub struct OutboundSync {
    filer: Arc<LocalFiler>,
    holder: String,
    /// Where the log has been read to, and the cursor last written.
    pos: std::sync::Mutex<(u64, u64)>,
    lease_ttl: Duration,
}

impl OutboundSync {
    /// `holder` names this filer in the lease (unique among the filers of the cluster).
    pub fn new(filer: Arc<LocalFiler>, holder: impl Into<String>) -> Self {
        OutboundSync {
            filer,
            holder: holder.into(),
            pos: std::sync::Mutex::new((0, 0)),
            lease_ttl: crate::leader::LEASE_TTL,
        }
    }

    /// How long its lease lasts (another filer takes over this long after this one died).
    pub fn with_lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// Where the loop will resume.
    pub async fn cursor(&self) -> Result<u64> {
        Ok(read_doc::<Cursor>(self.filer.store().as_ref(), system_paths::OUTBOUND_CURSOR)
            .await?
            .map_or(0, |(c, _)| c.seq))
    }

    /// Runs until `stop` resolves, on whichever filer holds the lease (`leader::lead`).
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        let (store, holder) = (self.filer.store().clone(), self.holder.clone());
        crate::leader::lead(store, holder, &self, self.lease_ttl, stop).await
    }

    async fn write_cursor(&self, fence: &Fence, seq: u64) -> Result<()> {
        let data = Bytes::from(serde_json::to_vec(&Cursor { seq }).map_err(Error::internal)?);
        let entry = NewEntry::file(data.len() as u64, self.filer.clock().now_ms(), Content::Inline);
        let txn =
            Txn::put(system_paths::OUTBOUND_CURSOR, entry, Origin::System).with_fence(fence.clone()).with_data(data);
        self.filer.store().apply(txn).await.map(|_| ())
    }

    /// Handles the next batch of change-log records after `pos` (waiting up to `wait` for one)
    /// and moves `pos` past it; `written` is the cursor last stored. Stops at a record that fails
    /// transiently, keeping the cursor before it, so it is retried.
    async fn sync_batch(
        &self,
        fence: &Fence,
        pos: &mut u64,
        written: &mut u64,
        wait: Duration,
    ) -> Result<Vec<OutboundOutcome>> {
        let after = *pos;
        let records = self.filer.changes(after, 500, wait).await?;
        let Some(last) = records.last().map(|r| r.seq) else { return Ok(Vec::new()) };
        let store = self.filer.store().as_ref();
        let (mapping, _) = read_doc::<MountMapping>(store, system_paths::MOUNT_MAPPING).await?.unwrap_or_default();
        let mut outcomes = Vec::new();
        let mut cluster: Option<String> = None;
        let mut synced_any = false;
        for r in &records {
            let Some(mount) = mapping.find_for(&r.path).filter(|m| m.sync) else { continue };
            synced_any = true;
            let id = match &cluster {
                Some(id) => id.clone(),
                None => {
                    let id = self.filer.cluster_id().await?;
                    cluster = Some(id.clone());
                    id
                }
            };
            let conf_path = system_paths::remote_conf(&mount.location.storage);
            let Some((conf, conf_version)) = read_doc::<RemoteConf>(store, &conf_path).await? else {
                tracing::warn!(mount = %mount.dir, "outbound sync: the mount's remote is not configured; skipping");
                continue;
            };
            let storage = match self.filer.remotes().storage(&conf, conf_version, &mount.location.bucket).await {
                Ok(s) => s,
                // Opening is local (no remote call): a refusal is this process's configuration (a
                // local root not allowed with --local-root), not a passing failure, and retrying it
                // would hold up every other mount's sync. The entry stays local, as a key the
                // bucket cannot hold does.
                Err(e @ Error::Unauthorized { .. }) => {
                    tracing::error!(path = %r.path, mount = %mount.dir, error = %e, "outbound sync: the mount's remote is refused; the entry stays local");
                    continue;
                }
                Err(e) => return Err(e),
            };
            match sync_record(&*self.filer, &*storage, mount, &id, self.filer.clock().as_ref(), r).await {
                Ok(o) => {
                    if o != OutboundOutcome::Nothing {
                        tracing::info!(outcome = ?o, "outbound sync");
                    }
                    outcomes.push(o);
                }
                // A key the bucket cannot hold will never upload; say so and go on.
                Err(e @ (Error::InvalidArgument { .. } | Error::InvalidPath { .. })) => {
                    tracing::error!(path = %r.path, error = %e, "outbound sync: cannot upload; the entry stays local");
                }
                Err(e) => {
                    if r.seq - 1 > after {
                        self.write_cursor(fence, r.seq - 1).await?;
                        (*pos, *written) = (r.seq - 1, r.seq - 1);
                    }
                    return Err(e);
                }
            }
        }
        // Records of nothing to sync (the cursor's own among them: writing the cursor for those
        // would make another record, forever) move the cursor in memory only, up to CURSOR_LAG.
        if synced_any || last - *written >= CURSOR_LAG {
            self.write_cursor(fence, last).await?;
            *written = last;
        }
        *pos = last;
        Ok(outcomes)
    }
}

#[async_trait::async_trait]
impl crate::leader::LeaderTask for OutboundSync {
    fn name(&self) -> &'static str {
        "outbound sync"
    }
    fn lease(&self) -> &'static str {
        system_paths::OUTBOUND_LEASE
    }
    async fn resume(&self) -> Result<()> {
        let at = self.cursor().await?;
        *self.pos.lock().unwrap_or_else(|p| p.into_inner()) = (at, at);
        Ok(())
    }
    async fn step(&self, fence: &Fence) -> Result<()> {
        let (mut pos, mut written) = *self.pos.lock().unwrap_or_else(|p| p.into_inner());
        let r = self.sync_batch(fence, &mut pos, &mut written, Duration::from_secs(10)).await;
        *self.pos.lock().unwrap_or_else(|p| p.into_inner()) = (pos, written);
        r.map(|_| ())
    }
}

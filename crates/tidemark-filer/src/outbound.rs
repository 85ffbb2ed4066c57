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
use tidemark_core::backoff::Backoff;
use tidemark_core::model::{Content, Fence, NewEntry, Origin, Txn};
use tidemark_core::remote::{MountMapping, RemoteConf, system_paths};
use tidemark_core::{Error, Filer, Result};
use tidemark_engine::outbound::{OutboundOutcome, sync_record};

use crate::local::LocalFiler;
use crate::remotes::read_doc;

/// How long the lease lasts between renewals; renewed every third of it.
const LEASE_TTL: Duration = Duration::from_secs(30);
/// How often a filer that does not hold the lease checks whether it is free.
const STANDBY_CHECK: Duration = Duration::from_secs(5);
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
}

impl OutboundSync {
    /// `holder` names this filer in the lease (unique among the filers of the cluster).
    pub fn new(filer: Arc<LocalFiler>, holder: impl Into<String>) -> Self {
        OutboundSync { filer, holder: holder.into() }
    }

    /// Where the loop will resume.
    pub async fn cursor(&self) -> Result<u64> {
        Ok(read_doc::<Cursor>(self.filer.store().as_ref(), system_paths::OUTBOUND_CURSOR)
            .await?
            .map_or(0, |(c, _)| c.seq))
    }

    /// Runs until `stop` resolves: takes the lease (or waits for it), then handles batches while
    /// renewing it; a lost lease abandons the batch in flight and goes back to waiting.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        let store = self.filer.store().clone();
        let ttl_ms = LEASE_TTL.as_millis() as i64;
        let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(60));
        let mut standby_logged = false;
        loop {
            let lease = match store.lease_acquire(system_paths::OUTBOUND_LEASE, &self.holder, ttl_ms).await {
                Ok(l) => l,
                Err(Error::LeaseHeld { holder, .. }) => {
                    if !standby_logged {
                        tracing::info!(%holder, "outbound sync: another filer runs it; standing by");
                        standby_logged = true;
                    }
                    tokio::select! {
                        _ = &mut stop => return,
                        _ = tokio::time::sleep(STANDBY_CHECK) => continue,
                    }
                }
                Err(e) => {
                    let wait = backoff.fail();
                    tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "outbound sync: cannot take its lease");
                    tokio::select! {
                        _ = &mut stop => return,
                        _ = tokio::time::sleep(wait) => continue,
                    }
                }
            };
            standby_logged = false;
            let fence = lease.fence();
            let mut pos = match self.cursor().await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "outbound sync: cannot read its cursor");
                    let _ = store.lease_release(&fence).await;
                    tokio::select! {
                        _ = &mut stop => return,
                        _ = tokio::time::sleep(backoff.fail()) => continue,
                    }
                }
            };
            tracing::info!(generation = lease.generation, cursor = pos, "outbound sync: running on this filer");
            let mut written = pos;
            // Renews every third of the ttl. Fenced (taken over, or expired) ends the run; any
            // other failure (the store briefly unavailable) is retried at the next tick — the
            // lease has two more thirds to live, and if it expires meanwhile the renewal is fenced.
            let keep = async {
                loop {
                    tokio::time::sleep(LEASE_TTL / 3).await;
                    match store.lease_renew(&fence, ttl_ms).await {
                        Ok(_) => {}
                        Err(e @ Error::Fenced { .. }) => return e,
                        Err(e) => tracing::warn!(error = %e, "outbound sync: cannot renew its lease; retrying"),
                    }
                }
            };
            tokio::pin!(keep);
            let stopping = loop {
                tokio::select! {
                    _ = &mut stop => break true,
                    e = &mut keep => {
                        tracing::warn!(error = %e, "outbound sync: lost its lease; another filer may take over");
                        break false;
                    }
                    r = self.step(&fence, &mut pos, &mut written, Duration::from_secs(10)) => match r {
                        Ok(_) => backoff.succeed(),
                        Err(e) => {
                            let wait = backoff.fail();
                            tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "outbound sync: will retry");
                            tokio::select! {
                                _ = &mut stop => break true,
                                _ = tokio::time::sleep(wait) => {}
                            }
                        }
                    },
                }
            };
            if stopping {
                // Hand over at once rather than after the ttl.
                let _ = store.lease_release(&fence).await;
                return;
            }
        }
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
    async fn step(
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

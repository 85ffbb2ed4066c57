//! The work one filer of a cluster does at a time — the outbound sync, the blob collector: the
//! filer that holds the task's lease works, the others stand by and take over when it stops (at
//! once when it releases the lease on shutdown; after the lease's ttl when it dies, is paused or
//! is cut off). Every write the task makes carries the lease's fence, so a filer that lost the
//! lease cannot write on; its position is a system document written the same way.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tidemark_core::backoff::Backoff;
use tidemark_core::model::Fence;
use tidemark_core::{Error, MetaStore, Result};

/// How long a task's lease lasts between renewals, unless the filer is told otherwise
/// (`--task-lease-ttl`); renewed every third of it. Another filer takes over this long after
/// the holder died.
pub const LEASE_TTL: Duration = Duration::from_secs(30);
/// How often a filer that does not hold the lease checks whether it is free.
const STANDBY_CHECK: Duration = Duration::from_secs(5);

#[async_trait]
pub trait LeaderTask: Send + Sync {
    /// For logs: `outbound sync`, `blob collector`.
    fn name(&self) -> &'static str;
    /// The lease that decides which filer runs the task.
    fn lease(&self) -> &'static str;
    /// This filer has just taken the lease: read where to resume.
    async fn resume(&self) -> Result<()>;
    /// One unit of work; every write carries `fence`. An error is retried after a backoff.
    async fn step(&self, fence: &Fence) -> Result<()>;
}

/// Runs `task` until `stop` resolves: takes the lease (or waits for it), then steps while
/// renewing it; a lost lease abandons the step in flight and goes back to waiting. On `stop`
/// the lease is released, so another filer takes over at once.
pub async fn lead(
    store: Arc<dyn MetaStore>,
    holder: String,
    task: &dyn LeaderTask,
    ttl: Duration,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    let name = task.name();
    let ttl_ms = ttl.as_millis() as i64;
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(60));
    let mut standby_logged = false;
    loop {
        let lease = match store.lease_acquire(task.lease(), &holder, ttl_ms).await {
            Ok(l) => l,
            Err(Error::LeaseHeld { holder, .. }) => {
                if !standby_logged {
                    tracing::info!(%holder, "{name}: another filer runs it; standing by");
                    standby_logged = true;
                }
                tokio::select! {
                    _ = &mut stop => return,
                    _ = tokio::time::sleep(STANDBY_CHECK) => continue,
                }
            }
            Err(e) => {
                let wait = backoff.fail();
                tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "{name}: cannot take its lease");
                tokio::select! {
                    _ = &mut stop => return,
                    _ = tokio::time::sleep(wait) => continue,
                }
            }
        };
        standby_logged = false;
        let fence = lease.fence();
        if let Err(e) = task.resume().await {
            tracing::warn!(error = %e, "{name}: cannot read where to resume");
            let _ = store.lease_release(&fence).await;
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep(backoff.fail()) => continue,
            }
        }
        tracing::info!(generation = lease.generation, "{name}: running on this filer");
        // Renews every third of the ttl. Fenced (taken over, or expired) ends the run; any other
        // failure (the store briefly unavailable) is retried at the next tick — the lease has two
        // more thirds to live, and if it expires meanwhile the renewal is fenced.
        let keep = async {
            loop {
                tokio::time::sleep(ttl / 3).await;
                match store.lease_renew(&fence, ttl_ms).await {
                    Ok(_) => {}
                    Err(e @ Error::Fenced { .. }) => return e,
                    Err(e) => tracing::warn!(error = %e, "{name}: cannot renew its lease; retrying"),
                }
            }
        };
        tokio::pin!(keep);
        let stopping = loop {
            tokio::select! {
                _ = &mut stop => break true,
                e = &mut keep => {
                    tracing::warn!(error = %e, "{name}: lost its lease; another filer may take over");
                    break false;
                }
                r = task.step(&fence) => match r {
                    Ok(()) => backoff.succeed(),
                    Err(e @ Error::Fenced { .. }) => {
                        tracing::warn!(error = %e, "{name}: lost its lease; another filer may take over");
                        break false;
                    }
                    Err(e) => {
                        let wait = backoff.fail();
                        tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "{name}: will retry");
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

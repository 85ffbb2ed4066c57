//! The slice engine: one bounded, fenced run for one subscription.
//!
//! ```text
//! acquire the lease (generation + 1) → baseline / gap / scheduled reconcile, if the marker says so
//! → receive and apply until the deadline, a cancel, or the loss of the lease (renewing it)
//! → write the status blob → release the lease
//! ```
//!
//! The queue is the cursor: nothing but the marker, the lease and the status blob is stored, all
//! keyed by the subscription's fingerprint, so a re-pointed subscription (a new fingerprint) reads
//! as never reconciled and runs a baseline before it tails. Every write of the slice — entries,
//! marker, status — carries the lease's fence.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use tidemark_core::events::{EventSource, Provider};
use tidemark_core::model::{Content, Fence, NewEntry, Origin, Txn};
use tidemark_core::remote::Mount;
use tidemark_core::requests::Requests;
use tidemark_core::subscription::SubscriptionDoc;
use tidemark_core::{Clock, Error, Filer, RemoteStorage, Result};

use crate::apply::{ApplyContext, Counters, apply_batch};
use crate::docs::read_json;
use crate::reconcile::{ReconcileOptions, reconcile};

pub const MARKERS_DIR: &str = "/etc/tidemark/remote_events/markers";
pub const STATUS_DIR: &str = "/etc/tidemark/remote_events/status";

/// How often a tailing slice refreshes its status blob (when its counters moved).
const STATUS_EVERY: Duration = Duration::from_secs(2);
/// How often a tailing slice reads its dead-letter queue's depth, so the DEAD shown is current
/// rather than as of the slice's start (a message moves there between two receives, on the
/// queue's side, without any counter of the slice's changing).
const DEPTH_EVERY: Duration = Duration::from_secs(30);

/// The most deliveries gathered into one applied batch when the queue has a backlog. A batch's
/// writes are one transaction, so a larger batch costs fewer commits per event (in process:
/// about 20,000 events/s at 100, 29,000 at 200); what it costs is the receives made before
/// the first apply of a backlog (twenty of them, each without waiting).
pub const GATHER: usize = 200;

/// After a full receive (the queue has a backlog), receives more without waiting, up to
/// [`GATHER`] deliveries, so that one HEAD serves every notification of a key in the burst.
pub async fn gather(
    source: &dyn EventSource,
    mut batch: Vec<tidemark_core::events::Delivery>,
) -> Vec<tidemark_core::events::Delivery> {
    let max = source.max_batch();
    let mut last = batch.len();
    while last >= max && batch.len() < GATHER {
        match source.receive(max.min(GATHER - batch.len()), Duration::ZERO).await {
            Ok(more) => {
                last = more.len();
                batch.extend(more);
            }
            Err(_) => break, // what was gathered is applied; the error shows on the next receive
        }
    }
    batch
}

pub fn lease_name(fingerprint: &str) -> String {
    format!("remote_events/{fingerprint}")
}

pub fn marker_path(fingerprint: &str) -> String {
    format!("{MARKERS_DIR}/{fingerprint}.json")
}

pub fn status_path(fingerprint: &str) -> String {
    format!("{STATUS_DIR}/{fingerprint}.json")
}

/// When this identity last completed a full reconcile, and last tailed its queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileMarker {
    pub fingerprint: String,
    pub last_full_reconcile_at_ms: Option<i64>,
    pub last_tail_at_ms: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReconcileKind {
    /// A new identity: everything already in the bucket.
    Baseline,
    /// The tail was interrupted longer than the gap threshold.
    Gap,
    /// The periodic backstop.
    Scheduled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SliceState {
    Idle,
    Reconciling,
    Tailing,
    Errored,
}

/// What the admin page shows of a subscription.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusBlob {
    pub fingerprint: String,
    pub dir: String,
    pub state: SliceState,
    pub counters: Counters,
    pub last_error: Option<String>,
    pub slice_started_at_ms: i64,
    pub slice_ended_at_ms: Option<i64>,
    pub last_reconcile: Option<(ReconcileKind, i64)>,
    pub lease_holder: String,
    pub lease_generation: u64,
    /// Messages waiting in the subscription's dead-letter queue, as last seen (at a slice's start
    /// and end); `None` where there is none or it cannot be seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_lettered: Option<u64>,
}

/// Which reconcile, if any, a slice must run first.
pub fn reconcile_due(marker: Option<&ReconcileMarker>, doc: &SubscriptionDoc, now_ms: i64) -> Option<ReconcileKind> {
    let Some(m) = marker.filter(|m| m.last_full_reconcile_at_ms.is_some()) else {
        return Some(ReconcileKind::Baseline);
    };
    let gap = doc.options.gap_threshold_secs as i64 * 1000;
    if m.last_tail_at_ms.is_none_or(|t| now_ms - t > gap) {
        return Some(ReconcileKind::Gap);
    }
    let interval = doc.options.reconcile_interval_secs as i64 * 1000;
    if m.last_full_reconcile_at_ms.is_some_and(|t| now_ms - t > interval) {
        return Some(ReconcileKind::Scheduled);
    }
    None
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SliceEnd {
    Deadline,
    Cancelled,
    LeaseLost,
}

#[derive(Debug)]
pub struct SliceOutcome {
    pub end: SliceEnd,
    pub reconciled: Option<ReconcileKind>,
    pub counters: Counters,
    pub generation: u64,
}

/// Sees what a slice measures as it goes (the worker forwards it to the admin's `/metrics`).
pub trait SliceObserver: Send + Sync {
    /// One batch was applied: how long it took (receive excluded) and each applied key's lag.
    fn batch_applied(&self, fingerprint: &str, took: Duration, lags_ms: &[i64]);
}

/// Observes nothing.
pub struct NoObserver;

impl SliceObserver for NoObserver {
    fn batch_applied(&self, _: &str, _: Duration, _: &[i64]) {}
}

pub struct Slice<'a> {
    pub filer: &'a dyn Filer,
    pub storage: &'a dyn RemoteStorage,
    pub source: &'a dyn EventSource,
    pub clock: &'a dyn Clock,
    pub doc: &'a SubscriptionDoc,
    pub mount: &'a Mount,
    pub provider: Provider,
    pub cluster_id: Option<&'a str>,
    /// Who runs the slice (a worker id); the lease's holder.
    pub holder: &'a str,
    pub length: Duration,
    pub lease_ttl: Duration,
    pub observer: &'a dyn SliceObserver,
    /// The requests `storage` makes, counted (a [`Counted`](tidemark_core::requests::Counted)
    /// storage's): added to the subscription's counters as the slice publishes them.
    pub requests: Option<&'a Requests>,
}

/// Runs `work` while keeping the lease (just taken or renewed): renews it every third of its ttl.
/// Work that outlasts the lease — a baseline reconcile of a large bucket, a batch against a slow
/// store — would otherwise lose it half-way and, redone by the next slice, never finish. A renewal refused by the fence abandons the work (dropping it: what
/// it did so far was fenced writes, and its messages are not acknowledged) and is `Fenced`; a
/// renewal that fails otherwise is retried at the next tick (if the lease expires meanwhile, the
/// work's own writes are fenced).
async fn keeping_lease<T>(
    filer: &dyn Filer,
    fence: &Fence,
    ttl: Duration,
    work: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::pin!(work);
    let mut renewed = tokio::time::Instant::now();
    loop {
        tokio::select! {
            r = &mut work => return r,
            _ = tokio::time::sleep_until(renewed + ttl / 3) => {
                match filer.lease_renew(fence, ttl).await {
                    Ok(_) => renewed = tokio::time::Instant::now(),
                    Err(e @ Error::Fenced { .. }) => return Err(e),
                    Err(e) => {
                        tracing::warn!(error = %e, lease = %fence.lease, "cannot renew the lease; retrying");
                        renewed = tokio::time::Instant::now() - ttl / 3 + Duration::from_millis(500);
                    }
                }
            }
        }
    }
}

/// Says why a slice ends as `LeaseLost` (which lease, at which generation now).
fn lost(e: &Error) -> SliceEnd {
    tracing::info!(reason = %e, "the slice lost its lease");
    SliceEnd::LeaseLost
}

/// Writes a JSON document with the slice's fence (a stale slice cannot overwrite it).
async fn put_fenced<T: Serialize>(filer: &dyn Filer, path: &str, doc: &T, fence: &Fence, now_ms: i64) -> Result<()> {
    let bytes = Bytes::from(serde_json::to_vec_pretty(doc).map_err(Error::internal)?);
    let txn = Txn::put(path, NewEntry::file(bytes.len() as u64, now_ms, Content::Inline), Origin::System)
        .with_fence(fence.clone())
        .with_data(bytes);
    filer.apply(txn).await.map(|_| ())
}

impl Slice<'_> {
    /// Runs the slice until its length passes, `cancel` resolves, or the lease is lost.
    pub async fn run(&self, cancel: impl std::future::Future<Output = ()>) -> Result<SliceOutcome> {
        tokio::pin!(cancel);
        let fp = &self.doc.fingerprint;
        let started = self.clock.now_ms();
        let lease = self.filer.lease_acquire(&lease_name(fp), self.holder, self.lease_ttl).await?;
        let fence = lease.fence();
        let mut status = StatusBlob {
            fingerprint: fp.clone(),
            dir: self.doc.dir.clone(),
            state: SliceState::Tailing,
            counters: read_json::<StatusBlob>(self.filer, &status_path(fp))
                .await?
                .map(|(s, _)| s.counters)
                .unwrap_or_default(),
            last_error: None,
            slice_started_at_ms: started,
            slice_ended_at_ms: None,
            last_reconcile: None,
            lease_holder: lease.holder.clone(),
            lease_generation: lease.generation,
            dead_lettered: self.dead_lettered().await,
        };
        // The lease is renewed beside the whole body (a receive from a slow queue, a baseline
        // reconcile of a large bucket and a batch against a slow store can each outlast it).
        let mut seen = self.requests.map(Requests::snapshot).unwrap_or_default();
        let body = self.body(&fence, &mut status, &mut seen, &mut cancel);
        let result = match keeping_lease(self.filer, &fence, self.lease_ttl, body).await {
            Err(e @ Error::Fenced { .. }) => Ok(lost(&e)),
            r => r,
        };
        status.slice_ended_at_ms = Some(self.clock.now_ms());
        self.fold_requests(&mut seen, &mut status.counters);
        status.dead_lettered = self.dead_lettered().await.or(status.dead_lettered);
        let mut outcome = match result {
            Ok(end) => {
                status.state = if end == SliceEnd::LeaseLost { SliceState::Errored } else { SliceState::Idle };
                if end == SliceEnd::LeaseLost {
                    status.last_error = Some("the lease was lost to another worker".into());
                }
                end
            }
            Err(e) => {
                status.state = SliceState::Errored;
                status.last_error = Some(e.to_string());
                let _ = put_fenced(self.filer, &status_path(fp), &status, &fence, self.clock.now_ms()).await;
                let _ = self.filer.lease_release(&fence).await;
                return Err(e);
            }
        };
        if outcome != SliceEnd::LeaseLost {
            // A slice that ended otherwise (cancelled, say, as a paused worker resumes) may have
            // lost its lease meanwhile: its last write is refused, and that is how it ended.
            match put_fenced(self.filer, &status_path(fp), &status, &fence, self.clock.now_ms()).await {
                Ok(()) => {
                    let _ = self.filer.lease_release(&fence).await;
                }
                Err(e @ Error::Fenced { .. }) => outcome = lost(&e),
                Err(e) => return Err(e),
            }
        }
        Ok(SliceOutcome {
            end: outcome,
            reconciled: status.last_reconcile.map(|(k, _)| k),
            counters: status.counters,
            generation: lease.generation,
        })
    }

    /// The dead-letter queue's depth; a failure to see it is not the slice's (logged, `None`).
    async fn dead_lettered(&self) -> Option<u64> {
        match self.source.dead_lettered().await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, dir = %self.doc.dir, "cannot read the dead-letter queue's depth");
                None
            }
        }
    }

    /// Adds the requests made since `seen` to `counters`.
    fn fold_requests(&self, seen: &mut BTreeMap<String, u64>, counters: &mut Counters) {
        let Some(r) = self.requests else { return };
        let now = r.snapshot();
        for (op, n) in &now {
            let before = seen.get(op).copied().unwrap_or(0);
            *counters.requests.entry(op.clone()).or_default() += n.saturating_sub(before);
        }
        *seen = now;
    }

    async fn body(
        &self,
        fence: &Fence,
        status: &mut StatusBlob,
        seen: &mut BTreeMap<String, u64>,
        cancel: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    ) -> Result<SliceEnd> {
        let fp = &self.doc.fingerprint;
        // The document may have been written past the shell's checks (through the API): a bad one
        // errs here, with its reason on the status, before any duration is used.
        self.doc.options.validate().map_err(|e| {
            Error::invalid_argument(format!(
                "the event subscription of {} has bad options: {e}; set them again with remote.events.enable",
                self.doc.dir
            ))
        })?;
        let mut marker = read_json::<ReconcileMarker>(self.filer, &marker_path(fp)).await?.map(|(m, _)| m);
        // A source that may have missed notifications (a watcher that just started) is covered by
        // the same gap reconcile as a tail interrupted too long.
        let missed = self.source.missed_events();
        let due =
            reconcile_due(marker.as_ref(), self.doc, self.clock.now_ms()).or(missed.then_some(ReconcileKind::Gap));
        if let Some(kind) = due {
            status.state = SliceState::Reconciling;
            put_fenced(self.filer, &status_path(fp), status, fence, self.clock.now_ms()).await?;
            let at = self.clock.now_ms();
            let opts = ReconcileOptions {
                fence: Some(fence.clone()),
                cluster_id: self.cluster_id.map(str::to_string),
                ..Default::default()
            };
            match reconcile(self.filer, self.storage, self.mount, &opts, &mut |_| {}).await {
                Ok(_) => {}
                Err(e @ Error::Fenced { .. }) => return Ok(lost(&e)),
                Err(e) => return Err(e),
            }
            // Written only once the reconcile completed.
            let m = ReconcileMarker {
                fingerprint: fp.clone(),
                last_full_reconcile_at_ms: Some(at),
                last_tail_at_ms: Some(self.clock.now_ms()),
            };
            match put_fenced(self.filer, &marker_path(fp), &m, fence, self.clock.now_ms()).await {
                Err(e @ Error::Fenced { .. }) => return Ok(lost(&e)),
                r => r?,
            }
            if missed {
                self.source.caught_up();
            }
            marker = Some(m);
            status.last_reconcile = Some((kind, at));
            status.state = SliceState::Tailing;
        }
        let types = &self.doc.identity.event_types;
        let visibility = Duration::from_secs(self.doc.options.visibility_timeout_secs);
        let prefetch = self.doc.options.prefetch_filter();
        // The slice's memory of its HEADs: it ends with the slice.
        let recent = crate::recent::RecentHeads::new();
        let ctx = ApplyContext {
            mount: self.mount,
            provider: self.provider,
            event_types: types,
            cluster_id: self.cluster_id,
            fence: Some(fence),
            concurrency: self.doc.options.apply_concurrency,
            retry_delay: Duration::from_secs(5),
            visibility,
            clock: self.clock,
            prefetch: prefetch.as_ref(),
            recent: Some(&recent),
            max_receives: self.doc.managed.max_receives,
        };
        status.state = SliceState::Tailing;
        match put_fenced(self.filer, &status_path(fp), status, fence, self.clock.now_ms()).await {
            Err(e @ Error::Fenced { .. }) => return Ok(lost(&e)),
            r => r?,
        }
        let deadline = tokio::time::Instant::now() + self.length;
        // The status blob is refreshed while tailing, when the counters moved, at most this often.
        let mut published = (tokio::time::Instant::now(), status.counters.clone());
        let mut depth_read = tokio::time::Instant::now();
        let end = loop {
            let now = tokio::time::Instant::now();
            if now >= deadline {
                break SliceEnd::Deadline;
            }
            // Counters not yet published shorten the wait, so the status blob (the admin's page)
            // trails the applies by about STATUS_EVERY, not by a whole long poll.
            let poll = if published.1 != status.counters { STATUS_EVERY } else { Duration::from_secs(20) };
            let wait = (deadline - now).min(poll);
            let receive = self.source.receive(self.source.max_batch(), wait);
            tokio::pin!(receive);
            let batch = tokio::select! {
                _ = cancel.as_mut() => {
                    // A receive in flight may already have taken messages off the queue (a long
                    // poll cannot be called back): let it end (bounded by its wait) and give back
                    // what it brought, so no change waits out a visibility timeout unseen.
                    if let Ok(brought) = receive.await {
                        for d in brought {
                            let _ = self.source.release(&d.ack_id, Duration::ZERO).await;
                        }
                    }
                    break SliceEnd::Cancelled;
                }
                b = &mut receive => b,
            };
            let batch = match batch {
                Ok(b) if !b.is_empty() => gather(self.source, b).await,
                Ok(b) => b,
                // The source backs off by itself; a slice that cannot receive still ends on time.
                Err(e) => {
                    status.last_error = Some(e.to_string());
                    continue;
                }
            };
            if !batch.is_empty() {
                let began = tokio::time::Instant::now();
                match apply_batch(self.filer, self.storage, self.source, &ctx, batch, &mut status.counters).await {
                    Ok(report) => self.observer.batch_applied(fp, began.elapsed(), &report.lags_ms),
                    Err(e @ Error::Fenced { .. }) => break lost(&e),
                    Err(e) => return Err(e),
                }
            }
            let mut depth_changed = false;
            if depth_read.elapsed() >= DEPTH_EVERY {
                depth_read = tokio::time::Instant::now();
                if let Some(n) = self.dead_lettered().await
                    && status.dead_lettered != Some(n)
                {
                    status.dead_lettered = Some(n);
                    depth_changed = true;
                }
            }
            self.fold_requests(seen, &mut status.counters);
            if published.0.elapsed() >= STATUS_EVERY && (published.1 != status.counters || depth_changed) {
                match put_fenced(self.filer, &status_path(fp), status, fence, self.clock.now_ms()).await {
                    Err(e @ Error::Fenced { .. }) => break lost(&e),
                    r => r?,
                }
                published = (tokio::time::Instant::now(), status.counters.clone());
            }
        };
        if end != SliceEnd::LeaseLost {
            let m = ReconcileMarker { last_tail_at_ms: Some(self.clock.now_ms()), ..marker.unwrap_or_default() };
            match put_fenced(
                self.filer,
                &marker_path(fp),
                &ReconcileMarker { fingerprint: fp.clone(), ..m },
                fence,
                self.clock.now_ms(),
            )
            .await
            {
                Err(e @ Error::Fenced { .. }) => return Ok(lost(&e)),
                r => r?,
            }
        }
        Ok(end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_core::subscription::{EventTypes, Identity, SubscriptionOptions, Topology};

    fn doc() -> SubscriptionDoc {
        let identity = Identity {
            queue: "q".into(),
            topology: Topology::ByoQueue,
            bucket: "b".into(),
            prefix: String::new(),
            event_types: EventTypes::default(),
        };
        SubscriptionDoc {
            dir: "/m".into(),
            fingerprint: identity.fingerprint(),
            identity,
            options: SubscriptionOptions {
                gap_threshold_secs: 60,
                reconcile_interval_secs: 3600,
                ..Default::default()
            },
            managed: Default::default(),
            created_at_ms: 0,
            updated_at_ms: 0,
        }
    }

    #[test]
    fn the_marker_decides_the_reconcile() {
        let d = doc();
        let now = 10_000_000;
        assert_eq!(reconcile_due(None, &d, now), Some(ReconcileKind::Baseline), "a new identity");
        let never = ReconcileMarker {
            fingerprint: d.fingerprint.clone(),
            last_full_reconcile_at_ms: None,
            last_tail_at_ms: Some(now),
        };
        assert_eq!(reconcile_due(Some(&never), &d, now), Some(ReconcileKind::Baseline), "a reconcile never completed");
        let fresh = ReconcileMarker {
            last_full_reconcile_at_ms: Some(now - 1000),
            last_tail_at_ms: Some(now - 1000),
            ..never.clone()
        };
        assert_eq!(reconcile_due(Some(&fresh), &d, now), None);
        let stale_tail = ReconcileMarker { last_tail_at_ms: Some(now - 61_000), ..fresh.clone() };
        assert_eq!(reconcile_due(Some(&stale_tail), &d, now), Some(ReconcileKind::Gap));
        let old_full = ReconcileMarker { last_full_reconcile_at_ms: Some(now - 3_601_000), ..fresh };
        assert_eq!(reconcile_due(Some(&old_full), &d, now), Some(ReconcileKind::Scheduled));
    }
}

//! The applier: one batch of deliveries from a subscription's queue, applied key by key as the
//! single-key mirror of the reconcile.
//!
//! 1. Every delivery counts as `received` (redeliveries too) and is decoded. Test and ignorable
//!    messages are acknowledged and counted `ignored`; a malformed one is counted `failed` and is
//!    **not** acknowledged — it redelivers per the queue's policy, visible rather than silent.
//! 2. Events are filtered (bucket, the mount's prefix, subscribed event types) and coalesced by
//!    key: one HEAD per distinct key per batch, distinct keys concurrently.
//! 3. The keys' entries are read (one batched read), then each key's object is HEADed (the event
//!    only names the key; the bucket's current state decides), each `decide`d, and every write
//!    goes through one batched, conditional, fenced transaction of the filer.
//! 4. A message is acknowledged only when every key it named was handled. A transient failure
//!    (HEAD, filer) releases it with a delay so it comes back; a failed fence stops the batch at
//!    once and acknowledges nothing more.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::StreamExt;
use serde::Serialize;

use tidemark_core::cache::FileFilter;
use tidemark_core::decide::{DecideCtx, RemoteSide, SkipReason};
use tidemark_core::events::{Decoded, Delivery, EventSource, Provider, decode};
use tidemark_core::keymap::{KeyMap, Mapped};
use tidemark_core::model::Fence;
use tidemark_core::remote::{Mount, ObjectHeaders};
use tidemark_core::{Clock, Error, Filer, RemoteObject, RemoteStorage, Result};

use crate::recent::RecentHeads;
use crate::reconcile::{Item, ReconcileOptions};
use crate::write::{self, Outcome, Pending, WriteRules};

pub use tidemark_core::subscription::EventTypes;

/// What the applier needs to know about the subscription it serves.
pub struct ApplyContext<'a> {
    pub mount: &'a Mount,
    pub provider: Provider,
    pub event_types: &'a EventTypes,
    pub cluster_id: Option<&'a str>,
    /// The slice's lease: every write carries it.
    pub fence: Option<&'a Fence>,
    /// HEADs of distinct keys in flight at once (the writes of a batch are one transaction).
    pub concurrency: usize,
    /// How long a message that failed transiently stays invisible before it comes back.
    pub retry_delay: Duration,
    /// The queue's visibility timeout: deliveries still being handled are extended by this much
    /// every half of it (a heartbeat), so a slow batch is not redelivered to another worker.
    pub visibility: Duration,
    pub clock: &'a dyn Clock,
    /// Files whose new version the filer fetches into its cache once an event's write of them
    /// is applied (`-prefetch`); `None`: off.
    pub prefetch: Option<&'a FileFilter>,
    /// The HEADs this slice made, so a notification one of them already answered needs no
    /// other (see [`crate::recent`]); `None`: every key is HEADed.
    pub recent: Option<&'a RecentHeads>,
    /// After how many receives the queue dead-letters a message (`-maxReceives` of what Tidemark
    /// provisioned); `None`: unknown (a queue of the user's own) or none.
    pub max_receives: Option<u32>,
}

/// Per-subscription counters, as the status blob and `/metrics` show them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Counters {
    /// Every delivery, redeliveries included.
    pub received: u64,
    /// Deliveries handled successfully (and acknowledged).
    pub applied: u64,
    /// Deliveries whose handling failed (they redeliver).
    pub failed: u64,
    /// Keys skipped as the echo of this cluster's own upload.
    pub echo_suppressed: u64,
    /// Deliveries or events that needed nothing: test events, other buckets, keys outside the
    /// prefix, unsubscribed event types, refused keys.
    pub ignored: u64,
    pub failed_reasons: BTreeMap<String, u64>,
    pub ignored_reasons: BTreeMap<String, u64>,
    /// Entries created, updated, deleted by applied events.
    pub changes: u64,
    /// Keys whose notifications an earlier HEAD of the slice had already answered (no HEAD).
    #[serde(default)]
    pub heads_saved: u64,
    /// Keys refused because a file or a directory stands where their path would be (the file
    /// `a` and the key `a/b`, or the reverse): brought in once what is in the way goes.
    #[serde(default)]
    pub shadowed: u64,
    /// Objects the bucket refuses this cluster for good (SSE-C, a KMS key denied): their
    /// entries are marked unreadable.
    #[serde(default)]
    pub unreadable: u64,
    /// Requests the slices made of the bucket, by operation (`HEAD`, `LIST`, `GET`, ...:
    /// [`requests`](tidemark_core::requests)), since the subscription began.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, u64>,
    /// Lag from the event's time to its apply, over applied events: last and largest.
    pub last_lag_ms: Option<i64>,
    pub max_lag_ms: Option<i64>,
}

impl Counters {
    fn ignore(&mut self, reason: &str) {
        self.ignored += 1;
        *self.ignored_reasons.entry(reason.to_string()).or_default() += 1;
    }
    fn fail(&mut self, reason: &str) {
        self.failed += 1;
        *self.failed_reasons.entry(reason.to_string()).or_default() += 1;
    }
    fn lag(&mut self, ms: i64) {
        let ms = ms.max(0);
        self.last_lag_ms = Some(ms);
        self.max_lag_ms = Some(self.max_lag_ms.map_or(ms, |m| m.max(ms)));
    }
}

/// What happened to one batch.
#[derive(Debug, Default)]
pub struct BatchReport {
    pub acked: usize,
    /// Deliveries left to come back (failed, or malformed).
    pub left: usize,
    /// Per-path outcomes of the keys applied.
    pub outcomes: Vec<(String, Outcome)>,
    /// Event time to apply of each applied key whose event carried a time, milliseconds.
    pub lags_ms: Vec<i64>,
}

enum KeyResult {
    /// Handled: the key's path and outcome (`None`: a key the mapping refuses), and what the
    /// follow-up of a removal changed besides (keys it had been in the way of, directories it
    /// left empty).
    Done(Option<(String, Outcome)>, Vec<(String, Outcome)>),
    Transient(String),
}

/// The keys a batch names: single keys, each HEADed, and subtrees (a directory deleted or
/// renamed as a whole in a hierarchical namespace), each reconciled.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Need {
    Key(String),
    Subtree(String),
}

/// A write's failure as the reason to retry its keys' messages, when the filer could not be
/// reached; any other failure (a lost fence among them) ends the batch.
fn write_failed(e: Error) -> Result<String> {
    match e {
        e @ (Error::Unavailable { .. } | Error::Io { .. }) => Ok(format!("write: {e}")),
        e => Err(e),
    }
}

/// Whether a failure of the bucket is worth retrying the message for.
/// The object `key` as the bucket lists it (size, ETag, time: what a listing gives without
/// reading it), or `None` if it is not there.
async fn listed(storage: &dyn RemoteStorage, key: &str) -> Result<Option<RemoteObject>> {
    let page = storage.list(key, None, None, 1).await?;
    Ok(page.objects.into_iter().find(|o| o.key == key))
}

fn transient_head(e: &Error) -> bool {
    matches!(e, Error::Unavailable { .. } | Error::Io { .. } | Error::Internal { .. } | Error::Unauthorized { .. })
}

/// Applies the distinct keys of a batch: their entries read in one batched read, then their
/// HEADs (`ctx.concurrency` at once), then every decision written in one batched, fenced
/// transaction. The entries are read before the HEADs: whatever lands in between (a local
/// write) makes the conditional write fail and that key be decided again, never clobbered.
async fn apply_keys(
    filer: &dyn Filer,
    storage: &dyn RemoteStorage,
    map: &KeyMap,
    ctx: &ApplyContext<'_>,
    keys: Vec<(String, Option<i64>)>,
    counters: &mut Counters,
) -> Result<Vec<(String, KeyResult)>> {
    let mut out = Vec::with_capacity(keys.len());
    let mut mapped = Vec::with_capacity(keys.len());
    for (key, sent) in keys {
        match map.key_to_path(key.as_bytes()) {
            Ok(m) => mapped.push((key, m, sent)),
            Err(_) => out.push((key, KeyResult::Done(None, Vec::new()))),
        }
    }
    let paths: Vec<String> = mapped.iter().map(|(_, m, _)| m.path().to_string()).collect();
    let locals = match write::stat_all(filer, &paths).await {
        Ok(l) => l,
        Err(e @ Error::Unavailable { .. }) => {
            let why = format!("filer: {e}");
            out.extend(mapped.into_iter().map(|(k, _, _)| (k, KeyResult::Transient(why.clone()))));
            return Ok(out);
        }
        Err(e) => return Err(e),
    };
    // Keys an earlier HEAD already answered: the entry is as that HEAD's apply left it.
    let mut to_ask = Vec::with_capacity(mapped.len());
    for ((key, m, sent), local) in mapped.into_iter().zip(locals) {
        if ctx.recent.is_some_and(|r| r.covers(&key, sent, local.as_ref().map(|e| e.version))) {
            counters.heads_saved += 1;
            let path = m.path().to_string();
            out.push((key, KeyResult::Done(Some((path, Outcome::Skipped(SkipReason::InSync))), Vec::new())));
        } else {
            to_ask.push((key, m, local));
        }
    }
    // Every HEAD below starts after this: what they see is the bucket at this time or later.
    let head_at_ms = ctx.clock.now_ms();
    // Collected first: a lazy iterator of futures held across the await would make this
    // future's `Send` depend on a closure's lifetimes, which the compiler cannot prove.
    let asks: Vec<_> = to_ask.iter().map(|(key, _, _)| storage.stat(key)).collect();
    let heads: Vec<Result<Option<RemoteObject>>> =
        futures::stream::iter(asks).buffered(ctx.concurrency.max(1)).collect().await;
    // The keys HEADed, and apart (the decisions borrow them) their objects.
    let mut asked = Vec::with_capacity(heads.len());
    let mut objects = Vec::with_capacity(heads.len());
    for ((key, m, local), head) in to_ask.into_iter().zip(heads) {
        match head {
            Ok(object) => {
                asked.push((key, m, local));
                objects.push(object);
            }
            // Refused for good: an outcome, not a retry. The entry shows the object as the
            // bucket lists it, marked unreadable with the reason (no bytes of an older version
            // are served for it), and the message is acknowledged.
            Err(Error::Unreadable { reason, .. }) => match listed(storage, &key).await {
                Ok(object) => {
                    if object.is_some() {
                        counters.unreadable += 1;
                        tracing::warn!(%key, %reason, "the bucket refuses this object's bytes: marked unreadable");
                    }
                    asked.push((key, m, local));
                    objects.push(object.map(|mut o| {
                        o.headers = Some(ObjectHeaders { unreadable: Some(reason), ..Default::default() });
                        o
                    }));
                }
                Err(e) if transient_head(&e) => {
                    out.push((key, KeyResult::Transient(format!("listing an unreadable object: {e}"))));
                }
                Err(e) => return Err(e),
            },
            Err(e) if transient_head(&e) => out.push((key, KeyResult::Transient(format!("HEAD failed: {e}")))),
            Err(e) => return Err(e),
        }
    }
    let items: Vec<Pending<'_>> = asked
        .iter_mut()
        .zip(&objects)
        .map(|((_, m, local), object)| Pending {
            path: m.path().to_string(),
            local: local.take(),
            remote: object.as_ref().map(|o| RemoteSide { object: o, is_dir_marker: matches!(m, Mapped::DirMarker(_)) }),
        })
        .collect();
    let dctx = DecideCtx { storage: &ctx.mount.location.storage, cluster_id: ctx.cluster_id, tombstone: None };
    // The objects come from HEADs, with their metadata: nothing to complete. Tombstones are
    // looked up whatever the slice's copy of the mount says of its sync: that copy is as old as
    // the slice, and a delete or rename made since the sync was turned on must not come back
    // with an event (found by `fuse_mount::the_mount_follows_the_bucket_through_events`: a
    // renamed file's in-flight copy re-created at its old name). Where the sync is off no
    // tombstone is written, and the reconcile (which does not look) brings back what an old
    // one hides.
    let rules = WriteRules { fence: ctx.fence, allow_delete: true, check_tombstones: true, heads: None };
    let results = match write::decide_and_write_many(filer, items, &dctx, rules).await {
        Ok(r) => r,
        Err(e) => {
            let why = write_failed(e)?;
            out.extend(asked.into_iter().map(|(k, _, _)| (k, KeyResult::Transient(why.clone()))));
            return Ok(out);
        }
    };
    let mut prefetches = Vec::new();
    for ((key, m, _), (object, result)) in asked.into_iter().zip(objects.iter().zip(results)) {
        let path = m.path().to_string();
        if let Some(r) = ctx.recent {
            match result.as_ref().map(|w| w.version) {
                Ok(Some(version)) => r.remember(&key, head_at_ms, version),
                _ => r.forget(&key),
            }
        }
        match result.map(|w| w.outcome) {
            Ok(outcome) => {
                if let (Some(filter), Some(o), Outcome::Created | Outcome::Updated) = (ctx.prefetch, object, &outcome)
                    && matches!(m, Mapped::File(_))
                    && filter.matches(&ctx.mount.dir, &path, o.size)
                {
                    prefetches.push(path.clone());
                }
                // The object is gone and so is the entry: what it may have stood in the way of
                // is brought in now, not at the next reconcile.
                let freed = object.is_none()
                    && matches!(m, Mapped::File(_))
                    && matches!(outcome, Outcome::Deleted | Outcome::Skipped(SkipReason::InSync));
                if freed {
                    match follow_removal(filer, storage, ctx, &key, &path).await {
                        Ok(more) => out.push((key, KeyResult::Done(Some((path, outcome)), more))),
                        Err(e) => out.push((key, KeyResult::Transient(write_failed(e)?))),
                    }
                } else {
                    out.push((key, KeyResult::Done(Some((path, outcome)), Vec::new())));
                }
            }
            Err(e) => out.push((key, KeyResult::Transient(write_failed(e)?))),
        }
    }
    let asks: Vec<_> = prefetches.iter().map(|p| prefetch(filer, p)).collect();
    futures::future::join_all(asks).await;
    Ok(out)
}

/// After the removal of the file `path` (key `key`) is applied, or found applied: the keys below
/// it that the file stood in the way of are brought in (a subtree reconcile, when a one-key
/// listing says there are any), and its directory, if that leaves it empty and no marker backs
/// it, is removed — and a file key at that directory's path gets it. Both as a reconcile does,
/// fenced; the changes are returned.
async fn follow_removal(
    filer: &dyn Filer,
    storage: &dyn RemoteStorage,
    ctx: &ApplyContext<'_>,
    key: &str,
    path: &str,
) -> Result<Vec<(String, Outcome)>> {
    let opts = reconcile_options(ctx);
    let mut changed = Vec::new();
    let mut sink = |i: &Item| {
        if let Item::Path { path, outcome } = i
            && outcome.is_change()
        {
            changed.push((path.clone(), outcome.clone()));
        }
    };
    let below = storage.list(&format!("{key}/"), None, None, 1).await?;
    if !below.objects.is_empty() {
        crate::reconcile::reconcile_subtree(filer, storage, ctx.mount, path, &opts, &mut sink).await?;
    }
    if let Some(parent) = tidemark_core::path::parent(path) {
        crate::reconcile::remove_if_emptied(filer, storage, ctx.mount, parent, &opts, &mut sink).await?;
    }
    Ok(changed)
}

/// A subtree a notification names (a directory created, deleted or renamed as a whole),
/// reconciled as a whole; its changes.
async fn apply_subtree(
    filer: &dyn Filer,
    storage: &dyn RemoteStorage,
    ctx: &ApplyContext<'_>,
    path: &str,
) -> Result<Vec<(String, Outcome)>> {
    let opts = reconcile_options(ctx);
    let mut changed = Vec::new();
    let mut sink = |i: &Item| {
        if let Item::Path { path, outcome } = i {
            changed.push((path.clone(), outcome.clone()));
        }
    };
    crate::reconcile::reconcile_subtree(filer, storage, ctx.mount, path, &opts, &mut sink).await?;
    Ok(changed)
}

/// How the applier's reconciles write: with the slice's fence, deleting what is gone.
fn reconcile_options(ctx: &ApplyContext<'_>) -> ReconcileOptions {
    ReconcileOptions {
        fence: ctx.fence.cloned(),
        cluster_id: ctx.cluster_id.map(str::to_string),
        page_size: 1000,
        ..Default::default()
    }
}

/// Asks the filer to fetch a file's new version into its cache and returns at once: the fetch
/// runs in the filer, so it holds neither this key's apply nor the slice's lease. A failure only
/// costs the warm-up.
async fn prefetch(filer: &dyn Filer, path: &str) {
    match tokio::time::timeout(PREFETCH_ASK_TIMEOUT, filer.cache_fetch(path, false)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(path, error = %e, "prefetch not started"),
        Err(_) => tracing::debug!(path, "prefetch not started: the filer did not answer in time"),
    }
}

/// How long the applier waits for the filer to take a prefetch request.
const PREFETCH_ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs `work` while extending the visibility of `ack_ids` every half `visibility`.
async fn with_heartbeat<T>(
    source: &dyn EventSource,
    ack_ids: &[String],
    visibility: Duration,
    work: impl std::future::Future<Output = T>,
) -> T {
    if visibility.is_zero() || ack_ids.is_empty() {
        return work.await;
    }
    let beat = async {
        let mut tick = tokio::time::interval(visibility / 2);
        tick.tick().await; // the first tick is immediate
        loop {
            tick.tick().await;
            for id in ack_ids {
                if let Err(e) = source.extend(id, visibility).await {
                    tracing::warn!(source = %source.describe(), error = %e, "could not extend a delivery in progress");
                }
            }
        }
    };
    tokio::select! {
        out = work => out,
        _ = beat => unreachable!("the heartbeat loops until the work is done"),
    }
}

/// A subtree's name among the keys of a batch's results (a key cannot start with a NUL).
fn subtree_tag(key: &str) -> String {
    format!("\0subtree:{key}")
}

fn need_tag(n: &Need) -> String {
    match n {
        Need::Key(k) => k.clone(),
        Need::Subtree(k) => subtree_tag(k),
    }
}

/// Applies one batch and acknowledges what was handled. `Err(Fenced)` means the lease is lost:
/// the caller ends the slice.
pub async fn apply_batch(
    filer: &dyn Filer,
    storage: &dyn RemoteStorage,
    source: &dyn EventSource,
    ctx: &ApplyContext<'_>,
    deliveries: Vec<Delivery>,
    counters: &mut Counters,
) -> Result<BatchReport> {
    let map = KeyMap::new(&ctx.mount.dir, &ctx.mount.location.path)?;
    let mut report = BatchReport::default();
    counters.received += deliveries.len() as u64;
    // Per delivery: the keys it needs handled; `None` = malformed, never acknowledged.
    let mut needs: Vec<Option<BTreeSet<Need>>> = Vec::with_capacity(deliveries.len());
    let mut event_times: BTreeMap<String, i64> = BTreeMap::new();
    for d in &deliveries {
        match decode(ctx.provider, d) {
            Decoded::Malformed { reason } => {
                // Said as what happens next: the queue delivers it again, or — its last receive —
                // moves it to the dead-letter queue.
                match ctx.max_receives {
                    Some(max) if d.receive_count >= max => tracing::warn!(
                        source = %source.describe(), %reason, receive_count = d.receive_count, max_receives = max,
                        "malformed message, its last receive: it goes to the dead-letter queue next"
                    ),
                    _ => tracing::warn!(
                        source = %source.describe(), %reason, receive_count = d.receive_count,
                        max_receives = ctx.max_receives, "malformed message left to redeliver"
                    ),
                }
                counters.fail("malformed message");
                needs.push(None);
            }
            Decoded::Test => {
                counters.ignore("test event");
                needs.push(Some(BTreeSet::new()));
            }
            Decoded::Ignored { reason } => {
                counters.ignore(&reason);
                needs.push(Some(BTreeSet::new()));
            }
            Decoded::Events { events } => {
                let mut keys = BTreeSet::new();
                for e in events {
                    if e.bucket != ctx.mount.location.bucket {
                        counters.ignore("another bucket");
                    } else if !e.key.starts_with(map.prefix()) {
                        counters.ignore("outside the mount's prefix");
                    } else if !ctx.event_types.wants(&e.kind) {
                        counters.ignore("event type not subscribed");
                    } else if map.key_to_path(e.key.as_bytes()).is_err() {
                        counters.ignore("key refused by the mapping");
                    } else {
                        if let Some(t) = e.event_time_ms {
                            event_times.entry(e.key.clone()).and_modify(|x| *x = (*x).min(t)).or_insert(t);
                        }
                        keys.insert(if e.subtree { Need::Subtree(e.key) } else { Need::Key(e.key) });
                    }
                }
                needs.push(Some(keys));
            }
        }
    }

    // Per key, when its latest notification here was sent (`None` if a queue did not say).
    let mut sent_by: BTreeMap<String, Option<i64>> = BTreeMap::new();
    let mut subtrees: BTreeSet<String> = BTreeSet::new();
    for (d, need) in deliveries.iter().zip(&needs) {
        for need in need.iter().flatten() {
            let key = match need {
                Need::Key(k) => k,
                Need::Subtree(k) => {
                    subtrees.insert(k.clone());
                    continue;
                }
            };
            sent_by
                .entry(key.clone())
                .and_modify(|s| *s = s.zip(d.sent_at_ms).map(|(a, b)| a.max(b)))
                .or_insert(d.sent_at_ms);
        }
    }
    let work = async {
        let mut out = apply_keys(filer, storage, &map, ctx, sent_by.into_iter().collect(), counters).await?;
        // Subtrees after the single keys: a reconcile of one sees whatever they wrote.
        for key in &subtrees {
            let Ok(mapped) = map.key_to_path(key.as_bytes()) else { continue };
            let result = match apply_subtree(filer, storage, ctx, mapped.path()).await {
                Ok(changed) => KeyResult::Done(None, changed),
                Err(e) => KeyResult::Transient(write_failed(e)?),
            };
            out.push((subtree_tag(key), result));
        }
        Ok::<_, Error>(out)
    };
    let in_flight: Vec<String> =
        deliveries.iter().zip(&needs).filter(|(_, n)| n.is_some()).map(|(d, _)| d.ack_id.clone()).collect();
    let results = with_heartbeat(source, &in_flight, ctx.visibility, work).await?;
    let mut transient: BTreeMap<String, String> = BTreeMap::new();
    for (key, r) in results {
        match r {
            KeyResult::Done(main, more) => {
                for (_, outcome) in main.iter().chain(&more) {
                    match outcome {
                        Outcome::Skipped(SkipReason::Echo) => counters.echo_suppressed += 1,
                        Outcome::Skipped(SkipReason::Conflict) => counters.shadowed += 1,
                        o if o.is_change() => counters.changes += 1,
                        _ => {}
                    }
                }
                report.outcomes.extend(more);
                let Some((path, outcome)) = main else { continue };
                if let Some(t) = event_times.get(&key) {
                    let lag = (ctx.clock.now_ms() - t).max(0);
                    counters.lag(lag);
                    report.lags_ms.push(lag);
                }
                report.outcomes.push((path, outcome));
            }
            KeyResult::Transient(why) => {
                transient.insert(key, why);
            }
        }
    }

    let mut to_ack = Vec::new();
    for (d, need) in deliveries.iter().zip(&needs) {
        match need {
            None => report.left += 1,
            Some(keys) => match keys.iter().find_map(|n| transient.get(&need_tag(n))) {
                Some(why) => {
                    counters.fail(why.split(':').next().unwrap_or("transient"));
                    tracing::info!(source = %source.describe(), reason = %why, "message released to retry");
                    // Best effort: if the release fails the visibility timeout brings it back.
                    let _ = source.release(&d.ack_id, ctx.retry_delay).await;
                    report.left += 1;
                }
                None => {
                    if !keys.is_empty() {
                        counters.applied += 1;
                    }
                    to_ack.push(d.ack_id.clone());
                }
            },
        }
    }
    if !to_ack.is_empty() {
        let r = source.ack(&to_ack).await?;
        report.acked = r.acked.len() + r.gone.len();
        for (id, why) in &r.failed {
            tracing::warn!(source = %source.describe(), ack_id = %id, reason = %why, "acknowledgement refused; the message will come back");
        }
    }
    Ok(report)
}

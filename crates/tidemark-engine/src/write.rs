//! From a decision to a committed write. Every write is conditional on the local state the
//! decision saw (absent, or the exact version); if a concurrent local write changed it, the
//! entry is read again and decided again (bounded), so a local write is never clobbered.

use tidemark_core::decide::{Action, DecideCtx, RemoteSide, SkipReason, Tombstone, decide, needs_metadata};
use tidemark_core::model::{Entry, Fence, MAX_BATCH, Origin, Precondition, Txn, TxnBatch};
use tidemark_core::remote::{RemoteObject, system_paths};
use tidemark_core::{Error, Filer, RemoteStorage, Result};

/// How often a key is decided again after losing a race with a local write.
pub const MAX_REDECIDE: usize = 4;

/// What happened to one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Created,
    Updated,
    Deleted,
    Skipped(SkipReason),
    /// A directory marker's object is gone but entries remain below it: the directory stays.
    KeptNonEmptyDir,
}

impl Outcome {
    pub fn label(&self) -> String {
        match self {
            Outcome::Created => "create".into(),
            Outcome::Updated => "update".into(),
            Outcome::Deleted => "delete".into(),
            Outcome::Skipped(r) => format!("skip: {}", r.as_str()),
            Outcome::KeptNonEmptyDir => "skip: directory not empty".into(),
        }
    }

    pub fn is_change(&self) -> bool {
        matches!(self, Outcome::Created | Outcome::Updated | Outcome::Deleted)
    }
}

/// The outcome `action` would have, without writing anything (for `-dryRun`).
pub fn outcome_of(action: &Action) -> Outcome {
    match action {
        Action::Create(_) => Outcome::Created,
        Action::Update(_) => Outcome::Updated,
        Action::Delete => Outcome::Deleted,
        Action::Skip(r) => Outcome::Skipped(*r),
    }
}

/// How a `decide_and_write` may write.
#[derive(Clone, Copy)]
pub struct WriteRules<'a> {
    /// Every write carries this fence (a slice's lease).
    pub fence: Option<&'a Fence>,
    /// Whether an entry whose object is gone may be deleted (`remote.meta.sync -delete`).
    pub allow_delete: bool,
    /// Whether users' deletes leave tombstones here (the mount syncs), so an absent entry's
    /// tombstone must be looked at before it is re-created.
    pub check_tombstones: bool,
    /// The bucket, to HEAD an object a listing gave without its user metadata when the decision
    /// depends on it (an absent entry with a tombstone: is the object this cluster's upload of
    /// that path?), so that a reconcile decides exactly as an event's apply does.
    pub heads: Option<&'a dyn RemoteStorage>,
}

/// The object behind `remote` with its user metadata, if the decision needs it and a listing
/// left it out: `Some(what a HEAD says now)`; `None` when `remote` will do.
async fn head_if_needed(
    local: Option<&Entry>,
    remote: Option<RemoteSide<'_>>,
    tombstone: Option<&Tombstone>,
    heads: Option<&dyn RemoteStorage>,
) -> Result<Option<Option<RemoteObject>>> {
    match (remote, heads) {
        (Some(r), Some(storage)) if needs_metadata(local, remote, tombstone) => {
            Ok(Some(storage.stat(&r.object.key).await?))
        }
        _ => Ok(None),
    }
}

/// `remote`, or what a HEAD made in its place said (`head_if_needed`).
fn side<'x>(remote: Option<RemoteSide<'x>>, headed: &'x Option<Option<RemoteObject>>) -> Option<RemoteSide<'x>> {
    match headed {
        Some(h) => {
            h.as_ref().map(|object| RemoteSide { object, is_dir_marker: remote.is_some_and(|r| r.is_dir_marker) })
        }
        None => remote,
    }
}

/// Decides `path` against `remote` starting from `local`, and writes the decision through the
/// filer's conditional (and, with `rules.fence`, fenced) transaction. `rules.allow_delete: false`
/// turns a delete into a skip (`remote.meta.sync -delete=false`).
pub async fn decide_and_write(
    filer: &dyn Filer,
    path: &str,
    mut local: Option<Entry>,
    remote: Option<RemoteSide<'_>>,
    ctx: &DecideCtx<'_>,
    rules: WriteRules<'_>,
) -> Result<Outcome> {
    let WriteRules { fence, allow_delete, check_tombstones, heads } = rules;
    let mut headed = None;
    for _ in 0..MAX_REDECIDE {
        // Looked up whenever the entry is absent — also after a conditional write found it
        // deleted meanwhile: a user's delete that the outbound sync has not propagated yet keeps
        // the entry from coming back.
        let tomb = match (&local, remote) {
            (None, Some(_)) if check_tombstones && ctx.tombstone.is_none() => {
                crate::docs::tombstone(filer, path).await?
            }
            _ => None,
        };
        let ctx = &DecideCtx { tombstone: ctx.tombstone.or(tomb.as_ref()), ..*ctx };
        if headed.is_none() {
            headed = head_if_needed(local.as_ref(), remote, ctx.tombstone, heads).await?;
        }
        let (outcome, txn) = match plan(path, local.as_ref(), side(remote, &headed), ctx, allow_delete) {
            (outcome, Some(txn)) => (outcome, txn),
            (outcome, None) => return Ok(outcome),
        };
        let txn = match fence {
            Some(f) => txn.with_fence(f.clone()),
            None => txn,
        };
        match filer.apply(txn).await {
            Ok(_) => return Ok(outcome),
            Err(Error::PreconditionFailed { .. }) => local = filer.stat(path).await?,
            Err(e) => return settled(e, &outcome),
        }
    }
    Err(Error::Unavailable {
        message: format!("{path}: changed locally {MAX_REDECIDE} times while being synced; it will be retried"),
    })
}

/// Decides `path`: the outcome, and the transaction that makes it — conditional on the entry as
/// decided on, without a fence — or `None` when there is nothing to write.
fn plan(
    path: &str,
    local: Option<&Entry>,
    remote: Option<RemoteSide<'_>>,
    ctx: &DecideCtx<'_>,
    allow_delete: bool,
) -> (Outcome, Option<Txn>) {
    let action = decide(local, remote, ctx);
    let outcome = outcome_of(&action);
    let txn = match action {
        Action::Skip(r) => return (Outcome::Skipped(r), None),
        Action::Delete if !allow_delete => return (Outcome::Skipped(SkipReason::InSync), None),
        Action::Create(entry) | Action::Update(entry) => Txn::put(path, entry, Origin::Remote),
        Action::Delete => Txn::delete(path, false, Origin::Remote),
    };
    let precondition = local.map_or(Precondition::Absent, |e| Precondition::Version(e.version));
    (outcome, Some(txn.with_precondition(precondition)))
}

/// What a write refused for a reason other than its precondition means for the key.
fn settled(e: Error, outcome: &Outcome) -> Result<Outcome> {
    match e {
        Error::NotADirectory { .. } => Ok(Outcome::Skipped(SkipReason::Conflict)),
        Error::DirectoryNotEmpty { .. } if *outcome == Outcome::Deleted => Ok(Outcome::KeptNonEmptyDir),
        // A file where the remote has a directory (or the reverse) with children below it.
        Error::DirectoryNotEmpty { .. } => Ok(Outcome::Skipped(SkipReason::Conflict)),
        e => Err(e),
    }
}

/// One path to decide and write in a batch: the entry as read before the remote side was.
pub struct Pending<'r> {
    pub path: String,
    pub local: Option<Entry>,
    pub remote: Option<RemoteSide<'r>>,
}

/// What became of one path of a batch: its outcome, and the entry's version it left (`None`
/// inside: no entry) where that is known — not for a path decided again alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub outcome: Outcome,
    pub version: Option<Option<u64>>,
}

/// The entries at `paths`, in order, in as few batched reads as the batch limit allows.
pub async fn stat_all(filer: &dyn Filer, paths: &[String]) -> Result<Vec<Option<Entry>>> {
    let mut out = Vec::with_capacity(paths.len());
    for chunk in paths.chunks(MAX_BATCH) {
        out.extend(filer.stat_many(chunk).await?);
    }
    Ok(out)
}

/// [`decide_and_write`] for many paths at once: every decision is made, then every write goes
/// through one batched transaction (per [`MAX_BATCH`]) carrying the fence — so a batch costs
/// one commit, not one per path. A path whose write lost a race with a local write (its
/// precondition failed) is decided again on its own, as `decide_and_write` would. The result is
/// one outcome per item, in order; `Err` for the whole call when the fence failed (nothing of
/// that batch landed) or the filer could not be reached.
pub async fn decide_and_write_many(
    filer: &dyn Filer,
    items: Vec<Pending<'_>>,
    ctx: &DecideCtx<'_>,
    rules: WriteRules<'_>,
) -> Result<Vec<Result<Written>>> {
    let tombstones = tombstones_of(filer, &items, ctx, rules).await?;
    let mut headed = Vec::with_capacity(items.len());
    for (item, tomb) in items.iter().zip(&tombstones) {
        let tomb = ctx.tombstone.or(tomb.as_ref());
        headed.push(head_if_needed(item.local.as_ref(), item.remote, tomb, rules.heads).await?);
    }
    let mut out: Vec<Option<Result<Written>>> = Vec::with_capacity(items.len());
    // (item index, the outcome its write stands for)
    let mut written: Vec<(usize, Outcome)> = Vec::new();
    let mut txns = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let ctx = &DecideCtx { tombstone: ctx.tombstone.or(tombstones[i].as_ref()), ..*ctx };
        match plan(&item.path, item.local.as_ref(), side(item.remote, &headed[i]), ctx, rules.allow_delete) {
            (outcome, None) => {
                let version = Some(item.local.as_ref().map(|e| e.version));
                out.push(Some(Ok(Written { outcome, version })));
            }
            (outcome, Some(txn)) => {
                out.push(None);
                written.push((i, outcome));
                txns.push(txn);
            }
        }
    }
    let mut results = Vec::with_capacity(txns.len());
    let mut txns = txns.into_iter().peekable();
    while txns.peek().is_some() {
        let chunk: Vec<Txn> = txns.by_ref().take(MAX_BATCH).collect();
        results.extend(filer.apply_many(TxnBatch { fence: rules.fence.cloned(), txns: chunk }).await?);
    }
    for ((i, outcome), result) in written.into_iter().zip(results) {
        let item = &items[i];
        let unknown = |outcome| Written { outcome, version: None };
        out[i] = Some(match result {
            Ok(a) => Ok(Written { outcome, version: Some(a.new.map(|e| e.version)) }),
            // A local write landed since the entry was read: decide this one again, alone.
            Err(Error::PreconditionFailed { .. }) => match filer.stat(&item.path).await {
                Ok(local) => {
                    let remote = side(item.remote, &headed[i]);
                    decide_and_write(filer, &item.path, local, remote, ctx, rules).await.map(unknown)
                }
                Err(e) => Err(e),
            },
            Err(e) => settled(e, &outcome).map(unknown),
        });
    }
    Ok(out.into_iter().map(|o| o.unwrap_or_else(|| Err(Error::internal("a batched write has no result")))).collect())
}

/// The tombstones that bear on `items` (absent entries with an object) where users' deletes
/// leave them, found with one batched read of their paths; only the ones that exist are read.
async fn tombstones_of(
    filer: &dyn Filer,
    items: &[Pending<'_>],
    ctx: &DecideCtx<'_>,
    rules: WriteRules<'_>,
) -> Result<Vec<Option<Tombstone>>> {
    let mut found: Vec<Option<Tombstone>> = items.iter().map(|_| None).collect();
    if !rules.check_tombstones || ctx.tombstone.is_some() {
        return Ok(found);
    }
    let wanted: Vec<usize> =
        items.iter().enumerate().filter(|(_, it)| it.local.is_none() && it.remote.is_some()).map(|(i, _)| i).collect();
    if wanted.is_empty() {
        return Ok(found);
    }
    let paths: Vec<String> = wanted.iter().map(|&i| system_paths::tombstone(&items[i].path)).collect();
    let present = stat_all(filer, &paths).await?;
    for (&i, entry) in wanted.iter().zip(present) {
        if entry.is_some() {
            found[i] = crate::docs::tombstone(filer, &items[i].path).await?;
        }
    }
    Ok(found)
}

//! From a decision to a committed write. Every write is conditional on the local state the
//! decision saw (absent, or the exact version); if a concurrent local write changed it, the
//! entry is read again and decided again (bounded), so a local write is never clobbered.

use tidemark_core::decide::{Action, DecideCtx, RemoteSide, SkipReason, decide};
use tidemark_core::model::{Entry, Fence, Origin, Precondition, Txn};
use tidemark_core::{Error, Filer, Result};

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

/// Decides `path` against `remote` starting from `local`, and writes the decision through the
/// filer's conditional (and, with `fence`, fenced) transaction. `allow_delete: false` turns a
/// delete into a skip (`remote.meta.sync -delete=false`).
/// How a `decide_and_write` may write.
#[derive(Debug, Clone, Copy)]
pub struct WriteRules<'a> {
    /// Every write carries this fence (a slice's lease).
    pub fence: Option<&'a Fence>,
    /// Whether an entry whose object is gone may be deleted (`remote.meta.sync -delete`).
    pub allow_delete: bool,
    /// Whether users' deletes leave tombstones here (the mount syncs), so an absent entry's
    /// tombstone must be looked at before it is re-created.
    pub check_tombstones: bool,
}

pub async fn decide_and_write(
    filer: &dyn Filer,
    path: &str,
    mut local: Option<Entry>,
    remote: Option<RemoteSide<'_>>,
    ctx: &DecideCtx<'_>,
    rules: WriteRules<'_>,
) -> Result<Outcome> {
    let WriteRules { fence, allow_delete, check_tombstones } = rules;
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
        let action = decide(local.as_ref(), remote, ctx);
        let precondition = local.as_ref().map_or(Precondition::Absent, |e| Precondition::Version(e.version));
        let outcome = outcome_of(&action);
        let txn = match action {
            Action::Skip(r) => return Ok(Outcome::Skipped(r)),
            Action::Delete if !allow_delete => return Ok(Outcome::Skipped(SkipReason::InSync)),
            Action::Create(entry) | Action::Update(entry) => Txn::put(path, entry, Origin::Remote),
            Action::Delete => Txn::delete(path, false, Origin::Remote),
        };
        let txn = txn.with_precondition(precondition);
        let txn = match fence {
            Some(f) => txn.with_fence(f.clone()),
            None => txn,
        };
        match filer.apply(txn).await {
            Ok(_) => return Ok(outcome),
            Err(Error::PreconditionFailed { .. }) => local = filer.stat(path).await?,
            Err(Error::NotADirectory { .. }) => return Ok(Outcome::Skipped(SkipReason::Conflict)),
            Err(Error::DirectoryNotEmpty { .. }) if outcome == Outcome::Deleted => return Ok(Outcome::KeptNonEmptyDir),
            // A file where the remote has a directory (or the reverse) with children below it.
            Err(Error::DirectoryNotEmpty { .. }) => return Ok(Outcome::Skipped(SkipReason::Conflict)),
            Err(e) => return Err(e),
        }
    }
    Err(Error::Unavailable {
        message: format!("{path}: changed locally {MAX_REDECIDE} times while being synced; it will be retried"),
    })
}

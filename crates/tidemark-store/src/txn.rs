//! The transaction logic every backend shares: what `apply` and the lease operations check and
//! write, over a handful of row operations ([`TxnOps`]) that each backend implements inside its
//! own database transaction. Keeping the rules here, once, is what makes "passes the same
//! conformance suite" mean "behaves the same".
//!
//! A backend runs each mutation as one serialised transaction (SQLite: `BEGIN IMMEDIATE` on the
//! one writer; PostgreSQL: the sequence counter's row locked `FOR UPDATE` first), reads the
//! sequence counter at its start, hands the ops to a function here, and, if it succeeds, stores
//! the counter back and commits.

use tidemark_core::cache::{self, CachedChunk};
use tidemark_core::model::{
    Applied, Content, Entry, EntryKind, Fence, INODES_DIR, Lease, Mutation, NewEntry, Origin, PosixAttrs, Precondition,
    RemoteEntry, Txn, TxnBatch, inode_of_path, inode_path,
};
use tidemark_core::{Error, Result, path};

/// The row operations of one open transaction. Reads see the transaction's own writes.
pub(crate) trait TxnOps {
    /// Reads ahead the entries of `paths` where one read for many saves round trips (a batch's
    /// paths and their ancestors); a backend whose reads are local need not.
    async fn prefetch(&mut self, _paths: &[&str]) -> Result<()> {
        Ok(())
    }
    async fn entry(&mut self, path: &str) -> Result<Option<Entry>>;
    /// The entries of `paths` that exist, in any order (one round trip where the backend can).
    async fn entries(&mut self, paths: &[&str]) -> Result<Vec<Entry>>;
    /// Entries strictly below `dir`, in byte order, at most `limit` (all when `None`).
    async fn descendants(&mut self, dir: &str, limit: Option<i64>) -> Result<Vec<Entry>>;
    async fn inline_data(&mut self, path: &str) -> Result<Option<Vec<u8>>>;
    /// The inline bytes of those of `paths` that have them (one round trip where the backend can:
    /// a rename reads a whole tree's).
    async fn inline_data_many(&mut self, paths: &[&str]) -> Result<std::collections::HashMap<String, Vec<u8>>> {
        let mut out = std::collections::HashMap::new();
        for p in paths {
            if let Some(d) = self.inline_data(p).await? {
                out.insert(p.to_string(), d);
            }
        }
        Ok(out)
    }
    async fn put_row(&mut self, entry: &Entry, data: Option<&[u8]>) -> Result<()>;
    async fn delete_row(&mut self, path: &str) -> Result<()>;
    async fn log_change(&mut self, change: Change<'_>) -> Result<()>;
    async fn lease(&mut self, name: &str) -> Result<Option<Lease>>;
    async fn put_lease(&mut self, lease: &Lease) -> Result<()>;
    /// Removes every node's cache records of `path`.
    async fn drop_cache(&mut self, path: &str) -> Result<()>;
    /// Inserts or replaces one cache record.
    async fn put_cache(&mut self, chunk: &CachedChunk) -> Result<()>;
    /// The transaction's sequence counter: read at its start, stored back at commit.
    fn seq_mut(&mut self) -> &mut u64;

    /// Hands out the next sequence number.
    fn next_seq(&mut self) -> u64 {
        let seq = self.seq_mut();
        *seq += 1;
        *seq
    }

    fn current_seq(&mut self) -> u64 {
        *self.seq_mut()
    }
}

/// One change-log record about to be written.
pub(crate) struct Change<'a> {
    pub seq: u64,
    pub ts_ms: i64,
    pub path: &'a str,
    pub origin: Origin,
    pub old: Option<&'a Entry>,
    pub new: Option<&'a Entry>,
    /// A rename's removal of the entry at `path`: where it went.
    pub moved_to: Option<&'a str>,
}

/// The parent column of a row (`""` for the root).
pub(crate) fn parent_of(p: &str) -> &str {
    path::parent(p).unwrap_or("")
}

/// Decodes a stored row; the path and version columns are authoritative over the JSON.
pub(crate) fn row_to_entry(path: String, version: i64, meta: &str) -> Result<Entry> {
    let mut e: Entry = serde_json::from_str(meta).map_err(json_err)?;
    e.path = path;
    e.version = version as u64;
    Ok(e)
}

pub(crate) fn json_err(e: serde_json::Error) -> Error {
    Error::internal(format!("stored record is not valid JSON: {e}"))
}

/// The root directory every store starts with (written by the first migration).
pub(crate) fn root_entry(now_ms: i64) -> Entry {
    Entry {
        path: path::ROOT.into(),
        kind: EntryKind::Dir,
        size: 0,
        mtime_ms: now_ms,
        mode: tidemark_core::model::DEFAULT_DIR_MODE,
        version: 0,
        remote: None,
        content: Content::Empty,
        extended: Default::default(),
        posix: Default::default(),
    }
}

/// The checks of a batched read: its size and every path.
pub(crate) fn check_many(paths: &[String]) -> Result<()> {
    if paths.len() > tidemark_core::model::MAX_BATCH {
        return Err(Error::invalid_argument(format!(
            "a read of {} paths exceeds the limit of {}; split it",
            paths.len(),
            tidemark_core::model::MAX_BATCH
        )));
    }
    paths.iter().try_for_each(|p| path::validate(p))
}

/// The fence holds if the lease names this holder and generation and has not expired.
async fn check_fence(ops: &mut impl TxnOps, fence: &Fence, now_ms: i64) -> Result<Lease> {
    match ops.lease(&fence.lease).await? {
        Some(l) if l.holder == fence.holder && l.generation == fence.generation && l.expires_at_ms > now_ms => Ok(l),
        other => Err(Error::Fenced { lease: fence.lease.clone(), current_generation: other.map(|l| l.generation) }),
    }
}

/// `MetaStore::apply`: fence, precondition, implicit parents, the write, its change-log records.
pub(crate) async fn apply(ops: &mut impl TxnOps, txn: Txn, now_ms: i64) -> Result<Applied> {
    txn.validate()?;
    if let Some(f) = &txn.fence {
        check_fence(ops, f, now_ms).await?;
    }
    apply_unfenced(ops, txn, now_ms).await
}

/// `MetaStore::apply_many`: the shape of the batch, its fence once, then each transaction on
/// its own. A transaction's own failure (its precondition, a conflict, a malformed entry) is its
/// result; a failure of the store itself fails the whole batch, which the backend rolls back.
pub(crate) async fn apply_many(ops: &mut impl TxnOps, batch: TxnBatch, now_ms: i64) -> Result<Vec<Result<Applied>>> {
    batch.validate()?;
    if let Some(f) = &batch.fence {
        check_fence(ops, f, now_ms).await?;
    }
    ops.prefetch(&reads_of(&batch.txns)).await?;
    let mut out = Vec::with_capacity(batch.txns.len());
    for txn in batch.txns {
        match txn.validate() {
            Ok(()) => match apply_unfenced(ops, txn, now_ms).await {
                Err(e) if is_store_failure(&e) => return Err(e),
                r => out.push(r),
            },
            Err(e) => out.push(Err(e)),
        }
    }
    Ok(out)
}

/// The entries transactions read, whatever their outcome: each path and its ancestors.
pub(crate) fn reads_of(txns: &[Txn]) -> Vec<&str> {
    let mut ahead: Vec<&str> = Vec::new();
    for t in txns {
        if path::validate(&t.path).is_ok() {
            ahead.push(&t.path);
            ahead.extend(path::ancestors(&t.path));
        }
    }
    ahead
}

/// Failures of the store rather than of a transaction's own checks: they end a batch.
pub(crate) fn is_store_failure(e: &Error) -> bool {
    matches!(e, Error::Internal { .. } | Error::Io { .. } | Error::Unavailable { .. })
}

/// Everything of `apply` after the fence. Every check comes before the first write, so a
/// transaction that fails its checks has written nothing — which is what lets a batch's
/// transactions fail alone without a savepoint each.
async fn apply_unfenced(ops: &mut impl TxnOps, txn: Txn, now_ms: i64) -> Result<Applied> {
    if !txn.dir_times {
        return apply_mutation(ops, txn, now_ms).await;
    }
    let origin = txn.origin;
    let mut dirs: Vec<String> = path::parent(&txn.path).map(str::to_string).into_iter().collect();
    if let Mutation::Link { to } = &txn.mutation {
        // The link's source keeps its name: only the new name's directory changes.
        dirs = path::parent(to).map(str::to_string).into_iter().collect();
    }
    if let Mutation::Rename { to, .. } = &txn.mutation
        && let Some(d) = path::parent(to)
        && !dirs.iter().any(|x| x == d)
    {
        dirs.push(d.to_string());
    }
    let is_put = matches!(txn.mutation, Mutation::Put { .. });
    let mut applied = apply_mutation(ops, txn, now_ms).await?;
    // A put that replaced an entry changed no name.
    if is_put && applied.old.is_some() {
        return Ok(applied);
    }
    for d in dirs {
        if let Some(dir) = touch_dir(ops, &d, now_ms, origin, applied.first_seq).await? {
            applied.seq = dir.version;
            applied.dirs.push(dir);
        }
    }
    Ok(applied)
}

/// Sets the mtime and ctime of directory `dir` to now (a name in it was added or removed), with
/// its record; not a directory this transaction created (from `since_seq` on), which is new anyway.
async fn touch_dir(
    ops: &mut impl TxnOps,
    dir: &str,
    now_ms: i64,
    origin: Origin,
    since_seq: u64,
) -> Result<Option<Entry>> {
    let Some(d) = ops.entry(dir).await? else { return Ok(None) };
    if !d.is_dir() || d.version >= since_seq {
        return Ok(None);
    }
    let mut n = d.to_new();
    // Its atime was its mtime until now: it stays what it was.
    n.posix.atime_ms = Some(d.posix.atime_ms.unwrap_or(d.mtime_ms));
    n.mtime_ms = now_ms.max(d.mtime_ms);
    n.posix.ctime_ms = None;
    rewrite(ops, &d, n, now_ms, origin).await.map(Some)
}

/// The mutation of `apply_unfenced`, without the directories' times.
async fn apply_mutation(ops: &mut impl TxnOps, txn: Txn, now_ms: i64) -> Result<Applied> {
    let first_seq = ops.current_seq() + 1;
    let current = ops.entry(&txn.path).await?;
    if !holds(ops, current.as_ref(), txn.precondition).await? {
        return Err(Error::PreconditionFailed { path: txn.path.clone(), current: current.map(|e| e.version) });
    }
    let origin = txn.origin;
    fn change<'a>(
        seq: u64,
        ts_ms: i64,
        origin: Origin,
        path: &'a str,
        old: Option<&'a Entry>,
        new: Option<&'a Entry>,
    ) -> Change<'a> {
        Change { seq, ts_ms, path, origin, old, new, moved_to: None }
    }
    // The inode entries of hard-linked files are the store's to create, move and remove.
    let in_inodes = |p: &str| path::is_within(p, INODES_DIR);
    match &txn.mutation {
        Mutation::Put { .. } if current.is_none() && in_inodes(&txn.path) => {
            return Err(Error::not_found(&txn.path));
        }
        Mutation::Delete { .. } if in_inodes(&txn.path) => {
            return Err(refused_in_inodes(&txn.path));
        }
        Mutation::Rename { to, .. } | Mutation::Link { to } if in_inodes(to) => {
            return Err(refused_in_inodes(to));
        }
        Mutation::Rename { .. } if in_inodes(&txn.path) => {
            return Err(refused_in_inodes(&txn.path));
        }
        _ => {}
    }
    match &txn.mutation {
        Mutation::Put { entry, data } => {
            // An inode's count of names is the store's, whatever the put says; a put over a name
            // replaces that name.
            let nlink = current.as_ref().filter(|c| c.posix.inode.is_none()).and_then(|c| c.posix.nlink);
            let entry = match entry.posix.nlink == nlink {
                true => std::borrow::Cow::Borrowed(entry),
                false => {
                    let mut e = entry.clone();
                    e.posix.nlink = nlink;
                    std::borrow::Cow::Owned(e)
                }
            };
            let entry = entry.as_ref();
            // The checks.
            let ancestors = path::ancestors(&txn.path);
            let existing = ops.entries(&ancestors).await?;
            let mut missing = Vec::new();
            for anc in ancestors {
                match existing.iter().find(|e| e.path == anc) {
                    Some(e) if e.is_dir() => {}
                    Some(_) => return Err(Error::NotADirectory { path: anc.to_string() }),
                    None => missing.push(anc),
                }
            }
            if let Some(cur) = &current
                && cur.is_dir()
                && entry.kind != EntryKind::Dir
                && !ops.descendants(&txn.path, Some(1)).await?.is_empty()
            {
                return Err(Error::DirectoryNotEmpty { path: txn.path.clone() });
            }
            let kept: Option<Vec<u8>> = match (&entry.content, data) {
                (Content::Inline, None) => {
                    let bytes = match &current {
                        Some(cur) if cur.content == Content::Inline => ops.inline_data(&txn.path).await?,
                        _ => None,
                    };
                    match bytes {
                        Some(b) if b.len() as u64 == entry.size => Some(b),
                        Some(_) => {
                            return Err(Error::invalid_argument(
                                "a metadata update cannot change the size of inline content",
                            ));
                        }
                        None => {
                            return Err(Error::invalid_argument(
                                "inline content without data, and the entry has none to keep",
                            ));
                        }
                    }
                }
                _ => None,
            };
            // The writes.
            for anc in missing {
                let seq = ops.next_seq();
                let dir = materialise(anc, seq, implied_parent(entry));
                ops.put_row(&dir, None).await?;
                ops.log_change(change(seq, now_ms, origin, anc, None, Some(&dir))).await?;
            }
            let seq = ops.next_seq();
            let new = materialise(&txn.path, seq, entry.clone());
            ops.put_row(&new, data.as_deref().or(kept.as_deref())).await?;
            // The old version's cached bytes become unreachable in this same commit.
            if let Some(cur) = &current
                && cache::invalidates(cur, Some(&new))
            {
                ops.drop_cache(&txn.path).await?;
            }
            ops.log_change(change(seq, now_ms, origin, &txn.path, current.as_ref(), Some(&new))).await?;
            if let Some(id) = current.as_ref().and_then(|c| c.posix.inode) {
                unlink_inode(ops, id, now_ms, origin).await?;
            }
            Ok(Applied { first_seq, seq, old: current, new: Some(new), dirs: Vec::new() })
        }
        Mutation::Delete { recursive } => {
            let Some(cur) = current else {
                return Err(Error::not_found(&txn.path));
            };
            let below = if cur.is_dir() { ops.descendants(&txn.path, None).await? } else { Vec::new() };
            if !below.is_empty() && !recursive {
                return Err(Error::DirectoryNotEmpty { path: txn.path.clone() });
            }
            // Reverse byte order removes every child before its parent, so a follower of the
            // change log never sees a directory deleted while something below it remains.
            for child in below.iter().rev() {
                let seq = ops.next_seq();
                ops.delete_row(&child.path).await?;
                if cache::invalidates(child, None) {
                    ops.drop_cache(&child.path).await?;
                }
                ops.log_change(change(seq, now_ms, origin, &child.path, Some(child), None)).await?;
            }
            let seq = ops.next_seq();
            ops.delete_row(&txn.path).await?;
            if cache::invalidates(&cur, None) {
                ops.drop_cache(&txn.path).await?;
            }
            ops.log_change(change(seq, now_ms, origin, &txn.path, Some(&cur), None)).await?;
            for id in below.iter().chain(std::iter::once(&cur)).filter_map(|e| e.posix.inode) {
                unlink_inode(ops, id, now_ms, origin).await?;
            }
            let seq = ops.current_seq();
            Ok(Applied { first_seq, seq, old: Some(cur), new: None, dirs: Vec::new() })
        }
        Mutation::Rename { to, to_precondition } => {
            let Some(src) = current else {
                return Err(Error::not_found(&txn.path));
            };
            // The checks, as rename(2) makes them.
            let dest = ops.entry(to).await?;
            if !holds(ops, dest.as_ref(), *to_precondition).await? {
                return Err(Error::PreconditionFailed { path: to.clone(), current: dest.map(|e| e.version) });
            }
            let parent = path::parent(to).unwrap_or(path::ROOT);
            match ops.entry(parent).await? {
                Some(p) if p.is_dir() => {}
                Some(_) => return Err(Error::NotADirectory { path: parent.to_string() }),
                None => return Err(Error::not_found(parent)),
            }
            if let (Some(a), Some(d)) = (src.posix.inode, dest.as_ref())
                && d.posix.inode == Some(a)
            {
                // Two names of one file: rename(2) does nothing.
                return Ok(Applied {
                    first_seq,
                    seq: ops.current_seq(),
                    old: Some(src.clone()),
                    new: Some(src),
                    dirs: Vec::new(),
                });
            }
            if let Some(d) = &dest {
                match (src.is_dir(), d.is_dir()) {
                    (true, false) => return Err(Error::NotADirectory { path: to.clone() }),
                    (false, true) => return Err(Error::IsADirectory { path: to.clone() }),
                    (true, true) if !ops.descendants(to, Some(1)).await?.is_empty() => {
                        return Err(Error::DirectoryNotEmpty { path: to.clone() });
                    }
                    _ => {}
                }
            }
            let below = if src.is_dir() { ops.descendants(&txn.path, None).await? } else { Vec::new() };
            let moved: Vec<(&Entry, String)> = std::iter::once(&src)
                .chain(below.iter())
                .map(|e| (e, format!("{to}{}", &e.path[txn.path.len()..])))
                .collect();
            let inline: Vec<&str> =
                moved.iter().filter(|(e, _)| e.content == Content::Inline).map(|(e, _)| e.path.as_str()).collect();
            let mut data_of = ops.inline_data_many(&inline).await?;
            // The writes. First every entry at its new path, parents before children (byte
            // order), so a follower of the change log never misses an entry: it sees the new
            // tree whole before the old one goes.
            let mut top = None;
            for (e, new_path) in &moved {
                let data = data_of.remove(&e.path);
                let seq = ops.next_seq();
                let mut kept = e.to_new();
                // A remote-backed entry's object stays at its old key until the outbound sync
                // puts it at the new one; it remembers where (the first old path, over several
                // renames), so reads find it and the old key is deleted only after the new one.
                if let Some(r) = kept.remote.as_mut() {
                    if r.moved_from.is_none() {
                        r.moved_from = Some(e.path.clone());
                    }
                    // This cluster's uploads of its new path are all after now: an older upload
                    // of that path (someone restoring it) is never taken for one of its own.
                    r.dirty_after = Some(seq - 1);
                }
                if new_path == to {
                    // Its name is part of its status (as ext4 and most file systems have it).
                    kept.posix.ctime_ms = Some(now_ms);
                }
                let moved_entry = materialise(new_path, seq, kept);
                ops.put_row(&moved_entry, data.as_deref()).await?;
                let replaced = if new_path == to { dest.as_ref() } else { None };
                if let Some(d) = replaced
                    && cache::invalidates(d, Some(&moved_entry))
                {
                    ops.drop_cache(to).await?;
                }
                ops.log_change(change(seq, now_ms, origin, new_path, replaced, Some(&moved_entry))).await?;
                if top.is_none() {
                    top = Some(moved_entry);
                }
            }
            // Then the old paths, children before parents, each record naming where it went.
            for (e, new_path) in moved.iter().rev() {
                let seq = ops.next_seq();
                ops.delete_row(&e.path).await?;
                if cache::invalidates(e, None) {
                    ops.drop_cache(&e.path).await?;
                }
                let c = Change { moved_to: Some(new_path), ..change(seq, now_ms, origin, &e.path, Some(e), None) };
                ops.log_change(c).await?;
            }
            if let Some(id) = dest.as_ref().and_then(|d| d.posix.inode) {
                unlink_inode(ops, id, now_ms, origin).await?;
            }
            // A hard-linked file's status is its inode's: the rename sets that ctime.
            if let Some(id) = src.posix.inode
                && let Some(inode) = ops.entry(&inode_path(id)).await?
            {
                let mut n = inode.to_new();
                n.posix.ctime_ms = Some(now_ms);
                rewrite(ops, &inode, n, now_ms, origin).await?;
            }
            let seq = ops.current_seq();
            Ok(Applied { first_seq, seq, old: Some(src), new: top, dirs: Vec::new() })
        }
        Mutation::Link { to } => {
            let Some(src) = current else {
                return Err(Error::not_found(&txn.path));
            };
            // The checks, as link(2) makes them.
            if src.is_dir() {
                return Err(Error::IsADirectory { path: txn.path.clone() });
            }
            if src.remote.is_some() {
                return Err(Error::CrossMount {
                    path: txn.path.clone(),
                    message: "its bytes are a remote object's, which has one key: it cannot have a second name".into(),
                });
            }
            if let Some(d) = ops.entry(to).await? {
                return Err(Error::PreconditionFailed { path: to.clone(), current: Some(d.version) });
            }
            let parent = path::parent(to).unwrap_or(path::ROOT);
            match ops.entry(parent).await? {
                Some(p) if p.is_dir() => {}
                Some(_) => return Err(Error::NotADirectory { path: parent.to_string() }),
                None => return Err(Error::not_found(parent)),
            }
            // The writes. The file's inode entry, made on its first second name: the entry moves
            // there (records as a rename's: its bytes live on) and a name takes its place.
            let (id, inode) = match (src.posix.inode, inode_of_path(&txn.path)) {
                (Some(id), _) | (None, Some(id)) => {
                    let inode = ops.entry(&inode_path(id)).await?.ok_or_else(|| {
                        Error::internal(format!("{}: the inode entry of hard link {id} is missing", txn.path))
                    })?;
                    (id, inode)
                }
                (None, None) => {
                    if ops.entry(INODES_DIR).await?.is_none() {
                        let seq = ops.next_seq();
                        let mut d = NewEntry::dir(now_ms);
                        d.mode = 0o700;
                        let dir = materialise(INODES_DIR, seq, d);
                        ops.put_row(&dir, None).await?;
                        ops.log_change(change(seq, now_ms, Origin::System, INODES_DIR, None, Some(&dir))).await?;
                    }
                    let data = match src.content {
                        Content::Inline => ops.inline_data(&src.path).await?,
                        _ => None,
                    };
                    let seq = ops.next_seq();
                    let ip = inode_path(seq);
                    let inode = materialise(&ip, seq, src.to_new());
                    ops.put_row(&inode, data.as_deref()).await?;
                    ops.log_change(change(seq, now_ms, origin, &ip, None, Some(&inode))).await?;
                    let gone = ops.next_seq();
                    ops.delete_row(&src.path).await?;
                    let c = Change { moved_to: Some(&ip), ..change(gone, now_ms, origin, &src.path, Some(&src), None) };
                    ops.log_change(c).await?;
                    put_name(ops, &src.path, &inode, seq, now_ms, origin).await?;
                    (seq, inode)
                }
            };
            put_name(ops, to, &inode, id, now_ms, origin).await?;
            let mut n = inode.to_new();
            n.posix.nlink = Some(inode.posix.nlink.unwrap_or(1) + 1);
            n.posix.ctime_ms = Some(now_ms);
            let inode = rewrite(ops, &inode, n, now_ms, origin).await?;
            Ok(Applied { first_seq, seq: inode.version, old: Some(src), new: Some(inode), dirs: Vec::new() })
        }
    }
}

/// Whether `pre` holds on the entry at a path (`None`: absent). A name of a hard-linked file
/// answers as its file (the filer shows the file's version under the name): a precondition on
/// that version holds on the name while the file is at it.
async fn holds(ops: &mut impl TxnOps, entry: Option<&Entry>, pre: Precondition) -> Result<bool> {
    if pre.holds(entry.map(|e| e.version)) {
        return Ok(true);
    }
    let (Some(id), Precondition::Version(v)) = (entry.and_then(|n| n.posix.inode), pre) else { return Ok(false) };
    Ok(ops.entry(&inode_path(id)).await?.is_some_and(|f| f.version == v))
}

fn refused_in_inodes(p: &str) -> Error {
    Error::invalid_argument(format!(
        "{p}: {INODES_DIR} holds the files that have several names; it changes through their names only"
    ))
}

/// A name of inode `id` (whose entry is `inode`) at `p`, with its record.
async fn put_name(ops: &mut impl TxnOps, p: &str, inode: &Entry, id: u64, now_ms: i64, origin: Origin) -> Result<()> {
    let n = NewEntry {
        kind: inode.kind,
        size: 0,
        mtime_ms: now_ms,
        mode: inode.mode,
        remote: None,
        content: Content::Empty,
        extended: Default::default(),
        posix: PosixAttrs { inode: Some(id), ..Default::default() },
    };
    let seq = ops.next_seq();
    let name = materialise(p, seq, n);
    ops.put_row(&name, None).await?;
    let c = Change { seq, ts_ms: now_ms, path: p, origin, old: None, new: Some(&name), moved_to: None };
    ops.log_change(c).await
}

/// Writes `n` over `old` at its path, keeping its inline bytes, with its record.
async fn rewrite(ops: &mut impl TxnOps, old: &Entry, n: NewEntry, now_ms: i64, origin: Origin) -> Result<Entry> {
    let data = match (&old.content, &n.content) {
        (Content::Inline, Content::Inline) => ops.inline_data(&old.path).await?,
        _ => None,
    };
    let seq = ops.next_seq();
    let new = materialise(&old.path, seq, n);
    ops.put_row(&new, data.as_deref()).await?;
    let c = Change { seq, ts_ms: now_ms, path: &old.path, origin, old: Some(old), new: Some(&new), moved_to: None };
    ops.log_change(c).await?;
    Ok(new)
}

/// A name of inode `id` went: its count goes down and its ctime is set; the last name's going
/// deletes the inode entry (and so its bytes).
async fn unlink_inode(ops: &mut impl TxnOps, id: u64, now_ms: i64, origin: Origin) -> Result<()> {
    let p = inode_path(id);
    let Some(inode) = ops.entry(&p).await? else { return Ok(()) };
    let links = inode.posix.nlink.unwrap_or(1);
    if links <= 1 {
        let seq = ops.next_seq();
        ops.delete_row(&p).await?;
        if cache::invalidates(&inode, None) {
            ops.drop_cache(&p).await?;
        }
        let c = Change { seq, ts_ms: now_ms, path: &p, origin, old: Some(&inode), new: None, moved_to: None };
        return ops.log_change(c).await;
    }
    let mut n = inode.to_new();
    n.posix.nlink = Some(links - 1);
    n.posix.ctime_ms = Some(now_ms);
    rewrite(ops, &inode, n, now_ms, origin).await.map(drop)
}

/// `MetaStore::cache_record`: only while the entry still serves the chunk's content id, so a
/// fetch that raced an invalidating write can never make the old bytes reachable again.
pub(crate) async fn cache_record(ops: &mut impl TxnOps, chunk: &CachedChunk) -> Result<bool> {
    path::validate(&chunk.path)?;
    let current = ops.entry(&chunk.path).await?;
    if current.as_ref().and_then(cache::content_id).as_deref() != Some(chunk.content_id.as_str()) {
        return Ok(false);
    }
    ops.put_cache(chunk).await?;
    Ok(true)
}

/// `MetaStore::lease_acquire`.
pub(crate) async fn lease_acquire(
    ops: &mut impl TxnOps,
    name: &str,
    holder: &str,
    ttl_ms: i64,
    now_ms: i64,
) -> Result<Lease> {
    check_ttl(ttl_ms)?;
    let current = ops.lease(name).await?;
    if let Some(l) = &current
        && l.expires_at_ms > now_ms
        && l.holder != holder
    {
        return Err(Error::LeaseHeld { lease: name.into(), holder: l.holder.clone(), expires_at_ms: l.expires_at_ms });
    }
    let lease = Lease {
        generation: current.map_or(1, |l| l.generation + 1),
        name: name.into(),
        holder: holder.into(),
        expires_at_ms: now_ms.saturating_add(ttl_ms),
    };
    ops.put_lease(&lease).await?;
    Ok(lease)
}

/// `MetaStore::lease_renew`.
pub(crate) async fn lease_renew(ops: &mut impl TxnOps, fence: &Fence, ttl_ms: i64, now_ms: i64) -> Result<Lease> {
    check_ttl(ttl_ms)?;
    let mut lease = check_fence(ops, fence, now_ms).await?;
    lease.expires_at_ms = now_ms.saturating_add(ttl_ms);
    ops.put_lease(&lease).await?;
    Ok(lease)
}

/// `MetaStore::lease_release`.
pub(crate) async fn lease_release(ops: &mut impl TxnOps, fence: &Fence) -> Result<()> {
    match ops.lease(&fence.lease).await? {
        // An expired lease that nobody has taken since is still ours to release.
        Some(mut l) if l.holder == fence.holder && l.generation == fence.generation => {
            l.expires_at_ms = 0;
            ops.put_lease(&l).await
        }
        other => Err(Error::Fenced { lease: fence.lease.clone(), current_generation: other.map(|l| l.generation) }),
    }
}

fn check_ttl(ttl_ms: i64) -> Result<()> {
    if ttl_ms <= 0 {
        return Err(Error::invalid_argument(format!("lease ttl must be positive, got {ttl_ms} ms")));
    }
    Ok(())
}

/// A directory created because an entry below it was written. Below a remote-backed entry it is
/// remote-backed too, with an empty etag: implied by the keys below it, not by a marker object,
/// so a reconcile may remove it once it is empty.
fn implied_parent(child: &NewEntry) -> NewEntry {
    let mut dir = NewEntry::dir(child.mtime_ms);
    dir.remote = child.remote.as_ref().map(|r| RemoteEntry {
        storage: r.storage.clone(),
        etag: String::new(),
        remote_mtime_ms: child.mtime_ms,
        remote_size: 0,
        version_id: None,
        last_local_sync_ms: None,
        dirty_after: None,
        moved_from: None,
    });
    dir
}

fn materialise(p: &str, version: u64, e: NewEntry) -> Entry {
    Entry {
        path: p.to_string(),
        kind: e.kind,
        size: e.size,
        mtime_ms: e.mtime_ms,
        mode: e.mode,
        version,
        remote: e.remote,
        content: e.content,
        extended: e.extended,
        posix: e.posix,
    }
}

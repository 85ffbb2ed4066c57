//! The full reconcile: `remote.meta.sync`, and the baseline, gap and scheduled reconciles of a
//! slice.
//!
//! Pass 1 is a streaming merge-join of two byte-ordered streams — the remote listing under the
//! mount's prefix and the recursive local scan of the mount's directory — holding one page of
//! each, so memory does not grow with the bucket. Files join on their path (a key and its path
//! sort alike, since the mapping only swaps a fixed prefix). Directory markers (`a/`) are looked
//! up directly, since a marker sorts elsewhere than its directory's path.
//!
//! Pass 2 (with deletes enabled) removes remote-backed directories left empty — implied ones,
//! and marker ones whose marker is gone — deepest last, walking up as parents empty too.
//!
//! Every write is conditional on the local state decided on. Files are decided in batches of
//! [`BATCH`] and each batch is written in one batched transaction ([`decide_and_write_many`]:
//! one commit, one fsync), up to [`BATCHES_IN_FLIGHT`] at once, reported in the merge's order;
//! a path waits for any ancestor of it being written (a file in a directory's place decides a
//! conflict, and the order of the two must not change the outcome), and directory markers wait
//! for all.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesOrdered;

use serde::Serialize;

use tidemark_core::decide::{Action, DecideCtx, RemoteSide, SkipReason, decide};
use tidemark_core::keymap::{KeyMap, KeyRejection, Mapped};
use tidemark_core::model::{Entry, Fence, Origin, Precondition, Txn};
use tidemark_core::remote::{Mount, RemoteObject};
use tidemark_core::{DeleteOptions, Error, Filer, RemoteStorage, Result, path};

use crate::write::{Outcome, Pending, Written, decide_and_write, decide_and_write_many, outcome_of};

#[derive(Debug, Clone)]
pub struct ReconcileOptions {
    /// Delete entries whose object is gone (`-delete`, default true).
    pub delete: bool,
    /// Decide, report, write nothing (`-dryRun`).
    pub dry_run: bool,
    /// Objects per LIST page and entries per local scan page.
    pub page_size: usize,
    /// This cluster's id, to recognise its own uploads.
    pub cluster_id: Option<String>,
    /// Write with this fence (a slice's lease).
    pub fence: Option<Fence>,
    /// Key ranges of the bucket listed at once (`-listRanges`; 1: one sequential stream of
    /// pages). See [`listing`](crate::listing).
    pub ranges: usize,
}

impl Default for ReconcileOptions {
    fn default() -> Self {
        ReconcileOptions {
            delete: true,
            dry_run: false,
            page_size: 1000,
            cluster_id: None,
            fence: None,
            ranges: crate::listing::DEFAULT_RANGES,
        }
    }
}

/// One line of the report: a path (or, for a refused key, the key) and what happened to it.
#[derive(Debug, Clone)]
pub enum Item {
    Path { path: String, outcome: Outcome },
    RejectedKey { key: String, reason: KeyRejection },
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ReconcileReport {
    pub objects_listed: u64,
    /// LIST requests made of the bucket, and the key ranges they listed.
    pub list_requests: u64,
    pub list_ranges: u64,
    /// Every request made of the bucket, by operation, where the caller counted them (its
    /// storage a [`Counted`](tidemark_core::requests::Counted) one); else empty.
    pub requests: BTreeMap<String, u64>,
    pub entries_scanned: u64,
    pub created: u64,
    pub updated: u64,
    pub deleted: u64,
    /// Skips by reason (`in sync`, `local-only`, ...).
    pub skipped: BTreeMap<String, u64>,
    /// Keys with no path in the mount, by reason.
    pub rejected_keys: BTreeMap<String, u64>,
    pub duration_ms: u64,
}

impl ReconcileReport {
    fn count(&mut self, item: &Item) {
        match item {
            Item::Path { outcome, .. } => match outcome {
                Outcome::Created => self.created += 1,
                Outcome::Updated => self.updated += 1,
                Outcome::Deleted => self.deleted += 1,
                other => *self.skipped.entry(other.label().trim_start_matches("skip: ").to_string()).or_default() += 1,
            },
            Item::RejectedKey { reason, .. } => {
                *self.rejected_keys.entry(reason.as_str().to_string()).or_default() += 1
            }
        }
    }

    pub fn changes(&self) -> u64 {
        self.created + self.updated + self.deleted
    }

    /// `created 3, updated 1, deleted 0, skipped 12 (in sync 12), 0 keys refused, in 1.2 s`
    pub fn summary(&self) -> String {
        let skipped: u64 = self.skipped.values().sum();
        let detail: Vec<String> = self.skipped.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let refused: u64 = self.rejected_keys.values().sum();
        let refused_detail: Vec<String> = self.rejected_keys.iter().map(|(k, v)| format!("{k} {v}")).collect();
        format!(
            "{} objects listed in {} key ranges; created {}, updated {}, deleted {}, skipped {}{}; {} keys refused{}; requests: {}; in {:.1} s",
            self.objects_listed,
            self.list_ranges,
            self.created,
            self.updated,
            self.deleted,
            skipped,
            if detail.is_empty() { String::new() } else { format!(" ({})", detail.join(", ")) },
            refused,
            if refused_detail.is_empty() { String::new() } else { format!(" ({})", refused_detail.join(", ")) },
            if self.requests.is_empty() {
                format!("LIST {}", self.list_requests)
            } else {
                tidemark_core::requests::Requests::line(&self.requests)
            },
            self.duration_ms as f64 / 1000.0
        )
    }
}

/// How a reconcile's writes are made: with its fence, deleting only when asked to, minding
/// tombstones where users' deletes leave them (with a HEAD where a listed object's metadata
/// decides whose upload it is, as an event's apply would see it).
fn write_rules<'x>(
    opts: &'x ReconcileOptions,
    tombstones: bool,
    storage: &'x dyn RemoteStorage,
) -> crate::write::WriteRules<'x> {
    crate::write::WriteRules {
        fence: opts.fence.as_ref(),
        allow_delete: opts.delete,
        check_tombstones: tombstones,
        heads: Some(storage),
    }
}

/// Files decided together and written in one batched transaction during pass 1.
pub const BATCH: usize = 500;

/// Batches written at once: the next is decided (and the listing read on) while one commits.
pub const BATCHES_IN_FLIGHT: usize = 2;

/// A batch being written: its paths, in order, and their outcomes.
type Write<'a> = Pin<Box<dyn std::future::Future<Output = (Vec<String>, Result<Vec<Result<Written>>>)> + Send + 'a>>;

struct Run<'a> {
    filer: &'a dyn Filer,
    storage: &'a dyn RemoteStorage,
    map: KeyMap,
    opts: &'a ReconcileOptions,
    storage_name: &'a str,
    /// Whether users' deletes leave tombstones here (the mount syncs).
    tombstones: bool,
    report: ReconcileReport,
    sink: &'a mut (dyn FnMut(&Item) + Send + Sync),
    /// The mount's directory (what a subtree's walk up stops at).
    mount_dir: &'a str,
    /// Files waiting to be decided and written as the next batch.
    pending: Vec<(String, Option<Entry>, Option<RemoteObject>)>,
    /// Batches being written, oldest first. In a Mutex only so that `Run` is `Sync` (the
    /// futures are `Send`, not `Sync`); it is only ever reached through `&mut`, never locked.
    writes: std::sync::Mutex<FuturesOrdered<Write<'a>>>,
    /// The paths pending or being written.
    writing: HashSet<String>,
}

impl<'a> Run<'a> {
    fn ctx(&self) -> DecideCtx<'_> {
        DecideCtx { storage: self.storage_name, cluster_id: self.opts.cluster_id.as_deref(), tombstone: None }
    }

    fn emit(&mut self, item: Item) {
        self.report.count(&item);
        (self.sink)(&item);
    }

    async fn one(&mut self, p: &str, local: Option<Entry>, remote: Option<RemoteSide<'_>>) -> Result<()> {
        let ctx = self.ctx();
        let outcome = if self.opts.dry_run {
            match decide(local.as_ref(), remote, &ctx) {
                Action::Delete if !self.opts.delete => Outcome::Skipped(SkipReason::InSync),
                // A write would find a file where it needs a directory: say so, as a real run would.
                Action::Create(_) if self.ancestor_is_file(p).await? => Outcome::Skipped(SkipReason::Conflict),
                a => outcome_of(&a),
            }
        } else {
            let rules = write_rules(self.opts, self.tombstones, self.storage);
            decide_and_write(self.filer, p, local, remote, &ctx, rules).await?
        };
        self.emit(Item::Path { path: p.to_string(), outcome });
        Ok(())
    }

    fn writes(&mut self) -> &mut FuturesOrdered<Write<'a>> {
        self.writes.get_mut().unwrap_or_else(|p| p.into_inner())
    }

    /// Decides and writes the file `p` in the next batch (a dry run: at once).
    async fn queue(&mut self, p: String, local: Option<Entry>, remote: Option<RemoteObject>) -> Result<()> {
        if self.opts.dry_run {
            let side = remote.as_ref().map(|object| RemoteSide { object, is_dir_marker: false });
            return self.one(&p, local, side).await;
        }
        // A path waits for any ancestor of it being written: a file in a directory's place
        // decides a conflict, and a retried write must not change the order of the two.
        if path::ancestors(&p).iter().any(|a| self.writing.contains(*a)) {
            self.flush().await?;
        }
        self.writing.insert(p.clone());
        self.pending.push((p, local, remote));
        if self.pending.len() >= BATCH {
            self.send().await?;
        }
        Ok(())
    }

    /// Starts writing the pending files as one batch, once fewer than BATCHES_IN_FLIGHT are.
    async fn send(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        while self.writes().len() >= BATCHES_IN_FLIGHT {
            self.complete_one().await?;
        }
        let batch = std::mem::take(&mut self.pending);
        let (filer, opts, storage, bucket) = (self.filer, self.opts, self.storage_name, self.storage);
        let tombstones = self.tombstones;
        self.writes().push_back(Box::pin(async move {
            let ctx = DecideCtx { storage, cluster_id: opts.cluster_id.as_deref(), tombstone: None };
            let (paths, sides): (Vec<String>, Vec<_>) = batch.into_iter().map(|(p, l, r)| (p, (l, r))).unzip();
            let (locals, remotes): (Vec<Option<Entry>>, Vec<Option<RemoteObject>>) = sides.into_iter().unzip();
            let items: Vec<Pending<'_>> = paths
                .iter()
                .zip(locals)
                .zip(&remotes)
                .map(|((p, local), remote)| Pending {
                    path: p.clone(),
                    local,
                    remote: remote.as_ref().map(|object| RemoteSide { object, is_dir_marker: false }),
                })
                .collect();
            let outcomes = decide_and_write_many(filer, items, &ctx, write_rules(opts, tombstones, bucket)).await;
            (paths, outcomes)
        }));
        Ok(())
    }

    /// Waits for the oldest batch being written and reports it. After an error, the batches
    /// still being written finish (and what they wrote is reported) before the error is returned.
    async fn complete_one(&mut self) -> Result<()> {
        let Some((paths, outcomes)) = self.writes().next().await else { return Ok(()) };
        let failed = self.report_batch(paths, outcomes);
        let Some(e) = failed else { return Ok(()) };
        while let Some((paths, outcomes)) = self.writes().next().await {
            self.report_batch(paths, outcomes);
        }
        Err(e)
    }

    /// Reports what a batch wrote; its first error, if any.
    fn report_batch(&mut self, paths: Vec<String>, outcomes: Result<Vec<Result<Written>>>) -> Option<Error> {
        for p in &paths {
            self.writing.remove(p);
        }
        let outcomes = match outcomes {
            Ok(o) => o,
            Err(e) => return Some(e),
        };
        let mut first = None;
        for (p, outcome) in paths.into_iter().zip(outcomes) {
            match outcome {
                Ok(w) => self.emit(Item::Path { path: p, outcome: w.outcome }),
                Err(e) => first = first.or(Some(e)),
            }
        }
        first
    }

    /// Writes what is pending and waits for every batch.
    async fn flush(&mut self) -> Result<()> {
        self.send().await?;
        while !self.writes().is_empty() {
            self.complete_one().await?;
        }
        Ok(())
    }

    async fn ancestor_is_file(&self, p: &str) -> Result<bool> {
        for anc in path::ancestors(p).into_iter().filter(|a| path::is_within(a, self.map.dir())) {
            if self.filer.stat(anc).await?.is_some_and(|e| !e.is_dir()) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    async fn marker(&mut self, p: &str, object: &RemoteObject) -> Result<()> {
        let local = self.filer.stat(p).await?;
        self.one(p, local, Some(RemoteSide { object, is_dir_marker: true })).await
    }
}

/// Pages of one side of the merge-join.
struct Cursor<T> {
    buf: VecDeque<T>,
    next: Option<String>,
    done: bool,
}

impl<T> Cursor<T> {
    fn new() -> Self {
        Cursor { buf: VecDeque::new(), next: None, done: false }
    }
}

/// Reconciles the mount `mount` of `storage` (whose `remote.configure` name is the mount's
/// `location.storage`) into the namespace. `sink` sees every item as it is decided.
pub async fn reconcile(
    filer: &dyn Filer,
    storage: &dyn RemoteStorage,
    mount: &Mount,
    opts: &ReconcileOptions,
    sink: &mut (dyn FnMut(&Item) + Send + Sync),
) -> Result<ReconcileReport> {
    match filer.stat(&mount.dir).await? {
        Some(e) if e.is_dir() => {}
        Some(_) => return Err(Error::NotADirectory { path: mount.dir.clone() }),
        None => return Err(Error::not_found(format!("{} (the mount directory)", mount.dir))),
    }
    let started = Instant::now();
    let map = KeyMap::new(&mount.dir, &mount.location.path)?;
    let mut run = Run::new(filer, storage, map, opts, mount, sink);
    run.merge(&mount.dir).await?;
    if opts.delete {
        remove_empty_dirs(&mut run, &mount.dir, opts.page_size.clamp(1, 10_000)).await?;
    }
    run.report.duration_ms = started.elapsed().as_millis() as u64;
    Ok(run.report)
}

/// Reconciles one subtree of `mount`: the path `at` inside it — the key that would be a file
/// there, and every key below it (`key/...`) — against the entries at and below `at`, by the
/// same rules and writes as a whole reconcile (fenced, conditional, in batches, reported), in
/// O(page) memory; then, if the directory at `at` is left empty and no marker object backs
/// it, it is removed and its parents as they empty (a file key at its path gets it). For an
/// event that names a prefix (a directory deleted or renamed in a hierarchical namespace), and
/// for keys a file or directory stood in the way of, once it is gone.
pub async fn reconcile_subtree(
    filer: &dyn Filer,
    storage: &dyn RemoteStorage,
    mount: &Mount,
    at: &str,
    opts: &ReconcileOptions,
    sink: &mut (dyn FnMut(&Item) + Send + Sync),
) -> Result<ReconcileReport> {
    if at == mount.dir {
        return reconcile(filer, storage, mount, opts, sink).await;
    }
    let started = Instant::now();
    let map = KeyMap::new(&mount.dir, &mount.location.path)?;
    let Some(file_key) = map.path_to_key(at, false).filter(|_| path::is_within(at, &mount.dir)) else {
        return Err(Error::invalid_argument(format!("{at} is not a path inside the mount {}", mount.dir)));
    };
    let mut run = Run::new(filer, storage, map, opts, mount, sink);
    // The file at `at`, if the bucket or the namespace has one: decided against a HEAD.
    let local = filer.stat(at).await?;
    if local.as_ref().is_none_or(|e| !e.is_dir()) {
        let object = storage.stat(&file_key).await?;
        if local.is_some() || object.is_some() {
            let side = object.as_ref().map(|object| RemoteSide { object, is_dir_marker: false });
            run.one(at, local, side).await?;
        }
    }
    // Everything below it: a merge of the keys under `key/` with the entries under `at`.
    run.merge(at).await?;
    if opts.delete {
        remove_empty_dirs(&mut run, at, opts.page_size.clamp(1, 10_000)).await?;
        if let Some(dir) = filer.stat(at).await?.filter(|e| e.is_dir()) {
            walk_up(&mut run, dir).await?;
        }
    }
    run.report.duration_ms = started.elapsed().as_millis() as u64;
    Ok(run.report)
}

/// Removes the remote-backed directory `dir` if it was left empty and no marker backs it, then
/// its parents as they empty (never the mount's directory): what an applied delete leaves, as
/// a reconcile's pass 2 would. A file key at a removed directory's path gets its path now.
pub async fn remove_if_emptied(
    filer: &dyn Filer,
    storage: &dyn RemoteStorage,
    mount: &Mount,
    dir: &str,
    opts: &ReconcileOptions,
    sink: &mut (dyn FnMut(&Item) + Send + Sync),
) -> Result<ReconcileReport> {
    let map = KeyMap::new(&mount.dir, &mount.location.path)?;
    let mut run = Run::new(filer, storage, map, opts, mount, sink);
    if dir != mount.dir
        && path::is_within(dir, &mount.dir)
        && let Some(e) = filer.stat(dir).await?.filter(|e| e.is_dir())
    {
        walk_up(&mut run, e).await?;
    }
    Ok(run.report)
}

impl<'a> Run<'a> {
    fn new(
        filer: &'a dyn Filer,
        storage: &'a dyn RemoteStorage,
        map: KeyMap,
        opts: &'a ReconcileOptions,
        mount: &'a Mount,
        sink: &'a mut (dyn FnMut(&Item) + Send + Sync),
    ) -> Self {
        Run {
            filer,
            storage,
            map,
            opts,
            mount_dir: &mount.dir,
            storage_name: &mount.location.storage,
            // Not "whether any exist now": a user's delete during a long run must count too.
            tombstones: mount.sync,
            report: ReconcileReport::default(),
            sink,
            pending: Vec::new(),
            writes: std::sync::Mutex::new(FuturesOrdered::new()),
            writing: HashSet::new(),
        }
    }

    /// Pass 1 over the keys below `dir` (the mount's directory, or one inside it) and the files
    /// below it: a streaming merge-join of the two byte-ordered listings, a page of each at a
    /// time. A directory that does not exist (yet) is an empty local side.
    async fn merge(&mut self, dir: &str) -> Result<()> {
        let (filer, storage, opts) = (self.filer, self.storage, self.opts);
        let page = opts.page_size.clamp(1, 10_000);
        let prefix = match self.map.path_to_key(dir, true) {
            Some(marker) => marker,
            None => self.map.prefix().to_string(), // the mount's own directory
        };
        // The bucket's side: its key ranges listed at once, handed out in key order.
        let mut listing = crate::listing::Listing::new(storage, &prefix, page, opts.ranges);
        let mut remote: Cursor<RemoteObject> = Cursor::new();
        let mut local: Cursor<Entry> = Cursor::new();
        local.done = dir != self.mount_dir && filer.stat(dir).await?.is_none_or(|e| !e.is_dir());

        loop {
            if remote.buf.is_empty() && !remote.done {
                let p = listing.next_page().await;
                (self.report.list_requests, self.report.list_ranges) = (listing.requests, listing.splits);
                match p? {
                    Some(objects) => {
                        self.report.objects_listed += objects.len() as u64;
                        remote.buf.extend(objects);
                    }
                    None => remote.done = true,
                }
            }
            if local.buf.is_empty() && !local.done {
                let p = filer.scan(dir, local.next.as_deref(), page).await?;
                self.report.entries_scanned += p.entries.len() as u64;
                // Directories are not in the remote listing; pass 2 looks after them.
                local.buf.extend(p.entries.into_iter().filter(|e| !e.is_dir()));
                local.done = p.next.is_none();
                local.next = p.next;
                if local.buf.is_empty() && !local.done {
                    continue;
                }
            }
            // The next remote object that maps to a file path; markers and refused keys are
            // handled as they come.
            let remote_path = loop {
                let Some(o) = remote.buf.front() else { break None };
                match self.map.key_to_path(o.key.as_bytes()) {
                    Ok(Mapped::File(p)) => break Some(p),
                    Ok(Mapped::DirMarker(p)) if p == dir => {
                        // The marker of the subtree's own directory: it is above what is merged.
                        remote.buf.pop_front();
                    }
                    Ok(Mapped::DirMarker(p)) => {
                        let o = remote.buf.pop_front().expect("peeked");
                        self.flush().await?;
                        self.marker(&p, &o).await?;
                    }
                    Err(KeyRejection::MountRoot) => {
                        remote.buf.pop_front();
                    }
                    Err(reason) => {
                        let o = remote.buf.pop_front().expect("peeked");
                        self.emit(Item::RejectedKey { key: o.key, reason });
                    }
                }
            };
            if remote_path.is_none() && remote.buf.is_empty() && !remote.done {
                continue;
            }
            let local_path = local.buf.front().map(|e| e.path.clone());
            match (remote_path, local_path) {
                (None, None) if remote.done && local.done => break,
                (None, None) => continue,
                (Some(rp), lp) if lp.as_deref().is_none_or(|l| rp.as_str() < l) => {
                    if lp.is_none() && !local.done {
                        continue; // the local side may still hold this path on its next page
                    }
                    let o = remote.buf.pop_front().expect("peeked");
                    self.queue(rp, None, Some(o)).await?;
                }
                (rp, Some(lp)) if rp.as_deref().is_none_or(|r| lp.as_str() < r) => {
                    if rp.is_none() && !remote.done {
                        continue;
                    }
                    let e = local.buf.pop_front().expect("peeked");
                    self.queue(lp, Some(e), None).await?;
                }
                (Some(rp), Some(_)) => {
                    let o = remote.buf.pop_front().expect("peeked");
                    let e = local.buf.pop_front().expect("peeked");
                    self.queue(rp, Some(e), Some(o)).await?;
                }
                _ => unreachable!("every combination of sides is matched above"),
            }
        }
        self.flush().await
    }
}

/// Whether a remote-backed directory still has its reason to exist on the remote side: a
/// marker object. Implied directories (empty etag) exist only for what is below them.
async fn marker_exists(run: &Run<'_>, dir: &Entry) -> Result<bool> {
    let Some(r) = &dir.remote else { return Ok(true) };
    if r.etag.is_empty() {
        return Ok(false);
    }
    let Some(key) = run.map.path_to_key(&dir.path, true) else { return Ok(true) };
    Ok(run.storage.stat(&key).await?.is_some())
}

async fn remove_empty_dirs(run: &mut Run<'_>, dir: &str, page: usize) -> Result<()> {
    let mut after: Option<String> = None;
    loop {
        let p = run.filer.scan(dir, after.as_deref(), page).await?;
        for e in p.entries.iter().filter(|e| e.is_dir() && e.remote.is_some()) {
            walk_up(run, e.clone()).await?;
        }
        match p.next {
            Some(n) => after = Some(n),
            None => return Ok(()),
        }
    }
}

/// Removes `dir` while it is remote-backed, marker-less and empty, then its parents as they
/// empty, up to (not including) the mount's directory.
async fn walk_up(run: &mut Run<'_>, mut dir: Entry) -> Result<()> {
    let mount_dir = run.mount_dir;
    loop {
        if dir.path == mount_dir || dir.remote.is_none() || marker_exists(run, &dir).await? {
            return Ok(());
        }
        if !run.filer.list(&dir.path, None, 1).await?.entries.is_empty() {
            if dir.remote.as_ref().is_some_and(|r| !r.etag.is_empty()) && !run.opts.dry_run {
                forget_marker(run, &dir).await?;
            }
            return Ok(());
        }
        if !run.opts.dry_run {
            let opts = DeleteOptions {
                recursive: false,
                precondition: Precondition::Version(dir.version),
                ..Default::default()
            };
            match delete_dir(run, &dir.path, opts).await {
                Ok(()) => {}
                // A local write got there first: the directory is in use; leave it.
                Err(Error::PreconditionFailed { .. } | Error::DirectoryNotEmpty { .. } | Error::NotFound { .. }) => {
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
        run.emit(Item::Path { path: dir.path.clone(), outcome: Outcome::Deleted });
        // A file may have replaced the directory in the bucket: pass 1 found the directory in
        // its way (a conflict then); now it can have its path.
        if !run.opts.dry_run
            && let Some(key) = run.map.path_to_key(&dir.path, false)
            && let Some(object) = run.storage.stat(&key).await?
        {
            return run.one(&dir.path, None, Some(RemoteSide { object: &object, is_dir_marker: false })).await;
        }
        let Some(parent) = path::parent(&dir.path).filter(|p| path::is_within(p, mount_dir) && *p != mount_dir) else {
            return Ok(());
        };
        match run.filer.stat(parent).await? {
            Some(pe) if !run.opts.dry_run => dir = pe,
            _ => return Ok(()),
        }
    }
}

async fn delete_dir(run: &Run<'_>, p: &str, opts: DeleteOptions) -> Result<()> {
    let mut txn = Txn::delete(p, opts.recursive, Origin::Remote).with_precondition(opts.precondition);
    if let Some(f) = &run.opts.fence {
        txn = txn.with_fence(f.clone());
    }
    run.filer.apply(txn).await.map(|_| ())
}

/// A marker directory whose marker is gone but which still holds entries becomes an implied
/// directory, so later reconciles need not look for its marker again.
async fn forget_marker(run: &Run<'_>, dir: &Entry) -> Result<()> {
    let mut e = dir.to_new();
    if let Some(r) = e.remote.as_mut() {
        r.etag.clear();
    }
    let mut txn = Txn::put(&dir.path, e, Origin::Remote).with_precondition(Precondition::Version(dir.version));
    if let Some(f) = &run.opts.fence {
        txn = txn.with_fence(f.clone());
    }
    match run.filer.apply(txn).await {
        Ok(_) | Err(Error::PreconditionFailed { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// How long a reconcile took, for messages.
pub fn human_duration(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// What [`forget`] did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ForgetReport {
    pub removed: u64,
    /// Entries kept because they hold local data: local-only, or written locally since the
    /// last sync (the first few paths are listed).
    pub kept: u64,
    pub kept_examples: Vec<String>,
}

/// Removes the metadata a mount pulled under `dir` (for `remote.unmount`, or to undo a failed
/// first pull): every remote-backed entry that is not locally dirty, then the remote-backed
/// directories left empty, then `dir` itself if empty. Never touches an object, and never an
/// entry holding a local write.
pub async fn forget(filer: &dyn Filer, dir: &str) -> Result<ForgetReport> {
    let mut report = ForgetReport::default();
    let mut after: Option<String> = None;
    loop {
        let page = filer.scan(dir, after.as_deref(), 1000).await?;
        for e in page.entries.iter().filter(|e| !e.is_dir()) {
            if e.remote.is_none() || tidemark_core::decide::is_locally_dirty(e) {
                report.kept += 1;
                if report.kept_examples.len() < 10 {
                    report.kept_examples.push(e.path.clone());
                }
                continue;
            }
            let opts = DeleteOptions {
                recursive: false,
                precondition: Precondition::Version(e.version),
                ..Default::default()
            };
            match filer.delete(&e.path, opts).await {
                Ok(_) => report.removed += 1,
                // Written locally meanwhile: it holds local data now; keep it.
                Err(Error::PreconditionFailed { .. }) => report.kept += 1,
                Err(Error::NotFound { .. }) => {}
                Err(err) => return Err(err),
            }
        }
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    // Directories: a scan visits parents first, so remove each empty one and walk upwards.
    let mut after: Option<String> = None;
    loop {
        let page = filer.scan(dir, after.as_deref(), 1000).await?;
        for e in page.entries.iter().filter(|e| e.is_dir() && e.remote.is_some()) {
            let mut current = Some(e.path.clone());
            while let Some(p) = current.take() {
                if !filer.list(&p, None, 1).await?.entries.is_empty() {
                    break;
                }
                match filer.delete(&p, DeleteOptions::default()).await {
                    Ok(_) => report.removed += 1,
                    Err(Error::NotFound { .. } | Error::DirectoryNotEmpty { .. }) => break,
                    Err(err) => return Err(err),
                }
                current = path::parent(&p).filter(|q| path::is_within(q, dir) && *q != dir).map(str::to_string);
            }
        }
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    if filer.stat(dir).await?.is_some() && filer.list(dir, None, 1).await?.entries.is_empty() {
        match filer.delete(dir, DeleteOptions::default()).await {
            Ok(_) | Err(Error::NotFound { .. } | Error::DirectoryNotEmpty { .. }) => {}
            Err(err) => return Err(err),
        }
    }
    Ok(report)
}

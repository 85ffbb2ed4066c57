//! The gateway's versioning operations (see [`crate::versioning`] for where versions are kept).

use super::*;
use crate::versioning::{self, Mode, Stamp, is_marker, version_path};

/// What a read of a key (and maybe a version) found.
pub(super) struct Located {
    pub path: String,
    pub entry: Entry,
    /// The version id to answer with (`None` in a bucket whose versioning was never on).
    pub version_id: Option<String>,
}

/// What a versioned delete did.
#[derive(Default)]
pub(super) struct Deleted {
    pub version_id: Option<String>,
    pub delete_marker: bool,
}

/// 404 or 405 with the headers S3 sends for a delete marker.
fn marker_error(code: S3ErrorCode, message: String, id: &str) -> S3Error {
    let mut err = S3Error::with_message(code, message);
    let mut h = hyper::HeaderMap::new();
    h.insert("x-amz-delete-marker", hyper::header::HeaderValue::from_static("true"));
    if let Ok(v) = id.parse() {
        h.insert("x-amz-version-id", v);
    }
    err.set_headers(h);
    err
}

fn check_id(id: &str) -> S3Result<()> {
    if versioning::valid_id(id) {
        Ok(())
    } else {
        Err(s3_error!(InvalidArgument, "Invalid version id specified: {id:?}"))
    }
}

/// Another write or delete of the key came in between: the client retries (S3's SDKs do on 503).
pub(super) fn raced(key: &str) -> S3Error {
    s3_error!(ServiceUnavailable, "{key:?} changed while its versions were being kept; retry")
}

/// Where the bytes of a new version wait while the version it replaces is kept. Outside the
/// buckets, so no listing shows them; left by a gateway that died, removed by the hourly sweep.
pub const STAGED: &str = "/etc/tidemark/s3/staged";
/// How long a staged version can be there before the sweep takes it for one left behind: the
/// bytes are all written before it appears, and it is moved to its key within a few round trips.
pub const STAGED_KEPT_MS: i64 = 3600 * 1000;

/// How many times a write starts again on finding its key changed by another while it keeps
/// the version it replaces (each a few store round trips; a client sees 503 only past them).
pub(super) const MAKE_WAY_TRIES: usize = 16;

impl Gateway {
    /// The kept versions and delete markers of `key`, newest first.
    pub(super) async fn kept_versions(&self, bucket: &str, key: &str) -> S3Result<Vec<(Stamp, Entry)>> {
        let whole = format!("{}/{key}", versioning::versions_dir(bucket));
        let dir = path::parent(&whole).unwrap_or("/").to_string();
        let name_prefix = format!("{}{}", path::name(&whole), versioning::SEP);
        let mut out = Vec::new();
        let mut after = Some(path::join(&dir, &name_prefix));
        loop {
            let page = match self.filer.list(&dir, after.as_deref(), 1000).await {
                Ok(p) => p,
                Err(Error::NotFound { .. } | Error::NotADirectory { .. }) => return Ok(out),
                Err(e) => return Err(s3_err(e)),
            };
            for e in &page.entries {
                let Some(rest) = e.name().strip_prefix(&name_prefix) else { return Ok(out) };
                if let Some(s) = Stamp::parse(rest)
                    && e.kind == tidemark_core::model::EntryKind::File
                {
                    out.push((s, e.clone()));
                }
            }
            match page.next {
                Some(n) => after = Some(n),
                None => return Ok(out),
            }
        }
    }

    /// The current version of `key`: a file at its path.
    async fn current(&self, p: &str) -> S3Result<Option<Entry>> {
        Ok(self.filer.stat(p).await.map_err(s3_err)?.filter(|e| e.kind == tidemark_core::model::EntryKind::File))
    }

    /// Applies a change conditional on a version the gateway read: the version gone or changed
    /// means another request came in between (`raced`: retry).
    async fn apply_or_raced(&self, txn: Txn, key: &str) -> S3Result<()> {
        match self.filer.apply(txn).await {
            Ok(_) => Ok(()),
            Err(Error::PreconditionFailed { .. } | Error::NotFound { .. }) => Err(raced(key)),
            Err(e) => Err(s3_err(e)),
        }
    }

    /// Deletes `e` if it is still as read: `false` if it is gone or changed.
    async fn delete_if_unchanged(&self, e: &Entry) -> tidemark_core::Result<bool> {
        let opts = DeleteOptions { precondition: Precondition::Version(e.version), ..Default::default() };
        match self.filer.delete(&e.path, opts).await {
            Ok(_) => Ok(true),
            Err(Error::PreconditionFailed { .. } | Error::NotFound { .. }) => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Deletes the version file `e` as read: gone already is as good; changed is a race.
    async fn delete_as_read(&self, e: &Entry, key: &str) -> S3Result<()> {
        let opts = DeleteOptions { precondition: Precondition::Version(e.version), ..Default::default() };
        match self.filer.delete(&e.path, opts).await {
            Ok(_) | Err(Error::NotFound { .. }) => Ok(()),
            Err(Error::PreconditionFailed { .. }) => Err(raced(key)),
            Err(err) => Err(s3_err(err)),
        }
    }

    /// Makes the directory a kept version goes into (and its parents): one conditional put, an
    /// existing directory being as good.
    async fn make_dir(&self, dir: &str) -> S3Result<()> {
        let txn = Txn::put(dir, NewEntry::dir(now_ms()), Origin::Local).with_precondition(Precondition::Absent);
        match self.filer.apply(txn).await {
            Ok(_) | Err(Error::PreconditionFailed { .. }) => Ok(()),
            Err(e) => Err(s3_err(e)),
        }
    }

    /// The path a kept version of `key` would have, refused if the key's last name leaves no
    /// room for the stamp.
    fn kept_path(&self, bucket: &str, key: &str, s: &Stamp) -> S3Result<String> {
        let p = version_path(bucket, key, s);
        path::validate(&p).map_err(|_| {
            s3_error!(
                KeyTooLongError,
                "{key:?}: a versioned key's last name can have at most {} bytes (its versions are kept beside it with a \
                 33-byte stamp)",
                path::MAX_NAME_BYTES - 33
            )
        })?;
        Ok(p)
    }

    /// Deletes the kept `null` versions of `key` older than `than` (a newer `null` version
    /// replaced them). After the newer one is written, so a write that fails takes none away.
    pub(super) async fn drop_older_nulls(&self, bucket: &str, key: &str, than: &Stamp) -> S3Result<()> {
        for (s, e) in self.kept_versions(bucket, key).await? {
            if s.is_null() && s > *than {
                self.delete_as_read(&e, key).await?;
            }
        }
        Ok(())
    }

    /// After a write that [`Self::make_way`] made way for: a new `null` version replaces the
    /// older kept ones. The write stands whatever this finds; a `null` left is dropped by the
    /// next.
    async fn made_way(&self, bucket: &str, key: &str, stamp: &Stamp) {
        if !stamp.is_null() {
            return;
        }
        if let Err(err) = self.drop_older_nulls(bucket, key, stamp).await {
            tracing::warn!(bucket, key, error = %err, "an older null version was not dropped; the next write drops it");
        }
    }

    /// The stamp of `cur`, the current version of `key`, and its kept name if it has one. An
    /// object without a stamp (written outside versioning: before it, or through the mount) is
    /// the `null` version: its kept name, if any, is the kept `null` that is the same file (a name
    /// of a hard-linked file answers with the file's version), which every writer finds alike;
    /// the other kept `null`s it replaced go. Kept anew, it is stamped just older than `newer`,
    /// the version (or marker) about to replace it. `None`: `cur` changed meanwhile (another
    /// writer kept it, or replaced it): start again.
    async fn stamp_of(
        &self,
        bucket: &str,
        key: &str,
        p: &str,
        cur: &Entry,
        newer: &Stamp,
    ) -> S3Result<Option<(Stamp, Option<Entry>)>> {
        if let Some(s) = Stamp::of(cur) {
            let at = self.filer.stat(&self.kept_path(bucket, key, &s)?).await.map_err(s3_err)?;
            return Ok(Some((s, at)));
        }
        let nulls: Vec<(Stamp, Entry)> =
            self.kept_versions(bucket, key).await?.into_iter().filter(|(s, _)| s.is_null()).collect();
        // `cur` unchanged from before the listing to after it: then a kept null listed with
        // another version is no name of it (a name answers with its file's version, and
        // versions never go back), and can go.
        if self.current(p).await?.is_none_or(|now| now.version != cur.version) {
            return Ok(None);
        }
        let mut same = None;
        for (s, e) in nulls {
            if e.version == cur.version && same.is_none() {
                same = Some((s, e));
            } else {
                // Another file, or a second name of this one (the first stays); its delete
                // holds only to the version listed.
                self.delete_as_read(&e, key).await?;
            }
        }
        Ok(Some(match same {
            Some((s, e)) => (s, Some(e)),
            None => (Stamp::null_before(newer), None),
        }))
    }

    /// The stamp of a new version of `key` in a bucket whose versioning is `mode` (none without
    /// versioning), refused if the key's last name leaves no room for it.
    pub(super) fn new_stamp(&self, bucket: &str, key: &str, mode: Mode) -> S3Result<Option<Stamp>> {
        if mode == Mode::Off {
            return Ok(None);
        }
        let stamp = Stamp::new(mode == Mode::Suspended).map_err(s3_err)?;
        self.kept_path(bucket, key, &stamp)?;
        Ok(Some(stamp))
    }

    /// Before version `stamp` of `key` replaces the current one: keeps that one (a hard link
    /// into the versions directory; the key stays readable) and returns the precondition the
    /// replacing must hold to (the version kept, so a write in between is never replaced
    /// unkept). `asked` is the client's own precondition (If-Match, If-None-Match).
    async fn make_way(
        &self,
        bucket: &str,
        key: &str,
        p: &str,
        stamp: &Stamp,
        asked: Precondition,
    ) -> S3Result<Precondition> {
        for _ in 0..MAKE_WAY_TRIES {
            let cur = self.current(p).await?;
            match (asked, &cur) {
                (Precondition::Version(v), c) if c.as_ref().map(|e| e.version) != Some(v) => {
                    return Err(s3_error!(PreconditionFailed, "{key:?} changed since its ETag was checked"));
                }
                (Precondition::Absent, Some(_)) => {
                    return Err(s3_error!(PreconditionFailed, "If-None-Match: {key:?} exists"));
                }
                _ => {}
            }
            let Some(cur) = cur else { return Ok(Precondition::Absent) };
            let Some((kept, at)) = self.stamp_of(bucket, key, p, &cur, stamp).await? else { continue };
            if stamp.is_null() && kept.is_null() {
                // Suspended: the null version is replaced in place.
                return Ok(Precondition::Version(cur.version));
            }
            let file = match at {
                // Kept already (by another writer, or by one whose write then failed).
                Some(k) => k.version,
                None => {
                    let to = self.kept_path(bucket, key, &kept)?;
                    self.make_dir(path::parent(&to).unwrap_or("/")).await?;
                    let txn = Txn::link(p, to, Origin::Local).with_precondition(Precondition::Version(cur.version));
                    match self.filer.apply(txn).await {
                        Ok(a) => a.new.map_or(0, |e| e.version),
                        Err(Error::PreconditionFailed { .. } | Error::NotFound { .. }) => continue,
                        Err(e) => return Err(s3_err(e)),
                    }
                }
            };
            // The key must still name the file kept: another writer may have replaced it since
            // it was read, and what it wrote is kept by nobody yet.
            match self.current(p).await? {
                Some(now) if now.version == file => return Ok(Precondition::Version(now.version)),
                _ => continue,
            }
        }
        Err(raced(key))
    }

    /// Writes version `stamp` of `key` (at `p`): its bytes first, aside (in [`STAGED`]), then —
    /// once the version it replaces is kept — moved to the key, in one rename that holds to the
    /// version kept. Writers of one key race only in that last step, which is repeated (up to
    /// [`MAKE_WAY_TRIES`] times) rather than answered with a 503 that would have the client
    /// send its body again. `opts.precondition`: the client's own, checked at each try.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn write_version(
        &self,
        bucket: &str,
        key: &str,
        p: &str,
        stamp: &Stamp,
        stream: tidemark_core::ByteStream,
        verdict: &body::Verdict,
        mut opts: WriteOptions,
    ) -> S3Result<Entry> {
        let asked = opts.precondition;
        opts.extended.get_or_insert_default().insert(versioning::ATTR_VERSION.into(), stamp.as_str().into());
        opts.precondition = Precondition::Absent;
        let suffix = tidemark_core::ids::random_hex(8, "a staged version's name").map_err(s3_err)?;
        let staged =
            self.write(&path::join(STAGED, &format!("{}-{suffix}", stamp.as_str())), stream, verdict, opts).await?;
        let done = self.promote(bucket, key, p, &staged, stamp, asked).await;
        match &done {
            Ok(_) => self.made_way(bucket, key, stamp).await,
            Err(_) => {
                if let Err(err) = self.delete_if_unchanged(&staged).await {
                    tracing::warn!(path = %staged.path, error = %err, "a staged version was not removed; the hourly sweep removes it");
                }
            }
        }
        done
    }

    /// Removes the staged versions older than [`STAGED_KEPT_MS`] at `now_ms`: left by a gateway
    /// that died between writing one and moving it to its key (each removal conditional on the
    /// version seen). Returns how many.
    pub async fn sweep_staged(&self, now_ms: i64) -> tidemark_core::Result<u64> {
        let mut removed = 0;
        let mut after: Option<String> = None;
        loop {
            let page = match self.filer.list(STAGED, after.as_deref(), 1000).await {
                Ok(p) => p,
                Err(Error::NotFound { .. }) => return Ok(removed),
                Err(e) => return Err(e),
            };
            for e in page.entries.iter().filter(|e| e.mtime_ms < now_ms - STAGED_KEPT_MS) {
                if self.delete_if_unchanged(e).await? {
                    removed += 1;
                }
            }
            match page.next {
                Some(n) => after = Some(n),
                None => return Ok(removed),
            }
        }
    }

    /// Moves the staged version to the key once the version there is kept (see
    /// [`Self::write_version`]).
    async fn promote(
        &self,
        bucket: &str,
        key: &str,
        p: &str,
        staged: &Entry,
        stamp: &Stamp,
        asked: Precondition,
    ) -> S3Result<Entry> {
        for _ in 0..MAKE_WAY_TRIES {
            let to_precondition = self.make_way(bucket, key, p, stamp, asked).await?;
            let rename = tidemark_core::model::Mutation::Rename { to: p.to_string(), to_precondition };
            let txn = Txn::of(staged.path.clone(), rename, Origin::Local)
                .with_precondition(Precondition::Version(staged.version));
            match self.filer.apply(txn).await {
                Ok(a) => return a.new.ok_or_else(|| s3_error!(InternalError, "{key:?}: the rename made no entry")),
                // The key changed since its version was kept: keep the new one.
                Err(Error::PreconditionFailed { path, .. }) if path == p => continue,
                // The key's directory went (emptied by a delete): make it again.
                Err(Error::NotFound { path }) if path != staged.path => {
                    self.make_dir(path::parent(p).unwrap_or("/")).await?;
                }
                Err(e) => return Err(s3_err(e)),
            }
        }
        Err(raced(key))
    }

    /// Where the version of `key` a read asks for is: the current one (`id` `None`), or the
    /// one named. A delete marker is `NoSuchKey` (the latest) or `MethodNotAllowed` (named).
    pub(super) async fn locate(&self, bucket: &str, key: &str, id: Option<&str>) -> S3Result<Located> {
        let b = bucket;
        // Cached (2 s): a read of the current version costs no stat of its bucket.
        let versioned = self.shared.bucket_facts(b).await.versioned;
        let (p, marker) = names::object_path(b, key).map_err(name_err)?;
        if let Some(id) = id {
            check_id(id)?;
        }
        // (`describe`: an object whose entry came from a listing learns its headers first.)
        let cur = if marker {
            None
        } else {
            self.filer.describe(&p).await.map_err(s3_err)?.filter(|e| e.kind == tidemark_core::model::EntryKind::File)
        };
        let cur_id = |e: &Entry| Stamp::of(e).map_or_else(|| versioning::NULL.to_string(), |s| s.id());
        match (id, cur) {
            (None, Some(e)) => {
                let version_id = versioned.then(|| cur_id(&e));
                return Ok(Located { path: p, entry: e, version_id });
            }
            (Some(id), Some(e)) if cur_id(&e) == id => {
                return Ok(Located { path: p, entry: e, version_id: Some(id.to_string()) });
            }
            (None, None) if marker => {
                let (p, e) = self.object_entry(b, key).await?;
                return Ok(Located { path: p, entry: e, version_id: None });
            }
            _ => {}
        }
        self.bucket_entry(b).await?;
        let kept = if marker { Vec::new() } else { self.kept_versions(b, key).await? };
        match id {
            None => match kept.first() {
                Some((s, e)) if is_marker(e) => Err(marker_error(
                    S3ErrorCode::NoSuchKey,
                    format!("{key:?} was deleted (its latest version is a delete marker)"),
                    &s.id(),
                )),
                _ => Err(no_such_key(key)),
            },
            Some(id) => match kept.into_iter().find(|(s, _)| s.is(id)) {
                Some((s, e)) if is_marker(&e) => Err(marker_error(
                    S3ErrorCode::MethodNotAllowed,
                    format!("version {id} of {key:?} is a delete marker: it has no bytes"),
                    &s.id(),
                )),
                Some((s, e)) => Ok(Located { path: e.path.clone(), entry: e, version_id: Some(s.id()) }),
                None => Err(S3Error::with_message(S3ErrorCode::NoSuchVersion, format!("{key:?} has no version {id}"))),
            },
        }
    }

    /// Deletes `key` in a versioned bucket without naming a version: the current version is
    /// kept (moved into the versions directory, in one rename) and a delete marker becomes the
    /// latest. Suspended, the marker is the `null` version and a `null` object goes.
    pub(super) async fn delete_to_marker(
        &self,
        (bucket_dir, bucket_e): &(String, Entry),
        bucket: &str,
        key: &str,
        mode: Mode,
        cond: &DeleteIf<'_>,
    ) -> S3Result<Deleted> {
        let (p, dir_marker) = names::object_path(bucket, key).map_err(name_err)?;
        if dir_marker {
            self.delete_one(bucket_dir, bucket, key, *cond).await?;
            return Ok(Deleted::default());
        }
        let cur = self.current(&p).await?;
        match &cur {
            Some(e) => check_delete(e, key, cond)?,
            None if cond.etag.is_some() => return Err(no_such_key(key)),
            None => {}
        }
        let marker = Stamp::new(mode == Mode::Suspended).map_err(s3_err)?;
        let to_marker = self.kept_path(bucket, key, &marker)?;
        // The current version's stamp, older than the marker's.
        let kept = match &cur {
            Some(e) => Some(self.stamp_of(bucket, key, &p, e, &marker).await?.ok_or_else(|| raced(key))?),
            None => None,
        };
        if let (Some(e), Some((kept, at))) = (cur, kept) {
            if at.as_ref().is_some_and(|k| k.version != e.version) {
                return Err(raced(key));
            }
            let gone = if (kept.is_null() && mode == Mode::Suspended) || at.is_some() {
                None
            } else {
                Some(self.kept_path(bucket, key, &kept)?)
            };
            let mutation = match gone {
                Some(to) => {
                    self.make_dir(path::parent(&to).unwrap_or("/")).await?;
                    tidemark_core::model::Mutation::Rename { to, to_precondition: Precondition::Absent }
                }
                // Kept already (or replaced by the new null): the key's name goes.
                None => tidemark_core::model::Mutation::Delete { recursive: false },
            };
            // Its version as read: a name kept since (or a write) changes it, and this is a race.
            let txn = Txn::of(p.clone(), mutation, Origin::Local).with_precondition(Precondition::Version(e.version));
            self.apply_or_raced(txn, key).await?;
            self.prune(bucket_dir, &p).await;
        }
        let mut ext = BTreeMap::new();
        ext.insert(versioning::ATTR_VERSION.to_string(), marker.as_str().to_string());
        ext.insert(versioning::ATTR_DELETE_MARKER.to_string(), "true".to_string());
        if let Some(o) = bucket_e.extended.get(ATTR_OWNER) {
            ext.insert(ATTR_OWNER.to_string(), o.clone());
        }
        let opts = WriteOptions { precondition: Precondition::Absent, extended: Some(ext), ..Default::default() };
        let empty = futures::stream::empty::<std::io::Result<bytes::Bytes>>().boxed();
        self.filer.write(&to_marker, empty, opts).await.map_err(s3_err)?;
        if marker.is_null() {
            self.drop_older_nulls(bucket, key, &marker).await?;
        }
        Ok(Deleted { version_id: Some(marker.id()), delete_marker: true })
    }

    /// Deletes version `id` of `key` for good (a delete marker too). If it was the latest, the
    /// newest one left becomes the current version (unless it is a delete marker).
    pub(super) async fn delete_version(
        &self,
        (bucket_dir, _): &(String, Entry),
        bucket: &str,
        key: &str,
        id: &str,
        cond: &DeleteIf<'_>,
    ) -> S3Result<Deleted> {
        check_id(id)?;
        let (p, dir_marker) = names::object_path(bucket, key).map_err(name_err)?;
        if dir_marker {
            if id == versioning::NULL {
                self.delete_one(bucket_dir, bucket, key, *cond).await?;
            }
            return Ok(Deleted { version_id: Some(id.to_string()), delete_marker: false });
        }
        // A version can move while this runs: a kept one becomes the current one (a delete of
        // the current settles the newest kept there), the current one is kept (a write replaced
        // it). One gone from where it was read is looked for again.
        for _ in 0..MAKE_WAY_TRIES {
            let is_it = |e: &Entry| Stamp::of(e).map_or(id == versioning::NULL, |s| s.is(id));
            let cur = self.current(&p).await?;
            let cur_is = cur.as_ref().is_some_and(is_it);
            let (target, was_marker) = match cur {
                Some(e) if cur_is => (e, false),
                _ => match self.kept_versions(bucket, key).await?.into_iter().find(|(s, _)| s.is(id)) {
                    Some((_, e)) => {
                        let m = is_marker(&e);
                        (e, m)
                    }
                    // Settled at the key since it was read?
                    None if self.current(&p).await?.as_ref().is_some_and(is_it) => continue,
                    // No such version: nothing to do, as S3 answers (whatever the conditions).
                    None => return Ok(Deleted { version_id: Some(id.to_string()), delete_marker: false }),
                },
            };
            if !was_marker {
                check_delete(&target, key, cond)?;
            }
            if !self.delete_if_unchanged(&target).await.map_err(s3_err)? {
                // Moved, or (the current one) replaced and so kept: where is it now?
                continue;
            }
            if cur_is {
                self.prune(bucket_dir, &p).await;
            } else {
                self.prune(&versioning::versions_dir(bucket), &target.path).await;
            }
            self.settle(bucket, key, &p).await?;
            return Ok(Deleted { version_id: Some(id.to_string()), delete_marker: was_marker });
        }
        Err(raced(key))
    }

    /// With no current version, the newest kept one becomes it — unless it is a delete marker.
    async fn settle(&self, bucket: &str, key: &str, p: &str) -> S3Result<()> {
        if self.current(p).await?.is_some() {
            return Ok(());
        }
        let Some((_, newest)) = self.kept_versions(bucket, key).await?.into_iter().next() else { return Ok(()) };
        if is_marker(&newest) {
            return Ok(());
        }
        let rename =
            tidemark_core::model::Mutation::Rename { to: p.to_string(), to_precondition: Precondition::Absent };
        let txn = Txn::of(newest.path.clone(), rename, Origin::Local)
            .with_precondition(Precondition::Version(newest.version));
        match self.filer.apply(txn).await {
            // Someone wrote the key meanwhile, or settled it: theirs is the latest.
            Ok(_) | Err(Error::PreconditionFailed { .. } | Error::NotFound { .. }) => {}
            Err(e) => return Err(s3_err(e)),
        }
        self.prune(&versioning::versions_dir(bucket), &newest.path).await;
        Ok(())
    }

    /// The lifecycle sweep's part in a versioned bucket: noncurrent versions past their days
    /// (beyond the newest the rule keeps) go, and so does a delete marker left with nothing
    /// behind it. Each delete is conditional on the version seen. Returns how many went.
    pub(super) async fn expire_noncurrent(
        &self,
        bucket: &str,
        c: &BucketLifecycleConfiguration,
        now_ms: i64,
        day_ms: i64,
    ) -> tidemark_core::Result<u64> {
        let dir = versioning::versions_dir(bucket);
        let (mut n, mut after, mut group): (u64, Option<String>, Vec<(String, Stamp, Entry)>) = (0, None, Vec::new());
        loop {
            let page = match self.filer.scan(&dir, after.as_deref(), 1000).await {
                Ok(p) => p,
                Err(Error::NotFound { .. }) => break,
                Err(e) => return Err(e),
            };
            for e in page.entries.into_iter().filter(|e| e.kind == tidemark_core::model::EntryKind::File) {
                let Some(listed) = names::key_of(&dir, &e.path) else { continue };
                let Some((key, stamp)) = versioning::split(&listed).map(|(k, s)| (k.to_string(), s)) else { continue };
                if group.first().is_some_and(|(k, _, _)| *k != key) {
                    n += self.expire_key(bucket, c, std::mem::take(&mut group), now_ms, day_ms).await?;
                }
                group.push((key, stamp, e));
            }
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        if !group.is_empty() {
            n += self.expire_key(bucket, c, group, now_ms, day_ms).await?;
        }
        Ok(n)
    }

    /// [`Self::expire_noncurrent`] for one key's kept versions (newest first).
    async fn expire_key(
        &self,
        bucket: &str,
        c: &BucketLifecycleConfiguration,
        kept: Vec<(String, Stamp, Entry)>,
        now_ms: i64,
        day_ms: i64,
    ) -> tidemark_core::Result<u64> {
        let Some(key) = kept.first().map(|(k, _, _)| k.clone()) else { return Ok(0) };
        let Ok((p, _)) = names::object_path(bucket, &key) else { return Ok(0) };
        let cur = self.filer.stat(&p).await?.filter(|e| e.kind == tidemark_core::model::EntryKind::File);
        // Each version became noncurrent when the next newer one was made.
        let mut newer_made = cur.as_ref().map(|e| Stamp::of(e).map_or(e.mtime_ms, |s| s.made_ms()));
        let (mut n, mut newer_kept, mut left) = (0, 0, Vec::new());
        for (i, (_, stamp, e)) in kept.into_iter().enumerate() {
            let since = newer_made.unwrap_or_else(|| stamp.made_ms());
            newer_made = Some(stamp.made_ms());
            // With no current version the newest kept one is the latest, not noncurrent.
            let latest = i == 0 && cur.is_none();
            let tags = tagging::kept(&e.extended, tagging::ATTR_TAGGING);
            let due = !latest
                && !is_marker(&e)
                && lifecycle::noncurrent_expired(c, &key, e.size, &tags, since, newer_kept, now_ms, day_ms);
            if !due {
                if !is_marker(&e) {
                    newer_kept += 1;
                }
                left.push(e);
                continue;
            }
            if self.delete_kept(bucket, &e).await? {
                n += 1;
            }
        }
        // A marker with nothing behind it (no current version, no other kept one).
        if cur.is_none()
            && let [only] = left.as_slice()
            && is_marker(only)
            && lifecycle::clears_expired_markers(c, &key)
            && self.delete_kept(bucket, only).await?
        {
            n += 1;
        }
        Ok(n)
    }

    /// Deletes kept version `e` if it is still as seen; whether it went.
    async fn delete_kept(&self, bucket: &str, e: &Entry) -> tidemark_core::Result<bool> {
        let deleted = self.delete_if_unchanged(e).await?;
        if deleted {
            self.prune(&versioning::versions_dir(bucket), &e.path).await;
        }
        Ok(deleted)
    }

    /// Whether the bucket keeps versions of anything (DeleteBucket refuses then).
    pub(super) async fn has_kept_versions(&self, bucket: &str) -> S3Result<bool> {
        let dir = versioning::versions_dir(bucket);
        let mut after: Option<String> = None;
        loop {
            let page = match self.filer.scan(&dir, after.as_deref(), 1000).await {
                Ok(p) => p,
                Err(Error::NotFound { .. } | Error::NotADirectory { .. }) => return Ok(false),
                Err(e) => return Err(s3_err(e)),
            };
            if page.entries.iter().any(|e| !e.is_dir()) {
                return Ok(true);
            }
            match page.next {
                Some(n) => after = Some(n),
                None => return Ok(false),
            }
        }
    }

    /// Removes what is left of a deleted bucket's versions directory (directories only).
    pub(super) async fn forget_versions(&self, bucket: &str) {
        let opts = DeleteOptions { recursive: true, precondition: Precondition::Any, ..Default::default() };
        match self.filer.delete(&versioning::versions_dir(bucket), opts).await {
            Ok(_) | Err(Error::NotFound { .. }) => {}
            Err(e) => tracing::warn!(bucket, error = %e, "the deleted bucket's versions directory stays behind"),
        }
    }

    /// ListObjectVersions: the current versions (from the bucket's directory) and the kept ones
    /// (from its versions directory), merged in key order, newest first within a key.
    pub(super) async fn versions_page(&self, q: VersionsQuery<'_>) -> S3Result<VersionsPage> {
        let dir = names::bucket_dir(q.bucket).map_err(name_err)?;
        let include_marker_key = q.key_marker.is_some() && q.version_id_marker.is_some();
        let cur_after = match (q.key_marker, include_marker_key) {
            (Some(k), true) => list::just_before(k),
            (Some(k), false) => Some(k.to_string()),
            (None, _) => None,
        };
        let cq = list::Query { prefix: q.prefix, delimiter: q.delimiter, after: cur_after.as_deref(), max: q.max };
        let current = list::list(&*self.filer, &dir, &cq).await.map_err(s3_err)?;
        let kept_after = q.key_marker.map(|k| match include_marker_key {
            true => format!("{k}{}", versioning::SEP),
            false => format!("{k}{}{}", versioning::SEP, list::JUMP),
        });
        let kq = list::Query { prefix: q.prefix, delimiter: q.delimiter, after: kept_after.as_deref(), max: q.max };
        let kept = list::list(&*self.filer, &versioning::versions_dir(q.bucket), &kq).await.map_err(s3_err)?;
        let mut rows: Vec<Row> = Vec::new();
        let mut current_ids: BTreeMap<String, String> = BTreeMap::new();
        for it in current.items {
            match it {
                Item::Object { key, entry } => {
                    let stamp = Stamp::of(&entry);
                    let id = stamp.as_ref().map_or_else(|| versioning::NULL.to_string(), Stamp::id);
                    current_ids.insert(key.clone(), stamp.map(|s| s.as_str().to_string()).unwrap_or_default());
                    rows.push(Row::Version { key, order: String::new(), id, entry, current: true });
                }
                Item::Prefix(p) => rows.push(Row::Prefix(p)),
            }
        }
        let mut expanded: Vec<String> = Vec::new();
        for it in kept.items {
            match it {
                Item::Object { key: listed, entry } => {
                    let Some((key, stamp)) = versioning::split(&listed) else { continue };
                    if current_ids.get(key).is_some_and(|c| c == stamp.as_str()) {
                        continue;
                    }
                    rows.push(Row::Version {
                        key: key.to_string(),
                        order: stamp.as_str().to_string(),
                        id: stamp.id(),
                        entry,
                        current: false,
                    });
                }
                // The delimiter matched inside a stamp: the key's own versions, listed whole.
                Item::Prefix(p) if p.contains(versioning::SEP) => {
                    let key = p.split(versioning::SEP).next().unwrap_or("").to_string();
                    if expanded.contains(&key) {
                        continue;
                    }
                    for (stamp, entry) in self.kept_versions(q.bucket, &key).await? {
                        if current_ids.get(&key).is_some_and(|c| c == stamp.as_str()) {
                            continue;
                        }
                        rows.push(Row::Version {
                            key: key.clone(),
                            order: stamp.as_str().to_string(),
                            id: stamp.id(),
                            entry: Box::new(entry),
                            current: false,
                        });
                    }
                    expanded.push(key);
                }
                Item::Prefix(p) => rows.push(Row::Prefix(p)),
            }
        }
        rows.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
        rows.dedup_by(|a, b| matches!((a, b), (Row::Prefix(x), Row::Prefix(y)) if x == y));
        // Resume after the version named by the marker, within its key.
        if let (Some(k), Some(v)) = (q.key_marker, q.version_id_marker) {
            if let Some(i) = rows.iter().position(|r| matches!(r, Row::Version { key, id, .. } if key == k && id == v))
            {
                rows.drain(..=i);
            } else {
                rows.retain(|r| !matches!(r, Row::Version { key, .. } if key == k));
            }
        }
        let truncated = rows.len() > q.max || current.truncated || kept.truncated;
        rows.truncate(q.max);
        // The latest of each key: its current version, else its newest kept one (a marker).
        let mut seen_key: Option<String> = None;
        let mut out = VersionsPage { truncated, ..Default::default() };
        for r in rows {
            match r {
                Row::Prefix(p) => {
                    out.next = Some((p.clone(), None));
                    out.prefixes.push(p);
                }
                Row::Version { key, id, entry, current, .. } => {
                    let first = seen_key.as_deref() != Some(key.as_str());
                    seen_key = Some(key.clone());
                    let latest = current || (first && !current_ids.contains_key(&key) && !resumed_within(&q, &key));
                    out.next = Some((key.clone(), Some(id.clone())));
                    out.versions.push(Listed { key, id, latest, marker: is_marker(&entry), entry: *entry });
                }
            }
        }
        if !out.truncated {
            out.next = None;
        }
        Ok(out)
    }
}

/// Whether a page starts inside `key`'s versions (so its first row there is not its newest).
fn resumed_within(q: &VersionsQuery<'_>, key: &str) -> bool {
    q.version_id_marker.is_some() && q.key_marker == Some(key)
}

pub(super) struct VersionsQuery<'a> {
    pub bucket: &'a str,
    pub prefix: &'a str,
    pub delimiter: Option<&'a str>,
    pub key_marker: Option<&'a str>,
    pub version_id_marker: Option<&'a str>,
    pub max: usize,
}

pub(super) struct Listed {
    pub key: String,
    pub id: String,
    pub latest: bool,
    pub marker: bool,
    pub entry: Entry,
}

#[derive(Default)]
pub(super) struct VersionsPage {
    pub versions: Vec<Listed>,
    pub prefixes: Vec<String>,
    pub truncated: bool,
    /// Where the next page starts: a key (or common prefix) and a version id.
    pub next: Option<(String, Option<String>)>,
}

enum Row {
    Prefix(String),
    /// `order`: empty for the current version (first), else the stamp (newest first).
    Version {
        key: String,
        order: String,
        id: String,
        entry: Box<Entry>,
        current: bool,
    },
}

impl Row {
    fn sort_key(&self) -> (&str, &str) {
        match self {
            Row::Prefix(p) => (p, ""),
            Row::Version { key, order, .. } => (key, order),
        }
    }
}

/// A delete's conditions (`If-Match`, S3 Express's time and size) against the version it
/// would delete.
pub(super) fn check_delete(e: &Entry, key: &str, cond: &DeleteIf<'_>) -> S3Result<()> {
    if cond.version.is_some_and(|v| v != e.version) {
        return Err(s3_error!(PreconditionFailed, "{key:?} changed since it was seen"));
    }
    if let Some(t) = cond.etag
        && t.value() != etag_of(e)
    {
        return Err(s3_error!(PreconditionFailed, "If-Match: the object's ETag is {}", etag_of(e)));
    }
    if let Some(t) = cond.last_modified
        // Last-Modified shows whole seconds.
        && crate::lifecycle::ms_of(t).map(whole_seconds) != Some(whole_seconds(e.mtime_ms))
    {
        return Err(s3_error!(
            PreconditionFailed,
            "x-amz-if-match-last-modified-time: the object was modified at another time"
        ));
    }
    if let Some(n) = cond.size
        && n != e.size as i64
    {
        return Err(s3_error!(PreconditionFailed, "x-amz-if-match-size: {key:?} has {} bytes", e.size));
    }
    Ok(())
}

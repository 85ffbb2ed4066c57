//! The outbound `remote.sync`: local writes under a mount with sync enabled are uploaded to its
//! bucket, and deletes a user made are propagated. Driven by the change log; each record is
//! handled by looking at the entry's *current* state (is it still written locally since its last
//! sync?), so handling a record twice — after a restart, say — uploads nothing twice.
//!
//! An upload carries user metadata `tidemark-origin: <cluster id>`, `tidemark-entry: <digest of
//! the path>` and `tidemark-version: <entry version>` (`decide::upload_metadata`), so the
//! bucket's event for it is recognised as this cluster's echo of this entry; then the
//! object's etag, size and time are recorded in the entry with a write conditional on the version
//! uploaded (a newer local write in the meantime keeps the entry dirty, to be uploaded in turn).

use tidemark_core::decide::{
    DecideCtx, RemoteSide, is_entrys_pending_upload, is_locally_dirty, is_pending_upload, upload_metadata,
};
use tidemark_core::keymap::KeyMap;
use tidemark_core::model::{ChangeRecord, Content, Entry, Origin, Precondition, RemoteEntry, Txn, object_attrs};
use tidemark_core::remote::{Mount, ObjectHeaders};
use tidemark_core::{ByteStream, Clock, Error, Filer, RemoteStorage, Result};

/// What one change-log record led to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutboundOutcome {
    Uploaded {
        path: String,
        key: String,
    },
    Deleted {
        path: String,
        key: String,
    },
    /// The user deleted the entry, but the bucket has a newer object someone else put: it stays,
    /// and the entry now mirrors it.
    KeptNewer {
        path: String,
        key: String,
    },
    /// A rename in the mount carried to the bucket: the object is at the entry's key now (put
    /// there from the old key's bytes, or from the local ones), and the old key's object, once
    /// it was, deleted.
    Moved {
        path: String,
        from: String,
        key: String,
    },
    /// A rename carried with no bytes to move: a directory (its old marker object, if any,
    /// deleted) or a file renamed back to where its object is.
    Carried {
        path: String,
        from: String,
    },
    /// A renamed entry whose object someone else deleted or replaced at its old key before the
    /// rename reached the bucket, and whose bytes are not here: the entry goes, as a delete of its
    /// object would have taken it.
    SourceGone {
        path: String,
        from: String,
    },
    /// Nothing to do: not a local change, already synced, superseded, a directory, a symbolic
    /// link or another entry without bytes (they stay in the namespace: docs/SEMANTICS.md).
    Nothing,
}

/// Handles one record of the change log for `mount` (the caller checked the path is under it
/// and the mount has sync enabled).
pub async fn sync_record(
    filer: &dyn Filer,
    storage: &dyn RemoteStorage,
    mount: &Mount,
    cluster_id: &str,
    clock: &dyn Clock,
    record: &ChangeRecord,
) -> Result<OutboundOutcome> {
    if record.origin != Origin::Local || record.path == mount.dir {
        return Ok(OutboundOutcome::Nothing);
    }
    let cx = Ctx { filer, storage, mount, map: KeyMap::new(&mount.dir, &mount.location.path)?, cluster_id };
    let map = &cx.map;
    match &record.new {
        None => {
            let Some(old) = &record.old else { return Ok(OutboundOutcome::Nothing) };
            if record.moved_to.is_some() {
                // Renamed: the moved entry carries its object (at this path's key, or at an
                // older one) to its new key, and deletes the old one after. A directory's
                // marker goes now, its children's records being before this one (a bucket on a
                // file system removes the directory only once they have gone). An entry with no
                // object of its own here (local-only, or itself renamed from elsewhere) hid
                // whatever someone else put at this key: that appears now.
                if old.is_dir() && old.remote.as_ref().is_some_and(|r| !r.etag.is_empty()) {
                    let at = moved_from(old).unwrap_or(&record.path).to_string();
                    cx.release(&at, old).await?;
                } else if old.remote.as_ref().is_none_or(|r| r.moved_from.is_some()) {
                    if !old.is_dir() {
                        cx.forget_pending_upload(&record.path, old).await?;
                    }
                    cx.uncover(&record.path, old.is_dir()).await?;
                }
                return Ok(OutboundOutcome::Nothing);
            }
            if let Some(from) = moved_from(old) {
                // A user deleted a renamed entry before its object moved: this path's key never
                // held it; the old one does.
                let from = from.to_string();
                cx.release(&from, old).await?;
                // A later delete of this path (its tombstone names another version) is its own
                // record's to finish. Otherwise an object at this path's own key is someone
                // else's (the entry never put one there), its event skipped while the entry was
                // pending: it appears now.
                let tomb = crate::docs::tombstone(filer, &record.path).await?;
                if tomb.as_ref().is_none_or(|t| t.version == old.version) {
                    // Its upload to this key may have been in flight when it was deleted.
                    if tomb.is_some() {
                        cx.forget_pending_upload(&record.path, old).await?;
                    }
                    cx.uncover(&record.path, old.is_dir()).await?;
                }
                let key = map.path_to_key(&from, old.is_dir()).unwrap_or_default();
                return Ok(OutboundOutcome::Deleted { path: record.path.clone(), key });
            }
            // A delete a user made: remove the object the entry was backed by.
            if old.kind.is_special() {
                return Ok(OutboundOutcome::Nothing); // a link or a device node never had an object
            }
            if old.is_dir() && old.remote.as_ref().is_none_or(|r| r.etag.is_empty()) {
                return Ok(OutboundOutcome::Nothing); // an implied directory has no object
            }
            let Some(key) = map.path_to_key(&record.path, old.is_dir()) else { return Ok(OutboundOutcome::Nothing) };
            // A later delete of the same path (its tombstone names another version) is handled by
            // its own record; this one must not touch the bucket or that tombstone.
            let tomb = crate::docs::tombstone(filer, &record.path).await?;
            if tomb.as_ref().is_some_and(|t| t.version != old.version) {
                return Ok(OutboundOutcome::Nothing);
            }
            // A path re-created since holds other data now: its own record uploads it.
            if filer.stat(&record.path).await?.is_some() {
                crate::docs::remove_tombstone(filer, &record.path).await?;
                return Ok(OutboundOutcome::Nothing);
            }
            let object = storage.stat(&key).await?;
            let outcome = match (&old.remote, &object) {
                (_, None) => OutboundOutcome::Nothing,
                (r, Some(o)) => {
                    // The object the entry was backed by, or this cluster's upload of the
                    // local write the user deleted before it was recorded. Not a copy of an
                    // upload of another path, nor an older upload someone restored: theirs.
                    let ours = is_entrys_pending_upload(o, Some(cluster_id), old);
                    if ours || r.as_ref().is_some_and(|r| r.etag == o.etag) {
                        storage.delete(&key).await?;
                        OutboundOutcome::Deleted { path: record.path.clone(), key }
                    } else {
                        // Someone else's object (newer than what the user deleted, or there while
                        // the file was only local): it stays.
                        OutboundOutcome::KeptNewer { path: record.path.clone(), key }
                    }
                }
            };
            crate::docs::remove_tombstone(filer, &record.path).await?;
            if let (OutboundOutcome::KeptNewer { .. }, Some(o)) = (&outcome, &object) {
                // Its notification may have been handled while the local file hid it (and
                // skipped): mirror it now rather than at the next reconcile.
                cx.mirror(&record.path, o, old.is_dir()).await?;
            }
            Ok(outcome)
        }
        Some(new) => {
            // An entry this one replaced whose object was still at an older key (renamed, not yet
            // carried): nothing names that object any more.
            if let Some(old) = &record.old
                && let Some(from) = moved_from(old)
                && moved_from(new) != Some(from)
            {
                let from = from.to_string();
                cx.release(&from, old).await?;
            }
            let Some(entry) = filer.stat(&record.path).await? else { return Ok(OutboundOutcome::Nothing) };
            let moved = moved_from(&entry).map(str::to_string);
            // Handled again (a restart) after the rename was carried but before its old key was
            // deleted: that deletion is still owed.
            if moved.is_none()
                && let Some(from) = moved_from(new).filter(|f| *f != record.path && !new.is_dir())
            {
                let tomb = crate::docs::tombstone(filer, from).await?;
                if tomb.is_some_and(|t| new.remote.as_ref().is_some_and(|r| r.etag == t.etag)) {
                    let from = from.to_string();
                    cx.release(&from, new).await?;
                }
            }
            if let Some(from) = &moved {
                if entry.is_dir() || *from == entry.path {
                    return cx.carry_without_bytes(entry, from.clone()).await;
                }
            } else if entry.is_dir() || !is_locally_dirty(&entry) || entry.content == Content::Remote {
                return Ok(OutboundOutcome::Nothing);
            }
            let Some(key) = map.path_to_key(&entry.path, false) else { return Ok(OutboundOutcome::Nothing) };
            // What a reader of the object should get back (a PUT through the gateway kept its
            // headers and metadata); Tidemark's own metadata last, so no user name replaces it.
            let mut meta = object_attrs::user_metadata(&entry.extended);
            meta.extend(upload_metadata(cluster_id, &entry.path, entry.version));
            let headers =
                ObjectHeaders { storage_class: None, restore: None, ..object_attrs::headers(&entry.extended) };
            // A renamed file whose bytes are its old key's object is copied in the bucket
            // (server-side where the store can); otherwise its bytes are read — its own (written
            // here, or cached), or the old key's object — and put.
            let copy_from = moved
                .as_deref()
                .filter(|_| entry.content == Content::Remote && entry.size <= MAX_COPY_BYTES)
                .and_then(|from| map.path_to_key(from, false));
            let mut object = None;
            if let Some(old_key) = &copy_from {
                cx.keep_what_reads(&entry).await?;
                let etag = entry.remote.as_ref().map(|r| r.etag.as_str()).unwrap_or_default();
                match storage.copy(old_key, &key, etag, meta.clone(), &headers).await {
                    Ok(o) => object = Some(o),
                    // Changed or gone at the old key: the cache may still hold the bytes.
                    Err(Error::PreconditionFailed { .. } | Error::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            let object = match object {
                Some(o) => o,
                None => {
                    let body = match open_read(filer, &entry).await {
                        Ok(Some(b)) => b,
                        Ok(None) => return Ok(OutboundOutcome::Nothing), // changed again: the newer record uploads it
                        Err(e) => {
                            if let Some(from) = moved
                                && source_is_gone(storage, map, &entry, &from).await?
                            {
                                return cx.source_gone(entry, from).await;
                            }
                            return Err(e);
                        }
                    };
                    cx.keep_what_reads(&entry).await?;
                    // Streamed, in parts where the store takes them: a large file is never
                    // whole in memory, nor bound by the largest single request.
                    storage.put_stream(&key, body, entry.size, meta, &headers).await?
                }
            };
            let mut synced = entry.to_new();
            // As the bucket now answers for it (its storage class, too).
            object_attrs::refresh(&mut synced.extended, &object, false);
            synced.mtime_ms = object.last_modified_ms;
            synced.remote = Some(RemoteEntry {
                storage: mount.location.storage.clone(),
                etag: object.etag.clone(),
                remote_mtime_ms: object.last_modified_ms,
                remote_size: object.size,
                version_id: object.version_id.clone(),
                last_local_sync_ms: Some(clock.now_ms()),
                dirty_after: None,
                moved_from: None,
            });
            // Bookkeeping, not a local change: `System`, so it is not uploaded again.
            let txn =
                Txn::put(&entry.path, synced, Origin::System).with_precondition(Precondition::Version(entry.version));
            match filer.apply(txn).await {
                Ok(_) => {}
                Err(Error::PreconditionFailed { .. }) => {
                    // Written again (its own record uploads it) or renamed away meanwhile: then
                    // nothing names this upload; it goes rather than come back as a file.
                    if filer.stat(&entry.path).await?.is_none()
                        && storage.stat(&key).await?.is_some_and(|o| o.etag == object.etag)
                    {
                        storage.delete(&key).await?;
                    }
                    return Ok(OutboundOutcome::Nothing);
                }
                Err(e) => return Err(e),
            }
            if let Some(from) = moved_from(&entry) {
                // The object is at its new key: now, and only now, the old one goes.
                let from = from.to_string();
                cx.release(&from, &entry).await?;
                return Ok(OutboundOutcome::Moved { path: entry.path, from, key });
            }
            Ok(OutboundOutcome::Uploaded { path: entry.path, key })
        }
    }
}

/// CopyObject's limit; a larger renamed object's bytes are read and put.
const MAX_COPY_BYTES: u64 = 5 << 30;

/// What the handling of one record works with.
struct Ctx<'a> {
    filer: &'a dyn Filer,
    storage: &'a dyn RemoteStorage,
    mount: &'a Mount,
    map: KeyMap,
    cluster_id: &'a str,
}

impl Ctx<'_> {
    /// Before `entry`'s upload replaces the object at its key: a renamed file that still reads
    /// its bytes from that object keeps them, as its local bytes.
    async fn keep_what_reads(&self, entry: &Entry) -> Result<()> {
        match needed_by(self.filer, &entry.path).await? {
            Some(x) if x.path != entry.path => self.localize(x).await,
            _ => Ok(()),
        }
    }

    /// A file renamed away from `path` before its object was put at `path`'s key may have been
    /// put there all the same (its upload in flight when the rename was made; the rename left a
    /// tombstone of that pending upload): that object is nobody's, and goes. Then the tombstone.
    async fn forget_pending_upload(&self, path: &str, old: &Entry) -> Result<()> {
        let (filer, storage) = (self.filer, self.storage);
        let Some(t) = crate::docs::tombstone(filer, path).await? else { return Ok(()) };
        if t.version != old.version || !t.pending_upload {
            return Ok(()); // a later delete's or rename's: its own record's to finish
        }
        if filer.stat(path).await?.is_none()
            && let Some(key) = self.map.path_to_key(path, false)
            && let Some(o) = storage.stat(&key).await?
            && is_pending_upload(&o, Some(self.cluster_id), path, t.version, t.pending_after)
        {
            storage.delete(&key).await?;
        }
        crate::docs::remove_tombstone(filer, path).await
    }

    /// Once an entry that hid `path`'s key has gone from `path` (renamed away or deleted, never
    /// having put an object there), what someone else put at that key — its event skipped while
    /// the entry was there — appears now rather than at the next reconcile.
    async fn uncover(&self, path: &str, is_dir: bool) -> Result<()> {
        let (filer, storage, map) = (self.filer, self.storage, &self.map);
        if filer.stat(path).await?.is_some() {
            return Ok(());
        }
        let Some(key) = map.path_to_key(path, is_dir) else { return Ok(()) };
        match storage.stat(&key).await? {
            Some(o) => self.mirror(path, &o, is_dir).await,
            None => Ok(()),
        }
    }

    /// Writes the object at `path`'s key into the namespace as an event's apply would, `path`
    /// having no entry now: for an object whose event was skipped while a local change hid it.
    async fn mirror(&self, path: &str, object: &tidemark_core::RemoteObject, is_dir_marker: bool) -> Result<()> {
        let (filer, mount, cluster_id) = (self.filer, self.mount, self.cluster_id);
        let ctx = DecideCtx { storage: &mount.location.storage, cluster_id: Some(cluster_id), tombstone: None };
        let side = RemoteSide { object, is_dir_marker };
        // A user's delete of `path` still to be propagated (its tombstone) keeps the object out.
        let rules = crate::write::WriteRules { fence: None, allow_delete: true, check_tombstones: true, heads: None };
        // Absent as far as the caller knows; a conditional write that finds otherwise decides again.
        crate::write::decide_and_write(filer, path, None, Some(side), &ctx, rules).await.map(drop)
    }

    /// Makes the bytes of `x` (a renamed file reading them from its old key) local — written as its
    /// content, its times, mode and attributes kept; still to be carried to its new key — so that
    /// key can be overwritten. If they are gone from the bucket already, `x` goes (`source_gone`).
    async fn localize(&self, x: Entry) -> Result<()> {
        let (filer, storage, map) = (self.filer, self.storage, &self.map);
        let from = moved_from(&x).unwrap_or_default().to_string();
        let body = match open_read(filer, &x).await {
            Ok(Some(b)) => b,
            Ok(None) => {
                return Err(Error::Unavailable {
                    message: format!("{}: changed while its bytes were kept; retry", x.path),
                });
            }
            Err(e) => {
                if source_is_gone(storage, map, &x, &from).await? {
                    return self.source_gone(x, from).await.map(drop);
                }
                return Err(e);
            }
        };
        let opts = tidemark_core::WriteOptions {
            precondition: Precondition::Version(x.version),
            mode: Some(x.mode),
            mtime_ms: Some(x.mtime_ms),
            extended: Some(x.extended.clone()),
            ..Default::default()
        };
        filer.write(&x.path, body, opts).await.map(drop)
    }

    /// Deletes the object at `from`'s key that `was` (an entry renamed from there) was backed by,
    /// now that nothing names it: unless an entry at `from` is backed by it again (renamed back, or
    /// mirrored from it), or the key holds someone else's object (it stays, and is mirrored if
    /// nothing is at `from`). An entry at `from` that is not (a new local file, one renamed in) does
    /// not keep it: its own sync writes that key. Then the tombstone the rename left at `from` goes.
    async fn release(&self, from: &str, was: &Entry) -> Result<()> {
        let (filer, storage, map) = (self.filer, self.storage, &self.map);
        let Some(recorded) = &was.remote else { return Ok(()) };
        if needed_by(filer, from).await?.is_some_and(|x| x.path != was.path) {
            return Ok(()); // another renamed file still reads it: its own carry releases it
        }
        let tomb = crate::docs::tombstone(filer, from).await?;
        let ours_tomb = tomb.as_ref().is_some_and(|t| t.etag == recorded.etag);
        let here = filer.stat(from).await?;
        let backed_here = here
            .as_ref()
            .and_then(|e| e.remote.as_ref())
            .is_some_and(|r| r.etag == recorded.etag && r.moved_from.as_deref().is_none_or(|m| m == from));
        let is_dir = was.is_dir();
        let implied = is_dir && recorded.etag.is_empty(); // an implied directory had no object
        if !backed_here
            && !implied
            && let Some(key) = map.path_to_key(from, is_dir)
        {
            match storage.stat(&key).await? {
                Some(o) if o.etag == recorded.etag => storage.delete(&key).await?,
                // Someone else's object, put there since the rename: it stays, and appears at
                // `from` now rather than at the next reconcile.
                Some(o) if here.is_none() => {
                    if ours_tomb {
                        crate::docs::remove_tombstone(filer, from).await?;
                    }
                    return self.mirror(from, &o, is_dir).await;
                }
                _ => {}
            }
        }
        if ours_tomb {
            crate::docs::remove_tombstone(filer, from).await?;
        }
        Ok(())
    }

    /// Carries the rename of an entry whose bytes need not move: a directory (moved in the mount,
    /// it is as a directory made there: local until something below it is synced; the old marker
    /// object, if it had one, goes) or an entry moved back to where its object is.
    async fn carry_without_bytes(&self, entry: Entry, from: String) -> Result<OutboundOutcome> {
        let filer = self.filer;
        let mut carried = entry.to_new();
        if entry.is_dir() && from != entry.path {
            carried.remote = None;
        } else if let Some(r) = carried.remote.as_mut() {
            r.moved_from = None;
        }
        let txn =
            Txn::put(&entry.path, carried, Origin::System).with_precondition(Precondition::Version(entry.version));
        match filer.apply(txn).await {
            Ok(_) => {}
            Err(Error::PreconditionFailed { .. }) => return Ok(OutboundOutcome::Nothing), // its next record
            Err(e) => return Err(e),
        }
        // A directory's old marker goes with its old path's record, after its children's.
        if !entry.is_dir() {
            self.release(&from, &entry).await?;
        }
        Ok(OutboundOutcome::Carried { path: entry.path, from })
    }

    /// A renamed entry whose object is gone from its old key (or replaced there by someone else's)
    /// and whose bytes are not here: it goes, as the object's delete would have taken it had the
    /// rename not been made; what is at the old key now is mirrored there.
    async fn source_gone(&self, entry: Entry, from: String) -> Result<OutboundOutcome> {
        let filer = self.filer;
        let txn =
            Txn::delete(&entry.path, false, Origin::Remote).with_precondition(Precondition::Version(entry.version));
        match filer.apply(txn).await {
            Ok(_) => {}
            Err(Error::PreconditionFailed { .. } | Error::NotFound { .. }) => return Ok(OutboundOutcome::Nothing),
            Err(e) => return Err(e),
        }
        tracing::warn!(path = %entry.path, from = %from, "outbound sync: a renamed file's object was deleted or replaced in the bucket before the rename reached it; the file goes, as that delete would have taken it");
        // An object someone put at its own key meanwhile (its event skipped: the renamed file was
        // pending there) appears now rather than at the next reconcile.
        self.uncover(&entry.path, false).await?;
        self.release(&from, &entry).await?;
        Ok(OutboundOutcome::SourceGone { path: entry.path, from })
    }
}

/// The renamed file that still reads its bytes from `path`'s object, if one does: the entry
/// where the rename's tombstone at `path` says it went, if it still names `path` as where its
/// object is, that object is the tombstone's, and its bytes are not here.
async fn needed_by(filer: &dyn Filer, path: &str) -> Result<Option<Entry>> {
    let Some(t) = crate::docs::tombstone(filer, path).await? else { return Ok(None) };
    let Some(at) = &t.moved_to else { return Ok(None) };
    let Some(x) = filer.stat(at).await? else { return Ok(None) };
    let reads_it = x.content == Content::Remote
        && x.remote.as_ref().is_some_and(|r| r.moved_from.as_deref() == Some(path) && r.etag == t.etag);
    Ok(reads_it.then_some(x))
}

/// Where a renamed entry's object still is, if the rename has not reached the bucket.
fn moved_from(e: &Entry) -> Option<&str> {
    e.remote.as_ref().and_then(|r| r.moved_from.as_deref())
}

/// The entry's bytes as a stream, if it is still at the version stat'ed.
async fn open_read(filer: &dyn Filer, entry: &Entry) -> Result<Option<ByteStream>> {
    let (read, stream) = filer.read(&entry.path, None).await?;
    Ok((read.version == entry.version).then_some(stream))
}

/// Whether a renamed entry's object is no longer at its old key as recorded (deleted there, or
/// replaced by someone else's), so its bytes cannot be had from the bucket.
async fn source_is_gone(storage: &dyn RemoteStorage, map: &KeyMap, entry: &Entry, from: &str) -> Result<bool> {
    let Some(key) = map.path_to_key(from, false) else { return Ok(true) };
    let recorded = entry.remote.as_ref().map(|r| r.etag.as_str());
    Ok(storage.stat(&key).await?.is_none_or(|o| Some(o.etag.as_str()) != recorded))
}

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

use bytes::BytesMut;
use futures::StreamExt;

use tidemark_core::decide::{DecideCtx, RemoteSide, is_entrys_pending_upload, is_locally_dirty, upload_metadata};
use tidemark_core::keymap::KeyMap;
use tidemark_core::model::{ChangeRecord, Content, Origin, Precondition, RemoteEntry, Txn, object_attrs};
use tidemark_core::remote::{Mount, ObjectHeaders};
use tidemark_core::{Clock, Error, Filer, RemoteStorage, Result};

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
    let map = KeyMap::new(&mount.dir, &mount.location.path)?;
    match &record.new {
        None => {
            // A delete a user made: remove the object the entry was backed by.
            let Some(old) = &record.old else { return Ok(OutboundOutcome::Nothing) };
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
                let ctx = DecideCtx { storage: &mount.location.storage, cluster_id: Some(cluster_id), tombstone: None };
                let side = RemoteSide { object: o, is_dir_marker: old.is_dir() };
                let rules =
                    crate::write::WriteRules { fence: None, allow_delete: true, check_tombstones: false, heads: None };
                crate::write::decide_and_write(filer, &record.path, None, Some(side), &ctx, rules).await?;
            }
            Ok(outcome)
        }
        Some(_) => {
            let Some(entry) = filer.stat(&record.path).await? else { return Ok(OutboundOutcome::Nothing) };
            if entry.is_dir() || !is_locally_dirty(&entry) || entry.content == Content::Remote {
                return Ok(OutboundOutcome::Nothing);
            }
            let Some(key) = map.path_to_key(&entry.path, false) else { return Ok(OutboundOutcome::Nothing) };
            let (read, mut stream) = filer.read(&entry.path, None).await?;
            if read.version != entry.version {
                return Ok(OutboundOutcome::Nothing); // changed again: the newer record uploads it
            }
            let mut body = BytesMut::with_capacity(read.size as usize);
            while let Some(chunk) = stream.next().await {
                body.extend_from_slice(&chunk.map_err(|e| Error::io(format!("reading {}", entry.path), e))?);
            }
            // What a reader of the object should get back (a PUT through the gateway kept its
            // headers and metadata); Tidemark's own metadata last, so no user name replaces it.
            let mut meta = object_attrs::user_metadata(&entry.extended);
            meta.extend(upload_metadata(cluster_id, &entry.path, entry.version));
            let headers =
                ObjectHeaders { storage_class: None, restore: None, ..object_attrs::headers(&entry.extended) };
            let object = storage.put_with_headers(&key, body.freeze(), meta, &headers).await?;
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
            });
            // Bookkeeping, not a local change: `System`, so it is not uploaded again.
            let txn =
                Txn::put(&entry.path, synced, Origin::System).with_precondition(Precondition::Version(entry.version));
            match filer.apply(txn).await {
                Ok(_) | Err(Error::PreconditionFailed { .. }) => {}
                Err(e) => return Err(e),
            }
            Ok(OutboundOutcome::Uploaded { path: entry.path, key })
        }
    }
}

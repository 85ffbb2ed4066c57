//! `decide`: the one decision function of Tidemark, used by the full reconcile
//! (`remote.meta.sync`) and, key by key, by the event applier. It is pure: the outcome depends
//! only on the local entry and the remote object's *current* state (never on an event's payload).
//!
//! Rules, in order (DESIGN §4):
//! 1. a local entry without a remote record (local-only) is never touched;
//! 2. a locally dirty entry (written locally since the last sync) is never overwritten;
//! 3. the echo of this cluster's own upload *of this entry* is skipped (see [`own_upload_of`]):
//!    while the entry's upload is pending, or once recorded while the object is still the one
//!    recorded — a copy of an upload to another key, or an older upload restored over the
//!    entry, is a change like any other;
//! 4. a remote object without a local entry is created (metadata only) — unless a user deleted
//!    the entry under a synced mount and the delete is not propagated yet (a tombstone): the
//!    object is the one the user deleted (same etag and mtime), or this cluster's own upload of
//!    that path at a version the user deleted since;
//! 5. if etag, mtime or size differ, the entry is updated; a file where the remote has a
//!    directory (or the reverse) is a conflict, reported and left alone;
//! 6. a remote-backed entry whose object is gone is deleted (metadata only);
//! 7. otherwise the entry is in sync.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{Content, Entry, EntryKind, NewEntry, RemoteEntry};
use crate::remote::RemoteObject;

/// User metadata an upload by Tidemark carries, to recognise its echo: the cluster that
/// uploaded it, the entry it is the upload of ([`entry_binding`] of its path) and that entry's
/// version. A copy keeps all three, so the path is what tells a copy from the upload.
pub const ORIGIN_METADATA: &str = "tidemark-origin";
pub const VERSION_METADATA: &str = "tidemark-version";
pub const ENTRY_METADATA: &str = "tidemark-entry";

/// The `tidemark-entry` value of an upload of `path`: the first 32 hex digits of SHA-256 over
/// the path. A digest, not the path, because metadata values must be ASCII on every provider
/// and short (S3 allows 2 KiB for all of them), and a path may be neither.
pub fn entry_binding(path: &str) -> String {
    use sha2::{Digest, Sha256};
    crate::ids::hex(&Sha256::digest(path.as_bytes())[..16])
}

/// The metadata an upload of `path` at `version` by `cluster_id` carries.
pub fn upload_metadata(cluster_id: &str, path: &str, version: u64) -> std::collections::BTreeMap<String, String> {
    [
        (ORIGIN_METADATA.to_string(), cluster_id.to_string()),
        (ENTRY_METADATA.to_string(), entry_binding(path)),
        (VERSION_METADATA.to_string(), version.to_string()),
    ]
    .into()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// The entry exists only locally (never synced from or to the remote).
    LocalOnly,
    /// The entry was written locally after its last sync and waits for upload.
    LocalDirty,
    /// The object is this cluster's own upload of the entry's current (or an older) version.
    Echo,
    /// This cluster uploaded the object, and a user has deleted the entry since.
    Tombstone,
    /// A file and a directory want the same path (the file `a` and the key `a/b`): the key that
    /// came second is *shadowed* until what is in its way goes.
    Conflict,
    InSync,
}

impl SkipReason {
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::LocalOnly => "local-only",
            SkipReason::LocalDirty => "locally dirty",
            SkipReason::Echo => "echo of this cluster's upload",
            SkipReason::Tombstone => "deleted locally, delete pending upload",
            SkipReason::Conflict => "shadowed: a file or directory is in its way",
            SkipReason::InSync => "in sync",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Create the entry, metadata only (its content stays remote until read).
    Create(NewEntry),
    /// Replace the entry's metadata; any cached content is dropped.
    Update(NewEntry),
    /// Delete the entry's metadata (never the object: it is already gone).
    Delete,
    Skip(SkipReason),
}

/// What `decide` needs besides the two sides.
#[derive(Debug, Clone, Copy, Default)]
pub struct DecideCtx<'a> {
    /// The `remote.configure` name of the mount's storage.
    pub storage: &'a str,
    /// This cluster's id, to recognise its own uploads.
    pub cluster_id: Option<&'a str>,
    /// The user's delete of this path, if one is waiting for the outbound sync.
    pub tombstone: Option<&'a Tombstone>,
}

/// A user's delete of a remote-backed file under a synced mount, kept until the outbound sync
/// has deleted its object (`system_paths::tombstone`), so that remote state the user already
/// deleted — a late or redelivered event, a reconcile listing the object before the delete
/// reaches the bucket — does not bring the entry back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    pub path: String,
    /// The version of the entry that was deleted.
    pub version: u64,
    /// The object the entry was backed by when deleted.
    pub etag: String,
    pub remote_mtime_ms: i64,
    pub deleted_at_ms: i64,
    /// Whether the deleted entry held a local write not recorded as uploaded yet (dirty), so an
    /// upload of it by this cluster may be what the bucket holds. Otherwise only the recorded
    /// object is the one the user deleted. Absent in tombstones written before it existed: true.
    #[serde(default = "pending_by_default")]
    pub pending_upload: bool,
    /// With `pending_upload`: the entry's version when it was last clean (`RemoteEntry::dirty_after`),
    /// so an older upload of the path someone restored is not taken for the deleted write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_after: Option<u64>,
    /// For a rename (not a delete): where the renamed entry is now, while its bytes are still
    /// this path's object (`RemoteEntry::moved_from`). The outbound sync asks it before it
    /// overwrites or deletes that object, so no renamed file loses the bytes it reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_to: Option<String>,
}

fn pending_by_default() -> bool {
    true
}

/// The remote side of a decision: the object, and whether its key is a directory marker
/// (`a/b/`), which maps to a directory.
#[derive(Debug, Clone, Copy)]
pub struct RemoteSide<'a> {
    pub object: &'a RemoteObject,
    pub is_dir_marker: bool,
}

/// Whether the entry was written locally after its last sync. Local writes to a remote-backed
/// entry always move its mtime past the recorded remote mtime (see `LocalFiler::write`).
/// A file renamed in its mount whose object is still at its old key is dirty too: its own key
/// holds nothing of it yet.
pub fn is_locally_dirty(e: &Entry) -> bool {
    match &e.remote {
        None => e.kind == EntryKind::File,
        Some(r) => e.kind == EntryKind::File && (e.mtime_ms > r.remote_mtime_ms || r.moved_from.is_some()),
    }
}

/// Whether the entry (file or directory) was renamed in its mount and the outbound sync has not
/// yet carried the rename to the bucket: nothing at its own key says anything about it.
pub fn is_moved(e: &Entry) -> bool {
    e.remote.as_ref().is_some_and(|r| r.moved_from.is_some())
}

/// The entry version of which `o` is this cluster's upload *for `path`*, if it is one: its
/// origin is this cluster and its entry binding is `path`'s. An object copied from an upload
/// keeps that upload's metadata, so a copy to another key (or bucket, or mount) names another
/// path and is not an upload of this one. Uploads by older versions of Tidemark, which carry no
/// binding, are nobody's.
pub fn own_upload_of(o: &RemoteObject, cluster_id: Option<&str>, path: &str) -> Option<u64> {
    let meta = o.user_metadata.as_ref()?;
    if cluster_id.is_none() || meta.get(ORIGIN_METADATA).map(String::as_str) != cluster_id {
        return None;
    }
    if *meta.get(ENTRY_METADATA)? != entry_binding(path) {
        return None;
    }
    meta.get(VERSION_METADATA)?.parse().ok()
}

/// Whether `o` is this cluster's upload of one of the local writes to `path` not recorded yet:
/// an upload of that path at a version after `dirty_after` (the entry's version when it was
/// last clean; `None`: not known, any) and no newer than `version` (the entry's latest). An
/// older upload of the path — restored over it by a copy, say — is not one: it is a change.
pub fn is_pending_upload(
    o: &RemoteObject,
    cluster_id: Option<&str>,
    path: &str,
    version: u64,
    dirty_after: Option<u64>,
) -> bool {
    own_upload_of(o, cluster_id, path).is_some_and(|v| v <= version && dirty_after.is_none_or(|after| v > after))
}

/// Whether `o` is this cluster's upload of a local write `e` holds and has not recorded (`e` is
/// local-only or locally dirty).
pub fn is_entrys_pending_upload(o: &RemoteObject, cluster_id: Option<&str>, e: &Entry) -> bool {
    let pending = e.remote.is_none() || is_locally_dirty(e);
    pending && is_pending_upload(o, cluster_id, &e.path, e.version, pending_after(e))
}

/// The version after which this cluster's uploads of `e`'s path are of its pending writes: where
/// it was last clean (remote-backed), or from before it was created (local-only).
pub fn pending_after(e: &Entry) -> Option<u64> {
    match &e.remote {
        Some(r) => r.dirty_after,
        None => e.extended.get(crate::model::CREATED_AFTER_ATTR).and_then(|v| v.parse().ok()),
    }
}

/// Whether `o` is the object `recorded` describes (the same test that decides an update).
fn is_recorded(recorded: &RemoteEntry, o: &RemoteObject, is_dir_marker: bool) -> bool {
    if is_dir_marker {
        recorded.etag == o.etag
    } else {
        recorded.etag == o.etag && recorded.remote_mtime_ms == o.last_modified_ms && recorded.remote_size == o.size
    }
}

/// The extended attributes of `keep` brought up to date with the object's headers and metadata
/// (a directory keeps its own: a marker's headers are not the directory's).
fn attrs_for(remote: RemoteSide<'_>, keep: Option<&Entry>) -> BTreeMap<String, String> {
    let mut ext = keep.map(|e| e.extended.clone()).unwrap_or_default();
    if !remote.is_dir_marker {
        let same = keep.and_then(|e| e.remote.as_ref()).is_some_and(|r| is_recorded(r, remote.object, false));
        crate::model::object_attrs::refresh(&mut ext, remote.object, same);
    }
    ext
}

/// The entry a remote object maps to, keeping what is local to the entry (`mode`, extended
/// attributes other than the object's headers and metadata).
pub fn entry_for(remote: RemoteSide<'_>, storage: &str, keep: Option<&Entry>) -> NewEntry {
    let o = remote.object;
    let is_dir = remote.is_dir_marker;
    NewEntry {
        kind: if is_dir { EntryKind::Dir } else { EntryKind::File },
        size: if is_dir { 0 } else { o.size },
        mtime_ms: o.last_modified_ms,
        mode: keep
            .map_or(if is_dir { crate::model::DEFAULT_DIR_MODE } else { crate::model::DEFAULT_FILE_MODE }, |e| e.mode),
        remote: Some(RemoteEntry {
            storage: storage.to_string(),
            etag: o.etag.clone(),
            remote_mtime_ms: o.last_modified_ms,
            remote_size: o.size,
            version_id: o.version_id.clone(),
            last_local_sync_ms: None,
            dirty_after: None,
            moved_from: None,
        }),
        content: if is_dir || o.size == 0 { Content::Empty } else { Content::Remote },
        extended: attrs_for(remote, keep),
        // The owner stays; the change is now (its ctime follows its mtime).
        posix: crate::model::PosixAttrs {
            uid: keep.and_then(|e| e.posix.uid),
            gid: keep.and_then(|e| e.posix.gid),
            ..Default::default()
        },
    }
}

pub fn decide(local: Option<&Entry>, remote: Option<RemoteSide<'_>>, ctx: &DecideCtx<'_>) -> Action {
    if let Some(l) = local {
        // First of all: the bucket's event for this cluster's upload of this entry usually
        // arrives before the outbound sync has recorded it, while the entry is still local-only
        // or dirty, and is then an echo (the pending write is the newer state; every rule below
        // would skip it alike, this one names it rightly). Once the upload is recorded, the
        // object is an echo only while it is still the recorded one: an older upload restored
        // over the entry by a copy is a change, decided below like any other.
        if let Some(r) = remote
            && !l.is_dir()
            && (is_entrys_pending_upload(r.object, ctx.cluster_id, l)
                || own_upload_of(r.object, ctx.cluster_id, &l.path).is_some_and(|v| v <= l.version)
                    && l.remote.as_ref().is_some_and(|rec| is_recorded(rec, r.object, r.is_dir_marker)))
        {
            return Action::Skip(SkipReason::Echo);
        }
        let Some(recorded) = &l.remote else {
            return Action::Skip(SkipReason::LocalOnly);
        };
        if is_locally_dirty(l) || is_moved(l) {
            return Action::Skip(SkipReason::LocalDirty);
        }
        let Some(r) = remote else {
            return Action::Delete;
        };
        if l.is_dir() != r.is_dir_marker {
            return Action::Skip(SkipReason::Conflict);
        }
        return if is_recorded(recorded, r.object, r.is_dir_marker) {
            // The same bytes, but what a client reads back about them may have changed (S3
            // metadata replaced in place keeps the ETag; a restore of an archived object). An
            // answer without headers or metadata (a listing) changes none of them.
            let carries = r.object.headers.is_some() || r.object.user_metadata.is_some();
            if !carries || attrs_for(r, Some(l)) == l.extended {
                Action::Skip(SkipReason::InSync)
            } else {
                Action::Update(entry_for(r, ctx.storage, Some(l)))
            }
        } else {
            Action::Update(entry_for(r, ctx.storage, Some(l)))
        };
    }
    match remote {
        None => Action::Skip(SkipReason::InSync),
        Some(r) => {
            if let Some(t) = ctx.tombstone {
                let deleted_object = r.object.etag == t.etag && r.object.last_modified_ms == t.remote_mtime_ms;
                let deleted_upload = t.pending_upload
                    && is_pending_upload(r.object, ctx.cluster_id, &t.path, t.version, t.pending_after);
                if deleted_object || deleted_upload {
                    return Action::Skip(SkipReason::Tombstone);
                }
            }
            Action::Create(entry_for(r, ctx.storage, None))
        }
    }
}

/// Whether the decision for an absent entry with `tombstone` needs the object's user metadata
/// (a listing does not carry it): only a tombstone of a pending upload asks whose upload an
/// object is; for a present entry an echo is skipped exactly where another rule would skip it.
pub fn needs_metadata(local: Option<&Entry>, remote: Option<RemoteSide<'_>>, tombstone: Option<&Tombstone>) -> bool {
    local.is_none()
        && tombstone.is_some_and(|t| t.pending_upload)
        && remote.is_some_and(|r| r.object.user_metadata.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::ObjectHeaders;

    fn obj(etag: &str, mtime: i64, size: u64) -> RemoteObject {
        RemoteObject {
            key: "k".into(),
            size,
            etag: etag.into(),
            last_modified_ms: mtime,
            version_id: None,
            user_metadata: None,
            headers: None,
        }
    }

    /// `o` as uploaded by `cluster` for the entry at `path`, version `version` (or copied from
    /// such an upload: a copy keeps the metadata).
    fn with_origin(mut o: RemoteObject, cluster: &str, path: &str, version: u64) -> RemoteObject {
        o.user_metadata = Some(upload_metadata(cluster, path, version));
        o
    }

    /// An upload by a Tidemark that did not bind uploads to their entry.
    fn unbound(mut o: RemoteObject, cluster: &str, version: u64) -> RemoteObject {
        let mut m = BTreeMap::new();
        m.insert(ORIGIN_METADATA.to_string(), cluster.to_string());
        m.insert(VERSION_METADATA.to_string(), version.to_string());
        o.user_metadata = Some(m);
        o
    }

    fn synced(kind: EntryKind, etag: &str, mtime: i64, size: u64, version: u64) -> Entry {
        Entry {
            path: "/m/k".into(),
            kind,
            size,
            mtime_ms: mtime,
            mode: 0o644,
            version,
            remote: Some(RemoteEntry {
                storage: "r".into(),
                etag: etag.into(),
                remote_mtime_ms: mtime,
                remote_size: size,
                version_id: None,
                last_local_sync_ms: None,
                dirty_after: None,
                moved_from: None,
            }),
            content: Content::Remote,
            extended: Default::default(),
            posix: Default::default(),
        }
    }

    fn local_only() -> Entry {
        Entry { remote: None, content: Content::Inline, ..synced(EntryKind::File, "", 5, 3, 9) }
    }

    /// Written locally at version 9 since it was clean at version 7.
    fn dirty() -> Entry {
        let mut e = synced(EntryKind::File, "e1", 100, 3, 9);
        e.mtime_ms = 101;
        e.remote.as_mut().unwrap().dirty_after = Some(7);
        e
    }

    const CTX: DecideCtx<'static> = DecideCtx { storage: "r", cluster_id: Some("us"), tombstone: None };

    /// The tombstone of a dirty entry (its upload may be in the bucket).
    fn tomb(version: u64, etag: &str, mtime: i64) -> &'static Tombstone {
        Box::leak(Box::new(Tombstone {
            path: "/m/x".into(),
            version,
            etag: etag.into(),
            remote_mtime_ms: mtime,
            deleted_at_ms: 0,
            pending_upload: true,
            pending_after: None,
            moved_to: None,
        }))
    }

    /// The tombstone of an entry dirty since version `after`.
    fn tomb_after(version: u64, after: u64) -> &'static Tombstone {
        Box::leak(Box::new(Tombstone { pending_after: Some(after), ..tomb(version, "other", 1).clone() }))
    }

    /// The tombstone of a clean entry.
    fn clean_tomb(version: u64, etag: &str, mtime: i64) -> &'static Tombstone {
        Box::leak(Box::new(Tombstone { pending_upload: false, ..tomb(version, etag, mtime).clone() }))
    }

    fn file(o: &RemoteObject) -> Option<RemoteSide<'_>> {
        Some(RemoteSide { object: o, is_dir_marker: false })
    }

    fn marker(o: &RemoteObject) -> Option<RemoteSide<'_>> {
        Some(RemoteSide { object: o, is_dir_marker: true })
    }

    fn kind(a: &Action) -> &'static str {
        match a {
            Action::Create(_) => "create",
            Action::Update(_) => "update",
            Action::Delete => "delete",
            Action::Skip(_) => "skip",
        }
    }

    /// Every row of the decision table, with its expected action.
    #[test]
    fn the_decision_table() {
        let o1 = obj("e1", 100, 3);
        let in_sync = synced(EntryKind::File, "e1", 100, 3, 9);
        let dir_entry = synced(EntryKind::Dir, "", 100, 0, 9);
        let marker_entry = synced(EntryKind::Dir, "m1", 100, 0, 9);
        // The entry /m/k after its upload of version 9 was recorded (the record is version 10).
        let uploaded = synced(EntryKind::File, "e-new", 200, 4, 10);
        let echo_new = with_origin(obj("e-new", 200, 4), "us", "/m/k", 9);
        let echo_old = with_origin(obj("e-new", 200, 4), "us", "/m/k", 3);
        let restored_old = with_origin(obj("e-old", 300, 5), "us", "/m/k", 3);
        let not_echo_newer = with_origin(obj("e-new", 200, 4), "us", "/m/k", 12);
        let other_cluster = with_origin(obj("e-new", 200, 4), "them", "/m/k", 9);
        let copy_of_other_path = with_origin(obj("e-new", 200, 4), "us", "/n/other", 3);
        let tomb_upload = with_origin(obj("e-new", 200, 4), "us", "/m/x", 3);
        let tomb_upload_newer = with_origin(obj("e-new", 200, 4), "us", "/m/x", 12);
        let old_style_same = unbound(obj("e-new", 200, 4), "us", 9);
        let old_style_changed = unbound(obj("e-old", 300, 5), "us", 3);
        let marker_obj = obj("m1", 100, 0);
        let marker_obj2 = obj("m2", 150, 0);
        let (o_etag, o_mtime, o_size) = (obj("e2", 100, 3), obj("e1", 200, 3), obj("e1", 100, 4));
        let o_changed = obj("e2", 300, 9);
        let (dirty, local_only) = (dirty(), local_only());

        // (row, local, remote, context, expected action)
        type Row<'a> = (&'a str, Option<&'a Entry>, Option<RemoteSide<'a>>, DecideCtx<'a>, Action);
        let rows: Vec<Row> = vec![
            ("create", None, file(&o1), CTX, Action::Create(entry_for(file(&o1).unwrap(), "r", None))),
            (
                "update on etag",
                Some(&in_sync),
                file(&o_etag),
                CTX,
                Action::Update(entry_for(file(&o_etag).unwrap(), "r", Some(&in_sync))),
            ),
            (
                "update on mtime",
                Some(&in_sync),
                file(&o_mtime),
                CTX,
                Action::Update(entry_for(file(&o_mtime).unwrap(), "r", Some(&in_sync))),
            ),
            (
                "update on size",
                Some(&in_sync),
                file(&o_size),
                CTX,
                Action::Update(entry_for(file(&o_size).unwrap(), "r", Some(&in_sync))),
            ),
            ("in sync", Some(&in_sync), file(&o1), CTX, Action::Skip(SkipReason::InSync)),
            ("skip local-only, remote present", Some(&local_only), file(&o1), CTX, Action::Skip(SkipReason::LocalOnly)),
            ("skip local-only, remote absent", Some(&local_only), None, CTX, Action::Skip(SkipReason::LocalOnly)),
            ("skip dirty, remote changed", Some(&dirty), file(&o_changed), CTX, Action::Skip(SkipReason::LocalDirty)),
            ("skip dirty, remote absent", Some(&dirty), None, CTX, Action::Skip(SkipReason::LocalDirty)),
            (
                "an echo once the upload is recorded",
                Some(&uploaded),
                file(&echo_new),
                CTX,
                Action::Skip(SkipReason::Echo),
            ),
            ("a late echo of an older upload, the entry now recorded", Some(&uploaded), file(&echo_old), CTX, {
                Action::Skip(SkipReason::Echo)
            }),
            ("an echo before the upload is recorded (dirty)", Some(&dirty), file(&echo_new), CTX, {
                Action::Skip(SkipReason::Echo)
            }),
            ("an echo of a new file (local-only)", Some(&local_only), file(&echo_new), CTX, {
                Action::Skip(SkipReason::Echo)
            }),
            ("an older upload restored over a dirty entry: dirty, not an echo", Some(&dirty), file(&echo_old), CTX, {
                Action::Skip(SkipReason::LocalDirty)
            }),
            (
                "an older upload restored over the recorded one is a change",
                Some(&uploaded),
                file(&restored_old),
                CTX,
                { Action::Update(entry_for(file(&restored_old).unwrap(), "r", Some(&uploaded))) },
            ),
            ("own upload, but not what the entry records", Some(&in_sync), file(&echo_new), CTX, {
                Action::Update(entry_for(file(&echo_new).unwrap(), "r", Some(&in_sync)))
            }),
            ("a dirty entry and a newer own version: still dirty", Some(&dirty), file(&not_echo_newer), CTX, {
                Action::Skip(SkipReason::LocalDirty)
            }),
            ("a newer own version is not an echo", Some(&in_sync), file(&not_echo_newer), CTX, {
                Action::Update(entry_for(file(&not_echo_newer).unwrap(), "r", Some(&in_sync)))
            }),
            ("another cluster's upload is not an echo", Some(&in_sync), file(&other_cluster), CTX, {
                Action::Update(entry_for(file(&other_cluster).unwrap(), "r", Some(&in_sync)))
            }),
            ("a copy of an upload of another path is a change", Some(&in_sync), file(&copy_of_other_path), CTX, {
                Action::Update(entry_for(file(&copy_of_other_path).unwrap(), "r", Some(&in_sync)))
            }),
            ("a copy of an upload of another path onto a dirty entry", Some(&dirty), file(&copy_of_other_path), CTX, {
                Action::Skip(SkipReason::LocalDirty)
            }),
            (
                "a copy of an upload of another path onto a local-only entry",
                Some(&local_only),
                file(&copy_of_other_path),
                CTX,
                { Action::Skip(SkipReason::LocalOnly) },
            ),
            ("a copy of an upload of another path where nothing is", None, file(&copy_of_other_path), CTX, {
                Action::Create(entry_for(file(&copy_of_other_path).unwrap(), "r", None))
            }),
            ("an unbound own upload (older Tidemark), recorded", Some(&uploaded), file(&old_style_same), CTX, {
                Action::Skip(SkipReason::InSync)
            }),
            ("an unbound own upload (older Tidemark), changed", Some(&uploaded), file(&old_style_changed), CTX, {
                Action::Update(entry_for(file(&old_style_changed).unwrap(), "r", Some(&uploaded)))
            }),
            ("delete metadata only", Some(&in_sync), None, CTX, Action::Delete),
            ("nothing on either side", None, None, CTX, Action::Skip(SkipReason::InSync)),
            (
                "tombstone newer than own upload of that path",
                None,
                file(&tomb_upload),
                DecideCtx { tombstone: Some(tomb(5, "other", 1)), ..CTX },
                Action::Skip(SkipReason::Tombstone),
            ),
            (
                "tombstone older than own upload of that path",
                None,
                file(&tomb_upload_newer),
                DecideCtx { tombstone: Some(tomb(5, "other", 1)), ..CTX },
                { Action::Create(entry_for(file(&tomb_upload_newer).unwrap(), "r", None)) },
            ),
            (
                "tombstone of a dirty entry, and an upload from before it was dirty restored since",
                None,
                file(&tomb_upload),
                DecideCtx { tombstone: Some(tomb_after(5, 4)), ..CTX },
                { Action::Create(entry_for(file(&tomb_upload).unwrap(), "r", None)) },
            ),
            (
                "tombstone of a clean entry, and an older upload of that path restored since",
                None,
                file(&tomb_upload),
                DecideCtx { tombstone: Some(clean_tomb(5, "other", 1)), ..CTX },
                { Action::Create(entry_for(file(&tomb_upload).unwrap(), "r", None)) },
            ),
            (
                "tombstone, and a copy of an older upload of another path",
                None,
                file(&copy_of_other_path),
                DecideCtx { tombstone: Some(tomb(5, "other", 1)), ..CTX },
                { Action::Create(entry_for(file(&copy_of_other_path).unwrap(), "r", None)) },
            ),
            (
                "tombstone of the very object",
                None,
                file(&o1),
                DecideCtx { tombstone: Some(tomb(9, "e1", o1.last_modified_ms)), ..CTX },
                Action::Skip(SkipReason::Tombstone),
            ),
            (
                "a newer object than the tombstone's",
                None,
                file(&o_changed),
                DecideCtx { tombstone: Some(tomb(9, "e1", o1.last_modified_ms)), ..CTX },
                { Action::Create(entry_for(file(&o_changed).unwrap(), "r", None)) },
            ),
            (
                "file where the remote has a directory",
                Some(&in_sync),
                marker(&marker_obj),
                CTX,
                Action::Skip(SkipReason::Conflict),
            ),
            (
                "directory where the remote has a file",
                Some(&dir_entry),
                file(&o1),
                CTX,
                Action::Skip(SkipReason::Conflict),
            ),
            ("marker creates a directory", None, marker(&marker_obj), CTX, {
                Action::Create(entry_for(marker(&marker_obj).unwrap(), "r", None))
            }),
            ("marker in sync", Some(&marker_entry), marker(&marker_obj), CTX, Action::Skip(SkipReason::InSync)),
            ("marker changed", Some(&marker_entry), marker(&marker_obj2), CTX, {
                Action::Update(entry_for(marker(&marker_obj2).unwrap(), "r", Some(&marker_entry)))
            }),
            ("marker gone", Some(&marker_entry), None, CTX, Action::Delete),
        ];
        for (name, local, remote, ctx, expected) in rows {
            let got = decide(local, remote, &ctx);
            assert_eq!(got, expected, "row {name:?}: got {}", kind(&got));
        }
    }

    #[test]
    fn created_entries_carry_metadata_only() {
        let o = RemoteObject { version_id: Some("v7".into()), ..obj("e", 1_000, 42) };
        let Action::Create(e) = decide(None, file(&o), &CTX) else { panic!() };
        assert_eq!((e.kind, e.size, e.mtime_ms, e.content.clone()), (EntryKind::File, 42, 1_000, Content::Remote));
        let r = e.remote.unwrap();
        assert_eq!((r.etag.as_str(), r.remote_size, r.version_id.as_deref()), ("e", 42, Some("v7")));
        let Action::Create(empty) = decide(None, file(&obj("e", 1, 0)), &CTX) else { panic!() };
        assert_eq!(empty.content, Content::Empty, "an empty object needs no fetch");
        let Action::Create(d) = decide(None, marker(&obj("m", 1, 0)), &CTX) else { panic!() };
        assert_eq!((d.kind, d.content), (EntryKind::Dir, Content::Empty));
    }

    #[test]
    fn updates_keep_local_mode_and_extended_attributes() {
        let mut l = synced(EntryKind::File, "e1", 100, 3, 9);
        l.mode = 0o600;
        l.extended.insert("user.k".into(), "v".into());
        let Action::Update(e) = decide(Some(&l), file(&obj("e2", 100, 3)), &CTX) else { panic!() };
        assert_eq!(e.mode, 0o600);
        assert_eq!(e.extended.get("user.k").map(String::as_str), Some("v"));
    }

    /// A checksum, part list or ETag of parts described the bytes an object had: another object
    /// drops them, the same one (a listing of it, its event again) keeps them.
    #[test]
    fn what_described_the_old_bytes_goes_with_them() {
        let mut l = synced(EntryKind::File, "e1", 100, 3, 9);
        for k in crate::model::object_attrs::OF_THE_BYTES {
            l.extended.insert(k.into(), "x".into());
        }
        let Action::Update(e) = decide(Some(&l), file(&obj("e2", 100, 3)), &CTX) else { panic!() };
        assert!(crate::model::object_attrs::OF_THE_BYTES.iter().all(|k| !e.extended.contains_key(*k)), "{e:?}");
        let mut kept = l.extended.clone();
        crate::model::object_attrs::refresh(&mut kept, &obj("e1", 100, 3), true);
        assert_eq!(kept, l.extended);
    }

    #[test]
    fn an_upload_is_bound_to_its_path_and_only_metadata_can_tell() {
        let o = with_origin(obj("e", 1, 1), "us", "/m/k", 4);
        assert_eq!(own_upload_of(&o, Some("us"), "/m/k"), Some(4));
        assert_eq!(own_upload_of(&o, Some("us"), "/m/k2"), None, "another path");
        assert_eq!(own_upload_of(&o, Some("them"), "/m/k"), None, "another cluster");
        assert_eq!(own_upload_of(&o, None, "/m/k"), None, "no cluster id");
        assert_eq!(own_upload_of(&obj("e", 1, 1), Some("us"), "/m/k"), None, "no metadata");
        let b = entry_binding("/m/ünïcode path");
        assert!(b.len() == 32 && b.bytes().all(|c| c.is_ascii_hexdigit()), "{b}");
        // A listing (no metadata) decides like a HEAD except where a tombstone asks whose upload it is.
        let listed = obj("e", 1, 1);
        let t = tomb(5, "x", 0);
        assert!(needs_metadata(None, file(&listed), Some(t)));
        assert!(!needs_metadata(None, file(&listed), None));
        assert!(!needs_metadata(None, file(&o), Some(t)), "a HEAD's object has its metadata");
        assert!(!needs_metadata(None, file(&listed), Some(clean_tomb(5, "x", 0))), "a clean entry's tombstone");
        let in_sync = synced(EntryKind::File, "e", 1, 1, 9);
        assert!(!needs_metadata(Some(&in_sync), file(&listed), Some(t)));
    }

    fn headed(mut o: RemoteObject, content_type: &str, class: &str, restore: Option<&str>) -> RemoteObject {
        o.headers = Some(ObjectHeaders {
            content_type: Some(content_type.into()),
            content_encoding: Some("gzip".into()),
            storage_class: Some(class.into()),
            restore: restore.map(str::to_string),
            ..Default::default()
        });
        let mut meta = upload_metadata("them", "/x", 3);
        meta.insert("owner".into(), "ops".into());
        o.user_metadata = Some(meta);
        o
    }

    fn ext(e: &NewEntry) -> &BTreeMap<String, String> {
        &e.extended
    }

    /// What a reader gets back about an object (headers, metadata, class) follows the bucket:
    /// taken from a HEAD, refreshed when only it changed (a restore), kept through listings of
    /// the same object, dropped when a listing shows other bytes.
    #[test]
    fn entries_keep_what_the_object_says_of_itself() {
        use crate::model::object_attrs as a;
        let glacier = headed(obj("e1", 100, 3), "text/plain", "GLACIER", None);
        let Action::Create(created) = decide(None, file(&glacier), &CTX) else { panic!() };
        assert_eq!(ext(&created).get(a::CONTENT_TYPE).map(String::as_str), Some("text/plain"));
        assert_eq!(ext(&created).get(a::CONTENT_ENCODING).map(String::as_str), Some("gzip"));
        assert_eq!(ext(&created).get("s3.meta.owner").map(String::as_str), Some("ops"));
        assert!(!ext(&created).keys().any(|k| k.contains("tidemark-")), "upload bookkeeping is not the file's");
        assert_eq!(a::archived(ext(&created)), Some("GLACIER"));

        let mut entry = synced(EntryKind::File, "e1", 100, 3, 9);
        entry.extended = created.extended.clone();
        entry.extended.insert("user.local".into(), "kept".into());
        assert_eq!(kind(&decide(Some(&entry), file(&glacier), &CTX)), "skip", "nothing changed");
        let restored = headed(obj("e1", 100, 3), "text/plain", "GLACIER", Some("ongoing-request=\"false\""));
        let Action::Update(u) = decide(Some(&entry), file(&restored), &CTX) else { panic!("a restore refreshes") };
        assert_eq!(a::archived(ext(&u)), None, "readable once restored");
        assert_eq!(ext(&u).get("user.local").map(String::as_str), Some("kept"), "the entry's own attributes stay");

        let listed_same = obj("e1", 100, 3);
        assert_eq!(kind(&decide(Some(&entry), file(&listed_same), &CTX)), "skip", "a listing keeps them");
        let listed_other = obj("e2", 200, 4);
        let Action::Update(u) = decide(Some(&entry), file(&listed_other), &CTX) else { panic!() };
        assert!(!ext(&u).keys().any(|k| k.starts_with("s3.")), "they described other bytes: {:?}", ext(&u));
        assert_eq!(ext(&u).get("user.local").map(String::as_str), Some("kept"));
    }
}

//! `decide`: the one decision function of Tidemark, used by the full reconcile
//! (`remote.meta.sync`) and, key by key, by the event applier. It is pure: the outcome depends
//! only on the local entry and the remote object's *current* state (never on an event's payload).
//!
//! Rules, in order (DESIGN §4):
//! 1. a local entry without a remote record (local-only) is never touched;
//! 2. a locally dirty entry (written locally since the last sync) is never overwritten;
//! 3. the echo of this cluster's own upload is skipped;
//! 4. a remote object without a local entry is created (metadata only) — unless a user deleted
//!    the entry under a synced mount and the delete is not propagated yet (a tombstone): the
//!    object is the one the user deleted (same etag and mtime), or this cluster's own upload of
//!    a version the user deleted since;
//! 5. if etag, mtime or size differ, the entry is updated; a file where the remote has a
//!    directory (or the reverse) is a conflict, reported and left alone;
//! 6. a remote-backed entry whose object is gone is deleted (metadata only);
//! 7. otherwise the entry is in sync.

use serde::{Deserialize, Serialize};

use crate::model::{Content, Entry, EntryKind, NewEntry, RemoteEntry};
use crate::remote::RemoteObject;

/// User metadata an upload by Tidemark carries, to recognise its echo.
pub const ORIGIN_METADATA: &str = "tidemark-origin";
pub const VERSION_METADATA: &str = "tidemark-version";

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
    /// A file and a directory want the same path.
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
            SkipReason::Conflict => "file/directory conflict",
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
pub fn is_locally_dirty(e: &Entry) -> bool {
    match &e.remote {
        None => e.kind == EntryKind::File,
        Some(r) => e.kind == EntryKind::File && e.mtime_ms > r.remote_mtime_ms,
    }
}

fn own_upload_version(o: &RemoteObject, cluster_id: Option<&str>) -> Option<u64> {
    let meta = o.user_metadata.as_ref()?;
    let origin = meta.get(ORIGIN_METADATA)?;
    if Some(origin.as_str()) != cluster_id {
        return None;
    }
    meta.get(VERSION_METADATA)?.parse().ok()
}

/// The entry a remote object maps to, keeping what is local to the entry (`mode`, `extended`).
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
        }),
        content: if is_dir || o.size == 0 { Content::Empty } else { Content::Remote },
        extended: keep.map(|e| e.extended.clone()).unwrap_or_default(),
    }
}

pub fn decide(local: Option<&Entry>, remote: Option<RemoteSide<'_>>, ctx: &DecideCtx<'_>) -> Action {
    if let Some(l) = local {
        // First of all: the bucket's event for this cluster's own upload usually arrives before
        // the outbound sync has recorded it, while the entry is still local-only or dirty. It is
        // an echo whatever the dirty flag says (every rule here skips it alike; this one names
        // it rightly, so the echo counter means what it says).
        if let Some(r) = remote
            && own_upload_version(r.object, ctx.cluster_id).is_some_and(|v| v <= l.version)
        {
            return Action::Skip(SkipReason::Echo);
        }
        let Some(recorded) = &l.remote else {
            return Action::Skip(SkipReason::LocalOnly);
        };
        if is_locally_dirty(l) {
            return Action::Skip(SkipReason::LocalDirty);
        }
        let Some(r) = remote else {
            return Action::Delete;
        };
        let remote_is_dir = r.is_dir_marker;
        if l.is_dir() != remote_is_dir {
            return Action::Skip(SkipReason::Conflict);
        }
        let o = r.object;
        let differs = if remote_is_dir {
            recorded.etag != o.etag
        } else {
            recorded.etag != o.etag || recorded.remote_mtime_ms != o.last_modified_ms || recorded.remote_size != o.size
        };
        return if differs {
            Action::Update(entry_for(r, ctx.storage, Some(l)))
        } else {
            Action::Skip(SkipReason::InSync)
        };
    }
    match remote {
        None => Action::Skip(SkipReason::InSync),
        Some(r) => {
            if let Some(t) = ctx.tombstone {
                let deleted_object = r.object.etag == t.etag && r.object.last_modified_ms == t.remote_mtime_ms;
                let deleted_upload = own_upload_version(r.object, ctx.cluster_id).is_some_and(|v| t.version >= v);
                if deleted_object || deleted_upload {
                    return Action::Skip(SkipReason::Tombstone);
                }
            }
            Action::Create(entry_for(r, ctx.storage, None))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn obj(etag: &str, mtime: i64, size: u64) -> RemoteObject {
        RemoteObject {
            key: "k".into(),
            size,
            etag: etag.into(),
            last_modified_ms: mtime,
            version_id: None,
            user_metadata: None,
        }
    }

    fn with_origin(mut o: RemoteObject, cluster: &str, version: u64) -> RemoteObject {
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
            }),
            content: Content::Remote,
            extended: Default::default(),
        }
    }

    fn local_only() -> Entry {
        Entry { remote: None, content: Content::Inline, ..synced(EntryKind::File, "", 5, 3, 9) }
    }

    fn dirty() -> Entry {
        let mut e = synced(EntryKind::File, "e1", 100, 3, 9);
        e.mtime_ms = 101;
        e
    }

    const CTX: DecideCtx<'static> = DecideCtx { storage: "r", cluster_id: Some("us"), tombstone: None };

    fn tomb(version: u64, etag: &str, mtime: i64) -> &'static Tombstone {
        Box::leak(Box::new(Tombstone {
            path: "/m/x".into(),
            version,
            etag: etag.into(),
            remote_mtime_ms: mtime,
            deleted_at_ms: 0,
        }))
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
        let echo_new = with_origin(obj("e-new", 200, 4), "us", 9);
        let echo_old = with_origin(obj("e-new", 200, 4), "us", 3);
        let not_echo_newer = with_origin(obj("e-new", 200, 4), "us", 12);
        let other_cluster = with_origin(obj("e-new", 200, 4), "them", 9);
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
            ("skip echo of the current version", Some(&in_sync), file(&echo_new), CTX, Action::Skip(SkipReason::Echo)),
            ("skip echo of an older version", Some(&in_sync), file(&echo_old), CTX, Action::Skip(SkipReason::Echo)),
            ("an echo before the upload is recorded (dirty)", Some(&dirty), file(&echo_new), CTX, {
                Action::Skip(SkipReason::Echo)
            }),
            ("an echo of a new file (local-only)", Some(&local_only), file(&echo_new), CTX, {
                Action::Skip(SkipReason::Echo)
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
            ("delete metadata only", Some(&in_sync), None, CTX, Action::Delete),
            ("nothing on either side", None, None, CTX, Action::Skip(SkipReason::InSync)),
            (
                "tombstone newer than own upload",
                None,
                file(&echo_old),
                DecideCtx { tombstone: Some(tomb(5, "other", 1)), ..CTX },
                Action::Skip(SkipReason::Tombstone),
            ),
            (
                "tombstone older than own upload",
                None,
                file(&not_echo_newer),
                DecideCtx { tombstone: Some(tomb(5, "other", 1)), ..CTX },
                { Action::Create(entry_for(file(&not_echo_newer).unwrap(), "r", None)) },
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
}

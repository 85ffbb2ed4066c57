//! The data model shared by every layer: entries of the namespace, the one transaction primitive
//! that changes them, leases that fence writers, and the change log.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::path;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    File,
    Dir,
    /// A symbolic link; its target is in [`PosixAttrs::target`].
    Symlink,
    /// A named pipe, a socket, a character or a block device: a name and attributes, no bytes
    /// (what flows through them is the kernel's, never the namespace's).
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl EntryKind {
    /// Kinds that name no bytes of their own: a link, a pipe, a socket, a device node. They live
    /// in the namespace only: the S3 gateway does not list them, the outbound sync does not
    /// upload them.
    pub fn is_special(self) -> bool {
        !matches!(self, EntryKind::File | EntryKind::Dir)
    }
}

/// What a POSIX file system keeps about an entry besides its kind, size, mode and mtime. Entries
/// written by the bucket, the gateway, the shell or the API carry none of it (the defaults:
/// owned by whoever mounts, changed when modified); the FUSE mount keeps all of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PosixAttrs {
    /// Owner and group; `None`: the mounting user's and group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    /// The last change of the entry's status (its attributes or content); `None`: its mtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctime_ms: Option<i64>,
    /// The last access as `utimensat(2)` set it (the mount does not record reads: `noatime`);
    /// `None`: the mtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub atime_ms: Option<i64>,
    /// A symbolic link's target, as given to `symlink(2)` (not resolved, not checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// A device node's device number.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rdev: u64,
    /// A hard link's name: the entry has no attributes or bytes of its own; they are those of
    /// the inode entry at [`inode_path`] of this number, which every name of the file shares.
    /// Written by the store only ([`Mutation::Link`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inode: Option<u64>,
    /// An inode entry's number of names (`None`: one). Kept by the store, whatever a put says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nlink: Option<u32>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl PosixAttrs {
    pub fn is_empty(&self) -> bool {
        *self == PosixAttrs::default()
    }
}

/// Where the files that have more than one name (hard links) keep their attributes and bytes:
/// one inode entry each, named by its number, which each name's [`PosixAttrs::inode`] gives. A
/// file's first second name moves it here (in the same transaction); its names stay where they
/// are. Outside the data of any bucket or remote mount, which refuse hard links.
pub const INODES_DIR: &str = "/.inodes";

/// The inode entry of the file whose names carry inode number `id`.
pub fn inode_path(id: u64) -> String {
    format!("{INODES_DIR}/{id}")
}

/// The inode number of an inode entry's path (`None`: not one).
pub fn inode_of_path(p: &str) -> Option<u64> {
    p.strip_prefix(INODES_DIR)?.strip_prefix('/')?.parse().ok()
}

/// The longest symbolic-link target the namespace keeps (Linux's `PATH_MAX`).
pub const MAX_SYMLINK_TARGET: usize = 4096;

/// Where an entry's bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Content {
    /// No bytes: a directory, or an empty file.
    #[default]
    Empty,
    /// Small content kept in the store row itself (system documents, small files).
    Inline,
    /// Content in a file of the filer's data directory, named by `id`.
    Blob { id: String },
    /// The bytes are those of the remote object the entry's `remote` describes; they are fetched
    /// when read (lazily), never when the metadata is synced.
    Remote,
}

/// What the namespace believes the remote object behind an entry is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteEntry {
    /// The `remote.configure` name of the storage.
    pub storage: String,
    /// Normalised (unquoted) ETag.
    pub etag: String,
    pub remote_mtime_ms: i64,
    pub remote_size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_local_sync_ms: Option<i64>,
    /// While the entry is locally dirty: its version when it was last clean (set by the local
    /// write that made it dirty). This cluster's uploads of the entry at later versions are of
    /// its pending local writes; earlier ones are of what it held before (`decide::is_pending_upload`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirty_after: Option<u64>,
    /// While the entry was renamed in its mount and the outbound sync has not yet put its object
    /// at its new key: the path whose key still holds that object (the first of several renames).
    /// Reads fetch from there; the outbound sync uploads the object at the entry's own key, then
    /// deletes the old one (never before) — docs/SEMANTICS.md, "Renames in a remote mount".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_from: Option<String>,
}

/// One entry of the namespace as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub path: String,
    pub kind: EntryKind,
    pub size: u64,
    pub mtime_ms: i64,
    pub mode: u32,
    /// The sequence number of the change-log record that last wrote this entry. It increases on
    /// every write, is never reused (not even after a delete and re-create), and is the token
    /// of [`Precondition::Version`].
    pub version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteEntry>,
    #[serde(default)]
    pub content: Content,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extended: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "PosixAttrs::is_empty")]
    pub posix: PosixAttrs,
}

impl Entry {
    pub fn is_dir(&self) -> bool {
        self.kind == EntryKind::Dir
    }
    pub fn name(&self) -> &str {
        path::name(&self.path)
    }
    /// The entry's fields as they would be written again (for read-modify-write).
    pub fn to_new(&self) -> NewEntry {
        NewEntry {
            kind: self.kind,
            size: self.size,
            mtime_ms: self.mtime_ms,
            mode: self.mode,
            remote: self.remote.clone(),
            content: self.content.clone(),
            extended: self.extended.clone(),
            posix: self.posix.clone(),
        }
    }
}

/// An entry as a writer proposes it; the store assigns `path` and `version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewEntry {
    pub kind: EntryKind,
    pub size: u64,
    pub mtime_ms: i64,
    pub mode: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteEntry>,
    #[serde(default)]
    pub content: Content,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extended: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "PosixAttrs::is_empty")]
    pub posix: PosixAttrs,
}

pub const DEFAULT_FILE_MODE: u32 = 0o644;
pub const DEFAULT_DIR_MODE: u32 = 0o755;

impl NewEntry {
    pub fn dir(mtime_ms: i64) -> Self {
        NewEntry {
            kind: EntryKind::Dir,
            size: 0,
            mtime_ms,
            mode: DEFAULT_DIR_MODE,
            remote: None,
            content: Content::Empty,
            extended: BTreeMap::new(),
            posix: PosixAttrs::default(),
        }
    }
    pub fn file(size: u64, mtime_ms: i64, content: Content) -> Self {
        NewEntry {
            kind: EntryKind::File,
            size,
            mtime_ms,
            mode: DEFAULT_FILE_MODE,
            remote: None,
            content,
            extended: BTreeMap::new(),
            posix: PosixAttrs::default(),
        }
    }
    /// A symbolic link to `target`. Like every entry without bytes its size is 0 (the mount
    /// reports the target's length, as `lstat(2)` does).
    pub fn symlink(target: &str, mtime_ms: i64) -> Self {
        NewEntry {
            kind: EntryKind::Symlink,
            size: 0,
            mtime_ms,
            mode: 0o777,
            remote: None,
            content: Content::Empty,
            extended: BTreeMap::new(),
            posix: PosixAttrs { target: Some(target.to_string()), ..Default::default() },
        }
    }
}

/// Who caused a mutation. The outbound sync uploads only `local` changes; `remote` changes came
/// from the bucket and must never be sent back to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    Local,
    Remote,
    System,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Local => "local",
            Origin::Remote => "remote",
            Origin::System => "system",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "local" => Some(Origin::Local),
            "remote" => Some(Origin::Remote),
            "system" => Some(Origin::System),
            _ => None,
        }
    }
}

/// What the target entry must look like for a transaction to proceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "type", content = "version", rename_all = "snake_case")]
pub enum Precondition {
    #[default]
    Any,
    Absent,
    Version(u64),
}

impl Precondition {
    pub fn holds(self, current: Option<u64>) -> bool {
        match self {
            Precondition::Any => true,
            Precondition::Absent => current.is_none(),
            Precondition::Version(v) => current == Some(v),
        }
    }
}

/// Proof that the writer holds a lease: the lease row must still name this holder and
/// generation, unexpired, when the transaction commits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    pub lease: String,
    pub holder: String,
    pub generation: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
// One short-lived value per transaction: boxing the entry would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum Mutation {
    /// Create or replace the entry. Missing ancestors are created as directories in the same
    /// transaction. `data` carries the bytes when `entry.content` is [`Content::Inline`]; without
    /// it, the entry keeps the inline bytes it has (a metadata-only update).
    Put {
        entry: NewEntry,
        #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_base64")]
        data: Option<Bytes>,
    },
    /// Remove the entry; with `recursive`, everything below it too, in the same transaction.
    Delete {
        #[serde(default)]
        recursive: bool,
    },
    /// Move the entry — a directory with everything below it — to `to`, as `rename(2)` does, in
    /// one transaction whatever the size of the tree. Each moved entry keeps its kind, content
    /// and attributes and gets a new version; the change log has, for each, a record creating it
    /// at its new path (before anything is removed) and then one removing it at its old path
    /// that names where it went ([`ChangeRecord::moved_to`]). An entry at `to` is replaced
    /// when `to_precondition` holds on it: a file or link by a non-directory, an empty directory
    /// by a directory. `to`'s parent must exist.
    Rename {
        to: String,
        #[serde(default)]
        to_precondition: Precondition,
    },
    /// Give the file at the transaction's path (not a directory, not remote-backed) a second
    /// name `to`, as `link(2)` does. `to` must be absent and its parent a directory. The first
    /// time, the entry moves to its inode entry ([`inode_path`]; records as a rename's, so its
    /// bytes stay) and a name takes its place; every link adds a name and counts it in the
    /// inode's [`PosixAttrs::nlink`] (its ctime set). Removing a name (a delete, a put or rename
    /// over it) counts it off; the last name's removal deletes the inode entry. `Applied::new`
    /// is the inode entry as it is after the link.
    Link { to: String },
}

/// The one transaction primitive: check the fence (if any) and the precondition on `path`,
/// then apply the mutation, assign versions and append change-log records, atomically.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Txn {
    pub path: String,
    #[serde(default)]
    pub precondition: Precondition,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<Fence>,
    pub mutation: Mutation,
    pub origin: Origin,
    /// Also set the mtime and ctime of the directory that gains or loses a name (both
    /// directories of a rename), in the same transaction, as POSIX has it: what the FUSE mount
    /// asks for. Off for the bucket's changes, the gateway's and the API's, whose directories are
    /// the namespace's bookkeeping rather than anyone's file system.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dir_times: bool,
}

/// Upper bound on inline content; larger content belongs in a blob.
pub const MAX_INLINE_BYTES: usize = 64 * 1024;

/// The extended attribute in which the filer records the MD5 (hex) of the bytes a write stored:
/// the S3 gateway's ETag of a local file. Set by every content write, so it is never stale for
/// local content; a remote-backed entry's ETag is its remote object's.
pub const MD5_ATTR: &str = "md5";

/// On a file made here and not yet backed by an object (local-only): a change-log sequence number
/// from before it was created. This cluster's uploads of its path at versions up to it are of
/// earlier files there (recorded, then removed), never of this one's pending writes — as
/// `RemoteEntry::dirty_after` says for a remote-backed file.
pub const CREATED_AFTER_ATTR: &str = "created_after";

/// The extended attributes that hold what a client reads back about an object besides its
/// bytes (the headers a GET answers with, user metadata, the storage class): set by the S3
/// gateway from a PUT's headers for a local file, and from the bucket's object (HEAD or listing)
/// for a remote-backed one; served by the gateway and the HTTP API.
pub mod object_attrs {
    use std::collections::BTreeMap;

    use crate::remote::{ObjectHeaders, RemoteObject};

    pub const CONTENT_TYPE: &str = "s3.content-type";
    pub const CONTENT_ENCODING: &str = "s3.content-encoding";
    pub const CONTENT_DISPOSITION: &str = "s3.content-disposition";
    pub const CONTENT_LANGUAGE: &str = "s3.content-language";
    pub const CACHE_CONTROL: &str = "s3.cache-control";
    pub const EXPIRES: &str = "s3.expires";
    pub const STORAGE_CLASS: &str = "s3.storage-class";
    pub const RESTORE: &str = "s3.restore";
    /// Why the bucket refuses this cluster the object's bytes (see `ObjectHeaders::unreadable`).
    pub const UNREADABLE: &str = "s3.unreadable";
    /// Set where the headers above are those of the object the entry describes, as a HEAD, an
    /// event's HEAD or an upload's answer gave them. A listing carries none: an entry made from
    /// one has not seen its object's headers, and the filer asks the bucket for them once, at
    /// the first read or gateway lookup of it (`Filer::describe`).
    pub const HEADERS_SEEN: &str = "s3.headers-seen";
    /// User metadata `x-amz-meta-NAME` is kept as `s3.meta.NAME` (name lower-cased).
    pub const META_PREFIX: &str = "s3.meta.";
    /// The checksum the S3 gateway verified when it stored the bytes (`ALGO:TYPE:base64`).
    pub const CHECKSUM: &str = "s3.checksum";
    /// The ETag of an object completed from parts, as S3 makes it (the MD5 of the parts' MD5s,
    /// `-N`): what the gateway answers instead of the MD5 of the bytes.
    pub const ETAG: &str = "s3.etag";
    /// The sizes of the parts an object was completed from (comma-separated, in order).
    pub const PARTS: &str = "s3.parts";
    /// The checksums of those parts (comma-separated base64, in order).
    pub const PART_CHECKSUMS: &str = "s3.part-checksums";
    /// The S3 gateway's stamp of the version these bytes are, in a versioned bucket (see
    /// `tidemark-s3`'s `versioning`): new bytes written another way are another version.
    pub const VERSION: &str = "s3.version";
    /// The S3 gateway's sealed data key and IVs of bytes it stored encrypted (see
    /// `tidemark-s3`'s `sse`): new bytes written another way are not encrypted.
    pub const SSE: &str = "s3.sse";
    /// The attributes that describe the bytes themselves rather than the object: kept while
    /// the bytes are, and dropped by any change of them that does not set them again (a write
    /// through the mount or the HTTP API, another object in the bucket), since they would then
    /// describe bytes that are gone — a checksum a client verifies its read against, most of
    /// all.
    pub const OF_THE_BYTES: [&str; 6] = [CHECKSUM, ETAG, PARTS, PART_CHECKSUMS, VERSION, SSE];

    /// Drops from `ext` what described bytes that were replaced.
    pub fn forget_bytes(ext: &mut BTreeMap<String, String>) {
        ext.retain(|k, _| !OF_THE_BYTES.contains(&k.as_str()));
    }

    /// Metadata names Tidemark's outbound sync puts on its uploads: about the upload, not the
    /// file, so not shown as the file's metadata.
    const OWN_METADATA_PREFIX: &str = "tidemark-";

    const HEADERS: [&str; 10] = [
        HEADERS_SEEN,
        UNREADABLE,
        CONTENT_TYPE,
        CONTENT_ENCODING,
        CONTENT_DISPOSITION,
        CONTENT_LANGUAGE,
        CACHE_CONTROL,
        EXPIRES,
        STORAGE_CLASS,
        RESTORE,
    ];

    /// The headers kept in `ext`.
    pub fn headers(ext: &BTreeMap<String, String>) -> ObjectHeaders {
        let get = |k: &str| ext.get(k).cloned();
        ObjectHeaders {
            content_type: get(CONTENT_TYPE),
            content_encoding: get(CONTENT_ENCODING),
            content_disposition: get(CONTENT_DISPOSITION),
            content_language: get(CONTENT_LANGUAGE),
            cache_control: get(CACHE_CONTROL),
            expires: get(EXPIRES),
            storage_class: get(STORAGE_CLASS),
            restore: get(RESTORE),
            unreadable: get(UNREADABLE),
        }
    }

    /// Why the object cannot be read by this cluster, if the bucket refused it for good.
    pub fn unreadable(ext: &BTreeMap<String, String>) -> Option<&str> {
        ext.get(UNREADABLE).map(String::as_str)
    }

    /// The user metadata kept in `ext`.
    pub fn user_metadata(ext: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        ext.iter().filter_map(|(k, v)| k.strip_prefix(META_PREFIX).map(|n| (n.to_string(), v.clone()))).collect()
    }

    /// Whether `ext` holds the headers its object was last seen with (see [`HEADERS_SEEN`]).
    pub fn headers_seen(ext: &BTreeMap<String, String>) -> bool {
        ext.contains_key(HEADERS_SEEN)
    }

    /// The storage class, if the object cannot be read before it is restored.
    pub fn archived(ext: &BTreeMap<String, String>) -> Option<&str> {
        let class = ext.get(STORAGE_CLASS).map(String::as_str);
        crate::remote::is_archived(class, ext.get(RESTORE).map(String::as_str)).then(|| class.unwrap_or_default())
    }

    /// Brings `ext` up to date with object `o`: what `o` carries replaces what `ext` held;
    /// what it does not carry (a listing has no headers) is kept if `o` is the object `ext`
    /// described (`same_object`), and dropped otherwise, as it described other bytes.
    pub fn refresh(ext: &mut BTreeMap<String, String>, o: &RemoteObject, same_object: bool) {
        if !same_object {
            forget_bytes(ext);
        }
        if o.headers.is_some() || !same_object {
            ext.retain(|k, _| !HEADERS.contains(&k.as_str()));
        }
        if let Some(h) = &o.headers {
            ext.insert(HEADERS_SEEN.to_string(), "1".to_string());
            let pairs = [
                (CONTENT_TYPE, &h.content_type),
                (CONTENT_ENCODING, &h.content_encoding),
                (CONTENT_DISPOSITION, &h.content_disposition),
                (CONTENT_LANGUAGE, &h.content_language),
                (CACHE_CONTROL, &h.cache_control),
                (EXPIRES, &h.expires),
                (STORAGE_CLASS, &h.storage_class),
                (RESTORE, &h.restore),
                (UNREADABLE, &h.unreadable),
            ];
            for (k, v) in pairs {
                if let Some(v) = v {
                    ext.insert(k.to_string(), v.clone());
                }
            }
        }
        if o.user_metadata.is_some() || !same_object {
            ext.retain(|k, _| !k.starts_with(META_PREFIX));
        }
        for (k, v) in o.user_metadata.iter().flatten() {
            if !k.starts_with(OWN_METADATA_PREFIX) {
                ext.insert(format!("{META_PREFIX}{}", k.to_ascii_lowercase()), v.clone());
            }
        }
    }
}

impl Txn {
    /// `mutation` at `path`, unconditional, unfenced.
    pub fn of(path: impl Into<String>, mutation: Mutation, origin: Origin) -> Self {
        Txn { path: path.into(), precondition: Precondition::Any, fence: None, mutation, origin, dir_times: false }
    }
    pub fn put(path: impl Into<String>, entry: NewEntry, origin: Origin) -> Self {
        Txn::of(path, Mutation::Put { entry, data: None }, origin)
    }
    pub fn delete(path: impl Into<String>, recursive: bool, origin: Origin) -> Self {
        Txn::of(path, Mutation::Delete { recursive }, origin)
    }
    pub fn with_precondition(mut self, p: Precondition) -> Self {
        self.precondition = p;
        self
    }
    pub fn with_dir_times(mut self) -> Self {
        self.dir_times = true;
        self
    }
    pub fn with_fence(mut self, fence: Fence) -> Self {
        self.fence = Some(fence);
        self
    }
    pub fn with_data(mut self, bytes: Bytes) -> Self {
        if let Mutation::Put { data, .. } = &mut self.mutation {
            *data = Some(bytes);
        }
        self
    }

    /// The paths the transaction writes at: its own, and a rename's destination.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        let to = match &self.mutation {
            Mutation::Rename { to, .. } | Mutation::Link { to } => Some(to.as_str()),
            _ => None,
        };
        std::iter::once(self.path.as_str()).chain(to)
    }

    pub fn rename(from: impl Into<String>, to: impl Into<String>, origin: Origin) -> Self {
        Txn::of(from, Mutation::Rename { to: to.into(), to_precondition: Precondition::Any }, origin)
    }

    /// A second name `to` for the file at `from` ([`Mutation::Link`]).
    pub fn link(from: impl Into<String>, to: impl Into<String>, origin: Origin) -> Self {
        Txn::of(from, Mutation::Link { to: to.into() }, origin)
    }

    /// The checks every store backend makes before touching anything, so that all backends
    /// reject the same malformed transactions with the same errors.
    pub fn validate(&self) -> Result<()> {
        path::validate(&self.path)?;
        match &self.mutation {
            Mutation::Put { entry, data } => {
                if self.path == path::ROOT && entry.kind != EntryKind::Dir {
                    return Err(Error::invalid_argument("the root must stay a directory"));
                }
                match (&entry.content, data) {
                    (Content::Inline, Some(d)) => {
                        if d.len() > MAX_INLINE_BYTES {
                            return Err(Error::invalid_argument(format!(
                                "inline content of {} bytes exceeds the limit of {MAX_INLINE_BYTES}",
                                d.len()
                            )));
                        }
                        if d.len() as u64 != entry.size {
                            return Err(Error::invalid_argument("inline data length differs from the entry's size"));
                        }
                    }
                    // Inline content without data keeps the entry's current bytes (a metadata
                    // update); the store checks the entry has them.
                    (Content::Inline, None) => {}
                    (_, Some(_)) => return Err(Error::invalid_argument("data given for content that is not inline")),
                    (_, None) => {}
                }
                if entry.kind == EntryKind::Dir && entry.content != Content::Empty {
                    return Err(Error::invalid_argument("a directory has no content"));
                }
                if entry.kind.is_special() && (entry.content != Content::Empty || entry.remote.is_some()) {
                    return Err(Error::invalid_argument(
                        "a symbolic link, pipe, socket or device node has no content and no remote object",
                    ));
                }
                match (&entry.posix.target, entry.kind) {
                    (None, EntryKind::Symlink) => {
                        return Err(Error::invalid_argument("a symbolic link needs a target"));
                    }
                    (Some(t), EntryKind::Symlink) => {
                        if t.is_empty() || t.len() > MAX_SYMLINK_TARGET || t.contains('\0') {
                            return Err(Error::invalid_argument(format!(
                                "a symbolic link's target must be 1 to {MAX_SYMLINK_TARGET} bytes without NUL"
                            )));
                        }
                    }
                    (Some(_), _) => return Err(Error::invalid_argument("only a symbolic link has a target")),
                    (None, _) => {}
                }
                if entry.posix.inode.is_some() {
                    return Err(Error::invalid_argument("a hard link is made by a link, not written by a put"));
                }
            }
            Mutation::Rename { to, .. } => {
                path::validate(to)?;
                if self.path == path::ROOT || to == path::ROOT {
                    return Err(Error::invalid_argument("the root cannot be renamed or replaced"));
                }
                if *to == self.path {
                    return Err(Error::invalid_argument(format!("{to}: a rename onto itself")));
                }
                if path::is_within(to, &self.path) {
                    return Err(Error::invalid_argument(format!("{}: cannot be moved below itself ({to})", self.path)));
                }
            }
            Mutation::Link { to } => {
                path::validate(to)?;
                if self.path == path::ROOT || to == path::ROOT || *to == self.path {
                    return Err(Error::invalid_argument(format!("{}: cannot be linked as {to}", self.path)));
                }
            }
            Mutation::Delete { .. } => {
                if self.path == path::ROOT {
                    return Err(Error::invalid_argument("the root cannot be deleted"));
                }
                if self.precondition == Precondition::Absent {
                    return Err(Error::invalid_argument("a delete cannot require the entry to be absent"));
                }
            }
        }
        Ok(())
    }
}

/// The most transactions one [`TxnBatch`] may carry, and the most paths one batched read may ask
/// for: a batch is one database transaction, and holds the store's writer (or lock) throughout.
pub const MAX_BATCH: usize = 1000;

/// Many transactions committed as one database transaction: the shared fence is checked once,
/// and if it does not hold nothing of the batch lands (`Fenced`); otherwise each transaction
/// checks its own precondition and stands or fails alone, in order, seeing the writes of the
/// ones before it. A transaction in a batch carries no fence of its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnBatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<Fence>,
    pub txns: Vec<Txn>,
}

impl TxnBatch {
    /// The checks every backend makes before opening its transaction: the batch's shape. Each
    /// transaction's own checks ([`Txn::validate`]) fail that transaction alone.
    pub fn validate(&self) -> Result<()> {
        if self.txns.len() > MAX_BATCH {
            return Err(Error::invalid_argument(format!(
                "a batch of {} transactions exceeds the limit of {MAX_BATCH}; split it",
                self.txns.len()
            )));
        }
        if let Some(t) = self.txns.iter().find(|t| t.fence.is_some()) {
            return Err(Error::invalid_argument(format!(
                "{}: a transaction in a batch carries the batch's fence, not its own",
                t.path
            )));
        }
        Ok(())
    }
}

/// One transaction's result in a batch, as the HTTP API carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TxnOutcome {
    Applied(Box<Applied>),
    Failed(Error),
}

impl From<Result<Applied>> for TxnOutcome {
    fn from(r: Result<Applied>) -> Self {
        match r {
            Ok(a) => TxnOutcome::Applied(Box::new(a)),
            Err(e) => TxnOutcome::Failed(e),
        }
    }
}

impl From<TxnOutcome> for Result<Applied> {
    fn from(o: TxnOutcome) -> Self {
        match o {
            TxnOutcome::Applied(a) => Ok(*a),
            TxnOutcome::Failed(e) => Err(e),
        }
    }
}

/// The outcome of a committed transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The sequence numbers of the change-log records the transaction appended are the dense
    /// range `first_seq..=seq` (implicitly created parents and the children of a recursive
    /// delete have their own records).
    pub first_seq: u64,
    /// The sequence number of the last change-log record the transaction appended.
    pub seq: u64,
    /// The entry before the transaction (`None`: it did not exist).
    pub old: Option<Entry>,
    /// The entry after it (`None`: deleted).
    pub new: Option<Entry>,
    /// The directories whose times a [`Txn::dir_times`] transaction set, as they are now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dirs: Vec<Entry>,
}

/// One record of the append-only change log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeRecord {
    pub seq: u64,
    pub ts_ms: i64,
    pub path: String,
    pub origin: Origin,
    pub old: Option<Entry>,
    pub new: Option<Entry>,
    /// On the record that removes an entry a rename moved: where it went (its record there came
    /// first, in the same transaction). Its content lives on there: a consumer that frees what
    /// a removed entry held must not free this one's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_to: Option<String>,
}

/// A lease row: who may write under this name, and with which generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub name: String,
    pub holder: String,
    /// Incremented on every acquisition; a write fenced with an older generation is rejected.
    pub generation: u64,
    pub expires_at_ms: i64,
}

impl Lease {
    pub fn fence(&self) -> Fence {
        Fence { lease: self.name.clone(), holder: self.holder.clone(), generation: self.generation }
    }
}

/// A page of entries in byte order of their paths. `next` is the `start_after` of the next page,
/// `None` on the last page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Page {
    pub entries: Vec<Entry>,
    pub next: Option<String>,
}

impl Page {
    /// Builds a page from up to `limit + 1` fetched rows: the extra row only says "there is more".
    pub fn from_rows(mut rows: Vec<Entry>, limit: usize) -> Self {
        let more = rows.len() > limit;
        rows.truncate(limit);
        let next = if more { rows.last().map(|e| e.path.clone()) } else { None };
        Page { entries: rows, next }
    }
}

mod opt_base64 {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use bytes::Bytes;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Bytes>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(b) => s.serialize_str(&STANDARD.encode(b)),
            None => s.serialize_none(),
        }
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Bytes>, D::Error> {
        let s: Option<String> = Option::deserialize(d)?;
        s.map(|s| STANDARD.decode(s).map(Bytes::from).map_err(serde::de::Error::custom)).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preconditions() {
        assert!(Precondition::Any.holds(None));
        assert!(Precondition::Any.holds(Some(3)));
        assert!(Precondition::Absent.holds(None));
        assert!(!Precondition::Absent.holds(Some(3)));
        assert!(Precondition::Version(3).holds(Some(3)));
        assert!(!Precondition::Version(3).holds(Some(4)));
        assert!(!Precondition::Version(3).holds(None));
    }

    #[test]
    fn txn_validation_rejects_inconsistent_content() {
        let inline = NewEntry::file(3, 0, Content::Inline);
        Txn::put("/a", inline.clone(), Origin::Local).with_data(Bytes::from_static(b"abc")).validate().unwrap();
        assert!(Txn::put("/a", inline, Origin::Local).with_data(Bytes::from_static(b"ab")).validate().is_err());
        assert!(Txn::delete("/", true, Origin::Local).validate().is_err());
        assert!(Txn::put("/a/", NewEntry::dir(0), Origin::Local).validate().is_err());
        assert!(Txn::delete("/a", false, Origin::Local).with_precondition(Precondition::Absent).validate().is_err());
    }

    #[test]
    fn txn_json_round_trip_with_inline_data() {
        let t = Txn::put("/etc/x", NewEntry::file(2, 5, Content::Inline), Origin::System)
            .with_data(Bytes::from_static(b"hi"))
            .with_precondition(Precondition::Version(9));
        let json = serde_json::to_string(&t).unwrap();
        let back: Txn = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn page_from_rows() {
        let e = |p: &str| Entry {
            path: p.into(),
            kind: EntryKind::File,
            size: 0,
            mtime_ms: 0,
            mode: 0,
            version: 1,
            remote: None,
            content: Content::Empty,
            extended: Default::default(),
            posix: Default::default(),
        };
        let p = Page::from_rows(vec![e("/a"), e("/b"), e("/c")], 2);
        assert_eq!(p.entries.len(), 2);
        assert_eq!(p.next.as_deref(), Some("/b"));
        assert_eq!(Page::from_rows(vec![e("/a")], 2).next, None);
    }
}

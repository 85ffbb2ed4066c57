//! Remote storage as Tidemark sees it: the objects of a bucket, the provider-neutral
//! `RemoteStorage` trait every provider implements, and the configuration records
//! (`remote.configure`, `remote.mount`) kept in the namespace under `/etc/tidemark/remote/`.

use std::collections::BTreeMap;

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::filer::{ByteRange, ByteStream};
use crate::path;

/// What a HEAD or a LIST says of one object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteObject {
    pub key: String,
    pub size: u64,
    /// Normalised: without the quotes HTTP puts around it.
    pub etag: String,
    pub last_modified_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_id: Option<String>,
    /// User metadata, names lower-cased. A LIST does not return it (`None`); a HEAD does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_metadata: Option<BTreeMap<String, String>>,
    /// The headers a GET of the object answers with. `None` where the answer does not carry them
    /// (an S3 listing); a HEAD, and GCS and Azure listings, do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<ObjectHeaders>,
}

/// What a client reads back about an object besides its bytes: the headers S3, GCS and Azure
/// answer a GET with, its storage class, and whether an archived object has been restored. Kept
/// in the entry's extended attributes ([`crate::model::object_attrs`]) and served by the gateway
/// and the HTTP API as the bucket would.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectHeaders {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_encoding: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_disposition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_language: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<String>,
    /// As the provider gave it (an HTTP date).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    /// The provider's name for it (`STANDARD`, `GLACIER`, `DEEP_ARCHIVE`; GCS `NEARLINE`; Azure's
    /// access tier `Hot`, `Cool`, `Archive`). `None`: the provider did not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<String>,
    /// The state of a restore of an archived object (S3's `x-amz-restore`, Azure's
    /// `x-ms-archive-status`), as the provider gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<String>,
    /// Why this cluster may not read the object, where the bucket refuses it for good (a key
    /// encrypted with a customer-provided key, a KMS key the cluster may not use): reads fail at
    /// once with this reason, not with bytes of an older version. `None`: readable, as far as
    /// anyone knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
}

/// What the reason of every object encrypted with a customer-provided key says (the key is the
/// writer's, never the cluster's), whatever the provider calls it.
pub const CUSTOMER_KEY_REASON: &str = "encrypted with a customer-provided key";
/// S3's (SSE-C).
pub const SSE_C_REASON: &str = "encrypted with a customer-provided key (SSE-C)";
/// Cloud Storage's (a customer-supplied encryption key, CSEK).
pub const CSEK_REASON: &str = "encrypted with a customer-provided key (CSEK)";
/// Azure Blob Storage's (a customer-provided key, CPK).
pub const CPK_REASON: &str = "encrypted with a customer-provided key (CPK)";
/// The reason an object whose KMS key the cluster may not use is unreadable.
pub const KMS_DENIED_REASON: &str = "access to its KMS key denied";

/// Whether an object of `storage_class`, in restore state `restore`, cannot be read until it is
/// restored: S3's GLACIER and DEEP_ARCHIVE (not GLACIER_IR, read at once) without a finished
/// restore, Azure's Archive tier. GCS's archive class is read at once.
pub fn is_archived(storage_class: Option<&str>, restore: Option<&str>) -> bool {
    let restored = restore.is_some_and(|r| r.replace(' ', "").contains("ongoing-request=\"false\""));
    match storage_class {
        Some("GLACIER" | "DEEP_ARCHIVE") => !restored,
        // Azure's tier (GCS's class is `ARCHIVE`, in capitals, and read at once). A rehydrated
        // blob is in another tier.
        Some("Archive") => true,
        _ => false,
    }
}

/// What to tell a user who read an archived object.
pub fn archived_hint(storage_class: &str) -> &'static str {
    if storage_class == "Archive" {
        "rehydrate the blob to the Hot or Cool tier (az storage blob set-tier --rehydrate-priority), then read it again"
    } else {
        "restore it in the bucket first (aws s3api restore-object --restore-request Days=N), then read it again"
    }
}

/// Strips the quotes (and a weak `W/` prefix) from an ETag, so ETags from HEAD (quoted) and from
/// event notifications (bare) compare equal.
pub fn normalize_etag(etag: &str) -> String {
    let e = etag.trim();
    let e = e.strip_prefix("W/").unwrap_or(e);
    e.trim_matches('"').to_string()
}

/// One page of a listing, in byte order of the key.
#[derive(Debug, Clone, Default)]
pub struct ListPage {
    pub objects: Vec<RemoteObject>,
    /// Where the next page starts; `None` on the last page. Opaque to callers.
    pub next: Option<String>,
}

/// A bucket, or a prefix of one: the provider-neutral data path.
///
/// Contract, for every provider (checked by the conformance suite in `tidemark-cloud`):
/// - keys are passed and returned verbatim, whatever they contain (`a b`, `+`, `%`, `..`, `//`,
///   a trailing `/`): the mapping to paths, and the refusal of unsafe keys, is Tidemark's
///   business (`keymap`), not the provider's;
/// - `list` returns every key that starts with `prefix` and is greater than `start_after`, in
///   byte order, across pages;
/// - `stat` of a missing key is `Ok(None)`, not an error;
/// - errors say which call, which key, and what to fix (credentials, endpoint, bucket).
#[async_trait]
pub trait RemoteStorage: Send + Sync + 'static {
    /// A short description for messages: `s3://bucket`, `local:/srv/bucket`.
    fn describe(&self) -> String;

    async fn stat(&self, key: &str) -> Result<Option<RemoteObject>>;

    /// One page of at most `max` objects. Pass the returned `next` as `page` to continue;
    /// `start_after` applies to the first page.
    async fn list(&self, prefix: &str, start_after: Option<&str>, page: Option<&str>, max: usize) -> Result<ListPage>;

    /// Whether the store itself begins a listing at `start_after` (one request, wherever it
    /// is), so that a listing can be split into key ranges listed at once. Azure has no such
    /// parameter (its listings skip on the client's side), so it lists as one range.
    fn lists_from_anywhere(&self) -> bool {
        true
    }

    /// The object's bytes (or `range` of them). With `if_etag`, fails with `PreconditionFailed`
    /// when the object is no longer that version, rather than return other bytes.
    async fn get(&self, key: &str, range: Option<ByteRange>, if_etag: Option<&str>) -> Result<ByteStream>;

    async fn put(&self, key: &str, body: Bytes, metadata: BTreeMap<String, String>) -> Result<RemoteObject>;

    /// [`put`](Self::put) with the headers a GET of the object should answer with (the storage
    /// class and restore state are the bucket's to decide and are not sent). Stores that keep
    /// no headers ignore them.
    async fn put_with_headers(
        &self,
        key: &str,
        body: Bytes,
        metadata: BTreeMap<String, String>,
        headers: &ObjectHeaders,
    ) -> Result<RemoteObject> {
        let _ = headers;
        self.put(key, body, metadata).await
    }

    /// [`put_with_headers`](Self::put_with_headers) of a body that streams: `size` bytes, read
    /// as they are sent. One of [`PART`] bytes or less is gathered and put in one request; a
    /// larger one goes to [`put_in_parts`](Self::put_in_parts). The object appears whole or not
    /// at all; a body of another length than `size` fails the put and leaves nothing.
    async fn put_stream(
        &self,
        key: &str,
        body: ByteStream,
        size: u64,
        metadata: BTreeMap<String, String>,
        headers: &ObjectHeaders,
    ) -> Result<RemoteObject> {
        if size > PART as u64 {
            return self.put_in_parts(key, body, size, metadata, headers).await;
        }
        put_gathered(self, key, body, size, metadata, headers).await
    }

    /// [`put_stream`](Self::put_stream) of a body larger than [`PART`]. Providers whose objects
    /// may be larger than one request carries, or than memory should hold, upload it in parts
    /// (S3 multipart, Azure blocks, a Cloud Storage resumable upload; see [`part_size`]), a few
    /// parts in memory at a time. This default gathers the body and puts it in one request.
    async fn put_in_parts(
        &self,
        key: &str,
        body: ByteStream,
        size: u64,
        metadata: BTreeMap<String, String>,
        headers: &ObjectHeaders,
    ) -> Result<RemoteObject> {
        put_gathered(self, key, body, size, metadata, headers).await
    }

    /// Deleting a missing key is not an error.
    async fn delete(&self, key: &str) -> Result<()>;

    /// Puts at `to` a copy of the object at `from` if it is still the version `if_etag` names
    /// (`PreconditionFailed` if not, `NotFound` if gone), with `metadata` and `headers` in place
    /// of its own. Stores with a server-side copy override this; here the bytes go through
    /// memory, a GET and a PUT.
    async fn copy(
        &self,
        from: &str,
        to: &str,
        if_etag: &str,
        metadata: BTreeMap<String, String>,
        headers: &ObjectHeaders,
    ) -> Result<RemoteObject> {
        use futures::StreamExt;
        let mut stream = self.get(from, None, Some(if_etag)).await?;
        let mut body = bytes::BytesMut::new();
        while let Some(chunk) = stream.next().await {
            body.extend_from_slice(&chunk.map_err(|e| crate::Error::io(format!("reading {from}"), e))?);
        }
        self.put_with_headers(to, body.freeze(), metadata, headers).await
    }
}

/// The kinds of remote storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StorageKind {
    S3,
    Gcs,
    Azure,
    Local,
}

impl StorageKind {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "s3" => Some(StorageKind::S3),
            "gcs" => Some(StorageKind::Gcs),
            "azure" => Some(StorageKind::Azure),
            "local" => Some(StorageKind::Local),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            StorageKind::S3 => "s3",
            StorageKind::Gcs => "gcs",
            StorageKind::Azure => "azure",
            StorageKind::Local => "local",
        }
    }
}

/// A `remote.configure` record, stored at `/etc/tidemark/remote/<name>.conf`. The settings
/// are the `-TYPE.SETTING` flags of `remote.configure` (`s3.access_key`, `local.root`, ...),
/// keyed without the type prefix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteConf {
    pub name: String,
    pub kind: StorageKind,
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
}

/// Settings whose values are never printed, logged or returned unmasked.
pub const SECRET_SETTINGS: &[&str] = &[
    "secret_key",
    "session_token",
    "account_key",
    "sas_token",
    "service_account_json",
    "access_token",
    "client_secret",
];

impl RemoteConf {
    pub fn setting(&self, name: &str) -> Option<&str> {
        self.settings.get(name).map(String::as_str).filter(|v| !v.is_empty())
    }

    /// A copy safe to show: secrets replaced by `****` and their last 4 characters at most.
    pub fn masked(&self) -> RemoteConf {
        let mut c = self.clone();
        for (k, v) in c.settings.iter_mut() {
            if SECRET_SETTINGS.contains(&k.as_str()) {
                *v = mask(v);
            }
        }
        c
    }

    pub fn validate_name(name: &str) -> Result<()> {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && name.as_bytes()[0].is_ascii_alphanumeric();
        if ok {
            Ok(())
        } else {
            Err(Error::invalid_argument(format!(
                "bad remote name {name:?}: use letters, digits, `-` and `_` (at most 64, starting with a letter or digit)"
            )))
        }
    }
}

use crate::secrets::mask;

/// Where a mount points: a remote, a bucket, and a path (key prefix) inside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteLocation {
    pub storage: String,
    pub bucket: String,
    /// `""` for the whole bucket; otherwise without leading or trailing `/`.
    #[serde(default)]
    pub path: String,
}

impl RemoteLocation {
    /// Parses `-remote=NAME/bucket[/path]`.
    pub fn parse(s: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::invalid_argument(format!("bad -remote={s:?}: {why}; expected NAME/BUCKET or NAME/BUCKET/PATH"))
        };
        let s_trim = s.trim_matches('/');
        let mut parts = s_trim.splitn(3, '/');
        let storage = parts.next().filter(|p| !p.is_empty()).ok_or_else(|| bad("no remote name"))?;
        RemoteConf::validate_name(storage).map_err(|_| bad("the remote name is not valid"))?;
        let bucket = parts.next().filter(|p| !p.is_empty()).ok_or_else(|| bad("no bucket"))?;
        if bucket.contains(['\\', '\0']) || bucket == "." || bucket == ".." {
            return Err(bad("the bucket name is not valid"));
        }
        let path = parts.next().unwrap_or("").trim_matches('/').to_string();
        for seg in path.split('/').filter(|_| !path.is_empty()) {
            if let Some(reason) = path::segment_problem(seg) {
                return Err(bad(&format!("the path has {reason}")));
            }
        }
        Ok(RemoteLocation { storage: storage.into(), bucket: bucket.into(), path })
    }

    /// The key prefix of the mount's objects: `""` or `path/`.
    pub fn key_prefix(&self) -> String {
        if self.path.is_empty() { String::new() } else { format!("{}/", self.path) }
    }
}

impl std::fmt::Display for RemoteLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}/{}", self.storage, self.bucket)
        } else {
            write!(f, "{}/{}/{}", self.storage, self.bucket, self.path)
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    pub dir: String,
    pub location: RemoteLocation,
    /// Whether local writes under the mount are uploaded (`remote.sync.enable`).
    #[serde(default)]
    pub sync: bool,
}

/// `/etc/tidemark/remote/mount.mapping`: every mount of this namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountMapping {
    pub mounts: Vec<Mount>,
}

impl MountMapping {
    /// The mount whose directory is `path` or contains it.
    pub fn find_for(&self, p: &str) -> Option<&Mount> {
        self.mounts.iter().find(|m| path::is_within(p, &m.dir))
    }

    pub fn find_dir(&self, dir: &str) -> Option<&Mount> {
        self.mounts.iter().find(|m| m.dir == dir)
    }
}

/// Where Tidemark keeps its own files in the namespace.
pub mod system_paths {
    /// The system directory: every document below it is the control plane's (admin token only).
    pub const ROOT: &str = "/etc/tidemark";

    /// Whether `p` is the system directory or lies below it.
    pub fn is_system(p: &str) -> bool {
        crate::path::is_within(p, ROOT)
    }

    /// Whether a change at `p` could reach the system directory: `p` is in it, or above it (`/`,
    /// `/etc`), where a recursive delete or a mount would take it along.
    pub fn reaches_system(p: &str) -> bool {
        is_system(p) || crate::path::is_within(ROOT, p)
    }
    /// The cluster's identity: `{"id": "..."}`, created once by the first filer.
    pub const CLUSTER: &str = "/etc/tidemark/cluster.json";
    pub const REMOTE_DIR: &str = "/etc/tidemark/remote";
    pub const MOUNT_MAPPING: &str = "/etc/tidemark/remote/mount.mapping";

    pub fn remote_conf(name: &str) -> String {
        format!("{REMOTE_DIR}/{name}.conf")
    }

    /// How far the outbound sync has followed the change log: `{"seq": N}`, written by the filer
    /// holding the [`OUTBOUND_LEASE`] (fenced by it), so any filer can take over where it stopped.
    pub const OUTBOUND_CURSOR: &str = "/etc/tidemark/outbound/cursor.json";
    /// The lease one filer of a cluster holds while it runs the outbound sync.
    pub const OUTBOUND_LEASE: &str = "filer/outbound-sync";

    /// Where users' deletes under synced mounts wait for the outbound sync (`decide::Tombstone`).
    pub const TOMBSTONES_DIR: &str = "/etc/tidemark/tombstones";

    /// The tombstone of `path`: `/` and `%` percent-escaped, so the mapping is injective.
    pub fn tombstone(path: &str) -> String {
        format!("{TOMBSTONES_DIR}/{}.json", path.replace('%', "%25").replace('/', "%2F"))
    }
}

/// An upload in parts (S3 multipart, Azure blocks, a Cloud Storage resumable upload): its first
/// parts are this large (S3 wants 5 MiB at least, all but the last; Cloud Storage multiples of
/// 256 KiB). Parts double in size every [`PARTS_PER_SIZE`] parts, so the 10,000 parts S3 allows
/// carry any object it allows (5 TiB) while small files stay a few parts.
pub const PART: usize = 8 * 1024 * 1024;
const PARTS_PER_SIZE: i32 = 1000;

/// The largest part: Azure's largest block (S3's largest part is 5 GiB). With it the 10,000
/// parts still carry 7.7 TiB.
const MAX_PART: usize = 4000 * 1024 * 1024;

/// The size of part `number` (from 1).
pub fn part_size(number: i32) -> usize {
    (PART << ((number - 1) / PARTS_PER_SIZE).clamp(0, 9)).min(MAX_PART)
}

/// `body` (`size` bytes) gathered and put in one request.
async fn put_gathered<S: RemoteStorage + ?Sized>(
    store: &S,
    key: &str,
    body: ByteStream,
    size: u64,
    metadata: BTreeMap<String, String>,
    headers: &ObjectHeaders,
) -> Result<RemoteObject> {
    let body = gather(body, size, key).await?;
    store.put_with_headers(key, body, metadata, headers).await
}

/// All of `body`, which must be `size` bytes (a put of another length than the caller said
/// would store something else than it meant).
pub async fn gather(mut body: ByteStream, size: u64, key: &str) -> Result<Bytes> {
    use futures::StreamExt;
    let mut buf = bytes::BytesMut::with_capacity(usize::try_from(size).unwrap_or(0).min(64 << 20));
    while let Some(chunk) = body.next().await {
        buf.extend_from_slice(&chunk.map_err(|e| crate::Error::io(format!("reading the bytes for {key}"), e))?);
    }
    if buf.len() as u64 != size {
        return Err(wrong_length(key, size, buf.len() as u64));
    }
    Ok(buf.freeze())
}

/// Reads from `body` into `buf` until it holds `want` bytes or the body ends, and takes them:
/// the next part of an upload in parts (`None` once nothing is left). `taken` counts the bytes
/// taken so far, and the body may not bring more than `size`.
pub async fn next_part(
    body: &mut ByteStream,
    buf: &mut bytes::BytesMut,
    want: usize,
    taken: &mut u64,
    size: u64,
    key: &str,
) -> Result<Option<Bytes>> {
    use futures::StreamExt;
    while buf.len() < want {
        match body.next().await {
            Some(chunk) => {
                buf.extend_from_slice(&chunk.map_err(|e| crate::Error::io(format!("reading the bytes for {key}"), e))?)
            }
            None => break,
        }
    }
    let part = buf.split_to(buf.len().min(want)).freeze();
    *taken += part.len() as u64;
    if *taken > size {
        return Err(wrong_length(key, size, *taken));
    }
    Ok((!part.is_empty()).then_some(part))
}

/// A body of another length than its put said.
pub fn wrong_length(key: &str, size: u64, got: u64) -> crate::Error {
    crate::Error::invalid_argument(format!(
        "{key}: a put of {size} bytes got {got}{}",
        if got > size { " or more" } else { "" }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream_of(pieces: &[usize]) -> ByteStream {
        use futures::StreamExt;
        let mut n = 0u8;
        let parts: Vec<std::io::Result<Bytes>> = pieces
            .iter()
            .map(|&len| {
                let b: Vec<u8> = (0..len)
                    .map(|_| {
                        n = n.wrapping_add(1);
                        n
                    })
                    .collect();
                Ok(Bytes::from(b))
            })
            .collect();
        futures::stream::iter(parts).boxed()
    }

    #[test]
    fn parts_grow_so_ten_thousand_carry_five_tebibytes() {
        assert_eq!((part_size(1), part_size(1000), part_size(1001)), (PART, PART, 2 * PART));
        let total: u64 = (1..=10_000).map(|n| part_size(n) as u64).sum();
        assert!(total >= 5 << 40, "{total}");
        assert!(part_size(10_000) <= 4000 << 20, "Azure's largest block is 4000 MiB, S3's largest part 5 GiB");
    }

    /// The parts an upload in parts takes from a body: pieces straddling parts are split, the
    /// last part is what is left, and a body longer than said is refused before it is sent.
    #[tokio::test]
    async fn a_body_is_cut_into_parts_of_the_size_asked() {
        for (pieces, want, size, expect) in [
            (vec![3, 3, 3, 1], 4, 10, vec![4, 4, 2]),
            (vec![8], 4, 8, vec![4, 4]),
            (vec![1, 1, 1, 1, 1], 10, 5, vec![5]),
            (vec![], 4, 0, vec![]),
        ] {
            let mut body = stream_of(&pieces);
            let (mut buf, mut taken, mut got, mut all) = (bytes::BytesMut::new(), 0, Vec::new(), Vec::new());
            while let Some(p) = next_part(&mut body, &mut buf, want, &mut taken, size, "k").await.unwrap() {
                got.push(p.len());
                all.extend_from_slice(&p);
            }
            assert_eq!((got, taken), (expect, size), "{pieces:?} in parts of {want}");
            assert_eq!(all, (1..=size as u8).collect::<Vec<_>>(), "every byte once, in order");
        }
        let mut body = stream_of(&[6, 6]);
        let (mut buf, mut taken) = (bytes::BytesMut::new(), 0);
        assert!(next_part(&mut body, &mut buf, 4, &mut taken, 10, "k").await.is_ok());
        assert!(next_part(&mut body, &mut buf, 4, &mut taken, 10, "k").await.is_ok());
        let err = next_part(&mut body, &mut buf, 4, &mut taken, 10, "k").await.unwrap_err();
        assert!(err.to_string().contains("a put of 10 bytes got 12 or more"), "{err}");
        let err = gather(stream_of(&[3]), 4, "k").await.unwrap_err();
        assert!(err.to_string().contains("a put of 4 bytes got 3"), "{err}");
    }

    #[test]
    fn etags_normalise() {
        assert_eq!(normalize_etag("\"abc\""), "abc");
        assert_eq!(normalize_etag("W/\"abc\""), "abc");
        assert_eq!(normalize_etag("abc"), "abc");
    }

    #[test]
    fn remote_locations_parse_or_say_what_is_wrong() {
        let l = RemoteLocation::parse("s3main/bucket/photos/2024/").unwrap();
        assert_eq!((l.storage.as_str(), l.bucket.as_str(), l.path.as_str()), ("s3main", "bucket", "photos/2024"));
        assert_eq!(l.key_prefix(), "photos/2024/");
        assert_eq!(l.to_string(), "s3main/bucket/photos/2024");
        assert_eq!(RemoteLocation::parse("r/b").unwrap().key_prefix(), "");
        for (bad, says) in [("", "no remote name"), ("r", "no bucket"), ("r/b/a/../c", "`..`"), ("r!/b", "remote name")]
        {
            let e = RemoteLocation::parse(bad).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains("NAME/BUCKET"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_system_directory_and_what_lies_above_it() {
        use system_paths::{is_system, reaches_system};
        for p in ["/etc/tidemark", "/etc/tidemark/remote/s3.conf"] {
            assert!(is_system(p) && reaches_system(p), "{p}");
        }
        for p in ["/", "/etc"] {
            assert!(!is_system(p) && reaches_system(p), "{p}");
        }
        for p in ["/etc/tidemarks", "/etc/tidemark.conf", "/etcetera", "/data/etc/tidemark", "/e"] {
            assert!(!is_system(p) && !reaches_system(p), "{p}");
        }
    }

    #[test]
    fn secrets_are_masked() {
        let mut settings = BTreeMap::new();
        settings.insert("access_key".to_string(), "AKIAEXAMPLE".to_string());
        settings.insert("secret_key".to_string(), "wJalrXUtnFEMI/K7MDENG".to_string());
        let c = RemoteConf { name: "r".into(), kind: StorageKind::S3, settings };
        let m = c.masked();
        assert_eq!(m.settings["access_key"], "AKIAEXAMPLE");
        assert_eq!(m.settings["secret_key"], "****DENG");
        let unicode = RemoteConf {
            settings: [("secret_key".to_string(), "ééééééééééé".to_string())].into(),
            ..c.clone()
        };
        assert_eq!(unicode.masked().settings["secret_key"], "****éééé");
        assert!(!serde_json::to_string(&m).unwrap().contains("wJalr"));
        // Every credential-bearing setting of every provider, the GCS bearer token among them.
        for k in ["session_token", "account_key", "sas_token", "service_account_json", "access_token"] {
            let c = RemoteConf { settings: [(k.to_string(), "ya29.a0-very-secret".to_string())].into(), ..c.clone() };
            assert_eq!(c.masked().settings[k], "****cret", "{k}");
        }
    }

    #[test]
    fn mounts_are_found_by_directory() {
        let loc = RemoteLocation::parse("r/b").unwrap();
        let m = MountMapping { mounts: vec![Mount { dir: "/mnt/data".into(), location: loc, sync: false }] };
        assert!(m.find_for("/mnt/data/x/y").is_some());
        assert!(m.find_for("/mnt/data").is_some());
        assert!(m.find_for("/mnt/database").is_none());
    }
}

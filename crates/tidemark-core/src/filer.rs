//! The `Filer` trait: the namespace as every other component sees it. The in-process filer
//! (`tidemark_filer::LocalFiler`) and the HTTP client (`tidemark_filer::HttpFiler`) both
//! implement it, so the engine, the shell and the tests do not care which one they hold.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};

use crate::cache::{CacheOutcome, CacheStats, CacheStatus};
use crate::error::{Error, Result};
use crate::model::{Applied, ChangeRecord, Entry, Fence, Lease, Origin, Page, Precondition, Txn, TxnBatch};

/// A stream of content bytes. Content is streamed, never buffered whole.
pub type ByteStream = BoxStream<'static, std::io::Result<Bytes>>;

/// How long a request body may send nothing before the request is given up: a stalled upload
/// cannot hold a connection, and what it spooled, for ever. `TIDEMARK_BODY_IDLE_SECS` overrides
/// the default of 30 s (tests use a short one).
pub fn body_idle_limit() -> std::time::Duration {
    static LIMIT: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        let secs = std::env::var("TIDEMARK_BODY_IDLE_SECS").ok().and_then(|v| v.parse::<u64>().ok());
        std::time::Duration::from_secs(secs.filter(|s| *s > 0).unwrap_or(30))
    })
}

/// `stream`, failing with `TimedOut` once it sends nothing for `idle` (after which it ends).
pub fn idle_limited(stream: ByteStream, idle: std::time::Duration) -> ByteStream {
    use futures::StreamExt;
    futures::stream::unfold(Some(stream), move |s| async move {
        let mut s = s?;
        match tokio::time::timeout(idle, s.next()).await {
            Ok(Some(item)) => Some((item, Some(s))),
            Ok(None) => None,
            Err(_) => Some((
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the request body sent nothing for {} s; the request is given up", idle.as_secs()),
                )),
                None,
            )),
        }
    })
    .boxed()
}

/// What reopening a broken stream from where it broke gave ([`resuming`]).
pub enum Reopened {
    /// The rest of the bytes.
    Stream(ByteStream),
    /// Not now (the source unreachable): counted as another break.
    Retry(std::io::Error),
    /// Never (the source changed or went): the stream ends with this error.
    Fail(std::io::Error),
}

/// `stream`, bytes `pos..end` of something that can be opened again from any offset, resumed
/// where it broke: after a break it waits as `resumes` says and asks `reopen` for the rest
/// (given the range left and the error that broke it), as often as `resumes` allows in a row;
/// then it ends with the last error. A break after the last byte ends it well. Both resumed
/// reads — a bucket's GET in the filer, a filer's content in its client — are this.
pub fn resuming<F, Fut>(
    stream: ByteStream,
    pos: u64,
    end: u64,
    resumes: crate::backoff::Resumes,
    reopen: F,
) -> ByteStream
where
    F: FnMut(ByteRange, &std::io::Error) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Reopened> + Send,
{
    use futures::StreamExt;
    struct State<F> {
        stream: Option<ByteStream>,
        pos: u64,
        end: u64,
        resumes: crate::backoff::Resumes,
        reopen: F,
    }
    let state = State { stream: Some(stream), pos, end, resumes, reopen };
    futures::stream::unfold(state, |mut s| async move {
        loop {
            let mut e = match s.stream.as_mut()?.next().await {
                Some(Ok(b)) => {
                    s.pos += b.len() as u64;
                    s.resumes.got(b.len() as u64);
                    return Some((Ok(b), s));
                }
                Some(Err(e)) => e,
                None => return None,
            };
            s.stream = None;
            loop {
                // Everything asked for came: what broke was past it.
                if s.pos >= s.end {
                    return None;
                }
                let Some(wait) = s.resumes.broke() else {
                    let n = s.resumes.in_a_row();
                    let e =
                        std::io::Error::other(format!("{e} (resumed {n} times in a row at byte {}; gave up)", s.pos));
                    return Some((Err(e), s));
                };
                tokio::time::sleep(wait).await;
                let rest = ByteRange { offset: s.pos, length: Some(s.end - s.pos) };
                match (s.reopen)(rest, &e).await {
                    Reopened::Stream(stream) => {
                        s.stream = Some(stream);
                        break;
                    }
                    Reopened::Retry(again) => e = again,
                    Reopened::Fail(e) => return Some((Err(e), s)),
                }
            }
        }
    })
    .boxed()
}

/// What a read's stream ends with when it broke and, before it could be resumed where it broke,
/// the file became another version (or went): the bytes after the break would be another
/// version's, so the read fails instead. A client that retries the read would mix versions too;
/// it must read the file again from its start (see [`changed_mid_read`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{path} changed while its read was being resumed (it was version {was}{}); read it again from its start for the new version",
    match now { Some(v) => format!(", now {v}"), None => ", and is gone".to_string() }
)]
pub struct ChangedMidRead {
    pub path: String,
    pub was: u64,
    pub now: Option<u64>,
}

/// Whether a read's stream failed because the file changed mid-read ([`ChangedMidRead`]).
pub fn changed_mid_read(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<ChangedMidRead>())
}

/// A byte range of a file's content: `length: None` reads to the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByteRange {
    pub offset: u64,
    pub length: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteOptions {
    pub precondition: Precondition,
    pub mode: Option<u32>,
    pub mtime_ms: Option<i64>,
    pub origin: Origin,
    /// Replaces the entry's extended attributes (`None`: a rewrite keeps them). The filer sets
    /// [`MD5_ATTR`](crate::model::MD5_ATTR) itself, from the bytes it stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extended: Option<BTreeMap<String, String>>,
    /// The body's length as the client declared it (`Content-Length`), if it did: a write the
    /// content store has no room for is refused ([`Error::TooLarge`]) before a byte is spooled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared_len: Option<u64>,
    /// The owner and group of a file this write creates (`None`: the mounting user's, as
    /// before owners were kept); a rewrite keeps the entry's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    /// A write that creates the file also sets its directory's mtime and ctime
    /// ([`Txn::dir_times`](crate::model::Txn::dir_times)).
    #[serde(default)]
    pub dir_times: bool,
    /// The body holds only these ranges of the file; the rest is zeros
    /// ([`sparse`](crate::sparse)). `declared_len` is then the body's length, not the file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sparse: Option<crate::sparse::Sparse>,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            precondition: Precondition::Any,
            mode: None,
            mtime_ms: None,
            origin: Origin::Local,
            extended: None,
            declared_len: None,
            uid: None,
            gid: None,
            dir_times: false,
            sparse: None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteOptions {
    pub recursive: bool,
    pub precondition: Precondition,
    /// Also set the directory's mtime and ctime ([`Txn::dir_times`](crate::model::Txn::dir_times)).
    #[serde(default)]
    pub dir_times: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    pub status: String,
    pub version: String,
    pub store: String,
    pub last_seq: u64,
    /// Where the filer keeps its local cluster credential, when it made one (`tidemark server`
    /// without tokens): a 0600 file in its data directory. Whoever can read it may read the
    /// secrets whole — its owner, who could read them from the store anyway; every other client
    /// sees them masked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_token_file: Option<String>,
    /// This filer process's random id: a client that reached a filer two ways (its address and
    /// its `socket`) compares the two answers' ids to know it reached one filer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// The Unix socket in the filer's data directory on which it also serves this API (mode
    /// 0600: its own user's), for the clients on its machine (`tidemark mount`, `tidemark s3`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
}

#[async_trait]
pub trait Filer: Send + Sync + 'static {
    async fn health(&self) -> Result<Health>;

    async fn stat(&self, path: &str) -> Result<Option<Entry>>;

    /// The entry at `path` as `stat` answers it — except that a remote-backed entry whose
    /// object's headers were never seen (it came from a listing, which carries none) has them
    /// asked of the bucket first, once, and recorded (`object_attrs::HEADERS_SEEN`): what the
    /// S3 gateway and the HTTP API answer an object's readers with. A HEAD that fails leaves the
    /// entry as it was. Filers without buckets answer as `stat` does.
    async fn describe(&self, path: &str) -> Result<Option<Entry>> {
        self.stat(path).await
    }

    /// The entries at `paths`, in order, read at one point in time (see
    /// [`crate::MetaStore::get_many`]).
    async fn stat_many(&self, paths: &[String]) -> Result<Vec<Option<Entry>>>;

    /// See [`crate::MetaStore::list`].
    async fn list(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page>;

    /// See [`crate::MetaStore::scan`].
    async fn scan(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page>;

    /// How many entries lie strictly below `dir`, leaving out `except` and everything below it
    /// (in one read: a data client's count of `/` says nothing of the system directory).
    async fn count(&self, dir: &str, except: Option<&str>) -> Result<u64>;

    /// The entry and a stream of its content (or of `range` of it). A client over a network
    /// (`HttpFiler`) resumes a stream that breaks where it broke, on the same version; one that
    /// cannot ends with an error ([`ChangedMidRead`] when the file changed).
    async fn read(&self, path: &str, range: Option<ByteRange>) -> Result<(Entry, ByteStream)>;

    /// Writes a file from a stream. The entry is committed only after every byte is durable;
    /// a write that fails or is interrupted leaves the previous entry (or none) in place.
    async fn write(&self, path: &str, body: ByteStream, opts: WriteOptions) -> Result<Entry>;

    async fn delete(&self, path: &str, opts: DeleteOptions) -> Result<Applied>;

    /// The conditional, optionally fenced transaction (metadata and inline content only).
    async fn apply(&self, txn: Txn) -> Result<Applied>;

    /// Many conditional transactions in one store transaction (see [`TxnBatch`] and
    /// [`crate::MetaStore::apply_many`]): nothing lands if the batch's fence fails.
    async fn apply_many(&self, batch: TxnBatch) -> Result<Vec<Result<Applied>>>;

    async fn lease_acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Lease>;
    async fn lease_renew(&self, fence: &Fence, ttl: Duration) -> Result<Lease>;
    async fn lease_release(&self, fence: &Fence) -> Result<()>;
    async fn lease_get(&self, name: &str) -> Result<Option<Lease>>;

    /// Change-log records after `after`; if there are none yet, waits up to `wait` for some.
    async fn changes(&self, after: u64, limit: usize, wait: Duration) -> Result<Vec<ChangeRecord>>;

    /// What this filer holds cached of each of `paths` (in the same order; a missing path is
    /// reported with size 0 and nothing cached).
    async fn cache_status(&self, _paths: &[String]) -> Result<Vec<CacheStatus>> {
        Err(no_cache())
    }

    /// Fetches every chunk of a remote-backed file that is not cached yet (`remote.cache`).
    /// With `wait`, returns once the bytes are durable in the cache; without, it starts the
    /// fetch and returns at once (the event prefetch).
    async fn cache_fetch(&self, _path: &str, _wait: bool) -> Result<CacheOutcome> {
        Err(no_cache())
    }

    /// Drops the cached bytes of a remote-backed file (`remote.uncache`); never local content.
    async fn cache_drop(&self, _path: &str) -> Result<CacheOutcome> {
        Err(no_cache())
    }

    /// The cache's counters and use.
    async fn cache_stats(&self) -> Result<CacheStats> {
        Err(no_cache())
    }

    /// The file on this filer's machine that holds the bytes of `path`, if they lie whole in
    /// one (a blob in the data directory, or a remote-backed file the content cache holds
    /// whole; not inline or object-store content): what a FUSE mount beside the filer hands the
    /// kernel to read from directly.
    async fn local_file(&self, _path: &str) -> Result<Option<LocalFile>> {
        Ok(None)
    }
}

/// Where the bytes of one version of a file lie on the filer's machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalFile {
    /// An absolute path; the file's bytes are never changed (a new version is a new file),
    /// though the file may be unlinked, and a cached object's file then made again.
    pub file: String,
    /// The entry's version whose bytes these are.
    pub version: u64,
    pub size: u64,
    /// Which file that was when the filer looked: an opener reads the file it opened only if
    /// it is this one (absent from filers before 2026-12-06, whose files were never made again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<FileIdentity>,
}

/// A file's device and inode numbers: which file it is, whatever its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileIdentity {
    pub dev: u64,
    pub ino: u64,
}

impl FileIdentity {
    /// The identity of the file `m` describes.
    pub fn of(m: &std::fs::Metadata) -> FileIdentity {
        use std::os::unix::fs::MetadataExt;
        FileIdentity { dev: m.dev(), ino: m.ino() }
    }
}

fn no_cache() -> Error {
    Error::invalid_argument("this filer has no content cache")
}

#[cfg(test)]
mod idle_tests {
    use super::*;
    use futures::StreamExt;

    #[tokio::test]
    async fn a_body_that_stalls_is_given_up() {
        let chunks = futures::stream::iter([Ok(Bytes::from_static(b"a"))]).chain(futures::stream::pending()).boxed();
        let mut s = idle_limited(chunks, std::time::Duration::from_millis(200));
        assert_eq!(s.next().await.unwrap().unwrap(), Bytes::from_static(b"a"));
        let err = s.next().await.unwrap().unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert!(s.next().await.is_none(), "and then it ends");
        let whole = idle_limited(
            futures::stream::iter([Ok(Bytes::from_static(b"b"))]).boxed(),
            std::time::Duration::from_secs(5),
        );
        assert_eq!(whole.collect::<Vec<_>>().await.len(), 1, "a body that ends is untouched");
    }
}

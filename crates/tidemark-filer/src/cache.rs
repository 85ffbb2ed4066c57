//! The content cache: bytes of remote-backed files kept in the data directory, so that a file
//! once read is served locally and makes no remote call.
//!
//! - **Chunks.** An object is cached in chunks (8 MiB by default): a read fetches only the
//!   chunks its range touches, so `head -c 100` of a 10 GiB object fetches one chunk.
//! - **One file per object, named by content id, recorded in the store.** An object's cached
//!   chunks lie at their own offsets in one sparse file, `cache/<id[..2]>/<content id>`, so a
//!   wholly cached object is a plain file a FUSE mount beside the filer can hand the kernel
//!   ([`ContentCache::local_file`]). A chunk becomes reachable only when its record
//!   ([`CachedChunk`]) commits in the store — after its bytes are written and fsynced. The store
//!   records a chunk only while the entry still has that content id, and a write that changes
//!   the entry's remote version drops the records in its own transaction
//!   (`tidemark_core::cache`): after it commits, no read finds the old bytes. A file no record
//!   names is garbage: removed after the invalidating commit, and by a sweep at start.
//! - **Bytes are never taken out of a file.** An object leaves the cache whole (its records,
//!   then its file unlinked): a reader that has the file open — a FUSE mount's kernel among
//!   them — keeps reading the bytes it opened. Under each object's lock, a record is made only
//!   if the file written is still the one at the object's path, and a file is unlinked only
//!   after its records are gone; so a record always names bytes in the file at its path, and a
//!   reader checks that the file it opened is that one when an object may have gone meanwhile.
//! - **Single flight.** One fetch per (content id, chunk) at a time; concurrent readers of a
//!   cold chunk wait for that fetch and share its bytes.
//! - **Budget.** When the recorded bytes exceed the budget, the objects whose chunks were least
//!   recently read are forgotten (records first, then file). Only remote-backed content is
//!   cache: local writes live in `blobs/` or the store and are never evicted.
//!
//! A SIGKILL at any point leaves at worst a file without a record (swept at start) or a
//! record whose file is gone (read as a miss and fetched again) — never a record of bytes that
//! are not durable, because the record is written last.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use tokio::sync::{Notify, OnceCell, watch};

use tidemark_core::cache::{
    CacheOutcome, CacheStats, CacheStatus, CachedChunk, DEFAULT_CHUNK_BYTES, chunk_range, chunks_of, content_id,
};
use tidemark_core::filer::FileIdentity;
use tidemark_core::model::Entry;
use tidemark_core::{ByteRange, ByteStream, Clock, Error, MetaStore, Result};

use crate::remotes::{Located, Remotes};

/// The file under `cache/` that names the layout and chunk size the recorded chunks were cut
/// at: anything else there (an older layout, another `--cache-chunk-size`) is forgotten.
const LAYOUT_FILE: &str = "layout";
/// Objects' locks, by a hash of the content id (see [`Inner::object_lock`]).
const OBJECT_LOCKS: usize = 64;
/// How many chunks one reader has in flight ahead of the one it streams.
const READ_AHEAD: usize = 4;
/// How often last-read times are written to the store, and the budget checked, without cause.
const HOUSEKEEPING_EVERY: Duration = Duration::from_secs(15);
/// The sweep of unrecorded bytes runs at start and every this many housekeeping rounds (on a
/// shared store another filer's writes drop this filer's records without it knowing).
const SWEEP_EVERY_ROUNDS: u64 = 240;
/// How much older than the sweep a file no record names must be to go: a file's times come
/// from a clock that may lag the system's by a tick.
const SWEEP_MARGIN: Duration = Duration::from_secs(5);
/// Records forgotten per round of eviction.
const EVICT_BATCH: usize = 64;

/// How the cache is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// The most bytes kept; 0 turns the cache off (every read goes to the bucket).
    pub budget_bytes: u64,
    pub chunk_bytes: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig { budget_bytes: 1 << 30, chunk_bytes: DEFAULT_CHUNK_BYTES }
    }
}

/// What a fetch of one chunk has got to; readers wait on it.
#[derive(Clone)]
enum Flight {
    Fetching,
    Fetched(Result<Bytes>),
    /// The bytes, after an attempt to record them that failed (or a failed fetch).
    Done(Result<Bytes>),
    /// Recorded: the bytes are in the object's file. Kept for a moment after the fetch, so a
    /// reader that looked the chunk up just before it was recorded reads the file instead of
    /// fetching the chunk again. With the bytes until the reader took them (a run fetches ahead
    /// of its reader, and a reader waits for the one who reads its stream: the disk is often
    /// quicker than both): it then takes them from memory instead of reading back from the disk
    /// what was just written there (half of a cold sequential read did, into fresh buffers).
    Recorded(Option<Bytes>),
    /// The run gave up before this chunk; a reader starts another.
    Abandoned,
}

/// How many chunks each run of a slow stream's split fetches: enough that a GET's wait for its
/// answer (`open_s`, as the run's own took) costs at most a quarter of the time its bytes take
/// at the stream's rate. A bucket that answers in tens of milliseconds gets short runs, so many
/// connections share the object; a store that prepares each GET for a tenth of a second (moto
/// copies the whole object, one GET at a time) gets longer ones, where more GETs only wait.
/// Measured behind 100 MiB/s per connection, a mount's first read of 256 MiB: runs of 8 chunks
/// always gave 2.5 × one GET against a Tidemark gateway and 1.75–1.82 × against moto, runs of
/// 4 always 3.0–3.8 × and 1.53 ×; sized this way, 3.15–3.56 × and 1.72–1.95 ×.
fn split_chunks(open_s: f64, bytes_per_s: f64, chunk_bytes: u64) -> u64 {
    let chunks = 4.0 * open_s * bytes_per_s / chunk_bytes.max(1) as f64;
    if chunks.is_finite() { (chunks.ceil() as u64).clamp(MIN_SPLIT_CHUNKS, MAX_SPLIT_CHUNKS) } else { MAX_SPLIT_CHUNKS }
}

/// A run's readers say how far they want it to go. The helper runs it hands chunks to open
/// their GETs `OPENING` at a time, in the order of their chunks (the semaphore is fair).
struct Run {
    wanted: watch::Sender<u64>,
    opening: Arc<tokio::sync::Semaphore>,
    /// The chunks of each helper run, once a split has decided it.
    split: AtomicU64,
}

impl Run {
    fn new(first: u64) -> Self {
        Run {
            wanted: watch::Sender::new(first),
            opening: Arc::new(tokio::sync::Semaphore::new(OPENING)),
            split: AtomicU64::new(MIN_SPLIT_CHUNKS),
        }
    }

    fn want(&self, k: u64) {
        self.wanted.send_if_modified(|w| {
            let more = k > *w;
            *w = (*w).max(k);
            more
        });
    }
}

/// A chunk's fetch in flight, and the run it is part of.
struct FlightEntry {
    rx: watch::Receiver<Flight>,
    run: Arc<Run>,
}

/// How many chunks a run fetches ahead of the furthest one a reader asked for.
const RUN_AHEAD: u64 = 4;
/// How long a run waits for a reader to ask for more before it gives up the rest.
const RUN_IDLE: Duration = Duration::from_secs(15);

/// A run whose stream brings less than this gives the rest of its chunks to several shorter
/// runs that fetch them at once: a bucket serves one stream at roughly 80–100 MB/s, several in
/// parallel at many times that. A faster stream (a bucket near by, or the object cached in
/// front of it) stays one GET: each GET costs a round trip and, on some stores, much more.
const SLOW_STREAM_BYTES_PER_S: f64 = 200.0 * 1024.0 * 1024.0;
/// The chunks of one of those shorter runs (see [`split_chunks`]), and how many of them fetch
/// at once ahead of the reader (per file; `MAX_FETCHES` bounds them per filer).
const MIN_SPLIT_CHUNKS: u64 = 4;
const MAX_SPLIT_CHUNKS: u64 = 16;
const PARALLEL_RUNS: u64 = 8;
/// How many bytes of a stream its rate is measured over (its first chunk's: waiting longer to
/// split costs a slow stream a chunk's time, about 80 ms at 100 MiB/s).
const RATE_SAMPLE_BYTES: u64 = 1 << 20;
/// How many helper runs of one file wait for their GET's answer at once. A bucket answers in
/// tens of milliseconds and they all start nearly together; a store that prepares each GET
/// slowly and one at a time (moto copies the whole object for each) then starts them in the
/// order the reader needs them instead of in whatever order it finishes preparing them.
const OPENING: usize = 2;

/// Chunk fetches in flight at once, per filer: bounds the memory cold reads hold (each holds its
/// chunk until it is written) whatever the number of readers.
const MAX_FETCHES: usize = 32;

/// Chunk files written (and fsynced) at once, per filer. A write per fetched chunk at once (up to
/// `MAX_FETCHES`) had the writes fight the stream they came from: a cold 256 MiB read took
/// 0.70–0.80 s on this project's 2-core machines, with two writers 0.52–0.58 s (one: 0.52 s);
/// two keep a fast disk busy. Readers do not wait for the writes; the fetch permits bound what
/// waits for them in memory.
const CHUNK_WRITERS: usize = 2;

/// How long a recorded fetch stays joinable.
const RECORDED_GRACE: Duration = Duration::from_secs(2);
/// Recorded chunks whose bytes are kept for their reader, per filer (see [`Flight::Recorded`]):
/// at most this many, and no more bytes than that many default chunks (a larger
/// `--cache-chunk-size` holds fewer); for how long at most: a reader that does not come within
/// it reads them from the disk. How often a held chunk looks whether its reader took it.
const HELD_CHUNKS: usize = 16;
const HELD_BYTES: u64 = HELD_CHUNKS as u64 * DEFAULT_CHUNK_BYTES;
const HELD_FOR: Duration = Duration::from_secs(1);
const HELD_CHECK: Duration = Duration::from_millis(5);

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    requests: AtomicU64,
    bytes_fetched: AtomicU64,
    bytes_served: AtomicU64,
    evictions: AtomicU64,
    evicted_bytes: AtomicU64,
    read_back: AtomicU64,
    resident_bytes: AtomicU64,
    resident_chunks: AtomicU64,
}

type FlightKey = (String, u64);

struct Inner {
    store: Arc<dyn MetaStore>,
    remotes: Arc<Remotes>,
    clock: Arc<dyn Clock>,
    node: String,
    dir: PathBuf,
    tmp: PathBuf,
    config: CacheConfig,
    flights: Mutex<HashMap<FlightKey, FlightEntry>>,
    /// Last-read times not yet written to the store.
    reads: Mutex<HashMap<(String, u64), i64>>,
    counters: Counters,
    wake: Arc<Notify>,
    /// One round of housekeeping at a time (the timer's, a wake-up's, a caller's).
    housekeeping: tokio::sync::Mutex<()>,
    fetch_permits: Arc<tokio::sync::Semaphore>,
    write_permits: Arc<tokio::sync::Semaphore>,
    /// Bounds the recorded chunks held in memory for their readers (`HELD_CHUNKS`, `HELD_BYTES`).
    held_permits: Arc<tokio::sync::Semaphore>,
    started: AtomicBool,
    /// Whether the chunks on record were laid out as this cache lays them out: the file
    /// `layout` says so, or they are forgotten before the first use (see [`Inner::ready`]).
    same_layout: bool,
    ready: OnceCell<()>,
    /// Held to record a chunk in an object's file, to take an object out, and to check that a
    /// file opened is still the object's (striped: an object maps to one of them).
    object_locks: Vec<tokio::sync::Mutex<()>>,
    /// How many object files were unlinked: a read that sees it unchanged since it read the
    /// records knows the file it opened is the one they name.
    unlinks: AtomicU64,
}

/// The filer's content cache (cheap to clone).
#[derive(Clone)]
pub struct ContentCache {
    inner: Arc<Inner>,
}

fn io_err(what: &str, p: &Path, e: std::io::Error) -> Error {
    Error::io(format!("{what} {}", p.display()), e)
}

fn random_hex(n: usize) -> Result<String> {
    tidemark_core::ids::random_hex(n, "a cache file")
}

fn valid_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| Error::internal(format!("cache task failed: {e}")))?
}

impl ContentCache {
    /// Opens the cache under `root` (`root/cache/`): clears what a crash left half written, and
    /// reads or creates this data directory's node id. Background housekeeping starts with
    /// [`ContentCache::start`].
    pub fn open(
        root: &Path,
        store: Arc<dyn MetaStore>,
        remotes: Arc<Remotes>,
        clock: Arc<dyn Clock>,
        config: CacheConfig,
    ) -> Result<Self> {
        if config.chunk_bytes == 0 {
            return Err(Error::invalid_argument("the cache's chunk size must be at least 1 byte"));
        }
        let dir = root.join("cache");
        let tmp = dir.join("tmp");
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(|e| io_err("clearing", &tmp, e))?;
        }
        std::fs::create_dir_all(&tmp).map_err(|e| io_err("creating", &tmp, e))?;
        let node_file = dir.join("node-id");
        let node = match std::fs::read_to_string(&node_file) {
            Ok(s) if valid_id(s.trim()) => s.trim().to_string(),
            Ok(_) | Err(_) => {
                let id = random_hex(16)?;
                write_own_file(&dir, &tmp, "node-id", &id)?;
                id
            }
        };
        let same_layout = std::fs::read_to_string(dir.join(LAYOUT_FILE)).is_ok_and(|s| s == layout(&config));
        let inner = Arc::new(Inner {
            store,
            remotes,
            clock,
            node,
            dir,
            tmp,
            config,
            flights: Mutex::default(),
            reads: Mutex::default(),
            counters: Counters::default(),
            wake: Arc::new(Notify::new()),
            housekeeping: tokio::sync::Mutex::new(()),
            fetch_permits: Arc::new(tokio::sync::Semaphore::new(MAX_FETCHES)),
            write_permits: Arc::new(tokio::sync::Semaphore::new(CHUNK_WRITERS)),
            held_permits: Arc::new(tokio::sync::Semaphore::new(
                (HELD_BYTES / config.chunk_bytes.max(1)).clamp(1, HELD_CHUNKS as u64) as usize,
            )),
            started: AtomicBool::new(false),
            same_layout,
            ready: OnceCell::new(),
            object_locks: (0..OBJECT_LOCKS).map(|_| tokio::sync::Mutex::new(())).collect(),
            unlinks: AtomicU64::new(0),
        });
        Ok(ContentCache { inner })
    }

    /// Starts background housekeeping (the sweep of unrecorded bytes, then last-read times and
    /// the budget every few seconds), once; every use of the cache calls it. Not at `open`: a
    /// cache replaced before its first use (`LocalFiler::with_cache`) must not sweep beside its
    /// successor, whose fetches in flight it cannot see.
    pub fn start(&self) {
        if !self.inner.started.swap(true, Ordering::AcqRel) && tokio::runtime::Handle::try_current().is_ok() {
            tokio::spawn(housekeeping(Arc::downgrade(&self.inner), self.inner.wake.clone()));
        }
    }

    pub fn enabled(&self) -> bool {
        self.inner.config.budget_bytes > 0
    }

    pub fn node(&self) -> &str {
        &self.inner.node
    }

    /// Streams `range` of a remote-backed entry's content, from the cache where it holds the
    /// chunks and from the bucket (caching them) where it does not. An error about the first
    /// chunk (the bucket unreachable, the object changed) is returned here, not mid-stream.
    pub async fn read(&self, entry: &Entry, range: Option<ByteRange>) -> Result<ByteStream> {
        self.start();
        let inner = &self.inner;
        let Some(id) = content_id(entry) else {
            return Err(Error::internal(format!("{}: not remote-backed content", entry.path)));
        };
        let source = Arc::new(Source::new(inner.remotes.clone(), inner.store.clone(), entry.clone()));
        if !self.enabled() {
            return source.located().await?.get(range).await;
        }
        let (offset, length) = range.map_or((0, None), |r| (r.offset, r.length));
        let size = entry.size;
        let end = length.map_or(size, |n| offset.saturating_add(n).min(size));
        let span = chunks_of(size, offset, length, inner.config.chunk_bytes);
        if span.is_empty() {
            return Ok(futures::stream::empty().boxed());
        }
        // Before the records: an object unlinked after this may have been the file they name.
        let unlinks = inner.unlinks.load(Ordering::SeqCst);
        let present: HashSet<u64> = inner.held(&entry.path, &id).await?.iter().map(|c| c.chunk).collect();
        let chunk_bytes = inner.config.chunk_bytes;
        let ends = run_ends(span.clone(), &present);
        let (inner, entry, id) = (inner.clone(), Arc::new(entry.clone()), Arc::new(id));
        let mut pieces = futures::stream::iter(span.clone())
            .map(move |k| {
                let r = chunk_range(size, k, chunk_bytes);
                let lo = offset.max(r.start) - r.start;
                let hi = end.min(r.end) - r.start;
                let (inner, source, entry, id) = (inner.clone(), source.clone(), entry.clone(), id.clone());
                let cached = present.contains(&k);
                let run_to = ends[(k - span.start) as usize];
                let cached = cached.then_some(unlinks);
                async move { inner.piece(&source, &entry, &id, k, lo..hi, cached, run_to).await }
            })
            .buffered(READ_AHEAD);
        let first = match pieces.next().await {
            Some(Ok(b)) => b,
            Some(Err(e)) => return Err(e),
            None => return Ok(futures::stream::empty().boxed()),
        };
        let rest = pieces.map_err(|e| std::io::Error::other(e.to_string()));
        Ok(futures::stream::once(futures::future::ready(Ok(first))).chain(rest).boxed())
    }

    /// What the cache holds of `entry`'s current version.
    pub async fn status(&self, path: &str, entry: Option<&Entry>) -> Result<CacheStatus> {
        let Some(entry) = entry else {
            return Ok(CacheStatus { path: path.into(), size: 0, cached_bytes: 0, chunks: 0, remote: false });
        };
        let Some(id) = content_id(entry) else {
            return Ok(CacheStatus { path: path.into(), size: entry.size, cached_bytes: 0, chunks: 0, remote: false });
        };
        let mine = self.inner.held(path, &id).await?;
        Ok(CacheStatus {
            path: path.into(),
            size: entry.size,
            cached_bytes: mine.iter().map(|c| c.len).sum(),
            chunks: mine.len() as u64,
            remote: true,
        })
    }

    /// Fetches every chunk of `entry` not cached yet; with `wait`, returns when they are
    /// recorded, else at once (the fetch goes on in the background).
    pub async fn fetch(&self, entry: &Entry, wait: bool) -> Result<CacheOutcome> {
        self.start();
        let outcome = |bytes, cached_bytes, skipped: Option<&str>| CacheOutcome {
            path: entry.path.clone(),
            size: entry.size,
            bytes,
            cached_bytes,
            skipped: skipped.map(str::to_string),
        };
        let Some(id) = content_id(entry) else {
            return Ok(outcome(0, 0, Some(skip_reason(entry))));
        };
        if !self.enabled() {
            return Ok(outcome(0, 0, Some("the cache is off (--cache-size 0)")));
        }
        let held = self.inner.held(&entry.path, &id).await?;
        let cached_before: u64 = held.iter().map(|c| c.len).sum();
        let present: HashSet<u64> = held.iter().map(|c| c.chunk).collect();
        let span = chunks_of(entry.size, 0, None, self.inner.config.chunk_bytes);
        let ends = run_ends(span.clone(), &present);
        let missing: Vec<(u64, u64)> =
            span.clone().filter(|k| !present.contains(k)).map(|k| (k, ends[(k - span.start) as usize])).collect();
        let source = Arc::new(Source::new(self.inner.remotes.clone(), self.inner.store.clone(), entry.clone()));
        let (inner, entry_arc, id_arc) = (self.inner.clone(), Arc::new(entry.clone()), Arc::new(id));
        let work = async move {
            let mut fetched = 0u64;
            let mut all = futures::stream::iter(missing)
                .map(|(k, run_to)| {
                    let (inner, source, entry, id) = (inner.clone(), source.clone(), entry_arc.clone(), id_arc.clone());
                    let len = chunk_range(entry.size, k, inner.config.chunk_bytes);
                    async move { inner.flight(&source, &entry, &id, k, run_to, true).await.map(|_| len.end - len.start) }
                })
                .buffered(READ_AHEAD);
            while let Some(r) = all.next().await {
                fetched += r?;
            }
            Ok::<u64, Error>(fetched)
        };
        if !wait {
            let path = entry.path.clone();
            tokio::spawn(async move {
                if let Err(e) = work.await {
                    tracing::warn!(path = %path, error = %e, "prefetch failed");
                }
            });
            return Ok(outcome(0, cached_before, None));
        }
        let fetched = work.await?;
        let after = self.status(&entry.path, Some(entry)).await?;
        Ok(outcome(fetched, after.cached_bytes, None))
    }

    /// Forgets every cached chunk of `path` (any version) and removes their bytes.
    pub async fn drop_path(&self, path: &str, entry: Option<&Entry>) -> Result<CacheOutcome> {
        self.start();
        let inner = &self.inner;
        inner.ready().await?;
        let rows = inner.store.cache_chunks(&inner.node, path).await?;
        let ids: HashSet<&str> = rows.iter().map(|c| c.content_id.as_str()).collect();
        let mut bytes = 0;
        for id in ids {
            bytes += inner.evict(path, id).await?.iter().map(|c| c.len).sum::<u64>();
        }
        let skipped = match entry {
            Some(e) if content_id(e).is_none() => Some(skip_reason(e).to_string()),
            None => Some("no such entry".to_string()),
            _ => None,
        };
        Ok(CacheOutcome { path: path.into(), size: entry.map_or(0, |e| e.size), bytes, cached_bytes: 0, skipped })
    }

    pub fn stats(&self) -> CacheStats {
        let c = &self.inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CacheStats {
            hits: get(&c.hits),
            misses: get(&c.misses),
            requests: get(&c.requests),
            bytes_fetched: get(&c.bytes_fetched),
            bytes_served: get(&c.bytes_served),
            evictions: get(&c.evictions),
            evicted_bytes: get(&c.evicted_bytes),
            read_back: get(&c.read_back),
            resumed: self.inner.remotes.resumed(),
            header_heads: self.inner.remotes.header_heads(),
            resident_bytes: get(&c.resident_bytes),
            resident_chunks: get(&c.resident_chunks),
            budget_bytes: self.inner.config.budget_bytes,
            chunk_bytes: self.inner.config.chunk_bytes,
            remote_requests: self.inner.remotes.requests(),
        }
    }

    /// Removes the file of a content id whose records an invalidating write dropped.
    pub async fn reclaim(&self, id: &str) {
        if !valid_id(id) {
            return;
        }
        let inner = &self.inner;
        {
            let _object = inner.object_lock(id).lock().await;
            if let Err(e) = inner.unlink(id).await {
                // Leaks space until the next sweep, serves nothing: no record names these bytes.
                tracing::warn!(content_id = id, error = %e, "could not remove invalidated cache bytes");
            }
        }
        // The records went with the write: the figures are the store's.
        if let Ok(usage) = inner.store.cache_usage(&inner.node).await {
            inner.counters.resident_bytes.store(usage.bytes, Ordering::Relaxed);
            inner.counters.resident_chunks.store(usage.chunks, Ordering::Relaxed);
        }
        inner.wake.notify_one();
    }

    /// The file holding every byte of `entry`'s current version, if the cache holds them all:
    /// what a FUSE mount beside the filer hands the kernel to read. Its bytes stay as they are
    /// for as long as anyone has it open (an object leaves the cache by its file being unlinked,
    /// never by bytes being taken out of it); `identity` lets the opener check that the file it
    /// opened is this one. Counts as a read of every chunk: the kernel's reads of it never reach
    /// the filer.
    pub async fn local_file(&self, entry: &Entry) -> Result<Option<tidemark_core::filer::LocalFile>> {
        let Some(id) = content_id(entry).filter(|_| self.enabled() && entry.size > 0) else { return Ok(None) };
        self.start();
        let inner = &self.inner;
        let _object = inner.object_lock(&id).lock().await;
        let held = inner.held(&entry.path, &id).await?;
        let n = chunks_of(entry.size, 0, None, inner.config.chunk_bytes).end;
        let all: HashSet<u64> = held.iter().map(|c| c.chunk).filter(|&k| k < n).collect();
        if all.len() as u64 != n {
            return Ok(None);
        }
        let file = inner.object_file(&id);
        let meta = match std::fs::metadata(&file) {
            Ok(m) if m.len() == entry.size => m,
            // Not whole after all (the records outlived the file: a crash before its directory
            // was synced): read through the filer, which fetches what is missing.
            _ => return Ok(None),
        };
        for c in &held {
            inner.note_read(&entry.path, c.chunk);
        }
        Ok(Some(tidemark_core::filer::LocalFile {
            file: file.to_string_lossy().into_owned(),
            version: entry.version,
            size: entry.size,
            identity: Some(FileIdentity::of(&meta)),
        }))
    }

    /// Waits until no fetch is in flight: every chunk a finished read fetched is then recorded
    /// (or known not to be). Reads hand out a chunk's bytes before they are durable, so a read
    /// returns without waiting for the cache's fsync.
    pub async fn idle(&self) {
        let busy = || {
            let flights = self.inner.flights.lock().unwrap_or_else(|p| p.into_inner());
            flights.values().any(|f| matches!(&*f.rx.borrow(), Flight::Fetching | Flight::Fetched(_)))
        };
        while busy() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Writes pending last-read times, enforces the budget and refreshes the resident figures
    /// (what housekeeping does every few seconds).
    pub async fn housekeep(&self) -> Result<()> {
        self.start();
        self.inner.housekeep().await
    }

    /// Removes cached files that no record names (left by a crash, or by another filer's
    /// invalidating write on a shared store); returns how many went.
    pub async fn sweep(&self) -> Result<u64> {
        self.start();
        self.inner.sweep().await
    }
}

/// For each chunk of `span`, where a run that starts there must stop: the next cached chunk,
/// or the span's end.
fn run_ends(span: std::ops::Range<u64>, present: &HashSet<u64>) -> Vec<u64> {
    let mut ends = vec![span.end; (span.end - span.start) as usize];
    let mut next = span.end;
    for k in span.clone().rev() {
        ends[(k - span.start) as usize] = next;
        if present.contains(&k) {
            next = k;
        }
    }
    ends
}

fn saturating_sub(a: &AtomicU64, n: u64) {
    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(v.saturating_sub(n)));
}

fn skip_reason(e: &Entry) -> &'static str {
    if e.is_dir() {
        "a directory"
    } else if e.remote.is_some() {
        "local changes not yet in the bucket (never cache)"
    } else {
        "local-only content (never cache)"
    }
}

/// The entry's object, found on the first miss only: a read served from the cache opens no
/// storage client and makes no remote call.
struct Source {
    remotes: Arc<Remotes>,
    store: Arc<dyn MetaStore>,
    entry: Entry,
    located: OnceCell<Located>,
}

impl Source {
    fn new(remotes: Arc<Remotes>, store: Arc<dyn MetaStore>, entry: Entry) -> Self {
        Source { remotes, store, entry, located: OnceCell::new() }
    }

    async fn located(&self) -> Result<&Located> {
        self.located.get_or_try_init(|| self.remotes.locate(self.store.as_ref(), &self.entry)).await
    }
}

impl Inner {
    /// Readies the cache for its first use: a record names its chunk by index, and an index
    /// means bytes `k * chunk size ..` of the object's file, so chunks cut at another size
    /// (`--cache-chunk-size` changed) or laid out otherwise (a cache from before one file per
    /// object) would be read from the wrong place. Those records are forgotten and their files
    /// removed, then the layout is written down (last: a crash in between forgets again at the
    /// next start). Every path to the records passes here first; concurrent callers wait for
    /// the one doing it.
    async fn ready(&self) -> Result<()> {
        if self.same_layout {
            return Ok(());
        }
        self.ready
            .get_or_try_init(|| async {
                let (mut forgotten, mut after) = (0u64, None);
                loop {
                    let page = self.next_records(&mut after).await?;
                    if page.is_empty() {
                        break;
                    }
                    forgotten += self.store.cache_forget(&page).await?.len() as u64;
                }
                let (dir, tmp, layout) = (self.dir.clone(), self.tmp.clone(), layout(&self.config));
                blocking(move || {
                    for shard in std::fs::read_dir(&dir).map_err(|e| io_err("listing", &dir, e))?.flatten() {
                        let name = shard.file_name();
                        if name.len() == 2 && shard.path().is_dir() {
                            std::fs::remove_dir_all(shard.path()).map_err(|e| io_err("removing", &shard.path(), e))?;
                        }
                    }
                    write_own_file(&dir, &tmp, LAYOUT_FILE, &layout)
                })
                .await?;
                if forgotten > 0 {
                    tracing::info!(
                        chunks = forgotten,
                        chunk_bytes = self.config.chunk_bytes,
                        "cache: forgot the chunks cut at another chunk size or laid out otherwise; they are fetched again as read"
                    );
                }
                Ok(())
            })
            .await
            .map(|_| ())
    }

    /// The next page of all this node's records, after the `(path, chunk)` cursor `after`, which
    /// it moves on; empty at the end.
    async fn next_records(&self, after: &mut Option<(String, u64)>) -> Result<Vec<CachedChunk>> {
        let page = self.store.cache_scan(&self.node, after.as_ref().map(|(p, k)| (p.as_str(), *k)), 1000).await?;
        if let Some(last) = page.last() {
            *after = Some((last.path.clone(), last.chunk));
        }
        Ok(page)
    }

    /// This node's records of content id `id` of `path`, in chunk order.
    async fn held(&self, path: &str, id: &str) -> Result<Vec<CachedChunk>> {
        self.ready().await?;
        let mut rows = self.store.cache_chunks(&self.node, path).await?;
        rows.retain(|c| c.content_id == id);
        Ok(rows)
    }

    /// The file of object `id`: its chunks at their offsets.
    fn object_file(&self, id: &str) -> PathBuf {
        self.dir.join(&id[..2]).join(id)
    }

    fn object_lock(&self, id: &str) -> &tokio::sync::Mutex<()> {
        let h = id.bytes().fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize));
        &self.object_locks[h % self.object_locks.len()]
    }

    /// Unlinks object `id`'s file (its records gone: the caller holds the object's lock).
    async fn unlink(&self, id: &str) -> Result<()> {
        self.unlinks.fetch_add(1, Ordering::SeqCst);
        let file = self.object_file(id);
        blocking(move || match std::fs::remove_file(&file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err("removing", &file, e)),
            _ => Ok(()),
        })
        .await
    }

    /// Takes object `id` of `path` out of the cache: its records, then its file. Its fetches
    /// kept as `Recorded` go too: a run stops at the first chunk in flight, so a read right
    /// after `remote.uncache` (or an eviction) would otherwise send one GET per chunk, each
    /// joining a flight whose file is gone (32 GETs for 256 MiB, 5 × slower).
    async fn evict(&self, path: &str, id: &str) -> Result<Vec<CachedChunk>> {
        let gone = {
            let _object = self.object_lock(id).lock().await;
            let rows = self.held(path, id).await?;
            let gone = self.store.cache_forget(&rows).await?;
            if valid_id(id) {
                self.unlink(id).await?;
            }
            gone
        };
        {
            let mut flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
            for c in &gone {
                let key = (c.content_id.clone(), c.chunk);
                if flights.get(&key).is_some_and(|f| matches!(&*f.rx.borrow(), Flight::Recorded(_))) {
                    flights.remove(&key);
                }
            }
        }
        let bytes: u64 = gone.iter().map(|c| c.len).sum();
        saturating_sub(&self.counters.resident_bytes, bytes);
        saturating_sub(&self.counters.resident_chunks, gone.len() as u64);
        Ok(gone)
    }

    /// Bytes `want` of chunk `k`: from the object's file when recorded (`cached`: the unlink
    /// count the records were read at) and still there, else fetched (by a run that may go on
    /// to `run_to`).
    #[allow(clippy::too_many_arguments)]
    async fn piece(
        self: &Arc<Self>,
        source: &Arc<Source>,
        entry: &Arc<Entry>,
        id: &Arc<String>,
        k: u64,
        want: std::ops::Range<u64>,
        cached: Option<u64>,
        run_to: u64,
    ) -> Result<Bytes> {
        if let Some(unlinks) = cached {
            match self.read_file(&entry.path, id, k, want.clone(), Some(unlinks)).await {
                Ok(b) => {
                    self.counters.hits.fetch_add(1, Ordering::Relaxed);
                    self.counters.bytes_served.fetch_add(b.len() as u64, Ordering::Relaxed);
                    self.note_read(&entry.path, k);
                    return Ok(b);
                }
                // Evicted or swept between the lookup and the open: a miss after all.
                Err(e) => {
                    tracing::debug!(path = %entry.path, chunk = k, error = %e, "cached chunk unreadable; fetching")
                }
            }
        }
        let bytes = self.flight(source, entry, id, k, run_to, false).await?;
        let (lo, hi) = (want.start as usize, (want.end as usize).min(bytes.len()));
        Ok(bytes.slice(lo.min(hi)..hi))
    }

    /// Joins the fetch of chunk `k` of `id`, starting one if none runs: a run that fills `k` and
    /// the chunks after it up to `run_to` (exclusive) or the first one already in flight, with one
    /// ranged GET. With `recorded`, waits until the bytes are in the cache too, and returns none
    /// of them once they are (the caller only waits: reading every chunk back from the disk
    /// would double what `remote.cache` reads).
    async fn flight(
        self: &Arc<Self>,
        source: &Arc<Source>,
        entry: &Arc<Entry>,
        id: &Arc<String>,
        k: u64,
        run_to: u64,
        recorded: bool,
    ) -> Result<Bytes> {
        let key = (id.to_string(), k);
        'join: loop {
            let (mut rx, run) = {
                let mut flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
                match flights.get(&key) {
                    Some(f) => (f.rx.clone(), f.run.clone()),
                    None => {
                        let mut end = k + 1;
                        while end < run_to && !flights.contains_key(&(id.to_string(), end)) {
                            end += 1;
                        }
                        let run = Arc::new(Run::new(k));
                        let mut senders = Vec::new();
                        let mut mine = None;
                        for j in k..end {
                            let (tx, rx) = watch::channel(Flight::Fetching);
                            if j == k {
                                mine = Some(rx.clone());
                            }
                            flights.insert((id.to_string(), j), FlightEntry { rx, run: run.clone() });
                            senders.push(tx);
                        }
                        let task = self.clone().fetch_run(senders, k, run.clone(), source.clone(), entry.clone(), None);
                        tokio::spawn(task);
                        match mine {
                            Some(rx) => (rx, run),
                            None => return Err(Error::internal("a run without its first chunk")),
                        }
                    }
                }
            };
            run.want(k);
            loop {
                match &*rx.borrow_and_update() {
                    Flight::Fetched(r) if !recorded => return r.clone(),
                    Flight::Done(r) => return r.clone(),
                    Flight::Recorded(_) if recorded => return Ok(Bytes::new()),
                    Flight::Recorded(Some(b)) => return Ok(b.clone()),
                    Flight::Recorded(None) => break,
                    // The run gave up before this chunk (nobody read that far in time, or an
                    // earlier chunk failed): start another.
                    Flight::Abandoned => continue 'join,
                    _ => {}
                }
                if rx.changed().await.is_err() {
                    self.forget_flight(&key, &rx);
                    continue 'join;
                }
            }
            // Recorded: read the file; if it is gone already (evicted), fetch again.
            let len = chunk_range(entry.size, k, self.config.chunk_bytes);
            match self.read_file(&entry.path, id, k, 0..len.end - len.start, None).await {
                Ok(b) => {
                    self.counters.read_back.fetch_add(1, Ordering::Relaxed);
                    return Ok(b);
                }
                Err(_) => self.forget_flight(&key, &rx),
            }
        }
    }

    /// Removes the flight of `key` if it is still the one `rx` follows.
    fn forget_flight(&self, key: &FlightKey, rx: &watch::Receiver<Flight>) {
        let mut flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
        if flights.get(key).is_some_and(|f| f.rx.same_channel(rx)) {
            flights.remove(key);
        }
    }

    /// Bytes `want` of recorded chunk `k`, from the object's file. `unlinks`: the unlink count
    /// when the caller read the records; if an object file was unlinked since (or the caller
    /// read none), the file opened may be a newer one at the same path, which need not hold the
    /// chunk (a hole reads as zeros): under the object's lock the chunk must still be recorded
    /// and the file at the path still the one opened.
    async fn read_file(
        &self,
        path: &str,
        id: &str,
        k: u64,
        want: std::ops::Range<u64>,
        unlinks: Option<u64>,
    ) -> Result<Bytes> {
        let file = self.object_file(id);
        let (lo, n) = (k * self.config.chunk_bytes + want.start, want.end - want.start);
        // Opened and read in one blocking call; whether it was the right file is known after.
        let (f, bytes) = {
            let file = file.clone();
            blocking(move || {
                use std::io::{Read, Seek};
                let mut f = std::fs::File::open(&file).map_err(|e| io_err("opening", &file, e))?;
                f.seek(std::io::SeekFrom::Start(lo)).map_err(|e| io_err("seeking", &file, e))?;
                // Into spare capacity: no zeroing of a buffer the read overwrites anyway.
                let mut buf = Vec::with_capacity(n as usize);
                (&mut f).take(n).read_to_end(&mut buf).map_err(|e| io_err("reading", &file, e))?;
                Ok((f, buf))
            })
            .await?
        };
        if unlinks != Some(self.unlinks.load(Ordering::SeqCst)) {
            let _object = self.object_lock(id).lock().await;
            let recorded = self.held(path, id).await?.iter().any(|c| c.chunk == k);
            if !recorded || !same_file(&f, &file) {
                return Err(Error::io(
                    format!("reading {}", file.display()),
                    std::io::Error::new(std::io::ErrorKind::NotFound, "the cached chunk went"),
                ));
            }
        }
        if bytes.len() as u64 != n {
            return Err(Error::io(
                format!("reading {}", file.display()),
                std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the cached chunk is short"),
            ));
        }
        Ok(Bytes::from(bytes))
    }

    /// One run: a conditional ranged GET of chunks `first..first + senders.len()`, cut into chunks
    /// as it streams. Each chunk goes to its waiting readers as soon as it is complete, then is
    /// made durable and recorded on its own. The run stays at most `RUN_AHEAD` chunks ahead of
    /// the furthest chunk a reader asked for, and gives up the rest when nobody asks for
    /// `RUN_IDLE` (a reader that stopped early does not fetch the whole object). Runs as its own
    /// task, so a reader going away does not cut the chunks it was waiting for.
    ///
    /// When its stream turns out slower than `SLOW_STREAM_BYTES_PER_S`, a long run keeps a
    /// [`split_chunks`] more and hands the rest to helper runs of that length (`open_helpers`),
    /// which fetch up to `PARALLEL_RUNS` runs' worth ahead of the reader, each with its own GET,
    /// and do not split. A helper holds its `opening` permit until its GET answers.
    async fn fetch_run(
        self: Arc<Self>,
        senders: Vec<watch::Sender<Flight>>,
        first: u64,
        run: Arc<Run>,
        source: Arc<Source>,
        entry: Arc<Entry>,
        opening: Option<tokio::sync::OwnedSemaphorePermit>,
    ) {
        let id = content_id(&entry).unwrap_or_default();
        let helper = opening.is_some();
        let ahead = if helper { run.split.load(Ordering::Relaxed) * PARALLEL_RUNS } else { RUN_AHEAD };
        let mut wanted = run.wanted.subscribe();
        let last = first + senders.len() as u64 - 1;
        let range = chunk_range(entry.size, first, self.config.chunk_bytes).start
            ..chunk_range(entry.size, last, self.config.chunk_bytes).end;
        // How long the GET itself took to answer (not the bucket's client being opened, once).
        let mut open_s = 0.0;
        let opened: Result<ByteStream> = async {
            let located = source.located().await.map_err(|e| Error::Unavailable {
                message: format!("{}: not cached here, and its bucket could not be opened: {e}", entry.path),
            })?;
            self.counters.requests.fetch_add(1, Ordering::Relaxed);
            let asked = Instant::now();
            // A run of the whole object asks for the whole object: no range for the store to
            // cut (moto copies the range out of the object first: 20–30 ms more before the
            // first byte of 256 MiB, 40–60 ms more in all).
            let whole = range.start == 0 && range.end == entry.size;
            let asked_range =
                (!whole).then(|| ByteRange { offset: range.start, length: Some(range.end - range.start) });
            let got = located.get(asked_range).await;
            open_s = asked.elapsed().as_secs_f64();
            got
        }
        .await;
        drop(opening);
        let mut senders: std::collections::VecDeque<_> = senders.into();
        let mut stream = match opened {
            Ok(s) => s,
            Err(e) => {
                if let Some(tx) = senders.pop_front() {
                    self.finish_failed(&id, first, tx, e);
                }
                self.abandon(&id, first + 1, senders.into_iter());
                return;
            }
        };
        // What a frame brought past the chunk before.
        let mut carry: Option<Bytes> = None;
        let mut k = first;
        // Bytes and seconds of the stream measured so far, and whether they were enough.
        let (mut measured, mut rated) = ((0u64, 0f64), false);
        while let Some(tx) = senders.pop_front() {
            let asked = tokio::time::timeout(RUN_IDLE, wanted.wait_for(|w| k <= w.saturating_add(ahead)))
                .await
                .is_ok_and(|r| r.is_ok());
            if !asked {
                self.abandon(&id, k, std::iter::once(tx).chain(senders));
                return;
            }
            // Held until the chunk is written (or given up): its bytes are in memory until then.
            let permit = self.fetch_permits.clone().acquire_owned().await.ok();
            let r = chunk_range(entry.size, k, self.config.chunk_bytes);
            let want = (r.end - r.start) as usize;
            // Only the time spent waiting on the bucket: not the waits for a reader above.
            let streaming = Instant::now();
            let mut chunk = ChunkBuf::with_capacity(want);
            while chunk.len() < want {
                let next = match carry.take() {
                    Some(part) => Some(Ok(part)),
                    None => stream.next().await,
                };
                match next {
                    Some(Ok(part)) => {
                        let n = (want - chunk.len()).min(part.len());
                        chunk.extend(&part[..n]);
                        if n < part.len() {
                            carry = Some(part.slice(n..));
                        }
                    }
                    Some(Err(e)) => {
                        let e = Error::Unavailable {
                            message: format!("{}: reading from the bucket failed mid-object: {e}", entry.path),
                        };
                        self.finish_failed(&id, k, tx, e);
                        self.abandon(&id, k + 1, senders.into_iter());
                        return;
                    }
                    None => {
                        let e = Error::Unavailable {
                            message: format!(
                                "{}: the bucket returned too few bytes for bytes {}..{} of a {}-byte object; it changed, run remote.meta.sync and read again",
                                entry.path, r.start, r.end, entry.size
                            ),
                        };
                        self.finish_failed(&id, k, tx, e);
                        self.abandon(&id, k + 1, senders.into_iter());
                        return;
                    }
                }
            }
            let took = streaming.elapsed().as_secs_f64();
            let chunk = chunk.finish();
            self.counters.misses.fetch_add(1, Ordering::Relaxed);
            self.counters.bytes_fetched.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            tx.send_replace(Flight::Fetched(Ok(ChunkBuf::shared(&chunk))));
            tokio::spawn(self.clone().keep(tx, entry.clone(), (id.clone(), k), chunk, permit, run.clone()));
            // The stream's rate, once enough bytes not to be noise: decided once per run.
            if !helper && !rated {
                measured.0 += want as u64;
                measured.1 += took;
                rated = measured.0 >= RATE_SAMPLE_BYTES;
                let rate = measured.0 as f64 / measured.1;
                let slow = rate < SLOW_STREAM_BYTES_PER_S;
                let split = split_chunks(open_s, rate, self.config.chunk_bytes);
                if rated && slow && senders.len() as u64 > split {
                    run.split.store(split, Ordering::Relaxed);
                    // This run keeps its connection for `split` more chunks.
                    let handed = senders.split_off(split as usize);
                    let mut from = k + 1 + senders.len() as u64;
                    tracing::debug!(path = %entry.path, chunk = k, mib_s = rate / 1048576.0, open_s, split,
                        "a slow stream: the rest of the run goes to parallel runs");
                    let mut handed = handed.into_iter().peekable();
                    let mut groups = Vec::new();
                    while handed.peek().is_some() {
                        let group: Vec<_> = handed.by_ref().take(split as usize).collect();
                        let n = group.len() as u64;
                        groups.push((from, group));
                        from += n;
                    }
                    tokio::spawn(self.clone().open_helpers(groups, run.clone(), source.clone(), entry.clone()));
                }
            }
            k += 1;
        }
    }

    /// Starts the helper runs of a split run, in the order of their chunks: each once the reader
    /// comes near it (no connection is opened sooner) and an `opening` permit is free. The runs
    /// not started when the reader stays away for `RUN_IDLE` are given up.
    async fn open_helpers(
        self: Arc<Self>,
        groups: Vec<(u64, Vec<watch::Sender<Flight>>)>,
        run: Arc<Run>,
        source: Arc<Source>,
        entry: Arc<Entry>,
    ) {
        let id = content_id(&entry).unwrap_or_default();
        let mut wanted = run.wanted.subscribe();
        let mut groups = groups.into_iter();
        while let Some((first, senders)) = groups.next() {
            let near = tokio::time::timeout(
                RUN_IDLE,
                wanted.wait_for(|w| first <= w.saturating_add(run.split.load(Ordering::Relaxed) * PARALLEL_RUNS)),
            )
            .await
            .is_ok_and(|r| r.is_ok());
            let permit = if near { run.opening.clone().acquire_owned().await.ok() } else { None };
            let Some(permit) = permit else {
                self.abandon(&id, first, senders.into_iter());
                for (first, senders) in groups {
                    self.abandon(&id, first, senders.into_iter());
                }
                return;
            };
            tokio::spawn(self.clone().helper_run(senders, first, run.clone(), source.clone(), entry.clone(), permit));
        }
    }

    /// A helper run of `fetch_run`, boxed: a future that spawns its own kind needs a named type
    /// to be `Send`.
    fn helper_run(
        self: Arc<Self>,
        senders: Vec<watch::Sender<Flight>>,
        first: u64,
        run: Arc<Run>,
        source: Arc<Source>,
        entry: Arc<Entry>,
        opening: tokio::sync::OwnedSemaphorePermit,
    ) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(self.fetch_run(senders, first, run, source, entry, Some(opening)))
    }

    /// Makes a fetched chunk durable and records it, then tells its readers.
    async fn keep(
        self: Arc<Self>,
        tx: watch::Sender<Flight>,
        entry: Arc<Entry>,
        key: FlightKey,
        chunk: Arc<ChunkBuf>,
        permit: Option<tokio::sync::OwnedSemaphorePermit>,
        run: Arc<Run>,
    ) {
        let recorded = match self.persist(&entry, &key.0, key.1, chunk.clone()).await {
            Ok(recorded) => recorded,
            Err(e) => {
                tracing::warn!(path = %entry.path, chunk = key.1, error = %e, "could not cache a chunk; served uncached");
                false
            }
        };
        drop(permit);
        if !recorded {
            self.forget_flight(&key, &tx.subscribe());
            tx.send_replace(Flight::Done(Ok(ChunkBuf::shared(&chunk))));
            return;
        }
        let since = Instant::now();
        // Taken once a reader asked for the chunk (a reader joins its flight before it asks)
        // and none waits on the flight any more (the flights' own receiver aside).
        let taken = || *run.wanted.borrow() >= key.1 && tx.receiver_count() <= 1;
        if let Some(_held) = (!taken()).then(|| self.held_permits.clone().try_acquire_owned().ok()).flatten() {
            tx.send_replace(Flight::Recorded(Some(ChunkBuf::shared(&chunk))));
            drop(chunk);
            while !taken() && since.elapsed() < HELD_FOR {
                tokio::time::sleep(HELD_CHECK).await;
            }
        }
        tx.send_replace(Flight::Recorded(None));
        tokio::time::sleep(RECORDED_GRACE.saturating_sub(since.elapsed())).await;
        self.forget_flight(&key, &tx.subscribe());
    }

    /// A chunk whose fetch failed: its readers get the error, and the log says it (a reader
    /// past its first bytes sees only its stream end early).
    fn finish_failed(&self, id: &str, k: u64, tx: watch::Sender<Flight>, e: Error) {
        tracing::warn!(chunk = k, error = %e, "a chunk's fetch from the bucket failed");
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        self.forget_flight(&(id.to_string(), k), &tx.subscribe());
        tx.send_replace(Flight::Done(Err(e)));
    }

    /// Chunks `from..` of a run that will not be fetched: their flights go first, so the readers
    /// told start afresh instead of joining them again.
    fn abandon(&self, id: &str, from: u64, senders: impl Iterator<Item = watch::Sender<Flight>>) {
        for (i, tx) in senders.enumerate() {
            self.forget_flight(&(id.to_string(), from + i as u64), &tx.subscribe());
            tx.send_replace(Flight::Abandoned);
        }
    }

    /// Write into the object's file and fsync, *then* record: a record only ever names durable
    /// bytes. The record is made under the object's lock and only if the file written is still
    /// the one at its path (the object may have been evicted or reclaimed meanwhile). `false`
    /// when it was not recorded (the entry moved on, or the file went); the file is removed if
    /// nothing else of it is recorded.
    async fn persist(&self, entry: &Entry, id: &str, k: u64, chunk: Arc<ChunkBuf>) -> Result<bool> {
        let file = self.object_file(id);
        let at = chunk_range(entry.size, k, self.config.chunk_bytes);
        let (f, size) = (file.clone(), entry.size);
        // At most `CHUNK_WRITERS` at once, across the filer.
        let written = {
            let _writing = self.write_permits.acquire().await.ok();
            blocking(move || write_chunk(&f, at.start, &chunk, size).map_err(|e| io_err("writing", &f, e))).await?
        };
        let _object = self.object_lock(id).lock().await;
        let f = file.clone();
        let here = blocking(move || Ok(std::fs::metadata(&f).ok().map(|m| FileIdentity::of(&m)))).await?;
        if here != Some(written) {
            return Ok(false);
        }
        let record = CachedChunk {
            node: self.node.clone(),
            path: entry.path.clone(),
            content_id: id.to_string(),
            chunk: k,
            len: at.end - at.start,
            last_read_ms: self.clock.now_ms(),
        };
        let recorded = self.store.cache_record(record.clone()).await;
        match recorded {
            Ok(true) => {
                let resident = self.counters.resident_bytes.fetch_add(record.len, Ordering::Relaxed) + record.len;
                self.counters.resident_chunks.fetch_add(1, Ordering::Relaxed);
                if resident > self.config.budget_bytes {
                    self.wake.notify_one();
                }
                Ok(true)
            }
            Ok(false) | Err(_) => {
                if self.held(&entry.path, id).await.is_ok_and(|rows| rows.is_empty()) {
                    let _ = self.unlink(id).await;
                }
                recorded
            }
        }
    }

    fn note_read(&self, path: &str, k: u64) {
        let now = self.clock.now_ms();
        self.reads.lock().unwrap_or_else(|p| p.into_inner()).insert((path.to_string(), k), now);
    }

    async fn housekeep(&self) -> Result<()> {
        self.ready().await?;
        let _one = self.housekeeping.lock().await;
        trim_chunk_bufs();
        let reads: Vec<(String, u64, i64)> = std::mem::take(&mut *self.reads.lock().unwrap_or_else(|p| p.into_inner()))
            .into_iter()
            .map(|((p, k), ms)| (p, k, ms))
            .collect();
        self.store.cache_touch(&self.node, &reads).await?;
        let mut usage = self.store.cache_usage(&self.node).await?;
        while usage.bytes > self.config.budget_bytes {
            let oldest = self.store.cache_lru(&self.node, EVICT_BATCH).await?;
            if oldest.is_empty() {
                break;
            }
            // Whole objects, in the order of their least recently read chunk, until under the
            // budget: bytes are never taken out of a file someone may have open (see the module
            // notes), so a chunk leaves with its object.
            let mut done: HashSet<&str> = HashSet::new();
            let mut any = false;
            for c in &oldest {
                if usage.bytes <= self.config.budget_bytes {
                    break;
                }
                if !done.insert(&c.content_id) {
                    continue;
                }
                let gone = self.evict(&c.path, &c.content_id).await?;
                let bytes: u64 = gone.iter().map(|c| c.len).sum();
                any |= !gone.is_empty();
                self.counters.evictions.fetch_add(gone.len() as u64, Ordering::Relaxed);
                self.counters.evicted_bytes.fetch_add(bytes, Ordering::Relaxed);
                usage.bytes = usage.bytes.saturating_sub(bytes);
                usage.chunks = usage.chunks.saturating_sub(gone.len() as u64);
            }
            if !any {
                // Raced with another forget; read the figures again.
                usage = self.store.cache_usage(&self.node).await?;
            }
        }
        self.counters.resident_bytes.store(usage.bytes, Ordering::Relaxed);
        self.counters.resident_chunks.store(usage.chunks, Ordering::Relaxed);
        Ok(())
    }

    async fn sweep(&self) -> Result<u64> {
        self.ready().await?;
        // The files first, then the records, then the fetches in flight: a file created after
        // the listing is not a candidate, and one whose first record commits after the records
        // were read still has its fetch in flight then (a fetch ends only after its record). A
        // fetch that starts after that and records a chunk before the file's turn comes wrote
        // the file after the sweep started: only files older than that go (under the object's
        // lock, which a record needs), or a record would name an unlinked file and a later one
        // at its name be read as holding its chunk.
        let started = std::time::SystemTime::now() - SWEEP_MARGIN;
        let dir = self.dir.clone();
        let on_disk: Vec<(String, PathBuf)> = blocking(move || {
            let mut out = Vec::new();
            let Ok(shards) = std::fs::read_dir(&dir) else { return Ok(out) };
            for shard in shards.flatten() {
                let name = shard.file_name().to_string_lossy().to_string();
                if name.len() != 2 || !shard.path().is_dir() {
                    continue;
                }
                for f in std::fs::read_dir(shard.path()).into_iter().flatten().flatten() {
                    // A name that is no content id is no cache file of ours either way.
                    out.push((f.file_name().to_string_lossy().to_string(), f.path()));
                }
            }
            Ok(out)
        })
        .await?;
        if on_disk.is_empty() {
            return Ok(0);
        }
        let mut recorded: HashSet<String> = HashSet::new();
        let mut after = None;
        loop {
            let page = self.next_records(&mut after).await?;
            if page.is_empty() {
                break;
            }
            recorded.extend(page.into_iter().map(|c| c.content_id));
        }
        let busy: HashSet<String> =
            self.flights.lock().unwrap_or_else(|p| p.into_inner()).keys().map(|(id, _)| id.clone()).collect();
        let mut removed = 0;
        for (id, p) in on_disk {
            if busy.contains(&id) || recorded.contains(&id) {
                continue;
            }
            if valid_id(&id) {
                let _object = self.object_lock(&id).lock().await;
                let old = std::fs::metadata(&p).and_then(|m| m.modified()).is_ok_and(|t| t < started);
                let fetching = self.flights.lock().unwrap_or_else(|p| p.into_inner()).keys().any(|(f, _)| *f == id);
                if old && !fetching && self.unlink(&id).await.is_ok() {
                    removed += 1;
                }
            } else if blocking(move || Ok(std::fs::remove_file(&p).or_else(|_| std::fs::remove_dir_all(&p)).is_ok()))
                .await?
            {
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// Writes one of the cache's own small files (`node-id`, `layout`) whole or not at all: under
/// `tmp` first, fsynced, renamed into `dir`, the directory fsynced.
fn write_own_file(dir: &Path, tmp: &Path, name: &str, contents: &str) -> Result<()> {
    let (part, file) = (tmp.join(name), dir.join(name));
    std::fs::File::create(&part)
        .and_then(|mut f| f.write_all(contents.as_bytes()).and_then(|()| f.sync_all()))
        .map_err(|e| io_err("writing", &part, e))?;
    std::fs::rename(&part, &file).map_err(|e| io_err("renaming", &file, e))?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_err("syncing", dir, e))
}

/// What `cache/layout` says of a cache laid out as this one is.
fn layout(config: &CacheConfig) -> String {
    format!("one file per object, chunks of {} bytes\n", config.chunk_bytes)
}

/// Whether `f` is the file at `path` now.
fn same_file(f: &std::fs::File, path: &Path) -> bool {
    match (f.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => FileIdentity::of(&a) == FileIdentity::of(&b),
        _ => false,
    }
}

/// The alignment `O_DIRECT` wants of a write's buffer, offset and length (a page: every
/// logical block size Linux file systems use divides it).
const DIRECT_ALIGN: usize = 4096;

/// Free chunk buffers kept for the next chunks, at most: as many as may wait for their write
/// (`MAX_FETCHES`) — a cold read of 256 MiB from moto had about 24 alive at once; keeping 8 left
/// the rest to be faulted in afresh by every read (the filer's and mount's CPU per read, median
/// 0.45 core-s against 0.37) — and no more bytes than that many default chunks (a larger
/// `--cache-chunk-size` keeps fewer). Housekeeping frees them when a round (15 s) passed
/// without a chunk (`trim_chunk_bufs`), so an idle filer does not keep them.
const POOLED_CHUNK_BUFS: usize = MAX_FETCHES;
const POOLED_CHUNK_BYTES: usize = MAX_FETCHES * (DEFAULT_CHUNK_BYTES as usize + 2 * DIRECT_ALIGN);

struct ChunkBufPool {
    free: Vec<Vec<u8>>,
    /// The bytes of `free`.
    bytes: usize,
    /// A buffer was taken since the last trim.
    used: bool,
}

static CHUNK_BUFS: Mutex<ChunkBufPool> = Mutex::new(ChunkBufPool { free: Vec::new(), bytes: 0, used: false });

/// Frees the pooled chunk buffers if none was taken since the last call.
fn trim_chunk_bufs() {
    let mut pool = CHUNK_BUFS.lock().unwrap_or_else(|p| p.into_inner());
    if !pool.used {
        pool.free = Vec::new();
        pool.bytes = 0;
    }
    pool.used = false;
}

/// A chunk's bytes, gathered as they arrive from the bucket into one page-aligned buffer with
/// room for the padding `O_DIRECT` wants: readers share it ([`ChunkBuf::shared`]), its file is
/// written straight from it, and the buffer goes back to a pool when the last reader is done.
/// Gathering each chunk into a fresh growing buffer and then copying it into an aligned one for
/// the write was a third of the filer's CPU in a cold read (`perf`, 256 MiB from moto: the
/// buffer's regrowth copies, the page faults and zeroing of its fresh pages, and the copy).
pub struct ChunkBuf {
    buf: Vec<u8>,
    /// Where the aligned window starts in `buf`, and its capacity (a multiple of a page).
    at: usize,
    cap: usize,
    len: usize,
}

impl ChunkBuf {
    /// An empty chunk of room for `n` bytes (and their padding to a page).
    pub fn with_capacity(n: usize) -> ChunkBuf {
        let cap = n.div_ceil(DIRECT_ALIGN).max(1) * DIRECT_ALIGN;
        let need = cap + DIRECT_ALIGN;
        let pooled = {
            let mut pool = CHUNK_BUFS.lock().unwrap_or_else(|p| p.into_inner());
            pool.used = true;
            let fit = pool.free.iter().position(|b| b.len() >= need);
            let buf = fit.map(|i| pool.free.swap_remove(i));
            pool.bytes -= buf.as_ref().map_or(0, Vec::len);
            buf
        };
        let buf = pooled.unwrap_or_else(|| fresh_buf(need));
        let at = buf.as_ptr().align_offset(DIRECT_ALIGN);
        ChunkBuf { buf, at, cap, len: 0 }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `b`, which must fit in the room asked for.
    pub fn extend(&mut self, b: &[u8]) {
        let to = self.len + b.len();
        assert!(to <= self.cap, "a chunk buffer of {} bytes given {to}", self.cap);
        self.buf[self.at + self.len..self.at + to].copy_from_slice(b);
        self.len = to;
    }

    /// Just past the bytes padded to a whole page, in `buf`: what an `O_DIRECT` write sends.
    fn padded_end(&self) -> usize {
        self.at + self.len.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN
    }

    /// The chunk, complete: its padding zeroed (a pooled buffer holds an earlier chunk's
    /// bytes), shared from here on.
    pub fn finish(mut self) -> Arc<ChunkBuf> {
        let (from, to) = (self.at + self.len, self.padded_end());
        self.buf[from..to].fill(0);
        Arc::new(self)
    }

    /// The chunk's bytes as a `Bytes` that keeps the buffer until it is dropped.
    pub fn shared(chunk: &Arc<ChunkBuf>) -> Bytes {
        struct Owner(Arc<ChunkBuf>);
        impl AsRef<[u8]> for Owner {
            fn as_ref(&self) -> &[u8] {
                <ChunkBuf as AsRef<[u8]>>::as_ref(&self.0)
            }
        }
        Bytes::from_owner(Owner(chunk.clone()))
    }
}

/// A new buffer of `n` bytes, its pages in place before the chunk is gathered into it. A cold
/// read in a fresh filer takes every chunk buffer new (the pool is empty), and faulting in their
/// pages one at a time as the bytes arrive cost about a fifth of that read's CPU (`perf stat` of
/// the filer and mount, 256 MiB from moto: 76,000–95,000 page faults, 0.60–0.68 core-s;
/// populated at once, 11,000–30,000 and 0.47–0.61, median 0.48: BENCHMARKS run O).
/// `MADV_POPULATE_WRITE` is Linux 5.14+; before, the pages fault in as they are written.
fn fresh_buf(n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    let at = buf.as_ptr().align_offset(DIRECT_ALIGN);
    let len = n.saturating_sub(at) / DIRECT_ALIGN * DIRECT_ALIGN;
    if len > 0 {
        // SAFETY: a page-aligned range within the vector's own allocation, which stays where it
        // is; the advice only makes its (zeroed) pages present.
        let _ = unsafe {
            rustix::mm::madvise(buf.as_mut_ptr().add(at).cast(), len, rustix::mm::Advice::LinuxPopulateWrite)
        };
    }
    buf
}

impl AsRef<[u8]> for ChunkBuf {
    fn as_ref(&self) -> &[u8] {
        &self.buf[self.at..self.at + self.len]
    }
}

impl Drop for ChunkBuf {
    fn drop(&mut self) {
        let mut pool = CHUNK_BUFS.lock().unwrap_or_else(|p| p.into_inner());
        if pool.free.len() < POOLED_CHUNK_BUFS && pool.bytes + self.buf.len() <= POOLED_CHUNK_BYTES {
            pool.bytes += self.buf.len();
            pool.free.push(std::mem::take(&mut self.buf));
        }
    }
}

/// Writes `bytes` at `offset` of the file at `p` (created if missing) and fsyncs it, as the
/// cache writes a chunk into its object's file (`write_chunk`, the object `size` bytes long),
/// from a copy in a chunk buffer.
pub fn write_durably(p: &Path, offset: u64, bytes: &[u8], size: u64) -> std::io::Result<()> {
    let mut chunk = ChunkBuf::with_capacity(bytes.len());
    chunk.extend(bytes);
    write_chunk(p, offset, &chunk.finish(), size).map(|_| ())
}

/// Writes a chunk at `offset` of its object's file at `p` (created if missing, sparse until
/// every chunk is in; `size`: the object's) and fsyncs it, and the directory if the file is
/// new; which file it wrote. With `O_DIRECT` where the file system takes it: the bytes go from
/// the chunk's aligned buffer to the disk, not through the page cache. A cold read writes every
/// byte it fetches, and the buffered write's copy into freshly allocated page-cache pages cost
/// it more CPU than anything else on its path (`perf`, 2 cores: 0.25 core-s per 256 MiB against
/// 0.02 with `O_DIRECT`; `dd` 0.38 s against 0.17 s). The page cache is filled by the reads
/// that come back instead (the FUSE mount and the clients keep their own copy of what they just
/// read). Buffered where `O_DIRECT` is refused (tmpfs before Linux 6.6, some network file
/// systems) or the offset is not aligned (a `--cache-chunk-size` that is no multiple of 4 KiB).
pub fn write_chunk(p: &Path, offset: u64, chunk: &ChunkBuf, size: u64) -> std::io::Result<FileIdentity> {
    use std::os::unix::fs::FileExt;
    let shard = p.parent().unwrap_or(Path::new("."));
    let new_shard = !shard.is_dir();
    if new_shard {
        std::fs::create_dir_all(shard)?;
    }
    let (f, created) = match std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(p) {
        Ok(f) => (f, true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            (std::fs::OpenOptions::new().read(true).write(true).open(p)?, false)
        }
        Err(e) => return Err(e),
    };
    // Whole pages from an aligned offset, and no page past the chunk but the object's end
    // (a short chunk's padding would overwrite the next chunk's bytes).
    let whole_pages = chunk.len.is_multiple_of(DIRECT_ALIGN) || offset + chunk.len as u64 >= size;
    let direct = offset.is_multiple_of(DIRECT_ALIGN as u64)
        && whole_pages
        && rustix::fs::fcntl_getfl(&f)
            .and_then(|fl| rustix::fs::fcntl_setfl(&f, fl | rustix::fs::OFlags::DIRECT))
            .is_ok();
    let written = if direct {
        // Whole pages: the last chunk's padding (zeroed by `finish`) lands past the object's
        // end and is cut off below.
        match f.write_all_at(&chunk.buf[chunk.at..chunk.padded_end()], offset) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                let _ = rustix::fs::fcntl_getfl(&f)
                    .and_then(|fl| rustix::fs::fcntl_setfl(&f, fl - rustix::fs::OFlags::DIRECT));
                f.write_all_at(chunk.as_ref(), offset)
            }
            r => r,
        }
    } else {
        f.write_all_at(chunk.as_ref(), offset)
    };
    written?;
    if offset + chunk.len as u64 >= size && f.metadata()?.len() > size {
        f.set_len(size)?;
    }
    f.sync_data()?;
    if created {
        std::fs::File::open(shard)?.sync_all()?;
        if new_shard && let Some(dir) = shard.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
    }
    Ok(FileIdentity::of(&f.metadata()?))
}

/// The sweep once at start, then last-read times and the budget every few seconds (or when a
/// record takes the cache past its budget). Holds the cache only while it works, so it ends
/// once the cache is dropped.
async fn housekeeping(weak: Weak<Inner>, wake: Arc<Notify>) {
    for round in 0u64.. {
        let Some(inner) = weak.upgrade() else { return };
        if round % SWEEP_EVERY_ROUNDS == 0 {
            match inner.sweep().await {
                Ok(0) => {}
                Ok(n) => {
                    tracing::info!(files = n, "cache: removed bytes no record names (left by a crash or another filer)")
                }
                Err(e) => tracing::warn!(error = %e, "cache: the sweep of unrecorded bytes failed"),
            }
        }
        if let Err(e) = inner.housekeep().await {
            tracing::warn!(error = %e, "cache: housekeeping failed");
        }
        drop(inner);
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(HOUSEKEEPING_EVERY) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Short runs for a bucket that answers at once, long ones for a store slow to start a GET,
    /// within bounds whatever is measured.
    #[test]
    fn a_slow_stream_is_split_into_runs_that_outlast_their_start() {
        let (mib, chunk) = (1024.0 * 1024.0, 8 << 20);
        assert_eq!(split_chunks(0.005, 100.0 * mib, chunk), MIN_SPLIT_CHUNKS);
        assert_eq!(split_chunks(0.13, 100.0 * mib, chunk), 7);
        assert_eq!(split_chunks(2.0, 100.0 * mib, chunk), MAX_SPLIT_CHUNKS);
        assert_eq!(split_chunks(0.0, f64::INFINITY, chunk), MAX_SPLIT_CHUNKS);
        assert_eq!(split_chunks(f64::NAN, 100.0 * mib, chunk), MAX_SPLIT_CHUNKS);
    }

    /// A chunk's readers keep its bytes after the fetch and the write let go of it, and a
    /// pooled buffer that held a longer chunk gives a shorter one only its own bytes.
    #[test]
    fn a_chunk_is_its_own_bytes_for_as_long_as_a_reader_holds_them() {
        let long: Vec<u8> = (0..(3 << 20) + 5).map(|i| (i % 253) as u8).collect();
        let mut c = ChunkBuf::with_capacity(long.len());
        for part in long.chunks(100_000) {
            c.extend(part);
        }
        let c = c.finish();
        let shared = ChunkBuf::shared(&c);
        drop(c);
        assert_eq!(shared, long, "the reader's bytes outlive the chunk's other holders");
        drop(shared);
        let mut short = ChunkBuf::with_capacity(10);
        short.extend(b"0123456789");
        let short = short.finish();
        assert_eq!(ChunkBuf::shared(&short), &b"0123456789"[..]);
        assert_eq!(short.padded_end() - short.at, DIRECT_ALIGN);
        assert!(short.buf[short.at + 10..short.padded_end()].iter().all(|&b| b == 0), "the padding is zeroed");
    }

    /// Chunks are written exactly at their offsets, whatever their length (`O_DIRECT` writes
    /// whole pages: the last chunk's padding must not stay), in any order, into a file that is
    /// sparse until they are all in, on this disk and on tmpfs (which kernels before 6.6 refuse
    /// `O_DIRECT` on: the buffered path); a chunk size that is no multiple of a page is written
    /// buffered. The longest first: the shorter ones then reuse its pooled buffer, which still
    /// holds its bytes.
    #[test]
    fn chunks_are_written_exactly_at_their_offsets_with_or_without_direct_io() {
        let disk = tempfile::tempdir().unwrap();
        let mut dirs = vec![disk.path().to_path_buf()];
        let shm = tempfile::tempdir_in("/dev/shm").ok();
        dirs.extend(shm.as_ref().map(|d| d.path().to_path_buf()));
        for dir in dirs {
            let cases = [
                ((8 << 20) + 7, 4 << 20),
                (1, 4096),
                (4095, 4096),
                (4096, 4096),
                (3 * 4096 + 1, 4096),
                (10_000, 3000),
                (4 * 4096 + 5, 2048),
            ];
            for (size, chunk) in cases {
                let bytes: Vec<u8> = (0..size).map(|i| (i * 7 + size + i / 4096) as u8).collect();
                let p = dir.join(format!("ab/object-{size}-{chunk}"));
                let chunks: Vec<(usize, &[u8])> =
                    bytes.chunks(chunk).enumerate().map(|(k, b)| (k * chunk, b)).collect();
                // From the back (a chunk's padding would land on the one after it), then the
                // last first and the rest from the front.
                let orders: [Vec<&(usize, &[u8])>; 2] = [
                    chunks.iter().rev().collect(),
                    chunks.last().into_iter().chain(chunks.iter().take(chunks.len() - 1)).collect(),
                ];
                for order in orders {
                    let _ = std::fs::remove_file(&p);
                    for &&(at, part) in &order {
                        write_durably(&p, at as u64, part, size as u64).unwrap();
                    }
                    let got = std::fs::read(&p).unwrap();
                    assert!(got == bytes, "{size} bytes in chunks of {chunk} in {}", dir.display());
                }
            }
        }
    }
}

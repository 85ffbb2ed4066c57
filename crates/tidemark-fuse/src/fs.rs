//! The FUSE operations, each a few calls on the filer's API.
//!
//! Reads stream from the filer (sequential reads of one handle share one ranged stream; the
//! filer serves remote-backed files from its content cache). Writes go to a spool file per open
//! handle and become one conditional-free `Filer::write` on flush, fsync or close: the file
//! appears to others whole, at close (close-to-open, as NFS), and the last close wins.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use futures::StreamExt;

use tidemark_core::model::{Content, EntryKind, INODES_DIR, NewEntry, Origin, Precondition, Txn, inode_path};
use tidemark_core::{ByteRange, ByteStream, DeleteOptions, Entry, Error, Filer, WriteOptions, path};

use crate::inodes::{Inodes, ROOT_INO};

/// What the mount counts, for `SIGUSR1` and the tests: how often it asked the filer.
#[derive(Debug, Default)]
pub struct Counters {
    pub lists: AtomicU64,
    pub stats: AtomicU64,
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub invalidations: AtomicU64,
    /// Opens the kernel reads from the filer's file directly (FUSE passthrough).
    pub passthrough: AtomicU64,
    /// Opens whose reads the mount answers from the filer's file (no passthrough: a
    /// read-write mount beside its filer).
    pub local: AtomicU64,
}

impl Counters {
    pub fn line(&self) -> String {
        format!(
            "filer calls: {} listings, {} stats, {} reads, {} writes; {} invalidations; {} passthrough opens, {} local opens",
            self.lists.load(Ordering::Relaxed),
            self.stats.load(Ordering::Relaxed),
            self.reads.load(Ordering::Relaxed),
            self.writes.load(Ordering::Relaxed),
            self.invalidations.load(Ordering::Relaxed),
            self.passthrough.load(Ordering::Relaxed),
            self.local.load(Ordering::Relaxed)
        )
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    pub read_only: bool,
    /// How long the kernel may keep attributes and names without asking (the change log
    /// invalidates them sooner when they change).
    pub ttl: Duration,
    /// The longest one filer call may take before the operation fails with EIO.
    pub timeout: Duration,
    /// Hand the kernel the filer's own file of a file opened read-only, when the mount runs on
    /// the filer's machine and the kernel offers FUSE passthrough (Linux 6.9 and later).
    pub passthrough: bool,
    /// Where a handle's bytes go when its last close cannot store them (the filer down or
    /// refusing): the close's error reaches no program (the kernel sends it after `close`
    /// returned), so without a copy they would be lost with the handle.
    pub unsaved_dir: std::path::PathBuf,
}

/// What a read at a fresh offset (not 0, not continuing the last one) fetches: one ranged read,
/// so that random access does not stream the file.
const BLOCK: u64 = 4 << 20;
/// Recent bytes a reader keeps: the kernel sends its read-ahead requests out of order, on
/// several threads.
const WINDOW: u64 = 16 << 20;
/// How far past what it has a read may land and still continue the stream (the skipped bytes
/// are read and dropped) rather than start a new one.
const SKIP: u64 = 8 << 20;
/// The batches of frames a stream holds ahead of the reader, and the bytes in one: the task
/// that reads the filer's stream stays at most this far ahead. Frames are kept as they came
/// (no copy into pieces: a fresh buffer per piece cost its page faults and zeroing, a sixth of
/// the mount's CPU in a cold read) and a read's answer is gathered from them once, into a
/// buffer its FUSE thread reuses (`GATHERED`).
const BATCHES_AHEAD: usize = 16;
const BATCH: usize = 1 << 20;

/// How the kernel does a handle's I/O: FUSE requests through its page cache, the backing file
/// directly (passthrough), or FUSE requests past the page cache on an inode passed through
/// (direct I/O). The kernel holds one mode per inode at a time: while an inode has a backing
/// file, every open of it names that same file (direct I/O overrides it for reads and writes),
/// and none may use the page cache; while page-cache handles are open, none is passed through.
/// So the mount counts the handles of each mode per inode. A handle opened on a passed inode
/// for a version newer than its backing file's (before the kernel learnt the new inode) uses
/// direct I/O.
///
/// Passthrough is for read-only mounts only. In a read-write mount a write open of an inode
/// being passed through would have to name the backing file too, and the kernel reopens it with
/// the writer's flags and maps it for the writer's `mmap` whatever the open's flags: a shared
/// writable map would write into the filer's file, which is never to be written twice (tried on
/// Linux 6.18, 2026-12-06: it did).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Io {
    Requests,
    Passthrough,
    Direct,
}

/// A file of the filer's that holds a version's bytes, and whether it is the content cache's
/// (which may take it out, and make another at the same name, at any time).
struct Local {
    file: tidemark_core::filer::LocalFile,
    cached: bool,
}

impl Local {
    /// Opens the file, if it is the one the filer named: `None` if a cached object's file went
    /// or is another one now; an error if a blob is missing or not as named (the filer's files
    /// are not on this machine, or not reachable from here).
    fn open(&self) -> std::io::Result<Option<std::fs::File>> {
        let f = &self.file;
        let file = match std::fs::File::open(&f.file) {
            // Gone from the cache since the filer named it, if its directory is here (the
            // cache keeps its directories); not here at all on another machine than the filer.
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && self.cached
                    && std::path::Path::new(&f.file).parent().is_some_and(|d| d.is_dir()) =>
            {
                return Ok(None);
            }
            r => r?,
        };
        let m = file.metadata()?;
        let named = m.len() == f.size && f.identity.is_none_or(|id| id == tidemark_core::filer::FileIdentity::of(&m));
        match (named, self.cached) {
            (true, _) => Ok(Some(file)),
            (false, true) => Ok(None),
            (false, false) => Err(std::io::Error::other(format!("{} is not the file the filer named", f.file))),
        }
    }
}

/// An inode the kernel reads from a file of the filer's, the version that file holds, and how
/// many handles are open on it (passed through or direct).
struct Passed {
    backing: fuser::BackingId,
    version: u64,
    handles: usize,
}

/// Per inode, the handles of each I/O mode.
#[derive(Default)]
struct IoModes {
    passed: HashMap<u64, Passed>,
    requests: HashMap<u64, usize>,
    /// Of the handles in `requests`, those that read the filer's file themselves.
    local: HashMap<u64, usize>,
}

impl IoModes {
    /// The mode of a handle of `ino` that does not read the backing file: direct I/O while the
    /// inode is passed through, the page cache (counted, so that no open passes the inode
    /// through meanwhile) otherwise.
    fn not_passed(&mut self, ino: u64) -> Io {
        if let Some(p) = self.passed.get_mut(&ino) {
            p.handles += 1;
            return Io::Direct;
        }
        *self.requests.entry(ino).or_default() += 1;
        Io::Requests
    }

    /// How to answer the open of a handle of mode `io` on `ino`: the backing file to name, and
    /// the flags.
    fn reply_flags(&self, ino: u64, io: Io, write: bool) -> (Option<&fuser::BackingId>, FopenFlags) {
        match (io, self.passed.get(&ino)) {
            (Io::Passthrough, Some(p)) => (Some(&p.backing), FopenFlags::empty()),
            (Io::Direct, Some(p)) => (Some(&p.backing), FopenFlags::FOPEN_DIRECT_IO),
            // A read-only open keeps the kernel's pages: the change log drops them when the
            // file changes.
            _ if write => (None, FopenFlags::empty()),
            _ => (None, FopenFlags::FOPEN_KEEP_CACHE),
        }
    }
}

struct Handle {
    path: String,
    /// The inode and how the kernel does its I/O (counted in [`IoModes`] until release).
    ino: u64,
    io: Io,
    /// Bytes written through this handle, uploaded at flush/fsync/close.
    spool: Option<std::fs::File>,
    dirty: bool,
    /// Bytes read through this handle from the filer.
    reader: Option<Reader>,
    /// A read of this handle, resumed, found the file changed since it began: the handle's
    /// reads fail from then on (the kernel retries a failed read, and another stream would go
    /// on with the new version's bytes after the old one's).
    changed: Arc<AtomicBool>,
    /// The filer's file of the version opened, on this machine: read directly (the mount
    /// beside its filer, the kernel's requests answered without the filer's API).
    local: Option<std::fs::File>,
    /// The name was unlinked (or replaced by a rename) while open: the handle keeps the bytes
    /// in its spool until it closes, and writes through it go nowhere, as with an unlinked
    /// inode. Holds the inode number and the entry as they were, for `fstat`.
    unlinked: Option<(u64, Entry)>,
    /// Opened for writing over an object the S3 gateway stored encrypted: nothing may be
    /// written until it is truncated to nothing (a partial overwrite would store ciphertext and
    /// plaintext mixed as if they were the object).
    sealed: bool,
}

impl Handle {
    fn new(path: String, spool: Option<std::fs::File>) -> Handle {
        Handle {
            path,
            ino: 0,
            io: Io::Requests,
            spool,
            dirty: false,
            reader: None,
            changed: Arc::default(),
            local: None,
            unlinked: None,
            sealed: false,
        }
    }
}

/// Whether `e` is an object the S3 gateway stored encrypted (its bytes here are ciphertext).
fn is_sealed(e: &Entry) -> bool {
    e.extended.contains_key(tidemark_core::model::object_attrs::SSE)
}

/// A handle's reads from the filer: a window of recent bytes and, once reads continue where
/// the last one ended, one stream to the end of the file that a task reads ahead of the
/// reader. A whole-file read (`cat`, `cp`, `rsync`) is thus one ranged read of the filer (and
/// one GET of the bucket when the filer's cache misses), not one per block.
#[derive(Default)]
struct Reader {
    /// Recent bytes, contiguous, oldest first.
    window: std::collections::VecDeque<Bytes>,
    /// The file offset of the window's first byte, and just past its last.
    start: u64,
    end: u64,
    /// The stream from `end` on; `None` while the reader holds one block.
    stream: Option<Stream>,
}

/// The frames of a stream from the filer, in batches, and the task that reads them ahead
/// (stopped when the stream is dropped).
struct Stream {
    rx: tokio::sync::mpsc::Receiver<Result<Vec<Bytes>, Errno>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Reader {
    fn held(&self) -> u64 {
        self.end - self.start
    }

    fn push(&mut self, b: Bytes, keep_from: u64) {
        self.end += b.len() as u64;
        self.window.push_back(b);
        // Old bytes go, but never those the read in hand still needs.
        while self.held() > WINDOW {
            let first = self.window.front().map_or(0, |f| f.len() as u64);
            if self.start + first > keep_from {
                break;
            }
            self.window.pop_front();
            self.start += first;
        }
    }

    /// Bytes `from..to` of what it holds: a slice of one frame where they lie in one, else
    /// gathered from the frames they span into `GATHERED`.
    fn bytes(&self, from: u64, to: u64) -> Answer {
        let mut at = self.start;
        let mut gathering = false;
        for b in &self.window {
            let (lo, hi) = (at, at + b.len() as u64);
            if hi > from && lo < to {
                let part = (from.max(lo) - lo) as usize..(to.min(hi) - lo) as usize;
                if !gathering && lo <= from && to <= hi {
                    return Answer::Slice(b.slice(part));
                }
                GATHERED.with_borrow_mut(|g| {
                    if !gathering {
                        g.clear();
                    }
                    g.extend_from_slice(&b[part]);
                });
                gathering = true;
            }
            at = hi;
            if at >= to {
                break;
            }
        }
        if gathering { Answer::Gathered } else { Answer::Slice(Bytes::new()) }
    }
}

/// A read's answer: bytes of their own, or gathered into this FUSE thread's `GATHERED`.
enum Answer {
    Slice(Bytes),
    Gathered,
}

thread_local! {
    /// Where a FUSE thread gathers a read's answer (from several frames, or from a file on
    /// this machine): reused, so its pages are faulted in once, not for every read.
    static GATHERED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

pub struct TidemarkFs {
    filer: Arc<dyn Filer>,
    rt: tokio::runtime::Handle,
    pub(crate) inodes: Arc<Mutex<Inodes>>,
    handles: Mutex<HashMap<u64, Arc<Mutex<Handle>>>>,
    next_fh: AtomicU64,
    opts: Options,
    pub(crate) counters: Arc<Counters>,
    uid: u32,
    gid: u32,
    io: Mutex<IoModes>,
    /// Passthrough is on: asked for, offered by the kernel, and not yet found impossible (the
    /// filer's files not reachable from here, or the kernel refusing a backing file).
    passthrough: AtomicBool,
    /// Reads of the filer's files from here are on: asked for (as passthrough is), and not yet
    /// found impossible (the mount is on another machine).
    local_reads: AtomicBool,
    /// The filer names files for its blobs: not when it keeps them on an object store (its
    /// content cache's files it names still).
    blob_files: AtomicBool,
}

fn errno(e: &Error) -> Errno {
    match e {
        Error::NotFound { .. } => Errno::ENOENT,
        Error::NotADirectory { .. } => Errno::ENOTDIR,
        Error::IsADirectory { .. } => Errno::EISDIR,
        Error::DirectoryNotEmpty { .. } => Errno::ENOTEMPTY,
        Error::CrossMount { .. } => Errno::EXDEV,
        Error::InvalidPath { .. } | Error::InvalidArgument { .. } | Error::RangeNotSatisfiable { .. } => Errno::EINVAL,
        Error::Unauthorized { .. } => Errno::EACCES,
        // "No data available": the bytes are in the bucket's archive until restored.
        Error::Archived { .. } => Errno::ENODATA,
        Error::TooLarge { .. } => Errno::EFBIG,
        _ => Errno::EIO,
    }
}

/// User extended attributes (`user.*`) are kept among the entry's extended attributes under this
/// prefix, their values in base64: an xattr's value is bytes, the entry's attributes are text.
/// The filer's limit on an entry's extended attributes (8 KiB in all) bounds them.
const XATTR_PREFIX: &str = "xattr.";
const MAX_EXTENDED_BYTES: usize = 8 * 1024;

/// Where the value of xattr `name` is kept; ENOTSUP for the namespaces the mount does not keep
/// (security, system, trusted: the kernel's and root's, which a file system on a bucket cannot
/// honour), ERANGE for a name longer than Linux allows.
fn xattr_key(name: &OsStr) -> Result<String, Errno> {
    let n = name.to_str().ok_or(Errno::EOPNOTSUPP)?;
    if !n.starts_with("user.") || n.len() == "user.".len() {
        return Err(Errno::EOPNOTSUPP);
    }
    if n.len() > 255 {
        return Err(Errno::ERANGE);
    }
    Ok(format!("{XATTR_PREFIX}{n}"))
}

fn reply_xattr(reply: ReplyXattr, size: u32, data: Result<Vec<u8>, Errno>) {
    match data {
        Ok(d) if size == 0 => reply.size(d.len() as u32),
        Ok(d) if d.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(d) => reply.data(&d),
        Err(e) => reply.error(e),
    }
}

/// The MD5 of no bytes: what the filer records for an empty file it writes.
const EMPTY_MD5: &str = "d41d8cd98f00b204e9800998ecf8427e";

/// An empty file as the filer writes one (with the MD5 of no bytes).
fn empty_file() -> NewEntry {
    let mut n = NewEntry::file(0, ms_of(SystemTime::now()), Content::Empty);
    n.extended.insert(tidemark_core::model::MD5_ATTR.into(), EMPTY_MD5.into());
    n
}

fn file_type(k: EntryKind) -> FileType {
    match k {
        EntryKind::File => FileType::RegularFile,
        EntryKind::Dir => FileType::Directory,
        EntryKind::Symlink => FileType::Symlink,
        EntryKind::Fifo => FileType::NamedPipe,
        EntryKind::Socket => FileType::Socket,
        EntryKind::CharDevice => FileType::CharDevice,
        EntryKind::BlockDevice => FileType::BlockDevice,
    }
}

fn time_of(ms: i64) -> SystemTime {
    if ms >= 0 { UNIX_EPOCH + Duration::from_millis(ms as u64) } else { UNIX_EPOCH }
}

fn ms_of(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn name_of(name: &OsStr) -> Result<&str, Errno> {
    let n = name.to_str().ok_or(Errno::EINVAL)?;
    match path::segment_problem(n) {
        None => Ok(n),
        Some(_) if n.len() > path::MAX_NAME_BYTES => Err(Errno::ENAMETOOLONG),
        Some(_) => Err(Errno::EINVAL),
    }
}

impl TidemarkFs {
    pub fn new(filer: Arc<dyn Filer>, rt: tokio::runtime::Handle, root: &str, opts: Options) -> Self {
        TidemarkFs {
            filer,
            rt,
            inodes: Arc::new(Mutex::new(Inodes::new(root))),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            counters: Arc::new(Counters::default()),
            uid: unsafe { libc::getuid() },
            gid: unsafe { libc::getgid() },
            io: Mutex::new(IoModes::default()),
            passthrough: AtomicBool::new(false),
            local_reads: AtomicBool::new(opts.passthrough),
            blob_files: AtomicBool::new(true),
            opts,
        }
    }

    fn io(&self) -> std::sync::MutexGuard<'_, IoModes> {
        self.io.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops passing files through for the rest of the session, saying why once.
    fn no_passthrough(&self, why: &str) {
        if self.passthrough.swap(false, Ordering::Relaxed) {
            tracing::info!("FUSE passthrough off: {why}; reads go through the mount");
        }
    }

    /// Whether the kernel may read a file opened read-only from the filer's file itself: a
    /// read-only mount (see [`Io`]), passthrough on.
    fn can_pass(&self) -> bool {
        self.opts.read_only && self.passthrough.load(Ordering::Relaxed)
    }

    /// The filer's file holding the bytes of `e`, if the kernel or the mount can read them from
    /// it: a blob, or a remote-backed file the filer's cache holds whole.
    fn local_file(&self, e: &Entry) -> Option<Local> {
        if !(self.can_pass() || self.local_reads.load(Ordering::Relaxed)) {
            return None;
        }
        if matches!(e.content, Content::Remote) {
            // Small ones as small local files are (inline): one read through the filer answers
            // them, where asking for the file would cost a call at every open.
            if e.size <= tidemark_core::model::MAX_INLINE_BYTES as u64 {
                return None;
            }
            // Named only while the cache holds it whole; otherwise read through the filer, which
            // fetches what is missing.
            let f = self.call("local file", self.filer.local_file(&e.path)).ok()??;
            return (f.version == e.version && f.size == e.size).then_some(Local { file: f, cached: true });
        }
        if !matches!(e.content, Content::Blob { .. }) || !self.blob_files.load(Ordering::Relaxed) {
            return None;
        }
        let Some(f) = self.call("local file", self.filer.local_file(&e.path)).ok()? else {
            // A blob-backed file the filer has no file of: it keeps its blobs on an object
            // store (or predates the call). No use asking at every open. (A file deleted just
            // now answers so too: this session then reads through the API, which is only slower.)
            if self.blob_files.swap(false, Ordering::Relaxed) {
                tracing::info!(
                    "the filer names no files for its blobs (they are on an object store): those read through its API"
                );
            }
            return None;
        };
        // Only the version opened: a newer one is read through the mount as any other change.
        (f.version == e.version && f.size == e.size).then_some(Local { file: f, cached: false })
    }

    /// Gives handle `h` of inode `ino` its I/O mode: passed through to the filer's file `local`
    /// (or to the file the inode's open handles already read, if it holds the same version: the
    /// kernel wants one per inode — a version written since gets an inode of its own, see
    /// `Inodes::changed`), else FUSE requests: past the page cache while the inode is passed
    /// through (a newer version opened before the kernel learnt its new inode), through it
    /// otherwise. `true` if passed through.
    fn choose_io(&self, h: &mut Handle, ino: u64, local: Option<Local>, reply: &ReplyOpen) -> bool {
        h.ino = ino;
        let mut modes = self.io();
        if let Some(p) = modes.passed.get_mut(&ino)
            && local.as_ref().is_some_and(|f| f.file.version == p.version)
        {
            p.handles += 1;
            h.io = Io::Passthrough;
            return true;
        }
        if !modes.passed.contains_key(&ino)
            && let Some(f) = local.as_ref().filter(|_| self.can_pass() && !modes.requests.contains_key(&ino))
        {
            match f.open().map(|file| file.map(|file| reply.open_backing(&file))) {
                // Not the file the filer named (a cached object's, taken out and made again
                // since): read through the mount.
                Ok(None) => {}
                Ok(Some(Ok(backing))) => {
                    modes.passed.insert(ino, Passed { backing, version: f.file.version, handles: 1 });
                    self.inodes().passed(ino, true);
                    h.io = Io::Passthrough;
                    return true;
                }
                Ok(Some(Err(e))) => self.no_passthrough(&format!("the kernel refused a backing file ({e})")),
                Err(e) => self.no_passthrough(&format!("the filer's files are not reachable from here ({e})")),
            }
        }
        if let Some(f) = local.filter(|_| self.local_reads.load(Ordering::Relaxed)) {
            match f.open() {
                // The file the filer named, whole (a path that exists on another machine by
                // chance would not be this file, nor was it named to this mount).
                Ok(Some(file)) => {
                    h.local = Some(file);
                    self.counters.local.fetch_add(1, Ordering::Relaxed);
                    *modes.local.entry(ino).or_default() += 1;
                    // Read as the version opened: a new version needs an inode of its own, as
                    // for passthrough, so that the kernel's pages of the two never mix.
                    self.inodes().passed(ino, true);
                }
                // A cached object's file, taken out since the filer named it.
                Ok(None) => {}
                Err(e) => self.no_local_reads(&format!("the filer's files are not reachable from here ({e})")),
            }
        }
        h.io = modes.not_passed(ino);
        false
    }

    /// Stops reading the filer's files from here for the rest of the session, saying why once.
    fn no_local_reads(&self, why: &str) {
        if self.local_reads.swap(false, Ordering::Relaxed) {
            tracing::info!("reads of the filer's files from here off: {why}; reads go through the filer's API");
        }
    }

    /// A closed handle's I/O mode is counted no more; the last handle of an inode passed
    /// through releases its backing file. An inode read from the filer's files no more (through
    /// the kernel or by the mount) keeps its number when the file changes.
    fn release_io(&self, h: &Handle) {
        let mut modes = self.io();
        fn drop_one(counts: &mut HashMap<u64, usize>, ino: u64) {
            if let Some(n) = counts.get_mut(&ino) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(&ino);
                }
            }
        }
        match h.io {
            Io::Passthrough | Io::Direct => {
                if let Some(p) = modes.passed.get_mut(&h.ino) {
                    p.handles -= 1;
                    if p.handles == 0 {
                        modes.passed.remove(&h.ino);
                    }
                }
            }
            Io::Requests => drop_one(&mut modes.requests, h.ino),
        }
        if h.local.is_some() {
            drop_one(&mut modes.local, h.ino);
        }
        if !modes.passed.contains_key(&h.ino) && !modes.local.contains_key(&h.ino) {
            self.inodes().passed(h.ino, false);
        }
    }

    /// Runs one filer call on the runtime, within the timeout.
    fn call<T>(&self, what: &str, f: impl std::future::Future<Output = tidemark_core::Result<T>>) -> Result<T, Errno> {
        self.call_or(what, f, Errno::EAGAIN)
    }

    /// [`Self::call`], with what a failed precondition means to this operation (`EEXIST` for a
    /// create, `EAGAIN` when the entry changed meanwhile).
    fn call_or<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = tidemark_core::Result<T>>,
        precondition_failed: Errno,
    ) -> Result<T, Errno> {
        self.call_within(what, f, precondition_failed, &Progress::default())
    }

    /// [`Self::call_or`] for a call that sends a body (counted by `progress`): it may take as
    /// long as the body takes, but fails with EIO once the filer has taken none of the body,
    /// nor answered, for the timeout. (A whole-call deadline failed every upload longer than
    /// the timeout — a large file on a slow link, or a slow filer — at close, and its bytes
    /// were lost with the handle.) A call without a body has no progress: the timeout is its
    /// deadline.
    fn call_within<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = tidemark_core::Result<T>>,
        precondition_failed: Errno,
        progress: &Progress,
    ) -> Result<T, Errno> {
        let timeout = self.opts.timeout;
        let answered = self.rt.block_on(async {
            tokio::pin!(f);
            loop {
                tokio::select! {
                    r = &mut f => return Some(r),
                    _ = tokio::time::sleep_until((progress.last() + timeout).into()) => {
                        if progress.last() + timeout <= std::time::Instant::now() {
                            return None;
                        }
                    }
                }
            }
        });
        match answered {
            Some(Ok(v)) => Ok(v),
            Some(Err(Error::PreconditionFailed { .. })) => Err(precondition_failed),
            Some(Err(e)) => {
                if errno(&e) == Errno::EIO {
                    tracing::warn!(error = %e, "{what} failed");
                }
                Err(errno(&e))
            }
            None => {
                tracing::warn!("{what}: the filer did not answer within {timeout:?}");
                Err(Errno::EIO)
            }
        }
    }

    fn inodes(&self) -> std::sync::MutexGuard<'_, Inodes> {
        self.inodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn path_of(&self, ino: INodeNo) -> Result<String, Errno> {
        self.inodes().path(ino.0).map(str::to_string).ok_or(Errno::ENOENT)
    }

    fn attr(&self, e: &Entry) -> FileAttr {
        let ino = self.inodes().ino(&e.path);
        let dir = e.is_dir();
        let t = time_of(e.mtime_ms);
        FileAttr {
            ino: INodeNo(ino),
            size: match (&e.posix.target, e.kind) {
                (Some(t), EntryKind::Symlink) => t.len() as u64,
                _ if dir => 0,
                _ => e.size,
            },
            blocks: if e.kind == EntryKind::File { e.size.div_ceil(512) } else { 0 },
            atime: time_of(e.posix.atime_ms.unwrap_or(e.mtime_ms)),
            mtime: t,
            ctime: time_of(e.posix.ctime_ms.unwrap_or(e.mtime_ms)),
            crtime: t,
            kind: file_type(e.kind),
            perm: (e.mode & 0o7777) as u16,
            nlink: if dir { 2 } else { e.posix.nlink.unwrap_or(1) },
            // Entries written elsewhere (the bucket, the gateway, the shell) have no owner of
            // their own: the mounting user's.
            uid: e.posix.uid.unwrap_or(self.uid),
            gid: e.posix.gid.unwrap_or(self.gid),
            rdev: e.posix.rdev as u32,
            blksize: 4096,
            flags: 0,
        }
    }

    /// The owner and group of an entry `req` creates in `parent`, and the mode bits it inherits:
    /// the group of a set-group-ID directory, and for a directory its set-group-ID bit too.
    fn owner_in(&self, req: &Request, parent: INodeNo, dir: bool) -> Result<(u32, u32, u32), Errno> {
        let p = self.path_of(parent)?;
        let pe = self.stat(&p)?;
        if pe.mode & libc::S_ISGID != 0 {
            let gid = pe.posix.gid.unwrap_or(self.gid);
            return Ok((req.uid(), gid, if dir { libc::S_ISGID } else { 0 }));
        }
        Ok((req.uid(), req.gid(), 0))
    }

    /// The entry of `p`: remembered, or read from the filer.
    fn stat(&self, p: &str) -> Result<Entry, Errno> {
        if let Some(e) = self.inodes().entry(p) {
            return Ok(e.clone());
        }
        self.counters.stats.fetch_add(1, Ordering::Relaxed);
        let epoch = self.inodes().epoch();
        let mut e = self.call("stat", self.filer.stat(p))?.ok_or(Errno::ENOENT)?;
        // A name of a hard-linked file is the file: its inode entry, one inode number for every
        // name, and every operation on it goes to that entry. (A name is asked for each time.)
        if let Some(id) = e.posix.inode.take() {
            e.path = inode_path(id);
        }
        self.inodes().remember_since(e.clone(), epoch);
        Ok(e)
    }

    /// An open handle with unflushed writes knows a file's size better than the filer: the one
    /// asking (`fh`), or the handles open on the file (a stat or lookup by name while it is
    /// written — the kernel takes the size of the answer: a file written at a large offset must
    /// not read as empty). Handles busy (uploading) are not waited for: they are about to tell
    /// the filer.
    fn unflushed_size(&self, e: &mut Entry, fh: Option<FileHandle>) {
        let written =
            |h: &Handle| h.spool.as_ref().filter(|_| h.dirty).and_then(|s| s.metadata().ok()).map(|m| m.len());
        if let Some(h) = fh.and_then(|fh| self.handle(fh).ok()) {
            if let Some(len) = written(&h.lock().unwrap_or_else(|p| p.into_inner())) {
                e.size = len;
            }
            return;
        }
        // Several handles may write the file, each its own copy until it closes: by name, the
        // largest size any of them (or the filer) has.
        for h in self.handles.lock().unwrap_or_else(|p| p.into_inner()).values() {
            if let Ok(h) = h.try_lock()
                && h.path == e.path
                && let Some(len) = written(&h)
            {
                e.size = e.size.max(len);
            }
        }
    }

    /// Before the name `p` (whose entry is `e`) goes, by an unlink or a rename over it: the
    /// handles open on its file keep its bytes if this is its last name.
    fn last_name_going(&self, e: &Entry) -> Vec<Arc<Mutex<Handle>>> {
        if e.is_dir() || e.posix.nlink.unwrap_or(1) > 1 { Vec::new() } else { self.keep_open_bytes(&e.path) }
    }

    /// The names in `dir` and their kinds (what `readdir` tells, so that `find -type` and
    /// `ls --color` need no stat of each).
    fn listing(&self, dir: &str) -> Result<Vec<(String, EntryKind)>, Errno> {
        if let Some(l) = self.inodes().listing(dir) {
            return Ok(l.to_vec());
        }
        // A change applied while the pages are read may not be in them: then they are used
        // this once and asked for again next time (remembered, nothing would forget them).
        let epoch = self.inodes().epoch();
        let mut all = Vec::new();
        let mut after: Option<String> = None;
        loop {
            self.counters.lists.fetch_add(1, Ordering::Relaxed);
            let page = self.call("list", self.filer.list(dir, after.as_deref(), 1000))?;
            all.extend(page.entries);
            match page.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        // The inode entries of hard-linked files are reached through their names only.
        if dir == path::ROOT {
            all.retain(|e| e.path != INODES_DIR);
        }
        let names = all.iter().map(|e| (e.name().to_string(), e.kind)).collect();
        self.inodes().remember_listing_since(dir, all, epoch);
        Ok(names)
    }

    /// After a write of our own: what we remembered of `p` is stale.
    fn forget(&self, p: &str) {
        self.inodes().changed(p);
    }

    /// The directories whose times a change of ours set, as the filer answered: the kernel asks
    /// for their attributes again at once, and they need no stat.
    fn dirs_changed(&self, dirs: &[Entry]) {
        for d in dirs {
            self.inodes().forget_entry(&d.path);
            self.inodes().remember(d.clone());
        }
    }

    fn writable(&self) -> Result<(), Errno> {
        if self.opts.read_only { Err(Errno::EROFS) } else { Ok(()) }
    }

    fn handle(&self, fh: FileHandle) -> Result<Arc<Mutex<Handle>>, Errno> {
        self.handles.lock().unwrap_or_else(|p| p.into_inner()).get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    fn add_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().unwrap_or_else(|p| p.into_inner()).insert(fh, Arc::new(Mutex::new(h)));
        fh
    }

    /// The whole content of `p` into a new spool file.
    fn download(&self, p: &str) -> Result<std::fs::File, Errno> {
        let mut f = tempfile::tempfile().map_err(|_| Errno::EIO)?;
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        let (_, mut s) = self.call("read", self.filer.read(p, None))?;
        let timeout = self.opts.timeout;
        let copied: Result<(), Errno> = self.rt.block_on(async {
            // As long as the file takes, but not a filer that sends nothing for the timeout.
            loop {
                match tokio::time::timeout(timeout, s.next()).await {
                    Ok(Some(part)) => {
                        let part = part.map_err(|e| read_failed(p, timeout, Some(&Error::internal(e))))?;
                        f.write_all(&part).map_err(|_| Errno::EIO)?;
                    }
                    Ok(None) => return Ok(()),
                    Err(_) => return Err(read_failed(p, timeout, None)),
                }
            }
        });
        copied?;
        Ok(f)
    }

    /// Uploads a handle's spool as the file's new content.
    fn upload(&self, h: &mut Handle) -> Result<(), Errno> {
        if !h.dirty || h.unlinked.is_some() {
            return Ok(());
        }
        let spool = h.spool.as_ref().ok_or(Errno::EBADF)?.try_clone().map_err(|_| Errno::EIO)?;
        let progress = Progress::default();
        let body = progress.counting(spool_stream(spool)?);
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        let e = self.call_within(
            "write",
            self.filer.write(&h.path, body, WriteOptions::default()),
            Errno::EAGAIN,
            &progress,
        )?;
        h.dirty = false;
        self.forget(&h.path);
        self.inodes().remember(e);
        Ok(())
    }

    /// After the last close of `h` failed to store its bytes (`why`): a copy of them in the
    /// unsaved directory (0700), named for the time and the file, and a log line saying where.
    fn keep_unsaved(&self, h: &Handle, why: Errno) {
        let Some(spool) = h.spool.as_ref().filter(|_| h.dirty) else { return };
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        let mut file = h.path.trim_start_matches('/').replace('/', "%2F");
        // A name's length is limited (255 bytes): the end of a long path is kept, the whole
        // path is in the log line.
        while file.len() > 180 {
            file.remove(0);
        }
        let stamp = tidemark_core::format_rfc3339_ms(now);
        let why = std::io::Error::from_raw_os_error(why.code());
        let mut to = self.opts.unsaved_dir.join(format!("{stamp}-{file}"));
        let kept = (|| -> std::io::Result<u64> {
            use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&self.opts.unsaved_dir)?;
            let mut from = spool.try_clone()?;
            from.seek(SeekFrom::Start(0))?;
            let create =
                |p: &std::path::Path| std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(p);
            let mut out = create(&to);
            // (Two last closes of one path in one millisecond.)
            for n in 1..10 {
                match out {
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        to = self.opts.unsaved_dir.join(format!("{stamp}-{n}-{file}"));
                        out = create(&to);
                    }
                    _ => break,
                }
            }
            let mut out = out?;
            let n = std::io::copy(&mut from, &mut out)?;
            out.sync_all()?;
            Ok(n)
        })();
        match kept {
            Ok(n) => tracing::error!(
                path = h.path,
                kept = %to.display(),
                "the last close of {} could not store its {n} bytes ({why}); they are kept in {}: copy them back once the filer is reachable",
                h.path,
                to.display()
            ),
            Err(e) => tracing::error!(
                path = h.path,
                "the last close of {} could not store its bytes ({why}), nor keep them in {} ({e}): they are lost",
                h.path,
                self.opts.unsaved_dir.display()
            ),
        }
    }

    /// A new entry `n` at `p` in directory `parent`, owned by the user `req` acts for (with the
    /// group of a set-group-ID directory, whose bit a new directory takes too): one transaction,
    /// which also sets the directory's times. EEXIST if the name is taken.
    fn make(&self, req: &Request, parent: INodeNo, p: &str, mut n: NewEntry) -> Result<Entry, Errno> {
        let (uid, gid, inherited) = self.owner_in(req, parent, n.kind == EntryKind::Dir)?;
        n.mode |= inherited;
        n.posix.uid = Some(uid);
        n.posix.gid = Some(gid);
        self.put_entry(p, n, Precondition::Absent)
    }

    /// The handles open on paths `which` accepts.
    fn open_on(&self, which: impl Fn(&str) -> bool) -> Vec<Arc<Mutex<Handle>>> {
        let all: Vec<_> = self.handles.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        all.into_iter().filter(|h| which(&h.lock().unwrap_or_else(|p| p.into_inner()).path)).collect()
    }

    /// Before `p` is unlinked or replaced: every handle open on it takes the bytes it reads into
    /// its spool (a file open when its name goes stays readable until its last close). Returns
    /// the handles, for [`Self::unlinked`] once the name is gone.
    fn keep_open_bytes(&self, p: &str) -> Vec<Arc<Mutex<Handle>>> {
        let open = self.open_on(|h| h == p);
        for h in &open {
            let mut h = h.lock().unwrap_or_else(|p| p.into_inner());
            // (A handle reading the filer's file, itself or through the kernel, holds it open:
            // its bytes stay when the name goes.)
            if h.spool.is_none()
                && h.local.is_none()
                && h.io != Io::Passthrough
                && let Ok(spool) = self.download(p)
            {
                h.spool = Some(spool);
                h.reader = None;
            }
        }
        open
    }

    /// After the name of `handles` (`e`) went: they keep what they hold, and write nowhere.
    fn unlinked(&self, handles: &[Arc<Mutex<Handle>>], e: &Entry) {
        let ino = self.inodes().known_ino(&e.path);
        for h in handles {
            h.lock().unwrap_or_else(|p| p.into_inner()).unlinked = ino.map(|i| (i, e.clone()));
        }
    }

    /// The attributes of inode `ino` as a handle that outlived its name sees them: no links,
    /// the spool's size.
    fn unlinked_attr(&self, ino: u64) -> Option<FileAttr> {
        let all: Vec<_> = self.handles.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        all.into_iter().find_map(|h| {
            let h = h.lock().unwrap_or_else(|p| p.into_inner());
            let (i, e) = h.unlinked.as_ref().filter(|(i, _)| *i == ino)?;
            let mut a = self.attr(e);
            (a.ino, a.nlink) = (INodeNo(*i), 0);
            if let Some(len) = h.spool.as_ref().and_then(|s| s.metadata().ok()).map(|m| m.len()) {
                a.size = len;
            }
            Some(a)
        })
    }

    /// Uploads what the handles open on `p` have written.
    fn flush_path(&self, p: &str) -> Result<(), Errno> {
        for h in self.open_on(|h| h == p) {
            self.upload(&mut h.lock().unwrap_or_else(|p| p.into_inner()))?;
        }
        Ok(())
    }

    fn put_entry(&self, p: &str, e: NewEntry, precondition: Precondition) -> Result<Entry, Errno> {
        let on_conflict = if precondition == Precondition::Absent { Errno::EEXIST } else { Errno::EAGAIN };
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        let txn = Txn {
            path: p.to_string(),
            precondition,
            fence: None,
            mutation: tidemark_core::model::Mutation::Put { entry: e, data: None },
            origin: Origin::Local,
            // A new name sets its directory's times (a replaced entry's name was there).
            dir_times: true,
        };
        let applied = self.call_or("apply", self.filer.apply(txn), on_conflict)?;
        self.forget(p);
        self.dirs_changed(&applied.dirs);
        let e = applied.new.ok_or(Errno::EIO)?;
        self.inodes().remember(e.clone());
        Ok(e)
    }

    /// Reads `size` bytes at `offset`: from the handle's spool if it writes, else through its
    /// reader (`Reader`), which continues its stream when the read is at or a little past what
    /// it holds, and starts afresh otherwise: a stream to the end for a read near the start,
    /// one block elsewhere (a stream follows if the next read continues it).
    fn read_at(&self, h: &mut Handle, offset: u64, size: u32) -> Result<Answer, Errno> {
        // Bytes on this machine: the handle's own (written, not yet uploaded), or the filer's
        // file of the version opened.
        if let Some(f) = h.spool.as_ref().or(h.local.as_ref()) {
            return GATHERED.with_borrow_mut(|g| read_file_at(f, offset, size, g)).map(|()| Answer::Gathered).map_err(
                |e| {
                    tracing::warn!(path = h.path, error = %e, "read of a local file failed");
                    Errno::EIO
                },
            );
        }
        let e = self.stat(&h.path)?;
        let end = (offset + size as u64).min(e.size);
        if offset >= end {
            return Ok(Answer::Slice(Bytes::new()));
        }
        let fits = |r: &Reader| offset >= r.start && (end <= r.end || offset <= r.end + SKIP);
        if !h.reader.as_ref().is_some_and(fits) {
            h.reader = None;
            // A read near the start opens a stream from 0: a file is most often read whole,
            // and the kernel's read-ahead may ask for a later offset before the first one.
            let r = if offset <= SKIP {
                self.stream_from(h, Reader::default())
            } else {
                self.counters.reads.fetch_add(1, Ordering::Relaxed);
                let range = ByteRange { offset, length: Some(BLOCK.min(e.size - offset)) };
                let block = self.rt.block_on(read_range(self.filer_read(h, range)))?;
                let end = offset + block.len() as u64;
                Reader { window: [block].into(), start: offset, end, stream: None }
            };
            h.reader = Some(r);
        }
        if h.reader.as_ref().is_some_and(|r| end > r.end && r.stream.is_none()) {
            let held = h.reader.take().unwrap_or_default();
            h.reader = Some(self.stream_from(h, held));
        }
        let Some(r) = h.reader.as_mut() else { return Err(Errno::EIO) };
        while r.end < end {
            let Some(Stream { rx, .. }) = r.stream.as_mut() else { break };
            // The timer is made inside the runtime: FUSE's threads are not its.
            let timeout = self.opts.timeout;
            match self.rt.block_on(async { tokio::time::timeout(timeout, rx.recv()).await }) {
                Ok(Some(Ok(frames))) => {
                    for b in frames {
                        r.push(b, offset);
                    }
                }
                // The end of the file as the filer has it (it may have shrunk since the stat).
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    h.reader = None;
                    return Err(e);
                }
                Err(_) => {
                    tracing::warn!(path = h.path, "read: the filer sent nothing for {:?}", self.opts.timeout);
                    h.reader = None;
                    return Err(Errno::EIO);
                }
            }
        }
        Ok(r.bytes(offset, end.min(r.end)))
    }

    /// `held` with a stream from its end to the end of the file, read ahead by a task.
    fn stream_from(&self, h: &Handle, mut held: Reader) -> Reader {
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = tokio::sync::mpsc::channel(BATCHES_AHEAD);
        let range = ByteRange { offset: held.end, length: None };
        let task = self.rt.spawn(pump(self.filer_read(h, range), tx));
        held.stream = Some(Stream { rx, task });
        held
    }

    /// A read of `range` of handle `h`'s file from the filer.
    fn filer_read(&self, h: &Handle, range: ByteRange) -> FilerRead {
        FilerRead::new(self.filer.clone(), h.path.clone(), range, self.opts.timeout, h.changed.clone())
    }
}

/// Up to `size` bytes of `f` at `offset` (fewer at its end), into `buf` (whose capacity is
/// reused: a fresh zeroed buffer per read was a page fault and a zeroing per page read).
fn read_file_at(f: &std::fs::File, offset: u64, size: u32, buf: &mut Vec<u8>) -> std::io::Result<()> {
    buf.resize(size as usize, 0);
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], offset + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(n);
    Ok(())
}

/// How a read of the filer failed (`None`: it did not answer in time), logged, as an errno.
fn read_failed(p: &str, timeout: Duration, e: Option<&Error>) -> Errno {
    match e {
        Some(e) => {
            tracing::warn!(error = %e, path = p, "read failed");
            errno(e)
        }
        None => {
            tracing::warn!(path = p, "read: the filer did not answer within {timeout:?}");
            Errno::EIO
        }
    }
}

/// A read of the filer's file at `p` from `pos` to `end` (`None`: the file's end). The filer's
/// client resumes a stream that breaks where it broke, on the same version
/// ([`Filer::read`]); when the file changed before it could, this handle's reads fail from then
/// on (`changed`). A filer that sends nothing for the whole timeout fails the read.
struct FilerRead {
    filer: Arc<dyn Filer>,
    p: String,
    pos: u64,
    end: Option<u64>,
    timeout: Duration,
    /// Set when the file changed mid-read: the handle's reads fail from then on.
    changed: Arc<AtomicBool>,
    stream: Option<ByteStream>,
}

impl FilerRead {
    fn new(filer: Arc<dyn Filer>, p: String, range: ByteRange, timeout: Duration, changed: Arc<AtomicBool>) -> Self {
        let end = range.length.map(|n| range.offset.saturating_add(n));
        FilerRead { filer, p, pos: range.offset, end, timeout, changed, stream: None }
    }

    /// Opens the stream from `pos`, within the timeout.
    async fn open(&mut self) -> Result<ByteStream, Errno> {
        if self.changed.load(Ordering::Relaxed) {
            return Err(Errno::EIO);
        }
        let range = ByteRange { offset: self.pos, length: self.end.map(|e| e - self.pos) };
        match tokio::time::timeout(self.timeout, self.filer.read(&self.p, Some(range))).await {
            Ok(Ok((_, stream))) => Ok(stream),
            Ok(Err(e)) => Err(read_failed(&self.p, self.timeout, Some(&e))),
            Err(_) => Err(read_failed(&self.p, self.timeout, None)),
        }
    }

    /// The next bytes; `None` at the end.
    async fn next(&mut self) -> Result<Option<Bytes>, Errno> {
        if self.stream.is_none() {
            self.stream = Some(self.open().await?);
        }
        let Some(stream) = self.stream.as_mut() else { return Err(Errno::EIO) };
        match tokio::time::timeout(self.timeout, stream.next()).await {
            Ok(Some(Ok(b))) => {
                self.pos += b.len() as u64;
                Ok(Some(b))
            }
            Ok(None) => Ok(None),
            Ok(Some(Err(e))) => {
                if tidemark_core::changed_mid_read(&e) {
                    self.changed.store(true, Ordering::Relaxed);
                }
                Err(read_failed(&self.p, self.timeout, Some(&Error::internal(e.to_string()))))
            }
            Err(_) => Err(read_failed(&self.p, self.timeout, None)),
        }
    }
}

/// A ranged read, whole.
async fn read_range(mut read: FilerRead) -> Result<Bytes, Errno> {
    let mut buf = BytesMut::with_capacity(read.end.map_or(BLOCK, |e| e - read.pos) as usize);
    while let Some(b) = read.next().await? {
        buf.extend_from_slice(&b);
    }
    Ok(buf.freeze())
}

/// Reads `read` into `tx`, its frames in batches of about
/// `BATCH` bytes, until the end, an error (sent on, after the bytes before it) or the reader
/// going away.
async fn pump(mut read: FilerRead, tx: tokio::sync::mpsc::Sender<Result<Vec<Bytes>, Errno>>) {
    let (mut batch, mut bytes) = (Vec::new(), 0);
    loop {
        let frame = read.next().await;
        if let Ok(Some(b)) = &frame {
            bytes += b.len();
            batch.push(b.clone());
        }
        let full = bytes >= BATCH || !matches!(frame, Ok(Some(_)));
        if full && !batch.is_empty() {
            bytes = 0;
            if tx.send(Ok(std::mem::take(&mut batch))).await.is_err() {
                return;
            }
        }
        match frame {
            Ok(Some(_)) => {}
            Ok(None) => return,
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        }
    }
}

/// When a body sent to the filer last moved: the call's start, then each part it took.
#[derive(Clone)]
struct Progress {
    start: std::time::Instant,
    /// Milliseconds after `start` of the last part taken.
    last_ms: Arc<std::sync::atomic::AtomicU64>,
}

impl Default for Progress {
    fn default() -> Self {
        Progress { start: std::time::Instant::now(), last_ms: Default::default() }
    }
}

impl Progress {
    fn last(&self) -> std::time::Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }

    /// `body`, noting each part the filer takes of it.
    fn counting(&self, body: ByteStream) -> ByteStream {
        let p = self.clone();
        body.inspect(move |_| {
            let ms = u64::try_from(p.start.elapsed().as_millis()).unwrap_or(u64::MAX);
            p.last_ms.fetch_max(ms, Ordering::Relaxed);
        })
        .boxed()
    }
}

/// A spool file as a stream for the filer, read from its start.
fn spool_stream(mut f: std::fs::File) -> Result<ByteStream, Errno> {
    f.seek(SeekFrom::Start(0)).map_err(|_| Errno::EIO)?;
    let s = futures::stream::unfold(f, |mut f| async move {
        let mut buf = vec![0u8; 1 << 20];
        match f.read(&mut buf) {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Bytes::from(buf)), f))
            }
            Err(e) => Some((Err(e), f)),
        }
    });
    Ok(s.boxed())
}

impl Filesystem for TidemarkFs {
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        if !self.opts.passthrough {
            return Ok(());
        }
        // Depth 2: the filer's files may lie on a stacked file system (overlayfs, containers).
        let depth = config.set_max_stack_depth(2).or_else(|n| config.set_max_stack_depth(n));
        match (config.add_capabilities(fuser::InitFlags::FUSE_PASSTHROUGH), depth) {
            (Ok(()), Ok(_)) => self.passthrough.store(true, Ordering::Relaxed),
            _ => tracing::info!("the kernel offers no FUSE passthrough: reads go through the mount"),
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = (|| {
            let name = name_of(name)?;
            let p = self.inodes().child(parent.0, name).ok_or(Errno::ENOENT)?;
            if p == INODES_DIR {
                return Err(Errno::ENOENT);
            }
            let mut e = self.stat(&p)?;
            self.unflushed_size(&mut e, None);
            Ok(self.attr(&e))
        })();
        match r {
            Ok(a) => reply.entry(&self.opts.ttl, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let r = (|| {
            // A file whose name went while it was open is still there for its handles.
            let unlinked = || self.unlinked_attr(ino.0).ok_or(Errno::ENOENT);
            let Ok(p) = self.path_of(ino) else { return unlinked() };
            let mut e = match self.stat(&p) {
                Err(Errno::ENOENT) => return unlinked(),
                r => r?,
            };
            self.unflushed_size(&mut e, fh);
            Ok(self.attr(&e))
        })();
        match r {
            Ok(a) => reply.attr(&self.opts.ttl, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let r = (|| {
            let p = self.path_of(ino)?;
            let attrs = mode.is_some() || mtime.is_some() || atime.is_some() || uid.is_some() || gid.is_some();
            if attrs || size.is_some() {
                self.writable()?;
            }
            if let Some(size) = size {
                let open = fh.and_then(|fh| self.handle(fh).ok());
                match open {
                    Some(h) => {
                        let mut h = h.lock().unwrap_or_else(|p| p.into_inner());
                        if h.sealed && size != 0 {
                            return Err(Errno::EACCES);
                        }
                        h.sealed = false;
                        if h.spool.is_none() {
                            h.spool = Some(self.download(&p)?);
                        }
                        h.spool.as_ref().ok_or(Errno::EIO)?.set_len(size).map_err(|_| Errno::EIO)?;
                        h.dirty = true;
                        self.upload(&mut h)?;
                    }
                    None => {
                        if size != 0 && is_sealed(&self.stat(&p)?) {
                            return Err(Errno::EACCES);
                        }
                        let spool =
                            if size == 0 { tempfile::tempfile().map_err(|_| Errno::EIO)? } else { self.download(&p)? };
                        let mut h = Handle::new(p.clone(), Some(spool));
                        h.dirty = true;
                        h.spool.as_ref().ok_or(Errno::EIO)?.set_len(size).map_err(|_| Errno::EIO)?;
                        self.upload(&mut h)?;
                    }
                }
            }
            if mtime.is_some() {
                // Bytes written and not yet uploaded would take the time of their upload: the
                // time set now (tar and cp -p set it before they close) must come after them.
                self.flush_path(&p)?;
            }
            let mut e = self.stat(&p)?;
            if attrs {
                let mut n = e.to_new();
                if let Some(m) = mode {
                    n.mode = m & 0o7777;
                }
                if uid.is_some() {
                    n.posix.uid = uid;
                }
                if gid.is_some() {
                    n.posix.gid = gid;
                }
                // Every change of attributes is a change of status.
                n.posix.ctime_ms = Some(ms_of(SystemTime::now()));
                let at = |t: TimeOrNow| match t {
                    TimeOrNow::SpecificTime(t) => ms_of(t),
                    TimeOrNow::Now => ms_of(SystemTime::now()),
                };
                // The atime is kept apart only once set: until then it reads as the mtime.
                let atime_before = e.posix.atime_ms.unwrap_or(e.mtime_ms);
                if let Some(t) = mtime {
                    n.mtime_ms = at(t);
                }
                if atime.is_some() || mtime.is_some() {
                    n.posix.atime_ms = Some(atime.map_or(atime_before, at));
                }
                e = self.put_entry(&p, n, Precondition::Version(e.version))?;
            }
            Ok(self.attr(&e))
        })();
        match r {
            Ok(a) => reply.attr(&self.opts.ttl, &a),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let r = (|| {
            self.writable()?;
            let p = self.inodes().child(parent.0, name_of(name)?).ok_or(Errno::ENOENT)?;
            let mut d = NewEntry::dir(ms_of(SystemTime::now()));
            d.mode = mode & !umask & 0o7777;
            self.make(req, parent, &p, d)
        })();
        match r {
            Ok(e) => reply.entry(&self.opts.ttl, &self.attr(&e), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        let r = (|| {
            self.writable()?;
            let p = self.inodes().child(parent.0, name_of(name)?).ok_or(Errno::ENOENT)?;
            let kind = match mode & libc::S_IFMT {
                libc::S_IFREG => EntryKind::File,
                libc::S_IFIFO => EntryKind::Fifo,
                libc::S_IFSOCK => EntryKind::Socket,
                libc::S_IFCHR => EntryKind::CharDevice,
                libc::S_IFBLK => EntryKind::BlockDevice,
                _ => return Err(Errno::EINVAL),
            };
            // A regular file is an empty one, as create() makes it.
            let mut n = if kind == EntryKind::File {
                empty_file()
            } else {
                NewEntry::file(0, ms_of(SystemTime::now()), Content::Empty)
            };
            n.kind = kind;
            n.mode = mode & !umask & 0o7777;
            if matches!(kind, EntryKind::CharDevice | EntryKind::BlockDevice) {
                n.posix.rdev = rdev as u64;
            }
            self.make(req, parent, &p, n)
        })();
        match r {
            Ok(e) => reply.entry(&self.opts.ttl, &self.attr(&e), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &std::path::Path, reply: ReplyEntry) {
        let r = (|| {
            self.writable()?;
            let p = self.inodes().child(parent.0, name_of(link_name)?).ok_or(Errno::ENOENT)?;
            // The namespace keeps names and targets as UTF-8.
            let target = target.to_str().ok_or(Errno::EINVAL)?;
            if target.len() > tidemark_core::model::MAX_SYMLINK_TARGET {
                return Err(Errno::ENAMETOOLONG);
            }
            self.make(req, parent, &p, NewEntry::symlink(target, ms_of(SystemTime::now())))
        })();
        match r {
            Ok(e) => reply.entry(&self.opts.ttl, &self.attr(&e), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let r = (|| {
            let e = self.stat(&self.path_of(ino)?)?;
            e.posix.target.filter(|_| e.kind == EntryKind::Symlink).ok_or(Errno::EINVAL)
        })();
        match r {
            Ok(t) => reply.data(t.as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let r = (|| {
            let key = xattr_key(name)?;
            self.writable()?;
            let p = self.path_of(ino)?;
            let e = self.stat(&p)?;
            let exists = e.extended.contains_key(&key);
            if flags & libc::XATTR_CREATE != 0 && exists {
                return Err(Errno::EEXIST);
            }
            if flags & libc::XATTR_REPLACE != 0 && !exists {
                return Err(Errno::ENODATA);
            }
            let mut n = e.to_new();
            n.extended.insert(key, base64::Engine::encode(&base64::engine::general_purpose::STANDARD, value));
            if n.extended.iter().map(|(k, v)| k.len() + v.len() + 6).sum::<usize>() > MAX_EXTENDED_BYTES {
                return Err(Errno::ENOSPC);
            }
            n.posix.ctime_ms = Some(ms_of(SystemTime::now()));
            self.put_entry(&p, n, Precondition::Version(e.version)).map(drop)
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        // Asked by the kernel before writes (security.capability): answered without a lookup.
        let r = match xattr_key(name) {
            Err(_) => Err(Errno::ENODATA),
            Ok(key) => self.path_of(ino).and_then(|p| self.stat(&p)).and_then(|e| {
                let v = e.extended.get(&key).ok_or(Errno::ENODATA)?;
                base64::Engine::decode(&base64::engine::general_purpose::STANDARD, v).map_err(|_| Errno::EIO)
            }),
        };
        reply_xattr(reply, size, r);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let r = self.path_of(ino).and_then(|p| self.stat(&p)).map(|e| {
            let mut names = Vec::new();
            for k in e.extended.keys().filter_map(|k| k.strip_prefix(XATTR_PREFIX)) {
                names.extend_from_slice(k.as_bytes());
                names.push(0);
            }
            names
        });
        reply_xattr(reply, size, r);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = (|| {
            let key = xattr_key(name).map_err(|_| Errno::ENODATA)?;
            self.writable()?;
            let p = self.path_of(ino)?;
            let e = self.stat(&p)?;
            let mut n = e.to_new();
            n.extended.remove(&key).ok_or(Errno::ENODATA)?;
            n.posix.ctime_ms = Some(ms_of(SystemTime::now()));
            self.put_entry(&p, n, Precondition::Version(e.version)).map(drop)
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    /// A second name: one transaction, which the first time moves the file to its inode entry
    /// (the kernel's inode for it then names that entry). Where a file cannot have a second
    /// name — a directory, a remote mount — EPERM, as link(2) answers there.
    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let r = (|| {
            self.writable()?;
            let from = self.path_of(ino)?;
            let to = self.inodes().child(newparent.0, name_of(newname)?).ok_or(Errno::ENOENT)?;
            if self.stat(&from)?.is_dir() {
                return Err(Errno::EPERM);
            }
            // What is written and not yet uploaded goes first: the file moves.
            self.flush_path(&from)?;
            let txn = Txn::link(from.clone(), to.clone(), Origin::Local).with_dir_times();
            self.counters.writes.fetch_add(1, Ordering::Relaxed);
            let applied = match self.call_or("link", self.filer.apply(txn), Errno::EEXIST) {
                Err(Errno::EXDEV | Errno::EISDIR) => Err(Errno::EPERM),
                r => r,
            }?;
            let inode = applied.new.ok_or(Errno::EIO)?;
            if inode.path != from {
                // The file moved to its inode entry: its handles and its inode number follow.
                for h in self.open_on(|h| h == from) {
                    h.lock().unwrap_or_else(|p| p.into_inner()).path = inode.path.clone();
                }
                self.inodes().renamed(&from, &inode.path);
            }
            self.forget(&to);
            self.forget(&inode.path);
            self.dirs_changed(&applied.dirs);
            self.inodes().remember(inode.clone());
            Ok(self.attr(&inode))
        })();
        match r {
            Ok(a) => reply.entry(&self.opts.ttl, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.remove(parent, name, false);
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.remove(parent, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = (|| {
            self.writable()?;
            let from = self.inodes().child(parent.0, name_of(name)?).ok_or(Errno::ENOENT)?;
            let to = self.inodes().child(newparent.0, name_of(newname)?).ok_or(Errno::ENOENT)?;
            if flags.contains(RenameFlags::RENAME_EXCHANGE) {
                return Err(Errno::EINVAL);
            }
            let to_precondition =
                if flags.contains(RenameFlags::RENAME_NOREPLACE) { Precondition::Absent } else { Precondition::Any };
            if from == to {
                // rename(2) of a name onto itself does nothing.
                return self.stat(&from).map(drop);
            }
            // A file open under the name the rename replaces keeps its bytes.
            let gone = self.stat(&to).ok();
            let replaced = gone.as_ref().map(|g| self.last_name_going(g)).unwrap_or_default();
            // A hard-linked file's inode entry, whose ctime the rename sets.
            let linked = self.stat(&from).ok().map(|e| e.path).filter(|p| *p != from);
            // One transaction, whatever the size of the tree.
            let txn = Txn {
                path: from.clone(),
                precondition: Precondition::Any,
                fence: None,
                mutation: tidemark_core::model::Mutation::Rename { to: to.clone(), to_precondition },
                origin: Origin::Local,
                dir_times: true,
            };
            self.counters.writes.fetch_add(1, Ordering::Relaxed);
            let renamed = match self.call_or("rename", self.filer.apply(txn), Errno::EEXIST) {
                // Where the bucket's keys cannot follow (a remote mount whose sync is off, across
                // mounts) a rename is a copy; where the mount syncs, the filer renamed in place.
                Err(Errno::EXDEV) => self.rename_by_copy(&from, &to, to_precondition),
                r => r.map(|a| self.dirs_changed(&a.dirs)),
            };
            if let Err(e) = renamed {
                self.forget(&from);
                self.forget(&to);
                return Err(e);
            }
            if let Some(gone) = &gone {
                self.unlinked(&replaced, gone);
                if gone.path != to {
                    self.forget(&gone.path);
                }
            }
            if let Some(inode) = &linked {
                self.forget(inode);
            }
            // Handles open below the old name write to the new one at their close.
            let below = format!("{from}/");
            for h in self.open_on(|h| h == from || h.starts_with(&below)) {
                let mut h = h.lock().unwrap_or_else(|p| p.into_inner());
                h.path = format!("{to}{}", &h.path[from.len()..]);
            }
            // The kernel moves the source's inode to the new name: so must the inode table.
            self.inodes().renamed(&from, &to);
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let r = (|| {
            let p = self.path_of(ino)?;
            let e = self.stat(&p)?;
            if e.is_dir() {
                return Err(Errno::EISDIR);
            }
            let write = flags.0 & libc::O_ACCMODE != libc::O_RDONLY;
            let trunc = flags.0 & libc::O_TRUNC != 0;
            // An object the S3 gateway stored encrypted (SSE) is ciphertext here: it is not
            // served as if it were its bytes, nor partly overwritten; replaced whole (truncated
            // first), it is a new, unencrypted file.
            let sealed = is_sealed(&e) && !trunc;
            if sealed && !write {
                tracing::info!(path = %p, "refused: encrypted by the S3 gateway (SSE); read it through the gateway");
                return Err(Errno::EACCES);
            }
            let mut h = Handle::new(p.clone(), None);
            if write {
                self.writable()?;
                h.sealed = sealed;
                h.spool = Some(if trunc || e.size == 0 || sealed {
                    tempfile::tempfile().map_err(|_| Errno::EIO)?
                } else {
                    self.download(&p)?
                });
                h.dirty = trunc && e.size > 0;
            }
            let local = if write { None } else { self.local_file(&e) };
            Ok((h, write, local))
        })();
        let (mut h, write, local) = match r {
            Ok(x) => x,
            Err(e) => return reply.error(e),
        };
        if self.choose_io(&mut h, ino.0, local, &reply) {
            self.counters.passthrough.fetch_add(1, Ordering::Relaxed);
        }
        let io = h.io;
        let fh = FileHandle(self.add_handle(h));
        let modes = self.io();
        match modes.reply_flags(ino.0, io, write) {
            (Some(backing), flags) => reply.opened_passthrough(fh, flags, backing),
            (None, flags) => reply.opened(fh, flags),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let r = (|| {
            self.writable()?;
            let p = self.inodes().child(parent.0, name_of(name)?).ok_or(Errno::ENOENT)?;
            let perm = mode & !umask & 0o7777;
            // The kernel asks to create a name it found absent.
            let mut n = empty_file();
            n.mode = perm;
            let e = match self.make(req, parent, &p, n) {
                // Created meanwhile by someone else: without O_EXCL, open it as before (emptied).
                // (The name was there: the write names nothing new, so it keeps the entry's owner
                // and sets no directory's times.)
                Err(Errno::EEXIST) if flags & libc::O_EXCL == 0 => {
                    let opts = WriteOptions { mode: Some(perm), ..Default::default() };
                    self.counters.writes.fetch_add(1, Ordering::Relaxed);
                    let e = self.call("create", self.filer.write(&p, futures::stream::empty().boxed(), opts))?;
                    self.forget(&p);
                    self.inodes().remember(e.clone());
                    e
                }
                r => r?,
            };
            let spool = tempfile::tempfile().map_err(|_| Errno::EIO)?;
            // (Never in a read-only mount, the only kind that passes files through.)
            let fh = self.add_handle(Handle::new(p, Some(spool)));
            Ok((self.attr(&e), fh))
        })();
        match r {
            Ok((a, fh)) => reply.created(&self.opts.ttl, &a, Generation(0), FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let r = self.handle(fh).and_then(|h| {
            let mut h = h.lock().unwrap_or_else(|p| p.into_inner());
            if h.sealed {
                return Err(Errno::EACCES); // the encrypted object's bytes are not its plaintext
            }
            self.read_at(&mut h, offset, size)
        });
        match r {
            Ok(Answer::Slice(d)) => reply.data(&d),
            Ok(Answer::Gathered) => GATHERED.with_borrow(|g| reply.data(g)),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let r = self.handle(fh).and_then(|h| {
            let mut h = h.lock().unwrap_or_else(|p| p.into_inner());
            if h.sealed {
                // Truncated by path meanwhile (the kernel's O_TRUNC may come without the
                // handle), it is no longer the encrypted object.
                if is_sealed(&self.stat(&h.path)?) {
                    return Err(Errno::EACCES);
                }
                h.sealed = false;
            }
            let spool = h.spool.as_ref().ok_or(Errno::EBADF)?;
            spool.write_all_at(data, offset).map_err(|_| Errno::EIO)?;
            h.dirty = true;
            Ok(data.len() as u32)
        });
        match r {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        let r = self.handle(fh).and_then(|h| self.upload(&mut h.lock().unwrap_or_else(|p| p.into_inner())));
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let r = self.handle(fh).and_then(|h| self.upload(&mut h.lock().unwrap_or_else(|p| p.into_inner())));
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    /// Reserving space (mode 0) grows the file to `offset + length` if it is shorter; the
    /// namespace has no preallocation to keep, so nothing else is cheap (punching holes, keeping
    /// the size: `EOPNOTSUPP`).
    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let r = (|| {
            if mode != 0 {
                return Err(Errno::EOPNOTSUPP);
            }
            let h = self.handle(fh)?;
            let mut h = h.lock().unwrap_or_else(|p| p.into_inner());
            let spool = h.spool.as_ref().ok_or(Errno::EBADF)?;
            let end = offset.checked_add(length).ok_or(Errno::EFBIG)?;
            if spool.metadata().map_err(|_| Errno::EIO)?.len() < end {
                spool.set_len(end).map_err(|_| Errno::EIO)?;
                h.dirty = true;
                self.upload(&mut h)?;
            }
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let h = self.handles.lock().unwrap_or_else(|p| p.into_inner()).remove(&fh.0);
        let r = match h {
            Some(h) => {
                let mut h = h.lock().unwrap_or_else(|p| p.into_inner());
                h.reader = None;
                self.release_io(&h);
                let r = self.upload(&mut h);
                if r.is_err() {
                    self.keep_unsaved(&h, r.err().unwrap_or(Errno::EIO));
                }
                r
            }
            None => Ok(()),
        };
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let r = (|| {
            let p = self.path_of(ino)?;
            let e = self.stat(&p)?;
            if !e.is_dir() {
                return Err(Errno::ENOTDIR);
            }
            Ok(())
        })();
        match r {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let r = (|| {
            let p = self.path_of(ino)?;
            let names = self.listing(&p)?;
            let parent_ino = if ino.0 == ROOT_INO {
                ROOT_INO
            } else {
                path::parent(&p).and_then(|d| self.inodes().known_ino(d)).unwrap_or(ROOT_INO)
            };
            let mut rows: Vec<(u64, FileType, String)> =
                vec![(ino.0, FileType::Directory, ".".into()), (parent_ino, FileType::Directory, "..".into())];
            for (n, kind) in names {
                let child = path::join(&p, &n);
                let ci = self.inodes().ino(&child);
                rows.push((ci, file_type(kind), n));
            }
            Ok(rows)
        })();
        match r {
            Ok(rows) => {
                for (i, (ino, kind, name)) in rows.into_iter().enumerate().skip(offset as usize) {
                    if reply.add(INodeNo(ino), (i + 1) as u64, kind, name) {
                        break;
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // The namespace has no fixed size: report a large, mostly free one so tools proceed.
        let blocks = 1u64 << 32;
        reply.statfs(blocks, blocks / 2, blocks / 2, 1 << 32, 1 << 31, 4096, path::MAX_NAME_BYTES as u32, 4096);
    }
}

impl TidemarkFs {
    /// A rename the filer refused in place (into, out of or across remote mounts, or within one
    /// whose sync is off): the file's bytes written at the new name, then the old name removed.
    /// A directory is `EXDEV`: `mv` copies it and removes the original.
    fn rename_by_copy(&self, from: &str, to: &str, precondition: Precondition) -> Result<(), Errno> {
        let src = self.stat(from)?;
        if src.is_dir() {
            return Err(Errno::EXDEV);
        }
        if let Ok(dst) = self.stat(to)
            && dst.is_dir()
        {
            return Err(Errno::EISDIR);
        }
        if src.kind.is_special() {
            // No bytes to move: the entry itself, owner, target and all.
            self.put_entry(to, src.to_new(), precondition)?;
        } else {
            self.counters.reads.fetch_add(1, Ordering::Relaxed);
            let (_, stream) = self.call("read", self.filer.read(from, None))?;
            let progress = Progress::default();
            let stream = progress.counting(stream);
            self.counters.writes.fetch_add(1, Ordering::Relaxed);
            let opts = WriteOptions {
                precondition,
                mode: Some(src.mode),
                mtime_ms: Some(src.mtime_ms),
                uid: src.posix.uid,
                gid: src.posix.gid,
                dir_times: true,
                ..Default::default()
            };
            self.call_within("write", self.filer.write(to, stream, opts), Errno::EEXIST, &progress)?;
        }
        let del = DeleteOptions { recursive: false, precondition: Precondition::Version(src.version), dir_times: true };
        self.call("delete", self.filer.delete(from, del)).map(drop)
    }

    fn remove(&self, parent: INodeNo, name: &OsStr, dir: bool) -> Result<(), Errno> {
        self.writable()?;
        let p = self.inodes().child(parent.0, name_of(name)?).ok_or(Errno::ENOENT)?;
        let e = self.stat(&p)?;
        match (dir, e.is_dir()) {
            (true, false) => return Err(Errno::ENOTDIR),
            (false, true) => return Err(Errno::EISDIR),
            _ => {}
        }
        let open = self.last_name_going(&e);
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        // (For a name of a hard-linked file, `e` is its file: the store checks the file's version.)
        let linked = e.path != p;
        let del = DeleteOptions { recursive: false, precondition: Precondition::Version(e.version), dir_times: true };
        let r = self.call("delete", self.filer.delete(&p, del));
        self.forget(&p);
        if linked {
            // Its count of names and its ctime changed.
            self.forget(&e.path);
        }
        self.dirs_changed(&r?.dirs);
        self.unlinked(&open, &e);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(r: &Reader, from: u64, to: u64) -> (bool, Vec<u8>) {
        match r.bytes(from, to) {
            Answer::Slice(b) => (true, b.to_vec()),
            Answer::Gathered => (false, GATHERED.with_borrow(|g| g.clone())),
        }
    }

    /// The filer's file is opened only if it is the one named: a cached object's file gone or
    /// made again since is no file (read through the mount), while a blob that is missing or
    /// another file, or a cache directory that is not on this machine, is an error (the filer's
    /// files are not reachable from here: reading them goes off for the session).
    #[test]
    fn a_file_of_the_filers_is_opened_only_if_it_is_the_one_named() {
        use tidemark_core::filer::FileIdentity;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ab").join("object");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b"twelve bytes").unwrap();
        let id = FileIdentity::of(&std::fs::metadata(&p).unwrap());
        let named = |file: &std::path::Path, size: u64, ino: u64, cached: bool| Local {
            file: tidemark_core::filer::LocalFile {
                file: file.display().to_string(),
                version: 1,
                size,
                identity: Some(FileIdentity { ino, ..id }),
            },
            cached,
        };
        for cached in [true, false] {
            assert!(named(&p, 12, id.ino, cached).open().unwrap().is_some(), "the file named");
        }
        let (other, short) = (named(&p, 12, id.ino + 1, true), named(&p, 11, id.ino, true));
        assert!(
            other.open().unwrap().is_none() && short.open().unwrap().is_none(),
            "a cached object's file made again"
        );
        assert!(named(&p, 12, id.ino + 1, false).open().is_err(), "a blob that is another file");
        let gone = dir.path().join("ab").join("gone");
        assert!(named(&gone, 12, id.ino, true).open().unwrap().is_none(), "a cached object's file gone");
        assert!(named(&gone, 12, id.ino, false).open().is_err(), "a blob gone");
        let elsewhere = dir.path().join("not-here").join("object");
        assert!(named(&elsewhere, 12, id.ino, true).open().is_err(), "a cache on another machine");
    }

    /// A read's answer is the bytes asked for wherever the frames' edges fall: a slice of the
    /// frame that holds it whole, else gathered from the frames it spans (the buffer reused
    /// from one answer to the next holds only the newer answer).
    #[test]
    fn answers_are_sliced_from_one_frame_or_gathered_across_frames() {
        let file: Vec<u8> = (0..10_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let mut r = Reader::default();
        for cut in [0, 1, 4096, 4097, 7000, 10_000].windows(2) {
            r.push(Bytes::copy_from_slice(&file[cut[0]..cut[1]]), 0);
        }
        assert_eq!((r.start, r.end), (0, 10_000));
        for (from, to, sliced) in [
            (0, 1, true),
            (1, 4096, true),
            (4097, 7000, true),
            (5000, 6000, true),
            (0, 10_000, false),
            (4000, 4200, false),
            (4096, 4097, true),
            (6999, 7001, false),
            (20, 30, true),
            (9_999, 10_000, true),
        ] {
            let (was_sliced, got) = answer(&r, from, to);
            assert_eq!(got, &file[from as usize..to as usize], "{from}..{to}");
            assert_eq!(was_sliced, sliced, "{from}..{to}");
        }
        assert_eq!(answer(&r, 500, 500).1, b"", "nothing asked, nothing answered");
    }

    /// Old frames leave the window once it holds more than `WINDOW`, but never those the read
    /// in hand still needs.
    #[test]
    fn the_window_keeps_what_the_read_in_hand_needs() {
        let frame = Bytes::from(vec![7u8; (WINDOW / 4) as usize]);
        let mut r = Reader::default();
        for _ in 0..6 {
            r.push(frame.clone(), 0);
        }
        assert_eq!((r.start, r.held()), (0, 6 * frame.len() as u64), "the read in hand starts at 0");
        r.push(frame.clone(), 5 * frame.len() as u64);
        assert_eq!(r.held(), WINDOW, "trimmed to the window once nothing older is needed");
        assert_eq!(r.end, 7 * frame.len() as u64);
    }
}

//! Open files and their handles: how the kernel does each handle's I/O, and what the mount
//! holds of a file while handles are open on it.
//!
//! Every handle open on one file shares that file's [`OpenFile`]: the file's bytes as this
//! mount has them once any handle changed them (its *spool*, a sparse temporary file), whether
//! they are stored yet, and the times of the changes not stored. While a file has a spool,
//! that spool is the one answer to every question about the file in this mount — its size and
//! times for `stat`, `fstat` and `lseek`, its bytes for every handle's reads — whatever the
//! filer or the change log say meanwhile; what the filer has of it changes only by an upload
//! (flush, fsync, close, or a truncate by path). The last close of a file stores it, and the
//! last close wins against writers elsewhere (close-to-open, as NFS).

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use bytes::Bytes;
use fuser::{Errno, FopenFlags};
use futures::StreamExt;

use tidemark_core::model::Content;
use tidemark_core::{ByteStream, Entry, Error, WriteOptions};

use crate::ops::{Progress, TidemarkFs, ms_of};
use crate::read::{Reader, read_failed};

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
pub(crate) enum Io {
    Requests,
    Passthrough,
    Direct,
}

/// A file of the filer's that holds a version's bytes, and whether it is the content cache's
/// (which may take it out, and make another at the same name, at any time).
pub(crate) struct Local {
    file: tidemark_core::filer::LocalFile,
    cached: bool,
}

impl Local {
    /// Opens the file, if it is the one the filer named: `None` if a cached object's file went
    /// or is another one now; an error if a blob is missing or not as named (the filer's files
    /// are not on this machine, or not reachable from here).
    pub(crate) fn open(&self) -> std::io::Result<Option<std::fs::File>> {
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
pub(crate) struct Passed {
    pub backing: fuser::BackingId,
    version: u64,
    handles: usize,
}

/// Per inode, the handles of each I/O mode.
#[derive(Default)]
pub(crate) struct IoModes {
    pub passed: HashMap<u64, Passed>,
    requests: HashMap<u64, usize>,
    /// Of the handles in `requests`, those that read the filer's file themselves.
    local: HashMap<u64, usize>,
}

impl IoModes {
    /// The mode of a handle of `ino` that does not read the backing file: direct I/O while the
    /// inode is passed through, the page cache (counted, so that no open passes the inode
    /// through meanwhile) otherwise.
    pub(crate) fn not_passed(&mut self, ino: u64) -> Io {
        if let Some(p) = self.passed.get_mut(&ino) {
            p.handles += 1;
            return Io::Direct;
        }
        *self.requests.entry(ino).or_default() += 1;
        Io::Requests
    }

    /// How to answer the open of a handle of mode `io` on `ino`: the backing file to name, and
    /// the flags.
    pub(crate) fn reply_flags(&self, ino: u64, io: Io, write: bool) -> (Option<&fuser::BackingId>, FopenFlags) {
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

/// What the mount holds of one file while handles are open on it (or while a truncate by path
/// changes it), shared by those handles.
pub(crate) struct OpenFile {
    state: Mutex<FileState>,
    /// Held while the file's bytes move between the filer and the spool (a download into it,
    /// an upload from it) and while its name changes (a rename, unlink or link must not meet an
    /// upload to the old name), so that these never overlap. Never by `stat`: the size and times
    /// are in `state`, which is only held for moments.
    transfer: Mutex<()>,
}

#[derive(Default)]
pub(crate) struct FileState {
    /// The file's path in the namespace (its inode entry's, for a hard-linked file); renames
    /// move it.
    pub path: String,
    /// The file's bytes as this mount has them: made when a handle first changes them
    /// (downloaded, or empty for a truncate to nothing), kept until the last handle closes.
    pub spool: Option<Arc<std::fs::File>>,
    /// The version of the filer's entry that the spool holds, when it holds one (downloaded
    /// from it, or uploaded as it): a spool with no unsaved change gives way to a newer version
    /// written elsewhere.
    pub base: Option<u64>,
    /// The spool holds changes the filer does not have yet.
    pub dirty: bool,
    /// Counts the spool's changes: an upload that began before the last one leaves it dirty.
    pub changes: u64,
    /// When the spool last changed while dirty (the file's mtime and ctime until it is stored).
    pub mtime_ms: Option<i64>,
    /// The name went while handles were open (unlinked, or replaced by a rename): they keep
    /// the bytes in the spool until the last closes, and nothing is uploaded. The inode number
    /// and the entry as they were, for `fstat`.
    pub unlinked: Option<(u64, Entry)>,
    /// Handles open on the file.
    pub handles: usize,
}

impl FileState {
    /// A change to the spool's bytes or size.
    pub fn touch(&mut self) {
        self.dirty = true;
        self.changes += 1;
        self.mtime_ms = Some(ms_of(SystemTime::now()));
    }

    /// The spool's size, if there is a spool.
    pub fn spool_len(&self) -> Option<u64> {
        self.spool.as_ref().and_then(|s| s.metadata().ok()).map(|m| m.len())
    }
}

impl OpenFile {
    pub fn new(path: &str) -> OpenFile {
        OpenFile {
            state: Mutex::new(FileState { path: path.to_string(), ..Default::default() }),
            transfer: Mutex::new(()),
        }
    }

    pub fn state(&self) -> MutexGuard<'_, FileState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn transfer(&self) -> MutexGuard<'_, ()> {
        self.transfer.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn path(&self) -> String {
        self.state().path.clone()
    }
}

pub(crate) struct Handle {
    pub file: Arc<OpenFile>,
    /// The inode and how the kernel does its I/O (counted in [`IoModes`] until release).
    pub ino: u64,
    pub io: Io,
    /// Bytes read through this handle from the filer (while the file has no spool).
    pub reader: Mutex<Option<Reader>>,
    /// A read of this handle, resumed, found the file changed since it began: the handle's
    /// reads fail from then on (the kernel retries a failed read, and another stream would go
    /// on with the new version's bytes after the old one's).
    pub changed: Arc<AtomicBool>,
    /// The filer's file of the version opened, on this machine: read directly (the mount
    /// beside its filer, the kernel's requests answered without the filer's API).
    pub local: Option<std::fs::File>,
}

impl Handle {
    pub fn reader(&self) -> MutexGuard<'_, Option<Reader>> {
        self.reader.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether `e` is an object the S3 gateway stored encrypted (its bytes here are ciphertext).
pub(crate) fn is_sealed(e: &Entry) -> bool {
    e.extended.contains_key(tidemark_core::model::object_attrs::SSE)
}

/// The bytes `offset..offset + len` of `f` read as zeros from now on: a hole punched where the
/// file system can, zeros written where it cannot. The size is kept.
pub(crate) fn zero_range(f: &std::fs::File, offset: u64, len: u64) -> std::io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    if unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as libc::off_t, len as libc::off_t) } == 0 {
        return Ok(());
    }
    let zeros = vec![0u8; (1 << 20).min(len) as usize];
    let mut at = offset;
    while at < offset + len {
        let n = zeros.len().min((offset + len - at) as usize);
        f.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// A spool as a stream for the filer, read from its start with positioned reads (the spool's
/// file offset is shared with every user of it, and never relied on).
pub(crate) fn spool_stream(f: Arc<std::fs::File>) -> ByteStream {
    futures::stream::unfold((f, 0u64), |(f, at)| async move {
        let mut buf = vec![0u8; 1 << 20];
        match f.read_at(&mut buf, at) {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Bytes::from(buf)), (f, at + n as u64)))
            }
            Err(e) => Some((Err(e), (f, at))),
        }
    })
    .boxed()
}

/// The holes worth sending as holes: fewer bytes of them are sent whole.
const SPARSE_MIN_HOLES: u64 = 1 << 20;

/// The filer reads a sparse body's holes back as zeros and hashes them before it answers: the
/// time it is allowed for that, at a rate a loaded machine keeps (MD5 runs at several hundred
/// MB/s when idle).
fn hashing_allowance(holes: u64) -> std::time::Duration {
    const RATE: u64 = 32 << 20;
    std::time::Duration::from_millis(holes.saturating_mul(1000) / RATE)
}

/// The spool's layout for a sparse upload: its size and its data ranges, found with
/// `SEEK_DATA`/`SEEK_HOLE` — or `None` where a sparse body is not worth it (holes under
/// [`SPARSE_MIN_HOLES`]) or not possible (more ranges than a layout names, a file system that
/// does not know holes).
pub(crate) fn sparse_layout(f: &std::fs::File) -> Option<tidemark_core::sparse::Sparse> {
    let size = f.metadata().ok()?.len();
    let fd = f.as_raw_fd();
    let seek = |at: u64, whence: i32| {
        let r = unsafe { libc::lseek(fd, at as libc::off_t, whence) };
        (r >= 0).then_some(r as u64)
    };
    let mut data = Vec::new();
    let mut at = 0;
    while at < size {
        // ENXIO: no data after `at`.
        let Some(start) = seek(at, libc::SEEK_DATA) else { break };
        let end = seek(start, libc::SEEK_HOLE)?.min(size);
        if start >= end {
            break;
        }
        if data.len() == tidemark_core::sparse::MAX_RANGES {
            return None;
        }
        data.push((start, end - start));
        at = end;
    }
    let layout = tidemark_core::sparse::Sparse::new(size, data).ok()?;
    (size - layout.data_len() >= SPARSE_MIN_HOLES).then_some(layout)
}

/// The spool's bytes in `layout`'s data ranges, one after the other. A range the spool no
/// longer holds whole (a truncate while the upload moves) is sent as zeros: the body always
/// matches its layout, and the spool, left dirty, is stored again.
pub(crate) fn sparse_stream(f: Arc<std::fs::File>, layout: &tidemark_core::sparse::Sparse) -> ByteStream {
    const PART: u64 = 1 << 20;
    let parts: Vec<(u64, u64)> = layout
        .data
        .iter()
        .flat_map(|&(off, len)| (0..len.div_ceil(PART)).map(move |i| (off + i * PART, PART.min(len - i * PART))))
        .collect();
    futures::stream::iter(parts)
        .map(move |(at, len)| {
            let mut buf = vec![0u8; len as usize];
            let mut done = 0;
            while done < buf.len() {
                match f.read_at(&mut buf[done..], at + done as u64) {
                    Ok(0) => break, // the rest stays zeros
                    Ok(n) => done += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(Bytes::from(buf))
        })
        .boxed()
}

fn new_spool() -> Result<std::fs::File, Errno> {
    tempfile::tempfile().map_err(|e| {
        tracing::warn!(error = %e, "cannot make a spool file (in TMPDIR)");
        Errno::EIO
    })
}

impl TidemarkFs {
    /// The filer's file holding the bytes of `e`, if the kernel or the mount can read them from
    /// it: a blob, or a remote-backed file the filer's cache holds whole.
    pub(crate) fn local_file(&self, e: &Entry) -> Option<Local> {
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

    /// The I/O mode of a new handle of inode `ino`, and the filer's file it reads itself (if
    /// any): passed through to the filer's file `local` (or to the file the inode's open
    /// handles already read, if it holds the same version: the kernel wants one per inode — a
    /// version written since gets an inode of its own, see `Inodes::changed`), else FUSE
    /// requests: past the page cache while the inode is passed through (a newer version opened
    /// before the kernel learnt its new inode), through it otherwise. `backing` registers a
    /// file with the kernel.
    pub(crate) fn choose_io(
        &self,
        ino: u64,
        local: Option<Local>,
        backing: &dyn Fn(&std::fs::File) -> std::io::Result<fuser::BackingId>,
    ) -> (Io, Option<std::fs::File>) {
        let mut modes = self.io();
        if let Some(p) = modes.passed.get_mut(&ino)
            && local.as_ref().is_some_and(|f| f.file.version == p.version)
        {
            p.handles += 1;
            return (Io::Passthrough, None);
        }
        if !modes.passed.contains_key(&ino)
            && let Some(f) = local.as_ref().filter(|_| self.can_pass() && !modes.requests.contains_key(&ino))
        {
            match f.open().map(|file| file.map(|file| backing(&file))) {
                // Not the file the filer named (a cached object's, taken out and made again
                // since): read through the mount.
                Ok(None) => {}
                Ok(Some(Ok(backing))) => {
                    modes.passed.insert(ino, Passed { backing, version: f.file.version, handles: 1 });
                    self.inodes().passed(ino, true);
                    return (Io::Passthrough, None);
                }
                Ok(Some(Err(e))) => self.no_passthrough(&format!("the kernel refused a backing file ({e})")),
                Err(e) => self.no_passthrough(&format!("the filer's files are not reachable from here ({e})")),
            }
        }
        let mut own = None;
        if let Some(f) = local.filter(|_| self.local_reads.load(Ordering::Relaxed)) {
            match f.open() {
                // The file the filer named, whole (a path that exists on another machine by
                // chance would not be this file, nor was it named to this mount).
                Ok(Some(file)) => {
                    own = Some(file);
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
        (modes.not_passed(ino), own)
    }

    /// A closed handle's I/O mode is counted no more; the last handle of an inode passed
    /// through releases its backing file. An inode read from the filer's files no more (through
    /// the kernel or by the mount) keeps its number when the file changes.
    pub(crate) fn release_io(&self, h: &Handle) {
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

    /// The open file at `p`, if handles are open on it.
    pub(crate) fn open_file(&self, p: &str) -> Option<Arc<OpenFile>> {
        self.files().get(p).cloned()
    }

    /// The open file at `p` (made if none is open), with one more handle counted on it.
    pub(crate) fn attach(&self, p: &str) -> Arc<OpenFile> {
        let mut files = self.files();
        let f = files.entry(p.to_string()).or_insert_with(|| Arc::new(OpenFile::new(p))).clone();
        f.state().handles += 1;
        f
    }

    /// One handle of `f` fewer; the file is forgotten with its last. `true` if that was the last.
    pub(crate) fn detach(&self, f: &Arc<OpenFile>) -> bool {
        let mut files = self.files();
        let mut s = f.state();
        s.handles = s.handles.saturating_sub(1);
        if s.handles > 0 {
            return false;
        }
        if files.get(&s.path).is_some_and(|g| Arc::ptr_eq(g, f)) {
            files.remove(&s.path);
        }
        true
    }

    /// After `from` was renamed to `to`: the files open at or below `from` are at `to` now.
    pub(crate) fn files_renamed(&self, from: &str, to: &str) {
        let mut files = self.files();
        let below = format!("{from}/");
        let moved: Vec<String> = files.keys().filter(|p| *p == from || p.starts_with(&below)).cloned().collect();
        for p in moved {
            if let Some(f) = files.remove(&p) {
                let new = format!("{to}{}", &p[from.len()..]);
                f.state().path = new.clone();
                files.insert(new, f);
            }
        }
    }

    /// The files open at or below `p`.
    pub(crate) fn files_at_or_below(&self, p: &str) -> Vec<Arc<OpenFile>> {
        let below = format!("{p}/");
        self.files().iter().filter(|(k, _)| *k == p || k.starts_with(&below)).map(|(_, f)| f.clone()).collect()
    }

    /// The handles open on `f`.
    pub(crate) fn handles_of(&self, f: &Arc<OpenFile>) -> Vec<Arc<Handle>> {
        self.handles_map().values().filter(|h| Arc::ptr_eq(&h.file, f)).cloned().collect()
    }

    /// The spool of `f`, if the mount's answers about the file come from it: while it holds
    /// unsaved changes, or the file's name is gone, or it holds the filer's current version.
    /// A spool with no unsaved change whose version was replaced elsewhere is dropped: the
    /// file reads as the filer has it again.
    pub(crate) fn spool_view(&self, f: &OpenFile) -> Option<Arc<std::fs::File>> {
        let (path, base) = {
            let s = f.state();
            let spool = s.spool.clone()?;
            if s.dirty || s.unlinked.is_some() {
                return Some(spool);
            }
            (s.path.clone(), s.base)
        };
        // A failed stat (the filer unreachable, the name gone elsewhere) keeps the spool.
        let current = self.stat(&path).ok().map(|e| e.version);
        let mut s = f.state();
        if s.dirty || s.unlinked.is_some() || current.is_none() || current == base {
            return s.spool.clone();
        }
        s.spool = None;
        s.base = None;
        None
    }

    /// The size of `f` as this mount has it.
    pub(crate) fn size_of(&self, f: &OpenFile) -> Result<u64, Errno> {
        if let Some(len) = self.spool_view(f).and_then(|s| s.metadata().ok()).map(|m| m.len()) {
            return Ok(len);
        }
        Ok(self.stat(&f.path())?.size)
    }

    /// The spool of `f`, made if it has none: downloaded from the filer, or empty when the
    /// caller is about to empty it (`empty`), without reading bytes that would be thrown away.
    pub(crate) fn spool(&self, f: &OpenFile, empty: bool) -> Result<Arc<std::fs::File>, Errno> {
        if let Some(s) = self.spool_view(f) {
            return Ok(s);
        }
        let _transfer = f.transfer();
        if let Some(s) = f.state().spool.clone() {
            return Ok(s);
        }
        let path = f.path();
        let (file, base) = if empty {
            (new_spool()?, self.stat(&path).ok().map(|e| e.version))
        } else {
            let (file, version) = self.download(&path)?;
            (file, Some(version))
        };
        let mut s = f.state();
        let spool = s.spool.get_or_insert_with(|| Arc::new(file)).clone();
        s.base = base;
        Ok(spool)
    }

    /// The whole content of `p` into a new spool file, and the version it is of.
    fn download(&self, p: &str) -> Result<(std::fs::File, u64), Errno> {
        use std::io::Write;
        let mut f = new_spool()?;
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        let (e, mut s) = self.call("read", self.filer.read(p, None))?;
        if e.size == 0 {
            return Ok((f, e.version));
        }
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
        Ok((f, e.version))
    }

    /// Stores what `f`'s spool holds that the filer does not (nothing if it holds nothing new,
    /// or the file's name is gone). Changes made while the upload moves leave it dirty: the
    /// next flush or close stores them.
    pub(crate) fn upload(&self, f: &OpenFile) -> Result<(), Errno> {
        let _transfer = f.transfer();
        let (spool, path, changes, mtime_ms) = {
            let s = f.state();
            match &s.spool {
                Some(spool) if s.dirty && s.unlinked.is_none() => {
                    (spool.clone(), s.path.clone(), s.changes, s.mtime_ms)
                }
                _ => return Ok(()),
            }
        };
        let progress = Progress::default();
        // A file with holes (a write far past its end, a punched hole) sends its data only.
        let sparse = sparse_layout(&spool);
        let body = match &sparse {
            Some(layout) => {
                progress.allow(hashing_allowance(layout.size - layout.data_len()));
                progress.counting(sparse_stream(spool, layout))
            }
            None => progress.counting(spool_stream(spool)),
        };
        let counters = self.counters.clone();
        let body = body
            .inspect(move |part| {
                if let Ok(b) = part {
                    counters.sent.fetch_add(b.len() as u64, Ordering::Relaxed);
                }
            })
            .boxed();
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        // The file's mtime is when its bytes last changed, not when they were stored.
        let opts = WriteOptions { mtime_ms, sparse, ..Default::default() };
        let e = self.call_within("write", self.filer.write(&path, body, opts), Errno::EAGAIN, &progress)?;
        {
            let mut s = f.state();
            if s.changes == changes {
                s.dirty = false;
                s.mtime_ms = None;
            }
            s.base = Some(e.version);
        }
        self.forget(&path);
        self.inodes().remember(e);
        Ok(())
    }

    /// What the mount holds of the file `e` names, over what the filer says: its spool's size
    /// and the time of its unsaved changes.
    pub(crate) fn overlay(&self, e: &mut Entry) {
        let Some(f) = self.open_file(&e.path) else { return };
        let Some(spool) = self.spool_view(&f) else { return };
        let s = f.state();
        if let Ok(m) = spool.metadata() {
            e.size = m.len();
        }
        if let Some(t) = s.mtime_ms.filter(|_| s.dirty) {
            e.mtime_ms = t;
            e.posix.ctime_ms = Some(e.posix.ctime_ms.unwrap_or(t).max(t));
        }
    }

    /// After the last close of `f` failed to store its bytes (`why`): a copy of them in the
    /// unsaved directory (0700), named for the time and the file, and a log line saying where.
    pub(crate) fn keep_unsaved(&self, f: &OpenFile, why: Errno) {
        let (spool, path) = {
            let s = f.state();
            match &s.spool {
                Some(spool) if s.dirty && s.unlinked.is_none() => (spool.clone(), s.path.clone()),
                _ => return,
            }
        };
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        let mut file = path.trim_start_matches('/').replace('/', "%2F");
        // A name's length is limited (255 bytes): the end of a long path is kept, the whole
        // path is in the log line.
        while file.len() > 180 {
            file.remove(0);
        }
        let stamp = tidemark_core::format_rfc3339_ms(now);
        let why = std::io::Error::from_raw_os_error(why.code());
        let mut to = self.opts.unsaved_dir.join(format!("{stamp}-{file}"));
        let kept = (|| -> std::io::Result<u64> {
            use std::io::Write;
            use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&self.opts.unsaved_dir)?;
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
            let (mut buf, mut at) = (vec![0u8; 1 << 20], 0u64);
            loop {
                let n = spool.read_at(&mut buf, at)?;
                if n == 0 {
                    break;
                }
                out.write_all(&buf[..n])?;
                at += n as u64;
            }
            out.sync_all()?;
            Ok(at)
        })();
        match kept {
            Ok(n) => tracing::error!(
                path,
                kept = %to.display(),
                "the last close of {path} could not store its {n} bytes ({why}); they are kept in {}: copy them back once the filer is reachable",
                to.display()
            ),
            Err(e) => tracing::error!(
                path,
                "the last close of {path} could not store its bytes ({why}), nor keep them in {} ({e}): they are lost",
                self.opts.unsaved_dir.display()
            ),
        }
    }

    /// Before the last name of the file at `p` goes (an unlink, or a rename over it): the file,
    /// if handles are open on it, with its bytes in its spool (a file open when its name goes
    /// stays readable until its last close) — unless every handle reads the filer's own file,
    /// which stays while they hold it open.
    pub(crate) fn keep_open_bytes(&self, p: &str) -> Option<Arc<OpenFile>> {
        let f = self.open_file(p)?;
        let all_local = self.handles_of(&f).iter().all(|h| h.local.is_some() || h.io == Io::Passthrough);
        if !all_local && let Err(e) = self.spool(&f, false) {
            tracing::warn!(
                path = p,
                "the bytes of a file open when its name went could not be kept ({e:?}): its handles' reads fail"
            );
        }
        Some(f)
    }

    /// After the name of `f` (whose entry was `e`) went: its handles keep what they hold, and
    /// write nowhere; a new file at the name is another file.
    pub(crate) fn unlinked(&self, f: &Arc<OpenFile>, e: &Entry) {
        let ino = self.inodes().known_ino(&e.path);
        let mut files = self.files();
        let mut s = f.state();
        s.unlinked = Some((ino.unwrap_or(0), e.clone()));
        if files.get(&s.path).is_some_and(|g| Arc::ptr_eq(g, f)) {
            files.remove(&s.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A spool with holes is uploaded as its data ranges (the tmp file system here knows holes:
    /// a punched hole reads as one), and their bytes — zeros where the spool shrank meanwhile.
    #[test]
    fn a_spool_with_holes_is_sent_as_its_data() {
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(b"tail", (8 << 20) - 4).unwrap();
        let Some(layout) = sparse_layout(&f) else {
            eprintln!("this file system keeps no holes: nothing to check");
            return;
        };
        assert_eq!(layout.size, 8 << 20);
        assert_eq!(layout.data_len() % 4096, 0, "whole blocks: {layout:?}");
        assert!(layout.data_len() < 1 << 20 && layout.data.len() == 2, "{layout:?}");
        let f = Arc::new(f);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let body: Vec<u8> = rt.block_on(async {
            let parts: Vec<Bytes> = sparse_stream(f.clone(), &layout).map(|p| p.unwrap()).collect().await;
            parts.concat()
        });
        assert_eq!(body.len() as u64, layout.data_len());
        assert!(body.starts_with(b"head") && body.ends_with(b"tail"));
        // Shrunk while it is sent: the layout's ranges still come whole.
        f.set_len(2).unwrap();
        let n: u64 = rt.block_on(
            sparse_stream(f.clone(), &layout).map(|p| p.unwrap().len() as u64).fold(0, |a, b| async move { a + b }),
        );
        assert_eq!(n, layout.data_len());
        // Few holes: sent whole.
        let dense = tempfile::tempfile().unwrap();
        dense.write_all_at(&vec![1u8; 1 << 20], 0).unwrap();
        dense.write_all_at(b"x", (1 << 20) + 4096).unwrap();
        assert!(sparse_layout(&dense).is_none());
    }
}

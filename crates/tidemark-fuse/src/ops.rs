//! The mount's operations: each takes what the kernel asked and returns its answer or an errno
//! (`Result<_, Errno>`), over the filer's API. `fuse.rs` hands them the kernel's requests and
//! sends their answers; the tests call them directly, without a kernel.
//!
//! Reads stream from the filer (sequential reads of one handle share one ranged stream; the
//! filer serves remote-backed files from its content cache). Changes — writes, truncates,
//! `fallocate`, `copy_file_range` — go to the file's spool, which every handle open on the file
//! shares (`open.rs`), and become one `Filer::write` on flush, fsync or close: the file appears
//! to others whole, at close (close-to-open, as NFS), and the last close wins.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileHandle, FileType, FopenFlags, INodeNo, RenameFlags, TimeOrNow};
use futures::StreamExt;

use tidemark_core::model::{Content, EntryKind, INODES_DIR, NewEntry, Origin, Precondition, Txn, inode_path};
use tidemark_core::{ByteRange, ByteStream, DeleteOptions, Entry, Error, Filer, WriteOptions, path};

use crate::inodes::{Inodes, ROOT_INO};
use crate::open::{Handle, Io, IoModes, OpenFile, is_sealed, zero_range};
use crate::read::{Answer, GATHERED, read_file_at, read_range};

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
    /// The bytes of file content uploaded to the filer (a sparse file's data, not its holes).
    pub sent: AtomicU64,
}

impl Counters {
    pub fn line(&self) -> String {
        format!(
            "filer calls: {} listings, {} stats, {} reads, {} writes; {} bytes sent; {} invalidations; {} passthrough opens, {} local opens",
            self.lists.load(Ordering::Relaxed),
            self.stats.load(Ordering::Relaxed),
            self.reads.load(Ordering::Relaxed),
            self.writes.load(Ordering::Relaxed),
            self.sent.load(Ordering::Relaxed),
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

/// Who asks: the user and group an operation acts for (a new entry's owner).
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
}

/// What a `setattr` changes (`None`: left as it is).
#[derive(Debug, Clone, Copy, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
}

/// An open's answer: the handle, how the kernel is to do its I/O, and whether it reads the
/// inode's backing file (passthrough; see [`TidemarkFs::with_backing`]).
#[derive(Debug, Clone, Copy)]
pub struct Opened {
    pub fh: FileHandle,
    pub flags: FopenFlags,
    pub backed: bool,
}

/// Faults the reference-model test plants to show it catches them (`model_test.rs`).
#[cfg(test)]
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Bugs {
    /// `stat` by name or inode answers the filer's size, not an open file's (the stale size
    /// fsx found).
    pub stale_size: bool,
    /// A rename leaves the files open under the old name there: their writes are stored
    /// under the old name at close.
    pub rename_keeps_open_files: bool,
}

pub struct TidemarkFs {
    pub(crate) filer: Arc<dyn Filer>,
    pub(crate) rt: tokio::runtime::Handle,
    pub(crate) inodes: Arc<Mutex<Inodes>>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    /// The files handles are open on, by path (see `open.rs`).
    files: Mutex<HashMap<String, Arc<OpenFile>>>,
    next_fh: AtomicU64,
    pub(crate) opts: Options,
    pub(crate) counters: Arc<Counters>,
    uid: u32,
    gid: u32,
    io: Mutex<IoModes>,
    /// Passthrough is on: asked for, offered by the kernel, and not yet found impossible (the
    /// filer's files not reachable from here, or the kernel refusing a backing file).
    pub(crate) passthrough: AtomicBool,
    /// Reads of the filer's files from here are on: asked for (as passthrough is), and not yet
    /// found impossible (the mount is on another machine).
    pub(crate) local_reads: AtomicBool,
    /// The filer names files for its blobs: not when it keeps them on an object store (its
    /// content cache's files it names still).
    pub(crate) blob_files: AtomicBool,
    #[cfg(test)]
    pub(crate) bugs: Bugs,
}

pub(crate) fn errno(e: &Error) -> Errno {
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
        // The bucket refuses this cluster the bytes for good (SSE-C, a KMS key denied).
        Error::Unreadable { .. } => Errno::EACCES,
        Error::TooLarge { .. } => Errno::EFBIG,
        _ => Errno::EIO,
    }
}

/// A spool's I/O error as the errno the program sees (a full temporary directory is ENOSPC).
fn spool_err(e: std::io::Error) -> Errno {
    tracing::warn!(error = %e, "a spool file (in TMPDIR) failed");
    match e.raw_os_error() {
        Some(libc::ENOSPC) => Errno::ENOSPC,
        Some(libc::EFBIG) => Errno::EFBIG,
        _ => Errno::EIO,
    }
}

/// User extended attributes (`user.*`) are kept among the entry's extended attributes under this
/// prefix, their values in base64: an xattr's value is bytes, the entry's attributes are text.
/// The filer's limit on an entry's extended attributes bounds them.
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

pub(crate) fn ms_of(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn at(t: TimeOrNow) -> i64 {
    match t {
        TimeOrNow::SpecificTime(t) => ms_of(t),
        TimeOrNow::Now => ms_of(SystemTime::now()),
    }
}

/// Applies the attributes `set` names to `e`; `mtime` is the time still to store (none when
/// it went to an open file's unsaved changes). Sets nothing when `set` names no attribute.
fn set_attrs(e: &mut Entry, set: &SetAttr, mtime: Option<TimeOrNow>) {
    if set.mode.is_none() && set.uid.is_none() && set.gid.is_none() && set.atime.is_none() && mtime.is_none() {
        return;
    }
    if let Some(m) = set.mode {
        e.mode = m & 0o7777;
    }
    if set.uid.is_some() {
        e.posix.uid = set.uid;
    }
    if set.gid.is_some() {
        e.posix.gid = set.gid;
    }
    // Every change of attributes is a change of status.
    e.posix.ctime_ms = Some(ms_of(SystemTime::now()));
    // The atime is kept apart only once set: until then it reads as the mtime.
    let atime_before = e.posix.atime_ms.unwrap_or(e.mtime_ms);
    if let Some(t) = mtime {
        e.mtime_ms = at(t);
    }
    if set.atime.is_some() || mtime.is_some() {
        e.posix.atime_ms = Some(set.atime.map_or(atime_before, at));
    }
}

fn name_of(name: &OsStr) -> Result<&str, Errno> {
    let n = name.to_str().ok_or(Errno::EINVAL)?;
    match path::segment_problem(n) {
        None => Ok(n),
        Some(_) if n.len() > path::MAX_NAME_BYTES => Err(Errno::ENAMETOOLONG),
        Some(_) => Err(Errno::EINVAL),
    }
}

/// The most one `copy_file_range` copies (its answer is a 32-bit count; the caller asks again
/// for the rest).
const COPY_MAX: u64 = 1 << 30;
/// The piece a copy moves at a time.
const COPY_PIECE: u64 = 4 << 20;

impl TidemarkFs {
    pub fn new(filer: Arc<dyn Filer>, rt: tokio::runtime::Handle, root: &str, opts: Options) -> Self {
        TidemarkFs {
            filer,
            rt,
            inodes: Arc::new(Mutex::new(Inodes::new(root))),
            handles: Mutex::new(HashMap::new()),
            files: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            counters: Arc::new(Counters::default()),
            uid: unsafe { libc::getuid() },
            gid: unsafe { libc::getgid() },
            io: Mutex::new(IoModes::default()),
            passthrough: AtomicBool::new(false),
            local_reads: AtomicBool::new(opts.passthrough),
            blob_files: AtomicBool::new(true),
            opts,
            #[cfg(test)]
            bugs: Bugs::default(),
        }
    }

    pub(crate) fn io(&self) -> MutexGuard<'_, IoModes> {
        self.io.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn files(&self) -> MutexGuard<'_, HashMap<String, Arc<OpenFile>>> {
        self.files.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn handles_map(&self) -> MutexGuard<'_, HashMap<u64, Arc<Handle>>> {
        self.handles.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops passing files through for the rest of the session, saying why once.
    pub(crate) fn no_passthrough(&self, why: &str) {
        if self.passthrough.swap(false, Ordering::Relaxed) {
            tracing::info!("FUSE passthrough off: {why}; reads go through the mount");
        }
    }

    /// Whether the kernel may read a file opened read-only from the filer's file itself: a
    /// read-only mount (see [`Io`]), passthrough on.
    pub(crate) fn can_pass(&self) -> bool {
        self.opts.read_only && self.passthrough.load(Ordering::Relaxed)
    }

    /// Stops reading the filer's files from here for the rest of the session, saying why once.
    pub(crate) fn no_local_reads(&self, why: &str) {
        if self.local_reads.swap(false, Ordering::Relaxed) {
            tracing::info!("reads of the filer's files from here off: {why}; reads go through the filer's API");
        }
    }

    /// Runs one filer call on the runtime, within the timeout.
    pub(crate) fn call<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = tidemark_core::Result<T>>,
    ) -> Result<T, Errno> {
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
    pub(crate) fn call_within<T>(
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

    pub(crate) fn inodes(&self) -> MutexGuard<'_, Inodes> {
        self.inodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn path_of(&self, ino: INodeNo) -> Result<String, Errno> {
        self.inodes().path(ino.0).map(str::to_string).ok_or(Errno::ENOENT)
    }

    pub(crate) fn attr(&self, e: &Entry) -> FileAttr {
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

    /// The owner and group of an entry `caller` creates in `parent`, and the mode bits it
    /// inherits: the group of a set-group-ID directory, and for a directory its set-group-ID
    /// bit too.
    fn owner_in(&self, caller: Caller, parent: INodeNo, dir: bool) -> Result<(u32, u32, u32), Errno> {
        let p = self.path_of(parent)?;
        let pe = self.stat(&p)?;
        if pe.mode & libc::S_ISGID != 0 {
            let gid = pe.posix.gid.unwrap_or(self.gid);
            return Ok((caller.uid, gid, if dir { libc::S_ISGID } else { 0 }));
        }
        Ok((caller.uid, caller.gid, 0))
    }

    /// The entry of `p`: remembered, or read from the filer.
    pub(crate) fn stat(&self, p: &str) -> Result<Entry, Errno> {
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

    /// The entry of `p` as this mount has it: the filer's, with what an open file holds that
    /// the filer does not yet (its size, the time of its unsaved changes).
    fn stat_open(&self, p: &str) -> Result<Entry, Errno> {
        let mut e = self.stat(p)?;
        #[cfg(test)]
        if self.bugs.stale_size {
            return Ok(e);
        }
        self.overlay(&mut e);
        Ok(e)
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
    pub(crate) fn forget(&self, p: &str) {
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

    fn handle(&self, fh: FileHandle) -> Result<Arc<Handle>, Errno> {
        self.handles_map().get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    fn add_handle(&self, h: Handle) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles_map().insert(fh, Arc::new(h));
        FileHandle(fh)
    }

    /// A new entry `n` at `p` in directory `parent`, owned by `caller` (with the group of a
    /// set-group-ID directory, whose bit a new directory takes too): one transaction, which
    /// also sets the directory's times. EEXIST if the name is taken.
    fn make(&self, caller: Caller, parent: INodeNo, p: &str, mut n: NewEntry) -> Result<Entry, Errno> {
        let (uid, gid, inherited) = self.owner_in(caller, parent, n.kind == EntryKind::Dir)?;
        n.mode |= inherited;
        n.posix.uid = Some(uid);
        n.posix.gid = Some(gid);
        self.put_entry(p, n, Precondition::Absent)
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

    /// Stores what the file open at `p` (if any) holds that the filer does not.
    fn flush_path(&self, p: &str) -> Result<(), Errno> {
        match self.open_file(p) {
            Some(f) => self.upload(&f),
            None => Ok(()),
        }
    }

    /// The attributes of `f` if its name went while it was open: no links, the spool's size.
    fn unlinked_attr_of(&self, f: &OpenFile) -> Option<FileAttr> {
        let (ino, e, len) = {
            let s = f.state();
            let (ino, mut e) = s.unlinked.clone()?;
            // The time of its unsaved changes (or a `utime` since), as while it had a name.
            if let Some(t) = s.mtime_ms.filter(|_| s.dirty) {
                e.mtime_ms = t;
                e.posix.ctime_ms = Some(e.posix.ctime_ms.unwrap_or(t).max(t));
            }
            (ino, e, s.spool_len())
        };
        let mut a = self.attr(&e);
        (a.ino, a.nlink) = (INodeNo(ino), 0);
        if let Some(len) = len {
            a.size = len;
        }
        Some(a)
    }

    /// The attributes of inode `ino` as a handle that outlived its name sees them.
    fn unlinked_attr(&self, ino: u64) -> Option<FileAttr> {
        let all: Vec<_> = self.handles_map().values().cloned().collect();
        all.iter()
            .filter(|h| h.file.state().unlinked.as_ref().is_some_and(|(i, _)| *i == ino))
            .find_map(|h| self.unlinked_attr_of(&h.file))
    }

    /// Refuses a change to an object the S3 gateway stored encrypted, unless it was emptied
    /// first (then its spool is plain bytes of its own): a partial overwrite would store
    /// ciphertext and plaintext mixed as if they were the object.
    fn changeable(&self, f: &OpenFile) -> Result<(), Errno> {
        if f.state().spool.is_some() {
            return Ok(());
        }
        if is_sealed(&self.stat(&f.path())?) { Err(Errno::EACCES) } else { Ok(()) }
    }

    /// Sets the size of `f`'s bytes (its spool) to `size`.
    fn truncate(&self, f: &OpenFile, size: u64) -> Result<(), Errno> {
        if size != 0 {
            self.changeable(f)?;
        }
        let before = self.size_of(f)?;
        let spool = self.spool(f, size == 0)?;
        let mut s = f.state();
        spool.set_len(size).map_err(spool_err)?;
        if before != size {
            s.touch();
        }
        Ok(())
    }

    /// Bytes `offset..offset + len` of the file `h` reads (fewer at its end), for a copy.
    fn read_for_copy(&self, h: &Handle, offset: u64, len: u64) -> Result<Vec<u8>, Errno> {
        let local = self.spool_view(&h.file);
        if let Some(f) = local.as_deref().or(h.local.as_ref()) {
            let mut buf = Vec::new();
            read_file_at(f, offset, len as u32, &mut buf).map_err(spool_err)?;
            return Ok(buf);
        }
        let path = h.file.path();
        if is_sealed(&self.stat(&path)?) {
            return Err(Errno::EACCES);
        }
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        let range = ByteRange { offset, length: Some(len) };
        Ok(self.rt.block_on(read_range(self.filer_read(&path, &h.changed, range)))?.to_vec())
    }
}

/// The operations, as the kernel asks for them.
impl TidemarkFs {
    pub fn lookup(&self, parent: INodeNo, name: &OsStr) -> Result<FileAttr, Errno> {
        let name = name_of(name)?;
        let p = self.inodes().child(parent.0, name).ok_or(Errno::ENOENT)?;
        if p == INODES_DIR {
            return Err(Errno::ENOENT);
        }
        Ok(self.attr(&self.stat_open(&p)?))
    }

    pub fn getattr(&self, ino: INodeNo, fh: Option<FileHandle>) -> Result<FileAttr, Errno> {
        // A file whose name went while it was open is still there for its handles.
        if let Some(a) = fh.and_then(|fh| self.handle(fh).ok()).and_then(|h| self.unlinked_attr_of(&h.file)) {
            return Ok(a);
        }
        let unlinked = || self.unlinked_attr(ino.0).ok_or(Errno::ENOENT);
        let Ok(p) = self.path_of(ino) else { return unlinked() };
        match self.stat_open(&p) {
            Err(Errno::ENOENT) => unlinked(),
            r => Ok(self.attr(&r?)),
        }
    }

    /// Changes what `set` names. A size set through a handle (`ftruncate`, `open(O_TRUNC)`)
    /// changes the file's spool, stored with its other changes; one set by path (`truncate`)
    /// is stored at once.
    pub fn setattr(&self, ino: INodeNo, set: SetAttr, fh: Option<FileHandle>) -> Result<FileAttr, Errno> {
        let handle = fh.and_then(|fh| self.handle(fh).ok());
        let p = match (self.path_of(ino), &handle) {
            (Ok(p), _) => p,
            (Err(_), Some(h)) => h.file.path(),
            (Err(e), None) => return Err(e),
        };
        let mut attrs = set.mode.is_some() || set.atime.is_some() || set.uid.is_some() || set.gid.is_some();
        if attrs || set.size.is_some() || set.mtime.is_some() {
            self.writable()?;
        }
        if let Some(size) = set.size {
            let (f, by_path) = match &handle {
                Some(h) => (h.file.clone(), false),
                None => (self.attach(&p), true),
            };
            let r = self.truncate(&f, size).and_then(|()| if by_path { self.upload(&f) } else { Ok(()) });
            if by_path {
                self.detach(&f);
            }
            r?;
        }
        // The time of an open file's unsaved changes is kept with them, and stored with them:
        // stored now, the upload at close would set it again.
        let mut mtime = set.mtime;
        if let Some(t) = mtime {
            let open = handle.as_ref().map(|h| h.file.clone()).or_else(|| self.open_file(&p));
            if let Some(f) = open {
                let mut s = f.state();
                if s.dirty {
                    s.mtime_ms = Some(at(t));
                    mtime = None;
                }
            }
        }
        // A file whose name went while it was open has its attributes only here, in memory.
        if let Some(h) = &handle {
            let mut s = h.file.state();
            if let Some((_, e)) = s.unlinked.as_mut() {
                set_attrs(e, &set, mtime);
            }
        }
        if let Some(a) = handle.as_ref().and_then(|h| self.unlinked_attr_of(&h.file)) {
            return Ok(a);
        }
        attrs |= mtime.is_some();
        let mut e = self.stat(&p)?;
        if attrs {
            let mut changed = e.clone();
            set_attrs(&mut changed, &set, mtime);
            e = self.put_entry(&e.path.clone(), changed.to_new(), Precondition::Version(e.version))?;
        }
        self.overlay(&mut e);
        Ok(self.attr(&e))
    }

    pub fn mkdir(
        &self,
        caller: Caller,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> Result<FileAttr, Errno> {
        self.writable()?;
        let p = self.inodes().child(parent.0, name_of(name)?).ok_or(Errno::ENOENT)?;
        let mut d = NewEntry::dir(ms_of(SystemTime::now()));
        d.mode = mode & !umask & 0o7777;
        Ok(self.attr(&self.make(caller, parent, &p, d)?))
    }

    pub fn mknod(
        &self,
        caller: Caller,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<FileAttr, Errno> {
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
        Ok(self.attr(&self.make(caller, parent, &p, n)?))
    }

    pub fn symlink(
        &self,
        caller: Caller,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
    ) -> Result<FileAttr, Errno> {
        self.writable()?;
        let p = self.inodes().child(parent.0, name_of(link_name)?).ok_or(Errno::ENOENT)?;
        // The namespace keeps names and targets as UTF-8.
        let target = target.to_str().ok_or(Errno::EINVAL)?;
        if target.len() > tidemark_core::model::MAX_SYMLINK_TARGET {
            return Err(Errno::ENAMETOOLONG);
        }
        Ok(self.attr(&self.make(caller, parent, &p, NewEntry::symlink(target, ms_of(SystemTime::now())))?))
    }

    pub fn readlink(&self, ino: INodeNo) -> Result<String, Errno> {
        let e = self.stat(&self.path_of(ino)?)?;
        e.posix.target.filter(|_| e.kind == EntryKind::Symlink).ok_or(Errno::EINVAL)
    }

    pub fn setxattr(&self, ino: INodeNo, name: &OsStr, value: &[u8], flags: i32) -> Result<(), Errno> {
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
        self.put_entry(&e.path, n, Precondition::Version(e.version)).map(drop)
    }

    /// The value of xattr `name`. (Asked by the kernel before writes, `security.capability`:
    /// answered without a lookup.)
    pub fn getxattr(&self, ino: INodeNo, name: &OsStr) -> Result<Vec<u8>, Errno> {
        let key = xattr_key(name).map_err(|_| Errno::ENODATA)?;
        let e = self.stat(&self.path_of(ino)?)?;
        let v = e.extended.get(&key).ok_or(Errno::ENODATA)?;
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, v).map_err(|_| Errno::EIO)
    }

    /// The names of the xattrs, each ending in a NUL.
    pub fn listxattr(&self, ino: INodeNo) -> Result<Vec<u8>, Errno> {
        let e = self.stat(&self.path_of(ino)?)?;
        let mut names = Vec::new();
        for k in e.extended.keys().filter_map(|k| k.strip_prefix(XATTR_PREFIX)) {
            names.extend_from_slice(k.as_bytes());
            names.push(0);
        }
        Ok(names)
    }

    pub fn removexattr(&self, ino: INodeNo, name: &OsStr) -> Result<(), Errno> {
        let key = xattr_key(name).map_err(|_| Errno::ENODATA)?;
        self.writable()?;
        let p = self.path_of(ino)?;
        let e = self.stat(&p)?;
        let mut n = e.to_new();
        n.extended.remove(&key).ok_or(Errno::ENODATA)?;
        n.posix.ctime_ms = Some(ms_of(SystemTime::now()));
        self.put_entry(&e.path, n, Precondition::Version(e.version)).map(drop)
    }

    /// A second name: one transaction, which the first time moves the file to its inode entry
    /// (the kernel's inode for it then names that entry). Where a file cannot have a second
    /// name — a directory, a remote mount — EPERM, as link(2) answers there.
    pub fn link(&self, ino: INodeNo, newparent: INodeNo, newname: &OsStr) -> Result<FileAttr, Errno> {
        self.writable()?;
        let from = self.path_of(ino)?;
        let to = self.inodes().child(newparent.0, name_of(newname)?).ok_or(Errno::ENOENT)?;
        if self.stat(&from)?.is_dir() {
            return Err(Errno::EPERM);
        }
        // What is written and not yet stored goes first: the file moves. Its uploads wait
        // until it has.
        self.flush_path(&from)?;
        let open = self.open_file(&from);
        let _held = open.as_ref().map(|f| f.transfer());
        let txn = Txn::link(from.clone(), to.clone(), Origin::Local).with_dir_times();
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        let applied = match self.call_or("link", self.filer.apply(txn), Errno::EEXIST) {
            Err(Errno::EXDEV | Errno::EISDIR) => Err(Errno::EPERM),
            r => r,
        }?;
        let inode = applied.new.ok_or(Errno::EIO)?;
        if inode.path != from {
            // The file moved to its inode entry: its open state and its inode number follow.
            self.files_renamed(&from, &inode.path);
            self.inodes().renamed(&from, &inode.path);
        }
        self.forget(&to);
        self.forget(&inode.path);
        self.dirs_changed(&applied.dirs);
        self.inodes().remember(inode.clone());
        let mut inode = inode;
        self.overlay(&mut inode);
        Ok(self.attr(&inode))
    }

    pub fn unlink(&self, parent: INodeNo, name: &OsStr) -> Result<(), Errno> {
        self.remove(parent, name, false)
    }

    pub fn rmdir(&self, parent: INodeNo, name: &OsStr) -> Result<(), Errno> {
        self.remove(parent, name, true)
    }

    pub fn rename(
        &self,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
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
        let replaced = gone
            .as_ref()
            .filter(|g| !g.is_dir() && g.posix.nlink.unwrap_or(1) <= 1)
            .and_then(|g| self.keep_open_bytes(&g.path));
        // A hard-linked file's inode entry, whose ctime the rename sets.
        let linked = self.stat(&from).ok().map(|e| e.path).filter(|p| *p != from);
        // An upload to an old name must not land after the rename (it would make the old name
        // again): the files that move, and the one replaced, finish theirs first and start none
        // until the rename is done. (In one order, their addresses', so that two renames never
        // wait on each other.)
        let mut moving = self.files_at_or_below(&from);
        moving.extend(replaced.clone());
        moving.sort_by_key(|f| Arc::as_ptr(f) as usize);
        moving.dedup_by_key(|f| Arc::as_ptr(f) as usize);
        let held: Vec<_> = moving.iter().map(|f| f.transfer()).collect();
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
            Err(Errno::EXDEV) => {
                drop(held);
                self.rename_by_copy(&from, &to, to_precondition)
            }
            r => r.map(|a| self.dirs_changed(&a.dirs)),
        };
        if let Err(e) = renamed {
            self.forget(&from);
            self.forget(&to);
            return Err(e);
        }
        if let Some(gone) = &gone {
            if let Some(f) = &replaced {
                self.unlinked(f, gone);
            }
            if gone.path != to {
                self.forget(&gone.path);
            }
        }
        if let Some(inode) = &linked {
            self.forget(inode);
        }
        // Files open below the old name are stored at the new one at their close.
        #[cfg(test)]
        let keep = self.bugs.rename_keeps_open_files;
        #[cfg(not(test))]
        let keep = false;
        if !keep {
            self.files_renamed(&from, &to);
        }
        // The kernel moves the source's inode to the new name: so must the inode table.
        self.inodes().renamed(&from, &to);
        Ok(())
    }

    /// Opens inode `ino` with `flags` (`open(2)`'s). `backing` registers a file of the filer's
    /// with the kernel, for a handle it reads itself (passthrough).
    pub fn open(
        &self,
        ino: INodeNo,
        flags: i32,
        backing: &dyn Fn(&std::fs::File) -> std::io::Result<fuser::BackingId>,
    ) -> Result<Opened, Errno> {
        let p = self.path_of(ino)?;
        let e = self.stat(&p)?;
        if e.is_dir() {
            return Err(Errno::EISDIR);
        }
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let trunc = flags & libc::O_TRUNC != 0;
        // An object the S3 gateway stored encrypted (SSE) is ciphertext here: it is not
        // served as if it were its bytes, nor partly overwritten; replaced whole (truncated
        // first), it is a new, unencrypted file.
        if is_sealed(&e) && !trunc && !write && self.open_file(&e.path).is_none_or(|f| f.state().spool.is_none()) {
            tracing::info!(path = %p, "refused: encrypted by the S3 gateway (SSE); read it through the gateway");
            return Err(Errno::EACCES);
        }
        if write {
            self.writable()?;
        }
        let f = self.attach(&e.path);
        if write
            && trunc
            && let Err(err) = self.truncate(&f, 0)
        {
            self.detach(&f);
            return Err(err);
        }
        // A file this mount holds changes of is read from them, not from the filer's file.
        let local = if write || f.state().spool.is_some() { None } else { self.local_file(&e) };
        let (io, local) = self.choose_io(ino.0, local, backing);
        let h = Handle { file: f, ino: ino.0, io, reader: Mutex::new(None), changed: Arc::default(), local };
        let fh = self.add_handle(h);
        let (backed, flags) = {
            let modes = self.io();
            let (b, flags) = modes.reply_flags(ino.0, io, write);
            (b.is_some(), flags)
        };
        if io == Io::Passthrough {
            self.counters.passthrough.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Opened { fh, flags, backed })
    }

    /// Calls `f` with the backing file of inode `ino` (see [`Opened::backed`]).
    pub fn with_backing<T>(&self, ino: INodeNo, f: impl FnOnce(Option<&fuser::BackingId>) -> T) -> T {
        let modes = self.io();
        f(modes.passed.get(&ino.0).map(|p| &p.backing))
    }

    /// Creates and opens a file (the kernel asks for a name it found absent; made meanwhile by
    /// someone else, it is opened emptied, unless `O_EXCL`).
    pub fn create(
        &self,
        caller: Caller,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(FileAttr, FileHandle), Errno> {
        self.writable()?;
        let p = self.inodes().child(parent.0, name_of(name)?).ok_or(Errno::ENOENT)?;
        let perm = mode & !umask & 0o7777;
        let mut n = empty_file();
        n.mode = perm;
        let e = match self.make(caller, parent, &p, n) {
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
        let f = self.attach(&e.path);
        // Its spool is there from the start: there is nothing to download.
        if let Err(err) = self.truncate(&f, 0) {
            self.detach(&f);
            return Err(err);
        }
        let a = self.attr(&e);
        // (Never in a read-only mount, the only kind that passes files through.)
        let io = self.io().not_passed(a.ino.0);
        let h = Handle { file: f, ino: a.ino.0, io, reader: Mutex::new(None), changed: Arc::default(), local: None };
        Ok((a, self.add_handle(h)))
    }

    /// Up to `size` bytes at `offset`: from the file's spool while the mount holds its bytes,
    /// else from the filer's file on this machine, else through the filer.
    pub fn read(&self, fh: FileHandle, offset: u64, size: u32) -> Result<Answer, Errno> {
        let h = self.handle(fh)?;
        let mut reader = h.reader();
        let spool = self.spool_view(&h.file);
        if let Some(f) = spool.as_deref().or(h.local.as_ref()) {
            *reader = None;
            return GATHERED.with_borrow_mut(|g| read_file_at(f, offset, size, g)).map(|()| Answer::Gathered).map_err(
                |e| {
                    tracing::warn!(path = h.file.path(), error = %e, "read of a local file failed");
                    Errno::EIO
                },
            );
        }
        let path = h.file.path();
        if is_sealed(&self.stat(&path)?) {
            return Err(Errno::EACCES); // the encrypted object's bytes are not its plaintext
        }
        self.read_from_filer(&path, &mut reader, &h.changed, offset, size)
    }

    pub fn write(&self, fh: FileHandle, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let h = self.handle(fh)?;
        self.changeable(&h.file)?;
        let spool = self.spool(&h.file, false)?;
        let mut s = h.file.state();
        spool.write_all_at(data, offset).map_err(spool_err)?;
        s.touch();
        Ok(data.len() as u32)
    }

    /// At each `close(2)` of a descriptor: the file's changes are stored.
    pub fn flush(&self, fh: FileHandle) -> Result<(), Errno> {
        self.upload(&self.handle(fh)?.file)
    }

    pub fn fsync(&self, fh: FileHandle) -> Result<(), Errno> {
        self.upload(&self.handle(fh)?.file)
    }

    /// `fallocate(2)`: reserving space (mode 0) grows the file to `offset + length` if it is
    /// shorter; `KEEP_SIZE` alone reserves nothing the namespace could keep; `PUNCH_HOLE`
    /// (with `KEEP_SIZE`, as Linux requires) and `ZERO_RANGE` make the range read as zeros,
    /// the latter growing the file unless `KEEP_SIZE`. Other modes (collapsing or inserting
    /// ranges, unsharing) are `EOPNOTSUPP`.
    pub fn fallocate(&self, fh: FileHandle, offset: u64, length: u64, mode: i32) -> Result<(), Errno> {
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE;
        const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;
        let h = self.handle(fh)?;
        let f = &h.file;
        let end = offset.checked_add(length).ok_or(Errno::EFBIG)?;
        let zeroes = match mode {
            0 => false,
            KEEP => return Ok(()),
            m if m == PUNCH | KEEP || m == ZERO || m == ZERO | KEEP => true,
            _ => return Err(Errno::EOPNOTSUPP),
        };
        let keep = mode & KEEP != 0;
        let size = self.size_of(f)?;
        let grows = !keep && end > size;
        if !grows && (!zeroes || offset >= size) {
            return Ok(());
        }
        self.changeable(f)?;
        let spool = self.spool(f, false)?;
        let mut s = f.state();
        let len = spool.metadata().map_err(spool_err)?.len();
        if zeroes && offset < len.min(end) {
            zero_range(&spool, offset, len.min(end) - offset).map_err(spool_err)?;
        }
        if grows && end > len {
            spool.set_len(end).map_err(spool_err)?;
        }
        s.touch();
        Ok(())
    }

    /// `copy_file_range(2)`: up to `len` bytes of one file into another (or another part of
    /// the same), without the bytes crossing FUSE: from the source's spool, the filer's file on
    /// this machine, or the filer, into the destination's spool. Returns how many were copied
    /// (fewer than asked at the source's end, or past [`COPY_MAX`]: the caller asks again).
    pub fn copy_file_range(
        &self,
        fh_in: FileHandle,
        offset_in: u64,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
    ) -> Result<u32, Errno> {
        let (src, dst) = (self.handle(fh_in)?, self.handle(fh_out)?);
        let size = self.size_of(&src.file)?;
        if offset_in >= size || len == 0 {
            return Ok(0);
        }
        let n = len.min(size - offset_in).min(COPY_MAX);
        offset_out.checked_add(n).ok_or(Errno::EFBIG)?;
        self.changeable(&dst.file)?;
        let spool = self.spool(&dst.file, false)?;
        let mut done = 0;
        while done < n {
            let piece = self.read_for_copy(&src, offset_in + done, COPY_PIECE.min(n - done))?;
            if piece.is_empty() {
                break; // the source shrank meanwhile
            }
            let mut s = dst.file.state();
            spool.write_all_at(&piece, offset_out + done).map_err(spool_err)?;
            s.touch();
            done += piece.len() as u64;
        }
        Ok(done as u32)
    }

    /// `lseek(2)`'s `SEEK_DATA` and `SEEK_HOLE` (the kernel answers the other kinds itself):
    /// the holes of the bytes this mount holds (a sparse spool: a write far past the end, a
    /// punched hole); a file as the filer has it is data from end to end.
    pub fn lseek(&self, fh: FileHandle, offset: i64, whence: i32) -> Result<i64, Errno> {
        let h = self.handle(fh)?;
        if whence != libc::SEEK_DATA && whence != libc::SEEK_HOLE {
            return Err(Errno::EINVAL);
        }
        if offset < 0 {
            return Err(Errno::ENXIO);
        }
        if let Some(spool) = self.spool_view(&h.file) {
            // (The spool's file offset is never relied on: reads and writes are positioned.)
            let r = unsafe { libc::lseek(spool.as_raw_fd(), offset, whence) };
            return if r < 0 { Err(Errno::from(std::io::Error::last_os_error())) } else { Ok(r) };
        }
        let size = self.size_of(&h.file)? as i64;
        match whence {
            _ if offset >= size => Err(Errno::ENXIO),
            libc::SEEK_DATA => Ok(offset),
            _ => Ok(size),
        }
    }

    /// The last close of a handle: the file's changes are stored (their bytes kept in the
    /// unsaved directory if that fails on the file's last handle).
    pub fn release(&self, fh: FileHandle) -> Result<(), Errno> {
        let Some(h) = self.handles_map().remove(&fh.0) else { return Ok(()) };
        *h.reader() = None;
        self.release_io(&h);
        let r = self.upload(&h.file);
        let last = self.detach(&h.file);
        if last && let Err(e) = r {
            self.keep_unsaved(&h.file, e);
        }
        r
    }

    pub fn opendir(&self, ino: INodeNo) -> Result<(), Errno> {
        let e = self.stat(&self.path_of(ino)?)?;
        if !e.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        Ok(())
    }

    /// The directory's rows: `.`, `..`, then its names, each with its inode and kind.
    pub fn readdir(&self, ino: INodeNo) -> Result<Vec<(u64, FileType, String)>, Errno> {
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
        // What is written and not yet stored goes with the copy.
        self.flush_path(from)?;
        let src = self.stat(from)?;
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
        // The last name of a file open here: its handles keep its bytes, and its uploads wait.
        let open = (!e.is_dir() && e.posix.nlink.unwrap_or(1) <= 1).then(|| self.keep_open_bytes(&e.path)).flatten();
        let held = open.as_ref().map(|f| f.transfer());
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
        if let Some(f) = &open {
            self.unlinked(f, &e);
        }
        drop(held);
        Ok(())
    }
}

/// When a body sent to the filer last moved: the call's start, then each part it took.
#[derive(Clone)]
pub(crate) struct Progress {
    start: std::time::Instant,
    /// Milliseconds after `start` of the last part taken.
    last_ms: Arc<std::sync::atomic::AtomicU64>,
    /// Milliseconds the filer may take beyond the timeout, for work it does after the body.
    allowance_ms: Arc<std::sync::atomic::AtomicU64>,
}

impl Default for Progress {
    fn default() -> Self {
        Progress { start: std::time::Instant::now(), last_ms: Default::default(), allowance_ms: Default::default() }
    }
}

impl Progress {
    fn last(&self) -> std::time::Instant {
        let ms = self.last_ms.load(Ordering::Relaxed) + self.allowance_ms.load(Ordering::Relaxed);
        self.start + Duration::from_millis(ms)
    }

    /// Gives the filer `more` time beyond the timeout to answer (work it does after the last
    /// part of the body, such as hashing a sparse body's holes).
    pub(crate) fn allow(&self, more: Duration) {
        let ms = u64::try_from(more.as_millis()).unwrap_or(u64::MAX);
        self.allowance_ms.fetch_add(ms, Ordering::Relaxed);
    }

    /// `body`, noting each part the filer takes of it.
    pub(crate) fn counting(&self, body: ByteStream) -> ByteStream {
        let p = self.clone();
        body.inspect(move |_| {
            let ms = u64::try_from(p.start.elapsed().as_millis()).unwrap_or(u64::MAX);
            p.last_ms.fetch_max(ms, Ordering::Relaxed);
        })
        .boxed()
    }
}

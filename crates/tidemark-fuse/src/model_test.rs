//! The mount's operations against a reference model, without a kernel: random sequences of
//! what programs do to files — create and open with flags, writes at offsets, reads, truncates
//! up and down, `fallocate` modes, `copy_file_range`, fsync, close, renames of files and
//! directories (over existing names, while open), unlinks while open, hard links, symbolic
//! links, directories, modes, owners and times, xattrs, several handles on one file — and the
//! change log's records arriving between any two steps. Each step is done through the
//! operations (over an in-process filer on SQLite) and on an in-memory model of a POSIX file
//! system; their answers (bytes, sizes, kinds, modes, link counts, errnos, listings) must be
//! the same. A failing sequence is shrunk to a few steps.
//!
//! Where the kernel answers a request itself before the file system sees it (a name that
//! exists for `O_EXCL`, a rename of a directory into itself, `unlink` of a directory), the
//! harness does what the kernel does, on what the operations answered to its lookups.
//!
//! Two faults are planted (`Bugs`) to show the test finds them: the stale size of an open
//! file after a change-log record (what fsx found), and a rename that leaves the files open
//! under the old name there.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::sync::Arc;

use fuser::{Errno, FileAttr, FileHandle, FileType, INodeNo, RenameFlags, TimeOrNow};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

use tidemark_core::Filer;
use tidemark_core::model::{NewEntry, Origin, Precondition, Txn};

use crate::inodes::ROOT_INO;
use crate::ops::{Bugs, Caller, Options, SetAttr, TidemarkFs};

/// The names a sequence plays with: few, so that they collide.
const PATHS: &[&str] = &["a", "b", "d/a", "d/b", "d/e/a", "d", "d/e", "x"];
const XATTRS: &[&str] = &["user.one", "user.two"];
/// Offsets reach past the filer's inline size (64 KiB): small files are kept in the store,
/// larger ones as blobs.
const MAX_OFFSET: u64 = 96 << 10;
const SLOTS: usize = 4;
const CALLER: Caller = Caller { uid: 1000, gid: 1000 };

#[derive(Debug, Clone)]
enum Op {
    Create {
        path: usize,
        excl: bool,
    },
    Open {
        path: usize,
        write: bool,
        trunc: bool,
    },
    Write {
        slot: usize,
        offset: u64,
        len: u64,
        seed: u8,
    },
    Read {
        slot: usize,
        offset: u64,
        len: u64,
    },
    Truncate {
        slot: Option<usize>,
        path: usize,
        size: u64,
    },
    Fallocate {
        slot: usize,
        mode: i32,
        offset: u64,
        len: u64,
    },
    Copy {
        from: usize,
        offset_in: u64,
        to: usize,
        offset_out: u64,
        len: u64,
    },
    Fsync {
        slot: usize,
    },
    Close {
        slot: usize,
    },
    Fstat {
        slot: usize,
    },
    Stat {
        path: usize,
    },
    Rename {
        from: usize,
        to: usize,
        noreplace: bool,
    },
    Unlink {
        path: usize,
    },
    Mkdir {
        path: usize,
    },
    Rmdir {
        path: usize,
    },
    Link {
        from: usize,
        to: usize,
    },
    Symlink {
        path: usize,
        target: usize,
    },
    Chmod {
        path: usize,
        mode: u32,
    },
    Chown {
        path: usize,
        uid: u32,
    },
    Utime {
        slot: Option<usize>,
        path: usize,
        secs: u64,
    },
    SetXattr {
        path: usize,
        name: usize,
        value: u8,
        create: bool,
    },
    GetXattr {
        path: usize,
        name: usize,
    },
    RemoveXattr {
        path: usize,
        name: usize,
    },
    ListXattr {
        path: usize,
    },
    Readdir {
        dir: usize,
    },
    /// A change-log record of `path` arrives: the mount forgets what it remembered of it.
    Change {
        path: usize,
    },
}

const FALLOC_MODES: &[i32] = &[
    0,
    libc::FALLOC_FL_KEEP_SIZE,
    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
    libc::FALLOC_FL_ZERO_RANGE,
    libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
    libc::FALLOC_FL_COLLAPSE_RANGE,
];

fn op() -> impl Strategy<Value = Op> {
    let p = 0..PATHS.len();
    let s = 0..SLOTS;
    let off = prop_oneof![3 => 0..8192u64, 1 => 0..MAX_OFFSET];
    let len = prop_oneof![3 => 1..4096u64, 1 => 1..(80u64 << 10)];
    prop_oneof![
        3 => (p.clone(), any::<bool>()).prop_map(|(path, excl)| Op::Create { path, excl }),
        3 => (p.clone(), any::<bool>(), prop::bool::weighted(0.2)).prop_map(|(path, write, trunc)| Op::Open { path, write, trunc }),
        6 => (s.clone(), off.clone(), len.clone(), any::<u8>()).prop_map(|(slot, offset, len, seed)| Op::Write { slot, offset, len, seed }),
        4 => (s.clone(), off.clone(), len.clone()).prop_map(|(slot, offset, len)| Op::Read { slot, offset, len }),
        3 => (prop::option::weighted(0.7, s.clone()), p.clone(), off.clone()).prop_map(|(slot, path, size)| Op::Truncate { slot, path, size }),
        2 => (s.clone(), 0..FALLOC_MODES.len(), off.clone(), len.clone()).prop_map(|(slot, m, offset, len)| Op::Fallocate { slot, mode: FALLOC_MODES[m], offset, len }),
        2 => (s.clone(), off.clone(), s.clone(), off.clone(), len.clone()).prop_map(|(from, offset_in, to, offset_out, len)| Op::Copy { from, offset_in, to, offset_out, len }),
        2 => s.clone().prop_map(|slot| Op::Fsync { slot }),
        3 => s.clone().prop_map(|slot| Op::Close { slot }),
        3 => s.clone().prop_map(|slot| Op::Fstat { slot }),
        4 => p.clone().prop_map(|path| Op::Stat { path }),
        3 => (p.clone(), p.clone(), prop::bool::weighted(0.2)).prop_map(|(from, to, noreplace)| Op::Rename { from, to, noreplace }),
        2 => p.clone().prop_map(|path| Op::Unlink { path }),
        2 => p.clone().prop_map(|path| Op::Mkdir { path }),
        1 => p.clone().prop_map(|path| Op::Rmdir { path }),
        1 => (p.clone(), p.clone()).prop_map(|(from, to)| Op::Link { from, to }),
        1 => (p.clone(), p.clone()).prop_map(|(path, target)| Op::Symlink { path, target }),
        1 => (p.clone(), 0o000..0o1000u32).prop_map(|(path, mode)| Op::Chmod { path, mode }),
        1 => (p.clone(), prop_oneof![Just(0u32), Just(1000u32), Just(1001u32)]).prop_map(|(path, uid)| Op::Chown { path, uid }),
        1 => (prop::option::of(s.clone()), p.clone(), 1_000_000u64..2_000_000_000).prop_map(|(slot, path, secs)| Op::Utime { slot, path, secs }),
        1 => (p.clone(), 0..XATTRS.len(), any::<u8>(), any::<bool>()).prop_map(|(path, name, value, create)| Op::SetXattr { path, name, value, create }),
        1 => (p.clone(), 0..XATTRS.len()).prop_map(|(path, name)| Op::GetXattr { path, name }),
        1 => (p.clone(), 0..XATTRS.len()).prop_map(|(path, name)| Op::RemoveXattr { path, name }),
        1 => p.clone().prop_map(|path| Op::ListXattr { path }),
        2 => p.clone().prop_map(|dir| Op::Readdir { dir }),
        4 => p.prop_map(|path| Op::Change { path }),
    ]
}

/// What a step answered, in a form both sides give.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Done,
    Err(i32),
    Bytes(Vec<u8>),
    Count(u64),
    Attr { kind: FileType, size: Option<u64>, perm: u16, nlink: Option<u32>, uid: u32, mtime: Option<i64> },
    Names(BTreeSet<String>),
    Target(String),
}

/// Whether the mount's answer is the model's: equal, but a time the model leaves open (it was
/// not set by a `utime` since the last change) may be any.
fn agrees(real: &Outcome, model: &Outcome) -> bool {
    match (real, model) {
        (Outcome::Attr { mtime: _, .. }, Outcome::Attr { mtime: None, .. }) => {
            let mut r = real.clone();
            if let Outcome::Attr { mtime, .. } = &mut r {
                *mtime = None;
            }
            &r == model
        }
        _ => real == model,
    }
}

fn err(e: Errno) -> Outcome {
    Outcome::Err(e.code())
}

fn parent_and_name(rel: &str) -> (&str, &str) {
    match rel.rfind('/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => ("", rel),
    }
}

fn data(len: u64, seed: u8) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_add((i % 251) as u8)).collect()
}

// ---------------------------------------------------------------- the model

#[derive(Debug, Clone)]
enum Node {
    Dir {
        mode: u32,
        uid: u32,
        xattrs: BTreeMap<String, Vec<u8>>,
    },
    File(u64),
    /// A symlink's target, and its number (hard links to it are the same symlink).
    Symlink(String, u64),
}

#[derive(Debug, Clone)]
struct FileData {
    bytes: Vec<u8>,
    mode: u32,
    uid: u32,
    nlink: u32,
    xattrs: BTreeMap<String, Vec<u8>>,
    /// Set by a `utime` and not changed since (then `stat` must show it).
    mtime: Option<i64>,
}

#[derive(Debug, Default)]
struct Model {
    nodes: BTreeMap<String, Node>,
    files: BTreeMap<u64, FileData>,
    next: u64,
    /// The file each slot's handle is open on.
    slots: [Option<u64>; SLOTS],
}

impl Model {
    fn new() -> Model {
        let mut m = Model::default();
        m.nodes.insert(String::new(), Node::Dir { mode: 0o755, uid: CALLER.uid, xattrs: BTreeMap::new() });
        m
    }

    /// What resolving `rel` answers: the node, or ENOENT / ENOTDIR on the way.
    fn resolve(&self, rel: &str) -> Result<&Node, Errno> {
        let mut at = String::new();
        for part in rel.split('/') {
            match self.nodes.get(&at) {
                Some(Node::Dir { .. }) => {}
                Some(_) => return Err(Errno::ENOTDIR),
                None => return Err(Errno::ENOENT),
            }
            at = if at.is_empty() { part.to_string() } else { format!("{at}/{part}") };
        }
        self.nodes.get(rel).ok_or(Errno::ENOENT)
    }

    fn parent(&self, rel: &str) -> Result<(), Errno> {
        let (dir, _) = parent_and_name(rel);
        match self.resolve(dir)? {
            Node::Dir { .. } => Ok(()),
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn children(&self, dir: &str) -> impl Iterator<Item = &String> {
        let prefix = if dir.is_empty() { String::new() } else { format!("{dir}/") };
        self.nodes.keys().filter(move |k| !k.is_empty() && k.starts_with(&prefix) && !k[prefix.len()..].contains('/'))
    }

    fn attr(&self, node: &Node) -> Outcome {
        match node {
            Node::Dir { mode, uid, .. } => Outcome::Attr {
                kind: FileType::Directory,
                size: None,
                perm: *mode as u16,
                nlink: None,
                uid: *uid,
                mtime: None,
            },
            Node::File(id) => self.file_attr(*id),
            Node::Symlink(t, _) => Outcome::Attr {
                kind: FileType::Symlink,
                size: Some(t.len() as u64),
                perm: 0o777,
                nlink: None,
                uid: CALLER.uid,
                mtime: None,
            },
        }
    }

    fn file_attr(&self, id: u64) -> Outcome {
        let f = &self.files[&id];
        Outcome::Attr {
            kind: FileType::RegularFile,
            size: Some(f.bytes.len() as u64),
            perm: f.mode as u16,
            nlink: Some(f.nlink),
            uid: f.uid,
            mtime: f.mtime,
        }
    }

    fn new_id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    fn new_file(&mut self) -> u64 {
        self.next += 1;
        let d = FileData {
            bytes: Vec::new(),
            mode: 0o644,
            uid: CALLER.uid,
            nlink: 1,
            xattrs: BTreeMap::new(),
            mtime: None,
        };
        self.files.insert(self.next, d);
        self.next
    }

    /// A name of file `id` went: the file goes with its last name and its last handle.
    fn unname(&mut self, id: u64) {
        let f = self.files.get_mut(&id).expect("file");
        f.nlink -= 1;
        self.collect(id);
    }

    fn collect(&mut self, id: u64) {
        if self.files.get(&id).is_some_and(|f| f.nlink == 0) && !self.slots.contains(&Some(id)) {
            self.files.remove(&id);
        }
    }

    fn bytes_mut(&mut self, id: u64) -> &mut FileData {
        let f = self.files.get_mut(&id).expect("file");
        f.mtime = None;
        f
    }

    fn xattrs_mut(&mut self, rel: &str) -> Option<&mut BTreeMap<String, Vec<u8>>> {
        match self.nodes.get_mut(rel)? {
            Node::Dir { xattrs, .. } => Some(xattrs),
            Node::File(id) => {
                let id = *id;
                Some(&mut self.files.get_mut(&id)?.xattrs)
            }
            Node::Symlink(..) => None,
        }
    }
}

// ---------------------------------------------------------------- the harness over the operations

struct Real {
    fs: TidemarkFs,
    root: String,
    slots: [Option<(FileHandle, INodeNo)>; SLOTS],
}

impl Real {
    /// Walks `rel` with lookups from the root, as the kernel does: a component that is not a
    /// directory stops it (ENOTDIR).
    fn resolve(&self, rel: &str) -> Result<FileAttr, Errno> {
        let mut a = self.fs.getattr(INodeNo(ROOT_INO), None)?;
        if rel.is_empty() {
            return Ok(a);
        }
        for part in rel.split('/') {
            if a.kind != FileType::Directory {
                return Err(Errno::ENOTDIR);
            }
            a = self.fs.lookup(a.ino, OsStr::new(part))?;
        }
        Ok(a)
    }

    /// `rel` resolved, refused with EPERM if it is a symlink (the harness sets no attribute of
    /// one: Linux would follow it).
    fn resolve_not_link(&self, rel: &str) -> Result<FileAttr, Errno> {
        self.resolve(rel).and_then(|a| if a.kind == FileType::Symlink { Err(Errno::EPERM) } else { Ok(a) })
    }

    /// The directory `rel` is in, and its name.
    fn parent<'a>(&self, rel: &'a str) -> Result<(INodeNo, &'a str), Errno> {
        let (dir, name) = parent_and_name(rel);
        let d = self.resolve(dir)?;
        if d.kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        Ok((d.ino, name))
    }

    fn attr(a: &FileAttr) -> Outcome {
        let file = a.kind == FileType::RegularFile;
        let mtime = a.mtime.duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_millis() as i64);
        Outcome::Attr {
            kind: a.kind,
            size: (a.kind != FileType::Directory).then_some(a.size),
            perm: if a.kind == FileType::Symlink { 0o777 } else { a.perm },
            nlink: file.then_some(a.nlink),
            uid: a.uid,
            mtime,
        }
    }

    fn open(&mut self, slot: usize, rel: &str, flags: i32, trunc: bool) -> Outcome {
        let a = match self.resolve(rel) {
            Ok(a) => a,
            Err(e) => return err(e),
        };
        if a.kind == FileType::Directory {
            return err(Errno::EISDIR);
        }
        if a.kind != FileType::RegularFile {
            return err(Errno::EACCES); // (the harness opens regular files only)
        }
        match self.fs.open(a.ino, flags, &|_| Err(std::io::Error::other("no kernel"))) {
            Ok(o) => {
                self.slots[slot] = Some((o.fh, a.ino));
                // Without atomic O_TRUNC the kernel opens, then truncates by path.
                if trunc {
                    let set = SetAttr { size: Some(0), mtime: Some(TimeOrNow::Now), ..Default::default() };
                    if let Err(e) = self.fs.setattr(a.ino, set, None) {
                        return err(e);
                    }
                }
                Outcome::Done
            }
            Err(e) => err(e),
        }
    }

    fn close(&mut self, slot: usize) -> Outcome {
        let Some((fh, _)) = self.slots[slot].take() else { return Outcome::Done };
        let flushed = self.fs.flush(fh);
        let released = self.fs.release(fh);
        match flushed.and(released) {
            Ok(()) => Outcome::Done,
            Err(e) => err(e),
        }
    }
}

fn flags(write: bool) -> i32 {
    if write { libc::O_RDWR } else { libc::O_RDONLY }
}

/// One step on both sides: the operations' answer, then the model's.
fn step(real: &mut Real, m: &mut Model, op: &Op) -> (Outcome, Outcome) {
    let fs = &real.fs;
    match *op {
        Op::Create { path, excl } => {
            let rel = PATHS[path];
            let slot = match (0..SLOTS).find(|s| real.slots[*s].is_none()) {
                Some(s) => s,
                None => return (Outcome::Done, Outcome::Done),
            };
            // The kernel looks the name up first: an existing name is opened (or EEXIST).
            let real_out = match real.resolve(rel) {
                Ok(_) if excl => err(Errno::EEXIST),
                Ok(_) => real.open(slot, rel, libc::O_RDWR, false),
                Err(Errno::ENOENT) => match real.parent(rel) {
                    Ok((dir, name)) => {
                        let flags = libc::O_RDWR | libc::O_CREAT | if excl { libc::O_EXCL } else { 0 };
                        match fs.create(CALLER, dir, OsStr::new(name), 0o100644, 0o022, flags) {
                            Ok((a, fh)) => {
                                real.slots[slot] = Some((fh, a.ino));
                                Outcome::Done
                            }
                            Err(e) => err(e),
                        }
                    }
                    Err(e) => err(e),
                },
                Err(e) => err(e),
            };
            let model_out = match m.resolve(rel) {
                Ok(_) if excl => err(Errno::EEXIST),
                Ok(Node::Dir { .. }) => err(Errno::EISDIR),
                Ok(Node::File(id)) => {
                    m.slots[slot] = Some(*id);
                    Outcome::Done
                }
                Ok(Node::Symlink(..)) => err(Errno::EACCES),
                Err(Errno::ENOENT) => match m.parent(rel) {
                    Ok(()) => {
                        let id = m.new_file();
                        m.nodes.insert(rel.to_string(), Node::File(id));
                        m.slots[slot] = Some(id);
                        Outcome::Done
                    }
                    Err(e) => err(e),
                },
                Err(e) => err(e),
            };
            (real_out, model_out)
        }
        Op::Open { path, write, trunc } => {
            let rel = PATHS[path];
            let Some(slot) = (0..SLOTS).find(|s| real.slots[*s].is_none()) else {
                return (Outcome::Done, Outcome::Done);
            };
            let trunc = trunc && write;
            let real_out = real.open(slot, rel, flags(write), trunc);
            let model_out = match m.resolve(rel) {
                Ok(Node::Dir { .. }) => err(Errno::EISDIR),
                Ok(Node::Symlink(..)) => err(Errno::EACCES),
                Ok(Node::File(id)) => {
                    let id = *id;
                    m.slots[slot] = Some(id);
                    // (An O_TRUNC marks the times for update even of an empty file.)
                    if trunc {
                        m.bytes_mut(id).bytes.clear();
                    }
                    Outcome::Done
                }
                Err(e) => err(e),
            };
            (real_out, model_out)
        }
        Op::Write { slot, offset, len, seed } => {
            let (Some((fh, _)), Some(id)) = (real.slots[slot], m.slots[slot]) else {
                return (Outcome::Done, Outcome::Done);
            };
            let d = data(len, seed);
            let real_out = match fs.write(fh, offset, &d) {
                Ok(n) => Outcome::Count(n as u64),
                Err(e) => err(e),
            };
            let f = m.bytes_mut(id);
            let end = (offset + len) as usize;
            if f.bytes.len() < end {
                f.bytes.resize(end, 0);
            }
            f.bytes[offset as usize..end].copy_from_slice(&d);
            (real_out, Outcome::Count(len))
        }
        Op::Read { slot, offset, len } => {
            let (Some((fh, _)), Some(id)) = (real.slots[slot], m.slots[slot]) else {
                return (Outcome::Done, Outcome::Done);
            };
            let real_out = match fs.read(fh, offset, len as u32) {
                Ok(a) => Outcome::Bytes(a.to_vec()),
                Err(e) => err(e),
            };
            let b = &m.files[&id].bytes;
            let from = (offset as usize).min(b.len());
            let to = ((offset + len) as usize).min(b.len());
            (real_out, Outcome::Bytes(b[from..to].to_vec()))
        }
        Op::Truncate { slot: Some(slot), size, .. } => {
            let (Some((fh, ino)), Some(id)) = (real.slots[slot], m.slots[slot]) else {
                return (Outcome::Done, Outcome::Done);
            };
            let set = SetAttr { size: Some(size), mtime: Some(TimeOrNow::Now), ..Default::default() };
            let real_out = fs.setattr(ino, set, Some(fh)).map(|a| a.size);
            let f = m.bytes_mut(id);
            f.bytes.resize(size as usize, 0);
            (real_out.map_or_else(err, Outcome::Count), Outcome::Count(size))
        }
        Op::Truncate { slot: None, path, size } => {
            let rel = PATHS[path];
            let real_out = match real.resolve(rel) {
                Ok(a) if a.kind == FileType::Directory => err(Errno::EISDIR),
                Ok(a) if a.kind != FileType::RegularFile => err(Errno::EINVAL),
                Ok(a) => {
                    let set = SetAttr { size: Some(size), mtime: Some(TimeOrNow::Now), ..Default::default() };
                    fs.setattr(a.ino, set, None).map_or_else(err, |a| Outcome::Count(a.size))
                }
                Err(e) => err(e),
            };
            let model_out = match m.resolve(rel) {
                Ok(Node::Dir { .. }) => err(Errno::EISDIR),
                Ok(Node::Symlink(..)) => err(Errno::EINVAL),
                Ok(Node::File(id)) => {
                    let id = *id;
                    m.bytes_mut(id).bytes.resize(size as usize, 0);
                    Outcome::Count(size)
                }
                Err(e) => err(e),
            };
            (real_out, model_out)
        }
        Op::Fallocate { slot, mode, offset, len } => {
            let (Some((fh, _)), Some(id)) = (real.slots[slot], m.slots[slot]) else {
                return (Outcome::Done, Outcome::Done);
            };
            let real_out = fs.fallocate(fh, offset, len, mode).map_or_else(err, |()| Outcome::Done);
            let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
            let zero = mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0;
            let model_out = if mode == libc::FALLOC_FL_COLLAPSE_RANGE {
                err(Errno::EOPNOTSUPP)
            } else {
                let size = m.files[&id].bytes.len() as u64;
                let end = offset + len;
                if (!keep && end > size) || (zero && offset < size) {
                    let f = m.bytes_mut(id);
                    if zero {
                        let to = end.min(size) as usize;
                        if (offset as usize) < to {
                            f.bytes[offset as usize..to].fill(0);
                        }
                    }
                    if !keep && end > size {
                        f.bytes.resize(end as usize, 0);
                    }
                }
                Outcome::Done
            };
            (real_out, model_out)
        }
        Op::Copy { from, offset_in, to, offset_out, len } => {
            let (Some((fin, _)), Some((fout, _)), Some(a), Some(b)) =
                (real.slots[from], real.slots[to], m.slots[from], m.slots[to])
            else {
                return (Outcome::Done, Outcome::Done);
            };
            // Linux refuses a copy within one file whose ranges overlap (the kernel checks).
            if a == b && offset_in < offset_out + len && offset_out < offset_in + len {
                return (Outcome::Done, Outcome::Done);
            }
            let real_out = fs
                .copy_file_range(fin, offset_in, fout, offset_out, len)
                .map_or_else(err, |n| Outcome::Count(n as u64));
            let src = &m.files[&a].bytes;
            let from = (offset_in as usize).min(src.len());
            let to = ((offset_in + len) as usize).min(src.len());
            let piece = src[from..to].to_vec();
            if !piece.is_empty() {
                let f = m.bytes_mut(b);
                let end = offset_out as usize + piece.len();
                if f.bytes.len() < end {
                    f.bytes.resize(end, 0);
                }
                f.bytes[offset_out as usize..end].copy_from_slice(&piece);
            }
            (real_out, Outcome::Count(piece.len() as u64))
        }
        Op::Fsync { slot } => {
            let Some((fh, _)) = real.slots[slot] else { return (Outcome::Done, Outcome::Done) };
            (fs.fsync(fh).map_or_else(err, |()| Outcome::Done), Outcome::Done)
        }
        Op::Close { slot } => {
            let real_out = real.close(slot);
            if let Some(id) = m.slots[slot].take() {
                m.collect(id);
            }
            (real_out, Outcome::Done)
        }
        Op::Fstat { slot } => {
            let (Some((fh, ino)), Some(id)) = (real.slots[slot], m.slots[slot]) else {
                return (Outcome::Done, Outcome::Done);
            };
            (fs.getattr(ino, Some(fh)).map_or_else(err, |a| Real::attr(&a)), m.file_attr(id))
        }
        Op::Stat { path } => {
            let rel = PATHS[path];
            (real.resolve(rel).map_or_else(err, |a| Real::attr(&a)), m.resolve(rel).map_or_else(err, |n| m.attr(n)))
        }
        Op::Rename { from, to, noreplace } => rename(real, m, PATHS[from], PATHS[to], noreplace),
        Op::Unlink { path } => {
            let rel = PATHS[path];
            let real_out = match real.resolve(rel) {
                Ok(a) if a.kind == FileType::Directory => err(Errno::EISDIR),
                Ok(_) => {
                    real.parent(rel).and_then(|(d, n)| fs.unlink(d, OsStr::new(n))).map_or_else(err, |()| Outcome::Done)
                }
                Err(e) => err(e),
            };
            let model_out = match m.resolve(rel).cloned() {
                Ok(Node::Dir { .. }) => err(Errno::EISDIR),
                Ok(n) => {
                    m.nodes.remove(rel);
                    if let Node::File(id) = n {
                        m.unname(id);
                    }
                    Outcome::Done
                }
                Err(e) => err(e),
            };
            (real_out, model_out)
        }
        Op::Mkdir { path } => {
            let rel = PATHS[path];
            let real_out = match real.resolve(rel) {
                Ok(_) => err(Errno::EEXIST),
                Err(Errno::ENOENT) => real
                    .parent(rel)
                    .and_then(|(d, n)| fs.mkdir(CALLER, d, OsStr::new(n), 0o755, 0))
                    .map_or_else(err, |_| Outcome::Done),
                Err(e) => err(e),
            };
            let model_out = match m.resolve(rel) {
                Ok(_) => err(Errno::EEXIST),
                Err(Errno::ENOENT) => match m.parent(rel) {
                    Ok(()) => {
                        m.nodes.insert(rel.into(), Node::Dir { mode: 0o755, uid: CALLER.uid, xattrs: BTreeMap::new() });
                        Outcome::Done
                    }
                    Err(e) => err(e),
                },
                Err(e) => err(e),
            };
            (real_out, model_out)
        }
        Op::Rmdir { path } => {
            let rel = PATHS[path];
            let real_out = match real.resolve(rel) {
                Ok(a) if a.kind != FileType::Directory => err(Errno::ENOTDIR),
                Ok(_) => {
                    real.parent(rel).and_then(|(d, n)| fs.rmdir(d, OsStr::new(n))).map_or_else(err, |()| Outcome::Done)
                }
                Err(e) => err(e),
            };
            let model_out = match m.resolve(rel) {
                Ok(Node::Dir { .. }) if m.children(rel).next().is_some() => err(Errno::ENOTEMPTY),
                Ok(Node::Dir { .. }) => {
                    m.nodes.remove(rel);
                    Outcome::Done
                }
                Ok(_) => err(Errno::ENOTDIR),
                Err(e) => err(e),
            };
            (real_out, model_out)
        }
        Op::Link { from, to } => {
            let (from, to) = (PATHS[from], PATHS[to]);
            // The kernel: the source must be, and not a directory; the name must not be.
            let real_out = match (real.resolve(from), real.resolve(to)) {
                (Err(e), _) => err(e),
                (Ok(a), _) if a.kind == FileType::Directory => err(Errno::EPERM),
                (_, Ok(_)) => err(Errno::EEXIST),
                (Ok(a), Err(Errno::ENOENT)) => real
                    .parent(to)
                    .and_then(|(d, n)| fs.link(a.ino, d, OsStr::new(n)))
                    .map_or_else(err, |a| Real::attr(&a)),
                (_, Err(e)) => err(e),
            };
            let model_out = match (m.resolve(from).cloned(), m.resolve(to)) {
                (Err(e), _) => err(e),
                (Ok(Node::Dir { .. }), _) => err(Errno::EPERM),
                (_, Ok(_)) => err(Errno::EEXIST),
                (Ok(n), Err(Errno::ENOENT)) => match m.parent(to) {
                    Ok(()) => {
                        m.nodes.insert(to.into(), n.clone());
                        match n {
                            Node::File(id) => {
                                m.files.get_mut(&id).expect("file").nlink += 1;
                                m.file_attr(id)
                            }
                            other => m.attr(&other),
                        }
                    }
                    Err(e) => err(e),
                },
                (_, Err(e)) => err(e),
            };
            (real_out, model_out)
        }
        Op::Symlink { path, target } => {
            let (rel, target) = (PATHS[path], PATHS[target]);
            let real_out = match real.resolve(rel) {
                Ok(_) => err(Errno::EEXIST),
                Err(Errno::ENOENT) => real
                    .parent(rel)
                    .and_then(|(d, n)| fs.symlink(CALLER, d, OsStr::new(n), std::path::Path::new(target)))
                    .and_then(|a| fs.readlink(a.ino))
                    .map_or_else(err, Outcome::Target),
                Err(e) => err(e),
            };
            let model_out = match m.resolve(rel) {
                Ok(_) => err(Errno::EEXIST),
                Err(Errno::ENOENT) => match m.parent(rel) {
                    Ok(()) => {
                        let id = m.new_id();
                        m.nodes.insert(rel.into(), Node::Symlink(target.into(), id));
                        Outcome::Target(target.into())
                    }
                    Err(e) => err(e),
                },
                Err(e) => err(e),
            };
            (real_out, model_out)
        }
        Op::Chmod { path, mode } => change_attr(real, m, PATHS[path], Owned::Mode, mode),
        Op::Chown { path, uid } => change_attr(real, m, PATHS[path], Owned::Uid, uid),
        Op::Utime { slot, path, secs } => {
            let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
            let set = SetAttr {
                mtime: Some(TimeOrNow::SpecificTime(t)),
                atime: Some(TimeOrNow::SpecificTime(t)),
                ..Default::default()
            };
            let ms = (secs * 1000) as i64;
            match slot {
                // `futimens` on an open file.
                Some(slot) => {
                    let (Some((fh, ino)), Some(id)) = (real.slots[slot], m.slots[slot]) else {
                        return (Outcome::Done, Outcome::Done);
                    };
                    let real_out = fs.setattr(ino, set, Some(fh)).map_or_else(err, |_| Outcome::Done);
                    m.files.get_mut(&id).expect("file").mtime = Some(ms);
                    (real_out, Outcome::Done)
                }
                None => {
                    let rel = PATHS[path];
                    let real_out = real
                        .resolve(rel)
                        .and_then(|a| {
                            if a.kind == FileType::RegularFile {
                                fs.setattr(a.ino, set, None)
                            } else {
                                Err(Errno::EPERM)
                            }
                        })
                        .map_or_else(err, |_| Outcome::Done);
                    let model_out = match m.resolve(rel).cloned() {
                        Ok(Node::File(id)) => {
                            m.files.get_mut(&id).expect("file").mtime = Some(ms);
                            Outcome::Done
                        }
                        Ok(_) => err(Errno::EPERM),
                        Err(e) => err(e),
                    };
                    (real_out, model_out)
                }
            }
        }
        Op::SetXattr { path, name, value, create } => {
            let rel = PATHS[path];
            let flags = if create { libc::XATTR_CREATE } else { 0 };
            let real_out = real
                .resolve_not_link(rel)
                .and_then(|a| fs.setxattr(a.ino, OsStr::new(XATTRS[name]), &[value; 3], flags))
                .map_or_else(err, |()| Outcome::Done);
            let model_out = match m.resolve(rel) {
                Ok(Node::Symlink(..)) => err(Errno::EPERM),
                Ok(_) => {
                    let x = m.xattrs_mut(rel).expect("xattrs");
                    if create && x.contains_key(XATTRS[name]) {
                        err(Errno::EEXIST)
                    } else {
                        x.insert(XATTRS[name].into(), vec![value; 3]);
                        Outcome::Done
                    }
                }
                Err(e) => err(e),
            };
            (real_out, model_out)
        }
        Op::GetXattr { path, name } => {
            let rel = PATHS[path];
            let real_out = real
                .resolve_not_link(rel)
                .and_then(|a| fs.getxattr(a.ino, OsStr::new(XATTRS[name])))
                .map_or_else(err, Outcome::Bytes);
            let model_out = match m.resolve(rel) {
                Ok(Node::Symlink(..)) => err(Errno::EPERM),
                Ok(_) => m
                    .xattrs_mut(rel)
                    .and_then(|x| x.get(XATTRS[name]).cloned())
                    .map_or(err(Errno::ENODATA), Outcome::Bytes),
                Err(e) => err(e),
            };
            (real_out, model_out)
        }
        Op::RemoveXattr { path, name } => {
            let rel = PATHS[path];
            let real_out = real
                .resolve_not_link(rel)
                .and_then(|a| fs.removexattr(a.ino, OsStr::new(XATTRS[name])))
                .map_or_else(err, |()| Outcome::Done);
            let model_out = match m.resolve(rel) {
                Ok(Node::Symlink(..)) => err(Errno::EPERM),
                Ok(_) => match m.xattrs_mut(rel).and_then(|x| x.remove(XATTRS[name])) {
                    Some(_) => Outcome::Done,
                    None => err(Errno::ENODATA),
                },
                Err(e) => err(e),
            };
            (real_out, model_out)
        }
        Op::ListXattr { path } => {
            let rel = PATHS[path];
            let names = |b: Vec<u8>| {
                Outcome::Names(
                    b.split(|c| *c == 0).filter(|n| !n.is_empty()).map(|n| String::from_utf8_lossy(n).into()).collect(),
                )
            };
            let real_out = real.resolve_not_link(rel).and_then(|a| fs.listxattr(a.ino)).map_or_else(err, names);
            let model_out = match m.resolve(rel) {
                Ok(Node::Symlink(..)) => err(Errno::EPERM),
                Ok(_) => Outcome::Names(m.xattrs_mut(rel).map(|x| x.keys().cloned().collect()).unwrap_or_default()),
                Err(e) => err(e),
            };
            (real_out, model_out)
        }
        Op::Readdir { dir } => {
            let rel = PATHS[dir];
            let real_out = match real.resolve(rel) {
                Ok(a) if a.kind != FileType::Directory => err(Errno::ENOTDIR),
                Ok(a) => fs
                    .readdir(a.ino)
                    .map(|rows| rows.into_iter().map(|(_, _, n)| n).filter(|n| n != "." && n != "..").collect())
                    .map_or_else(err, Outcome::Names),
                Err(e) => err(e),
            };
            let model_out = match m.resolve(rel) {
                Ok(Node::Dir { .. }) => {
                    Outcome::Names(m.children(rel).map(|k| parent_and_name(k).1.to_string()).collect())
                }
                Ok(_) => err(Errno::ENOTDIR),
                Err(e) => err(e),
            };
            (real_out, model_out)
        }
        Op::Change { path } => {
            let p = tidemark_core::path::join(&real.root, PATHS[path]);
            fs.inodes().changed(&p);
            (Outcome::Done, Outcome::Done)
        }
    }
}

/// Which of a node's attributes a `chmod` or `chown` sets.
#[derive(Clone, Copy)]
enum Owned {
    Mode,
    Uid,
}

/// `chmod` or `chown` of `rel` to `value`: the mount's answer (the attribute as it is after) and
/// the model's. (Linux follows a symlink there; the harness does not, and refuses.)
fn change_attr(real: &mut Real, m: &mut Model, rel: &str, which: Owned, value: u32) -> (Outcome, Outcome) {
    let set = match which {
        Owned::Mode => SetAttr { mode: Some(value), ..Default::default() },
        Owned::Uid => SetAttr { uid: Some(value), ..Default::default() },
    };
    let real_out = real.resolve_not_link(rel).and_then(|a| real.fs.setattr(a.ino, set, None)).map_or_else(err, |a| {
        Outcome::Count(match which {
            Owned::Mode => a.perm as u64,
            Owned::Uid => a.uid as u64,
        })
    });
    let model_out = match m.resolve(rel).cloned() {
        Ok(Node::Symlink(..)) => err(Errno::EPERM),
        Ok(Node::File(id)) => {
            let f = m.files.get_mut(&id).expect("file");
            *match which {
                Owned::Mode => &mut f.mode,
                Owned::Uid => &mut f.uid,
            } = value;
            Outcome::Count(value as u64)
        }
        Ok(Node::Dir { .. }) => {
            if let Some(Node::Dir { mode, uid, .. }) = m.nodes.get_mut(rel) {
                *match which {
                    Owned::Mode => mode,
                    Owned::Uid => uid,
                } = value;
            }
            Outcome::Count(value as u64)
        }
        Err(e) => err(e),
    };
    (real_out, model_out)
}

/// A number for a directory, which the model knows by its path, apart from the files' and
/// symlinks' numbers.
fn hash(at: &str) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(at) | 1 << 63
}

fn rename(real: &mut Real, m: &mut Model, from: &str, to: &str, noreplace: bool) -> (Outcome, Outcome) {
    let fs = &real.fs;
    let flags = if noreplace { RenameFlags::RENAME_NOREPLACE } else { RenameFlags::empty() };
    // What the kernel checks before the file system is asked (`do_renameat2`, then
    // `vfs_rename`), in its order; two names of one file make a rename that does nothing.
    type Id = (FileType, u64);
    let vfs = |src: Result<Id, Errno>, dst: Result<Id, Errno>| -> Result<bool, Errno> {
        let src = src?;
        if noreplace && dst.is_ok() {
            return Err(Errno::EEXIST);
        }
        if to.starts_with(&format!("{from}/")) {
            return Err(Errno::EINVAL);
        }
        if from.starts_with(&format!("{to}/")) {
            return Err(Errno::ENOTEMPTY);
        }
        match dst {
            Ok(d) if d == src => Ok(false),
            Ok(d) if src.0 == FileType::Directory && d.0 != FileType::Directory => Err(Errno::ENOTDIR),
            Ok(d) if src.0 != FileType::Directory && d.0 == FileType::Directory => Err(Errno::EISDIR),
            Ok(_) | Err(Errno::ENOENT) => Ok(true),
            Err(e) => Err(e),
        }
    };
    let id = |a: FileAttr| (a.kind, a.ino.0);
    let real_out = vfs(real.resolve(from).map(id), real.resolve(to).map(id))
        .and_then(|asked| {
            if !asked {
                return Ok(());
            }
            let (d1, n1) = real.parent(from)?;
            let (d2, n2) = real.parent(to)?;
            fs.rename(d1, OsStr::new(n1), d2, OsStr::new(n2), flags)
        })
        .map_or_else(err, |()| Outcome::Done);
    // The model's nodes are known by their path, a file's by its number.
    let kind = |n: &Node, at: &str| match n {
        Node::Dir { .. } => (FileType::Directory, hash(at)),
        Node::File(id) => (FileType::RegularFile, *id),
        Node::Symlink(_, id) => (FileType::Symlink, *id),
    };
    let model_out = match vfs(m.resolve(from).map(|n| kind(n, from)), m.resolve(to).map(|n| kind(n, to)))
        .and_then(|asked| m.parent(to).map(|()| asked))
    {
        Err(e) => err(e),
        Ok(false) => Outcome::Done,
        Ok(true) => {
            if let Ok(Node::Dir { .. }) = m.resolve(to)
                && m.children(to).next().is_some()
            {
                return (real_out, err(Errno::ENOTEMPTY));
            }
            if let Some(old) = m.nodes.remove(to)
                && let Node::File(id) = old
            {
                m.unname(id);
            }
            let below = format!("{from}/");
            let moved: Vec<String> = m.nodes.keys().filter(|k| *k == from || k.starts_with(&below)).cloned().collect();
            for k in moved {
                let n = m.nodes.remove(&k).expect("node");
                m.nodes.insert(format!("{to}{}", &k[from.len()..]), n);
            }
            Outcome::Done
        }
    };
    (real_out, model_out)
}

// ---------------------------------------------------------------- running

/// The filer the sequences run on: one for the whole test (each sequence in a directory of its
/// own), on SQLite in shared memory where there is some (each commit's fsync costs nothing).
struct Bench {
    rt: tokio::runtime::Runtime,
    filer: Arc<dyn Filer>,
    _dir: tempfile::TempDir,
    cases: std::sync::atomic::AtomicU64,
}

impl Bench {
    fn new() -> Bench {
        let shm = std::path::Path::new("/dev/shm");
        let dir =
            if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.expect("a temporary directory");
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
        let data = tidemark_filer::DataDir::open(dir.path()).expect("a data directory");
        let filer: Arc<dyn Filer> = Arc::new(tidemark_filer::LocalFiler::open(data).expect("a filer"));
        Bench { rt, filer, _dir: dir, cases: Default::default() }
    }

    /// The operations over a fresh directory of the filer, with the faults `bugs`.
    fn fresh(&self, bugs: Bugs) -> Result<(TidemarkFs, String), String> {
        let n = self.cases.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root = format!("/case-{n}");
        let txn = Txn::put(&root, NewEntry::dir(0), Origin::Local).with_precondition(Precondition::Absent);
        self.rt.block_on(self.filer.apply(txn)).map_err(|e| format!("mkdir {root}: {e}"))?;
        let opts = Options {
            read_only: false,
            ttl: std::time::Duration::from_secs(1),
            timeout: std::time::Duration::from_secs(30),
            passthrough: false,
            unsaved_dir: std::env::temp_dir().join("tidemark-model-test-unsaved"),
        };
        let mut fs = TidemarkFs::new(self.filer.clone(), self.rt.handle().clone(), &root, opts);
        fs.bugs = bugs;
        Ok((fs, root))
    }

    /// Runs `ops` on a fresh directory with the faults `bugs`; the first disagreement is the error.
    fn run(&self, ops: &[Op], bugs: Bugs) -> Result<(), TestCaseError> {
        let (fs, root) = self.fresh(bugs).map_err(TestCaseError::fail)?;
        let mut real = Real { fs, root, slots: Default::default() };
        let mut model = Model::new();
        let mut done = Vec::new();
        let result = (|| {
            for op in ops {
                done.push(op);
                let (r, m) = step(&mut real, &mut model, op);
                if !agrees(&r, &m) {
                    return Err(format!("{op:?}: the mount answered {r:?}, the model {m:?}"));
                }
            }
            // Then every handle closes, and what the filer has is what the model has.
            for s in 0..SLOTS {
                let (r, m) = step(&mut real, &mut model, &Op::Close { slot: s });
                if !agrees(&r, &m) {
                    return Err(format!("closing slot {s}: the mount answered {r:?}, the model {m:?}"));
                }
            }
            for (rel, node) in &model.nodes {
                if let Node::File(id) = node {
                    let p = tidemark_core::path::join(&real.root, rel);
                    let stored = self
                        .rt
                        .block_on(async {
                            use futures::TryStreamExt;
                            let (_, s) = self.filer.read(&p, None).await?;
                            let parts: Vec<bytes::Bytes> =
                                s.try_collect().await.map_err(tidemark_core::Error::internal)?;
                            Ok::<_, tidemark_core::Error>(parts.concat())
                        })
                        .map_err(|e| format!("reading {p} back: {e}"))?;
                    if stored != model.files[id].bytes {
                        return Err(format!(
                            "after every close, {rel} holds {} bytes in the filer, the model {}",
                            stored.len(),
                            model.files[id].bytes.len()
                        ));
                    }
                }
            }
            Ok(())
        })();
        result.map_err(|e| TestCaseError::fail(format!("{e}\nafter {} steps", done.len())))
    }
}

fn sequences() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..40)
}

fn cases() -> u32 {
    std::env::var("TIDEMARK_MODEL_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000)
}

#[test]
fn the_mount_answers_as_a_posix_file_system_would() {
    let bench = Bench::new();
    let config = Config { cases: cases(), failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new(config);
    let r = runner.run(&sequences(), |ops| bench.run(&ops, Bugs::default()));
    if let Err(e) = r {
        panic!("{e}");
    }
}

/// The sequences the model test shrank its failures to, kept: each once disagreed with the
/// model (the model's error or the mount's), and each must agree from now on.
#[test]
fn the_sequences_the_model_test_once_failed_on_agree() {
    use Op::*;
    let bench = Bench::new();
    let sequences: Vec<(&str, Vec<Op>)> = vec![
        ("a new file's time is now", vec![Create { path: 5, excl: false }, Stat { path: 5 }]),
        (
            "a rename between two names of one file does nothing",
            vec![
                Create { path: 5, excl: false },
                Link { from: 5, to: 1 },
                Rename { from: 1, to: 5, noreplace: false },
                Fstat { slot: 0 },
            ],
        ),
        (
            "O_TRUNC marks the times of an empty file too",
            vec![
                Create { path: 5, excl: false },
                Create { path: 5, excl: false },
                Utime { slot: Some(0), path: 0, secs: 1_000_000 },
                Open { path: 5, write: true, trunc: true },
                Fstat { slot: 0 },
            ],
        ),
        (
            "hard links to a symlink are one symlink",
            vec![
                Symlink { path: 1, target: 0 },
                Link { from: 1, to: 5 },
                Rename { from: 5, to: 1, noreplace: false },
                Link { from: 2, to: 0 },
            ],
        ),
        (
            "an unlinked open file keeps the time a utime gave it",
            vec![
                Create { path: 7, excl: false },
                Write { slot: 0, offset: 0, len: 1, seed: 0 },
                Utime { slot: Some(0), path: 0, secs: 1_000_000 },
                Unlink { path: 7 },
                Fstat { slot: 0 },
            ],
        ),
        (
            "a utime on an unlinked open file with nothing unsaved is kept",
            vec![
                Create { path: 0, excl: false },
                Unlink { path: 0 },
                Utime { slot: Some(0), path: 0, secs: 1_000_000 },
                Fstat { slot: 0 },
            ],
        ),
    ];
    for (what, ops) in sequences {
        if let Err(e) = bench.run(&ops, Bugs::default()) {
            panic!("{what}: {e}");
        }
    }
}

/// The test finds the faults it is there for: each planted one fails it within the first
/// sequences of a fixed seed.
#[test]
fn the_model_test_catches_a_stale_size_and_a_rename_that_loses_writes() {
    let bench = Bench::new();
    // Each is caught by the violation it plants, not by any: the stale size by a `stat` that
    // disagrees on the size, the rename by a sequence that needs the rename of an open file.
    let stale = |ops: &[Op], why: &str| {
        matches!(ops.last(), Some(Op::Stat { .. } | Op::Fstat { .. })) && why.contains("size: Some")
    };
    let renamed = |ops: &[Op], _: &str| {
        let open = ops.iter().position(|o| matches!(o, Op::Create { .. } | Op::Open { .. }));
        open.is_some_and(|i| ops[i..].iter().any(|o| matches!(o, Op::Rename { .. })))
    };
    type Shows = dyn Fn(&[Op], &str) -> bool;
    for (what, bugs, shows) in [
        ("the stale size", Bugs { stale_size: true, ..Default::default() }, &stale as &Shows),
        (
            "the rename that loses an open file's writes",
            Bugs { rename_keeps_open_files: true, ..Default::default() },
            &renamed as &Shows,
        ),
    ] {
        let config = Config { cases: 2_000, failure_persistence: None, ..Config::default() };
        let mut runner = TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
        let r = runner.run(&sequences(), |ops| bench.run(&ops, bugs));
        match r {
            Err(proptest::test_runner::TestError::Fail(why, ops)) => {
                let why = why.to_string();
                assert!(shows(&ops, &why), "{what}: caught by another violation: {why}\n{ops:#?}");
                eprintln!("{what}: caught, shrunk to {} steps: {why}", ops.len());
            }
            other => panic!("{what} was not caught: {other:?}"),
        }
    }
}

// ---------------------------------------------------------------- the sequence fsx found

/// The shape of every failure fsx found (#51): a truncate that shrinks the file, then a copy,
/// a write and a fallocate that grow it again, the change log telling of the truncate between
/// them — and `fstat` (a getattr without the handle, as the kernel sends it) answered the
/// truncated size. It must answer the open file's size throughout.
#[test]
fn a_file_grown_after_a_truncate_keeps_its_size_while_open() {
    let bench = Bench::new();
    let (fs, root) = bench.fresh(Bugs::default()).expect("a directory");
    let dir = fs.getattr(INodeNo(ROOT_INO), None).expect("the mount's root");
    let (a, fh) =
        fs.create(CALLER, dir.ino, OsStr::new("f"), 0o100644, 0o022, libc::O_RDWR | libc::O_CREAT).expect("create");
    let file = tidemark_core::path::join(&root, "f");
    let size = |what: &str, want: u64| {
        fs.inodes().changed(&file);
        assert_eq!(fs.getattr(a.ino, None).expect("getattr").size, want, "size by inode after {what}");
        // (`lseek(SEEK_END)` is the kernel's: it asks for the size by the handle.)
        assert_eq!(fs.getattr(a.ino, Some(fh)).expect("getattr").size, want, "SEEK_END after {what}");
        assert_eq!(fs.lookup(dir.ino, OsStr::new("f")).expect("lookup").size, want, "size by name after {what}");
        // (Its last byte is data after each step: the hole that follows it is the end.)
        let hole = fs.lseek(fh, want as i64 - 1, libc::SEEK_HOLE).expect("lseek");
        assert_eq!(hole, want as i64, "SEEK_HOLE after {what}");
    };
    fs.write(fh, 0, &data(0x40000, 1)).expect("write");
    size("the first write", 0x40000);
    fs.fsync(fh).expect("fsync");
    let truncate = SetAttr { size: Some(0x110a3), mtime: Some(TimeOrNow::Now), ..Default::default() };
    fs.setattr(a.ino, truncate, Some(fh)).expect("truncate down");
    size("TRUNCATE DOWN from 0x40000 to 0x110a3", 0x110a3);
    let copied = fs.copy_file_range(fh, 0x807d, fh, 0x35e34, 0x10159 - 0x807d + 1).expect("copy");
    assert_eq!(copied as u64, 0x10159 - 0x807d + 1);
    size("COPY 0x807d thru 0x10159 to 0x35e34 thru 0x3df10", 0x3df11);
    fs.write(fh, 0x1000, &data(0x2000, 2)).expect("interior write");
    size("an interior WRITE", 0x3df11);
    fs.fallocate(fh, 0x2000, 0x3000, 0).expect("fallocate");
    size("FALLOC INTERIOR", 0x3df11);
    let got = fs.read(fh, 0x28b19, (0x2e62b - 0x28b19 + 1) as u32).expect("read").to_vec();
    assert_eq!(got.len(), 0x2e62b - 0x28b19 + 1, "READ 0x28b19 thru 0x2e62b reads to its end");
    fs.release(fh).expect("close");
    fs.inodes().changed(&file);
    assert_eq!(fs.getattr(a.ino, None).expect("getattr").size, 0x3df11, "size by inode after the close");
    assert_eq!(fs.lookup(dir.ino, OsStr::new("f")).expect("lookup").size, 0x3df11, "size by name after the close");
}

/// The same while reads and writes through other handles are in flight (the kernel's reads and
/// its writeback of mapped pages hold a handle busy): every size asked for between two changes
/// is the one the last change made, never an older one.
#[test]
fn sizes_hold_while_reads_and_writebacks_are_in_flight() {
    let bench = Bench::new();
    let (fs, root) = bench.fresh(Bugs::default()).expect("a directory");
    let dir = fs.getattr(INodeNo(ROOT_INO), None).expect("the mount's root");
    let (a, fh) =
        fs.create(CALLER, dir.ino, OsStr::new("f"), 0o100644, 0o022, libc::O_RDWR | libc::O_CREAT).expect("create");
    let file = tidemark_core::path::join(&root, "f");
    fs.write(fh, 0, &data(0x20000, 1)).expect("write");
    let reader =
        fs.open(a.ino, libc::O_RDONLY, &|_| Err(std::io::Error::other("no kernel"))).expect("open for reads").fh;
    let writer =
        fs.open(a.ino, libc::O_RDWR, &|_| Err(std::io::Error::other("no kernel"))).expect("open for writeback").fh;
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut off = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                fs.read(reader, off % 0x20000, 0x8000).expect("a read in flight");
                off += 0x3000;
            }
        });
        s.spawn(|| {
            let mut n = 0u8;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Pages below the smallest size the file takes: a writeback never grows it.
                fs.write(writer, 0, &[n; 4096]).expect("a writeback in flight");
                n = n.wrapping_add(1);
            }
        });
        // (The loop answers rather than panics: the threads in flight stop either way.)
        let changes = || -> Result<(), String> {
            let mut rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
            for i in 0..300 {
                let want = 4096 + rng.next_u64() % 0x40000;
                if i % 2 == 0 {
                    let set = SetAttr { size: Some(want), mtime: Some(TimeOrNow::Now), ..Default::default() };
                    fs.setattr(a.ino, set, Some(fh)).map_err(|e| format!("step {i}: truncate: {e:?}"))?;
                } else {
                    let cur = fs.getattr(a.ino, Some(fh)).map_err(|e| format!("step {i}: getattr: {e:?}"))?.size;
                    if want > cur {
                        fs.write(fh, want - 1, b"x").map_err(|e| format!("step {i}: write: {e:?}"))?;
                    } else {
                        fs.fallocate(fh, 0, want, 0).map_err(|e| format!("step {i}: fallocate: {e:?}"))?;
                        let set = SetAttr { size: Some(want), ..Default::default() };
                        fs.setattr(a.ino, set, None).map_err(|e| format!("step {i}: truncate by name: {e:?}"))?;
                    }
                }
                if i % 3 == 0 {
                    fs.inodes().changed(&file);
                }
                if i % 10 == 0 {
                    fs.fsync(writer).map_err(|e| format!("step {i}: fsync: {e:?}"))?;
                }
                let by_inode = fs.getattr(a.ino, None).map(|a| a.size);
                let end = fs.getattr(a.ino, Some(reader)).map(|a| a.size as i64);
                if by_inode != Ok(want) || end != Ok(want as i64) {
                    return Err(format!(
                        "step {i}: size {want} answered as {by_inode:?} by inode, {end:?} by SEEK_END"
                    ));
                }
            }
            Ok(())
        };
        let r = changes();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        r
    })
    .expect("every size right");
    for h in [fh, reader, writer] {
        fs.release(h).expect("close");
    }
}

/// What the mount refuses by design answers the errno docs/SEMANTICS.md gives for it.
#[test]
fn what_the_mount_refuses_by_design_answers_its_errno() {
    let bench = Bench::new();
    let (fs, _) = bench.fresh(Bugs::default()).expect("a directory");
    let root = INodeNo(ROOT_INO);
    let d = fs.mkdir(CALLER, root, OsStr::new("d"), 0o755, 0o022).expect("mkdir");
    let (a, fh) =
        fs.create(CALLER, root, OsStr::new("f"), 0o100644, 0o022, libc::O_RDWR | libc::O_CREAT).expect("create");
    fs.write(fh, 0, &data(8192, 1)).expect("write");
    let exchange = fs.rename(root, OsStr::new("f"), root, OsStr::new("d"), RenameFlags::RENAME_EXCHANGE);
    assert_eq!(exchange, Err(Errno::EINVAL), "RENAME_EXCHANGE");
    for mode in [
        libc::FALLOC_FL_COLLAPSE_RANGE,
        libc::FALLOC_FL_INSERT_RANGE,
        libc::FALLOC_FL_UNSHARE_RANGE,
        libc::FALLOC_FL_PUNCH_HOLE,
    ] {
        assert_eq!(fs.fallocate(fh, 0, 4096, mode), Err(Errno::EOPNOTSUPP), "fallocate mode {mode:#x}");
    }
    for name in ["trusted.x", "security.x", "system.x"] {
        assert_eq!(fs.setxattr(a.ino, OsStr::new(name), b"v", 0), Err(Errno::ENOTSUP), "setxattr {name}");
    }
    assert_eq!(fs.link(d.ino, root, OsStr::new("d2")).map(drop), Err(Errno::EPERM), "a link to a directory");
    let long = "n".repeat(256);
    assert_eq!(fs.mkdir(CALLER, root, OsStr::new(&long), 0o755, 0o022).map(drop), Err(Errno::ENAMETOOLONG));
    fs.release(fh).expect("close");
}

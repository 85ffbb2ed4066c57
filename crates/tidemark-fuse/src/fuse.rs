//! The adapter between the kernel (through `fuser`) and the mount's operations (`ops.rs`):
//! each request is handed to its operation, and its `Result` sent back as the reply. Nothing
//! here decides anything.

use std::ffi::OsStr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use fuser::{
    CopyFileRangeFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use tidemark_core::path;

use crate::ops::{Caller, SetAttr, TidemarkFs};
use crate::read::{Answer, GATHERED};

/// The mount's operations as a `fuser` file system.
pub struct Fuse(pub Arc<TidemarkFs>);

fn caller(req: &Request) -> Caller {
    Caller { uid: req.uid(), gid: req.gid() }
}

fn empty(reply: ReplyEmpty, r: Result<(), Errno>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn entry(fs: &TidemarkFs, reply: ReplyEntry, r: Result<fuser::FileAttr, Errno>) {
    match r {
        Ok(a) => reply.entry(&fs.opts.ttl, &a, Generation(0)),
        Err(e) => reply.error(e),
    }
}

fn attr(fs: &TidemarkFs, reply: ReplyAttr, r: Result<fuser::FileAttr, Errno>) {
    match r {
        Ok(a) => reply.attr(&fs.opts.ttl, &a),
        Err(e) => reply.error(e),
    }
}

/// An xattr's answer: its size when asked for 0 bytes, ERANGE when it does not fit.
fn xattr(reply: ReplyXattr, size: u32, data: Result<Vec<u8>, Errno>) {
    match data {
        Ok(d) if size == 0 => reply.size(d.len() as u32),
        Ok(d) if d.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(d) => reply.data(&d),
        Err(e) => reply.error(e),
    }
}

impl Filesystem for Fuse {
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        if !self.0.opts.passthrough {
            return Ok(());
        }
        // Depth 2: the filer's files may lie on a stacked file system (overlayfs, containers).
        let depth = config.set_max_stack_depth(2).or_else(|n| config.set_max_stack_depth(n));
        match (config.add_capabilities(fuser::InitFlags::FUSE_PASSTHROUGH), depth) {
            (Ok(()), Ok(_)) => self.0.passthrough.store(true, Ordering::Relaxed),
            _ => tracing::info!("the kernel offers no FUSE passthrough: reads go through the mount"),
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        entry(&self.0, reply, self.0.lookup(parent, name))
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        attr(&self.0, reply, self.0.getattr(ino, fh))
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
        let set = SetAttr { mode, uid, gid, size, atime, mtime };
        attr(&self.0, reply, self.0.setattr(ino, set, fh))
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        entry(&self.0, reply, self.0.mkdir(caller(req), parent, name, mode, umask))
    }

    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        entry(&self.0, reply, self.0.mknod(caller(req), parent, name, mode, umask, rdev))
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &std::path::Path, reply: ReplyEntry) {
        entry(&self.0, reply, self.0.symlink(caller(req), parent, link_name, target))
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.0.readlink(ino) {
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
        empty(reply, self.0.setxattr(ino, name, value, flags))
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        xattr(reply, size, self.0.getxattr(ino, name))
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        xattr(reply, size, self.0.listxattr(ino))
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.0.removexattr(ino, name))
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        entry(&self.0, reply, self.0.link(ino, newparent, newname))
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.0.unlink(parent, name))
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.0.rmdir(parent, name))
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
        empty(reply, self.0.rename(parent, name, newparent, newname, flags))
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.0.open(ino, flags.0, &|f| reply.open_backing(f)) {
            Ok(o) if o.backed => self.0.with_backing(ino, |b| match b {
                Some(b) => reply.opened_passthrough(o.fh, o.flags, b),
                None => reply.error(Errno::EIO),
            }),
            Ok(o) => reply.opened(o.fh, o.flags),
            Err(e) => reply.error(e),
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
        match self.0.create(caller(req), parent, name, mode, umask, flags) {
            Ok((a, fh)) => reply.created(&self.0.opts.ttl, &a, Generation(0), fh, FopenFlags::empty()),
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
        match self.0.read(fh, offset, size) {
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
        match self.0.write(fh, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        empty(reply, self.0.flush(fh))
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        empty(reply, self.0.fsync(fh))
    }

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
        empty(reply, self.0.fallocate(fh, offset, length, mode))
    }

    fn lseek(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: i64, whence: i32, reply: ReplyLseek) {
        match self.0.lseek(fh, offset, whence) {
            Ok(o) => reply.offset(o),
            Err(e) => reply.error(e),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        match self.0.copy_file_range(fh_in, offset_in, fh_out, offset_out, len) {
            Ok(n) => reply.written(n),
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
        empty(reply, self.0.release(fh))
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.0.opendir(ino) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        match self.0.readdir(ino) {
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

//! A directory on this machine as a bucket: `-local.root=/srv/buckets` and bucket `photos` is the
//! directory `/srv/buckets/photos`. Keys are relative paths; every directory is listed as a
//! directory marker (`a/`), so empty directories mirror too. The listing is in byte order of the
//! key, produced by a sorted depth-first walk in which a directory sorts as its name plus `/`
//! (that is where its keys fall among its siblings'), so memory stays O(depth × width).
//!
//! A filesystem cannot hold every key S3 can (`a//b`, `..`); such keys are refused. It keeps no
//! user metadata either: echoes of this cluster's uploads are recognised by their recorded etag.

use std::collections::BTreeMap;
use std::io::SeekFrom;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use tidemark_core::remote::{ListPage, RemoteConf, RemoteObject};
use tidemark_core::{ByteRange, ByteStream, Error, RemoteStorage, Result, path};

pub const SETTINGS: &[(&str, &str)] = &[("root", "the directory whose subdirectories are the buckets")];

/// The etag of every directory marker: a directory has no content to version.
const DIR_ETAG: &str = "dir";
const TMP_PREFIX: &str = ".tidemark-tmp-";

/// Which directories a local remote may serve: the operator's choice (`--local-root DIR` on the
/// filer, server and worker), because whoever may configure remotes could otherwise point one at
/// `/` and read or write any file the process can. A bucket is allowed when its directory (with
/// every link in its path resolved) lies at or below an allowed one.
#[derive(Debug, Clone)]
pub struct LocalRoots {
    /// `None`: any directory (a client working with its own user's rights, like the shell).
    allowed: Option<Vec<PathBuf>>,
}

/// None: a process that serves others must be told which directories it may serve.
impl Default for LocalRoots {
    fn default() -> Self {
        LocalRoots { allowed: Some(Vec::new()) }
    }
}

impl LocalRoots {
    /// Any directory: for programs that act with the rights of the user who runs them.
    pub fn any() -> Self {
        LocalRoots { allowed: None }
    }

    /// Only these directories and what lies below them; each must exist.
    pub fn only(dirs: &[PathBuf]) -> Result<Self> {
        let mut allowed = Vec::with_capacity(dirs.len());
        for d in dirs {
            let c = std::fs::canonicalize(d)
                .map_err(|e| Error::invalid_argument(format!("--local-root {}: {e}", d.display())))?;
            if !c.is_dir() {
                return Err(Error::invalid_argument(format!("--local-root {}: not a directory", d.display())));
            }
            allowed.push(c);
        }
        Ok(LocalRoots { allowed: Some(allowed) })
    }

    /// The same with one more directory allowed.
    pub fn with(mut self, dir: &Path) -> Result<Self> {
        if let Some(a) = &mut self.allowed {
            a.extend(LocalRoots::only(&[dir.to_path_buf()])?.allowed.unwrap_or_default());
        }
        Ok(self)
    }

    /// Whether `dir` (a bucket's directory) may be served; the error says how to allow it.
    pub fn check(&self, dir: &Path) -> Result<()> {
        let Some(allowed) = &self.allowed else { return Ok(()) };
        let real = std::fs::canonicalize(dir).map_err(|e| io_err("resolving", dir, e))?;
        if allowed.iter().any(|a| real.starts_with(a)) {
            return Ok(());
        }
        let shown = if allowed.is_empty() {
            "none".to_string()
        } else {
            allowed.iter().map(|a| a.display().to_string()).collect::<Vec<_>>().join(", ")
        };
        Err(Error::Unauthorized {
            message: format!(
                "the local directory {} is not one this process may serve (allowed: {shown}); \
                 start the filer, server or worker with --local-root {} to allow it",
                real.display(),
                real.display()
            ),
        })
    }
}

#[derive(Debug, Clone)]
pub struct LocalStorage {
    /// The bucket's directory, every link in its path resolved: from here on no link is followed.
    root: PathBuf,
    bucket: String,
}

fn io_err(what: &str, p: &Path, e: std::io::Error) -> Error {
    Error::io(format!("{what} {}", p.display()), e)
}

/// What a listing or a stat needs of a file or directory.
struct Meta {
    is_dir: bool,
    ino: u64,
    mtime_ns: i128,
    len: u64,
}

impl Meta {
    fn of_stat(st: &rustix::fs::Stat) -> Meta {
        Meta {
            is_dir: rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory,
            ino: st.st_ino,
            mtime_ns: st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128,
            len: st.st_size as u64,
        }
    }
}

fn object_of(key: String, md: &Meta) -> RemoteObject {
    RemoteObject {
        key,
        size: if md.is_dir { 0 } else { md.len },
        etag: if md.is_dir { DIR_ETAG.into() } else { format!("{:x}-{:x}-{:x}", md.ino, md.mtime_ns, md.len) },
        last_modified_ms: (md.mtime_ns / 1_000_000) as i64,
        version_id: None,
        user_metadata: None,
        headers: None,
    }
}

/// How every directory of a bucket is opened: for reading, never through a link.
const DIR_FLAGS: rustix::fs::OFlags = rustix::fs::OFlags::DIRECTORY
    .union(rustix::fs::OFlags::NOFOLLOW)
    .union(rustix::fs::OFlags::RDONLY)
    .union(rustix::fs::OFlags::CLOEXEC);

/// The directory `name` inside `dir`; a link there fails with `ELOOP`/`ENOTDIR`.
fn open_subdir(dir: &OwnedFd, name: &str) -> std::result::Result<OwnedFd, rustix::io::Errno> {
    rustix::fs::openat(dir, name, DIR_FLAGS, rustix::fs::Mode::empty())
}

/// Why an operation met a symbolic link: a local bucket holds files and directories only, and a
/// link is never followed (it could lead anywhere on the machine).
fn is_link_error(e: &rustix::io::Errno) -> bool {
    *e == rustix::io::Errno::LOOP || *e == rustix::io::Errno::NOTDIR
}

impl LocalStorage {
    /// Opens `bucket` of a configured local remote, if `roots` allow its directory.
    pub fn open(conf: &RemoteConf, bucket: &str, roots: &LocalRoots) -> Result<Self> {
        let root = conf.setting("root").ok_or_else(|| {
            Error::invalid_argument(format!(
                "remote {:?} has no -local.root: set the directory that holds the buckets",
                conf.name
            ))
        })?;
        let storage = Self::at(Path::new(root), bucket)?;
        roots.check(&storage.root)?;
        Ok(storage)
    }

    /// Opens `root/bucket` with no check of the operator's allowed roots.
    pub fn at(root: &Path, bucket: &str) -> Result<Self> {
        if bucket.is_empty() || bucket.contains('/') || path::segment_problem(bucket).is_some() {
            return Err(Error::invalid_argument(format!("bad bucket name {bucket:?} for a local remote")));
        }
        let dir = root.join(bucket);
        match std::fs::metadata(&dir) {
            Ok(m) if m.is_dir() => {
                let real = std::fs::canonicalize(&dir).map_err(|e| io_err("resolving", &dir, e))?;
                Ok(LocalStorage { root: real, bucket: bucket.into() })
            }
            Ok(_) => Err(Error::invalid_argument(format!("{} is not a directory", dir.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::NotFound {
                path: format!("bucket {bucket:?} ({}: create it, or fix -local.root)", dir.display()),
            }),
            Err(e) => Err(io_err("opening", &dir, e)),
        }
    }

    /// The segments of the path a key names (owned: the blocking task that walks them outlives
    /// the call), or why it cannot name one.
    fn segments_of(&self, key: &str) -> Result<Vec<String>> {
        let rel = key.strip_suffix('/').unwrap_or(key);
        let bad =
            |why: &str| Error::invalid_argument(format!("key {key:?} cannot be stored in a local directory: {why}"));
        if rel.is_empty() {
            return Err(bad("it is empty"));
        }
        let segs: Vec<&str> = rel.split('/').collect();
        for seg in &segs {
            if let Some(why) = path::segment_problem(seg) {
                return Err(bad(why));
            }
            if seg.starts_with(TMP_PREFIX) {
                return Err(bad("names starting with .tidemark-tmp- are reserved"));
            }
        }
        Ok(segs.into_iter().map(str::to_string).collect())
    }

    /// The bucket's directory, opened without following a link.
    fn open_root(&self) -> std::result::Result<OwnedFd, rustix::io::Errno> {
        rustix::fs::open(&self.root, DIR_FLAGS, rustix::fs::Mode::empty())
    }

    /// The directory `segs` names below the bucket, each step opened with `O_NOFOLLOW`: a link
    /// anywhere on the way fails with `ELOOP`/`ENOTDIR`. With `create`, missing steps are made.
    fn open_dir(&self, segs: &[String], create: bool) -> std::result::Result<OwnedFd, rustix::io::Errno> {
        let mut dir = self.open_root()?;
        for seg in segs {
            if create {
                match rustix::fs::mkdirat(&dir, seg.as_str(), rustix::fs::Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(e),
                }
            }
            dir = open_subdir(&dir, seg)?;
        }
        Ok(dir)
    }

    fn errno(&self, what: &str, key: &str, e: rustix::io::Errno) -> Error {
        io_err(what, &self.root.join(key), std::io::Error::from(e))
    }

    fn link_refused(&self, key: &str) -> Error {
        Error::invalid_argument(format!(
            "{}/{key}: a symbolic link is on its path; a local bucket holds files and directories only, and Tidemark never follows a link in one",
            self.bucket
        ))
    }
}

/// One page of the sorted walk: keys under the directory `dir` (whose keys start with
/// `key_prefix`) that start with `prefix` and are greater than `after`. Returns `true` once
/// `out` holds `max` objects. Every directory is opened below its parent without following a
/// link, and links are skipped: a listing shows only what lies inside the bucket.
fn walk(
    dir: &OwnedFd,
    key_prefix: &str,
    prefix: &str,
    after: &str,
    max: usize,
    out: &mut Vec<RemoteObject>,
) -> std::result::Result<bool, rustix::io::Errno> {
    use rustix::fs::{AtFlags, FileType};
    let mut children: Vec<(String, bool)> = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().to_str().map(str::to_string) else {
            tracing::warn!(under = key_prefix, "skipping a file whose name is not UTF-8");
            continue;
        };
        if name == "." || name == ".." || name.starts_with(TMP_PREFIX) {
            continue;
        }
        let ft = match entry.file_type() {
            FileType::Unknown => match rustix::fs::statat(dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => FileType::from_raw_mode(st.st_mode),
                Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(e),
            },
            ft => ft,
        };
        match ft {
            FileType::Symlink => {
                tracing::warn!(key = %format!("{key_prefix}{name}").escape_debug(), "skipping a symbolic link: a local bucket holds files and directories only");
            }
            FileType::Directory => children.push((name, true)),
            FileType::RegularFile => children.push((name, false)),
            _ => {
                tracing::warn!(key = %format!("{key_prefix}{name}").escape_debug(), "skipping a special file (device, socket or FIFO)")
            }
        }
    }
    let sort_key = |(name, is_dir): &(String, bool)| if *is_dir { format!("{name}/") } else { name.clone() };
    children.sort_by_cached_key(sort_key);
    for (name, is_dir) in children {
        if is_dir {
            let marker = format!("{key_prefix}{name}/");
            let end = format!("{key_prefix}{name}0"); // every key below sorts in [marker, end)
            if end.as_str() <= after || !(marker.starts_with(prefix) || prefix.starts_with(&marker)) {
                continue;
            }
            let sub = match open_subdir(dir, &name) {
                Ok(fd) => fd,
                // Removed, or replaced by a link or a file, since the directory was read.
                Err(e) if e == rustix::io::Errno::NOENT || is_link_error(&e) => continue,
                Err(e) => return Err(e),
            };
            if marker.as_str() > after && marker.starts_with(prefix) {
                out.push(object_of(marker.clone(), &Meta::of_stat(&rustix::fs::fstat(&sub)?)));
                if out.len() >= max {
                    return Ok(true);
                }
            }
            if walk(&sub, &marker, prefix, after, max, out)? {
                return Ok(true);
            }
        } else {
            let key = format!("{key_prefix}{name}");
            if key.as_str() > after && key.starts_with(prefix) {
                match rustix::fs::statat(dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {
                        out.push(object_of(key, &Meta::of_stat(&st)))
                    }
                    // Replaced by something else since the directory was read.
                    Ok(_) => continue,
                    // Removed since the directory was read: not there any more.
                    Err(rustix::io::Errno::NOENT) => continue,
                    Err(e) => return Err(e),
                }
                if out.len() >= max {
                    return Ok(true);
                }
            }
        }
    }
    Ok(false)
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| Error::internal(format!("local storage task failed: {e}")))?
}

#[async_trait]
impl RemoteStorage for LocalStorage {
    fn describe(&self) -> String {
        format!("local:{}", self.root.display())
    }

    async fn stat(&self, key: &str) -> Result<Option<RemoteObject>> {
        let segs = self.segments_of(key)?;
        let (this, key) = (self.clone(), key.to_string());
        blocking(move || {
            use rustix::fs::{AtFlags, FileType};
            let (name, parents) = segs.split_last().expect("a key has a segment");
            let dir = match this.open_dir(parents, false) {
                Ok(d) => d,
                // Nothing there, or a link on the way: no object by that key in this bucket.
                Err(e) if e == rustix::io::Errno::NOENT || is_link_error(&e) => return Ok(None),
                Err(e) => return Err(this.errno("reading", &key, e)),
            };
            let st = match rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(e) if e == rustix::io::Errno::NOENT || e == rustix::io::Errno::NOTDIR => return Ok(None),
                Err(e) => return Err(this.errno("reading", &key, e)),
            };
            let want_dir = key.ends_with('/');
            Ok(match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory if want_dir => Some(object_of(key, &Meta::of_stat(&st))),
                FileType::RegularFile if !want_dir => Some(object_of(key, &Meta::of_stat(&st))),
                _ => None,
            })
        })
        .await
    }

    async fn list(&self, prefix: &str, start_after: Option<&str>, page: Option<&str>, max: usize) -> Result<ListPage> {
        let (this, prefix) = (self.clone(), prefix.to_string());
        let after = page.or(start_after).unwrap_or("").to_string();
        let max = max.max(1);
        blocking(move || {
            let mut out = Vec::with_capacity(max + 1);
            let listed = this.open_root().and_then(|root| walk(&root, "", &prefix, &after, max + 1, &mut out));
            listed.map_err(|e| io_err("listing", &this.root, std::io::Error::from(e)))?;
            let more = out.len() > max;
            out.truncate(max);
            let next = if more { out.last().map(|o| o.key.clone()) } else { None };
            Ok(ListPage { objects: out, next })
        })
        .await
    }

    async fn get(&self, key: &str, range: Option<ByteRange>, if_etag: Option<&str>) -> Result<ByteStream> {
        let segs = self.segments_of(key)?;
        let (this, owned_key) = (self.clone(), key.to_string());
        let opened = blocking(move || {
            use rustix::fs::{Mode, OFlags};
            let key = owned_key;
            let (name, parents) = segs.split_last().expect("a key has a segment");
            let file = this.open_dir(parents, false).and_then(|dir| {
                rustix::fs::openat(
                    &dir,
                    name.as_str(),
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
            });
            match file.and_then(|fd| rustix::fs::fstat(&fd).map(|st| (std::fs::File::from(fd), st))) {
                Ok(opened) => Ok(opened),
                Err(rustix::io::Errno::NOENT) => Err(Error::not_found(format!("{}/{key}", this.bucket))),
                Err(e) if is_link_error(&e) => Err(this.link_refused(&key)),
                Err(e) => Err(this.errno("opening", &key, e)),
            }
        })
        .await?;
        let (file, st) = opened;
        match rustix::fs::FileType::from_raw_mode(st.st_mode) {
            rustix::fs::FileType::RegularFile => {}
            rustix::fs::FileType::Directory => return Err(Error::IsADirectory { path: key.into() }),
            _ => return Err(Error::invalid_argument(format!("{}/{key} is not a regular file", self.bucket))),
        }
        let p = self.root.join(key);
        let mut f = tokio::fs::File::from_std(file);
        if let Some(want) = if_etag
            && object_of(key.into(), &Meta::of_stat(&st)).etag != want
        {
            return Err(Error::PreconditionFailed { path: key.into(), current: None });
        }
        // 256 KiB pieces: `ReaderStream`'s default of 4 KiB costs a frame per page.
        const PIECE: usize = 256 << 10;
        let Some(r) = range else { return Ok(tokio_util::io::ReaderStream::with_capacity(f, PIECE).boxed()) };
        f.seek(SeekFrom::Start(r.offset)).await.map_err(|e| io_err("seeking", &p, e))?;
        Ok(match r.length {
            Some(n) => tokio_util::io::ReaderStream::with_capacity(f.take(n), PIECE).boxed(),
            None => tokio_util::io::ReaderStream::with_capacity(f, PIECE).boxed(),
        })
    }

    async fn put(&self, key: &str, body: Bytes, _metadata: BTreeMap<String, String>) -> Result<RemoteObject> {
        let segs = self.segments_of(key)?;
        let (this, owned_key) = (self.clone(), key.to_string());
        blocking(move || {
            use rustix::fs::{AtFlags, FileType, Mode, OFlags};
            let key = owned_key;
            let fail = |what: &str, e: rustix::io::Errno| {
                if is_link_error(&e) { this.link_refused(&key) } else { this.errno(what, &key, e) }
            };
            if key.ends_with('/') {
                let dir = this.open_dir(&segs, true).map_err(|e| fail("creating", e))?;
                let st = rustix::fs::fstat(&dir).map_err(|e| fail("reading", e))?;
                return Ok(object_of(key.clone(), &Meta::of_stat(&st)));
            }
            let (name, parents) = segs.split_last().expect("a key has a segment");
            let dir = this.open_dir(parents, true).map_err(|e| fail("creating", e))?;
            match rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
                    return Err(this.link_refused(&key));
                }
                _ => {}
            }
            let tmp = format!("{TMP_PREFIX}{}", tidemark_core::ids::random_hex(8, "a temporary file name")?);
            let fd = rustix::fs::openat(
                &dir,
                tmp.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            )
            .map_err(|e| fail("creating", e))?;
            let mut f = std::fs::File::from(fd);
            let written = std::io::Write::write_all(&mut f, &body).and_then(|()| f.sync_all());
            if let Err(e) = written {
                let _ = rustix::fs::unlinkat(&dir, tmp.as_str(), AtFlags::empty());
                return Err(io_err("writing", &this.root.join(&key), e));
            }
            if let Err(e) = rustix::fs::renameat(&dir, tmp.as_str(), &dir, name.as_str()) {
                let _ = rustix::fs::unlinkat(&dir, tmp.as_str(), AtFlags::empty());
                return Err(fail("renaming into", e));
            }
            let st = rustix::fs::fstat(&f).map_err(|e| fail("reading", e))?;
            Ok(object_of(key.clone(), &Meta::of_stat(&st)))
        })
        .await
    }

    async fn delete(&self, key: &str) -> Result<()> {
        let segs = self.segments_of(key)?;
        let (this, owned_key) = (self.clone(), key.to_string());
        blocking(move || {
            use rustix::fs::{AtFlags, FileType};
            let key = owned_key;
            let (name, parents) = segs.split_last().expect("a key has a segment");
            let dir = match this.open_dir(parents, false) {
                Ok(d) => d,
                // Nothing there by that key, or a link on the way: nothing of the bucket's to remove.
                Err(e) if e == rustix::io::Errno::NOENT || is_link_error(&e) => return Ok(()),
                Err(e) => return Err(this.errno("removing", &key, e)),
            };
            let flags = match rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => match FileType::from_raw_mode(st.st_mode) {
                    FileType::Directory if key.ends_with('/') => AtFlags::REMOVEDIR,
                    FileType::RegularFile if !key.ends_with('/') => AtFlags::empty(),
                    // A link, or not the kind the key names: not this object; left alone.
                    _ => return Ok(()),
                },
                Err(rustix::io::Errno::NOENT) => return Ok(()),
                Err(e) => return Err(this.errno("removing", &key, e)),
            };
            match rustix::fs::unlinkat(&dir, name.as_str(), flags) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
                // A directory marker with keys below it: in a bucket the keys stay when their
                // prefix's marker goes; here the directory stays for them.
                Err(rustix::io::Errno::NOTEMPTY) if key.ends_with('/') => Ok(()),
                Err(e) => Err(this.errno("removing", &key, e)),
            }
        })
        .await
    }
}

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
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use tidemark_core::remote::{ListPage, RemoteConf, RemoteObject};
use tidemark_core::{ByteRange, ByteStream, Error, RemoteStorage, Result, path};

pub const SETTINGS: &[(&str, &str)] = &[("root", "the directory whose subdirectories are the buckets")];

/// The etag of every directory marker: a directory has no content to version.
const DIR_ETAG: &str = "dir";
const TMP_PREFIX: &str = ".tidemark-tmp-";

#[derive(Debug, Clone)]
pub struct LocalStorage {
    root: PathBuf,
    bucket: String,
}

fn io_err(what: &str, p: &Path, e: std::io::Error) -> Error {
    Error::io(format!("{what} {}", p.display()), e)
}

fn object_of(key: String, md: &std::fs::Metadata) -> RemoteObject {
    let mtime_ns = md.mtime() as i128 * 1_000_000_000 + md.mtime_nsec() as i128;
    let is_dir = md.is_dir();
    RemoteObject {
        key,
        size: if is_dir { 0 } else { md.len() },
        etag: if is_dir { DIR_ETAG.into() } else { format!("{:x}-{:x}-{:x}", md.ino(), mtime_ns, md.len()) },
        last_modified_ms: (mtime_ns / 1_000_000) as i64,
        version_id: None,
        user_metadata: None,
    }
}

impl LocalStorage {
    pub fn open(conf: &RemoteConf, bucket: &str) -> Result<Self> {
        let root = conf.setting("root").ok_or_else(|| {
            Error::invalid_argument(format!(
                "remote {:?} has no -local.root: set the directory that holds the buckets",
                conf.name
            ))
        })?;
        Self::at(Path::new(root), bucket)
    }

    pub fn at(root: &Path, bucket: &str) -> Result<Self> {
        if bucket.is_empty() || bucket.contains('/') || path::segment_problem(bucket).is_some() {
            return Err(Error::invalid_argument(format!("bad bucket name {bucket:?} for a local remote")));
        }
        let dir = root.join(bucket);
        match std::fs::metadata(&dir) {
            Ok(m) if m.is_dir() => Ok(LocalStorage { root: dir, bucket: bucket.into() }),
            Ok(_) => Err(Error::invalid_argument(format!("{} is not a directory", dir.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::NotFound {
                path: format!("bucket {bucket:?} ({}: create it, or fix -local.root)", dir.display()),
            }),
            Err(e) => Err(io_err("opening", &dir, e)),
        }
    }

    /// The file a key names, or why it cannot name one.
    fn file_of(&self, key: &str) -> Result<PathBuf> {
        let rel = key.strip_suffix('/').unwrap_or(key);
        let bad =
            |why: &str| Error::invalid_argument(format!("key {key:?} cannot be stored in a local directory: {why}"));
        if rel.is_empty() {
            return Err(bad("it is empty"));
        }
        for seg in rel.split('/') {
            if let Some(why) = path::segment_problem(seg) {
                return Err(bad(why));
            }
            if seg.starts_with(TMP_PREFIX) {
                return Err(bad("names starting with .tidemark-tmp- are reserved"));
            }
        }
        Ok(self.root.join(rel))
    }
}

/// One page of the sorted walk: keys under `dir` (whose keys start with `key_prefix`) that start
/// with `prefix` and are greater than `after`. Returns `true` once `out` holds `max` objects.
fn walk(
    dir: &Path,
    key_prefix: &str,
    prefix: &str,
    after: &str,
    max: usize,
    out: &mut Vec<RemoteObject>,
) -> std::io::Result<bool> {
    let mut children: Vec<(String, bool)> = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            tracing::warn!(dir = %dir.display(), "skipping a file whose name is not UTF-8");
            continue;
        };
        if name.starts_with(TMP_PREFIX) {
            continue;
        }
        let ft = entry.file_type()?;
        if ft.is_symlink() {
            tracing::warn!(file = %entry.path().display(), "skipping a symbolic link: a local bucket holds files and directories only");
            continue;
        }
        children.push((name, ft.is_dir()));
    }
    let sort_key = |(name, is_dir): &(String, bool)| if *is_dir { format!("{name}/") } else { name.clone() };
    children.sort_by_cached_key(sort_key);
    for (name, is_dir) in children {
        let p = dir.join(&name);
        if is_dir {
            let marker = format!("{key_prefix}{name}/");
            let end = format!("{key_prefix}{name}0"); // every key below sorts in [marker, end)
            if end.as_str() <= after || !(marker.starts_with(prefix) || prefix.starts_with(&marker)) {
                continue;
            }
            if marker.as_str() > after && marker.starts_with(prefix) {
                out.push(object_of(marker.clone(), &std::fs::metadata(&p)?));
                if out.len() >= max {
                    return Ok(true);
                }
            }
            if walk(&p, &marker, prefix, after, max, out)? {
                return Ok(true);
            }
        } else {
            let key = format!("{key_prefix}{name}");
            if key.as_str() > after && key.starts_with(prefix) {
                match std::fs::metadata(&p) {
                    Ok(md) => out.push(object_of(key, &md)),
                    // Removed since the directory was read: not there any more.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
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
        let p = self.file_of(key)?;
        let want_dir = key.ends_with('/');
        match tokio::fs::metadata(&p).await {
            Ok(md) if md.is_dir() == want_dir => Ok(Some(object_of(key.to_string(), &md))),
            Ok(_) => Ok(None),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory) => Ok(None),
            Err(e) => Err(io_err("reading", &p, e)),
        }
    }

    async fn list(&self, prefix: &str, start_after: Option<&str>, page: Option<&str>, max: usize) -> Result<ListPage> {
        let (root, prefix) = (self.root.clone(), prefix.to_string());
        let after = page.or(start_after).unwrap_or("").to_string();
        let max = max.max(1);
        blocking(move || {
            let mut out = Vec::with_capacity(max + 1);
            walk(&root, "", &prefix, &after, max + 1, &mut out).map_err(|e| io_err("listing", &root, e))?;
            let more = out.len() > max;
            out.truncate(max);
            let next = if more { out.last().map(|o| o.key.clone()) } else { None };
            Ok(ListPage { objects: out, next })
        })
        .await
    }

    async fn get(&self, key: &str, range: Option<ByteRange>, if_etag: Option<&str>) -> Result<ByteStream> {
        let p = self.file_of(key)?;
        let mut f = match tokio::fs::File::open(&p).await {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::not_found(format!("{}/{key}", self.bucket)));
            }
            Err(e) => return Err(io_err("opening", &p, e)),
        };
        let md = f.metadata().await.map_err(|e| io_err("reading", &p, e))?;
        if md.is_dir() {
            return Err(Error::IsADirectory { path: key.into() });
        }
        if let Some(want) = if_etag
            && object_of(key.into(), &md).etag != want
        {
            return Err(Error::PreconditionFailed { path: key.into(), current: None });
        }
        let Some(r) = range else { return Ok(tokio_util::io::ReaderStream::new(f).boxed()) };
        f.seek(SeekFrom::Start(r.offset)).await.map_err(|e| io_err("seeking", &p, e))?;
        Ok(match r.length {
            Some(n) => tokio_util::io::ReaderStream::new(f.take(n)).boxed(),
            None => tokio_util::io::ReaderStream::new(f).boxed(),
        })
    }

    async fn put(&self, key: &str, body: Bytes, _metadata: BTreeMap<String, String>) -> Result<RemoteObject> {
        let p = self.file_of(key)?;
        if key.ends_with('/') {
            tokio::fs::create_dir_all(&p).await.map_err(|e| io_err("creating", &p, e))?;
        } else {
            let parent = p.parent().unwrap_or(&self.root).to_path_buf();
            tokio::fs::create_dir_all(&parent).await.map_err(|e| io_err("creating", &parent, e))?;
            let mut rnd = [0u8; 8];
            getrandom::fill(&mut rnd).map_err(|e| Error::internal(format!("no randomness: {e}")))?;
            let tmp = parent.join(format!("{TMP_PREFIX}{}", u64::from_le_bytes(rnd)));
            let mut f = tokio::fs::File::create(&tmp).await.map_err(|e| io_err("creating", &tmp, e))?;
            let written = async {
                f.write_all(&body).await?;
                f.sync_all().await
            }
            .await;
            if let Err(e) = written {
                let _ = tokio::fs::remove_file(&tmp).await;
                return Err(io_err("writing", &tmp, e));
            }
            tokio::fs::rename(&tmp, &p).await.map_err(|e| io_err("renaming into", &p, e))?;
        }
        self.stat(key).await?.ok_or_else(|| Error::internal(format!("{key}: vanished right after it was written")))
    }

    async fn delete(&self, key: &str) -> Result<()> {
        let p = self.file_of(key)?;
        let removed =
            if key.ends_with('/') { tokio::fs::remove_dir(&p).await } else { tokio::fs::remove_file(&p).await };
        match removed {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_err("removing", &p, e)),
        }
        Ok(())
    }
}

//! File content that is not a remote object's: [`Blobs`], in the data directory ([`BlobDir`],
//! the embedded default) or on a shared object store ([`S3Blobs`], `--blob-store`). Either way
//! a write's bytes are durable *before* the entry that names them commits; so a crash at any
//! point leaves either the old entry or the new one, each with all of its bytes (at worst an
//! unreferenced blob is left behind — the collector's — never a referenced one missing).
//! Content of at most [`MAX_INLINE_BYTES`](tidemark_core::model::MAX_INLINE_BYTES) stays in the
//! store row instead.
//!
//! In the data directory a write streams into `tmp/`, is fsynced, and is renamed into `blobs/`.

use std::io::SeekFrom;
use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use md5::{Digest, Md5};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use tidemark_core::ids::{hex, random_hex};
use tidemark_core::model::MAX_INLINE_BYTES;
use tidemark_core::{ByteRange, ByteStream, Error, Result};

/// The pieces a blob is read in: large enough that a stream of them (over HTTP, too) costs
/// little per byte; `ReaderStream`'s default of 4 KiB held reads to ~50 MiB/s.
const READ_PIECE: usize = 256 * 1024;

/// Where the bytes of one write ended up.
#[derive(Debug)]
pub enum Stored {
    Inline(Bytes),
    Blob { id: String, size: u64 },
}

/// The stored bytes and their MD5 (hex), hashed as they streamed in.
#[derive(Debug)]
pub struct StoredContent {
    pub stored: Stored,
    pub md5: String,
}

#[derive(Debug, Clone)]
pub struct BlobDir {
    root: PathBuf,
    blobs: PathBuf,
    tmp: PathBuf,
}

pub(crate) fn new_id() -> Result<String> {
    random_hex(16, "a blob id")
}

pub(crate) fn valid_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

pub use crate::blobs_s3::{BlobStoreUrl, S3Blobs, part_size};

/// One page of a listing of blobs: `(id, last modified ms)` in id order, and where to go on.
pub type BlobPage = (Vec<(String, i64)>, Option<String>);

/// The MD5 of a large body, computed on a thread of its own as the body streams past, so that
/// hashing (about 700 MiB/s) overlaps storing the bytes instead of adding to it.
pub(crate) struct Md5Pipe {
    tx: Option<std::sync::mpsc::Sender<Bytes>>,
    done: tokio::task::JoinHandle<Md5>,
}

impl Md5Pipe {
    /// Continues `md5` (what has been hashed so far) on a blocking thread.
    pub(crate) fn start(mut md5: Md5) -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<Bytes>();
        let done = tokio::task::spawn_blocking(move || {
            for chunk in rx {
                md5.update(&chunk);
            }
            md5
        });
        Md5Pipe { tx: Some(tx), done }
    }

    pub(crate) fn update(&self, chunk: &Bytes) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(chunk.clone());
        }
    }

    pub(crate) async fn finish(mut self) -> Result<String> {
        self.tx = None;
        let md5 = (&mut self.done).await.map_err(|e| Error::internal(format!("hashing the body: {e}")))?;
        Ok(hex(&md5.finalize()))
    }
}

/// Where blobs are kept.
#[derive(Debug, Clone)]
pub enum Blobs {
    Dir(BlobDir),
    S3(S3Blobs),
}

impl Blobs {
    /// For messages: `the data directory` or `s3://bucket/prefix/`.
    pub fn describe(&self) -> String {
        match self {
            Blobs::Dir(d) => format!("the data directory ({})", d.blobs.display()),
            Blobs::S3(s) => s.url().location(),
        }
    }

    /// Whether every filer of a cluster reads these blobs.
    pub fn is_shared(&self) -> bool {
        matches!(self, Blobs::S3(_))
    }

    /// Refuses a write of `len` declared bytes that cannot fit where blobs go: the data
    /// directory's free space (less a margin for the store and the cache), or an object store's
    /// largest object (5 TiB). Free space can change before the body arrives; this only spares
    /// the spooling of a body that certainly cannot be kept.
    pub fn room_for(&self, path: &str, len: u64) -> Result<()> {
        if len <= MAX_INLINE_BYTES as u64 {
            return Ok(());
        }
        match self {
            Blobs::Dir(d) => {
                const MARGIN: u64 = 64 << 20;
                let vfs = rustix::fs::statvfs(&d.tmp)
                    .map_err(|e| Error::io(format!("the free space of {}", d.tmp.display()), e))?;
                let free = vfs.f_bavail.saturating_mul(vfs.f_frsize);
                if len.saturating_add(MARGIN) > free {
                    return Err(Error::TooLarge {
                        path: path.into(),
                        message: format!(
                            "the request declares {len} bytes, and {} has {free} bytes free (64 MiB of them kept for the store); \
                             nothing was stored: free space there, or write it where there is room",
                            self.describe()
                        ),
                    });
                }
                Ok(())
            }
            Blobs::S3(_) => {
                const LARGEST_OBJECT: u64 = 5 << 40;
                if len > LARGEST_OBJECT {
                    return Err(Error::TooLarge {
                        path: path.into(),
                        message: format!(
                            "the request declares {len} bytes; the blob store {} holds objects of at most 5 TiB",
                            self.describe()
                        ),
                    });
                }
                Ok(())
            }
        }
    }

    /// Consumes `body`; returns its bytes inline if small, else as a durable blob.
    pub async fn store(&self, mut body: ByteStream) -> Result<StoredContent> {
        let mut head = BytesMut::new();
        let mut md5 = Md5::new();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| Error::io("reading the request body", e))?;
            md5.update(&chunk);
            head.extend_from_slice(&chunk);
            if head.len() > MAX_INLINE_BYTES {
                let md5 = Md5Pipe::start(md5);
                return match self {
                    Blobs::Dir(d) => d.spill(head.freeze(), body, md5).await,
                    Blobs::S3(s) => s.spill(head.freeze(), body, md5).await,
                };
            }
        }
        Ok(StoredContent { stored: Stored::Inline(head.freeze()), md5: hex(&md5.finalize()) })
    }

    /// Streams `range` of a blob. `NotFound` if the blob is gone (a concurrent overwrite).
    pub async fn open_range(&self, id: &str, range: Option<ByteRange>) -> Result<ByteStream> {
        match self {
            Blobs::Dir(d) => d.open_range(id, range).await,
            Blobs::S3(s) => s.open_range(id, range).await,
        }
    }

    /// Removes a blob no entry names any more. A missing blob is fine (already removed).
    pub async fn remove(&self, id: &str) -> Result<()> {
        match self {
            Blobs::Dir(d) => d.remove(id).await,
            Blobs::S3(s) => s.remove(id).await,
        }
    }

    /// One page of the blobs held, in id order: `(id, last modified ms)`; where to go on.
    pub async fn list(&self, page: Option<&str>) -> Result<BlobPage> {
        match self {
            Blobs::Dir(d) => d.list(page).await,
            Blobs::S3(s) => s.list(page).await,
        }
    }
}

/// Whether `b` holds only zeros: compared a page at a time with a page of zeros (`==` on byte
/// slices is `memcmp`, as fast in a debug build as in a release one — a byte-by-byte scan was
/// much of a large sparse write's time in debug builds).
fn all_zeros(b: &[u8]) -> bool {
    static ZEROS: [u8; 4096] = [0; 4096];
    b.chunks(ZEROS.len()).all(|c| c == &ZEROS[..c.len()])
}

/// The shortest run of zeros a blob leaves as a hole (a file system block).
const HOLE_MIN: usize = 4096;

impl BlobDir {
    /// Opens the blob directories under `root`, discarding partial writes a crash left in `tmp/`.
    pub fn open(root: &Path) -> Result<Self> {
        let dir = BlobDir { root: root.to_path_buf(), blobs: root.join("blobs"), tmp: root.join("tmp") };
        if dir.tmp.exists() {
            std::fs::remove_dir_all(&dir.tmp).map_err(|e| Error::io(format!("clearing {}", dir.tmp.display()), e))?;
        }
        for d in [&dir.blobs, &dir.tmp] {
            std::fs::create_dir_all(d).map_err(|e| Error::io(format!("creating {}", d.display()), e))?;
        }
        Ok(dir)
    }

    /// The directory that holds `blobs/` and `tmp/`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file that holds blob `id`.
    pub fn file_of(&self, id: &str) -> Result<PathBuf> {
        self.path_of(id)
    }

    fn path_of(&self, id: &str) -> Result<PathBuf> {
        if !valid_id(id) {
            return Err(Error::internal(format!("malformed blob id {id:?} in an entry")));
        }
        Ok(self.blobs.join(&id[..2]).join(id))
    }

    pub(crate) async fn spill(&self, head: Bytes, mut body: ByteStream, md5: Md5Pipe) -> Result<StoredContent> {
        let id = new_id()?;
        let tmp = self.tmp.join(&id);
        let io = |what: &str, e: std::io::Error| Error::io(format!("{what} {}", tmp.display()), e);
        let mut f = tokio::fs::File::create(&tmp).await.map_err(|e| io("creating", e))?;
        let result: Result<u64> = async {
            f.write_all(&head).await.map_err(|e| io("writing", e))?;
            let mut size = head.len() as u64;
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| Error::io("reading the request body", e))?;
                md5.update(&chunk);
                // A run of zeros (a sparse file written through the mount) is left a hole:
                // it reads back as zeros and takes no disk.
                if chunk.len() >= HOLE_MIN && all_zeros(&chunk) {
                    f.seek(SeekFrom::Current(chunk.len() as i64)).await.map_err(|e| io("seeking in", e))?;
                } else {
                    f.write_all(&chunk).await.map_err(|e| io("writing", e))?;
                }
                size += chunk.len() as u64;
            }
            // A hole at the end is made by the length alone.
            f.set_len(size).await.map_err(|e| io("sizing", e))?;
            f.sync_all().await.map_err(|e| io("syncing", e))?;
            Ok(size)
        }
        .await;
        let size = match result {
            Ok(size) => size,
            Err(e) => {
                let _ = tokio::fs::remove_file(&tmp).await;
                return Err(e);
            }
        };
        let dest = self.path_of(&id)?;
        let shard = dest.parent().unwrap_or(&self.blobs).to_path_buf();
        tokio::fs::create_dir_all(&shard).await.map_err(|e| Error::io(format!("creating {}", shard.display()), e))?;
        tokio::fs::rename(&tmp, &dest).await.map_err(|e| io("renaming", e))?;
        // The rename must be durable before an entry may name the blob.
        sync_dir(&shard).await?;
        Ok(StoredContent { stored: Stored::Blob { id, size }, md5: md5.finish().await? })
    }

    /// Streams `range` of a blob. `NotFound` if the blob is gone (a concurrent overwrite).
    pub async fn open_range(&self, id: &str, range: Option<ByteRange>) -> Result<ByteStream> {
        let p = self.path_of(id)?;
        let mut f = match tokio::fs::File::open(&p).await {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::not_found(p.display().to_string()));
            }
            Err(e) => return Err(Error::io(format!("opening {}", p.display()), e)),
        };
        let Some(r) = range else {
            return Ok(tokio_util::io::ReaderStream::with_capacity(f, READ_PIECE).boxed());
        };
        f.seek(SeekFrom::Start(r.offset)).await.map_err(|e| Error::io(format!("seeking {}", p.display()), e))?;
        match r.length {
            Some(n) => Ok(tokio_util::io::ReaderStream::with_capacity(f.take(n), READ_PIECE).boxed()),
            None => Ok(tokio_util::io::ReaderStream::with_capacity(f, READ_PIECE).boxed()),
        }
    }

    /// One page (1,000) of the blobs in `blobs/`, in id order, with their modification times;
    /// the page token is the last id returned.
    pub async fn list(&self, page: Option<&str>) -> Result<BlobPage> {
        let blobs = self.blobs.clone();
        let after = page.unwrap_or("").to_string();
        tokio::task::spawn_blocking(move || -> Result<BlobPage> {
            let io = |p: &Path, e: std::io::Error| Error::io(format!("listing {}", p.display()), e);
            let mut shards: Vec<String> = std::fs::read_dir(&blobs)
                .map_err(|e| io(&blobs, e))?
                .filter_map(|d| d.ok()?.file_name().into_string().ok())
                .filter(|n| n.len() == 2 && after.get(..2).is_none_or(|a| n.as_str() >= a))
                .collect();
            shards.sort();
            let mut out = Vec::new();
            for shard in shards {
                let dir = blobs.join(&shard);
                let mut ids: Vec<(String, i64)> = std::fs::read_dir(&dir)
                    .map_err(|e| io(&dir, e))?
                    .filter_map(|d| {
                        let d = d.ok()?;
                        let id = d.file_name().into_string().ok()?;
                        let modified = d.metadata().ok()?.modified().ok()?;
                        let ms = modified.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as i64;
                        (valid_id(&id) && id > after).then_some((id, ms))
                    })
                    .collect();
                ids.sort();
                out.extend(ids);
                if out.len() >= 1000 {
                    out.truncate(1000);
                    let next = out.last().map(|(id, _)| id.clone());
                    return Ok((out, next));
                }
            }
            Ok((out, None))
        })
        .await
        .map_err(|e| Error::internal(format!("listing blobs: {e}")))?
    }

    /// Removes a blob no entry names any more. A missing blob is fine (already removed).
    pub async fn remove(&self, id: &str) -> Result<()> {
        let p = self.path_of(id)?;
        match tokio::fs::remove_file(&p).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("removing {}", p.display()), e)),
        }
    }
}

async fn sync_dir(dir: &Path) -> Result<()> {
    let d = dir.to_path_buf();
    tokio::task::spawn_blocking(move || std::fs::File::open(&d).and_then(|f| f.sync_all()))
        .await
        .map_err(|e| Error::internal(format!("sync task failed: {e}")))?
        .map_err(|e| Error::io(format!("syncing {}", dir.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(chunks: Vec<Vec<u8>>) -> ByteStream {
        futures::stream::iter(chunks.into_iter().map(|c| Ok(Bytes::from(c)))).boxed()
    }

    async fn collect(s: ByteStream) -> Vec<u8> {
        let parts: Vec<Bytes> = s.map(|c| c.unwrap()).collect().await;
        parts.concat()
    }

    #[tokio::test]
    async fn small_content_stays_inline_and_large_spills_to_a_blob() {
        let root = tempfile::tempdir().unwrap();
        let dir = Blobs::Dir(BlobDir::open(root.path()).unwrap());
        let small = dir.store(body(vec![b"hello".to_vec()])).await.unwrap();
        assert_eq!(small.md5, "5d41402abc4b2a76b9719d911017c592");
        match small.stored {
            Stored::Inline(b) => assert_eq!(&b[..], b"hello"),
            other => panic!("{other:?}"),
        }
        let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let chunks = big.chunks(7_000).map(|c| c.to_vec()).collect();
        let big_md5 = hex(&Md5::digest(&big));
        let stored = dir.store(body(chunks)).await.unwrap();
        assert_eq!(stored.md5, big_md5, "hashed across the spill");
        let Stored::Blob { id, size } = stored.stored else { panic!("expected a blob") };
        assert_eq!(size, big.len() as u64);
        assert_eq!(collect(dir.open_range(&id, None).await.unwrap()).await, big);
        let part = dir.open_range(&id, Some(ByteRange { offset: 1000, length: Some(10) })).await.unwrap();
        assert_eq!(collect(part).await, &big[1000..1010]);
        assert!(std::fs::read_dir(root.path().join("tmp")).unwrap().next().is_none(), "nothing left in tmp/");
        dir.remove(&id).await.unwrap();
        dir.remove(&id).await.unwrap();
        assert!(matches!(dir.open_range(&id, None).await, Err(Error::NotFound { .. })));
        assert!(dir.open_range("../../etc/passwd", None).await.is_err());
    }

    /// Zeros (a sparse file from the mount) are holes: the bytes read back whole, the disk holds
    /// only what is not zero.
    #[tokio::test]
    async fn runs_of_zeros_are_stored_as_holes() {
        use std::os::unix::fs::MetadataExt;
        let root = tempfile::tempdir().unwrap();
        let dir = BlobDir::open(root.path()).unwrap();
        let blobs = Blobs::Dir(dir.clone());
        let mib = 1 << 20;
        let mut whole = vec![1u8; 100_000];
        whole.extend(vec![0u8; 64 * mib]);
        whole.extend(b"tail");
        whole.extend(vec![0u8; 8 * mib]);
        let chunks = whole.chunks(mib).map(|c| c.to_vec()).collect();
        let stored = blobs.store(body(chunks)).await.unwrap();
        assert_eq!(stored.md5, hex(&Md5::digest(&whole)));
        let Stored::Blob { id, size } = stored.stored else { panic!("expected a blob") };
        assert_eq!(size, whole.len() as u64);
        assert!(collect(blobs.open_range(&id, None).await.unwrap()).await == whole);
        let m = std::fs::metadata(dir.path_of(&id).unwrap()).unwrap();
        assert_eq!(m.len(), whole.len() as u64);
        assert!(m.blocks() * 512 < 4 * mib as u64, "{} bytes on disk for a 72 MiB file of zeros", m.blocks() * 512);
    }

    #[tokio::test]
    async fn a_failing_body_leaves_nothing_behind() {
        let root = tempfile::tempdir().unwrap();
        let dir = Blobs::Dir(BlobDir::open(root.path()).unwrap());
        let chunks: Vec<std::io::Result<Bytes>> =
            vec![Ok(Bytes::from(vec![0u8; 100_000])), Err(std::io::Error::other("client went away"))];
        let err = dir.store(futures::stream::iter(chunks).boxed()).await.unwrap_err();
        assert!(err.to_string().contains("client went away"));
        assert!(std::fs::read_dir(root.path().join("tmp")).unwrap().next().is_none());
        assert!(std::fs::read_dir(root.path().join("blobs")).unwrap().next().is_none());
    }
}

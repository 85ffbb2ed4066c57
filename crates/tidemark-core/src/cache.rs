//! The content cache's model: which bytes of which remote version a filer holds, and the pure
//! rules around it (the content id, chunk arithmetic, sizes given on the command line).
//!
//! The one rule everything rests on: cached bytes are named by the **content id** of the
//! entry they were fetched for, a digest of the path and everything the entry says about its
//! remote version (storage, etag, size, remote mtime, version id). A write that changes any of
//! those gives the entry another content id, and the store drops the old id's records in that
//! same transaction ([`crate::MetaStore::apply`]), so no read after the commit can find them.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::model::{Content, Entry};

/// The default chunk: large enough that a sequential read makes few requests, small enough
/// that a small range of a huge object fetches little.
pub const DEFAULT_CHUNK_BYTES: u64 = 8 * 1024 * 1024;

/// The id of the remote version whose bytes `entry` serves; `None` when its content is not
/// remote (local writes, inline, empty, directories): such content is never cache.
pub fn content_id(entry: &Entry) -> Option<String> {
    if entry.content != Content::Remote || entry.is_dir() {
        return None;
    }
    let r = entry.remote.as_ref()?;
    let mut h = Sha256::new();
    // Length-prefixed fields: no two different tuples hash the same input.
    for field in [
        entry.path.as_bytes(),
        r.storage.as_bytes(),
        r.etag.as_bytes(),
        r.version_id.as_deref().unwrap_or("").as_bytes(),
        &r.remote_size.to_be_bytes(),
        &r.remote_mtime_ms.to_be_bytes(),
        &entry.size.to_be_bytes(),
    ] {
        h.update((field.len() as u64).to_be_bytes());
        h.update(field);
    }
    let d = h.finalize();
    Some(crate::ids::hex(&d[..16]))
}

/// Whether a write from `old` to `new` leaves cached bytes of `old` unreachable, so their records
/// must go in the same transaction.
pub fn invalidates(old: &Entry, new: Option<&Entry>) -> bool {
    match content_id(old) {
        None => false,
        Some(id) => new.and_then(content_id).as_deref() != Some(id.as_str()),
    }
}

/// One cached chunk of one remote version, as the store records it. A chunk is recorded only
/// after its bytes are durable in the filer's data directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedChunk {
    /// The filer (data directory) that holds the bytes: with a shared store, each filer caches
    /// for itself.
    pub node: String,
    pub path: String,
    pub content_id: String,
    /// The chunk's index: it holds bytes `chunk * chunk_bytes ..` of the object.
    pub chunk: u64,
    /// Its length in bytes (the last chunk of an object may be short).
    pub len: u64,
    /// When it was last read (ms since the epoch): the eviction order.
    pub last_read_ms: i64,
}

/// How much one node holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheUsage {
    pub bytes: u64,
    pub chunks: u64,
}

/// What a filer holds of one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheStatus {
    pub path: String,
    /// The file's size.
    pub size: u64,
    /// Bytes of the entry's current version held here.
    pub cached_bytes: u64,
    pub chunks: u64,
    /// Whether the content is remote (cacheable); local content is served from the filer itself.
    pub remote: bool,
}

/// The outcome of `remote.cache` or `remote.uncache` for one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheOutcome {
    pub path: String,
    pub size: u64,
    /// Bytes fetched from the bucket (cache) or dropped (uncache) by this call.
    pub bytes: u64,
    /// Bytes of the file cached after the call.
    pub cached_bytes: u64,
    /// Why nothing was done, when nothing was (not remote-backed, a directory, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

/// A filer's cache counters since it started, and its state now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheStats {
    /// Chunks served from the cache.
    pub hits: u64,
    /// Chunks that had to be fetched from the bucket.
    pub misses: u64,
    /// Ranged GETs sent to buckets (one fills a run of consecutive missing chunks).
    #[serde(default)]
    pub requests: u64,
    pub bytes_fetched: u64,
    pub bytes_served: u64,
    /// Chunks evicted for the budget.
    pub evictions: u64,
    pub evicted_bytes: u64,
    /// Chunks a read took back from the cache's file right after its own fetch wrote them: a
    /// run fetches ahead of its reader, and the bytes were no longer held for it when it came
    /// (a reader slower than the bucket for longer than the cache holds them).
    #[serde(default)]
    pub read_back: u64,
    /// GETs that resumed a bucket's stream broken mid-object (from the first byte not yet
    /// received, the same version), beside the `requests` that began them.
    #[serde(default)]
    pub resumed: u64,
    /// HEADs sent to learn the headers of objects whose entries came from a listing (once per
    /// object: see `object_attrs::HEADERS_SEEN`).
    #[serde(default)]
    pub header_heads: u64,
    pub resident_bytes: u64,
    pub resident_chunks: u64,
    /// 0: the cache is off and every read goes to the bucket.
    pub budget_bytes: u64,
    pub chunk_bytes: u64,
    /// The filer's own requests to buckets (the cache's GETs and header HEADs, the outbound
    /// sync's PUTs, COPYs and DELETEs), by remote and operation
    /// ([`requests`](crate::requests)).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub remote_requests: std::collections::BTreeMap<String, std::collections::BTreeMap<String, u64>>,
}

/// The chunks a read of `offset..offset + length` of a `size`-byte object touches.
pub fn chunks_of(size: u64, offset: u64, length: Option<u64>, chunk_bytes: u64) -> std::ops::Range<u64> {
    let end = length.map_or(size, |n| offset.saturating_add(n).min(size));
    if end <= offset || chunk_bytes == 0 {
        return 0..0;
    }
    offset / chunk_bytes..end.div_ceil(chunk_bytes)
}

/// The byte range of chunk `k` of a `size`-byte object.
pub fn chunk_range(size: u64, k: u64, chunk_bytes: u64) -> std::ops::Range<u64> {
    let start = k.saturating_mul(chunk_bytes).min(size);
    start..start.saturating_add(chunk_bytes).min(size)
}

/// A size as given on a command line: bytes, or with a K/M/G/T suffix (powers of 1024, an
/// optional `B`/`iB`), e.g. `512M`, `1.5G`, `20GiB`.
pub fn parse_size(s: &str) -> Result<u64> {
    let bad =
        || Error::invalid_argument(format!("{s:?} is not a size: use bytes or a K, M, G or T suffix (512M, 20G)"));
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let lower = lower.strip_suffix("ib").or_else(|| lower.strip_suffix('b')).unwrap_or(&lower);
    let (num, mult) = match lower.chars().last() {
        Some('k') => (&lower[..lower.len() - 1], 1u64 << 10),
        Some('m') => (&lower[..lower.len() - 1], 1 << 20),
        Some('g') => (&lower[..lower.len() - 1], 1 << 30),
        Some('t') => (&lower[..lower.len() - 1], 1 << 40),
        _ => (lower, 1),
    };
    let num = num.trim();
    if num.is_empty() {
        return Err(bad());
    }
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult).ok_or_else(bad);
    }
    let f: f64 = num.parse().map_err(|_| bad())?;
    let v = f * mult as f64;
    if !f.is_finite() || f < 0.0 || v >= u64::MAX as f64 {
        return Err(bad());
    }
    Ok(v as u64)
}

/// A cache budget: a size, or a percentage of the disk that holds the data directory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    Bytes(u64),
    PercentOfDisk(f64),
}

impl Budget {
    pub fn parse(s: &str) -> Result<Budget> {
        if let Some(p) = s.trim().strip_suffix('%') {
            let f: f64 = p.trim().parse().map_err(|_| {
                Error::invalid_argument(format!("{s:?} is not a percentage of the disk (use e.g. 10%)"))
            })?;
            if !(0.0..=100.0).contains(&f) {
                return Err(Error::invalid_argument(format!("{s:?}: a percentage of the disk is 0% to 100%")));
            }
            return Ok(Budget::PercentOfDisk(f));
        }
        Ok(Budget::Bytes(parse_size(s)?))
    }

    /// The budget in bytes on a disk of `disk_bytes`.
    pub fn bytes(self, disk_bytes: u64) -> u64 {
        match self {
            Budget::Bytes(b) => b,
            Budget::PercentOfDisk(p) => (disk_bytes as f64 * p / 100.0) as u64,
        }
    }
}

/// Which files `remote.cache`, `remote.uncache` and the event prefetch take: SeaweedFS's
/// `-include`, `-exclude`, `-minSize`, `-maxSize`. A pattern (`*`, `?`, `[abc]`) matches the
/// file's name, or, when it contains a `/`, its path below the directory given.
#[derive(Debug, Clone, Default)]
pub struct FileFilter {
    include: Option<glob::Pattern>,
    exclude: Option<glob::Pattern>,
    pub min_size: Option<u64>,
    pub max_size: Option<u64>,
}

impl FileFilter {
    pub fn new(
        include: Option<&str>,
        exclude: Option<&str>,
        min_size: Option<u64>,
        max_size: Option<u64>,
    ) -> Result<Self> {
        let pattern = |flag: &str, p: Option<&str>| {
            p.map(|p| {
                glob::Pattern::new(p)
                    .map_err(|e| Error::invalid_argument(format!("-{flag}={p:?} is not a pattern: {e}")))
            })
            .transpose()
        };
        Ok(FileFilter {
            include: pattern("include", include)?,
            exclude: pattern("exclude", exclude)?,
            min_size,
            max_size,
        })
    }

    /// Whether the file at `path` (below `dir`) of `size` bytes is taken.
    pub fn matches(&self, dir: &str, path: &str, size: u64) -> bool {
        let name = crate::path::name(path);
        let below = path.strip_prefix(dir).map(|r| r.trim_start_matches('/')).unwrap_or(path);
        let hit = |p: &glob::Pattern| if p.as_str().contains('/') { p.matches(below) } else { p.matches(name) };
        self.include.as_ref().is_none_or(hit)
            && !self.exclude.as_ref().is_some_and(hit)
            && self.min_size.is_none_or(|m| size >= m)
            && self.max_size.is_none_or(|m| size <= m)
    }
}

/// Bytes for people: `0 B`, `4.0 KiB`, `1.5 GiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{EntryKind, RemoteEntry};

    fn remote_file(etag: &str) -> Entry {
        Entry {
            path: "/m/a".into(),
            kind: EntryKind::File,
            size: 10,
            mtime_ms: 5,
            mode: 0o644,
            version: 3,
            remote: Some(RemoteEntry {
                storage: "s".into(),
                etag: etag.into(),
                remote_mtime_ms: 5,
                remote_size: 10,
                version_id: None,
                last_local_sync_ms: None,
                dirty_after: None,
                moved_from: None,
            }),
            content: Content::Remote,
            extended: Default::default(),
            posix: Default::default(),
        }
    }

    #[test]
    fn content_id_follows_the_remote_version_not_the_entry_version() {
        let a = remote_file("e1");
        let id = content_id(&a).unwrap();
        assert_eq!(id.len(), 32);
        let mut bumped = a.clone();
        bumped.version = 9;
        bumped.mode = 0o600;
        assert_eq!(content_id(&bumped).unwrap(), id, "a metadata-only write keeps the cache");
        assert!(!invalidates(&a, Some(&bumped)));
        for change in [
            |e: &mut Entry| e.remote.as_mut().unwrap().etag = "e2".into(),
            |e: &mut Entry| e.remote.as_mut().unwrap().remote_size = 11,
            |e: &mut Entry| e.remote.as_mut().unwrap().remote_mtime_ms = 6,
            |e: &mut Entry| e.remote.as_mut().unwrap().version_id = Some("v".into()),
            |e: &mut Entry| e.path = "/m/b".into(),
            |e: &mut Entry| e.content = Content::Blob { id: "x".into() },
        ] {
            let mut b = a.clone();
            change(&mut b);
            assert_ne!(content_id(&b), Some(id.clone()));
            assert!(invalidates(&a, Some(&b)));
        }
        assert!(invalidates(&a, None), "a delete drops the cache");
        let mut local = a.clone();
        local.content = Content::Inline;
        assert_eq!(content_id(&local), None);
        assert!(!invalidates(&local, None), "local content is no cache");
    }

    #[test]
    fn chunk_arithmetic() {
        assert_eq!(chunks_of(0, 0, None, 8), 0..0);
        assert_eq!(chunks_of(20, 0, None, 8), 0..3);
        assert_eq!(chunks_of(20, 8, Some(8), 8), 1..2);
        assert_eq!(chunks_of(20, 7, Some(2), 8), 0..2);
        assert_eq!(chunks_of(20, 19, Some(100), 8), 2..3);
        assert_eq!(chunks_of(20, 20, None, 8), 0..0);
        assert_eq!(chunks_of(20, 3, Some(u64::MAX), 8), 0..3);
        assert_eq!(chunk_range(20, 2, 8), 16..20);
        assert_eq!(chunk_range(20, 3, 8), 20..20);
        assert_eq!(chunk_range(u64::MAX, u64::MAX, 8), u64::MAX..u64::MAX);
    }

    #[test]
    fn file_filters() {
        let all = FileFilter::default();
        assert!(all.matches("/m", "/m/a/b.txt", 0));
        let f = FileFilter::new(Some("*.pdf"), Some("draft*"), Some(10), Some(100)).unwrap();
        assert!(f.matches("/m", "/m/x/report.pdf", 50));
        assert!(!f.matches("/m", "/m/x/report.txt", 50), "include");
        assert!(!f.matches("/m", "/m/draft1.pdf", 50), "exclude");
        assert!(!f.matches("/m", "/m/a.pdf", 9), "minSize");
        assert!(!f.matches("/m", "/m/a.pdf", 101), "maxSize");
        assert!(f.matches("/m", "/m/a.pdf", 10) && f.matches("/m", "/m/a.pdf", 100), "bounds are inclusive");
        let by_path = FileFilter::new(Some("logs/*"), None, None, None).unwrap();
        assert!(by_path.matches("/m", "/m/logs/a", 1));
        assert!(!by_path.matches("/m", "/m/other/a", 1));
        assert!(FileFilter::new(Some("[unclosed"), None, None, None).is_err());
    }

    #[test]
    fn sizes_and_budgets() {
        assert_eq!(parse_size("0").unwrap(), 0);
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("20GiB").unwrap(), 20 << 30);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("2tb").unwrap(), 2 << 40);
        for bad in ["", "G", "-1", "1X", "99999999999T", "nan", "inf"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Budget::parse("10%").unwrap().bytes(1000), 100);
        assert_eq!(Budget::parse("1G").unwrap().bytes(0), 1 << 30);
        assert!(Budget::parse("120%").is_err());
        assert!(Budget::parse("x%").is_err());
        assert_eq!(human_bytes(10), "10 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }
}

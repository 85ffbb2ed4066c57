//! Object versioning (S3's `PutBucketVersioning`), kept in the namespace.
//!
//! A key's *current* version is the object at its path in the bucket, as without versioning, so
//! the mount, the filer's API and ListObjects see the newest bytes and nothing else. Every older
//! version, and every delete marker, is a file of its own under `/buckets/.versions/BUCKET/`, at
//! the key's path with `\u{1}STAMP` after its last name:
//!
//! ```text
//! /buckets/photos/2026/a.jpg                              the current version
//! /buckets/.versions/photos/2026/a.jpg\u{1}ffe9…c41a…      an older one (a hard link: no copy)
//! /buckets/.versions/photos/2026/a.jpg\u{1}ffe8…null       the "null" version, kept
//! ```
//!
//! A [`Stamp`] is sixteen hex digits of the time it was made, inverted so that the newest sorts
//! first, then sixteen random hex digits or `null` (the version written while versioning was
//! off or suspended). The separator, `\u{1}`, sorts below every other character a key can
//! continue with, so the store's path order of `KEY\u{1}STAMP` is key order, then newest first:
//! ListObjectVersions is a merge of two ordered listings, never a sort. (Keys that themselves
//! hold `\u{1}` may list out of order; their versions are kept all the same.)
//!
//! A write keeps the version it replaces by linking it into the versions directory before
//! writing (a hard link: one more name, no bytes copied), so the key is never missing while a
//! new version is written; a delete moves the current version there in one rename and adds a
//! marker. Deleting the current version by its id brings the newest older one back to the key,
//! unless that is a delete marker.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use tidemark_core::model::Entry;

use crate::names::BUCKETS_DIR;

/// The bucket's versioning state (`Enabled` or `Suspended`; absent: never turned on).
pub const ATTR_VERSIONING: &str = "s3.versioning";
/// A version's [`Stamp`], on the object written through the gateway in a bucket whose
/// versioning was ever turned on, and on every kept version and delete marker. An object
/// without one (written before versioning, or through the mount) is the `null` version.
pub const ATTR_VERSION: &str = tidemark_core::model::object_attrs::VERSION;
/// Marks a kept version that is a delete marker (an empty file).
pub const ATTR_DELETE_MARKER: &str = "s3.delete-marker";
/// The name under `/buckets` of the directory that keeps the buckets' older versions: not a
/// valid bucket name, so never a bucket.
pub const VERSIONS_NAME: &str = ".versions";
/// What follows a key's last name in a kept version's name.
pub const SEP: char = '\u{1}';
pub const NULL: &str = "null";
const STAMP_TIME_LEN: usize = 16;
const STAMP_ID_LEN: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Never turned on: one version per key, as without versioning.
    Off,
    Enabled,
    Suspended,
}

pub fn mode_of(bucket: &Entry) -> Mode {
    match bucket.extended.get(ATTR_VERSIONING).map(String::as_str) {
        Some("Enabled") => Mode::Enabled,
        Some("Suspended") => Mode::Suspended,
        _ => Mode::Off,
    }
}

/// One version's stamp: `TTTTTTTTTTTTTTTT` (the inverted time it was made) then its id's
/// sixteen hex digits or `null`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp(String);

/// Nanoseconds since the epoch, strictly increasing within this process, so two versions made
/// here never share a time and the later one always sorts first.
fn next_nanos() -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    let mut last = LAST.load(Ordering::Relaxed);
    loop {
        let next = now.max(last + 1);
        match LAST.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

impl Stamp {
    /// A stamp made now: the `null` version's, or one with a new random id.
    pub fn new(null: bool) -> tidemark_core::Result<Stamp> {
        let time = format!("{:016x}", u64::MAX - next_nanos());
        let id =
            if null { NULL.to_string() } else { tidemark_core::ids::random_hex(STAMP_ID_LEN / 2, "a version id")? };
        Ok(Stamp(time + &id))
    }

    /// The `null` stamp of a version made just before `newer` (an object written outside
    /// versioning, kept when `newer` replaces it): whenever it is kept, it sorts older.
    pub fn null_before(newer: &Stamp) -> Stamp {
        let inverted = u64::from_str_radix(&newer.0[..STAMP_TIME_LEN], 16).unwrap_or(u64::MAX - 1);
        Stamp(format!("{:016x}{NULL}", inverted.saturating_add(1)))
    }

    pub fn parse(s: &str) -> Option<Stamp> {
        let hex = |t: &str| t.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        let (time, id) = (s.get(..STAMP_TIME_LEN)?, s.get(STAMP_TIME_LEN..)?);
        (hex(time) && (id == NULL || (id.len() == STAMP_ID_LEN && hex(id)))).then(|| Stamp(s.to_string()))
    }

    /// The stamp an object or kept version carries, if any.
    pub fn of(e: &Entry) -> Option<Stamp> {
        e.extended.get(ATTR_VERSION).and_then(|s| Stamp::parse(s))
    }

    /// The version id S3 clients see: `null`, or the whole stamp.
    pub fn id(&self) -> String {
        if self.is_null() { NULL.to_string() } else { self.0.clone() }
    }

    pub fn is_null(&self) -> bool {
        self.0.ends_with(NULL)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// When it was made (milliseconds since the epoch).
    pub fn made_ms(&self) -> i64 {
        let inverted = u64::from_str_radix(&self.0[..STAMP_TIME_LEN], 16).unwrap_or(u64::MAX);
        ((u64::MAX - inverted) / 1_000_000) as i64
    }

    /// Whether this stamp is version `id` as a client names it.
    pub fn is(&self, id: &str) -> bool {
        if id == NULL { self.is_null() } else { self.0 == id }
    }
}

/// Whether `id` could name a version (S3 answers anything else with `InvalidArgument`).
pub fn valid_id(id: &str) -> bool {
    id == NULL || (id.len() == STAMP_TIME_LEN + STAMP_ID_LEN && Stamp::parse(id).is_some())
}

/// The directory that keeps `bucket`'s older versions.
pub fn versions_dir(bucket: &str) -> String {
    format!("{BUCKETS_DIR}/{VERSIONS_NAME}/{bucket}")
}

/// Where version `s` of `key` is kept.
pub fn version_path(bucket: &str, key: &str, s: &Stamp) -> String {
    format!("{}/{key}{SEP}{}", versions_dir(bucket), s.as_str())
}

/// The key and stamp a name in the versions listing (`KEY\u{1}STAMP`) stands for.
pub fn split(listed: &str) -> Option<(&str, Stamp)> {
    let (key, stamp) = listed.rsplit_once(SEP)?;
    Some((key, Stamp::parse(stamp)?))
}

/// Whether a kept version is a delete marker.
pub fn is_marker(e: &Entry) -> bool {
    e.extended.contains_key(ATTR_DELETE_MARKER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_sort_newest_first_and_name_their_version() {
        let older = Stamp::new(false).unwrap();
        let null = Stamp::new(true).unwrap();
        let newer = Stamp::new(false).unwrap();
        assert!(newer < null && null < older, "{newer:?} {null:?} {older:?}");
        assert_eq!(null.id(), "null");
        let kept = Stamp::null_before(&older);
        assert!(older < kept && kept.is_null() && Stamp::parse(kept.as_str()) == Some(kept.clone()));
        assert!(null.is("null") && !older.is("null") && older.is(&older.id()));
        assert!(valid_id(&older.id()) && valid_id("null") && !valid_id("x") && !valid_id(&older.id()[1..]));
        assert_eq!(Stamp::parse(older.as_str()), Some(older.clone()));
        assert_eq!(Stamp::parse("zz"), None);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
        assert!((now - newer.made_ms()).abs() < 5_000, "{} vs {now}", newer.made_ms());
    }

    #[test]
    fn kept_versions_list_in_key_order_then_newest_first() {
        let (a, b) = (Stamp::new(false).unwrap(), Stamp::new(false).unwrap());
        // `a` sorts before `a.txt` and `a/b` as keys; so must every version of it.
        let mut paths = [
            version_path("bk", "a.txt", &a),
            version_path("bk", "a/b", &a),
            version_path("bk", "a", &a),
            version_path("bk", "a", &b),
        ];
        paths.sort();
        let keys: Vec<_> =
            paths.iter().map(|p| split(p.strip_prefix("/buckets/.versions/bk/").unwrap()).unwrap()).collect();
        assert_eq!(keys[0], ("a", b.clone()));
        assert_eq!(keys[1], ("a", a.clone()));
        assert_eq!(keys[2].0, "a.txt");
        assert_eq!(keys[3].0, "a/b");
    }
}

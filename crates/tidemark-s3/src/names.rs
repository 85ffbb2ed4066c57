//! Buckets and keys as namespace paths: bucket `B` is the directory `/buckets/B`, and a key is
//! the path below it with the key <-> path rules of every mount (`tidemark_core::keymap`), so a
//! key that cannot be a path is refused here exactly as a remote key would be skipped.

use tidemark_core::keymap::{KeyMap, KeyRejection, Mapped};
use tidemark_core::path;

/// The directory whose subdirectories are the gateway's buckets.
pub const BUCKETS_DIR: &str = "/buckets";

/// Why a bucket name or a key has no path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameError {
    Bucket(String),
    Key { reason: &'static str, too_long: bool },
}

impl std::fmt::Display for NameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NameError::Bucket(m) => f.write_str(m),
            NameError::Key { reason, .. } => write!(f, "this key cannot be a path of the namespace: {reason}"),
        }
    }
}

/// The directory of bucket `bucket`. Any name that is one path segment is accepted here (the
/// directories under `/buckets` may come from mounts); [`valid_new_bucket`] is stricter.
pub fn bucket_dir(bucket: &str) -> Result<String, NameError> {
    if bucket.contains('/') {
        return Err(NameError::Bucket(format!("bucket name {bucket:?}: contains '/'")));
    }
    if let Some(reason) = path::segment_problem(bucket) {
        return Err(NameError::Bucket(format!("bucket name {bucket:?}: {reason}")));
    }
    if bucket == crate::versioning::VERSIONS_NAME {
        return Err(NameError::Bucket(format!("{bucket:?} keeps the buckets' older versions: it is no bucket")));
    }
    Ok(path::join(BUCKETS_DIR, bucket))
}

/// CreateBucket's rule (S3's): 3 to 63 characters of lowercase letters, digits, `.` and `-`,
/// starting and ending with a letter or digit; each dot-separated label too (no `..`, `-.`, `.-`);
/// not an IP address; none of the prefixes and suffixes S3 reserves.
pub fn valid_new_bucket(bucket: &str) -> Result<(), NameError> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-';
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let labels_ok = bucket.split('.').all(|l| edge(l.chars().next()) && edge(l.chars().last()));
    if !(3..=63).contains(&bucket.len()) || !bucket.chars().all(ok_char) || !labels_ok {
        return Err(NameError::Bucket(format!(
            "bucket name {bucket:?}: 3 to 63 lowercase letters, digits, '.' or '-', each part between dots starting and \
             ending with a letter or digit"
        )));
    }
    if bucket.parse::<std::net::Ipv4Addr>().is_ok() {
        return Err(NameError::Bucket(format!("bucket name {bucket:?}: an IP address cannot name a bucket")));
    }
    const RESERVED_PREFIXES: [&str; 3] = ["xn--", "sthree-", "amzn-s3-demo-"];
    const RESERVED_SUFFIXES: [&str; 3] = ["-s3alias", "--ol-s3", "--x-s3"];
    if let Some(r) = RESERVED_PREFIXES.iter().find(|p| bucket.starts_with(*p)) {
        return Err(NameError::Bucket(format!("bucket name {bucket:?}: the prefix {r:?} is reserved by S3")));
    }
    if let Some(r) = RESERVED_SUFFIXES.iter().find(|p| bucket.ends_with(*p)) {
        return Err(NameError::Bucket(format!("bucket name {bucket:?}: the suffix {r:?} is reserved by S3")));
    }
    Ok(())
}

/// The key map of one bucket.
pub fn keymap(bucket: &str) -> Result<KeyMap, NameError> {
    let dir = bucket_dir(bucket)?;
    KeyMap::new(&dir, "").map_err(|e| NameError::Bucket(e.to_string()))
}

/// The path of `key` in `bucket`, and whether the key is a directory marker (ends in `/`).
pub fn object_path(bucket: &str, key: &str) -> Result<(String, bool), NameError> {
    let map = keymap(bucket)?;
    match map.key_to_path(key.as_bytes()) {
        Ok(Mapped::File(p)) => Ok((p, false)),
        Ok(Mapped::DirMarker(p)) => Ok((p, true)),
        Err(r) => Err(NameError::Key {
            reason: r.as_str(),
            too_long: matches!(r, KeyRejection::NameTooLong | KeyRejection::PathTooLong),
        }),
    }
}

/// The key of `path` in the bucket whose directory is `dir` (`None` if not below it).
pub fn key_of(dir: &str, p: &str) -> Option<String> {
    p.strip_prefix(dir)?.strip_prefix('/').filter(|k| !k.is_empty()).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_paths_below_the_bucket_and_hostile_ones_are_refused() {
        assert_eq!(object_path("b", "a/b c+%=&é.txt").unwrap(), ("/buckets/b/a/b c+%=&é.txt".into(), false));
        assert_eq!(object_path("b", "dir/").unwrap(), ("/buckets/b/dir".into(), true));
        for bad in ["../x", "a//b", "/a", "a/./b", "a\0b", ""] {
            assert!(object_path("b", bad).is_err(), "{bad:?}");
        }
        let long = "x".repeat(300);
        assert!(matches!(object_path("b", &long), Err(NameError::Key { too_long: true, .. })));
        assert!(bucket_dir("..").is_err() && bucket_dir("a/b").is_err());
        assert_eq!(key_of("/buckets/b", "/buckets/b/x/y").as_deref(), Some("x/y"));
        assert_eq!(key_of("/buckets/b", "/buckets/bb/x"), None);
    }

    #[test]
    fn new_bucket_names_follow_s3() {
        for ok in ["abc", "my-bucket.1", "0aa"] {
            valid_new_bucket(ok).unwrap();
        }
        for bad in [
            "ab",
            "Abc",
            "-abc",
            "abc-",
            "a..b",
            "a_b",
            &"a".repeat(64),
            "foo-.bar",
            "foo.-bar",
            "192.168.5.4",
            "xn--abc",
            "sthree-x",
            "data-s3alias",
            "data--ol-s3",
        ] {
            assert!(valid_new_bucket(bad).is_err(), "{bad}");
        }
    }
}

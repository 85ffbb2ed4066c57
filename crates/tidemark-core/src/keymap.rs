//! Object key <-> namespace path, for one mount.
//!
//! `path = mount.dir + "/" + key.strip_prefix(location.prefix)`. The mapping accepts only keys
//! whose remainder is a canonical relative path, so it is injective and can never escape the
//! mount: a key with `..`, `.`, an empty segment (`//`, a leading `/`), NUL, invalid UTF-8, an
//! over-long name or an over-long path is rejected with a [`KeyRejection`] that says why, and the
//! caller skips it and counts the reason. A key ending in `/` is a directory marker.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::path::{self, MAX_NAME_BYTES, MAX_PATH_BYTES};

/// Why a key has no path in the mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case")]
pub enum KeyRejection {
    #[error("the key is outside the mount's prefix")]
    OutsidePrefix,
    #[error("the key is the marker of the mount's own directory")]
    MountRoot,
    #[error("the key is not valid UTF-8")]
    NotUtf8,
    #[error("the key has an empty segment (`//` or a leading `/`)")]
    EmptySegment,
    #[error("the key has a `.` or `..` segment")]
    DotSegment,
    #[error("the key contains a NUL byte")]
    Nul,
    #[error("a segment of the key is longer than 255 bytes")]
    NameTooLong,
    #[error("the key's path would be longer than 4096 bytes")]
    PathTooLong,
}

impl KeyRejection {
    /// A stable snake_case name, for counters and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyRejection::OutsidePrefix => "outside_prefix",
            KeyRejection::MountRoot => "mount_root",
            KeyRejection::NotUtf8 => "not_utf8",
            KeyRejection::EmptySegment => "empty_segment",
            KeyRejection::DotSegment => "dot_segment",
            KeyRejection::Nul => "nul",
            KeyRejection::NameTooLong => "name_too_long",
            KeyRejection::PathTooLong => "path_too_long",
        }
    }
}

/// What an accepted key maps to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Mapped {
    /// An object: a file at this path.
    File(String),
    /// A directory marker (`a/b/`): a directory at this path.
    DirMarker(String),
}

impl Mapped {
    pub fn path(&self) -> &str {
        match self {
            Mapped::File(p) | Mapped::DirMarker(p) => p,
        }
    }
}

/// The key <-> path mapping of one mount: the mount's directory and the location's key prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyMap {
    dir: String,
    /// `""` (the whole bucket) or a prefix ending in `/` (`photos/2024/`).
    prefix: String,
}

impl KeyMap {
    /// `dir` is the mount's canonical directory; `location_path` the path inside the bucket
    /// (`""`, `/`, `photos`, `/photos/2024/` are all accepted and normalised).
    pub fn new(dir: &str, location_path: &str) -> Result<Self> {
        path::validate(dir)?;
        if dir == path::ROOT {
            return Err(Error::InvalidPath { path: dir.into(), reason: "the root cannot be a mount".into() });
        }
        let trimmed = location_path.trim_matches('/');
        let prefix = if trimmed.is_empty() {
            String::new()
        } else {
            for seg in trimmed.split('/') {
                if let Some(reason) = path::segment_problem(seg) {
                    return Err(Error::InvalidPath { path: location_path.into(), reason: reason.into() });
                }
            }
            format!("{trimmed}/")
        };
        Ok(KeyMap { dir: dir.to_string(), prefix })
    }

    pub fn dir(&self) -> &str {
        &self.dir
    }

    /// The key prefix every object of this mount starts with (`""` or ending in `/`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn key_to_path(&self, key: &[u8]) -> Result<Mapped, KeyRejection> {
        let rest = key.strip_prefix(self.prefix.as_bytes()).ok_or(KeyRejection::OutsidePrefix)?;
        if rest.is_empty() {
            return Err(KeyRejection::MountRoot);
        }
        let rest = std::str::from_utf8(rest).map_err(|_| KeyRejection::NotUtf8)?;
        let (rel, is_marker) = match rest.strip_suffix('/') {
            Some(r) => (r, true),
            None => (rest, false),
        };
        if rel.is_empty() {
            // The key was `prefix + "/"`: an empty segment.
            return Err(KeyRejection::EmptySegment);
        }
        for seg in rel.split('/') {
            if seg.is_empty() {
                return Err(KeyRejection::EmptySegment);
            }
            if seg == "." || seg == ".." {
                return Err(KeyRejection::DotSegment);
            }
            if seg.contains('\0') {
                return Err(KeyRejection::Nul);
            }
            if seg.len() > MAX_NAME_BYTES {
                return Err(KeyRejection::NameTooLong);
            }
        }
        let p = path::join(&self.dir, rel);
        if p.len() > MAX_PATH_BYTES {
            return Err(KeyRejection::PathTooLong);
        }
        Ok(if is_marker { Mapped::DirMarker(p) } else { Mapped::File(p) })
    }

    /// The object key of a path strictly below the mount directory (`None` otherwise).
    /// `dir_marker` appends the `/` of a directory marker.
    pub fn path_to_key(&self, path: &str, dir_marker: bool) -> Option<String> {
        let rel = path.strip_prefix(&self.dir)?.strip_prefix('/')?;
        if rel.is_empty() {
            return None;
        }
        let mut key = format!("{}{rel}", self.prefix);
        if dir_marker {
            key.push('/');
        }
        Some(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn map() -> KeyMap {
        KeyMap::new("/mnt/data", "photos").unwrap()
    }

    #[test]
    fn maps_ordinary_keys_and_markers() {
        let m = map();
        assert_eq!(m.prefix(), "photos/");
        assert_eq!(
            m.key_to_path(b"photos/a b/+%/\xc3\xbc.jpg").unwrap(),
            Mapped::File("/mnt/data/a b/+%/ü.jpg".into())
        );
        assert_eq!(m.key_to_path(b"photos/dir/").unwrap(), Mapped::DirMarker("/mnt/data/dir".into()));
        assert_eq!(m.path_to_key("/mnt/data/dir", true).as_deref(), Some("photos/dir/"));
        assert_eq!(m.path_to_key("/mnt/data", false), None);
        assert_eq!(m.path_to_key("/mnt/database/x", false), None);
        let whole = KeyMap::new("/m", "/").unwrap();
        assert_eq!(whole.key_to_path(b"x/y").unwrap(), Mapped::File("/m/x/y".into()));
    }

    #[test]
    fn rejects_hostile_keys_with_a_reason() {
        let m = map();
        let cases: &[(&[u8], KeyRejection)] = &[
            (b"other/x", KeyRejection::OutsidePrefix),
            (b"photosx", KeyRejection::OutsidePrefix),
            (b"photos/", KeyRejection::MountRoot),
            (b"photos//", KeyRejection::EmptySegment),
            (b"photos//x", KeyRejection::EmptySegment),
            (b"photos/a//b", KeyRejection::EmptySegment),
            (b"photos/../etc/passwd", KeyRejection::DotSegment),
            (b"photos/a/./b", KeyRejection::DotSegment),
            (b"photos/a/..", KeyRejection::DotSegment),
            (b"photos/a\0b", KeyRejection::Nul),
            (b"photos/\xff\xfe", KeyRejection::NotUtf8),
        ];
        for (key, why) in cases {
            assert_eq!(m.key_to_path(key), Err(*why), "{:?}", String::from_utf8_lossy(key));
        }
        let long_name = format!("photos/{}", "n".repeat(256));
        assert_eq!(m.key_to_path(long_name.as_bytes()), Err(KeyRejection::NameTooLong));
        let long_path = format!("photos/{}", vec!["n".repeat(200); 25].join("/"));
        assert_eq!(m.key_to_path(long_path.as_bytes()), Err(KeyRejection::PathTooLong));
    }

    #[test]
    fn rejects_bad_mounts() {
        assert!(KeyMap::new("/", "").is_err());
        assert!(KeyMap::new("/m", "a/../b").is_err());
        assert!(KeyMap::new("m", "").is_err());
    }

    fn key_strategy() -> impl Strategy<Value = Vec<u8>> {
        // Biased towards the characters that matter: separators, dots, NUL, UTF-8 and junk bytes.
        let piece = prop_oneof![
            Just(b"/".to_vec()),
            Just(b".".to_vec()),
            Just(b"..".to_vec()),
            Just(b"\0".to_vec()),
            Just("ü".as_bytes().to_vec()),
            Just(b"\xff".to_vec()),
            Just(b"photos/".to_vec()),
            "[a-z +%-]{1,4}".prop_map(|s| s.into_bytes()),
        ];
        proptest::collection::vec(piece, 0..12).prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn accepted_keys_stay_inside_and_round_trip(key in key_strategy()) {
            let m = map();
            if let Ok(mapped) = m.key_to_path(&key) {
                let p = mapped.path();
                prop_assert!(path::validate(p).is_ok(), "{p:?} is not canonical");
                prop_assert!(path::is_within(p, m.dir()) && p != m.dir());
                let back = m.path_to_key(p, matches!(mapped, Mapped::DirMarker(_))).unwrap();
                // Round trip implies injectivity: two keys with one image would round-trip to one.
                prop_assert_eq!(back.as_bytes(), &key[..]);
            }
        }

        #[test]
        fn keys_with_dot_segments_are_always_rejected(a in "[a-z]{0,3}", b in "[a-z]{0,3}", dots in prop_oneof![Just("."), Just("..")]) {
            let key = format!("photos/{a}/{dots}/{b}");
            prop_assert!(map().key_to_path(key.as_bytes()).is_err());
        }

        #[test]
        fn arbitrary_bytes_never_panic(key in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = map().key_to_path(&key);
        }
    }
}

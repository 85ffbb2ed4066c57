//! Multipart uploads staged in the namespace, so any gateway of a cluster can take any part and
//! a crash loses nothing acknowledged: `UPLOADS/<id>/upload.json` says what the upload will
//! become; `UPLOADS/<id>/part-NNNNN` holds each part's bytes (with its MD5, the part's ETag) as
//! an ordinary durable file. CompleteMultipartUpload streams the parts, in order, into one
//! write of the target: the object appears whole or not at all, then the staging is removed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use tidemark_core::path;

/// Where uploads in progress are staged.
pub const UPLOADS: &str = "/etc/tidemark/s3/uploads";

/// S3's limits.
pub const MAX_PART_NUMBER: i32 = 10_000;
pub const MIN_PART_BYTES: u64 = 5 * 1024 * 1024;
/// The most one PutObject or UploadPart may carry (S3's limit): a larger declared length is
/// refused before a byte is read or spooled.
pub const MAX_SINGLE_UPLOAD_BYTES: u64 = 5 * 1024 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Upload {
    pub bucket: String,
    pub key: String,
    pub initiated_ms: i64,
    /// The attributes the object gets (content type, user metadata).
    #[serde(default)]
    pub extended: BTreeMap<String, String>,
    /// The checksum algorithm the object's checksum is of (CreateMultipartUpload's), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum_algorithm: Option<String>,
    /// Whether that checksum is of the whole object (`FULL_OBJECT`) or of the parts'
    /// checksums (`COMPOSITE`).
    #[serde(default)]
    pub checksum_full_object: bool,
}

pub fn valid_upload_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

pub fn upload_dir(id: &str) -> String {
    path::join(UPLOADS, id)
}

pub fn upload_doc(id: &str) -> String {
    path::join(&upload_dir(id), "upload.json")
}

pub fn part_path(id: &str, n: i32) -> String {
    path::join(&upload_dir(id), &format!("part-{n:05}"))
}

/// The part number of a staged part's file name.
pub fn part_number(name: &str) -> Option<i32> {
    name.strip_prefix("part-").and_then(|n| n.parse().ok()).filter(|n| (1..=MAX_PART_NUMBER).contains(n))
}

/// Uploads completed lately: a CompleteMultipartUpload sent again — a client retrying after the
/// answer was lost, as the AWS SDKs do — answers as the first did while the object is still
/// the one it made. Outside `UPLOADS`, so they are not uploads in progress.
pub const COMPLETED: &str = "/etc/tidemark/s3/completed";
/// How long a completion is remembered.
pub const COMPLETED_KEPT_MS: i64 = 24 * 3600 * 1000;

pub fn completed_doc(id: &str) -> String {
    path::join(COMPLETED, &format!("{id}.json"))
}

/// What a completed upload made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Completed {
    pub bucket: String,
    pub key: String,
    pub etag: String,
    /// Its checksum, as kept in the object's attributes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
    /// The version it made, in a versioned bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_id: Option<String>,
}

pub fn new_upload_id() -> tidemark_core::Result<String> {
    tidemark_core::ids::random_hex(16, "an upload id")
}

/// The extended attribute of an object completed from parts: their sizes, in order
/// (comma-separated), for GET and HEAD by part number.
pub const ATTR_PARTS: &str = tidemark_core::model::object_attrs::PARTS;

pub fn set_part_sizes(ext: &mut BTreeMap<String, String>, sizes: &[u64]) {
    let list: Vec<String> = sizes.iter().map(u64::to_string).collect();
    ext.insert(ATTR_PARTS.to_string(), list.join(","));
}

/// S3's ETag of an object completed from parts with these ETags (hex MD5s): the MD5 of their
/// bytes, then `-` and their number.
pub fn etag_of_parts(etags: &[String]) -> String {
    use md5::{Digest, Md5};
    let mut h = Md5::new();
    for t in etags {
        let raw: Vec<u8> =
            (0..t.len() / 2).filter_map(|i| u8::from_str_radix(t.get(2 * i..2 * i + 2)?, 16).ok()).collect();
        h.update(&raw);
    }
    let d: [u8; 16] = h.finalize().into();
    let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex}-{}", etags.len())
}

/// Whether an object's attributes say it was completed from parts.
pub fn is_multipart(ext: &BTreeMap<String, String>) -> bool {
    ext.contains_key(ATTR_PARTS)
}

/// The sizes of an object's parts: those recorded at completion if they still add up to its
/// `size` (a later write through another client may have replaced its bytes), else one part.
pub fn part_sizes(ext: &BTreeMap<String, String>, size: u64) -> Vec<u64> {
    let recorded: Option<Vec<u64>> = ext.get(ATTR_PARTS).and_then(|s| s.split(',').map(|x| x.parse().ok()).collect());
    recorded.filter(|v| !v.is_empty() && v.iter().sum::<u64>() == size).unwrap_or_else(|| vec![size])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_named_in_order_and_ids_are_checked() {
        assert_eq!(part_path("ab", 7), "/etc/tidemark/s3/uploads/ab/part-00007");
        assert_eq!(part_number("part-00007"), Some(7));
        assert_eq!(part_number("part-0"), None);
        assert_eq!(part_number("upload.json"), None);
        let id = new_upload_id().unwrap();
        assert!(valid_upload_id(&id));
        assert!(!valid_upload_id("../../x") && !valid_upload_id(""));
        assert!(part_path("a", 2) > part_path("a", 1) && part_path("a", 10_000) > part_path("a", 9_999));
        // ceph/s3-tests' three 5 MiB parts of 'A', 'B' and 'C'.
        let md5 = |c: u8| {
            use md5::{Digest, Md5};
            let d: [u8; 16] = Md5::digest(vec![c; 5 * 1024 * 1024]).into();
            d.iter().map(|b| format!("{b:02x}")).collect::<String>()
        };
        assert_eq!(etag_of_parts(&[md5(b'A'), md5(b'B'), md5(b'C')]), "b2add96cc9702bbf4efb0ccdfc6b7747-3");
    }
}

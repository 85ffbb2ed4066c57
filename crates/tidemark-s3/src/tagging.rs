//! Object and bucket tags: S3's limits, and how a tag set is kept in an entry's extended
//! attributes (`s3.tagging`, the URL-encoded form of `x-amz-tagging`, which a copy keeps with the
//! other `s3.` attributes). Pure: no I/O.

use std::collections::BTreeMap;

use s3s::dto::Tag;
use s3s::{S3Error, S3ErrorCode, S3Result};

/// The extended attribute holding an object's tags.
pub const ATTR_TAGGING: &str = "s3.tagging";
/// The extended attribute of a bucket's directory holding the bucket's tags.
pub const ATTR_BUCKET_TAGGING: &str = "s3.bucket-tagging";

/// S3's limits: tags per object (a bucket may have 50), and the length of a key and a value.
pub const MAX_OBJECT_TAGS: usize = 10;
pub const MAX_BUCKET_TAGS: usize = 50;
const MAX_KEY_CHARS: usize = 128;
const MAX_VALUE_CHARS: usize = 256;

fn invalid(msg: String) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidTag, msg)
}

/// A tag set checked against S3's rules: at most `max` tags, keys of 1 to 128 characters and
/// values of at most 256, no key twice.
pub fn check(tags: &[(String, String)], max: usize) -> S3Result<()> {
    if tags.len() > max {
        return Err(invalid(format!("{} tags; at most {max}", tags.len())));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (k, v) in tags {
        let kc = k.chars().count();
        if kc == 0 || kc > MAX_KEY_CHARS {
            return Err(invalid(format!("the tag key {k:?} is {kc} characters; 1 to {MAX_KEY_CHARS}")));
        }
        let vc = v.chars().count();
        if vc > MAX_VALUE_CHARS {
            return Err(invalid(format!("the value of tag {k:?} is {vc} characters; at most {MAX_VALUE_CHARS}")));
        }
        if !seen.insert(k.as_str()) {
            return Err(invalid(format!("the tag key {k:?} is given twice")));
        }
    }
    Ok(())
}

/// The tags of an `x-amz-tagging` header (`k1=v1&k2=v2`, URL-encoded), checked.
pub fn from_header(h: &str) -> S3Result<Vec<(String, String)>> {
    let tags: Vec<(String, String)> = form_urlencoded::parse(h.as_bytes()).into_owned().collect();
    check(&tags, MAX_OBJECT_TAGS)?;
    Ok(tags)
}

/// The tags of a `TagSet` body, checked.
pub fn from_tag_set(set: &[Tag], max: usize) -> S3Result<Vec<(String, String)>> {
    let tags: Vec<(String, String)> =
        set.iter().map(|t| (t.key.clone().unwrap_or_default(), t.value.clone().unwrap_or_default())).collect();
    check(&tags, max)?;
    Ok(tags)
}

/// How a tag set is kept: its URL-encoded form, in the order given.
pub fn encode(tags: &[(String, String)]) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in tags {
        s.append_pair(k, v);
    }
    s.finish()
}

/// The tags kept in `ext` under `attr`.
pub fn kept(ext: &BTreeMap<String, String>, attr: &str) -> Vec<(String, String)> {
    ext.get(attr).map(|s| form_urlencoded::parse(s.as_bytes()).into_owned().collect()).unwrap_or_default()
}

/// `ext` with the tag set `tags` under `attr` (none: the attribute removed), in key order, as
/// S3 lists them.
pub fn set(ext: &mut BTreeMap<String, String>, attr: &str, tags: &[(String, String)]) {
    if tags.is_empty() {
        ext.remove(attr);
    } else {
        let mut sorted = tags.to_vec();
        sorted.sort();
        ext.insert(attr.to_string(), encode(&sorted));
    }
}

/// A tag set as the XML body lists it.
pub fn to_tag_set(tags: Vec<(String, String)>) -> Vec<Tag> {
    tags.into_iter().map(|(k, v)| Tag { key: Some(k), value: Some(v) }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_through_their_kept_form() {
        let tags = vec![("ü".to_string(), String::new()), ("a b".to_string(), "c&d=e".to_string())];
        let mut ext = BTreeMap::new();
        set(&mut ext, ATTR_TAGGING, &tags);
        let sorted = vec![tags[1].clone(), tags[0].clone()];
        assert_eq!(kept(&ext, ATTR_TAGGING), sorted, "kept in key order");
        assert_eq!(from_header(&encode(&tags)).unwrap(), tags);
        set(&mut ext, ATTR_TAGGING, &[]);
        assert!(ext.is_empty());
    }

    #[test]
    fn s3_limits_are_kept() {
        let n = |count: usize| (0..count).map(|i| (format!("k{i}"), "v".to_string())).collect::<Vec<_>>();
        assert!(check(&n(10), MAX_OBJECT_TAGS).is_ok());
        assert!(check(&n(11), MAX_OBJECT_TAGS).is_err());
        assert!(check(&n(50), MAX_BUCKET_TAGS).is_ok());
        assert!(check(&[("k".repeat(128), "v".repeat(256))], 10).is_ok());
        assert!(check(&[("k".repeat(129), "v".into())], 10).is_err());
        assert!(check(&[("k".into(), "v".repeat(257))], 10).is_err());
        assert!(check(&[(String::new(), "v".into())], 10).is_err());
        assert!(check(&[("k".into(), "1".into()), ("k".into(), "2".into())], 10).is_err());
    }
}

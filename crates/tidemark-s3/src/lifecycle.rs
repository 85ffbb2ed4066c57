//! Bucket lifecycle rules, carried out: objects expire (after a number of days, or on a date)
//! and uploads nobody completed are aborted, by a sweep each gateway runs. The configuration is
//! kept in the bucket's entry (`s3.lifecycle`, s3s's own type as JSON).
//!
//! What the gateway cannot carry out is refused, never stored as if it were: transitions (there
//! is no other storage class to move bytes to) and any rule on a bucket mounted from a remote
//! (its bucket's own rules are the ones that apply there). In a versioned bucket an expiring
//! object is kept behind a delete marker, noncurrent versions expire after their days (keeping
//! the newest `NewerNoncurrentVersions`), and a delete marker left alone goes.

use std::collections::HashSet;

use s3s::dto::{BucketLifecycleConfiguration, LifecycleRule, Timestamp};
use s3s::{S3Error, S3ErrorCode, S3Result};

pub const ATTR_LIFECYCLE: &str = "s3.lifecycle";

pub const DAY_MS: i64 = 24 * 3600 * 1000;

/// How long a lifecycle "day" lasts: a day, unless `TIDEMARK_S3_LIFECYCLE_DAY_SECS` makes it
/// shorter (for tests of expiration: ceph/s3-tests runs its days as 10 s, RGW's
/// `rgw_lc_debug_interval`).
pub fn day_ms() -> i64 {
    std::env::var("TIDEMARK_S3_LIFECYCLE_DAY_SECS")
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|s| *s > 0)
        .map_or(DAY_MS, |s| s * 1000)
}

/// How often the sweep runs: hourly, or five times a shortened day.
pub fn sweep_every(day_ms: i64) -> std::time::Duration {
    std::time::Duration::from_millis((day_ms / 5).clamp(1000, 3600 * 1000) as u64)
}

fn err(code: S3ErrorCode, msg: impl Into<String>) -> S3Error {
    S3Error::with_message(code, msg.into())
}

/// A timestamp in milliseconds since the epoch.
pub(crate) fn ms_of(t: &Timestamp) -> Option<i64> {
    let at: time::OffsetDateTime = t.clone().into();
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000).ok()
}

/// Checks a configuration as S3 does and completes it (a rule without an ID gets one).
pub fn validate(c: &mut BucketLifecycleConfiguration) -> S3Result<()> {
    if c.rules.is_empty() || c.rules.len() > 1000 {
        return Err(err(S3ErrorCode::MalformedXML, "a lifecycle configuration has 1 to 1,000 rules"));
    }
    let mut ids = HashSet::new();
    for r in &mut c.rules {
        let id = r.id.get_or_insert_with(|| tidemark_core::ids::random_hex(8, "a rule id").unwrap_or_default());
        if id.len() > 255 {
            return Err(err(S3ErrorCode::InvalidArgument, "ID length should not exceed allowed limit of 255"));
        }
        if !ids.insert(id.clone()) {
            return Err(err(
                S3ErrorCode::InvalidArgument,
                "Rule ID must be unique. Found same ID for more than one rule",
            ));
        }
        let status = r.status.as_str();
        if status != "Enabled" && status != "Disabled" {
            return Err(err(S3ErrorCode::MalformedXML, format!("Status {status:?}: Enabled or Disabled")));
        }
        if r.prefix.is_some() && r.filter.is_some() {
            return Err(err(S3ErrorCode::MalformedXML, "a rule has a Prefix or a Filter, not both"));
        }
        // A transition's date is checked as S3 checks it before the transition is refused.
        for t in r.transitions.iter().flatten() {
            if t.date.as_ref().is_some_and(|d| ms_of(d).is_none_or(|ms| ms % DAY_MS != 0)) {
                return Err(err(S3ErrorCode::InvalidArgument, "'Date' must be at midnight GMT"));
            }
        }
        if r.transitions.as_ref().is_some_and(|t| !t.is_empty())
            || r.noncurrent_version_transitions.as_ref().is_some_and(|t| !t.is_empty())
        {
            return Err(err(
                S3ErrorCode::NotImplemented,
                "transitions: this gateway has one storage class and moves no object to another; nothing was stored",
            ));
        }
        if let Some(e) = &r.expiration {
            let given = [e.days.is_some(), e.date.is_some(), e.expired_object_delete_marker.is_some()];
            if given.iter().filter(|g| **g).count() != 1 {
                return Err(err(
                    S3ErrorCode::MalformedXML,
                    "an Expiration has one of Days, Date or ExpiredObjectDeleteMarker",
                ));
            }
            if e.days.is_some_and(|d| d <= 0) {
                return Err(err(
                    S3ErrorCode::InvalidArgument,
                    "'Days' for Expiration action must be a positive integer",
                ));
            }
            if let Some(d) = &e.date {
                let ms = ms_of(d).ok_or_else(|| err(S3ErrorCode::InvalidArgument, "an unreadable Expiration Date"))?;
                if ms % DAY_MS != 0 {
                    return Err(err(S3ErrorCode::InvalidArgument, "'Date' must be at midnight GMT"));
                }
            }
        }
        if let Some(a) = &r.abort_incomplete_multipart_upload {
            if a.days_after_initiation.is_none_or(|d| d <= 0) {
                return Err(err(S3ErrorCode::InvalidArgument, "'DaysAfterInitiation' must be a positive integer"));
            }
            if filter_of(r).tags.is_some() {
                return Err(err(
                    S3ErrorCode::InvalidRequest,
                    "AbortIncompleteMultipartUpload cannot be specified with Tags",
                ));
            }
        }
        if let Some(n) = &r.noncurrent_version_expiration
            && n.noncurrent_days.is_some_and(|d| d <= 0)
        {
            return Err(err(S3ErrorCode::InvalidArgument, "'NoncurrentDays' must be a positive integer"));
        }
        if r.expiration.is_none()
            && r.abort_incomplete_multipart_upload.is_none()
            && r.noncurrent_version_expiration.is_none()
        {
            return Err(err(S3ErrorCode::InvalidRequest, "At least one action needs to be specified in a rule"));
        }
    }
    Ok(())
}

/// What a rule selects: a key prefix, tags the object must all have, bounds on its size.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Filter {
    pub prefix: String,
    pub tags: Option<Vec<(String, String)>>,
    pub size_gt: Option<i64>,
    pub size_lt: Option<i64>,
}

pub fn filter_of(r: &LifecycleRule) -> Filter {
    let tag = |t: &s3s::dto::Tag| (t.key.clone().unwrap_or_default(), t.value.clone().unwrap_or_default());
    let mut f = Filter { prefix: r.prefix.clone().unwrap_or_default(), ..Default::default() };
    if let Some(x) = &r.filter {
        if let Some(p) = &x.prefix {
            f.prefix = p.clone();
        }
        if let Some(t) = &x.tag {
            f.tags = Some(vec![tag(t)]);
        }
        f.size_gt = x.object_size_greater_than;
        f.size_lt = x.object_size_less_than;
        if let Some(a) = &x.and {
            if let Some(p) = &a.prefix {
                f.prefix = p.clone();
            }
            f.tags = a.tags.as_ref().map(|ts| ts.iter().map(tag).collect());
            f.size_gt = a.object_size_greater_than.or(f.size_gt);
            f.size_lt = a.object_size_less_than.or(f.size_lt);
        }
    }
    f
}

impl Filter {
    /// Whether an object (its key, size and tags) is selected.
    pub fn selects(&self, key: &str, size: u64, tags: &[(String, String)]) -> bool {
        key.starts_with(&self.prefix)
            && self.size_gt.is_none_or(|n| size as i64 > n)
            && self.size_lt.is_none_or(|n| (size as i64) < n)
            && self.tags.as_ref().is_none_or(|want| want.iter().all(|t| tags.contains(t)))
    }
}

fn enabled(r: &LifecycleRule) -> bool {
    r.status.as_str() == "Enabled"
}

/// When an object last modified at `mtime_ms` expires under rule `r`, if the rule expires
/// objects: its date, or `mtime` plus its days — rounded up to the next midnight UTC, as S3
/// does, when a day is a day.
pub fn expiry(r: &LifecycleRule, mtime_ms: i64, day_ms: i64) -> Option<i64> {
    let e = r.expiration.as_ref()?;
    if let Some(d) = &e.date {
        return ms_of(d);
    }
    let at = mtime_ms + i64::from(e.days?) * day_ms;
    Some(if day_ms == DAY_MS { (at + DAY_MS - 1).div_euclid(DAY_MS) * DAY_MS } else { at })
}

/// The `x-amz-expiration` header of an object: the earliest expiry among the enabled rules
/// that select it, and that rule's ID.
pub fn expiration_header(
    c: &BucketLifecycleConfiguration,
    key: &str,
    size: u64,
    tags: &[(String, String)],
    mtime_ms: i64,
) -> Option<String> {
    let (at, id) = c
        .rules
        .iter()
        .filter(|r| enabled(r) && filter_of(r).selects(key, size, tags))
        .filter_map(|r| Some((expiry(r, mtime_ms, DAY_MS)?, r.id.clone().unwrap_or_default())))
        .min()?;
    let when = httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_millis(at.max(0) as u64));
    Some(format!("expiry-date=\"{when}\", rule-id=\"{id}\""))
}

/// Whether an object is due to expire at `now_ms`.
pub fn expired(
    c: &BucketLifecycleConfiguration,
    key: &str,
    size: u64,
    tags: &[(String, String)],
    mtime_ms: i64,
    now_ms: i64,
    day_ms: i64,
) -> bool {
    c.rules
        .iter()
        .filter(|r| enabled(r) && filter_of(r).selects(key, size, tags))
        .any(|r| expiry(r, mtime_ms, day_ms).is_some_and(|at| at <= now_ms))
}

/// Whether a noncurrent version of `key` is due to go at `now_ms`: it became noncurrent at
/// `since_ms` (when the next newer version was made), and `newer` noncurrent versions of the key
/// that stay are newer than it (`NewerNoncurrentVersions` keeps that many whatever their age).
#[allow(clippy::too_many_arguments)]
pub fn noncurrent_expired(
    c: &BucketLifecycleConfiguration,
    key: &str,
    size: u64,
    tags: &[(String, String)],
    since_ms: i64,
    newer: usize,
    now_ms: i64,
    day_ms: i64,
) -> bool {
    c.rules.iter().filter(|r| enabled(r) && filter_of(r).selects(key, size, tags)).any(|r| {
        let Some(n) = &r.noncurrent_version_expiration else { return false };
        let Some(days) = n.noncurrent_days else { return false };
        let keep = n.newer_noncurrent_versions.unwrap_or(0).max(0) as usize;
        let at = since_ms + i64::from(days) * day_ms;
        let at = if day_ms == DAY_MS { (at + DAY_MS - 1).div_euclid(DAY_MS) * DAY_MS } else { at };
        at <= now_ms && newer >= keep
    })
}

/// Whether a delete marker of `key` left with no version behind it is removed
/// (`ExpiredObjectDeleteMarker`).
pub fn clears_expired_markers(c: &BucketLifecycleConfiguration, key: &str) -> bool {
    c.rules
        .iter()
        .filter(|r| enabled(r) && filter_of(r).selects(key, 0, &[]))
        .any(|r| r.expiration.as_ref().is_some_and(|e| e.expired_object_delete_marker == Some(true)))
}

/// Whether an upload of `key` begun at `initiated_ms` is to be aborted at `now_ms`.
pub fn abandoned(c: &BucketLifecycleConfiguration, key: &str, initiated_ms: i64, now_ms: i64, day_ms: i64) -> bool {
    c.rules.iter().filter(|r| enabled(r) && key.starts_with(&filter_of(r).prefix)).any(|r| {
        r.abort_incomplete_multipart_upload
            .as_ref()
            .and_then(|a| a.days_after_initiation)
            .is_some_and(|d| initiated_ms + i64::from(d) * day_ms <= now_ms)
    })
}

/// Whether any enabled rule expires objects or aborts uploads (else the sweep passes the bucket).
pub fn acts(c: &BucketLifecycleConfiguration) -> (bool, bool) {
    let on = c.rules.iter().filter(|r| enabled(r));
    let (mut objects, mut uploads) = (false, false);
    for r in on {
        objects |= r
            .expiration
            .as_ref()
            .is_some_and(|e| e.days.is_some() || e.date.is_some() || e.expired_object_delete_marker == Some(true))
            || r.noncurrent_version_expiration.is_some();
        uploads |= r.abort_incomplete_multipart_upload.is_some();
    }
    (objects, uploads)
}

#[cfg(test)]
mod tests {
    use super::*;
    use s3s::dto::{AbortIncompleteMultipartUpload, ExpirationStatus, LifecycleExpiration, LifecycleRuleFilter, Tag};

    fn rule(id: &str, prefix: &str, days: i32) -> LifecycleRule {
        LifecycleRule {
            id: Some(id.into()),
            prefix: Some(prefix.into()),
            status: ExpirationStatus::from("Enabled".to_string()),
            expiration: Some(LifecycleExpiration { days: Some(days), ..Default::default() }),
            abort_incomplete_multipart_upload: None,
            filter: None,
            noncurrent_version_expiration: None,
            noncurrent_version_transitions: None,
            transitions: None,
        }
    }

    fn code(mut c: BucketLifecycleConfiguration) -> Option<S3ErrorCode> {
        validate(&mut c).err().map(|e| e.code().clone())
    }

    #[test]
    fn configurations_are_checked_as_s3_checks_them() {
        let ok = BucketLifecycleConfiguration { rules: vec![rule("a", "x/", 1), rule("b", "y/", 2)] };
        assert_eq!(code(ok), None);
        let twice = BucketLifecycleConfiguration { rules: vec![rule("a", "x/", 1), rule("a", "y/", 2)] };
        assert_eq!(code(twice), Some(S3ErrorCode::InvalidArgument));
        assert_eq!(
            code(BucketLifecycleConfiguration { rules: vec![rule(&"i".repeat(256), "", 1)] }),
            Some(S3ErrorCode::InvalidArgument)
        );
        assert_eq!(
            code(BucketLifecycleConfiguration { rules: vec![rule("z", "", 0)] }),
            Some(S3ErrorCode::InvalidArgument)
        );
        let mut lower = rule("s", "", 1);
        lower.status = ExpirationStatus::from("enabled".to_string());
        assert_eq!(code(BucketLifecycleConfiguration { rules: vec![lower] }), Some(S3ErrorCode::MalformedXML));
        let mut moving = rule("t", "", 1);
        moving.transitions = Some(vec![Default::default()]);
        assert_eq!(code(BucketLifecycleConfiguration { rules: vec![moving] }), Some(S3ErrorCode::NotImplemented));
        let mut nothing = rule("n", "", 1);
        nothing.expiration = None;
        assert_eq!(code(BucketLifecycleConfiguration { rules: vec![nothing] }), Some(S3ErrorCode::InvalidRequest));
        let mut no_id = BucketLifecycleConfiguration { rules: vec![rule("", "", 1)] };
        no_id.rules[0].id = None;
        validate(&mut no_id).unwrap();
        assert!(no_id.rules[0].id.as_ref().is_some_and(|i| i.len() == 16), "an ID is given");
    }

    #[test]
    fn objects_expire_at_the_midnight_after_their_days_and_uploads_are_aborted() {
        let mut r = rule("r", "logs/", 2);
        r.filter = None;
        let c = BucketLifecycleConfiguration { rules: vec![r] };
        let mtime = 10 * DAY_MS + 5_000; // just after midnight
        // Two days later, then up to the next midnight.
        assert_eq!(expiry(&c.rules[0], mtime, DAY_MS), Some(13 * DAY_MS));
        assert!(!expired(&c, "logs/a", 1, &[], mtime, 13 * DAY_MS - 1, DAY_MS));
        assert!(expired(&c, "logs/a", 1, &[], mtime, 13 * DAY_MS, DAY_MS));
        assert!(!expired(&c, "other/a", 1, &[], mtime, 20 * DAY_MS, DAY_MS), "another prefix");
        // A shortened day (tests) is not rounded.
        assert!(expired(&c, "logs/a", 1, &[], 0, 20_000, 10_000));
        let h = expiration_header(&c, "logs/a", 1, &[], mtime).unwrap();
        assert!(h.starts_with("expiry-date=\"") && h.ends_with("rule-id=\"r\""), "{h}");
        assert_eq!(expiration_header(&c, "other/a", 1, &[], mtime), None);
        let mut tagged = rule("t", "", 1);
        tagged.prefix = None;
        tagged.filter = Some(LifecycleRuleFilter {
            tag: Some(Tag { key: Some("k".into()), value: Some("v".into()) }),
            object_size_greater_than: Some(10),
            ..Default::default()
        });
        let c = BucketLifecycleConfiguration { rules: vec![tagged] };
        let kv = vec![("k".to_string(), "v".to_string())];
        assert!(expired(&c, "a", 11, &kv, 0, DAY_MS, DAY_MS));
        assert!(!expired(&c, "a", 10, &kv, 0, DAY_MS, DAY_MS), "not larger than 10 bytes");
        assert!(!expired(&c, "a", 11, &[], 0, DAY_MS, DAY_MS), "without the tag");
        let mut abort = rule("u", "big/", 1);
        abort.expiration = None;
        abort.abort_incomplete_multipart_upload =
            Some(AbortIncompleteMultipartUpload { days_after_initiation: Some(2) });
        let c = BucketLifecycleConfiguration { rules: vec![abort] };
        assert!(abandoned(&c, "big/x", 0, 2 * DAY_MS, DAY_MS) && !abandoned(&c, "big/x", 0, DAY_MS, DAY_MS));
        assert!(!abandoned(&c, "small/x", 0, 9 * DAY_MS, DAY_MS));
        assert_eq!(acts(&c), (false, true));
    }
}

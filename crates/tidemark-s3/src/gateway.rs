//! The S3 operations, each a few calls on the filer's API (`Filer`), never a state of its own:
//! a PutObject is a local write (conditional, in the change log, dirty under a mount), a GET of
//! a remote-backed file reads through the filer's content cache.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use s3s::dto::*;
use s3s::{S3, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, s3_error};

use tidemark_core::model::{Content, Entry, MD5_ATTR, NewEntry, Origin, Precondition, Txn};
use tidemark_core::remote::CUSTOMER_KEY_REASON;
use tidemark_core::remote::MountMapping;
use tidemark_core::remote::system_paths::MOUNT_MAPPING;
use tidemark_core::{ByteRange, DeleteOptions, Error, Filer, WriteOptions, path};
use tidemark_engine::docs;

use crate::acl::{self, ATTR_ACL, Acl, Canned};
use crate::auth::Shared;
use crate::body;
use crate::checksum::{self, Algo, Asked, Given, Sum, sent_checksum, with_checksum};
use crate::cors::{self, ATTR_CORS};
use crate::lifecycle::{self, ATTR_LIFECYCLE};
use crate::list::{self, Item};
use crate::multipart::{self, Upload};
use crate::names::{self, BUCKETS_DIR, NameError};
use crate::policy::{self, ATTR_POLICY};
use crate::tagging;
use crate::versioning::{self, Mode, VERSIONS_NAME};

mod encryption;
mod versions;
use encryption::{sse_headers, with_sse};
use versions::{VersionsQuery, check_delete};

/// S3's limit on user metadata (names and values).
const MAX_METADATA_BYTES: usize = 2048;
const MAX_KEYS: i32 = 1000;
/// Extended attributes the gateway keeps for an object, by header.
use tidemark_core::model::object_attrs::{
    CACHE_CONTROL as ATTR_CACHE_CONTROL, CONTENT_DISPOSITION as ATTR_CONTENT_DISPOSITION,
    CONTENT_ENCODING as ATTR_CONTENT_ENCODING, CONTENT_LANGUAGE as ATTR_CONTENT_LANGUAGE,
    CONTENT_TYPE as ATTR_CONTENT_TYPE, EXPIRES as ATTR_EXPIRES, META_PREFIX as ATTR_META, RESTORE as ATTR_RESTORE,
    STORAGE_CLASS as ATTR_STORAGE_CLASS,
};
use tidemark_core::model::object_attrs::{
    CHECKSUM as ATTR_CHECKSUM, ETAG as ATTR_ETAG, PART_CHECKSUMS as ATTR_PART_CHECKSUMS,
};
const EMPTY_MD5: &str = "d41d8cd98f00b204e9800998ecf8427e";

#[derive(Clone)]
pub struct Gateway {
    filer: Arc<dyn Filer>,
    shared: Arc<Shared>,
    /// The keys of SSE-S3 and SSE-KMS (none: only SSE-C is honoured).
    keyring: Option<Arc<crate::sse::Keyring>>,
}

impl Gateway {
    pub fn new(filer: Arc<dyn Filer>, shared: Arc<Shared>, keyring: Option<Arc<crate::sse::Keyring>>) -> Self {
        Gateway { filer, shared, keyring }
    }
}

/// The ETag of an entry: its remote object's for remote-backed content, else the MD5 the filer
/// recorded when it stored the bytes.
pub fn etag_of(e: &Entry) -> String {
    if let (Content::Remote, Some(r)) = (&e.content, &e.remote) {
        return r.etag.clone();
    }
    // An object completed from parts: S3's ETag of parts.
    if let Some(t) = e.extended.get(ATTR_ETAG) {
        return t.clone();
    }
    match e.extended.get(MD5_ATTR) {
        Some(m) => m.clone(),
        None if e.size == 0 => EMPTY_MD5.into(),
        // Written before the filer recorded MD5s: opaque, but stable while the entry is.
        None => format!("{:032x}", e.version),
    }
}

fn timestamp(ms: i64) -> Timestamp {
    let t = if ms >= 0 { UNIX_EPOCH + Duration::from_millis(ms as u64) } else { UNIX_EPOCH };
    Timestamp::from(t)
}

fn whole_seconds(ms: i64) -> i64 {
    ms.div_euclid(1000)
}

fn ts_seconds(t: &Timestamp) -> i64 {
    let st: SystemTime = time::OffsetDateTime::from(t.clone()).into();
    match st.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// A filer error as the S3 error a client should see.
fn s3_err(e: Error) -> S3Error {
    let (code, msg) = match &e {
        Error::NotFound { .. } => (S3ErrorCode::NoSuchKey, e.to_string()),
        Error::PreconditionFailed { .. } => (S3ErrorCode::PreconditionFailed, e.to_string()),
        Error::NotADirectory { path } => (
            S3ErrorCode::InvalidRequest,
            format!("{path} is an object, so no key can continue it with '/' (the namespace is a tree)"),
        ),
        Error::IsADirectory { path } => (
            S3ErrorCode::InvalidRequest,
            format!("{path} is a directory (other keys continue it with '/'), so it cannot also be an object"),
        ),
        Error::InvalidPath { .. } => (S3ErrorCode::InvalidArgument, e.to_string()),
        Error::InvalidArgument { .. } => (S3ErrorCode::InvalidArgument, e.to_string()),
        Error::RangeNotSatisfiable { .. } => (S3ErrorCode::InvalidRange, e.to_string()),
        Error::Unavailable { .. } => (S3ErrorCode::ServiceUnavailable, e.to_string()),
        // 403, as S3 answers a GET of an object not yet restored; clients do not retry it.
        Error::Archived { .. } => (S3ErrorCode::InvalidObjectState, e.to_string()),
        Error::TooLarge { .. } => (S3ErrorCode::EntityTooLarge, e.to_string()),
        // What S3 itself answers a GET of such an object without its key: 400 InvalidRequest for
        // a customer-provided key, 403 AccessDenied for a KMS key the caller may not use.
        Error::Unreadable { reason, .. } if reason.contains(CUSTOMER_KEY_REASON) => (
            S3ErrorCode::InvalidRequest,
            format!(
                "The object was stored using a form of Server Side Encryption. The correct parameters must be provided \
                 to retrieve the object. ({e})"
            ),
        ),
        Error::Unreadable { .. } => (S3ErrorCode::AccessDenied, e.to_string()),
        Error::Unauthorized { .. } => {
            (S3ErrorCode::InternalError, format!("the gateway's filer refused it: {e} (check the gateway's --token)"))
        }
        _ => (S3ErrorCode::InternalError, e.to_string()),
    };
    if code == S3ErrorCode::InternalError {
        tracing::warn!(error = %e, "s3 request failed");
    }
    S3Error::with_message(code, msg)
}

fn name_err(e: NameError) -> S3Error {
    match e {
        NameError::Bucket(m) => S3Error::with_message(S3ErrorCode::InvalidBucketName, m),
        NameError::Key { too_long: true, .. } => S3Error::with_message(S3ErrorCode::KeyTooLongError, e.to_string()),
        NameError::Key { .. } => S3Error::with_message(S3ErrorCode::InvalidArgument, e.to_string()),
    }
}

/// `NoSuchKey`; `x-amz-delete-marker: false` says it is not a delete marker's doing (as RGW
/// answers; a marker's 404 says `true`).
fn no_such_key(key: &str) -> S3Error {
    let mut err = S3Error::with_message(S3ErrorCode::NoSuchKey, format!("no object {key:?}"));
    let mut h = hyper::HeaderMap::new();
    h.insert("x-amz-delete-marker", hyper::header::HeaderValue::from_static("false"));
    err.set_headers(h);
    err
}

/// The version id a write answers with: the new version's, in a bucket whose versioning is on
/// (while it is suspended, none, as RGW answers: every write there is the `null` version).
fn answered_version(stamp: Option<&versioning::Stamp>) -> Option<String> {
    stamp.filter(|s| !s.is_null()).map(versioning::Stamp::id)
}

fn no_such_upload(id: &str) -> S3Error {
    S3Error::with_message(S3ErrorCode::NoSuchUpload, format!("no multipart upload {id:?} (completed or aborted?)"))
}

/// What a conditional delete must find to delete.
#[derive(Default, Clone, Copy)]
struct DeleteIf<'a> {
    /// The version of the entry seen (the lifecycle sweep's): a write since is not deleted.
    version: Option<u64>,
    etag: Option<&'a ETag>,
    last_modified: Option<&'a Timestamp>,
    size: Option<i64>,
}

struct Attrs<'a> {
    content_type: Option<&'a str>,
    cache_control: Option<&'a str>,
    content_disposition: Option<&'a str>,
    content_encoding: Option<&'a str>,
    content_language: Option<&'a str>,
    expires: Option<&'a Timestamp>,
    metadata: Option<&'a Metadata>,
}

/// The [`Attrs`] of a PutObject, CopyObject or CreateMultipartUpload input (same field names).
macro_rules! attrs {
    ($i:expr) => {
        Attrs {
            content_type: $i.content_type.as_ref().map(|t| t.as_ref()),
            cache_control: $i.cache_control.as_deref(),
            content_disposition: $i.content_disposition.as_deref(),
            content_encoding: $i.content_encoding.as_deref(),
            content_language: $i.content_language.as_deref(),
            expires: $i.expires.as_ref(),
            metadata: $i.metadata.as_ref(),
        }
    };
}

/// The ACL a request asks for: a canned one (`x-amz-acl`), grants (`x-amz-grant-*`: the four
/// every such request has, and `grant_write` where it has one) or an `access_control_policy`
/// document; at most one of them.
macro_rules! asked_acl {
    ($i:expr) => {
        asked_acl!(@ $i, None, None)
    };
    ($i:expr, grant_write) => {
        asked_acl!(@ $i, $i.grant_write.as_deref(), None)
    };
    ($i:expr, grant_write, access_control_policy) => {
        asked_acl!(@ $i, $i.grant_write.as_deref(), $i.access_control_policy.as_ref())
    };
    (@ $i:expr, $write:expr, $policy:expr) => {{
        let i = &$i;
        let headers = acl::from_headers(
            i.grant_read.as_deref(),
            $write,
            i.grant_read_acp.as_deref(),
            i.grant_write_acp.as_deref(),
            i.grant_full_control.as_deref(),
        )?;
        let policy = $policy.map(acl::from_policy).transpose()?;
        let canned = i.acl.as_ref().map(|a| Canned::parse(a.as_str())).transpose()?;
        acl::asked(canned, headers, policy)?
    }};
}

/// Records an ACL in an entry's attributes (`None`: private).
fn set_acl(ext: &mut BTreeMap<String, String>, acl: Option<&Acl>) {
    ext.remove(ATTR_ACL);
    if let Some(v) = acl.and_then(Acl::to_attr) {
        ext.insert(ATTR_ACL.to_string(), v);
    }
}

/// The extended attributes of a new object from its request headers.
fn attrs_of(a: Attrs<'_>) -> S3Result<BTreeMap<String, String>> {
    let mut ext = BTreeMap::new();
    for (k, v) in [
        (ATTR_CONTENT_TYPE, a.content_type),
        (ATTR_CACHE_CONTROL, a.cache_control),
        (ATTR_CONTENT_DISPOSITION, a.content_disposition),
        (ATTR_CONTENT_ENCODING, a.content_encoding),
        (ATTR_CONTENT_LANGUAGE, a.content_language),
    ] {
        if let Some(v) = v {
            ext.insert(k.to_string(), v.to_string());
        }
    }
    // `aws-chunked` describes how the request's body was sent, not the object (S3 drops it).
    // The rest is kept as the client wrote it ("deflate, gzip" stays so).
    if let Some(enc) = ext.get(ATTR_CONTENT_ENCODING) {
        let kept: Vec<&str> =
            enc.split(',').filter(|e| !e.trim().is_empty() && !e.trim().eq_ignore_ascii_case("aws-chunked")).collect();
        match kept.is_empty() {
            true => ext.remove(ATTR_CONTENT_ENCODING),
            false => ext.insert(ATTR_CONTENT_ENCODING.to_string(), kept.join(",").trim().to_string()),
        };
    }
    if let Some(t) = a.expires {
        let mut v = Vec::new();
        if t.format(TimestampFormat::HttpDate, &mut v).is_ok() {
            ext.insert(ATTR_EXPIRES.to_string(), String::from_utf8_lossy(&v).into_owned());
        }
    }
    if let Some(meta) = a.metadata {
        let bytes: usize = meta.iter().map(|(k, v)| k.len() + v.len()).sum();
        if bytes > MAX_METADATA_BYTES {
            return Err(S3Error::with_message(
                S3ErrorCode::MetadataTooLarge,
                format!("{bytes} bytes of user metadata; at most {MAX_METADATA_BYTES}"),
            ));
        }
        for (k, v) in meta {
            ext.insert(format!("{ATTR_META}{}", k.to_ascii_lowercase()), v.clone());
        }
    }
    Ok(ext)
}

/// The attributes a copy keeps from its source (the MD5 is the filer's to set).
fn copied_attrs(e: &Entry) -> BTreeMap<String, String> {
    // A copy is written whole: one part, whatever its source was; a checksum of the whole
    // source is the copy's too, one of its parts' is not.
    let mut ext: BTreeMap<String, String> =
        e.extended.iter().filter(|(k, _)| k.starts_with("s3.")).map(|(k, v)| (k.clone(), v.clone())).collect();
    tidemark_core::model::object_attrs::forget_bytes(&mut ext);
    if let Some(s) = stored_sum(e).filter(|s| !s.composite) {
        ext.insert(ATTR_CHECKSUM.into(), s.to_attr());
    }
    ext
}

/// What a bucket blocks of public access (`s3.public-access-block`, s3s's type as JSON).
pub const ATTR_PUBLIC_ACCESS_BLOCK: &str = "s3.public-access-block";

/// A bucket's configuration kept in attribute `attr` (s3s's own type as JSON), if it has one.
pub(crate) fn config_of<T: serde::de::DeserializeOwned>(bucket: &Entry, attr: &str) -> Option<T> {
    serde_json::from_str(bucket.extended.get(attr)?).ok()
}

pub fn public_access_block_of(bucket: &Entry) -> Option<PublicAccessBlockConfiguration> {
    config_of(bucket, ATTR_PUBLIC_ACCESS_BLOCK)
}

/// Refuses an ACL that would open `bucket` (or one of its objects) to the public when the
/// bucket blocks public ACLs (`BlockPublicAcls`), as S3 does: 403, nothing stored.
fn refuse_public_acl(bucket: &Entry, acl: Option<&Acl>) -> S3Result<()> {
    let blocks = public_access_block_of(bucket).is_some_and(|c| c.block_public_acls == Some(true));
    if blocks && acl.is_some_and(Acl::is_public) {
        return Err(s3_error!(
            AccessDenied,
            "the bucket blocks public ACLs (its public access block); nothing was stored"
        ));
    }
    Ok(())
}

/// A bucket's object ownership control (`s3.ownership`): BucketOwnerEnforced, BucketOwnerPreferred
/// or ObjectWriter; none set behaves as BucketOwnerEnforced without refusing ACLs (every object
/// the bucket owner's, as before buckets had the setting).
pub const ATTR_OWNERSHIP: &str = "s3.ownership";
const ENFORCED: &str = "BucketOwnerEnforced";
const PREFERRED: &str = "BucketOwnerPreferred";
const OBJECT_WRITER: &str = "ObjectWriter";

/// An S3 error whose code s3s does not name, with its status.
fn custom_error(code: &str, status: hyper::StatusCode, message: impl Into<String>) -> S3Error {
    let mut err = S3Error::with_message(S3ErrorCode::Custom(code.to_string().into()), message.into());
    err.set_status_code(status);
    err
}

fn acls_off() -> S3Error {
    custom_error(
        "AccessControlListNotSupported",
        hyper::StatusCode::BAD_REQUEST,
        "The bucket does not allow ACLs (its object ownership is BucketOwnerEnforced)",
    )
}

/// Whether the writer of a new object in `bucket` with ACL `acl` owns it (else the bucket's
/// owner does), by the bucket's ownership control; under BucketOwnerEnforced ACLs are off, and
/// one other than `bucket-owner-full-control` is refused, as S3 does.
fn writer_owns(bucket: &Entry, acl: Option<&Acl>) -> S3Result<bool> {
    let canned = acl.map(|a| a.canned());
    match bucket.extended.get(ATTR_OWNERSHIP).map(String::as_str) {
        Some(ENFORCED) => match canned {
            None | Some(Some(Canned::BucketOwnerFullControl)) => Ok(false),
            Some(_) => Err(acls_off()),
        },
        Some(PREFERRED) => Ok(canned != Some(Some(Canned::BucketOwnerFullControl))),
        Some(OBJECT_WRITER) => Ok(true),
        _ => Ok(false),
    }
}

/// Checks an ownership control as S3 does: a known one, and BucketOwnerEnforced only over a
/// private ACL.
fn check_ownership(o: &str, acl: Option<&Acl>) -> S3Result<()> {
    if ![ENFORCED, PREFERRED, OBJECT_WRITER].contains(&o) {
        return Err(s3_error!(
            InvalidArgument,
            "ObjectOwnership {o:?}: BucketOwnerEnforced, BucketOwnerPreferred or ObjectWriter"
        ));
    }
    if o == ENFORCED && acl.is_some_and(|a| !a.is_private()) {
        return Err(custom_error(
            "InvalidBucketAclWithObjectOwnership",
            hyper::StatusCode::BAD_REQUEST,
            "Bucket cannot have ACLs set with ObjectOwnership's BucketOwnerEnforced setting",
        ));
    }
    Ok(())
}

/// The owner S3 shows for an object: its writer where the bucket's ownership control made it so,
/// else the bucket's owner.
fn object_owner(bucket: &Entry, object: &Entry) -> Owner {
    object.extended.get(ATTR_OWNER).map_or_else(|| owner_of(bucket), |n| owner_named(n))
}

fn cors_of(bucket: &Entry) -> Option<CORSConfiguration> {
    config_of(bucket, ATTR_CORS)
}

fn lifecycle_of(bucket: &Entry) -> Option<BucketLifecycleConfiguration> {
    config_of(bucket, ATTR_LIFECYCLE)
}

/// The `x-amz-expiration` header of object `key` (entry `e`) under its bucket's lifecycle rules.
fn expiration_of(rules: Option<&BucketLifecycleConfiguration>, key: &str, e: &Entry) -> Option<String> {
    lifecycle::expiration_header(rules?, key, e.size, &tagging::kept(&e.extended, tagging::ATTR_TAGGING), e.mtime_ms)
}

/// The algorithm a request names (`x-amz-checksum-algorithm`).
fn algo_named(name: &str) -> S3Result<Algo> {
    Algo::parse(name).ok_or_else(|| {
        s3_error!(InvalidRequest, "Checksum algorithm {name:?}: CRC32, CRC32C, CRC64NVME, SHA1 or SHA256")
    })
}

/// The algorithm of an upload's checksum.
fn upload_algo(u: &Upload) -> Option<Algo> {
    u.checksum_algorithm.as_deref().and_then(Algo::parse)
}

fn checksum_type(full_object: bool) -> ChecksumType {
    ChecksumType::from(if full_object { ChecksumType::FULL_OBJECT } else { ChecksumType::COMPOSITE }.to_string())
}

/// The checksum kept with an object.
fn stored_sum(e: &Entry) -> Option<Sum> {
    e.extended.get(ATTR_CHECKSUM).and_then(|s| Sum::from_attr(s))
}

/// The checksum of part `n` (from 1) of an object completed from parts, typed as the object's.
fn part_sum(e: &Entry, n: i32) -> Option<Sum> {
    let whole = stored_sum(e)?;
    let v = e.extended.get(ATTR_PART_CHECKSUMS)?.split(',').nth(usize::try_from(n).ok()?.checked_sub(1)?)?;
    Some(Sum { value: v.to_string(), ..whole })
}

/// The checksum a GET or HEAD answers with: asked for (`x-amz-checksum-mode: ENABLED`), and of
/// what is read — the whole object, or one of its parts; none for a byte range.
fn read_sum(e: &Entry, mode: Option<&ChecksumMode>, part: Option<i32>, ranged: bool) -> Option<Sum> {
    if !mode.is_some_and(|m| m.as_str().eq_ignore_ascii_case(ChecksumMode::ENABLED)) {
        return None;
    }
    match part {
        Some(n) if multipart::is_multipart(&e.extended) => part_sum(e, n),
        Some(_) => stored_sum(e).filter(|s| !s.composite),
        None if ranged => None,
        None => stored_sum(e),
    }
}

fn user_metadata(e: &Entry) -> Option<Metadata> {
    let m: Metadata = tidemark_core::model::object_attrs::user_metadata(&e.extended).into_iter().collect();
    (!m.is_empty()).then_some(m)
}

/// How many tags an object has, if any.
fn tag_count(e: &Entry) -> Option<i32> {
    let n = tagging::kept(&e.extended, tagging::ATTR_TAGGING).len();
    (n > 0).then_some(n as i32)
}

fn attr(e: &Entry, k: &str) -> Option<String> {
    e.extended.get(k).cloned()
}

fn content_type(e: &Entry) -> Option<ContentType> {
    let t = attr(e, ATTR_CONTENT_TYPE).unwrap_or_else(|| "binary/octet-stream".into());
    t.parse().ok()
}

/// Evaluates If-Match, If-None-Match, If-Modified-Since and If-Unmodified-Since (RFC 9110's
/// order) against an entry.
fn check_conditions(
    e: &Entry,
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
    if_modified_since: Option<&Timestamp>,
    if_unmodified_since: Option<&Timestamp>,
) -> S3Result<()> {
    let etag = etag_of(e);
    let matches = |c: &ETagCondition| match c {
        ETagCondition::Any => true,
        ETagCondition::ETag(t) => t.value() == etag,
    };
    let modified = whole_seconds(e.mtime_ms);
    if let Some(c) = if_match {
        if !matches(c) {
            return Err(s3_error!(PreconditionFailed, "If-Match: the object's ETag is {etag}"));
        }
    } else if let Some(t) = if_unmodified_since
        && modified > ts_seconds(t)
    {
        return Err(s3_error!(PreconditionFailed, "If-Unmodified-Since: the object was modified since"));
    }
    if let Some(c) = if_none_match {
        if matches(c) {
            return Err(not_modified(e, &etag));
        }
    } else if let Some(t) = if_modified_since
        && modified <= ts_seconds(t)
    {
        return Err(not_modified(e, &etag));
    }
    Ok(())
}

/// 304 with the validators a cache needs to keep using its copy (RFC 9110 §15.4.5): ETag and
/// Last-Modified.
fn not_modified(e: &Entry, etag: &str) -> S3Error {
    let mut err = S3Error::new(S3ErrorCode::NotModified);
    let mut h = hyper::HeaderMap::new();
    if let Ok(v) = format!("\"{etag}\"").parse() {
        h.insert(hyper::header::ETAG, v);
    }
    if let Ok(v) =
        httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_millis(e.mtime_ms.max(0) as u64))
            .parse()
    {
        h.insert(hyper::header::LAST_MODIFIED, v);
    }
    err.set_headers(h);
    err
}

/// What a GET or HEAD asks besides the bytes: its conditions and the response headers it
/// overrides. Both inputs have the same fields; the macro reads them from either.
struct ReadAsk {
    if_match: Option<ETagCondition>,
    if_none_match: Option<ETagCondition>,
    if_modified_since: Option<Timestamp>,
    if_unmodified_since: Option<Timestamp>,
    content_type: Option<String>,
    cache_control: Option<String>,
    content_disposition: Option<String>,
    content_encoding: Option<String>,
    content_language: Option<String>,
    expires: Option<Timestamp>,
}

macro_rules! read_ask {
    ($i:expr) => {
        ReadAsk {
            if_match: $i.if_match.take(),
            if_none_match: $i.if_none_match.take(),
            if_modified_since: $i.if_modified_since.take(),
            if_unmodified_since: $i.if_unmodified_since.take(),
            content_type: $i.response_content_type.take(),
            cache_control: $i.response_cache_control.take(),
            content_disposition: $i.response_content_disposition.take(),
            content_encoding: $i.response_content_encoding.take(),
            content_language: $i.response_content_language.take(),
            expires: $i.response_expires.take(),
        }
    };
}

/// Refuses a write that asks for what the gateway does not do — object lock (mode, retention,
/// legal hold), S3 Bucket Keys — rather than store the object as if it were honoured. 501
/// NotImplemented, as S3-compatibles answer for a header they do not implement.
macro_rules! refuse_unhonoured {
    ($i:expr) => {{
        let i = &$i;
        let asked = [
            i.bucket_key_enabled.filter(|b| *b).map(|_| "x-amz-server-side-encryption-bucket-key-enabled".to_string()),
            i.object_lock_mode.as_ref().map(|v| format!("x-amz-object-lock-mode: {}", v.as_str())),
            i.object_lock_retain_until_date.as_ref().map(|_| "x-amz-object-lock-retain-until-date".to_string()),
            i.object_lock_legal_hold_status.as_ref().map(|_| "x-amz-object-lock-legal-hold".to_string()),
        ];
        if let Some(what) = asked.into_iter().flatten().next() {
            return Err(S3Error::with_message(
                S3ErrorCode::NotImplemented,
                format!(
                    "{what}: this gateway does not lock objects or keep S3 Bucket Keys, and stores nothing as if it did; \
                     send the request without it"
                ),
            ));
        }
    }};
}

/// The headers a GET or HEAD answers with for an entry.
struct Shown {
    content_type: Option<ContentType>,
    cache_control: Option<String>,
    content_disposition: Option<String>,
    content_encoding: Option<String>,
    content_language: Option<String>,
    expires: Option<Timestamp>,
    storage_class: Option<StorageClass>,
    restore: Option<String>,
    e_tag: Option<ETag>,
    last_modified: Option<Timestamp>,
    metadata: Option<Metadata>,
    content_length: Option<i64>,
    content_range: Option<String>,
}

impl ReadAsk {
    fn check(&self, e: &Entry) -> S3Result<()> {
        check_conditions(
            e,
            self.if_match.as_ref(),
            self.if_none_match.as_ref(),
            self.if_modified_since.as_ref(),
            self.if_unmodified_since.as_ref(),
        )
    }

    fn shown(self, e: &Entry, range: Option<&std::ops::Range<u64>>) -> Shown {
        let (len, content_range) = match range {
            Some(r) => (r.end - r.start, Some(format!("bytes {}-{}/{}", r.start, r.end - 1, e.size))),
            None => (e.size, None),
        };
        Shown {
            content_type: self.content_type.and_then(|t| t.parse().ok()).or_else(|| content_type(e)),
            cache_control: self.cache_control.or_else(|| attr(e, ATTR_CACHE_CONTROL)),
            content_disposition: self.content_disposition.or_else(|| attr(e, ATTR_CONTENT_DISPOSITION)),
            content_encoding: self.content_encoding.or_else(|| attr(e, ATTR_CONTENT_ENCODING)),
            content_language: self.content_language.or_else(|| attr(e, ATTR_CONTENT_LANGUAGE)),
            expires: self
                .expires
                .or_else(|| attr(e, ATTR_EXPIRES).and_then(|v| Timestamp::parse(TimestampFormat::HttpDate, &v).ok())),
            // STANDARD is left out, as S3 does.
            storage_class: attr(e, ATTR_STORAGE_CLASS).filter(|c| c != "STANDARD").map(StorageClass::from),
            restore: attr(e, ATTR_RESTORE),
            e_tag: Some(ETag::Strong(etag_of(e))),
            last_modified: Some(timestamp(e.mtime_ms)),
            metadata: user_metadata(e),
            content_length: Some(len as i64),
            content_range,
        }
    }
}

/// A HEAD or GET output (same field names) with the headers of a [`Shown`].
macro_rules! shown_as {
    ($ty:ident, $s:expr $(, $field:ident: $value:expr)* $(,)?) => {{
        let s = $s;
        $ty {
            accept_ranges: Some("bytes".into()),
            content_length: s.content_length,
            content_range: s.content_range,
            content_type: s.content_type,
            cache_control: s.cache_control,
            content_disposition: s.content_disposition,
            content_encoding: s.content_encoding,
            content_language: s.content_language,
            expires: s.expires,
            storage_class: s.storage_class,
            restore: s.restore,
            e_tag: s.e_tag,
            last_modified: s.last_modified,
            metadata: s.metadata,
            $($field: $value,)*
            ..Default::default()
        }
    }};
}

/// The byte range a `Range` header asks of an object of `size` bytes.
fn satisfiable(r: &Range, size: u64) -> S3Result<std::ops::Range<u64>> {
    r.check(size).map_err(|_| s3_error!(InvalidRange, "the range lies outside the {size}-byte object"))
}

fn encode_key(k: &str, url: bool) -> String {
    if !url {
        return k.to_string();
    }
    let mut out = String::with_capacity(k.len());
    for b in k.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Refuses a declared body larger than one upload may be, before anything is read.
fn too_large(len: Option<u64>) -> S3Result<()> {
    match len {
        Some(n) if n > multipart::MAX_SINGLE_UPLOAD_BYTES => Err(s3_error!(
            EntityTooLarge,
            "{n} bytes declared; one PutObject or UploadPart carries at most {} (use a multipart upload)",
            multipart::MAX_SINGLE_UPLOAD_BYTES
        )),
        _ => Ok(()),
    }
}

fn completed_output(done: &multipart::Completed) -> CompleteMultipartUploadOutput {
    let mut out = CompleteMultipartUploadOutput {
        bucket: Some(done.bucket.clone()),
        key: Some(done.key.clone()),
        e_tag: Some(ETag::Strong(done.etag.clone())),
        location: Some(format!("/{}/{}", done.bucket, done.key)),
        version_id: done.version_id.clone(),
        ..Default::default()
    };
    with_checksum!(out, done.checksum.as_deref().and_then(Sum::from_attr).as_ref(), typed);
    out
}

/// The identity that created a bucket (`s3.owner` in its entry); its objects are its owner's,
/// as in S3 with ACLs disabled. Buckets made otherwise (the shell, a remote mount) and every
/// listing of buckets show the namespace's own name.
pub const ATTR_OWNER: &str = "s3.owner";

fn owner_named(name: &str) -> Owner {
    Owner { display_name: Some(name.into()), id: Some(name.into()) }
}

/// The owner shown for a bucket made before buckets had owners (every identity's).
pub(crate) const UNOWNED: &str = "tidemark";

fn owner() -> Owner {
    owner_named(UNOWNED)
}

fn owner_of(bucket: &Entry) -> Owner {
    bucket.extended.get(ATTR_OWNER).map_or_else(owner, |n| owner_named(n))
}

/// A listing's items as S3 shows them: the objects, and the common prefixes of a delimiter.
fn listed(items: &[Item], url: bool, owner: Option<&Owner>) -> (Vec<Object>, Vec<CommonPrefix>) {
    let (mut objects, mut prefixes) = (Vec::new(), Vec::new());
    for it in items {
        match it {
            Item::Object { key, entry } => objects.push(object_of(key, entry, url, owner)),
            Item::Prefix(p) => prefixes.push(CommonPrefix { prefix: Some(encode_key(p, url)) }),
        }
    }
    (objects, prefixes)
}

/// A listed object; its `owner` for ListObjects (always) and ListObjectsV2 with FetchOwner.
fn object_of(key: &str, e: &Entry, url: bool, owner: Option<&Owner>) -> Object {
    let class = attr(e, ATTR_STORAGE_CLASS).unwrap_or_else(|| ObjectStorageClass::STANDARD.to_string());
    Object {
        key: Some(encode_key(key, url)),
        size: Some(e.size as i64),
        e_tag: Some(ETag::Strong(etag_of(e))),
        last_modified: Some(timestamp(e.mtime_ms)),
        storage_class: Some(ObjectStorageClass::from(class)),
        owner: owner.cloned(),
        ..Default::default()
    }
}

fn wants_url(e: &Option<EncodingType>) -> S3Result<bool> {
    match e {
        None => Ok(false),
        Some(t) if t.as_str() == EncodingType::URL => Ok(true),
        Some(t) => Err(s3_error!(InvalidArgument, "encoding-type {:?}: only \"url\" is defined", t.as_str())),
    }
}

fn max_keys(m: Option<i32>) -> S3Result<usize> {
    match m {
        None => Ok(MAX_KEYS as usize),
        Some(n) if n < 0 => Err(s3_error!(InvalidArgument, "max-keys must not be negative")),
        Some(n) => Ok(n.min(MAX_KEYS) as usize),
    }
}

fn token_encode(k: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(k)
}

fn token_decode(t: &str) -> S3Result<String> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(t)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| s3_error!(InvalidArgument, "the continuation token is not one this gateway gave out"))
}

/// The bucket, key and version (if one is named) a copy reads.
fn copy_source(cs: &CopySource) -> S3Result<(String, String, Option<String>)> {
    match cs {
        CopySource::Bucket { bucket, key, version_id } => {
            Ok((bucket.to_string(), key.to_string(), version_id.as_ref().map(|v| v.to_string())))
        }
        _ => Err(s3_error!(NotImplemented, "copying from an access point or outpost")),
    }
}

/// `bytes=a-b` of x-amz-copy-source-range.
fn copy_range(spec: &str, size: u64) -> S3Result<ByteRange> {
    let r = Range::parse(spec)
        .map_err(|_| s3_error!(InvalidArgument, "x-amz-copy-source-range {spec:?}: use bytes=first-last"))?;
    // Unlike a GET's Range, a copy's is not cut to the source: it must lie within it.
    if let Range::Int { last: Some(last), .. } = r
        && last >= size
    {
        return Err(s3_error!(InvalidRange, "x-amz-copy-source-range {spec:?} lies outside the {size}-byte source"));
    }
    let r = r
        .check(size)
        .map_err(|_| s3_error!(InvalidRange, "x-amz-copy-source-range {spec:?} lies outside the {size}-byte source"))?;
    Ok(ByteRange { offset: r.start, length: Some(r.end - r.start) })
}

impl Gateway {
    /// A GET or HEAD of part `n` of an object: the part's bytes as the range to read (`range`
    /// must be unset: S3 refuses both), and the object's part count if it was uploaded in parts.
    async fn part_as_range(
        &self,
        bucket: &str,
        key: &str,
        n: Option<i32>,
        range: &mut Option<Range>,
    ) -> S3Result<Option<i32>> {
        let Some(n) = n else { return Ok(None) };
        if range.is_some() {
            return Err(s3_error!(InvalidRequest, "a Range and a partNumber together"));
        }
        let (_, e) = self.object_entry(bucket, key).await?;
        let sizes = multipart::part_sizes(&e.extended, e.size);
        let count = sizes.len();
        let Some(len) = usize::try_from(n).ok().filter(|n| (1..=count).contains(n)).map(|n| sizes[n - 1]) else {
            return Err(s3_error!(InvalidPart, "part {n}: the object has {count} part(s)"));
        };
        let first: u64 = sizes[..n as usize - 1].iter().sum();
        // An empty part (an empty object) is read whole: no range of it is satisfiable.
        *range = (len > 0).then_some(Range::Int { first, last: Some(first + len - 1) });
        Ok(multipart::is_multipart(&e.extended).then_some(count as i32))
    }

    /// Replaces the tags of object `key` (or of the bucket itself): a metadata update of its
    /// entry, conditional on the version read, so a write in between is never undone.
    async fn set_tags(&self, bucket: &str, key: Option<&str>, tags: &[(String, String)]) -> S3Result<()> {
        let ((p, e), attr) = match key {
            Some(k) => (self.object_entry(bucket, k).await?, tagging::ATTR_TAGGING),
            None => (self.bucket_entry(bucket).await?, tagging::ATTR_BUCKET_TAGGING),
        };
        self.update_extended(&p, &e, Origin::Local, "its tags were set", |ext| tagging::set(ext, attr, tags)).await
    }

    /// Changes the extended attributes of entry `e` at `p` — a metadata update, conditional on
    /// the version read, so a write in between is never undone (it answers ServiceUnavailable:
    /// retry). Nothing is written if nothing changes.
    async fn update_extended(
        &self,
        p: &str,
        e: &Entry,
        origin: Origin,
        what: &str,
        change: impl FnOnce(&mut BTreeMap<String, String>),
    ) -> S3Result<()> {
        let mut n = e.to_new();
        change(&mut n.extended);
        if n.extended == e.extended {
            return Ok(());
        }
        let txn = Txn::put(p, n, origin).with_precondition(Precondition::Version(e.version));
        match self.filer.apply(txn).await {
            Ok(_) => Ok(()),
            Err(Error::PreconditionFailed { .. }) => {
                Err(s3_error!(ServiceUnavailable, "{p} changed while {what}; retry"))
            }
            Err(e) => Err(s3_err(e)),
        }
    }

    /// Every upload in progress, with its id (any gateway's: they are staged in the namespace).
    async fn uploads(&self) -> tidemark_core::Result<Vec<(String, Upload)>> {
        let mut uploads = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = match self.filer.list(multipart::UPLOADS, after.as_deref(), 1000).await {
                Ok(p) => p,
                Err(Error::NotFound { .. }) => break,
                Err(e) => return Err(e),
            };
            for e in page.entries.iter().filter(|e| e.is_dir()) {
                if let Ok(Some((u, _))) =
                    docs::read_json::<Upload>(&*self.filer, &multipart::upload_doc(e.name())).await
                {
                    uploads.push((e.name().to_string(), u));
                }
            }
            match page.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        Ok(uploads)
    }

    async fn bucket_entry(&self, bucket: &str) -> S3Result<(String, Entry)> {
        let dir = names::bucket_dir(bucket).map_err(name_err)?;
        match self.filer.stat(&dir).await.map_err(s3_err)? {
            Some(e) if e.is_dir() => Ok((dir, e)),
            _ => Err(S3Error::with_message(
                S3ErrorCode::NoSuchBucket,
                format!("no bucket {bucket:?} (no directory {dir})"),
            )),
        }
    }

    /// The file entry of `key`; `NoSuchKey` for a directory, a symbolic link or device node (no
    /// bytes of their own) or nothing, `NoSuchBucket` when the bucket itself is missing.
    async fn object_entry(&self, bucket: &str, key: &str) -> S3Result<(String, Entry)> {
        let (p, marker) = names::object_path(bucket, key).map_err(name_err)?;
        match self.filer.stat(&p).await.map_err(s3_err)? {
            Some(e) if e.kind == tidemark_core::model::EntryKind::File && !marker => Ok((p, e)),
            Some(e) if e.is_dir() && marker => Ok((p, e)),
            _ => {
                self.bucket_entry(bucket).await?;
                Err(no_such_key(key))
            }
        }
    }

    /// Writes `stream` as `p`, mapping a broken or mismatched body to its own S3 error.
    async fn write(
        &self,
        p: &str,
        stream: tidemark_core::ByteStream,
        verdict: &body::Verdict,
        opts: WriteOptions,
    ) -> S3Result<Entry> {
        match self.filer.write(p, stream, opts).await {
            Ok(e) => Ok(e),
            Err(e) => Err(verdict.take().unwrap_or_else(|| s3_err(e))),
        }
    }

    /// [`Self::write`] of the object `key` at `p`: in a versioned bucket (`stamp`), as a new
    /// version ([`Self::write_version`]). `opts.precondition` is the client's own.
    #[allow(clippy::too_many_arguments)]
    async fn write_object(
        &self,
        bucket: &str,
        key: &str,
        p: &str,
        stamp: Option<&versioning::Stamp>,
        stream: tidemark_core::ByteStream,
        verdict: &body::Verdict,
        opts: WriteOptions,
    ) -> S3Result<Entry> {
        match stamp {
            None => self.write(p, stream, verdict, opts).await,
            Some(s) => self.write_version(bucket, key, p, s, stream, verdict, opts).await,
        }
    }

    /// The name of the identity whose key signed a request (none for the development key or an
    /// unsigned request).
    /// Records who owns a new object (its writer, where the bucket's ownership control makes it
    /// so; else nobody: the bucket's owner) — never the owner of what it was copied from.
    async fn set_object_owner(
        &self,
        ext: &mut BTreeMap<String, String>,
        bucket: &Entry,
        acl: Option<&Acl>,
        credentials: &Option<s3s::auth::Credentials>,
    ) -> S3Result<()> {
        ext.remove(ATTR_OWNER);
        if writer_owns(bucket, acl)?
            && let Some(name) = self.identity_name(credentials).await
        {
            ext.insert(ATTR_OWNER.to_string(), name);
        }
        Ok(())
    }

    /// `acl`, if every identity its grants name is one the gateway knows (`InvalidArgument`
    /// otherwise, as S3 answers a grant to an unknown canonical id).
    async fn known(&self, acl: Option<Acl>) -> S3Result<Option<Acl>> {
        if let Some(Acl::Grants(g)) = &acl {
            let ids = self.shared.identities().await;
            if let Some(unknown) = acl::named(g).find(|n| !ids.identities.iter().any(|i| i.name == *n)) {
                return Err(s3_error!(
                    InvalidArgument,
                    "the grantee id {unknown:?} is no identity here (s3.configure lists them)"
                ));
            }
        }
        Ok(acl)
    }

    async fn identity_name(&self, credentials: &Option<s3s::auth::Credentials>) -> Option<String> {
        let ak = credentials.as_ref()?.access_key.clone();
        let ids = self.shared.identities().await;
        match ids.caller(Some(&ak), self.shared.dev_key_allowed())? {
            crate::identity::Caller::Identity(i) => Some(i.name.clone()),
            _ => None,
        }
    }

    /// The CORS rules of `bucket` (cached with its other configuration): `Err(())` if there is
    /// no such bucket, `Ok(None)` if it has none (what a preflight must tell apart).
    pub async fn bucket_cors(&self, bucket: &str) -> Result<Option<Arc<CORSConfiguration>>, ()> {
        let facts = self.shared.bucket_facts(bucket).await;
        if facts.exists { Ok(facts.cors) } else { Err(()) }
    }

    /// Keeps configuration `c` in attribute `attr` of the bucket's entry (`None`: removes it).
    async fn set_bucket_config<T: serde::Serialize>(&self, bucket: &str, attr: &str, c: Option<&T>) -> S3Result<()> {
        let json = c.map(serde_json::to_string).transpose().map_err(|e| s3_error!(InternalError, "{e}"))?;
        self.set_bucket_attr(bucket, attr, json).await
    }

    /// Sets one attribute of a bucket's entry (`None`: removes it), conditional on the version
    /// read, so a change in between is never undone.
    async fn set_bucket_attr(&self, bucket: &str, attr: &str, value: Option<String>) -> S3Result<()> {
        let (p, e) = self.bucket_entry(bucket).await?;
        let applied = self
            .update_extended(&p, &e, Origin::Local, "its configuration was set", |ext| {
                match value {
                    Some(v) => ext.insert(attr.to_string(), v),
                    None => ext.remove(attr),
                };
            })
            .await;
        // This gateway's access checks see the change at once; others within 2 s.
        self.shared.forget_bucket(bucket).await;
        applied
    }

    /// Carries out the buckets' lifecycle rules at `now_ms`: deletes the objects due to expire
    /// (each conditional on the version seen, so a write since is never deleted) and aborts the
    /// uploads due. Returns how many of each.
    pub async fn sweep_lifecycle(&self, now_ms: i64, day_ms: i64) -> tidemark_core::Result<(u64, u64)> {
        let (mut expired, mut aborted) = (0, 0);
        let mut after: Option<String> = None;
        loop {
            let page = match self.filer.list(BUCKETS_DIR, after.as_deref(), 1000).await {
                Ok(p) => p,
                Err(Error::NotFound { .. }) => break,
                Err(e) => return Err(e),
            };
            for b in page.entries.iter().filter(|e| e.is_dir() && e.name() != VERSIONS_NAME) {
                let Some(c) = lifecycle_of(b) else { continue };
                let (objects, uploads) = lifecycle::acts(&c);
                if objects {
                    let mode = versioning::mode_of(b);
                    expired += self.expire_objects(b, &c, now_ms, day_ms).await?;
                    if mode != Mode::Off {
                        expired += self.expire_noncurrent(b.name(), &c, now_ms, day_ms).await?;
                    }
                }
                if uploads {
                    aborted += self.abort_abandoned(b.name(), &c, now_ms, day_ms).await?;
                }
            }
            match page.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        Ok((expired, aborted))
    }

    async fn expire_objects(
        &self,
        bucket_e: &Entry,
        c: &BucketLifecycleConfiguration,
        now_ms: i64,
        day_ms: i64,
    ) -> tidemark_core::Result<u64> {
        let (bucket, dir, mode) = (bucket_e.name(), bucket_e.path.as_str(), versioning::mode_of(bucket_e));
        let mut n = 0;
        let mut after: Option<String> = None;
        loop {
            let page = self.filer.scan(dir, after.as_deref(), 1000).await?;
            for e in page.entries.iter().filter(|e| e.kind == tidemark_core::model::EntryKind::File) {
                let Some(key) = names::key_of(dir, &e.path) else { continue };
                let tags = tagging::kept(&e.extended, tagging::ATTR_TAGGING);
                if !lifecycle::expired(c, &key, e.size, &tags, e.mtime_ms, now_ms, day_ms) {
                    continue;
                }
                if mode != Mode::Off {
                    // Versioned: the expired version is kept, behind a delete marker, as S3 does.
                    let cond = DeleteIf { version: Some(e.version), ..Default::default() };
                    match self.delete_to_marker(&(dir.to_string(), bucket_e.clone()), bucket, &key, mode, &cond).await {
                        Ok(_) => n += 1,
                        Err(err) => tracing::debug!(bucket, key, error = %err, "not expired: it changed meanwhile"),
                    }
                    continue;
                }
                let opts = DeleteOptions {
                    recursive: false,
                    precondition: Precondition::Version(e.version),
                    ..Default::default()
                };
                match self.filer.delete(&e.path, opts).await {
                    Ok(_) => {
                        n += 1;
                        self.prune(dir, &e.path).await;
                    }
                    // Written or deleted since it was listed: not this sweep's to delete.
                    Err(Error::PreconditionFailed { .. } | Error::NotFound { .. }) => {}
                    Err(err) => return Err(err),
                }
            }
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        Ok(n)
    }

    async fn abort_abandoned(
        &self,
        bucket: &str,
        c: &BucketLifecycleConfiguration,
        now_ms: i64,
        day_ms: i64,
    ) -> tidemark_core::Result<u64> {
        let mut n = 0;
        for (id, u) in self.uploads().await? {
            if u.bucket == bucket && lifecycle::abandoned(c, &u.key, u.initiated_ms, now_ms, day_ms) {
                let opts = DeleteOptions { recursive: true, precondition: Precondition::Any, ..Default::default() };
                match self.filer.delete(&multipart::upload_dir(&id), opts).await {
                    Ok(_) => n += 1,
                    Err(Error::NotFound { .. }) => {}
                    Err(err) => return Err(err),
                }
            }
        }
        Ok(n)
    }

    /// Records what is known only once the bytes were stored — a checksum sent in a trailer
    /// or computed here, SSE-S3's ETag (the plaintext's MD5) — on the entry they made,
    /// conditional on its version: if another write came in between, they described bytes that
    /// are gone.
    async fn keep_late(&self, p: &str, e: &Entry, sum: Option<&Sum>, etag: Option<&str>, origin: Origin) {
        if sum.is_none() && etag.is_none() {
            return;
        }
        let kept = self.update_extended(p, e, origin, "its checksum was kept", |ext| {
            if let Some(s) = sum {
                ext.insert(ATTR_CHECKSUM.into(), s.to_attr());
            }
            if let Some(t) = etag {
                ext.insert(ATTR_ETAG.into(), t.to_string());
            }
        });
        if let Err(err) = kept.await {
            tracing::debug!(path = %p, error = %err, "a checksum or ETag was not kept: the object changed meanwhile");
        }
    }

    async fn precondition_for_put(
        &self,
        p: &str,
        if_match: Option<&ETagCondition>,
        if_none_match: Option<&ETagCondition>,
    ) -> S3Result<Precondition> {
        match (if_match, if_none_match) {
            (None, None) => return Ok(Precondition::Any),
            (None, Some(ETagCondition::Any)) => return Ok(Precondition::Absent),
            (Some(_), Some(_)) => {
                return Err(s3_error!(InvalidArgument, "If-Match and If-None-Match exclude each other"));
            }
            _ => {}
        }
        let current = self.filer.stat(p).await.map_err(s3_err)?.filter(|e| !e.is_dir());
        match (if_match, if_none_match) {
            // An ETag: the write goes ahead unless the object has it (and then only over the
            // object it saw).
            (None, Some(ETagCondition::ETag(t))) => match current {
                None => Ok(Precondition::Absent),
                Some(e) if t.value() == etag_of(&e) => {
                    Err(s3_error!(PreconditionFailed, "If-None-Match: the object's ETag is {}", etag_of(&e)))
                }
                Some(e) => Ok(Precondition::Version(e.version)),
            },
            (Some(c), _) => match (c, current) {
                (_, None) => Err(s3_error!(NoSuchKey, "If-Match: there is no object to match")),
                (ETagCondition::Any, Some(e)) => Ok(Precondition::Version(e.version)),
                (ETagCondition::ETag(t), Some(e)) if t.value() == etag_of(&e) => Ok(Precondition::Version(e.version)),
                (_, Some(e)) => Err(s3_error!(PreconditionFailed, "If-Match: the object's ETag is {}", etag_of(&e))),
            },
            (None, _) => Ok(Precondition::Any),
        }
    }

    /// Removes the directories a delete left empty, up to (not including) the bucket's. The
    /// store refuses a non-recursive delete of a directory that is not empty, so one written into
    /// meanwhile is kept; so is a mount's directory.
    async fn prune(&self, bucket_dir: &str, p: &str) {
        let below = |d: &str| path::is_within(d, bucket_dir) && d != bucket_dir;
        let mut cur = path::parent(p).filter(|d| below(d)).map(str::to_string);
        if cur.is_none() {
            // A key at the top of its bucket: nothing to prune, no mapping to read.
            return;
        }
        let mounts: MountMapping = match docs::read_json(&*self.filer, MOUNT_MAPPING).await {
            Ok(m) => m.map(|(m, _)| m).unwrap_or_default(),
            Err(_) => return,
        };
        while let Some(dir) = cur {
            if mounts.find_dir(&dir).is_some() {
                break;
            }
            let opts = DeleteOptions { recursive: false, precondition: Precondition::Any, ..Default::default() };
            if self.filer.delete(&dir, opts).await.is_err() {
                break;
            }
            cur = path::parent(&dir).filter(|d| below(d)).map(str::to_string);
        }
    }

    /// DeleteObject(s) of one key: of version `version` if one is named; else, in a versioned
    /// bucket, a delete marker; else the object.
    async fn delete_any(
        &self,
        bucket: &str,
        key: &str,
        version: Option<&str>,
        cond: DeleteIf<'_>,
    ) -> S3Result<versions::Deleted> {
        // The bucket read once, for whichever delete this is.
        let at = self.bucket_entry(bucket).await?;
        if let Some(v) = version {
            return self.delete_version(&at, bucket, key, v, &cond).await;
        }
        match versioning::mode_of(&at.1) {
            Mode::Off => self.delete_one(&at.0, bucket, key, cond).await.map(|_| versions::Deleted::default()),
            mode => self.delete_to_marker(&at, bucket, key, mode, &cond).await,
        }
    }

    /// Deletes one key; with conditions (`If-Match`, and S3 Express's last-modified time and
    /// size) only while the object is still the one they describe — atomically: a write in
    /// between fails the delete, not the other way round.
    async fn delete_one(&self, bucket_dir: &str, bucket: &str, key: &str, cond: DeleteIf<'_>) -> S3Result<()> {
        let (p, marker) = names::object_path(bucket, key).map_err(name_err)?;
        let e = self.filer.stat(&p).await.map_err(s3_err)?.filter(|e| e.is_dir() == marker);
        // No such key (or `a` when a/ is a directory, or `a/` when a is an object): S3 says
        // done — unless the delete was conditional on the ETag of what it would delete
        // (NoSuchKey, as for general purpose buckets; S3 Express's time and size conditions alone
        // answer done, as there).
        let Some(e) = e else {
            return match cond.etag {
                Some(_) => Err(no_such_key(key)),
                None => Ok(()),
            };
        };
        check_delete(&e, key, &cond)?;
        let if_match = cond.etag;
        let opts =
            DeleteOptions { recursive: false, precondition: Precondition::Version(e.version), ..Default::default() };
        match self.filer.delete(&p, opts).await {
            Ok(_) | Err(Error::NotFound { .. }) => {}
            Err(Error::DirectoryNotEmpty { .. }) => {
                return Err(s3_error!(InvalidRequest, "{key:?} is a directory with objects below it; delete those"));
            }
            Err(Error::PreconditionFailed { .. }) if if_match.is_some() => {
                return Err(s3_error!(PreconditionFailed, "If-Match: {key:?} changed while it was being deleted"));
            }
            Err(Error::PreconditionFailed { .. }) => {
                return Err(s3_error!(ServiceUnavailable, "{key:?} changed while it was being deleted; retry"));
            }
            Err(e) => return Err(s3_err(e)),
        }
        self.prune(bucket_dir, &p).await;
        Ok(())
    }

    /// Records what upload `id` made (and forgets completions older than a day); a failure only
    /// costs a retried Complete its answer, so it is logged, not returned.
    async fn remember_completed(&self, id: &str, done: &multipart::Completed) {
        if let Err(e) = docs::write_json(&*self.filer, &multipart::completed_doc(id), done, None).await {
            tracing::warn!(upload = %id, error = %e, "completed, but not remembered for a retried Complete");
        }
        let Ok(page) = self.filer.list(multipart::COMPLETED, None, 1000).await else { return };
        let old = now_ms() - multipart::COMPLETED_KEPT_MS;
        for e in page.entries.iter().filter(|e| e.mtime_ms < old) {
            let opts = DeleteOptions {
                recursive: false,
                precondition: Precondition::Version(e.version),
                ..Default::default()
            };
            let _ = self.filer.delete(&e.path, opts).await;
        }
    }

    /// The answer of a CompleteMultipartUpload of `id` sent again, if it completed lately and its
    /// object is still the one it made (as S3 answers 200 then).
    async fn completed_again(&self, bucket: &str, key: &str, id: &str) -> Option<CompleteMultipartUploadOutput> {
        if !multipart::valid_upload_id(id) {
            return None;
        }
        let (done, _) =
            docs::read_json::<multipart::Completed>(&*self.filer, &multipart::completed_doc(id)).await.ok()??;
        if done.bucket != bucket || done.key != key {
            return None;
        }
        let (_, e) = self.object_entry(bucket, key).await.ok()?;
        (etag_of(&e) == done.etag).then(|| completed_output(&done))
    }

    async fn upload(&self, bucket: &str, key: &str, id: &str) -> S3Result<Upload> {
        if !multipart::valid_upload_id(id) {
            return Err(no_such_upload(id));
        }
        match docs::read_json::<Upload>(&*self.filer, &multipart::upload_doc(id)).await.map_err(s3_err)? {
            Some((u, _)) if u.bucket == bucket && u.key == key => Ok(u),
            _ => Err(no_such_upload(id)),
        }
    }

    async fn staged_parts(&self, id: &str) -> S3Result<Vec<(i32, Entry)>> {
        let dir = multipart::upload_dir(id);
        let mut parts = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = self.filer.list(&dir, after.as_deref(), 1000).await.map_err(s3_err)?;
            for e in &page.entries {
                if let Some(n) = multipart::part_number(e.name()) {
                    parts.push((n, e.clone()));
                }
            }
            match page.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        parts.sort_by_key(|(n, _)| *n);
        Ok(parts)
    }

    async fn read_source(
        &self,
        cs: &CopySource,
        range: Option<&str>,
        if_match: Option<&ETagCondition>,
        if_none_match: Option<&ETagCondition>,
        customer: Option<&crate::sse::CustomerKey>,
    ) -> S3Result<(Entry, tidemark_core::ByteStream, Option<String>)> {
        let (sb, sk, version) = copy_source(cs)?;
        // The source is found, then opened: a write of it in between (or the keeping of its
        // version, which a versioned bucket's next write makes) has it found again.
        for _ in 0..versions::MAKE_WAY_TRIES {
            let found = self.locate(&sb, &sk, version.as_deref()).await?;
            let (sp, se) = (found.path, found.entry);
            if se.is_dir() {
                return Err(no_such_key(&sk));
            }
            check_conditions(&se, if_match, if_none_match, None, None).map_err(|mut e| {
                if *e.code() == S3ErrorCode::NotModified {
                    e = s3_error!(PreconditionFailed, "x-amz-copy-source-if-none-match matched");
                }
                e
            })?;
            let dec = self.decrypting(&se, customer)?;
            let r = match range {
                Some(spec) => Some(copy_range(spec, se.size)?),
                None => None,
            };
            let offset = r.as_ref().map_or(0, |r| r.offset);
            let (entry, stream) = match self.filer.read(&sp, r).await {
                Ok(read) => read,
                Err(Error::NotFound { .. }) => continue,
                Err(e) => return Err(s3_err(e)),
            };
            if entry.version != se.version {
                continue;
            }
            let stream = match &dec {
                Some(d) => d.decrypt(stream, offset),
                None => stream,
            };
            return Ok((entry, stream, found.version_id));
        }
        Err(s3_error!(ServiceUnavailable, "the copy source changed while it was read; retry"))
    }
}

#[async_trait::async_trait]
impl S3 for Gateway {
    async fn list_buckets(&self, req: S3Request<ListBucketsInput>) -> S3Result<S3Response<ListBucketsOutput>> {
        let ids = self.shared.identities().await;
        let ak = req.credentials.as_ref().map(|c| c.access_key.as_str());
        let caller = ids.caller(ak, self.shared.dev_key_allowed());
        let i = &req.input;
        let max = match i.max_buckets {
            None => usize::MAX,
            Some(n) if (1..=10_000).contains(&n) => n as usize,
            Some(n) => return Err(s3_error!(InvalidArgument, "max-buckets {n}: give 1 to 10000")),
        };
        let prefix = i.prefix.clone().unwrap_or_default();
        let mut buckets = Vec::new();
        let mut more = false;
        // The continuation token is the last bucket name of the previous page.
        let mut after: Option<String> = i.continuation_token.as_deref().map(|t| path::join(BUCKETS_DIR, t));
        'pages: loop {
            let page = match self.filer.list(BUCKETS_DIR, after.as_deref(), 1000).await {
                Ok(p) => p,
                Err(Error::NotFound { .. }) => break,
                Err(e) => return Err(s3_err(e)),
            };
            for e in page
                .entries
                .iter()
                .filter(|e| e.is_dir() && e.name() != VERSIONS_NAME && e.name().starts_with(prefix.as_str()))
            {
                if caller
                    .as_ref()
                    .is_some_and(|c| c.sees_bucket(e.name(), e.extended.get(ATTR_OWNER).map(String::as_str)))
                {
                    if buckets.len() == max {
                        more = true;
                        break 'pages;
                    }
                    buckets.push(Bucket {
                        name: Some(e.name().to_string()),
                        creation_date: Some(timestamp(e.mtime_ms)),
                        ..Default::default()
                    });
                }
            }
            match page.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        let next = more.then(|| buckets.last().and_then(|b| b.name.clone())).flatten();
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            owner: Some(owner()),
            continuation_token: next,
            prefix: i.prefix.clone(),
        }))
    }

    async fn head_bucket(&self, req: S3Request<HeadBucketInput>) -> S3Result<S3Response<HeadBucketOutput>> {
        self.bucket_entry(&req.input.bucket).await?;
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.bucket_entry(&req.input.bucket).await?;
        Ok(S3Response::new(GetBucketLocationOutput::default()))
    }

    async fn get_object_attributes(
        &self,
        req: S3Request<GetObjectAttributesInput>,
    ) -> S3Result<S3Response<GetObjectAttributesOutput>> {
        let secure = encryption::secure(&req.extensions);
        let i = req.input;
        let customer = encryption::customer(
            secure,
            i.sse_customer_algorithm.as_deref(),
            i.sse_customer_key.as_deref(),
            i.sse_customer_key_md5.as_deref(),
        )?;
        let found = self.locate(&i.bucket, &i.key, i.version_id.as_deref()).await?;
        let e = found.entry;
        self.decrypting(&e, customer.as_ref())?;
        // One header, comma-separated: s3s may hand it over whole.
        let asked = |a: &str| i.object_attributes.iter().flat_map(|x| x.as_str().split(',')).any(|x| x.trim() == a);
        let mut out = GetObjectAttributesOutput {
            last_modified: Some(timestamp(e.mtime_ms)),
            version_id: found.version_id,
            ..Default::default()
        };
        if asked(ObjectAttributes::ETAG) {
            out.e_tag = Some(ETag::Strong(etag_of(&e)));
        }
        if asked(ObjectAttributes::OBJECT_SIZE) {
            out.object_size = Some(e.size as i64);
        }
        if asked(ObjectAttributes::CHECKSUM)
            && let Some(sum) = stored_sum(&e)
        {
            let mut c = Checksum::default();
            with_checksum!(c, Some(&sum), typed);
            out.checksum = Some(c);
        }
        if asked(ObjectAttributes::STORAGE_CLASS) {
            out.storage_class =
                Some(StorageClass::from(attr(&e, ATTR_STORAGE_CLASS).unwrap_or_else(|| "STANDARD".into())));
        }
        // Parts only of an object completed from parts, paged as ListParts is.
        if asked(ObjectAttributes::OBJECT_PARTS) && multipart::is_multipart(&e.extended) {
            let sizes = multipart::part_sizes(&e.extended, e.size);
            let marker = i.part_number_marker.unwrap_or(0).max(0);
            let max = i.max_parts.unwrap_or(1000).clamp(0, 1000);
            let rest: Vec<(i32, u64)> =
                sizes.iter().enumerate().map(|(n, s)| (n as i32 + 1, *s)).filter(|(n, _)| *n > marker).collect();
            let page: Vec<ObjectPart> = rest
                .iter()
                .take(max as usize)
                .map(|(n, s)| {
                    let mut part = ObjectPart { part_number: Some(*n), size: Some(*s as i64), ..Default::default() };
                    with_checksum!(part, part_sum(&e, *n).as_ref());
                    part
                })
                .collect();
            let truncated = rest.len() > page.len();
            out.object_parts = Some(GetObjectAttributesParts {
                is_truncated: Some(truncated),
                max_parts: Some(max),
                next_part_number_marker: page.last().and_then(|p| p.part_number).filter(|_| truncated),
                part_number_marker: Some(marker),
                parts: Some(page),
                total_parts_count: Some(sizes.len() as i32),
            });
        }
        Ok(S3Response::new(out))
    }

    async fn put_object_tagging(
        &self,
        req: S3Request<PutObjectTaggingInput>,
    ) -> S3Result<S3Response<PutObjectTaggingOutput>> {
        let i = req.input;
        let tags = tagging::from_tag_set(&i.tagging.tag_set, tagging::MAX_OBJECT_TAGS)?;
        self.set_tags(&i.bucket, Some(&i.key), &tags).await?;
        Ok(S3Response::new(PutObjectTaggingOutput::default()))
    }

    async fn get_object_tagging(
        &self,
        req: S3Request<GetObjectTaggingInput>,
    ) -> S3Result<S3Response<GetObjectTaggingOutput>> {
        let (_, e) = self.object_entry(&req.input.bucket, &req.input.key).await?;
        let tag_set = tagging::to_tag_set(tagging::kept(&e.extended, tagging::ATTR_TAGGING));
        Ok(S3Response::new(GetObjectTaggingOutput { tag_set, ..Default::default() }))
    }

    async fn delete_object_tagging(
        &self,
        req: S3Request<DeleteObjectTaggingInput>,
    ) -> S3Result<S3Response<DeleteObjectTaggingOutput>> {
        self.set_tags(&req.input.bucket, Some(&req.input.key), &[]).await?;
        Ok(S3Response::new(DeleteObjectTaggingOutput::default()))
    }

    async fn put_bucket_acl(&self, req: S3Request<PutBucketAclInput>) -> S3Result<S3Response<PutBucketAclOutput>> {
        let i = req.input;
        let acl = self.known(asked_acl!(i, grant_write, access_control_policy)).await?;
        let bucket = self.bucket_entry(&i.bucket).await?.1;
        refuse_public_acl(&bucket, acl.as_ref())?;
        // ACLs are off under BucketOwnerEnforced: none may be set.
        if bucket.extended.get(ATTR_OWNERSHIP).is_some_and(|o| o == ENFORCED) {
            return Err(acls_off());
        }
        self.set_bucket_attr(&i.bucket, ATTR_ACL, acl.and_then(|a| a.to_attr())).await?;
        Ok(S3Response::new(PutBucketAclOutput::default()))
    }

    async fn put_bucket_ownership_controls(
        &self,
        req: S3Request<PutBucketOwnershipControlsInput>,
    ) -> S3Result<S3Response<PutBucketOwnershipControlsOutput>> {
        let i = req.input;
        let [rule] = i.ownership_controls.rules.as_slice() else {
            return Err(s3_error!(MalformedXML, "OwnershipControls has exactly one rule"));
        };
        let (_, bucket) = self.bucket_entry(&i.bucket).await?;
        check_ownership(rule.object_ownership.as_str(), Some(&Acl::of(&bucket.extended)))?;
        self.set_bucket_attr(&i.bucket, ATTR_OWNERSHIP, Some(rule.object_ownership.as_str().to_string())).await?;
        Ok(S3Response::new(PutBucketOwnershipControlsOutput::default()))
    }

    async fn get_bucket_ownership_controls(
        &self,
        req: S3Request<GetBucketOwnershipControlsInput>,
    ) -> S3Result<S3Response<GetBucketOwnershipControlsOutput>> {
        let (_, e) = self.bucket_entry(&req.input.bucket).await?;
        let o = e.extended.get(ATTR_OWNERSHIP).ok_or_else(|| {
            custom_error(
                "OwnershipControlsNotFoundError",
                hyper::StatusCode::NOT_FOUND,
                "The bucket ownership controls were not found",
            )
        })?;
        let rule = OwnershipControlsRule { object_ownership: ObjectOwnership::from(o.clone()) };
        Ok(S3Response::new(GetBucketOwnershipControlsOutput {
            ownership_controls: Some(OwnershipControls { rules: vec![rule] }),
        }))
    }

    async fn delete_bucket_ownership_controls(
        &self,
        req: S3Request<DeleteBucketOwnershipControlsInput>,
    ) -> S3Result<S3Response<DeleteBucketOwnershipControlsOutput>> {
        self.set_bucket_attr(&req.input.bucket, ATTR_OWNERSHIP, None).await?;
        Ok(S3Response::new(DeleteBucketOwnershipControlsOutput::default()))
    }

    async fn get_bucket_acl(&self, req: S3Request<GetBucketAclInput>) -> S3Result<S3Response<GetBucketAclOutput>> {
        let (_, e) = self.bucket_entry(&req.input.bucket).await?;
        let owner = owner_of(&e);
        let grants = Acl::of(&e.extended).grants(&owner, owner.id.as_deref().unwrap_or_default());
        Ok(S3Response::new(GetBucketAclOutput { grants: Some(grants), owner: Some(owner) }))
    }

    async fn put_object_acl(&self, req: S3Request<PutObjectAclInput>) -> S3Result<S3Response<PutObjectAclOutput>> {
        let i = req.input;
        let acl = self.known(asked_acl!(i, grant_write, access_control_policy)).await?;
        let found = self.locate(&i.bucket, &i.key, i.version_id.as_deref()).await?;
        let (p, e) = (found.path, found.entry);
        let bucket = self.bucket_entry(&i.bucket).await?.1;
        refuse_public_acl(&bucket, acl.as_ref())?;
        writer_owns(&bucket, acl.as_ref())?;
        self.update_extended(&p, &e, Origin::Local, "its ACL was set", |ext| set_acl(ext, acl.as_ref())).await?;
        Ok(S3Response::new(PutObjectAclOutput::default()))
    }

    async fn get_object_acl(&self, req: S3Request<GetObjectAclInput>) -> S3Result<S3Response<GetObjectAclOutput>> {
        let i = req.input;
        let e = self.locate(&i.bucket, &i.key, i.version_id.as_deref()).await?.entry;
        let (_, bucket) = self.bucket_entry(&i.bucket).await?;
        let owner = object_owner(&bucket, &e);
        let grants = Acl::of(&e.extended).grants(&owner, owner_of(&bucket).id.as_deref().unwrap_or_default());
        Ok(S3Response::new(GetObjectAclOutput { grants: Some(grants), owner: Some(owner), ..Default::default() }))
    }

    async fn put_bucket_policy(
        &self,
        req: S3Request<PutBucketPolicyInput>,
    ) -> S3Result<S3Response<PutBucketPolicyOutput>> {
        let i = req.input;
        let parsed = policy::parse(&i.policy, &i.bucket)?;
        let (_, bucket) = self.bucket_entry(&i.bucket).await?;
        if parsed.is_public() && public_access_block_of(&bucket).is_some_and(|c| c.block_public_policy == Some(true)) {
            return Err(s3_error!(
                AccessDenied,
                "the bucket blocks public policies (its public access block): this one allows anyone; nothing was stored"
            ));
        }
        self.set_bucket_attr(&i.bucket, ATTR_POLICY, Some(i.policy.clone())).await?;
        Ok(S3Response::new(PutBucketPolicyOutput::default()))
    }

    async fn get_bucket_policy(
        &self,
        req: S3Request<GetBucketPolicyInput>,
    ) -> S3Result<S3Response<GetBucketPolicyOutput>> {
        let (_, e) = self.bucket_entry(&req.input.bucket).await?;
        let text = e
            .extended
            .get(ATTR_POLICY)
            .cloned()
            .ok_or_else(|| s3_error!(NoSuchBucketPolicy, "The bucket policy does not exist"))?;
        Ok(S3Response::new(GetBucketPolicyOutput { policy: Some(text) }))
    }

    async fn delete_bucket_policy(
        &self,
        req: S3Request<DeleteBucketPolicyInput>,
    ) -> S3Result<S3Response<DeleteBucketPolicyOutput>> {
        self.set_bucket_attr(&req.input.bucket, ATTR_POLICY, None).await?;
        Ok(S3Response::new(DeleteBucketPolicyOutput::default()))
    }

    async fn get_bucket_policy_status(
        &self,
        req: S3Request<GetBucketPolicyStatusInput>,
    ) -> S3Result<S3Response<GetBucketPolicyStatusOutput>> {
        let (_, e) = self.bucket_entry(&req.input.bucket).await?;
        // Public through its policy or through its ACL (everyone, or every identity, may read):
        // the question is whether the bucket is public. Without a policy the answer is still
        // given (AWS answers NoSuchBucketPolicy; ceph/s3-tests, as RGW, expects an answer).
        let by_policy = e
            .extended
            .get(ATTR_POLICY)
            .is_some_and(|text| policy::parse(text, &req.input.bucket).is_ok_and(|p| p.is_public()));
        let public = by_policy || Acl::of(&e.extended).is_public();
        Ok(S3Response::new(GetBucketPolicyStatusOutput {
            policy_status: Some(PolicyStatus { is_public: Some(public) }),
        }))
    }

    async fn put_public_access_block(
        &self,
        req: S3Request<PutPublicAccessBlockInput>,
    ) -> S3Result<S3Response<PutPublicAccessBlockOutput>> {
        let i = req.input;
        self.set_bucket_config(&i.bucket, ATTR_PUBLIC_ACCESS_BLOCK, Some(&i.public_access_block_configuration)).await?;
        Ok(S3Response::new(PutPublicAccessBlockOutput::default()))
    }

    async fn get_public_access_block(
        &self,
        req: S3Request<GetPublicAccessBlockInput>,
    ) -> S3Result<S3Response<GetPublicAccessBlockOutput>> {
        let (_, e) = self.bucket_entry(&req.input.bucket).await?;
        let c = public_access_block_of(&e).ok_or_else(|| {
            custom_error(
                "NoSuchPublicAccessBlockConfiguration",
                hyper::StatusCode::NOT_FOUND,
                "The public access block configuration was not found",
            )
        })?;
        Ok(S3Response::new(GetPublicAccessBlockOutput { public_access_block_configuration: Some(c) }))
    }

    async fn delete_public_access_block(
        &self,
        req: S3Request<DeletePublicAccessBlockInput>,
    ) -> S3Result<S3Response<DeletePublicAccessBlockOutput>> {
        self.set_bucket_config::<()>(&req.input.bucket, ATTR_PUBLIC_ACCESS_BLOCK, None).await?;
        Ok(S3Response::new(DeletePublicAccessBlockOutput::default()))
    }

    async fn put_bucket_encryption(
        &self,
        req: S3Request<PutBucketEncryptionInput>,
    ) -> S3Result<S3Response<PutBucketEncryptionOutput>> {
        let i = req.input;
        let (dir, _) = self.bucket_entry(&i.bucket).await?;
        let c = i.server_side_encryption_configuration;
        encryption::check_default(&c, self.keyring.as_deref())?;
        self.refuse_encryption_in_remote_mount(&dir).await?;
        self.set_bucket_config(&i.bucket, encryption::ATTR_ENCRYPTION, Some(&c)).await?;
        Ok(S3Response::new(PutBucketEncryptionOutput::default()))
    }

    async fn get_bucket_encryption(
        &self,
        req: S3Request<GetBucketEncryptionInput>,
    ) -> S3Result<S3Response<GetBucketEncryptionOutput>> {
        let (_, bucket) = self.bucket_entry(&req.input.bucket).await?;
        match config_of::<ServerSideEncryptionConfiguration>(&bucket, encryption::ATTR_ENCRYPTION) {
            Some(c) => Ok(S3Response::new(GetBucketEncryptionOutput { server_side_encryption_configuration: Some(c) })),
            None => Err(custom_error(
                "ServerSideEncryptionConfigurationNotFoundError",
                hyper::StatusCode::NOT_FOUND,
                "The server side encryption configuration was not found",
            )),
        }
    }

    async fn delete_bucket_encryption(
        &self,
        req: S3Request<DeleteBucketEncryptionInput>,
    ) -> S3Result<S3Response<DeleteBucketEncryptionOutput>> {
        let b = &req.input.bucket;
        self.set_bucket_config::<ServerSideEncryptionConfiguration>(b, encryption::ATTR_ENCRYPTION, None).await?;
        Ok(S3Response::new(DeleteBucketEncryptionOutput::default()))
    }

    async fn put_bucket_cors(&self, req: S3Request<PutBucketCorsInput>) -> S3Result<S3Response<PutBucketCorsOutput>> {
        let i = req.input;
        cors::validate(&i.cors_configuration)?;
        self.set_bucket_config(&i.bucket, ATTR_CORS, Some(&i.cors_configuration)).await?;
        Ok(S3Response::new(PutBucketCorsOutput::default()))
    }

    async fn get_bucket_cors(&self, req: S3Request<GetBucketCorsInput>) -> S3Result<S3Response<GetBucketCorsOutput>> {
        let (_, e) = self.bucket_entry(&req.input.bucket).await?;
        let c =
            cors_of(&e).ok_or_else(|| s3_error!(NoSuchCORSConfiguration, "The CORS configuration does not exist"))?;
        Ok(S3Response::new(GetBucketCorsOutput { cors_rules: Some(c.cors_rules) }))
    }

    async fn delete_bucket_cors(
        &self,
        req: S3Request<DeleteBucketCorsInput>,
    ) -> S3Result<S3Response<DeleteBucketCorsOutput>> {
        self.set_bucket_config::<()>(&req.input.bucket, ATTR_CORS, None).await?;
        Ok(S3Response::new(DeleteBucketCorsOutput::default()))
    }

    async fn put_bucket_lifecycle_configuration(
        &self,
        req: S3Request<PutBucketLifecycleConfigurationInput>,
    ) -> S3Result<S3Response<PutBucketLifecycleConfigurationOutput>> {
        let i = req.input;
        let (dir, _) = self.bucket_entry(&i.bucket).await?;
        let mut c = i.lifecycle_configuration.ok_or_else(|| s3_error!(MalformedXML, "no LifecycleConfiguration"))?;
        lifecycle::validate(&mut c)?;
        if let Some(m) = self.remote_mount_at(&dir).await? {
            return Err(s3_error!(
                InvalidRequest,
                "bucket {:?} is mounted from {}: its lifecycle is that bucket's own rules; set them there",
                i.bucket,
                m.location
            ));
        }
        self.set_bucket_config(&i.bucket, ATTR_LIFECYCLE, Some(&c)).await?;
        Ok(S3Response::new(PutBucketLifecycleConfigurationOutput::default()))
    }

    async fn get_bucket_lifecycle_configuration(
        &self,
        req: S3Request<GetBucketLifecycleConfigurationInput>,
    ) -> S3Result<S3Response<GetBucketLifecycleConfigurationOutput>> {
        let (_, e) = self.bucket_entry(&req.input.bucket).await?;
        let c = lifecycle_of(&e)
            .ok_or_else(|| s3_error!(NoSuchLifecycleConfiguration, "The lifecycle configuration does not exist"))?;
        Ok(S3Response::new(GetBucketLifecycleConfigurationOutput { rules: Some(c.rules), ..Default::default() }))
    }

    async fn delete_bucket_lifecycle(
        &self,
        req: S3Request<DeleteBucketLifecycleInput>,
    ) -> S3Result<S3Response<DeleteBucketLifecycleOutput>> {
        self.set_bucket_config::<()>(&req.input.bucket, ATTR_LIFECYCLE, None).await?;
        Ok(S3Response::new(DeleteBucketLifecycleOutput::default()))
    }

    async fn put_bucket_tagging(
        &self,
        req: S3Request<PutBucketTaggingInput>,
    ) -> S3Result<S3Response<PutBucketTaggingOutput>> {
        let i = req.input;
        let tags = tagging::from_tag_set(&i.tagging.tag_set, tagging::MAX_BUCKET_TAGS)?;
        self.set_tags(&i.bucket, None, &tags).await?;
        Ok(S3Response::new(PutBucketTaggingOutput::default()))
    }

    async fn get_bucket_tagging(
        &self,
        req: S3Request<GetBucketTaggingInput>,
    ) -> S3Result<S3Response<GetBucketTaggingOutput>> {
        let (_, e) = self.bucket_entry(&req.input.bucket).await?;
        let tags = tagging::kept(&e.extended, tagging::ATTR_BUCKET_TAGGING);
        if tags.is_empty() {
            return Err(s3_error!(NoSuchTagSet, "the bucket has no tags"));
        }
        Ok(S3Response::new(GetBucketTaggingOutput { tag_set: tagging::to_tag_set(tags) }))
    }

    async fn delete_bucket_tagging(
        &self,
        req: S3Request<DeleteBucketTaggingInput>,
    ) -> S3Result<S3Response<DeleteBucketTaggingOutput>> {
        self.set_tags(&req.input.bucket, None, &[]).await?;
        Ok(S3Response::new(DeleteBucketTaggingOutput::default()))
    }

    async fn put_bucket_versioning(
        &self,
        req: S3Request<PutBucketVersioningInput>,
    ) -> S3Result<S3Response<PutBucketVersioningOutput>> {
        let i = req.input;
        let c = i.versioning_configuration;
        if c.mfa_delete.as_ref().is_some_and(|m| m.as_str() == MFADelete::ENABLED) {
            return Err(s3_error!(NotImplemented, "MFA delete: this gateway has no MFA devices"));
        }
        let status = match c.status.as_ref().map(|s| s.as_str()) {
            Some(s @ (BucketVersioningStatus::ENABLED | BucketVersioningStatus::SUSPENDED)) => s.to_string(),
            Some(other) => return Err(s3_error!(MalformedXML, "versioning status {other:?}: Enabled or Suspended")),
            None => return Err(s3_error!(MalformedXML, "the versioning configuration names no Status")),
        };
        let (dir, _) = self.bucket_entry(&i.bucket).await?;
        if let Some(m) = self.remote_mount_at(&dir).await? {
            return Err(s3_error!(
                NotImplemented,
                "bucket {:?} is (in) the remote mount {} of {}: its objects are the remote bucket's, whose own \
                 versioning keeps their versions",
                i.bucket,
                m.dir,
                m.location
            ));
        }
        self.set_bucket_attr(&i.bucket, versioning::ATTR_VERSIONING, Some(status)).await?;
        Ok(S3Response::new(PutBucketVersioningOutput::default()))
    }

    async fn get_bucket_versioning(
        &self,
        req: S3Request<GetBucketVersioningInput>,
    ) -> S3Result<S3Response<GetBucketVersioningOutput>> {
        let (_, bucket) = self.bucket_entry(&req.input.bucket).await?;
        let status = match versioning::mode_of(&bucket) {
            Mode::Off => None,
            Mode::Enabled => Some(BucketVersioningStatus::from_static(BucketVersioningStatus::ENABLED)),
            Mode::Suspended => Some(BucketVersioningStatus::from_static(BucketVersioningStatus::SUSPENDED)),
        };
        Ok(S3Response::new(GetBucketVersioningOutput { status, ..Default::default() }))
    }

    async fn create_bucket(&self, req: S3Request<CreateBucketInput>) -> S3Result<S3Response<CreateBucketOutput>> {
        let b = &req.input.bucket;
        names::valid_new_bucket(b).map_err(name_err)?;
        let acl = self.known(asked_acl!(req.input, grant_write)).await?;
        let dir = names::bucket_dir(b).map_err(name_err)?;
        let creator = self.identity_name(&req.credentials).await;
        let mut entry = NewEntry::dir(now_ms());
        set_acl(&mut entry.extended, acl.as_ref());
        if let Some(o) = &req.input.object_ownership {
            check_ownership(o.as_str(), acl.as_ref())?;
            entry.extended.insert(ATTR_OWNERSHIP.to_string(), o.as_str().to_string());
        }
        if let Some(name) = &creator {
            entry.extended.insert(ATTR_OWNER.to_string(), name.clone());
        }
        let txn = Txn {
            path: dir.clone(),
            precondition: Precondition::Absent,
            fence: None,
            mutation: tidemark_core::model::Mutation::Put { entry, data: None },
            origin: Origin::Local,
            dir_times: false,
        };
        match self.filer.apply(txn).await {
            Ok(_) => Ok(S3Response::new(CreateBucketOutput { location: Some(format!("/{b}")) })),
            Err(Error::PreconditionFailed { .. }) => {
                let theirs =
                    self.filer.stat(&dir).await.ok().flatten().and_then(|e| e.extended.get(ATTR_OWNER).cloned());
                match theirs {
                    Some(o) if creator.as_ref() != Some(&o) => Err(s3_error!(
                        BucketAlreadyExists,
                        "bucket {b:?} exists and belongs to another identity; choose another name"
                    )),
                    _ => Err(s3_error!(BucketAlreadyOwnedByYou, "bucket {b:?} exists ({dir})")),
                }
            }
            Err(e) => Err(s3_err(e)),
        }
    }

    async fn delete_bucket(&self, req: S3Request<DeleteBucketInput>) -> S3Result<S3Response<DeleteBucketOutput>> {
        let b = &req.input.bucket;
        let (dir, e) = self.bucket_entry(b).await?;
        let mounts: MountMapping =
            docs::read_json(&*self.filer, MOUNT_MAPPING).await.map_err(s3_err)?.map(|(m, _)| m).unwrap_or_default();
        if let Some(m) = mounts.mounts.iter().find(|m| path::is_within(&m.dir, &dir)) {
            return Err(s3_error!(
                BucketNotEmpty,
                "bucket {b:?} holds the remote mount {} of {}: unmount it first (remote.unmount -dir={})",
                m.dir,
                m.location,
                m.dir
            ));
        }
        let page = self.filer.list(&dir, None, 1).await.map_err(s3_err)?;
        if !page.entries.is_empty() {
            return Err(s3_error!(BucketNotEmpty, "bucket {b:?} is not empty"));
        }
        if self.has_kept_versions(b).await? {
            return Err(s3_error!(
                BucketNotEmpty,
                "bucket {b:?} keeps older versions or delete markers: delete them by version id first"
            ));
        }
        let opts =
            DeleteOptions { recursive: false, precondition: Precondition::Version(e.version), ..Default::default() };
        match self.filer.delete(&dir, opts).await {
            Ok(_) => {
                self.forget_versions(b).await;
                Ok(S3Response::new(DeleteBucketOutput::default()))
            }
            Err(Error::DirectoryNotEmpty { .. } | Error::PreconditionFailed { .. }) => {
                Err(s3_error!(BucketNotEmpty, "bucket {b:?} is not empty"))
            }
            Err(e) => Err(s3_err(e)),
        }
    }

    async fn list_objects_v2(&self, req: S3Request<ListObjectsV2Input>) -> S3Result<S3Response<ListObjectsV2Output>> {
        let i = req.input;
        let (dir, bucket) = self.bucket_entry(&i.bucket).await?;
        let url = wants_url(&i.encoding_type)?;
        let max = max_keys(i.max_keys)?;
        let token = i.continuation_token.as_deref().map(token_decode).transpose()?;
        let after = match (&token, &i.start_after) {
            (Some(t), Some(s)) => Some(t.clone().max(s.clone())),
            (Some(t), None) => Some(t.clone()),
            (None, s) => s.clone(),
        };
        let prefix = i.prefix.clone().unwrap_or_default();
        // An empty delimiter is no delimiter (and is not echoed), as S3 does.
        let delimiter = i.delimiter.filter(|d| !d.is_empty());
        let q = list::Query { prefix: &prefix, delimiter: delimiter.as_deref(), after: after.as_deref(), max };
        let listing = list::list(&*self.filer, &dir, &q).await.map_err(s3_err)?;
        let next = listing.truncated.then(|| listing.items.last().map(|it| token_encode(it.key()))).flatten();
        let owner = owner_of(&bucket);
        let (contents, prefixes) = listed(&listing.items, url, i.fetch_owner.unwrap_or(false).then_some(&owner));
        let out = ListObjectsV2Output {
            name: Some(i.bucket),
            prefix: Some(encode_key(&prefix, url)),
            delimiter: delimiter.map(|d| encode_key(&d, url)),
            max_keys: Some(max as i32),
            key_count: Some(listing.items.len() as i32),
            continuation_token: i.continuation_token,
            next_continuation_token: next,
            is_truncated: Some(listing.truncated),
            start_after: i.start_after.map(|s| encode_key(&s, url)),
            encoding_type: i.encoding_type,
            contents: Some(contents),
            common_prefixes: (!prefixes.is_empty()).then_some(prefixes),
            ..Default::default()
        };
        Ok(S3Response::new(out))
    }

    /// The namespace keeps one version per key, so a bucket lists as S3 lists an unversioned one:
    /// each object once, version `null`, latest; no delete markers. (Tools that clean buckets —
    /// and the public S3 test suite — list versions to delete them.)
    async fn list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        let i = req.input;
        let (_, bucket) = self.bucket_entry(&i.bucket).await?;
        let url = wants_url(&i.encoding_type)?;
        let max = max_keys(i.max_keys)?;
        let prefix = i.prefix.clone().unwrap_or_default();
        let delimiter = i.delimiter.filter(|d| !d.is_empty());
        let q = VersionsQuery {
            bucket: &i.bucket,
            prefix: &prefix,
            delimiter: delimiter.as_deref(),
            key_marker: i.key_marker.as_deref().filter(|k| !k.is_empty()),
            version_id_marker: i.version_id_marker.as_deref().filter(|v| !v.is_empty()),
            max,
        };
        let page = self.versions_page(q).await?;
        let (mut versions, mut markers) = (Vec::new(), Vec::new());
        for v in page.versions {
            let owner = Some(object_owner(&bucket, &v.entry));
            if v.marker {
                markers.push(DeleteMarkerEntry {
                    key: Some(encode_key(&v.key, url)),
                    version_id: Some(v.id),
                    is_latest: Some(v.latest),
                    last_modified: Some(timestamp(v.entry.mtime_ms)),
                    owner,
                });
                continue;
            }
            let class = attr(&v.entry, ATTR_STORAGE_CLASS).unwrap_or_else(|| ObjectStorageClass::STANDARD.to_string());
            versions.push(ObjectVersion {
                key: Some(encode_key(&v.key, url)),
                version_id: Some(v.id),
                is_latest: Some(v.latest),
                e_tag: Some(ETag::Strong(etag_of(&v.entry))),
                size: Some(v.entry.size as i64),
                last_modified: Some(timestamp(v.entry.mtime_ms)),
                owner,
                storage_class: Some(ObjectVersionStorageClass::from(class)),
                ..Default::default()
            });
        }
        let prefixes: Vec<CommonPrefix> =
            page.prefixes.iter().map(|p| CommonPrefix { prefix: Some(encode_key(p, url)) }).collect();
        let (next_key, next_version) = match page.next {
            Some((k, v)) => (Some(encode_key(&k, url)), v),
            None => (None, None),
        };
        Ok(S3Response::new(ListObjectVersionsOutput {
            name: Some(i.bucket),
            prefix: Some(encode_key(&prefix, url)),
            delimiter: delimiter.map(|d| encode_key(&d, url)),
            key_marker: Some(i.key_marker.map(|m| encode_key(&m, url)).unwrap_or_default()),
            version_id_marker: i.version_id_marker,
            max_keys: Some(max as i32),
            is_truncated: Some(page.truncated),
            next_version_id_marker: next_version,
            next_key_marker: next_key,
            encoding_type: i.encoding_type,
            versions: (!versions.is_empty()).then_some(versions),
            delete_markers: (!markers.is_empty()).then_some(markers),
            common_prefixes: (!prefixes.is_empty()).then_some(prefixes),
            ..Default::default()
        }))
    }

    async fn list_objects(&self, req: S3Request<ListObjectsInput>) -> S3Result<S3Response<ListObjectsOutput>> {
        let i = req.input;
        let (dir, bucket) = self.bucket_entry(&i.bucket).await?;
        let url = wants_url(&i.encoding_type)?;
        let max = max_keys(i.max_keys)?;
        let prefix = i.prefix.clone().unwrap_or_default();
        let delimiter = i.delimiter.filter(|d| !d.is_empty());
        let q = list::Query { prefix: &prefix, delimiter: delimiter.as_deref(), after: i.marker.as_deref(), max };
        let listing = list::list(&*self.filer, &dir, &q).await.map_err(s3_err)?;
        let next_marker = (listing.truncated && delimiter.is_some())
            .then(|| listing.items.last().map(|it| encode_key(it.key(), url)))
            .flatten();
        let owner = owner_of(&bucket);
        let (contents, prefixes) = listed(&listing.items, url, Some(&owner));
        let out = ListObjectsOutput {
            name: Some(i.bucket),
            prefix: Some(encode_key(&prefix, url)),
            delimiter: delimiter.map(|d| encode_key(&d, url)),
            marker: Some(i.marker.map(|m| encode_key(&m, url)).unwrap_or_default()),
            max_keys: Some(max as i32),
            is_truncated: Some(listing.truncated),
            next_marker,
            encoding_type: i.encoding_type,
            contents: Some(contents),
            common_prefixes: (!prefixes.is_empty()).then_some(prefixes),
            ..Default::default()
        };
        Ok(S3Response::new(out))
    }

    async fn head_object(&self, req: S3Request<HeadObjectInput>) -> S3Result<S3Response<HeadObjectOutput>> {
        let secure = encryption::secure(&req.extensions);
        encryption::refuse_on_read(&req.headers)?;
        let mut i = req.input;
        let customer = encryption::customer(
            secure,
            i.sse_customer_algorithm.as_deref(),
            i.sse_customer_key.as_deref(),
            i.sse_customer_key_md5.as_deref(),
        )?;
        let ranged = i.range.is_some();
        let parts_count = self.part_as_range(&i.bucket, &i.key, i.part_number, &mut i.range).await?;
        let ask = read_ask!(i);
        let found = self.locate(&i.bucket, &i.key, i.version_id.as_deref()).await?;
        let e = found.entry;
        // A HEAD of an object the bucket refuses this cluster is refused as the bucket refuses it.
        if let Some(reason) = tidemark_core::model::object_attrs::unreadable(&e.extended) {
            return Err(s3_err(Error::Unreadable { path: found.path.clone(), reason: reason.to_string() }));
        }
        let dec = self.decrypting(&e, customer.as_ref())?;
        ask.check(&e)?;
        let range = i.range.as_ref().map(|r| satisfiable(r, e.size)).transpose()?;
        let s = ask.shown(&e, range.as_ref());
        let mut out = shown_as!(HeadObjectOutput, s, parts_count: parts_count, version_id: found.version_id);
        with_sse!(out, dec.map(|d| d.shown));
        out.expiration = expiration_of(self.shared.bucket_facts(&i.bucket).await.lifecycle.as_deref(), &i.key, &e);
        with_checksum!(out, read_sum(&e, i.checksum_mode.as_ref(), i.part_number, ranged).as_ref(), typed);
        let mut resp = S3Response::new(out);
        // S3 answers a HEAD with the tag count too; s3s's HeadObjectOutput has no field for it.
        if let Some(n) = tag_count(&e) {
            resp.headers.insert("x-amz-tagging-count", n.into());
        }
        Ok(resp)
    }

    async fn get_object(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        let secure = encryption::secure(&req.extensions);
        encryption::refuse_on_read(&req.headers)?;
        let mut i = req.input;
        let customer = encryption::customer(
            secure,
            i.sse_customer_algorithm.as_deref(),
            i.sse_customer_key.as_deref(),
            i.sse_customer_key_md5.as_deref(),
        )?;
        let ranged = i.range.is_some();
        let parts_count = self.part_as_range(&i.bucket, &i.key, i.part_number, &mut i.range).await?;
        let ask = read_ask!(i);
        let (p, marker) = names::object_path(&i.bucket, &i.key).map_err(name_err)?;
        if marker {
            // A directory marker reads as an empty object.
            let (_, e) = self.object_entry(&i.bucket, &i.key).await?;
            let out = GetObjectOutput {
                content_length: Some(0),
                e_tag: Some(ETag::Strong(EMPTY_MD5.into())),
                last_modified: Some(timestamp(e.mtime_ms)),
                body: Some(StreamingBlob::wrap(futures::stream::empty::<Result<bytes::Bytes, std::io::Error>>())),
                ..Default::default()
            };
            return Ok(S3Response::new(out));
        }
        // A ranged read, or one of a named version, needs the entry first; a whole read of the
        // current version opens at once and checks after.
        let (entry, stream, range) = match (&i.range, i.version_id.as_deref()) {
            (None, None) => {
                let (entry, stream) = match self.filer.read(&p, None).await {
                    Ok(r) => r,
                    Err(Error::NotFound { .. } | Error::IsADirectory { .. } | Error::NotADirectory { .. }) => {
                        // No such bucket, no such key, or a delete marker: each its own error.
                        return Err(match self.locate(&i.bucket, &i.key, None).await {
                            Err(e) => e,
                            Ok(_) => s3_error!(ServiceUnavailable, "the object changed while it was opened; retry"),
                        });
                    }
                    Err(e) => return Err(s3_err(e)),
                };
                if entry.kind.is_special() {
                    // A link or a device node made through the mount: no object.
                    return Err(no_such_key(&i.key));
                }
                (entry, stream, None)
            }
            (r, version) => {
                let found = self.locate(&i.bucket, &i.key, version).await?;
                let e = found.entry;
                let r = r.as_ref().map(|r| satisfiable(r, e.size)).transpose()?;
                let br = r.as_ref().map(|r| ByteRange { offset: r.start, length: Some(r.end - r.start) });
                let (entry, stream) = self.filer.read(&found.path, br).await.map_err(s3_err)?;
                if entry.version != e.version {
                    return Err(s3_error!(ServiceUnavailable, "the object changed while it was opened; retry"));
                }
                (entry, stream, r)
            }
        };
        // The key is checked before the conditions, as S3 does: a 304 tells nothing to one
        // without it.
        let dec = self.decrypting(&entry, customer.as_ref())?;
        ask.check(&entry)?;
        let stream = match &dec {
            Some(d) => d.decrypt(stream, range.as_ref().map_or(0, |r| r.start)),
            None => stream,
        };
        let s = ask.shown(&entry, range.as_ref());
        let tag_count = tag_count(&entry);
        let mut out = shown_as!(
            GetObjectOutput,
            s,
            body: Some(body::to_response(stream)),
            tag_count: tag_count,
            parts_count: parts_count,
            version_id: versioning::Stamp::of(&entry).map(|s| s.id()).or(i.version_id),
        );
        with_checksum!(out, read_sum(&entry, i.checksum_mode.as_ref(), i.part_number, ranged).as_ref(), typed);
        with_sse!(out, dec.map(|d| d.shown));
        Ok(S3Response::new(out))
    }

    async fn put_object(&self, req: S3Request<PutObjectInput>) -> S3Result<S3Response<PutObjectOutput>> {
        let secure = encryption::secure(&req.extensions);
        let mut asked = checksum::asked(&req.headers)?;
        if asked.is_none() {
            // A POST form's fields, which s3s hands over as the input's.
            let fields = checksum::ALL.into_iter().filter_map(|a| sent_checksum!(req.input, a).map(|v| (a, v)));
            asked = checksum::from_fields(fields.collect())?;
        }
        let S3Request { input: i, trailing_headers, .. } = req;
        refuse_unhonoured!(i);
        let (bucket_dir, bucket) = self.bucket_entry(&i.bucket).await?;
        let (p, marker) = names::object_path(&i.bucket, &i.key).map_err(name_err)?;
        let mut enc = self.encrypting(secure, &bucket_dir, &bucket, sse_headers!(i)).await?;
        if marker {
            if i.content_length.unwrap_or(0) != 0 {
                return Err(s3_error!(InvalidRequest, "a key ending in '/' is a directory: it holds no bytes"));
            }
            let txn = Txn {
                path: p,
                precondition: Precondition::Any,
                fence: None,
                mutation: tidemark_core::model::Mutation::Put { entry: NewEntry::dir(now_ms()), data: None },
                origin: Origin::Local,
                dir_times: false,
            };
            self.filer.apply(txn).await.map_err(s3_err)?;
            return Ok(S3Response::new(PutObjectOutput {
                e_tag: Some(ETag::Strong(EMPTY_MD5.into())),
                ..Default::default()
            }));
        }
        let mut extended = attrs_of(attrs!(i))?;
        if let Some(t) = &i.tagging {
            tagging::set(&mut extended, tagging::ATTR_TAGGING, &tagging::from_header(t)?);
        }
        let acl = self.known(asked_acl!(i)).await?;
        refuse_public_acl(&bucket, acl.as_ref())?;
        set_acl(&mut extended, acl.as_ref());
        self.set_object_owner(&mut extended, &bucket, acl.as_ref(), &req.credentials).await?;
        let conditions = self.precondition_for_put(&p, i.if_match.as_ref(), i.if_none_match.as_ref()).await?;
        let stamp = self.new_stamp(&i.bucket, &i.key, versioning::mode_of(&bucket))?;
        let md5 = i.content_md5.as_deref().map(body::parse_content_md5).transpose()?;
        let len = i.content_length.map(|n| n.max(0) as u64);
        too_large(len)?;
        // A checksum in a header is known now and stored with the bytes; one in a trailer (or
        // computed here) is known after them and recorded then.
        let early = match &asked {
            Some(Asked { algo, given: Given::Header(v) }) => Some(Sum::whole(*algo, v.clone())),
            _ => None,
        };
        if let Some(s) = &early {
            extended.insert(ATTR_CHECKSUM.into(), s.to_attr());
        }
        let (check, computed) = checksum::Check::new(asked.as_ref(), None, trailing_headers);
        let (mut stream, verdict) = body::checked(body::from_request(i.body), md5, len, check);
        if let Some(x) = &mut enc {
            stream = x.encrypt(stream)?;
        }
        encryption::set_sealed(&mut extended, enc.as_ref());
        let opts = WriteOptions {
            precondition: conditions,
            extended: Some(extended),
            declared_len: len,
            ..Default::default()
        };
        let e = self.write_object(&i.bucket, &i.key, &p, stamp.as_ref(), stream, &verdict, opts).await?;
        let late = asked.filter(|_| early.is_none()).and_then(|a| computed.get(a.algo).map(|v| Sum::whole(a.algo, v)));
        let plain_etag = enc.as_ref().and_then(|x| x.plain_etag());
        self.keep_late(&p, &e, late.as_ref(), plain_etag.as_deref(), Origin::Local).await;
        let mut out = PutObjectOutput {
            e_tag: Some(ETag::Strong(plain_etag.unwrap_or_else(|| etag_of(&e)))),
            size: Some(e.size as i64),
            expiration: expiration_of(lifecycle_of(&bucket).as_ref(), &i.key, &e),
            version_id: answered_version(stamp.as_ref()),
            ..Default::default()
        };
        with_checksum!(out, early.as_ref().or(late.as_ref()), typed);
        with_sse!(out, enc.as_ref().map(|x| x.shown()));
        Ok(S3Response::new(out))
    }

    async fn copy_object(&self, req: S3Request<CopyObjectInput>) -> S3Result<S3Response<CopyObjectOutput>> {
        let secure = encryption::secure(&req.extensions);
        let i = req.input;
        refuse_unhonoured!(i);
        let src_customer = encryption::customer(
            secure,
            i.copy_source_sse_customer_algorithm.as_deref(),
            i.copy_source_sse_customer_key.as_deref(),
            i.copy_source_sse_customer_key_md5.as_deref(),
        )?;
        let (bucket_dir, bucket) = self.bucket_entry(&i.bucket).await?;
        let (p, marker) = names::object_path(&i.bucket, &i.key).map_err(name_err)?;
        if marker {
            return Err(s3_error!(InvalidRequest, "a key ending in '/' is a directory: nothing can be copied onto it"));
        }
        let mut enc = self.encrypting(secure, &bucket_dir, &bucket, sse_headers!(i)).await?;
        let replace = i.metadata_directive.as_ref().is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
        let (sb, sk, sv) = copy_source(&i.copy_source)?;
        // Copying an older version over its key is how a version is restored; copying an
        // object over itself, how its encryption is changed.
        let reencrypts = i.server_side_encryption.is_some() || i.sse_customer_algorithm.is_some();
        if sb == i.bucket && sk == i.key && sv.is_none() && !replace && !reencrypts {
            return Err(s3_error!(
                InvalidRequest,
                "This copy request is illegal because it is trying to copy an object to itself without changing the object's metadata"
            ));
        }
        let (src, stream, src_version) = self
            .read_source(
                &i.copy_source,
                None,
                i.copy_source_if_match.as_ref(),
                i.copy_source_if_none_match.as_ref(),
                src_customer.as_ref(),
            )
            .await?;
        let mut extended = if replace { attrs_of(attrs!(i))? } else { copied_attrs(&src) };
        // Tags follow their own directive: copied unless REPLACE gives new ones.
        let tags = match i.tagging_directive.as_ref().is_some_and(|d| d.as_str() == TaggingDirective::REPLACE) {
            true => i.tagging.as_deref().map(tagging::from_header).transpose()?.unwrap_or_default(),
            false => tagging::kept(&src.extended, tagging::ATTR_TAGGING),
        };
        tagging::set(&mut extended, tagging::ATTR_TAGGING, &tags);
        // The copy's ACL is the request's (private unless it names one), never the source's;
        // its owner is its writer's, never the source's.
        let acl = self.known(asked_acl!(i)).await?;
        refuse_public_acl(&bucket, acl.as_ref())?;
        set_acl(&mut extended, acl.as_ref());
        self.set_object_owner(&mut extended, &bucket, acl.as_ref(), &req.credentials).await?;
        // The source's checksum of its whole bytes is the copy's (of the algorithm asked, if one
        // was); another algorithm is computed as the bytes are copied.
        let want = i.checksum_algorithm.as_ref().map(|a| algo_named(a.as_str())).transpose()?;
        let kept = stored_sum(&src).filter(|s| !s.composite && want.is_none_or(|w| w == s.algo));
        extended.remove(ATTR_CHECKSUM);
        if let Some(k) = &kept {
            extended.insert(ATTR_CHECKSUM.into(), k.to_attr());
        }
        let compute = want.filter(|_| kept.is_none()).map(|algo| Asked { algo, given: Given::Nothing });
        let (check, computed) = checksum::Check::new(compute.as_ref(), None, None);
        let (mut stream, verdict) = body::checked(stream, None, Some(src.size), check);
        if let Some(x) = &mut enc {
            stream = x.encrypt(stream)?;
        }
        encryption::set_sealed(&mut extended, enc.as_ref());
        let stamp = self.new_stamp(&i.bucket, &i.key, versioning::mode_of(&bucket))?;
        let opts = WriteOptions { extended: Some(extended), ..Default::default() };
        let e = self.write_object(&i.bucket, &i.key, &p, stamp.as_ref(), stream, &verdict, opts).await?;
        let late = compute.and_then(|a| computed.get(a.algo).map(|v| Sum::whole(a.algo, v)));
        let plain_etag = enc.as_ref().and_then(|x| x.plain_etag());
        self.keep_late(&p, &e, late.as_ref(), plain_etag.as_deref(), Origin::Local).await;
        let mut result = CopyObjectResult {
            e_tag: Some(ETag::Strong(plain_etag.unwrap_or_else(|| etag_of(&e)))),
            last_modified: Some(timestamp(e.mtime_ms)),
            ..Default::default()
        };
        with_checksum!(result, kept.as_ref().or(late.as_ref()), typed);
        let mut out = CopyObjectOutput {
            copy_object_result: Some(result),
            version_id: answered_version(stamp.as_ref()),
            copy_source_version_id: src_version,
            ..Default::default()
        };
        with_sse!(out, enc.as_ref().map(|x| x.shown()));
        Ok(S3Response::new(out))
    }

    async fn delete_object(&self, req: S3Request<DeleteObjectInput>) -> S3Result<S3Response<DeleteObjectOutput>> {
        let i = req.input;
        let if_match = match &i.if_match {
            None => None,
            Some(ETagCondition::ETag(t)) => Some(t),
            // `If-Match: *` on a version: it is deleted if it exists, as any version delete.
            Some(ETagCondition::Any) if i.version_id.is_some() => None,
            // `If-Match: *`: only if the key exists.
            Some(ETagCondition::Any) => {
                self.object_entry(&i.bucket, &i.key).await?;
                None
            }
        };
        // S3 Express's conditions, which s3s does not parse: headers.
        let header = |h: &str| req.headers.get(h).and_then(|v| v.to_str().ok()).map(str::to_string);
        let last_modified = header("x-amz-if-match-last-modified-time")
            .map(|v| Timestamp::parse(TimestampFormat::HttpDate, &v))
            .transpose()
            .map_err(|_| s3_error!(InvalidArgument, "x-amz-if-match-last-modified-time is not an HTTP date"))?;
        let size = header("x-amz-if-match-size")
            .map(|v| v.parse::<i64>())
            .transpose()
            .map_err(|_| s3_error!(InvalidArgument, "x-amz-if-match-size is not a number"))?;
        let cond = DeleteIf { etag: if_match, last_modified: last_modified.as_ref(), size, version: None };
        let done = self.delete_any(&i.bucket, &i.key, i.version_id.as_deref(), cond).await?;
        Ok(S3Response::new(DeleteObjectOutput {
            version_id: done.version_id,
            delete_marker: done.delete_marker.then_some(true),
            ..Default::default()
        }))
    }

    async fn delete_objects(&self, req: S3Request<DeleteObjectsInput>) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let i = req.input;
        self.bucket_entry(&i.bucket).await?;
        if i.delete.objects.len() > 1000 {
            return Err(s3_error!(MalformedXML, "at most 1000 keys per DeleteObjects"));
        }
        let quiet = i.delete.quiet.unwrap_or(false);
        let (mut deleted, mut errors) = (Vec::new(), Vec::new());
        for o in &i.delete.objects {
            let cond = DeleteIf {
                etag: o.e_tag.as_ref(),
                last_modified: o.last_modified_time.as_ref(),
                size: o.size,
                version: None,
            };
            match self.delete_any(&i.bucket, &o.key, o.version_id.as_deref(), cond).await {
                Ok(d) if !quiet => deleted.push(DeletedObject {
                    key: Some(o.key.clone()),
                    delete_marker_version_id: d.delete_marker.then(|| d.version_id.clone()).flatten(),
                    delete_marker: d.delete_marker.then_some(true),
                    version_id: o.version_id.clone(),
                }),
                Ok(_) => {}
                Err(e) => errors.push(s3s::dto::Error {
                    key: Some(o.key.clone()),
                    code: Some(e.code().as_str().to_string()),
                    message: e.message().map(str::to_string),
                    ..Default::default()
                }),
            }
        }
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: (!deleted.is_empty()).then_some(deleted),
            errors: (!errors.is_empty()).then_some(errors),
            ..Default::default()
        }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let secure = encryption::secure(&req.extensions);
        let i = req.input;
        refuse_unhonoured!(i);
        let (bucket_dir, bucket) = self.bucket_entry(&i.bucket).await?;
        let (_, marker) = names::object_path(&i.bucket, &i.key).map_err(name_err)?;
        if marker {
            return Err(s3_error!(InvalidRequest, "a key ending in '/' is a directory: it holds no bytes"));
        }
        // The upload's data key, sealed, is in its document; each part opens it.
        let enc = self.encrypting(secure, &bucket_dir, &bucket, sse_headers!(i)).await?;
        let mut extended = attrs_of(attrs!(i))?;
        encryption::set_sealed(&mut extended, enc.as_ref());
        if let Some(t) = &i.tagging {
            tagging::set(&mut extended, tagging::ATTR_TAGGING, &tagging::from_header(t)?);
        }
        let acl = self.known(asked_acl!(i)).await?;
        refuse_public_acl(&bucket, acl.as_ref())?;
        set_acl(&mut extended, acl.as_ref());
        self.set_object_owner(&mut extended, &bucket, acl.as_ref(), &req.credentials).await?;
        let algo = i.checksum_algorithm.as_ref().map(|a| algo_named(a.as_str())).transpose()?;
        let full_object = match (i.checksum_type.as_ref().map(|t| t.as_str()), algo) {
            (Some(_), None) => {
                return Err(s3_error!(InvalidRequest, "x-amz-checksum-type needs x-amz-checksum-algorithm"));
            }
            (Some(t), Some(_)) if t.eq_ignore_ascii_case(ChecksumType::FULL_OBJECT) => true,
            (Some(t), Some(_)) if t.eq_ignore_ascii_case(ChecksumType::COMPOSITE) => false,
            (Some(t), Some(_)) => {
                return Err(s3_error!(InvalidRequest, "x-amz-checksum-type {t:?}: COMPOSITE or FULL_OBJECT"));
            }
            (None, a) => a.is_some_and(Algo::default_full_object),
        };
        if let Some(a) = algo.filter(|a| !a.allows(full_object)) {
            let t = if full_object { ChecksumType::FULL_OBJECT } else { ChecksumType::COMPOSITE };
            return Err(s3_error!(
                InvalidRequest,
                "The {t} checksum type cannot be used with the {} checksum algorithm.",
                a.name()
            ));
        }
        let id = multipart::new_upload_id().map_err(s3_err)?;
        let upload = Upload {
            bucket: i.bucket.clone(),
            key: i.key.clone(),
            initiated_ms: now_ms(),
            extended,
            checksum_algorithm: algo.map(|a| a.name().to_string()),
            checksum_full_object: full_object,
        };
        docs::write_json(&*self.filer, &multipart::upload_doc(&id), &upload, None).await.map_err(s3_err)?;
        let mut out = CreateMultipartUploadOutput {
            bucket: Some(i.bucket),
            key: Some(i.key),
            upload_id: Some(id),
            checksum_algorithm: upload.checksum_algorithm.clone().map(ChecksumAlgorithm::from),
            checksum_type: algo.map(|_| checksum_type(full_object)),
            ..Default::default()
        };
        with_sse!(out, enc.as_ref().map(|x| x.shown()));
        Ok(S3Response::new(out))
    }

    async fn upload_part(&self, req: S3Request<UploadPartInput>) -> S3Result<S3Response<UploadPartOutput>> {
        let secure = encryption::secure(&req.extensions);
        let asked = checksum::asked(&req.headers)?;
        let S3Request { input: i, trailing_headers, .. } = req;
        let customer = encryption::customer(
            secure,
            i.sse_customer_algorithm.as_deref(),
            i.sse_customer_key.as_deref(),
            i.sse_customer_key_md5.as_deref(),
        )?;
        if !(1..=multipart::MAX_PART_NUMBER).contains(&i.part_number) {
            return Err(s3_error!(InvalidArgument, "part numbers are 1 to {}", multipart::MAX_PART_NUMBER));
        }
        let len = i.content_length.map(|n| n.max(0) as u64);
        too_large(len)?;
        let upload = self.upload(&i.bucket, &i.key, &i.upload_id).await?;
        let mut enc = self.encrypting_part(&upload, customer)?;
        let md5 = i.content_md5.as_deref().map(body::parse_content_md5).transpose()?;
        // The part's checksum of the upload's algorithm is computed whatever the client sent
        // (which is verified): the object's checksum is made of those.
        let of_upload = upload_algo(&upload);
        let (check, computed) = checksum::Check::new(asked.as_ref(), of_upload, trailing_headers);
        let (stream, verdict) = body::checked(body::from_request(i.body), md5, len, check);
        let (stream, extended) = encryption::encrypt_part(stream, enc.as_mut())?;
        let opts = WriteOptions { origin: Origin::System, declared_len: len, extended, ..Default::default() };
        let part = multipart::part_path(&i.upload_id, i.part_number);
        let e = self.write(&part, stream, &verdict, opts).await?;
        let sum_of = |a: Algo| computed.get(a).map(|v| Sum::whole(a, v));
        let kept = of_upload.or(asked.as_ref().map(|a| a.algo)).and_then(sum_of);
        let plain_etag = enc.as_ref().and_then(|x| x.plain_etag());
        self.keep_late(&part, &e, kept.as_ref(), plain_etag.as_deref(), Origin::System).await;
        let mut out = UploadPartOutput {
            e_tag: Some(ETag::Strong(plain_etag.unwrap_or_else(|| etag_of(&e)))),
            ..Default::default()
        };
        with_checksum!(out, asked.and_then(|a| sum_of(a.algo)).as_ref());
        with_checksum!(out, kept.as_ref());
        with_sse!(out, enc.as_ref().map(|x| x.shown()));
        Ok(S3Response::new(out))
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let secure = encryption::secure(&req.extensions);
        let i = req.input;
        if !(1..=multipart::MAX_PART_NUMBER).contains(&i.part_number) {
            return Err(s3_error!(InvalidArgument, "part numbers are 1 to {}", multipart::MAX_PART_NUMBER));
        }
        let upload = self.upload(&i.bucket, &i.key, &i.upload_id).await?;
        let customer = encryption::customer(
            secure,
            i.sse_customer_algorithm.as_deref(),
            i.sse_customer_key.as_deref(),
            i.sse_customer_key_md5.as_deref(),
        )?;
        let src_customer = encryption::customer(
            secure,
            i.copy_source_sse_customer_algorithm.as_deref(),
            i.copy_source_sse_customer_key.as_deref(),
            i.copy_source_sse_customer_key_md5.as_deref(),
        )?;
        let mut enc = self.encrypting_part(&upload, customer)?;
        let (_, stream, _) = self
            .read_source(
                &i.copy_source,
                i.copy_source_range.as_deref(),
                i.copy_source_if_match.as_ref(),
                i.copy_source_if_none_match.as_ref(),
                src_customer.as_ref(),
            )
            .await?;
        let of_upload = upload_algo(&upload);
        let (check, computed) = checksum::Check::new(None, of_upload, None);
        let (stream, verdict) = body::checked(stream, None, None, check);
        let (stream, extended) = encryption::encrypt_part(stream, enc.as_mut())?;
        let opts = WriteOptions { origin: Origin::System, extended, ..Default::default() };
        let part = multipart::part_path(&i.upload_id, i.part_number);
        let e = self.write(&part, stream, &verdict, opts).await?;
        let kept = of_upload.and_then(|a| computed.get(a).map(|v| Sum::whole(a, v)));
        let plain_etag = enc.as_ref().and_then(|x| x.plain_etag());
        self.keep_late(&part, &e, kept.as_ref(), plain_etag.as_deref(), Origin::System).await;
        let mut result = CopyPartResult {
            e_tag: Some(ETag::Strong(plain_etag.unwrap_or_else(|| etag_of(&e)))),
            last_modified: Some(timestamp(e.mtime_ms)),
            ..Default::default()
        };
        with_checksum!(result, kept.as_ref());
        let mut out = UploadPartCopyOutput { copy_part_result: Some(result), ..Default::default() };
        with_sse!(out, enc.as_ref().map(|x| x.shown()));
        Ok(S3Response::new(out))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let secure = encryption::secure(&req.extensions);
        let i = req.input;
        let upload = match self.upload(&i.bucket, &i.key, &i.upload_id).await {
            Ok(u) => u,
            Err(e) => return self.completed_again(&i.bucket, &i.key, &i.upload_id).await.ok_or(e).map(S3Response::new),
        };
        // The bucket may have been deleted since the upload began: never recreate it implicitly.
        let (_, bucket) = self.bucket_entry(&i.bucket).await?;
        let (p, _) = names::object_path(&i.bucket, &i.key).map_err(name_err)?;
        let of_upload = upload_algo(&upload);
        // A checksum of the whole object sent with the Complete: of the upload's algorithm only.
        let mut sent_whole = None;
        for a in checksum::ALL {
            let Some(v) = sent_checksum!(i, a) else { continue };
            if Some(a) != of_upload {
                let made = of_upload
                    .map_or("no checksum algorithm".to_string(), |u| format!("checksum algorithm {}", u.name()));
                return Err(s3_error!(
                    InvalidRequest,
                    "the upload was created with {made}; the Complete sent {}",
                    a.header()
                ));
            }
            sent_whole = Some(v);
        }
        let wanted = i.multipart_upload.and_then(|m| m.parts).unwrap_or_default();
        if wanted.is_empty() {
            return Err(s3_error!(MalformedXML, "CompleteMultipartUpload names no parts"));
        }
        let staged: BTreeMap<i32, Entry> = self.staged_parts(&i.upload_id).await?.into_iter().collect();
        let mut sealed = crate::sse::Sealed::of(&upload.extended).map_err(encryption::refused)?;
        // An upload under a customer's key completes only with that key, as S3's does.
        let customer = match sealed.as_ref().filter(|s| s.is_customer()) {
            None => None,
            Some(s) => {
                let customer = encryption::customer(
                    secure,
                    i.sse_customer_algorithm.as_deref(),
                    i.sse_customer_key.as_deref(),
                    i.sse_customer_key_md5.as_deref(),
                )?;
                s.open(customer.as_ref(), None).map_err(encryption::refused)?;
                customer
            }
        };
        let mut chosen = Vec::with_capacity(wanted.len());
        let mut part_sums = Vec::with_capacity(wanted.len());
        let mut part_etags = Vec::with_capacity(wanted.len());
        let mut last = 0;
        for w in &wanted {
            let n = w.part_number.ok_or_else(|| s3_error!(MalformedXML, "a part without a PartNumber"))?;
            if n <= last {
                return Err(s3_error!(InvalidPartOrder, "parts must be listed in ascending order of PartNumber"));
            }
            last = n;
            let e = staged.get(&n).ok_or_else(|| s3_error!(InvalidPart, "part {n} was not uploaded"))?;
            if let Some(t) = &w.e_tag
                && t.value() != etag_of(e)
            {
                return Err(s3_error!(InvalidPart, "part {n}: ETag {} is not the uploaded part's", t.value()));
            }
            // The part's checksum, if the client lists one, must be the part's as uploaded.
            let kept = of_upload.and_then(|a| stored_sum(e).filter(|s| s.algo == a)).map(|s| s.value);
            if let Some(a) = of_upload
                && let Some(sent) = sent_checksum!(w, a)
                && Some(sent.trim()) != kept.as_deref()
            {
                return Err(s3_error!(InvalidPart, "part {n}: {} {sent} is not the uploaded part's", a.header()));
            }
            if let Some(s) = &mut sealed {
                // The part's bytes are stored as encrypted, under the IV it was given.
                let iv = crate::sse::Sealed::of(&e.extended)
                    .ok()
                    .flatten()
                    .and_then(|p| p.ivs.into_iter().next())
                    .ok_or_else(|| s3_error!(InvalidPart, "part {n} was stored unencrypted; upload it again"))?;
                s.ivs.push(iv);
            }
            part_sums.push((kept, e.size));
            part_etags.push(etag_of(e));
            chosen.push((e.path.clone(), e.version, e.size));
        }
        let made = match of_upload {
            None => None,
            Some(a) => Some(checksum::of_parts(a, upload.checksum_full_object, &part_sums).ok_or_else(|| {
                s3_error!(InvalidPart, "a part was uploaded without a {} checksum; upload it again", a.name())
            })?),
        };
        if let (Some(sent), Some(made)) = (&sent_whole, &made)
            && !checksum::matches(sent, made)
        {
            return Err(S3Error::with_message(
                S3ErrorCode::BadDigest,
                format!("The {} you specified did not match the calculated checksum.", made.algo.name()),
            ));
        }
        // Sizes after order and identity, as S3 reports them.
        if let Some((p, _, size)) = chosen[..chosen.len() - 1].iter().find(|c| c.2 < multipart::MIN_PART_BYTES) {
            return Err(s3_error!(
                EntityTooSmall,
                "{} has {size} bytes; every part but the last needs 5 MiB",
                path::name(p)
            ));
        }
        let asked = self.precondition_for_put(&p, i.if_match.as_ref(), i.if_none_match.as_ref()).await?;
        let stamp = self.new_stamp(&i.bucket, &i.key, versioning::mode_of(&bucket))?;
        let sizes: Vec<u64> = chosen.iter().map(|c| c.2).collect();
        let total: u64 = sizes.iter().sum();
        let filer = self.filer.clone();
        // The parts, in order, as one stream: each opened when the previous one ends.
        let stream = futures::stream::iter(chosen)
            .then(move |(part, version, _)| {
                let filer = filer.clone();
                async move {
                    match filer.read(&part, None).await {
                        Ok((e, s)) if e.version == version => s,
                        Ok(_) => futures::stream::once(async { Err(std::io::Error::other("a part changed")) }).boxed(),
                        Err(e) => {
                            futures::stream::once(async move { Err(std::io::Error::other(e.to_string())) }).boxed()
                        }
                    }
                }
            })
            .flatten()
            .boxed();
        let (stream, verdict) = body::checked(stream, None, Some(total), None);
        let mut extended = upload.extended.clone();
        if let Some(s) = &sealed {
            extended.insert(crate::sse::ATTR_SSE.into(), s.to_attr());
        }
        multipart::set_part_sizes(&mut extended, &sizes);
        extended.insert(ATTR_ETAG.into(), multipart::etag_of_parts(&part_etags));
        if let Some(m) = &made {
            extended.insert(ATTR_CHECKSUM.into(), m.to_attr());
            let values: Vec<&str> = part_sums.iter().filter_map(|(v, _)| v.as_deref()).collect();
            extended.insert(ATTR_PART_CHECKSUMS.into(), values.join(","));
        }
        let opts = WriteOptions { precondition: asked, extended: Some(extended), ..Default::default() };
        let e = self.write_object(&i.bucket, &i.key, &p, stamp.as_ref(), stream, &verdict, opts).await?;
        let done = multipart::Completed {
            bucket: i.bucket.clone(),
            key: i.key.clone(),
            etag: etag_of(&e),
            checksum: made.as_ref().map(Sum::to_attr),
            version_id: answered_version(stamp.as_ref()),
        };
        self.remember_completed(&i.upload_id, &done).await;
        let opts = DeleteOptions { recursive: true, precondition: Precondition::Any, ..Default::default() };
        if let Err(err) = self.filer.delete(&multipart::upload_dir(&i.upload_id), opts).await {
            tracing::warn!(upload = %i.upload_id, error = %err, "completed, but its staged parts stay behind");
        }
        let mut out = completed_output(&done);
        let shown = sealed.as_ref().map(|s| encryption::Shown::of(s, customer.as_ref()));
        if let Some(s) = &shown {
            out.server_side_encryption = s.sse.clone();
            out.ssekms_key_id = s.kms_key_id.clone();
        }
        let mut resp = S3Response::new(out);
        // s3s's CompleteMultipartUploadOutput has no fields for SSE-C's headers.
        if let Some(s) = shown {
            encryption::customer_headers(&mut resp.headers, &s);
        }
        Ok(resp)
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let i = req.input;
        self.upload(&i.bucket, &i.key, &i.upload_id).await?;
        let opts = DeleteOptions { recursive: true, precondition: Precondition::Any, ..Default::default() };
        match self.filer.delete(&multipart::upload_dir(&i.upload_id), opts).await {
            Ok(_) | Err(Error::NotFound { .. }) => Ok(S3Response::new(AbortMultipartUploadOutput::default())),
            Err(e) => Err(s3_err(e)),
        }
    }

    async fn list_parts(&self, req: S3Request<ListPartsInput>) -> S3Result<S3Response<ListPartsOutput>> {
        let i = req.input;
        let upload = self.upload(&i.bucket, &i.key, &i.upload_id).await?;
        let of_upload = upload_algo(&upload);
        let max = i.max_parts.unwrap_or(1000).clamp(0, 1000) as usize;
        let marker: i32 = i.part_number_marker.unwrap_or(0);
        let staged: Vec<(i32, Entry)> =
            self.staged_parts(&i.upload_id).await?.into_iter().filter(|(n, _)| *n > marker).collect();
        let truncated = staged.len() > max;
        let parts: Vec<Part> = staged
            .iter()
            .take(max)
            .map(|(n, e)| {
                let mut part = Part {
                    part_number: Some(*n),
                    size: Some(e.size as i64),
                    e_tag: Some(ETag::Strong(etag_of(e))),
                    last_modified: Some(timestamp(e.mtime_ms)),
                    ..Default::default()
                };
                with_checksum!(part, stored_sum(e).as_ref());
                part
            })
            .collect();
        let next = truncated.then(|| parts.last().and_then(|p| p.part_number)).flatten();
        // The object's owner-to-be: its writer where the ownership control makes it so.
        let owner = match upload.extended.get(ATTR_OWNER) {
            Some(n) => owner_named(n),
            None => owner_of(&self.bucket_entry(&i.bucket).await?.1),
        };
        Ok(S3Response::new(ListPartsOutput {
            owner: Some(owner.clone()),
            initiator: Some(Initiator { display_name: owner.display_name, id: owner.id }),
            bucket: Some(i.bucket),
            key: Some(i.key),
            upload_id: Some(i.upload_id),
            max_parts: Some(max as i32),
            part_number_marker: i.part_number_marker,
            next_part_number_marker: next,
            is_truncated: Some(truncated),
            parts: Some(parts),
            checksum_algorithm: upload.checksum_algorithm.clone().map(ChecksumAlgorithm::from),
            checksum_type: of_upload.map(|_| checksum_type(upload.checksum_full_object)),
            ..Default::default()
        }))
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let i = req.input;
        let (_, bucket) = self.bucket_entry(&i.bucket).await?;
        let max = i.max_uploads.unwrap_or(1000).clamp(0, 1000) as usize;
        let prefix = i.prefix.clone().unwrap_or_default();
        let mut uploads: Vec<(String, String, i64, Option<String>)> = self
            .uploads()
            .await
            .map_err(s3_err)?
            .into_iter()
            .filter(|(_, u)| u.bucket == i.bucket && u.key.starts_with(&prefix))
            .map(|(id, u)| (u.key, id, u.initiated_ms, u.extended.get(ATTR_OWNER).cloned()))
            .collect();
        uploads.sort();
        let key_marker = i.key_marker.clone().unwrap_or_default();
        let id_marker = i.upload_id_marker.clone().unwrap_or_default();
        let rest: Vec<_> = uploads
            .into_iter()
            .filter(|(k, id, _, _)| key_marker.is_empty() || *k > key_marker || (*k == key_marker && *id > id_marker))
            .collect();
        let truncated = rest.len() > max;
        let shown: Vec<_> = rest.into_iter().take(max).collect();
        let (next_key, next_id) = match (truncated, shown.last()) {
            (true, Some((k, id, _, _))) => (Some(k.clone()), Some(id.clone())),
            _ => (None, None),
        };
        let list = shown
            .into_iter()
            .map(|(key, id, ms, writer)| {
                // Who started it: the object's owner-to-be (its writer, or the bucket's owner).
                let owner = writer.map_or_else(|| owner_of(&bucket), |n| owner_named(&n));
                MultipartUpload {
                    key: Some(key),
                    upload_id: Some(id),
                    initiated: Some(timestamp(ms)),
                    initiator: Some(Initiator { display_name: owner.display_name.clone(), id: owner.id.clone() }),
                    owner: Some(owner),
                    ..Default::default()
                }
            })
            .collect();
        Ok(S3Response::new(ListMultipartUploadsOutput {
            bucket: Some(i.bucket),
            prefix: i.prefix,
            key_marker: i.key_marker,
            upload_id_marker: i.upload_id_marker,
            max_uploads: Some(max as i32),
            is_truncated: Some(truncated),
            next_key_marker: next_key,
            next_upload_id_marker: next_id,
            uploads: Some(list),
            ..Default::default()
        }))
    }
}

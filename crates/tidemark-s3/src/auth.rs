//! SigV4 keys and per-operation permissions, read from the identities document (`s3.configure`)
//! through the filer and re-read every few seconds, so a new or revoked key takes effect
//! without a restart. s3s checks the signatures (header, streaming, presigned) with the secret
//! [`Auth`] hands it; [`Access`] then decides whether that caller may do the operation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::{S3Auth, SecretKey};
use s3s::dto::CopySource;
use s3s::path::S3Path;
use s3s::{S3Error, S3ErrorCode, S3Result};
use tokio::sync::Mutex;

use tidemark_core::Filer;
use tidemark_engine::docs;

use crate::identity::{ANONYMOUS, Action, Caller, DEV_ACCESS_KEY, IDENTITIES, Identities};
use crate::policy::Decision;

/// A request as a bucket policy sees it: who, what, on which resource, and the values its
/// conditions may test.
fn policy_request(
    cx: &mut S3AccessContext<'_>,
    principal: Option<String>,
    op: &str,
    bucket: &str,
) -> crate::policy::Request {
    let resource = match cx.s3_path() {
        S3Path::Object { key, .. } => format!("arn:aws:s3:::{bucket}/{key}"),
        _ => format!("arn:aws:s3:::{bucket}"),
    };
    let mut values = std::collections::BTreeMap::new();
    for (k, v) in form_urlencoded::parse(cx.uri().query().unwrap_or("").as_bytes()) {
        if matches!(k.as_ref(), "prefix" | "delimiter" | "max-keys") {
            values.insert(format!("s3:{k}"), v.into_owned());
        }
    }
    for h in [
        "x-amz-acl",
        "x-amz-grant-read",
        "x-amz-grant-write",
        "x-amz-grant-read-acp",
        "x-amz-grant-write-acp",
        "x-amz-grant-full-control",
        "x-amz-server-side-encryption",
        "x-amz-server-side-encryption-aws-kms-key-id",
        "x-amz-server-side-encryption-customer-algorithm",
        "x-amz-copy-source",
        "x-amz-metadata-directive",
    ] {
        if let Some(v) = cx.headers().get(h).and_then(|v| v.to_str().ok()) {
            values.insert(format!("s3:{h}"), v.to_string());
        }
    }
    // The tags a put gives its object (`x-amz-tagging`, URL-encoded).
    if let Some(v) = cx.headers().get("x-amz-tagging").and_then(|v| v.to_str().ok()) {
        for (k, v) in form_urlencoded::parse(v.as_bytes()) {
            values.insert(format!("{}{k}", crate::policy::REQUEST_TAG), v.into_owned());
        }
    }
    // Said by the client, so only as good as a client's word (as on S3).
    for (h, k) in [("referer", "aws:referer"), ("user-agent", "aws:useragent")] {
        if let Some(v) = cx.headers().get(h).and_then(|v| v.to_str().ok()) {
            values.insert(k.into(), v.to_string());
        }
    }
    if let Some(p) = &principal {
        values.insert("aws:username".into(), p.clone());
    }
    let peer = cx.extensions_mut().get::<tidemark_http::Peer>().copied();
    values.insert("aws:securetransport".into(), peer.is_some_and(|p| p.tls).to_string());
    crate::policy::Request {
        principal,
        action: crate::policy::action_of(op),
        resource,
        values,
        source_ip: peer.map(|p| p.addr.ip()),
    }
}

/// How long a read of the identities document is used before it is read again.
const REFRESH: Duration = Duration::from_secs(2);
/// How far a signed request's date may be from this gateway's clock (S3's limit): a captured
/// request cannot be replayed later than this.
const MAX_SKEW_SECS: i64 = 15 * 60;

/// Refuses a header-signed request whose `x-amz-date` is too far from now. (s3s checks the
/// expiry of presigned URLs, not the age of header signatures.)
fn check_skew(cx: &S3AccessContext<'_>) -> S3Result<()> {
    if cx.credentials().is_none() {
        return Ok(());
    }
    if let Some(q) = cx.uri().query().filter(|q| q.contains("X-Amz-Signature=")) {
        // s3s checks that a presigned URL has not expired; S3 also caps how long one may live.
        return presigned_lifetime(q);
    }
    if let Some((code, message)) = sigv2_time_problem(cx.headers(), std::time::SystemTime::now()) {
        return Err(S3Error::with_message(code, message));
    }
    let sigv2 = cx.headers().get(hyper::header::AUTHORIZATION).is_some_and(|a| a.as_bytes().starts_with(b"AWS "));
    let Some(date) = cx.headers().get("x-amz-date").and_then(|v| v.to_str().ok()).filter(|_| !sigv2) else {
        return Ok(());
    };
    let format = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    let Ok(t) = time::PrimitiveDateTime::parse(date, format) else {
        return Err(S3Error::with_message(
            S3ErrorCode::AccessDenied,
            format!("x-amz-date {date:?} is not YYYYMMDDTHHMMSSZ"),
        ));
    };
    let skew = (time::OffsetDateTime::now_utc() - t.assume_utc()).whole_seconds();
    if skew.abs() > MAX_SKEW_SECS {
        return Err(S3Error::with_message(
            S3ErrorCode::RequestTimeTooSkewed,
            format!(
                "the request was signed {skew} s from this gateway's time; at most {MAX_SKEW_SECS} s (check the client's clock)"
            ),
        ));
    }
    Ok(())
}

pub struct Shared {
    filer: Arc<dyn Filer>,
    dev_key_allowed: bool,
    cached: Mutex<Option<(Instant, Arc<Identities>)>>,
    /// Buckets' creators, read at most every [`REFRESH`] (a bucket's never changes while it
    /// exists), so that a request costs no extra read.
    facts: Mutex<std::collections::HashMap<String, (Instant, BucketFacts)>>,
}

/// What the gateway reads of a bucket on every request (the access check, CORS, a HEAD's
/// expiration), cached: its creator and configurations.
#[derive(Debug, Clone, Default)]
pub struct BucketFacts {
    /// The bucket exists (what a preflight tells apart from having no CORS rules).
    pub exists: bool,
    pub owner: Option<String>,
    pub cors: Option<Arc<s3s::dto::CORSConfiguration>>,
    pub lifecycle: Option<Arc<s3s::dto::BucketLifecycleConfiguration>>,
    pub policy: Option<Arc<crate::policy::Policy>>,
    /// The public access block's `IgnorePublicAcls` and `RestrictPublicBuckets`.
    pub ignore_public_acls: bool,
    pub restrict_public_buckets: bool,
    /// Its versioning was ever turned on (a read of the current version answers its id).
    pub versioned: bool,
}

/// The most buckets whose creators are remembered at once.
const MAX_OWNERS: usize = 10_000;

impl Shared {
    /// `dev_key_allowed`: the gateway listens on loopback only.
    pub fn new(filer: Arc<dyn Filer>, dev_key_allowed: bool) -> Self {
        Shared { filer, dev_key_allowed, cached: Mutex::new(None), facts: Mutex::new(Default::default()) }
    }

    pub fn dev_key_allowed(&self) -> bool {
        self.dev_key_allowed
    }

    /// The identity that created `bucket` through S3, if one did.
    pub async fn owner_of(&self, bucket: &str) -> Option<String> {
        self.bucket_facts(bucket).await.owner
    }

    /// What the access check reads of a bucket (its creator, its policy), at most every
    /// [`REFRESH`].
    pub async fn bucket_facts(&self, bucket: &str) -> BucketFacts {
        if let Some((at, f)) = self.facts.lock().await.get(bucket)
            && at.elapsed() < REFRESH
        {
            return f.clone();
        }
        let Ok(dir) = crate::names::bucket_dir(bucket) else { return BucketFacts::default() };
        let facts = match self.filer.stat(&dir).await {
            Ok(Some(e)) if e.is_dir() => BucketFacts {
                exists: true,
                cors: crate::gateway::config_of(&e, crate::cors::ATTR_CORS).map(Arc::new),
                lifecycle: crate::gateway::config_of(&e, crate::lifecycle::ATTR_LIFECYCLE).map(Arc::new),
                ignore_public_acls: crate::gateway::public_access_block_of(&e)
                    .is_some_and(|c| c.ignore_public_acls == Some(true)),
                restrict_public_buckets: crate::gateway::public_access_block_of(&e)
                    .is_some_and(|c| c.restrict_public_buckets == Some(true)),
                owner: e.extended.get(crate::gateway::ATTR_OWNER).cloned(),
                versioned: crate::versioning::mode_of(&e) != crate::versioning::Mode::Off,
                policy: e
                    .extended
                    .get(crate::policy::ATTR_POLICY)
                    .and_then(|t| crate::policy::parse(t, bucket).ok())
                    .map(Arc::new),
            },
            // No bucket yet (it may be created next), or unknown: nothing is remembered.
            Ok(_) | Err(_) => return BucketFacts::default(),
        };
        let mut all = self.facts.lock().await;
        if all.len() >= MAX_OWNERS {
            all.clear();
        }
        all.insert(bucket.to_string(), (Instant::now(), facts.clone()));
        facts
    }

    /// The tags the object `key` of `bucket` has, as a policy's `s3:ExistingObjectTag/KEY`
    /// values (none when it does not exist or cannot be read: a condition on them then fails).
    pub async fn add_object_tags(&self, r: &mut crate::policy::Request, bucket: &str, key: &str) {
        let Ok((p, _)) = crate::names::object_path(bucket, key) else { return };
        if let Ok(Some(e)) = self.filer.stat(&p).await {
            for (k, v) in crate::tagging::kept(&e.extended, crate::tagging::ATTR_TAGGING) {
                r.values.insert(format!("{}{k}", crate::policy::EXISTING_TAG), v);
            }
        }
    }

    /// Whether the object `key` of `bucket` surely does not exist.
    pub async fn object_absent(&self, bucket: &str, key: &str) -> bool {
        let Ok((p, marker)) = crate::names::object_path(bucket, key) else { return false };
        match self.filer.stat(&p).await {
            Ok(None) => true,
            Ok(Some(e)) => e.is_dir() != marker,
            Err(_) => false,
        }
    }

    /// Whether `bucket` surely does not exist (not when the filer cannot say).
    pub async fn is_absent(&self, bucket: &str) -> bool {
        let Ok(dir) = crate::names::bucket_dir(bucket) else { return false };
        matches!(self.filer.stat(&dir).await, Ok(None))
    }

    /// Forgets what was read of `bucket` (its policy just changed on this gateway).
    pub async fn forget_bucket(&self, bucket: &str) {
        self.facts.lock().await.remove(bucket);
    }

    /// Whether an ACL lets this request do operation `op` on `path`, which its caller's
    /// identity `identity` (or the lack of one: `signed` false) does not: the object's ACL for
    /// reading its bytes or its ACL (`READ`, `READ_ACP`) and changing its ACL (`WRITE_ACP`); the
    /// bucket's for listing it (`READ`), writing its objects (`WRITE`), and reading or changing
    /// its ACL. Grants are to identities by name, to everyone (`AllUsers`: `public-read`,
    /// `public-read-write`) or to every signed request (`AuthenticatedUsers`:
    /// `authenticated-read`). Any other configuration is never granted this way.
    pub async fn acl_grants(&self, identity: Option<&str>, signed: bool, op: &str, path: &S3Path) -> bool {
        use crate::acl::{Acl, Asker, Perm};
        const LISTS: [&str; 5] =
            ["ListObjects", "ListObjectsV2", "ListObjectVersions", "HeadBucket", "GetBucketLocation"];
        const WRITES: [&str; 6] = [
            "PutObject",
            "DeleteObject",
            "CreateMultipartUpload",
            "UploadPart",
            "CompleteMultipartUpload",
            "AbortMultipartUpload",
        ];
        let (bucket, key) = match path {
            S3Path::Root => return false,
            S3Path::Bucket { bucket } => (bucket.as_ref(), None),
            S3Path::Object { bucket, key } => (bucket.as_ref(), Some(key.as_ref())),
        };
        let asker = Asker { signed, identity };
        let acl_of = |p: String| async move {
            match self.filer.stat(&p).await {
                Ok(Some(e)) => Some(Acl::of(&e.extended)),
                _ => None,
            }
        };
        let bucket_dir = crate::names::bucket_dir(bucket).ok();
        let on_bucket = |want: Perm| async move {
            let Some(p) = bucket_dir else { return false };
            acl_of(p).await.is_some_and(|a| a.allows(asker, want))
        };
        let on_object = |want: Perm| async move {
            let Some(p) = key.and_then(|k| crate::names::object_path(bucket, k).ok()).map(|(p, _)| p) else {
                return false;
            };
            acl_of(p).await.is_some_and(|a| a.allows(asker, want))
        };
        match op {
            "GetObject" | "HeadObject" => on_object(Perm::Read).await,
            "GetObjectAcl" => on_object(Perm::ReadAcp).await,
            "PutObjectAcl" => on_object(Perm::WriteAcp).await,
            "GetBucketAcl" => on_bucket(Perm::ReadAcp).await,
            "PutBucketAcl" => on_bucket(Perm::WriteAcp).await,
            op if LISTS.contains(&op) => on_bucket(Perm::Read).await,
            // (A POST form names its key in the form: the request is the bucket's.)
            op if (WRITES.contains(&op) && key.is_some()) || op == "PostObject" => on_bucket(Perm::Write).await,
            _ => false,
        }
    }

    /// The identities; on a failed re-read, the last ones read (a filer restart must not lock
    /// everyone out, nor let anyone in).
    pub async fn identities(&self) -> Arc<Identities> {
        let mut c = self.cached.lock().await;
        if let Some((at, ids)) = c.as_ref()
            && at.elapsed() < REFRESH
        {
            return ids.clone();
        }
        match docs::read_json::<Identities>(&*self.filer, IDENTITIES).await {
            Ok(doc) => {
                let ids = Arc::new(doc.map(|(d, _)| d).unwrap_or_default());
                *c = Some((Instant::now(), ids.clone()));
                ids
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read {IDENTITIES}; using the identities read before");
                match c.as_ref() {
                    Some((_, ids)) => ids.clone(),
                    None => Arc::new(Identities::default()),
                }
            }
        }
    }
}

pub struct Auth(pub Arc<Shared>);

#[async_trait::async_trait]
impl S3Auth for Auth {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        let ids = self.0.identities().await;
        if let Some(s) = ids.secret_of(access_key, self.0.dev_key_allowed) {
            return Ok(SecretKey::from(s));
        }
        let hint = if ids.has_keys() {
            String::new()
        } else if self.0.dev_key_allowed {
            format!(
                "; no keys are configured: use the development key {DEV_ACCESS_KEY}/{DEV_ACCESS_KEY} on loopback, or create one with s3.configure"
            )
        } else {
            "; no keys are configured: create one with `tidemark shell -c 's3.configure -user=NAME -access_key=... -secret_key=... -actions=Read,Write,List,Admin -apply'`".into()
        };
        Err(S3Error::with_message(
            S3ErrorCode::InvalidAccessKeyId,
            format!("the access key {access_key:?} is not configured here{hint}"),
        ))
    }
}

pub struct Access(pub Arc<Shared>);

fn denied(msg: String) -> S3Error {
    S3Error::with_message(S3ErrorCode::AccessDenied, msg)
}

fn who(c: &Caller<'_>) -> String {
    match c {
        Caller::Identity(i) => format!("identity {}", i.name),
        Caller::Dev => "the development key".into(),
        Caller::Anonymous(_) => "an anonymous request".into(),
    }
}

#[async_trait::async_trait]
impl S3Access for Access {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let ids = self.0.identities().await;
        let ak = cx.credentials().map(|c| c.access_key.clone());
        let op = cx.s3_op().name().to_string();
        let caller = ids.caller(ak.as_deref(), self.0.dev_key_allowed);
        if caller.is_some() {
            check_skew(cx)?;
        }
        let action = Action::of_operation(&op);
        let bucket = match cx.s3_path() {
            S3Path::Root => None,
            S3Path::Bucket { bucket } | S3Path::Object { bucket, .. } => Some(bucket.to_string()),
        };
        // Creating a bucket is about its name: one that exists answers BucketAlreadyExists
        // (another's) or BucketAlreadyOwnedByYou, as S3 does, not AccessDenied.
        let facts = match &bucket {
            Some(b) if op != "CreateBucket" => self.0.bucket_facts(b).await,
            _ => BucketFacts::default(),
        };
        let name = match &caller {
            Some(Caller::Identity(i)) => Some(i.name.clone()),
            _ => None,
        };
        // `x-amz-expected-bucket-owner`: a request meant for someone else's bucket (a name
        // reused, a typo) is refused before it reads or writes anything there.
        if let (Some(b), Some(expected)) =
            (&bucket, cx.headers().get("x-amz-expected-bucket-owner").and_then(|v| v.to_str().ok()))
            && facts.exists
            && expected != facts.owner.as_deref().unwrap_or(crate::gateway::UNOWNED)
        {
            return Err(denied(format!("bucket {b} is not owned by {expected:?} (x-amz-expected-bucket-owner)")));
        }
        let mut decision = match (&facts.policy, &bucket) {
            (Some(p), Some(b)) => {
                let mut r = policy_request(cx, name.clone(), &op, b);
                if p.reads_object_tags()
                    && let S3Path::Object { key, .. } = cx.s3_path()
                {
                    let key = key.to_string();
                    self.0.add_object_tags(&mut r, b, &key).await;
                }
                p.evaluate(&r)
            }
            _ => Decision::Silent,
        };
        // A public policy of a bucket that restricts public buckets allows only its creator.
        if decision == Decision::Allow
            && facts.restrict_public_buckets
            && facts.policy.as_ref().is_some_and(|p| p.is_public())
            && !(name.is_some() && name == facts.owner)
        {
            decision = Decision::Silent;
        }
        // An explicit Deny wins, except over the creator managing the policy itself (a policy
        // that locks everyone out can still be mended).
        let managing = matches!(op.as_str(), "GetBucketPolicy" | "PutBucketPolicy" | "DeleteBucketPolicy");
        let creator = name.is_some() && name == facts.owner || matches!(caller, Some(Caller::Dev));
        if decision == Decision::Deny && !(managing && creator) {
            return Err(denied(format!(
                "bucket {}'s policy denies {op} to {}",
                bucket.as_deref().unwrap_or_default(),
                caller.as_ref().map(who).unwrap_or_else(|| "an unsigned request".into())
            )));
        }
        let allowed = caller.as_ref().is_some_and(|c| c.allows(action, bucket.as_deref(), facts.owner.as_deref()))
            || decision == Decision::Allow
            || (!facts.ignore_public_acls && self.0.acl_grants(name.as_deref(), ak.is_some(), &op, cx.s3_path()).await);
        // A request about a bucket that does not exist is told so (S3 answers NoSuchBucket
        // before AccessDenied: bucket names are public), whoever asks.
        if !allowed
            && op != "CreateBucket"
            && let Some(b) = &bucket
            && self.0.is_absent(b).await
        {
            return Err(S3Error::with_message(S3ErrorCode::NoSuchBucket, format!("no bucket named {b:?}")));
        }
        // A read of a missing object by someone who may list where it would be is told it is
        // missing (404), as S3 does; anyone else is refused (403), learning nothing.
        if !allowed
            && matches!(op.as_str(), "GetObject" | "HeadObject")
            && let (Some(b), S3Path::Object { key, .. }) = (&bucket, cx.s3_path())
        {
            let key = key.to_string();
            let mut list = policy_request(cx, name.clone(), "ListObjects", b);
            list.resource = format!("arn:aws:s3:::{b}");
            list.values.insert("s3:prefix".into(), key.clone());
            let bucket_path = S3Path::Bucket { bucket: b.as_str().into() };
            let may_list = caller.as_ref().is_some_and(|c| c.allows(Action::List, Some(b), facts.owner.as_deref()))
                || facts.policy.as_ref().is_some_and(|p| p.evaluate(&list) == Decision::Allow)
                || (!facts.ignore_public_acls
                    && self.0.acl_grants(name.as_deref(), ak.is_some(), "ListObjects", &bucket_path).await);
            if may_list && self.0.object_absent(b, &key).await {
                return Err(S3Error::with_message(S3ErrorCode::NoSuchKey, format!("no object {key:?}")));
            }
        }
        let Some(caller) = caller.filter(|_| allowed || ak.is_some()) else {
            if allowed && (op == "CopyObject" || op == "UploadPartCopy") {
                return Err(denied("an unsigned request may not copy: the source's reader is not known".into()));
            }
            if allowed {
                return Ok(());
            }
            return Err(denied(match ak {
                Some(a) => format!("access key {a:?} is not configured"),
                None => format!(
                    "this request is unsigned, and neither an identity named {ANONYMOUS}, a canned ACL nor the bucket's policy lets it {op}"
                ),
            }));
        };
        if !allowed {
            return Err(denied(format!(
                "{} may not {op} (needs {}{})",
                who(&caller),
                action.as_str(),
                bucket.as_deref().map(|b| format!(" on bucket {b}")).unwrap_or_default()
            )));
        }
        // A copy reads its source: that needs Read there — by the caller's identity or the
        // source bucket's policy, which may also deny it.
        if (op == "CopyObject" || op == "UploadPartCopy")
            && let Some(src) = cx.headers().get("x-amz-copy-source").and_then(|v| v.to_str().ok())
            && let Ok(CopySource::Bucket { bucket: sb, key: sk, .. }) = CopySource::parse(src)
        {
            let src_facts = self.0.bucket_facts(&sb).await;
            let mut read = policy_request(cx, name.clone(), "GetObject", &sb);
            read.resource = format!("arn:aws:s3:::{sb}/{sk}");
            let by_policy = src_facts.policy.as_ref().map_or(Decision::Silent, |p| p.evaluate(&read));
            let may_read = by_policy != Decision::Deny
                && (caller.allows(Action::Read, Some(&sb), src_facts.owner.as_deref()) || by_policy == Decision::Allow);
            if !may_read {
                return Err(denied(format!("{} may not read the copy source in bucket {sb}", who(&caller))));
            }
        }
        Ok(())
    }
}

/// The longest a SigV4 presigned URL may be valid, as S3 allows (7 days).
const MAX_PRESIGNED_SECS: u64 = 7 * 24 * 3600;

/// Refuses a presigned URL that asks to live longer than S3 allows (a leaked URL good for years).
fn presigned_lifetime(query: &str) -> S3Result<()> {
    let expires = query.split('&').find_map(|kv| kv.strip_prefix("X-Amz-Expires=")).map(|v| v.parse::<u64>());
    match expires {
        Some(Ok(n)) if n <= MAX_PRESIGNED_SECS => Ok(()),
        Some(_) => Err(S3Error::with_message(
            S3ErrorCode::AuthorizationQueryParametersError,
            format!("X-Amz-Expires must be a number of seconds of at most {MAX_PRESIGNED_SECS} (7 days)"),
        )),
        None => Ok(()),
    }
}

/// SigV2 header signatures (`Authorization: AWS AK:SIG`) sign the request's time — `x-amz-date`
/// if present, else `Date`, both HTTP dates — but s3s checks neither, so a captured request would
/// be good for ever. This is the check S3 makes: the S3 error (code, message) to answer with, or
/// `None` (for every other kind of request: [`check_skew`] checks SigV4's `x-amz-date`, s3s the
/// expiry of presigned URLs).
pub fn sigv2_time_problem(
    headers: &hyper::HeaderMap,
    now: std::time::SystemTime,
) -> Option<(S3ErrorCode, &'static str)> {
    let auth = headers.get(hyper::header::AUTHORIZATION)?.to_str().ok()?;
    if !auth.starts_with("AWS ") {
        return None;
    }
    let date = headers.get("x-amz-date").or_else(|| headers.get(hyper::header::DATE));
    let Some(t) = date.and_then(|d| d.to_str().ok()).and_then(|d| httpdate::parse_http_date(d).ok()) else {
        return Some((S3ErrorCode::AccessDenied, "AWS authentication requires a valid Date or x-amz-date header"));
    };
    let skew = now.duration_since(t).or_else(|e| Ok::<_, ()>(e.duration())).unwrap_or_default();
    (skew > Duration::from_secs(MAX_SKEW_SECS as u64)).then_some((
        S3ErrorCode::RequestTimeTooSkewed,
        "The difference between the request time and the current time is too large.",
    ))
}

#[cfg(test)]
mod sigv2_tests {
    use super::*;

    fn headers(pairs: &[(&'static str, String)]) -> hyper::HeaderMap {
        let mut h = hyper::HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn sigv2_requests_are_good_for_fifteen_minutes_around_their_date() {
        let now = std::time::SystemTime::now();
        let at = |d: std::time::SystemTime| httpdate::fmt_http_date(d);
        let v2 = ("authorization", "AWS AK:c2ln".to_string());
        assert_eq!(sigv2_time_problem(&headers(&[v2.clone(), ("date", at(now))]), now), None);
        let old = now - Duration::from_secs(3600);
        let ahead = now + Duration::from_secs(3600);
        for d in [old, ahead] {
            let p = sigv2_time_problem(&headers(&[v2.clone(), ("date", at(d))]), now);
            assert_eq!(p.map(|(c, _)| c), Some(S3ErrorCode::RequestTimeTooSkewed));
        }
        // x-amz-date wins over Date, as in the string SigV2 signs.
        let both = headers(&[v2.clone(), ("date", at(now)), ("x-amz-date", at(old))]);
        assert_eq!(sigv2_time_problem(&both, now).map(|(c, _)| c), Some(S3ErrorCode::RequestTimeTooSkewed));
        for bad in [headers(std::slice::from_ref(&v2)), headers(&[v2.clone(), ("date", "yesterday".into())])] {
            assert_eq!(sigv2_time_problem(&bad, now).map(|(c, _)| c), Some(S3ErrorCode::AccessDenied));
        }
        // SigV4 (checked by s3s) and anonymous requests are not this check's.
        let v4 = ("authorization", "AWS4-HMAC-SHA256 Credential=AK/...".to_string());
        assert_eq!(sigv2_time_problem(&headers(&[v4, ("date", at(old))]), now), None);
        assert_eq!(sigv2_time_problem(&headers(&[]), now), None);
    }
}

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

/// How long a read of the identities document is used before it is read again.
const REFRESH: Duration = Duration::from_secs(2);
/// How far a signed request's date may be from this gateway's clock (S3's limit): a captured
/// request cannot be replayed later than this.
const MAX_SKEW_SECS: i64 = 15 * 60;

/// Refuses a header-signed request whose `x-amz-date` is too far from now. (s3s checks the
/// expiry of presigned URLs, not the age of header signatures.)
fn check_skew(cx: &S3AccessContext<'_>) -> S3Result<()> {
    if cx.credentials().is_none() || cx.uri().query().is_some_and(|q| q.contains("X-Amz-Signature=")) {
        return Ok(());
    }
    let Some(date) = cx.headers().get("x-amz-date").and_then(|v| v.to_str().ok()) else { return Ok(()) };
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
}

impl Shared {
    /// `dev_key_allowed`: the gateway listens on loopback only.
    pub fn new(filer: Arc<dyn Filer>, dev_key_allowed: bool) -> Self {
        Shared { filer, dev_key_allowed, cached: Mutex::new(None) }
    }

    pub fn dev_key_allowed(&self) -> bool {
        self.dev_key_allowed
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
        let Some(caller) = ids.caller(ak.as_deref(), self.0.dev_key_allowed) else {
            return Err(denied(match ak {
                Some(a) => format!("access key {a:?} is not configured"),
                None => format!(
                    "this request is unsigned, and no identity named {ANONYMOUS} says what unsigned requests may do"
                ),
            }));
        };
        check_skew(cx)?;
        let op = cx.s3_op().name().to_string();
        let action = Action::of_operation(&op);
        let bucket = match cx.s3_path() {
            S3Path::Root => None,
            S3Path::Bucket { bucket } | S3Path::Object { bucket, .. } => Some(bucket.to_string()),
        };
        if !caller.allows(action, bucket.as_deref()) {
            return Err(denied(format!(
                "{} may not {op} (needs {}{})",
                who(&caller),
                action.as_str(),
                bucket.as_deref().map(|b| format!(" on bucket {b}")).unwrap_or_default()
            )));
        }
        // A copy reads its source: that needs Read there.
        if (op == "CopyObject" || op == "UploadPartCopy")
            && let Some(src) = cx.headers().get("x-amz-copy-source").and_then(|v| v.to_str().ok())
            && let Ok(CopySource::Bucket { bucket: sb, .. }) = CopySource::parse(src)
            && !caller.allows(Action::Read, Some(&sb))
        {
            return Err(denied(format!("{} may not read the copy source in bucket {sb}", who(&caller))));
        }
        Ok(())
    }
}

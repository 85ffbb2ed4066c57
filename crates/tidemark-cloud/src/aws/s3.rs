//! S3 (and S3-compatibles) through the AWS SDK. Keys are sent and listed verbatim — the SDK does
//! not normalise them — so a bucket holding `a//b` or `x/../y` lists fine and Tidemark's key
//! mapping decides what to do with such keys.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_s3::Client;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream as AwsBody;
use bytes::Bytes;
use futures::StreamExt;

use tidemark_core::remote::{
    KMS_DENIED_REASON, ListPage, ObjectHeaders, RemoteConf, RemoteObject, SSE_C_REASON, normalize_etag,
};
use tidemark_core::{ByteRange, ByteStream, Error, RemoteStorage, Result};

/// Sets what a reader gets back about an object (its headers and user metadata) on a PutObject
/// or CopyObject request: their builders have the same setters but no common type.
macro_rules! with_object_headers {
    ($req:expr, $headers:expr, $metadata:expr) => {{
        let h = $headers.clone();
        let expires = h.expires.as_deref().and_then(|e| {
            aws_sdk_s3::primitives::DateTime::from_str(e, aws_sdk_s3::primitives::DateTimeFormat::HttpDate).ok()
        });
        let mut req = $req
            .set_content_type(h.content_type)
            .set_content_encoding(h.content_encoding)
            .set_content_disposition(h.content_disposition)
            .set_content_language(h.content_language)
            .set_cache_control(h.cache_control)
            .set_expires(expires);
        for (k, v) in $metadata {
            req = req.metadata(k, v);
        }
        req
    }};
}

pub const SETTINGS: &[(&str, &str)] = &[
    ("access_key", "access key id (default: the standard AWS credential chain)"),
    ("secret_key", "secret access key"),
    ("session_token", "session token, for temporary credentials"),
    ("region", "region (default us-east-1)"),
    ("endpoint", "endpoint URL of an S3-compatible store or emulator, e.g. http://127.0.0.1:5000"),
    ("force_path_style", "true to address buckets as ENDPOINT/BUCKET (default: true when an endpoint is set)"),
    ("sqs_endpoint", "endpoint URL of SQS (default: the endpoint above, or AWS's)"),
    ("sns_endpoint", "endpoint URL of SNS (default: the endpoint above, or AWS's)"),
    ("events_endpoint", "endpoint URL of EventBridge (default: the endpoint above, or AWS's)"),
    (
        "queue_integration",
        "false for an S3-compatible store without SQS/SNS: event subscriptions cannot be provisioned",
    ),
];

#[derive(Clone, Debug)]
pub struct S3Storage {
    client: Client,
    bucket: String,
    remote: String,
}

/// The SDK configuration for a remote: credentials, region, endpoint. Shared with the SQS and
/// SNS clients of the same remote.
pub async fn sdk_config(conf: &RemoteConf) -> Result<aws_config::SdkConfig> {
    let region = conf.setting("region").unwrap_or("us-east-1").to_string();
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(region))
        .timeout_config(
            aws_config::timeout::TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(5))
                .operation_attempt_timeout(Duration::from_secs(60))
                .build(),
        );
    match (conf.setting("access_key"), conf.setting("secret_key")) {
        (Some(ak), Some(sk)) => {
            let creds = aws_sdk_s3::config::Credentials::new(
                ak,
                sk,
                conf.setting("session_token").map(str::to_string),
                None,
                "tidemark-remote-configure",
            );
            loader = loader.credentials_provider(creds);
        }
        (None, None) => {}
        _ => {
            return Err(Error::invalid_argument(format!(
                "remote {:?}: set both -s3.access_key and -s3.secret_key, or neither (to use the AWS credential chain)",
                conf.name
            )));
        }
    }
    if let Some(ep) = conf.setting("endpoint") {
        loader = loader.endpoint_url(ep);
    }
    Ok(loader.load().await)
}

impl S3Storage {
    pub async fn connect(conf: &RemoteConf, bucket: &str) -> Result<Self> {
        if bucket.is_empty() {
            return Err(Error::invalid_argument("an empty bucket name"));
        }
        let sdk = sdk_config(conf).await?;
        let path_style = match conf.setting("force_path_style") {
            Some(v) => v == "true",
            None => conf.setting("endpoint").is_some(),
        };
        let s3conf = aws_sdk_s3::config::Builder::from(&sdk).force_path_style(path_style).build();
        Ok(S3Storage { client: Client::from_conf(s3conf), bucket: bucket.into(), remote: conf.name.clone() })
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// An SDK error as one line that says which call failed and what to do.
    fn error<E: ProvideErrorMetadata + std::error::Error + 'static>(
        &self,
        op: &str,
        key: &str,
        e: SdkError<E>,
    ) -> Error {
        let target =
            if key.is_empty() { format!("s3://{}", self.bucket) } else { format!("s3://{}/{key}", self.bucket) };
        let status = e.raw_response().map(|r| r.status().as_u16());
        let code = e.code().unwrap_or_default().to_string();
        let detail = e.message().unwrap_or_default().to_string();
        match (&e, status, code.as_str()) {
            (SdkError::DispatchFailure(d), _, _) => Error::Unavailable {
                message: format!(
                    "{op} {target}: cannot reach the endpoint of remote {:?} ({}); check -s3.endpoint and the network",
                    self.remote,
                    d.as_connector_error().map(|c| c.to_string()).unwrap_or_else(|| "dispatch failure".into())
                ),
            },
            (SdkError::TimeoutError(_), _, _) => Error::Unavailable {
                message: format!("{op} {target}: the endpoint of remote {:?} timed out", self.remote),
            },
            // Before the credentials: S3 answers 403 for it.
            (_, _, "InvalidObjectState") => Error::Archived {
                path: target,
                // The error does not say which class; the reader names it from the entry.
                storage_class: ARCHIVAL.into(),
            },
            // Refused for good, with a reason the reader is given (never bytes of another
            // version): a customer-provided key the cluster does not have, a KMS key it may not
            // use. Before the credentials: both answer like a refusal of them.
            (_, Some(400), "InvalidRequest") if detail.contains("Server Side Encryption") => {
                Error::Unreadable { path: target, reason: SSE_C_REASON.into() }
            }
            (_, Some(403), _) if code.starts_with("KMS.") || kms_refusal(&detail) => {
                Error::Unreadable { path: target, reason: format!("{KMS_DENIED_REASON} ({code}: {detail})") }
            }
            (_, _, "NoSuchBucket") => Error::NotFound {
                path: format!(
                    "bucket {:?} of remote {:?} (it does not exist; check -remote=)",
                    self.bucket, self.remote
                ),
            },
            (_, Some(403), _)
            | (_, _, "AccessDenied" | "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "ExpiredToken") => {
                Error::Unauthorized {
                    message: format!(
                        "{op} {target} was refused ({code}{}): check the credentials of remote {:?} (remote.configure) and that they may {op}",
                        if detail.is_empty() { String::new() } else { format!(": {detail}") },
                        self.remote
                    ),
                }
            }
            (_, Some(404), _) | (_, _, "NoSuchKey" | "NotFound") => Error::not_found(target),
            (_, Some(412), _) | (_, _, "PreconditionFailed") => {
                Error::PreconditionFailed { path: target, current: None }
            }
            (_, Some(s), _) if s >= 500 => {
                Error::Unavailable { message: format!("{op} {target}: the store answered {s} {code} {detail}") }
            }
            _ => Error::internal(format!(
                "{op} {target}: {code} {detail} ({})",
                aws_sdk_s3::error::DisplayErrorContext(&e)
            )),
        }
    }
}

/// A key as `x-amz-copy-source` carries it: every byte but the unreserved ones and `/`
/// percent-encoded.
fn copy_source_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Whether a 403's message is KMS refusing the key the object was encrypted with.
fn kms_refusal(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("kms:") || m.contains("kms key") || m.contains("customer master key")
}

/// The storage class named in an archived-object error when the reader does not know which.
pub const ARCHIVAL: &str = "GLACIER or DEEP_ARCHIVE";

fn ms_of(t: Option<&aws_sdk_s3::primitives::DateTime>) -> i64 {
    t.and_then(|t| t.to_millis().ok()).unwrap_or(0)
}

#[async_trait]
impl RemoteStorage for S3Storage {
    fn describe(&self) -> String {
        format!("s3://{}", self.bucket)
    }

    async fn stat(&self, key: &str) -> Result<Option<RemoteObject>> {
        match self.client.head_object().bucket(&self.bucket).key(key).send().await {
            Ok(h) => Ok(Some(RemoteObject {
                key: key.to_string(),
                size: h.content_length().unwrap_or(0).max(0) as u64,
                etag: normalize_etag(h.e_tag().unwrap_or_default()),
                last_modified_ms: ms_of(h.last_modified()),
                version_id: h.version_id().map(str::to_string),
                user_metadata: Some(
                    h.metadata()
                        .map(|m| m.iter().map(|(k, v)| (k.to_ascii_lowercase(), v.clone())).collect())
                        .unwrap_or_default(),
                ),
                headers: Some(ObjectHeaders {
                    content_type: h.content_type().map(str::to_string),
                    content_encoding: h.content_encoding().map(str::to_string),
                    content_disposition: h.content_disposition().map(str::to_string),
                    content_language: h.content_language().map(str::to_string),
                    cache_control: h.cache_control().map(str::to_string),
                    expires: h.expires_string().map(str::to_string),
                    // A HEAD leaves the header out for STANDARD; a listing names it.
                    storage_class: Some(h.storage_class().map_or("STANDARD", |c| c.as_str()).to_string()),
                    restore: h.restore().map(str::to_string),
                    unreadable: None,
                }),
            })),
            Err(e) => {
                // A HEAD's refusal has no body, so no code: 400 or 403 may be an object refused
                // for good (SSE-C, KMS) or credentials refused for everything. One byte's GET
                // says which, with S3's code and message.
                let refused = matches!(e.raw_response().map(|r| r.status().as_u16()), Some(400 | 403));
                match self.error("HeadObject", key, e) {
                    Error::NotFound { path } if !path.starts_with("bucket ") => Ok(None),
                    other if refused => {
                        match self.client.get_object().bucket(&self.bucket).key(key).range("bytes=0-0").send().await {
                            Err(g) => match self.error("GetObject", key, g) {
                                e @ Error::Unreadable { .. } => Err(e),
                                _ => Err(other),
                            },
                            Ok(_) => Err(other),
                        }
                    }
                    other => Err(other),
                }
            }
        }
    }

    async fn list(&self, prefix: &str, start_after: Option<&str>, page: Option<&str>, max: usize) -> Result<ListPage> {
        // `encoding-type=url`: S3 allows any UTF-8 in a key, control characters too, which XML 1.0
        // cannot carry; without it one such key makes the whole listing unreadable (the SDK's XML
        // parser refuses it), and so every reconcile of the bucket. Keys come back form-encoded.
        let mut req = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .encoding_type(aws_sdk_s3::types::EncodingType::Url)
            .max_keys(max.clamp(1, 1000) as i32);
        if !prefix.is_empty() {
            req = req.prefix(prefix);
        }
        // Keys up to and including `skip_through` are left out here: the part of `start_after`
        // before a character XML cannot carry is sent instead of all of it, because some servers
        // (moto) echo StartAfter unencoded, which makes the answer unreadable.
        let mut skip_through = None;
        match page {
            Some(token) => req = req.continuation_token(token),
            None => {
                if let Some(a) = start_after {
                    let safe =
                        &a[..a.find(|c: char| c.is_control() && !matches!(c, '\t' | '\n' | '\r')).unwrap_or(a.len())];
                    if safe.len() < a.len() {
                        skip_through = Some(a);
                    }
                    if !safe.is_empty() {
                        req = req.start_after(safe);
                    }
                }
            }
        }
        let out = req.send().await.map_err(|e| self.error("ListObjectsV2", "", e))?;
        let objects = out
            .contents()
            .iter()
            .filter_map(|o| {
                let raw = o.key()?;
                // `+` is a space and `%XX` a byte, as botocore reads S3's encoding (moto writes
                // spaces as `%20`, which reads the same).
                let Some(key) = tidemark_core::events::form_urldecode(raw) else {
                    tracing::warn!(bucket = %self.bucket, key = raw, "a listed key is not URL-encoded UTF-8; skipped");
                    return None;
                };
                Some(RemoteObject {
                    key,
                    size: o.size().unwrap_or(0).max(0) as u64,
                    etag: normalize_etag(o.e_tag().unwrap_or_default()),
                    last_modified_ms: ms_of(o.last_modified()),
                    version_id: None,
                    user_metadata: None,
                    headers: None,
                })
            })
            .filter(|o: &RemoteObject| skip_through.is_none_or(|a| o.key.as_str() > a))
            .collect();
        let next =
            if out.is_truncated().unwrap_or(false) { out.next_continuation_token().map(str::to_string) } else { None };
        Ok(ListPage { objects, next })
    }

    async fn get(&self, key: &str, range: Option<ByteRange>, if_etag: Option<&str>) -> Result<ByteStream> {
        let mut req = self.client.get_object().bucket(&self.bucket).key(key);
        if let Some(r) = range {
            req = req.range(match r.length {
                Some(0) => return Ok(futures::stream::empty().boxed()),
                Some(n) => format!("bytes={}-{}", r.offset, r.offset.saturating_add(n - 1)),
                None => format!("bytes={}-", r.offset),
            });
        }
        if let Some(e) = if_etag {
            req = req.if_match(format!("\"{e}\""));
        }
        let out = req.send().await.map_err(|e| self.error("GetObject", key, e))?;
        Ok(body_stream(out.body))
    }

    async fn put(&self, key: &str, body: Bytes, metadata: BTreeMap<String, String>) -> Result<RemoteObject> {
        self.put_with_headers(key, body, metadata, &ObjectHeaders::default()).await
    }

    async fn put_with_headers(
        &self,
        key: &str,
        body: Bytes,
        metadata: BTreeMap<String, String>,
        headers: &ObjectHeaders,
    ) -> Result<RemoteObject> {
        let req = self.client.put_object().bucket(&self.bucket).key(key).body(AwsBody::from(body));
        let req = with_object_headers!(req, headers, metadata);
        req.send().await.map_err(|e| self.error("PutObject", key, e))?;
        self.stat(key)
            .await?
            .ok_or_else(|| Error::internal(format!("s3://{}/{key}: missing right after PutObject", self.bucket)))
    }

    /// The body goes up as a multipart upload: parts of `PART` bytes
    /// (growing, see [`crate::part_size`]: S3's smallest part is 5 MiB, its most parts 10,000),
    /// `PARTS_IN_FLIGHT` at once, in memory only while they are sent; the headers and metadata
    /// are given at its creation. The object appears when the upload is completed; on any
    /// failure it is aborted, and nothing is left.
    async fn put_in_parts(
        &self,
        key: &str,
        mut body: ByteStream,
        size: u64,
        metadata: BTreeMap<String, String>,
        headers: &ObjectHeaders,
    ) -> Result<RemoteObject> {
        let create = self.client.create_multipart_upload().bucket(&self.bucket).key(key);
        let created = with_object_headers!(create, headers, metadata)
            .send()
            .await
            .map_err(|e| self.error("CreateMultipartUpload", key, e))?;
        let upload_id = created.upload_id().unwrap_or_default().to_string();
        let result: Result<()> = async {
            let parts = crate::send_parts(&mut body, size, key, |number, part| {
                let (this, key, upload_id) = (self.clone(), key.to_string(), upload_id.clone());
                async move {
                    let req = this
                        .client
                        .upload_part()
                        .bucket(&this.bucket)
                        .key(&key)
                        .upload_id(upload_id)
                        .part_number(number)
                        .body(AwsBody::from(part));
                    let out = req.send().await.map_err(|e| this.error("UploadPart", &key, e))?;
                    Ok(aws_sdk_s3::types::CompletedPart::builder()
                        .part_number(number)
                        .e_tag(out.e_tag().unwrap_or_default())
                        .build())
                }
            })
            .await?;
            let completed = aws_sdk_s3::types::CompletedMultipartUpload::builder().set_parts(Some(parts)).build();
            self.client
                .complete_multipart_upload()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(&upload_id)
                .multipart_upload(completed)
                .send()
                .await
                .map_err(|e| self.error("CompleteMultipartUpload", key, e))?;
            Ok(())
        }
        .await;
        if let Err(e) = result {
            let abort = self.client.abort_multipart_upload().bucket(&self.bucket).key(key).upload_id(&upload_id);
            if let Err(a) = abort.send().await {
                tracing::warn!(key, error = %aws_sdk_s3::error::DisplayErrorContext(&a), "aborting a failed multipart upload failed; the bucket's lifecycle rule for incomplete uploads removes its parts");
            }
            return Err(e);
        }
        self.stat(key).await?.ok_or_else(|| {
            Error::internal(format!("s3://{}/{key}: missing right after CompleteMultipartUpload", self.bucket))
        })
    }

    /// CopyObject: the bytes stay in the bucket (up to 5 GiB, CopyObject's limit; the caller
    /// copies larger objects through [`RemoteStorage::get`] and a put).
    async fn copy(
        &self,
        from: &str,
        to: &str,
        if_etag: &str,
        metadata: BTreeMap<String, String>,
        headers: &ObjectHeaders,
    ) -> Result<RemoteObject> {
        // S3 enforces `x-amz-copy-source-if-match` itself; some S3-compatible stores ignore it
        // (moto 5 does), so the source's version is checked first too.
        match self.stat(from).await? {
            None => return Err(Error::not_found(format!("s3://{}/{from}", self.bucket))),
            Some(o) if o.etag != if_etag => {
                return Err(Error::PreconditionFailed { path: format!("s3://{}/{from}", self.bucket), current: None });
            }
            Some(_) => {}
        }
        // The copy source is `bucket/key`, the key URL-encoded (S3 decodes it).
        let source = format!("{}/{}", self.bucket, copy_source_key(from));
        let req = self
            .client
            .copy_object()
            .bucket(&self.bucket)
            .key(to)
            .copy_source(source)
            .copy_source_if_match(format!("\"{if_etag}\""))
            .metadata_directive(aws_sdk_s3::types::MetadataDirective::Replace);
        let req = with_object_headers!(req, headers, metadata);
        req.send().await.map_err(|e| self.error("CopyObject", from, e))?;
        self.stat(to)
            .await?
            .ok_or_else(|| Error::internal(format!("s3://{}/{to}: missing right after CopyObject", self.bucket)))
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| self.error("DeleteObject", key, e))?;
        Ok(())
    }
}

/// An object's body as the frames the connection delivers them: no copy, and no 4 KiB pieces
/// (`ReaderStream`'s default, which held a cold read of 256 MiB to ~500 MiB/s).
pub fn body_stream(body: aws_sdk_s3::primitives::ByteStream) -> ByteStream {
    futures::stream::unfold(body, |mut body| async move {
        // The error's causes too: on its own it says only "streaming error".
        let frame = body.next().await?;
        let frame = frame.map_err(|e| std::io::Error::other(aws_sdk_s3::error::DisplayErrorContext(&e).to_string()));
        Some((frame, body))
    })
    .boxed()
}

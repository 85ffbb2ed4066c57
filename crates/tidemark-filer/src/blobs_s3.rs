//! File content on a shared object store (`--blob-store s3://BUCKET/PREFIX?...`): what lets any
//! filer of a cluster read any file, and keeps files readable while the filer that took their
//! write is down.
//!
//! A blob is one object, `PREFIX/blobs/<id>`, named by a random id that is never reused and
//! written whole before the entry that names it commits (the metadata transaction is the only
//! commit point: a crash before it leaves an object nothing names, which the collector removes;
//! never an entry without its bytes). Content up to 8 MiB is one `PutObject`; larger content is
//! a multipart upload whose parts (8 MiB) stream out as the body streams in, four at a time, so
//! memory stays bounded whatever the file's size. Reads are ranged `GetObject`s: a range costs
//! only its bytes. S3-compatible stores (AWS S3, MinIO, Ceph RGW, moto) all serve.

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;

use tidemark_core::remote::{RemoteConf, StorageKind};
use tidemark_core::{ByteRange, ByteStream, Error, Result};

pub use tidemark_cloud::part_size;
use tidemark_cloud::{PART, PARTS_IN_FLIGHT};

use crate::blobs::{BlobPage, Md5Pipe, Stored, StoredContent};

/// `--blob-store s3://BUCKET[/PREFIX][?endpoint=URL&region=R&force_path_style=true]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobStoreUrl {
    pub bucket: String,
    /// `""` or ending in `/`.
    pub prefix: String,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub force_path_style: Option<bool>,
}

impl BlobStoreUrl {
    pub fn parse(s: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::invalid_argument(format!(
                "bad --blob-store {s:?}: {why}; expected s3://BUCKET[/PREFIX][?endpoint=URL&region=REGION]"
            ))
        };
        let rest =
            s.strip_prefix("s3://").ok_or_else(|| bad("only s3:// (S3 and S3-compatible stores) is supported"))?;
        let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, prefix) = location.split_once('/').unwrap_or((location, ""));
        if bucket.is_empty()
            || bucket.len() > 63
            || !bucket.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        {
            return Err(bad("the bucket name is not a valid S3 bucket name"));
        }
        let prefix = prefix.trim_matches('/');
        if prefix.split('/').any(|seg| seg == "." || seg == "..") || prefix.contains("//") {
            return Err(bad("the prefix has a `.`, `..` or empty segment"));
        }
        let mut url = BlobStoreUrl {
            bucket: bucket.to_string(),
            prefix: if prefix.is_empty() { String::new() } else { format!("{prefix}/") },
            endpoint: None,
            region: None,
            force_path_style: None,
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').ok_or_else(|| bad(&format!("{pair:?} is not NAME=VALUE")))?;
            let v = tidemark_core::events::percent_decode(v)
                .ok_or_else(|| bad(&format!("{k}'s value is not URL-encoded UTF-8")))?;
            match k {
                "endpoint" => url.endpoint = Some(v),
                "region" => url.region = Some(v),
                "force_path_style" => url.force_path_style = Some(v == "true"),
                "access_key" | "secret_key" | "session_token" => {
                    return Err(bad(
                        "credentials do not belong in a URL (every user of the machine sees it in `ps`): use the \
                         standard AWS chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, an instance role)",
                    ));
                }
                other => return Err(bad(&format!("unknown setting {other:?} (endpoint, region, force_path_style)"))),
            }
        }
        Ok(url)
    }

    /// Where the cluster's content is, as recorded and compared between filers: the bucket and
    /// the prefix (an endpoint may be reached by other names from other machines).
    pub fn location(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }

    /// The settings of an S3 remote that reaches this store (credentials: the standard chain,
    /// or the explicit ones tests pass).
    fn conf(&self, keys: Option<(&str, &str)>) -> RemoteConf {
        let mut settings = BTreeMap::new();
        for (k, v) in [("endpoint", &self.endpoint), ("region", &self.region)] {
            if let Some(v) = v {
                settings.insert(k.to_string(), v.clone());
            }
        }
        if let Some(p) = self.force_path_style {
            settings.insert("force_path_style".into(), p.to_string());
        }
        if let Some((ak, sk)) = keys {
            settings.insert("access_key".into(), ak.into());
            settings.insert("secret_key".into(), sk.into());
        }
        RemoteConf { name: "blob-store".into(), kind: StorageKind::S3, settings }
    }
}

#[derive(Clone)]
pub struct S3Blobs {
    client: aws_sdk_s3::Client,
    url: BlobStoreUrl,
}

impl std::fmt::Debug for S3Blobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "S3Blobs({})", self.url.location())
    }
}

type SdkError<E> = aws_sdk_s3::error::SdkError<E>;

impl S3Blobs {
    /// Connects to the store and checks that its bucket answers (a clear error at start, not at
    /// the first large write). `keys`: explicit credentials; `None`: the standard AWS chain.
    pub async fn connect(url: &BlobStoreUrl, keys: Option<(&str, &str)>) -> Result<Self> {
        let storage = tidemark_cloud::aws::s3::S3Storage::connect(&url.conf(keys), &url.bucket).await?;
        let blobs = S3Blobs { client: storage.client().clone(), url: url.clone() };
        blobs.client.head_bucket().bucket(&url.bucket).send().await.map_err(|e| {
            match blobs.error("HeadBucket", "", e) {
                // A HEAD has no body to name the error: a 404 is the bucket's.
                Error::NotFound { .. } => Error::Unavailable {
                    message: format!(
                        "the blob store's bucket {:?} does not exist; create it, or fix --blob-store",
                        url.bucket
                    ),
                },
                e => e,
            }
        })?;
        Ok(blobs)
    }

    pub fn url(&self) -> &BlobStoreUrl {
        &self.url
    }

    fn key(&self, id: &str) -> Result<String> {
        if !crate::blobs::valid_id(id) {
            return Err(Error::internal(format!("malformed blob id {id:?} in an entry")));
        }
        Ok(format!("{}blobs/{id}", self.url.prefix))
    }

    /// A store error as one line that says what to fix.
    fn error<E: aws_sdk_s3::error::ProvideErrorMetadata + std::error::Error + 'static>(
        &self,
        op: &str,
        id: &str,
        e: SdkError<E>,
    ) -> Error {
        use aws_sdk_s3::error::ProvideErrorMetadata;
        let target = if id.is_empty() { self.url.location() } else { format!("{}blobs/{id}", self.url.location()) };
        let status = e.raw_response().map(|r| r.status().as_u16());
        let code = e.code().unwrap_or_default().to_string();
        match (&e, status, code.as_str()) {
            (SdkError::DispatchFailure(_) | SdkError::TimeoutError(_), _, _) => Error::Unavailable {
                message: format!(
                    "{op} {target}: the blob store does not answer; check --blob-store's endpoint and the network"
                ),
            },
            (_, _, "NoSuchBucket") => Error::Unavailable {
                message: format!(
                    "{op} {target}: the blob store's bucket {:?} does not exist; create it, or fix --blob-store",
                    self.url.bucket
                ),
            },
            (_, Some(404), _) | (_, _, "NoSuchKey" | "NotFound") => Error::not_found(target),
            (_, Some(401 | 403), _)
            | (_, _, "AccessDenied" | "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "ExpiredToken") => {
                Error::Unavailable {
                    message: format!(
                        "{op} {target} was refused ({code}): check the blob store's credentials (the AWS credential chain of this process)"
                    ),
                }
            }
            _ => Error::Unavailable {
                message: format!("{op} {target}: {code} {}", aws_sdk_s3::error::DisplayErrorContext(&e)),
            },
        }
    }

    /// Writes the rest of a body that outgrew inline content (`head` is what came so far) as
    /// one new object, whole before this returns; on any failure nothing is left behind.
    pub(crate) async fn spill(&self, head: Bytes, mut body: ByteStream, md5: Md5Pipe) -> Result<StoredContent> {
        let id = crate::blobs::new_id()?;
        let key = self.key(&id)?;
        let mut buf = BytesMut::with_capacity(PART);
        buf.extend_from_slice(&head);
        let mut size = head.len() as u64;
        let mut upload: Option<String> = None;
        let mut parts: tokio::task::JoinSet<Result<(i32, String)>> = tokio::task::JoinSet::new();
        let mut done: Vec<(i32, String)> = Vec::new();
        let mut next = 1;
        let result: Result<()> = async {
            let mut ended = false;
            while !ended {
                match body.next().await {
                    Some(chunk) => {
                        let chunk = chunk.map_err(|e| Error::io("reading the request body", e))?;
                        md5.update(&chunk);
                        size += chunk.len() as u64;
                        buf.extend_from_slice(&chunk);
                    }
                    None => ended = true,
                }
                // Full parts go out as they fill; the last one (or a body that never filled
                // one) once the body has ended.
                while buf.len() >= part_size(next) || (ended && upload.is_some() && !buf.is_empty()) {
                    let part = buf.split_to(buf.len().min(part_size(next))).freeze();
                    let upload_id = match &upload {
                        Some(u) => u.clone(),
                        None => {
                            let created = self
                                .client
                                .create_multipart_upload()
                                .bucket(&self.url.bucket)
                                .key(&key)
                                .send()
                                .await
                                .map_err(|e| self.error("CreateMultipartUpload", &id, e))?;
                            let u = created.upload_id().unwrap_or_default().to_string();
                            upload = Some(u.clone());
                            u
                        }
                    };
                    while parts.len() >= PARTS_IN_FLIGHT {
                        done.push(joined(parts.join_next().await)?);
                    }
                    let (client, bucket, key, this, id) =
                        (self.client.clone(), self.url.bucket.clone(), key.clone(), self.clone(), id.clone());
                    let number = next;
                    next += 1;
                    parts.spawn(async move {
                        let out = client
                            .upload_part()
                            .bucket(bucket)
                            .key(key)
                            .upload_id(upload_id)
                            .part_number(number)
                            .body(aws_sdk_s3::primitives::ByteStream::from(part))
                            .send()
                            .await
                            .map_err(|e| this.error("UploadPart", &id, e))?;
                        Ok((number, out.e_tag().unwrap_or_default().to_string()))
                    });
                }
            }
            let Some(upload_id) = &upload else {
                // Small enough for one request.
                self.client
                    .put_object()
                    .bucket(&self.url.bucket)
                    .key(&key)
                    .body(aws_sdk_s3::primitives::ByteStream::from(buf.split().freeze()))
                    .send()
                    .await
                    .map_err(|e| self.error("PutObject", &id, e))?;
                return Ok(());
            };
            while let Some(p) = parts.join_next().await {
                done.push(joined(Some(p))?);
            }
            done.sort_by_key(|(n, _)| *n);
            let completed = aws_sdk_s3::types::CompletedMultipartUpload::builder()
                .set_parts(Some(
                    done.iter()
                        .map(|(n, etag)| {
                            aws_sdk_s3::types::CompletedPart::builder().part_number(*n).e_tag(etag).build()
                        })
                        .collect(),
                ))
                .build();
            self.client
                .complete_multipart_upload()
                .bucket(&self.url.bucket)
                .key(&key)
                .upload_id(upload_id)
                .multipart_upload(completed)
                .send()
                .await
                .map_err(|e| self.error("CompleteMultipartUpload", &id, e))?;
            Ok(())
        }
        .await;
        if let Err(e) = result {
            parts.abort_all();
            if let Some(u) = &upload {
                let _ =
                    self.client.abort_multipart_upload().bucket(&self.url.bucket).key(&key).upload_id(u).send().await;
            }
            return Err(e);
        }
        Ok(StoredContent { stored: Stored::Blob { id, size }, md5: md5.finish().await? })
    }

    /// Streams `range` of a blob. `NotFound` if it is gone.
    pub async fn open_range(&self, id: &str, range: Option<ByteRange>) -> Result<ByteStream> {
        let mut req = self.client.get_object().bucket(&self.url.bucket).key(self.key(id)?);
        if let Some(r) = range {
            req = req.range(match r.length {
                Some(0) => return Ok(futures::stream::empty().boxed()),
                Some(n) => format!("bytes={}-{}", r.offset, r.offset.saturating_add(n - 1)),
                None => format!("bytes={}-", r.offset),
            });
        }
        let out = req.send().await.map_err(|e| self.error("GetObject", id, e))?;
        Ok(tidemark_cloud::aws::s3::body_stream(out.body))
    }

    /// Removes a blob; a missing one is fine.
    pub async fn remove(&self, id: &str) -> Result<()> {
        self.client
            .delete_object()
            .bucket(&self.url.bucket)
            .key(self.key(id)?)
            .send()
            .await
            .map_err(|e| self.error("DeleteObject", id, e))?;
        Ok(())
    }

    /// Writes a blob under a given id (moving a data directory's blobs here).
    pub async fn put_as(&self, id: &str, body: aws_sdk_s3::primitives::ByteStream) -> Result<()> {
        self.client
            .put_object()
            .bucket(&self.url.bucket)
            .key(self.key(id)?)
            .body(body)
            .send()
            .await
            .map_err(|e| self.error("PutObject", id, e))?;
        Ok(())
    }

    /// Whether a blob is there (and its size).
    pub async fn size_of(&self, id: &str) -> Result<Option<u64>> {
        match self.client.head_object().bucket(&self.url.bucket).key(self.key(id)?).send().await {
            Ok(h) => Ok(Some(h.content_length().unwrap_or(0).max(0) as u64)),
            Err(e) => match self.error("HeadObject", id, e) {
                Error::NotFound { .. } => Ok(None),
                e => Err(e),
            },
        }
    }

    /// One page of the blobs held, in id order: `(id, last modified ms)`, and where to go on.
    pub async fn list(&self, page: Option<&str>) -> Result<BlobPage> {
        let prefix = format!("{}blobs/", self.url.prefix);
        let mut req = self.client.list_objects_v2().bucket(&self.url.bucket).prefix(&prefix).max_keys(1000);
        if let Some(p) = page {
            req = req.continuation_token(p);
        }
        let out = req.send().await.map_err(|e| self.error("ListObjectsV2", "", e))?;
        let blobs = out
            .contents()
            .iter()
            .filter_map(|o| {
                let id = o.key()?.strip_prefix(&prefix)?;
                let ms = o.last_modified().and_then(|t| t.to_millis().ok()).unwrap_or(0);
                crate::blobs::valid_id(id).then(|| (id.to_string(), ms))
            })
            .collect();
        let next =
            if out.is_truncated().unwrap_or(false) { out.next_continuation_token().map(str::to_string) } else { None };
        Ok((blobs, next))
    }
}

fn joined(r: Option<std::result::Result<Result<(i32, String)>, tokio::task::JoinError>>) -> Result<(i32, String)> {
    match r {
        Some(Ok(r)) => r,
        Some(Err(e)) => Err(Error::internal(format!("an upload task failed: {e}"))),
        None => Err(Error::internal("no upload task to wait for")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_or_say_what_is_wrong() {
        let u = BlobStoreUrl::parse(
            "s3://my-bucket/tidemark/prod/?endpoint=http%3A%2F%2F127.0.0.1%3A5000&region=eu-west-1",
        )
        .unwrap();
        assert_eq!(
            (u.bucket.as_str(), u.prefix.as_str(), u.endpoint.as_deref(), u.region.as_deref()),
            ("my-bucket", "tidemark/prod/", Some("http://127.0.0.1:5000"), Some("eu-west-1"))
        );
        assert_eq!(u.location(), "s3://my-bucket/tidemark/prod/");
        assert_eq!(BlobStoreUrl::parse("s3://b").unwrap().prefix, "");
        for (bad, says) in [
            ("gs://b", "only s3://"),
            ("s3://", "bucket name"),
            ("s3://Bad_Bucket", "bucket name"),
            ("s3://b/a/../c", "segment"),
            ("s3://b?secret_key=x", "credentials do not belong"),
            ("s3://b?colour=blue", "unknown setting"),
            ("s3://b?endpoint", "NAME=VALUE"),
        ] {
            let e = BlobStoreUrl::parse(bad).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains("--blob-store"), "{bad}: {e}");
        }
    }
}

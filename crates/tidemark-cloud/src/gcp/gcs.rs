//! Cloud Storage as a [`RemoteStorage`], over the JSON API. Object names are sent and listed
//! verbatim (the API lists in lexicographic order). The generation is the version token: it
//! changes with the content, and a read can be conditional on it (`ifGenerationMatch`).

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use serde::Deserialize;

use tidemark_core::remote::{ListPage, ObjectHeaders, RemoteConf, RemoteObject};
use tidemark_core::{ByteRange, ByteStream, Error, RemoteStorage, Result, parse_rfc3339_ms};

use super::auth::{Auth, check, transport};
use crate::{REQUEST_TIMEOUT, STALL_TIMEOUT};

pub const SETTINGS: &[(&str, &str)] = &[
    (
        "endpoint",
        "the Cloud Storage endpoint (default https://storage.googleapis.com; fake-gcs-server: http://127.0.0.1:PORT)",
    ),
    (
        "service_account_json",
        "a Google credentials file (its path, or the JSON): a service account key, an authorized user, an external \
         account (workload identity federation) or an impersonated service account (default: Application Default \
         Credentials — GOOGLE_APPLICATION_CREDENTIALS, gcloud's application-default login, the metadata server)",
    ),
    ("access_token", "an OAuth2 access token, used as given (never refreshed)"),
    (
        "emulator",
        "true: the endpoints are emulators (fake-gcs-server, the Pub/Sub emulator) — no credentials are sent and Pub/Sub \
         is polled as the emulator needs; a custom endpoint alone does not turn credentials off (default false)",
    ),
    (
        "pubsub_endpoint",
        "the Pub/Sub endpoint, for events (default https://pubsub.googleapis.com, or $PUBSUB_EMULATOR_HOST)",
    ),
    ("project", "the Google Cloud project of the Pub/Sub topic and subscription, for events"),
    (
        "resource_manager_endpoint",
        "Cloud Resource Manager, for the project's number when provisioning dead letters (default https://cloudresourcemanager.googleapis.com)",
    ),
];

pub struct GcsStorage {
    http: reqwest::Client,
    endpoint: String,
    bucket: String,
    auth: Auth,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ObjectResource {
    name: String,
    #[serde(default)]
    size: Option<String>,
    #[serde(default)]
    generation: Option<String>,
    #[serde(default)]
    updated: Option<String>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    content_type: Option<String>,
    #[serde(default)]
    content_encoding: Option<String>,
    #[serde(default)]
    content_disposition: Option<String>,
    #[serde(default)]
    content_language: Option<String>,
    #[serde(default)]
    cache_control: Option<String>,
    #[serde(default)]
    storage_class: Option<String>,
    /// Set on an object encrypted with a customer-supplied key (CSEK), whose bytes this
    /// cluster cannot read: its metadata and listing say so.
    #[serde(default)]
    customer_encryption: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ObjectList {
    #[serde(default)]
    items: Vec<ObjectResource>,
    #[serde(default)]
    next_page_token: Option<String>,
}

/// Percent-encodes an object name as one URL path segment (`/` included).
fn encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len() * 3);
    for b in name.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

impl ObjectResource {
    fn into_object(self, with_metadata: bool) -> RemoteObject {
        let generation = self.generation.unwrap_or_default();
        RemoteObject {
            key: self.name,
            size: self.size.and_then(|s| s.parse().ok()).unwrap_or(0),
            etag: generation.clone(),
            last_modified_ms: self.updated.as_deref().and_then(parse_rfc3339_ms).unwrap_or(0),
            version_id: (!generation.is_empty()).then_some(generation),
            user_metadata: with_metadata.then(|| self.metadata.unwrap_or_default()),
            // Listings carry every field too (the default projection).
            headers: Some(ObjectHeaders {
                content_type: self.content_type,
                content_encoding: self.content_encoding,
                content_disposition: self.content_disposition,
                content_language: self.content_language,
                cache_control: self.cache_control,
                expires: None,
                storage_class: self.storage_class,
                restore: None,
                unreadable: self.customer_encryption.is_some().then(|| tidemark_core::remote::CSEK_REASON.to_string()),
            }),
        }
    }
}

impl GcsStorage {
    pub fn open(conf: &RemoteConf, bucket: &str) -> Result<Self> {
        if bucket.is_empty() || bucket.contains('/') {
            return Err(Error::invalid_argument(format!("bad bucket name {bucket:?}")));
        }
        let endpoint = conf.setting("endpoint").map(|e| e.trim_end_matches('/').to_string());
        let auth = Auth::from_conf(conf, super::auth::emulator(conf)?)?;
        // No deadline for a whole request here: a download lasts as long as its object takes
        // (and its reader reads); [`Self::send`] gives every other request one.
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .read_timeout(STALL_TIMEOUT)
            .build()
            .map_err(|e| Error::internal(format!("HTTP client: {e}")))?;
        Ok(GcsStorage {
            http,
            endpoint: endpoint.unwrap_or_else(|| "https://storage.googleapis.com".into()),
            bucket: bucket.into(),
            auth,
        })
    }

    fn object_url(&self, key: &str) -> String {
        format!("{}/storage/v1/b/{}/o/{}", self.endpoint, encode(&self.bucket), encode(key))
    }

    fn target(&self, key: &str) -> String {
        format!("gs://{}/{key}", self.bucket)
    }

    async fn send(&self, rb: reqwest::RequestBuilder, op: &str, target: &str) -> Result<reqwest::Response> {
        self.send_unbounded(rb.timeout(REQUEST_TIMEOUT), op, target).await
    }

    /// [`Self::send`] without its deadline: for a download, which ends only when its reader has
    /// read it all (a stall still ends it: `STALL_TIMEOUT`).
    async fn send_unbounded(&self, rb: reqwest::RequestBuilder, op: &str, target: &str) -> Result<reqwest::Response> {
        let rb = self.auth.apply(rb).await?;
        let resp = rb.send().await.map_err(|e| transport(op, target, &self.endpoint, e))?;
        check(resp, op, target).await
    }

    /// Creates the bucket (tests and set-up).
    pub async fn create_bucket(&self) -> Result<()> {
        let rb =
            self.http.post(format!("{}/storage/v1/b", self.endpoint)).json(&serde_json::json!({"name": self.bucket}));
        self.send(rb, "CreateBucket", &format!("gs://{}", self.bucket)).await.map(|_| ())
    }
}

#[async_trait]
impl RemoteStorage for GcsStorage {
    fn describe(&self) -> String {
        format!("gs://{}", self.bucket)
    }

    async fn stat(&self, key: &str) -> Result<Option<RemoteObject>> {
        let rb = self.http.get(self.object_url(key));
        match self.send(rb, "GetObject", &self.target(key)).await {
            Ok(resp) => {
                let r: ObjectResource = resp
                    .json()
                    .await
                    .map_err(|e| Error::internal(format!("GetObject {key}: unreadable answer ({e})")))?;
                Ok(Some(r.into_object(true)))
            }
            Err(Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn list(&self, prefix: &str, start_after: Option<&str>, page: Option<&str>, max: usize) -> Result<ListPage> {
        let mut q: Vec<(&str, String)> = vec![("maxResults", max.clamp(1, 1000).to_string())];
        if !prefix.is_empty() {
            q.push(("prefix", prefix.to_string()));
        }
        match page {
            Some(t) => q.push(("pageToken", t.to_string())),
            None => {
                if let Some(a) = start_after {
                    // startOffset is inclusive; the filter below drops `a` itself.
                    q.push(("startOffset", a.to_string()));
                }
            }
        }
        let rb = self.http.get(format!("{}/storage/v1/b/{}/o", self.endpoint, encode(&self.bucket))).query(&q);
        let resp = self.send(rb, "ListObjects", &format!("gs://{}", self.bucket)).await?;
        let list: ObjectList =
            resp.json().await.map_err(|e| Error::internal(format!("ListObjects: unreadable answer ({e})")))?;
        let after = start_after.unwrap_or("");
        let objects =
            list.items.into_iter().filter(|o| o.name.as_str() > after).map(|o| o.into_object(false)).collect();
        Ok(ListPage { objects, next: list.next_page_token.filter(|t| !t.is_empty()) })
    }

    async fn get(&self, key: &str, range: Option<ByteRange>, if_etag: Option<&str>) -> Result<ByteStream> {
        let mut rb = self.http.get(self.object_url(key)).query(&[("alt", "media")]);
        if let Some(r) = range {
            rb = rb.header(
                "range",
                match r.length {
                    Some(0) => return Ok(futures::stream::empty().boxed()),
                    Some(n) => format!("bytes={}-{}", r.offset, r.offset.saturating_add(n - 1)),
                    None => format!("bytes={}-", r.offset),
                },
            );
        }
        if let Some(g) = if_etag {
            rb = rb.query(&[("ifGenerationMatch", g)]);
        }
        let resp = self.send_unbounded(rb, "GetObjectMedia", &self.target(key)).await?;
        // Also check the generation served, for servers that ignore ifGenerationMatch.
        if let Some(want) = if_etag
            && let Some(got) = resp.headers().get("x-goog-generation").and_then(|v| v.to_str().ok())
            && got != want
        {
            return Err(Error::PreconditionFailed { path: self.target(key), current: None });
        }
        Ok(resp.bytes_stream().map_err(std::io::Error::other).boxed())
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
        let boundary = "tidemark-multipart-boundary-7d0c5b";
        let meta = object_resource(key, metadata, headers);
        let mut payload = Vec::with_capacity(body.len() + 512);
        // The media part's type too: some servers (fake-gcs-server) take it over the metadata's.
        // A value that could break the framing is sent only in the metadata.
        let media_type =
            headers.content_type.as_deref().filter(|t| !t.contains(['\r', '\n'])).unwrap_or("application/octet-stream");
        payload.extend_from_slice(format!("--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{meta}\r\n--{boundary}\r\nContent-Type: {media_type}\r\n\r\n").as_bytes());
        payload.extend_from_slice(&body);
        payload.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let rb = self
            .http
            .post(format!("{}/upload/storage/v1/b/{}/o", self.endpoint, encode(&self.bucket)))
            .query(&[("uploadType", "multipart")])
            .header("content-type", format!("multipart/related; boundary={boundary}"))
            .body(payload);
        let resp = self.send(rb, "InsertObject", &self.target(key)).await?;
        let r: ObjectResource =
            resp.json().await.map_err(|e| Error::internal(format!("InsertObject {key}: unreadable answer ({e})")))?;
        Ok(r.into_object(true))
    }

    /// The body goes up as a resumable upload: a session begun with the
    /// object's metadata, then its parts in order (`PART` bytes, growing; multiples of 256 KiB
    /// as Cloud Storage wants), one in memory at a time. The object appears when the last part
    /// is taken; a session left unfinished expires (a week).
    async fn put_in_parts(
        &self,
        key: &str,
        mut body: ByteStream,
        size: u64,
        metadata: BTreeMap<String, String>,
        headers: &ObjectHeaders,
    ) -> Result<RemoteObject> {
        let target = self.target(key);
        let begin = self
            .http
            .post(format!("{}/upload/storage/v1/b/{}/o", self.endpoint, encode(&self.bucket)))
            .query(&[("uploadType", "resumable")])
            .header("x-upload-content-length", size)
            .json(&object_resource(key, metadata, headers));
        let begun = self.send(begin, "InsertObject (resumable)", &target).await?;
        let session = begun
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| Error::internal(format!("InsertObject {target}: the resumable upload named no session")))?
            .to_string();
        let (mut taken, mut buf, mut number) = (0u64, bytes::BytesMut::new(), 0i32);
        loop {
            let want = crate::part_size(number + 1);
            let Some(part) = tidemark_core::remote::next_part(&mut body, &mut buf, want, &mut taken, size, key).await?
            else {
                return Err(tidemark_core::remote::wrong_length(key, size, taken));
            };
            number += 1;
            let start = taken - part.len() as u64;
            let last = taken == size;
            if !last && part.len() < want {
                return Err(tidemark_core::remote::wrong_length(key, size, taken));
            }
            let rb = self
                .http
                .put(&session)
                .header("content-range", format!("bytes {start}-{}/{size}", taken - 1))
                .body(part)
                .timeout(crate::REQUEST_TIMEOUT);
            let rb = self.auth.apply(rb).await?;
            let resp = rb.send().await.map_err(|e| transport("InsertObject (part)", &target, &self.endpoint, e))?;
            // 308: the part taken, more to come.
            if !last && resp.status().as_u16() == 308 {
                continue;
            }
            let resp = check(resp, "InsertObject (part)", &target).await?;
            if !last {
                return Err(Error::internal(format!("InsertObject {target}: the upload ended before its last part")));
            }
            let r: ObjectResource = resp
                .json()
                .await
                .map_err(|e| Error::internal(format!("InsertObject {key}: unreadable answer ({e})")))?;
            return Ok(r.into_object(true));
        }
    }

    async fn delete(&self, key: &str) -> Result<()> {
        match self.send(self.http.delete(self.object_url(key)), "DeleteObject", &self.target(key)).await {
            Ok(_) | Err(Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// An object's resource as an upload gives it: its name, metadata and headers.
fn object_resource(key: &str, metadata: BTreeMap<String, String>, headers: &ObjectHeaders) -> serde_json::Value {
    let mut meta = serde_json::json!({"name": key, "metadata": metadata});
    for (field, value) in [
        ("contentType", &headers.content_type),
        ("contentEncoding", &headers.content_encoding),
        ("contentDisposition", &headers.content_disposition),
        ("contentLanguage", &headers.content_language),
        ("cacheControl", &headers.cache_control),
    ] {
        if let Some(v) = value {
            meta[field] = serde_json::Value::String(v.clone());
        }
    }
    meta
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An object encrypted with a customer-supplied key says so in its metadata and listing
    /// (`customerEncryption`): its headers carry the reason it cannot be read here.
    #[test]
    fn a_customer_encrypted_object_is_unreadable() {
        let doc = r#"{"name":"a","size":"3","generation":"7","customerEncryption":{"encryptionAlgorithm":"AES256","keySha256":"k"}}"#;
        let o: ObjectResource = serde_json::from_str(doc).unwrap();
        let headers = o.into_object(true).headers.unwrap();
        assert_eq!(headers.unreadable.as_deref(), Some(tidemark_core::remote::CSEK_REASON));
        let plain: ObjectResource = serde_json::from_str(r#"{"name":"a","size":"3","generation":"7"}"#).unwrap();
        assert_eq!(plain.into_object(true).headers.unwrap().unreadable, None);
    }
}

//! A small Azure Storage REST client: Shared Key signing, a SAS token or a Microsoft Entra ID
//! bearer token ([`super::identity`]), the `x-ms-*` headers, and error bodies turned into Tidemark errors that say what to fix.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use sha2::Sha256;

use tidemark_core::remote::RemoteConf;
use tidemark_core::{Error, Result};

use super::identity::{self, Entra, STORAGE_SCOPE, Way};
use crate::{REQUEST_TIMEOUT, STALL_TIMEOUT};

pub const API_VERSION: &str = "2021-08-06";

/// Percent-encodes a blob or queue name for a URL path (keeping `/`). A `.` or `..` segment is
/// encoded too, so no HTTP layer can "normalise" it away and address another blob.
pub fn encode_path(name: &str) -> String {
    let segments: Vec<String> = name
        .split('/')
        .map(|seg| if seg == "." || seg == ".." { seg.replace('.', "%2E") } else { encode_segment(seg) })
        .collect();
    segments.join("/")
}

fn encode_segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

pub fn encode_query(v: &str) -> String {
    encode_segment(v).replace('/', "%2F")
}

#[derive(Clone)]
enum Auth {
    SharedKey(Vec<u8>),
    Sas(String),
    /// Bearer tokens for Azure Storage's audience (the API version sent, 2021-08-06, takes them:
    /// OAuth needs 2017-11-09 or later).
    Entra(Entra),
}

/// One storage service endpoint (blob or queue) of one account.
#[derive(Clone)]
pub struct AzureClient {
    http: reqwest::Client,
    account: String,
    /// `https://acct.blob.core.windows.net` or `http://127.0.0.1:10000/devstoreaccount1`.
    endpoint: String,
    /// The path part of the endpoint (`/devstoreaccount1` for Azurite), part of what is signed.
    base_path: String,
    auth: Auth,
    pub remote: String,
}

impl AzureClient {
    /// `service` is `blob` or `queue`; the endpoint comes from `{service}_endpoint`, else the
    /// account's public endpoint.
    pub fn new(conf: &RemoteConf, service: &str) -> Result<Self> {
        let account = conf.setting("account").ok_or_else(|| {
            Error::invalid_argument(format!(
                "remote {:?} has no -azure.account: set the storage account name",
                conf.name
            ))
        })?;
        let endpoint = conf
            .setting(&format!("{service}_endpoint"))
            .map(|e| e.trim_end_matches('/').to_string())
            .unwrap_or_else(|| format!("https://{account}.{service}.core.windows.net"));
        let url = reqwest::Url::parse(&endpoint)
            .map_err(|e| Error::invalid_argument(format!("bad -azure.{service}_endpoint {endpoint:?}: {e}")))?;
        let base_path = url.path().trim_end_matches('/').to_string();
        // No deadline for a whole request here: a download lasts as long as its blob takes (and
        // its reader reads); [`Self::send`] gives every other request one.
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .read_timeout(STALL_TIMEOUT)
            .build()
            .map_err(|e| Error::internal(format!("HTTP client: {e}")))?;
        let way = identity::data_plane_way(conf)?;
        let auth = match way {
            Way::SharedKey => {
                Auth::SharedKey(STANDARD.decode(identity::required(conf, "account_key", way)?).map_err(|_| {
                    Error::invalid_argument(format!("remote {:?}: -azure.account_key is not base64", conf.name))
                })?)
            }
            Way::Sas => Auth::Sas(identity::required(conf, "sas_token", way)?.trim_start_matches('?').to_string()),
            _ => Auth::Entra(Entra::new(conf, way, http.clone())?),
        };
        Ok(AzureClient { http, account: account.to_string(), endpoint, base_path, auth, remote: conf.name.clone() })
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// How this client signs its requests.
    pub fn way(&self) -> Way {
        match &self.auth {
            Auth::SharedKey(_) => Way::SharedKey,
            Auth::Sas(_) => Way::Sas,
            Auth::Entra(e) => e.way,
        }
    }

    /// A signed request for `path` (already encoded, starting with `/`) and `query` pairs.
    pub fn request(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        headers: &[(&str, String)],
        content_length: u64,
    ) -> RequestBuilder {
        let mut q: Vec<(String, String)> = query.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        let mut url = format!("{}{path}", self.endpoint);
        let mut sas_query = String::new();
        if let Auth::Sas(sas) = &self.auth {
            sas_query = sas.clone();
        }
        let qs: Vec<String> = q
            .iter()
            .map(|(k, v)| format!("{k}={}", encode_query(v)))
            .chain((!sas_query.is_empty()).then_some(sas_query))
            .collect();
        if !qs.is_empty() {
            url.push('?');
            url.push_str(&qs.join("&"));
        }
        let date = httpdate::fmt_http_date(SystemTime::now());
        let mut x_ms: BTreeMap<String, String> = BTreeMap::new();
        x_ms.insert("x-ms-date".into(), date);
        x_ms.insert("x-ms-version".into(), API_VERSION.into());
        let mut std_headers: BTreeMap<String, String> = BTreeMap::new();
        for (k, v) in headers {
            let k = k.to_ascii_lowercase();
            if k.starts_with("x-ms-") {
                x_ms.insert(k, v.clone());
            } else {
                std_headers.insert(k, v.clone());
            }
        }
        let mut rb = self.http.request(method.clone(), &url);
        for (k, v) in x_ms.iter().chain(std_headers.iter()) {
            rb = rb.header(k, v);
        }
        if let Auth::SharedKey(key) = &self.auth {
            let h = |n: &str| std_headers.get(n).cloned().unwrap_or_default();
            let length = if content_length == 0 { String::new() } else { content_length.to_string() };
            let canonical_headers: String = x_ms.iter().map(|(k, v)| format!("{k}:{}\n", v.trim())).collect();
            q.sort();
            let mut resource = format!("/{}{}{path}", self.account, self.base_path);
            for (k, v) in &q {
                resource.push_str(&format!("\n{}:{v}", k.to_ascii_lowercase()));
            }
            let to_sign = format!(
                "{}\n{}\n{}\n{length}\n{}\n{}\n\n{}\n{}\n{}\n{}\n{}\n{canonical_headers}{resource}",
                method.as_str(),
                h("content-encoding"),
                h("content-language"),
                h("content-md5"),
                h("content-type"),
                h("if-modified-since"),
                h("if-match"),
                h("if-none-match"),
                h("if-unmodified-since"),
                h("range"),
            );
            if let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) {
                mac.update(to_sign.as_bytes());
                let sig = STANDARD.encode(mac.finalize().into_bytes());
                rb = rb.header("authorization", format!("SharedKey {}:{sig}", self.account));
            }
        }
        rb
    }

    /// Sends; a non-success answer becomes an error naming `op` and `target`.
    pub async fn send(&self, rb: RequestBuilder, op: &str, target: &str) -> Result<Response> {
        self.send_unbounded(rb.timeout(REQUEST_TIMEOUT), op, target).await
    }

    /// [`Self::send`] without its deadline: for a download, which ends only when its reader has
    /// read it all (a stall still ends it: `STALL_TIMEOUT`).
    pub async fn send_unbounded(&self, rb: RequestBuilder, op: &str, target: &str) -> Result<Response> {
        let rb = match &self.auth {
            Auth::Entra(entra) => rb.bearer_auth(entra.token(STORAGE_SCOPE).await?),
            _ => rb,
        };
        let resp = rb.send().await.map_err(|e| {
            let mut cause: &dyn std::error::Error = &e;
            while let Some(inner) = cause.source() {
                cause = inner;
            }
            Error::Unavailable {
                message: format!(
                    "{op} {target}: cannot reach {} ({cause}); check the remote's endpoint",
                    self.endpoint
                ),
            }
        })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let code = resp.headers().get("x-ms-error-code").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let body = resp.text().await.unwrap_or_default();
        let message = body
            .split("<Message>")
            .nth(1)
            .and_then(|m| m.split("</Message>").next())
            .unwrap_or("")
            .lines()
            .next()
            .unwrap_or("")
            .to_string();
        Err(match (status, code.as_str()) {
            (StatusCode::NOT_FOUND, "ContainerNotFound" | "QueueNotFound") => {
                Error::NotFound { path: format!("{target} ({code}: check the name in the remote's configuration)") }
            }
            (StatusCode::NOT_FOUND, _) => Error::not_found(target),
            (StatusCode::PRECONDITION_FAILED, _) | (_, "ConditionNotMet") => {
                Error::PreconditionFailed { path: target.into(), current: None }
            }
            (_, "BlobArchived") => Error::Archived { path: target.into(), storage_class: "Archive".into() },
            // Refused for good, with the reason (Azure names it in `x-ms-error-code`, a HEAD too).
            (_, "BlobUsesCustomerSpecifiedEncryption") => {
                Error::Unreadable { path: target.into(), reason: tidemark_core::remote::CPK_REASON.into() }
            }
            (_, c) if c.starts_with("KeyVault") => Error::Unreadable {
                path: target.into(),
                reason: format!("{} ({code}: {message})", tidemark_core::remote::KMS_DENIED_REASON),
            },
            (StatusCode::FORBIDDEN, _) | (StatusCode::UNAUTHORIZED, _) => Error::Unauthorized {
                message: format!(
                    "{op} {target} was refused ({code}: {message}); check {} of remote {:?}",
                    self.way().what_to_check(),
                    self.remote
                ),
            },
            (s, _) if s.is_server_error() => {
                Error::Unavailable { message: format!("{op} {target}: Azure answered {s} {code} {message}") }
            }
            (s, _) => Error::internal(format!("{op} {target}: Azure answered {s} {code} {message}")),
        })
    }
}

/// RFC 1123 dates in Azure's headers and listings, as milliseconds since the epoch.
pub fn parse_http_date_ms(s: &str) -> Option<i64> {
    let t = httpdate::parse_http_date(s).ok()?;
    Some(t.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_encoded_for_urls() {
        assert_eq!(encode_path("a b/ü+%.txt"), "a%20b/%C3%BC%2B%25.txt");
        assert_eq!(encode_path("x/../y/./z"), "x/%2E%2E/y/%2E/z");
        assert_eq!(encode_query("a/b c"), "a%2Fb%20c");
        assert_eq!(parse_http_date_ms("Thu, 01 Jan 1970 00:00:01 GMT"), Some(1000));
    }
}

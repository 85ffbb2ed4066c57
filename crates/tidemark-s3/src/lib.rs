//! The S3 gateway: the directories under `/buckets` served as S3 buckets, for boto3, the AWS CLI,
//! rclone and every other S3 client. Built on the `s3s` crate (request parsing, routing, SigV4
//! and presigned URLs, S3's XML and errors); this crate supplies the operations
//! ([`gateway::Gateway`], each a few calls on the filer's API), the key <-> path rules
//! ([`names`]), the listing walk ([`list`]), multipart staging ([`multipart`]), tags
//! ([`tagging`]) and who may do what ([`identity`], [`auth`]).

pub mod acl;
pub mod auth;
mod body;
pub mod checksum;
pub mod cors;
pub mod gateway;
pub mod identity;
pub mod lifecycle;
pub mod list;
pub mod multipart;
pub mod names;
pub mod policy;
pub mod sse;
pub mod tagging;
pub mod versioning;

use std::net::SocketAddr;
use std::sync::Arc;

use s3s::service::{S3Service, S3ServiceBuilder};

use tidemark_core::Filer;

/// The gateway's S3 service, and what runs beside it while it serves (the lifecycle sweep).
#[derive(Clone)]
pub struct Service {
    s3: S3Service,
    gateway: gateway::Gateway,
}

/// The gateway's S3 service over `filer`. `loopback`: it listens on loopback only, so the
/// development key works while no key is configured. `keyring`: the keys of SSE-S3 and SSE-KMS
/// (without one, only SSE-C is honoured and the others are refused).
pub fn service(filer: Arc<dyn Filer>, loopback: bool, keyring: Option<sse::Keyring>) -> Service {
    let shared = Arc::new(auth::Shared::new(filer.clone(), loopback));
    let gateway = gateway::Gateway::new(filer, shared.clone(), keyring.map(Arc::new));
    let mut b = S3ServiceBuilder::new(gateway.clone());
    b.set_auth(auth::Auth(shared.clone()));
    b.set_access(auth::Access(shared));
    Service { s3: b.build(), gateway }
}

/// Carries out the buckets' lifecycle rules, hourly (or five times a shortened day). Every
/// gateway of a cluster sweeps; each delete is conditional on the version it saw, so two
/// sweeps never delete a write made since.
async fn lifecycle_sweeps(gateway: gateway::Gateway) {
    let day = lifecycle::day_ms();
    let mut tick = tokio::time::interval(lifecycle::sweep_every(day));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        match gateway.sweep_lifecycle(now, day).await {
            Ok((0, 0)) => {}
            Ok((expired, aborted)) => tracing::info!(expired, aborted, "lifecycle: objects expired, uploads aborted"),
            Err(e) => tracing::warn!(error = %e, "lifecycle sweep failed; it runs again next time"),
        }
        match gateway.sweep_staged(now).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, "staged versions left by a gateway that stopped were removed"),
            Err(e) => tracing::warn!(error = %e, "the sweep of staged versions failed; it runs again next time"),
        }
    }
}

/// The configured identities (none yet: empty), as the gateway's start-up checks read them.
async fn identities(filer: &dyn Filer) -> Result<identity::Identities, String> {
    Ok(tidemark_engine::docs::read_json::<identity::Identities>(filer, identity::IDENTITIES)
        .await
        .map_err(|e| format!("cannot read the S3 identities ({}): {e}", identity::IDENTITIES))?
        .map(|(d, _)| d)
        .unwrap_or_default())
}

/// Refuses to serve with masked secrets: a gateway given the operators' admin token while the
/// filer has a cluster token reads every S3 secret as `****...`, and would refuse every request.
pub async fn check_secrets(filer: &dyn Filer) -> Result<(), String> {
    let ids = identities(filer).await?;
    if ids.identities.iter().flat_map(|i| &i.credentials).any(|k| k.secret_key.starts_with("****")) {
        return Err(
            "the filer shows this gateway the S3 secrets masked: give the gateway the filer's --cluster-token as its --token"
                .into(),
        );
    }
    Ok(())
}

/// Refuses an address beyond loopback unless keys are configured (checked at start; keys can
/// only be added later, and the development key never works beyond loopback).
pub async fn check_bind(addr: SocketAddr, filer: &dyn Filer) -> Result<(), String> {
    if addr.ip().is_loopback() {
        return Ok(());
    }
    if identities(filer).await?.has_keys() {
        Ok(())
    } else {
        Err(format!(
            "the S3 gateway would listen on {addr}, beyond loopback, with no access keys configured: \
             create one first (`tidemark shell -c 's3.configure -user=NAME -access_key=... -secret_key=... -actions=Read,Write,List,Admin -apply'`) \
             or listen on 127.0.0.1"
        ))
    }
}

/// The largest error body given a `RequestId` (S3's error documents are a few hundred bytes).
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Every answer carries `x-amz-request-id`, and an error document its `RequestId`, as S3's do:
/// what a client logs and quotes when it reports a failure (s3s leaves both out).
async fn with_request_id(mut resp: hyper::Response<s3s::Body>) -> hyper::Response<s3s::Body> {
    let id = tidemark_core::ids::random_hex(8, "a request id").unwrap_or_default().to_ascii_uppercase();
    let Ok(value) = hyper::header::HeaderValue::from_str(&id) else { return resp };
    resp.headers_mut().insert("x-amz-request-id", value);
    let xml = resp.headers().get(hyper::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().ends_with(b"xml"));
    if resp.status().as_u16() < 400 || !xml {
        return resp;
    }
    let Ok(body) = resp.body_mut().store_all_limited(MAX_ERROR_BODY).await else { return resp };
    let mut text = String::from_utf8_lossy(&body).into_owned();
    if let Some(refused) = failed_post_condition(&text) {
        text = refused;
        *resp.status_mut() = hyper::StatusCode::FORBIDDEN;
    }
    let Some(end) = text.rfind("</Error>").filter(|_| !text.contains("<RequestId>")) else {
        resp.headers_mut().insert(hyper::header::CONTENT_LENGTH, hyper::header::HeaderValue::from(text.len()));
        *resp.body_mut() = s3s::Body::from(text);
        return resp;
    };
    let with_id = format!("{}<RequestId>{id}</RequestId>{}", &text[..end], &text[end..]);
    resp.headers_mut().insert(hyper::header::CONTENT_LENGTH, hyper::header::HeaderValue::from(with_id.len()));
    *resp.body_mut() = s3s::Body::from(with_id);
    resp
}

/// A POST form that fails a condition of its policy is refused as S3 refuses it — 403
/// `AccessDenied`, "Invalid according to Policy: Policy Condition failed" — where s3s answers 400
/// `InvalidPolicyDocument` (which S3 keeps for a policy it cannot read). The error document to
/// answer instead, if `text` is such a failure.
fn failed_post_condition(text: &str) -> Option<String> {
    if !text.contains("<Code>InvalidPolicyDocument</Code>") {
        return None;
    }
    let start = text.find("<Message>")? + "<Message>".len();
    let message = &text[start..start + text[start..].find("</Message>")?];
    let lower = message.to_ascii_lowercase();
    if !(lower.contains("condition") && lower.contains("failed")) {
        return None;
    }
    Some(format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AccessDenied</Code><Message>Invalid according to Policy: {message}</Message></Error>"
    ))
}

/// GetObjectAttributes answers its ETag without quotes (AWS does; s3s writes every ETag quoted).
async fn unquoted_etag(mut resp: hyper::Response<s3s::Body>) -> hyper::Response<s3s::Body> {
    // 1,000 parts (the most one answer lists) are about 80 KiB.
    let Ok(body) = resp.body_mut().store_all_limited(1 << 20).await else { return resp };
    let text = String::from_utf8_lossy(&body);
    let fixed = match (text.find("<ETag>\""), text.find("\"</ETag>")) {
        (Some(a), Some(b)) if a < b => format!("{}<ETag>{}</ETag>{}", &text[..a], &text[a + 7..b], &text[b + 8..]),
        _ => text.into_owned(),
    };
    resp.headers_mut().insert(hyper::header::CONTENT_LENGTH, hyper::header::HeaderValue::from(fixed.len()));
    *resp.body_mut() = s3s::Body::from(fixed);
    resp
}

/// The largest XML body the gateway reads (s3s's `xml_max_body_size`): a CompleteMultipartUpload
/// of 10,000 parts is about 1 MiB.
const MAX_XML_BODY: u64 = 20 << 20;

/// Query keys whose request carries an XML document rather than an object's bytes: on a POST
/// (CompleteMultipartUpload, DeleteObjects, RestoreObject) or a PUT of a configuration.
const XML_POST: [&str; 3] = ["uploadId", "delete", "restore"];
const XML_PUT: [&str; 19] = [
    "acl",
    "cors",
    "tagging",
    "lifecycle",
    "policy",
    "versioning",
    "website",
    "replication",
    "logging",
    "notification",
    "encryption",
    "ownershipControls",
    "publicAccessBlock",
    "accelerate",
    "requestPayment",
    "object-lock",
    "legal-hold",
    "retention",
    "intelligent-tiering",
];

/// A request declaring an XML body larger than the gateway reads: `MaxMessageLengthExceeded`
/// (400) before a byte of it is read. (s3s would read up to its limit and then answer 500: the
/// error of the limit it hits is not the one it looks for.)
fn oversized_xml<B>(req: &hyper::Request<B>) -> Option<hyper::Response<s3s::Body>> {
    let len: u64 = req.headers().get(hyper::header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()?;
    if len <= MAX_XML_BODY {
        return None;
    }
    let keys: Vec<&str> =
        req.uri().query().unwrap_or("").split('&').map(|kv| kv.split('=').next().unwrap_or("")).collect();
    let xml = match *req.method() {
        hyper::Method::POST => keys.iter().any(|k| XML_POST.contains(k)),
        hyper::Method::PUT => keys.iter().any(|k| XML_PUT.contains(k)),
        _ => false,
    };
    if !xml {
        return None;
    }
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>MaxMessageLengthExceeded</Code><Message>a request document of {len} bytes; at most {MAX_XML_BODY}</Message></Error>"
    );
    hyper::Response::builder()
        .status(400)
        .header(hyper::header::CONTENT_TYPE, "application/xml")
        .header(hyper::header::CONTENT_LENGTH, body.len())
        .header(hyper::header::CONNECTION, "close")
        .body(s3s::Body::from(body))
        .ok()
}

/// A SigV2-signed request for a bucket (`/BUCKET`, no key) with the path it was signed for.
/// SigV2's canonical resource for a bucket is `/BUCKET/` (AWS's rule, which botocore and every
/// SigV2 client follow); s3s signs the path as sent, so every such request failed with
/// SignatureDoesNotMatch. `/BUCKET/` routes as `/BUCKET` does.
fn sigv2_bucket_path<B>(mut req: hyper::Request<B>) -> hyper::Request<B> {
    let header_v2 = req.headers().get(hyper::header::AUTHORIZATION).is_some_and(|a| a.as_bytes().starts_with(b"AWS "));
    let query = req.uri().query().unwrap_or("");
    let presigned_v2 = query.split('&').any(|kv| kv.starts_with("AWSAccessKeyId="));
    let path = req.uri().path();
    if !(header_v2 || presigned_v2) || path.len() < 2 || path[1..].contains('/') {
        return req;
    }
    let fixed = if query.is_empty() { format!("{path}/") } else { format!("{path}/?{query}") };
    if let Ok(pq) = hyper::http::uri::PathAndQuery::try_from(fixed) {
        let mut parts = req.uri().clone().into_parts();
        parts.path_and_query = Some(pq);
        if let Ok(uri) = hyper::Uri::from_parts(parts) {
            *req.uri_mut() = uri;
        }
    }
    req
}

/// The bucket a path-style request names (`/BUCKET/...`).
fn bucket_of(path: &str) -> Option<&str> {
    path.strip_prefix('/')?.split('/').next().filter(|b| !b.is_empty())
}

/// An S3 error document as an answer of its own (a preflight's, which s3s never sees).
fn answer(status: u16, code: &str, message: &str) -> hyper::Response<s3s::Body> {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>{message}</Message></Error>"
    );
    let mut resp = hyper::Response::new(s3s::Body::from(body.clone()));
    *resp.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_REQUEST);
    resp.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/xml"));
    resp.headers_mut().insert(hyper::header::CONTENT_LENGTH, hyper::header::HeaderValue::from(body.len()));
    resp
}

fn header_str<'a>(h: &'a hyper::HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

fn add_headers(resp: &mut hyper::Response<s3s::Body>, headers: Vec<(&'static str, String)>) {
    for (k, v) in headers {
        if let Ok(v) = hyper::header::HeaderValue::from_str(&v) {
            resp.headers_mut().insert(k, v);
        }
    }
}

/// A CORS preflight (`OPTIONS`), answered from the bucket's rules alone, as S3 answers it: no
/// credentials are asked for (a browser sends none with a preflight).
async fn preflight(
    gateway: &gateway::Gateway,
    bucket: Option<&str>,
    h: &hyper::HeaderMap,
) -> hyper::Response<s3s::Body> {
    let (Some(origin), Some(method)) = (header_str(h, "origin"), header_str(h, "access-control-request-method")) else {
        return answer(400, "BadRequest", "Insufficient information. Origin request header needed.");
    };
    let Some(bucket) = bucket else {
        return answer(403, "AccessForbidden", "CORSResponse: a preflight names a bucket");
    };
    let config = match gateway.bucket_cors(bucket).await {
        Err(()) => return answer(404, "NoSuchBucket", "The specified bucket does not exist"),
        Ok(None) => return answer(403, "AccessForbidden", "CORSResponse: CORS is not enabled for this bucket."),
        Ok(Some(c)) => c,
    };
    let asked = cors::Asked {
        origin: origin.to_string(),
        method: method.to_string(),
        headers: header_str(h, "access-control-request-headers").map(cors::Asked::headers_of).unwrap_or_default(),
    };
    match cors::rule_for(&config, &asked) {
        None => answer(
            403,
            "AccessForbidden",
            "CORSResponse: This CORS request is not allowed. This is usually because the evalution of Origin, request method / Access-Control-Request-Method or Access-Control-Request-Headers are not whitelisted by the resource's CORS spec.",
        ),
        Some(rule) => {
            let mut resp = hyper::Response::new(s3s::Body::empty());
            resp.headers_mut().insert(hyper::header::CONTENT_LENGTH, hyper::header::HeaderValue::from(0));
            add_headers(&mut resp, cors::headers(rule, &asked, true));
            resp
        }
    }
}

/// The `Access-Control-*` headers of an answer to a request from `origin`, if the bucket's rules
/// allow it (whatever the answer: a browser reads a 404 only with them).
async fn cors_headers(
    gateway: &gateway::Gateway,
    bucket: &str,
    origin: &str,
    method: &str,
) -> Vec<(&'static str, String)> {
    let Ok(Some(config)) = gateway.bucket_cors(bucket).await else { return Vec::new() };
    let asked = cors::Asked { origin: origin.to_string(), method: method.to_string(), headers: Vec::new() };
    cors::rule_for(&config, &asked).map(|r| cors::headers(r, &asked, false)).unwrap_or_default()
}

/// Serves `service` on `listener` until `shutdown` resolves, then lets requests in flight finish
/// (at most 10 s); plain HTTP (see [`serve_tls`]).
pub async fn serve(
    listener: tokio::net::TcpListener,
    service: Service,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> std::io::Result<()> {
    serve_tls(listener, service, None, shutdown).await
}

/// [`serve`], over HTTPS when `tls` is given.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    service: Service,
    tls: Option<tidemark_http::tls::TlsAcceptor>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let gateway = service.gateway.clone();
    let sweeps = tokio::spawn(lifecycle_sweeps(service.gateway));
    let service = service.s3;
    let guarded = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let svc = service.clone();
        let gateway = gateway.clone();
        async move {
            let req = sigv2_bucket_path(req);
            let bucket = bucket_of(req.uri().path()).map(str::to_string);
            if req.method() == hyper::Method::OPTIONS {
                return Ok(with_request_id(preflight(&gateway, bucket.as_deref(), req.headers()).await).await);
            }
            // A request from a web page: the method its rule must allow (a preflight's
            // `Access-Control-Request-Method` if the page sends one along).
            let cross = match (header_str(req.headers(), "origin"), &bucket) {
                (Some(o), Some(b)) => {
                    let method =
                        header_str(req.headers(), "access-control-request-method").unwrap_or(req.method().as_str());
                    Some((o.to_string(), b.clone(), method.to_string()))
                }
                _ => None,
            };
            let has_body = req.headers().get(hyper::header::CONTENT_LENGTH).is_some_and(|v| v.as_bytes() != b"0")
                || req.headers().contains_key(hyper::header::TRANSFER_ENCODING);
            if let Some(refused) = oversized_xml(&req) {
                return Ok::<_, s3s::HttpError>(with_request_id(refused).await);
            }
            let attributes = req.method() == hyper::Method::GET
                && req.uri().query().is_some_and(|q| q.split('&').any(|kv| kv.split('=').next() == Some("attributes")));

            let mut resp = hyper::service::Service::call(&svc, req).await?;
            // An error may answer before the body was read; this connection cannot be
            // trusted to hold the next request where the client thinks it starts.
            if has_body && !resp.status().is_success() {
                resp.headers_mut().insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
            }
            if attributes && resp.status().is_success() {
                resp = unquoted_etag(resp).await;
            }
            if let Some((origin, bucket, method)) = cross {
                add_headers(&mut resp, cors_headers(&gateway, &bucket, &origin, &method).await);
            }
            Ok::<_, s3s::HttpError>(with_request_id(resp).await)
        }
    });
    let served = tidemark_http::serve(listener, guarded, tidemark_http::Limits::default(), tls, shutdown).await;
    sweeps.abort();
    served
}

//! S3's refusal of objects encrypted with a customer-provided key (SSE-C), in front of moto,
//! which stores such objects but serves them to anyone. A test double for that one rule of S3's
//! (Amazon S3 User Guide, "Using server-side encryption with customer-provided keys (SSE-C)":
//! a GET or HEAD of such an object must carry the key, else S3 answers 400): every request passes
//! to moto unchanged, and the double remembers which objects were last written with
//! `x-amz-server-side-encryption-customer-algorithm`. A HEAD of one without
//! `x-amz-server-side-encryption-customer-key` is answered 400 with no body (a HEAD has none), a
//! GET 400 `InvalidRequest` with S3's message. A plain PUT or a DELETE of the key forgets it.
//! Path-style requests only (`-s3.force_path_style`, the default with an endpoint).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};

struct Shared {
    upstream: String,
    http: reqwest::Client,
    /// `/bucket/key` paths (as sent) last written with a customer-provided key.
    encrypted: Mutex<HashSet<String>>,
}

/// The double, serving on `endpoint` until dropped.
pub struct SseCProxy {
    pub endpoint: String,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// S3's message for a read of an SSE-C object without its key.
pub const SSE_C_MESSAGE: &str = "The object was stored using a form of Server Side Encryption. The correct parameters must be provided to retrieve the object.";

impl SseCProxy {
    /// In front of the S3 endpoint `upstream` (moto's URL).
    pub fn start(upstream: &str) -> SseCProxy {
        let shared = Arc::new(Shared {
            upstream: upstream.trim_end_matches('/').to_string(),
            http: reqwest::Client::new(),
            encrypted: Mutex::default(),
        });
        let app = axum::Router::new().fallback(handle).with_state(shared);
        let (endpoint, stop) = crate::doubles::serve_in_thread(app, None);
        SseCProxy { endpoint, _stop: stop }
    }
}

async fn handle(State(s): State<Arc<Shared>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let path_and_query = req.uri().path_and_query().map_or_else(|| path.clone(), |pq| pq.as_str().to_string());
    let object_op = !req.uri().query().is_some_and(|q| q.contains("uploads") || q.contains("uploadId"));
    let headers = req.headers().clone();
    let has = |name: &str| headers.contains_key(name);
    if matches!(method, Method::GET | Method::HEAD)
        && !has("x-amz-server-side-encryption-customer-key")
        && s.encrypted.lock().unwrap().contains(&path)
    {
        if method == Method::HEAD {
            return StatusCode::BAD_REQUEST.into_response();
        }
        let body = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>InvalidRequest</Code><Message>{SSE_C_MESSAGE}</Message></Error>"
        );
        return (StatusCode::BAD_REQUEST, [("content-type", "application/xml")], body).into_response();
    }
    let body = match axum::body::to_bytes(req.into_body(), 256 << 20).await {
        Ok(b) => b,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("unreadable body: {e}")).into_response(),
    };
    let mut rb = s.http.request(method.clone(), format!("{}{path_and_query}", s.upstream)).body(body);
    for (k, v) in &headers {
        if !matches!(k.as_str(), "host" | "content-length" | "connection" | "transfer-encoding") {
            rb = rb.header(k, v);
        }
    }
    let resp = match rb.send().await {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_GATEWAY, format!("moto is unreachable: {e}")).into_response(),
    };
    let status = resp.status();
    if status.is_success() && object_op {
        let mut enc = s.encrypted.lock().unwrap();
        match method {
            Method::PUT if has("x-amz-server-side-encryption-customer-algorithm") => {
                enc.insert(path.clone());
            }
            Method::PUT | Method::DELETE => {
                enc.remove(&path);
            }
            _ => {}
        }
    }
    let mut out = Response::builder().status(status.as_u16());
    for (k, v) in resp.headers() {
        // A HEAD's Content-Length is the object's size, not this (empty) body's.
        let length = k.as_str() == "content-length" && method != Method::HEAD;
        if !length && !matches!(k.as_str(), "connection" | "transfer-encoding") {
            out = out.header(k, v);
        }
    }
    let bytes = resp.bytes().await.unwrap_or_default();
    out.body(Body::from(bytes)).unwrap_or_else(|e| (StatusCode::BAD_GATEWAY, e.to_string()).into_response())
}

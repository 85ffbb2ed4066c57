//! The filer's HTTP/JSON API, versioned under `/api/v1/`. Every error is a JSON
//! [`ErrorBody`](tidemark_core::error::ErrorBody) whose `code` names the problem, with a status
//! that says who must act: 4xx the caller, 5xx the filer.
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | `/api/v1/health` | liveness and the store's last sequence number |
//! | GET | `/api/v1/entry?path=` | one entry (404 if absent) |
//! | DELETE | `/api/v1/entry?path=&recursive=&if_version=` | delete |
//! | GET | `/api/v1/list?dir=&start_after=&limit=` | children, byte order |
//! | GET | `/api/v1/scan?dir=&start_after=&limit=` | descendants, byte order |
//! | GET | `/api/v1/count?dir=` | how many entries lie below `dir` |
//! | GET | `/api/v1/content?path=` (+ `Range: bytes=a-b`) | stream content; the entry in `x-tidemark-entry` |
//! | PUT | `/api/v1/content?path=&if_version=&if_absent=&mode=&mtime_ms=&origin=` (+ `x-tidemark-extended`) | stream a file in |
//! | POST | `/api/v1/apply` | the conditional, fenced transaction (`Txn` JSON) |
//! | POST | `/api/v1/lease/{acquire,renew,release}`, GET `/api/v1/lease?name=` | leases |
//! | GET | `/api/v1/changes?after=&limit=&wait_ms=` | the change log, long-polling |
//! | POST | `/api/v1/cache/status` (`{"paths": [...]}`) | what is cached of each path |
//! | POST | `/api/v1/cache/fetch?path=&wait=` | cache a remote-backed file (`remote.cache`) |
//! | POST | `/api/v1/cache/drop?path=` | drop its cached bytes (`remote.uncache`) |
//! | GET | `/api/v1/cache/stats` | the cache's counters, use and budget |
//! | GET | `/api/v1/content/local?path=` | the file on the filer's machine holding the bytes, or `null` |
//! | GET | `/metrics` | the same as Prometheus text |

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, FromRequestParts, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};

use tidemark_core::error::ErrorBody;
use tidemark_core::model::{Fence, Origin, Precondition, Txn, TxnBatch, TxnOutcome};
use tidemark_core::{ByteRange, DeleteOptions, Error, Filer, WriteOptions};

use crate::scope::{AdminScope, DataScope};

/// On a content PUT: the extended attributes that replace the entry's (base64 of a JSON object).
pub const EXTENDED_HEADER: &str = "x-tidemark-extended";
/// A write's body holds only the file's data ranges this header names
/// ([`Sparse::to_header`](tidemark_core::sparse::Sparse::to_header)).
pub const SPARSE_HEADER: &str = "x-tidemark-sparse";

/// The most bytes of extended attributes a write may carry.
pub const MAX_EXTENDED_BYTES: usize = 8 * 1024;

/// Decodes an [`EXTENDED_HEADER`] value; the error says what was wrong.
pub fn decode_extended(raw: &[u8]) -> Result<std::collections::BTreeMap<String, String>, String> {
    if raw.len() > MAX_EXTENDED_BYTES * 4 / 3 + 4 {
        return Err(format!("{EXTENDED_HEADER} is larger than {MAX_EXTENDED_BYTES} bytes"));
    }
    let json = base64::engine::general_purpose::STANDARD
        .decode(raw)
        .map_err(|e| format!("{EXTENDED_HEADER} is not base64: {e}"))?;
    serde_json::from_slice(&json).map_err(|e| format!("{EXTENDED_HEADER} is not a JSON object of strings: {e}"))
}

pub const ENTRY_HEADER: &str = "x-tidemark-entry";
pub const DEFAULT_PAGE: usize = 1000;
pub const MAX_PAGE: usize = 10_000;
/// The longest a change-log long poll waits.
pub const MAX_WAIT_MS: u64 = 60_000;

/// An error on its way to the client.
pub struct ApiError(pub Error);

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        ApiError(e)
    }
}

pub fn status_of(e: &Error) -> StatusCode {
    match e {
        Error::NotFound { .. } => StatusCode::NOT_FOUND,
        Error::PreconditionFailed { .. } => StatusCode::PRECONDITION_FAILED,
        Error::Fenced { .. }
        | Error::LeaseHeld { .. }
        | Error::NotADirectory { .. }
        | Error::IsADirectory { .. }
        | Error::DirectoryNotEmpty { .. }
        | Error::CrossMount { .. } => StatusCode::CONFLICT,
        Error::InvalidPath { .. } | Error::InvalidArgument { .. } => StatusCode::BAD_REQUEST,
        Error::RangeNotSatisfiable { .. } => StatusCode::RANGE_NOT_SATISFIABLE,
        Error::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
        Error::Archived { .. } | Error::Unreadable { .. } => StatusCode::FORBIDDEN,
        Error::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        Error::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = status_of(&self.0);
        if status.is_server_error() {
            tracing::error!(error = %self.0, "request failed");
        }
        let unsatisfiable = match &self.0 {
            Error::RangeNotSatisfiable { size, .. } => Some(format!("bytes */{size}")),
            _ => None,
        };
        let mut resp = (status, Json(ErrorBody::from(self.0))).into_response();
        if let Some(v) = unsatisfiable.and_then(|v| HeaderValue::from_str(&v).ok()) {
            resp.headers_mut().insert(header::CONTENT_RANGE, v);
        }
        resp
    }
}

type ApiResult<T> = Result<T, ApiError>;

fn bad_request(message: String) -> ApiError {
    ApiError(Error::InvalidArgument { message })
}

/// Unwraps a query string, turning axum's plain-text rejection into our JSON error.
fn query<T>(q: Result<Query<T>, QueryRejection>) -> ApiResult<T> {
    q.map(|Query(t)| t).map_err(|r| bad_request(format!("bad query string: {}", r.body_text())))
}

fn json<T>(j: Result<Json<T>, JsonRejection>) -> ApiResult<T> {
    j.map(|Json(t)| t).map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            bad_request(format!("the request body is too large ({}); send less at once", r.body_text()))
        } else {
            bad_request(format!("bad JSON body: {}", r.body_text()))
        }
    })
}

/// The credentials the API accepts. Without any, every request may do everything (the
/// loopback default of a bare `filer`). With `admin`, requests must carry `Authorization: Bearer
/// TOKEN`: the admin token may do everything, each `data` token what [`DataScope`] allows (the
/// namespace outside `/etc/tidemark/`). With a `cluster` token too, only it reads the secrets in
/// system documents (workers, the S3 gateway); the admin token reads them masked
/// ([`AdminScope`]). A `cluster` token without an admin token is `tidemark server`'s default:
/// every request may do everything, the secrets masked, except one carrying the cluster token
/// (kept in `cluster_file`, which the health answer names so that the machine's owner finds it).
#[derive(Clone, Debug, Default)]
pub struct Tokens {
    pub admin: Option<String>,
    pub data: Vec<String>,
    pub cluster: Option<String>,
    pub cluster_file: Option<String>,
}

impl Tokens {
    /// One admin token (or none), no data tokens.
    pub fn admin(token: Option<String>) -> Self {
        Tokens { admin: token.filter(|t| !t.is_empty()), ..Default::default() }
    }

    /// Data or cluster tokens without an admin token would leave the control plane open to
    /// anyone without a token; tokens must differ from each other.
    pub fn check(&self) -> Result<(), Error> {
        if (!self.data.is_empty() || self.cluster.is_some()) && self.admin.is_none() {
            return Err(Error::invalid_argument(
                "--data-token and --cluster-token need --token too: the admin's token, for the control plane (/etc/tidemark/, leases)",
            ));
        }
        let mut all: Vec<&String> = self.data.iter().chain(&self.admin).chain(&self.cluster).collect();
        let n = all.len();
        all.sort();
        all.dedup();
        if all.len() != n || all.iter().any(|t| t.is_empty()) {
            return Err(Error::invalid_argument(
                "--token, --cluster-token and each --data-token must be non-empty and differ",
            ));
        }
        Ok(())
    }
}

/// Which credential a request carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Everything, secrets included (the cluster token; or the admin token when there is none).
    Cluster,
    /// Everything, secrets masked.
    Admin,
    Data,
}

#[derive(Clone)]
struct AppState {
    filer: Arc<dyn Filer>,
    admin: Arc<dyn Filer>,
    data: Arc<dyn Filer>,
    tokens: Arc<Tokens>,
    /// The socket this router is also served on, for `Health::socket`.
    socket: Option<Arc<str>>,
}

/// The filer a request may use, by the role `authorize` found: the filer itself for the cluster
/// (or the only) token, [`AdminScope`] for the admin token beside a cluster token, [`DataScope`]
/// for a data token.
struct Access(Arc<dyn Filer>);

impl FromRequestParts<AppState> for Access {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> Result<Self, ApiError> {
        match parts.extensions.get::<Role>() {
            Some(Role::Cluster) => Ok(Access(s.filer.clone())),
            Some(Role::Admin) => Ok(Access(s.admin.clone())),
            Some(Role::Data) => Ok(Access(s.data.clone())),
            None => Err(ApiError(Error::internal("a request reached a handler without being authorized"))),
        }
    }
}

/// The API router over any `Filer`. With a token, every request must carry
/// `Authorization: Bearer <token>`.
pub fn router(filer: Arc<dyn Filer>, token: Option<String>) -> Router {
    router_with(filer, Tokens::admin(token))
}

/// The API router, accepting `tokens`.
pub fn router_with(filer: Arc<dyn Filer>, tokens: Tokens) -> Router {
    router_beside(filer, tokens, None)
}

/// The API router, accepting `tokens`, whose health names the `socket` it is also served on.
fn router_beside(filer: Arc<dyn Filer>, tokens: Tokens, socket: Option<&Path>) -> Router {
    let data: Arc<dyn Filer> = Arc::new(DataScope::new(filer.clone()));
    let admin: Arc<dyn Filer> = Arc::new(AdminScope::new(filer.clone()));
    let socket = socket.map(|p| Arc::from(p.display().to_string()));
    let state = AppState { filer, admin, data, tokens: Arc::new(tokens), socket };
    Router::new()
        .route("/api/v1/health", get(health))
        .route("/api/v1/entry", get(stat).delete(delete))
        .route("/api/v1/list", get(list))
        .route("/api/v1/scan", get(scan))
        .route("/api/v1/count", get(count))
        .route("/api/v1/content", get(read).put(write).layer(DefaultBodyLimit::disable()))
        .route("/api/v1/apply", post(apply))
        // A batch of up to MAX_BATCH transactions; inline content makes it large.
        .route("/api/v1/apply-many", post(apply_many).layer(DefaultBodyLimit::max(MAX_BATCH_BODY)))
        .route("/api/v1/entries", post(stat_many))
        .route("/api/v1/lease", get(lease_get))
        .route("/api/v1/lease/acquire", post(lease_acquire))
        .route("/api/v1/lease/renew", post(lease_renew))
        .route("/api/v1/lease/release", post(lease_release))
        .route("/api/v1/changes", get(changes))
        .route("/api/v1/cache/status", post(cache_status))
        .route("/api/v1/cache/fetch", post(cache_fetch))
        .route("/api/v1/cache/drop", post(cache_drop))
        .route("/api/v1/cache/stats", get(cache_stats))
        .route("/api/v1/content/local", get(local_file))
        .route("/metrics", get(metrics))
        .fallback(|| async { ApiError(Error::NotFound { path: "no such API endpoint; see /api/v1/health".into() }) })
        .method_not_allowed_fallback(|| async {
            (
                StatusCode::METHOD_NOT_ALLOWED,
                Json(ErrorBody::from(Error::invalid_argument("method not allowed on this endpoint"))),
            )
        })
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .with_state(state)
}

/// The request's bearer token ("" without one).
fn bearer(req: &Request) -> &str {
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("")
}

async fn authorize(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let role = match &state.tokens.admin {
        None => match &state.tokens.cluster {
            None => Some(Role::Cluster),
            // The open default of `tidemark server`: only the cluster token reads secrets whole.
            Some(cluster) => Some(if tidemark_http::constant_time_eq(bearer(&req).as_bytes(), cluster.as_bytes()) {
                Role::Cluster
            } else {
                Role::Admin
            }),
        },
        Some(admin) => {
            let given = bearer(&req);
            // Every token is compared, whichever matches, so the time taken says nothing.
            let is_admin = tidemark_http::constant_time_eq(given.as_bytes(), admin.as_bytes());
            let is_data = state
                .tokens
                .data
                .iter()
                .fold(false, |m, d| m | tidemark_http::constant_time_eq(given.as_bytes(), d.as_bytes()));
            let is_cluster = state
                .tokens
                .cluster
                .as_ref()
                .is_some_and(|c| tidemark_http::constant_time_eq(given.as_bytes(), c.as_bytes()));
            match (is_cluster, is_admin, is_data) {
                (true, _, _) => Some(Role::Cluster),
                // Without a cluster token the admin's is the cluster's.
                (_, true, _) if state.tokens.cluster.is_none() => Some(Role::Cluster),
                (_, true, _) => Some(Role::Admin),
                (_, _, true) => Some(Role::Data),
                _ => None,
            }
        }
    };
    let Some(role) = role else {
        return ApiError(Error::Unauthorized {
            message: "missing or wrong token: pass --token or set TIDEMARK_TOKEN to the filer's token".into(),
        })
        .into_response();
    };
    req.extensions_mut().insert(role);
    next.run(req).await
}

/// Refuses to expose the filer beyond this machine without a token.
pub fn check_bind(addr: SocketAddr, token: Option<&str>) -> Result<(), Error> {
    if !addr.ip().is_loopback() && token.is_none_or(str::is_empty) {
        return Err(Error::invalid_argument(format!(
            "refusing to listen on {addr} without a token: anyone who can reach it could change the namespace; \
             pass --token (or TIDEMARK_TOKEN), or bind 127.0.0.1"
        )));
    }
    Ok(())
}

async fn health(State(s): State<AppState>, Access(f): Access) -> ApiResult<impl IntoResponse> {
    let mut h = f.health().await?;
    h.cluster_token_file = s.tokens.cluster_file.clone();
    h.instance = instance().map(str::to_string);
    h.socket = s.socket.as_deref().map(str::to_string);
    Ok(Json(h))
}

#[derive(Deserialize)]
struct PathQuery {
    path: String,
}

#[derive(Deserialize)]
struct StatQuery {
    path: String,
    /// `Filer::describe` rather than `stat`: a remote-backed entry from a listing learns its
    /// object's headers first.
    #[serde(default)]
    describe: bool,
}

async fn stat(Access(f): Access, q: Result<Query<StatQuery>, QueryRejection>) -> ApiResult<impl IntoResponse> {
    let q = query(q)?;
    let entry = if q.describe { f.describe(&q.path).await? } else { f.stat(&q.path).await? };
    Ok(Json(entry.ok_or_else(|| Error::not_found(&q.path))?))
}

#[derive(Deserialize)]
struct DeleteQuery {
    path: String,
    #[serde(default)]
    recursive: bool,
    if_version: Option<u64>,
    #[serde(default)]
    dir_times: bool,
}

async fn delete(Access(f): Access, q: Result<Query<DeleteQuery>, QueryRejection>) -> ApiResult<impl IntoResponse> {
    let q = query(q)?;
    let precondition = q.if_version.map_or(Precondition::Any, Precondition::Version);
    Ok(Json(f.delete(&q.path, DeleteOptions { recursive: q.recursive, precondition, dir_times: q.dir_times }).await?))
}

#[derive(Deserialize)]
struct ListQuery {
    dir: String,
    start_after: Option<String>,
    limit: Option<usize>,
}

impl ListQuery {
    fn limit(&self) -> ApiResult<usize> {
        match self.limit.unwrap_or(DEFAULT_PAGE) {
            0 => Err(bad_request("limit must be at least 1".into())),
            n if n > MAX_PAGE => Err(bad_request(format!("limit must be at most {MAX_PAGE}"))),
            n => Ok(n),
        }
    }
}

async fn list(Access(f): Access, q: Result<Query<ListQuery>, QueryRejection>) -> ApiResult<impl IntoResponse> {
    let q = query(q)?;
    Ok(Json(f.list(&q.dir, q.start_after.as_deref(), q.limit()?).await?))
}

async fn scan(Access(f): Access, q: Result<Query<ListQuery>, QueryRejection>) -> ApiResult<impl IntoResponse> {
    let q = query(q)?;
    Ok(Json(f.scan(&q.dir, q.start_after.as_deref(), q.limit()?).await?))
}

#[derive(Deserialize)]
struct CountQuery {
    dir: String,
    except: Option<String>,
}

async fn count(Access(f): Access, q: Result<Query<CountQuery>, QueryRejection>) -> ApiResult<impl IntoResponse> {
    let q = query(q)?;
    Ok(Json(f.count(&q.dir, q.except.as_deref()).await?))
}

/// Parses `Range: bytes=a-b` / `bytes=a-` (one range; suffix ranges are not supported).
pub fn parse_range(v: &str) -> Result<ByteRange, Error> {
    let bad =
        || Error::invalid_argument(format!("unsupported Range header {v:?}: use bytes=START-END or bytes=START-"));
    let spec = v.trim().strip_prefix("bytes=").ok_or_else(bad)?;
    let (a, b) = spec.split_once('-').ok_or_else(bad)?;
    let start: u64 = a.trim().parse().map_err(|_| bad())?;
    let length = match b.trim() {
        "" => None,
        end => {
            let end: u64 = end.parse().map_err(|_| bad())?;
            if end < start {
                return Err(bad());
            }
            // bytes=0-18446744073709551615 asks for everything: saturate rather than overflow.
            Some((end - start).saturating_add(1))
        }
    };
    Ok(ByteRange { offset: start, length })
}

/// The entry as the content response carries it (base64 of its JSON, in `ENTRY_HEADER`).
fn entry_header(entry: &tidemark_core::model::Entry) -> ApiResult<HeaderValue> {
    let json = serde_json::to_vec(entry).map_err(Error::internal)?;
    Ok(HeaderValue::from_str(&base64::engine::general_purpose::STANDARD.encode(json)).map_err(Error::internal)?)
}

async fn read(
    Access(f): Access,
    headers: HeaderMap,
    q: Result<Query<PathQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let q = query(q)?;
    let range = match headers.get(header::RANGE) {
        Some(v) => Some(parse_range(v.to_str().map_err(|_| bad_request("Range header is not ASCII".into()))?)?),
        None => None,
    };
    let (entry, stream) = f.read(&q.path, range).await?;
    if let Some(r) = range
        && r.offset >= entry.size
    {
        // A range starting at the end selects no byte: 416 (RFC 9110 §14.1.1), with the entry, so
        // the filer's own client can still answer a read at end of file with nothing.
        let header = entry_header(&entry)?;
        let mut resp =
            ApiError(Error::RangeNotSatisfiable { path: q.path, offset: r.offset, size: entry.size }).into_response();
        resp.headers_mut().insert(ENTRY_HEADER, header);
        return Ok(resp);
    }
    let header = entry_header(&entry)?;
    let mut resp = Response::new(Body::from_stream(stream));
    if range.is_some() {
        *resp.status_mut() = StatusCode::PARTIAL_CONTENT;
    }
    let h = resp.headers_mut();
    // What the bucket (or the gateway's PUT) said of the object, as S3 would answer.
    let o = tidemark_core::model::object_attrs::headers(&entry.extended);
    let content_type = o.content_type.as_deref().and_then(|v| HeaderValue::from_str(v).ok());
    h.insert(header::CONTENT_TYPE, content_type.unwrap_or(HeaderValue::from_static("application/octet-stream")));
    for (name, value) in [
        (header::CONTENT_ENCODING, &o.content_encoding),
        (header::CONTENT_DISPOSITION, &o.content_disposition),
        (header::CONTENT_LANGUAGE, &o.content_language),
        (header::CACHE_CONTROL, &o.cache_control),
        (header::EXPIRES, &o.expires),
    ] {
        if let Some(v) = value.as_deref().and_then(|v| HeaderValue::from_str(v).ok()) {
            h.insert(name, v);
        }
    }
    h.insert(ENTRY_HEADER, header);
    match range {
        Some(r) => {
            let len = r.length.map_or(entry.size - r.offset, |n| n.min(entry.size - r.offset));
            let last = (r.offset + len).saturating_sub(1);
            let value = format!("bytes {}-{}/{}", r.offset, last, entry.size);
            h.insert(header::CONTENT_RANGE, HeaderValue::from_str(&value).map_err(Error::internal)?);
            h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        }
        None => {
            h.insert(header::CONTENT_LENGTH, HeaderValue::from(entry.size));
        }
    }
    Ok(resp)
}

#[derive(Deserialize)]
struct WriteQuery {
    path: String,
    if_version: Option<u64>,
    #[serde(default)]
    if_absent: bool,
    mode: Option<u32>,
    mtime_ms: Option<i64>,
    origin: Option<Origin>,
    uid: Option<u32>,
    gid: Option<u32>,
    #[serde(default)]
    dir_times: bool,
}

async fn write(
    Access(f): Access,
    q: Result<Query<WriteQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<impl IntoResponse> {
    let q = query(q)?;
    let precondition = match (q.if_version, q.if_absent) {
        (Some(_), true) => return Err(bad_request("if_version and if_absent exclude each other".into())),
        (Some(v), false) => Precondition::Version(v),
        (None, true) => Precondition::Absent,
        (None, false) => Precondition::Any,
    };
    let extended = match headers.get(EXTENDED_HEADER) {
        None => None,
        Some(h) => Some(decode_extended(h.as_bytes()).map_err(bad_request)?),
    };
    let sparse = match headers.get(SPARSE_HEADER) {
        None => None,
        Some(h) => {
            let v = h.to_str().map_err(|_| bad_request(format!("{SPARSE_HEADER} is not text")))?;
            Some(tidemark_core::sparse::Sparse::parse(v)?)
        }
    };
    let opts = WriteOptions {
        precondition,
        mode: q.mode,
        mtime_ms: q.mtime_ms,
        origin: q.origin.unwrap_or(Origin::Local),
        extended,
        declared_len: headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()),
        uid: q.uid,
        gid: q.gid,
        dir_times: q.dir_times,
        sparse,
    };
    let idle = tidemark_core::filer::body_idle_limit();
    // Whether the write failed because the body stalled: that is the client's 408, not our 500.
    let stalled = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = stalled.clone();
    let stream =
        tidemark_core::filer::idle_limited(Box::pin(body.into_data_stream().map_err(std::io::Error::other)), idle)
            .inspect_err(move |e| {
                if e.kind() == std::io::ErrorKind::TimedOut {
                    seen.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            });
    match f.write(&q.path, Box::pin(stream), opts).await {
        Ok(e) => Ok(Json(e).into_response()),
        Err(_) if stalled.load(std::sync::atomic::Ordering::Relaxed) => {
            let e = Error::InvalidArgument {
                message: format!(
                    "{}: the request body sent nothing for {} s; nothing was stored, send it again",
                    q.path,
                    idle.as_secs()
                ),
            };
            Ok((StatusCode::REQUEST_TIMEOUT, [(header::CONNECTION, "close")], Json(ErrorBody::from(e))).into_response())
        }
        Err(e) => Err(e.into()),
    }
}

async fn apply(Access(f): Access, j: Result<Json<Txn>, JsonRejection>) -> ApiResult<impl IntoResponse> {
    Ok(Json(f.apply(json(j)?).await?))
}

/// The largest body `apply-many` takes: a full batch of entries with room for some inline content.
pub const MAX_BATCH_BODY: usize = 16 * 1024 * 1024;

/// One outcome per transaction, in order; an error status only when the whole batch failed
/// (its fence, its shape, the store).
async fn apply_many(Access(f): Access, j: Result<Json<TxnBatch>, JsonRejection>) -> ApiResult<impl IntoResponse> {
    let results = f.apply_many(json(j)?).await?;
    Ok(Json(results.into_iter().map(TxnOutcome::from).collect::<Vec<_>>()))
}

#[derive(Serialize, Deserialize)]
pub struct PathsRequest {
    pub paths: Vec<String>,
}

/// The store refuses more than `MAX_BATCH` paths, naming the limit.
async fn stat_many(Access(f): Access, j: Result<Json<PathsRequest>, JsonRejection>) -> ApiResult<impl IntoResponse> {
    Ok(Json(f.stat_many(&json(j)?.paths).await?))
}

#[derive(Serialize, Deserialize)]
pub struct AcquireRequest {
    pub name: String,
    pub holder: String,
    pub ttl_ms: u64,
}

#[derive(Serialize, Deserialize)]
pub struct RenewRequest {
    pub fence: Fence,
    pub ttl_ms: u64,
}

#[derive(Serialize, Deserialize)]
pub struct ReleaseRequest {
    pub fence: Fence,
}

#[derive(Deserialize)]
struct NameQuery {
    name: String,
}

async fn lease_get(Access(f): Access, q: Result<Query<NameQuery>, QueryRejection>) -> ApiResult<impl IntoResponse> {
    let q = query(q)?;
    Ok(Json(f.lease_get(&q.name).await?))
}

async fn lease_acquire(
    Access(f): Access,
    j: Result<Json<AcquireRequest>, JsonRejection>,
) -> ApiResult<impl IntoResponse> {
    let r = json(j)?;
    Ok(Json(f.lease_acquire(&r.name, &r.holder, Duration::from_millis(r.ttl_ms)).await?))
}

async fn lease_renew(Access(f): Access, j: Result<Json<RenewRequest>, JsonRejection>) -> ApiResult<impl IntoResponse> {
    let r = json(j)?;
    Ok(Json(f.lease_renew(&r.fence, Duration::from_millis(r.ttl_ms)).await?))
}

async fn lease_release(
    Access(f): Access,
    j: Result<Json<ReleaseRequest>, JsonRejection>,
) -> ApiResult<impl IntoResponse> {
    let r = json(j)?;
    f.lease_release(&r.fence).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
struct ChangesQuery {
    #[serde(default)]
    after: u64,
    limit: Option<usize>,
    #[serde(default)]
    wait_ms: u64,
}

async fn changes(Access(f): Access, q: Result<Query<ChangesQuery>, QueryRejection>) -> ApiResult<impl IntoResponse> {
    let q = query(q)?;
    // Up to `limit` records: a larger ask gets a page of MAX_PAGE (the store is not asked to
    // gather an unbounded one).
    let limit = q.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE);
    // A long poll ends within a minute whatever is asked: a client cannot hold a connection (and
    // a waiter) for ever; followers simply ask again.
    let wait = Duration::from_millis(q.wait_ms.min(MAX_WAIT_MS));
    Ok(Json(f.changes(q.after, limit, wait).await?))
}

#[derive(Serialize, Deserialize)]
pub struct CacheStatusRequest {
    pub paths: Vec<String>,
}

/// The most paths one status request may name.
pub const MAX_STATUS_PATHS: usize = MAX_PAGE;

async fn cache_status(
    Access(f): Access,
    j: Result<Json<CacheStatusRequest>, JsonRejection>,
) -> ApiResult<impl IntoResponse> {
    let r = json(j)?;
    if r.paths.len() > MAX_STATUS_PATHS {
        return Err(bad_request(format!("at most {MAX_STATUS_PATHS} paths per request")));
    }
    Ok(Json(f.cache_status(&r.paths).await?))
}

#[derive(Deserialize)]
struct FetchQuery {
    path: String,
    #[serde(default = "yes")]
    wait: bool,
}

fn yes() -> bool {
    true
}

async fn cache_fetch(Access(f): Access, q: Result<Query<FetchQuery>, QueryRejection>) -> ApiResult<impl IntoResponse> {
    let q = query(q)?;
    Ok(Json(f.cache_fetch(&q.path, q.wait).await?))
}

async fn cache_drop(Access(f): Access, q: Result<Query<PathQuery>, QueryRejection>) -> ApiResult<impl IntoResponse> {
    let q = query(q)?;
    Ok(Json(f.cache_drop(&q.path).await?))
}

async fn local_file(Access(f): Access, q: Result<Query<PathQuery>, QueryRejection>) -> ApiResult<impl IntoResponse> {
    let q = query(q)?;
    Ok(Json(f.local_file(&q.path).await?))
}

async fn cache_stats(Access(f): Access) -> ApiResult<impl IntoResponse> {
    Ok(Json(f.cache_stats().await?))
}

async fn metrics(Access(f): Access) -> ApiResult<Response> {
    let stats = f.cache_stats().await?;
    let body = crate::metrics::render(&stats).map_err(Error::internal)?;
    let mut resp = Response::new(Body::from(body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    Ok(resp)
}

/// Serves the API on `listener` until `shutdown` resolves, then finishes the requests in flight.
pub async fn serve(
    listener: tokio::net::TcpListener,
    filer: Arc<dyn Filer>,
    token: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, filer, Tokens::admin(token), None, shutdown).await
}

/// [`serve`], accepting `tokens`, over HTTPS with `tls`.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    filer: Arc<dyn Filer>,
    tokens: Tokens,
    tls: Option<tidemark_http::tls::TlsAcceptor>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_beside(listener, None, filer, tokens, tls, shutdown).await
}

/// [`serve_with`], and the same API on `socket` (plain HTTP: the socket is this user's alone),
/// which its health names; the socket's file is removed when serving ends.
pub async fn serve_beside(
    listener: tokio::net::TcpListener,
    socket: Option<Socket>,
    filer: Arc<dyn Filer>,
    tokens: Tokens,
    tls: Option<tidemark_http::tls::TlsAcceptor>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use futures::FutureExt;
    let router = router_beside(filer, tokens, socket.as_ref().map(Socket::path));
    let shutdown = shutdown.shared();
    let limits = tidemark_http::Limits::default();
    let tcp = tidemark_http::serve(listener, tidemark_http::tower(router.clone()), limits, tls, shutdown.clone());
    let Some(Socket { listener: unix, file }) = socket else { return tcp.await };
    let unix = tidemark_http::serve(unix, tidemark_http::tower(router), limits, None, shutdown);
    let (tcp, unix) = tokio::join!(tcp, unix);
    drop(file);
    tcp.and(unix)
}

/// The name of the filer's socket in its data directory.
pub const SOCKET_FILE: &str = "filer.sock";

/// The filer's API on a Unix socket in its data directory (`DATA_DIR/filer.sock`, mode 0600),
/// for the clients on its machine: one that finds it in the filer's health, may connect to it
/// (its user's own) and sees the same `Health::instance` there talks to the filer over it, which
/// takes the kernel less CPU per byte than loopback TCP (see `HttpFiler::through_socket`).
pub struct Socket {
    listener: tokio::net::UnixListener,
    file: SocketFile,
}

/// Removes the socket's file when the filer stops serving it.
struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = remove_socket(&self.0);
    }
}

impl Socket {
    /// Binds `DATA_DIR/filer.sock`, replacing one a filer that stopped left behind: the data
    /// directory's `LOCK`, which this process holds, says no other filer serves there. Bound
    /// under another name and renamed once its mode is 0600, so no other user ever connects.
    pub fn bind(data_dir: &Path) -> Result<Socket, Error> {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::path::absolute(data_dir).map_err(|e| Error::io(format!("{}", data_dir.display()), e))?;
        let path = dir.join(SOCKET_FILE);
        let fresh = dir.join(format!("{SOCKET_FILE}.new"));
        let failed = |what: &str, at: &Path, e: std::io::Error| Error::io(format!("{what} {}", at.display()), e);
        remove_socket(&fresh).map_err(|e| failed("replacing", &fresh, e))?;
        remove_socket(&path).map_err(|e| failed("replacing", &path, e))?;
        let listener = std::os::unix::net::UnixListener::bind(&fresh).map_err(|e| failed("binding", &fresh, e))?;
        std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| failed("securing", &fresh, e))?;
        std::fs::rename(&fresh, &path).map_err(|e| failed("placing", &path, e))?;
        listener.set_nonblocking(true).map_err(|e| failed("binding", &path, e))?;
        let listener = tokio::net::UnixListener::from_std(listener).map_err(|e| failed("binding", &path, e))?;
        Ok(Socket { listener, file: SocketFile(path) })
    }

    pub fn path(&self) -> &Path {
        &self.file.0
    }
}

/// Removes the socket at `path`, if there is one; anything else there is left, and said.
fn remove_socket(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path),
        Ok(_) => Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "not a socket, so not the filer's to remove; move it away",
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// This filer process's id (`Health::instance`), random once per process; `None` if the
/// system gave no randomness (clients then do not use the socket).
fn instance() -> Option<&'static str> {
    static ID: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ID.get_or_init(|| tidemark_core::ids::random_hex(16, "the filer's instance id").ok()).as_deref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-9").unwrap(), ByteRange { offset: 0, length: Some(10) });
        assert_eq!(parse_range("bytes=5-").unwrap(), ByteRange { offset: 5, length: None });
        for bad in ["bytes=-5", "bytes=9-1", "items=0-1", "bytes=a-b", "bytes=0-1,3-4"] {
            assert!(parse_range(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn binding_beyond_loopback_needs_a_token() {
        check_bind("127.0.0.1:8888".parse().unwrap(), None).unwrap();
        check_bind("[::1]:8888".parse().unwrap(), None).unwrap();
        let err = check_bind("0.0.0.0:8888".parse().unwrap(), None).unwrap_err().to_string();
        assert!(err.contains("--token"), "{err}");
        assert!(check_bind("0.0.0.0:8888".parse().unwrap(), Some("")).is_err());
        check_bind("0.0.0.0:8888".parse().unwrap(), Some("s3cret")).unwrap();
    }
}

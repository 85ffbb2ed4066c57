//! The admin's HTTP surface: the worker API (`/api/v1/workers/...`), read APIs for the shell and
//! scripts, the Admin UI pages, and `/metrics`. With a token, every request must carry it: as
//! `Authorization: Bearer TOKEN` (workers, scripts, Prometheus) or as the password of HTTP Basic
//! authentication (a browser asks for it; any user name).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Form, Path, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use base64::Engine;
use serde::Deserialize;

use tidemark_core::Error;
use tidemark_core::error::ErrorBody;
use tidemark_core::jobs::{Heartbeat, JOB_TYPES_DOC, JobReport, JobTypes, REMOTE_EVENTS, Register, RegisterReply};
use tidemark_engine::docs::{read_json, write_json};

use crate::{Admin, now_ms};

struct ApiError(Error);

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        ApiError(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self.0 {
            Error::NotFound { .. } => StatusCode::NOT_FOUND,
            Error::InvalidArgument { .. } | Error::InvalidPath { .. } => StatusCode::BAD_REQUEST,
            Error::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            Error::PreconditionFailed { .. } => StatusCode::CONFLICT,
            Error::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let mut resp = (status, Json(ErrorBody::from(self.0))).into_response();
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, "Basic realm=\"tidemark admin\"".parse().expect("static"));
        }
        resp
    }
}

type ApiResult<T> = Result<T, ApiError>;

fn json<T>(j: Result<Json<T>, JsonRejection>) -> ApiResult<T> {
    j.map(|Json(t)| t).map_err(|r| ApiError(Error::invalid_argument(format!("bad JSON body: {}", r.body_text()))))
}

#[derive(Clone)]
struct AppState {
    admin: Arc<Admin>,
    token: Option<Arc<str>>,
    /// Accepted on the worker API only: the workers' credential (`--cluster-token`).
    cluster: Option<Arc<str>>,
}

/// Refuses to expose the admin beyond this machine without a token.
pub fn check_bind(addr: SocketAddr, token: Option<&str>) -> Result<(), Error> {
    if !addr.ip().is_loopback() && token.is_none_or(str::is_empty) {
        return Err(Error::invalid_argument(format!(
            "refusing to listen on {addr} without a token: anyone who can reach it could schedule work and switch job types; \
             pass --token (or TIDEMARK_TOKEN), or bind 127.0.0.1"
        )));
    }
    Ok(())
}

pub fn router(admin: Arc<Admin>, token: Option<String>) -> Router {
    router_with(admin, token, None)
}

/// The router, also accepting `cluster` (the workers' token) on the worker API.
pub fn router_with(admin: Arc<Admin>, token: Option<String>, cluster: Option<String>) -> Router {
    let state = AppState {
        admin,
        token: token.filter(|t| !t.is_empty()).map(Arc::from),
        cluster: cluster.filter(|t| !t.is_empty()).map(Arc::from),
    };
    Router::new()
        .route("/", get(|| async { Redirect::to("/subscriptions") }))
        .route("/subscriptions", get(subscriptions_page))
        .route("/job-types", get(job_types_page).post(job_types_form))
        .route("/workers", get(workers_page))
        .route("/cache", get(cache_page))
        .route("/metrics", get(metrics))
        .route("/api/v1/health", get(health))
        .route("/api/v1/subscriptions", get(subscriptions_api))
        .route("/api/v1/workers", get(workers_api))
        .route("/api/v1/job-types", get(job_types_api).put(job_types_put))
        .route("/api/v1/workers/register", post(register))
        .route("/api/v1/workers/{id}/heartbeat", post(heartbeat))
        .route("/api/v1/workers/{id}/report", post(report))
        .route("/api/v1/workers/{id}/leave", post(leave))
        .fallback(|| async {
            ApiError(Error::NotFound { path: "no such page; try /subscriptions or /api/v1/health".into() })
        })
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .layer(middleware::from_fn(same_origin))
        .with_state(state)
}

/// What the pages may do once in a browser: style themselves, post their forms here, and
/// nothing else — no scripts, no other origins, and never inside another site's frame.
const CSP: &str =
    "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Refuses a state-changing request a browser sent on behalf of another site (a browser resends
/// Basic credentials to this origin whoever's page posts the form), and sends the frame and
/// content-security headers with every answer. Clients that are not browsers (workers, scripts,
/// the shell) send neither `Origin` nor `Referer` and are not affected.
async fn same_origin(req: Request, next: Next) -> Response {
    let safe = matches!(*req.method(), axum::http::Method::GET | axum::http::Method::HEAD);
    if !safe && let Some(why) = cross_site(req.headers()) {
        let mut resp = (
            StatusCode::FORBIDDEN,
            Json(ErrorBody::from(Error::Unauthorized {
                message: format!("{why}: the admin accepts changes only from its own pages"),
            })),
        )
            .into_response();
        secure_headers(&mut resp);
        return resp;
    }
    let mut resp = next.run(req).await;
    secure_headers(&mut resp);
    resp
}

fn secure_headers(resp: &mut Response) {
    let h = resp.headers_mut();
    h.insert(header::X_FRAME_OPTIONS, header::HeaderValue::from_static("DENY"));
    h.insert(header::CONTENT_SECURITY_POLICY, header::HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, header::HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, header::HeaderValue::from_static("same-origin"));
}

/// Why the request comes from another site, if it does: its `Origin` (or, without one, its
/// `Referer`) names a host other than the one it was sent to, or the browser says so itself.
fn cross_site(h: &header::HeaderMap) -> Option<String> {
    let text = |name: header::HeaderName| h.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}").to_string());
    if let Some(site) = h.get("sec-fetch-site").and_then(|v| v.to_str().ok())
        && site == "cross-site"
    {
        return Some("a cross-site request (Sec-Fetch-Site)".into());
    }
    let host = text(header::HOST).unwrap_or_default();
    let (what, from) = match (text(header::ORIGIN), text(header::REFERER)) {
        (Some(o), _) => ("Origin", o),
        (None, Some(r)) => ("Referer", r),
        (None, None) => return None,
    };
    // scheme://host[:port][/...]: compare the authority with the Host the request was sent to.
    let authority = from.split_once("://").map(|(_, rest)| rest.split(['/', '?', '#']).next().unwrap_or(""));
    match authority {
        Some(a) if !a.is_empty() && a.eq_ignore_ascii_case(&host) => None,
        _ => Some(format!("{what} {from:?} is not this admin ({host})")),
    }
}

async fn authorize(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(token) = &state.token {
        let header = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or("");
        let given = if let Some(b) = header.strip_prefix("Bearer ") {
            Some(b.to_string())
        } else if let Some(b) = header.strip_prefix("Basic ") {
            base64::engine::general_purpose::STANDARD
                .decode(b.trim())
                .ok()
                .and_then(|d| String::from_utf8(d).ok())
                .and_then(|up| up.split_once(':').map(|(_, p)| p.to_string()))
        } else {
            None
        };
        // The workers' token opens the worker API (register, heartbeat, report, leave), no page.
        let worker_api = req.uri().path().starts_with("/api/v1/workers/") && *req.method() == axum::http::Method::POST;
        let is_cluster = worker_api
            && state.cluster.as_ref().is_some_and(|c| {
                given.as_ref().is_some_and(|g| tidemark_http::constant_time_eq(g.as_bytes(), c.as_bytes()))
            });
        if !is_cluster && !given.is_some_and(|g| tidemark_http::constant_time_eq(g.as_bytes(), token.as_bytes())) {
            return ApiError(Error::Unauthorized {
                message:
                    "missing or wrong token: pass --token or set TIDEMARK_TOKEN to the admin's token (in a browser: \
                          any user name, the token as password)"
                        .into(),
            })
            .into_response();
        }
    }
    next.run(req).await
}

/// A page, with a banner on a standby admin saying so and which admin is active.
fn page(admin: &Admin, html: String) -> Html<String> {
    match admin.role() {
        crate::Role::Active { .. } => Html(html),
        crate::Role::Standby { active } => {
            let banner = crate::ui::standby_banner(active.as_deref());
            Html(html.replacen("<main>", &format!("<main>{banner}"), 1))
        }
    }
}

async fn subscriptions_page(State(s): State<AppState>) -> Html<String> {
    let a = &s.admin;
    let snap = a.snapshot.read().unwrap_or_else(|p| p.into_inner()).clone();
    let html = {
        let rates = a.rates.lock().unwrap_or_else(|p| p.into_inner());
        let costs = crate::ui::Costs { rates: &rates, prices: &a.config.prices };
        crate::ui::subscriptions(&snap, &a.sched(), &costs, &a.config.filer_label, now_ms())
    };
    page(a, html)
}

async fn job_types_page(State(s): State<AppState>) -> Html<String> {
    let a = &s.admin;
    let n = a.snapshot.read().unwrap_or_else(|p| p.into_inner()).subscriptions.len();
    let html = crate::ui::job_types(&a.sched(), n, &a.config.filer_label);
    page(a, html)
}

async fn workers_page(State(s): State<AppState>) -> Html<String> {
    let html = crate::ui::workers(&s.admin.sched(), &s.admin.config.filer_label, now_ms());
    page(&s.admin, html)
}

async fn cache_page(State(s): State<AppState>) -> Html<String> {
    let stats = s.admin.filer.cache_stats().await.map_err(|e| e.to_string());
    let html = crate::ui::cache(stats.as_ref().map_err(String::clone), &s.admin.config.filer_label);
    page(&s.admin, html)
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.admin.metrics.render())
}

async fn health(State(s): State<AppState>) -> Json<serde_json::Value> {
    let a = &s.admin;
    let (workers, running) = {
        let sc = a.sched();
        (sc.workers().len(), sc.running_jobs())
    };
    let (role, active) = match a.role() {
        crate::Role::Active { .. } => ("active", Some(a.config.advertise.clone())),
        crate::Role::Standby { active } => ("standby", active),
    };
    Json(serde_json::json!({
        "status": "ok",
        "role": role,
        "active": active,
        "version": env!("CARGO_PKG_VERSION"),
        "filer": a.config.filer_label,
        "workers": workers,
        "slices_running": running,
        "started_at_ms": a.started_ms,
    }))
}

async fn subscriptions_api(State(s): State<AppState>) -> Json<serde_json::Value> {
    let a = &s.admin;
    let snap = a.snapshot.read().unwrap_or_else(|p| p.into_inner()).clone();
    let sched = a.sched();
    let rows: Vec<serde_json::Value> = snap
        .subscriptions
        .iter()
        .map(|v| {
            let job = sched.job_of(&v.doc.fingerprint).map(|t| match t {
                crate::scheduler::Tracked::Pending { job, .. } => serde_json::json!({"id": job.id, "worker": null}),
                crate::scheduler::Tracked::Assigned { job, worker, .. } => {
                    serde_json::json!({"id": job.id, "worker": worker})
                }
            });
            serde_json::json!({
                "dir": v.doc.dir,
                "fingerprint": v.doc.fingerprint,
                "identity": v.doc.identity,
                "status": v.status,
                "lease": v.lease,
                "job": job,
            })
        })
        .collect();
    Json(serde_json::json!({ "subscriptions": rows, "read_at_ms": snap.read_at_ms, "problems": snap.problems }))
}

async fn workers_api(State(s): State<AppState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "workers": s.admin.sched().workers() }))
}

async fn job_types_api(State(s): State<AppState>) -> ApiResult<Json<serde_json::Value>> {
    let t = read_json::<JobTypes>(&*s.admin.filer, JOB_TYPES_DOC).await?.map(|(t, _)| t).unwrap_or_default();
    Ok(Json(serde_json::json!({ "job_types": [{"job_type": REMOTE_EVENTS, "enabled": t.enabled(REMOTE_EVENTS)}] })))
}

#[derive(Deserialize)]
struct Switch {
    job_type: String,
    enabled: bool,
}

/// Switches a job type, persisted in the filer (a read-modify-write that retries on a race).
async fn switch(admin: &Admin, sw: &Switch) -> Result<(), Error> {
    if sw.job_type != REMOTE_EVENTS {
        return Err(Error::invalid_argument(format!(
            "unknown job type {:?}; the admin runs {REMOTE_EVENTS:?}",
            sw.job_type
        )));
    }
    for _ in 0..5 {
        let current = read_json::<JobTypes>(&*admin.filer, JOB_TYPES_DOC).await?;
        let (mut t, version) = current.map_or((JobTypes::default(), None), |(t, v)| (t, Some(v)));
        t.set(&sw.job_type, sw.enabled);
        match write_json(&*admin.filer, JOB_TYPES_DOC, &t, version).await {
            Ok(_) => {
                tracing::info!(job_type = %sw.job_type, enabled = sw.enabled, "job type switched");
                // Applied now rather than at the next detection pass.
                let _ = admin.detect_once().await;
                return Ok(());
            }
            Err(Error::PreconditionFailed { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::Unavailable { message: "the job types document keeps changing; try again".into() })
}

async fn job_types_put(
    State(s): State<AppState>,
    body: Result<Json<Switch>, JsonRejection>,
) -> ApiResult<Json<serde_json::Value>> {
    if let Some(e) = s.admin.standby_refusal() {
        return Err(ApiError(e));
    }
    let sw = json(body)?;
    switch(&s.admin, &sw).await?;
    Ok(Json(serde_json::json!({"job_type": sw.job_type, "enabled": sw.enabled})))
}

async fn job_types_form(State(s): State<AppState>, Form(sw): Form<Switch>) -> Response {
    if let Some(e) = s.admin.standby_refusal() {
        return ApiError(e).into_response();
    }
    match switch(&s.admin, &sw).await {
        Ok(()) => Redirect::to("/job-types").into_response(),
        Err(e) => ApiError(e).into_response(),
    }
}

async fn register(
    State(s): State<AppState>,
    body: Result<Json<Register>, JsonRejection>,
) -> ApiResult<Json<RegisterReply>> {
    if let Some(e) = s.admin.standby_refusal() {
        return Err(ApiError(e));
    }
    let r = json(body)?;
    // Ids and host names go into log lines and pages: no control character may forge a line.
    if r.worker_id.is_empty()
        || r.worker_id.len() > 200
        || r.worker_id.contains('/')
        || r.worker_id.chars().any(char::is_control)
    {
        return Err(ApiError(Error::invalid_argument(
            "a worker id is 1 to 200 characters without '/' or control characters",
        )));
    }
    if r.host.len() > 255 || r.host.chars().any(char::is_control) {
        return Err(ApiError(Error::invalid_argument(
            "a worker's host name has at most 255 characters, none a control character",
        )));
    }
    tracing::info!(worker = %r.worker_id, host = %r.host, max_execute = r.max_execute, "worker registered");
    s.admin.sched().register(r, now_ms());
    let beat = (s.admin.config.scheduler.worker_timeout / 5)
        .clamp(std::time::Duration::from_millis(200), std::time::Duration::from_secs(5));
    Ok(Json(RegisterReply { heartbeat_ms: beat.as_millis() as u64 }))
}

async fn heartbeat(
    State(s): State<AppState>,
    Path(id): Path<String>,
    body: Result<Json<Heartbeat>, JsonRejection>,
) -> ApiResult<Json<tidemark_core::jobs::HeartbeatReply>> {
    if let Some(e) = s.admin.standby_refusal() {
        return Err(ApiError(e));
    }
    let hb = json(body)?;
    let a = &s.admin;
    let dirs: std::collections::BTreeMap<String, String> = a
        .snapshot
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .subscriptions
        .iter()
        .map(|v| (v.doc.fingerprint.clone(), v.doc.dir.clone()))
        .collect();
    a.metrics.samples(|fp| dirs.get(fp).cloned(), &hb.samples);
    let reply = a.sched().heartbeat(&id, hb.running, hb.draining, now_ms());
    for j in &reply.assign {
        tracing::info!(worker = %id, job = %j.id, dir = %j.dir, "slice assigned");
    }
    Ok(Json(reply))
}

async fn report(
    State(s): State<AppState>,
    Path(id): Path<String>,
    body: Result<Json<JobReport>, JsonRejection>,
) -> ApiResult<Json<serde_json::Value>> {
    if let Some(e) = s.admin.standby_refusal() {
        return Err(ApiError(e));
    }
    let r = json(body)?;
    s.admin.metrics.slice_ended(r.outcome.as_str(), r.duration_ms as f64 / 1000.0);
    s.admin.sched().report(&id, r, now_ms());
    Ok(Json(serde_json::json!({"ok": true})))
}

async fn leave(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<serde_json::Value>> {
    if let Some(e) = s.admin.standby_refusal() {
        return Err(ApiError(e));
    }
    tracing::info!(worker = %id, "worker left");
    s.admin.sched().leave(&id);
    Ok(Json(serde_json::json!({"ok": true})))
}

pub async fn serve(
    listener: tokio::net::TcpListener,
    admin: Arc<Admin>,
    token: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_tls(listener, admin, token, None, None, shutdown).await
}

/// [`serve`], over HTTPS when `tls` is given.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    admin: Arc<Admin>,
    token: Option<String>,
    cluster: Option<String>,
    tls: Option<tidemark_http::tls::TlsAcceptor>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    tidemark_http::serve(
        listener,
        tidemark_http::tower(router_with(admin, token, cluster)),
        tidemark_http::Limits::default(),
        tls,
        shutdown,
    )
    .await
}

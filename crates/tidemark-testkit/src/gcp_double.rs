//! A test double for the Google Cloud APIs that no emulator serves, in front of the emulators
//! that serve the rest:
//!
//! - Cloud Storage JSON API: `notifications.insert/list/get/delete`
//!   (`/storage/v1/b/BUCKET/notificationConfigs[/ID]`) and `projects.serviceAccount.get`
//!   (`/storage/v1/projects/P/serviceAccount`) — fake-gcs-server has neither;
//! - Pub/Sub: `topics.getIamPolicy` (GET) / `topics.setIamPolicy` (POST)
//!   (`/v1/projects/P/topics/T:...`) and the same of subscriptions — the emulator answers 501; a
//!   method the reference does not give (a POST to `getIamPolicy`) is a 404, as Google answers;
//! - Cloud Resource Manager: `projects.get` (`GET /v1/projects/P`), for the project's number;
//! - Google's OAuth 2.0 token endpoint (`POST /token`): a service account's JWT bearer grant, an
//!   authorized user's refresh token, and the scopes its tokens carry; a service account's **self-signed JWT** used as the
//!   bearer token itself, as Google accepts it for its APIs ("AIP-4111: Self-signed JWT": RS256,
//!   `iss` = `sub` = the account's email, a `scope` claim, at most an hour between `iat` and
//!   `exp`) — how `google-cloud-auth` signs in with a key;
//! - the **metadata server** of a Google Cloud machine, or GKE's workload identity's
//!   ("About VM metadata": `GET /computeMetadata/v1/instance/service-accounts/default/token`,
//!   `?scopes=` comma-separated, only with `Metadata-Flavor: Google`, 403 without; the answer
//!   carries `Metadata-Flavor: Google`) — reached through `GCE_METADATA_HOST`;
//! - **Security Token Service** token exchange for workload identity federation ("Method:
//!   token", sts.googleapis.com `POST /v1/token`, RFC 8693: `grant_type` token-exchange, the
//!   pool provider's `audience`, `subject_token` and its type, `requested_token_type`
//!   access_token, `scope`): a subject token a test registered ([`GcpDouble::federate`]) for
//!   that audience, else 400 `invalid_grant`.
//!
//! - IAM Credentials' `generateAccessToken` for impersonation (`POST
//!   /v1/projects/-/serviceAccounts/EMAIL:generateAccessToken`, a body of `scope` and `lifetime`,
//!   the caller's token needing `cloud-platform` or `iam`; the answer's `accessToken` and
//!   RFC 3339 `expireTime`).
//!
//! Every token the double issues expires ([`GcpDouble::token_lifetime`]; Google's last an hour)
//! and is refused 401 once it has.
//!
//! They follow Google's published REST reference: the same paths, bodies, status codes and
//! error shapes (`{"error": {"code", "message", "status"?}}`), 404 for an unknown bucket or
//! topic, 400 for a malformed topic name, payload format or event type, 403 when the bucket's
//! service agent may not publish to the topic, 409 (`ABORTED`) for a policy written over a
//! newer one. **Identity as Google checks it:** a bearer token the double did not issue is 401
//! `UNAUTHENTICATED`; one whose scopes do not cover the API (Cloud Storage: `devstorage.*`;
//! Pub/Sub: `pubsub`; Resource Manager: `cloudplatformprojects[.readonly]`; `cloud-platform`
//! covers all) is 403 with `ACCESS_TOKEN_SCOPE_INSUFFICIENT`; no token at all is the emulator
//! case, served. (The assertion's signature is not checked: the double has no public key.)
//! **The service agent is the bucket's project's** (`service-NUMBER@gs-project-accounts…`, the
//! number of the project asked for; fake-gcs-server puts every bucket in project number 0), and
//! a configuration is refused 403 unless that agent may publish to the topic. **IAM
//! propagates:** a policy change reaches the notification check [`PROPAGATION`] after it was
//! made, as Google's IAM takes time to. Faults on request: 429 `RESOURCE_EXHAUSTED` on the next
//! requests, and a concurrent policy change before the next `setIamPolicy` (409 `ABORTED`).
//! Everything else passes through unchanged: Cloud Storage paths to fake-gcs-server, `/v1/...`
//! to the Pub/Sub emulator. The double publishes nothing: in the tests fake-gcs-server
//! publishes the bucket's events to its own topic.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::doubles::{form_of, serve_in_thread};

/// The Cloud Storage service agent of every bucket here: fake-gcs-server reports every bucket
/// in project number 0.
pub const SERVICE_AGENT: &str = "service-0@gs-project-accounts.iam.gserviceaccount.com";
/// How long a policy change takes to reach Cloud Storage's check of a configuration here.
pub const PROPAGATION: std::time::Duration = std::time::Duration::from_secs(3);

/// The Cloud Storage service agent of the project with `number`.
pub fn storage_agent(number: &str) -> String {
    format!("service-{number}@gs-project-accounts.iam.gserviceaccount.com")
}
/// Every project's number here (Cloud Resource Manager's `projects.get`).
pub const PROJECT_NUMBER: &str = "123456789012";
/// The Pub/Sub service agent of every project here, which forwards dead letters.
pub const PUBSUB_AGENT: &str = "service-123456789012@gcp-sa-pubsub.iam.gserviceaccount.com";
const EVENT_TYPES: &[&str] = &["OBJECT_FINALIZE", "OBJECT_METADATA_UPDATE", "OBJECT_DELETE", "OBJECT_ARCHIVE"];

#[derive(Default)]
struct Doubled {
    /// bucket -> id -> notification resource
    notifications: BTreeMap<String, BTreeMap<String, Value>>,
    next_id: u64,
    /// topic path -> (policy, etag version)
    policies: HashMap<String, (Value, u64)>,
    /// topic path -> (the policy before the last change, when that change was made)
    changed: HashMap<String, (Value, std::time::Instant)>,
    /// token -> the scopes it carries, and when it expires
    tokens: HashMap<String, (Vec<String>, std::time::Instant)>,
    /// How long tokens issued from now on last (default 3,599 s).
    lifetime: Option<std::time::Duration>,
    /// (audience, subject token) pairs STS exchanges.
    federated: Vec<(String, String)>,
    /// How each token was got: `key`, `self_signed`, `metadata`, `sts`, `user`.
    ways: Vec<String>,
    /// Refresh tokens of authorized users the token endpoint takes.
    refresh_tokens: Vec<String>,
    /// The next requests answered 429.
    throttled: u32,
    /// The next `setIamPolicy`s preceded by another writer's change.
    races: u32,
    /// Configurations refused because a grant had not propagated yet.
    refused_unpropagated: u32,
}

struct Shared {
    storage: String,
    pubsub: String,
    http: reqwest::Client,
    state: Mutex<Doubled>,
}

/// The double, serving on `endpoint` (use it as both `-gcs.endpoint` and `-gcs.pubsub_endpoint`)
/// until dropped.
pub struct GcpDouble {
    pub endpoint: String,
    shared: Arc<Shared>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl GcpDouble {
    /// `storage`: fake-gcs-server's URL; `pubsub`: the Pub/Sub emulator's URL.
    pub fn start(storage: &str, pubsub: &str) -> GcpDouble {
        let shared = Arc::new(Shared {
            storage: storage.trim_end_matches('/').to_string(),
            pubsub: pubsub.trim_end_matches('/').to_string(),
            http: reqwest::Client::new(),
            state: Mutex::default(),
        });
        let (endpoint, stop) = serve_in_thread(axum::Router::new().fallback(handle).with_state(shared.clone()), None);
        GcpDouble { endpoint, shared, _stop: stop }
    }

    /// The notification configurations of `bucket`, as the double holds them.
    pub fn notifications(&self, bucket: &str) -> Vec<Value> {
        let state = self.shared.state.lock().unwrap();
        state.notifications.get(bucket).map(|m| m.values().cloned().collect()).unwrap_or_default()
    }

    /// Answers the next `n` requests 429 `RESOURCE_EXHAUSTED`.
    pub fn throttle(&self, n: u32) {
        self.shared.state.lock().unwrap().throttled = n;
    }

    /// Has another writer change the policy before each of the next `n` `setIamPolicy`s, so
    /// they meet 409 `ABORTED` (their etag is stale).
    pub fn race(&self, n: u32) {
        self.shared.state.lock().unwrap().races = n;
    }

    /// The faults asked for and not yet met.
    pub fn faults_left(&self) -> u32 {
        let st = self.shared.state.lock().unwrap();
        st.throttled + st.races
    }

    /// How many configurations were refused because a grant had not propagated yet.
    pub fn refused_unpropagated(&self) -> u32 {
        self.shared.state.lock().unwrap().refused_unpropagated
    }

    /// Tokens issued from now on last `lifetime`.
    pub fn token_lifetime(&self, lifetime: std::time::Duration) {
        self.shared.state.lock().unwrap().lifetime = Some(lifetime);
    }

    /// Workload identity federation: STS exchanges `subject_token` for the pool provider
    /// `audience` (`//iam.googleapis.com/projects/N/locations/global/workloadIdentityPools/P/providers/R`).
    pub fn federate(&self, audience: &str, subject_token: &str) {
        self.shared.state.lock().unwrap().federated.push((audience.into(), subject_token.into()));
    }

    /// An authorized user whose `refresh_token` the token endpoint (`ENDPOINT/token`) refreshes.
    pub fn authorize_user(&self, refresh_token: &str) {
        self.shared.state.lock().unwrap().refresh_tokens.push(refresh_token.into());
    }

    /// How each token seen was got, in order: `key` (the JWT bearer grant), `self_signed`,
    /// `metadata`, `sts`, `user` (a refresh token), `impersonated`.
    pub fn ways(&self) -> Vec<String> {
        self.shared.state.lock().unwrap().ways.clone()
    }

    /// `host:port`, for `GCE_METADATA_HOST`.
    pub fn metadata_host(&self) -> String {
        self.endpoint.trim_start_matches("http://").to_string()
    }

    /// The scopes of every token issued, in order.
    pub fn scopes_issued(&self) -> Vec<Vec<String>> {
        let st = self.shared.state.lock().unwrap();
        let mut tokens: Vec<_> = st.tokens.iter().collect();
        tokens.sort();
        tokens.into_iter().map(|(_, (scopes, _))| scopes.clone()).collect()
    }

    /// The access policy of `topic` (`projects/P/topics/T`), if one was set.
    pub fn policy(&self, topic: &str) -> Option<Value> {
        self.shared.state.lock().unwrap().policies.get(topic).map(|(p, _)| p.clone())
    }
}

/// Google's OAuth 2.0 token endpoint, for the JWT bearer grant of a service account: a token
/// carrying the scopes the assertion asks for.
fn token(s: &Shared, body: &[u8]) -> Response {
    use base64::Engine;
    // Form-encoded, or, as Google's endpoint also accepts (and `google-cloud-auth` sends a
    // refresh so), JSON.
    let f = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| {
            Some(v.as_object()?.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect())
        })
        .unwrap_or_else(|| form_of(body));
    let grant = |description: &str| {
        (StatusCode::BAD_REQUEST, axum::Json(json!({"error": "invalid_grant", "error_description": description})))
            .into_response()
    };
    let (way, scopes) = match f.get("grant_type").map(String::as_str) {
        // An authorized user's refresh token (gcloud's application-default login):
        // "Refreshing an access token", developers.google.com/identity.
        Some("refresh_token") => {
            let known = s.state.lock().unwrap().refresh_tokens.iter().any(|t| Some(t) == f.get("refresh_token"));
            if !known || !f.contains_key("client_id") || !f.contains_key("client_secret") {
                return grant("Token has been expired or revoked.");
            }
            let scopes = f
                .get("scope")
                .map(|s| s.split_whitespace().map(str::to_string).collect())
                .unwrap_or_else(|| vec!["https://www.googleapis.com/auth/cloud-platform".to_string()]);
            ("user", scopes)
        }
        // A service account's signed assertion (the JWT bearer grant).
        Some("urn:ietf:params:oauth:grant-type:jwt-bearer") => {
            let claims = f
                .get("assertion")
                .and_then(|jwt| jwt.split('.').nth(1))
                .and_then(|c| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(c).ok())
                .and_then(|c| serde_json::from_slice::<Value>(&c).ok());
            let Some(claims) = claims.filter(|c| c["iss"].is_string()) else { return grant("Invalid JWT") };
            ("key", claims["scope"].as_str().unwrap_or("").split_whitespace().map(str::to_string).collect())
        }
        _ => return (StatusCode::BAD_REQUEST, axum::Json(json!({"error": "unsupported_grant_type"}))).into_response(),
    };
    let (token, lifetime) = issue(s, way, scopes);
    ok(json!({"access_token": token, "expires_in": lifetime, "token_type": "Bearer"}))
}

/// A new access token carrying `scopes`, got `way`; and its lifetime in seconds.
fn issue(s: &Shared, way: &str, scopes: Vec<String>) -> (String, u64) {
    let mut st = s.state.lock().unwrap();
    let lifetime = st.lifetime.unwrap_or(std::time::Duration::from_secs(3599));
    let token = format!("ya29.double-{}", st.tokens.len() + 1);
    st.tokens.insert(token.clone(), (scopes, std::time::Instant::now() + lifetime));
    st.ways.push(way.into());
    (token, lifetime.as_secs())
}

/// The metadata server's token for the machine's default service account.
fn metadata_token(s: &Shared, headers: &HeaderMap, query: &str) -> Response {
    if headers.get("metadata-flavor").and_then(|v| v.to_str().ok()) != Some("Google") {
        return (StatusCode::FORBIDDEN, "Missing Metadata-Flavor:Google header.").into_response();
    }
    let scopes: Vec<String> = form_of(query.as_bytes())
        .get("scopes")
        .map(|s| s.split(',').map(str::to_string).collect())
        .unwrap_or_else(|| vec!["https://www.googleapis.com/auth/cloud-platform".into()]);
    let (token, lifetime) = issue(s, "metadata", scopes);
    let mut r = ok(json!({"access_token": token, "expires_in": lifetime, "token_type": "Bearer"}));
    r.headers_mut().insert("metadata-flavor", "Google".parse().unwrap());
    r
}

/// IAM Credentials' `generateAccessToken`: a token of `email`, for a caller whose own token may
/// act for it.
fn impersonate(s: &Shared, headers: &HeaderMap, email: &str, body: &[u8]) -> Response {
    let scopes = match caller_scopes(s, headers) {
        Some(Ok(scopes)) => scopes,
        Some(Err(refused)) => return refused,
        None => return error(StatusCode::UNAUTHORIZED, "Request had invalid authentication credentials."),
    };
    const AUTH: &str = "https://www.googleapis.com/auth/";
    if !scopes.iter().any(|sc| sc == &format!("{AUTH}cloud-platform") || sc == &format!("{AUTH}iam")) {
        return error(StatusCode::FORBIDDEN, "Request had insufficient authentication scopes.");
    }
    if !email.ends_with(".iam.gserviceaccount.com") {
        return error(StatusCode::NOT_FOUND, &format!("Service account {email} not found."));
    }
    let asked: Value = serde_json::from_slice(body).unwrap_or_default();
    let Some(wanted) = asked["scope"].as_array().filter(|a| !a.is_empty()) else {
        return error(StatusCode::BAD_REQUEST, "scope must be set.");
    };
    let wanted = wanted.iter().filter_map(|v| v.as_str().map(str::to_string)).collect();
    let (token, lifetime) = issue(s, "impersonated", wanted);
    let expires = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + lifetime;
    ok(json!({"accessToken": token, "expireTime": tidemark_core::clock::format_rfc3339_ms(expires as i64 * 1000)}))
}

/// Security Token Service's token exchange (workload identity federation).
fn sts_token(s: &Shared, body: &[u8]) -> Response {
    let form = form_of(body);
    let bad = |description: &str| {
        (StatusCode::BAD_REQUEST, axum::Json(json!({"error": "invalid_request", "error_description": description})))
            .into_response()
    };
    if form.get("grant_type").map(String::as_str) != Some("urn:ietf:params:oauth:grant-type:token-exchange") {
        return bad("Invalid value for \"grant_type\".");
    }
    if form.get("requested_token_type").map(String::as_str) != Some("urn:ietf:params:oauth:token-type:access_token") {
        return bad("Invalid value for \"requested_token_type\".");
    }
    let (Some(audience), Some(subject), Some(_)) =
        (form.get("audience"), form.get("subject_token"), form.get("subject_token_type"))
    else {
        return bad("audience, subject_token and subject_token_type are required.");
    };
    let known = s.state.lock().unwrap().federated.iter().any(|(a, t)| a == audience && t == subject);
    if !known {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": "invalid_grant", "error_description": "The audience in ID Token does not match the expected audience."})),
        )
            .into_response();
    }
    let scopes = form.get("scope").map(|s| s.split_whitespace().map(str::to_string).collect()).unwrap_or_default();
    let (token, lifetime) = issue(s, "sts", scopes);
    ok(json!({"access_token": token, "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
        "token_type": "Bearer", "expires_in": lifetime}))
}

/// A service account's self-signed JWT (AIP-4111), as Google checks one: its scopes and how
/// long it has left, or why it is refused. (Its signature is not checked: the double holds no
/// public keys.)
fn self_signed(token: &str) -> std::result::Result<(Vec<String>, std::time::Duration), &'static str> {
    use base64::Engine;
    let part = |i: usize| {
        token
            .split('.')
            .nth(i)
            .and_then(|p| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(p).ok())
            .and_then(|p| serde_json::from_slice::<Value>(&p).ok())
    };
    let (Some(header), Some(claims)) = (part(0), part(1)) else { return Err("not a JWT") };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let (iat, exp) = (claims["iat"].as_u64().unwrap_or(0), claims["exp"].as_u64().unwrap_or(0));
    let email = claims["iss"].as_str().unwrap_or_default();
    if header["alg"] != "RS256" || header["kid"].as_str().is_none_or(str::is_empty) {
        return Err("not signed with a service account key (RS256, kid)");
    }
    if !email.ends_with(".iam.gserviceaccount.com") || claims["sub"] != email {
        return Err("iss and sub are not the service account's email");
    }
    // An hour at most, with Google's allowance for clock skew (its own library signs iat 10 s
    // early and exp 10 s late).
    if exp <= now || iat > now + 300 || exp.saturating_sub(iat) > 3600 + 300 {
        return Err("expired, not yet valid, or valid for more than an hour");
    }
    let scopes: Vec<String> = claims["scope"].as_str().unwrap_or("").split_whitespace().map(str::to_string).collect();
    if scopes.is_empty() { Err("no scope claim") } else { Ok((scopes, std::time::Duration::from_secs(exp - now))) }
}

/// The scopes of the caller's bearer token: `None` without one; the refusal (401) for a token
/// that expired or that the double never issued and is no self-signed JWT either.
fn caller_scopes(s: &Shared, headers: &HeaderMap) -> Option<std::result::Result<Vec<String>, Response>> {
    let bearer = headers.get("authorization")?.to_str().ok()?.strip_prefix("Bearer ")?.to_string();
    let mut st = s.state.lock().unwrap();
    let mut why = "";
    if !st.tokens.contains_key(&bearer) {
        match self_signed(&bearer) {
            Ok((scopes, left)) => {
                st.tokens.insert(bearer.clone(), (scopes, std::time::Instant::now() + left));
                st.ways.push("self_signed".into());
            }
            Err(e) => why = e,
        }
    }
    Some(match st.tokens.get(&bearer) {
        Some((_, expires)) if std::time::Instant::now() >= *expires => Err(error(
            StatusCode::UNAUTHORIZED,
            "Request had invalid authentication credentials: the access token expired.",
        )),
        Some((scopes, _)) => Ok(scopes.clone()),
        None => Err(error(
            StatusCode::UNAUTHORIZED,
            &format!(
                "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other \
                 valid authentication credential. (the double: {why})"
            ),
        )),
    })
}

/// Google's check of the caller: `None` to serve the request; else the refusal. No token is the
/// emulator case (served); a token must be one the double issued, with a scope that covers the
/// API — as Google answers: 401 `UNAUTHENTICATED`, 403 `ACCESS_TOKEN_SCOPE_INSUFFICIENT`.
fn identity(s: &Shared, headers: &HeaderMap, path: &str) -> Option<Response> {
    let scopes = match caller_scopes(s, headers)? {
        Ok(scopes) => scopes,
        Err(refused) => return Some(refused),
    };
    const AUTH: &str = "https://www.googleapis.com/auth/";
    let needed: &[&str] = if path.starts_with("/storage/") {
        &["devstorage.read_write", "devstorage.full_control", "devstorage.read_only"]
    } else if path.contains("/topics/") || path.contains("/subscriptions/") {
        &["pubsub"]
    } else {
        // Cloud Resource Manager's projects.get.
        &["cloudplatformprojects.readonly", "cloudplatformprojects", "cloud-platform.read-only"]
    };
    let covered =
        scopes.iter().any(|sc| sc.strip_prefix(AUTH).is_some_and(|sc| sc == "cloud-platform" || needed.contains(&sc)));
    if covered {
        return None;
    }
    let body = json!({"error": {"code": 403, "message": "Request had insufficient authentication scopes.",
        "status": "PERMISSION_DENIED",
        "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "ACCESS_TOKEN_SCOPE_INSUFFICIENT"}]}});
    Some((StatusCode::FORBIDDEN, axum::Json(body)).into_response())
}

fn error(status: StatusCode, message: &str) -> Response {
    let reason = match status.as_u16() {
        400 => "INVALID_ARGUMENT",
        403 => "PERMISSION_DENIED",
        429 => "RESOURCE_EXHAUSTED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        _ => "UNKNOWN",
    };
    (status, axum::Json(json!({"error": {"code": status.as_u16(), "message": message, "status": reason}})))
        .into_response()
}

fn ok(v: Value) -> Response {
    (StatusCode::OK, axum::Json(v)).into_response()
}

async fn handle(State(s): State<Arc<Shared>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let path_and_query = req.uri().path_and_query().map_or_else(|| path.clone(), |pq| pq.as_str().to_string());
    let headers = req.headers().clone();
    let body = match axum::body::to_bytes(req.into_body(), 64 << 20).await {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("unreadable body: {e}")),
    };
    if method == Method::POST && path == "/token" {
        return token(&s, &body);
    }
    if method == Method::POST && path == "/v1/token" {
        return sts_token(&s, &body);
    }
    if method == Method::POST
        && let Some(email) = path
            .strip_prefix("/v1/projects/-/serviceAccounts/")
            .and_then(|rest| rest.strip_suffix(":generateAccessToken"))
    {
        return impersonate(&s, &headers, email, &body);
    }
    if method == Method::GET && path == "/computeMetadata/v1/instance/service-accounts/default/token" {
        let query = path_and_query.split_once('?').map(|(_, q)| q).unwrap_or("");
        return metadata_token(&s, &headers, query);
    }
    if let Some(refused) = identity(&s, &headers, &path) {
        return refused;
    }
    {
        let mut st = s.state.lock().unwrap();
        if st.throttled > 0 {
            st.throttled -= 1;
            return error(StatusCode::TOO_MANY_REQUESTS, "Quota exceeded (rate of requests); retry with backoff.");
        }
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (method.clone(), parts.as_slice()) {
        // A project id or number; every id here has PROJECT_NUMBER.
        (Method::GET, ["storage", "v1", "projects", p, "serviceAccount"]) => {
            let number = if p.chars().all(|c| c.is_ascii_digit()) { p } else { PROJECT_NUMBER };
            ok(json!({"kind": "storage#serviceAccount", "email_address": storage_agent(number)}))
        }
        (m, ["storage", "v1", "b", bucket, "notificationConfigs", rest @ ..]) => {
            notifications(&s, m, bucket, rest.first().copied(), &body).await
        }
        // `GET /v1/{resource}:getIamPolicy` and `POST /v1/{resource}:setIamPolicy` (Pub/Sub's REST
        // reference, projects.topics / projects.subscriptions); any other method on them is
        // answered as Google's front end answers a method the API does not have: 404.
        (m, ["v1", "projects", p, kind @ ("topics" | "subscriptions"), last])
            if last.ends_with(":getIamPolicy") || last.ends_with(":setIamPolicy") =>
        {
            let (t, verb) = last.split_once(':').unwrap_or_default();
            match (m, verb) {
                (Method::GET, "getIamPolicy") | (Method::POST, "setIamPolicy") => {
                    iam(&s, &format!("projects/{p}/{kind}/{t}"), verb, &body).await
                }
                (m, verb) => {
                    error(StatusCode::NOT_FOUND, &format!("{m} is not a method of {verb}: the URL was not found"))
                }
            }
        }
        (Method::GET, ["v1", "projects", p]) => {
            ok(json!({"projectNumber": PROJECT_NUMBER, "projectId": p, "lifecycleState": "ACTIVE"}))
        }
        _ => pass(&s, method, &path_and_query, headers, body).await,
    }
}

/// Passes a request on, unchanged, to the emulator behind the double: `/v1/...` to Pub/Sub,
/// the rest to Cloud Storage.
async fn pass(s: &Shared, method: Method, path_and_query: &str, headers: HeaderMap, body: Bytes) -> Response {
    let upstream = if path_and_query.starts_with("/v1/") { &s.pubsub } else { &s.storage };
    let mut rb = s.http.request(method, format!("{upstream}{path_and_query}")).body(body);
    for (k, v) in &headers {
        if !matches!(k.as_str(), "host" | "content-length" | "connection" | "transfer-encoding") {
            rb = rb.header(k, v);
        }
    }
    let resp = match rb.send().await {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_GATEWAY, &format!("the emulator is unreachable: {e}")),
    };
    let status = resp.status();
    let mut out = Response::builder().status(status.as_u16());
    for (k, v) in resp.headers() {
        if !matches!(k.as_str(), "content-length" | "connection" | "transfer-encoding") {
            out = out.header(k, v);
        }
    }
    let bytes = resp.bytes().await.unwrap_or_default();
    out.body(Body::from(bytes)).unwrap_or_else(|e| error(StatusCode::BAD_GATEWAY, &e.to_string()))
}

async fn exists(s: &Shared, url: String) -> Result<bool, Response> {
    match s.http.get(url).send().await {
        Ok(r) if r.status().is_success() => Ok(true),
        Ok(r) if r.status() == reqwest::StatusCode::NOT_FOUND => Ok(false),
        Ok(r) => Err(error(StatusCode::BAD_GATEWAY, &format!("the emulator answered {}", r.status()))),
        Err(e) => Err(error(StatusCode::BAD_GATEWAY, &format!("the emulator is unreachable: {e}"))),
    }
}

async fn notifications(s: &Shared, method: Method, bucket: &str, id: Option<&str>, body: &Bytes) -> Response {
    let project_number = match s.http.get(format!("{}/storage/v1/b/{bucket}", s.storage)).send().await {
        Ok(r) if r.status().is_success() => {
            let b: Value = r.json().await.unwrap_or_default();
            b["projectNumber"].as_str().unwrap_or("0").to_string()
        }
        Ok(r) if r.status() == reqwest::StatusCode::NOT_FOUND => {
            return error(StatusCode::NOT_FOUND, "The specified bucket does not exist.");
        }
        Ok(r) => return error(StatusCode::BAD_GATEWAY, &format!("the emulator answered {}", r.status())),
        Err(e) => return error(StatusCode::BAD_GATEWAY, &format!("the emulator is unreachable: {e}")),
    };
    match (method, id) {
        (Method::GET, None) => {
            let state = s.state.lock().unwrap();
            let items: Vec<Value> =
                state.notifications.get(bucket).map(|m| m.values().cloned().collect()).unwrap_or_default();
            ok(json!({"kind": "storage#notifications", "items": items}))
        }
        (Method::GET, Some(id)) => match s.state.lock().unwrap().notifications.get(bucket).and_then(|m| m.get(id)) {
            Some(n) => ok(n.clone()),
            None => error(StatusCode::NOT_FOUND, "Not Found"),
        },
        (Method::DELETE, Some(id)) => {
            match s.state.lock().unwrap().notifications.get_mut(bucket).and_then(|m| m.remove(id)) {
                Some(_) => StatusCode::NO_CONTENT.into_response(),
                None => error(StatusCode::NOT_FOUND, "Not Found"),
            }
        }
        (Method::POST, None) => insert(s, bucket, &project_number, body).await,
        _ => error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"),
    }
}

async fn insert(s: &Shared, bucket: &str, project_number: &str, body: &Bytes) -> Response {
    let Ok(req) = serde_json::from_slice::<Value>(body) else {
        return error(StatusCode::BAD_REQUEST, "Parse Error");
    };
    let Some(topic) = req["topic"].as_str().and_then(|t| t.strip_prefix("//pubsub.googleapis.com/")) else {
        return error(
            StatusCode::BAD_REQUEST,
            "Invalid Value: topic must be //pubsub.googleapis.com/projects/P/topics/T",
        );
    };
    let tp: Vec<&str> = topic.split('/').collect();
    if !matches!(tp.as_slice(), ["projects", p, "topics", t] if !p.is_empty() && !t.is_empty()) {
        return error(
            StatusCode::BAD_REQUEST,
            "Invalid Value: topic must be //pubsub.googleapis.com/projects/P/topics/T",
        );
    }
    let format = req["payload_format"].as_str().unwrap_or("NONE");
    if !["JSON_API_V1", "NONE"].contains(&format) {
        return error(StatusCode::BAD_REQUEST, &format!("Invalid Value: payload_format {format}"));
    }
    if let Some(types) = req.get("event_types") {
        let valid =
            types.as_array().is_some_and(|a| a.iter().all(|t| t.as_str().is_some_and(|t| EVENT_TYPES.contains(&t))));
        if !valid {
            return error(StatusCode::BAD_REQUEST, "Invalid Value: event_types");
        }
    }
    match exists(s, format!("{}/v1/{topic}", s.pubsub)).await {
        Ok(true) => {}
        Ok(false) => return error(StatusCode::BAD_REQUEST, &format!("Cloud Pub/Sub topic {topic} not found")),
        Err(r) => return r,
    }
    // The bucket's own project's service agent publishes; the policy as it has propagated.
    let agent = storage_agent(project_number);
    let member = format!("serviceAccount:{agent}");
    let mut state = s.state.lock().unwrap();
    let allows = |p: &Value| {
        p["bindings"].as_array().into_iter().flatten().any(|b| {
            b["role"] == "roles/pubsub.publisher"
                && b["members"].as_array().is_some_and(|m| m.iter().any(|x| x == &member))
        })
    };
    let now_allowed = state.policies.get(topic).is_some_and(|(p, _)| allows(p));
    let visible = match state.changed.get(topic) {
        Some((before, at)) if at.elapsed() < PROPAGATION => allows(before),
        _ => now_allowed,
    };
    if !visible {
        if now_allowed {
            state.refused_unpropagated += 1;
        }
        return error(
            StatusCode::FORBIDDEN,
            &format!(
                "The service account '{agent}' does not have permission to publish messages to to the Cloud Pub/Sub topic \
                 '//pubsub.googleapis.com/{topic}', or that topic does not exist."
            ),
        );
    }
    let configs = state.notifications.entry(bucket.to_string()).or_default();
    if configs.len() >= 100 {
        return error(StatusCode::BAD_REQUEST, "A bucket has at most 100 notification configurations");
    }
    state.next_id += 1;
    let id = state.next_id.to_string();
    let mut made = json!({
        "kind": "storage#notification",
        "id": id,
        "selfLink": format!("{}/storage/v1/b/{bucket}/notificationConfigs/{id}", s.storage),
        "topic": req["topic"],
        "payload_format": format,
        "etag": id,
    });
    for k in ["event_types", "object_name_prefix", "custom_attributes"] {
        if let Some(v) = req.get(k) {
            made[k] = v.clone();
        }
    }
    state.notifications.entry(bucket.to_string()).or_default().insert(id, made.clone());
    ok(made)
}

async fn iam(s: &Shared, topic: &str, verb: &str, body: &Bytes) -> Response {
    match exists(s, format!("{}/v1/{topic}", s.pubsub)).await {
        Ok(true) => {}
        Ok(false) => return error(StatusCode::NOT_FOUND, &format!("Resource not found (resource={topic}).")),
        Err(r) => return r,
    }
    let etag = |v: u64| format!("BwY{v:05}");
    let mut state = s.state.lock().unwrap();
    let (policy, version) = state.policies.get(topic).cloned().unwrap_or((json!({}), 0));
    match verb {
        "getIamPolicy" => {
            let mut p = policy;
            p["etag"] = json!(etag(version));
            ok(p)
        }
        "setIamPolicy" => {
            let Ok(req) = serde_json::from_slice::<Value>(body) else {
                return error(StatusCode::BAD_REQUEST, "Invalid JSON payload");
            };
            let Some(mut new) = req.get("policy").filter(|p| p.is_object()).cloned() else {
                return error(StatusCode::BAD_REQUEST, "policy is required");
            };
            let version = if state.races > 0 {
                // Another writer got there first.
                state.races -= 1;
                let v = version + 1;
                state.policies.insert(topic.to_string(), (policy.clone(), v));
                v
            } else {
                version
            };
            if let Some(given) = new.get("etag").and_then(Value::as_str)
                && given != etag(version)
            {
                return error(
                    StatusCode::CONFLICT,
                    "There were concurrent policy changes. Please retry the whole read-modify-write with exponential backoff.",
                );
            }
            let before = state.policies.get(topic).map(|(p, _)| p.clone()).unwrap_or_else(|| json!({}));
            let version = version + 1;
            new["etag"] = json!(etag(version));
            state.policies.insert(topic.to_string(), (new.clone(), version));
            state.changed.insert(topic.to_string(), (before, std::time::Instant::now()));
            ok(new)
        }
        other => error(StatusCode::NOT_FOUND, &format!("no such method {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `getIamPolicy` is a GET and `setIamPolicy` a POST in Pub/Sub's REST reference: the other
    /// method on either is refused as Google refuses a method an API does not have (404), so a
    /// client that sends the wrong one fails here as it would against Google.
    #[tokio::test]
    async fn the_wrong_method_on_an_iam_call_is_refused() {
        // (Nothing listens upstream: a refusal is answered before any is asked.)
        let double = GcpDouble::start("http://127.0.0.1:9", "http://127.0.0.1:9");
        let http = reqwest::Client::new();
        let url = |verb: &str| format!("{}/v1/projects/p/topics/t:{verb}", double.endpoint);
        let post_get = http.post(url("getIamPolicy")).json(&json!({})).send().await.unwrap();
        assert_eq!(post_get.status(), 404, "POST to getIamPolicy");
        let get_set = http.get(url("setIamPolicy")).send().await.unwrap();
        assert_eq!(get_set.status(), 404, "GET of setIamPolicy");
        // The right method reaches the policy (here: the topic is looked up upstream, which is down).
        let get = http.get(url("getIamPolicy")).send().await.unwrap();
        assert_ne!(get.status(), 404, "GET of getIamPolicy is served");
    }

    /// A token is refused where its scopes do not reach, as Google refuses it: Resource
    /// Manager's `projects.get` with a token scoped to Cloud Storage and Pub/Sub only is 403
    /// `ACCESS_TOKEN_SCOPE_INSUFFICIENT`; with `cloudplatformprojects.readonly` it is served; a
    /// token the double never issued is 401.
    #[tokio::test]
    async fn a_token_of_the_wrong_scope_is_refused() {
        use base64::Engine;
        let double = GcpDouble::start("http://127.0.0.1:9", "http://127.0.0.1:9");
        let http = reqwest::Client::new();
        let mint = async |scope: &str| {
            let claims = json!({"iss": "sa@p.iam.gserviceaccount.com", "scope": scope, "aud": "x", "iat": 0, "exp": 1});
            let b64 = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
            let jwt = format!("{}.{}.c2ln", b64(&json!({"alg": "RS256"})), b64(&claims));
            let r = http
                .post(format!("{}/token", double.endpoint))
                .form(&[("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"), ("assertion", jwt.as_str())])
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            r.json::<Value>().await.unwrap()["access_token"].as_str().unwrap().to_string()
        };
        let project = format!("{}/v1/projects/p", double.endpoint);
        let narrow =
            mint("https://www.googleapis.com/auth/devstorage.read_write https://www.googleapis.com/auth/pubsub").await;
        let r = http.get(&project).bearer_auth(&narrow).send().await.unwrap();
        assert_eq!(r.status(), 403);
        assert!(r.text().await.unwrap().contains("ACCESS_TOKEN_SCOPE_INSUFFICIENT"));
        let enough = mint("https://www.googleapis.com/auth/cloudplatformprojects.readonly").await;
        let r = http.get(&project).bearer_auth(&enough).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let r = http.get(&project).bearer_auth("ya29.never-issued").send().await.unwrap();
        assert_eq!(r.status(), 401);
    }
}

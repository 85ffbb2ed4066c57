//! A test double for the two Google Cloud APIs that no emulator serves, in front of the
//! emulators that serve the rest:
//!
//! - Cloud Storage JSON API: `notifications.insert/list/get/delete`
//!   (`/storage/v1/b/BUCKET/notificationConfigs[/ID]`) and `projects.serviceAccount.get`
//!   (`/storage/v1/projects/P/serviceAccount`) — fake-gcs-server has neither;
//! - Pub/Sub: `topics.getIamPolicy` (GET) / `topics.setIamPolicy` (POST)
//!   (`/v1/projects/P/topics/T:...`) and the same of subscriptions — the emulator answers 501; a
//!   method the reference does not give (a POST to `getIamPolicy`) is a 404, as Google answers;
//! - Cloud Resource Manager: `projects.get` (`GET /v1/projects/P`), for the project's number.
//!
//! They follow Google's published REST reference: the same paths, bodies, status codes and
//! error shapes (`{"error": {"code", "message", "status"?}}`), 404 for an unknown bucket or
//! topic, 400 for a malformed topic name, payload format or event type, 403 when the bucket's
//! service agent may not publish to the topic, 409 (`ABORTED`) for a policy written over a
//! newer one. Everything else passes through unchanged: Cloud Storage paths to
//! fake-gcs-server, `/v1/...` to the Pub/Sub emulator. The double publishes nothing: in the
//! tests fake-gcs-server publishes the bucket's events to its own topic.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// The email of every project's Cloud Storage service agent here.
pub const SERVICE_AGENT: &str = "service-000000000000@gs-project-accounts.iam.gserviceaccount.com";
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

/// Serves `app` on a free loopback port from a thread of its own (a double works the same under
/// any test, async or not) until the returned sender is dropped; returns its URL.
pub(crate) fn serve_in_thread(app: axum::Router) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port for a test double");
    listener.set_nonblocking(true).expect("non-blocking");
    let endpoint = format!("http://{}", listener.local_addr().expect("its address"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
        });
    });
    (endpoint, stop)
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
        let (endpoint, stop) = serve_in_thread(axum::Router::new().fallback(handle).with_state(shared.clone()));
        GcpDouble { endpoint, shared, _stop: stop }
    }

    /// The notification configurations of `bucket`, as the double holds them.
    pub fn notifications(&self, bucket: &str) -> Vec<Value> {
        let state = self.shared.state.lock().unwrap();
        state.notifications.get(bucket).map(|m| m.values().cloned().collect()).unwrap_or_default()
    }

    /// The access policy of `topic` (`projects/P/topics/T`), if one was set.
    pub fn policy(&self, topic: &str) -> Option<Value> {
        self.shared.state.lock().unwrap().policies.get(topic).map(|(p, _)| p.clone())
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    let reason = match status.as_u16() {
        400 => "INVALID_ARGUMENT",
        403 => "PERMISSION_DENIED",
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
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (method.clone(), parts.as_slice()) {
        (Method::GET, ["storage", "v1", "projects", _, "serviceAccount"]) => {
            ok(json!({"kind": "storage#serviceAccount", "email_address": SERVICE_AGENT}))
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
    match exists(s, format!("{}/storage/v1/b/{bucket}", s.storage)).await {
        Ok(true) => {}
        Ok(false) => return error(StatusCode::NOT_FOUND, "The specified bucket does not exist."),
        Err(r) => return r,
    }
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
        (Method::POST, None) => insert(s, bucket, body).await,
        _ => error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"),
    }
}

async fn insert(s: &Shared, bucket: &str, body: &Bytes) -> Response {
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
    let member = format!("serviceAccount:{SERVICE_AGENT}");
    let mut state = s.state.lock().unwrap();
    let may_publish = state.policies.get(topic).is_some_and(|(p, _)| {
        p["bindings"].as_array().into_iter().flatten().any(|b| {
            b["role"] == "roles/pubsub.publisher"
                && b["members"].as_array().is_some_and(|m| m.iter().any(|x| x == &member))
        })
    });
    if !may_publish {
        return error(
            StatusCode::FORBIDDEN,
            &format!(
                "The service account {SERVICE_AGENT} does not have permission to publish messages to the Cloud Pub/Sub topic {topic}"
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
            if let Some(given) = new.get("etag").and_then(Value::as_str)
                && given != etag(version)
            {
                return error(
                    StatusCode::CONFLICT,
                    "There were concurrent policy changes. Please retry the whole read-modify-write with exponential backoff.",
                );
            }
            let version = version + 1;
            new["etag"] = json!(etag(version));
            state.policies.insert(topic.to_string(), (new.clone(), version));
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
}

//! A test double for Azure Resource Manager, which no emulator serves (Azurite serves the
//! storage data plane only): the Microsoft Entra token endpoint and the Resource Manager operations Tidemark provisions Event Grid
//! delivery with — a storage account's `GET`, Event Grid `systemTopics` and their
//! `eventSubscriptions` (list, get, create or update, delete).
//!
//! It follows the published REST references (Event Grid `2022-06-15`: System Topics and System
//! Topic Event Subscriptions — Create Or Update, Delete, Get, List by Resource Group; and
//! "Track asynchronous Azure operations" and "Understand how Azure Resource Manager throttles
//! requests" for the protocol): `api-version` required (400 `MissingApiVersionParameter`), a
//! bearer token required (401 `AuthenticationFailed`) and issued for Resource Manager's audience
//! (401 `InvalidAuthenticationTokenAudience` for a token of another resource's), 404 `ResourceNotFound` /
//! `ParentResourceNotFound`, one system topic per source (400, as Azure refuses a second), an
//! event subscription's destination and filter checked (a `StorageQueue` destination on a known
//! account; `subjectBeginsWith` under `/blobServices/default/`).
//!
//! **Operations are long-running, as Event Grid's are.** A create or update answers 201 or 200
//! with `provisioningState` `Creating` or `Updating` and an `Azure-AsyncOperation` header; a
//! delete answers 202 with `Location` and `Azure-AsyncOperation`, the resource still listed as
//! `Deleting`; a delete of nothing answers 204. An operation ends [`OPERATION_TIME`] later
//! (`operationsStatus`: `InProgress`, then `Succeeded` or `Failed` with its error;
//! `operationResults`: 202 with `Retry-After`, then 200, or the error's status). A change to a
//! resource whose operation has not ended — a topic whose event subscription is still being
//! deleted included — is refused 409 `AnotherOperationInProgress`. An event subscription
//! delivers only once `Succeeded`. Faults a test can ask for: 429 `TooManyRequests` (with
//! `Retry-After`) and 409 `AnotherOperationInProgress` on the next requests, and an operation
//! that fails after it was accepted.
//!
//! **Microsoft Entra ID**, as "Microsoft identity platform and the OAuth 2.0 client credentials
//! flow" (learn.microsoft.com, entra/identity-platform/v2-oauth2-client-creds-grant-flow)
//! describes it: `POST /{tenant}/oauth2/v2.0/token` with `grant_type=client_credentials`, a
//! `scope` of `RESOURCE/.default`, and either the service principal's `client_secret` or a
//! `client_assertion` (`urn:ietf:params:oauth:client-assertion-type:jwt-bearer`) — a federated token a
//! test registered (workload identity federation); unknown tenant 400 `AADSTS90002`, wrong
//! secret 401 `AADSTS7000215`, an assertion no federated credential matches 400 `AADSTS70021`,
//! a scope without `/.default` 400 `AADSTS1002012`. And a managed identity's endpoint as App
//! Service and Container Apps serve it ("Managed identities for App Service and Azure Functions",
//! REST endpoint reference): `GET /msi/token?api-version=2019-08-01&resource=R` with the
//! `X-IDENTITY-HEADER` secret (400 without it), `expires_on` a string of epoch seconds.
//! Tokens are JWTs with the claims Azure Storage checks (`iss` `https://sts.windows.net/TENANT/`,
//! `aud`, `nbf`, `exp`), so Azurite's OAuth mode takes the storage audience's; their lifetime is
//! a test's choice ([`AzureArmDouble::token_lifetime`]), and Resource Manager refuses an expired
//! one (401 `ExpiredAuthenticationToken`). Everything is served over HTTPS (its [`TestCa`]):
//! Microsoft's identity libraries refuse an authority that is not.
//!
//! Lists are paged (`nextLink`, `$skiptoken`) a page of one item at a time, so a client that
//! reads only the first page misses the rest; `deliveries` compares subjects without case
//! unless the filter's `isSubjectCaseSensitive` says otherwise, as Event Grid does. It delivers
//! nothing: [`AzureArmDouble::deliveries`] says which queues an event would reach, so a test can
//! put it there as Event Grid would.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::TestCa;
use crate::doubles::{form_of, serve_in_thread};

/// How long each long-running operation takes here.
pub const OPERATION_TIME: Duration = Duration::from_millis(300);

#[derive(Default)]
struct Arm {
    /// resource id (lower-cased) -> resource
    topics: BTreeMap<String, Value>,
    /// resource id (lower-cased) -> resource
    event_subscriptions: BTreeMap<String, Value>,
    /// token -> the scope it was issued for, and when it expires
    tokens: BTreeMap<String, (String, Instant)>,
    /// (how, audience) of every token issued: `client_secret`, `workload_identity`, `managed_identity`
    issued: Vec<(String, String)>,
    /// client id -> the federated tokens its federated credentials accept
    federated: BTreeMap<String, Vec<String>>,
    /// The `X-IDENTITY-HEADER` the managed identity endpoint wants.
    identity_header: Option<String>,
    /// How long tokens issued from now on last.
    lifetime: Option<Duration>,
    /// operation id -> operation
    operations: BTreeMap<String, Operation>,
    faults: Faults,
    /// Requests to an operation's status or result.
    polls: u64,
}

/// Faults asked for by a test, each used up as it is answered.
#[derive(Default)]
struct Faults {
    /// The next requests to Resource Manager answered 429.
    throttled: u32,
    /// The next changes (PUT, DELETE) answered 409 `AnotherOperationInProgress`.
    busy: u32,
    /// The next operation accepted ends `Failed` with this code and message.
    fail_next: Option<(String, String)>,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Topic,
    EventSubscription,
}

enum Effect {
    /// The resource (kind, lower-cased id) becomes `Succeeded`.
    Provision(Kind, String),
    /// The resource is gone (a topic with its event subscriptions).
    Remove(Kind, String),
}

struct Operation {
    ends: Instant,
    effect: Effect,
    /// `InProgress`, `Succeeded` or `Failed`.
    status: &'static str,
    error: Option<(String, String)>,
    /// Whether a delete (whose result is 204, not a resource).
    delete: bool,
}

impl Arm {
    fn resources(&mut self, kind: Kind) -> &mut BTreeMap<String, Value> {
        match kind {
            Kind::Topic => &mut self.topics,
            Kind::EventSubscription => &mut self.event_subscriptions,
        }
    }

    /// Ends every operation whose time has come, as Resource Manager would have meanwhile.
    fn settle(&mut self) {
        let now = Instant::now();
        let due: Vec<String> = self
            .operations
            .iter()
            .filter(|(_, o)| o.status == "InProgress" && o.ends <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            let op = self.operations.get_mut(&id).expect("listed");
            let failed = op.error.is_some();
            op.status = if failed { "Failed" } else { "Succeeded" };
            let (kind, key, remove) = match &op.effect {
                Effect::Provision(k, key) => (*k, key.clone(), false),
                Effect::Remove(k, key) => (*k, key.clone(), true),
            };
            match (remove, failed) {
                (true, false) => {
                    self.resources(kind).remove(&key);
                    if kind == Kind::Topic {
                        let prefix = format!("{key}/eventsubscriptions/");
                        self.event_subscriptions.retain(|k, _| !k.starts_with(&prefix));
                    }
                }
                (true, true) => set_state(self.resources(kind), &key, "Succeeded"),
                (false, failed) => set_state(self.resources(kind), &key, if failed { "Failed" } else { "Succeeded" }),
            }
        }
    }

    /// Whether an operation on `key` (or, for a topic, on one of its event subscriptions) has
    /// not ended.
    fn busy(&self, key: &str) -> bool {
        let changing = |v: &Value| {
            matches!(v["properties"]["provisioningState"].as_str(), Some("Creating" | "Updating" | "Deleting"))
        };
        let nested = format!("{key}/eventsubscriptions/");
        self.topics.get(key).is_some_and(changing)
            || self.event_subscriptions.iter().any(|(k, v)| (k == key || k.starts_with(&nested)) && changing(v))
    }

    /// Accepts an operation on the resource; its id.
    fn begin(&mut self, effect: Effect, delete: bool) -> String {
        let id = format!("op-{:04}", self.operations.len() + 1);
        let error = self.faults.fail_next.take();
        self.operations.insert(
            id.clone(),
            Operation { ends: Instant::now() + OPERATION_TIME, effect, status: "InProgress", error, delete },
        );
        id
    }
}

fn set_state(resources: &mut BTreeMap<String, Value>, key: &str, state: &str) {
    if let Some(r) = resources.get_mut(key) {
        r["properties"]["provisioningState"] = json!(state);
    }
}

struct Shared {
    tenant: String,
    client_id: String,
    client_secret: String,
    /// storage account name -> location
    accounts: BTreeMap<String, String>,
    arm: Mutex<Arm>,
}

pub struct AzureArmDouble {
    /// `https://127.0.0.1:PORT`: use it as `-azure.arm_endpoint` and `-azure.login_endpoint`.
    pub endpoint: String,
    /// The certificates it serves with: a client trusts `tls.ca` (`SSL_CERT_FILE` for a
    /// Tidemark process); Azurite's OAuth mode can serve `tls.cert`/`tls.key` too.
    pub tls: TestCa,
    shared: Arc<Shared>,
    _stop: tokio::sync::oneshot::Sender<()>,
    _certs: tempfile::TempDir,
}

impl AzureArmDouble {
    /// A double that signs in `client_id`/`client_secret` of `tenant` and knows the storage
    /// `accounts` (name, location) of every subscription and resource group.
    pub fn start(tenant: &str, client_id: &str, client_secret: &str, accounts: &[(&str, &str)]) -> AzureArmDouble {
        let shared = Arc::new(Shared {
            tenant: tenant.into(),
            client_id: client_id.into(),
            client_secret: client_secret.into(),
            accounts: accounts.iter().map(|(a, l)| (a.to_string(), l.to_string())).collect(),
            arm: Mutex::default(),
        });
        let app = axum::Router::new().fallback(handle).with_state(shared.clone());
        let certs = tempfile::tempdir().expect("a directory for the double's certificates");
        let tls = TestCa::new(certs.path());
        let (endpoint, stop) = serve_in_thread(app, Some(&tls));
        AzureArmDouble { endpoint, tls, shared, _stop: stop, _certs: certs }
    }

    /// A client that trusts the double (and Azurite serving its certificate).
    pub fn client(&self) -> reqwest::Client {
        let pem = std::fs::read(&self.tls.ca).expect("the CA's certificate");
        reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(&pem).expect("a PEM certificate")])
            .build()
            .expect("an HTTPS client")
    }

    /// Tokens issued from now on last `lifetime` (Entra's are about an hour).
    pub fn token_lifetime(&self, lifetime: Duration) {
        self.shared.arm.lock().unwrap().lifetime = Some(lifetime);
    }

    /// Workload identity federation: `client_id` accepts `token` as its client assertion.
    pub fn federate(&self, client_id: &str, token: &str) {
        self.shared.arm.lock().unwrap().federated.entry(client_id.into()).or_default().push(token.into());
    }

    /// The managed identity endpoint (`ENDPOINT/msi/token`, for `IDENTITY_ENDPOINT`) answers
    /// requests that carry `header` as `X-IDENTITY-HEADER`.
    pub fn managed_identity(&self, header: &str) -> String {
        self.shared.arm.lock().unwrap().identity_header = Some(header.into());
        format!("{}/msi/token", self.endpoint)
    }

    /// (how, audience) of every token issued so far.
    pub fn issued(&self) -> Vec<(String, String)> {
        self.shared.arm.lock().unwrap().issued.clone()
    }

    /// The system topics, as the double holds them (operations due by now ended).
    pub fn system_topics(&self) -> Vec<Value> {
        let mut arm = self.shared.arm.lock().unwrap();
        arm.settle();
        arm.topics.values().cloned().collect()
    }

    /// Answers the next `n` requests to Resource Manager 429 `TooManyRequests`, `Retry-After: 1`.
    pub fn throttle(&self, n: u32) {
        self.shared.arm.lock().unwrap().faults.throttled = n;
    }

    /// Answers the next `n` changes (PUT, DELETE) 409 `AnotherOperationInProgress`, as when
    /// another client is changing the resource.
    pub fn busy(&self, n: u32) {
        self.shared.arm.lock().unwrap().faults.busy = n;
    }

    /// The next operation accepted ends `Failed` with `code` and `message`, after it was
    /// accepted (as Event Grid does when it cannot validate a destination).
    pub fn fail_next_operation(&self, code: &str, message: &str) {
        self.shared.arm.lock().unwrap().faults.fail_next = Some((code.into(), message.into()));
    }

    /// The faults asked for and not yet answered (429s, 409s, failing operations).
    pub fn faults_left(&self) -> u32 {
        let arm = self.shared.arm.lock().unwrap();
        arm.faults.throttled + arm.faults.busy + u32::from(arm.faults.fail_next.is_some())
    }

    /// How many times an operation's status or result was asked for.
    pub fn polls(&self) -> u64 {
        self.shared.arm.lock().unwrap().polls
    }

    /// Adds a system topic `name` for `account` in subscription `sub`, group `rg` (one another
    /// tool made), as Resource Manager would hold it.
    pub fn add_system_topic(&self, sub: &str, rg: &str, name: &str, account: &str, location: &str) {
        let id = format!("/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.EventGrid/systemTopics/{name}");
        let source =
            format!("/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Storage/storageAccounts/{account}");
        let topic = json!({
            "id": id, "name": name, "type": "Microsoft.EventGrid/systemTopics", "location": location,
            "properties": {"source": source, "topicType": "Microsoft.Storage.StorageAccounts", "provisioningState": "Succeeded"},
        });
        self.shared.arm.lock().unwrap().topics.insert(id.to_ascii_lowercase(), topic);
    }

    /// The event subscriptions, as the double holds them (operations due by now ended).
    pub fn event_subscriptions(&self) -> Vec<Value> {
        let mut arm = self.shared.arm.lock().unwrap();
        arm.settle();
        arm.event_subscriptions.values().cloned().collect()
    }

    /// The queues (account, queue) an event of `event_type` about `subject` would be delivered
    /// to: every event subscription whose filter takes it.
    pub fn deliveries(&self, event_type: &str, subject: &str) -> Vec<(String, String)> {
        let mut arm = self.shared.arm.lock().unwrap();
        arm.settle();
        arm.event_subscriptions
            .values()
            // Only an event subscription whose creation has ended delivers.
            .filter(|s| s["properties"]["provisioningState"] == "Succeeded")
            .filter(|s| {
                let f = &s["properties"]["filter"];
                let typed = f["includedEventTypes"].as_array().is_none_or(|t| t.iter().any(|t| t == event_type));
                // Event Grid compares subjects without case unless `isSubjectCaseSensitive`.
                let exact = f["isSubjectCaseSensitive"].as_bool().unwrap_or(false);
                let under = f["subjectBeginsWith"].as_str().is_none_or(|p| {
                    if exact { subject.starts_with(p) } else { subject.to_lowercase().starts_with(&p.to_lowercase()) }
                });
                typed && under
            })
            .filter_map(|s| {
                let d = &s["properties"]["destination"]["properties"];
                let account = d["resourceId"].as_str()?.rsplit('/').next()?.to_string();
                Some((account, d["queueName"].as_str()?.to_string()))
            })
            .collect()
    }
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    (status, axum::Json(json!({"error": {"code": code, "message": message}}))).into_response()
}

async fn handle(State(s): State<Arc<Shared>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let bearer = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    let host = req.headers().get("host").and_then(|v| v.to_str().ok()).unwrap_or("127.0.0.1").to_string();
    let identity_header = req.headers().get("x-identity-header").and_then(|v| v.to_str().ok()).map(str::to_string);
    let body = axum::body::to_bytes(req.into_body(), 1 << 20).await.unwrap_or_default();
    if path.ends_with("/oauth2/v2.0/token") {
        return token(&s, &path, &body);
    }
    if path == "/msi/token" {
        return managed_token(&s, &query, identity_header.as_deref());
    }
    if !query.split('&').any(|kv| kv.starts_with("api-version=") && kv.len() > "api-version=".len()) {
        return error(
            StatusCode::BAD_REQUEST,
            "MissingApiVersionParameter",
            "The api-version query parameter (?api-version=) is required for all requests.",
        );
    }
    let scope = bearer.and_then(|t| s.arm.lock().unwrap().tokens.get(&t).cloned());
    if let Some((_, expires)) = &scope
        && Instant::now() >= *expires
    {
        return error(
            StatusCode::UNAUTHORIZED,
            "ExpiredAuthenticationToken",
            "The access token expiry UTC time is earlier than current UTC time.",
        );
    }
    let Some((scope, _)) = scope else {
        return error(
            StatusCode::UNAUTHORIZED,
            "AuthenticationFailed",
            "Authentication failed. The 'Authorization' header is missing or invalid.",
        );
    };
    // A token for another resource (storage, Graph) is not one for Resource Manager.
    let audience = scope.trim_end_matches("/.default").trim_end_matches('/');
    if audience != "https://management.azure.com" && audience != format!("https://{host}") {
        return error(
            StatusCode::UNAUTHORIZED,
            "InvalidAuthenticationTokenAudience",
            &format!("The access token has been obtained for wrong audience or resource '{audience}'."),
        );
    }
    {
        let mut arm = s.arm.lock().unwrap();
        arm.settle();
        if arm.faults.throttled > 0 {
            arm.faults.throttled -= 1;
            let mut r = error(
                StatusCode::TOO_MANY_REQUESTS,
                "TooManyRequests",
                "The request is being throttled as the limit has been reached for operation type. Retry after 1 second.",
            );
            r.headers_mut().insert("retry-after", "1".parse().unwrap());
            return r;
        }
        if arm.faults.busy > 0 && (method == Method::PUT || method == Method::DELETE) {
            arm.faults.busy -= 1;
            return another_operation(&path);
        }
    }
    let body: Value = if body.is_empty() { Value::Null } else { serde_json::from_slice(&body).unwrap_or(Value::Null) };
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let lower: Vec<String> = parts.iter().map(|p| p.to_ascii_lowercase()).collect();
    let l: Vec<&str> = lower.iter().map(String::as_str).collect();
    let origin = format!("https://{host}");
    match l.as_slice() {
        ["subscriptions", _, "providers", "microsoft.eventgrid", "locations", _, which, op]
            if method == Method::GET && (*which == "operationsstatus" || *which == "operationresults") =>
        {
            operation(&s, which == &"operationresults", op, &origin, &path, &query)
        }
        ["subscriptions", _, "resourcegroups", _, "providers", "microsoft.storage", "storageaccounts", _] => {
            let name = parts[7];
            match (method, s.accounts.get(name)) {
                (Method::GET, Some(location)) => (
                    StatusCode::OK,
                    axum::Json(json!({
                        "id": path, "name": name, "type": "Microsoft.Storage/storageAccounts", "location": location,
                        "kind": "StorageV2",
                    })),
                )
                    .into_response(),
                (Method::GET, None) => error(
                    StatusCode::NOT_FOUND,
                    "ResourceNotFound",
                    &format!("The Resource 'Microsoft.Storage/storageAccounts/{name}' was not found."),
                ),
                _ => error(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "not served by the double"),
            }
        }
        ["subscriptions", _, "resourcegroups", _, "providers", "microsoft.eventgrid", "systemtopics", rest @ ..] => {
            let base = parts[..7].join("/");
            let url = format!("{origin}{path}");
            let asked = Asked { url: &url, query: &query, origin: &origin, subscription: parts[1] };
            topics(&s, method, &format!("/{base}"), rest, &parts[7..], body, asked)
        }
        _ => error(StatusCode::NOT_FOUND, "InvalidResourceType", &format!("not served by the double: {path}")),
    }
}

fn entra_error(status: StatusCode, error: &str, description: &str) -> Response {
    let code: u32 =
        description.trim_start_matches("AADSTS").split(':').next().and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, axum::Json(json!({"error": error, "error_description": description, "error_codes": [code]})))
        .into_response()
}

fn token(s: &Shared, path: &str, body: &[u8]) -> Response {
    let form = form_of(body);
    let tenant = path.trim_start_matches('/').split('/').next().unwrap_or("");
    if tenant != s.tenant {
        return entra_error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            &format!("AADSTS90002: Tenant '{tenant}' not found."),
        );
    }
    if form.get("grant_type").map(String::as_str) != Some("client_credentials") {
        return entra_error(
            StatusCode::BAD_REQUEST,
            "unsupported_grant_type",
            "AADSTS70003: The app requested an unsupported grant type.",
        );
    }
    let scope = form.get("scope").cloned().unwrap_or_default();
    if !scope.ends_with("/.default") || scope.contains(' ') {
        return entra_error(
            StatusCode::BAD_REQUEST,
            "invalid_scope",
            "AADSTS1002012: The provided value for scope is not valid. Client credential flows must have a scope value with /.default suffixed to the resource identifier.",
        );
    }
    let client = form.get("client_id").cloned().unwrap_or_default();
    let how = match (form.get("client_secret"), form.get("client_assertion_type"), form.get("client_assertion")) {
        (Some(secret), None, None) => {
            if client != s.client_id || *secret != s.client_secret {
                return entra_error(
                    StatusCode::UNAUTHORIZED,
                    "invalid_client",
                    "AADSTS7000215: Invalid client secret provided.",
                );
            }
            "client_secret"
        }
        (None, Some(kind), Some(assertion)) if kind == "urn:ietf:params:oauth:client-assertion-type:jwt-bearer" => {
            let arm = s.arm.lock().unwrap();
            if !arm.federated.get(&client).is_some_and(|ts| ts.contains(assertion)) {
                return entra_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_client",
                    "AADSTS70021: No matching federated identity record found for presented assertion.",
                );
            }
            "workload_identity"
        }
        _ => {
            return entra_error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "AADSTS7000218: The request body must contain the following parameter: 'client_assertion' or 'client_secret'.",
            );
        }
    };
    let (access_token, lifetime) = issue(s, how, &client, scope.trim_end_matches("/.default"));
    (
        StatusCode::OK,
        axum::Json(json!({
            "token_type": "Bearer", "expires_in": lifetime.as_secs(), "ext_expires_in": lifetime.as_secs(),
            "access_token": access_token,
        })),
    )
        .into_response()
}

/// The managed identity endpoint of App Service and Container Apps (api-version 2019-08-01).
fn managed_token(s: &Shared, query: &str, header: Option<&str>) -> Response {
    let want = s.arm.lock().unwrap().identity_header.clone();
    if want.is_none() || header != want.as_deref() {
        return entra_error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "The X-IDENTITY-HEADER header is missing or wrong.",
        );
    }
    let q = form_of(query.as_bytes());
    if q.get("api-version").map(String::as_str) != Some("2019-08-01") {
        return entra_error(StatusCode::BAD_REQUEST, "invalid_request", "api-version 2019-08-01 is required.");
    }
    let Some(resource) = q.get("resource").filter(|r| !r.is_empty()) else {
        return entra_error(StatusCode::BAD_REQUEST, "invalid_request", "The resource parameter is required.");
    };
    let client = q.get("client_id").cloned().unwrap_or_else(|| "system-assigned".into());
    let (access_token, lifetime) = issue(s, "managed_identity", &client, resource.trim_end_matches('/'));
    let expires_on = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap() + lifetime;
    (
        StatusCode::OK,
        axum::Json(json!({
            "access_token": access_token, "expires_on": expires_on.as_secs().to_string(), "resource": resource,
            "token_type": "Bearer", "client_id": client,
        })),
    )
        .into_response()
}

/// A token for `audience`: a JWT with the claims Azure Storage checks, signed with a key only
/// the double knows (Azurite checks claims, not signatures; Resource Manager here looks it up).
fn issue(s: &Shared, how: &str, client: &str, audience: &str) -> (String, Duration) {
    let mut arm = s.arm.lock().unwrap();
    let lifetime = arm.lifetime.unwrap_or(Duration::from_secs(3599));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let claims = json!({
        "aud": audience, "iss": format!("https://sts.windows.net/{}/", s.tenant), "iat": now, "nbf": now - 60,
        "exp": now + lifetime.as_secs(), "tid": s.tenant, "appid": client, "oid": format!("oid-{client}"),
        "jti": format!("{}", arm.issued.len() + 1),
    });
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(b"the azure double's signing key").expect("an HMAC key"),
    )
    .expect("a signed token");
    arm.issued.push((how.to_string(), audience.to_string()));
    arm.tokens.insert(token.clone(), (format!("{audience}/.default"), Instant::now() + lifetime));
    (token, lifetime)
}

/// How many items a list's page holds here. Resource Manager pages lists at sizes of its own
/// choosing and says so with `nextLink` (a whole URL, `$skiptoken` in it) while more follow; a
/// page of one makes every client that reads only the first page miss the rest.
const PAGE: usize = 1;

/// One page of `items` for the list at `url` (`query` its query string): `value` and, while
/// more follow, `nextLink`.
fn page(items: Vec<Value>, url: &str, query: &str) -> Response {
    let skip: usize = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("$skiptoken=").or_else(|| kv.strip_prefix("%24skiptoken=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let value: Vec<Value> = items.iter().skip(skip).take(PAGE).cloned().collect();
    let mut body = json!({ "value": value });
    if skip + PAGE < items.len() {
        let api = query.split('&').find(|kv| kv.starts_with("api-version=")).unwrap_or_default();
        body["nextLink"] = json!(format!("{url}?{api}&$skiptoken={}", skip + PAGE));
    }
    (StatusCode::OK, axum::Json(body)).into_response()
}

/// Where the request was sent, for the `nextLink`s and operation URLs of its answer.
struct Asked<'a> {
    url: &'a str,
    query: &'a str,
    /// `http://host:port`
    origin: &'a str,
    /// The Azure subscription in the path.
    subscription: &'a str,
}

fn another_operation(path: &str) -> Response {
    error(
        StatusCode::CONFLICT,
        "AnotherOperationInProgress",
        &format!("Another operation on this or a dependent resource is in progress: {path}. Retry later."),
    )
}

/// The answer that accepts an operation: `status` with `body` (a create or update), or 202 (a
/// delete), and where to follow it.
fn accepted(asked: &Asked<'_>, location: &str, op: &str, status: StatusCode, body: Option<Value>) -> Response {
    let base = format!(
        "{}/subscriptions/{}/providers/Microsoft.EventGrid/locations/{location}",
        asked.origin, asked.subscription
    );
    let mut r = match body {
        Some(b) => (status, axum::Json(b)).into_response(),
        None => status.into_response(),
    };
    let h = r.headers_mut();
    h.insert("azure-asyncoperation", format!("{base}/operationsStatus/{op}?{API}").parse().unwrap());
    if status == StatusCode::ACCEPTED {
        h.insert("location", format!("{base}/operationResults/{op}?{API}").parse().unwrap());
        h.insert("retry-after", "1".parse().unwrap());
    }
    r
}

/// Event Grid's api-version, in the operation URLs it answers.
const API: &str = "api-version=2022-06-15";

/// `GET .../operationsStatus/{op}` (the status document) or `.../operationResults/{op}` (202
/// while running, then the outcome's status).
fn operation(s: &Shared, result: bool, op: &str, origin: &str, path: &str, query: &str) -> Response {
    let mut arm = s.arm.lock().unwrap();
    arm.polls += 1;
    let Some(o) = arm.operations.get(op) else {
        return error(StatusCode::NOT_FOUND, "OperationNotFound", &format!("The operation '{op}' was not found."));
    };
    if !result {
        let mut doc = json!({"id": path, "name": op, "status": o.status});
        if let (Some((code, message)), "Failed") = (&o.error, o.status) {
            doc["error"] = json!({"code": code, "message": message});
        }
        return (StatusCode::OK, axum::Json(doc)).into_response();
    }
    match (o.status, &o.error) {
        ("InProgress", _) => {
            let mut r = StatusCode::ACCEPTED.into_response();
            r.headers_mut().insert("location", format!("{origin}{path}?{query}").parse().unwrap());
            r.headers_mut().insert("retry-after", "1".parse().unwrap());
            r
        }
        (_, Some((code, message))) => error(StatusCode::BAD_REQUEST, code, message),
        _ if o.delete => StatusCode::NO_CONTENT.into_response(),
        _ => StatusCode::OK.into_response(),
    }
}

fn topics(
    s: &Shared,
    method: Method,
    base: &str,
    rest: &[&str],
    original: &[&str],
    body: Value,
    asked: Asked<'_>,
) -> Response {
    let mut arm = s.arm.lock().unwrap();
    match (method, rest) {
        (Method::GET, []) => {
            let prefix = format!("{}/", base.to_ascii_lowercase());
            let value: Vec<Value> =
                arm.topics.iter().filter(|(k, _)| k.starts_with(&prefix)).map(|(_, v)| v.clone()).collect();
            page(value, asked.url, asked.query)
        }
        (m, [_]) => {
            let id = format!("{base}/{}", original[0]);
            let key = id.to_ascii_lowercase();
            match m {
                Method::GET => match arm.topics.get(&key) {
                    Some(t) => (StatusCode::OK, axum::Json(t.clone())).into_response(),
                    None => {
                        error(StatusCode::NOT_FOUND, "ResourceNotFound", &format!("The Resource '{id}' was not found."))
                    }
                },
                Method::PUT => {
                    let Some(source) = body["properties"]["source"].as_str() else {
                        return error(StatusCode::BAD_REQUEST, "InvalidRequest", "properties.source is required");
                    };
                    if body["properties"]["topicType"] != "Microsoft.Storage.StorageAccounts" {
                        return error(
                            StatusCode::BAD_REQUEST,
                            "InvalidRequest",
                            "properties.topicType: only Microsoft.Storage.StorageAccounts here",
                        );
                    }
                    let Some(location) = body["location"].as_str() else {
                        return error(
                            StatusCode::BAD_REQUEST,
                            "LocationRequired",
                            "The location property is required for this definition.",
                        );
                    };
                    let account = source.rsplit('/').next().unwrap_or("");
                    match s.accounts.get(account) {
                        None => {
                            return error(
                                StatusCode::BAD_REQUEST,
                                "InvalidRequest",
                                &format!("The source resource {source} does not exist."),
                            );
                        }
                        Some(l) if l != location => {
                            return error(
                                StatusCode::BAD_REQUEST,
                                "InvalidRequest",
                                &format!("The system topic must be in the location of its source ({l})."),
                            );
                        }
                        _ => {}
                    }
                    let other = arm.topics.iter().find(|(k, t)| {
                        **k != key && t["properties"]["source"].as_str().is_some_and(|x| x.eq_ignore_ascii_case(source))
                    });
                    if let Some((_, t)) = other {
                        return error(
                            StatusCode::BAD_REQUEST,
                            "InvalidRequest",
                            &format!(
                                "Only one system topic is allowed per source. The source {source} already has the system topic {}.",
                                t["name"].as_str().unwrap_or("")
                            ),
                        );
                    }
                    if arm.busy(&key) {
                        return another_operation(&id);
                    }
                    let created = !arm.topics.contains_key(&key);
                    let t = json!({
                        "id": id, "name": original[0], "type": "Microsoft.EventGrid/systemTopics", "location": location,
                        "properties": {"source": source, "topicType": "Microsoft.Storage.StorageAccounts",
                                       "provisioningState": if created { "Creating" } else { "Updating" }},
                    });
                    arm.topics.insert(key.clone(), t.clone());
                    let op = arm.begin(Effect::Provision(Kind::Topic, key), false);
                    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
                    accepted(&asked, location, &op, status, Some(t))
                }
                Method::DELETE => {
                    let Some(location) = arm.topics.get(&key).map(|t| t["location"].as_str().unwrap_or("").to_string())
                    else {
                        return StatusCode::NO_CONTENT.into_response();
                    };
                    if arm.busy(&key) {
                        return another_operation(&id);
                    }
                    set_state(&mut arm.topics, &key, "Deleting");
                    let op = arm.begin(Effect::Remove(Kind::Topic, key), true);
                    accepted(&asked, &location, &op, StatusCode::ACCEPTED, None)
                }
                _ => error(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "not served by the double"),
            }
        }
        (m, [_, "eventsubscriptions", tail @ ..]) => {
            let topic = format!("{base}/{}", original[0]);
            let (topic_location, topic_state) = match arm.topics.get(&topic.to_ascii_lowercase()) {
                Some(t) => (
                    t["location"].as_str().unwrap_or("").to_string(),
                    t["properties"]["provisioningState"].as_str().unwrap_or("").to_string(),
                ),
                None => (String::new(), String::new()),
            };
            if topic_state.is_empty() {
                return error(
                    StatusCode::NOT_FOUND,
                    "ParentResourceNotFound",
                    &format!(
                        "Can not perform requested operation on nested resource. Parent resource '{topic}' not found."
                    ),
                );
            }
            match (m, tail) {
                (Method::GET, []) => {
                    let prefix = format!("{}/eventsubscriptions/", topic.to_ascii_lowercase());
                    let value: Vec<Value> = arm
                        .event_subscriptions
                        .iter()
                        .filter(|(k, _)| k.starts_with(&prefix))
                        .map(|(_, v)| v.clone())
                        .collect();
                    page(value, asked.url, asked.query)
                }
                (m, [_]) => {
                    let id = format!("{topic}/eventSubscriptions/{}", original[2]);
                    let key = id.to_ascii_lowercase();
                    match m {
                        Method::GET => match arm.event_subscriptions.get(&key) {
                            Some(e) => (StatusCode::OK, axum::Json(e.clone())).into_response(),
                            None => error(
                                StatusCode::NOT_FOUND,
                                "ResourceNotFound",
                                &format!("The Resource '{id}' was not found."),
                            ),
                        },
                        Method::PUT => {
                            let p = &body["properties"];
                            let d = &p["destination"];
                            if d["endpointType"] != "StorageQueue" {
                                return error(
                                    StatusCode::BAD_REQUEST,
                                    "InvalidRequest",
                                    "destination.endpointType: only StorageQueue here",
                                );
                            }
                            let account =
                                d["properties"]["resourceId"].as_str().and_then(|r| r.rsplit('/').next()).unwrap_or("");
                            if !s.accounts.contains_key(account)
                                || d["properties"]["queueName"].as_str().is_none_or(str::is_empty)
                            {
                                return error(
                                    StatusCode::BAD_REQUEST,
                                    "InvalidRequest",
                                    "destination: a storage account resourceId and a queueName are required",
                                );
                            }
                            if p["filter"]["subjectBeginsWith"]
                                .as_str()
                                .is_some_and(|b| !b.starts_with("/blobServices/default/"))
                            {
                                return error(
                                    StatusCode::BAD_REQUEST,
                                    "InvalidRequest",
                                    "filter.subjectBeginsWith must start with /blobServices/default/ for a storage account topic",
                                );
                            }
                            // Not while the topic or this event subscription is changing.
                            if topic_state != "Succeeded" || arm.busy(&key) {
                                return another_operation(&id);
                            }
                            let created = !arm.event_subscriptions.contains_key(&key);
                            let mut e = json!({"id": id, "name": original[2], "type": "Microsoft.EventGrid/systemTopics/eventSubscriptions", "properties": p.clone()});
                            e["properties"]["provisioningState"] = json!(if created { "Creating" } else { "Updating" });
                            arm.event_subscriptions.insert(key.clone(), e.clone());
                            let op = arm.begin(Effect::Provision(Kind::EventSubscription, key), false);
                            let status = if created { StatusCode::CREATED } else { StatusCode::OK };
                            accepted(&asked, &topic_location, &op, status, Some(e))
                        }
                        Method::DELETE => {
                            if !arm.event_subscriptions.contains_key(&key) {
                                return StatusCode::NO_CONTENT.into_response();
                            }
                            if arm.busy(&key) {
                                return another_operation(&id);
                            }
                            set_state(&mut arm.event_subscriptions, &key, "Deleting");
                            let op = arm.begin(Effect::Remove(Kind::EventSubscription, key), true);
                            accepted(&asked, &topic_location, &op, StatusCode::ACCEPTED, None)
                        }
                        _ => error(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "not served by the double"),
                    }
                }
                _ => error(StatusCode::NOT_FOUND, "InvalidResourceType", "not served by the double"),
            }
        }
        _ => error(StatusCode::NOT_FOUND, "InvalidResourceType", "not served by the double"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resource Manager refuses what Azure refuses before any resource is looked at: a request
    /// without `api-version` (400 `MissingApiVersionParameter`), without a token (401
    /// `AuthenticationFailed`), and with a token for another audience — here Azure Storage's
    /// (401 `InvalidAuthenticationTokenAudience`).
    #[tokio::test]
    async fn requests_resource_manager_refuses_are_refused() {
        let double = AzureArmDouble::start("t1", "app", "secret", &[("acct", "westeurope")]);
        let http = double.client();
        let token = async |scope: &str| {
            let r = http
                .post(format!("{}/t1/oauth2/v2.0/token", double.endpoint))
                .form(&[
                    ("grant_type", "client_credentials"),
                    ("client_id", "app"),
                    ("client_secret", "secret"),
                    ("scope", scope),
                ])
                .send()
                .await
                .unwrap();
            r.json::<Value>().await.unwrap()["access_token"].as_str().unwrap().to_string()
        };
        let account = format!(
            "{}/subscriptions/s/resourceGroups/g/providers/Microsoft.Storage/storageAccounts/acct",
            double.endpoint
        );
        let code = async |r: reqwest::Response| {
            (r.status().as_u16(), r.json::<Value>().await.unwrap()["error"]["code"].clone())
        };
        let right = token(&format!("{}/.default", double.endpoint)).await;
        let r = http.get(&account).bearer_auth(&right).send().await.unwrap();
        assert_eq!(code(r).await, (400, json!("MissingApiVersionParameter")));
        let with_api = format!("{account}?api-version=2023-01-01");
        let r = http.get(&with_api).send().await.unwrap();
        assert_eq!(code(r).await, (401, json!("AuthenticationFailed")));
        let storage = token("https://storage.azure.com/.default").await;
        let r = http.get(&with_api).bearer_auth(&storage).send().await.unwrap();
        assert_eq!(code(r).await, (401, json!("InvalidAuthenticationTokenAudience")));
        let r = http.get(&with_api).bearer_auth(&right).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
}

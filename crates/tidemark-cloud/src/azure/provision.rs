//! Event notifications provisioned on Azure (the reference's "Azure uses Event Grid"): the
//! storage queue (and its poison queue), the storage account's Event Grid system topic (the
//! existing one — Azure allows one per account — or a new one), and an event subscription of
//! this cluster's on it that delivers the container's blob events under the mount's prefix to
//! the queue. Through Azure Resource Manager, signed in with a Microsoft Entra ID identity
//! ([`super::identity::arm_way`]: a service principal, a workload or managed identity, the Azure
//! CLI). The queue exists before the event subscription, so nothing is delivered to
//! nothing. Event Grid's creates and deletes are long-running operations: each is followed to
//! its end (see [`AzureNotifications::arm`]), so a failure after Resource Manager accepted the
//! request is seen, and the teardown's "is any event subscription left?" does not count the one
//! it is deleting. Each resource is recorded in [`ManagedResources`] before it is asked for;
//! teardown goes in reverse, forgiving what is already gone, and removes the system topic only
//! if Tidemark created it and no event subscription is left on it.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use reqwest::Method;
use serde_json::{Value, json};

use tidemark_core::remote::RemoteConf;
use tidemark_core::subscription::{EventNotifications, EventTypes, ManagedResources, Topology};
use tidemark_core::{Error, Result};

use super::client::{AzureClient, encode_path};
use super::identity::{self, Entra};

const EVENT_GRID_API: &str = "2022-06-15";
const STORAGE_API: &str = "2023-01-01";
/// How often one Resource Manager request is sent before its last answer stands.
const ARM_ATTEMPTS: u32 = 6;
/// The longest wait between two attempts or two polls, whatever `Retry-After` says.
const MAX_WAIT: Duration = Duration::from_secs(30);
/// How long a long-running operation is waited for (Event Grid's take seconds to a few minutes).
const OPERATION_TIMEOUT: Duration = Duration::from_secs(600);

/// One answer of Resource Manager, with the headers that say how to go on.
struct ArmAnswer {
    status: u16,
    async_operation: Option<String>,
    location: Option<String>,
    retry_after: Option<Duration>,
    text: String,
}

impl ArmAnswer {
    fn code(&self) -> String {
        let v: Value = serde_json::from_str(&self.text).unwrap_or_default();
        v["error"]["code"].as_str().unwrap_or("").to_string()
    }

    /// The error of a refused call, naming it and what to do.
    fn failure(&self, method: &Method, id: &str) -> Error {
        let v: Value = serde_json::from_str(&self.text).unwrap_or_default();
        let (code, message) =
            (v["error"]["code"].as_str().unwrap_or(""), v["error"]["message"].as_str().unwrap_or(&self.text));
        let what = format!("{method} {id}: Azure answered {} {code}: {message}", self.status);
        match self.status {
            401 | 403 => Error::Unauthorized {
                message: format!("{what}; the service principal needs rights on the storage account and Event Grid"),
            },
            404 => Error::NotFound { path: what },
            409 | 429 | 500.. => Error::Unavailable { message: format!("{what} (after {ARM_ATTEMPTS} attempts)") },
            _ => Error::invalid_argument(what),
        }
    }
}

/// The wait before the next poll: `Retry-After` if the service gave it, else a second.
fn poll_interval(retry_after: Option<Duration>) -> Duration {
    retry_after.unwrap_or(Duration::from_secs(1)).clamp(Duration::from_millis(100), MAX_WAIT)
}

fn still_running(method: &Method, id: &str, how: &str) -> Error {
    Error::Unavailable {
        message: format!(
            "{method} {id}: {how} after {} s; it may yet finish — see the resource group's activity log in the \
             portal, then run the command again",
            OPERATION_TIMEOUT.as_secs()
        ),
    }
}

pub struct AzureNotifications {
    http: reqwest::Client,
    queues: AzureClient,
    account: String,
    container: String,
    subscription_id: String,
    resource_group: String,
    identity: Entra,
    arm: String,
}

/// The Event Grid event types that carry `events` (docs/SEMANTICS.md "Event names": a rename is
/// a removal and a creation, a tier change a change, directory events bounded reconciles).
pub fn event_types_of(events: &EventTypes) -> Vec<String> {
    let mut out = Vec::new();
    let mut add = |t: &'static str| {
        if !out.contains(&t) {
            out.push(t);
        }
    };
    if events.created {
        for t in ["BlobCreated", "BlobTierChanged", "BlobRenamed", "DirectoryCreated", "DirectoryRenamed"] {
            add(t);
        }
    }
    if events.removed {
        for t in ["BlobDeleted", "BlobRenamed", "DirectoryDeleted", "DirectoryRenamed"] {
            add(t);
        }
    }
    out.into_iter().map(|t| format!("Microsoft.Storage.{t}")).collect()
}

fn setting(conf: &RemoteConf, name: &str) -> Result<String> {
    conf.setting(name).map(str::to_string).ok_or_else(|| {
        Error::invalid_argument(format!(
            "remote {:?} has no -azure.{name}: provisioning Event Grid delivery needs -azure.subscription_id, \
             -azure.resource_group and a Microsoft Entra ID identity (a service principal: -azure.tenant_id, \
             -azure.client_id, -azure.client_secret; or -azure.identity=managed_identity|workload_identity|azure_cli) \
             allowed to create Event Grid resources on the storage account; or pass -queue= for a queue Event Grid \
             already delivers to",
            conf.name
        ))
    })
}

impl AzureNotifications {
    pub fn open(conf: &RemoteConf, container: &str) -> Result<Self> {
        let queues = AzureClient::new(conf, "queue")?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| Error::internal(format!("HTTP client: {e}")))?;
        let account = setting(conf, "account")?;
        let subscription_id = setting(conf, "subscription_id")?;
        let resource_group = setting(conf, "resource_group")?;
        let identity = Entra::new(conf, identity::arm_way(conf)?, http.clone())?;
        Ok(AzureNotifications {
            http,
            queues,
            account,
            container: container.to_string(),
            subscription_id,
            resource_group,
            identity,
            arm: conf
                .setting("arm_endpoint")
                .unwrap_or("https://management.azure.com")
                .trim_end_matches('/')
                .to_string(),
        })
    }

    fn account_id(&self) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Storage/storageAccounts/{}",
            self.subscription_id, self.resource_group, self.account
        )
    }

    fn topics(&self) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.EventGrid/systemTopics",
            self.subscription_id, self.resource_group
        )
    }

    /// A token for Resource Manager, whose audience is its endpoint.
    async fn token(&self) -> Result<String> {
        self.identity.token(&format!("{}/.default", self.arm)).await
    }

    /// One Resource Manager call on `id` (a resource id, or a whole URL: a list's `nextLink`),
    /// carried to its end: retried while Resource Manager says to wait (429, 409
    /// `AnotherOperationInProgress`, 500/502/503/504 — every call here is idempotent), and an
    /// asynchronous answer (`Azure-AsyncOperation`, a 202 with `Location`, or a resource still
    /// `Creating`/`Updating`/`Deleting`) polled until the operation ends, within
    /// [`OPERATION_TIMEOUT`]. `Ok(None)` for a 404 (or a delete's 204) when `missing_ok`.
    /// Reference: "Track asynchronous Azure operations" and "Understand how Azure Resource
    /// Manager throttles requests" (learn.microsoft.com, azure-resource-manager/management).
    async fn arm(
        &self,
        method: Method,
        id: &str,
        api: &str,
        body: Option<Value>,
        missing_ok: bool,
    ) -> Result<Option<Value>> {
        let url = self.url_of(id, api);
        let answer = self.request(&method, id, &url, body.as_ref()).await?;
        if missing_ok && (answer.status == 404 || answer.status == 204) {
            return Ok(None);
        }
        if !(200..300).contains(&answer.status) {
            return Err(answer.failure(&method, id));
        }
        let began = Instant::now();
        if let Some(op) = answer.async_operation.clone() {
            self.wait_status(&method, id, &op, answer.retry_after, began).await?;
        } else if answer.status == 202
            && let Some(location) = answer.location.clone()
        {
            self.wait_location(&method, id, &location, answer.retry_after, began).await?;
        }
        if method == Method::DELETE {
            return Ok(None);
        }
        // The resource as the operation left it; a PUT that answered a state still changing, with
        // no operation to follow, is followed through the resource itself.
        let mut now: Value = if answer.async_operation.is_some() && method == Method::PUT {
            let got = self.request(&Method::GET, id, &url, None).await?;
            if !(200..300).contains(&got.status) {
                return Err(got.failure(&Method::GET, id));
            }
            serde_json::from_str(&got.text).unwrap_or(Value::Null)
        } else {
            serde_json::from_str(&answer.text).unwrap_or(Value::Null)
        };
        let mut wait = answer.retry_after;
        loop {
            match now["properties"]["provisioningState"].as_str() {
                None | Some("Succeeded") => return Ok(Some(now)),
                Some(state @ ("Failed" | "Canceled")) => {
                    return Err(Error::Unavailable {
                        message: format!(
                            "{method} {id}: Resource Manager accepted it, then the resource ended {state}; see the                              resource group's activity log in the portal, fix the cause and run the command again"
                        ),
                    });
                }
                Some(state) => {
                    if began.elapsed() >= OPERATION_TIMEOUT {
                        return Err(still_running(&method, id, &format!("the resource is still {state}")));
                    }
                    tokio::time::sleep(poll_interval(wait)).await;
                    let got = self.request(&Method::GET, id, &url, None).await?;
                    if !(200..300).contains(&got.status) {
                        return Err(got.failure(&Method::GET, id));
                    }
                    wait = got.retry_after;
                    now = serde_json::from_str(&got.text).unwrap_or(Value::Null);
                }
            }
        }
    }

    fn url_of(&self, id: &str, api: &str) -> String {
        // A list's `nextLink` and an operation's URL are whole URLs, their api-version in them.
        if id.starts_with("http://") || id.starts_with("https://") {
            id.to_string()
        } else {
            format!("{}{id}?api-version={api}", self.arm)
        }
    }

    /// One request, retried while Resource Manager asks for patience (429, 409
    /// `AnotherOperationInProgress`, 500/502/503/504), honouring `Retry-After`, up to
    /// [`ARM_ATTEMPTS`] times. What it finally answers is returned, whatever its status.
    async fn request(&self, method: &Method, id: &str, url: &str, body: Option<&Value>) -> Result<ArmAnswer> {
        let mut attempt = 1;
        loop {
            let mut rb = self.http.request(method.clone(), url).bearer_auth(self.token().await?);
            if let Some(b) = body {
                rb = rb.json(b);
            }
            let resp = rb.send().await.map_err(|e| Error::Unavailable {
                message: format!("{method} {id}: cannot reach {} ({e}); check -azure.arm_endpoint", self.arm),
            })?;
            let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
            let (async_operation, location) = (header("azure-asyncoperation"), header("location"));
            let retry_after = header("retry-after").and_then(|v| v.trim().parse::<u64>().ok()).map(Duration::from_secs);
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap_or_default();
            let answer = ArmAnswer { status, async_operation, location, retry_after, text };
            let busy = answer.status == 409 && answer.code() == "AnotherOperationInProgress";
            if attempt >= ARM_ATTEMPTS || !(busy || matches!(answer.status, 429 | 500 | 502 | 503 | 504)) {
                return Ok(answer);
            }
            let wait = answer.retry_after.unwrap_or(Duration::from_secs(1 << (attempt - 1))).min(MAX_WAIT);
            tracing::info!(%method, id, status = answer.status, attempt, wait_ms = wait.as_millis() as u64,
                "Resource Manager asked to wait; trying again");
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    /// Polls an `Azure-AsyncOperation` URL until its `status` is `Succeeded` (an error naming
    /// the operation if it is `Failed` or `Canceled`, or still running at the bound).
    async fn wait_status(
        &self,
        method: &Method,
        id: &str,
        op: &str,
        mut wait: Option<Duration>,
        began: Instant,
    ) -> Result<()> {
        loop {
            tokio::time::sleep(poll_interval(wait)).await;
            let got = self.request(&Method::GET, op, op, None).await?;
            if !(200..300).contains(&got.status) {
                return Err(got.failure(&Method::GET, op));
            }
            let v: Value = serde_json::from_str(&got.text).unwrap_or(Value::Null);
            match v["status"].as_str().unwrap_or("") {
                "Succeeded" => return Ok(()),
                state @ ("Failed" | "Canceled") => {
                    let (code, message) =
                        (v["error"]["code"].as_str().unwrap_or(""), v["error"]["message"].as_str().unwrap_or(""));
                    return Err(Error::Unavailable {
                        message: format!(
                            "{method} {id}: Resource Manager accepted it, then its operation ended {state} ({code}:                              {message}); operation {op}"
                        ),
                    });
                }
                state => {
                    if began.elapsed() >= OPERATION_TIMEOUT {
                        return Err(still_running(method, id, &format!("operation {op} is still {state:?}")));
                    }
                    wait = got.retry_after;
                }
            }
        }
    }

    /// Polls a 202's `Location` until it answers something other than 202: a success ends the
    /// operation, an error is the operation's.
    async fn wait_location(
        &self,
        method: &Method,
        id: &str,
        location: &str,
        mut wait: Option<Duration>,
        began: Instant,
    ) -> Result<()> {
        loop {
            tokio::time::sleep(poll_interval(wait)).await;
            let got = self.request(&Method::GET, location, location, None).await?;
            match got.status {
                202 if began.elapsed() >= OPERATION_TIMEOUT => {
                    return Err(still_running(method, id, &format!("{location} still answers 202")));
                }
                202 => wait = got.retry_after,
                200..300 => return Ok(()),
                _ => return Err(got.failure(method, id)),
            }
        }
    }

    async fn queue(&self, name: &str, create: bool) -> Result<()> {
        let method = if create { Method::PUT } else { Method::DELETE };
        let rb = self.queues.request(method, &format!("/{}", encode_path(name)), &[], &[], 0);
        match self
            .queues
            .send(rb, if create { "CreateQueue" } else { "DeleteQueue" }, &format!("azure-queue:{name}"))
            .await
        {
            Ok(_) => Ok(()),
            Err(Error::NotFound { .. }) if !create => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// How many messages the queue `name` holds (its approximate count), if it can be read.
    async fn held(&self, name: &str) -> Option<u64> {
        super::queue::approximate_count(&self.queues, name).await.ok().flatten()
    }

    /// Every item of the collection `id`, page by page: Resource Manager answers a list in pages
    /// (`value`, and `nextLink` while more follow), however few it holds. A missing collection
    /// is empty.
    async fn arm_list(&self, id: &str, api: &str) -> Result<Vec<Value>> {
        let mut items = Vec::new();
        let mut next = Some(id.to_string());
        // (A bound, so a service that kept answering the same link cannot hold this forever.)
        for _ in 0..1000 {
            let Some(at) = next.take() else { return Ok(items) };
            let page = self.arm(Method::GET, &at, api, None, true).await?.unwrap_or_default();
            items.extend(page["value"].as_array().into_iter().flatten().cloned());
            next = page["nextLink"].as_str().filter(|l| !l.is_empty()).map(str::to_string);
        }
        Err(Error::Unavailable { message: format!("GET {id}: Resource Manager's list did not end after 1000 pages") })
    }

    /// The account's system topic (its resource id), if it has one.
    async fn existing_topic(&self) -> Result<Option<String>> {
        let list = self.arm_list(&self.topics(), EVENT_GRID_API).await?;
        let source = self.account_id().to_ascii_lowercase();
        Ok(list.iter().find_map(|t| {
            let same = t["properties"]["source"].as_str().is_some_and(|s| s.to_ascii_lowercase() == source);
            same.then(|| t["id"].as_str().map(str::to_string)).flatten()
        }))
    }
}

#[async_trait]
impl EventNotifications for AzureNotifications {
    async fn provision(
        &self,
        topology: Topology,
        queue_name: &str,
        prefix: &str,
        events: &EventTypes,
        max_receives: u32,
        _fingerprint_of: &(dyn for<'f> Fn(&'f str) -> String + Send + Sync),
        managed: &mut ManagedResources,
    ) -> Result<String> {
        if topology != Topology::SqsDirect {
            return Err(Error::invalid_argument(format!(
                "Azure blob events come through Event Grid to a storage queue: omit -via (not {})",
                topology.as_str()
            )));
        }
        let types = event_types_of(events);
        if types.is_empty() {
            return Err(Error::invalid_argument(
                "Event Grid delivers blobs created and removed (and renames, tier changes, directories) only: choose \
                 -events=created and/or removed",
            ));
        }
        // The storage account: where it is, and that the principal may see it.
        let account = self.arm(Method::GET, &self.account_id(), STORAGE_API, None, false).await?.unwrap_or_default();
        let location = account["location"].as_str().unwrap_or("global").to_string();
        // 1. The queue, and the poison queue for what is received too often.
        self.queue(queue_name, true).await?;
        managed.queue_url = Some(queue_name.to_string());
        if max_receives > 0 {
            let poison = format!("{queue_name}-poison");
            self.queue(&poison, true).await?;
            managed.dead_letter_queue_url = Some(poison);
            managed.max_receives = Some(max_receives);
        }
        // 2. The account's system topic: Azure allows one per account, shared by every cluster.
        let topic = match self.existing_topic().await? {
            Some(t) => t,
            None => {
                let id = format!("{}/tidemark-{}", self.topics(), self.account);
                let body = json!({
                    "location": location,
                    "properties": {"source": self.account_id(), "topicType": "Microsoft.Storage.StorageAccounts"},
                });
                // Recorded before it is asked for: an operation that fails after Resource
                // Manager accepted it leaves a (failed) resource for the teardown to take back.
                managed.system_topic = Some(id.clone());
                managed.system_topic_created = true;
                self.arm(Method::PUT, &id, EVENT_GRID_API, Some(body), false).await?;
                id
            }
        };
        managed.system_topic = Some(topic.clone());
        // 3. This cluster's event subscription, into the queue.
        let id = format!("{topic}/eventSubscriptions/{queue_name}");
        let body = json!({"properties": {
            "destination": {"endpointType": "StorageQueue", "properties": {
                "resourceId": self.account_id(), "queueName": queue_name, "queueMessageTimeToLiveInSeconds": -1,
            }},
            "filter": {
                "includedEventTypes": types,
                "subjectBeginsWith": format!("/blobServices/default/containers/{}/blobs/{prefix}", self.container),
                // Blob names are case-sensitive, and so is the prefix (Event Grid's default is not).
                "isSubjectCaseSensitive": true,
            },
            "eventDeliverySchema": "EventGridSchema",
        }});
        managed.event_subscription = Some(id.clone());
        self.arm(Method::PUT, &id, EVENT_GRID_API, Some(body), false).await?;
        Ok(queue_name.to_string())
    }

    async fn teardown(&self, managed: &mut ManagedResources) -> Result<Vec<String>> {
        let mut done = Vec::new();
        if let Some(id) = managed.event_subscription.clone() {
            self.arm(Method::DELETE, &id, EVENT_GRID_API, None, true).await?;
            managed.event_subscription = None;
            done.push(format!("removed event subscription {id}"));
        }
        if let Some(topic) = managed.system_topic.clone() {
            if managed.system_topic_created {
                // Our event subscription's delete has ended (it was waited for), so any left is
                // another cluster's.
                let subs = self.arm_list(&format!("{topic}/eventSubscriptions"), EVENT_GRID_API).await?;
                if subs.is_empty() {
                    self.arm(Method::DELETE, &topic, EVENT_GRID_API, None, true).await?;
                    done.push(format!("removed system topic {topic} (Tidemark made it; no event subscription left)"));
                } else {
                    done.push(format!(
                        "kept system topic {topic}, which Tidemark made: {} other event subscription(s) still use it",
                        subs.len()
                    ));
                }
            } else {
                done.push(format!("kept system topic {topic}: this subscription found it, did not make it"));
            }
            managed.system_topic = None;
            managed.system_topic_created = false;
        }
        if let Some(q) = managed.queue_url.clone() {
            self.queue(&q, false).await?;
            managed.queue_url = None;
            done.push(format!("deleted queue {q}"));
        }
        if let Some(q) = managed.dead_letter_queue_url.clone() {
            let held = self.held(&q).await;
            self.queue(&q, false).await?;
            managed.dead_letter_queue_url = None;
            managed.max_receives = None;
            done.push(match held {
                Some(0) => format!("deleted poison queue {q} (empty)"),
                Some(n) => format!("deleted poison queue {q} with the {n} message(s) it still held"),
                None => format!("deleted poison queue {q} (how many messages it held could not be read)"),
            });
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types() {
        let created = event_types_of(&EventTypes { created: true, removed: false, other: false });
        assert!(
            created.iter().any(|t| t == "Microsoft.Storage.BlobCreated")
                && !created.iter().any(|t| t == "Microsoft.Storage.BlobDeleted")
        );
        let both = event_types_of(&EventTypes::default());
        assert_eq!(both.iter().filter(|t| *t == "Microsoft.Storage.BlobRenamed").count(), 1, "{both:?}");
        assert!(event_types_of(&EventTypes { created: false, removed: false, other: true }).is_empty());
    }
}

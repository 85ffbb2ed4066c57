//! Event notifications provisioned on Google Cloud (the reference's "GCS uses Pub/Sub
//! notifications"): a Pub/Sub topic (Tidemark's own, or an existing one), the publisher role
//! on it for the bucket's Cloud Storage service agent, this cluster's subscription to it, and
//! the bucket's notification configuration (`JSON_API_V1`, the subscription's event types, its
//! prefix as `object_name_prefix`). The subscription exists before the notification
//! configuration, so no event of the new configuration is published to nobody. Each resource is
//! recorded in [`ManagedResources`] as soon as it exists; teardown goes in reverse, forgiving
//! what is already gone.
//!
//! `-via` on GCS: omitted, a topic of the subscription's own (recorded as `sqs_direct`: one
//! topic, one consumer); `-topic=T`, an existing topic shared by several clusters, each with its
//! own subscription (recorded as `sns_fanout`), which Tidemark never deletes.
//!
//! Dead letters: with `-maxReceives=N` (5 to 100, Pub/Sub's bounds; 0: none) a dead-letter
//! topic `NAME-dead` with a subscription that keeps what arrives there, and the subscription's
//! dead-letter policy. Pub/Sub forwards as its own service agent
//! (`service-NUMBER@gcp-sa-pubsub.iam.gserviceaccount.com`, the project's number from Resource
//! Manager): it gets the publisher role on the dead-letter topic and the subscriber role on the
//! subscription, both going with those resources.

use std::time::Duration;

use async_trait::async_trait;
use reqwest::Method;
use serde_json::{Value, json};

use tidemark_core::events::EventSource;
use tidemark_core::remote::RemoteConf;
use tidemark_core::subscription::{EventNotifications, EventTypes, ManagedResources, Topology};
use tidemark_core::{Error, Result};

use super::auth::{Auth, google_error, transport};

const PUBLISHER: &str = "roles/pubsub.publisher";
const SUBSCRIBER: &str = "roles/pubsub.subscriber";
/// Pub/Sub's bounds on `maxDeliveryAttempts`.
const DELIVERY_ATTEMPTS: std::ops::RangeInclusive<u32> = 5..=100;
/// How long Pub/Sub waits for an acknowledgement before redelivering (the consumer extends it
/// per message to its visibility option).
const ACK_DEADLINE_SECS: u64 = 60;
/// How often one Google request (or IAM read-modify-write) is tried before its answer stands.
const GOOGLE_ATTEMPTS: u32 = 5;
/// How long a notification configuration waits for a new publisher grant to take effect:
/// Google's IAM documents a change as usually effective within 60 s, at most 7 minutes.
const PROPAGATION_WAIT: Duration = Duration::from_secs(180);

pub struct GcsNotifications {
    http: reqwest::Client,
    storage: String,
    pubsub: String,
    project: String,
    bucket: String,
    /// `projects/P/topics/T` of an existing topic (`-topic=`), if one was named.
    existing_topic: Option<String>,
    storage_auth: Auth,
    pubsub_auth: Auth,
    /// Cloud Resource Manager, for the project's number.
    resource_manager: String,
    /// The remote's configuration, for a Pub/Sub source of its own (a count of what a
    /// subscription holds, pulled as receives pull).
    conf: RemoteConf,
}

/// The GCS event types that carry `events` (see docs/SEMANTICS.md "Event names": a metadata
/// update is a change of the object, an archived object is gone from its live version).
pub fn event_types_of(events: &EventTypes) -> Vec<&'static str> {
    let mut out = Vec::new();
    if events.created {
        out.extend(["OBJECT_FINALIZE", "OBJECT_METADATA_UPDATE"]);
    }
    if events.removed {
        out.extend(["OBJECT_DELETE", "OBJECT_ARCHIVE"]);
    }
    out
}

/// A Pub/Sub resource name's last part: 3 to 255 letters, digits and `-_.~+%`, starting with a
/// letter, not starting with `goog`.
fn check_resource_name(kind: &str, name: &str) -> Result<()> {
    let ok = (3..=255).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && !name.starts_with("goog")
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.~+%".contains(c));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_argument(format!(
            "{kind} name {name:?}: 3 to 255 letters, digits and - _ . ~ + %, starting with a letter, not with \"goog\""
        )))
    }
}

impl GcsNotifications {
    /// `topic`: an existing topic to use (`projects/P/topics/T`, or `T` in the remote's project).
    pub fn open(conf: &RemoteConf, bucket: &str, topic: Option<&str>) -> Result<Self> {
        let project = conf
            .setting("project")
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "remote {:?} has no -gcs.project: the project of the Pub/Sub topic and subscription Tidemark provisions",
                    conf.name
                ))
            })?
            .to_string();
        let existing_topic = match topic {
            None => None,
            Some(t) if t.starts_with("projects/") => {
                let mut parts = t.split('/');
                match (parts.next(), parts.next(), parts.next(), parts.next(), parts.next()) {
                    (Some("projects"), Some(p), Some("topics"), Some(name), None) if !p.is_empty() => {
                        check_resource_name("topic", name)?;
                        Some(t.to_string())
                    }
                    _ => return Err(Error::invalid_argument(format!("-topic={t:?}: give projects/P/topics/T, or T"))),
                }
            }
            Some(t) => {
                check_resource_name("topic", t)?;
                Some(format!("projects/{project}/topics/{t}"))
            }
        };
        let storage_set = conf.setting("endpoint").map(|e| e.trim_end_matches('/').to_string());
        let (pubsub, pubsub_emulated) = super::pubsub::endpoint_of(conf)?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| Error::internal(format!("HTTP client: {e}")))?;
        Ok(GcsNotifications {
            http,
            storage_auth: Auth::from_conf(conf, super::auth::emulator(conf)?)?,
            pubsub_auth: Auth::from_conf(conf, pubsub_emulated)?,
            storage: storage_set.unwrap_or_else(|| "https://storage.googleapis.com".into()),
            pubsub,
            project,
            bucket: bucket.to_string(),
            existing_topic,
            resource_manager: conf
                .setting("resource_manager_endpoint")
                .unwrap_or("https://cloudresourcemanager.googleapis.com")
                .trim_end_matches('/')
                .to_string(),
            conf: conf.clone(),
        })
    }

    /// One call to Google; `Ok(None)` for a 404 when `missing_ok` (teardown of what is gone).
    async fn call(
        &self,
        method: Method,
        url: String,
        body: Option<Value>,
        (op, target): (&str, &str),
        missing_ok: bool,
    ) -> Result<Option<Value>> {
        let (status, text) = self.send(&method, &url, body.as_ref(), (op, target)).await?;
        if missing_ok && status == 404 {
            return Ok(None);
        }
        if !(200..300).contains(&status) {
            return Err(google_error(status, &text, op, target));
        }
        if text.trim().is_empty() {
            return Ok(Some(Value::Null));
        }
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| Error::internal(format!("{op} {target}: the answer is not JSON ({e})")))
    }

    /// One request, retried as Google's retry guidance says: 429 always (the request was not
    /// served), 500/502/503/504 when repeating it cannot do it twice — every call here but a
    /// notification configuration's insert, which would make a second configuration — after 1,
    /// 2, 4, 8 s. What it finally answers is returned, whatever its status.
    async fn send(
        &self,
        method: &Method,
        url: &str,
        body: Option<&Value>,
        (op, target): (&str, &str),
    ) -> Result<(u16, String)> {
        let (endpoint, auth) = if url.starts_with(&self.storage) {
            (&self.storage, &self.storage_auth)
        } else if url.starts_with(&self.pubsub) {
            (&self.pubsub, &self.pubsub_auth)
        } else {
            (&self.resource_manager, &self.storage_auth)
        };
        let repeatable = !(*method == Method::POST && url.contains("/notificationConfigs"));
        let mut attempt = 1;
        loop {
            let mut rb = self.http.request(method.clone(), url);
            if let Some(b) = body {
                rb = rb.json(b);
            }
            let rb = auth.apply(rb).await?;
            let resp = rb.send().await.map_err(|e| transport(op, target, endpoint, e))?;
            let status = resp.status().as_u16();
            let text = resp.text().await.map_err(|e| transport(op, target, endpoint, e))?;
            let again = status == 429 || (repeatable && matches!(status, 500 | 502 | 503 | 504));
            if !again || attempt >= GOOGLE_ATTEMPTS {
                return Ok((status, text));
            }
            let wait = Duration::from_secs(1 << (attempt - 1));
            tracing::info!(
                op,
                target,
                status,
                attempt,
                wait_ms = wait.as_millis() as u64,
                "Google asked to wait; trying again"
            );
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    /// The Cloud Storage service agent of the bucket's own project — which publishes its
    /// notifications, and may be another project than `-gcs.project` (where the topic is): the
    /// bucket's `projectNumber`, then that project's `serviceAccount`.
    async fn service_agent(&self) -> Result<String> {
        let target = format!("gs://{}", self.bucket);
        let url = format!("{}/storage/v1/b/{}?fields=projectNumber", self.storage, self.bucket);
        let b =
            self.call(Method::GET, url, None, ("reading the project of", &target), false).await?.unwrap_or_default();
        let number = b["projectNumber"]
            .as_str()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| Error::internal(format!("Cloud Storage answered no projectNumber for {target}: {b}")))?;
        let url = format!("{}/storage/v1/projects/{number}/serviceAccount", self.storage);
        let v = self
            .call(Method::GET, url, None, ("reading the Cloud Storage service agent of project", number), false)
            .await?;
        v.and_then(|v| v.get("email_address").and_then(Value::as_str).map(str::to_string)).ok_or_else(|| {
            Error::internal(format!("the Cloud Storage service agent of project {number} has no email_address"))
        })
    }

    /// Creates the Pub/Sub resource `name` (`projects/P/topics/T` or `.../subscriptions/S`).
    async fn create(&self, name: &str, body: Value, what: &str) -> Result<()> {
        self.call(Method::PUT, format!("{}/v1/{name}", self.pubsub), Some(body), (what, name), false).await.map(drop)
    }

    /// Deletes the Pub/Sub resource `slot` names, forgiving one already gone, then forgets it;
    /// its name, if there was one.
    async fn remove(&self, slot: &mut Option<String>, what: &str) -> Result<Option<String>> {
        let Some(name) = slot.clone() else { return Ok(None) };
        self.call(Method::DELETE, format!("{}/v1/{name}", self.pubsub), None, (what, &name), true).await?;
        *slot = None;
        Ok(Some(name))
    }

    /// How many messages the subscription holds, as a pull of it sees them (up to 1,000, given
    /// back at once: Pub/Sub's API counts nothing), pulled as receives pull. `None` if it cannot
    /// be read.
    async fn held(&self, subscription: &str) -> Option<u64> {
        let source = super::PubSubSource::open(&self.conf, subscription).ok()?.with_dead_letter(Some(subscription));
        source.dead_lettered().await.ok().flatten()
    }

    /// The Pub/Sub service agent of the project, which forwards dead letters.
    async fn pubsub_agent(&self) -> Result<String> {
        let url = format!("{}/v1/projects/{}", self.resource_manager, self.project);
        let v =
            self.call(Method::GET, url, None, ("reading the project", &self.project), false).await?.unwrap_or_default();
        let number = v["projectNumber"].as_str().ok_or_else(|| {
            Error::internal(format!("Resource Manager answered no projectNumber for project {}", self.project))
        })?;
        Ok(format!("serviceAccount:service-{number}@gcp-sa-pubsub.iam.gserviceaccount.com"))
    }

    /// Adds (`grant`) or removes `role` of `member` on a topic or subscription (`topic`);
    /// whether the policy changed. The policy's etag makes a concurrent change fail rather than
    /// be overwritten.
    async fn role(&self, topic: &str, role: &str, member: &str, grant: bool) -> Result<bool> {
        // Another writer between the read and the write: the write is refused (409 `ABORTED`),
        // and the whole read-modify-write is done again, as Google's IAM reference asks.
        let mut attempt = 1;
        loop {
            match self.role_once(topic, role, member, grant).await? {
                Some(changed) => return Ok(changed),
                None if attempt < GOOGLE_ATTEMPTS => {
                    let wait = Duration::from_millis(500 << (attempt - 1));
                    tracing::info!(topic, attempt, "the access policy changed meanwhile; reading it again");
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                None => {
                    return Err(Error::Unavailable {
                        message: format!(
                            "changing the access policy of {topic}: it changed under every one of {GOOGLE_ATTEMPTS} \
                             attempts (409 ABORTED); run the command again"
                        ),
                    });
                }
            }
        }
    }

    /// One read-modify-write of `role()`; `None` when the policy changed between the two.
    async fn role_once(&self, topic: &str, role: &str, member: &str, grant: bool) -> Result<Option<bool>> {
        // A GET (`GET /v1/{resource}:getIamPolicy`, Pub/Sub's REST reference); setIamPolicy is a POST.
        let get = format!("{}/v1/{topic}:getIamPolicy", self.pubsub);
        let Some(mut policy) =
            self.call(Method::GET, get, None, ("reading the access policy of", topic), !grant).await?
        else {
            return Ok(Some(false));
        };
        if !policy.is_object() {
            policy = json!({});
        }
        let bindings = policy.as_object_mut().expect("an object").entry("bindings").or_insert_with(|| json!([]));
        let Some(list) = bindings.as_array_mut() else {
            return Err(Error::internal(format!("the access policy of {topic} has bindings that are not a list")));
        };
        let had = list
            .iter()
            .any(|b| b["role"] == role && b["members"].as_array().is_some_and(|m| m.iter().any(|x| x == member)));
        if had == grant {
            return Ok(Some(false));
        }
        if grant {
            match list.iter_mut().find(|b| b["role"] == role) {
                Some(b) => b["members"].as_array_mut().into_iter().for_each(|m| m.push(json!(member))),
                None => list.push(json!({"role": role, "members": [member]})),
            }
        } else {
            for b in list.iter_mut().filter(|b| b["role"] == role) {
                if let Some(m) = b["members"].as_array_mut() {
                    m.retain(|x| x != member);
                }
            }
            list.retain(|b| b["members"].as_array().is_none_or(|m| !m.is_empty()));
        }
        let set = format!("{}/v1/{topic}:setIamPolicy", self.pubsub);
        let what = ("changing the access policy of", topic);
        let (status, text) = self.send(&Method::POST, &set, Some(&json!({ "policy": policy })), what).await?;
        match status {
            200..300 => Ok(Some(true)),
            409 => Ok(None),
            404 if !grant => Ok(Some(false)),
            _ => Err(google_error(status, &text, what.0, what.1)),
        }
    }
}

#[async_trait]
impl EventNotifications for GcsNotifications {
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
        let event_types = event_types_of(events);
        if event_types.is_empty() {
            return Err(Error::invalid_argument(
                "Cloud Storage notifies of objects created (finalize, metadata update) and removed (delete, archive) only: \
                 choose -events=created and/or removed",
            ));
        }
        match (topology, &self.existing_topic) {
            (Topology::SqsDirect, None) | (Topology::SnsFanout, Some(_)) => {}
            _ => {
                return Err(Error::invalid_argument(format!(
                    "Cloud Storage events come through Pub/Sub: omit -via for a topic of this subscription's own, or give -topic= \
                     for an existing one several clusters share (not {})",
                    topology.as_str()
                )));
            }
        }
        check_resource_name("subscription", queue_name)?;
        if max_receives != 0 && !DELIVERY_ATTEMPTS.contains(&max_receives) {
            return Err(Error::invalid_argument(format!(
                "-maxReceives={max_receives}: Pub/Sub dead-letters after 5 to 100 deliveries (or 0: no dead-letter topic)"
            )));
        }
        // 1. The topic.
        let topic = match &self.existing_topic {
            Some(t) => {
                let url = format!("{}/v1/{t}", self.pubsub);
                if self.call(Method::GET, url, None, ("reading the topic", t), true).await?.is_none() {
                    return Err(Error::invalid_argument(format!(
                        "the topic {t} does not exist: create it, or leave out -topic= and Tidemark makes one"
                    )));
                }
                t.clone()
            }
            None => {
                let t = format!("projects/{}/topics/{queue_name}", self.project);
                self.create(&t, json!({}), "creating the topic").await?;
                managed.pubsub_topic = Some(t.clone());
                t
            }
        };
        // 2. Cloud Storage may publish to it.
        let agent = format!("serviceAccount:{}", self.service_agent().await?);
        let granted = self.role(&topic, PUBLISHER, &agent, true).await?;
        if granted && self.existing_topic.is_some() {
            managed.publisher_binding = Some(topic.clone());
            managed.publisher_member = Some(agent.clone());
        }
        // 3. The dead-letter topic and the subscription that keeps its messages, which Pub/Sub's
        // service agent may publish to.
        let sub = format!("projects/{}/subscriptions/{queue_name}", self.project);
        let mut body = json!({ "topic": topic, "ackDeadlineSeconds": ACK_DEADLINE_SECS });
        let pubsub_agent = if max_receives > 0 {
            let agent = self.pubsub_agent().await?;
            let dead = format!("projects/{}/topics/{queue_name}-dead", self.project);
            self.create(&dead, json!({}), "creating the topic").await?;
            managed.dead_letter_queue_arn = Some(dead.clone());
            let kept = format!("projects/{}/subscriptions/{queue_name}-dead", self.project);
            let kept_body = json!({"topic": dead, "messageRetentionDuration": "604800s"});
            self.create(&kept, kept_body, "creating the subscription").await?;
            managed.dead_letter_queue_url = Some(kept);
            managed.max_receives = Some(max_receives);
            self.role(&dead, PUBLISHER, &agent, true).await?;
            body["deadLetterPolicy"] = json!({"deadLetterTopic": dead, "maxDeliveryAttempts": max_receives});
            Some(agent)
        } else {
            None
        };
        // 4. This cluster's subscription, before anything is published.
        self.create(&sub, body, "creating the subscription").await?;
        managed.pubsub_subscription = Some(sub.clone());
        if let Some(agent) = pubsub_agent {
            // Pub/Sub acknowledges what it forwards as a subscriber of the subscription.
            self.role(&sub, SUBSCRIBER, &agent, true).await?;
        }
        // 5. The bucket's notification configuration.
        let mut config = json!({
            "topic": format!("//pubsub.googleapis.com/{topic}"),
            "payload_format": "JSON_API_V1",
            "event_types": event_types,
        });
        if !prefix.is_empty() {
            config["object_name_prefix"] = json!(prefix);
        }
        let url = format!("{}/storage/v1/b/{}/notificationConfigs", self.storage, self.bucket);
        let target = format!("gs://{}", self.bucket);
        let what = ("adding a notification configuration to", target.as_str());
        // A role just granted takes a while to reach Cloud Storage, which refuses the
        // configuration (403, "does not have permission to publish") until it has: waited for,
        // within a bound. A refusal of a role granted earlier (not just now) fails at once.
        let began = std::time::Instant::now();
        let mut wait = Duration::from_secs(2);
        let made = loop {
            let (status, text) = self.send(&Method::POST, &url, Some(&config), what).await?;
            if (200..300).contains(&status) {
                break serde_json::from_str::<Value>(&text).unwrap_or_default();
            }
            let propagating = status == 403 && text.contains("permission to publish");
            if !(granted && propagating) || began.elapsed() >= PROPAGATION_WAIT {
                let mut e = google_error(status, &text, what.0, what.1);
                if granted && propagating {
                    e = Error::Unavailable {
                        message: format!(
                            "{e} — {} s after the publisher role on {topic} was granted to {agent}: IAM has not \
                             propagated yet (Google allows up to 7 minutes); run the command again",
                            PROPAGATION_WAIT.as_secs()
                        ),
                    };
                }
                return Err(e);
            }
            tracing::info!(%topic, %agent, wait_ms = wait.as_millis() as u64,
                "Cloud Storage does not see the publisher role yet (IAM propagation); trying again");
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(30));
        };
        let id = made.get("id").and_then(Value::as_str).ok_or_else(|| {
            Error::internal(format!("the notification configuration of {target} came back without an id: {made}"))
        })?;
        managed.notification_id = Some(id.to_string());
        Ok(sub)
    }

    async fn teardown(&self, managed: &mut ManagedResources) -> Result<Vec<String>> {
        let mut done = Vec::new();
        if let Some(id) = managed.notification_id.clone() {
            let url = format!("{}/storage/v1/b/{}/notificationConfigs/{id}", self.storage, self.bucket);
            let target = format!("notification configuration {id} of gs://{}", self.bucket);
            self.call(Method::DELETE, url, None, ("removing the", &target), true).await?;
            managed.notification_id = None;
            done.push(format!("removed the {target} (the others kept)"));
        }
        if let Some(s) = self.remove(&mut managed.pubsub_subscription, "removing the subscription").await? {
            done.push(format!("removed subscription {s}"));
        }
        if let Some(s) = managed.dead_letter_queue_url.clone() {
            let held = self.held(&s).await;
            self.remove(&mut managed.dead_letter_queue_url, "removing the subscription").await?;
            done.push(match held {
                Some(0) => format!("removed dead-letter subscription {s} (empty)"),
                Some(n) => format!("removed dead-letter subscription {s} with the {n} message(s) it still held"),
                None => format!("removed dead-letter subscription {s} (how many messages it held could not be read)"),
            });
        }
        if let Some(t) = self.remove(&mut managed.dead_letter_queue_arn, "removing the topic").await? {
            done.push(format!("removed dead-letter topic {t}"));
        }
        managed.max_receives = None;
        if let Some(topic) = managed.publisher_binding.clone() {
            let agent = match managed.publisher_member.clone() {
                Some(m) => m,
                // (Recorded by an older version without the member: the bucket's agent now.)
                None => format!("serviceAccount:{}", self.service_agent().await?),
            };
            self.role(&topic, PUBLISHER, &agent, false).await?;
            managed.publisher_binding = None;
            managed.publisher_member = None;
            done.push(format!(
                "took back the publisher role on the shared topic {topic} from {agent} (the topic kept)"
            ));
        }
        if let Some(t) = self.remove(&mut managed.pubsub_topic, "removing the topic").await? {
            done.push(format!("removed topic {t}"));
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types_and_names() {
        let all = EventTypes { created: true, removed: true, other: true };
        assert_eq!(
            event_types_of(&all),
            ["OBJECT_FINALIZE", "OBJECT_METADATA_UPDATE", "OBJECT_DELETE", "OBJECT_ARCHIVE"]
        );
        assert!(event_types_of(&EventTypes { created: false, removed: false, other: true }).is_empty());
        assert!(check_resource_name("topic", "tidemark-0123abcd").is_ok());
        for bad in ["ab", "1abc", "goog-x", "a b c", &"a".repeat(256)] {
            assert!(check_resource_name("topic", bad).is_err(), "{bad}");
        }
    }
}

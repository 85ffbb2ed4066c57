//! A Pub/Sub subscription as an [`EventSource`] (pull). The emulator's blocking pull can hang for
//! a long time on an empty subscription, so `receive` pulls with `returnImmediately` and polls
//! until `wait` passes. `deliveryAttempt` is the receive count when the subscription has a
//! dead-letter policy; otherwise this source counts the deliveries it saw itself.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;

use tidemark_core::events::{AckReport, Delivery, EventSource};
use tidemark_core::remote::RemoteConf;
use tidemark_core::{Error, Result, parse_rfc3339_ms};

use crate::receive_backoff::ReceiveBackoff;

use super::auth::{Auth, check, transport};

pub const MAX_BATCH: usize = 100;
const POLL: Duration = Duration::from_millis(250);

pub struct PubSubSource {
    http: reqwest::Client,
    endpoint: String,
    /// `projects/P/subscriptions/S`
    subscription: String,
    auth: Auth,
    /// message id -> deliveries seen, where the service does not count them.
    seen: Mutex<HashMap<String, u32>>,
    /// ack id -> message id, to forget counts once acknowledged.
    in_flight: Mutex<HashMap<String, String>>,
    backoff: ReceiveBackoff,
    /// The subscription on the dead-letter topic, where Pub/Sub moves what was delivered too often.
    dead_letter: Option<String>,
    /// How long a pulled message stays with this consumer before Pub/Sub delivers it again (the
    /// subscription's visibility option), whatever the subscription's own ack deadline.
    visibility: Option<Duration>,
}

/// The most dead letters one count looks at (a pull's limit).
const DEAD_LETTER_PEEK: usize = 1000;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PullResponse {
    #[serde(default)]
    received_messages: Vec<ReceivedMessage>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReceivedMessage {
    ack_id: String,
    message: PubsubMessage,
    #[serde(default)]
    delivery_attempt: Option<u32>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PubsubMessage {
    #[serde(default)]
    data: Option<String>,
    #[serde(default)]
    attributes: BTreeMap<String, String>,
    #[serde(default)]
    message_id: String,
    #[serde(default)]
    publish_time: Option<String>,
}

/// The Pub/Sub endpoint of a remote: `pubsub_endpoint`, else `$PUBSUB_EMULATOR_HOST`, else Google.
pub fn endpoint_of(conf: &RemoteConf) -> (String, bool) {
    if let Some(e) = conf.setting("pubsub_endpoint") {
        return (e.trim_end_matches('/').to_string(), true);
    }
    if let Ok(host) = std::env::var("PUBSUB_EMULATOR_HOST")
        && !host.is_empty()
    {
        return (format!("http://{host}"), true);
    }
    ("https://pubsub.googleapis.com".into(), false)
}

impl PubSubSource {
    /// `subscription` is `projects/P/subscriptions/S`, or `S` with `-gcs.project` set.
    pub fn open(conf: &RemoteConf, subscription: &str) -> Result<Self> {
        let subscription = if subscription.starts_with("projects/") {
            subscription.to_string()
        } else {
            let project = conf.setting("project").ok_or_else(|| {
                Error::invalid_argument(format!(
                    "subscription {subscription:?}: give projects/P/subscriptions/S, or set -gcs.project"
                ))
            })?;
            format!("projects/{project}/subscriptions/{subscription}")
        };
        let (endpoint, emulated) = endpoint_of(conf);
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| Error::internal(format!("HTTP client: {e}")))?;
        Ok(PubSubSource {
            http,
            endpoint,
            subscription,
            auth: Auth::from_conf(conf, emulated)?,
            seen: Mutex::default(),
            in_flight: Mutex::default(),
            backoff: ReceiveBackoff::default(),
            dead_letter: None,
            visibility: None,
        })
    }

    /// Each pulled message's ack deadline is set to `visibility` (at most Pub/Sub's 600 s).
    pub fn with_visibility(mut self, visibility: Duration) -> Self {
        self.visibility = Some(visibility.clamp(Duration::from_secs(1), Duration::from_secs(600)));
        self
    }

    /// `subscription`: the dead-letter topic's subscription (`projects/P/subscriptions/S`).
    pub fn with_dead_letter(mut self, subscription: Option<&str>) -> Self {
        self.dead_letter = subscription.map(str::to_string);
        self
    }

    async fn post(&self, verb: &str, body: serde_json::Value) -> Result<reqwest::Response> {
        self.post_to(&self.subscription, verb, body).await
    }

    async fn post_to(&self, subscription: &str, verb: &str, body: serde_json::Value) -> Result<reqwest::Response> {
        let rb = self.http.post(format!("{}/v1/{subscription}:{verb}", self.endpoint)).json(&body);
        let rb = self.auth.apply(&self.http, rb).await?;
        let resp = rb.send().await.map_err(|e| transport(verb, subscription, &self.endpoint, e))?;
        check(resp, verb, subscription).await
    }

    fn forget(&self, ack_id: &str) {
        let msg = self.in_flight.lock().ok().and_then(|mut f| f.remove(ack_id));
        if let (Some(m), Ok(mut seen)) = (msg, self.seen.lock()) {
            seen.remove(&m);
        }
    }
}

#[async_trait]
impl EventSource for PubSubSource {
    fn describe(&self) -> String {
        format!("pubsub:{}", self.subscription)
    }

    fn max_batch(&self) -> usize {
        MAX_BATCH
    }

    /// Pub/Sub counts no subscription's messages through its own API: the dead letters are
    /// pulled (up to 1,000) and given back at once, so the count is what a pull sees.
    async fn dead_lettered(&self) -> Result<Option<u64>> {
        let Some(dead) = &self.dead_letter else { return Ok(None) };
        let resp =
            self.post_to(dead, "pull", json!({"maxMessages": DEAD_LETTER_PEEK, "returnImmediately": true})).await?;
        let pulled: PullResponse =
            resp.json().await.map_err(|e| Error::internal(format!("pull: unreadable answer ({e})")))?;
        let ids: Vec<&str> = pulled.received_messages.iter().map(|m| m.ack_id.as_str()).collect();
        if !ids.is_empty() {
            self.post_to(dead, "modifyAckDeadline", json!({"ackIds": ids, "ackDeadlineSeconds": 0})).await?;
        }
        Ok(Some(ids.len() as u64))
    }

    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>> {
        self.backoff.pause().await;
        let deadline = Instant::now() + wait;
        loop {
            let result =
                self.post("pull", json!({"maxMessages": max.clamp(1, MAX_BATCH), "returnImmediately": true})).await;
            let resp = self.backoff.record(&self.describe(), result)?;
            let pulled: PullResponse =
                resp.json().await.map_err(|e| Error::internal(format!("pull: unreadable answer ({e})")))?;
            if let Some(v) = self.visibility
                && !pulled.received_messages.is_empty()
            {
                let ids: Vec<&str> = pulled.received_messages.iter().map(|m| m.ack_id.as_str()).collect();
                // Failing here leaves the subscription's own deadline: the messages come back later.
                if let Err(e) =
                    self.post("modifyAckDeadline", json!({"ackIds": ids, "ackDeadlineSeconds": v.as_secs()})).await
                {
                    tracing::warn!(error = %e, "setting the ack deadline of pulled messages failed");
                }
            }
            if !pulled.received_messages.is_empty() || Instant::now() >= deadline {
                let mut out = Vec::with_capacity(pulled.received_messages.len());
                for m in pulled.received_messages {
                    let data = match m.message.data.as_deref() {
                        None | Some("") => Vec::new(),
                        Some(d) => STANDARD.decode(d).unwrap_or_else(|_| d.as_bytes().to_vec()),
                    };
                    let count = match m.delivery_attempt {
                        Some(n) => n,
                        None => {
                            let mut seen = self.seen.lock().map_err(|_| Error::internal("counts poisoned"))?;
                            let c = seen.entry(m.message.message_id.clone()).or_insert(0);
                            *c += 1;
                            *c
                        }
                    };
                    if let Ok(mut f) = self.in_flight.lock() {
                        f.insert(m.ack_id.clone(), m.message.message_id.clone());
                    }
                    out.push(Delivery {
                        ack_id: m.ack_id,
                        body: Bytes::from(data),
                        attributes: m.message.attributes,
                        receive_count: count.max(1),
                        sent_at_ms: m.message.publish_time.as_deref().and_then(parse_rfc3339_ms),
                    });
                }
                return Ok(out);
            }
            tokio::time::sleep(POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
        }
    }

    async fn ack(&self, ack_ids: &[String]) -> Result<AckReport> {
        if ack_ids.is_empty() {
            return Ok(AckReport::default());
        }
        // Pub/Sub acknowledges expired or repeated ids without complaint.
        self.post("acknowledge", json!({"ackIds": ack_ids})).await?;
        for id in ack_ids {
            self.forget(id);
        }
        Ok(AckReport { acked: ack_ids.to_vec(), ..Default::default() })
    }

    async fn extend(&self, ack_id: &str, by: Duration) -> Result<()> {
        self.post("modifyAckDeadline", json!({"ackIds": [ack_id], "ackDeadlineSeconds": by.as_secs().min(600)}))
            .await
            .map(|_| ())
    }

    async fn release(&self, ack_id: &str, delay: Duration) -> Result<()> {
        self.extend(ack_id, delay).await
    }
}

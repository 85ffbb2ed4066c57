//! A Pub/Sub subscription as an [`EventSource`] (pull). Against Google, `receive` is the pull
//! Google documents: no `returnImmediately` (deprecated), the server holding the request until
//! a message arrives or the `X-Server-Timeout` it was given (the receive's wait) passes — so the
//! server ends the pull, and no message is handed to a pull the client has already given up.
//! The Pub/Sub emulator ignores that timeout and holds an empty pull for about 90 s, handing
//! what arrives meanwhile to a pull its client may have abandoned: against the emulator
//! (`-gcs.emulator=true` or `PUBSUB_EMULATOR_HOST`), `receive` pulls with `returnImmediately`
//! and polls until the wait passes. `deliveryAttempt` is the receive count when the
//! subscription has a dead-letter policy; otherwise this source counts the deliveries it saw
//! itself.

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
use tidemark_core::requests::{self, Requests};
use tidemark_core::{Error, Result, parse_rfc3339_ms};

use crate::receive_backoff::ReceiveBackoff;

use super::auth::{Auth, check, transport};

pub const MAX_BATCH: usize = 100;
/// How often the emulator's subscription is polled while a receive waits.
const POLL: Duration = Duration::from_millis(250);
/// How much longer than the server's timeout the client waits for a pull's answer.
const PULL_MARGIN: Duration = Duration::from_secs(10);

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
    /// The Pub/Sub emulator, whose pull is polled (see the module's comment).
    emulated: bool,
    requests: Requests,
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

/// The Pub/Sub endpoint of a remote — `pubsub_endpoint`, else `$PUBSUB_EMULATOR_HOST`, else
/// Google — and whether it is an emulator (`-gcs.emulator=true`, or the endpoint taken from
/// `PUBSUB_EMULATOR_HOST`, as Google's own client libraries take it).
pub fn endpoint_of(conf: &RemoteConf) -> Result<(String, bool)> {
    let emulator = super::auth::emulator(conf)?;
    if let Some(e) = conf.setting("pubsub_endpoint") {
        return Ok((e.trim_end_matches('/').to_string(), emulator));
    }
    if let Ok(host) = std::env::var("PUBSUB_EMULATOR_HOST")
        && !host.is_empty()
    {
        return Ok((format!("http://{host}"), true));
    }
    Ok(("https://pubsub.googleapis.com".into(), emulator))
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
        let (endpoint, emulated) = endpoint_of(conf)?;
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
            emulated,
            seen: Mutex::default(),
            in_flight: Mutex::default(),
            backoff: ReceiveBackoff::default(),
            dead_letter: None,
            visibility: None,
            requests: Requests::default(),
        })
    }

    /// Counts each request to Pub/Sub in `requests` (see [`tidemark_core::requests`]).
    pub fn with_requests(mut self, requests: Requests) -> Self {
        self.requests = requests;
        self
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
        self.send(rb, subscription, verb).await
    }

    async fn send(&self, rb: reqwest::RequestBuilder, subscription: &str, verb: &str) -> Result<reqwest::Response> {
        let rb = self.auth.apply(rb).await?;
        self.requests.count(match verb {
            "pull" => requests::RECEIVE,
            "acknowledge" => requests::ACK,
            _ => requests::VISIBILITY, // modifyAckDeadline
        });
        let resp = rb.send().await.map_err(|e| transport(verb, subscription, &self.endpoint, e))?;
        check(resp, verb, subscription).await
    }

    /// One pull of up to `max` messages from `subscription`, waiting at most `wait` for the
    /// first: against Google, held by the server (`X-Server-Timeout`, which Google's system
    /// parameters define for REST calls; the client's own deadline a little later); against the
    /// emulator, answered at once.
    async fn pull(&self, subscription: &str, max: usize, wait: Duration) -> Result<PullResponse> {
        let url = format!("{}/v1/{subscription}:pull", self.endpoint);
        let rb = if self.emulated {
            self.http.post(url).json(&json!({"maxMessages": max, "returnImmediately": true}))
        } else {
            let secs = wait.as_secs_f64().max(1.0);
            self.http
                .post(url)
                .header("X-Server-Timeout", format!("{secs:.1}"))
                .timeout(Duration::from_secs_f64(secs) + PULL_MARGIN)
                .json(&json!({"maxMessages": max}))
        };
        let resp = self.send(rb, subscription, "pull").await?;
        resp.json().await.map_err(|e| Error::internal(format!("pull: unreadable answer ({e})")))
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
        let pulled = self.pull(dead, DEAD_LETTER_PEEK, Duration::from_secs(1)).await?;
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
            let left = deadline.saturating_duration_since(Instant::now());
            let result = self.pull(&self.subscription, max.clamp(1, MAX_BATCH), left).await;
            let pulled = self.backoff.record(&self.describe(), result)?;
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

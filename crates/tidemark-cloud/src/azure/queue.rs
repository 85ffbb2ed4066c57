//! An Azure Storage Queue as an [`EventSource`] (Event Grid delivers blob events there).
//!
//! Azure has no long polling, so `receive` polls until a message arrives or `wait` passes. Each
//! visibility change gives a message a new pop receipt and invalidates the old one; the source
//! remembers the newest receipt of each message in flight, so the `ack_id` a caller holds stays
//! valid across `extend`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use reqwest::Method;
use serde::Deserialize;

use tidemark_core::events::{AckReport, Delivery, EventSource};
use tidemark_core::remote::RemoteConf;
use tidemark_core::requests::{self, Requests};
use tidemark_core::{Error, Result};

use crate::receive_backoff::ReceiveBackoff;

use super::client::{AzureClient, encode_path, parse_http_date_ms};

pub const MAX_BATCH: usize = 32;
const POLL: Duration = Duration::from_millis(250);

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct QueueMessagesList {
    #[serde(default, rename = "QueueMessage")]
    messages: Vec<QueueMessage>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct QueueMessage {
    message_id: String,
    insertion_time: String,
    pop_receipt: String,
    dequeue_count: u32,
    #[serde(default)]
    message_text: String,
}

pub struct AzureQueueSource {
    client: AzureClient,
    queue: String,
    /// The visibility timeout of received messages.
    visibility: Duration,
    /// message id -> its newest pop receipt, for messages in flight.
    receipts: Mutex<HashMap<String, String>>,
    backoff: ReceiveBackoff,
    /// The poison queue and the dequeue count past which a message moves there (Azure has no
    /// redrive policy: the consumer moves it, as Azure Functions do).
    poison: Option<(String, u32)>,
    requests: Requests,
}

/// `ack_id` = message id + `\n` + the pop receipt it was delivered with.
fn split(ack_id: &str) -> Result<(&str, &str)> {
    ack_id.split_once('\n').ok_or_else(|| Error::invalid_argument("not an Azure queue ack id"))
}

impl AzureQueueSource {
    pub fn open(conf: &RemoteConf, queue: &str, visibility: Duration) -> Result<Self> {
        if queue.is_empty() || queue.contains('/') {
            return Err(Error::invalid_argument(format!("bad queue name {queue:?}")));
        }
        Ok(AzureQueueSource {
            client: AzureClient::new(conf, "queue")?,
            queue: queue.to_string(),
            visibility: visibility.max(Duration::from_secs(1)),
            receipts: Mutex::default(),
            backoff: ReceiveBackoff::default(),
            poison: None,
            requests: Requests::default(),
        })
    }

    /// Counts each request to the queue in `requests` (see [`tidemark_core::requests`]).
    pub fn with_requests(mut self, requests: Requests) -> Self {
        self.requests = requests;
        self
    }

    /// Messages dequeued more than `max_receives` times move to the queue `poison`.
    pub fn with_poison(mut self, poison: Option<&str>, max_receives: Option<u32>) -> Self {
        if let (Some(q), Some(n)) = (poison, max_receives.filter(|n| *n > 0)) {
            self.poison = Some((q.to_string(), n));
        }
        self
    }

    /// Moves a message received too often to the poison queue: put there, then deleted here (a
    /// crash in between leaves it in both, never in neither).
    async fn to_poison(&self, poison: &str, m: &QueueMessage) -> Result<()> {
        let body = format!("<QueueMessage><MessageText>{}</MessageText></QueueMessage>", xml_escape(&m.message_text));
        let rb = self
            .client
            .request(
                Method::POST,
                &format!("/{}/messages", encode_path(poison)),
                &[],
                &[("content-type", "application/xml".into())],
                body.len() as u64,
            )
            .body(body);
        self.requests.count(requests::SEND);
        self.client.send(rb, "PutMessage", &format!("azure-queue:{poison}")).await?;
        let rb = self.client.request(
            Method::DELETE,
            &format!("/{}/messages/{}", encode_path(&self.queue), encode_path(&m.message_id)),
            &[("popreceipt", m.pop_receipt.clone())],
            &[],
            0,
        );
        self.requests.count(requests::ACK);
        match self.client.send(rb, "DeleteMessage", &self.target()).await {
            Ok(_) | Err(Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn target(&self) -> String {
        format!("azure-queue:{}", self.queue)
    }

    /// Creates the queue (tests and set-up); an existing one is fine.
    pub async fn create_queue(&self) -> Result<()> {
        let rb = self.client.request(Method::PUT, &format!("/{}", encode_path(&self.queue)), &[], &[], 0);
        self.client.send(rb, "CreateQueue", &self.target()).await.map(|_| ())
    }

    /// Whether the queue exists.
    pub async fn exists(&self) -> Result<bool> {
        let rb = self.client.request(
            Method::GET,
            &format!("/{}", encode_path(&self.queue)),
            &[("comp", "metadata".into())],
            &[],
            0,
        );
        match self.client.send(rb, "GetQueueMetadata", &self.target()).await {
            Ok(_) => Ok(true),
            Err(Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Puts a message on the queue (what Event Grid does; for tests).
    pub async fn put_message(&self, text: &str) -> Result<()> {
        let body = format!("<QueueMessage><MessageText>{}</MessageText></QueueMessage>", xml_escape(text));
        let rb = self
            .client
            .request(
                Method::POST,
                &format!("/{}/messages", encode_path(&self.queue)),
                &[],
                &[("content-type", "application/xml".into())],
                body.len() as u64,
            )
            .body(body);
        self.client.send(rb, "PutMessage", &self.target()).await.map(|_| ())
    }

    fn current_receipt(&self, ack_id: &str) -> Result<(String, String)> {
        let (id, receipt) = split(ack_id)?;
        let newest = self.receipts.lock().ok().and_then(|r| r.get(id).cloned()).unwrap_or_else(|| receipt.to_string());
        Ok((id.to_string(), newest))
    }

    async fn set_visibility(&self, ack_id: &str, timeout: Duration) -> Result<()> {
        let (id, receipt) = self.current_receipt(ack_id)?;
        let rb = self.client.request(
            Method::PUT,
            &format!("/{}/messages/{}", encode_path(&self.queue), encode_path(&id)),
            &[("popreceipt", receipt), ("visibilitytimeout", timeout.as_secs().min(604_800).to_string())],
            &[],
            0,
        );
        self.requests.count(requests::VISIBILITY);
        let resp = self.client.send(rb, "UpdateMessage", &self.target()).await?;
        if let Some(new) = resp.headers().get("x-ms-popreceipt").and_then(|v| v.to_str().ok())
            && let Ok(mut r) = self.receipts.lock()
        {
            r.insert(id, new.to_string());
        }
        Ok(())
    }
}

/// How many messages the queue `name` holds, as its metadata counts them (Get Queue Metadata's
/// `x-ms-approximate-messages-count`).
pub(crate) async fn approximate_count(client: &AzureClient, name: &str) -> Result<Option<u64>> {
    let rb = client.request(Method::GET, &format!("/{}", encode_path(name)), &[("comp", "metadata".into())], &[], 0);
    let resp = client.send(rb, "GetQueueMetadata", &format!("azure-queue:{name}")).await?;
    Ok(resp.headers().get("x-ms-approximate-messages-count").and_then(|v| v.to_str().ok()?.parse().ok()))
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[async_trait]
impl EventSource for AzureQueueSource {
    fn describe(&self) -> String {
        self.target()
    }

    fn max_batch(&self) -> usize {
        MAX_BATCH
    }

    async fn dead_lettered(&self) -> Result<Option<u64>> {
        let Some((poison, _)) = &self.poison else { return Ok(None) };
        self.requests.count(requests::DEPTH);
        approximate_count(&self.client, poison).await
    }

    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>> {
        self.backoff.pause().await;
        let deadline = Instant::now() + wait;
        loop {
            let rb = self.client.request(
                Method::GET,
                &format!("/{}/messages", encode_path(&self.queue)),
                &[
                    ("numofmessages", max.clamp(1, MAX_BATCH).to_string()),
                    ("visibilitytimeout", self.visibility.as_secs().to_string()),
                ],
                &[],
                0,
            );
            self.requests.count(requests::RECEIVE);
            let result = match self.client.send(rb, "GetMessages", &self.target()).await {
                Ok(resp) => resp.text().await.map_err(|e| Error::Unavailable { message: format!("GetMessages: {e}") }),
                Err(e) => Err(e),
            };
            let xml = self.backoff.record(&self.describe(), result)?;
            let mut list: QueueMessagesList = quick_xml::de::from_str(&xml)
                .map_err(|e| Error::internal(format!("GetMessages: unreadable answer ({e})")))?;
            if let Some((poison, max)) = &self.poison {
                let (keep, dead): (Vec<_>, Vec<_>) = list.messages.into_iter().partition(|m| m.dequeue_count <= *max);
                for m in &dead {
                    tracing::warn!(queue = %self.queue, message = %m.message_id, receives = m.dequeue_count, "moved to the poison queue {poison}");
                    if let Err(e) = self.to_poison(poison, m).await {
                        tracing::warn!(error = %e, "moving a message to the poison queue failed; it comes back later");
                    }
                }
                list.messages = keep;
            }
            if !list.messages.is_empty() || Instant::now() >= deadline {
                let mut receipts = self.receipts.lock().map_err(|_| Error::internal("receipts poisoned"))?;
                return Ok(list
                    .messages
                    .into_iter()
                    .map(|m| {
                        receipts.insert(m.message_id.clone(), m.pop_receipt.clone());
                        Delivery {
                            ack_id: format!("{}\n{}", m.message_id, m.pop_receipt),
                            body: Bytes::from(m.message_text),
                            attributes: Default::default(),
                            receive_count: m.dequeue_count.max(1),
                            sent_at_ms: parse_http_date_ms(&m.insertion_time),
                        }
                    })
                    .collect());
            }
            tokio::time::sleep(POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
        }
    }

    async fn ack(&self, ack_ids: &[String]) -> Result<AckReport> {
        let mut report = AckReport::default();
        for ack_id in ack_ids {
            let (id, receipt) = self.current_receipt(ack_id)?;
            let rb = self.client.request(
                Method::DELETE,
                &format!("/{}/messages/{}", encode_path(&self.queue), encode_path(&id)),
                &[("popreceipt", receipt)],
                &[],
                0,
            );
            self.requests.count(requests::ACK);
            match self.client.send(rb, "DeleteMessage", &self.target()).await {
                Ok(_) => report.acked.push(ack_id.clone()),
                // Already deleted, or redelivered with a new receipt: gone from our hands.
                Err(Error::NotFound { .. }) => report.gone.push(ack_id.clone()),
                Err(Error::Internal { message }) if message.contains("PopReceiptMismatch") => {
                    report.gone.push(ack_id.clone())
                }
                Err(e @ Error::Unavailable { .. }) => report.failed.push((ack_id.clone(), e.to_string())),
                Err(e) => return Err(e),
            }
            if let Ok(mut r) = self.receipts.lock() {
                r.remove(&id);
            }
        }
        Ok(report)
    }

    async fn extend(&self, ack_id: &str, by: Duration) -> Result<()> {
        self.set_visibility(ack_id, by).await
    }

    async fn release(&self, ack_id: &str, delay: Duration) -> Result<()> {
        self.set_visibility(ack_id, delay).await
    }
}

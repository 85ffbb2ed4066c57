//! SQS as an [`EventSource`]: long polling (up to 20 s), batches of up to 10, `DeleteMessageBatch`
//! with its per-entry failures sorted into acknowledged / gone / failed, visibility changes for
//! `extend` and `release`, and a backoff after failures so a caller looping on `receive` never
//! hammers a missing queue or a refusing endpoint.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, MessageSystemAttributeName};
use bytes::Bytes;

use tidemark_core::events::{AckReport, Delivery, EventSource};
use tidemark_core::requests::{self, Requests};

use crate::receive_backoff::ReceiveBackoff;
use tidemark_core::remote::RemoteConf;
use tidemark_core::{Error, Result};

use super::s3::sdk_config;

pub const MAX_BATCH: usize = 10;
pub const MAX_WAIT: Duration = Duration::from_secs(20);
/// SQS's longest visibility timeout: 12 hours.
const MAX_VISIBILITY_SECS: u64 = 43_200;

pub struct SqsSource {
    client: Client,
    queue_url: String,
    backoff: ReceiveBackoff,
    /// The subscription's visibility timeout, asked for on each receive (else the queue's own).
    visibility: Option<Duration>,
    /// The dead-letter queue Tidemark provisioned beside the queue, whose depth it reports.
    dead_letter: Option<String>,
    requests: Requests,
}

/// An SQS client for a remote: `sqs_endpoint` if set, else the remote's `endpoint`.
pub async fn client(conf: &RemoteConf) -> Result<Client> {
    let sdk = sdk_config(conf).await?;
    let mut b = aws_sdk_sqs::config::Builder::from(&sdk);
    if let Some(ep) = conf.setting("sqs_endpoint") {
        b = b.endpoint_url(ep);
    }
    Ok(Client::from_conf(b.build()))
}

impl SqsSource {
    pub fn new(client: Client, queue_url: impl Into<String>) -> Self {
        SqsSource {
            client,
            queue_url: queue_url.into(),
            backoff: ReceiveBackoff::default(),
            visibility: None,
            dead_letter: None,
            requests: Requests::default(),
        }
    }

    /// Counts each request to the queue in `requests` (see [`tidemark_core::requests`]).
    pub fn with_requests(mut self, requests: Requests) -> Self {
        self.requests = requests;
        self
    }

    /// Reports the depth of this dead-letter queue.
    pub fn with_dead_letter(mut self, url: Option<&str>) -> Self {
        self.dead_letter = url.map(str::to_string);
        self
    }

    /// Receives with this visibility timeout rather than the queue's default.
    pub fn with_visibility(mut self, v: Duration) -> Self {
        self.visibility = (!v.is_zero()).then_some(v);
        self
    }

    pub async fn connect(conf: &RemoteConf, queue_url: &str) -> Result<Self> {
        Ok(Self::new(client(conf).await?, queue_url))
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    fn error<E: ProvideErrorMetadata + std::error::Error + 'static>(&self, op: &str, e: SdkError<E>) -> Error {
        self.error_on(&self.queue_url, op, e)
    }

    /// The error of `op` on the queue `q` (this source's queue, or its dead-letter queue).
    fn error_on<E: ProvideErrorMetadata + std::error::Error + 'static>(
        &self,
        q: &str,
        op: &str,
        e: SdkError<E>,
    ) -> Error {
        let code = e.code().unwrap_or_default().to_string();
        let detail = e.message().unwrap_or_default().to_string();
        let status = e.raw_response().map(|r| r.status().as_u16());
        match (&e, status, code.as_str()) {
            (SdkError::DispatchFailure(d), _, _) => Error::Unavailable {
                message: format!(
                    "{op} on {q}: cannot reach the SQS endpoint ({})",
                    d.as_connector_error().map(|c| c.to_string()).unwrap_or_else(|| "dispatch failure".into())
                ),
            },
            (SdkError::TimeoutError(_), _, _) => {
                Error::Unavailable { message: format!("{op} on {q}: the SQS endpoint timed out") }
            }
            (_, _, "AWS.SimpleQueueService.NonExistentQueue" | "QueueDoesNotExist") => {
                Error::NotFound { path: format!("queue {q} (it does not exist, or was deleted)") }
            }
            (_, Some(403), _)
            | (_, _, "AccessDenied" | "InvalidClientTokenId" | "SignatureDoesNotMatch" | "ExpiredToken") => {
                Error::Unauthorized {
                    message: format!(
                        "{op} on {q} was refused ({code}: {detail}); the credentials need sqs:{op} (consuming a queue)"
                    ),
                }
            }
            (_, _, "ReceiptHandleIsInvalid" | "InvalidParameterValue" | "MessageNotInflight") => Error::NotFound {
                path: format!("delivery on {q} ({code}: the message was acknowledged or redelivered)"),
            },
            (_, Some(s), _) if s >= 500 => {
                Error::Unavailable { message: format!("{op} on {q}: SQS answered {s} {code} {detail}") }
            }
            _ => Error::internal(format!(
                "{op} on {q}: {code} {detail} ({})",
                aws_sdk_sqs::error::DisplayErrorContext(&e)
            )),
        }
    }
}

#[async_trait]
impl EventSource for SqsSource {
    fn describe(&self) -> String {
        format!("sqs:{}", self.queue_url)
    }

    async fn dead_lettered(&self) -> Result<Option<u64>> {
        let Some(url) = &self.dead_letter else { return Ok(None) };
        self.requests.count(requests::DEPTH);
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
            .send()
            .await
            .map_err(|e| self.error_on(url, "GetQueueAttributes", e))?;
        let n = out
            .attributes()
            .and_then(|a| a.get(&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages))
            .and_then(|v| v.parse().ok());
        Ok(n)
    }

    fn max_batch(&self) -> usize {
        MAX_BATCH
    }

    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>> {
        self.backoff.pause().await;
        self.requests.count(requests::RECEIVE);
        let out = self
            .client
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(max.clamp(1, MAX_BATCH) as i32)
            .wait_time_seconds(wait.min(MAX_WAIT).as_secs() as i32)
            .set_visibility_timeout(self.visibility.map(|v| v.as_secs().clamp(1, MAX_VISIBILITY_SECS) as i32))
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| self.error("ReceiveMessage", e));
        let out = self.backoff.record(&self.queue_url, out)?;
        Ok(out
            .messages()
            .iter()
            .filter_map(|m| {
                let sys = m.attributes();
                let get =
                    |n: MessageSystemAttributeName| sys.and_then(|a| a.get(&n)).and_then(|v| v.parse::<i64>().ok());
                Some(Delivery {
                    ack_id: m.receipt_handle()?.to_string(),
                    body: Bytes::from(m.body().unwrap_or_default().to_string()),
                    attributes: m
                        .message_attributes()
                        .map(|a| {
                            a.iter().filter_map(|(k, v)| Some((k.clone(), v.string_value()?.to_string()))).collect()
                        })
                        .unwrap_or_else(BTreeMap::new),
                    receive_count: get(MessageSystemAttributeName::ApproximateReceiveCount).unwrap_or(1).max(1) as u32,
                    sent_at_ms: get(MessageSystemAttributeName::SentTimestamp),
                })
            })
            .collect())
    }

    async fn ack(&self, ack_ids: &[String]) -> Result<AckReport> {
        let mut report = AckReport::default();
        for chunk in ack_ids.chunks(MAX_BATCH) {
            let entries: Vec<DeleteMessageBatchRequestEntry> = chunk
                .iter()
                .enumerate()
                .map(|(i, id)| DeleteMessageBatchRequestEntry::builder().id(i.to_string()).receipt_handle(id).build())
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| Error::internal(format!("building DeleteMessageBatch: {e}")))?;
            self.requests.count(requests::ACK);
            let out = self
                .client
                .delete_message_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| self.error("DeleteMessageBatch", e))?;
            let id_of = |entry_id: &str| entry_id.parse::<usize>().ok().and_then(|i| chunk.get(i)).cloned();
            for ok in out.successful() {
                if let Some(id) = id_of(ok.id()) {
                    report.acked.push(id);
                }
            }
            for f in out.failed() {
                let Some(id) = id_of(f.id()) else { continue };
                match f.code() {
                    "ReceiptHandleIsInvalid" | "MessageNotInflight" => report.gone.push(id),
                    code => report.failed.push((id, format!("{code}: {}", f.message().unwrap_or_default()))),
                }
            }
        }
        Ok(report)
    }

    async fn extend(&self, ack_id: &str, by: Duration) -> Result<()> {
        self.requests.count(requests::VISIBILITY);
        self.client
            .change_message_visibility()
            .queue_url(&self.queue_url)
            .receipt_handle(ack_id)
            .visibility_timeout(by.as_secs().min(MAX_VISIBILITY_SECS) as i32)
            .send()
            .await
            .map_err(|e| self.error("ChangeMessageVisibility", e))?;
        Ok(())
    }

    async fn release(&self, ack_id: &str, delay: Duration) -> Result<()> {
        self.extend(ack_id, delay).await
    }
}

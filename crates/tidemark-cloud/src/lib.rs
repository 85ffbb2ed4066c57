//! Cloud providers, one folder each, behind the provider-neutral traits of `tidemark-core`.
//!
//! - [`aws`]: S3 and S3-compatibles (AWS SDK).
//! - [`local`]: a directory on this machine as a bucket; [`local_events`]: its filesystem
//!   notifications as an event source.
//! - [`memory`]: an in-process bucket, for the simulation and benchmarks.
//! - [`conformance`]: the `RemoteStorage` suite every provider's tests run.
//!
//! [`open_storage`] turns a `remote.configure` record and a bucket into a `RemoteStorage`.

pub mod aws;
pub mod azure;
pub mod conformance;
pub mod event_conformance;
pub mod gcp;
pub mod local;
pub mod local_events;
pub mod memory;
pub mod receive_backoff;

use std::sync::Arc;
use std::time::Duration;

use tidemark_core::remote::{RemoteConf, StorageKind};
use tidemark_core::{RemoteStorage, Result};

pub use tidemark_core::remote::{PART, part_size};

/// Parts uploaded at once where the store takes them in any order: a few streams beat one
/// against a bucket that serves each stream at a bounded rate; memory is at most this many
/// parts (and one being filled).
pub const PARTS_IN_FLIGHT: usize = 4;

/// Sends `body` (`size` bytes) in parts of [`part_size`], each with `send(number, part)` as a
/// task of its own — so that the parts in flight go on while the next one is read — at most
/// `PARTS_IN_FLIGHT` at once; their answers in the parts' order, once every part is sent. On
/// any failure (a part's, the body's, another length than `size`) the parts still in flight
/// are stopped and the error returned: the caller abandons the upload.
pub(crate) async fn send_parts<T, Fut>(
    body: &mut tidemark_core::ByteStream,
    size: u64,
    key: &str,
    send: impl Fn(i32, bytes::Bytes) -> Fut,
) -> tidemark_core::Result<Vec<T>>
where
    Fut: std::future::Future<Output = tidemark_core::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let mut inflight = std::collections::VecDeque::new();
    let sent = send_all_parts(body, size, key, &send, &mut inflight).await;
    if sent.is_err() {
        for part in &inflight {
            part.abort();
        }
    }
    sent
}

async fn send_all_parts<T, Fut>(
    body: &mut tidemark_core::ByteStream,
    size: u64,
    key: &str,
    send: &impl Fn(i32, bytes::Bytes) -> Fut,
    inflight: &mut std::collections::VecDeque<tokio::task::JoinHandle<tidemark_core::Result<T>>>,
) -> tidemark_core::Result<Vec<T>>
where
    Fut: std::future::Future<Output = tidemark_core::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    use tidemark_core::remote::{next_part, wrong_length};
    let (mut taken, mut buf, mut number, mut done) = (0u64, bytes::BytesMut::new(), 0i32, Vec::new());
    loop {
        let want = part_size(number + 1);
        let part = next_part(body, &mut buf, want, &mut taken, size, key).await?;
        // A part shorter than asked is the last: the body ended.
        let ended = part.as_ref().is_none_or(|p| p.len() < want);
        if let Some(part) = part {
            number += 1;
            inflight.push_back(tokio::spawn(send(number, part)));
        }
        while inflight.len() >= PARTS_IN_FLIGHT || (ended && !inflight.is_empty()) {
            let Some(first) = inflight.pop_front() else { break };
            let answer =
                first.await.map_err(|e| tidemark_core::Error::internal(format!("{key}: a part's upload: {e}")))?;
            done.push(answer?);
        }
        if ended {
            break;
        }
    }
    if taken != size {
        return Err(wrong_length(key, size, taken));
    }
    Ok(done)
}

/// The deadline of one request to a bucket's or queue's REST API (the HTTP clients built here:
/// Cloud Storage, Azure), from connecting to the end of the answer's body. Not for downloads: a
/// GET of an object streams for as long as its reader reads.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a connection of those clients may bring nothing while a read waits on it (a
/// download included) before it is given up as stalled; the filer resumes a download given up.
pub(crate) const STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The settings each kind of remote takes (`remote.configure -TYPE.SETTING=...`).
pub fn known_settings(kind: StorageKind) -> &'static [(&'static str, &'static str)] {
    match kind {
        StorageKind::S3 => aws::s3::SETTINGS,
        StorageKind::Local => local::SETTINGS,
        StorageKind::Azure => azure::blob::SETTINGS,
        StorageKind::Gcs => gcp::gcs::SETTINGS,
    }
}

/// The event-notification capability of a remote's provider, where it has one: S3 with queue
/// integration (SQS, SNS, EventBridge), Cloud Storage (Pub/Sub) and Azure (Event Grid through
/// Resource Manager). `None` for the others, which
/// keep polling or a bring-your-own queue.
/// `topic`: an existing topic to use (`-topic=`, Google Cloud only).
pub async fn event_notifications(
    conf: &RemoteConf,
    bucket: &str,
    topic: Option<&str>,
) -> Result<Option<Box<dyn tidemark_core::subscription::EventNotifications>>> {
    match conf.kind {
        StorageKind::S3 if conf.setting("queue_integration") != Some("false") => {
            if topic.is_some() {
                return Err(tidemark_core::Error::invalid_argument(
                    "-topic= names an existing Pub/Sub topic (Google Cloud); on S3 Tidemark makes the SNS topic of -via=sns",
                ));
            }
            Ok(Some(Box::new(aws::provision::S3Notifications::connect(conf, bucket).await?)))
        }
        StorageKind::Gcs => Ok(Some(Box::new(gcp::GcsNotifications::open(conf, bucket, topic)?))),
        StorageKind::Azure if topic.is_none() => Ok(Some(Box::new(azure::AzureNotifications::open(conf, bucket)?))),
        _ => Ok(None),
    }
}

/// Opens the queue of a subscription on `conf`'s provider, with the decoder that reads it.
pub async fn open_event_source(
    conf: &RemoteConf,
    identity: &tidemark_core::subscription::Identity,
    managed: &tidemark_core::subscription::ManagedResources,
    visibility: std::time::Duration,
    roots: &local::LocalRoots,
    requests: &tidemark_core::requests::Requests,
) -> Result<(Box<dyn tidemark_core::events::EventSource>, tidemark_core::events::Provider)> {
    use tidemark_core::events::Provider;
    let queue = identity.queue.as_str();
    match conf.kind {
        StorageKind::S3 => {
            let source = aws::sqs::SqsSource::connect(conf, queue)
                .await?
                .with_visibility(visibility)
                .with_dead_letter(managed.dead_letter_queue_url.as_deref())
                .with_requests(requests.clone());
            Ok((Box::new(source), Provider::S3))
        }
        StorageKind::Gcs => {
            let source = gcp::PubSubSource::open(conf, queue)?
                .with_visibility(visibility)
                .with_dead_letter(managed.dead_letter_queue_url.as_deref())
                .with_requests(requests.clone());
            Ok((Box::new(source), Provider::Gcs))
        }
        StorageKind::Azure => {
            let source = azure::AzureQueueSource::open(conf, queue, visibility)?
                .with_poison(managed.dead_letter_queue_url.as_deref(), managed.max_receives)
                .with_requests(requests.clone());
            Ok((Box::new(source), Provider::Azure))
        }
        StorageKind::Local if queue == local_events::WATCH_QUEUE => {
            let root = conf.setting("root").ok_or_else(|| {
                tidemark_core::Error::invalid_argument(format!("remote {:?} has no -local.root", conf.name))
            })?;
            roots.check(&std::path::Path::new(root).join(&identity.bucket))?;
            let source =
                local_events::LocalWatchSource::open(std::path::Path::new(root), &identity.bucket, visibility)?;
            Ok((Box::new(source), Provider::S3))
        }
        StorageKind::Local => Err(tidemark_core::Error::invalid_argument(format!(
            "remote {:?} is a local directory: its only event source is {:?} (its filesystem notifications), not {queue:?}",
            conf.name,
            local_events::WATCH_QUEUE
        ))),
    }
}

/// Opens `bucket` of the configured remote; a local directory only if `roots` allow it.
pub async fn open_storage(
    conf: &RemoteConf,
    bucket: &str,
    roots: &local::LocalRoots,
) -> Result<Arc<dyn RemoteStorage>> {
    match conf.kind {
        StorageKind::S3 => Ok(Arc::new(aws::s3::S3Storage::connect(conf, bucket).await?)),
        StorageKind::Local => Ok(Arc::new(local::LocalStorage::open(conf, bucket, roots)?)),
        StorageKind::Azure => Ok(Arc::new(azure::AzureBlobStorage::open(conf, bucket)?)),
        StorageKind::Gcs => Ok(Arc::new(gcp::GcsStorage::open(conf, bucket)?)),
    }
}

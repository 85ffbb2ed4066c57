//! Bucket event notifications: what a queue delivers ([`Delivery`]), what it means
//! ([`BucketEvent`]), the decoders that turn one into the other (pure, never panicking), and the
//! [`EventSource`] trait every queue adapter implements.
//!
//! The queue is the cursor: Tidemark stores no offset anywhere. A delivery that is not
//! acknowledged comes back after its visibility timeout, so an adapter must acknowledge exactly
//! what its caller says was handled, and nothing else.

pub mod azure;
pub mod gcs;
pub mod s3;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::Result;

/// One message as a queue delivered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// What `ack`, `extend` and `release` take: a receipt handle, ack id or pop receipt. Valid for
    /// this delivery only; a redelivery carries a new one.
    pub ack_id: String,
    pub body: Bytes,
    pub attributes: BTreeMap<String, String>,
    /// How many times the queue has delivered this message, this delivery included (1 = first).
    pub receive_count: u32,
    /// When the message was first put on the queue, if the queue says.
    pub sent_at_ms: Option<i64>,
}

/// What an acknowledgement did, id by id. Acknowledging a message that is already gone (acked
/// before, or its receipt expired and it was redelivered) is not an error: it is reported in
/// `gone`, because the caller must know the message may come back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AckReport {
    pub acked: Vec<String>,
    pub gone: Vec<String>,
    /// Ids the queue refused to acknowledge this time, with its reason; retry them.
    pub failed: Vec<(String, String)>,
}

impl AckReport {
    /// Acknowledges `ids` one by one with `remove`, which says whether the delivery was still
    /// there to remove (an in-process queue's acknowledgement).
    pub fn removing(ids: &[String], mut remove: impl FnMut(&str) -> bool) -> Self {
        let mut r = AckReport::default();
        for id in ids {
            if remove(id) { r.acked.push(id.clone()) } else { r.gone.push(id.clone()) }
        }
        r
    }
}

/// A queue of bucket events, consumed at least once.
///
/// Obligations of every implementation (checked by the conformance suite in `tidemark-cloud`):
/// - `receive` returns at most `max` deliveries (and at most the queue's own batch limit), waiting
///   up to `wait` for the first; each returned delivery is invisible to other receivers until it
///   is acknowledged, released, or its visibility timeout passes;
/// - a delivery neither acknowledged nor released comes back after the visibility timeout with a
///   `receive_count` one higher;
/// - `ack` removes exactly the given deliveries; it never fails for ids already gone;
/// - `extend` pushes the delivery's visibility timeout `by` from now; `release` makes it visible
///   again after `delay` (zero: at once);
/// - after an error that repeats (queue missing, credentials refused, endpoint down) the next
///   `receive` waits before it asks again: a caller looping on `receive` never spins.
#[async_trait]
pub trait EventSource: Send + Sync + 'static {
    /// For messages: `sqs:https://.../queue`, `pubsub:projects/p/subscriptions/s`.
    fn describe(&self) -> String;

    /// The most deliveries one `receive` returns.
    fn max_batch(&self) -> usize;

    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>>;
    async fn ack(&self, ack_ids: &[String]) -> Result<AckReport>;
    async fn extend(&self, ack_id: &str, by: Duration) -> Result<()>;
    async fn release(&self, ack_id: &str, delay: Duration) -> Result<()>;

    /// True while the source may have missed notifications that a durable queue would have
    /// kept — a filesystem watcher that just started, or whose buffer overflowed — until
    /// [`EventSource::caught_up`] says a reconcile completed after that. The slice then runs a
    /// gap reconcile before it tails. Queues keep what arrives while nobody listens, so they
    /// never say so.
    fn missed_events(&self) -> bool {
        false
    }

    /// A full reconcile that started after the last [`EventSource::missed_events`] completed.
    fn caught_up(&self) {}

    /// How many messages wait in the subscription's dead-letter queue (those received too often
    /// without being applied), where the source knows one; `None` otherwise.
    async fn dead_lettered(&self) -> Result<Option<u64>> {
        Ok(None)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Created,
    Removed,
    /// Any other event (metadata update, tier change, ...): still a hint to look at the key.
    Other(String),
}

/// One event: a hint that `key` of `bucket` may have changed. Only the key is trusted; the
/// applier asks the bucket (HEAD) what the object is now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketEvent {
    pub bucket: String,
    pub key: String,
    pub kind: EventKind,
    /// When the change happened, by the provider's clock, if the event says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_time_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequencer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_id: Option<String>,
    /// The key names a directory of a hierarchical namespace (Azure Data Lake Storage): the
    /// event is about everything below `key/` at once (a directory created, deleted or renamed),
    /// so the applier reconciles that subtree rather than HEAD one key.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub subtree: bool,
}

/// What a delivery means.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Decoded {
    Events {
        events: Vec<BucketEvent>,
    },
    /// A test message the provider sends when a notification is configured.
    Test,
    /// Well-formed, but not about objects (a subscription confirmation, an unknown schema).
    Ignored {
        reason: String,
    },
    /// Not a message Tidemark can read; it must not be acknowledged as handled.
    Malformed {
        reason: String,
    },
}

impl Decoded {
    pub(crate) fn malformed(reason: impl Into<String>) -> Self {
        Decoded::Malformed { reason: reason.into() }
    }
    pub(crate) fn ignored(reason: impl Into<String>) -> Self {
        Decoded::Ignored { reason: reason.into() }
    }
}

/// The providers whose notifications Tidemark decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    S3,
    Gcs,
    Azure,
}

/// Decodes a delivery from `provider`'s queue.
pub fn decode(provider: Provider, delivery: &Delivery) -> Decoded {
    match provider {
        Provider::S3 => s3::decode(&delivery.body),
        Provider::Gcs => gcs::decode(&delivery.attributes, &delivery.body),
        Provider::Azure => azure::decode(&delivery.body),
    }
}

/// `application/x-www-form-urlencoded` decoding of a whole key, as S3 (and moto) send keys in
/// events: `+` is a space and `%XX` is a byte. `None` if an escape is broken or the result is not
/// UTF-8.
pub fn form_urldecode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = b.get(i + 1..i + 3)?;
                let v = u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
                out.push(v);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// Percent-decoding of one URL path (no `+` rule).
pub fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_decoding() {
        assert_eq!(form_urldecode("a+b%2Fc%2Bd").as_deref(), Some("a b/c+d"));
        assert_eq!(form_urldecode("%C3%BC").as_deref(), Some("ü"));
        assert_eq!(form_urldecode("%zz"), None);
        assert_eq!(form_urldecode("%4"), None);
        assert_eq!(form_urldecode("%FF"), None, "not UTF-8");
        assert_eq!(percent_decode("a+b%20c").as_deref(), Some("a+b c"));
    }
}

#[cfg(test)]
mod never_panic {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::*;

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            // The strings the decoders look for, and junk.
            prop_oneof![
                Just("Notification".to_string()),
                Just("2.1".to_string()),
                Just("ObjectCreated:Put".to_string()),
                Just("Microsoft.Storage.BlobCreated".to_string()),
                Just("s3:TestEvent".to_string()),
                Just("%ZZ+%2F".to_string()),
                Just("/blobServices/default/containers/c/blobs/b".to_string()),
                ".{0,12}",
            ]
            .prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            let keys = prop_oneof![
                Just("Records".to_string()),
                Just("Type".to_string()),
                Just("Message".to_string()),
                Just("eventVersion".to_string()),
                Just("eventName".to_string()),
                Just("eventType".to_string()),
                Just("s3".to_string()),
                Just("bucket".to_string()),
                Just("object".to_string()),
                Just("name".to_string()),
                Just("key".to_string()),
                Just("data".to_string()),
                Just("url".to_string()),
                Just("subject".to_string()),
                "[a-z]{1,5}",
            ];
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(keys, inner, 0..5).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        #[test]
        fn arbitrary_bytes(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = s3::decode(&body);
            let _ = azure::decode(&body);
            let _ = gcs::decode(&Default::default(), &body);
        }

        #[test]
        fn arbitrary_json(v in json()) {
            let text = v.to_string();
            let _ = s3::decode(text.as_bytes());
            let _ = azure::decode(text.as_bytes());
            // An SNS envelope around arbitrary JSON, too.
            let env = serde_json::json!({"Type": "Notification", "Message": text});
            let _ = s3::decode(env.to_string().as_bytes());
            if let Value::Object(m) = &v {
                let attrs = m.iter().map(|(k, v)| (k.clone(), v.to_string())).collect();
                let _ = gcs::decode(&attrs, text.as_bytes());
            }
        }

        #[test]
        fn arbitrary_gcs_attributes(attrs in proptest::collection::btree_map(
            prop_oneof![Just("eventType".to_string()), Just("bucketId".to_string()), Just("objectId".to_string()), Just("payloadFormat".to_string()), Just("eventTime".to_string())],
            prop_oneof![Just("OBJECT_FINALIZE".to_string()), Just("JSON_API_V1".to_string()), ".{0,10}"], 0..5),
            data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = gcs::decode(&attrs, &data);
        }
    }
}

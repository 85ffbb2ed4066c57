//! Event subscriptions: one document per mounted directory, at
//! `/etc/tidemark/remote_events/subscriptions/<escaped dir>.json`, written by
//! `remote.events.enable` and read by the admin's detection.
//!
//! A subscription's **identity** is its queue, topology, bucket, prefix and event types. Its
//! **fingerprint** keys everything durable about it (lease, reconcile marker, status blob): the
//! first 16 hex digits of SHA-256 over the identity's canonical form — the JSON object
//! `{"bucket":..,"event_types":{"created":..,"other":..,"removed":..},"prefix":..,"queue":..,"topology":..}`
//! with keys in that (sorted) order and no spaces. Changing any part makes a new fingerprint, which
//! reads as "never reconciled" and forces a baseline; the directory is deliberately not part of it.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Which event kinds a subscription applies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventTypes {
    pub created: bool,
    pub removed: bool,
    /// Other kinds (metadata updates, tier changes, ...).
    #[serde(default)]
    pub other: bool,
}

impl Default for EventTypes {
    fn default() -> Self {
        EventTypes { created: true, removed: true, other: false }
    }
}

impl EventTypes {
    pub fn wants(&self, kind: &crate::events::EventKind) -> bool {
        match kind {
            crate::events::EventKind::Created => self.created,
            crate::events::EventKind::Removed => self.removed,
            crate::events::EventKind::Other(_) => self.other,
        }
    }

    /// Parses `-events=created,removed,other`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut t = EventTypes { created: false, removed: false, other: false };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "created" => t.created = true,
                "removed" => t.removed = true,
                "other" => t.other = true,
                x => return Err(format!("unknown event type {x:?}: use created, removed and/or other")),
            }
        }
        if !(t.created || t.removed || t.other) {
            return Err("-events names no event type".into());
        }
        Ok(t)
    }

    pub fn describe(&self) -> String {
        let names: Vec<&str> = [(self.created, "created"), (self.removed, "removed"), (self.other, "other")]
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, n)| *n)
            .collect();
        names.join(",")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Topology {
    /// The bucket's notifications already reach a queue; Tidemark only consumes it.
    ByoQueue,
    /// Tidemark creates a queue and points the bucket's notification at it.
    SqsDirect,
    /// A shared topic per bucket with a per-cluster queue subscribed to it.
    SnsFanout,
    /// The bucket's EventBridge delivery, a rule of this cluster's on the default bus, and its
    /// queue as the rule's target.
    #[serde(rename = "eventbridge")]
    EventBridge,
}

impl Topology {
    pub fn as_str(self) -> &'static str {
        match self {
            Topology::ByoQueue => "byo_queue",
            Topology::SqsDirect => "sqs_direct",
            Topology::SnsFanout => "sns_fanout",
            Topology::EventBridge => "eventbridge",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// A queue URL (SQS), a subscription (`projects/P/subscriptions/S`), or an Azure queue name.
    pub queue: String,
    pub topology: Topology,
    pub bucket: String,
    /// The key prefix the subscription covers (`""` or ending in `/`).
    pub prefix: String,
    pub event_types: EventTypes,
}

impl Identity {
    pub fn canonical(&self) -> String {
        // Field order fixed by hand (sorted), so the fingerprint never depends on serde's order.
        serde_json::json!({
            "bucket": self.bucket,
            "event_types": {"created": self.event_types.created, "other": self.event_types.other, "removed": self.event_types.removed},
            "prefix": self.prefix,
            "queue": self.queue,
            "topology": self.topology.as_str(),
        })
        .to_string()
    }

    pub fn fingerprint(&self) -> String {
        let digest = Sha256::digest(self.canonical().as_bytes());
        crate::ids::hex(&digest[..8])
    }
}

/// Tunables of a subscription's slices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriptionOptions {
    pub slice_secs: u64,
    pub reconcile_interval_secs: u64,
    pub gap_threshold_secs: u64,
    pub visibility_timeout_secs: u64,
    pub apply_concurrency: usize,
    /// Warm the content cache on events: after an applied create or update of a file whose name
    /// (or path below the mount, with a `/`) matches this pattern, the filer fetches the new
    /// version in the background (`-prefetch`). Off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<String>,
    /// Only files of at most this many bytes are prefetched (`-prefetchMaxSize`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch_max_size: Option<u64>,
}

/// The longest any of a subscription's durations may be: far beyond any useful setting, and far
/// below what would overflow a deadline (`Instant + Duration`) or a millisecond count.
pub const MAX_DURATION_SECS: u64 = 10 * 365 * 86_400;
/// SQS's longest visibility timeout, and so every provider's here.
pub const MAX_VISIBILITY_SECS: u64 = 12 * 3600;
/// The most event applies a slice runs at once.
pub const MAX_APPLY_CONCURRENCY: usize = 256;

impl SubscriptionOptions {
    /// Whether the options are ones a slice can run with. `remote.events.enable` refuses others;
    /// a document written some other way is checked again when a slice reads it, and a bad one
    /// makes its subscription *errored* with this reason rather than a slice misbehave.
    pub fn validate(&self) -> Result<(), String> {
        for (name, flag, v) in [
            ("slice_secs", "-slice", self.slice_secs),
            ("reconcile_interval_secs", "-reconcileInterval", self.reconcile_interval_secs),
            ("gap_threshold_secs", "-gapThreshold", self.gap_threshold_secs),
        ] {
            if v == 0 || v > MAX_DURATION_SECS {
                return Err(format!("{name} ({flag}) is {v}; give 1 to {MAX_DURATION_SECS} seconds"));
            }
        }
        if self.visibility_timeout_secs == 0 || self.visibility_timeout_secs > MAX_VISIBILITY_SECS {
            return Err(format!(
                "visibility_timeout_secs (-visibility) is {}; give 1 to {MAX_VISIBILITY_SECS} seconds (12h, SQS's limit)",
                self.visibility_timeout_secs
            ));
        }
        if !(1..=MAX_APPLY_CONCURRENCY).contains(&self.apply_concurrency) {
            return Err(format!(
                "apply_concurrency (-concurrency) is {}; give 1 to {MAX_APPLY_CONCURRENCY}",
                self.apply_concurrency
            ));
        }
        if let Some(glob) = &self.prefetch {
            crate::cache::FileFilter::new(Some(glob), None, None, None)
                .map_err(|e| format!("prefetch (-prefetch): {}", e.to_string().replace("-include", "-prefetch")))?;
        }
        Ok(())
    }

    /// The files the event prefetch takes; `None` when it is off (or its pattern is not one,
    /// which `remote.events.enable` refuses before it is ever stored).
    pub fn prefetch_filter(&self) -> Option<crate::cache::FileFilter> {
        let glob = self.prefetch.as_deref()?;
        crate::cache::FileFilter::new(Some(glob), None, None, self.prefetch_max_size).ok()
    }
}

impl Default for SubscriptionOptions {
    fn default() -> Self {
        SubscriptionOptions {
            slice_secs: 300,
            reconcile_interval_secs: 24 * 3600,
            gap_threshold_secs: 3600,
            visibility_timeout_secs: 60,
            apply_concurrency: 8,
            prefetch: None,
            prefetch_max_size: None,
        }
    }
}

/// What provisioning created, recorded only here: teardown removes exactly these.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagedResources {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_arn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_arn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscription_arn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notification_id: Option<String>,
    /// The queue that receives what the subscription's queue could not deliver after
    /// `max_receives` receives (SQS's redrive policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_queue_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_queue_arn: Option<String>,
    /// Receives of one message before it is dead-lettered, as provisioned (`-maxReceives`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_receives: Option<u32>,
    /// The EventBridge rule (on the default bus) that sends the bucket's events to the queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule_name: Option<String>,
    /// Whether Tidemark turned the bucket's EventBridge delivery on (teardown turns it off
    /// again only then, and only when no other rule of Tidemark's needs it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub eventbridge_turned_on: bool,
    /// GCS: the Pub/Sub topic Tidemark created for the bucket's notifications
    /// (`projects/P/topics/T`; none when the subscription uses an existing topic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pubsub_topic: Option<String>,
    /// GCS: the topic on which Tidemark granted the bucket's service agent the publisher role
    /// (an existing topic's policy; a topic Tidemark created goes with its policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publisher_binding: Option<String>,
    /// GCS: the member granted that role (`serviceAccount:service-N@gs-project-accounts…`, the
    /// service agent of the bucket's project), so teardown takes back exactly what it granted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publisher_member: Option<String>,
    /// GCS: this cluster's Pub/Sub subscription (`projects/P/subscriptions/S`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pubsub_subscription: Option<String>,
    /// Azure: the storage account's Event Grid system topic (its ARM resource id) that this
    /// subscription's event subscription hangs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_topic: Option<String>,
    /// Azure: whether Tidemark created that system topic (teardown removes it only then, and
    /// only once no event subscription is left on it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub system_topic_created: bool,
    /// Azure: this cluster's event subscription (its ARM resource id), delivering to the queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_subscription: Option<String>,
}

/// `-maxReceives` when not given: a message that failed this many times is not going to apply.
pub const DEFAULT_MAX_RECEIVES: u32 = 10;
/// SQS's largest `maxReceiveCount`.
pub const MAX_MAX_RECEIVES: u32 = 1000;

impl ManagedResources {
    pub fn is_empty(&self) -> bool {
        *self == ManagedResources::default()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriptionDoc {
    pub dir: String,
    pub identity: Identity,
    pub fingerprint: String,
    #[serde(default)]
    pub options: SubscriptionOptions,
    #[serde(default)]
    pub managed: ManagedResources,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

/// The optional capability of a remote-storage provider to set up and take down the delivery of
/// its bucket's events to a queue (DESIGN §7). Providers without it (most S3-compatibles, or
/// where provisioning is not implemented) keep the polling tools (`remote.meta.sync`) or a
/// bring-your-own queue.
#[async_trait::async_trait]
pub trait EventNotifications: Send + Sync {
    /// Provisions `topology` for keys under `prefix`, recording each resource in `managed` as soon
    /// as it exists (so a failure part-way leaves exactly what must be torn down). The new
    /// queue's URL is returned; `fingerprint_of` maps it to the subscription's fingerprint, which
    /// names the bucket's configuration.
    /// A message received `max_receives` times without being acknowledged moves to a
    /// dead-letter queue provisioned beside the subscription's (0: none).
    #[allow(clippy::too_many_arguments)]
    async fn provision(
        &self,
        topology: Topology,
        queue_name: &str,
        prefix: &str,
        events: &EventTypes,
        max_receives: u32,
        fingerprint_of: &(dyn for<'f> Fn(&'f str) -> String + Send + Sync),
        managed: &mut ManagedResources,
    ) -> crate::Result<String>;

    /// Removes what `managed` lists, clearing each resource as it goes; after an error,
    /// `managed` is what remains. Shared resources others still use are left to them. Returns
    /// what was done, one phrase each — what was removed, and what was kept and why — so the
    /// operator is told which happened, never "removed unless…".
    async fn teardown(&self, managed: &mut ManagedResources) -> crate::Result<Vec<String>>;
}

pub const SUBSCRIPTIONS_DIR: &str = "/etc/tidemark/remote_events/subscriptions";

/// The document path of the subscription of `dir`: `/` and `%` are percent-escaped, so the
/// mapping is injective and the name readable (`%2Fmnt%2Fdata.json`).
pub fn doc_path(dir: &str) -> String {
    format!("{SUBSCRIPTIONS_DIR}/{}.json", dir.replace('%', "%25").replace('/', "%2F"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> Identity {
        Identity {
            queue: "https://sqs.example/123/q".into(),
            topology: Topology::ByoQueue,
            bucket: "b".into(),
            prefix: "photos/".into(),
            event_types: EventTypes::default(),
        }
    }

    #[test]
    fn options_out_of_bounds_are_named_not_run() {
        assert_eq!(SubscriptionOptions::default().validate(), Ok(()));
        let bad = [
            SubscriptionOptions { slice_secs: u64::MAX, ..Default::default() },
            SubscriptionOptions { reconcile_interval_secs: 0, ..Default::default() },
            SubscriptionOptions { gap_threshold_secs: u64::MAX / 1000, ..Default::default() },
            SubscriptionOptions { visibility_timeout_secs: 12 * 3600 + 1, ..Default::default() },
            SubscriptionOptions { apply_concurrency: 0, ..Default::default() },
            SubscriptionOptions { apply_concurrency: 1 << 20, ..Default::default() },
        ];
        for o in bad {
            assert!(o.validate().is_err(), "{o:?}");
        }
        let e = SubscriptionOptions { slice_secs: u64::MAX, ..Default::default() }.validate().unwrap_err();
        assert!(e.contains("slice_secs") && e.contains("-slice"), "{e}");
    }

    #[test]
    fn the_fingerprint_is_stable_and_changes_with_every_part_of_the_identity() {
        let base = id();
        assert_eq!(base.fingerprint().len(), 16);
        assert_eq!(base.fingerprint(), id().fingerprint(), "deterministic");
        // Pinned: a change of the canonical form would silently force every baseline again.
        assert_eq!(
            base.canonical(),
            r#"{"bucket":"b","event_types":{"created":true,"other":false,"removed":true},"prefix":"photos/","queue":"https://sqs.example/123/q","topology":"byo_queue"}"#
        );
        let variants = [
            Identity { queue: "https://sqs.example/123/other".into(), ..id() },
            Identity { topology: Topology::SqsDirect, ..id() },
            Identity { bucket: "b2".into(), ..id() },
            Identity { prefix: "photos/2024/".into(), ..id() },
            Identity { event_types: EventTypes { removed: false, ..EventTypes::default() }, ..id() },
        ];
        for v in variants {
            assert_ne!(v.fingerprint(), base.fingerprint(), "{v:?}");
        }
    }

    #[test]
    fn event_types_parse_and_doc_paths_escape() {
        assert_eq!(EventTypes::parse("created").unwrap(), EventTypes { created: true, removed: false, other: false });
        assert_eq!(EventTypes::parse("removed, created").unwrap().describe(), "created,removed");
        assert!(EventTypes::parse("deleted").unwrap_err().contains("unknown event type"));
        assert!(EventTypes::parse("").is_err());
        assert_eq!(doc_path("/mnt/data"), "/etc/tidemark/remote_events/subscriptions/%2Fmnt%2Fdata.json");
        assert_ne!(doc_path("/a%2Fb"), doc_path("/a/b"));
        crate::path::validate(&doc_path("/mnt/a b/ü")).unwrap();
    }
}

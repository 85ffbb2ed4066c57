//! Provisioning of S3 event notifications (the `EventNotifications` capability of S3): the
//! `sqs_direct` topology — a queue Tidemark creates, a policy that lets the bucket send to it,
//! and a `QueueConfiguration` (id `tidemark-<fingerprint>`) merged into the bucket's notification
//! configuration — and its exact teardown.
//!
//! S3 allows one configuration per overlapping (event type, prefix/suffix) pair, but not every
//! S3-compatible (nor moto) enforces it; Tidemark checks before it adds its own, and refuses with
//! the name of the configuration in the way.
//!
//! `eventbridge`: the bucket's EventBridge delivery turned on (every other configuration kept), a
//! rule of this cluster's on the default bus matching the bucket, prefix and event types, and its
//! queue as the rule's target, with a policy that lets EventBridge send from that rule.

use aws_sdk_s3::types::{
    Event, FilterRule, FilterRuleName, NotificationConfiguration, NotificationConfigurationFilter, QueueConfiguration,
    S3KeyFilter, TopicConfiguration,
};
use aws_sdk_sqs::types::QueueAttributeName;

use tidemark_core::remote::RemoteConf;
use tidemark_core::subscription::{EventNotifications, EventTypes, ManagedResources, Topology};
use tidemark_core::{Error, Result};

use super::s3::S3Storage;

/// One rule of a bucket's notification configuration, as far as overlap goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub id: String,
    pub events: Vec<String>,
    pub prefix: String,
    pub suffix: String,
}

fn event_overlaps(a: &str, b: &str) -> bool {
    let covers = |wide: &str, narrow: &str| wide.strip_suffix('*').is_some_and(|stem| narrow.starts_with(stem));
    a == b || covers(a, b) || covers(b, a)
}

/// Whether two rules could both match one event (S3 refuses such pairs).
pub fn overlaps(a: &Rule, b: &Rule) -> bool {
    let events = a.events.iter().any(|x| b.events.iter().any(|y| event_overlaps(x, y)));
    let prefixes = a.prefix.starts_with(&b.prefix) || b.prefix.starts_with(&a.prefix);
    let suffixes = a.suffix.ends_with(&b.suffix) || b.suffix.ends_with(&a.suffix);
    events && prefixes && suffixes
}

/// The S3 event names a subscription's event types provision (SEMANTICS.md, "Event names"):
/// `created` is every way an object appears or changes what a reader gets — put, and also
/// restored from an archive, its restored copy expired, or moved to another storage class;
/// `removed` every way it leaves — deleted, and expired by a lifecycle rule, which S3 reports as
/// `LifecycleExpiration:*`, not `ObjectRemoved:*`; `other` what changes neither (a restore
/// started, tags, ACLs).
pub fn s3_events(t: &EventTypes) -> Vec<Event> {
    let mut v = Vec::new();
    if t.created {
        v.push(Event::S3ObjectCreated);
        v.push(Event::S3ObjectRestoreCompleted);
        v.push(Event::S3ObjectRestoreDelete);
        v.push(Event::S3LifecycleTransition);
        v.push(Event::S3IntelligentTiering);
    }
    if t.removed {
        v.push(Event::S3ObjectRemoved);
        v.push(Event::S3LifecycleExpiration);
    }
    if t.other {
        v.push(Event::S3ObjectRestorePost);
        v.push(Event::S3ObjectTagging);
        v.push(Event::S3ObjectAclPut);
    }
    v
}

fn filter_of(f: Option<&NotificationConfigurationFilter>) -> (String, String) {
    let mut prefix = String::new();
    let mut suffix = String::new();
    for r in f.and_then(|f| f.key()).map(|k| k.filter_rules()).unwrap_or_default() {
        match r.name() {
            Some(FilterRuleName::Prefix) => prefix = r.value().unwrap_or_default().to_string(),
            Some(FilterRuleName::Suffix) => suffix = r.value().unwrap_or_default().to_string(),
            _ => {}
        }
    }
    (prefix, suffix)
}

/// The rules of a configuration (queue, topic and Lambda targets alike).
pub fn rules_of(c: &NotificationConfiguration) -> Vec<Rule> {
    let mut out = Vec::new();
    let mut push = |id: Option<&str>, events: &[Event], f: Option<&NotificationConfigurationFilter>| {
        let (prefix, suffix) = filter_of(f);
        out.push(Rule {
            id: id.unwrap_or("(unnamed)").to_string(),
            events: events.iter().map(|e| e.as_str().to_string()).collect(),
            prefix,
            suffix,
        });
    };
    for q in c.queue_configurations() {
        push(q.id(), q.events(), q.filter());
    }
    for t in c.topic_configurations() {
        push(t.id(), t.events(), t.filter());
    }
    for l in c.lambda_function_configurations() {
        push(l.id(), l.events(), l.filter());
    }
    out
}

pub struct S3Notifications {
    s3: aws_sdk_s3::Client,
    sqs: aws_sdk_sqs::Client,
    sns: aws_sdk_sns::Client,
    events: aws_sdk_eventbridge::Client,
    bucket: String,
}

/// The shared topic of a bucket, and the id of the bucket's configuration that feeds it.
pub fn topic_name(bucket: &str) -> String {
    let safe: String =
        bucket.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' }).collect();
    format!("tidemark-{safe}")
}

pub fn topic_configuration_id(bucket: &str) -> String {
    format!("tidemark-sns-{}", topic_name(bucket).trim_start_matches("tidemark-"))
}

/// A refused or failed provisioning call: access denied says which permission (of the
/// create/route kind) is missing; anything else may pass.
fn provision_error(service: &str, op: &str, what: &str, code: Option<&str>, message: Option<&str>) -> Error {
    let code = code.unwrap_or("error");
    if matches!(code, "AccessDenied" | "AccessDeniedException" | "AuthorizationError" | "InvalidClientTokenId") {
        return Error::Unauthorized {
            message: format!(
                "{op} {what} was refused ({code}); provisioning needs {service}:{op} (create/route permissions)"
            ),
        };
    }
    Error::Unavailable { message: format!("{op} {what}: {code} {}", message.unwrap_or_default()) }
}

fn sns_err<E: aws_sdk_sns::error::ProvideErrorMetadata>(op: &str, what: &str, e: E) -> Error {
    provision_error("sns", op, what, e.code(), e.message())
}

fn events_err<E: aws_sdk_eventbridge::error::ProvideErrorMetadata>(op: &str, what: &str, e: E) -> Error {
    provision_error("EventBridge", op, what, e.code(), e.message())
}

/// The id of the target every Tidemark rule has (its queue).
const EVENTBRIDGE_TARGET: &str = "tidemark-queue";

/// EventBridge's names (`detail-type`) for a subscription's event types, as S3 sends them.
pub fn eventbridge_detail_types(t: &EventTypes) -> Vec<&'static str> {
    let mut v = Vec::new();
    if t.created {
        v.extend([
            "Object Created",
            "Object Restore Completed",
            "Object Restore Expired",
            "Object Storage Class Changed",
            "Object Access Tier Changed",
        ]);
    }
    if t.removed {
        // Deletes and lifecycle expirations alike (`detail.reason`).
        v.push("Object Deleted");
    }
    if t.other {
        v.extend(["Object Restore Initiated", "Object Tags Added", "Object Tags Deleted", "Object ACL Updated"]);
    }
    v
}

/// The rule's event pattern: S3's events of this bucket, of these types, below this prefix.
pub fn eventbridge_pattern(bucket: &str, prefix: &str, t: &EventTypes) -> serde_json::Value {
    let mut detail = serde_json::json!({"bucket": {"name": [bucket]}});
    if !prefix.is_empty() {
        detail["object"] = serde_json::json!({"key": [{"prefix": prefix}]});
    }
    serde_json::json!({"source": ["aws.s3"], "detail-type": eventbridge_detail_types(t), "detail": detail})
}

fn sqs_err<E: aws_sdk_sqs::error::ProvideErrorMetadata>(op: &str, what: &str, e: E) -> Error {
    provision_error("sqs", op, what, e.code(), e.message())
}

fn s3_err<E: aws_sdk_s3::error::ProvideErrorMetadata>(op: &str, bucket: &str, e: E) -> Error {
    provision_error("s3", op, &format!("on bucket {bucket}"), e.code(), e.message())
}

impl S3Notifications {
    pub async fn connect(conf: &RemoteConf, bucket: &str) -> Result<Self> {
        let s3 = S3Storage::connect(conf, bucket).await?.client().clone();
        let sqs = super::sqs::client(conf).await?;
        let sdk = super::s3::sdk_config(conf).await?;
        let mut b = aws_sdk_sns::config::Builder::from(&sdk);
        if let Some(ep) = conf.setting("sns_endpoint") {
            b = b.endpoint_url(ep);
        }
        let sns = aws_sdk_sns::Client::from_conf(b.build());
        let mut b = aws_sdk_eventbridge::config::Builder::from(&sdk);
        if let Some(ep) = conf.setting("events_endpoint") {
            b = b.endpoint_url(ep);
        }
        let events = aws_sdk_eventbridge::Client::from_conf(b.build());
        Ok(S3Notifications { s3, sqs, sns, events, bucket: bucket.to_string() })
    }

    pub async fn configuration(&self) -> Result<NotificationConfiguration> {
        let out = match self.s3.get_bucket_notification_configuration().bucket(&self.bucket).send().await {
            Ok(out) => out,
            Err(e) => {
                // moto answers an empty configuration with a `<GetBucketNotificationResponse/>`
                // root, which the SDK refuses to parse; it means "no configuration".
                if let aws_sdk_s3::error::SdkError::ServiceError(se) = &e
                    && se.raw().status().as_u16() == 200
                    && se.raw().body().bytes().is_some_and(|b| {
                        let t = String::from_utf8_lossy(b);
                        t.contains("<GetBucketNotificationResponse") && t.trim_end().ends_with("/>")
                    })
                {
                    return Ok(NotificationConfiguration::builder().build());
                }
                return Err(s3_err("GetBucketNotificationConfiguration", &self.bucket, e.into_service_error()));
            }
        };
        Ok(NotificationConfiguration::builder()
            .set_queue_configurations(Some(out.queue_configurations().to_vec()))
            .set_topic_configurations(Some(out.topic_configurations().to_vec()))
            .set_lambda_function_configurations(Some(out.lambda_function_configurations().to_vec()))
            .set_event_bridge_configuration(out.event_bridge_configuration().cloned())
            .build())
    }

    async fn put_configuration(&self, c: NotificationConfiguration) -> Result<()> {
        self.s3
            .put_bucket_notification_configuration()
            .bucket(&self.bucket)
            .notification_configuration(c)
            .send()
            .await
            .map_err(|e| s3_err("PutBucketNotificationConfiguration", &self.bucket, e.into_service_error()))?;
        Ok(())
    }

    /// Refuses when an existing configuration overlaps the one Tidemark would add.
    pub async fn check_overlap(&self, prefix: &str, events: &EventTypes) -> Result<()> {
        let ours = Rule {
            id: String::new(),
            events: s3_events(events).iter().map(|e| e.as_str().to_string()).collect(),
            prefix: prefix.into(),
            suffix: String::new(),
        };
        if let Some(r) = rules_of(&self.configuration().await?).into_iter().find(|r| overlaps(r, &ours)) {
            return Err(Error::invalid_argument(format!(
                "bucket {} already has the notification configuration {:?} ({} on prefix {:?}), which overlaps this one and S3 allows \
                 only one: use -via=sns to share the bucket's events, or -queue=URL to consume the queue that configuration feeds",
                self.bucket,
                r.id,
                r.events.join(","),
                r.prefix
            )));
        }
        Ok(())
    }

    /// Creates a queue (with this message retention, in seconds) and returns its URL.
    async fn new_queue(&self, name: &str, retention_secs: Option<&str>) -> Result<String> {
        let mut req = self.sqs.create_queue().queue_name(name);
        if let Some(r) = retention_secs {
            req = req.attributes(QueueAttributeName::MessageRetentionPeriod, r);
        }
        let out = req.send().await.map_err(|e| sqs_err("CreateQueue", name, e.into_service_error()))?;
        Ok(out.queue_url().unwrap_or_default().to_string())
    }

    async fn queue_arn(&self, url: &str) -> Result<String> {
        let attrs = self
            .sqs
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .map_err(|e| sqs_err("GetQueueAttributes", url, e.into_service_error()))?;
        Ok(attrs.attributes().and_then(|a| a.get(&QueueAttributeName::QueueArn)).cloned().unwrap_or_default())
    }

    /// Deletes a queue; one already gone is fine.
    /// How many messages the queue at `url` holds (visible and in flight), if it can be read.
    async fn depth(&self, url: &str) -> Option<u64> {
        use aws_sdk_sqs::types::QueueAttributeName as A;
        let out = self
            .sqs
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(A::ApproximateNumberOfMessages)
            .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .ok()?;
        let attrs = out.attributes()?;
        let n = |a: A| attrs.get(&a).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        Some(n(A::ApproximateNumberOfMessages) + n(A::ApproximateNumberOfMessagesNotVisible))
    }

    async fn delete_queue(&self, url: &str) -> Result<()> {
        match self.sqs.delete_queue().queue_url(url).send().await {
            Ok(_) => Ok(()),
            Err(e) => {
                let e = e.into_service_error();
                if e.is_queue_does_not_exist() { Ok(()) } else { Err(sqs_err("DeleteQueue", url, e)) }
            }
        }
    }

    /// Creates a queue whose policy lets `principal` (a service) send from `source_arn`, and
    /// (unless `max_receives` is 0) its dead-letter queue, `NAME-dead`, first: a message received
    /// `max_receives` times without being acknowledged moves there instead of coming back for ever.
    async fn create_queue(
        &self,
        name: &str,
        principal: &str,
        source_arn: &str,
        max_receives: u32,
        managed: &mut ManagedResources,
    ) -> Result<(String, String)> {
        let mut redrive = None;
        if max_receives > 0 {
            let dead = format!("{name}-dead");
            // The longest SQS keeps a message (14 days): time to look at what went there.
            let url = self.new_queue(&dead, Some("1209600")).await?;
            managed.dead_letter_queue_url = Some(url.clone());
            let arn = self.queue_arn(&url).await?;
            managed.dead_letter_queue_arn = Some(arn.clone());
            managed.max_receives = Some(max_receives);
            redrive =
                Some(serde_json::json!({"deadLetterTargetArn": arn, "maxReceiveCount": max_receives}).to_string());
        }
        let url = self.new_queue(name, None).await?;
        managed.queue_url = Some(url.clone());
        let arn = self.queue_arn(&url).await?;
        managed.queue_arn = Some(arn.clone());
        let policy = serde_json::json!({
            "Version": "2012-10-17",
            "Statement": [{
                "Sid": "tidemark-send",
                "Effect": "Allow",
                "Principal": {"Service": principal},
                "Action": "sqs:SendMessage",
                "Resource": arn,
                "Condition": {"ArnLike": {"aws:SourceArn": source_arn}}
            }]
        });
        let mut set =
            self.sqs.set_queue_attributes().queue_url(&url).attributes(QueueAttributeName::Policy, policy.to_string());
        if let Some(r) = redrive {
            set = set.attributes(QueueAttributeName::RedrivePolicy, r);
        }
        set.send().await.map_err(|e| sqs_err("SetQueueAttributes", &url, e.into_service_error()))?;
        Ok((url, arn))
    }

    /// `sns_fanout`: the bucket's shared topic (created, with the bucket's `TopicConfiguration`,
    /// by the first subscriber; found by the next), and this cluster's own queue subscribed to
    /// it. Returns the queue's URL.
    pub async fn provision_sns_fanout(
        &self,
        queue_name: &str,
        max_receives: u32,
        managed: &mut ManagedResources,
    ) -> Result<String> {
        let topic_arn = self
            .sns
            .create_topic()
            .name(topic_name(&self.bucket))
            .send()
            .await
            .map_err(|e| sns_err("CreateTopic", &topic_name(&self.bucket), e.into_service_error()))?
            .topic_arn()
            .unwrap_or_default()
            .to_string();
        managed.topic_arn = Some(topic_arn.clone());
        let policy = serde_json::json!({
            "Version": "2012-10-17",
            "Statement": [{
                "Sid": "tidemark-s3-publish",
                "Effect": "Allow",
                "Principal": {"Service": "s3.amazonaws.com"},
                "Action": "sns:Publish",
                "Resource": topic_arn,
                "Condition": {"ArnLike": {"aws:SourceArn": format!("arn:aws:s3:::{}", self.bucket)}}
            }]
        });
        self.sns
            .set_topic_attributes()
            .topic_arn(&topic_arn)
            .attribute_name("Policy")
            .attribute_value(policy.to_string())
            .send()
            .await
            .map_err(|e| sns_err("SetTopicAttributes", &topic_arn, e.into_service_error()))?;
        // The bucket's configuration for the topic: shared, whole bucket; each subscriber
        // filters its own prefix and event types.
        let id = topic_configuration_id(&self.bucket);
        let current = self.configuration().await?;
        if !current.topic_configurations().iter().any(|t| t.id() == Some(id.as_str())) {
            let ours = Rule {
                id: id.clone(),
                events: s3_events(&EventTypes::default()).iter().map(|e| e.as_str().to_string()).collect(),
                prefix: String::new(),
                suffix: String::new(),
            };
            if let Some(r) = rules_of(&current).into_iter().find(|r| overlaps(r, &ours)) {
                return Err(Error::invalid_argument(format!(
                    "bucket {} already has the notification configuration {:?} ({} on prefix {:?}), which overlaps the fan-out \
                     topic's; consume the queue that configuration feeds with -queue=URL",
                    self.bucket,
                    r.id,
                    r.events.join(","),
                    r.prefix
                )));
            }
            let tc = TopicConfiguration::builder()
                .id(&id)
                .topic_arn(&topic_arn)
                .set_events(Some(s3_events(&EventTypes::default())))
                .build()
                .map_err(|e| Error::internal(format!("building the topic configuration: {e}")))?;
            let mut topics = current.topic_configurations().to_vec();
            topics.push(tc);
            let merged = NotificationConfiguration::builder()
                .set_queue_configurations(Some(current.queue_configurations().to_vec()))
                .set_topic_configurations(Some(topics))
                .set_lambda_function_configurations(Some(current.lambda_function_configurations().to_vec()))
                .set_event_bridge_configuration(current.event_bridge_configuration().cloned())
                .build();
            self.put_configuration(merged).await?;
        }
        managed.notification_id = Some(id);
        let (url, arn) = self.create_queue(queue_name, "sns.amazonaws.com", &topic_arn, max_receives, managed).await?;
        let sub = self
            .sns
            .subscribe()
            .topic_arn(&topic_arn)
            .protocol("sqs")
            .endpoint(&arn)
            .return_subscription_arn(true)
            .send()
            .await
            .map_err(|e| sns_err("Subscribe", &topic_arn, e.into_service_error()))?;
        managed.subscription_arn = sub.subscription_arn().map(str::to_string);
        Ok(url)
    }

    /// `sqs_direct`, step by step; every resource is recorded in `managed` as soon as it
    /// exists, so a failure part-way leaves exactly what must be torn down. `fingerprint_of`
    /// turns the new queue's URL into the subscription's fingerprint (it names the configuration).
    pub async fn provision_sqs_direct(
        &self,
        queue_name: &str,
        prefix: &str,
        events: &EventTypes,
        max_receives: u32,
        fingerprint_of: &(dyn for<'f> Fn(&'f str) -> String + Send + Sync),
        managed: &mut ManagedResources,
    ) -> Result<String> {
        self.check_overlap(prefix, events).await?;
        let source = format!("arn:aws:s3:::{}", self.bucket);
        let (url, arn) = self.create_queue(queue_name, "s3.amazonaws.com", &source, max_receives, managed).await?;
        let id = format!("tidemark-{}", fingerprint_of(&url));
        let mut filter = None;
        if !prefix.is_empty() {
            let rule = FilterRule::builder().name(FilterRuleName::Prefix).value(prefix).build();
            filter = Some(
                NotificationConfigurationFilter::builder()
                    .key(S3KeyFilter::builder().filter_rules(rule).build())
                    .build(),
            );
        }
        let qc = QueueConfiguration::builder()
            .id(&id)
            .queue_arn(&arn)
            .set_events(Some(s3_events(events)))
            .set_filter(filter)
            .build()
            .map_err(|e| Error::internal(format!("building the queue configuration: {e}")))?;
        let current = self.configuration().await?;
        let mut queues = current.queue_configurations().to_vec();
        queues.push(qc);
        let merged = NotificationConfiguration::builder()
            .set_queue_configurations(Some(queues))
            .set_topic_configurations(Some(current.topic_configurations().to_vec()))
            .set_lambda_function_configurations(Some(current.lambda_function_configurations().to_vec()))
            .set_event_bridge_configuration(current.event_bridge_configuration().cloned())
            .build();
        self.put_configuration(merged).await?;
        managed.notification_id = Some(id);
        Ok(url)
    }

    /// `eventbridge`, step by step, each resource recorded as soon as it exists: the bucket's
    /// EventBridge delivery (turned on if it was off), this cluster's rule on the default bus, the
    /// queue (and its dead-letter queue) with a policy for that rule, and the rule's target.
    pub async fn provision_eventbridge(
        &self,
        queue_name: &str,
        prefix: &str,
        events: &EventTypes,
        max_receives: u32,
        managed: &mut ManagedResources,
    ) -> Result<String> {
        let current = self.configuration().await?;
        if current.event_bridge_configuration().is_none() {
            let on = NotificationConfiguration::builder()
                .set_queue_configurations(Some(current.queue_configurations().to_vec()))
                .set_topic_configurations(Some(current.topic_configurations().to_vec()))
                .set_lambda_function_configurations(Some(current.lambda_function_configurations().to_vec()))
                .event_bridge_configuration(aws_sdk_s3::types::EventBridgeConfiguration::builder().build())
                .build();
            self.put_configuration(on).await?;
            managed.eventbridge_turned_on = true;
        }
        let pattern = eventbridge_pattern(&self.bucket, prefix, events);
        let rule_arn = self
            .events
            .put_rule()
            .name(queue_name)
            .event_pattern(pattern.to_string())
            .description(format!("Tidemark: events of s3://{}/{prefix} for one cluster's queue", self.bucket))
            .send()
            .await
            .map_err(|e| events_err("PutRule", queue_name, e.into_service_error()))?
            .rule_arn()
            .unwrap_or_default()
            .to_string();
        managed.rule_name = Some(queue_name.to_string());
        let (url, arn) =
            self.create_queue(queue_name, "events.amazonaws.com", &rule_arn, max_receives, managed).await?;
        let target = aws_sdk_eventbridge::types::Target::builder()
            .id(EVENTBRIDGE_TARGET)
            .arn(&arn)
            .build()
            .map_err(|e| Error::internal(format!("building the rule's target: {e}")))?;
        let put = self
            .events
            .put_targets()
            .rule(queue_name)
            .targets(target)
            .send()
            .await
            .map_err(|e| events_err("PutTargets", queue_name, e.into_service_error()))?;
        if put.failed_entry_count() > 0 {
            let why: Vec<String> = put
                .failed_entries()
                .iter()
                .map(|f| format!("{}: {}", f.error_code().unwrap_or("?"), f.error_message().unwrap_or("")))
                .collect();
            return Err(Error::Unavailable { message: format!("PutTargets {queue_name}: {}", why.join("; ")) });
        }
        Ok(url)
    }

    /// Whether another rule of Tidemark's on the default bus still matches this bucket.
    async fn other_rules_need_eventbridge(&self, except: Option<&str>) -> Result<bool> {
        let mut token = None;
        loop {
            let out = self
                .events
                .list_rules()
                .name_prefix("tidemark-")
                .set_next_token(token)
                .send()
                .await
                .map_err(|e| events_err("ListRules", "tidemark-*", e.into_service_error()))?;
            for r in out.rules() {
                let mine = r.name() == except;
                let for_bucket = r
                    .event_pattern()
                    .and_then(|p| serde_json::from_str::<serde_json::Value>(p).ok())
                    .is_some_and(|p| {
                        p["detail"]["bucket"]["name"]
                            .as_array()
                            .is_some_and(|a| a.iter().any(|b| b == self.bucket.as_str()))
                    });
                if !mine && for_bucket {
                    return Ok(true);
                }
            }
            match out.next_token() {
                Some(t) => token = Some(t.to_string()),
                None => return Ok(false),
            }
        }
    }

    /// Removes what `managed` lists — Tidemark's configuration (others survive), then its queue —
    /// clearing each as it goes: after an error, `managed` is what remains. Returns what was
    /// done, one phrase each.
    pub async fn teardown_all(&self, managed: &mut ManagedResources) -> Result<Vec<String>> {
        let mut done = Vec::new();
        // Fan-out: this cluster's subscription first; the shared topic and its configuration
        // go only when no other subscriber remains.
        if let Some(sub) = managed.subscription_arn.clone() {
            match self.sns.unsubscribe().subscription_arn(&sub).send().await {
                Ok(_) => {}
                Err(e) => {
                    let e = e.into_service_error();
                    if !e.is_not_found_exception() {
                        return Err(sns_err("Unsubscribe", &sub, e));
                    }
                }
            }
            managed.subscription_arn = None;
            done.push(format!("removed SNS subscription {sub}"));
        }
        if let Some(topic) = managed.topic_arn.clone() {
            let others = self
                .sns
                .list_subscriptions_by_topic()
                .topic_arn(&topic)
                .send()
                .await
                .map(|o| o.subscriptions().len())
                .or_else(|e| {
                    let e = e.into_service_error();
                    if e.is_not_found_exception() { Ok(0) } else { Err(sns_err("ListSubscriptionsByTopic", &topic, e)) }
                })?;
            if others == 0 {
                self.remove_configuration(managed.notification_id.as_deref()).await?;
                self.sns
                    .delete_topic()
                    .topic_arn(&topic)
                    .send()
                    .await
                    .map_err(|e| sns_err("DeleteTopic", &topic, e.into_service_error()))?;
                done.push(format!(
                    "removed the shared topic {topic} and its notification configuration (no subscriber left)"
                ));
            } else {
                done.push(format!(
                    "kept the shared topic {topic} and its notification configuration: {others} other subscription(s) still use it"
                ));
            }
            // Shared resources still in use by others are theirs now: forget them either way.
            managed.notification_id = None;
            managed.topic_arn = None;
        }
        if let Some(id) = managed.notification_id.clone() {
            self.remove_configuration(Some(&id)).await?;
            managed.notification_id = None;
            done.push(format!("removed the bucket's notification configuration {id:?} (the others kept)"));
        }
        // EventBridge: the rule's target, then the rule, before the queue it sends to.
        if let Some(rule) = managed.rule_name.clone() {
            match self.events.remove_targets().rule(&rule).ids(EVENTBRIDGE_TARGET).send().await {
                Ok(_) => {}
                Err(e) => {
                    let e = e.into_service_error();
                    if !e.is_resource_not_found_exception() {
                        return Err(events_err("RemoveTargets", &rule, e));
                    }
                }
            }
            match self.events.delete_rule().name(&rule).send().await {
                Ok(_) => {}
                Err(e) => {
                    let e = e.into_service_error();
                    if !e.is_resource_not_found_exception() {
                        return Err(events_err("DeleteRule", &rule, e));
                    }
                }
            }
            managed.rule_name = None;
            done.push(format!("removed EventBridge rule {rule} and its target"));
        }
        if managed.eventbridge_turned_on {
            // Off again only if no other rule of Tidemark's needs it; others' rules are not
            // Tidemark's to know, which is why it stays on when Tidemark did not turn it on.
            if self.other_rules_need_eventbridge(None).await? {
                done.push(
                    "kept the bucket's EventBridge delivery on: another rule of Tidemark's still needs it".to_string(),
                );
            } else {
                let current = self.configuration().await?;
                let off = NotificationConfiguration::builder()
                    .set_queue_configurations(Some(current.queue_configurations().to_vec()))
                    .set_topic_configurations(Some(current.topic_configurations().to_vec()))
                    .set_lambda_function_configurations(Some(current.lambda_function_configurations().to_vec()))
                    .build();
                self.put_configuration(off).await?;
                done.push("turned the bucket's EventBridge delivery off (Tidemark had turned it on)".to_string());
            }
            managed.eventbridge_turned_on = false;
        }
        if let Some(url) = managed.queue_url.clone() {
            self.delete_queue(&url).await?;
            managed.queue_url = None;
            managed.queue_arn = None;
            done.push(format!("deleted queue {url}"));
        }
        // After the queue whose redrive policy names it; what it still holds is said, as it
        // goes with it.
        if let Some(url) = managed.dead_letter_queue_url.clone() {
            let held = self.depth(&url).await;
            self.delete_queue(&url).await?;
            managed.dead_letter_queue_url = None;
            managed.dead_letter_queue_arn = None;
            done.push(match held {
                Some(0) => format!("deleted dead-letter queue {url} (empty)"),
                Some(n) => format!("deleted dead-letter queue {url} with the {n} message(s) it still held"),
                None => format!("deleted dead-letter queue {url} (how many messages it held could not be read)"),
            });
        }
        managed.max_receives = None;
        Ok(done)
    }

    /// Removes the bucket's queue or topic configuration with this id; others stay.
    async fn remove_configuration(&self, id: Option<&str>) -> Result<()> {
        let Some(id) = id else { return Ok(()) };
        let current = self.configuration().await?;
        let queues: Vec<QueueConfiguration> =
            current.queue_configurations().iter().filter(|q| q.id() != Some(id)).cloned().collect();
        let topics: Vec<TopicConfiguration> =
            current.topic_configurations().iter().filter(|t| t.id() != Some(id)).cloned().collect();
        let kept = NotificationConfiguration::builder()
            .set_queue_configurations(Some(queues))
            .set_topic_configurations(Some(topics))
            .set_lambda_function_configurations(Some(current.lambda_function_configurations().to_vec()))
            .set_event_bridge_configuration(current.event_bridge_configuration().cloned())
            .build();
        self.put_configuration(kept).await
    }
}

#[async_trait::async_trait]
impl EventNotifications for S3Notifications {
    async fn provision(
        &self,
        topology: Topology,
        queue_name: &str,
        prefix: &str,
        events: &EventTypes,
        max_receives: u32,
        fingerprint_of: &(dyn for<'f> Fn(&'f str) -> String + Send + Sync),
        managed: &mut ManagedResources,
    ) -> Result<String> {
        match topology {
            Topology::SqsDirect => {
                self.provision_sqs_direct(queue_name, prefix, events, max_receives, fingerprint_of, managed).await
            }
            Topology::SnsFanout => self.provision_sns_fanout(queue_name, max_receives, managed).await,
            Topology::EventBridge => {
                self.provision_eventbridge(queue_name, prefix, events, max_receives, managed).await
            }
            Topology::ByoQueue => Err(Error::invalid_argument("a bring-your-own queue is not provisioned")),
        }
    }

    async fn teardown(&self, managed: &mut ManagedResources) -> Result<Vec<String>> {
        self.teardown_all(managed).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(events: &[&str], prefix: &str, suffix: &str) -> Rule {
        Rule {
            id: "r".into(),
            events: events.iter().map(|s| s.to_string()).collect(),
            prefix: prefix.into(),
            suffix: suffix.into(),
        }
    }

    #[test]
    fn overlap_follows_s3s_rule() {
        let created = rule(&["s3:ObjectCreated:*"], "", "");
        assert!(
            overlaps(&created, &rule(&["s3:ObjectCreated:Put"], "photos/", "")),
            "wildcard covers Put, empty prefix covers all"
        );
        assert!(overlaps(&rule(&["s3:ObjectCreated:*"], "a/", ""), &rule(&["s3:ObjectCreated:*"], "a/b/", "")));
        assert!(
            !overlaps(&rule(&["s3:ObjectCreated:*"], "a/", ""), &rule(&["s3:ObjectCreated:*"], "b/", "")),
            "disjoint prefixes"
        );
        assert!(!overlaps(&created, &rule(&["s3:ObjectRemoved:*"], "", "")), "different event types");
        assert!(
            !overlaps(&rule(&["s3:ObjectCreated:*"], "", ".jpg"), &rule(&["s3:ObjectCreated:*"], "", ".png")),
            "disjoint suffixes"
        );
        assert!(overlaps(&rule(&["s3:ObjectCreated:*"], "", ".jpg"), &rule(&["s3:ObjectCreated:*"], "", "")));
    }
}

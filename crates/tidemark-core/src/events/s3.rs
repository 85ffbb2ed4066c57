//! S3 event notifications, as an SQS message body: delivered directly by S3, inside an SNS
//! envelope, or as SNS raw delivery (then the body is S3's JSON itself).

use serde_json::Value;

use super::{BucketEvent, Decoded, EventKind, form_urldecode};
use crate::clock::parse_rfc3339_ms;

/// Decodes one SQS message body. Never panics.
pub fn decode(body: &[u8]) -> Decoded {
    let v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return Decoded::malformed(format!("not JSON: {e}")),
    };
    decode_value(&v, 0)
}

fn decode_value(v: &Value, depth: u8) -> Decoded {
    let Some(obj) = v.as_object() else {
        return Decoded::malformed("not a JSON object");
    };
    // The SNS envelope carries S3's JSON as a string in `Message`.
    if let Some(t) = obj.get("Type").and_then(Value::as_str) {
        return match t {
            "Notification" if depth == 0 => match obj.get("Message").and_then(Value::as_str) {
                Some(inner) => match serde_json::from_str::<Value>(inner) {
                    Ok(iv) => decode_value(&iv, depth + 1),
                    Err(e) => Decoded::malformed(format!("the SNS envelope's Message is not JSON: {e}")),
                },
                None => Decoded::malformed("an SNS notification without a Message string"),
            },
            "SubscriptionConfirmation" | "UnsubscribeConfirmation" => {
                Decoded::ignored(format!("an SNS {t} message, not an event"))
            }
            other => Decoded::ignored(format!("an SNS message of type {other:?}, not an event")),
        };
    }
    if obj.get("Event").and_then(Value::as_str) == Some("s3:TestEvent") {
        return Decoded::Test;
    }
    // An S3 event through EventBridge (a rule's SQS target): one event, not `Records`.
    if obj.get("detail-type").is_some() {
        return match eventbridge(v) {
            Ok(Some(e)) => Decoded::Events { events: vec![e] },
            Ok(None) => Decoded::ignored("an EventBridge event of another source than aws.s3"),
            Err(why) => Decoded::malformed(format!("EventBridge event: {why}")),
        };
    }
    let Some(records) = obj.get("Records") else {
        return Decoded::ignored("a JSON message without Records: not an S3 event notification");
    };
    let Some(records) = records.as_array() else {
        return Decoded::malformed("Records is not an array");
    };
    if records.is_empty() {
        return Decoded::ignored("an S3 notification with no records");
    }
    let mut events = Vec::with_capacity(records.len());
    for (i, r) in records.iter().enumerate() {
        match record(r) {
            Ok(Some(e)) => events.push(e),
            Ok(None) => {}
            Err(why) => return Decoded::malformed(format!("record {i}: {why}")),
        }
    }
    if events.is_empty() {
        return Decoded::ignored("no record is an S3 object event");
    }
    Decoded::Events { events }
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut cur = v;
    for p in path {
        cur = cur.get(*p)?;
    }
    cur.as_str()
}

/// What an S3 event name means for the namespace (SEMANTICS.md, "Event names"). Every kind is
/// only a hint to HEAD the key; the kind decides whether a subscription looks at all.
/// - `ObjectCreated:*` (put, post, copy, multipart) → created;
/// - `ObjectRemoved:*` and `LifecycleExpiration:*` (a lifecycle rule expired the object, or
///   put a delete marker over it in a versioned bucket) → removed;
/// - `ObjectRestore:Completed` and `ObjectRestore:Delete` (an archived object became readable,
///   or its restored copy expired), `LifecycleTransition` and `IntelligentTiering` (it moved to
///   another storage class or tier, perhaps an archive) → created: the bytes are the same, but
///   whether they can be read, and the storage class the entry shows, changed;
/// - anything else (`ObjectRestore:Post`, `ObjectTagging:*`, `ObjectAcl:Put`, `Replication:*`,
///   ...) → other: none of them changes the object or what the namespace shows of it.
pub fn kind_of(name: &str) -> EventKind {
    let name = name.strip_prefix("s3:").unwrap_or(name);
    if name.starts_with("ObjectCreated:")
        || matches!(
            name,
            "ObjectRestore:Completed" | "ObjectRestore:Delete" | "LifecycleTransition" | "IntelligentTiering"
        )
    {
        EventKind::Created
    } else if name.starts_with("ObjectRemoved:") || name.starts_with("LifecycleExpiration:") {
        EventKind::Removed
    } else {
        EventKind::Other(name.to_string())
    }
}

/// What an EventBridge `detail-type` of S3's means (the same meanings as [`kind_of`]'s names):
/// "Object Deleted" is a delete or a lifecycle expiration alike (its `reason` says which).
pub fn eventbridge_kind_of(detail_type: &str) -> EventKind {
    match detail_type {
        "Object Created"
        | "Object Restore Completed"
        | "Object Restore Expired"
        | "Object Storage Class Changed"
        | "Object Access Tier Changed" => EventKind::Created,
        "Object Deleted" => EventKind::Removed,
        other => EventKind::Other(other.to_string()),
    }
}

/// One S3 event as EventBridge delivers it; `Ok(None)` for another source's. The key in
/// `detail.object.key` is percent-encoded (RFC 3986: a space is `%20`, a `+` is itself), unlike
/// the form encoding of notifications; a key that does not decode so is taken as it is.
fn eventbridge(v: &Value) -> Result<Option<BucketEvent>, String> {
    if str_at(v, &["source"]) != Some("aws.s3") {
        return Ok(None);
    }
    let detail_type = str_at(v, &["detail-type"]).ok_or("detail-type is not a string")?;
    let bucket = str_at(v, &["detail", "bucket", "name"]).ok_or("no detail.bucket.name")?;
    let raw_key = str_at(v, &["detail", "object", "key"]).ok_or("no detail.object.key")?;
    let key = crate::events::percent_decode(raw_key).unwrap_or_else(|| raw_key.to_string());
    let object = v.get("detail").and_then(|d| d.get("object"));
    let text = |k: &str| object.and_then(|o| o.get(k)).and_then(Value::as_str);
    Ok(Some(BucketEvent {
        bucket: bucket.to_string(),
        key,
        kind: eventbridge_kind_of(detail_type),
        event_time_ms: str_at(v, &["time"]).and_then(parse_rfc3339_ms),
        etag: text("etag").or(text("eTag")).map(crate::remote::normalize_etag),
        size: object.and_then(|o| o.get("size")).and_then(Value::as_u64),
        sequencer: text("sequencer").map(str::to_string),
        generation: None,
        version_id: text("version-id").map(str::to_string),
        subtree: false,
    }))
}

/// One record; `Ok(None)` for a record of another service.
fn record(r: &Value) -> Result<Option<BucketEvent>, String> {
    if !r.is_object() {
        return Err("not a JSON object".into());
    }
    if let Some(src) = str_at(r, &["eventSource"])
        && src != "aws:s3"
    {
        return Ok(None);
    }
    let version = str_at(r, &["eventVersion"]).ok_or("no eventVersion")?;
    if version.split('.').next() != Some("2") {
        return Err(format!("eventVersion {version:?} is not 2.x, the only version Tidemark reads"));
    }
    let name = str_at(r, &["eventName"]).ok_or("no eventName")?;
    let kind = kind_of(name);
    let bucket = str_at(r, &["s3", "bucket", "name"]).ok_or("no s3.bucket.name")?;
    let raw_key = str_at(r, &["s3", "object", "key"]).ok_or("no s3.object.key")?;
    let key = form_urldecode(raw_key).ok_or_else(|| format!("s3.object.key {raw_key:?} is not form-encoded UTF-8"))?;
    let object = r.get("s3").and_then(|s| s.get("object"));
    let size = object.and_then(|o| o.get("size")).and_then(Value::as_u64);
    let etag = object.and_then(|o| o.get("eTag")).and_then(Value::as_str).map(crate::remote::normalize_etag);
    Ok(Some(BucketEvent {
        bucket: bucket.to_string(),
        key,
        kind,
        event_time_ms: str_at(r, &["eventTime"]).and_then(parse_rfc3339_ms),
        etag,
        size,
        sequencer: object.and_then(|o| o.get("sequencer")).and_then(Value::as_str).map(str::to_string),
        generation: None,
        version_id: object.and_then(|o| o.get("versionId")).and_then(Value::as_str).map(str::to_string),
        subtree: false,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PUT: &str = r#"{"Records":[{"eventVersion":"2.1","eventSource":"aws:s3","awsRegion":"us-east-1",
        "eventTime":"2026-12-02T10:00:00.000Z","eventName":"ObjectCreated:Put",
        "s3":{"s3SchemaVersion":"1.0","bucket":{"name":"b","arn":"arn:aws:s3:::b"},
        "object":{"key":"photos%2Fa+b%2B%C3%BC.jpg","size":12,"eTag":"0123abc","sequencer":"0055AED6DCD90281E5"}}},
        {"eventVersion":"2.1","eventSource":"aws:s3","eventTime":"2026-12-02T10:00:01.000Z",
        "eventName":"ObjectRemoved:Delete","s3":{"bucket":{"name":"b"},"object":{"key":"old.txt"}}}]}"#;

    #[test]
    fn decodes_records_and_form_decodes_keys() {
        let Decoded::Events { events } = decode(PUT.as_bytes()) else { panic!("{:?}", decode(PUT.as_bytes())) };
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].key, "photos/a b+ü.jpg");
        assert_eq!(events[0].kind, EventKind::Created);
        assert_eq!(events[0].size, Some(12));
        assert_eq!(events[0].etag.as_deref(), Some("0123abc"));
        assert_eq!(events[0].sequencer.as_deref(), Some("0055AED6DCD90281E5"));
        assert_eq!(events[0].event_time_ms, Some(1_796_205_600_000));
        assert_eq!((events[1].key.as_str(), &events[1].kind), ("old.txt", &EventKind::Removed));
    }

    #[test]
    fn sns_envelope_raw_delivery_and_test_events() {
        let envelope =
            serde_json::json!({"Type": "Notification", "MessageId": "m", "TopicArn": "arn:t", "Message": PUT});
        assert!(matches!(decode(envelope.to_string().as_bytes()), Decoded::Events { events } if events.len() == 2));
        let test = r#"{"Service":"Amazon S3","Event":"s3:TestEvent","Time":"2026-12-02T10:00:00Z","Bucket":"b"}"#;
        assert_eq!(decode(test.as_bytes()), Decoded::Test);
        let wrapped_test = serde_json::json!({"Type": "Notification", "Message": test});
        assert_eq!(decode(wrapped_test.to_string().as_bytes()), Decoded::Test);
        let confirm = serde_json::json!({"Type": "SubscriptionConfirmation", "Message": "confirm"});
        assert!(matches!(decode(confirm.to_string().as_bytes()), Decoded::Ignored { .. }));
    }

    #[test]
    fn lifecycle_expirations_are_removals() {
        for name in [
            "LifecycleExpiration:Delete",
            "LifecycleExpiration:DeleteMarkerCreated",
            "ObjectRemoved:DeleteMarkerCreated",
        ] {
            let body = PUT.replace("ObjectCreated:Put", name);
            let Decoded::Events { events } = decode(body.as_bytes()) else { panic!() };
            assert_eq!(events[0].kind, EventKind::Removed, "{name}");
        }
        for name in ["ObjectCreated:Copy", "ObjectCreated:CompleteMultipartUpload", "ObjectCreated:Post"] {
            assert_eq!(kind_of(name), EventKind::Created, "{name}");
        }
        for name in
            ["ObjectTagging:Put", "ObjectAcl:Put", "Replication:OperationFailedReplication", "ObjectRestore:Post"]
        {
            assert_eq!(kind_of(name), EventKind::Other(name.into()), "{name}");
        }
    }

    #[test]
    fn unknown_event_names_are_kept_as_other() {
        let body = PUT.replace("ObjectCreated:Put", "ObjectRestore:Post");
        let Decoded::Events { events } = decode(body.as_bytes()) else { panic!() };
        assert_eq!(events[0].kind, EventKind::Other("ObjectRestore:Post".into()));
    }

    /// As S3 sends it through EventBridge (the documented example, with a key needing encoding).
    #[test]
    fn eventbridge_events_decode_with_percent_encoded_keys() {
        let created = r#"{"version":"0","id":"17793124-05d4-b198-2fde-7ededc63b103","detail-type":"Object Created",
            "source":"aws.s3","account":"111122223333","time":"2021-11-12T00:00:00Z","region":"ca-central-1",
            "resources":["arn:aws:s3:::b"],"detail":{"version":"0","bucket":{"name":"b"},
            "object":{"key":"photos/a%20b+c%25%C3%BC.jpg","size":5,"etag":"b1946ac92492d2347c6235b4d2611184",
            "version-id":"IYV3p45BT0ac8hjHg1houSdS1a.Mro8e","sequencer":"617f08299329d189"},
            "request-id":"N4N7GDK58NMKJ12R","requester":"123456789012","source-ip-address":"1.2.3.4","reason":"PutObject"}}"#;
        let Decoded::Events { events } = decode(created.as_bytes()) else { panic!("{:?}", decode(created.as_bytes())) };
        assert_eq!(events[0].key, "photos/a b+c%ü.jpg");
        assert_eq!(events[0].kind, EventKind::Created);
        assert_eq!(events[0].bucket, "b");
        assert_eq!(events[0].size, Some(5));
        assert_eq!(events[0].etag.as_deref(), Some("b1946ac92492d2347c6235b4d2611184"));
        let expired = created.replace("Object Created", "Object Deleted").replace("PutObject", "Lifecycle Expiration");
        let Decoded::Events { events } = decode(expired.as_bytes()) else { panic!() };
        assert_eq!(events[0].kind, EventKind::Removed, "an expiration leaves as a delete");
        // moto sends the key as it is: one that does not percent-decode is kept.
        let raw = created.replace("photos/a%20b+c%25%C3%BC.jpg", "100% sure.txt");
        let Decoded::Events { events } = decode(raw.as_bytes()) else { panic!() };
        assert_eq!(events[0].key, "100% sure.txt");
        let other = created.replace("aws.s3", "aws.ec2");
        assert!(matches!(decode(other.as_bytes()), Decoded::Ignored { .. }));
        let broken = created.replace(r#""bucket":{"name":"b"},"#, "");
        assert!(
            matches!(decode(broken.as_bytes()), Decoded::Malformed { reason } if reason.contains("detail.bucket.name"))
        );
        assert_eq!(eventbridge_kind_of("Object Tags Added"), EventKind::Other("Object Tags Added".into()));
    }

    #[test]
    fn restores_and_transitions_change_what_the_entry_shows() {
        for name in ["ObjectRestore:Completed", "ObjectRestore:Delete", "LifecycleTransition", "IntelligentTiering"] {
            assert_eq!(kind_of(name), EventKind::Created, "{name}");
        }
    }

    #[test]
    fn malformed_messages_say_why() {
        let cases = [
            ("not json", "not JSON"),
            ("[1,2]", "not a JSON object"),
            (r#"{"Records": 5}"#, "not an array"),
            (r#"{"Records": [{"eventVersion": "1.0", "eventName": "ObjectCreated:Put"}]}"#, "not 2.x"),
            (
                r#"{"Records": [{"eventVersion": "2.1", "eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": "b"}}}]}"#,
                "s3.object.key",
            ),
            (
                r#"{"Records": [{"eventVersion": "2.1", "eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": "b"}, "object": {"key": "%ZZ"}}}]}"#,
                "form-encoded",
            ),
            (r#"{"Type": "Notification", "Message": "{broken"}"#, "Message is not JSON"),
            (r#"{"Records": ["x"]}"#, "record 0"),
        ];
        for (body, says) in cases {
            match decode(body.as_bytes()) {
                Decoded::Malformed { reason } => assert!(reason.contains(says), "{body}: {reason}"),
                other => panic!("{body}: {other:?}"),
            }
        }
        assert!(matches!(decode(br#"{"hello": 1}"#), Decoded::Ignored { .. }));
        assert!(matches!(decode(br#"{"Records": []}"#), Decoded::Ignored { .. }));
    }
}

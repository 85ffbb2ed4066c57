//! Google Cloud Storage notifications through Pub/Sub: the event is in the message's attributes
//! (`eventType`, `bucketId`, `objectId`, `objectGeneration`, ...); with payload format
//! `JSON_API_V1` the data is the object's resource, with `NONE` it is empty.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{BucketEvent, Decoded, EventKind};
use crate::clock::parse_rfc3339_ms;

/// Decodes a Pub/Sub message: its attributes and its (base64-decoded) data. Never panics.
pub fn decode(attributes: &BTreeMap<String, String>, data: &[u8]) -> Decoded {
    let Some(event_type) = attributes.get("eventType") else {
        return Decoded::ignored("a Pub/Sub message without an eventType attribute: not a GCS notification");
    };
    // OBJECT_ARCHIVE: in a bucket with object versioning, the live version became noncurrent —
    // deleted (or replaced: the OBJECT_FINALIZE of the new one follows) as far as the namespace
    // is concerned. OBJECT_METADATA_UPDATE changes the object's metadata (and its ETag), so it
    // is a change to refresh, like a finalize. The HEAD decides either way.
    let kind = match event_type.as_str() {
        "OBJECT_FINALIZE" | "OBJECT_METADATA_UPDATE" => EventKind::Created,
        "OBJECT_DELETE" | "OBJECT_ARCHIVE" => EventKind::Removed,
        other => EventKind::Other(other.to_string()),
    };
    let Some(bucket) = attributes.get("bucketId").filter(|b| !b.is_empty()) else {
        return Decoded::malformed("a GCS notification without bucketId");
    };
    let Some(key) = attributes.get("objectId").filter(|k| !k.is_empty()) else {
        return Decoded::malformed("a GCS notification without objectId");
    };
    let resource: Option<Value> = match attributes.get("payloadFormat").map(String::as_str) {
        Some("JSON_API_V1") if !data.is_empty() => match serde_json::from_slice(data) {
            Ok(v) => Some(v),
            Err(e) => return Decoded::malformed(format!("payloadFormat JSON_API_V1 but the data is not JSON: {e}")),
        },
        _ => None,
    };
    let field = |name: &str| resource.as_ref().and_then(|r| r.get(name)).and_then(Value::as_str);
    Decoded::Events {
        events: vec![BucketEvent {
            bucket: bucket.clone(),
            key: key.clone(),
            kind,
            event_time_ms: attributes
                .get("eventTime")
                .and_then(|t| parse_rfc3339_ms(t))
                .or_else(|| field("updated").and_then(parse_rfc3339_ms)),
            etag: field("etag").map(str::to_string),
            // The JSON API sends sizes as strings.
            size: field("size").and_then(|s| s.parse().ok()),
            sequencer: None,
            generation: attributes.get("objectGeneration").cloned(),
            version_id: None,
            subtree: false,
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn finalize_delete_and_metadata_update() {
        let a = attrs(&[
            ("eventType", "OBJECT_FINALIZE"),
            ("bucketId", "b"),
            ("objectId", "a b/ü.txt"),
            ("objectGeneration", "1700000000000001"),
            ("eventTime", "2026-12-02T10:00:00.000Z"),
            ("payloadFormat", "JSON_API_V1"),
        ]);
        let data =
            br#"{"name":"a b/\u00fc.txt","bucket":"b","size":"42","etag":"CJ+Xi","generation":"1700000000000001"}"#;
        let Decoded::Events { events } = decode(&a, data) else { panic!() };
        let e = &events[0];
        assert_eq!(
            (e.key.as_str(), &e.kind, e.size, e.etag.as_deref()),
            ("a b/ü.txt", &EventKind::Created, Some(42), Some("CJ+Xi"))
        );
        assert_eq!(e.generation.as_deref(), Some("1700000000000001"));
        assert_eq!(e.event_time_ms, Some(1_796_205_600_000));

        let d =
            attrs(&[("eventType", "OBJECT_DELETE"), ("bucketId", "b"), ("objectId", "k"), ("payloadFormat", "NONE")]);
        let Decoded::Events { events } = decode(&d, b"") else { panic!() };
        assert_eq!(events[0].kind, EventKind::Removed);
        let m = attrs(&[("eventType", "OBJECT_METADATA_UPDATE"), ("bucketId", "b"), ("objectId", "k")]);
        let Decoded::Events { events } = decode(&m, b"") else { panic!() };
        assert_eq!(events[0].kind, EventKind::Created, "a metadata update refreshes the entry");
        let a = attrs(&[("eventType", "OBJECT_ARCHIVE"), ("bucketId", "b"), ("objectId", "k")]);
        let Decoded::Events { events } = decode(&a, b"") else { panic!() };
        assert_eq!(events[0].kind, EventKind::Removed, "in a versioned bucket, a delete is an archive");
    }

    #[test]
    fn incomplete_notifications() {
        assert!(matches!(decode(&attrs(&[]), b"hello"), Decoded::Ignored { .. }));
        assert!(
            matches!(decode(&attrs(&[("eventType", "OBJECT_FINALIZE"), ("objectId", "k")]), b""), Decoded::Malformed { reason } if reason.contains("bucketId"))
        );
        assert!(
            matches!(decode(&attrs(&[("eventType", "OBJECT_FINALIZE"), ("bucketId", "b")]), b""), Decoded::Malformed { reason } if reason.contains("objectId"))
        );
        let bad_json = attrs(&[
            ("eventType", "OBJECT_FINALIZE"),
            ("bucketId", "b"),
            ("objectId", "k"),
            ("payloadFormat", "JSON_API_V1"),
        ]);
        assert!(matches!(decode(&bad_json, b"{nope"), Decoded::Malformed { .. }));
    }
}

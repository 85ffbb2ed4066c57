//! Azure Blob Storage events through Event Grid into a Storage Queue. The queue message text is
//! the Event Grid event (Event Grid schema or CloudEvents 1.0 schema, one event or an array),
//! plain or base64-encoded.

use base64::Engine;
use serde_json::Value;

use super::{BucketEvent, Decoded, EventKind, percent_decode};
use crate::clock::parse_rfc3339_ms;

/// Decodes one queue message text. Never panics.
pub fn decode(text: &[u8]) -> Decoded {
    let trimmed = trim(text);
    let json: Value = match serde_json::from_slice(trimmed) {
        Ok(v) => v,
        Err(_) => {
            // Event Grid writes queue messages base64-encoded.
            let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(trimmed) else {
                return Decoded::malformed("neither JSON nor base64-encoded JSON");
            };
            match serde_json::from_slice(&decoded) {
                Ok(v) => v,
                Err(e) => return Decoded::malformed(format!("base64-decoded, but not JSON: {e}")),
            }
        }
    };
    let items: Vec<&Value> = match &json {
        Value::Array(a) => a.iter().collect(),
        v @ Value::Object(_) => vec![v],
        _ => return Decoded::malformed("not a JSON object or array"),
    };
    let mut events = Vec::new();
    let mut test = false;
    for (i, item) in items.iter().enumerate() {
        match event(item) {
            Ok(Some(e)) => events.extend(e),
            Ok(None) => test = true,
            Err(why) => return Decoded::malformed(format!("event {i}: {why}")),
        }
    }
    if events.is_empty() {
        return if test { Decoded::Test } else { Decoded::ignored("no events in the message") };
    }
    Decoded::Events { events }
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b.iter().position(|c| !c.is_ascii_whitespace()).unwrap_or(b.len());
    let end = b.iter().rposition(|c| !c.is_ascii_whitespace()).map_or(start, |e| e + 1);
    &b[start..end.max(start)]
}

/// One event's changes; `Ok(None)` for Event Grid's subscription validation (a test message).
///
/// What each event type means (SEMANTICS.md, "Event names"): `BlobCreated` and `BlobDeleted`
/// name a blob; `BlobRenamed` (hierarchical namespace) is the removal of its source and the
/// creation of its destination; `DirectoryCreated`, `DirectoryDeleted` and `DirectoryRenamed`
/// name a directory — one event for everything below it — so they are subtrees to reconcile
/// (a rename: the source's and the destination's); `BlobTierChanged` is created (the blob's
/// bytes are the same, but it may have moved into or out of the Archive tier, which decides
/// whether it can be read); anything else (`AsyncOperationInitiated`, ...) is other.
fn event(v: &Value) -> Result<Option<Vec<BucketEvent>>, String> {
    let s = |k: &str| v.get(k).and_then(Value::as_str);
    // Event Grid schema: eventType/eventTime; CloudEvents: type/time.
    let event_type = s("eventType").or_else(|| s("type")).ok_or("no eventType (or CloudEvents type)")?;
    if event_type == "Microsoft.EventGrid.SubscriptionValidationEvent" {
        return Ok(None);
    }
    let data = v.get("data").filter(|d| d.is_object()).ok_or("no data object")?;
    let d = |k: &str| data.get(k).and_then(Value::as_str);
    let named = || -> Result<(String, String), String> {
        match s("subject").and_then(from_subject) {
            Some(ck) => Ok(ck),
            None => d("url").and_then(from_url).ok_or_else(|| "neither subject nor data.url names a blob".to_string()),
        }
    };
    let url = |field: &str| -> Result<(String, String), String> {
        d(field).and_then(from_url).ok_or_else(|| format!("data.{field} does not name a blob"))
    };
    let base = |(bucket, key): (String, String), kind: EventKind, subtree: bool| BucketEvent {
        bucket,
        key,
        kind,
        event_time_ms: s("eventTime").or_else(|| s("time")).and_then(parse_rfc3339_ms),
        etag: d("eTag").map(crate::remote::normalize_etag),
        size: data.get("contentLength").and_then(Value::as_u64),
        sequencer: d("sequencer").map(str::to_string),
        generation: None,
        version_id: d("versionId").map(str::to_string),
        subtree,
    };
    let events = match event_type {
        "Microsoft.Storage.BlobCreated" | "Microsoft.Storage.BlobTierChanged" => {
            vec![base(named()?, EventKind::Created, false)]
        }
        "Microsoft.Storage.BlobDeleted" => vec![base(named()?, EventKind::Removed, false)],
        "Microsoft.Storage.DirectoryCreated" => vec![base(named()?, EventKind::Created, true)],
        "Microsoft.Storage.DirectoryDeleted" => vec![base(named()?, EventKind::Removed, true)],
        "Microsoft.Storage.BlobRenamed" | "Microsoft.Storage.DirectoryRenamed" => {
            let subtree = event_type == "Microsoft.Storage.DirectoryRenamed";
            let dest = match d("destinationUrl") {
                Some(_) => url("destinationUrl")?,
                None => named()?,
            };
            vec![base(url("sourceUrl")?, EventKind::Removed, subtree), base(dest, EventKind::Created, subtree)]
        }
        other => vec![base(named()?, EventKind::Other(other.to_string()), false)],
    };
    Ok(Some(events))
}

/// `/blobServices/default/containers/{container}/blobs/{blob}`.
fn from_subject(subject: &str) -> Option<(String, String)> {
    let rest = subject.strip_prefix("/blobServices/default/containers/")?;
    let (container, blob) = rest.split_once("/blobs/")?;
    (!container.is_empty() && !blob.is_empty()).then(|| (container.to_string(), blob.to_string()))
}

/// `https://account.blob.core.windows.net/container/blob` or, for emulators,
/// `http://127.0.0.1:10000/account/container/blob`.
fn from_url(url: &str) -> Option<(String, String)> {
    let after_scheme = url.split_once("://")?.1;
    let (host, path) = after_scheme.split_once('/')?;
    let path = path.split(['?', '#']).next()?;
    let path_style = host.starts_with("127.") || host.starts_with("localhost") || host.starts_with('[');
    let path = if path_style { path.split_once('/')?.1 } else { path };
    let (container, blob) = path.split_once('/')?;
    let blob = percent_decode(blob)?;
    (!container.is_empty() && !blob.is_empty()).then(|| (container.to_string(), blob))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREATED: &str = r#"{"topic":"/subscriptions/x/resourceGroups/g/providers/Microsoft.Storage/storageAccounts/acct",
        "subject":"/blobServices/default/containers/photos/blobs/a b/ü.jpg","eventType":"Microsoft.Storage.BlobCreated",
        "id":"1","eventTime":"2026-12-02T10:00:00.000Z","dataVersion":"","metadataVersion":"1",
        "data":{"api":"PutBlob","eTag":"\"0x8DC\"","contentLength":7,"sequencer":"000000","url":"https://acct.blob.core.windows.net/photos/a%20b/%C3%BC.jpg"}}"#;

    #[test]
    fn event_grid_and_cloud_events_plain_and_base64() {
        let Decoded::Events { events } = decode(CREATED.as_bytes()) else { panic!("{:?}", decode(CREATED.as_bytes())) };
        let e = &events[0];
        assert_eq!((e.bucket.as_str(), e.key.as_str(), &e.kind), ("photos", "a b/ü.jpg", &EventKind::Created));
        assert_eq!((e.etag.as_deref(), e.size, e.event_time_ms), (Some("0x8DC"), Some(7), Some(1_796_205_600_000)));
        let b64 = base64::engine::general_purpose::STANDARD.encode(CREATED);
        assert_eq!(decode(b64.as_bytes()), decode(CREATED.as_bytes()));
        let cloud = r#"[{"specversion":"1.0","type":"Microsoft.Storage.BlobDeleted","source":"/x","id":"2","time":"2026-12-02T10:00:00Z",
            "data":{"api":"DeleteBlob","url":"http://127.0.0.1:10000/devstoreaccount1/photos/dir/x%2By.txt"}}]"#;
        let Decoded::Events { events } = decode(cloud.as_bytes()) else { panic!() };
        assert_eq!(
            (events[0].bucket.as_str(), events[0].key.as_str(), &events[0].kind),
            ("photos", "dir/x+y.txt", &EventKind::Removed)
        );
        let validation =
            r#"{"eventType":"Microsoft.EventGrid.SubscriptionValidationEvent","data":{"validationCode":"x"}}"#;
        assert_eq!(decode(validation.as_bytes()), Decoded::Test);
    }

    #[test]
    fn malformed_messages_say_why() {
        for (text, says) in [
            ("%%%", "neither JSON"),
            ("aGVsbG8=", "not JSON"),
            ("5", "not a JSON object"),
            (r#"{"data":{}}"#, "eventType"),
            (r#"{"eventType":"Microsoft.Storage.BlobCreated"}"#, "data"),
            (r#"{"eventType":"Microsoft.Storage.BlobCreated","data":{"url":"nonsense"}}"#, "names a blob"),
        ] {
            match decode(text.as_bytes()) {
                Decoded::Malformed { reason } => assert!(reason.contains(says), "{text}: {reason}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    /// The shapes Azure documents for a storage account with a hierarchical namespace (Data Lake
    /// Storage Gen2): a rename is a removal and a creation; directory events name subtrees.
    #[test]
    fn hierarchical_namespace_renames_and_directories() {
        let renamed = r#"{"topic":"/subscriptions/x/resourceGroups/g/providers/Microsoft.Storage/storageAccounts/acct",
            "subject":"/blobServices/default/containers/c/blobs/new dir/new-file.txt","eventType":"Microsoft.Storage.BlobRenamed",
            "eventTime":"2026-12-02T10:00:00.000Z","id":"1","dataVersion":"","metadataVersion":"1",
            "data":{"api":"RenameFile","requestId":"r","destinationUrl":"https://acct.dfs.core.windows.net/c/new%20dir/new-file.txt",
            "sourceUrl":"https://acct.dfs.core.windows.net/c/old-file.txt","sequencer":"0000"}}"#;
        let Decoded::Events { events } = decode(renamed.as_bytes()) else { panic!() };
        let got: Vec<_> =
            events.iter().map(|e| (e.bucket.as_str(), e.key.as_str(), e.kind.clone(), e.subtree)).collect();
        assert_eq!(
            got,
            [
                ("c", "old-file.txt", EventKind::Removed, false),
                ("c", "new dir/new-file.txt", EventKind::Created, false)
            ]
        );
        let dir = |t: &str, data: &str| {
            format!(
                r#"{{"subject":"/blobServices/default/containers/c/blobs/logs/2026","eventType":"Microsoft.Storage.{t}","eventTime":"2026-12-02T10:00:00Z","id":"2","data":{data}}}"#
            )
        };
        for (t, kind) in [("DirectoryDeleted", EventKind::Removed), ("DirectoryCreated", EventKind::Created)] {
            let text =
                dir(t, r#"{"api":"x","url":"https://acct.dfs.core.windows.net/c/logs/2026","recursive":"true"}"#);
            let Decoded::Events { events } = decode(text.as_bytes()) else { panic!("{t}") };
            assert_eq!((events[0].key.as_str(), &events[0].kind, events[0].subtree), ("logs/2026", &kind, true), "{t}");
        }
        let moved = dir(
            "DirectoryRenamed",
            r#"{"api":"RenameDirectory","sourceUrl":"https://acct.dfs.core.windows.net/c/logs/2025","destinationUrl":"https://acct.dfs.core.windows.net/c/logs/2026"}"#,
        );
        let Decoded::Events { events } = decode(moved.as_bytes()) else { panic!() };
        let got: Vec<_> = events.iter().map(|e| (e.key.as_str(), e.kind.clone(), e.subtree)).collect();
        assert_eq!(got, [("logs/2025", EventKind::Removed, true), ("logs/2026", EventKind::Created, true)]);
        let bad = dir(
            "DirectoryRenamed",
            r#"{"api":"RenameDirectory","destinationUrl":"https://acct.dfs.core.windows.net/c/x"}"#,
        );
        assert!(matches!(decode(bad.as_bytes()), Decoded::Malformed { reason } if reason.contains("sourceUrl")));
        let tier =
            dir("BlobTierChanged", r#"{"api":"SetBlobTier","url":"https://acct.blob.core.windows.net/c/logs/2026"}"#);
        let Decoded::Events { events } = decode(tier.as_bytes()) else { panic!() };
        assert_eq!(events[0].kind, EventKind::Created, "the tier decides whether it reads");
    }
}

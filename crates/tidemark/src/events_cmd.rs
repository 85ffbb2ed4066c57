//! `tidemark events decode`: what a queue message decodes to, for operators.

use std::collections::BTreeMap;
use std::io::Read;

use base64::Engine;
use clap::{Args, Subcommand, ValueEnum};
use serde_json::{Value, json};
use tidemark_core::events::{BucketEvent, Decoded, EventKind, azure, gcs, s3};
use tidemark_core::format_rfc3339_ms;

#[derive(Subcommand)]
pub enum EventsCmd {
    /// Print what a queue message decodes to, as JSON. Exit status 0 for events, test and ignored
    /// messages, 2 for a malformed one, 1 if the input cannot be read.
    Decode(DecodeArgs),
}

#[derive(Clone, Copy, ValueEnum)]
enum ProviderArg {
    S3,
    Gcs,
    Azure,
}

#[derive(Args)]
pub struct DecodeArgs {
    /// s3: the SQS message body as delivered (direct, SNS envelope or raw);
    /// gcs: a Pub/Sub message in its REST form, {"data": "<base64>", "attributes": {...}};
    /// azure: the Storage Queue message text (plain or base64).
    #[arg(long, value_enum, default_value = "s3")]
    provider: ProviderArg,
    /// The file holding the message; `-` or nothing for standard input.
    file: Option<std::path::PathBuf>,
}

fn event_json(e: &BucketEvent) -> Value {
    let kind = match &e.kind {
        EventKind::Created => "created".to_string(),
        EventKind::Removed => "removed".to_string(),
        EventKind::Other(name) => name.clone(),
    };
    let mut v = json!({
        "bucket": e.bucket,
        "key": e.key,
        "kind": kind,
        "event_time": e.event_time_ms.map(format_rfc3339_ms),
    });
    let obj = v.as_object_mut().expect("a JSON object literal");
    for (name, value) in
        [("etag", &e.etag), ("sequencer", &e.sequencer), ("generation", &e.generation), ("version_id", &e.version_id)]
    {
        if let Some(x) = value {
            obj.insert(name.into(), json!(x));
        }
    }
    if let Some(size) = e.size {
        obj.insert("size".into(), json!(size));
    }
    v
}

fn decode_gcs_rest(input: &[u8]) -> Decoded {
    let Ok(v) = serde_json::from_slice::<Value>(input) else {
        return Decoded::Malformed {
            reason: "not JSON: expected a Pub/Sub message {\"data\": ..., \"attributes\": {...}}".into(),
        };
    };
    // Accept a received message (`{"ackId": ..., "message": {...}}`) as well as a bare message.
    let msg = v.get("message").unwrap_or(&v);
    let attributes: BTreeMap<String, String> = msg
        .get("attributes")
        .and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect())
        .unwrap_or_default();
    let data = match msg.get("data").and_then(Value::as_str) {
        None => Vec::new(),
        Some(d) => match base64::engine::general_purpose::STANDARD.decode(d) {
            Ok(b) => b,
            Err(e) => return Decoded::Malformed { reason: format!("data is not base64: {e}") },
        },
    };
    gcs::decode(&attributes, &data)
}

pub fn run(cmd: EventsCmd) -> i32 {
    let EventsCmd::Decode(a) = cmd;
    let mut input = Vec::new();
    let read = match a.file.as_deref().filter(|p| p.as_os_str() != "-") {
        Some(p) => std::fs::File::open(p)
            .and_then(|mut f| f.read_to_end(&mut input))
            .map_err(|e| format!("{}: {e}", p.display())),
        None => std::io::stdin().read_to_end(&mut input).map_err(|e| format!("reading standard input: {e}")),
    };
    if let Err(e) = read {
        eprintln!("error: {e}");
        return 1;
    }
    let decoded = match a.provider {
        ProviderArg::S3 => s3::decode(&input),
        ProviderArg::Gcs => decode_gcs_rest(&input),
        ProviderArg::Azure => azure::decode(&input),
    };
    let (out, code) = match &decoded {
        Decoded::Events { events } => {
            (json!({"kind": "events", "events": events.iter().map(event_json).collect::<Vec<_>>()}), 0)
        }
        Decoded::Test => (json!({"kind": "test"}), 0),
        Decoded::Ignored { reason } => (json!({"kind": "ignored", "reason": reason}), 0),
        Decoded::Malformed { reason } => (json!({"kind": "malformed", "reason": reason}), 2),
    };
    println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    code
}

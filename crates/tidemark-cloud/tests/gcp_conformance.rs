//! Cloud Storage (fake-gcs-server) through the RemoteStorage suite; a Pub/Sub subscription (the
//! emulator) through the EventSource suite; and real GCS notifications: fake-gcs-server publishes
//! object events to the emulator, and the GCS decoder reads them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use base64::Engine;
use bytes::Bytes;
use tidemark_cloud::conformance::{Capabilities, Harness};
use tidemark_cloud::event_conformance::{EventHarness, Producer};
use tidemark_cloud::gcp::{GcsStorage, PubSubSource};
use tidemark_core::RemoteStorage;
use tidemark_core::events::{Decoded, EventKind, EventSource, gcs};
use tidemark_core::remote::{RemoteConf, StorageKind};
use tidemark_testkit::emulators::http_request;
use tidemark_testkit::{FakeGcs, PubSub, unique_name};

fn conf(gcs_endpoint: &str, pubsub_host: Option<&str>) -> RemoteConf {
    let mut settings = vec![
        ("endpoint".to_string(), gcs_endpoint.to_string()),
        ("project".to_string(), FakeGcs::PROJECT.to_string()),
        ("emulator".to_string(), "true".to_string()),
    ];
    if let Some(h) = pubsub_host {
        settings.push(("pubsub_endpoint".into(), format!("http://{h}")));
    }
    RemoteConf { name: "fakegcs".into(), kind: StorageKind::Gcs, settings: settings.into_iter().collect() }
}

async fn gcs_storage() -> Harness {
    let fake = FakeGcs::get(None);
    let storage = GcsStorage::open(&conf(&fake.endpoint, None), &unique_name("g")).unwrap();
    storage.create_bucket().await.unwrap();
    Harness {
        storage: Arc::new(storage),
        caps: Capabilities {
            xml_unsafe_keys: true,
            headers: true,
            arbitrary_keys: true,
            user_metadata: true,
            lists_directories: false,
            directory_markers: true,
        },
        guard: Box::new(fake),
    }
}

mod cloud_storage {
    tidemark_cloud::remote_storage_conformance!(super::gcs_storage());
}

/// Creates a subscription on `topic` (creating the topic when asked) on the emulator.
fn subscription(ps: &PubSub, topic: &str, create_topic: bool) -> String {
    if create_topic {
        assert!(http_request(&ps.host, "PUT", &format!("/v1/{topic}"), "").is_some_and(|s| s < 300));
    }
    let name = format!("projects/{}/subscriptions/{}", FakeGcs::PROJECT, unique_name("s"));
    let body = serde_json::json!({"topic": topic, "ackDeadlineSeconds": 10}).to_string();
    let status = http_request(&ps.host, "PUT", &format!("/v1/{name}"), &body);
    assert!(status.is_some_and(|s| s < 300), "creating {name}: {status:?}");
    name
}

struct PubSubProducer {
    host: String,
    topic: String,
}

#[async_trait]
impl Producer for PubSubProducer {
    async fn send(&self, body: &str) {
        let data = base64::engine::general_purpose::STANDARD.encode(body);
        let req = serde_json::json!({"messages": [{"data": data}]}).to_string();
        let (host, path) = (self.host.clone(), format!("/v1/{}:publish", self.topic));
        let status = tokio::task::spawn_blocking(move || http_request(&host, "POST", &path, &req)).await.unwrap();
        assert!(status.is_some_and(|s| s < 300), "publish: {status:?}");
    }
}

async fn pubsub() -> Option<EventHarness> {
    let ps = PubSub::get()?;
    let topic = format!("projects/{}/topics/{}", FakeGcs::PROJECT, unique_name("t"));
    let sub = subscription(&ps, &topic, true);
    let source = PubSubSource::open(&conf("http://unused", Some(&ps.host)), &sub).unwrap();
    let producer = PubSubProducer { host: ps.host.clone(), topic };
    Some(EventHarness {
        source: Arc::new(source),
        producer: Arc::new(producer),
        visibility: Duration::from_secs(10),
        guard: Box::new(ps),
    })
}

mod pubsub_subscription {
    macro_rules! each {
        ($($name:ident),*) => {$(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                // Skips (loudly, in PubSub::get) only where the machine has no emulator.
                if let Some(h) = super::pubsub().await {
                    tidemark_cloud::event_conformance::$name(&h).await;
                }
            }
        )*};
    }
    each!(
        receive_then_ack_removes,
        unacked_deliveries_come_back_with_a_higher_count,
        extend_prevents_redelivery,
        release_makes_it_visible_again,
        batch_limits_are_honoured,
        acking_twice_or_late_is_not_an_error
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcs_notifications_finalize_metadata_update_and_delete() {
    let Some(ps) = PubSub::get() else { return };
    let fake = FakeGcs::get(Some(&ps));
    let topic = fake.topic.clone().expect("fake-gcs-server started with a topic");
    let sub = subscription(&ps, &topic, false);
    let c = conf(&fake.endpoint, Some(&ps.host));
    let bucket = unique_name("ev");
    let storage = GcsStorage::open(&c, &bucket).unwrap();
    storage.create_bucket().await.unwrap();
    let source = PubSubSource::open(&c, &sub).unwrap();

    storage.put("dir/a b+ü.txt", Bytes::from_static(b"one"), Default::default()).await.unwrap();
    storage.put("dir/a b+ü.txt", Bytes::from_static(b"two!"), Default::default()).await.unwrap();
    // A metadata-only change (PATCH), then the delete.
    let object_url = format!("{}/storage/v1/b/{bucket}/o/dir%2Fa%20b%2B%C3%BC.txt", fake.endpoint);
    let patched = reqwest::Client::new()
        .patch(&object_url)
        .json(&serde_json::json!({"metadata": {"k": "v"}}))
        .send()
        .await
        .unwrap();
    assert!(patched.status().is_success(), "{}", patched.status());
    storage.delete("dir/a b+ü.txt").await.unwrap();

    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.len() < 4 && Instant::now() < deadline {
        let batch = source.receive(10, Duration::from_secs(2)).await.unwrap();
        for d in &batch {
            match gcs::decode(&d.attributes, &d.body) {
                Decoded::Events { events } => {
                    let name = d.attributes.get("eventType").cloned().unwrap_or_default();
                    seen.extend(
                        events.into_iter().filter(|e| e.bucket == bucket).map(|e| (e.key, e.kind, name.clone())),
                    );
                }
                other => panic!("a real notification decodes as events: {other:?} ({:?})", d.attributes),
            }
        }
        source.ack(&batch.iter().map(|d| d.ack_id.clone()).collect::<Vec<_>>()).await.unwrap();
    }
    let key = "dir/a b+ü.txt".to_string();
    let has = |kind: EventKind, name: &str| seen.contains(&(key.clone(), kind, name.to_string()));
    assert!(has(EventKind::Created, "OBJECT_FINALIZE"), "{seen:?}");
    assert!(has(EventKind::Removed, "OBJECT_DELETE"), "{seen:?}");
    // A metadata update changes the object's ETag: a change to refresh, like a write.
    assert!(has(EventKind::Created, "OBJECT_METADATA_UPDATE"), "{seen:?}");
    let finalized = seen.iter().filter(|(_, _, n)| n == "OBJECT_FINALIZE").count();
    assert!(finalized >= 2, "both writes finalize: {seen:?}");
}

/// A service account key is exchanged for a token (a signed JWT, RS256) at its token endpoint,
/// once, and the token is reused. The endpoint here is a stand-in that checks the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_account_key_is_exchanged_for_a_cached_token() {
    use std::io::{Read, Write};
    let fake = FakeGcs::get(None);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let token_uri = format!("http://{}/token", listener.local_addr().unwrap());
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen_calls = calls.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            let mut buf = vec![0u8; 16 * 1024];
            let n = s.read(&mut buf).unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]).into_owned();
            let body = req.split("\r\n\r\n").nth(1).unwrap_or("");
            let ok = body.contains("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer")
                && body.split("assertion=").nth(1).is_some_and(|jwt| {
                    let parts: Vec<&str> = jwt.split('.').collect();
                    let decode = |p: &str| {
                        base64::engine::general_purpose::URL_SAFE_NO_PAD
                            .decode(p)
                            .ok()
                            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                    };
                    let (header, claims) =
                        (parts.first().and_then(|p| decode(p)), parts.get(1).and_then(|p| decode(p)));
                    parts.len() == 3
                        && header.is_some_and(|h| h["alg"] == "RS256")
                        && claims.is_some_and(|c| {
                            c["iss"] == "tidemark-test@tidemark-test.iam.gserviceaccount.com"
                                && c["scope"].as_str().is_some_and(|s| s.contains("devstorage"))
                                && c["aud"].as_str().is_some_and(|a| a.ends_with("/token"))
                        })
                });
            seen_calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let (status, answer) = if ok {
                ("200 OK", r#"{"access_token":"tok-123","expires_in":3600,"token_type":"Bearer"}"#)
            } else {
                ("400 Bad Request", r#"{"error":{"message":"bad assertion"}}"#)
            };
            let _ = write!(
                s,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
    });
    let mut key: serde_json::Value = serde_json::from_str(include_str!("data/test-service-account.json")).unwrap();
    key["token_uri"] = serde_json::Value::String(token_uri);
    // A custom endpoint (here fake-gcs-server's, standing in for a regional or Private Service
    // Connect one) is still sent the remote's credentials: only -gcs.emulator=true turns them off.
    let mut c = conf(&fake.endpoint, None);
    c.settings.remove("emulator");
    c.settings.insert("service_account_json".into(), key.to_string());
    let storage = GcsStorage::open(&c, &unique_name("sa")).unwrap();
    storage.create_bucket().await.expect("the token was accepted");
    storage.put("k", Bytes::from_static(b"v"), Default::default()).await.unwrap();
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1, "one exchange, then the cached token");

    c.settings.insert("service_account_json".into(), "/no/such/key.json".into());
    let err = GcsStorage::open(&c, "b").err().expect("a missing key file is refused").to_string();
    assert!(err.contains("/no/such/key.json"), "{err}");
}

/// Credentials are turned off only by `-gcs.emulator=true`, never by an endpoint: a custom
/// endpoint without credentials goes to the metadata server (absent here), and says how to give
/// credentials or declare an emulator; an emulator with credentials is a contradiction, refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_emulator_setting_turns_credentials_off() {
    let fake = FakeGcs::get(None);
    let mut c = conf(&fake.endpoint, None);
    c.settings.remove("emulator");
    let storage = GcsStorage::open(&c, &unique_name("noauth")).unwrap();
    let err = storage.create_bucket().await.expect_err("no credentials, and no metadata server here").to_string();
    assert!(err.contains("no Google credentials") && err.contains("-gcs.emulator=true"), "{err}");

    let mut c = conf(&fake.endpoint, None);
    c.settings.insert("access_token".into(), "ya29.token".into());
    let err = GcsStorage::open(&c, "b").err().expect("a contradiction").to_string();
    assert!(err.contains("-gcs.emulator=true") && err.contains("-gcs.access_token"), "{err}");
    c.settings.insert("emulator".into(), "yes".into());
    let err = GcsStorage::open(&c, "b").err().expect("not a boolean").to_string();
    assert!(err.contains("-gcs.emulator=\"yes\""), "{err}");
}

/// The pull Google documents, as used against Google (credentials set, no emulator declared):
/// no `returnImmediately`, the server holding the pull; a message published while the pull
/// waits is received at once, not at the next poll. Against the emulator, which answers that
/// pull as Pub/Sub does when a message arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn googles_pull_waits_on_the_server_and_returns_with_the_first_message() {
    let Some(ps) = PubSub::get() else { return };
    let topic = format!("projects/{}/topics/{}", FakeGcs::PROJECT, unique_name("t"));
    let sub = subscription(&ps, &topic, true);
    let mut c = conf("http://unused", None);
    c.settings.remove("emulator");
    c.settings.insert("pubsub_endpoint".into(), format!("http://{}", ps.host));
    // The emulator takes any token.
    c.settings.insert("access_token".into(), "ya29.test-token".into());
    let source = PubSubSource::open(&c, &sub).unwrap();
    let producer = PubSubProducer { host: ps.host.clone(), topic };
    let began = Instant::now();
    let (got, ()) = tokio::join!(source.receive(10, Duration::from_secs(20)), async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        producer.send("while the pull waits").await;
    });
    let got = got.unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(&got[0].body[..], b"while the pull waits");
    let took = began.elapsed();
    assert!(took >= Duration::from_millis(1400) && took < Duration::from_secs(10), "answered after {took:?}");
    source.ack(&[got[0].ack_id.clone()]).await.unwrap();
}

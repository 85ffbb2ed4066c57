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
use tidemark_testkit::{FakeGcs, GcpDouble, PubSub, unique_name};

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

/// A service account key signs its own JWT (Google's `google-cloud-auth`, AIP-4111) carrying
/// Tidemark's scopes, reused while it is valid; a custom endpoint (here the double in front of
/// fake-gcs-server, standing in for a regional or Private Service Connect one) is still sent the
/// remote's credentials: only -gcs.emulator=true turns them off. A credentials file of a type
/// Tidemark does not take, or a missing one, is refused naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_account_key_signs_its_own_token_with_tidemarks_scopes() {
    let fake = FakeGcs::get(None);
    let double = GcpDouble::start(&fake.endpoint, "http://127.0.0.1:9");
    let key = include_str!("data/test-service-account.json");
    let mut c = conf(&double.endpoint, None);
    c.settings.remove("emulator");
    c.settings.insert("service_account_json".into(), key.to_string());
    let storage = GcsStorage::open(&c, &unique_name("sa")).unwrap();
    storage.create_bucket().await.expect("the token was accepted");
    storage.put("k", Bytes::from_static(b"v"), Default::default()).await.unwrap();
    storage.stat("k").await.unwrap().expect("the object");
    assert_eq!(double.ways(), ["self_signed"], "one self-signed token, reused");
    let scopes = double.scopes_issued().concat();
    assert!(scopes.iter().any(|s| s.ends_with("/devstorage.read_write")), "{scopes:?}");
    assert!(scopes.iter().any(|s| s.ends_with("/pubsub")), "{scopes:?}");

    c.settings.insert("service_account_json".into(), "/no/such/key.json".into());
    let err = GcsStorage::open(&c, "b").err().expect("a missing key file is refused").to_string();
    assert!(err.contains("/no/such/key.json"), "{err}");
    c.settings.insert("service_account_json".into(), r#"{"type": "api_key"}"#.into());
    let err = GcsStorage::open(&c, "b").err().expect("not a credentials file Tidemark takes").to_string();
    assert!(err.contains("\"api_key\"") && err.contains("external_account"), "{err}");
}

/// An authorized user (gcloud's `auth application-default login` file): its refresh token is
/// exchanged at the token endpoint the file names, for a token with Tidemark's scopes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authorized_users_refresh_token_is_exchanged() {
    let fake = FakeGcs::get(None);
    let double = GcpDouble::start(&fake.endpoint, "http://127.0.0.1:9");
    double.authorize_user("1//double-refresh-token");
    let file = serde_json::json!({
        "type": "authorized_user", "client_id": "123.apps.googleusercontent.com", "client_secret": "d-not-a-secret",
        "refresh_token": "1//double-refresh-token", "token_uri": format!("{}/token", double.endpoint),
    });
    let mut c = conf(&double.endpoint, None);
    c.settings.remove("emulator");
    c.settings.insert("service_account_json".into(), file.to_string());
    let storage = GcsStorage::open(&c, &unique_name("user")).unwrap();
    storage.create_bucket().await.expect("the refreshed token was accepted");
    storage.put("k", Bytes::from_static(b"v"), Default::default()).await.unwrap();
    assert_eq!(double.ways(), ["user"]);
    assert!(double.scopes_issued().concat().iter().any(|s| s.ends_with("/devstorage.read_write")));
}

/// Impersonation (gcloud's `--impersonate-service-account` file): the source credentials (here
/// an authorized user) get a token, which IAM Credentials' `generateAccessToken` turns into the
/// target service account's, with Tidemark's scopes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impersonated_service_accounts_token_is_generated_from_the_source_credentials() {
    let fake = FakeGcs::get(None);
    let double = GcpDouble::start(&fake.endpoint, "http://127.0.0.1:9");
    double.authorize_user("1//double-refresh-token");
    let file = serde_json::json!({
        "type": "impersonated_service_account",
        "service_account_impersonation_url": format!(
            "{}/v1/projects/-/serviceAccounts/tidemark@p.iam.gserviceaccount.com:generateAccessToken",
            double.endpoint
        ),
        "source_credentials": {
            "type": "authorized_user", "client_id": "123.apps.googleusercontent.com",
            "client_secret": "d-not-a-secret", "refresh_token": "1//double-refresh-token",
            "token_uri": format!("{}/token", double.endpoint),
        },
        "delegates": [],
    });
    let mut c = conf(&double.endpoint, None);
    c.settings.remove("emulator");
    c.settings.insert("service_account_json".into(), file.to_string());
    let storage = GcsStorage::open(&c, &unique_name("imp")).unwrap();
    storage.create_bucket().await.expect("the impersonated token was accepted");
    storage.put("k", Bytes::from_static(b"v"), Default::default()).await.unwrap();
    assert_eq!(double.ways(), ["user", "impersonated"]);
    let last = double.scopes_issued();
    assert!(last.iter().any(|s| s.iter().any(|s| s.ends_with("/devstorage.read_write"))), "{last:?}");
}

/// Workload identity federation: an external account's credentials file (its subject token in
/// a file, as Kubernetes or another cloud writes it) is exchanged at the Security Token Service
/// for a Google access token, by `google-cloud-auth`; a subject token the pool does not trust is
/// refused, said with what to check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_account_is_exchanged_at_sts() {
    let fake = FakeGcs::get(None);
    let double = GcpDouble::start(&fake.endpoint, "http://127.0.0.1:9");
    let tmp = tempfile::tempdir().unwrap();
    let subject = tmp.path().join("subject-token");
    std::fs::write(&subject, "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ0aWRlbWFyayJ9.c2ln").unwrap();
    let audience = "//iam.googleapis.com/projects/123456789012/locations/global/workloadIdentityPools/p/providers/k8s";
    let file = serde_json::json!({
        "type": "external_account", "audience": audience,
        "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        "token_url": format!("{}/v1/token", double.endpoint),
        "credential_source": {"file": subject.to_str().unwrap()},
    });
    let mut c = conf(&double.endpoint, None);
    c.settings.remove("emulator");
    c.settings.insert("service_account_json".into(), file.to_string());
    let err = GcsStorage::open(&c, &unique_name("wif")).unwrap().create_bucket().await.unwrap_err().to_string();
    assert!(err.contains("invalid_grant") && err.contains("Application Default Credentials"), "{err}");
    double.federate(audience, &std::fs::read_to_string(&subject).unwrap());
    let storage = GcsStorage::open(&c, &unique_name("wif")).unwrap();
    storage.create_bucket().await.expect("the exchanged token was accepted");
    storage.put("k", Bytes::from_static(b"v"), Default::default()).await.unwrap();
    assert_eq!(double.ways(), ["sts"], "{:?}", double.ways());
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
    assert!(err.contains("Application Default Credentials") && err.contains("-gcs.emulator=true"), "{err}");

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

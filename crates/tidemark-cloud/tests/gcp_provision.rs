//! Cloud Storage → Pub/Sub provisioning signed in as production signs in — a service account's
//! key exchanged for a token — against fake-gcs-server and the Pub/Sub emulator behind
//! `tidemark_testkit::GcpDouble` (the APIs no emulator serves: notification configurations, the
//! service agent, Pub/Sub IAM, Resource Manager, the token endpoint). The double checks each
//! token's scopes as Google does, lets a new grant take effect only after
//! `gcp_double::PROPAGATION`, and throws the faults asked of it: 429s and a concurrent policy
//! change. The CLI-level test of the same provisioning is `tidemark`'s `gcs_provision`.

use std::time::Instant;

use bytes::Bytes;
use tidemark_cloud::gcp::GcsStorage;
use tidemark_core::RemoteStorage;
use tidemark_core::remote::{RemoteConf, StorageKind};
use tidemark_core::subscription::{EventTypes, ManagedResources, Topology};
use tidemark_testkit::gcp_double::{self, GcpDouble};
use tidemark_testkit::{FakeGcs, PubSub, unique_name};

fn conf(settings: &[(&str, &str)]) -> RemoteConf {
    RemoteConf {
        name: "g".into(),
        kind: StorageKind::Gcs,
        settings: settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisioning_with_a_service_account_waits_out_propagation_races_and_throttling() {
    let Some(ps) = PubSub::get() else { return };
    let fake = FakeGcs::get(None);
    let double = GcpDouble::start(&fake.endpoint, &format!("http://{}", ps.host));
    let bucket = unique_name("gsa");
    let direct = conf(&[("endpoint", &fake.endpoint), ("emulator", "true")]);
    let storage = GcsStorage::open(&direct, &bucket).unwrap();
    storage.create_bucket().await.unwrap();
    storage.put("photos/a.txt", Bytes::from_static(b"a"), Default::default()).await.unwrap();

    let mut key: serde_json::Value = serde_json::from_str(include_str!("data/test-service-account.json")).unwrap();
    key["token_uri"] = serde_json::json!(format!("{}/token", double.endpoint));
    let key = key.to_string();
    let signed_in = conf(&[
        ("endpoint", &double.endpoint),
        ("pubsub_endpoint", &double.endpoint),
        ("resource_manager_endpoint", &double.endpoint),
        ("project", FakeGcs::PROJECT),
        ("service_account_json", &key),
    ]);
    let notifications = tidemark_cloud::event_notifications(&signed_in, &bucket, None).await.unwrap().unwrap();
    // Google throttles twice, and another writer changes the topic's policy between
    // Tidemark's read and write: both are waited out.
    double.throttle(2);
    double.race(1);
    let name = unique_name("tidemark");
    let mut managed = ManagedResources::default();
    let began = Instant::now();
    let fingerprint = |u: &str| u.to_string();
    let sub = notifications
        .provision(Topology::SqsDirect, &name, "photos/", &EventTypes::default(), 5, &fingerprint, &mut managed)
        .await
        .expect("provisioned");
    let took = began.elapsed();
    assert_eq!(sub, format!("projects/{}/subscriptions/{name}", FakeGcs::PROJECT));
    assert_eq!(double.faults_left(), 0, "the 429s and the race were met, and retried");
    // The configuration was refused while the new grant propagated, and waited for.
    assert!(double.refused_unpropagated() >= 1, "the insert met an unpropagated grant");
    assert!(took >= gcp_double::PROPAGATION, "waited for the grant ({took:?})");
    assert_eq!(double.notifications(&bucket).len(), 1);
    // The bucket's own project's service agent got the role — not -gcs.project's.
    let topic = managed.pubsub_topic.clone().expect("a topic of its own");
    let policy = double.policy(&topic).unwrap().to_string();
    assert!(policy.contains(gcp_double::SERVICE_AGENT), "{policy}");
    assert!(!policy.contains(&gcp_double::storage_agent(gcp_double::PROJECT_NUMBER)), "{policy}");
    // One token, asked with every scope the calls need (Resource Manager's included: the dead
    // letters' agent is read from the project's number), and reused.
    let scopes = double.scopes_issued();
    assert_eq!(scopes.len(), 1, "{scopes:?}");
    for s in ["devstorage.read_write", "pubsub", "cloudplatformprojects.readonly"] {
        assert!(scopes[0].iter().any(|x| x.ends_with(&format!("/auth/{s}"))), "{s} in {scopes:?}");
    }

    let done = notifications.teardown(&mut managed).await.expect("torn down");
    assert!(done.iter().any(|d| d.starts_with("removed topic")), "{done:?}");
    assert!(managed.is_empty(), "{managed:?}");
    assert!(double.notifications(&bucket).is_empty());
}

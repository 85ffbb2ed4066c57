//! `remote.events.enable` on a Cloud Storage mount, as a user runs it (the binary, its shell, the
//! all-in-one server's worker): Tidemark provisions the Pub/Sub topic, the publisher role of the
//! bucket's service agent, its subscription and the bucket's notification configuration, and
//! tears them down. The Pub/Sub emulator serves topics and subscriptions; fake-gcs-server the
//! bucket; `tidemark_testkit::GcpDouble` the two APIs no emulator serves (notification
//! configurations, topic access policies). With `-topic=` the subscription is on the topic
//! fake-gcs-server publishes the bucket's events to, so events flow from a bucket change to the
//! namespace through what Tidemark provisioned.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tidemark_cloud::gcp::GcsStorage;
use tidemark_core::RemoteStorage;
use tidemark_core::remote::{RemoteConf, StorageKind};
use tidemark_testkit::{FakeGcs, GcpDouble, PubSub, TidemarkProcess, fails, ok, run_shell, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

/// Whether `path` (`projects/P/...`) exists on the Pub/Sub emulator.
async fn exists(ps: &PubSub, path: &str) -> bool {
    let r = reqwest::get(format!("http://{}/v1/{path}", ps.host)).await.unwrap();
    r.status().is_success()
}

fn tailing(server: &TidemarkProcess) -> bool {
    let out = ok(run_shell(bin(), &server.addr, "remote.events.list", &[]));
    out.lines().nth(1).is_some_and(|l| l.split('\t').nth(6) == Some("tailing"))
}

async fn within(what: &str, secs: u64, mut check: impl AsyncFnMut() -> bool) -> Duration {
    let began = Instant::now();
    while began.elapsed() < Duration::from_secs(secs) {
        if check().await {
            return began.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what} not within {secs} s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcs_events_are_provisioned_consumed_and_torn_down() {
    let Some(ps) = PubSub::get() else { return };
    let fake = FakeGcs::get(Some(&ps));
    let double = GcpDouble::start(&fake.endpoint, &format!("http://{}", ps.host));
    let bucket = unique_name("gprov");
    let conf = RemoteConf {
        name: "g".into(),
        kind: StorageKind::Gcs,
        settings: [("endpoint", fake.endpoint.as_str()), ("emulator", "true")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    let storage = GcsStorage::open(&conf, &bucket).unwrap();
    storage.create_bucket().await.unwrap();
    storage.put("photos/before.txt", Bytes::from_static(b"before"), Default::default()).await.unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[]);
    // Without a project there is nothing to provision in: said, and nothing is left behind.
    ok(sh(&format!(
        "remote.configure -name=g -type=gcs -gcs.emulator=true -gcs.endpoint={0} -gcs.pubsub_endpoint={0} \
         -gcs.resource_manager_endpoint={0}",
        double.endpoint
    )));
    ok(sh(&format!("remote.mount -dir=/mnt/g -remote=g/{bucket}/photos")));
    let err = fails(sh("remote.events.enable -dir=/mnt/g"));
    assert!(err.contains("-gcs.project"), "{err}");
    ok(sh(&format!("remote.configure -name=g -gcs.project={}", FakeGcs::PROJECT)));
    // Flags that do not apply to Cloud Storage are refused before anything is made.
    assert!(fails_usage(sh("remote.events.enable -dir=/mnt/g -via=sns")).contains("-via is S3's"));
    assert!(fails(sh("remote.events.enable -dir=/mnt/g -maxReceives=3")).contains("5 to 100"));
    let missing = format!("projects/{}/topics/{}", FakeGcs::PROJECT, unique_name("nope"));
    let err = fails(sh(&format!("remote.events.enable -dir=/mnt/g -topic={missing}")));
    assert!(err.contains("does not exist"), "{err}");
    assert!(double.notifications(&bucket).is_empty());
    assert!(ok(sh("remote.events.list")).lines().count() <= 1, "no subscription recorded");

    // A topic of its own: every resource made, recorded, and removed again.
    let out =
        ok(sh("remote.events.enable -dir=/mnt/g -events=created,removed -maxReceives=5 -visibility=2s -slice=6s"));
    assert!(out.contains("provisioned sqs_direct projects/test/subscriptions/tidemark-"), "{out}");
    let listed = ok(sh("remote.events.list -json"));
    let doc: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let managed = &doc[0]["managed"];
    let (topic, sub) = (
        managed["pubsub_topic"].as_str().unwrap().to_string(),
        managed["pubsub_subscription"].as_str().unwrap().to_string(),
    );
    assert!(exists(&ps, &topic).await && exists(&ps, &sub).await, "{managed}");
    let configs = double.notifications(&bucket);
    assert_eq!(configs.len(), 1, "{configs:?}");
    assert_eq!(configs[0]["topic"], format!("//pubsub.googleapis.com/{topic}"));
    assert_eq!(configs[0]["payload_format"], "JSON_API_V1");
    assert_eq!(configs[0]["object_name_prefix"], "photos/");
    assert_eq!(
        configs[0]["event_types"],
        serde_json::json!(["OBJECT_FINALIZE", "OBJECT_METADATA_UPDATE", "OBJECT_DELETE", "OBJECT_ARCHIVE"])
    );
    let policy = double.policy(&topic).unwrap();
    assert!(policy.to_string().contains(tidemark_testkit::gcp_double::SERVICE_AGENT), "{policy}");
    // Dead letters: a topic and the subscription that keeps them; Pub/Sub's agent may forward.
    let (dead, kept) = (
        managed["dead_letter_queue_arn"].as_str().unwrap().to_string(),
        managed["dead_letter_queue_url"].as_str().unwrap().to_string(),
    );
    assert!(exists(&ps, &dead).await && exists(&ps, &kept).await, "{managed}");
    let agent = tidemark_testkit::gcp_double::PUBSUB_AGENT;
    assert!(double.policy(&dead).unwrap().to_string().contains(agent));
    assert!(double.policy(&sub).unwrap().to_string().contains(agent));
    // A notification whose payload is not JSON (malformed, never applied): after 5 deliveries it waits in the dead-letter
    // subscription, and the list shows it.
    within("the subscription to tail", 60, async || tailing(&server)).await;
    let publish = reqwest::Client::new()
        .post(format!("http://{}/v1/{topic}:publish", ps.host))
        .json(&serde_json::json!({"messages": [{"data": "bm90IGpzb24=", "attributes": {
            "eventType": "OBJECT_FINALIZE", "payloadFormat": "JSON_API_V1", "bucketId": bucket, "objectId": "photos/x"}}]}))
        .send()
        .await
        .unwrap();
    assert!(publish.status().is_success());
    within("the poison message dead-lettered", 90, async || {
        let doc: serde_json::Value = serde_json::from_str(&ok(sh("remote.events.list -json"))).unwrap();
        doc[0]["status"]["dead_lettered"].as_u64().unwrap_or(0) >= 1
    })
    .await;
    // The same identity again changes nothing; another prefix is a new subscription, refused
    // while this one's resources exist.
    let again =
        ok(sh("remote.events.enable -dir=/mnt/g -events=created,removed -maxReceives=5 -visibility=2s -slice=6s"));
    assert!(!again.contains("provisioned"), "{again}");
    assert_eq!(double.notifications(&bucket).len(), 1);
    let err = fails(sh("remote.events.enable -dir=/mnt/g -prefix=sub"));
    assert!(err.contains("-teardown first"), "{err}");
    // A teardown that cannot reach Cloud Storage stops part-way, keeps what remains, and a
    // retry finishes it.
    ok(sh("remote.configure -name=g -gcs.endpoint=http://127.0.0.1:1"));
    let err = fails(sh("remote.events.disable -dir=/mnt/g -teardown"));
    assert!(err.contains("again"), "{err}");
    let kept_doc: serde_json::Value = serde_json::from_str(&ok(sh("remote.events.list -json"))).unwrap();
    assert!(kept_doc[0]["managed"]["notification_id"].is_string(), "{kept_doc}");
    ok(sh(&format!("remote.configure -name=g -gcs.endpoint={}", double.endpoint)));
    let out = ok(sh("remote.events.disable -dir=/mnt/g -teardown"));
    assert!(out.contains("removed subscription") && out.contains("removed topic"), "{out}");
    assert!(out.contains("with the 1 message(s) it still held"), "the dead letter said: {out}");
    assert!(double.notifications(&bucket).is_empty());
    assert!(!exists(&ps, &sub).await && !exists(&ps, &topic).await, "subscription and topic removed");
    assert!(!exists(&ps, &kept).await && !exists(&ps, &dead).await, "dead-letter topic and subscription removed");

    // The topic fake-gcs-server publishes the bucket's events to: a subscription of this
    // cluster's on it, and events flow into the namespace.
    let Some(shared) = fake.topic.clone() else { return };
    let out = ok(sh(&format!("remote.events.enable -dir=/mnt/g -topic={shared} -slice=6s -maxReceives=0")));
    assert!(out.contains("provisioned sns_fanout"), "{out}");
    within("the subscription to tail", 60, async || tailing(&server)).await;
    let began = Instant::now();
    storage.put("photos/new.txt", Bytes::from_static(b"through pub/sub"), Default::default()).await.unwrap();
    within("the new object in the namespace", 30, async || sh("fs.cat /mnt/g/new.txt").status.success()).await;
    let seen = began.elapsed();
    assert_eq!(ok(sh("fs.cat /mnt/g/new.txt")), "through pub/sub");
    storage.delete("photos/before.txt").await.unwrap();
    within("the deleted object gone", 30, async || !ok(sh("fs.ls /mnt/g")).contains("before.txt")).await;
    println!("put -> visible through the provisioned subscription: {seen:?}");
    let doc: serde_json::Value = serde_json::from_str(&ok(sh("remote.events.list -json"))).unwrap();
    let sub = doc[0]["managed"]["pubsub_subscription"].as_str().unwrap().to_string();
    assert!(doc[0]["managed"]["pubsub_topic"].is_null(), "an existing topic is not Tidemark's");
    let out = ok(sh("remote.events.disable -dir=/mnt/g -teardown"));
    assert!(out.contains("took back the publisher role on the shared topic"), "{out}");
    assert!(!exists(&ps, &sub).await, "the subscription removed");
    assert!(exists(&ps, &shared).await, "the shared topic kept");
    assert!(double.notifications(&bucket).is_empty());
    let policy = double.policy(&shared).map(|p| p.to_string()).unwrap_or_default();
    assert!(
        !policy.contains(tidemark_testkit::gcp_double::SERVICE_AGENT),
        "the role Tidemark granted taken back: {policy}"
    );
}

fn fails_usage(o: std::process::Output) -> String {
    assert!(!o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

//! Provisioning the sqs_direct topology against moto: exactly what the reference says is
//! created, an object put reaches the queue, overlaps are refused, and teardown removes exactly
//! what Tidemark created (an unrelated configuration survives).

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use aws_sdk_s3::types::{
    Event, FilterRule, FilterRuleName, NotificationConfiguration, NotificationConfigurationFilter, QueueConfiguration,
    S3KeyFilter,
};
use aws_sdk_sqs::types::QueueAttributeName;
use bytes::Bytes;
use tidemark_cloud::aws::s3::S3Storage;
use tidemark_cloud::aws::sqs::{SqsSource, client};
use tidemark_core::RemoteStorage;
use tidemark_core::events::{Decoded, EventSource, s3};
use tidemark_testkit::{Moto, TidemarkProcess, run_shell, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", text(&o.stderr));
    text(&o.stdout)
}

fn fails(o: Output) -> String {
    assert_eq!(o.status.code(), Some(1), "should fail: {}", text(&o.stdout));
    text(&o.stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_direct_provisions_exactly_and_tears_down_exactly() {
    let moto = Moto::get();
    let conf = moto.conf("s3");
    let bucket = unique_name("pv");
    let s3c = S3Storage::connect(&conf, &bucket).await.unwrap();
    s3c.client().create_bucket().bucket(&bucket).send().await.unwrap();
    let sqs = client(&conf).await.unwrap();
    // Someone else's configuration, on another prefix: it must survive everything below.
    let theirs_url =
        sqs.create_queue().queue_name(unique_name("theirs")).send().await.unwrap().queue_url().unwrap().to_string();
    let a = sqs
        .get_queue_attributes()
        .queue_url(&theirs_url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .unwrap();
    let theirs_arn = a.attributes().unwrap()[&QueueAttributeName::QueueArn].clone();
    let logs = FilterRule::builder().name(FilterRuleName::Prefix).value("logs/").build();
    let theirs = QueueConfiguration::builder()
        .id("other-team")
        .queue_arn(&theirs_arn)
        .events(Event::S3ObjectCreated)
        .filter(
            NotificationConfigurationFilter::builder().key(S3KeyFilter::builder().filter_rules(logs).build()).build(),
        )
        .build()
        .unwrap();
    s3c.client()
        .put_bucket_notification_configuration()
        .bucket(&bucket)
        .notification_configuration(NotificationConfiguration::builder().queue_configurations(theirs).build())
        .send()
        .await
        .unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[]);
    ok(sh(&moto.configure_command("s3")));
    ok(sh(&format!("remote.mount -dir=/mnt/data -remote=s3/{bucket}/photos")));
    let enabled = ok(sh("remote.events.enable -dir=/mnt/data"));
    assert!(enabled.contains("provisioned sqs_direct"), "{enabled}");

    let docs: serde_json::Value = serde_json::from_str(&ok(sh("remote.events.list -json"))).unwrap();
    let doc = &docs[0];
    let fp = doc["fingerprint"].as_str().unwrap();
    let queue_url = doc["managed"]["queue_url"].as_str().unwrap().to_string();
    assert_eq!(doc["identity"]["queue"], queue_url.as_str());
    assert_eq!(doc["identity"]["topology"], "sqs_direct");
    assert_eq!(doc["identity"]["prefix"], "photos/");
    assert_eq!(doc["managed"]["notification_id"], format!("tidemark-{fp}").as_str());
    // The queue's policy lets the bucket send.
    let p = sqs
        .get_queue_attributes()
        .queue_url(&queue_url)
        .attribute_names(QueueAttributeName::Policy)
        .send()
        .await
        .unwrap();
    let policy = p.attributes().unwrap()[&QueueAttributeName::Policy].clone();
    assert!(policy.contains("s3.amazonaws.com") && policy.contains(&format!("arn:aws:s3:::{bucket}")), "{policy}");
    // And a dead-letter queue after 10 receives (the default).
    let dead_url = doc["managed"]["dead_letter_queue_url"].as_str().unwrap().to_string();
    assert_eq!(dead_url, format!("{queue_url}-dead"));
    assert_eq!(doc["managed"]["max_receives"], 10);
    assert!(enabled.contains(&format!("dead letters after 10 receives to {dead_url}")), "{enabled}");
    let r = sqs
        .get_queue_attributes()
        .queue_url(&queue_url)
        .attribute_names(QueueAttributeName::RedrivePolicy)
        .send()
        .await
        .unwrap();
    let redrive: serde_json::Value =
        serde_json::from_str(&r.attributes().unwrap()[&QueueAttributeName::RedrivePolicy]).unwrap();
    assert_eq!(redrive["maxReceiveCount"].to_string().trim_matches('"'), "10", "{redrive}");
    assert_eq!(redrive["deadLetterTargetArn"], doc["managed"]["dead_letter_queue_arn"]);
    // The bucket's configuration: theirs, and ours on the mount's prefix.
    let cfg = s3c.client().get_bucket_notification_configuration().bucket(&bucket).send().await.unwrap();
    let ids: Vec<&str> = cfg.queue_configurations().iter().filter_map(|q| q.id()).collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(ids.contains(&"other-team") && ids.contains(&format!("tidemark-{fp}").as_str()));

    // An object put under the mount reaches the provisioned queue.
    s3c.put("photos/new.jpg", Bytes::from_static(b"img"), Default::default()).await.unwrap();
    let source = SqsSource::new(sqs.clone(), queue_url.clone());
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut keys = Vec::new();
    while !keys.contains(&"photos/new.jpg".to_string()) {
        assert!(Instant::now() < deadline, "no event on the provisioned queue: {keys:?}");
        for d in source.receive(10, Duration::from_secs(1)).await.unwrap() {
            if let Decoded::Events { events } = s3::decode(&d.body) {
                keys.extend(events.into_iter().map(|e| e.key));
            }
        }
    }

    // The rules: same identity is a no-op; a changed one is refused while resources exist;
    // overlaps with ours and with theirs are refused by name.
    assert!(ok(sh("remote.events.enable -dir=/mnt/data")).contains("nothing changed"));
    let err = fails(sh("remote.events.enable -dir=/mnt/data -events=created"));
    assert!(err.contains("-teardown first"), "{err}");
    ok(sh(&format!("remote.mount -dir=/mnt/sub -remote=s3/{bucket}/photos/sub")));
    let err = fails(sh("remote.events.enable -dir=/mnt/sub"));
    assert!(err.contains(&format!("tidemark-{fp}")) && err.contains("-via=sns") && err.contains("-queue="), "{err}");
    ok(sh(&format!("remote.mount -dir=/mnt/logs -remote=s3/{bucket}/logs")));
    let err = fails(sh("remote.events.enable -dir=/mnt/logs"));
    assert!(err.contains("other-team"), "{err}");
    assert!(sqs.list_queues().send().await.unwrap().queue_urls().len() >= 2);

    // Teardown: refused without -teardown; with it, exactly ours goes.
    let err = fails(sh("remote.events.disable -dir=/mnt/data"));
    assert!(err.contains("-teardown"), "{err}");
    let torn = ok(sh("remote.events.disable -dir=/mnt/data -teardown"));
    assert!(
        torn.contains(&format!("queue {queue_url}"))
            && torn.contains(&format!("dead-letter queue {dead_url}"))
            && torn.contains(&format!("tidemark-{fp}")),
        "names what it removed: {torn}"
    );
    let cfg = s3c.client().get_bucket_notification_configuration().bucket(&bucket).send().await.unwrap();
    let ids: Vec<&str> = cfg.queue_configurations().iter().filter_map(|q| q.id()).collect();
    assert_eq!(ids, ["other-team"], "the unrelated configuration survives");
    let queues: Vec<String> = sqs.list_queues().send().await.unwrap().queue_urls().to_vec();
    assert!(!queues.contains(&queue_url), "the provisioned queue is gone");
    assert!(!queues.contains(&dead_url), "and its dead-letter queue");
    assert!(queues.contains(&theirs_url), "their queue stays");
    assert!(ok(sh("remote.events.list")).contains("no event subscriptions"));
}

/// A teardown that fails part-way (SQS unreachable after the bucket's configuration was
/// removed) keeps the subscription with what remains; a retry finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teardown_that_fails_part_way_keeps_what_remains_and_a_retry_finishes() {
    let moto = Moto::get();
    let conf = moto.conf("s3");
    let bucket = unique_name("td");
    let s3c = S3Storage::connect(&conf, &bucket).await.unwrap();
    s3c.client().create_bucket().bucket(&bucket).send().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[]);
    ok(sh(&moto.configure_command("s3")));
    ok(sh(&format!("remote.mount -dir=/mnt/data -remote=s3/{bucket}")));
    ok(sh("remote.events.enable -dir=/mnt/data"));

    // SQS becomes unreachable: the bucket's configuration goes, the queue cannot.
    let dead = format!("http://127.0.0.1:{}", tidemark_testkit::free_port());
    ok(sh(&format!("remote.configure -name=s3 -s3.sqs_endpoint={dead}")));
    let err = fails(sh("remote.events.disable -dir=/mnt/data -teardown"));
    assert!(err.contains("part-way") && err.contains("queue_url") && err.contains("again"), "{err}");
    let docs: serde_json::Value = serde_json::from_str(&ok(sh("remote.events.list -json"))).unwrap();
    assert!(docs[0]["managed"]["notification_id"].is_null(), "the configuration was removed: {docs}");
    assert!(docs[0]["managed"]["queue_url"].is_string(), "the queue remains, recorded: {docs}");
    // (Read through Tidemark's reader: moto's answer for an empty configuration trips the SDK.)
    let notifications = tidemark_cloud::aws::provision::S3Notifications::connect(&conf, &bucket).await.unwrap();
    assert!(notifications.configuration().await.unwrap().queue_configurations().is_empty());

    // SQS is back: the retry finishes.
    ok(sh(&format!("remote.configure -name=s3 -s3.sqs_endpoint={}", moto.endpoint)));
    ok(sh("remote.events.disable -dir=/mnt/data -teardown"));
    assert!(ok(sh("remote.events.list")).contains("no event subscriptions"));
    let queue = docs[0]["managed"]["queue_url"].as_str().unwrap().to_string();
    let sqs = client(&conf).await.unwrap();
    assert!(!sqs.list_queues().send().await.unwrap().queue_urls().contains(&queue));
}

/// Two clusters (two data dirs) subscribe to one bucket through the SNS fan-out: both queues get
/// each event; tearing one down leaves the other receiving; the last one out removes the topic
/// and the bucket's configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_share_a_bucket_through_sns_fanout() {
    let moto = Moto::get();
    let conf = moto.conf("s3");
    let bucket = unique_name("fan");
    let s3c = S3Storage::connect(&conf, &bucket).await.unwrap();
    s3c.client().create_bucket().bucket(&bucket).send().await.unwrap();
    let sqs = client(&conf).await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let clusters: Vec<TidemarkProcess> =
        ["one", "two"].iter().map(|n| TidemarkProcess::server(bin(), &tmp.path().join(n), &[])).collect();
    let mut queues = Vec::new();
    for c in &clusters {
        let sh = |cmd: &str| run_shell(bin(), &c.addr, cmd, &[]);
        ok(sh(&moto.configure_command("s3")));
        ok(sh(&format!("remote.mount -dir=/mnt/data -remote=s3/{bucket}")));
        assert!(ok(sh("remote.events.enable -dir=/mnt/data -via=sns")).contains("sns_fanout"));
        let docs: serde_json::Value = serde_json::from_str(&ok(sh("remote.events.list -json"))).unwrap();
        assert!(
            docs[0]["managed"]["topic_arn"].is_string() && docs[0]["managed"]["subscription_arn"].is_string(),
            "{docs}"
        );
        queues.push(docs[0]["managed"]["queue_url"].as_str().unwrap().to_string());
    }
    assert_ne!(queues[0], queues[1], "a queue per cluster");
    let notifications = tidemark_cloud::aws::provision::S3Notifications::connect(&conf, &bucket).await.unwrap();
    let cfg = notifications.configuration().await.unwrap();
    assert_eq!(cfg.topic_configurations().len(), 1, "one shared topic configuration");

    let receive_key = |url: String, key: &'static str| {
        let sqs = sqs.clone();
        async move {
            let source = SqsSource::new(sqs, url);
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if Instant::now() > deadline {
                    return false;
                }
                for d in source.receive(10, Duration::from_secs(1)).await.unwrap() {
                    if let Decoded::Events { events } = s3::decode(&d.body)
                        && events.iter().any(|e| e.key == key)
                    {
                        return true;
                    }
                }
            }
        }
    };
    s3c.put("both.txt", Bytes::from_static(b"b"), Default::default()).await.unwrap();
    assert!(receive_key(queues[0].clone(), "both.txt").await, "cluster one receives");
    assert!(receive_key(queues[1].clone(), "both.txt").await, "cluster two receives");

    // Cluster one leaves; cluster two keeps receiving through the shared topic.
    let torn = ok(run_shell(bin(), &clusters[0].addr, "remote.events.disable -dir=/mnt/data -teardown", &[]));
    assert!(torn.contains("kept the shared topic") && torn.contains("1 other subscription(s)"), "{torn}");
    assert_eq!(
        notifications.configuration().await.unwrap().topic_configurations().len(),
        1,
        "the topic stays for cluster two"
    );
    s3c.put("second.txt", Bytes::from_static(b"s"), Default::default()).await.unwrap();
    assert!(receive_key(queues[1].clone(), "second.txt").await, "cluster two still receives");
    assert!(!sqs.list_queues().send().await.unwrap().queue_urls().contains(&queues[0]), "cluster one's queue is gone");

    // The last one out removes the topic and the bucket's configuration.
    let torn = ok(run_shell(bin(), &clusters[1].addr, "remote.events.disable -dir=/mnt/data -teardown", &[]));
    assert!(torn.contains("removed the shared topic") && torn.contains("no subscriber left"), "{torn}");
    assert!(notifications.configuration().await.unwrap().topic_configurations().is_empty());
    let sdk = tidemark_cloud::aws::s3::sdk_config(&conf).await.unwrap();
    let sns = aws_sdk_sns::Client::new(&sdk);
    let topics = sns.list_topics().send().await.unwrap();
    assert!(
        !topics
            .topics()
            .iter()
            .any(|t| t.topic_arn().is_some_and(|a| a.ends_with(&tidemark_cloud::aws::provision::topic_name(&bucket))))
    );
}

#[test]
fn a_store_without_queue_integration_points_at_remote_meta_sync() {
    let tmp = tempfile::tempdir().unwrap();
    let moto = Moto::get();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let conf = moto.conf("s3");
    let bucket = unique_name("noq");
    rt.block_on(async {
        S3Storage::connect(&conf, &bucket).await.unwrap().client().create_bucket().bucket(&bucket).send().await.unwrap()
    });
    ok(sh(&format!(
        "remote.configure -name=minio -type=s3 -s3.endpoint={} -s3.access_key=testing -s3.secret_key=testing -s3.queue_integration=false",
        moto.endpoint
    )));
    ok(sh(&format!("remote.mount -dir=/mnt/data -remote=minio/{bucket}")));
    let err = fails(sh("remote.events.enable -dir=/mnt/data"));
    assert!(err.contains("remote.meta.sync") && err.contains("queue integration"), "{err}");
}

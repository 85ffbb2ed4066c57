//! Real notifications, not hand-made ones: moto's S3 sends them to SQS directly and through SNS
//! (enveloped and raw), and the S3 decoder reads what arrives.

use std::time::{Duration, Instant};

use aws_sdk_s3::types::{
    CompletedMultipartUpload, CompletedPart, Event, NotificationConfiguration, QueueConfiguration, TopicConfiguration,
};
use aws_sdk_sqs::types::QueueAttributeName;
use bytes::Bytes;
use tidemark_cloud::aws::s3::{S3Storage, sdk_config};
use tidemark_cloud::aws::sqs::{SqsSource, client};
use tidemark_core::RemoteStorage;
use tidemark_core::events::{BucketEvent, Decoded, EventKind, EventSource, s3};
use tidemark_core::remote::{RemoteConf, StorageKind};
use tidemark_testkit::{Moto, unique_name};

fn conf(endpoint: &str) -> RemoteConf {
    let settings =
        [("endpoint", endpoint), ("access_key", "testing"), ("secret_key", "testing"), ("region", "us-east-1")];
    RemoteConf {
        name: "moto".into(),
        kind: StorageKind::S3,
        settings: settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    }
}

async fn queue(sqs: &aws_sdk_sqs::Client) -> (String, String) {
    let url = sqs.create_queue().queue_name(unique_name("n")).send().await.unwrap().queue_url().unwrap().to_string();
    let attrs =
        sqs.get_queue_attributes().queue_url(&url).attribute_names(QueueAttributeName::QueueArn).send().await.unwrap();
    let arn = attrs.attributes().unwrap().get(&QueueAttributeName::QueueArn).unwrap().clone();
    (url, arn)
}

/// Everything the queue delivers within `within` (until `want` events and tests arrived).
async fn drain(source: &SqsSource, want: usize, within: Duration) -> Vec<Decoded> {
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    let mut count = 0;
    while count < want && Instant::now() < deadline {
        let batch = source.receive(10, Duration::from_secs(1)).await.unwrap();
        let ids: Vec<String> = batch.iter().map(|d| d.ack_id.clone()).collect();
        for d in &batch {
            let decoded = s3::decode(&d.body);
            count += match &decoded {
                Decoded::Events { events } => events.len(),
                _ => 1,
            };
            out.push(decoded);
        }
        source.ack(&ids).await.unwrap();
    }
    out
}

fn events(decoded: &[Decoded]) -> Vec<BucketEvent> {
    decoded
        .iter()
        .flat_map(|d| match d {
            Decoded::Events { events } => events.clone(),
            _ => vec![],
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_to_sqs_put_copy_multipart_delete_with_tricky_keys() {
    let moto = Moto::get();
    let c = conf(&moto.endpoint);
    let bucket = unique_name("nb");
    let s3s = S3Storage::connect(&c, &bucket).await.unwrap();
    let s3c = s3s.client().clone();
    s3c.create_bucket().bucket(&bucket).send().await.unwrap();
    let sqs = client(&c).await.unwrap();
    let (url, arn) = queue(&sqs).await;
    let qc = QueueConfiguration::builder()
        .queue_arn(&arn)
        .events(Event::S3ObjectCreated)
        .events(Event::S3ObjectRemoved)
        .build()
        .unwrap();
    let nc = NotificationConfiguration::builder().queue_configurations(qc).build();
    s3c.put_bucket_notification_configuration().bucket(&bucket).notification_configuration(nc).send().await.unwrap();
    let source = SqsSource::new(sqs, url);
    let first = drain(&source, 1, Duration::from_secs(10)).await;
    assert_eq!(first, vec![Decoded::Test], "configuring a notification sends s3:TestEvent");

    let key = "dir/a b+c ü.txt";
    s3s.put(key, Bytes::from_static(b"hello"), Default::default()).await.unwrap();
    s3c.copy_object()
        .bucket(&bucket)
        .key("dir/copy of.txt")
        .copy_source(format!("{bucket}/dir/a%20b%2Bc%20%C3%BC.txt"))
        .send()
        .await
        .unwrap();
    let up = s3c.create_multipart_upload().bucket(&bucket).key("multi/part.bin").send().await.unwrap();
    let upload_id = up.upload_id().unwrap();
    let part = s3c
        .upload_part()
        .bucket(&bucket)
        .key("multi/part.bin")
        .upload_id(upload_id)
        .part_number(1)
        .body(aws_sdk_s3::primitives::ByteStream::from(vec![7u8; 1024]))
        .send()
        .await
        .unwrap();
    let done = CompletedMultipartUpload::builder()
        .parts(CompletedPart::builder().part_number(1).e_tag(part.e_tag().unwrap()).build())
        .build();
    s3c.complete_multipart_upload()
        .bucket(&bucket)
        .key("multi/part.bin")
        .upload_id(upload_id)
        .multipart_upload(done)
        .send()
        .await
        .unwrap();
    s3s.delete(key).await.unwrap();

    let got = events(&drain(&source, 4, Duration::from_secs(20)).await);
    let summary: Vec<(String, EventKind)> = got.iter().map(|e| (e.key.clone(), e.kind.clone())).collect();
    assert!(got.iter().all(|e| e.bucket == bucket), "{got:?}");
    for want in [
        (key.to_string(), EventKind::Created),
        ("dir/copy of.txt".to_string(), EventKind::Created),
        ("multi/part.bin".to_string(), EventKind::Created),
        (key.to_string(), EventKind::Removed),
    ] {
        assert!(summary.contains(&want), "{want:?} in {summary:?}");
    }
    let put = got.iter().find(|e| e.key == key && e.kind == EventKind::Created).unwrap();
    assert_eq!(put.size, Some(5));
    assert!(put.event_time_ms.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_to_sns_to_sqs_enveloped_and_raw() {
    let moto = Moto::get();
    let c = conf(&moto.endpoint);
    let bucket = unique_name("sb");
    let s3s = S3Storage::connect(&c, &bucket).await.unwrap();
    s3s.client().create_bucket().bucket(&bucket).send().await.unwrap();
    let sdk = sdk_config(&c).await.unwrap();
    let sns = aws_sdk_sns::Client::new(&sdk);
    let topic = sns.create_topic().name(unique_name("t")).send().await.unwrap().topic_arn().unwrap().to_string();
    let sqs = client(&c).await.unwrap();
    let (enveloped_url, enveloped_arn) = queue(&sqs).await;
    let (raw_url, raw_arn) = queue(&sqs).await;
    sns.subscribe().topic_arn(&topic).protocol("sqs").endpoint(&enveloped_arn).send().await.unwrap();
    sns.subscribe()
        .topic_arn(&topic)
        .protocol("sqs")
        .endpoint(&raw_arn)
        .attributes("RawMessageDelivery", "true")
        .send()
        .await
        .unwrap();
    let tc = TopicConfiguration::builder()
        .topic_arn(&topic)
        .events(Event::S3ObjectCreated)
        .events(Event::S3ObjectRemoved)
        .build()
        .unwrap();
    let nc = NotificationConfiguration::builder().topic_configurations(tc).build();
    s3s.client()
        .put_bucket_notification_configuration()
        .bucket(&bucket)
        .notification_configuration(nc)
        .send()
        .await
        .unwrap();

    s3s.put("fan/out ü+.txt", Bytes::from_static(b"x"), Default::default()).await.unwrap();
    s3s.delete("fan/out ü+.txt").await.unwrap();
    for url in [enveloped_url, raw_url] {
        let source = SqsSource::new(sqs.clone(), url.clone());
        let decoded = drain(&source, 3, Duration::from_secs(20)).await;
        let evs = events(&decoded);
        for kind in [EventKind::Created, EventKind::Removed] {
            assert!(
                evs.iter().any(|e| e.key == "fan/out ü+.txt" && e.kind == kind && e.bucket == bucket),
                "{url}: {kind:?} in {decoded:?}"
            );
        }
        assert!(!decoded.iter().any(|d| matches!(d, Decoded::Malformed { .. })), "{url}: {decoded:?}");
    }
}

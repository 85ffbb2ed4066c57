//! The EventSource conformance suite against SQS (moto), and SQS's own failure behaviour.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tidemark_cloud::aws::sqs::{SqsSource, client};
use tidemark_cloud::event_conformance::{EventHarness, Producer};
use tidemark_core::events::EventSource;
use tidemark_core::remote::{RemoteConf, StorageKind};
use tidemark_testkit::{Moto, free_port, unique_name};

pub fn conf(endpoint: &str) -> RemoteConf {
    let settings =
        [("endpoint", endpoint), ("access_key", "testing"), ("secret_key", "testing"), ("region", "us-east-1")];
    RemoteConf {
        name: "moto".into(),
        kind: StorageKind::S3,
        settings: settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    }
}

struct SqsProducer {
    client: aws_sdk_sqs::Client,
    url: String,
}

#[async_trait]
impl Producer for SqsProducer {
    async fn send(&self, body: &str) {
        self.client.send_message().queue_url(&self.url).message_body(body).send().await.unwrap();
    }
}

async fn sqs() -> EventHarness {
    let moto = Moto::get();
    let c = client(&conf(&moto.endpoint)).await.unwrap();
    let url = c
        .create_queue()
        .queue_name(unique_name("q"))
        .attributes(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout, "2")
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string();
    EventHarness {
        source: Arc::new(SqsSource::new(c.clone(), url.clone())),
        producer: Arc::new(SqsProducer { client: c, url }),
        visibility: Duration::from_secs(2),
        guard: Box::new(moto),
    }
}

tidemark_cloud::event_source_conformance!(sqs());

#[tokio::test]
async fn a_missing_queue_is_named_and_retries_back_off() {
    let moto = Moto::get();
    let c = client(&conf(&moto.endpoint)).await.unwrap();
    let url = format!("{}/123456789012/no-such-queue", moto.endpoint);
    let source = SqsSource::new(c, url);
    let err = source.receive(10, Duration::ZERO).await.unwrap_err();
    assert!(err.to_string().contains("no-such-queue"), "{err}");
    // The next receives wait before asking again: no tight loop.
    let t = Instant::now();
    let _ = source.receive(10, Duration::ZERO).await;
    let _ = source.receive(10, Duration::ZERO).await;
    assert!(t.elapsed() >= Duration::from_millis(1400), "backed off 0.5 s then 1 s, took {:?}", t.elapsed());
}

#[tokio::test]
async fn an_unreachable_endpoint_is_retryable() {
    let c = client(&conf(&format!("http://127.0.0.1:{}", free_port()))).await.unwrap();
    let source = SqsSource::new(c, "http://127.0.0.1:1/000000000000/q");
    let err = source.receive(1, Duration::ZERO).await.unwrap_err();
    assert!(err.is_retryable() && err.to_string().contains("cannot reach"), "{err}");
}

//! The `EventSource` conformance suite. Each queue adapter's tests invoke
//! [`event_source_conformance!`] with a factory that creates a fresh queue on its real emulator,
//! with a short visibility timeout, and a way to put messages on it.

use std::any::Any;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use tidemark_core::events::{Delivery, EventSource};

/// Puts a message on the queue under test, as a producer would.
#[async_trait]
pub trait Producer: Send + Sync {
    async fn send(&self, body: &str);
}

pub struct EventHarness {
    pub source: Arc<dyn EventSource>,
    pub producer: Arc<dyn Producer>,
    /// The queue's visibility timeout (or ack deadline); the suite waits past it.
    pub visibility: Duration,
    pub guard: Box<dyn Any + Send + Sync>,
}

#[macro_export]
macro_rules! event_source_conformance {
    ($factory:expr) => {
        $crate::event_source_conformance!(@each $factory;
            receive_then_ack_removes, unacked_deliveries_come_back_with_a_higher_count,
            extend_prevents_redelivery, release_makes_it_visible_again, batch_limits_are_honoured,
            acking_twice_or_late_is_not_an_error);
    };
    (@each $factory:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let harness = $factory.await;
                $crate::event_conformance::$name(&harness).await;
            }
        )*
    };
}

/// Receives until `n` deliveries arrived or `within` passed.
async fn receive_n(h: &EventHarness, n: usize, within: Duration) -> Vec<Delivery> {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    while got.len() < n && Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        let batch = h.source.receive(n - got.len(), left.min(Duration::from_secs(2))).await.expect("receive");
        got.extend(batch);
    }
    got
}

fn bodies(d: &[Delivery]) -> BTreeSet<String> {
    d.iter().map(|d| String::from_utf8_lossy(&d.body).into_owned()).collect()
}

fn ids(d: &[Delivery]) -> Vec<String> {
    d.iter().map(|d| d.ack_id.clone()).collect()
}

pub async fn receive_then_ack_removes(h: &EventHarness) {
    for b in ["one", "two", "three"] {
        h.producer.send(b).await;
    }
    let got = receive_n(h, 3, Duration::from_secs(20)).await;
    assert_eq!(bodies(&got), ["one", "three", "two"].iter().map(|s| s.to_string()).collect());
    assert!(got.iter().all(|d| d.receive_count == 1), "first deliveries count 1: {got:?}");
    let report = h.source.ack(&ids(&got)).await.unwrap();
    assert_eq!(report.acked.len(), 3, "{report:?}");
    assert!(report.failed.is_empty());
    tokio::time::sleep(h.visibility + Duration::from_millis(500)).await;
    assert!(receive_n(h, 1, Duration::from_secs(2)).await.is_empty(), "acknowledged messages never come back");
}

pub async fn unacked_deliveries_come_back_with_a_higher_count(h: &EventHarness) {
    h.producer.send("again").await;
    let first = receive_n(h, 1, Duration::from_secs(20)).await;
    assert_eq!(first.len(), 1);
    assert!(receive_n(h, 1, Duration::from_millis(200)).await.is_empty(), "invisible while in flight");
    tokio::time::sleep(h.visibility + Duration::from_millis(500)).await;
    let second = receive_n(h, 1, Duration::from_secs(20)).await;
    assert_eq!(bodies(&second), bodies(&first));
    assert_eq!(second[0].receive_count, 2, "the redelivery counts 2");
    h.source.ack(&ids(&second)).await.unwrap();
}

pub async fn extend_prevents_redelivery(h: &EventHarness) {
    h.producer.send("long job").await;
    let got = receive_n(h, 1, Duration::from_secs(20)).await;
    h.source.extend(&got[0].ack_id, h.visibility * 4).await.unwrap();
    tokio::time::sleep(h.visibility + Duration::from_millis(500)).await;
    assert!(receive_n(h, 1, Duration::from_secs(1)).await.is_empty(), "an extended delivery stays invisible");
    let r = h.source.ack(&ids(&got)).await.unwrap();
    assert_eq!(r.acked.len(), 1, "{r:?}");
}

pub async fn release_makes_it_visible_again(h: &EventHarness) {
    h.producer.send("retry me").await;
    let got = receive_n(h, 1, Duration::from_secs(20)).await;
    h.source.release(&got[0].ack_id, Duration::ZERO).await.unwrap();
    let again = receive_n(h, 1, Duration::from_secs(10)).await;
    assert_eq!(bodies(&again), bodies(&got), "released at once");
    assert_eq!(again[0].receive_count, 2);
    h.source.ack(&ids(&again)).await.unwrap();
}

pub async fn batch_limits_are_honoured(h: &EventHarness) {
    let n = h.source.max_batch() + 5;
    for i in 0..n {
        h.producer.send(&format!("m{i}")).await;
    }
    let mut all = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while all.len() < n && Instant::now() < deadline {
        let batch = h.source.receive(1000, Duration::from_secs(1)).await.unwrap();
        assert!(batch.len() <= h.source.max_batch(), "a receive returns at most max_batch ({})", batch.len());
        all.extend(batch);
    }
    assert_eq!(bodies(&all).len(), n, "every message arrives");
    let small = receive_n(h, 0, Duration::ZERO).await;
    assert!(small.is_empty());
    let r = h.source.ack(&ids(&all)).await.unwrap();
    assert_eq!(r.acked.len() + r.gone.len(), n, "{r:?}");
}

pub async fn acking_twice_or_late_is_not_an_error(h: &EventHarness) {
    h.producer.send("twice").await;
    let got = receive_n(h, 1, Duration::from_secs(20)).await;
    h.source.ack(&ids(&got)).await.unwrap();
    h.source.ack(&ids(&got)).await.expect("acking an acknowledged message is not an error");

    h.producer.send("late").await;
    let first = receive_n(h, 1, Duration::from_secs(20)).await;
    tokio::time::sleep(h.visibility + Duration::from_millis(500)).await;
    let second = receive_n(h, 1, Duration::from_secs(20)).await;
    assert_eq!(second.len(), 1);
    h.source.ack(&ids(&first)).await.expect("acking with an expired receipt is not an error");
    h.source.ack(&ids(&second)).await.unwrap();
}

//! A queue with the at-least-once contract of SQS, on the simulation's clock: messages become
//! visible at a time (delays), a delivery hides a message for the visibility timeout, an
//! unacknowledged one comes back with a higher receive count, receipts of earlier deliveries
//! are stale, and the order of a receive is shuffled (reordering).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use tidemark_core::events::{AckReport, Delivery, EventSource};
use tidemark_core::{Clock, ManualClock, Result};

use crate::rng::Rng;

#[derive(Debug, Clone)]
pub struct Message {
    pub id: u64,
    pub body: Bytes,
    /// What the message tells of (the key and the bucket version it was sent for).
    pub key: String,
    pub version: u64,
    visible_at_ms: i64,
    /// When it was sent: the time of the change it reports (a delay holds it back after that).
    sent_at_ms: i64,
    receive_count: u32,
    /// The receipt of the delivery in flight, if any.
    receipt: Option<String>,
}

#[derive(Default)]
struct Inner {
    messages: BTreeMap<u64, Message>,
    next_id: u64,
    deliveries: u64,
    acked: u64,
}

#[derive(Clone)]
pub struct SimQueue {
    inner: Arc<Mutex<Inner>>,
    clock: ManualClock,
    rng: Arc<Mutex<Rng>>,
    visibility: Duration,
}

impl SimQueue {
    pub fn new(clock: ManualClock, seed: u64, visibility: Duration) -> Self {
        SimQueue { inner: Arc::default(), clock, rng: Arc::new(Mutex::new(Rng::new(seed ^ 0x51))), visibility }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn send(&self, body: Bytes, key: &str, version: u64, delay_ms: i64) {
        let mut q = self.lock();
        q.next_id += 1;
        let id = q.next_id;
        let sent_at_ms = self.clock.now_ms();
        let visible_at_ms = sent_at_ms + delay_ms;
        q.messages.insert(
            id,
            Message {
                id,
                body,
                key: key.to_string(),
                version,
                visible_at_ms,
                sent_at_ms,
                receive_count: 0,
                receipt: None,
            },
        );
    }

    /// The message a receipt belongs to, while that receipt is current.
    pub fn message_of(&self, receipt: &str) -> Option<Message> {
        self.lock().messages.values().find(|m| m.receipt.as_deref() == Some(receipt)).cloned()
    }

    /// Messages a receive could return now.
    pub fn visible_len(&self) -> usize {
        let now = self.clock.now_ms();
        self.lock().messages.values().filter(|m| m.visible_at_ms <= now).count()
    }

    pub fn len(&self) -> usize {
        self.lock().messages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn deliveries(&self) -> u64 {
        self.lock().deliveries
    }
}

#[async_trait]
impl EventSource for SimQueue {
    fn describe(&self) -> String {
        "sim:queue".into()
    }

    fn max_batch(&self) -> usize {
        10
    }

    async fn receive(&self, max: usize, _wait: Duration) -> Result<Vec<Delivery>> {
        let now = self.clock.now_ms();
        let mut q = self.lock();
        let mut visible: Vec<u64> = q.messages.values().filter(|m| m.visible_at_ms <= now).map(|m| m.id).collect();
        // Shuffle: a queue promises no order.
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        for i in (1..visible.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            visible.swap(i, j);
        }
        visible.truncate(max.min(self.max_batch()));
        let mut out = Vec::new();
        for id in visible {
            q.deliveries += 1;
            let m = q.messages.get_mut(&id).expect("listed above");
            m.receive_count += 1;
            m.visible_at_ms = now + self.visibility.as_millis() as i64;
            let receipt = format!("r{id}-{}", m.receive_count);
            m.receipt = Some(receipt.clone());
            out.push(Delivery {
                ack_id: receipt,
                body: m.body.clone(),
                attributes: Default::default(),
                receive_count: m.receive_count,
                sent_at_ms: Some(m.sent_at_ms),
            });
        }
        Ok(out)
    }

    async fn ack(&self, ack_ids: &[String]) -> Result<AckReport> {
        let mut q = self.lock();
        let mut r = AckReport::default();
        for id in ack_ids {
            let found = q.messages.values().find(|m| m.receipt.as_deref() == Some(id.as_str())).map(|m| m.id);
            match found {
                Some(mid) => {
                    q.messages.remove(&mid);
                    q.acked += 1;
                    r.acked.push(id.clone());
                }
                None => r.gone.push(id.clone()),
            }
        }
        Ok(r)
    }

    async fn extend(&self, ack_id: &str, by: Duration) -> Result<()> {
        let now = self.clock.now_ms();
        let mut q = self.lock();
        if let Some(m) = q.messages.values_mut().find(|m| m.receipt.as_deref() == Some(ack_id)) {
            m.visible_at_ms = now + by.as_millis() as i64;
        }
        Ok(())
    }

    async fn release(&self, ack_id: &str, delay: Duration) -> Result<()> {
        let now = self.clock.now_ms();
        let mut q = self.lock();
        if let Some(m) = q.messages.values_mut().find(|m| m.receipt.as_deref() == Some(ack_id)) {
            m.visible_at_ms = now + delay.as_millis() as i64;
            m.receipt = None;
        }
        Ok(())
    }
}

//! The backoff every event source keeps between failed receives: after an error, the next
//! `receive` waits (0.5 s doubling to 60 s) before it asks again, so a caller looping on
//! `receive` never spins against a missing queue or a refusing endpoint.

use std::sync::Mutex;
use std::time::Duration;

use tidemark_core::Result;
use tidemark_core::backoff::Backoff;

pub struct ReceiveBackoff(Mutex<Backoff>);

impl Default for ReceiveBackoff {
    fn default() -> Self {
        ReceiveBackoff(Mutex::new(Backoff::new(Duration::from_millis(500), Duration::from_secs(60))))
    }
}

impl ReceiveBackoff {
    /// Waits as long as the last failures ask for (not at all after a success).
    pub async fn pause(&self) {
        let wait = self.0.lock().map(|b| b.current()).unwrap_or_default();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    /// Records the outcome of a receive, logging a failure with `source`; passes it on.
    pub fn record<T>(&self, source: &str, r: Result<T>) -> Result<T> {
        if let Ok(mut b) = self.0.lock() {
            match &r {
                Ok(_) => b.succeed(),
                Err(e) => {
                    let wait = b.fail();
                    tracing::warn!(%source, error = %e, retry_in_ms = wait.as_millis() as u64, "receive failed");
                }
            }
        }
        r
    }
}

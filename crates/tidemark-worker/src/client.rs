//! The admin's worker API (`/api/v1/workers/...`) as a client. Failing to reach the admin is
//! `Unavailable`, naming the address; the admin's own refusals arrive as the same `Error`s (a
//! standby admin's refusal is `Unavailable` too: the next admin of a list is tried).

use std::time::Duration;

use reqwest::RequestBuilder;
use serde::Serialize;
use serde::de::DeserializeOwned;

use tidemark_core::error::ErrorBody;
use tidemark_core::jobs::{Heartbeat, HeartbeatReply, JobReport, Register, RegisterReply};
use tidemark_core::{Error, Result};

/// A client of one admin, or of several (`A,B`): calls go to the admin that last answered;
/// one that cannot be reached, or stands by (not the active admin), is passed over for the next.
/// Every call is safe to send again (a registration, a heartbeat, a report, a leave).
#[derive(Clone, Debug)]
pub struct AdminClient {
    bases: std::sync::Arc<Vec<String>>,
    current: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    token: Option<String>,
    client: reqwest::Client,
}

impl AdminClient {
    /// `addr` is `host:port` or a URL (`http://host:port`), or several separated by commas.
    pub fn new(addr: &str, token: Option<String>) -> Result<Self> {
        let bases = tidemark_http::base_urls(addr, "admin").map_err(Error::invalid_argument)?;
        let client = tidemark_http::tls::client_builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(15))
            .build()
            .map_err(|e| Error::internal(format!("building the HTTP client: {e}")))?;
        Ok(AdminClient {
            bases: std::sync::Arc::new(bases),
            current: Default::default(),
            token: token.filter(|t| !t.is_empty()),
            client,
        })
    }

    /// The admin calls go to now.
    pub fn base(&self) -> &str {
        &self.bases[self.current.load(std::sync::atomic::Ordering::Relaxed) % self.bases.len()]
    }

    fn post(&self, base: &str, endpoint: &str) -> RequestBuilder {
        let rb = self.client.post(format!("{base}/api/v1/{endpoint}"));
        match &self.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    async fn call<B: Serialize, T: DeserializeOwned>(&self, endpoint: &str, body: &B) -> Result<T> {
        use std::sync::atomic::Ordering;
        let mut last = None;
        for _ in 0..self.bases.len() {
            let i = self.current.load(Ordering::Relaxed);
            let base = &self.bases[i % self.bases.len()];
            match self.call_one(base, endpoint, body).await {
                // Unreachable, or standing by: the next admin of the list, if there is one.
                Err(e @ Error::Unavailable { .. }) if self.bases.len() > 1 => {
                    if self.current.compare_exchange(i, i + 1, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                        tracing::info!(from = %base, reason = %e, "trying the next admin");
                    }
                    last = Some(e);
                }
                other => return other,
            }
        }
        Err(last.unwrap_or_else(|| Error::internal("no admin to call")))
    }

    async fn call_one<B: Serialize, T: DeserializeOwned>(&self, base: &str, endpoint: &str, body: &B) -> Result<T> {
        let unreachable = |e: reqwest::Error| Error::Unavailable {
            message: format!("cannot reach the admin at {base}: {e} (is `tidemark admin` running there?)"),
        };
        let resp = self.post(base, endpoint).json(body).send().await.map_err(unreachable)?;
        let status = resp.status();
        if status.is_success() {
            return resp.json().await.map_err(unreachable);
        }
        let text = resp.text().await.unwrap_or_default();
        match serde_json::from_str::<ErrorBody>(&text) {
            Ok(b) => Err(b.error),
            Err(_) => Err(Error::Unavailable { message: format!("the admin at {base} answered {status}") }),
        }
    }

    pub async fn register(&self, r: &Register) -> Result<RegisterReply> {
        self.call("workers/register", r).await
    }

    pub async fn heartbeat(&self, worker_id: &str, hb: &Heartbeat) -> Result<HeartbeatReply> {
        self.call(&format!("workers/{worker_id}/heartbeat"), hb).await
    }

    pub async fn report(&self, worker_id: &str, r: &JobReport) -> Result<serde_json::Value> {
        self.call(&format!("workers/{worker_id}/report"), r).await
    }

    pub async fn leave(&self, worker_id: &str) -> Result<serde_json::Value> {
        self.call(&format!("workers/{worker_id}/leave"), &serde_json::json!({})).await
    }
}

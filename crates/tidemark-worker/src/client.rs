//! The admin's worker API (`/api/v1/workers/...`) as a client. Failing to reach the admin is
//! `Unavailable`, naming the address; the admin's own refusals arrive as the same `Error`s.

use std::time::Duration;

use reqwest::RequestBuilder;
use serde::Serialize;
use serde::de::DeserializeOwned;

use tidemark_core::error::ErrorBody;
use tidemark_core::jobs::{Heartbeat, HeartbeatReply, JobReport, Register, RegisterReply};
use tidemark_core::{Error, Result};

#[derive(Clone, Debug)]
pub struct AdminClient {
    base: String,
    token: Option<String>,
    client: reqwest::Client,
}

impl AdminClient {
    /// `addr` is `host:port` or a URL (`http://host:port`).
    pub fn new(addr: &str, token: Option<String>) -> Result<Self> {
        let base = if addr.starts_with("http://") || addr.starts_with("https://") {
            addr.trim_end_matches('/').to_string()
        } else {
            format!("http://{addr}")
        };
        reqwest::Url::parse(&base).map_err(|e| Error::invalid_argument(format!("bad admin address {addr:?}: {e}")))?;
        let client = tidemark_http::tls::client_builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(15))
            .build()
            .map_err(|e| Error::internal(format!("building the HTTP client: {e}")))?;
        Ok(AdminClient { base, token: token.filter(|t| !t.is_empty()), client })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    fn post(&self, endpoint: &str) -> RequestBuilder {
        let rb = self.client.post(format!("{}/api/v1/{endpoint}", self.base));
        match &self.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    async fn call<B: Serialize, T: DeserializeOwned>(&self, endpoint: &str, body: &B) -> Result<T> {
        let unreachable = |e: reqwest::Error| Error::Unavailable {
            message: format!("cannot reach the admin at {}: {e} (is `tidemark admin` running there?)", self.base),
        };
        let resp = self.post(endpoint).json(body).send().await.map_err(unreachable)?;
        let status = resp.status();
        if status.is_success() {
            return resp.json().await.map_err(unreachable);
        }
        let text = resp.text().await.unwrap_or_default();
        match serde_json::from_str::<ErrorBody>(&text) {
            Ok(b) => Err(b.error),
            Err(_) => Err(Error::Unavailable { message: format!("the admin at {} answered {status}", self.base) }),
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

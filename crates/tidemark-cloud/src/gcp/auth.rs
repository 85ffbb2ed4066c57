//! Bearer tokens for Google APIs.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use reqwest::RequestBuilder;
use serde::Deserialize;

use tidemark_core::remote::RemoteConf;
use tidemark_core::{Error, Result};

const METADATA_TOKEN: &str =
    "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token";

pub enum Auth {
    /// An emulator: no credentials.
    None,
    /// A token given in the configuration.
    Static(String),
    /// The metadata server of a Google Cloud machine, cached until shortly before expiry.
    Metadata(Mutex<Option<(String, Instant)>>),
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    expires_in: u64,
}

impl Auth {
    /// Emulators (an endpoint set, no token) need no credentials.
    pub fn from_conf(conf: &RemoteConf, endpoint_set: bool) -> Auth {
        match conf.setting("access_token") {
            Some(t) => Auth::Static(t.to_string()),
            None if endpoint_set => Auth::None,
            None => Auth::Metadata(Mutex::new(None)),
        }
    }

    pub async fn apply(&self, http: &reqwest::Client, rb: RequestBuilder) -> Result<RequestBuilder> {
        match self {
            Auth::None => Ok(rb),
            Auth::Static(t) => Ok(rb.bearer_auth(t)),
            Auth::Metadata(cache) => {
                if let Some((t, until)) = cache.lock().ok().and_then(|c| c.clone())
                    && Instant::now() < until
                {
                    return Ok(rb.bearer_auth(t));
                }
                let resp = http
                    .get(METADATA_TOKEN)
                    .header("Metadata-Flavor", "Google")
                    .timeout(Duration::from_secs(5))
                    .send()
                    .await
                    .map_err(|e| Error::Unauthorized {
                        message: format!(
                            "no Google credentials: set -gcs.access_token, or run on a Google Cloud machine (metadata server: {e})"
                        ),
                    })?;
                let token: TokenResponse = resp.json().await.map_err(|e| Error::Unauthorized {
                    message: format!("the metadata server's token answer is unreadable: {e}"),
                })?;
                let until = Instant::now() + Duration::from_secs(token.expires_in.saturating_sub(60));
                if let Ok(mut c) = cache.lock() {
                    *c = Some((token.access_token.clone(), until));
                }
                Ok(rb.bearer_auth(token.access_token))
            }
        }
    }
}

/// Turns a failed Google API answer into an error that names the call and what to fix.
pub async fn check(resp: reqwest::Response, op: &str, target: &str) -> Result<reqwest::Response> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let body = resp.text().await.unwrap_or_default();
    let message = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("error")?.get("message")?.as_str().map(str::to_string))
        .unwrap_or_else(|| body.lines().next().unwrap_or("").to_string());
    Err(match status.as_u16() {
        404 => Error::NotFound { path: format!("{target} ({message})") },
        412 => Error::PreconditionFailed { path: target.to_string(), current: None },
        401 | 403 => Error::Unauthorized {
            message: format!("{op} {target} was refused: {message}; check the remote's credentials"),
        },
        s if s >= 500 || s == 429 => {
            Error::Unavailable { message: format!("{op} {target}: Google answered {s}: {message}") }
        }
        s => Error::internal(format!("{op} {target}: Google answered {s}: {message}")),
    })
}

pub fn transport(op: &str, target: &str, endpoint: &str, e: reqwest::Error) -> Error {
    let mut cause: &dyn std::error::Error = &e;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    Error::Unavailable {
        message: format!("{op} {target}: cannot reach {endpoint} ({cause}); check the remote's endpoint"),
    }
}

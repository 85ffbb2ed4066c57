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
    /// A service account key: a signed JWT exchanged for an access token, cached.
    ServiceAccount { key: Box<ServiceAccountKey>, cache: Mutex<Option<(String, Instant)>> },
    /// The metadata server of a Google Cloud machine, cached until shortly before expiry.
    Metadata(Mutex<Option<(String, Instant)>>),
}

/// The parts of a service account key file Tidemark uses.
#[derive(Deserialize, Clone)]
pub struct ServiceAccountKey {
    pub client_email: String,
    pub private_key: String,
    #[serde(default = "default_token_uri")]
    pub token_uri: String,
}

fn default_token_uri() -> String {
    "https://oauth2.googleapis.com/token".into()
}

/// What Tidemark asks for: objects (read and write), Pub/Sub, and reading projects (Resource
/// Manager's `projects.get`, for the project's number when dead letters are provisioned: its
/// reference accepts `cloudplatformprojects.readonly`, the narrowest scope that reads a project).
const SCOPES: &str = "https://www.googleapis.com/auth/devstorage.read_write https://www.googleapis.com/auth/pubsub \
                      https://www.googleapis.com/auth/cloudplatformprojects.readonly";

#[derive(serde::Serialize)]
struct Claims<'a> {
    iss: &'a str,
    scope: &'a str,
    aud: &'a str,
    iat: u64,
    exp: u64,
}

impl ServiceAccountKey {
    /// Reads `service_account_json`: the key file's path, or the JSON itself.
    pub fn load(setting: &str) -> Result<Self> {
        let text = if setting.trim_start().starts_with('{') {
            setting.to_string()
        } else {
            std::fs::read_to_string(setting)
                .map_err(|e| Error::invalid_argument(format!("-gcs.service_account_json: reading {setting}: {e}")))?
        };
        serde_json::from_str(&text).map_err(|e| {
            Error::invalid_argument(format!("-gcs.service_account_json is not a service account key: {e}"))
        })
    }

    /// The signed JWT assertion of the OAuth 2.0 JWT bearer flow.
    pub fn assertion(&self, now_secs: u64) -> Result<String> {
        let claims = Claims {
            iss: &self.client_email,
            scope: SCOPES,
            aud: &self.token_uri,
            iat: now_secs,
            exp: now_secs + 3600,
        };
        let key = jsonwebtoken::EncodingKey::from_rsa_pem(self.private_key.as_bytes()).map_err(|e| {
            Error::invalid_argument(format!("the service account's private_key is not an RSA PEM key: {e}"))
        })?;
        jsonwebtoken::encode(&jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256), &claims, &key)
            .map_err(|e| Error::internal(format!("signing the service account assertion: {e}")))
    }
}

async fn cached_or<F>(cache: &Mutex<Option<(String, Instant)>>, fetch: F) -> Result<String>
where
    F: std::future::Future<Output = Result<TokenResponse>>,
{
    if let Some((t, until)) = cache.lock().ok().and_then(|c| c.clone())
        && Instant::now() < until
    {
        return Ok(t);
    }
    let token = fetch.await?;
    let until = Instant::now() + Duration::from_secs(token.expires_in.saturating_sub(60));
    if let Ok(mut c) = cache.lock() {
        *c = Some((token.access_token.clone(), until));
    }
    Ok(token.access_token)
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    expires_in: u64,
}

/// Whether the remote's endpoints are the emulators (`-gcs.emulator=true`: fake-gcs-server,
/// the Pub/Sub emulator), which take no credentials. Only this setting — or Google's own
/// `PUBSUB_EMULATOR_HOST`, for Pub/Sub — turns credentials off: a custom endpoint alone (a
/// regional or Private Service Connect one) is Google, and is sent the remote's credentials.
pub fn emulator(conf: &RemoteConf) -> Result<bool> {
    match conf.setting("emulator") {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(Error::invalid_argument(format!(
            "-gcs.emulator={other:?}: true (the endpoints are emulators: no credentials) or false"
        ))),
    }
}

impl Auth {
    /// In order: none for an emulator (`emulator`: `-gcs.emulator=true`, or Pub/Sub's
    /// `PUBSUB_EMULATOR_HOST`), a configured token, a service account key, else the metadata
    /// server of a Google Cloud machine. An emulator with credentials configured is a
    /// contradiction, refused.
    pub fn from_conf(conf: &RemoteConf, emulator: bool) -> Result<Auth> {
        let configured = ["access_token", "service_account_json"].into_iter().find(|s| conf.setting(s).is_some());
        if emulator {
            if let (Some(s), Ok(true)) = (configured, self::emulator(conf)) {
                return Err(Error::invalid_argument(format!(
                    "-gcs.emulator=true sends no credentials, yet -gcs.{s} is set: leave out one of them"
                )));
            }
            return Ok(Auth::None);
        }
        if let Some(t) = conf.setting("access_token") {
            return Ok(Auth::Static(t.to_string()));
        }
        if let Some(sa) = conf.setting("service_account_json") {
            return Ok(Auth::ServiceAccount { key: Box::new(ServiceAccountKey::load(sa)?), cache: Mutex::new(None) });
        }
        Ok(Auth::Metadata(Mutex::new(None)))
    }

    pub async fn apply(&self, http: &reqwest::Client, rb: RequestBuilder) -> Result<RequestBuilder> {
        match self {
            Auth::None => Ok(rb),
            Auth::Static(t) => Ok(rb.bearer_auth(t)),
            Auth::Metadata(cache) => {
                let token = cached_or(cache, async {
                    let resp = http
                        .get(METADATA_TOKEN)
                        .header("Metadata-Flavor", "Google")
                        .timeout(Duration::from_secs(5))
                        .send()
                        .await
                        .map_err(|e| Error::Unauthorized {
                            message: format!(
                                "no Google credentials: set -gcs.service_account_json or -gcs.access_token, or run on a Google Cloud machine (metadata server: {e}); for the emulators, set -gcs.emulator=true"
                            ),
                        })?;
                    resp.json().await.map_err(|e| Error::Unauthorized { message: format!("the metadata server's token answer is unreadable: {e}") })
                })
                .await?;
                Ok(rb.bearer_auth(token))
            }
            Auth::ServiceAccount { key, cache } => {
                let token = cached_or(cache, async {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0);
                    let assertion = key.assertion(now)?;
                    let resp = http
                        .post(&key.token_uri)
                        .form(&[
                            ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
                            ("assertion", assertion.as_str()),
                        ])
                        .timeout(Duration::from_secs(10))
                        .send()
                        .await
                        .map_err(|e| transport("token exchange", &key.client_email, &key.token_uri, e))?;
                    let resp = check(resp, "token exchange for", &key.client_email).await?;
                    resp.json().await.map_err(|e| Error::Unauthorized {
                        message: format!("the token endpoint's answer is unreadable: {e}"),
                    })
                })
                .await?;
                Ok(rb.bearer_auth(token))
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
    Err(google_error(status.as_u16(), &body, op, target))
}

/// The error of a refused Google API call (`status`, its `body`), naming the call and what to fix.
pub fn google_error(status: u16, body: &str, op: &str, target: &str) -> Error {
    let message = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("error")?.get("message")?.as_str().map(str::to_string))
        .unwrap_or_else(|| body.lines().next().unwrap_or("").to_string());
    match status {
        // An object encrypted with a customer-supplied key, read without it: refused for good.
        400 if message.contains("customer-supplied encryption key") => {
            Error::Unreadable { path: target.to_string(), reason: tidemark_core::remote::CSEK_REASON.into() }
        }
        404 => Error::NotFound { path: format!("{target} ({message})") },
        412 => Error::PreconditionFailed { path: target.to_string(), current: None },
        401 | 403 => Error::Unauthorized {
            message: format!("{op} {target} was refused: {message}; check the remote's credentials"),
        },
        s if s >= 500 || s == 429 => {
            Error::Unavailable { message: format!("{op} {target}: Google answered {s}: {message}") }
        }
        s => Error::internal(format!("{op} {target}: Google answered {s}: {message}")),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A download of a customer-encrypted object without its key is refused for good, with the
    /// reason; another 400 stays what it was.
    #[test]
    fn a_customer_key_refusal_is_unreadable() {
        let body = r#"{"error":{"code":400,"message":"The target object is encrypted by a customer-supplied encryption key."}}"#;
        match google_error(400, body, "GetObject", "gs://b/k") {
            Error::Unreadable { reason, .. } => assert_eq!(reason, tidemark_core::remote::CSEK_REASON),
            other => panic!("{other:?}"),
        }
        assert!(!matches!(
            google_error(400, r#"{"error":{"message":"Invalid argument"}}"#, "x", "y"),
            Error::Unreadable { .. }
        ));
    }
}

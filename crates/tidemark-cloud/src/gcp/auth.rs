//! Bearer tokens for Google APIs, from Google's own `google-cloud-auth`: Application Default
//! Credentials (`GOOGLE_APPLICATION_CREDENTIALS`, gcloud's file, the metadata server of a Google
//! Cloud machine or of GKE's workload identity), or a credentials file given in the remote's
//! settings — a service account key, an authorized user, an external account (workload identity
//! federation: a token from AWS, Azure, Kubernetes or any OIDC provider exchanged at Google's
//! STS), or an impersonated service account. The crate caches each token and refreshes it before
//! it expires.

use google_cloud_auth::credentials::{
    AccessTokenCredentials, external_account, impersonated, service_account, user_account,
};
use reqwest::RequestBuilder;

use tidemark_core::remote::RemoteConf;
use tidemark_core::{Error, Result};

pub enum Auth {
    /// An emulator: no credentials.
    None,
    /// A token given in the configuration.
    Static(String),
    /// Google's credentials: where they came from (for errors), and the credentials.
    Google { from: String, credentials: AccessTokenCredentials },
}

/// What Tidemark asks for: objects (read and write), Pub/Sub, and reading projects (Resource
/// Manager's `projects.get`, for the project's number when dead letters are provisioned: its
/// reference accepts `cloudplatformprojects.readonly`, the narrowest scope that reads a project).
const SCOPES: [&str; 3] = [
    "https://www.googleapis.com/auth/devstorage.read_write",
    "https://www.googleapis.com/auth/pubsub",
    "https://www.googleapis.com/auth/cloudplatformprojects.readonly",
];

/// Reads `service_account_json` (the file's path, or the JSON itself): any credentials file
/// Google's tools write, told apart by its `type`.
fn credentials_file(setting: &str) -> Result<AccessTokenCredentials> {
    let text = if setting.trim_start().starts_with('{') {
        setting.to_string()
    } else {
        std::fs::read_to_string(setting)
            .map_err(|e| Error::invalid_argument(format!("-gcs.service_account_json: reading {setting}: {e}")))?
    };
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::invalid_argument(format!("-gcs.service_account_json is not a credentials file: {e}")))?;
    let built = match json["type"].as_str().unwrap_or_default() {
        "service_account" => service_account::Builder::new(json)
            .with_access_specifier(service_account::AccessSpecifier::from_scopes(SCOPES))
            .build_access_token_credentials(),
        "authorized_user" => user_account::Builder::new(json).with_scopes(SCOPES).build_access_token_credentials(),
        "external_account" => external_account::Builder::new(json).with_scopes(SCOPES).build_access_token_credentials(),
        "impersonated_service_account" => {
            impersonated::Builder::new(json).with_scopes(SCOPES).build_access_token_credentials()
        }
        other => {
            return Err(Error::invalid_argument(format!(
                "-gcs.service_account_json: a credentials file of type {other:?} is not one Tidemark takes: give a \
                 service_account key, an authorized_user, an external_account (workload identity federation) or an \
                 impersonated_service_account file"
            )));
        }
    };
    built.map_err(|e| Error::invalid_argument(format!("-gcs.service_account_json: {e}")))
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
    /// `PUBSUB_EMULATOR_HOST`), a configured token, a configured credentials file, else
    /// Application Default Credentials. An emulator with credentials configured is a
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
        if let Some(file) = conf.setting("service_account_json") {
            return Ok(Auth::Google { from: "-gcs.service_account_json".into(), credentials: credentials_file(file)? });
        }
        let credentials = google_cloud_auth::credentials::Builder::default()
            .with_scopes(SCOPES)
            .build_access_token_credentials()
            .map_err(|e| Error::invalid_argument(format!("Google's Application Default Credentials: {e}")))?;
        Ok(Auth::Google { from: "Application Default Credentials".into(), credentials })
    }

    pub async fn apply(&self, rb: RequestBuilder) -> Result<RequestBuilder> {
        match self {
            Auth::None => Ok(rb),
            Auth::Static(t) => Ok(rb.bearer_auth(t)),
            Auth::Google { from, credentials } => match credentials.access_token().await {
                Ok(t) => Ok(rb.bearer_auth(t.token)),
                Err(e) => {
                    let mut why = e.to_string();
                    let mut cause = std::error::Error::source(&e);
                    while let Some(c) = cause {
                        why.push_str(&format!(": {c}"));
                        cause = c.source();
                    }
                    let message = format!(
                        "getting a Google access token ({from}) failed: {why}; without -gcs.service_account_json or \
                         -gcs.access_token, Tidemark uses Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, \
                         gcloud's application-default login, or the metadata server of a Google Cloud machine); for \
                         the emulators, set -gcs.emulator=true"
                    );
                    Err(if e.is_transient() { Error::Unavailable { message } } else { Error::Unauthorized { message } })
                }
            },
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

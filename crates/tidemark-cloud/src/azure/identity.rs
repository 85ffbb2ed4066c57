//! Who Tidemark is to Azure: the account's shared key, a SAS, or a Microsoft Entra ID identity
//! whose tokens the official `azure_identity` crate gets and refreshes — a managed identity, a
//! workload identity (a federated token file, as AKS mounts it), a service principal's client
//! secret, or the Azure CLI's signed-in account. The Blob and Queue data plane takes any of them;
//! Resource Manager (which provisions Event Grid delivery) only an Entra identity.
//!
//! The way is chosen by `-azure.identity`, or else inferred from what is configured, in this
//! order: an account key, a SAS, a client secret, a federated token file (the setting or AKS's
//! `AZURE_FEDERATED_TOKEN_FILE`), a managed identity endpoint (`IDENTITY_ENDPOINT`: App Service,
//! Container Apps, Functions). A VM's managed identity (the instance metadata service) and the
//! Azure CLI are never guessed: `-azure.identity=managed_identity` or `azure_cli` choose them.

use std::sync::Arc;

use azure_core::cloud::{CloudConfiguration, CustomConfiguration};
use azure_core::credentials::{Secret, TokenCredential};
use azure_core::error::ErrorKind;
use azure_core::http::{ClientOptions, Transport};
use azure_identity::{
    AzureCliCredential, AzureCliCredentialOptions, ClientAssertionCredentialOptions, ClientSecretCredential,
    ClientSecretCredentialOptions, ManagedIdentityCredential, ManagedIdentityCredentialOptions, UserAssignedId,
    WorkloadIdentityCredential, WorkloadIdentityCredentialOptions,
};

use tidemark_core::remote::RemoteConf;
use tidemark_core::{Error, Result};

/// The audience of Azure Storage's data plane (Blob and Queue), for any account.
pub const STORAGE_SCOPE: &str = "https://storage.azure.com/.default";

/// How Tidemark signs its requests to Azure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// The account's shared key (`-azure.account_key`): data plane only.
    SharedKey,
    /// A shared access signature (`-azure.sas_token`): data plane only.
    Sas,
    /// A service principal's client secret (`-azure.tenant_id -azure.client_id -azure.client_secret`).
    ClientSecret,
    /// A workload identity: a federated token (Kubernetes' service account token) exchanged for
    /// an Entra token (`-azure.tenant_id -azure.client_id -azure.federated_token_file`, or AKS's
    /// `AZURE_TENANT_ID`, `AZURE_CLIENT_ID`, `AZURE_FEDERATED_TOKEN_FILE`).
    WorkloadIdentity,
    /// The managed identity of the machine or app (a user-assigned one with `-azure.client_id`).
    ManagedIdentity,
    /// The account `az login` signed in.
    AzureCli,
}

const WAYS: &str = "shared_key, sas, client_secret, workload_identity, managed_identity or azure_cli";

impl Way {
    pub fn name(self) -> &'static str {
        match self {
            Way::SharedKey => "shared_key",
            Way::Sas => "sas",
            Way::ClientSecret => "client_secret",
            Way::WorkloadIdentity => "workload_identity",
            Way::ManagedIdentity => "managed_identity",
            Way::AzureCli => "azure_cli",
        }
    }

    fn parse(s: &str) -> Option<Way> {
        [Way::SharedKey, Way::Sas, Way::ClientSecret, Way::WorkloadIdentity, Way::ManagedIdentity, Way::AzureCli]
            .into_iter()
            .find(|w| w.name() == s)
    }

    /// Whether the way is a Microsoft Entra ID identity (bearer tokens).
    pub fn is_entra(self) -> bool {
        !matches!(self, Way::SharedKey | Way::Sas)
    }

    /// What to check when Azure refuses a request made this way.
    pub fn what_to_check(self) -> &'static str {
        match self {
            Way::SharedKey => "the account key",
            Way::Sas => "the SAS token (its permissions and expiry)",
            _ => {
                "that the identity has a data role on the account (Storage Blob Data Contributor; Storage Queue \
                 Data Message Processor and Sender for events)"
            }
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The Entra way inferred from what is configured, for a remote with neither key nor SAS, or
/// for Resource Manager.
fn inferred_entra(conf: &RemoteConf) -> Option<Way> {
    if conf.setting("client_secret").is_some() {
        Some(Way::ClientSecret)
    } else if conf.setting("federated_token_file").is_some() || env("AZURE_FEDERATED_TOKEN_FILE").is_some() {
        Some(Way::WorkloadIdentity)
    } else if env("IDENTITY_ENDPOINT").is_some() || env("MSI_ENDPOINT").is_some() {
        Some(Way::ManagedIdentity)
    } else {
        None
    }
}

fn explicit(conf: &RemoteConf) -> Result<Option<Way>> {
    match conf.setting("identity") {
        None => Ok(None),
        Some(s) => Way::parse(s).map(Some).ok_or_else(|| {
            Error::invalid_argument(format!("remote {:?}: -azure.identity={s:?}: give one of {WAYS}", conf.name))
        }),
    }
}

/// Whether the remote's `-azure.identity`, if set, names a way (checked when it is configured).
pub fn check(conf: &RemoteConf) -> Result<()> {
    explicit(conf).map(|_| ())
}

fn no_identity(conf: &RemoteConf, for_what: &str) -> Error {
    Error::invalid_argument(format!(
        "remote {:?} has no credentials for {for_what}: set -azure.account_key or -azure.sas_token (the data plane \
         only), or sign in with Microsoft Entra ID: -azure.identity=managed_identity (the VM's or app's identity; \
         -azure.client_id for a user-assigned one), workload_identity (-azure.tenant_id -azure.client_id \
         -azure.federated_token_file, or AKS's AZURE_* variables), client_secret (-azure.tenant_id \
         -azure.client_id -azure.client_secret) or azure_cli (the account of `az login`)",
        conf.name
    ))
}

/// How the Blob and Queue data plane signs in.
pub fn data_plane_way(conf: &RemoteConf) -> Result<Way> {
    if let Some(way) = explicit(conf)? {
        return Ok(way);
    }
    if conf.setting("account_key").is_some() {
        Ok(Way::SharedKey)
    } else if conf.setting("sas_token").is_some() {
        Ok(Way::Sas)
    } else {
        inferred_entra(conf).ok_or_else(|| no_identity(conf, "the storage account"))
    }
}

/// How Resource Manager is signed in to: an Entra identity only (a shared key or SAS chosen for
/// the data plane does not serve it, so the Entra way is then inferred).
pub fn arm_way(conf: &RemoteConf) -> Result<Way> {
    match explicit(conf)? {
        Some(way) if way.is_entra() => Ok(way),
        _ => inferred_entra(conf).ok_or_else(|| {
            Error::invalid_argument(format!(
                "remote {:?}: provisioning Event Grid delivery signs in to Azure Resource Manager with a Microsoft \
                 Entra ID identity: set -azure.tenant_id, -azure.client_id and -azure.client_secret (a service \
                 principal), or -azure.identity=managed_identity, workload_identity or azure_cli",
                conf.name
            ))
        }),
    }
}

/// An Entra identity's tokens, got and refreshed (about five minutes before they expire) by
/// `azure_identity`, over Tidemark's own HTTP client.
#[derive(Clone)]
pub struct Entra {
    credential: Arc<dyn TokenCredential>,
    pub way: Way,
    remote: String,
}

impl std::fmt::Debug for Entra {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entra").field("way", &self.way).field("remote", &self.remote).finish()
    }
}

/// The setting `name` that `way` needs, or an error naming it.
pub(crate) fn required<'a>(conf: &'a RemoteConf, name: &str, way: Way) -> Result<&'a str> {
    conf.setting(name).ok_or_else(|| {
        Error::invalid_argument(format!("remote {:?}: -azure.identity={} needs -azure.{name}", conf.name, way.name()))
    })
}

impl Entra {
    /// The credential of `way` (an Entra one) from the remote's settings. `http` carries its
    /// token requests (so they trust what Tidemark's clients trust).
    pub fn new(conf: &RemoteConf, way: Way, http: reqwest::Client) -> Result<Entra> {
        let mut client_options =
            ClientOptions { transport: Some(Transport::new(Arc::new(http))), ..Default::default() };
        if let Some(login) = conf.setting("login_endpoint") {
            let mut custom = CustomConfiguration::default();
            custom.authority_host = login.trim_end_matches('/').to_string();
            client_options.cloud = Some(Arc::new(CloudConfiguration::Custom(custom)));
        }
        let refused = |e: azure_core::Error| {
            Error::invalid_argument(format!("remote {:?}: -azure.identity={}: {e}", conf.name, way.name()))
        };
        let credential: Arc<dyn TokenCredential> = match way {
            Way::ClientSecret => ClientSecretCredential::new(
                required(conf, "tenant_id", way)?,
                required(conf, "client_id", way)?.to_string(),
                Secret::new(required(conf, "client_secret", way)?.to_string()),
                Some(ClientSecretCredentialOptions { client_options }),
            )
            .map_err(refused)?,
            Way::WorkloadIdentity => WorkloadIdentityCredential::new(Some(WorkloadIdentityCredentialOptions {
                credential_options: ClientAssertionCredentialOptions { client_options },
                client_id: conf.setting("client_id").map(str::to_string),
                tenant_id: conf.setting("tenant_id").map(str::to_string),
                token_file_path: conf.setting("federated_token_file").map(Into::into),
            }))
            .map_err(refused)?,
            Way::ManagedIdentity => ManagedIdentityCredential::new(Some(ManagedIdentityCredentialOptions {
                user_assigned_id: conf.setting("client_id").map(|id| UserAssignedId::ClientId(id.to_string())),
                client_options,
            }))
            .map_err(refused)?,
            Way::AzureCli => AzureCliCredential::new(Some(AzureCliCredentialOptions {
                tenant_id: conf.setting("tenant_id").map(str::to_string),
                ..Default::default()
            }))
            .map_err(refused)?,
            Way::SharedKey | Way::Sas => {
                return Err(Error::internal(format!("{} is not a Microsoft Entra ID identity", way.name())));
            }
        };
        Ok(Entra { credential, way, remote: conf.name.clone() })
    }

    /// A bearer token for `scope` (`AUDIENCE/.default`): the cached one while it has more than
    /// five minutes left, else a new one. A refusal says what to check; an unreachable or
    /// failing token endpoint is `Unavailable` (retried).
    pub async fn token(&self, scope: &str) -> Result<String> {
        match self.credential.get_token(&[scope], None).await {
            Ok(t) => Ok(t.token.secret().to_string()),
            Err(e) => Err(self.failed(scope, &e)),
        }
    }

    fn failed(&self, scope: &str, e: &azure_core::Error) -> Error {
        let transient = {
            let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
            let mut transient = false;
            while let Some(c) = cause {
                if let Some(ae) = c.downcast_ref::<azure_core::Error>() {
                    transient |= match ae.kind() {
                        ErrorKind::Io | ErrorKind::Connection => true,
                        ErrorKind::HttpResponse { status, .. } => status.is_server_error() || u16::from(*status) == 429,
                        _ => false,
                    };
                }
                cause = c.source();
            }
            transient
        };
        let check = match self.way {
            Way::ClientSecret => {
                "check -azure.tenant_id, -azure.client_id and -azure.client_secret (the service principal)"
            }
            Way::WorkloadIdentity => {
                "check -azure.tenant_id, -azure.client_id, the federated token file, and the identity's federated \
                 credential (issuer and subject)"
            }
            Way::ManagedIdentity => {
                "check that this machine or app has a managed identity (and that -azure.client_id, if set, names a \
                 user-assigned one it has)"
            }
            _ => "run `az login` as the user Tidemark runs as",
        };
        let message = format!(
            "remote {:?}: getting a Microsoft Entra ID token for {scope} ({} identity) failed: {}; {check}",
            self.remote,
            self.way.name(),
            e.to_string().replace('\n', " ")
        );
        if transient { Error::Unavailable { message } } else { Error::Unauthorized { message } }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_core::remote::StorageKind;

    fn conf(settings: &[(&str, &str)]) -> RemoteConf {
        RemoteConf {
            name: "az".into(),
            kind: StorageKind::Azure,
            settings: settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }

    /// The way is what `-azure.identity` names, else what is configured in the documented order;
    /// Resource Manager never takes the data plane's key or SAS.
    #[test]
    fn the_way_is_chosen_explicitly_or_by_what_is_configured() {
        let sp = [("tenant_id", "t"), ("client_id", "c"), ("client_secret", "s")];
        assert_eq!(data_plane_way(&conf(&[("account_key", "k"), ("sas_token", "x")])).unwrap(), Way::SharedKey);
        assert_eq!(data_plane_way(&conf(&[("sas_token", "x"), sp[2]])).unwrap(), Way::Sas);
        assert_eq!(data_plane_way(&conf(&sp)).unwrap(), Way::ClientSecret);
        let wi = conf(&[("federated_token_file", "/var/run/token"), ("client_id", "c")]);
        assert_eq!(data_plane_way(&wi).unwrap(), Way::WorkloadIdentity);
        let mi = conf(&[("account_key", "k"), ("identity", "managed_identity")]);
        assert_eq!(data_plane_way(&mi).unwrap(), Way::ManagedIdentity);
        assert_eq!(arm_way(&mi).unwrap(), Way::ManagedIdentity);
        let key_and_sp = conf(&[("account_key", "k"), sp[0], sp[1], sp[2]]);
        assert_eq!(
            (data_plane_way(&key_and_sp).unwrap(), arm_way(&key_and_sp).unwrap()),
            (Way::SharedKey, Way::ClientSecret)
        );
        let err = data_plane_way(&conf(&[("identity", "password")])).unwrap_err().to_string();
        assert!(err.contains("-azure.identity=\"password\"") && err.contains("azure_cli"), "{err}");
        let cli = conf(&[("identity", "azure_cli")]);
        assert_eq!(data_plane_way(&cli).unwrap(), Way::AzureCli);
    }

    /// A way without what it needs names the setting; a remote with no way at all lists them.
    #[test]
    fn missing_settings_are_named() {
        let http = reqwest::Client::new();
        let err = Entra::new(&conf(&[("client_id", "c"), ("client_secret", "s")]), Way::ClientSecret, http)
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs -azure.tenant_id"), "{err}");
        if std::env::var_os("AZURE_FEDERATED_TOKEN_FILE").is_none() && std::env::var_os("IDENTITY_ENDPOINT").is_none() {
            let err = data_plane_way(&conf(&[])).unwrap_err().to_string();
            assert!(err.contains("-azure.account_key") && err.contains("-azure.identity=managed_identity"), "{err}");
            let err = arm_way(&conf(&[("account_key", "k")])).unwrap_err().to_string();
            assert!(err.contains("Resource Manager") && err.contains("-azure.client_secret"), "{err}");
        }
    }
}

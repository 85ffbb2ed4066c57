//! Azure Storage: Blob (remote storage) and Queue (the Event Grid delivery queue), over the REST
//! API with Shared Key, SAS or Microsoft Entra ID bearer tokens ([`identity`]). Works against Azure and Azurite (path-style
//! endpoints such as `http://127.0.0.1:10000/devstoreaccount1`).

pub mod blob;
pub mod client;
pub mod identity;
pub mod provision;
pub mod queue;

pub use blob::AzureBlobStorage;
pub use provision::AzureNotifications;
pub use queue::AzureQueueSource;

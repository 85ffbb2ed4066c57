//! Google Cloud: Cloud Storage (remote storage, JSON API) and Pub/Sub pull (the notification
//! queue), over REST. Works against Google and against fake-gcs-server and the Pub/Sub emulator.
//!
//! Authentication: a service account key (`service_account_json`: a signed JWT exchanged for a
//! token), an `access_token`, none for an emulator, or on a Google Cloud machine the metadata
//! server's token.

pub mod auth;
pub mod gcs;
pub mod provision;
pub mod pubsub;

pub use gcs::GcsStorage;
pub use provision::GcsNotifications;
pub use pubsub::PubSubSource;

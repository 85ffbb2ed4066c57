//! Google Cloud: Cloud Storage (remote storage, JSON API) and Pub/Sub pull (the notification
//! queue), over REST. Works against Google and against fake-gcs-server and the Pub/Sub emulator.
//!
//! Authentication: an emulator needs none; against Google, `access_token` (e.g. from
//! `gcloud auth print-access-token`) or, on a Google Cloud machine, the metadata server's token.

pub mod auth;
pub mod gcs;
pub mod pubsub;

pub use gcs::GcsStorage;
pub use pubsub::PubSubSource;

//! Amazon Web Services and S3-compatible stores.

pub mod provision;
pub mod s3;
pub mod sqs;

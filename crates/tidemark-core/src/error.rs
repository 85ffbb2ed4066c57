//! One error type for the store, the filer and its client, with *semantic* variants so callers
//! branch on meaning (a failed precondition means "re-read and re-decide"; a failed fence means
//! "stop, acknowledge nothing more"). The type is serialisable so that the HTTP API carries it
//! across the wire unchanged: a client gets back exactly the variant the filer produced.

use serde::{Deserialize, Serialize};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Error {
    #[error("{path}: no such entry")]
    NotFound { path: String },

    /// The entry was not in the state the write required. `current` is the entry's version now
    /// (`None`: the entry does not exist). The caller re-reads and decides again.
    #[error("{path}: precondition failed (current version: {})", fmt_version(.current))]
    PreconditionFailed { path: String, current: Option<u64> },

    /// The write carried a fence that no longer holds: the lease has another holder or
    /// generation, or has expired. Nothing was written; the holder must stop.
    #[error(
        "lease {lease}: fenced, the write's generation is no longer current (current generation: {})",
        fmt_version(.current_generation)
    )]
    Fenced { lease: String, current_generation: Option<u64> },

    #[error("lease {lease} is held by {holder} until {expires_at_ms} (ms since epoch)")]
    LeaseHeld { lease: String, holder: String, expires_at_ms: i64 },

    #[error("{path}: not a directory")]
    NotADirectory { path: String },

    #[error("{path}: is a directory")]
    IsADirectory { path: String },

    #[error("{path}: directory not empty (use recursive delete)")]
    DirectoryNotEmpty { path: String },

    #[error("invalid path {path:?}: {reason}")]
    InvalidPath { path: String, reason: String },

    #[error("invalid argument: {message}")]
    InvalidArgument { message: String },

    /// A read asked for a range that starts past the end of the file (`size` bytes long).
    #[error("{path}: range starts at {offset}, beyond the end of the {size}-byte file")]
    RangeNotSatisfiable { path: String, offset: u64, size: u64 },

    /// A rename the namespace cannot make in one transaction: it would move entries into, out
    /// of or within a remote mount, where a rename is copies and deletes in the bucket. The
    /// caller copies instead (the FUSE mount answers `EXDEV`, and `mv` copies).
    #[error("{path}: cannot be renamed in place: {message}")]
    CrossMount { path: String, message: String },

    #[error("unauthorized: {message}")]
    Unauthorized { message: String },

    /// The remote object is in an archival storage class and must be restored before it can be
    /// read (S3 answers `InvalidObjectState`, Azure `BlobArchived`).
    #[error("{path}: archived in storage class {storage_class}: {}", crate::remote::archived_hint(.storage_class))]
    Archived { path: String, storage_class: String },

    /// The bucket refuses this cluster the object's bytes for good — encrypted with a
    /// customer-provided key (SSE-C), or with a KMS key the cluster may not use — and says why.
    #[error("{path}: cannot be read: {reason}")]
    Unreadable { path: String, reason: String },

    /// A write larger than where its content goes can hold (the data directory's free space,
    /// an object store's largest object), refused before its body was read.
    #[error("{path}: too large: {message}")]
    TooLarge { path: String, message: String },

    /// The other side could not be reached or answered with a transient failure; retrying later
    /// may succeed.
    #[error("unavailable: {message}")]
    Unavailable { message: String },

    #[error("I/O error: {message}")]
    Io { message: String },

    #[error("internal error: {message}")]
    Internal { message: String },
}

fn fmt_version(v: &Option<u64>) -> String {
    v.map_or_else(|| "absent".to_string(), |v| v.to_string())
}

/// The stable wire name of an error's variant.
pub type ErrorCode = &'static str;

impl Error {
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::NotFound { .. } => "not_found",
            Error::PreconditionFailed { .. } => "precondition_failed",
            Error::Fenced { .. } => "fenced",
            Error::LeaseHeld { .. } => "lease_held",
            Error::NotADirectory { .. } => "not_a_directory",
            Error::IsADirectory { .. } => "is_a_directory",
            Error::DirectoryNotEmpty { .. } => "directory_not_empty",
            Error::InvalidPath { .. } => "invalid_path",
            Error::InvalidArgument { .. } => "invalid_argument",
            Error::RangeNotSatisfiable { .. } => "range_not_satisfiable",
            Error::Unauthorized { .. } => "unauthorized",
            Error::CrossMount { .. } => "cross_mount",
            Error::Archived { .. } => "archived",
            Error::Unreadable { .. } => "unreadable",
            Error::TooLarge { .. } => "too_large",
            Error::Unavailable { .. } => "unavailable",
            Error::Io { .. } => "io",
            Error::Internal { .. } => "internal",
        }
    }

    /// Whether the same request may succeed if simply retried later.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable { .. })
    }

    pub fn not_found(path: impl Into<String>) -> Self {
        Error::NotFound { path: path.into() }
    }
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Error::InvalidArgument { message: message.into() }
    }
    pub fn internal(message: impl std::fmt::Display) -> Self {
        Error::Internal { message: message.to_string() }
    }
    pub fn io(context: impl std::fmt::Display, err: impl std::fmt::Display) -> Self {
        Error::Io { message: format!("{context}: {err}") }
    }
}

/// The JSON body of every error response of the HTTP API:
/// `{"error": {"code": "...", ...fields}, "message": "human readable"}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: Error,
    pub message: String,
}

impl From<Error> for ErrorBody {
    fn from(error: Error) -> Self {
        ErrorBody { message: error.to_string(), error }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_round_trip_through_json_with_their_code() {
        let e = Error::PreconditionFailed { path: "/a".into(), current: Some(7) };
        let body = serde_json::to_value(ErrorBody::from(e.clone())).unwrap();
        assert_eq!(body["error"]["code"], "precondition_failed");
        assert_eq!(body["error"]["current"], 7);
        let back: ErrorBody = serde_json::from_value(body).unwrap();
        assert_eq!(back.error, e);
        assert_eq!(back.error.code(), "precondition_failed");
    }
}

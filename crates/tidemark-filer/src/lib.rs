//! The Tidemark filer: the only writer of the store.
//!
//! - [`LocalFiler`]: the [`Filer`](tidemark_core::Filer) over a `MetaStore` and the blob
//!   directory; what `tidemark filer` and `tidemark server` run.
//! - [`cache`]: the content cache that serves remote-backed files locally once read.
//! - [`http`]: the HTTP/JSON API under `/api/v1/` that exposes a `Filer`.
//! - [`HttpFiler`]: the client of that API; it implements the same trait, so callers do not care
//!   whether the filer is in their process or across the network.

pub mod blobs;
mod blobs_s3;
pub mod cache;
pub mod client;
pub mod datadir;
pub mod gc;
pub mod http;
pub mod leader;
pub mod local;
pub mod metrics;
pub mod outbound;
pub mod remotes;
pub mod scope;

pub use cache::{CacheConfig, ContentCache};
pub use client::HttpFiler;
pub use datadir::DataDir;
pub use local::LocalFiler;

//! `MetaStore` backends and the conformance suite they all pass.
//!
//! - [`sqlite::SqliteStore`]: the embedded default, one WAL-mode file in the data directory.
//! - [`conformance`]: the shared suite; every backend's tests call each of its functions.

pub mod conformance;
pub mod sqlite;

pub use sqlite::SqliteStore;

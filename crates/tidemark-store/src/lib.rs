//! `MetaStore` backends and the conformance suite they all pass.
//!
//! - [`sqlite::SqliteStore`]: the embedded default, one WAL-mode file in the data directory.
//! - [`postgres::PgStore`]: the shared store for several filers on one PostgreSQL database.
//! - [`conformance`]: the shared suite; every backend's tests call each of its functions.

pub mod conformance;
pub mod postgres;
pub mod sqlite;
mod txn;

pub use postgres::PgStore;
pub use sqlite::SqliteStore;

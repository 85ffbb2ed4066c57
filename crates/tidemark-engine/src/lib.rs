//! Tidemark's engine: the orchestration of `decide` over the `Filer` and `RemoteStorage` traits
//! only, so the production code and the simulation run the very same paths.
//!
//! - [`write`]: turns a decision into the filer's conditional transaction, re-deciding when a
//!   concurrent local write got there first. Shared by the reconciler and the applier.
//! - [`reconcile`]: the full reconcile (`remote.meta.sync`), a streaming merge-join.
//! - [`listing`]: the bucket's side of it, listed as key ranges at once.
//! - [`recent`]: what a slice remembers of its HEADs, so a notification that one already
//!   answered needs no other.

pub mod apply;
pub mod docs;
pub mod listing;
pub mod outbound;
pub mod recent;
pub mod reconcile;
pub mod slice;
pub mod write;

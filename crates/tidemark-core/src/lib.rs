//! Tidemark's core: the data model, the pure logic (path rules, key <-> path mapping) and the
//! traits that adapters implement ([`MetaStore`] for stores, [`Filer`] for the filer and its HTTP
//! client). Nothing in this crate performs I/O, so everything here is testable exhaustively.

pub mod backoff;
pub mod cache;
pub mod clock;
pub mod decide;
pub mod error;
pub mod events;
pub mod failpoint;
pub mod filer;
pub mod ids;
pub mod jobs;
pub mod keymap;
pub mod model;
pub mod path;
pub mod remote;
pub mod requests;
pub mod secrets;
pub mod sparse;
pub mod store;
pub mod subscription;

pub use clock::{Clock, ManualClock, SystemClock, format_rfc3339_ms, parse_rfc3339_ms};
pub use error::{Error, ErrorCode, Result};
pub use filer::{ByteRange, ByteStream, ChangedMidRead, DeleteOptions, Filer, Health, WriteOptions, changed_mid_read};
pub use model::{
    Applied, ChangeRecord, Content, Entry, EntryKind, Fence, Lease, Mutation, NewEntry, Origin, Page, Precondition,
    RemoteEntry, Txn, TxnBatch, TxnOutcome,
};
pub use remote::{RemoteObject, RemoteStorage};
pub use store::MetaStore;

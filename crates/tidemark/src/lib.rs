//! The `tidemark` binary's library half: each role's start-up and the operator shell, kept out
//! of `main.rs` so integration tests and other crates can drive them in-process.

pub mod blobs_cmd;
pub mod events_cmd;
pub mod quickstart;
pub mod roles;
pub mod shell;

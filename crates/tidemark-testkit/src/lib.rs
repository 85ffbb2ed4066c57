//! The test harness. Everything it starts binds to 127.0.0.1 on a free port and is stopped
//! when its handle drops, even when the test fails (a panic unwinds through the drop).

pub mod azure_double;
pub mod browser;
mod doubles;
pub mod emulators;
pub mod fsx;
pub mod gcp_double;
pub mod process;
pub mod slow_lists;
pub mod sse_c;
pub mod throttle;
pub mod tls;

pub use azure_double::AzureArmDouble;
pub use emulators::{Azurite, FakeGcs, Moto, Postgres, PubSub, unique_name};
pub use gcp_double::GcpDouble;
pub use process::{LogsOnFailure, TidemarkProcess, eventually, fails, free_port, ok, run_shell};
pub use slow_lists::SlowLists;
pub use sse_c::SseCProxy;
pub use throttle::{Shape, shaping_proxy, throttling_proxy};
pub use tls::TestCa;

use tidemark_core::model::{ChangeRecord, Entry};

/// Whether a change record brings an object's bytes into the namespace: a create, or an update
/// to another ETag, size or time. What "applied exactly once" counts: a reconcile lists objects
/// without their headers, so the event that follows it HEADs the same object and records its
/// Content-Type and metadata — an update of the entry's attributes, not a second apply.
pub fn brings_bytes(r: &ChangeRecord) -> bool {
    fn remote(e: &Option<Entry>) -> Option<(&str, u64, i64)> {
        e.as_ref().and_then(|e| e.remote.as_ref()).map(|r| (r.etag.as_str(), r.remote_size, r.remote_mtime_ms))
    }
    r.new.is_some() && remote(&r.old) != remote(&r.new)
}

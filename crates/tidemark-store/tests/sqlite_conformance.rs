//! The MetaStore conformance suite against SQLite, on a fresh file per test.

use std::sync::Arc;

use tidemark_core::ManualClock;
use tidemark_store::SqliteStore;
use tidemark_store::conformance::Harness;

async fn sqlite() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_700_000_000_000);
    let store = SqliteStore::open(dir.path().join("meta.db"), Arc::new(clock.clone())).unwrap();
    Harness { store: Arc::new(store), clock: Arc::new(clock), guard: Box::new(dir) }
}

tidemark_store::metastore_conformance!(sqlite());

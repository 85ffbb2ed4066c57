//! The MetaStore conformance suite against PostgreSQL, on a fresh database per test (a
//! throwaway cluster the harness starts, or the run's shared one from `scripts/test.sh`).

use std::sync::Arc;

use async_trait::async_trait;
use tidemark_store::PgStore;
use tidemark_store::conformance::{Advance, Harness};
use tidemark_testkit::Postgres;

/// The database's clock cannot be moved: the suite's lease checks wait for real.
struct RealTime;

#[async_trait]
impl Advance for RealTime {
    async fn advance_ms(&self, ms: i64) {
        tokio::time::sleep(std::time::Duration::from_millis(ms as u64)).await;
    }
}

async fn postgres() -> Harness {
    // The cluster lives as long as the test (statics are never dropped, so never stopped).
    let pg = Postgres::get();
    let url = pg.fresh_database("conformance");
    let store = PgStore::connect(&url).await.unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
    Harness { store: Arc::new(store), clock: Arc::new(RealTime), guard: Box::new(pg) }
}

tidemark_store::metastore_conformance!(postgres());

//! The admin: reads the subscription documents (detection), schedules one slice per
//! subscription onto the workers that register with it, keeps the worker registry, and serves
//! the Admin UI (Event Subscriptions, Job types, Workers), `/metrics`, and the worker API.
//!
//! ```text
//! filer ──(subscriptions, status blobs, leases, job types)──▶ detection ──▶ Scheduler
//! worker ──register / heartbeat / report──▶ /api/v1/workers/... ──▶ Scheduler ──▶ assign / cancel
//! browser ──▶ /subscriptions /job-types /workers      Prometheus ──▶ /metrics
//! ```
//!
//! The admin writes one document (the job-type switches); everything else it shows is read
//! from the filer or heard from workers, so restarting it loses nothing a worker cannot resend.

mod http;
mod metrics;
pub mod scheduler;
mod snapshot;
mod ui;

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tidemark_core::{Clock, Error, Filer, SystemClock};

pub use http::{check_bind, router, serve, serve_tls};
pub use scheduler::{Scheduler, SchedulerConfig};
pub use snapshot::{Snapshot, SubscriptionView};

pub struct AdminConfig {
    pub scheduler: SchedulerConfig,
    /// How often detection reads the subscriptions.
    pub scan: Duration,
    /// Where the filer is, for the pages.
    pub filer_label: String,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig { scheduler: SchedulerConfig::default(), scan: Duration::from_secs(1), filer_label: String::new() }
    }
}

/// Everything the admin's handlers and its detection loop share.
pub struct Admin {
    filer: Arc<dyn Filer>,
    scheduler: Arc<Mutex<Scheduler>>,
    snapshot: Arc<RwLock<Snapshot>>,
    metrics: metrics::Metrics,
    config: AdminConfig,
    started_ms: i64,
}

fn now_ms() -> i64 {
    SystemClock.now_ms()
}

impl Admin {
    pub fn new(filer: Arc<dyn Filer>, config: AdminConfig) -> Arc<Self> {
        let scheduler = Arc::new(Mutex::new(Scheduler::new(config.scheduler.clone())));
        let snapshot = Arc::new(RwLock::new(Snapshot::default()));
        Arc::new(Admin {
            filer,
            metrics: metrics::Metrics::new(snapshot.clone(), scheduler.clone()),
            scheduler,
            snapshot,
            config,
            started_ms: now_ms(),
        })
    }

    fn sched(&self) -> std::sync::MutexGuard<'_, Scheduler> {
        self.scheduler.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One detection pass: read the filer, update the scheduler and the pages' snapshot.
    pub async fn detect_once(&self) -> Result<(), Error> {
        let snap = snapshot::read(&*self.filer).await?;
        let now = now_ms();
        {
            let mut s = self.sched();
            let wanted = snap.subscriptions.iter().map(|v| (v.doc.fingerprint.clone(), v.doc.dir.clone()));
            s.detect(wanted, snap.job_types.enabled(tidemark_core::jobs::REMOTE_EVENTS), now);
            for gone in s.expire(now) {
                tracing::warn!(worker = %gone, "worker stopped heart-beating; dropped, its slices are proposed again");
            }
        }
        *self.snapshot.write().unwrap_or_else(|p| p.into_inner()) = snap;
        Ok(())
    }

    /// Detection until `stop` turns true.
    pub async fn run_detection(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut failing = false;
        loop {
            match self.detect_once().await {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!("detection reads the filer again");
                }
                Ok(()) => {}
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "detection cannot read the filer; retrying");
                }
                Err(_) => {}
            }
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = tokio::time::sleep(self.config.scan) => {}
            }
        }
    }
}

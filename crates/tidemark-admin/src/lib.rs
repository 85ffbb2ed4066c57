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
//!
//! Any number of admins may run on one store: the one that holds the lease `admin/active` (in
//! the store, fenced like every lease) schedules; the others stand by — they read the filer and
//! serve the pages, saying which admin is active, refuse the worker API (workers given a list of
//! admins go to the next) and changes, and take the lease over when it runs out (the active admin
//! stopped, was paused or cut off). A new active admin starts with an empty schedule and adopts
//! the slices workers report running, as after a restart.

mod http;
mod metrics;
pub mod rates;
pub mod scheduler;
mod snapshot;
mod ui;

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tidemark_core::{Clock, Error, Filer, SystemClock};

pub use http::{check_bind, router, serve, serve_tls};
pub use scheduler::{Scheduler, SchedulerConfig};
pub use snapshot::{Snapshot, SubscriptionView};
pub use tidemark_core::jobs::Job;

pub struct AdminConfig {
    pub scheduler: SchedulerConfig,
    /// How often detection reads the subscriptions.
    pub scan: Duration,
    /// Where the filer is, for the pages.
    pub filer_label: String,
    /// How this admin is reached (its URL): its name in the lease, which standbys show.
    pub advertise: String,
    /// How long the active admin's lease lasts: a standby takes over at most this long after
    /// the active admin stopped renewing it.
    pub lease_ttl: Duration,
    /// What requests cost, for the page's per-hour figures.
    pub prices: tidemark_core::requests::Prices,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            scheduler: SchedulerConfig::default(),
            scan: Duration::from_secs(1),
            filer_label: String::new(),
            advertise: String::new(),
            lease_ttl: Duration::from_secs(10),
            prices: tidemark_core::requests::Prices::list(),
        }
    }
}

/// The lease the active admin holds.
pub const ACTIVE_LEASE: &str = "admin/active";

/// Whether this admin schedules, or stands by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Active {
        generation: u64,
    },
    /// `active`: the admin that holds the lease, if any does.
    Standby {
        active: Option<String>,
    },
}

/// Everything the admin's handlers and its detection loop share.
pub struct Admin {
    filer: Arc<dyn Filer>,
    role: RwLock<Role>,
    /// Until when this admin is sure it still holds the lease (by its own monotonic clock: the
    /// last renewal's start + most of the ttl). Past it — a paused process resuming — it acts
    /// as a standby until the next renewal says otherwise, so two admins never both schedule.
    sure_until: Mutex<Option<std::time::Instant>>,
    scheduler: Arc<Mutex<Scheduler>>,
    snapshot: Arc<RwLock<Snapshot>>,
    metrics: metrics::Metrics,
    rates: Mutex<rates::RequestRates>,
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
            role: RwLock::new(Role::Standby { active: None }),
            sure_until: Mutex::new(None),
            metrics: metrics::Metrics::new(snapshot.clone(), scheduler.clone()),
            scheduler,
            snapshot,
            rates: Mutex::default(),
            config,
            started_ms: now_ms(),
        })
    }

    fn sched(&self) -> std::sync::MutexGuard<'_, Scheduler> {
        self.scheduler.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn role(&self) -> Role {
        self.role.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether this admin schedules now: it holds the lease, renewed recently enough to be sure.
    pub fn is_active(&self) -> bool {
        matches!(self.role(), Role::Active { .. }) && self.sure()
    }

    fn sure(&self) -> bool {
        self.sure_until.lock().unwrap_or_else(|p| p.into_inner()).is_some_and(|t| std::time::Instant::now() < t)
    }

    fn set_role(&self, role: Role) {
        let mut r = self.role.write().unwrap_or_else(|p| p.into_inner());
        if *r == role {
            return;
        }
        match &role {
            Role::Active { generation } => {
                tracing::info!(generation, admin = %self.config.advertise, "this admin is now the active one: scheduling");
                // A fresh schedule: what runs is adopted from the workers' heartbeats.
                let epoch =
                    tidemark_core::ids::random_hex(2, "an admin term").unwrap_or_else(|_| generation.to_string());
                *self.sched() = Scheduler::with_epoch(self.config.scheduler.clone(), &epoch);
            }
            Role::Standby { active } => {
                tracing::info!(active = active.as_deref().unwrap_or("none"), "this admin stands by");
                *self.sched() = Scheduler::new(self.config.scheduler.clone());
            }
        }
        *r = role;
    }

    /// Why a request that needs the active admin is refused here, if it is.
    pub fn standby_refusal(&self) -> Option<Error> {
        match self.role() {
            Role::Active { .. } if self.sure() => None,
            Role::Active { .. } => Some(Error::Unavailable {
                message: "this admin has not renewed its lease in time (was it paused?); checking it".into(),
            }),
            Role::Standby { active } => Some(Error::Unavailable {
                message: match active {
                    Some(a) => format!("this admin is standing by; the active admin is {a}"),
                    None => "this admin is standing by and no admin is active yet; retry in a moment".into(),
                },
            }),
        }
    }

    /// Holds (or waits for) the active admin's lease until `stop`, then releases it.
    pub async fn run_leadership(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let ttl = self.config.lease_ttl;
        let holder = if self.config.advertise.is_empty() { "admin".to_string() } else { self.config.advertise.clone() };
        let mut fence: Option<tidemark_core::model::Fence> = None;
        // Sure of the lease for most of a ttl after a request that took or renewed it was sent.
        let sure_for = ttl.mul_f64(0.8);
        loop {
            let sent = std::time::Instant::now();
            let next = match &fence {
                Some(f) => match self.filer.lease_renew(f, ttl).await {
                    Ok(_) => {
                        *self.sure_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(sent + sure_for);
                        ttl / 3
                    }
                    Err(e @ Error::Fenced { .. }) => {
                        tracing::warn!(error = %e, "this admin lost its lease to another");
                        *self.sure_until.lock().unwrap_or_else(|p| p.into_inner()) = None;
                        fence = None;
                        self.set_role(Role::Standby { active: None });
                        Duration::ZERO
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot renew the active admin's lease; retrying");
                        Duration::from_millis(500)
                    }
                },
                None => match self.filer.lease_acquire(ACTIVE_LEASE, &holder, ttl).await {
                    Ok(l) => {
                        *self.sure_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(sent + sure_for);
                        self.set_role(Role::Active { generation: l.generation });
                        fence = Some(l.fence());
                        ttl / 3
                    }
                    Err(Error::LeaseHeld { holder: active, .. }) => {
                        self.set_role(Role::Standby { active: Some(active) });
                        // Checked often: a standby takes over soon after the lease runs out.
                        (ttl / 10).max(Duration::from_millis(200))
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot reach the store for the admin's lease");
                        Duration::from_secs(1)
                    }
                },
            };
            let stopping = tokio::select! {
                _ = stop.wait_for(|s| *s) => true,
                _ = tokio::time::sleep(next) => false,
            };
            if stopping {
                if let Some(f) = &fence {
                    // Hand over at once rather than after the ttl.
                    let _ = self.filer.lease_release(f).await;
                }
                return;
            }
        }
    }

    /// One detection pass: read the filer, update the scheduler and the pages' snapshot.
    pub async fn detect_once(&self) -> Result<(), Error> {
        let snap = snapshot::read(&*self.filer).await?;
        let now = now_ms();
        if self.is_active() {
            let mut s = self.sched();
            let wanted = snap.subscriptions.iter().map(|v| (v.doc.fingerprint.clone(), v.doc.dir.clone()));
            s.detect(wanted, snap.job_types.enabled(tidemark_core::jobs::REMOTE_EVENTS), now);
            for gone in s.expire(now) {
                tracing::warn!(worker = %gone, "worker stopped heart-beating; dropped, its slices are proposed again");
            }
        }
        {
            let mut rates = self.rates.lock().unwrap_or_else(|p| p.into_inner());
            for v in &snap.subscriptions {
                let counts = v.status.as_ref().map(|s| s.counters.requests.clone()).unwrap_or_default();
                rates.record(&v.doc.fingerprint, now, &counts);
            }
            let live: Vec<&str> = snap.subscriptions.iter().map(|v| v.doc.fingerprint.as_str()).collect();
            rates.retain(&live);
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

//! The worker: registers its capability (`remote_events`) with the admin, heart-beats, runs the
//! slices it is assigned, and reports how each ended.
//!
//! ```text
//! register → every heartbeat: {running jobs, draining, samples} → {assign, cancel}
//!          → per assigned job: read the subscription from the filer → run one slice → report
//! ```
//!
//! The worker owns no state: a slice's lease, marker and status blob live in the filer, and the
//! queue holds what is not yet acknowledged. On shutdown it stops taking work, ends its slices
//! cleanly (status written, lease released), reports them and leaves.

pub mod client;
pub mod job;
mod observer;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use tidemark_core::jobs::{Heartbeat, Job, JobReport, REMOTE_EVENTS, Register};
use tidemark_core::{Error, Filer};

pub use client::AdminClient;
pub use job::SliceSettings;
use observer::Collector;

pub struct WorkerConfig {
    pub worker_id: String,
    pub max_execute: usize,
    pub slice: SliceSettings,
}

struct Running {
    job: Job,
    task: tokio::task::JoinHandle<JobReport>,
    cancel: watch::Sender<bool>,
}

pub struct Worker {
    admin: AdminClient,
    filer: Arc<dyn Filer>,
    config: WorkerConfig,
}

/// A worker id that tells operators where it runs: `host-pid`.
pub fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "worker".into());
    format!("{host}-{}", std::process::id())
}

impl Worker {
    pub fn new(admin: AdminClient, filer: Arc<dyn Filer>, config: WorkerConfig) -> Self {
        Worker { admin, filer, config }
    }

    fn registration(&self) -> Register {
        Register {
            worker_id: self.config.worker_id.clone(),
            capabilities: vec![REMOTE_EVENTS.to_string()],
            max_execute: self.config.max_execute,
            host: default_worker_id(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// Runs until `stop` turns true, then drains: no new work, every slice ends cleanly and is
    /// reported.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let collector = Arc::new(Collector::default());
        let mut running: HashMap<String, Running> = HashMap::new();
        // Reports not yet delivered (the admin was unreachable): sent with the next heartbeat.
        let mut undelivered: Vec<JobReport> = Vec::new();
        let mut registered = false;
        let mut beat = Duration::from_secs(1);
        let mut admin_down_since: Option<tokio::time::Instant> = None;
        loop {
            if *stop.borrow() {
                break;
            }
            if !registered {
                match self.admin.register(&self.registration()).await {
                    Ok(reply) => {
                        registered = true;
                        beat = Duration::from_millis(reply.heartbeat_ms.clamp(100, 30_000));
                        tracing::info!(worker = %self.config.worker_id, admin = %self.admin.base(), "registered with the admin");
                    }
                    Err(e) => note_admin_down(&mut admin_down_since, &e),
                }
            }
            if registered {
                collect_finished(&mut running, &mut undelivered).await;
                self.deliver(&mut undelivered).await;
                let hb = Heartbeat {
                    running: running.values().map(|r| r.job.clone()).collect(),
                    draining: false,
                    samples: collector.take(),
                };
                match self.admin.heartbeat(&self.config.worker_id, &hb).await {
                    Ok(reply) if !reply.known => registered = false,
                    Ok(reply) => {
                        admin_down_since = None;
                        for id in reply.cancel {
                            if let Some(r) = running.get(&id) {
                                tracing::info!(job = %id, dir = %r.job.dir, "the admin cancelled a slice");
                                let _ = r.cancel.send(true);
                            }
                        }
                        for job in reply.assign {
                            if running.len() >= self.config.max_execute || running.contains_key(&job.id) {
                                continue;
                            }
                            let (cancel, cancel_rx) = watch::channel(false);
                            let task = tokio::spawn(job::run(
                                self.filer.clone(),
                                job.clone(),
                                self.config.worker_id.clone(),
                                self.config.slice.clone(),
                                collector.clone(),
                                cancel_rx,
                            ));
                            running.insert(job.id.clone(), Running { job, task, cancel });
                        }
                    }
                    Err(e) => note_admin_down(&mut admin_down_since, &e),
                }
            }
            tokio::select! {
                _ = stop.wait_for(|s| *s) => {}
                _ = tokio::time::sleep(beat) => {}
            }
        }
        self.drain(running, undelivered, collector, beat).await;
    }

    async fn deliver(&self, undelivered: &mut Vec<JobReport>) {
        let mut left = Vec::new();
        for r in undelivered.drain(..) {
            if let Err(e) = self.admin.report(&self.config.worker_id, &r).await {
                tracing::debug!(error = %e, job = %r.job.id, "report not delivered yet");
                left.push(r);
            }
        }
        *undelivered = left;
    }

    async fn drain(
        &self,
        mut running: HashMap<String, Running>,
        mut undelivered: Vec<JobReport>,
        collector: Arc<Collector>,
        beat: Duration,
    ) {
        tracing::info!(worker = %self.config.worker_id, slices = running.len(), "draining: ending slices cleanly");
        for r in running.values() {
            let _ = r.cancel.send(true);
        }
        // A slice ends once its receive in flight has come back (up to its long-poll wait):
        // meanwhile the worker keeps beating, draining, so the admin does not take it for dead
        // and hand its slices to another worker while they are still being ended here.
        loop {
            collect_finished(&mut running, &mut undelivered).await;
            let hb = Heartbeat {
                running: running.values().map(|r| r.job.clone()).collect(),
                draining: true,
                samples: collector.take(),
            };
            let _ = self.admin.heartbeat(&self.config.worker_id, &hb).await;
            if running.is_empty() {
                break;
            }
            tokio::time::sleep(beat.min(Duration::from_millis(500))).await;
        }
        self.deliver(&mut undelivered).await;
        let _ = self.admin.leave(&self.config.worker_id).await;
        tracing::info!(worker = %self.config.worker_id, "worker stopped");
    }
}

async fn collect_finished(running: &mut HashMap<String, Running>, out: &mut Vec<JobReport>) {
    let done: Vec<String> = running.iter().filter(|(_, r)| r.task.is_finished()).map(|(k, _)| k.clone()).collect();
    for id in done {
        if let Some(r) = running.remove(&id) {
            match r.task.await {
                Ok(report) => out.push(report),
                Err(e) => tracing::error!(job = %id, error = %e, "a slice task panicked"),
            }
        }
    }
}

fn note_admin_down(since: &mut Option<tokio::time::Instant>, e: &Error) {
    // Said once when it starts, then every minute: slices already running go on meanwhile.
    let now = tokio::time::Instant::now();
    match since {
        None => {
            *since = Some(now);
            tracing::warn!(error = %e, "cannot reach the admin; running slices go on, retrying");
        }
        Some(t) if now.duration_since(*t) > Duration::from_secs(60) => {
            *since = Some(now);
            tracing::warn!(error = %e, "still cannot reach the admin");
        }
        _ => {}
    }
}

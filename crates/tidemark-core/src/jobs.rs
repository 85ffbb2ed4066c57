//! The admin ↔ worker protocol: what a worker registers, what its heartbeats carry, what the
//! admin assigns and cancels, and what a worker reports when a job ends. Plain data: the admin
//! serves it over HTTP (`/api/v1/workers/...`), the worker's client speaks it.
//!
//! The admin is the only scheduler but holds nothing a restart would lose: a worker it does not
//! know is told to register again, and the jobs its heartbeat says it runs are adopted. Fencing
//! never depends on the admin: a slice holds its subscription's lease in the filer, so two
//! workers running the same subscription (a slow worker the admin gave up on) cannot both write.

use serde::{Deserialize, Serialize};

/// The job type whose jobs are slices of event subscriptions.
pub const REMOTE_EVENTS: &str = "remote_events";

/// Where the admin keeps which job types are enabled (absent: all enabled).
pub const JOB_TYPES_DOC: &str = "/etc/tidemark/admin/job_types.json";

/// The persisted job-type switches.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobTypes {
    /// Job types switched off on the Job types page. Everything else is enabled.
    #[serde(default)]
    pub disabled: Vec<String>,
}

impl JobTypes {
    pub fn enabled(&self, job_type: &str) -> bool {
        !self.disabled.iter().any(|d| d == job_type)
    }

    pub fn set(&mut self, job_type: &str, enabled: bool) {
        self.disabled.retain(|d| d != job_type);
        if !enabled {
            self.disabled.push(job_type.to_string());
            self.disabled.sort();
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Register {
    pub worker_id: String,
    /// Job types this worker runs.
    pub capabilities: Vec<String>,
    /// How many jobs it runs at once.
    pub max_execute: usize,
    /// Where it runs (host and pid), for the Workers page.
    pub host: String,
    pub version: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterReply {
    /// How often the admin expects a heartbeat.
    pub heartbeat_ms: u64,
}

/// One job: one slice of one subscription.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub id: String,
    pub job_type: String,
    pub fingerprint: String,
    pub dir: String,
}

/// What a worker measured since its last heartbeat, for the admin's `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Samples {
    pub fingerprint: String,
    /// Wall time of each applied batch (receive excluded), seconds.
    #[serde(default)]
    pub apply_batch_secs: Vec<f64>,
    /// Event time to apply, per applied key, seconds.
    #[serde(default)]
    pub lag_secs: Vec<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// The jobs running on the worker now.
    pub running: Vec<Job>,
    /// A draining worker (shutting down) is given no new work.
    pub draining: bool,
    #[serde(default)]
    pub samples: Vec<Samples>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatReply {
    /// False: the admin does not know this worker (it restarted, or dropped the worker after
    /// missed heartbeats): register again.
    pub known: bool,
    /// Jobs to start.
    pub assign: Vec<Job>,
    /// Ids of running jobs to end now (their subscription was disabled or re-pointed, or the
    /// job type was switched off).
    pub cancel: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobOutcome {
    /// The slice ran to its deadline.
    Deadline,
    /// The admin (or a shutdown) ended it.
    Cancelled,
    /// Another worker took the lease mid-slice.
    LeaseLost,
    /// Another worker holds the lease: the slice did not start.
    LeaseHeld,
    /// The slice failed (its error is in the report and the status blob).
    Failed,
}

impl JobOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            JobOutcome::Deadline => "deadline",
            JobOutcome::Cancelled => "cancelled",
            JobOutcome::LeaseLost => "lease_lost",
            JobOutcome::LeaseHeld => "lease_held",
            JobOutcome::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobReport {
    pub job: Job,
    pub outcome: JobOutcome,
    pub error: Option<String>,
    pub duration_ms: u64,
    pub received: u64,
    pub applied: u64,
}

/// What the admin knows of one worker (the Workers page, `/api/v1/workers`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerInfo {
    pub worker_id: String,
    pub capabilities: Vec<String>,
    pub max_execute: usize,
    pub host: String,
    pub version: String,
    pub running: Vec<Job>,
    pub draining: bool,
    pub registered_at_ms: i64,
    pub last_heartbeat_ms: i64,
    pub jobs_done: u64,
}

impl WorkerInfo {
    pub fn free_slots(&self) -> usize {
        if self.draining { 0 } else { self.max_execute.saturating_sub(self.running.len()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_types_default_to_enabled_and_switch() {
        let mut t = JobTypes::default();
        assert!(t.enabled(REMOTE_EVENTS));
        t.set(REMOTE_EVENTS, false);
        t.set(REMOTE_EVENTS, false);
        assert_eq!(t.disabled, vec![REMOTE_EVENTS.to_string()]);
        assert!(!t.enabled(REMOTE_EVENTS));
        t.set(REMOTE_EVENTS, true);
        assert!(t.enabled(REMOTE_EVENTS));
    }
}

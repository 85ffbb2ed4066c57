//! The admin's scheduling, as pure state: which subscriptions need a slice, which worker runs
//! which, when a failed one may be tried again, and which workers are alive. Time is passed in
//! (milliseconds), so every rule is tested without a clock or a network.
//!
//! - Detection proposes one job per wanted subscription that has none (deduped by fingerprint),
//!   unless it is waiting out a backoff. A job that ends is re-proposed at the next pass: at once
//!   after a deadline or a cancel, after `lease_retry` when another worker held the lease, after
//!   an exponential backoff when it failed.
//! - A heartbeat assigns pending jobs to a worker with free slots and the capability, cancels
//!   its jobs whose subscription is no longer wanted (disabled, re-pointed, job type off), and
//!   adopts jobs the admin did not know of (the admin restarted).
//! - A worker that misses heartbeats for `worker_timeout` is dropped; its jobs are re-proposed.
//!   The slice it may still be running is fenced by its lease, not by the admin.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use tidemark_core::backoff::Backoff;
use tidemark_core::jobs::{HeartbeatReply, Job, JobOutcome, JobReport, REMOTE_EVENTS, Register, WorkerInfo};

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub worker_timeout: Duration,
    /// How soon a job is proposed again after another worker held its subscription's lease.
    pub lease_retry: Duration,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            worker_timeout: Duration::from_secs(15),
            lease_retry: Duration::from_secs(2),
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tracked {
    Pending {
        job: Job,
        since_ms: i64,
    },
    /// `beat`: the worker's heartbeat count when it was assigned; a later heartbeat that does not
    /// list it means the worker did not take it.
    Assigned {
        job: Job,
        worker: String,
        since_ms: i64,
        beat: u64,
    },
}

impl Tracked {
    pub fn job(&self) -> &Job {
        match self {
            Tracked::Pending { job, .. } | Tracked::Assigned { job, .. } => job,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Retry {
    backoff: Backoff,
    pub not_before_ms: i64,
    pub last_outcome: JobOutcome,
    pub last_error: Option<String>,
}

#[derive(Debug, Clone)]
struct Worker {
    info: WorkerInfo,
    beats: u64,
}

/// One finished job, for the pages.
#[derive(Debug, Clone)]
pub struct Finished {
    pub at_ms: i64,
    pub worker: String,
    pub report: JobReport,
}

const RECENT: usize = 200;

#[derive(Debug, Default)]
pub struct Scheduler {
    config: SchedulerConfig,
    /// Wanted subscriptions: fingerprint → directory.
    wanted: BTreeMap<String, String>,
    enabled: bool,
    jobs: BTreeMap<String, Tracked>,
    workers: BTreeMap<String, Worker>,
    retry: BTreeMap<String, Retry>,
    recent: VecDeque<Finished>,
    next_id: u64,
    /// Set per active term of an admin, so the ids of its jobs never equal those of another
    /// admin's that workers may still run.
    epoch: String,
    /// Whether a detection pass has run: until then nothing is known to be unwanted, so what
    /// workers run is adopted, never cancelled (a new active admin hears heartbeats before it
    /// has read the subscriptions).
    detected: bool,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Self {
        Scheduler { config, enabled: true, ..Default::default() }
    }

    /// A schedule whose job ids carry `epoch` (`jEPOCH.N-fingerprint`).
    pub fn with_epoch(config: SchedulerConfig, epoch: &str) -> Self {
        Scheduler { epoch: format!("{epoch}."), ..Self::new(config) }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// One detection pass: `wanted` lists (fingerprint, directory) of every subscription.
    pub fn detect(&mut self, wanted: impl IntoIterator<Item = (String, String)>, enabled: bool, now_ms: i64) {
        self.wanted = wanted.into_iter().collect();
        self.enabled = enabled;
        self.detected = true;
        let wanted = &self.wanted;
        self.jobs.retain(|fp, t| matches!(t, Tracked::Assigned { .. }) || (enabled && wanted.contains_key(fp)));
        self.retry.retain(|fp, _| wanted.contains_key(fp));
        if !enabled {
            return;
        }
        for (fp, dir) in &self.wanted {
            if self.jobs.contains_key(fp) || self.retry.get(fp).is_some_and(|r| now_ms < r.not_before_ms) {
                continue;
            }
            self.next_id += 1;
            let job = Job {
                id: format!("j{}{}-{}", self.epoch, self.next_id, &fp[..fp.len().min(8)]),
                job_type: REMOTE_EVENTS.to_string(),
                fingerprint: fp.clone(),
                dir: dir.clone(),
            };
            self.jobs.insert(fp.clone(), Tracked::Pending { job, since_ms: now_ms });
        }
    }

    /// Whether a job's subscription is still wanted as it was (not disabled, re-pointed, or its
    /// job type switched off).
    pub fn is_wanted(&self, job: &Job) -> bool {
        self.enabled && self.wanted.get(&job.fingerprint).is_some_and(|d| *d == job.dir)
    }

    pub fn register(&mut self, r: Register, now_ms: i64) {
        let jobs_done = self.workers.get(&r.worker_id).map_or(0, |w| w.info.jobs_done);
        let info = WorkerInfo {
            worker_id: r.worker_id.clone(),
            capabilities: r.capabilities,
            max_execute: r.max_execute.max(1),
            host: r.host,
            version: r.version,
            running: Vec::new(),
            draining: false,
            registered_at_ms: now_ms,
            last_heartbeat_ms: now_ms,
            jobs_done,
        };
        self.workers.insert(r.worker_id, Worker { info, beats: 0 });
    }

    pub fn heartbeat(&mut self, worker_id: &str, running: Vec<Job>, draining: bool, now_ms: i64) -> HeartbeatReply {
        let Some(w) = self.workers.get_mut(worker_id) else {
            return HeartbeatReply { known: false, ..Default::default() };
        };
        w.beats += 1;
        w.info.last_heartbeat_ms = now_ms;
        w.info.draining = draining;
        w.info.running = running.clone();
        let beats = w.beats;
        let mut reply = HeartbeatReply { known: true, ..Default::default() };
        for r in &running {
            if self.detected && !self.is_wanted(r) {
                reply.cancel.push(r.id.clone());
                continue;
            }
            match self.jobs.get(&r.fingerprint) {
                Some(Tracked::Assigned { job, worker, .. }) if job.id == r.id && worker == worker_id => {}
                // Someone else runs this subscription now (this worker was given up on): end it.
                Some(Tracked::Assigned { .. }) => reply.cancel.push(r.id.clone()),
                // Not known (the admin restarted) or only proposed: adopt what runs.
                None | Some(Tracked::Pending { .. }) => {
                    self.jobs.insert(
                        r.fingerprint.clone(),
                        Tracked::Assigned {
                            job: r.clone(),
                            worker: worker_id.to_string(),
                            since_ms: now_ms,
                            beat: beats,
                        },
                    );
                }
            }
        }
        // Assigned earlier, not running now: the worker did not take it (or lost it). Propose it again.
        self.jobs.retain(|_, t| match t {
            Tracked::Assigned { job, worker, beat, .. } if worker == worker_id && *beat < beats => {
                running.iter().any(|r| r.id == job.id)
            }
            _ => true,
        });
        let w = &self.workers[worker_id];
        if draining || !w.info.capabilities.iter().any(|c| c == REMOTE_EVENTS) {
            return reply;
        }
        let taken =
            self.jobs.values().filter(|t| matches!(t, Tracked::Assigned { worker, .. } if worker == worker_id)).count();
        let mut free = w.info.max_execute.saturating_sub(taken);
        let mut pending: Vec<(i64, String)> = self
            .jobs
            .iter()
            .filter_map(|(fp, t)| match t {
                Tracked::Pending { since_ms, .. } => Some((*since_ms, fp.clone())),
                _ => None,
            })
            .collect();
        pending.sort();
        for (_, fp) in pending {
            if free == 0 {
                break;
            }
            let Some(Tracked::Pending { job, .. }) = self.jobs.remove(&fp) else { continue };
            reply.assign.push(job.clone());
            self.jobs
                .insert(fp, Tracked::Assigned { job, worker: worker_id.to_string(), since_ms: now_ms, beat: beats });
            free -= 1;
        }
        reply
    }

    pub fn report(&mut self, worker_id: &str, report: JobReport, now_ms: i64) {
        if let Some(w) = self.workers.get_mut(worker_id) {
            w.info.jobs_done += 1;
            w.info.running.retain(|j| j.id != report.job.id);
        }
        let fp = report.job.fingerprint.clone();
        if matches!(self.jobs.get(&fp), Some(Tracked::Assigned { job, .. }) if job.id == report.job.id) {
            self.jobs.remove(&fp);
        }
        let config = &self.config;
        let retry = self.retry.entry(fp).or_insert_with(|| Retry {
            backoff: Backoff::new(config.backoff_base, config.backoff_max),
            not_before_ms: 0,
            last_outcome: report.outcome,
            last_error: None,
        });
        retry.last_outcome = report.outcome;
        retry.last_error = report.error.clone();
        match report.outcome {
            JobOutcome::Deadline | JobOutcome::Cancelled => {
                retry.backoff.succeed();
                retry.not_before_ms = now_ms;
            }
            JobOutcome::LeaseHeld | JobOutcome::LeaseLost => {
                retry.not_before_ms = now_ms + config.lease_retry.as_millis() as i64;
            }
            JobOutcome::Failed => {
                retry.not_before_ms = now_ms + retry.backoff.fail().as_millis() as i64;
            }
        }
        self.recent.push_front(Finished { at_ms: now_ms, worker: worker_id.to_string(), report });
        self.recent.truncate(RECENT);
    }

    /// Drops workers that missed their heartbeats; returns their ids.
    pub fn expire(&mut self, now_ms: i64) -> Vec<String> {
        let timeout = self.config.worker_timeout.as_millis() as i64;
        let dead: Vec<String> = self
            .workers
            .iter()
            .filter(|(_, w)| now_ms - w.info.last_heartbeat_ms > timeout)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &dead {
            self.leave(id);
        }
        dead
    }

    /// The worker is gone (it said so, or was dropped): its jobs are proposed again.
    pub fn leave(&mut self, worker_id: &str) {
        self.workers.remove(worker_id);
        self.jobs.retain(|_, t| !matches!(t, Tracked::Assigned { worker, .. } if worker == worker_id));
    }

    pub fn workers(&self) -> Vec<WorkerInfo> {
        self.workers.values().map(|w| w.info.clone()).collect()
    }

    pub fn job_of(&self, fingerprint: &str) -> Option<&Tracked> {
        self.jobs.get(fingerprint)
    }

    pub fn retry_of(&self, fingerprint: &str) -> Option<&Retry> {
        self.retry.get(fingerprint)
    }

    pub fn recent(&self) -> impl Iterator<Item = &Finished> {
        self.recent.iter()
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn running_jobs(&self) -> usize {
        self.jobs.values().filter(|t| matches!(t, Tracked::Assigned { .. })).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched() -> Scheduler {
        Scheduler::new(SchedulerConfig {
            worker_timeout: Duration::from_secs(10),
            lease_retry: Duration::from_secs(2),
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
        })
    }

    fn reg(s: &mut Scheduler, id: &str, max: usize, now: i64) {
        s.register(
            Register {
                worker_id: id.into(),
                capabilities: vec![REMOTE_EVENTS.into()],
                max_execute: max,
                host: "h".into(),
                version: "v".into(),
            },
            now,
        );
    }

    fn subs(n: usize) -> Vec<(String, String)> {
        (0..n).map(|i| (format!("fp{i:014}"), format!("/m{i}"))).collect()
    }

    fn report(job: &Job, outcome: JobOutcome) -> JobReport {
        JobReport { job: job.clone(), outcome, error: None, duration_ms: 1, received: 0, applied: 0 }
    }

    #[test]
    fn one_job_per_subscription_assigned_up_to_free_slots() {
        let mut s = sched();
        reg(&mut s, "w1", 2, 0);
        reg(&mut s, "w2", 2, 0);
        s.detect(subs(3), true, 0);
        s.detect(subs(3), true, 1); // a second pass proposes nothing twice
        let a = s.heartbeat("w1", vec![], false, 2);
        assert_eq!(a.assign.len(), 2);
        let b = s.heartbeat("w2", vec![], false, 2);
        assert_eq!(b.assign.len(), 1);
        let fps: std::collections::BTreeSet<_> = a.assign.iter().chain(&b.assign).map(|j| &j.fingerprint).collect();
        assert_eq!(fps.len(), 3, "every subscription once");
        // Running them, nothing new is assigned.
        assert!(s.heartbeat("w1", a.assign.clone(), false, 3).assign.is_empty());
    }

    #[test]
    fn a_job_that_ends_is_proposed_again_by_outcome() {
        let mut s = sched();
        reg(&mut s, "w", 1, 0);
        s.detect(subs(1), true, 0);
        let job = s.heartbeat("w", vec![], false, 0).assign.remove(0);
        s.report("w", report(&job, JobOutcome::Deadline), 100);
        s.detect(subs(1), true, 100);
        let next = s.heartbeat("w", vec![], false, 100).assign;
        assert_eq!(next.len(), 1, "re-proposed at once after a deadline");
        assert_ne!(next[0].id, job.id);

        s.report("w", report(&next[0], JobOutcome::Failed), 200);
        s.detect(subs(1), true, 200);
        assert!(s.heartbeat("w", vec![], false, 500).assign.is_empty(), "backing off after a failure");
        s.detect(subs(1), true, 1300);
        let third = s.heartbeat("w", vec![], false, 1300).assign;
        assert_eq!(third.len(), 1, "after the backoff");
        s.report("w", report(&third[0], JobOutcome::Failed), 1400);
        s.detect(subs(1), true, 2500);
        assert!(s.heartbeat("w", vec![], false, 2500).assign.is_empty(), "the second failure waits longer");
        s.detect(subs(1), true, 3500);
        let fourth = s.heartbeat("w", vec![], false, 3500).assign;
        assert_eq!(fourth.len(), 1);
        s.report("w", report(&fourth[0], JobOutcome::LeaseHeld), 4000);
        s.detect(subs(1), true, 5000);
        assert!(s.heartbeat("w", vec![], false, 5000).assign.is_empty(), "lease held: wait lease_retry");
        s.detect(subs(1), true, 6001);
        assert_eq!(s.heartbeat("w", vec![], false, 6001).assign.len(), 1);
    }

    #[test]
    fn disabled_or_repointed_subscriptions_are_cancelled_and_not_proposed() {
        let mut s = sched();
        reg(&mut s, "w", 4, 0);
        s.detect(subs(2), true, 0);
        let jobs = s.heartbeat("w", vec![], false, 0).assign;
        assert_eq!(jobs.len(), 2);
        // The first is disabled, the second re-pointed (a new fingerprint for the same dir).
        s.detect(vec![("fpNEW".to_string(), "/m1".to_string())], true, 10);
        let r = s.heartbeat("w", jobs.clone(), false, 10);
        let mut cancelled = r.cancel.clone();
        cancelled.sort();
        let mut ids: Vec<String> = jobs.iter().map(|j| j.id.clone()).collect();
        ids.sort();
        assert_eq!(cancelled, ids);
        assert_eq!(r.assign.len(), 1);
        assert_eq!(r.assign[0].fingerprint, "fpNEW");
        // The job type switched off: the running one is cancelled, nothing proposed.
        s.detect(vec![("fpNEW".to_string(), "/m1".to_string())], false, 20);
        let r = s.heartbeat("w", r.assign.clone(), false, 20);
        assert_eq!(r.cancel.len(), 1);
        assert!(r.assign.is_empty());
    }

    #[test]
    fn a_silent_worker_is_dropped_and_its_job_goes_elsewhere_and_the_late_one_is_cancelled() {
        let mut s = sched();
        reg(&mut s, "a", 1, 0);
        s.detect(subs(1), true, 0);
        let job = s.heartbeat("a", vec![], false, 0).assign.remove(0);
        reg(&mut s, "b", 1, 5_000);
        s.heartbeat("a", vec![job.clone()], false, 5_000);
        assert!(s.expire(14_000).is_empty());
        s.heartbeat("b", vec![], false, 15_500);
        assert_eq!(s.expire(16_000), vec!["a".to_string()]);
        s.detect(subs(1), true, 16_000);
        let taken = s.heartbeat("b", vec![], false, 16_000).assign;
        assert_eq!(taken.len(), 1, "re-proposed to the live worker");
        // The first wakes up: unknown, registers again, still runs its old job → cancelled.
        assert!(!s.heartbeat("a", vec![job.clone()], false, 20_000).known);
        reg(&mut s, "a", 1, 20_000);
        let r = s.heartbeat("a", vec![job.clone()], false, 20_000);
        assert_eq!(r.cancel, vec![job.id.clone()]);
        assert!(r.assign.is_empty());
    }

    #[test]
    fn a_restarted_admin_adopts_running_jobs_instead_of_proposing_duplicates() {
        let mut s = sched();
        reg(&mut s, "w", 2, 0);
        let running = Job {
            id: "old-1".into(),
            job_type: REMOTE_EVENTS.into(),
            fingerprint: subs(1)[0].0.clone(),
            dir: "/m0".into(),
        };
        s.detect(subs(1), true, 0); // proposed before the worker's first heartbeat
        let r = s.heartbeat("w", vec![running.clone()], false, 1);
        assert!(r.assign.is_empty() && r.cancel.is_empty(), "{r:?}");
        assert!(matches!(s.job_of(&running.fingerprint), Some(Tracked::Assigned { job, .. }) if job.id == "old-1"));
    }

    #[test]
    fn an_assignment_the_worker_did_not_take_is_proposed_again_and_draining_takes_nothing() {
        let mut s = sched();
        reg(&mut s, "w", 1, 0);
        s.detect(subs(1), true, 0);
        let job = s.heartbeat("w", vec![], false, 0).assign.remove(0);
        // Next heartbeat: not running it.
        let r = s.heartbeat("w", vec![], false, 1000);
        assert!(r.assign.is_empty(), "dropped this beat");
        s.detect(subs(1), true, 1000);
        let again = s.heartbeat("w", vec![], true, 2000);
        assert!(again.assign.is_empty(), "a draining worker gets nothing");
        let later = s.heartbeat("w", vec![], false, 3000).assign;
        assert_eq!(later.len(), 1);
        assert_ne!(later[0].id, job.id);
    }

    /// A new active admin hears heartbeats before its first detection pass: it adopts what the
    /// workers run and cancels nothing; once it has read the subscriptions, the usual rules.
    #[test]
    fn a_new_schedule_adopts_before_its_first_detection_and_never_cancels() {
        let mut s = Scheduler::with_epoch(sched().config.clone(), "ab12");
        reg(&mut s, "w", 2, 0);
        let theirs = Job {
            id: "jold.7-fp000000".into(),
            job_type: REMOTE_EVENTS.into(),
            fingerprint: "fp00000000000000".into(),
            dir: "/m0".into(),
        };
        let reply = s.heartbeat("w", vec![theirs.clone()], false, 1);
        assert!(reply.cancel.is_empty(), "nothing is cancelled before detection: {reply:?}");
        assert!(matches!(s.job_of(&theirs.fingerprint), Some(Tracked::Assigned { job, .. }) if job.id == theirs.id));
        s.detect(subs(2), true, 2);
        let reply = s.heartbeat("w", vec![theirs.clone()], false, 3);
        assert!(reply.cancel.is_empty(), "still wanted: kept");
        assert!(reply.assign.iter().all(|j| j.id.starts_with("jab12.")), "this term's ids: {reply:?}");
        s.detect(subs(0), true, 4);
        assert_eq!(s.heartbeat("w", vec![theirs.clone()], false, 5).cancel, vec![theirs.id], "unwanted now: cancelled");
    }
}

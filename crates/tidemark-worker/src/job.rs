//! One job of type `remote_events`: one slice of one subscription, read fresh from the filer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use tidemark_cloud::local::LocalRoots;

use tidemark_core::jobs::{Job, JobOutcome, JobReport};
use tidemark_core::remote::{MountMapping, RemoteConf, system_paths};
use tidemark_core::subscription::{SubscriptionDoc, doc_path};
use tidemark_core::{Error, Filer, Result, SystemClock};
use tidemark_engine::docs::{cluster_id, read_json};
use tidemark_engine::slice::{Slice, SliceEnd, SliceObserver, SliceOutcome};

/// How a worker runs its slices.
#[derive(Debug, Clone)]
pub struct SliceSettings {
    /// How long a slice holds its subscription's lease without renewing it. A worker that stops
    /// (paused, partitioned) loses its subscriptions to another worker this long after.
    pub lease_ttl: Duration,
    /// The local directories a local remote may serve (`--local-root`); none by default.
    pub local_roots: LocalRoots,
}

impl Default for SliceSettings {
    fn default() -> Self {
        SliceSettings { lease_ttl: Duration::from_secs(30), local_roots: LocalRoots::default() }
    }
}

async fn run_slice(
    filer: &dyn Filer,
    job: &Job,
    holder: &str,
    settings: &SliceSettings,
    observer: &dyn SliceObserver,
    cancel: watch::Receiver<bool>,
) -> Result<SliceOutcome> {
    let (doc, _) = read_json::<SubscriptionDoc>(filer, &doc_path(&job.dir))
        .await?
        .ok_or_else(|| Error::invalid_argument(format!("{} has no event subscription any more", job.dir)))?;
    if doc.fingerprint != job.fingerprint {
        return Err(Error::invalid_argument(format!(
            "the subscription of {} was re-pointed (fingerprint {} is now {})",
            job.dir, job.fingerprint, doc.fingerprint
        )));
    }
    let (mapping, _) = read_json::<MountMapping>(filer, system_paths::MOUNT_MAPPING).await?.unwrap_or_default();
    let mount = mapping.find_dir(&doc.dir).cloned().ok_or_else(|| {
        Error::invalid_argument(format!("{} has an event subscription but is no longer a mount", doc.dir))
    })?;
    let (conf, _) = read_json::<RemoteConf>(filer, &system_paths::remote_conf(&mount.location.storage))
        .await?
        .ok_or_else(|| {
            Error::invalid_argument(format!("the remote {:?} of {} is not configured", mount.location.storage, doc.dir))
        })?;
    // Every request the slice makes of the bucket and of its queue is counted in the
    // subscription's counters.
    let requests = tidemark_core::requests::Requests::default();
    let storage = tidemark_core::requests::Counted::new(
        tidemark_cloud::open_storage(&conf, &mount.location.bucket, &settings.local_roots).await?,
        requests.clone(),
    );
    let visibility = Duration::from_secs(doc.options.visibility_timeout_secs);
    let (source, provider) = tidemark_cloud::open_event_source(
        &conf,
        &doc.identity,
        &doc.managed,
        visibility,
        &settings.local_roots,
        &requests,
    )
    .await?;
    let cluster = cluster_id(filer).await?;
    let slice = Slice {
        filer,
        storage: &storage,
        source: &*source,
        clock: &SystemClock,
        doc: &doc,
        mount: &mount,
        provider,
        cluster_id: Some(&cluster),
        holder,
        length: Duration::from_secs(doc.options.slice_secs.max(1)),
        lease_ttl: settings.lease_ttl,
        observer,
        requests: Some(&requests),
    };
    let mut cancel = cancel;
    slice
        .run(async move {
            let _ = cancel.wait_for(|c| *c).await;
        })
        .await
}

/// Runs the job's slice and says how it ended; never fails (a failure is the report's outcome).
pub async fn run(
    filer: Arc<dyn Filer>,
    job: Job,
    holder: String,
    settings: SliceSettings,
    observer: Arc<dyn SliceObserver>,
    cancel: watch::Receiver<bool>,
) -> JobReport {
    let began = Instant::now();
    let result = run_slice(&*filer, &job, &holder, &settings, &*observer, cancel).await;
    let (outcome, error, received, applied) = match result {
        Ok(o) => {
            let outcome = match o.end {
                SliceEnd::Deadline => JobOutcome::Deadline,
                SliceEnd::Cancelled => JobOutcome::Cancelled,
                SliceEnd::LeaseLost => JobOutcome::LeaseLost,
            };
            tracing::info!(dir = %job.dir, fingerprint = %job.fingerprint, generation = o.generation, end = outcome.as_str(),
                reconciled = ?o.reconciled, received = o.counters.received, applied = o.counters.applied, "slice ended");
            (outcome, None, o.counters.received, o.counters.applied)
        }
        Err(e @ Error::LeaseHeld { .. }) => {
            tracing::debug!(dir = %job.dir, error = %e, "another worker holds the subscription's lease");
            (JobOutcome::LeaseHeld, Some(e.to_string()), 0, 0)
        }
        Err(e) => {
            tracing::warn!(dir = %job.dir, fingerprint = %job.fingerprint, error = %e, "slice failed");
            (JobOutcome::Failed, Some(e.to_string()), 0, 0)
        }
    };
    JobReport { job, outcome, error, duration_ms: began.elapsed().as_millis() as u64, received, applied }
}

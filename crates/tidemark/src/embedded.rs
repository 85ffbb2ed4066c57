//! The embedded slice runner of `tidemark server`: what the admin's detection and a worker do in
//! a scaled-out deployment, in one loop. Every few seconds it reads the subscription documents
//! and keeps one slice running per subscription — re-proposing the next when one ends, backing
//! off after errors, and cancelling the slice of a subscription that was disabled or re-pointed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tidemark_core::backoff::Backoff;
use tidemark_core::remote::{MountMapping, RemoteConf, system_paths};
use tidemark_core::subscription::{SUBSCRIPTIONS_DIR, SubscriptionDoc};
use tidemark_core::{Error, MetaStore, Result};
use tidemark_engine::slice::{Slice, SliceEnd};
use tidemark_filer::LocalFiler;
use tidemark_filer::remotes::read_doc;
use tokio::sync::watch;

/// How often the subscription documents are read.
const SCAN: Duration = Duration::from_secs(2);
/// How long a slice holds its lease without renewing it.
const LEASE_TTL: Duration = Duration::from_secs(30);

struct Running {
    task: tokio::task::JoinHandle<Result<SliceEnd>>,
    cancel: watch::Sender<bool>,
}

async fn subscription_docs(store: &dyn MetaStore) -> Result<Vec<SubscriptionDoc>> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = match store.list(SUBSCRIPTIONS_DIR, after.as_deref(), 1000).await {
            Ok(p) => p,
            Err(Error::NotFound { .. }) => return Ok(out),
            Err(e) => return Err(e),
        };
        for e in &page.entries {
            match read_doc::<SubscriptionDoc>(store, &e.path).await {
                Ok(Some((d, _))) => out.push(d),
                Ok(None) => {}
                Err(err) => tracing::warn!(doc = %e.path, error = %err, "unreadable subscription document"),
            }
        }
        match page.next {
            Some(n) => after = Some(n),
            None => return Ok(out),
        }
    }
}

async fn run_one(
    filer: Arc<LocalFiler>,
    doc: SubscriptionDoc,
    holder: String,
    cancel: watch::Receiver<bool>,
) -> Result<SliceEnd> {
    let store = filer.store().as_ref();
    let (mapping, _) = read_doc::<MountMapping>(store, system_paths::MOUNT_MAPPING).await?.unwrap_or_default();
    let mount = mapping.find_dir(&doc.dir).cloned().ok_or_else(|| {
        Error::invalid_argument(format!("{} has an event subscription but is no longer a mount", doc.dir))
    })?;
    let (conf, version) =
        read_doc::<RemoteConf>(store, &system_paths::remote_conf(&mount.location.storage)).await?.ok_or_else(|| {
            Error::invalid_argument(format!("the remote {:?} of {} is not configured", mount.location.storage, doc.dir))
        })?;
    let storage = filer.remotes().storage(&conf, version, &mount.location.bucket).await?;
    let visibility = Duration::from_secs(doc.options.visibility_timeout_secs);
    let (source, provider) = tidemark_cloud::open_event_source(&conf, &doc.identity.queue, visibility).await?;
    let cluster_id = filer.cluster_id().await?;
    let clock = filer.clock().clone();
    let slice = Slice {
        filer: &*filer,
        storage: &*storage,
        source: &*source,
        clock: clock.as_ref(),
        doc: &doc,
        mount: &mount,
        provider,
        cluster_id: Some(&cluster_id),
        holder: &holder,
        length: Duration::from_secs(doc.options.slice_secs.max(1)),
        lease_ttl: LEASE_TTL,
    };
    let mut cancel = cancel;
    let out = slice
        .run(async move {
            let _ = cancel.wait_for(|c| *c).await;
        })
        .await?;
    tracing::info!(dir = %doc.dir, fingerprint = %doc.fingerprint, end = ?out.end, reconciled = ?out.reconciled,
        received = out.counters.received, applied = out.counters.applied, "slice ended");
    Ok(out.end)
}

/// Runs slices for every subscription until `stop` turns true.
pub async fn run(filer: Arc<LocalFiler>, holder: String, mut stop: watch::Receiver<bool>) {
    let mut running: HashMap<String, Running> = HashMap::new();
    let mut backoff: HashMap<String, (Backoff, tokio::time::Instant)> = HashMap::new();
    loop {
        let docs = match subscription_docs(filer.store().as_ref()).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "reading the subscriptions failed");
                Vec::new()
            }
        };
        // Slices whose subscription is gone or re-pointed end now.
        running.retain(|fp, r| {
            let wanted = docs.iter().any(|d| &d.fingerprint == fp);
            if !wanted {
                let _ = r.cancel.send(true);
            }
            wanted || !r.task.is_finished()
        });
        for doc in docs {
            let fp = doc.fingerprint.clone();
            if let Some(r) = running.get_mut(&fp) {
                if !r.task.is_finished() {
                    continue;
                }
                let result = (&mut r.task).await;
                let entry = backoff.entry(fp.clone()).or_insert_with(|| {
                    (Backoff::new(Duration::from_secs(1), Duration::from_secs(300)), tokio::time::Instant::now())
                });
                match result {
                    Ok(Ok(SliceEnd::Deadline)) | Ok(Ok(SliceEnd::Cancelled)) => entry.0.succeed(),
                    Ok(Ok(SliceEnd::LeaseLost)) | Ok(Err(Error::LeaseHeld { .. })) => {
                        // Someone else runs it; look again later.
                        entry.1 = tokio::time::Instant::now() + LEASE_TTL / 2;
                    }
                    Ok(Err(e)) => {
                        let wait = entry.0.fail();
                        entry.1 = tokio::time::Instant::now() + wait;
                        tracing::warn!(dir = %doc.dir, error = %e, retry_in_s = wait.as_secs(), "slice failed");
                    }
                    Err(e) => tracing::error!(dir = %doc.dir, error = %e, "slice task panicked"),
                }
                running.remove(&fp);
            }
            if backoff.get(&fp).is_some_and(|(_, next)| tokio::time::Instant::now() < *next) {
                continue;
            }
            let (cancel_tx, cancel_rx) = watch::channel(false);
            let task = tokio::spawn(run_one(filer.clone(), doc, holder.clone(), cancel_rx));
            running.insert(fp, Running { task, cancel: cancel_tx });
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            _ = tokio::time::sleep(SCAN) => {}
        }
    }
    // Shut down: every slice ends cleanly (status written, lease released).
    for (_, r) in running.drain() {
        let _ = r.cancel.send(true);
        let _ = r.task.await;
    }
}

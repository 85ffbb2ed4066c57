//! What detection reads from the filer on each pass: the subscription documents, their status
//! blobs and leases, and the job-type switches.

use tidemark_core::jobs::{JOB_TYPES_DOC, JobTypes};
use tidemark_core::model::Lease;
use tidemark_core::remote::{MountMapping, RemoteConf, StorageKind, system_paths};
use tidemark_core::subscription::{SUBSCRIPTIONS_DIR, SubscriptionDoc};
use tidemark_core::{Error, Filer, Result};
use tidemark_engine::docs::read_json;
use tidemark_engine::slice::{StatusBlob, lease_name, status_path};

#[derive(Debug, Clone)]
pub struct SubscriptionView {
    pub doc: SubscriptionDoc,
    pub status: Option<StatusBlob>,
    pub lease: Option<Lease>,
    /// The kind of its mount's remote (`None`: no longer a mount, or its remote unreadable).
    pub kind: Option<StorageKind>,
}

#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub subscriptions: Vec<SubscriptionView>,
    pub job_types: JobTypes,
    /// Documents that could not be read, with why (shown on the page, not fatal).
    pub problems: Vec<String>,
    pub read_at_ms: i64,
}

pub async fn read(filer: &dyn Filer) -> Result<Snapshot> {
    let mut snap = Snapshot {
        job_types: read_json::<JobTypes>(filer, JOB_TYPES_DOC).await?.map(|(t, _)| t).unwrap_or_default(),
        read_at_ms: crate::now_ms(),
        ..Default::default()
    };
    // Each subscription's provider, through its mount's remote (read once a pass, and only
    // when there is a subscription).
    let mut mapping: Option<Option<MountMapping>> = None;
    let mut kinds: std::collections::HashMap<String, Option<StorageKind>> = Default::default();
    let mut after: Option<String> = None;
    loop {
        let page = match filer.list(SUBSCRIPTIONS_DIR, after.as_deref(), 1000).await {
            Ok(p) => p,
            Err(Error::NotFound { .. }) => break,
            Err(e) => return Err(e),
        };
        for e in &page.entries {
            let doc = match read_json::<SubscriptionDoc>(filer, &e.path).await {
                Ok(Some((d, _))) => d,
                Ok(None) => continue,
                Err(err) => {
                    snap.problems.push(format!("{}: {err}", e.path));
                    continue;
                }
            };
            let status = match read_json::<StatusBlob>(filer, &status_path(&doc.fingerprint)).await {
                Ok(s) => s.map(|(s, _)| s),
                Err(err) => {
                    snap.problems.push(format!("status of {}: {err}", doc.dir));
                    None
                }
            };
            let lease = filer.lease_get(&lease_name(&doc.fingerprint)).await?;
            if mapping.is_none() {
                mapping = Some(read_json::<MountMapping>(filer, system_paths::MOUNT_MAPPING).await?.map(|(m, _)| m));
            }
            let remote = mapping
                .as_ref()
                .and_then(|m| m.as_ref())
                .and_then(|m| m.find_dir(&doc.dir))
                .map(|m| m.location.storage.clone());
            let kind = match remote {
                None => None,
                Some(r) => match kinds.get(&r) {
                    Some(k) => *k,
                    None => {
                        let k = read_json::<RemoteConf>(filer, &system_paths::remote_conf(&r))
                            .await
                            .ok()
                            .flatten()
                            .map(|(c, _)| c.kind);
                        kinds.insert(r, k);
                        k
                    }
                },
            };
            snap.subscriptions.push(SubscriptionView { doc, status, lease, kind });
        }
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    Ok(snap)
}

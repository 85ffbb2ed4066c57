//! The filer's outbound `remote.sync` loop: follows the change log and hands each local change
//! under a mount with sync enabled to `tidemark_engine::outbound::sync_record`. Its position is
//! a file in the data directory (`outbound.cursor`), written after each batch, so a restart
//! resumes where it stopped; handling a record again is harmless (it looks at current state).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tidemark_core::backoff::Backoff;
use tidemark_core::remote::{MountMapping, RemoteConf, system_paths};
use tidemark_core::{Error, Filer, Result};
use tidemark_engine::outbound::{OutboundOutcome, sync_record};

use crate::local::LocalFiler;
use crate::remotes::read_doc;

pub struct OutboundSync {
    filer: Arc<LocalFiler>,
    cursor_file: PathBuf,
}

fn read_cursor(p: &PathBuf) -> u64 {
    std::fs::read_to_string(p).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

fn write_cursor(p: &PathBuf, seq: u64) -> Result<()> {
    let tmp = p.with_extension("tmp");
    std::fs::write(&tmp, seq.to_string())
        .and_then(|_| std::fs::File::open(&tmp)?.sync_all())
        .and_then(|_| std::fs::rename(&tmp, p))
        .map_err(|e| Error::io(format!("writing {}", p.display()), e))
}

impl OutboundSync {
    pub fn new(filer: Arc<LocalFiler>, data_dir: &std::path::Path) -> Self {
        OutboundSync { filer, cursor_file: data_dir.join("outbound.cursor") }
    }

    /// Where the loop will resume.
    pub fn cursor(&self) -> u64 {
        read_cursor(&self.cursor_file)
    }

    /// Runs until `stop` resolves.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(60));
        loop {
            tokio::select! {
                _ = &mut stop => return,
                r = self.step(Duration::from_secs(10)) => match r {
                    Ok(_) => backoff.succeed(),
                    Err(e) => {
                        let wait = backoff.fail();
                        tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "outbound sync: will retry");
                        tokio::select! {
                            _ = &mut stop => return,
                            _ = tokio::time::sleep(wait) => {}
                        }
                    }
                },
            }
        }
    }

    /// Handles the next batch of change-log records (waiting up to `wait` for one). Stops at a
    /// record that fails transiently, keeping the cursor before it, so it is retried.
    pub async fn step(&self, wait: Duration) -> Result<Vec<OutboundOutcome>> {
        let after = read_cursor(&self.cursor_file);
        let records = self.filer.changes(after, 500, wait).await?;
        let Some(last) = records.last().map(|r| r.seq) else { return Ok(Vec::new()) };
        let store = self.filer.store().as_ref();
        let (mapping, _) = read_doc::<MountMapping>(store, system_paths::MOUNT_MAPPING).await?.unwrap_or_default();
        let mut outcomes = Vec::new();
        let mut cluster: Option<String> = None;
        for r in &records {
            let Some(mount) = mapping.find_for(&r.path).filter(|m| m.sync) else { continue };
            let id = match &cluster {
                Some(id) => id.clone(),
                None => {
                    let id = self.filer.cluster_id().await?;
                    cluster = Some(id.clone());
                    id
                }
            };
            let conf_path = system_paths::remote_conf(&mount.location.storage);
            let Some((conf, conf_version)) = read_doc::<RemoteConf>(store, &conf_path).await? else {
                tracing::warn!(mount = %mount.dir, "outbound sync: the mount's remote is not configured; skipping");
                continue;
            };
            let storage = self.filer.remotes().storage(&conf, conf_version, &mount.location.bucket).await?;
            match sync_record(&*self.filer, &*storage, mount, &id, self.filer.clock().as_ref(), r).await {
                Ok(o) => {
                    if o != OutboundOutcome::Nothing {
                        tracing::info!(outcome = ?o, "outbound sync");
                    }
                    outcomes.push(o);
                }
                // A key the bucket cannot hold will never upload; say so and go on.
                Err(e @ (Error::InvalidArgument { .. } | Error::InvalidPath { .. })) => {
                    tracing::error!(path = %r.path, error = %e, "outbound sync: cannot upload; the entry stays local");
                }
                Err(e) => {
                    write_cursor(&self.cursor_file, r.seq - 1)?;
                    return Err(e);
                }
            }
        }
        write_cursor(&self.cursor_file, last)?;
        Ok(outcomes)
    }
}

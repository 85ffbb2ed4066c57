//! `tidemark server --local-bucket DIR`: a local directory mounted as a bucket with events on,
//! set up through the same shell commands an operator would type, so the quick start shows the
//! whole loop — a file copied into DIR appears in the namespace within a second.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tidemark_core::Filer;
use tidemark_core::remote::{MountMapping, system_paths};
use tidemark_engine::docs::read_json;

use crate::shell::{self, Context};

pub struct LocalBucket {
    root: PathBuf,
    name: String,
}

fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

impl LocalBucket {
    /// The directory (created if missing) split into the remote's root and the bucket's name.
    pub fn resolve(dir: &Path) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create --local-bucket {}: {e}", dir.display()))?;
        let dir = std::fs::canonicalize(dir).map_err(|e| format!("cannot resolve {}: {e}", dir.display()))?;
        let name = dir.file_name().and_then(|n| n.to_str()).map(str::to_string).ok_or_else(|| {
            format!("--local-bucket {}: the directory's name must be UTF-8 (it names the mount)", dir.display())
        })?;
        if tidemark_core::path::segment_problem(&name).is_some() || name.starts_with('.') {
            return Err(format!("--local-bucket {}: {name:?} cannot name a mount", dir.display()));
        }
        let root = dir.parent().map(Path::to_path_buf).ok_or("--local-bucket cannot be the root directory")?;
        let root = root.to_str().ok_or("--local-bucket's parent directory must be UTF-8")?.into();
        Ok(LocalBucket { root, name })
    }

    /// The bucket's directory on this machine.
    pub fn dir(&self) -> PathBuf {
        self.root.join(&self.name)
    }

    /// The mount's directory in the namespace.
    pub fn mount_dir(&self) -> String {
        format!("/buckets/{}", self.name)
    }

    /// Configures the remote, mounts it (first time) and enables events; says what it did.
    pub async fn set_up(&self, filer: Arc<dyn Filer>) -> Result<String, String> {
        let ctx = Context { filer: filer.clone(), admin: None, http: None };
        let dir = self.mount_dir();
        // One remote per parent directory, named after it, so two buckets side by side share it.
        let remote = format!("local-{}", short_hash(&self.root.to_string_lossy()));
        let mapping = read_json::<MountMapping>(&*filer, system_paths::MOUNT_MAPPING)
            .await
            .map_err(|e| e.to_string())?
            .map(|(m, _)| m)
            .unwrap_or_default();
        let mut lines = vec![format!(
            "remote.configure -name={remote} -type=local -local.root={}",
            quote(&self.root.to_string_lossy())
        )];
        match mapping.find_dir(&dir) {
            Some(m) if m.location.storage == remote && m.location.bucket == self.name => {}
            Some(m) => {
                return Err(format!(
                    "{dir} is already a mount of {}/{}; unmount it first (remote.unmount -dir={dir})",
                    m.location.storage, m.location.bucket
                ));
            }
            None => lines.push(format!("remote.mount -dir={} -remote={remote}/{}", quote(&dir), self.name)),
        }
        lines.push(format!("remote.events.enable -dir={}", quote(&dir)));
        for line in lines {
            let mut out = Vec::new();
            let mut err = Vec::new();
            if !shell::run_line(&ctx, &line, &mut out, &mut err).await {
                return Err(format!("{line}: {}", String::from_utf8_lossy(&err).trim()));
            }
        }
        Ok(format!(
            "tidemark: {} is mounted at {dir} with events on; files copied there appear in the namespace",
            self.root.join(&self.name).display()
        ))
    }
}

fn short_hash(s: &str) -> String {
    // FNV-1a: stable across versions and platforms, which std's hasher is not.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    format!("{:08x}", h as u32)
}

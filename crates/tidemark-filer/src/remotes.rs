//! The filer's view of its remote mounts: reading the mount mapping and remote configurations
//! from the namespace, and keeping one storage client per configuration for lazy reads.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::de::DeserializeOwned;

use tidemark_cloud::local::LocalRoots;

use tidemark_core::backoff::Resumes;
use tidemark_core::filer::{Reopened, resuming};
use tidemark_core::keymap::KeyMap;
use tidemark_core::model::Entry;
use tidemark_core::remote::{MountMapping, RemoteConf, RemoteObject, system_paths};
use tidemark_core::requests::{Counted, Requests};
use tidemark_core::{ByteRange, ByteStream, Error, MetaStore, RemoteStorage, Result};

/// Reads a JSON system document; `None` if it does not exist.
pub async fn read_doc<T: DeserializeOwned>(store: &dyn MetaStore, path: &str) -> Result<Option<(T, u64)>> {
    let Some(entry) = store.get(path).await? else { return Ok(None) };
    let bytes = store.read_inline(path).await?.unwrap_or_default();
    let doc = serde_json::from_slice(&bytes).map_err(|e| Error::internal(format!("{path} is not valid: {e}")))?;
    Ok(Some((doc, entry.version)))
}

/// (remote name, the version of its configuration, bucket).
type ClientKey = (String, u64, String);

#[derive(Default)]
pub struct Remotes {
    /// Storage clients by (remote name, its configuration's version, bucket): a changed
    /// configuration gets a new client.
    clients: Mutex<HashMap<ClientKey, Arc<dyn RemoteStorage>>>,
    /// Storages handed in by the embedding program, by (remote name, bucket): used instead of
    /// opening the configured one (the simulation's in-process bucket).
    given: Mutex<HashMap<(String, String), Arc<dyn RemoteStorage>>>,
    /// The local directories a local remote may serve (`--local-root`); none unless told.
    local_roots: Mutex<LocalRoots>,
    /// GETs that resumed a stream broken mid-object (see [`Located::get`]).
    resumed: Arc<AtomicU64>,
    /// HEADs asking for the headers of objects whose entries came from a listing.
    header_heads: AtomicU64,
    /// Every request to the buckets of each remote, by operation.
    requests: Mutex<BTreeMap<String, Requests>>,
}

impl Remotes {
    /// How many GETs resumed a stream that broke mid-object, since the filer started.
    pub fn resumed(&self) -> u64 {
        self.resumed.load(Ordering::Relaxed)
    }

    /// The requests made of each remote's buckets, by operation, since the filer started.
    pub fn requests(&self) -> BTreeMap<String, BTreeMap<String, u64>> {
        let all = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        all.iter().map(|(remote, r)| (remote.clone(), r.snapshot())).collect()
    }

    /// How many HEADs asked for the headers of objects whose entries came from a listing.
    pub fn header_heads(&self) -> u64 {
        self.header_heads.load(Ordering::Relaxed)
    }

    /// A remote-backed entry's object as a HEAD answers it now (`None`: gone), counted.
    pub async fn head(&self, store: &dyn MetaStore, entry: &Entry) -> Result<Option<RemoteObject>> {
        let located = self.locate(store, entry).await?;
        self.header_heads.fetch_add(1, Ordering::Relaxed);
        located.storage.stat(&located.key).await
    }

    /// Local remotes may serve these directories (and what lies below them) from now on.
    pub fn allow_local(&self, roots: LocalRoots) {
        *self.local_roots.lock().unwrap_or_else(|p| p.into_inner()) = roots;
    }

    /// Reads of entries under mounts of remote `name`, bucket `bucket`, go to `storage`.
    pub fn provide(&self, name: &str, bucket: &str, storage: Arc<dyn RemoteStorage>) {
        self.given.lock().unwrap_or_else(|p| p.into_inner()).insert((name.into(), bucket.into()), storage);
    }

    /// The storage of `conf` for `bucket`, connecting on first use.
    pub async fn storage(&self, conf: &RemoteConf, conf_version: u64, bucket: &str) -> Result<Arc<dyn RemoteStorage>> {
        let key = (conf.name.clone(), conf_version, bucket.to_string());
        if let Some(s) = self.clients.lock().map_err(|_| Error::internal("remote clients poisoned"))?.get(&key) {
            return Ok(s.clone());
        }
        let roots = self.local_roots.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let opening = std::time::Instant::now();
        let requests =
            self.requests.lock().unwrap_or_else(|p| p.into_inner()).entry(conf.name.clone()).or_default().clone();
        let s: Arc<dyn RemoteStorage> =
            Arc::new(Counted::new(tidemark_cloud::open_storage(conf, bucket, &roots).await?, requests));
        tracing::debug!(storage = %conf.name, bucket, ms = opening.elapsed().as_secs_f64() * 1e3, "bucket client opened");
        self.clients.lock().map_err(|_| Error::internal("remote clients poisoned"))?.insert(key, s.clone());
        Ok(s)
    }

    /// The object behind a remote-backed entry: its storage, its key, and the mount's directory
    /// (for messages).
    pub async fn locate(&self, store: &dyn MetaStore, entry: &Entry) -> Result<Located> {
        let recorded = entry
            .remote
            .as_ref()
            .ok_or_else(|| Error::internal(format!("{}: remote content without a remote", entry.path)))?;
        let (mapping, _) = read_doc::<MountMapping>(store, system_paths::MOUNT_MAPPING).await?.unwrap_or_default();
        let mount = mapping.find_for(&entry.path).ok_or_else(|| Error::Unavailable {
            message: format!("{}: its content is remote, but no mount covers it any more", entry.path),
        })?;
        let given = self
            .given
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(mount.location.storage.clone(), mount.location.bucket.clone()))
            .cloned();
        // A file renamed in the mount is read from its old key until the outbound sync moves it.
        let at = recorded.moved_from.as_deref().unwrap_or(&entry.path);
        let map = KeyMap::new(&mount.dir, &mount.location.path)?;
        let key = map.path_to_key(at, false).ok_or_else(|| Error::internal(format!("{at} has no key")))?;
        let located = |storage| Located {
            storage,
            key: key.clone(),
            etag: recorded.etag.clone(),
            path: entry.path.clone(),
            mount_dir: mount.dir.clone(),
            size: entry.size,
            resumed: self.resumed.clone(),
        };
        if let Some(storage) = given {
            return Ok(located(storage));
        }
        let conf_path = system_paths::remote_conf(&mount.location.storage);
        let (conf, conf_version) =
            read_doc::<RemoteConf>(store, &conf_path).await?.ok_or_else(|| Error::Unavailable {
                message: format!(
                    "{}: the remote {:?} of its mount is not configured (remote.configure)",
                    entry.path, mount.location.storage
                ),
            })?;
        let storage = self.storage(&conf, conf_version, &mount.location.bucket).await?;
        Ok(located(storage))
    }

    /// Streams the content of a remote-backed entry from its object, refusing other bytes than
    /// the version the entry describes.
    pub async fn read(&self, store: &dyn MetaStore, entry: &Entry, range: Option<ByteRange>) -> Result<ByteStream> {
        self.locate(store, entry).await?.get(range).await
    }
}

/// How a GET whose stream breaks mid-object goes on: from the first byte not yet received,
/// with a ranged GET of the same version (a bucket's connections do break: resets, and stalls
/// the storage's client gives up on). At most this many resumes in a row (see [`Resumes`]),
/// waiting `RESUME_BACKOFF`, doubled each time, before each; then the read fails.
const RESUMES_IN_A_ROW: u32 = 5;
const RESUME_BACKOFF: Duration = Duration::from_millis(100);

/// A remote-backed entry's object, found.
#[derive(Clone)]
pub struct Located {
    pub storage: Arc<dyn RemoteStorage>,
    pub key: String,
    pub etag: String,
    pub path: String,
    pub mount_dir: String,
    /// The version's size, as the entry has it.
    size: u64,
    /// Counts the GETs that resumed a broken stream (the filer's, across its objects).
    resumed: Arc<AtomicU64>,
}

impl Located {
    /// A conditional GET of the entry's version, with errors that say what to do. A stream
    /// that breaks mid-object is resumed where it broke (see [`RESUMES_IN_A_ROW`]): the reader
    /// sees one stream of the version's bytes, or an error.
    pub async fn get(&self, range: Option<ByteRange>) -> Result<ByteStream> {
        let stream = self.open(range).await.map_err(|e| self.explain(e))?;
        let (pos, end) =
            range.map_or((0, self.size), |r| (r.offset, r.length.map_or(self.size, |n| r.offset.saturating_add(n))));
        let end = end.min(self.size);
        let resumes = Resumes::new(RESUME_BACKOFF, RESUMES_IN_A_ROW);
        let at = self.clone();
        let reopen = move |rest: ByteRange, e: &std::io::Error| {
            tracing::warn!(path = %at.path, at = rest.offset, error = %e, "the bucket's stream broke mid-object; resuming it with a ranged GET");
            let at = at.clone();
            async move {
                match at.open(Some(rest)).await {
                    Ok(s) => {
                        at.resumed.fetch_add(1, Ordering::Relaxed);
                        Reopened::Stream(s)
                    }
                    // The object changed or went meanwhile: no other version's bytes follow these.
                    Err(e @ (Error::PreconditionFailed { .. } | Error::NotFound { .. } | Error::Archived { .. })) => {
                        Reopened::Fail(std::io::Error::other(at.explain(e).to_string()))
                    }
                    Err(e) => Reopened::Retry(std::io::Error::other(e.to_string())),
                }
            }
        };
        Ok(resuming(stream, pos, end, resumes, reopen))
    }

    async fn open(&self, range: Option<ByteRange>) -> Result<ByteStream> {
        self.storage.get(&self.key, range, Some(&self.etag)).await
    }

    /// A failed GET's error as the reader should see it: what happened, and what to do.
    fn explain(&self, e: Error) -> Error {
        match e {
            Error::PreconditionFailed { .. } => Error::Unavailable {
                message: format!(
                    "{}: the object changed in the bucket since it was last synced; run remote.meta.sync -dir={} (or wait for its event) and read again",
                    self.path, self.mount_dir
                ),
            },
            Error::NotFound { .. } => Error::Unavailable {
                message: format!(
                    "{}: the object is gone from the bucket; run remote.meta.sync -dir={} to drop the entry",
                    self.path, self.mount_dir
                ),
            },
            // Not a failure to retry: the object must be restored first (the reader names the
            // entry's storage class).
            Error::Archived { storage_class, .. } => Error::Archived { path: self.path.clone(), storage_class },
            e => Error::Unavailable {
                message: format!(
                    "{}: not cached here, and its bucket {} could not be read: {e}",
                    self.path,
                    self.storage.describe()
                ),
            },
        }
    }
}

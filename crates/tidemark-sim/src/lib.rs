//! Deterministic simulation of the engine. One seed fully determines a run of the **real**
//! applier (`apply_batch`), reconciler, `decide`, conditional writes and lease fencing of the
//! real filer and store, against an in-process bucket whose notifications go through a queue
//! that duplicates, delays, reorders, drops and redelivers, with local writers, two workers that
//! pause and resume, and a clock that expires leases and visibility timeouts.
//!
//! The harness picks each next step from the seed: a put or delete in the bucket (and its
//! notification), a metadata-preserving copy (of another key's object, of an upload from another
//! mount of this cluster, or of an older upload of the same key restored over it), a local write, a worker's step (acquire / renew the lease, receive a batch,
//! apply it with its fence), a pause or resume, the clock moving on, a fenced reconcile. Steps run
//! one at a time, so a run's outcome does not depend on thread timing. Then quiescence: every
//! worker resumes, one drains the queue, and the properties are checked:
//!
//! 1. with no dropped notification, the namespace equals the bucket (keys, sizes, etags) before
//!    any final reconcile; after one, always;
//! 2. a local write not yet uploaded is never overwritten by remote state;
//! 3. no write lands from a stale lease generation (checked at every write);
//! 4. every acknowledged message's change is reflected when it is acknowledged (checked at every
//!    acknowledgement); `applied <= received`, and `received` is what the queue delivered;
//! 5. a read (through the filer's content cache: tiny chunks and budget, so reads cross chunks
//!    and evict; some files uncached at random) returns exactly the bytes of the version its
//!    entry describes — never another version's (checked at every read);
//! 6. renames and hard links: in the mount the filer refuses both (a user's `mv` there is the
//!    mount's copy then delete, which the properties above then cover); outside it, every name of
//!    a file reads that file's bytes and counts its names, whatever links, unlinks, renames and
//!    writes through a name did (checked after every such step).

mod queue;
mod rng;
mod wrappers;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;

use tidemark_cloud::memory::MemoryStorage;
use tidemark_core::events::{EventSource, Provider};
use tidemark_core::model::{Fence, Lease};
use tidemark_core::remote::{Mount, RemoteLocation};
use tidemark_core::subscription::EventTypes;
use tidemark_core::{Clock, Error, Filer, ManualClock, RemoteStorage, WriteOptions, format_rfc3339_ms};

/// An object's user metadata.
type RemoteObjectMeta = BTreeMap<String, String>;
use tidemark_engine::apply::{ApplyContext, Counters, apply_batch};
use tidemark_engine::reconcile::{ReconcileOptions, reconcile};
use tidemark_filer::{CacheConfig, LocalFiler};
use tidemark_store::SqliteStore;

pub use queue::SimQueue;
pub use rng::Rng;
use wrappers::{CheckedQueue, FencedFiler, History, SimRemote, Violations, violate};

/// Which engine runs: the real one, or a deliberately broken variant the properties must catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Correct,
    /// HEAD is answered from the last event's payload instead of the bucket.
    TrustPayload,
    /// Writes go to the filer without the lease's fence.
    NoFence,
    /// Every delivery is acknowledged as soon as it is received.
    AckFirst,
    /// The memory of recent HEADs is trusted too long: every notification claims it was sent
    /// before any HEAD, so one sent after a HEAD is answered by it.
    TrustMemory,
    /// The echo rule before it was bound to the entry: any object carrying this cluster's origin
    /// and a version at or below the entry's (or the tombstone's) is taken for an echo of it,
    /// whatever its path and bytes — so a copy of an upload, or an older upload restored by
    /// copy, is skipped.
    EchoByVersion,
    /// A reconcile's listing in key ranges starts each range after its first key instead of at
    /// it (a range boundary off by one): the first key of every range but the first is lost.
    RangeBoundary,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub seed: u64,
    pub steps: usize,
    pub variant: Variant,
    /// Whether the bucket also sees metadata-preserving copies and restores. Off only to replay
    /// runs recorded before they existed (the seeds that found bugs), which they would change.
    pub copies: bool,
    /// Whether users also rename and hard-link (property 6). Off, like `copies`, only to replay
    /// runs recorded before they existed.
    pub links: bool,
    /// Keys per LIST page of the reconciles (3; 1 puts the cuts of a listing in key ranges
    /// among the six keys — the boundary variant always uses 1).
    pub reconcile_page: usize,
}

impl Config {
    pub fn new(seed: u64) -> Self {
        Config { seed, steps: 120, variant: Variant::Correct, copies: true, links: true, reconcile_page: 3 }
    }
}

/// What one run found.
#[derive(Debug, Default)]
pub struct Report {
    pub seed: u64,
    pub violations: Vec<String>,
    pub dropped: usize,
    pub deliveries: u64,
    pub applied: u64,
    pub received: u64,
    pub stale_writes_refused: u64,
    /// Keys a worker's memory of its HEADs answered without another.
    pub heads_saved: u64,
    pub steps: usize,
    /// Whole slices of the slice engine run.
    pub slices: u64,
    /// What happened, step by step, when `TIDEMARK_SIM_TRACE` is set (for replays).
    pub trace: Vec<String>,
}

const DIR: &str = "/m";
/// A local directory beside the mount, where users hard-link (property 6).
const LINKS: &str = "/l";
const LEASE: &str = "remote_events/sim";
const LEASE_TTL: Duration = Duration::from_secs(10);
const VISIBILITY: Duration = Duration::from_secs(5);
const KEYS: &[&str] = &["a.txt", "b.txt", "c/d.txt", "c/e.txt", "f g.txt", "h+i.txt"];
const CACHE_CHUNK: u64 = 8;
const CACHE_BUDGET: u64 = 48;

/// The bytes of bucket version `version`: distinct per version, so a read of the wrong version
/// cannot pass for the right one.
fn version_bytes(version: u64, size: usize) -> Bytes {
    (0..size).map(|i| (version.wrapping_mul(7).wrapping_add(i as u64) % 251) as u8).collect::<Vec<u8>>().into()
}

struct Worker {
    name: String,
    filer: Arc<FencedFiler>,
    lease: Option<Lease>,
    paused: bool,
    /// A batch received and not yet applied: a worker paused here applies it when it resumes,
    /// with the fence it had — as a process stopped mid-batch does.
    pending: Option<(Vec<tidemark_core::events::Delivery>, Fence)>,
    /// The HEADs made under the current lease, as a slice remembers them.
    recent: tidemark_engine::recent::RecentHeads,
}

struct World {
    cfg: Config,
    rng: Rng,
    clock: ManualClock,
    filer: Arc<dyn Filer>,
    /// The same filer, for its content cache.
    local_filer: Arc<LocalFiler>,
    bucket: MemoryStorage,
    remote: Arc<SimRemote>,
    queue: Arc<CheckedQueue>,
    history: Arc<Mutex<History>>,
    mount: Mount,
    /// The subscription the slices run (fingerprint `sim`: its lease is `remote_events/sim`).
    doc: tidemark_core::subscription::SubscriptionDoc,
    workers: Vec<Worker>,
    violations: Violations,
    /// Local writes not uploaded: path → size of the latest.
    local: BTreeMap<String, u64>,
    /// Whether the mount uploads local changes (`remote.sync.enable`): half of the runs.
    sync: bool,
    outbound_cursor: u64,
    /// Etags of objects the outbound sync uploaded.
    uploaded: BTreeSet<String>,
    /// Every upload of the outbound sync, kept to be restored by copy: key, bytes, metadata.
    uploads: Vec<(String, Bytes, BTreeMap<String, String>)>,
    /// A user's delete of a path under a synced mount: the bucket version when it happened and
    /// the object the entry was backed by (`None`: a local file never uploaded).
    user_deletes: BTreeMap<String, (u64, Option<String>)>,
    version: u64,
    /// Property 6's model of the local directory `LINKS`: each name's file, each file's bytes.
    names: BTreeMap<String, usize>,
    files: Vec<Bytes>,
    /// Renamed files whose bytes were their old key's object (not local) when renamed: the key
    /// they read from and the bucket version that put that object. If that key changes before
    /// the sync carries the rename, the file goes (`SourceGone`): its bytes are gone.
    moved: BTreeMap<String, (String, u64)>,
    counters: Counters,
    report: Report,
    drop_pct: u64,
    dup_pct: u64,
    _tmp: tempfile::TempDir,
}

fn form_encode(key: &str) -> String {
    key.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => (b as char).to_string(),
            b' ' => "+".into(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl World {
    fn trace(&mut self, line: impl FnOnce() -> String) {
        if std::env::var_os("TIDEMARK_SIM_TRACE").is_some() {
            let t = self.clock.now_ms() - 1_800_000_000_000;
            let l = line();
            self.report.trace.push(format!("[{t:>7} ms v{}] {l}", self.version));
        }
    }

    async fn open(cfg: Config) -> Result<World, Error> {
        let mut rng = Rng::new(cfg.seed);
        // Fast storage for thousands of runs: tmpfs where there is one.
        let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" };
        let tmp =
            tempfile::Builder::new().prefix("tidemark-sim-").tempdir_in(base).map_err(|e| Error::io("tempdir", e))?;
        let clock = ManualClock::new(1_800_000_000_000);
        let store = SqliteStore::open(tmp.path().join("meta.db"), Arc::new(clock.clone()))?;
        // Chunks of a few bytes and a budget of a few chunks: reads cross chunks, and evict.
        let local_filer = Arc::new(
            LocalFiler::with_store(Arc::new(store), &tmp.path().join("blobs"), Arc::new(clock.clone()))?
                .with_cache(CacheConfig { budget_bytes: CACHE_BUDGET, chunk_bytes: CACHE_CHUNK })?,
        );
        let filer: Arc<dyn Filer> = local_filer.clone();
        let bucket = MemoryStorage::new(Arc::new(clock.clone()));
        // The mount's directory, as remote.mount leaves it.
        let dir = tidemark_core::model::NewEntry::dir(clock.now_ms());
        filer.apply(tidemark_core::model::Txn::put(DIR, dir, tidemark_core::Origin::System)).await?;
        let violations: Violations = Arc::default();
        let history: Arc<Mutex<History>> = Arc::default();
        let payloads = Arc::new(Mutex::new(BTreeMap::new()));
        let remote = Arc::new(SimRemote {
            inner: Arc::new(bucket.clone()),
            seed: cfg.seed,
            flaky_pct: [0, 5, 15][rng.below(3) as usize],
            asked: Mutex::default(),
            trust_payload: (cfg.variant == Variant::TrustPayload).then(|| payloads.clone()),
            old_echo_rule: (cfg.variant == Variant::EchoByVersion).then(|| (filer.clone(), DIR.to_string())),
        });
        // Reads of remote-backed entries go to the simulated bucket (flaky HEADs and all).
        local_filer.remotes().provide("sim", "b", remote.clone());
        let queue = Arc::new(CheckedQueue {
            queue: SimQueue::new(clock.clone(), cfg.seed, VISIBILITY),
            filer: filer.clone(),
            history: history.clone(),
            dir: DIR.into(),
            ack_first: cfg.variant == Variant::AckFirst,
            forge_sent: cfg.variant == Variant::TrustMemory,
            violations: violations.clone(),
            payloads,
        });
        let workers = (0..2)
            .map(|i| Worker {
                name: format!("w{i}"),
                filer: Arc::new(FencedFiler {
                    inner: filer.clone(),
                    strip_fence: cfg.variant == Variant::NoFence,
                    violations: violations.clone(),
                    worker: format!("w{i}"),
                }),
                lease: None,
                paused: false,
                pending: None,
                recent: Default::default(),
            })
            .collect();
        // A quarter of the runs lose notifications; the rest must converge without a reconcile.
        let drop_pct = if rng.chance(25) { 10 } else { 0 };
        let dup_pct = [0, 10, 30][rng.below(3) as usize];
        let sync = rng.chance(50);
        let mount = Mount {
            dir: DIR.into(),
            location: RemoteLocation { storage: "sim".into(), bucket: "b".into(), path: String::new() },
            sync,
        };
        // The mount mapping, as remote.mount (and remote.sync.enable) leave it: the filer reads it.
        let mapping = tidemark_core::remote::MountMapping { mounts: vec![mount.clone()] };
        tidemark_engine::docs::write_json(&*filer, tidemark_core::remote::system_paths::MOUNT_MAPPING, &mapping, None)
            .await?;
        let identity = tidemark_core::subscription::Identity {
            queue: "sim:queue".into(),
            topology: tidemark_core::subscription::Topology::ByoQueue,
            bucket: "b".into(),
            prefix: String::new(),
            event_types: EventTypes::default(),
        };
        let doc = tidemark_core::subscription::SubscriptionDoc {
            dir: DIR.into(),
            identity,
            fingerprint: "sim".into(),
            // Short enough that the simulated minutes see gap and scheduled reconciles.
            options: tidemark_core::subscription::SubscriptionOptions {
                gap_threshold_secs: 60,
                reconcile_interval_secs: 300,
                visibility_timeout_secs: VISIBILITY.as_secs(),
                ..Default::default()
            },
            managed: Default::default(),
            created_at_ms: 0,
            updated_at_ms: 0,
        };
        Ok(World {
            doc,
            report: Report { seed: cfg.seed, ..Default::default() },
            cfg,
            rng,
            clock,
            filer,
            local_filer,
            bucket,
            remote,
            queue,
            history,
            mount,
            workers,
            violations,
            local: BTreeMap::new(),
            sync,
            outbound_cursor: 0,
            uploaded: BTreeSet::new(),
            uploads: Vec::new(),
            user_deletes: BTreeMap::new(),
            moved: BTreeMap::new(),
            version: 0,
            names: BTreeMap::new(),
            files: Vec::new(),
            counters: Counters::default(),
            drop_pct,
            dup_pct,
            _tmp: tmp,
        })
    }

    fn notify(&mut self, key: &str, created: Option<(&str, u64)>) {
        let version = self.version;
        let now = self.clock.now_ms();
        let mut object = serde_json::json!({ "key": form_encode(key), "sequencer": format!("{version:016X}") });
        if let Some((etag, size)) = created {
            object["eTag"] = etag.into();
            object["size"] = size.into();
        }
        let record = serde_json::json!({
            "eventVersion": "2.1",
            "eventSource": "aws:s3",
            "eventTime": format_rfc3339_ms(now),
            "eventName": if created.is_some() { "ObjectCreated:Put" } else { "ObjectRemoved:Delete" },
            "s3": { "bucket": { "name": "b" }, "object": object },
        });
        let body = Bytes::from(serde_json::json!({ "Records": [record] }).to_string());
        if self.rng.chance(self.drop_pct) {
            self.report.dropped += 1;
            return;
        }
        let copies = if self.rng.chance(self.dup_pct) { 2 } else { 1 };
        for _ in 0..copies {
            let delay = if self.rng.chance(30) { self.rng.below(8_000) as i64 } else { 0 };
            self.queue.queue.send(body.clone(), key, version, delay);
        }
    }

    fn external_put(&mut self) -> Result<(), Error> {
        let key = KEYS[self.rng.below(KEYS.len() as u64) as usize];
        let size = 1 + self.rng.below(50) as usize;
        let body = version_bytes(self.version + 1, size);
        let o = self.bucket.insert(key, body.clone(), BTreeMap::new())?;
        self.version += 1;
        {
            let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
            h.content.entry(o.etag.clone()).or_insert(body);
            h.etag_version.insert(o.etag.clone(), self.version);
            h.changes.entry(key.into()).or_default().push((self.version, true));
        }
        self.trace(|| format!("bucket: put {key} {} ({size} B)", o.etag));
        self.notify(key, Some((&o.etag, o.size)));
        Ok(())
    }

    /// The bytes of the bucket's object at `key`, if any.
    async fn bucket_bytes(&self, key: &str) -> Result<Option<(Bytes, RemoteObjectMeta)>, Error> {
        let Some(o) = self.bucket.stat(key).await? else { return Ok(None) };
        let mut stream = self.bucket.get(key, None, Some(&o.etag)).await?;
        let mut body = Vec::new();
        while let Some(part) = stream.next().await {
            body.extend_from_slice(&part.map_err(|e| Error::io(format!("reading {key}"), e))?);
        }
        Ok(Some((body.into(), o.user_metadata.unwrap_or_default())))
    }

    /// Someone copies an object onto a key with its metadata, as CopyObject does by default
    /// (`aws s3 cp`, rclone, replication, "restore this version"): another key's object, an
    /// upload from another mount of this cluster, or an older upload of this very key restored
    /// over it. Each is a change of the bucket like any other put.
    async fn external_copy(&mut self) -> Result<(), Error> {
        let dest = KEYS[self.rng.below(KEYS.len() as u64) as usize];
        let (body, meta, what) = match self.rng.below(3) {
            0 => {
                let older: Vec<usize> = (0..self.uploads.len()).filter(|&i| self.uploads[i].0 == dest).collect();
                if older.is_empty() {
                    return Ok(());
                }
                let (_, body, meta) = self.uploads[older[self.rng.below(older.len() as u64) as usize]].clone();
                (body, meta, "restore of an older upload".to_string())
            }
            1 => {
                let src = KEYS[self.rng.below(KEYS.len() as u64) as usize];
                if src == dest {
                    return Ok(());
                }
                let Some((body, meta)) = self.bucket_bytes(src).await? else { return Ok(()) };
                (body, meta, format!("copy of {src}"))
            }
            _ => {
                // As this cluster's upload of the same name under another mount, at a version no
                // newer than the entry here: the old rule took it for this entry's echo.
                let version = match self.filer.stat(&format!("{DIR}/{dest}")).await? {
                    Some(e) => 1 + self.rng.below(e.version.max(1)),
                    None => 1,
                };
                let meta = tidemark_core::decide::upload_metadata("sim-cluster", &format!("/n/{dest}"), version);
                let size = 1 + self.rng.below(50) as usize;
                (version_bytes(self.version + 1, size), meta, "copy from another mount".to_string())
            }
        };
        let o = self.bucket.insert(dest, body.clone(), meta)?;
        self.version += 1;
        {
            let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
            h.content.insert(o.etag.clone(), body);
            h.etag_version.insert(o.etag.clone(), self.version);
            h.changes.entry(dest.into()).or_default().push((self.version, true));
        }
        self.trace(|| format!("bucket: {what} onto {dest} {}", o.etag));
        self.notify(dest, Some((&o.etag, o.size)));
        Ok(())
    }

    async fn external_delete(&mut self) -> Result<(), Error> {
        let key = KEYS[self.rng.below(KEYS.len() as u64) as usize];
        if self.bucket.stat(key).await?.is_none() {
            return Ok(());
        }
        self.bucket.remove(key)?;
        self.version += 1;
        self.trace(|| format!("bucket: delete {key}"));
        self.history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .changes
            .entry(key.into())
            .or_default()
            .push((self.version, false));
        self.notify(key, None);
        Ok(())
    }

    async fn local_write(&mut self) -> Result<(), Error> {
        // Local writes go to a few keys only, so the others keep converging to the bucket.
        let key = KEYS[self.rng.below(2) as usize * 3];
        let path = format!("{DIR}/{key}");
        let size = 100 + self.rng.below(50);
        let body = futures::stream::once(async move { Ok(Bytes::from(vec![b'L'; size as usize])) }).boxed();
        match self.filer.write(&path, body, WriteOptions::default()).await {
            Ok(e) => {
                self.trace(|| format!("user: write {path} ({size} B, v{})", e.version));
                self.moved.remove(&path);
                self.local.insert(path, size);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// A user deletes a file under the mount (only where sync propagates it to the bucket).
    async fn local_delete(&mut self) -> Result<(), Error> {
        let key = KEYS[self.rng.below(KEYS.len() as u64) as usize];
        let path = format!("{DIR}/{key}");
        let etag = match self.filer.stat(&path).await? {
            Some(e) if !e.is_dir() => e.remote.map(|r| r.etag),
            _ => return Ok(()),
        };
        self.filer.delete(&path, Default::default()).await?;
        self.trace(|| format!("user: delete {path} (was {etag:?})"));
        self.local.remove(&path);
        self.moved.remove(&path);
        self.user_deletes.insert(path, (self.version, etag));
        Ok(())
    }

    /// A user's `mv` of a file in the mount: where the outbound sync is on, a rename in place
    /// (the sync then moves the bucket's keys); where it is off, refused (the mount would copy,
    /// and deletes do not reach the bucket there: see `local_delete`).
    async fn user_rename_in_mount(&mut self) -> Result<(), Error> {
        let from = format!("{DIR}/{}", KEYS[self.rng.below(KEYS.len() as u64) as usize]);
        // The new name is one of the keys local writes go to, so the others keep converging.
        let to = format!("{DIR}/{}", KEYS[self.rng.below(2) as usize * 3]);
        if from == to {
            return Ok(());
        }
        let src = self.filer.stat(&from).await?.filter(|e| !e.is_dir());
        match self.filer.apply(tidemark_core::model::Txn::rename(&from, &to, tidemark_core::Origin::Local)).await {
            // Where the sync is off the bucket's keys cannot follow: refused, and mv copies.
            Err(Error::CrossMount { .. }) if !self.sync => {}
            // Where it is on, in place: the moved file is pending (properties 1 and 2 hold to it
            // as to a local write) until the outbound sync has put its object at the new key,
            // and the old key's object, the user's no more, must then be gone (as a delete's).
            Ok(_) if self.sync => {
                let Some(src) = src else {
                    violate(&self.violations, format!("renamed {from}, which was not a file"));
                    return Ok(());
                };
                self.trace(|| format!("user: mv {from} {to} (in place, v{})", src.version));
                self.local.remove(&from);
                let origin = self.moved.remove(&from);
                if src.content == tidemark_core::Content::Remote {
                    // Changes to its old key since its object was put there take its bytes.
                    let key = from[DIR.len() + 1..].to_string();
                    let put_at = src.remote.as_ref().and_then(|r| {
                        self.history.lock().unwrap_or_else(|p| p.into_inner()).etag_version.get(&r.etag).copied()
                    });
                    self.moved.insert(to.clone(), origin.unwrap_or((key, put_at.unwrap_or(0))));
                } else {
                    self.moved.remove(&to);
                }
                self.local.insert(to, src.size);
                self.user_deletes.insert(from, (self.version, src.remote.map(|r| r.etag)));
                return Ok(());
            }
            // Nothing to move, or no directory to move it to.
            Err(Error::NotFound { .. }) if self.sync => return Ok(()),
            other => violate(&self.violations, format!("a rename in the remote mount (sync {}): {other:?}", self.sync)),
        }
        Ok(())
    }

    /// A user's `ln` into, out of or within the mount: refused, and nothing changes.
    async fn user_link_in_mount(&mut self) -> Result<(), Error> {
        let inside = format!("{DIR}/{}", KEYS[self.rng.below(KEYS.len() as u64) as usize]);
        let outside = format!("{LINKS}/n{}", self.rng.below(4));
        let (from, to) = match self.rng.below(3) {
            0 => (inside.clone(), format!("{DIR}/linked")),
            1 => (inside.clone(), format!("{LINKS}/from-mount")),
            _ => (outside, format!("{DIR}/linked")),
        };
        let before = self.filer.stat(&from).await?;
        match self.filer.apply(tidemark_core::model::Txn::link(&from, &to, tidemark_core::Origin::Local)).await {
            Err(Error::CrossMount { .. }) => {}
            // Nothing to link: the mount would have answered ENOENT before asking.
            Err(Error::NotFound { .. }) if before.is_none() => {}
            other => violate(&self.violations, format!("a link {from} -> {to} was not refused: {other:?}")),
        }
        if self.filer.stat(&to).await?.is_some() {
            violate(&self.violations, format!("a refused link left {to}"));
        }
        Ok(())
    }

    /// Property 6: a step of users working with hard links in a local directory — a new file, a
    /// write through a name (at the file's inode entry, as the mount writes), a link, an unlink,
    /// a rename — against a model of names and files, then every name checked.
    async fn links_step(&mut self) -> Result<(), Error> {
        use tidemark_core::model::{Precondition, Txn, inode_path};
        let name = |i: u64| format!("{LINKS}/n{i}");
        let (a, b) = (name(self.rng.below(4)), name(self.rng.below(4)));
        let op = self.rng.below(5);
        let file = self.names.get(&a).copied();
        match (op, file) {
            (0, None) | (1, Some(_)) => {
                let bytes = Bytes::from(format!("file {} at step {}", self.files.len(), self.report.steps));
                let at = match self.filer.stat(&a).await?.and_then(|e| e.posix.inode) {
                    Some(id) => inode_path(id),
                    None => a.clone(),
                };
                let data = bytes.clone();
                let body = futures::stream::once(async move { Ok(data) }).boxed();
                self.filer.write(&at, body, WriteOptions::default()).await?;
                match file {
                    Some(f) => self.files[f] = bytes,
                    None => {
                        self.files.push(bytes);
                        self.names.insert(a.clone(), self.files.len() - 1);
                    }
                }
                self.trace(|| format!("user: write {a} (at {at})"));
            }
            (2, Some(f)) => {
                let r = self.filer.apply(Txn::link(&a, &b, tidemark_core::Origin::Local)).await;
                match (r, self.names.contains_key(&b)) {
                    (Ok(_), false) => {
                        self.names.insert(b.clone(), f);
                    }
                    (Err(Error::PreconditionFailed { .. }), true) => {}
                    (Err(Error::InvalidArgument { .. }), _) if a == b => {}
                    (other, _) => violate(&self.violations, format!("link {a} -> {b}: {other:?}")),
                }
                self.trace(|| format!("user: ln {a} {b}"));
            }
            (3, Some(_)) => {
                self.filer.delete(&a, Default::default()).await?;
                self.names.remove(&a);
                self.trace(|| format!("user: rm {a}"));
            }
            (4, Some(f)) => {
                let r = self
                    .filer
                    .apply(Txn { precondition: Precondition::Any, ..Txn::rename(&a, &b, tidemark_core::Origin::Local) })
                    .await;
                match r {
                    Ok(_) => {
                        // Onto another name of the same file, rename(2) does nothing.
                        if self.names.get(&b) != Some(&f) {
                            self.names.remove(&a);
                            self.names.insert(b.clone(), f);
                        }
                    }
                    Err(Error::InvalidArgument { .. }) if a == b => {}
                    Err(e) => violate(&self.violations, format!("rename {a} -> {b}: {e}")),
                }
                self.trace(|| format!("user: mv {a} {b}"));
            }
            _ => return Ok(()),
        }
        for i in 0..4 {
            let n = name(i);
            let want = self.names.get(&n).map(|f| {
                let count = self.names.values().filter(|g| *g == f).count() as u32;
                (self.files[*f].clone(), count)
            });
            let got = match self.filer.stat(&n).await? {
                None => None,
                Some(e) => {
                    let (_, s) = self.filer.read(&n, None).await?;
                    let parts = s.collect::<Vec<_>>().await.into_iter().collect::<Result<Vec<Bytes>, _>>();
                    let bytes = Bytes::from(parts.map_err(|e| Error::io("read", e))?.concat());
                    Some((bytes, e.posix.nlink.unwrap_or(1)))
                }
            };
            if got != want {
                violate(&self.violations, format!("{n}: the namespace has {got:?}, the model {want:?}"));
            }
        }
        Ok(())
    }

    /// The outbound sync handles the next change records, as the filer's loop does; its
    /// uploads and deletes reach the bucket and, like any change, its notifications.
    async fn outbound_step(&mut self, max: usize) -> Result<bool, Error> {
        let records = self.filer.changes(self.outbound_cursor, max, Duration::ZERO).await?;
        for r in &records {
            if r.path.starts_with(&format!("{DIR}/")) {
                // What the bucket holds before: a key the record's handling deletes (a user's
                // delete propagated, or the old key of a rename carried) must hold the object the
                // user deleted or moved (or this cluster's upload of it), never one someone else
                // put since.
                let mut before = BTreeMap::new();
                for k in KEYS {
                    if let Some(o) = self.bucket.stat(k).await? {
                        before.insert(*k, o);
                    }
                }
                let out = tidemark_engine::outbound::sync_record(
                    &*self.filer,
                    &self.bucket,
                    &self.mount,
                    "sim-cluster",
                    &self.clock,
                    r,
                )
                .await?;
                let seq = r.seq;
                let what = format!("{out:?}");
                self.trace(|| format!("outbound: record {seq} {what}"));
                use tidemark_engine::outbound::OutboundOutcome::{Moved, Uploaded};
                if let Uploaded { key, .. } | Moved { key, .. } = &out {
                    let (body, meta) =
                        self.bucket_bytes(key).await?.ok_or_else(|| Error::internal("uploaded object gone"))?;
                    self.uploads.push((key.clone(), body, meta));
                    let o = self.bucket.stat(key).await?.ok_or_else(|| Error::internal("uploaded object gone"))?;
                    self.version += 1;
                    {
                        let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
                        if let Some((_, bytes, _)) = self.uploads.last() {
                            h.content.entry(o.etag.clone()).or_insert_with(|| bytes.clone());
                        }
                        h.etag_version.insert(o.etag.clone(), self.version);
                        h.changes.entry(key.clone()).or_default().push((self.version, true));
                    }
                    self.uploaded.insert(o.etag.clone());
                    self.notify(key, Some((&o.etag, o.size)));
                }
                for (key, o) in before {
                    if self.bucket.stat(key).await?.is_some() {
                        continue;
                    }
                    if let Some((at, _)) = self.user_deletes.get(&format!("{DIR}/{key}")) {
                        let put_at =
                            self.history.lock().unwrap_or_else(|p| p.into_inner()).etag_version.get(&o.etag).copied();
                        if !self.uploaded.contains(&o.etag) && put_at.is_some_and(|v| v > *at) {
                            violate(
                                &self.violations,
                                format!(
                                    "the outbound sync deleted {key} ({}), which someone put after the user's delete",
                                    o.etag
                                ),
                            );
                        }
                    }
                    self.version += 1;
                    self.history
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .changes
                        .entry(key.to_string())
                        .or_default()
                        .push((self.version, false));
                    self.notify(key, None);
                }
            }
            self.outbound_cursor = r.seq;
        }
        Ok(!records.is_empty())
    }

    /// Property 2, after every step: a local write is still there until the outbound sync
    /// uploaded it (then the bucket owns the key again).
    async fn check_local_writes(&mut self, when: &str) -> Result<(), Error> {
        let paths: Vec<(String, u64)> = self.local.iter().map(|(p, s)| (p.clone(), *s)).collect();
        for (path, size) in paths {
            let e = self.filer.stat(&path).await?;
            match &e {
                Some(e) if tidemark_core::decide::is_locally_dirty(e) && e.size == size => {}
                // A renamed file whose old key someone else changed before the rename reached the
                // bucket: its bytes are gone with that object, and so is it (what someone put at
                // its new key meanwhile may be there instead).
                _ if self.moved.get(&path).is_some_and(|(key, at)| {
                    let h = self.history.lock().unwrap_or_else(|p| p.into_inner());
                    h.changes.get(key).is_some_and(|c| c.iter().any(|(v, _)| v > at))
                }) =>
                {
                    self.local.remove(&path);
                    self.moved.remove(&path);
                }
                Some(e) if e.size == size && e.remote.as_ref().is_some_and(|r| self.uploaded.contains(&r.etag)) => {
                    self.local.remove(&path);
                }
                other => violate(
                    &self.violations,
                    format!(
                        "{when}: the local write of {path} ({size} bytes) was overwritten (moved {:?}): {:?}",
                        self.moved.get(&path),
                        other.as_ref().map(|e| (e.size, e.remote.as_ref().map(|r| r.etag.clone())))
                    ),
                ),
            }
        }
        Ok(())
    }

    async fn worker_step(&mut self, w: usize, drain: bool) -> Result<(), Error> {
        if self.workers[w].paused {
            return Ok(());
        }
        if let Some((batch, fence)) = self.workers[w].pending.take() {
            return self.apply(w, batch, fence).await;
        }
        let now = self.clock.now_ms();
        let filer = self.workers[w].filer.clone();
        // Like a slice: take the lease when it has none (or its own ran out), renew it now and then.
        let needs_lease = self.workers[w].lease.as_ref().is_none_or(|l| l.expires_at_ms <= now);
        if needs_lease {
            match filer.lease_acquire(LEASE, &self.workers[w].name, LEASE_TTL).await {
                Ok(l) => {
                    // A new slice: it remembers nothing of the last one's HEADs.
                    self.workers[w].lease = Some(l);
                    self.workers[w].recent = Default::default();
                }
                Err(Error::LeaseHeld { .. }) => return Ok(()),
                Err(e) => return Err(e),
            }
        } else if drain || self.rng.chance(50) {
            let fence = self.workers[w].lease.as_ref().map(Lease::fence).expect("held");
            match filer.lease_renew(&fence, LEASE_TTL).await {
                Ok(l) => self.workers[w].lease = Some(l),
                Err(Error::Fenced { .. }) => {
                    self.workers[w].lease = None;
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
        let fence: Fence = self.workers[w].lease.as_ref().map(Lease::fence).expect("held");
        if !drain && self.rng.chance(10) {
            return self.reconcile_with(w, fence).await;
        }
        let batch = self.queue.receive(10, Duration::ZERO).await?;
        if batch.is_empty() {
            return Ok(());
        }
        if !drain && self.rng.chance(40) {
            // Received; applied at this worker's next step (it may be paused in between).
            self.workers[w].pending = Some((batch, fence));
            return Ok(());
        }
        self.apply(w, batch, fence).await
    }

    async fn apply(
        &mut self,
        w: usize,
        batch: Vec<tidemark_core::events::Delivery>,
        fence: Fence,
    ) -> Result<(), Error> {
        let filer = self.workers[w].filer.clone();
        let types = EventTypes::default();
        let ctx = ApplyContext {
            mount: &self.mount,
            provider: Provider::S3,
            event_types: &types,
            cluster_id: Some("sim-cluster"),
            fence: Some(&fence),
            concurrency: 4,
            retry_delay: Duration::from_secs(1),
            visibility: Duration::ZERO,
            clock: &self.clock,
            prefetch: None,
            recent: Some(&self.workers[w].recent),
            max_receives: None,
        };
        let gen_ = fence.generation;
        match apply_batch(&*filer, &*self.remote, &*self.queue, &ctx, batch, &mut self.counters).await {
            Ok(r) => {
                let name = self.workers[w].name.clone();
                self.trace(|| {
                    format!("{name} (gen {gen_}): applied {:?}, acked {}, left {}", r.outcomes, r.acked, r.left)
                });
                Ok(())
            }
            Err(Error::Fenced { .. }) => {
                // A slice ends here; what it did not acknowledge comes back to the next one.
                self.report.stale_writes_refused += 1;
                self.workers[w].lease = None;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// A whole slice of the real slice engine (`Slice::run`) by worker `w`, while the rest of the
    /// world waits: lease, the reconcile its marker asks for, receive and apply what is visible,
    /// status blob, release. It is cancelled as soon as nothing is visible in the queue (its
    /// wall-clock length is only a safety net), so what it does does not depend on timing.
    async fn slice(&mut self, w: usize) -> Result<(), Error> {
        if self.workers[w].paused || self.workers[w].pending.is_some() {
            return Ok(());
        }
        let filer = self.workers[w].filer.clone();
        let name = self.workers[w].name.clone();
        let slice = tidemark_engine::slice::Slice {
            filer: &*filer,
            storage: &*self.remote,
            source: &*self.queue,
            clock: &self.clock,
            doc: &self.doc,
            mount: &self.mount,
            provider: Provider::S3,
            cluster_id: Some("sim-cluster"),
            holder: &name,
            length: Duration::from_secs(30),
            lease_ttl: LEASE_TTL,
            observer: &tidemark_engine::slice::NoObserver,
            requests: None,
        };
        // The counters the slice starts from (its status blob): what it adds is this slice's.
        let before = tidemark_engine::docs::read_json::<tidemark_engine::slice::StatusBlob>(
            &*self.filer,
            &tidemark_engine::slice::status_path(&self.doc.fingerprint),
        )
        .await?
        .map(|(s, _)| s.counters)
        .unwrap_or_default();
        let queue = self.queue.queue.clone();
        let drained = std::future::poll_fn(move |_| {
            if queue.visible_len() == 0 { std::task::Poll::Ready(()) } else { std::task::Poll::Pending }
        });
        let out = slice.run(drained).await;
        self.trace(|| format!("{name}: slice {out:?}"));
        match out {
            Ok(o) => {
                self.counters.received += o.counters.received - before.received;
                self.counters.applied += o.counters.applied - before.applied;
                self.counters.heads_saved += o.counters.heads_saved.saturating_sub(before.heads_saved);
                if o.end == tidemark_engine::slice::SliceEnd::LeaseLost {
                    self.report.stale_writes_refused += 1;
                }
                // The slice released its lease; this worker holds none now.
                self.workers[w].lease = None;
                self.report.slices += 1;
                Ok(())
            }
            Err(Error::LeaseHeld { .. }) => Ok(()),
            // A transient failure (a HEAD in its reconcile) fails the slice, as in production: its
            // status says so, its lease was released, and the admin proposes the next.
            Err(Error::Unavailable { .. }) => {
                self.workers[w].lease = None;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    async fn reconcile_with(&mut self, w: usize, fence: Fence) -> Result<(), Error> {
        let filer = self.workers[w].filer.clone();
        let opts = ReconcileOptions {
            fence: Some(fence),
            cluster_id: Some("sim-cluster".into()),
            // Pages of one key for the boundary variant: its listing is cut between the keys
            // (with pages of 3, six keys fill too few pages for a cut to land among them).
            page_size: if self.cfg.variant == Variant::RangeBoundary { 1 } else { self.cfg.reconcile_page },
            ..Default::default()
        };
        let mut items = Vec::new();
        let result =
            reconcile(&*filer, &*self.bucket_view(), &self.mount, &opts, &mut |i| items.push(format!("{i:?}"))).await;
        let name = self.workers[w].name.clone();
        self.trace(|| format!("{name}: reconcile {items:?}"));
        match result {
            Ok(_) => Ok(()),
            Err(Error::Fenced { .. }) => {
                self.report.stale_writes_refused += 1;
                self.workers[w].lease = None;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// The bucket as the reconciler lists it (no injected HEAD failures: a reconcile lists).
    /// The bytes a read of `e` must return: its remote version's, or a local write's (`L`s —
    /// also what the outbound sync uploads).
    fn expected_content(&self, e: &tidemark_core::Entry) -> Option<Bytes> {
        use tidemark_core::Content;
        match &e.content {
            Content::Remote => {
                let etag = &e.remote.as_ref()?.etag;
                let known = self.history.lock().unwrap_or_else(|p| p.into_inner()).content.get(etag).cloned();
                known.or_else(|| self.uploaded.contains(etag).then(|| Bytes::from(vec![b'L'; e.size as usize])))
            }
            // A user's write is of `L`s; a renamed file's bytes kept here before the upload that
            // replaced its old key's object are that object's (their MD5 says which).
            Content::Inline | Content::Blob { .. } => {
                let kept = e.remote.as_ref().and_then(|r| {
                    let h = self.history.lock().unwrap_or_else(|p| p.into_inner());
                    h.content.get(&r.etag).cloned()
                });
                let md5 = |b: &[u8]| {
                    use md5::Digest;
                    md5::Md5::digest(b).iter().map(|x| format!("{x:02x}")).collect::<String>()
                };
                let wrote = e.extended.get(tidemark_core::model::MD5_ATTR);
                Some(match kept {
                    Some(b) if wrote == Some(&md5(&b)) => b,
                    _ => Bytes::from(vec![b'L'; e.size as usize]),
                })
            }
            Content::Empty => Some(Bytes::new()),
        }
    }

    /// Property 5: a read, whole or ranged, returns exactly the bytes of its entry's version.
    async fn read_step(&mut self) -> Result<(), Error> {
        let key = KEYS[self.rng.below(KEYS.len() as u64) as usize];
        let range = self.rng.chance(50).then(|| tidemark_core::ByteRange {
            offset: self.rng.below(30),
            length: self.rng.chance(70).then(|| 1 + self.rng.below(30)),
        });
        if self.rng.chance(15) {
            self.local_filer.cache_drop(&format!("{DIR}/{key}")).await?;
        }
        self.read_and_check(key, range).await
    }

    async fn read_and_check(&mut self, key: &str, range: Option<tidemark_core::ByteRange>) -> Result<(), Error> {
        let path = format!("{DIR}/{key}");
        let read = self.filer.read(&path, range).await;
        let mut outcome = "no bytes".to_string();
        if let Ok((entry, mut stream)) = read {
            let mut got = Vec::new();
            let mut whole = true;
            while let Some(part) = stream.next().await {
                match part {
                    Ok(b) => got.extend_from_slice(&b),
                    Err(_) => {
                        whole = false;
                        break;
                    }
                }
            }
            if let Some(full) = self.expected_content(&entry).filter(|_| whole) {
                let start = range.map_or(0, |r| r.offset as usize).min(full.len());
                let end = range.and_then(|r| r.length).map_or(full.len(), |n| (start + n as usize).min(full.len()));
                if got != full[start..end] {
                    violate(
                        &self.violations,
                        format!(
                            "a read of {path} ({range:?}) at etag {:?} returned {got:?}, not that version's {:?}",
                            entry.remote.as_ref().map(|r| r.etag.clone()),
                            &full[start..end]
                        ),
                    );
                }
            }
            outcome = format!("{} bytes", got.len());
        }
        // Steps stay one at a time: the fetches this read started are recorded before the next.
        self.local_filer.cache().idle().await;
        self.trace(|| format!("read {path} {range:?}: {outcome}"));
        Ok(())
    }

    fn bucket_view(&self) -> Arc<dyn RemoteStorage> {
        if self.cfg.variant == Variant::RangeBoundary {
            return Arc::new(wrappers::LosingRangeStarts(Arc::new(self.bucket.clone())));
        }
        Arc::new(self.bucket.clone())
    }

    async fn step(&mut self) -> Result<(), Error> {
        if self.cfg.links && self.rng.chance(8) {
            return match self.rng.below(3) {
                0 => self.user_rename_in_mount().await,
                1 => self.user_link_in_mount().await,
                _ => self.links_step().await,
            };
        }
        match self.rng.below(100) {
            0..=22 if self.cfg.copies && self.rng.chance(25) => self.external_copy().await?,
            0..=22 => self.external_put()?,
            23..=31 => self.external_delete().await?,
            32..=36 => self.local_write().await?,
            37..=39 if self.sync => self.local_delete().await?,
            37..=39 => {}
            40..=44 if self.sync => {
                self.outbound_step(2).await?;
            }
            40..=44 => {}
            45..=72 => {
                let w = self.rng.below(2) as usize;
                self.worker_step(w, false).await?
            }
            73..=79 => {
                let w = self.rng.below(2) as usize;
                self.slice(w).await?
            }
            80..=84 => {
                let w = self.rng.below(2) as usize;
                self.workers[w].paused = !self.workers[w].paused;
            }
            85..=90 => self.read_step().await?,
            _ => {
                let by = 200 + self.rng.below(12_000) as i64;
                self.clock.advance_ms(by);
            }
        }
        Ok(())
    }

    /// Every worker resumes; the clock moves past every lease and delay; one worker drains the
    /// queue (redeliveries included).
    async fn quiesce(&mut self) -> Result<(), Error> {
        for w in &mut self.workers {
            w.paused = false;
        }
        // Batches held by workers stopped mid-batch are applied (or refused by the fence) first.
        for w in 0..self.workers.len() {
            if let Some((batch, fence)) = self.workers[w].pending.take() {
                self.apply(w, batch, fence).await?;
            }
        }
        for _ in 0..400 {
            let uploading = self.sync && self.outbound_step(100).await?;
            if self.queue.queue.is_empty() && !uploading {
                return Ok(());
            }
            self.clock.advance_ms(VISIBILITY.as_millis() as i64 + 1);
            self.worker_step(0, true).await?;
            self.check_local_writes("while draining").await?;
        }
        Err(Error::internal(format!("the queue did not drain: {} messages left", self.queue.queue.len())))
    }

    /// Property 1 (and 2 for local writes): the namespace against the bucket, key by key.
    async fn compare(&self, when: &str) -> Result<Vec<String>, Error> {
        let mut out = Vec::new();
        let keys: BTreeSet<&str> = KEYS.iter().copied().collect();
        for key in keys {
            let path = format!("{DIR}/{key}");
            let entry = self.filer.stat(&path).await?;
            if let Some(size) = self.local.get(&path) {
                match &entry {
                    Some(e) if tidemark_core::decide::is_locally_dirty(e) && e.size == *size => {}
                    other => out.push(format!(
                        "{when}: the local write of {path} ({size} bytes) was overwritten: {:?}",
                        other.as_ref().map(|e| (e.size, e.remote.as_ref().map(|r| r.etag.clone())))
                    )),
                }
                continue;
            }
            let object = self.bucket.stat(key).await?;
            let same = match (&object, &entry) {
                (None, None) => true,
                (Some(o), Some(e)) => e.size == o.size && e.remote.as_ref().is_some_and(|r| r.etag == o.etag),
                _ => false,
            };
            if !same {
                out.push(format!(
                    "{when}: {path}: the bucket has {:?}, the namespace {:?}",
                    object.map(|o| (o.size, o.etag)),
                    entry.map(|e| (e.size, e.remote.map(|r| r.etag)))
                ));
            }
        }
        Ok(out)
    }
}

/// Runs one seed to the end and checks every property.
pub async fn run(cfg: Config) -> Report {
    let seed = cfg.seed;
    let mut world = match World::open(cfg).await {
        Ok(w) => w,
        Err(e) => return Report { seed, violations: vec![format!("set-up failed: {e}")], ..Default::default() },
    };
    let result = async {
        for i in 0..world.cfg.steps {
            world.step().await?;
            world.report.steps += 1;
            world.check_local_writes(&format!("step {i}")).await?;
        }
        world.quiesce().await?;
        if world.sync && !world.local.is_empty() {
            world.report.violations.push(format!("local writes never uploaded: {:?}", world.local));
        }
        // A user's delete is not undone: unless someone put the key again after it, the object
        // the entry was backed by is gone (an object someone else put is theirs, and stays).
        for (path, (at, etag)) in world.user_deletes.clone() {
            let Some(etag) = etag else { continue };
            let key = &path[DIR.len() + 1..];
            let put_after = world
                .history
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .changes
                .get(key)
                .is_some_and(|c| c.iter().any(|(v, exists)| *v > at && *exists));
            if put_after {
                continue;
            }
            let object = world.bucket.stat(key).await?;
            if object.as_ref().is_some_and(|o| o.etag == etag) {
                world.report.violations.push(format!(
                    "the user's delete of {path} was undone: the object {etag} is still there (entry there: {})",
                    world.filer.stat(&path).await?.is_some()
                ));
            }
        }
        if world.report.dropped == 0 {
            let found = world.compare("after quiescence, no notification dropped").await?;
            world.report.violations.extend(found);
        }
        // One final reconcile by whoever holds the lease, then everything must match.
        world.clock.advance_ms(LEASE_TTL.as_millis() as i64 + 1);
        let lease = world.workers[0].filer.lease_acquire(LEASE, "w0", LEASE_TTL).await?;
        world.reconcile_with(0, lease.fence()).await?;
        let found = world.compare("after the final reconcile").await?;
        world.report.violations.extend(found);
        // Every file reads as its entry's version, twice (the second from the cache, where the
        // budget kept it).
        for _ in 0..2 {
            for key in KEYS {
                world.read_and_check(key, None).await?;
            }
        }
        Ok::<(), Error>(())
    }
    .await;
    if let Err(e) = result {
        world.report.violations.push(format!("the run failed: {e}"));
    }
    let c = &world.counters;
    world.report.applied = c.applied;
    world.report.received = c.received;
    world.report.heads_saved = c.heads_saved;
    world.report.deliveries = world.queue.queue.deliveries();
    if c.applied > c.received {
        world.report.violations.push(format!("applied {} > received {}", c.applied, c.received));
    }
    if c.received != world.report.deliveries {
        world
            .report
            .violations
            .push(format!("received {} but the queue delivered {}", c.received, world.report.deliveries));
    }
    let during = std::mem::take(&mut *world.violations.lock().unwrap_or_else(|p| p.into_inner()));
    world.report.violations.splice(0..0, during);
    world.report
}

/// The command that replays one seed, printed with every failure.
pub fn replay_command(seed: u64, variant: Variant) -> String {
    let v = match variant {
        Variant::Correct => String::new(),
        other => format!("TIDEMARK_SIM_VARIANT={other:?} "),
    };
    format!("{v}TIDEMARK_SIM_SEED={seed} cargo test -p tidemark-sim --test simulation replay -- --nocapture")
}

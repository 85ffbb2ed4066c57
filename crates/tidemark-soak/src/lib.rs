//! A soak under faults: a whole cluster on this machine — PostgreSQL, moto (three mounted
//! buckets, their queues, the blob store), two filers with S3 gateways, two admins, three
//! workers, one subscription per topology (sqs_direct, sns_fanout, byo_queue) — driven for a
//! while by a mutator (objects put, overwritten and deleted in the buckets; files written
//! through both gateways and both filers' APIs) while a fault injector SIGKILLs, pauses
//! (SIGSTOP/SIGCONT) or restarts a random Tidemark process every few seconds, and restarts
//! PostgreSQL once. Then the faults stop, everything runs again, and the soak waits for quiet
//! and checks:
//!
//! - every object's entry under a mount equals the bucket (the listing's ETag and size), with
//!   no reconcile to help (the slices' scheduled and gap reconciles are hours away): a message
//!   acknowledged without its change applied would show here;
//! - every acknowledged file write reads back byte for byte through every filer and every
//!   gateway (or, after a write whose acknowledgement was lost in a fault, that write's bytes);
//! - no file written under a mount was overwritten by the bucket's state (it is still dirty);
//! - each subscription's `received` is at least its `applied`;
//! - no process panicked.
//!
//! It reports the faults by kind, the operations, lost and clobbered writes, the lag from a
//! change in a bucket to its entry while faults were injected, and the time to converge after
//! the last fault.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;

use tidemark_cloud::aws::s3::S3Storage;
use tidemark_core::remote::{RemoteConf, StorageKind};
use tidemark_core::{Filer, RemoteStorage, WriteOptions};
use tidemark_filer::HttpFiler;
use tidemark_testkit::{Moto, Postgres, free_port, unique_name};

/// The mounts, one per topology, at `/buckets/NAME` (so the gateways serve them too).
const MOUNTS: [&str; 3] = ["direct", "fanout", "byo"];

#[derive(Debug, Clone)]
pub struct SoakConfig {
    /// How long faults are injected while the mutator works.
    pub duration: Duration,
    /// The `tidemark` binary.
    pub tidemark: PathBuf,
    /// A fault every this long (on average).
    pub fault_every: Duration,
    /// How long the cluster may take to converge once the faults stop.
    pub converge_within: Duration,
    pub seed: u64,
}

/// What a soak found.
#[derive(Debug, Default)]
pub struct SoakReport {
    pub faults: BTreeMap<String, u64>,
    pub bucket_ops: u64,
    pub writes_acked: u64,
    /// Writes whose outcome a fault hid (an error, a timeout): they may or may not have landed.
    pub writes_unsure: u64,
    pub lost: Vec<String>,
    pub clobbered: Vec<String>,
    pub diverged: Vec<String>,
    pub panics: Vec<String>,
    pub problems: Vec<String>,
    /// Change in a bucket → its entry, for the changes made while faults were injected (ms).
    pub lags_ms: Vec<i64>,
    /// Changes not seen by the end of the fault period (their lag is counted to convergence).
    pub late: u64,
    pub converged_after: Option<Duration>,
    pub subscriptions: Vec<String>,
}

impl SoakReport {
    pub fn ok(&self) -> bool {
        self.lost.is_empty()
            && self.clobbered.is_empty()
            && self.diverged.is_empty()
            && self.panics.is_empty()
            && self.problems.is_empty()
            && self.converged_after.is_some()
    }

    fn lag(&self, q: f64) -> i64 {
        let mut v = self.lags_ms.clone();
        v.sort();
        if v.is_empty() {
            return 0;
        }
        v[((v.len() - 1) as f64 * q).round() as usize]
    }
}

impl std::fmt::Display for SoakReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let total: u64 = self.faults.values().sum();
        let kinds: Vec<String> = self.faults.iter().map(|(k, v)| format!("{k} {v}")).collect();
        writeln!(f, "faults injected: {total} ({})", kinds.join(", "))?;
        writeln!(
            f,
            "operations: {} bucket changes, {} file writes acknowledged, {} unsure (a fault hid the answer)",
            self.bucket_ops, self.writes_acked, self.writes_unsure
        )?;
        writeln!(
            f,
            "lost {}, clobbered {}, entries differing from their bucket {}, panics {}",
            self.lost.len(),
            self.clobbered.len(),
            self.diverged.len(),
            self.panics.len()
        )?;
        writeln!(
            f,
            "bucket change → entry during faults: p50 {} ms, p99 {} ms, max {} ms over {} changes ({} seen only after the faults)",
            self.lag(0.5),
            self.lag(0.99),
            self.lags_ms.iter().max().copied().unwrap_or(0),
            self.lags_ms.len(),
            self.late
        )?;
        match self.converged_after {
            Some(d) => writeln!(f, "converged {:.1} s after the last fault", d.as_secs_f64())?,
            None => writeln!(f, "did NOT converge")?,
        }
        for s in &self.subscriptions {
            writeln!(f, "subscription {s}")?;
        }
        for (what, list) in [
            ("lost", &self.lost),
            ("clobbered", &self.clobbered),
            ("differs", &self.diverged),
            ("panic", &self.panics),
            ("problem", &self.problems),
        ] {
            for x in list.iter().take(20) {
                writeln!(f, "  {what}: {x}")?;
            }
        }
        Ok(())
    }
}

/// A small deterministic generator (xorshift), so a seed replays the same choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Filer,
    Gateway,
    Admin,
    Worker,
}

/// One Tidemark process of the cluster: how to start it again, and whether it runs.
struct Proc {
    name: String,
    kind: Kind,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// The port it listens on (to wait for after a start); workers listen on none.
    port: Option<u16>,
    log: PathBuf,
    child: Option<Child>,
    paused: bool,
}

impl Proc {
    fn start(&mut self, bin: &Path) -> Result<(), String> {
        let log = OpenOptions::new().create(true).append(true).open(&self.log).map_err(|e| e.to_string())?;
        let child = Command::new(bin)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.name))?;
        self.child = Some(child);
        self.paused = false;
        Ok(())
    }

    /// Waits until it accepts connections (or, for a worker, a moment).
    async fn ready(&mut self, within: Duration) -> Result<(), String> {
        let Some(port) = self.port else {
            tokio::time::sleep(Duration::from_millis(300)).await;
            return Ok(());
        };
        let deadline = Instant::now() + within;
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                self.child = None;
                return Err(format!("{} exited at start ({status}); see {}", self.name, self.log.display()));
            }
            if Instant::now() > deadline {
                return Err(format!("{} did not listen within {within:?}; see {}", self.name, self.log.display()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill").args([&format!("-{sig}"), &c.id().to_string()]).status();
        }
    }

    fn kill(&mut self) {
        if self.paused {
            self.signal("CONT");
            self.paused = false;
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, and a SIGKILL if it has not stopped within `grace`.
    async fn stop(&mut self, grace: Duration) {
        self.signal("TERM");
        let deadline = Instant::now() + grace;
        while let Some(c) = self.child.as_mut() {
            if let Ok(Some(_)) = c.try_wait() {
                self.child = None;
                return;
            }
            if Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.kill();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What the namespace must show for a path written through the filers and gateways: the last
/// acknowledged bytes, or those of a later write whose answer a fault hid.
#[derive(Default, Clone)]
struct Expected {
    acked: Option<Bytes>,
    unsure: Vec<Bytes>,
}

/// A change made in a bucket, waiting to be seen: `(bucket index, key, etag or None for a
/// delete, made at, op number)`.
type Pending = (usize, String, Option<String>, Instant, u64);

struct World {
    cfg: SoakConfig,
    buckets: Vec<(String, S3Storage)>,
    /// Per bucket, per key: the op number of its latest change.
    latest: Mutex<BTreeMap<(usize, String), u64>>,
    pending: Mutex<Vec<Pending>>,
    lags: Mutex<Vec<i64>>,
    files: Mutex<BTreeMap<String, Expected>>,
    filers: Vec<HttpFiler>,
    /// Both filers as one client (the mutator's reads of the namespace go to whichever answers).
    any_filer: HttpFiler,
    gateways: Vec<S3Storage>,
    report: Mutex<SoakReport>,
    stop: tokio::sync::watch::Sender<bool>,
}

fn conf(endpoint: &str, key: &str, secret: &str) -> RemoteConf {
    let settings = [("endpoint", endpoint), ("access_key", key), ("secret_key", secret), ("region", "us-east-1")];
    RemoteConf {
        name: "soak".into(),
        kind: StorageKind::S3,
        settings: settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    }
}

fn shell(bin: &Path, filer: &str, cmd: &str) -> Result<String, String> {
    let out = Command::new(bin)
        .args(["shell", "--filer", filer, "-c", cmd])
        .env_remove("TIDEMARK_TOKEN")
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("`{cmd}` failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The bytes of a file write: its path and a serial number, padded to `size`.
fn content(path: &str, n: u64, size: usize) -> Bytes {
    let mut v = format!("{path} #{n}\n").into_bytes();
    let fill = (n % 251) as u8;
    v.resize(size.max(v.len()), fill);
    Bytes::from(v)
}

async fn read_all(s: tidemark_core::ByteStream) -> Option<Vec<u8>> {
    let parts: Vec<std::io::Result<Bytes>> = s.collect().await;
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(&p.ok()?);
    }
    Some(out)
}

pub async fn run(cfg: SoakConfig) -> Result<SoakReport, String> {
    let work = tempfile::Builder::new().prefix("tidemark-soak-").tempdir().map_err(|e| e.to_string())?;
    let dir = work.path();
    let bin = cfg.tidemark.clone();
    // The database is this soak's own: it is restarted once under the cluster's feet.
    let pg = Postgres::start();
    let store = pg.fresh_database("soak");
    let moto = Moto::get();
    let aws = conf(&moto.endpoint, "testing", "testing");
    let id = unique_name("soak");
    let names: Vec<String> = ["a", "b", "c", "blobs"].iter().map(|n| format!("{id}-{n}")).collect();
    let mut buckets = Vec::new();
    for n in &names {
        let s = S3Storage::connect(&aws, n).await.map_err(|e| e.to_string())?;
        s.client().create_bucket().bucket(n).send().await.map_err(|e| format!("creating bucket {n}: {e}"))?;
        buckets.push((n.clone(), s));
    }
    let blob_store = format!("s3://{}?endpoint={}", names[3], moto.endpoint);
    buckets.truncate(3);

    // The processes, on fixed ports (a restart comes back where clients look for it).
    let env = vec![
        ("AWS_ACCESS_KEY_ID".to_string(), "testing".to_string()),
        ("AWS_SECRET_ACCESS_KEY".to_string(), "testing".to_string()),
    ];
    let mut procs: Vec<Proc> = Vec::new();
    let ports: Vec<u16> = (0..6).map(|_| free_port()).collect();
    let filer_addrs: Vec<String> = ports[0..2].iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let admin_addrs: Vec<String> = ports[4..6].iter().map(|p| format!("127.0.0.1:{p}")).collect();
    for (i, name) in ["filer-a", "filer-b"].iter().enumerate() {
        let data = dir.join(name);
        procs.push(Proc {
            name: name.to_string(),
            kind: Kind::Filer,
            args: [
                "filer",
                "--data-dir",
                data.to_str().unwrap_or_default(),
                "--addr",
                &filer_addrs[i],
                "--store",
                &store,
                "--blob-store",
                &blob_store,
                "--task-lease-ttl",
                "5",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            env: env.clone(),
            port: Some(ports[i]),
            log: dir.join(format!("{name}.log")),
            child: None,
            paused: false,
        });
    }
    for p in &mut procs {
        p.start(&bin)?;
        p.ready(Duration::from_secs(60)).await?;
    }
    let (fa, fb) = (filer_addrs[0].clone(), filer_addrs[1].clone());
    let both_filers = filer_addrs.join(",");
    // Set up through filer A: the remote, three mounts, one subscription per topology.
    shell(
        &bin,
        &fa,
        &format!(
            "remote.configure -name=s3 -type=s3 -s3.endpoint={} -s3.access_key=testing -s3.secret_key=testing",
            moto.endpoint
        ),
    )?;
    for (i, (name, _)) in buckets.iter().enumerate() {
        let dir = MOUNTS[i];
        shell(&bin, &fa, &format!("remote.mount -dir=/buckets/{dir} -remote=s3/{name}"))?;
    }
    // A short visibility timeout: a SIGKILLed worker's deliveries in flight come back soon.
    shell(&bin, &fa, "remote.events.enable -dir=/buckets/direct -visibility=15")?;
    shell(&bin, &fa, "remote.events.enable -dir=/buckets/fanout -via=sns -visibility=15")?;
    let mut managed = tidemark_core::subscription::ManagedResources::default();
    let byo = tidemark_cloud::aws::provision::S3Notifications::connect(&aws, &names[2])
        .await
        .map_err(|e| e.to_string())?
        .provision_sqs_direct(
            &unique_name("byo"),
            "",
            &Default::default(),
            0,
            &|u: &str| u.len().to_string(),
            &mut managed,
        )
        .await
        .map_err(|e| e.to_string())?;
    shell(&bin, &fa, &format!("remote.events.enable -dir=/buckets/byo -queue={byo} -visibility=15"))?;
    for (i, name) in ["gateway-a", "gateway-b"].iter().enumerate() {
        let addr = format!("127.0.0.1:{}", ports[2 + i]);
        procs.push(Proc {
            name: name.to_string(),
            kind: Kind::Gateway,
            args: ["s3", "--filer", &filer_addrs[i], "--addr", &addr].iter().map(|s| s.to_string()).collect(),
            env: vec![],
            port: Some(ports[2 + i]),
            log: dir.join(format!("{name}.log")),
            child: None,
            paused: false,
        });
    }
    for (i, name) in ["admin-x", "admin-y"].iter().enumerate() {
        procs.push(Proc {
            name: name.to_string(),
            kind: Kind::Admin,
            args: [
                "admin",
                "--filer",
                &both_filers,
                "--addr",
                &admin_addrs[i],
                "--lease-ttl",
                "5",
                "--worker-timeout",
                "5",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            env: vec![],
            port: Some(ports[4 + i]),
            log: dir.join(format!("{name}.log")),
            child: None,
            paused: false,
        });
    }
    let both_admins = admin_addrs.join(",");
    for i in 0..3 {
        let name = format!("worker-{i}");
        procs.push(Proc {
            name: name.clone(),
            kind: Kind::Worker,
            args: [
                "worker",
                "--admin",
                &both_admins,
                "--filer",
                &both_filers,
                "--id",
                &name,
                "--lease-ttl",
                "5",
                "--max-execute",
                "3",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            env: vec![],
            port: None,
            log: dir.join(format!("{name}.log")),
            child: None,
            paused: false,
        });
    }
    for p in procs.iter_mut().skip(2) {
        p.start(&bin)?;
        p.ready(Duration::from_secs(60)).await?;
    }
    let mut gateways = Vec::new();
    for i in 0..2 {
        let c = conf(&format!("http://127.0.0.1:{}", ports[2 + i]), "tidemark", "tidemark");
        gateways.push(S3Storage::connect(&c, "local").await.map_err(|e| e.to_string())?);
    }
    gateways[0]
        .client()
        .create_bucket()
        .bucket("local")
        .send()
        .await
        .map_err(|e| format!("creating bucket local: {e}"))?;
    let filers = vec![
        HttpFiler::new(&fa, None).map_err(|e| e.to_string())?,
        HttpFiler::new(&fb, None).map_err(|e| e.to_string())?,
    ];
    // Every subscription tails before the mutator starts.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let list = shell(&bin, &fa, "remote.events.list -json").unwrap_or_default();
        let docs: serde_json::Value = serde_json::from_str(&list).unwrap_or_default();
        let tailing = docs.as_array().map_or(0, |a| a.iter().filter(|d| d["status"]["state"] == "tailing").count());
        if tailing == 3 {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("the subscriptions did not all tail within 2 minutes: {list}"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let (stop, _) = tokio::sync::watch::channel(false);
    let world = Arc::new(World {
        cfg: cfg.clone(),
        buckets,
        latest: Mutex::default(),
        pending: Mutex::default(),
        lags: Mutex::default(),
        files: Mutex::default(),
        any_filer: HttpFiler::new(&both_filers, None).map_err(|e| e.to_string())?,
        filers,
        gateways,
        report: Mutex::default(),
        stop,
    });
    let procs = Arc::new(tokio::sync::Mutex::new(procs));
    let mutators: Vec<_> = (0..2).map(|i| tokio::spawn(mutate(world.clone(), cfg.seed.wrapping_add(i + 1)))).collect();
    let watcher = tokio::spawn(watch_lags(world.clone()));
    let faults = tokio::spawn(inject(world.clone(), procs.clone(), pg, bin.clone(), cfg.seed));
    tokio::time::sleep(cfg.duration).await;
    let _ = world.stop.send(true);
    for m in mutators {
        let _ = m.await;
    }
    let pg = faults.await.map_err(|e| e.to_string())??;
    // Everything runs again: the last fault ends now.
    {
        let mut procs = procs.lock().await;
        for p in procs.iter_mut() {
            if p.paused {
                p.signal("CONT");
                p.paused = false;
            }
            if p.child.is_none() {
                p.start(&bin)?;
            }
        }
        for p in procs.iter_mut() {
            p.ready(Duration::from_secs(60)).await?;
        }
    }
    let last_fault = Instant::now();
    world.report.lock().unwrap_or_else(|p| p.into_inner()).late =
        world.pending.lock().unwrap_or_else(|p| p.into_inner()).len() as u64;
    let mut converged = None;
    let mut last_check = Check::default();
    while last_fault.elapsed() < cfg.converge_within {
        last_check = check(&world).await;
        if last_check.quiet() {
            converged = Some(last_fault.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    watcher.abort();
    let mut report = std::mem::take(&mut *world.report.lock().unwrap_or_else(|p| p.into_inner()));
    report.converged_after = converged;
    report.lags_ms = std::mem::take(&mut *world.lags.lock().unwrap_or_else(|p| p.into_inner()));
    report.lost = last_check.lost;
    report.clobbered = last_check.clobbered;
    report.diverged = last_check.diverged;
    if converged.is_none() {
        report.problems.extend(last_check.unreachable);
    }
    // Each subscription's counters, and what the logs say.
    match shell(&bin, &fa, "remote.events.list -json") {
        Ok(list) => {
            let docs: serde_json::Value = serde_json::from_str(&list).unwrap_or_default();
            for d in docs.as_array().into_iter().flatten() {
                let c = &d["status"]["counters"];
                let (rec, app) = (c["received"].as_u64().unwrap_or(0), c["applied"].as_u64().unwrap_or(0));
                report.subscriptions.push(format!(
                    "{} ({}): received {rec}, applied {app}, failed {}, echo {}, shadowed {}",
                    d["dir"].as_str().unwrap_or("?"),
                    d["identity"]["topology"].as_str().unwrap_or("?"),
                    c["failed"].as_u64().unwrap_or(0),
                    c["echo_suppressed"].as_u64().unwrap_or(0),
                    c["shadowed"].as_u64().unwrap_or(0),
                ));
                if rec < app {
                    report.problems.push(format!("{}: received {rec} < applied {app}", d["dir"]));
                }
            }
        }
        Err(e) => report.problems.push(format!("cannot list the subscriptions: {e}")),
    }
    let mut procs = procs.lock().await;
    for p in procs.iter_mut() {
        p.stop(Duration::from_secs(15)).await;
    }
    for p in procs.iter() {
        let text = std::fs::read_to_string(&p.log).unwrap_or_default();
        for line in text.lines().filter(|l| l.contains("panicked")) {
            report.panics.push(format!("{}: {line}", p.name));
        }
    }
    if !report.ok() {
        // Keep the logs of a failed soak.
        let kept = work.keep();
        report.problems.push(format!("logs kept in {}", kept.display()));
    }
    drop(pg);
    Ok(report)
}

/// Changes the buckets and writes files, until the soak's end.
async fn mutate(w: Arc<World>, seed: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut stop = w.stop.subscribe();
    let mut op: u64 = seed << 40;
    while !*stop.borrow() {
        op += 1;
        if rng.below(100) < 55 {
            let b = rng.below(w.buckets.len() as u64) as usize;
            let key = format!("ext/k{:02}", rng.below(40));
            let (name, s3) = &w.buckets[b];
            let _ = name;
            let result = if rng.below(100) < 25 {
                s3.delete(&key).await.map(|_| None)
            } else {
                let size = if rng.below(10) == 0 { 150_000 } else { 1 + rng.below(2000) as usize };
                s3.put(&key, content(&key, op, size), Default::default()).await.map(|o| Some(o.etag))
            };
            // moto is a dependency, not a subject: its errors are retried by the next op.
            if let Ok(etag) = result {
                let now = Instant::now();
                w.latest.lock().unwrap_or_else(|p| p.into_inner()).insert((b, key.clone()), op);
                w.pending.lock().unwrap_or_else(|p| p.into_inner()).push((b, key, etag, now, op));
                w.report.lock().unwrap_or_else(|p| p.into_inner()).bucket_ops += 1;
            }
        } else {
            let path = if rng.below(2) == 0 {
                format!("/buckets/local/f{:02}", rng.below(30))
            } else {
                format!("/buckets/direct/loc/f{:02}", rng.below(20))
            };
            let size =
                if rng.below(5) == 0 { 100_000 + rng.below(100_000) as usize } else { 10 + rng.below(3000) as usize };
            let body = content(&path, op, size);
            let via = rng.below(4) as usize;
            let result = if via < 2 {
                let key = path.strip_prefix("/buckets/").and_then(|p| p.split_once('/'));
                match key {
                    Some((bucket, key)) => {
                        let gw = &w.gateways[via];
                        // The gateway client is bound to `local`; other buckets by their own client.
                        if bucket == "local" {
                            gw.put(key, body.clone(), Default::default()).await.map(|_| ())
                        } else {
                            let r =
                                gw.client().put_object().bucket(bucket).key(key).body(body.clone().into()).send().await;
                            r.map(|_| ()).map_err(|e| tidemark_core::Error::Unavailable { message: e.to_string() })
                        }
                    }
                    None => continue,
                }
            } else {
                let b2 = body.clone();
                let stream = futures::stream::once(async move { Ok(b2) }).boxed();
                w.filers[via - 2].write(&path, stream, WriteOptions::default()).await.map(|_| ())
            };
            let mut files = w.files.lock().unwrap_or_else(|p| p.into_inner());
            let e = files.entry(path).or_default();
            let mut report = w.report.lock().unwrap_or_else(|p| p.into_inner());
            match result {
                Ok(()) => {
                    e.acked = Some(body);
                    e.unsure.clear();
                    report.writes_acked += 1;
                }
                Err(_) => {
                    e.unsure.push(body);
                    report.writes_unsure += 1;
                }
            }
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => {}
            _ = tokio::time::sleep(Duration::from_millis(50 + rng.below(100))) => {}
        }
    }
}

/// Watches the changes made in the buckets until each is seen in the namespace (or a later
/// change of the same key supersedes it), and records how long that took.
async fn watch_lags(w: Arc<World>) {
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let pending: Vec<Pending> = w.pending.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if pending.is_empty() {
            continue;
        }
        let paths: Vec<String> = pending.iter().map(|(b, k, ..)| format!("/buckets/{}/{k}", MOUNTS[*b])).collect();
        let mut entries = Vec::with_capacity(paths.len());
        let mut ok = true;
        for chunk in paths.chunks(1000) {
            match w.any_filer.stat_many(chunk).await {
                Ok(e) => entries.extend(e),
                Err(_) => {
                    ok = false;
                    break;
                }
            }
        }
        if !ok {
            continue;
        }
        let latest = w.latest.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut seen: BTreeSet<u64> = BTreeSet::new();
        let mut lags = Vec::new();
        for ((b, k, etag, at, op), entry) in pending.iter().zip(entries) {
            let superseded = latest.get(&(*b, k.clone())).is_some_and(|l| l > op);
            let matches = match (etag, &entry) {
                (None, None) => true,
                (Some(t), Some(e)) => e.remote.as_ref().is_some_and(|r| &r.etag == t),
                _ => false,
            };
            if matches || superseded {
                seen.insert(*op);
                if matches {
                    lags.push(at.elapsed().as_millis() as i64);
                }
            }
        }
        w.pending.lock().unwrap_or_else(|p| p.into_inner()).retain(|(.., op)| !seen.contains(op));
        w.lags.lock().unwrap_or_else(|p| p.into_inner()).extend(lags);
    }
}

/// Every few seconds one fault, on one random process (the one before has recovered): SIGKILL
/// and a restart, a pause of a few seconds, or a clean restart; PostgreSQL is restarted once,
/// half-way. Returns the database (its owner) when the soak's duration is over.
async fn inject(
    w: Arc<World>,
    procs: Arc<tokio::sync::Mutex<Vec<Proc>>>,
    pg: Postgres,
    bin: PathBuf,
    seed: u64,
) -> Result<Postgres, String> {
    let mut rng = Rng(seed | 1);
    let mut stop = w.stop.subscribe();
    let started = Instant::now();
    let mut pg_restarted = false;
    let count = |what: &str| {
        *w.report.lock().unwrap_or_else(|p| p.into_inner()).faults.entry(what.to_string()).or_default() += 1;
    };
    loop {
        let gap = w.cfg.fault_every.mul_f64(0.5 + (rng.below(1000) as f64) / 1000.0);
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return Ok(pg),
            _ = tokio::time::sleep(gap) => {}
        }
        if !pg_restarted && started.elapsed() >= w.cfg.duration / 2 {
            pg_restarted = true;
            pg.restart()?;
            count("postgres restart");
            continue;
        }
        let mut procs = procs.lock().await;
        let i = rng.below(procs.len() as u64) as usize;
        let p = &mut procs[i];
        let kind = match p.kind {
            Kind::Filer => "filer",
            Kind::Gateway => "gateway",
            Kind::Admin => "admin",
            Kind::Worker => "worker",
        };
        match rng.below(3) {
            0 => {
                p.kill();
                count(&format!("SIGKILL {kind}"));
                tokio::time::sleep(Duration::from_millis(200 + rng.below(1000))).await;
                p.start(&bin)?;
            }
            1 => {
                p.signal("STOP");
                p.paused = true;
                count(&format!("SIGSTOP {kind}"));
                tokio::time::sleep(Duration::from_millis(500 + rng.below(3500))).await;
                p.signal("CONT");
                p.paused = false;
            }
            _ => {
                p.stop(Duration::from_secs(20)).await;
                count(&format!("restart {kind}"));
                p.start(&bin)?;
            }
        }
        if let Err(e) = p.ready(Duration::from_secs(60)).await {
            w.report.lock().unwrap_or_else(|p| p.into_inner()).problems.push(e);
        }
    }
}

/// What the namespace looks like against what it must be.
#[derive(Default)]
struct Check {
    lost: Vec<String>,
    clobbered: Vec<String>,
    diverged: Vec<String>,
    unreachable: Vec<String>,
}

impl Check {
    fn quiet(&self) -> bool {
        self.lost.is_empty() && self.clobbered.is_empty() && self.diverged.is_empty() && self.unreachable.is_empty()
    }
}

async fn check(w: &World) -> Check {
    let mut c = Check::default();
    // Every object of every mounted bucket, and nothing more, under ext/.
    for (b, (_, s3)) in w.buckets.iter().enumerate() {
        let dir = MOUNTS[b];
        let mut want: BTreeMap<String, (String, u64)> = BTreeMap::new();
        let mut page: Option<String> = None;
        loop {
            match s3.list("ext/", None, page.as_deref(), 1000).await {
                Ok(p) => {
                    for o in p.objects {
                        want.insert(format!("/buckets/{dir}/{}", o.key), (o.etag, o.size));
                    }
                    match p.next {
                        Some(n) => page = Some(n),
                        None => break,
                    }
                }
                Err(e) => {
                    c.unreachable.push(format!("listing bucket {dir}: {e}"));
                    return c;
                }
            }
        }
        let mut have: BTreeMap<String, (String, u64)> = BTreeMap::new();
        let mut after: Option<String> = None;
        loop {
            match w.filers[b % 2].scan(&format!("/buckets/{dir}/ext"), after.as_deref(), 1000).await {
                Ok(p) => {
                    for e in p.entries.iter().filter(|e| !e.is_dir()) {
                        let etag = e.remote.as_ref().map(|r| r.etag.clone()).unwrap_or_default();
                        have.insert(e.path.clone(), (etag, e.size));
                    }
                    match p.next {
                        Some(n) => after = Some(n),
                        None => break,
                    }
                }
                Err(tidemark_core::Error::NotFound { .. }) => break,
                Err(e) => {
                    c.unreachable.push(format!("scanning /buckets/{dir}/ext: {e}"));
                    return c;
                }
            }
        }
        for (p, want_v) in &want {
            match have.get(p) {
                Some(h) if h == want_v => {}
                other => c.diverged.push(format!("{p}: the bucket has {want_v:?}, the namespace {other:?}")),
            }
        }
        for p in have.keys().filter(|p| !want.contains_key(*p)) {
            c.diverged.push(format!("{p}: in the namespace, not in the bucket"));
        }
    }
    // Every file written reads back, through every filer and every gateway.
    let files = w.files.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for (path, exp) in files {
        let candidates: Vec<&Bytes> = exp.acked.iter().chain(exp.unsure.iter()).collect();
        if candidates.is_empty() {
            continue; // never acknowledged, and nothing must be there
        }
        for (i, f) in w.filers.iter().enumerate() {
            let got = match f.read(&path, None).await {
                Ok((entry, s)) => {
                    if path.starts_with("/buckets/direct/loc/") && !tidemark_core::decide::is_locally_dirty(&entry) {
                        c.clobbered.push(format!("{path}: no longer a local write (filer {i}): {:?}", entry.remote));
                    }
                    read_all(s).await
                }
                Err(tidemark_core::Error::NotFound { .. }) => None,
                Err(e) => {
                    c.unreachable.push(format!("reading {path} through filer {i}: {e}"));
                    continue;
                }
            };
            match got {
                Some(b) if candidates.iter().any(|x| x[..] == b[..]) => {}
                None if exp.acked.is_none() => {}
                other => c.lost.push(format!(
                    "{path} through filer {i}: {} bytes, not one of the writes made",
                    other.map_or(0, |b| b.len())
                )),
            }
        }
        let Some((bucket, key)) = path.strip_prefix("/buckets/").and_then(|p| p.split_once('/')) else { continue };
        for (i, gw) in w.gateways.iter().enumerate() {
            let got = gw.client().get_object().bucket(bucket).key(key).send().await;
            let got = match got {
                Ok(o) => o.body.collect().await.ok().map(|b| b.into_bytes().to_vec()),
                Err(e) if e.raw_response().is_some_and(|r| r.status().as_u16() == 404) => None,
                Err(e) => {
                    c.unreachable.push(format!("reading {path} through gateway {i}: {e}"));
                    continue;
                }
            };
            match got {
                Some(b) if candidates.iter().any(|x| x[..] == b[..]) => {}
                None if exp.acked.is_none() => {}
                other => c.lost.push(format!(
                    "{path} through gateway {i}: {} bytes, not one of the writes made",
                    other.map_or(0, |b| b.len())
                )),
            }
        }
    }
    c
}

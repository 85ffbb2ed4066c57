//! The roles' command-line arguments and how each one starts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use tidemark_core::Filer;
use tidemark_core::cache::{Budget, human_bytes};
use tidemark_filer::{CacheConfig, DataDir, HttpFiler, LocalFiler, http};

use crate::shell;

#[derive(Args)]
pub struct FilerArgs {
    /// Directory for the embedded store (meta.db, unless --store names another), file content
    /// (blobs/) and the LOCK that keeps a second process out. Created if missing.
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
    /// Address to listen on. A non-loopback address requires --token.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:8888")]
    addr: SocketAddr,
    #[command(flatten)]
    socket: SocketArgs,
    #[command(flatten)]
    tls: ListenTlsArgs,
    #[command(flatten)]
    common: StoreArgs,
}

/// TLS on a role's listeners.
#[derive(Args)]
pub struct ListenTlsArgs {
    /// Serve HTTPS with this certificate chain (PEM, the server's certificate first). With
    /// --tls-key. Clients verify it: against the system's CAs, or with --tls-ca for a private CA.
    #[arg(long, env = "TIDEMARK_TLS_CERT", value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "TIDEMARK_TLS_KEY", value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Listen beyond loopback without TLS (only behind a proxy that terminates TLS, or on a
    /// network you trust): tokens, keys and data would otherwise cross it readable.
    #[arg(long)]
    insecure_plaintext: bool,
}

impl ListenTlsArgs {
    /// The acceptor for the listeners on `addrs`, or none (plain HTTP), refusing plain HTTP
    /// beyond loopback unless --insecure-plaintext says so.
    fn acceptor(&self, addrs: &[SocketAddr]) -> Result<Option<tidemark_http::tls::TlsAcceptor>, String> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => tidemark_http::tls::acceptor(cert, key).map(Some),
            _ => match addrs.iter().find(|a| !a.ip().is_loopback()) {
                Some(addr) if !self.insecure_plaintext => Err(format!(
                    "refusing to listen on {addr} in plain HTTP: tokens, keys and data would cross the network readable;                      pass --tls-cert and --tls-key, or --insecure-plaintext if a TLS proxy fronts it"
                )),
                _ => Ok(None),
            },
        }
    }

    fn scheme(&self) -> &'static str {
        if self.tls_cert.is_some() { "https" } else { "http" }
    }
}

/// The filer's socket, on a role that serves the filer's API.
#[derive(Args)]
pub struct SocketArgs {
    /// Serve the API on TCP only: by default it is also served on a Unix socket in the data
    /// directory (DATA_DIR/filer.sock, mode 0600), which mounts, gateways and workers on this
    /// machine run by the same user reach with less of the kernel's work per byte than loopback
    /// TCP.
    #[arg(long)]
    no_socket: bool,
}

impl SocketArgs {
    /// The filer's socket in `data_dir`, unless turned off; one that cannot be bound is said
    /// and gone without (clients reach the filer over TCP).
    fn bind(&self, data_dir: &std::path::Path) -> Option<http::Socket> {
        if self.no_socket {
            return None;
        }
        match http::Socket::bind(data_dir) {
            Ok(s) => {
                tracing::info!(socket = %s.path().display(), "the filer's API is also served on its socket");
                Some(s)
            }
            Err(e) => {
                tracing::warn!(error = %e, "serving the filer's API on TCP only (pass --no-socket to say so)");
                None
            }
        }
    }
}

#[derive(Args)]
pub struct ServerArgs {
    /// Directory for the embedded store (meta.db, unless --store names another), file content
    /// (blobs/) and the LOCK that keeps a second process out. Created if missing.
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
    /// Address the filer's API listens on. A non-loopback address requires --token.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:8888")]
    filer_addr: SocketAddr,
    #[command(flatten)]
    socket: SocketArgs,
    /// Address the admin (Admin UI, /metrics, the worker API) listens on.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:23646")]
    admin_addr: SocketAddr,
    /// Prices of requests for the Admin UI's per-hour figures, replacing the providers' list
    /// prices operation by operation: a JSON file such as `{"s3": {"LIST": 0.0054, "GET":
    /// 0.00043}}`, in dollars per 1,000 requests.
    #[arg(long, value_name = "FILE")]
    request_prices: Option<PathBuf>,
    /// Address the S3 gateway listens on (`off`: no gateway). Its buckets are the directories
    /// under /buckets. Beyond loopback it needs an access key (s3.configure) first.
    #[arg(long, value_name = "HOST:PORT|off", default_value = "127.0.0.1:8333", value_parser = parse_s3_addr)]
    s3_addr: S3Addr,
    /// Keyring of the S3 gateway's server-side encryption: `NAME=BASE64` lines of 256-bit keys
    /// (`openssl rand -base64 32`), `aws/s3` for SSE-S3, any name for SSE-KMS (its key id),
    /// mode 600. Keep it off the disk that holds the content (conventionally
    /// /etc/tidemark/sse-keys). Without one, SSE-S3 and SSE-KMS are refused; SSE-C needs none.
    #[arg(long, env = "TIDEMARK_SSE_KEYS", value_name = "FILE")]
    sse_keys: Option<PathBuf>,
    /// Mount this local directory as a bucket at /buckets/NAME (NAME: the directory's name) with
    /// events enabled: files copied into it appear in the namespace within a second. Idempotent
    /// across restarts. The quick way to see Tidemark work without a cloud account.
    #[arg(long, value_name = "DIR")]
    local_bucket: Option<PathBuf>,
    #[command(flatten)]
    tls: ListenTlsArgs,
    #[command(flatten)]
    slices: SliceArgs,
    #[command(flatten)]
    common: StoreArgs,
}

#[derive(Args)]
pub struct S3Args {
    /// The filer whose namespace the gateway serves.
    #[arg(long, env = "TIDEMARK_FILER", value_name = "HOST:PORT", default_value = "127.0.0.1:8888")]
    filer: String,
    /// Address to listen on. Beyond loopback an access key must be configured first
    /// (`s3.configure ... -apply`); on loopback, while none is, the development key
    /// tidemark/tidemark is accepted.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:8333")]
    addr: SocketAddr,
    /// Keyring of the S3 gateway's server-side encryption: `NAME=BASE64` lines of 256-bit keys
    /// (`openssl rand -base64 32`), `aws/s3` for SSE-S3, any name for SSE-KMS (its key id),
    /// mode 600. Keep it off the disk that holds the content (conventionally
    /// /etc/tidemark/sse-keys). Without one, SSE-S3 and SSE-KMS are refused; SSE-C needs none.
    #[arg(long, env = "TIDEMARK_SSE_KEYS", value_name = "FILE")]
    sse_keys: Option<PathBuf>,
    #[command(flatten)]
    tls: ListenTlsArgs,
    /// The filer's token, if it has one.
    /// Prefer the environment variable TIDEMARK_TOKEN: a token on the command line is visible
    /// to every user of the machine in `ps`.
    #[arg(long, env = "TIDEMARK_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    token: Option<String>,
}

#[derive(Args)]
pub struct MountArgs {
    /// The filer whose namespace is mounted; several filers of one cluster (`A,B`): when one
    /// cannot be reached, the next, and reads in progress resume there.
    #[arg(long, env = "TIDEMARK_FILER", value_name = "HOST:PORT[,...]", default_value = "127.0.0.1:8888")]
    filer: String,
    /// An empty directory to mount on.
    #[arg(value_name = "MOUNTPOINT")]
    mountpoint: PathBuf,
    /// The namespace directory shown at the mount point (default: the whole namespace).
    #[arg(long, value_name = "DIR", default_value = "/")]
    root: String,
    /// Refuse every change (EROFS).
    #[arg(long)]
    read_only: bool,
    /// Let other users than the one mounting use the mount (needs user_allow_other in
    /// /etc/fuse.conf unless root).
    #[arg(long)]
    allow_other: bool,
    /// Seconds the kernel may keep attributes and names; changes invalidate them sooner.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    attr_ttl: u64,
    /// Seconds the filer may leave a call unanswered (for an upload: take none of its bytes)
    /// before the operation fails with EIO. An upload takes as long as its bytes take.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    timeout: u64,
    /// Where the bytes of a file are kept when its last close cannot store them (the filer
    /// unreachable): a program's close has returned by then, so this copy is what is left.
    /// Default: $XDG_STATE_HOME/tidemark/unsaved (~/.local/state/tidemark/unsaved).
    #[arg(long, value_name = "DIR")]
    unsaved_dir: Option<PathBuf>,
    /// Read every file through the filer's API. By default, a file opened read-only whose
    /// bytes lie in the data directory of a filer on this machine is read straight from that
    /// file: by the kernel in a --read-only mount (FUSE passthrough, Linux 6.9+, as root: near
    /// the local disk's speed), by the mount itself in a read-write one.
    #[arg(long)]
    no_passthrough: bool,
    /// Reach the filer over TCP only. By default, when the filer is on this machine and serves
    /// its socket (DATA_DIR/filer.sock) to this user, the mount talks to it there: the same
    /// API with less of the kernel's work per byte.
    #[arg(long)]
    no_filer_socket: bool,
    /// The filer's token, if it has one.
    /// Prefer the environment variable TIDEMARK_TOKEN: a token on the command line is visible
    /// to every user of the machine in `ps`.
    #[arg(long, env = "TIDEMARK_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    token: Option<String>,
}

#[derive(Clone, Copy)]
pub enum S3Addr {
    Off,
    On(SocketAddr),
}

fn parse_s3_addr(s: &str) -> Result<S3Addr, String> {
    if s.eq_ignore_ascii_case("off") {
        return Ok(S3Addr::Off);
    }
    s.parse().map(S3Addr::On).map_err(|e| format!("{s:?}: {e} (HOST:PORT, or off)"))
}

#[derive(Args)]
pub struct AdminArgs {
    /// The filer whose subscriptions the admin schedules; several filers of one cluster
    /// (`A,B`): when one cannot be reached, the next.
    #[arg(long, env = "TIDEMARK_FILER", value_name = "HOST:PORT[,...]", default_value = "127.0.0.1:8888")]
    filer: String,
    /// Address to listen on (Admin UI, /metrics, the worker API). A non-loopback address requires --token.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:23646")]
    addr: SocketAddr,
    /// Drop a worker that has not heart-beaten for this many seconds, and give its slices to others.
    #[arg(long, value_name = "SECS", default_value_t = 15)]
    worker_timeout: u64,
    /// Any number of admins may run on one cluster: the one holding the lease `admin/active`
    /// schedules, the others stand by (read-only pages that name the active one) and take over
    /// this long after it stops renewing the lease (it stopped, was paused or cut off).
    #[arg(long, value_name = "SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(2..=3600))]
    lease_ttl: u64,
    /// How workers and browsers reach this admin (its URL), shown by standbys as the active
    /// admin: default the address it listens on.
    #[arg(long, value_name = "URL")]
    advertise: Option<String>,
    /// Prices of requests for the Admin UI's per-hour figures, replacing the providers' list
    /// prices operation by operation: a JSON file such as `{"s3": {"LIST": 0.0054, "GET":
    /// 0.00043}}`, in dollars per 1,000 requests.
    #[arg(long, value_name = "FILE")]
    request_prices: Option<PathBuf>,
    /// The workers' token (the filer's --cluster-token): accepted on the worker API only.
    #[arg(long = "cluster-token", env = "TIDEMARK_CLUSTER_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    cluster_token: Option<String>,
    #[command(flatten)]
    tls: ListenTlsArgs,
    /// The token of the filer, and the one the admin requires from its clients.
    /// Prefer the environment variable TIDEMARK_TOKEN: a token on the command line is visible
    /// to every user of the machine in `ps`.
    #[arg(long, env = "TIDEMARK_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    token: Option<String>,
}

#[derive(Args)]
pub struct WorkerArgs {
    /// The admin that assigns this worker its slices; several (`A,B`): the active one of them
    /// (a standby or unreachable admin is passed over for the next).
    #[arg(long, env = "TIDEMARK_ADMIN", value_name = "HOST:PORT[,...]", default_value = "127.0.0.1:23646")]
    admin: String,
    /// The filer the slices read and write; several filers of one cluster (`A,B`): when one
    /// cannot be reached, the next (a write is never sent twice).
    #[arg(long, env = "TIDEMARK_FILER", value_name = "HOST:PORT[,...]", default_value = "127.0.0.1:8888")]
    filer: String,
    /// The worker's id on the admin's Workers page (default: HOST-PID).
    #[arg(long, value_name = "ID")]
    id: Option<String>,
    #[command(flatten)]
    slices: SliceArgs,
    #[command(flatten)]
    local: LocalRootArgs,
    /// The token of the filer and the admin.
    /// Prefer the environment variable TIDEMARK_TOKEN: a token on the command line is visible
    /// to every user of the machine in `ps`.
    #[arg(long, env = "TIDEMARK_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    token: Option<String>,
}

#[derive(Args)]
pub struct SliceArgs {
    /// How many slices (subscriptions) this worker runs at once.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=1024))]
    max_execute: u64,
    /// Seconds a slice holds its subscription's lease between renewals. A worker that stops
    /// (paused, cut off) loses its subscriptions to another worker after this long.
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(2..=3600))]
    lease_ttl: u64,
}

#[derive(Args)]
pub struct StoreArgs {
    /// The metadata store: `sqlite` (default: DIR/meta.db), `sqlite:///path/to/file.db`, or
    /// `postgres://USER:PASSWORD@HOST:PORT/DBNAME`, shared by several filers (schema created
    /// and migrated at start).
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// Keep file content (above 64 KiB; smaller content is in the store) on a shared object
    /// store instead of the data directory, so every filer of a cluster reads every file and a
    /// filer's death loses none: `s3://BUCKET/PREFIX?endpoint=URL&region=REGION` (AWS S3, or an
    /// S3-compatible store: MinIO, Ceph RGW). Credentials come from the standard AWS chain
    /// (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, an instance role). Every filer of a
    /// cluster must be given the same; `tidemark blobs migrate` moves a data directory's files.
    #[arg(long, env = "TIDEMARK_BLOB_STORE", value_name = "URL")]
    blob_store: Option<String>,
    /// How long the leases of the work one filer of a cluster does at a time (the outbound sync,
    /// the blob collector) last: when this filer dies, another takes over after at most this long.
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(2..=3600))]
    task_lease_ttl: u64,
    /// The content cache's budget: bytes with a K/M/G/T suffix (`20G`), or a percentage of the
    /// disk that holds --data-dir (`10%`). Remote-backed files read once are served from here;
    /// past the budget the least recently read are evicted (local writes never are). `0` turns
    /// the cache off: every read then goes to the bucket.
    #[arg(long, value_name = "SIZE", default_value = "10%", value_parser = parse_budget)]
    cache_size: Budget,
    /// The unit the cache fetches and keeps: a read of a few bytes fetches one chunk of this
    /// size; a sequential read, one request per chunk. Changing it empties the cache (its chunks
    /// are fetched again as they are read).
    #[arg(long, value_name = "SIZE", default_value = "8M", value_parser = parse_chunk)]
    cache_chunk_size: u64,
    /// Require `Authorization: Bearer TOKEN` on every request.
    /// Prefer the environment variable TIDEMARK_TOKEN: a token on the command line is visible
    /// to every user of the machine in `ps`.
    #[arg(long, env = "TIDEMARK_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A token that reaches the namespace but not the control plane: files and directories
    /// anywhere outside /etc/tidemark/ (remote configurations and their secrets, mounts,
    /// subscriptions), and no leases. For the FUSE mount, scripts and users who only read and
    /// write data. Repeat for several (one per client, to revoke them one by one); needs --token.
    /// The environment variable takes a comma-separated list.
    #[arg(
        long = "data-token",
        env = "TIDEMARK_DATA_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true,
        value_delimiter = ','
    )]
    data_tokens: Vec<String>,
    /// The token of the cluster's own roles (workers, the S3 gateway, the admin's worker API):
    /// with it, only this token reads the secrets in /etc/tidemark/ (remote keys, S3 secrets);
    /// --token then reads them masked, and a document written back with the masks keeps the
    /// stored secrets. Needs --token. Give it to workers (their --token) and gateways.
    #[arg(long = "cluster-token", env = "TIDEMARK_CLUSTER_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    cluster_token: Option<String>,
    #[command(flatten)]
    local: LocalRootArgs,
}

impl StoreArgs {
    fn tokens(&self) -> Result<http::Tokens, String> {
        let t = http::Tokens {
            admin: self.token.clone().filter(|t| !t.is_empty()),
            data: self.data_tokens.clone(),
            cluster: self.cluster_token.clone().filter(|t| !t.is_empty()),
            cluster_file: None,
        };
        t.check().map_err(|e| e.to_string())?;
        Ok(t)
    }
}

#[derive(Args)]
pub struct LocalRootArgs {
    /// A directory that local remotes (`remote.configure -type=local`) may serve: buckets at or
    /// below it. Repeat for several. Without one no local directory is served, whatever a remote
    /// configuration says (whoever can configure remotes could otherwise read and write any file
    /// this process can).
    #[arg(long = "local-root", value_name = "DIR")]
    local_roots: Vec<PathBuf>,
}

impl LocalRootArgs {
    fn roots(&self) -> Result<tidemark_cloud::local::LocalRoots, String> {
        tidemark_cloud::local::LocalRoots::only(&self.local_roots).map_err(|e| e.to_string())
    }
}

#[derive(Args)]
pub struct ShellArgs {
    /// The filer to talk to.
    #[arg(long, env = "TIDEMARK_FILER", value_name = "HOST:PORT", default_value = "127.0.0.1:8888")]
    filer: String,
    /// The admin, for what only it knows (which worker runs a subscription's slice).
    #[arg(long, env = "TIDEMARK_ADMIN", value_name = "HOST:PORT", default_value = "127.0.0.1:23646")]
    admin: String,
    /// The filer's token, if it has one.
    /// Prefer the environment variable TIDEMARK_TOKEN: a token on the command line is visible
    /// to every user of the machine in `ps`.
    #[arg(long, env = "TIDEMARK_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Run these commands (separated by `;`) and exit; non-zero exit status on the first failure.
    #[arg(short = 'c', value_name = "COMMANDS")]
    command: Option<String>,
}

fn init_logging() {
    // s3s logs every refused request at ERROR, twice: a client without credentials could fill
    // the disk. The gateway logs what is the server's fault itself (InternalError, as a warning);
    // `RUST_LOG=info,s3s=error` brings the refusals back for debugging.
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,s3s=off"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

fn parse_budget(s: &str) -> Result<Budget, String> {
    Budget::parse(s).map_err(|e| e.to_string())
}

fn parse_chunk(s: &str) -> Result<u64, String> {
    match tidemark_core::cache::parse_size(s).map_err(|e| e.to_string())? {
        n if (4096..=1 << 30).contains(&n) => Ok(n),
        _ => Err(format!("{s:?}: a chunk is 4K to 1G")),
    }
}

/// The size of the disk that holds `dir`.
fn disk_bytes(dir: &std::path::Path) -> Result<u64, String> {
    let st =
        rustix::fs::statvfs(dir).map_err(|e| format!("cannot read the size of the disk of {}: {e}", dir.display()))?;
    Ok(st.f_blocks.saturating_mul(st.f_frsize))
}

/// The filer of a role, with the lease that keeps it the only filer of a data-directory home.
async fn open_filer(
    data_dir: &PathBuf,
    common: &StoreArgs,
) -> Result<(LocalFiler, tidemark_filer::gc::HomeLease), String> {
    let mut filer = open_store(data_dir, common.store.as_deref()).await?;
    if let Some(url) = &common.blob_store {
        filer = filer.with_blob_store(connect_blob_store(url).await?);
    }
    let budget = match common.cache_size {
        Budget::Bytes(b) => b,
        pct => pct.bytes(disk_bytes(data_dir)?),
    };
    let config = CacheConfig { budget_bytes: budget, chunk_bytes: common.cache_chunk_size };
    let filer = filer.with_cache(config).map_err(|e| e.to_string())?;
    // Every filer of a cluster keeps content where the others can read it, or refuses.
    let ttl = std::time::Duration::from_secs(common.task_lease_ttl);
    let home = tidemark_filer::gc::claim_home(&filer, ttl).await.map_err(|e| e.to_string())?;
    tracing::info!(blobs = %filer.blobs().describe(), "file content");
    // Sweep what a crash left now, not at the first read.
    filer.cache().start();
    if budget == 0 {
        tracing::info!("content cache off (--cache-size 0): every read of a remote-backed file goes to its bucket");
    } else {
        tracing::info!(budget = %human_bytes(budget), node = filer.cache().node(), "content cache");
    }
    Ok((filer, home))
}

/// The blob store of `--blob-store URL`, checked to answer.
pub(crate) async fn connect_blob_store(url: &str) -> Result<tidemark_filer::blobs::S3Blobs, String> {
    let parsed = tidemark_filer::blobs::BlobStoreUrl::parse(url).map_err(|e| e.to_string())?;
    tidemark_filer::blobs::S3Blobs::connect(&parsed, None).await.map_err(|e| format!("--blob-store: {e}"))
}

pub(crate) async fn open_store(data_dir: &PathBuf, store: Option<&str>) -> Result<LocalFiler, String> {
    let dir = DataDir::open(data_dir).map_err(|e| e.to_string())?;
    match store {
        None | Some("sqlite") => LocalFiler::open(dir).map_err(|e| e.to_string()),
        Some(url) if url.starts_with("sqlite://") => {
            let file = PathBuf::from(&url["sqlite://".len()..]);
            LocalFiler::open_sqlite(dir, &file).map_err(|e| e.to_string())
        }
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            let store = tidemark_store::PgStore::connect_with(url, tidemark_http::tls::trusted_config())
                .await
                .map_err(|e| e.to_string())?;
            LocalFiler::open_with_store(dir, Arc::new(store)).map_err(|e| e.to_string())
        }
        Some(other) => Err(format!(
            "unknown --store {other:?}: use `sqlite`, `sqlite:///path/to/file.db` or `postgres://USER:PASSWORD@HOST:PORT/DBNAME`"
        )),
    }
}

/// Keeps the data directory's lease while the filer runs; losing it (this filer was paused or
/// cut off past it, and another filer took the cluster's content home over) stops the process:
/// files written here from then on would be readable through this filer alone. On a stop it
/// releases the lease; the role awaits the task so that the release is done before the process
/// exits (a filer started next on the store would otherwise wait out the lease).
fn keep_home(
    filer: &Arc<LocalFiler>,
    home: tidemark_filer::gc::HomeLease,
    ttl: std::time::Duration,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let store = filer.store().clone();
    tokio::spawn(async move {
        if let Err(e) = tidemark_filer::gc::keep_home(store, home, ttl, stopped(stop)).await {
            tracing::error!(error = %e, "another filer took over this cluster's content home while this one was unreachable; stopping");
            eprintln!(
                "error: another filer took over this cluster's content home (its data directory) while this one was unreachable; stopping"
            );
            std::process::exit(1);
        }
    })
}

/// The blob collector, on whichever filer of the cluster holds its lease. Its grace period
/// (how long a blob an entry let go of stays readable) is `TIDEMARK_BLOB_GRACE_SECS` or 60 s.
fn collector(
    filer: &Arc<LocalFiler>,
    bound: &str,
    ttl: std::time::Duration,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let mut c = tidemark_filer::gc::BlobCollector::new(filer.clone(), filer_id(bound)).with_lease_ttl(ttl);
    if let Some(secs) = std::env::var("TIDEMARK_BLOB_GRACE_SECS").ok().and_then(|v| v.parse().ok()) {
        c = c.with_grace(std::time::Duration::from_secs(secs));
    }
    tokio::spawn(c.run(stopped(stop)))
}

/// This filer's name in the outbound sync's lease: unique among the filers of a cluster.
fn filer_id(bound: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    format!("{}-{}@{bound}", if host.is_empty() { "filer" } else { &host }, std::process::id())
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C). The handlers are installed when this is called, not
/// when it is first awaited: a signal that arrives while the role is still starting up is then
/// a clean shutdown, not the default "terminate at once". Call it first thing in a role.
fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let (term, int) = {
        use tokio::signal::unix::{SignalKind, signal};
        (signal(SignalKind::terminate()).ok(), signal(SignalKind::interrupt()).ok())
    };
    async move {
        #[cfg(unix)]
        {
            let wait = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = wait(term) => {},
                _ = wait(int) => {},
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        tracing::info!("shutting down: finishing requests in flight");
    }
}

/// The list prices of requests, with the operator's file (`--request-prices`) in their place.
fn request_prices(file: Option<&Path>) -> Result<tidemark_core::requests::Prices, String> {
    let list = tidemark_core::requests::Prices::list();
    let Some(file) = file else { return Ok(list) };
    let text = std::fs::read_to_string(file).map_err(|e| format!("--request-prices {}: {e}", file.display()))?;
    list.with_overrides(&text).map_err(|e| format!("--request-prices {}: {e}", file.display()))
}

fn fail(code: i32, message: impl std::fmt::Display) -> i32 {
    eprintln!("error: {message}");
    code
}

async fn bind(addr: SocketAddr, what: &str) -> Result<(tokio::net::TcpListener, String), String> {
    let listener = tidemark_http::listen(addr)
        .map_err(|e| format!("cannot listen on {addr}: {e} (is another {what} running? choose another address)"))?;
    let bound = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| addr.to_string());
    Ok((listener, bound))
}

async fn stopped(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

fn worker_config(
    id: Option<String>,
    s: &SliceArgs,
    local_roots: tidemark_cloud::local::LocalRoots,
) -> tidemark_worker::WorkerConfig {
    tidemark_worker::WorkerConfig {
        worker_id: id.unwrap_or_else(tidemark_worker::default_worker_id),
        max_execute: s.max_execute as usize,
        slice: tidemark_worker::SliceSettings { lease_ttl: std::time::Duration::from_secs(s.lease_ttl), local_roots },
    }
}

pub async fn run_filer(a: FilerArgs) -> i32 {
    init_logging();
    let shutdown = shutdown_signal();
    if let Err(e) = http::check_bind(a.addr, a.common.token.as_deref()) {
        return fail(2, e);
    }
    let tokens = match a.common.tokens() {
        Ok(t) => t,
        Err(e) => return fail(2, e),
    };
    let tls = match a.tls.acceptor(&[a.addr]) {
        Ok(t) => t,
        Err(e) => return fail(2, e),
    };
    let local_roots = match a.common.local.roots() {
        Ok(r) => r,
        Err(e) => return fail(2, e),
    };
    let (filer, home) = match open_filer(&a.data_dir, &a.common).await {
        Ok((f, home)) => (Arc::new(f), home),
        Err(e) => return fail(1, e),
    };
    let ttl = std::time::Duration::from_secs(a.common.task_lease_ttl);
    filer.remotes().allow_local(local_roots);
    let (listener, bound) = match bind(a.addr, "filer").await {
        Ok(l) => l,
        Err(e) => return fail(1, e),
    };
    // Scripts and tests read this line to find the port (with --addr 127.0.0.1:0).
    println!("tidemark filer listening on {}://{bound} (data dir {})", a.tls.scheme(), a.data_dir.display());
    tracing::info!(addr = %bound, store = filer.store().backend(), "filer started");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let outbound = {
        let sync = tidemark_filer::outbound::OutboundSync::new(filer.clone(), filer_id(&bound)).with_lease_ttl(ttl);
        tokio::spawn(sync.run(stopped(stop_rx.clone())))
    };
    let collector = collector(&filer, &bound, ttl, stop_rx.clone());
    let home = keep_home(&filer, home, ttl, stop_rx.clone());
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let api: Arc<dyn Filer> = filer.clone();
    let socket = a.socket.bind(&a.data_dir);
    let served = http::serve_beside(listener, socket, api, tokens, tls, stopped(stop_rx)).await;
    let _ = outbound.await;
    let _ = collector.await;
    let _ = home.await;
    match served {
        Ok(()) => 0,
        Err(e) => fail(1, format!("the filer stopped: {e}")),
    }
}

/// The filer, the admin and one worker in one process (`tidemark server`).
pub async fn run_server(a: ServerArgs) -> i32 {
    init_logging();
    let shutdown = shutdown_signal();
    if let Err(e) = http::check_bind(a.filer_addr, a.common.token.as_deref()) {
        return fail(2, e);
    }
    let mut tokens = match a.common.tokens() {
        Ok(t) => t,
        Err(e) => return fail(2, e),
    };
    let prices = match request_prices(a.request_prices.as_deref()) {
        Ok(p) => p,
        Err(e) => return fail(2, e),
    };
    if let Err(e) = tidemark_admin::check_bind(a.admin_addr, a.common.token.as_deref()) {
        return fail(2, e);
    }
    let mut addrs = vec![a.filer_addr, a.admin_addr];
    if let S3Addr::On(s3) = a.s3_addr {
        addrs.push(s3);
    }
    let tls = match a.tls.acceptor(&addrs) {
        Ok(t) => t,
        Err(e) => return fail(2, e),
    };
    // The server's own worker talks to its admin over HTTPS too: without --tls-ca it trusts the
    // served certificate file (a self-signed certificate, or a chain that ends with its CA).
    if let Some(cert) = &a.tls.tls_cert
        && !tidemark_http::tls::trusts_private_ca()
        && let Err(e) = tidemark_http::tls::trust(cert)
    {
        return fail(2, e);
    }
    let local_bucket = match a.local_bucket.as_deref().map(crate::quickstart::LocalBucket::resolve).transpose() {
        Ok(b) => b,
        Err(e) => return fail(2, e),
    };
    // --local-bucket DIR allows DIR itself.
    let local_roots = match a.common.local.roots().and_then(|r| match &local_bucket {
        Some(b) => r.with(&b.dir()).map_err(|e| e.to_string()),
        None => Ok(r),
    }) {
        Ok(r) => r,
        Err(e) => return fail(2, e),
    };
    let (filer, home) = match open_filer(&a.data_dir, &a.common).await {
        Ok((f, home)) => (Arc::new(f), home),
        Err(e) => return fail(1, e),
    };
    if tokens.admin.is_none() && tokens.cluster.is_none() {
        // Without tokens, the roles in this process read the secrets in-process and every HTTP
        // client sees them masked, but for one that reads the data directory's cluster.token
        // (the shell opening a remote on this machine, as the data directory's owner).
        match tidemark_filer::datadir::fresh_cluster_token(&a.data_dir) {
            Ok((token, file)) => {
                tokens.cluster = Some(token);
                tokens.cluster_file = Some(file.display().to_string());
            }
            Err(e) => return fail(1, e),
        }
    }
    let ttl = std::time::Duration::from_secs(a.common.task_lease_ttl);
    filer.remotes().allow_local(local_roots.clone());
    let (filer_listener, filer_bound) = match bind(a.filer_addr, "filer").await {
        Ok(l) => l,
        Err(e) => return fail(1, e),
    };
    let (admin_listener, admin_bound) = match bind(a.admin_addr, "admin").await {
        Ok(l) => l,
        Err(e) => return fail(1, e),
    };
    let keyring = match a.sse_keys.as_deref().map(tidemark_s3::sse::Keyring::load).transpose() {
        Ok(k) => k,
        Err(e) => return fail(2, e),
    };
    let s3_listener = match a.s3_addr {
        S3Addr::Off => None,
        S3Addr::On(addr) => {
            if let Err(e) = tidemark_s3::check_bind(addr, &*filer).await {
                return fail(2, e);
            }
            match bind(addr, "S3 gateway").await {
                Ok(l) => Some((l, addr.ip().is_loopback())),
                Err(e) => return fail(1, e),
            }
        }
    };
    let scheme = a.tls.scheme();
    println!("tidemark filer listening on {scheme}://{filer_bound} (data dir {})", a.data_dir.display());
    println!("tidemark admin listening on {scheme}://{admin_bound} (Admin UI: {scheme}://{admin_bound}/subscriptions)");
    if let Some(((_, bound), _)) = &s3_listener {
        println!("tidemark s3 listening on {scheme}://{bound} (buckets: the directories under /buckets)");
    }
    tracing::info!(filer = %filer_bound, admin = %admin_bound, store = filer.store().backend(), "server started");
    let api: Arc<dyn Filer> = filer.clone();
    // Servers stop after the worker drained (its last status writes and reports need them).
    let (signal_tx, signal_rx) = tokio::sync::watch::channel(false);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let outbound = {
        let sync =
            tidemark_filer::outbound::OutboundSync::new(filer.clone(), filer_id(&filer_bound)).with_lease_ttl(ttl);
        tokio::spawn(sync.run(stopped(stop_rx.clone())))
    };
    let collector = collector(&filer, &filer_bound, ttl, stop_rx.clone());
    let home = keep_home(&filer, home, ttl, stop_rx.clone());
    let admin = tidemark_admin::Admin::new(
        api.clone(),
        tidemark_admin::AdminConfig {
            filer_label: filer_bound.clone(),
            advertise: format!("{scheme}://{admin_bound}"),
            prices,
            ..Default::default()
        },
    );
    let leadership = tokio::spawn(admin.clone().run_leadership(stop_rx.clone()));
    let detection = tokio::spawn(admin.clone().run_detection(stop_rx.clone()));
    let admin_http = tokio::spawn(tidemark_admin::serve_tls(
        admin_listener,
        admin,
        a.common.token.clone(),
        a.common.cluster_token.clone(),
        tls.clone(),
        stopped(stop_rx.clone()),
    ));
    let s3_http = s3_listener.map(|((listener, _), loopback)| {
        let service = tidemark_s3::service(api.clone(), loopback, keyring);
        tokio::spawn(tidemark_s3::serve_tls(listener, service, tls.clone(), stopped(stop_rx.clone())))
    });
    let socket = a.socket.bind(&a.data_dir);
    let filer_http =
        tokio::spawn(http::serve_beside(filer_listener, socket, api.clone(), tokens, tls, stopped(stop_rx)));
    let client = match tidemark_worker::AdminClient::new(&format!("{scheme}://{admin_bound}"), a.common.token.clone()) {
        Ok(c) => c,
        Err(e) => return fail(1, e),
    };
    let worker = tidemark_worker::Worker::new(client, api.clone(), worker_config(None, &a.slices, local_roots));
    let worker = tokio::spawn(worker.run(signal_rx));
    if let Some(bucket) = local_bucket {
        // The servers already run (spawned above); the set-up talks to the filer in-process.
        match bucket.set_up(api.clone()).await {
            Ok(msg) => println!("{msg}"),
            Err(e) => eprintln!("error: setting up --local-bucket: {e}"),
        }
    }
    shutdown.await;
    let _ = signal_tx.send(true);
    let _ = worker.await;
    let _ = stop_tx.send(true);
    let _ = detection.await;
    let _ = leadership.await;
    let _ = outbound.await;
    let _ = collector.await;
    let _ = home.await;
    let _ = admin_http.await;
    if let Some(s3) = s3_http {
        let _ = s3.await;
    }
    match filer_http.await {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => fail(1, format!("the filer stopped: {e}")),
        Err(e) => fail(1, format!("the filer stopped: {e}")),
    }
}

/// The filer at `addr` for a role that reads secrets whole (a worker opens remotes, a gateway
/// checks signatures): with `token`, or — given none, on the machine of a `tidemark server`
/// without tokens — with the cluster token in its data directory, when this user may read it.
async fn own_filer(addr: &str, token: Option<String>) -> Result<Arc<dyn Filer>, String> {
    let given = token.is_some();
    let filer = HttpFiler::new(addr, token).map_err(|e| e.to_string())?.through_socket().await;
    if !given && let Some(cluster) = filer.with_local_cluster_token().await {
        return Ok(Arc::new(cluster));
    }
    Ok(Arc::new(filer))
}

/// The S3 gateway alone, in front of a filer (`tidemark s3`).
pub async fn run_s3(a: S3Args) -> i32 {
    init_logging();
    let shutdown = shutdown_signal();
    let filer: Arc<dyn Filer> = match own_filer(&a.filer, a.token.clone()).await {
        Ok(f) => f,
        Err(e) => return fail(2, e),
    };
    if let Err(e) = filer.health().await {
        return fail(1, format!("cannot reach the filer at {}: {e}", a.filer));
    }
    if let Err(e) = tidemark_s3::check_bind(a.addr, &*filer).await {
        return fail(2, e);
    }
    if let Err(e) = tidemark_s3::check_secrets(&*filer).await {
        return fail(2, e);
    }
    let keyring = match a.sse_keys.as_deref().map(tidemark_s3::sse::Keyring::load).transpose() {
        Ok(k) => k,
        Err(e) => return fail(2, e),
    };
    let tls = match a.tls.acceptor(&[a.addr]) {
        Ok(t) => t,
        Err(e) => return fail(2, e),
    };
    let (listener, bound) = match bind(a.addr, "S3 gateway").await {
        Ok(l) => l,
        Err(e) => return fail(1, e),
    };
    println!(
        "tidemark s3 listening on {}://{bound} (filer {}; buckets: the directories under /buckets)",
        a.tls.scheme(),
        a.filer
    );
    let service = tidemark_s3::service(filer, a.addr.ip().is_loopback(), keyring);
    match tidemark_s3::serve_tls(listener, service, tls, shutdown).await {
        Ok(()) => 0,
        Err(e) => fail(1, format!("the S3 gateway stopped: {e}")),
    }
}

/// The namespace as a FUSE mount (`tidemark mount`): until SIGTERM/SIGINT or an unmount.
/// SIGUSR1 prints how often it asked the filer.
pub async fn run_mount(a: MountArgs) -> i32 {
    init_logging();
    let shutdown = shutdown_signal();
    if let Err(e) = tidemark_fuse::check_mountpoint(&a.mountpoint) {
        return fail(2, e);
    }
    let filer = match HttpFiler::new(&a.filer, a.token.clone()) {
        Ok(f) if a.no_filer_socket => f,
        Ok(f) => f.through_socket().await,
        Err(e) => return fail(2, e),
    };
    let through = filer.socket_path().map(|p| format!(" (through its socket {p})")).unwrap_or_default();
    let filer: Arc<dyn Filer> = Arc::new(filer);
    let (report_tx, report_rx) = tokio::sync::mpsc::channel(4);
    #[cfg(unix)]
    if let Ok(mut usr1) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1()) {
        tokio::spawn(async move {
            while usr1.recv().await.is_some() {
                let _ = report_tx.send(()).await;
            }
        });
    }
    let args = tidemark_fuse::MountArgs {
        mountpoint: a.mountpoint.clone(),
        root: a.root,
        read_only: a.read_only,
        allow_other: a.allow_other,
        ttl: std::time::Duration::from_secs(a.attr_ttl),
        timeout: std::time::Duration::from_secs(a.timeout.max(1)),
        passthrough: !a.no_passthrough,
        unsaved_dir: a.unsaved_dir.clone().unwrap_or_else(tidemark_fuse::default_unsaved_dir),
    };
    println!("tidemark mount: {} of filer {}{through} on {}", args.root, a.filer, a.mountpoint.display());
    match tidemark_fuse::mount(filer, args, shutdown, report_rx).await {
        Ok(()) => 0,
        Err(e) => fail(1, e),
    }
}

pub async fn run_admin(a: AdminArgs) -> i32 {
    init_logging();
    let shutdown = shutdown_signal();
    if let Err(e) = tidemark_admin::check_bind(a.addr, a.token.as_deref()) {
        return fail(2, e);
    }
    let prices = match request_prices(a.request_prices.as_deref()) {
        Ok(p) => p,
        Err(e) => return fail(2, e),
    };
    let tls = match a.tls.acceptor(&[a.addr]) {
        Ok(t) => t,
        Err(e) => return fail(2, e),
    };
    let filer: Arc<dyn Filer> = match HttpFiler::new(&a.filer, a.token.clone()) {
        Ok(f) => Arc::new(f),
        Err(e) => return fail(2, e),
    };
    if let Err(e) = filer.health().await {
        tracing::warn!(filer = %a.filer, error = %e, "the filer is not reachable yet; the admin retries");
    }
    let (listener, bound) = match bind(a.addr, "admin").await {
        Ok(l) => l,
        Err(e) => return fail(1, e),
    };
    let scheme = a.tls.scheme();
    println!(
        "tidemark admin listening on {scheme}://{bound} (Admin UI: {scheme}://{bound}/subscriptions; filer {})",
        a.filer
    );
    let config = tidemark_admin::AdminConfig {
        filer_label: a.filer.clone(),
        scheduler: tidemark_admin::SchedulerConfig {
            worker_timeout: std::time::Duration::from_secs(a.worker_timeout.max(1)),
            ..Default::default()
        },
        advertise: a.advertise.clone().unwrap_or_else(|| format!("{scheme}://{bound}")),
        lease_ttl: std::time::Duration::from_secs(a.lease_ttl),
        prices,
        ..Default::default()
    };
    let admin = tidemark_admin::Admin::new(filer, config);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let leadership = tokio::spawn(admin.clone().run_leadership(stop_rx.clone()));
    let detection = tokio::spawn(admin.clone().run_detection(stop_rx.clone()));
    let served = tidemark_admin::serve_tls(listener, admin, a.token, a.cluster_token, tls, stopped(stop_rx)).await;
    let _ = detection.await;
    let _ = leadership.await;
    match served {
        Ok(()) => 0,
        Err(e) => fail(1, format!("the admin stopped: {e}")),
    }
}

pub async fn run_worker(a: WorkerArgs) -> i32 {
    init_logging();
    let shutdown = shutdown_signal();
    let filer: Arc<dyn Filer> = match own_filer(&a.filer, a.token.clone()).await {
        Ok(f) => f,
        Err(e) => return fail(2, e),
    };
    let client = match tidemark_worker::AdminClient::new(&a.admin, a.token.clone()) {
        Ok(c) => c,
        Err(e) => return fail(2, e),
    };
    let local_roots = match a.local.roots() {
        Ok(r) => r,
        Err(e) => return fail(2, e),
    };
    let config = worker_config(a.id, &a.slices, local_roots);
    tracing::info!(worker = %config.worker_id, admin = %a.admin, filer = %a.filer, max_execute = config.max_execute, "worker starting");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    tidemark_worker::Worker::new(client, filer, config).run(stop_rx).await;
    0
}

pub async fn run_shell(a: ShellArgs) -> i32 {
    let filer = match HttpFiler::new(&a.filer, a.token.clone()) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let admin = Some(shell::AdminRef { addr: a.admin, token: a.token.clone() });
    shell::main(shell::Context { filer: Arc::new(filer.clone()), admin, http: Some(filer) }, a.command).await
}

//! The PostgreSQL `MetaStore`: the shared store for several filers (and so many workers) on one
//! database.
//!
//! - Every mutation is one SQL transaction that first locks the sequence counter's row
//!   (`SELECT ... FOR UPDATE`). That lock serialises all mutations of all filers, exactly as the
//!   SQLite writer does for one: the fence check, the precondition, the writes and the change-log
//!   records see the latest committed state and commit together. Sequence numbers are handed out
//!   under the lock and committed in order, so the change log is dense and totally ordered: a
//!   reader never sees record N+1 before N, whichever filer wrote them.
//! - "Now" is the database's clock (`clock_timestamp()`), read under the lock: leases expire by
//!   one clock for every filer, however far the filers' own clocks drift.
//! - Paths are `TEXT COLLATE "C"`, which compares bytes: listings and scans are in byte order
//!   (the order of an object-store LIST) whatever the database's default collation.
//! - Commits `NOTIFY tidemark_changes` with the new sequence number; every handle keeps one
//!   connection `LISTEN`ing (and polls the counter as a backstop), so a change-log follower on
//!   one filer wakes for commits made through another.
//! - Migrations are numbered, recorded in `tidemark_schema`, and run at connect under an advisory
//!   lock, so filers starting together migrate once.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures::StreamExt;
use tokio::sync::watch;
use tokio_postgres::error::SqlState;
use tokio_postgres::{AsyncMessage, NoTls, Row};

use tidemark_core::cache::{CacheUsage, CachedChunk};
use tidemark_core::model::{Applied, ChangeRecord, Entry, Fence, Lease, Origin, Page, Txn, TxnBatch};
use tidemark_core::{Error, MetaStore, Result, path};

use crate::txn::{self, Change, TxnOps, json_err, parent_of, row_to_entry};

/// The schema, one migration per version; `tidemark_schema` records which have run.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE entries (
    path    TEXT COLLATE "C" PRIMARY KEY,
    parent  TEXT COLLATE "C" NOT NULL,
    version BIGINT NOT NULL,
    meta    TEXT NOT NULL,
    data    BYTEA
);
CREATE INDEX entries_by_parent ON entries (parent, path);
CREATE TABLE leases (
    name          TEXT PRIMARY KEY,
    holder        TEXT NOT NULL,
    generation    BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL
);
CREATE TABLE changelog (
    seq    BIGINT PRIMARY KEY,
    ts_ms  BIGINT NOT NULL,
    path   TEXT NOT NULL,
    origin TEXT NOT NULL,
    old    TEXT,
    new    TEXT
);
-- The sequence counter lives apart from the change log so that trimming the log can never make
-- a sequence number (and so an entry version) be handed out twice. Its row is also the lock
-- that serialises every mutation.
CREATE TABLE counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL);
INSERT INTO counters (name, value) VALUES ('seq', 0);
"#,
    r#"
-- The content cache: which chunks of which remote version each filer holds (bytes in its data
-- directory). Keyed by path first, so a write drops a path's records with one range delete.
CREATE TABLE cache_chunks (
    path         TEXT COLLATE "C" NOT NULL,
    node         TEXT NOT NULL,
    chunk        BIGINT NOT NULL,
    content_id   TEXT NOT NULL,
    len          BIGINT NOT NULL,
    last_read_ms BIGINT NOT NULL,
    PRIMARY KEY (path, node, chunk)
);
CREATE INDEX cache_chunks_lru ON cache_chunks (node, last_read_ms);
CREATE INDEX cache_chunks_by_node ON cache_chunks (node, path, chunk);
"#,
    r#"
-- On the record removing an entry a rename moved: where it went.
ALTER TABLE changelog ADD COLUMN moved_to TEXT;
"#,
];

/// Any fixed number: the advisory lock migrations hold, so concurrent starts migrate once.
const MIGRATION_LOCK: i64 = 0x7469_6465_6d61_726b;
const CHANNEL: &str = "tidemark_changes";
const POOL_SIZE: usize = 16;
/// How often the listener reads the counter even without a notification (a backstop).
const POLL_EVERY: Duration = Duration::from_secs(5);
const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::int8";

pub struct PgStore {
    /// The connections, the commit notifications, and the mutations waiting for their group
    /// commit.
    writer: Arc<Writer>,
    listener: tokio::task::JoinHandle<()>,
}

impl Drop for PgStore {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

/// Where a config points, for messages: `host:port/dbname`.
fn describe(config: &tokio_postgres::Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(s) => s.clone(),
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".into());
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}/{}", config.get_dbname().or(config.get_user()).unwrap_or("postgres"))
}

/// The server's message for a database error, the error and its cause otherwise.
fn detail(e: &tokio_postgres::Error) -> String {
    match (e.as_db_error(), std::error::Error::source(e)) {
        (Some(db), _) => db.message().to_string(),
        (None, Some(cause)) => format!("{e}: {cause}"),
        (None, None) => e.to_string(),
    }
}

fn pg_err(e: tokio_postgres::Error) -> Error {
    if let Some(db) = e.as_db_error() {
        let code = db.code();
        let transient = [
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::TOO_MANY_CONNECTIONS,
            SqlState::QUERY_CANCELED,
        ];
        let message = format!("postgres: {} ({})", db.message(), code.code());
        return if transient.contains(code) { Error::Unavailable { message } } else { Error::Internal { message } };
    }
    if e.is_closed() || std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>()) {
        return Error::Unavailable { message: format!("postgres: the connection failed: {}", detail(&e)) };
    }
    Error::Internal { message: format!("postgres: {}", detail(&e)) }
}

impl PgStore {
    /// Connects to `url` (`postgres://user:password@host:port/dbname?options`), checks the
    /// database, and runs pending migrations. With `sslmode=require` the connection is TLS and
    /// the server's certificate is verified against the system's CAs.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, None).await
    }

    /// [`connect`](Self::connect), verifying a TLS server with `tls` (trusting a private CA)
    /// instead of the system's CAs.
    pub async fn connect_with(url: &str, tls: Option<rustls::ClientConfig>) -> Result<Self> {
        // Every TLS connection here verifies the certificate and the host name (libpq's
        // verify-full); libpq's names for that are accepted and mean the same.
        let url = url.replace("sslmode=verify-full", "sslmode=require").replace("sslmode=verify-ca", "sslmode=require");
        let mut config = tokio_postgres::Config::from_str(&url).map_err(|e| {
            Error::invalid_argument(format!(
                "--store {:?} is not a PostgreSQL URL ({e}); expected postgres://USER:PASSWORD@HOST:PORT/DBNAME",
                redact(&url)
            ))
        })?;
        // Statements are prepared once per connection, and after a few runs PostgreSQL may plan
        // them once for any parameter ("generic"), using the statistics of the moment. Planned
        // while the namespace was empty, `path = ANY($1)` became a sequential scan that a
        // growing table made slower with every batch (28 ms for 100 paths at 10,000 entries).
        // Each execution planned for its parameters costs microseconds and stays an index scan.
        let options = format!("{} -c plan_cache_mode=force_custom_plan", config.get_options().unwrap_or(""));
        config.options(options.trim());
        let label = describe(&config);
        // TLS when asked for (sslmode=require); otherwise plain, as libpq's `prefer` ends up
        // with a server that has no certificate configured.
        let tls = if config.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
            let client = match tls {
                Some(c) => c,
                None => platform_tls().map_err(|e| {
                    Error::invalid_argument(format!(
                        "sslmode=require: cannot load the system's CAs ({e}); pass --tls-ca"
                    ))
                })?,
            };
            Tls::Rustls(tokio_postgres_rustls::MakeRustlsConnect::new(client))
        } else {
            Tls::Off
        };
        let recycling = ManagerConfig { recycling_method: RecyclingMethod::Fast };
        let manager = match &tls {
            Tls::Off => Manager::from_config(config.clone(), NoTls, recycling),
            Tls::Rustls(c) => Manager::from_config(config.clone(), c.clone(), recycling),
        };
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(30)))
            .create_timeout(Some(Duration::from_secs(10)))
            .build()
            .map_err(|e| Error::internal(format!("postgres pool: {e}")))?;
        let client = pool.get().await.map_err(|e| {
            let why = match &e {
                deadpool_postgres::PoolError::Backend(e) => detail(e),
                other => other.to_string(),
            };
            Error::Unavailable {
                message: format!(
                    "cannot connect to PostgreSQL at {label}: {why}; is it running, and may this user connect?"
                ),
            }
        })?;
        let encoding: String = client.query_one("SHOW server_encoding", &[]).await.map_err(pg_err)?.get(0);
        if encoding != "UTF8" {
            return Err(Error::invalid_argument(format!(
                "the database {label} has encoding {encoding}; Tidemark needs UTF8 (CREATE DATABASE ... ENCODING 'UTF8')"
            )));
        }
        drop(client);
        migrate(&pool, &label).await?;
        let last = read_seq(&**pool.get().await.map_err(|e| pool_err(&label, e))?).await?;
        let seq_tx = Arc::new(watch::channel(last).0);
        let listener = tokio::spawn(listen(config, tls, seq_tx.clone(), label.clone()));
        let writer = Arc::new(Writer { pool, label, seq_tx, pending: Default::default(), turn: Default::default() });
        Ok(PgStore { writer, listener })
    }

    async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.writer.pool.get().await.map_err(|e| pool_err(&self.writer.label, e))
    }

    /// Runs `op` in the next group commit; returns once the group committed (or failed).
    async fn submit(&self, op: Op) -> Result<Done> {
        let (reply, done) = tokio::sync::oneshot::channel();
        self.writer.pending.lock().unwrap_or_else(|p| p.into_inner()).push(Waiting { op, reply });
        tokio::spawn(self.writer.clone().commit_pending());
        done.await.map_err(|_| Error::internal("store task failed: the mutation was dropped unfinished"))?
    }
}

/// The mutations of every caller of one `PgStore`, committed in groups: whoever finds mutations
/// waiting takes its turn and commits all of them (up to [`MAX_GROUP`]) as one transaction — one
/// acquisition of the store-wide lock, one WAL flush — each mutation checking and failing on its
/// own, as SQLite's group commit does. A group is committed by a task of its own, so a caller
/// that gives up cuts off no one else's mutation.
struct Writer {
    pool: Pool,
    /// `host:port/dbname` for messages (never the password).
    label: String,
    seq_tx: Arc<watch::Sender<u64>>,
    pending: std::sync::Mutex<Vec<Waiting>>,
    turn: tokio::sync::Mutex<()>,
}

/// The most mutations one group commit takes; more wait for the next group.
const MAX_GROUP: usize = 256;

/// A mutation and where its result goes.
struct Waiting {
    op: Op,
    reply: tokio::sync::oneshot::Sender<Result<Done>>,
}

/// The mutations of the store, as values, so that one task can run other callers' in its
/// transaction.
enum Op {
    Apply(Box<Txn>),
    ApplyMany(TxnBatch),
    LeaseAcquire { name: String, holder: String, ttl_ms: i64 },
    LeaseRenew { fence: Fence, ttl_ms: i64 },
    LeaseRelease { fence: Fence },
    CacheRecord(CachedChunk),
}

enum Done {
    Applied(Box<Applied>),
    Many(Vec<Result<Applied>>),
    Lease(Lease),
    Released,
    Recorded(bool),
}

impl Op {
    /// The entries it will read: read ahead, under the lock, with the group's.
    fn reads(&self) -> Vec<String> {
        match self {
            Op::Apply(t) => owned(txn::reads_of(std::slice::from_ref(&**t))),
            Op::ApplyMany(b) => owned(txn::reads_of(&b.txns)),
            _ => Vec::new(),
        }
    }

    async fn run(self, ops: &mut PgTxn<'_>, now: i64) -> Result<Done> {
        match self {
            Op::Apply(t) => txn::apply(ops, *t, now).await.map(|a| Done::Applied(Box::new(a))),
            Op::ApplyMany(b) => txn::apply_many(ops, b, now).await.map(Done::Many),
            Op::LeaseAcquire { name, holder, ttl_ms } => {
                txn::lease_acquire(ops, &name, &holder, ttl_ms, now).await.map(Done::Lease)
            }
            Op::LeaseRenew { fence, ttl_ms } => txn::lease_renew(ops, &fence, ttl_ms, now).await.map(Done::Lease),
            Op::LeaseRelease { fence } => txn::lease_release(ops, &fence).await.map(|()| Done::Released),
            Op::CacheRecord(chunk) => txn::cache_record(ops, &chunk).await.map(Done::Recorded),
        }
    }
}

impl Writer {
    /// Commits every mutation waiting, in groups, when it is this task's turn. Called once per
    /// mutation after it was queued, so none waits without a task to commit it; a call that
    /// finds the queue empty (an earlier group took its mutation) returns at once.
    async fn commit_pending(self: Arc<Self>) {
        let _turn = self.turn.lock().await;
        loop {
            let group: Vec<Waiting> = {
                let mut q = self.pending.lock().unwrap_or_else(|p| p.into_inner());
                let n = q.len().min(MAX_GROUP);
                q.drain(..n).collect()
            };
            if group.is_empty() {
                return;
            }
            let ahead: Vec<String> = group.iter().flat_map(|w| w.op.reads()).collect();
            let (ops, replies): (Vec<Op>, Vec<_>) = group.into_iter().map(|w| (w.op, w.reply)).unzip();
            let outcome = self
                .write(&ahead, async move |txn, now| {
                    let mut outs = Vec::with_capacity(ops.len());
                    for op in ops {
                        // A mutation's own failure is its result: every check comes before its
                        // first write, so it left nothing. A failure of the store ends the group.
                        match op.run(txn, now).await {
                            Err(e) if txn::is_store_failure(&e) => return Err(e),
                            r => outs.push(r),
                        }
                    }
                    Ok(outs)
                })
                .await;
            match outcome {
                Ok(outs) => {
                    for (reply, out) in replies.into_iter().zip(outs) {
                        // The caller may have gone; the mutation stands either way.
                        let _ = reply.send(out);
                    }
                }
                Err(e) => {
                    for reply in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    /// Runs `f` in one transaction holding the store-wide write lock; stores the sequence counter
    /// back (notifying listeners) and commits only if `f` succeeds.
    ///
    /// The transaction is driven by hand rather than through the driver's `Transaction`, so that
    /// BEGIN goes out with the lock and COMMIT with the last writes: one round trip each way
    /// instead of three, and the lock — which every filer's writes queue for — is held for
    /// the reads and the commit only.
    async fn write<T, F>(&self, ahead: &[String], f: F) -> Result<T>
    where
        F: AsyncFnOnce(&mut PgTxn<'_>, i64) -> Result<T>,
    {
        let open = OpenTxn(Some(self.pool.get().await.map_err(|e| pool_err(&self.label, e))?));
        let c = open.client();
        // Prepared once per connection: an unprepared query costs a second round trip.
        let lock = c
            .prepare_cached(&format!("SELECT value, {NOW_MS} FROM counters WHERE name = 'seq' FOR UPDATE"))
            .await
            .map_err(pg_err)?;
        let read = c.prepare_cached(SELECT_ENTRIES).await.map_err(pg_err)?;
        // BEGIN, the lock and the entries the mutation will read go out together, pipelined:
        // the server runs them in order, so the read sees everything committed before the lock.
        let mut ahead: Vec<&str> = ahead.iter().map(String::as_str).collect();
        ahead.sort_unstable();
        ahead.dedup();
        let (begun, row, rows) = futures::join!(c.batch_execute("BEGIN"), c.query_one(&lock, &[]), async {
            if ahead.is_empty() { Ok(Vec::new()) } else { c.query(&read, &[&ahead]).await }
        });
        begun.map_err(pg_err)?;
        let (row, rows) = (row.map_err(pg_err)?, rows.map_err(pg_err)?);
        let (start, now): (i64, i64) = (row.get(0), row.get(1));
        let mut ops = PgTxn::new(c, start as u64);
        ops.remember(&ahead, entries_of(&rows)?);
        let out = match f(&mut ops, now).await {
            Ok(out) => out,
            Err(e) => {
                // A failure of the store (a mutation's own refusal is its result, not this):
                // rolled back, the connection goes back to the pool; if even that fails, `open`
                // closes it.
                if c.batch_execute("ROLLBACK").await.is_ok() {
                    open.release();
                }
                return Err(e);
            }
        };
        let seq = ops.seq;
        ops.finish(start).await?;
        open.release();
        advance(&self.seq_tx, seq);
        Ok(out)
    }
}

/// A pooled connection with a transaction open on it. Dropped before [`OpenTxn::release`] — an
/// error on the way, a caller that gave up — it closes the connection instead of returning it
/// to the pool, and the server rolls the transaction back.
struct OpenTxn(Option<deadpool_postgres::Object>);

impl OpenTxn {
    fn client(&self) -> &deadpool_postgres::ClientWrapper {
        self.0.as_ref().expect("an open transaction has its connection")
    }

    /// The transaction ended (committed or rolled back): the connection may be reused.
    fn release(mut self) {
        self.0.take();
    }
}

impl Drop for OpenTxn {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            drop(deadpool_postgres::Object::take(c));
        }
    }
}

/// A group commit answered a mutation with another kind's result: a bug here, not the caller's.
fn unexpected() -> Error {
    Error::internal("the store answered a mutation with the result of another kind")
}

fn owned(paths: Vec<&str>) -> Vec<String> {
    paths.into_iter().map(str::to_string).collect()
}

fn pool_err(label: &str, e: deadpool_postgres::PoolError) -> Error {
    match e {
        deadpool_postgres::PoolError::Backend(e) => pg_err(e),
        other => Error::Unavailable { message: format!("postgres at {label}: {other}") },
    }
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            match userinfo.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &userinfo[..c], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

fn advance(tx: &watch::Sender<u64>, seq: u64) {
    tx.send_if_modified(|cur| {
        let newer = seq > *cur;
        if newer {
            *cur = seq;
        }
        newer
    });
}

async fn migrate(pool: &Pool, label: &str) -> Result<()> {
    let mut client = pool.get().await.map_err(|e| pool_err(label, e))?;
    let tx = client.transaction().await.map_err(pg_err)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await.map_err(pg_err)?;
    // "relation tidemark_schema already exists, skipping" on every start is noise in the log.
    tx.batch_execute("SET LOCAL client_min_messages = warning").await.map_err(pg_err)?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS tidemark_schema (version INT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")
        .await
        .map_err(pg_err)?;
    let version: i32 =
        tx.query_one("SELECT COALESCE(max(version), 0) FROM tidemark_schema", &[]).await.map_err(pg_err)?.get(0);
    let version = version as usize;
    if version > MIGRATIONS.len() {
        return Err(Error::internal(format!(
            "the database {label} was written by a newer Tidemark (schema version {version}, this one knows {}); upgrade the binary",
            MIGRATIONS.len()
        )));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version) {
        tx.batch_execute(sql).await.map_err(pg_err)?;
        if i == 0 {
            let now: i64 = tx.query_one(&format!("SELECT {NOW_MS}"), &[]).await.map_err(pg_err)?.get(0);
            let root = txn::root_entry(now);
            let meta = serde_json::to_string(&root).map_err(json_err)?;
            tx.execute(
                "INSERT INTO entries (path, parent, version, meta) VALUES ($1, $2, $3, $4)",
                &[&root.path, &parent_of(&root.path), &(root.version as i64), &meta],
            )
            .await
            .map_err(pg_err)?;
        }
        tx.execute("INSERT INTO tidemark_schema (version) VALUES ($1)", &[&((i + 1) as i32)]).await.map_err(pg_err)?;
        tracing::info!(database = %label, version = i + 1, "postgres store: migrated");
    }
    tx.commit().await.map_err(pg_err)
}

async fn read_seq(c: &tokio_postgres::Client) -> Result<u64> {
    let v: i64 = c.query_one("SELECT value FROM counters WHERE name = 'seq'", &[]).await.map_err(pg_err)?.get(0);
    Ok(v as u64)
}

/// How the store's connections speak to PostgreSQL.
#[derive(Clone)]
enum Tls {
    Off,
    Rustls(tokio_postgres_rustls::MakeRustlsConnect),
}

/// Verification against the system's CAs.
fn platform_tls() -> std::result::Result<rustls::ClientConfig, rustls::Error> {
    use rustls_platform_verifier::BuilderVerifierExt;
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_platform_verifier()?
        .with_no_client_auth())
}

type Listening = (tokio_postgres::Client, tokio::task::JoinHandle<()>, tokio::sync::mpsc::UnboundedReceiver<u64>);

/// A connection whose notifications arrive on the returned channel (its driver task feeds it).
async fn connect_listening(
    config: &tokio_postgres::Config,
    tls: &Tls,
) -> std::result::Result<Listening, tokio_postgres::Error> {
    fn drive<S, T>(
        mut connection: tokio_postgres::Connection<S, T>,
    ) -> (tokio::task::JoinHandle<()>, tokio::sync::mpsc::UnboundedReceiver<u64>)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (ntx, nrx) = tokio::sync::mpsc::unbounded_channel::<u64>();
        let driver = tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(m)) = messages.next().await {
                if let AsyncMessage::Notification(n) = m
                    && let Ok(seq) = n.payload().parse()
                    && ntx.send(seq).is_err()
                {
                    return;
                }
            }
        });
        (driver, nrx)
    }
    match tls {
        Tls::Off => {
            let (client, connection) = config.connect(NoTls).await?;
            let (driver, nrx) = drive(connection);
            Ok((client, driver, nrx))
        }
        Tls::Rustls(c) => {
            let (client, connection) = config.connect(c.clone()).await?;
            let (driver, nrx) = drive(connection);
            Ok((client, driver, nrx))
        }
    }
}

/// Keeps one connection listening for commits of every filer on the database and moves `seq_tx`
/// forward; reconnects (with a pause) when the connection fails, catching up from the counter.
async fn listen(config: tokio_postgres::Config, tls: Tls, seq_tx: Arc<watch::Sender<u64>>, label: String) {
    let mut pause = Duration::from_millis(200);
    loop {
        match connect_listening(&config, &tls).await {
            Ok((client, driver, mut nrx)) => {
                if let Err(e) = client.batch_execute(&format!("LISTEN {CHANNEL}")).await {
                    tracing::warn!(database = %label, error = %e, "postgres store: cannot LISTEN; retrying");
                } else {
                    pause = Duration::from_millis(200);
                    loop {
                        // After (re)connecting and every POLL_EVERY: commits we were not told of.
                        match read_seq(&client).await {
                            Ok(seq) => advance(&seq_tx, seq),
                            Err(e) => {
                                tracing::warn!(database = %label, error = %e, "postgres store: listener lost its connection");
                                break;
                            }
                        }
                        let deadline = tokio::time::sleep(POLL_EVERY);
                        tokio::pin!(deadline);
                        loop {
                            tokio::select! {
                                n = nrx.recv() => match n {
                                    Some(seq) => advance(&seq_tx, seq),
                                    None => break,
                                },
                                _ = &mut deadline => break,
                            }
                        }
                        if nrx.is_closed() && nrx.is_empty() {
                            break;
                        }
                    }
                }
                driver.abort();
            }
            Err(e) => {
                tracing::warn!(database = %label, error = %e, "postgres store: listener cannot connect; retrying")
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(10));
    }
}

fn entry_of(row: &Row) -> Result<Entry> {
    row_to_entry(row.get(0), row.get(1), row.get::<_, &str>(2))
}

fn entries_of(rows: &[Row]) -> Result<Vec<Entry>> {
    rows.iter().map(entry_of).collect()
}

fn lease_of(row: &Row) -> Lease {
    Lease { name: row.get(0), holder: row.get(1), generation: row.get::<_, i64>(2) as u64, expires_at_ms: row.get(3) }
}

const SELECT_ENTRY: &str = "SELECT path, version, meta FROM entries WHERE path = $1";
const SELECT_ENTRIES: &str = "SELECT path, version, meta FROM entries WHERE path = ANY($1)";
/// Entry rows, each path at most once (held by path), as ON CONFLICT requires.
const PUT_ROWS: &str = "INSERT INTO entries (path, parent, version, meta, data)
     SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[], $5::bytea[])
     ON CONFLICT (path) DO UPDATE SET version = excluded.version, meta = excluded.meta, data = excluded.data";
/// Rows the transaction read as absent, under the lock: a plain insert, without the speculative
/// insertion ON CONFLICT costs.
const INSERT_ROWS: &str = "INSERT INTO entries (path, parent, version, meta, data)
     SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[], $5::bytea[])";
const DELETE_ROWS: &str = "DELETE FROM entries WHERE path = ANY($1)";
const DROP_CACHES: &str = "DELETE FROM cache_chunks WHERE path = ANY($1)";
const STORE_SEQ: &str = "WITH u AS (UPDATE counters SET value = $1 WHERE name = 'seq' RETURNING value)
     SELECT pg_notify('tidemark_changes', value::text) FROM u";
const LOG_CHANGES: &str = "INSERT INTO changelog (seq, ts_ms, path, origin, old, new, moved_to)
     SELECT * FROM unnest($1::int8[], $2::int8[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[])";
const SELECT_BELOW: &str =
    "SELECT path, version, meta FROM entries WHERE path > $1 AND path < $2 ORDER BY path LIMIT $3";
const SELECT_LEASE: &str = "SELECT name, holder, generation, expires_at_ms FROM leases WHERE name = $1";

/// A change-log record waiting for the end of its transaction.
struct LogRow {
    seq: i64,
    ts_ms: i64,
    path: String,
    origin: &'static str,
    old: Option<String>,
    new: Option<String>,
    moved_to: Option<String>,
}

/// The writes a transaction holds, as they go out.
#[derive(Default)]
struct Held {
    /// Rows the database does not have.
    inserts: Vec<(String, RowOut)>,
    upserts: Vec<(String, RowOut)>,
    deletes: Vec<String>,
    /// Paths whose cache records go.
    drops: Vec<String>,
}

/// An entry row waiting for the end of its transaction (`None` in [`PgTxn::rows_out`]: deleted).
struct RowOut {
    parent: String,
    version: i64,
    meta: String,
    data: Option<Vec<u8>>,
}

/// The shared transaction logic's row operations on an open PostgreSQL transaction, with as few
/// round trips as the logic allows — each is a wait under the store-wide lock:
/// - rows read or written are remembered (`known`), so a batch's entries and their ancestors
///   are read in one query up front and never again;
/// - entry writes, cache-record drops and change-log records are held until the transaction
///   ends and sent together, pipelined ([`PgTxn::finish`]), or before any query whose answer
///   they could change (a range read, inline bytes, a cache record).
struct PgTxn<'t> {
    tx: &'t deadpool_postgres::ClientWrapper,
    seq: u64,
    log: Vec<LogRow>,
    known: HashMap<String, Option<Entry>>,
    rows_out: HashMap<String, Option<RowOut>>,
    /// Held paths whose row the database does not have: their put is a plain INSERT.
    fresh: std::collections::HashSet<String>,
    cache_drops: Vec<String>,
}

impl<'t> PgTxn<'t> {
    fn new(tx: &'t deadpool_postgres::ClientWrapper, seq: u64) -> Self {
        PgTxn {
            tx,
            seq,
            log: Vec::new(),
            known: HashMap::new(),
            rows_out: HashMap::new(),
            fresh: Default::default(),
            cache_drops: Vec::new(),
        }
    }

    async fn rows(&self, sql: &str, params: &[&(dyn tokio_postgres::types::ToSql + Sync)]) -> Result<Vec<Row>> {
        let stmt = self.tx.prepare_cached(sql).await.map_err(pg_err)?;
        self.tx.query(&stmt, params).await.map_err(pg_err)
    }

    /// Reads the entries of `paths` not known yet, in one query, and remembers them (and that
    /// the others are absent).
    async fn load(&mut self, paths: &[&str]) -> Result<()> {
        let mut unknown: Vec<&str> = paths.iter().copied().filter(|p| !self.known.contains_key(*p)).collect();
        unknown.sort_unstable();
        unknown.dedup();
        if unknown.is_empty() {
            return Ok(());
        }
        let found = entries_of(&self.rows(SELECT_ENTRIES, &[&unknown]).await?)?;
        self.remember(&unknown, found);
        Ok(())
    }

    /// Remembers the answer to a read of `asked`: `found`, and that the rest are absent.
    fn remember(&mut self, asked: &[&str], found: Vec<Entry>) {
        for p in asked {
            self.known.insert(p.to_string(), None);
        }
        for e in found {
            self.known.insert(e.path.clone(), Some(e));
        }
    }

    /// Sends the held entry writes and cache drops (not the change log), pipelined.
    async fn flush(&mut self) -> Result<()> {
        let h = self.take_held();
        self.send_held(&h).await
    }

    /// The held writes, pipelined: each statement goes out when first polled, in this order.
    async fn send_held(&self, h: &Held) -> Result<()> {
        let (a, b, c, d) = futures::join!(
            self.put_rows(INSERT_ROWS, &h.inserts),
            self.put_rows(PUT_ROWS, &h.upserts),
            self.delete_rows(&h.deletes),
            self.drop_caches(&h.drops)
        );
        a.and(b).and(c).and(d)
    }

    fn take_held(&mut self) -> Held {
        let mut held = Held::default();
        for (p, row) in self.rows_out.drain() {
            let fresh = self.fresh.contains(&p);
            match row {
                Some(r) if fresh => held.inserts.push((p, r)),
                Some(r) => held.upserts.push((p, r)),
                None if fresh => {}
                None => held.deletes.push(p),
            }
        }
        self.fresh.clear();
        held.drops = std::mem::take(&mut self.cache_drops);
        held
    }

    /// Whether the database lacks the row of `p`: what it was before the first held write of
    /// `p`, which `known` says (read under the lock) when nothing of `p` is held yet.
    fn mark_fresh(&mut self, p: &str) {
        if !self.rows_out.contains_key(p) && matches!(self.known.get(p), Some(None)) {
            self.fresh.insert(p.to_string());
        }
    }

    async fn put_rows(&self, sql: &str, puts: &[(String, RowOut)]) -> Result<()> {
        if puts.is_empty() {
            return Ok(());
        }
        let paths: Vec<&str> = puts.iter().map(|(p, _)| p.as_str()).collect();
        let parents: Vec<&str> = puts.iter().map(|(_, r)| r.parent.as_str()).collect();
        let versions: Vec<i64> = puts.iter().map(|(_, r)| r.version).collect();
        let metas: Vec<&str> = puts.iter().map(|(_, r)| r.meta.as_str()).collect();
        let datas: Vec<Option<&[u8]>> = puts.iter().map(|(_, r)| r.data.as_deref()).collect();
        self.rows(sql, &[&paths, &parents, &versions, &metas, &datas]).await.map(drop)
    }

    async fn delete_rows(&self, paths: &[String]) -> Result<()> {
        if paths.is_empty() {
            return Ok(());
        }
        self.rows(DELETE_ROWS, &[&paths]).await.map(drop)
    }

    async fn drop_caches(&self, paths: &[String]) -> Result<()> {
        if paths.is_empty() {
            return Ok(());
        }
        self.rows(DROP_CACHES, &[&paths]).await.map(drop)
    }

    /// Sends everything held, stores the sequence counter (notifying listeners) and commits, in
    /// one pipelined round trip: tokio-postgres pipelines statements polled at once on one
    /// connection, and the server runs them in order. If any statement fails the transaction is
    /// aborted, and the COMMIT behind it rolls it back.
    async fn finish(&mut self, start: i64) -> Result<()> {
        let h = self.take_held();
        let log = std::mem::take(&mut self.log);
        let seq = self.seq as i64;
        // Every statement prepared first: a statement still being prepared would be sent after
        // the COMMIT below, and run outside the transaction.
        for sql in [INSERT_ROWS, PUT_ROWS, DELETE_ROWS, DROP_CACHES, STORE_SEQ, LOG_CHANGES] {
            self.tx.prepare_cached(sql).await.map_err(pg_err)?;
        }
        let counter = async {
            if seq == start && log.is_empty() {
                return Ok(());
            }
            self.rows(STORE_SEQ, &[&seq]).await.map(drop)
        };
        let records = async {
            if log.is_empty() {
                return Ok(());
            }
            let seqs: Vec<i64> = log.iter().map(|r| r.seq).collect();
            let ts: Vec<i64> = log.iter().map(|r| r.ts_ms).collect();
            let paths: Vec<&str> = log.iter().map(|r| r.path.as_str()).collect();
            let origins: Vec<&str> = log.iter().map(|r| r.origin).collect();
            let olds: Vec<Option<&str>> = log.iter().map(|r| r.old.as_deref()).collect();
            let news: Vec<Option<&str>> = log.iter().map(|r| r.new.as_deref()).collect();
            let moves: Vec<Option<&str>> = log.iter().map(|r| r.moved_to.as_deref()).collect();
            self.rows(LOG_CHANGES, &[&seqs, &ts, &paths, &origins, &olds, &news, &moves]).await.map(drop)
        };
        let (held, logged, counted, commit) =
            futures::join!(self.send_held(&h), records, counter, self.tx.batch_execute("COMMIT"));
        held.and(logged).and(counted).and(commit.map_err(pg_err))
    }
}

impl TxnOps for PgTxn<'_> {
    async fn prefetch(&mut self, paths: &[&str]) -> Result<()> {
        self.load(paths).await
    }

    async fn entry(&mut self, p: &str) -> Result<Option<Entry>> {
        self.load(&[p]).await?;
        Ok(self.known.get(p).cloned().flatten())
    }

    async fn entries(&mut self, paths: &[&str]) -> Result<Vec<Entry>> {
        self.load(paths).await?;
        Ok(paths.iter().filter_map(|p| self.known.get(*p).cloned().flatten()).collect())
    }

    async fn descendants(&mut self, dir: &str, limit: Option<i64>) -> Result<Vec<Entry>> {
        self.flush().await?;
        let (lo, hi) = path::scan_bounds(dir, "");
        entries_of(&self.rows(SELECT_BELOW, &[&lo, &hi, &limit.unwrap_or(i64::MAX)]).await?)
    }

    async fn inline_data(&mut self, p: &str) -> Result<Option<Vec<u8>>> {
        if let Some(Some(row)) = self.rows_out.get(p) {
            return Ok(row.data.clone());
        }
        self.flush().await?;
        let rows = self.rows("SELECT data FROM entries WHERE path = $1", &[&p]).await?;
        Ok(rows.first().and_then(|r| r.get::<_, Option<Vec<u8>>>(0)))
    }

    async fn inline_data_many(&mut self, paths: &[&str]) -> Result<std::collections::HashMap<String, Vec<u8>>> {
        if paths.is_empty() {
            return Ok(Default::default());
        }
        self.flush().await?;
        let rows =
            self.rows("SELECT path, data FROM entries WHERE path = ANY($1) AND data IS NOT NULL", &[&paths]).await?;
        Ok(rows.iter().map(|r| (r.get::<_, String>(0), r.get::<_, Vec<u8>>(1))).collect())
    }

    async fn put_row(&mut self, e: &Entry, data: Option<&[u8]>) -> Result<()> {
        let meta = serde_json::to_string(e).map_err(json_err)?;
        let row = RowOut {
            parent: parent_of(&e.path).to_string(),
            version: e.version as i64,
            meta,
            data: data.map(<[u8]>::to_vec),
        };
        self.mark_fresh(&e.path);
        self.known.insert(e.path.clone(), Some(e.clone()));
        self.rows_out.insert(e.path.clone(), Some(row));
        Ok(())
    }

    async fn delete_row(&mut self, p: &str) -> Result<()> {
        self.mark_fresh(p);
        self.known.insert(p.to_string(), None);
        self.rows_out.insert(p.to_string(), None);
        Ok(())
    }

    async fn log_change(&mut self, c: Change<'_>) -> Result<()> {
        let enc = |e: Option<&Entry>| e.map(serde_json::to_string).transpose().map_err(json_err);
        self.log.push(LogRow {
            seq: c.seq as i64,
            ts_ms: c.ts_ms,
            path: c.path.to_string(),
            origin: c.origin.as_str(),
            old: enc(c.old)?,
            new: enc(c.new)?,
            moved_to: c.moved_to.map(str::to_string),
        });
        Ok(())
    }

    async fn lease(&mut self, name: &str) -> Result<Option<Lease>> {
        Ok(self.rows(SELECT_LEASE, &[&name]).await?.first().map(lease_of))
    }

    async fn put_lease(&mut self, l: &Lease) -> Result<()> {
        self.rows(
            "INSERT INTO leases (name, holder, generation, expires_at_ms) VALUES ($1, $2, $3, $4)
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, generation = excluded.generation,
             expires_at_ms = excluded.expires_at_ms",
            &[&l.name, &l.holder, &(l.generation as i64), &l.expires_at_ms],
        )
        .await?;
        Ok(())
    }

    async fn drop_cache(&mut self, p: &str) -> Result<()> {
        self.cache_drops.push(p.to_string());
        Ok(())
    }

    async fn put_cache(&mut self, c: &CachedChunk) -> Result<()> {
        // After any held drop of the same path.
        self.flush().await?;
        self.rows(
            "INSERT INTO cache_chunks (path, node, chunk, content_id, len, last_read_ms) VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (path, node, chunk) DO UPDATE SET content_id = excluded.content_id, len = excluded.len,
             last_read_ms = excluded.last_read_ms",
            &[&c.path, &c.node, &(c.chunk as i64), &c.content_id, &(c.len as i64), &c.last_read_ms],
        )
        .await?;
        Ok(())
    }

    fn seq_mut(&mut self) -> &mut u64 {
        &mut self.seq
    }
}

const CACHE_COLUMNS: &str = "node, path, content_id, chunk, len, last_read_ms";

fn chunk_of(r: &Row) -> CachedChunk {
    CachedChunk {
        node: r.get(0),
        path: r.get(1),
        content_id: r.get(2),
        chunk: r.get::<_, i64>(3) as u64,
        len: r.get::<_, i64>(4) as u64,
        last_read_ms: r.get(5),
    }
}

#[async_trait]
impl MetaStore for PgStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn get(&self, p: &str) -> Result<Option<Entry>> {
        path::validate(p)?;
        let c = self.client().await?;
        let stmt = c.prepare_cached(SELECT_ENTRY).await.map_err(pg_err)?;
        c.query_opt(&stmt, &[&p]).await.map_err(pg_err)?.as_ref().map(entry_of).transpose()
    }

    async fn get_many(&self, paths: &[String]) -> Result<Vec<Option<Entry>>> {
        txn::check_many(paths)?;
        let c = self.client().await?;
        // One statement: one snapshot.
        let stmt = c.prepare_cached(SELECT_ENTRIES).await.map_err(pg_err)?;
        let found: HashMap<String, Entry> = entries_of(&c.query(&stmt, &[&paths]).await.map_err(pg_err)?)?
            .into_iter()
            .map(|e| (e.path.clone(), e))
            .collect();
        Ok(paths.iter().map(|p| found.get(p).cloned()).collect())
    }

    async fn list(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page> {
        path::validate(dir)?;
        let c = self.client().await?;
        let stmt = c.prepare_cached(SELECT_ENTRY).await.map_err(pg_err)?;
        match c.query_opt(&stmt, &[&dir]).await.map_err(pg_err)?.as_ref().map(entry_of).transpose()? {
            None => return Err(Error::not_found(dir)),
            Some(e) if !e.is_dir() => return Err(Error::NotADirectory { path: dir.to_string() }),
            Some(_) => {}
        }
        let stmt = c
            .prepare_cached(
                "SELECT path, version, meta FROM entries WHERE parent = $1 AND path > $2 ORDER BY path LIMIT $3",
            )
            .await
            .map_err(pg_err)?;
        let rows = c.query(&stmt, &[&dir, &start_after.unwrap_or(""), &(limit as i64 + 1)]).await.map_err(pg_err)?;
        Ok(Page::from_rows(entries_of(&rows)?, limit))
    }

    async fn scan(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page> {
        path::validate(dir)?;
        let (lo, hi) = path::scan_bounds(dir, start_after.unwrap_or(""));
        let c = self.client().await?;
        let stmt = c.prepare_cached(SELECT_BELOW).await.map_err(pg_err)?;
        let rows = c.query(&stmt, &[&lo, &hi, &(limit as i64 + 1)]).await.map_err(pg_err)?;
        Ok(Page::from_rows(entries_of(&rows)?, limit))
    }

    async fn count_below(&self, dir: &str, except: Option<&str>) -> Result<u64> {
        path::validate(dir)?;
        let (lo, hi) = path::scan_bounds(dir, "");
        let (x, xlo, xhi) = crate::sqlite::excluded(except)?;
        let c = self.client().await?;
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM entries WHERE path > $1 AND path < $2 AND path <> $3 AND NOT (path > $4 AND path < $5)",
                &[&lo, &hi, &x, &xlo, &xhi],
            )
            .await
            .map_err(pg_err)?
            .get(0);
        Ok(n as u64)
    }

    async fn read_inline(&self, p: &str) -> Result<Option<Bytes>> {
        path::validate(p)?;
        let c = self.client().await?;
        let row = c.query_opt("SELECT data FROM entries WHERE path = $1", &[&p]).await.map_err(pg_err)?;
        Ok(row.and_then(|r| r.get::<_, Option<Vec<u8>>>(0)).map(Bytes::from))
    }

    async fn apply(&self, t: Txn) -> Result<Applied> {
        match self.submit(Op::Apply(Box::new(t))).await? {
            Done::Applied(a) => Ok(*a),
            _ => Err(unexpected()),
        }
    }

    async fn apply_many(&self, batch: TxnBatch) -> Result<Vec<Result<Applied>>> {
        match self.submit(Op::ApplyMany(batch)).await? {
            Done::Many(r) => Ok(r),
            _ => Err(unexpected()),
        }
    }

    async fn lease_acquire(&self, name: &str, holder: &str, ttl_ms: i64) -> Result<Lease> {
        match self.submit(Op::LeaseAcquire { name: name.into(), holder: holder.into(), ttl_ms }).await? {
            Done::Lease(l) => Ok(l),
            _ => Err(unexpected()),
        }
    }

    async fn lease_renew(&self, fence: &Fence, ttl_ms: i64) -> Result<Lease> {
        match self.submit(Op::LeaseRenew { fence: fence.clone(), ttl_ms }).await? {
            Done::Lease(l) => Ok(l),
            _ => Err(unexpected()),
        }
    }

    async fn lease_release(&self, fence: &Fence) -> Result<()> {
        match self.submit(Op::LeaseRelease { fence: fence.clone() }).await? {
            Done::Released => Ok(()),
            _ => Err(unexpected()),
        }
    }

    async fn lease_get(&self, name: &str) -> Result<Option<Lease>> {
        let c = self.client().await?;
        let stmt = c.prepare_cached(SELECT_LEASE).await.map_err(pg_err)?;
        Ok(c.query_opt(&stmt, &[&name]).await.map_err(pg_err)?.as_ref().map(lease_of))
    }

    async fn changes(&self, after: u64, limit: usize) -> Result<Vec<ChangeRecord>> {
        let c = self.client().await?;
        let stmt = c
            .prepare_cached(
                "SELECT seq, ts_ms, path, origin, old, new, moved_to FROM changelog WHERE seq > $1 ORDER BY seq LIMIT $2",
            )
            .await
            .map_err(pg_err)?;
        let rows = c.query(&stmt, &[&(after as i64), &(limit as i64)]).await.map_err(pg_err)?;
        let dec = |s: Option<&str>| s.map(serde_json::from_str::<Entry>).transpose().map_err(json_err);
        rows.iter()
            .map(|r| {
                let origin: &str = r.get(3);
                let origin = Origin::parse(origin)
                    .ok_or_else(|| Error::internal(format!("unknown origin {origin:?} in the change log")))?;
                Ok(ChangeRecord {
                    seq: r.get::<_, i64>(0) as u64,
                    ts_ms: r.get(1),
                    path: r.get(2),
                    origin,
                    old: dec(r.get(4))?,
                    new: dec(r.get(5))?,
                    moved_to: r.get(6),
                })
            })
            .collect()
    }

    async fn last_seq(&self) -> Result<u64> {
        read_seq(&**self.client().await?).await
    }

    async fn cache_chunks(&self, node: &str, p: &str) -> Result<Vec<CachedChunk>> {
        let c = self.client().await?;
        let stmt = c
            .prepare_cached(&format!(
                "SELECT {CACHE_COLUMNS} FROM cache_chunks WHERE path = $1 AND node = $2 ORDER BY chunk"
            ))
            .await
            .map_err(pg_err)?;
        Ok(c.query(&stmt, &[&p, &node]).await.map_err(pg_err)?.iter().map(chunk_of).collect())
    }

    async fn cache_record(&self, chunk: CachedChunk) -> Result<bool> {
        // Under the write lock: the check of the entry's content id and an invalidating write
        // cannot interleave.
        match self.submit(Op::CacheRecord(chunk)).await? {
            Done::Recorded(r) => Ok(r),
            _ => Err(unexpected()),
        }
    }

    async fn cache_forget(&self, chunks: &[CachedChunk]) -> Result<Vec<CachedChunk>> {
        if chunks.is_empty() {
            return Ok(Vec::new());
        }
        let c = self.client().await?;
        let stmt = c
            .prepare_cached("DELETE FROM cache_chunks WHERE path = $1 AND node = $2 AND chunk = $3 AND content_id = $4")
            .await
            .map_err(pg_err)?;
        let deletes = chunks.iter().map(|k| {
            let chunk = k.chunk as i64;
            let stmt = &stmt;
            let c = &c;
            async move { c.execute(stmt, &[&k.path, &k.node, &chunk, &k.content_id]).await }
        });
        let counts = futures::future::try_join_all(deletes).await.map_err(pg_err)?;
        Ok(chunks.iter().zip(counts).filter(|(_, n)| *n > 0).map(|(k, _)| k.clone()).collect())
    }

    async fn cache_touch(&self, node: &str, reads: &[(String, u64, i64)]) -> Result<()> {
        if reads.is_empty() {
            return Ok(());
        }
        let c = self.client().await?;
        let stmt = c
            .prepare_cached("UPDATE cache_chunks SET last_read_ms = $4 WHERE path = $1 AND node = $2 AND chunk = $3")
            .await
            .map_err(pg_err)?;
        let updates = reads.iter().map(|(p, k, ms)| {
            let chunk = *k as i64;
            let (stmt, c) = (&stmt, &c);
            async move { c.execute(stmt, &[p, &node, &chunk, ms]).await }
        });
        futures::future::try_join_all(updates).await.map_err(pg_err)?;
        Ok(())
    }

    async fn cache_usage(&self, node: &str) -> Result<CacheUsage> {
        let c = self.client().await?;
        let row = c
            .query_one("SELECT COALESCE(SUM(len), 0)::int8, COUNT(*) FROM cache_chunks WHERE node = $1", &[&node])
            .await
            .map_err(pg_err)?;
        Ok(CacheUsage { bytes: row.get::<_, i64>(0) as u64, chunks: row.get::<_, i64>(1) as u64 })
    }

    async fn cache_lru(&self, node: &str, limit: usize) -> Result<Vec<CachedChunk>> {
        let c = self.client().await?;
        let sql = format!(
            "SELECT {CACHE_COLUMNS} FROM cache_chunks WHERE node = $1 ORDER BY last_read_ms, path, chunk LIMIT $2"
        );
        let rows = c.query(&sql, &[&node, &(limit as i64)]).await.map_err(pg_err)?;
        Ok(rows.iter().map(chunk_of).collect())
    }

    async fn cache_scan(&self, node: &str, after: Option<(&str, u64)>, limit: usize) -> Result<Vec<CachedChunk>> {
        let c = self.client().await?;
        let (after_path, after_chunk) = after.map_or(("", -1i64), |(p, k)| (p, k as i64));
        let sql = format!(
            "SELECT {CACHE_COLUMNS} FROM cache_chunks WHERE node = $1 AND (path, chunk) > ($2, $3)
             ORDER BY path, chunk LIMIT $4"
        );
        let rows = c.query(&sql, &[&node, &after_path, &after_chunk, &(limit as i64)]).await.map_err(pg_err)?;
        Ok(rows.iter().map(chunk_of).collect())
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.writer.seq_tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_never_show_the_password() {
        assert_eq!(redact("postgres://tm:s3cret@db:5432/tm"), "postgres://tm:***@db:5432/tm");
        assert_eq!(redact("postgres://tm@db/tm"), "postgres://tm@db/tm");
        assert_eq!(redact("postgres://db/tm"), "postgres://db/tm");
    }
}

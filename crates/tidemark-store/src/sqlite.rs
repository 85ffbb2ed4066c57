//! The SQLite `MetaStore`: one file in the data directory, WAL mode, `synchronous=FULL` (a
//! committed transaction survives a crash of the process or the machine).
//!
//! Every mutation runs on the single writer connection inside a `BEGIN IMMEDIATE` transaction,
//! so the fence check, the precondition check, the writes and the change-log records are atomic
//! and serialised. Mutations that arrive while the writer is busy are committed together (group
//! commit): each runs in its own savepoint, so one that fails leaves no trace and the others are
//! unaffected, and one commit — one fsync — makes the whole group durable before any of them
//! returns. A lone mutation commits at once; under load, the fsync is shared. Reads use a small
//! pool of read-only connections that WAL lets run beside the writer. Paths are `TEXT` with
//! SQLite's default `BINARY` collation, which compares UTF-8 bytes: ordering by path is byte order.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use tokio::sync::watch;

use tidemark_core::cache::{CacheUsage, CachedChunk};
use tidemark_core::model::{Applied, ChangeRecord, Entry, Fence, Lease, Origin, Page, Txn, TxnBatch};
use tidemark_core::{Clock, Error, MetaStore, Result, path};

use crate::txn::{self, Change, TxnOps, json_err, parent_of, row_to_entry};

/// The schema, one migration per version; `PRAGMA user_version` records how many have run.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE entries (
    path    TEXT PRIMARY KEY NOT NULL,
    parent  TEXT NOT NULL,
    version INTEGER NOT NULL,
    meta    TEXT NOT NULL,
    data    BLOB
) WITHOUT ROWID;
CREATE INDEX entries_by_parent ON entries (parent, path);
CREATE TABLE leases (
    name          TEXT PRIMARY KEY NOT NULL,
    holder        TEXT NOT NULL,
    generation    INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE changelog (
    seq    INTEGER PRIMARY KEY NOT NULL,
    ts_ms  INTEGER NOT NULL,
    path   TEXT NOT NULL,
    origin TEXT NOT NULL,
    old    TEXT,
    new    TEXT
);
-- The sequence counter lives apart from the change log so that trimming the log can never
-- make a sequence number (and so an entry version) be handed out twice.
CREATE TABLE counters (name TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO counters (name, value) VALUES ('seq', 0);
"#,
    r#"
-- The content cache: which chunks of which remote version each filer holds (bytes in its data
-- directory). Keyed by path first, so a write drops a path's records with one range delete.
CREATE TABLE cache_chunks (
    path         TEXT NOT NULL,
    node         TEXT NOT NULL,
    chunk        INTEGER NOT NULL,
    content_id   TEXT NOT NULL,
    len          INTEGER NOT NULL,
    last_read_ms INTEGER NOT NULL,
    PRIMARY KEY (path, node, chunk)
) WITHOUT ROWID;
CREATE INDEX cache_chunks_lru ON cache_chunks (node, last_read_ms);
CREATE INDEX cache_chunks_by_node ON cache_chunks (node, path, chunk);
"#,
    r#"
-- On the record removing an entry a rename moved: where it went.
ALTER TABLE changelog ADD COLUMN moved_to TEXT;
"#,
];

const READER_POOL: usize = 4;

/// The most mutations one group commit takes; more wait for the next group.
const MAX_GROUP: usize = 512;

pub struct SqliteStore {
    file: PathBuf,
    writer: Arc<Mutex<Connection>>,
    /// Mutations waiting for the writer, oldest first.
    pending: Arc<Mutex<Vec<Box<dyn Job>>>>,
    readers: Arc<Mutex<Vec<Connection>>>,
    clock: Arc<dyn Clock>,
    seq_tx: Arc<watch::Sender<u64>>,
}

/// A mutation waiting for a group commit: run inside the group's transaction, then told whether
/// the group committed.
trait Job: Send {
    /// Runs the mutation; its error when it failed (its savepoint is then rolled back).
    fn run(&mut self, ops: &mut SqliteTxn<'_>) -> Result<()>;
    /// Hands the result to the caller: the mutation's own once the group committed, else the
    /// group's error.
    fn finish(self: Box<Self>, committed: Result<()>);
}

struct PendingWrite<T, F> {
    f: Option<F>,
    now: i64,
    out: Option<Result<T>>,
    reply: tokio::sync::oneshot::Sender<Result<T>>,
}

impl<T, F> Job for PendingWrite<T, F>
where
    T: Send + 'static,
    F: AsyncFnOnce(&mut SqliteTxn<'_>, i64) -> Result<T> + Send + 'static,
{
    fn run(&mut self, ops: &mut SqliteTxn<'_>) -> Result<()> {
        let Some(f) = self.f.take() else { return Err(Error::internal("a mutation ran twice")) };
        let out = futures::executor::block_on(f(ops, self.now));
        let status = out.as_ref().map(|_| ()).map_err(Error::clone);
        self.out = Some(out);
        status
    }

    fn finish(self: Box<Self>, committed: Result<()>) {
        let result = match committed {
            Ok(()) => self.out.unwrap_or_else(|| Err(Error::internal("a mutation of a committed group never ran"))),
            Err(e) => Err(e),
        };
        // The caller may have gone (its future dropped); the mutation stands either way.
        let _ = self.reply.send(result);
    }
}

/// Commits every pending mutation, in groups of up to MAX_GROUP, on the writer. Called once per
/// mutation after it was queued, so none waits without a caller to commit it; a call that finds
/// the queue empty (an earlier group took its mutation) returns at once.
fn commit_pending(writer: &Mutex<Connection>, pending: &Mutex<Vec<Box<dyn Job>>>, seq_tx: &watch::Sender<u64>) {
    let mut conn = match writer.lock() {
        Ok(c) => c,
        Err(_) => {
            let jobs = std::mem::take(&mut *pending.lock().unwrap_or_else(|p| p.into_inner()));
            for job in jobs {
                job.finish(Err(Error::internal("the store's writer was poisoned by an earlier panic")));
            }
            return;
        }
    };
    loop {
        let mut jobs: Vec<Box<dyn Job>> = {
            let mut queue = pending.lock().unwrap_or_else(|p| p.into_inner());
            let n = queue.len().min(MAX_GROUP);
            queue.drain(..n).collect()
        };
        if jobs.is_empty() {
            return;
        }
        match commit_group(&mut conn, &mut jobs) {
            Ok(seq) => {
                // Followers wake before any writer of the group returns.
                seq_tx.send_if_modified(|cur| {
                    let changed = *cur != seq;
                    *cur = seq;
                    changed
                });
                for job in jobs {
                    job.finish(Ok(()));
                }
            }
            Err(e) => {
                for job in jobs {
                    job.finish(Err(e.clone()));
                }
            }
        }
    }
}

/// One transaction for `jobs`, each in its own savepoint; returns the sequence counter committed.
fn commit_group(conn: &mut Connection, jobs: &mut [Box<dyn Job>]) -> Result<u64> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db_err)?;
    let start = read_seq(&tx)?;
    let mut seq = start;
    for job in jobs.iter_mut() {
        tx.execute_batch("SAVEPOINT mutation").map_err(db_err)?;
        let mut ops = SqliteTxn { conn: &tx, seq, known: HashMap::new() };
        match job.run(&mut ops) {
            Ok(()) => {
                seq = ops.seq;
                tx.execute_batch("RELEASE mutation").map_err(db_err)?;
            }
            // Some failures (a full disk, an I/O error) roll back the whole transaction, and the
            // savepoint with it: then the group fails with the mutation's own error.
            Err(own) => tx.execute_batch("ROLLBACK TO mutation; RELEASE mutation").map_err(|_| own)?,
        }
    }
    if seq != start {
        tx.execute("UPDATE counters SET value = ?1 WHERE name = 'seq'", [seq as i64]).map_err(db_err)?;
    }
    tx.commit().map_err(db_err)?;
    Ok(seq)
}

fn db_err(e: rusqlite::Error) -> Error {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseBusy) | Some(rusqlite::ErrorCode::DatabaseLocked) => {
            Error::Unavailable { message: format!("sqlite: {e}") }
        }
        _ => Error::Internal { message: format!("sqlite: {e}") },
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the store file and runs pending migrations.
    pub fn open(file: impl AsRef<Path>, clock: Arc<dyn Clock>) -> Result<Self> {
        let file = file.as_ref().to_path_buf();
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        }
        // The file holds remote credentials: its owner's alone. SQLite gives the -wal and -shm
        // files the database file's mode, so creating it 0600 (empty is an empty database) covers
        // them too.
        {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .mode(0o600)
                .create(true)
                .append(true)
                .open(&file)
                .map_err(|e| Error::io(format!("creating {}", file.display()), e))?;
        }
        let mut writer = Connection::open(&file).map_err(db_err)?;
        writer
            .execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA busy_timeout = 5000;")
            .map_err(db_err)?;
        migrate(&mut writer, clock.now_ms())?;
        let last: i64 =
            writer.query_row("SELECT value FROM counters WHERE name = 'seq'", [], |r| r.get(0)).map_err(db_err)?;
        let (seq_tx, _) = watch::channel(last as u64);
        let seq_tx = Arc::new(seq_tx);
        Ok(SqliteStore {
            file,
            writer: Arc::new(Mutex::new(writer)),
            pending: Arc::default(),
            readers: Arc::new(Mutex::new(Vec::new())),
            clock,
            seq_tx,
        })
    }

    pub fn file(&self) -> &Path {
        &self.file
    }

    fn open_reader(&self) -> Result<Connection> {
        let c =
            Connection::open_with_flags(&self.file, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
                .map_err(db_err)?;
        c.execute_batch("PRAGMA busy_timeout = 5000;").map_err(db_err)?;
        Ok(c)
    }

    /// Runs `f` on a read connection from the pool, off the async executor.
    async fn read<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let pooled = self.readers.lock().map_err(|_| Error::internal("reader pool poisoned"))?.pop();
        let conn = match pooled {
            Some(c) => c,
            None => self.open_reader()?,
        };
        let readers = self.readers.clone();
        tokio::task::spawn_blocking(move || {
            let out = f(&conn);
            if let Ok(mut pool) = readers.lock()
                && pool.len() < READER_POOL
            {
                pool.push(conn);
            }
            out
        })
        .await
        .map_err(|e| Error::internal(format!("store task failed: {e}")))?
    }

    /// Runs `f` on the writer, in the next group commit (its own savepoint of one IMMEDIATE
    /// transaction); returns once the group is durable. A failing `f` leaves no trace.
    async fn write<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: AsyncFnOnce(&mut SqliteTxn<'_>, i64) -> Result<T> + Send + 'static,
    {
        let (reply, result) = tokio::sync::oneshot::channel();
        let job = PendingWrite { f: Some(f), now: self.clock.now_ms(), out: None, reply };
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).push(Box::new(job));
        let (writer, pending, seq_tx) = (self.writer.clone(), self.pending.clone(), self.seq_tx.clone());
        tokio::task::spawn_blocking(move || commit_pending(&writer, &pending, &seq_tx))
            .await
            .map_err(|e| Error::internal(format!("store task failed: {e}")))?;
        result.await.map_err(|_| Error::internal("store task failed: the mutation was dropped unfinished"))?
    }
}

fn migrate(conn: &mut Connection, now_ms: i64) -> Result<()> {
    let version: usize = conn.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0)).map_err(db_err)? as usize;
    if version > MIGRATIONS.len() {
        return Err(Error::internal(format!(
            "the store was written by a newer Tidemark (schema version {version}, this one knows {}); upgrade the binary",
            MIGRATIONS.len()
        )));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version) {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db_err)?;
        tx.execute_batch(sql).map_err(db_err)?;
        if i == 0 {
            put_row(&tx, &txn::root_entry(now_ms), None)?;
        }
        tx.pragma_update(None, "user_version", (i + 1) as i64).map_err(db_err)?;
        tx.commit().map_err(db_err)?;
    }
    Ok(())
}

fn get_entry(conn: &Connection, p: &str) -> Result<Option<Entry>> {
    let row = conn
        .prepare_cached("SELECT path, version, meta FROM entries WHERE path = ?1")
        .map_err(db_err)?
        .query_row([p], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?)))
        .optional()
        .map_err(db_err)?;
    row.map(|(p, v, m)| row_to_entry(p, v, &m)).transpose()
}

fn query_entries(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> Result<Vec<Entry>> {
    let mut stmt = conn.prepare_cached(sql).map_err(db_err)?;
    let rows = stmt
        .query_map(params, |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?)))
        .map_err(db_err)?;
    let mut out = Vec::new();
    for row in rows {
        let (p, v, m) = row.map_err(db_err)?;
        out.push(row_to_entry(p, v, &m)?);
    }
    Ok(out)
}

/// Every entry strictly below `dir` after `start_after`, in byte order of the path.
fn descendants(conn: &Connection, dir: &str, start_after: &str, limit: i64) -> Result<Vec<Entry>> {
    // One lower bound per query: given two (`path >= lo AND path > after`), SQLite seeks to the
    // first and filters from there, so every page rescanned the directory from its start (a
    // reconcile of 1,000,000 objects went quadratic).
    let (lo, hi) = path::scan_bounds(dir, start_after);
    query_entries(
        conn,
        "SELECT path, version, meta FROM entries WHERE path > ?1 AND path < ?2 ORDER BY path LIMIT ?3",
        params![lo, hi, limit],
    )
}

fn inline_data(conn: &Connection, p: &str) -> Result<Option<Vec<u8>>> {
    let data: Option<Option<Vec<u8>>> =
        conn.query_row("SELECT data FROM entries WHERE path = ?1", [p], |r| r.get(0)).optional().map_err(db_err)?;
    Ok(data.flatten())
}

fn read_seq(conn: &Connection) -> Result<u64> {
    let v: i64 = conn.query_row("SELECT value FROM counters WHERE name = 'seq'", [], |r| r.get(0)).map_err(db_err)?;
    Ok(v as u64)
}

fn get_lease(conn: &Connection, name: &str) -> Result<Option<Lease>> {
    conn.query_row("SELECT name, holder, generation, expires_at_ms FROM leases WHERE name = ?1", [name], |r| {
        Ok(Lease {
            name: r.get(0)?,
            holder: r.get(1)?,
            generation: r.get::<_, i64>(2)? as u64,
            expires_at_ms: r.get(3)?,
        })
    })
    .optional()
    .map_err(db_err)
}

/// The shared transaction logic's row operations on the writer's open transaction. Every call
/// is synchronous; the futures are ready at once and driven by `block_on` on the blocking thread.
struct SqliteTxn<'c> {
    conn: &'c Connection,
    seq: u64,
    /// Entries this job read or wrote, as they are now: a batch's transactions share their
    /// ancestors, which are then read (and decoded) once, not once per transaction.
    known: HashMap<String, Option<Entry>>,
}

impl SqliteTxn<'_> {
    fn known_entry(&mut self, p: &str) -> Result<Option<Entry>> {
        if let Some(e) = self.known.get(p) {
            return Ok(e.clone());
        }
        let e = get_entry(self.conn, p)?;
        self.known.insert(p.to_string(), e.clone());
        Ok(e)
    }
}

impl TxnOps for SqliteTxn<'_> {
    async fn entry(&mut self, p: &str) -> Result<Option<Entry>> {
        self.known_entry(p)
    }

    async fn entries(&mut self, paths: &[&str]) -> Result<Vec<Entry>> {
        let mut out = Vec::new();
        for p in paths {
            out.extend(self.known_entry(p)?);
        }
        Ok(out)
    }

    async fn descendants(&mut self, dir: &str, limit: Option<i64>) -> Result<Vec<Entry>> {
        descendants(self.conn, dir, "", limit.unwrap_or(i64::MAX))
    }

    async fn inline_data(&mut self, p: &str) -> Result<Option<Vec<u8>>> {
        inline_data(self.conn, p)
    }

    async fn put_row(&mut self, e: &Entry, data: Option<&[u8]>) -> Result<()> {
        put_row(self.conn, e, data)?;
        self.known.insert(e.path.clone(), Some(e.clone()));
        Ok(())
    }

    async fn delete_row(&mut self, p: &str) -> Result<()> {
        self.known.insert(p.to_string(), None);
        self.conn
            .prepare_cached("DELETE FROM entries WHERE path = ?1")
            .map_err(db_err)?
            .execute([p])
            .map_err(db_err)?;
        Ok(())
    }

    async fn log_change(&mut self, c: Change<'_>) -> Result<()> {
        let enc = |e: Option<&Entry>| e.map(serde_json::to_string).transpose().map_err(json_err);
        self.conn
            .prepare_cached(
                "INSERT INTO changelog (seq, ts_ms, path, origin, old, new, moved_to) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )
            .map_err(db_err)?
            .execute(params![c.seq as i64, c.ts_ms, c.path, c.origin.as_str(), enc(c.old)?, enc(c.new)?, c.moved_to])
            .map_err(db_err)?;
        Ok(())
    }

    async fn lease(&mut self, name: &str) -> Result<Option<Lease>> {
        get_lease(self.conn, name)
    }

    async fn put_lease(&mut self, l: &Lease) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO leases (name, holder, generation, expires_at_ms) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, generation = excluded.generation,
                 expires_at_ms = excluded.expires_at_ms",
                params![l.name, l.holder, l.generation as i64, l.expires_at_ms],
            )
            .map_err(db_err)?;
        Ok(())
    }

    async fn drop_cache(&mut self, p: &str) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM cache_chunks WHERE path = ?1")
            .map_err(db_err)?
            .execute([p])
            .map_err(db_err)?;
        Ok(())
    }

    async fn put_cache(&mut self, c: &CachedChunk) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO cache_chunks (path, node, chunk, content_id, len, last_read_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (path, node, chunk) DO UPDATE SET content_id = excluded.content_id, len = excluded.len,
                 last_read_ms = excluded.last_read_ms",
            )
            .map_err(db_err)?
            .execute(params![c.path, c.node, c.chunk as i64, c.content_id, c.len as i64, c.last_read_ms])
            .map_err(db_err)?;
        Ok(())
    }

    fn seq_mut(&mut self) -> &mut u64 {
        &mut self.seq
    }
}

const CACHE_COLUMNS: &str = "node, path, content_id, chunk, len, last_read_ms";

fn query_chunks(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> Result<Vec<CachedChunk>> {
    let mut stmt = conn.prepare_cached(sql).map_err(db_err)?;
    let rows = stmt
        .query_map(params, |r| {
            Ok(CachedChunk {
                node: r.get(0)?,
                path: r.get(1)?,
                content_id: r.get(2)?,
                chunk: r.get::<_, i64>(3)? as u64,
                len: r.get::<_, i64>(4)? as u64,
                last_read_ms: r.get(5)?,
            })
        })
        .map_err(db_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(db_err)
}

fn put_row(conn: &Connection, e: &Entry, data: Option<&[u8]>) -> Result<()> {
    let meta = serde_json::to_string(e).map_err(json_err)?;
    conn.prepare_cached(
        "INSERT INTO entries (path, parent, version, meta, data) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (path) DO UPDATE SET version = excluded.version, meta = excluded.meta, data = excluded.data",
    )
    .map_err(db_err)?
    .execute(params![e.path, parent_of(&e.path), e.version as i64, meta, data])
    .map_err(db_err)?;
    Ok(())
}

/// The path `except` and the bounds of what lies below it, for a count that leaves them out;
/// with no `except`, a path no entry has and an empty range.
pub(crate) fn excluded(except: Option<&str>) -> Result<(String, String, String)> {
    match except {
        Some(x) => {
            path::validate(x)?;
            let (lo, hi) = path::scan_bounds(x, "");
            Ok((x.to_string(), lo, hi))
        }
        None => Ok((String::new(), String::new(), String::new())),
    }
}

#[async_trait]
impl MetaStore for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn get(&self, p: &str) -> Result<Option<Entry>> {
        path::validate(p)?;
        let p = p.to_string();
        self.read(move |c| get_entry(c, &p)).await
    }

    async fn get_many(&self, paths: &[String]) -> Result<Vec<Option<Entry>>> {
        txn::check_many(paths)?;
        let paths = paths.to_vec();
        // One read transaction, so the answers are of one point in time.
        self.read(move |c| {
            c.execute_batch("BEGIN").map_err(db_err)?;
            let out = paths.iter().map(|p| get_entry(c, p)).collect::<Result<Vec<_>>>();
            // Ended whatever the reads did: the connection goes back to the pool.
            let end = c.execute_batch("COMMIT").map_err(db_err);
            let out = out?;
            end.map(|()| out)
        })
        .await
    }

    async fn list(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page> {
        path::validate(dir)?;
        let dir = dir.to_string();
        let after = start_after.unwrap_or("").to_string();
        self.read(move |c| {
            match get_entry(c, &dir)? {
                None => return Err(Error::not_found(&dir)),
                Some(e) if !e.is_dir() => return Err(Error::NotADirectory { path: dir }),
                Some(_) => {}
            }
            let rows = query_entries(
                c,
                "SELECT path, version, meta FROM entries WHERE parent = ?1 AND path > ?2 ORDER BY path LIMIT ?3",
                params![dir, after, limit as i64 + 1],
            )?;
            Ok(Page::from_rows(rows, limit))
        })
        .await
    }

    async fn scan(&self, dir: &str, start_after: Option<&str>, limit: usize) -> Result<Page> {
        path::validate(dir)?;
        let dir = dir.to_string();
        let after = start_after.unwrap_or("").to_string();
        self.read(move |c| Ok(Page::from_rows(descendants(c, &dir, &after, limit as i64 + 1)?, limit))).await
    }

    async fn count_below(&self, dir: &str, except: Option<&str>) -> Result<u64> {
        path::validate(dir)?;
        let (lo, hi) = path::scan_bounds(dir, "");
        // Nothing is left out when `except` is absent: an empty range after a path no entry has.
        let (x, xlo, xhi) = excluded(except)?;
        self.read(move |c| {
            let n: i64 = c
                .query_row(
                    "SELECT COUNT(*) FROM entries WHERE path > ?1 AND path < ?2 AND path <> ?3 AND NOT (path > ?4 AND path < ?5)",
                    params![lo, hi, x, xlo, xhi],
                    |r| r.get(0),
                )
                .map_err(db_err)?;
            Ok(n as u64)
        })
        .await
    }

    async fn read_inline(&self, p: &str) -> Result<Option<Bytes>> {
        path::validate(p)?;
        let p = p.to_string();
        self.read(move |c| {
            let data: Option<Option<Vec<u8>>> = c
                .query_row("SELECT data FROM entries WHERE path = ?1", [&p], |r| r.get(0))
                .optional()
                .map_err(db_err)?;
            Ok(data.flatten().map(Bytes::from))
        })
        .await
    }

    async fn apply(&self, t: Txn) -> Result<Applied> {
        self.write(async move |ops, now| txn::apply(ops, t, now).await).await
    }

    async fn apply_many(&self, batch: TxnBatch) -> Result<Vec<Result<Applied>>> {
        self.write(async move |ops, now| txn::apply_many(ops, batch, now).await).await
    }

    async fn lease_acquire(&self, name: &str, holder: &str, ttl_ms: i64) -> Result<Lease> {
        let (name, holder) = (name.to_string(), holder.to_string());
        self.write(async move |ops, now| txn::lease_acquire(ops, &name, &holder, ttl_ms, now).await).await
    }

    async fn lease_renew(&self, fence: &Fence, ttl_ms: i64) -> Result<Lease> {
        let fence = fence.clone();
        self.write(async move |ops, now| txn::lease_renew(ops, &fence, ttl_ms, now).await).await
    }

    async fn lease_release(&self, fence: &Fence) -> Result<()> {
        let fence = fence.clone();
        self.write(async move |ops, _now| txn::lease_release(ops, &fence).await).await
    }

    async fn lease_get(&self, name: &str) -> Result<Option<Lease>> {
        let name = name.to_string();
        self.read(move |c| get_lease(c, &name)).await
    }

    async fn changes(&self, after: u64, limit: usize) -> Result<Vec<ChangeRecord>> {
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT seq, ts_ms, path, origin, old, new, moved_to FROM changelog WHERE seq > ?1 ORDER BY seq LIMIT ?2",
                )
                .map_err(db_err)?;
            let rows = stmt
                .query_map(params![after as i64, limit as i64], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, Option<String>>(4)?,
                        r.get::<_, Option<String>>(5)?,
                        r.get::<_, Option<String>>(6)?,
                    ))
                })
                .map_err(db_err)?;
            let dec = |s: Option<String>| s.map(|s| serde_json::from_str::<Entry>(&s)).transpose().map_err(json_err);
            let mut out = Vec::new();
            for row in rows {
                let (seq, ts_ms, path, origin, old, new, moved_to) = row.map_err(db_err)?;
                let origin = Origin::parse(&origin)
                    .ok_or_else(|| Error::internal(format!("unknown origin {origin:?} in the change log")))?;
                out.push(ChangeRecord { seq: seq as u64, ts_ms, path, origin, old: dec(old)?, new: dec(new)?, moved_to });
            }
            Ok(out)
        })
        .await
    }

    async fn last_seq(&self) -> Result<u64> {
        self.read(read_seq).await
    }

    async fn cache_chunks(&self, node: &str, p: &str) -> Result<Vec<CachedChunk>> {
        let (node, p) = (node.to_string(), p.to_string());
        self.read(move |c| {
            query_chunks(
                c,
                &format!("SELECT {CACHE_COLUMNS} FROM cache_chunks WHERE path = ?1 AND node = ?2 ORDER BY chunk"),
                params![p, node],
            )
        })
        .await
    }

    async fn cache_record(&self, chunk: CachedChunk) -> Result<bool> {
        self.write(async move |ops, _now| txn::cache_record(ops, &chunk).await).await
    }

    async fn cache_forget(&self, chunks: &[CachedChunk]) -> Result<Vec<CachedChunk>> {
        if chunks.is_empty() {
            return Ok(Vec::new());
        }
        let chunks = chunks.to_vec();
        self.write(async move |ops, _now| {
            let mut stmt = ops
                .conn
                .prepare_cached(
                    "DELETE FROM cache_chunks WHERE path = ?1 AND node = ?2 AND chunk = ?3 AND content_id = ?4",
                )
                .map_err(db_err)?;
            let mut gone = Vec::new();
            for c in chunks {
                if stmt.execute(params![c.path, c.node, c.chunk as i64, c.content_id]).map_err(db_err)? > 0 {
                    gone.push(c);
                }
            }
            Ok(gone)
        })
        .await
    }

    async fn cache_touch(&self, node: &str, reads: &[(String, u64, i64)]) -> Result<()> {
        if reads.is_empty() {
            return Ok(());
        }
        let (node, reads) = (node.to_string(), reads.to_vec());
        self.write(async move |ops, _now| {
            let mut stmt = ops
                .conn
                .prepare_cached(
                    "UPDATE cache_chunks SET last_read_ms = ?4 WHERE path = ?1 AND node = ?2 AND chunk = ?3",
                )
                .map_err(db_err)?;
            for (p, chunk, ms) in reads {
                stmt.execute(params![p, node, chunk as i64, ms]).map_err(db_err)?;
            }
            Ok(())
        })
        .await
    }

    async fn cache_usage(&self, node: &str) -> Result<CacheUsage> {
        let node = node.to_string();
        self.read(move |c| {
            let (bytes, chunks): (i64, i64) = c
                .query_row("SELECT COALESCE(SUM(len), 0), COUNT(*) FROM cache_chunks WHERE node = ?1", [&node], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .map_err(db_err)?;
            Ok(CacheUsage { bytes: bytes as u64, chunks: chunks as u64 })
        })
        .await
    }

    async fn cache_lru(&self, node: &str, limit: usize) -> Result<Vec<CachedChunk>> {
        let node = node.to_string();
        self.read(move |c| {
            query_chunks(
                c,
                &format!(
                    "SELECT {CACHE_COLUMNS} FROM cache_chunks WHERE node = ?1 ORDER BY last_read_ms, path, chunk LIMIT ?2"
                ),
                params![node, limit as i64],
            )
        })
        .await
    }

    async fn cache_scan(&self, node: &str, after: Option<(&str, u64)>, limit: usize) -> Result<Vec<CachedChunk>> {
        let node = node.to_string();
        let (after_path, after_chunk) = after.map_or((None, -1), |(p, k)| (Some(p.to_string()), k as i64));
        self.read(move |c| {
            query_chunks(
                c,
                &format!(
                    "SELECT {CACHE_COLUMNS} FROM cache_chunks WHERE node = ?1 AND (path, chunk) > (COALESCE(?2, ''), ?3)
                     ORDER BY path, chunk LIMIT ?4"
                ),
                params![node, after_path, after_chunk, limit as i64],
            )
        })
        .await
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.seq_tx.subscribe()
    }
}
